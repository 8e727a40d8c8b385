//! The tamper watch (`ebpf/src/watch.rs`): on hosts where the BPF LSM guard cannot load,
//! a raw tracepoint at syscall exit reports every `bpf()` attach, detach or link update
//! another process makes, as it returns, so the daemon checks its hooks at once (`restored_on_event`) instead
//! of at the next poll. It refuses nothing; it shrinks the window to the time the daemon needs
//! to re-attach. Not pinned: it lives as long as the daemon does (when the daemon is not
//! running, nothing restores anyway).

use std::{
    os::fd::AsRawFd as _,
    sync::atomic::{AtomicBool, Ordering},
};

use aya::{
    EbpfLoader,
    maps::RingBuf,
    programs::{ProgramError, RawTracePoint},
};
use rackwarden_common::guard::TamperEvent;

static WATCH_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/rackwarden-watch"));

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("loading the tamper watch: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("tamper watch program `{name}`: {source}")]
    Program {
        name: &'static str,
        source: ProgramError,
    },
    #[error("tamper watch ring buffer: {0}")]
    Map(String),
}

/// Whether this process runs the watch (for the protection levels it reports).
static ACTIVE: AtomicBool = AtomicBool::new(false);

pub fn active() -> bool {
    ACTIVE.load(Ordering::SeqCst)
}

/// The loaded watch; dropping it detaches the probes.
pub struct TamperWatch {
    _ebpf: aya::Ebpf,
}

/// Loads and attaches the watch; `on_event` runs on the watch's own thread for each report.
pub fn start(on_event: impl Fn(TamperEvent) + Send + 'static) -> Result<TamperWatch, WatchError> {
    let tgid = std::process::id();
    let mut ebpf = EbpfLoader::new()
        .override_global("DAEMON_TGID", &tgid, true)
        .load(WATCH_OBJECT)?;
    let name = "rw_watch_sys_exit";
    let perr = |source| WatchError::Program { name, source };
    let p: &mut RawTracePoint = ebpf
        .program_mut(name)
        .ok_or(WatchError::Map(format!("no program {name}")))?
        .try_into()
        .map_err(perr)?;
    p.load().map_err(perr)?;
    p.attach("sys_exit").map_err(perr)?;
    let map = ebpf
        .take_map("RW_WATCH_EVENTS")
        .ok_or_else(|| WatchError::Map("no RW_WATCH_EVENTS".into()))?;
    let mut ring = RingBuf::try_from(map).map_err(|e| WatchError::Map(e.to_string()))?;
    std::thread::Builder::new()
        .name("tamper-watch".into())
        .spawn(move || {
            loop {
                let mut pfd = libc::pollfd {
                    fd: ring.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: poll(2) on one fd we hold.
                let r = unsafe { libc::poll(&mut pfd, 1, 1000) };
                if r < 0
                    && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
                {
                    log::error!("tamper watch: poll: {}", std::io::Error::last_os_error());
                    return;
                }
                while let Some(item) = ring.next() {
                    if item.len() >= std::mem::size_of::<TamperEvent>() {
                        // SAFETY: the program writes exactly one TamperEvent per record;
                        // read unaligned from the ring's bytes.
                        let ev = unsafe {
                            std::ptr::read_unaligned(item.as_ptr() as *const TamperEvent)
                        };
                        on_event(ev);
                    }
                }
            }
        })
        .map_err(|e| WatchError::Map(format!("spawn: {e}")))?;
    ACTIVE.store(true, Ordering::SeqCst);
    Ok(TamperWatch { _ebpf: ebpf })
}
