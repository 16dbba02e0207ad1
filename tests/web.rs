//! The hardened HTTP server and `--web-config`, on the real binary: slowloris clients cannot
//! delay a scrape and are closed after the header timeout; TLS, mTLS and basic auth work with a
//! real client (ureq over rustls) and certificates generated for each test; certificates rotate
//! without a restart, and so do the files a changed web-config names, but a reload never turns
//! TLS off; bad web-config files exit 2 naming the file; a flood of wrong passwords is answered
//! at once and neither delays a scraper from another address nor stalls shutdown.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::certs::{Ca, Leaf};
use common::{Exporter, exporter_command, http_get, poll_until, write_atomic};
use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};

/// The exporter's header-read timeout (`http::server::HEADER_READ_TIMEOUT`).
const HEADER_TIMEOUT: Duration = nvml_exporter::http::server::HEADER_READ_TIMEOUT;

// ---------------------------------------------------------------------------------------------
// Certificate files

// ---------------------------------------------------------------------------------------------
// Clients

fn agent(ca: Option<&Ca>, client: Option<&Leaf>) -> ureq::Agent {
    let roots = match ca {
        Some(ca) => RootCerts::new_with_certs(&[Certificate::from_pem(ca.pem.as_bytes()).unwrap()]),
        None => RootCerts::new_with_certs(&[]),
    };
    let client_cert = client.map(|leaf| {
        ClientCert::new_with_certs(
            &[Certificate::from_pem(leaf.cert.as_bytes()).unwrap()],
            PrivateKey::from_pem(leaf.key.as_bytes()).unwrap(),
        )
    });
    let tls = TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .root_certs(roots)
        .client_cert(client_cert)
        .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// GET over HTTPS: the status, or the error text when the connection or handshake failed.
fn https_get(agent: &ureq::Agent, e: &Exporter, path: &str) -> Result<u16, String> {
    let url = format!("https://{}{path}", e.addr);
    agent
        .get(&url)
        .call()
        .map(|mut r| {
            let _ = r.body_mut().read_to_vec();
            r.status().as_u16()
        })
        .map_err(|err| err.to_string())
}

fn web_config(dir: &Path, yaml: &str) -> PathBuf {
    let path = dir.join("web.yml");
    std::fs::write(&path, yaml).unwrap();
    path
}

fn start_with(web: &Path) -> Exporter {
    Exporter::start(&[], &["--web-config", web.to_str().unwrap()])
}

/// A directory with ca.pem, server.crt, server.key.
fn tls_dir(ca: &Ca) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let server = ca.server();
    write_atomic(dir.path(), "ca.pem", &ca.pem);
    write_atomic(dir.path(), "server.crt", &server.cert);
    write_atomic(dir.path(), "server.key", &server.key);
    dir
}

// ---------------------------------------------------------------------------------------------
// Slow clients

#[test]
fn slowloris_clients_do_not_delay_a_scrape_and_are_closed_after_the_header_timeout() {
    let e = Exporter::start(&[], &[]);
    // The scrape below must find the GPUs: wait for the first tick before the slow clients come.
    e.wait_metrics(Duration::from_secs(20), "8 GPUs", |m| {
        m.value("nvml_exporter_gpus", &[]) == Some(8.0)
    });

    let opened = Instant::now();
    let mut slow: Vec<TcpStream> = (0..300)
        .map(|_| {
            let mut s = TcpStream::connect(e.addr).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: loc").unwrap();
            s
        })
        .collect();

    // A scrape while all 300 hold their connection open completes at once.
    let start = Instant::now();
    let r = e.get("/metrics");
    let took = start.elapsed();
    assert_eq!(r.status, 200);
    assert!(r.text().contains("nvml_exporter_gpus 8"), "{}", r.text());
    assert!(took < Duration::from_secs(2), "scrape took {took:?}");

    // Every slow connection is closed by the server once the header timeout has passed, not
    // before.
    for s in &slow {
        s.set_nonblocking(true).unwrap();
    }
    let mut open: Vec<bool> = vec![true; slow.len()];
    let mut buf = [0u8; 512];
    let deadline = opened + HEADER_TIMEOUT + Duration::from_secs(10);
    poll_until(deadline.saturating_duration_since(Instant::now()), || {
        for (s, o) in slow.iter_mut().zip(open.iter_mut()).filter(|(_, o)| **o) {
            let closed = match s.read(&mut buf) {
                Ok(0) => true,
                // Whatever the server says before closing (if anything) is read and ignored.
                Ok(_) => false,
                Err(err) => err.kind() != std::io::ErrorKind::WouldBlock,
            };
            if closed {
                assert!(
                    opened.elapsed() >= HEADER_TIMEOUT - Duration::from_secs(1),
                    "closed after only {:?}",
                    opened.elapsed()
                );
                *o = false;
            }
        }
        open.iter().all(|o| !o).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "{} of 300 slow connections still open {:?} after opening",
            open.iter().filter(|o| **o).count(),
            opened.elapsed()
        )
    });
    assert_eq!(e.get("/healthz").status, 200, "still serving");
}

