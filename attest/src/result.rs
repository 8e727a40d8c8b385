//! The attestation result: the verifier's verdict on one statement, as stored, as sent to
//! the daemon in the ingest response, and as shown on the auditor's page. It follows the
//! shape of an IETF EAR attestation result: an overall status, a per-aspect trustworthiness
//! vector, the policy id, and the findings. Codes and aspects are one enum each, serialised
//! as the snake_case strings stored verdicts have always carried, so `recheck` compares old
//! verdicts with new ones.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One aspect of the trustworthiness vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Aspect {
    Identity,
    Chain,
    Freshness,
    Limiter,
    Wipe,
    Images,
    Budget,
    /// The TPM quote and IMA list behind the statement (issue 22). In a verdict's vector only
    /// when a TPM is in play (a quote came, an AK is enrolled, the host says it has one, or
    /// the policy asks for one), so verdicts made before it read and re-derive unchanged.
    RootOfTrust,
    /// Disks, swap and persistent filesystems: what could carry state across a wipe
    /// (issue 25). In a verdict's vector only when the statement carries an inventory or the
    /// policy requires one, so verdicts made before it read and re-derive unchanged.
    Storage,
    /// What the host's tap committed of the bytes its policer passed in the epoch (issue
    /// 27). In a verdict's vector only when the statement carries a traffic report or the
    /// policy requires one (`[policy.taps] required`), so verdicts made before it read and
    /// re-derive unchanged.
    Traffic,
    /// Whether the opened exchanges are what the precommitted model produces (issue 28):
    /// the verifier's replay of each, judged at `[policy.replay] tolerance`. In a verdict's
    /// vector only when a replay was stored in the statement's window, so verdicts made
    /// before it read and re-derive unchanged.
    Replay,
}

impl Aspect {
    pub const ALL: [Aspect; 11] = [
        Aspect::Identity,
        Aspect::Chain,
        Aspect::Freshness,
        Aspect::Limiter,
        Aspect::Wipe,
        Aspect::Images,
        Aspect::Budget,
        Aspect::RootOfTrust,
        Aspect::Storage,
        Aspect::Traffic,
        Aspect::Replay,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Aspect::Identity => "identity",
            Aspect::Chain => "chain",
            Aspect::Freshness => "freshness",
            Aspect::Limiter => "limiter",
            Aspect::Wipe => "wipe",
            Aspect::Images => "images",
            Aspect::Budget => "budget",
            Aspect::RootOfTrust => "root_of_trust",
            Aspect::Storage => "storage",
            Aspect::Traffic => "traffic",
            Aspect::Replay => "replay",
        }
    }
}

/// What a finding is about. Each code belongs to one aspect and has a one-line explanation
/// for the auditor's page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingCode {
    RetiredKey,
    KeyNotYetValid,
    NextKeyRefused,
    DaemonNotAccepted,
    ProgramNotAccepted,
    SelfProtectionUnreported,
    SelfProtectionBelowPolicy,
    GuardOnInactiveLsm,
    Fork,
    Gap,
    BrokenPrev,
    TimeBackwards,
    LogDamageDisclosed,
    Unchallenged,
    NonceUnknown,
    NonceOtherHost,
    NonceReused,
    NonceExpired,
    ClockSkew,
    LimiterAbsent,
    NotAttached,
    ForeignAhead,
    BypassUnreported,
    BypassRefusalAbsent,
    RdmaDevices,
    VfioDevices,
    UncappedInterfaces,
    AfXdpSockets,
    EnforcementGap,
    NoAgreement,
    BurstAboveAgreement,
    CapAboveAgreement,
    CountersReset,
    CountersAboveCap,
    StateBoundExceeded,
    NoWipe,
    WipeNotCounted,
    WipeOverdue,
    WipeNotBound,
    WipeInterrupted,
    WipeEmpty,
    WipeDeviceMissing,
    WipeInconsistent,
    WipeFailed,
    WipeMismatch,
    ResidueAboveMax,
    EpochInterrupted,
    ImageRefused,
    ImageNotInManifest,
    RootOfTrustBelowPolicy,
    QuoteMissing,
    AkNotEnrolled,
    QuoteInvalid,
    QuoteNotForStatement,
    PcrValuesMismatch,
    ImaReplayMismatch,
    ImaGap,
    TpmReboot,
    TpmClockUnsafe,
    DaemonNotMeasured,
    DaemonModified,
    ExecutableNotAllowed,
    ImaViolation,
    BootPcrMismatch,
    BootLogInvalid,
    BootLogMismatch,
    BootLogMissing,
    BootComponentNotAccepted,
    BootCmdlineNotAccepted,
    SecureBootNotAccepted,
    GuardContradictsBoot,
    TpmHeldElsewhere,
    StorageResidue,
    StorageResidueInconsistent,
    StorageUnreadable,
    StorageUnreported,
    StorageEraseFailed,
    VerifierLogInconsistent,
    /// The policy requires a traffic report (`[policy.taps] required`) and the statement
    /// carries none.
    TrafficMissing,
    /// The tap ran but could not commit the epoch (`TrafficReport::Failed`): nothing of its
    /// traffic is checkable.
    TrafficCommitFailed,
    /// The summary does not add up: `unaccounted` is not `passed - root.bytes`, or the tree
    /// holds more bytes than the kernel passed.
    TrafficInconsistent,
    /// Bytes the policer passed that no committed record covers, above the policy's
    /// `max_unaccounted` in a direction.
    TrafficUnaccounted,
    /// The tap dropped frames in the epoch (ring full, too large, unreadable). A warning:
    /// the tap fails closed, so a dropped frame was not passed untapped.
    TrafficTapDrops,
    /// The host did not keep the epoch's records (`SpoolState::NotKept`): none can be opened.
    /// Contraindicated when the policy requires traffic, a warning otherwise.
    TrafficNotKept,
    /// A sampled epoch's openings were not received by their deadline.
    TrafficOpeningMissing,
    /// A sampled epoch's openings were refused: a record's bytes, path or epoch does not
    /// match what was committed, or a drawn offset went unanswered.
    TrafficOpeningRefused,
    /// The statement names openings the verifier never received (another digest, or none).
    TrafficOpeningUnknown,
    /// An opened raw-flow record's peer is not in the policy's `allowed_raw_flows`.
    TrafficFlowNotAllowed,
    /// An opened exchange is not what the precommitted model produces for its request: a
    /// byte its tokens do not determine, a seed not derived from the epoch's key, another
    /// model, or a token trailing the seeded winner by more than the tolerance.
    ReplayFailed,
    /// An opened record holds output sent for a request still pending at the cut: it is
    /// judged only if its exchange completes in a later epoch and is sampled there, so here
    /// it is a gap, reported.
    ReplayUnjudged,
}

