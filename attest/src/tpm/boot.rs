//! What a boot's event log says was measured, read so that a policy can judge it by sets of
//! accepted values (issue 41) instead of one reference value per PCR.
//!
//! Only what the replay covers counts: an event's data is not extended into any PCR, only its
//! digest is, so a component is named by its digest, and text is read from an event only where
//! the digest is the hash of that text (GRUB's command strings, the EFI variables of PCR 7).
//! The Linux EFI stub measures the command line as a digest alone; the daemon ships the
//! command line its kernel runs with, and it is taken as measured only when it hashes to
//! that digest.
//!
//! - PCR 4, EV_EFI_BOOT_SERVICES_APPLICATION: each UEFI application started, in order (shim,
//!   GRUB, the kernel's EFI stub; a direct boot starts the kernel alone). The last is the
//!   kernel, the ones before it its loaders. The digest is the PE image's Authenticode hash.
//! - PCR 9, EV_EVENT_TAG: the EFI stub's initrd and LoadOptions (command line).
//! - PCR 8, EV_IPL: GRUB's `kernel_cmdline: ...` (the digest covers the text after the prefix).
//! - PCR 7, EV_EFI_VARIABLE_DRIVER_CONFIG: `SecureBoot`, `PK`, `KEK`, `db`, `dbx`.

use std::collections::BTreeMap;

use base64::{Engine as _, engine::general_purpose::STANDARD as B64};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::eventlog::{
    EV_EFI_BOOT_SERVICES_APPLICATION, EV_EFI_VARIABLE_DRIVER_CONFIG, EventLog, EventLogError,
    LINUX_EFI_INITRD_EVENT_TAG_ID, LINUX_EFI_LOAD_OPTIONS_EVENT_TAG_ID, LogEvent,
    efi_load_options_digest,
};
use super::pcr::PcrValues;

/// Where Linux exposes the firmware's event log.
pub const EVENT_LOG_PATH: &str = "/sys/kernel/security/tpm0/binary_bios_measurements";

/// The PCRs a boot log is replayed against: the firmware's (0-7), the boot loader's (8) and
/// the files it or the EFI stub loaded (9). PCR 10 on is the running system's (IMA).
pub const BOOT_LOG_PCRS: std::ops::RangeInclusive<u8> = 0..=9;

/// EV_IPL: what a boot loader measures (GRUB: its commands and the kernel command line).
pub const EV_IPL: u32 = 0x0000_000d;
/// GRUB's prefix of the kernel command line it measures into PCR 8.
const GRUB_KERNEL_CMDLINE: &str = "kernel_cmdline: ";

/// The boot evidence a daemon ships beside a quote, once per boot (the first statement after
/// it starts, and again after its AK is enrolled): the event log and the command line the
/// kernel runs with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootEvidence {
    /// Standard base64 of `binary_bios_measurements`.
    pub log: String,
    /// `/proc/cmdline` without its newline: checked against the measured digest.
    pub cmdline: String,
}

impl BootEvidence {
    pub fn new(log: &[u8], cmdline: &str) -> BootEvidence {
        BootEvidence {
            log: B64.encode(log),
            cmdline: cmdline.trim_end_matches('\n').to_string(),
        }
    }
}

/// Why shipped boot evidence cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BootLogError {
    #[error("tpm.boot.log is not standard base64: {0}")]
    Base64(String),
    #[error("tpm.boot.log: {0}")]
    Parse(#[from] EventLogError),
}

/// A shipped log, decoded and parsed.
pub fn decode_boot_log(e: &BootEvidence) -> Result<EventLog, BootLogError> {
    let bytes = B64
        .decode(&e.log)
        .map_err(|e| BootLogError::Base64(e.to_string()))?;
    Ok(EventLog::parse(&bytes)?)
}

