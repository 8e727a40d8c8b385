//! `rackwarden status`, `cap set`, `wipe-now` and `check-config`: talking to the running
//! daemon, or reading what it left pinned when it is not running.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use rackwarden::{
    config::Config,
    control::{self, Request, Response},
    limiter::Direction,
};

use crate::args::Cli;

fn socket(cli: &Cli) -> anyhow::Result<PathBuf> {
    if let Some(s) = &cli.socket {
        return Ok(s.clone());
    }
    Ok(Config::load(&cli.config)?.control_socket)
}

pub fn status(cli: &Cli, json: bool) -> anyhow::Result<()> {
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
fn pinned_status(cli: &Cli, why: &str, json: bool) -> anyhow::Result<()> {
    let cfg = Config::load(&cli.config)
        .with_context(|| format!("rackwardend is not answering ({why}), and the config"))?;
    if let Some(ns) = &cfg.netns {
        rackwarden::netns::enter(ns)?;
    }
    let report = rackwarden::collect::limiter_report(&cfg, 0);
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
    cli: &Cli,
    egress: Option<String>,
    ingress: Option<String>,
    persist: bool,
    json: bool,
) -> anyhow::Result<()> {
    let sock = socket(cli)?;
    let req = Request::CapSet {
        egress,
        ingress,
        persist,
    };
    match control::call(&sock, &req).context("is rackwardend running?")? {
        Response::CapSet(o) if json => println!("{}", serde_json::to_string_pretty(&o)?),
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
    Ok(())
}

pub fn wipe_now(cli: &Cli) -> anyhow::Result<()> {
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

/// Everything the daemon checks at start, checked here the same way.
pub fn check_config(path: &Path, json: bool) -> anyhow::Result<()> {
    let cfg = Config::load(path)?;
    if let Some(ns) = &cfg.netns {
        rackwarden::netns::enter(ns)?;
    }
    cfg.check_interfaces_exist()?;
    let mut epoch = serde_json::Value::Null;
    if let Some(e) = &cfg.epoch {
        let key = rackwarden_attest::keys::load_signing_key(&e.signing_key)
            .with_context(|| format!("epoch.signing_key {}", e.signing_key.display()))?;
        if let Some(i) = &e.images {
            let vk = rackwarden_attest::keys::load_verifying_key(&i.manifest_key)
                .with_context(|| format!("images.manifest_key {}", i.manifest_key.display()))?;
            let m = rackwarden::images::read_manifest(&i.manifest, &vk)?;
            if !i.source.is_dir() {
                bail!("images.source {}: not a directory", i.source.display());
            }
            epoch["images"] = serde_json::json!({"manifest_images": m.manifest.images.len()});
        }
        for s in &e.wipe.scratch {
            if !s.is_dir() {
                bail!("wipe.scratch {}: not a directory", s.display());
            }
        }
        epoch["wipe_interval"] = rackwarden::units::fmt_duration(e.wipe_interval).into();
        epoch["verifier"] = e.verifier.url.clone().into();
        epoch["host_keyid"] = rackwarden_attest::keys::keyid(&key.verifying_key()).into();
        epoch["wipe_backends"] = format!("{:?}", e.wipe.backends).into();
        epoch["workloads"] = format!("{:?}", e.workloads).into();
    }
    let v = serde_json::json!({
        "rack_id": cfg.rack_id, "host_id": cfg.host_id, "host_share": cfg.host_share,
        "interfaces": cfg.interfaces,
        "rack_egress_bytes_per_s": cfg.caps.rack_egress_bytes_per_s,
        "rack_ingress_bytes_per_s": cfg.caps.rack_ingress_bytes_per_s,
        "host_egress_bytes_per_s": cfg.host_bytes_per_s(Direction::Egress),
        "host_ingress_bytes_per_s": cfg.host_bytes_per_s(Direction::Ingress),
        "burst": rackwarden::units::ByteSize(cfg.caps.burst_bytes).to_string(),
        "pin_root": cfg.pin_root,
        "epoch": epoch,
    });
    if !json {
        println!(
            "{}: ok (checked as rackwardend checks it)",
            cfg.path.display()
        );
    }
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}
