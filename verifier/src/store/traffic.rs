//! The sampling rows (issue 27): the randomness the verifier drew for each stored traffic
//! root, with the root it was drawn for and the answer's deadline, and the openings each host
//! sent for them with the verifier's check of them. Both are the stored inputs the traffic
//! aspect is judged on (so `recheck` re-derives it). An opening's envelope holds the opened
//! records' bytes (prompts, responses): it is cleared once `[policy.taps] keep_openings` has
//! passed, and the row keeps its digest and outcome.

use rackwarden_attest::traffic::{OpeningsOutcome, SampleDemand, TrafficRoot};

use super::{DbError, Store, db::vals, each};

pub(super) const TRAFFIC_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS traffic_samples (
  rack TEXT NOT NULL, host TEXT NOT NULL, seq INTEGER NOT NULL,
  root_sha3 TEXT NOT NULL, root_records INTEGER NOT NULL,
  egress_bytes INTEGER NOT NULL, ingress_bytes INTEGER NOT NULL,
  randomness TEXT NOT NULL, per_direction INTEGER NOT NULL,
  drawn_ms INTEGER NOT NULL, deadline_ms INTEGER NOT NULL,
  PRIMARY KEY (rack, host, seq));
CREATE INDEX IF NOT EXISTS traffic_samples_by_deadline ON traffic_samples(rack, host, deadline_ms);
CREATE TABLE IF NOT EXISTS traffic_openings (
  rack TEXT NOT NULL, host TEXT NOT NULL, seq INTEGER NOT NULL, sha3_256 TEXT NOT NULL,
  received_ms INTEGER NOT NULL, outcome TEXT NOT NULL, envelope TEXT,
  PRIMARY KEY (rack, host, seq));
CREATE INDEX IF NOT EXISTS traffic_openings_by_time ON traffic_openings(received_ms);
";

/// A drawn sample: the demand sent to the host and the root it was drawn for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleRow {
    pub rack: String,
    pub host: String,
    pub root: TrafficRoot,
    pub demand: SampleDemand,
    pub drawn_ms: u64,
}

/// The openings a host sent for one epoch, as the verifier checked them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpeningsRow {
    pub rack: String,
    pub host: String,
    pub seq: u64,
    pub sha3_256: [u8; 32],
    pub received_ms: u64,
    pub outcome: OpeningsOutcome,
    /// The envelope as received; `None` once `keep_openings` has passed.
    pub envelope: Option<String>,
}

/// A sample and the openings received for it, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleAndAnswer {
    pub sample: SampleRow,
    pub answer: Option<OpeningsRow>,
}

const SAMPLE_COLS: &str = "rack, host, seq, root_sha3, root_records, egress_bytes, ingress_bytes, randomness, per_direction, drawn_ms, deadline_ms";
const OPENINGS_COLS: &str = "rack, host, seq, sha3_256, received_ms, outcome, envelope";

fn hex32(column: usize, text: &str) -> Result<[u8; 32], DbError> {
    hex::decode(text)
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
        .ok_or_else(|| DbError::Column {
            column,
            what: format!("expected 64 hex digits, found {text:?}"),
        })
}

fn row_sample(r: &super::db::Row, at: usize) -> Result<SampleRow, DbError> {
    let seq = r.u64(at + 2)?;
    Ok(SampleRow {
        rack: r.text(at)?,
        host: r.text(at + 1)?,
        root: TrafficRoot {
            sha3_256: hex32(at + 3, &r.text(at + 3)?)?,
            records: r.u64(at + 4)?,
            bytes: [r.u64(at + 5)?, r.u64(at + 6)?],
        },
        demand: SampleDemand {
            epoch_seq: seq,
            randomness: hex32(at + 7, &r.text(at + 7)?)?,
            per_direction: r.u64(at + 8)? as u32,
            deadline_ms: r.u64(at + 10)?,
        },
        drawn_ms: r.u64(at + 9)?,
    })
}

fn row_openings(r: &super::db::Row, at: usize) -> Result<OpeningsRow, DbError> {
    let outcome = r.text(at + 5)?;
    Ok(OpeningsRow {
        rack: r.text(at)?,
        host: r.text(at + 1)?,
        seq: r.u64(at + 2)?,
        sha3_256: hex32(at + 3, &r.text(at + 3)?)?,
        received_ms: r.u64(at + 4)?,
        outcome: serde_json::from_str(&outcome).map_err(|e| DbError::Column {
            column: at + 5,
            what: format!("not an openings outcome ({e}): {outcome:?}"),
        })?,
        envelope: r.opt_text(at + 6)?,
    })
}

