//! PCR selections (TPML_PCR_SELECTION) and values, and the pcrDigest a quote commits to.
//! Only the SHA-256 bank is accepted: the AK's nameAlg is SHA-256, so a quote's pcrDigest is a
//! SHA-256 over SHA-256 PCRs, and one bank keeps "which PCR did the quote cover" unambiguous.

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};
use thiserror::Error;

use super::error::TpmError;
use super::marshal::Reader;
use super::public::TPM_ALG_SHA256;

/// Highest PCR index + 1 we select: sizeofSelect is at most 4 bytes (PC-client TPMs have 24).
const MAX_PCRS: u8 = 32;
/// PCR_SELECT_MIN of the PC-client profile: a TPM rejects a shorter bitmap.
const SELECT_MIN: usize = 3;

/// A selected PCR has no value in the [`PcrValues`] given.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[error("no value for PCR {0}, which the selection includes")]
pub struct MissingPcr(pub u8);

/// A set of PCR indices in the SHA-256 bank.
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct PcrSelection {
    pcrs: BTreeSet<u8>,
}

impl PcrSelection {
    /// The selection of `pcrs` (indices 0..32).
    pub fn from_indices(pcrs: &[u8]) -> Result<PcrSelection, TpmError> {
        if let Some(bad) = pcrs.iter().find(|p| **p >= MAX_PCRS) {
            return Err(TpmError::Invalid {
                what: "PCR selection",
                field: "index",
                offset: 0,
                why: format!("PCR {bad}, want below {MAX_PCRS}"),
            });
        }
        Ok(PcrSelection {
            pcrs: pcrs.iter().copied().collect(),
        })
    }

    /// Parses a whole TPML_PCR_SELECTION.
    pub fn parse(tpml_pcr_selection: &[u8]) -> Result<PcrSelection, TpmError> {
        let mut r = Reader::new("TPML_PCR_SELECTION", tpml_pcr_selection);
        let s = Self::read(&mut r)?;
        r.finish()?;
        Ok(s)
    }

    /// Reads a TPML_PCR_SELECTION with exactly one TPMS_PCR_SELECTION, for the SHA-256 bank.
    pub(crate) fn read(r: &mut Reader<'_>) -> Result<PcrSelection, TpmError> {
        r.expect_u32("pcrSelections.count", 1)?;
        r.expect_u16("pcrSelections[0].hash", TPM_ALG_SHA256)?;
        let size_offset = r.offset();
        let size = r.u8("pcrSelections[0].sizeofSelect")?;
        if size == 0 || size > MAX_PCRS / 8 {
            let why = format!("{size}, want 1 to {}", MAX_PCRS / 8);
            return Err(r.invalid("pcrSelections[0].sizeofSelect", size_offset, why));
        }
        let bitmap = r.take("pcrSelections[0].pcrSelect", usize::from(size))?;
        let mut pcrs = BTreeSet::new();
        for (byte, bits) in (0u8..).zip(bitmap) {
            for bit in 0..8 {
                if bits & (1 << bit) != 0 {
                    pcrs.insert(byte * 8 + bit);
                }
            }
        }
        Ok(PcrSelection { pcrs })
    }

    /// The TPML_PCR_SELECTION: count 1, SHA-256, a bitmap of at least 3 bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let highest = self.pcrs.last().map_or(0, |p| usize::from(*p) / 8 + 1);
        let mut bitmap = vec![0u8; highest.max(SELECT_MIN)];
        for p in &self.pcrs {
            bitmap[usize::from(*p) / 8] |= 1 << (p % 8);
        }
        let mut b = 1u32.to_be_bytes().to_vec();
        b.extend(TPM_ALG_SHA256.to_be_bytes());
        // At most 4 bytes: indices are below MAX_PCRS.
        b.push(bitmap.len() as u8);
        b.extend(bitmap);
        b
    }

    /// Selected PCR indices, ascending (the order their values enter pcrDigest).
    pub fn indices(&self) -> Vec<u8> {
        self.pcrs.iter().copied().collect()
    }

    pub fn contains(&self, pcr: u8) -> bool {
        self.pcrs.contains(&pcr)
    }
}

