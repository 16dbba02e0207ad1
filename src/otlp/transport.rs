//! One export request to the receiver, over gRPC (tonic, the OTLP service's path) or HTTP/protobuf
//! (reqwest, `POST` to the endpoint's `/v1/metrics`), and what its answer means under OTLP's
//! rules ([`Outcome`]).
//!
//! - The body is the request already encoded (the queue keeps bytes, not messages); with gzip
//!   on, HTTP compresses it on a blocking thread, gRPC through tonic's message compression.
//! - TLS (an `https://` endpoint) is one rustls configuration for both protocols, with the ring
//!   provider as everywhere in the exporter: the peer verified against `--otlp-ca-file`, or the
//!   system's roots; a client certificate for mTLS.
//! - Retried, as OTLP says: gRPC `UNAVAILABLE`, and `RESOURCE_EXHAUSTED` when the receiver says
//!   when to retry (`RetryInfo`); HTTP 429, 502, 503 and 504, after `Retry-After` when given; and
//!   a request that got no answer (no connection, or none within `--otlp-timeout`). Anything
//!   else is a refusal that retrying would not change: the batch is dropped.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes};
use flate2::Compression;
use flate2::write::GzEncoder;
use http::header::{CONTENT_ENCODING, CONTENT_TYPE, RETRY_AFTER, USER_AGENT};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, StatusCode, Uri};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
use prost::Message;
use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};

use super::{OtlpOptions, Protocol, Tls};
use crate::metrics::catalog::VERSION;

/// The OTLP metrics service's method.
const EXPORT_PATH: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";

/// The most read of an answer: a partial success's message, or an error's.
const ANSWER_BYTES: usize = 64 * 1024;

/// The most of a receiver's error text shown in the log.
const MESSAGE_CHARS: usize = 300;

/// What the receiver made of one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Accepted, `rejected` points aside (a partial success, with the receiver's `message`).
    Accepted {
        /// Points the receiver refused.
        rejected: i64,
        /// Why, as the receiver says.
        message: String,
    },
    /// Not delivered, worth sending again.
    Retry {
        /// What happened.
        why: String,
        /// When the receiver asked to be called again (`Retry-After`, `RetryInfo`).
        after: Option<Duration>,
        /// No answer within the timeout.
        timeout: bool,
    },
    /// Refused for good: sending it again would be refused again.
    Rejected {
        /// What the receiver said.
        why: String,
    },
}

/// A client of the receiver.
#[derive(Debug)]
pub struct Client {
    transport: Transport,
    headers: HeaderMap,
    gzip: bool,
    timeout: Duration,
}

#[derive(Debug)]
enum Transport {
    Grpc(tonic::client::Grpc<Channel>),
    Http {
        client: reqwest::Client,
        url: reqwest::Url,
    },
}

impl Client {
    /// A client as `options` say; connects on the first request (a receiver that is down now
    /// is no error).
    pub fn new(options: &OtlpOptions) -> Result<Client, String> {
        let https = options.endpoint.scheme_str() == Some("https");
        let transport = match options.protocol {
            Protocol::Grpc => {
                let endpoint = Endpoint::from(options.endpoint.clone())
                    .connect_timeout(options.timeout)
                    .tcp_nodelay(true)
                    .user_agent(format!("nvml-exporter/{VERSION}"))
                    .map_err(|e| e.to_string())?;
                let channel = if https {
                    let tls = Arc::new(tls_config(&options.tls, &[b"h2"])?);
                    endpoint.connect_with_connector_lazy(tower::service_fn(move |uri: Uri| {
                        connect_tls(Arc::clone(&tls), uri)
                    }))
                } else {
                    endpoint.connect_lazy()
                };
                let mut grpc = tonic::client::Grpc::new(channel);
                if options.gzip {
                    grpc = grpc
                        .send_compressed(CompressionEncoding::Gzip)
                        .accept_compressed(CompressionEncoding::Gzip);
                }
                Transport::Grpc(grpc)
            }
            Protocol::HttpProtobuf => {
                let builder = reqwest::Client::builder()
                    .http1_only()
                    .no_proxy()
                    .redirect(reqwest::redirect::Policy::none())
                    .connect_timeout(options.timeout);
                // Given even for http://: reqwest builds no TLS configuration of its own.
                let tls = if https {
                    tls_config(&options.tls, &[])?
                } else {
                    no_tls()?
                };
                let client = builder
                    .tls_backend_preconfigured(tls)
                    .build()
                    .map_err(|e| causes(&e))?;
                let url = reqwest::Url::parse(&options.endpoint.to_string())
                    .map_err(|e| format!("{}: {e}", options.endpoint))?;
                Transport::Http { client, url }
            }
        };
        Ok(Client {
            transport,
            headers: options.headers.map(),
            gzip: options.gzip,
            timeout: options.timeout,
        })
    }

