//! The host's side of the verifier's transparency log (issue 24). For every statement the
//! verifier acknowledges with a log entry, the daemon keeps the entry beside the evidence
//! log and checks it:
//!
//! - `<state_dir>/tlog-entries.jsonl`: one line per acknowledged statement,
//!   `{"seq", "envelope_sha256", "index", "proof", "checkpoint"}` (appended, fsynced);
//! - `<state_dir>/tlog-checkpoint`: the newest checkpoint that checked out (replaced
//!   atomically): every later one must extend it;
//! - `<state_dir>/tlog-failures.jsonl`: the evidence of a failed check, one line each:
//!   `{"detected_ms", "error", "old_checkpoint", "new_checkpoint", "proof"}` with both signed
//!   checkpoints verbatim (a verifier that dropped or rewrote an acknowledged statement is
//!   caught with them as its proof).
//!
//! With `[verifier] log_key` set, each entry's inclusion proof is checked against its
//! checkpoint's signed root, and each new checkpoint is checked to extend the one kept (a
//! consistency proof from `GET /v1/tlog/consistency`). A failed check is logged as an error,
//! written to `tlog-failures.jsonl` and shown in the delivery status; the kept checkpoint
//! stays the old one (the host never adopts a history that contradicts what it was shown),
//! and delivery goes on (the statements are evidence whatever the verifier does with them).

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use rackwarden_attest::{
    api::{ConsistencyProof, LogEntry},
    tlog::{
        self,
        audit::{self, AuditError},
        note::{Checkpoint, NoteVerifier},
    },
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::atomic_file;
use crate::pins::StatePaths;
use rackwarden_attest::evidence::Incident;

/// One kept entry (a line of `tlog-entries.jsonl`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptEntry {
    pub seq: u64,
    /// Hex SHA-256 of the envelope bytes sent (the leaf's last field).
    pub envelope_sha256: String,
    #[serde(flatten)]
    pub entry: LogEntry,
}

/// A failed check, kept as evidence (a line of `tlog-failures.jsonl`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogFailure {
    pub detected_ms: u64,
    pub error: String,
    /// The checkpoint the host had kept (signed note), if any.
    pub old_checkpoint: Option<String>,
    /// The checkpoint that did not check out (signed note).
    pub new_checkpoint: String,
    /// The consistency proof the verifier gave, if it gave one.
    pub proof: Vec<String>,
}

/// What the host keeps of the log, under its state directory.
pub struct LogKeeper {
    entries: PathBuf,
    checkpoint: PathBuf,
    failures: PathBuf,
    disclosed: PathBuf,
}

/// An acknowledged statement: its seq, the envelope bytes sent, and its entry.
pub struct Acked<'a> {
    pub seq: u64,
    pub envelope: &'a [u8],
    pub entry: LogEntry,
}

impl LogKeeper {
    pub fn new(state: &StatePaths) -> LogKeeper {
        LogKeeper {
            entries: state.tlog_entries(),
            checkpoint: state.tlog_checkpoint(),
            failures: state.tlog_failures(),
            disclosed: state.tlog_failures_disclosed(),
        }
    }

    /// The recorded failures no signed statement has disclosed yet, as incidents for the
    /// next one, and how many failures are recorded in all (for [`mark_disclosed`] once that
    /// statement is durable). A crash in between discloses them again: never lost.
    ///
    /// [`mark_disclosed`]: LogKeeper::mark_disclosed
    pub fn undisclosed(&self) -> (Vec<Incident>, usize) {
        let failures = match self.failures() {
            Ok(f) => f,
            Err(e) => {
                log::error!("transparency log: the recorded failures cannot be read: {e}");
                return (vec![], 0);
            }
        };
        let done: usize = std::fs::read_to_string(&self.disclosed)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        let incidents = failures
            .iter()
            .skip(done)
            .map(|f| Incident::VerifierLogInconsistent {
                detected_unix_ms: f.detected_ms,
                error: f.error.clone(),
                kept_checkpoint: f.old_checkpoint.clone(),
                shown_checkpoint: f.new_checkpoint.clone(),
            })
            .collect();
        (incidents, failures.len())
    }

    /// Records that the first `n` failures are in a durable signed statement.
    pub fn mark_disclosed(&self, n: usize) {
        if let Err(e) = atomic_file::replace(&self.disclosed, n.to_string().as_bytes()) {
            log::warn!(
                "transparency log: {}: {e} (the failures are disclosed again next epoch)",
                self.disclosed.display()
            );
        }
    }

    pub fn entries_path(&self) -> &Path {
        &self.entries
    }

    pub fn failures_path(&self) -> &Path {
        &self.failures
    }

