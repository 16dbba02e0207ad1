//! Hostile clients against the real binary, each while a poller scrapes `/metrics` on a fresh
//! connection every 0.5 s, as Prometheus does when it scrapes less often than the server keeps
//! idle connections: every scrape must succeed within Prometheus's default 10 s timeout. The
//! attacks: thousands of silent connections, thousands of idle kept-alive ones, pipeliners that
//! never read their responses, stalled TLS handshakes, more connections than the process may open
//! files, request heads that never end (resident memory must stay under a 128 MiB limit), and
//! request bodies that never end, reconnecting as they are closed (`/healthz` must answer too).
//! Also: a kept-alive connection closes after its request limit; a head over 16 KiB gets 431.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::certs::Ca;
use common::{Exporter, Exposition, eventually, exporter_command};

/// Prometheus's default scrape timeout: the bound on every scrape during an attack.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// The kubelet's probe timeout in the shipped manifests.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How often the poller scrapes.
const POLL_EVERY: Duration = Duration::from_millis(500);

/// Scrapes that must complete while an attack holds its connections.
const SCRAPES_UNDER_ATTACK: usize = 4;

/// The DaemonSet's memory limit.
const MEMORY_LIMIT_BYTES: u64 = 128 << 20;

/// Open files this process wants: the attacks open thousands of connections.
const OWN_OPEN_FILES: libc::rlim_t = 8192;

/// Raises this process's open-file limit to [`OWN_OPEN_FILES`] where allowed (root may raise
/// the hard limit), else its soft limit to its hard limit.
#[allow(unsafe_code, reason = "getrlimit and setrlimit are C calls")]
fn raise_own_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit with valid local structs.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        let wanted = libc::rlimit {
            rlim_cur: OWN_OPEN_FILES.max(limit.rlim_max),
            rlim_max: OWN_OPEN_FILES.max(limit.rlim_max),
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) != 0 {
            limit.rlim_cur = limit.rlim_max;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
        }
    }
}

/// An exporter that has read its 8 GPUs, so every scrape can be checked for them.
fn started(e: Exporter) -> Exporter {
    e.wait_metrics(Duration::from_secs(30), "8 GPUs", |m| {
        m.value("nvml_exporter_gpus", &[]) == Some(8.0)
    });
    e
}

/// `GET /metrics` on a new plain connection, all within [`SCRAPE_TIMEOUT`]: Ok when it answers
/// 200 with the GPUs.
fn scrape_plain(addr: SocketAddr) -> Result<(), String> {
    get_plain(addr, "/metrics", "\nnvml_exporter_gpus 8\n")
}

/// `GET path` on a new plain connection, all within [`SCRAPE_TIMEOUT`]: Ok when it answers 200
/// with `expected` in the body.
fn get_plain(addr: SocketAddr, path: &str, expected: &str) -> Result<(), String> {
    get_within(addr, path, expected, SCRAPE_TIMEOUT)
}

/// [`get_plain`] within `bound`.
fn get_within(addr: SocketAddr, path: &str, expected: &str, bound: Duration) -> Result<(), String> {
    let deadline = Instant::now() + bound;
    let mut s = TcpStream::connect_timeout(&addr, bound).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(bound))
        .map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes())
        .map_err(|e| format!("send {path}: {e}"))?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no complete answer within {bound:?}"));
        }
        s.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(e) => return Err(format!("{path}: read after {} bytes: {e}", reply.len())),
        }
    }
    let text = String::from_utf8_lossy(&reply);
    if !text.starts_with("HTTP/1.1 200") || !text.contains(expected) {
        return Err(format!(
            "unexpected answer to {path}: {}",
            text.lines().next().unwrap_or("")
        ));
    }
    Ok(())
}

/// A thread scraping every [`POLL_EVERY`] with `scrape` until stopped, keeping every failure
/// and every scrape that took longer than its bound.
struct Poller {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
    failures: Arc<Mutex<Vec<String>>>,
    thread: Option<JoinHandle<()>>,
}

impl Poller {
    fn start(scrape: impl Fn() -> Result<(), String> + Send + 'static) -> Poller {
        Poller::start_within(SCRAPE_TIMEOUT, scrape)
    }

