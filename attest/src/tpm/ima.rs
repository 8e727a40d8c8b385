//! The IMA measurement list in its binary form (`/sys/kernel/security/ima/
//! binary_runtime_measurements`, kernel `ima_measurements_show`) and its replay into PCR 10's
//! SHA-256 bank, which a quote then vouches for.
//!
//! Integers in the list are host-endian; we read little-endian (x86, and what the kernel
//! writes with `ima_canonical_fmt`). Since Linux 5.8 each bank is extended with that bank's
//! hash of the template data, so the SHA-256 bank gets SHA-256(template_data) while the list's
//! digest field keeps SHA-1(template_data); a violation shows an all-zero digest but extends
//! all-0xff.

use sha1::Sha1;
use sha2::{Digest, Sha256};
use thiserror::Error;

use super::error::TpmError;
use super::marshal::Reader;

/// The PCR IMA extends by default (CONFIG_IMA_MEASURE_PCR_IDX).
pub const IMA_PCR: u32 = 10;
/// IMA_TEMPLATE_NAME_LEN_MAX.
const TEMPLATE_NAME_MAX: u32 = 255;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ImaError {
    #[error("IMA entry {index}: {source}")]
    Entry { index: usize, source: TpmError },
    #[error(
        "IMA entry {index} at byte {offset}: template digest {got} is not SHA-1 of its template data ({want})"
    )]
    DigestMismatch {
        index: usize,
        offset: usize,
        got: String,
        want: String,
    },
    #[error(
        "IMA entry {index} at byte {offset}: template \"ima\" (fixed-size SHA-1 fields) is not supported; boot with ima_template=ima-ng"
    )]
    UnsupportedTemplate { index: usize, offset: usize },
}

/// One measurement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImaEntry {
    pub pcr: u32,
    /// SHA-1 of `template_data`; all zero for a violation.
    pub template_digest_sha1: [u8; 20],
    /// "ima-ng", "ima-sig", …
    pub template_name: String,
    /// The template's fields, each `u32 len || bytes`, exactly as hashed into the PCR.
    pub template_data: Vec<u8>,
    /// The d-ng field, as (algorithm, digest), for templates that start with d-ng and n-ng.
    pub file_digest: Option<(String, Vec<u8>)>,
    /// The n-ng field without its NUL (lossy UTF-8: paths are bytes; the digest covers the
    /// bytes, not this string).
    pub path: Option<String>,
}

/// `u32le len || bytes`, one template field.
fn push_field(out: &mut Vec<u8>, field: &[u8]) {
    // Fields we build are a digest or a path; a path over 4 GiB cannot be measured anyway.
    out.extend((field.len() as u32).to_le_bytes());
    out.extend(field);
}

/// ima-ng template data for a path and its SHA-256 (or, for a violation, zero) digest.
fn ima_ng_data(path: &str, file_sha256: &[u8; 32]) -> Vec<u8> {
    let mut d_ng = b"sha256:\0".to_vec();
    d_ng.extend(file_sha256);
    let mut n_ng = path.as_bytes().to_vec();
    n_ng.push(0);
    let mut data = Vec::with_capacity(d_ng.len() + n_ng.len() + 8);
    push_field(&mut data, &d_ng);
    push_field(&mut data, &n_ng);
    data
}

impl ImaEntry {
    /// An ima-ng entry for `path` with file digest SHA-256 `file_sha256`, into PCR 10, as the
    /// kernel writes it. For synthetic lists (tests; the daemon's synthetic-IMA test).
    pub fn ima_ng(path: &str, file_sha256: [u8; 32]) -> ImaEntry {
        let template_data = ima_ng_data(path, &file_sha256);
        ImaEntry {
            pcr: IMA_PCR,
            template_digest_sha1: Sha1::digest(&template_data).into(),
            template_name: "ima-ng".to_string(),
            template_data,
            file_digest: Some(("sha256".to_string(), file_sha256.to_vec())),
            path: Some(path.to_string()),
        }
    }

    /// An ima-ng violation entry (a file opened for write while measured, or the reverse):
    /// zero digests in the list, all-0xff into the PCR.
    pub fn violation(path: &str) -> ImaEntry {
        ImaEntry {
            template_digest_sha1: [0; 20],
            ..ImaEntry::ima_ng(path, [0; 32])
        }
    }

    pub fn is_violation(&self) -> bool {
        self.template_digest_sha1 == [0; 20]
    }

    /// What the kernel extends into the SHA-256 bank for this entry.
    pub fn sha256_bank_extend_value(&self) -> [u8; 32] {
        if self.is_violation() {
            [0xff; 32]
        } else {
            Sha256::digest(&self.template_data).into()
        }
    }
}

