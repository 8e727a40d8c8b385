//! Types shared by the eBPF policer and the daemon. Every type here is `#[repr(C)]`, has no
//! padding holes (explicit `_pad` fields) and is read and written through BPF maps, so the
//! layout is the contract between the kernel side and userspace.
#![no_std]

pub mod guard;
pub mod tap;
pub mod wipe;

/// Index of the egress bucket in [`BucketConfig`] / [`BucketState`] / [`Counters`] arrays.
pub const DIR_EGRESS: u32 = 0;
/// Index of the ingress bucket.
pub const DIR_INGRESS: u32 = 1;
/// Number of buckets: one per direction. All frontend interfaces of a host share the host's
/// budget (the host's share of the rack cap), so one bucket per direction is the whole group.
pub const NUM_BUCKETS: u32 = 2;

/// Written into [`BucketConfig::magic`] by the daemon. A config slot without it (a zeroed,
/// never-initialised or foreign-written map) makes the policer drop every packet: fail closed.
pub const CONFIG_MAGIC: u32 = 0x5257_4331; // "RWC1"

/// The cap for one direction, written by the daemon, read by the policer on every packet.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BucketConfig {
    /// Sustained rate in bytes per second (counted as `skb->len`, so L2 frame bytes).
    pub rate_bytes_per_s: u64,
    /// Bucket depth in bytes: the most that can pass at once after an idle period.
    pub burst_bytes: u64,
    /// `floor(burst_bytes * 1e9 / rate_bytes_per_s)`, precomputed by the daemon so the
    /// policer never multiplies two large numbers. Floor keeps the bound conservative.
    pub tau_ns: u64,
    /// The bucket depth (as time) that packets longer than `small_max_len` may use:
    /// `tau_ns` minus the small-packet reserve. A bulk flow therefore never takes the last
    /// `reserve` bytes of the bucket, and small packets (prompts, tokens, ACKs) always find
    /// room beside it. The hard bound (burst + rate x T) is unchanged: it is set by `tau_ns`.
    pub bulk_tau_ns: u64,
    /// Packets of at most this many bytes (`skb->len`) may use the whole bucket.
    pub small_max_len: u32,
    /// Monotonic config generation, bumped by the daemon on every cap change (evidence of
    /// who changed what when, and a cheap way to detect a foreign write).
    pub generation: u32,
    /// Must equal [`CONFIG_MAGIC`] or the policer drops.
    pub magic: u32,
    /// The reserve behind `bulk_tau_ns`, in bytes, recorded for evidence and status.
    pub small_reserve_bytes: u32,
}

/// The config map's only value: both directions' caps. One entry, not one per direction:
/// the map is `BPF_F_RDONLY_PROG` and frozen, and the kernel reads such a map's value at
/// load time (the caps become constants of the program) only when it has a single entry
/// (a two-entry read-only array is refused with ENOTSUPP).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LimiterConfig {
    pub egress: BucketConfig,
    pub ingress: BucketConfig,
}

impl LimiterConfig {
    pub fn get(&self, dir: u32) -> &BucketConfig {
        if dir == DIR_EGRESS {
            &self.egress
        } else {
            &self.ingress
        }
    }
    pub fn get_mut(&mut self, dir: u32) -> &mut BucketConfig {
        if dir == DIR_EGRESS {
            &mut self.egress
        } else {
            &mut self.ingress
        }
    }
}

/// Token-bucket state as GCRA: the theoretical arrival time of the next conforming byte.
/// A packet of `len` bytes conforms iff `max(tat, now) + cost(len) <= now + tau`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BucketState {
    /// Nanoseconds on `bpf_ktime_get_ns` (CLOCK_MONOTONIC). Only ever moved forward with a
    /// compare-and-exchange, so two CPUs can never both spend the same budget.
    pub tat_ns: u64,
}

/// Per-direction counters, kept per CPU (exact without atomics) and summed by the daemon.
/// All fields are monotonic for the life of the pinned map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub passed_bytes: u64,
    pub passed_packets: u64,
    pub dropped_bytes: u64,
    pub dropped_packets: u64,
    /// Packets dropped because the config slot was missing or not initialised (fail closed).
    pub unconfigured_drops: u64,
    /// Packets dropped because the compare-and-exchange lost too many races in a row.
    pub contention_drops: u64,
}

impl Counters {
    /// Field-wise sum; used to fold the per-CPU values.
    pub fn add(&mut self, other: &Counters) {
        self.passed_bytes = self.passed_bytes.wrapping_add(other.passed_bytes);
        self.passed_packets = self.passed_packets.wrapping_add(other.passed_packets);
        self.dropped_bytes = self.dropped_bytes.wrapping_add(other.dropped_bytes);
        self.dropped_packets = self.dropped_packets.wrapping_add(other.dropped_packets);
        self.unconfigured_drops = self
            .unconfigured_drops
            .wrapping_add(other.unconfigured_drops);
        self.contention_drops = self.contention_drops.wrapping_add(other.contention_drops);
    }
}

