//! TPM 2.0 evidence, pure Rust (no TSS): the structures a host's TPM produces and the verifier
//! checks.
//!
//! - [`public`]: TPMT_PUBLIC of the attestation key ([`AkPublic`]) and endorsement key
//!   ([`EkPublic`]), and their Names;
//! - [`pcr`]: PCR selections and values, and the quote's pcrDigest;
//! - [`quote`]: TPMS_ATTEST / TPMT_SIGNATURE parsing and quote verification;
//! - [`kdf`]: hash algorithms, KDFa and KDFe;
//! - [`credential`]: MakeCredential in software (the verifier's half of AK enrolment);
//! - [`ekcert`]: the EK certificate chain, checked by hand;
//! - [`ima`]: the IMA binary measurement list and its PCR 10 replay;
//! - [`eventlog`]: the firmware's boot event log and its replay;
//! - [`boot`]: what a boot measured (loaders, kernel, initrd, command line, Secure Boot).
//!
//! - [`evidence`]: what travels with a statement (the quote sidecar, the root of trust) and
//!   the enrolment exchange.
//!
//! Byte layouts are TPM 2.0 Part 2 (big-endian); each parser names the structure it reads.

pub mod boot;
pub mod credential;
pub mod ekcert;
pub mod error;
pub mod eventlog;
pub mod evidence;
pub mod ima;
pub mod kdf;
pub(crate) mod marshal;
pub mod pcr;
pub mod public;
pub mod quote;

pub use boot::{
    BOOT_LOG_PCRS, BootEvidence, BootLogError, CmdlineWitness, EVENT_LOG_PATH, MeasuredBoot,
    MeasuredCmdline, SecureBootState, decode_boot_log, pe_image_sha256, replay_differences,
};
pub use credential::{CredentialChallenge, make_credential};
pub use ekcert::{EkCertError, EkCertificate, verify_ek_certificate};
pub use error::TpmError;
pub use eventlog::{EventLog, EventLogError};
pub use evidence::{
    DEFAULT_QUOTE_PCRS, DecodedSidecar, ImaDelta, ImaSource, RootOfTrust, SidecarError,
    TPM_ENROLL_PAYLOAD_TYPE, TpmActivation, TpmCredential, TpmEnrollRequest, TpmEnrolled,
    TpmSidecar, TrustLevel,
};
pub use ima::{
    ImaEntry, ImaError, encode_ima_binary, parse_ima_binary, replay_pcr10, replay_prefix,
};
pub use kdf::{HashAlg, kdfa, kdfe};
pub use pcr::{MissingPcr, PcrSelection, PcrValues};
pub use public::{AkPublic, EkPublic};
pub use quote::{QuoteError, QuoteInfo, check_selection, parse_attest, verify_quote};
