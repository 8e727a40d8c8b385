//! systemd notifications (`Type=notify`): READY once every hook enforces, STATUS= lines with
//! the states, WATCHDOG=1 pings from the agent loop. Outside systemd (no `NOTIFY_SOCKET`)
//! each call does nothing.

use std::time::Duration;

use sd_notify::NotifyState;

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(false, states) {
        log::debug!("sd_notify: {e}");
    }
}

pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

pub fn reloading() {
    send(&[NotifyState::Reloading]);
}

pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

pub fn watchdog_ping() {
    send(&[NotifyState::Watchdog]);
}

/// The watchdog timeout systemd set for us (`WatchdogSec=`), if any.
pub fn watchdog_interval() -> Option<Duration> {
    let mut usec = 0u64;
    sd_notify::watchdog_enabled(false, &mut usec).then(|| Duration::from_micros(usec))
}
