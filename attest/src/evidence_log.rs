//! The local evidence log: one DSSE envelope per line, append-only. A statement counts as
//! written only after `fsync` (and, when the file is created, after the directory's fsync).
//!
//! A torn last line (a crash mid-write, a full disk) is found on open, kept byte for byte,
//! terminated with a newline so later lines stay intact, and reported as an [`Incident`] that
//! the next statement carries. The chain continues from the last good statement.

use std::{
    fs::{File, OpenOptions},
    io::Write,
    path::{Path, PathBuf},
};

use ed25519_dalek::VerifyingKey;

use crate::{
    dsse::{self, Envelope, INTOTO_PAYLOAD_TYPE},
    evidence::Incident,
    statement::{GENESIS_PREV, Statement},
};

#[derive(Debug, thiserror::Error)]
#[error("evidence log {path}: {source}")]
pub struct LogError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

impl LogError {
    /// A statement or envelope that could not be written as JSON: nothing was appended.
    pub fn unserialisable(path: &Path, what: &str, e: serde_json::Error) -> LogError {
        LogError {
            path: path.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("cannot write the {what} as JSON, nothing appended: {e}"),
            ),
        }
    }
}

/// The last good statement: where the chain continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainTip {
    pub seq: u64,
    pub pae_sha3: [u8; 32],
    pub epoch_end_unix_ms: u64,
    /// The sampler's key for the requests of the next epoch (`crate::sampling_key`).
    pub next_sampling_key: crate::sampling_key::SamplingKey,
}

pub struct EvidenceLog {
    path: PathBuf,
    file: File,
    /// Bytes of the file that are durably written (after open's repair, and after each
    /// fsynced append). A reader such as the delivery spool must not read past it.
    durable_len: u64,
    pub tip: Option<ChainTip>,
    /// The keyid the last good statement names as its `next_key` (a key rotation it
    /// announced): from the next seq on, that key signs.
    pub tip_next_keyid: Option<String>,
    /// Problems found on open that no later statement has disclosed yet: the next statement
    /// must carry them.
    pub pending_incidents: Vec<Incident>,
}

impl EvidenceLog {
    /// Opens (creating if needed) the log of statements signed by `key`.
    pub fn open(path: &Path, key: &VerifyingKey) -> Result<EvidenceLog, LogError> {
        Self::open_with_keys(path, std::slice::from_ref(key))
    }

