//! Prometheus metrics (`[metrics] listen`, loopback only): `GET /metrics` in the text
//! exposition format, named like the verifier's (`rackwarden_*`, `_total` for counters).
//!
//! The listener thread holds nothing of the limiter: each scrape asks the agent loop for the
//! same [`StatusReport`] `rackwarden status` shows (over the channel the control socket
//! uses), so a scrape reads exactly what an operator would, and [`exposition`] is the one
//! place that turns it into metrics, written by `prometheus-client` in the Prometheus text
//! format (0.0.4).

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::mpsc,
    time::Duration,
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _, prometheus_text},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

use crate::{
    control::{Request, Response, Wake},
    status::StatusReport,
};

#[derive(Debug, thiserror::Error)]
#[error("metrics listener {addr}: {source}")]
pub struct MetricsError {
    addr: SocketAddr,
    source: std::io::Error,
}

/// Binds `addr`. The daemon binds before it loads the limiter, so an address in use
/// refuses a start that has touched nothing.
pub fn bind(addr: SocketAddr) -> Result<TcpListener, MetricsError> {
    TcpListener::bind(addr).map_err(|source| MetricsError { addr, source })
}

/// Serves `GET /metrics` on `listener`, on a thread of its own.
pub fn serve(listener: TcpListener, tx: mpsc::Sender<Wake>) -> Result<(), MetricsError> {
    let addr = listener.local_addr().map_err(|source| MetricsError {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        source,
    })?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                if let Err(err) = answer(conn, &tx) {
                    log::debug!("metrics connection: {err}");
                }
            }
        })
        .map_err(|source| MetricsError { addr, source })?;
    log::info!("metrics: http://{addr}/metrics");
    Ok(())
}

/// One request, one response, then the connection closes.
fn answer(conn: TcpStream, tx: &mpsc::Sender<Wake>) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut request_line = String::new();
    BufReader::new(conn.try_clone()?)
        .take(8 * 1024)
        .read_line(&mut request_line)?;
    let (code, body) = match request_line.split_whitespace().take(2).collect::<Vec<_>>()[..] {
        ["GET", "/metrics"] => match status_from_agent(tx).map(|s| exposition(&s)) {
            Ok(Ok(text)) => ("200 OK", text),
            Ok(Err(std::fmt::Error)) => (
                "500 Internal Server Error",
                "the exposition could not be written\n".into(),
            ),
            Err(why) => ("503 Service Unavailable", format!("{why}\n")),
        },
        _ => ("404 Not Found", "only GET /metrics\n".into()),
    };
    let mut conn = conn;
    write!(
        conn,
        "HTTP/1.1 {code}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        prometheus_text::CONTENT_TYPE,
        body.len()
    )
}

/// Why a scrape got no status from the agent (served as the 503's body).
#[derive(Debug, thiserror::Error)]
enum ScrapeError {
    #[error("daemon is shutting down")]
    ShuttingDown,
    #[error("{0}")]
    Agent(String),
    #[error("unexpected answer from the agent")]
    Unexpected,
    #[error("the daemon did not answer in 10 s")]
    NoAnswer,
}

fn status_from_agent(tx: &mpsc::Sender<Wake>) -> Result<StatusReport, ScrapeError> {
    let (rtx, rrx) = mpsc::channel();
    tx.send(Wake::Request((Request::Status, rtx)))
        .map_err(|_| ScrapeError::ShuttingDown)?;
    match rrx.recv_timeout(Duration::from_secs(10)) {
        Ok(Response::Status(s)) => Ok(*s),
        Ok(Response::Error { message }) => Err(ScrapeError::Agent(message)),
        Ok(_) => Err(ScrapeError::Unexpected),
        Err(_) => Err(ScrapeError::NoAnswer),
    }
}

/// What a scrape reports, taken from a status report. The collector owns it (a registry
/// holds `'static` collectors) and writes it in this order.
#[derive(Debug, Clone, PartialEq)]
struct Snapshot {
    directions: Vec<DirectionSample>,
    gaps_total: u64,
    enforcing: bool,
    epoch: Option<EpochSample>,
}

#[derive(Debug, Clone, PartialEq)]
struct DirectionSample {
    direction: &'static str,
    passed_bytes: u64,
    dropped_bytes: u64,
    passed_packets: u64,
    dropped_packets: u64,
    host_cap_bytes_per_s: u64,
}

/// The epoch loop and delivery, where `[epoch]` is configured.
#[derive(Debug, Clone, PartialEq)]
struct EpochSample {
    state: &'static str,
    /// Seq and end (unix ms) of the last signed epoch.
    last: Option<(u64, u64)>,
    backlog: u64,
    /// The last delivered statement's seq and the verifier's status of it.
    last_verdict: Option<(u64, Option<String>)>,
}