impl FindingCode {
    pub const ALL: [FindingCode; 90] = [
        FindingCode::RetiredKey,
        FindingCode::KeyNotYetValid,
        FindingCode::NextKeyRefused,
        FindingCode::DaemonNotAccepted,
        FindingCode::ProgramNotAccepted,
        FindingCode::SelfProtectionUnreported,
        FindingCode::SelfProtectionBelowPolicy,
        FindingCode::GuardOnInactiveLsm,
        FindingCode::Fork,
        FindingCode::Gap,
        FindingCode::BrokenPrev,
        FindingCode::TimeBackwards,
        FindingCode::LogDamageDisclosed,
        FindingCode::Unchallenged,
        FindingCode::NonceUnknown,
        FindingCode::NonceOtherHost,
        FindingCode::NonceReused,
        FindingCode::NonceExpired,
        FindingCode::ClockSkew,
        FindingCode::LimiterAbsent,
        FindingCode::NotAttached,
        FindingCode::ForeignAhead,
        FindingCode::BypassUnreported,
        FindingCode::BypassRefusalAbsent,
        FindingCode::RdmaDevices,
        FindingCode::VfioDevices,
        FindingCode::UncappedInterfaces,
        FindingCode::AfXdpSockets,
        FindingCode::EnforcementGap,
        FindingCode::NoAgreement,
        FindingCode::BurstAboveAgreement,
        FindingCode::CapAboveAgreement,
        FindingCode::CountersReset,
        FindingCode::CountersAboveCap,
        FindingCode::StateBoundExceeded,
        FindingCode::NoWipe,
        FindingCode::WipeNotCounted,
        FindingCode::WipeOverdue,
        FindingCode::WipeNotBound,
        FindingCode::WipeInterrupted,
        FindingCode::WipeEmpty,
        FindingCode::WipeDeviceMissing,
        FindingCode::WipeInconsistent,
        FindingCode::WipeFailed,
        FindingCode::WipeMismatch,
        FindingCode::ResidueAboveMax,
        FindingCode::EpochInterrupted,
        FindingCode::ImageRefused,
        FindingCode::ImageNotInManifest,
        FindingCode::RootOfTrustBelowPolicy,
        FindingCode::QuoteMissing,
        FindingCode::AkNotEnrolled,
        FindingCode::QuoteInvalid,
        FindingCode::QuoteNotForStatement,
        FindingCode::PcrValuesMismatch,
        FindingCode::ImaReplayMismatch,
        FindingCode::ImaGap,
        FindingCode::TpmReboot,
        FindingCode::TpmClockUnsafe,
        FindingCode::DaemonNotMeasured,
        FindingCode::DaemonModified,
        FindingCode::ExecutableNotAllowed,
        FindingCode::ImaViolation,
        FindingCode::BootPcrMismatch,
        FindingCode::BootLogInvalid,
        FindingCode::BootLogMismatch,
        FindingCode::BootLogMissing,
        FindingCode::BootComponentNotAccepted,
        FindingCode::BootCmdlineNotAccepted,
        FindingCode::SecureBootNotAccepted,
        FindingCode::GuardContradictsBoot,
        FindingCode::TpmHeldElsewhere,
        FindingCode::StorageResidue,
        FindingCode::StorageResidueInconsistent,
        FindingCode::StorageUnreadable,
        FindingCode::StorageUnreported,
        FindingCode::StorageEraseFailed,
        FindingCode::VerifierLogInconsistent,
        FindingCode::TrafficMissing,
        FindingCode::TrafficCommitFailed,
        FindingCode::TrafficInconsistent,
        FindingCode::TrafficUnaccounted,
        FindingCode::TrafficTapDrops,
        FindingCode::TrafficNotKept,
        FindingCode::TrafficOpeningMissing,
        FindingCode::TrafficOpeningRefused,
        FindingCode::TrafficOpeningUnknown,
        FindingCode::TrafficFlowNotAllowed,
        FindingCode::ReplayFailed,
        FindingCode::ReplayUnjudged,
    ];

