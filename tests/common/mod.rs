//! Shared helpers for the integration tests: run the real `nvml-exporter` binary against the
//! simulated driver (`libnvml_sim.so`, built by cargo as a dev-dependency), scrape it over HTTP,
//! and parse what it serves. Each exporter runs as a child process with its own environment, so
//! tests with different scenarios or pinned clocks run in parallel without sharing state. A test
//! waits for what a user would see with [`eventually`] (or [`poll_until`]), never with a bare
//! sleep; [`certs`] makes the certificates of the TLS tests.

#![allow(dead_code)] // each test binary uses a different subset

pub mod certs;
pub mod sysfs;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// How long [`poll_until`] waits between two looks.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Asks `condition` until it returns `Some`, and returns that value; `None` once `timeout` has
/// passed without it. For a wait whose failure message says what was last seen; otherwise
/// [`eventually`].
pub fn poll_until<T>(timeout: Duration, mut condition: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = condition() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Asks `condition` until it returns `Some`, and returns that value; panics naming `what` and
/// `timeout` when it has not within `timeout`. The condition is what a user would check (a
/// scrape, a probe, a thread count), never the passing of time.
pub fn eventually<T>(timeout: Duration, what: &str, condition: impl FnMut() -> Option<T>) -> T {
    poll_until(timeout, condition)
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// The exporter binary under test.
pub fn exporter_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_nvml-exporter"))
}

/// The simulated driver library, built by cargo next to this test (nvml-sim is a dev-dependency).
pub fn sim_lib() -> PathBuf {
    nvml_sim::built_library().expect("libnvml_sim.so built next to the test executable")
}

/// A shipped scenario file by name (without `.toml`).
pub fn scenario(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("nvml-sim/scenarios")
        .join(format!("{name}.toml"));
    assert!(path.exists(), "no scenario {}", path.display());
    path
}

/// `--collector.NAME` for every collector group: the exporter serving every family.
pub fn every_group() -> Vec<String> {
    nvml_exporter::groups::Group::switchable()
        .map(|g| format!("--collector.{}", g.name))
        .collect()
}

/// `args` after the flags of [`every_group`].
pub fn with_every_group<'a>(flags: &'a [String], args: &[&'a str]) -> Vec<&'a str> {
    flags
        .iter()
        .map(String::as_str)
        .chain(args.iter().copied())
        .collect()
}

/// A command for the exporter with a clean `NVML_EXPORTER_*` / `NVML_SIM_*` / `OTEL_*`
/// environment, its `--host-sys` a sysfs whose PCI bus lists no device (`env` may name another):
/// the machine's own GPUs never meet the simulator's.
pub fn exporter_command(env: &[(&str, &str)], args: &[&str]) -> Command {
    let mut cmd = Command::new(exporter_bin());
    for (key, _) in std::env::vars() {
        if key.starts_with("NVML_EXPORTER_")
            || key.starts_with("NVML_SIM_")
            || key.starts_with("OTEL_")
        {
            cmd.env_remove(key);
        }
    }
    cmd.env("NVML_EXPORTER_HOST_SYS", empty_sysfs());
    cmd.envs(env.iter().copied()).args(args);
    cmd
}

/// A sysfs with an empty PCI bus, under cargo's directory for the tests' files (every test
/// process shares it).
pub fn empty_sysfs() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("empty-sysfs");
    std::fs::create_dir_all(dir.join("bus/pci/devices")).expect("an empty sysfs");
    dir
}

/// Runs `nvml-exporter --once` on the simulator with `env`, and returns its output.
pub fn run_once(env: &[(&str, &str)], extra_args: &[&str]) -> Output {
    let sim = sim_lib();
    let mut args = vec![
        "--once",
        "--nvml-lib",
        sim.to_str().unwrap(),
        "--log-level",
        "warn",
    ];
    args.extend_from_slice(extra_args);
    exporter_command(env, &args)
        .output()
        .expect("run nvml-exporter")
}

/// A running exporter on 127.0.0.1 with an OS-chosen port. Killed on drop.
pub struct Exporter {
    pub child: Child,
    pub addr: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Exporter {
    /// Starts the exporter on the simulator with `env` and extra `args`, and waits until it listens.
    pub fn start(env: &[(&str, &str)], args: &[&str]) -> Exporter {
        let sim = sim_lib();
        let mut all = vec!["--nvml-lib", sim.to_str().unwrap()];
        all.extend_from_slice(args);
        Exporter::start_raw(env, &all)
    }

    /// Starts the exporter with exactly these arguments (plus `--listen 127.0.0.1:0`).
    pub fn start_raw(env: &[(&str, &str)], args: &[&str]) -> Exporter {
        Exporter::start_command(exporter_command(env, &[]), args)
    }

    /// Starts `cmd` (an exporter command, possibly wrapped) with `args` plus
    /// `--listen 127.0.0.1:0`, and waits until it listens.
    pub fn start_command(cmd: Command, args: &[&str]) -> Exporter {
        Exporter::start_command_then(cmd, args, |_| {})
    }

    /// As [`Exporter::start_command`], calling `spawned` with the child as soon as it is
    /// spawned, before it listens.
    pub fn start_command_then(
        mut cmd: Command,
        args: &[&str],
        spawned: impl FnOnce(&Child),
    ) -> Exporter {
        let mut all = vec!["--listen", "127.0.0.1:0"];
        all.extend_from_slice(args);
        let mut child = cmd
            .args(&all)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nvml-exporter");
        spawned(&child);
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let sink = logs.clone();
        // Drain stderr for the whole life of the child (a full pipe would block it), and report the
        // address from the "listening" line.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening") {
                    if let Some(addr) = line
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix("address="))
                    {
                        let _ = tx.send(addr.trim_matches('"').to_string());
                    }
                }
                sink.lock().unwrap().push(line);
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a.parse().expect("listen address"),
            Err(_) => {
                let _ = child.kill();
                // SIGKILL when it was still running; otherwise how it ended.
                let status = child.wait();
                panic!(
                    "exporter did not start listening ({status:?}); logs:\n{}",
                    logs.lock().unwrap().join("\n")
                );
            }
        };
        Exporter { child, addr, logs }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// GET `path` without asking for compression.
    pub fn get(&self, path: &str) -> Response {
        http_get(&self.url(path), &[])
    }

    /// The parsed `/metrics` exposition.
    pub fn metrics(&self) -> Exposition {
        let r = self.get("/metrics");
        assert_eq!(r.status, 200, "GET /metrics: {}", r.text());
        Exposition::parse(&r.text())
    }

    /// Polls `/metrics` until `cond` holds, failing with the last exposition after `timeout`.
    pub fn wait_metrics(
        &self,
        timeout: Duration,
        what: &str,
        cond: impl Fn(&Exposition) -> bool,
    ) -> Exposition {
        let mut last = String::new();
        poll_until(timeout, || {
            let m = self.metrics();
            if cond(&m) {
                return Some(m);
            }
            last = m.text;
            None
        })
        .unwrap_or_else(|| {
            panic!(
                "timed out after {timeout:?} waiting for {what}; last /metrics:\n{last}\nlogs:\n{}",
                self.logs()
            )
        })
    }

    /// Polls `/readyz` until it answers 200, failing with its last answer after `timeout`.
    pub fn wait_ready(&self, timeout: Duration) {
        let mut last = String::new();
        poll_until(timeout, || {
            let r = self.get("/readyz");
            last = format!("{} {}", r.status, r.text());
            (r.status == 200).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "not ready after {timeout:?}: /readyz answers {last}\nlogs:\n{}",
                self.logs()
            )
        })
    }

    /// Everything the exporter logged so far.
    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    /// Sends SIGTERM and waits for the exit status, at most `timeout`.
    #[allow(unsafe_code, reason = "kill(2) is a C call")]
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        poll_until(timeout, || self.child.try_wait().ok().flatten())
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `signal` (`libc::SIGHUP`…) to the process.
    #[allow(unsafe_code, reason = "kill(2) is a C call")]
    pub fn signal(&self, signal: i32) {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP response, body as raw bytes (not decompressed).
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// GET with extra request headers; non-2xx statuses are returned, not errors.
pub fn http_get(url: &str, headers: &[(&str, &str)]) -> Response {
    http_request("GET", url, headers)
}

/// A request with any method; the body is read only for non-HEAD requests.
pub fn http_request(method: &str, url: &str, headers: &[(&str, &str)]) -> Response {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut req = ureq::http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut resp = agent
        .run(req.body(()).unwrap())
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let mut body = Vec::new();
    if method != "HEAD" {
        resp.body_mut()
            .as_reader()
            .read_to_end(&mut body)
            .expect("read body");
    }
    Response {
        status,
        headers,
        body,
    }
}

/// One series of an exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed text exposition (format 0.0.4), enough for assertions.
#[derive(Debug, Clone)]
pub struct Exposition {
    pub text: String,
    pub series: Vec<Series>,
    /// Metric family name → type from `# TYPE` lines.
    pub types: BTreeMap<String, String>,
}

impl Exposition {
    pub fn parse(text: &str) -> Exposition {
        let mut series = Vec::new();
        let mut types = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split_whitespace();
                if let (Some(n), Some(t)) = (parts.next(), parts.next()) {
                    types.insert(n.to_string(), t.to_string());
                }
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            series.push(parse_series(line));
        }
        Exposition {
            text: text.to_string(),
            series,
            types,
        }
    }

    /// Series of metric `name` whose labels include every pair of `labels`.
    pub fn find(&self, name: &str, labels: &[(&str, &str)]) -> Vec<&Series> {
        self.series
            .iter()
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }

    /// The value of the single series matching `name` and `labels`; None when there is none.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let found = self.find(name, labels);
        assert!(
            found.len() <= 1,
            "{name}{labels:?} matches {} series",
            found.len()
        );
        found.first().map(|s| s.value)
    }

    /// The value for GPU `gpu` (by the `gpu` label) with extra `labels`.
    pub fn gpu_value(&self, name: &str, gpu: u32, labels: &[(&str, &str)]) -> Option<f64> {
        let g = gpu.to_string();
        let mut all = vec![("gpu", g.as_str())];
        all.extend_from_slice(labels);
        self.value(name, &all)
    }

    /// Every metric name served.
    pub fn names(&self) -> std::collections::BTreeSet<&str> {
        self.series.iter().map(|s| s.name.as_str()).collect()
    }
}

