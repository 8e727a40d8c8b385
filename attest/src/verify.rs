//! Checking a whole log offline: every line, every link. Each problem is reported with its
//! line number and byte offset; nothing is skipped silently.

use std::collections::BTreeMap;

use ed25519_dalek::VerifyingKey;
use serde::{Deserialize, Serialize};

use crate::{
    dsse::{self, EnvelopeError, INTOTO_PAYLOAD_TYPE},
    evidence::Incident,
    statement::{GENESIS_PREV, Statement},
};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "finding", rename_all = "snake_case")]
pub enum Finding {
    BadJson {
        detail: String,
    },
    BadBase64 {
        detail: String,
    },
    WrongPayloadType {
        found: String,
    },
    BadSignature,
    WrongKey {
        keyid: String,
    },
    KeyIdMismatch {
        keyid: String,
    },
    BadStatement {
        detail: String,
    },
    /// Statements are missing between the previous one and this one.
    SeqGap {
        expected: u64,
        found: u64,
    },
    /// A seq lower than the chain has reached, not seen before: lines were reordered.
    SeqOutOfOrder {
        expected: u64,
        found: u64,
    },
    /// The same statement again.
    DuplicateSeq {
        seq: u64,
        first_line: usize,
    },
    /// Another, different statement with a seq already used: two histories.
    Fork {
        seq: u64,
        first_line: usize,
    },
    BrokenPrev {
        expected: String,
        found: String,
    },
    TimeBackwards {
        previous_end_unix_ms: u64,
        start_unix_ms: u64,
    },
    /// The log ends in an incomplete line.
    TornTail {
        length: u64,
    },
    /// An incomplete or corrupt line that a later statement disclosed as an incident.
    DisclosedDamage {
        disclosed_by_seq: u64,
    },
}