    pub fn aspect(self) -> Aspect {
        match self {
            FindingCode::RetiredKey => Aspect::Identity,
            FindingCode::KeyNotYetValid => Aspect::Identity,
            FindingCode::NextKeyRefused => Aspect::Identity,
            FindingCode::DaemonNotAccepted => Aspect::Identity,
            FindingCode::ProgramNotAccepted => Aspect::Limiter,
            FindingCode::SelfProtectionUnreported => Aspect::Limiter,
            FindingCode::SelfProtectionBelowPolicy => Aspect::Limiter,
            FindingCode::GuardOnInactiveLsm => Aspect::Limiter,
            FindingCode::Fork => Aspect::Chain,
            FindingCode::Gap => Aspect::Chain,
            FindingCode::BrokenPrev => Aspect::Chain,
            FindingCode::TimeBackwards => Aspect::Chain,
            FindingCode::LogDamageDisclosed => Aspect::Chain,
            FindingCode::Unchallenged => Aspect::Freshness,
            FindingCode::NonceUnknown => Aspect::Freshness,
            FindingCode::NonceOtherHost => Aspect::Freshness,
            FindingCode::NonceReused => Aspect::Freshness,
            FindingCode::NonceExpired => Aspect::Freshness,
            FindingCode::ClockSkew => Aspect::Freshness,
            FindingCode::LimiterAbsent => Aspect::Limiter,
            FindingCode::NotAttached => Aspect::Limiter,
            FindingCode::ForeignAhead => Aspect::Limiter,
            FindingCode::BypassUnreported => Aspect::Limiter,
            FindingCode::BypassRefusalAbsent => Aspect::Limiter,
            FindingCode::RdmaDevices => Aspect::Limiter,
            FindingCode::VfioDevices => Aspect::Limiter,
            FindingCode::UncappedInterfaces => Aspect::Limiter,
            FindingCode::AfXdpSockets => Aspect::Limiter,
            FindingCode::EnforcementGap => Aspect::Limiter,
            FindingCode::NoAgreement => Aspect::Budget,
            FindingCode::BurstAboveAgreement => Aspect::Budget,
            FindingCode::CapAboveAgreement => Aspect::Budget,
            FindingCode::CountersReset => Aspect::Budget,
            FindingCode::CountersAboveCap => Aspect::Budget,
            FindingCode::StateBoundExceeded => Aspect::Budget,
            FindingCode::NoWipe => Aspect::Wipe,
            FindingCode::WipeNotCounted => Aspect::Wipe,
            FindingCode::WipeOverdue => Aspect::Wipe,
            FindingCode::WipeNotBound => Aspect::Wipe,
            FindingCode::WipeInterrupted => Aspect::Wipe,
            FindingCode::WipeEmpty => Aspect::Wipe,
            FindingCode::WipeDeviceMissing => Aspect::Wipe,
            FindingCode::WipeInconsistent => Aspect::Wipe,
            FindingCode::WipeFailed => Aspect::Wipe,
            FindingCode::WipeMismatch => Aspect::Wipe,
            FindingCode::ResidueAboveMax => Aspect::Wipe,
            FindingCode::EpochInterrupted => Aspect::Wipe,
            FindingCode::ImageRefused => Aspect::Images,
            FindingCode::ImageNotInManifest => Aspect::Images,
            FindingCode::RootOfTrustBelowPolicy => Aspect::RootOfTrust,
            FindingCode::QuoteMissing => Aspect::RootOfTrust,
            FindingCode::AkNotEnrolled => Aspect::RootOfTrust,
            FindingCode::QuoteInvalid => Aspect::RootOfTrust,
            FindingCode::QuoteNotForStatement => Aspect::RootOfTrust,
            FindingCode::PcrValuesMismatch => Aspect::RootOfTrust,
            FindingCode::ImaReplayMismatch => Aspect::RootOfTrust,
            FindingCode::ImaGap => Aspect::RootOfTrust,
            FindingCode::TpmReboot => Aspect::RootOfTrust,
            FindingCode::TpmClockUnsafe => Aspect::RootOfTrust,
            FindingCode::DaemonNotMeasured => Aspect::RootOfTrust,
            FindingCode::DaemonModified => Aspect::RootOfTrust,
            FindingCode::ExecutableNotAllowed => Aspect::RootOfTrust,
            FindingCode::ImaViolation => Aspect::RootOfTrust,
            FindingCode::BootPcrMismatch => Aspect::RootOfTrust,
            FindingCode::BootLogInvalid => Aspect::RootOfTrust,
            FindingCode::BootLogMismatch => Aspect::RootOfTrust,
            FindingCode::BootLogMissing => Aspect::RootOfTrust,
            FindingCode::BootComponentNotAccepted => Aspect::RootOfTrust,
            FindingCode::BootCmdlineNotAccepted => Aspect::RootOfTrust,
            FindingCode::SecureBootNotAccepted => Aspect::RootOfTrust,
            FindingCode::GuardContradictsBoot | FindingCode::TpmHeldElsewhere => {
                Aspect::RootOfTrust
            }
            FindingCode::StorageResidue
            | FindingCode::StorageResidueInconsistent
            | FindingCode::StorageUnreadable
            | FindingCode::StorageUnreported
            | FindingCode::StorageEraseFailed => Aspect::Storage,
            FindingCode::VerifierLogInconsistent => Aspect::Chain,
            FindingCode::TrafficMissing
            | FindingCode::TrafficCommitFailed
            | FindingCode::TrafficInconsistent
            | FindingCode::TrafficUnaccounted
            | FindingCode::TrafficTapDrops
            | FindingCode::TrafficNotKept
            | FindingCode::TrafficOpeningMissing
            | FindingCode::TrafficOpeningRefused
            | FindingCode::TrafficOpeningUnknown
            | FindingCode::TrafficFlowNotAllowed => Aspect::Traffic,
            FindingCode::ReplayFailed | FindingCode::ReplayUnjudged => Aspect::Replay,
        }
    }