/// Parses a whole binary measurement list. Each entry's SHA-1 digest must match its template
/// data (violations excepted), so a list edited after the fact fails here rather than only in
/// the replay.
pub fn parse_ima_binary(list: &[u8]) -> Result<Vec<ImaEntry>, ImaError> {
    let mut r = Reader::new("binary_runtime_measurements", list);
    let mut entries = Vec::new();
    while r.remaining() > 0 {
        let index = entries.len();
        entries.push(read_entry(&mut r, index)?);
    }
    Ok(entries)
}

fn read_entry(r: &mut Reader<'_>, index: usize) -> Result<ImaEntry, ImaError> {
    let at = |source| ImaError::Entry { index, source };
    let start = r.offset();
    let pcr = r.u32_le("pcr").map_err(at)?;
    let mut template_digest_sha1 = [0u8; 20];
    template_digest_sha1.copy_from_slice(r.take("template digest", 20).map_err(at)?);
    let name_offset = r.offset();
    let name_len = r.u32_le("template name length").map_err(at)?;
    if name_len > TEMPLATE_NAME_MAX {
        let why = format!("{name_len}, want at most {TEMPLATE_NAME_MAX}");
        return Err(at(r.invalid("template name length", name_offset, why)));
    }
    let name_offset = r.offset();
    let name = r.take("template name", name_len as usize).map_err(at)?;
    let template_name = String::from_utf8(name.to_vec())
        .map_err(|_| at(r.invalid("template name", name_offset, "not UTF-8".into())))?;
    if template_name == "ima" {
        return Err(ImaError::UnsupportedTemplate {
            index,
            offset: start,
        });
    }
    let len = r.u32_le("template data length").map_err(at)?;
    let data_offset = r.offset();
    let template_data = r.take("template data", len as usize).map_err(at)?.to_vec();
    let is_violation = template_digest_sha1 == [0; 20];
    let sha1: [u8; 20] = Sha1::digest(&template_data).into();
    if !is_violation && sha1 != template_digest_sha1 {
        return Err(ImaError::DigestMismatch {
            index,
            offset: start,
            got: hex::encode(template_digest_sha1),
            want: hex::encode(sha1),
        });
    }
    let (file_digest, path) =
        interpret_fields(&template_name, &template_data, data_offset).map_err(at)?;
    Ok(ImaEntry {
        pcr,
        template_digest_sha1,
        template_name,
        template_data,
        file_digest,
        path,
    })
}

type Interpreted = (Option<(String, Vec<u8>)>, Option<String>);

/// Splits template data into fields and reads d-ng and n-ng for the templates that start with
/// them. Other templates are kept as opaque data: they still replay.
fn interpret_fields(name: &str, data: &[u8], base: usize) -> Result<Interpreted, TpmError> {
    let mut r = Reader::with_base("IMA template data", data, base);
    let mut fields = Vec::new();
    while r.remaining() > 0 {
        let len = r.u32_le("field length")?;
        let offset = r.offset();
        fields.push((offset, r.take("field", len as usize)?));
    }
    let want_fields = match name {
        "ima-ng" => Some(2),
        "ima-sig" => Some(3),
        "ima-buf" | "ima-modsig" => None,
        _ => return Ok((None, None)),
    };
    if let Some(want) = want_fields
        && fields.len() != want
    {
        let why = format!("{} fields, want {want} for {name}", fields.len());
        return Err(r.invalid("fields", base, why));
    }
    let (Some((d_off, d_ng)), Some((n_off, n_ng))) = (fields.first(), fields.get(1)) else {
        let why = format!("{} fields, want d-ng and n-ng first", fields.len());
        return Err(r.invalid("fields", base, why));
    };
    let file_digest = parse_d_ng(&r, d_ng, *d_off)?;
    let path = match n_ng.split_last() {
        Some((0, path)) => String::from_utf8_lossy(path).into_owned(),
        _ => return Err(r.invalid("n-ng", *n_off, "no terminating NUL".into())),
    };
    Ok((Some(file_digest), Some(path)))
}

