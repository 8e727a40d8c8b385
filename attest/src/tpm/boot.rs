//! What a boot's event log says was measured, read so that a policy can judge it by sets of
//! accepted values (issue 41) instead of one reference value per PCR.
//!
//! Only what the replay covers counts: an event's data is not extended into any PCR, only its
//! digest is, so a component is named by its digest, and text is read from an event only where
//! the digest is the hash of that text (the EFI variables of PCR 7).
//! The Linux EFI stub measures the command line as a digest alone; the daemon ships the
//! command line its kernel runs with, and it is taken as measured only when it hashes to
//! that digest.
//!
//! - PCR 4: each UEFI application started, in order (shim, GRUB, the kernel's EFI stub; a
//!   direct boot starts the kernel alone), by its PE image's Authenticode hash.
//! - PCR 9: the EFI stub's initrd and LoadOptions (command line), and the files a boot
//!   loader read (GRUB: EV_IPL, the file's SHA-256).
//! - PCR 7, EV_EFI_VARIABLE_DRIVER_CONFIG: `SecureBoot`, `PK`, `KEK`, `db`, `dbx`.
//!
//! Event types and labels are not covered by the replay: PCRs 4 and 9 are read as lists of
//! digests, each of which the policy must accept (see [`MeasuredBoot`]). GRUB's PCR 8 text
//! (`kernel_cmdline: ...`) is not read: GRUB hashes the text after the prefix, so the prefix
//! is a label too.

use std::collections::BTreeMap;

use base64::{Engine as _, engine::general_purpose::STANDARD as B64};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::eventlog::{
    EV_EFI_VARIABLE_DRIVER_CONFIG, EventLog, EventLogError, LINUX_EFI_INITRD_EVENT_TAG_ID,
    LINUX_EFI_LOAD_OPTIONS_EVENT_TAG_ID, LogEvent, efi_load_options_digest,
};
use super::pcr::PcrValues;

/// Where Linux exposes the firmware's event log.
pub const EVENT_LOG_PATH: &str = "/sys/kernel/security/tpm0/binary_bios_measurements";

/// The PCRs a boot log is replayed against: the firmware's (0-7), the boot loader's (8) and
/// the files it or the EFI stub loaded (9). PCR 10 on is the running system's (IMA).
pub const BOOT_LOG_PCRS: std::ops::RangeInclusive<u8> = 0..=9;

/// EV_IPL: what a boot loader measures (GRUB: its commands and the kernel command line).
pub const EV_IPL: u32 = 0x0000_000d;

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
    /// The shipped command line is proven by `by`'s measurement of it.
    Measured {
        cmdline: String,
        /// Absent in readings stored before GRUB's command line was read: those were the
        /// stub's.
        #[serde(default)]
        by: CmdlineWitness,
    },
    /// An event says it is the stub's LoadOptions, but the shipped command line does not
    /// hash to it (or to any PCR 9 measurement).
    Mismatch { shipped: String, measured: String },
    /// No PCR 9 measurement is the shipped command line's (a boot loader that starts the
    /// kernel without LoadOptions, as GRUB 2.06 does, or an old stub).
    NotMeasured,
}

/// What measured the command line the verifier takes as proven.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CmdlineWitness {
    /// The kernel's EFI stub, into PCR 9: the SHA-256 of the UCS-2 LoadOptions it was
    /// started with (OVMF's direct kernel boot, systemd-boot, GRUB 2.12).
    #[default]
    EfiStub,
    /// GRUB's `linux` command, into PCR 8: the SHA-256 of the text after `BOOT_IMAGE=`
    /// (GRUB 2.06, which starts the kernel through the EFI handover, so the stub measures
    /// nothing). See [`grub_kernel_cmdline`] for when that text is the booted kernel's.
    Grub,
}

