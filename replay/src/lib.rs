//! The verifier's replay service (issue 28). The verifier's operator runs it beside the
//! verifier, on hardware they trust, with their own copy of the precommitted models: it
//! takes each epoch's matched openings from the verifier's database, reruns the model over
//! every opened exchange (`rackwarden_inference::replay`), and stores what it found, one row
//! per epoch. The verifier judges the rows at its policy's tolerance (the `replay` aspect).
//!
//! It needs nothing from the host: the openings were checked against the committed root
//! when they were stored, and the sampling keys come from the statements the verifier holds.

use std::collections::BTreeMap;

use base64::{Engine as _, engine::general_purpose::STANDARD};
use rackwarden_attest::{
    dsse::Envelope,
    sampling_key::{genesis_sampling_key, sampling_key},
    traffic::{EpochOpenings, RecordKind},
};
use rackwarden_inference::replay::{
    RecordedExchange, ReplayModels, replay_exchange, replay_partial,
};
use rackwarden_verifier::store::{DbError, PendingReplay, RecordReplay, ReplayRow, Store};

#[derive(Debug, thiserror::Error)]
pub enum ReplayServiceError {
    #[error("database: {0}")]
    Db(#[from] DbError),
    #[error("{rack}/{host} epoch {seq}: the stored openings do not read back: {problem}")]
    Openings {
        rack: String,
        host: String,
        seq: u64,
        problem: String,
    },
}

/// The sampling key of the host's epoch `epoch`, from the statement before it as stored
/// (`None` when the verifier holds no statement for epoch `epoch - 1`).
pub fn stored_key(
    store: &Store,
    rack: &str,
    host: &str,
    epoch: u64,
) -> Result<Option<[u8; 32]>, DbError> {
    let Some(prev) = epoch.checked_sub(1) else {
        return Ok(Some(genesis_sampling_key().key));
    };
    for row in store.by_seq(rack, host, prev)? {
        let (Some(st), Ok(link)) = (
            row.statement(),
            hex::decode(&row.pae_sha3).map(|b| <[u8; 32]>::try_from(b.as_slice())),
        ) else {
            continue;
        };
        if let Ok(link) = link {
            return Ok(Some(sampling_key(prev, &st.predicate.challenge, &link).key));
        }
    }
    Ok(None)
}

/// Replays one epoch's openings: each opened exchange and partial record, with the keys of
/// the epoch and the one before.
pub fn replay_openings(
    store: &Store,
    models: &ReplayModels,
    pending: &PendingReplay,
) -> Result<Vec<RecordReplay>, ReplayServiceError> {
    let bad = |problem: String| ReplayServiceError::Openings {
        rack: pending.rack.clone(),
        host: pending.host.clone(),
        seq: pending.seq,
        problem,
    };
    let env: Envelope = serde_json::from_str(&pending.envelope).map_err(|e| bad(e.to_string()))?;
    let payload = STANDARD
        .decode(&env.payload)
        .map_err(|e| bad(format!("payload: {e}")))?;
    let openings: EpochOpenings =
        serde_json::from_slice(&payload).map_err(|e| bad(format!("payload: {e}")))?;
    let mut keys = BTreeMap::new();
    for epoch in [pending.seq.saturating_sub(1), pending.seq] {
        if let Some(k) = stored_key(store, &pending.rack, &pending.host, epoch)? {
            keys.insert(epoch, k);
        }
    }
    let mut records = Vec::new();
    for (i, r) in openings.records.iter().enumerate() {
        if r.leaf.kind == RecordKind::RawFlow {
            // Judged by the traffic aspect's allowlist.
            continue;
        }
        let (Ok(request), Ok(response)) = (
            STANDARD.decode(&r.input_base64),
            STANDARD.decode(&r.output_base64),
        ) else {
            return Err(bad(format!("record {i}: bytes are not base64")));
        };
        let index = r.path.index;
        let replay = match r.leaf.kind {
            RecordKind::Partial => match replay_partial(&request, &response) {
                Some(r) => r,
                None => continue,
            },
            _ => replay_exchange(
                models,
                &keys,
                &RecordedExchange {
                    epoch_seq: r.leaf.epoch_seq,
                    request: &request,
                    response: &response,
                },
            ),
        };
        records.push(RecordReplay { index, replay });
    }
    Ok(records)
}

/// Openings that could not be read back, by (rack, host, seq): skipped by later runs of the
/// same service, so that damaged rows never hold back the ones after them.
pub type Damaged = std::collections::BTreeSet<(String, String, u64)>;

/// Replays every pending epoch (at most `limit` beyond those in `damaged`) and stores the
/// rows; returns how many. A row is stamped when the replay is done, not when it began: the
/// statement whose window holds the stamp judges it.
pub fn run_once(
    store: &Store,
    models: &ReplayModels,
    limit: u64,
    now_ms: impl Fn() -> u64,
    damaged: &mut Damaged,
) -> Result<usize, ReplayServiceError> {
    let pending = store.pending_replays(limit.saturating_add(damaged.len() as u64))?;
    let mut done = 0;
    for p in &pending {
        let key = (p.rack.clone(), p.host.clone(), p.seq);
        if damaged.contains(&key) {
            continue;
        }
        let records = match replay_openings(store, models, p) {
            Ok(records) => records,
            Err(e @ ReplayServiceError::Openings { .. }) => {
                // Stored openings that do not read back were matched by this verifier: a
                // damaged row is logged and skipped, never replayed as if empty.
                log::error!("{e}");
                damaged.insert(key);
                continue;
            }
            Err(e) => return Err(e),
        };
        let row = ReplayRow {
            rack: p.rack.clone(),
            host: p.host.clone(),
            seq: p.seq,
            replayed_ms: now_ms(),
            records,
        };
        let failed = row
            .records
            .iter()
            .filter(|r| {
                matches!(
                    r.replay,
                    rackwarden_sampler::verdict::ExchangeReplay::Failed { .. }
                )
            })
            .count();
        if store.insert_replay(&row)? {
            log::info!(
                "{}/{} epoch {}: {} records replayed ({failed} failed before scoring)",
                row.rack,
                row.host,
                row.seq,
                row.records.len()
            );
            done += 1;
        }
    }
    Ok(done)
}
