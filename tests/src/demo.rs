//! The demo scenario, shared by `cargo xtask demo` (the `rackwarden-demo` binary) and the
//! tests that prove it: a rack capped at 1 MB/s runs an inference-like flow (small token
//! messages at a few KB/s) beside a bulk "gradient" flow; the first must pass untouched, the
//! second must be held to the cap. [`full`] adds the rest of the product around it: a
//! verifier on the rack namespace's loopback, an epoch (challenge, drain, bounded host wipe,
//! image check, restart, sign) delivered and judged, and [`FullDemo::hold`] keeps it all up
//! (the page forwarded to this host's loopback) until Ctrl-C, or ends it at once.

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

/// Runs the limiter scenario on a fresh fixture and returns what happened.
pub fn run(secs: f64) -> DemoReport {
    let net = Net::new("demo");
    let cfg = net.write_config("1 MB/s", "1 MB/s", "256 KiB");
    let _daemon = Daemon::start(&cfg, &net.socket_path());
    traffic(&net, secs)
}

/// The two flows for `secs` against a running daemon on `net`.
pub fn traffic(net: &Net, secs: f64) -> DemoReport {
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

/// The demo host's `wipe_interval`, and the longest its verifier's policy allows between
/// complete wipes (`max_wipe_interval`). An epoch ends an interval plus its own run (drain,
/// wipe, image check, restart: a minute at most here) after the last, so the policy leaves
/// that room; equal values would make every scheduled epoch `wipe_overdue`.
pub const DEMO_WIPE_INTERVAL: &str = "10 min";
pub const DEMO_MAX_WIPE_INTERVAL: &str = "15 min";

/// The demo's one completion over HTTP: what a client sends the rack's inference port, and
/// what it gets back.
/// The completions the demo asks of the bundled model, one connection each.
const DEMO_PROMPTS: [&str; 3] = [
    "The verifier draws",
    "Every byte the policer passes",
    "The daemon wipes",
];

/// What keeps the demo running after it has printed its story: the namespaces, the verifier
/// and the daemon (dropped in this order: daemon, verifier, then the namespaces).
struct Live {
    _daemon: Daemon,
    daemon_config: std::path::PathBuf,
    verifier: crate::epoch::Verifier,
    _fixture: crate::epoch::EpochFixture,
    _net: Net,
}

/// The whole story: what [`full`] saw.
pub struct FullDemo {
    pub traffic: DemoReport,
    /// The verifier's stored rows for this host, oldest first.
    pub history: Vec<serde_json::Value>,
    /// The daemon's status at the end.
    pub status: serde_json::Value,
    pub rack: serde_json::Value,
    pub wipe_bytes: u64,
    /// The completions the bundled model served, as the client got them.
    pub completions: Vec<Vec<u8>>,
    /// Epochs the replay service replayed, and what it found for the completions' epoch.
    pub replayed: usize,
    pub replay: Option<rackwarden_verifier::store::ReplayRow>,
    /// The rack's page at the verifier, where it was, and what became of the screenshot.
    pub page: PageShot,
    /// What keeps it running ([`full_live`]); `None` once torn down ([`full`]).
    live: Option<Live>,
}

/// The auditor's page of the demo rack, captured before the namespaces go.
pub struct PageShot {
    pub url: String,
    pub ns: String,
    /// The screenshot and a copy of the HTML, or why there is none.
    pub saved: Result<(std::path::PathBuf, std::path::PathBuf), String>,
}

/// Loads `url` in headless Chromium inside namespace `ns` and writes a screenshot and the
/// rendered HTML into `target/screenshots`.
fn shoot(
    ns: &str,
    url: &str,
    name: &str,
) -> Result<(std::path::PathBuf, std::path::PathBuf), String> {
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|c| std::path::Path::new(c).exists())
        .ok_or("no chromium (`cargo xtask setup` installs Debian's `chromium`)")?;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/screenshots");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let profile = std::env::temp_dir().join(format!("rw-demo-chromium-{}", std::process::id()));
    let (png, html) = (
        dir.join(format!("{name}.png")),
        dir.join(format!("{name}.html")),
    );
    let run = |args: &[String]| {
        std::process::Command::new("ip")
            .args(["netns", "exec", ns, "timeout", "90", chromium])
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
            ])
            // The demo verifier's CA is its own; the daemon checks the certificate.
            .arg("--ignore-certificate-errors")
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(args)
            .arg(url)
            .output()
            .map_err(|e| format!("chromium: {e}"))
    };
    let out = run(&[
        format!("--screenshot={}", png.display()),
        "--window-size=1200,2200".into(),
        "--hide-scrollbars".into(),
    ])?;
    if !png.exists() {
        return Err(format!(
            "chromium wrote no screenshot: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let dom = run(&["--dump-dom".into()])?;
    std::fs::write(&html, &dom.stdout).map_err(|e| format!("{}: {e}", html.display()))?;
    let _ = std::fs::remove_dir_all(&profile);
    Ok((png, html))
}

/// Wipe size of the demo: bounded so it runs on a laptop; the policy says so.
pub const DEMO_WIPE: &str = "256 MiB";

/// The whole story, torn down before it returns (what it saw stays in [`FullDemo`]).
pub fn full(secs: f64) -> FullDemo {
    let mut demo = full_live(secs);
    demo.live = None;
    demo
}

/// The whole story, kept running until the returned [`FullDemo`] goes ([`FullDemo::hold`]).
pub fn full_live(secs: f64) -> FullDemo {
    use crate::epoch::{EpochFixture, Verifier, ids, wait_epoch, wipe_now, write_epoch_config};
    let net = Net::new("demo");
    let fx = EpochFixture::new(&net.dir, 8 << 20);
    // The demo wipes 256 MiB of this machine's RAM, not all of it: its verifier policy
    // accepts the rest as residue, and the table below shows how much that is.
    let mut v = Verifier::configure(&net, &fx.manifest, &fx.verifier_pub, "64 GiB");
    // The policy and the daemon's interval agree (see DEMO_MAX_WIPE_INTERVAL).
    let policy = std::fs::read_to_string(&v.config).unwrap_or_default();
    let policy = policy
        .lines()
        .map(|l| {
            if l.starts_with("max_wipe_interval =") {
                format!("max_wipe_interval = \"{DEMO_MAX_WIPE_INTERVAL}\"")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&v.config, policy + "\n").unwrap();
    // Every byte committed, and 16 offsets per direction of each epoch opened.
    v.extend_config("", "[policy.taps]\nrequired = true\nsamples = 16\n");
    let (rack, host) = ids(&net);
    v.enroll(&rack, &host, &fx.host_pub);
    v.start();
    let sections = fx
        .sections(&v.daemon_lines(), DEMO_WIPE_INTERVAL, DEMO_WIPE)
        .replace("backends = [\"host\"]", "backends = [\"host\", \"gpu\"]")
        + "\n[taps]\ninference = [\"tcp:8000\"]\nspool_limit = \"256 MiB\"\n";
    let cfg = write_epoch_config(&net, &sections);
    let sock = net.socket_path();
    let daemon = Daemon::start(&cfg, &sock);
    wait_epoch(
        &sock,
        std::time::Duration::from_secs(120),
        "the first epoch delivered",
        |e| e["delivery"]["delivered_seq"] == 0,
    );
    let report = traffic(&net, secs);
    // A second epoch, asked for by hand, carries the traffic's counters and its records.
    // `answered`: the samples the daemon must have answered by then (an idle epoch draws none).
    let epoch = |seq: u64, what: &str, answered: u64| {
        wipe_now(&sock);
        wait_epoch(&sock, std::time::Duration::from_secs(120), what, |e| {
            e["delivery"]["delivered_seq"] == seq
        });
        // The verifier sampled it; the daemon opens the records the sample landed in.
        wait_epoch(
            &sock,
            std::time::Duration::from_secs(120),
            "the epoch's sample answered",
            |e| {
                e["delivery"]["openings"]["answered"].as_u64() >= Some(answered)
                    && e["delivery"]["openings"]["pending"] == 0
            },
        )
    };
    epoch(1, "the second epoch delivered", 1);
    // The bundled model served on the inference port, seeded from the daemon's key: a third
    // epoch of completions only, so the sample lands in them.
    let model_dir = crate::serving::bundled_model();
    let key_file = sock
        .parent()
        .map(|d| d.join("sampling-key.json"))
        .unwrap_or_default();
    let server =
        crate::serving::serve_in(&net.rack_ns, &model_dir, key_file, 8000, DEMO_PROMPTS.len());
    let completions: Vec<Vec<u8>> = DEMO_PROMPTS
        .iter()
        .map(|p| crate::serving::ask(&net, 8000, crate::serving::completion_request(p, 48)))
        .collect();
    let _ = server.join();
    epoch(2, "the third epoch delivered", 2);
    // The verifier's replay service reruns the model over the opened exchanges; the fourth
    // statement's verdict judges what it found.
    let replayed = crate::serving::replay_pending(&v.database(), &model_dir);
    let status = epoch(3, "the fourth epoch delivered", 2);
    let replay = rackwarden_verifier::store::Store::connect(&v.database())
        .ok()
        .and_then(|s| s.replay(&rack, &host, 2).ok().flatten());
    let url = format!("{}/racks/{rack}", v.url());
    let page = PageShot {
        saved: shoot(&net.rack_ns, &url, "demo-rack"),
        url,
        ns: net.rack_ns.clone(),
    };
    FullDemo {
        page,
        traffic: report,
        history: v.history(&rack, &host),
        status,
        rack: v.get(&format!("/v1/racks/{rack}")).unwrap_or_default(),
        completions,
        replayed,
        replay,
        wipe_bytes: rackwarden::units::parse_size(DEMO_WIPE).unwrap_or(0),
        live: Some(Live {
            _daemon: daemon,
            daemon_config: cfg,
            verifier: v,
            _fixture: fx,
            _net: net,
        }),
    }
}

/// What the demo does once it has told its story.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Tear everything down now (tests, scripts, `--exit`).
    ExitNow,
    /// Keep the verifier and its page up, forwarded to this host's loopback, until Ctrl-C.
    UntilInterrupted,
}

impl Hold {
    /// `--exit`, or no terminal on stdin: exit at once; otherwise hold until Ctrl-C.
    pub fn from_args(args: &[String]) -> Hold {
        use std::io::IsTerminal as _;
        if args.iter().any(|a| a == "--exit") || !std::io::stdin().is_terminal() {
            Hold::ExitNow
        } else {
            Hold::UntilInterrupted
        }
    }
}

/// A TCP port on this host's loopback that forwards into the demo's rack namespace, where the
/// verifier listens (one thread per direction per connection; stops with the process).
pub struct Forward {
    pub port: u16,
    path: String,
}

impl Forward {
    /// The rack's page through the forward.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}{}", self.port, self.path)
    }
}

/// Copies one direction of a forwarded connection until either side closes.
fn pump(mut from: std::net::TcpStream, mut to: std::net::TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(std::net::Shutdown::Write);
}

fn forward_one(client: std::net::TcpStream, ns: &str, port: u16) -> std::io::Result<()> {
    // Connected from a thread inside the namespace; the socket stays there.
    let upstream = crate::in_netns(ns, move || {
        std::net::TcpStream::connect((crate::epoch::VERIFIER_ADDR, port))
    })?;
    let (c2, u2) = (client.try_clone()?, upstream.try_clone()?);
    std::thread::spawn(move || pump(client, upstream));
    std::thread::spawn(move || pump(u2, c2));
    Ok(())
}

/// Set by SIGINT while the demo holds.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

impl FullDemo {
    /// The verifier's and the daemon's config files (while the demo runs).
    pub fn configs(&self) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
        let live = self.live.as_ref()?;
        Some((live.verifier.config.clone(), live.daemon_config.clone()))
    }

    /// The CA the demo verifier's certificate chains to (while the demo runs).
    pub fn ca(&self) -> Option<std::path::PathBuf> {
        Some(self.live.as_ref()?.verifier.ca())
    }

    /// Forwards a port on this host's loopback to the verifier in the rack namespace, so the
    /// printed address opens in a browser here.
    pub fn forward(&self) -> std::io::Result<Forward> {
        let live = self.live.as_ref().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotConnected, "the demo was torn down")
        })?;
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        let (ns, upstream) = (live.verifier.ns.clone(), live.verifier.port);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                if let Err(e) = forward_one(conn, &ns, upstream) {
                    eprintln!("demo forward: {e}");
                }
            }
        });
        let path = self
            .page
            .url
            .split_once("://")
            .and_then(|(_, rest)| rest.find('/').map(|i| rest[i..].to_string()))
            .unwrap_or_else(|| "/".into());
        Ok(Forward { port, path })
    }

    /// Keeps the demo up until Ctrl-C (the verifier, its page forwarded to this host, the
    /// daemon and its epochs), or returns at once; everything is torn down when `self` goes.
    pub fn hold(self, how: Hold) {
        if how == Hold::ExitNow {
            return;
        }
        let fwd = match self.forward() {
            Ok(f) => f,
            Err(e) => {
                eprintln!("cannot forward the page to this host: {e}");
                return;
            }
        };
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
        println!(
            "\nthe demo keeps running: open {} (the certificate is the demo CA's: {});\nthe daemon's next epoch is due in {DEMO_WIPE_INTERVAL}. Ctrl-C ends the demo and removes everything.",
            fwd.url(),
            self.ca().unwrap_or_default().display()
        );
        while !INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        println!("\ninterrupted: stopping the daemon and the verifier, removing the namespaces");
    }

    /// Every statement affirming, both wipes bound to the verifier's nonce and complete,
    /// inference untouched, the bulk flow held to the cap.
    pub fn ok(&self) -> bool {
        let infer = &self.traffic.flows[0];
        let total: u64 = self
            .traffic
            .flows
            .iter()
            .map(|f| f.delivered_frame_bytes)
            .sum();
        self.history.len() == 4
            && self.page.saved.is_ok()
            && self.history.iter().all(|r| {
                let p = crate::epoch::predicate_of(r);
                r["status"] == "affirming"
                    && p["wipe"]["nonce"] == p["challenge"]["nonce"]
                    && p["wipe"]["devices"][0]["status"] == "complete"
            })
            && infer.delivered_frame_bytes == infer.offered_frame_bytes
            && total as f64 <= self.traffic.bound()
            && self.traffic_committed_and_opened()
            && self.replayed_and_passed()
    }

    /// The completions' epoch was sampled, its exchanges replayed, and every one passed.
    fn replayed_and_passed(&self) -> bool {
        let Some(r) = &self.replay else {
            return false;
        };
        let f = rackwarden_verifier::appraisal::replay::figures(
            r,
            rackwarden_sampler::DEFAULT_TOLERANCE,
        );
        f.generated >= 1
            && f.failed == 0
            && self
                .history
                .last()
                .is_some_and(|l| l["result"]["trustworthiness"]["replay"] == "affirming")
    }

    /// The served completions and what the replay made of them.
    fn render_replay(&self) -> String {
        let mut s = String::new();
        for c in &self.completions {
            let body = c.split(|b| *b == b'\n').next_back().unwrap_or_default();
            let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            s += &format!(
                "served: {:?} ({} tokens, seed {}..., key of epoch {})\n",
                v["choices"][0]["text"].as_str().unwrap_or("-"),
                v["usage"]["completion_tokens"],
                v["sampling"]["seed"]
                    .as_str()
                    .unwrap_or("-")
                    .get(..16)
                    .unwrap_or("-"),
                v["sampling"]["epoch"]
            );
        }
        match &self.replay {
            None => s += "the completions' epoch was not replayed (no exchange was sampled)\n",
            Some(r) => {
                let f = rackwarden_verifier::appraisal::replay::figures(
                    r,
                    rackwarden_sampler::DEFAULT_TOLERANCE,
                );
                s += &format!(
                    "seq {}: the verifier's replay service reran the model over the {} opened exchange(s): {} passed, {} failed; {} tokens, at most {:.2} covert bits at tolerance {}\n",
                    r.seq, f.replayed, f.generated, f.failed, f.tokens, f.covert_bits, f.tolerance
                );
            }
        }
        if let Some(l) = self.history.last() {
            s += &format!(
                "seq {}'s verdict, replay aspect: {}\n",
                l["seq"],
                l["result"]["trustworthiness"]["replay"]
                    .as_str()
                    .unwrap_or("not in play")
            );
        }
        s
    }

    /// The bulk flow's statement (seq 1) commits every byte its policer passed, and a sample of it was
    /// opened and matched.
    fn traffic_committed_and_opened(&self) -> bool {
        let Some(last) = self.history.get(1) else {
            return false;
        };
        let t = &crate::epoch::predicate_of(last)["traffic"];
        let o = &self.status["epoch"]["delivery"]["openings"];
        t["state"] == "committed"
            && t["summary"]["unaccounted"] == serde_json::json!({"egress": 0, "ingress": 0})
            && o["answered"].as_u64() >= Some(1)
            && o["last_failure"].is_null()
    }

    /// Inference overhead computed as the rack page's scorecard does: scheduled epochs'
    /// downtime over their wipe interval, forced ones' over their time since the previous
    /// epoch (end − start).
    fn overhead_as_the_page_counts_it(&self) -> String {
        let mut sums = [(0usize, 0u64, 0u64); 2]; // [scheduled, forced]: (epochs, down, time)
        for r in &self.history {
            let p = crate::epoch::predicate_of(r);
            let time = p["epoch_end_unix_ms"]
                .as_u64()
                .unwrap_or(0)
                .saturating_sub(p["epoch_start_unix_ms"].as_u64().unwrap_or(0));
            let forced = matches!(
                p["epoch"]["trigger"].as_str(),
                Some("wipe_now" | "after_interruption")
            );
            let time = if forced {
                time
            } else {
                p["epoch"]["wipe_interval_ms"].as_u64().unwrap_or(time)
            };
            let (Some(down), true) = (p["epoch"]["downtime_ms"].as_u64(), time > 0) else {
                continue;
            };
            let e = &mut sums[usize::from(forced)];
            *e = (e.0 + 1, e.1 + down, e.2 + time);
        }
        let line = |(n, down, time): (usize, u64, u64)| {
            if n == 0 {
                "none in the window".to_string()
            } else {
                let d = rackwarden::units::fmt_duration(std::time::Duration::from_millis(down));
                let t = rackwarden::units::fmt_duration(std::time::Duration::from_millis(time));
                format!(
                    "{n} epoch(s), {d} of {t} = {:.3}%",
                    100.0 * down as f64 / time as f64
                )
            }
        };
        format!(
            "\ninference overhead as the rack's page counts it: scheduled {}; forced (wipe-now, interruptions) {}\n",
            line(sums[0]),
            line(sums[1])
        )
    }

    /// The bulk flow's epoch (seq 1): its traffic commitment and what became of its sample.
    fn render_traffic(&self) -> String {
        let Some(last) = self.history.get(1) else {
            return "no statement\n".into();
        };
        let t = &crate::epoch::predicate_of(last)["traffic"];
        let sm = &t["summary"];
        let o = &self.status["epoch"]["delivery"]["openings"];
        let mut s = format!(
            "seq {}: {} records commit {} egress and {} ingress bytes (the kernel passed {} and {}; unaccounted {} and {}), root {}\n",
            last["seq"],
            sm["root"]["records"],
            sm["root"]["bytes"]["egress"],
            sm["root"]["bytes"]["ingress"],
            sm["passed"]["egress"],
            sm["passed"]["ingress"],
            sm["unaccounted"]["egress"],
            sm["unaccounted"]["ingress"],
            sm["root"]["sha3_256"].as_str().unwrap_or("-")
        );
        s += &format!(
            "the verifier drew 16 offsets per direction after storing the root; the daemon opened the records they landed in: {} answer(s) acknowledged{}\n",
            o["answered"],
            match o["last_failure"].as_str() {
                Some(f) => format!(", LAST FAILURE: {f}"),
                None => ", every one matched its leaf and path".into(),
            }
        );
        s += "the UDP flows are raw-flow records: their peers are not in the policy's allowed_raw_flows, so the\nsample's judgement at its deadline (10 min) finds traffic_flow_not_allowed for those it opened.\n";
        s
    }

    pub fn render(&self) -> String {
        use rackwarden::units::ByteSize;
        let mut s = String::new();
        s += "== 1. the limiter: inference beside a bulk flow ==\n";
        s += &self.traffic.render();
        s += "\n== 2. epochs: challenge, drain, wipe, image check, restart, sign, deliver ==\n";
        for r in &self.history {
            s += &render_statement(r);
        }
        s += &self.overhead_as_the_page_counts_it();
        s += "\n== 3. taps: every byte committed, a sample opened ==\n";
        s += &self.render_traffic();
        s += "\n== 4. replay: the bundled model served, the sampled exchanges rerun at the verifier ==\n";
        s += &self.render_replay();
        s += &format!(
            "\nthe demo policy accepts a bounded {} host wipe (max_residue_host 64 GiB); a production\npolicy sets a few GiB and the daemon wipes all it safely can.\n",
            ByteSize(self.wipe_bytes)
        );
        s += &format!(
            "\nrack standing at the verifier: {}\n",
            self.rack["status"].as_str().unwrap_or("-").to_uppercase()
        );
        s += &format!(
            "the rack's page: {} (inside namespace {}; while the demo holds, forwarded to this host)\n",
            self.page.url, self.page.ns
        );
        match &self.page.saved {
            Ok((png, html)) => {
                s += &format!(
                    "  screenshot {}\n  its HTML   {}\n",
                    png.display(),
                    html.display()
                )
            }
            Err(e) => s += &format!("  no screenshot: {e}\n"),
        }
        let e = &self.status["epoch"];
        s += &format!(
            "daemon: delivered up to seq {}, backlog {}, next epoch at {}\n",
            e["delivery"]["delivered_seq"],
            e["delivery"]["backlog"],
            e["state"]["next_at_ms"]
                .as_u64()
                .map(rackwarden::units::fmt_unix_ms)
                .unwrap_or_else(|| "-".into())
        );
        s
    }
}

