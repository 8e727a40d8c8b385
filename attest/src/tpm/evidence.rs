//! What a host's TPM adds to its evidence, as it travels and is stored (issue 22):
//!
//! - [`RootOfTrust`]: what the signed statement says about the host's root of trust (a TPM, or
//!   none and why). A claim like any other field; the verifier derives the level it grants
//!   from the quote it could verify, never from this.
//! - [`TpmSidecar`]: beside each envelope (the `"tpm"` key of its log line and of its item on
//!   the wire), the quote over that envelope, the quoted PCR values and the IMA entries since
//!   the previous statement.
//! - [`TpmEnrollRequest`] / [`TpmCredential`] / [`TpmActivation`]: the daemon-verifier
//!   exchange that enrols an AK only after the host proves, with ActivateCredential, that it
//!   lives beside a certified EK.
//!
//! The quote's qualifying data is the statement's chain digest (SHA3-256 of its DSSE PAE, the
//! value the next statement names as `prev`): a quote made for one statement does not verify
//! for another, and the verifier already computes that digest.

use std::collections::BTreeMap;

use base64::{Engine as _, engine::general_purpose::STANDARD as B64};
use serde::{Deserialize, Serialize};

use super::boot::{BootEvidence, BootLogError, decode_boot_log};
use super::eventlog::EventLog;
use super::ima::{ImaEntry, ImaError, parse_ima_binary};
use super::pcr::PcrValues;

/// Payload type of the enrolment request the host signs with its ed25519 key.
pub const TPM_ENROLL_PAYLOAD_TYPE: &str = "application/vnd.rackwarden.tpm-enroll+json";

/// The PCRs a daemon quotes unless configured otherwise: the boot chain's 0-7 (firmware; the
/// kernel image in 4 where UEFI loads it), 8-9 (the boot loader's and the Linux EFI stub's:
/// the initrd and the kernel command line), and 10 (IMA).
pub const DEFAULT_QUOTE_PCRS: [u8; 11] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10];

/// The root of trust a host claims. Serialized tagged by `level`:
/// `{"level":"none","reason":"..."}` or
/// `{"level":"tpm","tcti":"...","vendor":"...","ak_name":"000b...","ek_certificate":true,"ima":{...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "level", rename_all = "snake_case", deny_unknown_fields)]
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
        /// Whether the kernel's IMA list is shipped with each quote.
        ima: ImaSource,
    },
}

/// Where the IMA entries of a quote come from, or why there are none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", deny_unknown_fields)]
pub enum ImaSource {
    /// Read from this file (the kernel's `binary_runtime_measurements`).
    Measured { list: String },
    /// IMA's list could not be read: the quote covers PCR 10 but nothing replays it.
    Unavailable { reason: String },
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

/// The level of root of trust, ordered: a policy's `min_root_of_trust` is the least it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrustLevel {
    /// The daemon's word alone (its ed25519 key, readable by the host's root).
    None,
    /// A quote by an enrolled AK binds the statement to the TPM's PCRs.
    Tpm,
    /// And PCR 10 replays from the shipped IMA entries, all of them allowed by policy.
    TpmIma,
}

impl TrustLevel {
    pub fn name(self) -> &'static str {
        match self {
            TrustLevel::None => "none",
            TrustLevel::Tpm => "tpm",
            TrustLevel::TpmIma => "tpm_ima",
        }
    }

    pub fn parse(s: &str) -> Option<TrustLevel> {
        match s {
            "none" => Some(TrustLevel::None),
            "tpm" => Some(TrustLevel::Tpm),
            "tpm_ima" => Some(TrustLevel::TpmIma),
            _ => None,
        }
    }
}

/// The TPM evidence beside one envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpmSidecar {
    /// Hex of the TPMS_ATTEST the TPM signed (it carries the clock info: clock, resetCount,
    /// restartCount, safe).
    pub quote: String,
    /// Hex of the TPMT_SIGNATURE (ECDSA-SHA256 by the AK).
    pub signature: String,
    /// The quoted PCRs of the SHA-256 bank, index to hex value.
    pub pcrs: BTreeMap<u8, String>,
    /// The IMA entries measured since the previous statement, or none when IMA is unavailable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ima: Option<ImaDelta>,
    /// The boot's event log and command line: with the first quote after the daemon starts
    /// and after its AK is enrolled (PCRs 0-9 do not change within a boot, so the verifier
    /// keeps what it read from one shipment for the boot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<BootEvidence>,
}

/// A stretch of the IMA list: entries `offset..offset+count` of this boot's list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImaDelta {
    /// Index (0 = the boot aggregate) of the first entry shipped.
    pub offset: u64,
    /// Standard base64 of the entries in the kernel's binary format.
    pub entries: String,
}

