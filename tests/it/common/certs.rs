//! Certificates made inside the tests: a CA, server and client certificates it signs, the files a
//! server reads them from (laid out as Envoy Gateway mounts them: `tls.crt`, `tls.key`, `ca.crt`), and
//! tonic channels that present them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// A certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A PEM certificate and its PEM key.
#[derive(Clone)]
pub struct Leaf {
    pub cert: String,
    pub key: String,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        Self {
            issuer: CertifiedIssuer::self_signed(params, key).expect("CA certificate"),
        }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for these names (DNS names or IP addresses).
    pub fn server(&self, names: &[&str]) -> Leaf {
        self.leaf(names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate carrying these SANs.
    pub fn client(&self, names: &[&str]) -> Leaf {
        self.leaf(names, ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A certificate for both ends of TLS, as Envoy Gateway issues its components' (the rate limit
    /// service serves gRPC and is a client of the xDS server with the same `tls.crt`).
    pub fn peer(&self, names: &[&str]) -> Leaf {
        self.leaf_with(
            names,
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }

    fn leaf(&self, names: &[&str], usage: ExtendedKeyUsagePurpose) -> Leaf {
        self.leaf_with(names, vec![usage])
    }

    fn leaf_with(&self, names: &[&str], usages: Vec<ExtendedKeyUsagePurpose>) -> Leaf {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("leaf params");
        params.extended_key_usages = usages;
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("leaf certificate");
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// A directory holding `tls.crt`, `tls.key` and `ca.crt`, rewritten in place to rotate.
pub struct CertDir {
    pub dir: tempfile::TempDir,
}

impl CertDir {
    pub fn new(server: &Leaf, client_ca: &Ca) -> Self {
        let dir = Self {
            dir: tempfile::tempdir().expect("tempdir"),
        };
        dir.write(server, client_ca);
        dir
    }

    /// Replaces the files as a Kubernetes Secret volume does: new files, then one rename each.
    pub fn write(&self, server: &Leaf, client_ca: &Ca) {
        for (name, text) in [
            ("tls.crt", server.cert.as_str()),
            ("tls.key", server.key.as_str()),
            ("ca.crt", client_ca.pem().as_str()),
        ] {
            let staged = self.dir.path().join(format!(".{name}.new"));
            std::fs::write(&staged, text).expect("write certificate");
            std::fs::rename(&staged, self.path(name)).expect("rename certificate");
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn path_str(&self, name: &str) -> String {
        self.path(name).to_string_lossy().into_owned()
    }

    /// The settings that serve gRPC over TLS with this directory's certificate and key.
    pub fn tls_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("GRPC_SERVER_USE_TLS", "true".to_owned()),
            ("GRPC_SERVER_TLS_CERT", self.path_str("tls.crt")),
            ("GRPC_SERVER_TLS_KEY", self.path_str("tls.key")),
        ]
    }
}

/// `env` as [`crate::common::TestServer::start`] takes it.
pub fn borrowed<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(name, value)| (*name, value.as_str())).collect()
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write_file(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write file");
    path.to_string_lossy().into_owned()
}

/// A TLS channel to `addr` that trusts `ca`, expects the server certificate to name `localhost`, and presents
/// `identity` when given. Connection errors are returned, not unwrapped: refusals are what some tests
/// look for.
pub async fn tls_channel(
    addr: SocketAddr,
    ca: &Ca,
    identity: Option<&Leaf>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.pem()))
        .domain_name("localhost");
    if let Some(leaf) = identity {
        tls = tls.identity(Identity::from_pem(&leaf.cert, &leaf.key));
    }
    Channel::from_shared(format!("https://{addr}"))
        .expect("uri")
        .tls_config(tls)?
        .connect()
        .await
}