/// SHA-256 bank PCR values by index.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PcrValues(pub BTreeMap<u8, [u8; 32]>);

impl PcrValues {
    pub fn new() -> PcrValues {
        PcrValues::default()
    }

    pub fn insert(&mut self, pcr: u8, value: [u8; 32]) {
        self.0.insert(pcr, value);
    }

    pub fn get(&self, pcr: u8) -> Option<&[u8; 32]> {
        self.0.get(&pcr)
    }

    /// Indices that have a value, ascending.
    pub fn indices(&self) -> Vec<u8> {
        self.0.keys().copied().collect()
    }

    /// pcrDigest = SHA-256(PCR[i1] || PCR[i2] || …) over the selected PCRs in ascending index,
    /// what a TPM puts in TPMS_QUOTE_INFO for a one-bank selection.
    pub fn digest(&self, selection: &PcrSelection) -> Result<[u8; 32], MissingPcr> {
        let mut h = Sha256::new();
        for p in &selection.pcrs {
            h.update(self.0.get(p).ok_or(MissingPcr(*p))?);
        }
        Ok(h.finalize().into())
    }
}

impl From<BTreeMap<u8, [u8; 32]>> for PcrValues {
    fn from(m: BTreeMap<u8, [u8; 32]>) -> Self {
        PcrValues(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tpm_pcr_selection_round_trips() {
        let s = PcrSelection::from_indices(&[0, 1, 2, 3, 4, 5, 6, 7, 10]).unwrap();
        assert_eq!(hex::encode(s.to_bytes()), "00000001000b03ff0400");
        assert_eq!(PcrSelection::parse(&s.to_bytes()).unwrap(), s);
        assert_eq!(s.indices(), vec![0, 1, 2, 3, 4, 5, 6, 7, 10]);
        let high = PcrSelection::from_indices(&[31]).unwrap();
        assert_eq!(hex::encode(high.to_bytes()), "00000001000b0400000080");
        assert_eq!(PcrSelection::parse(&high.to_bytes()).unwrap(), high);
        assert!(PcrSelection::from_indices(&[32]).is_err());
    }

    #[test]
    fn tpm_pcr_selection_rejects_with_offsets() {
        let cases: &[(&str, &str)] = &[
            (
                "00000002000b03ff0400",
                "TPML_PCR_SELECTION: pcrSelections.count 0x2 at byte 0, want 0x1",
            ),
            (
                "000000010004030000ff",
                "TPML_PCR_SELECTION: pcrSelections[0].hash 0x4 at byte 4, want 0xb",
            ),
            (
                "00000001000b05ff04000000",
                "TPML_PCR_SELECTION: pcrSelections[0].sizeofSelect at byte 6: 5, want 1 to 4",
            ),
            (
                "00000001000b03ff04",
                "TPML_PCR_SELECTION: pcrSelections[0].pcrSelect needs 3 bytes at byte 7, only 2 left",
            ),
            (
                "00000001000b03ff040000",
                "TPML_PCR_SELECTION: 1 trailing bytes at byte 10, want the structure to end there",
            ),
        ];
        for (bytes, want) in cases {
            let e = PcrSelection::parse(&hex::decode(bytes).unwrap()).unwrap_err();
            assert_eq!(e.to_string(), *want);
        }
    }

    #[test]
    fn tpm_pcr_digest_is_sha256_of_selected_values_in_order() {
        let mut v = PcrValues::new();
        for i in 0..24u8 {
            v.insert(i, [i; 32]);
        }
        let s = PcrSelection::from_indices(&[10, 0, 7]).unwrap();
        let mut cat = Vec::new();
        for i in [0u8, 7, 10] {
            cat.extend([i; 32]);
        }
        assert_eq!(
            v.digest(&s).unwrap(),
            <[u8; 32]>::from(Sha256::digest(&cat))
        );
        let s = PcrSelection::from_indices(&[1, 30]).unwrap();
        assert_eq!(v.digest(&s), Err(MissingPcr(30)));
    }
}
