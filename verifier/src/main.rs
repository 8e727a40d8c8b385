//! rackwarden-verifier: the verifying party's service. All logic is in the library; each
//! command here calls it and prints what it returns.
use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use rackwarden_verifier::{
    api,
    config::{Transport, VerifierConfig},
    log_key, recheck,
    serve::{self, ConnLimits},
    service::Verifier,
    standing::EnrolledHost,
    store::Store,
    tls,
};

#[derive(Parser)]
#[command(
    version,
    about = "Checks rackwarden attestations and shows each rack's standing"
)]
struct Cli {
    /// Configuration file (listen address, database, policy, racks).
    #[arg(
        long,
        global = true,
        default_value = "/etc/rackwarden-verifier/verifier.toml"
    )]
    config: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve the HTTP API and the auditor's pages (TLS unless `insecure_http` on loopback).
    Serve,
    /// Make a CA and a server certificate for `serve` (for a verifier without its own PKI):
    /// writes ca.pem (hosts' `[verifier] ca`), server.pem and server.key (`tls_cert`,
    /// `tls_key`) and server-leaf.pem (hosts' `[verifier] pinned_cert`).
    TlsInit {
        /// DNS names and IP addresses hosts use to reach the verifier.
        #[arg(long = "name", required = true)]
        names: Vec<String>,
        /// Directory to write into (created; existing files are not overwritten).
        #[arg(long)]
        out: PathBuf,
    },
    /// Enroll (or rotate) a host's public key.
    Enroll {
        /// The rack the host belongs to (a `[racks.<id>]` of the policy).
        #[arg(long)]
        rack: String,
        /// The host's id, as its config's `host_id`.
        #[arg(long)]
        host: String,
        /// The host's public key (SPKI PEM, `host.pub` from `rackwarden keygen`).
        #[arg(long)]
        key: PathBuf,
    },
    /// Retire a host's current key (it leaves its rack; its history is kept).
    Retire {
        /// The rack.
        #[arg(long)]
        rack: String,
        /// The host.
        #[arg(long)]
        host: String,
    },
    /// List enrolled hosts: keys, enrollment and retirement times, last statement.
    Hosts {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Clear a host's contraindicated statements after investigating them; the clearing is
    /// recorded with its reason and shown in the host's standing. Local only: no HTTP
    /// endpoint changes state beyond ingesting signed statements.
    Clear {
        /// The rack.
        #[arg(long)]
        rack: String,
        /// The host.
        #[arg(long)]
        host: String,
        /// Why: what was found and done (kept with the clearance).
        #[arg(long)]
        reason: String,
        /// Who clears it: the person answerable for the decision (kept and shown).
        #[arg(long)]
        by: String,
    },
    /// List every clearance: who cleared which host's statements, when, why, and which.
    Clearances {
        /// Only this rack's.
        #[arg(long)]
        rack: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the AKs enrolled through `/v1/tpm/enroll` and `/v1/tpm/activate`: each host's
    /// AK Name, the CA that certified its EK, and when it was enrolled.
    TpmEnrollments {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The transparency log of stored statements: its key, a static copy, offline checks.
    #[command(subcommand)]
    Log(LogCmd),
    /// Re-derive every stored verdict, host standing and rack state bound from the stored
    /// statements. Exits 1 when a verdict does not re-derive under the policy it names (or
    /// names none and differs), a standing row, the transparency log or a state bound
    /// differs; exits 0 otherwise, also when verdicts differ only because the policy was
    /// edited since (those are listed).
    Recheck {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum LogCmd {
    /// Print the log's verifier key (C2SP vkey: what hosts set as `[verifier] log_key`).
    Vkey,
    /// Write the log as static files: `checkpoint` and every tile under `tile/` (what a
    /// third party checks with `log verify --tiles DIR`).
    Export {
        /// Directory to write into (created).
        #[arg(long)]
        out: PathBuf,
    },
    /// Check a checkpoint offline: its signature, that the tiles hash to its root, every
    /// entry against its leaf hash, and that each `--old` checkpoint is a prefix of it.
    /// Needs no config.
    Verify {
        /// The signed checkpoint (a file).
        #[arg(long)]
        checkpoint: PathBuf,
        /// The log's key: a vkey, or a file holding one (`tlog.vkey`).
        #[arg(long)]
        key: String,
        /// The log's tiles: a directory (`tile/...`, as `log export` writes them) or the
        /// URL of a verifier's log (`https://verifier.example:7700/tlog`). Without it, only
        /// the signature is checked.
        #[arg(long)]
        tiles: Option<String>,
        /// The CA (PEM) to trust for an https:// --tiles URL (a verifier's `ca.pem`).
        #[arg(long)]
        ca: Option<PathBuf>,
        /// Earlier checkpoints (files) that must be prefixes of this one.
        #[arg(long = "old")]
        old: Vec<PathBuf>,
    },
}

fn open(cfg: &VerifierConfig) -> anyhow::Result<Verifier> {
    let store =
        Store::connect(&cfg.database).with_context(|| format!("database {}", cfg.database))?;
    Ok(Verifier::new(store, cfg.policy.clone())?.with_tpm_enrolment(cfg.tpm.clone()))
}

fn main() -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    // tls-init makes what `serve` will need: it runs before a config exists.
    if let Cmd::TlsInit { names, out } = &cli.cmd {
        return tls_init(names, out);
    }
    // An offline check needs no config: a third party runs it.
    if let Cmd::Log(LogCmd::Verify {
        checkpoint,
        key,
        tiles,
        ca,
        old,
    }) = &cli.cmd
    {
        return log_verify(checkpoint, key, tiles.as_deref(), ca.as_deref(), old);
    }
    let cfg = VerifierConfig::load(&cli.config)?;
    match cli.cmd {
        Cmd::TlsInit { .. } => Ok(()),
        Cmd::Serve => serve(cfg),
        Cmd::Enroll { rack, host, key } => enroll(&cfg, &rack, &host, &key),
        Cmd::Retire { rack, host } => retire(&cfg, &rack, &host),
        Cmd::Hosts { json } => hosts(&cfg, json),
        Cmd::Clear {
            rack,
            host,
            reason,
            by,
        } => clear(&cfg, &rack, &host, &by, &reason),
        Cmd::Clearances { rack, json } => clearances(&cfg, rack.as_deref(), json),
        Cmd::TpmEnrollments { json } => tpm_enrollments(&cfg, json),
        Cmd::Recheck { json } => recheck(&cfg, json),
        Cmd::Log(LogCmd::Vkey) => {
            let signer = log_key::open_or_create(&cfg.log_key, &cfg.log_origin)?;
            println!("{}", signer.verifier().vkey());
            Ok(())
        }
        Cmd::Log(LogCmd::Export { out }) => log_export(&cfg, &out),
        Cmd::Log(LogCmd::Verify { .. }) => Ok(()),
    }
}

fn serve(cfg: VerifierConfig) -> anyhow::Result<()> {
    let tls = match &cfg.transport {
        Transport::Tls { cert, key } => Some(tls::server_config(cert, &key.path()?)?),
        Transport::InsecureHttp => {
            log::warn!(
                "plain HTTP on {} (insecure_http = true, loopback only)",
                cfg.listen
            );
            None
        }
    };
    let signer = log_key::open_or_create(&cfg.log_key, &cfg.log_origin)?;
    log::info!(
        "transparency log `{}`: key {}",
        cfg.log_origin,
        log_key::vkey_path(&cfg.log_key).display()
    );
    let verifier = open(&cfg)?;
    // Instances on one database share one log: each must sign it with the same key and
    // origin, or hosts could not check half of its checkpoints. Fail closed at start.
    let vkey = signer.verifier().vkey();
    if let Some(recorded) = verifier.store.claim_log_key(&vkey)? {
        anyhow::bail!(
            "the database's transparency log is signed with {recorded}, and this instance's log key ({}) and origin (`{}`) give {vkey}: give every instance on one database the same `log_key` file and `log_origin`",
            cfg.log_key.display(),
            cfg.log_origin
        );
    }
    let state = Arc::new(api::AppState::new(verifier.with_log(signer)));
    // The last reference to the state (and its database connection) is dropped here, after
    // the runtime: a PostgreSQL connection closes by blocking on its own runtime, which it
    // may not do from inside another.
    let kept = state.clone();
    let rt = tokio::runtime::Runtime::new()?;
    let served = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .with_context(|| format!("listen on {}", cfg.listen))?;
        log::info!(
            "listening on {}://{} (policy {})",
            if tls.is_some() { "https" } else { "http" },
            listener.local_addr()?,
            cfg.policy.id
        );
        serve::serve(
            listener,
            api::router(state, cfg.max_body_bytes, cfg.request_timeout),
            ConnLimits {
                max_connections: cfg.max_connections,
                header_timeout: cfg.header_timeout,
            },
            tls,
            async {
                let _ = tokio::signal::ctrl_c().await;
            },
        )
        .await?;
        anyhow::Ok(())
    });
    drop(rt);
    drop(kept);
    served
}

fn enroll(cfg: &VerifierConfig, rack: &str, host: &str, key: &Path) -> anyhow::Result<()> {
    let pem = std::fs::read_to_string(key).with_context(|| format!("{}", key.display()))?;
    let e = open(cfg)?.enroll(rack, host, &pem, api::now_ms())?;
    for w in &e.warnings {
        eprintln!("warning: {w}");
    }
    if e.already {
        println!("{rack}/{host} is already enrolled with keyid {}", e.keyid);
    } else {
        println!("enrolled {rack}/{host} with keyid {}", e.keyid);
    }
    Ok(())
}

fn retire(cfg: &VerifierConfig, rack: &str, host: &str) -> anyhow::Result<()> {
    let keyid = open(cfg)?.retire(rack, host, api::now_ms())?;
    println!(
        "retired keyid {keyid} of {rack}/{host}: statements it signs from now on are retired_key"
    );
    Ok(())
}

fn hosts(cfg: &VerifierConfig, json: bool) -> anyhow::Result<()> {
    let rows = open(cfg)?.hosts()?;
    if json {
        // Through `Value`: keys in order, as this listing has always printed them.
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::to_value(&rows)?)?
        );
        return Ok(());
    }
    println!(
        "{:<16} {:<16} {:<18} {:<25} {:<25} {:>8} {:<18} key",
        "rack", "host", "keyid", "enrolled", "retired", "last seq", "status"
    );
    for r in &rows {
        println!("{}", host_line(r));
    }
    Ok(())
}

