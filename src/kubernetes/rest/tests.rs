use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

const REASONS: Reasons = Reasons {
    unavailable: KubeletError::PodsUnavailable,
    timeout: KubeletError::PodsTimeout,
    tls: KubeletError::PodsTls,
    auth: KubeletError::PodsAuth,
    conflict: KubeletError::NodeConditionConflict,
    http: KubeletError::PodsHttp,
    too_large: KubeletError::PodsTooLarge,
};

const GRANT: Grant = Grant {
    rules: "get on things",
    manifest: "deploy/kubernetes/things",
};

fn client_of(base: &str, token_file: PathBuf) -> RestClient {
    RestClient::new(
        Peer::ApiServer,
        &base.parse().unwrap(),
        None,
        token_file,
        Duration::from_secs(10),
        REASONS,
        GRANT,
    )
}

/// A TLS server on 127.0.0.1 that reads one request, writes `answer` (then, with `endless`, a
/// body that never ends) and closes; a client that trusts any certificate, with its token file.
/// The request it read comes back on the channel.
async fn server_answering(
    answer: &'static [u8],
    endless: bool,
) -> (
    RestClient,
    tempfile::TempDir,
    tokio::sync::oneshot::Receiver<String>,
) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert.der().clone()], key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (seen_tx, seen) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut tls = acceptor.accept(tcp).await.unwrap();
        let mut request = vec![0; 4096];
        let n = tls.read(&mut request).await.unwrap_or(0);
        let _ = seen_tx.send(String::from_utf8_lossy(&request[..n]).into_owned());
        let _ = tls.write_all(answer).await;
        if endless {
            let chunk = vec![b'x'; 64 * 1024];
            while tls.write_all(&chunk).await.is_ok() {}
        }
        let _ = tls.shutdown().await;
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "t\n").unwrap();
    let mut client = client_of(&format!("https://{address}"), dir.path().join("token"));
    client.peer = Peer::Kubelet;
    (client, dir, seen)
}

#[tokio::test]
async fn a_peer_that_drops_the_connection_is_unavailable_and_says_how() {
    let (mut client, _dir, _) = server_answering(b"", false).await;
    let url = client.url(&["pods"], &[]).unwrap();
    let e = client.get(&url, 1024).await.unwrap_err();
    assert_eq!(e.reason, KubeletError::PodsUnavailable);
    assert_eq!(
        e.message,
        format!("GET {url}: connection closed before message completed")
    );

    let (mut client, _dir, _) =
        server_answering(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}", false).await;
    let url = client.url(&["pods"], &[]).unwrap();
    let e = client.get(&url, 1024).await.unwrap_err();
    assert_eq!(e.reason, KubeletError::PodsUnavailable);
    assert!(
        e.message.starts_with(&format!(
            "GET {url}: error reading a body from connection: "
        )),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn an_endless_error_answer_is_read_only_as_far_as_its_message() {
    // No length, a body that never ends: only the first ERROR_BODY_BYTES are read, and the call
    // ends with the status's reason, not at the deadline.
    let (mut client, _dir, _) = server_answering(
        b"HTTP/1.1 500 Internal Server Error\r\nConnection: close\r\n\r\nthe etcd is gone ",
        true,
    )
    .await;
    let url = client.url(&["pods"], &[]).unwrap();
    let started = std::time::Instant::now();
    let e = client.get(&url, 1024 * 1024).await.unwrap_err();
    assert_eq!(e.reason, KubeletError::PodsHttp);
    assert!(
        e.message
            .contains("500 Internal Server Error (the etcd is gone xxxx"),
        "{}",
        e.message
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn a_success_larger_than_the_cap_is_cut_under_its_own_reason() {
    // Declared too long: refused before a byte of the body is read.
    let (mut client, _dir, _) =
        server_answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n{}", false).await;
    let url = client.url(&["pods"], &[]).unwrap();
    let e = client.get(&url, 1024).await.unwrap_err();
    assert_eq!(e.reason, KubeletError::PodsTooLarge);
    assert_eq!(
        e.message,
        format!("GET {url}: the answer is larger than 1 KiB")
    );
    // Not declared, growing past the cap.
    let (mut client, _dir, _) =
        server_answering(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", true).await;
    let url = client.url(&["pods"], &[]).unwrap();
    let e = client.get(&url, 1024).await.unwrap_err();
    assert_eq!(e.reason, KubeletError::PodsTooLarge);
}

#[tokio::test]
async fn names_stay_inside_their_path_segment() {
    let (mut client, _dir, seen) =
        server_answering(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", false).await;
    let url = client
        .url(
            &[
                "api",
                "v1",
                "nodes",
                "a/../../x?dryRun=All&y=#frag",
                "status",
            ],
            &[],
        )
        .unwrap();
    client
        .send(Method::PATCH, &url, "application/json", b"{}".to_vec())
        .await
        .unwrap();
    let request = seen.await.unwrap();
    assert!(
        request.starts_with(
            "PATCH /api/v1/nodes/a%2F..%2F..%2Fx%3FdryRun=All&y=%23frag/status HTTP/1.1\r\n"
        ),
        "{request}"
    );
    assert!(
        request.contains("\r\nauthorization: Bearer t\r\n"),
        "{request}"
    );
}

#[test]
fn urls_are_built_from_segments_under_the_base() {
    let u = |base: &str, segments: &[&str], query: &[(&str, &str)]| {
        client_of(base, PathBuf::new())
            .url(segments, query)
            .map(|u| u.to_string())
            .map_err(|e| e.message)
    };
    assert_eq!(
        u("https://10.0.0.1:10250", &["pods"], &[]).unwrap(),
        "https://10.0.0.1:10250/pods"
    );
    assert_eq!(
        u("https://10.0.0.1:10250/", &["pods"], &[]).unwrap(),
        "https://10.0.0.1:10250/pods"
    );
    assert_eq!(
        u("https://api/api/v1/nodes/n1/proxy/", &["pods"], &[]).unwrap(),
        "https://api/api/v1/nodes/n1/proxy/pods"
    );
    assert_eq!(
        u(
            "https://api:6443",
            &["apis", "resource.k8s.io", "v1", "resourceslices"],
            &[(
                "fieldSelector",
                "spec.nodeName=n1,spec.driver=gpu.nvidia.com"
            )]
        )
        .unwrap(),
        "https://api:6443/apis/resource.k8s.io/v1/resourceslices\
         ?fieldSelector=spec.nodeName%3Dn1%2Cspec.driver%3Dgpu.nvidia.com"
    );
    for bad in ["", ".", ".."] {
        let e = u("https://api", &["api", "v1", "nodes", bad, "status"], &[]).unwrap_err();
        assert!(e.contains("not a name"), "{e}");
    }
}

#[tokio::test]
async fn a_refused_token_names_the_grant_once() {
    let (mut client, _dir, _) = server_answering(
        b"HTTP/1.1 403 Forbidden\r\nContent-Length: 9\r\n\r\nforbidden",
        false,
    )
    .await;
    client.peer = Peer::ApiServer;
    let url = client.url(&["x"], &[]).unwrap();
    let e = client.get(&url, 1024).await.unwrap_err();
    assert_eq!(e.reason, KubeletError::PodsAuth);
    assert_eq!(
        e.message,
        format!(
            "GET {url}: the API server answered 403 Forbidden (forbidden); the exporter's service \
             account needs a ClusterRole granting get on things, bound to it: see \
             deploy/kubernetes/things"
        )
    );
}
