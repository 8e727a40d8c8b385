//! The transparency log's rows (issue 24): one leaf per stored statement, and every complete
//! interior node, so that a proof or a tile is read, never recomputed from all leaves.
//!
//! - `tlog_leaves(idx, statement_id, data, hash)`: leaf `idx` (0, 1, 2, ... with no gaps),
//!   the statement it logs, its data (`rackwarden_attest::tlog::statement_leaf`) and
//!   `SHA-256(0x00 || data)`;
//! - `tlog_nodes(level, idx, hash)`: the complete subtree at `level >= 1`, `idx`, written
//!   with the leaf that completes it (about one row per leaf).
//!
//! Both are written in the statement's own transaction (its savepoint): a statement and its
//! leaf are kept together or not at all.

use rackwarden_attest::tlog::{self, Hash, HashReader, TlogError};
use rusqlite::{OptionalExtension, params};

use super::{DbError, Store};

pub(super) const TLOG_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tlog_leaves (
  idx INTEGER PRIMARY KEY, statement_id INTEGER NOT NULL, data BLOB NOT NULL,
  hash BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS tlog_leaves_by_statement ON tlog_leaves(statement_id);
CREATE TABLE IF NOT EXISTS tlog_nodes (
  level INTEGER NOT NULL, idx INTEGER NOT NULL, hash BLOB NOT NULL,
  PRIMARY KEY (level, idx));
";

fn read_err(e: DbError) -> TlogError {
    TlogError::Read(e.to_string())
}

fn as_hash(v: Vec<u8>, level: u32, index: u64) -> Result<Hash, TlogError> {
    v.try_into()
        .map_err(|_| TlogError::Read(format!("node {level}/{index} is not 32 bytes")))
}

impl Store {
    /// How many leaves the log has.
    pub fn tlog_size(&self) -> Result<u64, DbError> {
        Ok(self
            .conn
            .prepare_cached("SELECT COALESCE(MAX(idx) + 1, 0) FROM tlog_leaves")?
            .query_row([], |r| r.get::<_, i64>(0))? as u64)
    }

    /// Appends the leaf of statement `statement_id` with `data`, and the nodes it completes;
    /// returns its index. In the caller's transaction.
    pub fn tlog_append(&self, statement_id: i64, data: &[u8]) -> Result<u64, TlogAppendError> {
        let index = self.tlog_size()?;
        let leaf = tlog::leaf_hash(data);
        let nodes = tlog::completed_nodes(self, index, leaf)?;
        self.conn
            .prepare_cached(
                "INSERT INTO tlog_leaves (idx, statement_id, data, hash) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![index as i64, statement_id, data, leaf.as_slice()])?;
        let mut ins = self
            .conn
            .prepare_cached("INSERT INTO tlog_nodes (level, idx, hash) VALUES (?1, ?2, ?3)")?;
        for (level, idx, hash) in nodes {
            ins.execute(params![level, idx as i64, hash.as_slice()])?;
        }
        Ok(index)
    }

    /// The leaf index of a stored statement (`None`: stored before the log existed).
    pub fn tlog_index_of(&self, statement_id: i64) -> Result<Option<u64>, DbError> {
        Ok(self
            .conn
            .prepare_cached("SELECT idx FROM tlog_leaves WHERE statement_id = ?1")?
            .query_row(params![statement_id], |r| r.get::<_, i64>(0))
            .optional()?
            .map(|v| v as u64))
    }

    /// The data of leaves `start .. end`.
    pub fn tlog_entries(&self, start: u64, end: u64) -> Result<Vec<Vec<u8>>, DbError> {
        let mut st = self.conn.prepare_cached(
            "SELECT data FROM tlog_leaves WHERE idx >= ?1 AND idx < ?2 ORDER BY idx",
        )?;
        let rows = st.query_map(params![start as i64, end as i64], |r| r.get(0))?;
        rows.collect()
    }
}

impl HashReader for Store {
    fn node(&self, level: u32, index: u64) -> Result<Hash, TlogError> {
        let found: Option<Vec<u8>> = if level == 0 {
            self.conn
                .prepare_cached("SELECT hash FROM tlog_leaves WHERE idx = ?1")
                .map_err(read_err)?
                .query_row(params![index as i64], |r| r.get(0))
                .optional()
                .map_err(read_err)?
        } else {
            self.conn
                .prepare_cached("SELECT hash FROM tlog_nodes WHERE level = ?1 AND idx = ?2")
                .map_err(read_err)?
                .query_row(params![level, index as i64], |r| r.get(0))
                .optional()
                .map_err(read_err)?
        };
        match found {
            Some(v) => as_hash(v, level, index),
            None => Err(TlogError::MissingNode { level, index }),
        }
    }
}

/// Appending a leaf failed: the database, or a node the log should have is not there.
#[derive(Debug, thiserror::Error)]
pub enum TlogAppendError {
    #[error("database: {0}")]
    Db(#[from] DbError),
    #[error("log: {0}")]
    Log(#[from] TlogError),
}

#[cfg(test)]
mod tests {
    use rackwarden_attest::tlog::{MemoryTree, consistency_proof, inclusion_proof, tree_hash};

    use super::*;

    #[test]
    fn the_stored_log_answers_as_the_tree_of_its_leaves() {
        let store = Store::in_memory().unwrap();
        let mut mem = MemoryTree::new();
        let t0 = std::time::Instant::now();
        for i in 0..600u64 {
            let data = format!("leaf {i}").into_bytes();
            assert_eq!(store.tlog_append(i as i64 + 1, &data).unwrap(), i);
            mem.push(&data);
        }
        let appended = t0.elapsed();
        assert_eq!(store.tlog_size().unwrap(), 600);
        for n in [1u64, 255, 256, 257, 511, 512, 600] {
            assert_eq!(tree_hash(&store, n).unwrap(), tree_hash(&mem, n).unwrap());
            assert_eq!(
                inclusion_proof(&store, n - 1, n).unwrap(),
                inclusion_proof(&mem, n - 1, n).unwrap()
            );
            assert_eq!(
                consistency_proof(&store, n / 3, n).unwrap(),
                consistency_proof(&mem, n / 3, n).unwrap()
            );
        }
        // The level-8 nodes a level-1 tile serves.
        for i in 0..2 {
            assert_eq!(store.node(8, i).unwrap(), mem.node(8, i).unwrap());
        }
        assert!(matches!(
            store.node(8, 2),
            Err(TlogError::MissingNode { level: 8, index: 2 })
        ));
        assert_eq!(store.tlog_index_of(5).unwrap(), Some(4));
        assert_eq!(store.tlog_index_of(9999).unwrap(), None);
        assert_eq!(
            store.tlog_entries(598, 700).unwrap(),
            vec![b"leaf 598".to_vec(), b"leaf 599".to_vec()]
        );
        println!("600 leaves appended in {appended:?}");
    }
}
