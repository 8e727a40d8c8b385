//! The one place the daemon's HTTP client to the verifier is built: challenges and delivery
//! both use it. Over https the verifier's certificate is checked against the configured CA
//! (chain and host name, by webpki) or must be exactly the pinned certificate; plain http is
//! accepted by the config only to a loopback address.

use std::{sync::Arc, time::Duration};

use rustls::{
    DigitallySignedStruct, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::{CryptoProvider, WebPkiSupportedAlgorithms},
    pki_types::{CertificateDer, ServerName, UnixTime},
};

use crate::config::epoch::{VerifierEndpoint, VerifierTrust};

/// Why the client to the verifier could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("{}: {source}", path.display())]
    CaCertificate {
        path: std::path::PathBuf,
        source: rustls::Error,
    },
    #[error("TLS: {0}")]
    Tls(rustls::Error),
    #[error("HTTP client: {0}")]
    Client(reqwest::Error),
}

/// A blocking client for `ep` whose requests time out after `timeout`.
pub fn client(
    ep: &VerifierEndpoint,
    timeout: Duration,
) -> Result<reqwest::blocking::Client, TransportError> {
    let b = reqwest::blocking::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout);
    let b = match &ep.trust {
        VerifierTrust::PlainLoopback => b,
        VerifierTrust::Ca { path, certs } => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certs {
                roots
                    .add(CertificateDer::from(c.clone()))
                    .map_err(|source| TransportError::CaCertificate {
                        path: path.clone(),
                        source,
                    })?;
            }
            b.use_preconfigured_tls(tls_config(|builder| {
                builder.with_root_certificates(roots).with_no_client_auth()
            })?)
        }
        VerifierTrust::Pinned { cert, .. } => {
            let provider = provider();
            let pinned = Arc::new(PinnedCert {
                der: cert.clone(),
                algorithms: provider.signature_verification_algorithms,
            });
            b.use_preconfigured_tls(tls_config(|builder| {
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(pinned)
                    .with_no_client_auth()
            })?)
        }
    };
    b.build().map_err(TransportError::Client)
}

/// An error with its causes (reqwest's own message hides them: a refused certificate reads
/// as "error sending request"), as one line: `a: b: c`.
pub fn describe(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out = format!("{out}: {text}");
        }
        cause = c.source();
    }
    out
}

fn provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

fn tls_config(
    finish: impl FnOnce(
        rustls::ConfigBuilder<rustls::ClientConfig, rustls::WantsVerifier>,
    ) -> rustls::ClientConfig,
) -> Result<rustls::ClientConfig, TransportError> {
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(provider()))
        .with_safe_default_protocol_versions()
        .map_err(TransportError::Tls)?;
    let mut cfg = finish(builder);
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Accepts exactly one certificate; the handshake's signatures are still verified with its
/// key, so only the holder of the pinned certificate's private key gets through.
#[derive(Debug)]
struct PinnedCert {
    der: Vec<u8>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PinnedCert {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.der.as_slice() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
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
