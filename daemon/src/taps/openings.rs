//! The host's side of sampling: the openings of the records the verifier asked about.
//!
//! After storing a statement, the verifier draws 32 random bytes and, from them and the
//! committed root, `k` byte offsets per direction
//! ([`sample_offsets`](rackwarden_attest::traffic::sample_offsets)). For each offset the host
//! opens the record whose frame bytes cover it: the record as the epoch's spool file holds it
//! ([`spool`](super::spool)), its path in the sum tree, and its bytes in base64
//! (`docs/traffic-format.md`, section 12).
//!
//! The spool's leaves must rebuild exactly the root the statement committed: a spool that does
//! not is never opened from ([`OpeningsError::RootMismatch`]). The records' bytes are sent as
//! the spool holds them; bytes that no longer match their record's digest are for the
//! verifier's check to refuse ([`Opening::check`]), not for the host to hide.
//!
//! Pure except for reading the one spool file.

use std::path::{Path, PathBuf};

use base64::{Engine as _, engine::general_purpose::STANDARD};
use rackwarden_attest::{
    evidence::Direction,
    traffic::{Opening, SumTree, TrafficRoot, sample_offsets},
};

use super::spool::{self, path_for};

/// What the verifier demanded for one epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleDemand {
    /// The epoch.
    pub seq: u64,
    /// The verifier's randomness, drawn after it stored the epoch's statement.
    pub randomness: [u8; 32],
    /// Offsets drawn per direction (`k`).
    pub per_direction: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum OpeningsError {
    #[error("epoch {seq}: its records are not in the tap spool ({}): removed to make room, or never kept", .path.display())]
    SpoolMissing { seq: u64, path: PathBuf },
    #[error("epoch {seq}: the tap spool file {} cannot be read: {detail}", .path.display())]
    SpoolUnreadable {
        seq: u64,
        path: PathBuf,
        detail: String,
    },
    #[error("epoch {seq}: the tap spool file {} is not whole records", .path.display())]
    SpoolDamaged { seq: u64, path: PathBuf },
    #[error(
        "epoch {seq}: the spooled records build root {got}, not the committed {expected}; nothing is opened from them"
    )]
    RootMismatch {
        seq: u64,
        expected: String,
        got: String,
    },
    #[error("the epoch's sum tree: {0}")]
    Tree(String),
}

/// Opens, from the spool file of `demand.seq`, the record covering each demanded offset, in
/// direction order (egress then ingress) and draw order; `root` is the root the statement
/// committed (the spool's leaves must rebuild it exactly, or
/// [`RootMismatch`](OpeningsError::RootMismatch): never open from a spool that does not match
/// what was signed).
///
/// A direction without bytes gets no openings; so does a demand of 0 per direction.
pub fn open_epoch(
    spool_dir: &Path,
    root: &TrafficRoot,
    demand: &SampleDemand,
) -> Result<Vec<Opening>, OpeningsError> {
    let seq = demand.seq;
    let path = path_for(spool_dir, seq);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(OpeningsError::SpoolMissing { seq, path });
        }
        Err(e) => {
            return Err(OpeningsError::SpoolUnreadable {
                seq,
                path,
                detail: e.to_string(),
            });
        }
    };
    let Some(records) = spool::decode(&bytes) else {
        return Err(OpeningsError::SpoolDamaged { seq, path });
    };
    drop(bytes);
    let leaves: Vec<_> = records.iter().map(|r| r.leaf).collect();
    let tree = SumTree::build(&leaves).map_err(|e| OpeningsError::Tree(e.to_string()))?;
    if tree.root() != *root {
        return Err(OpeningsError::RootMismatch {
            seq,
            expected: describe(root),
            got: describe(&tree.root()),
        });
    }
    let mut out = Vec::new();
    for dir in Direction::ALL {
        for offset in sample_offsets(&demand.randomness, root, dir, demand.per_direction) {
            // The root matched and the offsets are below its counts, so every offset has a
            // record; the errors below would be a bug in the tree.
            let index = tree.locate(dir, offset).ok_or_else(|| {
                OpeningsError::Tree(format!(
                    "no record covers {} offset {offset} of {}",
                    dir.name(),
                    describe(root)
                ))
            })?;
            let (Some(record), Some(path)) = (records.get(index), tree.open(index)) else {
                return Err(OpeningsError::Tree(format!(
                    "record {index} of {} cannot be opened",
                    describe(root)
                )));
            };
            out.push(Opening {
                epoch_seq: seq,
                direction: dir,
                offset,
                leaf: record.leaf,
                path,
                input_base64: STANDARD.encode(&record.input),
                output_base64: STANDARD.encode(&record.output),
            });
        }
    }
    Ok(out)
}