    /// The code as stored (`counters_above_cap`).
    pub fn name(self) -> &'static str {
        match self {
            FindingCode::RetiredKey => "retired_key",
            FindingCode::KeyNotYetValid => "key_not_yet_valid",
            FindingCode::NextKeyRefused => "next_key_refused",
            FindingCode::DaemonNotAccepted => "daemon_not_accepted",
            FindingCode::ProgramNotAccepted => "program_not_accepted",
            FindingCode::SelfProtectionUnreported => "self_protection_unreported",
            FindingCode::SelfProtectionBelowPolicy => "self_protection_below_policy",
            FindingCode::GuardOnInactiveLsm => "guard_on_inactive_lsm",
            FindingCode::Fork => "fork",
            FindingCode::Gap => "gap",
            FindingCode::BrokenPrev => "broken_prev",
            FindingCode::TimeBackwards => "time_backwards",
            FindingCode::LogDamageDisclosed => "log_damage_disclosed",
            FindingCode::Unchallenged => "unchallenged",
            FindingCode::NonceUnknown => "nonce_unknown",
            FindingCode::NonceOtherHost => "nonce_other_host",
            FindingCode::NonceReused => "nonce_reused",
            FindingCode::NonceExpired => "nonce_expired",
            FindingCode::ClockSkew => "clock_skew",
            FindingCode::LimiterAbsent => "limiter_absent",
            FindingCode::NotAttached => "not_attached",
            FindingCode::ForeignAhead => "foreign_ahead",
            FindingCode::BypassUnreported => "bypass_unreported",
            FindingCode::BypassRefusalAbsent => "bypass_refusal_absent",
            FindingCode::RdmaDevices => "rdma_devices",
            FindingCode::VfioDevices => "vfio_devices",
            FindingCode::UncappedInterfaces => "uncapped_interfaces",
            FindingCode::AfXdpSockets => "af_xdp_sockets",
            FindingCode::EnforcementGap => "enforcement_gap",
            FindingCode::NoAgreement => "no_agreement",
            FindingCode::BurstAboveAgreement => "burst_above_agreement",
            FindingCode::CapAboveAgreement => "cap_above_agreement",
            FindingCode::CountersReset => "counters_reset",
            FindingCode::CountersAboveCap => "counters_above_cap",
            FindingCode::StateBoundExceeded => "state_bound_exceeded",
            FindingCode::NoWipe => "no_wipe",
            FindingCode::WipeNotCounted => "wipe_not_counted",
            FindingCode::WipeOverdue => "wipe_overdue",
            FindingCode::WipeNotBound => "wipe_not_bound",
            FindingCode::WipeInterrupted => "wipe_interrupted",
            FindingCode::WipeEmpty => "wipe_empty",
            FindingCode::WipeDeviceMissing => "wipe_device_missing",
            FindingCode::WipeInconsistent => "wipe_inconsistent",
            FindingCode::WipeFailed => "wipe_failed",
            FindingCode::WipeMismatch => "wipe_mismatch",
            FindingCode::ResidueAboveMax => "residue_above_max",
            FindingCode::EpochInterrupted => "epoch_interrupted",
            FindingCode::ImageRefused => "image_refused",
            FindingCode::ImageNotInManifest => "image_not_in_manifest",
            FindingCode::RootOfTrustBelowPolicy => "root_of_trust_below_policy",
            FindingCode::QuoteMissing => "quote_missing",
            FindingCode::AkNotEnrolled => "ak_not_enrolled",
            FindingCode::QuoteInvalid => "quote_invalid",
            FindingCode::QuoteNotForStatement => "quote_not_for_statement",
            FindingCode::PcrValuesMismatch => "pcr_values_mismatch",
            FindingCode::ImaReplayMismatch => "ima_replay_mismatch",
            FindingCode::ImaGap => "ima_gap",
            FindingCode::TpmReboot => "tpm_reboot",
            FindingCode::TpmClockUnsafe => "tpm_clock_unsafe",
            FindingCode::DaemonNotMeasured => "daemon_not_measured",
            FindingCode::DaemonModified => "daemon_modified",
            FindingCode::ExecutableNotAllowed => "executable_not_allowed",
            FindingCode::ImaViolation => "ima_violation",
            FindingCode::BootPcrMismatch => "boot_pcr_mismatch",
            FindingCode::BootLogInvalid => "boot_log_invalid",
            FindingCode::BootLogMismatch => "boot_log_mismatch",
            FindingCode::BootLogMissing => "boot_log_missing",
            FindingCode::BootComponentNotAccepted => "boot_component_not_accepted",
            FindingCode::BootCmdlineNotAccepted => "boot_cmdline_not_accepted",
            FindingCode::SecureBootNotAccepted => "secure_boot_not_accepted",
            FindingCode::GuardContradictsBoot => "guard_contradicts_boot",
            FindingCode::TpmHeldElsewhere => "tpm_held_elsewhere",
            FindingCode::StorageResidue => "storage_residue",
            FindingCode::StorageResidueInconsistent => "storage_residue_inconsistent",
            FindingCode::StorageUnreadable => "storage_unreadable",
            FindingCode::StorageUnreported => "storage_unreported",
            FindingCode::StorageEraseFailed => "storage_erase_failed",
            FindingCode::VerifierLogInconsistent => "verifier_log_inconsistent",
            FindingCode::TrafficMissing => "traffic_missing",
            FindingCode::TrafficCommitFailed => "traffic_commit_failed",
            FindingCode::TrafficInconsistent => "traffic_inconsistent",
            FindingCode::TrafficUnaccounted => "traffic_unaccounted",
            FindingCode::TrafficTapDrops => "traffic_tap_drops",
            FindingCode::TrafficNotKept => "traffic_not_kept",
            FindingCode::TrafficOpeningMissing => "traffic_opening_missing",
            FindingCode::TrafficOpeningRefused => "traffic_opening_refused",
            FindingCode::TrafficOpeningUnknown => "traffic_opening_unknown",
            FindingCode::TrafficFlowNotAllowed => "traffic_flow_not_allowed",
            FindingCode::ReplayFailed => "replay_failed",
            FindingCode::ReplayUnjudged => "replay_unjudged",
        }
    }

    /// One line an auditor reads next to the finding.
    pub fn explain(self) -> &'static str {
        match self {
            FindingCode::RetiredKey => {
                "signed with a key an operator retired or the host rotated away from: the host no longer speaks with it"
            }
            FindingCode::KeyNotYetValid => {
                "signed with a key the host rotated to, for a seq before the rotation took effect"
            }
            FindingCode::NextKeyRefused => {
                "names a next key that cannot be accepted (its key id does not match, it is retired or another host's, or the signing key is not current)"
            }
            FindingCode::DaemonNotAccepted => {
                "made by a daemon build whose digest the policy does not accept"
            }
            FindingCode::ProgramNotAccepted => {
                "an eBPF program whose kernel tag the policy does not accept"
            }
            FindingCode::SelfProtectionUnreported => {
                "the policy requires self-protection and the statement does not report it"
            }
            FindingCode::SelfProtectionBelowPolicy => {
                "another root process could weaken the limiter more easily than the policy allows"
            }
            FindingCode::GuardOnInactiveLsm => {
                "the statement claims a BPF LSM guard on a host where BPF LSM is not active: its programs sit on hooks the kernel never calls, so its `refused` levels are not believed"
            }
            FindingCode::Fork => {
                "two different statements claim the same place in the host's chain"
            }
            FindingCode::Gap => {
                "the previous statement has not arrived: an epoch is missing from the chain"
            }
            FindingCode::BrokenPrev => {
                "the statement does not extend the stored previous one (its prev digest differs)"
            }
            FindingCode::TimeBackwards => "the epoch starts before the previous one ended",
            FindingCode::LogDamageDisclosed => {
                "the host disclosed damaged bytes in its own statement log"
            }
            FindingCode::Unchallenged => {
                "the statement answers no verifier challenge, so its freshness is unproven"
            }
            FindingCode::NonceUnknown => "it answers a nonce this verifier never issued",
            FindingCode::NonceOtherHost => "it answers a nonce issued to another host",
            FindingCode::NonceReused => "it answers a nonce another statement already used",
            FindingCode::NonceExpired => {
                "it answers a nonce that had expired when the statement arrived"
            }
            FindingCode::ClockSkew => {
                "the epoch's claimed times lie outside what the verifier saw (nonce issued, statement received), beyond the allowed clock skew"
            }
            FindingCode::LimiterAbsent => "no policer was enforcing the caps",
            FindingCode::NotAttached => "the policer was not attached on an interface at epoch end",
            FindingCode::ForeignAhead => {
                "another program runs before the policer and could pass or redirect packets"
            }
            FindingCode::BypassUnreported => {
                "the statement does not say which paths around the policer exist"
            }
            FindingCode::BypassRefusalAbsent => {
                "nothing refuses new paths around the policer (RDMA, AF_XDP, raw devices)"
            }
            FindingCode::RdmaDevices => "RDMA devices can move bytes without passing the policer",
            FindingCode::VfioDevices => {
                "devices handed to user space (VFIO) can move bytes without the policer"
            }
            FindingCode::UncappedInterfaces => "interfaces with no policer can carry traffic",
            FindingCode::AfXdpSockets => "AF_XDP sockets can move packets without the policer",
            FindingCode::EnforcementGap => {
                "for a while the caps were not enforced (restored or not)"
            }
            FindingCode::NoAgreement => "the policy has no agreed cap for this rack",
            FindingCode::BurstAboveAgreement => {
                "the host's token bucket is deeper than the agreement allows"
            }
            FindingCode::CapAboveAgreement => {
                "the host enforces a higher rate than the agreement allows"
            }
            FindingCode::CountersReset => "the byte counters went backwards: the budget was reset",
            FindingCode::CountersAboveCap => {
                "more bytes passed than cap x elapsed time + burst allows"
            }
            FindingCode::StateBoundExceeded => {
                "more bytes entered in one epoch than the policy's share of the trainable state"
            }
            FindingCode::NoWipe => "no memory wipe in this epoch",
            FindingCode::WipeNotCounted => {
                "the wipe is not bound to a nonce this verifier issued, so it does not reset the wipe clock"
            }
            FindingCode::WipeOverdue => "no counted wipe within the policy's maximum wipe interval",
            FindingCode::WipeNotBound => "the wipe's nonce is not this epoch's challenge",
            FindingCode::WipeInterrupted => "the wipe was interrupted",
            FindingCode::WipeEmpty => "the wipe report names no device",
            FindingCode::WipeDeviceMissing => {
                "a device class the policy requires was not wiped completely"
            }
            FindingCode::WipeInconsistent => "the wipe's byte counts do not add up",
            FindingCode::WipeFailed => "a device's wipe failed",
            FindingCode::WipeMismatch => {
                "verification read back blocks that did not match the challenge stream"
            }
            FindingCode::ResidueAboveMax => "more memory was left unwiped than the policy allows",
            FindingCode::EpochInterrupted => {
                "an earlier epoch was cut short (a crash or restart) and redone"
            }
            FindingCode::ImageRefused => "the host refused an image whose digest did not match",
            FindingCode::ImageNotInManifest => "a loaded image is not in the signed manifest",
            FindingCode::RootOfTrustBelowPolicy => {
                "the root of trust the verifier could verify is weaker than the policy's min_root_of_trust"
            }
            FindingCode::QuoteMissing => {
                "no TPM quote came with a statement from a host whose AK is enrolled or that says it has a TPM"
            }
            FindingCode::AkNotEnrolled => {
                "a TPM quote came, but no attestation key is enrolled for this host"
            }
            FindingCode::QuoteInvalid => {
                "the TPM quote is malformed or its signature does not verify with the enrolled AK"
            }
            FindingCode::QuoteNotForStatement => {
                "the quote's qualifying data is not this statement's digest: a quote made for another statement"
            }
            FindingCode::PcrValuesMismatch => {
                "the PCR values shipped do not hash to the quoted digest, or the quote lacks a PCR the policy needs"
            }
            FindingCode::ImaReplayMismatch => {
                "PCR 10 is not the replay of the IMA entries shipped: the measurement list was altered"
            }
            FindingCode::ImaGap => {
                "IMA entries are missing between the last verified position and this statement's: the runtime is not verified"
            }
            FindingCode::TpmReboot => {
                "the TPM was reset (the host rebooted) since its previous quote"
            }
            FindingCode::TpmClockUnsafe => {
                "the TPM says its clock may have gone backwards (clockInfo.safe is clear)"
            }
            FindingCode::DaemonNotMeasured => {
                "this boot's IMA list holds no measurement of the daemon: it is not the daemon that runs"
            }
            FindingCode::DaemonModified => {
                "the daemon executable IMA measured is not a build the policy accepts"
            }
            FindingCode::ExecutableNotAllowed => {
                "IMA measured a file that is not in the policy's allowlist"
            }
            FindingCode::ImaViolation => {
                "IMA recorded a violation (a file measured while open for writing): its content is unknown"
            }
            FindingCode::BootPcrMismatch => "a boot PCR differs from the policy's reference value",
            FindingCode::BootLogInvalid => "the boot's event log the host shipped does not parse",
            FindingCode::BootLogMismatch => {
                "the boot's event log does not replay to the quoted PCRs 0-9 (or they changed within the boot): the log is not what was measured"
            }
            FindingCode::BootLogMissing => {
                "the policy judges the boot from its event log, but none of this boot has verified: the boot is not judged"
            }
            FindingCode::BootComponentNotAccepted => {
                "a measured boot loader, kernel or initrd is not in the policy's accepted set"
            }
            FindingCode::BootCmdlineNotAccepted => {
                "the measured kernel command line lacks a required argument, carries a forbidden one, or is not proven by the log"
            }
            FindingCode::SecureBootNotAccepted => {
                "Secure Boot is not enabled, or a measured PK, KEK, db or dbx is not one the policy accepts"
            }
            FindingCode::GuardContradictsBoot => {
                "the daemon says its guard is sealed as BPF LSM programs, but the measured command line enables no BPF LSM"
            }
            FindingCode::TpmHeldElsewhere => {
                "other processes hold descriptors of the TPM the guard keeps, opened before it sealed: they can quote with the daemon's AK"
            }
            FindingCode::StorageResidue => {
                "writable persistent storage (disks, swap, persistent filesystems) exceeds the policy's max_residue_persistent: state can survive the wipe there"
            }
            FindingCode::StorageResidueInconsistent => {
                "the inventory's residue total is not the sum of its residue items"
            }
            FindingCode::StorageUnreadable => {
                "the host could not read part of its storage: the inventory is incomplete"
            }
            FindingCode::StorageUnreported => {
                "the statement carries no storage inventory, and the policy requires one"
            }
            FindingCode::VerifierLogInconsistent => {
                "the host says this verifier's transparency log failed its check: two checkpoints signed with the log key that cannot both be true (a stored statement dropped or rewritten)"
            }
            FindingCode::StorageEraseFailed => {
                "a scratch volume was not erased by key this epoch: what was written to it survives, and it counts as residue"
            }
            FindingCode::TrafficMissing => {
                "the statement carries no traffic report, and the policy requires the tap's commitment of every byte passed"
            }
            FindingCode::TrafficCommitFailed => {
                "the tap could not commit this epoch's traffic: none of the bytes that passed can be checked"
            }
            FindingCode::TrafficInconsistent => {
                "the traffic summary does not add up: unaccounted is not passed - tapped, or more was tapped than passed"
            }
            FindingCode::TrafficUnaccounted => {
                "bytes the policer passed that no committed record covers, above the policy's max_unaccounted"
            }
            FindingCode::TrafficTapDrops => {
                "the tap dropped frames this epoch (ring full, too large or unreadable); the drops fail closed, so nothing passed untapped"
            }
            FindingCode::TrafficNotKept => {
                "the host did not keep this epoch's traffic records: none of them can be opened when sampled"
            }
            FindingCode::TrafficOpeningMissing => {
                "the records sampled from an earlier epoch were not opened by their deadline: what the host sent then cannot be checked"
            }
            FindingCode::TrafficOpeningRefused => {
                "the records opened for a sampled epoch do not match what the host committed (bytes, path or epoch), or leave a drawn offset unanswered"
            }
            FindingCode::TrafficOpeningUnknown => {
                "the statement names openings this verifier never received"
            }
            FindingCode::TrafficFlowNotAllowed => {
                "a sampled record is traffic outside the inference endpoints with a peer the policy does not allow"
            }
            FindingCode::ReplayFailed => {
                "an opened exchange is not what the precommitted model, sampled with the request's seed, produces for it"
            }
            FindingCode::ReplayUnjudged => {
                "an opened record holds the start of a response still in flight at the cut: its bytes are not judged unless its exchange is sampled later"
            }
        }
    }
}

