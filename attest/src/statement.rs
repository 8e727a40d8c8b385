//! The payload: an in-toto Statement v1 whose predicate is one epoch of this rack host.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::evidence::{
    EpochRun, ImageReport, Incident, LimiterReport, ProducerIdentity, WipeReport,
};

pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// Versioned predicate type of ours. A change of meaning gets a new version.
pub const PREDICATE_TYPE: &str = "https://rackwarden.dev/attestation/epoch/v1";
/// Digest name of image subjects (the file digest defined in the images part).
pub const IMAGE_DIGEST: &str = "merkle_sha3_256";
/// Digest name of the host subject: the SHA3-256 of the host's raw ed25519 public key (its
/// keyid).
pub const HOST_KEY_DIGEST: &str = "sha3_256_ed25519_public_key";
/// `prev` of the first statement.
pub const GENESIS_PREV: &str = "0000000000000000000000000000000000000000000000000000000000000000";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub type_: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: EpochPredicate,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subject {
    pub name: String,
    pub digest: BTreeMap<String, String>,
}

/// Freshness: the verifier's nonce, or an explicit statement that there was none.
/// Read in one pass (`crate::tagged`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Challenge {
    /// Hex of the 32-byte nonce the verifier issued for this epoch.
    Nonce {
        nonce: String,
    },
    Unchallenged,
}

impl crate::tagged::Tagged for Challenge {
    const TAG: &'static str = "kind";
    const VARIANTS: &'static [&'static str] = &["nonce", "unchallenged"];
    const EXPECTING: &'static str = "a challenge";
    fn variant<'de, D: serde::Deserializer<'de>>(
        index: usize,
        fields: D,
    ) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Nonce {
            nonce: String,
        }
        if index == 0 {
            Nonce::deserialize(fields).map(|n| Challenge::Nonce { nonce: n.nonce })
        } else {
            crate::tagged::NoFields::deserialize(fields).map(|_| Challenge::Unchallenged)
        }
    }
}

impl<'de> Deserialize<'de> for Challenge {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::tagged::deserialize(d)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochPredicate {
    pub rack_id: String,
    pub host_id: String,
    /// 0 for the first statement of a host, then +1 each.
    pub seq: u64,
    /// Lowercase hex SHA3-256 of the previous statement's PAE bytes; 64 zeros for seq 0.
    pub prev: String,
    pub challenge: Challenge,
    pub epoch_start_unix_ms: u64,
    pub epoch_end_unix_ms: u64,
    pub limiter: LimiterReport,
    /// Absent: no wipe was performed in this epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wipe: Option<WipeReport>,
    /// Absent: no images were loaded in this epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<ImageReport>,
    pub incidents: Vec<Incident>,
    /// How the epoch ran (trigger, phase times, downtime). Absent in statements not made by
    /// the epoch loop (`rackwarden attest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<EpochRun>,
    pub producer: ProducerIdentity,
    /// Key rotation: the host's next signing key, announced in a statement signed with the
    /// current one. From the next seq on the host signs with it. Absent (the bytes of
    /// statements without a rotation are unchanged) when no rotation is pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_key: Option<NextKey>,
    /// What the host says of its root of trust (a TPM, or none and why). Absent in statements
    /// of daemons older than issue 22; the verifier grants a level only from a quote it
    /// verified, never from this claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_of_trust: Option<crate::tpm::RootOfTrust>,
    /// Every place besides memory where state could survive the wipe, classed (issue 25).
    /// Absent in statements of daemons older than it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<crate::storage::StorageInventory>,
    /// The epoch's traffic, committed record by record (issue 27), where the host runs the
    /// tap (`[taps]`). Absent on hosts without it and in statements of older daemons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic: Option<crate::traffic::TrafficReport>,
    /// The openings of sampled epochs the verifier acknowledged since the host's previous
    /// statement (issue 27): each epoch and the SHA3-256 of the envelope sent. Absent when
    /// there are none, and in statements of older daemons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub openings: Vec<crate::traffic::OpeningsRef>,
}

/// The key a host rotates to (see [`EpochPredicate::next_key`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NextKey {
    /// Lowercase hex SHA3-256 of the raw public key (`keys::keyid`): must match the PEM.
    pub keyid: String,
    /// SPKI PEM of the ed25519 public key.
    pub public_key_pem: String,
}

