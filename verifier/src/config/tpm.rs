//! The TPM parts of `verifier.toml` (issue 22): whom the verifier trusts to certify EKs
//! (`[tpm]`), and what it requires of a host's root of trust, its measured executables and
//! its boot (`[policy] min_root_of_trust`, `[policy.runtime]`, `[policy.boot]`).
//!
//! ```toml
//! [tpm]
//! ek_roots = "/etc/rackwarden-verifier/ek-roots.pem"   # manufacturer root CAs (PEM)
//! # ek_intermediates = "/etc/rackwarden-verifier/ek-intermediates.pem"
//! # challenge_ttl = "1 min"      # how long a credential challenge may wait for its answer
//!
//! [policy]
//! min_root_of_trust = "tpm_ima"  # required: none | tpm | tpm_ima
//!
//! [policy.runtime]               # appraises the IMA entries (needed for tpm_ima)
//! daemon_digests = ["<sha256 of rackwardend>"]  # `cargo xtask install` prints it
//! # daemon_name = "rackwardend"  # the file name of the daemon's measured path (default)
//! allowlist = "/etc/rackwarden-verifier/ima-allowlist.txt"  # `sha256sum` lines
//! exclude = ["/etc/", "/var/", "/tmp/"]  # path prefixes whose entries are not judged
//!
//! [policy.boot]                  # reference PCR values where the boot path measures them
//! pcrs = { 0 = "<64 hex>", 4 = "<64 hex>" }
//! # ...or, better, sets judged from the boot's event log (see `config/boot.rs`)
//! kernels = ["<sha256>"]
//! ```

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::Duration,
};

use rackwarden_attest::tpm::TrustLevel;
use serde::Deserialize;
use toml::Spanned;

use super::{ConfigError, Source};

/// `[tpm]`: what AK enrolment trusts.
#[derive(Debug, Clone)]
pub struct TpmEnrolConfig {
    pub ek_roots: PathBuf,
    /// The PEM text of `ek_roots`, read at start (a missing file stops the verifier).
    pub ek_roots_pem: Vec<u8>,
    /// The PEM text of `ek_intermediates` (empty when not configured).
    pub ek_intermediates_pem: Vec<u8>,
    pub challenge_ttl: Duration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTpm {
    ek_roots: Spanned<String>,
    ek_intermediates: Option<Spanned<String>>,
    challenge_ttl: Option<Spanned<String>>,
}

/// `[policy.runtime]`: which measured executables a host may run. Digests are lowercase hex
/// SHA-256 (IMA's ima-ng file digest with `ima_hash=sha256`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RuntimePolicy {
    /// The builds of `rackwardend` the policy accepts as the daemon that runs.
    pub daemon_digests: BTreeSet<String>,
    /// The file name (last path component) of the daemon's measured path.
    pub daemon_name: String,
    /// Every other file a host may measure (the allowlist file's digests).
    pub allowed: BTreeSet<String>,
    /// Path prefixes whose entries are replayed but not judged.
    pub exclude: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRuntime {
    daemon_digests: Spanned<Vec<Spanned<String>>>,
    daemon_name: Option<Spanned<String>>,
    allowlist: Option<Spanned<String>>,
    #[serde(default)]
    exclude: Vec<Spanned<String>>,
}

pub(super) fn tpm_enrol(
    src: &Source,
    raw: &Option<RawTpm>,
) -> Result<Option<TpmEnrolConfig>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    let read = |key: &str, s: &Spanned<String>| {
        std::fs::read(s.get_ref()).map_err(|e| {
            src.err(
                Some(s.span()),
                format!("`tpm.{key}`: cannot read {}: {e}", s.get_ref()),
            )
        })
    };
    Ok(Some(TpmEnrolConfig {
        ek_roots: PathBuf::from(raw.ek_roots.get_ref()),
        ek_roots_pem: read("ek_roots", &raw.ek_roots)?,
        ek_intermediates_pem: match &raw.ek_intermediates {
            Some(s) => read("ek_intermediates", s)?,
            None => Vec::new(),
        },
        challenge_ttl: match &raw.challenge_ttl {
            Some(s) => src.dur("tpm.challenge_ttl", s)?,
            None => Duration::from_secs(60),
        },
    }))
}

