//! Each host's standing as far as it depends on the host's whole history (gaps, and the
//! contraindicated statements no operator has cleared), kept in one row per host that is
//! brought up to date in the transaction that stores a statement or a clearance. Reading a
//! rack's standing then reads a row per host, where it read every row each host ever stored
//! (6 ms a host at 1,000 epochs, most of the rack page; issue 23).
//!
//! The row is derived data: [`Store::derive_standing`] computes it from the statements and
//! clearances alone. A database made before the table existed is filled from that on open,
//! and `recheck` compares every stored row with it.

use serde::Serialize;

use super::{
    DbError, Store,
    db::{Dialect, Row, vals},
};

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

/// Whether the host has a statement at `seq` already (a second one is a fork, not a new seq).
pub(super) const SEQ_STORED_SQL: &str =
    "SELECT EXISTS(SELECT 1 FROM statements WHERE rack = ?1 AND host = ?2 AND seq = ?3)";

/// The stored status that holds a host until it is cleared (the partial index's condition).
const CONTRAINDICATED: &str = "contraindicated";

fn row_standing(r: &Row) -> Result<StandingRow, DbError> {
    Ok(StandingRow {
        seqs_stored: r.u64(0)?,
        top_seq: r.opt_u64(1)?,
        uncleared: r.u64(2)?,
        first_uncleared_id: r.opt_i64(3)?,
    })
}

impl Store {
    /// Whether the database already has the standing table (asked before the schema is made).
    pub(super) fn has_standing_table(&self) -> Result<bool, DbError> {
        let sql = match self.db.dialect() {
            Dialect::Sqlite => {
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'host_standing'"
            }
            Dialect::Postgres => {
                "SELECT COUNT(*) FROM pg_tables WHERE tablename = 'host_standing' AND schemaname = current_schema()"
            }
        };
        self.db.query_one(sql, &[])?.bool(0)
    }

    /// Fills the standing table from the statements (a database made before it existed).
    /// Runs in the transaction that made the schema.
    pub(super) fn fill_standing(&self) -> Result<(), DbError> {
        for (rack, host) in self.hosts_with_statements()? {
            let row = self.derive_standing(&rack, &host)?;
            self.put_standing(&rack, &host, &row)?;
        }
        Ok(())
    }

    /// The host's standing as kept (all zero for a host with no statement).
    pub fn standing_row(&self, rack: &str, host: &str) -> Result<StandingRow, DbError> {
        Ok(self
            .db
            .query_opt(
                "SELECT seqs_stored, top_seq, uncleared, first_uncleared_id FROM host_standing WHERE rack = ?1 AND host = ?2",
                vals![rack, host],
            )?
            .as_ref()
            .map(row_standing)
            .transpose()?
            .unwrap_or_default())
    }

    /// Every host's standing row, by rack and host.
    pub fn standing_rows(&self) -> Result<Vec<(String, String, StandingRow)>, DbError> {
        super::each(
            self.db.query(
                "SELECT seqs_stored, top_seq, uncleared, first_uncleared_id, rack, host FROM host_standing ORDER BY rack, host",
                &[],
            )?,
            |r| Ok((r.text(4)?, r.text(5)?, row_standing(r)?)),
        )
    }

    /// Every rack/host pair that has stored a statement.
    pub fn hosts_with_statements(&self) -> Result<Vec<(String, String)>, DbError> {
        super::each(
            self.db.query(
                "SELECT DISTINCT rack, host FROM statements ORDER BY rack, host",
                &[],
            )?,
            |r| Ok((r.text(0)?, r.text(1)?)),
        )
    }

    /// The host's standing read from its whole history (what `recheck` compares the kept
    /// row against).
    pub fn derive_standing(&self, rack: &str, host: &str) -> Result<StandingRow, DbError> {
        let r = self.db.query_one(
            "SELECT COUNT(DISTINCT seq), MAX(seq) FROM statements WHERE rack = ?1 AND host = ?2",
            vals![rack, host],
        )?;
        let (seqs_stored, top_seq) = (r.u64(0)?, r.opt_u64(1)?);
        let (uncleared, first_uncleared_id) = self.uncleared_after_last_clearance(rack, host)?;
        Ok(StandingRow {
            seqs_stored,
            top_seq,
            uncleared,
            first_uncleared_id,
        })
    }

    /// How many contraindicated statements the host stored after its last clearance, and
    /// the first of them.
    fn uncleared_after_last_clearance(
        &self,
        rack: &str,
        host: &str,
    ) -> Result<(u64, Option<i64>), DbError> {
        let r = self.db.query_one(
            "SELECT COUNT(*), MIN(id) FROM statements WHERE rack = ?1 AND host = ?2 AND status = 'contraindicated'
             AND id > COALESCE((SELECT up_to_id FROM clearances WHERE rack = ?1 AND host = ?2 ORDER BY id DESC LIMIT 1), 0)",
            vals![rack, host],
        )?;
        Ok((r.u64(0)?, r.opt_i64(1)?))
    }

