//! The error of every TPM structure parser and of the crypto built on them. Parse errors name the
//! structure, the field and the byte offset, so a bad blob from a host can be found by hand.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TpmError {
    #[error("{what}: {field} needs {need} bytes at byte {offset}, only {have} left")]
    Truncated {
        what: &'static str,
        field: &'static str,
        offset: usize,
        need: usize,
        have: usize,
    },
    #[error("{what}: {field} {got:#x} at byte {offset}, want {want:#x}")]
    Unexpected {
        what: &'static str,
        field: &'static str,
        offset: usize,
        got: u64,
        want: u64,
    },
    #[error("{what}: {field} at byte {offset}: {why}")]
    Invalid {
        what: &'static str,
        field: &'static str,
        offset: usize,
        why: String,
    },
    #[error("{what}: {count} trailing bytes at byte {offset}, want the structure to end there")]
    Trailing {
        what: &'static str,
        offset: usize,
        count: usize,
    },
    #[error("unsupported EK type ECC (0x0023): only RSA-2048 EKs are enrolled")]
    UnsupportedEccEk,
    #[error(
        "unsupported hash algorithm {0:#06x}: want SHA-1 (0x0004), SHA-256 (0x000b), SHA-384 (0x000c) or SHA-512 (0x000d)"
    )]
    UnsupportedHash(u16),
    #[error("AK name of {len} bytes: want a 2-byte hash algorithm and its digest ({want} bytes)")]
    BadName { len: usize, want: usize },
    #[error("credential of {len} bytes: at most the EK nameAlg's digest size, {max} bytes")]
    CredentialTooLong { len: usize, max: usize },
    #[error("symmetric key of {bytes} bytes: want 16 (AES-128) or 32 (AES-256)")]
    SymmetricKey { bytes: usize },
    #[error("RSA: {0}")]
    Rsa(String),
}

impl From<rsa::Error> for TpmError {
    fn from(e: rsa::Error) -> Self {
        // rsa::Error is not Clone/PartialEq; its text is what matters to the reader.
        TpmError::Rsa(e.to_string())
    }
}
