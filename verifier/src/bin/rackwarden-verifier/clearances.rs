//! `rackwarden-verifier clearances`: every clearance recorded.

use rackwarden_verifier::config::VerifierConfig;

use crate::open;

pub fn run(cfg: &VerifierConfig, rack: Option<&str>, json: bool) -> anyhow::Result<()> {
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
