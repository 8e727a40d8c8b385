//! `cargo xtask bench [limiter]`: each measurement runs next to its anchor in the same run and
//! prints the ratio; absolute numbers on these shared machines are not comparable across runs.

use std::{
    net::SocketAddr,
    os::fd::{AsFd, AsRawFd},
    process::Command,
    time::Duration,
};

use rackwarden::{
    config::CapSpec,
    limiter::{Direction, HookDirection, Limiter, maps::CapSlot},
    pins::PinPaths,
};
use rackwarden_tests::{
    benchstats::{BpfStatsOn, Bracketed, median},
    *,
};

fn main() {
    let what: Vec<String> = std::env::args().skip(1).collect();
    let all = what.is_empty();
    if all || what.iter().any(|w| w == "attest") {
        bench_attest();
    }
    if all || what.iter().any(|w| w == "images") {
        bench_images();
    }
    if all || what.iter().any(|w| w == "wipe") {
        bench_wipe();
    }
    if all || what.iter().any(|w| w == "verifier") {
        bench_verifier();
    }
    if all || what.iter().any(|w| w == "verifier" || w == "page") {
        bench_page();
    }
    if all || what.iter().any(|w| w == "limiter") {
        bench_limiter();
    } else {
        if what.iter().any(|w| w == "classifier") {
            classifier_ns_per_packet();
        }
        if what.iter().any(|w| w == "veth") {
            veth_throughput_overhead();
        }
    }
    if all || what.iter().any(|w| w == "epoch") {
        bench_epoch();
    }
    if all || what.iter().any(|w| w == "taps") {
        bench_taps();
    }
    if all || what.iter().any(|w| w == "replay") {
        rackwarden_tests::replaybench::bench_replay();
    }
    if all || what.iter().any(|w| w == "tpm") {
        rackwarden_tests::tpmbench::bench_tpm();
    }
    if all || what.iter().any(|w| w == "watch") {
        rackwarden_tests::watchbench::bench_watch();
    }
    if all || what.iter().any(|w| w == "bypass") {
        println!("== bench bypass: bytes crossing a 1 MB/s cap in 3 s, per path ==");
        print!(
            "{}",
            rackwarden_tests::redteam::render(&rackwarden_tests::redteam::run())
        );
    }
}

// ---- epoch: the daemon's own epoch, phase by phase, vs the same steps as CLI commands ----

fn bench_epoch() {
    use rackwarden_tests::epoch::*;
    use std::time::Instant;
    const ROUNDS: usize = 5;
    const WIPE: &str = "1 GiB";
    let image_bytes = 64usize << 20;
    println!(
        "== bench epoch: {WIPE} host wipe + {} MiB image set, {ROUNDS} alternating rounds, medians ==",
        image_bytes >> 20
    );
    let net = Net::new("bep");
    let fx = EpochFixture::new(&net.dir, image_bytes);
    let mut v = Verifier::configure(&net, &fx.manifest, &fx.verifier_pub, "64 GiB");
    let (rack, host) = ids(&net);
    v.enroll(&rack, &host, &fx.host_pub);
    v.start();
    // The default interval: the overhead figure is downtime / 15 min.
    let cfg = write_epoch_config(&net, &fx.sections(&v.daemon_lines(), "15 min", WIPE));
    let sock = net.socket_path();
    let _d = Daemon::start(&cfg, &sock);
    wait_epoch(&sock, Duration::from_secs(300), "the startup epoch", |e| {
        e["delivery"]["delivered_seq"] == 0
    });
    let cli_log = net.dir.join("cli-evidence.jsonl");
    let cli = |args: &[&str]| {
        let t = Instant::now();
        let out = Command::new(bin("rackwarden")).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        t.elapsed().as_secs_f64() * 1e3
    };
    let phases = ["challenge", "drain", "wipe", "stage", "restart", "sign"];
    let mut per_phase: Vec<Vec<f64>> = vec![vec![]; phases.len()];
    let (mut total, mut downtime, mut cli_total, mut cli_wipe, mut cli_stage, mut cli_attest) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for round in 1..=ROUNDS {
        // Ours: one epoch asked for by wipe-now, timed by the daemon itself.
        wipe_now(&sock);
        let st = wait_epoch(&sock, Duration::from_secs(300), "an epoch", |e| {
            e["delivery"]["delivered_seq"] == round as u64
        });
        let last = &st["epoch"]["last_epoch"];
        let mut sum = 0.0;
        for p in last["phases"].as_array().unwrap() {
            let i = phases.iter().position(|x| *x == p["phase"]).unwrap();
            let ms = p["ms"].as_f64().unwrap();
            per_phase[i].push(ms);
            sum += ms;
        }
        total.push(sum);
        downtime.push(last["downtime_ms"].as_f64().unwrap());
        // Anchor: the same steps as separate commands, each a fresh process.
        let nonce = "5a".repeat(32);
        let w = cli(&[
            "wipe",
            "--backend",
            "host",
            "--max-bytes",
            WIPE,
            "--nonce",
            &nonce,
            "--json",
        ]);
        let staging = net.dir.join("cli-staging");
        let s = cli(&[
            "image",
            "stage",
            "--manifest",
            fx.manifest.to_str().unwrap(),
            "--key",
            fx.verifier_pub.to_str().unwrap(),
            "--source",
            fx.images.to_str().unwrap(),
            "--staging",
            staging.to_str().unwrap(),
        ]);
        let a = cli(&[
            "--config",
            cfg.to_str().unwrap(),
            "attest",
            "--key",
            fx.host_key.to_str().unwrap(),
            "--log",
            cli_log.to_str().unwrap(),
            "--nonce",
            &nonce,
        ]);
        cli_wipe.push(w);
        cli_stage.push(s);
        cli_attest.push(a);
        cli_total.push(w + s + a);
    }
    println!("{:<12} {:>12}", "phase", "median ms");
    for (i, p) in phases.iter().enumerate() {
        println!("{p:<12} {:>12.1}", median(&mut per_phase[i]));
    }
    let (t, c) = (median(&mut total), median(&mut cli_total));
    println!(
        "epoch, all phases: {t:.1} ms; the same steps as CLI commands (wipe {:.1} + image stage {:.1} + attest {:.1}): {c:.1} ms; ratio {:.3}",
        median(&mut cli_wipe),
        median(&mut cli_stage),
        median(&mut cli_attest),
        t / c
    );
    let d = median(&mut downtime);
    println!(
        "inference downtime per epoch (drain start to restart end): {d:.1} ms; overhead at the default 15 min interval: {:.4}% ({:.2e})",
        100.0 * d / 900_000.0,
        d / 900_000.0
    );
}

// ---- verifier: statements ingested per second over HTTPS vs raw signature verification ----

/// A CA and server certificate for 127.0.0.1 from `rackwarden-verifier tls-init`; the CA PEM.
fn bench_tls(dir: &std::path::Path) -> Vec<u8> {
    rackwarden_tests::tls_init("127.0.0.1", &dir.join("tls"));
    std::fs::read(dir.join("tls/ca.pem")).unwrap()
}

/// One statement's signed bytes for the raw-verify anchor: key, PAE and signature.
type SignedPae = (
    ed25519_dalek::VerifyingKey,
    Vec<u8>,
    ed25519_dalek::Signature,
);

/// Which database a benchmark's verifier stores in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "SQLite",
            Backend::Postgres => "PostgreSQL",
        }
    }

    /// A new, empty database in `dir` (SQLite) or on the run's PostgreSQL server, and the
    /// `log_key` line a server needs.
    fn fresh(self, dir: &std::path::Path) -> (String, String) {
        use rackwarden_verifier::store::testing;
        match self {
            Backend::Sqlite => (dir.join("v.sqlite").display().to_string(), String::new()),
            Backend::Postgres => {
                let url = testing::fresh_database("bench", &dir.join("unused.sqlite"))
                    .unwrap_or_else(|e| panic!("a database on the PostgreSQL server: {e}"));
                (
                    url.config_text(),
                    format!("log_key = \"{}\"\n", dir.join("tlog.key").display()),
                )
            }
        }
    }
}

/// Whether this run has a PostgreSQL server (`cargo xtask bench` starts one); without one
/// the PostgreSQL rows say SKIP and why.
fn postgres_available(what: &str) -> bool {
    let have = rackwarden_verifier::store::testing::postgres_server().is_some();
    if !have {
        println!(
            "SKIP {what} on PostgreSQL: {} is not set (cargo xtask bench starts a server)",
            rackwarden_verifier::store::testing::POSTGRES_ENV
        );
    }
    have
}

fn bench_verifier() {
    let hosts = 100usize;
    let per_host = 100usize;
    let batch = 50usize;
    let clients = 8usize;
    // The arms alternate in each round and medians are reported: this machine is noisy.
    const ROUNDS: usize = 3;
    println!(
        "== bench verifier: {} statements from {hosts} hosts, batches of {batch}, {clients} concurrent clients, TLS on loopback, medians of {ROUNDS} alternating rounds ==",
        hosts * per_host
    );
    let pg = postgres_available("ingest");
    let mut arms: Vec<(Backend, usize)> = vec![(Backend::Sqlite, 1), (Backend::Sqlite, 2)];
    if pg {
        arms.extend([(Backend::Postgres, 1), (Backend::Postgres, 2)]);
    }
    let mut raw = Vec::new();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); arms.len()];
    for _ in 0..ROUNDS {
        for (i, (backend, instances)) in arms.iter().enumerate() {
            let (raw1, rate) = ingest_rate(*backend, *instances, hosts, per_host, batch, clients);
            raw.push(raw1);
            rates[i].push(rate);
        }
    }
    let raw1 = median(&mut raw);
    let medians: Vec<f64> = rates.iter_mut().map(|r| median(r)).collect();
    print_verifier_report(raw1, medians[0]);
    for (i, (backend, instances)) in arms.iter().enumerate().skip(1) {
        println!(
            "{:<60} {:>12.0} /s  ratio to one instance on SQLite: {:.3}",
            format!(
                "{instances} instance{} on one {} database",
                if *instances == 1 { "" } else { "s" },
                backend.name()
            ),
            medians[i],
            medians[i] / medians[0]
        );
    }
}

