//! The Merkle sum tree over an epoch's records, its openings, and their check.
//!
//! A node is a hash and two byte counts (egress, ingress); a parent hashes both children's
//! hashes *and counts*, and its counts are their sums. The shape is RFC 6962's (the left
//! subtree of `n` leaves holds the largest power of two strictly below `n`), so the tree is
//! defined for any `n` and an auditor can rebuild it with a short recursion.
//!
//! Why the counts make the opening binding: a byte offset in a direction walks down from the
//! root, left if it is below the left child's count, right (minus that count) otherwise; the
//! committed counts fix which leaf it reaches. [`verify_opening`] recomputes the offset at
//! which the opened leaf starts from the counts of the siblings on its left, which are bound
//! into the root hash, so a host presenting another leaf for an offset fails either the hash
//! or the range check.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::{TrafficError, TrafficLeaf, idx, wire};
use crate::{Digest, Sha3_256, evidence::Direction};

/// The first bytes of every interior node's hash input (`rackwarden/traffic-node/v1`, NUL).
pub const NODE_DOMAIN: &[u8] = b"rackwarden/traffic-node/v1\0";

/// The whole hash input of an empty epoch's root (`rackwarden/traffic-empty/v1`, NUL).
pub const EMPTY_DOMAIN: &[u8] = b"rackwarden/traffic-empty/v1\0";

/// What the host commits to for an epoch's traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficRoot {
    /// The root node's hash (the leaf hash when there is one record).
    #[serde(with = "wire::hex32")]
    pub sha3_256: [u8; 32],
    /// Per direction (egress, ingress), the epoch's tapped frame bytes: the root's counts.
    #[serde(with = "wire::per_dir")]
    pub bytes: [u64; 2],
    /// The number of records (leaves).
    pub records: u64,
}

/// A node of the tree: its hash and its subtree's bytes per direction (egress, ingress). In a
/// [`SumPath`], the sibling of a node on the way from the leaf to the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SumSibling {
    #[serde(with = "wire::hex32")]
    pub sha3_256: [u8; 32],
    #[serde(with = "wire::per_dir")]
    pub bytes: [u64; 2],
}

/// The opening of one record: its index, the tree size, and the siblings bottom-up (the
/// leaf's sibling first, the root's child last).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SumPath {
    pub index: u64,
    /// The tree size (number of records).
    pub leaves: u64,
    pub siblings: Vec<SumSibling>,
}

