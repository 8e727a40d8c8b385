//! Where a statement is judged: identity and signature, chain, freshness (where a nonce is
//! checked), and policy. The result follows the shape of an IETF EAR attestation result:
//! an overall status, a per-aspect trustworthiness vector, the policy id, and the findings.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use ed25519_dalek::VerifyingKey;
use rackwarden_attest::{
    dsse::{self, Envelope, INTOTO_PAYLOAD_TYPE},
    evidence::{LimiterReport, WipeReport},
    keys,
    statement::{Challenge, Statement},
};
use serde::{Deserialize, Serialize};

use crate::{
    config::Policy,
    store::{DbError, HostKey, NonceRecord, Store, StoredStatement},
};

/// Overall and per-aspect status, ordered from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Affirming,
    Warning,
    Contraindicated,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub aspect: String,
    pub code: String,
    pub severity: Status,
    pub detail: String,
}

/// The verdict on one statement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttestationResult {
    pub status: Status,
    pub policy_id: String,
    pub rack: String,
    pub host: String,
    pub seq: u64,
    pub trustworthiness: BTreeMap<String, Status>,
    pub findings: Vec<Finding>,
}

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

const ASPECTS: [&str; 7] = [
    "identity",
    "chain",
    "freshness",
    "limiter",
    "wipe",
    "images",
    "budget",
];

struct Judge<'a> {
    policy: &'a Policy,
    findings: Vec<Finding>,
}

impl Judge<'_> {
    fn add(&mut self, aspect: &str, code: &str, severity: Status, detail: impl Into<String>) {
        self.findings.push(Finding {
            aspect: aspect.into(),
            code: code.into(),
            severity,
            detail: detail.into(),
        });
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

fn counters_of(s: &Statement, dir: &str) -> Option<(u64, u64, u64)> {
    // (passed bytes, cap rate, burst)
    let LimiterReport::Present(e) = &s.predicate.limiter else {
        return None;
    };
    let c = e.counters.iter().find(|c| c.direction.name() == dir)?;
    let cap = e.caps.iter().find(|c| c.direction.name() == dir)?;
    Some((
        c.counters.passed_bytes,
        cap.rate_bytes_per_s,
        cap.burst_bytes,
    ))
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
        let mut j = Judge {
            policy: &self.policy,
            findings: Vec::new(),
        };
        // Read from the store, not the cached key table: a key retired with the CLI while
        // the service runs is retired at once.
        let retired_ms = self.store.key_retired_ms(&hk.keyid)?.or(hk.retired_ms);
        if let Some(r) = retired_ms
            && p.epoch_end_unix_ms > r
        {
            j.add(
                "identity",
                "retired_key",
                Status::Contraindicated,
                format!("key {} was retired at {r} ms", hk.keyid),
            );
        }
        check_pins(&mut j, &st);
        let preds = if p.seq > 0 {
            self.store.by_seq(&hk.rack, &hk.host, p.seq - 1)?
        } else {
            Vec::new()
        };
        check_chain(&mut j, &self.store, &hk, &st, &pae, &preds)?;
        check_freshness(&mut j, &self.store, &hk, &st, now_ms)?;
        let prev = preds
            .iter()
            .find(|s| s.pae_sha3 == p.prev)
            .and_then(stored_statement);
        // The byte bound holds against the last statement before this one, over the whole
        // elapsed time, across a gap too: a skipped seq must not skip the budget check.
        let baseline = match prev {
            Some(x) => Some(x),
            None if p.seq > 0 => self
                .store
                .before(&hk.rack, &hk.host, p.seq)?
                .as_ref()
                .and_then(stored_statement),
            None => None,
        };
        check_limiter(&mut j, &st, baseline.as_ref());
        let wipe_ok = check_wipe(&mut j, &self.store, &hk, &st)?;
        check_images(&mut j, &st);
        check_incidents(&mut j, &st);
        let result = j.result(&st);
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
            status: serde_json::to_value(result.status)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default(),
            result: serde_json::to_string(&result).unwrap_or_default(),
            wipe_ms: wipe_ok.then_some(p.epoch_end_unix_ms),
        })?;
        Ok(IngestOutcome {
            status: IngestStatus::Accepted,
            result: Some(result),
            reason: None,
        })
    }
}

