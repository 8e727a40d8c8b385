//! The wipe engine: fill memory with a stream keyed by the verifier's nonce, read it all
//! back, and report per device what was covered and what was not.
//!
//! - [`stream`]: the keyed stream (an AES-128 seed per 64 KiB segment under a key derived
//!   from nonce and device, expanded per word; shared with the GPU kernels);
//! - [`host`]: host RAM (anonymous, locked, huge-page-advised mappings, all cores);
//! - [`gpu`]: GPU memory through the CUDA driver API loaded at run time;
//! - [`scratch`]: configured scratch directories, emptied.
//!
//! Residue = `bytes_total - bytes_verified`, per device, never rounded. A report never claims
//! more than was read back and compared.

pub mod cuda;
pub mod gpu;
pub mod host;
pub mod scratch;
pub mod stream;

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64},
    },
};

use rackwarden_attest::evidence::{WipeDeviceReport, WipeReport, WipeStatus};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Host,
    Gpu,
    Scratch,
}

/// A `--backend` the CLI does not know.
#[derive(Debug, thiserror::Error)]
#[error("unknown backend `{0}` (use host, gpu, scratch or all)")]
pub struct UnknownBackend(pub String);

impl Backend {
    pub fn parse(s: &str) -> Result<Vec<Backend>, UnknownBackend> {
        Ok(match s {
            "host" => vec![Backend::Host],
            "gpu" => vec![Backend::Gpu],
            "scratch" => vec![Backend::Scratch],
            "all" => vec![Backend::Host, Backend::Gpu, Backend::Scratch],
            other => return Err(UnknownBackend(other.to_string())),
        })
    }
}

pub struct WipeRequest {
    pub nonce: [u8; 32],
    pub backends: Vec<Backend>,
    /// Cap on bytes taken per device (tests, benchmarks, partial wipes).
    pub max_bytes: Option<u64>,
    /// Host memory left untouched so the host does not run out of memory.
    pub reserve_bytes: u64,
    pub scratch_paths: Vec<PathBuf>,
    pub threads: usize,
    /// Bytes filled or verified so far (progress display).
    pub progress: Option<Arc<AtomicU64>>,
    /// TEST HOOK: flip the byte at this stream offset of each device's fill (host RAM and
    /// every GPU) between fill and verify, to prove a corruption is counted. The CLI and the
    /// daemon never set it.
    pub corrupt_byte_for_test: Option<u64>,
}

/// Runs each requested backend in turn. `stop` (set by SIGTERM/SIGINT) ends the wipe promptly;
/// what was not verified is reported as residue.
pub fn run(req: &WipeRequest, stop: &AtomicBool) -> WipeReport {
    let mut devices: Vec<WipeDeviceReport> = Vec::new();
    for b in &req.backends {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
        match b {
            Backend::Host => devices.push(host::wipe(req, stop)),
            Backend::Gpu => devices.extend(gpu::wipe(req, stop)),
            Backend::Scratch => devices.extend(scratch::wipe(&req.scratch_paths)),
        }
    }
    let interrupted = stop.load(std::sync::atomic::Ordering::SeqCst)
        || devices.iter().any(|d| d.status == WipeStatus::Interrupted);
    WipeReport {
        nonce: hex::encode(req.nonce),
        stream: Some(String::from_utf8_lossy(stream::DOMAIN).into_owned()),
        interrupted,
        devices,
    }
}

/// Why a wipe does not allow restarting the workloads; `None`: every device verified.
pub fn unverified_reason(r: &WipeReport) -> Option<String> {
    if r.interrupted {
        return Some("the wipe was interrupted".into());
    }
    let bad: Vec<String> = r
        .devices
        .iter()
        .filter(|d| {
            d.status == WipeStatus::Failed
                || d.mismatches > 0
                || d.status == WipeStatus::Interrupted
        })
        .map(|d| {
            format!(
                "{}: {} ({} mismatching blocks){}",
                d.device,
                d.status,
                d.mismatches,
                d.detail
                    .as_ref()
                    .map(|x| format!(": {x}"))
                    .unwrap_or_default()
            )
        })
        .collect();
    (!bad.is_empty()).then(|| format!("wipe not verified: {}", bad.join("; ")))
}

/// A report for a device that was not wiped at all.
pub(crate) fn not_wiped(
    backend: &str,
    device: &str,
    status: WipeStatus,
    bytes_total: u64,
    detail: String,
) -> WipeDeviceReport {
    WipeDeviceReport {
        backend: backend.into(),
        device: device.into(),
        status,
        bytes_total,
        bytes_filled: 0,
        bytes_verified: 0,
        mismatches: 0,
        residue_bytes: bytes_total,
        fill_ms: 0,
        verify_ms: 0,
        detail: Some(detail),
    }
}
