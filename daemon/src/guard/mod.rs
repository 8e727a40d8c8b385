//! The guard: the daemon loads `ebpf/src/guard.rs` and *seals* the limiter: as BPF LSM
//! programs where the kernel booted with `bpf` in `lsm=`, elsewhere as `fmod_ret` programs
//! on the kernel's `security_*` functions (`fmod_ret.rs`, the same checks). For every process
//! but the daemon, the kernel refuses an fd to any of our maps, programs or links, any
//! lookup in our pin directories, tcx/XDP attach or detach and rtnetlink qdisc/filter
//! changes on our interfaces, and ptrace of the daemon or writing its executable. Nothing is
//! then left for the hook checks to restore: the protection level is `refused`.
//!
//! A seal is one *generation*: a guard object (programs, links, config map) whose config
//! names the objects of ours that exist now, filled once and frozen (`BPF_MAP_FREEZE`:
//! no syscall writes it again, ours included). When our objects change (a cap change or an
//! upgrade loads new programs and a new config map; a re-attach makes new links), the next
//! check seals again: the new generation is attached and configured before the old one is
//! unpinned, so some guard is always in force.
//!
//! The daemon is any process running the daemon's executable (device and inode of
//! `/proc/self/exe`): its actions are the attested ones, so a restarted daemon, or a second
//! instance, may change the policer and reports what it did. A new binary (a package
//! upgrade writes a new file) is not the sealed daemon: it can read nothing of ours and
//! change nothing until the host reboots (or the old binary's daemon, still running, seals
//! for it: not done). The README says so.

pub mod btf;
pub mod fmod_ret;
pub mod keeper;

