//! What a rack page shows, gathered from the store: each host's standing, its last epochs
//! (bytes passed against the bound, downtime, gaps) and the findings to explain. Rendering
//! is separate (`render.rs`) and never touches the store.

use rackwarden_attest::{evidence::LimiterReport, statement::Statement};

use super::{inventory, scorecard};
use crate::{
    appraisal::{AttestationResult, Finding, Status, budget},
    service::{Verifier, VerifierError, stored_statement},
    status::{HostStanding, RackStanding},
};

/// Epochs per host the page draws by default, and at most.
pub const DEFAULT_WINDOW: u32 = 48;
pub const MAX_WINDOW: u32 = 1000;

/// The caps a host's last statement reports enforcing.
#[derive(Debug, Clone)]
pub struct HostCaps {
    pub egress_bytes_per_s: u64,
    pub ingress_bytes_per_s: u64,
    pub egress_burst_bytes: u64,
    pub ingress_burst_bytes: u64,
}

/// One stored epoch on the timeline.
#[derive(Debug, Clone)]
pub struct EpochPoint {
    pub seq: u64,
    pub end_ms: u64,
    /// epoch end - epoch start, as the statement says.
    pub duration_ms: u64,
    /// Since the previous stored statement's end (`None` for the first in the window).
    pub elapsed_ms: Option<u64>,
    pub status: Status,
    /// Bytes passed since the previous stored statement, per direction.
    pub egress_bytes: Option<u64>,
    pub ingress_bytes: Option<u64>,
    /// The agreement's bound over `elapsed_ms`: agreed cap x elapsed + agreed burst.
    pub agreed_egress_bound: Option<f64>,
    pub agreed_ingress_bound: Option<f64>,
    /// The host's own bound over `elapsed_ms` (its caps), for the tooltip.
    pub host_egress_bound: Option<f64>,
    pub downtime_ms: Option<u64>,
    /// Seqs missing between the previous stored statement and this one.
    pub missing_before: u64,
    /// Another statement with the same seq is stored.
    pub forked: bool,
}

impl EpochPoint {
    pub fn measured_rate_bytes_per_s(&self) -> Option<f64> {
        let e = self.elapsed_ms.filter(|e| *e > 0)? as f64 / 1000.0;
        Some(self.egress_bytes.max(self.ingress_bytes)? as f64 / e)
    }
}

/// A finding on the page, with the statement it comes from.
#[derive(Debug, Clone)]
pub struct ShownFinding {
    pub seq: u64,
    pub finding: Finding,
}

#[derive(Debug, Clone)]
pub struct HostView {
    pub standing: HostStanding,
    pub caps: Option<HostCaps>,
    pub epochs: Vec<EpochPoint>,
    pub findings: Vec<ShownFinding>,
}

#[derive(Debug, Clone)]
pub struct RackView {
    pub standing: RackStanding,
    pub hosts: Vec<HostView>,
    pub score: scorecard::Scorecard,
    pub inventory: inventory::Inventory,
    pub window: u32,
    pub generated_ms: u64,
    pub policy: crate::config::Policy,
}

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

fn result_of(json: &str) -> Option<AttestationResult> {
    serde_json::from_str(json).ok()
}

impl Verifier {
    /// Everything the rack's page shows, over each host's last `window` epochs.
    pub fn rack_view(
        &self,
        rack: &str,
        now_ms: u64,
        window: u32,
    ) -> Result<RackView, VerifierError> {
        let window = window.clamp(1, MAX_WINDOW);
        let standing = self.rack_standing(rack, now_ms)?;
        let agreement = self.policy.racks.get(rack);
        let mut hosts = Vec::new();
        for hs in &standing.hosts {
            // One more than the window: the first drawn epoch needs its predecessor.
            let mut rows = self.store.history(rack, &hs.host, window + 1)?;
            rows.reverse();
            let parsed: Vec<(_, Option<Statement>)> = rows
                .into_iter()
                .map(|r| {
                    let st = stored_statement(&r);
                    (r, st)
                })
                .collect();
            let mut epochs = Vec::new();
            let mut prev: Option<&(crate::store::StoredStatement, Option<Statement>)> = None;
            for (i, cur) in parsed.iter().enumerate() {
                let (row, st) = cur;
                let forked = parsed
                    .iter()
                    .enumerate()
                    .any(|(j, (r, _))| j != i && r.seq == row.seq);
                let base = prev.filter(|(p, _)| p.seq < row.seq);
                let elapsed_ms = base.map(|(p, _)| row.epoch_end_ms.saturating_sub(p.epoch_end_ms));
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
                        status: result_of(&row.result).map_or(Status::Warning, |r| r.status),
                        egress_bytes: delta("egress"),
                        ingress_bytes: delta("ingress"),
                        agreed_egress_bound: agreed(agreement.map(|a| a.egress_bytes_per_s)),
                        agreed_ingress_bound: agreed(agreement.map(|a| a.ingress_bytes_per_s)),
                        host_egress_bound: host_bound,
                        downtime_ms: st
                            .as_ref()
                            .and_then(|s| s.predicate.epoch.as_ref())
                            .map(|r| r.downtime_ms),
                        missing_before: base.map_or(0, |(p, _)| row.seq - p.seq - 1),
                        forked,
                    });
                }
                if base.is_some() || prev.is_none() {
                    prev = Some(cur);
                }
            }
            let last = parsed.last();
            let mut findings: Vec<ShownFinding> = last
                .and_then(|(r, _)| result_of(&r.result).map(|x| (r.seq, x)))
                .map(|(seq, r)| {
                    r.findings
                        .into_iter()
                        .map(|finding| ShownFinding { seq, finding })
                        .collect()
                })
                .unwrap_or_default();
            // The first contraindicated statement not cleared holds the host: explain it too.
            if let Some(first) = &hs.first_uncleared
                && last.is_none_or(|(r, _)| r.id != first.id)
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
            hosts.push(HostView {
                standing: hs.clone(),
                caps: last.and_then(|(_, s)| s.as_ref()).and_then(caps_of),
                epochs,
                findings,
            });
        }
        Ok(RackView {
            score: scorecard::compute(&self.policy, &hosts),
            standing,
            hosts,
            inventory: inventory::of_schema(),
            window,
            generated_ms: now_ms,
            policy: self.policy.clone(),
        })
    }
}
