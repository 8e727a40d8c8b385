//! The transparency log of stored statements (issue 24): each statement stored gets a leaf
//! (`rackwarden_attest::tlog::statement_leaf`: rack, host, seq and the SHA-256 of the
//! envelope bytes) in the same savepoint; the log is served as C2SP tlog-tiles with a
//! checkpoint signed by the verifier's log key, and each stored statement's ingest answer
//! carries its index, inclusion proof and checkpoint.

use rackwarden_attest::{
    api::{ConsistencyProof, InclusionProof, IngestOutcome, LogEntry},
    tlog::{
        self, HashReader,
        note::{Checkpoint, NoteSigner, NoteVerifier},
        tile::{TILE_HEIGHT, TILE_WIDTH, TileKind, TilePath, encode_bundle, level_count},
    },
};

use super::{Verifier, VerifierError};

/// One statement of a batch as ingested: its outcome and, for a stored statement, its log
/// entry.
#[derive(Debug, Clone)]
pub struct Ingested {
    pub outcome: IngestOutcome,
    pub log: Option<LogEntry>,
    /// The sample drawn for the statement's traffic root, if any.
    pub sample: Option<rackwarden_attest::traffic::SampleDemand>,
}

/// Why a log request is not answered.
#[derive(Debug, thiserror::Error)]
pub enum LogServeError {
    #[error("this verifier signs no checkpoints (it has no log key)")]
    NoLog,
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Internal(String),
}

fn internal(e: impl std::fmt::Display) -> LogServeError {
    LogServeError::Internal(e.to_string())
}

fn hexes(p: &[tlog::Hash]) -> Vec<String> {
    p.iter().map(tlog::hex).collect()
}

impl Verifier {
    /// Signs checkpoints with `signer` (whose key name is the log's origin).
    pub fn with_log(mut self, signer: NoteSigner) -> Verifier {
        self.log = Some(signer);
        self
    }

    /// The log's public key (`None`: no log key).
    pub fn log_verifier(&self) -> Option<NoteVerifier> {
        self.log.as_ref().map(NoteSigner::verifier)
    }

    /// Appends the leaf of a statement just stored (in its savepoint).
    pub(super) fn log_statement(
        &self,
        statement_id: i64,
        rack: &str,
        host: &str,
        seq: u64,
        envelope: &[u8],
    ) -> Result<u64, VerifierError> {
        let data = tlog::statement_leaf(rack, host, seq, envelope).ok_or_else(|| {
            VerifierError::Log("a rack or host id over 65535 bytes has no leaf".into())
        })?;
        self.store
            .tlog_append(statement_id, &data)
            .map_err(|e| VerifierError::Log(e.to_string()))
    }

    /// The log's size and its checkpoint, signed (`None`: no log key).
    fn signed_checkpoint(&self) -> Result<Option<(u64, String)>, VerifierError> {
        self.signed_checkpoint_from(&self.store)
    }

    /// [`Self::signed_checkpoint`], reading the log's nodes through `nodes` (a batch's
    /// [`tlog::Memo`]).
    fn signed_checkpoint_from(
        &self,
        nodes: &impl HashReader,
    ) -> Result<Option<(u64, String)>, VerifierError> {
        let Some(signer) = &self.log else {
            return Ok(None);
        };
        let size = self.store.tlog_size()?;
        let root = tlog::tree_hash(nodes, size).map_err(|e| VerifierError::Log(e.to_string()))?;
        let cp = Checkpoint {
            origin: signer.verifier().name,
            size,
            root,
            extensions: vec![],
        };
        let note = signer
            .sign_checkpoint(&cp)
            .map_err(|e| VerifierError::Log(e.to_string()))?;
        Ok(Some((size, note)))
    }

