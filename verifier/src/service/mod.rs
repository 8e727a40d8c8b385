//! The verifier's service: every operation the API, the pages and the CLI perform goes
//! through [`Verifier`]. Ingest checks a statement's signature and attribution ([`prepare`],
//! outside the lock), loads its stored context, has it judged (pure, in `appraisal`), and
//! applies the verdict's effects (nonce consumed, wipe clock, the statement itself). A
//! batch is one transaction, each statement a savepoint in it: a statement the store fails
//! on leaves nothing behind but its refusal.
//!
//! [`prepare`]: crate::envelope_check::prepare

use std::{collections::HashMap, sync::Arc};

use rackwarden_attest::{keys, statement::Challenge, traffic::SampleDemand};

pub use crate::appraisal::{AttestationResult, Finding, Status};
pub use crate::envelope_check::{KeyTable, PrepareError, Prepared, PreparedItem, prepare};
use crate::{
    appraisal::{self, Appraisal},
    config::Policy,
    metrics::Metrics,
    page::view::RackView,
    standing::{self, EnrolledHost, RackStanding},
    store::{Clearance, DbError, HostKey, Rotation, Store, StoredStatement},
};
pub use rackwarden_attest::api::{IngestOutcome, IngestStatus};
pub use tpm_enrol::TpmEnrolError;

/// Sampling after commitment: the draw, and the openings (`/v1/openings`).
mod openings;
/// The transparency log: checkpoints, proofs and tiles of the stored statements.
mod tlog;
/// AK enrolment (`/v1/tpm/enroll`, `/v1/tpm/activate`): a child module, for the private fields.
mod tpm_enrol;
pub use openings::OpeningsError;
pub use tlog::{Ingested, LogServeError};

#[derive(Debug, thiserror::Error)]
pub enum VerifierError {
    #[error("database: {0}")]
    Db(#[from] DbError),
    #[error("rack `{rack}` host `{host}` is not enrolled")]
    NotEnrolled { rack: String, host: String },
    #[error(
        "rack `{rack}` host `{host}` already has {outstanding} unused nonces; use one or wait {retry_after_s} s"
    )]
    TooManyNonces {
        rack: String,
        host: String,
        outstanding: u64,
        retry_after_s: u64,
    },
    /// An enrolled public key that does not parse (`keys::parse_verifying_key`'s reason).
    #[error("{0}")]
    Key(String),
    #[error("{0}")]
    Nonce(#[from] rackwarden_attest::nonce::NonceError),
    #[error("transparency log: {0}")]
    Log(String),
    /// A verdict that could not be written as JSON: nothing is stored for the statement.
    #[error("cannot write the verdict as JSON: {0}")]
    VerdictJson(#[from] serde_json::Error),
    #[error(
        "key {keyid} is already enrolled for {enrolled_rack}/{enrolled_host}: one key belongs to one host (make a key for {rack}/{host})"
    )]
    KeyOfAnotherHost {
        keyid: String,
        enrolled_rack: String,
        enrolled_host: String,
        rack: String,
        host: String,
    },
    #[error(
        "key {keyid} of {rack}/{host} was retired at {retired_ms} ms; a retired key is not enrolled again (make a new key)"
    )]
    RetiredKey {
        keyid: String,
        rack: String,
        host: String,
        retired_ms: u64,
    },
}

/// What `enroll` did.
#[derive(Debug, Clone)]
pub struct Enrolled {
    pub keyid: String,
    /// The same key was already enrolled for this host: nothing changed.
    pub already: bool,
    pub warnings: Vec<String>,
}

/// A nonce issued to a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedNonce {
    pub nonce: String,
    pub expires_at_ms: u64,
}

/// What `clear` did.
#[derive(Debug, Clone)]
pub struct Cleared {
    /// Contraindicated statements the clearance covers that no earlier one did.
    pub statements: usize,
    pub clearance: Clearance,
}