    /// The newest checkpoint that checked out (its signed note), if any.
    pub fn kept_checkpoint(&self) -> Result<Option<String>, String> {
        match std::fs::read_to_string(&self.checkpoint) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", self.checkpoint.display())),
        }
    }

    /// Every kept entry, in order.
    pub fn entries(&self) -> Result<Vec<KeptEntry>, String> {
        let text = match std::fs::read_to_string(&self.entries) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(format!("{}: {e}", self.entries.display())),
        };
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .map_err(|e| format!("{}:{}: {e}", self.entries.display(), i + 1))
            })
            .collect()
    }

    /// Every failure recorded.
    pub fn failures(&self) -> Result<Vec<LogFailure>, String> {
        let text = match std::fs::read_to_string(&self.failures) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(format!("{}: {e}", self.failures.display())),
        };
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).map_err(|e| e.to_string()))
            .collect()
    }

    fn append_line<T: Serialize>(path: &Path, value: &T) -> Result<(), String> {
        let mut line = serde_json::to_vec(value).map_err(|e| e.to_string())?;
        line.push(b'\n');
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        f.write_all(&line)
            .and_then(|()| f.sync_data())
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    fn record_failure(&self, failure: &LogFailure) {
        log::error!(
            "transparency log: {} (kept as evidence in {})",
            failure.error,
            self.failures.display()
        );
        if let Err(e) = Self::append_line(&self.failures, failure) {
            log::error!("transparency log: cannot keep the failure: {e}");
        }
    }

    /// Keeps the entries of a batch the verifier acknowledged and, with `log_key`, checks
    /// them: each inclusion proof, then the newest checkpoint against the one kept, with a
    /// consistency proof fetched by `consistency(from, to)`. `Err`: a check failed (already
    /// recorded in `tlog-failures.jsonl`); the entries are kept all the same.
    pub fn keep(
        &self,
        log_key: Option<&NoteVerifier>,
        rack: &str,
        host: &str,
        acked: Vec<Acked<'_>>,
        consistency: impl Fn(u64, u64) -> Result<ConsistencyProof, String>,
        now_ms: u64,
    ) -> Result<(), String> {
        let mut newest: Option<(Checkpoint, String)> = None;
        let mut failed = None;
        for a in &acked {
            let kept = KeptEntry {
                seq: a.seq,
                envelope_sha256: hex::encode(Sha256::digest(a.envelope)),
                entry: a.entry.clone(),
            };
            Self::append_line(&self.entries, &kept)?;
            let Some(key) = log_key else { continue };
            let Some(leaf) = tlog::statement_leaf(rack, host, a.seq, a.envelope) else {
                continue;
            };
            match audit::check_entry(key, &a.entry, &leaf) {
                Ok(cp) => {
                    if newest.as_ref().is_none_or(|(n, _)| cp.size > n.size) {
                        newest = Some((cp, a.entry.checkpoint.clone()));
                    }
                }
                Err(e) => {
                    let f = LogFailure {
                        detected_ms: now_ms,
                        error: format!("seq {}: {e}", a.seq),
                        old_checkpoint: self.kept_checkpoint().ok().flatten(),
                        new_checkpoint: a.entry.checkpoint.clone(),
                        proof: a.entry.proof.clone(),
                    };
                    self.record_failure(&f);
                    failed.get_or_insert(f.error);
                }
            }
        }
        let (Some(key), Some((new, new_note))) = (log_key, newest) else {
            return failed.map_or(Ok(()), Err);
        };
        if let Err(e) = self.extend(key, &new, &new_note, consistency, now_ms) {
            failed.get_or_insert(e);
        }
        failed.map_or(Ok(()), Err)
    }

    /// Checks that `new` extends the kept checkpoint and keeps it if so.
    fn extend(
        &self,
        key: &NoteVerifier,
        new: &Checkpoint,
        new_note: &str,
        consistency: impl Fn(u64, u64) -> Result<ConsistencyProof, String>,
        now_ms: u64,
    ) -> Result<(), String> {
        let old_note = self.kept_checkpoint()?;
        let checked: Result<Vec<String>, (String, Vec<String>)> = match &old_note {
            None => Ok(vec![]),
            Some(old_note) => match key.open_checkpoint(old_note) {
                // A kept checkpoint that no longer verifies (the key changed in the config):
                // start again from the new one, loudly.
                Err(e) => {
                    log::warn!(
                        "transparency log: the kept checkpoint does not verify with the configured key ({e}); keeping the new one"
                    );
                    Ok(vec![])
                }
                Ok(old) if old.size > new.size => Err((
                    AuditError::Inconsistent {
                        old: old.describe(),
                        new: new.describe(),
                        source: Box::new(tlog::TlogError::SizesReversed {
                            old: old.size,
                            new: new.size,
                        }),
                    }
                    .to_string(),
                    vec![],
                )),
                Ok(old) => match consistency(old.size, new.size) {
                    Err(e) => {
                        // No proof to be had (the verifier is unreachable): check next time.
                        log::warn!(
                            "transparency log: no consistency proof from size {} to {}: {e}",
                            old.size,
                            new.size
                        );
                        return Ok(());
                    }
                    Ok(p) if p.from != old.size || p.to != new.size => Err((
                        format!(
                            "the verifier answered a consistency proof from {} to {}, not from {} to {}",
                            p.from, p.to, old.size, new.size
                        ),
                        p.proof,
                    )),
                    Ok(p) => match audit::check_consistency(&old, new, &p.proof) {
                        Ok(()) => Ok(p.proof),
                        Err(e) => Err((e.to_string(), p.proof)),
                    },
                },
            },
        };
        match checked {
            Ok(_) => atomic_file::replace(&self.checkpoint, new_note.as_bytes())
                .map_err(|e| format!("{}: {e}", self.checkpoint.display())),
            Err((error, proof)) => {
                let f = LogFailure {
                    detected_ms: now_ms,
                    error,
                    old_checkpoint: old_note,
                    new_checkpoint: new_note.to_string(),
                    proof,
                };
                self.record_failure(&f);
                Err(f.error)
            }
        }
    }
}

