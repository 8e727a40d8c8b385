//! The two databases a store can live on, behind one small interface. SQL is written once,
//! with SQLite's numbered parameters (`?1`), in the part of SQL both speak (`ON CONFLICT`
//! upserts, `RETURNING`, `COALESCE`, partial indexes); values are integers, text and bytes.
//! Only this module knows which database it is talking to, except where a question has no
//! common form (the schema's types, the migrations of old SQLite files).

use std::cell::{Cell as StdCell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Where the verifier's database is: a SQLite file (the embedded default) or a PostgreSQL
/// server that several verifier instances share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    Sqlite(PathBuf),
    /// `postgres://` or `postgresql://`, as libpq reads it (user, host, port, database).
    Postgres(String),
}

impl DatabaseUrl {
    /// `postgres://...` or `postgresql://...` selects PostgreSQL; anything else is a path.
    pub fn parse(s: &str) -> DatabaseUrl {
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            DatabaseUrl::Postgres(s.to_string())
        } else {
            DatabaseUrl::Sqlite(PathBuf::from(s))
        }
    }

    /// As a config file's `database` value names it (a URL with its password).
    pub fn config_text(&self) -> String {
        match self {
            DatabaseUrl::Sqlite(p) => p.display().to_string(),
            DatabaseUrl::Postgres(url) => url.clone(),
        }
    }

    /// The SQLite file, if it is one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            DatabaseUrl::Sqlite(p) => Some(p),
            DatabaseUrl::Postgres(_) => None,
        }
    }
}

impl std::fmt::Display for DatabaseUrl {
    /// A PostgreSQL URL is shown without its password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DatabaseUrl::Sqlite(p) => write!(f, "{}", p.display()),
            DatabaseUrl::Postgres(url) => match (url.find("://"), url.rfind('@')) {
                (Some(scheme), Some(at)) if at > scheme => {
                    let userinfo = &url[scheme + 3..at];
                    let user = userinfo.split(':').next().unwrap_or("");
                    write!(f, "{}{user}@{}", &url[..scheme + 3], &url[at + 1..])
                }
                _ => f.write_str(url),
            },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("postgresql: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// The server could not be reached: names every address tried (a socket's path in full)
    /// and the cause the client saw.
    #[error("postgresql: cannot connect to {tried}: {cause}")]
    PgConnect { tried: String, cause: String },
    #[error("the PostgreSQL client's runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("column {column}: {what}")]
    Column { column: usize, what: String },
    #[error("the query returned no row")]
    NoRow,
    #[error(
        "a statement failed inside the transaction and the database rolled it back: nothing of it is stored"
    )]
    Aborted,
}

/// A value bound to a parameter. Integers are i64 on both sides (PostgreSQL's BIGINT); a
/// NULL keeps its type, which PostgreSQL needs to bind it.
#[derive(Debug, Clone)]
pub enum Value {
    Int(Option<i64>),
    Text(Option<String>),
    Bytes(Vec<u8>),
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Int(Some(v))
    }
}
impl From<u64> for Value {
    /// Counters, seqs and times: stored as i64, which all of them fit.
    fn from(v: u64) -> Value {
        Value::Int(Some(v as i64))
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::Int(Some(i64::from(v)))
    }
}
impl From<Option<i64>> for Value {
    fn from(v: Option<i64>) -> Value {
        Value::Int(v)
    }
}
impl From<Option<u64>> for Value {
    fn from(v: Option<u64>) -> Value {
        Value::Int(v.map(|v| v as i64))
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(Some(v.to_string()))
    }
}
impl From<&String> for Value {
    fn from(v: &String) -> Value {
        Value::Text(Some(v.clone()))
    }
}
impl From<Option<&str>> for Value {
    fn from(v: Option<&str>) -> Value {
        Value::Text(v.map(str::to_string))
    }
}
impl From<&Option<String>> for Value {
    fn from(v: &Option<String>) -> Value {
        Value::Text(v.clone())
    }
}
impl From<&[u8]> for Value {
    fn from(v: &[u8]) -> Value {
        Value::Bytes(v.to_vec())
    }
}