pub struct Verifier {
    pub store: Store,
    pub policy: Policy,
    keys: Arc<KeyTable>,
    keys_loaded: std::time::Instant,
    pub metrics: Metrics,
    /// `[tpm]`: whom AK enrolment trusts (`None`: this verifier enrols no AKs). Set with
    /// `with_tpm_enrolment`.
    tpm: Option<crate::config::TpmEnrolConfig>,
    /// The transparency log's signer (its key name is the log's origin; `None`: leaves are
    /// appended, but no checkpoint is signed or served). Set with `with_log`.
    log: Option<rackwarden_attest::tlog::note::NoteSigner>,
}

/// What ingest made of one statement: the outcome, the leaf index of the statement stored
/// (or stored before), and the sample drawn for its traffic root.
pub(crate) type Judged = (IngestOutcome, Option<u64>, Option<SampleDemand>);

/// Unused, unexpired nonces one host may hold: a daemon asks once per epoch.
pub const MAX_OUTSTANDING_NONCES: u64 = 16;

impl Verifier {
    pub fn new(store: Store, policy: Policy) -> Result<Verifier, VerifierError> {
        let mut v = Verifier {
            store,
            policy,
            keys: Arc::new(HashMap::new()),
            keys_loaded: std::time::Instant::now(),
            metrics: Metrics::default(),
            tpm: None,
            log: None,
        };
        v.reload_keys()?;
        Ok(v)
    }

    pub fn reload_keys(&mut self) -> Result<(), VerifierError> {
        let mut t = HashMap::new();
        for k in self.store.host_keys()? {
            let vk = keys::parse_verifying_key(&k.pubkey_pem)
                .map_err(|e| VerifierError::Key(e.to_string()))?;
            t.insert(k.keyid.clone(), (k, vk));
        }
        self.keys = Arc::new(t);
        self.keys_loaded = std::time::Instant::now();
        Ok(())
    }

    /// The key table to check signatures with outside the lock.
    pub fn keys(&self) -> Arc<KeyTable> {
        self.keys.clone()
    }

    /// Enrolls (or rotates) a host's key. One key belongs to one host: a key enrolled for
    /// another host, or retired, is refused. A rack with no agreement in the policy is
    /// enrolled with a warning (its hosts are contraindicated until the policy names it).
    pub fn enroll(
        &mut self,
        rack: &str,
        host: &str,
        pubkey_pem: &str,
        now_ms: u64,
    ) -> Result<Enrolled, VerifierError> {
        let vk =
            keys::parse_verifying_key(pubkey_pem).map_err(|e| VerifierError::Key(e.to_string()))?;
        let keyid = keys::keyid(&vk);
        let mut warnings = Vec::new();
        if !self.policy.racks.contains_key(rack) {
            warnings.push(format!(
                "rack `{rack}` has no agreement in the policy ([racks.{rack}]): its hosts are contraindicated (no_agreement) until it has one"
            ));
        }
        let existing = self
            .store
            .host_keys()?
            .into_iter()
            .find(|k| k.keyid == keyid);
        let already = match existing {
            Some(k) if k.rack != rack || k.host != host => {
                return Err(VerifierError::KeyOfAnotherHost {
                    keyid,
                    enrolled_rack: k.rack,
                    enrolled_host: k.host,
                    rack: rack.into(),
                    host: host.into(),
                });
            }
            Some(HostKey {
                retired_ms: Some(retired_ms),
                ..
            }) => {
                return Err(VerifierError::RetiredKey {
                    keyid,
                    rack: rack.into(),
                    host: host.into(),
                    retired_ms,
                });
            }
            Some(_) => true,
            None => {
                self.store.enroll(rack, host, &keyid, pubkey_pem, now_ms)?;
                false
            }
        };
        self.reload_keys()?;
        Ok(Enrolled {
            keyid,
            already,
            warnings,
        })
    }

    /// Retires the host's current key: statements it signs later are `retired_key`, and
    /// the host leaves its rack's standing. History is kept.
    pub fn retire(&mut self, rack: &str, host: &str, now_ms: u64) -> Result<String, VerifierError> {
        let Some(k) = self
            .store
            .host_keys()?
            .into_iter()
            .find(|k| k.rack == rack && k.host == host && k.retired_ms.is_none())
        else {
            return Err(VerifierError::NotEnrolled {
                rack: rack.into(),
                host: host.into(),
            });
        };
        self.store.retire(&k.keyid, now_ms)?;
        self.reload_keys()?;
        Ok(k.keyid)
    }

