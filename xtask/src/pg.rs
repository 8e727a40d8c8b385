//! A throwaway PostgreSQL server for the verifier's PostgreSQL backend: `cargo xtask test`
//! runs the verifier suite against one, and `cargo xtask pg -- <command>` hands one to a
//! developer's command.
//!
//! - Binaries: Debian's `postgresql` package (in `APT_PACKAGES`), from the highest
//!   `/usr/lib/postgresql/<major>/bin`: Debian keeps `initdb` and `pg_ctl` off `PATH`, and the
//!   major version follows the release, so it is found, never named.
//! - Cluster: a fresh one per run in its own directory (the data directory, its unix socket
//!   and `server.log`), trust authentication for the `postgres` superuser, listening on
//!   127.0.0.1 only, on a port that was free when it started. `fsync=on` as in production:
//!   the backend's durability is part of what the tests are about.
//! - Root: PostgreSQL refuses to run as root, so as root the directory is handed to the
//!   `postgres` system user (which the package creates) and `initdb`/`pg_ctl` run as that
//!   user under `runuser`.
//! - Stop: on drop (`pg_ctl stop -m fast`, then the directory is removed), so a failing test
//!   run stops it too. A process killed outright (Ctrl-C on xtask) leaves the cluster behind;
//!   the next start in the same directory stops it first.