impl Finding {
    /// Disclosed damage is a warning; everything else fails the line.
    pub fn is_failure(&self) -> bool {
        !matches!(self, Finding::DisclosedDamage { .. })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Warn,
    Fail,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LineReport {
    /// 1-based line number.
    pub line: usize,
    /// Byte offset of the line's first byte.
    pub offset: u64,
    pub seq: Option<u64>,
    pub epoch_end_unix_ms: Option<u64>,
    pub verdict: Verdict,
    pub findings: Vec<Finding>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogReport {
    pub lines: Vec<LineReport>,
    pub statements_ok: usize,
    pub failures: usize,
    pub warnings: usize,
}

impl LogReport {
    pub fn ok(&self) -> bool {
        self.failures == 0
    }
}

fn envelope_finding(e: EnvelopeError) -> Finding {
    match e {
        EnvelopeError::Json(d) => Finding::BadJson { detail: d },
        EnvelopeError::PayloadBase64(d) => Finding::BadBase64 { detail: d },
        EnvelopeError::SignatureEncoding => Finding::BadBase64 {
            detail: "signature".into(),
        },
        EnvelopeError::WrongPayloadType { found, .. } => Finding::WrongPayloadType { found },
        EnvelopeError::NoSignature => Finding::BadSignature,
        EnvelopeError::WrongKey { keyid, .. } => Finding::WrongKey { keyid },
        EnvelopeError::KeyIdMismatch { keyid } => Finding::KeyIdMismatch { keyid },
        EnvelopeError::BadSignature => Finding::BadSignature,
    }
}

/// Verifies every line of `log` against `key`, following the host's key rotations: once a
/// statement that verifies names a `next_key` (whose keyid matches its public key), later
/// lines are checked against that key. `key` is the key the log starts with.
pub fn verify_log(log: &[u8], key: &VerifyingKey) -> LogReport {
    let mut key = *key;
    let mut lines = Vec::new();
    // seq -> (line, pae digest) of statements accepted so far
    let mut seen: BTreeMap<u64, (usize, [u8; 32])> = BTreeMap::new();
    let mut expected_seq = 0u64;
    let mut last_end: Option<u64> = None;
    let mut damaged: Vec<(usize, u64)> = Vec::new(); // (index in `lines`, offset)
    let mut offset = 0usize;
    let mut n = 0usize;
    while offset < log.len() {
        n += 1;
        let (line, next, torn) = match log[offset..].iter().position(|b| *b == b'\n') {
            Some(nl) => (&log[offset..offset + nl], offset + nl + 1, false),
            None => (&log[offset..], log.len(), true),
        };
        let mut r = LineReport {
            line: n,
            offset: offset as u64,
            seq: None,
            epoch_end_unix_ms: None,
            verdict: Verdict::Pass,
            findings: Vec::new(),
        };
        if torn {
            r.findings.push(Finding::TornTail {
                length: line.len() as u64,
            });
            damaged.push((lines.len(), offset as u64));
        } else {
            match dsse::verify(line, &key, INTOTO_PAYLOAD_TYPE) {
                Err(e) => {
                    r.findings.push(envelope_finding(e));
                    damaged.push((lines.len(), offset as u64));
                }
                Ok(v) => match Statement::from_verified(&v.payload) {
                    Err(d) => r.findings.push(Finding::BadStatement {
                        detail: d.to_string(),
                    }),
                    Ok(s) => {
                        let p = &s.predicate;
                        if let Some(next) = rotated_key(p.next_key.as_ref()) {
                            key = next;
                        }
                        r.seq = Some(p.seq);
                        r.epoch_end_unix_ms = Some(p.epoch_end_unix_ms);
                        check_chain(
                            &mut r,
                            p.seq,
                            &p.prev,
                            v.pae_sha3,
                            &mut seen,
                            &mut expected_seq,
                        );
                        if let Some(prev_end) = last_end
                            && p.epoch_start_unix_ms < prev_end
                            && r.findings.is_empty()
                        {
                            r.findings.push(Finding::TimeBackwards {
                                previous_end_unix_ms: prev_end,
                                start_unix_ms: p.epoch_start_unix_ms,
                            });
                        }
                        if r.findings.is_empty() {
                            last_end = Some(p.epoch_end_unix_ms);
                        }
                        // Damage this statement discloses becomes a warning, not a failure.
                        for off in p.incidents.iter().filter_map(Incident::log_offset) {
                            if let Some(&(idx, _)) = damaged.iter().find(|(_, o)| *o == off) {
                                let l: &mut LineReport = &mut lines[idx];
                                l.findings = vec![Finding::DisclosedDamage {
                                    disclosed_by_seq: p.seq,
                                }];
                            }
                        }
                    }
                },
            }
        }
        lines.push(r);
        offset = next;
    }
    let mut report = LogReport {
        lines,
        statements_ok: 0,
        failures: 0,
        warnings: 0,
    };
    for l in &mut report.lines {
        l.verdict = if l.findings.iter().any(Finding::is_failure) {
            report.failures += 1;
            Verdict::Fail
        } else if l.findings.is_empty() {
            report.statements_ok += 1;
            Verdict::Pass
        } else {
            report.warnings += 1;
            Verdict::Warn
        };
    }
    report
}

/// The key a statement rotates to, if its keyid is the one its public key gives.
fn rotated_key(next: Option<&crate::statement::NextKey>) -> Option<VerifyingKey> {
    let next = next?;
    let vk = crate::keys::parse_verifying_key(&next.public_key_pem).ok()?;
    (crate::keys::keyid(&vk) == next.keyid).then_some(vk)
}

fn check_chain(
    r: &mut LineReport,
    seq: u64,
    prev: &str,
    digest: [u8; 32],
    seen: &mut BTreeMap<u64, (usize, [u8; 32])>,
    expected_seq: &mut u64,
) {
    if let Some(&(first_line, d)) = seen.get(&seq) {
        r.findings.push(if d == digest {
            Finding::DuplicateSeq { seq, first_line }
        } else {
            Finding::Fork { seq, first_line }
        });
        return;
    }
    if seq > *expected_seq {
        r.findings.push(Finding::SeqGap {
            expected: *expected_seq,
            found: seq,
        });
    } else if seq < *expected_seq {
        r.findings.push(Finding::SeqOutOfOrder {
            expected: *expected_seq,
            found: seq,
        });
    }
    let want_prev = if seq == 0 {
        Some(GENESIS_PREV.to_string())
    } else {
        seen.get(&(seq - 1)).map(|(_, d)| hex::encode(d))
    };
    if let Some(want) = want_prev
        && want != prev
    {
        r.findings.push(Finding::BrokenPrev {
            expected: want,
            found: prev.to_string(),
        });
    }
    seen.insert(seq, (r.line, digest));
    *expected_seq = (*expected_seq).max(seq + 1);
}
