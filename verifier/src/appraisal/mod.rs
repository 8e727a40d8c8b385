//! Where a statement is judged. Appraisal is pure: a verified statement and the stored
//! context it is judged against go in, findings and the effects the service must apply
//! come out. Nothing here reads or writes the database (`service.rs` loads the context
//! and applies the effects in the ingest transaction).
//!
//! The result (`rackwarden_attest::result`, shared with the daemon) follows the shape of an
//! IETF EAR attestation result: an overall status, a per-aspect trustworthiness vector, the
//! policy id, and the findings. One module per aspect:
//!
//! | aspect | module | what it asks |
//! |---|---|---|
//! | identity | `identity` | is the key current, is the daemon build and its programs accepted |
//! | chain | `chain` | does this statement extend the host's chain (fork, gap, prev, time) |
//! | freshness | `freshness` | does it answer a nonce we issued to this host, unused, unexpired |
//! | freshness | `clock` | do its claimed times lie where the verifier saw them (nonce, receipt) |
//! | limiter | `limiter` | is the policer attached, first, unbypassed and protected |
//! | budget | `budget` | do the caps and the bytes that passed stay within the agreement |
//! | wipe | `wipe` | was memory wiped completely, bound to our nonce, within the interval |
//! | images | `images` | were only manifest images loaded |
//! | root_of_trust | `tpm` | is it quoted by the enrolled AK, and does its IMA list replay and pass |
//! | storage | `storage` | can state survive the wipe on a disk, in swap or a persistent filesystem |
//! | traffic | `traffic` | did the tap commit every byte the policer passed, and are the records kept |
//! | replay | `replay` | are the opened exchanges what the precommitted model produces |

mod boot;
pub(crate) mod budget;
mod chain;
mod clock;
mod freshness;
mod identity;
mod images;
mod limiter;
pub mod replay;
pub mod state_bound;
mod storage;
pub mod tpm;
pub(crate) mod traffic;
mod wipe;

use std::collections::BTreeMap;

pub use rackwarden_attest::result::{Aspect, AttestationResult, Finding, FindingCode, Status};
use rackwarden_attest::statement::{NextKey, Statement};
use rackwarden_attest::tpm::TrustLevel;

use crate::{
    config::Policy,
    store::{HostKey, NonceRecord},
};

/// What the store knows that a statement is judged against, loaded by the service before
/// appraisal.
#[derive(Debug, Clone)]
pub struct Context {
    /// The key that signed the statement.
    pub keyid: String,
    /// The key's retirement time, read from the store at ingest (a key retired while the
    /// service runs is retired at once).
    pub retired_ms: Option<u64>,
    /// A key the host rotated to: the first seq it speaks for.
    pub from_seq: Option<u64>,
    /// A key the host rotated away from: the last seq it speaks for.
    pub retired_after_seq: Option<u64>,
    /// The enrolled row of the key the statement names as `next_key`, if any is enrolled.
    pub next_key_enrolled: Option<HostKey>,
    pub enrolled_ms: u64,
    /// Stored statements with the same seq and a different digest (a fork).
    pub same_seq_others: usize,
    /// Stored statements at seq - 1: (digest, epoch end).
    pub predecessors: Vec<(String, u64)>,
    /// The last stored statement before this seq: the budget's baseline, across gaps too.
    pub baseline: Option<Statement>,
    /// The earliest the baseline's epoch can have ended by this verifier's clock: when the
    /// nonce it answered was issued (`None` when it answered none of ours).
    pub baseline_earliest_end_ms: Option<u64>,
    /// The stored record of the nonce the statement answers, if it names one.
    pub nonce: NonceLookup,
    /// End of the host's last epoch with a counted wipe.
    pub last_wipe_ms: Option<u64>,
    /// The quote that came with the statement and what it is checked against.
    pub tpm: tpm::TpmContext,
    /// The host's samples due in this epoch and the openings the statement names.
    pub traffic: traffic::TrafficContext,
    pub replay: replay::ReplayContext,
}

/// What the store says about the statement's nonce.
#[derive(Debug, Clone)]
pub enum NonceLookup {
    /// The statement answers no challenge.
    NotNamed,
    /// Named, but this verifier never issued it.
    Unknown,
    Found(NonceRecord),
}

/// What the service must do once the statement is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effects {
    /// The nonce was fresh and is consumed by this statement.
    pub consume_nonce: bool,
    /// The statement carries a complete wipe bound to our nonce: it resets the wipe clock.
    pub wipe_counts: bool,
    /// The statement names a next key that is accepted: it becomes the host's key from the
    /// next seq on, and the signing key is retired after this one.
    pub rotate_to: Option<NextKey>,
    /// The host's IMA list verified this far: the position the next statement continues.
    pub tpm_position: Option<crate::store::TpmPosition>,
    /// A boot whose event log verified with this statement: judges the boot's later ones.
    pub tpm_boot: Option<crate::store::TpmBoot>,
}

