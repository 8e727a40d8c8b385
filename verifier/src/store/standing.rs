//! Each host's standing as far as it depends on the host's whole history (gaps, and the
//! contraindicated statements no operator has cleared), kept in one row per host that is
//! brought up to date in the transaction that stores a statement or a clearance. Reading a
//! rack's standing then reads a row per host, where it read every row each host ever stored
//! (6 ms a host at 1,000 epochs, most of the rack page; issue 23).
//!
//! The row is derived data: [`Store::derive_standing`] computes it from the statements and
//! clearances alone. A database made before the table existed is filled from that on open,
//! and `recheck` compares every stored row with it.

use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use super::{DbError, Store};

/// What a host's standing needs from its whole history.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StandingRow {
    /// Distinct seqs stored (a fork stores one seq twice): fewer than `top_seq + 1` is a gap.
    pub seqs_stored: u64,
    /// The highest seq stored (`None`: no statement yet).
    pub top_seq: Option<u64>,
    /// Contraindicated statements stored after the host's latest clearance.
    pub uncleared: u64,
    /// The row id of the first of them, which holds the host.
    pub first_uncleared_id: Option<i64>,
}

/// Created with the rest of the schema on a new database; on an older one it is created and
/// filled (see [`Store::fill_standing`]).
pub(super) const STANDING_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS host_standing (
  rack TEXT NOT NULL, host TEXT NOT NULL, seqs_stored INTEGER NOT NULL, top_seq INTEGER,
  uncleared INTEGER NOT NULL, first_uncleared_id INTEGER, PRIMARY KEY (rack, host));
";

/// The stored status that holds a host until it is cleared (the partial index's condition).
const CONTRAINDICATED: &str = "contraindicated";

fn row_standing(r: &rusqlite::Row) -> rusqlite::Result<StandingRow> {
    Ok(StandingRow {
        seqs_stored: r.get::<_, i64>(0)? as u64,
        top_seq: r.get::<_, Option<i64>>(1)?.map(|v| v as u64),
        uncleared: r.get::<_, i64>(2)? as u64,
        first_uncleared_id: r.get(3)?,
    })
}

impl Store {
    /// Whether the standing table exists (a database made before it did has none).
    pub(super) fn has_standing_table(conn: &rusqlite::Connection) -> Result<bool, DbError> {
        Ok(conn
            .prepare(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'host_standing'",
            )?
            .query_row([], |r| r.get::<_, i64>(0))?
            > 0)
    }

    /// Fills the standing table from the statements and clearances, in one transaction (of
    /// its own, taking the write lock at once: a verifier serving the same database keeps
    /// ingesting meanwhile). Every row written is derived from what is stored, so filling
    /// twice, or while another process fills, leaves the same rows.
    pub(super) fn fill_standing(&self) -> Result<(), DbError> {
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        let filled = self.hosts_with_statements().and_then(|hosts| {
            for (rack, host) in hosts {
                let row = self.derive_standing(&rack, &host)?;
                self.put_standing(&rack, &host, &row)?;
            }
            self.conn.execute_batch("COMMIT")
        });
        if filled.is_err() {
            self.rollback();
        }
        filled
    }

