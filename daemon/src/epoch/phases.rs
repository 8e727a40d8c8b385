//! One epoch, one method per state of the module's diagram: [`EpochLoop::epoch`] runs
//! Challenging/Challenged, Draining, Wiping, Staging, Restarting and Signing in turn. Each
//! state is entered through the journal first ([`EpochLoop::enter`]).

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Instant,
};

use rackwarden_attest::{
    evidence::{EpochRun, EpochTrigger, ImageReport, PhaseTime, WipeReport, WorkloadOutcome},
    now_ms,
    statement::Subject,
};

use super::{
    Abort, EpochLoop, EpochState, LastEpoch,
    challenge::{self, EpochChallenge},
    host_keys::{Recovery, recovery},
    journal::JournalEntry,
    statement::{self, EpochEvidence},
    workloads,
};
use crate::storage::EpochStorage;
use crate::{
    config::epoch::{SwapPolicy, Workloads},
    images::StagingOutcome,
    wipe,
};

/// Time each phase of an epoch.
struct Phases {
    list: Vec<PhaseTime>,
    t: Instant,
}

impl Phases {
    fn new() -> Phases {
        Phases {
            list: vec![],
            t: Instant::now(),
        }
    }
    fn done(&mut self, phase: &str) {
        self.list.push(PhaseTime {
            phase: phase.into(),
            ms: self.t.elapsed().as_millis() as u64,
        });
        self.t = Instant::now();
    }
}

/// The epoch in progress: its journal entry and what each phase leaves for the next.
struct Epoch {
    seq: u64,
    trigger: EpochTrigger,
    entry: JournalEntry,
    phases: Phases,
    /// From the start of the drain to the restart (0 with no workloads configured).
    downtime_ms: u64,
    /// Swap turned off and volumes erased before the wipe (`[wipe] swap`, `[wipe] erase`).
    storage: EpochStorage,
}

/// What an epoch did between the drain and the statement.
enum Outcome {
    /// The drain failed: nothing was wiped or staged, and the workloads were brought back.
    DrainFailed { reason: String },
    /// Drained and wiped; `staged` where `[images]` is configured.
    Wiped {
        report: WipeReport,
        /// Every device verified, nothing interrupted.
        verified: bool,
        staged: Option<StagingOutcome>,
        workloads: WorkloadOutcome,
    },
}

impl Outcome {
    fn workloads(&self) -> WorkloadOutcome {
        match self {
            Outcome::DrainFailed { reason } => WorkloadOutcome::DrainFailed {
                reason: reason.clone(),
            },
            Outcome::Wiped { workloads, .. } => workloads.clone(),
        }
    }

    fn wipe_ok(&self) -> bool {
        matches!(self, Outcome::Wiped { verified: true, .. })
    }

    /// `None` where no image set was staged.
    fn images_ok(&self) -> Option<bool> {
        match self {
            Outcome::Wiped {
                staged: Some(s), ..
            } => Some(s.refused.is_none()),
            _ => None,
        }
    }

    /// The wipe report and the staged images, as the statement carries them.
    fn into_evidence(self) -> (Option<WipeReport>, Option<(Vec<Subject>, ImageReport)>) {
        match self {
            Outcome::DrainFailed { .. } => (None, None),
            Outcome::Wiped { report, staged, .. } => {
                (Some(report), staged.map(|s| (s.subjects, s.report)))
            }
        }
    }
}

fn stopping(stop: &AtomicBool) -> Result<(), Abort> {
    if stop.load(Ordering::SeqCst) {
        return Err(Abort::Stopping);
    }
    Ok(())
}

impl EpochLoop {
    /// One whole epoch.
    pub(super) fn epoch(&mut self, trigger: EpochTrigger, stop: &AtomicBool) -> Result<(), Abort> {
        let seq = self.log()?.next_link().0;
        let mut epoch = Epoch {
            seq,
            trigger,
            entry: JournalEntry {
                seq,
                state: String::new(),
                trigger,
                started_unix_ms: now_ms(),
                carried: self.carried.clone(),
            },
            phases: Phases::new(),
            downtime_ms: 0,
            storage: EpochStorage::default(),
        };
        log::info!("epoch {seq}: start ({trigger:?})");
        let challenge = self.challenge(&mut epoch)?;
        let outcome = self.drain_to_restart(&mut epoch, &challenge, stop)?;
        self.sign(epoch, &challenge, outcome)
    }