/// One row of the `hosts` table.
fn host_line(r: &EnrolledHost) -> String {
    let time = |t: Option<u64>| {
        t.map(rackwarden_attest::units::fmt_unix_ms)
            .unwrap_or_else(|| "-".into())
    };
    let key = match (r.from_seq, r.retired_after_seq) {
        (_, Some(last)) => format!("{} (signs up to seq {last})", r.state),
        (Some(first), None) => format!("{} (signs from seq {first})", r.state),
        (None, None) => r.state.to_string(),
    };
    format!(
        "{:<16} {:<16} {:<18} {:<25} {:<25} {:>8} {:<18} {key}",
        r.rack,
        r.host,
        r.keyid.get(..16).unwrap_or(&r.keyid),
        time(Some(r.enrolled_ms)),
        time(r.retired_ms),
        r.last_seq
            .map(|x| x.to_string())
            .unwrap_or_else(|| "-".into()),
        r.last_status.as_deref().unwrap_or("-")
    )
}

fn clear(
    cfg: &VerifierConfig,
    rack: &str,
    host: &str,
    by: &str,
    reason: &str,
) -> anyhow::Result<()> {
    if reason.trim().is_empty() {
        anyhow::bail!("--reason must say what was found and done");
    }
    if by.trim().is_empty() {
        anyhow::bail!("--by must name who clears it");
    }
    let c = open(cfg)?.clear(rack, host, by.trim(), reason, api::now_ms())?;
    println!(
        "cleared {} contraindicated statement(s) of {rack}/{host} (up to row {}) by {}: {}",
        c.statements,
        c.clearance.up_to_id,
        by.trim(),
        c.clearance.reason
    );
    Ok(())
}