    fn enrolled(&self, rack: &str, host: &str) -> bool {
        self.keys
            .values()
            .any(|(k, _)| k.rack == rack && k.host == host && k.retired_ms.is_none())
    }

    /// Issues a single-use challenge nonce for an enrolled host.
    pub fn issue_nonce(
        &mut self,
        rack: &str,
        host: &str,
        now_ms: u64,
    ) -> Result<IssuedNonce, VerifierError> {
        // A host enrolled (with the local CLI) while we serve is seen without a restart:
        // on a miss, the key table is read again, at most once a second.
        if !self.enrolled(rack, host)
            && self.keys_loaded.elapsed() > std::time::Duration::from_secs(1)
        {
            self.reload_keys()?;
        }
        if !self.enrolled(rack, host) {
            return Err(VerifierError::NotEnrolled {
                rack: rack.into(),
                host: host.into(),
            });
        }
        // What an anonymous caller can make us store is bounded: a few outstanding nonces
        // per enrolled host, and nonces nobody used are pruned a TTL after they expired.
        let ttl = self.policy.nonce_ttl.as_millis() as u64;
        self.store.prune_nonces(now_ms.saturating_sub(ttl))?;
        let outstanding = self.store.outstanding_nonces(rack, host, now_ms)?;
        if outstanding >= MAX_OUTSTANDING_NONCES {
            return Err(VerifierError::TooManyNonces {
                rack: rack.into(),
                host: host.into(),
                outstanding,
                retry_after_s: self.policy.nonce_ttl.as_secs().max(1),
            });
        }
        let nonce = rackwarden_attest::nonce::Nonce::random()?.to_hex();
        let expires = now_ms + self.policy.nonce_ttl.as_millis() as u64;
        self.store
            .insert_nonce(&nonce, rack, host, now_ms, expires)?;
        self.metrics.challenges += 1;
        Ok(IssuedNonce {
            nonce,
            expires_at_ms: expires,
        })
    }

    /// Runs `f` in one transaction: committed durably once if it returns `Ok` (an
    /// acknowledgement is sent only once it is on disk), rolled back otherwise.
    pub fn in_transaction<T>(
        &mut self,
        f: impl FnOnce(&mut Verifier) -> Result<T, VerifierError>,
    ) -> Result<T, VerifierError> {
        self.store.begin()?;
        let out = f(self).and_then(|t| Ok(self.store.commit().map(|()| t)?));
        if out.is_err() {
            self.store.rollback();
            // A rotation the transaction applied is undone: so is its key table.
            self.reload_keys_after_rollback();
        }
        out
    }

    /// Checks and stores a batch of [`prepare`]d statements in one transaction, each in a
    /// savepoint of its own: an item the store fails on is rolled back alone (its refusal is
    /// its outcome), the others are kept. `Err`: the transaction itself failed, nothing is
    /// stored.
    /// Each stored statement (accepted, or a duplicate of one) comes back with its log
    /// entry: its leaf index, its inclusion proof and the checkpoint of the log with the
    /// whole batch in it (signed before the commit; sent only after it).
    pub fn ingest_batch(
        &mut self,
        items: Vec<PreparedItem>,
        now_ms: u64,
    ) -> Result<Vec<Result<Ingested, VerifierError>>, VerifierError> {
        self.in_transaction(|v| {
            let judged: Vec<Result<Judged, VerifierError>> = items
                .into_iter()
                .map(|item| v.ingest_prepared(item, now_ms))
                .collect();
            Ok(v.with_log_entries(judged))
        })
    }

    /// Checks one envelope and stores it if it is attributable. `now_ms` is the receipt time.
    pub fn ingest(&mut self, raw: &[u8], now_ms: u64) -> Result<IngestOutcome, VerifierError> {
        let prepared = prepare(&self.keys, raw);
        self.ingest_prepared(
            PreparedItem {
                raw: raw.to_vec(),
                prepared,
            },
            now_ms,
        )
        .map(|(o, _, _)| o)
    }

