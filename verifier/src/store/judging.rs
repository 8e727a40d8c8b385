//! Everything the store holds that one statement is judged against, read in one go: the
//! queries go out together (pipelined on PostgreSQL: one round trip where they were ten, at
//! about 60 us each on this kind of machine), and `context::load` builds the appraisal's
//! context from the rows.

use super::{
    DbError, HostKey, KEY_COLS, NonceRecord, STATEMENT_COLS, Store, StoredStatement,
    db::{Row, Value, vals},
    each, row_key, row_nonce, row_statement,
    tpm::{ENROLL_COLS, POSITION_SQL, TpmEnrollment, TpmPosition, row_enrollment, row_position},
};

/// Which statement is being judged: its host, seq, key, the key it names next and its
/// nonce.
pub struct JudgingQuery<'a> {
    pub rack: &'a str,
    pub host: &'a str,
    pub seq: u64,
    pub keyid: &'a str,
    pub next_keyid: Option<&'a str>,
    pub nonce: Option<&'a str>,
}

/// The rows, as [`Store::by_seq`], [`Store::before`], [`Store::nonce`], [`Store::host_key`],
/// [`Store::host_first_enrolled_ms`], [`Store::last_wipe`], [`Store::tpm_enrollment`] and
/// [`Store::tpm_position`] would give them one by one.
#[derive(Debug, Default)]
pub struct JudgingRows {
    /// Statements stored at the same seq.
    pub same_seq: Vec<StoredStatement>,
    /// Statements stored at `seq - 1` (none for seq 0).
    pub predecessors: Vec<StoredStatement>,
    /// The statement with the highest seq below `seq` (none for seq 0).
    pub before: Option<StoredStatement>,
    /// The statement's own nonce as issued (none when it names none, or it is unknown).
    pub nonce: Option<NonceRecord>,
    pub key: Option<HostKey>,
    pub next_key: Option<HostKey>,
    pub first_enrolled_ms: Option<u64>,
    pub last_wipe_ms: Option<u64>,
    pub tpm_enrollment: Option<TpmEnrollment>,
    pub tpm_position: Option<TpmPosition>,
}

/// One query of the set and where its rows go.
enum Part {
    SameSeq,
    Predecessors,
    Before,
    Nonce,
    Key,
    NextKey,
    FirstEnrolled,
    LastWipe,
    TpmEnrollment,
    TpmPosition,
}

impl Store {
    /// The rows a statement is judged against ([`JudgingRows`]), all asked at once.
    pub fn judging_rows(&self, q: &JudgingQuery<'_>) -> Result<JudgingRows, DbError> {
        let by_seq = format!(
            "SELECT {STATEMENT_COLS} FROM statements WHERE rack = ?1 AND host = ?2 AND seq = ?3 ORDER BY id"
        );
        let before = format!(
            "SELECT {STATEMENT_COLS} FROM statements WHERE rack = ?1 AND host = ?2 AND seq < ?3 ORDER BY seq DESC, id DESC LIMIT 1"
        );
        let key = format!("SELECT {KEY_COLS} FROM host_keys WHERE keyid = ?1");
        let enrollment =
            format!("SELECT {ENROLL_COLS} FROM tpm_enrollments WHERE rack = ?1 AND host = ?2");
        let host = vals![q.rack, q.host].to_vec();
        let mut parts: Vec<(Part, &str, Vec<Value>)> = vec![
            (
                Part::SameSeq,
                &by_seq,
                vals![q.rack, q.host, q.seq].to_vec(),
            ),
            (Part::Key, &key, vals![q.keyid].to_vec()),
            (
                Part::FirstEnrolled,
                "SELECT MIN(enrolled_ms) FROM host_keys WHERE rack = ?1 AND host = ?2",
                host.clone(),
            ),
            (
                Part::LastWipe,
                "SELECT MAX(wipe_ms) FROM statements WHERE rack = ?1 AND host = ?2",
                host.clone(),
            ),
            (Part::TpmEnrollment, &enrollment, host.clone()),
            (Part::TpmPosition, POSITION_SQL, host),
        ];
        if q.seq > 0 {
            parts.push((
                Part::Predecessors,
                &by_seq,
                vals![q.rack, q.host, q.seq - 1].to_vec(),
            ));
            parts.push((Part::Before, &before, vals![q.rack, q.host, q.seq].to_vec()));
        }
        if let Some(next) = q.next_keyid {
            parts.push((Part::NextKey, &key, vals![next].to_vec()));
        }
        if let Some(nonce) = q.nonce {
            parts.push((
                Part::Nonce,
                "SELECT nonce, rack, host, issued_ms, expires_ms, used_ms FROM nonces WHERE nonce = ?1",
                vals![nonce].to_vec(),
            ));
        }
        let asked: Vec<(&str, &[Value])> = parts
            .iter()
            .map(|(_, sql, params)| (*sql, params.as_slice()))
            .collect();
        let answers = self.db.query_many(&asked)?;
        let first = |rows: &[Row]| rows.first().cloned();
        let mut out = JudgingRows::default();
        for ((part, _, _), rows) in parts.iter().zip(answers) {
            match part {
                Part::SameSeq => out.same_seq = each(rows, row_statement)?,
                Part::Predecessors => out.predecessors = each(rows, row_statement)?,
                Part::Before => {
                    out.before = first(&rows).as_ref().map(row_statement).transpose()?
                }
                Part::Nonce => out.nonce = first(&rows).as_ref().map(row_nonce).transpose()?,
                Part::Key => out.key = first(&rows).as_ref().map(row_key).transpose()?,
                Part::NextKey => out.next_key = first(&rows).as_ref().map(row_key).transpose()?,
                Part::FirstEnrolled => {
                    out.first_enrolled_ms =
                        first(&rows).map(|r| r.opt_u64(0)).transpose()?.flatten()
                }
                Part::LastWipe => {
                    out.last_wipe_ms = first(&rows).map(|r| r.opt_u64(0)).transpose()?.flatten()
                }
                Part::TpmEnrollment => {
                    out.tpm_enrollment = first(&rows)
                        .as_ref()
                        .map(|r| row_enrollment(r, 0))
                        .transpose()?
                }
                Part::TpmPosition => {
                    out.tpm_position = first(&rows).as_ref().map(row_position).transpose()?
                }
            }
        }
        Ok(out)
    }
}
