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
