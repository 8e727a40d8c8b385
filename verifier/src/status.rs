//! Per-rack and per-host standing. A host that has not reported within the maximum wipe
//! interval is contraindicated with no statement arriving: a missing epoch is evidence.

use serde::Serialize;

use crate::service::{AttestationResult, Status, Verifier, VerifierError, stored_statement};

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
    pub clearance: Option<crate::store::Clearance>,
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
}

impl Verifier {
    /// Every rack with an agreement or an enrolled host. A store that cannot be read is an
    /// error, never an empty list (which would read as racks with nothing wrong).
    pub fn racks(&self) -> Result<Vec<String>, VerifierError> {
        let mut r: Vec<String> = self.host_list()?.into_iter().map(|(r, _, _)| r).collect();
        r.extend(self.policy.racks.keys().cloned());
        r.sort();
        r.dedup();
        Ok(r)
    }

    /// (rack, host, enrolled_ms) of current (non-retired) keys.
    fn host_list(&self) -> Result<Vec<(String, String, u64)>, VerifierError> {
        let mut v: Vec<(String, String, u64)> = self
            .store
            .host_keys()?
            .into_iter()
            .filter(|k| k.retired_ms.is_none())
            .map(|k| (k.rack, k.host, k.enrolled_ms))
            .collect();
        v.sort();
        v.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
        Ok(v)
    }

