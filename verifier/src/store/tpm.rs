//! The TPM rows (issue 22): enrolled AKs, outstanding credential challenges, and each host's
//! IMA replay position.

use rackwarden_attest::tpm::MeasuredBoot;

use super::{
    DbError, Store,
    db::{Row, vals},
    each,
};

/// An AK the verifier enrolled for a host after the host activated a credential made for it
/// under its certified EK. Hex and base64 as they came on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpmEnrollment {
    pub rack: String,
    pub host: String,
    /// Hex of the AK's TPMT_PUBLIC.
    pub ak_public: String,
    /// Hex of Name(AK).
    pub ak_name: String,
    /// Hex of the EK's TPMT_PUBLIC.
    pub ek_public: String,
    /// Base64 of the EK certificate's DER.
    pub ek_certificate: Option<String>,
    /// The root CA the EK certificate chained to.
    pub ek_issuer: String,
    pub enrolled_ms: u64,
}

/// A credential challenge issued and not yet answered: what is enrolled when the host returns
/// the secret whose SHA3-256 is `secret_sha3`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpmChallengeRow {
    pub id: String,
    pub secret_sha3: String,
    pub enrollment: TpmEnrollment,
    pub expires_ms: u64,
}

/// How far a host's IMA list is verified: `ima_count` entries of the boot whose TPM
/// resetCount is `reset_count` replay to `pcr10` (hex), as of statement `seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpmPosition {
    pub reset_count: u32,
    pub ima_count: u64,
    pub pcr10: [u8; 32],
    pub seq: u64,
}

/// A boot whose event log replayed to the quoted PCRs 0-9 (`pcrs`) in the boot whose TPM
/// resetCount is `reset_count`, and what it measured, as of statement `seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpmBoot {
    pub reset_count: u32,
    pub pcrs: std::collections::BTreeMap<u8, [u8; 32]>,
    pub measured: MeasuredBoot,
    pub seq: u64,
}

pub(super) fn row_enrollment(r: &Row, at: usize) -> Result<TpmEnrollment, DbError> {
    Ok(TpmEnrollment {
        rack: r.text(at)?,
        host: r.text(at + 1)?,
        ak_public: r.text(at + 2)?,
        ak_name: r.text(at + 3)?,
        ek_public: r.text(at + 4)?,
        ek_certificate: r.opt_text(at + 5)?,
        ek_issuer: r.text(at + 6)?,
        enrolled_ms: r.u64(at + 7)?,
    })
}

/// A stored 32-byte value in hex (`None`: not one).
fn hex32(s: &str) -> Option<[u8; 32]> {
    hex::decode(s).ok()?.try_into().ok()
}

pub(super) const POSITION_SQL: &str =
    "SELECT reset_count, ima_count, pcr10, seq FROM tpm_positions WHERE rack = ?1 AND host = ?2";

pub(super) fn row_position(r: &Row) -> Result<TpmPosition, DbError> {
    // Written only by `set_tpm_position` from a 32-byte value; anything else reads as all
    // zeros, which no replay matches (a finding, not a silent pass).
    let value = hex32(&r.text(2)?).unwrap_or([0u8; 32]);
    Ok(TpmPosition {
        reset_count: r.u64(0)? as u32,
        ima_count: r.u64(1)?,
        pcr10: value,
        seq: r.u64(3)?,
    })
}

pub(super) fn enrollment_sql() -> String {
    format!("SELECT {ENROLL_COLS} FROM tpm_enrollments WHERE rack = ?1 AND host = ?2")
}

const ENROLL_COLS: &str =
    "rack, host, ak_public, ak_name, ek_public, ek_certificate, ek_issuer, enrolled_ms";

impl Store {
    /// Records (or replaces) the AK a host proved lives beside its certified EK.
    /// Under the write lock, as a retirement is (see [`Store::retire`]).
    pub fn enroll_tpm(&self, e: &TpmEnrollment) -> Result<(), DbError> {
        let row = vals![
            &e.rack,
            &e.host,
            &e.ak_public,
            &e.ak_name,
            &e.ek_public,
            &e.ek_certificate,
            &e.ek_issuer,
            e.enrolled_ms
        ];
        self.under_write_lock(|| {
            // The history keeps every enrolment (recheck replays them); the table the
            // appraisal reads keeps the current one.
            self.db.execute(
                &format!(
                    "INSERT INTO tpm_enrollment_history ({ENROLL_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
                ),
                row,
            )?;
            self.db.execute(
                &format!(
                "INSERT INTO tpm_enrollments ({ENROLL_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT(rack, host) DO UPDATE SET ak_public = excluded.ak_public,
                   ak_name = excluded.ak_name, ek_public = excluded.ek_public,
                   ek_certificate = excluded.ek_certificate, ek_issuer = excluded.ek_issuer,
                   enrolled_ms = excluded.enrolled_ms"
            ),
                row,
            )
        })?;
        Ok(())
    }

