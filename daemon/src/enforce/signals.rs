//! The daemon's signals: SIGTERM/SIGINT ask [`super::agent::Agent::run`] to stop, SIGHUP to
//! reload the configuration. The handlers only set flags that the agent loop polls.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
static RELOAD: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

extern "C" fn on_reload_signal(_: libc::c_int) {
    RELOAD.store(true, Ordering::SeqCst);
}

/// Sets `handler` for `sig`; a failure is logged (it can only be an invalid signal).
fn set_handler(sig: nix::sys::signal::Signal, handler: extern "C" fn(libc::c_int)) {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet};
    let action = SigAction::new(
        SigHandler::Handler(handler),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handlers only store to an atomic, which is async-signal-safe.
    if let Err(e) = unsafe { nix::sys::signal::sigaction(sig, &action) } {
        log::error!("cannot install the {sig} handler: {e}");
    }
}

/// Installs the SIGHUP handler that asks [`super::agent::Agent::run`] to reload the
/// configuration.
pub fn reload_on_sighup() {
    set_handler(nix::sys::signal::Signal::SIGHUP, on_reload_signal);
}

/// Whether a SIGHUP came since the last call (and forgets it).
pub(crate) fn take_reload() -> bool {
    RELOAD.swap(false, Ordering::SeqCst)
}

/// Installs SIGTERM/SIGINT handlers that ask [`super::agent::Agent::run`] to stop, and
/// returns the flag.
pub fn stop_on_signals() -> &'static AtomicBool {
    set_handler(nix::sys::signal::Signal::SIGTERM, on_stop_signal);
    set_handler(nix::sys::signal::Signal::SIGINT, on_stop_signal);
    &STOP
}
