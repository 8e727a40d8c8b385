//! The demo scenario, shared by `cargo xtask demo` (the `rackwarden-demo` binary) and the
//! test that proves it: a rack capped at 1 MB/s runs an inference-like flow (small token
//! messages at a few KB/s) beside a bulk "gradient" flow; the first must pass untouched, the
//! second must be held to the cap.

use std::{net::SocketAddr, time::Duration};

use crate::{
    Daemon, Net, OUT_ADDR, UDP_FRAME_OVERHEAD, UdpSink, status_json, udp_send, window_secs,
};

pub const CAP_BYTES_PER_S: u64 = 1_000_000;
pub const BURST_BYTES: u64 = 256 * 1024;

/// One flow's line in the demo table.
#[derive(Debug, Clone)]
pub struct FlowRow {
    pub name: &'static str,
    pub offered_frame_bytes: u64,
    pub delivered_frame_bytes: u64,
    pub secs: f64,
}

#[derive(Debug, Clone)]
pub struct DemoReport {
    pub flows: Vec<FlowRow>,
    /// What the policer itself counted (egress), for the table's last line.
    pub policer_passed_bytes: u64,
    pub policer_dropped_bytes: u64,
    pub window_secs: f64,
}

impl DemoReport {
    pub fn bound(&self) -> f64 {
        BURST_BYTES as f64 + CAP_BYTES_PER_S as f64 * self.window_secs
    }

    pub fn render(&self) -> String {
        let mut s = format!(
            "rack egress cap {} B/s, burst {} B, window {:.2} s: hard bound burst + rate x T = {:.0} B\n\n",
            CAP_BYTES_PER_S,
            BURST_BYTES,
            self.window_secs,
            self.bound()
        );
        s += &format!(
            "{:<28} {:>14} {:>14} {:>14} {:>10}\n",
            "flow", "offered B", "delivered B", "delivered B/s", "delivered"
        );
        for f in &self.flows {
            s += &format!(
                "{:<28} {:>14} {:>14} {:>14.0} {:>9.2}%\n",
                f.name,
                f.offered_frame_bytes,
                f.delivered_frame_bytes,
                f.delivered_frame_bytes as f64 / f.secs,
                100.0 * f.delivered_frame_bytes as f64 / f.offered_frame_bytes.max(1) as f64
            );
        }
        let total: u64 = self.flows.iter().map(|f| f.delivered_frame_bytes).sum();
        s += &format!(
            "\nall flows delivered {} B = {:.2}% of the bound; the policer counted {} B passed, {} B dropped\n",
            total,
            100.0 * total as f64 / self.bound(),
            self.policer_passed_bytes,
            self.policer_dropped_bytes
        );
        s
    }
}

/// Runs the scenario on a fresh fixture and returns what happened.
pub fn run(secs: f64) -> DemoReport {
    let net = Net::new("demo");
    let cfg = net.write_config("1 MB/s", "1 MB/s", "256 KiB");
    let _daemon = Daemon::start(&cfg, &net.socket_path());
    let dst = |port: u16| -> SocketAddr { format!("{OUT_ADDR}:{port}").parse().unwrap() };

    // Inference: 200-byte token messages, 25 per second = 5 KB/s of payload.
    let infer_sink = UdpSink::start(&net.out_ns, OUT_ADDR);
    let bulk_sink = UdpSink::start(&net.out_ns, OUT_ADDR);
    let infer = udp_send(
        &net.rack_ns,
        dst(infer_sink.port),
        200,
        secs,
        Some(5_000),
        None,
    );
    let bulk = udp_send(&net.rack_ns, dst(bulk_sink.port), 1400, secs, None, None);
    let (i_sent, b_sent) = (infer.join().unwrap(), bulk.join().unwrap());
    std::thread::sleep(Duration::from_millis(200));
    let (ib, ip) = infer_sink.finish();
    let (bb, bp) = bulk_sink.finish();
    let frames = |payload: u64, size: u64| payload + (payload / size) * UDP_FRAME_OVERHEAD;
    let st = status_json(&net.socket_path());
    let dir = &st["directions"][0]["counters"];
    DemoReport {
        flows: vec![
            FlowRow {
                name: "inference (200 B msgs)",
                offered_frame_bytes: frames(i_sent.offered, 200),
                delivered_frame_bytes: ib + ip * UDP_FRAME_OVERHEAD,
                secs: window_secs(&[i_sent]),
            },
            FlowRow {
                name: "gradient (UDP flood)",
                offered_frame_bytes: frames(b_sent.offered, 1400),
                delivered_frame_bytes: bb + bp * UDP_FRAME_OVERHEAD,
                secs: window_secs(&[b_sent]),
            },
        ],
        policer_passed_bytes: dir["passed_bytes"].as_u64().unwrap_or(0),
        policer_dropped_bytes: dir["dropped_bytes"].as_u64().unwrap_or(0),
        window_secs: window_secs(&[i_sent, b_sent]),
    }
}
