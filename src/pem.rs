//! PEM files as TLS needs them: a certificate chain (or a CA bundle) and a private key, each with the
//! reason a file is unusable. The gRPC listener's TLS and the xDS client's both read them here.

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Every certificate of a PEM file, or why there is none.
pub fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("unreadable PEM: {e}"))?;
    if certs.is_empty() {
        return Err("no PEM certificate in the file".into());
    }
    Ok(certs)
}

/// The private key of a PEM file, or why there is none.
pub fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| format!("no PEM private key: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_without_pem_of_their_kind_say_so() {
        assert_eq!(
            certificates(b"hello").expect_err("empty"),
            "no PEM certificate in the file"
        );
        assert!(
            private_key(b"hello")
                .expect_err("no key")
                .starts_with("no PEM private key")
        );
    }
}
