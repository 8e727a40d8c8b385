//! Draining and restarting the inference workloads around a wipe: systemd units (stopped and
//! started with `systemctl`, which waits for the job to finish) or operator commands.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::config::epoch::Workloads;

/// Why a drain or a restart failed; the message names the command and what it printed.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("{command}: cannot start: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("{command} failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("{command} did not finish within {}", crate::units::fmt_duration(*.timeout))]
    TimedOut { command: String, timeout: Duration },
    #[error("{command}: {source}")]
    Wait {
        command: String,
        source: std::io::Error,
    },
    #[error("systemctl is-active {unit}: {source}")]
    IsActive {
        unit: String,
        source: std::io::Error,
    },
    #[error("unit {unit} is still {state} after `systemctl stop`")]
    StillUp { unit: String, state: String },
}

/// Stops the workloads and waits until they are down. `Err` says what failed.
pub fn drain(w: &Workloads) -> Result<(), WorkloadError> {
    match w {
        Workloads::NoneConfigured => Ok(()),
        Workloads::Units {
            units,
            stop_timeout,
        } => {
            run(
                Command::new("systemctl").arg("stop").args(units),
                *stop_timeout,
            )?;
            // `systemctl stop` returns once the stop job is done; check that each unit is
            // really down rather than trust the exit code alone.
            for u in units {
                let out = Command::new("systemctl")
                    .args(["is-active", u])
                    .stderr(Stdio::null())
                    .output()
                    .map_err(|source| WorkloadError::IsActive {
                        unit: u.clone(),
                        source,
                    })?;
                let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
                if state == "active" || state == "deactivating" || state == "reloading" {
                    return Err(WorkloadError::StillUp {
                        unit: u.clone(),
                        state,
                    });
                }
            }
            Ok(())
        }
        Workloads::Commands {
            stop, stop_timeout, ..
        } => run(Command::new(&stop[0]).args(&stop[1..]), *stop_timeout),
    }
}

/// Starts the workloads again.
pub fn restart(w: &Workloads) -> Result<(), WorkloadError> {
    match w {
        Workloads::NoneConfigured => Ok(()),
        Workloads::Units {
            units,
            stop_timeout,
        } => run(
            Command::new("systemctl").arg("start").args(units),
            *stop_timeout,
        ),
        Workloads::Commands {
            start,
            stop_timeout,
            ..
        } => run(Command::new(&start[0]).args(&start[1..]), *stop_timeout),
    }
}

/// Runs `cmd` to completion within `timeout`; a non-zero exit, or running past the timeout
/// (the command is then killed), is an error naming the command and what it printed.
fn run(cmd: &mut Command, timeout: Duration) -> Result<(), WorkloadError> {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| WorkloadError::Spawn {
            command: what.clone(),
            source,
        })?;
    let t0 = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                if status.success() {
                    return Ok(());
                }
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use std::io::Read as _;
                    let _ = e.by_ref().take(4096).read_to_string(&mut err);
                }
                return Err(WorkloadError::Failed {
                    command: what,
                    status,
                    stderr: err.trim().to_string(),
                });
            }
            Ok(None) if t0.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(WorkloadError::TimedOut {
                    command: what,
                    timeout,
                });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(source) => {
                return Err(WorkloadError::Wait {
                    command: what,
                    source,
                });
            }
        }
    }
}
