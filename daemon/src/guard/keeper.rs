//! Keeping the limiter sealed: the daemon calls [`GuardKeeper::keep_sealed`] after every hook
//! check, which seals the limiter the first time and again whenever its objects changed
//! (new caps or an upgrade load new programs and a new config map).

use rackwarden_attest::evidence::LsmGuard;

use super::{GuardError, Protected, Sealed};
use crate::{config::GuardMode, pins::PinPaths};

/// The guard, as this daemon last left it.
#[derive(Debug)]
enum GuardState {
    /// Not tried yet (before the first hook check).
    Unsealed,
    /// In force over exactly `Sealed::protected`.
    Sealed(Box<Sealed>),
    /// Not in force (why: `guard::report`). `permanent`: this kernel will never take it (no
    /// BPF LSM, or a hook whose arguments are not what the guard reads): not tried again.
    Unavailable { permanent: bool },
}

/// The guard's state across the daemon's checks.
#[derive(Debug)]
pub struct GuardKeeper {
    state: GuardState,
}

impl Default for GuardKeeper {
    fn default() -> Self {
        GuardKeeper {
            state: GuardState::Unsealed,
        }
    }
}

impl GuardKeeper {
    /// Whether a guard is in force (then no tamper watch is needed).
    pub fn is_sealed(&self) -> bool {
        matches!(self.state, GuardState::Sealed(_))
    }

    /// Seals the limiter under `pins` with the guard, or seals it again when its
    /// objects changed since. A failed reseal leaves the previous generation in force over the
    /// objects it names. Fails only where `mode` is `lsm` (the guard is required).
    pub fn keep_sealed(
        &mut self,
        mode: GuardMode,
        pins: &PinPaths,
        interfaces: &[String],
        tpm: Option<&std::path::Path>,
    ) -> Result<(), GuardError> {
        if let GuardMode::Off | GuardMode::Watch = mode {
            super::record(LsmGuard::Unavailable {
                reason: format!(
                    "self_protection = \"{}\" in the config",
                    if mode == GuardMode::Off {
                        "off"
                    } else {
                        "watch"
                    }
                ),
            });
            return Ok(());
        }
        let want = match Protected::of_limiter(pins, interfaces, tpm) {
            Ok(p) => p,
            Err(e) => {
                log::warn!("cannot list what the guard protects: {e}");
                return Ok(());
            }
        };
        match &self.state {
            GuardState::Sealed(s) if s.protected == want => return Ok(()),
            GuardState::Unavailable { permanent: true } => return Ok(()),
            _ => {}
        }
        match super::seal(pins, &want) {
            Ok(s) => self.sealed(s),
            Err(e) if mode == GuardMode::Lsm => return Err(e),
            Err(e) => self.not_sealed(e),
        }
        Ok(())
    }

    fn sealed(&mut self, s: Sealed) {
        log::info!(
            "sealed by the guard ({}): {} objects, {} TPM devices kept for the daemon, hooks {} (bpf hook: {} arguments)",
            s.attach.name(),
            s.objects,
            s.protected.tpm_devs.len(),
            s.hooks.join(", "),
            s.bpf_hook_args
        );
        let holders = super::tpm_holders(&s.protected.tpm_devs);
        if !holders.is_empty() {
            let named: Vec<String> = holders
                .iter()
                .map(|h| format!("pid {} ({}) fd {}", h.pid, h.comm, h.fd))
                .collect();
            log::warn!(
                "the TPM is not the daemon's alone: {} opened before the guard sealed and still hold it, and can quote with the daemon's AK; statements count them (tpm_held_elsewhere) until they close it; restart them after the daemon, or stop them (a TPM resource manager such as tpm2-abrmd)",
                named.join(", ")
            );
        }
        super::record_keeping(
            LsmGuard::Sealed {
                attach: s.attach,
                hooks: s.hooks.clone(),
                bpf_hook_args: s.bpf_hook_args,
                objects: s.objects,
                refusals: 0,
                tpm_devices: s.protected.tpm_devs.len() as u32,
                tpm_held_elsewhere: holders.len() as u32,
            },
            s.protected.tpm_devs.clone(),
        );
        self.state = GuardState::Sealed(Box::new(s));
    }

    fn not_sealed(&mut self, e: GuardError) {
        let permanent = matches!(
            e,
            GuardError::Refused { .. } | GuardError::Unsupported { .. } | GuardError::Btf(_)
        );
        let reason = if self.is_sealed() {
            format!(
                "sealing again failed ({e}); the previous guard still refuses for the objects it names"
            )
        } else {
            e.to_string()
        };
        log::warn!("guard not in force: {reason}");
        super::record(LsmGuard::Unavailable { reason });
        self.state = GuardState::Unavailable { permanent };
    }
}
