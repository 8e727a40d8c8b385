//! `rackwarden-verifier tpm-enrollments`: the AKs enrolled through the TPM endpoints.

use rackwarden_verifier::config::VerifierConfig;

use crate::open;

pub fn run(cfg: &VerifierConfig, json: bool) -> anyhow::Result<()> {
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