/// Why a sidecar's fields do not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SidecarError {
    #[error("tpm.{field} is not hex: {detail}")]
    Hex { field: &'static str, detail: String },
    #[error("tpm.pcrs[{pcr}] is not a 32-byte hex SHA-256 value")]
    PcrValue { pcr: u8 },
    #[error("tpm.ima.entries is not standard base64: {0}")]
    ImaBase64(String),
    #[error("tpm.ima.entries: {0}")]
    Ima(#[from] ImaError),
    #[error(transparent)]
    BootLog(#[from] BootLogError),
}

/// A sidecar with its fields decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedSidecar {
    pub quote: Vec<u8>,
    pub signature: Vec<u8>,
    pub pcrs: PcrValues,
    /// `(offset, entries)`, when IMA entries were shipped.
    pub ima: Option<(u64, Vec<ImaEntry>)>,
    /// The boot's event log and the command line shipped with it.
    pub boot: Option<(EventLog, String)>,
}

impl TpmSidecar {
    pub fn new(
        quote: &[u8],
        signature: &[u8],
        pcrs: &BTreeMap<u8, [u8; 32]>,
        ima: Option<(u64, &[u8])>,
    ) -> TpmSidecar {
        TpmSidecar {
            quote: hex::encode(quote),
            signature: hex::encode(signature),
            pcrs: pcrs.iter().map(|(i, v)| (*i, hex::encode(v))).collect(),
            ima: ima.map(|(offset, bytes)| ImaDelta {
                offset,
                entries: B64.encode(bytes),
            }),
            boot: None,
        }
    }

    pub fn decode(&self) -> Result<DecodedSidecar, SidecarError> {
        let hex_field = |field: &'static str, s: &str| {
            hex::decode(s).map_err(|e| SidecarError::Hex {
                field,
                detail: e.to_string(),
            })
        };
        let mut pcrs = PcrValues::new();
        for (pcr, v) in &self.pcrs {
            let bytes = hex::decode(v).map_err(|_| SidecarError::PcrValue { pcr: *pcr })?;
            let value: [u8; 32] = bytes
                .try_into()
                .map_err(|_| SidecarError::PcrValue { pcr: *pcr })?;
            pcrs.insert(*pcr, value);
        }
        let ima = match &self.ima {
            None => None,
            Some(d) => {
                let bytes = B64
                    .decode(&d.entries)
                    .map_err(|e| SidecarError::ImaBase64(e.to_string()))?;
                Some((d.offset, parse_ima_binary(&bytes)?))
            }
        };
        let boot = match &self.boot {
            None => None,
            Some(b) => Some((decode_boot_log(b)?, b.cmdline.clone())),
        };
        Ok(DecodedSidecar {
            quote: hex_field("quote", &self.quote)?,
            signature: hex_field("signature", &self.signature)?,
            pcrs,
            ima,
            boot,
        })
    }
}

/// What the host signs (as a DSSE envelope of [`TPM_ENROLL_PAYLOAD_TYPE`], with its enrolled
/// ed25519 key) to ask the verifier to enrol its AK: `POST /v1/tpm/enroll`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpmEnrollRequest {
    pub rack: String,
    pub host: String,
    /// Hex of the EK's TPMT_PUBLIC (RSA-2048, TCG default template).
    pub ek_public: String,
    /// Standard base64 of the EK certificate's DER, as read from NV (padding allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ek_certificate: Option<String>,
    /// Hex of the AK's TPMT_PUBLIC.
    pub ak_public: String,
}

/// The verifier's answer to an enrolment request: a credential only the TPM holding that EK
/// can activate, and only for an object with that AK's Name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpmCredential {
    /// Names this challenge in the activation.
    pub challenge_id: String,
    /// Hex of TPM2B_ID_OBJECT's contents (credentialBlob).
    pub credential_blob: String,
    /// Hex of TPM2B_ENCRYPTED_SECRET's contents.
    pub encrypted_secret: String,
    pub expires_at_ms: u64,
}

/// `POST /v1/tpm/activate`: the secret the TPM recovered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpmActivation {
    pub rack: String,
    pub host: String,
    pub challenge_id: String,
    /// Hex of the secret ActivateCredential returned.
    pub secret: String,
}

/// The verifier's answer to an activation that matched: the AK is enrolled for the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpmEnrolled {
    pub ak_name: String,
    /// Subject of the EK certificate's chain end (the manufacturer CA that vouched for it).
    pub ek_issuer: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_of_trust_serializes_tagged_by_level() {
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
            ima: ImaSource::Measured {
                list: "/sys/kernel/security/ima/binary_runtime_measurements".into(),
            },
        };
        let v = serde_json::to_value(&tpm).unwrap();
        assert_eq!(v["level"], "tpm");
        assert_eq!(v["ima"]["state"], "measured");
        assert_eq!(serde_json::from_value::<RootOfTrust>(v).unwrap(), tpm);
        assert!(tpm.is_tpm() && !none.is_tpm());
        assert!(!RootOfTrust::not_built().is_tpm());
    }

    #[test]
    fn trust_levels_order_and_parse() {
        assert!(TrustLevel::None < TrustLevel::Tpm && TrustLevel::Tpm < TrustLevel::TpmIma);
        for l in [TrustLevel::None, TrustLevel::Tpm, TrustLevel::TpmIma] {
            assert_eq!(TrustLevel::parse(l.name()), Some(l));
            assert_eq!(serde_json::to_value(l).unwrap(), l.name());
        }
        assert_eq!(TrustLevel::parse("TPM"), None);
    }

    #[test]
    fn sidecar_round_trips_and_decodes() {
        let entries = vec![ImaEntry::ima_ng("/usr/bin/rackwardend", [7; 32])];
        let bytes = super::super::ima::encode_ima_binary(&entries);
        let pcrs = BTreeMap::from([(10u8, [1u8; 32])]);
        let s = TpmSidecar::new(b"attest", b"sig", &pcrs, Some((3, &bytes)));
        let text = serde_json::to_string(&s).unwrap();
        let back: TpmSidecar = serde_json::from_str(&text).unwrap();
        assert_eq!(back, s);
        let d = back.decode().unwrap();
        assert_eq!(d.quote, b"attest");
        assert_eq!(d.pcrs.get(10), Some(&[1u8; 32]));
        assert_eq!(d.ima, Some((3, entries)));
        let mut bad = s.clone();
        bad.pcrs.insert(0, "00".into());
        assert_eq!(bad.decode(), Err(SidecarError::PcrValue { pcr: 0 }));
    }
}
