//! Reloading the configuration on the real binary: a change of the `--config` or `--web-config`
//! file applies by itself (users added and removed, options changed, a flag still beating the
//! file), also when a Kubernetes volume swaps a symlink; SIGHUP reloads, options that need a
//! restart say so; and a broken file keeps the previous configuration serving, with the reload
//! metric at 0 and one log line naming the file and line. A reload never turns basic auth off,
//! a file caught empty while its writer rewrites it reloads without a lapse, a storm of SIGHUPs
//! gives a few reloads, and a SIGHUP while the exporter starts does not end it.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Exporter, Exposition, eventually, http_get, scenario, write_atomic};

/// Long enough for a few file checks (every 2 s) and the tick after them.
const WAIT: Duration = Duration::from_secs(20);

fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

/// `/metrics` as `user` (whose password is the user name): the status and the exposition (empty
/// unless the status is 200).
fn scrape(e: &Exporter, user: &str) -> (u16, Exposition) {
    let r = http_get(&e.url("/metrics"), &[("Authorization", &basic(user, user))]);
    let text = if r.status == 200 {
        r.text()
    } else {
        String::new()
    };
    (r.status, Exposition::parse(&text))
}

/// A web-config with these users, each with their name as password (cost 4 keeps it fast).
fn users(names: &[&str]) -> String {
    let mut yaml = String::from("basic_auth_users:\n");
    for name in names {
        yaml += &format!("  {name}: '{}'\n", bcrypt::hash(name, 4).unwrap());
    }
    yaml
}

const RELOAD_OK: &str = "nvml_exporter_config_last_reload_successful";
const RELOAD_TIME: &str = "nvml_exporter_config_last_reload_success_timestamp_seconds";
const PROCESS_MEMORY: &str = "nvidia_gpu_process_memory_used_bytes";

/// Process series per GPU index.
fn processes_per_gpu(m: &Exposition) -> Vec<usize> {
    let mut per_gpu = vec![0; 4];
    for s in m.find(PROCESS_MEMORY, &[]) {
        per_gpu[s.labels["gpu"].parse::<usize>().unwrap()] += 1;
    }
    per_gpu
}