/// d-ng = `algo ':' '\0' digest` (ima_eventdigest_init_common, DATA_FMT_DIGEST_WITH_ALGO).
fn parse_d_ng(r: &Reader<'_>, d_ng: &[u8], offset: usize) -> Result<(String, Vec<u8>), TpmError> {
    let sep = d_ng
        .windows(2)
        .position(|w| w == b":\0")
        .ok_or_else(|| r.invalid("d-ng", offset, "no \"<algo>:\\0\" prefix".into()))?;
    let alg = String::from_utf8(d_ng[..sep].to_vec())
        .map_err(|_| r.invalid("d-ng", offset, "algorithm name not UTF-8".into()))?;
    let digest = d_ng[sep + 2..].to_vec();
    let want = match alg.as_str() {
        "md5" => Some(16),
        "sha1" => Some(20),
        "sha256" | "sm3" => Some(32),
        "sha384" => Some(48),
        "sha512" => Some(64),
        _ => None,
    };
    if let Some(want) = want
        && digest.len() != want
    {
        let why = format!("{alg} digest of {} bytes, want {want}", digest.len());
        return Err(r.invalid("d-ng", offset, why));
    }
    Ok((alg, digest))
}

/// The binary list for `entries` (little-endian), as the kernel would show it.
pub fn encode_ima_binary(entries: &[ImaEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        out.extend(e.pcr.to_le_bytes());
        out.extend(e.template_digest_sha1);
        push_field(&mut out, e.template_name.as_bytes());
        push_field(&mut out, &e.template_data);
    }
    out
}

/// PCR 10's SHA-256 bank after extending `start` with every entry for PCR 10:
/// `pcr = SHA-256(pcr || extend value)`. Entries a policy sent to other PCRs are skipped.
pub fn replay_pcr10(start: [u8; 32], entries: &[ImaEntry]) -> [u8; 32] {
    entries
        .iter()
        .filter(|e| e.pcr == IMA_PCR)
        .fold(start, |pcr, e| {
            let mut h = Sha256::new();
            h.update(pcr);
            h.update(e.sha256_bank_extend_value());
            h.finalize().into()
        })
}