    fn put_standing(&self, rack: &str, host: &str, row: &StandingRow) -> Result<(), DbError> {
        self.db.execute(
            "INSERT INTO host_standing (rack, host, seqs_stored, top_seq, uncleared, first_uncleared_id)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(rack, host) DO UPDATE SET seqs_stored = excluded.seqs_stored,
               top_seq = excluded.top_seq, uncleared = excluded.uncleared,
               first_uncleared_id = excluded.first_uncleared_id",
            vals![
                rack,
                host,
                row.seqs_stored,
                row.top_seq,
                row.uncleared,
                row.first_uncleared_id
            ],
        )?;
        Ok(())
    }

    /// Brings the host's row up to date with a statement just stored (row `id`), in the
    /// same transaction.
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
        // Written in the SQL both databases speak: no two-argument MAX (SQLite) or GREATEST
        // (PostgreSQL), and the kept row's columns named with their table.
        self.db.execute(
            "INSERT INTO host_standing (rack, host, seqs_stored, top_seq, uncleared, first_uncleared_id)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(rack, host) DO UPDATE SET
               seqs_stored = host_standing.seqs_stored + excluded.seqs_stored,
               top_seq = CASE WHEN host_standing.top_seq IS NULL OR excluded.top_seq > host_standing.top_seq
                         THEN excluded.top_seq ELSE host_standing.top_seq END,
               uncleared = host_standing.uncleared + excluded.uncleared,
               first_uncleared_id = COALESCE(host_standing.first_uncleared_id, excluded.first_uncleared_id)",
            vals![
                rack,
                host,
                i64::from(new_seq),
                seq,
                i64::from(contraindicated),
                contraindicated.then_some(id)
            ],
        )?;
        Ok(())
    }

    /// Brings the host's row up to date with a clearance just recorded.
    pub(super) fn note_cleared(&self, rack: &str, host: &str) -> Result<(), DbError> {
        let (uncleared, first_uncleared_id) = self.uncleared_after_last_clearance(rack, host)?;
        self.db.execute(
            "INSERT INTO host_standing (rack, host, seqs_stored, top_seq, uncleared, first_uncleared_id)
             VALUES (?1, ?2, 0, NULL, ?3, ?4)
             ON CONFLICT(rack, host) DO UPDATE SET
               uncleared = excluded.uncleared, first_uncleared_id = excluded.first_uncleared_id",
            vals![rack, host, uncleared, first_uncleared_id],
        )?;
        Ok(())
    }

    /// The seq and stored verdict of row `id`.
    pub fn seq_and_result(&self, id: i64) -> Result<Option<(u64, String)>, DbError> {
        self.db
            .query_opt(
                "SELECT seq, result FROM statements WHERE id = ?1",
                vals![id],
            )?
            .map(|r| Ok((r.u64(0)?, r.text(1)?)))
            .transpose()
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

    /// Statements with a gap and a fork, contraindicated ones before and after clearances (in
    /// a transaction of their own and inside one), then a restart.
    #[test]
    fn the_row_is_what_the_whole_history_gives_after_ingest_clearance_and_restart() {
        let db = crate::store::testing::database("standing_row").unwrap();
        let s = Store::connect(&db).unwrap();
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
        s.begin().unwrap();
        s.savepoint().unwrap();
        store_one(&s, "h2", 1, "contraindicated");
        s.rollback_to_savepoint().unwrap();
        s.commit().unwrap();
        assert_rows_derive(&s, "after a rollback");
        let before = s.standing_rows().unwrap();
        drop(s);
        let s = Store::connect(&db).unwrap();
        assert_eq!(s.standing_rows().unwrap(), before, "after a restart");
        assert_rows_derive(&s, "after a restart");
        drop(s);
        crate::store::testing::remove(&db);
    }

    /// A database made before host standings were kept has no table: it is made and filled
    /// from the statements and clearances when the store opens it.
    #[test]
    fn a_database_made_before_the_table_is_filled_on_open() {
        let db = crate::store::testing::database("standing_old").unwrap();
        let s = Store::connect(&db).unwrap();
        store_one(&s, "h1", 0, "contraindicated");
        store_one(&s, "h1", 2, "warning");
        store_one(&s, "h2", 0, "contraindicated");
        s.clear("r", "h2", "alice", "reviewed", 2_000).unwrap();
        store_one(&s, "h2", 1, "contraindicated");
        store_one(&s, "h3", 5, "affirming");
        let kept = s.standing_rows().unwrap();
        // What the schema was before: everything but the table.
        s.tamper("DROP TABLE host_standing", &[]).unwrap();
        drop(s);
        let s = Store::connect(&db).unwrap();
        assert_eq!(s.standing_rows().unwrap(), kept);
        assert_eq!(kept.len(), 3);
        assert_rows_derive(&s, "filled on open");
        drop(s);
        crate::store::testing::remove(&db);
    }
}
