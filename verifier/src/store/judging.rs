//! What the store holds that every statement is judged against, read in one go: the up to
//! eight queries go out together (pipelined on PostgreSQL: one round trip where they were
//! one each, at about 60 us each on this kind of machine), and `appraisal_context::load` builds the
//! appraisal's context from the rows.

use super::{
    DbError, HostKey, NONCE_SQL, NonceRecord, Store, StoredStatement, by_seq_sql,
    db::{Value, vals},
    each, key_sql, row_key, row_nonce, row_statement,
    tpm::{POSITION_SQL, TpmEnrollment, TpmPosition, enrollment_sql, row_enrollment, row_position},
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

/// The rows, as [`Store::by_seq`], [`Store::nonce`], [`Store::host_key`],
/// [`Store::tpm_enrollment`] and [`Store::tpm_position`] would give them one by one, and the
/// host's last complete wipe. What only some statements need ([`Store::before`] across a
/// gap, [`Store::host_first_enrolled_ms`] for a rotated key) is asked by the caller then.
#[derive(Debug, Default)]
pub struct JudgingRows {
    /// Statements stored at the same seq.
    pub same_seq: Vec<StoredStatement>,
    /// Statements stored at `seq - 1` (none for seq 0).
    pub predecessors: Vec<StoredStatement>,
    /// The statement's own nonce as issued (none when it names none, or it is unknown).
    pub nonce: Option<NonceRecord>,
    pub key: Option<HostKey>,
    pub next_key: Option<HostKey>,
    /// Epoch end of the host's latest statement with a complete wipe.
    pub last_wipe_ms: Option<u64>,
    pub tpm_enrollment: Option<TpmEnrollment>,
    pub tpm_position: Option<TpmPosition>,
}

/// One query of the set and where its rows go.
enum Part {
    SameSeq,
    Predecessors,
    Nonce,
    Key,
    NextKey,
    LastWipe,
    TpmEnrollment,
    TpmPosition,
}

impl Store {
    /// The rows a statement is judged against ([`JudgingRows`]), all asked at once.
    pub fn judging_rows(&self, q: &JudgingQuery<'_>) -> Result<JudgingRows, DbError> {
        let (by_seq, key, enrollment) = (by_seq_sql(), key_sql(), enrollment_sql());
        let host = vals![q.rack, q.host].to_vec();
        let mut parts: Vec<(Part, &str, Vec<Value>)> = vec![
            (
                Part::SameSeq,
                &by_seq,
                vals![q.rack, q.host, q.seq].to_vec(),
            ),
            (Part::Key, &key, vals![q.keyid].to_vec()),
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
        }
        if let Some(next) = q.next_keyid {
            parts.push((Part::NextKey, &key, vals![next].to_vec()));
        }
        if let Some(nonce) = q.nonce {
            parts.push((Part::Nonce, NONCE_SQL, vals![nonce].to_vec()));
        }
        let asked: Vec<(&str, &[Value])> = parts
            .iter()
            .map(|(_, sql, params)| (*sql, params.as_slice()))
            .collect();
        let answers = self.db.query_many(&asked)?;
        let mut out = JudgingRows::default();
        for ((part, _, _), rows) in parts.iter().zip(answers) {
            let first = rows.first();
            match part {
                Part::SameSeq => out.same_seq = each(rows, row_statement)?,
                Part::Predecessors => out.predecessors = each(rows, row_statement)?,
                Part::Nonce => out.nonce = first.map(row_nonce).transpose()?,
                Part::Key => out.key = first.map(row_key).transpose()?,
                Part::NextKey => out.next_key = first.map(row_key).transpose()?,
                Part::LastWipe => {
                    out.last_wipe_ms = first.map(|r| r.opt_u64(0)).transpose()?.flatten()
                }
                Part::TpmEnrollment => {
                    out.tpm_enrollment = first.map(|r| row_enrollment(r, 0)).transpose()?
                }
                Part::TpmPosition => out.tpm_position = first.map(row_position).transpose()?,
            }
        }
        Ok(out)
    }
}
