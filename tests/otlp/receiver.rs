//! An OTLP metrics receiver built on the official definitions: the `opentelemetry-proto` crate's
//! generated gRPC service (`MetricsServiceServer`, tonic) and its messages for OTLP/HTTP with
//! protobuf bodies (hyper), optionally over TLS or mTLS with a certificate of a test CA. The test
//! sets how it answers (accept, refuse with UNAVAILABLE or 503, stall, partial success, demand a
//! header) while the exporter pushes to it, and reads back every request, decoded.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use flate2::read::GzDecoder;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use prost::Message;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::codec::CompressionEncoding;

use crate::common::certs::Ca;

/// The transport the receiver speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    Http,
}

impl Protocol {
    /// The exporter's name of it.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::Http => "http/protobuf",
        }
    }
}

/// How the receiver answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// Takes every request.
    Accept,
    /// gRPC UNAVAILABLE; HTTP 503 with `Retry-After: 1`.
    Unavailable,
    /// Answers after this long.
    Slow(Duration),
    /// Takes the request but rejects this many points, with a message.
    Partial(i64),
}

/// TLS of the receiver: its CA (which signs its certificate), and whether it demands a client
/// certificate signed by the same CA.
pub struct ReceiverTls {
    pub ca: Ca,
    pub client_auth: bool,
}

/// One request the receiver took, decoded.
#[derive(Debug, Clone)]
pub struct Received {
    pub request: ExportMetricsServiceRequest,
    /// The request's headers (gRPC metadata), names lowercase.
    pub headers: Vec<(String, String)>,
    /// HTTP only: the path POSTed to and the Content-Encoding.
    pub path: String,
    pub content_encoding: Option<String>,
}

#[derive(Default)]
struct State {
    mode: Option<Mode>,
    /// A header every request must carry, else 401 / UNAUTHENTICATED.
    required: Option<(String, String)>,
    /// Every request answered with success or partial success.
    received: Vec<Received>,
    /// Requests refused (by the mode or for the header).
    refused: usize,
}

impl State {
    /// What to do with a request carrying `headers`: `Err` refuses it.
    fn judge(&mut self, headers: &[(String, String)]) -> Result<Mode, Refusal> {
        if let Some((name, value)) = &self.required
            && !headers.iter().any(|(n, v)| n == name && v == value)
        {
            self.refused += 1;
            return Err(Refusal::Unauthenticated);
        }
        let mode = self.mode.clone().unwrap_or(Mode::Accept);
        if mode == Mode::Unavailable {
            self.refused += 1;
            return Err(Refusal::Unavailable);
        }
        Ok(mode)
    }
}

enum Refusal {
    Unavailable,
    Unauthenticated,
}

/// A running receiver on 127.0.0.1. Stops on drop (as a receiver that goes away).
pub struct Receiver {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Receiver {
    /// A receiver of `protocol` on an OS-chosen port.
    pub fn start(protocol: Protocol, tls: Option<&ReceiverTls>) -> Receiver {
        Receiver::start_on(0, protocol, tls)
    }