/// What `rackwarden log verify` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LocalAudit {
    /// Entries whose inclusion proof checked out against their own checkpoint.
    pub entries: usize,
    /// The checkpoint the tiles were checked against, if tiles were given.
    pub tiles_checkpoint: Option<String>,
    /// Failures recorded earlier by the daemon.
    pub recorded_failures: usize,
}

/// Checks what the host kept, offline: each entry's inclusion in its checkpoint (the
/// envelope's SHA-256 as kept), and, given a checkpoint note and a tile fetcher, that the
/// tiles hash to that checkpoint, that every kept checkpoint is a prefix of it, and that each
/// kept entry's leaf is in the tiles at its index.
pub fn audit_local<F: Fn(&str) -> Result<Vec<u8>, String>>(
    keeper: &LogKeeper,
    key: &NoteVerifier,
    rack: &str,
    host: &str,
    tiles: Option<(&str, F)>,
) -> Result<LocalAudit, String> {
    let entries = keeper.entries()?;
    let mut checkpoints: Vec<Checkpoint> = Vec::new();
    for k in &entries {
        let leaf = leaf_from_digest(rack, host, k.seq, &k.envelope_sha256)
            .ok_or_else(|| format!("seq {}: a bad envelope digest", k.seq))?;
        let cp =
            audit::check_entry(key, &k.entry, &leaf).map_err(|e| format!("seq {}: {e}", k.seq))?;
        if !checkpoints.contains(&cp) {
            checkpoints.push(cp);
        }
    }
    let mut tiles_checkpoint = None;
    if let Some((note, fetch)) = tiles {
        let audited =
            audit::audit_tiles(key, note, &fetch, true, &checkpoints).map_err(|e| e.to_string())?;
        let cp = audited.checkpoint;
        let reader = tlog::tile::TileReader::new(cp.size, &fetch);
        for k in &entries {
            if k.entry.index >= cp.size {
                continue;
            }
            let leaf = leaf_from_digest(rack, host, k.seq, &k.envelope_sha256)
                .ok_or_else(|| format!("seq {}: a bad envelope digest", k.seq))?;
            let have =
                tlog::HashReader::node(&reader, 0, k.entry.index).map_err(|e| e.to_string())?;
            if have != tlog::leaf_hash(&leaf) {
                return Err(format!(
                    "seq {}: leaf {} of the {} is not this statement's",
                    k.seq,
                    k.entry.index,
                    cp.describe()
                ));
            }
        }
        tiles_checkpoint = Some(cp.describe());
    }
    Ok(LocalAudit {
        entries: entries.len(),
        tiles_checkpoint,
        recorded_failures: keeper.failures()?.len(),
    })
}

