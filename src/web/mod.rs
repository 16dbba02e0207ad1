//! The HTTP server around [`crate::http`]'s routes: connection handling, timeouts and the
//! `--web-config` file (TLS, client certificates, basic auth) in the Prometheus exporter-toolkit
//! format.
//!
//! [`file`](mod@file) parses and validates the file, [`tls`] builds (and rebuilds when the files change) the
//! rustls configuration, [`auth`] checks basic-auth credentials, [`serve`] runs the accept loop.

pub mod auth;
pub mod file;
pub mod serve;
pub mod tls;

use std::path::Path;
use std::sync::Arc;

/// Everything `--web-config` asks for, loaded and checked: what [`serve::serve`] needs.
#[derive(Debug, Default, Clone)]
pub struct WebSettings {
    /// Serve HTTPS with these certificates instead of plain HTTP.
    pub tls: Option<Arc<tls::TlsReloader>>,
    /// Require one of these users on every path but `/healthz` and `/readyz`.
    pub auth: Option<Arc<auth::BasicAuth>>,
}

impl WebSettings {
    /// Reads and validates the web-config file, or plain HTTP without auth when there is none.
    ///
    /// Everything that can be wrong is found here, before serving: YAML syntax, unknown keys,
    /// unreadable or mismatched certificate and key, a bad client CA, a malformed bcrypt hash.
    /// The error is one line naming the file (and the line, for YAML errors).
    pub fn load(path: Option<&Path>) -> Result<WebSettings, String> {
        let Some(path) = path else {
            return Ok(WebSettings::default());
        };
        let parsed = file::WebConfigFile::read(path)?;
        let in_file = |msg: String| format!("--web-config {}: {msg}", path.display());
        let tls = parsed
            .tls
            .map(|settings| tls::TlsReloader::new(settings).map(Arc::new))
            .transpose()
            .map_err(in_file)?;
        let auth = parsed
            .basic_auth_users
            .map(|users| auth::BasicAuth::new(users).map(Arc::new))
            .transpose()
            .map_err(in_file)?;
        Ok(WebSettings { tls, auth })
    }
}