/// The command line, as far as the log proves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", deny_unknown_fields)]
pub enum MeasuredCmdline {
    /// Measured (by the EFI stub as the digest of the shipped text, or by GRUB as text).
    Measured { cmdline: String },
    /// A command line was measured, but the shipped one does not hash to it.
    Mismatch { shipped: String, measured: String },
    /// No event measures a command line (a loader that measures nothing, or an old stub).
    NotMeasured,
}

impl MeasuredCmdline {
    /// The words of a measured command line (none when it is not proven).
    pub fn words(&self) -> Vec<&str> {
        match self {
            MeasuredCmdline::Measured { cmdline } => cmdline.split_whitespace().collect(),
            _ => Vec::new(),
        }
    }

    /// Whether `bpf` is among the LSMs the measured command line enables: `Some(false)` when
    /// it has an `lsm=` without `bpf` (the last `lsm=` wins, as in the kernel), `None` when it
    /// is not measured or names no `lsm=` (then the kernel's built-in default decides, which
    /// the log does not show).
    pub fn enables_bpf_lsm(&self) -> Option<bool> {
        let lsm = self.lsm()?.strip_prefix("lsm=")?;
        Some(lsm.split(',').any(|l| l == "bpf"))
    }

    /// The `lsm=` word that decides (the last one), when the command line is measured.
    pub fn lsm(&self) -> Option<&str> {
        self.words().into_iter().rfind(|w| w.starts_with("lsm="))
    }
}

/// Secure Boot as PCR 7 measured it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecureBootState {
    /// The `SecureBoot` variable's value (`None`: not measured, as on firmware without it).
    pub enabled: Option<bool>,
    /// `PK`, `KEK`, `db`, `dbx`: hex SHA-256 of each variable's data as measured.
    pub variables: BTreeMap<String, String>,
}

/// What one boot measured, as the policy judges it. Hex digests throughout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredBoot {
    /// PCR 4's applications before the kernel: shim, GRUB (none on a direct boot); every
    /// PCR 4 application on a boot whose loader measured files (see `loader_files`).
    pub loaders: Vec<String>,
    /// PCR 4's last application: the kernel's EFI stub image (`None`: nothing started, or a
    /// boot loader that reads the kernel itself, whose digest is then among `loader_files`).
    pub kernel: Option<String>,
    /// The files a boot loader read and measured into PCR 9 (GRUB: EV_IPL, the SHA-256 of the
    /// file; the event's text names the file but is not covered by the replay, so which one
    /// is the kernel is not proven): each must be an accepted kernel, initrd or boot file.
    #[serde(default)]
    pub loader_files: Vec<String>,
    /// PCR 9's initrds the EFI stub measured.
    pub initrds: Vec<String>,
    pub cmdline: MeasuredCmdline,
    pub secure_boot: SecureBootState,
    /// Events in the log, for the page.
    pub events: usize,
}

impl MeasuredBoot {
    /// Reads what `log` measured; `shipped_cmdline` is the daemon's `/proc/cmdline`.
    pub fn read(log: &EventLog, shipped_cmdline: &str) -> MeasuredBoot {
        let hex32 = |d: [u8; 32]| hex::encode(d);
        let mut apps: Vec<String> = log
            .events_of(4)
            .filter(|e| e.event_type == EV_EFI_BOOT_SERVICES_APPLICATION)
            .filter_map(LogEvent::sha256)
            .map(hex32)
            .collect();
        // GRUB 2.06 starts the kernel through the EFI handover, which no firmware measures:
        // the last application in PCR 4 is then GRUB, and the kernel is a file it read.
        let loader_files: Vec<String> = log
            .events_of(9)
            .filter(|e| e.event_type == EV_IPL)
            .filter_map(LogEvent::sha256)
            .map(hex32)
            .collect();
        let kernel = if loader_files.is_empty() {
            apps.pop()
        } else {
            None
        };
        let tagged = |id: u32| -> Vec<[u8; 32]> {
            log.events_of(9)
                .filter(|e| e.tagged().is_some_and(|(t, _)| t == id))
                .filter_map(LogEvent::sha256)
                .collect()
        };
        let initrds = tagged(LINUX_EFI_INITRD_EVENT_TAG_ID)
            .into_iter()
            .map(hex32)
            .collect();
        MeasuredBoot {
            loaders: apps,
            kernel,
            loader_files,
            initrds,
            cmdline: read_cmdline(
                log,
                &tagged(LINUX_EFI_LOAD_OPTIONS_EVENT_TAG_ID),
                shipped_cmdline,
            ),
            secure_boot: read_secure_boot(log),
            events: log.events.len(),
        }
    }
}