use std::{
    os::{fd::AsFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
    sync::Mutex,
};

use aya::{
    EbpfLoader,
    maps::{Array, MapData},
    programs::{Lsm, ProgramError, links::FdLink},
};
use rackwarden_attest::evidence::{GuardAttach, LsmGuard};
use rackwarden_common::guard::{
    FileId, GUARD_MAGIC, GUARD_MAX_DIRS, GUARD_MAX_IDS, GUARD_MAX_IFACES, GUARD_MAX_TPM_DEVS,
    GuardConfig, GuardRefusals, GuardedIface, KernelOffsets, guard_map_names,
};

use crate::{bpf_syscall, pins::PinPaths};
use btf::{BtfError, HookFunction, KernelBtf};

/// The guard object, compiled by `build.rs` from `../ebpf/src/guard.rs`.
static GUARD_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/rackwarden-guard"));

/// Each guard program, its LSM hook, and the leading argument types it reads (checked
/// against the kernel's BTF before anything is loaded).
pub const HOOK_SIGNATURES: [(&str, &str, &[&str]); 8] = [
    (
        "rw_guard_bpf",
        "bpf",
        &["int", "union bpf_attr *", "unsigned int"],
    ),
    ("rw_guard_bpf_map", "bpf_map", &["struct bpf_map *"]),
    ("rw_guard_bpf_prog", "bpf_prog", &["struct bpf_prog *"]),
    (
        "rw_guard_inode_permission",
        "inode_permission",
        &["struct inode *", "int"],
    ),
    (
        "rw_guard_netlink_send",
        "netlink_send",
        &["struct sock *", "struct sk_buff *"],
    ),
    (
        "rw_guard_ptrace",
        "ptrace_access_check",
        &["struct task_struct *", "unsigned int"],
    ),
    ("rw_guard_file_open", "file_open", &["struct file *"]),
    (
        "rw_guard_task_prctl",
        "task_prctl",
        &["int", "long unsigned int"],
    ),
];

#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error(transparent)]
    Btf(#[from] BtfError),
    #[error(
        "the kernel refuses BPF LSM programs ({detail}); boot it with `bpf` in `lsm=` (and nothing that forbids BPF LSM loads)"
    )]
    Refused { detail: String },
    #[error(
        "the kernel takes the guard neither as BPF LSM programs ({lsm}) nor as fmod_ret programs on its security_* functions ({fmod_ret})"
    )]
    Unsupported { lsm: String, fmod_ret: String },
    #[error("loading the guard object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("guard program `{prog}` (LSM hook `{hook}`): {detail}")]
    Program {
        prog: &'static str,
        hook: &'static str,
        detail: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the guard names at most {max} {what}; this host has {n}")]
    TooMany {
        what: &'static str,
        n: usize,
        max: usize,
    },
    #[error("guard map {name}: {detail}")]
    Map { name: &'static str, detail: String },
}

/// The error of guard program `prog` on LSM hook `hook`, from a detail.
fn program_error(prog: &'static str, hook: &'static str) -> impl Fn(String) -> GuardError {
    move |detail| GuardError::Program { prog, hook, detail }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> GuardError + '_ {
    move |source| GuardError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The offsets the guard reads, from the running kernel's BTF (each checked for its size).
pub fn kernel_offsets(btf: &KernelBtf) -> Result<KernelOffsets, BtfError> {
    Ok(KernelOffsets {
        task_mm: btf.offset("task_struct", "mm", 8)?,
        task_nsproxy: btf.offset("task_struct", "nsproxy", 8)?,
        nsproxy_net_ns: btf.offset("nsproxy", "net_ns", 8)?,
        net_inum: btf.offset("net", "ns.inum", 4)?,
        mm_exe_file: btf.offset("mm_struct", "exe_file", 8)?,
        file_inode: btf.offset("file", "f_inode", 8)?,
        file_mode: btf.offset("file", "f_mode", 4)?,
        inode_ino: btf.offset("inode", "i_ino", 8)?,
        inode_sb: btf.offset("inode", "i_sb", 8)?,
        sb_dev: btf.offset("super_block", "s_dev", 4)?,
        map_id: btf.offset("bpf_map", "id", 4)?,
        prog_aux: btf.offset("bpf_prog", "aux", 8)?,
        prog_aux_id: btf.offset("bpf_prog_aux", "id", 4)?,
        skb_data: btf.offset("sk_buff", "data", 8)?,
        skb_len: btf.offset("sk_buff", "len", 4)?,
        sk_protocol: btf.offset("sock", "sk_protocol", 2)?,
        sk_net: btf.offset("sock", "__sk_common.skc_net.net", 8)?,
        inode_rdev: btf.offset("inode", "i_rdev", 4)?,
        inode_mode: btf.offset("inode", "i_mode", 2)?,
        _pad: 0,
    })
}

/// A file as the kernel names it (`s_dev` is `major << 20 | minor` inside the kernel; stat
/// reports the userspace encoding).
fn file_id(path: &Path) -> Result<FileId, GuardError> {
    let m = std::fs::metadata(path).map_err(io_err(path))?;
    Ok(FileId {
        dev: kernel_dev(m.dev()),
        _pad: 0,
        ino: m.ino(),
    })
}

fn kernel_dev(dev: u64) -> u32 {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    (major << 20) | minor
}

/// What a seal protects: the limiter's objects as pinned now, our pin directories, our
/// interfaces, and the daemon's executable. Compared at every check: a change seals again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protected {
    pub maps: Vec<u32>,
    pub progs: Vec<u32>,
    pub links: Vec<u32>,
    pub pin_dev: u32,
    pub dirs: Vec<u64>,
    pub ifaces: Vec<GuardedIface>,
    pub daemon_exe: FileId,
    /// The TPM's character devices (kernel encoding), kept for the daemon.
    pub tpm_devs: Vec<u32>,
}

/// The id of the object pinned at `path`.
fn pinned_id(path: &Path) -> Result<u32, GuardError> {
    let fd = bpf_syscall::obj_get(path).map_err(io_err(path))?;
    bpf_syscall::obj_id(&fd).map_err(io_err(path))
}

/// Ids of every object pinned in `dir` (maps, programs or links).
fn pinned_ids(dir: &Path) -> Result<Vec<u32>, GuardError> {
    let mut ids = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ids),
        r => r.map_err(io_err(dir))?,
    };
    for e in entries {
        ids.push(pinned_id(&e.map_err(io_err(dir))?.path())?);
    }
    ids.sort_unstable();
    Ok(ids)
}