impl Subject {
    /// The host itself, the subject of a statement that loaded no image: in-toto requires at
    /// least one subject with a digest (`in_toto_attestation` refuses an empty list), and an
    /// epoch's statement is evidence about its host. Named `host:<rack>/<host>`, digest the
    /// host key's keyid.
    pub fn host(rack_id: &str, host_id: &str, key: &ed25519_dalek::VerifyingKey) -> Subject {
        Subject {
            name: format!("host:{rack_id}/{host_id}"),
            digest: BTreeMap::from([(HOST_KEY_DIGEST.to_string(), crate::keys::keyid(key))]),
        }
    }
}

impl Statement {
    pub fn new(subject: Vec<Subject>, predicate: EpochPredicate) -> Statement {
        Statement {
            type_: STATEMENT_TYPE.into(),
            subject,
            predicate_type: PREDICATE_TYPE.into(),
            predicate,
        }
    }

    /// The payload bytes that are signed, written by `serde_json`. A failure is returned,
    /// never signed as an empty or partial payload.
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }

    /// Parses verified payload bytes and checks the fixed type fields.
    pub fn from_verified(payload: &[u8]) -> Result<Statement, StatementError> {
        // UTF-8 is checked once over the whole payload, so the parser need not check each
        // string again (a quarter of the parse). It refuses what `from_slice` refuses.
        let text = std::str::from_utf8(payload).map_err(|e| StatementError::NotUtf8 {
            offset: e.valid_up_to(),
        })?;
        let s: Statement = serde_json::from_str(text)?;
        if s.type_ != STATEMENT_TYPE {
            return Err(StatementError::Type {
                field: "_type",
                got: s.type_,
                want: STATEMENT_TYPE,
            });
        }
        if s.predicate_type != PREDICATE_TYPE {
            return Err(StatementError::Type {
                field: "predicateType",
                got: s.predicate_type,
                want: PREDICATE_TYPE,
            });
        }
        if s.predicate.epoch_end_unix_ms < s.predicate.epoch_start_unix_ms {
            return Err(StatementError::EndsBeforeStart);
        }
        let prev_ok = s.predicate.prev.len() == 64
            && s.predicate
                .prev
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !prev_ok {
            return Err(StatementError::PrevNotHex);
        }
        if s.predicate.seq == 0 && s.predicate.prev != GENESIS_PREV {
            return Err(StatementError::GenesisPrev);
        }
        Ok(s)
    }
}

/// Why verified payload bytes are not a statement of ours (the messages are the ones the
/// verifier stores in its refusals).
#[derive(Debug, thiserror::Error)]
pub enum StatementError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("the payload is not UTF-8 (byte offset {offset})")]
    NotUtf8 { offset: usize },
    #[error("{field} is `{got}`, expected `{want}`")]
    Type {
        field: &'static str,
        got: String,
        want: &'static str,
    },
    #[error("epoch ends before it starts")]
    EndsBeforeStart,
    #[error("`prev` is not 64 lowercase hex digits")]
    PrevNotHex,
    #[error("seq 0 must have the all-zero `prev`")]
    GenesisPrev,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_payload_that_is_not_utf8_is_refused_with_the_offset() {
        let mut payload = br#"{"_type":"x"}"#.to_vec();
        payload[10] = 0xff;
        let err = Statement::from_verified(&payload).unwrap_err();
        assert!(
            matches!(err, StatementError::NotUtf8 { offset: 10 }),
            "{err}"
        );
        assert_eq!(err.to_string(), "the payload is not UTF-8 (byte offset 10)");
    }
}
