//! What the store knows that a statement is judged against, loaded before appraisal (see
//! `appraisal::Context`).

use rackwarden_attest::statement::{Challenge, Statement};
use rackwarden_attest::tpm::TpmSidecar;

use crate::{
    appraisal::{
        Context, NonceLookup, replay::ReplayContext, tpm::TpmContext, traffic::TrafficContext,
    },
    store::{DbError, HostKey, JudgingQuery, Store},
};

/// Loads the context of `st`, signed by `hk`, whose PAE digest is `pae` (`pae_sha3` as
/// bytes), with the TPM quote that came beside it.
pub fn load(
    store: &Store,
    hk: &HostKey,
    st: &Statement,
    pae: &str,
    pae_sha3: [u8; 32],
    sidecar: Option<TpmSidecar>,
) -> Result<Context, DbError> {
    let p = &st.predicate;
    // What every statement needs, at once (one round trip on PostgreSQL); what depends on
    // those rows (the last statement before a gap, the baseline's nonce, a rotated key's
    // first enrolment) is asked after, and only when it is needed.
    let rows = store.judging_rows(&JudgingQuery {
        rack: &hk.rack,
        host: &hk.host,
        seq: p.seq,
        keyid: &hk.keyid,
        next_keyid: p.next_key.as_ref().map(|nk| nk.keyid.as_str()),
        nonce: match &p.challenge {
            Challenge::Nonce { nonce } => Some(nonce.as_str()),
            Challenge::Unchallenged => None,
        },
    })?;
    let same_seq_others = rows.same_seq.iter().filter(|s| s.pae_sha3 != pae).count();
    let preds = rows.predecessors;
    // The byte bound holds against the last statement before this one, over the whole
    // elapsed time, across a gap too: a skipped seq must not skip the budget check.
    let baseline = match preds.iter().find(|s| s.pae_sha3 == p.prev) {
        Some(x) => x.statement(),
        None if p.seq > 0 => store
            .before(&hk.rack, &hk.host, p.seq)?
            .as_ref()
            .and_then(|s| s.statement()),
        None => None,
    };
    let baseline_earliest_end_ms = match baseline.as_ref().map(|b| &b.predicate) {
        Some(b) => match &b.challenge {
            Challenge::Nonce { nonce } => store
                .nonce(nonce)?
                .filter(|n| n.rack == b.rack_id && n.host == b.host_id)
                .map(|n| n.issued_ms),
            Challenge::Unchallenged => None,
        },
        None => None,
    };
    let nonce = match (&p.challenge, rows.nonce) {
        (Challenge::Unchallenged, _) => NonceLookup::NotNamed,
        (Challenge::Nonce { .. }, None) => NonceLookup::Unknown,
        (Challenge::Nonce { .. }, Some(n)) => NonceLookup::Found(n),
    };
    // Read from the store, not the cached key table: a key retired with the CLI (or
    // rotated away from by an earlier statement) while the service runs is retired at once.
    let row = rows.key.as_ref().unwrap_or(hk);
    let next_key_enrolled = rows.next_key;
    // The samples whose deadline fell in this epoch: after the last stored statement before
    // this one ended, up to this one's end.
    let after_ms = baseline
        .as_ref()
        .map_or(0, |b| b.predicate.epoch_end_unix_ms);
    let traffic = TrafficContext {
        due: store.samples_due(&hk.rack, &hk.host, after_ms, p.epoch_end_unix_ms)?,
        named: p
            .openings
            .iter()
            .map(|r| Ok((*r, store.openings(&hk.rack, &hk.host, r.epoch_seq)?)))
            .collect::<Result<_, DbError>>()?,
    };
    let replay = ReplayContext {
        replays: store.replays_between(&hk.rack, &hk.host, after_ms, p.epoch_end_unix_ms)?,
    };
    // Only a statement with a quote can be judged by a boot.
    let boot = match &sidecar {
        Some(_) => store.tpm_boot(&hk.rack, &hk.host)?,
        None => None,
    };
    Ok(Context {
        keyid: hk.keyid.clone(),
        retired_ms: row.retired_ms,
        from_seq: row.from_seq,
        retired_after_seq: row.retired_after_seq,
        next_key_enrolled,
        // A key the host rotated to does not restart its clocks: they count from the
        // enrollment it rotated from (an operator's enrollment of a new key does, as before).
        enrolled_ms: match row.from_seq {
            Some(_) => store
                .host_first_enrolled_ms(&hk.rack, &hk.host)?
                .unwrap_or(hk.enrolled_ms),
            None => hk.enrolled_ms,
        },
        same_seq_others,
        predecessors: preds
            .into_iter()
            .map(|s| (s.pae_sha3, s.epoch_end_ms))
            .collect(),
        baseline,
        baseline_earliest_end_ms,
        nonce,
        last_wipe_ms: rows.last_wipe_ms,
        tpm: TpmContext {
            sidecar,
            enrollment: rows.tpm_enrollment,
            position: rows.tpm_position,
            statement_digest: pae_sha3,
            boot,
        },
        traffic,
        replay,
    })
}