impl Judge<'_> {
    fn result(self, st: &Statement) -> AttestationResult {
        let mut tw: BTreeMap<String, Status> = ASPECTS
            .iter()
            .map(|a| (a.to_string(), Status::Affirming))
            .collect();
        for f in &self.findings {
            let e = tw.entry(f.aspect.clone()).or_insert(Status::Affirming);
            *e = (*e).max(f.severity);
        }
        AttestationResult {
            status: tw.values().copied().max().unwrap_or(Status::Affirming),
            policy_id: self.policy.id.clone(),
            rack: st.predicate.rack_id.clone(),
            host: st.predicate.host_id.clone(),
            seq: st.predicate.seq,
            trustworthiness: tw,
            findings: self.findings,
        }
    }
}

fn check_chain(
    j: &mut Judge,
    store: &Store,
    hk: &HostKey,
    st: &Statement,
    pae: &str,
    preds: &[StoredStatement],
) -> Result<(), DbError> {
    let p = &st.predicate;
    let same_seq = store.by_seq(&hk.rack, &hk.host, p.seq)?;
    if same_seq.iter().any(|s| s.pae_sha3 != pae) {
        j.add(
            "chain",
            "fork",
            Status::Contraindicated,
            format!("another statement with seq {} is already stored", p.seq),
        );
    }
    if p.seq > 0 {
        if preds.is_empty() {
            j.add(
                "chain",
                "gap",
                Status::Warning,
                format!("seq {} has not arrived (yet)", p.seq - 1),
            );
        } else if !preds.iter().any(|s| s.pae_sha3 == p.prev) {
            j.add(
                "chain",
                "broken_prev",
                Status::Contraindicated,
                format!(
                    "prev {} is not the digest of the stored seq {}",
                    p.prev,
                    p.seq - 1
                ),
            );
        } else if let Some(pred) = preds.iter().find(|s| s.pae_sha3 == p.prev)
            && p.epoch_start_unix_ms < pred.epoch_end_ms
        {
            j.add(
                "chain",
                "time_backwards",
                Status::Contraindicated,
                format!(
                    "epoch starts at {} before the previous one ended at {}",
                    p.epoch_start_unix_ms, pred.epoch_end_ms
                ),
            );
        }
    }
    Ok(())
}

/// Where a nonce is checked: issued by us, for this host, not used before, not expired.
fn check_freshness(
    j: &mut Judge,
    store: &Store,
    hk: &HostKey,
    st: &Statement,
    now_ms: u64,
) -> Result<(), DbError> {
    // Whatever comes of it, a nonce a statement named is evidence from now on (never pruned).
    if let Challenge::Nonce { nonce } = &st.predicate.challenge {
        store.present_nonce(nonce, now_ms)?;
    }
    match &st.predicate.challenge {
        Challenge::Unchallenged => j.add(
            "freshness",
            "unchallenged",
            Status::Warning,
            "the statement answers no challenge",
        ),
        Challenge::Nonce { nonce } => match store.nonce(nonce)? {
            None => j.add(
                "freshness",
                "nonce_unknown",
                Status::Contraindicated,
                "nonce was not issued by this verifier",
            ),
            Some(n) if n.rack != hk.rack || n.host != hk.host => j.add(
                "freshness",
                "nonce_other_host",
                Status::Contraindicated,
                format!("nonce was issued for {}/{}", n.rack, n.host),
            ),
            Some(NonceRecord {
                used_ms: Some(used),
                ..
            }) => j.add(
                "freshness",
                "nonce_reused",
                Status::Contraindicated,
                format!("nonce already used at {used} ms"),
            ),
            Some(n) if now_ms > n.expires_ms => j.add(
                "freshness",
                "nonce_expired",
                Status::Contraindicated,
                format!(
                    "nonce expired at {} ms, received at {now_ms} ms",
                    n.expires_ms
                ),
            ),
            Some(_) => store.use_nonce(nonce, now_ms)?,
        },
    }
    Ok(())
}

