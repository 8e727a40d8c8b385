//! The three numbers the policy note asks for, computed from stored statements only (the
//! caps hosts reported enforcing, the bytes that passed, the downtime epochs cost), never
//! from configuration alone. Each carries the inputs the page prints as its arithmetic.

use serde::Serialize;

use super::model::{EpochPoint, HostCaps, HostView};
use crate::config::Policy;

/// The note's target: training at least this many times slower than with free syncing.
pub const SLOWDOWN_TARGET: f64 = 1000.0;

/// Time to move the trainable state through the rack's caps, and what that makes of training.
#[derive(Debug, Clone, Serialize)]
pub struct TrainingBound {
    pub state_bytes: u64,
    /// Sums over the hosts' last statements of the caps they report enforcing.
    pub egress_caps_bytes_per_s: u64,
    pub ingress_caps_bytes_per_s: u64,
    pub ingress_bursts_bytes: u64,
    /// Sum over hosts of each host's fastest measured epoch (bytes passed / elapsed), the
    /// larger direction.
    pub measured_peak_bytes_per_s: f64,
    /// The fastest of the above: the bound uses the quickest path a sync could take.
    pub rate_bytes_per_s: f64,
    pub time_to_move_state_s: f64,
    /// Longest an epoch may run before its wipe is overdue (policy `max_wipe_interval`).
    pub epoch_s: f64,
    /// The largest ingress any host measured in one epoch of the window.
    pub measured_max_epoch_ingress_bytes: u64,
    pub reference_bytes_per_s: u64,
    /// reference interconnect / rate.
    pub slowdown_factor: f64,
    pub meets_target: bool,
}

/// What the wipes cost inference.
#[derive(Debug, Clone, Serialize)]
pub struct InferenceOverhead {
    pub epochs: usize,
    pub downtime_ms: u64,
    pub elapsed_ms: u64,
    /// downtime / elapsed.
    pub fraction: f64,
    /// elapsed / (elapsed - downtime): how much longer serving takes.
    pub factor: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Scorecard {
    /// `None`: no host has reported caps yet.
    pub training: Option<TrainingBound>,
    /// What the schedule costs: epochs started by the interval (or at startup). `None`: no
    /// such statement in the window reports its epoch's downtime.
    pub inference: Option<InferenceOverhead>,
    /// Epochs forced by an operator (`wipe-now`) or redone after an interruption, apart:
    /// they are not what the policy's interval costs.
    pub forced: Option<InferenceOverhead>,
}

pub fn compute(policy: &Policy, hosts: &[HostView]) -> Scorecard {
    Scorecard {
        training: training(policy, hosts),
        // The schedule costs each scheduled epoch's downtime once per wipe interval (the
        // first epoch of a host has no previous end to measure from); a forced epoch costs
        // its downtime over the time since the previous one.
        inference: inference(hosts, |e| {
            (!e.forced()).then_some(e.wipe_interval_ms.unwrap_or(e.duration_ms))
        }),
        forced: inference(hosts, |e| e.forced().then_some(e.duration_ms)),
    }
}

fn training(policy: &Policy, hosts: &[HostView]) -> Option<TrainingBound> {
    let reporting: Vec<&HostView> = hosts.iter().filter(|h| h.caps.is_some()).collect();
    if reporting.is_empty() {
        return None;
    }
    let sum = |f: fn(&HostCaps) -> u64| -> u64 {
        reporting
            .iter()
            .filter_map(|h| h.caps.as_ref().map(f))
            .fold(0u64, u64::saturating_add)
    };
    let egress = sum(|c| c.egress_bytes_per_s);
    let ingress = sum(|c| c.ingress_bytes_per_s);
    let bursts = sum(|c| c.ingress_burst_bytes);
    let peak: f64 = hosts
        .iter()
        .map(|h| {
            h.epochs
                .iter()
                .filter_map(|e| e.measured_rate_bytes_per_s())
                .fold(0.0, f64::max)
        })
        .sum();
    let rate = (egress.max(ingress) as f64).max(peak);
    let state = policy.trainable_state_bytes;
    let epoch_s = policy.max_wipe_interval.as_secs_f64();
    let slowdown = policy.reference_bandwidth_bytes_per_s as f64 / rate;
    Some(TrainingBound {
        state_bytes: state,
        egress_caps_bytes_per_s: egress,
        ingress_caps_bytes_per_s: ingress,
        ingress_bursts_bytes: bursts,
        measured_peak_bytes_per_s: peak,
        rate_bytes_per_s: rate,
        time_to_move_state_s: state as f64 / rate,
        epoch_s,
        measured_max_epoch_ingress_bytes: hosts
            .iter()
            .flat_map(|h| h.epochs.iter().filter_map(|e| e.ingress_bytes))
            .max()
            .unwrap_or(0),
        reference_bytes_per_s: policy.reference_bandwidth_bytes_per_s,
        slowdown_factor: slowdown,
        meets_target: slowdown >= SLOWDOWN_TARGET,
    })
}

/// Downtime over time of the epochs `time_of` keeps (with the time each is measured over).
fn inference(
    hosts: &[HostView],
    time_of: impl Fn(&EpochPoint) -> Option<u64>,
) -> Option<InferenceOverhead> {
    let (mut n, mut down, mut elapsed) = (0usize, 0u64, 0u64);
    for e in hosts.iter().flat_map(|h| &h.epochs) {
        if let (Some(d), Some(t)) = (e.downtime_ms, time_of(e).filter(|t| *t > 0)) {
            n += 1;
            down += d;
            elapsed += t;
        }
    }
    if n == 0 || elapsed == 0 {
        return None;
    }
    let fraction = down as f64 / elapsed as f64;
    Some(InferenceOverhead {
        epochs: n,
        downtime_ms: down,
        elapsed_ms: elapsed,
        fraction,
        factor: if down >= elapsed {
            f64::INFINITY
        } else {
            elapsed as f64 / (elapsed - down) as f64
        },
    })
}
