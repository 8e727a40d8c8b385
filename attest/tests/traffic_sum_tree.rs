//! The traffic commitment through its public API only: openings of every record at its
//! boundaries, refusals of every forgery we can think of, the sampling distribution, and a
//! known-answer vector rebuilt by hand from `docs/traffic-format.md`.

// Test helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use rackwarden_attest::{
    evidence::Direction,
    traffic::{
        DropCount, EpochStart, FlowKey, Opening, OpeningError, RecordKind, StreamPart, SumPath,
        SumTree, SummaryError, TapDrops, TrafficLeaf, TrafficRoot, TrafficSummary, idx,
        sample_offsets, verify_opening,
    },
};
use sha3::{
    Digest, Sha3_256, Shake256,
    digest::{ExtendableOutput, Update, XofReader},
};

const E: Direction = Direction::Egress;
const I: Direction = Direction::Ingress;

/// A raw UDP flow record with the given payload lengths and frame bytes (`wire`, egress
/// first): its weight in the tree, whatever its payload.
fn record(i: u64, egress_payload: u64, ingress_payload: u64, wire: [u64; 2]) -> TrafficLeaf {
    TrafficLeaf {
        epoch_seq: 9,
        kind: RecordKind::RawFlow,
        flow: FlowKey {
            proto: 17,
            local: "10.1.0.2:4789".parse().unwrap(),
            remote: format!("10.2.{}.{}:4789", i / 200, i % 200)
                .parse()
                .unwrap(),
        },
        input: StreamPart {
            offset: 0,
            len: ingress_payload,
            sha3_256: [i as u8; 32],
        },
        output: StreamPart {
            offset: 0,
            len: egress_payload,
            sha3_256: [0x80 | i as u8; 32],
        },
        wire,
    }
}

/// Varied weights with zeros in both directions (some records carry nothing one way, some
/// nothing at all). Most records weigh their payload and a few header bytes; every fifth
/// weighs less than its payload (bytes held out of order at the previous cut entered its
/// stream in this epoch).
fn varied(n: u64) -> Vec<TrafficLeaf> {
    (0..n)
        .map(|i| {
            let e = [0, 1, 7, 0, 1500, 3][(i % 6) as usize];
            let g = [5, 0, 0, 64, 1, 0, 9][(i % 7) as usize];
            let wire = if i % 5 == 0 {
                [e / 2, g / 2]
            } else {
                [e + i % 3, g + i % 4]
            };
            record(i, e, g, wire)
        })
        .collect()
}

fn open_and_verify(tree: &SumTree, leaves: &[TrafficLeaf], dir: Direction, offset: u64) -> usize {
    let i = tree.locate(dir, offset).unwrap();
    let path = tree.open(i).unwrap();
    assert_eq!(path.index, i as u64);
    assert_eq!(path.leaves, leaves.len() as u64);
    verify_opening(&tree.root(), &leaves[i], &path, dir, offset)
        .unwrap_or_else(|e| panic!("leaf {i} at {dir:?} offset {offset}: {e}"));
    i
}

#[test]
fn every_record_opens_at_its_first_and_last_byte() {
    for n in 1..=40 {
        let leaves = varied(n);
        let tree = SumTree::build(&leaves).unwrap();
        let root = tree.root();
        assert_eq!(root.records, n);
        for dir in Direction::ALL {
            let mut start = 0;
            for (i, leaf) in leaves.iter().enumerate() {
                let w = leaf.wire_bytes(dir);
                assert_eq!(w, leaf.wire[idx(dir)]);
                assert_eq!(tree.range(dir, i), Some(start..start + w));
                if w > 0 {
                    assert_eq!(open_and_verify(&tree, &leaves, dir, start), i);
                    assert_eq!(open_and_verify(&tree, &leaves, dir, start + w - 1), i);
                }
                start += w;
            }
            assert_eq!(root.bytes[idx(dir)], start, "n={n} {dir:?}");
            assert_eq!(tree.locate(dir, start), None);
        }
    }
}

