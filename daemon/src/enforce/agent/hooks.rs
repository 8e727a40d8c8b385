//! The hook check, as named steps: restore the config map, restore the refusal program,
//! check (and restore) every hook, keep the guard sealed, settle the agent's state. Every
//! finding is an enforcement gap.

use rackwarden_attest::{evidence::ProtectionState, now_ms};

use super::{Agent, AgentError, AgentState, wanted_caps};
use crate::{
    enforce::gaps::{EnforcementGap, GapKind},
    limiter::{Direction, HookDirection, watch::HookStatus},
};

/// One hook being checked: what a gap found on it records.
struct HookCheck<'a> {
    iface: &'a str,
    dir: Direction,
    last_ok: Option<u64>,
    now: u64,
}

impl HookCheck<'_> {
    fn gap(&self, kind: GapKind, detail: String, restored: bool) -> EnforcementGap {
        EnforcementGap {
            kind,
            interface: Some(self.iface.to_string()),
            direction: Some(self.dir),
            last_verified_at_ms: self.last_ok,
            detected_at_ms: self.now,
            detail,
            restored,
        }
    }
}

impl Agent {
    /// Checks every hook and the config map; restores what it can and records each gap.
    /// `at_start`: a missing attachment is normal on first start (nothing attached yet) but a
    /// gap when the limiter was adopted (it was enforcing before and someone removed it).
    pub fn check_hooks(&mut self, at_start: bool) -> Result<(), AgentError> {
        let now = now_ms();
        // Gap records a full disk held back are written first, in order.
        self.gaps.flush();
        self.restore_config_map(now)?;
        self.restore_refusal(at_start, now);
        let degraded = !self.check_every_hook(at_start, now);
        self.guard.keep_sealed(
            self.cfg.self_protection,
            self.limiter.pins(),
            &self.cfg.interfaces,
            // The TPM is the daemon's alone wherever it quotes with the host's TPM.
            self.cfg.tpm.device_node().as_deref(),
        )?;
        self.settle_state(degraded);
        Ok(())
    }

    /// After a tamper report: the policer's hooks before anything else, because traffic
    /// crosses uncapped from the moment a detach returns until ours is back (what the watch
    /// exists to shorten). The whole check ([`Agent::check_hooks`]) follows at once; it looks
    /// at the hooks again, because restoring the config map may attach a new generation.
    pub fn restore_hooks_first(&mut self) -> Result<(), AgentError> {
        self.check_every_hook(false, now_ms());
        self.check_hooks(false)
    }

    /// [`Agent::check_hook`] on every configured interface, both directions; whether all of
    /// them are enforcing (every hook is checked even after one fails).
    fn check_every_hook(&mut self, at_start: bool, now: u64) -> bool {
        let mut enforcing = true;
        for iface in self.cfg.interfaces.clone() {
            for d in Direction::ALL {
                enforcing &= self.check_hook(&iface, d, at_start, now);
            }
        }
        enforcing
    }

    /// The config map first: a foreign write is undone before anything else.
    fn restore_config_map(&mut self, now: u64) -> Result<(), AgentError> {
        for d in Direction::ALL {
            let want = self.expected[&d];
            let have = self.limiter.maps.config(d)?;
            if have != want {
                // The map is frozen and read-only to programs, so this takes a kernel that
                // ignores both: the restore is a new generation, not a write.
                self.limiter
                    .change_caps(&wanted_caps(&self.cfg), &self.cfg.interfaces)?;
                self.gaps.record(EnforcementGap {
                    kind: GapKind::ConfigChanged,
                    interface: None,
                    direction: Some(d),
                    last_verified_at_ms: None,
                    detected_at_ms: now,
                    detail: format!(
                        "config map held rate {} B/s burst {} gen {} magic {:#x}; restored rate {} B/s burst {} gen {}",
                        have.rate_bytes_per_s, have.burst_bytes, have.generation, have.magic,
                        want.rate_bytes_per_s, want.burst_bytes, want.generation
                    ),
                    restored: true,
                });
            }
        }
        Ok(())
    }

    /// The refusal program: a detach (or an unpinned link) is a gap, and it is reattached.
    fn restore_refusal(&mut self, at_start: bool, now: u64) {
        if !self.refusal_present && at_start {
            return;
        }
        let (state, reattached) = crate::limiter::sockopt::ensure(
            self.limiter.pins(),
            crate::limiter::loader::OBJECT,
            self.cfg.refusal_cgroup.as_deref(),
        );
        if reattached && self.refusal_present {
            self.gaps.record(EnforcementGap {
                kind: GapKind::Detached,
                interface: Some(format!(
                    "cgroup:{}",
                    state.cgroup.clone().unwrap_or_default()
                )),
                direction: None,
                last_verified_at_ms: None,
                detected_at_ms: now,
                detail: "the cgroup/setsockopt refusal program was not attached".into(),
                restored: state.state == ProtectionState::Present,
            });
        }
        self.refusal_present = state.state == ProtectionState::Present;
    }