impl Protected {
    /// The limiter under `pins` and `ifaces` in the calling thread's network namespace, and
    /// the TPM chip behind `tpm` (the daemon's TCTI device node, where it quotes with one).
    pub fn of_limiter(
        pins: &PinPaths,
        ifaces: &[String],
        tpm: Option<&Path>,
    ) -> Result<Protected, GuardError> {
        let netns = Path::new("/proc/thread-self/ns/net");
        let netns = std::fs::metadata(netns).map_err(io_err(netns))?.ino() as u32;
        let ifaces = ifaces
            .iter()
            .filter_map(|i| crate::netns::ifindex(i))
            .map(|ifindex| GuardedIface { netns, ifindex })
            .collect();
        let mut dirs = Vec::new();
        for d in pins.all_dirs() {
            dirs.push(std::fs::metadata(&d).map_err(io_err(&d))?.ino());
        }
        Ok(Protected {
            maps: pinned_ids(&pins.maps_dir())?,
            progs: pinned_ids(&pins.progs_dir())?,
            links: pinned_ids(&pins.links_dir())?,
            pin_dev: file_id(pins.root())?.dev,
            dirs,
            ifaces,
            daemon_exe: file_id(Path::new("/proc/self/exe"))?,
            tpm_devs: tpm.map(tpm_devices).unwrap_or_default(),
        })
    }
}

/// The TPM chip behind the device node `node` (the daemon's TCTI, `/dev/tpmrm0`): both of its
/// character devices (`tpmN` and `tpmrmN`), from sysfs, in the kernel's encoding. By device,
/// not by path, so a node made anywhere with `mknod` for it is refused too; the chip only, so
/// another TPM on the host (a vTPM proxy's) stays usable.
pub fn tpm_devices(node: &Path) -> Vec<u32> {
    let Ok(m) = std::fs::metadata(node) else {
        return Vec::new();
    };
    let want = kernel_dev(m.rdev());
    let dev_of = |class: &str, name: &str| -> Option<u32> {
        let text = std::fs::read_to_string(Path::new(class).join(name).join("dev")).ok()?;
        let (ma, mi) = text.trim().split_once(':')?;
        Some(kernel_dev(libc::makedev(
            ma.parse().ok()?,
            mi.parse().ok()?,
        )))
    };
    // Which chip number the node is, then both of that chip's devices.
    let chip = ["tpm", "tpmrm"].iter().find_map(|prefix| {
        let class = format!("/sys/class/{prefix}");
        std::fs::read_dir(&class).ok()?.flatten().find_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let n = name.strip_prefix(prefix)?.parse::<u32>().ok()?;
            (dev_of(&class, &name) == Some(want)).then_some(n)
        })
    });
    let Some(n) = chip else {
        return Vec::new();
    };
    let mut out: Vec<u32> = [("/sys/class/tpm", "tpm"), ("/sys/class/tpmrm", "tpmrm")]
        .iter()
        .filter_map(|(class, prefix)| dev_of(class, &format!("{prefix}{n}")))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// A descriptor of a kept TPM device that another process holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpmHolder {
    pub pid: u32,
    pub fd: u32,
    /// Its `comm`, for the operator (the process may rename itself).
    pub comm: String,
}

