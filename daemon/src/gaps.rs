//! Enforcement gaps: any interval in which the limiter was not provably enforcing our cap on
//! a hook. Each gap is appended to `<state_dir>/gaps.jsonl` and fsynced before it is counted,
//! so a crash cannot erase the evidence of a gap; the evidence issue folds them into statements.

use std::{
    fs::{File, OpenOptions},
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
};

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
    /// All gaps recorded in this log, oldest first.
    pub gaps: Vec<EnforcementGap>,
}

impl GapLog {
    /// Opens (or creates) the log and reads back earlier gaps. A torn last line is kept on
    /// disk untouched and reported as a warning; it is never silently dropped.
    pub fn open(state_dir: &Path) -> Result<GapLog, GapLogError> {
        let path = state_dir.join("gaps.jsonl");
        let e = |source| GapLogError {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(state_dir).map_err(e)?;
        let mut gaps = Vec::new();
        if let Ok(f) = File::open(&path) {
            let mut offset = 0u64;
            for line in BufReader::new(f).split(b'\n') {
                let line = line.map_err(e)?;
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
        Ok(GapLog { path, file, gaps })
    }

    pub fn record(&mut self, gap: EnforcementGap) -> Result<(), GapLogError> {
        log::warn!(
            "ENFORCEMENT GAP {:?} on {} {}: {} (restored: {})",
            gap.kind,
            gap.interface.as_deref().unwrap_or("-"),
            gap.direction.map(|d| d.name()).unwrap_or("-"),
            gap.detail,
            gap.restored
        );
        let mut line = serde_json::to_vec(&gap).map_err(|err| GapLogError {
            path: self.path.clone(),
            source: std::io::Error::other(err),
        })?;
        line.push(b'\n');
        let e = |source| GapLogError {
            path: self.path.clone(),
            source,
        };
        self.file.write_all(&line).map_err(e)?;
        self.file.sync_data().map_err(e)?;
        self.gaps.push(gap);
        Ok(())
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
