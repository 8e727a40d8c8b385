//! Typed parts of the epoch predicate. An absent optional report means "not performed";
//! no default here ever reads as success.

use serde::{Deserialize, Serialize};

/// Traffic direction as seen from the rack host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Egress,
    Ingress,
}

impl Direction {
    pub const ALL: [Direction; 2] = [Direction::Egress, Direction::Ingress];
    pub fn name(self) -> &'static str {
        match self {
            Direction::Egress => "egress",
            Direction::Ingress => "ingress",
        }
    }
}

/// Kernel identity of one loaded program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgramIdentity {
    pub name: String,
    pub id: u32,
    /// The kernel's program tag (hash of the instructions), hex as bpftool prints it.
    pub tag: String,
}

/// Monotonic policer counters for one direction, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimiterCounters {
    pub passed_bytes: u64,
    pub passed_packets: u64,
    pub dropped_bytes: u64,
    pub dropped_packets: u64,
    pub unconfigured_drops: u64,
    pub contention_drops: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GapKind {
    /// Our program was not on the hook (someone detached it, or it was missing at start).
    Detached,
    /// Another program held our place (our id gone, a different program on the hook).
    Replaced,
    /// A program not ours runs before ours and can pass packets we never see.
    ForeignAhead,
    /// The cap in the pinned config map was not the one we wrote.
    ConfigChanged,
    /// A check itself failed (e.g. the hook could not be queried): enforcement unproven.
    CheckFailed,
    /// A counter went down between two samples. Only a program can write our frozen maps,
    /// so someone's program rewrote them, and the bytes counted since the last sample are
    /// unproven. Never restored: the counters cannot be put back.
    CountersRewound,
}

/// How a tamper path is stopped on this host, strongest first. The verifier weighs it:
/// `refused` means the kernel refuses the attempt; the others bound how long it can last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProtectionLevel {
    /// The kernel refuses the operation for every process but the daemon (or for all).
    Refused,
    /// Seen as it happens (a kernel event), restored at once; the gap is recorded.
    RestoredOnEvent,
    /// Found at the next hook check (`poll_interval_ms`), restored then; the gap is recorded.
    RestoredOnPoll,
    /// Found at the next counter sample and recorded as a gap; cannot be undone.
    DetectedOnSample,
    /// Nothing stops or notices it.
    Unprotected,
}

impl ProtectionLevel {
    /// Strongest first: 0 is `refused`.
    pub fn rank(self) -> u8 {
        match self {
            ProtectionLevel::Refused => 0,
            ProtectionLevel::RestoredOnEvent => 1,
            ProtectionLevel::RestoredOnPoll => 2,
            ProtectionLevel::DetectedOnSample => 3,
            ProtectionLevel::Unprotected => 4,
        }
    }

    /// As it is written in statements and configs (`restored_on_poll`).
    pub fn name(self) -> &'static str {
        match self {
            ProtectionLevel::Refused => "refused",
            ProtectionLevel::RestoredOnEvent => "restored_on_event",
            ProtectionLevel::RestoredOnPoll => "restored_on_poll",
            ProtectionLevel::DetectedOnSample => "detected_on_sample",
            ProtectionLevel::Unprotected => "unprotected",
        }
    }

    pub const ALL: [ProtectionLevel; 5] = [
        ProtectionLevel::Refused,
        ProtectionLevel::RestoredOnEvent,
        ProtectionLevel::RestoredOnPoll,
        ProtectionLevel::DetectedOnSample,
        ProtectionLevel::Unprotected,
    ];
}

/// What stops another root process from switching the limiter off, path by path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelfProtection {
    /// `bpf(BPF_MAP_UPDATE_ELEM)` / `DELETE` on the config, bucket-state and counters maps.
    pub map_writes: ProtectionLevel,
    /// Detaching our programs from a hook, or replacing them there.
    pub detach: ProtectionLevel,
    /// Attaching a program that runs before ours.
    pub foreign_ahead: ProtectionLevel,
    /// A program of someone else's writing our bucket state or counters (a frozen map still
    /// takes program writes; the config map takes none).
    pub program_writes: ProtectionLevel,
    /// How often the hooks are checked.
    pub poll_interval_ms: u64,
    /// The counter sample interval behind `detected_on_sample`.
    pub sample_interval_ms: u64,
    /// Whether `bpf` is among the kernel's active LSMs: a guard sealed as BPF LSM programs
    /// (`attach: lsm`) refuses nothing without it; one sealed as `fmod_ret` does not need it.
    pub bpf_lsm_active: bool,
    /// The guard behind the `refused` levels (BPF LSM or fmod_ret), or why there is none.
    #[serde(default)]
    pub lsm_guard: LsmGuard,
}

