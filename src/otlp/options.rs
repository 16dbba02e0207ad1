//! What the push is configured with ([`OtlpOptions`], built by the configuration from the
//! `--otlp-*` options and OpenTelemetry's `OTEL_*` variables), and the parsers of the values
//! those options take: the headers file, and OTel's `key=value,…` lists.

use std::fmt;
use std::time::Duration;

use clap::ValueEnum;
use http::{HeaderMap, HeaderName, HeaderValue, Uri};
use serde::Deserialize;

/// The OTLP transport.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Deserialize)]
pub enum Protocol {
    /// OTLP/gRPC, the default port 4317.
    #[default]
    #[value(name = "grpc")]
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP/HTTP with protobuf bodies, POSTed to the endpoint's `/v1/metrics`, the default port
    /// 4318.
    #[value(name = "http/protobuf")]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

impl Protocol {
    /// The name OTel's variables and the options give it.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// The compression of each request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// gzip, at its fastest level.
    #[default]
    Gzip,
    /// Uncompressed.
    None,
}

/// Everything the push needs, resolved: defaults, OTel's variables and the files read.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpOptions {
    /// Where requests go: for gRPC the receiver's address, for HTTP the URL POSTed to (its
    /// `/v1/metrics`).
    pub endpoint: Uri,
    /// The transport.
    pub protocol: Protocol,
    /// How often the current snapshot is pushed.
    pub interval: Duration,
    /// The deadline of one request, connecting included.
    pub timeout: Duration,
    /// Requests are gzip-compressed.
    pub gzip: bool,
    /// Headers every request carries (secrets: never logged).
    pub headers: Headers,
    /// TLS material, for an `https://` endpoint.
    pub tls: Tls,
    /// The resource attributes: who pushes.
    pub resource: Vec<(String, String)>,
}

/// The headers every request carries. Their values are secrets (an `Authorization` header):
/// `Debug` shows only the names.
#[derive(Clone, Default, PartialEq)]
pub struct Headers(pub Vec<(HeaderName, HeaderValue)>);

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(name, _)| name))
            .finish()
    }
}

impl Headers {
    /// As a header map.
    pub fn map(&self) -> HeaderMap {
        self.0.iter().cloned().collect()
    }

    /// The headers of a headers file: one `Name: value` per line; blank lines and lines
    /// starting with `#` are skipped. An error names the line.
    pub fn parse_file(text: &str) -> Result<Headers, String> {
        let mut headers = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((name, value)) = line.split_once(':') else {
                return Err(format!("line {}: not `Name: value`", n + 1));
            };
            headers.push(
                header(name.trim(), value.trim()).map_err(|e| format!("line {}: {e}", n + 1))?,
            );
        }
        Ok(Headers(headers))
    }

    /// The headers of `OTEL_EXPORTER_OTLP_HEADERS`: `name=value` pairs, comma-separated, values
    /// percent-decoded.
    pub fn parse_list(text: &str) -> Result<Headers, String> {
        parse_pairs(text)?
            .into_iter()
            .map(|(name, value)| header(&name, &value))
            .collect::<Result<_, _>>()
            .map(Headers)
    }
}

/// One header the requests may carry: not one the transport writes itself, and only what gRPC
/// metadata can hold (visible ASCII).
fn header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    let parsed = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("{name:?} is not a header name"))?;
    let reserved = [
        "content-type",
        "content-encoding",
        "content-length",
        "host",
        "te",
    ];
    let lower = parsed.as_str();
    if reserved.contains(&lower) || lower.starts_with("grpc-") || lower.ends_with("-bin") {
        return Err(format!("{name} is written by the exporter itself"));
    }
    // The value is not shown: it is often a secret.
    if !value
        .bytes()
        .all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic())
    {
        return Err(format!(
            "the value of {name} holds a character a header cannot (printable ASCII only)"
        ));
    }
    let value = HeaderValue::from_str(value)
        .map_err(|_| format!("the value of {name} is not a header value"))?;
    Ok((parsed, value))
}

/// OTel's `key=value,key2=value2` list (`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_HEADERS`):
/// keys and values trimmed, values percent-decoded; an empty item is skipped.
pub fn parse_pairs(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    for item in text.split(',') {
        if item.trim().is_empty() {
            continue;
        }
        let Some((key, value)) = item.split_once('=') else {
            return Err(format!("{:?} is not key=value", item.trim()));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(format!("{:?} has no key", item.trim()));
        }
        let value = percent_encoding::percent_decode_str(value.trim())
            .decode_utf8()
            .map_err(|_| format!("the value of {key} is not UTF-8 once percent-decoded"))?;
        pairs.push((key.to_owned(), value.into_owned()));
    }
    Ok(pairs)
}

/// TLS material of an `https://` endpoint, as read from its files (PEM). `Debug` leaves the key
/// out.
#[derive(Clone, Default, PartialEq)]
pub struct Tls {
    /// The CA certificates the receiver's certificate must chain to; `None`: the system's.
    pub ca: Option<Vec<u8>>,
    /// A client certificate chain and its key (mTLS).
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("ca", &self.ca.as_ref().map(Vec::len))
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

impl Tls {
    /// Whether the material makes a TLS configuration (certificates and key parse, and match).
    pub fn check(&self) -> Result<(), String> {
        super::transport::tls_config(self, &[]).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_file_lines() {
        let h = Headers::parse_file(
            "# the collector's token\nAuthorization: Bearer abc.def\n\nX-Scope-OrgID:  tenant-1 \n",
        )
        .unwrap();
        let names: Vec<&str> = h.0.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["authorization", "x-scope-orgid"]);
        assert_eq!(h.0[0].1, "Bearer abc.def");
        assert_eq!(h.0[1].1, "tenant-1");
        assert!(!format!("{h:?}").contains("abc"), "Debug shows no value");

        let e = Headers::parse_file("Authorization: ok\nno colon here\n").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        let e = Headers::parse_file("Content-Type: text/plain\n").unwrap_err();
        assert!(e.contains("Content-Type"), "{e}");
        let e = Headers::parse_file("X-Token: caf\u{e9}\n").unwrap_err();
        assert!(e.contains("printable ASCII") && !e.contains("caf"), "{e}");
        let e = Headers::parse_file("bad name: x\n").unwrap_err();
        assert!(e.contains("not a header name"), "{e}");
    }

    #[test]
    fn otel_lists_are_trimmed_and_percent_decoded() {
        assert_eq!(
            parse_pairs(" service.name = gpu%20nodes ,k8s.cluster.name=prod,").unwrap(),
            [
                ("service.name".to_owned(), "gpu nodes".to_owned()),
                ("k8s.cluster.name".to_owned(), "prod".to_owned())
            ]
        );
        assert!(parse_pairs("novalue").unwrap_err().contains("key=value"));
        assert!(parse_pairs("=x").unwrap_err().contains("no key"));
        let h = Headers::parse_list("api-key=s%3Dcret").unwrap();
        assert_eq!(h.0[0].1, "s=cret");
    }
}
