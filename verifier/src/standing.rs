//! The read model: per-rack and per-host standing, read from the store. The API's rack
//! endpoints, the index page and the rack page all read through here. A host that has not
//! reported within the maximum wipe interval is contraindicated with no statement arriving:
//! a missing epoch is evidence.

use rackwarden_attest::evidence::LimiterReport;
use serde::Serialize;

use crate::{
    appraisal::{AttestationResult, Status, state_bound},
    config::{Policy, RackAgreement},
    store::{Clearance, DbError, StandingRow, Store, StoredStatement},
};

#[derive(Debug, Clone, Serialize)]
pub struct HostStanding {
    pub host: String,
    pub status: Status,
    pub last_seq: Option<u64>,
    pub last_epoch_end_ms: Option<u64>,
    pub last_result: Option<AttestationResult>,
    pub findings: Vec<String>,
    /// Current egress cap reported by the host (for the rack sum).
    pub egress_cap_bytes_per_s: Option<u64>,
    pub ingress_cap_bytes_per_s: Option<u64>,
    /// The operator's latest clearing of contraindicated statements, if any.
    pub clearance: Option<Clearance>,
    /// Every clearing of this host, oldest first, with who, when, why and what it cleared.
    pub clearances: Vec<Clearance>,
    /// The first contraindicated statement not cleared, which holds the host (the page
    /// explains its findings); the JSON carries it as a line in `findings`.
    #[serde(skip)]
    pub first_uncleared: Option<UnclearedStatement>,
}

