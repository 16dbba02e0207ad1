//! What `--web-config` asks for, made ready to serve: the TLS configuration built from its
//! `tls_server_config` and its basic-auth users checked ([`WebSettings`]). At start from the
//! file, and on reload ([`crate::reload`]) the same way, piece by piece: [`web_config`] only
//! reads the file, [`tls`] and [`auth`] only build what it names.
//!
//! [`web_config`]: super::web_config
//! [`tls`]: super::tls
//! [`auth`]: super::auth

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::auth::{AuthError, BasicAuth};
use super::tls::{TlsError, TlsReloader};
use super::web_config::{FileError, TlsSettings, WebConfigFile};

/// Why the `--web-config` file cannot be used: one line that names the file (and the line of it,
/// for a mistake in the text), printed before the exporter exits with status 2.
#[derive(Debug, thiserror::Error)]
pub enum WebConfigError {
    /// The file cannot be read, or its text is not a web-config.
    #[error(transparent)]
    File(#[from] FileError),
    /// The certificate, key or client CA files cannot be served.
    #[error("--web-config {}: {error}", path.display())]
    Tls {
        /// The web-config file that names them.
        path: PathBuf,
        /// Which file is at fault and why (boxed: far larger than the other variants).
        error: Box<TlsError>,
    },
    /// The basic-auth users cannot be used.
    #[error("--web-config {}: {error}", path.display())]
    Auth {
        /// The file.
        path: PathBuf,
        /// Which user is at fault and why.
        error: AuthError,
    },
}

/// The TLS configuration `settings` (of the web-config file at `path`) ask for, its files read
/// and checked.
pub fn build_tls(path: &Path, settings: TlsSettings) -> Result<TlsReloader, WebConfigError> {
    TlsReloader::new(settings).map_err(|error| WebConfigError::Tls {
        path: path.to_owned(),
        error: Box::new(error),
    })
}

/// The basic-auth users of the web-config file at `path`, their hashes checked.
pub fn build_auth(
    path: &Path,
    users: BTreeMap<String, String>,
) -> Result<BasicAuth, WebConfigError> {
    BasicAuth::new(users).map_err(|error| WebConfigError::Auth {
        path: path.to_owned(),
        error,
    })
}

/// Everything `--web-config` asks for, loaded and checked: what [`super::server::serve`] needs.
#[derive(Debug, Default, Clone)]
pub struct WebSettings {
    /// Serve HTTPS with these certificates instead of plain HTTP.
    pub tls: Option<Arc<TlsReloader>>,
    /// Require one of these users on every path but `/healthz` and `/readyz`.
    pub auth: Option<Arc<BasicAuth>>,
    /// The web-config file these came from; `None` without `--web-config`.
    pub path: Option<PathBuf>,
    /// What the file says (empty without one): a reload compares the new file with it.
    pub file: WebConfigFile,
}

impl WebSettings {
    /// Reads and validates the web-config file, or plain HTTP without auth when there is none.
    ///
    /// Everything that can be wrong is found here, before serving: YAML syntax, unknown keys,
    /// unreadable or mismatched certificate and key, a bad client CA, a malformed bcrypt hash.
    /// The error is one line naming the file (and the line, for YAML errors).
    pub fn load(path: Option<&Path>) -> Result<WebSettings, WebConfigError> {
        let Some(path) = path else {
            return Ok(WebSettings::default());
        };
        let parsed = WebConfigFile::read(path)?;
        let tls = parsed
            .tls
            .clone()
            .map(|settings| build_tls(path, settings).map(Arc::new))
            .transpose()?;
        let auth = parsed
            .basic_auth_users
            .clone()
            .map(|users| build_auth(path, users).map(Arc::new))
            .transpose()?;
        Ok(WebSettings {
            tls,
            auth,
            path: Some(path.to_owned()),
            file: parsed,
        })
    }

    /// The web-config file, when one was given that turns on neither TLS nor basic auth (an
    /// empty file, or only comments): worth a warning, since whoever wrote it meant something.
    pub fn enables_nothing(&self) -> Option<&Path> {
        self.path
            .as_deref()
            .filter(|_| self.tls.is_none() && self.auth.is_none())
    }
}
