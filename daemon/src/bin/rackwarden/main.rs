//! rackwarden: the operator's command line. All logic is in the `rackwarden` library.
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use rackwarden::{
    config::Config,
    control::{self, Request, Response},
};

#[derive(Parser)]
#[command(version, about = "Operate and inspect rackwarden")]
struct Cli {
    /// Configuration file (names the control socket).
    #[arg(long, global = true, default_value = rackwarden::config::DEFAULT_PATH)]
    config: PathBuf,
    /// Control socket; overrides the one named in the config.
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Caps, counters, recent rates, attachments and enforcement gaps.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Change the running caps.
    Cap {
        #[command(subcommand)]
        cmd: CapCmd,
    },
    /// Write a new ed25519 key pair: DIR/NAME.key (PKCS#8 PEM, 0600) and DIR/NAME.pub.
    Keygen {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value = "host")]
        name: String,
    },
    /// Append one signed statement describing the current enforcement state to the log.
    Attest {
        #[arg(long)]
        key: PathBuf,
        #[arg(long)]
        log: PathBuf,
        /// Hex of the verifier's 32-byte challenge; without it the statement says "unchallenged".
        #[arg(long)]
        nonce: Option<String>,
    },
    /// Check every statement of a log: signature, chain, time. Exits 1 on any failure.
    Verify {
        #[arg(long)]
        key: PathBuf,
        log: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Fill and verify memory with a stream keyed by a challenge nonce; report residue.
    Wipe {
        /// host, gpu, scratch or all.
        #[arg(long, default_value = "all")]
        backend: String,
        /// Most bytes to take per device, e.g. "256 MiB" (default: all that is safe).
        #[arg(long)]
        max_bytes: Option<String>,
        /// Hex of the 32-byte challenge (default: a fresh random one, printed).
        #[arg(long)]
        nonce: Option<String>,
        /// Host memory to leave untouched.
        #[arg(long, default_value = "1 GiB")]
        reserve: String,
        /// Scratch directories to empty (with --backend scratch or all).
        #[arg(long)]
        scratch: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// The arithmetic behind the caps: transfer times, slowdown, state bound per wipe epoch.
    Budget {
        /// Model parameters, e.g. 1e12.
        #[arg(long)]
        params: f64,
        /// Gradient dtype as sent: fp32, bf16, fp16, fp8, int8, fp4, int4.
        #[arg(long, default_value = "fp8")]
        dtype: String,
        /// Low-communication sync compression relative to an fp32 gradient.
        #[arg(long, default_value_t = 146.0)]
        compression: f64,
        #[arg(long, default_value_t = 30.0)]
        inner_steps: f64,
        #[arg(long, default_value = "10 s")]
        step_time: String,
        #[arg(long, default_value = "10 MB/s")]
        cap: String,
        #[arg(long, default_value = "15 min")]
        wipe_interval: String,
        /// Trainable-state bytes per parameter: weights (bf16: 2) ...
        #[arg(long, default_value_t = 2.0)]
        weight_bytes_per_param: f64,
        /// ... plus optimizer state (Adam in fp32: 8).
        #[arg(long, default_value_t = 8.0)]
        optimizer_bytes_per_param: f64,
        #[arg(long, default_value_t = 4.0)]
        bytes_per_token: f64,
        #[arg(long)]
        json: bool,
    },
    /// Image digests and verified staging.
    Image {
        #[command(subcommand)]
        cmd: ImageCmd,
    },
    /// Signed image manifests (the verifier side makes them).
    Manifest {
        #[command(subcommand)]
        cmd: ManifestCmd,
    },
    /// Check a configuration file and print what it means.
    CheckConfig {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum CapCmd {
    /// Set the rack cap (this host enforces cap x host_share), e.g. --egress "5 MB/s".
    Set {
        #[arg(long)]
        egress: Option<String>,
        #[arg(long)]
        ingress: Option<String>,
        /// Also rewrite the config file so the cap survives a restart.
        #[arg(long)]
        persist: bool,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ImageCmd {
    /// Print the merkle_sha3_256 of each file.
    Digest {
        files: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
        /// Worker threads (default: all cores). The digest does not depend on it.
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Verify MANIFEST, then copy, hash and seal the whole set from SOURCE under STAGING.
    Stage {
        #[arg(long)]
        manifest: PathBuf,
        /// The verifier's public key (the manifest's signer).
        #[arg(long)]
        key: PathBuf,
        #[arg(long)]
        source: PathBuf,
        #[arg(long)]
        staging: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ManifestCmd {
    /// Digest every file under DIR... and write a manifest signed with the verifier's KEY.
    Create {
        #[arg(long)]
        key: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// Also write leaf-hash sidecars so a mismatch names its first bad chunk.
        #[arg(long)]
        sidecars: bool,
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
    },
    /// Check a manifest's signature and contents.
    Verify {
        #[arg(long)]
        key: PathBuf,
        manifest: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

fn image_cmd(cmd: &ImageCmd) -> anyhow::Result<()> {
    use rackwarden::{images, progress::Progress};
    use rackwarden_attest::merkle;
    match cmd {
        ImageCmd::Digest {
            files,
            json,
            threads,
        } => {
            let threads = threads.unwrap_or_else(merkle::default_threads);
            let mut out = Vec::new();
            for f in files {
                let file = std::fs::File::open(f).with_context(|| format!("{}", f.display()))?;
                let size = file.metadata()?.len();
                let p = Progress::start(f.display().to_string(), size);
                let d = merkle::digest_file(&file, size, threads, None, Some(&p.done))
                    .with_context(|| format!("{}", f.display()))?;
                drop(p);
                if !*json {
                    println!("{}  {}  {}", d.hex(), size, f.display());
                }
                out.push(serde_json::json!({"file": f, "size": size, "merkle_sha3_256": d.hex()}));
            }
            if *json {
                println!("{}", serde_json::to_string_pretty(&out)?);
            }
        }
        ImageCmd::Stage {
            manifest,
            key,
            source,
            staging,
            json,
        } => {
            let vk = rackwarden_attest::keys::load_verifying_key(key)?;
            let set = images::stage(manifest, &vk, source, staging, merkle::default_threads())?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&set)?);
            } else {
                println!(
                    "staged and sealed {} images in {} (manifest {})",
                    set.images.len(),
                    set.dir.display(),
                    set.manifest_sha3_256
                );
                for i in &set.images {
                    println!("  {}  {:>14}  {}", i.merkle_sha3_256, i.size, i.name);
                }
            }
        }
    }
    Ok(())
}

fn manifest_cmd(cmd: &ManifestCmd) -> anyhow::Result<()> {
    use rackwarden::images;
    match cmd {
        ManifestCmd::Create {
            key,
            out,
            sidecars,
            dirs,
        } => {
            let sk = rackwarden_attest::keys::load_signing_key(key)?;
            let m = images::create_manifest(
                dirs,
                out,
                &sk,
                *sidecars,
                rackwarden_attest::merkle::default_threads(),
                None,
            )?;
            println!(
                "wrote {} ({} images, signed by keyid {})",
                out.display(),
                m.images.len(),
                rackwarden_attest::keys::keyid(&sk.verifying_key())
            );
        }
        ManifestCmd::Verify {
            key,
            manifest,
            json,
        } => {
            let vk = rackwarden_attest::keys::load_verifying_key(key)?;
            let vm = images::read_manifest(manifest, &vk)?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&vm.manifest)?);
            } else {
                println!(
                    "{}: signature ok, {} images",
                    manifest.display(),
                    vm.manifest.images.len()
                );
                for i in &vm.manifest.images {
                    println!("  {}  {:>14}  {}", i.merkle_sha3_256, i.size, i.path);
                }
            }
        }
    }
    Ok(())
}

fn socket(cli: &Cli) -> anyhow::Result<PathBuf> {
    if let Some(s) = &cli.socket {
        return Ok(s.clone());
    }
    Ok(Config::load(&cli.config)?.control_socket)
}

fn main() -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    match &cli.cmd {
        Cmd::Status { json } => {
            let sock = socket(&cli)?;
            match control::call(&sock, &Request::Status).context("is rackwardend running?")? {
                Response::Status(s) if *json => println!("{}", serde_json::to_string_pretty(&s)?),
                Response::Status(s) => print!("{}", s.render()),
                Response::Error { message } => bail!("rackwardend: {message}"),
                other => bail!("unexpected answer: {other:?}"),
            }
        }
        Cmd::Cap {
            cmd:
                CapCmd::Set {
                    egress,
                    ingress,
                    persist,
                    json,
                },
        } => {
            let sock = socket(&cli)?;
            let req = Request::CapSet {
                egress: egress.clone(),
                ingress: ingress.clone(),
                persist: *persist,
            };
            match control::call(&sock, &req).context("is rackwardend running?")? {
                Response::CapSet(o) if *json => println!("{}", serde_json::to_string_pretty(&o)?),
                Response::CapSet(o) => {
                    println!(
                        "applied: host egress {} B/s, ingress {} B/s (generation {})",
                        o.egress_host_bytes_per_s, o.ingress_host_bytes_per_s, o.generation
                    );
                    println!(
                        "persisted: {} ({})",
                        if o.persisted { "yes" } else { "no" },
                        o.persist_detail
                    );
                }
                Response::Error { message } => bail!("rackwardend refused: {message}"),
                other => bail!("unexpected answer: {other:?}"),
            }
        }
        Cmd::Keygen { out, name } => {
            let (k, p, key) = rackwarden_attest::keys::write_keypair(out, name)?;
            println!("private key: {} (0600)", k.display());
            println!("public key:  {}", p.display());
            println!(
                "keyid:       {}",
                rackwarden_attest::keys::keyid(&key.verifying_key())
            );
        }
        Cmd::Attest { key, log, nonce } => attest(&cli.config, key, log, nonce.as_deref())?,
        Cmd::Verify { key, log, json } => {
            let vk = rackwarden_attest::keys::load_verifying_key(key)?;
            let bytes = std::fs::read(log).with_context(|| format!("reading {}", log.display()))?;
            let r = rackwarden_attest::verify::verify_log(&bytes, &vk);
            if *json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!(
                    "{:>5} {:>10} {:>8} {:>15} {:<7} finding",
                    "line", "offset", "seq", "epoch end ms", "verdict"
                );
                for l in &r.lines {
                    let f: Vec<String> = l
                        .findings
                        .iter()
                        .map(|f| serde_json::to_string(f).unwrap_or_default())
                        .collect();
                    println!(
                        "{:>5} {:>10} {:>8} {:>15} {:<7} {}",
                        l.line,
                        l.offset,
                        l.seq.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
                        l.epoch_end_unix_ms
                            .map(|s| s.to_string())
                            .unwrap_or_else(|| "-".into()),
                        format!("{:?}", l.verdict).to_lowercase(),
                        f.join(" ")
                    );
                }
                println!(
                    "\n{}: {} ok, {} warnings, {} failures",
                    log.display(),
                    r.statements_ok,
                    r.warnings,
                    r.failures
                );
            }
            if !r.ok() {
                std::process::exit(1);
            }
        }
        Cmd::Image { cmd } => image_cmd(cmd)?,
        Cmd::Budget {
            params,
            dtype,
            compression,
            inner_steps,
            step_time,
            cap,
            wipe_interval,
            weight_bytes_per_param,
            optimizer_bytes_per_param,
            bytes_per_token,
            json,
        } => {
            use rackwarden::units;
            use rackwarden_attest::budget::{BudgetInput, dtype_bytes};
            let input = BudgetInput {
                params: *params,
                bytes_per_param: dtype_bytes(dtype).ok_or_else(|| {
                    anyhow::anyhow!(
                        "--dtype: unknown dtype `{dtype}` (fp32, bf16, fp16, fp8, int8, fp4, int4)"
                    )
                })?,
                compression_vs_fp32: *compression,
                inner_steps: *inner_steps,
                step_time_s: units::parse_duration(step_time)
                    .map_err(|e| anyhow::anyhow!("--step-time: {e}"))?
                    .as_secs_f64(),
                cap_bytes_per_s: units::parse_rate(cap)
                    .map_err(|e| anyhow::anyhow!("--cap: {e}"))?
                    .bytes_per_sec(Some(*bytes_per_token as u64))
                    .map_err(|e| anyhow::anyhow!("--cap: {e}"))?
                    as f64,
                wipe_interval_s: units::parse_duration(wipe_interval)
                    .map_err(|e| anyhow::anyhow!("--wipe-interval: {e}"))?
                    .as_secs_f64(),
                optimizer_bytes_per_param: *optimizer_bytes_per_param,
                weight_bytes_per_param: *weight_bytes_per_param,
                bytes_per_token: *bytes_per_token,
            };
            input.validate().map_err(anyhow::Error::msg)?;
            let o = input.compute();
            if *json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({"input": input, "output": o})
                    )?
                );
            } else {
                let t = |s: f64| {
                    if s >= 86400.0 {
                        format!("{:.2} days", s / 86400.0)
                    } else if s >= 3600.0 {
                        format!("{:.2} h", s / 3600.0)
                    } else if s >= 60.0 {
                        format!("{:.1} min", s / 60.0)
                    } else {
                        format!("{s:.1} s")
                    }
                };
                println!(
                    "cap {}  wipe every {}",
                    units::fmt_rate(input.cap_bytes_per_s),
                    t(input.wipe_interval_s)
                );
                println!("{:<48} {:>16} {:>14}", "", "bytes", "time at cap");
                println!(
                    "{:<48} {:>16} {:>14}",
                    format!("full gradient ({} B/param)", input.bytes_per_param),
                    units::fmt_bytes(o.full_gradient_bytes),
                    t(o.full_gradient_send_s)
                );
                println!(
                    "{:<48} {:>16} {:>14}",
                    format!("compressed sync ({}x vs fp32)", input.compression_vs_fp32),
                    units::fmt_bytes(o.compressed_sync_bytes),
                    t(o.compressed_sync_send_s)
                );
                println!(
                    "{:<48} {:>16} {:>14}",
                    format!(
                        "compute per sync ({} steps x {})",
                        input.inner_steps,
                        t(input.step_time_s)
                    ),
                    "",
                    t(o.compute_per_sync_s)
                );
                println!("slowdown vs free syncing: {:.1}x", o.slowdown_factor);
                println!(
                    "bytes that can cross per wipe epoch: {} = {:.4}% of the trainable state ({})",
                    units::fmt_bytes(o.bytes_per_wipe_epoch),
                    100.0 * o.epoch_fraction_of_state,
                    units::fmt_bytes(o.trainable_state_bytes)
                );
                println!(
                    "tokens/s the cap allows at {} B/token: {:.0}",
                    input.bytes_per_token, o.tokens_per_s
                );
            }
        }
        Cmd::Wipe {
            backend,
            max_bytes,
            nonce,
            reserve,
            scratch,
            json,
        } => {
            let code = wipe_cmd(
                backend,
                max_bytes.as_deref(),
                nonce.as_deref(),
                reserve,
                scratch,
                *json,
            )?;
            std::process::exit(code);
        }
        Cmd::Manifest { cmd } => manifest_cmd(cmd)?,
        Cmd::CheckConfig { json } => {
            let cfg = Config::load(&cli.config)?;
            let v = serde_json::json!({
                "rack_id": cfg.rack_id, "host_id": cfg.host_id, "host_share": cfg.host_share,
                "interfaces": cfg.interfaces,
                "rack_egress_bytes_per_s": cfg.rack_egress_bytes_per_s,
                "rack_ingress_bytes_per_s": cfg.rack_ingress_bytes_per_s,
                "host_egress_bytes_per_s": cfg.host_egress_bytes_per_s(),
                "host_ingress_bytes_per_s": cfg.host_ingress_bytes_per_s(),
                "burst_bytes": cfg.burst_bytes, "pin_root": cfg.pin_root,
            });
            if *json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("{}: ok", cfg.path.display());
                println!("{}", serde_json::to_string_pretty(&v)?);
            }
        }
    }
    Ok(())
}

