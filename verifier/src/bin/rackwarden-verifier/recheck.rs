//! `rackwarden-verifier recheck`: re-derive every stored verdict; exits 1 on any difference.

use rackwarden_verifier::{
    config::VerifierConfig,
    recheck::{self, DifferenceCause as Cause},
};

use crate::open;

pub fn run(cfg: &VerifierConfig, json: bool) -> anyhow::Result<()> {
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
