//! The epoch loop: every `wipe_interval` (and at once on `rackwarden wipe-now`), on its own
//! thread so the hook checks never pause while a wipe runs:
//!
//! ```mermaid
//! stateDiagram-v2
//!     [*] --> Waiting
//!     Waiting --> Challenging: next_at reached / wipe-now / interrupted epoch found
//!     Challenging --> Challenged: verifier nonce, or a local one marked unchallenged
//!     Challenged --> Draining
//!     Draining --> Wiping: workloads down
//!     Draining --> Signing: drain failed (no wipe, reported)
//!     Wiping --> Staging
//!     Staging --> Restarting: wipe and every image verified
//!     Staging --> Signing: a failure: workloads stay stopped, reported
//!     Restarting --> Signing
//!     Signing --> Waiting: statement fsynced, handed to delivery
//!     Signing --> StorageFailed: the log cannot be written (full disk)
//!     StorageFailed --> Challenging: retry_at reached
//! ```
//!
//! Every state change is written to the [`journal`] first, so an epoch cut short by a crash
//! or `kill -9` is named (seq and state) by the next statement. Delivery runs on a thread of
//! its own ([`delivery`]): a verifier that is down never holds up an epoch.
//!
//! - [`challenge`]: where a nonce is requested (and where `unchallenged` is decided);
//! - `phases`: one epoch, a method per state;
//! - [`workloads`]: drain and restart;
//! - [`statement`]: where a statement is built, signed and appended;
//! - [`spool`] and [`delivery`]: the delivered cursor and the sender.

pub mod challenge;
pub mod delivery;
pub mod journal;
mod phases;
pub mod spool;
pub mod statement;
pub mod transport;
pub mod workloads;

use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc,
    },
    time::Duration,
};

use ed25519_dalek::SigningKey;
use rackwarden_attest::{
    evidence::{EpochTrigger, Incident, PhaseTime, ProducerIdentity, WorkloadOutcome},
    log::EvidenceLog,
    now_ms,
};
use serde::{Deserialize, Serialize};

use self::{
    delivery::{Delivery, DeliveryStatus},
    journal::{Journal, JournalEntry},
    spool::Spool,
};
use crate::config::{Config, epoch::EpochConfig};

/// Where an epoch is. States carry what they are about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum EpochState {
    /// Until `next_at_ms` (or a wipe-now).
    Waiting {
        next_at_ms: u64,
    },
    Challenging {
        seq: u64,
    },
    /// `nonce` is the verifier's, or absent when the epoch runs unchallenged.
    Challenged {
        seq: u64,
        nonce: Option<String>,
    },
    Draining {
        seq: u64,
    },
    Wiping {
        seq: u64,
    },
    Staging {
        seq: u64,
    },
    Restarting {
        seq: u64,
    },
    Signing {
        seq: u64,
    },
    /// The evidence log or the journal could not be written (a full disk): no epoch runs
    /// until `retry_at_ms`, and nothing already written is touched.
    StorageFailed {
        error: String,
        retry_at_ms: u64,
    },
}

impl EpochState {
    /// The journal's and the incident's name for the state.
    pub fn name(&self) -> &'static str {
        match self {
            EpochState::Waiting { .. } => "waiting",
            EpochState::Challenging { .. } => "challenging",
            EpochState::Challenged { .. } => "challenged",
            EpochState::Draining { .. } => "draining",
            EpochState::Wiping { .. } => "wiping",
            EpochState::Staging { .. } => "staging",
            EpochState::Restarting { .. } => "restarting",
            EpochState::Signing { .. } => "signing",
            EpochState::StorageFailed { .. } => "storage_failed",
        }
    }
}

/// The last epoch that signed its statement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastEpoch {
    pub seq: u64,
    pub ended_at_ms: u64,
    pub trigger: EpochTrigger,
    pub unchallenged: Option<String>,
    pub wipe_ok: bool,
    pub images_ok: Option<bool>,
    pub workloads: WorkloadOutcome,
    pub downtime_ms: u64,
    pub phases: Vec<PhaseTime>,
}

/// What `rackwarden status` shows of the epoch loop and delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochStatus {
    pub state: EpochState,
    pub wipe_interval_ms: u64,
    pub verifier_url: String,
    pub last_epoch: Option<LastEpoch>,
    pub last_error: Option<String>,
    pub delivery: DeliveryStatus,
}

