//! The self-protection guard: BPF LSM programs (`ebpf/src/guard.rs`) that refuse, for every
//! process but the daemon, what would switch the policer off. The daemon fills one
//! [`GuardConfig`] (our objects by id, our pin directories by inode, our interfaces by
//! network namespace and index, the daemon's executable) and freezes it; the programs only
//! read it.
//!
//! Struct offsets inside kernel objects differ between kernels, so the daemon reads them
//! from the running kernel's BTF and passes them in [`KernelOffsets`]: one build runs on 6.1
//! and on the newest kernels alike.

/// Written into [`GuardConfig::magic`] once the daemon has filled the config. Until then
/// (a guard attached but not yet configured) the programs refuse nothing.
pub const GUARD_MAGIC: u64 = 0x5257_4755_4152_4431; // "RWGUARD1"

pub const GUARD_MAX_IDS: usize = 16;
pub const GUARD_MAX_DIRS: usize = 8;
pub const GUARD_MAX_IFACES: usize = 8;
/// TPM character devices (`tpm<N>` and `tpmrm<N>`) the guard keeps for the daemon.
pub const GUARD_MAX_TPM_DEVS: usize = 4;
/// The netlink hook reads at most this many messages of one `sendmsg`; a larger batch to an
/// interface-bearing rtnetlink socket is refused for everyone but the daemon.
pub const GUARD_MAX_NLMSGS: u32 = 32;

/// Byte offsets of the kernel struct members the guard reads, from the kernel's BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `task_struct.mm`, `task_struct.nsproxy`.
    pub task_mm: u32,
    pub task_nsproxy: u32,
    /// `nsproxy.net_ns`; `net.ns.inum` (the namespace's inode number).
    pub nsproxy_net_ns: u32,
    pub net_inum: u32,
    /// `mm_struct.exe_file`; `file.f_inode`, `file.f_mode`.
    pub mm_exe_file: u32,
    pub file_inode: u32,
    pub file_mode: u32,
    /// `inode.i_ino`, `inode.i_sb`; `super_block.s_dev`.
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    /// `bpf_map.id`; `bpf_prog.aux`, `bpf_prog_aux.id`.
    pub map_id: u32,
    pub prog_aux: u32,
    pub prog_aux_id: u32,
    /// `sk_buff.data`, `sk_buff.len`; `sock.sk_protocol`, `sock.__sk_common.skc_net.net`.
    pub skb_data: u32,
    pub skb_len: u32,
    pub sk_protocol: u32,
    pub sk_net: u32,
    /// `inode.i_rdev` (kernel encoding), `inode.i_mode` (a u16).
    pub inode_rdev: u32,
    pub inode_mode: u32,
    pub _pad: u32,
}

/// A file as the kernel names it: the superblock's `s_dev` (kernel encoding: major << 20 |
/// minor) and the inode number.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileId {
    pub dev: u32,
    pub _pad: u32,
    pub ino: u64,
}

/// An interface in a network namespace (ifindexes repeat across namespaces).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuardedIface {
    /// Inode number of the network namespace (`/proc/self/ns/net`).
    pub netns: u32,
    pub ifindex: u32,
}

/// The guard's only config value, written once by the daemon and frozen.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuardConfig {
    pub magic: u64,
    pub off: KernelOffsets,
    /// The daemon's executable: a process whose `mm->exe_file` is this file is the daemon.
    /// Its behaviour is attested (every cap it enforces is in its statements), so any
    /// instance of it may change the policer; nothing else may. The guard also refuses
    /// opening this file for writing and `prctl(PR_SET_MM_EXE_FILE)`, so no other process
    /// can become it.
    pub daemon_exe: FileId,
    /// The bpffs superblock holding our pins, and our pin directories' inodes: looking up
    /// or changing anything in them (open a pin, unlink it, pin next to it) is refused.
    pub pin_dev: u32,
    pub n_dirs: u32,
    pub dirs: [u64; GUARD_MAX_DIRS],
    pub n_ifaces: u32,
    pub n_maps: u32,
    pub ifaces: [GuardedIface; GUARD_MAX_IFACES],
    pub n_progs: u32,
    pub n_links: u32,
    pub maps: [u32; GUARD_MAX_IDS],
    pub progs: [u32; GUARD_MAX_IDS],
    pub links: [u32; GUARD_MAX_IDS],
    /// The TPM's character devices (`i_rdev`, kernel encoding): opening any node of them is
    /// refused to every process but the daemon, so no other process can load the daemon's
    /// AK and quote with it (a shell writing raw TPM commands included).
    pub n_tpm_devs: u32,
    pub tpm_devs: [u32; GUARD_MAX_TPM_DEVS],
    pub _pad: u32,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            magic: 0,
            off: KernelOffsets::default(),
            daemon_exe: FileId::default(),
            pin_dev: 0,
            n_dirs: 0,
            dirs: [0; GUARD_MAX_DIRS],
            n_ifaces: 0,
            n_maps: 0,
            ifaces: [GuardedIface::default(); GUARD_MAX_IFACES],
            n_progs: 0,
            n_links: 0,
            maps: [0; GUARD_MAX_IDS],
            progs: [0; GUARD_MAX_IDS],
            links: [0; GUARD_MAX_IDS],
            n_tpm_devs: 0,
            tpm_devs: [0; GUARD_MAX_TPM_DEVS],
            _pad: 0,
        }
    }
}

/// What the guard refused, per CPU (summed by the daemon), by path.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuardRefusals {
    /// `BPF_LINK_GET_FD_BY_ID` of one of our links.
    pub link_fd: u64,
    /// A map fd (by id, by pin, any mode) of one of our maps.
    pub map_fd: u64,
    /// A program fd of one of our programs.
    pub prog_fd: u64,
    /// tcx/XDP attach or detach on one of our interfaces (`bpf()`).
    pub attach: u64,
    /// A lookup or change in one of our pin directories.
    pub pin_dir: u64,
    /// An rtnetlink qdisc/filter/chain change on one of our interfaces.
    pub netlink: u64,
    /// ptrace, `/proc/PID/mem`, `pidfd_getfd` of the daemon.
    pub ptrace: u64,
    /// Opening the daemon's executable for writing, or `prctl(PR_SET_MM_EXE_FILE/MAP)`.
    pub identity: u64,
    /// Opening a TPM device node (the daemon's AK is usable through it).
    pub tpm: u64,
    /// `bpf_ktime_get_ns` of the latest refusal on this CPU, and who it was.
    pub last_ns: u64,
    pub last_tgid: u32,
    /// Which counter above the latest refusal went to (0-based, in field order).
    pub last_path: u32,
}

pub mod guard_map_names {
    pub const CONFIG: &str = "RW_GUARD";
    pub const REFUSALS: &str = "RW_GUARD_REFUSALS";
}

/// A `bpf()` call that may have changed our hooks, as the tamper watch (`ebpf/src/watch.rs`)
/// reports it to the daemon the moment the call returns (hosts without the guard).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TamperEvent {
    /// `enum bpf_cmd`.
    pub cmd: u32,
    pub tgid: u32,
    /// The call's return value (only successful calls are reported).
    pub ret: i64,
}

/// The `bpf()` commands the watch reports: each can detach, replace or precede a policer.
pub const WATCHED_BPF_CMDS: [u32; 6] = [
    8,  // BPF_PROG_ATTACH
    9,  // BPF_PROG_DETACH
    28, // BPF_LINK_CREATE
    29, // BPF_LINK_UPDATE
    34, // BPF_LINK_DETACH
    2,  // BPF_MAP_UPDATE_ELEM (refused on our frozen maps; reported anyway)
];
