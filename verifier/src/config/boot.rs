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

/// The variables PCR 7 measures that a policy may pin.
const SECURE_BOOT_VARIABLES: [&str; 4] = ["PK", "KEK", "db", "dbx"];

pub(super) fn boot_log(
    src: &Source,
    raw: Option<&RawBoot>,
) -> Result<Option<BootLogPolicy>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    let set = |key: &str, v: &Option<Vec<Spanned<String>>>| -> Result<_, ConfigError> {
        v.as_ref()
            .map(|v| {
                v.iter()
                    .map(|d| sha256_hex(src, &format!("policy.boot.{key}"), d))
                    .collect::<Result<BTreeSet<String>, _>>()
            })
            .transpose()
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
    for (name, digests) in &raw.secure_boot_variables {
        if !SECURE_BOOT_VARIABLES.contains(&name.as_str()) {
            let span = digests.first().map(|d| d.span());
            return Err(src.err(
                span,
                format!(
                    "`policy.boot.secure_boot_variables`: `{name}` is not one of {}",
                    SECURE_BOOT_VARIABLES.join(", ")
                ),
            ));
        }
        let key = format!("secure_boot_variables.{name}");
        secure_boot_variables.insert(
            name.clone(),
            set(&key, &Some(digests.clone()))?.unwrap_or_default(),
        );
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

    #[test]
    fn a_bare_key_forbids_every_value() {
        assert!(forbids("init", "init=/bin/sh"));
        assert!(forbids("init", "init"));
        assert!(!forbids("init", "initrd=/x"));
        assert!(forbids("bpf_jit_harden=0", "bpf_jit_harden=0"));
        assert!(!forbids("bpf_jit_harden=0", "bpf_jit_harden=2"));
    }
}
