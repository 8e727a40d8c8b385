//! rackwarden-verifier: the verifying party's service. All logic is in the library.
use std::{path::PathBuf, sync::Arc};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use rackwarden_verifier::{
    api,
    config::{Transport, VerifierConfig},
    recheck,
    service::Verifier,
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
    },
    /// Re-derive every stored verdict from the stored statements; exits 1 on any difference.
    Recheck {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn open(cfg: &VerifierConfig) -> anyhow::Result<Verifier> {
    let store = Store::open(&cfg.database)
        .with_context(|| format!("database {}", cfg.database.display()))?;
    Ok(Verifier::new(store, cfg.policy.clone())?)
}

fn main() -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    if let Cmd::TlsInit { names, out } = &cli.cmd {
        return tls_init(names, out);
    }
    let cfg = VerifierConfig::load(&cli.config)?;
    match cli.cmd {
        Cmd::TlsInit { .. } => unreachable!("handled before the config is read"),
        Cmd::Serve => {
            let tls = match &cfg.transport {
                Transport::Tls { cert, key } => Some(tls::server_config(cert, key)?),
                Transport::InsecureHttp => {
                    log::warn!(
                        "plain HTTP on {} (insecure_http = true, loopback only)",
                        cfg.listen
                    );
                    None
                }
            };
            let v = open(&cfg)?;
            let state = Arc::new(api::AppState::new(v));
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind(cfg.listen)
                    .await
                    .with_context(|| format!("listen on {}", cfg.listen))?;
                log::info!(
                    "listening on {}://{} (policy {})",
                    if tls.is_some() { "https" } else { "http" },
                    listener.local_addr()?,
                    cfg.policy.id
                );
                rackwarden_verifier::serve::serve(
                    listener,
                    api::router(state, cfg.max_body_bytes, cfg.request_timeout),
                    rackwarden_verifier::serve::ConnLimits {
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
            })?;
        }
        Cmd::Enroll { rack, host, key } => {
            let pem =
                std::fs::read_to_string(&key).with_context(|| format!("{}", key.display()))?;
            let mut v = open(&cfg)?;
            let e = v.enroll(&rack, &host, &pem, api::now_ms())?;
            for w in &e.warnings {
                eprintln!("warning: {w}");
            }
            if e.already {
                println!("{rack}/{host} is already enrolled with keyid {}", e.keyid);
            } else {
                println!("enrolled {rack}/{host} with keyid {}", e.keyid);
            }
        }
        Cmd::Retire { rack, host } => {
            let mut v = open(&cfg)?;
            let keyid = v.retire(&rack, &host, api::now_ms())?;
            println!(
                "retired keyid {keyid} of {rack}/{host}: statements it signs from now on are retired_key"
            );
        }
        Cmd::Hosts { json } => {
            let v = open(&cfg)?;
            let mut rows = Vec::new();
            for k in v.store.host_keys()? {
                let last = v.store.history(&k.rack, &k.host, 1)?.into_iter().next();
                rows.push(serde_json::json!({
                    "rack": k.rack, "host": k.host, "keyid": k.keyid,
                    "enrolled_ms": k.enrolled_ms, "retired_ms": k.retired_ms,
                    "last_seq": last.as_ref().map(|s| s.seq),
                    "last_status": last.as_ref().map(|s| s.status.clone()),
                }));
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!(
                    "{:<16} {:<16} {:<18} {:<25} {:<25} {:>8} status",
                    "rack", "host", "keyid", "enrolled", "retired", "last seq"
                );
                for r in &rows {
                    let t = |k: &str| {
                        r[k].as_u64()
                            .map(rackwarden_attest::units::fmt_unix_ms)
                            .unwrap_or_else(|| "-".into())
                    };
                    println!(
                        "{:<16} {:<16} {:<18} {:<25} {:<25} {:>8} {}",
                        r["rack"].as_str().unwrap_or(""),
                        r["host"].as_str().unwrap_or(""),
                        &r["keyid"].as_str().unwrap_or("")
                            [..16.min(r["keyid"].as_str().unwrap_or("").len())],
                        t("enrolled_ms"),
                        t("retired_ms"),
                        r["last_seq"]
                            .as_u64()
                            .map(|x| x.to_string())
                            .unwrap_or_else(|| "-".into()),
                        r["last_status"].as_str().unwrap_or("-")
                    );
                }
            }
        }
        Cmd::Clear { rack, host, reason } => {
            if reason.trim().is_empty() {
                anyhow::bail!("--reason must say what was found and done");
            }
            let v = open(&cfg)?;
            let pending = v.store.contraindicated_after(
                &rack,
                &host,
                v.store
                    .last_clearance(&rack, &host)?
                    .map_or(0, |c| c.up_to_id),
            )?;
            let c = v.store.clear(&rack, &host, &reason, api::now_ms())?;
            println!(
                "cleared {} contraindicated statement(s) of {rack}/{host} (up to row {}): {}",
                pending.len(),
                c.up_to_id,
                c.reason
            );
        }
        Cmd::Recheck { json } => {
            let v = open(&cfg)?;
            let r = recheck::recheck(&v.store, &cfg.policy)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!(
                    "{} statements re-derived, {} differences",
                    r.statements,
                    r.differences.len()
                );
                for d in &r.differences {
                    println!(
                        "  {}/{} seq {}: stored {} re-derived {}",
                        d.rack, d.host, d.seq, d.stored_status, d.rederived_status
                    );
                }
            }
            if !r.differences.is_empty() {
                std::process::exit(1);
            }
        }
    }
    Ok(())
}

fn tls_init(names: &[String], out: &std::path::Path) -> anyhow::Result<()> {
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