    fn start_within(
        bound: Duration,
        scrape: impl Fn() -> Result<(), String> + Send + 'static,
    ) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, done, failures) = (stop.clone(), done.clone(), failures.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let start = Instant::now();
                    let result = scrape();
                    let took = start.elapsed();
                    match result {
                        Ok(()) if took <= bound => {}
                        Ok(()) => failures.lock().unwrap().push(format!("took {took:?}")),
                        Err(e) => failures
                            .lock()
                            .unwrap()
                            .push(format!("{e} (after {took:?})")),
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    // The cadence of the poller, not a wait for anything.
                    std::thread::sleep(POLL_EVERY.saturating_sub(took));
                }
            })
        };
        Poller {
            stop,
            done,
            failures,
            thread: Some(thread),
        }
    }

    /// Waits until [`SCRAPES_UNDER_ATTACK`] more scrapes have completed, however they went.
    fn wait_for_scrapes(&self) {
        let target = self.done.load(Ordering::Relaxed) + SCRAPES_UNDER_ATTACK;
        let bound = SCRAPE_TIMEOUT * 2 * SCRAPES_UNDER_ATTACK as u32;
        eventually(bound, "scrapes during the attack", || {
            (self.done.load(Ordering::Relaxed) >= target).then_some(())
        });
    }

    /// Stops the poller and asserts that every scrape succeeded in time.
    fn finish(mut self, attack: &str) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        let failures = self.failures.lock().unwrap();
        assert!(
            failures.is_empty(),
            "{} of {} scrapes failed during {attack}:\n{}",
            failures.len(),
            self.done.load(Ordering::Relaxed),
            failures.join("\n")
        );
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Runs `attack` (which opens connections and returns them) while `poller` scrapes, holds its
/// connections for [`SCRAPES_UNDER_ATTACK`] more scrapes, and asserts every scrape succeeded.
fn hold<T>(poller: Poller, name: &str, attack: impl FnOnce() -> T) -> T {
    poller.wait_for_scrapes();
    let held = attack();
    poller.wait_for_scrapes();
    poller.finish(name);
    held
}

/// Opens `n` connections to `addr`, sending each `first` (if not empty); connections refused
/// or reset by the server are left out.
fn open(addr: SocketAddr, n: usize, first: &[u8]) -> Vec<TcpStream> {
    (0..n)
        .filter_map(|_| {
            let mut s = TcpStream::connect_timeout(&addr, SCRAPE_TIMEOUT).ok()?;
            // A server that stops reading must not block the attack.
            s.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
            if !first.is_empty() {
                s.write_all(first).ok()?;
            }
            Some(s)
        })
        .collect()
}

/// The value of `nvml_exporter_http_connections_closed_total{reason}`.
fn closed(m: &Exposition, reason: &str) -> f64 {
    m.value(
        "nvml_exporter_http_connections_closed_total",
        &[("reason", reason)],
    )
    .unwrap_or(0.0)
}

#[test]
fn silent_connections_do_not_delay_fresh_scrapes() {
    raise_own_open_file_limit();
    let e = started(Exporter::start(&[], &[]));
    let addr = e.addr;
    let silent = hold(
        Poller::start(move || scrape_plain(addr)),
        "2,000 silent connections",
        || open(addr, 2000, b""),
    );
    assert!(silent.len() > 1000, "only {} connected", silent.len());
    // Room was made by closing the oldest of them.
    e.wait_metrics(
        Duration::from_secs(10),
        "reclaimed connections counted",
        |m| closed(m, "reclaimed") > 0.0,
    );
}

#[test]
fn idle_kept_alive_connections_do_not_delay_fresh_scrapes() {
    raise_own_open_file_limit();
    let e = started(Exporter::start(&[], &[]));
    let addr = e.addr;
    let request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let idle = hold(
        Poller::start(move || scrape_plain(addr)),
        "2,000 idle kept-alive connections",
        || open(addr, 2000, request),
    );
    assert!(idle.len() > 1000, "only {} connected", idle.len());
}

