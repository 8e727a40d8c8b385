//! Starting: check every file the config names ([`crate::config::preflight`]), enter the
//! namespace, wait for the interfaces, refuse an interface another daemon's policer is on
//! and a pin root another daemon holds, and only then load or adopt the limiter, take over
//! every hook, put the bypass refusal in place, write the caps, check the hooks, and only
//! then start the epoch loop. A start that fails after loading a new policer takes it back.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use rackwarden_attest::evidence::ProtectionState;

use super::{Agent, AgentError, AgentState, policer_variant, wanted_caps};
use crate::{
    config::Config,
    enforce::gaps::GapLog,
    limiter::{Direction, Limiter, exclusive::PinRootLock, loader::ProgramVersion},
    pins::PinPaths,
    units,
};

/// How long the daemon waits at start for a frontend interface that is not there yet.
pub const INTERFACE_WAIT: Duration = Duration::from_secs(30);

impl Agent {
    /// Starting: enter the namespace, load or adopt the limiter, attach, write the caps.
    /// Must run before any other thread exists when `netns` is set (setns is per thread).
    pub fn start(cfg: Config, stop: &'static AtomicBool) -> Result<Agent, AgentError> {
        // Everything the config names, before the kernel is touched: a start that fails
        // after attaching would leave a policer behind (README, "Operating it").
        crate::config::preflight::check_files(&cfg)?;
        if let Some(ns) = &cfg.netns {
            crate::netns::enter(ns)?;
        }
        wait_for_interfaces(&cfg, stop)?;
        refuse_other_policers(&cfg)?;
        let lock = PinRootLock::acquire(&PinPaths::new(&cfg.pin_root))?;
        // In our namespace, before the kernel is touched: an address in use refuses here.
        let metrics = cfg.metrics_listen.map(crate::metrics::bind).transpose()?;
        let limiter = load_limiter(&cfg)?;
        let fresh = FreshLoad::of(&limiter, &cfg);
        let held = Held {
            pin_root_lock: lock,
            metrics,
        };
        Agent::enforce(cfg, limiter, held, stop).inspect_err(|e| {
            if let Some(f) = &fresh {
                f.take_back(e);
            }
        })
    }

    /// The steps after the limiter is loaded: attach, refuse the bypass, write the caps,
    /// check, start the epoch loop.
    fn enforce(
        cfg: Config,
        mut limiter: Limiter,
        held: Held,
        stop: &'static AtomicBool,
    ) -> Result<Agent, AgentError> {
        let gaps = GapLog::open(&cfg.state_paths())?;
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
            guard: crate::guard::keeper::GuardKeeper::default(),
            _pin_root_lock: held.pin_root_lock,
            metrics_listener: held.metrics,
        };
        log::info!("attach mode: {kind:?}");
        agent.take_over_hooks();
        agent.put_refusal_in_place();
        agent.write_caps_from_config()?;
        agent.check_hooks(true)?;
        agent.start_epoch_loop(stop)?;
        Ok(agent)
    }

    /// An upgrade: this build's program takes over every hook before anything else runs.
    fn take_over_hooks(&mut self) {
        if let Err(e) = self.limiter.replace_attached(&self.cfg.interfaces) {
            log::error!(
                "replacing the pinned policer failed: {e}; the hook checks restore what they can"
            );
        }
        match &self.limiter.version {
            ProgramVersion::Upgraded { from } => log::warn!(
                "upgraded the policer on every hook: {:?} -> {:?}",
                from.iter().map(|p| p.tag.clone()).collect::<Vec<_>>(),
                self.limiter
                    .identities()
                    .iter()
                    .map(|p| p.tag.clone())
                    .collect::<Vec<_>>()
            ),
            ProgramVersion::UpgradeRefused { reason } => {
                log::error!(
                    "this build's policer was NOT loaded; the pinned one enforces: {reason}"
                )
            }
            _ => {}
        }
    }

    /// The system-wide refusal of the bypass socket options; its absence is reported, and
    /// the hook checks keep trying.
    fn put_refusal_in_place(&mut self) {
        let (refusal, _) = crate::limiter::sockopt::ensure(
            self.limiter.pins(),
            crate::limiter::loader::OBJECT,
            self.cfg.refusal_cgroup.as_deref(),
        );
        if refusal.state == ProtectionState::Present {
            log::info!("bypass refusal present: {}", refusal.detail);
        } else {
            log::warn!("bypass refusal ABSENT: {}", refusal.detail);
        }
        self.refusal_present = refusal.state == ProtectionState::Present;
    }

    /// The epoch loop starts only once every hook enforces: its first statement must
    /// describe a limiter that is in place. Its threads inherit our network namespace.
    fn start_epoch_loop(&mut self, stop: &'static AtomicBool) -> Result<(), AgentError> {
        let Some(ecfg) = self.cfg.epoch.clone() else {
            return Ok(());
        };
        self.epoch = Some(crate::epoch::start(&self.cfg, &ecfg, stop)?);
        log::info!(
            "epoch loop started: wipe every {}, verifier {}",
            units::fmt_duration(ecfg.wipe_interval),
            ecfg.verifier.url
        );
        Ok(())
    }
}