    pub fn rack_standing(&self, rack: &str, now_ms: u64) -> Result<RackStanding, VerifierError> {
        let max = self.policy.max_wipe_interval.as_millis() as u64;
        let mut hosts = Vec::new();
        for (_, host, enrolled) in self.host_list()?.into_iter().filter(|(r, _, _)| r == rack) {
            let mut findings = Vec::new();
            let last = self.store.history(rack, &host, 1)?.into_iter().next();
            let last_result: Option<AttestationResult> = last
                .as_ref()
                .and_then(|s| serde_json::from_str(&s.result).ok());
            let mut status = last_result
                .as_ref()
                .map(|r| r.status)
                .unwrap_or(Status::Warning);
            let since = last.as_ref().map(|s| s.epoch_end_ms).unwrap_or(enrolled);
            if now_ms.saturating_sub(since) > max {
                status = Status::Contraindicated;
                findings.push(format!(
                    "silent: no epoch since {since} ms (more than {} s)",
                    max / 1000
                ));
            } else if last.is_none() {
                findings.push("no statement yet".into());
            }
            let seqs = self.store.seqs(rack, &host)?;
            if let Some(&top) = seqs.last()
                && seqs.len() as u64 != top + 1
            {
                status = status.max(Status::Warning);
                findings.push(format!("gap: {} of seqs 0..={top} stored", seqs.len()));
            }
            // Standing is the whole history, not the latest statement: a contraindicated
            // statement anywhere (a fork at an old seq, or one with more built on it) holds
            // the host contraindicated until an operator clears it (`rackwarden-verifier
            // clear`, recorded).
            let clearance = self.store.last_clearance(rack, &host)?;
            let bad = self.store.contraindicated_after(
                rack,
                &host,
                clearance.as_ref().map_or(0, |c| c.up_to_id),
            )?;
            let first_uncleared = bad.first().map(|first| UnclearedStatement {
                id: first.id,
                seq: first.seq,
                result: serde_json::from_str::<AttestationResult>(&first.result).ok(),
            });
            if let Some(first) = &first_uncleared {
                status = Status::Contraindicated;
                let codes: Vec<&str> = first
                    .result
                    .iter()
                    .flat_map(|r| &r.findings)
                    .filter(|f| f.severity == Status::Contraindicated)
                    .map(|f| f.code.name())
                    .collect();
                findings.push(format!(
                    "{} contraindicated statement(s) not cleared, the first at seq {} ({}); an operator clears them with `rackwarden-verifier clear`",
                    bad.len(),
                    first.seq,
                    codes.join(", ")
                ));
            }
            let last_st = last.as_ref().and_then(stored_statement);
            let cap = |dir: &str| {
                last_st.as_ref().and_then(|s| match &s.predicate.limiter {
                    rackwarden_attest::evidence::LimiterReport::Present(e) => e
                        .caps
                        .iter()
                        .find(|c| c.direction.name() == dir)
                        .map(|c| c.rate_bytes_per_s),
                    _ => None,
                })
            };
            let (egress_cap, ingress_cap) = (cap("egress"), cap("ingress"));
            hosts.push(HostStanding {
                host,
                status,
                last_seq: last.as_ref().map(|s| s.seq),
                last_epoch_end_ms: last.as_ref().map(|s| s.epoch_end_ms),
                last_result,
                findings,
                egress_cap_bytes_per_s: egress_cap,
                ingress_cap_bytes_per_s: ingress_cap,
                clearance,
                first_uncleared,
            });
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
        match self.policy.racks.get(rack) {
            None => {
                status = Status::Contraindicated;
                findings.push("no agreed cap for this rack in the policy".into());
            }
            Some(a) => {
                // Both directions: the rack's agreement bounds what all its hosts enforce.
                for (dir, agreed, sum) in [
                    (
                        "egress",
                        a.egress_bytes_per_s,
                        hosts
                            .iter()
                            .filter_map(|h| h.egress_cap_bytes_per_s)
                            .sum::<u64>(),
                    ),
                    (
                        "ingress",
                        a.ingress_bytes_per_s,
                        hosts
                            .iter()
                            .filter_map(|h| h.ingress_cap_bytes_per_s)
                            .sum::<u64>(),
                    ),
                ] {
                    if sum > agreed {
                        status = Status::Contraindicated;
                        findings.push(format!(
                            "hosts' {dir} caps sum to {sum} B/s, above the agreed {agreed} B/s"
                        ));
                    }
                }
            }
        }
        Ok(RackStanding {
            rack: rack.into(),
            status,
            policy_id: self.policy.id.clone(),
            hosts,
            findings,
        })
    }

    /// Prometheus text exposition.
    pub fn metrics_text(&self, now_ms: u64) -> String {
        let m = &self.metrics;
        let mut s = String::new();
        s += "# HELP rackwarden_statements_total Statements received, by outcome.\n# TYPE rackwarden_statements_total counter\n";
        for (k, v) in [
            ("accepted", m.accepted),
            ("duplicate", m.duplicate),
            ("rejected", m.rejected),
        ] {
            s += &format!("rackwarden_statements_total{{outcome=\"{k}\"}} {v}\n");
        }
        s += "# HELP rackwarden_verdicts_total Verdicts on accepted statements.\n# TYPE rackwarden_verdicts_total counter\n";
        for (k, v) in [
            ("affirming", m.affirming),
            ("warning", m.warning),
            ("contraindicated", m.contraindicated),
        ] {
            s += &format!("rackwarden_verdicts_total{{status=\"{k}\"}} {v}\n");
        }
        s += &format!(
            "# HELP rackwarden_challenges_total Nonces issued.\n# TYPE rackwarden_challenges_total counter\nrackwarden_challenges_total {}\n",
            m.challenges
        );
        s += "# HELP rackwarden_rack_status Rack standing (0 affirming, 1 warning, 2 contraindicated).\n# TYPE rackwarden_rack_status gauge\n";
        let racks = match self.racks() {
            Ok(r) => r,
            Err(e) => {
                s +=
                    &format!("# rack standing unavailable: {e}\nrackwarden_store_errors_total 1\n");
                vec![]
            }
        };
        for r in racks {
            if let Ok(st) = self.rack_standing(&r, now_ms) {
                s += &format!(
                    "rackwarden_rack_status{{rack=\"{}\"}} {}\n",
                    r.replace('"', ""),
                    st.status as u8
                );
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use crate::{service::Verifier, store::Store};

    #[test]
    fn a_store_error_is_an_error_never_an_empty_list() {
        let cfg = crate::config::VerifierConfig::parse(
            std::path::Path::new("v.toml"),
            "listen = \"127.0.0.1:7700\"\ninsecure_http = true\ndatabase = \"/tmp/unused.sqlite\"\n\n[policy]\nid = \"p\"\nnonce_ttl = \"10 min\"\nmax_wipe_interval = \"15 min\"\nmax_residue_host = \"4 GiB\"\nmax_residue_gpu = \"1 GiB\"\ntrainable_state = \"10 TB\"\nmax_epoch_fraction = 0.01\n\n[racks.r1]\negress = \"10 MB/s\"\ningress = \"10 MB/s\"\n",
        )
        .unwrap();
        let v = Verifier::new(Store::in_memory().unwrap(), cfg.policy).unwrap();
        assert!(v.racks().unwrap().contains(&"r1".to_string()));
        v.store.conn.execute_batch("DROP TABLE host_keys").unwrap();
        assert!(
            v.racks().is_err(),
            "a failed host_keys() must not read as `no hosts`"
        );
        assert!(v.rack_standing("r1", 0).is_err());
    }
}
