//! The limiter as userspace sees it: the pinned eBPF policer, its maps, and its attachments.
//!
//! - [`maps`]: read and write caps, bucket state and counters in the pinned maps.
//! - [`loader`]: load the embedded object (or adopt what is already pinned) and attach it.
//! - [`exclusive`]: one policer per interface (another daemon's refuses our start).
//! - [`watch`]: check that each attachment is still ours and first; report enforcement gaps.
//! - [`protection`]: what stops another root process here, path by path.

pub mod exclusive;
pub mod loader;
pub mod maps;
pub mod protection;
pub mod sockopt;
pub mod tamper_watch;
pub mod tcdump;
pub mod watch;

pub use loader::{AttachKind, Limiter, ProgramIdentity};
pub use maps::LimiterMaps;

use rackwarden_common::{DIR_EGRESS, DIR_INGRESS};

pub use rackwarden_attest::evidence::Direction;

/// What the limiter needs to know about a direction: its map slot, its program, its tc hook.
pub trait HookDirection {
    fn index(self) -> u32;
    fn prog_name(self) -> &'static str;
    fn tc(self) -> aya::programs::TcAttachType;
}

impl HookDirection for Direction {
    fn index(self) -> u32 {
        match self {
            Direction::Egress => DIR_EGRESS,
            Direction::Ingress => DIR_INGRESS,
        }
    }
    fn prog_name(self) -> &'static str {
        match self {
            Direction::Egress => rackwarden_common::prog_names::EGRESS,
            Direction::Ingress => rackwarden_common::prog_names::INGRESS,
        }
    }
    fn tc(self) -> aya::programs::TcAttachType {
        match self {
            Direction::Egress => aya::programs::TcAttachType::Egress,
            Direction::Ingress => aya::programs::TcAttachType::Ingress,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LimiterError {
    #[error("bpffs pin root {path}: {source}")]
    PinDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("loading the eBPF policer: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("eBPF program `{name}`: {source}")]
    Program {
        name: String,
        source: aya::programs::ProgramError,
    },
    #[error("pinning {path}: {source} ({})", std::error::Error::source(source).map(|e| e.to_string()).unwrap_or_default())]
    Pin {
        path: std::path::PathBuf,
        source: aya::pin::PinError,
    },
    #[error("pinned map {path}: {source}")]
    Map {
        path: std::path::PathBuf,
        source: aya::maps::MapError,
    },
    #[error("map {name}: {source}")]
    MapAccess {
        name: &'static str,
        source: aya::maps::MapError,
    },
    #[error("attaching {prog} to {iface} {dir}: {detail}")]
    Attach {
        prog: String,
        iface: String,
        dir: &'static str,
        detail: String,
    },
    #[error("querying attachments of {iface} {dir}: {detail}")]
    Query {
        iface: String,
        dir: &'static str,
        detail: String,
    },
    #[error("the embedded policer object has no program `{0}`")]
    MissingProgram(String),
    #[error("the embedded policer object has no map `{0}`")]
    MissingMap(&'static str),
    #[error("freezing map {name} (BPF_MAP_FREEZE): {detail}")]
    Freeze { name: &'static str, detail: String },
}