/// Why an opening is refused. Each variant names what does not hold. The last four are
/// [`Opening::check`](super::Opening::check)'s, on top of [`verify_opening`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpeningError {
    #[error("the path is for a tree of {path} records; the root commits to {root}")]
    TreeSize { path: u64, root: u64 },
    #[error("record {index} is not in a tree of {leaves} records")]
    IndexOutOfRange { index: u64, leaves: u64 },
    #[error("a path to this record has {expected} siblings; this one has {got}")]
    PathLength { expected: usize, got: usize },
    #[error("the byte counts along the path overflow a u64")]
    Overflow,
    #[error(
        "the record and its path lead to root {}, not the committed {}",
        hex::encode(.got),
        hex::encode(.expected)
    )]
    HashMismatch { expected: [u8; 32], got: [u8; 32] },
    #[error("the path adds up to {got} {} bytes; the root commits to {expected}", .dir.name())]
    SumMismatch {
        dir: Direction,
        expected: u64,
        got: u64,
    },
    #[error("offset {offset} is beyond the epoch's {bytes} {} bytes", .dir.name())]
    OffsetBeyondEpoch {
        dir: Direction,
        offset: u64,
        bytes: u64,
    },
    #[error(
        "offset {offset} is not in the opened record's bytes {start}..{end}: the tree places another record there"
    )]
    OffsetOutside { offset: u64, start: u64, end: u64 },
    #[error("the opening is for epoch {got}; the verifier asked about epoch {expected}")]
    Epoch { expected: u64, got: u64 },
    #[error("the {which} bytes are not standard base64 with padding: {detail}")]
    Base64 { which: &'static str, detail: String },
    #[error("the record has {expected} {which} bytes; the opening carries {got}")]
    BytesLength {
        which: &'static str,
        expected: u64,
        got: u64,
    },
    #[error("the {which} bytes do not have the record's SHA3-256 digest")]
    BytesDigest { which: &'static str },
}

/// The hash of an interior node: SHA3-256 of [`NODE_DOMAIN`], then for the left child and
/// then the right child its hash, its egress count and its ingress count (u64 big-endian).
pub fn node_hash(left: &SumSibling, right: &SumSibling) -> [u8; 32] {
    let mut h = Sha3_256::new();
    h.update(NODE_DOMAIN);
    for c in [left, right] {
        h.update(c.sha3_256);
        h.update(c.bytes[0].to_be_bytes());
        h.update(c.bytes[1].to_be_bytes());
    }
    h.finalize().into()
}

/// The parent of two nodes; `Err` names the direction whose sum overflows.
fn parent(left: &SumSibling, right: &SumSibling) -> Result<SumSibling, Direction> {
    let mut bytes = [0u64; 2];
    for d in Direction::ALL {
        let i = idx(d);
        bytes[i] = left.bytes[i].checked_add(right.bytes[i]).ok_or(d)?;
    }
    Ok(SumSibling {
        sha3_256: node_hash(left, right),
        bytes,
    })
}

/// The root of an epoch without records: SHA3-256 of [`EMPTY_DOMAIN`], no bytes.
pub fn empty_root() -> TrafficRoot {
    TrafficRoot {
        sha3_256: Sha3_256::digest(EMPTY_DOMAIN).into(),
        bytes: [0, 0],
        records: 0,
    }
}

/// An epoch's tree, held whole (about 100 bytes per record) so that the host can open any
/// record the verifier asks for.
#[derive(Debug, Clone)]
pub struct SumTree {
    /// `levels[0]` is the leaves' nodes; each next level pairs the one below left to right,
    /// carrying an unpaired last node up unchanged. This builds exactly the RFC 6962 tree
    /// (the tests hold it to the recursive split).
    levels: Vec<Vec<SumSibling>>,
    /// Per direction, `ends[d][i]`: where leaf `i`'s bytes end (the sum of leaves `0..=i`).
    ends: [Vec<u64>; 2],
    root: TrafficRoot,
}

impl SumTree {
    /// The tree of `leaves`, in that order. Fails only when a count overflows a u64.
    pub fn build(leaves: &[TrafficLeaf]) -> Result<SumTree, TrafficError> {
        let mut nodes = Vec::with_capacity(leaves.len());
        let mut ends = [
            Vec::with_capacity(leaves.len()),
            Vec::with_capacity(leaves.len()),
        ];
        let mut total = [0u64; 2];
        for (i, leaf) in leaves.iter().enumerate() {
            let bytes = leaf.wire_bytes_both();
            for d in Direction::ALL {
                let j = idx(d);
                total[j] = total[j]
                    .checked_add(bytes[j])
                    .ok_or(TrafficError::SumOverflow {
                        dir: d,
                        index: i as u64,
                    })?;
                ends[j].push(total[j]);
            }
            nodes.push(SumSibling {
                sha3_256: leaf.leaf_hash(),
                bytes,
            });
        }
        let mut levels = vec![nodes];
        while let Some(below) = levels.last().filter(|l| l.len() > 1) {
            let mut up = Vec::with_capacity(below.len().div_ceil(2));
            for pair in below.chunks(2) {
                match pair {
                    [l, r] => up.push(parent(l, r).map_err(|dir| {
                        // Unreachable: every node's counts are a range of the totals above.
                        TrafficError::SumOverflow {
                            dir,
                            index: leaves.len() as u64,
                        }
                    })?),
                    [only] => up.push(*only),
                    _ => {}
                }
            }
            levels.push(up);
        }
        let root = match levels.last().and_then(|l| l.first()) {
            Some(top) if !leaves.is_empty() => TrafficRoot {
                sha3_256: top.sha3_256,
                bytes: top.bytes,
                records: leaves.len() as u64,
            },
            _ => empty_root(),
        };
        Ok(SumTree { levels, ends, root })
    }

    /// What the host commits to.
    pub fn root(&self) -> TrafficRoot {
        self.root
    }

    /// The number of records.
    pub fn len(&self) -> usize {
        self.ends[0].len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of `dir` that leaf `index` covers: from the end of the leaves before it to
    /// its own end (empty for a leaf with no bytes in `dir`).
    pub fn range(&self, dir: Direction, index: usize) -> Option<Range<u64>> {
        let ends = &self.ends[idx(dir)];
        let end = *ends.get(index)?;
        let start = match index.checked_sub(1) {
            Some(before) => *ends.get(before)?,
            None => 0,
        };
        Some(start..end)
    }

    /// The leaf whose bytes in `dir` cover `offset`; `None` when `offset` is at or past the
    /// epoch's bytes in `dir`. A leaf with no bytes in `dir` is never the answer.
    pub fn locate(&self, dir: Direction, offset: u64) -> Option<usize> {
        let ends = &self.ends[idx(dir)];
        let i = ends.partition_point(|&end| end <= offset);
        (i < ends.len()).then_some(i)
    }

    /// The opening of leaf `index`: its siblings bottom-up.
    pub fn open(&self, index: usize) -> Option<SumPath> {
        if index >= self.len() {
            return None;
        }
        let mut siblings = Vec::new();
        let mut at = index;
        for level in &self.levels[..self.levels.len().saturating_sub(1)] {
            let sibling = if at % 2 == 1 {
                level.get(at - 1)
            } else {
                level.get(at + 1)
            };
            // No sibling: the last node of an odd level is carried up as it is.
            if let Some(s) = sibling {
                siblings.push(*s);
            }
            at /= 2;
        }
        Some(SumPath {
            index: index as u64,
            leaves: self.len() as u64,
            siblings,
        })
    }
}

/// Which side of the path a sibling is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Left,
    Right,
}

/// The sides of the siblings of leaf `index` in a tree of `leaves` (index < leaves), bottom-up,
/// from the RFC 6962 split alone: at a subtree of `n > 1` leaves the left part holds
/// `k` = the largest power of two below `n`; a leaf in the left part has its sibling on the
/// right, and the other way round.
fn sides(mut index: u64, mut leaves: u64) -> Vec<Side> {
    let mut out = Vec::new();
    while leaves > 1 {
        let k = 1u64 << (63 - (leaves - 1).leading_zeros());
        if index < k {
            out.push(Side::Right);
            leaves = k;
        } else {
            out.push(Side::Left);
            index -= k;
            leaves -= k;
        }
    }
    out.reverse();
    out
}

/// Checks that `leaf`, with `path`, is the record of the tree committed by `root` whose bytes
/// in `dir` cover `offset`. In order:
///
/// 1. the path's tree size is the root's record count, and its index is in the tree;
/// 2. the path has as many siblings as the RFC 6962 split of that size puts above that index;
/// 3. folding the leaf (its hash, its `wire` bytes per direction) with the siblings, each on
///    the side the split says, gives the root's hash, and the root's byte counts;
/// 4. `offset` is below the root's bytes in `dir`;
/// 5. the leaf's bytes in `dir` start at the sum of the `dir` bytes of the siblings on its
///    left, and `offset` is in `start .. start + leaf.wire_bytes(dir)`.
///
/// The verifier must also check that `leaf.epoch_seq` is the epoch it asked about.
pub fn verify_opening(
    root: &TrafficRoot,
    leaf: &TrafficLeaf,
    path: &SumPath,
    dir: Direction,
    offset: u64,
) -> Result<(), OpeningError> {
    let ranges = verified_ranges(root, leaf, path)?;
    let total = root.bytes[idx(dir)];
    if offset >= total {
        return Err(OpeningError::OffsetBeyondEpoch {
            dir,
            offset,
            bytes: total,
        });
    }
    let Range { start, end } = ranges[idx(dir)].clone();
    if !(start..end).contains(&offset) {
        return Err(OpeningError::OffsetOutside { offset, start, end });
    }
    Ok(())
}

/// Checks 1 to 3 of [`verify_opening`] (the leaf and its path lead to `root`) and returns
/// the leaf's byte range in each direction (egress, ingress), which the left siblings' byte
/// counts fix: the bytes of the epoch only this record can be opened for.
pub fn verified_ranges(
    root: &TrafficRoot,
    leaf: &TrafficLeaf,
    path: &SumPath,
) -> Result<[Range<u64>; 2], OpeningError> {
    if path.leaves != root.records {
        return Err(OpeningError::TreeSize {
            path: path.leaves,
            root: root.records,
        });
    }
    if path.index >= path.leaves {
        return Err(OpeningError::IndexOutOfRange {
            index: path.index,
            leaves: path.leaves,
        });
    }
    let sides = sides(path.index, path.leaves);
    if path.siblings.len() != sides.len() {
        return Err(OpeningError::PathLength {
            expected: sides.len(),
            got: path.siblings.len(),
        });
    }
    let weight = leaf.wire_bytes_both();
    let mut node = SumSibling {
        sha3_256: leaf.leaf_hash(),
        bytes: weight,
    };
    let mut start = [0u64; 2];
    for (sibling, side) in path.siblings.iter().zip(sides) {
        node = match side {
            Side::Left => {
                for d in Direction::ALL {
                    let i = idx(d);
                    start[i] = start[i]
                        .checked_add(sibling.bytes[i])
                        .ok_or(OpeningError::Overflow)?;
                }
                parent(sibling, &node)
            }
            Side::Right => parent(&node, sibling),
        }
        .map_err(|_| OpeningError::Overflow)?;
    }
    if node.sha3_256 != root.sha3_256 {
        return Err(OpeningError::HashMismatch {
            expected: root.sha3_256,
            got: node.sha3_256,
        });
    }
    for d in Direction::ALL {
        let (expected, got) = (root.bytes[idx(d)], node.bytes[idx(d)]);
        if expected != got {
            return Err(OpeningError::SumMismatch {
                dir: d,
                expected,
                got,
            });
        }
    }
    let range = |i: usize| -> Result<Range<u64>, OpeningError> {
        let end = start[i]
            .checked_add(weight[i])
            .ok_or(OpeningError::Overflow)?;
        Ok(start[i]..end)
    };
    Ok([range(0)?, range(1)?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traffic::{FlowKey, RecordKind, StreamPart};

    fn leaf(i: u64, egress: u64, ingress: u64) -> TrafficLeaf {
        TrafficLeaf {
            epoch_seq: 1,
            kind: RecordKind::RawFlow,
            flow: FlowKey {
                proto: 17,
                local: "10.0.0.2:53".parse().unwrap(),
                remote: format!("10.0.1.{}:4000", i % 250).parse().unwrap(),
            },
            input: StreamPart {
                offset: 0,
                len: ingress,
                sha3_256: [i as u8; 32],
            },
            output: StreamPart {
                offset: 0,
                len: egress,
                sha3_256: [!(i as u8); 32],
            },
            wire: [egress, ingress],
        }
    }

    /// The tree by the RFC 6962 recursion, as an auditor would write it.
    fn reference(leaves: &[SumSibling]) -> SumSibling {
        if leaves.len() == 1 {
            return leaves[0];
        }
        let mut k = 1;
        while k * 2 < leaves.len() {
            k *= 2;
        }
        let (l, r) = (reference(&leaves[..k]), reference(&leaves[k..]));
        parent(&l, &r).unwrap()
    }

    #[test]
    fn levels_build_the_rfc6962_tree() {
        for n in 1..=33u64 {
            let leaves: Vec<_> = (0..n).map(|i| leaf(i, i * 3, i % 4)).collect();
            let tree = SumTree::build(&leaves).unwrap();
            let nodes: Vec<_> = leaves
                .iter()
                .map(|l| SumSibling {
                    sha3_256: l.leaf_hash(),
                    bytes: l.wire_bytes_both(),
                })
                .collect();
            let want = reference(&nodes);
            assert_eq!(tree.root().sha3_256, want.sha3_256, "n={n}");
            assert_eq!(tree.root().bytes, want.bytes, "n={n}");
            assert_eq!(tree.root().records, n);
        }
    }

    #[test]
    fn split_sides_match_the_levels() {
        for n in 1..=40u64 {
            for i in 0..n {
                let s = sides(i, n);
                // A bottom-up walk over the levels: at each level with a sibling, the sibling
                // is on the left exactly when the position is odd.
                let mut want = Vec::new();
                let (mut at, mut len) = (i, n);
                while len > 1 {
                    if at % 2 == 1 {
                        want.push(Side::Left);
                    } else if at + 1 < len {
                        want.push(Side::Right);
                    }
                    at /= 2;
                    len = len.div_ceil(2);
                }
                assert_eq!(s, want, "index {i} of {n}");
            }
        }
    }

    #[test]
    fn empty_epoch() {
        let tree = SumTree::build(&[]).unwrap();
        assert!(tree.is_empty());
        assert_eq!(tree.root(), empty_root());
        assert_eq!(
            tree.root().sha3_256,
            <[u8; 32]>::from(Sha3_256::digest(b"rackwarden/traffic-empty/v1\0"))
        );
        assert_eq!(tree.locate(Direction::Egress, 0), None);
        assert_eq!(tree.open(0), None);
    }

    #[test]
    fn one_leaf_root_is_the_leaf() {
        let l = leaf(0, 5, 6);
        let tree = SumTree::build(&[l]).unwrap();
        assert_eq!(tree.root().sha3_256, l.leaf_hash());
        assert_eq!(tree.root().bytes, [5, 6]);
        let path = tree.open(0).unwrap();
        assert!(path.siblings.is_empty());
        verify_opening(&tree.root(), &l, &path, Direction::Ingress, 5).unwrap();
    }

    #[test]
    fn zero_weight_leaves_are_skipped_by_locate() {
        let leaves = [leaf(0, 0, 1), leaf(1, 2, 0), leaf(2, 0, 0), leaf(3, 1, 1)];
        let tree = SumTree::build(&leaves).unwrap();
        let e = Direction::Egress;
        assert_eq!(tree.locate(e, 0), Some(1));
        assert_eq!(tree.locate(e, 1), Some(1));
        assert_eq!(tree.locate(e, 2), Some(3));
        assert_eq!(tree.locate(e, 3), None);
        assert_eq!(tree.range(e, 2), Some(2..2));
        let i = Direction::Ingress;
        assert_eq!(tree.locate(i, 0), Some(0));
        assert_eq!(tree.locate(i, 1), Some(3));
        // The empty leaf opens fine but covers nothing.
        let path = tree.open(2).unwrap();
        assert_eq!(
            verify_opening(&tree.root(), &leaves[2], &path, e, 1),
            Err(OpeningError::OffsetOutside {
                offset: 1,
                start: 2,
                end: 2
            })
        );
    }

    #[test]
    fn overflow_is_an_error() {
        let big = leaf(0, u64::MAX, 0);
        assert_eq!(
            SumTree::build(&[big, leaf(1, 1, 0)]).unwrap_err(),
            TrafficError::SumOverflow {
                dir: Direction::Egress,
                index: 1
            }
        );
        // One record may weigh u64::MAX on its own.
        assert_eq!(SumTree::build(&[big]).unwrap().root().bytes, [u64::MAX, 0]);
    }

    #[test]
    fn root_with_wrong_counts_is_refused() {
        let leaves = [leaf(0, 3, 1), leaf(1, 4, 1), leaf(2, 5, 1)];
        let tree = SumTree::build(&leaves).unwrap();
        let mut root = tree.root();
        root.bytes[1] += 1;
        assert_eq!(
            verify_opening(
                &root,
                &leaves[0],
                &tree.open(0).unwrap(),
                Direction::Egress,
                0
            ),
            Err(OpeningError::SumMismatch {
                dir: Direction::Ingress,
                expected: 4,
                got: 3
            })
        );
    }

    #[test]
    fn index_out_of_range_is_refused() {
        let leaves = [leaf(0, 3, 1), leaf(1, 4, 1)];
        let tree = SumTree::build(&leaves).unwrap();
        let mut path = tree.open(1).unwrap();
        path.index = 2;
        assert_eq!(
            verify_opening(&tree.root(), &leaves[1], &path, Direction::Egress, 3),
            Err(OpeningError::IndexOutOfRange {
                index: 2,
                leaves: 2
            })
        );
    }
}
