//! `rackwarden-verifier enroll`: enroll (or rotate) a host's public key.

use std::path::Path;

use anyhow::Context as _;
use rackwarden_verifier::{api, config::VerifierConfig};

use crate::open;

pub fn run(cfg: &VerifierConfig, rack: &str, host: &str, key: &Path) -> anyhow::Result<()> {
    let pem = std::fs::read_to_string(key).with_context(|| format!("{}", key.display()))?;
    let e = open(cfg)?.enroll(rack, host, &pem, api::now_ms())?;
    for w in &e.warnings {
        eprintln!("warning: {w}");
    }
    if e.already {
        println!("{rack}/{host} is already enrolled with keyid {}", e.keyid);
    } else {
        println!("enrolled {rack}/{host} with keyid {}", e.keyid);
    }
    Ok(())
}