/// What start takes before it loads the limiter and the agent keeps.
struct Held {
    pin_root_lock: Option<PinRootLock>,
    metrics: Option<std::net::TcpListener>,
}

/// A policer this start loaded where none was pinned. If the start then fails, it is taken
/// back: a first start that fails must not leave a policer that no daemon runs (a restart
/// or an upgrade adopts what was pinned before it, and leaves that in place).
struct FreshLoad {
    pins: PinPaths,
    interfaces: Vec<String>,
    program_ids: Vec<u32>,
}

impl FreshLoad {
    fn of(limiter: &Limiter, cfg: &Config) -> Option<FreshLoad> {
        (limiter.version == ProgramVersion::Loaded).then(|| FreshLoad {
            pins: limiter.pins().clone(),
            interfaces: cfg.interfaces.clone(),
            program_ids: Direction::ALL
                .iter()
                .map(|d| limiter.identity(*d).id)
                .collect(),
        })
    }

    /// Deletes our clsact filters (they hold the program without a pin), then the pin root:
    /// unpinning the tcx and cgroup links detaches them, and the programs and maps go with
    /// their last reference.
    fn take_back(&self, why: &AgentError) {
        use crate::limiter::watch;
        for iface in &self.interfaces {
            for dir in Direction::ALL {
                for p in watch::programs_on_hook(iface, dir) {
                    if let (Some((pref, handle)), true) =
                        (p.filter, self.program_ids.contains(&p.id))
                        && let Err(e) = watch::delete_clsact_filter(iface, dir, pref, handle)
                    {
                        log::error!("taking back the policer: {e}");
                    }
                }
            }
        }
        match self.pins.remove_all() {
            Ok(()) => log::warn!(
                "start failed after loading a new policer ({why}); took it back: nothing is left under {} or on {}",
                self.pins.root().display(),
                self.interfaces.join(", ")
            ),
            Err(e) => log::error!(
                "start failed after loading a new policer ({why}), and removing {} failed: {e}; the policer stays",
                self.pins.root().display()
            ),
        }
    }
}

/// Another daemon's policer on one of our interfaces refuses the start: two policers on one
/// hook fight over it. A pin root sealed for another executable is left to [`load_limiter`],
/// which says so (our own pins cannot be read there, so our programs would look foreign).
fn refuse_other_policers(cfg: &Config) -> Result<(), AgentError> {
    let pins = PinPaths::new(&cfg.pin_root);
    if sealed_against_us(&pins) {
        return Ok(());
    }
    crate::limiter::exclusive::refuse_other_policers(&pins, &cfg.interfaces)?;
    Ok(())
}

/// Loads the policer, or adopts the one pinned under `cfg.pin_root`, and says which.
fn load_limiter(cfg: &Config) -> Result<Limiter, AgentError> {
    let pins = PinPaths::new(&cfg.pin_root);
    let limiter = match Limiter::load_or_adopt(&pins, &wanted_caps(cfg), policer_variant(cfg)) {
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
    Ok(limiter)
}

/// Whether our pin root exists but refuses lookups to this process (EPERM on a stat of a
/// directory inside it): only the guard does that.
fn sealed_against_us(pins: &PinPaths) -> bool {
    pins.root().exists()
        && std::fs::metadata(pins.maps_dir()).is_err_and(|e| e.raw_os_error() == Some(libc::EPERM))
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
