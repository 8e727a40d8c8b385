//! Hands the sampler's key to the workloads: `sampling-key.json` beside the control socket
//! (`/run/rackwarden/`), world-readable (the key is not secret: it is the verifier's nonce of
//! the previous statement, which every statement publishes; what matters is that the host
//! could not choose it). Rewritten, whole, when a statement is appended, and at start. A
//! serving stack reads it and derives each request's seed from it
//! (`rackwarden_sampler::request_seed`, `docs/sampler.md`).

use std::path::{Path, PathBuf};

use rackwarden_attest::{
    evidence_log::ChainTip,
    sampling_key::{SamplingKey, genesis_sampling_key},
};

/// `sampling-key.json` in the directory of `control_socket`.
pub fn path(control_socket: &Path) -> PathBuf {
    control_socket
        .parent()
        .unwrap_or_else(|| Path::new("/"))
        .join("sampling-key.json")
}

/// The key the requests after `tip` use.
pub fn after(tip: Option<&ChainTip>) -> SamplingKey {
    tip.map_or_else(genesis_sampling_key, |t| t.next_sampling_key)
}

/// Writes `key` to `path`, replacing it whole (a reader never sees half a key). A failure is
/// logged: serving goes on, and a replay of requests seeded otherwise fails at the verifier.
pub fn publish(path: &Path, key: &SamplingKey) {
    let written = serde_json::to_vec(key)
        .map_err(|e| e.to_string())
        .and_then(|b| crate::atomic_file::replace(path, &b).map_err(|e| e.to_string()));
    match written {
        Ok(()) => log::debug!(
            "sampling key for epoch {} in {}",
            key.epoch_seq,
            path.display()
        ),
        Err(e) => log::error!(
            "the sampling key for epoch {} cannot be written to {}: {e}",
            key.epoch_seq,
            path.display()
        ),
    }
}
