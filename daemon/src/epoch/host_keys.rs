//! The host's signing keys and their rotation. Beside `epoch.signing_key` (`DIR/host.key`):
//! `host.next.key` / `host.next.pub`, written by `rackwarden keygen --rotate`, the key the
//! host rotates to; and `host.<keyid>.pub`, each key it rotated away from, kept so that the
//! log, the spool and `rackwarden verify` still check the lines signed with it.
//!
//! A rotation: the next statement names the next key (`next_key`) and is signed with the
//! current one; once it is appended and fsynced, the next key is renamed over the current
//! one (the commit point: one atomic rename) and signs from then on. A crash between the
//! append and the rename is completed at the next start: the log's last statement names
//! the next key, so that key, not the old one, signs the following seq.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
};

use ed25519_dalek::{SigningKey, VerifyingKey};
use rackwarden_attest::{
    keys::{self, KeyError},
    statement::NextKey,
};

/// The verifying keys the log and the spool accept: the current key, the announced next
/// one and every key rotated away from. Shared with the delivery thread, which reads lines
/// the epoch loop signs.
pub type KeyRing = Arc<RwLock<Vec<VerifyingKey>>>;

/// The files of a host's keys, named after the signing key's stem (`host` of `host.key`).
#[derive(Debug, Clone)]
pub struct KeyFiles {
    dir: PathBuf,
    stem: String,
}

impl KeyFiles {
    pub fn of(signing_key: &Path) -> KeyFiles {
        let name = signing_key
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let stem = name.strip_suffix(".key").unwrap_or(&name).to_string();
        KeyFiles {
            dir: signing_key
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default(),
            stem,
        }
    }

    pub fn current(&self) -> PathBuf {
        self.dir.join(format!("{}.key", self.stem))
    }
    fn current_pub(&self) -> PathBuf {
        self.dir.join(format!("{}.pub", self.stem))
    }
    pub fn next(&self) -> PathBuf {
        self.dir.join(format!("{}.next.key", self.stem))
    }
    fn next_pub(&self) -> PathBuf {
        self.dir.join(format!("{}.next.pub", self.stem))
    }
    fn retired_pub(&self, keyid: &str) -> PathBuf {
        self.dir.join(format!("{}.{keyid}.pub", self.stem))
    }

    /// A rotation renamed the key and stopped before it rewrote the public key: finish it
    /// (a next public key without a next key is left over, never a pending rotation).
    fn tidy(&self) -> Result<(), KeyError> {
        if self.next().exists() || !self.next_pub().exists() {
            return Ok(());
        }
        let current = keys::load_signing_key(&self.current())?;
        let io = |path: PathBuf| move |source| KeyError::Io { path, source };
        let text = keys::public_pem(&current.verifying_key());
        crate::atomic_file::replace(&self.current_pub(), text.as_bytes())
            .map_err(io(self.current_pub()))?;
        std::fs::remove_file(self.next_pub()).map_err(io(self.next_pub()))
    }

    /// The public keys kept of keys rotated away from (`host.<64 hex>.pub`).
    fn retired(&self) -> Result<Vec<VerifyingKey>, KeyError> {
        let io = |source| KeyError::Io {
            path: self.dir.clone(),
            source,
        };
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io)? {
            let name = entry
                .map_err(io)?
                .file_name()
                .to_string_lossy()
                .into_owned();
            let keyid = name
                .strip_prefix(&format!("{}.", self.stem))
                .and_then(|r| r.strip_suffix(".pub"));
            if keyid.is_some_and(|k| k.len() == 64 && k.bytes().all(|b| b.is_ascii_hexdigit())) {
                out.push(keys::load_verifying_key(&self.dir.join(&name))?);
            }
        }
        Ok(out)
    }
}

/// What a start does about a next key, given the log's last statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// No next key: sign with the current one.
    Nothing,
    /// A next key not announced yet: the next statement names it.
    Announce,
    /// The log's last statement named the next key, and the rename did not happen (a crash
    /// after the append): complete it, and sign the next seq with the next key.
    Complete,
}

/// The decision, from the keyid the log's last statement names as `next_key` and the keyid
/// of the next key on disk.
pub fn recovery(tip_next_keyid: Option<&str>, next_keyid: Option<&str>) -> Recovery {
    match (tip_next_keyid, next_keyid) {
        (_, None) => Recovery::Nothing,
        (Some(t), Some(n)) if t == n => Recovery::Complete,
        (_, Some(_)) => Recovery::Announce,
    }
}

/// The host's keys as the epoch loop signs with them.
pub struct HostKeys {
    files: KeyFiles,
    current: SigningKey,
    next: Option<SigningKey>,
    ring: KeyRing,
}

impl HostKeys {
    /// Loads the current key, the next one if a rotation is pending, and the retired ones.
    pub fn load(signing_key: &Path) -> Result<HostKeys, KeyError> {
        let files = KeyFiles::of(signing_key);
        let current = keys::load_signing_key(signing_key)?;
        files.tidy()?;
        let mut ring = files.retired()?;
        ring.push(current.verifying_key());
        let mut hk = HostKeys {
            files,
            current,
            next: None,
            ring: Arc::new(RwLock::new(ring)),
        };
        hk.refresh_next()?;
        Ok(hk)
    }