fn parse_series(line: &str) -> Series {
    let (name_labels, value) = match line.find('{') {
        Some(_) => {
            let close = line
                .rfind('}')
                .unwrap_or_else(|| panic!("unclosed labels: {line}"));
            (&line[..=close], line[close + 1..].trim())
        }
        None => {
            let (n, v) = line
                .split_once(' ')
                .unwrap_or_else(|| panic!("no value: {line}"));
            (n, v.trim())
        }
    };
    let value = value
        .split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("no value: {line}"));
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().unwrap_or_else(|_| panic!("bad value in: {line}")),
    };
    let (name, labels) = match name_labels.find('{') {
        Some(open) => (
            &name_labels[..open],
            parse_labels(&name_labels[open + 1..name_labels.len() - 1]),
        ),
        None => (name_labels, BTreeMap::new()),
    };
    Series {
        name: name.to_string(),
        labels,
        value,
    }
}

fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        while matches!(chars.peek(), Some(',') | Some(' ')) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        assert_eq!(chars.next(), Some('"'), "label {key} not quoted in {s}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => break,
                },
                '"' => break,
                c => value.push(c),
            }
        }
        out.insert(key.trim().to_string(), value);
    }
    out
}

/// Names of series whose value depends on the run, not on the scenario: the exporter's own
/// process and timing (the configuration's load time included), and its build.
pub const VOLATILE_PREFIXES: &[&str] = &[
    "process_",
    "nvml_exporter_sample_duration_seconds",
    "nvml_exporter_last_sample_timestamp_seconds",
    "nvml_exporter_build_info",
    "nvml_exporter_scrapes_total",
    "nvml_exporter_http_connections",
    "nvml_exporter_config_last_reload_success_timestamp_seconds",
];