    /// Each statement of a batch with its log entry against one checkpoint of the log as
    /// it is now. A proof that cannot be made is logged and leaves the entry out (the
    /// statement is stored all the same).
    pub(super) fn with_log_entries(
        &self,
        judged: Vec<Result<super::Judged, VerifierError>>,
    ) -> Vec<Result<Ingested, VerifierError>> {
        let wanted = judged.iter().any(|j| matches!(j, Ok((_, Some(_), _))));
        // One reader for the whole batch: its proofs and its checkpoint share their nodes.
        let nodes = tlog::Memo::new(&self.store);
        let checkpoint = if wanted && self.log.is_some() {
            match self.signed_checkpoint_from(&nodes) {
                Ok(c) => c,
                Err(e) => {
                    log::error!("signing the log's checkpoint: {e}");
                    None
                }
            }
        } else {
            None
        };
        judged
            .into_iter()
            .map(|j| {
                j.map(|(outcome, index, sample)| {
                    let log = match (index, &checkpoint) {
                        (Some(index), Some((size, note))) => {
                            match tlog::inclusion_proof(&nodes, index, *size) {
                                Ok(p) => Some(LogEntry {
                                    index,
                                    proof: hexes(&p),
                                    checkpoint: note.clone(),
                                }),
                                Err(e) => {
                                    log::error!("the inclusion proof of leaf {index}: {e}");
                                    None
                                }
                            }
                        }
                        _ => None,
                    };
                    Ingested {
                        outcome,
                        log,
                        sample,
                    }
                })
            })
            .collect()
    }

    /// `GET /tlog/checkpoint`: the log's checkpoint now, signed.
    pub fn log_checkpoint(&self) -> Result<String, LogServeError> {
        match self.signed_checkpoint().map_err(internal)? {
            Some((_, note)) => Ok(note),
            None => Err(LogServeError::NoLog),
        }
    }

    /// `GET /tlog/<path>`: a tile of hashes or of entries, full or partial, of the log now.
    pub fn log_tile(&self, path: &str) -> Result<Vec<u8>, LogServeError> {
        let tp = TilePath::parse(path).map_err(|e| LogServeError::BadRequest(e.to_string()))?;
        let size = self.store.tlog_size().map_err(internal)?;
        let level = match tp.kind {
            TileKind::Hashes(l) => l,
            TileKind::Entries => 0,
        };
        let start = tp.index.saturating_mul(TILE_WIDTH);
        let end = start.saturating_add(u64::from(tp.width));
        if end > level_count(level, size) {
            return Err(LogServeError::NotFound(format!(
                "{path}: the log of {size} leaves has no such tile"
            )));
        }
        match tp.kind {
            TileKind::Entries => {
                let entries = self.store.tlog_entries(start, end).map_err(internal)?;
                encode_bundle(&entries).map_err(internal)
            }
            TileKind::Hashes(l) => {
                let mut out = Vec::with_capacity(usize::from(tp.width) * 32);
                for i in start..end {
                    let h = self
                        .store
                        .node(u32::from(l) * TILE_HEIGHT, i)
                        .map_err(internal)?;
                    out.extend_from_slice(&h);
                }
                Ok(out)
            }
        }
    }

    /// Everything a static publisher serves for the log now: `checkpoint` and every tile
    /// (full and partial) with its path under the log's prefix.
    pub fn log_publish(&self) -> Result<Vec<(String, Vec<u8>)>, LogServeError> {
        let Some((size, note)) = self.signed_checkpoint().map_err(internal)? else {
            return Err(LogServeError::NoLog);
        };
        let mut out = vec![("checkpoint".to_string(), note.into_bytes())];
        for tp in rackwarden_attest::tlog::tile::tiles_of(size) {
            let path = tp.path();
            let bytes = self.log_tile(&path)?;
            out.push((path, bytes));
        }
        Ok(out)
    }

    fn checked_size(&self, size: u64) -> Result<(), LogServeError> {
        let now = self.store.tlog_size().map_err(internal)?;
        if size > now {
            return Err(LogServeError::NotFound(format!(
                "the log has {now} leaves, not {size}"
            )));
        }
        Ok(())
    }

    /// `GET /v1/tlog/inclusion?index=I&size=N`.
    pub fn log_inclusion(&self, index: u64, size: u64) -> Result<InclusionProof, LogServeError> {
        self.checked_size(size)?;
        let p = tlog::inclusion_proof(&self.store, index, size).map_err(|e| match e {
            tlog::TlogError::IndexOutOfRange { .. } => LogServeError::BadRequest(e.to_string()),
            e => internal(e),
        })?;
        Ok(InclusionProof {
            index,
            size,
            proof: hexes(&p),
        })
    }

    /// `GET /v1/tlog/consistency?from=M&to=N`.
    pub fn log_consistency(&self, from: u64, to: u64) -> Result<ConsistencyProof, LogServeError> {
        self.checked_size(to)?;
        let p = tlog::consistency_proof(&self.store, from, to).map_err(|e| match e {
            tlog::TlogError::SizesReversed { .. } => LogServeError::BadRequest(e.to_string()),
            e => internal(e),
        })?;
        Ok(ConsistencyProof {
            from,
            to,
            proof: hexes(&p),
        })
    }
}