/// The leaf of a statement from the SHA-256 of its envelope (as kept) rather than the bytes.
fn leaf_from_digest(rack: &str, host: &str, seq: u64, sha256_hex: &str) -> Option<Vec<u8>> {
    let digest = tlog::from_hex(sha256_hex)?;
    tlog::statement_leaf_of_digest(rack, host, seq, &digest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rackwarden_attest::tlog::{MemoryTree, note::NoteSigner};

    fn signer() -> NoteSigner {
        NoteSigner::new(
            "test-log",
            ed25519_dalek::SigningKey::from_bytes(&[3u8; 32]),
        )
        .unwrap()
    }

    /// A verifier's log in memory: appends a statement, answers its entry.
    struct FakeLog {
        tree: MemoryTree,
        signer: NoteSigner,
    }

    impl FakeLog {
        fn entry(&self, index: u64) -> LogEntry {
            let size = self.tree.size();
            let cp = Checkpoint {
                origin: "test-log".into(),
                size,
                root: self.tree.root(),
                extensions: vec![],
            };
            LogEntry {
                index,
                proof: tlog::inclusion_proof(&self.tree, index, size)
                    .unwrap()
                    .iter()
                    .map(tlog::hex)
                    .collect(),
                checkpoint: self.signer.sign_checkpoint(&cp).unwrap(),
            }
        }
        fn consistency(&self, from: u64, to: u64) -> Result<ConsistencyProof, String> {
            Ok(ConsistencyProof {
                from,
                to,
                proof: tlog::consistency_proof(&self.tree, from, to)
                    .map_err(|e| e.to_string())?
                    .iter()
                    .map(tlog::hex)
                    .collect(),
            })
        }
    }

    #[test]
    fn entries_are_kept_checked_and_a_rewritten_log_is_caught() {
        let dir = std::env::temp_dir().join(format!("rw-tlog-keep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let keeper = LogKeeper::new(&StatePaths::new(&dir));
        let key = signer().verifier();
        let mut log = FakeLog {
            tree: MemoryTree::new(),
            signer: signer(),
        };
        let envs: Vec<Vec<u8>> = (0..4)
            .map(|i| format!("{{\"env\":{i}}}").into_bytes())
            .collect();
        for (seq, env) in envs.iter().enumerate().take(3) {
            let i = log
                .tree
                .push(&tlog::statement_leaf("r", "h", seq as u64, env).unwrap());
            let acked = vec![Acked {
                seq: seq as u64,
                envelope: env,
                entry: log.entry(i),
            }];
            keeper
                .keep(Some(&key), "r", "h", acked, |a, b| log.consistency(a, b), 1)
                .unwrap();
        }
        assert_eq!(keeper.entries().unwrap().len(), 3);
        let kept = key
            .open_checkpoint(&keeper.kept_checkpoint().unwrap().unwrap())
            .unwrap();
        assert_eq!(kept.size, 3);
        let audited =
            audit_local::<fn(&str) -> Result<Vec<u8>, String>>(&keeper, &key, "r", "h", None)
                .unwrap();
        assert_eq!(audited.entries, 3);

        // The verifier drops seq 1 and re-logs the rest: a new tree of the same statements
        // but one, plus the next statement.
        let mut rewritten = MemoryTree::new();
        for seq in [0u64, 2] {
            rewritten.push(&tlog::statement_leaf("r", "h", seq, &envs[seq as usize]).unwrap());
        }
        log.tree = rewritten;
        let i = log
            .tree
            .push(&tlog::statement_leaf("r", "h", 3, &envs[3]).unwrap());
        let acked = vec![Acked {
            seq: 3,
            envelope: &envs[3],
            entry: log.entry(i),
        }];
        // Same size as kept (3): the roots differ.
        let err = keeper
            .keep(Some(&key), "r", "h", acked, |a, b| log.consistency(a, b), 2)
            .unwrap_err();
        assert!(err.contains("size 3 root"), "{err}");
        assert!(err.contains("not a prefix"), "{err}");
        // One more statement: size 4 does not extend the kept size 3.
        let i = log
            .tree
            .push(&tlog::statement_leaf("r", "h", 4, b"x").unwrap());
        let acked = vec![Acked {
            seq: 4,
            envelope: b"x",
            entry: log.entry(i),
        }];
        let err = keeper
            .keep(Some(&key), "r", "h", acked, |a, b| log.consistency(a, b), 3)
            .unwrap_err();
        assert!(
            err.contains(&format!("size 3 root {}", tlog::hex(&kept.root))),
            "{err}"
        );
        assert!(err.contains("size 4 root"), "{err}");
        let failures = keeper.failures().unwrap();
        assert_eq!(failures.len(), 2);
        assert!(
            failures[1]
                .old_checkpoint
                .as_deref()
                .unwrap()
                .contains("\n3\n")
        );
        assert!(failures[1].new_checkpoint.contains("\n4\n"));
        // The kept checkpoint is still the old one.
        assert_eq!(
            key.open_checkpoint(&keeper.kept_checkpoint().unwrap().unwrap())
                .unwrap(),
            kept
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
