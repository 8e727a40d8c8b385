//! `rackwardend`'s main loop, as an explicit state machine.
//!
//! ```text
//! Starting ──(limiter loaded/adopted, every hook attached, caps written)──> Enforcing
//! Enforcing ──(a hook cannot be restored)──> Degraded ──(restored)──> Enforcing
//! Enforcing | Degraded ──(SIGTERM/SIGINT)──> Stopping
//! ```
//! Stopping leaves every pin in place: the limiter keeps enforcing without the daemon.
//!
//! With an `[epoch]` section, the epoch loop ([`crate::epoch`]) runs beside this one on its
//! own threads; this loop forwards `wipe-now` and reloads to it, shows its status, and pings
//! systemd's watchdog only while both loops show signs of life.
//!
//! - `start`: Starting, step by step; `hooks`: the hook check, step by step;
//! - `requests`: the control socket's requests;
//! - `counters`: counter samples and the rewind check;
//! - `reload`: SIGHUP; `liveness`: whether the epoch loops live (for the watchdog);
//! - `status`: what `status` and systemd's STATUS= show;
//! - signals: [`crate::enforce::signals`]; the guard's sealing: [`crate::guard::keeper`].

mod counters;
mod hooks;
mod liveness;
mod reload;
mod requests;
mod start;
mod status;

pub use requests::CapSetError;
pub use start::INTERFACE_WAIT;

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use rackwarden_common::{BucketConfig, Counters};

