//! Traffic: what the host's tap committed of the bytes its policer passed in the epoch
//! (issue 27, `docs/traffic-format.md`). The statement's report is a Merkle sum tree's root
//! and the kernel's counts beside it: the summary must add up (unaccounted = passed -
//! tapped), the bytes no record covers must stay within `[policy.taps] max_unaccounted`, and
//! the records must be kept so that sampled ones can be opened. A statement without a report
//! (a host without the tap, a daemon older than it) is judged as before unless the policy
//! requires one.
//!
//! Sampling: each epoch the verifier drew offsets for must be answered with its openings by
//! the sample's deadline. The statement whose epoch the deadline falls in (after the host's
//! previous stored statement ended, up to this one's end) carries the finding when no
//! openings were received by then, or when they were refused; a statement that names
//! openings the verifier does not hold, or holds refused, carries one too. Both rest on
//! stored rows (the samples, the openings with their receipt times), so `recheck`
//! re-derives them.

use rackwarden_attest::{
    evidence::Direction,
    statement::Statement,
    traffic::{
        OpeningsOutcome, OpeningsRef, SpoolState, TapDrops, TrafficReport, TrafficSummary, idx,
    },
    units::fmt_size,
};

use super::{FindingCode as C, Judge, Status};
use crate::store::{OpeningsRow, SampleAndAnswer};

/// What the store holds of the host's samples that this statement is judged on.
#[derive(Debug, Clone, Default)]
pub struct TrafficContext {
    /// The host's samples whose deadline fell in this statement's epoch, each with the
    /// openings received for it.
    pub due: Vec<SampleAndAnswer>,
    /// Each openings the statement names, with what the verifier holds for that epoch.
    pub named: Vec<(OpeningsRef, Option<OpeningsRow>)>,
}

impl TrafficContext {
    fn is_empty(&self) -> bool {
        self.due.is_empty() && self.named.is_empty()
    }
}

/// Whether the traffic aspect is in a verdict: the statement carries a report, the policy
/// requires one, or a sample is due or named.
pub(super) fn in_play(j: &Judge, st: &Statement, ctx: &TrafficContext) -> bool {
    st.predicate.traffic.is_some() || j.policy.taps.required || !ctx.is_empty()
}

pub(super) fn check(j: &mut Judge, st: &Statement, ctx: &TrafficContext, now_ms: u64) {
    check_report(j, st);
    check_samples(j, ctx, now_ms);
}

fn check_report(j: &mut Judge, st: &Statement) {
    let required = j.policy.taps.required;
    let Some(report) = &st.predicate.traffic else {
        if required {
            j.add(
                C::TrafficMissing,
                Status::Contraindicated,
                "no traffic report: the bytes the policer passed are not committed",
            );
        }
        return;
    };
    let (summary, spool) = match report {
        TrafficReport::Failed { reason } => {
            j.add(
                C::TrafficCommitFailed,
                Status::Contraindicated,
                format!("the tap could not commit the epoch: {reason}"),
            );
            return;
        }
        TrafficReport::Committed { summary, spool } => (summary, spool),
    };
    check_summary(j, summary);
    if let SpoolState::NotKept { reason } = spool {
        j.add(
            C::TrafficNotKept,
            if required {
                Status::Contraindicated
            } else {
                Status::Warning
            },
            format!(
                "the epoch's {} records were not kept, so none can be opened: {reason}",
                summary.root.records
            ),
        );
    }
}

