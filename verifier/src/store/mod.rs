//! The verifier's storage: SQLite (the embedded default) or PostgreSQL (several instances
//! on one server), through one interface (`db.rs`). Statements are kept verbatim (the
//! envelope exactly as received), so every verdict can be re-derived (`rackwarden-verifier
//! recheck`). Commits are durable before a response is sent: an acknowledged statement is
//! never lost.

use std::path::Path;

use rackwarden_attest::{dsse::Envelope, result::AttestationResult, statement::Statement};

pub mod db;
mod judging;
mod replay;
mod standing;
pub mod testing;
mod tlog;
mod tpm;
mod traffic;
pub use db::{DatabaseUrl, DbError, Dialect};
use db::{Db, Row, vals};
pub use judging::{JudgingQuery, JudgingRows};
pub use replay::{PendingReplay, RecordReplay, ReplayRow};
pub use standing::StandingRow;
pub use tlog::TlogAppendError;
pub use tpm::{TpmBoot, TpmChallengeRow, TpmEnrollment, TpmPosition};
pub use traffic::{OpeningsRow, SampleAndAnswer, SampleRow};

/// The database. Its connection is the store's alone: callers ask for rows and
/// transactions by name, never for SQL.
pub struct Store {
    db: Db,
    /// The open transaction was opened by [`Store::savepoint`], and ends with its item.
    savepoint_began: std::cell::Cell<bool>,
    /// The log as the open write transaction has appended to it (`None`: read it from the
    /// database).
    appended: std::cell::RefCell<Option<tlog::Appended>>,
}

#[derive(Debug, Clone)]
pub struct HostKey {
    pub rack: String,
    pub host: String,
    pub keyid: String,
    pub pubkey_pem: String,
    pub enrolled_ms: u64,
    pub retired_ms: Option<u64>,
    /// A key the host rotated to speaks from this seq on (`None`: a key enrolled by an
    /// operator, from the host's first statement).
    pub from_seq: Option<u64>,
    /// A key the host rotated away from speaks up to this seq (the statement that named
    /// its successor) and no further (`None`: not rotated away; an operator's retirement is
    /// by time, `retired_ms`).
    pub retired_after_seq: Option<u64>,
}