/// The parameters of one statement: `vals![a, b, c]`.
macro_rules! vals {
    ($($v:expr),* $(,)?) => { &[$($crate::store::db::Value::from($v)),*] as &[$crate::store::db::Value] };
}
pub(crate) use vals;

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(match self {
            Value::Int(Some(v)) => ToSqlOutput::Borrowed(ValueRef::Integer(*v)),
            Value::Text(Some(v)) => ToSqlOutput::Borrowed(ValueRef::Text(v.as_bytes())),
            Value::Bytes(v) => ToSqlOutput::Borrowed(ValueRef::Blob(v)),
            Value::Int(None) | Value::Text(None) => ToSqlOutput::Borrowed(ValueRef::Null),
        })
    }
}

fn pg_params(values: &[Value]) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
    values
        .iter()
        .map(|v| -> &(dyn tokio_postgres::types::ToSql + Sync) {
            match v {
                Value::Int(v) => v,
                Value::Text(v) => v,
                Value::Bytes(v) => v,
            }
        })
        .collect()
}

/// One column of a row as read back.
#[derive(Debug, Clone)]
enum Cell {
    Null,
    Int(i64),
    Text(String),
    Bytes(Vec<u8>),
}

/// A row as read back, its columns in the order the query named them.
#[derive(Debug, Clone)]
pub struct Row(Vec<Cell>);

impl Row {
    fn cell(&self, i: usize) -> Result<&Cell, DbError> {
        self.0.get(i).ok_or(DbError::Column {
            column: i,
            what: format!("the row has {} columns", self.0.len()),
        })
    }

    fn wrong(i: usize, want: &str, got: &Cell) -> DbError {
        DbError::Column {
            column: i,
            what: format!("expected {want}, found {got:?}"),
        }
    }

    pub fn opt_i64(&self, i: usize) -> Result<Option<i64>, DbError> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            Cell::Int(v) => Ok(Some(*v)),
            other => Err(Self::wrong(i, "an integer", other)),
        }
    }

    pub fn i64(&self, i: usize) -> Result<i64, DbError> {
        self.opt_i64(i)?
            .ok_or_else(|| Self::wrong(i, "an integer", &Cell::Null))
    }

    /// Counters, seqs and times (stored as i64 from u64).
    pub fn u64(&self, i: usize) -> Result<u64, DbError> {
        Ok(self.i64(i)? as u64)
    }

    pub fn opt_u64(&self, i: usize) -> Result<Option<u64>, DbError> {
        Ok(self.opt_i64(i)?.map(|v| v as u64))
    }

    pub fn opt_text(&self, i: usize) -> Result<Option<String>, DbError> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            Cell::Text(v) => Ok(Some(v.clone())),
            other => Err(Self::wrong(i, "text", other)),
        }
    }

    pub fn text(&self, i: usize) -> Result<String, DbError> {
        self.opt_text(i)?
            .ok_or_else(|| Self::wrong(i, "text", &Cell::Null))
    }

    pub fn bytes(&self, i: usize) -> Result<Vec<u8>, DbError> {
        match self.cell(i)? {
            Cell::Bytes(v) => Ok(v.clone()),
            other => Err(Self::wrong(i, "bytes", other)),
        }
    }

    /// An `EXISTS(...)`: an integer in SQLite, a boolean (read as 0/1) in PostgreSQL.
    pub fn bool(&self, i: usize) -> Result<bool, DbError> {
        Ok(self.i64(i)? != 0)
    }

    fn from_sqlite(r: &rusqlite::Row<'_>, columns: usize) -> Result<Row, DbError> {
        use rusqlite::types::ValueRef;
        let mut cells = Vec::with_capacity(columns);
        for i in 0..columns {
            cells.push(match r.get_ref(i)? {
                ValueRef::Null => Cell::Null,
                ValueRef::Integer(v) => Cell::Int(v),
                ValueRef::Real(v) => {
                    return Err(DbError::Column {
                        column: i,
                        what: format!("a real number ({v}) where the store keeps none"),
                    });
                }
                ValueRef::Text(t) => {
                    Cell::Text(String::from_utf8(t.to_vec()).map_err(|e| DbError::Column {
                        column: i,
                        what: format!("text that is not UTF-8: {e}"),
                    })?)
                }
                ValueRef::Blob(b) => Cell::Bytes(b.to_vec()),
            });
        }
        Ok(Row(cells))
    }

    fn from_postgres(r: &tokio_postgres::Row) -> Result<Row, DbError> {
        use tokio_postgres::types::Type;
        let mut cells = Vec::with_capacity(r.len());
        for (i, col) in r.columns().iter().enumerate() {
            let ty = col.type_();
            let cell = if *ty == Type::INT8 {
                r.try_get::<_, Option<i64>>(i)?.map(Cell::Int)
            } else if *ty == Type::INT4 {
                r.try_get::<_, Option<i32>>(i)?
                    .map(|v| Cell::Int(i64::from(v)))
            } else if *ty == Type::INT2 {
                r.try_get::<_, Option<i16>>(i)?
                    .map(|v| Cell::Int(i64::from(v)))
            } else if *ty == Type::BOOL {
                r.try_get::<_, Option<bool>>(i)?
                    .map(|v| Cell::Int(i64::from(v)))
            } else if *ty == Type::TEXT || *ty == Type::VARCHAR || *ty == Type::NAME {
                r.try_get::<_, Option<String>>(i)?.map(Cell::Text)
            } else if *ty == Type::BYTEA {
                r.try_get::<_, Option<Vec<u8>>>(i)?.map(Cell::Bytes)
            } else {
                return Err(DbError::Column {
                    column: i,
                    what: format!("type {ty} where the store keeps integers, text and bytes"),
                });
            };
            cells.push(cell.unwrap_or(Cell::Null));
        }
        Ok(Row(cells))
    }
}

