//! The key a verifiable serving stack's sampler seeds derive from (`rackwarden-sampler`,
//! `docs/sampler.md`): for the requests of epoch `N`, fixed by statement `N - 1`, so that
//! the verifier can derive it from the chain and the host cannot choose it.
//!
//! - Statement `N - 1` answered a verifier nonce: the key is that nonce's 32 bytes. The
//!   verifier drew it; the host learnt it when the epoch before began and cannot vary it.
//! - It answered none (`unchallenged`): the key is SHA3-256 of [`SAMPLING_KEY_DOMAIN`] and
//!   its chain link (the PAE digest). The host could grind it by rewriting that statement,
//!   which the verifier already finds `unchallenged`.
//! - Epoch 0 has no statement before it: SHA3-256 of the domain and 32 zero bytes.

use serde::{Deserialize, Serialize};

use crate::{Digest, Sha3_256, statement::Challenge};

/// The first bytes of the key derived from a chain link (`rackwarden/sampling-key/v1` and a
/// NUL).
pub const SAMPLING_KEY_DOMAIN: &[u8] = b"rackwarden/sampling-key/v1\0";

/// Where a key comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeySource {
    /// The previous statement's verifier nonce.
    VerifierNonce,
    /// The previous statement's chain link (it answered no nonce), or the genesis.
    Chain,
}

/// The key of the requests of epoch `epoch_seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingKey {
    pub epoch_seq: u64,
    #[serde(with = "crate::traffic::hex32_wire")]
    pub key: [u8; 32],
    pub source: KeySource,
}

fn from_link(link: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha3_256::new();
    h.update(SAMPLING_KEY_DOMAIN);
    h.update(link);
    h.finalize().into()
}

/// The key of epoch `prev_seq + 1`, from statement `prev_seq`'s challenge and chain link.
pub fn sampling_key(
    prev_seq: u64,
    prev_challenge: &Challenge,
    prev_link: &[u8; 32],
) -> SamplingKey {
    let epoch_seq = prev_seq + 1;
    if let Challenge::Nonce { nonce } = prev_challenge
        && let Ok(bytes) = hex::decode(nonce)
        && let Ok(key) = <[u8; 32]>::try_from(bytes.as_slice())
    {
        return SamplingKey {
            epoch_seq,
            key,
            source: KeySource::VerifierNonce,
        };
    }
    SamplingKey {
        epoch_seq,
        key: from_link(prev_link),
        source: KeySource::Chain,
    }
}

/// The key of epoch 0.
pub fn genesis_sampling_key() -> SamplingKey {
    SamplingKey {
        epoch_seq: 0,
        key: from_link(&[0; 32]),
        source: KeySource::Chain,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nonce_is_the_key_and_the_link_stands_in_without_one() {
        let nonce = "ab".repeat(32);
        let k = sampling_key(4, &Challenge::Nonce { nonce }, &[1; 32]);
        assert_eq!(
            (k.epoch_seq, k.key, k.source),
            (5, [0xab; 32], KeySource::VerifierNonce)
        );
        let u = sampling_key(4, &Challenge::Unchallenged, &[1; 32]);
        assert_eq!(u.source, KeySource::Chain);
        assert_ne!(
            u.key,
            sampling_key(4, &Challenge::Unchallenged, &[2; 32]).key
        );
        assert_eq!(genesis_sampling_key().epoch_seq, 0);
        let j = serde_json::to_string(&k).unwrap();
        assert_eq!(
            j,
            format!(
                "{{\"epoch_seq\":5,\"key\":\"{}\",\"source\":\"verifier_nonce\"}}",
                "ab".repeat(32)
            )
        );
        assert_eq!(serde_json::from_str::<SamplingKey>(&j).unwrap(), k);
    }
}
