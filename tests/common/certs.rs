//! A test certificate authority: a CA made for one test that signs server and client
//! certificates (rcgen), for the exporter's TLS and mTLS and for the fake kubelet's HTTPS API.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A CA that signs server and client certificates.
pub struct Ca {
    /// The CA's own certificate, PEM: what a client or server is told to trust.
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its private key, PEM.
pub struct Leaf {
    pub cert: String,
    pub key: String,
}

impl Ca {
    /// A new CA with its own key, `name` as its common name.
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A serving certificate for 127.0.0.1 and localhost.
    pub fn server(&self) -> Leaf {
        self.leaf(
            vec!["127.0.0.1".into(), "localhost".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate for the name "prometheus".
    pub fn client(&self) -> Leaf {
        self.leaf(
            vec!["prometheus".into()],
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    fn leaf(&self, names: Vec<String>, usage: ExtendedKeyUsagePurpose) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names).unwrap();
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}
