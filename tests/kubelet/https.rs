//! A fake kubelet HTTPS API: `GET /pods` over TLS (hyper + rustls, a certificate signed by a CA
//! made for each test with `common::certs`), checking the bearer token like a kubelet with
//! webhook authentication. The test changes the answer, the accepted token and how long an
//! answer takes while a client runs against it, and reads back the `Authorization` headers it
//! was sent.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Bytes, Frame};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::common::certs::Ca;

/// What `/pods` answers with.
#[derive(Debug, Clone)]
pub enum Reply {
    /// 200 with this body, streamed (chunked, no Content-Length).
    Body(Vec<u8>),
    /// 200 declaring this Content-Length, then a few bytes and nothing more (the connection stays
    /// open, as a server still sending would keep it).
    DeclaredLength(u64),
    /// This status and text body (what a kubelet sends with 403: "Forbidden (user=…)").
    Status(u16, String),
}

struct State {
    reply: Reply,
    /// The token accepted; any other answers 401 "Unauthorized", as a kubelet does.
    token: String,
    delay: Duration,
    /// Close each connection after one answer instead of keeping it alive.
    close_after_answer: bool,
    /// The `Authorization` header of each request, in order ("" when absent).
    authorizations: Vec<String>,
    /// The path answered; any other is 404.
    path: String,
    /// The path and query of each request, in order.
    requests: Vec<String>,
}

/// A running fake kubelet HTTPS API on 127.0.0.1. Stops on drop.
pub struct FakeKubeletApi {
    server: TlsServer,
    state: Arc<Mutex<State>>,
}

/// An HTTP/1.1 server over TLS on 127.0.0.1, with a serving certificate signed by a CA made for
/// it. Stops on drop.
pub struct TlsServer {
    pub addr: SocketAddr,
    pub ca: Ca,
    runtime: Option<tokio::runtime::Runtime>,
}