/// A stored contraindicated statement no operator has cleared.
#[derive(Debug, Clone)]
pub struct UnclearedStatement {
    pub id: i64,
    pub seq: u64,
    pub result: Option<AttestationResult>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RackStanding {
    pub rack: String,
    pub status: Status,
    pub policy_id: String,
    pub hosts: Vec<HostStanding>,
    pub findings: Vec<String>,
    /// The most state the rack can hold from one wipe to the next, from its hosts' last
    /// statements: the verdict and the page read this one value.
    pub state_bound: state_bound::StateBound,
}

impl RackStanding {
    /// Everything behind the rack's status, one line each: the rack's own findings, then
    /// each host's standing (silence, gaps, uncleared statements) and its last statement's
    /// findings, named by host (what `GET /v1/racks` lists).
    pub fn reasons(&self) -> Vec<String> {
        let mut lines = self.findings.clone();
        for h in &self.hosts {
            lines.extend(h.findings.iter().map(|f| format!("{}: {f}", h.host)));
            if let Some(r) = &h.last_result {
                lines.extend(r.findings.iter().map(|f| {
                    format!(
                        "{} seq {}: {} {}: {}",
                        h.host,
                        r.seq,
                        f.severity.name(),
                        f.code.name(),
                        f.detail
                    )
                }));
            }
        }
        lines
    }
}

/// An enrolled key (current or retired) with its host's last statement (`hosts` command).
#[derive(Debug, Clone, Serialize)]
pub struct EnrolledHost {
    pub rack: String,
    pub host: String,
    pub keyid: String,
    pub enrolled_ms: u64,
    pub retired_ms: Option<u64>,
    pub last_seq: Option<u64>,
    pub last_status: Option<String>,
    /// `current`, `retired` (by an operator), `rotated` (the host rotated to this key at
    /// `from_seq`) or `rotated away` (after `retired_after_seq`).
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retired_after_seq: Option<u64>,
}

/// Every rack with an agreement or an enrolled host. A store that cannot be read is an
/// error, never an empty list (which would read as racks with nothing wrong).
pub fn racks(store: &Store, policy: &Policy) -> Result<Vec<String>, DbError> {
    let mut r: Vec<String> = host_list(store)?.into_iter().map(|(r, _, _)| r).collect();
    r.extend(policy.racks.keys().cloned());
    r.sort();
    r.dedup();
    Ok(r)
}

/// Every enrolled key, in enrollment order, with its host's last statement.
pub fn hosts(store: &Store) -> Result<Vec<EnrolledHost>, DbError> {
    let mut rows = Vec::new();
    for k in store.host_keys()? {
        let last = store.history(&k.rack, &k.host, 1)?.into_iter().next();
        rows.push(EnrolledHost {
            last_seq: last.as_ref().map(|s| s.seq),
            last_status: last.map(|s| s.status),
            rack: k.rack,
            host: k.host,
            keyid: k.keyid,
            enrolled_ms: k.enrolled_ms,
            retired_ms: k.retired_ms,
            state: match (k.retired_ms, k.retired_after_seq, k.from_seq) {
                (Some(_), Some(_), _) => "rotated away",
                (Some(_), None, _) => "retired",
                (None, _, Some(_)) => "rotated",
                (None, _, None) => "current",
            },
            from_seq: k.from_seq,
            retired_after_seq: k.retired_after_seq,
        });
    }
    Ok(rows)
}

/// (rack, host, enrolled_ms) of current (non-retired) keys; a key the host rotated to
/// counts from the host's first enrollment (a rotation does not restart its clocks).
fn host_list(store: &Store) -> Result<Vec<(String, String, u64)>, DbError> {
    let keys = store.host_keys()?;
    let first = |rack: &str, host: &str| {
        keys.iter()
            .filter(|k| k.rack == rack && k.host == host)
            .map(|k| k.enrolled_ms)
            .min()
    };
    let mut v: Vec<(String, String, u64)> = keys
        .iter()
        .filter(|k| k.retired_ms.is_none())
        .map(|k| {
            let since = match k.from_seq {
                Some(_) => first(&k.rack, &k.host).unwrap_or(k.enrolled_ms),
                None => k.enrolled_ms,
            };
            (k.rack.clone(), k.host.clone(), since)
        })
        .collect();
    v.sort();
    v.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    Ok(v)
}

/// The rack's standing: each enrolled host's, then the rack's own findings (no agreement,
/// or the hosts' caps summing above it).
pub fn rack(
    store: &Store,
    policy: &Policy,
    rack: &str,
    now_ms: u64,
) -> Result<RackStanding, DbError> {
    let mut hosts = Vec::new();
    for (_, host, enrolled) in host_list(store)?.into_iter().filter(|(r, _, _)| r == rack) {
        hosts.push(host_standing(store, policy, rack, host, enrolled, now_ms)?);
    }
    let mut findings = Vec::new();
    let mut status = hosts
        .iter()
        .map(|h| h.status)
        .max()
        .unwrap_or(Status::Warning);
    if hosts.is_empty() {
        findings.push("no enrolled hosts".into());
    }
    match policy.racks.get(rack) {
        None => {
            status = Status::Contraindicated;
            findings.push("no agreed cap for this rack in the policy".into());
        }
        Some(a) => {
            let over = caps_above_agreement(a, &hosts);
            if !over.is_empty() {
                status = Status::Contraindicated;
                findings.extend(over);
            }
        }
    }
    let state_bound = state_bound_of(store, policy, rack, hosts.iter().map(|h| h.host.as_str()))?;
    if let Some(f) = state_bound.finding() {
        status = Status::Contraindicated;
        findings.push(f);
    }
    Ok(RackStanding {
        rack: rack.into(),
        status,
        policy_id: policy.id.clone(),
        hosts,
        findings,
        state_bound,
    })
}

/// The rack's state bound from the last stored statement of each of `hosts` (a host with no
/// statement adds nothing: its silence is judged by its standing).
pub fn state_bound_of<'a>(
    store: &Store,
    policy: &Policy,
    rack: &str,
    hosts: impl Iterator<Item = &'a str>,
) -> Result<state_bound::StateBound, DbError> {
    let mut terms = Vec::new();
    for host in hosts {
        let last = store.history(rack, host, 1)?;
        if let Some(st) = last.first().and_then(StoredStatement::statement) {
            terms.push(state_bound::host_terms(policy, host, &st));
        }
    }
    Ok(state_bound::rack(policy, terms))
}

/// Both directions: the rack's agreement bounds what all its hosts enforce together.
fn caps_above_agreement(a: &RackAgreement, hosts: &[HostStanding]) -> Vec<String> {
    let sum = |cap: fn(&HostStanding) -> Option<u64>| hosts.iter().filter_map(cap).sum::<u64>();
    [
        (
            "egress",
            a.egress_bytes_per_s,
            sum(|h| h.egress_cap_bytes_per_s),
        ),
        (
            "ingress",
            a.ingress_bytes_per_s,
            sum(|h| h.ingress_cap_bytes_per_s),
        ),
    ]
    .into_iter()
    .filter(|(_, agreed, sum)| sum > agreed)
    .map(|(dir, agreed, sum)| {
        format!(
            "hosts' {dir} caps sum to {sum} B/s ({}), above the agreed {}",
            rackwarden_attest::units::fmt_rate(sum as f64),
            rackwarden_attest::units::fmt_rate(agreed as f64)
        )
    })
    .collect()
}

