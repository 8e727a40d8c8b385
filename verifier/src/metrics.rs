//! The verifier's counters and their Prometheus text exposition (`GET /metrics`).

use serde::Serialize;

use rackwarden_attest::api::{IngestOutcome, IngestStatus};

use crate::appraisal::Status;

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

impl Metrics {
    /// Counts one statement's outcome (once it is stored, or refused).
    pub fn count(&mut self, out: &IngestOutcome) {
        match out.status {
            IngestStatus::Accepted => self.accepted += 1,
            IngestStatus::Duplicate => self.duplicate += 1,
            IngestStatus::Rejected => self.rejected += 1,
        }
        if out.status == IngestStatus::Accepted
            && let Some(r) = &out.result
        {
            match r.status {
                Status::Affirming => self.affirming += 1,
                Status::Warning => self.warning += 1,
                Status::Contraindicated => self.contraindicated += 1,
            }
        }
    }
}

/// The exposition: the counters, and each rack's standing (`racks`, or why it could not be
/// read). Any displayable error, so that the service's error type stays the service's.
pub fn text(m: &Metrics, racks: Result<Vec<(String, Status)>, impl std::fmt::Display>) -> String {
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
    let racks = match racks {
        Ok(r) => r,
        Err(e) => {
            s += &format!("# rack standing unavailable: {e}\nrackwarden_store_errors_total 1\n");
            vec![]
        }
    };
    for (r, status) in racks {
        s += &format!(
            "rackwarden_rack_status{{rack=\"{}\"}} {}\n",
            r.replace('"', ""),
            status as u8
        );
    }
    s
}
