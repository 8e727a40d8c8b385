//! The daemon-verifier protocol: the bodies of `POST /v1/challenges` and
//! `POST /v1/statements` and the error body of every refusal. The verifier serialises these
//! and the daemon parses them, so a field renamed here is renamed on both sides.
//!
//! The statements themselves travel verbatim (a DSSE envelope, or an array of them): the
//! verifier stores the exact bytes it received, so the request side of `/v1/statements` has
//! no type here.
//!
//! The verifier has always written its bodies through `serde_json::Value`, whose map orders
//! keys; [`to_wire`] does the same so the bytes stay as they were.

use serde::{Deserialize, Serialize};

use crate::result::AttestationResult;

/// `POST /v1/challenges`: a nonce for this host, please. (Fields in key order: serialised
/// directly, as the daemon does, the body is the bytes it always sent.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChallengeRequest {
    pub host: String,
    pub rack: String,
}

/// The answer to a [`ChallengeRequest`]: a single-use nonce (hex) and when it expires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChallengeResponse {
    pub nonce: String,
    pub expires_at_ms: u64,
}

/// What the verifier did with one statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IngestStatus {
    Accepted,
    /// Already stored (the daemon retries): idempotent, with the stored result.
    Duplicate,
    /// Not attributable to an enrolled host, or not a valid statement: nothing stored.
    Rejected,
}

impl IngestStatus {
    pub fn name(self) -> &'static str {
        match self {
            IngestStatus::Accepted => "accepted",
            IngestStatus::Duplicate => "duplicate",
            IngestStatus::Rejected => "rejected",
        }
    }
}

/// The outcome of one statement the verifier judged or refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IngestOutcome {
    pub status: IngestStatus,
    /// The verdict (for `accepted`, and for a `duplicate` whose stored verdict reads back).
    pub result: Option<AttestationResult>,
    /// Why a statement was rejected.
    pub reason: Option<String>,
}

impl IngestOutcome {
    pub fn rejected(reason: String) -> IngestOutcome {
        IngestOutcome {
            status: IngestStatus::Rejected,
            result: None,
            reason: Some(reason),
        }
    }
}

/// The `status` of an item the verifier could not process (its storage failed): always
/// `error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailedStatus {
    Error,
}

/// One element of an [`IngestResponse`]: `index` is the statement's place in the request.
/// `R` is the verdict: the verifier writes an [`AttestationResult`]; the daemon reads a
/// [`ReceivedVerdict`], which keeps codes as text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum IngestItem<R = AttestationResult> {
    /// Accepted, duplicate or rejected (`result` and `reason` are present, maybe `null`).
    Judged {
        index: usize,
        status: IngestStatus,
        result: Option<R>,
        reason: Option<String>,
        /// The stored statement's place in the verifier's transparency log (absent for a
        /// rejected statement, and from verifiers without a log).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        log: Option<LogEntry>,
        /// The sample the verifier drew for the statement's traffic root (absent when the
        /// statement commits no traffic or the policy samples none): the host answers it
        /// with `POST /v1/openings` by its deadline.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sample: Option<crate::traffic::SampleDemand>,
    },
    /// The verifier failed on this statement; nothing of it was kept (no `result` key).
    Failed {
        index: usize,
        status: FailedStatus,
        reason: String,
    },
}

impl IngestItem {
    pub fn judged(index: usize, outcome: IngestOutcome) -> IngestItem {
        Self::judged_logged(index, outcome, None, None)
    }

    /// An item for a stored statement with its log entry.
    pub fn judged_logged(
        index: usize,
        outcome: IngestOutcome,
        log: Option<LogEntry>,
        sample: Option<crate::traffic::SampleDemand>,
    ) -> IngestItem {
        IngestItem::Judged {
            index,
            status: outcome.status,
            result: outcome.result,
            reason: outcome.reason,
            log,
            sample,
        }
    }

    pub fn failed(index: usize, reason: String) -> IngestItem {
        IngestItem::Failed {
            index,
            status: FailedStatus::Error,
            reason,
        }
    }
}

impl<R> IngestItem<R> {
    pub fn index(&self) -> usize {
        match self {
            IngestItem::Judged { index, .. } | IngestItem::Failed { index, .. } => *index,
        }
    }
}

