//! The replay rows (issue 28): what the replay service found in each epoch's opened
//! exchanges, with when it stored it. One row per opened epoch, holding each exchange
//! record's replay (tolerance-free: `rackwarden_sampler::verdict`), so the `replay` aspect
//! judges them at the policy's tolerance and `recheck` re-derives that verdict.

use rackwarden_sampler::verdict::ExchangeReplay;
use serde::{Deserialize, Serialize};

use super::{DbError, Store, db::vals, each};

pub(super) const REPLAY_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS traffic_replays (
  rack TEXT NOT NULL, host TEXT NOT NULL, seq INTEGER NOT NULL,
  replayed_ms INTEGER NOT NULL, records TEXT NOT NULL,
  PRIMARY KEY (rack, host, seq));
CREATE INDEX IF NOT EXISTS traffic_replays_by_time ON traffic_replays(rack, host, replayed_ms);
";

/// One opened exchange record's replay: its index in the epoch's sum tree and what was found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordReplay {
    pub index: u64,
    pub replay: ExchangeReplay,
}

/// The replay of one epoch's openings.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayRow {
    pub rack: String,
    pub host: String,
    pub seq: u64,
    pub replayed_ms: u64,
    /// Every exchange record opened for the epoch (other records are not replayed).
    pub records: Vec<RecordReplay>,
}

/// Openings the replay service has yet to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingReplay {
    pub rack: String,
    pub host: String,
    pub seq: u64,
    /// The openings envelope as received (checked and matched when it was stored).
    pub envelope: String,
}

const COLS: &str = "rack, host, seq, replayed_ms, records";

fn row_replay(r: &super::db::Row) -> Result<ReplayRow, DbError> {
    let records = r.text(4)?;
    Ok(ReplayRow {
        rack: r.text(0)?,
        host: r.text(1)?,
        seq: r.u64(2)?,
        replayed_ms: r.u64(3)?,
        records: serde_json::from_str(&records).map_err(|e| DbError::Column {
            column: 4,
            what: format!("not a list of record replays ({e})"),
        })?,
    })
}

impl Store {
    /// Keeps an epoch's replay; `false` when the epoch already has one (the first stands, so
    /// two replay services cannot disagree in the record).
    pub fn insert_replay(&self, r: &ReplayRow) -> Result<bool, DbError> {
        let records = serde_json::to_string(&r.records).map_err(|e| DbError::Column {
            column: 4,
            what: format!("the replays do not serialise: {e}"),
        })?;
        let n = self.db.execute(
            &format!(
                "INSERT INTO traffic_replays ({COLS}) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(rack, host, seq) DO NOTHING"
            ),
            vals![&r.rack, &r.host, r.seq, r.replayed_ms, records.as_str()],
        )?;
        Ok(n == 1)
    }

    /// The host's replays stored in `after_ms < replayed_ms <= up_to_ms`, oldest first.
    pub fn replays_between(
        &self,
        rack: &str,
        host: &str,
        after_ms: u64,
        up_to_ms: u64,
    ) -> Result<Vec<ReplayRow>, DbError> {
        each(
            self.db.query(
                &format!(
                    "SELECT {COLS} FROM traffic_replays WHERE rack = ?1 AND host = ?2
                       AND replayed_ms > ?3 AND replayed_ms <= ?4 ORDER BY replayed_ms, seq"
                ),
                vals![rack, host, after_ms, up_to_ms],
            )?,
            row_replay,
        )
    }

    /// The replay of the host's epoch `seq`, if any (the page).
    pub fn replay(&self, rack: &str, host: &str, seq: u64) -> Result<Option<ReplayRow>, DbError> {
        self.db
            .query_opt(
                &format!(
                    "SELECT {COLS} FROM traffic_replays WHERE rack = ?1 AND host = ?2 AND seq = ?3"
                ),
                vals![rack, host, seq],
            )?
            .map(|r| row_replay(&r))
            .transpose()
    }

    /// Matched openings whose bytes are still kept and that have no replay yet, oldest
    /// first, at most `limit`.
    pub fn pending_replays(&self, limit: u64) -> Result<Vec<PendingReplay>, DbError> {
        each(
            self.db.query(
                "SELECT o.rack, o.host, o.seq, o.envelope FROM traffic_openings o
                   LEFT JOIN traffic_replays r ON r.rack = o.rack AND r.host = o.host AND r.seq = o.seq
                 WHERE r.seq IS NULL AND o.envelope IS NOT NULL AND o.outcome LIKE '{\"status\":\"matched\"%'
                 ORDER BY o.received_ms, o.rack, o.host, o.seq LIMIT ?1",
                vals![limit],
            )?,
            |r| {
                Ok(PendingReplay {
                    rack: r.text(0)?,
                    host: r.text(1)?,
                    seq: r.u64(2)?,
                    envelope: r.text(3)?,
                })
            },
        )
    }

    /// Every replay row, oldest first: what `recheck` judges again.
    pub fn all_replays(&self) -> Result<Vec<ReplayRow>, DbError> {
        each(
            self.db.query(
                &format!(
                    "SELECT {COLS} FROM traffic_replays ORDER BY replayed_ms, rack, host, seq"
                ),
                &[],
            )?,
            row_replay,
        )
    }
}

#[cfg(test)]
mod tests {
    use rackwarden_attest::traffic::OpeningsOutcome;
    use rackwarden_sampler::verdict::StructuralFinding;

    use super::*;
    use crate::store::OpeningsRow;

    #[test]
    fn replays_round_trip_the_first_stands_and_pending_ones_are_found() {
        let s = crate::store::testing::store("replay_rows").unwrap();
        let openings = |seq: u64, outcome: OpeningsOutcome| OpeningsRow {
            rack: "r".into(),
            host: "h".into(),
            seq,
            sha3_256: [seq as u8; 32],
            received_ms: 10 * seq,
            outcome,
            envelope: Some(format!("env{seq}")),
        };
        let matched = OpeningsOutcome::Matched {
            records: 1,
            raw_flows: vec![],
        };
        s.insert_openings(&openings(1, matched.clone())).unwrap();
        s.insert_openings(&openings(2, matched.clone())).unwrap();
        s.insert_openings(&openings(
            3,
            OpeningsOutcome::Refused {
                reason: "no".into(),
            },
        ))
        .unwrap();
        let pending = || -> Vec<u64> {
            s.pending_replays(10)
                .unwrap()
                .iter()
                .map(|p| p.seq)
                .collect()
        };
        assert_eq!(pending(), vec![1, 2], "refused openings are not replayed");
        let row = ReplayRow {
            rack: "r".into(),
            host: "h".into(),
            seq: 1,
            replayed_ms: 500,
            records: vec![RecordReplay {
                index: 4,
                replay: ExchangeReplay::Failed {
                    finding: StructuralFinding::NotCanonical { offset: 17 },
                },
            }],
        };
        assert!(s.insert_replay(&row).unwrap());
        assert!(
            !s.insert_replay(&ReplayRow {
                replayed_ms: 600,
                records: vec![],
                ..row.clone()
            })
            .unwrap()
        );
        assert_eq!(s.replay("r", "h", 1).unwrap(), Some(row.clone()));
        assert_eq!(
            s.replays_between("r", "h", 499, 500).unwrap(),
            vec![row.clone()]
        );
        assert!(s.replays_between("r", "h", 500, 900).unwrap().is_empty());
        assert_eq!(pending(), vec![2]);
        assert_eq!(s.all_replays().unwrap(), vec![row]);
    }
}