fn check_limiter(j: &mut Judge, st: &Statement, prev: Option<&Statement>) {
    let p = &st.predicate;
    let e = match &p.limiter {
        LimiterReport::Absent { finding } => {
            j.add(
                "limiter",
                "limiter_absent",
                Status::Contraindicated,
                finding.clone(),
            );
            return;
        }
        LimiterReport::Present(e) => e,
    };
    for a in &e.attach_points {
        if !a.attached {
            j.add(
                "limiter",
                "not_attached",
                Status::Contraindicated,
                format!(
                    "{} {} not enforcing at epoch end",
                    a.interface,
                    a.direction.name()
                ),
            );
        } else if !a.foreign_ahead.is_empty() {
            j.add(
                "limiter",
                "foreign_ahead",
                Status::Contraindicated,
                format!(
                    "programs {:?} run before ours on {} {}",
                    a.foreign_ahead,
                    a.interface,
                    a.direction.name()
                ),
            );
        }
    }
    match &e.bypass {
        None => j.add(
            "limiter",
            "bypass_unreported",
            Status::Warning,
            "the statement does not report the bypass surface",
        ),
        Some(b) => {
            if b.refusal.state != "present" {
                j.add(
                    "limiter",
                    "bypass_refusal_absent",
                    Status::Warning,
                    b.refusal.detail.clone(),
                );
            }
            for (what, v) in [
                ("rdma_devices", &b.rdma_devices),
                ("vfio_devices", &b.vfio_devices),
                ("uncapped_interfaces", &b.uncapped_interfaces),
            ] {
                if !v.is_empty() {
                    j.add(
                        "limiter",
                        what,
                        Status::Warning,
                        format!("{what}: {}", v.join(", ")),
                    );
                }
            }
            if b.af_xdp_sockets.unwrap_or(0) > 0 {
                j.add(
                    "limiter",
                    "af_xdp_sockets",
                    Status::Warning,
                    format!("{:?} AF_XDP sockets open", b.af_xdp_sockets),
                );
            }
        }
    }
    for g in &e.gaps {
        let sev = if g.restored {
            Status::Warning
        } else {
            Status::Contraindicated
        };
        j.add(
            "limiter",
            "enforcement_gap",
            sev,
            format!("{:?} at {} ms: {}", g.kind, g.detected_at_ms, g.detail),
        );
    }
    match j.policy.racks.get(&p.rack_id) {
        None => j.add(
            "budget",
            "no_agreement",
            Status::Contraindicated,
            format!("no agreed cap for rack `{}`", p.rack_id),
        ),
        Some(agreed) => {
            for c in &e.caps {
                let limit = if c.direction.name() == "egress" {
                    agreed.egress_bytes_per_s
                } else {
                    agreed.ingress_bytes_per_s
                };
                if c.burst_bytes > agreed.max_burst_bytes {
                    j.add(
                        "budget",
                        "burst_above_agreement",
                        Status::Contraindicated,
                        format!(
                            "{} burst {} B above the agreed {} B",
                            c.direction.name(),
                            c.burst_bytes,
                            agreed.max_burst_bytes
                        ),
                    );
                }
                if c.rate_bytes_per_s > limit {
                    j.add(
                        "budget",
                        "cap_above_agreement",
                        Status::Contraindicated,
                        format!(
                            "{} cap {} B/s above the agreed {} B/s",
                            c.direction.name(),
                            c.rate_bytes_per_s,
                            limit
                        ),
                    );
                }
            }
        }
    }
    let Some(prev) = prev else { return };
    let elapsed_s = p
        .epoch_end_unix_ms
        .saturating_sub(prev.predicate.epoch_end_unix_ms) as f64
        / 1000.0;
    for dir in ["egress", "ingress"] {
        let (Some((now, rate, burst)), Some((before, prate, _))) =
            (counters_of(st, dir), counters_of(prev, dir))
        else {
            continue;
        };
        let Some(delta) = now.checked_sub(before) else {
            j.add(
                "limiter",
                "counters_reset",
                Status::Contraindicated,
                format!("{dir} passed bytes went from {before} to {now}"),
            );
            continue;
        };
        // The larger of the two caps in force bounds the epoch (a cap may change within it).
        let bound = rate.max(prate) as f64 * elapsed_s + burst as f64;
        if delta as f64 > bound {
            j.add(
                "budget",
                "counters_above_cap",
                Status::Contraindicated,
                format!("{dir}: {delta} B passed in {elapsed_s:.3} s, bound {bound:.0} B"),
            );
        }
        if dir == "ingress" {
            let allowed = j.policy.max_epoch_fraction * j.policy.trainable_state_bytes as f64;
            if delta as f64 > allowed {
                j.add("budget", "state_bound_exceeded", Status::Contraindicated, format!("{delta} B received in one epoch, more than {allowed:.0} B ({} of the trainable state)", j.policy.max_epoch_fraction));
            }
        }
    }
}