/// One host's standing: its last statement, silence, gaps, and contraindicated statements
/// no operator has cleared.
fn host_standing(
    store: &Store,
    policy: &Policy,
    rack: &str,
    host: String,
    enrolled_ms: u64,
    now_ms: u64,
) -> Result<HostStanding, DbError> {
    let max = policy.max_wipe_interval.as_millis() as u64;
    let mut findings = Vec::new();
    let last = store.history(rack, &host, 1)?.into_iter().next();
    let last_result = last.as_ref().and_then(StoredStatement::result);
    let mut status = last_result
        .as_ref()
        .map(|r| r.status)
        .unwrap_or(Status::Warning);
    // Silence counts from what the verifier saw: a claimed end later than the statement's
    // receipt (a clock ahead, or a lie) must not hide it.
    let since = last
        .as_ref()
        .map(|s| s.epoch_end_ms.min(s.received_ms))
        .unwrap_or(enrolled_ms);
    if now_ms.saturating_sub(since) > max {
        status = Status::Contraindicated;
        findings.push(format!(
            "silent: no epoch since {} (more than {})",
            rackwarden_attest::units::fmt_unix_ms(since),
            rackwarden_attest::units::fmt_duration(policy.max_wipe_interval)
        ));
    } else if last.is_none() {
        findings.push("no statement yet".into());
    }
    // Gaps and uncleared statements are the whole history's: read from the host's standing
    // row, kept up to date as statements and clearances are stored.
    let row = store.standing_row(rack, &host)?;
    if let Some(top) = row.top_seq
        && row.seqs_stored != top + 1
    {
        status = status.max(Status::Warning);
        findings.push(format!("gap: {} of seqs 0..={top} stored", row.seqs_stored));
    }
    let clearances = store.clearances(Some(rack), Some(&host))?;
    let clearance = clearances.last().cloned();
    let (first_uncleared, uncleared_finding) = uncleared(store, &row)?;
    if let Some(f) = uncleared_finding {
        status = Status::Contraindicated;
        findings.push(f);
    }
    let (egress_cap, ingress_cap) =
        last.as_ref()
            .and_then(StoredStatement::statement)
            .map_or((None, None), |st| match &st.predicate.limiter {
                LimiterReport::Present(e) => {
                    let cap = |dir: &str| {
                        e.caps
                            .iter()
                            .find(|c| c.direction.name() == dir)
                            .map(|c| c.rate_bytes_per_s)
                    };
                    (cap("egress"), cap("ingress"))
                }
                _ => (None, None),
            });
    Ok(HostStanding {
        host,
        status,
        last_seq: last.as_ref().map(|s| s.seq),
        last_epoch_end_ms: last.as_ref().map(|s| s.epoch_end_ms),
        last_result,
        findings,
        egress_cap_bytes_per_s: egress_cap,
        ingress_cap_bytes_per_s: ingress_cap,
        clearance,
        clearances,
        first_uncleared,
    })
}

/// Standing is the whole history, not the latest statement: a contraindicated statement
/// anywhere (a fork at an old seq, or one with more built on it) holds the host
/// contraindicated until an operator clears it (`rackwarden-verifier clear`, recorded).
/// The first such statement, and the finding line that says so.
fn uncleared(
    store: &Store,
    row: &StandingRow,
) -> Result<(Option<UnclearedStatement>, Option<String>), DbError> {
    if row.uncleared == 0 {
        return Ok((None, None));
    }
    let first = match row.first_uncleared_id {
        Some(id) => store.seq_and_result(id)?.map(|found| (id, found)),
        None => None,
    };
    let Some((id, (seq, result))) = first else {
        // The row does not name a stored statement: the host stays held (never read as
        // cleared), and recheck reports the row.
        return Ok((
            None,
            Some(format!(
                "{} contraindicated statement(s) not cleared, the first not found; `rackwarden-verifier recheck` re-derives the host's standing",
                row.uncleared
            )),
        ));
    };
    let first = UnclearedStatement {
        id,
        seq,
        result: serde_json::from_str(&result).ok(),
    };
    let codes: Vec<&str> = first
        .result
        .iter()
        .flat_map(|r| &r.findings)
        .filter(|f| f.severity == Status::Contraindicated)
        .map(|f| f.code.name())
        .collect();
    let line = format!(
        "{} contraindicated statement(s) not cleared, the first at seq {} ({}); an operator clears them with `rackwarden-verifier clear`",
        row.uncleared,
        first.seq,
        codes.join(", ")
    );
    Ok((Some(first), Some(line)))
}

#[cfg(test)]
mod tests {
    use crate::{
        service::Verifier,
        store::{Store, StoredStatement},
    };

    const CONFIG: &str = "listen = \"127.0.0.1:7700\"\ninsecure_http = true\ndatabase = \"/tmp/unused.sqlite\"\n\n[policy]\nmin_root_of_trust = \"none\"\nid = \"p\"\nnonce_ttl = \"10 min\"\nmax_wipe_interval = \"15 min\"\nmax_residue_host = \"4 GiB\"\nmax_residue_gpu = \"1 GiB\"\ntrainable_state = \"10 TB\"\nmax_epoch_fraction = 0.01\n\n[racks.r1]\negress = \"10 MB/s\"\ningress = \"10 MB/s\"\n";