    /// Picks up a next key written since (`keygen --rotate` while the daemon runs).
    pub fn refresh_next(&mut self) -> Result<(), KeyError> {
        if self.next.is_some() || !self.files.next().exists() {
            return Ok(());
        }
        let next = keys::load_signing_key(&self.files.next())?;
        if let Ok(mut r) = self.ring.write() {
            r.push(next.verifying_key());
        }
        log::info!(
            "key rotation pending: the next statement names key {}",
            keys::keyid(&next.verifying_key())
        );
        self.next = Some(next);
        Ok(())
    }

    pub fn current(&self) -> &SigningKey {
        &self.current
    }

    pub fn keyid(&self) -> String {
        keys::keyid(&self.current.verifying_key())
    }

    pub fn next_keyid(&self) -> Option<String> {
        self.next.as_ref().map(|k| keys::keyid(&k.verifying_key()))
    }

    pub fn ring(&self) -> KeyRing {
        self.ring.clone()
    }

    /// A snapshot of the ring (to open the log with).
    pub fn ring_keys(&self) -> Vec<VerifyingKey> {
        self.ring.read().map(|r| r.clone()).unwrap_or_default()
    }

    /// What the next statement names as `next_key`.
    pub fn announcement(&self) -> Option<NextKey> {
        self.next.as_ref().map(|k| NextKey {
            keyid: keys::keyid(&k.verifying_key()),
            public_key_pem: keys::public_pem(&k.verifying_key()),
        })
    }

    /// After the statement that named the next key is durable: from now on the next key
    /// signs, whatever the files say (the verifier retires the old key after that seq).
    /// The files follow; if they cannot, the next start completes the rename (the log's
    /// last statement names the next key still on disk).
    pub fn complete_rotation(&mut self) -> Result<(), KeyError> {
        let Some(next) = self.next.take() else {
            return Ok(());
        };
        let old = std::mem::replace(&mut self.current, next);
        log::info!(
            "key rotated from {} to {}",
            keys::keyid(&old.verifying_key()),
            self.keyid()
        );
        self.rename_files(&old.verifying_key())
    }

    fn rename_files(&self, old: &VerifyingKey) -> Result<(), KeyError> {
        let f = &self.files;
        let io = |path: PathBuf| move |source| KeyError::Io { path, source };
        // The old public key first: once the rename below happens it is the only copy.
        let kept = f.retired_pub(&keys::keyid(old));
        crate::atomic_file::replace(&kept, keys::public_pem(old).as_bytes())
            .map_err(io(kept.clone()))?;
        // The commit point: one atomic rename (the directory's fsync makes it durable).
        std::fs::rename(f.next(), f.current()).map_err(io(f.current()))?;
        let new_pub = keys::public_pem(&self.current.verifying_key());
        crate::atomic_file::replace(&f.current_pub(), new_pub.as_bytes())
            .map_err(io(f.current_pub()))?;
        match std::fs::remove_file(f.next_pub()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(KeyError::Io {
                    path: f.next_pub(),
                    source: e,
                });
            }
            _ => {}
        }
        std::fs::File::open(&f.dir)
            .and_then(|d| d.sync_all())
            .map_err(io(f.dir.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_between_append_and_rename_is_completed_not_announced_again() {
        // The log's last statement named the next key on disk: the rename did not happen.
        assert_eq!(recovery(Some("bb"), Some("bb")), Recovery::Complete);
        // Not announced yet (or an older announcement): the next statement names it.
        assert_eq!(recovery(None, Some("bb")), Recovery::Announce);
        assert_eq!(recovery(Some("aa"), Some("bb")), Recovery::Announce);
        // No next key (none made, or the rename happened): the current key signs.
        assert_eq!(recovery(Some("bb"), None), Recovery::Nothing);
        assert_eq!(recovery(None, None), Recovery::Nothing);
    }

    #[test]
    fn a_completed_rotation_keeps_the_old_public_key_and_signs_with_the_new() {
        let dir = std::env::temp_dir().join(format!("rw-rotate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (key_path, _, old) = keys::write_keypair(&dir, "host").unwrap();
        keys::write_keypair(&dir, "host.next").unwrap();
        let mut hk = HostKeys::load(&key_path).unwrap();
        let next_id = hk.next_keyid().unwrap();
        assert_eq!(hk.announcement().unwrap().keyid, next_id);
        assert_eq!(hk.ring_keys().len(), 2);
        hk.complete_rotation().unwrap();
        assert_eq!(hk.keyid(), next_id);
        assert!(hk.announcement().is_none());
        let old_id = keys::keyid(&old.verifying_key());
        assert!(dir.join(format!("host.{old_id}.pub")).exists());
        assert!(!dir.join("host.next.key").exists() && !dir.join("host.next.pub").exists());
        // A start after it: the new key is current, the old one is still in the ring.
        let again = HostKeys::load(&key_path).unwrap();
        assert_eq!(again.keyid(), next_id);
        assert!(again.next_keyid().is_none());
        assert!(again.ring_keys().contains(&old.verifying_key()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