#[test]
fn changed_files_apply_by_themselves_and_a_broken_one_keeps_the_last_good_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let proc_root = tempfile::tempdir().unwrap();
    let web = write_atomic(dir.path(), "web.yml", &users(&["alice"]));
    let config_text = |extra: &str| {
        format!(
            "web_config = '{}'\nhost_proc = '{}'\n{extra}",
            web.display(),
            proc_root.path().display()
        )
    };
    let config = write_atomic(dir.path(), "config.toml", &config_text(""));
    let shared = scenario("shared");
    let mut e = Exporter::start(
        &[("NVML_SIM_SCENARIO", shared.to_str().unwrap())],
        // The flag must keep beating whatever the file says after a reload.
        &[
            "--config",
            config.to_str().unwrap(),
            "--max-processes-per-gpu",
            "1",
        ],
    );
    let (status, m) = eventually(WAIT, "alice scraping a sampled exposition", || {
        let (status, m) = scrape(&e, "alice");
        (status == 200 && m.value("nvml_exporter_gpus", &[]).is_some_and(|n| n > 0.0))
            .then_some((status, m))
    });
    assert_eq!(status, 200);
    assert_eq!(m.value(RELOAD_OK, &[]), Some(1.0));
    assert!(m.find(PROCESS_MEMORY, &[]).is_empty());
    assert!(m.find("DCGM_FI_DEV_GPU_UTIL", &[]).is_empty());
    assert_eq!(scrape(&e, "bob").0, 401);
    let started = m.value(RELOAD_TIME, &[]).unwrap();

    // Both files change: bob replaces alice; processes and dcgm-exporter's names are turned on,
    // and the file asks for more process series than the flag allows.
    write_atomic(dir.path(), "web.yml", &users(&["bob"]));
    write_atomic(
        dir.path(),
        "config.toml",
        &config_text("processes = true\ndcgm_compat = 'both'\nmax_processes_per_gpu = 5\n"),
    );
    let m = eventually(WAIT, "bob scraping processes and DCGM names", || {
        let (status, m) = scrape(&e, "bob");
        (status == 200
            && !m.find(PROCESS_MEMORY, &[]).is_empty()
            && !m.find("DCGM_FI_DEV_GPU_UTIL", &[]).is_empty())
        .then_some(m)
    });
    assert_eq!(scrape(&e, "alice").0, 401, "a removed user still scrapes");
    assert_eq!(m.value(RELOAD_OK, &[]), Some(1.0));
    assert!(m.value(RELOAD_TIME, &[]).unwrap() >= started);
    let per_gpu = processes_per_gpu(&m);
    assert!(
        per_gpu.iter().all(|n| *n <= 1),
        "--max-processes-per-gpu 1 on the command line beats the file's 5: {per_gpu:?}"
    );
    assert!(e.logs().contains("configuration reloaded"), "{}", e.logs());

    // A broken configuration file: the last good configuration keeps serving.
    write_atomic(
        dir.path(),
        "config.toml",
        &config_text("processes = 'yes please'\n"),
    );
    let m = eventually(WAIT, "the reload metric at 0", || {
        let (status, m) = scrape(&e, "bob");
        (status == 200 && m.value(RELOAD_OK, &[]) == Some(0.0)).then_some(m)
    });
    assert!(!m.find(PROCESS_MEMORY, &[]).is_empty(), "processes stopped");
    assert!(!m.find("DCGM_FI_DEV_GPU_UTIL", &[]).is_empty());
    let logs = eventually(WAIT, "the failure's log line", || {
        let logs = e.logs();
        (!failures(&logs).is_empty()).then_some(logs)
    });
    let failed = failures(&logs);
    assert_eq!(failed.len(), 1, "{logs}");
    let config_shown = config.display().to_string();
    assert!(
        failed[0].contains(&config_shown) && failed[0].contains("line 3"),
        "the log line names the file and line: {}",
        failed[0]
    );

    // A broken web-config (a hash that is no bcrypt hash) fails the same way, naming its file.
    write_atomic(
        dir.path(),
        "config.toml",
        &config_text("processes = true\n"),
    );
    write_atomic(dir.path(), "web.yml", "basic_auth_users:\n  carol: plain\n");
    eventually(WAIT, "a failure naming the web-config", || {
        failures(&e.logs())
            .iter()
            .any(|l| l.contains(&web.display().to_string()) && l.contains("carol"))
            .then_some(())
    });
    let (status, m) = scrape(&e, "bob");
    assert_eq!(status, 200, "the last good users stay in force");
    assert_eq!(m.value(RELOAD_OK, &[]), Some(0.0));
    assert_eq!(scrape(&e, "carol").0, 401);

    // Fixed: 1 again, and dcgm-exporter's names are gone as the file now says.
    write_atomic(dir.path(), "web.yml", &users(&["bob", "carol"]));
    eventually(WAIT, "carol scraping after the fix", || {
        let (status, m) = scrape(&e, "carol");
        (status == 200
            && m.value(RELOAD_OK, &[]) == Some(1.0)
            && m.find("DCGM_FI_DEV_GPU_UTIL", &[]).is_empty())
        .then_some(())
    });
    assert!(e.alive());
}