#[test]
fn every_offset_of_small_trees_opens_only_its_own_record() {
    for n in 1..=12 {
        let leaves: Vec<_> = (0..n)
            .map(|i| record(i, i % 3, (i * 5) % 4, [i % 3 + i % 2, (i * 5) % 4]))
            .collect();
        let tree = SumTree::build(&leaves).unwrap();
        let root = tree.root();
        for dir in Direction::ALL {
            for offset in 0..root.bytes[idx(dir)] {
                let owner = open_and_verify(&tree, &leaves, dir, offset);
                for (j, other) in leaves.iter().enumerate() {
                    if j != owner {
                        let path = tree.open(j).unwrap();
                        assert!(
                            matches!(
                                verify_opening(&root, other, &path, dir, offset),
                                Err(OpeningError::OffsetOutside { .. })
                            ),
                            "leaf {j} opened for {dir:?} offset {offset} owned by {owner}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn zero_weight_records_never_cover_an_offset() {
    let leaves = vec![
        record(0, 0, 0, [0, 0]),
        record(1, 4, 0, [4, 0]),
        record(2, 0, 0, [0, 0]),
        record(3, 0, 2, [1, 2]),
        // 9 ingress payload bytes, all held out of order at the previous cut: their frames
        // were counted then, so the record weighs nothing here.
        record(4, 0, 9, [0, 0]),
    ];
    let tree = SumTree::build(&leaves).unwrap();
    let hits: Vec<_> = (0..5).map(|o| tree.locate(E, o)).collect();
    assert_eq!(hits, [Some(1), Some(1), Some(1), Some(1), Some(3)]);
    assert_eq!(tree.locate(I, 0), Some(3));
    assert_eq!(tree.locate(I, 1), Some(3));
    assert_eq!(tree.locate(I, 2), None);
    assert_eq!(tree.root().bytes, [5, 2]);
    assert_eq!(tree.range(I, 4), Some(2..2));
}

/// The tree weighs records by `wire` only: a record whose stream bytes exceed its frame
/// bytes (held bytes entered its stream this epoch) covers exactly its frame bytes, and the
/// next record starts right after them.
#[test]
fn records_are_placed_by_their_wire_bytes_not_their_payload() {
    let leaves = vec![
        record(0, 3000, 100, [200, 154]), // 3000 held egress bytes entered this epoch
        record(1, 10, 10, [64, 64]),
        record(2, 0, 0, [0, 60]), // acknowledgements only
    ];
    let tree = SumTree::build(&leaves).unwrap();
    assert_eq!(tree.root().bytes, [264, 278]);
    assert_eq!(tree.range(E, 0), Some(0..200));
    assert_eq!(tree.range(E, 1), Some(200..264));
    assert_eq!(tree.range(I, 2), Some(218..278));
    assert_eq!(open_and_verify(&tree, &leaves, E, 199), 0);
    assert_eq!(open_and_verify(&tree, &leaves, E, 200), 1);
    assert_eq!(open_and_verify(&tree, &leaves, I, 218), 2);
    // Record 0 claiming its payload as its weight is another leaf: not in the tree.
    let mut payload_weighted = leaves[0];
    payload_weighted.wire = [3000, 154];
    assert!(matches!(
        verify_opening(
            &tree.root(),
            &payload_weighted,
            &tree.open(0).unwrap(),
            E,
            250
        ),
        Err(OpeningError::HashMismatch { .. })
    ));
}

#[test]
fn empty_epoch_has_nothing_to_open() {
    let tree = SumTree::build(&[]).unwrap();
    let root = tree.root();
    assert_eq!(root.records, 0);
    assert_eq!(root.bytes, [0, 0]);
    assert_eq!(
        hex::encode(root.sha3_256),
        hex::encode(Sha3_256::digest(b"rackwarden/traffic-empty/v1\0"))
    );
    assert_eq!(
        hex::encode(root.sha3_256),
        "7ec83d2df53d6a3142832a39a076fde82c9244ff041ab57b306fd3ed4f4d3d3e"
    );
    assert!(sample_offsets(&[3; 32], &root, E, 10).is_empty());
    let path = SumPath {
        index: 0,
        leaves: 0,
        siblings: vec![],
    };
    assert_eq!(
        verify_opening(&root, &record(0, 1, 1, [1, 1]), &path, E, 0),
        Err(OpeningError::IndexOutOfRange {
            index: 0,
            leaves: 0
        })
    );
}

// ---- refusals -------------------------------------------------------------------------

/// Eleven varied records, record 8 (7 egress payload bytes, 9 egress frame bytes, nothing
/// ingress), the first egress byte it covers, and its opening.
fn fixture() -> (Vec<TrafficLeaf>, SumTree, usize, u64, SumPath) {
    let leaves = varied(11);
    let tree = SumTree::build(&leaves).unwrap();
    let i = 8; // egress wire 9 (payload 7)
    assert_eq!(leaves[i].wire, [9, 0]);
    let range = tree.range(E, i).unwrap();
    assert_eq!(range.end - range.start, 9);
    let path = tree.open(i).unwrap();
    (leaves, tree, i, range.start, path)
}

#[test]
fn changed_record_bytes_are_refused() {
    let (leaves, tree, i, offset, path) = fixture();
    let root = tree.root();
    let mut flipped = leaves[i];
    flipped.output.sha3_256[0] ^= 1;
    assert!(matches!(
        verify_opening(&root, &flipped, &path, E, offset),
        Err(OpeningError::HashMismatch { .. })
    ));
    let mut fatter = leaves[i];
    fatter.wire[1] += 1;
    assert!(matches!(
        verify_opening(&root, &fatter, &path, E, offset),
        Err(OpeningError::HashMismatch { .. })
    ));
    let mut relabelled = leaves[i];
    relabelled.kind = RecordKind::Exchange;
    assert!(matches!(
        verify_opening(&root, &relabelled, &path, E, offset),
        Err(OpeningError::HashMismatch { .. })
    ));
}

#[test]
fn another_record_with_this_path_is_refused() {
    let (leaves, tree, i, offset, path) = fixture();
    for (j, other) in leaves.iter().enumerate() {
        if j != i {
            assert!(matches!(
                verify_opening(&tree.root(), other, &path, E, offset),
                Err(OpeningError::HashMismatch { .. })
            ));
        }
    }
}

#[test]
fn forged_sibling_hash_is_refused() {
    let (leaves, tree, i, offset, path) = fixture();
    for s in 0..path.siblings.len() {
        let mut forged = path.clone();
        forged.siblings[s].sha3_256[31] ^= 0x40;
        match verify_opening(&tree.root(), &leaves[i], &forged, E, offset) {
            Err(OpeningError::HashMismatch { expected, got }) => {
                assert_eq!(expected, tree.root().sha3_256);
                assert_ne!(got, expected);
            }
            other => panic!("sibling {s}: {other:?}"),
        }
    }
}

#[test]
fn forged_sibling_sum_is_refused() {
    let (leaves, tree, i, offset, path) = fixture();
    for s in 0..path.siblings.len() {
        for dir in Direction::ALL {
            let mut forged = path.clone();
            forged.siblings[s].bytes[idx(dir)] += 1;
            assert!(matches!(
                verify_opening(&tree.root(), &leaves[i], &forged, E, offset),
                Err(OpeningError::HashMismatch { .. })
            ));
        }
    }
}

/// The host wants record B opened for an offset that record A covers: it takes B's path and
/// moves A's bytes from the left sibling to the right one, so that B seems to start at the
/// offset and the totals still add up. The counts are inside the node hashes, so the root
/// does not match.
#[test]
fn bytes_shifted_between_siblings_are_refused() {
    let leaves = vec![
        record(0, 100, 0, [100, 0]),
        record(1, 50, 0, [50, 0]),
        record(2, 10, 0, [10, 0]),
        record(3, 10, 0, [10, 0]),
    ];
    let tree = SumTree::build(&leaves).unwrap();
    let root = tree.root();
    let offset = 20; // in record 0 (bytes 0..100)
    assert_eq!(tree.locate(E, offset), Some(0));
    let honest = tree.open(1).unwrap();
    assert_eq!(
        verify_opening(&root, &leaves[1], &honest, E, offset),
        Err(OpeningError::OffsetOutside {
            offset: 20,
            start: 100,
            end: 150
        })
    );
    // Siblings of record 1: record 0 (left), then node(2, 3) (right).
    let mut shifted = honest.clone();
    shifted.siblings[0].bytes[0] -= 100;
    shifted.siblings[1].bytes[0] += 100;
    assert!(matches!(
        verify_opening(&root, &leaves[1], &shifted, E, offset),
        Err(OpeningError::HashMismatch { .. })
    ));
    // Only moving the bytes off (totals then short) fails the same way.
    let mut dropped = honest;
    dropped.siblings[0].bytes[0] = 0;
    assert!(matches!(
        verify_opening(&root, &leaves[1], &dropped, E, offset),
        Err(OpeningError::HashMismatch { .. })
    ));
}

#[test]
fn path_for_another_tree_size_is_refused() {
    let (leaves, tree, i, offset, path) = fixture();
    let root = tree.root();
    let mut bigger = path.clone();
    bigger.leaves += 1;
    assert_eq!(
        verify_opening(&root, &leaves[i], &bigger, E, offset),
        Err(OpeningError::TreeSize { path: 12, root: 11 })
    );
    // The same record's path in a tree of one record fewer: wrong size for this root.
    let smaller_tree = SumTree::build(&leaves[..10]).unwrap();
    let smaller = smaller_tree.open(i).unwrap();
    assert_eq!(
        verify_opening(&root, &leaves[i], &smaller, E, offset),
        Err(OpeningError::TreeSize { path: 10, root: 11 })
    );
    // A root that claims another size, with a path claiming the same: the RFC 6962 split
    // of that size wants a different number of siblings (record 4 of 5 has one; of 6, two).
    let five = varied(5);
    let t5 = SumTree::build(&five).unwrap();
    let mut r6 = t5.root();
    r6.records = 6;
    let mut p6 = t5.open(4).unwrap();
    p6.leaves = 6;
    let at = t5.range(E, 4).unwrap().start;
    assert_eq!(
        verify_opening(&r6, &five[4], &p6, E, at),
        Err(OpeningError::PathLength {
            expected: 2,
            got: 1
        })
    );
}

#[test]
fn wrong_path_length_is_refused() {
    let (leaves, tree, i, offset, path) = fixture();
    let mut short = path.clone();
    short.siblings.pop();
    assert_eq!(
        verify_opening(&tree.root(), &leaves[i], &short, E, offset),
        Err(OpeningError::PathLength {
            expected: path.siblings.len(),
            got: path.siblings.len() - 1
        })
    );
    let mut long = path.clone();
    long.siblings.push(path.siblings[0]);
    assert!(matches!(
        verify_opening(&tree.root(), &leaves[i], &long, E, offset),
        Err(OpeningError::PathLength { .. })
    ));
}

#[test]
fn offset_outside_the_record_is_refused() {
    let (leaves, tree, i, offset, path) = fixture();
    let root = tree.root();
    let end = tree.range(E, i).unwrap().end;
    verify_opening(&root, &leaves[i], &path, E, offset).unwrap();
    verify_opening(&root, &leaves[i], &path, E, end - 1).unwrap();
    for bad in [offset - 1, end, 0] {
        assert_eq!(
            verify_opening(&root, &leaves[i], &path, E, bad),
            Err(OpeningError::OffsetOutside {
                offset: bad,
                start: offset,
                end
            })
        );
    }
    let total = root.bytes[0];
    assert_eq!(
        verify_opening(&root, &leaves[i], &path, E, total),
        Err(OpeningError::OffsetBeyondEpoch {
            dir: E,
            offset: total,
            bytes: total
        })
    );
    // The record's egress range says nothing about ingress.
    let ingress = tree.range(I, i).unwrap();
    if ingress.is_empty() {
        assert!(matches!(
            verify_opening(&root, &leaves[i], &path, I, offset.min(root.bytes[1] - 1)),
            Err(OpeningError::OffsetOutside { .. })
        ));
    }
}

/// **The host cannot choose what is opened.** Records A and B are on the same connection and
/// their stream ranges overlap (A claims request bytes 0..1000, B claims 500..1500): both
/// describe stream byte 700, say. The sum tree does not care about stream offsets: A's ingress
/// bytes come first in the epoch and B's after, so an offset in A's range can be answered
/// with A only. Opening B there (with B's honest path, or with A's path) is refused.
#[test]
fn two_overlapping_records_the_sum_tree_refuses_the_second_opening() {
    let flow = FlowKey {
        proto: 6,
        local: "10.0.0.2:8000".parse().unwrap(),
        remote: "10.0.0.9:51234".parse().unwrap(),
    };
    let a = TrafficLeaf {
        epoch_seq: 3,
        kind: RecordKind::Exchange,
        flow,
        input: StreamPart {
            offset: 0,
            len: 1000,
            sha3_256: [0xa1; 32],
        },
        output: StreamPart {
            offset: 0,
            len: 200,
            sha3_256: [0xa2; 32],
        },
        wire: [280, 1080],
    };
    let b = TrafficLeaf {
        input: StreamPart {
            offset: 500,
            len: 1000,
            sha3_256: [0xb1; 32],
        },
        output: StreamPart {
            offset: 200,
            len: 200,
            sha3_256: [0xb2; 32],
        },
        ..a
    };
    let other = record(7, 40, 40, [50, 50]);
    let leaves = [other, a, b];
    let tree = SumTree::build(&leaves).unwrap();
    let root = tree.root();

    // Draw offsets until one lands in A's ingress bytes (deterministic randomness).
    let a_range = tree.range(I, 1).unwrap();
    assert_eq!(a_range, 50..1130);
    let offset = sample_offsets(&[0x5a; 32], &root, I, 64)
        .into_iter()
        .find(|o| a_range.contains(o))
        .unwrap();
    assert_eq!(tree.locate(I, offset), Some(1));

    // A opens.
    verify_opening(&root, &a, &tree.open(1).unwrap(), I, offset).unwrap();

    // B, with its own honest path, is refused: its bytes come after A's.
    assert_eq!(
        verify_opening(&root, &b, &tree.open(2).unwrap(), I, offset),
        Err(OpeningError::OffsetOutside {
            offset,
            start: 1130,
            end: 2210
        })
    );
    // B with A's path is not in the tree at that place at all.
    assert!(matches!(
        verify_opening(&root, &b, &tree.open(1).unwrap(), I, offset),
        Err(OpeningError::HashMismatch { .. })
    ));
    // And B on the egress side is just as fixed.
    let a_out = tree.range(E, 1).unwrap();
    assert!(matches!(
        verify_opening(&root, &b, &tree.open(2).unwrap(), E, a_out.start),
        Err(OpeningError::OffsetOutside { .. })
    ));
}

// ---- sampling -------------------------------------------------------------------------

#[test]
fn sampling_is_deterministic_keyed_and_in_range() {
    let leaves = varied(17);
    let root = SumTree::build(&leaves).unwrap().root();
    for dir in Direction::ALL {
        let a = sample_offsets(&[1; 32], &root, dir, 100);
        assert_eq!(a.len(), 100);
        assert_eq!(a, sample_offsets(&[1; 32], &root, dir, 100));
        assert_ne!(a, sample_offsets(&[2; 32], &root, dir, 100));
        assert!(a.iter().all(|&o| o < root.bytes[idx(dir)]));
    }
}

#[test]
fn sampled_records_follow_their_byte_counts() {
    // Egress weights 1 : 2 : 7 (the wire bytes; the payloads do not matter).
    let leaves = [
        record(0, 1, 0, [1, 0]),
        record(1, 1, 0, [2, 0]),
        record(2, 40, 0, [7, 0]),
    ];
    let tree = SumTree::build(&leaves).unwrap();
    let root = tree.root();
    assert_eq!(root.bytes, [10, 0]);
    let mut hits = [0u64; 3];
    for o in sample_offsets(&[0xc3; 32], &root, E, 10_000) {
        hits[tree.locate(E, o).unwrap()] += 1;
    }
    let expected = [1_000.0, 2_000.0, 7_000.0];
    let chi2: f64 = hits
        .iter()
        .zip(expected)
        .map(|(&h, e)| (h as f64 - e).powi(2) / e)
        .sum();
    // Two degrees of freedom: chi-square above 20 has probability 5e-5 for a fair sampler.
    assert!(chi2 < 20.0, "hits {hits:?}, chi2 {chi2}");
    for (h, e) in hits.iter().zip(expected) {
        assert!((*h as f64 - e).abs() < 0.1 * e + 50.0, "hits {hits:?}");
    }
    assert!(sample_offsets(&[0xc3; 32], &root, I, 10).is_empty());
}

// ---- known answer -----------------------------------------------------------------------

fn kat_leaves() -> [TrafficLeaf; 3] {
    let empty = StreamPart::of_bytes(0, b"");
    [
        TrafficLeaf {
            epoch_seq: 42,
            kind: RecordKind::Exchange,
            flow: FlowKey {
                proto: 6,
                local: "10.0.0.2:8000".parse().unwrap(),
                remote: "10.0.0.9:51234".parse().unwrap(),
            },
            input: StreamPart::of_bytes(0, b"hello"),
            output: StreamPart::of_bytes(0, b"world!"),
            wire: [72, 59],
        },
        TrafficLeaf {
            epoch_seq: 42,
            kind: RecordKind::RawFlow,
            flow: FlowKey {
                proto: 17,
                local: "[2001:db8::2]:53".parse().unwrap(),
                remote: "[2001:db8::9]:40000".parse().unwrap(),
            },
            input: StreamPart::of_bytes(0, b"abc"),
            output: empty,
            wire: [0, 51],
        },
        TrafficLeaf {
            epoch_seq: 42,
            kind: RecordKind::Partial,
            flow: FlowKey {
                proto: 6,
                local: "10.0.0.2:8000".parse().unwrap(),
                remote: "10.0.0.10:50000".parse().unwrap(),
            },
            input: StreamPart::of_bytes(1000, b"part"),
            output: StreamPart::of_bytes(6, b""),
            wire: [40, 64],
        },
    ]
}

const KAT_ROOT: &str = "dcb5aacd9169bac0be35bce7115aa03277804517dc57d13a858ca0cf1013764f";

fn sha3(data: &[u8]) -> [u8; 32] {
    Sha3_256::digest(data).into()
}

/// The leaf encoding written out from the byte table, field by field.
#[allow(clippy::too_many_arguments)]
fn hand_leaf(
    epoch: u64,
    kind: u8,
    proto: u8,
    local: ([u8; 16], u16),
    remote: ([u8; 16], u16),
    input: (u64, &[u8]),
    output: (u64, &[u8]),
    wire: (u64, u64),
) -> (Vec<u8>, [u64; 2]) {
    let mut e = Vec::new();
    e.extend_from_slice(b"rackwarden/traffic-leaf/v1\0");
    e.extend_from_slice(&epoch.to_be_bytes());
    e.push(kind);
    e.push(proto);
    for (ip, port) in [local, remote] {
        e.extend_from_slice(&ip);
        e.extend_from_slice(&port.to_be_bytes());
    }
    for (off, bytes) in [input, output] {
        e.extend_from_slice(&off.to_be_bytes());
        e.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
        e.extend_from_slice(&sha3(bytes));
    }
    e.extend_from_slice(&wire.0.to_be_bytes());
    e.extend_from_slice(&wire.1.to_be_bytes());
    assert_eq!(e.len(), 185);
    // The node's counts are the record's frame bytes as written, not derived from the
    // payload.
    (e, [wire.0, wire.1])
}

fn v4(a: u8, b: u8, c: u8, d: u8) -> [u8; 16] {
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d]
}

fn v6_db8(last: u8) -> [u8; 16] {
    let mut ip = [0u8; 16];
    ip[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
    ip[15] = last;
    ip
}

fn hand_node(l: ([u8; 32], [u64; 2]), r: ([u8; 32], [u64; 2])) -> ([u8; 32], [u64; 2]) {
    let mut n = Vec::new();
    n.extend_from_slice(b"rackwarden/traffic-node/v1\0");
    for (h, b) in [l, r] {
        n.extend_from_slice(&h);
        n.extend_from_slice(&b[0].to_be_bytes());
        n.extend_from_slice(&b[1].to_be_bytes());
    }
    assert_eq!(n.len(), 27 + 2 * 48);
    (sha3(&n), [l.1[0] + r.1[0], l.1[1] + r.1[1]])
}

#[test]
fn known_answer_root_matches_the_documented_layout() {
    let leaves = kat_leaves();
    let (ea, wa) = hand_leaf(
        42,
        1,
        6,
        (v4(10, 0, 0, 2), 8000),
        (v4(10, 0, 0, 9), 51234),
        (0, b"hello"),
        (0, b"world!"),
        (72, 59),
    );
    let (eb, wb) = hand_leaf(
        42,
        2,
        17,
        (v6_db8(2), 53),
        (v6_db8(9), 40000),
        (0, b"abc"),
        (0, b""),
        (0, 51),
    );
    let (ec, wc) = hand_leaf(
        42,
        3,
        6,
        (v4(10, 0, 0, 2), 8000),
        (v4(10, 0, 0, 10), 50000),
        (1000, b"part"),
        (6, b""),
        (40, 64),
    );
    for (leaf, enc) in leaves.iter().zip([&ea, &eb, &ec]) {
        assert_eq!(hex::encode(leaf.encode()), hex::encode(enc));
    }
    assert_eq!((wa, wb, wc), ([72, 59], [0, 51], [40, 64]));
    // Three leaves split 2 + 1: node(node(A, B), C).
    let ab = hand_node((sha3(&ea), wa), (sha3(&eb), wb));
    let (root_hash, sums) = hand_node(ab, (sha3(&ec), wc));
    assert_eq!(sums, [112, 174]);

    let tree = SumTree::build(&leaves).unwrap();
    let root = tree.root();
    assert_eq!(hex::encode(root.sha3_256), hex::encode(root_hash));
    assert_eq!(root.bytes, sums);
    assert_eq!(root.records, 3);
    assert_eq!(hex::encode(root.sha3_256), KAT_ROOT);

    // The worked example of docs/traffic-format.md.
    assert_eq!(
        hex::encode(sha3(&ea)),
        "bf7bdd1069bc113e484ba55a7beb16b6a3106c81ad76290991b2a347e08f4182"
    );
    assert_eq!(
        hex::encode(sha3(&eb)),
        "889f3a668909483770cc9f22f51032e11d01d6fa650bb361dbbcc51d4ab1f400"
    );
    assert_eq!(
        hex::encode(sha3(&ec)),
        "f7735cd9501a39bda6cc470de1dca5d8a13ec44b2e78f64479cefb3dc35b6a6c"
    );
    assert_eq!(
        hex::encode(ab.0),
        "54f48a388d4d594689ada4cc627f7eaf7f638a7b9bb67d58243585104e54ad08"
    );
    assert_eq!(ab.1, [72, 110]);
}

#[test]
fn known_answer_sampling_matches_the_documented_derivation() {
    let root = SumTree::build(&kat_leaves()).unwrap().root();
    let randomness = [0x11u8; 32];
    let mut input = Vec::new();
    input.extend_from_slice(b"rackwarden/traffic-sample/v1\0");
    input.extend_from_slice(&randomness);
    input.extend_from_slice(&root.sha3_256);
    input.extend_from_slice(&112u64.to_be_bytes());
    input.extend_from_slice(&174u64.to_be_bytes());
    input.push(1); // ingress
    let mut stream = [0u8; 8 * 16];
    let mut xof = Shake256::default();
    xof.update(&input);
    xof.finalize_xof().read(&mut stream);
    // The first blocks, as docs/traffic-format.md lists them.
    assert_eq!(
        hex::encode(&stream[..32]),
        "4fd11be79a73c8f42308a8cf49bc0775388b6e8efb725940ebd2360ce3cae7ee"
    );
    // n = 174: 2^64 mod 174 = 82, so m = 2^64 - 82 and values >= m are skipped.
    assert_eq!((1u128 << 64) % 174, 82);
    let m = u64::MAX - 81;
    let by_hand: Vec<u64> = stream
        .chunks(8)
        .map(|c| u64::from_be_bytes(c.try_into().unwrap()))
        .filter(|&v| v < m)
        .map(|v| v % 174)
        .take(4)
        .collect();
    let got = sample_offsets(&randomness, &root, I, 4);
    assert_eq!(got, by_hand);
    assert_eq!(got, [50, 161, 38, 98]);
    // Ingress ranges: A 0..59, B 59..110, C 110..174.
    let tree = SumTree::build(&kat_leaves()).unwrap();
    let owners: Vec<_> = got.iter().map(|&o| tree.locate(I, o).unwrap()).collect();
    assert_eq!(owners, [0, 2, 0, 1]);
}

// ---- wire -------------------------------------------------------------------------------

#[test]
fn openings_travel_as_json() {
    let leaves = kat_leaves();
    let tree = SumTree::build(&leaves).unwrap();
    let root: TrafficRoot =
        serde_json::from_str(&serde_json::to_string(&tree.root()).unwrap()).unwrap();
    assert_eq!(root, tree.root());
    for (i, leaf) in leaves.iter().enumerate() {
        let path = tree.open(i).unwrap();
        let path_json = serde_json::to_string(&path).unwrap();
        let leaf_json = serde_json::to_string(leaf).unwrap();
        let path: SumPath = serde_json::from_str(&path_json).unwrap();
        let leaf: TrafficLeaf = serde_json::from_str(&leaf_json).unwrap();
        let start = tree.range(I, i).unwrap().start;
        verify_opening(&root, &leaf, &path, I, start).unwrap();
    }
    assert_eq!(
        serde_json::to_string(&root).unwrap(),
        r#"{"sha3_256":"dcb5aacd9169bac0be35bce7115aa03277804517dc57d13a858ca0cf1013764f","bytes":{"egress":112,"ingress":174},"records":3}"#
    );
    assert_eq!(
        serde_json::to_string(&tree.open(2).unwrap()).unwrap(),
        r#"{"index":2,"leaves":3,"siblings":[{"sha3_256":"54f48a388d4d594689ada4cc627f7eaf7f638a7b9bb67d58243585104e54ad08","bytes":{"egress":72,"ingress":110}}]}"#
    );
    assert_eq!(
        serde_json::to_string(&leaves[1]).unwrap(),
        r#"{"epoch_seq":42,"kind":"raw_flow","flow":{"proto":17,"local":"[2001:db8::2]:53","remote":"[2001:db8::9]:40000"},"input":{"offset":0,"len":3,"sha3_256":"3a985da74fe225b2045c172d6bd390bd855f086e3e9d525b46bfe24511431532"},"output":{"offset":0,"len":0,"sha3_256":"a7ffc6f8bf1ed76651c14756a061d662f580ff4de43b49fa82d80a4b80f8434a"},"wire":{"egress":0,"ingress":51}}"#
    );
    let extra = serde_json::to_string(&root)
        .unwrap()
        .replacen('{', r#"{"x":1,"#, 1);
    assert!(serde_json::from_str::<TrafficRoot>(&extra).is_err());
}

// ---- what a statement carries -------------------------------------------------------------

/// The summary example of docs/traffic-format.md: the worked example's root, one ingress
/// frame of 1500 bytes lost to a full ring, 1448 ingress bytes held at the cut.
#[test]
fn the_documented_summary() {
    let summary = TrafficSummary {
        root: SumTree::build(&kat_leaves()).unwrap().root(),
        passed: [112, 1674],
        unaccounted: [0, 1500],
        tap_drops: TapDrops {
            ring_full: DropCount {
                frames: [0, 1],
                bytes: [0, 1500],
            },
            ..TapDrops::default()
        },
        held: [0, 1448],
        start: EpochStart::Resumed,
    };
    summary.check().unwrap();
    let j = serde_json::to_string(&summary).unwrap();
    assert_eq!(
        j,
        concat!(
            r#"{"root":{"sha3_256":"dcb5aacd9169bac0be35bce7115aa03277804517dc57d13a858ca0cf1013764f","#,
            r#""bytes":{"egress":112,"ingress":174},"records":3},"#,
            r#""passed":{"egress":112,"ingress":1674},"unaccounted":{"egress":0,"ingress":1500},"#,
            r#""tap_drops":{"ring_full":{"frames":{"egress":0,"ingress":1},"bytes":{"egress":0,"ingress":1500}},"#,
            r#""too_large":{"frames":{"egress":0,"ingress":0},"bytes":{"egress":0,"ingress":0}},"#,
            r#""unreadable":{"frames":{"egress":0,"ingress":0},"bytes":{"egress":0,"ingress":0}}},"#,
            r#""held":{"egress":0,"ingress":1448},"start":"resumed"}"#
        )
    );
    assert_eq!(serde_json::from_str::<TrafficSummary>(&j).unwrap(), summary);
    assert!(serde_json::from_str::<TrafficSummary>(&j.replacen('{', r#"{"x":1,"#, 1)).is_err());
    let mut short = summary;
    short.unaccounted[1] = 1400;
    assert_eq!(
        short.check(),
        Err(SummaryError::Unaccounted {
            dir: I,
            passed: 1674,
            tapped: 174,
            expected: 1500,
            got: 1400
        })
    );
}

// ---- openings as the host sends them ------------------------------------------------------

/// The payload bytes of the known-answer records, (input, output).
const KAT_BYTES: [(&[u8], &[u8]); 3] = [(b"hello", b"world!"), (b"abc", b""), (b"part", b"")];

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The host's answer for `offset` in `dir` of the known-answer epoch.
fn kat_opening(dir: Direction, offset: u64) -> (Opening, TrafficRoot) {
    let leaves = kat_leaves();
    let tree = SumTree::build(&leaves).unwrap();
    let i = tree.locate(dir, offset).unwrap();
    let (input, output) = KAT_BYTES[i];
    let opening = Opening {
        epoch_seq: 42,
        direction: dir,
        offset,
        leaf: leaves[i],
        path: tree.open(i).unwrap(),
        input_base64: b64(input),
        output_base64: b64(output),
    };
    (opening, tree.root())
}

#[test]
fn a_good_opening_passes_and_gives_the_bytes() {
    // The first two sampled ingress offsets of the worked example: 50 (record A), 161 (C).
    let (a, root) = kat_opening(I, 50);
    assert_eq!(a.path.index, 0);
    assert_eq!(a.input_base64, "aGVsbG8=");
    assert_eq!(
        a.check(&root, 42).unwrap(),
        (b"hello".to_vec(), b"world!".to_vec())
    );
    let (c, root) = kat_opening(I, 161);
    assert_eq!(c.path.index, 2);
    assert_eq!(c.check(&root, 42).unwrap(), (b"part".to_vec(), vec![]));
    // Every egress and ingress offset of the epoch opens with its own record's bytes.
    for dir in Direction::ALL {
        for offset in 0..root.bytes[idx(dir)] {
            let (o, root) = kat_opening(dir, offset);
            o.check(&root, 42).unwrap();
        }
    }
}

#[test]
fn a_changed_byte_is_refused() {
    let (good, root) = kat_opening(I, 50);
    let mut o = good.clone();
    o.output_base64 = b64(b"world?");
    assert_eq!(
        o.check(&root, 42),
        Err(OpeningError::BytesDigest { which: "output" })
    );
    let mut o = good;
    o.input_base64 = b64(b"hellO");
    assert_eq!(
        o.check(&root, 42),
        Err(OpeningError::BytesDigest { which: "input" })
    );
}

#[test]
fn another_records_bytes_are_refused() {
    let (good, root) = kat_opening(I, 50);
    // Record C's input ("part") under record A.
    let mut o = good.clone();
    o.input_base64 = b64(KAT_BYTES[2].0);
    assert_eq!(
        o.check(&root, 42),
        Err(OpeningError::BytesLength {
            which: "input",
            expected: 5,
            got: 4
        })
    );
    // Input and output swapped.
    let mut o = good.clone();
    std::mem::swap(&mut o.input_base64, &mut o.output_base64);
    assert_eq!(
        o.check(&root, 42),
        Err(OpeningError::BytesLength {
            which: "input",
            expected: 5,
            got: 6
        })
    );
    // Bytes of the same length from another exchange.
    let mut o = good.clone();
    o.output_base64 = b64(b"error!");
    assert_eq!(
        o.check(&root, 42),
        Err(OpeningError::BytesDigest { which: "output" })
    );
    // Another record, bytes and all, for this offset: the tree places A there.
    let (c, _) = kat_opening(I, 161);
    let o = Opening { offset: 50, ..c };
    assert_eq!(
        o.check(&root, 42),
        Err(OpeningError::OffsetOutside {
            offset: 50,
            start: 110,
            end: 174
        })
    );
    // And undecodable bytes.
    let mut o = good;
    o.output_base64 = "d29ybGQh
"
    .into();
    assert!(matches!(
        o.check(&root, 42),
        Err(OpeningError::Base64 {
            which: "output",
            ..
        })
    ));
}

#[test]
fn an_opening_for_another_epoch_is_refused() {
    let (good, root) = kat_opening(I, 50);
    assert_eq!(
        good.check(&root, 43),
        Err(OpeningError::Epoch {
            expected: 43,
            got: 42
        })
    );
    let mut o = good.clone();
    o.epoch_seq = 41;
    assert_eq!(
        o.check(&root, 42),
        Err(OpeningError::Epoch {
            expected: 42,
            got: 41
        })
    );
    // The record's own epoch is checked too (it is also inside the leaf hash).
    let mut o = good;
    o.leaf.epoch_seq = 41;
    assert_eq!(
        o.check(&root, 42),
        Err(OpeningError::Epoch {
            expected: 42,
            got: 41
        })
    );
}

#[test]
fn an_opening_with_a_forged_path_is_refused() {
    let (good, root) = kat_opening(I, 50);
    for s in 0..good.path.siblings.len() {
        let mut o = good.clone();
        o.path.siblings[s].sha3_256[0] ^= 1;
        assert!(matches!(
            o.check(&root, 42),
            Err(OpeningError::HashMismatch { .. })
        ));
        let mut o = good.clone();
        o.path.siblings[s].bytes[1] += 1;
        assert!(matches!(
            o.check(&root, 42),
            Err(OpeningError::HashMismatch { .. })
        ));
    }
    // A record with more frame bytes than it committed to, to cover a wider range.
    let mut o = good;
    o.leaf.wire[1] += 100;
    assert!(matches!(
        o.check(&root, 42),
        Err(OpeningError::HashMismatch { .. })
    ));
}

#[test]
fn openings_travel_as_json_and_unknown_fields_are_refused() {
    let (c, root) = kat_opening(I, 161);
    let j = serde_json::to_string(&c).unwrap();
    assert_eq!(
        j,
        concat!(
            r#"{"epoch_seq":42,"direction":"ingress","offset":161,"#,
            r#""leaf":{"epoch_seq":42,"kind":"partial","flow":{"proto":6,"local":"10.0.0.2:8000","remote":"10.0.0.10:50000"},"#,
            r#""input":{"offset":1000,"len":4,"sha3_256":"267e7a7cdf907f155cd01c106c93155571369c3670c6aebee9176828ce9e7b3e"},"#,
            r#""output":{"offset":6,"len":0,"sha3_256":"a7ffc6f8bf1ed76651c14756a061d662f580ff4de43b49fa82d80a4b80f8434a"},"#,
            r#""wire":{"egress":40,"ingress":64}},"#,
            r#""path":{"index":2,"leaves":3,"siblings":[{"sha3_256":"54f48a388d4d594689ada4cc627f7eaf7f638a7b9bb67d58243585104e54ad08","bytes":{"egress":72,"ingress":110}}]},"#,
            r#""input_base64":"cGFydA==","output_base64":""}"#
        )
    );
    let back: Opening = serde_json::from_str(&j).unwrap();
    assert_eq!(back, c);
    assert_eq!(back.check(&root, 42).unwrap(), (b"part".to_vec(), vec![]));
    for bad in [
        j.replacen('{', r#"{"x":1,"#, 1),
        j.replace(r#""leaf":{"#, r#""leaf":{"x":1,"#),
        j.replace(r#""path":{"#, r#""path":{"x":1,"#),
        j.replace(r#""ingress","offset""#, r#""Ingress","offset""#),
        j.replace(r#","output_base64":"""#, ""),
    ] {
        assert!(serde_json::from_str::<Opening>(&bad).is_err(), "{bad}");
    }
}

// ---- properties -------------------------------------------------------------------------

fn arb_leaves() -> impl Strategy<Value = Vec<TrafficLeaf>> {
    prop::collection::vec(
        (
            0u64..2000,
            0u64..2000,
            0u64..2100,
            0u64..2100,
            any::<bool>(),
        ),
        1..60,
    )
    .prop_map(|v| {
        // The frame bytes are drawn independently of the payload: above it, below it (held
        // bytes entered the stream), or zero.
        v.into_iter()
            .enumerate()
            .map(|(i, (e, g, we, wg, zero))| {
                if zero {
                    record(i as u64, e, g, [0, 0])
                } else {
                    record(i as u64, e, g, [we, wg])
                }
            })
            .collect()
    })
}

proptest! {
    #[test]
    fn random_trees_open_random_offsets(
        leaves in arb_leaves(),
        picks in prop::collection::vec((any::<bool>(), any::<u64>()), 1..16),
    ) {
        let tree = SumTree::build(&leaves).unwrap();
        let root = tree.root();
        for (egress, r) in picks {
            let dir = if egress { E } else { I };
            let n = root.bytes[idx(dir)];
            if n == 0 {
                prop_assert_eq!(tree.locate(dir, 0), None);
                continue;
            }
            let offset = r % n;
            let i = tree.locate(dir, offset).unwrap();
            prop_assert!(tree.range(dir, i).unwrap().contains(&offset));
            let path = tree.open(i).unwrap();
            prop_assert_eq!(verify_opening(&root, &leaves[i], &path, dir, offset), Ok(()));
            // The neighbours, with their own honest paths, are refused for this offset.
            for j in [i.wrapping_sub(1), i + 1] {
                if let (Some(other), Some(p)) = (leaves.get(j), tree.open(j)) {
                    let refused = matches!(
                        verify_opening(&root, other, &p, dir, offset),
                        Err(OpeningError::OffsetOutside { .. })
                    );
                    prop_assert!(refused);
                }
            }
        }
    }

    #[test]
    fn random_forged_siblings_are_refused(
        leaves in arb_leaves(),
        r in any::<u64>(),
        which in any::<prop::sample::Index>(),
        delta in 1u64..1000,
        hash_not_sum in any::<bool>(),
    ) {
        let tree = SumTree::build(&leaves).unwrap();
        let root = tree.root();
        prop_assume!(root.bytes[0] > 0);
        let offset = r % root.bytes[0];
        let i = tree.locate(E, offset).unwrap();
        let mut path = tree.open(i).unwrap();
        prop_assume!(!path.siblings.is_empty());
        let s = which.index(path.siblings.len());
        if hash_not_sum {
            path.siblings[s].sha3_256[(delta % 32) as usize] ^= 1;
        } else {
            path.siblings[s].bytes[(delta % 2) as usize] ^= delta;
        }
        let refused = matches!(
            verify_opening(&root, &leaves[i], &path, E, offset),
            Err(OpeningError::HashMismatch { .. })
        );
        prop_assert!(refused);
    }
}

/// The answer of docs/traffic-format.md section 12.3, as printed there: it is what the
/// reference check accepts for the worked example with R = 32 bytes of 0x11 and k = 2
/// (records A and C), and it stops being accepted with B added or C dropped.
#[test]
fn the_documented_answer_is_accepted_by_the_check() {
    use rackwarden_attest::traffic::{EpochOpenings, OpeningsRefused, SampleDemand};
    let doc = include_str!("../../docs/traffic-format.md");
    let section = &doc[doc.find("### 12.3").unwrap()..doc.find("### 12.4").unwrap()];
    let json = section
        .split("```json")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap();
    let answer: EpochOpenings = serde_json::from_str(json).unwrap();
    let root = SumTree::build(&kat_leaves()).unwrap().root();
    let demand = SampleDemand {
        epoch_seq: 42,
        randomness: [0x11; 32],
        per_direction: 2,
        deadline_ms: 0,
    };
    let checked = answer.check("rack-a17", "host-03", &root, &demand).unwrap();
    assert_eq!(
        checked.iter().map(|c| c.index).collect::<Vec<_>>(),
        vec![0, 2]
    );
    assert_eq!(checked[0].input, b"hello");
    let mut fewer = answer.clone();
    fewer.records.pop();
    assert!(matches!(
        fewer.check("rack-a17", "host-03", &root, &demand),
        Err(OpeningsRefused::NotOpened { .. })
    ));
}
