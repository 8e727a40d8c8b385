//! `[policy.boot]`'s sets (issue 41): a boot judged from its event log, component by
//! component, so that updating a kernel is adding its digest to a set.
//!
//! ```toml
//! [policy.boot]
//! kernels = ["<sha256>"]          # PCR 4's last application (the kernel's PE image)
//! loaders = ["<sha256>"]          # the applications before it (shim, GRUB); [] = none allowed
//! initrds = ["<sha256>"]          # the EFI stub's measured initrd
//! boot_files = ["<sha256>"]       # other files a boot loader read into PCR 9 (grub.cfg, ...)
//! cmdline_required = ["lsm=lockdown,yama,bpf", "ima_policy=tcb"]
//! cmdline_forbidden = ["init", "bpf_jit_harden=0"]  # a bare key forbids every value
//! secure_boot = true              # the measured SecureBoot variable is 1
//! secure_boot_variables = { db = ["<sha256 of db>"], dbx = ["<sha256>"] }
//! ```
//!
//! Each key left out is not judged. Digests are the SHA-256 bank's, as `rackwarden
//! boot-reference` prints them from a host's own log.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use toml::Spanned;

use rackwarden_attest::tpm::boot::SECURE_BOOT_DATABASES;

use super::{ConfigError, Source, tpm::sha256_hex};

/// The part of `[policy.boot]` judged from the event log.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct BootLogPolicy {
    pub kernels: Option<BTreeSet<String>>,
    pub loaders: Option<BTreeSet<String>>,
    pub initrds: Option<BTreeSet<String>>,
    /// Files a boot loader reads besides kernels and initrds (GRUB: grub.cfg, modules).
    pub boot_files: Option<BTreeSet<String>>,
    pub cmdline_required: Vec<String>,
    pub cmdline_forbidden: Vec<String>,
    pub secure_boot: bool,
    /// `PK`, `KEK`, `db`, `dbx`: the accepted SHA-256 of each variable's data.
    pub secure_boot_variables: BTreeMap<String, BTreeSet<String>>,
}

/// `[policy.boot]` as written: the reference PCR values (`config/tpm.rs` reads them) and the
/// sets. (One struct: `toml`'s spans do not survive `#[serde(flatten)]`.)
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBoot {
    #[serde(default)]
    pub(super) pcrs: BTreeMap<String, Spanned<String>>,
    kernels: Option<Vec<Spanned<String>>>,
    loaders: Option<Vec<Spanned<String>>>,
    initrds: Option<Vec<Spanned<String>>>,
    boot_files: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    cmdline_required: Vec<Spanned<String>>,
    #[serde(default)]
    cmdline_forbidden: Vec<Spanned<String>>,
    secure_boot: Option<bool>,
    #[serde(default)]
    secure_boot_variables: BTreeMap<String, Vec<Spanned<String>>>,
}

pub(super) fn boot_log(
    src: &Source,
    raw: Option<&RawBoot>,
) -> Result<Option<BootLogPolicy>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    let digests = |key: &str, v: &[Spanned<String>]| -> Result<BTreeSet<String>, ConfigError> {
        v.iter()
            .map(|d| sha256_hex(src, &format!("policy.boot.{key}"), d))
            .collect()
    };
    let set = |key: &str, v: &Option<Vec<Spanned<String>>>| {
        v.as_deref().map(|v| digests(key, v)).transpose()
    };
    let words = |key: &str, v: &[Spanned<String>]| -> Result<Vec<String>, ConfigError> {
        v.iter()
            .map(|w| {
                let s = w.get_ref();
                if s.is_empty() || s.contains(char::is_whitespace) {
                    Err(src.err(
                        Some(w.span()),
                        format!("`policy.boot.{key}`: `{s}` is not one command-line word"),
                    ))
                } else {
                    Ok(s.clone())
                }
            })
            .collect()
    };
    let mut secure_boot_variables = BTreeMap::new();
    for (name, list) in &raw.secure_boot_variables {
        if !SECURE_BOOT_DATABASES.contains(&name.as_str()) {
            let span = list.first().map(|d| d.span());
            return Err(src.err(
                span,
                format!(
                    "`policy.boot.secure_boot_variables`: `{name}` is not one of {}",
                    SECURE_BOOT_DATABASES.join(", ")
                ),
            ));
        }
        let accepted = digests(&format!("secure_boot_variables.{name}"), list)?;
        secure_boot_variables.insert(name.clone(), accepted);
    }
    let policy = BootLogPolicy {
        kernels: set("kernels", &raw.kernels)?,
        loaders: set("loaders", &raw.loaders)?,
        initrds: set("initrds", &raw.initrds)?,
        boot_files: set("boot_files", &raw.boot_files)?,
        cmdline_required: words("cmdline_required", &raw.cmdline_required)?,
        cmdline_forbidden: words("cmdline_forbidden", &raw.cmdline_forbidden)?,
        secure_boot: raw.secure_boot.unwrap_or(false),
        secure_boot_variables,
    };
    Ok((policy != BootLogPolicy::default()).then_some(policy))
}

