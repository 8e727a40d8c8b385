//! `rackwarden-verifier retire`: retire a host's current key.

use rackwarden_verifier::{api, config::VerifierConfig};

use crate::open;

pub fn run(cfg: &VerifierConfig, rack: &str, host: &str) -> anyhow::Result<()> {
    let keyid = open(cfg)?.retire(rack, host, api::now_ms())?;
    println!(
        "retired keyid {keyid} of {rack}/{host}: statements it signs from now on are retired_key"
    );
    Ok(())
}