    /// A port nothing listens on now (taken from the OS and let go), for a receiver that starts
    /// later.
    pub fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// A receiver of `protocol` on `port`.
    pub fn start_on(port: u16, protocol: Protocol, tls: Option<&ReceiverTls>) -> Receiver {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let acceptor = tls.map(|tls| tls_acceptor(tls, protocol));
        // Every connection, after its TLS handshake when there is one, as a stream of streams.
        let (connections, incoming) = tokio::sync::mpsc::channel::<std::io::Result<Conn>>(16);
        runtime.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, connections) = (acceptor.clone(), connections.clone());
                tokio::spawn(async move {
                    let conn = match acceptor {
                        Some(acceptor) => match acceptor.accept(tcp).await {
                            Ok(tls) => Conn::Tls(Box::new(tls)),
                            // A client that fails the handshake gets nothing more.
                            Err(_) => return,
                        },
                        None => Conn::Plain(tcp),
                    };
                    let _ = connections.send(Ok(conn)).await;
                });
            }
        });
        let mut incoming = tokio_stream::wrappers::ReceiverStream::new(incoming);
        match protocol {
            Protocol::Grpc => {
                let service = MetricsServiceServer::new(GrpcReceiver(Arc::clone(&state)))
                    .accept_compressed(CompressionEncoding::Gzip);
                runtime.spawn(
                    tonic::transport::Server::builder()
                        .add_service(service)
                        .serve_with_incoming(incoming),
                );
            }
            Protocol::Http => {
                let state = Arc::clone(&state);
                runtime.spawn(async move {
                    use tokio_stream::StreamExt;
                    while let Some(Ok(conn)) = incoming.next().await {
                        let state = Arc::clone(&state);
                        tokio::spawn(async move {
                            let service = hyper::service::service_fn(move |req| {
                                let state = Arc::clone(&state);
                                async move { Ok::<_, Infallible>(http_export(&state, req).await) }
                            });
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(conn), service)
                                .await;
                        });
                    }
                });
            }
        }
        Receiver {
            addr,
            state,
            runtime: Some(runtime),
        }
    }

    /// Answers from now on as `mode` says.
    pub fn set_mode(&self, mode: Mode) {
        self.state.lock().unwrap().mode = Some(mode);
    }

    /// Refuses every request without header `name: value` from now on (`None`: none needed).
    pub fn require(&self, header: Option<(&str, &str)>) {
        self.state.lock().unwrap().required =
            header.map(|(n, v)| (n.to_ascii_lowercase(), v.to_owned()));
    }

    /// Every request taken so far.
    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    /// How many requests were taken so far.
    pub fn count(&self) -> usize {
        self.state.lock().unwrap().received.len()
    }

    /// How many requests were refused so far.
    pub fn refused(&self) -> usize {
        self.state.lock().unwrap().refused
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The rustls acceptor of `tls`: the CA's server certificate, and with `client_auth` a client
/// certificate signed by the CA required.
fn tls_acceptor(tls: &ReceiverTls, protocol: Protocol) -> tokio_rustls::TlsAcceptor {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = tls.ca.server();
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(server.cert.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
    let key = PrivateKeyDer::from_pem_slice(server.key.as_bytes()).unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = if tls.client_auth {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(tls.ca.pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder.with_single_cert(certs, key).unwrap();
    if protocol == Protocol::Grpc {
        config.alpn_protocols = vec![b"h2".to_vec()];
    }
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// The gRPC service.
struct GrpcReceiver(Arc<Mutex<State>>);

#[tonic::async_trait]
impl MetricsService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let headers: Vec<(String, String)> = request
            .metadata()
            .clone()
            .into_headers()
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    v.to_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        let judged = self.0.lock().unwrap().judge(&headers);
        let mode = match judged {
            Ok(mode) => mode,
            Err(Refusal::Unavailable) => return Err(tonic::Status::unavailable("shedding load")),
            Err(Refusal::Unauthenticated) => {
                return Err(tonic::Status::unauthenticated("missing or wrong x-token"));
            }
        };
        if let Mode::Slow(delay) = mode {
            tokio::time::sleep(delay).await;
        }
        let response = answer(&mode);
        self.0.lock().unwrap().received.push(Received {
            request: request.into_inner(),
            headers,
            path: String::new(),
            content_encoding: None,
        });
        Ok(tonic::Response::new(response))
    }
}

/// The answer to a request taken in `mode`.
fn answer(mode: &Mode) -> ExportMetricsServiceResponse {
    match mode {
        Mode::Partial(rejected) => ExportMetricsServiceResponse {
            partial_success: Some(ExportMetricsPartialSuccess {
                rejected_data_points: *rejected,
                error_message: format!("{rejected} points are too old"),
            }),
        },
        _ => ExportMetricsServiceResponse::default(),
    }
}

/// OTLP/HTTP: `POST /v1/metrics` with a protobuf body, gzip-compressed or not.
async fn http_export(
    state: &Mutex<State>,
    req: http::Request<hyper::body::Incoming>,
) -> http::Response<axum::body::Body> {
    let reply = |status: u16, extra: Option<(&str, &str)>, body: Vec<u8>| {
        let mut builder = http::Response::builder()
            .status(status)
            .header("content-type", "application/x-protobuf");
        if let Some((name, value)) = extra {
            builder = builder.header(name, value);
        }
        builder.body(axum::body::Body::from(body)).unwrap()
    };
    let path = req.uri().path().to_owned();
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                v.to_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let content_encoding = req
        .headers()
        .get("content-encoding")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = axum::body::to_bytes(axum::body::Body::new(req.into_body()), usize::MAX)
        .await
        .unwrap_or_default();
    if !path.ends_with("/v1/metrics") {
        return reply(404, None, Vec::new());
    }
    let judged = state.lock().unwrap().judge(&headers);
    let mode = match judged {
        Ok(mode) => mode,
        Err(Refusal::Unavailable) => return reply(503, Some(("retry-after", "1")), Vec::new()),
        Err(Refusal::Unauthenticated) => {
            return http::Response::builder()
                .status(401)
                .body(axum::body::Body::from("missing or wrong x-token"))
                .unwrap();
        }
    };
    let raw = match content_encoding.as_deref() {
        Some("gzip") => {
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut GzDecoder::new(&body[..]), &mut out).unwrap();
            Bytes::from(out)
        }
        _ => body,
    };
    let Ok(request) = ExportMetricsServiceRequest::decode(raw) else {
        return reply(400, None, Vec::new());
    };
    if let Mode::Slow(delay) = mode {
        tokio::time::sleep(delay).await;
    }
    let response = answer(&mode);
    state.lock().unwrap().received.push(Received {
        request,
        headers,
        path,
        content_encoding,
    });
    reply(200, None, response.encode_to_vec())
}

/// A connection, plain or TLS, as tonic's server and hyper take it.
enum Conn {
    Plain(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>),
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
