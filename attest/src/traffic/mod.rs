//! The traffic commitment: which record covers each tapped byte of an epoch, fixed before
//! anyone knows which bytes will be asked about. The byte-level specification, for auditors,
//! is `docs/traffic-format.md`.
//!
//! 1. At epoch close the daemon partitions every frame byte its tap saw, per direction, into
//!    *records* ([`TrafficLeaf`]): an HTTP exchange on a TCP connection, the leftover bytes of
//!    such a connection ([`RecordKind::Partial`]), or a raw flow per 5-tuple. Each record
//!    carries its frame bytes in the epoch per direction ([`TrafficLeaf::wire`]), as the
//!    kernel charged them.
//! 2. The records, in the host's order, are the leaves of a Merkle *sum* tree ([`SumTree`],
//!    RFC 6962 shape): every node commits its children's hashes and byte counts per
//!    direction, so the root ([`TrafficRoot`]) fixes each leaf's byte range in each direction
//!    (leaf `i` covers the bytes after all leaves before it).
//! 3. After storing the root, the verifier draws 32 random bytes and derives `k` offsets per
//!    direction, uniform over the epoch's bytes ([`sample_offsets`]).
//! 4. The host opens the leaf covering each offset ([`SumTree::locate`], [`SumTree::open`]);
//!    the verifier checks it ([`verify_opening`]; [`Opening::check`] for an opening as sent,
//!    with the record's bytes). The left siblings' byte counts place the
//!    leaf, so no other record, however its stream offsets are drawn, can be opened for that
//!    offset: the host cannot choose what is looked at.
//!
//! What a statement says of the epoch's traffic besides the root (the kernel's counts, the
//! tap's drops, the bytes held across the cut) is [`TrafficSummary`].
//!
//! Everything here is pure: no I/O, no clock, no randomness of its own.

mod leaf;
mod openings;
mod report;
mod sample;
mod sum_tree;
mod summary;
mod wire;
/// `[u8; 32]` as 64 hex digits in JSON, for the other wire types of this crate.
pub(crate) use wire::hex32 as hex32_wire;

pub use leaf::{FlowKey, LEAF_DOMAIN, LEAF_LEN, RecordKind, StreamPart, TrafficLeaf};
pub use openings::{
    CheckedRecord, EpochOpenings, OPENINGS_PAYLOAD_TYPE, OpenedRecord, OpeningsOutcome,
    OpeningsReceipt, OpeningsRef, OpeningsRefused, SampleDemand, raw_flows,
};
pub use report::{SpoolState, TrafficReport};
pub use sample::{SAMPLE_DOMAIN, sample_offsets};
pub use sum_tree::{
    EMPTY_DOMAIN, NODE_DOMAIN, OpeningError, SumPath, SumSibling, SumTree, TrafficRoot, empty_root,
    node_hash, verified_ranges, verify_opening,
};
pub use summary::{DropCount, EpochStart, Opening, SummaryError, TapDrops, TrafficSummary};

use crate::evidence::Direction;

/// What can go wrong building a commitment: only arithmetic, which is checked rather than
/// wrapped (a wrapped count would commit to byte ranges the host never saw).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrafficError {
    #[error("the epoch's {} bytes overflow a u64 at record {index}", .dir.name())]
    SumOverflow { dir: Direction, index: u64 },
}

/// The index of `d` in the `[u64; 2]` per-direction arrays of this module: egress 0,
/// ingress 1 (also the direction byte of the sampling derivation).
pub fn idx(d: Direction) -> usize {
    match d {
        Direction::Egress => 0,
        Direction::Ingress => 1,
    }
}