/// A stored statement's entry in the verifier's transparency log (`crate::tlog`): its leaf
/// index, the inclusion proof of its leaf (hex hashes, nearest sibling first) in the tree of
/// the checkpoint, and that checkpoint as a signed note.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub index: u64,
    pub proof: Vec<String>,
    pub checkpoint: String,
}

/// `GET /v1/tlog/inclusion?index=I&size=N`: the inclusion proof of leaf `index` in the tree
/// of `size` leaves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InclusionProof {
    pub index: u64,
    pub size: u64,
    pub proof: Vec<String>,
}

/// `GET /v1/tlog/consistency?from=M&to=N`: the consistency proof from the tree of `from`
/// leaves to the tree of `to`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsistencyProof {
    pub from: u64,
    pub to: u64,
    pub proof: Vec<String>,
}

/// The answer to `POST /v1/statements`: one item per statement sent, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IngestResponse<R = AttestationResult> {
    pub results: Vec<IngestItem<R>>,
}

impl<R> IngestResponse<R> {
    /// The item for the statement at `index` of the request, if the verifier answered it.
    pub fn item(&self, index: usize) -> Option<&IngestItem<R>> {
        self.results.iter().find(|r| r.index() == index)
    }
}

/// A verdict as the daemon reads it: its status and findings with their codes as text, and
/// nothing it does not need. A newer verifier may judge with codes, aspects or fields this
/// build does not know; reading them as [`AttestationResult`] would fail the whole answer
/// (and delivery would retry it forever), so they are kept as their names instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceivedVerdict {
    pub status: String,
    pub findings: Vec<ReceivedFinding>,
}

/// One finding of a [`ReceivedVerdict`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceivedFinding {
    /// The code's name (`counters_above_cap`), known to this build or not.
    pub code: String,
    pub severity: String,
    #[serde(default)]
    pub detail: String,
}

/// The verifier's answer to a POST of statements, as the daemon reads it.
pub type ReceivedResponse = IngestResponse<ReceivedVerdict>;

/// The body of every 4xx/5xx the API answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

