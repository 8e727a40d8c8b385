//! Network namespace and interface helpers.
//!
//! `ip netns exec` remounts /sys and hides /sys/fs/bpf, so rackwarden enters a namespace with
//! `setns(CLONE_NEWNET)` on `/run/netns/NAME`, staying in the root mount namespace where the
//! pins live. `setns` applies to the calling thread only: call [`enter`] before spawning
//! threads to move the whole process.

use std::{fs::File, path::PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("network namespace `{name}`: cannot open {path}: {source}")]
    Open {
        name: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("network namespace `{name}`: setns failed: {source}")]
    Setns {
        name: String,
        source: std::io::Error,
    },
}

/// Moves the calling thread into the named network namespace.
pub fn enter(name: &str) -> Result<(), NetnsError> {
    let path = PathBuf::from("/run/netns").join(name);
    let f = File::open(&path).map_err(|source| NetnsError::Open {
        name: name.into(),
        path: path.clone(),
        source,
    })?;
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| NetnsError::Setns {
        name: name.into(),
        source: e.into(),
    })
}

/// The interface index of `name` in the current thread's namespace, if it exists.
pub fn ifindex(name: &str) -> Option<u32> {
    nix::net::if_::if_nametoindex(name).ok().filter(|i| *i != 0)
}