/// Ingest throughput over TLS with `instances` verifier processes on one fresh database of
/// `backend`; also the anchor, raw `verify_strict` of the same PAE bytes on one core.
fn ingest_rate(
    backend: Backend,
    instances: usize,
    hosts: usize,
    per_host: usize,
    batch: usize,
    clients: usize,
) -> (f64, f64) {
    use std::time::Instant;
    let dir = std::env::temp_dir().join(format!(
        "rw-bench-verifier-{}-{instances}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let ca = bench_tls(&dir);
    let db = backend.fresh(&dir);
    let ports: Vec<u16> = (0..instances).map(|_| free_port()).collect();
    let configs: Vec<std::path::PathBuf> = ports
        .iter()
        .map(|p| {
            let c = dir.join(format!("verifier-{p}.toml"));
            write_bench_verifier_config(&dir, &c, *p, &db);
            c
        })
        .collect();
    // Enroll and pre-sign everything before the clock starts.
    let (bodies, paes) = enroll_and_presign(&configs[0], hosts, per_host, batch);
    let t = Instant::now();
    for (vk, pae, sig) in &paes {
        vk.verify_strict(pae, sig).unwrap();
    }
    let raw1 = paes.len() as f64 / t.elapsed().as_secs_f64();
    let mut servers: Vec<_> = configs
        .iter()
        .map(|c| {
            Command::new(bin("rackwarden-verifier"))
                .arg("--config")
                .arg(c)
                .arg("serve")
                .env("RUST_LOG", "warn")
                .spawn()
                .unwrap()
        })
        .collect();
    for p in &ports {
        while std::net::TcpStream::connect(("127.0.0.1", *p)).is_err() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // Hosts are split between clients so each host's chain arrives in order; client k
    // talks to instance k mod instances.
    let mut per_client: Vec<Vec<Vec<u8>>> = vec![Vec::new(); clients];
    let per_host_batches = per_host.div_ceil(batch);
    for (i, b) in bodies.into_iter().enumerate() {
        per_client[(i / per_host_batches) % clients].push(b);
    }
    let urls: Vec<String> = (0..clients)
        .map(|k| format!("https://127.0.0.1:{}/v1/statements", ports[k % instances]))
        .collect();
    let t = Instant::now();
    let accepted = post_concurrently(per_client, &urls, &ca);
    let rate = accepted as f64 / t.elapsed().as_secs_f64();
    for s in &mut servers {
        let _ = s.kill();
        let _ = s.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        accepted,
        hosts * per_host,
        "every statement must be accepted"
    );
    (raw1, rate)
}

/// The verifier's config: TLS from `bench_tls`, the database `db` made (its URL or path,
/// and its `log_key` line), one rack with room for every statement of the run.
fn write_bench_verifier_config(
    dir: &std::path::Path,
    config: &std::path::Path,
    port: u16,
    db: &(String, String),
) {
    std::fs::write(config, format!("listen = \"127.0.0.1:{port}\"\ntls_cert = \"{tls}/server.pem\"\ntls_key = \"{tls}/server.key\"\ndatabase = \"{}\"\n{}max_body = \"16 MiB\"\n[policy]\nmin_root_of_trust = \"none\"\nid = \"bench\"\nnonce_ttl = \"10 min\"\nmax_clock_skew = \"8760 h\"\nmax_wipe_interval = \"1 h\"\nmax_residue_host = \"2 GiB\"\nmax_residue_gpu = \"1 GiB\"\ntrainable_state = \"10 TB\"\nmax_epoch_fraction = 0.01\n[racks.rack-a17]\negress = \"1 GB/s\"\ningress = \"1 GB/s\"\n", db.0, db.1, tls = dir.join("tls").display())).unwrap();
}

/// Enrolls `hosts` hosts in the verifier's store (the server is not running yet) and signs
/// `per_host` chained statements for each: the request bodies, `batch` envelopes each, and
/// every statement's PAE with its signature for the anchor.
fn enroll_and_presign(
    config: &std::path::Path,
    hosts: usize,
    per_host: usize,
    batch: usize,
) -> (Vec<Vec<u8>>, Vec<SignedPae>) {
    use rackwarden_attest::{dsse, keys, statement::*};
    let mut bodies: Vec<Vec<u8>> = Vec::new();
    let mut paes: Vec<SignedPae> = Vec::new();
    let cfg = rackwarden_verifier::config::VerifierConfig::load(config).unwrap();
    let store = rackwarden_verifier::store::Store::connect(&cfg.database).unwrap();
    let mut v = rackwarden_verifier::service::Verifier::new(store, cfg.policy).unwrap();
    let mut per_host_lines: Vec<Vec<Vec<u8>>> = Vec::new();
    for h in 0..hosts {
        let key = keys::generate();
        let host = format!("host-{h:03}");
        v.enroll(
            "rack-a17",
            &host,
            &keys::public_pem(&key.verifying_key()),
            0,
        )
        .unwrap();
        let mut prev = GENESIS_PREV.to_string();
        let mut lines = Vec::new();
        for seq in 0..per_host as u64 {
            let mut p = sample_predicate(seq, prev);
            p.host_id = host.clone();
            let st = Statement::new(vec![], p);
            let body = st.to_json().unwrap();
            let pae = dsse::pae(dsse::INTOTO_PAYLOAD_TYPE, &body);
            prev = hex::encode(rackwarden_attest::sha3(&pae));
            let env = dsse::sign(&key, dsse::INTOTO_PAYLOAD_TYPE, &body);
            use ed25519_dalek::Signer as _;
            paes.push((key.verifying_key(), pae.clone(), key.sign(&pae)));
            lines.push(env.to_json().unwrap());
        }
        per_host_lines.push(lines);
    }
    // Batches keep each host's statements in order (one host per batch).
    for lines in per_host_lines {
        for chunk in lines.chunks(batch) {
            let mut b = b"[".to_vec();
            b.extend(chunk.join(&b","[..]));
            b.push(b']');
            bodies.push(b);
        }
    }
    (bodies, paes)
}

/// Posts each client's bodies in order, the clients concurrently; the statements accepted.
/// Posts each client's bodies in order on its own kept-alive connection to `urls[client]`;
/// the number of statements accepted.
fn post_concurrently(per_client: Vec<Vec<Vec<u8>>>, urls: &[String], ca: &[u8]) -> usize {
    let handles: Vec<_> = per_client
        .into_iter()
        .zip(urls.iter().cycle())
        .map(|(bs, url)| {
            let url = url.clone();
            let ca = ca.to_vec();
            std::thread::spawn(move || {
                // One connection per client, kept alive: the handshake is paid once.
                let c = reqwest::blocking::Client::builder()
                    .tls_built_in_root_certs(false)
                    .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
                    .build()
                    .unwrap();
                let mut ok = 0usize;
                for b in bs {
                    let v: serde_json::Value = c
                        .post(&url)
                        .header("Content-Type", "application/json")
                        .body(b)
                        .send()
                        .unwrap()
                        .json()
                        .unwrap();
                    ok += v["results"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter(|r| r["status"] == "accepted")
                        .count();
                }
                ok
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).sum()
}

fn print_verifier_report(raw1: f64, rate: f64) {
    println!(
        "{:<60} {:>12.0} /s",
        "anchor: raw ed25519 verify_strict, one core", raw1
    );
    println!(
        "{:<60} {:>12.0} /s",
        "verifier over HTTPS: checked, chained, policy, fsynced", rate
    );
    println!(
        "ratio verifier / raw single-core verify: {:.3}; target >= 5000/s: {}",
        rate / raw1,
        if rate >= 5000.0 { "met" } else { "NOT met" }
    );
}

// ---- page: the rack page of 64 hosts x 1,000 epochs vs decoding the rows it reads ----

fn bench_page() {
    bench_page_on(Backend::Sqlite);
    if postgres_available("the rack page") {
        bench_page_on(Backend::Postgres);
    }
}

fn bench_page_on(backend: Backend) {
    use rackwarden_attest::{dsse, keys, statement::*};
    use std::time::Instant;
    let (hosts, epochs) = (64usize, 1000u64);
    // Anchor and page alternate in each round and medians are reported: this machine is
    // noisy, and whichever ran alone would take the other's share of it.
    const ROUNDS: usize = 7;
    println!(
        "== bench page on {}: rack of {hosts} hosts x {epochs} epochs, one core, medians of {ROUNDS} alternating rounds ==",
        backend.name()
    );
    let dir = std::env::temp_dir().join(format!("rw-bench-page-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("verifier.toml");
    let db = backend.fresh(&dir);
    std::fs::write(&config, format!("listen = \"127.0.0.1:1\"\ninsecure_http = true\ndatabase = \"{}\"\n{}[policy]\nmin_root_of_trust = \"none\"\nid = \"bench\"\nnonce_ttl = \"10 min\"\nmax_clock_skew = \"8760 h\"\nmax_wipe_interval = \"1 h\"\nmax_residue_host = \"2 GiB\"\nmax_residue_gpu = \"1 GiB\"\ntrainable_state = \"10 TB\"\nmax_epoch_fraction = 0.01\n[racks.rack-a17]\negress = \"1 GB/s\"\ningress = \"1 GB/s\"\n", db.0, db.1)).unwrap();
    let cfg = rackwarden_verifier::config::VerifierConfig::load(&config).unwrap();
    let store = rackwarden_verifier::store::Store::connect(&cfg.database).unwrap();
    let mut v = rackwarden_verifier::service::Verifier::new(store, cfg.policy).unwrap();
    let t = Instant::now();
    for h in 0..hosts {
        let key = keys::generate();
        let host = format!("host-{h:03}");
        v.enroll(
            "rack-a17",
            &host,
            &keys::public_pem(&key.verifying_key()),
            0,
        )
        .unwrap();
        let mut prev = GENESIS_PREV.to_string();
        // One transaction per host, as a batch is stored.
        v.in_transaction(|v| {
            for seq in 0..epochs {
                let mut p = sample_predicate(seq, prev);
                p.host_id = host.clone();
                if let rackwarden_attest::evidence::LimiterReport::Present(e) = &mut p.limiter {
                    for c in &mut e.counters {
                        c.counters.passed_bytes = seq * 1_000_000;
                    }
                }
                p.epoch = Some(rackwarden_attest::evidence::EpochRun {
                    trigger: rackwarden_attest::evidence::EpochTrigger::Interval,
                    wipe_interval_ms: 900_000,
                    phases: vec![],
                    workloads: rackwarden_attest::evidence::WorkloadOutcome::Restarted,
                    downtime_ms: 4_000 + seq % 7,
                });
                let body = Statement::new(vec![], p).to_json().unwrap();
                prev = hex::encode(rackwarden_attest::sha3(&dsse::pae(
                    dsse::INTOTO_PAYLOAD_TYPE,
                    &body,
                )));
                let env = dsse::sign(&key, dsse::INTOTO_PAYLOAD_TYPE, &body)
                    .to_json()
                    .unwrap();
                v.ingest(&env, 1_796_000_000_000 + (seq + 1) * 900_000)?;
            }
            Ok(())
        })
        .unwrap();
    }
    println!(
        "  ({} statements stored in {:.1} s)",
        hosts as u64 * epochs,
        t.elapsed().as_secs_f64()
    );
    let now = 1_796_000_000_000 + (epochs + 1) * 900_000;
    for window in [rackwarden_verifier::page::view::DEFAULT_WINDOW, 1000] {
        // Anchor: read and decode the rows the page reads, nothing else.
        let mut anchor = Vec::new();
        let mut page = Vec::new();
        let (mut standing, mut gather) = (Vec::new(), Vec::new());
        let mut bytes = 0;
        for _ in 0..ROUNDS {
            let t = Instant::now();
            let mut n = 0;
            for h in 0..hosts {
                for r in v
                    .store
                    .history("rack-a17", &format!("host-{h:03}"), window + 1)
                    .unwrap()
                {
                    n += r.statement().is_some() as usize;
                }
            }
            assert_eq!(n, hosts * (window as usize + 1).min(epochs as usize));
            anchor.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            v.rack_standing("rack-a17", now).unwrap();
            standing.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let view = v.rack_view("rack-a17", now, window).unwrap();
            gather.push(t.elapsed().as_secs_f64());
            let html = rackwarden_verifier::page::render::rack(&view).into_string();
            page.push(t.elapsed().as_secs_f64());
            bytes = html.len();
        }
        let (a, p) = (median(&mut anchor), median(&mut page));
        println!(
            "{:<60} {:>9.1} ms",
            format!(
                "anchor: read + decode {} rows",
                hosts * (window as usize + 1)
            ),
            a * 1e3
        );
        println!(
            "{:<60} {:>9.1} ms",
            format!(
                "rack page, {window} epochs per host ({} KiB of HTML)",
                bytes / 1024
            ),
            p * 1e3
        );
        println!(
            "  of which: standing {:.1} ms, gathering {:.1} ms (standing included)",
            median(&mut standing) * 1e3,
            median(&mut gather) * 1e3
        );
        println!("ratio page / anchor: {:.2}", p / a);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- wipe: fill + verify of host RAM vs memset + memcmp, and the stream alone ----

fn bench_wipe() {
    use rackwarden::wipe::{self, Backend, WipeRequest, host, stream::KeyedStream};
    use std::{sync::atomic::AtomicBool, time::Instant};
    let bytes: u64 = 4 << 30;
    let threads = rackwarden_attest::merkle::default_threads();
    println!(
        "== bench wipe: {} GiB of host RAM, {threads} threads, fresh mappings for both ==",
        bytes >> 30
    );
    // Anchor and ours alternate: whichever runs first on a cold machine pays for page faults
    // and huge-page compaction that the other then reuses.
    let req = WipeRequest {
        nonce: [7u8; 32],
        backends: vec![Backend::Host],
        max_bytes: Some(bytes),
        reserve_bytes: 1 << 30,
        scratch_paths: vec![],
        threads,
        progress: None,
        corrupt_byte_for_test: None,
    };
    // Alternating pairs; the medians are reported (this shared machine has outliers).
    let rounds: usize = std::env::var("RW_BENCH_WIPE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let mut pairs = Vec::new();
    for _ in 0..rounds {
        let (af, av, bad) = host::anchor_memset_memcmp(bytes, threads);
        assert_eq!(bad, 0);
        let d = wipe::run(&req, &AtomicBool::new(false)).devices.remove(0);
        assert_eq!((d.bytes_verified, d.mismatches), (bytes, 0), "{d:?}");
        pairs.push((af, av, d));
    }
    for (i, (f, v, d)) in pairs.iter().enumerate() {
        println!(
            "pair {i}: anchor {f}+{v} ms, ours {}+{} ms",
            d.fill_ms, d.verify_ms
        );
    }
    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let af = median(pairs.iter().map(|p| p.0).collect());
    let av = median(pairs.iter().map(|p| p.1).collect());
    let mut d = pairs[0].2.clone();
    d.fill_ms = median(pairs.iter().map(|p| p.2.fill_ms).collect());
    d.verify_ms = median(pairs.iter().map(|p| p.2.verify_ms).collect());
    println!("medians of {rounds} pairs:");
    let gbps = |b: u64, ms: u64| b as f64 / ms.max(1) as f64 / 1e6;
    println!(
        "{:<44} {:>10} {:>10} {:>14}",
        "", "fill GB/s", "check GB/s", "fill+check GB/s"
    );
    println!(
        "{:<44} {:>10.2} {:>10.2} {:>14.2}",
        "anchor: memset + memcmp",
        gbps(bytes, af),
        gbps(bytes, av),
        gbps(2 * bytes, af + av)
    );
    println!(
        "{:<44} {:>10.2} {:>10.2} {:>14.2}",
        "rackwarden keyed fill + verify",
        gbps(bytes, d.fill_ms),
        gbps(bytes, d.verify_ms),
        gbps(2 * bytes, d.fill_ms + d.verify_ms)
    );
    println!(
        "ratio (fill+verify) / (memset+memcmp): {:.3} (target >= 0.7)",
        (af + av) as f64 / (d.fill_ms + d.verify_ms).max(1) as f64
    );
    // The stream alone, one core, in cache.
    let s = KeyedStream::new(&[7u8; 32], "host-ram");
    let mut buf = vec![0u8; 1 << 20];
    let n = 2048u64;
    let t = Instant::now();
    for i in 0..n {
        s.fill(i << 20, &mut buf);
    }
    let fill_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut bad = 0;
    for i in 0..n {
        bad += s.count_mismatches((n - 1) << 20, &buf);
        std::hint::black_box(i);
    }
    assert_eq!(bad, 0);
    println!(
        "keyed stream alone, one core, in cache ({:?} path): generate {:.2} GB/s, check {:.2} GB/s",
        s.simd(),
        (n << 20) as f64 / fill_s / 1e9,
        (n << 20) as f64 / t.elapsed().as_secs_f64() / 1e9
    );
    bench_wipe_gpu(rounds);
}

/// The GPU part of `bench wipe`: over the same allocations (all the memory the driver
/// gives), `cuMemsetD32` + a compare kernel as the anchor, against our fill + verify
/// kernels; alternating rounds, medians.
fn bench_wipe_gpu(rounds: usize) {
    use rackwarden::wipe::{gpu, stream::KeyedStream};
    use std::{sync::atomic::AtomicBool, time::Instant};
    let (cuda, d) = match rackwarden_tests::gpu::first_device() {
        Ok(x) => x,
        Err(why) => {
            println!("== bench wipe, GPU: SKIP: needs a GPU: {why} ==");
            return;
        }
    };
    let run = || -> Result<(), rackwarden::wipe::cuda::CudaError> {
        let ctx = cuda.context(d.handle)?;
        let k = gpu::load_kernels(&ctx, &d)?;
        let t = gpu::take(&ctx, None)?;
        let bytes = t.covered();
        println!(
            "== bench wipe, GPU: {} ({} SMs), {bytes} B of {} B in one run ==",
            d.name, d.sm_count, t.total
        );
        let start = Instant::now();
        gpu::upload_seeds(
            &ctx,
            &t,
            &KeyedStream::new(&[7u8; 32], &gpu::device_id(&d)),
            rackwarden_attest::merkle::default_threads(),
        )?;
        println!("seed table computed and uploaded in {:?}", start.elapsed());
        let never = AtomicBool::new(false);
        let mut anchor = Vec::new();
        let mut ours = Vec::new();
        for _ in 0..rounds.max(1) {
            let (ms, cmp, bad) = gpu::anchor_memset_compare(&ctx, &k, &t)?;
            assert_eq!(bad, 0);
            anchor.push((ms.as_secs_f64(), cmp.as_secs_f64()));
            let s = Instant::now();
            gpu::fill(&ctx, &k, &t, &never, |_| {})?;
            let f = s.elapsed().as_secs_f64();
            let s = Instant::now();
            let (read, bad) = gpu::verify(&ctx, &k, &t, &never, |_| {})?;
            assert_eq!((read, bad), (bytes, 0));
            ours.push((f, s.elapsed().as_secs_f64()));
        }
        let med = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (af, ac) = (
            med(anchor.iter().map(|a| a.0).collect()),
            med(anchor.iter().map(|a| a.1).collect()),
        );
        let (of, ov) = (
            med(ours.iter().map(|a| a.0).collect()),
            med(ours.iter().map(|a| a.1).collect()),
        );
        let gb = |s: f64| bytes as f64 / s / 1e9;
        println!("medians of {} rounds:", rounds.max(1));
        println!(
            "{:<44} {:>10} {:>10} {:>14}",
            "", "fill GB/s", "check GB/s", "fill+check GB/s"
        );
        println!(
            "{:<44} {:>10.1} {:>10.1} {:>14.1}",
            "anchor: cuMemsetD32 + compare kernel",
            gb(af),
            gb(ac),
            2.0 * bytes as f64 / (af + ac) / 1e9
        );
        println!(
            "{:<44} {:>10.1} {:>10.1} {:>14.1}",
            "rackwarden fill + verify kernels",
            gb(of),
            gb(ov),
            2.0 * bytes as f64 / (of + ov) / 1e9
        );
        println!(
            "ratio (fill+verify) / (memset+compare): {:.3} (target >= 0.8)",
            (af + ac) / (of + ov)
        );
        Ok(())
    };
    if let Err(e) = run() {
        println!("== bench wipe, GPU: FAILED: {e} ==");
        std::process::exit(1);
    }
}

// ---- images: merkle_sha3_256 on all cores vs single-thread SHA3-256 vs openssl ----

fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse()
                    .unwrap_or(0)
            })
        })
        .unwrap_or(0)
}

fn bench_images() {
    use rackwarden_attest::merkle;
    println!("== bench images ==");
    let size: u64 = 1 << 30;
    let path = std::path::PathBuf::from(format!("/dev/shm/rw-bench-{}.bin", std::process::id()));
    write_bench_image(&path, size);
    let cores = merkle::default_threads();
    let hwm0 = vm_hwm_kib();
    let r = hash_rounds(&path, size, cores);
    let hwm1 = vm_hwm_kib();
    let openssl = openssl_sha3_rate(&path, size);
    let _ = std::fs::remove_file(&path);
    print_images_report(&r, openssl, cores, hwm0, hwm1);
}

/// `size` bytes of non-constant content at `path`, written once (tmpfs: no disk in the
/// measurement).
fn write_bench_image(path: &std::path::Path, size: u64) {
    let mut f = std::fs::File::create(path).unwrap();
    let block: Vec<u8> = (0..(1u32 << 20))
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    for _ in 0..(size >> 20) {
        std::io::Write::write_all(&mut f, &block).unwrap();
    }
}

/// Medians of the image hashing rates, bytes per second.
struct ImageRates {
    /// The anchor: SHA3-256 on one thread, with the Keccak ours uses.
    single: f64,
    /// merkle_sha3_256 on every core.
    ours: f64,
    /// merkle_sha3_256 on one thread.
    ours1: f64,
    /// Plain SHA3 on every core at once: the machine's parallel ceiling.
    parallel: f64,
}

/// Anchor and ours alternate five times; medians are reported (this machine is noisy).
fn hash_rounds(path: &std::path::Path, size: u64, cores: usize) -> ImageRates {
    use rackwarden_attest::merkle;
    use std::time::Instant;
    let ours_with = |threads: usize| {
        let t = Instant::now();
        let d = merkle::digest_path(path, threads).unwrap();
        (size as f64 / t.elapsed().as_secs_f64(), d.digest)
    };
    let mut parallels = Vec::new();
    let (mut singles, mut ours_all, mut ours_one) = (Vec::new(), Vec::new(), Vec::new());
    let mut digest = None;
    for _ in 0..5 {
        singles.push(sha3_single_rate(path, size));
        parallels.push(sha3_parallel_rate(path, size, cores));
        let (r, d) = ours_with(cores);
        ours_all.push(r);
        let (r1, d1) = ours_with(1);
        ours_one.push(r1);
        assert_eq!(d, d1, "the digest must not depend on the thread count");
        digest = Some(d);
    }
    let _ = digest;
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    ImageRates {
        single: median(singles),
        ours: median(ours_all),
        ours1: median(ours_one),
        parallel: median(parallels),
    }
}

/// The anchor: SHA3-256 of the file on one thread, 1 MiB reads (the Keccak ours uses).
fn sha3_single_rate(path: &std::path::Path, size: u64) -> f64 {
    use rackwarden_attest::{Digest as _, Sha3_256};
    use std::{io::Read, time::Instant};
    let t = Instant::now();
    let mut h = Sha3_256::new();
    let mut f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let _ = h.finalize();
    size as f64 / t.elapsed().as_secs_f64()
}

/// The machine's own parallel ceiling: plain SHA3 on every core at once, each thread
/// hashing its own slice of the file.
fn sha3_parallel_rate(path: &std::path::Path, size: u64, cores: usize) -> f64 {
    use rackwarden_attest::{Digest as _, Sha3_256};
    use std::{os::unix::fs::FileExt, time::Instant};
    let t = Instant::now();
    let f = std::fs::File::open(path).unwrap();
    let part = size / cores as u64;
    std::thread::scope(|sc| {
        for c in 0..cores as u64 {
            let f = &f;
            sc.spawn(move || {
                let mut h = Sha3_256::new();
                let mut buf = vec![0u8; 1 << 20];
                let mut off = c * part;
                while off < (c + 1) * part {
                    f.read_exact_at(&mut buf, off).unwrap();
                    h.update(&buf);
                    off += buf.len() as u64;
                }
                let _ = h.finalize();
            });
        }
    });
    size as f64 / t.elapsed().as_secs_f64()
}

/// `openssl dgst -sha3-256` of the file, exec included; None if it does not run here.
fn openssl_sha3_rate(path: &std::path::Path, size: u64) -> Option<f64> {
    let t = std::time::Instant::now();
    let ok = Command::new("openssl")
        .args(["dgst", "-sha3-256"])
        .arg(path)
        .stdout(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    ok.then(|| size as f64 / t.elapsed().as_secs_f64())
}

/// The table; `openssl` is one run of `openssl dgst` (not a median), if it runs here.
fn print_images_report(r: &ImageRates, openssl: Option<f64>, cores: usize, hwm0: u64, hwm1: u64) {
    let ImageRates {
        single,
        ours,
        ours1,
        parallel,
    } = *r;
    println!("1 GiB in tmpfs, {cores} cores, medians of 5 alternating rounds");
    println!("{:<52} {:>10}", "", "GB/s");
    println!(
        "{:<52} {:>10.3}",
        "anchor: SHA3-256 single thread (the Keccak ours uses)",
        single / 1e9
    );
    if let Some(o) = openssl {
        println!(
            "{:<52} {:>10.3}   ({:.2}x that anchor)",
            "openssl dgst -sha3-256 (single thread, incl. exec)",
            o / 1e9,
            o / single
        );
    }
    println!(
        "{:<52} {:>10.3}   ({:.2}x single: the machine's parallel ceiling)",
        &format!("anchor: plain SHA3-256 on {cores} threads at once"),
        parallel / 1e9,
        parallel / single
    );
    println!("{:<52} {:>10.3}", "merkle_sha3_256, 1 thread", ours1 / 1e9);
    println!(
        "{:<52} {:>10.3}",
        &format!("merkle_sha3_256, {cores} threads"),
        ours / 1e9
    );
    println!(
        "ratio ours / (cores x single-thread SHA3): {:.3} (target >= 0.9); ours / plain SHA3 on all cores: {:.3}",
        ours / (cores as f64 * single),
        ours / parallel
    );
    println!(
        "peak RSS during the {cores}-thread digest: {} KiB (before: {} KiB); buffers are one 1 MiB chunk per thread",
        hwm1, hwm0
    );
}

// ---- attest: statements signed / verified per second per core, next to raw ed25519 ----

fn sample_predicate(seq: u64, prev: String) -> rackwarden_attest::statement::EpochPredicate {
    use rackwarden_attest::{evidence::*, statement::*};
    let counters = LimiterCounters {
        passed_bytes: 123_456_789,
        passed_packets: 98_765,
        dropped_bytes: 5_555_555,
        dropped_packets: 4_444,
        unconfigured_drops: 0,
        contention_drops: 0,
    };
    EpochPredicate {
        rack_id: "rack-a17".into(),
        host_id: "host-03".into(),
        seq,
        prev,
        challenge: Challenge::Nonce {
            nonce: "ab".repeat(32),
        },
        epoch_start_unix_ms: 1_796_000_000_000 + seq * 900_000,
        epoch_end_unix_ms: 1_796_000_000_000 + (seq + 1) * 900_000,
        limiter: LimiterReport::Present(Box::new(LimiterEvidence {
            attach_kind: rackwarden_attest::evidence::AttachKind::Tcx,
            pin_root: "/sys/fs/bpf/rackwarden".into(),
            programs: Direction::ALL
                .iter()
                .map(|d| ProgramIdentity {
                    name: format!("rw_{}", d.name()),
                    id: 107,
                    tag: "0f4840c11a5feae1".into(),
                })
                .collect(),
            attach_points: Direction::ALL
                .iter()
                .map(|d| AttachPoint {
                    interface: "eth0".into(),
                    direction: *d,
                    attached: true,
                    foreign_ahead: vec![],
                })
                .collect(),
            caps: Direction::ALL
                .iter()
                .map(|d| CapInForce {
                    direction: *d,
                    rate_bytes_per_s: 2_500_000,
                    burst_bytes: 262_144,
                    small_reserve_bytes: 16_384,
                    generation: 1,
                })
                .collect(),
            counters: Direction::ALL
                .iter()
                .map(|d| DirectionCounters {
                    direction: *d,
                    counters,
                })
                .collect(),
            gaps: vec![],
            bypass: None,
            self_protection: None,
        })),
        wipe: None,
        images: None,
        incidents: vec![],
        epoch: None,
        producer: ProducerIdentity {
            name: "rackwardend".into(),
            version: "0.1.0".into(),
            binary_sha3_256: "cd".repeat(32),
        },
        next_key: None,
        root_of_trust: None,
        storage: None,
        traffic: None,
        openings: Vec::new(),
    }
}

/// The daemon's cost per statement, as the epoch loop pays it: build the statement, write it
/// as JSON, sign its PAE, take the chain link, append the envelope line to the evidence log
/// and fsync. Goal: under 1 ms. Anchors in the same rounds: a raw ed25519 signature of the
/// same PAE bytes, and an append + fsync of a line of the same size to a file on the same
/// disk (the two costs ours cannot avoid). Also the verifier's per-statement check (parse,
/// base64, PAE, verify_strict, statement parse) against raw verify_strict, for information.
fn bench_attest() {
    use ed25519_dalek::Signer as _;
    use rackwarden_attest::{dsse, evidence_log::EvidenceLog, keys, statement::*};
    use std::io::Write as _;
    use std::time::Instant;
    const ROUNDS: usize = 11;
    const N: u64 = 200;
    println!(
        "== bench attest (one core; {ROUNDS} alternating rounds of {N} statements; medians) =="
    );
    // On the workspace's disk, not /tmp (which may be memory, where fsync costs nothing).
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/bench-attest")
        .join(std::process::id().to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let key = keys::generate();
    let vk = key.verifying_key();
    let host = Subject::host("rack-a17", "host-00", &vk);
    let mut lines: Vec<Vec<u8>> = Vec::with_capacity(N as usize);
    let per_op = |t: Instant| t.elapsed().as_secs_f64() * 1e9 / N as f64;
    // [raw sign, append+fsync, ours, verify_strict, ours verify]
    let mut rows: [Vec<f64>; 5] = Default::default();
    for round in 0..ROUNDS {
        // Ours: a fresh log per round, so every append is a real one.
        let path = dir.join(format!("log-{round}.jsonl"));
        let mut log = EvidenceLog::open(&path, &vk).unwrap();
        lines.clear();
        let t = Instant::now();
        for _ in 0..N {
            let (seq, prev) = log.next_link();
            let st = Statement::new(vec![host.clone()], sample_predicate(seq, prev));
            let body = st.to_json().unwrap();
            let (env, link) = dsse::sign_chained(&key, dsse::INTOTO_PAYLOAD_TYPE, &body);
            log.append_linked(&env, &st, link).unwrap();
            lines.push(env.to_json().unwrap());
        }
        rows[2].push(per_op(t));
        let paes: Vec<Vec<u8>> = lines
            .iter()
            .map(|l| {
                let v = dsse::verify(l, &vk, dsse::INTOTO_PAYLOAD_TYPE).unwrap();
                dsse::pae(dsse::INTOTO_PAYLOAD_TYPE, &v.payload)
            })
            .collect();
        let t = Instant::now();
        let sigs: Vec<_> = paes.iter().map(|p| key.sign(p)).collect();
        rows[0].push(per_op(t));
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("anchor-{round}.jsonl")))
            .unwrap();
        let t = Instant::now();
        for l in &lines {
            f.write_all(l).unwrap();
            f.write_all(b"\n").unwrap();
            f.sync_data().unwrap();
        }
        rows[1].push(per_op(t));
        let t = Instant::now();
        for (p, s) in paes.iter().zip(&sigs) {
            vk.verify_strict(p, s).unwrap();
        }
        rows[3].push(per_op(t));
        let t = Instant::now();
        for l in &lines {
            let v = dsse::verify(l, &vk, dsse::INTOTO_PAYLOAD_TYPE).unwrap();
            std::hint::black_box(Statement::from_verified(&v.payload).unwrap());
        }
        rows[4].push(per_op(t));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let [sign, fsync, ours, strict, verify] = rows.map(|mut r| median(&mut r));
    println!("statement envelope: {} bytes of JSON", lines[0].len());
    println!(
        "{:<66} {:>10.1} us",
        "anchor: raw ed25519 sign of the PAE",
        sign / 1e3
    );
    println!(
        "{:<66} {:>10.1} us",
        "anchor: append + fsync of a line of that size",
        fsync / 1e3
    );
    println!(
        "{:<66} {:>10.1} us",
        "daemon per statement: build+JSON+sign+chain+append+fsync",
        ours / 1e3
    );
    println!(
        "  ours / (sign + fsync anchors): {:.3}x; goal < 1 ms per statement: {}",
        ours / (sign + fsync),
        if ours < 1e6 { "met" } else { "NOT met" }
    );
    println!(
        "{:<66} {:>10.1} us",
        "verifier check: parse+base64+PAE+verify_strict+statement",
        verify / 1e3
    );
    println!(
        "{:<66} {:>10.1} us  ({:.3}x)",
        "anchor: raw verify_strict",
        strict / 1e3,
        strict / verify
    );
}

fn bench_limiter() {
    println!("== bench limiter ==");
    classifier_ns_per_packet();
    veth_throughput_overhead();
    accuracy_vs_tbf();
}

// ---- 1. ns per packet: BPF_PROG_TEST_RUN on our classifier vs a return-OK classifier ----

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;

fn sys_bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> libc::c_long {
    // SAFETY: attr is a 128-byte zero-padded bpf_attr for `cmd`.
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) }
}

fn put_u32(a: &mut [u8; 128], off: usize, v: u32) {
    a[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}
fn put_u64(a: &mut [u8; 128], off: usize, v: u64) {
    a[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}

/// One eBPF instruction, encoded as the kernel reads it (little-endian `struct bpf_insn`).
const fn insn(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    op as u64
        | (((src << 4) | dst) as u64) << 8
        | (off as u16 as u64) << 16
        | (imm as u32 as u64) << 32
}

/// `ld_imm64` of a map (`src` 1: BPF_PSEUDO_MAP_FD) or of a map value's address (`src` 2:
/// BPF_PSEUDO_MAP_VALUE, direct access without a lookup): two instruction slots.
const fn ld_map(dst: u8, src: u8, fd: i32) -> [u64; 2] {
    [insn(0x18, dst, src, 0, fd), insn(0, 0, 0, 0, 0)]
}

/// Loads `insns` as a SCHED_CLS program; panics with the verifier's log if it is refused.
fn load_insns(insns: &[u64], what: &str) -> i32 {
    let license = c"GPL";
    let mut log = vec![0u8; 1 << 16];
    let mut a = [0u8; 128];
    put_u32(&mut a, 0, BPF_PROG_TYPE_SCHED_CLS);
    put_u32(&mut a, 4, insns.len() as u32);
    put_u64(&mut a, 8, insns.as_ptr() as u64);
    put_u64(&mut a, 16, license.as_ptr() as u64);
    let fd = sys_bpf(BPF_PROG_LOAD, &mut a);
    if fd < 0 {
        put_u32(&mut a, 24, 1);
        put_u32(&mut a, 28, log.len() as u32);
        put_u64(&mut a, 32, log.as_mut_ptr() as u64);
        sys_bpf(BPF_PROG_LOAD, &mut a);
        panic!(
            "BPF_PROG_LOAD of {what}: {}\n{}",
            std::io::Error::last_os_error(),
            String::from_utf8_lossy(&log).trim_end_matches('\0')
        );
    }
    fd as i32
}

/// Loads `r0 = 0 (TC_ACT_OK); exit` as a SCHED_CLS program: the anchor.
fn load_return_ok() -> i32 {
    load_insns(
        &[insn(0xb7, 0, 0, 0, 0), insn(0x95, 0, 0, 0, 0)],
        "the anchor",
    )
}

/// `call bpf_ktime_get_ns; r0 = TC_ACT_OK; exit`: what the clock read alone costs. An exact
/// bound needs a precise clock on every packet (see `load_minimal_exact`), so this is a floor.
fn load_clock_only() -> i32 {
    load_insns(
        &[
            insn(0x85, 0, 0, 0, 5),
            insn(0xb7, 0, 0, 0, 0),
            insn(0x95, 0, 0, 0, 0),
        ],
        "the clock floor",
    )
}

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_FREEZE: libc::c_long = 22;

fn map_create(map_type: u32, value_size: u32, entries: u32, flags: u32) -> i32 {
    let mut a = [0u8; 128];
    put_u32(&mut a, 0, map_type);
    put_u32(&mut a, 4, 4);
    put_u32(&mut a, 8, value_size);
    put_u32(&mut a, 12, entries);
    put_u32(&mut a, 16, flags);
    let fd = sys_bpf(BPF_MAP_CREATE, &mut a);
    assert!(
        fd >= 0,
        "BPF_MAP_CREATE: {}",
        std::io::Error::last_os_error()
    );
    fd as i32
}

/// The least a policer can do per passed packet and keep the bound exact, hand-written:
/// read the clock, compute the cost (one division), GCRA on a shared `tat` with
/// compare-and-exchange (the bucket as a direct map value, no lookup), per-CPU passed
/// bytes/packets. No fail-closed checks (the verifier drops those on a frozen config
/// anyway), no drop counters (the pass path never runs them). Returns the program and the
/// three map fds to close.
fn load_minimal_exact(rate: u64, tau_ns: u64) -> (i32, [i32; 3]) {
    const BPF_MAP_TYPE_ARRAY: u32 = 2;
    const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
    const BPF_F_RDONLY_PROG: u32 = 1 << 7;
    let cfg = map_create(BPF_MAP_TYPE_ARRAY, 16, 1, BPF_F_RDONLY_PROG);
    let state = map_create(BPF_MAP_TYPE_ARRAY, 8, 1, 0);
    let counters = map_create(BPF_MAP_TYPE_PERCPU_ARRAY, 16, 1, 0);
    let key = 0u32;
    let mut value = [0u8; 16];
    value[..8].copy_from_slice(&rate.to_ne_bytes());
    value[8..].copy_from_slice(&tau_ns.to_ne_bytes());
    let mut a = [0u8; 128];
    put_u32(&mut a, 0, cfg as u32);
    put_u64(&mut a, 8, &key as *const u32 as u64);
    put_u64(&mut a, 16, value.as_ptr() as u64);
    assert!(
        sys_bpf(BPF_MAP_UPDATE_ELEM, &mut a) == 0,
        "BPF_MAP_UPDATE_ELEM: {}",
        std::io::Error::last_os_error()
    );
    let mut a = [0u8; 128];
    put_u32(&mut a, 0, cfg as u32);
    assert!(
        sys_bpf(BPF_MAP_FREEZE, &mut a) == 0,
        "BPF_MAP_FREEZE: {}",
        std::io::Error::last_os_error()
    );
    let [s0, s1] = ld_map(8, 2, state);
    let [c0, c1] = ld_map(1, 2, cfg);
    let [k0, k1] = ld_map(1, 1, counters);
    #[rustfmt::skip]
    let insns = [
        insn(0x61, 6, 1, 0, 0),           //  0 r6 = skb->len
        insn(0x85, 0, 0, 0, 5),           //  1 call bpf_ktime_get_ns
        insn(0xbf, 7, 0, 0, 0),           //  2 r7 = now
        s0, s1,                           //  3 r8 = &tat
        c0, c1,                           //  5 r1 = &cfg
        insn(0x79, 2, 1, 0, 0),           //  7 r2 = rate
        insn(0x79, 3, 1, 8, 0),           //  8 r3 = tau
        insn(0xbf, 4, 6, 0, 0),           //  9 r4 = len
        insn(0x27, 4, 0, 0, 1_000_000_000), // 10 r4 *= 1e9
        insn(0x0f, 4, 2, 0, 0),           // 11 r4 += rate
        insn(0x07, 4, 0, 0, -1),          // 12 r4 -= 1
        insn(0x3f, 4, 2, 0, 0),           // 13 r4 /= rate: cost, rounded up
        insn(0x0f, 3, 7, 0, 0),           // 14 r3 = limit = now + tau
        insn(0x79, 0, 8, 0, 0),           // 15 r0 = tat
        insn(0xb7, 9, 0, 0, 16),          // 16 r9 = tries
        insn(0xbf, 5, 0, 0, 0),           // 17 loop: r5 = tat
        insn(0x3d, 5, 7, 1, 0),           // 18 if r5 >= now goto 20
        insn(0xbf, 5, 7, 0, 0),           // 19 r5 = now
        insn(0x0f, 5, 4, 0, 0),           // 20 r5 += cost
        insn(0x2d, 5, 3, 5, 0),           // 21 if r5 > limit goto drop (27)
        insn(0xbf, 1, 0, 0, 0),           // 22 r1 = expected
        insn(0xdb, 8, 5, 0, 0xf1),        // 23 r0 = cmpxchg(*r8, r0, r5)
        insn(0x1d, 0, 1, 4, 0),           // 24 if r0 == expected goto pass (29)
        insn(0x07, 9, 0, 0, -1),          // 25 tries -= 1
        insn(0x55, 9, 0, -10, 0),         // 26 if tries != 0 goto loop (17)
        insn(0xb7, 0, 0, 0, 2),           // 27 drop: r0 = TC_ACT_SHOT
        insn(0x95, 0, 0, 0, 0),           // 28 exit
        insn(0x62, 10, 0, -4, 0),         // 29 pass: key = 0
        insn(0xbf, 2, 10, 0, 0),          // 30
        insn(0x07, 2, 0, 0, -4),          // 31 r2 = &key
        k0, k1,                           // 32 r1 = counters
        insn(0x85, 0, 0, 0, 1),           // 34 lookup (inlined by the verifier)
        insn(0x15, 0, 0, 6, 0),           // 35 if !r0 goto 42
        insn(0x79, 1, 0, 0, 0),           // 36
        insn(0x0f, 1, 6, 0, 0),           // 37
        insn(0x7b, 0, 1, 0, 0),           // 38 passed_bytes += len
        insn(0x79, 1, 0, 8, 0),           // 39
        insn(0x07, 1, 0, 0, 1),           // 40
        insn(0x7b, 0, 1, 8, 0),           // 41 passed_packets += 1
        insn(0xb7, 0, 0, 0, 0),           // 42 r0 = TC_ACT_OK
        insn(0x95, 0, 0, 0, 0),           // 43 exit
    ];
    (
        load_insns(&insns, "the minimal exact policer"),
        [cfg, state, counters],
    )
}

/// `TC_ACT_OK` and `TC_ACT_SHOT`: the verdicts each measured path must return, or it is not
/// the path its line names.
const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;

/// Average ns per run over `repeat` runs of `fd` on a 1400-byte frame, and the verdict.
fn test_run(fd: i32, repeat: u32) -> (f64, u32) {
    let mut pkt = vec![0u8; 1400];
    pkt[12] = 0x08; // ethertype IPv4
    let mut a = [0u8; 128];
    put_u32(&mut a, 0, fd as u32);
    put_u32(&mut a, 8, pkt.len() as u32);
    put_u64(&mut a, 16, pkt.as_mut_ptr() as u64);
    put_u32(&mut a, 32, repeat);
    let rc = sys_bpf(BPF_PROG_TEST_RUN, &mut a);
    assert!(
        rc == 0,
        "BPF_PROG_TEST_RUN: {}",
        std::io::Error::last_os_error()
    );
    let retval = u32::from_ne_bytes(a[4..8].try_into().unwrap());
    let duration = u32::from_ne_bytes(a[36..40].try_into().unwrap());
    (duration as f64, retval)
}

/// `bpf_prog_info` of `fd`: (id, instructions after the verifier, JIT bytes).
fn prog_size(fd: i32) -> (u32, u32, u32) {
    let mut info = [0u8; 256];
    let mut a = [0u8; 128];
    put_u32(&mut a, 0, fd as u32);
    put_u32(&mut a, 4, info.len() as u32);
    put_u64(&mut a, 8, info.as_mut_ptr() as u64);
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    let rc = sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a);
    assert!(
        rc == 0,
        "BPF_OBJ_GET_INFO_BY_FD: {}",
        std::io::Error::last_os_error()
    );
    let u32_at = |off: usize| u32::from_ne_bytes(info[off..off + 4].try_into().unwrap());
    // struct bpf_prog_info: type @0, id @4, tag @8, jited_prog_len @16, xlated_prog_len @20.
    (u32_at(4), u32_at(20) / 8, u32_at(16))
}

/// With `RW_BENCH_XLATED=DIR`, `bpftool prog dump xlated` of `fd` into `DIR/NAME.xlated`.
fn dump_xlated(fd: i32, name: &str) {
    let Some(dir) = std::env::var_os("RW_BENCH_XLATED") else {
        return;
    };
    let (id, _, _) = prog_size(fd);
    let out = Command::new("bpftool")
        .args(["prog", "dump", "xlated", "id", &id.to_string()])
        .output()
        .expect("run bpftool");
    let path = std::path::Path::new(&dir).join(format!("{name}.xlated"));
    std::fs::write(&path, &out.stdout).unwrap();
    println!("  xlated of {name} (id {id}) -> {}", path.display());
}

/// Alternating rounds (anchor, ours, anchor, ours, ...) so that drift of the shared machine
/// hits both alike; returns the medians and the spread of ours/anchor per round.
fn alternate(anchor: i32, ours: i32, want: u32, rounds: usize, repeat: u32) -> Alternated {
    let (mut a, mut o, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (a_ns, a_v) = test_run(anchor, repeat);
        let (o_ns, o_v) = test_run(ours, repeat);
        assert_eq!(a_v, TC_ACT_OK, "the anchor returns TC_ACT_OK");
        assert_eq!(o_v, want, "the measured path returns its verdict");
        a.push(a_ns);
        o.push(o_ns);
        r.push(o_ns / a_ns);
    }
    let (min, max) = r
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
    Alternated {
        anchor_ns: median(&mut a),
        ours_ns: median(&mut o),
        ratio: median(&mut r),
        min,
        max,
    }
}

struct Alternated {
    anchor_ns: f64,
    ours_ns: f64,
    ratio: f64,
    min: f64,
    max: f64,
}

fn print_alternated(name: &str, m: &Alternated) {
    println!(
        "{:<40} {:>8.1} {:>8.1} {:>8.2}x   ({:.2}x..{:.2}x)",
        name, m.anchor_ns, m.ours_ns, m.ratio, m.min, m.max
    );
}

fn classifier_ns_per_packet() {
    let pins = PinPaths::new(format!("/sys/fs/bpf/rwbench-{}", std::process::id()));
    let spec = |rate| CapSpec {
        rate_bytes_per_s: rate,
        burst_bytes: 1 << 20,
        small_reserve_bytes: 16_384,
        small_max_len: 1024,
    };
    // Pass path: at 1 TB/s a 1400-byte frame costs 2 ns of bucket, less than one test run
    // takes, so every run passes (a compare-and-exchange on every packet). A slower cap
    // empties the 1 MiB bucket within microseconds and the "pass" line measures drops.
    let pass = CapSlot::Cap(spec(1_000_000_000_000));
    let mut limiter = Limiter::load_or_adopt(
        &pins,
        &[pass, pass],
        rackwarden::limiter::loader::PolicerVariant::Plain,
    )
    .expect("load the policer");
    let prog =
        aya::programs::SchedClassifier::from_pin(pins.prog(Direction::Egress.prog_name())).unwrap();
    let fd = prog.fd().unwrap().as_fd().as_raw_fd();
    let anchor = load_return_ok();
    let clock = load_clock_only();
    // The same cap as `pass`: tau = floor(1 MiB / 1 TB/s) = 1,048 ns.
    let (minimal, minimal_maps) = load_minimal_exact(1_000_000_000_000, 1_048);
    let (rounds, repeat) = (9, 1_000_000);
    println!(
        "\n-- classifier cost via BPF_PROG_TEST_RUN, 1400-byte frame, {rounds} alternating rounds of {repeat} runs, medians --"
    );
    for (name, f) in [
        ("anchor", anchor),
        ("rackwarden egress", fd),
        ("floor: clock read alone", clock),
        ("floor: minimal exact policer", minimal),
    ] {
        let (id, insns, jited) = prog_size(f);
        println!("{name:<40} id {id}: {insns} xlated insns, {jited} JIT bytes");
        dump_xlated(f, &name.replace([' ', ':'], "-"));
    }
    println!(
        "{:<40} {:>8} {:>8} {:>9}   (per-round ratio min..max)",
        "path (verdict checked)", "anchor", "ours", "ratio"
    );
    let m = alternate(anchor, fd, TC_ACT_OK, rounds, repeat);
    print_alternated("rackwarden egress, under cap (pass)", &m);
    // What no exact policer can go below on this kernel: the precise clock every packet
    // needs, alone, and the least program around it (the same GCRA, hand-written).
    let m = alternate(anchor, clock, TC_ACT_OK, rounds, repeat);
    print_alternated("floor: call bpf_ktime_get_ns only", &m);
    let m = alternate(anchor, minimal, TC_ACT_OK, rounds, repeat);
    print_alternated("floor: minimal exact policer (pass)", &m);
    for f in [clock, minimal].into_iter().chain(minimal_maps) {
        // SAFETY: closing fds this function opened and no longer uses.
        unsafe { libc::close(f) };
    }
    // Drop path: 1 B/s, the 1 MiB bucket is empty after ~750 frames and the rest of each
    // round drops (a new generation: the config map is frozen).
    limiter
        .change_caps(&[CapSlot::Cap(spec(1)), pass], &[])
        .expect("change the caps");
    let drop_prog =
        aya::programs::SchedClassifier::from_pin(pins.prog(Direction::Egress.prog_name())).unwrap();
    let drop_fd = drop_prog.fd().unwrap().as_fd().as_raw_fd();
    let m = alternate(anchor, drop_fd, TC_ACT_SHOT, rounds, repeat);
    print_alternated("rackwarden egress, over cap (drop)", &m);
    // SAFETY: closing the anchor fd we opened.
    unsafe { libc::close(anchor) };
    drop(prog);
    drop(drop_prog);
    drop(limiter);
    let _ = pins.remove_all();
}

// ---- taps: the tapped policer against the plain one, and what the records cost ----

fn bench_taps() {
    use rackwarden::limiter::loader::PolicerVariant;
    println!("== bench taps ==");
    let pid = std::process::id();
    let pass = CapSlot::Cap(tap_bench_cap(1_000_000_000_000));
    let plain_pins = PinPaths::new(format!("/sys/fs/bpf/rwbench-plain-{pid}"));
    let tapped_pins = PinPaths::new(format!("/sys/fs/bpf/rwbench-tapped-{pid}"));
    let plain = Limiter::load_or_adopt(&plain_pins, &[pass, pass], PolicerVariant::Plain)
        .expect("load the plain policer");
    let tapped = Limiter::load_or_adopt(&tapped_pins, &[pass, pass], PolicerVariant::Tapped)
        .expect("load the tapped policer");
    let prog = |pins: &PinPaths| {
        aya::programs::SchedClassifier::from_pin(pins.prog(Direction::Egress.prog_name())).unwrap()
    };
    let (plain_prog, tapped_prog) = (prog(&plain_pins), prog(&tapped_pins));
    let plain_fd = plain_prog.fd().unwrap().as_fd().as_raw_fd();
    let tapped_fd = tapped_prog.fd().unwrap().as_fd().as_raw_fd();
    let mut reader = rackwarden::taps::ring::FrameReader::open(&tapped_pins).unwrap();
    // 20,000 runs of a 1400-byte frame fill 29 MB of the 32 MiB ring: the ring is drained
    // between rounds (outside the timing), so every timed run takes the tap's pass path.
    let (rounds, repeat) = (15, 20_000u32);
    let (mut a, mut o, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        reader.drain(|_| {});
        let (p_ns, p_v) = test_run(plain_fd, repeat);
        let (t_ns, t_v) = test_run(tapped_fd, repeat);
        assert_eq!((p_v, t_v), (TC_ACT_OK, TC_ACT_OK), "both pass the frame");
        let frames = reader.drain(|f| assert_eq!(f.bytes.len(), 1400));
        assert_eq!(frames, repeat as usize, "the tap recorded every run");
        a.push(p_ns);
        o.push(t_ns);
        r.push(t_ns / p_ns);
    }
    println!(
        "-- per packet via BPF_PROG_TEST_RUN, 1400-byte frame, {rounds} alternating rounds of {repeat} runs, medians --"
    );
    println!(
        "{:<44} {:>8.1} {:>8.1} {:>8.2}x   (goal <= 1.5x)",
        "policer + tap vs policer alone (pass)",
        median(&mut a),
        median(&mut o),
        median(&mut r)
    );
    drop((plain_prog, tapped_prog, plain, tapped));
    let _ = plain_pins.remove_all();
    let _ = tapped_pins.remove_all();
    taps_records_and_reader_cpu();
    taps_tcp_throughput();
    taps_openings_check();
}

/// The verifier's check of one epoch's openings as received (parse the JSON, each record's
/// path to the root, its bytes against the leaf, the drawn offsets covered) against
/// single-thread SHA3-256 of the same opened bytes, the part no check can skip. Alternating
/// rounds, medians.
fn taps_openings_check() {
    use base64::{Engine as _, engine::general_purpose::STANDARD};
    use rackwarden_attest::{
        Digest as _, Sha3_256,
        traffic::{
            EpochOpenings, FlowKey, OpenedRecord, RecordKind, SampleDemand, StreamPart, SumTree,
            TrafficLeaf,
        },
    };
    use std::time::Instant;
    // 256 records of 32 KiB each way: a 16 MiB epoch; 8 offsets per direction.
    let (n, size) = (256usize, 32usize << 10);
    let bytes: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
        .map(|i| {
            let fill = |seed: u8| {
                (0..size)
                    .map(|j| (j as u8).wrapping_mul(31) ^ seed)
                    .collect::<Vec<u8>>()
            };
            (fill(i as u8), fill(!(i as u8)))
        })
        .collect();
    let leaves: Vec<TrafficLeaf> = bytes
        .iter()
        .enumerate()
        .map(|(i, (input, output))| TrafficLeaf {
            epoch_seq: 7,
            kind: RecordKind::Exchange,
            flow: FlowKey {
                proto: 6,
                local: "10.0.0.2:8000".parse().unwrap(),
                remote: format!("10.0.0.9:{}", 30000 + i).parse().unwrap(),
            },
            input: StreamPart::of_bytes(0, input),
            output: StreamPart::of_bytes(0, output),
            wire: [output.len() as u64 + 1500, input.len() as u64 + 1500],
        })
        .collect();
    let tree = SumTree::build(&leaves).unwrap();
    let root = tree.root();
    let demand = SampleDemand {
        epoch_seq: 7,
        randomness: [0x42; 32],
        per_direction: 8,
        deadline_ms: 0,
    };
    let mut drawn: Vec<usize> = demand
        .offsets(&root)
        .iter()
        .flat_map(|(d, offs)| offs.iter().map(|o| tree.locate(*d, *o).unwrap()))
        .collect();
    drawn.sort_unstable();
    drawn.dedup();
    let answer = EpochOpenings {
        rack: "r".into(),
        host: "h".into(),
        epoch_seq: 7,
        root,
        records: drawn
            .iter()
            .map(|i| OpenedRecord {
                leaf: leaves[*i],
                path: tree.open(*i).unwrap(),
                input_base64: STANDARD.encode(&bytes[*i].0),
                output_base64: STANDARD.encode(&bytes[*i].1),
            })
            .collect(),
    };
    let json = serde_json::to_vec(&answer).unwrap();
    let opened: usize = drawn
        .iter()
        .map(|i| bytes[*i].0.len() + bytes[*i].1.len())
        .sum();
    let (mut c, mut h, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..15 {
        let t = Instant::now();
        let o: EpochOpenings = serde_json::from_slice(&json).unwrap();
        let checked = o.check("r", "h", &root, &demand).unwrap();
        let check_s = t.elapsed().as_secs_f64();
        assert_eq!(checked.len(), drawn.len());
        let t = Instant::now();
        for i in &drawn {
            std::hint::black_box(Sha3_256::digest(&bytes[*i].0));
            std::hint::black_box(Sha3_256::digest(&bytes[*i].1));
        }
        let sha_s = t.elapsed().as_secs_f64();
        c.push(check_s * 1e3);
        h.push(sha_s * 1e3);
        r.push(check_s / sha_s);
    }
    println!(
        "-- the verifier's check of one epoch's openings: {} of {n} records ({} opened bytes, {} of JSON), 15 alternating rounds, medians --",
        drawn.len(),
        opened,
        json.len()
    );
    println!(
        "{:<44} {:>8.2} {:>8.2} {:>8.2}x   (ms; goal <= 3x: JSON and base64 on top of the digest)",
        "check vs one-thread SHA3-256 of the bytes",
        median(&mut c),
        median(&mut h),
        median(&mut r)
    );
}

/// TCP over one veth pair with the cap far above the load, the tapped policer against the
/// plain one: the same pair and pins, the variant switched between rounds the way a daemon
/// switches it (a no-gap upgrade), the reader draining the ring on its own thread.
fn taps_tcp_throughput() {
    use rackwarden::limiter::loader::PolicerVariant;
    let net = Net::new("btpt");
    let far = CapSlot::Cap(CapSpec {
        burst_bytes: 1 << 24,
        ..tap_bench_cap(100_000_000_000)
    });
    let pins = net.attach_bare_limiter([far, far]);
    let switch = |variant: PolicerVariant| {
        let (p2, ifc) = (pins.clone(), net.rack_if.clone());
        in_netns(&net.rack_ns, move || {
            let mut l = Limiter::load_or_adopt(&p2, &[far, far], variant).expect("load");
            l.choose_kind(rackwarden::config::AttachMode::Auto, &ifc);
            l.replace_attached(std::slice::from_ref(&ifc))
                .expect("replace the policer");
        });
    };
    // The tapped object once, so its ring exists for the reader.
    switch(PolicerVariant::Tapped);
    let mut reader = rackwarden::taps::ring::FrameReader::open(&pins).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let draining = std::thread::spawn(move || {
        while !s2.load(std::sync::atomic::Ordering::SeqCst) {
            reader.wait(Duration::from_millis(10));
            reader.drain(|_| {});
        }
    });
    let (rounds, secs) = (7, 2.0);
    let transfer = || {
        let (got, t) = tcp_out(&net, secs);
        got as f64 / t
    };
    let (mut plain, mut tapped, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        switch(PolicerVariant::Plain);
        let p = transfer();
        switch(PolicerVariant::Tapped);
        let t = transfer();
        plain.push(p);
        tapped.push(t);
        ratio.push(t / p);
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    draining.join().unwrap();
    println!(
        "-- TCP over veth, cap far above the load, {rounds} alternating rounds of {secs} s, medians --"
    );
    println!(
        "{:<44} {:>8.3} {:>8.3} {:>8.3}x   (GB/s plain, tapped; goal >= 0.98x)",
        "TCP throughput with the tap vs without",
        median(&mut plain) / 1e9,
        median(&mut tapped) / 1e9,
        median(&mut ratio)
    );
}

/// One TCP transfer of `secs` from the rack to the outside through `net`'s veth: the bytes
/// the outside received and the seconds it took.
fn tcp_out(net: &Net, secs: f64) -> (u64, f64) {
    let (port, sink) = rackwarden_tests::tcp_sink(&net.out_ns, rackwarden_tests::OUT_ADDR);
    let dst: SocketAddr = format!("{}:{port}", rackwarden_tests::OUT_ADDR)
        .parse()
        .unwrap();
    rackwarden_tests::tcp_send(&net.rack_ns, dst, secs)
        .join()
        .unwrap();
    sink.join().unwrap()
}

/// Real TCP at 10 MB/s through the tapped policer in network namespaces: the reader's CPU
/// while it keeps up, and what the epoch's records and spool cost per byte.
fn taps_records_and_reader_cpu() {
    use rackwarden::taps::{TapReader, records::RecordMaker, spool};
    let net = Net::new("btap");
    let cap = CapSlot::Cap(tap_bench_cap(10_000_000));
    let pins = net.attach_tapped_limiter([cap, cap]);
    let reader = TapReader::open(&pins, net.dir.join("tap-cut.json"), 1 << 30).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let polling = std::thread::spawn(move || {
        let mut reader = reader;
        let t0 = thread_cpu();
        let w0 = std::time::Instant::now();
        while !s2.load(std::sync::atomic::Ordering::SeqCst) {
            reader.poll(Duration::from_millis(20));
        }
        (reader, thread_cpu() - t0, w0.elapsed().as_secs_f64())
    });
    let secs = 5.0;
    let (got, _) = tcp_out(&net, secs);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (mut reader, cpu, wall) = polling.join().unwrap();
    let e = reader.cut().unwrap();
    let tapped = e.tapped[0] + e.tapped[1];
    let mut maker = RecordMaker::new(vec![]);
    let records = maker.records(1, e.flows.clone());
    let spooled: usize = records
        .iter()
        .map(|r| spool::encode(r).unwrap().len())
        .sum();
    println!(
        "-- 10 MB/s cap, one TCP transfer of {secs} s ({got} bytes delivered), the reader on its own thread --"
    );
    println!(
        "{:<44} {:>8.2}%  of one core ({cpu:.3} s CPU in {wall:.1} s; goal <= 5%)",
        "reader CPU while the rack sends at the cap",
        100.0 * cpu / wall
    );
    println!(
        "{:<44} {:>8} B  (fixed-width leaf; goal <= 200 B)",
        "commitment bytes per record",
        rackwarden_attest::traffic::LEAF_LEN
    );
    println!(
        "{:<44} {:>8.3}   ({spooled} spool bytes for {tapped} tapped bytes, {} records; goal <= 1.05)",
        "spool bytes per tapped byte",
        spooled as f64 / tapped as f64,
        records.len()
    );
    assert_eq!(e.totals.unaccounted, [0, 0], "every passed byte was tapped");
}

/// The taps rows' cap: `rate`, a 1 MiB burst, the default small-packet reserve.
fn tap_bench_cap(rate: u64) -> CapSpec {
    CapSpec {
        rate_bytes_per_s: rate,
        burst_bytes: 1 << 20,
        small_reserve_bytes: 16_384,
        small_max_len: 1024,
    }
}

/// CPU seconds this thread has used.
fn thread_cpu() -> f64 {
    // SAFETY: a zeroed rusage is valid, and getrusage fills it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD on the calling thread, a valid out pointer.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

// ---- 2. veth throughput with the cap far above the offered load, with and without us ----

/// The `cpu` line of `/proc/stat` (all CPUs), in USER_HZ ticks.
#[derive(Clone, Copy, Default)]
struct CpuTicks {
    /// user + nice + system + irq + softirq: work done on any CPU, by anyone (guest time is
    /// already inside user).
    busy: u64,
    /// Time the hypervisor ran something else while a CPU of ours wanted to run.
    steal: u64,
}

impl CpuTicks {
    fn now() -> CpuTicks {
        let stat = std::fs::read_to_string("/proc/stat").expect("read /proc/stat");
        let line = stat
            .lines()
            .find(|l| l.starts_with("cpu "))
            .expect("/proc/stat has a cpu line");
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().expect("/proc/stat: a tick count"))
            .collect();
        // user nice system idle iowait irq softirq steal ...
        CpuTicks {
            busy: f[0] + f[1] + f[2] + f[5] + f[6],
            steal: f.get(7).copied().unwrap_or(0),
        }
    }

    fn since(&self, before: &CpuTicks) -> CpuTicks {
        CpuTicks {
            busy: self.busy - before.busy,
            steal: self.steal - before.steal,
        }
    }

    fn add(&mut self, other: &CpuTicks) {
        self.busy += other.busy;
        self.steal += other.steal;
    }

    fn busy_secs(&self) -> f64 {
        self.busy as f64 / clock_ticks_per_sec()
    }

    fn steal_secs(&self) -> f64 {
        self.steal as f64 / clock_ticks_per_sec()
    }
}

fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// Windows of one TCP transfer with nothing on the rack interface's hooks, then one arm, then
/// nothing, then the other arm, and so on, ending with nothing: every armed window has a bare
/// window on both sides of it. This many windows for each arm.
const VETH_WINDOWS_PER_ARM: usize = 250;
const VETH_WINDOW: Duration = Duration::from_millis(100);
/// Left out of every window after a detach or attach (which return once the kernel's grace
/// period has passed): the packets in flight across the change.
const VETH_SETTLE: Duration = Duration::from_millis(5);

/// What is on both of the rack interface's hooks during a window.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum VethArm {
    /// No program: the anchor.
    Bare,
    /// Our policer, egress and ingress, as the daemon attaches it.
    Ours,
    /// `r0 = TC_ACT_OK; exit` on the same hooks (tcx only): what any tc program costs the
    /// transfer, the part of ours no policer can remove.
    Empty,
}

/// One window of the transfer: bytes the sink received, over how long, and with what on the
/// hooks.
struct VethWindow {
    arm: VethArm,
    bytes: u64,
    secs: f64,
    cpu: CpuTicks,
}

impl VethWindow {
    fn rate(&self) -> f64 {
        self.bytes as f64 / self.secs
    }
}

const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;

/// The rack interface's hooks as the veth row switches them, from a thread in the rack
/// namespace. Ours come off as another process would take them off ([`tamper::detach_from`]:
/// the hook is empty when it returns) and go back on as the daemon attaches them; the empty
/// program's links close with their fds.
struct VethHooks {
    limiter: Limiter,
    ns: String,
    iface: String,
    /// How ours are attached on this kernel.
    hook: tamper::Hook,
    empty_prog: std::os::fd::OwnedFd,
    empty_links: Vec<std::os::fd::OwnedFd>,
}

impl VethHooks {
    /// Puts `to` on both hooks, taking off what `from` put there.
    fn set(&mut self, from: VethArm, to: VethArm) {
        match from {
            VethArm::Bare => {}
            VethArm::Empty => self.empty_links.clear(),
            VethArm::Ours => {
                for dir in [Direction::Egress, Direction::Ingress] {
                    let pins = self.limiter.pins();
                    tamper::detach_from(pins, &self.ns, &self.iface, self.hook, dir)
                        .expect("take our policer off");
                    if self.hook == tamper::Hook::Tcx {
                        // The detached link's pin holds nothing now; the next attach pins anew.
                        std::fs::remove_file(pins.link(&self.iface, dir))
                            .expect("unpin our detached tcx link");
                    }
                }
            }
        }
        match to {
            VethArm::Bare => {}
            VethArm::Ours => {
                for dir in [Direction::Egress, Direction::Ingress] {
                    self.limiter
                        .attach(&self.iface, dir)
                        .expect("attach the policer");
                }
            }
            VethArm::Empty => {
                let name = std::ffi::CString::new(self.iface.as_str()).unwrap();
                // SAFETY: a NUL-terminated name.
                let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
                assert!(ifindex != 0, "{} has no ifindex", self.iface);
                for attach_type in [BPF_TCX_EGRESS, BPF_TCX_INGRESS] {
                    let mut a = [0u8; 128];
                    put_u32(&mut a, 0, self.empty_prog.as_raw_fd() as u32);
                    put_u32(&mut a, 4, ifindex);
                    put_u32(&mut a, 8, attach_type);
                    let fd = sys_bpf(BPF_LINK_CREATE, &mut a);
                    assert!(
                        fd >= 0,
                        "tcx link of the empty program: {}",
                        std::io::Error::last_os_error()
                    );
                    // SAFETY: a new link fd we own from here on.
                    self.empty_links
                        .push(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd as i32) });
                }
            }
        }
    }
}

/// Each window of `arm` against the bare windows on both sides of it.
fn arm_ratios(windows: &[VethWindow], arm: VethArm) -> Bracketed {
    let rates: Vec<f64> = windows.iter().map(VethWindow::rate).collect();
    Bracketed::new(
        &rates,
        |i| windows[i].arm == arm,
        |i| windows[i].arm == VethArm::Bare,
    )
}

/// Prints an arm's ratios, and what they lose in percent; returns their median.
fn print_arm(what: &str, ratios: &Bracketed) -> f64 {
    let ratio = ratios.median();
    let (lo, hi) = ratios.ci95();
    println!(
        "{what}: {}: {:.1}% lower (95% CI {:.1}% to {:.1}% lower)",
        ratios.describe(),
        100.0 * (1.0 - ratio),
        100.0 * (1.0 - hi),
        100.0 * (1.0 - lo),
    );
    ratio
}

fn veth_throughput_overhead() {
    // One veth pair and one connection for the whole run, so the arms differ in nothing but
    // the programs: separate pairs or connections differ by more than 2% on their own (socket
    // buffers, CPU placement), which is what rounds on new connections could not resolve.
    let net = Net::new("bthw");
    let far = CapSlot::Cap(CapSpec {
        rate_bytes_per_s: 100_000_000_000,
        burst_bytes: 1 << 24,
        small_reserve_bytes: 16_384,
        small_max_len: 1024,
    });
    let pins = net.attach_bare_limiter([far, far]);
    // The limiter chose tcx where the kernel has it, and then pinned its link; the empty
    // program goes on by a tcx link too, so it is measured only there.
    let tcx = pins.link(&net.rack_if, Direction::Egress).exists();
    let arms: &[VethArm] = if tcx {
        &[VethArm::Ours, VethArm::Empty]
    } else {
        &[VethArm::Ours]
    };
    let count = 2 * VETH_WINDOWS_PER_ARM * arms.len() + 1;
    println!(
        "\n-- TCP throughput over veth, cap 100 GB/s (never reached), one core: one transfer, {count} windows of {} ms, bare and armed in turn --",
        VETH_WINDOW.as_millis()
    );
    let received = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    // Sender, receiver and the softirq work between them (a veth delivers on the sending CPU)
    // share CPU 0, so every cycle a program takes is a cycle the transfer loses: the harshest
    // case. The windows are timed and the programs moved from CPU 1, off the measured core.
    let (port, sink) = tcp_sink_counted(&net.out_ns, OUT_ADDR, received.clone(), Some(0));
    let dst: SocketAddr = format!("{OUT_ADDR}:{port}").parse().unwrap();
    let warmup = Duration::from_millis(500);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sending = done.clone();
    let send = tcp_send_while(&net.rack_ns, dst, Some(0), move || {
        !sending.load(std::sync::atomic::Ordering::Relaxed)
    });
    let (p2, ns, iface) = (pins.clone(), net.rack_ns.clone(), net.rack_if.clone());
    let arms = arms.to_vec();
    let (windows, counted): (Vec<VethWindow>, Option<CountedRuns>) =
        in_netns(&net.rack_ns, move || {
            pin_to_cpu(1);
            let mut limiter = Limiter::load_or_adopt(
                &p2,
                &[far, far],
                rackwarden::limiter::loader::PolicerVariant::Plain,
            )
            .expect("adopt the policer");
            limiter.choose_kind(rackwarden::config::AttachMode::Auto, &iface);
            let empty_prog = load_return_ok();
            let mut hooks = VethHooks {
                limiter,
                ns,
                iface,
                hook: if tcx {
                    tamper::Hook::Tcx
                } else {
                    tamper::Hook::Clsact
                },
                // SAFETY: a program fd this closure owns from here on.
                empty_prog: unsafe { std::os::fd::FromRawFd::from_raw_fd(empty_prog) },
                empty_links: Vec::new(),
            };
            let mut on = VethArm::Ours;
            std::thread::sleep(warmup);
            let windows = (0..count)
                .map(|i| {
                    let arm = if i % 2 == 0 {
                        VethArm::Bare
                    } else {
                        arms[(i / 2) % arms.len()]
                    };
                    hooks.set(on, arm);
                    on = arm;
                    std::thread::sleep(VETH_SETTLE);
                    let (b0, c0, t0) = (
                        received.load(std::sync::atomic::Ordering::Relaxed),
                        CpuTicks::now(),
                        std::time::Instant::now(),
                    );
                    std::thread::sleep(VETH_WINDOW);
                    let (b1, c1, t1) = (
                        received.load(std::sync::atomic::Ordering::Relaxed),
                        CpuTicks::now(),
                        std::time::Instant::now(),
                    );
                    VethWindow {
                        arm,
                        bytes: b1 - b0,
                        secs: (t1 - t0).as_secs_f64(),
                        cpu: c1.since(&c0),
                    }
                })
                .collect();
            // Then ours alone, with the kernel counting their runs: a phase of its own, because
            // the statistics' clock reads would weigh on the timed windows.
            hooks.set(on, VethArm::Ours);
            std::thread::sleep(VETH_SETTLE);
            (windows, count_our_runs(&p2))
        });
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    send.join().unwrap();
    sink.join().unwrap();
    if let Some(path) = std::env::var_os("RW_BENCH_VETH_WINDOWS") {
        let rows: Vec<String> = windows
            .iter()
            .map(|w| format!("{:?} {} {:.6}", w.arm, w.bytes, w.secs))
            .collect();
        std::fs::write(path, rows.join("\n") + "\n").expect("write the windows");
    }
    assert!(
        windows.iter().all(|w| w.bytes > 0),
        "the transfer stalled in a window"
    );
    let rate = |arm: VethArm| {
        median(
            &mut windows
                .iter()
                .filter(|w| w.arm == arm)
                .map(VethWindow::rate)
                .collect::<Vec<_>>(),
        )
    };
    println!(
        "{:<44} {:>14.0} B/s (median)",
        "anchor: no programs",
        rate(VethArm::Bare)
    );
    println!(
        "{:<44} {:>14.0} B/s (median)",
        "rackwarden egress+ingress attached",
        rate(VethArm::Ours)
    );
    let ours_ratio = print_arm(
        "throughput, ours (goal <= 2% lower)",
        &arm_ratios(&windows, VethArm::Ours),
    );
    if tcx {
        let empty_ratio = print_arm(
            "throughput, the empty program on the same hooks",
            &arm_ratios(&windows, VethArm::Empty),
        );
        // What the empty program loses is the hook's own cost, which no program avoids.
        println!(
            "  ours against the empty program: {:.3}x",
            ours_ratio / empty_ratio
        );
    } else {
        println!("throughput, the empty program: not measured (no tcx on this kernel)");
    }
    // Where the windows' noise does not come from: the hypervisor's steal is counted apart.
    let mut cpu_all = CpuTicks::default();
    for w in &windows {
        cpu_all.add(&w.cpu);
    }
    println!(
        "  CPU over all windows: {:.1} s busy, {:.1} s stolen by the hypervisor, in {:.1} s on {} CPUs",
        cpu_all.busy_secs(),
        cpu_all.steal_secs(),
        windows.iter().map(|w| w.secs).sum::<f64>(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let Some(c) = counted else {
        println!("our programs' CPU time: not measured (kernel.bpf_stats_enabled not writable)");
        return;
    };
    if c.runs == 0 {
        println!("our programs' CPU time: not measured (the kernel counted no runs)");
        return;
    }
    let per_run = c.ns as f64 / c.runs as f64;
    let net_ns = (per_run - c.stats_cost).max(0.0);
    println!(
        "our programs, {:.0} s attached with kernel.bpf_stats_enabled on: {} runs, {per_run:.1} ns per run counted",
        c.secs, c.runs
    );
    println!(
        "  the statistics' own cost, counted on the empty program: {:.1} ns per run; ours without it: {net_ns:.1} ns per run",
        c.stats_cost
    );
    println!(
        "  = {:.2}% of the CPU work done meanwhile ({:.2}% as counted), {:.2}% of one core (goal <= 2%)",
        100.0 * net_ns * c.runs as f64 / (c.cpu.busy_secs() * 1e9),
        100.0 * c.ns as f64 / (c.cpu.busy_secs() * 1e9),
        100.0 * net_ns * c.runs as f64 / (c.secs * 1e9),
    );
}

/// How long ours stay attached with their runs counted, after the windows.
const VETH_COUNTED: Duration = Duration::from_secs(3);

/// The kernel's count of our programs' runs over [`VETH_COUNTED`] of the transfer.
struct CountedRuns {
    runs: u64,
    ns: u64,
    secs: f64,
    cpu: CpuTicks,
    /// What the statistics add to each counted run, taken while they are on.
    stats_cost: f64,
}

/// Counts our programs' runs (attached under `pins`) for [`VETH_COUNTED`] with
/// `kernel.bpf_stats_enabled` on, then sets it back; `None` where it cannot be turned on.
fn count_our_runs(pins: &rackwarden::pins::PinPaths) -> Option<CountedRuns> {
    let _on = BpfStatsOn::enable()?;
    let (r0, c0, t0) = (
        our_programs_run_stats(pins),
        CpuTicks::now(),
        std::time::Instant::now(),
    );
    std::thread::sleep(VETH_COUNTED);
    let (r1, c1, t1) = (
        our_programs_run_stats(pins),
        CpuTicks::now(),
        std::time::Instant::now(),
    );
    Some(CountedRuns {
        runs: r1.0 - r0.0,
        ns: r1.1 - r0.1,
        secs: (t1 - t0).as_secs_f64(),
        cpu: c1.since(&c0),
        stats_cost: stats_cost_per_run(),
    })
}

/// ns per run that `kernel.bpf_stats_enabled` counts for the empty program (`r0 = 0; exit`)
/// over 10^6 test runs: the statistics' own clock reads, which every counted run of ours
/// carries too. Taken hot, so it is the least they cost, and what is subtracted is not more
/// than they added.
fn stats_cost_per_run() -> f64 {
    use std::os::fd::FromRawFd;
    let anchor = load_return_ok();
    // SAFETY: `anchor` is a program fd this function owns from here on.
    let anchor = unsafe { std::os::fd::OwnedFd::from_raw_fd(anchor) };
    let before = rackwarden::bpf_syscall::prog_run_stats(&anchor).unwrap();
    let (_, verdict) = test_run(anchor.as_raw_fd(), 1_000_000);
    assert_eq!(verdict, TC_ACT_OK, "the empty program returns TC_ACT_OK");
    let after = rackwarden::bpf_syscall::prog_run_stats(&anchor).unwrap();
    let runs = after.0 - before.0;
    assert!(runs > 0, "the kernel counted the empty program's test runs");
    (after.1 - before.1) as f64 / runs as f64
}

/// Run count and run time summed over the programs pinned under `pins`.
fn our_programs_run_stats(pins: &rackwarden::pins::PinPaths) -> (u64, u64) {
    let mut sum = (0, 0);
    for e in std::fs::read_dir(pins.progs_dir()).unwrap() {
        let fd = rackwarden::bpf_syscall::obj_get(&e.unwrap().path()).unwrap();
        let (runs, ns) = rackwarden::bpf_syscall::prog_run_stats(&fd).unwrap();
        sum = (sum.0 + runs, sum.1 + ns);
    }
    sum
}

// ---- 3. accuracy: delivered vs burst + rate x T, ours next to kernel tbf ----

fn accuracy_vs_tbf() {
    let rate = 1_000_000u64;
    let burst = 262_144u64;
    let secs = 5.0;
    println!(
        "\n-- accuracy: UDP flood {secs} s at {rate} B/s, burst {burst} B; delivered / (burst + rate x T) --"
    );
    // Anchor: kernel tbf on the rack side's veth.
    let net = Net::new("btbf");
    let out = Command::new("tc")
        .args([
            "-n",
            &net.rack_ns,
            "qdisc",
            "add",
            "dev",
            &net.rack_if,
            "root",
            "tbf",
        ])
        .args([
            "rate",
            &format!("{rate}bps"),
            "burst",
            &burst.to_string(),
            "limit",
            &burst.to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tc tbf: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (tf, tt) = net.egress_flood(secs);
    let tbf_ratio = tf as f64 / (burst as f64 + rate as f64 * tt);
    drop(net);
    // Ours, through the daemon with the same rate and burst.
    let net = Net::new("bour");
    let cfg = net.write_config("1 MB/s", "1 MB/s", "256 KiB");
    let _d = Daemon::start(&cfg, &net.socket_path());
    std::thread::sleep(Duration::from_millis(200));
    let (of, ot) = net.egress_flood(secs);
    let our_ratio = of as f64 / (burst as f64 + rate as f64 * ot);
    println!("{:<40} {:>12} {:>10}", "limiter", "delivered B", "of bound");
    println!(
        "{:<40} {:>12} {:>9.3}%",
        "anchor: kernel tbf (qdisc)",
        tf,
        tbf_ratio * 100.0
    );
    println!(
        "{:<40} {:>12} {:>9.3}%",
        "rackwarden policer",
        of,
        our_ratio * 100.0
    );
    println!("ratio ours/tbf: {:.4}x", our_ratio / tbf_ratio);
}
