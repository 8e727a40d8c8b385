//! The host's side of sampling: the openings of the records the verifier asked about.
//!
//! After storing a statement, the verifier draws 32 random bytes and, from them and the
//! committed root, `k` byte offsets per direction
//! ([`SampleDemand::offsets`]). The host opens each record some drawn offset lands in, once:
//! the record as the epoch's spool file holds it ([`spool`](super::spool)), its path in the
//! sum tree, and its bytes in base64 (`docs/traffic-format.md`, section 12).
//!
//! The spool's leaves must rebuild exactly the root the statement committed: a spool that does
//! not is never opened from ([`OpeningsError::RootMismatch`]). The records' bytes are sent as
//! the spool holds them; bytes that no longer match their record's digest are for the
//! verifier's check to refuse ([`Opening::check`]), not for the host to hide.
//!
//! Pure except for reading the one spool file.

use std::path::{Path, PathBuf};

use base64::{Engine as _, engine::general_purpose::STANDARD};
use rackwarden_attest::traffic::{OpenedRecord, SampleDemand, SumTree, TrafficRoot};

use super::spool::{self, path_for};

#[derive(Debug, thiserror::Error)]
pub enum OpeningsError {
    #[error("epoch {seq}: its records are not in the tap spool ({}): never kept, or released once the verifier was done with them", .path.display())]
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

/// Opens, from the spool file of `demand.epoch_seq`, each record a drawn offset lands in,
/// once, in leaf order; `root` is the root the statement committed (the spool's leaves must
/// rebuild it exactly, or [`RootMismatch`](OpeningsError::RootMismatch): never open from a
/// spool that does not match what was signed).
///
/// A direction without bytes draws no offsets; a demand of 0 per direction opens nothing.
pub fn open_epoch(
    spool_dir: &Path,
    root: &TrafficRoot,
    demand: &SampleDemand,
) -> Result<Vec<OpenedRecord>, OpeningsError> {
    let seq = demand.epoch_seq;
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
    let mut wanted = Vec::new();
    for (dir, offsets) in demand.offsets(root) {
        for offset in offsets {
            // The root matched and the offsets are below its counts, so every offset has a
            // record; the error would be a bug in the tree.
            wanted.push(tree.locate(dir, offset).ok_or_else(|| {
                OpeningsError::Tree(format!(
                    "no record covers {} offset {offset} of {}",
                    dir.name(),
                    describe(root)
                ))
            })?);
        }
    }
    wanted.sort_unstable();
    wanted.dedup();
    wanted
        .into_iter()
        .map(|index| {
            let (Some(record), Some(path)) = (records.get(index), tree.open(index)) else {
                return Err(OpeningsError::Tree(format!(
                    "record {index} of {} cannot be opened",
                    describe(root)
                )));
            };
            Ok(OpenedRecord {
                leaf: record.leaf,
                path,
                input_base64: STANDARD.encode(&record.input),
                output_base64: STANDARD.encode(&record.output),
            })
        })
        .collect()
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

    use rackwarden_attest::{
        evidence::Direction,
        traffic::{
            EpochOpenings, FlowKey, OpeningError, OpeningsRefused, RecordKind, StreamPart,
            TrafficLeaf, empty_root, sample_offsets,
        },
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
            epoch_seq: SEQ,
            randomness,
            per_direction,
            deadline_ms: 0,
        }
    }

    /// The answer as the daemon sends it, checked as the verifier checks it.
    fn check(
        records: Vec<OpenedRecord>,
        root: &TrafficRoot,
        d: &SampleDemand,
    ) -> Result<Vec<rackwarden_attest::traffic::CheckedRecord>, OpeningsRefused> {
        EpochOpenings {
            rack: "r".into(),
            host: "h".into(),
            epoch_seq: d.epoch_seq,
            root: *root,
            records,
        }
        .check("r", "h", root, d)
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
    fn the_answer_opens_each_drawn_record_once_and_checks() {
        let dir = TempDir::new("good");
        let records = epoch();
        let root = keep(&dir, SEQ, &records);
        assert_eq!(root.bytes, [1_211, 1_161]);
        for r in [[0u8; 32], [7; 32], [0xa5; 32]] {
            let d = demand(r, 40);
            let opened = open_epoch(&dir.0, &root, &d).unwrap();
            // Each record once, in leaf order, and only those drawn.
            let indices: Vec<u64> = opened.iter().map(|o| o.path.index).collect();
            let mut drawn: Vec<u64> = Direction::ALL
                .into_iter()
                .flat_map(|dir| {
                    let tree = SumTree::build(&records.iter().map(|r| r.leaf).collect::<Vec<_>>())
                        .unwrap();
                    sample_offsets(&r, &root, dir, 40)
                        .into_iter()
                        .map(move |o| tree.locate(dir, o).unwrap() as u64)
                })
                .collect();
            drawn.sort_unstable();
            drawn.dedup();
            assert_eq!(indices, drawn);
            assert!(
                !indices.contains(&2),
                "the record that weighs nothing is never opened"
            );
            let checked = check(opened, &root, &d).unwrap();
            for c in &checked {
                let rec = &records[c.index as usize];
                assert_eq!(c.leaf, rec.leaf);
                assert_eq!((&c.input, &c.output), (&rec.input, &rec.output));
            }
            // Records of this epoch as the answer for another are refused by the verifier.
            let other = SampleDemand {
                epoch_seq: SEQ + 1,
                ..d
            };
            assert!(matches!(
                check(open_epoch(&dir.0, &root, &d).unwrap(), &root, &other),
                Err(OpeningsRefused::Record {
                    error: OpeningError::Epoch { .. },
                    ..
                })
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
        let d = demand([3; 32], 32);
        let opened = open_epoch(&dir.0, &root, &d).unwrap();
        assert!(
            opened.iter().any(|o| o.path.index == 3),
            "the changed record was sampled"
        );
        match check(opened, &root, &d) {
            Err(OpeningsRefused::Record {
                index: 3, error, ..
            }) => {
                assert_eq!(error, OpeningError::BytesDigest { which: "output" })
            }
            other => panic!("{other:?}"),
        }
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
            epoch_seq: SEQ + 1,
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
        let d = demand([9; 32], 16);
        let opened = open_epoch(&dir.0, &root, &d).unwrap();
        assert!(opened.iter().all(|o| o.leaf.wire[1] == 0));
        check(opened, &root, &d).unwrap();
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
            epoch_seq: SEQ + 1,
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