/// The daemon's guard (`self_protection` in the daemon's config): BPF LSM programs, or the
/// same programs as `fmod_ret` on `security_*` (the enum keeps its first name: it is in the
/// statements).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", deny_unknown_fields)]
pub enum LsmGuard {
    /// In force: these LSM hooks refuse tampering for every process but the daemon.
    Sealed {
        /// Where its programs run (absent in statements from daemons that had only BPF LSM).
        #[serde(default)]
        attach: GuardAttach,
        hooks: Vec<String>,
        /// Arguments of the kernel's `bpf` hook (3 on 6.1, 4 from 6.9), from its BTF.
        bpf_hook_args: usize,
        /// Maps, programs and links named in its frozen config.
        objects: usize,
        /// Attempts it refused since it was loaded (someone tried).
        refusals: u64,
        /// TPM character devices it refuses to every other process (0: the TPM is not kept
        /// for the daemon, or the host has none): with them, the daemon's AK quotes only what
        /// the daemon asks.
        #[serde(default, skip_serializing_if = "is_zero")]
        tpm_devices: u32,
        /// Descriptors of those devices that other processes hold, opened before the guard
        /// sealed (it refuses opens, not reads and writes on a descriptor already open),
        /// counted when the statement was made: each can still send the TPM commands, the
        /// daemon's AK included, so while it is not 0 the TPM is not the daemon's alone.
        #[serde(default, skip_serializing_if = "is_zero")]
        tpm_held_elsewhere: u32,
    },
    /// Not loaded, and why.
    Unavailable { reason: String },
    /// A statement from a daemon that predates the guard.
    #[default]
    NotReported,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Where the guard's programs run. Both refuse the same calls, in the kernel, before they
/// take effect; they differ in what the kernel must have been booted with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuardAttach {
    /// BPF LSM programs on the `bpf_lsm_<hook>` functions: needs `bpf` among the active LSMs.
    #[default]
    Lsm,
    /// `fmod_ret` tracing programs on the `security_<hook>` functions, which every caller of
    /// a hook goes through whatever LSMs are active: for kernels booted without BPF LSM.
    FmodRet,
}

impl GuardAttach {
    pub fn name(self) -> &'static str {
        match self {
            GuardAttach::Lsm => "lsm",
            GuardAttach::FmodRet => "fmod_ret",
        }
    }
}

/// An interval in which the limiter was not provably enforcing our cap on a hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnforcementGap {
    pub kind: GapKind,
    pub interface: Option<String>,
    pub direction: Option<Direction>,
    /// Unix ms of the last check that found this hook enforcing (start of the gap at worst).
    pub last_verified_at_ms: Option<u64>,
    /// Unix ms when the gap was detected.
    pub detected_at_ms: u64,
    pub detail: String,
    /// Whether the daemon restored enforcement right after detecting it.
    pub restored: bool,
}

/// One hook at the epoch's end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachPoint {
    pub interface: String,
    pub direction: Direction,
    pub attached: bool,
    /// Ids of programs that run before ours on this hook.
    pub foreign_ahead: Vec<u32>,
}

/// The cap in force for one direction at the epoch's end, as read from the kernel map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapInForce {
    pub direction: Direction,
    pub rate_bytes_per_s: u64,
    pub burst_bytes: u64,
    pub small_reserve_bytes: u64,
    pub generation: u32,
}

/// Written as one flat object (`{"direction":"egress","passed_bytes":...}`), read and written
/// through [`DirectionCountersWire`]: `#[serde(flatten)]` would buffer the object to read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "DirectionCountersWire", into = "DirectionCountersWire")]
pub struct DirectionCounters {
    pub direction: Direction,
    pub counters: LimiterCounters,
}

