//! The host's half of sampling after commitment (issue 27). When the verifier acknowledges
//! a statement with a traffic root it answers with a sample ([`SampleDemand`]); the delivery
//! thread keeps it in the [`OpeningsBook`] (`tap-openings.json`, so a restart or `kill -9`
//! loses no demand), opens the sampled records from the tap spool
//! ([`crate::taps::openings::open_epoch`]), signs them with the host key and posts them to
//! `/v1/openings`. Each answer the verifier acknowledged is named by the next statement
//! ([`OpeningsBook::acknowledged`], [`OpeningsBook::named`]); the epoch's spool file is
//! deleted once its openings are acknowledged, or at the statement's acknowledgement when
//! nothing was sampled.
//!
//! What cannot be answered (the spool lost the epoch, its records do not rebuild the root)
//! is dropped from the book with an error in the journal and in `status`: the verifier
//! contraindicates the epoch at its deadline (`traffic_opening_missing`), so nothing is
//! silently lost.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::Duration,
};

use ed25519_dalek::SigningKey;
use rackwarden_attest::{
    dsse,
    statement::Statement,
    traffic::{
        EpochOpenings, OPENINGS_PAYLOAD_TYPE, OpeningsOutcome, OpeningsReceipt, OpeningsRef,
        SampleDemand, TrafficReport, TrafficRoot,
    },
};
use serde::{Deserialize, Serialize};

use crate::{
    config::epoch::VerifierEndpoint,
    taps::{openings::open_epoch, spool::path_for},
};

/// Both threads (delivery adds and answers, the epoch loop names) read and rewrite the one
/// file: one at a time.
static BOOK: Mutex<()> = Mutex::new(());

/// A demand not yet answered, with the root the host's own statement committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingOpening {
    pub demand: SampleDemand,
    pub root: TrafficRoot,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Book {
    pending: Vec<PendingOpening>,
    /// Acknowledged by the verifier, not yet named by a durable statement.
    acknowledged: Vec<OpeningsRef>,
}

/// What `status` shows of the openings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpeningsStatus {
    /// Sampled epochs not yet answered.
    pub pending: u64,
    /// Answers the verifier acknowledged since the daemon started.
    pub answered: u64,
    /// The last answer the verifier refused, or the last epoch that could not be opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum BookError {
    #[error("{}: {detail}", .path.display())]
    Io { path: PathBuf, detail: String },
    #[error("{}: not an openings book: {detail}", .path.display())]
    Damaged { path: PathBuf, detail: String },
}

/// `tap-openings.json`: the demands not yet answered and the answers not yet named.
#[derive(Debug, Clone)]
pub struct OpeningsBook {
    path: PathBuf,
}

impl OpeningsBook {
    pub fn new(path: PathBuf) -> OpeningsBook {
        OpeningsBook { path }
    }

    fn read(&self) -> Result<Book, BookError> {
        match std::fs::read(&self.path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| BookError::Damaged {
                path: self.path.clone(),
                detail: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Book::default()),
            Err(e) => Err(BookError::Io {
                path: self.path.clone(),
                detail: e.to_string(),
            }),
        }
    }

    fn update<T>(&self, f: impl FnOnce(&mut Book) -> T) -> Result<T, BookError> {
        let _one = BOOK.lock().unwrap_or_else(|p| p.into_inner());
        let mut book = self.read()?;
        let before = book.clone();
        let out = f(&mut book);
        if book != before {
            let bytes = serde_json::to_vec_pretty(&book).map_err(|e| BookError::Io {
                path: self.path.clone(),
                detail: e.to_string(),
            })?;
            crate::atomic_file::replace_private(&self.path, &bytes).map_err(|e| BookError::Io {
                path: self.path.clone(),
                detail: e.to_string(),
            })?;
        }
        Ok(out)
    }

    /// Keeps a demand (once per epoch: a duplicate acknowledgement repeats it).
    pub fn demand(&self, p: PendingOpening) -> Result<(), BookError> {
        self.update(|b| {
            let seq = p.demand.epoch_seq;
            if !b.pending.iter().any(|x| x.demand.epoch_seq == seq)
                && !b.acknowledged.iter().any(|x| x.epoch_seq == seq)
            {
                b.pending.push(p);
            }
        })
    }

    pub fn pending(&self) -> Result<Vec<PendingOpening>, BookError> {
        let _one = BOOK.lock().unwrap_or_else(|p| p.into_inner());
        Ok(self.read()?.pending)
    }

