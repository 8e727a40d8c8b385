//! Starting the epoch loop: load the key, open the log, recover an interrupted epoch from
//! the journal, open the root of trust, and start the delivery and epoch threads.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64},
        mpsc,
    },
    time::Duration,
};

use rackwarden_attest::{
    evidence::{EpochTrigger, Incident},
    evidence_log::EvidenceLog,
    now_ms,
};

#[cfg(feature = "tpm")]
use super::tpm_enroll::TpmEnrolment;
use super::{
    EpochError, EpochHandle, EpochLoop, EpochState, EpochStatus,
    delivery::{Delivery, DeliveryStatus},
    host_keys::{HostKeys, KeyRing, Recovery, recovery},
    journal::{self, Journal, JournalEntry},
    spool::Spool,
    statement::AttestedLog,
};
use crate::{
    config::{Config, epoch::EpochConfig},
    tpm::Attestor,
};

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
    /// The key statements are signed with now: the delivery thread signs openings with it.
    signer: Arc<Mutex<ed25519_dalek::SigningKey>>,
}

/// Starts the delivery thread and kicks it once: whatever is still undelivered from before
/// the restart goes out now. The cursor is read first, so a broken one stops the start, not
/// a later delivery.
fn start_delivery(
    cfg: &Config,
    keys: KeyRing,
    shared: &Shared,
    stop: &'static AtomicBool,
) -> Result<mpsc::Sender<()>, EpochError> {
    let (kick_tx, kick_rx) = mpsc::channel();
    // The samples the verifier draws are answered on a thread of their own.
    let (openings_kick, openings_rx) = mpsc::channel();
    let openings = super::openings::OpeningsWork {
        book: super::openings::OpeningsBook::new(cfg.state_paths().tap_openings()),
        spool_dir: cfg.state_paths().tap_spool(),
        signer: shared.signer.clone(),
    };
    let delivery = Delivery {
        spool: Spool::new(&cfg.state_paths(), keys),
        endpoint: shared.endpoint.clone(),
        durable_len: shared.durable_len.clone(),
        status: shared.delivery_status.clone(),
        heartbeat_ms: shared.delivery_heartbeat_ms.clone(),
        log: super::tlog::LogKeeper::new(&cfg.state_paths()),
        rack: cfg.rack_id.clone(),
        host: cfg.host_id.clone(),
        openings: openings.clone(),
        openings_kick,
    };
    delivery.spool.load_cursor()?;
    let (endpoint, status) = (shared.endpoint.clone(), shared.delivery_status.clone());
    let ids = (cfg.rack_id.clone(), cfg.host_id.clone());
    std::thread::Builder::new()
        .name("openings".into())
        .spawn(move || openings.run(endpoint, status, ids, stop, openings_rx))
        .map_err(|source| EpochError::Thread {
            what: "openings",
            source,
        })?;
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

/// Opens the TPM once for the whole run, as `[tpm]` says; `required` without a usable one
/// stops the start (the caps stay in place: they were loaded before).
fn open_root_of_trust(cfg: &Config) -> Result<Attestor, EpochError> {
    let attestor = Attestor::open(&cfg.tpm, &cfg.state_paths().tpm_ak(), &cfg.path)?;
    // A TPM asked for (`auto`) that cannot be used is a downgrade the operator must see: a
    // verifier that requires one will hold every statement of this host.
    match attestor.root_of_trust() {
        rackwarden_attest::tpm::RootOfTrust::None { .. }
            if cfg.tpm.mode != crate::config::tpm::TpmMode::Off =>
        {
            log::warn!(
                "root of trust DOWNGRADED to none: {}; statements rest on the daemon's key alone (`rackwarden check-config` says why; mode = \"required\" refuses to start instead)",
                attestor.describe()
            )
        }
        _ => log::info!("root of trust: {}", attestor.describe()),
    }
    Ok(attestor)
}

/// The tap's reader, where `[taps]` is configured: it must see the tapped policer's ring, which
/// the limiter loaded before the epoch loop starts.
fn start_taps(cfg: &Config) -> Result<Option<Arc<crate::taps::runner::TapHandle>>, EpochError> {
    let crate::config::taps::Taps::On(tc) = &cfg.taps else {
        return Ok(None);
    };
    let pins = crate::pins::PinPaths::new(&cfg.pin_root);
    let handle = crate::taps::runner::TapHandle::start(&pins, &cfg.state_paths(), tc)
        .map_err(EpochError::Taps)?;
    log::info!(
        "tap: reading every frame the policer passes; inference endpoints {:?}, spool {} bytes",
        tc.inference.iter().map(|e| e.tcp_port).collect::<Vec<_>>(),
        tc.spool_limit
    );
    Ok(Some(Arc::new(handle)))
}

/// Opens the log, recovers an interrupted epoch, and starts the epoch and delivery threads.
/// `ecfg` is `cfg.epoch`. Fails (before anything runs) on an unusable key or log.
pub fn start(
    cfg: &Config,
    ecfg: &EpochConfig,
    stop: &'static AtomicBool,
) -> Result<EpochHandle, EpochError> {
    let key_error = |source| EpochError::Key {
        path: ecfg.signing_key.clone(),
        source,
    };
    let mut keys = HostKeys::load(&ecfg.signing_key).map_err(key_error)?;
    let attestor = open_root_of_trust(cfg)?;
    let log_path = cfg.state_paths().evidence_log();
    let log = EvidenceLog::open_with_keys(&log_path, &keys.ring_keys())?;
    super::sampling_key::publish(
        &super::sampling_key::path(&cfg.control_socket),
        &super::sampling_key::after(log.tip.as_ref()),
    );
    // A rotation whose statement is in the log but whose rename did not happen (a crash
    // between the two): the next key signs the next seq, so the rename is done first.
    let next_keyid = keys.next_keyid();
    match recovery(log.tip_next_keyid.as_deref(), next_keyid.as_deref()) {
        Recovery::Complete => {
            log::warn!(
                "completing the key rotation the log's last statement announced (the daemon stopped before renaming the key)"
            );
            keys.complete_rotation().map_err(key_error)?;
        }
        Recovery::Announce | Recovery::Nothing => {}
    }
    if let Some(t) = &log.tip_next_keyid
        && *t != keys.keyid()
    {
        return Err(EpochError::RotatedKeyMissing {
            keyid: t.clone(),
            signing_key: ecfg.signing_key.clone(),
        });
    }
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
            keyid: keys.keyid(),
            next_keyid: keys.next_keyid(),
            root_of_trust: Some(attestor.root_of_trust().clone()),
            ak_enrolment: None,
            taps: None,
        })),
        delivery_status: Arc::new(Mutex::new(DeliveryStatus::default())),
        epoch_heartbeat_ms: Arc::new(AtomicU64::new(now)),
        delivery_heartbeat_ms: Arc::new(AtomicU64::new(now)),
        wipe_progress: Arc::new(AtomicU64::new(0)),
        durable_len: Arc::new(AtomicU64::new(log.durable_len())),
        endpoint: Arc::new(Mutex::new(ecfg.verifier.clone())),
        signer: Arc::new(Mutex::new(keys.current().clone())),
    };
    let taps = start_taps(cfg)?;
    let kick = start_delivery(cfg, keys.ring(), &shared, stop)?;
    let (cmd_tx, cmd_rx) = mpsc::channel();
    let lp = EpochLoop {
        cfg: cfg.clone(),
        ecfg: ecfg.clone(),
        keys,
        producer: crate::host_evidence::producer("rackwardend"),
        log: Some(AttestedLog::new(log, attestor.clone())),
        log_path,
        #[cfg(feature = "tpm")]
        enrolment: attestor.tpm().map(TpmEnrolment::new),
        attestor,
        journal,
        carried,
        trigger_now,
        current: None,
        storage_failures: 0,
        next_at_ms,
        durable_len: shared.durable_len.clone(),
        kick,
        endpoint: shared.endpoint.clone(),
        signer: shared.signer.clone(),
        status: shared.status.clone(),
        heartbeat_ms: shared.epoch_heartbeat_ms.clone(),
        wipe_progress: shared.wipe_progress.clone(),
        test_hold: test_hold_from_env(),
        taps: taps.clone(),
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
        taps,
    })
}
