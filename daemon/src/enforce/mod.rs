//! Enforcement: the agent's state machine ([`agent`]: load or adopt the policer, attach it,
//! check every hook, restore what was tampered with, serve the control socket) and the
//! enforcement gaps it records ([`gaps`]); the signals that stop and reload it ([`signals`]).

pub mod agent;
pub mod gaps;
pub mod signals;
