//! `rackwarden log verify`: the verifier's transparency log as this host kept it, checked
//! offline (and against the log's tiles, from a directory or the verifier's URL).

use std::path::Path;

use anyhow::Context as _;
use rackwarden::{
    config::Config,
    epoch::{tlog, transport},
};
use rackwarden_attest::tlog::audit;

pub fn verify(
    config: &Path,
    key: Option<&str>,
    checkpoint: Option<&Path>,
    tiles: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    let cfg = Config::load(config)?;
    // The verifier is reached from where the daemon reaches it: the config's network
    // namespace, as `check-config` and the daemon do.
    if let Some(ns) = &cfg.netns {
        rackwarden::netns::enter(ns)?;
    }
    let ep = cfg.epoch.as_ref().map(|e| &e.verifier);
    let log_key = match key {
        Some(k) => audit::load_log_key(k)?,
        None => ep
            .and_then(|e| e.log_key.clone())
            .context("no log key: set `[verifier] log_key` or pass --key")?,
    };
    let keeper = tlog::LogKeeper::new(&cfg.state_paths());
    let read_checkpoint =
        |p: &Path| std::fs::read_to_string(p).with_context(|| format!("{}", p.display()));
    let audited = match tiles {
        None => tlog::audit_local::<fn(&str) -> anyhow::Result<Vec<u8>>, _>(
            &keeper,
            &log_key,
            &cfg.rack_id,
            &cfg.host_id,
            None,
        ),
        Some(url) if url.starts_with("http://") || url.starts_with("https://") => {
            let ep = ep.context("--tiles URL: the config has no [verifier] to trust it by")?;
            let client = transport::client(ep, ep.request_timeout)?;
            let base = url.trim_end_matches('/').to_string();
            let fetch = move |p: &str| -> anyhow::Result<Vec<u8>> {
                let u = format!("{base}/{p}");
                let r = client
                    .get(&u)
                    .send()
                    .map_err(|e| anyhow::anyhow!("{u}: {}", transport::describe(&e)))?;
                if !r.status().is_success() {
                    anyhow::bail!("{u}: {}", r.status());
                }
                Ok(r.bytes().with_context(|| u.clone())?.to_vec())
            };
            let note = match checkpoint {
                Some(p) => read_checkpoint(p)?,
                None => String::from_utf8(fetch("checkpoint")?)
                    .context("the checkpoint is not UTF-8")?,
            };
            tlog::audit_local(
                &keeper,
                &log_key,
                &cfg.rack_id,
                &cfg.host_id,
                Some((note.as_str(), fetch)),
            )
        }
        Some(dir) => {
            let dir = Path::new(dir).to_path_buf();
            let note = read_checkpoint(
                &checkpoint.map_or_else(|| dir.join("checkpoint"), Path::to_path_buf),
            )?;
            let fetch = move |p: &str| {
                let path = dir.join(p);
                std::fs::read(&path).with_context(|| path.display().to_string())
            };
            tlog::audit_local(
                &keeper,
                &log_key,
                &cfg.rack_id,
                &cfg.host_id,
                Some((note.as_str(), fetch)),
            )
        }
    }
    .map_err(anyhow::Error::msg)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&audited)?);
    } else {
        println!(
            "OK: {} kept entries prove their statements in their checkpoints",
            audited.entries
        );
        if let Some(cp) = &audited.tiles_checkpoint {
            println!("OK: the tiles hash to the {cp}, and every kept checkpoint is a prefix of it");
        }
    }
    if audited.recorded_failures > 0 {
        anyhow::bail!(
            "the daemon recorded {} failed log check(s) in {}",
            audited.recorded_failures,
            keeper.failures_path().display()
        );
    }
    Ok(())
}
