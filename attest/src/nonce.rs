//! The verifier's 32-byte challenge nonce: generated and parsed here only, so the daemon,
//! the CLI and the verifier agree on one form (64 lowercase hex digits on the wire).

use std::{fmt, str::FromStr};

use rand_core::{OsRng, RngCore};

pub const NONCE_LEN: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Nonce([u8; NONCE_LEN]);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NonceError {
    #[error("a nonce is 64 hex digits (32 bytes); this one has {0} characters")]
    Length(usize),
    #[error("a nonce is 64 hex digits; `{0}` is not hex")]
    NotHex(String),
    #[error("the operating system's random source failed: {0}")]
    Random(String),
}

impl Nonce {
    /// A fresh nonce from the operating system's CSPRNG (getrandom).
    pub fn random() -> Result<Nonce, NonceError> {
        let mut n = [0u8; NONCE_LEN];
        OsRng
            .try_fill_bytes(&mut n)
            .map_err(|e| NonceError::Random(e.to_string()))?;
        Ok(Nonce(n))
    }

    pub fn from_bytes(b: [u8; NONCE_LEN]) -> Nonce {
        Nonce(b)
    }

    pub fn as_bytes(&self) -> &[u8; NONCE_LEN] {
        &self.0
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl FromStr for Nonce {
    type Err = NonceError;
    fn from_str(s: &str) -> Result<Nonce, NonceError> {
        let s = s.trim();
        if s.len() != 2 * NONCE_LEN {
            return Err(NonceError::Length(s.len()));
        }
        let mut n = [0u8; NONCE_LEN];
        hex::decode_to_slice(s, &mut n).map_err(|_| NonceError::NotHex(s.into()))?;
        Ok(Nonce(n))
    }
}

impl fmt::Display for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors() {
        let n = Nonce::random().unwrap();
        assert_eq!(n.to_hex().parse::<Nonce>().unwrap(), n);
        assert_ne!(Nonce::random().unwrap(), n);
        assert_eq!("ab".parse::<Nonce>(), Err(NonceError::Length(2)));
        let bad = "zz".repeat(32);
        assert!(matches!(bad.parse::<Nonce>(), Err(NonceError::NotHex(_))));
        let upper = "AB".repeat(32);
        assert_eq!(upper.parse::<Nonce>().unwrap().to_hex(), "ab".repeat(32));
    }
}