#[test]
fn sighup_reloads_and_options_that_need_a_restart_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_atomic(dir.path(), "config.toml", "interval = '1s'\n");
    let mut e = Exporter::start(&[], &["--config", config.to_str().unwrap()]);
    let first = eventually(WAIT, "a sampled exposition", || {
        let m = e.metrics();
        m.value("nvml_exporter_gpus", &[])
            .is_some_and(|n| n > 0.0)
            .then(|| m.value(RELOAD_TIME, &[]).unwrap())
    });

    // Unchanged file: SIGHUP still reloads, and the success time moves on.
    e.signal(libc::SIGHUP);
    eventually(WAIT, "a later reload success time", || {
        let m = e.metrics();
        (m.value(RELOAD_OK, &[]) == Some(1.0) && m.value(RELOAD_TIME, &[]).unwrap() > first)
            .then_some(())
    });
    let logs = e.logs();
    assert!(logs.contains("SIGHUP received"), "{logs}");
    assert!(logs.contains("nothing changed"), "{logs}");

    // The interval and the log format need a restart: logged, not applied, and the reload still
    // succeeds.
    write_atomic(
        dir.path(),
        "config.toml",
        "interval = '2s'\nlog_format = 'json'\n",
    );
    e.signal(libc::SIGHUP);
    let logs = eventually(WAIT, "the restart warnings", || {
        let logs = e.logs();
        (logs.contains("interval changed") && logs.contains("log_format changed")).then_some(logs)
    });
    assert!(logs.contains("needs a restart"), "{logs}");
    let last = logs.lines().last().unwrap_or_default();
    assert!(!last.starts_with('{'), "the log format changed: {last}");
    assert_eq!(e.metrics().value(RELOAD_OK, &[]), Some(1.0));
    assert!(e.alive());
}

/// A Kubernetes ConfigMap volume: `config.toml -> ..data/config.toml`, `..data -> ..<version>`;
/// an update writes a new version directory and swaps `..data`, leaving `config.toml` alone.
fn configmap_version(dir: &Path, version: &str, text: &str) {
    let versioned = dir.join(version);
    std::fs::create_dir(&versioned).unwrap();
    std::fs::write(versioned.join("config.toml"), text).unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(version, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    let link = dir.join("config.toml");
    if link.symlink_metadata().is_err() {
        std::os::unix::fs::symlink("..data/config.toml", &link).unwrap();
    }
}

#[test]
fn a_configmap_update_by_symlink_swap_applies_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    configmap_version(dir.path(), "..v1", "dcgm_compat = 'off'\n");
    let config = dir.path().join("config.toml");
    let e = Exporter::start(&[], &["--config", config.to_str().unwrap()]);
    eventually(WAIT, "a sampled exposition", || {
        let m = e.metrics();
        m.value("nvml_exporter_gpus", &[])
            .is_some_and(|n| n > 0.0)
            .then_some(())
    });
    assert!(e.metrics().find("DCGM_FI_DEV_GPU_UTIL", &[]).is_empty());

    configmap_version(dir.path(), "..v2", "dcgm_compat = 'both'\n");
    e.wait_metrics(WAIT, "dcgm-exporter's names after the swap", |m| {
        !m.find("DCGM_FI_DEV_GPU_UTIL", &[]).is_empty()
    });
}

#[test]
fn collector_groups_change_with_the_file_and_their_calls_follow() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_atomic(dir.path(), "config.toml", "collector.clocks = false\n");
    let e = Exporter::start(&[], &["--config", config.to_str().unwrap()]);
    e.wait_metrics(WAIT, "a sampled exposition without clocks", |m| {
        m.value("nvml_exporter_gpus", &[]).is_some_and(|n| n > 0.0)
            && m.find("nvidia_gpu_clock_hertz", &[]).is_empty()
            && !m.find("nvidia_gpu_memory_used_bytes", &[]).is_empty()
    });

    // Turned on, the clocks are read (not only served) from the next tick; memory goes.
    write_atomic(
        dir.path(),
        "config.toml",
        "collector.clocks = true\ncollector.memory = false\n",
    );
    e.wait_metrics(WAIT, "clock readings, and no memory series", |m| {
        m.find("nvidia_gpu_clock_hertz", &[])
            .iter()
            .any(|s| s.value > 0.0)
            && m.find("nvidia_gpu_memory_used_bytes", &[]).is_empty()
            && m.value(RELOAD_OK, &[]) == Some(1.0)
    });
}

/// Asks `/metrics` without credentials over and over on a thread of its own until dropped, and
/// counts the answers that were 200: a reload that lets basic auth lapse, even for a moment,
/// shows there.
struct Unauthenticated {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<(usize, usize)>>,
}

