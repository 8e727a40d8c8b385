//! Whether the epoch and delivery loops live: the agent pings systemd's watchdog only while
//! they do, so a stuck loop gets the daemon restarted.

use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use rackwarden_attest::now_ms;

use super::Agent;

/// What the agent last told systemd, and how the epoch loops looked then.
pub(super) struct SystemdNotice {
    watchdog: Option<Duration>,
    last_status: String,
    /// The wipe's progress counter and when it last moved.
    last_progress: (u64, Instant),
}

impl SystemdNotice {
    pub(super) fn new() -> SystemdNotice {
        SystemdNotice {
            watchdog: crate::notify::watchdog_interval(),
            last_status: String::new(),
            last_progress: (0, Instant::now()),
        }
    }

    /// A third of the watchdog interval, at most a second.
    pub(super) fn ping_every(&self) -> Duration {
        self.watchdog.map_or(Duration::from_secs(1), |w| {
            (w / 3).min(Duration::from_secs(1))
        })
    }
}

impl Agent {
    /// STATUS= when it changed, and the watchdog ping. The ping comes from the agent loop,
    /// and only while the epoch loops live too: a stuck loop stops the pings and systemd
    /// restarts us.
    pub(super) fn tell_systemd(&self, notice: &mut SystemdNotice) {
        let st = self.notify_status();
        if st != notice.last_status {
            crate::notify::status(&st);
            notice.last_status = st;
        }
        if let Some(w) = notice.watchdog {
            if self.loops_alive(w, &mut notice.last_progress) {
                crate::notify::watchdog_ping();
            } else {
                log::error!(
                    "an epoch or delivery loop shows no sign of life: not pinging the watchdog"
                );
            }
        }
    }

    /// Whether the epoch and delivery loops have shown signs of life within `limit`
    /// (a wipe counts as alive while its progress counter moves).
    fn loops_alive(&self, limit: Duration, last_progress: &mut (u64, Instant)) -> bool {
        let Some(h) = &self.epoch else { return true };
        let now = now_ms();
        let lim = limit.as_millis() as u64;
        let p = h.wipe_progress.load(Ordering::SeqCst);
        if p != last_progress.0 {
            *last_progress = (p, Instant::now());
        }
        let (challenge_ms, request_ms) = self.cfg.epoch.as_ref().map_or((0, 0), |e| {
            (
                e.challenge_timeout.as_millis() as u64,
                e.verifier.request_timeout.as_millis() as u64,
            )
        });
        let since_beat = now.saturating_sub(h.epoch_heartbeat_ms.load(Ordering::SeqCst));
        let busy_ok = match h.snapshot().map(|s| s.state) {
            Some(crate::epoch::EpochState::Wiping { .. }) => last_progress.1.elapsed() < limit,
            // Waiting for the verifier's nonce is bounded by challenge_timeout.
            Some(crate::epoch::EpochState::Challenging { .. }) => since_beat < challenge_ms + lim,
            // Draining waits for `systemctl stop` (bounded by stop_timeout) and staging
            // hashes the images: give them an hour before calling them stuck.
            Some(crate::epoch::EpochState::Draining { .. })
            | Some(crate::epoch::EpochState::Restarting { .. })
            | Some(crate::epoch::EpochState::Staging { .. }) => since_beat < 3_600_000,
            _ => false,
        };
        let epoch_ok = busy_ok || since_beat < lim;
        // Delivery blocks at most one request timeout per attempt.
        let delivery_ok =
            now.saturating_sub(h.delivery_heartbeat_ms.load(Ordering::SeqCst)) < lim + request_ms;
        epoch_ok && delivery_ok
    }
}