/// One delivered statement of the demo: its epoch, wipe, images and verdict.
fn render_statement(r: &serde_json::Value) -> String {
    use rackwarden::units::{ByteSize, fmt_duration};
    use std::time::Duration;
    let ms = |v: &serde_json::Value| fmt_duration(Duration::from_millis(v.as_u64().unwrap_or(0)));
    let mut s = String::new();
    let p = crate::epoch::predicate_of(r);
    let run = &p["epoch"];
    s += &format!(
        "\nstatement seq {} ({}), verifier nonce {}..., verdict: {}\n",
        p["seq"],
        run["trigger"].as_str().unwrap_or("-"),
        &p["challenge"]["nonce"].as_str().unwrap_or("UNCHALLENGED")[..16.min(
            p["challenge"]["nonce"]
                .as_str()
                .unwrap_or("UNCHALLENGED")
                .len()
        )],
        r["status"].as_str().unwrap_or("-").to_uppercase()
    );
    let phases: Vec<String> = run["phases"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| format!("{} {}", x["phase"].as_str().unwrap_or(""), ms(&x["ms"])))
                .collect()
        })
        .unwrap_or_default();
    s += &format!("  phases: {}\n", phases.join(", "));
    s += &match run["trigger"].as_str() {
        Some(t @ ("wipe_now" | "after_interruption")) => format!(
            "  inference downtime {}, forced by {}: not the schedule's cost (the page counts it apart); workloads {}\n",
            ms(&run["downtime_ms"]),
            if t == "wipe_now" {
                "wipe-now"
            } else {
                "an interruption"
            },
            run["workloads"]["state"].as_str().unwrap_or("-")
        ),
        _ => format!(
            "  inference downtime {} of a {} interval = {:.4}% (scheduled); workloads {}\n",
            ms(&run["downtime_ms"]),
            ms(&run["wipe_interval_ms"]),
            100.0 * run["downtime_ms"].as_f64().unwrap_or(0.0)
                / run["wipe_interval_ms"].as_f64().unwrap_or(1.0),
            run["workloads"]["state"].as_str().unwrap_or("-")
        ),
    };
    s += &format!(
        "  {:<14} {:<10} {:>14} {:>14} {:>10} {:>16}\n",
        "wipe device", "status", "total", "verified", "mismatch", "residue"
    );
    for d in p["wipe"]["devices"].as_array().into_iter().flatten() {
        s += &format!(
            "  {:<14} {:<10} {:>14} {:>14} {:>10} {:>16}\n",
            d["device"].as_str().unwrap_or(""),
            d["status"].as_str().unwrap_or(""),
            ByteSize(d["bytes_total"].as_u64().unwrap_or(0)).to_string(),
            ByteSize(d["bytes_verified"].as_u64().unwrap_or(0)).to_string(),
            d["mismatches"].as_u64().unwrap_or(0),
            ByteSize(d["residue_bytes"].as_u64().unwrap_or(0)).to_string(),
        );
        if let Some(x) = d["detail"].as_str()
            && d["status"] != "complete"
        {
            s += &format!("    {x}\n");
        }
    }
    for i in p["images"]["images"].as_array().into_iter().flatten() {
        s += &format!(
            "  image {:<22} {:>10} B  merkle_sha3_256 {}...  {}\n",
            i["name"].as_str().unwrap_or(""),
            i["size"],
            &i["merkle_sha3_256"].as_str().unwrap_or("")
                [..16.min(i["merkle_sha3_256"].as_str().unwrap_or("").len())],
            if i["ok"] == true {
                "verified"
            } else {
                "REFUSED"
            }
        );
    }
    let findings: Vec<String> = r["result"]["findings"]
        .as_array()
        .map(|f| {
            f.iter()
                .map(|x| {
                    format!(
                        "{} ({})",
                        x["code"].as_str().unwrap_or(""),
                        x["severity"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    s += &format!(
        "  verifier findings: {}\n",
        if findings.is_empty() {
            "none".to_string()
        } else {
            findings.join(", ")
        }
    );
    s
}