use std::{
    fmt::Write as _,
    net::{Ipv4Addr, TcpListener},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

/// Where Debian installs one directory per PostgreSQL major version.
const PG_LIB: &str = "/usr/lib/postgresql";

/// The environment variable that points the tests at the server.
pub const URL_VAR: &str = "RACKWARDEN_TEST_POSTGRES";

/// A directory for this process's cluster: under `/tmp` (every parent is searchable by the
/// `postgres` user, which a checkout under `/root` is not), named by the pid so that two
/// xtask runs never share one.
pub fn scratch_dir() -> PathBuf {
    PathBuf::from(format!("/tmp/rackwarden-pg-{}", std::process::id()))
}

/// A running cluster; dropping it stops the server and removes its directory.
pub struct Server {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
}

impl Server {
    /// Makes a fresh cluster in `dir` (whatever was there is stopped and removed) and starts
    /// it; returns once it accepts connections (`pg_ctl -w`).
    pub fn start(dir: &Path) -> Result<Server> {
        let bin = bin_dir()?;
        let as_postgres = is_root()?;
        let dir = std::path::absolute(dir)?;
        // The socket goes in the data directory and pg_ctl's `-o` goes through a shell:
        // keep the path to characters that need no quoting.
        let dir_str = dir
            .to_str()
            .context("PostgreSQL directory is not UTF-8")?
            .to_string();
        if !dir_str
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/-_.".contains(c))
        {
            bail!("PostgreSQL directory {dir_str:?}: only [A-Za-z0-9/._-] are allowed");
        }
        let mut server = Server {
            dir,
            bin,
            port: 0,
            as_postgres,
        };
        // A cluster left by a run that was killed (no drop) may still be up in there.
        if server.dir.join("postmaster.pid").exists() {
            let _ = server.stop("immediate");
        }
        match std::fs::remove_dir_all(&server.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {dir_str}")),
        }
        std::fs::create_dir_all(&server.dir).with_context(|| format!("creating {dir_str}"))?;
        // From here on, a failure drops `server`, which stops whatever started and removes
        // the directory.
        if as_postgres {
            crate::run_checked(
                Command::new("chown")
                    .args(["-R", "postgres:"])
                    .arg(&server.dir),
                "chown the PostgreSQL directory to postgres",
            )?;
        }
        server.run(
            "initdb",
            server
                .command("initdb")
                .args([
                    "--auth=trust",
                    "--no-locale",
                    "-E",
                    "UTF8",
                    "-U",
                    "postgres",
                    "-D",
                ])
                .arg(&server.dir),
        )?;
        server.port = free_port()?;
        let opts = format!(
            "-c listen_addresses=127.0.0.1 -p {} -c unix_socket_directories={dir_str} \
             -c fsync=on -c max_connections=200",
            server.port
        );
        server.run(
            "pg_ctl start",
            server
                .command("pg_ctl")
                .args(["start", "-w", "-t", "60", "-D"])
                .arg(&server.dir)
                .arg("-l")
                .arg(server.log())
                .args(["-o", &opts]),
        )?;
        Ok(server)
    }

    /// The connection URL the tests take from `RACKWARDEN_TEST_POSTGRES`: the server's unix
    /// socket (percent-encoded as the URL's host), not its TCP port, because the tests run
    /// verifiers inside network namespaces, where the root namespace's loopback is not
    /// reachable and a socket file is.
    pub fn url(&self) -> String {
        let socket_dir = self.dir.display().to_string().replace('/', "%2F");
        format!("postgres://postgres@{socket_dir}:{}/postgres", self.port)
    }

    fn log(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// `bin/<tool>`, as the `postgres` user when this process is root. Run from inside the
    /// cluster directory: the `postgres` user may not be able to enter the caller's.
    /// `pg_ctl stop` of the cluster in `dir`, in shutdown `mode`, waiting for it.
    fn stop(&self, mode: &str) -> std::io::Result<std::process::Output> {
        self.command("pg_ctl")
            .args(["stop", "-m", mode, "-w", "-D"])
            .arg(&self.dir)
            .output()
    }

    fn command(&self, tool: &str) -> Command {
        let exe = self.bin.join(tool);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        };
        cmd.current_dir(&self.dir);
        cmd
    }

    /// Runs `cmd`; on failure the error names it and carries its output and the tail of
    /// `server.log`.
    fn run(&self, what: &str, cmd: &mut Command) -> Result<()> {
        let out = cmd
            .output()
            .with_context(|| format!("cannot run {what}: {cmd:?}"))?;
        if out.status.success() {
            return Ok(());
        }
        let mut msg = format!("{what} failed ({}): {cmd:?}", out.status);
        for text in [&out.stdout, &out.stderr] {
            let text = String::from_utf8_lossy(text);
            if !text.trim().is_empty() {
                let _ = write!(msg, "\n{}", tail(&text, 20));
            }
        }
        msg.push_str(&self.log_tail());
        bail!(msg)
    }

    fn log_tail(&self) -> String {
        match std::fs::read_to_string(self.log()) {
            Ok(log) => format!("\n{}:\n{}", self.log().display(), tail(&log, 30)),
            Err(_) => String::new(),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Only a cluster that was started has a postmaster.pid to stop.
        if self.dir.join("postmaster.pid").exists() {
            let stopped = self.stop("fast");
            match stopped {
                Ok(out) if out.status.success() => {}
                Ok(out) => eprintln!(
                    "warning: pg_ctl stop failed ({}): {}{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim(),
                    self.log_tail()
                ),
                Err(e) => eprintln!("warning: cannot run pg_ctl stop: {e}"),
            }
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("warning: removing {}: {e}", self.dir.display());
        }
    }
}

/// The `bin` directory of the highest PostgreSQL major version installed.
fn bin_dir() -> Result<PathBuf> {
    let missing = || {
        format!(
            "no PostgreSQL server under {PG_LIB}/*/bin: `cargo xtask setup` installs Debian's \
             postgresql package"
        )
    };
    let entries = std::fs::read_dir(PG_LIB).with_context(missing)?;
    let major = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|v| Path::new(PG_LIB).join(format!("{v}/bin/initdb")).exists())
        .max()
        .with_context(missing)?;
    Ok(Path::new(PG_LIB).join(format!("{major}/bin")))
}

/// Whether this process runs as root (PostgreSQL refuses to).
fn is_root() -> Result<bool> {
    let uid = crate::output(Command::new("id").arg("-u")).context("`id -u` failed")?;
    Ok(uid == "0")
}

/// A TCP port on 127.0.0.1 that is free now: bound to port 0, then released for the server.
fn free_port() -> Result<u16> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("binding 127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.trim_end().lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