/// Asks the epoch loop to do something.
pub enum EpochCommand {
    WipeNow,
    /// A reloaded configuration (SIGHUP): interval, verifier, wipe plan, images, workloads.
    Reload(Box<Config>),
}

#[derive(Debug, thiserror::Error)]
pub enum EpochError {
    #[error("epoch.signing_key {path}: {source}")]
    Key {
        path: PathBuf,
        source: rackwarden_attest::keys::KeyError,
    },
    #[error(transparent)]
    Log(#[from] rackwarden_attest::log::LogError),
    #[error(transparent)]
    Journal(#[from] journal::JournalError),
    #[error(transparent)]
    Spool(#[from] spool::SpoolError),
    #[error("cannot start the {what} thread: {source}")]
    Thread {
        what: &'static str,
        source: std::io::Error,
    },
}

/// Handles the agent keeps: send commands, read status, check liveness.
pub struct EpochHandle {
    pub commands: mpsc::Sender<EpochCommand>,
    pub status: Arc<Mutex<EpochStatus>>,
    delivery_status: Arc<Mutex<DeliveryStatus>>,
    /// Unix ms of the epoch loop's last sign of life, and of the delivery loop's.
    pub epoch_heartbeat_ms: Arc<AtomicU64>,
    pub delivery_heartbeat_ms: Arc<AtomicU64>,
    /// Bytes the running wipe has filled or verified: a wipe of 2 TB takes a while, and this
    /// moving is how the watchdog knows it is not stuck.
    pub wipe_progress: Arc<AtomicU64>,
}

impl EpochHandle {
    pub fn snapshot(&self) -> Option<EpochStatus> {
        let mut s = self.status.lock().ok()?.clone();
        if let Ok(d) = self.delivery_status.lock() {
            s.delivery = d.clone();
        }
        Some(s)
    }
}

/// The epoch loop's own state, owned by its thread.
struct EpochLoop {
    cfg: Config,
    ecfg: EpochConfig,
    key: SigningKey,
    producer: ProducerIdentity,
    log: Option<EvidenceLog>,
    log_path: PathBuf,
    journal: Journal,
    /// Incidents the next statement must carry (recovered from the journal at start).
    carried: Vec<Incident>,
    /// Why the next epoch runs (set at start, by wipe-now, and by a recovered journal).
    trigger_now: Option<EpochTrigger>,
    /// The journal entry of the epoch in progress.
    current: Option<JournalEntry>,
    /// Consecutive epochs that could not write their evidence (the retry backoff).
    storage_failures: u32,
    next_at_ms: u64,
    durable_len: Arc<AtomicU64>,
    kick: mpsc::Sender<()>,
    /// The verifier as delivery sees it: a reload changes it for both loops.
    endpoint: Arc<Mutex<crate::config::epoch::VerifierEndpoint>>,
    status: Arc<Mutex<EpochStatus>>,
    heartbeat_ms: Arc<AtomicU64>,
    wipe_progress: Arc<AtomicU64>,
    /// TEST HOOK (`RACKWARDEN_TEST_HOLD=STATE:MS`): pause MS after entering STATE, so the
    /// crash tests can `kill -9` the daemon inside any state. It only adds a pause; nothing
    /// the epoch does or signs changes. Never set outside tests.
    test_hold: Option<(String, Duration)>,
}

/// Reads the test hook, e.g. `RACKWARDEN_TEST_HOLD=wiping:3000`.
fn test_hold_from_env() -> Option<(String, Duration)> {
    let v = std::env::var("RACKWARDEN_TEST_HOLD").ok()?;
    let (state, ms) = v.split_once(':')?;
    let ms: u64 = ms.parse().ok()?;
    log::warn!("TEST HOOK RACKWARDEN_TEST_HOLD: pausing {ms} ms in state `{state}` of every epoch");
    Some((state.to_string(), Duration::from_millis(ms)))
}

/// What the journal left: the incidents the next statement carries, and whether an epoch
/// must start at once because one was interrupted.
struct Recovered {
    carried: Vec<Incident>,
    trigger_now: Option<EpochTrigger>,
}

/// Reads the journal an earlier run left. An unreadable journal (it is replaced atomically,
/// so this is damage or tampering) is kept aside as evidence and disclosed; it does not stop
/// the daemon.
fn recover_journal(journal: &Journal, next_seq: u64, now: u64) -> Result<Recovered, EpochError> {
    let found = match journal.read() {
        Ok(e) => e,
        Err(e) => {
            let kept = journal.set_aside(now);
            log::error!(
                "{e}; kept as {}; the next statement discloses it",
                kept.display()
            );
            Some(JournalEntry {
                seq: next_seq,
                state: "unknown".into(),
                trigger: EpochTrigger::AfterInterruption,
                started_unix_ms: 0,
                carried: vec![],
            })
        }
    };
    let mut recovered = Recovered {
        carried: Vec::new(),
        trigger_now: None,
    };
    if let Some(entry) = found {
        recovered.carried = journal::recover(&entry, next_seq, now);
        if recovered.carried.is_empty() {
            journal.clear()?;
        } else {
            log::warn!(
                "epoch {} was interrupted in state `{}` (started at {} ms): the next statement reports it, and an epoch starts now",
                entry.seq,
                entry.state,
                entry.started_unix_ms
            );
            recovered.trigger_now = Some(EpochTrigger::AfterInterruption);
        }
    }
    Ok(recovered)
}

/// The handles both loops share with the agent.
struct Shared {
    status: Arc<Mutex<EpochStatus>>,
    delivery_status: Arc<Mutex<DeliveryStatus>>,
    epoch_heartbeat_ms: Arc<AtomicU64>,
    delivery_heartbeat_ms: Arc<AtomicU64>,
    wipe_progress: Arc<AtomicU64>,
    durable_len: Arc<AtomicU64>,
    endpoint: Arc<Mutex<crate::config::epoch::VerifierEndpoint>>,
}

/// Starts the delivery thread and kicks it once: whatever is still undelivered from before
/// the restart goes out now. The cursor is read first, so a broken one stops the start, not
/// a later delivery.
fn start_delivery(
    cfg: &Config,
    key: &SigningKey,
    shared: &Shared,
    stop: &'static AtomicBool,
) -> Result<mpsc::Sender<()>, EpochError> {
    let (kick_tx, kick_rx) = mpsc::channel();
    let delivery = Delivery {
        spool: Spool::new(&cfg.state_paths(), key.verifying_key()),
        endpoint: shared.endpoint.clone(),
        durable_len: shared.durable_len.clone(),
        status: shared.delivery_status.clone(),
        heartbeat_ms: shared.delivery_heartbeat_ms.clone(),
    };
    delivery.spool.load_cursor()?;
    std::thread::Builder::new()
        .name("delivery".into())
        .spawn(move || delivery.run(stop, kick_rx))
        .map_err(|source| EpochError::Thread {
            what: "delivery",
            source,
        })?;
    let _ = kick_tx.send(());
    Ok(kick_tx)
}

/// Opens the log, recovers an interrupted epoch, and starts the epoch and delivery threads.
/// `ecfg` is `cfg.epoch`. Fails (before anything runs) on an unusable key or log.
pub fn start(
    cfg: &Config,
    ecfg: &EpochConfig,
    stop: &'static AtomicBool,
) -> Result<EpochHandle, EpochError> {
    let key = rackwarden_attest::keys::load_signing_key(&ecfg.signing_key).map_err(|source| {
        EpochError::Key {
            path: ecfg.signing_key.clone(),
            source,
        }
    })?;
    let log_path = cfg.state_paths().evidence_log();
    let log = EvidenceLog::open(&log_path, &key.verifying_key())?;
    let journal = Journal::new(&cfg.state_paths());
    let now = now_ms();
    let Recovered {
        carried,
        mut trigger_now,
    } = recover_journal(&journal, log.next_link().0, now)?;
    let interval_ms = ecfg.wipe_interval.as_millis() as u64;
    let next_at_ms = match log.tip {
        // Keep the cadence across restarts: the next epoch is due an interval after the last.
        Some(t) => t.epoch_end_unix_ms.saturating_add(interval_ms),
        None => {
            trigger_now.get_or_insert(EpochTrigger::Startup);
            now
        }
    };
    let shared = Shared {
        status: Arc::new(Mutex::new(EpochStatus {
            state: EpochState::Waiting { next_at_ms },
            wipe_interval_ms: interval_ms,
            verifier_url: ecfg.verifier.url.clone(),
            last_epoch: None,
            last_error: None,
            delivery: DeliveryStatus::default(),
        })),
        delivery_status: Arc::new(Mutex::new(DeliveryStatus::default())),
        epoch_heartbeat_ms: Arc::new(AtomicU64::new(now)),
        delivery_heartbeat_ms: Arc::new(AtomicU64::new(now)),
        wipe_progress: Arc::new(AtomicU64::new(0)),
        durable_len: Arc::new(AtomicU64::new(log.durable_len())),
        endpoint: Arc::new(Mutex::new(ecfg.verifier.clone())),
    };
    let kick = start_delivery(cfg, &key, &shared, stop)?;
    let (cmd_tx, cmd_rx) = mpsc::channel();
    let lp = EpochLoop {
        cfg: cfg.clone(),
        ecfg: ecfg.clone(),
        key,
        producer: crate::collect::producer("rackwardend"),
        log: Some(log),
        log_path,
        journal,
        carried,
        trigger_now,
        current: None,
        storage_failures: 0,
        next_at_ms,
        durable_len: shared.durable_len.clone(),
        kick,
        endpoint: shared.endpoint.clone(),
        status: shared.status.clone(),
        heartbeat_ms: shared.epoch_heartbeat_ms.clone(),
        wipe_progress: shared.wipe_progress.clone(),
        test_hold: test_hold_from_env(),
    };
    std::thread::Builder::new()
        .name("epoch".into())
        .spawn(move || lp.run(stop, cmd_rx))
        .map_err(|source| EpochError::Thread {
            what: "epoch",
            source,
        })?;
    Ok(EpochHandle {
        commands: cmd_tx,
        status: shared.status,
        delivery_status: shared.delivery_status,
        epoch_heartbeat_ms: shared.epoch_heartbeat_ms,
        delivery_heartbeat_ms: shared.delivery_heartbeat_ms,
        wipe_progress: shared.wipe_progress,
    })
}

/// How one epoch ended, short of a statement.
enum Abort {
    /// The daemon is stopping: the journal stays, and the next start reports the epoch.
    Stopping,
    /// The log or the journal could not be written.
    Storage(String),
}

impl EpochLoop {
    fn set_state(&self, seq: Option<u64>, s: EpochState) {
        match seq {
            Some(seq) => log::info!("epoch {seq}: {}", s.name()),
            None => log::debug!("epoch loop: {}", s.name()),
        }
        if let Ok(mut st) = self.status.lock() {
            st.state = s;
        }
        self.heartbeat_ms.store(now_ms(), Ordering::SeqCst);
    }

    fn set_error(&self, e: Option<String>) {
        if let Ok(mut st) = self.status.lock() {
            st.last_error = e;
        }
    }

    /// Enters `state` of epoch `entry.seq`: journal first, then status.
    fn enter(&mut self, entry: &mut JournalEntry, state: EpochState) -> Result<(), Abort> {
        entry.state = state.name().into();
        self.current = Some(entry.clone());
        self.journal
            .write(entry)
            .map_err(|e| Abort::Storage(e.to_string()))?;
        let name = state.name();
        self.set_state(Some(entry.seq), state);
        if let Some((s, d)) = &self.test_hold
            && s == name
        {
            std::thread::sleep(*d);
        }
        Ok(())
    }

    fn run(mut self, stop: &AtomicBool, commands: mpsc::Receiver<EpochCommand>) {
        while !stop.load(Ordering::SeqCst) {
            let trigger = match self.trigger_now.take() {
                Some(t) => Some(t),
                None if now_ms() >= self.next_at_ms => Some(EpochTrigger::Interval),
                None => None,
            };
            if let Some(trigger) = trigger {
                match self.epoch(trigger, stop) {
                    Ok(()) => {
                        self.set_error(None);
                        self.storage_failures = 0;
                        self.next_at_ms = now_ms() + self.ecfg.wipe_interval.as_millis() as u64;
                    }
                    Err(Abort::Stopping) => break,
                    Err(Abort::Storage(error)) => {
                        self.storage_failed(trigger, error);
                        self.wait(stop, &commands, true);
                        continue;
                    }
                }
                self.set_state(
                    None,
                    EpochState::Waiting {
                        next_at_ms: self.next_at_ms,
                    },
                );
            }
            self.wait(stop, &commands, false);
        }
        log::info!("epoch loop stopped");
    }

    /// -> StorageFailed: the evidence log or the journal could not be written, so the epoch
    /// signed nothing; the next try is held back.
    fn storage_failed(&mut self, trigger: EpochTrigger, error: String) {
        // The epoch ran (perhaps wiped) but signed nothing: the statement
        // that finally gets written says so.
        if let Some(e) = self.current.take() {
            journal::carry(
                &mut self.carried,
                Incident::EpochInterrupted {
                    seq: e.seq,
                    state: e.state,
                    started_unix_ms: e.started_unix_ms,
                    detected_unix_ms: now_ms(),
                },
            );
        }
        // 5 s, 10 s, 20 s, then every 30 s (or the interval, if shorter):
        // an operator who frees space sees the epoch resume soon after.
        self.storage_failures = self.storage_failures.saturating_add(1);
        let wait = Duration::from_secs(5u64 << (self.storage_failures - 1).min(3))
            .min(Duration::from_secs(30))
            .min(self.ecfg.wipe_interval.max(Duration::from_secs(5)));
        log::error!(
            "epoch: cannot write the evidence: {error}; no new epoch until it can (retry in {} s); nothing written so far is lost",
            wait.as_secs()
        );
        self.set_error(Some(error.clone()));
        self.next_at_ms = now_ms() + wait.as_millis() as u64;
        self.trigger_now = Some(trigger);
        self.set_state(
            None,
            EpochState::StorageFailed {
                error,
                retry_at_ms: self.next_at_ms,
            },
        );
    }

    /// Sleeps until the next epoch is due, a command arrives, or `stop`. After a storage
    /// failure a wipe-now does not cut the retry pause short.
    fn wait(&mut self, stop: &AtomicBool, commands: &mpsc::Receiver<EpochCommand>, hold: bool) {
        while !stop.load(Ordering::SeqCst) && now_ms() < self.next_at_ms {
            self.heartbeat_ms.store(now_ms(), Ordering::SeqCst);
            match commands.recv_timeout(Duration::from_millis(200)) {
                Ok(EpochCommand::WipeNow) if !hold => {
                    log::info!("wipe-now requested: starting an epoch");
                    self.trigger_now = Some(EpochTrigger::WipeNow);
                    return;
                }
                Ok(EpochCommand::WipeNow) => {
                    log::warn!(
                        "wipe-now requested while the evidence log cannot be written: retrying at the scheduled time"
                    );
                }
                Ok(EpochCommand::Reload(cfg)) => self.reload(*cfg),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn reload(&mut self, cfg: Config) {
        let Some(e) = cfg.epoch.clone() else {
            log::warn!(
                "reload: the new configuration has no [epoch]; the epoch loop keeps its old settings (stopping it needs a restart)"
            );
            return;
        };
        if e.signing_key != self.ecfg.signing_key {
            log::warn!(
                "reload: epoch.signing_key changed; it takes effect at the next restart (the chain's key does not change mid-run)"
            );
        }
        let old_interval = self.ecfg.wipe_interval;
        let key = self.ecfg.signing_key.clone();
        self.ecfg = EpochConfig {
            signing_key: key,
            ..e
        };
        self.cfg = cfg;
        if self.ecfg.wipe_interval != old_interval {
            let base = self
                .next_at_ms
                .saturating_sub(old_interval.as_millis() as u64);
            self.next_at_ms = base + self.ecfg.wipe_interval.as_millis() as u64;
            log::info!(
                "reload: wipe_interval {} -> {}; next epoch at {} ms",
                crate::units::fmt_duration(old_interval),
                crate::units::fmt_duration(self.ecfg.wipe_interval),
                self.next_at_ms
            );
        }
        if let Ok(mut st) = self.status.lock() {
            st.wipe_interval_ms = self.ecfg.wipe_interval.as_millis() as u64;
            st.verifier_url = self.ecfg.verifier.url.clone();
        }
        if let Ok(mut ep) = self.endpoint.lock() {
            *ep = self.ecfg.verifier.clone();
        }
    }

    /// Reopens the log after a failed write: the torn tail is terminated and disclosed.
    fn log(&mut self) -> Result<&mut EvidenceLog, Abort> {
        if self.log.is_none() {
            let l = EvidenceLog::open(&self.log_path, &self.key.verifying_key())
                .map_err(|e| Abort::Storage(e.to_string()))?;
            self.durable_len.store(l.durable_len(), Ordering::SeqCst);
            self.log = Some(l);
        }
        self.log
            .as_mut()
            .ok_or_else(|| Abort::Storage("evidence log not open".into()))
    }
}
