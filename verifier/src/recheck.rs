//! Re-derives every stored verdict from the verbatim envelopes: the same keys and nonces are
//! loaded into a fresh in-memory verifier and every statement is ingested again, in the order
//! and at the time it was first received. Any difference is reported with its cause: each
//! stored verdict names the digest of the policy it was made under, so a verdict that differs
//! because the policy was edited is told from one that does not re-derive under its own
//! policy (a stored verdict rewritten, or a verifier whose appraisal changed). Verdicts stored
//! before they named a policy cannot be told apart, and are reported as such.

use serde::Serialize;

use crate::{
    appraisal::AttestationResult,
    config::Policy,
    service::{IngestStatus, Verifier, VerifierError},
    store::Store,
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
    pub cause: DifferenceCause,
}

#[derive(Debug, Serialize)]
pub struct RecheckReport {
    pub statements: usize,
    /// The digest of the policy the verdicts were re-derived under.
    pub policy_digest: String,
    pub differences: Vec<RecheckDifference>,
}

impl RecheckReport {
    /// Differences whose cause is `pred`.
    pub fn count(&self, pred: impl Fn(&DifferenceCause) -> bool) -> usize {
        self.differences.iter().filter(|d| pred(&d.cause)).count()
    }

    /// Whether some stored verdicts cannot be trusted: they do not re-derive under the
    /// policy they name, or name none and differ. A policy edit alone is not that.
    pub fn untrusted(&self) -> bool {
        self.count(|c| !matches!(c, DifferenceCause::PolicyChanged { .. })) > 0
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
    let digest = policy.digest();
    let mut v = Verifier::new(fresh, policy.clone())?;
    let all = store.all_statements()?;
    let mut differences = Vec::new();
    for s in &all {
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
            differences.push(RecheckDifference {
                rack: s.rack.clone(),
                host: s.host.clone(),
                seq: s.seq,
                stored_status: s.status.clone(),
                rederived_status: re,
                cause,
            });
        }
    }
    Ok(RecheckReport {
        statements: all.len(),
        policy_digest: digest,
        differences,
    })
}
