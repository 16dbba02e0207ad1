//! Certificates read from PEM files, and the verifier that accepts any certificate.
//!
//! Both ends of the exporter's TLS use them: the HTTPS server (`tls_server_config` in
//! `--web-config`: its certificate chain, its client CA, and the client-certificate policies that
//! verify no signer) and the kubelet `/pods` client (`--kubelet-ca-file`, or
//! `--kubelet-insecure-tls`).

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

/// Why a PEM certificate file cannot be used. The message does not name the file: the caller
/// knows which option or key gave it and says so in front.
#[derive(Debug, thiserror::Error)]
pub enum CertificateFileError {
    /// The file cannot be read, or is not valid PEM.
    #[error(transparent)]
    Read(#[from] pem::Error),
    /// The file holds no `CERTIFICATE` block.
    #[error("no PEM certificate in the file")]
    Empty,
    /// A certificate that cannot be a trust anchor.
    #[error(transparent)]
    Anchor(#[from] rustls::Error),
}

/// Every certificate in the PEM file at `path`, in order; at least one. The file is read with
/// [`crate::files::read_small_file`]'s bounds.
pub fn read_certificates(
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, CertificateFileError> {
    let pem = crate::files::read_small_file(path).map_err(pem::Error::Io)?;
    let certs = CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>()?;
    if certs.is_empty() {
        return Err(CertificateFileError::Empty);
    }
    Ok(certs)
}

/// The certificates of the PEM file at `path` as the trust anchors to verify a peer against.
pub fn read_roots(path: &Path) -> Result<RootCertStore, CertificateFileError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certificates(path)? {
        roots.add(cert)?;
    }
    Ok(roots)
}

/// Accepts any certificate without checking who signed it, but still checks the handshake
/// signature, so the peer must hold the key of the certificate it shows.
///
/// A server uses it for `RequestClientCert` and `RequireAnyClientCert` (Go's semantics, as in
/// exporter-toolkit); the kubelet client for `--kubelet-insecure-tls`, as metrics-server's flag of
/// the same name does.
#[derive(Debug)]
pub struct AnyCertificate {
    algorithms: WebPkiSupportedAlgorithms,
    /// Whether a client must send a certificate (only asked on the server side).
    client_mandatory: bool,
}

impl AnyCertificate {
    /// The verifier of server certificates for a client.
    pub fn of_servers(provider: &CryptoProvider) -> Arc<AnyCertificate> {
        Arc::new(AnyCertificate {
            algorithms: provider.signature_verification_algorithms,
            client_mandatory: false,
        })
    }

    /// The verifier of client certificates for a server: one is asked for, and required when
    /// `mandatory`.
    pub fn of_clients(provider: &CryptoProvider, mandatory: bool) -> Arc<AnyCertificate> {
        Arc::new(AnyCertificate {
            algorithms: provider.signature_verification_algorithms,
            client_mandatory: mandatory,
        })
    }

    fn tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }
}

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

impl ClientCertVerifier for AnyCertificate {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.client_mandatory
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
        self.tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate_pem(name: &str) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn every_certificate_of_the_file_is_read_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chain.pem");
        let (a, b) = (certificate_pem("a"), certificate_pem("b"));
        std::fs::write(&path, format!("{a}{b}")).unwrap();
        let certs = read_certificates(&path).unwrap();
        let expected: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(a.as_bytes())
            .chain(CertificateDer::pem_slice_iter(b.as_bytes()))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(certs, expected);
        assert_eq!(read_roots(&path).unwrap().len(), 2);
    }

    #[test]
    fn a_missing_empty_or_garbled_file_says_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_certificates(&dir.path().join("absent.pem")).unwrap_err();
        assert!(e.to_string().contains("No such file"), "{e}");

        let path = dir.path().join("garbage.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let e = read_certificates(&path).unwrap_err();
        assert_eq!(e.to_string(), "no PEM certificate in the file");

        std::fs::write(
            &path,
            "-----BEGIN CERTIFICATE-----\nAA!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = read_roots(&path).unwrap_err();
        assert!(e.to_string().contains("base64"), "{e}");
    }

    #[test]
    fn clients_are_asked_for_a_certificate_and_required_to_send_one_only_when_mandatory() {
        let provider = rustls::crypto::ring::default_provider();
        let optional = AnyCertificate::of_clients(&provider, false);
        let required = AnyCertificate::of_clients(&provider, true);
        assert!(optional.offer_client_auth() && !optional.client_auth_mandatory());
        assert!(required.offer_client_auth() && required.client_auth_mandatory());
        assert!(!ServerCertVerifier::supported_verify_schemes(&*optional).is_empty());
    }
}
