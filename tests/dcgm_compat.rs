//! `--dcgm-compat` end to end: the real exporter on the simulated H100s serves, for each release
//! of dcgm-exporter whose facts are kept in tests/fixtures/dcgm-exporter/, every field of that
//! release's counter file (`fields.txt`, and its Helm chart's `helm-fields.txt`) under its name,
//! type, help and labels in order (or the migration guide says why not), the fields it ships
//! commented out (`optional.txt`) under their types, and what dcgm-exporter's own Grafana
//! dashboard queries (`dashboard.promql`); the XID field reads 0 on every GPU until its first
//! XID; the two power limits are their own readings; each release's compat exposition of the
//! default scenario matches its golden file, and the options are read from the environment like
//! every other.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Exporter, Exposition, assert_golden, run_once, scenario, strip_volatile};

/// A release of dcgm-exporter whose dialect is served, and what its files say.
struct Release {
    /// Its version, the name of its directory under tests/fixtures/dcgm-exporter/.
    version: &'static str,
    /// The labels dcgm-exporter puts on every GPU series before the `label` fields of its
    /// counter file, from its label code (`internal/pkg/rendermetrics/render_metrics.go` at the
    /// release's commit): the hostname label is `NODE_NAME`, set by these tests.
    identity: &'static [&'static str],
    /// The release whose `dashboard.promql` is this one's dashboard: its own where it is at
    /// hand, else the newest earlier one (tests/fixtures/dcgm-exporter/README.md says why).
    dashboard: &'static str,
}

const RELEASES: &[Release] = &[
    Release {
        version: "4.8.2",
        identity: &[
            "gpu",
            "UUID",
            "pci_bus_id",
            "device",
            "modelName",
            "Hostname",
        ],
        dashboard: "4.8.2",
    },
    Release {
        version: "4.8.3",
        identity: &[
            "gpu",
            "UUID",
            "pci_bus_id",
            "device",
            "modelName",
            "hostname",
        ],
        dashboard: "4.8.2",
    },
    Release {
        version: "4.8.4",
        identity: &[
            "gpu",
            "UUID",
            "pci_bus_id",
            "device",
            "modelName",
            "hostname",
        ],
        dashboard: "4.8.2",
    },
];

/// Labels dcgm-exporter adds to one field's series after the `label` fields, in the name order
/// it renders them in (`internal/pkg/collector/gpu_collector.go` at each release's commit):
/// the XID field's code and its text.
const FIELD_ATTRIBUTES: &[(&str, &[&str])] =
    &[("DCGM_FI_DEV_XID_ERRORS", &["err_code", "err_msg"])];

impl Release {
    fn file(&self, name: &str) -> PathBuf {
        fixture(self.version, name)
    }

    /// The active fields of the release's counter file (`etc/default-counters.csv`), in its
    /// order, as `fields.txt` lists them: field, Prometheus type (`gauge`, `counter` or
    /// `label`), help text.
    fn default_counters(&self) -> Vec<(String, String, String)> {
        rows(&self.file("fields.txt"), true)
    }

    /// `FIELD TYPE` rows of one of the release's other lists: `optional.txt` (the rows its
    /// counter file ships commented out) or `helm-fields.txt` (its Helm chart's default
    /// ConfigMap, where at hand: empty otherwise).
    fn listed(&self, name: &str) -> Vec<(String, String)> {
        let path = self.file(name);
        if name == "helm-fields.txt" && !path.exists() {
            return Vec::new();
        }
        rows(&path, false)
            .into_iter()
            .map(|(field, kind, _)| (field, kind))
            .collect()
    }

    /// Every query of the release's dashboard, as `dashboard.promql` lists them: each panel
    /// target's expression, then each variable's `label_values` query (`#` lines are comments).
    fn dashboard_queries(&self) -> Vec<String> {
        let text = std::fs::read_to_string(fixture(self.dashboard, "dashboard.promql")).unwrap();
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(String::from)
            .collect()
    }

    /// The release's section of the migration guide (`### dcgm-exporter VERSION` up to the next
    /// heading of that level or above).
    fn migration_section(&self) -> String {
        let doc = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/migrating-from-dcgm-exporter.md"),
        )
        .unwrap();
        let heading = format!("\n### dcgm-exporter {}\n", self.version);
        let start = doc
            .find(&heading)
            .unwrap_or_else(|| panic!("the migration guide has no section {heading:?}"));
        let rest = &doc[start + heading.len()..];
        let end = [rest.find("\n## "), rest.find("\n### ")]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(rest.len());
        rest[..end].to_string()
    }
}