    /// Challenging -> Challenged: the verifier's nonce, or a local one marked unchallenged.
    fn challenge(&mut self, epoch: &mut Epoch) -> Result<EpochChallenge, Abort> {
        let seq = epoch.seq;
        self.enter(&mut epoch.entry, EpochState::Challenging { seq })?;
        let ch = challenge::request(
            &self.ecfg.verifier,
            &self.cfg.rack_id,
            &self.cfg.host_id,
            self.ecfg.challenge_timeout,
        )
        .map_err(|e| Abort::Storage(format!("no nonce at all: {e}")))?;
        if let EpochChallenge::Unchallenged { reason, .. } = &ch {
            log::warn!("epoch {seq}: UNCHALLENGED (local nonce; the statement says so): {reason}");
        }
        epoch.phases.done("challenge");
        let nonce = match &ch {
            EpochChallenge::Verifier { nonce } => Some(nonce.to_hex()),
            EpochChallenge::Unchallenged { .. } => None,
        };
        self.enter(&mut epoch.entry, EpochState::Challenged { seq, nonce })?;
        Ok(ch)
    }

    /// Draining, then Wiping, Staging and Restarting as far as each allows.
    fn drain_to_restart(
        &mut self,
        epoch: &mut Epoch,
        ch: &EpochChallenge,
        stop: &AtomicBool,
    ) -> Result<Outcome, Abort> {
        let seq = epoch.seq;
        self.enter(&mut epoch.entry, EpochState::Draining { seq })?;
        let drain_start = Instant::now();
        let drained = workloads::drain(&self.ecfg.workloads);
        epoch.phases.done("drain");
        stopping(stop)?;
        let outcome = match drained {
            Err(e) => self.drain_failed(seq, e.to_string()),
            Ok(()) => self.wipe_stage_restart(epoch, ch, stop)?,
        };
        epoch.downtime_ms = match outcome.workloads() {
            WorkloadOutcome::NoneConfigured => 0,
            _ => drain_start.elapsed().as_millis() as u64,
        };
        Ok(outcome)
    }

    /// Draining -> Signing: no wipe; the workloads are brought back, since nothing is gained
    /// by keeping inference down on a host that was not wiped.
    fn drain_failed(&self, seq: u64, reason: String) -> Outcome {
        log::error!("epoch {seq}: drain failed: {reason}; no wipe this epoch");
        if let Err(e) = workloads::restart(&self.ecfg.workloads) {
            log::error!("epoch {seq}: restart after a failed drain failed too: {e}");
        }
        Outcome::DrainFailed { reason }
    }

    fn wipe_stage_restart(
        &mut self,
        epoch: &mut Epoch,
        ch: &EpochChallenge,
        stop: &AtomicBool,
    ) -> Result<Outcome, Abort> {
        let report = self.wiping(epoch, ch, stop)?;
        stopping(stop)?;
        let wipe_problem = wipe::unverified_reason(&report);
        let staged = self.staging(epoch)?;
        stopping(stop)?;
        let images_problem = staged.as_ref().and_then(|s| s.refused.clone());
        let workloads =
            self.restarting(epoch, wipe_problem.as_deref(), images_problem.as_deref())?;
        Ok(Outcome::Wiped {
            report,
            verified: wipe_problem.is_none(),
            staged,
            workloads,
        })
    }

