//! The root of trust as the epoch loop holds it: what every statement says about it, and the
//! TPM that quotes each statement (where there is one). Opened once per daemon start, as
//! `[tpm]` says.

use std::path::{Path, PathBuf};

use rackwarden_attest::tpm::{RootOfTrust, TpmSidecar};

use crate::config::tpm::{TpmConfig, TpmMode};

/// `[tpm] mode = "required"` and no TPM could be used: the epoch loop does not start.
#[derive(Debug, thiserror::Error)]
#[error(
    "[tpm] mode = \"required\" in {}, but the TPM at `{tcti}` cannot be used: {reason}",
    config.display()
)]
pub struct TpmRequired {
    pub config: PathBuf,
    pub tcti: String,
    pub reason: String,
}

/// What the statements of this run say about the root of trust, and the TPM that quotes
/// them. Cloning shares the TPM and the IMA cursor.
#[derive(Clone)]
pub struct Attestor {
    root: RootOfTrust,
    #[cfg(feature = "tpm")]
    tpm: Option<TpmParts>,
}

#[cfg(feature = "tpm")]
#[derive(Clone)]
struct TpmParts {
    /// For enrolment (ActivateCredential), which runs beside the epoch loop.
    tpm: super::SharedTpm,
    quoter: std::sync::Arc<std::sync::Mutex<super::StatementQuoter>>,
}

