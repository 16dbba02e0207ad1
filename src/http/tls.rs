//! rustls server configuration from `tls_server_config`, rebuilt when the files change.
//!
//! Certificates are rotated in place (cert-manager, a cron job): on a TLS handshake, at most once
//! every [`RELOAD_CHECK`], the size and modification time of the certificate, key and client CA
//! files are compared with the last seen; when they changed the whole configuration is rebuilt.
//! A rebuild that fails (a half-written file, a key that does not match yet) keeps serving the
//! previous certificate and logs a warning; it is tried again when the files change again.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use tokio_rustls::TlsAcceptor;

use super::web_config::{ClientAuth, TlsSettings, TlsVersion};

/// How often, at most, a handshake looks at the files' modification times.
pub const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// Size and modification time of one file, or `None` when it cannot be read.
type Stamp = Option<(SystemTime, u64)>;

/// The current TLS acceptor, rebuilt when the certificate files change.
pub struct TlsReloader {
    settings: TlsSettings,
    state: Mutex<State>,
}

struct State {
    acceptor: TlsAcceptor,
    stamps: Vec<Stamp>,
    checked: Instant,
}

impl fmt::Debug for TlsReloader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsReloader")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl TlsReloader {
    /// Loads the certificate, key and client CA now; an error names the file at fault.
    pub fn new(settings: TlsSettings) -> Result<TlsReloader, String> {
        let stamps = stamps(&settings);
        let config = server_config(&settings)?;
        Ok(TlsReloader {
            settings,
            state: Mutex::new(State {
                acceptor: TlsAcceptor::from(Arc::new(config)),
                stamps,
                checked: Instant::now(),
            }),
        })
    }

    /// The acceptor for a new connection, after reloading the files if they changed.
    pub fn acceptor(&self) -> TlsAcceptor {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.checked.elapsed() >= RELOAD_CHECK {
            state.checked = Instant::now();
            let now = stamps(&self.settings);
            if now != state.stamps {
                state.stamps = now;
                match server_config(&self.settings) {
                    Ok(config) => {
                        state.acceptor = TlsAcceptor::from(Arc::new(config));
                        tracing::info!(cert_file = %self.settings.cert_file.display(), "TLS certificate reloaded");
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
}

fn stamps(s: &TlsSettings) -> Vec<Stamp> {
    [
        Some(&s.cert_file),
        Some(&s.key_file),
        s.client_ca_file.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|p| {
        let m = std::fs::metadata(p).ok()?;
        Some((m.modified().ok()?, m.len()))
    })
    .collect()
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the rustls configuration; errors name the file or setting at fault.
pub fn server_config(s: &TlsSettings) -> Result<ServerConfig, String> {
    let certs = read_certs(&s.cert_file, "cert_file")?;
    let key = PrivateKeyDer::from_pem_file(&s.key_file)
        .map_err(|e| format!("key_file {}: {e}", s.key_file.display()))?;
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
        .map_err(|e| format!("tls_server_config: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| {
            format!(
                "cert_file {} and key_file {}: {e}",
                s.cert_file.display(),
                s.key_file.display()
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

fn read_certs(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{key} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{key} {}: no PEM certificate in the file",
            path.display()
        ));
    }
    Ok(certs)
}

fn client_verifier(
    s: &TlsSettings,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let unverified = |mandatory| -> Arc<dyn ClientCertVerifier> {
        Arc::new(AnyClientCert {
            mandatory,
            algorithms: provider.signature_verification_algorithms,
        })
    };
    let verified = |optional: bool| -> Result<Arc<dyn ClientCertVerifier>, String> {
        let ca: &PathBuf = s
            .client_ca_file
            .as_ref()
            .ok_or("client_ca_file is required for this client_auth_type")?;
        let mut roots = RootCertStore::empty();
        for cert in read_certs(ca, "client_ca_file")? {
            roots
                .add(cert)
                .map_err(|e| format!("client_ca_file {}: {e}", ca.display()))?;
        }
        let mut builder =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
        if optional {
            builder = builder.allow_unauthenticated();
        }
        builder
            .build()
            .map_err(|e| format!("client_ca_file {}: {e}", ca.display()))
    };
    match s.client_auth {
        ClientAuth::NoClientCert => Ok(WebPkiClientVerifier::no_client_auth()),
        ClientAuth::RequestClientCert => Ok(unverified(false)),
        ClientAuth::RequireAnyClientCert => Ok(unverified(true)),
        ClientAuth::VerifyClientCertIfGiven => verified(true),
        ClientAuth::RequireAndVerifyClientCert => verified(false),
    }
}

/// `RequestClientCert` / `RequireAnyClientCert`: any certificate is accepted without checking who
/// signed it (Go's semantics), but the client must still prove it holds the certificate's key.
#[derive(Debug)]
struct AnyClientCert {
    mandatory: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for AnyClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