impl Snapshot {
    fn of(st: &StatusReport) -> Snapshot {
        Snapshot {
            directions: st
                .directions
                .iter()
                .map(|d| DirectionSample {
                    direction: d.direction.name(),
                    passed_bytes: d.counters.passed_bytes,
                    dropped_bytes: d.counters.dropped_bytes,
                    passed_packets: d.counters.passed_packets,
                    dropped_packets: d.counters.dropped_packets,
                    host_cap_bytes_per_s: d.host_cap_bytes_per_s,
                })
                .collect(),
            gaps_total: st.gaps_total as u64,
            enforcing: st.agent_state == "enforcing",
            epoch: st.epoch.as_ref().map(|e| EpochSample {
                state: e.state.name(),
                last: e.last_epoch.as_ref().map(|l| (l.seq, l.ended_at_ms)),
                backlog: e.delivery.backlog,
                last_verdict: e
                    .delivery
                    .last_verdict
                    .as_ref()
                    .map(|v| (v.seq, v.status.clone())),
            }),
        }
    }
}

/// A sample's labels, name and value, in the order they are written.
type Labels = Vec<(&'static str, String)>;

/// One metric: its HELP and TYPE lines, then each sample. A counter is named without its
/// `_total`, which the encoder appends (to the HELP and TYPE lines too, in this format).
fn family<M: prometheus_client::encoding::EncodeMetric>(
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

impl Snapshot {
    /// The limiter's counters and caps, per direction.
    fn limiter(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let by_outcome = |passed: fn(&DirectionSample) -> u64,
                          dropped: fn(&DirectionSample) -> u64| {
            self.directions.iter().flat_map(move |d| {
                [("passed", passed(d)), ("dropped", dropped(d))].map(|(outcome, v)| {
                    (
                        vec![
                            ("direction", d.direction.to_string()),
                            ("outcome", outcome.to_string()),
                        ],
                        ConstCounter::new(v),
                    )
                })
            })
        };
        family(
            enc,
            "rackwarden_limiter_bytes",
            "Frame bytes the policer passed or dropped, by direction.",
            MetricType::Counter,
            by_outcome(|d| d.passed_bytes, |d| d.dropped_bytes),
        )?;
        family(
            enc,
            "rackwarden_limiter_packets",
            "Packets the policer passed or dropped, by direction.",
            MetricType::Counter,
            by_outcome(|d| d.passed_packets, |d| d.dropped_packets),
        )?;
        family(
            enc,
            "rackwarden_cap_bytes_per_second",
            "This host's cap (the rack cap times host_share), by direction.",
            MetricType::Gauge,
            self.directions.iter().map(|d| {
                (
                    vec![("direction", d.direction.to_string())],
                    ConstGauge::new(d.host_cap_bytes_per_s),
                )
            }),
        )
    }

    /// The epoch loop and delivery, where `[epoch]` is configured.
    fn epoch(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        let Some(e) = &self.epoch else { return Ok(()) };
        family(
            enc,
            "rackwarden_epoch_state",
            "The epoch loop's state (1 for the current one).",
            MetricType::Gauge,
            [(vec![("state", e.state.to_string())], ConstGauge::new(1i64))],
        )?;
        if let Some((seq, ended_at_ms)) = e.last {
            family(
                enc,
                "rackwarden_epochs",
                "Epochs in the evidence log (the last signed seq + 1).",
                MetricType::Counter,
                [(vec![], ConstCounter::new(seq + 1))],
            )?;
            family(
                enc,
                "rackwarden_epoch_last_end_timestamp_seconds",
                "When the last signed epoch ended.",
                MetricType::Gauge,
                [(vec![], ConstGauge::new(ended_at_ms as f64 / 1000.0))],
            )?;
        }
        family(
            enc,
            "rackwarden_delivery_backlog",
            "Statements in the log the verifier has not acknowledged.",
            MetricType::Gauge,
            [(vec![], ConstGauge::new(e.backlog))],
        )?;
        if let Some((seq, status)) = &e.last_verdict {
            let status = status.as_deref().unwrap_or("none");
            let labels = vec![("seq", seq.to_string()), ("status", status.to_string())];
            // Not a verdict the verifier names: NaN, which is a float, where the codes are not.
            let mut metric = enc.encode_descriptor(
                "rackwarden_last_verdict",
                "The verifier's verdict on the last delivered statement (0 affirming, 1 warning, 2 contraindicated), labelled with its seq and status.",
                None,
                MetricType::Gauge,
            )?;
            let sample = metric.encode_family(&labels)?;
            match status {
                "affirming" => ConstGauge::new(0i64).encode(sample)?,
                "warning" => ConstGauge::new(1i64).encode(sample)?,
                "contraindicated" => ConstGauge::new(2i64).encode(sample)?,
                _ => ConstGauge::new(f64::NAN).encode(sample)?,
            }
        }
        Ok(())
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        self.limiter(&mut enc)?;
        family(
            &mut enc,
            "rackwarden_enforcement_gaps",
            "Enforcement gaps recorded on this host (a hook detached, replaced or preceded).",
            MetricType::Counter,
            [(vec![], ConstCounter::new(self.gaps_total))],
        )?;
        family(
            &mut enc,
            "rackwarden_enforcing",
            "1 while every hook enforces, 0 while degraded.",
            MetricType::Gauge,
            [(vec![], ConstGauge::new(i64::from(self.enforcing)))],
        )?;
        self.epoch(&mut enc)
    }
}

/// The Prometheus text exposition (format 0.0.4) of a status report. An error only where
/// the encoder's writer fails, which a `String` does not.
pub fn exposition(st: &StatusReport) -> Result<String, std::fmt::Error> {
    snapshot_text(Snapshot::of(st))
}

fn snapshot_text(snapshot: Snapshot) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(snapshot));
    let mut text = String::new();
    prometheus_text::encode(&mut text, &registry)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text as the hand-written exposition wrote it before `prometheus-client`, line for
    /// line (only the float's digits are the encoder's: shortest round-trip, not `{:.3}`).
    #[test]
    fn the_exposition_keeps_every_name_help_label_and_value() {
        let snapshot = Snapshot {
            directions: vec![
                DirectionSample {
                    direction: "egress",
                    passed_bytes: 1000,
                    dropped_bytes: 20,
                    passed_packets: 10,
                    dropped_packets: 2,
                    host_cap_bytes_per_s: 1_000_000,
                },
                DirectionSample {
                    direction: "ingress",
                    passed_bytes: 0,
                    dropped_bytes: 0,
                    passed_packets: 0,
                    dropped_packets: 0,
                    host_cap_bytes_per_s: 2_000_000,
                },
            ],
            gaps_total: 3,
            enforcing: true,
            epoch: Some(EpochSample {
                state: "waiting",
                last: Some((6, 1_700_000_000_250)),
                backlog: 1,
                last_verdict: Some((6, Some("warn\"ing\"".into()))),
            }),
        };
        let want = "\
# HELP rackwarden_limiter_bytes_total Frame bytes the policer passed or dropped, by direction.
# TYPE rackwarden_limiter_bytes_total counter
rackwarden_limiter_bytes_total{direction=\"egress\",outcome=\"passed\"} 1000
rackwarden_limiter_bytes_total{direction=\"egress\",outcome=\"dropped\"} 20
rackwarden_limiter_bytes_total{direction=\"ingress\",outcome=\"passed\"} 0
rackwarden_limiter_bytes_total{direction=\"ingress\",outcome=\"dropped\"} 0
# HELP rackwarden_limiter_packets_total Packets the policer passed or dropped, by direction.
# TYPE rackwarden_limiter_packets_total counter
rackwarden_limiter_packets_total{direction=\"egress\",outcome=\"passed\"} 10
rackwarden_limiter_packets_total{direction=\"egress\",outcome=\"dropped\"} 2
rackwarden_limiter_packets_total{direction=\"ingress\",outcome=\"passed\"} 0
rackwarden_limiter_packets_total{direction=\"ingress\",outcome=\"dropped\"} 0
# HELP rackwarden_cap_bytes_per_second This host's cap (the rack cap times host_share), by direction.
# TYPE rackwarden_cap_bytes_per_second gauge
rackwarden_cap_bytes_per_second{direction=\"egress\"} 1000000
rackwarden_cap_bytes_per_second{direction=\"ingress\"} 2000000
# HELP rackwarden_enforcement_gaps_total Enforcement gaps recorded on this host (a hook detached, replaced or preceded).
# TYPE rackwarden_enforcement_gaps_total counter
rackwarden_enforcement_gaps_total 3
# HELP rackwarden_enforcing 1 while every hook enforces, 0 while degraded.
# TYPE rackwarden_enforcing gauge
rackwarden_enforcing 1
# HELP rackwarden_epoch_state The epoch loop's state (1 for the current one).
# TYPE rackwarden_epoch_state gauge
rackwarden_epoch_state{state=\"waiting\"} 1
# HELP rackwarden_epochs_total Epochs in the evidence log (the last signed seq + 1).
# TYPE rackwarden_epochs_total counter
rackwarden_epochs_total 7
# HELP rackwarden_epoch_last_end_timestamp_seconds When the last signed epoch ended.
# TYPE rackwarden_epoch_last_end_timestamp_seconds gauge
rackwarden_epoch_last_end_timestamp_seconds 1700000000.25
# HELP rackwarden_delivery_backlog Statements in the log the verifier has not acknowledged.
# TYPE rackwarden_delivery_backlog gauge
rackwarden_delivery_backlog 1
# HELP rackwarden_last_verdict The verifier's verdict on the last delivered statement (0 affirming, 1 warning, 2 contraindicated), labelled with its seq and status.
# TYPE rackwarden_last_verdict gauge
rackwarden_last_verdict{seq=\"6\",status=\"warn\\\"ing\\\"\"} NaN
";
        assert_eq!(snapshot_text(snapshot.clone()).unwrap(), want);
        let mut affirmed = snapshot;
        if let Some(e) = &mut affirmed.epoch {
            e.last_verdict = Some((6, Some("contraindicated".into())));
        }
        assert!(
            snapshot_text(affirmed)
                .unwrap()
                .ends_with("rackwarden_last_verdict{seq=\"6\",status=\"contraindicated\"} 2\n")
        );
    }
}
