//! Re-derives every stored verdict from the verbatim envelopes: the same keys and nonces are
//! loaded into a fresh in-memory verifier and every statement is ingested again, in the order
//! and at the time it was first received. Any difference is reported with its cause: each
//! stored verdict names the digest of the policy it was made under, so a verdict that differs
//! because the policy was edited is told from one that does not re-derive under its own
//! policy (a stored verdict rewritten, or a verifier whose appraisal changed). Verdicts stored
//! before they named a policy cannot be told apart, and are reported as such.
//!
//! Each host's standing row (kept up to date at ingest and clearance, what the pages read)
//! is derived again from the stored statements and clearances, and any row that differs is
//! reported: the pages would have shown a standing the history does not give.
//!
//! The transparency log is checked against the statements: each leaf against the statement
//! it logged, each stored node against the leaves below it (`Store::tlog_audit`).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    appraisal::{AttestationResult, state_bound::StateBound},
    config::Policy,
    service::{IngestStatus, Verifier, VerifierError},
    store::{StandingRow, Store},
};

/// Why a stored verdict differs from the one re-derived now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DifferenceCause {
    /// It was made under another policy (`stored_digest`): the policy was edited since.
    PolicyChanged { stored_digest: String },
    /// It names the current policy and still differs: it does not re-derive (tampering, or
    /// an appraisal that changed), or its stored result does not read back.
    NotRederived,
    /// It names no policy (stored before verdicts did): an edit cannot be told from tampering.
    NoPolicyDigest,
}

#[derive(Debug, Serialize)]
pub struct RecheckDifference {
    pub rack: String,
    pub host: String,
    pub seq: u64,
    pub stored_status: String,
    pub rederived_status: String,
    /// The finding codes of each verdict, so a difference shows what differs.
    pub stored_findings: Vec<String>,
    pub rederived_findings: Vec<String>,
    pub cause: DifferenceCause,
}

/// A host's standing row as kept, against the one its stored history gives.
#[derive(Debug, Serialize)]
pub struct StandingDifference {
    pub rack: String,
    pub host: String,
    pub stored: StandingRow,
    pub rederived: StandingRow,
}

/// A rack's state bound, derived from the stored statements and again from the re-derived
/// store: the value its verdict and page show.
#[derive(Debug, Serialize)]
pub struct RackBoundCheck {
    pub rack: String,
    pub bound: StateBound,
    /// Whether the re-derived store gives the same bound.
    pub rederived_equal: bool,
}

#[derive(Debug, Serialize)]
pub struct RecheckReport {
    pub statements: usize,
    /// The digest of the policy the verdicts were re-derived under.
    pub policy_digest: String,
    pub differences: Vec<RecheckDifference>,
    /// Hosts whose standing was re-derived from their history.
    pub standings: usize,
    pub standing_differences: Vec<StandingDifference>,
    /// Where the transparency log and the stored statements disagree (a statement removed
    /// or rewritten after it was logged, a leaf or node edited), each in a sentence.
    pub log_differences: Vec<String>,
    /// Each rack's state bound under the current policy.
    pub state_bounds: Vec<RackBoundCheck>,
}

impl RecheckReport {
    /// Differences whose cause is `pred`.
    pub fn count(&self, pred: impl Fn(&DifferenceCause) -> bool) -> usize {
        self.differences.iter().filter(|d| pred(&d.cause)).count()
    }

    /// Whether some stored verdicts cannot be trusted: they do not re-derive under the
    /// policy they name, or name none and differ, or a host's standing row is not what its
    /// history gives. A policy edit alone is not that.
    pub fn untrusted(&self) -> bool {
        self.count(|c| !matches!(c, DifferenceCause::PolicyChanged { .. })) > 0
            || !self.standing_differences.is_empty()
            || !self.log_differences.is_empty()
            || self.state_bounds.iter().any(|b| !b.rederived_equal)
    }
}

/// Why `stored` and `rederived` differ, or `None` when they do not (the policy digests
/// aside: an edit that changes no verdict is no difference).
fn cause(
    stored: Option<&AttestationResult>,
    rederived: Option<&AttestationResult>,
    current_digest: &str,
) -> Option<DifferenceCause> {
    let Some(stored) = stored else {
        return Some(DifferenceCause::NotRederived);
    };
    let same = rederived.is_some_and(|r| {
        let mut r = r.clone();
        r.policy_digest.clone_from(&stored.policy_digest);
        r == *stored
    });
    if same {
        return None;
    }
    Some(match &stored.policy_digest {
        None => DifferenceCause::NoPolicyDigest,
        Some(d) if d == current_digest => DifferenceCause::NotRederived,
        Some(d) => DifferenceCause::PolicyChanged {
            stored_digest: d.clone(),
        },
    })
}