    /// Sends one encoded request and says what came of it, within the timeout.
    pub async fn send(&mut self, body: Bytes) -> Outcome {
        let timeout = self.timeout;
        let sent = match &mut self.transport {
            Transport::Grpc(grpc) => {
                tokio::time::timeout(timeout, send_grpc(grpc, &self.headers, body)).await
            }
            Transport::Http { client, url } => {
                let request = send_http(client, url, &self.headers, self.gzip, body);
                tokio::time::timeout(timeout, request).await
            }
        };
        sent.unwrap_or_else(|_elapsed| Outcome::Retry {
            why: format!(
                "no answer within {} (--otlp-timeout)",
                humantime::format_duration(timeout)
            ),
            after: None,
            timeout: true,
        })
    }
}

/// A TCP connection to `uri`'s host, then the TLS handshake of `config` with it.
async fn connect_tls(
    config: Arc<ClientConfig>,
    uri: Uri,
) -> Result<
    hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
    std::io::Error,
> {
    let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
    let host = uri
        .host()
        .ok_or_else(|| invalid(format!("{uri} has no host")))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(443);
    let name = ServerName::try_from(host.clone())
        .map_err(|e| invalid(format!("{host:?} is not a TLS server name: {e}")))?;
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
    tcp.set_nodelay(true)?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await?;
    Ok(hyper_util::rt::TokioIo::new(tls))
}