/// A challenge nonce as issued.
#[derive(Debug, Clone)]
pub struct NonceRecord {
    pub nonce: String,
    pub rack: String,
    pub host: String,
    pub issued_ms: u64,
    pub expires_ms: u64,
    pub used_ms: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct StoredStatement {
    pub id: i64,
    pub rack: String,
    pub host: String,
    pub seq: u64,
    pub pae_sha3: String,
    pub envelope: String,
    pub received_ms: u64,
    pub epoch_end_ms: u64,
    pub status: String,
    pub result: String,
    /// Epoch end of a statement that carried a complete wipe.
    pub wipe_ms: Option<u64>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS host_keys (
  id INTEGER PRIMARY KEY, rack TEXT NOT NULL, host TEXT NOT NULL, keyid TEXT NOT NULL UNIQUE,
  pubkey_pem TEXT NOT NULL, enrolled_ms INTEGER NOT NULL, retired_ms INTEGER,
  from_seq INTEGER, retired_after_seq INTEGER);
CREATE TABLE IF NOT EXISTS nonces (
  nonce TEXT PRIMARY KEY, rack TEXT NOT NULL, host TEXT NOT NULL,
  issued_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL, used_ms INTEGER,
  presented_ms INTEGER);
CREATE TABLE IF NOT EXISTS statements (
  id INTEGER PRIMARY KEY, rack TEXT NOT NULL, host TEXT NOT NULL, seq INTEGER NOT NULL,
  pae_sha3 TEXT NOT NULL, envelope TEXT NOT NULL, received_ms INTEGER NOT NULL,
  epoch_end_ms INTEGER NOT NULL, status TEXT NOT NULL, result TEXT NOT NULL,
  wipe_ms INTEGER,
  UNIQUE(rack, host, pae_sha3));
CREATE INDEX IF NOT EXISTS statements_by_seq ON statements(rack, host, seq);
-- A host's standing and its page ask for its uncleared contraindicated statements and its
-- last counted wipe at every look: without these, each reads every row the host has.
CREATE INDEX IF NOT EXISTS statements_contraindicated ON statements(rack, host, id)
  WHERE status = 'contraindicated';
CREATE INDEX IF NOT EXISTS statements_by_wipe ON statements(rack, host, wipe_ms);
CREATE TABLE IF NOT EXISTS clearances (
  id INTEGER PRIMARY KEY, rack TEXT NOT NULL, host TEXT NOT NULL,
  up_to_id INTEGER NOT NULL, cleared_ms INTEGER NOT NULL, reason TEXT NOT NULL,
  cleared_by TEXT);
-- TPM (issue 22): the AK a host proved lives beside a certified EK, the credential
-- challenges outstanding, and how far each host's IMA list has been replayed.
CREATE TABLE IF NOT EXISTS tpm_enrollments (
  rack TEXT NOT NULL, host TEXT NOT NULL, ak_public TEXT NOT NULL, ak_name TEXT NOT NULL,
  ek_public TEXT NOT NULL, ek_certificate TEXT, ek_issuer TEXT NOT NULL,
  enrolled_ms INTEGER NOT NULL, PRIMARY KEY (rack, host));
-- Every enrolment, in order (tpm_enrollments keeps only the current AK): recheck replays
-- them at the times they happened, so a verdict made under an earlier AK re-derives.
CREATE TABLE IF NOT EXISTS tpm_enrollment_history (
  rack TEXT NOT NULL, host TEXT NOT NULL, ak_public TEXT NOT NULL, ak_name TEXT NOT NULL,
  ek_public TEXT NOT NULL, ek_certificate TEXT, ek_issuer TEXT NOT NULL,
  enrolled_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS tpm_challenges (
  id TEXT PRIMARY KEY, rack TEXT NOT NULL, host TEXT NOT NULL, secret_sha3 TEXT NOT NULL,
  ak_public TEXT NOT NULL, ak_name TEXT NOT NULL, ek_public TEXT NOT NULL,
  ek_certificate TEXT, ek_issuer TEXT NOT NULL, expires_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS tpm_positions (
  rack TEXT NOT NULL, host TEXT NOT NULL, reset_count INTEGER NOT NULL,
  ima_count INTEGER NOT NULL, pcr10 TEXT NOT NULL, seq INTEGER NOT NULL,
  PRIMARY KEY (rack, host));
-- Measured boot (issue 41): each host's boot whose event log replayed to its quoted PCRs
-- 0-9, and what that log measured (JSON): later statements of the same boot are judged by it.
CREATE TABLE IF NOT EXISTS tpm_boots (
  rack TEXT NOT NULL, host TEXT NOT NULL, reset_count INTEGER NOT NULL,
  pcrs TEXT NOT NULL, measured TEXT NOT NULL, seq INTEGER NOT NULL,
  PRIMARY KEY (rack, host));
";

impl StoredStatement {
    /// The verdict stored with the statement (`None` for a row whose result does not read
    /// back as one).
    pub fn result(&self) -> Option<AttestationResult> {
        serde_json::from_str(&self.result).ok()
    }

    /// The statement inside the stored envelope (verified when it was accepted).
    pub fn statement(&self) -> Option<Statement> {
        let env: Envelope = serde_json::from_str(&self.envelope).ok()?;
        use base64::Engine as _;
        let payload = base64::engine::general_purpose::STANDARD
            .decode(env.payload)
            .ok()?;
        serde_json::from_slice(&payload).ok()
    }
}

/// An operator's clearing of a host's contraindicated statements (local CLI only), kept.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Clearance {
    pub rack: String,
    pub host: String,
    /// Statements stored up to this row id are cleared.
    pub up_to_id: i64,
    pub cleared_ms: u64,
    pub reason: String,
    /// Who cleared it (`None`: a clearance recorded before names were kept).
    pub by: Option<String>,
    /// The contraindicated statements this clearance covered that no earlier one did: they
    /// stay visible as cleared.
    pub cleared: Vec<ClearedStatement>,
}

/// A contraindicated statement a clearance covered, with the codes that made it so.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ClearedStatement {
    pub seq: u64,
    pub codes: Vec<rackwarden_attest::result::FindingCode>,
}

impl ClearedStatement {
    /// `result`: the stored verdict's JSON (no codes when it does not read back).
    fn of(seq: u64, result: &str) -> ClearedStatement {
        ClearedStatement {
            seq,
            codes: serde_json::from_str::<AttestationResult>(result)
                .ok()
                .map(|r| {
                    r.findings
                        .into_iter()
                        .filter(|f| {
                            f.severity == rackwarden_attest::result::Status::Contraindicated
                        })
                        .map(|f| f.code)
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

fn row_statement(r: &Row) -> Result<StoredStatement, DbError> {
    Ok(StoredStatement {
        id: r.i64(0)?,
        rack: r.text(1)?,
        host: r.text(2)?,
        seq: r.u64(3)?,
        pae_sha3: r.text(4)?,
        envelope: r.text(5)?,
        received_ms: r.u64(6)?,
        epoch_end_ms: r.u64(7)?,
        status: r.text(8)?,
        result: r.text(9)?,
        wipe_ms: r.opt_u64(10)?,
    })
}
fn row_nonce(r: &Row) -> Result<NonceRecord, DbError> {
    Ok(NonceRecord {
        nonce: r.text(0)?,
        rack: r.text(1)?,
        host: r.text(2)?,
        issued_ms: r.u64(3)?,
        expires_ms: r.u64(4)?,
        used_ms: r.opt_u64(5)?,
    })
}

/// A rotation a host announced (see [`Store::rotate_key`]).
pub struct Rotation<'a> {
    pub rack: &'a str,
    pub host: &'a str,
    pub old_keyid: &'a str,
    /// The seq of the statement that named the new key.
    pub seq: u64,
    pub new_keyid: &'a str,
    pub new_pem: &'a str,
}

const KEY_COLS: &str =
    "rack, host, keyid, pubkey_pem, enrolled_ms, retired_ms, from_seq, retired_after_seq";

fn row_key(r: &Row) -> Result<HostKey, DbError> {
    Ok(HostKey {
        rack: r.text(0)?,
        host: r.text(1)?,
        keyid: r.text(2)?,
        pubkey_pem: r.text(3)?,
        enrolled_ms: r.u64(4)?,
        retired_ms: r.opt_u64(5)?,
        from_seq: r.opt_u64(6)?,
        retired_after_seq: r.opt_u64(7)?,
    })
}

/// Each row read as `f` makes it.
fn each<T>(rows: Vec<Row>, f: impl Fn(&Row) -> Result<T, DbError>) -> Result<Vec<T>, DbError> {
    rows.iter().map(f).collect()
}

/// How long a write waits for another instance's transaction on the same database.
pub const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

const STATEMENT_COLS: &str =
    "id, rack, host, seq, pae_sha3, envelope, received_ms, epoch_end_ms, status, result, wipe_ms";

/// The queries [`Store::judging_rows`] asks together and the store's methods ask alone.
fn by_seq_sql() -> String {
    format!(
        "SELECT {STATEMENT_COLS} FROM statements WHERE rack = ?1 AND host = ?2 AND seq = ?3 ORDER BY id"
    )
}

fn key_sql() -> String {
    format!("SELECT {KEY_COLS} FROM host_keys WHERE keyid = ?1")
}

const NONCE_SQL: &str =
    "SELECT nonce, rack, host, issued_ms, expires_ms, used_ms FROM nonces WHERE nonce = ?1";

impl Store {
    /// Opens (and makes, or brings up to date) the database `url` names.
    pub fn connect(url: &DatabaseUrl) -> Result<Store, DbError> {
        match url {
            DatabaseUrl::Sqlite(path) => Self::open(path),
            DatabaseUrl::Postgres(url) => Self::init(Db::open_postgres(url)?),
        }
    }

    pub fn open(path: &Path) -> Result<Store, DbError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            let _ = std::fs::create_dir_all(dir);
        }
        Self::init(Db::open_sqlite(path)?)
    }

    /// A private SQLite database in memory (recheck's fresh store, tests).
    pub fn in_memory() -> Result<Store, DbError> {
        Self::init(Db::sqlite_in_memory()?)
    }

    fn init(db: Db) -> Result<Store, DbError> {
        if let Some(conn) = db.sqlite() {
            // Several verifier instances may serve from one database file: a writer waits
            // for another's transaction (`BEGIN IMMEDIATE` serialises whole ingest batches,
            // so one host's statements are appraised in chain order whichever instance gets
            // them) instead of failing at once with SQLITE_BUSY.
            conn.busy_timeout(BUSY_TIMEOUT)?;
            use_wal(conn)?;
            conn.pragma_update(None, "synchronous", "FULL")?;
        }
        let store = Store {
            db,
            savepoint_began: std::cell::Cell::new(false),
            appended: std::cell::RefCell::new(None),
        };
        // Under the write lock: two instances starting on one database (an old one, or an
        // empty one) make the schema and fill new tables once, not twice.
        store.under_write_lock(|| store.make_schema())?;
        Ok(store)
    }

    fn make_schema(&self) -> Result<(), DbError> {
        // Asked before the schema creates it: a database made before host standings were
        // kept has statements the new table must be filled from.
        let had_standing = self.has_standing_table()?;
        let schema = [
            SCHEMA,
            standing::STANDING_SCHEMA,
            tlog::TLOG_SCHEMA,
            traffic::TRAFFIC_SCHEMA,
            replay::REPLAY_SCHEMA,
        ]
        .concat();
        match self.db.dialect() {
            Dialect::Sqlite => self.db.batch(&schema)?,
            Dialect::Postgres => self.db.batch(&db::pg_schema(&schema))?,
        }
        if let Some(conn) = self.db.sqlite() {
            migrate_old_sqlite(conn)?;
        }
        if !had_standing {
            self.fill_standing()?;
        }
        Ok(())
    }

    /// Opens the transaction a batch of statements is stored in (taking the write lock now,
    /// so that no item waits for it halfway).
    pub fn begin(&self) -> Result<(), DbError> {
        self.appended.take();
        self.db.begin_write()
    }

    /// Commits the open transaction durably.
    pub fn commit(&self) -> Result<(), DbError> {
        self.appended.take();
        self.db.commit()
    }

    /// Rolls the open transaction back (best effort: a failed rollback leaves the database
    /// to roll back when the connection next writes, or closes).
    pub fn rollback(&self) {
        self.appended.take();
        let _ = self.db.rollback();
    }

    /// Marks where one item of a batch starts. Inside the open transaction ([`Store::begin`])
    /// it is a savepoint; outside one it opens a write transaction of its own that
    /// [`Store::release_savepoint`] commits (SQLite's rule for an outermost savepoint, kept on
    /// PostgreSQL, which has no savepoint outside a transaction).
    pub fn savepoint(&self) -> Result<(), DbError> {
        if self.db.in_transaction() {
            // Kept across the savepoint: a rollback to it forgets (below).
            self.db.batch("SAVEPOINT item")
        } else {
            self.appended.take();
            self.db.begin_write()?;
            self.savepoint_began.set(true);
            Ok(())
        }
    }

    /// Keeps what the item wrote since [`Store::savepoint`] (committed, where the savepoint
    /// opened the transaction).
    pub fn release_savepoint(&self) -> Result<(), DbError> {
        if self.savepoint_began.replace(false) {
            self.appended.take();
            // A commit that failed may leave the transaction open (SQLite, on some errors):
            // it is rolled back, so no later item mistakes it for a batch's.
            self.db.commit().inspect_err(|_| {
                let _ = self.db.rollback();
            })
        } else {
            self.db.batch("RELEASE item")
        }
    }

    /// Undoes everything the item wrote since [`Store::savepoint`].
    pub fn rollback_to_savepoint(&self) -> Result<(), DbError> {
        // What the item appended is undone: so is its memory of it.
        self.appended.take();
        if self.savepoint_began.replace(false) {
            self.db.rollback()
        } else {
            self.db.rollback_to("item")
        }
    }

    /// Copies a key row as it is (recheck's fresh store takes the keys of the real one).
    pub fn insert_host_key(&self, k: &HostKey) -> Result<(), DbError> {
        self.db.execute(
            "INSERT INTO host_keys (rack, host, keyid, pubkey_pem, enrolled_ms, retired_ms, from_seq, retired_after_seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            vals![
                &k.rack,
                &k.host,
                &k.keyid,
                &k.pubkey_pem,
                k.enrolled_ms,
                k.retired_ms,
                k.from_seq,
                k.retired_after_seq
            ],
        )?;
        Ok(())
    }

    /// Enrolls `pubkey_pem` for rack/host; an earlier key of the same host is retired, not
    /// deleted (key rotation keeps history).
    pub fn enroll(
        &mut self,
        rack: &str,
        host: &str,
        keyid: &str,
        pubkey_pem: &str,
        now_ms: u64,
    ) -> Result<(), DbError> {
        self.under_write_lock(|| {
            self.db.execute(
                "UPDATE host_keys SET retired_ms = ?1 WHERE rack = ?2 AND host = ?3 AND retired_ms IS NULL AND keyid != ?4",
                vals![now_ms, rack, host, keyid],
            )?;
            self.db.execute(
                "INSERT INTO host_keys (rack, host, keyid, pubkey_pem, enrolled_ms) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(keyid) DO NOTHING",
                vals![rack, host, keyid, pubkey_pem, now_ms],
            )?;
            Ok(())
        })
    }

    /// A host's rotation, accepted with the statement at `seq` signed by `old_keyid` that
    /// named `new_keyid`: the old key is retired after `seq`, the new one speaks from
    /// `seq + 1`. Runs in the ingest transaction (the statement and the rotation are kept
    /// together or not at all).
    pub fn rotate_key(&self, r: &Rotation<'_>, now_ms: u64) -> Result<(), DbError> {
        self.db.execute(
            "UPDATE host_keys SET retired_ms = ?1, retired_after_seq = ?2 WHERE keyid = ?3 AND retired_ms IS NULL",
            vals![now_ms, r.seq, r.old_keyid],
        )?;
        self.db.execute(
            "INSERT INTO host_keys (rack, host, keyid, pubkey_pem, enrolled_ms, from_seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            vals![r.rack, r.host, r.new_keyid, r.new_pem, now_ms, r.seq + 1],
        )?;
        Ok(())
    }

    /// When the host's first key was enrolled: where its wipe and silence clocks start
    /// before it has a statement, across the keys it rotated through.
    pub fn host_first_enrolled_ms(&self, rack: &str, host: &str) -> Result<Option<u64>, DbError> {
        self.db
            .query_one(
                "SELECT MIN(enrolled_ms) FROM host_keys WHERE rack = ?1 AND host = ?2",
                vals![rack, host],
            )?
            .opt_u64(0)
    }

    /// The key row of `keyid`, if it is enrolled (or was).
    pub fn host_key(&self, keyid: &str) -> Result<Option<HostKey>, DbError> {
        self.db
            .query_opt(&key_sql(), vals![keyid])?
            .as_ref()
            .map(row_key)
            .transpose()
    }

    /// Retires `keyid` now. Under the write lock: a statement another instance is judging
    /// against the key is stored before the retirement or judged after it, never between.
    pub fn retire(&self, keyid: &str, now_ms: u64) -> Result<(), DbError> {
        self.under_write_lock(|| {
            self.db.execute(
                "UPDATE host_keys SET retired_ms = ?1 WHERE keyid = ?2 AND retired_ms IS NULL",
                vals![now_ms, keyid],
            )
        })?;
        Ok(())
    }

    /// Runs `f` holding the write lock: in the open transaction, or in one of its own,
    /// committed if `f` succeeds and rolled back otherwise.
    pub(crate) fn under_write_lock<T>(
        &self,
        f: impl FnOnce() -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        if self.db.in_transaction() {
            return f();
        }
        self.db.begin_write()?;
        // A failed commit is rolled back too: SQLite may leave its transaction open.
        let done = f().and_then(|t| self.db.commit().map(|()| t));
        if done.is_err() {
            let _ = self.db.rollback();
        }
        done
    }

    pub fn host_keys(&self) -> Result<Vec<HostKey>, DbError> {
        each(
            self.db.query(
                &format!("SELECT {KEY_COLS} FROM host_keys ORDER BY id"),
                &[],
            )?,
            row_key,
        )
    }

    pub fn insert_nonce(
        &self,
        nonce: &str,
        rack: &str,
        host: &str,
        issued_ms: u64,
        expires_ms: u64,
    ) -> Result<(), DbError> {
        self.db.execute(
            "INSERT INTO nonces (nonce, rack, host, issued_ms, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
            vals![nonce, rack, host, issued_ms, expires_ms],
        )?;
        Ok(())
    }

    pub fn nonce(&self, nonce: &str) -> Result<Option<NonceRecord>, DbError> {
        self.db
            .query_opt(NONCE_SQL, vals![nonce])?
            .as_ref()
            .map(row_nonce)
            .transpose()
    }

    /// A statement named this nonce (whatever came of it): from now on the row is evidence
    /// and is never pruned, so `recheck` judges that statement the same way again.
    pub fn present_nonce(&self, nonce: &str, now_ms: u64) -> Result<(), DbError> {
        self.db.execute(
            "UPDATE nonces SET presented_ms = COALESCE(presented_ms, ?1) WHERE nonce = ?2",
            vals![now_ms, nonce],
        )?;
        Ok(())
    }

    /// Nonces issued to the host that no statement has named and that have not expired.
    pub fn outstanding_nonces(&self, rack: &str, host: &str, now_ms: u64) -> Result<u64, DbError> {
        self.db
            .query_one(
                "SELECT COUNT(*) FROM nonces WHERE rack = ?1 AND host = ?2 AND used_ms IS NULL AND presented_ms IS NULL AND expires_ms >= ?3",
                vals![rack, host, now_ms],
            )?
            .u64(0)
    }

    /// Deletes nonces that expired before `before_ms` and that no statement ever named.
    pub fn prune_nonces(&self, before_ms: u64) -> Result<usize, DbError> {
        self.db.execute(
            "DELETE FROM nonces WHERE used_ms IS NULL AND presented_ms IS NULL AND expires_ms < ?1",
            vals![before_ms],
        )
    }

    pub fn use_nonce(&self, nonce: &str, now_ms: u64) -> Result<(), DbError> {
        self.db.execute(
            "UPDATE nonces SET used_ms = ?1 WHERE nonce = ?2",
            vals![now_ms, nonce],
        )?;
        Ok(())
    }

    pub fn by_pae(
        &self,
        rack: &str,
        host: &str,
        pae: &str,
    ) -> Result<Option<StoredStatement>, DbError> {
        self.db
            .query_opt(
                &format!("SELECT {STATEMENT_COLS} FROM statements WHERE rack = ?1 AND host = ?2 AND pae_sha3 = ?3"),
                vals![rack, host, pae],
            )?
            .as_ref()
            .map(row_statement)
            .transpose()
    }

    pub fn by_seq(
        &self,
        rack: &str,
        host: &str,
        seq: u64,
    ) -> Result<Vec<StoredStatement>, DbError> {
        each(
            self.db.query(&by_seq_sql(), vals![rack, host, seq])?,
            row_statement,
        )
    }

    /// The statement with the highest seq below `seq` (the chain's predecessor, or the last
    /// one before a gap).
    pub fn before(
        &self,
        rack: &str,
        host: &str,
        seq: u64,
    ) -> Result<Option<StoredStatement>, DbError> {
        self.db
            .query_opt(
                &format!("SELECT {STATEMENT_COLS} FROM statements WHERE rack = ?1 AND host = ?2 AND seq < ?3 ORDER BY seq DESC, id DESC LIMIT 1"),
                vals![rack, host, seq],
            )?
            .as_ref()
            .map(row_statement)
            .transpose()
    }

    /// Stores a statement and brings its host's standing row up to date with it, in the
    /// caller's transaction (the row and the statements never disagree).
    pub fn insert_statement(&self, s: &StoredStatement) -> Result<i64, DbError> {
        // Asked together (pipelined on PostgreSQL), in this order: whether the seq was
        // stored before this row is.
        let host_seq = vals![&s.rack, &s.host, s.seq];
        let row = vals![
            &s.rack,
            &s.host,
            s.seq,
            &s.pae_sha3,
            &s.envelope,
            s.received_ms,
            s.epoch_end_ms,
            &s.status,
            &s.result,
            s.wipe_ms
        ];
        let answers = self.db.query_many(&[
            (standing::SEQ_STORED_SQL, host_seq),
            (
                "INSERT INTO statements (rack, host, seq, pae_sha3, envelope, received_ms, epoch_end_ms, status, result, wipe_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) RETURNING id",
                row,
            ),
        ])?;
        let first = |i: usize| {
            answers
                .get(i)
                .and_then(|rows| rows.first())
                .ok_or(DbError::NoRow)
        };
        let new_seq = !first(0)?.bool(0)?;
        let id = first(1)?.i64(0)?;
        self.note_stored(&s.rack, &s.host, s.seq, id, &s.status, new_seq)?;
        Ok(id)
    }

    /// A host's statements, newest first.
    pub fn history(
        &self,
        rack: &str,
        host: &str,
        limit: u32,
    ) -> Result<Vec<StoredStatement>, DbError> {
        each(
            self.db.query(
                &format!("SELECT {STATEMENT_COLS} FROM statements WHERE rack = ?1 AND host = ?2 ORDER BY seq DESC, id DESC LIMIT ?3"),
                vals![rack, host, limit],
            )?,
            row_statement,
        )
    }

    /// Every statement in the order received (for recheck).
    pub fn all_statements(&self) -> Result<Vec<StoredStatement>, DbError> {
        each(
            self.db.query(
                &format!("SELECT {STATEMENT_COLS} FROM statements ORDER BY id"),
                &[],
            )?,
            row_statement,
        )
    }

    /// All seqs stored for a host, ascending (to find gaps).
    pub fn seqs(&self, rack: &str, host: &str) -> Result<Vec<u64>, DbError> {
        each(
            self.db.query(
                "SELECT DISTINCT seq FROM statements WHERE rack = ?1 AND host = ?2 ORDER BY seq",
                vals![rack, host],
            )?,
            |r| r.u64(0),
        )
    }

    /// Records that the host's contraindicated statements stored so far are cleared, by whom
    /// and why, and brings the host's standing row up to date. One transaction holding the
    /// write lock from the start (a savepoint inside the caller's): the operator's CLI clears
    /// while a serving verifier stores, and a statement stored between reading the last row
    /// id and recording the clearance would otherwise be cleared unseen or miscounted.
    pub fn clear(
        &self,
        rack: &str,
        host: &str,
        by: &str,
        reason: &str,
        now_ms: u64,
    ) -> Result<Clearance, DbError> {
        let own_transaction = !self.db.in_transaction();
        if own_transaction {
            self.db.begin_write()?;
        } else {
            self.db.batch("SAVEPOINT clear")?;
        }
        let cleared = self.record_clearance(rack, host, by, reason, now_ms);
        let ended = match (&cleared, own_transaction) {
            (Ok(_), true) => self.db.commit(),
            (Ok(_), false) => self.db.batch("RELEASE clear"),
            (Err(_), true) => self.db.rollback(),
            (Err(_), false) => self.db.rollback_to("clear"),
        };
        let clearance = cleared?;
        ended?;
        Ok(clearance)
    }

    fn record_clearance(
        &self,
        rack: &str,
        host: &str,
        by: &str,
        reason: &str,
        now_ms: u64,
    ) -> Result<Clearance, DbError> {
        let since = self.last_clearance(rack, host)?.map_or(0, |c| c.up_to_id);
        let up_to_id = self
            .db
            .query_one(
                "SELECT COALESCE(MAX(id), 0) FROM statements WHERE rack = ?1 AND host = ?2",
                vals![rack, host],
            )?
            .i64(0)?;
        self.db.execute(
            "INSERT INTO clearances (rack, host, up_to_id, cleared_ms, reason, cleared_by) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            vals![rack, host, up_to_id, now_ms, reason, by],
        )?;
        self.note_cleared(rack, host)?;
        Ok(Clearance {
            rack: rack.into(),
            host: host.into(),
            up_to_id,
            cleared_ms: now_ms,
            reason: reason.into(),
            by: Some(by.into()),
            cleared: self.contraindicated_between(rack, host, since, up_to_id)?,
        })
    }

    /// Every clearance, oldest first: of one rack, or of one host of it, or all.
    pub fn clearances(
        &self,
        rack: Option<&str>,
        host: Option<&str>,
    ) -> Result<Vec<Clearance>, DbError> {
        let rows = each(
            self.db.query(
                "SELECT rack, host, up_to_id, cleared_ms, reason, cleared_by FROM clearances
                 WHERE (CAST(?1 AS TEXT) IS NULL OR rack = ?1)
                   AND (CAST(?2 AS TEXT) IS NULL OR host = ?2) ORDER BY id",
                vals![rack, host],
            )?,
            |r| {
                Ok(Clearance {
                    rack: r.text(0)?,
                    host: r.text(1)?,
                    up_to_id: r.i64(2)?,
                    cleared_ms: r.u64(3)?,
                    reason: r.text(4)?,
                    by: r.opt_text(5)?,
                    cleared: Vec::new(),
                })
            },
        )?;
        // Each covers what the host's previous clearance did not.
        let mut before: std::collections::HashMap<(String, String), i64> = Default::default();
        let mut out = Vec::with_capacity(rows.len());
        for mut c in rows {
            let since = before.insert((c.rack.clone(), c.host.clone()), c.up_to_id);
            c.cleared =
                self.contraindicated_between(&c.rack, &c.host, since.unwrap_or(0), c.up_to_id)?;
            out.push(c);
        }
        Ok(out)
    }

    /// The host's latest clearance, if any.
    pub fn last_clearance(&self, rack: &str, host: &str) -> Result<Option<Clearance>, DbError> {
        Ok(self.clearances(Some(rack), Some(host))?.pop())
    }

    /// Contraindicated statements of the host stored in rows (after_id, up_to_id]: their
    /// seqs and verdicts only, from the partial index's range (never the envelopes).
    fn contraindicated_between(
        &self,
        rack: &str,
        host: &str,
        after_id: i64,
        up_to_id: i64,
    ) -> Result<Vec<ClearedStatement>, DbError> {
        each(
            self.db.query(
                "SELECT seq, result FROM statements WHERE rack = ?1 AND host = ?2 AND id > ?3 AND id <= ?4 AND status = 'contraindicated' ORDER BY id",
                vals![rack, host, after_id, up_to_id],
            )?,
            |r| Ok(ClearedStatement::of(r.u64(0)?, &r.text(1)?)),
        )
    }

    /// Contraindicated statements of the host stored after row `after_id`, oldest first.
    pub fn contraindicated_after(
        &self,
        rack: &str,
        host: &str,
        after_id: i64,
    ) -> Result<Vec<StoredStatement>, DbError> {
        each(
            self.db.query(
                &format!("SELECT {STATEMENT_COLS} FROM statements WHERE rack = ?1 AND host = ?2 AND id > ?3 AND status = 'contraindicated' ORDER BY id"),
                vals![rack, host, after_id],
            )?,
            row_statement,
        )
    }

    pub fn all_nonces(&self) -> Result<Vec<NonceRecord>, DbError> {
        each(
            self.db.query(
                "SELECT nonce, rack, host, issued_ms, expires_ms, used_ms FROM nonces",
                &[],
            )?,
            row_nonce,
        )
    }

    /// Runs SQL on the database behind the store's back: for tests that break a store the
    /// way an attacker with the database would (rows removed or rewritten).
    #[doc(hidden)]
    pub fn tamper(&self, sql: &str, params: &[db::Value]) -> Result<usize, DbError> {
        self.db.execute(sql, params)
    }

    /// Reads rows behind the store's back (what a test's tampering left).
    #[doc(hidden)]
    pub fn probe(&self, sql: &str, params: &[db::Value]) -> Result<Vec<Row>, DbError> {
        self.db.query(sql, params)
    }

    /// [`Store::tamper`] for statements without parameters, several at once (a trigger and
    /// its function).
    #[doc(hidden)]
    pub fn tamper_batch(&self, sql: &str) -> Result<(), DbError> {
        self.db.batch(sql)
    }

    /// Which database the store is on.
    pub fn dialect(&self) -> Dialect {
        self.db.dialect()
    }
}

/// Columns added to SQLite files after they were first made (PostgreSQL databases are made
/// with the current schema).
fn migrate_old_sqlite(conn: &rusqlite::Connection) -> Result<(), DbError> {
    let has_column = |table: &str, column: &str| -> Result<bool, DbError> {
        Ok(conn
            .prepare("SELECT COUNT(*) FROM pragma_table_info(?1) WHERE name = ?2")?
            .query_row([table, column], |r| r.get::<_, i64>(0))?
            > 0)
    };
    // Databases made before `presented_ms` existed get the column (NULL: never named,
    // which is what pruning needs to be sure of; rows used by a statement have used_ms).
    if !has_column("nonces", "presented_ms")? {
        conn.execute_batch("ALTER TABLE nonces ADD COLUMN presented_ms INTEGER")?;
    }
    // Clearances recorded before names were kept have none (NULL, shown as such).
    if !has_column("clearances", "cleared_by")? {
        conn.execute_batch("ALTER TABLE clearances ADD COLUMN cleared_by TEXT")?;
    }
    // Keys enrolled before hosts could rotate: NULL in both (enrolled by an operator,
    // never rotated away).
    if !has_column("host_keys", "from_seq")? {
        conn.execute_batch(
            "ALTER TABLE host_keys ADD COLUMN from_seq INTEGER;
             ALTER TABLE host_keys ADD COLUMN retired_after_seq INTEGER",
        )?;
    }
    Ok(())
}

/// Switches a SQLite database to write-ahead logging. The switch needs the file to itself,
/// and SQLite answers SQLITE_BUSY at once, without waiting in its busy handler, while another
/// connection reads it or is switching it too (two instances starting on one new file): the
/// switch is retried for as long as a writer would wait for the lock.
fn use_wal(conn: &rusqlite::Connection) -> Result<(), DbError> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        match conn.pragma_update(None, "journal_mode", "WAL") {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            done => return Ok(done?),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Instances starting at once on one new database make its schema once: none fails on
    /// another's half-made tables, and all of them then see one store.
    #[test]
    fn instances_opening_a_new_database_at_once_make_it_once() {
        let url = testing::database("schema_race").unwrap();
        let opened: Vec<Result<Store, DbError>> = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..8).map(|_| sc.spawn(|| Store::connect(&url))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let stores: Vec<Store> = opened.into_iter().map(|s| s.unwrap()).collect();
        stores[0].insert_nonce("n", "r", "h", 0, 100).unwrap();
        for s in &stores {
            assert!(s.nonce("n").unwrap().is_some());
        }
        drop(stores);
        testing::remove(&url);
    }

    /// A failure swallowed inside a transaction never turns into an acknowledged statement
    /// that was not stored: PostgreSQL aborts the transaction at the failure, and the commit
    /// is then an error (it would otherwise answer as if it had committed, having rolled
    /// back); SQLite keeps the transaction and commits it. A savepoint rolled back to lifts
    /// the abort.
    #[test]
    fn a_commit_after_a_swallowed_failure_is_an_error_or_a_real_commit() {
        let s = testing::store("aborted").unwrap();
        let row = |seq: u64| StoredStatement {
            id: 0,
            rack: "r".into(),
            host: "h".into(),
            seq,
            pae_sha3: format!("pae-{seq}"),
            envelope: "{}".into(),
            received_ms: seq,
            epoch_end_ms: seq,
            status: "affirming".into(),
            result: "{}".into(),
            wipe_ms: None,
        };
        s.begin().unwrap();
        s.insert_statement(&row(0)).unwrap();
        assert!(s.probe("SELECT nothing FROM no_such_table", &[]).is_err());
        let committed = s.commit();
        match s.dialect() {
            Dialect::Postgres => {
                assert!(matches!(committed, Err(DbError::Aborted)), "{committed:?}");
                assert!(s.seqs("r", "h").unwrap().is_empty(), "nothing stored");
            }
            Dialect::Sqlite => {
                committed.unwrap();
                assert_eq!(s.seqs("r", "h").unwrap(), vec![0]);
            }
        }
        // Inside a savepoint, the failure is rolled back to and the rest commits.
        s.begin().unwrap();
        s.insert_statement(&row(1)).unwrap();
        s.savepoint().unwrap();
        assert!(s.probe("SELECT nothing FROM no_such_table", &[]).is_err());
        s.rollback_to_savepoint().unwrap();
        s.commit().unwrap();
        assert!(s.seqs("r", "h").unwrap().contains(&1));
    }

    /// A writer waits for another instance's write lock as long as SQLite's busy timeout,
    /// then fails, and its connection is usable again at once (a lock wait that timed out
    /// must not leave it inside an aborted transaction).
    #[test]
    fn a_writer_waits_for_the_lock_then_fails_and_can_write_again() {
        let url = testing::database("lock_wait").unwrap();
        let (a, b) = (Store::connect(&url).unwrap(), Store::connect(&url).unwrap());
        a.begin().unwrap();
        let t0 = std::time::Instant::now();
        assert!(b.begin().is_err(), "the lock is held");
        let waited = t0.elapsed();
        assert!(
            waited >= BUSY_TIMEOUT - std::time::Duration::from_millis(500),
            "gave up after {waited:?}"
        );
        assert!(!b.db.in_transaction());
        a.commit().unwrap();
        b.begin().unwrap();
        b.insert_nonce("n", "r", "h", 0, 100).unwrap();
        b.commit().unwrap();
        assert!(a.nonce("n").unwrap().is_some());
        drop((a, b));
        testing::remove(&url);
    }

    #[test]
    fn pruning_removes_only_expired_nonces_no_statement_named() {
        let s = testing::store("nonces").unwrap();
        s.insert_nonce("a", "r", "h", 0, 100).unwrap(); // expired, never named
        s.insert_nonce("b", "r", "h", 0, 100).unwrap(); // expired, named by a statement
        s.insert_nonce("c", "r", "h", 0, 100).unwrap(); // expired, used
        s.insert_nonce("d", "r", "h", 0, 10_000).unwrap(); // not expired
        s.present_nonce("b", 150).unwrap();
        s.use_nonce("c", 90).unwrap();
        assert_eq!(s.outstanding_nonces("r", "h", 200).unwrap(), 1);
        assert_eq!(s.prune_nonces(1000).unwrap(), 1);
        assert!(s.nonce("a").unwrap().is_none());
        for n in ["b", "c", "d"] {
            assert!(
                s.nonce(n).unwrap().is_some(),
                "{n} is evidence or still valid"
            );
        }
    }
}
