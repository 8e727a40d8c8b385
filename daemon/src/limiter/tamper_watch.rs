//! The tamper watch (`ebpf/src/watch.rs`): on hosts where the guard cannot load,
//! a hook on `bpf()`'s return reports every attach, detach or link update another process
//! makes, as it returns, so the daemon checks its hooks at once (`restored_on_event`)
//! instead of at the next poll. It refuses nothing; it shrinks the window to the time the
//! daemon needs to re-attach.
//!
//! **Which hook** ([`WatchHook`]): fexit on `__x64_sys_bpf` where the kernel accepts it (only
//! `bpf()` pays for it), else a raw tracepoint at `sys_exit` (every syscall pays about 30 ns).
//!
//! **Attached once per boot, never detached by the daemon.** Switching the `sys_exit`
//! tracepoint on or off live-patches the syscall exit path that every CPU runs through (a
//! jump label, patched with a breakpoint while other CPUs execute it); an fexit patches the
//! entry of `__x64_sys_bpf` the same way. A 6.12 guest under
//! qemu TCG took an `int3` oops and panicked in that path while a daemon attached the watch
//! beside a busy CPU. So the first daemon of a boot attaches the watch and pins it
//! ([`WatchPins`]); every later start, restart or second daemon finds it attached and only
//! writes its own tgid into `RW_WATCH_DAEMON`. Nothing in the daemon unpins it: it goes
//! away at reboot, or when an operator removes `/sys/fs/bpf/rackwarden-watch`.
//!
//! **One reader.** A ring buffer has one consumer position, so exactly one daemon reads the
//! reports: the one holding `flock` on the pin directory. Another daemon on the same host
//! waits for that lock on a thread of its own and takes the watch over when the reader
//! exits; until then it finds tampering at its next poll, and says so (`active` is false).

use std::{
    os::fd::{AsRawFd as _, OwnedFd},
    sync::atomic::{AtomicBool, Ordering},
};

use aya::{
    EbpfLoader,
    maps::{Array, Map, MapData, RingBuf},
    programs::{
        FExit, ProgramError, RawTracePoint,
        links::{FdLink, LinkType, PinnedLink},
    },
};
use rackwarden_common::guard::TamperEvent;

use crate::pins::WatchPins;

static WATCH_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/rackwarden-watch"));