    /// The database half of ingest, in a savepoint: everything the statement wrote is kept
    /// or none of it.
    fn ingest_prepared(
        &mut self,
        item: PreparedItem,
        now_ms: u64,
    ) -> Result<Judged, VerifierError> {
        self.store.savepoint()?;
        let judged = self
            .judge(item, now_ms)
            .and_then(|o| Ok(self.store.release_savepoint().map(|()| o)?));
        match judged {
            Ok(out) => {
                self.metrics.count(&out.0);
                Ok(out)
            }
            Err(e) => {
                if let Err(rb) = self.store.rollback_to_savepoint() {
                    log::error!("rolling back a failed statement: {rb}");
                }
                self.reload_keys_after_rollback();
                Err(e)
            }
        }
    }

    /// Reloads the key table after a rollback (which may have undone a rotation); a store
    /// that cannot be read leaves the table as it was, logged.
    fn reload_keys_after_rollback(&mut self) {
        if let Err(e) = self.reload_keys() {
            log::error!("reloading the key table after a rollback: {e}");
        }
    }

    /// A statement signed by an unknown key is prepared again: against the current key table
    /// (a rotation earlier in the same batch, or since it was prepared, adds the new key),
    /// after reloading it from the store (keys enrolled while the service runs) at most once
    /// a second.
    fn judge(&mut self, item: PreparedItem, now_ms: u64) -> Result<Judged, VerifierError> {
        let PreparedItem { raw, prepared } = item;
        let prepared = match prepared {
            Err(PrepareError::UnknownKey) => {
                if self.keys_loaded.elapsed() > std::time::Duration::from_secs(1) {
                    self.reload_keys()?;
                }
                prepare(&self.keys, &raw)
            }
            other => other,
        };
        match prepared {
            Err(reason) => Ok((IngestOutcome::rejected(reason.to_string()), None, None)),
            Ok(p) => self.judge_and_store(p, now_ms),
        }
    }

    /// The outcome, and the leaf index of the statement stored (or stored before).
    fn judge_and_store(&mut self, pr: Prepared, now_ms: u64) -> Result<Judged, VerifierError> {
        let Prepared {
            hk,
            raw,
            statement: st,
            pae,
            pae_sha3,
            tpm,
        } = pr;
        let p = &st.predicate;
        if let Some(prev) = self.store.by_pae(&hk.rack, &hk.host, &pae)? {
            let index = self.store.tlog_index_of(prev.id)?;
            // The sample drawn when it was first stored: the host may not have got it.
            let sample = self
                .store
                .sample(&hk.rack, &hk.host, p.seq)?
                .map(|s| s.demand);
            return Ok((
                IngestOutcome {
                    status: IngestStatus::Duplicate,
                    result: prev.result(),
                    reason: None,
                },
                index,
                sample,
            ));
        }
        let ctx = crate::appraisal_context::load(&self.store, &hk, &st, &pae, pae_sha3, tpm)?;
        // Whatever comes of it, a nonce a statement named is evidence from now on (never pruned).
        if let Challenge::Nonce { nonce } = &p.challenge {
            self.store.present_nonce(nonce, now_ms)?;
        }
        let Appraisal { result, effects } = appraisal::appraise(&self.policy, &st, &ctx, now_ms);
        if effects.consume_nonce
            && let Challenge::Nonce { nonce } = &p.challenge
        {
            self.store.use_nonce(nonce, now_ms)?;
        }
        // The statement, and with it its host's standing row (gaps, uncleared
        // contraindicated statements: what the pages read instead of the whole history),
        // in this statement's savepoint.
        let statement_id = self.store.insert_statement(&StoredStatement {
            id: 0,
            rack: hk.rack.clone(),
            host: hk.host.clone(),
            seq: p.seq,
            pae_sha3: pae,
            // Verbatim: exactly the bytes received.
            envelope: String::from_utf8_lossy(&raw).into_owned(),
            received_ms: now_ms,
            epoch_end_ms: p.epoch_end_unix_ms,
            status: result.status.name().into(),
            result: serde_json::to_string(&result)?,
            wipe_ms: effects.wipe_counts.then_some(p.epoch_end_unix_ms),
        })?;
        // Its leaf in the transparency log, in the same savepoint.
        let leaf_index = self.log_statement(statement_id, &hk.rack, &hk.host, p.seq, &raw)?;
        if let Some(pos) = &effects.tpm_position {
            self.store.set_tpm_position(&hk.rack, &hk.host, pos)?;
        }
        if let Some(boot) = &effects.tpm_boot {
            self.store.set_tpm_boot(&hk.rack, &hk.host, boot)?;
        }
        if let Some(nk) = &effects.rotate_to {
            self.store.rotate_key(
                &Rotation {
                    rack: &hk.rack,
                    host: &hk.host,
                    old_keyid: &hk.keyid,
                    seq: p.seq,
                    new_keyid: &nk.keyid,
                    new_pem: &nk.public_key_pem,
                },
                now_ms,
            )?;
            // The new key signs the next statement, maybe later in this same batch.
            self.reload_keys()?;
            log::info!(
                "{}/{}: key rotated at seq {} from {} to {}",
                hk.rack,
                hk.host,
                p.seq,
                hk.keyid,
                nk.keyid
            );
        }
        // Drawn only now, with the root stored: the host learns what is sampled after it is
        // bound to what it committed.
        let sample = self.draw_sample(&hk.rack, &hk.host, &st, now_ms)?;
        Ok((
            IngestOutcome {
                status: IngestStatus::Accepted,
                result: Some(result),
                reason: None,
            },
            Some(leaf_index),
            sample,
        ))
    }

