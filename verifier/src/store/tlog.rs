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

use std::collections::HashMap;

use super::{
    DbError, Store,
    db::{Value, vals},
    each,
};

/// What the open write transaction appended to the log: its size now and the hashes it
/// wrote. Valid only inside that transaction (it holds the write lock, so nobody else
/// appends); forgotten at every transaction boundary and savepoint rollback.
#[derive(Debug, Default)]
pub(super) struct Appended {
    size: u64,
    nodes: HashMap<(u32, u64), Hash>,
}

pub(super) const TLOG_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tlog_leaves (
  idx INTEGER PRIMARY KEY, statement_id INTEGER NOT NULL, data BLOB NOT NULL,
  hash BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS tlog_leaves_by_statement ON tlog_leaves(statement_id);
-- The verifier key (C2SP vkey: origin and public key) the log is signed with: every instance
-- on the database must sign with it.
CREATE TABLE IF NOT EXISTS tlog_key (id INTEGER PRIMARY KEY, vkey TEXT NOT NULL);
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
    /// Records `vkey` as the key the log is signed with, unless one is recorded already;
    /// the one recorded, when it is another (an instance with another key, or another
    /// origin, would sign checkpoints of the same log that hosts cannot check).
    pub fn claim_log_key(&self, vkey: &str) -> Result<Option<String>, DbError> {
        self.db.execute(
            "INSERT INTO tlog_key (id, vkey) VALUES (1, ?1) ON CONFLICT(id) DO NOTHING",
            vals![vkey],
        )?;
        let recorded = self
            .db
            .query_one("SELECT vkey FROM tlog_key WHERE id = 1", &[])?
            .text(0)?;
        Ok((recorded != vkey).then_some(recorded))
    }

    /// How many leaves the log has.
    pub fn tlog_size(&self) -> Result<u64, DbError> {
        if let Some(a) = self.appended.borrow().as_ref() {
            return Ok(a.size);
        }
        self.db
            .query_one("SELECT COALESCE(MAX(idx) + 1, 0) FROM tlog_leaves", &[])?
            .u64(0)
    }

    /// Appends the leaf of statement `statement_id` with `data`, and the nodes it completes;
    /// returns its index. In the caller's write transaction, which remembers the log's size
    /// and the hashes it wrote (see [`Appended`]): the next append and the batch's proofs
    /// read them from memory.
    pub fn tlog_append(&self, statement_id: i64, data: &[u8]) -> Result<u64, TlogAppendError> {
        let index = self.tlog_size()?;
        let leaf = tlog::leaf_hash(data);
        let nodes = tlog::completed_nodes(self, index, leaf)?;
        let leaf_params = vals![index, statement_id, data, leaf.as_slice()];
        let node_params: Vec<Vec<Value>> = nodes
            .iter()
            .map(|(level, idx, hash)| vals![*level, *idx, hash.as_slice()].to_vec())
            .collect();
        let mut writes: Vec<(&str, &[Value])> = vec![(
            "INSERT INTO tlog_leaves (idx, statement_id, data, hash) VALUES (?1, ?2, ?3, ?4)",
            leaf_params,
        )];
        writes.extend(node_params.iter().map(|p| {
            (
                "INSERT INTO tlog_nodes (level, idx, hash) VALUES (?1, ?2, ?3)",
                p.as_slice(),
            )
        }));
        self.db.query_many(&writes)?;
        if self.db.in_transaction() {
            let mut appended = self.appended.borrow_mut();
            let a = appended.get_or_insert_with(Appended::default);
            a.size = index + 1;
            a.nodes.insert((0, index), leaf);
            for (level, idx, hash) in nodes {
                a.nodes.insert((level, idx), hash);
            }
        }
        Ok(index)
    }

    /// The leaf index of a stored statement (`None`: stored before the log existed).
    pub fn tlog_index_of(&self, statement_id: i64) -> Result<Option<u64>, DbError> {
        self.db
            .query_opt(
                "SELECT idx FROM tlog_leaves WHERE statement_id = ?1",
                vals![statement_id],
            )?
            .map(|r| r.u64(0))
            .transpose()
    }

    /// The data of leaves `start .. end`.
    pub fn tlog_entries(&self, start: u64, end: u64) -> Result<Vec<Vec<u8>>, DbError> {
        each(
            self.db.query(
                "SELECT data FROM tlog_leaves WHERE idx >= ?1 AND idx < ?2 ORDER BY idx",
                vals![start, end],
            )?,
            |r| r.bytes(0),
        )
    }
}

