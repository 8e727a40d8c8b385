//! What a rack page shows, gathered from the store through the read model (`standing`):
//! each host's standing, its last epochs (bytes passed against the bound, downtime, gaps)
//! and the findings to explain. Rendering is separate (`render.rs`) and never touches the
//! store.

use std::collections::HashMap;

use rackwarden_attest::{evidence::LimiterReport, statement::Statement};

pub use super::model::{EpochPoint, HostCaps, HostView, RootOfTrustView, ShownFinding};
use super::{inventory, scorecard};
use crate::{
    appraisal::{AttestationResult, Status, budget},
    config::{Policy, RackAgreement},
    standing::{self, HostStanding, RackStanding},
    store::{DbError, SampleAndAnswer, Store, StoredStatement},
};

/// Epochs per host the page draws by default, and at most.
pub const DEFAULT_WINDOW: u32 = 48;
pub const MAX_WINDOW: u32 = 1000;

#[derive(Debug, Clone)]
pub struct RackView {
    pub standing: RackStanding,
    pub hosts: Vec<HostView>,
    pub score: scorecard::Scorecard,
    pub inventory: inventory::Inventory,
    pub window: u32,
    pub generated_ms: u64,
    pub policy: Policy,
}

/// A stored row with its statement and its verdict, each parsed once.
type Row = (
    StoredStatement,
    Option<Statement>,
    Option<AttestationResult>,
);

fn caps_of(st: &Statement) -> Option<HostCaps> {
    let LimiterReport::Present(e) = &st.predicate.limiter else {
        return None;
    };
    let get = |dir: &str| e.caps.iter().find(|c| c.direction.name() == dir);
    let (eg, ing) = (get("egress"), get("ingress"));
    Some(HostCaps {
        egress_bytes_per_s: eg.map_or(0, |c| c.rate_bytes_per_s),
        ingress_bytes_per_s: ing.map_or(0, |c| c.rate_bytes_per_s),
        egress_burst_bytes: eg.map_or(0, |c| c.burst_bytes),
        ingress_burst_bytes: ing.map_or(0, |c| c.burst_bytes),
    })
}

/// The TPM devices the statement's sealed guard keeps for the daemon, and the descriptors
/// of them other processes still hold from before the seal; `None` when it reports no
/// sealed guard.
fn sealed_guard_tpm_devices(st: &Statement) -> Option<(u32, u32)> {
    use rackwarden_attest::evidence::LsmGuard;
    let LimiterReport::Present(e) = &st.predicate.limiter else {
        return None;
    };
    match e.self_protection.as_ref()?.lsm_guard {
        LsmGuard::Sealed {
            tpm_devices,
            tpm_held_elsewhere,
            ..
        } => Some((tpm_devices, tpm_held_elsewhere)),
        _ => None,
    }
}

/// Everything the rack's page shows, over each host's last `window` epochs.
pub fn rack_view(
    store: &Store,
    policy: &Policy,
    rack: &str,
    now_ms: u64,
    window: u32,
) -> Result<RackView, DbError> {
    let window = window.clamp(1, MAX_WINDOW);
    let standing = standing::rack(store, policy, rack, now_ms)?;
    let agreement = policy.racks.get(rack);
    let mut hosts = Vec::new();
    for hs in &standing.hosts {
        // One more than the window: the first drawn epoch needs its predecessor.
        let mut rows = store.history(rack, &hs.host, window + 1)?;
        rows.reverse();
        let parsed: Vec<Row> = rows
            .into_iter()
            .map(|r| {
                let (st, result) = (r.statement(), r.result());
                (r, st, result)
            })
            .collect();
        let last = parsed.last();
        let sealed = last
            .and_then(|(_, s, _)| s.as_ref())
            .and_then(sealed_guard_tpm_devices);
        hosts.push(HostView {
            standing: hs.clone(),
            caps: last.and_then(|(_, s, _)| s.as_ref()).and_then(caps_of),
            findings: findings(hs, last),
            root_of_trust: RootOfTrustView {
                verified: last
                    .and_then(|(_, _, r)| r.as_ref())
                    .and_then(|r| r.root_of_trust),
                claimed: last
                    .and_then(|(_, s, _)| s.as_ref())
                    .and_then(|s| s.predicate.root_of_trust.clone()),
                guard_sealed: sealed.is_some(),
                tpm_kept: sealed.is_some_and(|(n, held)| n > 0 && held == 0),
                tpm_held_elsewhere: sealed.map_or(0, |(_, held)| held),
                guard: last.and_then(|(_, _, r)| r.as_ref()).and_then(|r| r.guard),
                boot: store
                    .tpm_boot(rack, &hs.host)?
                    .map(|b| (b.reset_count, b.seq, b.measured)),
            },
            epochs: {
                let mut points = epochs(&parsed, agreement, window);
                // Each epoch's sample and what became of it.
                let from = points.first().map_or(0, |e| e.seq);
                let mut sampled: HashMap<u64, SampleAndAnswer> = store
                    .samples_since(rack, &hs.host, from)?
                    .into_iter()
                    .map(|s| (s.sample.demand.epoch_seq, s))
                    .collect();
                for e in &mut points {
                    e.sampling = sampled.remove(&e.seq);
                    if e.sampling.as_ref().is_some_and(|s| s.answer.is_some()) {
                        e.replay = store.replay(rack, &hs.host, e.seq)?.map(|r| {
                            crate::appraisal::replay::figures(&r, policy.replay.tolerance.get())
                        });
                    }
                }
                points
            },
        });
    }
    Ok(RackView {
        score: scorecard::compute(policy, &hosts),
        standing,
        hosts,
        inventory: inventory::of_schema(),
        window,
        generated_ms: now_ms,
        policy: policy.clone(),
    })
}

