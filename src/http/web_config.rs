//! The `--web-config` YAML file, in the subset of the Prometheus exporter-toolkit format that
//! nvml-exporter implements: `tls_server_config` and `basic_auth_users`.
//!
//! Anything else (`http_server_config`, `cipher_suites`, a misspelt key) is refused rather than
//! ignored: a setting that silently does nothing is worse for a security option than an error.
//! Relative paths are taken from the file's own directory, as exporter-toolkit does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer};

use crate::files::one_line;

/// Why the `--web-config` file cannot be read as one: one line that names the file (and the line
/// of it, for a mistake in the text).
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file cannot be read.
    #[error("--web-config: cannot read {}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why it cannot be read.
        error: std::io::Error,
    },
    /// The text is not a valid web-config.
    #[error("--web-config {}{}{error}", path.display(), if error.line().is_some() { " " } else { ": " })]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong in it.
        error: ParseError,
    },
}

/// What is wrong in the text of a web-config file. Values quoted from the file are made one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Not YAML, or not this format (an unknown key, a value of the wrong type).
    #[error("line {line}: {message}")]
    Yaml {
        /// The line of the file (1-based).
        line: usize,
        /// The YAML parser's message.
        message: String,
    },
    /// The same, where the YAML parser gives no position.
    #[error("{0}")]
    YamlWithoutLine(String),
    /// More than [`MAX_FLOW_COLLECTIONS`] brackets.
    #[error(
        "line {line}: more than {MAX_FLOW_COLLECTIONS} '[' and '{{' in the file; nesting this deep is refused"
    )]
    TooManyFlowCollections {
        /// The line of the first bracket too many.
        line: usize,
    },
    /// `basic_auth_users:` without a user (`{}`, or every user commented out).
    #[error("basic_auth_users is empty; remove it to disable basic auth")]
    NoUsers,
    /// `tls_server_config:` without settings (every line commented out).
    #[error(
        "tls_server_config is empty; remove it to serve plain HTTP, or give cert_file and key_file"
    )]
    NoTls,
    /// A user name with ':', which could never log in.
    #[error("basic_auth_users.{0}: a user name cannot contain ':'")]
    UserWithColon(String),
    /// A user name with a control character.
    #[error("basic_auth_users.{0}: a user name cannot contain control characters")]
    UserWithControlCharacter(String),
    /// The hash of this user has a space or control character.
    #[error("basic_auth_users.{0}: the bcrypt hash contains a space or control character")]
    HashWithSpace(String),
    /// `cert_file` or `key_file` is an empty string.
    #[error("tls_server_config.{0} is empty")]
    EmptyPath(&'static str),
    /// A file name with a control character.
    #[error("tls_server_config.{key} {path} contains a control character")]
    PathWithControlCharacter {
        /// The key that names the file.
        key: &'static str,
        /// The file name, made one line.
        path: String,
    },
    /// `max_version` below `min_version`.
    #[error("tls_server_config.max_version {max:?} is below min_version {min:?}")]
    MaxBelowMin {
        /// `min_version`.
        min: TlsVersion,
        /// `max_version`.
        max: TlsVersion,
    },
    /// A policy that verifies client certificates, without a CA to verify them against.
    #[error("tls_server_config.client_auth_type {0:?} needs client_ca_file")]
    NoClientCa(ClientAuth),
    /// A client CA with `NoClientCert`: a mistake, as exporter-toolkit rules.
    #[error(
        "tls_server_config.client_ca_file is set but client_auth_type is NoClientCert; set it to RequireAndVerifyClientCert for mTLS"
    )]
    UnusedClientCa,
}

impl ParseError {
    /// The line of the file the mistake is on, where known.
    pub fn line(&self) -> Option<usize> {
        match self {
            ParseError::Yaml { line, .. } | ParseError::TooManyFlowCollections { line } => {
                Some(*line)
            }
            _ => None,
        }
    }
}

/// The file as written. A section that is present but empty (`basic_auth_users:` with every user
/// commented out) is `Some(None)`, told apart from an absent one so that it can be refused:
/// serving without the auth or TLS that the file names would be failing open.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default, deserialize_with = "present")]
    tls_server_config: Option<Option<RawTls>>,
    #[serde(default, deserialize_with = "present")]
    basic_auth_users: Option<Option<BTreeMap<String, String>>>,
}

/// A key that is present, with its value or `None` for an empty (null) one.
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert_file: PathBuf,
    key_file: PathBuf,
    #[serde(default)]
    client_auth_type: ClientAuth,
    client_ca_file: Option<PathBuf>,
    #[serde(default)]
    min_version: TlsVersion,
    max_version: Option<TlsVersion>,
}

