//! `rackwarden status`, `cap set`, `wipe-now` and `check-config`: talking to the running
//! daemon, or reading what it left pinned when it is not running.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use rackwarden::{
    config::{
        Config, GuardMode, preflight,
        report::{self, HostFacts, VerifierPolicy},
    },
    control::{self, Request, Response},
};

use crate::args::DaemonArgs;

fn socket(cli: &DaemonArgs) -> anyhow::Result<PathBuf> {
    if let Some(s) = &cli.socket {
        return Ok(s.clone());
    }
    Ok(Config::load(&cli.config_path())?.control_socket)
}

pub fn status(cli: &DaemonArgs, json: bool) -> anyhow::Result<()> {
    let sock = socket(cli)?;
    match control::call(&sock, &Request::Status) {
        Ok(Response::Status(s)) if json => println!("{}", serde_json::to_string_pretty(&s)?),
        Ok(Response::Status(s)) => print!("{}", s.render()),
        Ok(Response::Error { message }) => bail!("rackwardend: {message}"),
        Ok(other) => bail!("unexpected answer: {other:?}"),
        Err(e) => pinned_status(cli, &e.to_string(), json)?,
    }
    Ok(())
}

/// The daemon is down: the limiter is not (it is pinned). Show what the kernel holds.
fn pinned_status(cli: &DaemonArgs, why: &str, json: bool) -> anyhow::Result<()> {
    let cfg = Config::load(&cli.config_path())
        .with_context(|| format!("rackwardend is not answering ({why}), and the config"))?;
    if let Some(ns) = &cfg.netns {
        rackwarden::netns::enter(ns)?;
    }
    let report = rackwarden::host_evidence::limiter_report(&cfg, 0);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "daemon": {"running": false, "error": why},
                "limiter": report,
            }))?
        );
        return Ok(());
    }
    println!(
        "rackwardend is NOT running ({why}); what is pinned under {}:",
        cfg.pin_root.display()
    );
    match report {
        rackwarden_attest::evidence::LimiterReport::Absent { finding } => {
            println!("limiter ABSENT: {finding}")
        }
        rackwarden_attest::evidence::LimiterReport::Present(e) => {
            println!(
                "limiter present ({}), still enforcing without the daemon:",
                e.attach_kind
            );
            for c in &e.caps {
                println!(
                    "  {:<8} cap {}  burst {}  generation {}",
                    c.direction.name(),
                    rackwarden::units::fmt_rate(c.rate_bytes_per_s as f64),
                    rackwarden::units::ByteSize(c.burst_bytes),
                    c.generation
                );
            }
            for c in &e.counters {
                println!(
                    "  {:<8} passed {} B / {} pkts, dropped {} B / {} pkts",
                    c.direction.name(),
                    c.counters.passed_bytes,
                    c.counters.passed_packets,
                    c.counters.dropped_bytes,
                    c.counters.dropped_packets
                );
            }
            for a in &e.attach_points {
                println!(
                    "  {} {}: {}",
                    a.interface,
                    a.direction.name(),
                    if a.attached {
                        "attached"
                    } else {
                        "NOT ATTACHED"
                    }
                );
            }
        }
    }
    Ok(())
}

pub fn cap_set(
    cli: &DaemonArgs,
    egress: Option<String>,
    ingress: Option<String>,
    persist: bool,
    force: bool,
    json: bool,
) -> anyhow::Result<()> {
    let sock = socket(cli)?;
    let req = Request::CapSet {
        egress,
        ingress,
        persist,
        force,
    };
    match control::call(&sock, &req).context("is rackwardend running?")? {
        Response::CapSet(o) if json => println!("{}", serde_json::to_string_pretty(&o)?),
        Response::CapSet(o) => {
            println!(
                "applied: host egress {}, ingress {} (generation {})",
                rackwarden::units::fmt_rate_decimal(o.egress_host_bytes_per_s),
                rackwarden::units::fmt_rate_decimal(o.ingress_host_bytes_per_s),
                o.generation
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
    Ok(())
}

pub fn wipe_now(cli: &DaemonArgs) -> anyhow::Result<()> {
    let sock = socket(cli)?;
    match control::call(&sock, &Request::WipeNow).context("is rackwardend running?")? {
        Response::WipeNow { state } => {
            match state {
                Some(rackwarden::epoch::EpochState::Waiting { .. }) | None => {
                    println!("epoch requested: it starts now; `rackwarden status` follows it")
                }
                Some(s) => println!(
                    "an epoch is already running ({}); another starts when it is done only if asked again",
                    s.name()
                ),
            }
            Ok(())
        }
        Response::Error { message } => bail!("rackwardend refused: {message}"),
        other => bail!("unexpected answer: {other:?}"),
    }
}

/// Everything the daemon checks at start, checked here the same way, then what the
/// configuration means, each value with its unit, and where it cannot meet its policy.
pub fn check_config(path: &Path, verifier_config: Option<&Path>, json: bool) -> anyhow::Result<()> {
    let cfg = Config::load(path)?;
    let checked = preflight::check_files(&cfg)?;
    let policy = verifier_config
        .map(|p| VerifierPolicy::read(p, &cfg.rack_id))
        .transpose()?;
    if let Some(ns) = &cfg.netns {
        rackwarden::netns::enter(ns)?;
    }
    cfg.check_interfaces_exist()?;
    // The TPM is opened the way the daemon will open it (no key is created): a wrong device,
    // port or TCTI is said here, in words, not found by the verifier later.
    let tpm = match cfg.tpm.mode {
        rackwarden::config::tpm::TpmMode::Off => report::TpmFact::NotOpened,
        mode => match rackwarden::tpm::probe(&cfg.tpm.tcti) {
            Ok(vendor) => report::TpmFact::Usable { vendor },
            Err(reason) if mode == rackwarden::config::tpm::TpmMode::Required => bail!(
                "[tpm] mode = \"required\" in {}, but the TPM at `{}` cannot be used: {reason}: the daemon would refuse to start",
                cfg.path.display(),
                cfg.tpm.tcti
            ),
            Err(reason) => report::TpmFact::Unusable { reason },
        },
    };
    let facts = HostFacts {
        memory_bytes: rackwarden::wipe::host::meminfo("MemTotal"),
        guard_available: cfg.self_protection == GuardMode::Auto
            && rackwarden::guard::probe().is_ok(),
        tpm,
    };
    let r = report::report(&cfg, &checked, policy.as_ref(), facts);
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", r.render());
    }
    Ok(())
}