/// The stub's LoadOptions digest (the last one: the stub of the kernel that runs), checked
/// against the shipped text; else GRUB's last `kernel_cmdline:` whose digest is its text's.
fn read_cmdline(log: &EventLog, load_options: &[[u8; 32]], shipped: &str) -> MeasuredCmdline {
    if let Some(measured) = load_options.last() {
        return if efi_load_options_digest(shipped) == *measured {
            MeasuredCmdline::Measured {
                cmdline: shipped.to_string(),
            }
        } else {
            MeasuredCmdline::Mismatch {
                shipped: shipped.to_string(),
                measured: hex::encode(measured),
            }
        };
    }
    let grub = log
        .events_of(8)
        .filter(|e| e.event_type == EV_IPL)
        .filter_map(|e| {
            let text = std::str::from_utf8(&e.data).ok()?.trim_end_matches('\0');
            let cmdline = text.strip_prefix(GRUB_KERNEL_CMDLINE)?;
            let digest: [u8; 32] = Sha256::digest(cmdline.as_bytes()).into();
            (e.sha256() == Some(digest)).then(|| cmdline.to_string())
        })
        .last();
    match grub {
        // GRUB's text starts with the kernel's path (`/vmlinuz-... root=...`), which the
        // kernel does not show in /proc/cmdline.
        Some(cmdline) => MeasuredCmdline::Measured { cmdline },
        None => MeasuredCmdline::NotMeasured,
    }
}

/// EFI_GLOBAL_VARIABLE and EFI_IMAGE_SECURITY_DATABASE_GUID, as UEFI_VARIABLE_DATA's
/// VariableName carries them (the GUID's first three fields little-endian).
const EFI_GLOBAL_VARIABLE: [u8; 16] = guid(
    0x8be4df61,
    0x93ca,
    0x11d2,
    [0xaa, 0x0d, 0x00, 0xe0, 0x98, 0x03, 0x2b, 0x8c],
);
const EFI_IMAGE_SECURITY_DATABASE: [u8; 16] = guid(
    0xd719b2cb,
    0x3d3a,
    0x4596,
    [0xa3, 0xbc, 0xda, 0xd0, 0x0e, 0x67, 0x65, 0x6f],
);

const fn guid(a: u32, b: u16, c: u16, d: [u8; 8]) -> [u8; 16] {
    let a = a.to_le_bytes();
    let b = b.to_le_bytes();
    let c = c.to_le_bytes();
    [
        a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d[0], d[1], d[2], d[3], d[4], d[5], d[6],
        d[7],
    ]
}

/// One UEFI_VARIABLE_DATA: (VariableName GUID, UnicodeName, VariableData).
pub fn parse_variable(data: &[u8]) -> Option<([u8; 16], String, &[u8])> {
    let guid: [u8; 16] = data.get(0..16)?.try_into().ok()?;
    let name_len = usize::try_from(u64::from_le_bytes(data.get(16..24)?.try_into().ok()?)).ok()?;
    let data_len = usize::try_from(u64::from_le_bytes(data.get(24..32)?.try_into().ok()?)).ok()?;
    let name_end = 32usize.checked_add(name_len.checked_mul(2)?)?;
    let units: Vec<u16> = data
        .get(32..name_end)?
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    let name = String::from_utf16(&units).ok()?;
    let value = data.get(name_end..name_end.checked_add(data_len)?)?;
    Some((guid, name, value))
}

