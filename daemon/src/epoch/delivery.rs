//! Delivery: sends every statement the log holds and the verifier has not acknowledged,
//! strictly in order, and moves the `delivered` cursor only past what the verifier answered
//! `accepted` or `duplicate` for. A verifier that is down, slow, or refuses (an unenrolled
//! key, a full disk of its own) is retried with exponential backoff up to `retry_max`, each
//! pause jittered over the upper half of its ceiling so a fleet does not retry in lockstep,
//! honouring `Retry-After`; the backlog survives restarts because it is the log itself.
//!
//! ```mermaid
//! stateDiagram-v2
//!     [*] --> Idle
//!     Idle --> Delivering: a statement was signed / retry time
//!     Delivering --> Idle: every statement acknowledged
//!     Delivering --> DeliveryFailed: unreachable, error status, refusal
//!     DeliveryFailed --> Delivering: retry_at reached (backoff, Retry-After)
//! ```

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc,
    },
    time::Duration,
};

use rackwarden_attest::api::{
    ConsistencyProof, IngestItem, IngestStatus, ReceivedResponse, ReceivedVerdict,
};
use serde::{Deserialize, Serialize};

use super::spool::{Cursor, Spool, SpoolLine};
use super::tlog::{Acked, LogKeeper};
use rackwarden_attest::now_ms;

use crate::config::epoch::VerifierEndpoint;

/// Most statements in one POST (a few KB each; far below the verifier's body limit).
pub const BATCH: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum DeliveryState {
    /// Nothing to send.
    Idle,
    /// Sending the statements from `seq` on.
    Delivering { seq: u64 },
    /// The last attempt at `seq` failed; the next is at `retry_at_ms`.
    DeliveryFailed {
        seq: u64,
        attempt: u32,
        retry_at_ms: u64,
        error: String,
    },
}

/// The verifier's answer for the newest statement it acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub seq: u64,
    /// `accepted` or `duplicate`.
    pub ingest: String,
    /// `affirming`, `warning` or `contraindicated` (absent for a duplicate).
    pub status: Option<String>,
    /// Finding codes, e.g. `unchallenged`, `residue_above_max`.
    pub findings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryStatus {
    pub state: DeliveryState,
    /// Seq of the last statement the verifier acknowledged.
    pub delivered_seq: Option<u64>,
    /// Statements in the log not yet acknowledged.
    pub backlog: u64,
    pub last_verdict: Option<Verdict>,
    /// The last failed check of the verifier's transparency log (kept as evidence in
    /// `tlog-failures.jsonl`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_failure: Option<String>,
    /// The verifier instance in use: the one tried last (`url` or one of `fallback_urls`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The traffic samples answered and pending.
    #[serde(default)]
    pub openings: super::openings::OpeningsStatus,
}

impl Default for DeliveryStatus {
    fn default() -> Self {
        DeliveryStatus {
            state: DeliveryState::Idle,
            delivered_seq: None,
            backlog: 0,
            last_verdict: None,
            log_failure: None,
            instance: None,
            openings: Default::default(),
        }
    }
}

pub struct Delivery {
    pub spool: Spool,
    /// Shared with the epoch loop, which updates it on a reload.
    pub endpoint: Arc<Mutex<VerifierEndpoint>>,
    /// The log's length after its last fsynced append (set by the epoch loop).
    pub durable_len: Arc<AtomicU64>,
    pub status: Arc<Mutex<DeliveryStatus>>,
    /// Bumped every pass: the watchdog's evidence that this loop is alive.
    pub heartbeat_ms: Arc<AtomicU64>,
    /// Where each acknowledged statement's log entry is kept and checked.
    pub log: LogKeeper,
    /// This host's ids, as the verifier's log leaves name them.
    pub rack: String,
    pub host: String,
    /// The samples the verifier answers statements with: kept for the openings thread.
    pub openings: super::openings::OpeningsWork,
    /// Wakes the openings thread when a sample was kept.
    pub openings_kick: mpsc::Sender<()>,
}

/// What one attempt achieved.
enum Attempt {
    /// Nothing was pending.
    Nothing,
    /// Every pending statement up to the batch was acknowledged.
    Acked,
    /// `seq`: the statement the attempt was at.
    Failed {
        seq: u64,
        error: String,
        retry_after: Option<Duration>,
    },
}

