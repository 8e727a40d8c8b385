//! `[tpm]`: whether and how every statement carries a TPM 2.0 quote (issue 22).
//!
//! ```toml
//! [tpm]
//! mode = "auto"                    # auto | required | off
//! tcti = "device:/dev/tpmrm0"      # or "swtpm:host=127.0.0.1,port=2321" (tests)
//! pcrs = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]   # sha256 bank; 9 the initrd and command line, 10 IMA
//! ima_list = "/sys/kernel/security/ima/binary_runtime_measurements"
//! event_log = "/sys/kernel/security/tpm0/binary_bios_measurements"  # shipped once per boot
//! ```
//!
//! `auto` quotes where the TPM can be used and otherwise says why not in every statement;
//! `required` refuses to start the epoch loop without one; `off` never opens it. The AK's
//! state file lives under `state_dir` ([`crate::pins::StatePaths::tpm_ak`]).

use std::path::PathBuf;

use serde::Deserialize;
use toml::Spanned;

use super::{ConfigError, epoch::Err};
pub use rackwarden_attest::tpm::DEFAULT_QUOTE_PCRS;

/// The kernel's resource manager: it flushes our transient objects when the fd closes and lets
/// other TPM users share the chip (`/dev/tpm0` is exclusive). A config default, kept here so
/// that the config does not depend on the TPM code that reads it.
pub const DEFAULT_TCTI: &str = "device:/dev/tpmrm0";

/// The kernel's binary IMA measurement list (securityfs).
pub const DEFAULT_IMA_LIST: &str = "/sys/kernel/security/ima/binary_runtime_measurements";

/// The sha256 bank has PCRs 0 to 23 (TCG PC Client Platform TPM Profile).
const LAST_PCR: i64 = 23;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TpmMode {
    /// Quote where a TPM can be used; elsewhere each statement says why there is none.
    Auto,
    /// The epoch loop does not start without a working TPM (for hosts known to have one,
    /// where a statement without a quote would only be refused by the verifier).
    Required,
    /// Never open the TPM; statements say it was turned off, and where.
    Off,
}

/// `[tpm]`, validated; the defaults when the section is absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpmConfig {
    pub mode: TpmMode,
    pub tcti: String,
    /// Sorted, each once, 0..=23.
    pub pcrs: Vec<u8>,
    pub ima_list: PathBuf,
    /// The firmware's boot event log, shipped with the first quote after start.
    pub event_log: PathBuf,
}

impl Default for TpmConfig {
    fn default() -> Self {
        TpmConfig {
            mode: TpmMode::Auto,
            tcti: DEFAULT_TCTI.to_string(),
            pcrs: DEFAULT_QUOTE_PCRS.to_vec(),
            ima_list: PathBuf::from(DEFAULT_IMA_LIST),
            event_log: PathBuf::from(rackwarden_attest::tpm::EVENT_LOG_PATH),
        }
    }
}