fn attest(
    config: &std::path::Path,
    key: &std::path::Path,
    log: &std::path::Path,
    nonce: Option<&str>,
) -> anyhow::Result<()> {
    use rackwarden_attest::{
        dsse,
        log::EvidenceLog,
        statement::{Challenge, EpochPredicate, Statement},
    };
    let cfg = Config::load(config)?;
    let challenge = match nonce {
        None => Challenge::Unchallenged,
        Some(h) => {
            let b = hex::decode(h).context("--nonce is not hex")?;
            if b.len() != 32 {
                bail!(
                    "--nonce must be 32 bytes (64 hex digits); it is {} bytes",
                    b.len()
                );
            }
            Challenge::Nonce {
                nonce: hex::encode(b),
            }
        }
    };
    let sk = rackwarden_attest::keys::load_signing_key(key)?;
    let mut elog = EvidenceLog::open(log, &sk.verifying_key())?;
    // Single-threaded here, so setns moves the whole process before any inspection.
    if let Some(ns) = &cfg.netns {
        rackwarden::netns::enter(ns)?;
    }
    let now = rackwarden::gaps::now_ms();
    let start = elog
        .tip
        .map(|t| t.epoch_end_unix_ms.min(now))
        .unwrap_or(now);
    let (seq, prev) = elog.next_link();
    let predicate = EpochPredicate {
        rack_id: cfg.rack_id.clone(),
        host_id: cfg.host_id.clone(),
        seq,
        prev,
        challenge,
        epoch_start_unix_ms: start,
        epoch_end_unix_ms: now,
        limiter: rackwarden::evidence::limiter_report(&cfg, start),
        wipe: None,
        images: None,
        incidents: elog.pending_incidents.clone(),
        producer: rackwarden::evidence::producer("rackwarden"),
    };
    let st = Statement::new(vec![], predicate);
    let env = dsse::sign(&sk, dsse::INTOTO_PAYLOAD_TYPE, &st.to_json());
    elog.append(&env, &st)?;
    let limiter = match &st.predicate.limiter {
        rackwarden_attest::evidence::LimiterReport::Present(e) => format!(
            "present ({} programs, {} gaps in epoch)",
            e.programs.len(),
            e.gaps.len()
        ),
        rackwarden_attest::evidence::LimiterReport::Absent { finding } => {
            format!("ABSENT: {finding}")
        }
    };
    println!(
        "appended seq {seq} to {} (fsynced); limiter {limiter}; incidents disclosed: {}",
        log.display(),
        st.predicate.incidents.len()
    );
    Ok(())
}

