//! Property tests for the two configuration parsers: `config::load` (flags + `--config` TOML file)
//! and `WebSettings::load` (the exporter-toolkit YAML file).
//!
//! The contract under test, for any input: `Ok`, or an error that is one line and names the option
//! or the file (with the line for a file's syntax error) — never a panic, never a hang, and never an
//! `Ok` that silently ignored an unknown key. `Ok` results must satisfy the validation invariants
//! and reflect what the input asked for.
//!
//! Inputs are arbitrary bytes, mutated valid files, structured near-valid files (every known key
//! with valid and invalid values, misspelt keys, wrong types, duplicates, nesting, huge numbers,
//! unicode) and random flag vectors. The environment is process-global and tests run in parallel,
//! so nothing here sets `NVML_EXPORTER_*`; flags and files reach every parser path.
//!
//! Failures are not persisted to a regressions file: a failing case found here becomes a named
//! test in the module it concerns.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Duration;

use common::certs::Ca;
use nvml_exporter::config::{self, Config, ConfigError, LogFormat, MIN_INTERVAL, NvmlSource};
use nvml_exporter::http::WebSettings;
use nvml_exporter::http::web_config::{ClientAuth, WebConfigFile};
use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;

// ---------------------------------------------------------------------------------------------
// Shared checks

/// The options, as file keys.
const KEYS: &[&str] = &[
    "listen",
    "interval",
    "device_timeout",
    "stale_grace",
    "nvml_lib",
    "demo",
    "once",
    "log_format",
    "log_level",
    "web_config",
    "config",
];

/// Keys the `--config` file accepts (`config` itself is a flag only).
fn file_keys() -> &'static [&'static str] {
    &KEYS[..KEYS.len() - 1]
}

/// The flag of a file key.
fn flag_of(key: &str) -> String {
    format!("--{}", key.replace('_', "-"))
}

/// A budget small enough that the whole file runs in a few seconds in a debug build.
fn cases(n: u32) -> ProptestConfig {
    ProptestConfig {
        cases: n,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Runs `f` on its own thread and fails if it takes longer than a generous bound: a parser that
/// hangs must fail the test, not block CI. A panic inside `f` fails the test with its message.
fn within_time_limit<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name(what.to_string())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .unwrap();
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(v) => {
            handle.join().unwrap();
            v
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the thread sends before it ends"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: no answer within 60 s"),
    }
}