/// The samples due in this epoch and the openings the statement names. `now_ms` is the
/// statement's receipt: openings received after it were not there when it was judged.
fn check_samples(j: &mut Judge, ctx: &TrafficContext, now_ms: u64) {
    for due in &ctx.due {
        let d = &due.sample.demand;
        let by = d.deadline_ms.min(now_ms);
        match &due.answer {
            Some(a) if a.received_ms <= by => match &a.outcome {
                OpeningsOutcome::Refused { reason } => j.add(
                    C::TrafficOpeningRefused,
                    Status::Contraindicated,
                    format!("epoch {}: the openings were refused: {reason}", d.epoch_seq),
                ),
                OpeningsOutcome::Matched { raw_flows, .. } => {
                    let allowed = &j.policy.taps.allowed_raw_flows;
                    let outside: Vec<String> = raw_flows
                        .iter()
                        .filter(|f| !allowed.iter().any(|r| r.allows(f)))
                        .map(|f| f.to_string())
                        .collect();
                    if !outside.is_empty() {
                        j.add(
                            C::TrafficFlowNotAllowed,
                            Status::Contraindicated,
                            format!(
                                "epoch {}: sampled traffic outside the inference endpoints with peers the policy does not allow: {}",
                                d.epoch_seq,
                                outside.join(", ")
                            ),
                        );
                    }
                }
            },
            late => j.add(
                C::TrafficOpeningMissing,
                Status::Contraindicated,
                format!(
                    "epoch {}: {} offsets per direction drawn at {} ms were not opened by the deadline, {} ms{}",
                    d.epoch_seq,
                    d.per_direction,
                    due.sample.drawn_ms,
                    d.deadline_ms,
                    match late {
                        Some(a) if a.received_ms <= now_ms =>
                            format!(" (they came at {} ms)", a.received_ms),
                        _ => String::new(),
                    }
                ),
            ),
        }
    }
    for (named, held) in &ctx.named {
        let seq = named.epoch_seq;
        match held {
            Some(h) if h.sha3_256 == named.sha3_256 && h.received_ms <= now_ms => {
                if let OpeningsOutcome::Refused { reason } = &h.outcome {
                    j.add(
                        C::TrafficOpeningRefused,
                        Status::Contraindicated,
                        format!(
                            "epoch {seq}: the openings this statement names were refused: {reason}"
                        ),
                    );
                }
            }
            Some(h) if h.received_ms <= now_ms => j.add(
                C::TrafficOpeningUnknown,
                Status::Contraindicated,
                format!(
                    "epoch {seq}: the statement names openings {}, but the verifier holds {}",
                    hex::encode(named.sha3_256),
                    hex::encode(h.sha3_256)
                ),
            ),
            _ => j.add(
                C::TrafficOpeningUnknown,
                Status::Contraindicated,
                format!(
                    "epoch {seq}: the statement names openings {} that the verifier never received",
                    hex::encode(named.sha3_256)
                ),
            ),
        }
    }
}

fn check_summary(j: &mut Judge, s: &TrafficSummary) {
    if let Err(e) = s.check() {
        j.add(
            C::TrafficInconsistent,
            Status::Contraindicated,
            e.to_string(),
        );
    }
    // Judged on passed - tapped as recomputed here, not on the host's own `unaccounted`
    // (which `traffic_inconsistent` has compared already).
    let unaccounted = Direction::ALL.map(|d| s.passed[idx(d)].saturating_sub(s.root.bytes[idx(d)]));
    let max = j.policy.taps.max_unaccounted_bytes;
    if unaccounted.iter().any(|u| *u > max) {
        let per_dir: Vec<String> = Direction::ALL
            .iter()
            .map(|d| {
                let i = idx(*d);
                format!(
                    "{} {} of {} passed",
                    d.name(),
                    fmt_size(unaccounted[i]),
                    fmt_size(s.passed[i])
                )
            })
            .collect();
        j.add(
            C::TrafficUnaccounted,
            Status::Contraindicated,
            format!(
                "no record covers {}; the policy allows {} per direction",
                per_dir.join(", "),
                fmt_size(max)
            ),
        );
    }
    if let Some(drops) = drops_detail(&s.tap_drops) {
        j.add(C::TrafficTapDrops, Status::Warning, drops);
    }
}

