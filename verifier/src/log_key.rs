//! The transparency log's key: made on the verifier's first `serve`, never overwritten.
//! Beside the private key `<dir>/<stem>.key` (0600) lie `<stem>.pub` (SPKI PEM) and
//! `<stem>.vkey`, the C2SP verifier key (`<origin>+<key hash>+<base64 key>`) that hosts
//! (`[verifier] log_key`) and auditors (`log verify --key`) check checkpoints with.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use rackwarden_attest::{keys, tlog::note::NoteSigner};

/// Where the vkey of the key at `key` is written.
pub fn vkey_path(key: &Path) -> PathBuf {
    key.with_extension("vkey")
}

/// Loads the log key at `key`, or makes it (and its `.pub`) when there is none; writes its
/// vkey for `origin` beside it when that is missing.
pub fn open_or_create(key: &Path, origin: &str) -> anyhow::Result<NoteSigner> {
    let signing = if key.exists() {
        keys::load_signing_key(key).with_context(|| format!("log key {}", key.display()))?
    } else {
        let dir = key
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let stem = key
            .file_stem()
            .and_then(|s| s.to_str())
            .context("the log key's file name is not UTF-8")?;
        if key.extension().and_then(|e| e.to_str()) != Some("key") {
            anyhow::bail!("log key {}: its name must end in .key", key.display());
        }
        match keys::write_keypair(dir, stem) {
            Ok((_, _, k)) => {
                log::info!("made the transparency log's key {}", key.display());
                k
            }
            // Another instance on the same database made it first: use theirs.
            Err(keys::KeyError::Exists { .. }) => made_by_another(key)?,
            Err(e) => {
                return Err(e).with_context(|| format!("making the log key {}", key.display()));
            }
        }
    };
    let signer = NoteSigner::new(origin, signing)?;
    let vkey = vkey_path(key);
    let text = format!("{}\n", signer.verifier().vkey());
    match std::fs::read_to_string(&vkey) {
        Ok(old) if old == text => {}
        // The origin changed (or a stale file): the vkey follows the key and the origin.
        _ => std::fs::write(&vkey, text).with_context(|| format!("{}", vkey.display()))?,
    }
    Ok(signer)
}

/// The key another instance is making at the same moment: it is written with `create_new`
/// and synced, so it can be seen before it is whole; read it until it parses (2 s at most).
fn made_by_another(key: &Path) -> anyhow::Result<ed25519_dalek::SigningKey> {
    let t0 = std::time::Instant::now();
    loop {
        match keys::load_signing_key(key) {
            Ok(k) => return Ok(k),
            Err(e) if t0.elapsed() > std::time::Duration::from_secs(2) => {
                return Err(e).with_context(|| format!("log key {}", key.display()));
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_made_once_and_kept() {
        let dir = std::env::temp_dir().join(format!("rwv-logkey-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let key = dir.join("tlog.key");
        let first = open_or_create(&key, "v.example/log").unwrap().verifier();
        let again = open_or_create(&key, "v.example/log").unwrap().verifier();
        assert_eq!(first, again);
        assert_eq!(
            std::fs::read_to_string(vkey_path(&key)).unwrap().trim(),
            first.vkey()
        );
        assert!(dir.join("tlog.pub").exists());
        // A new origin names the same key anew; the key itself stays.
        let renamed = open_or_create(&key, "v.example/other").unwrap().verifier();
        assert_eq!(renamed.key, first.key);
        assert!(
            std::fs::read_to_string(vkey_path(&key))
                .unwrap()
                .starts_with("v.example/other+")
        );
        assert!(open_or_create(&dir.join("tlog.pem"), "o").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