/// The words of a command line as the kernel splits them (`next_arg`): whitespace outside
/// double quotes separates, the quotes are dropped, and `--` ends the kernel's part (what
/// follows goes to init, and a required `lsm=` there would enable nothing).
pub fn cmdline_words(cmdline: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_quotes = false;
    let mut started = false;
    for c in cmdline.chars() {
        match c {
            '"' => {
                in_quotes = !in_quotes;
                started = true;
            }
            c if c.is_whitespace() && !in_quotes => {
                if started {
                    if word == "--" {
                        return words;
                    }
                    words.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            c => {
                word.push(c);
                started = true;
            }
        }
    }
    if started && word != "--" {
        words.push(word);
    }
    words
}

impl MeasuredCmdline {
    /// The kernel's words of a measured command line (none when it is not proven).
    pub fn words(&self) -> Vec<String> {
        match self {
            MeasuredCmdline::Measured { cmdline, .. } => cmdline_words(cmdline),
            _ => Vec::new(),
        }
    }

    /// Whether `bpf` is among the LSMs the measured command line enables: `Some(false)` when
    /// it has an `lsm=` without `bpf` (the last `lsm=` wins, as in the kernel), `None` when it
    /// is not measured or names no `lsm=` (then the kernel's built-in default decides, which
    /// the log does not show).
    pub fn enables_bpf_lsm(&self) -> Option<bool> {
        let lsm = self.lsm()?;
        let list = lsm.strip_prefix("lsm=")?;
        Some(list.split(',').any(|l| l == "bpf"))
    }

    /// The `lsm=` word that decides (the last one), when the command line is measured.
    pub fn lsm(&self) -> Option<String> {
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
///
/// The replay proves each event's digest, in order per PCR, and nothing else: an event's
/// type, its tag and its text are labels a forged log may change. So every measurement in
/// PCRs 4 and 9 that is not self-describing (whose digest is not the hash of its own data, as
/// a separator's or an action string's is) counts, whatever it says it is, and the policy
/// accepts each by its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredBoot {
    /// PCR 4, in order: the UEFI applications started (shim, GRUB, a kernel's EFI stub;
    /// a direct boot starts the kernel alone).
    pub applications: Vec<String>,
    /// PCR 9, in order: the EFI stub's initrd and command line, and the files a boot loader
    /// read (GRUB: its config, modules, the kernel and the initrd).
    pub loaded: Vec<String>,
    /// Of `loaded`, those labelled as the EFI stub's initrd (for a reader; not proven).
    pub initrd_labelled: Vec<String>,
    pub cmdline: MeasuredCmdline,
    pub secure_boot: SecureBootState,
    /// Events in the log, for the page.
    pub events: usize,
}

/// Whether an event's digest is the hash of its own data (then its data is what was
/// measured, and reading it is safe).
fn self_describing(e: &LogEvent) -> bool {
    let d: [u8; 32] = Sha256::digest(&e.data).into();
    e.sha256() == Some(d)
}

/// The measurements of `pcr` that are not self-describing, in order.
fn measurements(log: &EventLog, pcr: u32) -> Vec<[u8; 32]> {
    log.events_of(pcr)
        .filter(|e| e.event_type != super::eventlog::EV_NO_ACTION && !self_describing(e))
        .filter_map(LogEvent::sha256)
        .collect()
}

impl MeasuredBoot {
    /// Reads what `log` measured; `shipped_cmdline` is the daemon's `/proc/cmdline`.
    pub fn read(log: &EventLog, shipped_cmdline: &str) -> MeasuredBoot {
        let hex32 = |d: &[u8; 32]| hex::encode(d);
        let loaded = measurements(log, 9);
        let labelled = |id: u32| -> Vec<[u8; 32]> {
            log.events_of(9)
                .filter(|e| e.tagged().is_some_and(|(t, _)| t == id))
                .filter_map(LogEvent::sha256)
                .collect()
        };
        let cmdline_digest = efi_load_options_digest(shipped_cmdline);
        // GRUB's PCR 8 is read (every string hashed again) only where the stub measured none.
        let cmdline = if loaded.contains(&cmdline_digest) {
            MeasuredCmdline::Measured {
                cmdline: shipped_cmdline.to_string(),
                by: CmdlineWitness::EfiStub,
            }
        } else if let Some(measured) = labelled(LINUX_EFI_LOAD_OPTIONS_EVENT_TAG_ID).last() {
            MeasuredCmdline::Mismatch {
                shipped: shipped_cmdline.to_string(),
                measured: hex32(measured),
            }
        } else {
            match grub_kernel_cmdline(log) {
                Some(text) if shipped_cmdline.strip_prefix(GRUB_BOOT_IMAGE) == Some(&text) => {
                    MeasuredCmdline::Measured {
                        cmdline: shipped_cmdline.to_string(),
                        by: CmdlineWitness::Grub,
                    }
                }
                Some(text) => MeasuredCmdline::Mismatch {
                    shipped: shipped_cmdline.to_string(),
                    measured: hex::encode(Sha256::digest(text.as_bytes())),
                },
                None => MeasuredCmdline::NotMeasured,
            }
        };
        MeasuredBoot {
            applications: measurements(log, 4).iter().map(hex32).collect(),
            loaded: loaded.iter().map(hex32).collect(),
            initrd_labelled: labelled(LINUX_EFI_INITRD_EVENT_TAG_ID)
                .iter()
                .map(hex32)
                .collect(),
            cmdline,
            secure_boot: read_secure_boot(log),
            events: log.events.len(),
        }
    }

    /// The digest of the measured command line, when the stub proved it: one of `loaded`
    /// (GRUB's is in PCR 8, which `loaded` does not hold).
    pub fn cmdline_digest(&self) -> Option<String> {
        match &self.cmdline {
            MeasuredCmdline::Measured {
                cmdline,
                by: CmdlineWitness::EfiStub,
            } => Some(hex::encode(efi_load_options_digest(cmdline))),
            _ => None,
        }
    }
}

/// What GRUB puts before the text it measured when it hands the kernel its command line.
const GRUB_BOOT_IMAGE: &str = "BOOT_IMAGE=";

/// The labels GRUB gives its PCR 8 measurements; each hashes only the text after it.
const GRUB_STRING_LABELS: [&str; 3] = ["grub_cmd: ", "kernel_cmdline: ", "module_cmdline: "];

/// The commands that may follow the kernel's command line in PCR 8 without changing what
/// boots or with what arguments (Debian's menu entry echoes and loads the initrd after
/// `linux`). Anything else there could start something other than the kernel `linux`
/// loaded, so the command line is then not proven.
const GRUB_AFTER_LINUX: [&str; 5] = ["initrd", "echo", "insmod", "set", "boot"];

/// GRUB's commands that load a kernel for `boot`: exactly one `linux` (or `linuxefi`) may run,
/// and none of the others anywhere. A failed `linux` does not unload a kernel loaded before
/// it (GRUB keeps the loader it set), so with two the one that boots is not known; and
/// `chainloader` and the rest set a loader of their own.
const GRUB_LINUX: [&str; 2] = ["linux", "linuxefi"];
const GRUB_OTHER_LOADERS: [&str; 12] = [
    "chainloader",
    "linux16",
    "multiboot",
    "multiboot2",
    "kfreebsd",
    "knetbsd",
    "kopenbsd",
    "xnu_kernel",
    "xnu_kernel64",
    "appleloader",
    "exit",
    "fwsetup",
];

/// The kernel command line GRUB measured for the kernel it booted, when PCR 8 proves it:
/// the text after `BOOT_IMAGE=` in `/proc/cmdline`.
///
/// GRUB measures into PCR 8 the SHA-256 of every command line it runs (the expanded words
/// joined by spaces, whatever the command, even one it does not know) and, within `linux`,
/// the kernel's command line without `BOOT_IMAGE=`. Labels are not proven, so this needs:
/// - every PCR 8 measurement to read back (its text after one of GRUB's labels hashes to its
///   digest): then every string GRUB measured is known, in order;
/// - exactly one `linux`/`linuxefi` command, and no other loader command
///   ([`GRUB_OTHER_LOADERS`]) anywhere;
/// - that command to be followed by a measurement that starts with the kernel path it was
///   given: its own kernel command line (nothing else is measured into PCR 8 while it runs;
///   a `linux` that failed before measuring it is followed by something else, and then no
///   kernel was loaded);
/// - only [`GRUB_AFTER_LINUX`] commands after that.
pub fn grub_kernel_cmdline(log: &EventLog) -> Option<String> {
    let mut texts = Vec::new();
    for e in log
        .events_of(8)
        .filter(|e| e.event_type != super::eventlog::EV_NO_ACTION)
    {
        let digest = e.sha256()?;
        let data = e.data.strip_suffix(&[0]).unwrap_or(&e.data);
        let text = GRUB_STRING_LABELS.iter().find_map(|label| {
            let text = data.strip_prefix(label.as_bytes())?;
            (<[u8; 32]>::from(Sha256::digest(text)) == digest).then_some(text)
        })?;
        texts.push(String::from_utf8(text.to_vec()).ok()?);
    }
    let is = |t: &str, set: &[&str]| set.contains(&t.split(' ').next().unwrap_or_default());
    let mut linux = texts
        .iter()
        .enumerate()
        .filter(|(_, t)| is(t, &GRUB_LINUX))
        .map(|(i, _)| i);
    let (Some(linux), None) = (linux.next(), linux.next()) else {
        return None;
    };
    if texts.iter().any(|t| is(t, &GRUB_OTHER_LOADERS)) {
        return None;
    }
    let cmdline = texts.get(linux + 1)?;
    if cmdline.split(' ').next() != texts[linux].split(' ').nth(1) {
        return None;
    }
    texts[linux + 2..]
        .iter()
        .all(|t| is(t, &GRUB_AFTER_LINUX))
        .then(|| cmdline.clone())
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

/// The key databases PCR 7 measures whose contents a policy may pin (`secure_boot_variables`).
pub const SECURE_BOOT_DATABASES: [&str; 4] = ["PK", "KEK", "db", "dbx"];

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
        if !self_describing(e) {
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
            n if SECURE_BOOT_DATABASES.contains(&n) => {
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
    use super::super::eventlog::{EV_EFI_BOOT_SERVICES_APPLICATION, LogEvent};
    use super::*;

    /// A log as OVMF writes it for a direct kernel boot with Secure Boot enabled.
    fn log(cmdline: &str, secure_boot: u8) -> EventLog {
        let mut log = EventLog::new_sha256();
        let ev = LogEvent::sha256_event;
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
        log.events.push(LogEvent::linux_tag(
            LINUX_EFI_INITRD_EVENT_TAG_ID,
            b"tag\0",
            [0x1d; 32],
        ));
        log.events.push(LogEvent::linux_tag(
            LINUX_EFI_LOAD_OPTIONS_EVENT_TAG_ID,
            b"tag\0",
            efi_load_options_digest(cmdline),
        ));
        log
    }

    #[test]
    fn reads_the_components_the_log_measured() {
        let cmdline = "console=ttyS0 lsm=lockdown,bpf ima_policy=tcb";
        let m = MeasuredBoot::read(&log(cmdline, 1), cmdline);
        assert_eq!(
            m.applications,
            vec![hex::encode([0x51; 32]), hex::encode([0x4e; 32])]
        );
        assert_eq!(m.initrd_labelled, vec![hex::encode([0x1d; 32])]);
        assert_eq!(
            m.loaded,
            vec![
                hex::encode([0x1d; 32]),
                hex::encode(efi_load_options_digest(cmdline))
            ]
        );
        assert_eq!(m.cmdline_digest().as_deref(), Some(m.loaded[1].as_str()));
        assert_eq!(
            m.cmdline,
            MeasuredCmdline::Measured {
                cmdline: cmdline.into(),
                by: CmdlineWitness::EfiStub
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
        let m = |c: &str| MeasuredCmdline::Measured {
            cmdline: c.into(),
            by: CmdlineWitness::EfiStub,
        };
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
    fn labels_do_not_decide_what_counts() {
        let cmdline = "lsm=bpf";
        let mut l = log(cmdline, 1);
        // A forger relabels the second application as a driver, and the initrd as an action:
        // both still count, by digest.
        l.events
            .iter_mut()
            .filter(|e| e.pcr == 4)
            .for_each(|e| e.event_type = super::super::eventlog::EV_EFI_BOOT_SERVICES_DRIVER);
        let initrd = l
            .events
            .iter_mut()
            .find(|e| e.pcr == 9 && e.sha256() == Some([0x1d; 32]))
            .unwrap();
        initrd.event_type = super::super::eventlog::EV_EFI_ACTION;
        let m = MeasuredBoot::read(&l, cmdline);
        assert_eq!(m.applications.len(), 2);
        assert_eq!(m.loaded.len(), 2);
        // A self-describing event (its digest is its data's) is not a measurement.
        l.events.push(LogEvent {
            offset: 0,
            pcr: 4,
            event_type: super::super::eventlog::EV_EFI_ACTION,
            digests: vec![(
                super::super::eventlog::TPM_ALG_SHA256,
                Sha256::digest(b"Calling EFI Application from Boot Option").to_vec(),
            )],
            data: b"Calling EFI Application from Boot Option".to_vec(),
        });
        assert_eq!(MeasuredBoot::read(&l, cmdline).applications.len(), 2);
    }

    /// A GRUB 2.06 boot's PCR 8, as Debian's signed GRUB measured it in a VM (shim, GRUB,
    /// `linux`, `initrd`, `boot`): each string hashed without its label or NUL.
    fn grub_log(strings: &[(&str, &str)]) -> EventLog {
        let mut log = EventLog::new_sha256();
        for (label, text) in strings {
            let data = [label.as_bytes(), text.as_bytes(), b"\0"].concat();
            let d: [u8; 32] = Sha256::digest(text.as_bytes()).into();
            log.events.push(LogEvent::sha256_event(8, EV_IPL, data, d));
        }
        log
    }

    const GRUB_BOOT: [(&str, &str); 6] = [
        ("grub_cmd: ", "source (hd0,gpt1)/EFI/debian/grub.cfg"),
        (
            "grub_cmd: ",
            "linux /vmlinuz console=ttyS0 lsm=lockdown,bpf",
        ),
        (
            "kernel_cmdline: ",
            "/vmlinuz console=ttyS0 lsm=lockdown,bpf",
        ),
        ("grub_cmd: ", "echo Loading initial ramdisk ..."),
        ("grub_cmd: ", "initrd /initrd.gz"),
        ("grub_cmd: ", "boot"),
    ];

    #[test]
    fn grubs_kernel_command_line_is_read_from_pcr_8() {
        let log = grub_log(&GRUB_BOOT);
        let shipped = "BOOT_IMAGE=/vmlinuz console=ttyS0 lsm=lockdown,bpf";
        let m = MeasuredBoot::read(&log, shipped);
        assert_eq!(
            m.cmdline,
            MeasuredCmdline::Measured {
                cmdline: shipped.into(),
                by: CmdlineWitness::Grub
            }
        );
        assert_eq!(m.cmdline.enables_bpf_lsm(), Some(true));
        // GRUB's is in PCR 8, so it excuses no PCR 9 measurement.
        assert_eq!(m.cmdline_digest(), None);
        // A host that says it booted with another command line is caught.
        let lie = MeasuredBoot::read(&log, "BOOT_IMAGE=/vmlinuz console=ttyS0 lsm=bpf");
        assert!(
            matches!(lie.cmdline, MeasuredCmdline::Mismatch { .. }),
            "{lie:?}"
        );
    }

    #[test]
    fn grubs_command_line_is_not_proven_when_pcr_8_leaves_room_for_another() {
        let shipped = "BOOT_IMAGE=/vmlinuz console=ttyS0 lsm=lockdown,bpf";
        let not_proven = |strings: &[(&str, &str)], why: &str| {
            let m = MeasuredBoot::read(&grub_log(strings), shipped);
            assert_eq!(m.cmdline, MeasuredCmdline::NotMeasured, "{why}");
        };
        // Something that could start another image after `linux`.
        let mut chain = GRUB_BOOT.to_vec();
        chain.insert(5, ("grub_cmd: ", "chainloader /vmlinuz lsm=lockdown"));
        not_proven(&chain, "chainloader after linux");
        // A measurement whose text does not hash to its digest: what it was is unknown.
        let mut log = grub_log(&GRUB_BOOT);
        log.events[3].data = b"grub_cmd: echo harmless\0".to_vec();
        let m = MeasuredBoot::read(&log, shipped);
        assert_eq!(m.cmdline, MeasuredCmdline::NotMeasured, "unreadable PCR 8");
        // A `linux` that failed before measuring its command line (a command typed to look
        // like one follows it): the path does not match, so nothing is proven.
        not_proven(
            &[
                ("grub_cmd: ", "linux /missing lsm=lockdown"),
                ("grub_cmd: ", "/vmlinuz console=ttyS0 lsm=lockdown,bpf"),
                ("grub_cmd: ", "boot"),
            ],
            "a linux that failed",
        );
        // A failed `linux` keeps the kernel loaded before it: with the look-alike typed after
        // the failed one, the last `linux` would seem proven while the first one boots. Two
        // `linux` commands prove nothing.
        let forged = "BOOT_IMAGE=/x console=ttyS0 lsm=lockdown,bpf";
        let m = MeasuredBoot::read(
            &grub_log(&[
                ("grub_cmd: ", "linux /vmlinuz console=ttyS0 lsm=lockdown"),
                ("kernel_cmdline: ", "/vmlinuz console=ttyS0 lsm=lockdown"),
                ("grub_cmd: ", "linux /x"),
                ("grub_cmd: ", "/x console=ttyS0 lsm=lockdown,bpf"),
                ("grub_cmd: ", "boot"),
            ]),
            forged,
        );
        assert_eq!(
            m.cmdline,
            MeasuredCmdline::NotMeasured,
            "two linux commands"
        );
        // Another loader anywhere, even before `linux`.
        let mut chain_first = GRUB_BOOT.to_vec();
        chain_first.insert(1, ("grub_cmd: ", "chainloader /EFI/other.efi"));
        not_proven(&chain_first, "chainloader before linux");
        // Labels decide nothing: the command line relabelled as a command still counts.
        let mut relabelled = GRUB_BOOT.to_vec();
        relabelled[2].0 = "grub_cmd: ";
        let m = MeasuredBoot::read(&grub_log(&relabelled), shipped);
        assert!(
            matches!(m.cmdline, MeasuredCmdline::Measured { .. }),
            "{m:?}"
        );
    }

    #[test]
    fn a_reading_stored_before_grub_was_read_is_the_stubs() {
        let old: MeasuredCmdline =
            serde_json::from_str(r#"{"state":"measured","cmdline":"lsm=bpf"}"#).unwrap();
        assert_eq!(
            old,
            MeasuredCmdline::Measured {
                cmdline: "lsm=bpf".into(),
                by: CmdlineWitness::EfiStub
            }
        );
    }

    #[test]
    fn words_split_as_the_kernel_does() {
        assert_eq!(
            cmdline_words("a  b=\"c d\" lsm=bpf -- lsm=x init-only"),
            vec!["a", "b=c d", "lsm=bpf"]
        );
        let m = MeasuredCmdline::Measured {
            cmdline: "lsm=lockdown -- lsm=bpf".into(),
            by: CmdlineWitness::EfiStub,
        };
        assert_eq!(m.enables_bpf_lsm(), Some(false));
        assert_eq!(cmdline_words("x=\"--\" y"), vec!["x=--", "y"]);
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
