//! Imports run one way (docs/design.md, "Modules and imports"): no module imports `lib.rs` (which
//! builds and starts the parts from the configuration), and the modules below it import each other
//! without a loop. Read from the sources: every `crate::NAME` outside comments and test code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The `.rs` files under `dir`, test files and directories left out.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap();
        if path.is_dir() {
            if name != "tests" {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

/// Each `crate::NAME` of the code (not comments, not the `#[cfg(test)]` module at the end), with
/// its line.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    let mut found = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let line = line.split("//").next().unwrap_or_default();
        for part in line.split("crate::").skip(1) {
            let name: String = part
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found.push((n + 1, name));
        }
    }
    found
}

#[test]
fn no_module_imports_lib_rs_and_no_import_loops() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let modules: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| {
            let l = l.trim_start_matches("pub ");
            l.strip_prefix("mod ")?.strip_suffix(';').map(str::to_owned)
        })
        .collect();
    assert!(modules.contains("kubernetes") && modules.contains("sample"));
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut upward = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let top = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap()
            .trim_end_matches(".rs")
            .to_owned();
        if top == "lib" || top == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, name) in crate_paths(&text) {
            if !modules.contains(&name) {
                upward.push(format!("{}:{line}: crate::{name}", relative.display()));
            } else if name != top {
                graph.entry(top.clone()).or_default().insert(name);
            }
        }
    }
    assert!(
        upward.is_empty(),
        "items of lib.rs used below it:\n{}",
        upward.join("\n")
    );
    // A depth-first walk from every module finds any loop.
    fn walk<'a>(
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        at: &'a str,
        path: &mut Vec<&'a str>,
    ) -> Option<String> {
        if let Some(start) = path.iter().position(|m| *m == at) {
            return Some(format!("{} -> {at}", path[start..].join(" -> ")));
        }
        path.push(at);
        for next in graph.get(at).into_iter().flatten() {
            if let Some(found) = walk(graph, next, path) {
                return Some(found);
            }
        }
        path.pop();
        None
    }
    for module in graph.keys() {
        if let Some(found) = walk(&graph, module, &mut Vec::new()) {
            panic!("an import loop: {found}");
        }
    }
}