/// The kernel function whose return the fexit hook watches: the system call's entry point,
/// never inlined (the syscall table calls it), one `pt_regs` argument as the raw tracepoint's.
const BPF_SYSCALL_FN: &str = "__x64_sys_bpf";
const EVENTS: &str = "RW_WATCH_EVENTS";
const DAEMON: &str = "RW_WATCH_DAEMON";

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("loading the tamper watch: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("tamper watch program `{program}`: {source}")]
    Program {
        program: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("kernel BTF for the fexit hook: {0}")]
    Btf(#[source] aya::BtfError),
    #[error("the tamper watch program's run statistics: {0}")]
    RunStats(#[source] std::io::Error),
    #[error("tamper watch map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("the tamper watch object has no {0}")]
    Missing(&'static str),
    #[error("pinning the tamper watch at {path}: {source}")]
    Pin {
        path: String,
        #[source]
        source: aya::pin::PinError,
    },
    #[error("tamper watch directory {path}: {source}")]
    Dir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("starting the tamper watch thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// Whether this process reads the watch's reports now (for the protection levels it reports).
static ACTIVE: AtomicBool = AtomicBool::new(false);

pub fn active() -> bool {
    ACTIVE.load(Ordering::SeqCst)
}

/// The hook the watch runs on; the daemon takes the first the kernel accepts, in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchHook {
    /// fexit on `__x64_sys_bpf`: runs only when `bpf()` returns.
    BpfExit,
    /// Raw tracepoint at `sys_exit`: runs at every system call's exit.
    SysExit,
}

impl WatchHook {
    pub const PREFERENCE: [WatchHook; 2] = [WatchHook::BpfExit, WatchHook::SysExit];

    pub fn name(self) -> &'static str {
        match self {
            WatchHook::BpfExit => "fexit __x64_sys_bpf",
            WatchHook::SysExit => "raw_tp sys_exit",
        }
    }

    fn program(self) -> &'static str {
        match self {
            WatchHook::BpfExit => "rw_watch_bpf_exit",
            WatchHook::SysExit => "rw_watch_sys_exit",
        }
    }

    /// The hook of a pinned watch link, from the kernel's link type.
    fn of_link(link: &FdLink) -> Option<WatchHook> {
        match link.info().ok()?.link_type().ok()? {
            LinkType::Tracing => Some(WatchHook::BpfExit),
            LinkType::RawTracePoint => Some(WatchHook::SysExit),
            _ => None,
        }
    }
}

/// How this daemon took part in the host's watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchStart {
    /// This daemon attached the watch: the first of this boot.
    Attached(WatchHook),
    /// The watch was attached already (an earlier daemon of this boot); this one reads it.
    /// `None`: the kernel did not say which hook the pinned link is on.
    Reused(Option<WatchHook>),
    /// Another daemon reads the reports; this one takes over when that one exits.
    Waiting,
}

/// The daemon's part in the watch. Dropping it detaches nothing (see the module doc); the
/// reader thread runs for the life of the process.
pub struct TamperWatch {
    pub start: WatchStart,
}

/// Joins the host's watch; `on_event` runs on the watch's own thread for each report.
pub fn start(on_event: impl Fn(TamperEvent) + Send + 'static) -> Result<TamperWatch, WatchError> {
    let pins = WatchPins::host();
    crate::pins::ensure_bpffs().map_err(|source| dir_error(&pins, source))?;
    std::fs::create_dir_all(pins.dir()).map_err(|source| dir_error(&pins, source))?;
    let lock = std::fs::File::open(pins.dir()).map_err(|source| dir_error(&pins, source))?;
    let lock = OwnedFd::from(lock);
    if try_lock(&lock, false).map_err(|source| dir_error(&pins, source))? {
        let (ring, start) = take_over(&pins)?;
        spawn_reader(lock, Some(ring), pins, on_event)?;
        return Ok(TamperWatch { start });
    }
    spawn_reader(lock, None, pins, on_event)?;
    Ok(TamperWatch {
        start: WatchStart::Waiting,
    })
}

fn dir_error(pins: &WatchPins, source: std::io::Error) -> WatchError {
    WatchError::Dir {
        path: pins.dir().display().to_string(),
        source,
    }
}

/// `flock(LOCK_EX)` on the pin directory; `Ok(false)` when another process holds it and
/// `block` is false.
fn try_lock(fd: &OwnedFd, block: bool) -> std::io::Result<bool> {
    let op = if block {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    loop {
        // SAFETY: flock(2) on a descriptor this function borrows for the call.
        if unsafe { libc::flock(fd.as_raw_fd(), op) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) if !block => return Ok(false),
            _ => return Err(e),
        }
    }
}

/// With the lock held: opens the pinned watch, or attaches and pins it if this boot has
/// none; then names this process as the reader.
fn take_over(pins: &WatchPins) -> Result<(RingBuf<MapData>, WatchStart), WatchError> {
    let (ring, daemon, start) = match open_pinned(pins) {
        Some((ring, daemon, hook)) => (ring, daemon, WatchStart::Reused(hook)),
        None => {
            let (ring, daemon, hook) = attach_and_pin(pins)?;
            (ring, daemon, WatchStart::Attached(hook))
        }
    };
    let mut daemon: Array<MapData, u32> =
        Array::try_from(daemon).map_err(|source| WatchError::Map {
            name: DAEMON,
            source,
        })?;
    daemon
        .set(0, std::process::id(), 0)
        .map_err(|source| WatchError::Map {
            name: DAEMON,
            source,
        })?;
    Ok((ring, start))
}

/// The pinned link and both maps, if all three are there, and the link's hook.
fn open_pinned(pins: &WatchPins) -> Option<(RingBuf<MapData>, Map, Option<WatchHook>)> {
    let link: FdLink = PinnedLink::from_pin(pins.link()).ok()?.into();
    let hook = WatchHook::of_link(&link);
    let ring = MapData::from_pin(pins.map(EVENTS)).ok()?;
    let ring = RingBuf::try_from(Map::RingBuf(ring)).ok()?;
    let daemon = MapData::from_pin(pins.map(DAEMON)).ok()?;
    Some((ring, Map::Array(daemon), hook))
}

/// Loads the watch, pins its maps, attaches it on the first hook the kernel accepts and pins
/// the link: the one attach of this boot.
fn attach_and_pin(pins: &WatchPins) -> Result<(RingBuf<MapData>, Map, WatchHook), WatchError> {
    if pins.link().exists() {
        // A link without its maps (someone removed them): nobody can read it. Unpinning it
        // detaches it; this is the only detach the daemon ever does, and only after tampering.
        log::warn!(
            "tamper watch: {} has no readable maps; attaching a new watch",
            pins.link().display()
        );
    }
    for stale in [pins.link(), pins.map(EVENTS), pins.map(DAEMON)] {
        let _ = std::fs::remove_file(stale);
    }
    let mut ebpf = EbpfLoader::new().load(WATCH_OBJECT)?;
    for name in [EVENTS, DAEMON] {
        let map = ebpf.map(name).ok_or(WatchError::Missing(name))?;
        map.pin(pins.map(name)).map_err(|source| WatchError::Pin {
            path: pins.map(name).display().to_string(),
            source,
        })?;
    }
    let (link, hook) = attach_first(&mut ebpf)?;
    link.pin(pins.link()).map_err(|source| WatchError::Pin {
        path: pins.link().display().to_string(),
        source,
    })?;
    let ring = ebpf.take_map(EVENTS).ok_or(WatchError::Missing(EVENTS))?;
    let ring = RingBuf::try_from(ring).map_err(|source| WatchError::Map {
        name: EVENTS,
        source,
    })?;
    let daemon = ebpf.take_map(DAEMON).ok_or(WatchError::Missing(DAEMON))?;
    Ok((ring, daemon, hook))
}

/// Attaches the watch on fexit where the kernel accepts it, else on the raw tracepoint (the
/// order of [`WatchHook::PREFERENCE`]). A refused fexit (no BTF, no trampolines) is logged
/// with its reason, never hidden.
fn attach_first(ebpf: &mut aya::Ebpf) -> Result<(FdLink, WatchHook), WatchError> {
    let fexit = WatchHook::BpfExit;
    match load_hook(ebpf, fexit).and_then(|()| attach_hook(ebpf, fexit)) {
        Ok(link) => Ok((link, fexit)),
        Err(refused) => {
            let hook = WatchHook::SysExit;
            load_hook(ebpf, hook)?;
            let link = attach_hook(ebpf, hook)?;
            log::info!(
                "tamper watch: the kernel refused the {} hook ({refused}); on {}, every system call pays for it",
                fexit.name(),
                hook.name()
            );
            Ok((link, hook))
        }
    }
}

fn load_hook(ebpf: &mut aya::Ebpf, hook: WatchHook) -> Result<(), WatchError> {
    let err = |source| WatchError::Program {
        program: hook.program(),
        source,
    };
    match hook {
        WatchHook::BpfExit => {
            let btf = aya::Btf::from_sys_fs().map_err(WatchError::Btf)?;
            fexit(ebpf)?.load(BPF_SYSCALL_FN, &btf).map_err(err)
        }
        WatchHook::SysExit => raw_tracepoint(ebpf)?.load().map_err(err),
    }
}

/// Attaches a loaded hook and takes its link out of the object (to pin it, or to hold it).
fn attach_hook(ebpf: &mut aya::Ebpf, hook: WatchHook) -> Result<FdLink, WatchError> {
    let err = |source| WatchError::Program {
        program: hook.program(),
        source,
    };
    match hook {
        WatchHook::BpfExit => {
            let p = fexit(ebpf)?;
            let id = p.attach().map_err(err)?;
            Ok(p.take_link(id).map_err(err)?.into())
        }
        WatchHook::SysExit => {
            let p = raw_tracepoint(ebpf)?;
            let id = p.attach("sys_exit").map_err(err)?;
            Ok(p.take_link(id).map_err(err)?.into())
        }
    }
}

fn raw_tracepoint(ebpf: &mut aya::Ebpf) -> Result<&mut RawTracePoint, WatchError> {
    program(ebpf, WatchHook::SysExit)
}

fn fexit(ebpf: &mut aya::Ebpf) -> Result<&mut FExit, WatchError> {
    program(ebpf, WatchHook::BpfExit)
}

/// The program of `hook` in the watch object, as its aya type.
fn program<'a, P>(ebpf: &'a mut aya::Ebpf, hook: WatchHook) -> Result<&'a mut P, WatchError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let name = hook.program();
    ebpf.program_mut(name)
        .ok_or(WatchError::Missing(name))?
        .try_into()
        .map_err(|source| WatchError::Program {
            program: name,
            source,
        })
}