    /// The verifier acknowledged the answer to epoch `r.epoch_seq`.
    pub fn answered(&self, r: OpeningsRef) -> Result<(), BookError> {
        self.update(|b| {
            b.pending.retain(|p| p.demand.epoch_seq != r.epoch_seq);
            if !b.acknowledged.contains(&r) {
                b.acknowledged.push(r);
            }
        })
    }

    /// Epoch `seq` will not be answered (the verifier's deadline finding says so).
    pub fn dropped(&self, seq: u64) -> Result<(), BookError> {
        self.update(|b| b.pending.retain(|p| p.demand.epoch_seq != seq))
    }

    /// The acknowledged answers the next statement names.
    pub fn acknowledged(&self) -> Result<Vec<OpeningsRef>, BookError> {
        let _one = BOOK.lock().unwrap_or_else(|p| p.into_inner());
        Ok(self.read()?.acknowledged)
    }

    /// A durable statement named `refs`: they are not named again.
    pub fn named(&self, refs: &[OpeningsRef]) -> Result<(), BookError> {
        self.update(|b| b.acknowledged.retain(|r| !refs.contains(r)))
    }
}

/// What both threads need: delivery keeps the samples the verifier draws (and releases the
/// spool files of epochs it drew none for), the openings thread answers them.
#[derive(Clone)]
pub struct OpeningsWork {
    pub book: OpeningsBook,
    /// The tap spool (`crate::pins::StatePaths::tap_spool`).
    pub spool_dir: PathBuf,
    /// The current signing key (the epoch loop keeps it current across rotations).
    pub signer: Arc<Mutex<SigningKey>>,
}

/// How long after its deadline a sample is still answered: the verifier keeps a late answer
/// (its finding stands), which is still the record's evidence. Past this, it is dropped.
pub const LATE_ANSWER_GRACE_MS: u64 = 3_600_000;

/// What one pass over the pending samples did.
#[derive(Debug, Default)]
pub struct Progress {
    pub answered: u64,
    /// The last answer refused, or the last sample given up on.
    pub failure: Option<String>,
    /// The verifier answered at least once (or there was nothing to send): `false` sends
    /// the next pass to another instance.
    pub reached: bool,
}

impl OpeningsWork {
    /// The verifier acknowledged statement `seq` (its envelope as the log holds it) with
    /// `sample`: the demand is kept, or, with none, the epoch's records are released.
    pub fn acknowledged(&self, seq: u64, envelope: &[u8], sample: Option<SampleDemand>) {
        match (sample, committed_root(envelope)) {
            (Some(demand), Some(root)) if demand.epoch_seq == seq => {
                if let Err(e) = self.book.demand(PendingOpening { demand, root }) {
                    log::error!("openings: epoch {seq}'s sample cannot be kept: {e}");
                }
            }
            (Some(demand), _) => log::error!(
                "openings: the verifier sampled epoch {} for statement {seq}, which commits no traffic root: ignored",
                demand.epoch_seq
            ),
            (None, _) => release_spool(&self.spool_dir, seq),
        }
    }