use crate::{
    config::Config,
    control::{self, Wake},
    enforce::gaps::GapLog,
    limiter::{Direction, HookDirection, Limiter, LimiterError, maps::CapSlot},
    units,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentState {
    Starting,
    Enforcing,
    /// At least one hook is not enforcing and could not be restored at the last check.
    Degraded,
    Stopping,
}

impl AgentState {
    pub fn name(self) -> &'static str {
        match self {
            AgentState::Starting => "starting",
            AgentState::Enforcing => "enforcing",
            AgentState::Degraded => "degraded",
            AgentState::Stopping => "stopping",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Preflight(#[from] crate::config::preflight::PreflightError),
    #[error(transparent)]
    OtherPolicer(#[from] Box<crate::limiter::exclusive::OtherPolicer>),
    #[error(transparent)]
    PinRootLock(#[from] crate::limiter::exclusive::PinRootLockError),
    #[error(transparent)]
    Netns(#[from] crate::netns::NetnsError),
    #[error(transparent)]
    Limiter(#[from] LimiterError),
    #[error(transparent)]
    Gaps(#[from] crate::enforce::gaps::GapLogError),
    #[error(transparent)]
    Control(#[from] crate::control::ControlError),
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    #[error(transparent)]
    Epoch(#[from] crate::epoch::EpochError),
    #[error(
        "{root} is sealed by the guard for another daemon executable (an older build, before its file was replaced?): this one may not open it ({detail}). The policer there keeps enforcing; reboot to run this build"
    )]
    SealedForAnother {
        root: std::path::PathBuf,
        detail: String,
    },
    #[error("self_protection = \"lsm\", but the guard cannot be sealed: {0}")]
    Guard(#[from] crate::guard::GuardError),
}

pub struct Agent {
    cfg: Config,
    limiter: Limiter,
    state: AgentState,
    gaps: GapLog,
    /// What we last wrote to the config map, per direction: anything else there is tampering.
    expected: BTreeMap<Direction, BucketConfig>,
    /// Last time each hook was verified enforcing (unix ms).
    last_ok: BTreeMap<(String, Direction), u64>,
    /// Foreign programs already reported ahead of ours, so one intruder is one gap, not one
    /// per check.
    reported_ahead: BTreeMap<(String, Direction), Vec<u32>>,
    samples: VecDeque<(Instant, [Counters; 2])>,
    /// The system-wide refusal program was attached at the last check.
    refusal_present: bool,
    /// The epoch loop, when `[epoch]` is configured.
    epoch: Option<crate::epoch::EpochHandle>,
    /// Why the last SIGHUP reload was refused (the old configuration stays).
    reload_error: Option<String>,
    guard: crate::guard::keeper::GuardKeeper,
    /// Held while we run: a second daemon on our pin root is refused.
    _pin_root_lock: Option<crate::limiter::exclusive::PinRootLock>,
    /// `[metrics] listen`, bound at start (before the limiter is loaded), served by `run`.
    metrics_listener: Option<std::net::TcpListener>,
}

/// The caps the config asks for, one slot per direction.
/// The tapped policer where `[taps]` is configured, the plain one otherwise.
fn policer_variant(cfg: &Config) -> crate::limiter::loader::PolicerVariant {
    match cfg.taps {
        crate::config::taps::Taps::Off => crate::limiter::loader::PolicerVariant::Plain,
        crate::config::taps::Taps::On(_) => crate::limiter::loader::PolicerVariant::Tapped,
    }
}

fn wanted_caps(cfg: &Config) -> [CapSlot; 2] {
    let mut slots = [CapSlot::Unset; 2];
    for d in Direction::ALL {
        slots[d.index() as usize] = CapSlot::Cap(cfg.cap_spec(d));
    }
    slots
}

impl Agent {
    pub fn state(&self) -> AgentState {
        self.state
    }

    fn host_cap(&self, dir: Direction) -> u64 {
        self.cfg.cap_spec(dir).rate_bytes_per_s
    }

    /// Puts the configured caps in force, keeping the bucket state and counters: a new
    /// policer generation (its own frozen config map) replaces the running one where the caps
    /// differ. Logs every change against what ran before (a restart with a new config file is
    /// a cap change too).
    fn write_caps_from_config(&mut self) -> Result<(), AgentError> {
        let before = self.limiter.maps.configs()?;
        self.limiter
            .change_caps(&wanted_caps(&self.cfg), &self.cfg.interfaces)?;
        let now = self.limiter.maps.configs()?;
        for d in Direction::ALL {
            let (was, is) = (before[d.index() as usize], now[d.index() as usize]);
            if was != is {
                log::info!(
                    "cap {}: {} -> {} (burst {} B, small-packet reserve {} B, generation {})",
                    d.name(),
                    if was.magic == 0 {
                        "unset".into()
                    } else {
                        units::fmt_rate(was.rate_bytes_per_s as f64)
                    },
                    units::fmt_rate(is.rate_bytes_per_s as f64),
                    is.burst_bytes,
                    is.small_reserve_bytes,
                    is.generation
                );
            }
            self.expected.insert(d, is);
        }
        Ok(())
    }

    /// Loads the tamper watch where the guard is not sealed (`self_protection` not `off`).
    fn start_watch(
        &self,
        tx: mpsc::Sender<Wake>,
    ) -> Option<crate::limiter::tamper_watch::TamperWatch> {
        if self.guard.is_sealed() || self.cfg.self_protection == crate::config::GuardMode::Off {
            return None;
        }
        match crate::limiter::tamper_watch::start(move |ev| {
            let _ = tx.send(Wake::Tamper(ev));
        }) {
            Ok(w) => {
                use crate::limiter::tamper_watch::WatchStart;
                match w.start {
                    WatchStart::Attached(_) | WatchStart::Reused(_) => log::info!(
                        "tamper watch on bpf() ({:?}): detaches and attaches are checked as they return",
                        w.start
                    ),
                    WatchStart::Waiting => log::warn!(
                        "tamper watch: another daemon on this host reads it; this one checks at its poll until that one exits"
                    ),
                }
                Some(w)
            }
            Err(e) => {
                log::warn!("tamper watch not loaded ({e}); tampering is found at the next check");
                None
            }
        }
    }

    /// Enforcing/Degraded: serve the control socket, sample counters every second and check
    /// the hooks every `check_interval`, until `stop` is set.
    pub fn run(mut self, stop: &AtomicBool) -> Result<(), AgentError> {
        let (tx, rx) = mpsc::channel::<Wake>();
        control::serve(&self.cfg.control_socket, tx.clone())?;
        if let Some(listener) = self.metrics_listener.take() {
            crate::metrics::serve(listener, tx.clone())?;
        }
        // Without the guard, the watch reports another process's attach/detach at once.
        let _watch = self.start_watch(tx);
        let mut next_sample = Instant::now();
        let mut next_check = Instant::now() + self.cfg.check_interval;
        let mut systemd = liveness::SystemdNotice::new();
        let mut next_ping = Instant::now();
        // READY only once every hook enforces: a start that ends Degraded keeps checking,
        // and systemd's TimeoutStartSec restarts a daemon that never gets there.
        let mut ready = false;
        while !stop.load(Ordering::SeqCst) {
            if !ready && self.state == AgentState::Enforcing {
                crate::notify::ready(&self.notify_status());
                ready = true;
            }
            let now = Instant::now();
            if super::signals::take_reload() {
                crate::notify::reloading();
                self.reload();
                if ready {
                    crate::notify::ready(&self.notify_status());
                }
            }
            if now >= next_ping {
                self.tell_systemd(&mut systemd);
                next_ping = now + systemd.ping_every();
            }
            if now >= next_sample {
                self.sample()?;
                next_sample = now + crate::limiter::protection::SAMPLE_INTERVAL;
            }
            if now >= next_check {
                self.check_hooks(false)?;
                next_check = now + self.cfg.check_interval;
            }
            let wait = next_sample
                .min(next_check)
                .saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait.min(Duration::from_millis(200))) {
                Ok(Wake::Request((req, reply))) => {
                    let _ = reply.send(self.handle(req));
                }
                Ok(Wake::Tamper(ev)) => {
                    // Several reports of one attack come in a burst: one check serves every
                    // report taken before it. A request among them is answered after the
                    // check, never dropped.
                    let mut reports = 1;
                    let mut requests = Vec::new();
                    loop {
                        match rx.try_recv() {
                            Ok(Wake::Tamper(_)) => reports += 1,
                            Ok(Wake::Request(r)) => requests.push(r),
                            Err(_) => break,
                        }
                    }
                    let gaps_before = self.gaps.gaps.len();
                    self.restore_hooks_first()?;
                    for (req, reply) in requests {
                        let _ = reply.send(self.handle(req));
                    }
                    next_check = Instant::now() + self.cfg.check_interval;
                    // Most bpf() calls on a host are other tools' own business (`bpftool`,
                    // `rackwarden status`): only a call that changed one of our hooks (the
                    // check recorded a gap, and logged it) is worth a warning.
                    if self.gaps.gaps.len() > gaps_before {
                        log::warn!(
                            "tamper watch: pid {} bpf() command {} (returned {}, {reports} report(s)) changed our hooks; restored",
                            ev.tgid,
                            ev.cmd,
                            ev.ret
                        );
                    } else {
                        log::debug!(
                            "tamper watch: pid {} bpf() command {} touched none of our hooks",
                            ev.tgid,
                            ev.cmd
                        );
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        self.state = AgentState::Stopping;
        crate::notify::stopping();
        let _ = std::fs::remove_file(&self.cfg.control_socket);
        log::info!("stopping; the limiter stays pinned and enforcing");
        Ok(())
    }
}
