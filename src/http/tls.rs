//! rustls server configuration from `tls_server_config`, rebuilt when the files change.
//!
//! Certificates are rotated in place (cert-manager, a cron job): on a TLS handshake, at most once
//! every [`RELOAD_CHECK`], the device, inode, size, modification and change times of the
//! certificate, key and client CA files are compared with the last seen; when any changed the
//! whole configuration is rebuilt. The inode and change time catch a file replaced by one of the
//! same size and modification time (a rename, `cp -p`, a Kubernetes secret's symlink swap), which
//! size and modification time alone miss. Files are read with the bounds of
//! [`crate::files::read_small_file`].
//! A rebuild that fails (a half-written file, a key that does not match yet) keeps serving the
//! previous certificate and logs a warning; it is tried again when the files change again.
//! A reload of the web-config that names other files or settings [replaces](TlsReloader::replace)
//! the whole state with one loaded from them.

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::{self, PemObject};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ServerConfig, VerifierBuilderError, WebPkiClientVerifier};
use tokio_rustls::TlsAcceptor;

use super::web_config::{ClientAuth, TlsSettings, TlsVersion};
use crate::certificates::{self, AnyCertificate, CertificateFileError};

/// Why the TLS settings cannot be served. Each names the `tls_server_config` key and file at
/// fault; [`super::settings::build_tls`] puts the web-config file in front.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// `cert_file` or `client_ca_file` cannot be read as PEM certificates.
    #[error("{key} {}: {error}", path.display())]
    Certificates {
        /// The key that names the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        error: CertificateFileError,
    },
    /// `key_file` cannot be read as a PEM private key.
    #[error("key_file {}: {error}", path.display())]
    Key {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        error: pem::Error,
    },
    /// rustls refuses the protocol versions.
    #[error("tls_server_config: {0}")]
    Versions(rustls::Error),
    /// The key does not go with the certificate, or rustls refuses the pair.
    #[error("cert_file {} and key_file {}: {error}", cert_file.display(), key_file.display())]
    KeyPair {
        /// The certificate chain.
        cert_file: PathBuf,
        /// The private key.
        key_file: PathBuf,
        /// Why rustls refuses them.
        error: rustls::Error,
    },
    /// A client-certificate policy that verifies, without a CA to verify against.
    #[error("client_ca_file is required for this client_auth_type")]
    NoClientCa,
    /// The client CA certificates cannot verify clients.
    #[error("client_ca_file {}: {error}", path.display())]
    ClientVerifier {
        /// The CA file.
        path: PathBuf,
        /// Why rustls refuses it.
        error: VerifierBuilderError,
    },
}

/// How often, at most, a handshake looks at the files' modification times.
pub const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// What tells one version of a file from another (see the module doc); the configuration
/// reload compares the `--config` and `--web-config` files by it too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    /// The stamp of the file `path` names now, through any symlinks (a Kubernetes volume swaps
    /// a symlink to a new directory); `None` when it cannot be read.
    pub(crate) fn of_path(path: &std::path::Path) -> Option<Stamp> {
        std::fs::metadata(path).ok().map(|m| Stamp::of(&m))
    }

    fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// The current TLS acceptor, rebuilt when the certificate files change.
pub struct TlsReloader {
    state: Mutex<State>,
}

struct State {
    settings: TlsSettings,
    acceptor: TlsAcceptor,
    stamps: Vec<Option<Stamp>>,
    checked: Instant,
}

impl fmt::Debug for TlsReloader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsReloader")
            .field("settings", &self.lock().settings)
            .finish_non_exhaustive()
    }
}

impl TlsReloader {
    /// Loads the certificate, key and client CA now; an error names the file at fault.
    pub fn new(settings: TlsSettings) -> Result<TlsReloader, TlsError> {
        let stamps = stamps(&settings);
        let config = server_config(&settings)?;
        Ok(TlsReloader {
            state: Mutex::new(State {
                settings,
                acceptor: TlsAcceptor::from(Arc::new(config)),
                stamps,
                checked: Instant::now(),
            }),
        })
    }

    /// The acceptor for a new connection, after reloading the files if they changed.
    pub fn acceptor(&self) -> TlsAcceptor {
        let mut state = self.lock();
        if state.checked.elapsed() >= RELOAD_CHECK {
            state.checked = Instant::now();
            let now = stamps(&state.settings);
            if now != state.stamps {
                state.stamps = now;
                match server_config(&state.settings) {
                    Ok(config) => {
                        state.acceptor = TlsAcceptor::from(Arc::new(config));
                        tracing::info!(cert_file = %state.settings.cert_file.display(), "TLS certificate reloaded");
                    }
                    Err(e) => tracing::warn!(
                        error = %e,
                        "TLS files changed but cannot be loaded; serving the previous certificate"
                    ),
                }
            }
        }
        state.acceptor.clone()
    }

