//! TPM 2.0 evidence (issue 22): the daemon's side of enrolment and quotes.
//!
//! - [`Tpm`] holds one ESAPI context opened from a TCTI string (`device:/dev/tpmrm0` on a
//!   host, `swtpm:host=127.0.0.1,port=P` in tests). It recreates the RSA-2048 EK from the TCG
//!   default template (deterministic, so the same key every start), reads its certificate,
//!   keeps an ECC P-256 AK in a state file so a restarted daemon signs with the AK the
//!   verifier enrolled, quotes the sha256 bank, answers credential challenges
//!   (ActivateCredential) and extends PCRs (tests simulate IMA with it).
//! - [`RootOfTrust`] is what a statement says about the host's root of trust: a TPM, or none
//!   and why. It exists without the `tpm` feature too, so the daemon can always say why not.
//!
//! - [`Attestor`] is the root of trust as the epoch loop holds it (opened once per start as
//!   `[tpm]` says): what every statement states, and the [`StatementQuoter`] that quotes each
//!   statement's chain digest and ships the IMA entries the quote covers ([`ima_cursor`]).
//!
//! The verifier side (parsing, MakeCredential, quote checks) is pure Rust in
//! `rackwarden_attest::tpm`; this module is the only code that talks to libtss2.

mod attestor;
mod root;

pub use attestor::{Attestor, TpmRequired};
pub use root::{ImaSource, RootOfTrust, ima_source, probe};

#[cfg(feature = "tpm")]
mod ak_file;
#[cfg(feature = "tpm")]
mod device;
#[cfg(feature = "tpm")]
mod error;
#[cfg(feature = "tpm")]
pub mod ima_cursor;
#[cfg(feature = "tpm")]
mod quoter;

#[cfg(feature = "tpm")]
pub use device::{AkInfo, AkSource, EkInfo, Quote, SharedTpm, Tpm};
#[cfg(feature = "tpm")]
pub use error::TpmError;
#[cfg(feature = "tpm")]
pub use quoter::StatementQuoter;
#[cfg(feature = "tpm")]
pub use root::open_root_of_trust;
/// What [`TpmError::response_code`] returns (re-exported so callers need no tss-esapi).
#[cfg(feature = "tpm")]
pub use tss_esapi::constants::Tss2ResponseCodeKind;

/// The NV index of the RSA-2048 EK certificate (TCG EK Credential Profile, low range).
pub const EK_CERT_NV_INDEX_RSA2048: u32 = 0x01c0_0002;

/// How often a quote is retried when the PCRs changed between reading them and quoting
/// (IMA extends PCR 10 whenever a new file is measured). Keylime's `perform_quote_and_pcr_read`
/// uses the same bound.
pub const QUOTE_TRIES: u32 = 5;