/// Which client certificates the server asks for, with exporter-toolkit's (Go's) names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum ClientAuth {
    /// No client certificate is requested.
    #[default]
    NoClientCert,
    /// A certificate is requested but neither required nor verified.
    RequestClientCert,
    /// A certificate is required but not verified against a CA.
    RequireAnyClientCert,
    /// A certificate is optional; one that is sent must be signed by `client_ca_file`.
    VerifyClientCertIfGiven,
    /// A certificate signed by `client_ca_file` is required (mTLS).
    RequireAndVerifyClientCert,
}

/// A TLS protocol version. rustls implements only 1.2 and 1.3, so TLS10/TLS11 are refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub enum TlsVersion {
    /// TLS 1.2 (the default minimum, as in exporter-toolkit).
    #[default]
    TLS12,
    /// TLS 1.3.
    TLS13,
}

/// `tls_server_config`, validated and with paths resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// Client certificate policy.
    pub client_auth: ClientAuth,
    /// PEM CA certificates that client certificates must chain to.
    pub client_ca_file: Option<PathBuf>,
    /// Lowest version offered.
    pub min_version: TlsVersion,
    /// Highest version offered.
    pub max_version: TlsVersion,
}

/// The web-config file, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebConfigFile {
    /// Serve HTTPS.
    pub tls: Option<TlsSettings>,
    /// User name → bcrypt hash.
    pub basic_auth_users: Option<BTreeMap<String, String>>,
}

impl WebConfigFile {
    /// Reads and validates `path`; the error names the file, and the line for YAML errors.
    pub fn read(path: &Path) -> Result<WebConfigFile, FileError> {
        let text = crate::files::read_small_file(path)
            .and_then(|bytes| {
                String::from_utf8(bytes)
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
            })
            .map_err(|error| FileError::Read {
                path: path.to_owned(),
                error,
            })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        WebConfigFile::parse(&text, dir).map_err(|error| FileError::Parse {
            path: path.to_owned(),
            error,
        })
    }

    /// Parses `text`, resolving relative paths against `dir`.
    pub fn parse(text: &str, dir: &Path) -> Result<WebConfigFile, ParseError> {
        check_flow_collections(text)?;
        // An empty file (or only comments) is a valid "no TLS, no auth", as in exporter-toolkit.
        let raw: Option<RawFile> = yaml_serde::from_str(text).map_err(|e| {
            // The message may quote a key or value from the file, line breaks included.
            let msg = one_line(&e.to_string());
            // The message ends with " at line L column C" when it has a location; keep one copy.
            let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
            // An error at the end of the input is placed on the line after the last one; name
            // the last line that exists instead.
            let last_line = text.split('\n').count();
            match e.location() {
                Some(loc) => ParseError::Yaml {
                    line: loc.line().min(last_line),
                    message: msg,
                },
                None => ParseError::YamlWithoutLine(msg),
            }
        })?;
        let raw = raw.unwrap_or_default();
        let tls = match raw.tls_server_config {
            None => None,
            Some(None) => return Err(ParseError::NoTls),
            Some(Some(t)) => Some(validate_tls(t, dir)?),
        };
        let basic_auth_users = match raw.basic_auth_users {
            None => None,
            Some(users) => {
                let users = users.filter(|u| !u.is_empty()).ok_or(ParseError::NoUsers)?;
                for (user, hash) in &users {
                    check_user(user, hash)?;
                }
                Some(users)
            }
        };
        Ok(WebConfigFile {
            tls,
            basic_auth_users,
        })
    }
}

/// At most this many flow collections (`[` and `{`) in one file. The YAML scanner takes time
/// quadratic in their nesting depth (100 000 nested `[` take minutes), the depth is at most their
/// number, and a web-config needs a handful.
pub const MAX_FLOW_COLLECTIONS: usize = 1000;

/// Refuses a file with more than [`MAX_FLOW_COLLECTIONS`] opening brackets, naming the line of
/// the first one too many. Counted without regard to quoting: a bracket in a quoted string counts
/// too, which only matters for files far beyond any real web-config.
fn check_flow_collections(text: &str) -> Result<(), ParseError> {
    let Some((offset, _)) = text.match_indices(['[', '{']).nth(MAX_FLOW_COLLECTIONS) else {
        return Ok(());
    };
    let line = text[..offset].matches('\n').count() + 1;
    Err(ParseError::TooManyFlowCollections { line })
}

