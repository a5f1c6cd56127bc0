//! TLS and mTLS on the gRPC listener (`GRPC_SERVER_USE_TLS`), with the certificate, key and client CA
//! re-read when their files change.
//!
//! Envoy Gateway rotates the rate limit service's certificate by rewriting the mounted Secret, and
//! envoyproxy/ratelimit picks the new one up without a restart; so does this. [`ServerTls`] holds the
//! current rustls configuration behind an [`ArcSwap`]: every handshake takes the configuration of the
//! moment, so a rotation applies to new connections while established ones keep the session they
//! negotiated (nothing is dropped).
//!
//! Client certificates (`GRPC_CLIENT_TLS_CACERT`) are verified by webpki against that CA and must carry
//! the client-authentication usage; `GRPC_CLIENT_TLS_SAN` additionally requires that DNS name (or IP
//! address) among the certificate's subject alternative names, as the Go service checks it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use tokio_util::sync::CancellationToken;

use crate::pem::{certificates, private_key};

/// Where the gRPC listener's TLS material lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// `GRPC_SERVER_TLS_CERT`: the server's certificate chain (PEM).
    pub cert: PathBuf,
    /// `GRPC_SERVER_TLS_KEY`: its private key (PEM).
    pub key: PathBuf,
    /// `GRPC_CLIENT_TLS_CACERT`: when set, clients must present a certificate signed by this CA (PEM).
    pub client_ca: Option<PathBuf>,
    /// `GRPC_CLIENT_TLS_SAN`: when set (with a client CA), the client certificate must name it.
    pub client_san: Option<String>,
}

/// Why the TLS material could not make a server configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// Which file (`GRPC_SERVER_TLS_CERT`...).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no usable PEM of the expected kind.
    #[error("{what} {path}: {reason}")]
    Pem {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// rustls refused the combination (a key that does not match the certificate, a bad CA).
    #[error("{0}")]
    Config(String),
    /// `GRPC_CLIENT_TLS_SAN` is neither a DNS name nor an IP address.
    #[error("GRPC_CLIENT_TLS_SAN {0:?} is not a DNS name or an IP address")]
    San(String),
    /// `GRPC_CLIENT_TLS_SAN` without a client CA would check nothing.
    #[error(
        "GRPC_CLIENT_TLS_SAN needs GRPC_CLIENT_TLS_CACERT: without client certificates there is no SAN to check"
    )]
    SanWithoutCa,
}

/// The gRPC listener's TLS configuration, reloadable.
#[derive(Debug)]
pub struct ServerTls {
    files: TlsFiles,
    current: ArcSwap<ServerConfig>,
    /// Hash of the files the current configuration (or the last refused attempt) was built from, so an
    /// unchanged set is not rebuilt and a broken one is reported once.
    seen: Mutex<[u8; 32]>,
}

impl ServerTls {
    /// Reads the files and builds the configuration; fails naming the file and the reason.
    pub fn load(files: TlsFiles) -> Result<Self, TlsError> {
        if files.client_san.is_some() && files.client_ca.is_none() {
            return Err(TlsError::SanWithoutCa);
        }
        let material = Material::read(&files)?;
        let config = material.server_config(&files)?;
        Ok(Self {
            seen: Mutex::new(material.fingerprint()),
            current: ArcSwap::from_pointee(config),
            files,
        })
    }

