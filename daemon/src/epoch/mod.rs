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
//! - `startup`: opening the log, recovering the journal, starting both threads;
//! - `run`: the loop between epochs (Waiting, StorageFailed, wipe-now, reloads);
//! - `phases`: one epoch, a method per state;
//! - [`workloads`]: drain and restart;
//! - [`statement`]: where a statement is built, signed, quoted by the TPM and appended;
//! - `tpm_enroll`: the AK's enrolment with the verifier, beside the loop;
//! - [`spool`] and [`delivery`]: the delivered cursor and the sender.
//!
//! The root of trust ([`crate::tpm::Attestor`]) is opened once when the loop starts, as
//! `[tpm]` says; every statement states it, and where it is a TPM carries a quote.

pub mod challenge;
pub mod delivery;
pub mod host_keys;
pub mod journal;
pub mod openings;
mod phases;
mod run;
pub mod sampling_key;
pub mod spool;
mod startup;
pub mod statement;
pub mod tlog;
#[cfg(feature = "tpm")]
pub mod tpm_enroll;
pub mod transport;
pub mod workloads;

pub use startup::start;

use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    time::Duration,
};

use rackwarden_attest::{
    evidence::{EpochTrigger, Incident, PhaseTime, ProducerIdentity, WorkloadOutcome},
    evidence_log::EvidenceLog,
    now_ms,
};
use serde::{Deserialize, Serialize};

use self::{
    delivery::DeliveryStatus,
    journal::{Journal, JournalEntry},
    statement::AttestedLog,
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
    /// The keyid of the key statements are signed with now.
    #[serde(default)]
    pub keyid: String,
    /// A pending key rotation: the keyid the next statement names (`keygen --rotate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_keyid: Option<String>,
    /// What every statement of this run says about the root of trust (`[tpm]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_of_trust: Option<rackwarden_attest::tpm::RootOfTrust>,
    /// Where the AK's enrolment with the verifier stands; absent without a TPM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ak_enrolment: Option<AkEnrolment>,
    /// The tap (`[taps]`): bytes read into the epoch in progress, the spool, the last commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taps: Option<crate::taps::runner::TapStatus>,
}

/// The AK's enrolment in this run: until it is enrolled, the verifier cannot check the
/// quotes (they are `ak_not_enrolled`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum AkEnrolment {
    /// An attempt is under way (or about to start).
    Enrolling,
    Enrolled {
        ak_name: String,
        ek_issuer: String,
        /// The verifier instance that enrolled it (`url` or one of `fallback_urls`).
        #[serde(default)]
        verifier: String,
    },
    /// The last attempt failed; the next epoch tries again.
    Failed { error: String },
}

/// Asks the epoch loop to do something.
pub enum EpochCommand {
    WipeNow,
    /// A reloaded configuration (SIGHUP): interval, verifier, wipe plan, images, workloads.
    Reload(Box<Config>),
}

#[derive(Debug, thiserror::Error)]
pub enum EpochError {
    #[error("{0}")]
    Taps(crate::taps::TapError),
    #[error("epoch.signing_key {path}: {source}")]
    Key {
        path: PathBuf,
        source: rackwarden_attest::keys::KeyError,
    },
    #[error(
        "the evidence log's last statement rotated to key {keyid}, which is neither the signing key {signing_key} nor its next key: put that key back (signing with another would be refused)"
    )]
    RotatedKeyMissing { keyid: String, signing_key: PathBuf },
    #[error(transparent)]
    Log(#[from] rackwarden_attest::evidence_log::LogError),
    #[error(transparent)]
    Journal(#[from] journal::JournalError),
    #[error(transparent)]
    Spool(#[from] spool::SpoolError),
    #[error(transparent)]
    TpmRequired(#[from] crate::tpm::TpmRequired),
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
    /// The tap's thread, where `[taps]` is configured.
    pub taps: Option<Arc<crate::taps::runner::TapHandle>>,
}

impl EpochHandle {
    pub fn snapshot(&self) -> Option<EpochStatus> {
        let mut s = self.status.lock().ok()?.clone();
        if let Ok(d) = self.delivery_status.lock() {
            s.delivery = d.clone();
        }
        s.taps = self.taps.as_ref().map(|t| t.status());
        Some(s)
    }
}

/// The epoch loop's own state, owned by its thread.
struct EpochLoop {
    cfg: Config,
    ecfg: EpochConfig,
    /// The signing key, and the next one while a rotation is pending.
    keys: host_keys::HostKeys,
    producer: ProducerIdentity,
    /// The log, appended to with the root of trust's quote (`None` after a failed write, until
    /// it is reopened).
    log: Option<AttestedLog>,
    log_path: PathBuf,
    /// The root of trust, opened at start: it outlives a reopened log.
    attestor: crate::tpm::Attestor,
    /// The AK's enrolment with the verifier; `None` without a TPM.
    #[cfg(feature = "tpm")]
    enrolment: Option<tpm_enroll::TpmEnrolment>,
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
    /// Shared with delivery, which signs openings with it: kept to the current key.
    signer: Arc<Mutex<ed25519_dalek::SigningKey>>,
    /// The verifier as delivery sees it: a reload changes it for both loops.
    endpoint: Arc<Mutex<crate::config::epoch::VerifierEndpoint>>,
    status: Arc<Mutex<EpochStatus>>,
    heartbeat_ms: Arc<AtomicU64>,
    wipe_progress: Arc<AtomicU64>,
    /// TEST HOOK (`RACKWARDEN_TEST_HOLD=STATE:MS`): pause MS after entering STATE, so the
    /// crash tests can `kill -9` the daemon inside any state. It only adds a pause; nothing
    /// the epoch does or signs changes. Never set outside tests.
    test_hold: Option<(String, Duration)>,
    /// The tap's thread, committing each epoch's traffic at its statement (`[taps]`).
    taps: Option<Arc<crate::taps::runner::TapHandle>>,
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

    /// Shows the signing key and a pending rotation in the status.
    fn publish_keys(&self) {
        if let Ok(mut st) = self.status.lock() {
            st.keyid = self.keys.keyid();
            st.next_keyid = self.keys.next_keyid();
        }
        if let Ok(mut k) = self.signer.lock() {
            k.clone_from(self.keys.current());
        }
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

    /// Reopens the log after a failed write: the torn tail is terminated and disclosed.
    fn log(&mut self) -> Result<&mut AttestedLog, Abort> {
        if self.log.is_none() {
            let l = EvidenceLog::open_with_keys(&self.log_path, &self.keys.ring_keys())
                .map_err(|e| Abort::Storage(e.to_string()))?;
            self.durable_len.store(l.durable_len(), Ordering::SeqCst);
            self.log = Some(AttestedLog::new(l, self.attestor.clone()));
        }
        self.log
            .as_mut()
            .ok_or_else(|| Abort::Storage("evidence log not open".into()))
    }
}