/// The reader thread. Without a ring it first waits for the lock, then takes the watch over.
/// It holds the lock (the descriptor) for the life of the process.
fn spawn_reader(
    lock: OwnedFd,
    ring: Option<RingBuf<MapData>>,
    pins: WatchPins,
    on_event: impl Fn(TamperEvent) + Send + 'static,
) -> Result<(), WatchError> {
    if ring.is_some() {
        ACTIVE.store(true, Ordering::SeqCst);
    }
    std::thread::Builder::new()
        .name("tamper-watch".into())
        .spawn(move || {
            let _lock = lock;
            let ring = match ring {
                Some(r) => r,
                None => match wait_and_take_over(&_lock, &pins) {
                    Ok(r) => r,
                    Err(e) => {
                        log::error!("tamper watch: {e}; tampering is found at the next check");
                        return;
                    }
                },
            };
            read_events(ring, on_event);
            ACTIVE.store(false, Ordering::SeqCst);
        })
        .map_err(WatchError::Thread)?;
    Ok(())
}

fn wait_and_take_over(lock: &OwnedFd, pins: &WatchPins) -> Result<RingBuf<MapData>, WatchError> {
    try_lock(lock, true).map_err(|source| dir_error(pins, source))?;
    let (ring, start) = take_over(pins)?;
    ACTIVE.store(true, Ordering::SeqCst);
    log::info!("tamper watch: the reader before this daemon exited; reading it now ({start:?})");
    Ok(ring)
}