/// The exposition without the lines of [`VOLATILE_PREFIXES`] series (HELP/TYPE lines kept).
pub fn strip_volatile(text: &str) -> String {
    text.lines()
        .filter(|l| l.starts_with('#') || !VOLATILE_PREFIXES.iter().any(|p| l.starts_with(p)))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Compares `actual` with the golden file `tests/golden/NAME`, or rewrites the file when
/// `UPDATE_GOLDEN` is set. On a difference, panics with the first differing lines and how to
/// accept the change (`test`: the `cargo test --test` target that owns the file).
pub fn assert_golden(name: &str, actual: &str, test: &str) {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&golden).unwrap_or_default();
    if expected != actual {
        let diff: Vec<String> = expected
            .lines()
            .zip(actual.lines())
            .filter(|(e, a)| e != a)
            .take(15)
            .map(|(e, a)| format!("- {e}\n+ {a}"))
            .collect();
        panic!(
            "output differs from {} ({} vs {} lines); first differences:\n{}\n\
             If the change is intended: UPDATE_GOLDEN=1 cargo test --test {test}, and note it in CHANGELOG.md",
            golden.display(),
            expected.lines().count(),
            actual.lines().count(),
            diff.join("\n")
        );
    }
}

impl Exposition {
    /// Every series (any name) whose labels include all of `labels`, in exposition order.
    pub fn find_any_labels(&self, labels: &[(&str, &str)]) -> Vec<&Series> {
        self.series
            .iter()
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }
}

/// How many threads `e` has, and how many of them are device readers (`nvml-reader…`), from
/// one listing of `/proc/<pid>/task`.
pub fn thread_counts(e: &Exporter) -> (usize, usize) {
    let names: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", e.child.id()))
        .expect("list /proc/<pid>/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .collect();
    let readers = names
        .iter()
        .filter(|n| n.starts_with("nvml-reader"))
        .count();
    (names.len(), readers)
}

/// How many device reader threads `e` has.
pub fn reader_threads(e: &Exporter) -> usize {
    thread_counts(e).1
}

/// Writes `text` to `dir/name` by rename, as editors, certificate tools and Kubernetes volumes
/// do, so that a reader never sees half a file.
pub fn write_atomic(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

/// A memory figure of process `pid` from `/proc/PID/status`, in bytes: `VmRSS` (resident now),
/// `VmHWM` (its peak).
pub fn memory_of(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let prefix = format!("{field}:");
    status
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
        * 1024
}