/// The line numbers an error message cites ("line 3"), if any.
fn cited_lines(msg: &str) -> Vec<usize> {
    msg.match_indices("line ")
        .filter_map(|(i, _)| {
            let digits: String = msg[i + 5..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .collect()
}

/// An error message from our own validation: one line, prefixed like every other error.
fn assert_one_line(msg: &str) {
    assert!(!msg.contains(['\n', '\r']), "not one line: {msg:?}");
    assert!(!msg.trim().is_empty(), "empty error");
}

/// The invariants every accepted configuration satisfies, whatever it came from.
fn assert_valid_config(c: &Config) {
    assert!(c.interval >= MIN_INTERVAL, "{c:?}");
    assert!(c.interval <= Duration::from_secs(3600), "{c:?}");
    assert!(!c.device_timeout().is_zero(), "{c:?}");
    assert!(c.device_timeout() <= c.interval, "{c:?}");
    assert!(c.stale_grace() >= c.interval, "{c:?}");
    if let NvmlSource::Path(p) = &c.nvml() {
        assert!(!p.as_os_str().is_empty(), "{c:?}");
    }
    if let Some(p) = &c.web_config {
        assert!(!p.as_os_str().is_empty(), "{c:?}");
    }
    assert!(
        tracing_subscriber::EnvFilter::try_new(&c.log_level).is_ok(),
        "log level accepted but not a filter: {c:?}"
    );
}

/// Checks an error from `config::load` whose input was a file at `path` with `lines` lines
/// (flags named only that file).
fn assert_file_error(e: &ConfigError, path: &Path, text: Option<&str>) {
    let msg = match e {
        ConfigError::Cli(e) => panic!("a file error reported as a flag error: {e}"),
        ConfigError::Invalid(_) => e.to_string(),
    };
    assert_one_line(&msg);
    assert!(msg.starts_with("error: "), "{msg}");
    let shown = path.display().to_string();
    assert!(
        msg.contains(&shown),
        "the error does not name the file: {msg}"
    );
    if let Some(text) = text {
        // A readable file: every error about it points at a line that exists.
        let last = text.split('\n').count();
        let lines = cited_lines(&msg);
        // toml gives no position for exceeding its nesting limit, and a file over the size limit
        // is not parsed; every other error has one.
        assert!(
            !lines.is_empty() || msg.contains("recursion limit") || msg.contains("larger than"),
            "no line in: {msg}"
        );
        for n in lines {
            assert!((1..=last).contains(&n), "line {n} of {last}: {msg}");
        }
    }
}

/// Writes `bytes` as a file in a fresh directory.
fn write_file(name: &str, bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}

/// Loads a `--config` file with no other flags, checking the contract; returns the result.
fn load_config_file(bytes: &[u8]) -> Result<Config, String> {
    let (_dir, path) = write_file("nvml-exporter.toml", bytes);
    let arg = path.clone();
    let result = within_time_limit("config::load", move || {
        config::load([
            std::ffi::OsString::from("nvml-exporter"),
            "--config".into(),
            arg.into_os_string(),
        ])
    });
    match result {
        Ok(c) => {
            assert_valid_config(&c);
            Ok(c)
        }
        Err(e) => {
            let text = std::str::from_utf8(bytes).ok();
            assert_file_error(&e, &path, text);
            Err(e.to_string())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Values, rendered as TOML or YAML

/// A value in a generated file: the scalar kinds both formats share, plus nesting.
#[derive(Debug, Clone)]
enum Val {
    Str(String),
    Bool(bool),
    /// Kept as text so that numbers beyond i64 reach the parser.
    Int(String),
    Float(String),
    List(Vec<Val>),
    Map(Vec<(String, Val)>),
}

/// A string escaped as a double-quoted TOML or YAML (both accept JSON's escapes) string.
fn quoted(s: &str) -> String {
    let mut out = String::from('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A key: bare when it can be, quoted otherwise.
fn render_key(k: &str) -> String {
    if !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        k.to_string()
    } else {
        quoted(k)
    }
}

/// Inline (flow) syntax: valid TOML, and valid YAML for the subset generated here.
fn render_inline(v: &Val, yaml: bool) -> String {
    match v {
        Val::Str(s) => quoted(s),
        Val::Bool(b) => b.to_string(),
        Val::Int(s) | Val::Float(s) => s.clone(),
        Val::List(items) => format!(
            "[{}]",
            items
                .iter()
                .map(|v| render_inline(v, yaml))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Val::Map(entries) => {
            let sep = if yaml { ": " } else { " = " };
            format!(
                "{{{}}}",
                entries
                    .iter()
                    .map(|(k, v)| format!("{}{sep}{}", render_key(k), render_inline(v, yaml)))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    }
}

fn arb_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9_./:\\[\\] -]{0,16}",
        any::<String>(),
        Just("\u{0}".to_string()),
        Just("é\u{202e}🦀".to_string()),
        Just(" \n ".to_string()),
    ]
}

fn arb_number() -> impl Strategy<Value = Val> {
    prop_oneof![
        any::<i64>().prop_map(|n| Val::Int(n.to_string())),
        Just(Val::Int("99999999999999999999999999999999".into())),
        Just(Val::Int("-0".into())),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| Val::Float(format!("{f:e}"))),
        Just(Val::Float("inf".into())),
        Just(Val::Float("nan".into())),
        Just(Val::Float("1e400".into())),
    ]
}

/// Any value: scalars of every type, and lists and tables nested a few levels.
fn arb_val() -> impl Strategy<Value = Val> {
    let leaf = prop_oneof![
        arb_text().prop_map(Val::Str),
        any::<bool>().prop_map(Val::Bool),
        arb_number(),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Val::List),
            prop::collection::vec(("[a-z_]{1,8}", inner), 0..4).prop_map(Val::Map),
        ]
    })
}

/// Durations as users write them, valid and not.
fn arb_duration_text() -> impl Strategy<Value = String> {
    prop_oneof![
        (
            0u64..100_000,
            prop::sample::select(vec![
                "ns", "us", "ms", "s", "m", "h", "d", "y", "", "sec", "x"
            ])
        )
            .prop_map(|(n, u)| format!("{n}{u}")),
        any::<u64>().prop_map(|n| format!("{n}s")),
        any::<u64>().prop_map(|n| format!("{n}y")),
        Just("1s 500ms".to_string()),
        Just(" 2s ".to_string()),
        Just("-1s".to_string()),
        Just("1.5s".to_string()),
        Just("99999999999999999999999y".to_string()),
        Just(String::new()),
        arb_text(),
    ]
}

fn arb_listen_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u16>().prop_map(|p| format!(":{p}")),
        any::<u16>().prop_map(|p| format!("127.0.0.1:{p}")),
        any::<u16>().prop_map(|p| format!("[::1]:{p}")),
        Just("0.0.0.0:99999".to_string()),
        Just("localhost:9400".to_string()),
        Just(":".to_string()),
        Just("1.2.3.4".to_string()),
        arb_text(),
    ]
}

fn arb_log_level_text() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "error",
            "warn",
            "info",
            "debug",
            "trace",
            "off",
            "nvml_exporter=debug",
            "info,nvml_exporter::sampler=trace",
            "info,=[",
            "[{",
            "loud",
        ])
        .prop_map(String::from),
        arb_text(),
    ]
}

