//! `rackwarden-verifier hosts`: the enrolled hosts, as a table or JSON.

use rackwarden_verifier::{config::VerifierConfig, standing::EnrolledHost};

use crate::open;

pub fn run(cfg: &VerifierConfig, json: bool) -> anyhow::Result<()> {
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