#[test]
fn an_idle_keep_alive_connection_is_closed_after_the_header_timeout() {
    let e = Exporter::start(&[], &[]);
    let mut s = TcpStream::connect(e.addr).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    s.set_read_timeout(Some(HEADER_TIMEOUT + Duration::from_secs(10)))
        .unwrap();
    let mut reply = Vec::new();
    let mut buf = [0u8; 1024];
    let answered = Instant::now();
    // The response comes at once; then the server keeps the connection until it is idle too long.
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    let text = String::from_utf8_lossy(&reply);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        closed,
        "still open {:?} after the response",
        answered.elapsed()
    );
    let idle = answered.elapsed();
    assert!(
        idle >= HEADER_TIMEOUT - Duration::from_secs(1),
        "closed after only {idle:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// TLS

#[test]
fn tls_serves_https_to_a_client_trusting_the_ca() {
    let ca = Ca::new("test CA");
    let dir = tls_dir(&ca);
    let web = web_config(
        dir.path(),
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n",
    );
    let e = start_with(&web);
    assert_eq!(https_get(&agent(Some(&ca), None), &e, "/metrics"), Ok(200));
    // A client that does not trust the CA refuses the server.
    let other = Ca::new("other CA");
    assert!(https_get(&agent(Some(&other), None), &e, "/metrics").is_err());
}

#[test]
fn mtls_requires_a_client_certificate_signed_by_the_ca() {
    let ca = Ca::new("test CA");
    let dir = tls_dir(&ca);
    let web = web_config(
        dir.path(),
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  \
         client_ca_file: ca.pem\n  client_auth_type: RequireAndVerifyClientCert\n",
    );
    let e = start_with(&web);
    let good = ca.client();
    assert_eq!(
        https_get(&agent(Some(&ca), Some(&good)), &e, "/metrics"),
        Ok(200)
    );
    let none = https_get(&agent(Some(&ca), None), &e, "/metrics");
    assert!(none.is_err(), "no client certificate: {none:?}");
    let stranger = Ca::new("stranger CA").client();
    let wrong = https_get(&agent(Some(&ca), Some(&stranger)), &e, "/metrics");
    assert!(wrong.is_err(), "certificate from another CA: {wrong:?}");
}

/// An exporter serving TLS with a certificate of `first` from server.crt and server.key in the
/// returned directory, answering.
fn serving_tls_of(first: &Ca) -> (tempfile::TempDir, Exporter) {
    let dir = tls_dir(first);
    let web = web_config(
        dir.path(),
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n",
    );
    let e = start_with(&web);
    assert_eq!(
        https_get(&agent(Some(first), None), &e, "/healthz"),
        Ok(200)
    );
    (dir, e)
}

/// Waits until `e` serves a certificate of `now` (`what` changed), then checks one of `before`
/// is no longer served.
fn wait_until_served_by(e: &Exporter, now: &Ca, before: &Ca, what: &str) {
    let wait = Duration::from_secs(15);
    poll_until(wait, || {
        (https_get(&agent(Some(now), None), e, "/healthz") == Ok(200)).then_some(())
    })
    .unwrap_or_else(|| panic!("{what} not served after {wait:?}\n{}", e.logs()));
    assert!(
        https_get(&agent(Some(before), None), e, "/healthz").is_err(),
        "the old certificate is no longer served"
    );
}

#[test]
fn rotated_certificates_are_served_without_a_restart() {
    let first = Ca::new("first CA");
    let (dir, e) = serving_tls_of(&first);
    let second = Ca::new("second CA");
    let server = second.server();
    write_atomic(dir.path(), "server.key", &server.key);
    write_atomic(dir.path(), "server.crt", &server.cert);
    wait_until_served_by(&e, &second, &first, "the new certificate");
}

#[test]
fn a_web_config_naming_other_certificate_files_is_served_after_it_changes() {
    let first = Ca::new("first CA");
    let (dir, e) = serving_tls_of(&first);
    // New files beside the old ones, and the web-config switched to them (the configuration
    // reload notices the web-config's change; the old files stay as they were).
    let second = Ca::new("second CA");
    let server = second.server();
    write_atomic(dir.path(), "next.key", &server.key);
    write_atomic(dir.path(), "next.crt", &server.cert);
    write_atomic(
        dir.path(),
        "web.yml",
        "tls_server_config:\n  cert_file: next.crt\n  key_file: next.key\n",
    );
    wait_until_served_by(&e, &second, &first, "the new files");
    // The line is written once the new settings are in force, so it may trail the first answer.
    poll_until(Duration::from_secs(15), || {
        e.logs().contains("TLS settings reloaded").then_some(())
    })
    .unwrap_or_else(|| panic!("no reload logged\n{}", e.logs()));
}

#[test]
fn a_reload_never_turns_tls_off() {
    let ca = Ca::new("test CA");
    let (dir, e) = serving_tls_of(&ca);
    let web = dir.path().join("web.yml");
    // Rewritten in place as only comments: valid, but it would serve plain HTTP.
    std::fs::write(&web, "# tls_server_config to come back\n").unwrap();
    let wait = Duration::from_secs(20);
    let line = poll_until(wait, || {
        e.logs()
            .lines()
            .find(|l| l.contains("configuration reload failed"))
            .map(str::to_owned)
    })
    .unwrap_or_else(|| panic!("no refused reload after {wait:?}\n{}", e.logs()));
    assert!(
        line.contains(web.to_str().unwrap()) && line.contains("TLS off"),
        "the log line names the file and what it would drop: {line}"
    );
    let client = agent(Some(&ca), None);
    let mut answer = client
        .get(format!("https://{}/metrics", e.addr))
        .call()
        .expect("HTTPS is still served");
    assert_eq!(answer.status().as_u16(), 200);
    let text = answer.body_mut().read_to_string().unwrap();
    assert!(
        text.lines()
            .any(|l| l == "nvml_exporter_config_last_reload_successful 0"),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------------
// Basic auth

fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

#[test]
fn basic_auth_protects_everything_but_the_probes() {
    let dir = tempfile::tempdir().unwrap();
    // Cost 4 keeps the test fast; real hashes use 10 or more.
    let hash = bcrypt::hash("correct horse", 4).unwrap();
    let web = web_config(
        dir.path(),
        &format!("basic_auth_users:\n  prometheus: '{hash}'\n"),
    );
    let e = start_with(&web);

    let anonymous = http_get(&e.url("/metrics"), &[]);
    assert_eq!(anonymous.status, 401);
    let challenge = anonymous.header("www-authenticate").unwrap_or_default();
    assert!(challenge.starts_with("Basic realm="), "{challenge}");

    for (user, password) in [("prometheus", "wrong"), ("nobody", "correct horse")] {
        let r = http_get(
            &e.url("/metrics"),
            &[("Authorization", &basic(user, password))],
        );
        assert_eq!(r.status, 401, "{user}:{password}");
    }
    // The node page, its JSON and its script ask for credentials as /metrics does.
    for path in ["/", "/api/v1/gpus", "/page.js"] {
        let r = http_get(&e.url(path), &[]);
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(r.header("www-authenticate"), Some(challenge), "{path}");
        assert!(!r.text().contains("GPU-"), "{path}: {}", r.text());
    }

    let auth = basic("prometheus", "correct horse");
    for _ in 0..3 {
        let r = http_get(&e.url("/metrics"), &[("Authorization", &auth)]);
        assert_eq!(r.status, 200);
        assert!(r.text().contains("nvml_exporter_gpus"), "{}", r.text());
    }
    for path in ["/", "/api/v1/gpus", "/page.js"] {
        assert_eq!(
            http_get(&e.url(path), &[("Authorization", &auth)]).status,
            200,
            "{path}"
        );
    }
    // Probes need no credentials.
    assert_eq!(http_get(&e.url("/healthz"), &[]).status, 200);
    assert_ne!(http_get(&e.url("/readyz"), &[]).status, 401);
}

#[test]
fn tls_and_basic_auth_together() {
    let ca = Ca::new("test CA");
    let dir = tls_dir(&ca);
    let hash = bcrypt::hash("pw", 4).unwrap();
    let web = web_config(
        dir.path(),
        &format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  \
             min_version: TLS13\nbasic_auth_users:\n  scraper: '{hash}'\n"
        ),
    );
    let e = start_with(&web);
    let client = agent(Some(&ca), None);
    assert_eq!(https_get(&client, &e, "/metrics"), Ok(401));
    let url = format!("https://{}/metrics", e.addr);
    let r = client
        .get(&url)
        .header("Authorization", &basic("scraper", "pw"))
        .call()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

// ---------------------------------------------------------------------------------------------
// Bad files

/// Runs the exporter with `--web-config path` and returns (status, stderr).
fn refused(path: &Path) -> (Option<i32>, String) {
    let sim = common::sim_lib();
    let out = exporter_command(
        &[],
        &[
            "--listen",
            "127.0.0.1:0",
            "--nvml-lib",
            sim.to_str().unwrap(),
            "--web-config",
            path.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_web_configs_exit_2_naming_the_file() {
    let ca = Ca::new("test CA");
    let dir = tls_dir(&ca);
    let other_key = ca.server().key;
    write_atomic(dir.path(), "other.key", &other_key);
    write_atomic(dir.path(), "garbage.crt", "not a certificate\n");
    let tls = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n";
    let cases: &[(&str, String, &[&str])] = &[
        (
            "unknown key",
            format!("{tls}  cipher_suites: [TLS_AES_128_GCM_SHA256]\n"),
            &["line 4", "cipher_suites"],
        ),
        (
            "bad YAML",
            "tls_server_config:\n  cert_file: [server.crt\n".into(),
            &["line"],
        ),
        (
            "missing certificate",
            "tls_server_config:\n  cert_file: nope.crt\n  key_file: server.key\n".into(),
            &["nope.crt"],
        ),
        (
            "not a certificate",
            "tls_server_config:\n  cert_file: garbage.crt\n  key_file: server.key\n".into(),
            &["garbage.crt"],
        ),
        (
            "key does not match",
            "tls_server_config:\n  cert_file: server.crt\n  key_file: other.key\n".into(),
            &["other.key"],
        ),
        (
            "bad hash",
            "basic_auth_users:\n  alice: plaintext\n".into(),
            &["alice", "bcrypt"],
        ),
        (
            "mTLS without a CA",
            format!("{tls}  client_auth_type: RequireAndVerifyClientCert\n"),
            &["client_ca_file"],
        ),
        (
            "every user commented out",
            "basic_auth_users:\n#  prometheus: $2y$10$abc\n".into(),
            &["basic_auth_users is empty"],
        ),
        (
            "TLS commented out",
            "tls_server_config:\n#  cert_file: server.crt\n#  key_file: server.key\n".into(),
            &["tls_server_config is empty"],
        ),
    ];
    for (what, yaml, expected) in cases {
        let path = web_config(dir.path(), yaml);
        let (status, stderr) = refused(&path);
        assert_eq!(status, Some(2), "{what}: {stderr}");
        assert!(
            stderr.contains(path.to_str().unwrap()),
            "{what}: the file is not named: {stderr}"
        );
        for word in *expected {
            assert!(stderr.contains(word), "{what}: no {word:?} in: {stderr}");
        }
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{what}: one line: {stderr}"
        );
    }
    let (status, stderr) = refused(&dir.path().join("missing.yml"));
    assert_eq!(status, Some(2), "{stderr}");
    assert!(stderr.contains("missing.yml"), "{stderr}");
}

/// A well-formed bcrypt hash of `cost` (of no known password: only the cost matters here).
fn hash_of_cost(cost: u32) -> String {
    format!("$2y${cost:02}$CCCCCCCCCCCCCCCCCCCCC.E5YPO9kmyuRGyh0XouQYb4YMJKvyOeW")
}

#[test]
fn bcrypt_costs_out_of_range_exit_2_naming_the_user_at_check_config_and_start() {
    let dir = tempfile::tempdir().unwrap();
    // 99 is beyond what bcrypt accepts (every login would fail); 31 takes hours per login.
    for cost in [99, 31] {
        let web = web_config(
            dir.path(),
            &format!(
                "basic_auth_users:\n  prometheus: '{}'\n  alice: '{}'\n",
                hash_of_cost(10),
                hash_of_cost(cost)
            ),
        );
        let check = exporter_command(
            &[],
            &["check-config", "--web-config", web.to_str().unwrap()],
        )
        .output()
        .unwrap();
        let (status, stderr) = refused(&web);
        for (what, code, text) in [
            (
                "check-config",
                check.status.code(),
                String::from_utf8_lossy(&check.stderr),
            ),
            ("start", status, stderr.into()),
        ] {
            assert_eq!(code, Some(2), "{what} cost {cost}: {text}");
            assert!(
                text.contains("basic_auth_users.alice: bcrypt cost")
                    && text.contains(&format!("cost {cost} "))
                    && text.contains(web.to_str().unwrap()),
                "{what} cost {cost}: {text}"
            );
            assert_eq!(text.trim().lines().count(), 1, "{what}: one line: {text}");
        }
    }
}

#[test]
fn a_web_config_that_enables_nothing_is_logged_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let web = web_config(
        dir.path(),
        "# tls_server_config and basic_auth_users to come\n",
    );
    let e = start_with(&web);
    assert_eq!(e.get("/metrics").status, 200);
    let logs = e.logs();
    assert!(
        logs.contains("WARN")
            && logs.contains("enables neither TLS nor basic auth")
            && logs.contains(web.to_str().unwrap()),
        "{logs}"
    );
}

/// What flooding clients were answered, by status.
#[derive(Default)]
struct FloodCounts {
    unauthorized: AtomicUsize,
    too_many: AtomicUsize,
    unavailable: AtomicUsize,
    other: AtomicUsize,
}

/// `clients` connections from the loopback addresses `from` that send `GET /metrics` with
/// `authorization` one after another on kept-alive connections (reconnecting when closed), as
/// fast as they are answered, until `stop`.
fn flood(
    target: SocketAddr,
    from: &[IpAddr],
    clients: usize,
    authorization: String,
    stop: Arc<AtomicBool>,
    counts: Arc<FloodCounts>,
) -> std::thread::JoinHandle<()> {
    let from = from.to_vec();
    let request = Arc::new(
        format!(
            "GET /metrics HTTP/1.1\r\nHost: {target}\r\nAuthorization: {authorization}\r\n\r\n"
        )
        .into_bytes(),
    );
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..clients {
                let from = SocketAddr::new(from[i % from.len()], 0);
                let (request, stop, counts) = (request.clone(), stop.clone(), counts.clone());
                tasks.spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        if flood_connection(target, from, &request, &stop, &counts)
                            .await
                            .is_err()
                        {
                            // Refused (the exporter stopped): try again a little later.
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                });
            }
            while tasks.join_next().await.is_some() {}
        });
    })
}