/// The timeline: one point per stored epoch (oldest first), each measured against the
/// previous stored statement of a lower seq.
fn epochs(parsed: &[Row], agreement: Option<&RackAgreement>, window: u32) -> Vec<EpochPoint> {
    let mut epochs = Vec::new();
    let mut prev: Option<&Row> = None;
    // A seq stored more than once in the window is a fork (counted once, not per row).
    let mut stored_at: HashMap<u64, usize> = HashMap::with_capacity(parsed.len());
    for (r, _, _) in parsed {
        *stored_at.entry(r.seq).or_default() += 1;
    }
    for (i, cur) in parsed.iter().enumerate() {
        let (row, st, result) = cur;
        let forked = stored_at.get(&row.seq).is_some_and(|n| *n > 1);
        let base = prev.filter(|(p, _, _)| p.seq < row.seq);
        let elapsed_ms = base.map(|(p, _, _)| row.epoch_end_ms.saturating_sub(p.epoch_end_ms));
        let delta = |dir: &str| -> Option<u64> {
            let now = budget::counters_of(st.as_ref()?, dir)?.0;
            let before = budget::counters_of(base?.1.as_ref()?, dir)?.0;
            now.checked_sub(before)
        };
        let agreed = |rate: Option<u64>| -> Option<f64> {
            Some(budget::epoch_bound(
                rate?,
                0,
                agreement?.max_burst_bytes,
                elapsed_ms?,
            ))
        };
        let host_bound = st.as_ref().and_then(|s| {
            let (_, rate, burst) = budget::counters_of(s, "egress")?;
            Some(budget::epoch_bound(rate, 0, burst, elapsed_ms?))
        });
        if i > 0 || parsed.len() <= window as usize {
            epochs.push(EpochPoint {
                seq: row.seq,
                end_ms: row.epoch_end_ms,
                duration_ms: st.as_ref().map_or(0, |s| {
                    s.predicate
                        .epoch_end_unix_ms
                        .saturating_sub(s.predicate.epoch_start_unix_ms)
                }),
                elapsed_ms,
                status: result.as_ref().map_or(Status::Warning, |r| r.status),
                egress_bytes: delta("egress"),
                ingress_bytes: delta("ingress"),
                agreed_egress_bound: agreed(agreement.map(|a| a.egress_bytes_per_s)),
                agreed_ingress_bound: agreed(agreement.map(|a| a.ingress_bytes_per_s)),
                host_egress_bound: host_bound,
                downtime_ms: st
                    .as_ref()
                    .and_then(|s| s.predicate.epoch.as_ref())
                    .map(|r| r.downtime_ms),
                trigger: st
                    .as_ref()
                    .and_then(|s| s.predicate.epoch.as_ref())
                    .map(|r| r.trigger),
                wipe_interval_ms: st
                    .as_ref()
                    .and_then(|s| s.predicate.epoch.as_ref())
                    .map(|r| r.wipe_interval_ms),
                missing_before: base.map_or(0, |(p, _, _)| row.seq - p.seq - 1),
                forked,
                traffic: st.as_ref().and_then(|s| s.predicate.traffic.clone()),
                sampling: None,
                replay: None,
            });
        }
        if base.is_some() || prev.is_none() {
            prev = Some(cur);
        }
    }
    epochs
}

/// The last statement's findings, and those of the first contraindicated statement not
/// cleared, which holds the host.
fn findings(hs: &HostStanding, last: Option<&Row>) -> Vec<ShownFinding> {
    let mut findings: Vec<ShownFinding> = last
        .and_then(|(r, _, result)| Some((r.seq, result.as_ref()?)))
        .map(|(seq, r)| {
            r.findings
                .iter()
                .map(|finding| ShownFinding {
                    seq,
                    finding: finding.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    if let Some(first) = &hs.first_uncleared
        && last.is_none_or(|(r, _, _)| r.id != first.id)
        && let Some(r) = &first.result
    {
        findings.extend(
            r.findings
                .iter()
                .filter(|f| f.severity == Status::Contraindicated)
                .map(|finding| ShownFinding {
                    seq: first.seq,
                    finding: finding.clone(),
                }),
        );
    }
    findings
}
