//! `rackwarden keygen`, `attest` and `verify`: keys and statements by hand.

use std::path::Path;

use anyhow::Context as _;
use rackwarden::{config::Config, epoch::statement};
use rackwarden_attest::{evidence_log::EvidenceLog, nonce::Nonce, statement::Challenge};

pub fn keygen(out: &Path, name: &str, rotate: bool) -> anyhow::Result<()> {
    let stem = if rotate {
        let current = out.join(format!("{name}.key"));
        if !current.exists() {
            anyhow::bail!(
                "{}: no current key to rotate from (keygen without --rotate makes the first)",
                current.display()
            );
        }
        format!("{name}.next")
    } else {
        name.to_string()
    };
    let (k, p, key) = rackwarden_attest::keys::write_keypair(out, &stem)?;
    println!("private key: {} (0600)", k.display());
    println!("public key:  {}", p.display());
    println!(
        "keyid:       {}",
        rackwarden_attest::keys::keyid(&key.verifying_key())
    );
    if rotate {
        println!(
            "the daemon's next statement names this key (signed with the current one), then signs with it; the verifier takes it from that statement on"
        );
    }
    Ok(())
}

pub fn verify(key: &Path, log: &Path, json: bool) -> anyhow::Result<()> {
    let vk = rackwarden_attest::keys::load_verifying_key(key)?;
    let bytes = std::fs::read(log).with_context(|| format!("reading {}", log.display()))?;
    let r = rackwarden_attest::verify::verify_log(&bytes, &vk);
    if json {
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
    Ok(())
}

/// One statement of the enforcement state, no wipe and no images (those come from the
/// daemon's epoch loop, which builds its statements with the same code).
pub fn attest(config: &Path, key: &Path, log: &Path, nonce: Option<Nonce>) -> anyhow::Result<()> {
    let cfg = Config::load(config)?;
    let challenge = match nonce {
        None => Challenge::Unchallenged,
        Some(n) => Challenge::Nonce { nonce: n.to_hex() },
    };
    // The host's keys: a log that went through rotations holds lines of each.
    let keys = rackwarden::epoch::host_keys::HostKeys::load(key)?;
    let sk = keys.current().clone();
    let mut elog = EvidenceLog::open_with_keys(log, &keys.ring_keys())?;
    if let Some(t) = &elog.tip_next_keyid
        && *t != keys.keyid()
    {
        anyhow::bail!(
            "{}: the last statement rotated to key {t}, not {}: sign with that key (the daemon completes a pending rotation at its start)",
            log.display(),
            key.display()
        );
    }
    // Single-threaded here, so setns moves the whole process before any inspection.
    if let Some(ns) = &cfg.netns {
        rackwarden::netns::enter(ns)?;
    }
    let st = statement::sign_and_append(
        &cfg,
        &mut elog,
        &sk,
        &rackwarden::host_evidence::producer("rackwarden"),
        statement::EpochEvidence {
            challenge,
            wipe: None,
            images: None,
            incidents: vec![],
            epoch: None,
            storage: Default::default(),
            traffic: None,
            openings: Vec::new(),
        },
        None,
    )?;
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
        "appended seq {} to {} (fsynced); limiter {limiter}; incidents disclosed: {}",
        st.predicate.seq,
        log.display(),
        st.predicate.incidents.len()
    );
    Ok(())
}