    /// One hook: inspected, reattached or moved back to first where needed. Returns false
    /// where it could not be inspected or restored (the agent is then degraded).
    fn check_hook(&mut self, iface: &str, d: Direction, at_start: bool, now: u64) -> bool {
        let check = HookCheck {
            iface,
            dir: d,
            last_ok: self.last_ok.get(&(iface.to_string(), d)).copied(),
            now,
        };
        match self.limiter.inspect(iface, d) {
            Err(e) => {
                self.gaps
                    .record(check.gap(GapKind::CheckFailed, e.to_string(), false));
                false
            }
            Ok(hook) if !hook.attached => self.reattach(&check, &hook, at_start),
            Ok(hook) => self.keep_first(&check, &hook),
        }
    }

    /// Our program is not on the hook: attach it, and record a gap unless this is the very
    /// first attach of a fresh start.
    fn reattach(&mut self, f: &HookCheck, hook: &HookStatus, at_start: bool) -> bool {
        let (iface, d) = (f.iface, f.dir);
        let first_attach = at_start && !self.limiter.adopted;
        let restored = match self.limiter.attach(iface, d) {
            Ok(()) => true,
            Err(e) => {
                log::error!(
                    "cannot attach {} to {iface} {}: {e}",
                    d.prog_name(),
                    d.name()
                );
                false
            }
        };
        if !first_attach {
            let ours = d.prog_name();
            let kind = if hook.programs.iter().any(|p| p.name == ours) {
                GapKind::Replaced
            } else {
                GapKind::Detached
            };
            let detail = format!(
                "program #{} not on the hook{}; programs present: {:?}",
                self.limiter.identity(d).id,
                if at_start { " at daemon start" } else { "" },
                hook.programs
            );
            self.gaps.record(f.gap(kind, detail, restored));
        } else if restored {
            log::info!("attached {} to {iface} {}", d.prog_name(), d.name());
        }
        if restored {
            self.last_ok.insert((iface.to_string(), d), f.now);
        }
        restored
    }

    /// Our program is on the hook: foreign programs ahead of it are a gap (once per set of
    /// intruders), and ours is moved back to first. Returns false where the move failed.
    fn keep_first(&mut self, f: &HookCheck, hook: &HookStatus) -> bool {
        let (iface, d) = (f.iface, f.dir);
        let key = (iface.to_string(), d);
        let mut enforcing = true;
        let mut ahead: Vec<u32> = hook.foreign_ahead.iter().map(|p| p.id).collect();
        if !ahead.is_empty() && self.reported_ahead.get(&key) != Some(&ahead) {
            // Restore our place first, then record what was found and whether it worked.
            let moved = match self.limiter.move_first(iface, d) {
                Ok(m) => m,
                Err(e) => {
                    log::error!(
                        "cannot move {} first on {iface} {}: {e}",
                        d.prog_name(),
                        d.name()
                    );
                    enforcing = false;
                    false
                }
            };
            let restored = moved
                && self
                    .limiter
                    .inspect(iface, d)
                    .map(|h| h.enforcing())
                    .unwrap_or(false);
            let detail = format!(
                "programs ahead of ours: {:?}{}",
                hook.foreign_ahead,
                if restored {
                    "; ours moved back to first"
                } else {
                    ""
                }
            );
            self.gaps
                .record(f.gap(GapKind::ForeignAhead, detail, restored));
            if restored {
                ahead.clear();
            }
        }
        if ahead.is_empty() {
            self.reported_ahead.remove(&key);
            self.last_ok.insert(key, f.now);
        } else {
            self.reported_ahead.insert(key, ahead);
        }
        enforcing
    }

    /// Starting ends here too: the first check decides Enforcing or Degraded.
    fn settle_state(&mut self, degraded: bool) {
        if self.state == AgentState::Stopping {
            return;
        }
        let next = if degraded {
            AgentState::Degraded
        } else {
            AgentState::Enforcing
        };
        if next != self.state {
            if next == AgentState::Degraded {
                log::warn!("state: {} -> {}", self.state.name(), next.name());
            } else {
                log::info!("state: {} -> {}", self.state.name(), next.name());
            }
            self.state = next;
        }
    }
}
