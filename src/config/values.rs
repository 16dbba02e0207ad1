//! The values options are written as: the parsers shared by the flags, the environment and the
//! file (durations, listen addresses, URLs), the serde readers of the file's text values, and how
//! error messages show a value.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A duration as written on the command line or in the file (`1s`, `500ms`, `2m`).
pub(super) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| {
        format!(
            "{} is not a duration ({e}); write e.g. 1s, 500ms, 2m",
            quote(s)
        )
    })
}

/// A listen address: `HOST:PORT`, or `:PORT` for every interface.
pub(super) fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    let full = match s.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => s.to_string(),
    };
    full.parse()
        .map_err(|_| format!("{} is not an address; write HOST:PORT with an IP, e.g. 0.0.0.0:9400, [::]:9400 or :9400", quote(s)))
}

/// A URL, checked only for syntax here.
pub(super) fn parse_url(s: &str) -> Result<http::Uri, String> {
    s.trim()
        .parse()
        .map_err(|e| format!("{} is not a URL ({e})", quote(s)))
}

/// A file value written as text, read with the same parser as its flag.
fn from_text<'de, D: Deserializer<'de>, T>(
    d: D,
    parse: fn(&str) -> Result<T, String>,
) -> Result<T, D::Error> {
    parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
}

/// A file's duration, written as text.
pub(super) fn duration_text<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    from_text(d, parse_duration)
}

/// A file's optional duration, written as text.
pub(super) fn some_duration_text<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    from_text(d, parse_duration).map(Some)
}

/// A file's listen address, written as text.
pub(super) fn listen_text<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    from_text(d, parse_listen)
}

/// A file's URL, written as text.
pub(super) fn url_text<'de, D: Deserializer<'de>>(d: D) -> Result<http::Uri, D::Error> {
    from_text(d, parse_url)
}

/// A file's optional URL, written as text.
pub(super) fn some_url_text<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<http::Uri>, D::Error> {
    url_text(d).map(Some)
}

/// A value as shown in an error message: in quotes, with line breaks and other control characters
/// escaped, so that whatever was written the message stays on one line.
pub(super) fn quote(s: &str) -> String {
    format!("'{}'", s.escape_debug())
}

/// A duration as error messages show it (`1m 30s`).
pub(super) fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use crate::config::testing::load_args;

    #[test]
    fn port_only_listen_means_all_interfaces() {
        let c = load_args(&["--listen", ":9500"]).unwrap();
        assert_eq!(c.listen, "0.0.0.0:9500".parse().unwrap());
    }
}