/// The device numbers (kernel encoding) of the character device `fd_link` (a
/// `/proc/PID/fd/N` link) is open on; `None` for anything else.
///
/// The link is read first, and only a file with a path is looked at: sockets, pipes and
/// anonymous inodes never are. That one is then `statx`ed with `AT_STATX_DONT_SYNC`: the
/// magic link leads to the open file itself without a lookup, and the attributes come from
/// the kernel's cache, so a FUSE or NFS server that does not answer cannot stall the daemon.
fn char_device_of(fd_link: &Path) -> Option<u32> {
    use std::os::unix::ffi::OsStrExt as _;
    let target = std::fs::read_link(fd_link).ok()?;
    if !target.as_os_str().as_bytes().starts_with(b"/") {
        return None;
    }
    let path = std::ffi::CString::new(fd_link.as_os_str().as_bytes()).ok()?;
    // SAFETY: statx writes a struct statx into `st`, which is zeroed and as large as the
    // type the kernel fills; `path` is a NUL-terminated C string that outlives the call.
    let st = unsafe {
        let mut st: libc::statx = std::mem::zeroed();
        let rc = libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE,
            &mut st,
        );
        (rc == 0).then_some(st)?
    };
    (u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFCHR)
        .then(|| kernel_dev(libc::makedev(st.stx_rdev_major, st.stx_rdev_minor)))
}

/// Every descriptor of the character devices `devs` (kernel encoding, as [`tpm_devices`]
/// gives them) that a process other than this one holds, found through `/proc/PID/fd`.
///
/// The guard refuses every new open of those devices to other processes, and `pidfd_getfd`
/// or ptrace of the daemon; what it cannot refuse is a descriptor opened before it sealed.
/// Such a holder (a process started before the daemon, a TPM resource manager such as
/// tpm2-abrmd that opened `/dev/tpm0`, or a child of either) can still send the TPM
/// commands, so it is counted in every statement until it closes them. Best effort, and for
/// the honest host: a file registered with io_uring and closed, or in flight in a unix
/// socket, has no `/proc/PID/fd` entry, and a holder that is also root can forge the count
/// with the rest of a statement. A process whose descriptors cannot be read (gone
/// meanwhile) is skipped.
pub fn tpm_holders(devs: &[u32]) -> Vec<TpmHolder> {
    if devs.is_empty() {
        return Vec::new();
    }
    let me = std::process::id();
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Some(n) = fd.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            // The open file's own device numbers, whatever node (or deleted node) it was
            // opened through.
            if char_device_of(&fd.path()).is_some_and(|d| devs.contains(&d)) {
                let comm = std::fs::read_to_string(p.path().join("comm"))
                    .map(|c| c.trim_end().to_string())
                    .unwrap_or_default();
                out.push(TpmHolder { pid, fd: n, comm });
            }
        }
    }
    out
}

/// A guard in force.
#[derive(Debug, Clone)]
pub struct Sealed {
    /// Where its programs run.
    pub attach: GuardAttach,
    /// What it protects of the limiter (the guard's own objects come on top).
    pub protected: Protected,
    pub hooks: Vec<String>,
    /// How many arguments the kernel's `bpf` LSM hook has (3 on 6.1, 4 from 6.9 on).
    pub bpf_hook_args: usize,
    /// Objects named in the frozen config: maps, programs and links, ours and the guard's.
    pub objects: usize,
}

/// The daemon's guard as last sealed (or why there is none), and the TPM devices it keeps,
/// for `status` and statements.
static LAST: Mutex<Option<(LsmGuard, Vec<u32>)>> = Mutex::new(None);

/// Records what the daemon's guard is now; [`report`] hands it to status and statements.
pub fn record(state: LsmGuard) {
    record_keeping(state, Vec::new());
}

/// [`record`], for a guard that keeps the TPM devices `tpm_devs` for the daemon.
pub fn record_keeping(state: LsmGuard, tpm_devs: Vec<u32>) {
    if let Ok(mut l) = LAST.lock() {
        *l = Some((state, tpm_devs));
    }
}

/// The guard as recorded by this process, with the refusal count read now.
pub fn report(pins: &PinPaths) -> LsmGuard {
    let state = LAST.lock().ok().and_then(|l| l.clone());
    match state {
        Some((
            LsmGuard::Sealed {
                attach,
                hooks,
                bpf_hook_args,
                objects,
                tpm_devices,
                ..
            },
            tpm_devs,
        )) => LsmGuard::Sealed {
            attach,
            hooks,
            bpf_hook_args,
            objects,
            refusals: refusals(pins).map(|r| total(&r)).unwrap_or(0),
            tpm_devices,
            tpm_held_elsewhere: tpm_holders(&tpm_devs).len() as u32,
        },
        Some((other, _)) => other,
        None => LsmGuard::Unavailable {
            reason: "not loaded by this process".into(),
        },
    }
}