    pub fn tpm_enrollment(&self, rack: &str, host: &str) -> Result<Option<TpmEnrollment>, DbError> {
        self.db
            .query_opt(&enrollment_sql(), vals![rack, host])?
            .map(|r| row_enrollment(&r, 0))
            .transpose()
    }

    pub fn tpm_enrollments(&self) -> Result<Vec<TpmEnrollment>, DbError> {
        each(
            self.db.query(
                &format!("SELECT {ENROLL_COLS} FROM tpm_enrollments ORDER BY rack, host"),
                &[],
            )?,
            |r| row_enrollment(r, 0),
        )
    }

    /// Every enrolment in the order made (oldest first). A database from before the history
    /// was kept has only the current enrolments: those stand in for it.
    pub fn tpm_enrollment_history(&self) -> Result<Vec<TpmEnrollment>, DbError> {
        let history = each(
            self.db.query(
                &format!(
                    "SELECT {ENROLL_COLS} FROM tpm_enrollment_history ORDER BY enrolled_ms, rack, host"
                ),
                &[],
            )?,
            |r| row_enrollment(r, 0),
        )?;
        let current = self.tpm_enrollments()?;
        // A current enrolment missing from the history (made before it was kept) is added at
        // its own time.
        let mut all = history.clone();
        all.extend(current.into_iter().filter(|c| !history.contains(c)));
        all.sort_by_key(|e| e.enrolled_ms);
        Ok(all)
    }