#[test]
fn pipeliners_that_never_read_do_not_delay_scrapes_and_are_closed() {
    raise_own_open_file_limit();
    // Per-link series make 50 responses (~10 MB) more than the kernel's socket buffers absorb,
    // so the server is left with writes that make no progress; the lean default body (~40 kB)
    // would be taken whole and the connections would only go idle.
    let e = started(Exporter::start(&[], &["--collector.nvlink-links"]));
    let addr = e.addr;
    let fifty = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(50);
    let pipeliners = hold(
        Poller::start(move || scrape_plain(addr)),
        "600 pipeliners that never read",
        || open(addr, 600, &fifty),
    );
    assert_eq!(pipeliners.len(), 600);
    // Their responses make no progress: the server closes them rather than holding them forever.
    e.wait_metrics(
        Duration::from_secs(30),
        "the pipeliners closed for not reading",
        |m| {
            closed(m, "write_timeout") >= 1.0
                && m.value("nvml_exporter_http_connections", &[]) <= Some(2.0)
        },
    );
}

#[test]
fn pipeliners_of_the_node_page_that_never_read_do_not_starve_the_probes() {
    raise_own_open_file_limit();
    // A large node: 64 GPUs with their processes make a page of a few hundred kB.
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/scenarios/h100x64.toml");
    let e = Exporter::start(
        &[("NVML_SIM_SCENARIO", scenario.to_str().unwrap())],
        &["--processes"],
    );
    e.wait_metrics(Duration::from_secs(30), "64 GPUs", |m| {
        m.value("nvml_exporter_gpus", &[]) == Some(64.0)
    });
    let addr = e.addr;
    let pages = [
        &b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"[..],
        b"GET /api/v1/gpus HTTP/1.1\r\nHost: localhost\r\n\r\n",
    ]
    .concat()
    .repeat(25);
    // The kubelet's probe gives up after 2 s (and restarts the pod after a few).
    let pipeliners = hold(
        Poller::start_within(PROBE_TIMEOUT, move || {
            get_within(addr, "/healthz", "ok", PROBE_TIMEOUT)
        }),
        "1,100 pipeliners of the node page that never read",
        || open(addr, 1100, &pages),
    );
    assert!(
        pipeliners.len() > 1000,
        "only {} connected",
        pipeliners.len()
    );
}

#[test]
fn stalled_tls_handshakes_do_not_delay_fresh_scrapes() {
    raise_own_open_file_limit();
    let ca = Ca::new("test CA");
    let dir = tempfile::tempdir().unwrap();
    let server = ca.server();
    std::fs::write(dir.path().join("server.crt"), &server.cert).unwrap();
    std::fs::write(dir.path().join("server.key"), &server.key).unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n",
    )
    .unwrap();
    let e = Exporter::start(&[], &["--web-config", web.to_str().unwrap()]);
    let url = format!("https://{}/metrics", e.addr);
    let roots = ureq::tls::RootCerts::new_with_certs(&[ureq::tls::Certificate::from_pem(
        ca.pem.as_bytes(),
    )
    .unwrap()]);
    // A new agent per scrape: a new connection and a new handshake each time.
    let get = move || -> Result<Exposition, String> {
        let tls = ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::Rustls)
            .root_certs(roots.clone())
            .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .build();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .timeout_global(Some(SCRAPE_TIMEOUT))
            .build()
            .into();
        let body = agent
            .get(&url)
            .call()
            .map_err(|e| e.to_string())?
            .body_mut()
            .read_to_string()
            .map_err(|e| e.to_string())?;
        let m = Exposition::parse(&body);
        (m.value("nvml_exporter_gpus", &[]) == Some(8.0))
            .then_some(m)
            .ok_or_else(|| "no GPUs in the answer".to_string())
    };
    let get = Arc::new(get);
    eventually(Duration::from_secs(30), "8 GPUs over TLS", || get().ok());
    // A TLS record header announcing a ClientHello that never comes.
    let stalled = hold(
        Poller::start({
            let get = get.clone();
            move || get().map(drop)
        }),
        "300 stalled TLS handshakes",
        || open(e.addr, 300, &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]),
    );
    assert_eq!(stalled.len(), 300);
    // Each is closed once its allowance has passed.
    eventually(
        Duration::from_secs(30),
        "the stalled handshakes closed",
        || {
            get()
                .ok()
                .filter(|m| closed(m, "handshake_timeout") >= 300.0)
        },
    );
}

