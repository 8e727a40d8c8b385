//! Prometheus metrics (`[metrics] listen`, loopback only): `GET /metrics` in the text
//! exposition format, named like the verifier's (`rackwarden_*`, `_total` for counters).
//!
//! The listener thread holds nothing of the limiter: each scrape asks the agent loop for the
//! same [`StatusReport`] `rackwarden status` shows (over the channel the control socket
//! uses), so a scrape reads exactly what an operator would, and [`exposition`] is the one
//! place that turns it into metrics.

use std::{
    fmt::Write as _,
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::mpsc,
    time::Duration,
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
        ["GET", "/metrics"] => match status_from_agent(tx) {
            Ok(s) => ("200 OK", exposition(&s)),
            Err(why) => ("503 Service Unavailable", format!("{why}\n")),
        },
        _ => ("404 Not Found", "only GET /metrics\n".into()),
    };
    let mut conn = conn;
    write!(
        conn,
        "HTTP/1.1 {code}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
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

/// A metric's HELP and TYPE lines.
fn head(s: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A label value as the exposition format quotes it.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The limiter's counters and caps, per direction.
fn limiter(s: &mut String, st: &StatusReport) {
    head(
        s,
        "rackwarden_limiter_bytes_total",
        "counter",
        "Frame bytes the policer passed or dropped, by direction.",
    );
    for d in &st.directions {
        let c = &d.counters;
        for (outcome, v) in [("passed", c.passed_bytes), ("dropped", c.dropped_bytes)] {
            let _ = writeln!(
                s,
                "rackwarden_limiter_bytes_total{{direction=\"{}\",outcome=\"{outcome}\"}} {v}",
                d.direction.name()
            );
        }
    }
    head(
        s,
        "rackwarden_limiter_packets_total",
        "counter",
        "Packets the policer passed or dropped, by direction.",
    );
    for d in &st.directions {
        let c = &d.counters;
        for (outcome, v) in [("passed", c.passed_packets), ("dropped", c.dropped_packets)] {
            let _ = writeln!(
                s,
                "rackwarden_limiter_packets_total{{direction=\"{}\",outcome=\"{outcome}\"}} {v}",
                d.direction.name()
            );
        }
    }
    head(
        s,
        "rackwarden_cap_bytes_per_second",
        "gauge",
        "This host's cap (the rack cap times host_share), by direction.",
    );
    for d in &st.directions {
        let _ = writeln!(
            s,
            "rackwarden_cap_bytes_per_second{{direction=\"{}\"}} {}",
            d.direction.name(),
            d.host_cap_bytes_per_s
        );
    }
}

/// The epoch loop and delivery, where `[epoch]` is configured.
fn epoch(s: &mut String, st: &StatusReport) {
    let Some(e) = &st.epoch else { return };
    head(
        s,
        "rackwarden_epoch_state",
        "gauge",
        "The epoch loop's state (1 for the current one).",
    );
    let _ = writeln!(
        s,
        "rackwarden_epoch_state{{state=\"{}\"}} 1",
        label(e.state.name())
    );
    if let Some(last) = &e.last_epoch {
        head(
            s,
            "rackwarden_epochs_total",
            "counter",
            "Epochs in the evidence log (the last signed seq + 1).",
        );
        let _ = writeln!(s, "rackwarden_epochs_total {}", last.seq + 1);
        head(
            s,
            "rackwarden_epoch_last_end_timestamp_seconds",
            "gauge",
            "When the last signed epoch ended.",
        );
        let _ = writeln!(
            s,
            "rackwarden_epoch_last_end_timestamp_seconds {:.3}",
            last.ended_at_ms as f64 / 1000.0
        );
    }
    head(
        s,
        "rackwarden_delivery_backlog",
        "gauge",
        "Statements in the log the verifier has not acknowledged.",
    );
    let _ = writeln!(s, "rackwarden_delivery_backlog {}", e.delivery.backlog);
    if let Some(v) = &e.delivery.last_verdict {
        head(
            s,
            "rackwarden_last_verdict",
            "gauge",
            "The verifier's verdict on the last delivered statement (0 affirming, 1 warning, 2 contraindicated), labelled with its seq and status.",
        );
        let status = v.status.as_deref().unwrap_or("none");
        let code = match status {
            "affirming" => "0",
            "warning" => "1",
            "contraindicated" => "2",
            _ => "NaN",
        };
        let _ = writeln!(
            s,
            "rackwarden_last_verdict{{seq=\"{}\",status=\"{}\"}} {code}",
            v.seq,
            label(status)
        );
    }
}

/// The Prometheus text exposition of a status report.
pub fn exposition(st: &StatusReport) -> String {
    let mut s = String::new();
    limiter(&mut s, st);
    head(
        &mut s,
        "rackwarden_enforcement_gaps_total",
        "counter",
        "Enforcement gaps recorded on this host (a hook detached, replaced or preceded).",
    );
    let _ = writeln!(s, "rackwarden_enforcement_gaps_total {}", st.gaps_total);
    head(
        &mut s,
        "rackwarden_enforcing",
        "gauge",
        "1 while every hook enforces, 0 while degraded.",
    );
    let _ = writeln!(
        s,
        "rackwarden_enforcing {}",
        u8::from(st.agent_state == "enforcing")
    );
    epoch(&mut s, st);
    s
}