/// The client TLS configuration of `tls`, offering `alpn`.
pub fn tls_config(tls: &Tls, alpn: &[&[u8]]) -> Result<ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &tls.ca {
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(pem, "the CA file")? {
                roots.add(cert).map_err(|e| format!("the CA file: {e}"))?;
            }
            builder.with_root_certificates(roots)
        }
        None => {
            let verifier = rustls_platform_verifier::Verifier::new(provider)
                .map_err(|e| format!("the system's CA certificates: {e}"))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
        }
    };
    let mut config = match &tls.client {
        Some((cert, key)) => {
            let chain = certificates(cert, "the client certificate file")?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| format!("the client key file: {e}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("the client certificate and key: {e}"))?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// A TLS configuration that trusts no one, for a client that never makes a TLS connection.
fn no_tls() -> Result<ClientConfig, String> {
    Ok(
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
    )
}

/// The certificates of a PEM file's bytes, at least one; `option` names the file in errors.
fn certificates(pem: &[u8], option: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{option}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{option}: no PEM certificate in the file"));
    }
    Ok(certs)
}

async fn send_grpc(
    grpc: &mut tonic::client::Grpc<Channel>,
    headers: &HeaderMap,
    body: Bytes,
) -> Outcome {
    if let Err(e) = grpc.ready().await {
        return Outcome::Retry {
            why: format!("cannot connect: {}", causes(&e)),
            after: None,
            timeout: false,
        };
    }
    let mut request = tonic::Request::new(body);
    for (name, value) in headers {
        // The options admit only names and values that are valid metadata.
        if let Ok(value) = tonic::metadata::AsciiMetadataValue::try_from(value.as_bytes()) {
            if let Ok(key) = tonic::metadata::AsciiMetadataKey::from_bytes(name.as_str().as_bytes())
            {
                request.metadata_mut().insert(key, value);
            }
        }
    }
    match grpc
        .unary(
            request,
            PathAndQuery::from_static(EXPORT_PATH),
            EncodedCodec,
        )
        .await
    {
        Ok(response) => accepted(response.into_inner()),
        Err(status) => grpc_refusal(&status),
    }
}

/// What a gRPC status other than OK means.
fn grpc_refusal(status: &tonic::Status) -> Outcome {
    let why = format!("gRPC {:?}: {}", status.code(), shorten(status.message()));
    let after = retry_delay(status.details());
    match status.code() {
        tonic::Code::Unavailable => Outcome::Retry {
            why,
            after,
            timeout: false,
        },
        tonic::Code::DeadlineExceeded => Outcome::Retry {
            why,
            after,
            timeout: true,
        },
        tonic::Code::ResourceExhausted if after.is_some() => Outcome::Retry {
            why,
            after,
            timeout: false,
        },
        _ => Outcome::Rejected { why },
    }
}

async fn send_http(
    client: &reqwest::Client,
    url: &reqwest::Url,
    headers: &HeaderMap,
    gzip: bool,
    body: Bytes,
) -> Outcome {
    let body = if gzip {
        match tokio::task::spawn_blocking(move || compress(&body)).await {
            Ok(body) => body,
            Err(e) => {
                return Outcome::Rejected {
                    why: format!("compressing the request failed: {e}"),
                };
            }
        }
    } else {
        body.to_vec()
    };
    let mut request = client
        .post(url.clone())
        .headers(headers.clone())
        .header(CONTENT_TYPE, "application/x-protobuf")
        .header(USER_AGENT, format!("nvml-exporter/{VERSION}"));
    if gzip {
        request = request.header(CONTENT_ENCODING, "gzip");
    }
    let mut response = match request.body(body).send().await {
        Ok(response) => response,
        Err(e) => {
            return Outcome::Retry {
                why: format!("POST {url}: {}", causes(&e)),
                after: None,
                timeout: e.is_timeout(),
            };
        }
    };
    let status = response.status();
    let after = response.headers().get(RETRY_AFTER).and_then(retry_after);
    let answer = read_bounded(&mut response).await;
    if status.is_success() {
        return accepted(ExportMetricsServiceResponse::decode(&answer[..]).unwrap_or_default());
    }
    let why = format!("HTTP {status}: {}", error_text(&answer));
    match status {
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::BAD_GATEWAY
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => Outcome::Retry {
            why,
            after,
            timeout: false,
        },
        _ => Outcome::Rejected { why },
    }
}

/// A successful answer: complete, or a partial success.
fn accepted(response: ExportMetricsServiceResponse) -> Outcome {
    let partial = response.partial_success.unwrap_or_default();
    Outcome::Accepted {
        rejected: partial.rejected_data_points.max(0),
        message: shorten(&partial.error_message),
    }
}

/// At most [`ANSWER_BYTES`] of an answer's body; what could not be read is left.
async fn read_bounded(response: &mut reqwest::Response) -> Vec<u8> {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        let room = ANSWER_BYTES - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() == ANSWER_BYTES {
            break;
        }
    }
    body
}

/// An error answer's text: the message of the `google.rpc.Status` OTLP/HTTP answers with, or the
/// body as text.
fn error_text(body: &[u8]) -> String {
    match RpcStatus::decode(body) {
        Ok(status) if !status.message.is_empty() => shorten(&status.message),
        _ => shorten(String::from_utf8_lossy(body).trim()),
    }
}

/// `text` cut to [`MESSAGE_CHARS`] characters, on one line.
fn shorten(text: &str) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MESSAGE_CHARS)
        .collect();
    if text.chars().count() > MESSAGE_CHARS {
        format!("{line}…")
    } else {
        line
    }
}

/// `Retry-After`: seconds, or an HTTP date.
fn retry_after(value: &HeaderValue) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(
        at.duration_since(std::time::SystemTime::now())
            .unwrap_or_default(),
    )
}

/// The delay of a `google.rpc.RetryInfo` among a gRPC status's details.
fn retry_delay(details: &[u8]) -> Option<Duration> {
    const RETRY_INFO: &str = "type.googleapis.com/google.rpc.RetryInfo";
    let status = RpcStatus::decode(details).ok()?;
    let info = status.details.iter().find(|d| d.type_url == RETRY_INFO)?;
    let delay = RetryInfo::decode(&info.value[..]).ok()?.retry_delay?;
    let seconds = u64::try_from(delay.seconds).ok()?;
    let nanos = u32::try_from(delay.nanos).ok()?;
    Some(Duration::new(seconds, nanos))
}