/// One flooding connection, until it closes or `stop`.
async fn flood_connection(
    target: SocketAddr,
    from: SocketAddr,
    request: &[u8],
    stop: &AtomicBool,
    counts: &FloodCounts,
) -> std::io::Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(from)?;
    let mut stream = tokio::io::BufReader::new(socket.connect(target).await?);
    while !stop.load(Ordering::Relaxed) {
        stream.get_mut().write_all(request).await?;
        let mut line = String::new();
        stream.read_line(&mut line).await?;
        let status: u16 = match line.split_whitespace().nth(1).and_then(|s| s.parse().ok()) {
            Some(status) => status,
            None => return Ok(()), // closed
        };
        let mut length = 0;
        loop {
            line.clear();
            stream.read_line(&mut line).await?;
            if line.trim().is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await?;
        let counter = match status {
            401 => &counts.unauthorized,
            429 => &counts.too_many,
            503 => &counts.unavailable,
            _ => &counts.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

#[test]
fn a_password_flood_from_one_address_does_not_delay_an_uncached_scraper_from_another() {
    // Cost 10, as htpasswd -nBC 10 gives a real user; one user per scrape, so that every scrape
    // is checked with bcrypt (none is remembered).
    const SCRAPES: usize = 6;
    let dir = tempfile::tempdir().unwrap();
    let mut yaml = String::from("basic_auth_users:\n");
    for i in 0..SCRAPES {
        yaml += &format!(
            "  scraper{i}: '{}'\n",
            bcrypt::hash(format!("pw{i}"), 10).unwrap()
        );
    }
    let e = start_with(&web_config(dir.path(), &yaml));

    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(FloodCounts::default());
    let attack = flood(
        e.addr,
        &[IpAddr::from([127, 0, 0, 2])],
        300,
        basic("scraper0", "wrong"),
        stop.clone(),
        counts.clone(),
    );
    poll_until(Duration::from_secs(10), || {
        (counts.unauthorized.load(Ordering::Relaxed) > 0).then_some(())
    })
    .expect("the flood's passwords are checked");

    // Prometheus on a fresh connection every 0.5 s (as it reconnects after the server closes an
    // idle one), each scrape within its default 10 s timeout.
    let mut worst = Duration::ZERO;
    for i in 0..SCRAPES {
        let started = Instant::now();
        let r = http_get(
            &e.url("/metrics"),
            &[(
                "Authorization",
                &basic(&format!("scraper{i}"), &format!("pw{i}")),
            )],
        );
        let took = started.elapsed();
        assert_eq!(r.status, 200, "scrape {i}: {}", r.text());
        assert!(took < Duration::from_secs(10), "scrape {i} took {took:?}");
        worst = worst.max(took);
        std::thread::sleep(Duration::from_millis(500).saturating_sub(took));
    }
    stop.store(true, Ordering::Relaxed);
    attack.join().unwrap();
    let (unauthorized, too_many) = (
        counts.unauthorized.load(Ordering::Relaxed),
        counts.too_many.load(Ordering::Relaxed),
    );
    eprintln!("worst scrape {worst:?}; flood answered 401 x{unauthorized}, 429 x{too_many}");
    assert!(
        too_many > unauthorized,
        "the flood is answered at once, not queued"
    );
    assert_eq!(counts.other.load(Ordering::Relaxed), 0);
}

#[test]
fn sigterm_while_checks_run_exits_within_the_grace() {
    // Cost 12, four times a cost-10 check, with the check queue full from two addresses.
    let dir = tempfile::tempdir().unwrap();
    let web = web_config(
        dir.path(),
        &format!("basic_auth_users:\n  prometheus: '{}'\n", hash_of_cost(12)),
    );
    let mut e = start_with(&web);
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(FloodCounts::default());
    let attack = flood(
        e.addr,
        &[IpAddr::from([127, 0, 0, 2]), IpAddr::from([127, 0, 0, 3])],
        20,
        basic("prometheus", "wrong"),
        stop.clone(),
        counts.clone(),
    );
    // A cost-12 check in the debug build takes seconds, more on a loaded machine: the deadline
    // is for a check that never ends, not for a slow one.
    poll_until(Duration::from_secs(60), || {
        (counts.unauthorized.load(Ordering::Relaxed) > 0).then_some(())
    })
    .expect("the flood's passwords are checked");
    let grace = nvml_exporter::SHUTDOWN_GRACE;
    let status = e.terminate(grace);
    stop.store(true, Ordering::Relaxed);
    attack.join().unwrap();
    let status = status.unwrap_or_else(|| panic!("still running {grace:?} after SIGTERM"));
    assert!(status.success(), "{status:?}: {}", e.logs());
}
