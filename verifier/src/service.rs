//! The verifier's service: where a statement's signature and attribution are checked
//! ([`prepare`], outside the lock), where its stored context is loaded, and where the
//! verdict's effects (nonce consumed, wipe clock, the statement itself) are applied in the
//! ingest transaction. The judging itself is pure and lives in `appraisal`.

use std::{collections::HashMap, sync::Arc};

use ed25519_dalek::VerifyingKey;
use rackwarden_attest::{
    dsse::{self, Envelope, INTOTO_PAYLOAD_TYPE},
    keys,
    statement::{Challenge, Statement},
};
use serde::{Deserialize, Serialize};

pub use crate::appraisal::{AttestationResult, Finding, Status};
use crate::{
    appraisal::{self, Appraisal, Context, NonceLookup},
    config::Policy,
    store::{DbError, HostKey, Store, StoredStatement},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IngestStatus {
    Accepted,
    /// Already stored (the daemon retries): idempotent, with the stored result.
    Duplicate,
    /// Not attributable to an enrolled host, or not a valid statement: nothing stored.
    Rejected,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IngestOutcome {
    pub status: IngestStatus,
    pub result: Option<AttestationResult>,
    /// Why a statement was rejected.
    pub reason: Option<String>,
}

impl IngestOutcome {
    fn rejected(reason: String) -> IngestOutcome {
        IngestOutcome {
            status: IngestStatus::Rejected,
            result: None,
            reason: Some(reason),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VerifierError {
    #[error("database: {0}")]
    Db(#[from] DbError),
    #[error("rack `{rack}` host `{host}` is not enrolled")]
    NotEnrolled { rack: String, host: String },
    #[error(
        "rack `{rack}` host `{host}` already has {outstanding} unused nonces; use one or wait {retry_after_s} s"
    )]
    TooManyNonces {
        rack: String,
        host: String,
        outstanding: u64,
        retry_after_s: u64,
    },
    #[error("{0}")]
    Key(String),
    #[error("{0}")]
    Enroll(String),
}

/// What `enroll` did.
#[derive(Debug, Clone)]
pub struct Enrolled {
    pub keyid: String,
    /// The same key was already enrolled for this host: nothing changed.
    pub already: bool,
    pub warnings: Vec<String>,
}

/// keyid -> enrolled key (current and retired). Shared as a snapshot so that signatures can
/// be checked outside the verifier's lock, in parallel.
pub type KeyTable = HashMap<String, (HostKey, VerifyingKey)>;

pub struct Verifier {
    pub store: Store,
    pub policy: Policy,
    keys: Arc<KeyTable>,
    keys_loaded: std::time::Instant,
    pub metrics: Metrics,
}

/// A statement whose signature, type and attribution were checked: what remains needs the
/// database (chain, nonce, policy) and runs under the lock.
pub struct Prepared {
    hk: HostKey,
    raw: Vec<u8>,
    statement: Statement,
    pae: String,
}

/// Signature and attribution: no database, no lock.
pub fn prepare(keys: &KeyTable, raw: &[u8]) -> Result<Prepared, String> {
    let env: Envelope =
        serde_json::from_slice(raw).map_err(|e| format!("not a DSSE envelope: {e}"))?;
    // The keyid selects the candidate key; the signature decides.
    let (hk, vk) = env
        .signatures
        .iter()
        .find_map(|s| keys.get(&s.keyid))
        .ok_or_else(|| UNKNOWN_KEY.to_string())?;
    let verified = dsse::verify_envelope(&env, vk, INTOTO_PAYLOAD_TYPE)
        .map_err(|e| format!("signature: {e}"))?;
    let st = Statement::from_verified(&verified.payload).map_err(|e| format!("statement: {e}"))?;
    let p = &st.predicate;
    if p.rack_id != hk.rack || p.host_id != hk.host {
        return Err(format!(
            "statement claims {}/{} but the key is enrolled for {}/{}",
            p.rack_id, p.host_id, hk.rack, hk.host
        ));
    }
    Ok(Prepared {
        hk: hk.clone(),
        raw: raw.to_vec(),
        pae: hex::encode(verified.pae_sha3),
        statement: st,
    })
}

const UNKNOWN_KEY: &str = "signed by no enrolled key";

/// Unused, unexpired nonces one host may hold: a daemon asks once per epoch.
pub const MAX_OUTSTANDING_NONCES: u64 = 16;

#[derive(Debug, Default, Clone, Serialize)]
pub struct Metrics {
    pub accepted: u64,
    pub duplicate: u64,
    pub rejected: u64,
    pub affirming: u64,
    pub warning: u64,
    pub contraindicated: u64,
    pub challenges: u64,
}

/// Parses a stored envelope (verified when it was accepted).
pub fn stored_statement(s: &StoredStatement) -> Option<Statement> {
    let env: Envelope = serde_json::from_str(&s.envelope).ok()?;
    use base64::Engine as _;
    let payload = base64::engine::general_purpose::STANDARD
        .decode(env.payload)
        .ok()?;
    serde_json::from_slice(&payload).ok()
}

impl Verifier {
    pub fn new(store: Store, policy: Policy) -> Result<Verifier, VerifierError> {
        let mut v = Verifier {
            store,
            policy,
            keys: Arc::new(HashMap::new()),
            keys_loaded: std::time::Instant::now(),
            metrics: Metrics::default(),
        };
        v.reload_keys()?;
        Ok(v)
    }

    pub fn reload_keys(&mut self) -> Result<(), VerifierError> {
        let mut t = HashMap::new();
        for k in self.store.host_keys()? {
            let vk = keys::parse_verifying_key(&k.pubkey_pem).map_err(VerifierError::Key)?;
            t.insert(k.keyid.clone(), (k, vk));
        }
        self.keys = Arc::new(t);
        self.keys_loaded = std::time::Instant::now();
        Ok(())
    }

    /// The key table to check signatures with outside the lock.
    pub fn keys(&self) -> Arc<KeyTable> {
        self.keys.clone()
    }

    /// Enrolls (or rotates) a host's key. One key belongs to one host: a key enrolled for
    /// another host, or retired, is refused. A rack with no agreement in the policy is
    /// enrolled with a warning (its hosts are contraindicated until the policy names it).
    pub fn enroll(
        &mut self,
        rack: &str,
        host: &str,
        pubkey_pem: &str,
        now_ms: u64,
    ) -> Result<Enrolled, VerifierError> {
        let vk = keys::parse_verifying_key(pubkey_pem).map_err(VerifierError::Key)?;
        let keyid = keys::keyid(&vk);
        let mut warnings = Vec::new();
        if !self.policy.racks.contains_key(rack) {
            warnings.push(format!(
                "rack `{rack}` has no agreement in the policy ([racks.{rack}]): its hosts are contraindicated (no_agreement) until it has one"
            ));
        }
        let existing = self
            .store
            .host_keys()?
            .into_iter()
            .find(|k| k.keyid == keyid);
        let already = match existing {
            Some(k) if k.rack != rack || k.host != host => {
                return Err(VerifierError::Enroll(format!(
                    "key {keyid} is already enrolled for {}/{}: one key belongs to one host (make a key for {rack}/{host})",
                    k.rack, k.host
                )));
            }
            Some(HostKey {
                retired_ms: Some(r),
                ..
            }) => {
                return Err(VerifierError::Enroll(format!(
                    "key {keyid} of {rack}/{host} was retired at {r} ms; a retired key is not enrolled again (make a new key)"
                )));
            }
            Some(_) => true,
            None => {
                self.store.enroll(rack, host, &keyid, pubkey_pem, now_ms)?;
                false
            }
        };
        self.reload_keys()?;
        Ok(Enrolled {
            keyid,
            already,
            warnings,
        })
    }

    /// Retires the host's current key: statements it signs later are `retired_key`, and
    /// the host leaves its rack's standing. History is kept.
    pub fn retire(&mut self, rack: &str, host: &str, now_ms: u64) -> Result<String, VerifierError> {
        let Some(k) = self
            .store
            .host_keys()?
            .into_iter()
            .find(|k| k.rack == rack && k.host == host && k.retired_ms.is_none())
        else {
            return Err(VerifierError::NotEnrolled {
                rack: rack.into(),
                host: host.into(),
            });
        };
        self.store.retire(&k.keyid, now_ms)?;
        self.reload_keys()?;
        Ok(k.keyid)
    }

    fn enrolled(&self, rack: &str, host: &str) -> bool {
        self.keys
            .values()
            .any(|(k, _)| k.rack == rack && k.host == host && k.retired_ms.is_none())
    }

    /// Issues a single-use challenge nonce for an enrolled host.
    pub fn issue_nonce(
        &mut self,
        rack: &str,
        host: &str,
        now_ms: u64,
    ) -> Result<(String, u64), VerifierError> {
        // A host enrolled (with the local CLI) while we serve is seen without a restart:
        // on a miss, the key table is read again, at most once a second.
        if !self.enrolled(rack, host)
            && self.keys_loaded.elapsed() > std::time::Duration::from_secs(1)
        {
            self.reload_keys()?;
        }
        if !self.enrolled(rack, host) {
            return Err(VerifierError::NotEnrolled {
                rack: rack.into(),
                host: host.into(),
            });
        }
        // What an anonymous caller can make us store is bounded: a few outstanding nonces
        // per enrolled host, and nonces nobody used are pruned a TTL after they expired.
        let ttl = self.policy.nonce_ttl.as_millis() as u64;
        self.store.prune_nonces(now_ms.saturating_sub(ttl))?;
        let outstanding = self.store.outstanding_nonces(rack, host, now_ms)?;
        if outstanding >= MAX_OUTSTANDING_NONCES {
            return Err(VerifierError::TooManyNonces {
                rack: rack.into(),
                host: host.into(),
                outstanding,
                retry_after_s: self.policy.nonce_ttl.as_secs().max(1),
            });
        }
        let nonce = rackwarden_attest::nonce::Nonce::random()
            .map_err(|e| VerifierError::Key(e.to_string()))?
            .to_hex();
        let expires = now_ms + self.policy.nonce_ttl.as_millis() as u64;
        self.store
            .insert_nonce(&nonce, rack, host, now_ms, expires)?;
        self.metrics.challenges += 1;
        Ok((nonce, expires))
    }

    /// Checks one envelope and stores it if it is attributable. `now_ms` is the receipt time.
    pub fn ingest(&mut self, raw: &[u8], now_ms: u64) -> Result<IngestOutcome, VerifierError> {
        let prepared = prepare(&self.keys, raw);
        self.commit(prepared, raw, now_ms)
    }

    /// The database half of [`Verifier::ingest`], for a statement [`prepare`]d outside the
    /// lock. A statement signed by an unknown key is retried once after reloading the key
    /// table (keys enrolled while the service runs), at most once a second.
    pub fn commit(
        &mut self,
        prepared: Result<Prepared, String>,
        raw: &[u8],
        now_ms: u64,
    ) -> Result<IngestOutcome, VerifierError> {
        let prepared = match prepared {
            Err(reason)
                if reason == UNKNOWN_KEY
                    && self.keys_loaded.elapsed() > std::time::Duration::from_secs(1) =>
            {
                self.reload_keys()?;
                prepare(&self.keys, raw)
            }
            other => other,
        };
        let out = match prepared {
            Err(reason) => IngestOutcome::rejected(reason),
            Ok(p) => self.judge_and_store(p, now_ms)?,
        };
        match out.status {
            IngestStatus::Accepted => self.metrics.accepted += 1,
            IngestStatus::Duplicate => self.metrics.duplicate += 1,
            IngestStatus::Rejected => self.metrics.rejected += 1,
        }
        if out.status == IngestStatus::Accepted
            && let Some(r) = &out.result
        {
            match r.status {
                Status::Affirming => self.metrics.affirming += 1,
                Status::Warning => self.metrics.warning += 1,
                Status::Contraindicated => self.metrics.contraindicated += 1,
            }
        }
        Ok(out)
    }

    /// What the store knows that the statement is judged against (see [`Context`]).
    fn context(&self, hk: &HostKey, st: &Statement, pae: &str) -> Result<Context, DbError> {
        let p = &st.predicate;
        let same_seq_others = self
            .store
            .by_seq(&hk.rack, &hk.host, p.seq)?
            .iter()
            .filter(|s| s.pae_sha3 != pae)
            .count();
        let preds = if p.seq > 0 {
            self.store.by_seq(&hk.rack, &hk.host, p.seq - 1)?
        } else {
            Vec::new()
        };
        // The byte bound holds against the last statement before this one, over the whole
        // elapsed time, across a gap too: a skipped seq must not skip the budget check.
        let baseline = match preds.iter().find(|s| s.pae_sha3 == p.prev) {
            Some(x) => stored_statement(x),
            None if p.seq > 0 => self
                .store
                .before(&hk.rack, &hk.host, p.seq)?
                .as_ref()
                .and_then(stored_statement),
            None => None,
        };
        let nonce = match &p.challenge {
            Challenge::Unchallenged => NonceLookup::NotNamed,
            Challenge::Nonce { nonce } => match self.store.nonce(nonce)? {
                None => NonceLookup::Unknown,
                Some(n) => NonceLookup::Found(n),
            },
        };
        Ok(Context {
            keyid: hk.keyid.clone(),
            // Read from the store, not the cached key table: a key retired with the CLI
            // while the service runs is retired at once.
            retired_ms: self.store.key_retired_ms(&hk.keyid)?.or(hk.retired_ms),
            enrolled_ms: hk.enrolled_ms,
            same_seq_others,
            predecessors: preds
                .into_iter()
                .map(|s| (s.pae_sha3, s.epoch_end_ms))
                .collect(),
            baseline,
            nonce,
            last_wipe_ms: self.store.last_wipe(&hk.rack, &hk.host)?,
        })
    }

    fn judge_and_store(
        &mut self,
        pr: Prepared,
        now_ms: u64,
    ) -> Result<IngestOutcome, VerifierError> {
        let Prepared {
            hk,
            raw,
            statement: st,
            pae,
        } = pr;
        let p = &st.predicate;
        if let Some(prev) = self.store.by_pae(&hk.rack, &hk.host, &pae)? {
            return Ok(IngestOutcome {
                status: IngestStatus::Duplicate,
                result: serde_json::from_str(&prev.result).ok(),
                reason: None,
            });
        }
        let ctx = self.context(&hk, &st, &pae)?;
        // Whatever comes of it, a nonce a statement named is evidence from now on (never pruned).
        if let Challenge::Nonce { nonce } = &p.challenge {
            self.store.present_nonce(nonce, now_ms)?;
        }
        let Appraisal { result, effects } = appraisal::appraise(&self.policy, &st, &ctx, now_ms);
        if effects.consume_nonce
            && let Challenge::Nonce { nonce } = &p.challenge
        {
            self.store.use_nonce(nonce, now_ms)?;
        }
        self.store.insert_statement(&StoredStatement {
            id: 0,
            rack: hk.rack.clone(),
            host: hk.host.clone(),
            seq: p.seq,
            pae_sha3: pae,
            // Verbatim: exactly the bytes received.
            envelope: String::from_utf8_lossy(&raw).into_owned(),
            received_ms: now_ms,
            epoch_end_ms: p.epoch_end_unix_ms,
            status: result.status.name().into(),
            result: serde_json::to_string(&result).unwrap_or_default(),
            wipe_ms: effects.wipe_counts.then_some(p.epoch_end_unix_ms),
        })?;
        Ok(IngestOutcome {
            status: IngestStatus::Accepted,
            result: Some(result),
            reason: None,
        })
    }
}