/// [`DirectionCounters`] as it is written, field for field in the same order.
#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DirectionCountersWire {
    direction: Direction,
    passed_bytes: u64,
    passed_packets: u64,
    dropped_bytes: u64,
    dropped_packets: u64,
    unconfigured_drops: u64,
    contention_drops: u64,
}

impl From<DirectionCountersWire> for DirectionCounters {
    fn from(w: DirectionCountersWire) -> Self {
        DirectionCounters {
            direction: w.direction,
            counters: LimiterCounters {
                passed_bytes: w.passed_bytes,
                passed_packets: w.passed_packets,
                dropped_bytes: w.dropped_bytes,
                dropped_packets: w.dropped_packets,
                unconfigured_drops: w.unconfigured_drops,
                contention_drops: w.contention_drops,
            },
        }
    }
}

impl From<DirectionCounters> for DirectionCountersWire {
    fn from(d: DirectionCounters) -> Self {
        let c = d.counters;
        DirectionCountersWire {
            direction: d.direction,
            passed_bytes: c.passed_bytes,
            passed_packets: c.passed_packets,
            dropped_bytes: c.dropped_bytes,
            dropped_packets: c.dropped_packets,
            unconfigured_drops: c.unconfigured_drops,
            contention_drops: c.contention_drops,
        }
    }
}

/// Whether a protection is in place (never assumed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProtectionState {
    Present,
    Absent,
}

impl ProtectionState {
    /// As it is written in statements (`present`).
    pub fn name(self) -> &'static str {
        match self {
            ProtectionState::Present => "present",
            ProtectionState::Absent => "absent",
        }
    }
}

impl std::fmt::Display for ProtectionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// A protection the daemon tried to put in place: `present` or `absent` (never assumed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Protection {
    pub state: ProtectionState,
    pub detail: String,
    pub cgroup: Option<String>,
    pub program_id: Option<u32>,
}

/// Bypass socket options refused so far (monotonic), with the latest offender.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefusalCounts {
    pub qdisc_bypass: u64,
    pub xdp_umem_reg: u64,
    pub last_tgid: u32,
    pub last_cgroup_id: u64,
}

/// Paths around the limiter: what is refused, and what software here cannot block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BypassReport {
    /// The system-wide refusal of PACKET_QDISC_BYPASS and XDP_UMEM_REG.
    pub refusal: Protection,
    pub refusals: Option<RefusalCounts>,
    /// RDMA / InfiniBand / RoCE devices (traffic never passes tc).
    pub rdma_devices: Vec<String>,
    /// PCI devices bound to vfio-pci (NICs handed to userspace).
    pub vfio_devices: Vec<String>,
    /// Network interfaces other than loopback that no cap covers.
    pub uncapped_interfaces: Vec<String>,
    /// Open AF_XDP sockets, when they can be counted.
    pub af_xdp_sockets: Option<u64>,
}

/// How the policer is attached on a host's kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachKind {
    /// tcx bpf_link (kernel >= 6.6), pinned under `links/`.
    Tcx,
    /// Netlink cls_bpf filter on a clsact qdisc (older kernels); persists without a pin.
    Clsact,
}

impl AttachKind {
    /// As it is written in statements (`tcx`).
    pub fn name(self) -> &'static str {
        match self {
            AttachKind::Tcx => "tcx",
            AttachKind::Clsact => "clsact",
        }
    }
}

impl std::fmt::Display for AttachKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimiterEvidence {
    pub attach_kind: AttachKind,
    pub pin_root: String,
    pub programs: Vec<ProgramIdentity>,
    pub attach_points: Vec<AttachPoint>,
    pub caps: Vec<CapInForce>,
    /// Counters at the epoch's end (monotonic: the verifier subtracts the previous epoch's).
    pub counters: Vec<DirectionCounters>,
    /// Enforcement gaps detected within the epoch.
    pub gaps: Vec<EnforcementGap>,
    /// Absent in statements of producers that do not report it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bypass: Option<BypassReport>,
    /// Absent in statements of producers that do not report it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_protection: Option<SelfProtection>,
}