/// A value meant for `key`: usually of the right type (valid or not), sometimes anything.
fn arb_value_for(key: &str) -> BoxedStrategy<Val> {
    let typed: BoxedStrategy<Val> = match key {
        "listen" => arb_listen_text().prop_map(Val::Str).boxed(),
        "interval" | "device_timeout" | "stale_grace" => {
            arb_duration_text().prop_map(Val::Str).boxed()
        }
        "demo" | "once" => any::<bool>().prop_map(Val::Bool).boxed(),
        "log_format" => prop::sample::select(vec!["text", "json", "JSON", "xml", ""])
            .prop_map(|s| Val::Str(s.into()))
            .boxed(),
        "log_level" => arb_log_level_text().prop_map(Val::Str).boxed(),
        _ => prop_oneof![
            Just(Val::Str("/usr/lib/libnvidia-ml.so.1".into())),
            Just(Val::Str(String::new())),
            arb_text().prop_map(Val::Str),
        ]
        .boxed(),
    };
    prop_oneof![4 => typed, 1 => arb_val()].boxed()
}

/// A known key with one typo: a letter dropped, doubled, swapped or changed, or a dash for `_`.
fn arb_misspelt(keys: &'static [&'static str]) -> impl Strategy<Value = String> {
    (
        prop::sample::select(keys),
        any::<prop::sample::Index>(),
        0u8..5,
    )
        .prop_filter_map("still a known key", move |(k, at, how)| {
            let mut c: Vec<char> = k.chars().collect();
            let i = at.index(c.len());
            match how {
                0 => {
                    c.remove(i);
                }
                1 => c.insert(i, c[i]),
                2 if i + 1 < c.len() => c.swap(i, i + 1),
                3 => c[i] = if c[i] == 'x' { 'y' } else { 'x' },
                _ => c = k.replace('_', "-").chars().collect(),
            }
            let s: String = c.into_iter().collect();
            (!keys.contains(&s.as_str())).then_some(s)
        })
}

// ---------------------------------------------------------------------------------------------
// The TOML `--config` file

/// One line of a generated TOML file.
#[derive(Debug, Clone)]
enum TomlLine {
    /// `key = value` with a known key.
    Known(String, Val),
    /// `key = value` with a key the file does not accept.
    Unknown(String, Val),
    /// A `[table]` header: everything after it lands in that table.
    Table(String),
    /// A comment or blank line.
    Comment(String),
}

fn arb_toml_line() -> impl Strategy<Value = TomlLine> {
    let known = prop::sample::select(file_keys())
        .prop_flat_map(|k| arb_value_for(k).prop_map(move |v| TomlLine::Known(k.to_string(), v)));
    let unknown_key = prop_oneof![
        arb_misspelt(file_keys()),
        "[a-z_]{1,12}".prop_filter("not a known key", |k| !file_keys().contains(&k.as_str())),
        Just("config".to_string()),
        Just("Interval".to_string()),
        Just("ünïcode".to_string()),
    ];
    prop_oneof![
        8 => known,
        2 => (unknown_key, arb_val()).prop_map(|(k, v)| TomlLine::Unknown(k, v)),
        1 => prop_oneof![
            prop::sample::select(file_keys()).prop_map(String::from),
            "[a-z]{1,6}",
        ]
        .prop_map(TomlLine::Table),
        1 => "[ a-z#]{0,12}".prop_map(|s| TomlLine::Comment(format!("# {s}"))),
    ]
}

fn render_toml(lines: &[TomlLine]) -> String {
    let mut out = String::new();
    for line in lines {
        match line {
            TomlLine::Known(k, v) | TomlLine::Unknown(k, v) => {
                out += &format!("{} = {}\n", render_key(k), render_inline(v, false));
            }
            TomlLine::Table(name) => out += &format!("[{}]\n", render_key(name)),
            TomlLine::Comment(c) => out += &format!("{c}\n"),
        }
    }
    out
}

/// Whether the file, if it parses, must be refused because of a key it has no business having:
/// an unknown key, or any key inside a `[table]` (the file has no tables).
fn toml_has_unknown_key(lines: &[TomlLine]) -> bool {
    let mut in_table = false;
    for line in lines {
        match line {
            TomlLine::Table(_) => in_table = true,
            TomlLine::Unknown(..) => return true,
            TomlLine::Known(..) if in_table => return true,
            _ => {}
        }
    }
    // A table header is itself a key of the top-level table.
    in_table
}