/// Connections that announce a request body and send it a byte (or a one-byte chunk) at a
/// time, never finishing it; each one the server closes is opened again at once.
struct BodyDrip {
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl BodyDrip {
    /// Connections kept open at once.
    const CONNECTIONS: usize = 1100;

    fn start(addr: SocketAddr) -> BodyDrip {
        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, opened) = (stop.clone(), opened.clone());
            std::thread::spawn(move || {
                let length =
                    b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nContent-Length: 65536\r\n\r\n";
                let chunked =
                    b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n";
                // (stream, what it drips)
                let mut conns: Vec<(TcpStream, &[u8])> = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    while conns.len() < Self::CONNECTIONS && !stop.load(Ordering::Relaxed) {
                        let chunks = opened.fetch_add(1, Ordering::Relaxed) % 2 == 1;
                        let (head, drip): (&[u8], &[u8]) = if chunks {
                            (chunked, b"1\r\na\r\n")
                        } else {
                            (length, b"a")
                        };
                        if let Some(s) = open(addr, 1, head).pop() {
                            s.set_nonblocking(true).unwrap();
                            conns.push((s, drip));
                        }
                    }
                    // A connection the server closed fails to write (at the latest the second
                    // time, once the reset has come back) and is replaced.
                    conns.retain_mut(|(s, drip)| s.write_all(drip).is_ok());
                    // The attacker's cadence, not a wait for anything.
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        };
        BodyDrip {
            stop,
            opened,
            thread: Some(thread),
        }
    }

    /// Stops the attack and returns how many connections it opened.
    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        self.opened.load(Ordering::Relaxed)
    }
}

