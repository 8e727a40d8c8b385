//! TLS for `serve` (rustls with the ring provider), and `tls-init`: a small CA and a server
//! certificate for a verifier that has none from its own PKI. Hosts then trust the CA
//! (`[verifier] ca`) or pin the server certificate (`[verifier] pinned_cert`).

use std::{path::Path, sync::Arc};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {what}")]
    File { path: String, what: String },
    #[error("TLS configuration: {0}")]
    Config(String),
    #[error("certificate generation: {0}")]
    Generate(String),
}

fn file_error(path: &Path, what: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        what: what.to_string(),
    }
}

/// The server side: the chain (leaf first) and the key, both PEM. HTTP/1.1 only.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| file_error(cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(cert, format!("not a PEM certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(file_error(cert, "holds no CERTIFICATE block"));
    }
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| file_error(key, format!("not a PEM private key: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| TlsError::Config(format!("{} and {}: {e}", cert.display(), key.display())))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// What `tls-init` writes.
pub struct GeneratedTls {
    /// The CA's certificate: what hosts trust (`[verifier] ca`).
    pub ca_pem: String,
    /// The server's certificate (signed by the CA) followed by the CA's: `tls_cert`.
    pub chain_pem: String,
    /// The server's certificate alone: what a host pins (`[verifier] pinned_cert`).
    pub leaf_pem: String,
    /// The server's private key: `tls_key`.
    pub key_pem: String,
}

/// A fresh CA (its key is used once and dropped: a rotation is a new `tls-init`) and a
/// server certificate for `names` (DNS names or IP addresses), valid for ten years.
pub fn generate(names: &[String]) -> Result<GeneratedTls, TlsError> {
    use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair};
    let g = |e: rcgen::Error| TlsError::Generate(e.to_string());
    if names.is_empty() {
        return Err(TlsError::Generate(
            "name at least one DNS name or IP address the hosts use to reach the verifier".into(),
        ));
    }
    let now = std::time::SystemTime::now();
    let ten_years = std::time::Duration::from_secs(10 * 365 * 86_400);
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(g)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name
        .push(DnType::CommonName, "rackwarden verifier CA");
    ca.not_before = now.into();
    ca.not_after = (now + ten_years).into();
    let ca_key = KeyPair::generate().map_err(g)?;
    let ca_cert = ca.self_signed(&ca_key).map_err(g)?;
    let mut leaf = CertificateParams::new(names.to_vec()).map_err(g)?;
    leaf.distinguished_name = DistinguishedName::new();
    leaf.distinguished_name
        .push(DnType::CommonName, names[0].clone());
    leaf.not_before = now.into();
    leaf.not_after = (now + ten_years).into();
    let leaf_key = KeyPair::generate().map_err(g)?;
    let leaf_cert = leaf.signed_by(&leaf_key, &ca_cert, &ca_key).map_err(g)?;
    Ok(GeneratedTls {
        ca_pem: ca_cert.pem(),
        chain_pem: format!("{}{}", leaf_cert.pem(), ca_cert.pem()),
        leaf_pem: leaf_cert.pem(),
        key_pem: leaf_key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_files_load_and_bad_files_name_themselves() {
        let dir = std::env::temp_dir().join(format!("rw-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let g = generate(&["127.0.0.1".into(), "verifier.test".into()]).unwrap();
        let (c, k) = (dir.join("server.pem"), dir.join("server.key"));
        std::fs::write(&c, &g.chain_pem).unwrap();
        std::fs::write(&k, &g.key_pem).unwrap();
        server_config(&c, &k).unwrap();
        std::fs::write(&k, "not a key").unwrap();
        let e = server_config(&c, &k).unwrap_err().to_string();
        assert!(e.contains("server.key") && e.contains("private key"), "{e}");
        let e = server_config(&dir.join("missing.pem"), &k)
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.pem"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
