//! Building, signing and appending one statement: the one place a statement is made, used by
//! the epoch loop and by `rackwarden attest`. The time window runs from the previous
//! statement's end to now, and the limiter part is read from the kernel at signing time.
//!
//! The epoch loop appends through an [`AttestedLog`]: each statement states the host's root
//! of trust, and once signed it is quoted by the TPM over its chain digest (the value the
//! next statement names as `prev`, which the verifier recomputes), the quote and the IMA
//! entries it covers going beside the envelope in its log line.

use ed25519_dalek::SigningKey;
use rackwarden_attest::{
    dsse,
    evidence::{EpochRun, ImageReport, Incident, ProducerIdentity, WipeReport},
    evidence_log::{EvidenceLog, LogError},
    statement::{Challenge, EpochPredicate, NextKey, Statement, Subject},
    tpm::{RootOfTrust, TpmSidecar},
};

use rackwarden_attest::now_ms;

use crate::{config::Config, tpm::Attestor};

/// Where a statement is appended, and what the host's root of trust adds to it.
pub trait StatementLog {
    fn evidence_log(&mut self) -> &mut EvidenceLog;
    /// What the statement says about the root of trust; `None` says nothing (as statements
    /// did before issue 22).
    fn root_of_trust(&self) -> Option<RootOfTrust>;
    /// The TPM's evidence over the signed statement whose chain digest is `chain_digest`.
    fn quote(&self, chain_digest: &[u8; 32]) -> Option<TpmSidecar>;
}

/// A bare log (`rackwarden attest`): no root of trust is stated, nothing is quoted.
impl StatementLog for EvidenceLog {
    fn evidence_log(&mut self) -> &mut EvidenceLog {
        self
    }
    fn root_of_trust(&self) -> Option<RootOfTrust> {
        None
    }
    fn quote(&self, _chain_digest: &[u8; 32]) -> Option<TpmSidecar> {
        None
    }
}

/// The evidence log as the epoch loop appends to it: every statement states the root of
/// trust and carries the TPM's quote over it where there is a TPM. It reads as the log it
/// wraps; reopening the log (after a failed write) wraps the new one with the same
/// [`Attestor`], so the TPM and its IMA cursor outlive it.
pub struct AttestedLog {
    log: EvidenceLog,
    attestor: Attestor,
}

impl AttestedLog {
    pub fn new(log: EvidenceLog, attestor: Attestor) -> AttestedLog {
        AttestedLog { log, attestor }
    }
}

impl std::ops::Deref for AttestedLog {
    type Target = EvidenceLog;
    fn deref(&self) -> &EvidenceLog {
        &self.log
    }
}

impl std::ops::DerefMut for AttestedLog {
    fn deref_mut(&mut self) -> &mut EvidenceLog {
        &mut self.log
    }
}

impl StatementLog for AttestedLog {
    fn evidence_log(&mut self) -> &mut EvidenceLog {
        &mut self.log
    }
    fn root_of_trust(&self) -> Option<RootOfTrust> {
        Some(self.attestor.root_of_trust().clone())
    }
    fn quote(&self, chain_digest: &[u8; 32]) -> Option<TpmSidecar> {
        self.attestor.quote(chain_digest)
    }
}

/// What an epoch contributes to its statement; the rest comes from the log and the kernel.
pub struct EpochEvidence {
    pub challenge: Challenge,
    pub wipe: Option<WipeReport>,
    /// Subjects (the loaded images) and the image report.
    pub images: Option<(Vec<Subject>, ImageReport)>,
    /// Incidents beyond the log's own (e.g. an interrupted epoch).
    pub incidents: Vec<Incident>,
    pub epoch: Option<EpochRun>,
    /// What the epoch did to storage before the wipe (swap turned off, volumes erased by
    /// key): the storage inventory carries it.
    pub storage: crate::storage::EpochStorage,
    /// The epoch's traffic as the tap committed it (`[taps]`); `None` without the tap.
    pub traffic: Option<rackwarden_attest::traffic::TrafficReport>,
    /// The openings the verifier acknowledged since the previous statement.
    pub openings: Vec<rackwarden_attest::traffic::OpeningsRef>,
}

/// Signs the next statement of `log` with `key`, quotes it where `log` has a TPM, appends it
/// (fsynced) and returns it.
pub fn sign_and_append<L: StatementLog>(
    cfg: &Config,
    log: &mut L,
    key: &SigningKey,
    producer: &ProducerIdentity,
    ev: EpochEvidence,
    next_key: Option<NextKey>,
) -> Result<Statement, LogError> {
    let root_of_trust = log.root_of_trust();
    let elog = log.evidence_log();
    let now = now_ms();
    let start = elog
        .tip
        .map(|t| t.epoch_end_unix_ms.min(now))
        .unwrap_or(now);
    let (seq, prev) = elog.next_link();
    let mut incidents = elog.pending_incidents.clone();
    incidents.extend(ev.incidents);
    let (subject, images) = match ev.images {
        Some((s, r)) => (s, Some(r)),
        // No image loaded: the host itself is the subject (in-toto wants at least one).
        None => (
            vec![Subject::host(
                &cfg.rack_id,
                &cfg.host_id,
                &key.verifying_key(),
            )],
            None,
        ),
    };
    let predicate = EpochPredicate {
        rack_id: cfg.rack_id.clone(),
        host_id: cfg.host_id.clone(),
        seq,
        prev,
        challenge: ev.challenge,
        epoch_start_unix_ms: start,
        epoch_end_unix_ms: now,
        limiter: crate::host_evidence::limiter_report(cfg, start),
        wipe: ev.wipe,
        images,
        incidents,
        epoch: ev.epoch,
        producer: producer.clone(),
        next_key,
        root_of_trust,
        // Taken now, after the wipe: what could carry state into the next epoch.
        storage: Some(crate::storage::take(ev.storage)),
        traffic: ev.traffic,
        openings: ev.openings,
    };
    let st = Statement::new(subject, predicate);
    let payload = st
        .to_json()
        .map_err(|e| LogError::unserialisable(elog.path(), "statement", e))?;
    let (mut env, link) = dsse::sign_chained(key, dsse::INTOTO_PAYLOAD_TYPE, &payload);
    // Beside the envelope, not in it: the quote is over the signed bytes.
    env.tpm = log.quote(&link);
    log.evidence_log().append_linked(&env, &st, link)?;
    Ok(st)
}