    /// Every rack with an agreement or an enrolled host.
    pub fn racks(&self) -> Result<Vec<String>, VerifierError> {
        Ok(standing::racks(&self.store, &self.policy)?)
    }

    /// The rack's standing now (see `standing`).
    pub fn rack_standing(&self, rack: &str, now_ms: u64) -> Result<RackStanding, VerifierError> {
        Ok(standing::rack(&self.store, &self.policy, rack, now_ms)?)
    }

    /// Everything the rack's page shows, over each host's last `window` epochs.
    pub fn rack_view(
        &self,
        rack: &str,
        now_ms: u64,
        window: u32,
    ) -> Result<RackView, VerifierError> {
        Ok(crate::page::view::rack_view(
            &self.store,
            &self.policy,
            rack,
            now_ms,
            window,
        )?)
    }

    /// Every enrolled key (current and retired) with its host's last statement.
    pub fn hosts(&self) -> Result<Vec<EnrolledHost>, VerifierError> {
        Ok(standing::hosts(&self.store)?)
    }

    /// A host's statements, newest first.
    pub fn history(
        &self,
        rack: &str,
        host: &str,
        limit: u32,
    ) -> Result<Vec<StoredStatement>, VerifierError> {
        Ok(self.store.history(rack, host, limit)?)
    }

    /// The statements stored at `seq` (two for a fork).
    pub fn statements_at(
        &self,
        rack: &str,
        host: &str,
        seq: u64,
    ) -> Result<Vec<StoredStatement>, VerifierError> {
        Ok(self.store.by_seq(rack, host, seq)?)
    }

    /// Clears the host's contraindicated statements stored so far (the operator's
    /// decision, recorded with who made it and why), and the host's standing row with them.
    pub fn clear(
        &self,
        rack: &str,
        host: &str,
        by: &str,
        reason: &str,
        now_ms: u64,
    ) -> Result<Cleared, VerifierError> {
        let clearance = self.store.clear(rack, host, by, reason, now_ms)?;
        Ok(Cleared {
            statements: clearance.cleared.len(),
            clearance,
        })
    }

    /// Every clearance recorded, oldest first (of one rack, if named).
    pub fn clearances(&self, rack: Option<&str>) -> Result<Vec<Clearance>, VerifierError> {
        Ok(self.store.clearances(rack, None)?)
    }

    /// Prometheus text exposition (an error only where the encoder's writer fails).
    pub fn metrics_text(&self, now_ms: u64) -> Result<String, std::fmt::Error> {
        let racks = self.racks().map(|racks| {
            racks
                .into_iter()
                .filter_map(|r| Some((r.clone(), self.rack_standing(&r, now_ms).ok()?.status)))
                .collect::<Vec<_>>()
        });
        crate::metrics::text(&self.metrics, racks)
    }
}
