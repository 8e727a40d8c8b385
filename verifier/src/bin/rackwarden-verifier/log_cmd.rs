//! `rackwarden-verifier log`: the transparency log's key, a static copy of it, and the
//! offline check a third party runs (named `log_cmd` so as not to shadow the `log` crate).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use rackwarden_verifier::{config::VerifierConfig, log_key};

use crate::open;

/// `log vkey`: the log's verifier key.
pub fn vkey(cfg: &VerifierConfig) -> anyhow::Result<()> {
    let signer = log_key::open_or_create(&cfg.log_key, &cfg.log_origin)?;
    println!("{}", signer.verifier().vkey());
    Ok(())
}

pub fn export(cfg: &VerifierConfig, out: &Path) -> anyhow::Result<()> {
    let signer = log_key::open_or_create(&cfg.log_key, &cfg.log_origin)?;
    let files = open(cfg)?.with_log(signer).log_publish()?;
    for (path, bytes) in &files {
        let dest = out.join(path);
        if let Some(dir) = dest.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
        }
        std::fs::write(&dest, bytes).with_context(|| format!("{}", dest.display()))?;
    }
    println!(
        "wrote the checkpoint and {} tiles to {}",
        files.len() - 1,
        out.display()
    );
    Ok(())
}

/// Reads a tile by its path under a log's URL.
fn tile_fetcher(
    url: &str,
    ca: Option<&Path>,
) -> anyhow::Result<impl Fn(&str) -> anyhow::Result<Vec<u8>>> {
    let mut b = reqwest::blocking::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .tls_built_in_root_certs(false);
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).with_context(|| format!("{}", ca.display()))?;
        b = b.add_root_certificate(
            reqwest::Certificate::from_pem(&pem).with_context(|| format!("{}", ca.display()))?,
        );
    }
    let client = b.build()?;
    let base = url.trim_end_matches('/').to_string();
    Ok(move |p: &str| -> anyhow::Result<Vec<u8>> {
        let u = format!("{base}/{p}");
        let r = client.get(&u).send().map_err(|e| {
            // reqwest says "error sending request"; what an auditor can act on is deeper.
            let chain = rackwarden_attest::error_chain::error_chain(&e);
            let hint = if chain.contains("UnknownIssuer") || chain.contains("invalid peer certificate") {
                ": the server's certificate is not signed by a CA this command trusts: pass --ca with the verifier's CA (its tls/ca.pem)"
            } else {
                ""
            };
            anyhow::anyhow!("{u}: {chain}{hint}")
        })?;
        if !r.status().is_success() {
            anyhow::bail!("{u}: {}", r.status());
        }
        Ok(r.bytes().with_context(|| u.clone())?.to_vec())
    })
}

pub fn verify(
    checkpoint: &Path,
    key: &str,
    tiles: Option<&str>,
    ca: Option<&Path>,
    old: &[PathBuf],
) -> anyhow::Result<()> {
    use rackwarden_attest::tlog::audit;
    let log_key = audit::load_log_key(key)?;
    let read = |p: &Path| std::fs::read_to_string(p).with_context(|| format!("{}", p.display()));
    let note = read(checkpoint)?;
    let mut older = Vec::new();
    for o in old {
        older.push(
            log_key
                .open_checkpoint(&read(o)?)
                .with_context(|| format!("{}", o.display()))?,
        );
    }
    let Some(tiles) = tiles else {
        let cp = log_key
            .open_checkpoint(&note)
            .with_context(|| format!("{}", checkpoint.display()))?;
        println!(
            "signature OK: {} (no tiles given: nothing else checked)",
            cp.describe()
        );
        return Ok(());
    };
    let audited = if tiles.starts_with("http://") || tiles.starts_with("https://") {
        audit::audit_tiles(&log_key, &note, tile_fetcher(tiles, ca)?, true, &older)
    } else {
        let dir = Path::new(tiles);
        let fetch = |p: &str| std::fs::read(dir.join(p)).with_context(|| p.to_string());
        audit::audit_tiles(&log_key, &note, fetch, true, &older)
    }
    .with_context(|| format!("{}", checkpoint.display()))?;
    println!(
        "OK: {}: signature, root from the tiles, {} entries, {} older checkpoints consistent",
        audited.checkpoint.describe(),
        audited.entries,
        older.len()
    );
    Ok(())
}