/// The tap's drops by reason and direction, `None` when it dropped nothing.
pub(crate) fn drops_detail(d: &TapDrops) -> Option<String> {
    let mut parts = Vec::new();
    for (why, c) in [
        ("ring full", &d.ring_full),
        ("too large", &d.too_large),
        ("unreadable", &d.unreadable),
    ] {
        for dir in Direction::ALL {
            let i = idx(dir);
            if c.frames[i] > 0 || c.bytes[i] > 0 {
                parts.push(format!(
                    "{why}: {} {} frame{} ({})",
                    dir.name(),
                    c.frames[i],
                    if c.frames[i] == 1 { "" } else { "s" },
                    fmt_size(c.bytes[i])
                ));
            }
        }
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

#[cfg(test)]
mod tests {
    use rackwarden_attest::{
        schema::example_statement,
        traffic::{DropCount, EpochStart, TrafficRoot},
    };

    use super::*;
    use crate::config::VerifierConfig;

    /// The findings (code, severity, detail) under a policy with `taps` as its
    /// `[policy.taps]` table (none when empty).
    fn judge(taps: &str, report: Option<TrafficReport>) -> Vec<(C, Status, String)> {
        let table = if taps.is_empty() {
            String::new()
        } else {
            format!("[policy.taps]\n{taps}\n")
        };
        let text = format!(
            "listen = \"127.0.0.1:7700\"\ninsecure_http = true\ndatabase = \"/tmp/unused.sqlite\"\n\n[policy]\nmin_root_of_trust = \"none\"\nid = \"p\"\nnonce_ttl = \"10 min\"\nmax_wipe_interval = \"15 min\"\nmax_residue_host = \"4 GiB\"\nmax_residue_gpu = \"1 GiB\"\ntrainable_state = \"10 TB\"\nmax_epoch_fraction = 0.01\n{table}"
        );
        let cfg = VerifierConfig::parse(std::path::Path::new("v.toml"), &text).unwrap();
        let mut st = example_statement();
        st.predicate.traffic = report;
        let mut j = Judge {
            policy: &cfg.policy,
            findings: vec![],
        };
        let ctx = TrafficContext::default();
        assert_eq!(
            in_play(&j, &st, &ctx),
            st.predicate.traffic.is_some() || cfg.policy.taps.required
        );
        check(&mut j, &st, &ctx, 0);
        j.findings
            .into_iter()
            .map(|f| {
                assert_eq!(f.aspect, super::super::Aspect::Traffic);
                (f.code, f.severity, f.detail)
            })
            .collect()
    }

    /// A clean epoch: 1000 B out, 2000 B in, every byte in a record, nothing dropped.
    fn summary() -> TrafficSummary {
        TrafficSummary {
            root: TrafficRoot {
                sha3_256: [0x5a; 32],
                bytes: [1000, 2000],
                records: 4,
            },
            passed: [1000, 2000],
            unaccounted: [0, 0],
            tap_drops: TapDrops::default(),
            held: [0, 1448],
            start: EpochStart::Resumed,
        }
    }

    fn committed(s: TrafficSummary) -> Option<TrafficReport> {
        Some(TrafficReport::Committed {
            summary: Box::new(s),
            spool: SpoolState::Kept { bytes: 3000 },
        })
    }

    fn codes(f: &[(C, Status, String)]) -> Vec<(C, Status)> {
        f.iter().map(|(c, s, _)| (*c, *s)).collect()
    }

    #[test]
    fn absent_traffic_is_judged_as_before_unless_required() {
        assert!(judge("", None).is_empty());
        assert!(judge("required = false", None).is_empty());
        let f = judge("required = true", None);
        assert_eq!(
            codes(&f),
            vec![(C::TrafficMissing, Status::Contraindicated)]
        );
    }

    #[test]
    fn a_clean_epoch_has_no_finding_first_start_or_not() {
        assert!(judge("", committed(summary())).is_empty());
        assert!(judge("required = true", committed(summary())).is_empty());
        let mut first = summary();
        first.start = EpochStart::FirstStart;
        assert!(judge("required = true", committed(first)).is_empty());
    }

    #[test]
    fn unaccounted_bytes_above_the_policy_are_contraindicated() {
        let mut s = summary();
        s.passed = [1000 + 300, 2000];
        s.unaccounted = [300, 0];
        let f = judge("", committed(s));
        assert_eq!(
            codes(&f),
            vec![(C::TrafficUnaccounted, Status::Contraindicated)]
        );
        assert_eq!(
            f[0].2,
            "no record covers egress 300 B of 1300 B passed, ingress 0 B of 2000 B passed; the policy allows 0 B per direction"
        );
        // Within the policy's allowance: nothing; one byte over, in either direction: found.
        assert!(judge("max_unaccounted = \"300 B\"", committed(s)).is_empty());
        s.passed[1] = 2301;
        s.unaccounted[1] = 301;
        let f = judge("max_unaccounted = \"300 B\"", committed(s));
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].2.contains("ingress 301 B of 2301 B passed")
                && f[0].2.ends_with("the policy allows 300 B per direction"),
            "{}",
            f[0].2
        );
    }

    #[test]
    fn tap_drops_are_a_warning_with_their_counts() {
        let mut s = summary();
        s.tap_drops.ring_full = DropCount {
            frames: [3, 0],
            bytes: [4500, 0],
        };
        s.tap_drops.unreadable = DropCount {
            frames: [0, 1],
            bytes: [0, 60],
        };
        let f = judge("", committed(s));
        assert_eq!(codes(&f), vec![(C::TrafficTapDrops, Status::Warning)]);
        assert_eq!(
            f[0].2,
            "ring full: egress 3 frames (4500 B); unreadable: ingress 1 frame (60 B)"
        );
        assert_eq!(drops_detail(&TapDrops::default()), None);
    }

    #[test]
    fn a_failed_commit_is_contraindicated_with_its_reason() {
        let f = judge(
            "",
            Some(TrafficReport::Failed {
                reason: "the reader thread exited: ring fd closed".into(),
            }),
        );
        assert_eq!(
            codes(&f),
            vec![(C::TrafficCommitFailed, Status::Contraindicated)]
        );
        assert!(
            f[0].2.ends_with("the reader thread exited: ring fd closed"),
            "{}",
            f[0].2
        );
    }

    #[test]
    fn records_not_kept_are_contraindicated_only_when_required() {
        let report = Some(TrafficReport::Committed {
            summary: Box::new(summary()),
            spool: SpoolState::NotKept {
                reason: "4 GiB is larger than the 1 GiB spool".into(),
            },
        });
        let f = judge("", report.clone());
        assert_eq!(codes(&f), vec![(C::TrafficNotKept, Status::Warning)]);
        assert_eq!(
            f[0].2,
            "the epoch's 4 records were not kept, so none can be opened: 4 GiB is larger than the 1 GiB spool"
        );
        assert_eq!(
            codes(&judge("required = true", report)),
            vec![(C::TrafficNotKept, Status::Contraindicated)]
        );
    }

    #[test]
    fn a_summary_that_does_not_add_up_is_contraindicated() {
        // The host claims nothing unaccounted where 300 B are: inconsistent, and judged on
        // the recomputed 300 B.
        let mut s = summary();
        s.passed[0] = 1300;
        let f = judge("", committed(s));
        assert_eq!(
            codes(&f),
            vec![
                (C::TrafficInconsistent, Status::Contraindicated),
                (C::TrafficUnaccounted, Status::Contraindicated)
            ]
        );
        assert!(
            f[0].2.contains("but the summary says 0 are unaccounted"),
            "{}",
            f[0].2
        );
        // More tapped than passed: inconsistent alone (nothing is unaccounted).
        let mut over = summary();
        over.passed[1] = 1999;
        let f = judge("", committed(over));
        assert_eq!(
            codes(&f),
            vec![(C::TrafficInconsistent, Status::Contraindicated)]
        );
        assert!(f[0].2.contains("the kernel passed only 1999"), "{}", f[0].2);
    }

    /// The findings of the sample judgement alone, under `taps`, at receipt `now_ms`.
    fn judge_samples(taps: &str, ctx: &TrafficContext, now_ms: u64) -> Vec<(C, Status, String)> {
        let text = format!(
            "listen = \"127.0.0.1:7700\"\ninsecure_http = true\ndatabase = \"/tmp/unused.sqlite\"\n\n[policy]\nmin_root_of_trust = \"none\"\nid = \"p\"\nnonce_ttl = \"10 min\"\nmax_wipe_interval = \"15 min\"\nmax_residue_host = \"4 GiB\"\nmax_residue_gpu = \"1 GiB\"\ntrainable_state = \"10 TB\"\nmax_epoch_fraction = 0.01\n[policy.taps]\n{taps}\n"
        );
        let cfg = VerifierConfig::parse(std::path::Path::new("v.toml"), &text).unwrap();
        let mut j = Judge {
            policy: &cfg.policy,
            findings: vec![],
        };
        check_samples(&mut j, ctx, now_ms);
        j.findings
            .into_iter()
            .map(|f| (f.code, f.severity, f.detail))
            .collect()
    }

    fn due(seq: u64, answer: Option<(u64, OpeningsOutcome)>) -> SampleAndAnswer {
        use rackwarden_attest::traffic::SampleDemand;
        SampleAndAnswer {
            sample: crate::store::SampleRow {
                rack: "r".into(),
                host: "h".into(),
                root: rackwarden_attest::traffic::empty_root(),
                demand: SampleDemand {
                    epoch_seq: seq,
                    randomness: [0; 32],
                    per_direction: 8,
                    deadline_ms: 1_000,
                },
                drawn_ms: 400,
            },
            answer: answer.map(|(received_ms, outcome)| OpeningsRow {
                rack: "r".into(),
                host: "h".into(),
                seq,
                sha3_256: [seq as u8; 32],
                received_ms,
                outcome,
                envelope: None,
            }),
        }
    }

    fn matched(flows: &[(u8, &str)]) -> OpeningsOutcome {
        OpeningsOutcome::Matched {
            records: 3,
            raw_flows: flows
                .iter()
                .map(|(proto, remote)| rackwarden_attest::traffic::FlowKey {
                    proto: *proto,
                    local: "10.0.0.2:40000".parse().unwrap(),
                    remote: remote.parse().unwrap(),
                })
                .collect(),
        }
    }

    /// A sample is judged by the statement its deadline falls in: answered in time and
    /// matched is clean; refused, missing, late or with a raw flow outside the allowlist is
    /// each its finding. A statement naming openings the verifier does not hold, or holds
    /// under another digest, is `traffic_opening_unknown`.
    #[test]
    fn samples_are_judged_at_their_deadline_from_stored_rows() {
        let ctx = TrafficContext {
            due: vec![
                due(1, Some((900, matched(&[(17, "10.9.9.9:53")])))),
                due(
                    2,
                    Some((
                        900,
                        OpeningsOutcome::Refused {
                            reason: "forged path".into(),
                        },
                    )),
                ),
                due(3, None),
                due(4, Some((1_100, matched(&[])))),
                due(
                    5,
                    Some((
                        950,
                        matched(&[(6, "203.0.113.7:443"), (17, "10.9.9.9:123")]),
                    )),
                ),
            ],
            named: vec![
                (
                    OpeningsRef {
                        epoch_seq: 1,
                        sha3_256: [1; 32],
                    },
                    due(1, Some((900, matched(&[])))).answer,
                ),
                (
                    OpeningsRef {
                        epoch_seq: 6,
                        sha3_256: [6; 32],
                    },
                    None,
                ),
                (
                    OpeningsRef {
                        epoch_seq: 1,
                        sha3_256: [9; 32],
                    },
                    due(1, Some((900, matched(&[])))).answer,
                ),
            ],
        };
        let f = judge_samples("", &ctx, 2_000);
        assert_eq!(
            codes(&f),
            vec![
                (C::TrafficOpeningRefused, Status::Contraindicated),
                (C::TrafficOpeningMissing, Status::Contraindicated),
                (C::TrafficOpeningMissing, Status::Contraindicated),
                (C::TrafficFlowNotAllowed, Status::Contraindicated),
                (C::TrafficOpeningUnknown, Status::Contraindicated),
                (C::TrafficOpeningUnknown, Status::Contraindicated),
            ],
            "{f:#?}"
        );
        assert!(f[0].2.contains("epoch 2") && f[0].2.contains("forged path"));
        assert!(f[1].2.starts_with("epoch 3") && !f[1].2.contains("they came"));
        assert!(f[2].2.starts_with("epoch 4") && f[2].2.contains("they came at 1100 ms"));
        assert!(
            f[3].2.contains("tcp 10.0.0.2:40000 -> 203.0.113.7:443") && !f[3].2.contains(":123"),
            "{}",
            f[3].2
        );
        assert!(f[4].2.contains("never received"));
        assert!(f[5].2.contains("but the verifier holds"));
        // The policy names the peer: allowed. An answer received after the statement was
        // (a recheck sees it) counts as not there.
        let f = judge_samples(
            "allowed_raw_flows = [\"tcp:203.0.113.7:443\", \"udp:123\"]",
            &TrafficContext {
                due: vec![ctx.due[4].clone()],
                named: vec![],
            },
            2_000,
        );
        assert!(f.is_empty(), "{f:?}");
        let f = judge_samples(
            "",
            &TrafficContext {
                due: vec![ctx.due[0].clone()],
                named: vec![],
            },
            800,
        );
        assert_eq!(
            codes(&f),
            vec![(C::TrafficOpeningMissing, Status::Contraindicated)]
        );
    }
}
