//! The half of ingest that needs no database: a statement's envelope, signature, type and
//! attribution are checked here, outside the verifier's lock (concurrent requests prepare
//! in parallel). What remains (chain, nonce, policy) runs under the lock in `service`.

use std::collections::HashMap;

use ed25519_dalek::VerifyingKey;
use rackwarden_attest::{
    dsse::{self, Envelope, EnvelopeError, INTOTO_PAYLOAD_TYPE},
    statement::Statement,
};

use crate::store::HostKey;

/// keyid -> enrolled key (current and retired). Shared as a snapshot so that signatures can
/// be checked outside the verifier's lock, in parallel.
pub type KeyTable = HashMap<String, (HostKey, VerifyingKey)>;

/// A statement whose signature, type and attribution were checked.
pub struct Prepared {
    pub(crate) hk: HostKey,
    pub(crate) raw: Vec<u8>,
    pub(crate) statement: Statement,
    /// Hex SHA3-256 of the PAE bytes: the statement's identity in its host's chain.
    pub(crate) pae: String,
    /// The same digest as bytes: what the TPM quote beside the envelope must name.
    pub(crate) pae_sha3: [u8; 32],
    /// The TPM quote that came beside the envelope (not signed by the host key: the
    /// quote's own signature and qualifying data bind it).
    pub(crate) tpm: Option<rackwarden_attest::tpm::TpmSidecar>,
}

/// Why a statement is rejected before the database is asked. The text is the `reason` the
/// daemon receives.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("not a DSSE envelope: {0}")]
    NotEnvelope(#[source] serde_json::Error),
    /// No signature names an enrolled key (the key table may be older than an enrollment).
    #[error("signed by no enrolled key")]
    UnknownKey,
    #[error("signature: {0}")]
    Signature(#[source] EnvelopeError),
    #[error("statement: {0}")]
    Statement(String),
    #[error(
        "statement claims {claimed_rack}/{claimed_host} but the key is enrolled for {rack}/{host}"
    )]
    Misattributed {
        claimed_rack: String,
        claimed_host: String,
        rack: String,
        host: String,
    },
}

/// One statement of a batch as received, with what [`prepare`] made of it.
pub struct PreparedItem {
    pub raw: Vec<u8>,
    pub prepared: Result<Prepared, PrepareError>,
}

/// Signature and attribution: no database, no lock.
pub fn prepare(keys: &KeyTable, raw: &[u8]) -> Result<Prepared, PrepareError> {
    let env: Envelope = serde_json::from_slice(raw).map_err(PrepareError::NotEnvelope)?;
    // The keyid selects the candidate key; the signature decides.
    let (hk, vk) = env
        .signatures
        .iter()
        .find_map(|s| keys.get(&s.keyid))
        .ok_or(PrepareError::UnknownKey)?;
    let verified =
        dsse::verify_envelope(&env, vk, INTOTO_PAYLOAD_TYPE).map_err(PrepareError::Signature)?;
    let st = Statement::from_verified(&verified.payload)
        .map_err(|e| PrepareError::Statement(e.to_string()))?;
    let p = &st.predicate;
    if p.rack_id != hk.rack || p.host_id != hk.host {
        return Err(PrepareError::Misattributed {
            claimed_rack: p.rack_id.clone(),
            claimed_host: p.host_id.clone(),
            rack: hk.rack.clone(),
            host: hk.host.clone(),
        });
    }
    Ok(Prepared {
        hk: hk.clone(),
        raw: raw.to_vec(),
        pae: hex::encode(verified.pae_sha3),
        pae_sha3: verified.pae_sha3,
        statement: st,
        tpm: env.tpm,
    })
}

/// Prepares every statement of a batch.
pub fn prepare_all(keys: &KeyTable, items: Vec<Vec<u8>>) -> Vec<PreparedItem> {
    items
        .into_iter()
        .map(|raw| PreparedItem {
            prepared: prepare(keys, &raw),
            raw,
        })
        .collect()
}