/// The UEFI_VARIABLE_DATA an EV_EFI_VARIABLE_DRIVER_CONFIG event carries (for tests and for
/// a reader who builds a log).
pub fn encode_variable(guid: [u8; 16], name: &str, value: &[u8]) -> Vec<u8> {
    let units: Vec<u16> = name.encode_utf16().collect();
    let mut out = guid.to_vec();
    out.extend((units.len() as u64).to_le_bytes());
    out.extend((value.len() as u64).to_le_bytes());
    for u in units {
        out.extend(u.to_le_bytes());
    }
    out.extend(value);
    out
}

/// The GUID a Secure Boot variable lives under.
pub fn secure_boot_variable_guid(name: &str) -> [u8; 16] {
    match name {
        "db" | "dbx" => EFI_IMAGE_SECURITY_DATABASE,
        _ => EFI_GLOBAL_VARIABLE,
    }
}

/// PCR 7's variables, each taken only where the event's digest is the hash of its data (the
/// PC Client profile measures the whole UEFI_VARIABLE_DATA), so the values read are the ones
/// extended. A variable measured twice keeps its last value.
fn read_secure_boot(log: &EventLog) -> SecureBootState {
    let mut state = SecureBootState::default();
    for e in log.events_of(7) {
        if e.event_type != EV_EFI_VARIABLE_DRIVER_CONFIG {
            continue;
        }
        let digest: [u8; 32] = Sha256::digest(&e.data).into();
        if e.sha256() != Some(digest) {
            continue;
        }
        let Some((guid, name, value)) = parse_variable(&e.data) else {
            continue;
        };
        if guid != secure_boot_variable_guid(&name) {
            continue;
        }
        match name.as_str() {
            "SecureBoot" => state.enabled = Some(value.first().is_some_and(|v| *v == 1)),
            "PK" | "KEK" | "db" | "dbx" => {
                let d: [u8; 32] = Sha256::digest(value).into();
                state.variables.insert(name, hex::encode(d));
            }
            _ => {}
        }
    }
    state
}

/// The Authenticode SHA-256 of a PE image: what UEFI firmware (and shim) log into PCR 4 for
/// an application they start, so what `[policy.boot] kernels` and `loaders` list. A kernel
/// on a disk is a PE image through its EFI stub (Debian's `vmlinuz`, shim, GRUB).
pub fn pe_image_sha256(image: &[u8]) -> Result<[u8; 32], String> {
    use object::read::pe::{PeFile32, PeFile64};
    let mut h = Sha256::new();
    let done = match PeFile64::parse(image) {
        Ok(pe) => authenticode::authenticode_digest(&pe, &mut h),
        Err(e64) => match PeFile32::parse(image) {
            Ok(pe) => authenticode::authenticode_digest(&pe, &mut h),
            Err(_) => return Err(format!("not a PE image: {e64}")),
        },
    };
    done.map_err(|e| format!("PE image offsets out of range: {e}"))?;
    Ok(h.finalize().into())
}

/// A boot PCR whose quoted value is not the log's replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcrDifference {
    pub pcr: u8,
    /// `None`: the quote does not cover it.
    pub quoted: Option<[u8; 32]>,
    pub replayed: [u8; 32],
}