fn fixture(version: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/dcgm-exporter")
        .join(version)
        .join(name)
}

/// The `FIELD TYPE HELP` (`with_help`) or `FIELD TYPE` rows of a fixture file.
fn rows(path: &Path, with_help: bool) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    let rows: Vec<_> = text
        .lines()
        .map(|l| {
            let mut parts = l.splitn(3, ' ');
            let (field, kind) = (parts.next().unwrap(), parts.next().unwrap_or_default());
            let help = parts.next().unwrap_or_default();
            assert!(
                field.starts_with("DCGM_")
                    && ["gauge", "counter", "label"].contains(&kind)
                    && help.is_empty() != with_help,
                "{}: not FIELD TYPE{}: {l:?}",
                path.display(),
                if with_help { " HELP" } else { "" }
            );
            (field.to_string(), kind.to_string(), help.to_string())
        })
        .collect();
    assert!(!rows.is_empty(), "{}: no fields", path.display());
    rows
}

/// The `# HELP` text of family `name` in `m`.
fn help_of<'m>(m: &'m Exposition, name: &str) -> Option<&'m str> {
    let prefix = format!("# HELP {name} ");
    m.text.lines().find_map(|l| l.strip_prefix(prefix.as_str()))
}

/// Labels a dashboard filters or groups by that the exporter rightly does not serve: `instance`,
/// which Prometheus adds from the scrape target.
const NOT_SERVED_BY_DCGM_EXPORTER: &[&str] = &["instance"];

/// What one query needs: the metric names it selects and the labels it filters or groups by.
#[derive(Debug, Default, PartialEq)]
struct Needs {
    metrics: BTreeSet<String>,
    labels: BTreeSet<String>,
}

/// The metric names and label names a dashboard query uses. Handles what the dashboards' queries
/// contain: selectors with matchers, `by (…)` groupings and `label_values(selector, label)`.
fn needs(query: &str) -> Needs {
    let mut n = Needs::default();
    let mut rest = query.to_string();
    if let Some(args) = rest
        .strip_prefix("label_values(")
        .and_then(|a| a.strip_suffix(')'))
    {
        let (selector, label) = args
            .rsplit_once(',')
            .expect("label_values(selector, label)");
        n.labels.insert(label.trim().to_string());
        rest = selector.to_string();
    }
    // Matchers inside braces.
    while let Some(open) = rest.find('{') {
        let close = open + rest[open..].find('}').expect("closed selector");
        for matcher in rest[open + 1..close].split(',') {
            let name = matcher.split(['=', '!']).next().unwrap().trim();
            if !name.is_empty() {
                n.labels.insert(name.to_string());
            }
        }
        rest.replace_range(open..=close, " ");
    }
    // Groupings.
    while let Some(by) = rest.find("by (") {
        let open = by + 3;
        let close = open + rest[open..].find(')').expect("closed grouping");
        for label in rest[open + 1..close].split(',') {
            n.labels.insert(label.trim().to_string());
        }
        rest.replace_range(by..=close, " ");
    }
    for word in rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("DCGM_") {
            n.metrics.insert(word.to_string());
        }
    }
    n
}

