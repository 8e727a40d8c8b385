//! What a statement says of its epoch's traffic when the host runs the tap: the committed
//! summary and whether the records are kept for openings, or why the epoch could not be
//! committed. A statement without it comes from a host without `[taps]` (or a daemon older
//! than the tap).

use serde::{Deserialize, Serialize};

use super::TrafficSummary;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", deny_unknown_fields)]
pub enum TrafficReport {
    /// The epoch's records are committed by `summary.root`.
    Committed {
        summary: Box<TrafficSummary>,
        spool: SpoolState,
    },
    /// The tap runs but this epoch could not be committed (the reader thread failed, the
    /// counters could not be read): nothing of the epoch's traffic is checkable.
    Failed { reason: String },
}

/// Whether the host kept the epoch's records and their bytes, so that it can open them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", deny_unknown_fields)]
pub enum SpoolState {
    Kept {
        bytes: u64,
    },
    /// Not kept (larger than the spool, or the disk refused it): no record of this epoch can
    /// be opened, and the statement says why.
    NotKept {
        reason: String,
    },
}

impl TrafficReport {
    pub fn summary(&self) -> Option<&TrafficSummary> {
        match self {
            TrafficReport::Committed { summary, .. } => Some(summary),
            TrafficReport::Failed { .. } => None,
        }
    }
}