/// What a failed connection tried: `socket /run/postgresql/.s.PGSQL.5432` or `host:port`,
/// each address of the URL, and the client's error with its causes (its own text is only
/// "error connecting to server").
fn connect_error(url: &str, e: &tokio_postgres::Error) -> DbError {
    let tried = match url.parse::<tokio_postgres::Config>() {
        Ok(c) => {
            let ports = c.get_ports();
            c.get_hosts()
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                    match h {
                        tokio_postgres::config::Host::Tcp(host) => format!("{host}:{port}"),
                        tokio_postgres::config::Host::Unix(dir) => {
                            format!("socket {}", dir.join(format!(".s.PGSQL.{port}")).display())
                        }
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        }
        Err(_) => "the server in the database URL".to_string(),
    };
    let mut cause = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        cause = format!("{cause}: {s}");
        source = s.source();
    }
    DbError::PgConnect { tried, cause }
}

/// Which SQL a question has to be asked in, where the two differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// The advisory lock every writing transaction on PostgreSQL takes first: what SQLite's
/// `BEGIN IMMEDIATE` is on a shared file. Whole ingest batches are serialised across all
/// instances, so a host's statements are appraised in chain order and the log's leaves are
/// appended in commit order, whichever instance gets them.
const PG_WRITE_LOCK: i64 = 0x7277_5354; // "rwST"

pub(crate) struct Pg {
    url: String,
    /// The client's own single-threaded runtime: the store is used from blocking threads
    /// (one request at a time, behind the verifier's lock), and each call blocks on it.
    rt: tokio::runtime::Runtime,
    client: RefCell<tokio_postgres::Client>,
    /// Prepared once per connection (a prepare is a round trip).
    prepared: RefCell<HashMap<String, tokio_postgres::Statement>>,
    in_transaction: StdCell<bool>,
    /// A statement failed inside the open transaction and no `ROLLBACK TO` undid it since:
    /// PostgreSQL has aborted the transaction, and would answer a `COMMIT` with a silent
    /// rollback. The commit refuses instead (an acknowledgement must mean stored).
    aborted: StdCell<bool>,
}