fn total(r: &GuardRefusals) -> u64 {
    [
        r.link_fd, r.map_fd, r.prog_fd, r.attach, r.pin_dir, r.netlink, r.ptrace, r.identity, r.tpm,
    ]
    .iter()
    .fold(0u64, |a, b| a.saturating_add(*b))
}

/// The guard's refusals summed over CPUs (`None`: no guard pinned, or not readable).
pub fn refusals(pins: &PinPaths) -> Option<GuardRefusals> {
    let pin = pins.guard_generation(false).join(guard_map_names::REFUSALS);
    bpf_syscall::sum_per_cpu(&pin, |sum: &mut GuardRefusals, c| {
        sum.link_fd += c.link_fd;
        sum.map_fd += c.map_fd;
        sum.prog_fd += c.prog_fd;
        sum.attach += c.attach;
        sum.pin_dir += c.pin_dir;
        sum.netlink += c.netlink;
        sum.ptrace += c.ptrace;
        sum.identity += c.identity;
        sum.tpm += c.tpm;
        if c.last_ns > sum.last_ns {
            sum.last_ns = c.last_ns;
            sum.last_tgid = c.last_tgid;
            sum.last_path = c.last_path;
        }
    })
}

fn too_many<T>(what: &'static str, v: &[T], max: usize) -> Result<(), GuardError> {
    if v.len() > max {
        return Err(GuardError::TooMany {
            what,
            n: v.len(),
            max,
        });
    }
    Ok(())
}

fn copy_ids(dst: &mut [u32; GUARD_MAX_IDS], src: &[u32]) -> u32 {
    dst[..src.len()].copy_from_slice(src);
    src.len() as u32
}

/// Loads guard program `name` for `hook`. A refusal of the first one with EPERM is the
/// kernel refusing BPF LSM programs altogether (a lockdown of them, or a sandbox).
fn load_one(
    prog: &mut Lsm,
    name: &'static str,
    hook: &'static str,
    btf: &aya::Btf,
    first: bool,
) -> Result<(), GuardError> {
    prog.load(hook, btf).map_err(|e| {
        let eperm = matches!(&e, ProgramError::LoadError { io_error, .. }
            if io_error.raw_os_error() == Some(libc::EPERM));
        if first && eperm {
            GuardError::Refused {
                detail: e.to_string(),
            }
        } else {
            program_error(name, hook)(format!("{e:?}"))
        }
    })
}

/// The guard's programs, loaded (not attached) one way or the other.
enum GuardPrograms {
    /// LSM programs, inside the aya object.
    Lsm,
    /// `fmod_ret` programs on `security_<hook>`, loaded by [`fmod_ret`].
    FmodRet(Vec<fmod_ret::FmodRetProgram>),
}

impl GuardPrograms {
    fn attach(&self) -> GuardAttach {
        match self {
            GuardPrograms::Lsm => GuardAttach::Lsm,
            GuardPrograms::FmodRet(_) => GuardAttach::FmodRet,
        }
    }
}

/// What loading the guard needs from this kernel: the offsets it reads, the arity of the
/// `bpf` hook, the guard object (its maps created) and its loaded programs (not attached).
/// Every hook signature is checked first.
struct Loaded {
    off: KernelOffsets,
    bpf_hook_args: usize,
    ebpf: aya::Ebpf,
    programs: GuardPrograms,
}