impl Store {
    /// Keeps a drawn sample. A second sample for the same epoch (a fork's other statement)
    /// is not drawn: the first stands, and `false` says so.
    pub fn insert_sample(&self, s: &SampleRow) -> Result<bool, DbError> {
        let d = &s.demand;
        let n = self.db.execute(
            &format!(
                "INSERT INTO traffic_samples ({SAMPLE_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                 ON CONFLICT(rack, host, seq) DO NOTHING"
            ),
            vals![
                &s.rack,
                &s.host,
                d.epoch_seq,
                hex::encode(s.root.sha3_256).as_str(),
                s.root.records,
                s.root.bytes[0],
                s.root.bytes[1],
                hex::encode(d.randomness).as_str(),
                u64::from(d.per_direction),
                s.drawn_ms,
                d.deadline_ms
            ],
        )?;
        Ok(n == 1)
    }

    /// The sample drawn for the host's epoch `seq`, if any.
    pub fn sample(&self, rack: &str, host: &str, seq: u64) -> Result<Option<SampleRow>, DbError> {
        self.db
            .query_opt(
                &format!(
                    "SELECT {SAMPLE_COLS} FROM traffic_samples WHERE rack = ?1 AND host = ?2 AND seq = ?3"
                ),
                vals![rack, host, seq],
            )?
            .map(|r| row_sample(&r, 0))
            .transpose()
    }

    /// The host's samples whose deadline is in `after_ms < deadline <= up_to_ms`, each with
    /// the openings received for it, oldest deadline first.
    pub fn samples_due(
        &self,
        rack: &str,
        host: &str,
        after_ms: u64,
        up_to_ms: u64,
    ) -> Result<Vec<SampleAndAnswer>, DbError> {
        self.samples_with_answers(
            "s.deadline_ms > ?3 AND s.deadline_ms <= ?4 ORDER BY s.deadline_ms, s.seq",
            vals![rack, host, after_ms, up_to_ms],
        )
    }

    /// The host's samples (`?1`, `?2`) that `tail` (the rest of the WHERE clause and the
    /// order) selects, each joined with the openings received for it: one query.
    fn samples_with_answers(
        &self,
        tail: &str,
        params: &[super::db::Value],
    ) -> Result<Vec<SampleAndAnswer>, DbError> {
        let cols: String = SAMPLE_COLS
            .split(", ")
            .map(|c| format!("s.{c}"))
            .chain(OPENINGS_COLS.split(", ").map(|c| format!("o.{c}")))
            .collect::<Vec<_>>()
            .join(", ");
        each(
            self.db.query(
                &format!(
                    "SELECT {cols} FROM traffic_samples s LEFT JOIN traffic_openings o
                       ON o.rack = s.rack AND o.host = s.host AND o.seq = s.seq
                     WHERE s.rack = ?1 AND s.host = ?2 AND {tail}"
                ),
                params,
            )?,
            |r| {
                let sample = row_sample(r, 0)?;
                let answer = match r.opt_text(11)? {
                    None => None,
                    Some(_) => Some(row_openings(r, 11)?),
                };
                Ok(SampleAndAnswer { sample, answer })
            },
        )
    }

    /// The openings received for the host's epoch `seq`, if any.
    pub fn openings(
        &self,
        rack: &str,
        host: &str,
        seq: u64,
    ) -> Result<Option<OpeningsRow>, DbError> {
        self.db
            .query_opt(
                &format!(
                    "SELECT {OPENINGS_COLS} FROM traffic_openings WHERE rack = ?1 AND host = ?2 AND seq = ?3"
                ),
                vals![rack, host, seq],
            )?
            .map(|r| row_openings(&r, 0))
            .transpose()
    }

    /// Keeps the first openings received for an epoch; `false` when the epoch already has
    /// some (they stand: a host does not get to answer twice).
    pub fn insert_openings(&self, o: &OpeningsRow) -> Result<bool, DbError> {
        let outcome = serde_json::to_string(&o.outcome).map_err(|e| DbError::Column {
            column: 5,
            what: format!("the outcome does not serialise: {e}"),
        })?;
        let n = self.db.execute(
            &format!(
                "INSERT INTO traffic_openings ({OPENINGS_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT(rack, host, seq) DO NOTHING"
            ),
            vals![
                &o.rack,
                &o.host,
                o.seq,
                hex::encode(o.sha3_256).as_str(),
                o.received_ms,
                outcome.as_str(),
                &o.envelope
            ],
        )?;
        Ok(n == 1)
    }

