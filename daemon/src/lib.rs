//! rackwarden: keeps a rack in inference-only mode and proves it.
//!
//! This library holds the daemon's logic; `rackwardend` and `rackwarden` are thin binaries.
//! Where things live:
//! - a packet is dropped: `ebpf/src/main.rs` (the only drop point), loaded by [`limiter`];
//! - pin paths and state file paths: [`pins`]; caps and units: [`config`], [`units`];
//! - the enforcement state machine: [`enforce::agent`]; enforcement gaps: [`enforce::gaps`];
//! - what statements report of the limiter and the bypass surface: [`host_evidence`];
//! - the epoch loop (challenge, drain, wipe, stage, sign, deliver): [`epoch`];
//! - the control socket: [`control`]; what `status` shows: [`status`]; Prometheus: [`metrics`].

pub mod atomic_file;
pub mod bpf_syscall;
pub mod config;
pub mod config_edit;
pub mod control;
pub mod enforce;
pub mod epoch;
pub use rackwarden_attest::error_chain::error_chain;
pub mod guard;
pub mod host_evidence;
pub mod images;
pub mod limiter;
pub mod lsm;
pub mod metrics;
pub mod netns;
pub mod notify;
pub mod pins;
pub mod progress;
pub mod status;
pub mod storage;
pub mod taps;
pub mod tpm;
pub use rackwarden_attest::units;
pub mod wipe;