    fn store_verdict(v: &Verifier, seq: u64, status: &str) {
        let result = serde_json::json!({
            "status": status, "policy_id": "p", "rack": "r1", "host": "h1", "seq": seq,
            "trustworthiness": {},
            "findings": [{"aspect": "freshness", "code": "nonce_unknown", "severity": status, "detail": "test"}],
        });
        v.store
            .insert_statement(&StoredStatement {
                id: 0,
                rack: "r1".into(),
                host: "h1".into(),
                seq,
                pae_sha3: format!("pae-{seq}"),
                envelope: "{}".into(),
                received_ms: 1_000 + seq,
                epoch_end_ms: 1_000 + seq,
                status: status.into(),
                result: result.to_string(),
                wipe_ms: None,
            })
            .unwrap();
    }

    /// The host's findings, read from its standing row, say what its whole history says:
    /// the gap, and how many contraindicated statements no clearance covers and the first
    /// of them, after statements, a clearance and a restart.
    #[test]
    fn the_findings_from_the_row_are_the_whole_historys() {
        let cfg =
            crate::config::VerifierConfig::parse(std::path::Path::new("v.toml"), CONFIG).unwrap();
        let db = crate::store::testing::database("standing_findings").unwrap();
        let mut v = Verifier::new(Store::connect(&db).unwrap(), cfg.policy.clone()).unwrap();
        let key = rackwarden_attest::keys::generate();
        let pem = rackwarden_attest::keys::public_pem(&key.verifying_key());
        v.enroll("r1", "h1", &pem, 0).unwrap();
        store_verdict(&v, 0, "warning");
        store_verdict(&v, 1, "contraindicated");
        store_verdict(&v, 3, "contraindicated");
        let findings = |v: &Verifier| {
            let rack = v.rack_standing("r1", 2_000).unwrap();
            let h = &rack.hosts[0];
            // What the whole history gives, read the way it was before the row.
            let seqs = v.store.seqs("r1", "h1").unwrap();
            let after = h.clearance.as_ref().map_or(0, |c| c.up_to_id);
            let bad = v.store.contraindicated_after("r1", "h1", after).unwrap();
            assert_eq!(
                h.first_uncleared.as_ref().map(|f| f.id),
                bad.first().map(|b| b.id)
            );
            assert_eq!(
                h.first_uncleared.as_ref().map(|f| f.seq),
                bad.first().map(|b| b.seq)
            );
            let mut want = Vec::new();
            if let Some(top) = seqs.last() {
                want.push(format!("gap: {} of seqs 0..={top} stored", seqs.len()));
            }
            if let Some(first) = bad.first() {
                want.push(format!(
                    "{} contraindicated statement(s) not cleared, the first at seq {} (nonce_unknown); an operator clears them with `rackwarden-verifier clear`",
                    bad.len(),
                    first.seq
                ));
            }
            assert_eq!(h.findings, want);
            h.findings.clone()
        };
        assert!(
            findings(&v)[1]
                .starts_with("2 contraindicated statement(s) not cleared, the first at seq 1")
        );
        v.clear("r1", "h1", "alice", "reviewed", 1_500).unwrap();
        assert_eq!(findings(&v).len(), 1, "cleared: only the gap is left");
        store_verdict(&v, 4, "contraindicated");
        let before = findings(&v);
        assert!(
            before[1].starts_with("1 contraindicated statement(s) not cleared, the first at seq 4")
        );
        drop(v);
        let v = Verifier::new(Store::connect(&db).unwrap(), cfg.policy).unwrap();
        assert_eq!(findings(&v), before, "after a restart");
        drop(v);
        crate::store::testing::remove(&db);
    }

    #[test]
    fn a_store_error_is_an_error_never_an_empty_list() {
        let cfg =
            crate::config::VerifierConfig::parse(std::path::Path::new("v.toml"), CONFIG).unwrap();
        let db = crate::store::testing::database("standing_error").unwrap();
        let v = Verifier::new(Store::connect(&db).unwrap(), cfg.policy).unwrap();
        assert!(v.racks().unwrap().contains(&"r1".to_string()));
        // Broken behind the store's back: its connection is its own.
        Store::connect(&db)
            .unwrap()
            .tamper("DROP TABLE host_keys", &[])
            .unwrap();
        assert!(
            v.racks().is_err(),
            "a failed host_keys() must not read as `no hosts`"
        );
        assert!(v.rack_standing("r1", 0).is_err());
        drop(v);
        crate::store::testing::remove(&db);
    }
}