/// `setsockopt` levels and options refused system-wide: each lets traffic skip tc.
pub const SOL_PACKET: i32 = 263;
pub const PACKET_QDISC_BYPASS: i32 = 20;
pub const SOL_XDP: i32 = 283;
pub const XDP_UMEM_REG: i32 = 4;

/// Refusals by the `cgroup/setsockopt` program, per CPU (summed by the daemon).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RefusalCounters {
    /// `setsockopt(SOL_PACKET, PACKET_QDISC_BYPASS)` refused.
    pub qdisc_bypass: u64,
    /// `setsockopt(SOL_XDP, XDP_UMEM_REG)` refused (no AF_XDP socket can send without it).
    pub xdp_umem_reg: u64,
    /// `bpf_ktime_get_ns` of the latest refusal on this CPU.
    pub last_ns: u64,
    /// Cgroup id and tgid of the latest refused caller on this CPU.
    pub last_cgroup_id: u64,
    pub last_tgid: u32,
    /// The option of the latest refusal (PACKET_QDISC_BYPASS or XDP_UMEM_REG).
    pub last_optname: i32,
}

/// Map names, as they appear in the ELF object and under the pin root.
pub mod map_names {
    pub const CONFIG: &str = "RW_CONFIG";
    pub const STATE: &str = "RW_STATE";
    pub const COUNTERS: &str = "RW_COUNTERS";
    pub const REFUSALS: &str = "RW_REFUSALS";
    /// The tapped policer's ring buffer of frames ([`crate::tap`]).
    pub const TAP: &str = "RW_TAP";
    /// Per-CPU [`crate::tap::TapStats`], one slot per direction.
    pub const TAP_STATS: &str = "RW_TAP_STATS";
}

/// Program names in the ELF object.
pub mod prog_names {
    pub const EGRESS: &str = "rw_egress";
    pub const INGRESS: &str = "rw_ingress";
    pub const SOCKOPT: &str = "rw_sockopt";
}

/// The eBPF programs and the daemon read these types from the same map bytes, so their
/// layout is checked when this crate compiles, for both targets: each is exactly the sum of
/// its fields (no padding the two compilers could fill differently) and of the size the
/// maps were created with.
mod layout {
    use super::guard::{
        FileId, GUARD_MAX_DIRS, GUARD_MAX_IDS, GUARD_MAX_IFACES, GUARD_MAX_TPM_DEVS, GuardConfig,
        GuardRefusals, GuardedIface, KernelOffsets, TamperEvent,
    };
    use super::{BucketConfig, BucketState, Counters, LimiterConfig, RefusalCounters};
    use core::mem::size_of;

    const U32: usize = size_of::<u32>();
    const U64: usize = size_of::<u64>();
    const _: () = assert!(size_of::<BucketConfig>() == 4 * U64 + 4 * U32);
    const _: () = assert!(size_of::<BucketConfig>() == 48);
    const _: () = assert!(size_of::<LimiterConfig>() == 2 * size_of::<BucketConfig>());
    const _: () = assert!(size_of::<BucketState>() == U64);
    const _: () = assert!(size_of::<Counters>() == 6 * U64);
    const _: () = assert!(size_of::<RefusalCounters>() == 4 * U64 + 2 * U32);
    const _: () = assert!(size_of::<KernelOffsets>() == 20 * U32);
    const _: () = assert!(size_of::<FileId>() == 2 * U32 + U64);
    const _: () = assert!(size_of::<GuardedIface>() == 2 * U32);
    const _: () = assert!(
        size_of::<GuardConfig>()
            == U64
                + size_of::<KernelOffsets>()
                + size_of::<FileId>()
                + 2 * U32
                + GUARD_MAX_DIRS * U64
                + 2 * U32
                + GUARD_MAX_IFACES * size_of::<GuardedIface>()
                + 2 * U32
                + 3 * GUARD_MAX_IDS * U32
                + U32
                + GUARD_MAX_TPM_DEVS * U32
                + U32
    );
    const _: () = assert!(size_of::<GuardRefusals>() == 10 * U64 + 2 * U32);
    const _: () = assert!(size_of::<TamperEvent>() == 2 * U32 + U64);
    const _: () = assert!(size_of::<crate::tap::TapChunkHeader>() == 6 * U32 + 2 * U64);
    const _: () = assert!(size_of::<crate::tap::TapStats>() == 7 * U64);
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: repr(C), only u64/u32 fields, no padding (checked in `layout`).
    unsafe impl aya::Pod for super::BucketConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::LimiterConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::BucketState {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Counters {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RefusalCounters {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::tap::TapStats {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::guard::GuardConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::guard::GuardRefusals {}
}
