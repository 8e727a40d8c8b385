//! `rackwarden-verifier clear`: clear a host's contraindicated statements, with who and why.

use rackwarden_verifier::{api, config::VerifierConfig};

use crate::open;

pub fn run(
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