/// The longest prefix of `entries` whose replay from `start` gives `quoted_pcr10`, as a
/// count of entries: the list may have grown between the quote and reading it, and entries
/// after the prefix wait for the next quote. None if no prefix matches.
pub fn replay_prefix(
    start: [u8; 32],
    entries: &[ImaEntry],
    quoted_pcr10: &[u8; 32],
) -> Option<usize> {
    let mut pcr = start;
    let mut found = (pcr == *quoted_pcr10).then_some(0);
    for (i, e) in entries.iter().enumerate() {
        pcr = replay_pcr10(pcr, std::slice::from_ref(e));
        if pcr == *quoted_pcr10 {
            found = Some(i + 1);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list() -> Vec<ImaEntry> {
        vec![
            ImaEntry::ima_ng("boot_aggregate", [0x11; 32]),
            ImaEntry::ima_ng("/usr/bin/rackwarden-daemon", [0x22; 32]),
            ImaEntry::violation("/etc/passwd"),
            ImaEntry::ima_ng("/usr/lib/libcuda.so.1", [0x33; 32]),
        ]
    }

    #[test]
    fn tpm_ima_encode_parse_replay_round_trip() {
        let entries = list();
        let bytes = encode_ima_binary(&entries);
        let parsed = parse_ima_binary(&bytes).unwrap();
        assert_eq!(parsed, entries);
        assert_eq!(
            parsed[1].path.as_deref(),
            Some("/usr/bin/rackwarden-daemon")
        );
        assert_eq!(
            parsed[1].file_digest,
            Some(("sha256".to_string(), vec![0x22; 32]))
        );
        assert!(parsed[2].is_violation());
        assert_eq!(parsed[2].sha256_bank_extend_value(), [0xff; 32]);
        // Hand replay: PCR 10 starts at zero; each step is SHA-256(pcr || SHA-256(data)).
        let mut pcr = [0u8; 32];
        for e in &entries {
            let v: [u8; 32] = if e.is_violation() {
                [0xff; 32]
            } else {
                Sha256::digest(&e.template_data).into()
            };
            pcr = Sha256::digest([pcr, v].concat()).into();
        }
        assert_eq!(replay_pcr10([0; 32], &parsed), pcr);
        assert_eq!(replay_prefix([0; 32], &parsed, &pcr), Some(4));
        let two = replay_pcr10([0; 32], &parsed[..2]);
        assert_eq!(replay_prefix([0; 32], &parsed, &two), Some(2));
        assert_eq!(replay_prefix([0; 32], &parsed, &[0; 32]), Some(0));
        assert_eq!(replay_prefix([0; 32], &parsed, &[7; 32]), None);
        // Entries for other PCRs do not extend PCR 10.
        let mut other = entries.clone();
        other[1].pcr = 11;
        let without = [&entries[..1], &entries[2..]].concat();
        assert_eq!(
            replay_pcr10([0; 32], &other),
            replay_pcr10([0; 32], &without)
        );
    }

    #[test]
    fn tpm_ima_ng_layout_matches_the_kernel() {
        let e = ImaEntry::ima_ng("/a", [0xaa; 32]);
        // d-ng: u32 40, "sha256:\0", 32 bytes; n-ng: u32 3, "/a\0".
        let mut want = 40u32.to_le_bytes().to_vec();
        want.extend(b"sha256:\0");
        want.extend([0xaa; 32]);
        want.extend(3u32.to_le_bytes());
        want.extend(b"/a\0");
        assert_eq!(e.template_data, want);
        let bytes = encode_ima_binary(&[e]);
        assert_eq!(&bytes[..4], &[10, 0, 0, 0]);
        assert_eq!(&bytes[24..34], b"\x06\0\0\0ima-ng");
        assert_eq!(bytes[34..38], (want.len() as u32).to_le_bytes());
        assert_eq!(bytes.len(), 38 + want.len());
    }

    #[test]
    fn tpm_ima_errors_name_entry_and_offset() {
        let entries = list();
        let bytes = encode_ima_binary(&entries);
        let first_len = encode_ima_binary(&entries[..1]).len();
        // Truncated in the second entry's template data.
        let cut = first_len + 50;
        let e = parse_ima_binary(&bytes[..cut]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "IMA entry 1: binary_runtime_measurements: template data needs {} bytes at byte {}, only {} left",
                entries[1].template_data.len(),
                first_len + 38,
                50 - 38
            )
        );
        // A changed path: the SHA-1 no longer matches.
        let mut edited = bytes.clone();
        let at = edited.windows(6).position(|w| w == b"/usr/b").unwrap();
        edited[at + 1] = b'v';
        let e = parse_ima_binary(&edited).unwrap_err();
        assert!(
            matches!(e, ImaError::DigestMismatch { index: 1, offset, .. } if offset == first_len),
            "{e}"
        );
        // Template "ima" is refused by name.
        let mut old = bytes.clone();
        old[24..34].copy_from_slice(b"\x03\0\0\0ima\0\0\0");
        let e = parse_ima_binary(&old[..34]).unwrap_err();
        assert_eq!(
            e,
            ImaError::UnsupportedTemplate {
                index: 0,
                offset: 0
            }
        );
        // An absurd template name length.
        let mut long = bytes.clone();
        long[24..28].copy_from_slice(&1000u32.to_le_bytes());
        let e = parse_ima_binary(&long).unwrap_err().to_string();
        assert_eq!(
            e,
            "IMA entry 0: binary_runtime_measurements: template name length at byte 24: 1000, want at most 255"
        );
    }

    #[test]
    fn tpm_ima_field_errors_point_into_template_data() {
        // An ima-ng entry with one field only (consistent SHA-1, so the field check fails).
        let mut data = Vec::new();
        push_field(&mut data, b"sha256:\0");
        let e = ImaEntry {
            template_digest_sha1: Sha1::digest(&data).into(),
            template_data: data,
            ..ImaEntry::ima_ng("/x", [0; 32])
        };
        let err = parse_ima_binary(&encode_ima_binary(&[e]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "IMA entry 0: IMA template data: fields at byte 38: 1 fields, want 2 for ima-ng"
        );
        // A d-ng digest of the wrong size for its algorithm.
        let mut data = Vec::new();
        push_field(&mut data, b"sha256:\0\x01\x02");
        push_field(&mut data, b"/x\0");
        let e = ImaEntry {
            template_digest_sha1: Sha1::digest(&data).into(),
            template_data: data,
            ..ImaEntry::ima_ng("/x", [0; 32])
        };
        let err = parse_ima_binary(&encode_ima_binary(&[e]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "IMA entry 0: IMA template data: d-ng at byte 42: sha256 digest of 2 bytes, want 32"
        );
        // ima-sig (Debian's default template): d-ng, n-ng and a signature field, here empty.
        let mut data = ImaEntry::ima_ng("/bin/sh", [6; 32]).template_data;
        push_field(&mut data, b"");
        let e = ImaEntry {
            template_name: "ima-sig".into(),
            template_digest_sha1: Sha1::digest(&data).into(),
            template_data: data,
            ..ImaEntry::ima_ng("/bin/sh", [6; 32])
        };
        let parsed = parse_ima_binary(&encode_ima_binary(std::slice::from_ref(&e))).unwrap();
        assert_eq!(parsed, vec![e]);
        // Unknown templates are kept opaque and still replay.
        let e = ImaEntry {
            template_name: "my-template".into(),
            file_digest: None,
            path: None,
            ..ImaEntry::ima_ng("/x", [5; 32])
        };
        let parsed = parse_ima_binary(&encode_ima_binary(std::slice::from_ref(&e))).unwrap();
        assert_eq!(parsed, vec![e]);
    }
}