/// The limiter part of a statement: present with its evidence, or absent with the reason.
/// Read in one pass (`crate::tagged`): the evidence is most of a statement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum LimiterReport {
    Present(Box<LimiterEvidence>),
    Absent { finding: String },
}

impl crate::tagged::Tagged for LimiterReport {
    const TAG: &'static str = "state";
    const VARIANTS: &'static [&'static str] = &["present", "absent"];
    const EXPECTING: &'static str = "a limiter report";
    fn variant<'de, D: serde::Deserializer<'de>>(
        index: usize,
        fields: D,
    ) -> Result<Self, D::Error> {
        /// Like serde's derive for this enum, which has no `deny_unknown_fields`: other
        /// fields are ignored, but not a second tag.
        #[derive(Deserialize)]
        struct Absent {
            finding: String,
            #[serde(default)]
            state: Option<serde::de::IgnoredAny>,
        }
        if index == 0 {
            LimiterEvidence::deserialize(fields).map(|e| LimiterReport::Present(Box::new(e)))
        } else {
            let a = Absent::deserialize(fields)?;
            if a.state.is_some() {
                return Err(serde::de::Error::duplicate_field("state"));
            }
            Ok(LimiterReport::Absent { finding: a.finding })
        }
    }
}

impl<'de> Deserialize<'de> for LimiterReport {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::tagged::deserialize(d)
    }
}

/// How a device's wipe ended; only `complete` with no mismatches is a wipe of the bytes
/// verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WipeStatus {
    Complete,
    Interrupted,
    /// No such device here (no GPU, no driver).
    Absent,
    Unsupported,
    Failed,
}

impl WipeStatus {
    /// As it is written in statements (`complete`).
    pub fn name(self) -> &'static str {
        match self {
            WipeStatus::Complete => "complete",
            WipeStatus::Interrupted => "interrupted",
            WipeStatus::Absent => "absent",
            WipeStatus::Unsupported => "unsupported",
            WipeStatus::Failed => "failed",
        }
    }
}

/// A wipe status name that is none of [`WipeStatus`]'s.
#[derive(Debug, thiserror::Error)]
#[error("unknown wipe status `{0}`")]
pub struct UnknownWipeStatus(pub String);

impl std::str::FromStr for WipeStatus {
    type Err = UnknownWipeStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            WipeStatus::Complete,
            WipeStatus::Interrupted,
            WipeStatus::Absent,
            WipeStatus::Unsupported,
            WipeStatus::Failed,
        ]
        .into_iter()
        .find(|w| w.name() == s)
        .ok_or_else(|| UnknownWipeStatus(s.to_string()))
    }
}

impl std::fmt::Display for WipeStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// Per-device result of a wipe (filled in by the wipe engine). Residue is
/// `bytes_total - bytes_verified`, never rounded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WipeDeviceReport {
    pub backend: String,
    pub device: String,
    /// Only `complete` with `mismatches == 0` is a wipe of `bytes_verified` bytes.
    pub status: WipeStatus,
    pub bytes_total: u64,
    pub bytes_filled: u64,
    pub bytes_verified: u64,
    pub mismatches: u64,
    pub residue_bytes: u64,
    /// Time spent filling and verifying (GB/s = bytes / time).
    pub fill_ms: u64,
    pub verify_ms: u64,
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WipeReport {
    /// Hex of the 32-byte challenge nonce the fill stream was keyed with.
    pub nonce: String,
    /// The fill stream's domain string (`rackwarden/wipe-stream/v2`), so whoever holds the
    /// nonce knows which definition to recompute. Absent in reports made before v2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    pub interrupted: bool,
    pub devices: Vec<WipeDeviceReport>,
}

/// One image checked against the signed manifest (filled in by the image loader).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageResult {
    pub name: String,
    pub size: u64,
    pub merkle_sha3_256: String,
    pub ok: bool,
    pub finding: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageReport {
    /// SHA3-256 of the manifest envelope's PAE bytes.
    pub manifest_sha3_256: String,
    pub images: Vec<ImageResult>,
}