/// A root in an error message: its hash, record count and bytes per direction.
fn describe(root: &TrafficRoot) -> String {
    format!(
        "{} ({} records, {} egress and {} ingress bytes)",
        hex::encode(root.sha3_256),
        root.records,
        root.bytes[0],
        root.bytes[1]
    )
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use rackwarden_attest::traffic::{
        FlowKey, OpeningError, RecordKind, StreamPart, TrafficLeaf, empty_root,
    };

    use super::super::{records::Record, spool::TapSpool};
    use super::*;

    /// A directory of its own under the system's temporary directory, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            static N: AtomicU64 = AtomicU64::new(0);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let dir = std::env::temp_dir().join(format!(
                "rackwarden-openings-{name}-{}-{nanos}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const SEQ: u64 = 42;

    fn record(kind: RecordKind, port: u16, input: &[u8], output: &[u8], wire: [u64; 2]) -> Record {
        Record {
            leaf: TrafficLeaf {
                epoch_seq: SEQ,
                kind,
                flow: FlowKey {
                    proto: if kind == RecordKind::RawFlow { 17 } else { 6 },
                    local: format!("10.0.0.2:{port}").parse().unwrap(),
                    remote: "10.0.0.10:50000".parse().unwrap(),
                },
                input: StreamPart::of_bytes(0, input),
                output: StreamPart::of_bytes(0, output),
                wire,
            },
            input: input.to_vec(),
            output: output.to_vec(),
        }
    }

    /// An epoch's records: exchanges, raw flows, a partial, and one that weighs nothing.
    fn epoch() -> Vec<Record> {
        vec![
            record(
                RecordKind::Exchange,
                8000,
                b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi",
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nyes",
                [150, 180],
            ),
            record(RecordKind::RawFlow, 53, b"query", b"answer!", [61, 3]),
            // Weighs nothing in either direction: no offset can land on it.
            record(RecordKind::RawFlow, 123, b"", b"", [0, 0]),
            record(
                RecordKind::Exchange,
                8000,
                b"GET /health HTTP/1.1\r\n\r\n",
                b"HTTP/1.1 204 No Content\r\n\r\n",
                [1_000, 1],
            ),
            record(RecordKind::Partial, 8000, b"POST /v1/chat", b"", [0, 977]),
        ]
    }

    /// Spools `records` as epoch `seq` in `dir` the way the daemon does; returns their root.
    fn keep(dir: &TempDir, seq: u64, records: &[Record]) -> TrafficRoot {
        let mut s = TapSpool::open(dir.0.clone(), 1 << 20).unwrap();
        let kept = s.keep(seq, records);
        assert!(
            matches!(kept, super::super::spool::Kept::Kept { .. }),
            "{kept:?}"
        );
        let leaves: Vec<_> = records.iter().map(|r| r.leaf).collect();
        SumTree::build(&leaves).unwrap().root()
    }

    /// Replaces the spool file of `seq` with `records`, in the spool's encoding.
    fn respool(dir: &TempDir, seq: u64, records: &[Record]) {
        let mut bytes = Vec::new();
        for r in records {
            bytes.extend_from_slice(&spool::encode(r).unwrap());
        }
        std::fs::write(path_for(&dir.0, seq), bytes).unwrap();
    }

    fn demand(randomness: [u8; 32], per_direction: u32) -> SampleDemand {
        SampleDemand {
            seq: SEQ,
            randomness,
            per_direction,
        }
    }

    #[test]
    fn path_for_names_the_file_the_spool_writes() {
        let dir = TempDir::new("path");
        keep(&dir, SEQ, &epoch());
        let p = path_for(&dir.0, SEQ);
        assert!(p.is_file(), "{}", p.display());
        assert_eq!(
            p.file_name().unwrap().to_str().unwrap(),
            "00000000000000000042.records"
        );
    }

    #[test]
    fn every_opening_checks_and_answers_a_drawn_offset_in_order() {
        let dir = TempDir::new("good");
        let records = epoch();
        let root = keep(&dir, SEQ, &records);
        assert_eq!(root.bytes, [1_211, 1_161]);
        for r in [[0u8; 32], [7; 32], [0xa5; 32]] {
            let k = 40;
            let openings = open_epoch(&dir.0, &root, &demand(r, k)).unwrap();
            assert_eq!(openings.len(), 2 * k as usize);
            for (i, dir) in Direction::ALL.into_iter().enumerate() {
                let ours = &openings[i * k as usize..(i + 1) * k as usize];
                let drawn = sample_offsets(&r, &root, dir, k);
                assert_eq!(
                    ours.iter().map(|o| o.offset).collect::<Vec<_>>(),
                    drawn,
                    "draw order"
                );
                assert!(ours.iter().all(|o| o.direction == dir));
            }
            for o in &openings {
                assert_eq!(o.epoch_seq, SEQ);
                let (input, output) = o.check(&root, SEQ).unwrap();
                let rec = &records[o.path.index as usize];
                assert_eq!(o.leaf, rec.leaf);
                assert_eq!((input, output), (rec.input.clone(), rec.output.clone()));
                assert_ne!(
                    o.path.index, 2,
                    "the record that weighs nothing is never opened"
                );
                // The JSON the verifier gets reads back the same.
                let j = serde_json::to_string(o).unwrap();
                assert_eq!(&serde_json::from_str::<Opening>(&j).unwrap(), o);
            }
            // The opening of another epoch is refused by the verifier.
            assert!(matches!(
                openings[0].check(&root, SEQ + 1),
                Err(OpeningError::Epoch { .. })
            ));
        }
    }

    #[test]
    fn changed_bytes_are_opened_as_they_are_and_fail_the_digest_check() {
        let dir = TempDir::new("bytes");
        let mut records = epoch();
        let root = keep(&dir, SEQ, &records);
        // Flip one byte of the heavy exchange's response in the file: the leaf (and so the
        // root) still matches, since the leaf holds only the bytes' digest.
        records[3].output[0] ^= 1;
        respool(&dir, SEQ, &records);
        let openings = open_epoch(&dir.0, &root, &demand([3; 32], 32)).unwrap();
        let mut hit = 0;
        for o in &openings {
            if o.path.index == 3 {
                hit += 1;
                assert_eq!(
                    o.check(&root, SEQ),
                    Err(OpeningError::BytesDigest { which: "output" })
                );
            } else {
                o.check(&root, SEQ).unwrap();
            }
        }
        assert!(hit > 0, "the changed record was sampled");
    }

    #[test]
    fn a_spool_whose_leaves_do_not_rebuild_the_root_is_not_opened() {
        let dir = TempDir::new("leaf");
        let mut records = epoch();
        let root = keep(&dir, SEQ, &records);
        records[1].leaf.flow.remote.set_port(50001);
        respool(&dir, SEQ, &records);
        match open_epoch(&dir.0, &root, &demand([1; 32], 8)) {
            Err(OpeningsError::RootMismatch { seq, expected, got }) => {
                assert_eq!(seq, SEQ);
                assert!(
                    expected.starts_with(&hex::encode(root.sha3_256)),
                    "{expected}"
                );
                assert_ne!(expected, got);
            }
            other => panic!("{other:?}"),
        }
        // A record's weight moved to another: same totals, different root.
        let mut records = epoch();
        records[0].leaf.wire[0] -= 1;
        records[1].leaf.wire[0] += 1;
        respool(&dir, SEQ, &records);
        assert!(matches!(
            open_epoch(&dir.0, &root, &demand([1; 32], 8)),
            Err(OpeningsError::RootMismatch { .. })
        ));
        // A record dropped.
        let mut records = epoch();
        records.remove(2);
        respool(&dir, SEQ, &records);
        assert!(matches!(
            open_epoch(&dir.0, &root, &demand([1; 32], 8)),
            Err(OpeningsError::RootMismatch { .. })
        ));
    }

    #[test]
    fn missing_and_damaged_spool_files() {
        let dir = TempDir::new("missing");
        let root = keep(&dir, SEQ, &epoch());
        let next = SampleDemand {
            seq: SEQ + 1,
            ..demand([1; 32], 8)
        };
        match open_epoch(&dir.0, &root, &next) {
            Err(OpeningsError::SpoolMissing { seq, path }) => {
                assert_eq!(seq, SEQ + 1);
                assert_eq!(path, path_for(&dir.0, SEQ + 1));
            }
            other => panic!("{other:?}"),
        }
        let nowhere = TempDir::new("nowhere");
        assert!(matches!(
            open_epoch(&nowhere.0, &root, &demand([1; 32], 8)),
            Err(OpeningsError::SpoolMissing { .. })
        ));
        // Cut short in the middle of a record.
        let p = path_for(&dir.0, SEQ);
        let mut bytes = std::fs::read(&p).unwrap();
        bytes.truncate(bytes.len() - 3);
        std::fs::write(&p, bytes).unwrap();
        match open_epoch(&dir.0, &root, &demand([1; 32], 8)) {
            Err(OpeningsError::SpoolDamaged { seq, path }) => {
                assert_eq!((seq, path), (SEQ, p));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_direction_without_bytes_gets_no_openings() {
        let dir = TempDir::new("empty");
        // Egress only.
        let records = vec![
            record(RecordKind::RawFlow, 53, b"", b"out", [70, 0]),
            record(RecordKind::RawFlow, 123, b"", b"", [0, 0]),
            record(RecordKind::RawFlow, 54, b"", b"more", [30, 0]),
        ];
        let root = keep(&dir, SEQ, &records);
        assert_eq!(root.bytes, [100, 0]);
        let openings = open_epoch(&dir.0, &root, &demand([9; 32], 16)).unwrap();
        assert_eq!(openings.len(), 16);
        for o in &openings {
            assert_eq!(o.direction, Direction::Egress);
            o.check(&root, SEQ).unwrap();
        }
        // No demand, no openings.
        assert!(
            open_epoch(&dir.0, &root, &demand([9; 32], 0))
                .unwrap()
                .is_empty()
        );
        // An epoch without records: its spool file is empty and its root the empty root.
        let root = keep(&dir, SEQ + 1, &[]);
        assert_eq!(root, empty_root());
        let none = SampleDemand {
            seq: SEQ + 1,
            ..demand([9; 32], 16)
        };
        assert!(open_epoch(&dir.0, &root, &none).unwrap().is_empty());
        // Its empty file still has to match: records there are not the empty epoch.
        respool(&dir, SEQ + 1, &records);
        assert!(matches!(
            open_epoch(&dir.0, &root, &none),
            Err(OpeningsError::RootMismatch { .. })
        ));
    }

    #[test]
    fn counts_that_overflow_are_a_tree_error() {
        let dir = TempDir::new("overflow");
        let records = vec![
            record(RecordKind::RawFlow, 53, b"", b"a", [u64::MAX, 0]),
            record(RecordKind::RawFlow, 54, b"", b"b", [1, 0]),
        ];
        let root = keep(&dir, SEQ, &records[..1]);
        respool(&dir, SEQ, &records);
        assert!(matches!(
            open_epoch(&dir.0, &root, &demand([1; 32], 4)),
            Err(OpeningsError::Tree(_))
        ));
    }
}