pub(super) fn min_root_of_trust(
    src: &Source,
    v: &Option<Spanned<String>>,
) -> Result<TrustLevel, ConfigError> {
    // No default: the level a fleet can reach depends on its hardware, and a silent `none`
    // would trust the daemon's word without anyone having decided so.
    let Some(v) = v else {
        let table = src
            .text
            .find("[policy]")
            .map(|at| at..at + "[policy]".len());
        return Err(src.err(
            table,
            "`[policy]` does not name `min_root_of_trust`; choose one: \
             \"tpm_ima\" (every statement quoted by a TPM whose enrolled AK is beside a \
             certified EK, and IMA shows the reference rackwardend ran: needs \
             `[policy.runtime]` and `[tpm] ek_roots`), \"tpm\" (quoted by the TPM, no IMA on \
             the hosts: needs `[tpm] ek_roots`), or \"none\" (statements rest on the \
             daemon's word: for tests and demos, never for two parties who do not trust \
             each other)"
                .into(),
        ));
    };
    TrustLevel::parse(v.get_ref()).ok_or_else(|| {
        src.err(
            Some(v.span()),
            format!(
                "`policy.min_root_of_trust`: unknown level `{}` (none, tpm, tpm_ima)",
                v.get_ref()
            ),
        )
    })
}

pub(super) fn sha256_hex(
    src: &Source,
    key: &str,
    s: &Spanned<String>,
) -> Result<String, ConfigError> {
    let v = s.get_ref();
    if v.len() == 64
        && v.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(v.clone())
    } else {
        Err(src.err(
            Some(s.span()),
            format!("`{key}`: `{v}` is not a SHA-256 in 64 lowercase hex digits"),
        ))
    }
}

pub(super) fn runtime(
    src: &Source,
    raw: &Option<RawRuntime>,
    min: TrustLevel,
    min_span: Option<std::ops::Range<usize>>,
) -> Result<Option<RuntimePolicy>, ConfigError> {
    let Some(raw) = raw else {
        if min == TrustLevel::TpmIma {
            return Err(src.err(
                min_span,
                "`policy.min_root_of_trust = \"tpm_ima\"` needs a `[policy.runtime]` table (the daemon's digests and the allowlist the IMA entries are judged by)".into(),
            ));
        }
        return Ok(None);
    };
    let mut daemon_digests = BTreeSet::new();
    for d in raw.daemon_digests.get_ref() {
        daemon_digests.insert(sha256_hex(src, "policy.runtime.daemon_digests", d)?);
    }
    if daemon_digests.is_empty() {
        return Err(src.err(
            Some(raw.daemon_digests.span()),
            "`policy.runtime.daemon_digests` is empty: name the daemon builds you accept".into(),
        ));
    }
    let allowed = match &raw.allowlist {
        None => BTreeSet::new(),
        Some(path) => {
            let text = std::fs::read_to_string(path.get_ref()).map_err(|e| {
                src.err(
                    Some(path.span()),
                    format!(
                        "`policy.runtime.allowlist`: cannot read {}: {e}",
                        path.get_ref()
                    ),
                )
            })?;
            parse_allowlist(Path::new(path.get_ref()), &text)?
        }
    };
    Ok(Some(RuntimePolicy {
        daemon_digests,
        daemon_name: raw
            .daemon_name
            .as_ref()
            .map(|n| n.get_ref().clone())
            .unwrap_or_else(|| "rackwardend".into()),
        allowed,
        exclude: raw.exclude.iter().map(|e| e.get_ref().clone()).collect(),
    }))
}

/// An allowlist in `sha256sum` output format: `<64 hex>  <path>` per line (`*` before the
/// path, blank lines and `#` comments allowed). Only the digests count: a file is allowed
/// wherever it lives, so a copy moved elsewhere is still the same program.
pub fn parse_allowlist(path: &Path, text: &str) -> Result<BTreeSet<String>, ConfigError> {
    let mut out = BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let digest = line.split_whitespace().next().unwrap_or_default();
        if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ConfigError::Invalid {
                path: path.into(),
                line: i + 1,
                message: format!(
                    "allowlist: `{digest}` is not a SHA-256 in 64 hex digits (lines read `<sha256>  <path>`, as sha256sum writes them)"
                ),
            });
        }
        out.insert(digest.to_ascii_lowercase());
    }
    Ok(out)
}