/// A known option set at the top level exactly once to a string or boolean: what `Ok` must show.
fn toml_top_level_settings(lines: &[TomlLine]) -> Vec<(String, Val)> {
    let mut out = Vec::new();
    for line in lines {
        match line {
            TomlLine::Table(_) => break,
            TomlLine::Known(k, v) => out.push((k.clone(), v.clone())),
            _ => {}
        }
    }
    out
}

fn parse_listen(s: &str) -> Option<SocketAddr> {
    let s = s.trim();
    match s.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}").parse().ok(),
        None => s.parse().ok(),
    }
}

/// Checks that an accepted configuration took every value the file set.
fn assert_reflects(c: &Config, settings: &[(String, Val)]) {
    for (key, val) in settings {
        let text = match val {
            Val::Str(s) => s.clone(),
            Val::Bool(b) => b.to_string(),
            other => panic!("{key} = {other:?} was accepted"),
        };
        let dur = || humantime::parse_duration(text.trim()).ok();
        match key.as_str() {
            "listen" => assert_eq!(Some(c.listen), parse_listen(&text), "{key}"),
            "interval" => assert_eq!(Some(c.interval), dur(), "{key}"),
            "device_timeout" => assert_eq!(Some(c.device_timeout()), dur(), "{key}"),
            "stale_grace" => assert_eq!(Some(c.stale_grace()), dur(), "{key}"),
            "once" => assert_eq!(c.once.to_string(), text, "{key}"),
            "demo" => assert_eq!(c.nvml() == NvmlSource::Demo, text == "true", "{key}"),
            "nvml_lib" => assert_eq!(c.nvml(), NvmlSource::Path(text.into()), "{key}"),
            "web_config" => assert_eq!(c.web_config, Some(PathBuf::from(text)), "{key}"),
            "log_level" => assert_eq!(c.log_level, text, "{key}"),
            "log_format" => {
                let want = match text.as_str() {
                    "text" => LogFormat::Text,
                    "json" => LogFormat::Json,
                    other => panic!("log_format {other:?} was accepted"),
                };
                assert_eq!(c.log_format, want, "{key}");
            }
            other => unreachable!("{other}"),
        }
    }
}

/// A valid file to mutate: every option set.
const VALID_TOML: &str = "\
# nvml-exporter
listen = \"127.0.0.1:9400\"
interval = \"2s\"
device_timeout = \"500ms\"
stale_grace = \"10s\"
nvml_lib = \"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1\"
once = false
log_format = \"json\"
log_level = \"info,nvml_exporter=debug\"
web_config = \"/etc/nvml-exporter/web.yml\"
";

/// Byte-level edits of a valid file: the inputs a fuzzer reaches first.
fn arb_mutation(base: &'static str) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, any::<u8>()), 1..8).prop_map(
        move |edits| {
            let mut b = base.as_bytes().to_vec();
            for (at, how, byte) in edits {
                let i = at.index(b.len().max(1));
                match how {
                    0 if !b.is_empty() => {
                        b.remove(i);
                    }
                    1 => b.insert(i.min(b.len()), byte),
                    _ if !b.is_empty() => b[i] = byte,
                    _ => b.push(byte),
                }
            }
            b
        },
    )
}

proptest! {
    #![proptest_config(cases(300))]

    /// Any bytes at all as the `--config` file.
    #[test]
    fn config_file_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = load_config_file(&bytes);
    }

    /// Any text as the `--config` file.
    #[test]
    fn config_file_any_text(text in any::<String>()) {
        let _ = load_config_file(text.as_bytes());
    }

    /// A valid file with a few bytes changed.
    #[test]
    fn config_file_mutated(bytes in arb_mutation(VALID_TOML)) {
        let _ = load_config_file(&bytes);
    }
}

