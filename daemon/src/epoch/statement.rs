//! Building, signing and appending one statement: the one place a statement is made, used by
//! the epoch loop and by `rackwarden attest`. The time window runs from the previous
//! statement's end to now, and the limiter part is read from the kernel at signing time.

use ed25519_dalek::SigningKey;
use rackwarden_attest::{
    dsse,
    evidence::{EpochRun, ImageReport, Incident, ProducerIdentity, WipeReport},
    log::{EvidenceLog, LogError},
    statement::{Challenge, EpochPredicate, NextKey, Statement, Subject},
};

use rackwarden_attest::now_ms;

use crate::config::Config;

/// What an epoch contributes to its statement; the rest comes from the log and the kernel.
pub struct EpochEvidence {
    pub challenge: Challenge,
    pub wipe: Option<WipeReport>,
    /// Subjects (the loaded images) and the image report.
    pub images: Option<(Vec<Subject>, ImageReport)>,
    /// Incidents beyond the log's own (e.g. an interrupted epoch).
    pub incidents: Vec<Incident>,
    pub epoch: Option<EpochRun>,
}

/// Signs the next statement of `log` with `key`, appends it (fsynced) and returns it.
pub fn sign_and_append(
    cfg: &Config,
    log: &mut EvidenceLog,
    key: &SigningKey,
    producer: &ProducerIdentity,
    ev: EpochEvidence,
    next_key: Option<NextKey>,
) -> Result<Statement, LogError> {
    let now = now_ms();
    let start = log.tip.map(|t| t.epoch_end_unix_ms.min(now)).unwrap_or(now);
    let (seq, prev) = log.next_link();
    let mut incidents = log.pending_incidents.clone();
    incidents.extend(ev.incidents);
    let (subject, images) = match ev.images {
        Some((s, r)) => (s, Some(r)),
        None => (vec![], None),
    };
    let predicate = EpochPredicate {
        rack_id: cfg.rack_id.clone(),
        host_id: cfg.host_id.clone(),
        seq,
        prev,
        challenge: ev.challenge,
        epoch_start_unix_ms: start,
        epoch_end_unix_ms: now,
        limiter: crate::collect::limiter_report(cfg, start),
        wipe: ev.wipe,
        images,
        incidents,
        epoch: ev.epoch,
        producer: producer.clone(),
        next_key,
        root_of_trust: None,
    };
    let st = Statement::new(subject, predicate);
    let env = dsse::sign(key, dsse::INTOTO_PAYLOAD_TYPE, &st.to_json());
    log.append(&env, &st)?;
    Ok(st)
}