/// Something the daemon must disclose about its own evidence trail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Incident {
    /// The log's last line was incomplete when the daemon opened it (a crash mid-write).
    /// The bytes stay in the log; the chain continues from the last good statement.
    TornLogTail {
        offset: u64,
        length: u64,
        sha3_256: String,
    },
    /// A complete line that is not a valid statement of ours.
    CorruptLogLine {
        offset: u64,
        length: u64,
        sha3_256: String,
    },
    /// An epoch that began and never signed its statement: the daemon was killed, crashed or
    /// stopped in `state`. Whatever that epoch did (a partial wipe, workloads stopped) is
    /// unproven; the epoch that carries this incident starts over.
    EpochInterrupted {
        /// The `seq` the interrupted epoch's statement would have had.
        seq: u64,
        /// The epoch state it was in: `challenging`, `challenged`, `draining`, `wiping`,
        /// `staging`, `restarting` or `signing`; `unknown` when the journal that would say
        /// was unreadable (kept aside on the host as `epoch-in-progress.unreadable-<ms>`).
        state: String,
        started_unix_ms: u64,
        /// When the daemon found it (its next start).
        detected_unix_ms: u64,
    },
    /// The verifier's transparency log failed the host's check (issue 24): an entry whose
    /// proof does not lead to its signed checkpoint, or a checkpoint that is not an extension
    /// of the one the host kept. The two signed checkpoints are the proof anyone can check
    /// with the verifier's log key.
    VerifierLogInconsistent {
        detected_unix_ms: u64,
        /// What failed, naming both checkpoints (sizes and roots).
        error: String,
        /// The checkpoint the host had kept (signed note); absent before the first one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kept_checkpoint: Option<String>,
        /// The checkpoint that did not check out (signed note).
        shown_checkpoint: String,
    },
}

impl Incident {
    /// The log byte offset a log-damage incident discloses, if it is one.
    pub fn log_offset(&self) -> Option<u64> {
        match self {
            Incident::TornLogTail { offset, .. } | Incident::CorruptLogLine { offset, .. } => {
                Some(*offset)
            }
            Incident::EpochInterrupted { .. } | Incident::VerifierLogInconsistent { .. } => None,
        }
    }
}

/// What started an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpochTrigger {
    /// The first epoch after the daemon started with no epoch history.
    Startup,
    /// `wipe_interval` elapsed since the previous epoch.
    Interval,
    /// An operator or the verifier asked for one (`rackwarden wipe-now`).
    WipeNow,
    /// The previous epoch was interrupted (see the `epoch_interrupted` incident).
    AfterInterruption,
}

/// One phase of an epoch and its duration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseTime {
    /// `challenge`, `drain`, `wipe`, `stage` or `restart`. (Signing cannot be timed inside
    /// the statement it signs: `rackwarden status` shows it.)
    pub phase: String,
    pub ms: u64,
}

/// What happened to the inference workloads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", deny_unknown_fields)]
pub enum WorkloadOutcome {
    /// No workloads are configured: nothing was drained or restarted.
    NoneConfigured,
    /// Drained before the wipe and restarted after every check passed.
    Restarted,
    /// Drained and deliberately left stopped, with the reason (a failed wipe, an image
    /// mismatch, a failed restart).
    LeftStopped { reason: String },
    /// They could not be drained; the wipe did not run.
    DrainFailed { reason: String },
}

/// How the epoch ran: trigger, phase times and the inference downtime it cost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochRun {
    pub trigger: EpochTrigger,
    /// The configured `wipe_interval` (ms), so downtime / interval can be judged.
    pub wipe_interval_ms: u64,
    pub phases: Vec<PhaseTime>,
    pub workloads: WorkloadOutcome,
    /// From the start of the drain to the end of the restart (or to signing, when the
    /// workloads were left stopped), ms. 0 when no workloads are configured.
    pub downtime_ms: u64,
}

/// Which daemon produced the statement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProducerIdentity {
    pub name: String,
    pub version: String,
    /// SHA3-256 of the producing binary (`/proc/self/exe`), hex.
    pub binary_sha3_256: String,
}