    /// Clears the envelopes (the opened bytes) of openings received before `before_ms`; the
    /// rows keep their digest and outcome. Returns how many were cleared.
    pub fn clear_old_openings(&self, before_ms: u64) -> Result<usize, DbError> {
        self.db.execute(
            "UPDATE traffic_openings SET envelope = NULL WHERE received_ms < ?1 AND envelope IS NOT NULL",
            vals![before_ms],
        )
    }

    /// Every sample and every openings row, oldest first: what `recheck` replays.
    pub fn all_samples_and_openings(&self) -> Result<(Vec<SampleRow>, Vec<OpeningsRow>), DbError> {
        let samples = each(
            self.db.query(
                &format!(
                    "SELECT {SAMPLE_COLS} FROM traffic_samples ORDER BY drawn_ms, rack, host, seq"
                ),
                &[],
            )?,
            |r| row_sample(r, 0),
        )?;
        let openings = each(
            self.db.query(
                &format!(
                    "SELECT {OPENINGS_COLS} FROM traffic_openings ORDER BY received_ms, rack, host, seq"
                ),
                &[],
            )?,
            |r| row_openings(r, 0),
        )?;
        Ok((samples, openings))
    }

    /// Every sample of the host from epoch `from_seq` on, with its answer, by seq (the page).
    pub fn samples_since(
        &self,
        rack: &str,
        host: &str,
        from_seq: u64,
    ) -> Result<Vec<SampleAndAnswer>, DbError> {
        self.samples_with_answers("s.seq >= ?3 ORDER BY s.seq", vals![rack, host, from_seq])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(seq: u64, deadline_ms: u64) -> SampleRow {
        SampleRow {
            rack: "r".into(),
            host: "h".into(),
            root: TrafficRoot {
                sha3_256: [seq as u8; 32],
                records: 3,
                bytes: [100, u64::MAX / 4],
            },
            demand: SampleDemand {
                epoch_seq: seq,
                randomness: [7; 32],
                per_direction: 8,
                deadline_ms,
            },
            drawn_ms: deadline_ms - 10,
        }
    }

    #[test]
    fn samples_and_openings_round_trip_and_the_first_stands() {
        let s = crate::store::testing::store("traffic_rows").unwrap();
        assert!(s.insert_sample(&sample(1, 100)).unwrap());
        assert!(!s.insert_sample(&sample(1, 999)).unwrap(), "first stands");
        assert!(s.insert_sample(&sample(2, 200)).unwrap());
        assert_eq!(s.sample("r", "h", 1).unwrap(), Some(sample(1, 100)));
        assert_eq!(s.sample("r", "h", 3).unwrap(), None);
        let o = OpeningsRow {
            rack: "r".into(),
            host: "h".into(),
            seq: 1,
            sha3_256: [9; 32],
            received_ms: 50,
            outcome: OpeningsOutcome::Matched {
                records: 2,
                raw_flows: vec![rackwarden_attest::traffic::FlowKey {
                    proto: 17,
                    local: "10.0.0.2:5353".parse().unwrap(),
                    remote: "[fd00::53]:53".parse().unwrap(),
                }],
            },
            envelope: Some("{}".into()),
        };
        assert!(s.insert_openings(&o).unwrap());
        let other = OpeningsRow {
            sha3_256: [8; 32],
            ..o.clone()
        };
        assert!(!s.insert_openings(&other).unwrap());
        assert_eq!(s.openings("r", "h", 1).unwrap(), Some(o.clone()));
        // Due in (100, 200]: sample 2 only, unanswered; (0, 200]: both, 1 answered.
        let due = s.samples_due("r", "h", 100, 200).unwrap();
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].sample, sample(2, 200));
        assert_eq!(due[0].answer, None);
        let due = s.samples_due("r", "h", 0, 200).unwrap();
        assert_eq!(due[0].answer, Some(o.clone()));
        assert_eq!(s.samples_since("r", "h", 0).unwrap().len(), 2);
        // Retention clears the bytes, not the row.
        assert_eq!(s.clear_old_openings(50).unwrap(), 0);
        assert_eq!(s.clear_old_openings(51).unwrap(), 1);
        let kept = s.openings("r", "h", 1).unwrap().unwrap();
        assert_eq!(kept.envelope, None);
        assert_eq!(kept.outcome, o.outcome);
    }
}