    /// The settings served now.
    pub fn settings(&self) -> TlsSettings {
        self.lock().settings.clone()
    }

    /// Serves what `other` serves (its settings, and certificate as loaded) from the next
    /// connection on: a reloaded web-config that names other files or settings.
    pub fn replace(&self, other: TlsReloader) {
        let new = other.state.into_inner().unwrap_or_else(|e| e.into_inner());
        *self.lock() = new;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means a rebuild panicked; each field is replaced whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn stamps(s: &TlsSettings) -> Vec<Option<Stamp>> {
    [
        Some(&s.cert_file),
        Some(&s.key_file),
        s.client_ca_file.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|p| Stamp::of_path(p))
    .collect()
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the rustls configuration; errors name the file or setting at fault.
pub fn server_config(s: &TlsSettings) -> Result<ServerConfig, TlsError> {
    let certs =
        certificates::read_certificates(&s.cert_file).map_err(|error| TlsError::Certificates {
            key: "cert_file",
            path: s.cert_file.clone(),
            error,
        })?;
    let key = crate::files::read_small_file(&s.key_file)
        .map_err(pem::Error::Io)
        .and_then(|pem| PrivateKeyDer::from_pem_slice(&pem))
        .map_err(|error| TlsError::Key {
            path: s.key_file.clone(),
            error,
        })?;
    let provider = provider();
    let versions: &[&rustls::SupportedProtocolVersion] = match (s.min_version, s.max_version) {
        (TlsVersion::TLS12, TlsVersion::TLS12) => &[&rustls::version::TLS12],
        (TlsVersion::TLS13, _) => &[&rustls::version::TLS13],
        (TlsVersion::TLS12, TlsVersion::TLS13) => {
            &[&rustls::version::TLS13, &rustls::version::TLS12]
        }
    };
    let verifier = client_verifier(s, &provider)?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(TlsError::Versions)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|error| TlsError::KeyPair {
            cert_file: s.cert_file.clone(),
            key_file: s.key_file.clone(),
            error,
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

fn client_verifier(
    s: &TlsSettings,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let verified = |optional: bool| -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
        let ca = s.client_ca_file.as_ref().ok_or(TlsError::NoClientCa)?;
        let roots = certificates::read_roots(ca).map_err(|error| TlsError::Certificates {
            key: "client_ca_file",
            path: ca.clone(),
            error,
        })?;
        let mut builder =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
        if optional {
            builder = builder.allow_unauthenticated();
        }
        builder.build().map_err(|error| TlsError::ClientVerifier {
            path: ca.clone(),
            error,
        })
    };
    match s.client_auth {
        ClientAuth::NoClientCert => Ok(WebPkiClientVerifier::no_client_auth()),
        ClientAuth::RequestClientCert => Ok(AnyCertificate::of_clients(provider, false)),
        ClientAuth::RequireAnyClientCert => Ok(AnyCertificate::of_clients(provider, true)),
        ClientAuth::VerifyClientCertIfGiven => verified(true),
        ClientAuth::RequireAndVerifyClientCert => verified(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(path: &std::path::Path) -> Stamp {
        Stamp::of(&std::fs::metadata(path).unwrap())
    }

    #[test]
    fn a_file_replaced_with_the_same_size_and_modification_time_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("server.crt");
        std::fs::write(&path, "first").unwrap();
        let before = stamp(&path);
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();

        // Replaced by rename, as certificate tools do: another inode.
        let tmp = dir.path().join("new.crt");
        std::fs::write(&tmp, "other").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&tmp)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        let renamed = stamp(&path);
        assert_eq!((renamed.len, renamed.mtime), (before.len, before.mtime));
        assert_ne!(renamed, before);

        // Rewritten in place with the modification time put back (`cp -p`): the change time moves.
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        std::thread::sleep(Duration::from_millis(20)); // ctime has the file system's granularity
        std::io::Write::write_all(&mut &file, b"third").unwrap();
        file.set_modified(mtime).unwrap();
        let rewritten = stamp(&path);
        assert_eq!(
            (rewritten.ino, rewritten.len, rewritten.mtime),
            (renamed.ino, renamed.len, renamed.mtime)
        );
        assert_ne!(rewritten, renamed);
    }
}