/// Overall and per-aspect status, ordered from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Affirming,
    Warning,
    Contraindicated,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Affirming => "affirming",
            Status::Warning => "warning",
            Status::Contraindicated => "contraindicated",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub aspect: Aspect,
    pub code: FindingCode,
    pub severity: Status,
    pub detail: String,
}

/// The verdict on one statement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttestationResult {
    pub status: Status,
    pub policy_id: String,
    /// Lowercase hex SHA3-256 of the policy the verdict was made under, so a re-derivation
    /// can tell a policy edit from a verdict that does not re-derive. Absent in verdicts
    /// stored before it existed (they still read back byte for byte).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_digest: Option<String>,
    pub rack: String,
    pub host: String,
    pub seq: u64,
    pub trustworthiness: BTreeMap<Aspect, Status>,
    pub findings: Vec<Finding>,
    /// The root of trust the verifier could verify (`none`, `tpm`, `tpm_ima`), never the
    /// host's claim. Absent when no TPM is in play, as in verdicts made before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_of_trust: Option<crate::tpm::TrustLevel>,
    /// What the daemon's sealed guard rests on, judged from the measured boot (issue 41).
    /// Absent when the statement reports no sealed guard, as in verdicts made before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard: Option<GuardBasis>,
}

/// What a sealed guard's claim rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuardBasis {
    /// The quoted boot allows the guard (BPF LSM enabled on the measured command line, or an
    /// accepted kernel for the fmod_ret guard) and IMA proves the accepted daemon ran: the TPM
    /// says what the daemon says.
    ProvenByBoot,
    /// Only the daemon says so: no verified boot log, no IMA proof of the daemon, or a boot
    /// that does not show what the guard needs.
    DaemonWord,
    /// The measured boot cannot run the guard the daemon says is sealed.
    ContradictedByBoot,
}

