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
        self, TlogError,
        audit::{self, AuditError},
        note::{Checkpoint, NoteVerifier},
        tile::FetchError,
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

/// A file of the kept log that cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum TlogFileError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}:{line}: {source}", path.display())]
    Line {
        path: PathBuf,
        /// 1-based.
        line: usize,
        source: serde_json::Error,
    },
    #[error("{}: a line cannot be serialized: {source}", path.display())]
    Serialize {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// A check of the verifier's log that failed: what [`LogFailure::error`] records, and what
/// the delivery status shows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogCheckFailure {
    /// An acknowledged statement's entry does not prove it in its checkpoint.
    #[error("seq {seq}: {source}")]
    Entry { seq: u64, source: AuditError },
    /// The new checkpoint does not extend the kept one.
    #[error("{0}")]
    Inconsistent(AuditError),
    #[error(
        "the verifier answered a consistency proof from {got_from} to {got_to}, not from {want_from} to {want_to}"
    )]
    ProofRange {
        got_from: u64,
        got_to: u64,
        want_from: u64,
        want_to: u64,
    },
}

/// Why [`LogKeeper::keep`] did not end well.
#[derive(Debug, thiserror::Error)]
pub enum KeepError {
    #[error(transparent)]
    File(#[from] TlogFileError),
    /// Already recorded in `tlog-failures.jsonl`.
    #[error(transparent)]
    Check(#[from] LogCheckFailure),
}

/// Why `rackwarden log verify` refuses what the host kept.
#[derive(Debug, thiserror::Error)]
pub enum LocalAuditError {
    #[error(transparent)]
    File(#[from] TlogFileError),
    #[error("seq {seq}: the kept envelope digest `{digest}` is not 64 hex digits")]
    BadDigest { seq: u64, digest: String },
    #[error("seq {seq}: the rack or host id is over 65535 bytes: no leaf has it")]
    IdTooLong { seq: u64 },
    #[error("seq {seq}: {source}")]
    Entry { seq: u64, source: AuditError },
    #[error("{0}")]
    Tiles(#[from] AuditError),
    #[error("seq {seq}: reading its leaf from the tiles: {source}")]
    TileLeaf { seq: u64, source: TlogError },
    #[error("seq {seq}: leaf {index} of the {checkpoint} is not this statement's")]
    LeafMismatch {
        seq: u64,
        index: u64,
        checkpoint: String,
    },
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
    pub fn kept_checkpoint(&self) -> Result<Option<String>, TlogFileError> {
        match std::fs::read_to_string(&self.checkpoint) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(TlogFileError::Io {
                path: self.checkpoint.clone(),
                source,
            }),
        }
    }

    /// Every kept entry, in order.
    pub fn entries(&self) -> Result<Vec<KeptEntry>, TlogFileError> {
        read_lines(&self.entries)
    }

    /// Every failure recorded.
    pub fn failures(&self) -> Result<Vec<LogFailure>, TlogFileError> {
        read_lines(&self.failures)
    }

    fn append_line<T: Serialize>(path: &Path, value: &T) -> Result<(), TlogFileError> {
        let mut line = serde_json::to_vec(value).map_err(|source| TlogFileError::Serialize {
            path: path.to_owned(),
            source,
        })?;
        line.push(b'\n');
        let io = |source| TlogFileError::Io {
            path: path.to_owned(),
            source,
        };
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        f.write_all(&line).and_then(|()| f.sync_data()).map_err(io)
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
    /// consistency proof fetched by `consistency(from, to)` (its error is logged, and the
    /// check waits for the next batch). `Err`: a check failed ([`KeepError::Check`], already
    /// recorded in `tlog-failures.jsonl`; the entries are kept all the same), or a file of the
    /// log could not be read or written.
    pub fn keep<E: std::fmt::Display>(
        &self,
        log_key: Option<&NoteVerifier>,
        rack: &str,
        host: &str,
        acked: Vec<Acked<'_>>,
        consistency: impl Fn(u64, u64) -> Result<ConsistencyProof, E>,
        now_ms: u64,
    ) -> Result<(), KeepError> {
        let mut newest: Option<(Checkpoint, String)> = None;
        let mut failed: Option<KeepError> = None;
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
                Err(source) => {
                    let failure = LogCheckFailure::Entry { seq: a.seq, source };
                    let f = LogFailure {
                        detected_ms: now_ms,
                        error: failure.to_string(),
                        old_checkpoint: self.kept_checkpoint().ok().flatten(),
                        new_checkpoint: a.entry.checkpoint.clone(),
                        proof: a.entry.proof.clone(),
                    };
                    self.record_failure(&f);
                    failed.get_or_insert(failure.into());
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
    fn extend<E: std::fmt::Display>(
        &self,
        key: &NoteVerifier,
        new: &Checkpoint,
        new_note: &str,
        consistency: impl Fn(u64, u64) -> Result<ConsistencyProof, E>,
        now_ms: u64,
    ) -> Result<(), KeepError> {
        let old_note = self.kept_checkpoint()?;
        let checked: Result<Vec<String>, (LogCheckFailure, Vec<String>)> = match &old_note {
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
                    LogCheckFailure::Inconsistent(AuditError::Inconsistent {
                        old: old.describe(),
                        new: new.describe(),
                        source: Box::new(TlogError::SizesReversed {
                            old: old.size,
                            new: new.size,
                        }),
                    }),
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
                        LogCheckFailure::ProofRange {
                            got_from: p.from,
                            got_to: p.to,
                            want_from: old.size,
                            want_to: new.size,
                        },
                        p.proof,
                    )),
                    Ok(p) => match audit::check_consistency(&old, new, &p.proof) {
                        Ok(()) => Ok(p.proof),
                        Err(e) => Err((LogCheckFailure::Inconsistent(e), p.proof)),
                    },
                },
            },
        };
        match checked {
            Ok(_) => {
                atomic_file::replace(&self.checkpoint, new_note.as_bytes()).map_err(|source| {
                    TlogFileError::Io {
                        path: self.checkpoint.clone(),
                        source,
                    }
                    .into()
                })
            }
            Err((failure, proof)) => {
                let f = LogFailure {
                    detected_ms: now_ms,
                    error: failure.to_string(),
                    old_checkpoint: old_note,
                    new_checkpoint: new_note.to_string(),
                    proof,
                };
                self.record_failure(&f);
                Err(failure.into())
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
pub fn audit_local<F, E>(
    keeper: &LogKeeper,
    key: &NoteVerifier,
    rack: &str,
    host: &str,
    tiles: Option<(&str, F)>,
) -> Result<LocalAudit, LocalAuditError>
where
    F: Fn(&str) -> Result<Vec<u8>, E>,
    E: Into<FetchError>,
{
    let entries = keeper.entries()?;
    let mut checkpoints: Vec<Checkpoint> = Vec::new();
    for k in &entries {
        let leaf = leaf_from_digest(rack, host, k)?;
        let cp = audit::check_entry(key, &k.entry, &leaf)
            .map_err(|source| LocalAuditError::Entry { seq: k.seq, source })?;
        if !checkpoints.contains(&cp) {
            checkpoints.push(cp);
        }
    }
    let mut tiles_checkpoint = None;
    if let Some((note, fetch)) = tiles {
        let audited = audit::audit_tiles(key, note, &fetch, true, &checkpoints)?;
        let cp = audited.checkpoint;
        let reader = tlog::tile::TileReader::new(cp.size, &fetch);
        for k in &entries {
            if k.entry.index >= cp.size {
                continue;
            }
            let leaf = leaf_from_digest(rack, host, k)?;
            let have = tlog::HashReader::node(&reader, 0, k.entry.index)
                .map_err(|source| LocalAuditError::TileLeaf { seq: k.seq, source })?;
            if have != tlog::leaf_hash(&leaf) {
                return Err(LocalAuditError::LeafMismatch {
                    seq: k.seq,
                    index: k.entry.index,
                    checkpoint: cp.describe(),
                });
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

/// The leaf of a kept statement from the SHA-256 of its envelope (as kept) rather than the
/// bytes.
fn leaf_from_digest(rack: &str, host: &str, k: &KeptEntry) -> Result<Vec<u8>, LocalAuditError> {
    let digest = tlog::from_hex(&k.envelope_sha256).ok_or_else(|| LocalAuditError::BadDigest {
        seq: k.seq,
        digest: k.envelope_sha256.clone(),
    })?;
    tlog::statement_leaf_of_digest(rack, host, k.seq, &digest)
        .ok_or(LocalAuditError::IdTooLong { seq: k.seq })
}

/// The lines of a JSON-lines file (none if it is not there), blank lines skipped.
fn read_lines<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>, TlogFileError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(source) => {
            return Err(TlogFileError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| TlogFileError::Line {
                path: path.to_owned(),
                line: i + 1,
                source,
            })
        })
        .collect()
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
        fn consistency(&self, from: u64, to: u64) -> Result<ConsistencyProof, TlogError> {
            Ok(ConsistencyProof {
                from,
                to,
                proof: tlog::consistency_proof(&self.tree, from, to)?
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
        let audited = audit_local::<fn(&str) -> Result<Vec<u8>, FetchError>, _>(
            &keeper, &key, "r", "h", None,
        )
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
            .unwrap_err()
            .to_string();
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
            matches!(err, KeepError::Check(LogCheckFailure::Inconsistent(_))),
            "{err}"
        );
        let err = err.to_string();
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
        // A kept line that is not an entry is named by file and line.
        let mut text = std::fs::read_to_string(keeper.entries_path()).unwrap();
        text.push_str("{\"seq\": \"x\"}\n");
        std::fs::write(keeper.entries_path(), text).unwrap();
        let e = keeper.entries().unwrap_err();
        assert!(matches!(&e, TlogFileError::Line { line: 6, .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with(&format!("{}:6: ", keeper.entries_path().display())),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