/// BPF LSM where `bpf` is an active LSM; otherwise, or where the kernel refuses LSM
/// programs, the same programs as `fmod_ret` on `security_*`. BPF LSM is not even tried
/// where it is not active: a kernel built with it but booted without it may take LSM
/// programs and attach them to hooks that are never called, which would seal nothing.
fn load_guard() -> Result<Loaded, GuardError> {
    let kbtf = KernelBtf::load(Path::new(btf::VMLINUX))?;
    let off = kernel_offsets(&kbtf)?;
    let mut ebpf = EbpfLoader::new().load(GUARD_OBJECT)?;
    let lsm = if crate::lsm::bpf_lsm_active() {
        load_lsm(&kbtf, &mut ebpf)
    } else {
        Err(GuardError::Refused {
            detail: "`bpf` is not among the active LSMs in /sys/kernel/security/lsm".into(),
        })
    };
    let lsm_err = match lsm {
        Ok(bpf_hook_args) => {
            return Ok(Loaded {
                off,
                bpf_hook_args,
                ebpf,
                programs: GuardPrograms::Lsm,
            });
        }
        Err(e @ (GuardError::Refused { .. } | GuardError::Btf(BtfError::NoHook { .. }))) => e,
        Err(e) => return Err(e),
    };
    let fmod = check_hooks(&kbtf, HookFunction::Security)
        .map_err(GuardError::from)
        .and_then(|(ids, n)| fmod_ret::load(GUARD_OBJECT, &ebpf, &ids).map(|p| (n, p)));
    match fmod {
        Ok((bpf_hook_args, programs)) => Ok(Loaded {
            off,
            bpf_hook_args,
            ebpf,
            programs: GuardPrograms::FmodRet(programs),
        }),
        Err(e) => Err(GuardError::Unsupported {
            lsm: match lsm_err {
                GuardError::Refused { detail } => detail,
                other => other.to_string(),
            },
            fmod_ret: e.to_string(),
        }),
    }
}

/// Checks every guard hook's function at `at` against the arguments the guard reads; returns
/// each function's BTF id (in `HOOK_SIGNATURES` order) and the arity of the `bpf` hook.
fn check_hooks(kbtf: &KernelBtf, at: HookFunction) -> Result<(Vec<u32>, usize), BtfError> {
    let mut ids = Vec::with_capacity(HOOK_SIGNATURES.len());
    let mut bpf_hook_args = 0;
    for (_, hook, want) in HOOK_SIGNATURES {
        let (id, n) = kbtf.check_hook_at(at, hook, want)?;
        if hook == "bpf" {
            bpf_hook_args = n;
        }
        ids.push(id);
    }
    Ok((ids, bpf_hook_args))
}

/// Loads every guard program as BPF LSM; returns the arity of the `bpf` hook.
fn load_lsm(kbtf: &KernelBtf, ebpf: &mut aya::Ebpf) -> Result<usize, GuardError> {
    let (_, bpf_hook_args) = check_hooks(kbtf, HookFunction::BpfLsm)?;
    let aya_btf = aya::Btf::from_sys_fs().map_err(|e| GuardError::Map {
        name: "vmlinux BTF",
        detail: e.to_string(),
    })?;
    for (i, (name, hook, _)) in HOOK_SIGNATURES.into_iter().enumerate() {
        let prog = lsm_program(ebpf, name, hook)?;
        load_one(prog, name, hook, &aya_btf, i == 0)?;
    }
    Ok(bpf_hook_args)
}

fn lsm_program<'a>(
    ebpf: &'a mut aya::Ebpf,
    name: &'static str,
    hook: &'static str,
) -> Result<&'a mut Lsm, GuardError> {
    let perr = program_error(name, hook);
    ebpf.program_mut(name)
        .ok_or_else(|| perr("not in the guard object".into()))?
        .try_into()
        .map_err(|e: ProgramError| perr(e.to_string()))
}

/// Whether this kernel takes the guard, and where: its BTF has every member and hook
/// signature the guard reads, and it loads every guard program (nothing is attached or
/// pinned).
pub fn probe() -> Result<GuardAttach, GuardError> {
    load_guard().map(|l| l.programs.attach())
}