    /// The configuration new handshakes use.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current.load_full()
    }

    /// Re-reads the files; when they changed and make a valid configuration, new handshakes use it.
    /// Returns whether the configuration was replaced. A set that does not load (a rotation caught
    /// between the certificate and the key being written) keeps the current configuration and is
    /// retried at the next call; the error is returned once per distinct set of files.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let material = Material::read(&self.files)?;
        let fingerprint = material.fingerprint();
        {
            let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
            if *seen == fingerprint {
                return Ok(false);
            }
            *seen = fingerprint;
        }
        let config = material.server_config(&self.files)?;
        self.current.store(Arc::new(config));
        Ok(true)
    }

    /// Reloads every `interval` until `stop`, logging what changed.
    pub async fn watch(self: Arc<Self>, interval: Duration, stop: CancellationToken) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        // A file that cannot be read is logged when it starts failing, not on every poll.
        let mut unreadable = false;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = ticker.tick() => {}
            }
            match self.reload() {
                Ok(true) => {
                    unreadable = false;
                    tracing::info!(cert = %self.files.cert.display(), "gRPC TLS certificates reloaded");
                }
                Ok(false) => unreadable = false,
                Err(error @ TlsError::Read { .. }) => {
                    if !unreadable {
                        tracing::error!(%error, "gRPC TLS certificates not reloaded; keeping the current ones");
                    }
                    unreadable = true;
                }
                Err(error) => {
                    tracing::error!(%error, "gRPC TLS certificates not reloaded; keeping the current ones");
                }
            }
        }
    }
}

/// The bytes of every TLS file, read once.
struct Material {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl Material {
    fn read(files: &TlsFiles) -> Result<Self, TlsError> {
        let read = |what: &'static str, path: &Path| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                what,
                path: path.to_owned(),
                source,
            })
        };
        Ok(Self {
            cert: read("GRPC_SERVER_TLS_CERT", &files.cert)?,
            key: read("GRPC_SERVER_TLS_KEY", &files.key)?,
            client_ca: files
                .client_ca
                .as_deref()
                .map(|path| read("GRPC_CLIENT_TLS_CACERT", path))
                .transpose()?,
        })
    }

    fn fingerprint(&self) -> [u8; 32] {
        let mut hasher = blake3::Hasher::new();
        for part in [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()] {
            let bytes = part.map_or(&[][..], Vec::as_slice);
            hasher.update(&(bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        }
        *hasher.finalize().as_bytes()
    }

    fn server_config(&self, files: &TlsFiles) -> Result<ServerConfig, TlsError> {
        let pem_error = |what: &'static str, path: &Path, reason: String| TlsError::Pem {
            what,
            path: path.to_owned(),
            reason,
        };
        let chain = certificates(&self.cert)
            .map_err(|reason| pem_error("GRPC_SERVER_TLS_CERT", &files.cert, reason))?;
        let key =
            private_key(&self.key).map_err(|reason| pem_error("GRPC_SERVER_TLS_KEY", &files.key, reason))?;
        let builder = ServerConfig::builder();
        let builder = match (&self.client_ca, &files.client_ca) {
            (Some(ca), Some(path)) => {
                let mut roots = RootCertStore::empty();
                for cert in certificates(ca).map_err(|r| pem_error("GRPC_CLIENT_TLS_CACERT", path, r))? {
                    roots
                        .add(cert)
                        .map_err(|e| pem_error("GRPC_CLIENT_TLS_CACERT", path, e.to_string()))?;
                }
                let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                    .build()
                    .map_err(|e| pem_error("GRPC_CLIENT_TLS_CACERT", path, e.to_string()))?;
                let verifier = match &files.client_san {
                    Some(san) => Arc::new(RequireSan::new(verifier, san)?),
                    None => verifier,
                };
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| {
            TlsError::Config(format!("the certificate and key do not make a TLS server: {e}"))
        })?;
        // gRPC is HTTP/2 only; Envoy and gRPC clients offer `h2` through ALPN and expect it chosen.
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }
}

/// A client verifier that also requires a subject alternative name (`GRPC_CLIENT_TLS_SAN`).
#[derive(Debug)]
struct RequireSan {
    chain: Arc<dyn ClientCertVerifier>,
    san: ServerName<'static>,
}

impl RequireSan {
    fn new(chain: Arc<dyn ClientCertVerifier>, san: &str) -> Result<Self, TlsError> {
        let san = ServerName::try_from(san.to_owned()).map_err(|_| TlsError::San(san.to_owned()))?;
        Ok(Self { chain, san })
    }
}

impl ClientCertVerifier for RequireSan {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.chain.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.chain.verify_client_cert(end_entity, intermediates, now)?;
        // The chain is valid; only now is the leaf parsed again for its names.
        let leaf = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        leaf.verify_is_valid_for_subject_name(&self.san)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::NotValidForName))?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}
