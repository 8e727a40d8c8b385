//! Databases for tests, on the backend the test run names: SQLite by default, PostgreSQL
//! when `RACKWARDEN_TEST_POSTGRES` holds a server's URL (`cargo xtask test` runs the
//! verifier's suite both ways, against a server it starts). Each call makes a new, empty
//! database, so tests never share rows.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{DatabaseUrl, DbError, Store, db::Db};

/// The variable that names the PostgreSQL server tests run against.
pub const POSTGRES_ENV: &str = "RACKWARDEN_TEST_POSTGRES";

/// The server the run names, if any.
pub fn postgres_server() -> Option<String> {
    std::env::var(POSTGRES_ENV).ok().filter(|s| !s.is_empty())
}

/// A new, empty database: on the run's PostgreSQL server (a database named after `label`,
/// this process and a counter), or else the SQLite file `sqlite_path` (removed first).
pub fn fresh_database(label: &str, sqlite_path: &Path) -> Result<DatabaseUrl, DbError> {
    let Some(server) = postgres_server() else {
        let _ = std::fs::remove_file(sqlite_path);
        return Ok(DatabaseUrl::Sqlite(sqlite_path.to_path_buf()));
    };
    static N: AtomicU64 = AtomicU64::new(0);
    let clean: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(30)
        .collect();
    let name = format!(
        "rw_{clean}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let admin = Db::open_postgres(&server)?;
    // One statement per call: several in one are one transaction, which neither may run in.
    admin.batch(&format!("DROP DATABASE IF EXISTS {name}"))?;
    admin.batch(&format!("CREATE DATABASE {name}"))?;
    Ok(DatabaseUrl::Postgres(with_database(&server, &name)))
}

/// `url` naming database `name` instead of its own.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let authority_end = base[after_scheme..]
        .find('/')
        .map_or(base.len(), |i| after_scheme + i);
    let mut out = format!("{}/{name}", &base[..authority_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// A new, empty database for a test that reopens it (a restart) or reaches it behind the
/// store's back: a SQLite file in a directory of its own, or a database on the run's
/// PostgreSQL server. [`remove`] takes it away again.
pub fn database(label: &str) -> Result<DatabaseUrl, DbError> {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rwv-{label}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    fresh_database(label, &dir.join("v.sqlite"))
}

/// Removes a database [`database`] made (best effort: a leftover is only disk).
pub fn remove(url: &DatabaseUrl) {
    match url {
        DatabaseUrl::Sqlite(path) => {
            if let Some(dir) = path.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        DatabaseUrl::Postgres(url) => {
            let (Some(server), Some(name)) = (postgres_server(), url.rsplit('/').next()) else {
                return;
            };
            let name = name.split('?').next().unwrap_or(name);
            if let Ok(admin) = Db::open_postgres(&server) {
                let _ = admin.batch(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
            }
        }
    }
}

/// A store on a new, empty database of the run's backend (SQLite in memory by default).
pub fn store(label: &str) -> Result<Store, DbError> {
    match postgres_server() {
        None => Store::in_memory(),
        Some(_) => Store::connect(&fresh_database(label, Path::new("/nonexistent"))?),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_server_url_is_given_the_test_database_s_name() {
        assert_eq!(
            super::with_database("postgres://postgres@127.0.0.1:5/postgres", "rw_x_1_0"),
            "postgres://postgres@127.0.0.1:5/rw_x_1_0"
        );
        assert_eq!(
            super::with_database("postgresql://u@h?sslmode=disable", "d"),
            "postgresql://u@h/d?sslmode=disable"
        );
    }
}