/// Attaches every guard program and pins its link under `next`; returns the programs' ids
/// and adds the links' ids to `links`.
fn attach_and_pin_programs(
    ebpf: &mut aya::Ebpf,
    programs: &GuardPrograms,
    next: &Path,
    links: &mut Vec<u32>,
) -> Result<Vec<u32>, GuardError> {
    let mut prog_ids = Vec::new();
    for (name, hook, _) in HOOK_SIGNATURES {
        let perr = program_error(name, hook);
        let path = next.join(hook);
        match programs {
            GuardPrograms::Lsm => {
                let prog = lsm_program(ebpf, name, hook)?;
                prog_ids.push(prog.info().map_err(|e| perr(e.to_string()))?.id());
                let link_id = prog.attach().map_err(|e| perr(e.to_string()))?;
                let link: FdLink = prog
                    .take_link(link_id)
                    .map_err(|e| perr(e.to_string()))?
                    .into();
                link.pin(&path)
                    .map_err(|e| perr(format!("pin {}: {e}", path.display())))?;
            }
            GuardPrograms::FmodRet(progs) => {
                let prog = progs
                    .iter()
                    .find(|p| p.name == name)
                    .ok_or_else(|| perr("not loaded".into()))?;
                prog_ids.push(bpf_syscall::obj_id(&prog.fd).map_err(|e| perr(e.to_string()))?);
                let link = bpf_syscall::tracing_attach(&prog.fd)
                    .map_err(|e| perr(format!("fmod_ret attach to `security_{hook}`: {e}")))?;
                bpf_syscall::obj_pin(&link, &path)
                    .map_err(|e| perr(format!("pin {}: {e}", path.display())))?;
            }
        }
        links.push(pinned_id(&path)?);
    }
    Ok(prog_ids)
}

/// Pins the guard's own maps under `next`; returns their ids.
fn pin_guard_maps(ebpf: &aya::Ebpf, next: &Path) -> Result<Vec<u32>, GuardError> {
    let mut maps_of_guard = Vec::new();
    for name in [guard_map_names::CONFIG, guard_map_names::REFUSALS] {
        let map = ebpf.map(name).ok_or(GuardError::Map {
            name,
            detail: "not in the guard object".into(),
        })?;
        let path = next.join(name);
        map.pin(&path).map_err(|e| GuardError::Map {
            name,
            detail: format!("pin {}: {e}", path.display()),
        })?;
        maps_of_guard.push(pinned_id(&path)?);
    }
    Ok(maps_of_guard)
}

/// Writes the generation's config, carries the refusal count over from the previous
/// generation, and freezes both maps.
fn configure_and_freeze(
    ebpf: &mut aya::Ebpf,
    cfg: GuardConfig,
    pins: &PinPaths,
) -> Result<(), GuardError> {
    let map_err = |name: &'static str| move |e: String| GuardError::Map { name, detail: e };
    {
        let map = ebpf
            .map_mut(guard_map_names::CONFIG)
            .ok_or_else(|| map_err(guard_map_names::CONFIG)("missing".into()))?;
        let mut arr: Array<&mut MapData, GuardConfig> =
            Array::try_from(map).map_err(|e| map_err(guard_map_names::CONFIG)(e.to_string()))?;
        arr.set(0, cfg, 0)
            .map_err(|e| map_err(guard_map_names::CONFIG)(e.to_string()))?;
    }
    // The refusal count is the guard's, not a generation's: the new one starts where the
    // old one is (what the old one refuses in the milliseconds until it is removed is lost).
    if let Some(old) = refusals(pins) {
        let map = ebpf
            .map_mut(guard_map_names::REFUSALS)
            .ok_or_else(|| map_err(guard_map_names::REFUSALS)("missing".into()))?;
        let mut arr: aya::maps::PerCpuArray<&mut MapData, GuardRefusals> =
            aya::maps::PerCpuArray::try_from(map)
                .map_err(|e| map_err(guard_map_names::REFUSALS)(e.to_string()))?;
        let cpus = aya::util::nr_cpus()
            .map_err(|(what, e)| map_err(guard_map_names::REFUSALS)(format!("{what}: {e}")))?;
        let mut values = vec![GuardRefusals::default(); cpus];
        values[0] = old;
        let values = aya::maps::PerCpuValues::try_from(values)
            .map_err(|e| map_err(guard_map_names::REFUSALS)(e.to_string()))?;
        arr.set(0, values, 0)
            .map_err(|e| map_err(guard_map_names::REFUSALS)(e.to_string()))?;
    }
    for name in [guard_map_names::CONFIG, guard_map_names::REFUSALS] {
        let Some(aya::maps::Map::Array(data) | aya::maps::Map::PerCpuArray(data)) = ebpf.map(name)
        else {
            return Err(map_err(name)("missing".into()));
        };
        bpf_syscall::map_freeze(data.fd().as_fd())
            .map_err(|e| map_err(name)(format!("freeze: {e}")))?;
    }
    Ok(())
}

