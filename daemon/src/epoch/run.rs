//! The loop between epochs: wait for the interval (or a wipe-now), run an epoch, and after
//! a storage failure hold the next try back; reloads arrive here too. The TPM's AK enrolment
//! starts with the loop and is retried after each epoch until it succeeds.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    sync::mpsc,
    time::Duration,
};

use rackwarden_attest::{
    evidence::{EpochTrigger, Incident},
    now_ms,
};

use super::{Abort, EpochCommand, EpochLoop, EpochState, journal};
use crate::config::{Config, epoch::EpochConfig};

/// How long the first epoch of a run waits for the AK's enrolment (`await_first_enrolment`):
/// an enrolment is two requests to the verifier and a credential activation in the TPM.
#[cfg(feature = "tpm")]
const FIRST_ENROLMENT_WAIT: Duration = Duration::from_secs(20);

impl EpochLoop {
    pub(super) fn run(mut self, stop: &AtomicBool, commands: mpsc::Receiver<EpochCommand>) {
        self.enrol_tpm();
        self.await_first_enrolment(stop);
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
                self.enrol_tpm();
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

    /// A key `keygen --rotate` wrote while we wait shows in the status as a pending rotation
    /// at once (the statement that names it is the next one). A next key that does not load
    /// is said when the statement is signed, not every tick.
    fn poll_next_key(&mut self) {
        if self.keys.next_keyid().is_none() {
            match self.keys.refresh_next() {
                Ok(()) if self.keys.next_keyid().is_some() => self.publish_keys(),
                Ok(()) => {}
                Err(e) => log::debug!("next key: {e}"),
            }
        }
    }

    /// Starts the AK's enrolment with the verifier unless this run has enrolled it or an
    /// attempt is still under way. It runs beside the loop: nothing here waits for it.
    fn enrol_tpm(&mut self) {
        #[cfg(feature = "tpm")]
        if let Some(enrolment) = &mut self.enrolment {
            let (ecfg, cfg, keys) = (&self.ecfg, &self.cfg, &self.keys);
            let changed = enrolment.retry(|| super::tpm_enroll::Enrolment {
                verifier: ecfg.verifier.clone(),
                rack: cfg.rack_id.clone(),
                host: cfg.host_id.clone(),
                key: keys.current().clone(),
            });
            self.publish_ak_enrolment(changed);
        }
    }

    /// Before the first epoch of a run: waits for the enrolment attempt just started, up to
    /// `FIRST_ENROLMENT_WAIT`. A statement quoted by an AK the verifier does not know yet is
    /// judged without a root of trust (`ak_not_enrolled`): on an honest host that has just
    /// started, a false alarm whenever the first epoch outran its enrolment (seen in a slow
    /// guest). A failed attempt (an unreachable verifier, a refusal) ends the wait at once;
    /// after the bound the epoch runs anyway and is judged as it stands.
    fn await_first_enrolment(&mut self, stop: &AtomicBool) {
        #[cfg(feature = "tpm")]
        {
            let until = std::time::Instant::now() + FIRST_ENROLMENT_WAIT;
            while self.enrolment.as_ref().is_some_and(|e| e.is_running())
                && !stop.load(Ordering::SeqCst)
                && std::time::Instant::now() < until
            {
                // Alive while it waits: the watchdog's liveness check reads this beat, and
                // `WatchdogSec=` may be shorter than the wait.
                self.heartbeat_ms.store(now_ms(), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
                self.collect_tpm_enrolment();
            }
        }
        #[cfg(not(feature = "tpm"))]
        let _ = stop;
    }

    /// Logs the outcome of an enrolment attempt as soon as it is known.
    fn collect_tpm_enrolment(&mut self) {
        #[cfg(feature = "tpm")]
        if let Some(enrolment) = &mut self.enrolment {
            let changed = enrolment.collect();
            self.publish_ak_enrolment(changed);
        }
    }

    /// Shows where the AK's enrolment stands in the status. Once enrolled, the next statement
    /// ships the IMA list from the boot aggregate: the statements before it were quoted by an
    /// AK the verifier could not check, so it holds no position to continue from.
    #[cfg(feature = "tpm")]
    fn publish_ak_enrolment(&self, changed: Option<super::AkEnrolment>) {
        let Some(state) = changed else { return };
        if matches!(state, super::AkEnrolment::Enrolled { .. }) {
            self.attestor.resend_ima_from_boot();
        }
        if let Ok(mut st) = self.status.lock() {
            st.ak_enrolment = Some(state);
        }
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
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    self.poll_next_key();
                    self.collect_tpm_enrolment();
                }
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
        if cfg.tpm != self.cfg.tpm {
            log::warn!(
                "reload: [tpm] changed; it takes effect at the next restart (the TPM is opened once per run)"
            );
        }
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
}