impl std::fmt::Debug for Attestor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attestor")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl Attestor {
    /// Opens the root of trust `cfg` asks for; `ak_path` is the AK's state file and
    /// `config_path` the file `[tpm]` came from (a statement of a host with `mode = "off"`
    /// names it). Only `required` fails.
    pub fn open(
        cfg: &TpmConfig,
        ak_path: &Path,
        config_path: &Path,
    ) -> Result<Attestor, TpmRequired> {
        let attestor = match cfg.mode {
            TpmMode::Off => Attestor::without_tpm(RootOfTrust::none(format!(
                "disabled by [tpm] mode = \"off\" in {}",
                config_path.display()
            ))),
            TpmMode::Auto | TpmMode::Required => Attestor::open_tpm(cfg, ak_path),
        };
        if cfg.mode == TpmMode::Required
            && let RootOfTrust::None { reason } = &attestor.root
        {
            return Err(TpmRequired {
                config: config_path.to_owned(),
                tcti: cfg.tcti.clone(),
                reason: reason.clone(),
            });
        }
        Ok(attestor)
    }

    /// A root of trust without a TPM: statements say `reason` and carry no quote.
    pub fn without_tpm(root: RootOfTrust) -> Attestor {
        Attestor {
            root,
            #[cfg(feature = "tpm")]
            tpm: None,
        }
    }

    #[cfg(feature = "tpm")]
    fn open_tpm(cfg: &TpmConfig, ak_path: &Path) -> Attestor {
        let (root, tpm) = super::open_root_of_trust(&cfg.tcti, ak_path, &cfg.ima_list);
        let (RootOfTrust::Tpm { ima, .. }, Some(tpm)) = (&root, tpm) else {
            return Attestor::without_tpm(root);
        };
        if let Some(ak) = tpm.ak_info() {
            log::info!("tpm: AK {} ({:?})", hex::encode(&ak.name), ak.source);
        }
        let tpm = std::sync::Arc::new(std::sync::Mutex::new(tpm));
        let quoter = super::StatementQuoter::new(tpm.clone(), &cfg.pcrs, ima, &cfg.event_log);
        Attestor {
            root,
            tpm: Some(TpmParts {
                tpm,
                quoter: std::sync::Arc::new(std::sync::Mutex::new(quoter)),
            }),
        }
    }

    #[cfg(not(feature = "tpm"))]
    fn open_tpm(_cfg: &TpmConfig, _ak_path: &Path) -> Attestor {
        Attestor::without_tpm(RootOfTrust::not_built())
    }

    /// What each statement says about the root of trust.
    pub fn root_of_trust(&self) -> &RootOfTrust {
        &self.root
    }

    /// The TPM, for enrolment; `None` without one.
    #[cfg(feature = "tpm")]
    pub fn tpm(&self) -> Option<super::SharedTpm> {
        self.tpm.as_ref().map(|p| p.tpm.clone())
    }

    /// The quote over the statement whose chain digest is `chain_digest`, with the IMA
    /// entries it covers; `None` without a TPM. A TPM that fails is logged and the statement
    /// goes without a quote: the epoch's evidence is not held back for it, and the verifier
    /// judges the missing quote.
    pub fn quote(&self, chain_digest: &[u8; 32]) -> Option<TpmSidecar> {
        #[cfg(feature = "tpm")]
        {
            let parts = self.tpm.as_ref()?;
            let mut quoter = parts.quoter.lock().unwrap_or_else(|p| p.into_inner());
            match quoter.quote_statement(chain_digest) {
                Ok(sidecar) => Some(sidecar),
                Err(e) => {
                    log::error!(
                        "tpm: no quote for statement {}: {e}; it goes without one",
                        hex::encode(chain_digest)
                    );
                    None
                }
            }
        }
        #[cfg(not(feature = "tpm"))]
        {
            let _ = chain_digest;
            None
        }
    }

    /// Makes the next statement ship the whole IMA list (and the boot's event log) again. Called once the AK is enrolled:
    /// the quotes before could not be checked, so the verifier holds no verified position to
    /// continue from, and only a list from the boot aggregate lets it replay PCR 10 again.
    pub fn resend_ima_from_boot(&self) {
        #[cfg(feature = "tpm")]
        if let Some(parts) = &self.tpm {
            parts
                .quoter
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .restart_ima();
        }
    }

    /// One line for the log: the level, and what it rests on or why there is none.
    pub fn describe(&self) -> String {
        match &self.root {
            RootOfTrust::None { reason } => format!("none ({reason})"),
            RootOfTrust::Tpm {
                tcti,
                vendor,
                ak_name,
                ek_certificate,
                ima,
            } => format!(
                "TPM `{}` at {tcti}, AK {ak_name}, {}, IMA {}",
                vendor.trim(),
                if *ek_certificate {
                    "EK certificate in NV"
                } else {
                    "no EK certificate"
                },
                match ima {
                    rackwarden_attest::tpm::ImaSource::Measured { list } => list.clone(),
                    rackwarden_attest::tpm::ImaSource::Unavailable { reason } => reason.clone(),
                }
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(mode: TpmMode) -> TpmConfig {
        TpmConfig {
            mode,
            tcti: "device:/nonexistent/tpmrm9".into(),
            ..TpmConfig::default()
        }
    }

    const CONF: &str = "/etc/rackwarden/rackwarden.toml";

    fn ak_path() -> PathBuf {
        std::env::temp_dir()
            .join(format!("rw-attestor-{}", std::process::id()))
            .join("tpm-ak.json")
    }

    #[test]
    fn tpm_attestor_off_names_the_config_and_never_quotes() {
        let off = Attestor::open(&cfg(TpmMode::Off), &ak_path(), Path::new(CONF)).unwrap();
        assert_eq!(
            off.root_of_trust(),
            &RootOfTrust::none(
                "disabled by [tpm] mode = \"off\" in /etc/rackwarden/rackwarden.toml"
            )
        );
        assert!(off.quote(&[0; 32]).is_none());
    }

    #[cfg(feature = "tpm")]
    #[test]
    fn tpm_attestor_without_a_device_auto_says_why_required_fails() {
        let auto = Attestor::open(&cfg(TpmMode::Auto), &ak_path(), Path::new(CONF)).unwrap();
        let RootOfTrust::None { reason } = auto.root_of_trust() else {
            panic!("{auto:?}")
        };
        assert!(reason.contains("/nonexistent/tpmrm9"), "{reason}");
        assert!(auto.quote(&[0; 32]).is_none());

        let e = Attestor::open(&cfg(TpmMode::Required), &ak_path(), Path::new(CONF))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "[tpm] mode = \"required\" in /etc/rackwarden/rackwarden.toml, but the TPM at `device:/nonexistent/tpmrm9` cannot be used: "
            ),
            "{e}"
        );
        assert!(e.contains("no TPM device at /nonexistent/tpmrm9"), "{e}");
        assert!(!ak_path().exists(), "no AK file without a TPM");
    }

    #[cfg(not(feature = "tpm"))]
    #[test]
    fn tpm_attestor_built_without_the_feature_says_so() {
        let auto = Attestor::open(&cfg(TpmMode::Auto), &ak_path(), Path::new(CONF)).unwrap();
        assert_eq!(auto.root_of_trust(), &RootOfTrust::not_built());
        let e = Attestor::open(&cfg(TpmMode::Required), &ak_path(), Path::new(CONF)).unwrap_err();
        assert!(e.to_string().contains("without the `tpm` feature"), "{e}");
    }
}