    /// Opens the log of a host whose key rotated: a line signed by any of `keys` (the
    /// current key, the ones it rotated away from, the announced next one) is a statement.
    pub fn open_with_keys(path: &Path, keys: &[VerifyingKey]) -> Result<EvidenceLog, LogError> {
        let e = |source| LogError {
            path: path.to_path_buf(),
            source,
        };
        let created = !path.exists();
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(path)
            .map_err(e)?;
        // One writer at a time: a second process appending to the same log would fork the
        // chain. The lock goes with the file descriptor (a killed writer releases it).
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(e(std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    "in use by another process (is rackwardend running its epoch loop on this log?)",
                )));
            }
            Err(std::fs::TryLockError::Error(x)) => return Err(e(x)),
        }
        if created {
            file.sync_all().map_err(e)?;
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                File::open(dir).and_then(|d| d.sync_all()).map_err(e)?;
            }
        }
        let bytes = std::fs::read(path).map_err(e)?;
        let mut durable_len = bytes.len() as u64;
        let mut tip = None;
        let mut tip_next_keyid = None;
        let mut problems: Vec<Incident> = Vec::new();
        let mut disclosed: Vec<u64> = Vec::new();
        let mut offset = 0usize;
        while offset < bytes.len() {
            let Some(nl) = bytes[offset..].iter().position(|b| *b == b'\n') else {
                let torn = &bytes[offset..];
                problems.push(Incident::TornLogTail {
                    offset: offset as u64,
                    length: torn.len() as u64,
                    sha3_256: hex::encode(crate::sha3(torn)),
                });
                // Terminate the torn bytes (never remove them) so the next line is whole.
                file.write_all(b"\n").map_err(e)?;
                file.sync_data().map_err(e)?;
                durable_len += 1;
                break;
            };
            let line = &bytes[offset..offset + nl];
            match keys
                .iter()
                .find_map(|key| dsse::verify(line, key, INTOTO_PAYLOAD_TYPE).ok())
                .and_then(|v| Statement::from_verified(&v.payload).ok().map(|s| (v, s)))
            {
                Some((v, s)) => {
                    disclosed.extend(
                        s.predicate
                            .incidents
                            .iter()
                            .filter_map(Incident::log_offset),
                    );
                    tip = Some(ChainTip {
                        seq: s.predicate.seq,
                        pae_sha3: v.pae_sha3,
                        epoch_end_unix_ms: s.predicate.epoch_end_unix_ms,
                        next_sampling_key: crate::sampling_key::sampling_key(
                            s.predicate.seq,
                            &s.predicate.challenge,
                            &v.pae_sha3,
                        ),
                    });
                    tip_next_keyid = s.predicate.next_key.map(|k| k.keyid);
                }
                None if line.is_empty() => {}
                None => problems.push(Incident::CorruptLogLine {
                    offset: offset as u64,
                    length: line.len() as u64,
                    sha3_256: hex::encode(crate::sha3(line)),
                }),
            }
            offset += nl + 1;
        }
        let pending_incidents = problems
            .into_iter()
            .filter(|i| i.log_offset().is_none_or(|o| !disclosed.contains(&o)))
            .collect();
        Ok(EvidenceLog {
            path: path.to_path_buf(),
            file,
            durable_len,
            tip,
            tip_next_keyid,
            pending_incidents,
        })
    }

    /// Bytes of the log known to be on disk.
    pub fn durable_len(&self) -> u64 {
        self.durable_len
    }

    /// `seq` and `prev` for the next statement.
    pub fn next_link(&self) -> (u64, String) {
        match &self.tip {
            None => (0, GENESIS_PREV.to_string()),
            Some(t) => (t.seq + 1, hex::encode(t.pae_sha3)),
        }
    }

    /// Appends one signed statement and fsyncs. Only after this returns Ok is the statement
    /// acknowledged; on error the log may end in a torn line, which the next open reports.
    pub fn append(&mut self, env: &Envelope, statement: &Statement) -> Result<(), LogError> {
        let body = statement
            .to_json()
            .map_err(|e| LogError::unserialisable(&self.path, "statement", e))?;
        let link = crate::sha3(&dsse::pae(&env.payload_type, &body));
        self.append_linked(env, statement, link)
    }

    /// Where the log lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// [`append`](Self::append) for a statement whose link (SHA3-256 of the PAE its envelope
    /// signs) the signer already computed (`dsse::sign_chained`): the statement is neither
    /// serialised nor hashed again.
    pub fn append_linked(
        &mut self,
        env: &Envelope,
        statement: &Statement,
        link: [u8; 32],
    ) -> Result<(), LogError> {
        let e = |source| LogError {
            path: self.path.clone(),
            source,
        };
        let mut line = env
            .to_json()
            .map_err(|e| LogError::unserialisable(&self.path, "envelope", e))?;
        line.push(b'\n');
        self.file.write_all(&line).map_err(e)?;
        self.file.sync_data().map_err(e)?;
        self.durable_len += line.len() as u64;
        self.tip = Some(ChainTip {
            seq: statement.predicate.seq,
            pae_sha3: link,
            epoch_end_unix_ms: statement.predicate.epoch_end_unix_ms,
            next_sampling_key: crate::sampling_key::sampling_key(
                statement.predicate.seq,
                &statement.predicate.challenge,
                &link,
            ),
        });
        self.tip_next_keyid = statement
            .predicate
            .next_key
            .as_ref()
            .map(|k| k.keyid.clone());
        self.pending_incidents.clear();
        Ok(())
    }
}
