//! The checks either party runs on the log: a stored statement's entry (its inclusion in a
//! signed checkpoint), two checkpoints' consistency, and a whole checkpoint against the
//! log's tiles (what a third party does offline, from the checkpoint and tiles alone).

use super::{
    Hash, HashReader, TlogError, consistency_proof, leaf_hash,
    note::{Checkpoint, NoteError, NoteVerifier},
    proof_hashes,
    tile::{FetchError, TILE_WIDTH, TileReader},
    tree_hash, verify_consistency, verify_inclusion,
};
use crate::api::LogEntry;

/// Why the log does not check out. Each names what it compared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuditError {
    #[error("checkpoint: {0}")]
    Note(#[from] NoteError),
    #[error("{0}")]
    Log(Box<TlogError>),
    #[error("a proof hash is not 64 hex digits")]
    BadProofHex,
    #[error("leaf {index} is not in the {checkpoint}: {source}")]
    NotIncluded {
        index: u64,
        checkpoint: String,
        source: Box<TlogError>,
    },
    #[error("the log is not append-only: the {old} is not a prefix of the {new}: {source}")]
    Inconsistent {
        old: String,
        new: String,
        source: Box<TlogError>,
    },
    #[error("the tiles of the {checkpoint} hash to root {computed}")]
    TilesMismatch {
        checkpoint: String,
        computed: String,
    },
    #[error("entry {index} hashes to {computed}, but the tiles hold {tile} for it")]
    EntryMismatch {
        index: u64,
        computed: String,
        tile: String,
    },
}

impl From<TlogError> for AuditError {
    fn from(e: TlogError) -> AuditError {
        AuditError::Log(Box::new(e))
    }
}

/// Checks a stored statement's entry: the checkpoint is signed by the log's key, and the
/// statement's leaf (`leaf_data`, see [`super::statement_leaf`]) is leaf `entry.index` of
/// it. Returns the checkpoint.
pub fn check_entry(
    log_key: &NoteVerifier,
    entry: &LogEntry,
    leaf_data: &[u8],
) -> Result<Checkpoint, AuditError> {
    let cp = log_key.open_checkpoint(&entry.checkpoint)?;
    let proof = proof_hashes(&entry.proof).ok_or(AuditError::BadProofHex)?;
    verify_inclusion(
        &leaf_hash(leaf_data),
        entry.index,
        cp.size,
        &proof,
        &cp.root,
    )
    .map_err(|source| AuditError::NotIncluded {
        index: entry.index,
        checkpoint: cp.describe(),
        source: Box::new(source),
    })?;
    Ok(cp)
}

/// Checks that `new` extends `old` with `proof` (hex hashes, as served). Checkpoints of
/// another origin are inconsistent too.
pub fn check_consistency(
    old: &Checkpoint,
    new: &Checkpoint,
    proof: &[String],
) -> Result<(), AuditError> {
    let inconsistent = |source| AuditError::Inconsistent {
        old: old.describe(),
        new: new.describe(),
        source: Box::new(source),
    };
    if old.origin != new.origin {
        return Err(inconsistent(TlogError::Read(format!(
            "the origins differ (`{}`, `{}`)",
            old.origin, new.origin
        ))));
    }
    let proof = proof_hashes(proof).ok_or(AuditError::BadProofHex)?;
    verify_consistency(old.size, new.size, &old.root, &new.root, &proof).map_err(inconsistent)
}

/// What [`audit_tiles`] checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audited {
    pub checkpoint: Checkpoint,
    /// Entries whose data was checked against the leaf hashes.
    pub entries: u64,
}

/// Checks a signed checkpoint against the log's tiles (fetched by `fetch(path)`, a path
/// like `tile/0/000.p/7`, failing with any error that converts to [`FetchError`]): the signature, the root the tiles hash to, every entry's data
/// against its leaf hash (when `entries`), and that each of `older` (checkpoints kept
/// before) is a prefix of it.
pub fn audit_tiles<F, E>(
    log_key: &NoteVerifier,
    note: &str,
    fetch: F,
    entries: bool,
    older: &[Checkpoint],
) -> Result<Audited, AuditError>
where
    F: Fn(&str) -> Result<Vec<u8>, E>,
    E: Into<FetchError>,
{
    let cp = log_key.open_checkpoint(note)?;
    let tiles = TileReader::new(cp.size, fetch);
    let root = tree_hash(&tiles, cp.size)?;
    if root != cp.root {
        return Err(AuditError::TilesMismatch {
            checkpoint: cp.describe(),
            computed: super::hex(&root),
        });
    }
    let mut checked = 0;
    if entries {
        for t in 0..cp.size.div_ceil(TILE_WIDTH) {
            for (j, data) in tiles.entries(t)?.iter().enumerate() {
                let index = t * TILE_WIDTH + j as u64;
                let tile: Hash = tiles.node(0, index)?;
                let computed = leaf_hash(data);
                if computed != tile {
                    return Err(AuditError::EntryMismatch {
                        index,
                        computed: super::hex(&computed),
                        tile: super::hex(&tile),
                    });
                }
                checked += 1;
            }
        }
    }
    for old in older {
        if old.size > cp.size {
            return Err(AuditError::Inconsistent {
                old: old.describe(),
                new: cp.describe(),
                source: Box::new(TlogError::SizesReversed {
                    old: old.size,
                    new: cp.size,
                }),
            });
        }
        let proof = consistency_proof(&tiles, old.size, cp.size)?;
        let hexes: Vec<String> = proof.iter().map(super::hex).collect();
        check_consistency(old, &cp, &hexes)?;
    }
    Ok(Audited {
        checkpoint: cp,
        entries: checked,
    })
}

/// A log key as configured or given on a command line: a C2SP vkey
/// (`<name>+<hash>+<base64 key>`), or the path of a file holding one (the verifier writes
/// `tlog.vkey`).
pub fn load_log_key(arg: &str) -> Result<NoteVerifier, NoteError> {
    let path = std::path::Path::new(arg.trim());
    // A vkey always has `+`; a path without one is a file that must be there.
    if path.is_file() || !arg.contains('+') {
        let text = std::fs::read_to_string(path)
            .map_err(|e| NoteError::BadKey(format!("{}: {e}", path.display())))?;
        return NoteVerifier::from_vkey(&text)
            .map_err(|e| NoteError::BadKey(format!("{}: {e}", path.display())));
    }
    NoteVerifier::from_vkey(arg)
}