    /// The openings thread: answers the pending samples when delivery kicks it (a sample
    /// was kept) and every few seconds, through the verifier instance that last answered.
    /// Its own thread: a large answer takes as long as its upload, and delivery and its
    /// watchdog heartbeat must not wait for it.
    pub fn run(
        self,
        endpoint: Arc<Mutex<VerifierEndpoint>>,
        status: Arc<Mutex<super::delivery::DeliveryStatus>>,
        ids: (String, String),
        stop: &AtomicBool,
        kick: mpsc::Receiver<()>,
    ) {
        let (rack, host) = ids;
        let mut client: Option<(VerifierEndpoint, reqwest::blocking::Client)> = None;
        let mut current = 0usize;
        while !stop.load(Ordering::SeqCst) {
            match kick.recv_timeout(Duration::from_secs(2)) {
                Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            if self.book.pending().map_or(true, |p| p.is_empty()) {
                continue;
            }
            let Some(ep) = endpoint.lock().ok().map(|e| e.clone()) else {
                break;
            };
            if client.as_ref().is_none_or(|(e, _)| *e != ep) {
                match super::transport::client(&ep, ep.request_timeout) {
                    Ok(c) => client = Some((ep.clone(), c)),
                    Err(e) => {
                        log::error!("openings: cannot build the HTTP client: {e}");
                        continue;
                    }
                }
            }
            let Some((_, http)) = &client else { continue };
            let urls: Vec<&str> = ep.urls().collect();
            let base = urls[current % urls.len()];
            let p = self.answer_pending(http, base, &rack, &host);
            if !p.reached {
                current = (current + 1) % urls.len();
            }
            if let Ok(mut st) = status.lock() {
                let o = &mut st.openings;
                o.answered += p.answered;
                o.pending = self.book.pending().map_or(o.pending, |p| p.len() as u64);
                if p.failure.is_some() {
                    o.last_failure = p.failure;
                }
            }
        }
    }

    /// Answers the pending samples, oldest first, until one must wait (the verifier is not
    /// answering); a sample an hour past its deadline is dropped.
    pub fn answer_pending(
        &self,
        client: &reqwest::blocking::Client,
        base: &str,
        rack: &str,
        host: &str,
    ) -> Progress {
        let mut progress = Progress {
            reached: true,
            ..Progress::default()
        };
        let pending = match self.book.pending() {
            Ok(p) => p,
            Err(e) => {
                log::error!("openings: {e}");
                return progress;
            }
        };
        let Ok(key) = self.signer.lock().map(|k| k.clone()) else {
            return progress;
        };
        let give_up = |seq: u64, why: String, progress: &mut Progress| {
            log::error!(
                "openings: epoch {seq} cannot be answered, the verifier will find it missing: {why}"
            );
            if let Err(e) = self.book.dropped(seq) {
                log::error!("openings: epoch {seq}: {e}");
            }
            release_spool(&self.spool_dir, seq);
            progress.failure = Some(if why.starts_with("epoch ") {
                why
            } else {
                format!("epoch {seq}: {why}")
            });
        };
        for (i, p) in pending.iter().enumerate() {
            let seq = p.demand.epoch_seq;
            if rackwarden_attest::now_ms()
                > p.demand.deadline_ms.saturating_add(LATE_ANSWER_GRACE_MS)
            {
                give_up(
                    seq,
                    format!(
                        "its deadline ({} ms) passed more than an hour ago",
                        p.demand.deadline_ms
                    ),
                    &mut progress,
                );
                continue;
            }
            let (result, digest) = answer(client, base, &key, rack, host, &self.spool_dir, p);
            match result {
                Answer::Acknowledged(r) => {
                    let line = describe_receipt(&r);
                    if let OpeningsOutcome::Refused { .. } = r.outcome {
                        log::error!("openings: {line}");
                        progress.failure = Some(line);
                    } else {
                        log::info!("openings: {line}");
                    }
                    let Some(sha3_256) = digest else { continue };
                    if let Err(e) = self.book.answered(OpeningsRef {
                        epoch_seq: seq,
                        sha3_256,
                    }) {
                        log::error!("openings: epoch {seq}: {e}");
                        continue;
                    }
                    progress.answered += 1;
                    release_spool(&self.spool_dir, seq);
                }
                Answer::Abandoned(why) => give_up(seq, why, &mut progress),
                Answer::Later(why) => {
                    log::warn!("openings: epoch {seq} not answered yet: {why}");
                    // Nothing answered in this pass: try another instance next time.
                    if i == 0 || progress.answered == 0 {
                        progress.reached = false;
                    }
                    break;
                }
            }
        }
        progress
    }
}

/// The traffic root a statement envelope (as the log holds it) committed, if any.
pub fn committed_root(envelope: &[u8]) -> Option<TrafficRoot> {
    let env: dsse::Envelope = serde_json::from_slice(envelope).ok()?;
    let payload = dsse::decode_base64(&env.payload).ok()?;
    let st = Statement::from_verified(&payload).ok()?;
    match st.predicate.traffic? {
        TrafficReport::Committed { summary, .. } => Some(summary.root),
        TrafficReport::Failed { .. } => None,
    }
}

/// Removes epoch `seq`'s spool file, if there is one: its records are no longer needed.
pub fn release_spool(spool_dir: &Path, seq: u64) {
    let path = path_for(spool_dir, seq);
    match std::fs::remove_file(&path) {
        Ok(()) => log::debug!("tap spool: released epoch {seq}"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => log::warn!("tap spool: {} cannot be removed: {e}", path.display()),
    }
}

/// What became of one pending demand.
#[derive(Debug)]
pub enum Answer {
    /// The verifier kept the answer (matched or refused).
    Acknowledged(OpeningsReceipt),
    /// The verifier will never take it (no sample, answered otherwise) or the spool cannot
    /// answer: dropped, with why.
    Abandoned(String),
    /// Not now (the verifier is unreachable or failing): tried again later.
    Later(String),
}

/// Opens, signs and posts the answer to `p`.
pub fn answer(
    client: &reqwest::blocking::Client,
    base: &str,
    key: &SigningKey,
    rack: &str,
    host: &str,
    spool_dir: &Path,
    p: &PendingOpening,
) -> (Answer, Option<[u8; 32]>) {
    let seq = p.demand.epoch_seq;
    let records = match open_epoch(spool_dir, &p.root, &p.demand) {
        Ok(r) => r,
        Err(e) => return (Answer::Abandoned(e.to_string()), None),
    };
    let openings = EpochOpenings {
        rack: rack.into(),
        host: host.into(),
        epoch_seq: seq,
        root: p.root,
        records,
    };
    let body = match serde_json::to_vec(&openings)
        .and_then(|payload| dsse::sign(key, OPENINGS_PAYLOAD_TYPE, &payload).to_json())
    {
        Ok(b) => b,
        Err(e) => return (Answer::Abandoned(format!("epoch {seq}: {e}")), None),
    };
    let digest = rackwarden_attest::sha3(&body);
    let url = format!("{base}/v1/openings");
    // Its own timeout: a sampled record can be a whole epoch of a bulk flow.
    let resp = match client
        .post(&url)
        .header("Content-Type", "application/json")
        .timeout(std::time::Duration::from_secs(600))
        .body(body)
        .send()
    {
        Ok(r) => r,
        Err(e) => {
            return (
                Answer::Later(format!("{url}: {}", super::transport::describe(&e))),
                None,
            );
        }
    };
    let status = resp.status();
    let text = resp.text().unwrap_or_default();
    let answer = match status.as_u16() {
        200 => match serde_json::from_str::<OpeningsReceipt>(&text) {
            Ok(r) if r.sha3_256 == digest && r.epoch_seq == seq => Answer::Acknowledged(r),
            Ok(r) => Answer::Later(format!(
                "{url}: the receipt is for epoch {} digest {}, not what was sent",
                r.epoch_seq,
                hex::encode(r.sha3_256)
            )),
            Err(e) => Answer::Later(format!("{url}: not a receipt: {e}")),
        },
        // 413: larger than the verifier's `max_openings_body`; sending it again changes nothing.
        400 | 403 | 404 | 409 | 413 => {
            Answer::Abandoned(format!("{url}: {status}: {}", text.trim()))
        }
        _ => Answer::Later(format!("{url}: {status}: {}", text.trim())),
    };
    (answer, Some(digest))
}

/// The line the journal gets for an acknowledged answer.
pub fn describe_receipt(r: &OpeningsReceipt) -> String {
    match &r.outcome {
        OpeningsOutcome::Matched { records, .. } => {
            format!("epoch {}: {records} record(s) opened, matched", r.epoch_seq)
        }
        OpeningsOutcome::Refused { reason } => {
            format!(
                "epoch {}: the verifier REFUSED the openings: {reason}",
                r.epoch_seq
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demand(seq: u64) -> PendingOpening {
        PendingOpening {
            demand: SampleDemand {
                epoch_seq: seq,
                randomness: [1; 32],
                per_direction: 4,
                deadline_ms: 10,
            },
            root: rackwarden_attest::traffic::empty_root(),
        }
    }

    #[test]
    fn the_book_survives_reopening_and_names_each_answer_once() {
        let dir = std::env::temp_dir().join(format!(
            "rackwarden-openings-book-{}-{}",
            std::process::id(),
            rackwarden_attest::now_ms()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tap-openings.json");
        let book = OpeningsBook::new(path.clone());
        assert!(book.pending().unwrap().is_empty());
        book.demand(demand(3)).unwrap();
        book.demand(demand(3)).unwrap();
        book.demand(demand(4)).unwrap();
        let again = OpeningsBook::new(path.clone());
        assert_eq!(again.pending().unwrap(), vec![demand(3), demand(4)]);
        let r3 = OpeningsRef {
            epoch_seq: 3,
            sha3_256: [3; 32],
        };
        again.answered(r3).unwrap();
        // A duplicate acknowledgement of statement 3 does not bring its demand back.
        again.demand(demand(3)).unwrap();
        again.dropped(4).unwrap();
        assert!(again.pending().unwrap().is_empty());
        assert_eq!(book.acknowledged().unwrap(), vec![r3]);
        book.named(&[r3]).unwrap();
        assert!(book.acknowledged().unwrap().is_empty());
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::write(&path, b"{").unwrap();
        assert!(matches!(book.pending(), Err(BookError::Damaged { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }

    use std::os::unix::fs::PermissionsExt as _;
}
