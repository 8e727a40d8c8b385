//! What the agent reports: the `status` answer (caps, counters, recent rates, hooks, gaps,
//! the epoch loop) and the one-line STATUS= systemd shows.

use super::{Agent, AgentError};
use crate::{
    limiter::{Direction, HookDirection},
    status::{DirectionStatus, StatusReport},
};

impl Agent {
    /// The one-line STATUS= systemd shows: enforcement state and the epoch loop's state.
    pub(super) fn notify_status(&self) -> String {
        let mut s = self.state.name().to_string();
        if let Some(e) = self.epoch.as_ref().and_then(|h| h.snapshot()) {
            s += &format!("; epoch: {}", e.state.name());
            if let Some(l) = &e.last_epoch {
                s += &format!(" (last seq {})", l.seq);
            }
            s += &format!("; undelivered: {}", e.delivery.backlog);
        }
        s
    }

    pub fn status(&self) -> Result<StatusReport, AgentError> {
        let mut directions = Vec::new();
        let (first, last) = (self.samples.front(), self.samples.back());
        for d in Direction::ALL {
            let cfg = self.limiter.maps.config(d)?;
            let counters = self.limiter.maps.counters(d)?;
            let idx = d.index() as usize;
            let (mut pr, mut dr, mut win) = (None, None, 0.0);
            if let (Some((t0, c0)), Some((t1, c1))) = (first, last) {
                let dt = t1.duration_since(*t0).as_secs_f64();
                if dt > 0.0 {
                    // Saturating: a rewound counter is a gap (see `sample`), not a panic.
                    pr =
                        Some(c1[idx].passed_bytes.saturating_sub(c0[idx].passed_bytes) as f64 / dt);
                    dr = Some(
                        c1[idx].dropped_bytes.saturating_sub(c0[idx].dropped_bytes) as f64 / dt,
                    );
                    win = dt;
                }
            }
            directions.push(DirectionStatus {
                direction: d,
                rack_cap_bytes_per_s: self.cfg.caps.rack_bytes_per_s(d),
                host_cap_bytes_per_s: cfg.rate_bytes_per_s,
                burst_bytes: cfg.burst_bytes,
                config_generation: cfg.generation,
                counters: crate::status::counters_json(counters),
                recent_passed_bytes_per_s: pr,
                recent_dropped_bytes_per_s: dr,
                recent_window_s: win,
            });
        }
        let mut hooks = Vec::new();
        for i in &self.cfg.interfaces {
            for d in Direction::ALL {
                hooks.push(self.limiter.inspect(i, d)?);
            }
        }
        let n = self.gaps.gaps.len();
        Ok(StatusReport {
            rack_id: self.cfg.rack_id.clone(),
            host_id: self.cfg.host_id.clone(),
            host_share: self.cfg.host_share,
            agent_state: self.state.name().into(),
            attach_kind: self.limiter.kind,
            pin_root: self.limiter.pins().root().display().to_string(),
            programs: self.limiter.identities(),
            map_ids: self.limiter.maps.ids,
            directions,
            hooks,
            gaps_total: n,
            gaps_unpersisted: self.gaps.unpersisted(),
            recent_gaps: self.gaps.gaps[n.saturating_sub(20)..].to_vec(),
            bypass: crate::host_evidence::bypass::bypass_report(&self.cfg, self.limiter.pins()),
            epoch: self.epoch.as_ref().and_then(|h| h.snapshot()),
            reload_error: self.reload_error.clone(),
            program_version: Some(self.limiter.version.clone()),
            self_protection: Some(crate::limiter::protection::assess(
                self.limiter.pins(),
                self.cfg.check_interval,
            )),
        })
    }
}
