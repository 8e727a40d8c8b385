//! The epoch journal: `<state_dir>/epoch-in-progress.json`, rewritten (atomically, fsynced)
//! at every state change of an epoch and removed once its statement is in the evidence log.
//!
//! A journal found at start means the daemon died mid-epoch. Unless the log already holds
//! that epoch's statement (the crash fell between the append and the removal), the next
//! statement carries an `epoch_interrupted` incident naming the epoch and its state. The
//! journal also carries incidents not yet signed, so a second crash loses none of them.

use std::path::{Path, PathBuf};

use rackwarden_attest::evidence::{EpochTrigger, Incident};
use serde::{Deserialize, Serialize};

use crate::atomic_file;
use crate::pins::StatePaths;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub seq: u64,
    pub state: String,
    pub trigger: EpochTrigger,
    pub started_unix_ms: u64,
    /// Incidents the statement of this epoch must carry (from earlier interruptions).
    pub carried: Vec<Incident>,
}

#[derive(Debug, thiserror::Error)]
#[error("epoch journal {path}: {detail}")]
pub struct JournalError {
    pub path: PathBuf,
    pub detail: String,
}

pub struct Journal {
    path: PathBuf,
}

impl Journal {
    pub fn new(state: &StatePaths) -> Journal {
        Journal {
            path: state.epoch_journal(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The entry left by an epoch that did not finish, if any.
    pub fn read(&self) -> Result<Option<JournalEntry>, JournalError> {
        match std::fs::read(&self.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.err(e.to_string())),
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                self.err(format!("unreadable ({e}); remove it only after reading it"))
            }),
        }
    }

    pub fn write(&self, entry: &JournalEntry) -> Result<(), JournalError> {
        let bytes = serde_json::to_vec(entry).map_err(|e| self.err(e.to_string()))?;
        atomic_file::replace(&self.path, &bytes).map_err(|e| self.err(e.to_string()))
    }

    /// Moves an unreadable journal out of the way, keeping its bytes; returns where.
    pub fn set_aside(&self, now_ms: u64) -> PathBuf {
        let to = self.path.with_extension(format!("unreadable-{now_ms}"));
        if let Err(e) = std::fs::rename(&self.path, &to) {
            log::error!("cannot set {} aside: {e}", self.path.display());
        }
        to
    }

    /// The epoch's statement is durable: the journal has nothing left to say.
    pub fn clear(&self) -> Result<(), JournalError> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(self.err(e.to_string())),
        }
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| self.err(e.to_string()))?;
        }
        Ok(())
    }

    fn err(&self, detail: String) -> JournalError {
        JournalError {
            path: self.path.clone(),
            detail,
        }
    }
}

/// What a journal found at start means for the next statement: the incidents it must carry.
/// `next_seq` is the seq the log would give the next statement.
pub fn recover(entry: &JournalEntry, next_seq: u64, now_ms: u64) -> Vec<Incident> {
    // The log holds this epoch's statement: it carried everything (the crash fell between
    // the append and the journal's removal).
    if entry.seq < next_seq {
        return vec![];
    }
    let mut incidents = entry.carried.clone();
    {
        carry(
            &mut incidents,
            Incident::EpochInterrupted {
                seq: entry.seq,
                state: entry.state.clone(),
                started_unix_ms: entry.started_unix_ms,
                detected_unix_ms: now_ms,
            },
        );
    }
    incidents
}

/// Adds `i` to the incidents to carry, once per interrupted attempt: a retried epoch keeps
/// its seq but starts at a new time, so each attempt cut short is one incident.
pub fn carry(list: &mut Vec<Incident>, i: Incident) {
    if let Incident::EpochInterrupted {
        seq,
        started_unix_ms,
        ..
    } = &i
        && list.iter().any(|x| {
            matches!(x, Incident::EpochInterrupted { seq: s, started_unix_ms: t, .. }
                if s == seq && t == started_unix_ms)
        })
    {
        return;
    }
    list.push(i);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unfinished_epoch_is_an_incident_a_signed_one_is_not() {
        let dir = std::env::temp_dir().join(format!("rw-journal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let j = Journal::new(&StatePaths::new(&dir));
        assert_eq!(j.read().unwrap(), None);
        let e = JournalEntry {
            seq: 7,
            state: "wiping".into(),
            trigger: EpochTrigger::Interval,
            started_unix_ms: 1000,
            carried: vec![],
        };
        j.write(&e).unwrap();
        let back = j.read().unwrap().unwrap();
        assert_eq!(back, e);
        // The log's next seq is still 7: epoch 7 never signed.
        let inc = recover(&back, 7, 2000);
        assert!(matches!(
            &inc[..],
            [Incident::EpochInterrupted { seq: 7, state, detected_unix_ms: 2000, .. }] if state == "wiping"
        ));
        // The log already holds seq 7: the crash fell after the append.
        assert!(recover(&back, 8, 2000).is_empty());
        // Incidents carried from earlier attempts go along with the interruption, and are
        // not carried again once the statement that carried them is in the log.
        let earlier = Incident::EpochInterrupted {
            seq: 7,
            state: "draining".into(),
            started_unix_ms: 500,
            detected_unix_ms: 900,
        };
        let with = JournalEntry {
            carried: vec![earlier.clone()],
            ..e.clone()
        };
        let inc = recover(&with, 7, 2000);
        assert_eq!(inc.len(), 2);
        assert_eq!(inc[0], earlier);
        assert!(recover(&with, 8, 2000).is_empty());
        // One attempt is one incident, however often it is recorded.
        let mut list = inc.clone();
        carry(&mut list, inc[1].clone());
        assert_eq!(list.len(), 2);
        j.clear().unwrap();
        assert_eq!(j.read().unwrap(), None);
        std::fs::write(j.path(), b"{not json").unwrap();
        assert!(j.read().unwrap_err().to_string().contains("unreadable"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
