//! The data a rack page is drawn from, per host: its standing, the caps it reports, its
//! epochs on the timeline and the findings to explain. `view` fills it from the store,
//! `scorecard` computes from it, `render` draws it.

use rackwarden_attest::evidence::EpochTrigger;

use crate::{
    appraisal::{Finding, Status},
    standing::HostStanding,
};

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
    /// What started the epoch, as the statement says (`None`: it does not say).
    pub trigger: Option<EpochTrigger>,
    /// The host's configured `wipe_interval` when the epoch ran (`epoch.wipe_interval_ms`).
    pub wipe_interval_ms: Option<u64>,
    /// Seqs missing between the previous stored statement and this one.
    pub missing_before: u64,
    /// Another statement with the same seq is stored.
    pub forked: bool,
    /// What the statement says its tap committed of the epoch's traffic (`None`: it
    /// carries no traffic report).
    pub traffic: Option<rackwarden_attest::traffic::TrafficReport>,
    /// The sample drawn for the epoch's traffic root and the openings received for it
    /// (`None`: nothing was sampled).
    pub sampling: Option<crate::store::SampleAndAnswer>,
    /// What the replay of the epoch's opened exchanges found, at the policy's tolerance
    /// (`None`: not replayed).
    pub replay: Option<crate::appraisal::replay::ReplayFigures>,
}

impl EpochPoint {
    /// Nothing passed in either direction since the previous stored statement.
    pub fn idle(&self) -> bool {
        self.egress_bytes == Some(0) && self.ingress_bytes == Some(0)
    }

    /// An operator or an interruption forced the epoch, rather than the schedule.
    pub fn forced(&self) -> bool {
        matches!(
            self.trigger,
            Some(EpochTrigger::WipeNow | EpochTrigger::AfterInterruption)
        )
    }

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
    /// The root of trust of the host's last statement.
    pub root_of_trust: RootOfTrustView,
}

/// What the verifier verified of a host's root of trust, beside what the host said.
#[derive(Debug, Clone, Default)]
pub struct RootOfTrustView {
    /// The level the last verdict granted (`None`: no TPM in play for it).
    pub verified: Option<rackwarden_attest::tpm::TrustLevel>,
    /// What the last statement claimed.
    pub claimed: Option<rackwarden_attest::tpm::RootOfTrust>,
    /// Whether the last statement reports the guard sealed (only then is there a sealed
    /// state whose basis to name).
    pub guard_sealed: bool,
    /// Whether that guard keeps the TPM's devices for the daemon (no other process can use
    /// the daemon's AK): it refuses them and nobody holds one from before the seal.
    pub tpm_kept: bool,
    /// Descriptors of the kept TPM that other processes hold from before the seal.
    pub tpm_held_elsewhere: u32,
    /// What the last verdict found the sealed guard rests on (`None`: no verified boot).
    pub guard: Option<rackwarden_attest::result::GuardBasis>,
    /// The host's last boot whose event log verified: (TPM resetCount, statement, what it
    /// measured).
    pub boot: Option<(u32, u64, rackwarden_attest::tpm::MeasuredBoot)>,
}