impl Pg {
    fn connect(url: &str) -> Result<Pg, DbError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(DbError::Runtime)?;
        let client = Self::client(&rt, url)?;
        Ok(Pg {
            url: url.to_string(),
            rt,
            client: RefCell::new(client),
            prepared: RefCell::new(HashMap::new()),
            in_transaction: StdCell::new(false),
            aborted: StdCell::new(false),
        })
    }

    /// Notes a failure inside the open transaction (see `aborted`).
    fn noted<T>(&self, r: Result<T, DbError>) -> Result<T, DbError> {
        if r.is_err() && self.in_transaction.get() {
            self.aborted.set(true);
        }
        r
    }

    /// Ends the open transaction with `COMMIT` or `ROLLBACK`, on this connection only: a
    /// connection made again has no transaction to end, and a `COMMIT` there would answer
    /// as if it had committed.
    fn end(&self, sql: &str) -> Result<(), DbError> {
        self.in_transaction.set(false);
        self.aborted.set(false);
        let client = self.client.borrow();
        Ok(self.rt.block_on(client.batch_execute(sql))?)
    }

    fn client(rt: &tokio::runtime::Runtime, url: &str) -> Result<tokio_postgres::Client, DbError> {
        let (client, connection) = rt
            .block_on(tokio_postgres::connect(url, tokio_postgres::NoTls))
            .map_err(|e| connect_error(url, &e))?;
        // Driven whenever the runtime runs, which is inside every call.
        rt.spawn(async move {
            if let Err(e) = connection.await {
                log::error!("the PostgreSQL connection ended: {e}");
            }
        });
        // The schema is created with IF NOT EXISTS at every start: without this, each
        // existing table is a NOTICE line in the journal (15 per start and per CLI call).
        rt.block_on(client.batch_execute("SET client_min_messages TO WARNING"))?;
        Ok(client)
    }

    /// A server restarted (or a connection dropped) between requests is connected to
    /// again; inside a transaction it is not: the transaction is lost and says so.
    fn ready(&self) -> Result<(), DbError> {
        if self.client.borrow().is_closed() && !self.in_transaction.get() {
            log::warn!("connecting to PostgreSQL again");
            *self.client.borrow_mut() = Self::client(&self.rt, &self.url)?;
            self.prepared.borrow_mut().clear();
        }
        Ok(())
    }

    fn statements(&self, sqls: &[&str]) -> Result<Vec<tokio_postgres::Statement>, DbError> {
        self.ready()?;
        let missing: Vec<&str> = sqls
            .iter()
            .copied()
            .filter(|sql| !self.prepared.borrow().contains_key(*sql))
            .collect();
        if !missing.is_empty() {
            let client = self.client.borrow();
            let translated: Vec<String> = missing.iter().map(|s| pg_sql(s)).collect();
            let made = self.rt.block_on(futures_util::future::try_join_all(
                translated.iter().map(|sql| client.prepare(sql)),
            ))?;
            let mut prepared = self.prepared.borrow_mut();
            for (sql, st) in missing.into_iter().zip(made) {
                prepared.insert(sql.to_string(), st);
            }
        }
        let prepared = self.prepared.borrow();
        sqls.iter()
            .map(|sql| {
                prepared.get(*sql).cloned().ok_or(DbError::Column {
                    column: 0,
                    what: format!("no prepared statement for {sql}"),
                })
            })
            .collect()
    }
}

/// A connection to the store's database.
pub(crate) enum Db {
    Sqlite(rusqlite::Connection),
    Postgres(Box<Pg>),
}

