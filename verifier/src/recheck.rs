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
        fresh.conn.execute(
            "INSERT INTO host_keys (rack, host, keyid, pubkey_pem, enrolled_ms, retired_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            rusqlite::params![k.rack, k.host, k.keyid, k.pubkey_pem, k.enrolled_ms as i64, k.retired_ms.map(|v| v as i64)],
        )?;
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
            (IngestStatus::Accepted, Some(r)) => serde_json::to_value(r.status)
                .ok()
                .and_then(|x| x.as_str().map(String::from))
                .unwrap_or_default(),
            (st, _) => format!("{st:?}").to_lowercase(),
        };
        let stored_result: serde_json::Value = serde_json::from_str(&s.result).unwrap_or_default();
        let same_result = out
            .result
            .as_ref()
            .map(|r| serde_json::to_value(r).unwrap_or_default())
            == Some(stored_result);
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
