//! What can go wrong talking to the TPM, each naming the command (or file) that failed.

use std::path::PathBuf;

use tss_esapi::{
    Error as TssError,
    constants::{Tss2ResponseCodeKind, response_code::Tss2ResponseCode},
};

#[derive(Debug, thiserror::Error)]
pub enum TpmError {
    #[error(
        "TCTI `{tcti}` is not valid (use `device:/dev/tpmrm0` or `swtpm:host=H,port=P`): {source}"
    )]
    TctiSyntax { tcti: String, source: TssError },
    #[error(
        "no TPM device at {path}: this host has no TPM, or no TPM driver (tpm_tis, tpm_crb) is loaded"
    )]
    NoDevice { path: PathBuf },
    #[error(
        "cannot open the TPM device {path}: {source} (the daemon needs root or the `tss` group)"
    )]
    DeviceAccess {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "no TPM answers at {addr} (TCTI `{tcti}`): {source}: is swtpm (or the simulator) running, and are the host and port in the TCTI right?"
    )]
    SocketUnreachable {
        tcti: String,
        addr: String,
        source: std::io::Error,
    },
    #[error("opening the TPM through `{tcti}`: {}", describe(source))]
    Open { tcti: String, source: TssError },
    #[error("{command} failed: {}", describe(source))]
    Command {
        command: &'static str,
        source: TssError,
    },
    #[error("the EK certificate in NV index {index:#010x} is not a DER certificate: {why}")]
    EkCertificate { index: u32, why: &'static str },
    #[error("PCR {pcr} cannot be quoted or extended: the sha256 bank has PCRs 0 to 23")]
    PcrOutOfRange { pcr: u8 },
    #[error("a quote needs at least one PCR")]
    NoPcrs,
    #[error("extra data is {len} bytes; a quote carries at most 64 (TPM2B_DATA)")]
    ExtraDataTooLong { len: usize },
    #[error(
        "TPM2_Quote: the PCR values read never matched the quoted pcrDigest in {tries} tries (the PCRs kept changing)"
    )]
    PcrRace { tries: u32 },
    #[error("TPM2_PCR_Read returned no sha256 value for PCR {pcr}")]
    PcrMissing { pcr: u8 },
    #[error("TPM2_Quote returned an attestation of another type than a quote")]
    NotAQuote,
    #[error("no AK is loaded: call `load_or_create_ak` first")]
    NoAk,
    #[error("the EK has no {what}, which the PolicySecret session for it needs")]
    EkTemplate { what: &'static str },
    #[error("the credential challenge's {what} is {len} bytes, more than a TPM accepts")]
    ChallengeTooLarge { what: &'static str, len: usize },
    #[error("AK state file {}: {source}", path.display())]
    AkFileIo {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("AK state file {} is malformed: {why}", path.display())]
    AkFileFormat { path: PathBuf, why: String },
}

impl TpmError {
    /// The TPM's (or TSS's) response code, for callers that tell apart e.g. an integrity
    /// failure (a credential made for another AK) from a TPM that is out of memory.
    pub fn response_code(&self) -> Option<Tss2ResponseCodeKind> {
        match self {
            TpmError::Open { source, .. } | TpmError::Command { source, .. } => match source {
                TssError::Tss2Error(rc) => rc.kind(),
                TssError::WrapperError(_) => None,
            },
            _ => None,
        }
    }
}

/// Maps a tss-esapi error to [`TpmError::Command`] naming `command`.
pub(super) fn cmd(command: &'static str) -> impl FnOnce(TssError) -> TpmError {
    move |source| TpmError::Command { command, source }
}

/// The response code's meaning and its raw value (tss-esapi prints them separately: the
/// meaning through `Display`, the value through the code's own `Display`).
fn describe(e: &TssError) -> String {
    match e {
        TssError::WrapperError(kind) => format!("{kind} (in tss-esapi, before the TPM)"),
        TssError::Tss2Error(rc) => match rc {
            Tss2ResponseCode::Success => "success".to_string(),
            Tss2ResponseCode::FormatZero(raw) => format!("{rc} [{}]", lower_first(raw)),
            Tss2ResponseCode::FormatOne(raw) => format!("{rc} [{}]", lower_first(raw)),
        },
    }
}

fn lower_first(d: &impl std::fmt::Display) -> String {
    let s = d.to_string();
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().chain(c).collect(),
        None => s,
    }
}
