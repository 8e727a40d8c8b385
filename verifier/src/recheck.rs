//! Re-derives every stored verdict from the verbatim envelopes: the same keys and nonces are
//! loaded into a fresh in-memory verifier and every statement is ingested again, in the order
//! and at the time it was first received. Any difference is reported.

use serde::Serialize;

use crate::{
    config::Policy,
    service::{IngestStatus, Verifier, VerifierError},
    store::Store,
};

#[derive(Debug, Serialize)]
pub struct RecheckDifference {
    pub rack: String,
    pub host: String,
    pub seq: u64,
    pub stored_status: String,
    pub rederived_status: String,
}

#[derive(Debug, Serialize)]
pub struct RecheckReport {
    pub statements: usize,
    pub differences: Vec<RecheckDifference>,
}

pub fn recheck(store: &Store, policy: &Policy) -> Result<RecheckReport, VerifierError> {
    let fresh = Store::in_memory()?;
    for k in store.host_keys()? {
        fresh.insert_host_key(&k)?;
    }
    for n in store.all_nonces()? {
        fresh.insert_nonce(&n.nonce, &n.rack, &n.host, n.issued_ms, n.expires_ms)?;
    }
    let mut v = Verifier::new(fresh, policy.clone())?;
    let all = store.all_statements()?;
    let mut differences = Vec::new();
    for s in &all {
        let out = v.ingest(s.envelope.as_bytes(), s.received_ms)?;
        let re = match (out.status, &out.result) {
            (IngestStatus::Accepted, Some(r)) => r.status.name().to_string(),
            (st, _) => st.name().to_string(),
        };
        // A rederived verdict equals the stored one only if both exist.
        let same_result = out.result.is_some() && out.result == s.result();
        if re != s.status || !same_result {
            differences.push(RecheckDifference {
                rack: s.rack.clone(),
                host: s.host.clone(),
                seq: s.seq,
                stored_status: s.status.clone(),
                rederived_status: re,
            });
        }
    }
    Ok(RecheckReport {
        statements: all.len(),
        differences,
    })
}