pub fn recheck(store: &Store, policy: &Policy) -> Result<RecheckReport, VerifierError> {
    let fresh = Store::in_memory()?;
    for k in store.host_keys()? {
        fresh.insert_host_key(&k)?;
    }
    for n in store.all_nonces()? {
        fresh.insert_nonce(&n.nonce, &n.rack, &n.host, n.issued_ms, n.expires_ms)?;
    }
    // The samples as drawn and the openings as received: ingest keeps a stored sample
    // rather than drawing again, and the traffic aspect reads both by their times.
    let (samples, openings) = store.all_samples_and_openings()?;
    for s in &samples {
        fresh.insert_sample(s)?;
    }
    for o in &openings {
        fresh.insert_openings(o)?;
    }
    // The replays as stored: the replay aspect judges them, by their times, at the policy's
    // tolerance.
    for r in store.all_replays()? {
        fresh.insert_replay(&r)?;
    }
    let digest = policy.digest();
    let mut v = Verifier::new(fresh, policy.clone())?;
    let all = store.all_statements()?;
    // AK enrolments are replayed at the times they were made: a statement is judged against
    // the AK that was enrolled when it arrived, as it was the first time.
    let mut enrolments = store.tpm_enrollment_history()?.into_iter().peekable();
    let mut differences = Vec::new();
    for s in &all {
        while let Some(e) = enrolments.next_if(|e| e.enrolled_ms <= s.received_ms) {
            v.store.enroll_tpm(&e)?;
        }
        let out = v.ingest(s.envelope.as_bytes(), s.received_ms)?;
        let re = match (out.status, &out.result) {
            (IngestStatus::Accepted, Some(r)) => r.status.name().to_string(),
            (st, _) => st.name().to_string(),
        };
        let stored = s.result();
        let cause = match cause(stored.as_ref(), out.result.as_ref(), &digest) {
            // The stored status column must agree with its own verdict too.
            None if re != s.status => Some(DifferenceCause::NotRederived),
            c => c,
        };
        if let Some(cause) = cause {
            let codes = |r: Option<&AttestationResult>| -> Vec<String> {
                r.map(|r| {
                    r.findings
                        .iter()
                        .map(|f| f.code.name().to_string())
                        .collect()
                })
                .unwrap_or_default()
            };
            differences.push(RecheckDifference {
                rack: s.rack.clone(),
                host: s.host.clone(),
                seq: s.seq,
                stored_status: s.status.clone(),
                rederived_status: re,
                stored_findings: codes(stored.as_ref()),
                rederived_findings: codes(out.result.as_ref()),
                cause,
            });
        }
    }
    let (standings, standing_differences) = recheck_standings(store)?;
    let mut by_rack: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (rack, host) in store.hosts_with_statements()? {
        by_rack.entry(rack).or_default().push(host);
    }
    let mut state_bounds = Vec::new();
    for (rack, hosts) in &by_rack {
        let names = || hosts.iter().map(String::as_str);
        let bound = crate::standing::state_bound_of(store, policy, rack, names())?;
        let again = crate::standing::state_bound_of(&v.store, policy, rack, names())?;
        state_bounds.push(RackBoundCheck {
            rack: rack.clone(),
            rederived_equal: bound == again,
            bound,
        });
    }
    Ok(RecheckReport {
        statements: all.len(),
        policy_digest: digest,
        differences,
        standings,
        standing_differences,
        log_differences: store.tlog_audit()?,
        state_bounds,
    })
}

/// Every host with a statement or a standing row: its row as kept against the one derived
/// from its statements and clearances.
fn recheck_standings(store: &Store) -> Result<(usize, Vec<StandingDifference>), VerifierError> {
    let kept = store.standing_rows()?;
    let mut hosts: Vec<(String, String)> = kept
        .iter()
        .map(|(r, h, _)| (r.clone(), h.clone()))
        .chain(store.hosts_with_statements()?)
        .collect();
    hosts.sort();
    hosts.dedup();
    let mut differences = Vec::new();
    for (rack, host) in &hosts {
        let stored = store.standing_row(rack, host)?;
        let rederived = store.derive_standing(rack, host)?;
        if stored != rederived {
            differences.push(StandingDifference {
                rack: rack.clone(),
                host: host.clone(),
                stored,
                rederived,
            });
        }
    }
    Ok((hosts.len(), differences))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoredStatement;

    /// A host's standing row rewritten behind the verifier's back (or left stale by a writer
    /// that did not keep it) is reported, and the stored standing is not trusted.
    #[test]
    fn a_standing_row_the_history_does_not_give_is_reported() {
        let cfg = crate::config::VerifierConfig::parse(
            std::path::Path::new("v.toml"),
            "listen = \"127.0.0.1:7700\"\ninsecure_http = true\ndatabase = \"/tmp/unused.sqlite\"\n\n[policy]\nmin_root_of_trust = \"none\"\nid = \"p\"\nnonce_ttl = \"10 min\"\nmax_wipe_interval = \"15 min\"\nmax_residue_host = \"4 GiB\"\nmax_residue_gpu = \"1 GiB\"\ntrainable_state = \"10 TB\"\nmax_epoch_fraction = 0.01\n\n[racks.r1]\negress = \"10 MB/s\"\ningress = \"10 MB/s\"\n",
        )
        .unwrap();
        let db = crate::store::testing::database("recheck_standing").unwrap();
        let store = Store::connect(&db).unwrap();
        for (seq, status) in [(0, "warning"), (1, "contraindicated")] {
            store
                .insert_statement(&StoredStatement {
                    id: 0,
                    rack: "r1".into(),
                    host: "h1".into(),
                    seq,
                    pae_sha3: format!("pae-{seq}"),
                    envelope: "{}".into(),
                    received_ms: seq,
                    epoch_end_ms: seq,
                    status: status.into(),
                    result: "{}".into(),
                    wipe_ms: None,
                })
                .unwrap();
        }
        let r = recheck(&store, &cfg.policy).unwrap();
        assert_eq!(r.standings, 1);
        assert!(r.standing_differences.is_empty(), "{r:?}");
        Store::connect(&db)
            .unwrap()
            .tamper(
                "UPDATE host_standing SET uncleared = 0, first_uncleared_id = NULL",
                &[],
            )
            .unwrap();
        let r = recheck(&store, &cfg.policy).unwrap();
        assert_eq!(r.standing_differences.len(), 1, "{r:?}");
        let d = &r.standing_differences[0];
        assert_eq!((d.stored.uncleared, d.rederived.uncleared), (0, 1));
        assert!(r.untrusted());
        drop(store);
        crate::store::testing::remove(&db);
    }
}
