//! What a statement says about the host's root of trust. A host without a usable TPM still
//! attests (the limiter's evidence stands on its own), but says so and why, so a verifier's
//! policy can require a TPM and an operator can see what to fix.

/// Serialized tagged by `level`: `{"level":"none","reason":"..."}` or
/// `{"level":"tpm","tcti":"...","vendor":"...","ak_name":"000b...","ek_certificate":true}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "level", rename_all = "snake_case")]
pub enum RootOfTrust {
    /// No TPM could be used: no device node, no permission, a TCTI or TPM error, or a
    /// daemon built without the `tpm` feature.
    None { reason: String },
    Tpm {
        /// The TCTI it was opened through (`device:/dev/tpmrm0`).
        tcti: String,
        /// TPM_PT_VENDOR_STRING_1..4 ("SW   TPM" is a software TPM).
        vendor: String,
        /// Hex of the AK's Name (0x000b || SHA-256(TPMT_PUBLIC)).
        ak_name: String,
        /// Whether the TPM holds an RSA-2048 EK certificate (NV 0x01c00002).
        ek_certificate: bool,
    },
}

impl RootOfTrust {
    pub fn none(reason: impl Into<String>) -> RootOfTrust {
        RootOfTrust::None {
            reason: reason.into(),
        }
    }

    /// What a daemon built without the `tpm` feature reports (no libtss2 on the build host).
    pub fn not_built() -> RootOfTrust {
        RootOfTrust::none("this rackwarden was built without the `tpm` feature (libtss2)")
    }

    pub fn is_tpm(&self) -> bool {
        matches!(self, RootOfTrust::Tpm { .. })
    }
}

/// Opens the TPM behind `tcti`, recreates the EK and loads (or creates) the AK stored at
/// `ak_path`. Any failure becomes [`RootOfTrust::None`] saying which step failed and why;
/// the [`super::Tpm`] comes back only when everything worked.
#[cfg(feature = "tpm")]
pub fn open_root_of_trust(
    tcti: &str,
    ak_path: &std::path::Path,
) -> (RootOfTrust, Option<super::Tpm>) {
    let mut tpm = match super::Tpm::open(tcti) {
        Ok(t) => t,
        Err(e) => return (RootOfTrust::none(e.to_string()), None),
    };
    let step = |what: &str, e: super::TpmError| {
        RootOfTrust::none(format!("TPM at `{tcti}` opened, but {what} failed: {e}"))
    };
    let ek = match tpm.ek() {
        Ok(ek) => ek,
        Err(e) => return (step("reading the EK", e), None),
    };
    let ak = match tpm.load_or_create_ak(ak_path) {
        Ok(ak) => ak,
        Err(e) => return (step("loading the AK", e), None),
    };
    let vendor = match tpm.vendor() {
        Ok(v) => v,
        Err(e) => return (step("reading the vendor", e), None),
    };
    let root = RootOfTrust::Tpm {
        tcti: tcti.to_string(),
        vendor,
        ak_name: hex::encode(&ak.name),
        ek_certificate: ek.certificate.is_some(),
    };
    (root, Some(tpm))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tpm_root_of_trust_serializes_tagged_by_level() {
        let none = RootOfTrust::none("no TPM device at /dev/tpmrm0");
        assert_eq!(
            serde_json::to_value(&none).unwrap(),
            serde_json::json!({"level": "none", "reason": "no TPM device at /dev/tpmrm0"})
        );
        let tpm = RootOfTrust::Tpm {
            tcti: "device:/dev/tpmrm0".into(),
            vendor: "SW   TPM".into(),
            ak_name: "000b00".into(),
            ek_certificate: true,
        };
        let v = serde_json::to_value(&tpm).unwrap();
        assert_eq!(v["level"], "tpm");
        assert_eq!(v["ak_name"], "000b00");
        assert_eq!(serde_json::from_value::<RootOfTrust>(v).unwrap(), tpm);
        assert!(tpm.is_tpm() && !none.is_tpm());
        assert!(!RootOfTrust::not_built().is_tpm());
    }

    #[cfg(feature = "tpm")]
    #[test]
    fn tpm_root_of_trust_without_device_says_which() {
        let dir = std::env::temp_dir();
        let (root, tpm) = open_root_of_trust("device:/nonexistent", &dir.join("rw-no-ak.json"));
        assert!(tpm.is_none());
        let RootOfTrust::None { reason } = root else {
            panic!("{root:?}")
        };
        assert!(reason.contains("/nonexistent"), "{reason}");
    }
}
