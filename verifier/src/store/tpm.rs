//! The TPM rows (issue 22): enrolled AKs, outstanding credential challenges, and each host's
//! IMA replay position.

use rusqlite::{OptionalExtension, Row, params};

use super::{DbError, Store};

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

fn row_enrollment(r: &Row<'_>, at: usize) -> Result<TpmEnrollment, DbError> {
    Ok(TpmEnrollment {
        rack: r.get(at)?,
        host: r.get(at + 1)?,
        ak_public: r.get(at + 2)?,
        ak_name: r.get(at + 3)?,
        ek_public: r.get(at + 4)?,
        ek_certificate: r.get(at + 5)?,
        ek_issuer: r.get(at + 6)?,
        enrolled_ms: r.get::<_, i64>(at + 7)? as u64,
    })
}

const ENROLL_COLS: &str =
    "rack, host, ak_public, ak_name, ek_public, ek_certificate, ek_issuer, enrolled_ms";

impl Store {
    /// Enrols (or re-enrols, replacing) the host's AK.
    pub fn enroll_tpm(&self, e: &TpmEnrollment) -> Result<(), DbError> {
        self.conn.execute(
            &format!("INSERT OR REPLACE INTO tpm_enrollments ({ENROLL_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"),
            params![
                e.rack,
                e.host,
                e.ak_public,
                e.ak_name,
                e.ek_public,
                e.ek_certificate,
                e.ek_issuer,
                e.enrolled_ms as i64
            ],
        )?;
        Ok(())
    }

    pub fn tpm_enrollment(&self, rack: &str, host: &str) -> Result<Option<TpmEnrollment>, DbError> {
        self.conn
            .prepare_cached(&format!(
                "SELECT {ENROLL_COLS} FROM tpm_enrollments WHERE rack = ?1 AND host = ?2"
            ))?
            .query_row(params![rack, host], |r| row_enrollment(r, 0))
            .optional()
    }

    pub fn tpm_enrollments(&self) -> Result<Vec<TpmEnrollment>, DbError> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {ENROLL_COLS} FROM tpm_enrollments ORDER BY rack, host"
        ))?;
        let rows = st.query_map([], |r| row_enrollment(r, 0))?;
        rows.collect()
    }

    pub fn insert_tpm_challenge(&self, c: &TpmChallengeRow) -> Result<(), DbError> {
        let e = &c.enrollment;
        self.conn.execute(
            "INSERT INTO tpm_challenges (id, rack, host, secret_sha3, ak_public, ak_name, ek_public, ek_certificate, ek_issuer, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![
                c.id,
                e.rack,
                e.host,
                c.secret_sha3,
                e.ak_public,
                e.ak_name,
                e.ek_public,
                e.ek_certificate,
                e.ek_issuer,
                c.expires_ms as i64
            ],
        )?;
        Ok(())
    }

    /// Takes the challenge out (an answer, right or wrong, uses it up).
    pub fn take_tpm_challenge(&self, id: &str) -> Result<Option<TpmChallengeRow>, DbError> {
        let row = self
            .conn
            .prepare_cached(
                "SELECT id, secret_sha3, expires_ms, rack, host, ak_public, ak_name, ek_public, ek_certificate, ek_issuer FROM tpm_challenges WHERE id = ?1",
            )?
            .query_row(params![id], |r| {
                Ok(TpmChallengeRow {
                    id: r.get(0)?,
                    secret_sha3: r.get(1)?,
                    expires_ms: r.get::<_, i64>(2)? as u64,
                    enrollment: TpmEnrollment {
                        rack: r.get(3)?,
                        host: r.get(4)?,
                        ak_public: r.get(5)?,
                        ak_name: r.get(6)?,
                        ek_public: r.get(7)?,
                        ek_certificate: r.get(8)?,
                        ek_issuer: r.get(9)?,
                        enrolled_ms: 0,
                    },
                })
            })
            .optional()?;
        if row.is_some() {
            self.conn
                .execute("DELETE FROM tpm_challenges WHERE id = ?1", params![id])?;
        }
        Ok(row)
    }

    /// Deletes challenges that expired before `before_ms`.
    pub fn prune_tpm_challenges(&self, before_ms: u64) -> Result<usize, DbError> {
        self.conn.execute(
            "DELETE FROM tpm_challenges WHERE expires_ms < ?1",
            params![before_ms as i64],
        )
    }

    pub fn tpm_position(&self, rack: &str, host: &str) -> Result<Option<TpmPosition>, DbError> {
        self.conn
            .prepare_cached(
                "SELECT reset_count, ima_count, pcr10, seq FROM tpm_positions WHERE rack = ?1 AND host = ?2",
            )?
            .query_row(params![rack, host], |r| {
                let pcr10: String = r.get(2)?;
                let mut value = [0u8; 32];
                // Written only by `set_tpm_position` from a 32-byte value; anything else reads
                // as all zeros, which no replay matches (a finding, not a silent pass).
                if let Ok(bytes) = hex::decode(&pcr10)
                    && let Ok(v) = <[u8; 32]>::try_from(bytes.as_slice())
                {
                    value = v;
                }
                Ok(TpmPosition {
                    reset_count: r.get::<_, i64>(0)? as u32,
                    ima_count: r.get::<_, i64>(1)? as u64,
                    pcr10: value,
                    seq: r.get::<_, i64>(3)? as u64,
                })
            })
            .optional()
    }

    pub fn set_tpm_position(&self, rack: &str, host: &str, p: &TpmPosition) -> Result<(), DbError> {
        self.conn.execute(
            "INSERT OR REPLACE INTO tpm_positions (rack, host, reset_count, ima_count, pcr10, seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                rack,
                host,
                i64::from(p.reset_count),
                p.ima_count as i64,
                hex::encode(p.pcr10),
                p.seq as i64
            ],
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
        let s = Store::in_memory().unwrap();
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