impl TpmConfig {
    /// The TPM device node the daemon quotes through (`device:` TCTI, `mode` not `off`):
    /// what the guard keeps for it. libtss2's device TCTI defaults to `/dev/tpm0`.
    pub fn device_node(&self) -> Option<PathBuf> {
        if self.mode == TpmMode::Off {
            return None;
        }
        let rest = self.tcti.strip_prefix("device")?;
        match rest.strip_prefix(':') {
            Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
            _ if rest.is_empty() || rest == ":" => Some(PathBuf::from("/dev/tpm0")),
            _ => None,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTpm {
    mode: Option<Spanned<String>>,
    tcti: Option<Spanned<String>>,
    pcrs: Option<Spanned<Vec<Spanned<i64>>>>,
    ima_list: Option<Spanned<String>>,
    event_log: Option<Spanned<String>>,
}

pub(super) fn validate(err: Err, raw: Option<RawTpm>) -> Result<TpmConfig, ConfigError> {
    let Some(raw) = raw else {
        return Ok(TpmConfig::default());
    };
    let defaults = TpmConfig::default();
    Ok(TpmConfig {
        mode: mode(err, &raw.mode)?,
        tcti: match &raw.tcti {
            Some(t) => tcti(err, t)?,
            None => defaults.tcti,
        },
        pcrs: match &raw.pcrs {
            Some(p) => pcrs(err, p)?,
            None => defaults.pcrs,
        },
        ima_list: match &raw.ima_list {
            Some(p) => absolute_path(err, "tpm.ima_list", p)?,
            None => defaults.ima_list,
        },
        event_log: match &raw.event_log {
            Some(p) => absolute_path(err, "tpm.event_log", p)?,
            None => defaults.event_log,
        },
    })
}

fn mode(err: Err, v: &Option<Spanned<String>>) -> Result<TpmMode, ConfigError> {
    super::one_of(
        "tpm.mode",
        v,
        &[
            ("auto", TpmMode::Auto),
            ("required", TpmMode::Required),
            ("off", TpmMode::Off),
        ],
    )
    .map_err(|(span, m)| err(Some(span), m))
}

/// A TCTI is `name[:config]`; libtss2 reads the rest when the TPM is opened, and its error
/// then names the TCTI. Only what is surely wrong is refused here.
fn tcti(err: Err, v: &Spanned<String>) -> Result<String, ConfigError> {
    let t = v.get_ref().trim();
    if t.is_empty() || t.starts_with(':') || t.contains(char::is_whitespace) {
        return Err(err(
            Some(v.span()),
            format!(
                "`tpm.tcti` must be a TCTI such as \"{DEFAULT_TCTI}\" (not `{}`)",
                v.get_ref()
            ),
        ));
    }
    Ok(t.to_string())
}

/// At least one PCR, each 0..=23 and listed once; sorted, as a quote's selection is.
fn pcrs(err: Err, list: &Spanned<Vec<Spanned<i64>>>) -> Result<Vec<u8>, ConfigError> {
    if list.get_ref().is_empty() {
        return Err(err(
            Some(list.span()),
            "`tpm.pcrs` must name at least one PCR (default [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10])"
                .into(),
        ));
    }
    let mut out: Vec<u8> = Vec::new();
    for p in list.get_ref() {
        let n = *p.get_ref();
        let pcr = u8::try_from(n)
            .ok()
            .filter(|&x| i64::from(x) <= LAST_PCR)
            .ok_or_else(|| {
                err(
                    Some(p.span()),
                    format!("`tpm.pcrs`: {n} is not a PCR of the sha256 bank (0 to {LAST_PCR})"),
                )
            })?;
        if out.contains(&pcr) {
            return Err(err(
                Some(p.span()),
                format!("`tpm.pcrs`: PCR {pcr} is listed twice"),
            ));
        }
        out.push(pcr);
    }
    out.sort_unstable();
    Ok(out)
}

fn absolute_path(err: Err, key: &str, v: &Spanned<String>) -> Result<PathBuf, ConfigError> {
    let p = PathBuf::from(v.get_ref());
    if !p.is_absolute() {
        return Err(err(
            Some(v.span()),
            format!("`{key}` must be an absolute path (it is `{}`)", v.get_ref()),
        ));
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    const BASE: &str = r#"rack_id = "rack-a17"
host_id = "host-03"
host_share = 0.25
interfaces = ["eth0"]

[cap]
egress = "10 MB/s"
ingress = "10 MB/s"
burst = "256 KiB"
"#;

    fn parse(tpm: &str) -> Result<Config, ConfigError> {
        Config::parse(
            Path::new("/etc/rackwarden/rackwarden.toml"),
            &format!("{BASE}\n[tpm]\n{tpm}"),
        )
    }

    #[test]
    fn tpm_section_absent_or_empty_gives_the_defaults() {
        let c = Config::parse(Path::new("x.toml"), BASE).unwrap();
        assert_eq!(c.tpm, TpmConfig::default());
        assert_eq!(c.tpm.mode, TpmMode::Auto);
        assert_eq!(c.tpm.tcti, "device:/dev/tpmrm0");
        assert_eq!(c.tpm.pcrs, vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        assert_eq!(c.tpm.ima_list, PathBuf::from(DEFAULT_IMA_LIST));
        assert_eq!(parse("").unwrap().tpm, TpmConfig::default());
    }

    #[test]
    fn the_device_node_is_the_tctis() {
        let node = |tcti: &str, mode: TpmMode| {
            TpmConfig {
                tcti: tcti.into(),
                mode,
                ..TpmConfig::default()
            }
            .device_node()
        };
        assert_eq!(
            node("device:/dev/tpmrm0", TpmMode::Auto),
            Some(PathBuf::from("/dev/tpmrm0"))
        );
        assert_eq!(
            node("device", TpmMode::Required),
            Some(PathBuf::from("/dev/tpm0"))
        );
        assert_eq!(node("device:/dev/tpmrm0", TpmMode::Off), None);
        assert_eq!(node("swtpm:host=127.0.0.1,port=2321", TpmMode::Auto), None);
        assert_eq!(node("devicex:/dev/x", TpmMode::Auto), None);
    }

    #[test]
    fn tpm_keys_are_read_and_pcrs_sorted() {
        let c = parse(
            "mode = \"required\"\ntcti = \"swtpm:host=127.0.0.1,port=2321\"\npcrs = [10, 7, 0]\nima_list = \"/tmp/ima\"\nevent_log = \"/tmp/log\"\n",
        )
        .unwrap();
        assert_eq!(
            c.tpm,
            TpmConfig {
                mode: TpmMode::Required,
                tcti: "swtpm:host=127.0.0.1,port=2321".into(),
                pcrs: vec![0, 7, 10],
                ima_list: PathBuf::from("/tmp/ima"),
                event_log: PathBuf::from("/tmp/log"),
            }
        );
        assert_eq!(parse("mode = \"off\"\n").unwrap().tpm.mode, TpmMode::Off);
    }

    #[test]
    fn tpm_bad_values_name_file_line_and_key() {
        // The [tpm] header is line 11; the first key line 12.
        for (text, line, want) in [
            (
                "mode = \"maybe\"\n",
                12,
                "`tpm.mode` must be auto, required or off",
            ),
            ("pcrs = [0, 24]\n", 12, "`tpm.pcrs`: 24 is not a PCR"),
            ("pcrs = [-1]\n", 12, "`tpm.pcrs`: -1 is not a PCR"),
            ("pcrs = [10, 7, 10]\n", 12, "PCR 10 is listed twice"),
            ("pcrs = []\n", 12, "at least one PCR"),
            (
                "mode = \"auto\"\ntcti = \"\"\n",
                13,
                "`tpm.tcti` must be a TCTI",
            ),
            (
                "ima_list = \"ima\"\n",
                12,
                "`tpm.ima_list` must be an absolute path",
            ),
            (
                "event_log = \"bios.log\"\n",
                12,
                "`tpm.event_log` must be an absolute path",
            ),
            ("colour = \"red\"\n", 12, "colour"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            let prefix = format!("/etc/rackwarden/rackwarden.toml:{line}: ");
            assert!(e.starts_with(&prefix), "{text:?}: {e}");
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn tpm_section_of_the_example_config_parses_to_the_defaults() {
        let example = include_str!("../../../systemd/rackwarden.toml.example");
        let start = example
            .find("\n[tpm]\n")
            .expect("the example documents [tpm]");
        let section = &example[start..];
        // Up to the next table, written or commented out.
        let end = ["\n[", "\n# ["]
            .iter()
            .filter_map(|h| section[1..].find(h))
            .min()
            .map_or(section.len(), |i| i + 1);
        let text = format!("{BASE}{}", &section[..end]);
        let c = Config::parse(Path::new("x.toml"), &text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.tpm, TpmConfig::default());
        // Each commented key, uncommented, is a key the parser knows (and its default).
        let uncommented: String = section[..end]
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(kv) if kv.contains(" = ") => kv.split("  ").next().unwrap_or(kv),
                _ => l,
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let c = Config::parse(Path::new("x.toml"), &format!("{BASE}{uncommented}"))
            .unwrap_or_else(|e| panic!("{e}\n{uncommented}"));
        assert_eq!(c.tpm, TpmConfig::default());
    }
}
