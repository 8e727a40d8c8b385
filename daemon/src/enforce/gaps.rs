//! Enforcement gaps: any interval in which the limiter was not provably enforcing our cap on
//! a hook. Each gap is appended to `<state_dir>/gaps.jsonl` and fsynced before it is counted,
//! so a crash cannot erase the evidence of a gap; the evidence issue folds them into statements.

use std::{
    fs::{File, OpenOptions},
    io::{BufRead, BufReader, Write},
    path::PathBuf,
};

use crate::pins::StatePaths;
pub use rackwarden_attest::evidence::{EnforcementGap, GapKind};

#[derive(Debug, thiserror::Error)]
#[error("gap log {path}: {source}")]
pub struct GapLogError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

pub struct GapLog {
    path: PathBuf,
    file: File,
    /// All gaps known, oldest first: those on disk, then the `unpersisted` newest ones.
    pub gaps: Vec<EnforcementGap>,
    /// How many of the newest gaps are not on disk yet (a full disk, an I/O error): they are
    /// kept here and written, in order, by the next [`GapLog::flush`].
    unpersisted: usize,
    /// A write failed part-way: the next write starts on a fresh line so a fragment can
    /// never merge with a whole record (the fragment stays, and is reported on open).
    maybe_torn: bool,
}

impl GapLog {
    /// Opens (or creates) the log and reads back earlier gaps. A torn last line is kept on
    /// disk untouched and reported as a warning; it is never silently dropped.
    pub fn open(state: &StatePaths) -> Result<GapLog, GapLogError> {
        let path = state.gaps();
        let e = |source| GapLogError {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(state.dir()).map_err(e)?;
        let mut gaps = Vec::new();
        if let Ok(f) = File::open(&path) {
            let mut offset = 0u64;
            for line in BufReader::new(f).split(b'\n') {
                let line = line.map_err(e)?;
                if line.is_empty() {
                    offset += 1;
                    continue;
                }
                match serde_json::from_slice::<EnforcementGap>(&line) {
                    Ok(g) => gaps.push(g),
                    Err(err) => log::warn!(
                        "{}: unreadable gap record at byte offset {offset}: {err}",
                        path.display()
                    ),
                }
                offset += line.len() as u64 + 1;
            }
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(e)?;
        Ok(GapLog {
            path,
            file,
            gaps,
            unpersisted: 0,
            maybe_torn: false,
        })
    }

    /// Records a gap: in memory at once, on disk (fsynced) as soon as the disk allows. A
    /// failed write never drops the gap: it stays pending and is retried by every check.
    pub fn record(&mut self, gap: EnforcementGap) {
        log::warn!(
            "ENFORCEMENT GAP {:?} on {} {}: {} (restored: {})",
            gap.kind,
            gap.interface.as_deref().unwrap_or("-"),
            gap.direction.map(|d| d.name()).unwrap_or("-"),
            gap.detail,
            gap.restored
        );
        self.gaps.push(gap);
        self.unpersisted += 1;
        self.flush();
    }

    /// Gaps known but not yet on disk.
    pub fn unpersisted(&self) -> usize {
        self.unpersisted
    }

    /// Writes the pending gaps, oldest first, and fsyncs. Returns whether all are on disk.
    pub fn flush(&mut self) -> bool {
        if self.unpersisted == 0 {
            return true;
        }
        let mut buf = Vec::new();
        if self.maybe_torn {
            buf.push(b'\n');
        }
        for g in &self.gaps[self.gaps.len() - self.unpersisted..] {
            match serde_json::to_vec(g) {
                Ok(line) => buf.extend(line),
                // Kept pending (and so in memory and in the next statement), never written
                // as an empty line.
                Err(e) => {
                    log::error!(
                        "gap journal {}: cannot write a gap as JSON: {e}",
                        self.path.display()
                    );
                    return false;
                }
            }
            buf.push(b'\n');
        }
        // Reopen after a failure: the file may have been replaced while the disk was full.
        if self.maybe_torn
            && let Ok(f) = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)
        {
            self.file = f;
        }
        match self
            .file
            .write_all(&buf)
            .and_then(|()| self.file.sync_data())
        {
            Ok(()) => {
                self.unpersisted = 0;
                self.maybe_torn = false;
                true
            }
            Err(e) => {
                self.maybe_torn = true;
                log::error!(
                    "{}: {} gap record(s) not on disk yet ({e}); kept in memory, retried at every check",
                    self.path.display(),
                    self.unpersisted
                );
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rackwarden_attest::evidence::GapKind;

    fn gap(n: u64) -> EnforcementGap {
        EnforcementGap {
            kind: GapKind::Detached,
            interface: Some("eth0".into()),
            direction: None,
            last_verified_at_ms: Some(n),
            detected_at_ms: n + 1,
            detail: format!("gap {n}"),
            restored: true,
        }
    }

    #[test]
    fn a_full_disk_delays_gap_records_but_never_loses_them() {
        let dir = std::env::temp_dir().join(format!("rw-gaps-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut log = GapLog::open(&StatePaths::new(&dir)).unwrap();
        // A full disk: every write to /dev/full fails with ENOSPC.
        log.file = OpenOptions::new().write(true).open("/dev/full").unwrap();
        log.record(gap(1));
        assert_eq!(log.gaps.len(), 1, "the gap is kept in memory");
        assert_eq!(log.unpersisted(), 1, "and known to be not on disk");
        assert_eq!(std::fs::read(dir.join("gaps.jsonl")).unwrap(), b"");
        // Space again: the next record reopens the log and writes both, in order.
        log.record(gap(2));
        assert_eq!(log.unpersisted(), 0);
        let reopened = GapLog::open(&StatePaths::new(&dir)).unwrap();
        assert_eq!(reopened.gaps, vec![gap(1), gap(2)]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