impl GuardBasis {
    pub fn name(self) -> &'static str {
        match self {
            GuardBasis::ProvenByBoot => "proven_by_boot",
            GuardBasis::DaemonWord => "daemon_word",
            GuardBasis::ContradictedByBoot => "contradicted_by_boot",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured from a verifier database before the result moved here: the `result` column
    // holds the verdict serialised as declared (aspects in their enum order).
    const STORED_RESULT: &str = concat!(
        r#"{"status":"contraindicated","policy_id":"test-policy","rack":"rack-a","host":"h1","seq":7,"#,
        r#""trustworthiness":{"identity":"affirming","chain":"affirming","freshness":"affirming","limiter":"affirming","wipe":"contraindicated","images":"affirming","budget":"warning"},"#,
        r#""findings":[{"aspect":"wipe","code":"residue_above_max","severity":"contraindicated","detail":"host residue 5 GiB above 4 GiB"},"#,
        r#"{"aspect":"budget","code":"counters_reset","severity":"warning","detail":"egress passed_bytes went from 9 to 3"}]}"#
    );

    #[test]
    fn a_stored_result_round_trips_byte_for_byte() {
        let r: AttestationResult = serde_json::from_str(STORED_RESULT).unwrap();
        assert_eq!(r.status, Status::Contraindicated);
        assert_eq!(r.trustworthiness[&Aspect::Budget], Status::Warning);
        assert_eq!(r.findings[0].code, FindingCode::ResidueAboveMax);
        assert_eq!(r.findings[1].aspect, FindingCode::CountersReset.aspect());
        assert_eq!(serde_json::to_string(&r).unwrap(), STORED_RESULT);
    }

    #[test]
    fn names_are_the_serialised_codes() {
        for c in FindingCode::ALL {
            assert_eq!(serde_json::to_value(c).unwrap(), c.name(), "{c:?}");
        }
        for a in Aspect::ALL {
            assert_eq!(serde_json::to_value(a).unwrap(), a.name(), "{a:?}");
        }
    }
}