/// Loads, attaches, configures and freezes a new guard generation for `protected`, then
/// removes the previous one. On error the previous generation (if any) stays in force.
pub fn seal(pins: &PinPaths, protected: &Protected) -> Result<Sealed, GuardError> {
    too_many("interfaces", &protected.ifaces, GUARD_MAX_IFACES)?;
    let Loaded {
        off,
        bpf_hook_args,
        mut ebpf,
        programs,
    } = load_guard()?;

    let next = pins.guard_generation(true);
    let _ = std::fs::remove_dir_all(&next);
    std::fs::create_dir_all(&next).map_err(io_err(&next))?;
    let mut links = protected.links.clone();
    let prog_ids = attach_and_pin_programs(&mut ebpf, &programs, &next, &mut links)?;
    let maps_of_guard = pin_guard_maps(&ebpf, &next)?;

    // Everything the config names: the limiter's objects and the guard's own.
    let mut maps = protected.maps.clone();
    maps.extend(maps_of_guard);
    let mut progs = protected.progs.clone();
    progs.extend(prog_ids);
    let mut dirs = protected.dirs.clone();
    dirs.push(std::fs::metadata(&next).map_err(io_err(&next))?.ino());
    too_many("maps", &maps, GUARD_MAX_IDS)?;
    too_many("programs", &progs, GUARD_MAX_IDS)?;
    too_many("links", &links, GUARD_MAX_IDS)?;
    too_many("pin directories", &dirs, GUARD_MAX_DIRS)?;
    too_many("TPM devices", &protected.tpm_devs, GUARD_MAX_TPM_DEVS)?;
    let mut cfg = GuardConfig {
        magic: GUARD_MAGIC,
        off,
        daemon_exe: protected.daemon_exe,
        pin_dev: protected.pin_dev,
        n_dirs: dirs.len() as u32,
        n_ifaces: protected.ifaces.len() as u32,
        ..GuardConfig::default()
    };
    cfg.dirs[..dirs.len()].copy_from_slice(&dirs);
    cfg.ifaces[..protected.ifaces.len()].copy_from_slice(&protected.ifaces);
    cfg.n_maps = copy_ids(&mut cfg.maps, &maps);
    cfg.n_progs = copy_ids(&mut cfg.progs, &progs);
    cfg.n_links = copy_ids(&mut cfg.links, &links);
    cfg.tpm_devs[..protected.tpm_devs.len()].copy_from_slice(&protected.tpm_devs);
    cfg.n_tpm_devs = protected.tpm_devs.len() as u32;
    configure_and_freeze(&mut ebpf, cfg, pins)?;
    // The new generation is in force: the old one goes (unpinning its links detaches it).
    let current = pins.guard_generation(false);
    match std::fs::remove_dir_all(&current) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io_err(&current)(e));
        }
        _ => {}
    }
    std::fs::rename(&next, &current).map_err(io_err(&current))?;
    Ok(Sealed {
        attach: programs.attach(),
        protected: protected.clone(),
        hooks: HOOK_SIGNATURES
            .iter()
            .map(|(_, h, _)| h.to_string())
            .collect(),
        bpf_hook_args,
        objects: maps.len() + progs.len() + links.len(),
    })
}
