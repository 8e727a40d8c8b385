//! What a statement says about the host's root of trust. A host without a usable TPM still
//! attests (the limiter's evidence stands on its own), but says so and why, so a verifier's
//! policy can require a TPM and an operator can see what to fix.

pub use rackwarden_attest::tpm::{ImaSource, RootOfTrust};

/// Whether the kernel's IMA list at `list` can be read (IMA is on and securityfs mounted).
pub fn ima_source(list: &std::path::Path) -> ImaSource {
    match std::fs::File::open(list) {
        Ok(_) => ImaSource::Measured {
            list: list.display().to_string(),
        },
        Err(e) => ImaSource::Unavailable {
            reason: format!("cannot read the IMA list {}: {e}", list.display()),
        },
    }
}

/// Whether the TPM behind `tcti` answers, without creating or loading any key: its vendor
/// string, or why it cannot be used (`check-config` says this before the daemon starts).
#[cfg(feature = "tpm")]
pub fn probe(tcti: &str) -> Result<String, String> {
    let mut tpm = super::Tpm::open(tcti).map_err(|e| e.to_string())?;
    Ok(tpm.vendor().map_err(|e| e.to_string())?.trim().to_string())
}

/// Without the `tpm` feature there is no TPM to probe.
#[cfg(not(feature = "tpm"))]
pub fn probe(_tcti: &str) -> Result<String, String> {
    Err("this build has no TPM support (built without the `tpm` feature)".into())
}

/// Opens the TPM behind `tcti`, recreates the EK and loads (or creates) the AK stored at
/// `ak_path`. Any failure becomes [`RootOfTrust::None`] saying which step failed and why;
/// the [`super::Tpm`] comes back only when everything worked.
#[cfg(feature = "tpm")]
pub fn open_root_of_trust(
    tcti: &str,
    ak_path: &std::path::Path,
    ima_list: &std::path::Path,
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
        ima: ima_source(ima_list),
    };
    (root, Some(tpm))
}

#[cfg(all(test, feature = "tpm"))]
mod tests {
    use super::*;

    #[test]
    fn tpm_root_of_trust_without_device_says_which() {
        let dir = std::env::temp_dir();
        let (root, tpm) = open_root_of_trust(
            "device:/nonexistent",
            &dir.join("rw-no-ak.json"),
            &dir.join("rw-no-ima"),
        );
        assert!(tpm.is_none());
        let RootOfTrust::None { reason } = root else {
            panic!("{root:?}")
        };
        assert!(reason.contains("/nonexistent"), "{reason}");
    }
}