/// What a forbidden word matches: `key` forbids `key` and every `key=...`; `key=value` forbids
/// that word alone.
pub fn forbids(forbidden: &str, word: &str) -> bool {
    if forbidden.contains('=') {
        word == forbidden
    } else {
        word == forbidden || word.split_once('=').is_some_and(|(k, _)| k == forbidden)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::VerifierConfig;
    use std::path::Path;

    const BASE: &str = "listen = \"127.0.0.1:7700\"\ninsecure_http = true\ndatabase = \"/tmp/v.sqlite\"\n\n[policy]\nid = \"p\"\nnonce_ttl = \"10 min\"\nmax_wipe_interval = \"15 min\"\nmax_residue_host = \"4 GiB\"\nmax_residue_gpu = \"1 GiB\"\ntrainable_state = \"10 TB\"\nmax_epoch_fraction = 0.01\nmin_root_of_trust = \"none\"\n[policy.boot]\n";

    fn parse(boot: &str) -> Result<Option<BootLogPolicy>, String> {
        VerifierConfig::parse(Path::new("v.toml"), &format!("{BASE}{boot}"))
            .map(|c| c.policy.boot_log)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_sets_are_read_and_bad_values_name_file_line_and_key() {
        let d = "ab".repeat(32);
        let p = parse(&format!(
            "kernels = [\"{d}\"]\ncmdline_forbidden = [\"init\"]\nsecure_boot = true\nsecure_boot_variables = {{ db = [\"{d}\"] }}\n"
        ))
        .unwrap()
        .unwrap();
        assert!(p.kernels.as_ref().is_some_and(|k| k.contains(&d)));
        assert_eq!(p.loaders, None);
        assert!(p.secure_boot && p.secure_boot_variables["db"].contains(&d));
        // Only `pcrs`, or nothing: not judged from the log.
        assert_eq!(parse("").unwrap(), None);
        for (boot, want) in [
            (
                "kernels = [\"abc\"]\n",
                "v.toml:15: `policy.boot.kernels`: `abc` is not a SHA-256",
            ),
            (
                "cmdline_required = [\"lsm=bpf quiet\"]\n",
                "v.toml:15: `policy.boot.cmdline_required`: `lsm=bpf quiet` is not one command-line word",
            ),
            (
                &format!("secure_boot_variables = {{ MOK = [\"{d}\"] }}\n"),
                "v.toml:15: `policy.boot.secure_boot_variables`: `MOK` is not one of PK, KEK, db, dbx",
            ),
            (
                &format!(
                    "secure_boot_variables = {{ dbx = [\"{}\"] }}\n",
                    "AB".repeat(32)
                ),
                "`policy.boot.secure_boot_variables.dbx`",
            ),
            ("kernel = []\n", "unknown field `kernel`"),
        ] {
            let e = parse(boot).unwrap_err();
            assert!(e.contains(want), "{boot}: {e}");
        }
    }

    #[test]
    fn a_bare_key_forbids_every_value() {
        assert!(forbids("init", "init=/bin/sh"));
        assert!(forbids("init", "init"));
        assert!(!forbids("init", "initrd=/x"));
        assert!(forbids("bpf_jit_harden=0", "bpf_jit_harden=0"));
        assert!(!forbids("bpf_jit_harden=0", "bpf_jit_harden=2"));
    }
}
