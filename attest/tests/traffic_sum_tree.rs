//! The traffic commitment through its public API only: openings of every record at its
//! boundaries, refusals of every forgery we can think of, the sampling distribution, and a
//! known-answer vector rebuilt by hand from `docs/traffic-format.md`.

// Test helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use rackwarden_attest::{
    evidence::Direction,
    traffic::{
        FlowKey, OpeningError, RecordKind, StreamPart, SumPath, SumTree, TrafficLeaf, TrafficRoot,
        idx, sample_offsets, verify_opening,
    },
};
use sha3::{
    Digest, Sha3_256, Shake256,
    digest::{ExtendableOutput, Update, XofReader},
};

const E: Direction = Direction::Egress;
const I: Direction = Direction::Ingress;

/// A raw UDP flow record with the given payload lengths and overhead.
fn record(i: u64, egress_payload: u64, ingress_payload: u64, overhead: [u64; 2]) -> TrafficLeaf {
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
        overhead,
    }
}

/// Varied weights with zeros in both directions (some records carry nothing one way, some
/// nothing at all).
fn varied(n: u64) -> Vec<TrafficLeaf> {
    (0..n)
        .map(|i| {
            let e = [0, 1, 7, 0, 1500, 3][(i % 6) as usize];
            let g = [5, 0, 0, 64, 1, 0, 9][(i % 7) as usize];
            let oh = if i % 5 == 0 { [0, 0] } else { [i % 3, i % 4] };
            record(i, e, g, oh)
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
                let w = leaf.wire_bytes(dir).unwrap();
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
            .map(|i| record(i, i % 3, (i * 5) % 4, [i % 2, 0]))
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
        record(1, 4, 0, [0, 0]),
        record(2, 0, 0, [0, 0]),
        record(3, 0, 2, [1, 0]),
        record(4, 0, 0, [0, 0]),
    ];
    let tree = SumTree::build(&leaves).unwrap();
    let hits: Vec<_> = (0..5).map(|o| tree.locate(E, o)).collect();
    assert_eq!(hits, [Some(1), Some(1), Some(1), Some(1), Some(3)]);
    assert_eq!(tree.locate(I, 0), Some(3));
    assert_eq!(tree.locate(I, 1), Some(3));
    assert_eq!(tree.locate(I, 2), None);
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
        verify_opening(&root, &record(0, 1, 1, [0, 0]), &path, E, 0),
        Err(OpeningError::IndexOutOfRange {
            index: 0,
            leaves: 0
        })
    );
}

// ---- refusals -------------------------------------------------------------------------

/// Eleven varied records, record 8 (7 egress payload bytes + 2 overhead, nothing ingress),
/// the first egress byte it covers, and its opening.
fn fixture() -> (Vec<TrafficLeaf>, SumTree, usize, u64, SumPath) {
    let leaves = varied(11);
    let tree = SumTree::build(&leaves).unwrap();
    let i = 8; // egress 7 + overhead 2
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
    fatter.overhead[1] += 1;
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
        record(0, 100, 0, [0, 0]),
        record(1, 50, 0, [0, 0]),
        record(2, 10, 0, [0, 0]),
        record(3, 10, 0, [0, 0]),
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
        overhead: [80, 80],
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
    let other = record(7, 40, 40, [10, 10]);
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
    // Egress weights 1 : 2 : 7 (payload + overhead).
    let leaves = [
        record(0, 1, 0, [0, 0]),
        record(1, 1, 0, [1, 0]),
        record(2, 4, 0, [3, 0]),
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
            overhead: [66, 54],
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
            overhead: [0, 48],
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
            overhead: [40, 60],
        },
    ]
}

const KAT_ROOT: &str = "577c497555bbc4518d00d6ef7f60ea3423247698076d4bb01e15d70d65695f06";

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
    overhead: (u64, u64),
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
    e.extend_from_slice(&overhead.0.to_be_bytes());
    e.extend_from_slice(&overhead.1.to_be_bytes());
    assert_eq!(e.len(), 185);
    let weight = [
        output.1.len() as u64 + overhead.0,
        input.1.len() as u64 + overhead.1,
    ];
    (e, weight)
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
        (66, 54),
    );
    let (eb, wb) = hand_leaf(
        42,
        2,
        17,
        (v6_db8(2), 53),
        (v6_db8(9), 40000),
        (0, b"abc"),
        (0, b""),
        (0, 48),
    );
    let (ec, wc) = hand_leaf(
        42,
        3,
        6,
        (v4(10, 0, 0, 2), 8000),
        (v4(10, 0, 0, 10), 50000),
        (1000, b"part"),
        (6, b""),
        (40, 60),
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
        "9c91a93f3ff400bf172938566d83b26d098462d2668f54657c24fc83657d7ed7"
    );
    assert_eq!(
        hex::encode(sha3(&eb)),
        "8ad68063225d3db9e00f6ee01554fbbebef8492ee5f834bff59bdf50446795c1"
    );
    assert_eq!(
        hex::encode(sha3(&ec)),
        "b38ad639e89b58f584f772f785e1b08987bd717b71cf19c04c82b8d35d4b48a4"
    );
    assert_eq!(
        hex::encode(ab.0),
        "462fa89a29d5e1fb151f90217d0306dd11f6cad083594de05b115031841ed5d8"
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
    assert_eq!(got, [115, 70, 61, 140]);
    // Ingress ranges: A 0..59, B 59..110, C 110..174.
    let tree = SumTree::build(&kat_leaves()).unwrap();
    let owners: Vec<_> = got.iter().map(|&o| tree.locate(I, o).unwrap()).collect();
    assert_eq!(owners, [2, 1, 1, 2]);
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
        r#"{"sha3_256":"577c497555bbc4518d00d6ef7f60ea3423247698076d4bb01e15d70d65695f06","bytes":{"egress":112,"ingress":174},"records":3}"#
    );
    assert_eq!(
        serde_json::to_string(&tree.open(2).unwrap()).unwrap(),
        r#"{"index":2,"leaves":3,"siblings":[{"sha3_256":"462fa89a29d5e1fb151f90217d0306dd11f6cad083594de05b115031841ed5d8","bytes":{"egress":72,"ingress":110}}]}"#
    );
    assert_eq!(
        serde_json::to_string(&leaves[1]).unwrap(),
        r#"{"epoch_seq":42,"kind":"raw_flow","flow":{"proto":17,"local":"[2001:db8::2]:53","remote":"[2001:db8::9]:40000"},"input":{"offset":0,"len":3,"sha3_256":"3a985da74fe225b2045c172d6bd390bd855f086e3e9d525b46bfe24511431532"},"output":{"offset":0,"len":0,"sha3_256":"a7ffc6f8bf1ed76651c14756a061d662f580ff4de43b49fa82d80a4b80f8434a"},"overhead":{"egress":0,"ingress":48}}"#
    );
    let extra = serde_json::to_string(&root)
        .unwrap()
        .replacen('{', r#"{"x":1,"#, 1);
    assert!(serde_json::from_str::<TrafficRoot>(&extra).is_err());
}

// ---- properties -------------------------------------------------------------------------

fn arb_leaves() -> impl Strategy<Value = Vec<TrafficLeaf>> {
    prop::collection::vec(
        (0u64..2000, 0u64..2000, 0u64..100, 0u64..100, any::<bool>()),
        1..60,
    )
    .prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (e, g, oe, og, zero))| {
                if zero {
                    record(i as u64, 0, 0, [0, 0])
                } else {
                    record(i as u64, e, g, [oe, og])
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
