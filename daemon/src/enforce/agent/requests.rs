//! The control socket's requests, answered on the agent loop (which owns the limiter):
//! `status`, `cap set` (through the config's own cap parse and checks: [`crate::config::Caps`])
//! and `wipe-now` (forwarded to the epoch loop).

use super::{Agent, AgentError};
use crate::{
    control::{CapSetOutcome, Request, Response},
    limiter::Direction,
};

/// Why `cap set` changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum CapSetError {
    #[error(transparent)]
    Cap(#[from] crate::config::caps::CapError),
    #[error(transparent)]
    Write(#[from] AgentError),
    /// A rack cap above the one the config file holds: the cap the rack's agreement was
    /// written against. Applied only with `--force`.
    #[error(
        "rack {direction} {asked} is above the {configured} in {path} (the agreed cap); nothing was changed: pass --force to apply it all the same (the verifier judges it against its own agreement)"
    )]
    AboveConfigured {
        direction: &'static str,
        asked: String,
        configured: String,
        path: std::path::PathBuf,
    },
}

/// Whether a cap change survives a daemon restart, and why.
enum Persistence {
    /// `--persist`: `[cap]` was rewritten.
    Written,
    /// Not asked, but the file already holds these caps (a change back to its values).
    AlreadyInFile,
    /// Not asked, and the file holds other caps: a restart restores those.
    NotPersisted,
    /// `--persist`, and the file could not be rewritten.
    Failed(crate::config_edit::ConfigEditError),
}

impl Persistence {
    fn survives_restart(&self) -> bool {
        matches!(self, Persistence::Written | Persistence::AlreadyInFile)
    }

    fn detail(&self, path: &std::path::Path) -> String {
        let path = path.display();
        match self {
            Persistence::Written => format!("written to {path}"),
            Persistence::AlreadyInFile => {
                format!("{path} already holds these caps; a daemon restart keeps them")
            }
            Persistence::NotPersisted => format!(
                "not persisted: {path} still holds the old cap; a daemon restart restores it (use --persist)"
            ),
            Persistence::Failed(e) => format!("NOT persisted: {e}"),
        }
    }
}

impl Agent {
    /// Whether the config file, read now, holds the caps that run (a file that cannot be
    /// read holds nothing we can count on).
    fn file_holds_running_caps(&self) -> bool {
        crate::config::Config::load(&self.cfg.path).is_ok_and(|f| f.caps == self.cfg.caps)
    }

    fn cap_set(
        &mut self,
        egress: Option<String>,
        ingress: Option<String>,
        persist: bool,
        force: bool,
    ) -> Result<CapSetOutcome, CapSetError> {
        let next = self.cfg.caps.with_rack_rates(
            egress.as_deref(),
            ingress.as_deref(),
            self.cfg.host_share,
        )?;
        // The config file's caps are the agreed ones (what the rack's agreement was written
        // against); the running ones may already differ after an earlier `cap set`.
        let configured = crate::config::Config::load(&self.cfg.path)
            .map(|f| f.caps)
            .unwrap_or_else(|_| self.cfg.caps.clone());
        for (direction, asked, agreed) in [
            (
                "egress",
                next.rack_egress_bytes_per_s,
                configured.rack_egress_bytes_per_s,
            ),
            (
                "ingress",
                next.rack_ingress_bytes_per_s,
                configured.rack_ingress_bytes_per_s,
            ),
        ] {
            if asked > agreed {
                if !force {
                    return Err(CapSetError::AboveConfigured {
                        direction,
                        asked: crate::units::fmt_rate_decimal(asked),
                        configured: crate::units::fmt_rate_decimal(agreed),
                        path: self.cfg.path.clone(),
                    });
                }
                log::warn!(
                    "cap set --force: rack {direction} {} is above the {} in {} (the agreed cap)",
                    crate::units::fmt_rate_decimal(asked),
                    crate::units::fmt_rate_decimal(agreed),
                    self.cfg.path.display()
                );
            }
        }
        self.cfg.caps = next;
        self.write_caps_from_config()?;
        let persistence = if persist {
            match crate::config_edit::set_caps(
                &self.cfg.path,
                egress.as_deref(),
                ingress.as_deref(),
            ) {
                Ok(()) => Persistence::Written,
                Err(e) => Persistence::Failed(e),
            }
        } else if self.file_holds_running_caps() {
            Persistence::AlreadyInFile
        } else {
            Persistence::NotPersisted
        };
        let persisted = persistence.survives_restart();
        let persist_detail = persistence.detail(&self.cfg.path);
        log::info!("cap set via control socket; {persist_detail}");
        Ok(CapSetOutcome {
            egress_host_bytes_per_s: self.host_cap(Direction::Egress),
            ingress_host_bytes_per_s: self.host_cap(Direction::Ingress),
            generation: self.expected[&Direction::Egress]
                .generation
                .max(self.expected[&Direction::Ingress].generation),
            persisted,
            persist_detail,
        })
    }

    pub(super) fn handle(&mut self, req: Request) -> Response {
        match req {
            Request::Status => match self.status() {
                Ok(s) => Response::Status(Box::new(s)),
                Err(e) => Response::Error {
                    message: e.to_string(),
                },
            },
            Request::CapSet {
                egress,
                ingress,
                persist,
                force,
            } => match self.cap_set(egress, ingress, persist, force) {
                Ok(o) => Response::CapSet(o),
                Err(e) => Response::Error {
                    message: e.to_string(),
                },
            },
            Request::WipeNow => match &self.epoch {
                None => Response::Error {
                    message: "this daemon runs no epoch loop: add an [epoch] section to the configuration".into(),
                },
                Some(h) => match h.commands.send(crate::epoch::EpochCommand::WipeNow) {
                    Ok(()) => Response::WipeNow {
                        state: h.snapshot().map(|s| s.state),
                    },
                    Err(_) => Response::Error {
                        message: "the epoch loop has stopped".into(),
                    },
                },
            },
        }
    }
}