/// A user name and hash that basic auth can use. A name with ':' could never log in (the
/// `Authorization` header splits name and password at the first ':'); control characters belong
/// in neither and would break the one-line error messages that quote them.
fn check_user(user: &str, hash: &str) -> Result<(), ParseError> {
    let shown = one_line(user);
    if user.contains(':') {
        return Err(ParseError::UserWithColon(shown));
    }
    if user.chars().any(char::is_control) {
        return Err(ParseError::UserWithControlCharacter(shown));
    }
    if hash.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(ParseError::HashWithSpace(shown));
    }
    Ok(())
}

fn validate_tls(t: RawTls, dir: &Path) -> Result<TlsSettings, ParseError> {
    let resolve = |p: PathBuf| if p.is_relative() { dir.join(p) } else { p };
    for (key, path) in [("cert_file", &t.cert_file), ("key_file", &t.key_file)] {
        if path.as_os_str().is_empty() {
            return Err(ParseError::EmptyPath(key));
        }
    }
    // Paths are quoted in later errors (unreadable file, bad PEM), which must stay one line.
    for (key, path) in [
        ("cert_file", Some(&t.cert_file)),
        ("key_file", Some(&t.key_file)),
        ("client_ca_file", t.client_ca_file.as_ref()),
    ] {
        let shown = path.map(|p| p.to_string_lossy()).unwrap_or_default();
        if shown.chars().any(char::is_control) {
            return Err(ParseError::PathWithControlCharacter {
                key,
                path: one_line(&shown),
            });
        }
    }
    let max_version = t.max_version.unwrap_or(TlsVersion::TLS13);
    if max_version < t.min_version {
        return Err(ParseError::MaxBelowMin {
            min: t.min_version,
            max: max_version,
        });
    }
    let verifies = matches!(
        t.client_auth_type,
        ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert
    );
    match (&t.client_ca_file, t.client_auth_type) {
        (None, auth) if verifies => return Err(ParseError::NoClientCa(auth)),
        // Same rule as exporter-toolkit: a CA without a policy that uses it is a mistake.
        (Some(_), ClientAuth::NoClientCert) => return Err(ParseError::UnusedClientCa),
        _ => {}
    }
    Ok(TlsSettings {
        cert_file: resolve(t.cert_file),
        key_file: resolve(t.key_file),
        client_auth: t.client_auth_type,
        client_ca_file: t.client_ca_file.map(resolve),
        min_version: t.min_version,
        max_version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error as printed, for a file at /etc/nvml-exporter/web.yml.
    fn parse(text: &str) -> Result<WebConfigFile, String> {
        WebConfigFile::parse(text, Path::new("/etc/nvml-exporter")).map_err(|error| {
            FileError::Parse {
                path: PathBuf::from("/etc/nvml-exporter/web.yml"),
                error,
            }
            .to_string()
        })
    }

    #[test]
    fn empty_file_means_plain_http_without_auth() {
        assert_eq!(parse("").unwrap(), WebConfigFile::default());
        assert_eq!(parse("# nothing\n").unwrap(), WebConfigFile::default());
    }

    #[test]
    fn full_file_with_relative_paths_resolved_against_its_directory() {
        let c = parse(
            "tls_server_config:\n  cert_file: tls/server.crt\n  key_file: /abs/server.key\n  \
             client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n  \
             min_version: TLS13\nbasic_auth_users:\n  prometheus: $2y$10$abc\n",
        )
        .unwrap();
        let tls = c.tls.unwrap();
        assert_eq!(
            tls.cert_file,
            PathBuf::from("/etc/nvml-exporter/tls/server.crt")
        );
        assert_eq!(tls.key_file, PathBuf::from("/abs/server.key"));
        assert_eq!(
            tls.client_ca_file,
            Some(PathBuf::from("/etc/nvml-exporter/ca.pem"))
        );
        assert_eq!(tls.client_auth, ClientAuth::RequireAndVerifyClientCert);
        assert_eq!(tls.min_version, TlsVersion::TLS13);
        assert_eq!(tls.max_version, TlsVersion::TLS13);
        assert_eq!(
            c.basic_auth_users.unwrap().get("prometheus").unwrap(),
            "$2y$10$abc"
        );
    }

    #[test]
    fn unknown_keys_are_errors_with_their_line() {
        let e =
            parse("basic_auth_users:\n  a: b\ntls_server_confg:\n  cert_file: x\n").unwrap_err();
        assert!(
            e.starts_with("--web-config /etc/nvml-exporter/web.yml line 3: ")
                && e.contains("tls_server_confg"),
            "{e}"
        );
        let e = parse("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: []\n")
            .unwrap_err();
        assert!(e.contains("line 4") && e.contains("cipher_suites"), "{e}");
    }

    #[test]
    fn bad_yaml_and_bad_values_are_errors() {
        let e = parse("tls_server_config: [\n").unwrap_err();
        assert!(e.contains("line"), "{e}");
        let e = parse("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS10\n")
            .unwrap_err();
        assert!(e.contains("line 4") && e.contains("TLS10"), "{e}");
        let e = parse("tls_server_config:\n  cert_file: a\n").unwrap_err();
        assert!(e.contains("key_file"), "{e}");
        let e = parse("basic_auth_users: {}\n").unwrap_err();
        assert_eq!(
            e,
            "--web-config /etc/nvml-exporter/web.yml: basic_auth_users is empty; remove it to \
             disable basic auth"
        );
    }

    #[test]
    fn present_but_empty_sections_are_refused_naming_the_key() {
        for text in [
            "basic_auth_users:\n#  prometheus: $2y$10$abc\n",
            "basic_auth_users: ~\n",
            "basic_auth_users: {}\n",
            "tls_server_config:\n  cert_file: a\n  key_file: b\nbasic_auth_users:\n",
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains("basic_auth_users is empty"), "{text:?}: {e}");
        }
        for text in [
            "tls_server_config:\n#  cert_file: a\n#  key_file: b\n",
            "tls_server_config: null\nbasic_auth_users:\n  a: $2y$10$abc\n",
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains("tls_server_config is empty"), "{text:?}: {e}");
        }
        let e = parse("tls_server_config: {}\n").unwrap_err();
        assert!(
            e.contains("tls_server_config") && e.contains("cert_file"),
            "{e}"
        );
    }

    #[test]
    fn an_error_at_the_end_names_a_line_that_exists() {
        let e = WebConfigFile::parse("basic_auth_users: [", Path::new(".")).unwrap_err();
        assert_eq!(e.line(), Some(1), "{e}");
    }

    #[test]
    fn errors_quoting_the_file_stay_on_one_line() {
        for text in [
            "basic_auth_users:\n  \"a\\nb\": x\n",
            "basic_auth_users:\n  a: \"$2y$10$\\n\"\n",
            "tls_server_config:\n  cert_file: \"a\\nb\"\n  key_file: k\n",
            "\"tls\\nserver\": 1\n",
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: \"TLS\\n13\"\n",
        ] {
            let e = parse(text).unwrap_err();
            assert!(!e.contains(['\n', '\r']), "{text:?}: {e:?}");
        }
    }

    #[test]
    fn user_names_with_a_colon_are_refused() {
        let e = parse("basic_auth_users:\n  \"a:b\": $2y$10$abc\n").unwrap_err();
        assert!(e.contains("a:b") && e.contains("':'"), "{e}");
    }

    #[test]
    fn deep_flow_nesting_is_refused_before_parsing() {
        // 100 000 nested brackets took minutes in the YAML scanner; now refused at once.
        let text = format!(
            "# users\nbasic_auth_users: {}{}\n",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let e = parse(&text).unwrap_err();
        assert!(
            e.starts_with("--web-config /etc/nvml-exporter/web.yml line 2: ") && e.contains("1000"),
            "{e}"
        );
        let text = format!("basic_auth_users: {}\n", "[".repeat(MAX_FLOW_COLLECTIONS));
        assert!(!parse(&text).unwrap_err().contains("1000"));
    }

    #[test]
    fn client_auth_and_ca_must_agree() {
        let base = "tls_server_config:\n  cert_file: a\n  key_file: b\n";
        let e = parse(&format!(
            "{base}  client_auth_type: RequireAndVerifyClientCert\n"
        ))
        .unwrap_err();
        assert!(e.contains("client_ca_file"), "{e}");
        let e = parse(&format!("{base}  client_ca_file: ca.pem\n")).unwrap_err();
        assert!(e.contains("NoClientCert"), "{e}");
        let e = parse(&format!("{base}  client_auth_type: Sometimes\n")).unwrap_err();
        assert!(e.contains("Sometimes"), "{e}");
        assert!(parse(&format!("{base}  client_auth_type: RequireAnyClientCert\n")).is_ok());
        let e = parse(&format!(
            "{base}  min_version: TLS13\n  max_version: TLS12\n"
        ))
        .unwrap_err();
        assert!(e.contains("max_version"), "{e}");
    }
}