/// Exit code: 0 when every device is complete without mismatches, or absent; 1 on
/// mismatches or failures; 2 when interrupted.
fn wipe_cmd(
    backend: &str,
    max_bytes: Option<&str>,
    nonce: Option<&str>,
    reserve: &str,
    scratch: &[PathBuf],
    json: bool,
) -> anyhow::Result<i32> {
    use rackwarden::{units, wipe};
    let backends = wipe::Backend::parse(backend).map_err(anyhow::Error::msg)?;
    let max_bytes = max_bytes
        .map(units::parse_size)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--max-bytes: {e}"))?;
    let reserve_bytes =
        units::parse_size(reserve).map_err(|e| anyhow::anyhow!("--reserve: {e}"))?;
    let nonce: [u8; 32] = match nonce {
        Some(h) => hex::decode(h)
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| anyhow::anyhow!("--nonce must be 64 hex digits (32 bytes)"))?,
        None => {
            let mut n = [0u8; 32];
            // SAFETY: getrandom fills the buffer we own.
            let got = unsafe { libc::getrandom(n.as_mut_ptr() as *mut libc::c_void, 32, 0) };
            if got != 32 {
                bail!("getrandom failed");
            }
            n
        }
    };
    let stop = rackwarden::agent::stop_on_signals();
    let expect = 2 * max_bytes.unwrap_or_else(|| wipe::host::meminfo("MemAvailable").unwrap_or(0));
    let progress = rackwarden::progress::Progress::start("wipe".into(), expect);
    let req = wipe::WipeRequest {
        nonce,
        backends,
        max_bytes,
        reserve_bytes,
        scratch_paths: scratch.to_vec(),
        threads: rackwarden_attest::merkle::default_threads(),
        progress: Some(progress.done.clone()),
        corrupt_byte_for_test: None,
    };
    let report = wipe::run(&req, stop);
    drop(progress);
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "nonce {}{}",
            report.nonce,
            if report.interrupted {
                "  (INTERRUPTED)"
            } else {
                ""
            }
        );
        println!(
            "{:<40} {:<12} {:>16} {:>16} {:>16} {:>10} {:>16} {:>9} {:>9}",
            "device",
            "status",
            "total B",
            "filled B",
            "verified B",
            "mismatch",
            "residue B",
            "fill GB/s",
            "ver GB/s"
        );
        let gbps = |b: u64, ms: u64| {
            if ms == 0 {
                "-".to_string()
            } else {
                format!("{:.2}", b as f64 / ms as f64 / 1e6)
            }
        };
        for d in &report.devices {
            println!(
                "{:<40} {:<12} {:>16} {:>16} {:>16} {:>10} {:>16} {:>9} {:>9}",
                d.device,
                d.status,
                d.bytes_total,
                d.bytes_filled,
                d.bytes_verified,
                d.mismatches,
                d.residue_bytes,
                gbps(d.bytes_filled, d.fill_ms),
                gbps(d.bytes_verified, d.verify_ms)
            );
            if let Some(x) = &d.detail {
                println!("    {x}");
            }
        }
    }
    let bad = report
        .devices
        .iter()
        .any(|d| d.mismatches > 0 || d.status == "failed");
    Ok(if report.interrupted {
        2
    } else if bad {
        1
    } else {
        0
    })
}