    /// The host's standing row as kept (all zero for a host with no statement yet).
    pub fn standing_row(&self, rack: &str, host: &str) -> Result<StandingRow, DbError> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT seqs_stored, top_seq, uncleared, first_uncleared_id FROM host_standing WHERE rack = ?1 AND host = ?2",
            )?
            .query_row(params![rack, host], row_standing)
            .optional()?
            .unwrap_or_default())
    }

    /// Every standing row kept, by rack and host.
    pub fn standing_rows(&self) -> Result<Vec<(String, String, StandingRow)>, DbError> {
        let mut st = self.conn.prepare_cached(
            "SELECT seqs_stored, top_seq, uncleared, first_uncleared_id, rack, host FROM host_standing ORDER BY rack, host",
        )?;
        let rows = st.query_map([], |r| Ok((r.get(4)?, r.get(5)?, row_standing(r)?)))?;
        rows.collect()
    }

    /// Every (rack, host) with a stored statement.
    pub fn hosts_with_statements(&self) -> Result<Vec<(String, String)>, DbError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT DISTINCT rack, host FROM statements ORDER BY rack, host")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect()
    }

    /// The host's standing row computed from its whole history: every seq it stored, its
    /// latest clearance and the contraindicated statements after it.
    pub fn derive_standing(&self, rack: &str, host: &str) -> Result<StandingRow, DbError> {
        let (seqs_stored, top_seq) = self
            .conn
            .prepare_cached(
                "SELECT COUNT(DISTINCT seq), MAX(seq) FROM statements WHERE rack = ?1 AND host = ?2",
            )?
            .query_row(params![rack, host], |r| {
                Ok((
                    r.get::<_, i64>(0)? as u64,
                    r.get::<_, Option<i64>>(1)?.map(|v| v as u64),
                ))
            })?;
        let (uncleared, first_uncleared_id) = self.uncleared_after_last_clearance(rack, host)?;
        Ok(StandingRow {
            seqs_stored,
            top_seq,
            uncleared,
            first_uncleared_id,
        })
    }

    /// How many contraindicated statements the host stored after its latest clearance, and
    /// the first of them (read from the partial index, never the rows).
    fn uncleared_after_last_clearance(
        &self,
        rack: &str,
        host: &str,
    ) -> Result<(u64, Option<i64>), DbError> {
        self.conn
            .prepare_cached(
                "SELECT COUNT(*), MIN(id) FROM statements WHERE rack = ?1 AND host = ?2 AND status = 'contraindicated'
                 AND id > COALESCE((SELECT up_to_id FROM clearances WHERE rack = ?1 AND host = ?2 ORDER BY id DESC LIMIT 1), 0)",
            )?
            .query_row(params![rack, host], |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get(1)?))
            })
    }

    fn put_standing(&self, rack: &str, host: &str, row: &StandingRow) -> Result<(), DbError> {
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO host_standing (rack, host, seqs_stored, top_seq, uncleared, first_uncleared_id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                rack,
                host,
                row.seqs_stored as i64,
                row.top_seq.map(|v| v as i64),
                row.uncleared as i64,
                row.first_uncleared_id
            ])?;
        Ok(())
    }

    /// Whether the host has a statement stored at `seq` (before one more is stored there).
    pub(super) fn seq_stored(&self, rack: &str, host: &str, seq: u64) -> Result<bool, DbError> {
        self.conn
            .prepare_cached(
                "SELECT EXISTS(SELECT 1 FROM statements WHERE rack = ?1 AND host = ?2 AND seq = ?3)",
            )?
            .query_row(params![rack, host, seq as i64], |r| r.get(0))
    }

    /// Brings the host's row up to date with a statement just stored as row `id`
    /// (`new_seq`: no statement of the host had its seq before). A new row id is above every
    /// clearance's, so a contraindicated statement is uncleared, and the first one if none
    /// was.
    pub(super) fn note_stored(
        &self,
        rack: &str,
        host: &str,
        seq: u64,
        id: i64,
        status: &str,
        new_seq: bool,
    ) -> Result<(), DbError> {
        let contraindicated = status == CONTRAINDICATED;
        self.conn
            .prepare_cached(
                "INSERT INTO host_standing (rack, host, seqs_stored, top_seq, uncleared, first_uncleared_id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT(rack, host) DO UPDATE SET
                   seqs_stored = seqs_stored + excluded.seqs_stored,
                   top_seq = MAX(COALESCE(top_seq, excluded.top_seq), excluded.top_seq),
                   uncleared = uncleared + excluded.uncleared,
                   first_uncleared_id = COALESCE(first_uncleared_id, excluded.first_uncleared_id)",
            )?
            .execute(params![
                rack,
                host,
                i64::from(new_seq),
                seq as i64,
                i64::from(contraindicated),
                contraindicated.then_some(id)
            ])?;
        Ok(())
    }

    /// Brings the host's row up to date with a clearance just recorded: what it left
    /// uncleared is read again (nothing, unless a statement came between).
    pub(super) fn note_cleared(&self, rack: &str, host: &str) -> Result<(), DbError> {
        let (uncleared, first_uncleared_id) = self.uncleared_after_last_clearance(rack, host)?;
        self.conn
            .prepare_cached(
                "INSERT INTO host_standing (rack, host, seqs_stored, top_seq, uncleared, first_uncleared_id)
                 VALUES (?1, ?2, 0, NULL, ?3, ?4)
                 ON CONFLICT(rack, host) DO UPDATE SET
                   uncleared = excluded.uncleared, first_uncleared_id = excluded.first_uncleared_id",
            )?
            .execute(params![rack, host, uncleared as i64, first_uncleared_id])?;
        Ok(())
    }

    /// The seq and stored verdict (JSON) of row `id`, if it exists.
    pub fn seq_and_result(&self, id: i64) -> Result<Option<(u64, String)>, DbError> {
        self.conn
            .prepare_cached("SELECT seq, result FROM statements WHERE id = ?1")?
            .query_row(params![id], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)))
            .optional()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoredStatement;

    /// The standing as it was read before the row was kept: every seq the host stored, and
    /// every contraindicated statement after its latest clearance, rows and all.
    fn whole_history(s: &Store, rack: &str, host: &str) -> StandingRow {
        let seqs = s.seqs(rack, host).unwrap();
        let after = s
            .clearances(Some(rack), Some(host))
            .unwrap()
            .last()
            .map_or(0, |c| c.up_to_id);
        let bad = s.contraindicated_after(rack, host, after).unwrap();
        StandingRow {
            seqs_stored: seqs.len() as u64,
            top_seq: seqs.last().copied(),
            uncleared: bad.len() as u64,
            first_uncleared_id: bad.first().map(|b| b.id),
        }
    }

    fn store_one(s: &Store, host: &str, seq: u64, status: &str) -> i64 {
        s.insert_statement(&StoredStatement {
            id: 0,
            rack: "r".into(),
            host: host.into(),
            seq,
            pae_sha3: format!("{host}-{seq}-{status}-{}", unique()),
            envelope: "{}".into(),
            received_ms: 1_000 + seq,
            epoch_end_ms: 1_000 + seq,
            status: status.into(),
            result: "{}".into(),
            wipe_ms: None,
        })
        .unwrap()
    }

    fn unique() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        N.fetch_add(1, Ordering::Relaxed)
    }

    fn assert_rows_derive(s: &Store, when: &str) {
        for host in ["h1", "h2", "h3"] {
            let kept = s.standing_row("r", host).unwrap();
            assert_eq!(kept, whole_history(s, "r", host), "{host} {when}");
            assert_eq!(kept, s.derive_standing("r", host).unwrap(), "{host} {when}");
        }
    }

    fn temp_db(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("rwv-standing-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir.join("v.sqlite")
    }

    /// Statements with a gap and a fork, contraindicated ones before and after clearances (in
    /// a transaction of their own and inside one), then a restart.
    #[test]
    fn the_row_is_what_the_whole_history_gives_after_ingest_clearance_and_restart() {
        let db = temp_db("row");
        let s = Store::open(&db).unwrap();
        assert_rows_derive(&s, "empty");
        store_one(&s, "h1", 0, "affirming");
        let first_bad = store_one(&s, "h1", 1, "contraindicated");
        store_one(&s, "h1", 1, "warning"); // a fork
        store_one(&s, "h1", 3, "contraindicated"); // after a gap
        store_one(&s, "h2", 0, "warning");
        assert_rows_derive(&s, "after ingest");
        let h1 = s.standing_row("r", "h1").unwrap();
        assert_eq!(
            h1,
            StandingRow {
                seqs_stored: 3,
                top_seq: Some(3),
                uncleared: 2,
                first_uncleared_id: Some(first_bad)
            }
        );
        let c = s.clear("r", "h1", "alice", "reviewed", 2_000).unwrap();
        assert_eq!(c.cleared.len(), 2);
        assert_rows_derive(&s, "after a clearance");
        assert_eq!(s.standing_row("r", "h1").unwrap().uncleared, 0);
        // Stored after the clearance: not cleared by it. A stale seq fills the gap.
        store_one(&s, "h1", 2, "contraindicated");
        store_one(&s, "h1", 4, "contraindicated");
        assert_rows_derive(&s, "after a statement after the clearance");
        // A clearance inside an open transaction (a savepoint in it), and one of a host with
        // no statement.
        s.begin().unwrap();
        s.clear("r", "h1", "bob", "reviewed again", 3_000).unwrap();
        s.clear("r", "h3", "bob", "nothing to clear", 3_000)
            .unwrap();
        s.commit().unwrap();
        assert_rows_derive(&s, "after a clearance in a transaction");
        // A statement rolled back takes its standing with it.
        s.savepoint().unwrap();
        store_one(&s, "h2", 1, "contraindicated");
        s.rollback_to_savepoint().unwrap();
        assert_rows_derive(&s, "after a rollback");
        let before = s.standing_rows().unwrap();
        drop(s);
        let s = Store::open(&db).unwrap();
        assert_eq!(s.standing_rows().unwrap(), before, "after a restart");
        assert_rows_derive(&s, "after a restart");
        let _ = std::fs::remove_dir_all(db.parent().unwrap());
    }

    /// A database made before host standings were kept has no table: it is made and filled
    /// from the statements and clearances when the store opens it.
    #[test]
    fn a_database_made_before_the_table_is_filled_on_open() {
        let db = temp_db("old");
        let s = Store::open(&db).unwrap();
        store_one(&s, "h1", 0, "contraindicated");
        store_one(&s, "h1", 2, "warning");
        store_one(&s, "h2", 0, "contraindicated");
        s.clear("r", "h2", "alice", "reviewed", 2_000).unwrap();
        store_one(&s, "h2", 1, "contraindicated");
        store_one(&s, "h3", 5, "affirming");
        let kept = s.standing_rows().unwrap();
        drop(s);
        // What the schema was before: everything but the table.
        rusqlite::Connection::open(&db)
            .unwrap()
            .execute_batch("DROP TABLE host_standing")
            .unwrap();
        let s = Store::open(&db).unwrap();
        assert_eq!(s.standing_rows().unwrap(), kept);
        assert_eq!(kept.len(), 3);
        assert_rows_derive(&s, "filled on open");
        let _ = std::fs::remove_dir_all(db.parent().unwrap());
    }
}
