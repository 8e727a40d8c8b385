//! The evidence log is the spool. `<state_dir>/delivered.json` (replaced atomically, fsynced)
//! holds the byte offset just past the last statement the verifier acknowledged, and that
//! statement's seq. Everything after it, up to what the log has durably written, is
//! undelivered and is sent strictly in order.
//!
//! Lines that are not statements of ours (a torn tail, a corrupt line) are stepped over: they
//! stay in the log and the next statement discloses them as incidents.

use std::{
    io::{Read, Seek, SeekFrom},
    path::{Path, PathBuf},
};

use crate::{epoch::host_keys::KeyRing, pins::StatePaths};
use ed25519_dalek::VerifyingKey;
use rackwarden_attest::{dsse, statement::Statement};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// Byte offset in the log just past the last acknowledged line.
    pub offset: u64,
    /// Seq of the last statement the verifier acknowledged (`None`: none yet).
    pub seq: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
#[error("delivery spool {path}: {detail}")]
pub struct SpoolError {
    pub path: PathBuf,
    pub detail: String,
}

/// One complete line after the cursor.
#[derive(Debug, Clone)]
pub struct SpoolLine {
    /// Offset just past this line's newline: the cursor once it is acknowledged.
    pub end: u64,
    /// `Some` for a statement of ours (seq and the verbatim envelope bytes), `None` for a
    /// line that is not one (stepped over).
    pub statement: Option<(u64, Vec<u8>)>,
}

pub struct Spool {
    log: PathBuf,
    cursor_path: PathBuf,
    /// The host's keys (current, next, rotated away from): the log holds lines of each.
    keys: KeyRing,
}

impl Spool {
    pub fn new(state: &StatePaths, keys: KeyRing) -> Spool {
        Spool {
            log: state.evidence_log(),
            cursor_path: state.delivery_cursor(),
            keys,
        }
    }

    pub fn load_cursor(&self) -> Result<Cursor, SpoolError> {
        match std::fs::read(&self.cursor_path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Cursor::default()),
            Err(e) => Err(self.err(&self.cursor_path, e.to_string())),
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                self.err(
                    &self.cursor_path,
                    format!("unreadable ({e}); delete it to resend the whole log (the verifier takes duplicates)"),
                )
            }),
        }
    }

    pub fn save_cursor(&self, c: &Cursor) -> Result<(), SpoolError> {
        let bytes =
            serde_json::to_vec(c).map_err(|e| self.err(&self.cursor_path, e.to_string()))?;
        crate::atomic_file::replace(&self.cursor_path, &bytes)
            .map_err(|e| self.err(&self.cursor_path, e.to_string()))
    }

    /// The complete lines between `from` and `durable_len` (the log's length after its last
    /// fsynced append). Bytes past `durable_len` may not be on disk yet: never sent.
    pub fn lines(&self, from: u64, durable_len: u64) -> Result<Vec<SpoolLine>, SpoolError> {
        if durable_len <= from {
            return Ok(vec![]);
        }
        let mut f =
            std::fs::File::open(&self.log).map_err(|e| self.err(&self.log, e.to_string()))?;
        let len = f
            .metadata()
            .map_err(|e| self.err(&self.log, e.to_string()))?
            .len();
        if len < durable_len {
            return Err(self.err(
                &self.log,
                format!("the log is {len} bytes, shorter than the {durable_len} bytes written: it was truncated or replaced"),
            ));
        }
        f.seek(SeekFrom::Start(from))
            .map_err(|e| self.err(&self.log, e.to_string()))?;
        let mut buf = Vec::new();
        f.take(durable_len - from)
            .read_to_end(&mut buf)
            .map_err(|e| self.err(&self.log, e.to_string()))?;
        let keys: Vec<VerifyingKey> = self.keys.read().map(|k| k.clone()).unwrap_or_default();
        let mut out = Vec::new();
        let mut pos = 0usize;
        while let Some(nl) = buf[pos..].iter().position(|b| *b == b'\n') {
            let line = &buf[pos..pos + nl];
            let statement = keys
                .iter()
                .find_map(|k| dsse::verify(line, k, dsse::INTOTO_PAYLOAD_TYPE).ok())
                .and_then(|v| Statement::from_verified(&v.payload).ok())
                .map(|s| (s.predicate.seq, line.to_vec()));
            pos += nl + 1;
            out.push(SpoolLine {
                end: from + pos as u64,
                statement,
            });
        }
        Ok(out)
    }

    fn err(&self, path: &Path, detail: String) -> SpoolError {
        SpoolError {
            path: path.to_path_buf(),
            detail,
        }
    }
}
