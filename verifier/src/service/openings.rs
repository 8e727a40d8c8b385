//! Sampling after commitment (issue 27). [`Verifier::draw_sample`]: once a statement with a
//! traffic root is stored, 32 fresh random bytes are drawn and kept with the root and a
//! deadline; the ingest answer carries them to the host. [`Verifier::accept_openings`]:
//! `POST /v1/openings`, the host's signed answer, checked against the stored sample and root
//! ([`EpochOpenings::check`]) and kept with its outcome and receipt time, the stored inputs
//! of the traffic aspect. The opened bytes are cleared after `[policy.taps] keep_openings`.

use rackwarden_attest::{
    dsse::{self, Envelope, EnvelopeError},
    nonce::Nonce,
    statement::Statement,
    traffic::{
        EpochOpenings, OPENINGS_PAYLOAD_TYPE, OpeningsOutcome, OpeningsReceipt, SampleDemand,
        SpoolState, TrafficReport, raw_flows,
    },
};

use super::{Verifier, VerifierError};
use crate::store::{DbError, OpeningsRow, SampleRow};

/// Why `POST /v1/openings` was not kept. The text is the reason the host receives.
#[derive(Debug, thiserror::Error)]
pub enum OpeningsError {
    #[error("not a DSSE envelope: {0}")]
    NotEnvelope(String),
    #[error("signed by no enrolled key")]
    UnknownKey,
    #[error("signature: {0}")]
    Signature(EnvelopeError),
    #[error("payload: not traffic openings: {0}")]
    Malformed(String),
    #[error(
        "{rack}/{host} epoch {seq}: no sample was drawn for it (no traffic root stored, or the policy samples none)"
    )]
    NoSample {
        rack: String,
        host: String,
        seq: u64,
    },
    #[error(
        "{rack}/{host} epoch {seq}: already answered with openings {held}; a sample takes one answer"
    )]
    AlreadyAnswered {
        rack: String,
        host: String,
        seq: u64,
        held: String,
    },
    #[error("{0}")]
    Verifier(#[from] VerifierError),
}

impl From<DbError> for OpeningsError {
    fn from(e: DbError) -> Self {
        OpeningsError::Verifier(VerifierError::Db(e))
    }
}

impl Verifier {
    /// Draws and keeps the sample of a stored statement's traffic root: none for a
    /// statement without a committed root, a root with no bytes, records the host says it
    /// did not keep (`traffic_not_kept` already says so), or a policy drawing none.
    /// An epoch that has one already (a duplicate, a fork, a recheck) keeps it: the stored
    /// one is returned.
    pub(super) fn draw_sample(
        &self,
        rack: &str,
        host: &str,
        st: &Statement,
        now_ms: u64,
    ) -> Result<Option<SampleDemand>, VerifierError> {
        let taps = &self.policy.taps;
        let Some(TrafficReport::Committed {
            summary,
            spool: SpoolState::Kept { .. },
        }) = &st.predicate.traffic
        else {
            return Ok(None);
        };
        if taps.samples == 0 || summary.root.bytes == [0, 0] {
            return Ok(None);
        }
        let seq = st.predicate.seq;
        let randomness = *Nonce::random()?.as_bytes();
        self.store.insert_sample(&SampleRow {
            rack: rack.into(),
            host: host.into(),
            root: summary.root,
            demand: SampleDemand {
                epoch_seq: seq,
                randomness,
                per_direction: taps.samples,
                deadline_ms: now_ms.saturating_add(taps.opening_deadline.as_millis() as u64),
            },
            drawn_ms: now_ms,
        })?;
        Ok(self.store.sample(rack, host, seq)?.map(|s| s.demand))
    }

    /// `POST /v1/openings`: `raw` is a DSSE envelope of [`EpochOpenings`] signed by the
    /// host's enrolled key. Checked against the sample drawn for the epoch and the root it
    /// was drawn for, and kept, matched or refused, with its receipt time: the first answer
    /// stands (the same bytes again get the same receipt). Openings older than
    /// `keep_openings` lose their bytes here.
    pub fn accept_openings(
        &mut self,
        raw: &[u8],
        now_ms: u64,
    ) -> Result<OpeningsReceipt, OpeningsError> {
        let env: Envelope =
            serde_json::from_slice(raw).map_err(|e| OpeningsError::NotEnvelope(e.to_string()))?;
        let (hk, vk) = env
            .signatures
            .iter()
            .find_map(|s| self.keys.get(&s.keyid))
            .map(|(hk, vk)| (hk.clone(), *vk))
            .ok_or(OpeningsError::UnknownKey)?;
        let verified = dsse::verify_envelope(&env, &vk, OPENINGS_PAYLOAD_TYPE)
            .map_err(OpeningsError::Signature)?;
        // Parsed from the bytes the signature covers.
        let openings: EpochOpenings = serde_json::from_slice(&verified.payload)
            .map_err(|e| OpeningsError::Malformed(e.to_string()))?;
        let (rack, host, seq) = (hk.rack.clone(), hk.host.clone(), openings.epoch_seq);
        let Some(sample) = self.store.sample(&rack, &host, seq)? else {
            return Err(OpeningsError::NoSample { rack, host, seq });
        };
        let sha3_256 = rackwarden_attest::sha3(raw);
        if let Some(held) = self.store.openings(&rack, &host, seq)? {
            if held.sha3_256 == sha3_256 {
                return Ok(OpeningsReceipt {
                    epoch_seq: seq,
                    sha3_256,
                    outcome: held.outcome,
                });
            }
            return Err(OpeningsError::AlreadyAnswered {
                rack,
                host,
                seq,
                held: hex::encode(held.sha3_256),
            });
        }
        let outcome = match openings.check(&rack, &host, &sample.root, &sample.demand) {
            Ok(records) => OpeningsOutcome::Matched {
                records: records.len() as u64,
                raw_flows: raw_flows(&records),
            },
            Err(e) => OpeningsOutcome::Refused {
                reason: e.to_string(),
            },
        };
        if let OpeningsOutcome::Refused { reason } = &outcome {
            log::warn!("{rack}/{host} epoch {seq}: openings refused: {reason}");
        }
        let keep = self.policy.taps.keep_openings.as_millis() as u64;
        self.in_transaction(|v| {
            v.store.clear_old_openings(now_ms.saturating_sub(keep))?;
            // A concurrent answer (another instance) that got in first stands.
            if !v.store.insert_openings(&OpeningsRow {
                rack: rack.clone(),
                host: host.clone(),
                seq,
                sha3_256,
                received_ms: now_ms,
                outcome: outcome.clone(),
                envelope: Some(String::from_utf8_lossy(raw).into_owned()),
            })? {
                log::info!("{rack}/{host} epoch {seq}: another answer was kept first");
            }
            Ok(())
        })?;
        match self.store.openings(&rack, &host, seq)? {
            Some(held) if held.sha3_256 == sha3_256 => Ok(OpeningsReceipt {
                epoch_seq: seq,
                sha3_256,
                outcome: held.outcome,
            }),
            Some(held) => Err(OpeningsError::AlreadyAnswered {
                rack,
                host,
                seq,
                held: hex::encode(held.sha3_256),
            }),
            None => Err(OpeningsError::NoSample { rack, host, seq }),
        }
    }
}