fn read_events(mut ring: RingBuf<MapData>, on_event: impl Fn(TamperEvent)) {
    loop {
        let mut pfd = libc::pollfd {
            fd: ring.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one descriptor we hold, with a count of one.
        let r = unsafe { libc::poll(&mut pfd, 1, 1000) };
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            log::error!("tamper watch: poll: {}", std::io::Error::last_os_error());
            return;
        }
        while let Some(item) = ring.next() {
            if item.len() >= std::mem::size_of::<TamperEvent>() {
                // SAFETY: the program writes exactly one TamperEvent per record, and the
                // length was checked; read unaligned from the ring's bytes.
                let ev = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const TamperEvent) };
                on_event(ev);
            }
        }
    }
}

/// The kernel id of the pinned watch link (what a test compares across daemon starts to
/// show the watch was attached once).
pub fn pinned_link_id() -> Option<u32> {
    let link = PinnedLink::from_pin(WatchPins::host().link()).ok()?;
    let link: FdLink = link.into();
    link.info().ok().map(|i| i.id())
}

/// The watch attached and detached as the daemon did before it pinned it: kept to reproduce
/// the kernel fault that made the daemon stop doing so (`cargo xtask vm-test --group
/// watch-raw`) and for the benchmark of each hook's cost. The daemon never uses it.
pub struct UnpinnedWatch {
    ebpf: aya::Ebpf,
    hook: WatchHook,
}

impl UnpinnedWatch {
    /// Loads the watch for `hook`; an error where the kernel refuses that hook.
    pub fn load(hook: WatchHook) -> Result<UnpinnedWatch, WatchError> {
        let mut ebpf = EbpfLoader::new().load(WATCH_OBJECT)?;
        load_hook(&mut ebpf, hook)?;
        Ok(UnpinnedWatch { ebpf, hook })
    }

    /// Attaches the program and detaches it again.
    pub fn attach_and_detach(&mut self) -> Result<(), WatchError> {
        drop(self.attach()?);
        Ok(())
    }

    /// Attaches the program; dropping the returned link detaches it (the benchmark of the
    /// watch's cost holds it attached for its measured rounds).
    pub fn attach(&mut self) -> Result<FdLink, WatchError> {
        attach_hook(&mut self.ebpf, self.hook)
    }

    /// The kernel's count of the program's runs and their total ns, kept only while
    /// `kernel.bpf_stats_enabled` is 1: how often the hook ran on a load, not only what the
    /// load took.
    pub fn run_stats(&mut self) -> Result<(u64, u64), WatchError> {
        use std::os::fd::AsFd as _;
        let hook = self.hook;
        let err = |source| WatchError::Program {
            program: hook.program(),
            source,
        };
        let fd = match hook {
            WatchHook::BpfExit => fexit(&mut self.ebpf)?.fd().map_err(err)?.as_fd(),
            WatchHook::SysExit => raw_tracepoint(&mut self.ebpf)?.fd().map_err(err)?.as_fd(),
        }
        .try_clone_to_owned()
        .map_err(WatchError::RunStats)?;
        crate::bpf_syscall::prog_run_stats(&fd).map_err(WatchError::RunStats)
    }
}