impl Unauthenticated {
    fn start(e: &Exporter) -> Unauthenticated {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let url = e.url("/metrics");
        let stopped = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let (mut asked, mut served) = (0, 0);
            while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
                asked += 1;
                if http_get(&url, &[]).status == 200 {
                    served += 1;
                }
            }
            (asked, served)
        });
        Unauthenticated {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops asking, and asserts that some requests were asked and none was served 200.
    fn finish_none_served(mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let (asked, served) = self.thread.take().unwrap().join().unwrap();
        assert!(asked > 0);
        assert_eq!(
            served, 0,
            "{served} of {asked} requests without credentials were served"
        );
    }
}

/// The log lines of failed reloads.
fn failures(logs: &str) -> Vec<&str> {
    logs.lines()
        .filter(|l| l.contains("configuration reload failed"))
        .collect()
}

#[test]
fn a_reload_never_turns_basic_auth_off() {
    let dir = tempfile::tempdir().unwrap();
    let alice = users(&["alice"]);
    let web = write_atomic(dir.path(), "web.yml", &alice);
    let config_text = format!("web_config = '{}'\n", web.display());
    let config = write_atomic(dir.path(), "config.toml", &config_text);
    let e = Exporter::start(&[], &["--config", config.to_str().unwrap()]);
    eventually(WAIT, "alice scraping a sampled exposition", || {
        let (status, m) = scrape(&e, "alice");
        (status == 200 && m.value("nvml_exporter_gpus", &[]).is_some_and(|n| n > 0.0)).then_some(())
    });
    let anyone = Unauthenticated::start(&e);

    // Each way of losing the users: the web-config truncated to nothing, rewritten as only
    // comments, and a --config that no longer names it.
    let losses: [(&str, &str, &std::path::Path); 3] = [
        ("web.yml", "", &web),
        ("web.yml", "# users moved elsewhere\n\n", &web),
        ("config.toml", "# web_config removed\n", &config),
    ];
    for (name, text, named) in losses {
        let refused_before = failures(&e.logs()).len();
        // In place, as a writer that truncates does.
        std::fs::write(dir.path().join(name), text).unwrap();
        let line = eventually(WAIT, "the refused reload's log line", || {
            failures(&e.logs())
                .get(refused_before)
                .map(|l| l.to_string())
        });
        assert!(
            line.contains(&named.display().to_string()) && line.contains("basic auth off"),
            "the log line names the file and what it would drop: {line}"
        );
        let (status, m) = scrape(&e, "alice");
        assert_eq!(status, 200, "{name} {text:?}: alice still scrapes");
        assert_eq!(m.value(RELOAD_OK, &[]), Some(0.0), "{name} {text:?}");
        assert_eq!(
            http_get(&e.url("/metrics"), &[]).status,
            401,
            "{name} {text:?}: basic auth is still in force"
        );

        // Put back, the next reload succeeds.
        write_atomic(dir.path(), "web.yml", &alice);
        write_atomic(dir.path(), "config.toml", &config_text);
        eventually(WAIT, "a successful reload after the fix", || {
            let (status, m) = scrape(&e, "alice");
            (status == 200 && m.value(RELOAD_OK, &[]) == Some(1.0)).then_some(())
        });
    }
    anyone.finish_none_served();
}

#[test]
fn a_file_rewritten_by_a_writer_that_truncates_first_reloads_without_a_lapse() {
    let dir = tempfile::tempdir().unwrap();
    let alice = users(&["alice"]);
    let web = write_atomic(dir.path(), "web.yml", &alice);
    // The debug line says when a reload found a file empty and waits to read it again.
    let e = Exporter::start(
        &[],
        &[
            "--web-config",
            web.to_str().unwrap(),
            "--log-level",
            "info,nvml_exporter::reload=debug",
        ],
    );
    eventually(WAIT, "alice scraping", || {
        (scrape(&e, "alice").0 == 200).then_some(())
    });
    let anyone = Unauthenticated::start(&e);

    // `cat > web.yml`: the file is empty from the truncation until the text is written. A
    // SIGHUP in that moment makes the reload read it empty; the text comes once it has.
    std::fs::write(&web, "").unwrap();
    e.signal(libc::SIGHUP);
    eventually(WAIT, "the reload finding the file empty", || {
        e.logs().contains("reads empty").then_some(())
    });
    std::fs::write(&web, &alice).unwrap();

    let logs = eventually(WAIT, "the reload's outcome", || {
        let logs = e.logs();
        (logs.contains("configuration reloaded") || !failures(&logs).is_empty()).then_some(logs)
    });
    assert!(failures(&logs).is_empty(), "{logs}");
    let (status, m) = scrape(&e, "alice");
    assert_eq!(status, 200);
    assert_eq!(m.value(RELOAD_OK, &[]), Some(1.0));
    anyone.finish_none_served();
}