proptest! {
    #![proptest_config(cases(600))]

    /// Structured near-valid files: known keys with good and bad values, typos, wrong types,
    /// tables, duplicates (a key drawn twice). Unknown keys are always refused; an accepted file
    /// is reflected in the configuration.
    #[test]
    fn config_file_structured(lines in prop::collection::vec(arb_toml_line(), 0..8)) {
        let text = render_toml(&lines);
        let result = load_config_file(text.as_bytes());
        if toml_has_unknown_key(&lines) {
            prop_assert!(result.is_err(), "accepted a file with an unknown key:\n{text}");
        }
        if let Ok(c) = &result {
            assert_reflects(c, &toml_top_level_settings(&lines));
        }
    }

    /// A valid file plus one unknown key: refused, naming the key and its line.
    #[test]
    fn config_file_unknown_key_is_named(
        key in prop_oneof![arb_misspelt(file_keys()), "[a-z][a-z_]{0,11}"]
            .prop_filter("unknown", |k| !file_keys().contains(&k.as_str())),
        // Scalars: a generated table may repeat a key, which is a different error.
        val in prop_oneof![arb_text().prop_map(Val::Str), arb_number(), any::<bool>().prop_map(Val::Bool)],
        at in 0usize..11,
    ) {
        let mut lines: Vec<String> = VALID_TOML.lines().map(String::from).collect();
        let at = at.min(lines.len());
        lines.insert(at, format!("{} = {}", render_key(&key), render_inline(&val, false)));
        let text = lines.join("\n");
        let e = load_config_file(text.as_bytes()).expect_err("unknown key accepted");
        prop_assert!(e.contains(&key), "{e}");
        prop_assert!(e.contains(&format!("line {}", at + 1)), "{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Flags

/// One command-line option with a value, or a stray token.
#[derive(Debug, Clone)]
enum Arg {
    /// `--flag value` (or `--flag=value`).
    Value {
        key: &'static str,
        value: String,
        equals: bool,
    },
    /// `--once` / `--demo` alone, or with `=value`.
    Switch {
        key: &'static str,
        value: Option<String>,
    },
    /// Anything else: an unknown flag, a stray word, `--help`.
    Stray(String),
}

fn arb_arg(config_path: String) -> impl Strategy<Value = Arg> {
    let value_keys = vec![
        "listen",
        "interval",
        "device_timeout",
        "stale_grace",
        "nvml_lib",
        "log_format",
        "log_level",
        "web_config",
    ];
    let valued =
        (prop::sample::select(value_keys), any::<bool>()).prop_flat_map(move |(key, equals)| {
            let value = arb_value_for(key).prop_map(|v| match v {
                Val::Str(s) => s,
                other => render_inline(&other, false),
            });
            value.prop_map(move |value| Arg::Value { key, value, equals })
        });
    let switch = (
        prop::sample::select(vec!["once", "demo"]),
        prop::option::of(prop::sample::select(vec!["true", "false", "yes", "1", ""])),
    )
        .prop_map(|(key, value)| Arg::Switch {
            key,
            value: value.map(String::from),
        });
    let config = Just(Arg::Value {
        key: "config",
        value: config_path,
        equals: false,
    });
    let stray = prop_oneof![
        arb_misspelt(KEYS).prop_map(|k| flag_of(&k)),
        Just("--".to_string()),
        Just("-x".to_string()),
        Just("check-config".to_string()),
        Just("--help".to_string()),
        Just("--version".to_string()),
        arb_text(),
    ]
    .prop_map(Arg::Stray);
    prop_oneof![8 => valued, 3 => switch, 1 => config, 2 => stray]
}

fn render_args(args: &[Arg]) -> Vec<String> {
    let mut out = vec!["nvml-exporter".to_string()];
    for a in args {
        match a {
            Arg::Value {
                key,
                value,
                equals: true,
            } => out.push(format!("{}={value}", flag_of(key))),
            Arg::Value {
                key,
                value,
                equals: false,
            } => {
                out.push(flag_of(key));
                out.push(value.clone());
            }
            Arg::Switch { key, value: None } => out.push(flag_of(key)),
            Arg::Switch {
                key,
                value: Some(v),
            } => out.push(format!("{}={v}", flag_of(key))),
            Arg::Stray(s) => out.push(s.clone()),
        }
    }
    out
}

proptest! {
    #![proptest_config(cases(600))]

    /// Random flag vectors from the known flags, with random values. clap's own errors print its
    /// usage block (that is its format, and `--help`/`--version` are errors that exit 0); every
    /// error of ours is one line naming an option.
    #[test]
    fn flags(
        args in prop::collection::vec(arb_arg("CONFIG".into()), 0..6),
        file in prop::sample::select(vec![VALID_TOML, "interval = \"30s\"\n", "", "bad ="]),
    ) {
        let (_dir, path) = write_file("c.toml", file.as_bytes());
        let mut argv = render_args(&args);
        for a in argv.iter_mut() {
            *a = a.replace("CONFIG", &path.display().to_string());
        }
        let given = argv.clone();
        let result = within_time_limit("config::load", move || config::load(given));
        match result {
            Ok(c) => {
                assert_valid_config(&c);
                // Every flag that clap accepted and validation kept is in effect; of a flag given
                // twice, the later one. (clap refuses a repeated flag, except a global one given
                // once before `check-config` and once after it.)
                let mut last: Vec<(&str, &String)> = Vec::new();
                for a in &args {
                    if let Arg::Value { key, value, .. } = a {
                        if *key != "config" {
                            last.retain(|(k, _)| k != key);
                            last.push((key, value));
                        }
                    }
                }
                for (key, value) in last {
                    let settings = [(key.to_string(), Val::Str(value.clone()))];
                    assert_reflects(&c, &settings);
                }
            }
            Err(ConfigError::Cli(e)) => {
                use clap::error::ErrorKind;
                let shown = e.to_string();
                match e.kind() {
                    ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                        prop_assert!(argv.iter().any(|a| a == "--help" || a == "--version"), "{argv:?}");
                    }
                    _ => {
                        prop_assert!(shown.starts_with("error: "), "{shown}");
                        // clap quotes what it objects to: one of our flags, or (part of) a token
                        // given, e.g. '-1' of "-1s", which it reads as a short flag.
                        let quoted = shown.split('\'').nth(1).unwrap_or_default();
                        let names_it = KEYS.iter().any(|k| quoted.starts_with(&flag_of(k)))
                            || argv[1..].iter().any(|a| a.contains(quoted))
                            || shown.contains("subcommand");
                        prop_assert!(names_it, "clap error names nothing given: {shown}\n{argv:?}");
                    }
                }
            }
            Err(e @ ConfigError::Invalid(_)) => {
                let msg = e.to_string();
                assert_one_line(&msg);
                prop_assert!(msg.starts_with("error: "), "{msg}");
                let names_option = KEYS.iter().any(|k| msg.contains(&flag_of(k)))
                    || msg.contains("check-config")
                    || msg.contains(&path.display().to_string());
                prop_assert!(names_option, "names no option: {msg}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The YAML `--web-config` file

/// A usable certificate and key (PEM), generated once: with them, accepted files reach the TLS
/// setup too.
fn cert_and_key() -> &'static (String, String) {
    static PEM: OnceLock<(String, String)> = OnceLock::new();
    PEM.get_or_init(|| {
        let server = Ca::new("test CA").server();
        (server.cert, server.key)
    })
}

/// A well-formed bcrypt hash (cost 4) of "secret".
const HASH: &str = "$2b$04$Kg1tQZ4yXG8u3H6oU1vVjeH0cXcG2JdRk8kUq2u2H2mQ0rXl6pZ3W";

const TLS_KEYS: &[&str] = &[
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
];
const TOP_KEYS: &[&str] = &["tls_server_config", "basic_auth_users"];

fn arb_tls_value(key: &'static str) -> BoxedStrategy<Val> {
    let typed: BoxedStrategy<Val> = match key {
        "cert_file" | "key_file" | "client_ca_file" => prop_oneof![
            Just("cert.pem"),
            Just("key.pem"),
            Just("missing.pem"),
            Just(""),
            Just("/nonexistent/x.pem"),
        ]
        .prop_map(|s| Val::Str(s.into()))
        .boxed(),
        "client_auth_type" => prop::sample::select(vec![
            "NoClientCert",
            "RequestClientCert",
            "RequireAnyClientCert",
            "VerifyClientCertIfGiven",
            "RequireAndVerifyClientCert",
            "requireandverifyclientcert",
            "Sometimes",
        ])
        .prop_map(|s| Val::Str(s.into()))
        .boxed(),
        _ => prop::sample::select(vec!["TLS12", "TLS13", "TLS10", "TLS11", "tls13", ""])
            .prop_map(|s| Val::Str(s.into()))
            .boxed(),
    };
    prop_oneof![5 => typed, 1 => arb_val()].boxed()
}

/// A generated web-config file: which keys it has, and its text.
#[derive(Debug, Clone)]
struct WebFile {
    text: String,
    has_unknown_key: bool,
    has_tls: bool,
    has_users: bool,
}

fn arb_tls_section() -> impl Strategy<Value = (Vec<(String, Val)>, bool)> {
    let known = prop::sample::select(TLS_KEYS)
        .prop_flat_map(|k| arb_tls_value(k).prop_map(move |v| (k.to_string(), v, false)));
    let unknown = (
        prop_oneof![
            arb_misspelt(TLS_KEYS),
            Just("cipher_suites".to_string()),
            Just("prefer_server_cipher_suites".to_string()),
            Just("curve_preferences".to_string()),
        ],
        arb_val(),
    )
        .prop_map(|(k, v)| (k, v, true));
    // Usually both files are there, so that the other keys are what decides.
    let base = prop_oneof![
        3 => Just(vec![
            ("cert_file".to_string(), Val::Str("cert.pem".into()), false),
            ("key_file".to_string(), Val::Str("key.pem".into()), false),
        ]),
        1 => Just(vec![]),
    ];
    (
        base,
        prop::collection::vec(prop_oneof![5 => known, 1 => unknown], 0..5),
    )
        .prop_map(|(mut base, more)| {
            base.extend(more);
            let unknown = base.iter().any(|(_, _, u)| *u);
            (base.into_iter().map(|(k, v, _)| (k, v)).collect(), unknown)
        })
}

fn arb_users() -> impl Strategy<Value = Val> {
    let user = prop_oneof!["[a-z]{1,8}", arb_text()];
    let hash = prop_oneof![
        4 => Just(Val::Str(HASH.into())),
        1 => Just(Val::Str("$2y$10$short".into())),
        1 => arb_text().prop_map(Val::Str),
        1 => arb_val(),
    ];
    prop_oneof![
        6 => prop::collection::vec((user, hash), 0..3).prop_map(Val::Map),
        1 => arb_val(),
    ]
}

/// Block-style YAML for the top level and the TLS section, flow style inside.
fn arb_web_file() -> impl Strategy<Value = WebFile> {
    let tls = prop::option::of(arb_tls_section());
    let users = prop::option::of(arb_users());
    let unknown_top = prop::option::of((
        prop_oneof![
            arb_misspelt(TOP_KEYS),
            Just("http_server_config".to_string()),
            Just("rate_limit".to_string()),
        ],
        arb_val(),
    ));
    (tls, users, unknown_top, any::<bool>()).prop_map(|(tls, users, unknown, users_first)| {
        let mut parts = Vec::new();
        let mut has_unknown_key = false;
        if let Some((entries, unknown)) = &tls {
            has_unknown_key |= unknown;
            let mut s = String::from("tls_server_config:\n");
            if entries.is_empty() {
                s = "tls_server_config: {}\n".to_string();
            }
            for (k, v) in entries {
                s += &format!("  {}: {}\n", render_key(k), render_inline(v, true));
            }
            parts.push(s);
        }
        if let Some(v) = &users {
            parts.push(format!("basic_auth_users: {}\n", render_inline(v, true)));
        }
        if users_first {
            parts.reverse();
        }
        if let Some((k, v)) = &unknown {
            has_unknown_key = true;
            parts.push(format!("{}: {}\n", render_key(k), render_inline(v, true)));
        }
        WebFile {
            text: parts.concat(),
            has_unknown_key,
            has_tls: tls.is_some(),
            has_users: users.is_some(),
        }
    })
}

/// Loads a web-config file written next to a usable certificate and key, checking the contract.
fn load_web_file(bytes: &[u8]) -> Result<(WebSettings, WebConfigFile), String> {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = cert_and_key();
    std::fs::write(dir.path().join("cert.pem"), cert).unwrap();
    std::fs::write(dir.path().join("key.pem"), key).unwrap();
    let path = dir.path().join("web.yml");
    std::fs::write(&path, bytes).unwrap();
    let arg = path.clone();
    let result = within_time_limit("WebSettings::load", move || {
        WebSettings::load(Some(&arg))
            .map(|s| (s, WebConfigFile::read(&arg)))
            .map_err(|e| e.to_string())
    });
    match result {
        Ok((settings, file)) => {
            let file = file.expect("WebSettings accepted what WebConfigFile refuses");
            assert_valid_web(&settings, &file, dir.path());
            Ok((settings, file))
        }
        Err(msg) => {
            assert_one_line(&msg);
            let shown = path.display().to_string();
            assert!(msg.starts_with("--web-config"), "{msg}");
            let Some(at) = msg.find(&shown) else {
                panic!("does not name the file: {msg}");
            };
            if let Ok(text) = std::str::from_utf8(bytes) {
                let last = text.split('\n').count();
                for n in cited_lines(&msg[at + shown.len()..]) {
                    assert!((1..=last).contains(&n), "line {n} of {last}: {msg}");
                }
            }
            Err(msg)
        }
    }
}

/// The invariants of an accepted web-config file.
fn assert_valid_web(settings: &WebSettings, file: &WebConfigFile, dir: &Path) {
    assert_eq!(settings.tls.is_some(), file.tls.is_some());
    assert_eq!(settings.auth.is_some(), file.basic_auth_users.is_some());
    if let Some(tls) = &file.tls {
        assert!(tls.min_version <= tls.max_version, "{tls:?}");
        for p in [
            Some(&tls.cert_file),
            Some(&tls.key_file),
            tls.client_ca_file.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            assert!(
                p.is_absolute() && p.starts_with(dir) || p.is_absolute(),
                "{p:?}"
            );
        }
        let verifies = matches!(
            tls.client_auth,
            ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert
        );
        if verifies {
            assert!(tls.client_ca_file.is_some(), "{tls:?}");
        }
        if tls.client_ca_file.is_some() {
            assert_ne!(tls.client_auth, ClientAuth::NoClientCert, "{tls:?}");
        }
    }
    if let Some(users) = &file.basic_auth_users {
        assert!(!users.is_empty());
    }
}

/// A valid web-config file to mutate.
const VALID_YAML: &str = "\
tls_server_config:
  cert_file: cert.pem
  key_file: key.pem
  client_auth_type: RequireAnyClientCert
  min_version: TLS12
  max_version: TLS13
basic_auth_users:
  prometheus: $2b$04$Kg1tQZ4yXG8u3H6oU1vVjeH0cXcG2JdRk8kUq2u2H2mQ0rXl6pZ3W
";

proptest! {
    #![proptest_config(cases(300))]

    /// Any bytes as the web-config file.
    #[test]
    fn web_config_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = load_web_file(&bytes);
    }

    /// Any text as the web-config file.
    #[test]
    fn web_config_any_text(text in any::<String>()) {
        let _ = load_web_file(text.as_bytes());
    }

    /// A valid web-config file with a few bytes changed.
    #[test]
    fn web_config_mutated(bytes in arb_mutation(VALID_YAML)) {
        let _ = load_web_file(&bytes);
    }
}

proptest! {
    #![proptest_config(cases(500))]

    /// Structured near-valid web-config files: unknown keys are always refused, and an accepted
    /// file enables exactly the sections it has.
    #[test]
    fn web_config_structured(file in arb_web_file()) {
        let result = load_web_file(file.text.as_bytes());
        if file.has_unknown_key {
            prop_assert!(result.is_err(), "accepted a file with an unknown key:\n{}", file.text);
        }
        if let Ok((settings, _)) = &result {
            prop_assert_eq!(settings.tls.is_some(), file.has_tls, "{}", file.text);
            prop_assert_eq!(settings.auth.is_some(), file.has_users, "{}", file.text);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Inputs built to exhaust a parser: deep nesting, alias bombs, huge files

#[test]
fn deeply_nested_toml_is_an_error_not_a_crash() {
    for depth in [1_000, 100_000] {
        let text = format!("interval = {}{}\n", "[".repeat(depth), "]".repeat(depth));
        load_config_file(text.as_bytes()).unwrap_err();
        let text = format!(
            "interval = {}1{}\n",
            "{a = ".repeat(depth),
            "}".repeat(depth)
        );
        load_config_file(text.as_bytes()).unwrap_err();
        let dotted = vec!["a"; depth].join(".");
        load_config_file(format!("{dotted} = 1\n").as_bytes()).unwrap_err();
    }
}

#[test]
fn deeply_nested_yaml_is_an_error_not_a_crash() {
    for depth in [1_000, 100_000] {
        let text = format!(
            "basic_auth_users: {}{}\n",
            "[".repeat(depth),
            "]".repeat(depth)
        );
        load_web_file(text.as_bytes()).unwrap_err();
        let text = format!(
            "basic_auth_users: {}1{}\n",
            "{a: ".repeat(depth),
            "}".repeat(depth)
        );
        load_web_file(text.as_bytes()).unwrap_err();
    }
}

#[test]
fn yaml_alias_bomb_is_refused_quickly() {
    // Each level refers to the one before nine times: 9^9 nodes if expanded.
    let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x]\n");
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 9].join(", ");
        text += &format!("a{i}: &a{i} [{refs}]\n");
    }
    text += "basic_auth_users: *a9\n";
    load_web_file(text.as_bytes()).unwrap_err();
}

#[test]
fn huge_files_are_handled() {
    // A megabyte of comments and one good option: accepted.
    let mut text = "# padding\n".repeat(100_000);
    text += "interval = \"3s\"\n";
    let c = load_config_file(text.as_bytes()).unwrap();
    assert_eq!(c.interval, Duration::from_secs(3));
    // A value of almost the whole limit: refused with its line.
    let text = format!("# one\nlog_format = \"{}\"\n", "x".repeat(1_000_000));
    let e = load_config_file(text.as_bytes()).unwrap_err();
    assert!(e.contains("line 2"), "{}", &e[..200.min(e.len())]);
    let text = format!("basic_auth_users:\n  u: \"{}\"\n", "x".repeat(1_000_000));
    load_web_file(text.as_bytes()).unwrap_err();
    // Past the limit: refused before parsing.
    let text = "# padding\n".repeat(110_000);
    let e = load_config_file(text.as_bytes()).unwrap_err();
    assert!(e.contains("larger than 1024 KiB"), "{e}");
    let e = load_web_file(text.as_bytes()).unwrap_err();
    assert!(e.contains("larger than 1024 KiB"), "{e}");
}

#[test]
fn generated_valid_files_are_accepted() {
    // The strategies above are only meaningful if their valid inputs really are valid.
    let c = load_config_file(VALID_TOML.as_bytes()).unwrap();
    assert_eq!(c.interval, Duration::from_secs(2));
    assert_eq!(c.log_format, LogFormat::Json);
    let (settings, file) = load_web_file(VALID_YAML.as_bytes()).unwrap();
    assert!(settings.tls.is_some() && settings.auth.is_some());
    assert_eq!(file.basic_auth_users.unwrap().len(), 1);
    let keys: BTreeSet<_> = file_keys().iter().collect();
    assert_eq!(keys.len(), 10);
}