/// A body's bytes as the verifier has always written them: through `serde_json::Value`
/// (keys in order), so a typed body is byte-for-byte what the hand-built one was.
pub fn to_wire<T: Serialize>(body: &T) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(&serde_json::to_value(body)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::{Aspect, Finding, FindingCode, Status};

    /// Parses `captured`, serialises it again, and checks both the value and the bytes.
    fn round_trip<T: Serialize + serde::de::DeserializeOwned + std::fmt::Debug>(
        captured: &str,
    ) -> T {
        let parsed: T = serde_json::from_str(captured).unwrap();
        let again = to_wire(&parsed).unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&again).unwrap(),
            serde_json::from_str::<serde_json::Value>(captured).unwrap()
        );
        assert_eq!(String::from_utf8(again).unwrap(), captured, "{parsed:?}");
        parsed
    }

    // Captured from the verifier before the protocol had types: its handlers wrote these
    // with `json!` (keys in order, `null` for an absent result or reason).
    const CHALLENGE_REQUEST: &str = r#"{"host":"h1","rack":"rack-a"}"#;
    const CHALLENGE_RESPONSE: &str = r#"{"expires_at_ms":1796000600000,"nonce":"8f0e4a5b6c7d8e9f00112233445566778899aabbccddeeff0011223344556677"}"#;
    const ERROR_BODY: &str = r#"{"error":"rack `rack-a` host `nobody` is not enrolled"}"#;
    const INGEST_RESPONSE: &str = concat!(
        r#"{"results":["#,
        r#"{"index":0,"reason":null,"result":{"findings":[{"aspect":"freshness","code":"unchallenged","detail":"the statement answers no challenge","severity":"warning"}],"host":"h1","policy_id":"test-policy","rack":"rack-a","seq":3,"status":"warning","trustworthiness":{"budget":"affirming","chain":"affirming","freshness":"warning","identity":"affirming","images":"affirming","limiter":"affirming","wipe":"affirming"}},"status":"accepted"},"#,
        r#"{"index":1,"reason":null,"result":null,"status":"duplicate"},"#,
        r#"{"index":2,"reason":"signature: verification failed","result":null,"status":"rejected"},"#,
        r#"{"index":3,"reason":"database: disk I/O error","status":"error"}"#,
        r#"]}"#
    );

    #[test]
    fn challenge_bodies_round_trip() {
        let req: ChallengeRequest = round_trip(CHALLENGE_REQUEST);
        assert_eq!(req.rack, "rack-a");
        // The daemon serialises the request directly (not through `to_wire`).
        assert_eq!(serde_json::to_string(&req).unwrap(), CHALLENGE_REQUEST);
        let resp: ChallengeResponse = round_trip(CHALLENGE_RESPONSE);
        assert_eq!(resp.expires_at_ms, 1_796_000_600_000);
        let err: ErrorBody = round_trip(ERROR_BODY);
        assert!(err.error.contains("not enrolled"));
    }

    #[test]
    fn ingest_response_round_trips_every_kind_of_item() {
        let resp: IngestResponse = round_trip(INGEST_RESPONSE);
        let result = AttestationResult {
            status: Status::Warning,
            policy_id: "test-policy".into(),
            policy_digest: None,
            rack: "rack-a".into(),
            host: "h1".into(),
            seq: 3,
            trustworthiness: Aspect::ALL
                .into_iter()
                .filter(|a| {
                    !matches!(
                        a,
                        Aspect::RootOfTrust | Aspect::Storage | Aspect::Traffic | Aspect::Replay
                    )
                })
                .map(|a| {
                    let s = if a == Aspect::Freshness {
                        Status::Warning
                    } else {
                        Status::Affirming
                    };
                    (a, s)
                })
                .collect(),
            findings: vec![Finding {
                aspect: Aspect::Freshness,
                code: FindingCode::Unchallenged,
                severity: Status::Warning,
                detail: "the statement answers no challenge".into(),
            }],
            root_of_trust: None,
            guard: None,
        };
        assert_eq!(
            resp.results,
            vec![
                IngestItem::judged(
                    0,
                    IngestOutcome {
                        status: IngestStatus::Accepted,
                        result: Some(result),
                        reason: None,
                    }
                ),
                IngestItem::judged(
                    1,
                    IngestOutcome {
                        status: IngestStatus::Duplicate,
                        result: None,
                        reason: None,
                    }
                ),
                IngestItem::judged(
                    2,
                    IngestOutcome::rejected("signature: verification failed".into())
                ),
                IngestItem::failed(3, "database: disk I/O error".into()),
            ]
        );
        assert_eq!(resp.item(3).map(IngestItem::index), Some(3));
        assert!(resp.item(4).is_none());
    }

    #[test]
    fn a_log_entry_is_optional_on_the_wire() {
        const WITH_LOG: &str = concat!(
            r#"{"results":[{"index":0,"log":{"checkpoint":"o\n1\nAAAA\n\n— o x\n","index":4,"proof":["aa","bb"]},"#,
            r#""reason":null,"result":null,"status":"duplicate"}]}"#
        );
        let resp: ReceivedResponse = round_trip(WITH_LOG);
        let Some(IngestItem::Judged { log: Some(log), .. }) = resp.item(0) else {
            panic!("{resp:?}");
        };
        assert_eq!(log.index, 4);
        assert_eq!(log.proof, vec!["aa".to_string(), "bb".to_string()]);
        assert!(log.checkpoint.starts_with("o\n1\n"));
        // Bodies of verifiers without a log still parse (the captured one above, too).
        let old: ReceivedResponse = serde_json::from_str(
            r#"{"results":[{"index":0,"reason":null,"result":null,"status":"duplicate"}]}"#,
        )
        .unwrap();
        assert!(matches!(
            old.item(0),
            Some(IngestItem::Judged { log: None, .. })
        ));
    }

    #[test]
    fn the_typed_body_is_what_json_macro_bodies_were() {
        // Today's handler built each item as `json!({"index", "status", "result", "reason"})`.
        let outcome = IngestOutcome::rejected("no".into());
        let by_hand = serde_json::json!({"results": [
            { "index": 0, "status": outcome.status, "result": outcome.result, "reason": outcome.reason },
            { "index": 1, "status": "error", "reason": "disk" },
        ]});
        let typed = IngestResponse {
            results: vec![
                IngestItem::judged(0, outcome),
                IngestItem::failed(1, "disk".into()),
            ],
        };
        assert_eq!(
            to_wire(&typed).unwrap(),
            serde_json::to_vec(&by_hand).unwrap()
        );
    }
}