#[test]
fn a_storm_of_sighups_gives_a_few_reloads_not_one_each() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_atomic(dir.path(), "config.toml", "dcgm_compat = 'off'\n");
    let mut e = Exporter::start(&[], &["--config", config.to_str().unwrap()]);
    e.wait_metrics(WAIT, "a sampled exposition", |m| {
        m.value("nvml_exporter_gpus", &[]).is_some_and(|n| n > 0.0)
    });

    // 200 SIGHUPs over about two seconds.
    for _ in 0..200 {
        e.signal(libc::SIGHUP);
        std::thread::sleep(Duration::from_millis(10));
    }
    // A change after the storm: once it is served, the reloads the storm asked for are done
    // (the last of them may be the one that applies it).
    write_atomic(dir.path(), "config.toml", "dcgm_compat = 'both'\n");
    e.wait_metrics(WAIT, "the change after the storm", |m| {
        !m.find("DCGM_FI_DEV_GPU_UTIL", &[]).is_empty()
    });
    assert!(e.alive());
    let logs = e.logs();
    let reloads = logs
        .lines()
        .filter(|l| l.contains("configuration reloaded"))
        .count();
    let by_signal = logs
        .lines()
        .filter(|l| l.contains("SIGHUP received"))
        .count();
    assert!(
        (1..=10).contains(&by_signal) && reloads <= by_signal + 1,
        "200 SIGHUPs gave {by_signal} reloads by signal, {reloads} in all:\n{logs}"
    );
}

/// Whether process `pid` ignores SIGHUP and whether it catches it, from /proc/PID/status (the
/// signal's bit in `SigIgn` and `SigCgt`); `None` once the process is gone.
fn sighup_disposition(pid: u32) -> Option<(bool, bool)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let bit = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .is_some_and(|mask| mask & (1 << (libc::SIGHUP - 1)) != 0)
    };
    Some((bit("SigIgn:"), bit("SigCgt:")))
}

#[test]
fn a_sighup_while_starting_does_not_end_the_process() {
    let sim = common::sim_lib();
    let mut sent_before_watched = false;
    let mut e = Exporter::start_command_then(
        common::exporter_command(&[], &[]),
        &["--nvml-lib", sim.to_str().unwrap()],
        |child| {
            // Sent as soon as the program has started (before that, the dynamic loader runs and
            // no program can take charge of a signal), well before it watches the signal for
            // reloads. Asked without a pause: that moment lasts a few milliseconds.
            let deadline = std::time::Instant::now() + WAIT;
            while std::time::Instant::now() < deadline {
                match sighup_disposition(child.id()) {
                    Some((false, false)) => continue,
                    Some((_, caught)) => {
                        sent_before_watched = !caught;
                        break;
                    }
                    None => panic!("the exporter ended before it started"),
                }
            }
            // SAFETY: plain kill(2) on our own child's pid.
            #[allow(unsafe_code, reason = "kill(2) is a C call")]
            unsafe {
                libc::kill(child.id() as i32, libc::SIGHUP)
            };
        },
    );
    assert!(
        sent_before_watched,
        "the SIGHUP was sent before the exporter watched it"
    );
    e.wait_ready(WAIT);
    assert_eq!(e.get("/metrics").status, 200);
    assert!(e.alive());
}
