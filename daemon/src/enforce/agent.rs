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
    control::{self, CapSetOutcome, Request, Response, Wake},
    enforce::gaps::{EnforcementGap, GapKind, GapLog, now_ms},
    limiter::{Direction, HookDirection, Limiter, LimiterError, maps::CapSlot},
    pins::PinPaths,
    status::{DirectionStatus, StatusReport},
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
    Netns(#[from] crate::netns::NetnsError),
    #[error(transparent)]
    Limiter(#[from] LimiterError),
    #[error(transparent)]
    Gaps(#[from] crate::enforce::gaps::GapLogError),
    #[error(transparent)]
    Control(#[from] crate::control::ControlError),
    #[error(transparent)]
    Epoch(#[from] crate::epoch::EpochError),
    #[error(
        "{root} is sealed by the BPF LSM guard for another daemon executable (an older build, before its file was replaced?): this one may not open it ({detail}). The policer there keeps enforcing; reboot to run this build"
    )]
    SealedForAnother {
        root: std::path::PathBuf,
        detail: String,
    },
    #[error("self_protection = \"lsm\", but the guard cannot be sealed: {0}")]
    Guard(#[from] crate::guard::GuardError),
}

/// Why `cap set` changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum CapSetError {
    #[error(transparent)]
    Cap(#[from] crate::config::caps::CapError),
    #[error(transparent)]
    Write(#[from] AgentError),
}

/// The BPF LSM guard, as this daemon last left it.
#[derive(Debug)]
enum GuardState {
    /// Not tried yet (before the first hook check).
    Unsealed,
    /// In force over exactly `Sealed::protected`.
    Sealed(crate::guard::Sealed),
    /// Not in force (why: `guard::report`). `permanent`: this kernel will never take it (no
    /// BPF LSM, or a hook whose arguments are not what the guard reads): not tried again.
    Unavailable { permanent: bool },
}

/// Counter samples for the "recent rate" column: one per second, a few seconds kept.
const RATE_SAMPLES: usize = 6;

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
    guard: GuardState,
}

/// The first counter field that is lower in `is` than in `was`.
fn rewound(was: &Counters, is: &Counters) -> Option<&'static str> {
    [
        ("passed_bytes", was.passed_bytes, is.passed_bytes),
        ("passed_packets", was.passed_packets, is.passed_packets),
        ("dropped_bytes", was.dropped_bytes, is.dropped_bytes),
        ("dropped_packets", was.dropped_packets, is.dropped_packets),
        (
            "unconfigured_drops",
            was.unconfigured_drops,
            is.unconfigured_drops,
        ),
        (
            "contention_drops",
            was.contention_drops,
            is.contention_drops,
        ),
    ]
    .into_iter()
    .find(|(_, w, i)| i < w)
    .map(|(f, _, _)| f)
}

/// Whether our pin root exists but refuses lookups to this process (EPERM on a stat of a
/// directory inside it): only the guard does that.
fn sealed_against_us(pins: &PinPaths) -> bool {
    pins.root().exists()
        && std::fs::metadata(pins.maps_dir()).is_err_and(|e| e.raw_os_error() == Some(libc::EPERM))
}

/// The caps the config asks for, one slot per direction.
fn wanted_caps(cfg: &Config) -> [CapSlot; 2] {
    let mut slots = [CapSlot::Unset; 2];
    for d in Direction::ALL {
        slots[d.index() as usize] = CapSlot::Cap(cfg.cap_spec(d));
    }
    slots
}

impl Agent {
    /// Starting: enter the namespace, load or adopt the limiter, attach, write the caps.
    /// Must run before any other thread exists when `netns` is set (setns is per thread).
    pub fn start(cfg: Config, stop: &'static AtomicBool) -> Result<Agent, AgentError> {
        if let Some(ns) = &cfg.netns {
            crate::netns::enter(ns)?;
        }
        wait_for_interfaces(&cfg, stop)?;
        let pins = PinPaths::new(&cfg.pin_root);
        let mut limiter = match Limiter::load_or_adopt(&pins, &wanted_caps(&cfg)) {
            Ok(l) => l,
            // Our pin directories refuse this process: a guard sealed them for another
            // executable (the previous build's, before a package upgrade replaced the file).
            Err(e) if sealed_against_us(&pins) => {
                return Err(AgentError::SealedForAnother {
                    root: pins.root().to_path_buf(),
                    detail: e.to_string(),
                });
            }
            Err(e) => return Err(e.into()),
        };
        let gaps = GapLog::open(&cfg.state_dir)?;
        log::info!(
            "{} policer under {} (egress prog #{} tag {}, ingress prog #{} tag {})",
            if limiter.adopted {
                "adopted pinned"
            } else {
                "loaded and pinned new"
            },
            pins.root().display(),
            limiter.identity(Direction::Egress).id,
            limiter.identity(Direction::Egress).tag,
            limiter.identity(Direction::Ingress).id,
            limiter.identity(Direction::Ingress).tag,
        );
        let kind = limiter.choose_kind(cfg.attach_mode, &cfg.interfaces[0]);
        let mut agent = Agent {
            cfg,
            limiter,
            state: AgentState::Starting,
            gaps,
            expected: BTreeMap::new(),
            last_ok: BTreeMap::new(),
            reported_ahead: BTreeMap::new(),
            samples: VecDeque::new(),
            refusal_present: false,
            epoch: None,
            reload_error: None,
            guard: GuardState::Unsealed,
        };
        log::info!("attach mode: {kind:?}");
        // An upgrade: this build's program takes over every hook before anything else runs.
        if let Err(e) = agent.limiter.replace_attached(&agent.cfg.interfaces) {
            log::error!(
                "replacing the pinned policer failed: {e}; the hook checks restore what they can"
            );
        }
        match &agent.limiter.version {
            crate::limiter::loader::ProgramVersion::Upgraded { from } => log::warn!(
                "upgraded the policer on every hook: {:?} -> {:?}",
                from.iter().map(|p| p.tag.clone()).collect::<Vec<_>>(),
                agent
                    .limiter
                    .identities()
                    .iter()
                    .map(|p| p.tag.clone())
                    .collect::<Vec<_>>()
            ),
            crate::limiter::loader::ProgramVersion::UpgradeRefused { reason } => {
                log::error!(
                    "this build's policer was NOT loaded; the pinned one enforces: {reason}"
                )
            }
            _ => {}
        }
        let (refusal, _) = crate::limiter::sockopt::ensure(
            &pins,
            crate::limiter::loader::OBJECT,
            agent.cfg.refusal_cgroup.as_deref(),
        );
        if refusal.state == "present" {
            log::info!("bypass refusal present: {}", refusal.detail);
        } else {
            log::warn!("bypass refusal ABSENT: {}", refusal.detail);
        }
        agent.refusal_present = refusal.state == "present";
        agent.write_caps_from_config()?;
        agent.check_hooks(true)?;
        // The epoch loop starts only once every hook enforces: its first statement must
        // describe a limiter that is in place. Its threads inherit our network namespace.
        if let Some(ecfg) = agent.cfg.epoch.clone() {
            agent.epoch = Some(crate::epoch::start(&agent.cfg, &ecfg, stop)?);
            log::info!(
                "epoch loop started: wipe every {}, verifier {}",
                units::fmt_duration(ecfg.wipe_interval),
                ecfg.verifier.url
            );
        }
        Ok(agent)
    }

    /// SIGHUP: re-read the configuration file. A file that does not load leaves everything
    /// as it was and says why; keys that need a restart (interfaces, pins, namespace) are
    /// kept with a warning. Nothing is detached.
    pub fn reload(&mut self) {
        let new = match Config::load(&self.cfg.path) {
            Ok(c) => c,
            Err(e) => {
                log::error!("reload REFUSED, the running configuration stays: {e}");
                self.reload_error = Some(e.to_string());
                return;
            }
        };
        for (key, same) in [
            ("interfaces", new.interfaces == self.cfg.interfaces),
            ("pin_root", new.pin_root == self.cfg.pin_root),
            ("netns", new.netns == self.cfg.netns),
            ("state_dir", new.state_dir == self.cfg.state_dir),
            (
                "control_socket",
                new.control_socket == self.cfg.control_socket,
            ),
            ("attach_mode", new.attach_mode == self.cfg.attach_mode),
            (
                "refusal_cgroup",
                new.refusal_cgroup == self.cfg.refusal_cgroup,
            ),
        ] {
            if !same {
                log::warn!("reload: `{key}` changed; it takes effect at the next restart");
            }
        }
        let next = Config {
            interfaces: self.cfg.interfaces.clone(),
            interface_lines: self.cfg.interface_lines.clone(),
            pin_root: self.cfg.pin_root.clone(),
            netns: self.cfg.netns.clone(),
            state_dir: self.cfg.state_dir.clone(),
            control_socket: self.cfg.control_socket.clone(),
            attach_mode: self.cfg.attach_mode,
            refusal_cgroup: self.cfg.refusal_cgroup.clone(),
            ..new
        };
        if next.epoch.is_some() && self.epoch.is_none() {
            log::warn!(
                "reload: an [epoch] section was added; the epoch loop starts at the next restart"
            );
        }
        self.cfg = next;
        if let Err(e) = self.write_caps_from_config() {
            log::error!("reload: writing the caps failed: {e}");
            self.reload_error = Some(e.to_string());
            return;
        }
        if let Some(h) = &self.epoch {
            let _ = h.commands.send(crate::epoch::EpochCommand::Reload(Box::new(
                self.cfg.clone(),
            )));
        }
        self.reload_error = None;
        log::info!("reloaded {}", self.cfg.path.display());
    }

    /// Whether the epoch and delivery loops have shown signs of life within `limit`
    /// (a wipe counts as alive while its progress counter moves).
    fn loops_alive(&self, limit: Duration, last_progress: &mut (u64, Instant)) -> bool {
        let Some(h) = &self.epoch else { return true };
        let now = now_ms();
        let lim = limit.as_millis() as u64;
        let p = h.wipe_progress.load(Ordering::SeqCst);
        if p != last_progress.0 {
            *last_progress = (p, Instant::now());
        }
        let (challenge_ms, request_ms) = self.cfg.epoch.as_ref().map_or((0, 0), |e| {
            (
                e.challenge_timeout.as_millis() as u64,
                e.verifier.request_timeout.as_millis() as u64,
            )
        });
        let since_beat = now.saturating_sub(h.epoch_heartbeat_ms.load(Ordering::SeqCst));
        let busy_ok = match h.snapshot().map(|s| s.state) {
            Some(crate::epoch::EpochState::Wiping { .. }) => last_progress.1.elapsed() < limit,
            // Waiting for the verifier's nonce is bounded by challenge_timeout.
            Some(crate::epoch::EpochState::Challenging { .. }) => since_beat < challenge_ms + lim,
            // Draining waits for `systemctl stop` (bounded by stop_timeout) and staging
            // hashes the images: give them an hour before calling them stuck.
            Some(crate::epoch::EpochState::Draining { .. })
            | Some(crate::epoch::EpochState::Restarting { .. })
            | Some(crate::epoch::EpochState::Staging { .. }) => since_beat < 3_600_000,
            _ => false,
        };
        let epoch_ok = busy_ok || since_beat < lim;
        // Delivery blocks at most one request timeout per attempt.
        let delivery_ok =
            now.saturating_sub(h.delivery_heartbeat_ms.load(Ordering::SeqCst)) < lim + request_ms;
        epoch_ok && delivery_ok
    }

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

    /// Checks every hook and the config map; restores what it can and records each gap.
    /// `at_start`: a missing attachment is normal on first start (nothing attached yet) but a
    /// gap when the limiter was adopted (it was enforcing before and someone removed it).
    pub fn check_hooks(&mut self, at_start: bool) -> Result<(), AgentError> {
        let now = now_ms();
        // Gap records a full disk held back are written first, in order.
        self.gaps.flush();
        // The config map first: a foreign write is undone before anything else.
        for d in Direction::ALL {
            let want = self.expected[&d];
            let have = self.limiter.maps.config(d)?;
            if have != want {
                // The map is frozen and read-only to programs, so this takes a kernel that
                // ignores both: the restore is a new generation, not a write.
                self.limiter
                    .change_caps(&wanted_caps(&self.cfg), &self.cfg.interfaces)?;
                self.gaps.record(EnforcementGap {
                    kind: GapKind::ConfigChanged,
                    interface: None,
                    direction: Some(d),
                    last_verified_at_ms: None,
                    detected_at_ms: now,
                    detail: format!(
                        "config map held rate {} B/s burst {} gen {} magic {:#x}; restored rate {} B/s burst {} gen {}",
                        have.rate_bytes_per_s, have.burst_bytes, have.generation, have.magic,
                        want.rate_bytes_per_s, want.burst_bytes, want.generation
                    ),
                    restored: true,
                });
            }
        }
        // The refusal program: a detach (or an unpinned link) is a gap, and it is reattached.
        if self.refusal_present || !at_start {
            let (state, reattached) = crate::limiter::sockopt::ensure(
                self.limiter.pins(),
                crate::limiter::loader::OBJECT,
                self.cfg.refusal_cgroup.as_deref(),
            );
            if reattached && self.refusal_present {
                self.gaps.record(EnforcementGap {
                    kind: GapKind::Detached,
                    interface: Some(format!(
                        "cgroup:{}",
                        state.cgroup.clone().unwrap_or_default()
                    )),
                    direction: None,
                    last_verified_at_ms: None,
                    detected_at_ms: now,
                    detail: "the cgroup/setsockopt refusal program was not attached".into(),
                    restored: state.state == "present",
                });
            }
            self.refusal_present = state.state == "present";
        }
        let mut degraded = false;
        for iface in self.cfg.interfaces.clone() {
            for d in Direction::ALL {
                let key = (iface.clone(), d);
                let last_ok = self.last_ok.get(&key).copied();
                let hook = match self.limiter.inspect(&iface, d) {
                    Ok(h) => h,
                    Err(e) => {
                        degraded = true;
                        self.gaps.record(EnforcementGap {
                            kind: GapKind::CheckFailed,
                            interface: Some(iface.clone()),
                            direction: Some(d),
                            last_verified_at_ms: last_ok,
                            detected_at_ms: now,
                            detail: e.to_string(),
                            restored: false,
                        });
                        continue;
                    }
                };
                if !hook.attached {
                    let first_attach = at_start && !self.limiter.adopted;
                    let restored = match self.limiter.attach(&iface, d) {
                        Ok(()) => true,
                        Err(e) => {
                            log::error!(
                                "cannot attach {} to {iface} {}: {e}",
                                d.prog_name(),
                                d.name()
                            );
                            degraded = true;
                            false
                        }
                    };
                    if !first_attach {
                        let ours = d.prog_name();
                        let kind = if hook.programs.iter().any(|p| p.name == ours) {
                            GapKind::Replaced
                        } else {
                            GapKind::Detached
                        };
                        self.gaps.record(EnforcementGap {
                            kind,
                            interface: Some(iface.clone()),
                            direction: Some(d),
                            last_verified_at_ms: last_ok,
                            detected_at_ms: now,
                            detail: format!(
                                "program #{} not on the hook{}; programs present: {:?}",
                                self.limiter.identity(d).id,
                                if at_start { " at daemon start" } else { "" },
                                hook.programs
                            ),
                            restored,
                        });
                    } else if restored {
                        log::info!("attached {} to {iface} {}", d.prog_name(), d.name());
                    }
                    if restored {
                        self.last_ok.insert(key.clone(), now);
                    }
                    continue;
                }
                let mut ahead: Vec<u32> = hook.foreign_ahead.iter().map(|p| p.id).collect();
                if !ahead.is_empty() && self.reported_ahead.get(&key) != Some(&ahead) {
                    // Restore our place first, then record what was found and whether it worked.
                    let moved = match self.limiter.move_first(&iface, d) {
                        Ok(m) => m,
                        Err(e) => {
                            log::error!(
                                "cannot move {} first on {iface} {}: {e}",
                                d.prog_name(),
                                d.name()
                            );
                            degraded = true;
                            false
                        }
                    };
                    let restored = moved
                        && self
                            .limiter
                            .inspect(&iface, d)
                            .map(|h| h.enforcing())
                            .unwrap_or(false);
                    self.gaps.record(EnforcementGap {
                        kind: GapKind::ForeignAhead,
                        interface: Some(iface.clone()),
                        direction: Some(d),
                        last_verified_at_ms: last_ok,
                        detected_at_ms: now,
                        detail: format!(
                            "programs ahead of ours: {:?}{}",
                            hook.foreign_ahead,
                            if restored {
                                "; ours moved back to first"
                            } else {
                                ""
                            }
                        ),
                        restored,
                    });
                    if restored {
                        ahead.clear();
                    }
                }
                if ahead.is_empty() {
                    self.reported_ahead.remove(&key);
                    self.last_ok.insert(key, now);
                } else {
                    self.reported_ahead.insert(key, ahead);
                }
            }
        }
        self.keep_sealed()?;
        // Starting ends here too: the first check decides Enforcing or Degraded.
        if self.state != AgentState::Stopping {
            let next = if degraded {
                AgentState::Degraded
            } else {
                AgentState::Enforcing
            };
            if next != self.state {
                if next == AgentState::Degraded {
                    log::warn!("state: {} -> {}", self.state.name(), next.name());
                } else {
                    log::info!("state: {} -> {}", self.state.name(), next.name());
                }
                self.state = next;
            }
        }
        Ok(())
    }

    /// Loads the tamper watch where the guard is not sealed (`self_protection` not `off`).
    fn start_watch(
        &self,
        tx: mpsc::Sender<Wake>,
    ) -> Option<crate::limiter::tamper_watch::TamperWatch> {
        if matches!(self.guard, GuardState::Sealed(_))
            || self.cfg.self_protection == crate::config::GuardMode::Off
        {
            return None;
        }
        match crate::limiter::tamper_watch::start(move |ev| {
            let _ = tx.send(Wake::Tamper(ev));
        }) {
            Ok(w) => {
                use crate::limiter::tamper_watch::WatchStart;
                match w.start {
                    WatchStart::Attached | WatchStart::Reused => log::info!(
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

    /// Seals the limiter with the BPF LSM guard, or seals it again when its objects changed
    /// since (new caps or an upgrade load new programs and a new config map). A failed
    /// reseal leaves the previous generation in force over the objects it names.
    fn keep_sealed(&mut self) -> Result<(), AgentError> {
        use crate::{config::GuardMode, guard};
        use rackwarden_attest::evidence::LsmGuard;
        if let mode @ (GuardMode::Off | GuardMode::Watch) = self.cfg.self_protection {
            guard::record(LsmGuard::Unavailable {
                reason: format!(
                    "self_protection = \"{}\" in the config",
                    if mode == GuardMode::Off {
                        "off"
                    } else {
                        "watch"
                    }
                ),
            });
            return Ok(());
        }
        let pins = self.limiter.pins().clone();
        let want = match guard::Protected::of_limiter(&pins, &self.cfg.interfaces) {
            Ok(p) => p,
            Err(e) => {
                log::warn!("cannot list what the guard protects: {e}");
                return Ok(());
            }
        };
        match &self.guard {
            GuardState::Sealed(s) if s.protected == want => return Ok(()),
            GuardState::Unavailable {
                permanent: true, ..
            } => return Ok(()),
            _ => {}
        }
        match guard::seal(&pins, &want) {
            Ok(s) => {
                log::info!(
                    "sealed by the BPF LSM guard: {} objects, hooks {} (bpf hook: {} arguments)",
                    s.objects,
                    s.hooks.join(", "),
                    s.bpf_hook_args
                );
                guard::record(LsmGuard::Sealed {
                    hooks: s.hooks.clone(),
                    bpf_hook_args: s.bpf_hook_args,
                    objects: s.objects,
                    refusals: 0,
                });
                self.guard = GuardState::Sealed(s);
            }
            Err(e) if self.cfg.self_protection == GuardMode::Lsm => return Err(e.into()),
            Err(e) => {
                let permanent = matches!(
                    e,
                    guard::GuardError::Refused { .. } | guard::GuardError::Btf(_)
                );
                let resealing = matches!(self.guard, GuardState::Sealed(_));
                let reason = if resealing {
                    format!(
                        "sealing again failed ({e}); the previous guard still refuses for the objects it names"
                    )
                } else {
                    e.to_string()
                };
                log::warn!("BPF LSM guard not in force: {reason}");
                guard::record(LsmGuard::Unavailable { reason });
                self.guard = GuardState::Unavailable { permanent };
            }
        }
        Ok(())
    }

    /// The one-line STATUS= systemd shows: enforcement state and the epoch loop's state.
    fn notify_status(&self) -> String {
        let mut s = self.state.name().to_string();
        if let Some(e) = self.epoch.as_ref().and_then(|h| h.snapshot()) {
            s += &format!("; epoch: {}", e.state.name());
            if let Some(l) = &e.last_epoch {
                s += &format!(" (last seq {})", l.seq);
            }
            s += &format!("; undelivered: {}", e.delivery.backlog);
        }
        s
    }

    /// Samples the counters and checks that none went down since the last sample: only a
    /// program can write our frozen maps, and a rewind would hide bytes from the verifier.
    fn sample(&mut self) -> Result<(), AgentError> {
        let c = [
            self.limiter.maps.counters(Direction::Egress)?,
            self.limiter.maps.counters(Direction::Ingress)?,
        ];
        if let Some((_, last)) = self.samples.back() {
            for d in Direction::ALL {
                let (was, is) = (&last[d.index() as usize], &c[d.index() as usize]);
                if let Some(field) = rewound(was, is) {
                    self.gaps.record(EnforcementGap {
                        kind: GapKind::CountersRewound,
                        interface: None,
                        direction: Some(d),
                        last_verified_at_ms: None,
                        detected_at_ms: now_ms(),
                        detail: format!(
                            "{field} went down between two samples: {} -> {} passed bytes, {} -> {} dropped bytes",
                            was.passed_bytes, is.passed_bytes, was.dropped_bytes, is.dropped_bytes
                        ),
                        restored: false,
                    });
                }
            }
        }
        self.samples.push_back((Instant::now(), c));
        while self.samples.len() > RATE_SAMPLES {
            self.samples.pop_front();
        }
        Ok(())
    }

    pub fn status(&self) -> Result<StatusReport, AgentError> {
        let mut directions = Vec::new();
        let (first, last) = (self.samples.front(), self.samples.back());
        for d in Direction::ALL {
            let cfg = self.limiter.maps.config(d)?;
            let counters = self.limiter.maps.counters(d)?;
            let idx = d.index() as usize;
            let (mut pr, mut dr, mut win) = (None, None, 0.0);
            if let (Some((t0, c0)), Some((t1, c1))) = (first, last) {
                let dt = t1.duration_since(*t0).as_secs_f64();
                if dt > 0.0 {
                    // Saturating: a rewound counter is a gap (see `sample`), not a panic.
                    pr =
                        Some(c1[idx].passed_bytes.saturating_sub(c0[idx].passed_bytes) as f64 / dt);
                    dr = Some(
                        c1[idx].dropped_bytes.saturating_sub(c0[idx].dropped_bytes) as f64 / dt,
                    );
                    win = dt;
                }
            }
            directions.push(DirectionStatus {
                direction: d,
                rack_cap_bytes_per_s: self.cfg.caps.rack_bytes_per_s(d),
                host_cap_bytes_per_s: cfg.rate_bytes_per_s,
                burst_bytes: cfg.burst_bytes,
                config_generation: cfg.generation,
                counters: crate::status::counters_json(counters),
                recent_passed_bytes_per_s: pr,
                recent_dropped_bytes_per_s: dr,
                recent_window_s: win,
            });
        }
        let mut hooks = Vec::new();
        for i in &self.cfg.interfaces {
            for d in Direction::ALL {
                hooks.push(self.limiter.inspect(i, d)?);
            }
        }
        let n = self.gaps.gaps.len();
        Ok(StatusReport {
            rack_id: self.cfg.rack_id.clone(),
            host_id: self.cfg.host_id.clone(),
            host_share: self.cfg.host_share,
            agent_state: self.state.name().into(),
            attach_kind: self.limiter.kind,
            pin_root: self.limiter.pins().root().display().to_string(),
            programs: self.limiter.identities(),
            map_ids: self.limiter.maps.ids,
            directions,
            hooks,
            gaps_total: n,
            gaps_unpersisted: self.gaps.unpersisted(),
            recent_gaps: self.gaps.gaps[n.saturating_sub(20)..].to_vec(),
            bypass: crate::collect::bypass::bypass_report(&self.cfg, self.limiter.pins()),
            epoch: self.epoch.as_ref().and_then(|h| h.snapshot()),
            reload_error: self.reload_error.clone(),
            program_version: Some(self.limiter.version.clone()),
            self_protection: Some(crate::limiter::protection::assess(
                self.limiter.pins(),
                self.cfg.check_interval,
            )),
        })
    }

    fn cap_set(
        &mut self,
        egress: Option<String>,
        ingress: Option<String>,
        persist: bool,
    ) -> Result<CapSetOutcome, CapSetError> {
        self.cfg.caps = self.cfg.caps.with_rack_rates(
            egress.as_deref(),
            ingress.as_deref(),
            self.cfg.host_share,
        )?;
        self.write_caps_from_config()?;
        let (persisted, persist_detail) = if persist {
            match crate::config_edit::set_caps(
                &self.cfg.path,
                egress.as_deref(),
                ingress.as_deref(),
            ) {
                Ok(()) => (true, format!("written to {}", self.cfg.path.display())),
                Err(e) => (false, format!("NOT persisted: {e}")),
            }
        } else {
            (
                false,
                format!(
                    "not persisted: {} still holds the old cap; a daemon restart restores it (use --persist)",
                    self.cfg.path.display()
                ),
            )
        };
        log::info!("cap set via control socket; {persist_detail}");
        Ok(CapSetOutcome {
            egress_host_bytes_per_s: self.host_cap(Direction::Egress),
            ingress_host_bytes_per_s: self.host_cap(Direction::Ingress),
            generation: self.expected[&Direction::Egress]
                .generation
                .max(self.expected[&Direction::Ingress].generation),
            persisted,
            persist_detail,
        })
    }

    fn handle(&mut self, req: Request) -> Response {
        match req {
            Request::Status => match self.status() {
                Ok(s) => Response::Status(Box::new(s)),
                Err(e) => Response::Error {
                    message: e.to_string(),
                },
            },
            Request::CapSet {
                egress,
                ingress,
                persist,
            } => match self.cap_set(egress, ingress, persist) {
                Ok(o) => Response::CapSet(o),
                Err(e) => Response::Error {
                    message: e.to_string(),
                },
            },
            Request::WipeNow => match &self.epoch {
                None => Response::Error {
                    message: "this daemon runs no epoch loop: add an [epoch] section to the configuration".into(),
                },
                Some(h) => match h.commands.send(crate::epoch::EpochCommand::WipeNow) {
                    Ok(()) => Response::WipeNow {
                        state: h.snapshot().map(|s| s.state),
                    },
                    Err(_) => Response::Error {
                        message: "the epoch loop has stopped".into(),
                    },
                },
            },
        }
    }

    /// Enforcing/Degraded: serve the control socket, sample counters every second and check
    /// the hooks every `check_interval`, until `stop` is set.
    pub fn run(mut self, stop: &AtomicBool) -> Result<(), AgentError> {
        let (tx, rx) = mpsc::channel::<Wake>();
        control::serve(&self.cfg.control_socket, tx.clone())?;
        // Without the guard, the watch reports another process's attach/detach at once.
        let _watch = self.start_watch(tx);
        let mut next_sample = Instant::now();
        let mut next_check = Instant::now() + self.cfg.check_interval;
        let watchdog = crate::notify::watchdog_interval();
        let mut last_progress = (0u64, Instant::now());
        let mut next_ping = Instant::now();
        let mut last_status = String::new();
        // READY only once every hook enforces: a start that ends Degraded keeps checking,
        // and systemd's TimeoutStartSec restarts a daemon that never gets there.
        let mut ready = false;
        while !stop.load(Ordering::SeqCst) {
            if !ready && self.state == AgentState::Enforcing {
                crate::notify::ready(&self.notify_status());
                ready = true;
            }
            let now = Instant::now();
            if RELOAD.swap(false, Ordering::SeqCst) {
                crate::notify::reloading();
                self.reload();
                if ready {
                    crate::notify::ready(&self.notify_status());
                }
            }
            if now >= next_ping {
                let st = self.notify_status();
                if st != last_status {
                    crate::notify::status(&st);
                    last_status = st;
                }
                // The ping comes from this loop, and only while the epoch loops live too: a
                // stuck loop stops the pings and systemd restarts us.
                if let Some(w) = watchdog {
                    if self.loops_alive(w, &mut last_progress) {
                        crate::notify::watchdog_ping();
                    } else {
                        log::error!(
                            "an epoch or delivery loop shows no sign of life: not pinging the watchdog"
                        );
                    }
                }
                next_ping = now
                    + watchdog.map_or(Duration::from_secs(1), |w| {
                        (w / 3).min(Duration::from_secs(1))
                    });
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
                    log::warn!(
                        "tamper watch: pid {} bpf() command {} returned {}: checking the hooks now",
                        ev.tgid,
                        ev.cmd,
                        ev.ret
                    );
                    // Several reports of one attack come in a burst: one check serves them.
                    while let Ok(Wake::Tamper(_)) = rx.try_recv() {}
                    self.check_hooks(false)?;
                    next_check = Instant::now() + self.cfg.check_interval;
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

static STOP: AtomicBool = AtomicBool::new(false);
static RELOAD: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

extern "C" fn on_reload_signal(_: libc::c_int) {
    RELOAD.store(true, Ordering::SeqCst);
}

/// Sets `handler` for `sig`; a failure is logged (it can only be an invalid signal).
fn set_handler(sig: nix::sys::signal::Signal, handler: extern "C" fn(libc::c_int)) {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet};
    let action = SigAction::new(
        SigHandler::Handler(handler),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handlers only store to an atomic, which is async-signal-safe.
    if let Err(e) = unsafe { nix::sys::signal::sigaction(sig, &action) } {
        log::error!("cannot install the {sig} handler: {e}");
    }
}

/// Installs the SIGHUP handler that asks [`Agent::run`] to reload the configuration.
pub fn reload_on_sighup() {
    set_handler(nix::sys::signal::Signal::SIGHUP, on_reload_signal);
}

/// Waits (bounded) for the configured interfaces: at boot the NIC may appear after us, and
/// failing at once would spin systemd's restart limit. Says what it waits for.
fn wait_for_interfaces(cfg: &Config, stop: &AtomicBool) -> Result<(), AgentError> {
    let t0 = Instant::now();
    let mut said = false;
    loop {
        match cfg.check_interfaces_exist() {
            Ok(()) => return Ok(()),
            Err(e) if t0.elapsed() >= INTERFACE_WAIT || stop.load(Ordering::SeqCst) => {
                return Err(e.into());
            }
            Err(e) => {
                if !said {
                    log::warn!(
                        "{e}; waiting up to {} for it to appear",
                        units::fmt_duration(INTERFACE_WAIT)
                    );
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        }
    }
}

/// How long the daemon waits at start for a frontend interface that is not there yet.
pub const INTERFACE_WAIT: Duration = Duration::from_secs(30);

/// Installs SIGTERM/SIGINT handlers that ask [`Agent::run`] to stop, and returns the flag.
pub fn stop_on_signals() -> &'static AtomicBool {
    set_handler(nix::sys::signal::Signal::SIGTERM, on_stop_signal);
    set_handler(nix::sys::signal::Signal::SIGINT, on_stop_signal);
    &STOP
}