/// SQLite's `?N` parameters as PostgreSQL's `$N`. The store's SQL has no `?` in literals.
fn pg_sql(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

/// The SQLite schema in PostgreSQL's types: row ids from a sequence, BIGINT integers,
/// BYTEA bytes, and text ordered byte by byte as SQLite orders it (the "C" collation), so
/// that both backends list racks and hosts in the same order.
pub(crate) fn pg_schema(sqlite: &str) -> String {
    sqlite
        .replace("id INTEGER PRIMARY KEY", "id BIGSERIAL PRIMARY KEY")
        .replace("INTEGER", "BIGINT")
        .replace("BLOB", "BYTEA")
        .replace("TEXT", "TEXT COLLATE \"C\"")
}

impl Db {
    pub fn open_sqlite(path: &Path) -> Result<Db, DbError> {
        Ok(Db::Sqlite(rusqlite::Connection::open(path)?))
    }

    pub fn sqlite_in_memory() -> Result<Db, DbError> {
        Ok(Db::Sqlite(rusqlite::Connection::open_in_memory()?))
    }

    pub fn open_postgres(url: &str) -> Result<Db, DbError> {
        Ok(Db::Postgres(Box::new(Pg::connect(url)?)))
    }

    pub fn dialect(&self) -> Dialect {
        match self {
            Db::Sqlite(_) => Dialect::Sqlite,
            Db::Postgres(_) => Dialect::Postgres,
        }
    }

    /// The SQLite connection, for what only SQLite has (pragmas, old files' migrations).
    pub fn sqlite(&self) -> Option<&rusqlite::Connection> {
        match self {
            Db::Sqlite(c) => Some(c),
            Db::Postgres(_) => None,
        }
    }

    /// Runs a statement; the number of rows it changed.
    pub fn execute(&self, sql: &str, params: &[Value]) -> Result<usize, DbError> {
        match self {
            Db::Sqlite(c) => Ok(c
                .prepare_cached(sql)?
                .execute(rusqlite::params_from_iter(params.iter()))?),
            Db::Postgres(pg) => pg.noted((|| {
                let st = pg.statements(&[sql])?.remove(0);
                let client = pg.client.borrow();
                Ok(pg.rt.block_on(client.execute(&st, &pg_params(params)))? as usize)
            })()),
        }
    }

    /// Every row the query gives.
    pub fn query(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        Ok(self.query_many(&[(sql, params)])?.remove(0))
    }

    /// Several queries' rows, in order. On PostgreSQL they go out pipelined (one round trip
    /// for all of them, not one each); on SQLite, which is in process, one after another.
    /// Writes go this way too (an `INSERT` gives no rows, or those of its `RETURNING`).
    pub fn query_many(&self, queries: &[(&str, &[Value])]) -> Result<Vec<Vec<Row>>, DbError> {
        match self {
            Db::Sqlite(c) => queries
                .iter()
                .map(|(sql, params)| {
                    let mut st = c.prepare_cached(sql)?;
                    let columns = st.column_count();
                    let mut rows = st.query(rusqlite::params_from_iter(params.iter()))?;
                    let mut out = Vec::new();
                    while let Some(r) = rows.next()? {
                        out.push(Row::from_sqlite(r, columns)?);
                    }
                    Ok(out)
                })
                .collect(),
            Db::Postgres(pg) => pg.noted((|| {
                let sqls: Vec<&str> = queries.iter().map(|(sql, _)| *sql).collect();
                let sts = pg.statements(&sqls)?;
                let client = pg.client.borrow();
                let params: Vec<_> = queries.iter().map(|(_, p)| pg_params(p)).collect();
                let results = pg.rt.block_on(futures_util::future::try_join_all(
                    sts.iter().zip(&params).map(|(st, p)| client.query(st, p)),
                ))?;
                results
                    .iter()
                    .map(|rows| rows.iter().map(Row::from_postgres).collect())
                    .collect()
            })()),
        }
    }

    /// The query's first row, if it gives one.
    pub fn query_opt(&self, sql: &str, params: &[Value]) -> Result<Option<Row>, DbError> {
        Ok(self.query(sql, params)?.into_iter().next())
    }

    /// The query's first row; an error when it gives none (an aggregate always gives one).
    pub fn query_one(&self, sql: &str, params: &[Value]) -> Result<Row, DbError> {
        self.query_opt(sql, params)?.ok_or(DbError::NoRow)
    }

    /// Statements without parameters, run as one batch (schema, savepoints).
    pub fn batch(&self, sql: &str) -> Result<(), DbError> {
        match self {
            Db::Sqlite(c) => Ok(c.execute_batch(sql)?),
            Db::Postgres(pg) => pg.noted((|| {
                pg.ready()?;
                let client = pg.client.borrow();
                Ok(pg.rt.block_on(client.batch_execute(sql))?)
            })()),
        }
    }

    /// Undoes what was written since savepoint `name` and ends it. On PostgreSQL this also
    /// lifts the abort a failure after the savepoint caused.
    pub fn rollback_to(&self, name: &str) -> Result<(), DbError> {
        self.batch(&format!("ROLLBACK TO {name}; RELEASE {name}"))?;
        if let Db::Postgres(pg) = self {
            pg.aborted.set(false);
        }
        Ok(())
    }

    /// Opens a transaction holding the write lock from its start: SQLite's `BEGIN
    /// IMMEDIATE` (waiting up to `BUSY_TIMEOUT` for another writer), PostgreSQL's
    /// transaction-scoped advisory lock, taken before the transaction reads anything and
    /// in READ COMMITTED (whatever the server's default), so that what it reads is what
    /// the last writer committed; it waits as long as SQLite does.
    pub fn begin_write(&self) -> Result<(), DbError> {
        match self {
            Db::Sqlite(c) => Ok(c.execute_batch("BEGIN IMMEDIATE")?),
            Db::Postgres(pg) => {
                let wait = super::BUSY_TIMEOUT.as_millis();
                let begun = self.batch(&format!(
                    "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = {wait};
                     SELECT pg_advisory_xact_lock({PG_WRITE_LOCK})"
                ));
                if let Err(e) = begun {
                    // A lock wait that timed out leaves the transaction open and aborted.
                    let _ = pg.end("ROLLBACK");
                    return Err(e);
                }
                pg.in_transaction.set(true);
                pg.aborted.set(false);
                Ok(())
            }
        }
    }

    /// Commits durably (SQLite `synchronous=FULL`; PostgreSQL's default
    /// `synchronous_commit = on`). On PostgreSQL a transaction a failure aborted is rolled
    /// back and the commit is an error, never a success.
    pub fn commit(&self) -> Result<(), DbError> {
        match self {
            Db::Sqlite(c) => Ok(c.execute_batch("COMMIT")?),
            Db::Postgres(pg) => {
                if pg.aborted.get() {
                    let _ = pg.end("ROLLBACK");
                    return Err(DbError::Aborted);
                }
                pg.end("COMMIT")
            }
        }
    }

    pub fn rollback(&self) -> Result<(), DbError> {
        match self {
            Db::Sqlite(c) => Ok(c.execute_batch("ROLLBACK")?),
            Db::Postgres(pg) => pg.end("ROLLBACK"),
        }
    }

    pub fn in_transaction(&self) -> bool {
        match self {
            Db::Sqlite(c) => !c.is_autocommit(),
            Db::Postgres(pg) => pg.in_transaction.get(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 42: a wrong socket directory was "error connecting to server" and no more.
    #[test]
    fn a_server_that_cannot_be_reached_is_named_with_the_path_tried() {
        let Err(e) = Db::open_postgres("host=/nonexistent/pg-sockets port=5433 dbname=rw") else {
            panic!("connected to a socket that does not exist");
        };
        let text = e.to_string();
        assert!(
            text.contains("cannot connect to socket /nonexistent/pg-sockets/.s.PGSQL.5433")
                && text.contains("No such file"),
            "{text}"
        );
        let Err(e) = Db::open_postgres("postgresql://127.0.0.1:1/rw") else {
            panic!("connected to port 1");
        };
        assert!(
            e.to_string().contains("cannot connect to 127.0.0.1:1"),
            "{e}"
        );
    }

    #[test]
    fn parameters_and_schema_read_in_postgresql() {
        assert_eq!(
            pg_sql("SELECT a FROM t WHERE (?1 IS NULL OR r = ?1) AND h = ?12"),
            "SELECT a FROM t WHERE ($1 IS NULL OR r = $1) AND h = $12"
        );
        assert_eq!(
            pg_schema(
                "CREATE TABLE t (id INTEGER PRIMARY KEY, idx INTEGER PRIMARY KEY, b BLOB, s TEXT NOT NULL)"
            ),
            "CREATE TABLE t (id BIGSERIAL PRIMARY KEY, idx BIGINT PRIMARY KEY, b BYTEA, s TEXT COLLATE \"C\" NOT NULL)"
        );
    }

    #[test]
    fn a_url_names_the_backend_and_is_shown_without_its_password() {
        assert_eq!(
            DatabaseUrl::parse("/var/lib/v.sqlite"),
            DatabaseUrl::Sqlite("/var/lib/v.sqlite".into())
        );
        let pg = DatabaseUrl::parse("postgres://rw:secret@db.internal:5432/verifier");
        assert!(matches!(pg, DatabaseUrl::Postgres(_)));
        assert_eq!(pg.to_string(), "postgres://rw@db.internal:5432/verifier");
        assert_eq!(
            DatabaseUrl::parse("postgresql://db/v").to_string(),
            "postgresql://db/v"
        );
    }
}