/// Returns whether the statement carries a complete wipe within policy.
fn check_wipe(j: &mut Judge, store: &Store, hk: &HostKey, st: &Statement) -> Result<bool, DbError> {
    let p = &st.predicate;
    let max = j.policy.max_wipe_interval.as_millis() as u64;
    let ok = match &p.wipe {
        None => {
            j.add("wipe", "no_wipe", Status::Warning, "no wipe in this epoch");
            false
        }
        Some(w) => judge_wipe(j, w, &p.challenge),
    };
    // Only a wipe keyed by a nonce this verifier issued, to this host, unused and unexpired,
    // resets the wipe clock: a nonce the host chose itself proves nothing about freshness.
    let bound_to_ours = matches!(p.challenge, Challenge::Nonce { .. })
        && !j
            .findings
            .iter()
            .any(|f| f.aspect == "freshness" && f.severity == Status::Contraindicated);
    if ok && !bound_to_ours {
        j.add(
            "wipe",
            "wipe_not_counted",
            Status::Warning,
            "the wipe is not keyed by a nonce this verifier issued: it does not reset the wipe clock",
        );
    }
    let ok = ok && bound_to_ours;
    if !ok {
        let since = store
            .last_wipe(&hk.rack, &hk.host)?
            .unwrap_or(hk.enrolled_ms);
        if p.epoch_end_unix_ms.saturating_sub(since) > max {
            j.add(
                "wipe",
                "wipe_overdue",
                Status::Contraindicated,
                format!(
                    "last complete wipe at {since} ms, more than {} s before this epoch's end",
                    max / 1000
                ),
            );
        }
    }
    Ok(ok)
}

fn judge_wipe(j: &mut Judge, w: &WipeReport, challenge: &Challenge) -> bool {
    let mut ok = true;
    if let Challenge::Nonce { nonce } = challenge
        && &w.nonce != nonce
    {
        j.add(
            "wipe",
            "wipe_not_bound",
            Status::Contraindicated,
            "the wipe's nonce is not this epoch's challenge",
        );
        ok = false;
    }
    if w.interrupted {
        j.add(
            "wipe",
            "wipe_interrupted",
            Status::Contraindicated,
            "the wipe was interrupted",
        );
        ok = false;
    }
    if w.devices.is_empty() {
        j.add(
            "wipe",
            "wipe_empty",
            Status::Contraindicated,
            "the wipe report names no device",
        );
        ok = false;
    }
    for backend in &j.policy.required_wipe_backends {
        let covered = w
            .devices
            .iter()
            .any(|d| &d.backend == backend && d.status == "complete" && d.bytes_verified > 0);
        if !covered {
            let seen: Vec<String> = w
                .devices
                .iter()
                .map(|d| format!("{} {}", d.backend, d.status))
                .collect();
            j.add(
                "wipe",
                "wipe_device_missing",
                Status::Contraindicated,
                format!(
                    "the policy requires a complete `{backend}` wipe; the report has [{}]",
                    seen.join(", ")
                ),
            );
            ok = false;
        }
    }
    for d in &w.devices {
        // What can be recomputed is: a report that does not add up counts for nothing, and
        // residue is judged on total - verified whatever the report claims.
        let recomputed = d.bytes_total.saturating_sub(d.bytes_verified);
        if d.bytes_verified > d.bytes_filled
            || d.bytes_filled > d.bytes_total
            || d.residue_bytes != recomputed
        {
            j.add(
                "wipe",
                "wipe_inconsistent",
                Status::Contraindicated,
                format!(
                    "{}: total {} B, filled {} B, verified {} B, residue claimed {} B (total - verified = {recomputed} B)",
                    d.device, d.bytes_total, d.bytes_filled, d.bytes_verified, d.residue_bytes
                ),
            );
            ok = false;
        }
        // A failed device says nothing of its memory (a GPU whose driver would not start
        // reports no size at all), so its residue cannot be judged: it was not wiped.
        if d.status == "failed" {
            j.add(
                "wipe",
                "wipe_failed",
                Status::Contraindicated,
                format!(
                    "{}: the wipe failed: {}",
                    d.device,
                    d.detail.as_deref().unwrap_or("no detail")
                ),
            );
            ok = false;
        }
        if d.mismatches > 0 {
            j.add(
                "wipe",
                "wipe_mismatch",
                Status::Contraindicated,
                format!("{}: {} mismatching blocks", d.device, d.mismatches),
            );
            ok = false;
        }
        let max = match d.backend.as_str() {
            "host" => Some(j.policy.max_residue_host),
            "gpu" => Some(j.policy.max_residue_gpu),
            _ => None,
        };
        let residue = d.residue_bytes.max(recomputed);
        if let Some(max) = max
            && residue > max
        {
            j.add(
                "wipe",
                "residue_above_max",
                Status::Contraindicated,
                format!(
                    "{}: residue {} B above the allowed {} B ({})",
                    d.device, residue, max, d.status
                ),
            );
            ok = false;
        }
    }
    ok
}