impl Delivery {
    fn set_state(&self, s: DeliveryState) {
        if let Ok(mut st) = self.status.lock() {
            if st.state != s {
                match &s {
                    DeliveryState::DeliveryFailed {
                        seq,
                        attempt,
                        error,
                        retry_at_ms,
                    } => log::warn!(
                        "delivery: seq {seq} attempt {attempt} failed: {error}; retry in {} ms",
                        retry_at_ms.saturating_sub(now_ms())
                    ),
                    other => log::debug!("delivery: {other:?}"),
                }
            }
            st.state = s;
        }
    }

    fn endpoint(&self) -> Option<VerifierEndpoint> {
        self.endpoint.lock().ok().map(|e| e.clone())
    }

    /// Runs until `stop`; `kick` wakes it when a statement was appended.
    pub fn run(self, stop: &AtomicBool, kick: mpsc::Receiver<()>) {
        let mut attempt: u32 = 0;
        let mut retry_at_ms: u64 = 0;
        // Rebuilt when a reload changes the endpoint (its timeouts live in the client).
        let mut client: Option<(VerifierEndpoint, reqwest::blocking::Client)> = None;
        // Which instance (`url`, then `fallback_urls`) is in use, and how many were tried
        // since one last answered: every one is tried once before the backoff starts.
        let (mut current, mut tried) = (0usize, 0usize);
        while !stop.load(Ordering::SeqCst) {
            self.heartbeat_ms.store(now_ms(), Ordering::SeqCst);
            let Some(ep) = self.endpoint() else { break };
            if client.as_ref().is_none_or(|(e, _)| *e != ep) {
                match super::transport::client(&ep, ep.request_timeout) {
                    Ok(c) => {
                        // A new verifier (a reload) is tried at once, without the old backoff.
                        if client.is_some() {
                            log::info!("delivery: now to {}", ep.url);
                            (attempt, retry_at_ms) = (0, 0);
                        }
                        (current, tried) = (0, 0);
                        client = Some((ep.clone(), c));
                    }
                    Err(e) => {
                        log::error!(
                            "delivery: cannot build the HTTP client: {e}; statements stay in the log"
                        );
                        std::thread::sleep(Duration::from_secs(1));
                        continue;
                    }
                }
            }
            let Some((_, http)) = &client else { continue };
            let urls: Vec<&str> = ep.urls().collect();
            let base = urls[current % urls.len()];
            if now_ms() >= retry_at_ms {
                if let Ok(mut st) = self.status.lock()
                    && st.instance.as_deref() != Some(base)
                {
                    st.instance = Some(base.to_string());
                }
                match self.attempt(http, &ep, base) {
                    Attempt::Nothing => {
                        (attempt, tried) = (0, 0);
                        self.set_state(DeliveryState::Idle);
                    }
                    // More may be pending (a backlog larger than one batch): go on at once.
                    Attempt::Acked => {
                        (attempt, tried) = (0, 0);
                        continue;
                    }
                    // Another instance not yet tried since one answered: at once. The order
                    // is kept: every attempt starts at the first unacknowledged statement.
                    Attempt::Failed { seq, error, .. } if tried + 1 < urls.len() => {
                        tried += 1;
                        current = (current + 1) % urls.len();
                        log::warn!(
                            "delivery: seq {seq} to {base} failed: {error}; failing over to {}",
                            urls[current]
                        );
                        continue;
                    }
                    Attempt::Failed {
                        seq,
                        error,
                        retry_after,
                    } => {
                        tried = 0;
                        current = (current + 1) % urls.len();
                        attempt = attempt.saturating_add(1);
                        // The verifier's Retry-After as given; our own backoff jittered.
                        let wait = retry_after.map_or_else(
                            || jittered(backoff(attempt, ep.retry_max)),
                            |ra| ra.min(Duration::from_secs(3600)),
                        );
                        retry_at_ms = now_ms() + wait.as_millis() as u64;
                        self.set_state(DeliveryState::DeliveryFailed {
                            seq,
                            attempt,
                            retry_at_ms,
                            error,
                        });
                    }
                }
            }
            // A kick does not cut a backoff short: a verifier that failed gets its pause.
            match kick.recv_timeout(Duration::from_millis(200)) {
                Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
    }

    fn attempt(
        &self,
        client: &reqwest::blocking::Client,
        ep: &VerifierEndpoint,
        base: &str,
    ) -> Attempt {
        let fail = |seq: u64, error: String| Attempt::Failed {
            seq,
            error,
            retry_after: None,
        };
        let mut cursor = match self.spool.load_cursor() {
            Ok(c) => c,
            Err(e) => return fail(0, e.to_string()),
        };
        // The statement this attempt is at: the one after the acknowledged one, until the
        // batch says which it is.
        let mut at = cursor.seq.map_or(0, |s| s + 1);
        let durable = self.durable_len.load(Ordering::SeqCst);
        let lines = match self.spool.lines(cursor.offset, durable) {
            Ok(l) => l,
            Err(e) => return fail(at, e.to_string()),
        };
        let backlog = lines.iter().filter(|l| l.statement.is_some()).count() as u64;
        if let Ok(mut st) = self.status.lock() {
            st.backlog = backlog;
            st.delivered_seq = cursor.seq;
        }
        // Leading lines that are not ours are stepped over (they are disclosed in-chain).
        let mut batch: Vec<&SpoolLine> = Vec::new();
        let mut skip_to = None;
        for l in &lines {
            match &l.statement {
                None if batch.is_empty() => skip_to = Some(l.end),
                None => break,
                Some(_) if batch.len() < BATCH => batch.push(l),
                Some(_) => break,
            }
        }
        if let Some(end) = skip_to {
            log::warn!(
                "delivery: stepping over bytes {}..{end} of the log: not a statement of ours (disclosed as an incident)",
                cursor.offset
            );
            cursor.offset = end;
            if let Err(e) = self.spool.save_cursor(&cursor) {
                return fail(at, e.to_string());
            }
        }
        let Some(first) = batch.first().and_then(|l| l.statement.as_ref()) else {
            return Attempt::Nothing;
        };
        at = first.0;
        self.set_state(DeliveryState::Delivering { seq: at });
        let answer = match post_batch(client, base, &batch) {
            Ok(a) => a,
            Err(failed) => return failed.at(at),
        };
        let mut acked = 0usize;
        let mut refusal = None;
        let mut logged: Vec<Acked<'_>> = Vec::new();
        for (i, l) in batch.iter().enumerate() {
            let Some((seq, _)) = &l.statement else { break };
            at = *seq;
            let verdict = match verdict_of(answer.item(i), *seq) {
                Ok(v) => v,
                Err(refused) => {
                    refusal = Some(refused.to_string());
                    break;
                }
            };
            if let Some(st) = &verdict.status
                && st != "affirming"
            {
                log::warn!("verifier: seq {seq} is {st}: {:?}", verdict.findings);
            }
            if let (Some(IngestItem::Judged { sample, .. }), Some((_, env))) =
                (answer.item(i), &l.statement)
            {
                self.openings.acknowledged(*seq, env, *sample);
                if sample.is_some() {
                    let _ = self.openings_kick.send(());
                }
            }
            if let (Some(IngestItem::Judged { log: Some(e), .. }), Some((_, env))) =
                (answer.item(i), &l.statement)
            {
                logged.push(Acked {
                    seq: *seq,
                    envelope: env,
                    entry: e.clone(),
                });
            }
            cursor = Cursor {
                offset: l.end,
                seq: Some(*seq),
            };
            acked += 1;
            at = *seq + 1;
            if let Ok(mut s) = self.status.lock() {
                s.last_verdict = Some(verdict);
            }
        }
        if acked > 0 {
            if let Err(e) = self.spool.save_cursor(&cursor) {
                return fail(at, e.to_string());
            }
            log::info!(
                "delivered {acked} statement(s) up to seq {} to {base}",
                cursor.seq.unwrap_or(0)
            );
            if let Ok(mut st) = self.status.lock() {
                st.delivered_seq = cursor.seq;
                st.backlog = backlog.saturating_sub(acked as u64);
            }
        }
        if !logged.is_empty() {
            let kept = self.log.keep(
                ep.log_key.as_ref(),
                &self.rack,
                &self.host,
                logged,
                |from, to| fetch_consistency(client, base, from, to),
                now_ms(),
            );
            if let Err(e) = kept
                && let Ok(mut st) = self.status.lock()
            {
                st.log_failure = Some(e.to_string());
            }
        }
        match refusal {
            Some(error) => fail(at, error),
            None => Attempt::Acked,
        }
    }
}

/// Why a POST of a batch got no answer to read.
struct PostFailed {
    error: String,
    retry_after: Option<Duration>,
}

impl PostFailed {
    fn at(self, seq: u64) -> Attempt {
        Attempt::Failed {
            seq,
            error: self.error,
            retry_after: self.retry_after,
        }
    }
}

/// Why the verifier gave no consistency proof (the check waits for the next batch).
#[derive(Debug, thiserror::Error)]
enum ConsistencyFetchError {
    #[error("{url}: {cause}")]
    Unreachable { url: String, cause: String },
    #[error("{url}: {status}: {body}")]
    Refused {
        url: String,
        status: reqwest::StatusCode,
        body: String,
    },
    #[error("{url}: answer is not a consistency proof: {source}")]
    NotAProof {
        url: String,
        #[source]
        source: serde_json::Error,
    },
}

/// `GET /v1/tlog/consistency?from=M&to=N`.
fn fetch_consistency(
    client: &reqwest::blocking::Client,
    base: &str,
    from: u64,
    to: u64,
) -> Result<ConsistencyProof, ConsistencyFetchError> {
    let url = format!("{base}/v1/tlog/consistency?from={from}&to={to}");
    let resp = client
        .get(&url)
        .send()
        .map_err(|e| ConsistencyFetchError::Unreachable {
            url: url.clone(),
            cause: super::transport::describe(&e),
        })?;
    let status = resp.status();
    let text = resp.text().unwrap_or_default();
    if !status.is_success() {
        return Err(ConsistencyFetchError::Refused {
            url,
            status,
            body: text.trim().to_string(),
        });
    }
    serde_json::from_str(&text).map_err(|source| ConsistencyFetchError::NotAProof { url, source })
}

/// POSTs the batch's envelopes, verbatim, as one JSON array (the verifier stores the
/// exact bytes it receives), and parses the answer.
fn post_batch(
    client: &reqwest::blocking::Client,
    base: &str,
    batch: &[&SpoolLine],
) -> Result<ReceivedResponse, PostFailed> {
    let failed = |error: String| PostFailed {
        error,
        retry_after: None,
    };
    let mut body = b"[".to_vec();
    for (i, l) in batch.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        if let Some((_, b)) = &l.statement {
            body.extend_from_slice(b);
        }
    }
    body.push(b']');
    let url = format!("{base}/v1/statements");
    let resp = client
        .post(&url)
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .map_err(|e| failed(format!("{url}: {}", super::transport::describe(&e))))?;
    let status = resp.status();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let text = resp.text().unwrap_or_default();
    if !status.is_success() {
        return Err(PostFailed {
            error: format!("{url}: {status}: {}", text.trim()),
            retry_after,
        });
    }
    read_answer(&text).map_err(|e| failed(format!("{url}: answer is not an ingest response: {e}")))
}

/// The verifier's answer to a POST of statements. Verdicts are read with their codes as
/// text: a code this build does not know (a newer verifier) is kept by name, not a reason to
/// refuse the whole answer.
fn read_answer(text: &str) -> Result<ReceivedResponse, serde_json::Error> {
    serde_json::from_str(text)
}

/// The verifier did not acknowledge a statement: what it answered instead.
#[derive(Debug, thiserror::Error)]
#[error("the verifier answered `{answered}` for seq {seq}: {}", reason.as_deref().unwrap_or("no reason given"))]
struct Refused {
    seq: u64,
    /// `rejected`, `error`, or `missing` (no item for the statement).
    answered: &'static str,
    reason: Option<String>,
}

/// The verdict for the statement at `seq` if the verifier acknowledged it (`accepted` or
/// `duplicate`).
fn verdict_of(item: Option<&IngestItem<ReceivedVerdict>>, seq: u64) -> Result<Verdict, Refused> {
    let refused = |answered, reason: Option<&String>| Refused {
        seq,
        answered,
        reason: reason.cloned(),
    };
    match item {
        None => Err(refused("missing", None)),
        Some(IngestItem::Failed { reason, .. }) => Err(refused("error", Some(reason))),
        Some(IngestItem::Judged {
            status: IngestStatus::Rejected,
            reason,
            ..
        }) => Err(refused("rejected", reason.as_ref())),
        Some(IngestItem::Judged { status, result, .. }) => Ok(Verdict {
            seq,
            ingest: status.name().into(),
            status: result.as_ref().map(|r| r.status.clone()),
            findings: result
                .iter()
                .flat_map(|r| &r.findings)
                .map(|f| f.code.clone())
                .collect(),
        }),
    }
}

/// The ceiling of the pause after `attempt` failed tries: 1 s, 2 s, 4 s, ... up to `max`.
/// The pause itself is [`jittered`] below it.
pub fn backoff(attempt: u32, max: Duration) -> Duration {
    let exp = attempt.saturating_sub(1).min(20);
    Duration::from_secs(1u64 << exp).min(max)
}

/// A pause drawn uniformly from [ceiling / 2, ceiling]: hosts that lost the verifier together
/// (an outage, a restart) come back spread over half the ceiling instead of in lockstep,
/// and none waits longer than the ceiling (the bound `retry_max` promises).
pub fn jittered(ceiling: Duration) -> Duration {
    use rand_core::RngCore as _;
    let mut b = [0u8; 8];
    // The OS's randomness; where it cannot be read, the clock's nanoseconds still spread
    // hosts apart (this is spacing, not a secret).
    let r = match rand_core::OsRng.try_fill_bytes(&mut b) {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::from(d.subsec_nanos())),
    };
    let half = ceiling / 2;
    let spread = ceiling - half;
    // r / 2^64 of the spread, exactly in integers.
    let extra_ns = (spread.as_nanos() * u128::from(r)) >> 64;
    half + Duration::from_nanos(u64::try_from(extra_ns).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_from_the_typed_ingest_response() {
        // As the verifier writes it: an accepted verdict, a duplicate, a rejection, an error.
        let body = concat!(
            r#"{"results":["#,
            r#"{"index":0,"reason":null,"result":{"findings":[{"aspect":"freshness","code":"unchallenged","detail":"d","severity":"warning"}],"host":"h1","policy_id":"p","rack":"r","seq":4,"status":"warning","trustworthiness":{"freshness":"warning"}},"status":"accepted"},"#,
            r#"{"index":1,"reason":null,"result":null,"status":"duplicate"},"#,
            r#"{"index":2,"reason":"signature: bad","result":null,"status":"rejected"},"#,
            r#"{"index":3,"reason":"database: full","status":"error"}]}"#
        );
        let answer = read_answer(body).unwrap();
        let v = verdict_of(answer.item(0), 4).unwrap();
        assert_eq!(
            (v.ingest.as_str(), v.status.as_deref(), v.findings),
            (
                "accepted",
                Some("warning"),
                vec!["unchallenged".to_string()]
            )
        );
        let v = verdict_of(answer.item(1), 5).unwrap();
        assert_eq!((v.ingest.as_str(), v.status), ("duplicate", None));
        assert_eq!(
            verdict_of(answer.item(2), 6).unwrap_err().to_string(),
            "the verifier answered `rejected` for seq 6: signature: bad"
        );
        assert_eq!(
            verdict_of(answer.item(3), 7).unwrap_err().to_string(),
            "the verifier answered `error` for seq 7: database: full"
        );
        assert_eq!(
            verdict_of(answer.item(9), 8).unwrap_err().to_string(),
            "the verifier answered `missing` for seq 8: no reason given"
        );
    }

    #[test]
    fn a_finding_code_this_build_does_not_know_is_kept_as_text() {
        // From a newer verifier: a code (and an aspect) this daemon was built without. The
        // answer must still be read, or delivery would retry the same batch forever.
        let body = concat!(
            r#"{"results":[{"index":0,"reason":null,"result":{"findings":["#,
            r#"{"aspect":"chain","code":"time_backwards","detail":"d","severity":"contraindicated"},"#,
            r#"{"aspect":"provenance","code":"sbom_missing","detail":"newer","severity":"warning"}],"#,
            r#""host":"h1","policy_digest":"00","policy_id":"p","rack":"r","seq":4,"status":"contraindicated","#,
            r#""trustworthiness":{"chain":"contraindicated","provenance":"warning"}},"status":"accepted"}]}"#
        );
        let answer = read_answer(body).unwrap();
        let v = verdict_of(answer.item(0), 4).unwrap();
        assert_eq!(
            (v.status.as_deref(), v.findings),
            (
                Some("contraindicated"),
                vec!["time_backwards".to_string(), "sbom_missing".to_string()]
            )
        );
    }

    #[test]
    fn jitter_spreads_over_the_upper_half_of_the_ceiling() {
        let ceiling = Duration::from_secs(16);
        let waits: Vec<Duration> = (0..2000).map(|_| jittered(ceiling)).collect();
        assert!(waits.iter().all(|w| *w >= ceiling / 2 && *w <= ceiling));
        // Spread, not a constant: each quarter of [8 s, 16 s] gets some of 2,000 draws.
        for q in 0..4u32 {
            let lo = ceiling / 2 + ceiling / 8 * q;
            let hi = lo + ceiling / 8;
            let n = waits.iter().filter(|w| **w >= lo && **w < hi).count();
            assert!(n > 300, "quarter {q}: {n} of 2000 draws");
        }
        assert_eq!(jittered(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn backoff_doubles_to_its_ceiling() {
        let max = Duration::from_secs(300);
        let got: Vec<u64> = (1..=12).map(|a| backoff(a, max).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(backoff(u32::MAX, max), max);
        assert_eq!(
            backoff(1, Duration::from_millis(500)),
            Duration::from_millis(500)
        );
    }
}