impl HashReader for Store {
    fn node(&self, level: u32, index: u64) -> Result<Hash, TlogError> {
        if let Some(h) = self
            .appended
            .borrow()
            .as_ref()
            .and_then(|a| a.nodes.get(&(level, index)))
        {
            return Ok(*h);
        }
        let row = if level == 0 {
            self.db
                .query_opt("SELECT hash FROM tlog_leaves WHERE idx = ?1", vals![index])
        } else {
            self.db.query_opt(
                "SELECT hash FROM tlog_nodes WHERE level = ?1 AND idx = ?2",
                vals![level, index],
            )
        };
        let found = row
            .and_then(|r| r.map(|r| r.bytes(0)).transpose())
            .map_err(read_err)?;
        match found {
            Some(v) => as_hash(v, level, index),
            None => Err(TlogError::MissingNode { level, index }),
        }
    }
}

impl Store {
    /// The log against the statements it logs, for `recheck`: every leaf's hash is its
    /// data's, its data is its statement's (rack, host, seq, envelope digest as stored now),
    /// indexes run without gaps, every complete node is the hash of its children, and every
    /// statement stored since the log began has a leaf. Each difference in a sentence.
    pub fn tlog_audit(&self) -> Result<Vec<String>, DbError> {
        let mut out = Vec::new();
        type LeafRow = (
            i64,
            i64,
            Vec<u8>,
            Vec<u8>,
            Option<String>,
            Option<String>,
            Option<i64>,
            Option<String>,
        );
        let rows: Vec<LeafRow> = each(
            self.db.query(
                "SELECT l.idx, l.statement_id, l.data, l.hash, s.rack, s.host, s.seq, s.envelope
                 FROM tlog_leaves l LEFT JOIN statements s ON s.id = l.statement_id ORDER BY l.idx",
                &[],
            )?,
            |r| {
                Ok((
                    r.i64(0)?,
                    r.i64(1)?,
                    r.bytes(2)?,
                    r.bytes(3)?,
                    r.opt_text(4)?,
                    r.opt_text(5)?,
                    r.opt_i64(6)?,
                    r.opt_text(7)?,
                ))
            },
        )?;
        let mut tree = tlog::MemoryTree::new();
        let mut first_statement = None;
        for (expect, (idx, sid, data, hash, rack, host, seq, envelope)) in rows.iter().enumerate() {
            if *idx != expect as i64 {
                out.push(format!(
                    "leaf {idx} is where leaf {expect} should be: the log has a gap"
                ));
            }
            first_statement.get_or_insert(*sid);
            let leaf = tlog::leaf_hash(data);
            if hash.as_slice() != leaf.as_slice() {
                out.push(format!("leaf {idx}: its stored hash is not its data's"));
            }
            match (rack, host, seq, envelope) {
                (Some(rack), Some(host), Some(seq), Some(envelope)) => {
                    if tlog::statement_leaf(rack, host, *seq as u64, envelope.as_bytes()).as_deref()
                        != Some(data.as_slice())
                    {
                        out.push(format!(
                            "leaf {idx}: statement {rack}/{host} seq {seq} (row {sid}) is not what was logged: it was rewritten"
                        ));
                    }
                }
                _ => out.push(format!(
                    "leaf {idx}: its statement (row {sid}) is gone: it was removed"
                )),
            }
            tree.push_hash(leaf);
        }
        let nodes: Vec<(u32, i64, Vec<u8>)> = each(
            self.db.query(
                "SELECT level, idx, hash FROM tlog_nodes ORDER BY level, idx",
                &[],
            )?,
            |r| Ok((r.u64(0)? as u32, r.i64(1)?, r.bytes(2)?)),
        )?;
        let mut stored_nodes = 0u64;
        for (level, idx, hash) in &nodes {
            stored_nodes += 1;
            match tlog::HashReader::node(&tree, *level, *idx as u64) {
                Ok(h) if h.as_slice() == hash.as_slice() => {}
                Ok(_) => out.push(format!(
                    "node {level}/{idx} is not the hash of the leaves below it"
                )),
                Err(_) => out.push(format!("node {level}/{idx} is above no leaves of the log")),
            }
        }
        // Each leaf completes as many nodes as its index + 1 has trailing zeros.
        let want: u64 = (1..=tree.size())
            .map(|n| u64::from(n.trailing_zeros()))
            .sum();
        if stored_nodes != want {
            out.push(format!(
                "the log of {} leaves has {stored_nodes} complete nodes stored, not {want}",
                tree.size()
            ));
        }
        if let Some(first) = first_statement {
            let unlogged: Vec<(i64, String, String, i64)> = each(
                self.db.query(
                    "SELECT s.id, s.rack, s.host, s.seq FROM statements s
                     LEFT JOIN tlog_leaves l ON l.statement_id = s.id
                     WHERE s.id >= ?1 AND l.idx IS NULL ORDER BY s.id",
                    vals![first],
                )?,
                |r| Ok((r.i64(0)?, r.text(1)?, r.text(2)?, r.i64(3)?)),
            )?;
            for (id, rack, host, seq) in unlogged {
                out.push(format!(
                    "statement {rack}/{host} seq {seq} (row {id}) was stored after the log began and has no leaf"
                ));
            }
        }
        Ok(out)
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
        let store = crate::store::testing::store("tlog_tree").unwrap();
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

    /// A store with `n` statements of host `h`, each logged.
    /// Inside a write transaction the log's size and new hashes come from memory; an item
    /// rolled back to its savepoint takes its leaves out of that memory too, and what was
    /// committed reads back from the database as the same tree.
    #[test]
    fn appends_in_a_transaction_agree_with_the_tree_after_a_rolled_back_item() {
        let store = crate::store::testing::store("tlog_txn").unwrap();
        let mut mem = MemoryTree::new();
        store.begin().unwrap();
        for i in 0..40u64 {
            let data = format!("leaf {i}").into_bytes();
            store.savepoint().unwrap();
            store.tlog_append(i as i64 + 1, &data).unwrap();
            if i % 7 == 3 {
                store.rollback_to_savepoint().unwrap();
            } else {
                store.release_savepoint().unwrap();
                mem.push(&data);
            }
            assert_eq!(store.tlog_size().unwrap(), mem.size(), "after leaf {i}");
            let n = mem.size();
            if n > 0 {
                assert_eq!(tree_hash(&store, n).unwrap(), tree_hash(&mem, n).unwrap());
                assert_eq!(
                    inclusion_proof(&store, n - 1, n).unwrap(),
                    inclusion_proof(&mem, n - 1, n).unwrap()
                );
            }
        }
        store.commit().unwrap();
        let n = mem.size();
        assert_eq!(store.tlog_size().unwrap(), n);
        assert_eq!(tree_hash(&store, n).unwrap(), tree_hash(&mem, n).unwrap());
        assert_eq!(
            consistency_proof(&store, 5, n).unwrap(),
            consistency_proof(&mem, 5, n).unwrap()
        );
    }

    fn logged(n: u64) -> Store {
        let store = crate::store::testing::store("tlog_audit").unwrap();
        for seq in 0..n {
            let envelope = format!("{{\"seq\":{seq}}}");
            let id = store
                .insert_statement(&crate::store::StoredStatement {
                    id: 0,
                    rack: "r".into(),
                    host: "h".into(),
                    seq,
                    pae_sha3: format!("pae-{seq}"),
                    envelope: envelope.clone(),
                    received_ms: 1_000 + seq,
                    epoch_end_ms: 1_000 + seq,
                    status: "affirming".into(),
                    result: "{}".into(),
                    wipe_ms: None,
                })
                .unwrap();
            let data = tlog::statement_leaf("r", "h", seq, envelope.as_bytes()).unwrap();
            store.tlog_append(id, &data).unwrap();
        }
        store
    }

    #[test]
    fn the_audit_finds_statements_removed_or_rewritten_behind_the_log() {
        assert_eq!(logged(9).tlog_audit().unwrap(), Vec::<String>::new());
        let s = logged(9);
        s.tamper(
            "UPDATE statements SET envelope = '{\"seq\":99}' WHERE seq = 3",
            &[],
        )
        .unwrap();
        s.tamper("DELETE FROM statements WHERE seq = 5", &[])
            .unwrap();
        let found = s.tlog_audit().unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].contains("r/h seq 3 (row 4) is not what was logged"),
            "{found:?}"
        );
        assert!(
            found[1].contains("leaf 5: its statement (row 6) is gone"),
            "{found:?}"
        );
        // A node edited, a leaf edited with its hash, a statement stored without a leaf.
        let s = logged(9);
        s.tamper(
            "UPDATE tlog_nodes SET hash = ?1 WHERE level = 2 AND idx = 1",
            vals![&[0u8; 32][..]],
        )
        .unwrap();
        s.tamper(
            "UPDATE tlog_leaves SET data = ?1, hash = ?1 WHERE idx = 0",
            vals![&[0u8][..]],
        )
        .unwrap();
        s.insert_statement(&crate::store::StoredStatement {
            id: 0,
            rack: "r".into(),
            host: "h".into(),
            seq: 9,
            pae_sha3: "pae-9".into(),
            envelope: "{}".into(),
            received_ms: 2_000,
            epoch_end_ms: 2_000,
            status: "affirming".into(),
            result: "{}".into(),
            wipe_ms: None,
        })
        .unwrap();
        let found = s.tlog_audit().unwrap().join("\n");
        assert!(
            found.contains("leaf 0: its stored hash is not its data's"),
            "{found}"
        );
        assert!(
            found.contains("seq 0 (row 1) is not what was logged"),
            "{found}"
        );
        assert!(found.contains("node 2/1 is not the hash"), "{found}");
        assert!(found.contains("node 1/0 is not the hash"), "{found}");
        assert!(
            found.contains("seq 9 (row 10) was stored after the log began and has no leaf"),
            "{found}"
        );
    }
}