impl TlsServer {
    /// Answers each request with `answer`; `keep_alive` says, per connection, whether it stays
    /// open after an answer.
    pub fn start<F, Fut, B>(
        ca_name: &str,
        keep_alive: impl Fn() -> bool + Send + Sync + 'static,
        answer: F,
    ) -> TlsServer
    where
        F: Fn(http::Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
        Fut: std::future::Future<Output = http::Response<B>> + Send + 'static,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let ca = Ca::new(ca_name);
        let server = ca.server();
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(server.cert.as_bytes())
                .collect::<Result<_, _>>()
                .unwrap();
        let key = PrivateKeyDer::from_pem_slice(server.key.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let keep_alive = Arc::new(keep_alive);
        runtime.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, answer, keep_alive) =
                    (acceptor.clone(), answer.clone(), keep_alive.clone());
                tokio::spawn(async move {
                    // A client that rejects our certificate ends the handshake: nothing to serve.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        let answer = answer.clone();
                        async move { Ok::<_, Infallible>(answer(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(keep_alive())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        TlsServer {
            addr,
            ca,
            runtime: Some(runtime),
        }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl FakeKubeletApi {
    /// Serves `reply` on `/pods` to requests carrying `Bearer <token>`.
    pub fn start(token: &str, reply: Reply) -> FakeKubeletApi {
        FakeKubeletApi::start_at("/pods", token, reply)
    }

    /// Serves `reply` on `path` to requests carrying `Bearer <token>`: with the ResourceSlice
    /// list's path, a fake API server.
    pub fn start_at(path: &str, token: &str, reply: Reply) -> FakeKubeletApi {
        let state = Arc::new(Mutex::new(State {
            reply,
            token: token.to_owned(),
            delay: Duration::ZERO,
            close_after_answer: false,
            authorizations: Vec::new(),
            path: path.to_owned(),
            requests: Vec::new(),
        }));
        let (s, keep) = (state.clone(), state.clone());
        let server = TlsServer::start(
            "fake kubelet CA",
            move || !keep.lock().unwrap().close_after_answer,
            move |req| answer(req, s.clone()),
        );
        FakeKubeletApi { server, state }
    }

    /// `https://127.0.0.1:<port>`, what `--kubelet-url` is given.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The CA that signed the serving certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.server.ca.pem
    }

    pub fn set_reply(&self, reply: Reply) {
        self.state.lock().unwrap().reply = reply;
    }

    pub fn set_token(&self, token: &str) {
        self.state.lock().unwrap().token = token.to_owned();
    }

    /// Makes later requests wait `delay` before answering.
    pub fn set_delay(&self, delay: Duration) {
        self.state.lock().unwrap().delay = delay;
    }

    /// Makes later connections close after one answer, as a server with a short idle timeout.
    pub fn set_close_after_answer(&self, close: bool) {
        self.state.lock().unwrap().close_after_answer = close;
    }

    /// The path and query of every request received so far.
    pub fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().requests.clone()
    }

    /// The `Authorization` headers received so far.
    pub fn authorizations(&self) -> Vec<String> {
        self.state.lock().unwrap().authorizations.clone()
    }
}

async fn answer(
    req: http::Request<hyper::body::Incoming>,
    state: Arc<Mutex<State>>,
) -> http::Response<Chunks> {
    let authorization = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or("<not text>").to_owned())
        .unwrap_or_default();
    let (reply, token, delay, path) = {
        let mut s = state.lock().unwrap();
        s.authorizations.push(authorization.clone());
        let query = req.uri().path_and_query().map(|p| p.to_string());
        s.requests.push(query.unwrap_or_default());
        (s.reply.clone(), s.token.clone(), s.delay, s.path.clone())
    };
    tokio::time::sleep(delay).await;
    let response = http::Response::builder();
    if req.uri().path() != path {
        return response
            .status(404)
            .body(Chunks::one(b"404 page not found".to_vec()))
            .unwrap();
    }
    if authorization != format!("Bearer {token}") {
        return response
            .status(401)
            .body(Chunks::one(b"Unauthorized".to_vec()))
            .unwrap();
    }
    match reply {
        Reply::Body(body) => response
            .header("content-type", "application/json")
            .body(Chunks::split(body))
            .unwrap(),
        Reply::DeclaredLength(n) => response
            .header("content-length", n)
            .body(Chunks {
                hang: true,
                ..Chunks::one(b"{\"kind\":".to_vec())
            })
            .unwrap(),
        Reply::Status(code, text) => response
            .status(code)
            .body(Chunks::one(text.into_bytes()))
            .unwrap(),
    }
}

/// A body of unknown length, sent chunked like the kubelet's (large) JSON answers.
pub struct Chunks {
    pieces: std::collections::VecDeque<Bytes>,
    /// After the last piece, never end.
    hang: bool,
}

impl Chunks {
    pub fn one(data: Vec<u8>) -> Chunks {
        Chunks {
            pieces: [Bytes::from(data)].into(),
            hang: false,
        }
    }

    /// `bytes` bytes of `x`, in 1 MiB pieces that share one buffer: a huge body that costs the
    /// server 1 MiB.
    pub fn repeated(bytes: usize) -> Chunks {
        let piece = Bytes::from(vec![b'x'; 1024 * 1024]);
        Chunks {
            pieces: (0..bytes)
                .step_by(piece.len())
                .map(|at| piece.slice(..piece.len().min(bytes - at)))
                .collect(),
            hang: false,
        }
    }

    /// In 1 MiB pieces, so a large body is streamed rather than built in one frame.
    fn split(data: Vec<u8>) -> Chunks {
        let data = Bytes::from(data);
        let piece = 1024 * 1024;
        Chunks {
            pieces: (0..data.len())
                .step_by(piece)
                .map(|at| data.slice(at..(at + piece).min(data.len())))
                .collect(),
            hang: false,
        }
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.pieces.pop_front() {
            Some(piece) => Poll::Ready(Some(Ok(Frame::data(piece)))),
            // Dropped with the connection when the client closes it.
            None if self.hang => Poll::Pending,
            None => Poll::Ready(None),
        }
    }
}