/// The daemon builds and eBPF programs the policy accepts, if it pins them: a statement
/// from another daemon binary, or naming another program, is contraindicated.
fn check_pins(j: &mut Judge, st: &Statement) {
    let p = &st.predicate;
    if let Some(ok) = &j.policy.accepted_daemon_digests
        && !ok.contains(&p.producer.binary_sha3_256)
    {
        j.add(
            "identity",
            "daemon_not_accepted",
            Status::Contraindicated,
            format!(
                "{} {} (sha3-256 {}) is not a daemon build the policy accepts",
                p.producer.name, p.producer.version, p.producer.binary_sha3_256
            ),
        );
    }
    if let (Some(min), LimiterReport::Present(e)) = (j.policy.min_self_protection, &p.limiter) {
        match &e.self_protection {
            None => j.add(
                "limiter",
                "self_protection_unreported",
                Status::Contraindicated,
                format!(
                    "the policy requires self-protection of at least `{}`; the statement reports none",
                    min.name()
                ),
            ),
            Some(sp) => {
                for (path, level) in [
                    ("map_writes", sp.map_writes),
                    ("detach", sp.detach),
                    ("foreign_ahead", sp.foreign_ahead),
                    ("program_writes", sp.program_writes),
                ] {
                    if level.rank() > min.rank() {
                        j.add(
                            "limiter",
                            "self_protection_below_policy",
                            Status::Contraindicated,
                            format!(
                                "{path} is `{}` on this host; the policy requires `{}` ({})",
                                level.name(),
                                min.name(),
                                match &sp.lsm_guard {
                                    rackwarden_attest::evidence::LsmGuard::Unavailable {
                                        reason,
                                    } => format!("no BPF LSM guard: {reason}"),
                                    rackwarden_attest::evidence::LsmGuard::Sealed { .. } => {
                                        "the BPF LSM guard is sealed".into()
                                    }
                                    rackwarden_attest::evidence::LsmGuard::NotReported => {
                                        "a daemon that predates the guard".into()
                                    }
                                }
                            ),
                        );
                    }
                }
            }
        }
    }
    if let (Some(ok), LimiterReport::Present(e)) = (&j.policy.accepted_program_tags, &p.limiter) {
        for prog in e.programs.iter().filter(|g| !ok.contains(&g.tag)) {
            j.add(
                "limiter",
                "program_not_accepted",
                Status::Contraindicated,
                format!(
                    "program {} #{} has tag {}, not one the policy accepts",
                    prog.name, prog.id, prog.tag
                ),
            );
        }
    }
}

/// What the host disclosed about its own trail: damage to its log, and epochs cut short
/// (a crash mid-wipe leaves that epoch unproven; the statement carrying it starts over).
fn check_incidents(j: &mut Judge, st: &Statement) {
    use rackwarden_attest::evidence::Incident;
    for i in &st.predicate.incidents {
        match i {
            Incident::TornLogTail { offset, length, .. }
            | Incident::CorruptLogLine { offset, length, .. } => j.add(
                "chain",
                "log_damage_disclosed",
                Status::Warning,
                format!("the host's log has {length} damaged bytes at offset {offset} (disclosed)"),
            ),
            Incident::EpochInterrupted {
                seq,
                state,
                started_unix_ms,
                ..
            } => j.add(
                "wipe",
                "epoch_interrupted",
                Status::Warning,
                format!(
                    "epoch {seq} (started at {started_unix_ms} ms) was interrupted while {state}; this epoch redid it"
                ),
            ),
        }
    }
}

fn check_images(j: &mut Judge, st: &Statement) {
    if let Some(r) = &st.predicate.images {
        for i in r.images.iter().filter(|i| !i.ok) {
            j.add(
                "images",
                "image_refused",
                Status::Contraindicated,
                format!("{}: {}", i.name, i.finding.clone().unwrap_or_default()),
            );
        }
    }
    if let Some(allowed) = &j.policy.allowed_images {
        for s in &st.subject {
            let d = s
                .digest
                .get(rackwarden_attest::statement::IMAGE_DIGEST)
                .cloned()
                .unwrap_or_default();
            if !allowed.contains(&d) {
                j.add(
                    "images",
                    "image_not_in_manifest",
                    Status::Contraindicated,
                    format!("{} ({d}) is not in the signed manifest", s.name),
                );
            }
        }
    }
}