    /// Keeps an outstanding credential challenge.
    pub fn insert_tpm_challenge(&self, c: &TpmChallengeRow) -> Result<(), DbError> {
        let e = &c.enrollment;
        self.db.execute(
            "INSERT INTO tpm_challenges (id, rack, host, secret_sha3, ak_public, ak_name, ek_public, ek_certificate, ek_issuer, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            vals![
                &c.id,
                &e.rack,
                &e.host,
                &c.secret_sha3,
                &e.ak_public,
                &e.ak_name,
                &e.ek_public,
                &e.ek_certificate,
                &e.ek_issuer,
                c.expires_ms
            ],
        )?;
        Ok(())
    }

    /// The challenge `id`, removed as it is read: a challenge is answered once. The delete
    /// decides (`RETURNING`): of two instances answering the same id at once, one gets it.
    pub fn take_tpm_challenge(&self, id: &str) -> Result<Option<TpmChallengeRow>, DbError> {
        self.db
            .query_opt(
                "DELETE FROM tpm_challenges WHERE id = ?1
                 RETURNING id, secret_sha3, expires_ms, rack, host, ak_public, ak_name, ek_public, ek_certificate, ek_issuer",
                vals![id],
            )?
            .map(|r| {
                Ok(TpmChallengeRow {
                    id: r.text(0)?,
                    secret_sha3: r.text(1)?,
                    expires_ms: r.u64(2)?,
                    enrollment: TpmEnrollment {
                        rack: r.text(3)?,
                        host: r.text(4)?,
                        ak_public: r.text(5)?,
                        ak_name: r.text(6)?,
                        ek_public: r.text(7)?,
                        ek_certificate: r.opt_text(8)?,
                        ek_issuer: r.text(9)?,
                        enrolled_ms: 0,
                    },
                })
            })
            .transpose()
    }

    /// Deletes challenges that expired before `before_ms`.
    pub fn prune_tpm_challenges(&self, before_ms: u64) -> Result<usize, DbError> {
        self.db.execute(
            "DELETE FROM tpm_challenges WHERE expires_ms < ?1",
            vals![before_ms],
        )
    }

    /// How far the host's IMA list has been replayed (boot, entries, PCR 10, seq).
    pub fn tpm_position(&self, rack: &str, host: &str) -> Result<Option<TpmPosition>, DbError> {
        self.db
            .query_opt(POSITION_SQL, vals![rack, host])?
            .as_ref()
            .map(row_position)
            .transpose()
    }

    /// The host's last boot whose event log verified (`None`: none, or a row that no longer
    /// reads, which then judges as no verified boot: a finding, not a silent pass).
    pub fn tpm_boot(&self, rack: &str, host: &str) -> Result<Option<TpmBoot>, DbError> {
        let Some(r) = self.db.query_opt(
            "SELECT reset_count, pcrs, measured, seq FROM tpm_boots WHERE rack = ?1 AND host = ?2",
            vals![rack, host],
        )?
        else {
            return Ok(None);
        };
        // Written only by `set_tpm_boot`; a row that does not read back whole (every value
        // 32 bytes, PCRs 0-9 all there) is no verified boot, never an empty set that any
        // quote would match.
        let Ok(pcrs) = serde_json::from_str::<std::collections::BTreeMap<u8, String>>(&r.text(1)?)
        else {
            return Ok(None);
        };
        let pcrs: Option<std::collections::BTreeMap<u8, [u8; 32]>> = pcrs
            .into_iter()
            .map(|(i, v)| Some((i, hex32(&v)?)))
            .collect();
        let Some(pcrs) = pcrs.filter(|p| {
            rackwarden_attest::tpm::BOOT_LOG_PCRS
                .clone()
                .all(|i| p.contains_key(&i))
        }) else {
            return Ok(None);
        };
        let Ok(measured) = serde_json::from_str(&r.text(2)?) else {
            return Ok(None);
        };
        Ok(Some(TpmBoot {
            reset_count: r.u64(0)? as u32,
            pcrs,
            measured,
            seq: r.u64(3)?,
        }))
    }

    pub fn set_tpm_boot(&self, rack: &str, host: &str, b: &TpmBoot) -> Result<(), DbError> {
        let pcrs: std::collections::BTreeMap<u8, String> =
            b.pcrs.iter().map(|(i, v)| (*i, hex::encode(v))).collect();
        let pcrs = serde_json::to_string(&pcrs).unwrap_or_default();
        let measured = serde_json::to_string(&b.measured).unwrap_or_default();
        self.db.execute(
            "INSERT INTO tpm_boots (rack, host, reset_count, pcrs, measured, seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(rack, host) DO UPDATE SET reset_count = excluded.reset_count,
               pcrs = excluded.pcrs, measured = excluded.measured, seq = excluded.seq",
            vals![rack, host, b.reset_count, pcrs.as_str(), measured.as_str(), b.seq],
        )?;
        Ok(())
    }

    pub fn set_tpm_position(&self, rack: &str, host: &str, p: &TpmPosition) -> Result<(), DbError> {
        self.db.execute(
            "INSERT INTO tpm_positions (rack, host, reset_count, ima_count, pcr10, seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(rack, host) DO UPDATE SET reset_count = excluded.reset_count,
               ima_count = excluded.ima_count, pcr10 = excluded.pcr10, seq = excluded.seq",
            vals![rack, host, p.reset_count, p.ima_count, hex::encode(p.pcr10).as_str(), p.seq],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enrollment() -> TpmEnrollment {
        TpmEnrollment {
            rack: "r".into(),
            host: "h".into(),
            ak_public: "aa".into(),
            ak_name: "000b".into(),
            ek_public: "bb".into(),
            ek_certificate: Some("Y2VydA==".into()),
            ek_issuer: "CN=swtpm-localca".into(),
            enrolled_ms: 5,
        }
    }

    #[test]
    fn tpm_rows_round_trip() {
        let s = crate::store::testing::store("tpm_rows").unwrap();
        assert_eq!(s.tpm_enrollment("r", "h").unwrap(), None);
        s.enroll_tpm(&enrollment()).unwrap();
        assert_eq!(s.tpm_enrollment("r", "h").unwrap(), Some(enrollment()));
        assert_eq!(s.tpm_enrollments().unwrap().len(), 1);

        let c = TpmChallengeRow {
            id: "c1".into(),
            secret_sha3: "ff".into(),
            enrollment: TpmEnrollment {
                enrolled_ms: 0,
                ..enrollment()
            },
            expires_ms: 10,
        };
        s.insert_tpm_challenge(&c).unwrap();
        assert_eq!(s.take_tpm_challenge("c1").unwrap(), Some(c.clone()));
        assert_eq!(s.take_tpm_challenge("c1").unwrap(), None, "used up");
        s.insert_tpm_challenge(&c).unwrap();
        assert_eq!(s.prune_tpm_challenges(11).unwrap(), 1);

        let p = TpmPosition {
            reset_count: 2,
            ima_count: 40,
            pcr10: [9; 32],
            seq: 7,
        };
        s.set_tpm_position("r", "h", &p).unwrap();
        assert_eq!(s.tpm_position("r", "h").unwrap(), Some(p));
        assert_eq!(s.tpm_position("r", "x").unwrap(), None);
    }
}