impl Drop for BodyDrip {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[test]
fn request_bodies_that_never_finish_do_not_delay_fresh_scrapes_or_probes() {
    raise_own_open_file_limit();
    let e = started(Exporter::start(&[], &[]));
    let addr = e.addr;
    let poller = Poller::start(move || {
        scrape_plain(addr)?;
        get_plain(addr, "/healthz", "ok")
    });
    poller.wait_for_scrapes();
    let drip = BodyDrip::start(addr);
    eventually(
        Duration::from_secs(60),
        "the drip connections opened",
        || (drip.opened.load(Ordering::Relaxed) >= BodyDrip::CONNECTIONS).then_some(()),
    );
    poller.wait_for_scrapes();
    poller.wait_for_scrapes();
    let opened = drip.finish();
    poller.finish("1,100 request bodies that never finish");
    // They were closed as unfinished requests, not served.
    let m = e.metrics();
    let unfinished = closed(&m, "reclaimed") + closed(&m, "head_timeout");
    assert!(
        unfinished > (opened - BodyDrip::CONNECTIONS) as f64 * 0.9,
        "{unfinished} of {opened} drip connections closed as unfinished"
    );
}

/// An exporter that may open at most `limit` files, soft and hard: it cannot raise its way out.
fn start_with_open_file_limit(limit: u64) -> Exporter {
    let mut cmd = exporter_command(&[], &[]);
    #[allow(unsafe_code, reason = "setrlimit is a C call")]
    // SAFETY: setrlimit is async-signal-safe and touches only the child's own limits.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let sim = common::sim_lib();
    started(Exporter::start_command(
        cmd,
        &["--nvml-lib", sim.to_str().unwrap()],
    ))
}

#[test]
fn more_connections_than_the_open_file_limit_do_not_delay_fresh_scrapes() {
    raise_own_open_file_limit();
    let e = start_with_open_file_limit(256);
    let addr = e.addr;
    let held = hold(
        Poller::start(move || scrape_plain(addr)),
        "600 connections under a 256 open-file limit",
        || open(addr, 600, b""),
    );
    assert!(held.len() > 256, "only {} connected", held.len());
    e.wait_metrics(
        Duration::from_secs(10),
        "reclaimed connections counted",
        |m| closed(m, "reclaimed") > 0.0,
    );
}

#[test]
fn out_of_file_descriptors_a_connection_is_closed_to_accept_a_new_one() {
    raise_own_open_file_limit();
    // Below what the smallest connection cap and the exporter's own files need together, so
    // accepting fails for lack of a descriptor.
    let e = start_with_open_file_limit(20);
    let addr = e.addr;
    hold(
        Poller::start(move || scrape_plain(addr)),
        "100 connections under a 20 open-file limit",
        || open(addr, 100, b""),
    );
    let logs = e.logs();
    let warnings = logs.matches("cannot accept a connection").count();
    // One line per interval, however many accepts failed.
    assert!(
        (1..=2).contains(&warnings),
        "{warnings} accept warnings:\n{logs}"
    );
}

#[test]
fn unfinished_large_request_heads_stay_within_the_memory_limit() {
    raise_own_open_file_limit();
    let e = started(Exporter::start(&[], &[]));
    let addr = e.addr;
    let mut head = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Padding: ".to_vec();
    head.resize(395_000, b'a');
    let peak = Arc::new(AtomicUsize::new(0));
    let pid = e.child.id();
    let attack = {
        let peak = peak.clone();
        move || {
            // Measured after each connection, while the heads are being sent.
            let conns: Vec<TcpStream> = (0..510)
                .filter_map(|_| {
                    let s = open(addr, 1, &head).pop();
                    let rss = common::memory_of(pid, "VmRSS");
                    peak.fetch_max(rss as usize, Ordering::Relaxed);
                    s
                })
                .collect();
            conns
        }
    };
    let _held = hold(
        Poller::start(move || scrape_plain(addr)),
        "510 unfinished 395 KB request heads",
        attack,
    );
    let peak = (peak.load(Ordering::Relaxed) as u64).max(common::memory_of(pid, "VmRSS"));
    assert!(
        peak < MEMORY_LIMIT_BYTES,
        "resident memory reached {} MiB",
        peak >> 20
    );
}

#[test]
fn a_kept_alive_connection_serves_its_request_limit_then_closes() {
    let e = started(Exporter::start(&[], &[]));
    let limit = nvml_exporter::http::server::MAX_REQUESTS_PER_CONNECTION as usize;
    let mut s = TcpStream::connect(e.addr).unwrap();
    // As many requests as allowed, all in one write.
    let requests = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(limit);
    s.write_all(&requests).unwrap();
    s.set_read_timeout(Some(SCRAPE_TIMEOUT)).unwrap();
    let mut replies = Vec::new();
    s.read_to_end(&mut replies)
        .expect("the server closes the connection after the last allowed request");
    let replies = String::from_utf8_lossy(&replies);
    assert_eq!(replies.matches("HTTP/1.1 200 OK\r\n").count(), limit);
    let last = replies.rsplit("HTTP/1.1 ").next().unwrap();
    assert!(last.contains("connection: close\r\n"), "{last}");
    e.wait_metrics(Duration::from_secs(10), "the close counted", |m| {
        closed(m, "request_limit") == 1.0
    });
}

#[test]
fn a_request_head_over_16_kib_is_refused_with_431() {
    let e = started(Exporter::start(&[], &[]));
    let max = nvml_exporter::http::server::MAX_HEAD_BYTES;
    let mut s = TcpStream::connect(e.addr).unwrap();
    let padding = "a".repeat(max);
    let head = format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Padding: {padding}\r\n\r\n");
    // The server may stop reading (and close) before the whole head is sent.
    let _ = s.write_all(head.as_bytes());
    s.set_read_timeout(Some(SCRAPE_TIMEOUT)).unwrap();
    let mut reply = [0u8; 12];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"HTTP/1.1 431");
    // A head just under the limit is served.
    let padding = "a".repeat(max - 1024);
    let r = common::http_get(&e.url("/healthz"), &[("X-Padding", &padding)]);
    assert_eq!(r.status, 200);
}