#[derive(Debug, Clone)]
pub struct Appraisal {
    pub result: AttestationResult,
    pub effects: Effects,
}

/// Collects findings for one statement.
pub(crate) struct Judge<'a> {
    pub policy: &'a Policy,
    pub findings: Vec<Finding>,
}

impl Judge<'_> {
    pub fn add(&mut self, code: FindingCode, severity: Status, detail: impl Into<String>) {
        self.findings.push(Finding {
            aspect: code.aspect(),
            code,
            severity,
            detail: detail.into(),
        });
    }

    pub(crate) fn has(&self, aspect: Aspect, severity: Status) -> bool {
        self.findings
            .iter()
            .any(|f| f.aspect == aspect && f.severity == severity)
    }

    fn result(
        self,
        st: &Statement,
        root_of_trust: Option<TrustLevel>,
        guard: Option<rackwarden_attest::result::GuardBasis>,
        storage: bool,
        traffic: bool,
        replay: bool,
    ) -> AttestationResult {
        let mut tw: BTreeMap<Aspect, Status> = Aspect::ALL
            .iter()
            .filter(|a| root_of_trust.is_some() || **a != Aspect::RootOfTrust)
            .filter(|a| storage || **a != Aspect::Storage)
            .filter(|a| traffic || **a != Aspect::Traffic)
            .filter(|a| replay || **a != Aspect::Replay)
            .map(|a| (*a, Status::Affirming))
            .collect();
        for f in &self.findings {
            let e = tw.entry(f.aspect).or_insert(Status::Affirming);
            *e = (*e).max(f.severity);
        }
        AttestationResult {
            status: tw.values().copied().max().unwrap_or(Status::Affirming),
            policy_id: self.policy.id.clone(),
            policy_digest: Some(self.policy.digest()),
            rack: st.predicate.rack_id.clone(),
            host: st.predicate.host_id.clone(),
            seq: st.predicate.seq,
            trustworthiness: tw,
            findings: self.findings,
            root_of_trust,
            guard,
        }
    }
}

/// Judges one statement (signature and attribution already checked) against its context.
/// `now_ms` is the receipt time.
pub fn appraise(policy: &Policy, st: &Statement, ctx: &Context, now_ms: u64) -> Appraisal {
    let mut j = Judge {
        policy,
        findings: Vec::new(),
    };
    // The order of the findings is part of a stored verdict (`recheck` compares them).
    identity::check_key(&mut j, st, ctx);
    let rotate_to = identity::check_next_key(&mut j, st, ctx);
    identity::check_daemon(&mut j, st);
    limiter::check_self_protection(&mut j, st);
    identity::check_programs(&mut j, st);
    chain::check(&mut j, st, ctx);
    let fresh = freshness::check(&mut j, st, ctx, now_ms);
    clock::check(&mut j, st, ctx, now_ms);
    limiter::check(&mut j, st);
    let elapsed_ms = clock::elapsed_ms(&j, st, ctx, now_ms);
    budget::check(&mut j, st, ctx.baseline.as_ref(), elapsed_ms);
    let wipe_counts = wipe::check(&mut j, st, ctx, clock::anchored_end_ms(st, now_ms));
    images::check(&mut j, st, ctx);
    chain::check_incidents(&mut j, st);
    // Last, so verdicts made before the TPM existed keep their finding order.
    let (root_of_trust, tpm_position, tpm_boot, guard) =
        if ctx.tpm.in_play(st, policy.min_root_of_trust) {
            let out = tpm::check(&mut j, st, &ctx.tpm);
            (Some(out.level), out.position, out.boot, out.guard)
        } else {
            (None, None, None, None)
        };
    // After the TPM, for the same reason.
    let storage = storage::in_play(&j, st);
    if storage {
        storage::check(&mut j, st);
    }
    // After the storage, for the same reason.
    let traffic = traffic::in_play(&j, st, &ctx.traffic);
    if traffic {
        traffic::check(&mut j, st, &ctx.traffic, now_ms);
    }
    // After the traffic, for the same reason.
    let replay = replay::in_play(&ctx.replay);
    if replay {
        replay::check(&mut j, &ctx.replay);
    }
    Appraisal {
        result: j.result(st, root_of_trust, guard, storage, traffic, replay),
        effects: Effects {
            consume_nonce: fresh,
            wipe_counts,
            rotate_to,
            tpm_position,
            tpm_boot,
        },
    }
}