    /// Wiping: memory filled with the stream keyed by the epoch's nonce and read back.
    fn wiping(
        &mut self,
        epoch: &mut Epoch,
        ch: &EpochChallenge,
        stop: &AtomicBool,
    ) -> Result<WipeReport, Abort> {
        // Swap off and erase by key come before the host wipe (the pages swapped back in and
        // the old keys' pages are then overwritten too), still in `Draining`: a swapoff of a
        // full swap area is one syscall that can take minutes, and the watchdog gives
        // `Wiping` only as long as the wipe's progress counter moves.
        let plan = &self.ecfg.wipe;
        if plan.swap == SwapPolicy::Off {
            epoch.storage.swap_turned_off = crate::storage::swap::turn_off_all();
        }
        epoch.storage.erased = crate::storage::erase::erase_all(&plan.erase);
        self.enter(&mut epoch.entry, EpochState::Wiping { seq: epoch.seq })?;
        let plan = &self.ecfg.wipe;
        self.wipe_progress.store(0, Ordering::SeqCst);
        let req = wipe::WipeRequest {
            nonce: *ch.wipe_nonce().as_bytes(),
            backends: plan.backends.clone(),
            max_bytes: plan.max_bytes,
            reserve_bytes: plan.reserve_bytes,
            scratch_paths: plan.scratch.clone(),
            threads: rackwarden_attest::merkle::default_threads(),
            progress: Some(self.wipe_progress.clone()),
            corrupt_byte_for_test: None,
        };
        let report = wipe::run(&req, stop);
        epoch.phases.done("wipe");
        Ok(report)
    }

    /// Staging, when `[images]` is configured.
    fn staging(&mut self, epoch: &mut Epoch) -> Result<Option<StagingOutcome>, Abort> {
        let Some(plan) = self.ecfg.images.clone() else {
            return Ok(None);
        };
        self.enter(&mut epoch.entry, EpochState::Staging { seq: epoch.seq })?;
        let staged = crate::images::stage_plan(&plan);
        epoch.phases.done("stage");
        Ok(Some(staged))
    }

    /// Restarting, only when the wipe and every image verified; otherwise the workloads
    /// stay stopped and the outcome says why.
    fn restarting(
        &mut self,
        epoch: &mut Epoch,
        wipe_problem: Option<&str>,
        images_problem: Option<&str>,
    ) -> Result<WorkloadOutcome, Abort> {
        let seq = epoch.seq;
        if let Workloads::NoneConfigured = self.ecfg.workloads {
            return Ok(WorkloadOutcome::NoneConfigured);
        }
        if wipe_problem.is_some() || images_problem.is_some() {
            let reason = [wipe_problem, images_problem]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join("; ");
            log::error!("epoch {seq}: workloads LEFT STOPPED: {reason}");
            return Ok(WorkloadOutcome::LeftStopped { reason });
        }
        self.enter(&mut epoch.entry, EpochState::Restarting { seq })?;
        let restarted = workloads::restart(&self.ecfg.workloads);
        epoch.phases.done("restart");
        Ok(match restarted {
            Ok(()) => WorkloadOutcome::Restarted,
            Err(e) => {
                log::error!("epoch {seq}: restart failed: {e}");
                WorkloadOutcome::LeftStopped {
                    reason: format!("restart failed: {e}"),
                }
            }
        })
    }

    /// The epoch's traffic, committed by the tap's thread (`[taps]`): a commit that fails is
    /// said in the statement, never left out.
    fn commit_traffic(&self, seq: u64) -> Option<rackwarden_attest::traffic::TrafficReport> {
        use rackwarden_attest::traffic::TrafficReport;
        let taps = self.taps.as_ref()?;
        Some(match taps.commit(seq) {
            Ok((summary, spool)) => TrafficReport::Committed {
                summary: Box::new(summary),
                spool,
            },
            Err(e) => {
                log::error!("epoch {seq}: the tap could not commit the epoch's traffic: {e}");
                TrafficReport::Failed {
                    reason: e.to_string(),
                }
            }
        })
    }