#[test]
fn queries_are_parsed_into_metrics_and_labels() {
    let n = needs(
        r#"max(DCGM_FI_DEV_SM_CLOCK{Hostname=~"$Hostname", gpu=~"$gpu"} * 1000000) by (Hostname, UUID, gpu)"#,
    );
    assert_eq!(
        n.metrics,
        BTreeSet::from(["DCGM_FI_DEV_SM_CLOCK".to_string()])
    );
    assert_eq!(
        n.labels,
        ["Hostname", "UUID", "gpu"].map(String::from).into()
    );
    let n = needs(r#"label_values(DCGM_FI_DEV_FB_FREE{Hostname=~"$Hostname"}, gpu)"#);
    assert_eq!(
        n.metrics,
        BTreeSet::from(["DCGM_FI_DEV_FB_FREE".to_string()])
    );
    assert_eq!(n.labels, ["Hostname", "gpu"].map(String::from).into());
    // 4.8.2's dashboard: eight panel queries and its two variables, `instance` and `gpu`.
    let queries = RELEASES[0].dashboard_queries();
    assert_eq!(queries.len(), 10, "{queries:#?}");
    assert_eq!(
        needs(&queries[9]).labels,
        ["gpu"].map(String::from).into(),
        "{queries:#?}"
    );
}

/// Checks that `m` serves every metric each query of `release`'s dashboard selects, with every
/// label it uses, and that its `gpu` variable offers every GPU.
fn assert_dashboard_is_served(m: &Exposition, release: &Release) {
    for query in release.dashboard_queries() {
        let n = needs(&query);
        assert!(!n.metrics.is_empty(), "{query}");
        for metric in &n.metrics {
            let series = m.find(metric, &[]);
            assert!(
                !series.is_empty(),
                "{}: {metric} not served (query: {query})",
                release.version
            );
            for label in n
                .labels
                .iter()
                .filter(|l| !NOT_SERVED_BY_DCGM_EXPORTER.contains(&l.as_str()))
            {
                assert!(
                    series.iter().all(|s| s.labels.contains_key(label)),
                    "{}: {metric} lacks label {label} (query: {query})",
                    release.version
                );
            }
        }
    }
    // Every GPU of the scenario is selectable.
    let gpus: BTreeSet<&str> = m
        .find("DCGM_FI_DEV_GPU_TEMP", &[])
        .iter()
        .map(|s| s.labels["gpu"].as_str())
        .collect();
    assert_eq!(gpus.len(), 8, "{gpus:?}");
}

/// Checks that every active field of `release`'s counter file is served by `m` under
/// its name, type and help on each GPU, with the release's labels in the order its label code
/// writes them, unless the release's section of the migration guide names it (and says why it is
/// absent, served on fewer GPUs or without a label); the `label` fields are labels of those
/// series. The fields of its Helm chart's ConfigMap are among them, and a served field that it
/// ships commented out has the type it gives.
fn assert_default_counters_are_served(m: &Exposition, release: &Release, node: &str) {
    let rows = release.default_counters();
    let section = release.migration_section();
    let mut labels: Vec<&str> = release.identity.to_vec();
    labels.extend(
        rows.iter()
            .filter(|(_, kind, _)| kind == "label")
            .map(|(field, _, _)| field.as_str()),
    );
    let hostname = release
        .identity
        .iter()
        .find(|l| l.eq_ignore_ascii_case("hostname"))
        .expect("a hostname label");
    for (field, kind) in release.listed("helm-fields.txt") {
        assert!(
            rows.iter().any(|(f, k, _)| *f == field && *k == kind),
            "{}: the Helm ConfigMap's {field} {kind} is no default field",
            release.version
        );
    }
    for (field, kind) in release.listed("optional.txt") {
        if let Some(served) = m.types.get(&field) {
            assert_eq!(*served, kind, "{}: {field}'s type", release.version);
        }
    }
    for (field, kind, help) in rows.iter().filter(|(_, kind, _)| kind != "label") {
        let series = m.find(field, &[]);
        // A field the release's section names is served differently or not at all, as it says.
        let documented = section.contains(&format!("`{field}`"));
        assert!(
            !series.is_empty() || documented,
            "{}: {field} is not served and the migration guide's section does not say why",
            release.version
        );
        if series.is_empty() {
            continue;
        }
        assert_eq!(
            m.types.get(field),
            Some(kind),
            "{}: {field}'s type",
            release.version
        );
        assert!(
            help_of(m, field) == Some(help.as_str()) || documented,
            "{}: {field}'s help is {:?}, not {help:?}",
            release.version,
            help_of(m, field)
        );
        assert!(
            series.len() == 8 || documented,
            "{}: {field} on {} GPUs of 8",
            release.version,
            series.len()
        );
        for s in series {
            assert_eq!(
                s.labels.get(*hostname).map(String::as_str),
                Some(node),
                "{}: {field}'s {hostname}",
                release.version
            );
        }
        // The labels in the order they are written: dcgm-exporter's template order, then the
        // field's own attributes, but a "`NAME` label" the release's section says is not served.
        let mut field_labels = labels.clone();
        for (f, attributes) in FIELD_ATTRIBUTES {
            if f == field {
                field_labels.extend(
                    attributes
                        .iter()
                        .filter(|a| !section.contains(&format!("`{a}` label"))),
                );
            }
        }
        for line in m
            .text
            .lines()
            .filter(|l| l.starts_with(&format!("{field}{{")))
        {
            let names: Vec<&str> = line[field.len() + 1..line.rfind('}').unwrap()]
                .split("\",")
                .map(|pair| pair.split('=').next().unwrap())
                .collect();
            assert_eq!(names, field_labels, "{}: {line}", release.version);
        }
    }
}

/// The exporter on the 8-GPU scenario with `args`, once the GPM-based fields are served (they
/// need two ticks) and every GPU's XID field (the XID events are registered), before the
/// scenario's first XID (GPU 6, 30 s in).
fn exporter_with_gpm(args: &[&str]) -> (Exporter, Exposition) {
    let h100 = scenario("h100x8");
    let mut all = vec!["--interval", "200ms", "--log-level", "info"];
    all.extend_from_slice(args);
    let e = Exporter::start(
        &[
            ("NVML_SIM_SCENARIO", h100.to_str().unwrap()),
            ("NODE_NAME", "node-a"),
        ],
        &all,
    );
    let m = e.wait_metrics(Duration::from_secs(15), "GPM and XID fields", |m| {
        !m.find("DCGM_FI_PROF_GR_ENGINE_ACTIVE", &[]).is_empty()
            && m.find("DCGM_FI_DEV_XID_ERRORS", &[]).len() == 8
    });
    // No XID yet: 0 on every GPU, as dcgm-exporter serves it, with its code as err_code.
    for s in m.find("DCGM_FI_DEV_XID_ERRORS", &[]) {
        assert_eq!(s.value, 0.0, "{s:?}");
        assert_eq!(s.labels["err_code"], "0", "{s:?}");
    }
    (e, m)
}

#[test]
fn each_release_default_counters_and_dashboard_are_served_in_dcgm_mode() {
    for release in RELEASES {
        let (_e, m) =
            exporter_with_gpm(&["--dcgm-compat", "--dcgm-compat-version", release.version]);
        assert_default_counters_are_served(&m, release, "node-a");
        assert_dashboard_is_served(&m, release);
    }
    // Without --dcgm-compat-version: the default release, and only its names for the GPUs.
    let (_e, m) = exporter_with_gpm(&["--dcgm-compat"]);
    assert_default_counters_are_served(&m, &RELEASES[0], "node-a");
    assert!(
        !m.names().iter().any(|n| n.starts_with("nvidia_gpu_")),
        "only dcgm-exporter's names for the GPUs"
    );
    assert_eq!(m.value("nvml_exporter_nvml_up", &[]), Some(1.0));
}

#[test]
fn each_release_default_counters_and_dashboard_are_served_in_both_mode() {
    // The clocks group on, so that the native clocks are there to compare with.
    for release in RELEASES {
        let (_e, m) = exporter_with_gpm(&[
            "--dcgm-compat=both",
            "--dcgm-compat-version",
            release.version,
        ]);
        assert_default_counters_are_served(&m, release, "node-a");
        assert_dashboard_is_served(&m, release);
    }
    let (_e, m) = exporter_with_gpm(&["--dcgm-compat=both", "--collector.clocks"]);
    // Native names are served too, and come first: those of the groups on only, while the DCGM
    // fields of an opt-in group (clock-events) are served all the same.
    assert_eq!(m.find("nvidia_gpu_up", &[]).len(), 8);
    assert!(m.find("nvidia_gpu_throttle_seconds_total", &[]).is_empty());
    assert_eq!(m.find("DCGM_FI_DEV_POWER_VIOLATION", &[]).len(), 8);
    let first_dcgm = m.text.find("# HELP DCGM_").unwrap();
    assert!(m.text.rfind("\nnvidia_gpu_").unwrap() < first_dcgm);
    // Same snapshot, DCGM units: MiB of the native bytes, MHz of the native hertz.
    for gpu in 0..8 {
        let used = m
            .gpu_value("nvidia_gpu_memory_used_bytes", gpu, &[])
            .unwrap();
        let fb = m.gpu_value("DCGM_FI_DEV_FB_USED", gpu, &[]).unwrap();
        assert_eq!(fb, (used / 1_048_576.0).floor(), "gpu {gpu}");
        let sm = m.gpu_value("nvidia_gpu_clock_hertz", gpu, &[("clock", "sm")]);
        assert_eq!(
            m.gpu_value("DCGM_FI_DEV_SM_CLOCK", gpu, &[]),
            sm.map(|hz| (hz / 1e6).round()),
            "gpu {gpu}"
        );
        let sm_active = m.gpu_value("nvidia_gpu_sm_active_ratio", gpu, &[]);
        assert_eq!(m.gpu_value("DCGM_FI_PROF_SM_ACTIVE", gpu, &[]), sm_active);
    }
}

#[test]
fn default_scenario_matches_each_release_golden_file() {
    for release in RELEASES {
        let out = run_once(
            &[("NVML_SIM_TIME", "60"), ("NODE_NAME", "golden-node")],
            &["--dcgm-compat", "--dcgm-compat-version", release.version],
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let actual = strip_volatile(&String::from_utf8_lossy(&out.stdout));
        // The default release's file keeps its name.
        let golden = match release.version {
            "4.8.2" => "h100x8-dcgm.prom".to_string(),
            v => format!("h100x8-dcgm-{v}.prom"),
        };
        assert_golden(&golden, &actual, "dcgm_compat");
    }
}

#[test]
fn the_xid_field_reads_0_until_the_first_xid_then_its_code() {
    // The simulated clock starts 2 s before GPU 6's XID 79.
    let h100 = scenario("h100x8");
    let e = Exporter::start(
        &[
            ("NVML_SIM_SCENARIO", h100.to_str().unwrap()),
            ("NVML_SIM_START", "28"),
        ],
        &[
            "--interval",
            "200ms",
            "--dcgm-compat",
            "--dcgm-compat-version",
            "4.8.4",
        ],
    );
    let before = e.wait_metrics(Duration::from_secs(15), "the XID field", |m| {
        m.find("DCGM_FI_DEV_XID_ERRORS", &[]).len() == 8
    });
    let after = e.wait_metrics(Duration::from_secs(15), "GPU 6's XID 79", |m| {
        m.gpu_value("DCGM_FI_DEV_XID_ERRORS", 6, &[]) == Some(79.0)
    });
    // GPU 6 reads 0 too until its XID, unless that came within the first scrape (the other
    // tests start the scenario at 0, well before it).
    let gpu6 = before.gpu_value("DCGM_FI_DEV_XID_ERRORS", 6, &[]);
    assert!(gpu6 == Some(0.0) || gpu6 == Some(79.0), "{gpu6:?}");
    for gpu in 0..8 {
        if gpu != 6 {
            assert_eq!(
                before.gpu_value("DCGM_FI_DEV_XID_ERRORS", gpu, &[]),
                Some(0.0)
            );
        }
        let want = if gpu == 6 { "79" } else { "0" };
        assert_eq!(
            after.gpu_value("DCGM_FI_DEV_XID_ERRORS", gpu, &[("err_code", want)]),
            Some(want.parse().unwrap()),
            "gpu {gpu}"
        );
    }
}

#[test]
fn the_management_and_the_enforced_power_limit_are_each_their_own() {
    // a100x4.toml's GPU 3 is held to 300 W by another limiter below its 400 W management limit;
    // the other GPUs enforce their 400 W management limit.
    let a100 = scenario("a100x4");
    for release in ["4.8.2", "4.8.4"] {
        let out = run_once(
            &[("NVML_SIM_SCENARIO", a100.to_str().unwrap())],
            &[
                "--dcgm-compat=both",
                "--dcgm-compat-version",
                release,
                "--collector.power-limits",
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{release}");
        let m = Exposition::parse(&String::from_utf8_lossy(&out.stdout));
        for gpu in 0..4 {
            let enforced = if gpu == 3 { 300.0 } else { 400.0 };
            let pairs = [
                ("DCGM_FI_DEV_POWER_MGMT_LIMIT", 400.0),
                ("nvidia_gpu_power_management_limit_watts", 400.0),
                ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", enforced),
                ("nvidia_gpu_power_limit_watts", enforced),
            ];
            for (name, want) in pairs {
                assert_eq!(
                    m.gpu_value(name, gpu, &[]),
                    Some(want),
                    "{release} {name} gpu {gpu}"
                );
            }
        }
        // The limiter caps the draw.
        assert!(m.gpu_value("nvidia_gpu_power_watts", 3, &[]).unwrap() <= 300.0);
    }
}

#[test]
fn the_mode_comes_from_the_environment_and_a_bad_one_exits_2() {
    let out = run_once(&[("NVML_EXPORTER_DCGM_COMPAT", "both")], &[]);
    assert_eq!(out.status.code(), Some(0));
    let m = Exposition::parse(&String::from_utf8_lossy(&out.stdout));
    assert!(!m.find("nvidia_gpu_up", &[]).is_empty());
    assert!(!m.find("DCGM_FI_DEV_GPU_TEMP", &[]).is_empty());

    let out = run_once(&[("NVML_EXPORTER_DCGM_COMPAT", "everything")], &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--dcgm-compat"), "{stderr}");
}

#[test]
fn the_release_comes_from_the_environment_and_an_unknown_one_exits_2_listing_the_known() {
    for release in RELEASES {
        let out = run_once(
            &[("NVML_EXPORTER_DCGM_COMPAT_VERSION", release.version)],
            &["--dcgm-compat"],
        );
        assert_eq!(out.status.code(), Some(0), "{}", release.version);
    }
    let out = run_once(
        &[("NVML_EXPORTER_DCGM_COMPAT_VERSION", "4.9")],
        &["--dcgm-compat"],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--dcgm-compat-version"), "{stderr}");
    for release in RELEASES {
        assert!(stderr.contains(release.version), "{stderr}");
    }
}