/// gzip at the fastest level: a push every interval is a small request, and the CPU matters
/// more than a few more bytes.
fn compress(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = GzEncoder::new(Vec::with_capacity(body.len() / 4), Compression::fast());
    // Writing to a Vec cannot fail.
    let _ = encoder.write_all(body);
    encoder.finish().unwrap_or_default()
}

/// What failed, each cause of `e` once: "POST …: error sending request: connection refused".
fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let s = c.to_string();
        if !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
        cause = c.source();
    }
    text
}

/// `google.rpc.Status`: what an OTLP receiver refuses with (a gRPC status's details, an
/// OTLP/HTTP error body).
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<Any>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
struct Any {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// `google.rpc.RetryInfo`.
#[derive(Clone, PartialEq, prost::Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<ProtoDuration>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, prost::Message)]
struct ProtoDuration {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

/// Sends a request already encoded, and decodes the service's answer.
#[derive(Debug, Clone, Copy)]
struct EncodedCodec;

impl Codec for EncodedCodec {
    type Encode = Bytes;
    type Decode = ExportMetricsServiceResponse;
    type Encoder = EncodedCodec;
    type Decoder = EncodedCodec;

    fn encoder(&mut self) -> Self::Encoder {
        EncodedCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        EncodedCodec
    }
}

impl Encoder for EncodedCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for EncodedCodec {
    type Item = ExportMetricsServiceResponse;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut DecodeBuf<'_>,
    ) -> Result<Option<ExportMetricsServiceResponse>, tonic::Status> {
        ExportMetricsServiceResponse::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(format!("the answer does not decode: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        let header = |s: &str| HeaderValue::from_str(s).unwrap();
        assert_eq!(retry_after(&header("3")), Some(Duration::from_secs(3)));
        let soon = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(60));
        let d = retry_after(&header(&soon)).unwrap();
        assert!(
            d > Duration::from_secs(50) && d <= Duration::from_secs(60),
            "{d:?}"
        );
        assert_eq!(retry_after(&header("soon")), None);
    }

    #[test]
    fn grpc_retries_unavailable_and_exhausted_with_a_delay_only() {
        let info = RetryInfo {
            retry_delay: Some(ProtoDuration {
                seconds: 2,
                nanos: 500_000_000,
            }),
        };
        let details = RpcStatus {
            code: tonic::Code::ResourceExhausted as i32,
            message: "slow down".into(),
            details: vec![Any {
                type_url: "type.googleapis.com/google.rpc.RetryInfo".into(),
                value: info.encode_to_vec(),
            }],
        }
        .encode_to_vec();
        let exhausted = tonic::Status::with_details(
            tonic::Code::ResourceExhausted,
            "slow down",
            Bytes::from(details),
        );
        assert!(matches!(
            grpc_refusal(&exhausted),
            Outcome::Retry { after: Some(d), .. } if d == Duration::from_millis(2500)
        ));
        let bare = tonic::Status::resource_exhausted("full");
        assert!(matches!(grpc_refusal(&bare), Outcome::Rejected { .. }));
        let down = tonic::Status::unavailable("down");
        assert!(matches!(
            grpc_refusal(&down),
            Outcome::Retry { after: None, .. }
        ));
        for code in [
            tonic::Code::Unauthenticated,
            tonic::Code::InvalidArgument,
            tonic::Code::PermissionDenied,
            tonic::Code::Internal,
        ] {
            let refused = tonic::Status::new(code, "no");
            assert!(
                matches!(grpc_refusal(&refused), Outcome::Rejected { .. }),
                "{code:?}"
            );
        }
    }

    #[test]
    fn error_bodies_give_the_status_message_or_the_text() {
        let status = RpcStatus {
            code: 16,
            message: "missing credentials".into(),
            details: vec![],
        };
        assert_eq!(error_text(&status.encode_to_vec()), "missing credentials");
        assert_eq!(error_text(b"Unauthorized\n"), "Unauthorized");
        let long = "x".repeat(1000);
        assert_eq!(shorten(&long).chars().count(), MESSAGE_CHARS + 1);
    }
}