fn clearances(cfg: &VerifierConfig, rack: Option<&str>, json: bool) -> anyhow::Result<()> {
    let list = open(cfg)?.clearances(rack)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    if list.is_empty() {
        println!("no clearances");
    }
    for c in &list {
        let cleared: Vec<String> = c
            .cleared
            .iter()
            .map(|s| {
                let codes: Vec<&str> = s.codes.iter().map(|c| c.name()).collect();
                format!("seq {} ({})", s.seq, codes.join(", "))
            })
            .collect();
        println!(
            "{} {}/{} cleared by {}: {}\n    cleared: {}",
            rackwarden_attest::units::fmt_unix_ms(c.cleared_ms),
            c.rack,
            c.host,
            c.by.as_deref().unwrap_or("(not recorded)"),
            c.reason,
            if cleared.is_empty() {
                "nothing contraindicated".into()
            } else {
                cleared.join(", ")
            }
        );
    }
    Ok(())
}

fn tpm_enrollments(cfg: &VerifierConfig, json: bool) -> anyhow::Result<()> {
    let rows = open(cfg)?.tpm_enrollments()?;
    if json {
        let list: Vec<serde_json::Value> = rows
            .iter()
            .map(|e| {
                serde_json::json!({
                    "rack": e.rack,
                    "host": e.host,
                    "ak_name": e.ak_name,
                    "ek_issuer": e.ek_issuer,
                    "enrolled_ms": e.enrolled_ms,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    if rows.is_empty() {
        println!("no AK enrolled");
        return Ok(());
    }
    println!(
        "{:<16} {:<16} {:<25} {:<68} ek issuer",
        "rack", "host", "enrolled", "ak name"
    );
    for e in &rows {
        println!(
            "{:<16} {:<16} {:<25} {:<68} {}",
            e.rack,
            e.host,
            rackwarden_attest::units::fmt_unix_ms(e.enrolled_ms),
            e.ak_name,
            e.ek_issuer
        );
    }
    Ok(())
}

fn recheck(cfg: &VerifierConfig, json: bool) -> anyhow::Result<()> {
    use recheck::DifferenceCause as Cause;
    let v = open(cfg)?;
    let r = recheck::recheck(&v.store, &cfg.policy)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "{} statements re-derived, {} differences",
            r.statements,
            r.differences.len()
        );
        let edited = r.count(|c| matches!(c, Cause::PolicyChanged { .. }));
        let not_rederived = r.count(|c| *c == Cause::NotRederived);
        let unnamed = r.count(|c| *c == Cause::NoPolicyDigest);
        println!(
            "{} host standings re-derived, {} differ from the rows the pages read",
            r.standings,
            r.standing_differences.len()
        );
        println!(
            "transparency log: {} differences from the stored statements",
            r.log_differences.len()
        );
        for d in &r.log_differences {
            println!("  {d}");
        }
        for b in &r.state_bounds {
            println!(
                "rack {}: state bound {} (policy {}){}{}",
                b.rack,
                b.bound
                    .total_bytes
                    .map_or("unbounded".into(), rackwarden_attest::units::fmt_size),
                rackwarden_attest::units::fmt_size(b.bound.limit_bytes),
                if b.bound.exceeded() { ": EXCEEDED" } else { "" },
                if b.rederived_equal {
                    ""
                } else {
                    "; the re-derived store gives another bound"
                }
            );
        }
        for d in &r.standing_differences {
            println!(
                "  {}/{}: stored {:?}, re-derived {:?}",
                d.rack, d.host, d.stored, d.rederived
            );
        }
        if edited > 0 {
            println!(
                "policy changed: {edited} verdicts would differ under the current policy ({})",
                r.policy_digest.get(..16).unwrap_or(&r.policy_digest)
            );
        }
        if not_rederived > 0 {
            println!(
                "{not_rederived} stored verdicts do not re-derive under the policy they were made with (tampering, or an appraisal that changed)"
            );
        }
        if unnamed > 0 {
            println!(
                "{unnamed} stored verdicts differ and name no policy (stored before verdicts named it): an edit cannot be told from tampering"
            );
        }
        for d in &r.differences {
            let why = match &d.cause {
                Cause::PolicyChanged { stored_digest } => format!(
                    "policy changed (stored under {})",
                    stored_digest.get(..16).unwrap_or(stored_digest)
                ),
                Cause::NotRederived => "does not re-derive under its own policy".into(),
                Cause::NoPolicyDigest => "names no policy".into(),
            };
            println!(
                "  {}/{} seq {}: stored {} [{}] re-derived {} [{}]: {why}",
                d.rack,
                d.host,
                d.seq,
                d.stored_status,
                d.stored_findings.join(", "),
                d.rederived_status,
                d.rederived_findings.join(", ")
            );
        }
    }
    if r.untrusted() {
        std::process::exit(1);
    }
    Ok(())
}

fn tls_init(names: &[String], out: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let g = tls::generate(names)?;
    std::fs::create_dir_all(out).with_context(|| format!("{}", out.display()))?;
    for (name, text, mode) in [
        ("ca.pem", &g.ca_pem, 0o644),
        ("server.pem", &g.chain_pem, 0o644),
        ("server-leaf.pem", &g.leaf_pem, 0o644),
        ("server.key", &g.key_pem, 0o600),
    ] {
        let path = out.join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .with_context(|| format!("{} (tls-init never overwrites)", path.display()))?;
        std::io::Write::write_all(&mut f, text.as_bytes())
            .and_then(|_| f.sync_all())
            .with_context(|| format!("{}", path.display()))?;
        println!("wrote {}", path.display());
    }
    println!(
        "verifier.toml: tls_cert = \"{}\", tls_key = \"{}\"; hosts: [verifier] ca = <copy of ca.pem> (or pinned_cert = <copy of server-leaf.pem>)",
        out.join("server.pem").display(),
        out.join("server.key").display()
    );
    Ok(())
}

fn log_export(cfg: &VerifierConfig, out: &Path) -> anyhow::Result<()> {
    let signer = log_key::open_or_create(&cfg.log_key, &cfg.log_origin)?;
    let files = open(cfg)?.with_log(signer).log_publish()?;
    for (path, bytes) in &files {
        let dest = out.join(path);
        if let Some(dir) = dest.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
        }
        std::fs::write(&dest, bytes).with_context(|| format!("{}", dest.display()))?;
    }
    println!(
        "wrote the checkpoint and {} tiles to {}",
        files.len() - 1,
        out.display()
    );
    Ok(())
}

/// Reads a tile by its path under a log's URL.
fn tile_fetcher(
    url: &str,
    ca: Option<&Path>,
) -> anyhow::Result<impl Fn(&str) -> anyhow::Result<Vec<u8>>> {
    let mut b = reqwest::blocking::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .tls_built_in_root_certs(false);
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).with_context(|| format!("{}", ca.display()))?;
        b = b.add_root_certificate(
            reqwest::Certificate::from_pem(&pem).with_context(|| format!("{}", ca.display()))?,
        );
    }
    let client = b.build()?;
    let base = url.trim_end_matches('/').to_string();
    Ok(move |p: &str| -> anyhow::Result<Vec<u8>> {
        let u = format!("{base}/{p}");
        let r = client.get(&u).send().with_context(|| u.clone())?;
        if !r.status().is_success() {
            anyhow::bail!("{u}: {}", r.status());
        }
        Ok(r.bytes().with_context(|| u.clone())?.to_vec())
    })
}