/// How the log's replay compares with the quoted PCRs 0-9: the PCRs that differ (or that
/// the quote lacks).
pub fn replay_differences(
    log: &EventLog,
    quoted: &PcrValues,
) -> Result<Vec<PcrDifference>, EventLogError> {
    let replayed = log.replay_sha256()?;
    Ok(BOOT_LOG_PCRS
        .filter_map(|pcr| {
            let replayed = replayed.get(pcr).copied().unwrap_or_default();
            let quoted = quoted.get(pcr).copied();
            (quoted != Some(replayed)).then_some(PcrDifference {
                pcr,
                quoted,
                replayed,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::eventlog::{EV_EVENT_TAG, LogEvent};
    use super::*;

    /// A log as OVMF writes it for a direct kernel boot with Secure Boot enabled.
    fn log(cmdline: &str, secure_boot: u8) -> EventLog {
        let mut log = EventLog::new_sha256();
        let ev = |pcr: u32, event_type: u32, data: Vec<u8>, digest: [u8; 32]| LogEvent {
            offset: 0,
            pcr,
            event_type,
            digests: vec![(super::super::eventlog::TPM_ALG_SHA256, digest.to_vec())],
            data,
        };
        let sha = |d: &[u8]| -> [u8; 32] { Sha256::digest(d).into() };
        for (name, value) in [
            ("SecureBoot", vec![secure_boot]),
            ("PK", b"pk".to_vec()),
            ("db", b"db".to_vec()),
        ] {
            let data = encode_variable(secure_boot_variable_guid(name), name, &value);
            let d = sha(&data);
            log.events
                .push(ev(7, EV_EFI_VARIABLE_DRIVER_CONFIG, data, d));
        }
        log.events.push(ev(
            4,
            EV_EFI_BOOT_SERVICES_APPLICATION,
            vec![0; 8],
            [0x51; 32],
        ));
        log.events.push(ev(
            4,
            EV_EFI_BOOT_SERVICES_APPLICATION,
            vec![0; 8],
            [0x4e; 32],
        ));
        let tag = |id: u32| {
            let mut d = id.to_le_bytes().to_vec();
            d.extend(4u32.to_le_bytes());
            d.extend(b"tag\0");
            d
        };
        log.events.push(ev(
            9,
            EV_EVENT_TAG,
            tag(LINUX_EFI_INITRD_EVENT_TAG_ID),
            [0x1d; 32],
        ));
        log.events.push(ev(
            9,
            EV_EVENT_TAG,
            tag(LINUX_EFI_LOAD_OPTIONS_EVENT_TAG_ID),
            efi_load_options_digest(cmdline),
        ));
        log
    }

    #[test]
    fn reads_the_components_the_log_measured() {
        let cmdline = "console=ttyS0 lsm=lockdown,bpf ima_policy=tcb";
        let m = MeasuredBoot::read(&log(cmdline, 1), cmdline);
        assert_eq!(m.loaders, vec![hex::encode([0x51; 32])]);
        assert_eq!(m.kernel, Some(hex::encode([0x4e; 32])));
        assert_eq!(m.initrds, vec![hex::encode([0x1d; 32])]);
        assert_eq!(
            m.cmdline,
            MeasuredCmdline::Measured {
                cmdline: cmdline.into()
            }
        );
        assert_eq!(m.cmdline.enables_bpf_lsm(), Some(true));
        assert_eq!(m.secure_boot.enabled, Some(true));
        assert_eq!(
            m.secure_boot.variables.keys().collect::<Vec<_>>(),
            vec!["PK", "db"]
        );
        assert_eq!(
            m.secure_boot.variables["db"],
            hex::encode(Sha256::digest(b"db"))
        );
    }

    #[test]
    fn a_shipped_command_line_other_than_the_measured_one_is_a_mismatch() {
        let m = MeasuredBoot::read(&log("lsm=bpf", 0), "lsm=lockdown");
        assert!(matches!(m.cmdline, MeasuredCmdline::Mismatch { .. }));
        assert_eq!(m.cmdline.enables_bpf_lsm(), None);
        assert_eq!(m.secure_boot.enabled, Some(false));
    }

    #[test]
    fn the_last_lsm_list_decides() {
        let m = |c: &str| MeasuredCmdline::Measured { cmdline: c.into() };
        assert_eq!(m("quiet").enables_bpf_lsm(), None);
        assert_eq!(m("lsm=bpf lsm=lockdown").enables_bpf_lsm(), Some(false));
        assert_eq!(m("lsm=lockdown lsm=yama,bpf").enables_bpf_lsm(), Some(true));
        assert_eq!(m("lsm=bpfx").enables_bpf_lsm(), Some(false));
        assert_eq!(MeasuredCmdline::NotMeasured.enables_bpf_lsm(), None);
    }

    #[test]
    fn a_variable_whose_digest_is_not_its_data_is_not_read() {
        let mut l = log("x", 1);
        // The SecureBoot event's data edited to 0, its digest left: what was extended says 1.
        let sb = l.events.iter_mut().find(|e| e.pcr == 7).unwrap();
        let last = sb.data.len() - 1;
        sb.data[last] = 0;
        assert_eq!(MeasuredBoot::read(&l, "x").secure_boot.enabled, None);
    }

    #[test]
    fn grub_kernel_cmdline_is_read_when_its_digest_is_its_text() {
        let mut l = EventLog::new_sha256();
        let text = "/vmlinuz-6.1 root=UUID=x ro lsm=lockdown,yama,bpf";
        let mut data = format!("{GRUB_KERNEL_CMDLINE}{text}").into_bytes();
        data.push(0);
        l.events.push(LogEvent {
            offset: 0,
            pcr: 8,
            event_type: EV_IPL,
            digests: vec![(
                super::super::eventlog::TPM_ALG_SHA256,
                Sha256::digest(text.as_bytes()).to_vec(),
            )],
            data: data.clone(),
        });
        l.events.push(LogEvent {
            offset: 0,
            pcr: 4,
            event_type: EV_EFI_BOOT_SERVICES_APPLICATION,
            digests: vec![(super::super::eventlog::TPM_ALG_SHA256, vec![0x67; 32])],
            data: vec![0; 8],
        });
        // GRUB's file reads (the kernel among them, by its file SHA-256; the path is a label
        // the replay does not cover).
        for (path, digest) in [("/boot/grub/grub.cfg", 0x0c), ("/vmlinuz-6.1", 0x4b)] {
            l.events.push(LogEvent {
                offset: 0,
                pcr: 9,
                event_type: EV_IPL,
                digests: vec![(super::super::eventlog::TPM_ALG_SHA256, vec![digest; 32])],
                data: format!("{path}\0").into_bytes(),
            });
        }
        let m = MeasuredBoot::read(&l, "whatever the daemon says");
        assert_eq!(m.cmdline.words().last(), Some(&"lsm=lockdown,yama,bpf"));
        // GRUB is no kernel: the kernel is among the files it read.
        assert_eq!(m.kernel, None);
        assert_eq!(m.loaders, vec![hex::encode([0x67; 32])]);
        assert_eq!(
            m.loader_files,
            vec![hex::encode([0x0c; 32]), hex::encode([0x4b; 32])]
        );
        // The same text with another digest proves nothing.
        l.events[0].digests[0].1 = vec![0; 32];
        assert_eq!(
            MeasuredBoot::read(&l, "x").cmdline,
            MeasuredCmdline::NotMeasured
        );
    }

    #[test]
    fn evidence_round_trips_and_replays() {
        let l = log("c", 1);
        let e = BootEvidence::new(&l.to_bytes(), "c\n");
        assert_eq!(e.cmdline, "c");
        let back = decode_boot_log(&e).unwrap();
        assert_eq!(back.events.len(), l.events.len());
        let replayed = l.replay_sha256().unwrap();
        assert!(replay_differences(&back, &replayed).unwrap().is_empty());
        let mut quoted = replayed.clone();
        quoted.insert(9, [0; 32]);
        let d = replay_differences(&back, &quoted).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].pcr, 9);
        assert!(
            decode_boot_log(&BootEvidence {
                log: "!".into(),
                cmdline: String::new()
            })
            .is_err()
        );
    }
}
