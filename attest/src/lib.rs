//! rackwarden-attest: the evidence format, shared by the daemon (which signs) and the
//! verifier (which checks). Pure and I/O-light: only [`evidence_log`] and [`keys`] touch files.
//!
//! - [`dsse`]: DSSE v1 envelopes, PAE, signing and verification (where a signature is made
//!   and checked);
//! - [`keys`]: ed25519 keys as PKCS#8 / SPKI PEM, keyids;
//! - [`statement`]: the in-toto Statement v1 and our epoch predicate;
//! - [`evidence`]: the typed parts of the predicate (limiter, gaps, wipes, images);
//! - [`evidence_log`]: the append-only local evidence log with torn-tail detection;
//! - [`merkle`]: the `merkle_sha3_256` file digest; [`manifest`]: the signed image manifest;
//! - [`nonce`]: the challenge nonce (parsed and generated in one place);
//! - [`verify`]: checking a whole log (signatures, chain, time) line by line;
//! - [`result`]: the verifier's verdict on a statement (status, findings, aspects);
//! - [`api`]: the daemon-verifier protocol (challenge, ingest response, error body);
//! - [`tlog`]: the transparency log (RFC 6962 hashing, proofs, signed checkpoints, tiles).

pub mod api;
pub mod budget;
pub mod config_error;
pub mod dsse;
pub mod error_chain;
pub mod evidence;
pub mod evidence_log;
pub mod keys;
pub mod manifest;
pub mod merkle;
pub mod nonce;
pub mod result;
pub mod sampling_key;
pub mod schema;
pub mod statement;
pub mod storage;
mod tagged;
pub mod tlog;
pub mod tpm;
pub mod traffic;
pub mod units;
pub mod verify;

/// The SHA3-256 every part of rackwarden uses (chain links, keyids, image digests, wipe
/// streams): RustCrypto's `sha3`, through the `digest` traits.
pub use sha3::{Digest, Sha3_256};

/// SHA3-256 of `data`.
pub fn sha3(data: &[u8]) -> [u8; 32] {
    Sha3_256::digest(data).into()
}

/// Now, in unix milliseconds (the time unit of every statement, gap and nonce).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