fn log_verify(
    checkpoint: &Path,
    key: &str,
    tiles: Option<&str>,
    ca: Option<&Path>,
    old: &[PathBuf],
) -> anyhow::Result<()> {
    use rackwarden_attest::tlog::audit;
    let log_key = audit::load_log_key(key)?;
    let read = |p: &Path| std::fs::read_to_string(p).with_context(|| format!("{}", p.display()));
    let note = read(checkpoint)?;
    let mut older = Vec::new();
    for o in old {
        older.push(
            log_key
                .open_checkpoint(&read(o)?)
                .with_context(|| format!("{}", o.display()))?,
        );
    }
    let Some(tiles) = tiles else {
        let cp = log_key
            .open_checkpoint(&note)
            .with_context(|| format!("{}", checkpoint.display()))?;
        println!(
            "signature OK: {} (no tiles given: nothing else checked)",
            cp.describe()
        );
        return Ok(());
    };
    let audited = if tiles.starts_with("http://") || tiles.starts_with("https://") {
        audit::audit_tiles(&log_key, &note, tile_fetcher(tiles, ca)?, true, &older)
    } else {
        let dir = Path::new(tiles);
        let fetch = |p: &str| std::fs::read(dir.join(p)).with_context(|| p.to_string());
        audit::audit_tiles(&log_key, &note, fetch, true, &older)
    }
    .with_context(|| format!("{}", checkpoint.display()))?;
    println!(
        "OK: {}: signature, root from the tiles, {} entries, {} older checkpoints consistent",
        audited.checkpoint.describe(),
        audited.entries,
        older.len()
    );
    Ok(())
}