pub(super) fn boot(
    src: &Source,
    raw: &Option<super::boot::RawBoot>,
) -> Result<BTreeMap<u8, String>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(BTreeMap::new());
    };
    let mut out = BTreeMap::new();
    for (k, v) in &raw.pcrs {
        let pcr = k.parse::<u8>().ok().filter(|p| *p < 24).ok_or_else(|| {
            src.err(
                Some(v.span()),
                format!("`policy.boot.pcrs`: `{k}` is not a PCR index (0-23)"),
            )
        })?;
        out.insert(pcr, sha256_hex(src, &format!("policy.boot.pcrs.{k}"), v)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowlist_reads_sha256sum_lines_and_names_a_bad_line() {
        let ok = format!(
            "# tools\n{}  /usr/bin/true\n\n{} */usr/bin/false\n",
            "a".repeat(64),
            "B".repeat(64)
        );
        let set = parse_allowlist(Path::new("al.txt"), &ok).unwrap();
        assert_eq!(set.len(), 2);
        assert!(set.contains(&"b".repeat(64)));
        let e = parse_allowlist(Path::new("al.txt"), "aa  /x\n").unwrap_err();
        let ConfigError::Invalid { line, message, .. } = e else {
            panic!()
        };
        assert_eq!(line, 1);
        assert!(message.contains("`aa`"), "{message}");
    }
}

#[cfg(test)]
mod parse_tests {
    use super::super::VerifierConfig;
    use super::*;

    const BASE: &str = "listen = \"127.0.0.1:7700\"\ninsecure_http = true\ndatabase = \"/tmp/v.sqlite\"\n\n[policy]\nid = \"p\"\nnonce_ttl = \"10 min\"\nmax_wipe_interval = \"15 min\"\nmax_residue_host = \"4 GiB\"\nmax_residue_gpu = \"1 GiB\"\ntrainable_state = \"10 TB\"\nmax_epoch_fraction = 0.01\n";

    #[test]
    fn tpm_policy_parses_and_leaves_old_digests_alone() {
        // No default: a policy that does not choose is refused, with the choices.
        let e = VerifierConfig::parse(Path::new("v.toml"), BASE)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("v.toml:5:")
                && e.contains("does not name `min_root_of_trust`")
                && ["\"tpm_ima\"", "\"tpm\"", "\"none\""]
                    .iter()
                    .all(|c| e.contains(c)),
            "{e}"
        );
        let explicit_none = format!("{BASE}min_root_of_trust = \"none\"\n");
        let plain = VerifierConfig::parse(Path::new("v.toml"), &explicit_none).unwrap();
        assert_eq!(plain.policy.min_root_of_trust, TrustLevel::None);
        // `none` is not in the digest: verdicts stored before the key was required recheck.
        assert!(
            !String::from_utf8(serde_json::to_vec(&plain.policy).unwrap())
                .unwrap()
                .contains("min_root_of_trust"),
        );

        let d = "ab".repeat(32);
        let roots = std::env::temp_dir().join(format!("rw-ek-roots-{}.pem", std::process::id()));
        std::fs::write(
            &roots,
            "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let tpm_table = format!("[tpm]\nek_roots = \"{}\"\n", roots.display());
        let text = format!(
            "{BASE}min_root_of_trust = \"tpm_ima\"\n[policy.runtime]\ndaemon_digests = [\"{d}\"]\nexclude = [\"/etc/\"]\n[policy.boot]\npcrs = {{ 4 = \"{d}\" }}\n{tpm_table}"
        );
        let c = VerifierConfig::parse(Path::new("v.toml"), &text).unwrap();
        assert_eq!(c.policy.min_root_of_trust, TrustLevel::TpmIma);
        let rt = c.policy.runtime.clone().unwrap();
        assert!(rt.daemon_digests.contains(&d));
        assert_eq!(rt.daemon_name, "rackwardend");
        assert_eq!(c.policy.boot_pcrs.get(&4), Some(&d));
        assert_ne!(c.policy.digest(), plain.policy.digest());

        let e = VerifierConfig::parse(
            Path::new("v.toml"),
            &format!("{BASE}min_root_of_trust = \"tpm_ima\"\n"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("v.toml") && e.contains("[policy.runtime]"),
            "{e}"
        );
        // Quotes required but no EK roots to enrol an AK with: refused at start, with the fix.
        for level in ["tpm", "tpm_ima"] {
            let runtime = format!("[policy.runtime]\ndaemon_digests = [\"{d}\"]\n");
            let e = VerifierConfig::parse(
                Path::new("v.toml"),
                &format!("{BASE}min_root_of_trust = \"{level}\"\n{runtime}"),
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.starts_with("v.toml:13:") && e.contains("needs a `[tpm]` table with `ek_roots`"),
                "{e}"
            );
            let ok = format!("{BASE}min_root_of_trust = \"{level}\"\n{runtime}{tpm_table}");
            VerifierConfig::parse(Path::new("v.toml"), &ok).unwrap();
        }
        let _ = std::fs::remove_file(&roots);
        let e = VerifierConfig::parse(
            Path::new("v.toml"),
            &format!("{BASE}min_root_of_trust = \"hw\"\n"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("v.toml:13") && e.contains("unknown level `hw`"),
            "{e}"
        );
        let e = VerifierConfig::parse(
            Path::new("v.toml"),
            &format!("{BASE}min_root_of_trust = \"none\"\n\n[tpm]\nek_roots = \"/nonexistent/roots.pem\"\n"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("tpm.ek_roots") && e.contains("/nonexistent/roots.pem"),
            "{e}"
        );
    }
}
