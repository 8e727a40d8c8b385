//! The verifier's counters and their Prometheus text exposition (`GET /metrics`), written
//! by `prometheus-client` in the Prometheus text format (0.0.4).

use serde::Serialize;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric, prometheus_text},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};
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

/// What one scrape reports: the counters and each rack's standing. The collector owns it (a
/// registry holds `'static` collectors) and writes it in this order.
#[derive(Debug)]
struct Snapshot {
    counters: Metrics,
    /// Each rack and its standing; `None` where the store could not say.
    racks: Option<Vec<(String, Status)>>,
}

/// A sample's labels, name and value, in the order they are written.
type Labels = Vec<(&'static str, String)>;

/// One metric: its HELP and TYPE lines, then each sample. A counter is named without its
/// `_total`, which the encoder appends (to the HELP and TYPE lines too, in this format).
fn family<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: impl IntoIterator<Item = (Labels, M)>,
) -> std::fmt::Result {
    let mut metric = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in samples {
        value.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Counter samples with one label.
fn by<'a>(
    label: &'static str,
    values: &'a [(&'static str, u64)],
) -> impl Iterator<Item = (Labels, ConstCounter)> + 'a {
    values
        .iter()
        .map(move |(k, v)| (vec![(label, (*k).to_string())], ConstCounter::new(*v)))
}

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let m = &self.counters;
        family(
            &mut enc,
            "rackwarden_statements",
            "Statements received, by outcome.",
            MetricType::Counter,
            by(
                "outcome",
                &[
                    ("accepted", m.accepted),
                    ("duplicate", m.duplicate),
                    ("rejected", m.rejected),
                ],
            ),
        )?;
        family(
            &mut enc,
            "rackwarden_verdicts",
            "Verdicts on accepted statements.",
            MetricType::Counter,
            by(
                "status",
                &[
                    ("affirming", m.affirming),
                    ("warning", m.warning),
                    ("contraindicated", m.contraindicated),
                ],
            ),
        )?;
        family(
            &mut enc,
            "rackwarden_challenges",
            "Nonces issued.",
            MetricType::Counter,
            [(vec![], ConstCounter::new(m.challenges))],
        )?;
        family(
            &mut enc,
            "rackwarden_rack_status",
            "Rack standing (0 affirming, 1 warning, 2 contraindicated).",
            MetricType::Gauge,
            self.racks.iter().flatten().map(|(rack, status)| {
                (
                    // Quotes dropped as the hand-written exposition did (the encoder would
                    // escape them), so that a rack's series keeps its name.
                    vec![("rack", rack.replace('"', ""))],
                    ConstGauge::new(u32::from(*status as u8)),
                )
            }),
        )?;
        if self.racks.is_none() {
            // Untyped, as the bare sample it always was; why is in the log.
            family(
                &mut enc,
                "rackwarden_store_errors_total",
                "The rack standings could not be read from the store for this scrape.",
                MetricType::Unknown,
                [(vec![], ConstGauge::new(1i64))],
            )?;
        }
        Ok(())
    }
}

/// The exposition: the counters, and each rack's standing (`racks`, or why it could not be
/// read, which is logged). Any displayable error, so that the service's error type stays the
/// service's. An error only where the encoder's writer fails, which a `String` does not.
pub fn text(
    m: &Metrics,
    racks: Result<Vec<(String, Status)>, impl std::fmt::Display>,
) -> Result<String, std::fmt::Error> {
    let racks = racks
        .inspect_err(|e| log::warn!("metrics: rack standing unavailable: {e}"))
        .ok();
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Snapshot {
        counters: m.clone(),
        racks,
    }));
    let mut text = String::new();
    prometheus_text::encode(&mut text, &registry)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text as the hand-written exposition wrote it before `prometheus-client`, line for
    /// line; a store error is now logged where it was a comment.
    #[test]
    fn the_exposition_keeps_every_name_help_label_and_value() {
        let m = Metrics {
            accepted: 5,
            duplicate: 1,
            rejected: 2,
            affirming: 3,
            warning: 1,
            contraindicated: 1,
            challenges: 9,
        };
        let head = "\
# HELP rackwarden_statements_total Statements received, by outcome.
# TYPE rackwarden_statements_total counter
rackwarden_statements_total{outcome=\"accepted\"} 5
rackwarden_statements_total{outcome=\"duplicate\"} 1
rackwarden_statements_total{outcome=\"rejected\"} 2
# HELP rackwarden_verdicts_total Verdicts on accepted statements.
# TYPE rackwarden_verdicts_total counter
rackwarden_verdicts_total{status=\"affirming\"} 3
rackwarden_verdicts_total{status=\"warning\"} 1
rackwarden_verdicts_total{status=\"contraindicated\"} 1
# HELP rackwarden_challenges_total Nonces issued.
# TYPE rackwarden_challenges_total counter
rackwarden_challenges_total 9
# HELP rackwarden_rack_status Rack standing (0 affirming, 1 warning, 2 contraindicated).
# TYPE rackwarden_rack_status gauge
";
        let racks = vec![
            ("rack-a".to_string(), Status::Contraindicated),
            ("rack-\"b\"".to_string(), Status::Affirming),
        ];
        let got = text(&m, Ok::<_, String>(racks)).unwrap();
        assert_eq!(
            got,
            format!(
                "{head}rackwarden_rack_status{{rack=\"rack-a\"}} 2\nrackwarden_rack_status{{rack=\"rack-b\"}} 0\n"
            )
        );
        let failed = text(&m, Err("database is locked")).unwrap();
        assert_eq!(
            failed,
            format!(
                "{head}# HELP rackwarden_store_errors_total The rack standings could not be read from the store for this scrape.\n# TYPE rackwarden_store_errors_total untyped\nrackwarden_store_errors_total 1\n"
            )
        );
    }
}