    /// Signing -> Waiting: the statement is signed, appended, fsynced and handed to delivery.
    fn sign(
        &mut self,
        mut epoch: Epoch,
        ch: &EpochChallenge,
        outcome: Outcome,
    ) -> Result<(), Abort> {
        let seq = epoch.seq;
        self.enter(&mut epoch.entry, EpochState::Signing { seq })?;
        let (workloads, wipe_ok, images_ok) =
            (outcome.workloads(), outcome.wipe_ok(), outcome.images_ok());
        let run = EpochRun {
            trigger: epoch.trigger,
            wipe_interval_ms: self.ecfg.wipe_interval.as_millis() as u64,
            phases: epoch.phases.list.clone(),
            workloads: workloads.clone(),
            downtime_ms: epoch.downtime_ms,
        };
        let (wipe, images) = outcome.into_evidence();
        // A verifier log that failed the delivery thread's check goes into the next signed
        // statement, with both checkpoints.
        let keeper = super::tlog::LogKeeper::new(&self.cfg.state_paths());
        let (log_incidents, failures_recorded) = keeper.undisclosed();
        let traffic = self.commit_traffic(seq);
        // The openings the verifier acknowledged since the last statement: named in this one.
        let book = super::openings::OpeningsBook::new(self.cfg.state_paths().tap_openings());
        let openings = book.acknowledged().unwrap_or_else(|e| {
            log::error!("epoch {seq}: the acknowledged openings cannot be read, none named: {e}");
            Vec::new()
        });
        let ev = EpochEvidence {
            challenge: ch.statement_challenge(),
            wipe,
            images,
            incidents: self.carried.iter().cloned().chain(log_incidents).collect(),
            epoch: Some(run),
            storage: std::mem::take(&mut epoch.storage),
            traffic,
            openings: openings.clone(),
        };
        // A key written by `keygen --rotate` since the last statement is announced in this one.
        if let Err(e) = self.keys.refresh_next() {
            log::warn!("epoch {seq}: the next key cannot be read, no rotation yet: {e}");
        }
        // A rotation statement whose append reported an error may still be whole in the
        // reopened log: then it is done, and the next key signs this one.
        let tip_next = self.log()?.tip_next_keyid.clone();
        let pending = self.keys.next_keyid();
        if recovery(tip_next.as_deref(), pending.as_deref()) == Recovery::Complete
            && let Err(e) = self.keys.complete_rotation()
        {
            log::error!("epoch {seq}: key rotation: {e}");
        }
        let (cfg, producer) = (self.cfg.clone(), self.producer.clone());
        let (key, next_key) = (self.keys.current().clone(), self.keys.announcement());
        let rotating = next_key.is_some();
        let log = self.log()?;
        let st = match statement::sign_and_append(&cfg, log, &key, &producer, ev, next_key) {
            Ok(st) => st,
            Err(e) => {
                // The file may now end in a torn line: reopen before the next append so
                // it is terminated and disclosed, never merged with the next statement.
                self.log = None;
                return Err(Abort::Storage(e.to_string()));
            }
        };
        let durable = self.log()?.durable_len();
        self.durable_len.store(durable, Ordering::SeqCst);
        // The next epoch's requests are seeded from this statement.
        let next_key = super::sampling_key::after(self.log()?.tip.as_ref());
        super::sampling_key::publish(
            &super::sampling_key::path(&self.cfg.control_socket),
            &next_key,
        );
        keeper.mark_disclosed(failures_recorded);
        // Named by a durable statement: not again. (A crash before this names them twice,
        // which the verifier checks the same way.)
        if let Err(e) = book.named(&openings) {
            log::warn!("epoch {seq}: {e}");
        }
        if rotating && let Err(e) = self.keys.complete_rotation() {
            // The new key signs from now on regardless; the next start completes the files.
            log::error!("epoch {seq}: key rotation: {e}");
        }
        self.publish_keys();
        let _ = self.kick.send(());
        self.carried.clear();
        self.current = None;
        epoch.phases.done("sign");
        // The statement is durable: the journal's job for this epoch is done. A failure
        // here is harmless (the next start sees the log already holds this seq).
        if let Err(e) = self.journal.clear() {
            log::warn!("epoch {seq}: {e}");
        }
        log::info!(
            "epoch {seq}: signed and logged ({} image(s), wipe {}, workloads {:?}, downtime {} ms); phases {}",
            st.subject.len(),
            if wipe_ok { "ok" } else { "NOT ok" },
            workloads,
            epoch.downtime_ms,
            epoch
                .phases
                .list
                .iter()
                .map(|p| format!("{} {} ms", p.phase, p.ms))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if let Ok(mut s) = self.status.lock() {
            s.last_epoch = Some(LastEpoch {
                seq,
                ended_at_ms: now_ms(),
                trigger: epoch.trigger,
                unchallenged: match ch {
                    EpochChallenge::Unchallenged { reason, .. } => Some(reason.clone()),
                    EpochChallenge::Verifier { .. } => None,
                },
                wipe_ok,
                images_ok,
                workloads,
                downtime_ms: epoch.downtime_ms,
                phases: epoch.phases.list,
            });
        }
        Ok(())
    }
}
