//! The firmware's event log in the TCG PC Client crypto-agile format
//! (`/sys/kernel/security/tpm0/binary_bios_measurements`, TCG PC Client Platform Firmware
//! Profile §10), and its replay into the SHA-256 bank of PCRs 0-23.
//!
//! The log starts with one TCG_PCR_EVENT in the old SHA-1 format, the Spec ID event
//! ("Spec ID Event03"), which lists the banks and their digest sizes; every later event is a
//! TCG_PCR_EVENT2 whose TPML_DIGEST_VALUES carries one digest per listed bank. The digest
//! sizes come only from the Spec ID event: an event naming an algorithm it does not list
//! cannot be skipped, so it is an error. All integers are little-endian (the firmware's),
//! unlike the TPM's own structures.
//!
//! What a quote of PCRs 0-9 covers on a UEFI boot, and so what an operator's `[policy.boot]`
//! reference values pin: the firmware and its configuration (0-3, 5-7), the kernel's PE image
//! as the firmware loaded it (4, EV_EFI_BOOT_SERVICES_APPLICATION) and, from the Linux EFI
//! stub, the initrd and the command line (9, EV_EVENT_TAG).

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};
use thiserror::Error;

use super::error::TpmError;
use super::marshal::Reader;
use super::pcr::PcrValues;

/// TPM_ALG_SHA1 / TPM_ALG_SHA256, as the Spec ID event and TPML_DIGEST_VALUES name banks.
pub const TPM_ALG_SHA1: u16 = 0x0004;
pub const TPM_ALG_SHA256: u16 = 0x000b;

/// Event types (PC Client PFP §10.4.1) a UEFI boot of Linux logs.
pub const EV_POST_CODE: u32 = 0x0000_0001;
pub const EV_NO_ACTION: u32 = 0x0000_0003;
pub const EV_SEPARATOR: u32 = 0x0000_0004;
pub const EV_ACTION: u32 = 0x0000_0005;
pub const EV_EVENT_TAG: u32 = 0x0000_0006;
pub const EV_S_CRTM_VERSION: u32 = 0x0000_0008;
pub const EV_EFI_VARIABLE_DRIVER_CONFIG: u32 = 0x8000_0001;
pub const EV_EFI_VARIABLE_BOOT: u32 = 0x8000_0002;
pub const EV_EFI_BOOT_SERVICES_APPLICATION: u32 = 0x8000_0003;
pub const EV_EFI_BOOT_SERVICES_DRIVER: u32 = 0x8000_0004;
pub const EV_EFI_RUNTIME_SERVICES_DRIVER: u32 = 0x8000_0005;
pub const EV_EFI_GPT_EVENT: u32 = 0x8000_0006;
pub const EV_EFI_ACTION: u32 = 0x8000_0007;
pub const EV_EFI_PLATFORM_FIRMWARE_BLOB: u32 = 0x8000_0008;
pub const EV_EFI_HANDOFF_TABLES: u32 = 0x8000_0009;
pub const EV_EFI_VARIABLE_AUTHORITY: u32 = 0x8000_00e0;

/// The Linux EFI stub's EV_EVENT_TAG ids (include/linux/efi.h): its measurement of the
/// initrd it loaded (LINUX_EFI_INITRD_MEDIA_GUID) and of the LoadOptions, the command line
/// the firmware passed, both into PCR 9.
pub const LINUX_EFI_INITRD_EVENT_TAG_ID: u32 = 0x8f3b_22ec;
pub const LINUX_EFI_LOAD_OPTIONS_EVENT_TAG_ID: u32 = 0x8f3b_22ed;

/// The PC Client TPM's PCRs.
pub const PCR_COUNT: u32 = 24;
/// The most banks a Spec ID event may list: the TCG registry has fewer hash algorithms.
const MAX_BANKS: u32 = 16;

/// The Spec ID event's signature for the crypto-agile format.
const SPEC_ID_SIGNATURE: &[u8; 16] = b"Spec ID Event03\0";
/// The EV_NO_ACTION event that says which locality the TPM was started from (an H-CRTM
/// starts at 3 or 4): PCR 0 then starts at that value instead of zero.
const STARTUP_LOCALITY_SIGNATURE: &[u8; 16] = b"StartupLocality\0";

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EventLogError {
    /// The first event, read in the SHA-1 format.
    #[error("event log: Spec ID event: {0}")]
    SpecId(TpmError),
    #[error("event log: event {index}: {source}")]
    Event { index: usize, source: TpmError },
    #[error(
        "event log: event {index} at byte {offset}: digest algorithm {alg:#06x} is not among the Spec ID event's banks"
    )]
    UnlistedAlgorithm {
        index: usize,
        offset: usize,
        alg: u16,
    },
    #[error("event log: event {index} at byte {offset}: PCR {pcr}, want below {PCR_COUNT}")]
    PcrIndex {
        index: usize,
        offset: usize,
        pcr: u32,
    },
    #[error("event log: event {index} at byte {offset} extends PCR {pcr} without a SHA-256 digest")]
    NoSha256 {
        index: usize,
        offset: usize,
        pcr: u32,
    },
}

/// One bank the Spec ID event lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BankSize {
    pub alg: u16,
    pub digest_size: u16,
}

/// The Spec ID event (TCG_EfiSpecIDEventStruct).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecId {
    pub platform_class: u32,
    pub spec_version: (u8, u8),
    pub spec_errata: u8,
    pub uintn_size: u8,
    pub banks: Vec<BankSize>,
    pub vendor_info: Vec<u8>,
}

/// One TCG_PCR_EVENT2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEvent {
    /// The byte offset of the event in the log, for a reader who goes to look.
    pub offset: usize,
    pub pcr: u32,
    pub event_type: u32,
    /// (algorithm, digest) in the log's order.
    pub digests: Vec<(u16, Vec<u8>)>,
    pub data: Vec<u8>,
}

impl LogEvent {
    /// An event carrying a SHA-256 digest alone, as the logs [`EventLog::new_sha256`] makes
    /// hold (tools and tests build logs from these).
    pub fn sha256_event(pcr: u32, event_type: u32, data: Vec<u8>, digest: [u8; 32]) -> LogEvent {
        LogEvent {
            offset: 0,
            pcr,
            event_type,
            digests: vec![(TPM_ALG_SHA256, digest.to_vec())],
            data,
        }
    }

    /// The Linux EFI stub's EV_EVENT_TAG in PCR 9: tag `id` with `description`, measuring
    /// `digest` (of the initrd, or of the LoadOptions).
    pub fn linux_tag(id: u32, description: &[u8], digest: [u8; 32]) -> LogEvent {
        let mut data = id.to_le_bytes().to_vec();
        data.extend((description.len() as u32).to_le_bytes());
        data.extend(description);
        LogEvent::sha256_event(9, EV_EVENT_TAG, data, digest)
    }

    /// The digest extended into the SHA-256 bank.
    pub fn sha256(&self) -> Option<[u8; 32]> {
        self.digests
            .iter()
            .find(|(alg, _)| *alg == TPM_ALG_SHA256)
            .and_then(|(_, d)| <[u8; 32]>::try_from(d.as_slice()).ok())
    }

    /// An EV_EVENT_TAG's TCG_PCClientTaggedEvent: (taggedEventID, taggedEventData).
    pub fn tagged(&self) -> Option<(u32, &[u8])> {
        if self.event_type != EV_EVENT_TAG {
            return None;
        }
        let id = u32::from_le_bytes(self.data.get(0..4)?.try_into().ok()?);
        let size = u32::from_le_bytes(self.data.get(4..8)?.try_into().ok()?);
        let end = 8usize.checked_add(usize::try_from(size).ok()?)?;
        Some((id, self.data.get(8..end)?))
    }

    /// What a reader sees of this event: its type's name and, for the text-bearing types
    /// (EV_EFI_ACTION, EV_EVENT_TAG's description), the text.
    pub fn describe(&self) -> String {
        let name = event_type_name(self.event_type)
            .map_or_else(|| format!("{:#010x}", self.event_type), str::to_string);
        let text = match (self.event_type, self.tagged()) {
            (EV_EVENT_TAG, Some((id, data))) => format!(" {id:#010x} {}", printable(data)),
            (EV_EFI_ACTION | EV_ACTION | EV_POST_CODE, _) => format!(" {}", printable(&self.data)),
            _ => String::new(),
        };
        format!("{name}{text}")
    }
}

/// The printable ASCII of `bytes` up to the first NUL, quoted.
fn printable(bytes: &[u8]) -> String {
    let text: String = bytes
        .iter()
        .take_while(|b| **b != 0)
        .map(|b| {
            if b.is_ascii_graphic() || *b == b' ' {
                char::from(*b)
            } else {
                '.'
            }
        })
        .collect();
    format!("{text:?}")
}

/// The PC Client name of an event type.
pub fn event_type_name(event_type: u32) -> Option<&'static str> {
    Some(match event_type {
        EV_POST_CODE => "EV_POST_CODE",
        EV_NO_ACTION => "EV_NO_ACTION",
        EV_SEPARATOR => "EV_SEPARATOR",
        EV_ACTION => "EV_ACTION",
        EV_EVENT_TAG => "EV_EVENT_TAG",
        EV_S_CRTM_VERSION => "EV_S_CRTM_VERSION",
        EV_EFI_VARIABLE_DRIVER_CONFIG => "EV_EFI_VARIABLE_DRIVER_CONFIG",
        EV_EFI_VARIABLE_BOOT => "EV_EFI_VARIABLE_BOOT",
        EV_EFI_BOOT_SERVICES_APPLICATION => "EV_EFI_BOOT_SERVICES_APPLICATION",
        EV_EFI_BOOT_SERVICES_DRIVER => "EV_EFI_BOOT_SERVICES_DRIVER",
        EV_EFI_RUNTIME_SERVICES_DRIVER => "EV_EFI_RUNTIME_SERVICES_DRIVER",
        EV_EFI_GPT_EVENT => "EV_EFI_GPT_EVENT",
        EV_EFI_ACTION => "EV_EFI_ACTION",
        EV_EFI_PLATFORM_FIRMWARE_BLOB => "EV_EFI_PLATFORM_FIRMWARE_BLOB",
        EV_EFI_HANDOFF_TABLES => "EV_EFI_HANDOFF_TABLES",
        EV_EFI_VARIABLE_AUTHORITY => "EV_EFI_VARIABLE_AUTHORITY",
        _ => return None,
    })
}

/// A parsed crypto-agile event log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventLog {
    pub spec_id: SpecId,
    pub events: Vec<LogEvent>,
}

/// A little-endian u16 (the marshal reader's integers are the TPM's big-endian).
fn u16_le(r: &mut Reader<'_>, field: &'static str) -> Result<u16, TpmError> {
    let b = r.take(field, 2)?;
    Ok(u16::from_le_bytes([b[0], b[1]]))
}

/// A u32 length that must fit the remaining bytes, checked before anything is allocated.
fn len_u32(r: &mut Reader<'_>, field: &'static str) -> Result<usize, TpmError> {
    let offset = r.offset();
    let n = r.u32_le(field)?;
    usize::try_from(n).map_err(|_| r.invalid(field, offset, format!("{n} does not fit")))
}

impl EventLog {
    /// Parses a whole log: the Spec ID event, then TCG_PCR_EVENT2s to the last byte.
    pub fn parse(log: &[u8]) -> Result<EventLog, EventLogError> {
        let mut r = Reader::new("binary_bios_measurements", log);
        let spec_id = read_spec_id(&mut r).map_err(EventLogError::SpecId)?;
        let mut events = Vec::new();
        while r.remaining() > 0 {
            let index = events.len();
            events.push(read_event(&mut r, index, &spec_id.banks)?);
        }
        Ok(EventLog { spec_id, events })
    }

    /// The SHA-256 bank of PCRs 0-23 after every event extended it: PCRs start at zero
    /// (PCR 0 at the StartupLocality event's locality, PCRs 17-22 at all ones, as a
    /// PC Client TPM resets them), and EV_NO_ACTION events extend nothing.
    pub fn replay_sha256(&self) -> Result<PcrValues, EventLogError> {
        let mut pcrs: BTreeMap<u8, [u8; 32]> = (0..PCR_COUNT as u8)
            .map(|i| {
                (
                    i,
                    if (17..=22).contains(&i) {
                        [0xff; 32]
                    } else {
                        [0; 32]
                    },
                )
            })
            .collect();
        for (index, e) in self.events.iter().enumerate() {
            // Checked when parsed; checked again for a log built by hand.
            let pcr = u8::try_from(e.pcr)
                .ok()
                .filter(|p| u32::from(*p) < PCR_COUNT)
                .ok_or(EventLogError::PcrIndex {
                    index,
                    offset: e.offset,
                    pcr: e.pcr,
                })?;
            if e.event_type == EV_NO_ACTION {
                if let Some(locality) = startup_locality(e) {
                    let mut start = [0u8; 32];
                    start[31] = locality;
                    pcrs.insert(pcr, start);
                }
                continue;
            }
            let digest = e.sha256().ok_or(EventLogError::NoSha256 {
                index,
                offset: e.offset,
                pcr: e.pcr,
            })?;
            let value = pcrs.entry(pcr).or_insert([0; 32]);
            let mut h = Sha256::new();
            h.update(*value);
            h.update(digest);
            *value = h.finalize().into();
        }
        Ok(PcrValues(pcrs))
    }

    /// A log with no events whose Spec ID event lists the SHA-256 bank alone: what tests and
    /// tools build logs on.
    pub fn new_sha256() -> EventLog {
        EventLog {
            spec_id: SpecId {
                platform_class: 0,
                spec_version: (2, 0),
                spec_errata: 0,
                uintn_size: 2,
                banks: vec![BankSize {
                    alg: TPM_ALG_SHA256,
                    digest_size: 32,
                }],
                vendor_info: Vec::new(),
            },
            events: Vec::new(),
        }
    }

    /// The events that extend `pcr`, in order.
    pub fn events_of(&self, pcr: u32) -> impl Iterator<Item = &LogEvent> {
        self.events.iter().filter(move |e| e.pcr == pcr)
    }

    /// The log's bytes: what [`EventLog::parse`] reads back (the digests' sizes must be the
    /// Spec ID event's).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut spec = SPEC_ID_SIGNATURE.to_vec();
        spec.extend(self.spec_id.platform_class.to_le_bytes());
        spec.extend([
            self.spec_id.spec_version.1,
            self.spec_id.spec_version.0,
            self.spec_id.spec_errata,
            self.spec_id.uintn_size,
        ]);
        spec.extend((self.spec_id.banks.len() as u32).to_le_bytes());
        for b in &self.spec_id.banks {
            spec.extend(b.alg.to_le_bytes());
            spec.extend(b.digest_size.to_le_bytes());
        }
        spec.push(self.spec_id.vendor_info.len() as u8);
        spec.extend(&self.spec_id.vendor_info);
        let mut out = Vec::new();
        out.extend(0u32.to_le_bytes());
        out.extend(EV_NO_ACTION.to_le_bytes());
        out.extend([0u8; 20]);
        out.extend((spec.len() as u32).to_le_bytes());
        out.extend(spec);
        for e in &self.events {
            out.extend(e.pcr.to_le_bytes());
            out.extend(e.event_type.to_le_bytes());
            out.extend((e.digests.len() as u32).to_le_bytes());
            for (alg, d) in &e.digests {
                out.extend(alg.to_le_bytes());
                out.extend(d);
            }
            out.extend((e.data.len() as u32).to_le_bytes());
            out.extend(&e.data);
        }
        out
    }
}

/// The locality a StartupLocality EV_NO_ACTION event in PCR 0 names.
fn startup_locality(e: &LogEvent) -> Option<u8> {
    if e.pcr != 0 || !e.data.starts_with(STARTUP_LOCALITY_SIGNATURE) {
        return None;
    }
    e.data.get(STARTUP_LOCALITY_SIGNATURE.len()).copied()
}

/// The first event: TCG_PCR_EVENT (pcrIndex, eventType EV_NO_ACTION, a zero SHA-1 digest,
/// eventSize) around a TCG_EfiSpecIDEventStruct.
fn read_spec_id(r: &mut Reader<'_>) -> Result<SpecId, TpmError> {
    r.u32_le("pcrIndex")?;
    let type_offset = r.offset();
    let event_type = r.u32_le("eventType")?;
    if event_type != EV_NO_ACTION {
        return Err(r.unexpected(
            "eventType",
            type_offset,
            event_type.into(),
            EV_NO_ACTION.into(),
        ));
    }
    r.take("digest (SHA-1)", 20)?;
    let size = len_u32(r, "eventSize")?;
    let body_offset = r.offset();
    let body = r.take("event (TCG_EfiSpecIDEventStruct)", size)?;
    let mut s = Reader::with_base("Spec ID event", body, body_offset);
    let signature = s.take("signature", 16)?;
    if signature != SPEC_ID_SIGNATURE {
        return Err(s.invalid(
            "signature",
            body_offset,
            format!(
                "{}, want \"Spec ID Event03\" (a SHA-1-only log is not crypto-agile)",
                printable(signature)
            ),
        ));
    }
    let platform_class = s.u32_le("platformClass")?;
    let minor = s.u8("specVersionMinor")?;
    let major = s.u8("specVersionMajor")?;
    let spec_errata = s.u8("specErrata")?;
    let uintn_size = s.u8("uintnSize")?;
    let count_offset = s.offset();
    let count = s.u32_le("numberOfAlgorithms")?;
    // Each entry is 4 bytes: a count the body cannot hold is refused before allocating.
    if count == 0 || u64::from(count) * 4 > s.remaining() as u64 {
        let why = format!("{count}, and {} bytes follow", s.remaining());
        return Err(s.invalid("numberOfAlgorithms", count_offset, why));
    }
    // Every event's digests are looked up among the banks: thousands of banks would make a
    // log of a few hundred KiB cost billions of comparisons to parse.
    if count > MAX_BANKS {
        let why = format!("{count}, want at most {MAX_BANKS} (a TPM has a handful of banks)");
        return Err(s.invalid("numberOfAlgorithms", count_offset, why));
    }
    let mut banks: Vec<BankSize> = Vec::new();
    for _ in 0..count {
        let alg_offset = s.offset();
        let alg = u16_le(&mut s, "digestSizes.algorithmId")?;
        let digest_size = u16_le(&mut s, "digestSizes.digestSize")?;
        // Two sizes for one bank would leave an event's digests without one reading.
        if banks.iter().any(|b| b.alg == alg) {
            let why = format!("{alg:#06x} is listed twice");
            return Err(s.invalid("digestSizes.algorithmId", alg_offset, why));
        }
        banks.push(BankSize { alg, digest_size });
    }
    let vendor_size = s.u8("vendorInfoSize")?;
    let vendor_info = s.take("vendorInfo", usize::from(vendor_size))?.to_vec();
    s.finish()?;
    Ok(SpecId {
        platform_class,
        spec_version: (major, minor),
        spec_errata,
        uintn_size,
        banks,
        vendor_info,
    })
}

/// One TCG_PCR_EVENT2: pcrIndex, eventType, TPML_DIGEST_VALUES, eventSize, event.
fn read_event(
    r: &mut Reader<'_>,
    index: usize,
    banks: &[BankSize],
) -> Result<LogEvent, EventLogError> {
    let at = |source| EventLogError::Event { index, source };
    let offset = r.offset();
    let pcr = r.u32_le("pcrIndex").map_err(at)?;
    if pcr >= PCR_COUNT {
        return Err(EventLogError::PcrIndex { index, offset, pcr });
    }
    let event_type = r.u32_le("eventType").map_err(at)?;
    let count_offset = r.offset();
    let count = r.u32_le("digests.count").map_err(at)?;
    if count as usize > banks.len() {
        let why = format!("{count}, but the Spec ID event lists {} banks", banks.len());
        return Err(at(r.invalid("digests.count", count_offset, why)));
    }
    let mut digests = Vec::new();
    for _ in 0..count {
        let alg_offset = r.offset();
        let alg = u16_le(r, "digests.hashAlg").map_err(at)?;
        let size = banks
            .iter()
            .find(|b| b.alg == alg)
            .ok_or(EventLogError::UnlistedAlgorithm {
                index,
                offset: alg_offset,
                alg,
            })?
            .digest_size;
        digests.push((
            alg,
            r.take("digests.digest", usize::from(size))
                .map_err(at)?
                .to_vec(),
        ));
    }
    let size = len_u32(r, "eventSize").map_err(at)?;
    let data = r.take("event", size).map_err(at)?.to_vec();
    Ok(LogEvent {
        offset,
        pcr,
        event_type,
        digests,
        data,
    })
}

/// What the Linux EFI stub extends PCR 9 with for a command line, when the firmware passed
/// it as NUL-terminated UCS-2 LoadOptions (OVMF's QEMU kernel loader, systemd-boot): the
/// SHA-256 of those bytes. `cmdline` is what the kernel then shows in `/proc/cmdline`.
pub fn efi_load_options_digest(cmdline: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    for unit in cmdline.encode_utf16().chain([0]) {
        h.update(unit.to_le_bytes());
    }
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha256(data: &[u8]) -> [u8; 32] {
        Sha256::digest(data).into()
    }

    fn event(pcr: u32, event_type: u32, data: &[u8]) -> LogEvent {
        LogEvent {
            offset: 0,
            pcr,
            event_type,
            digests: vec![
                (TPM_ALG_SHA1, vec![0x11; 20]),
                (TPM_ALG_SHA256, sha256(data).to_vec()),
            ],
            data: data.to_vec(),
        }
    }

    fn tagged(id: u32, description: &[u8], measured: &[u8]) -> LogEvent {
        let mut data = id.to_le_bytes().to_vec();
        data.extend((description.len() as u32).to_le_bytes());
        data.extend(description);
        LogEvent {
            digests: vec![
                (TPM_ALG_SHA1, vec![0x22; 20]),
                (TPM_ALG_SHA256, sha256(measured).to_vec()),
            ],
            ..event(9, EV_EVENT_TAG, &data)
        }
    }

    /// A log shaped like OVMF's with the Linux EFI stub's events, both banks.
    fn synthetic() -> EventLog {
        let mut events = vec![
            event(0, EV_S_CRTM_VERSION, &[0, 0]),
            event(0, EV_EFI_PLATFORM_FIRMWARE_BLOB, &[1; 16]),
            event(7, EV_EFI_VARIABLE_DRIVER_CONFIG, b"SecureBoot"),
            event(4, EV_EFI_BOOT_SERVICES_APPLICATION, b"kernel"),
            event(
                4,
                EV_EFI_ACTION,
                b"Calling EFI Application from Boot Option",
            ),
            // Not extended: replay must skip it.
            event(2, EV_NO_ACTION, b"not extended"),
        ];
        for pcr in 0..8 {
            events.push(event(pcr, EV_SEPARATOR, &[0; 4]));
        }
        events.push(tagged(
            LINUX_EFI_LOAD_OPTIONS_EVENT_TAG_ID,
            b"LOADED_IMAGE::LoadOptions\0",
            b"console=ttyS0",
        ));
        events.push(tagged(
            LINUX_EFI_INITRD_EVENT_TAG_ID,
            b"Linux initrd\0",
            b"initrd bytes",
        ));
        let mut log = EventLog {
            spec_id: SpecId {
                platform_class: 0,
                spec_version: (2, 0),
                spec_errata: 0,
                uintn_size: 2,
                banks: vec![
                    BankSize {
                        alg: TPM_ALG_SHA1,
                        digest_size: 20,
                    },
                    BankSize {
                        alg: TPM_ALG_SHA256,
                        digest_size: 32,
                    },
                ],
                vendor_info: Vec::new(),
            },
            events,
        };
        // The offsets parse will find: after the Spec ID event, each event's length.
        let mut offset = 32 + 16 + 4 + 4 + 4 + 2 * 4 + 1;
        for e in &mut log.events {
            e.offset = offset;
            offset += 12 + e.digests.iter().map(|d| 2 + d.1.len()).sum::<usize>() + 4;
            offset += e.data.len();
        }
        log
    }

    fn extend(pcr: [u8; 32], data: &[u8]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(pcr);
        h.update(sha256(data));
        h.finalize().into()
    }

    #[test]
    fn event_log_parses_and_replays_the_sha256_bank() {
        let log = synthetic();
        let bytes = log.to_bytes();
        let parsed = EventLog::parse(&bytes).unwrap();
        assert_eq!(parsed, log);

        let values = parsed.replay_sha256().unwrap();
        assert_eq!(values.indices(), (0..24).collect::<Vec<u8>>());
        let sep = [0u8; 4];
        let pcr0 = extend(extend(extend([0; 32], &[0, 0]), &[1; 16]), &sep);
        assert_eq!(values.get(0), Some(&pcr0));
        let pcr4 = extend(
            extend(
                extend([0; 32], b"kernel"),
                b"Calling EFI Application from Boot Option",
            ),
            &sep,
        );
        assert_eq!(values.get(4), Some(&pcr4));
        // The EV_NO_ACTION event in PCR 2 left it at the separator alone.
        assert_eq!(values.get(2), Some(&extend([0; 32], &sep)));
        let pcr9 = extend(extend([0; 32], b"console=ttyS0"), b"initrd bytes");
        assert_eq!(values.get(9), Some(&pcr9));
        assert_eq!(values.get(8), Some(&[0; 32]));
        assert_eq!(values.get(17), Some(&[0xff; 32]));

        let in_pcr9: Vec<(u32, &[u8])> = parsed.events_of(9).filter_map(|e| e.tagged()).collect();
        assert_eq!(
            in_pcr9,
            vec![
                (
                    LINUX_EFI_LOAD_OPTIONS_EVENT_TAG_ID,
                    &b"LOADED_IMAGE::LoadOptions\0"[..]
                ),
                (LINUX_EFI_INITRD_EVENT_TAG_ID, &b"Linux initrd\0"[..]),
            ]
        );
        assert_eq!(
            parsed.events[3].describe(),
            "EV_EFI_BOOT_SERVICES_APPLICATION"
        );
        assert_eq!(
            parsed.events[15].describe(),
            "EV_EVENT_TAG 0x8f3b22ec \"Linux initrd\""
        );
    }

    #[test]
    fn a_truncated_event_log_fails_naming_the_offset() {
        let log = synthetic();
        let bytes = log.to_bytes();
        let last = &log.events[log.events.len() - 1];
        // Cut inside the last event's SHA-256 digest: pcrIndex, eventType, count, the SHA-1
        // entry (2 + 20), the SHA-256 algorithm id (2), then 5 of its 32 bytes.
        let digest_at = last.offset + 12 + 22 + 2;
        let e = EventLog::parse(&bytes[..digest_at + 5]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "event log: event {}: binary_bios_measurements: digests.digest needs 32 bytes at byte {digest_at}, only 5 left",
                log.events.len() - 1
            )
        );
        // Inside the Spec ID event.
        let e = EventLog::parse(&bytes[..40]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "event log: Spec ID event: binary_bios_measurements: event (TCG_EfiSpecIDEventStruct) needs 37 bytes at byte 32, only 8 left"
        );
    }

    #[test]
    fn event_log_refuses_what_it_cannot_replay() {
        let mut log = synthetic();
        log.events[3].digests[1].0 = 0x000c;
        let e = EventLog::parse(&log.to_bytes()).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "event log: event 3 at byte {}: digest algorithm 0x000c is not among the Spec ID event's banks",
                log.events[3].offset + 12 + 22
            )
        );

        let mut log = synthetic();
        log.events[4].pcr = 24;
        let e = EventLog::parse(&log.to_bytes()).unwrap_err();
        assert!(e.to_string().contains("PCR 24, want below 24"), "{e}");

        // A SHA-1-only (pre-crypto-agile) log: its first event is not the Spec ID Event03.
        let mut bytes = synthetic().to_bytes();
        bytes[32..48].copy_from_slice(b"Spec ID Event02\0");
        let e = EventLog::parse(&bytes).unwrap_err();
        assert_eq!(
            e.to_string(),
            "event log: Spec ID event: Spec ID event: signature at byte 32: \"Spec ID Event02\", want \"Spec ID Event03\" (a SHA-1-only log is not crypto-agile)"
        );

        let mut log = synthetic();
        log.events[0].digests.truncate(1);
        let e = log.replay_sha256().unwrap_err();
        assert_eq!(
            e,
            EventLogError::NoSha256 {
                index: 0,
                offset: log.events[0].offset,
                pcr: 0
            }
        );
    }

    #[test]
    fn a_spec_id_event_with_too_many_or_repeated_banks_is_refused() {
        let mut log = synthetic();
        log.spec_id.banks = (1..=17)
            .map(|alg| BankSize {
                alg,
                digest_size: 0,
            })
            .collect();
        log.events.clear();
        let e = EventLog::parse(&log.to_bytes()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "event log: Spec ID event: Spec ID event: numberOfAlgorithms at byte 56: 17, want at most 16 (a TPM has a handful of banks)"
        );
        let mut log = synthetic();
        log.spec_id.banks[1].alg = TPM_ALG_SHA1;
        let e = EventLog::parse(&log.to_bytes()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "event log: Spec ID event: Spec ID event: digestSizes.algorithmId at byte 64: 0x0004 is listed twice"
        );
    }

    #[test]
    fn startup_locality_sets_pcr0s_starting_value() {
        let mut log = synthetic();
        let mut data = STARTUP_LOCALITY_SIGNATURE.to_vec();
        data.push(3);
        log.events.insert(0, event(0, EV_NO_ACTION, &data));
        let mut start = [0u8; 32];
        start[31] = 3;
        let pcr0 = extend(extend(extend(start, &[0, 0]), &[1; 16]), &[0; 4]);
        assert_eq!(log.replay_sha256().unwrap().get(0), Some(&pcr0));
    }

    /// The digest a real OVMF boot logged for `console=ttyS0 panic=-1 rw.test=one two
    /// initrd=initrd` (OVMF's QEMU loader appends `initrd=initrd`).
    #[test]
    fn the_load_options_digest_is_sha256_of_nul_terminated_utf16() {
        assert_eq!(
            hex::encode(efi_load_options_digest(
                "console=ttyS0 panic=-1 rw.test=one two initrd=initrd"
            )),
            "a1427a81c0334ff4d14f3861b7a621c790a880e7310f13f519167cd615599ebc"
        );
    }

    /// The event log of a real boot: OVMF 2022.11 (Debian `ovmf`) under QEMU 10.0.2 with swtpm,
    /// `-kernel` Debian 6.1.0-57-cloud-amd64, a 1.9 MB initrd, `-append "console=ttyS0 panic=-1
    /// rw.test=one two"`, read from `/sys/kernel/security/tpm0/binary_bios_measurements`.
    const OVMF_LINUX_6_1_LOG: &str = concat!(
        "000000000300000000000000000000000000000000000000000000002100000053706563204944204576656e",
        "743033000000000000020002010000000b002000000000000008000000010000000b0096a296d224f285c67b",
        "ee93c30f8a309157f0daa35dc5b87e410b78630a09cfc70200000000000000000008000080010000000b0076",
        "bbfa881e8b9956ce0a732a4866565c5a486c87c94220852eb476b30e5738cc10000000000082000000000000",
        "000e00000000000000000008000080010000000b0082a0445201cb49945461acc6ed78426700fb7e92819862",
        "edc55ba3ad4559b1351000000000009000000000000000c000000000000700000001000080010000000b0011",
        "5aa827dbccfb44d216ad9ecfda56bdea620b860a94bed5b7a27bba1c4d02d83500000061dfe48bca93d211aa",
        "0d00e098032b8c0a00000000000000010000000000000053006500630075007200650042006f006f00740000",
        "0700000001000080010000000b00dea7b80ab53a3daaa24d5cc46c64e1fa9ffd03739f90aadbd8c0867c4a5b",
        "48902400000061dfe48bca93d211aa0d00e098032b8c0200000000000000000000000000000050004b000700",
        "000001000080010000000b00e670e121fcebd473b8bc41bb801301fc1d9afa33904f06f7149b74f12c47a68f",
        "2600000061dfe48bca93d211aa0d00e098032b8c030000000000000000000000000000004b0045004b000700",
        "000001000080010000000b00baf89a3ccace52750c5f0128351e0422a41597a1adfd50822aa363b9d124ea7c",
        "24000000cbb219d73a3d9645a3bcdad00e67656f020000000000000000000000000000006400620007000000",
        "01000080010000000b009f75b6823bff6af1024a4e2036719cdd548d3cbc2bf1de8e7ef4d0ed01f94bf92600",
        "0000cbb219d73a3d9645a3bcdad00e67656f0300000000000000000000000000000064006200780007000000",
        "04000000010000000b00df3f619804a92fdb4057192dc43dd748ea778adc52bc498ce80524c014b811190400",
        "0000000000000400000003000080010000000b0093b311f7899579ff3e4108f49e5edbcc0a5d2356e286ee5b",
        "3b0c2c5842205cad4a00000018b0817c00000000c087d8000000000000000000000000002a00000000000000",
        "0403140072f728144ab61e44b8c39ebdd7f893c7040412006b00650072006e0065006c0000007fff04000100",
        "000002000080010000000b0096a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
        "3400000061dfe48bca93d211aa0d00e098032b8c0900000000000000020000000000000042006f006f007400",
        "4f00720064006500720000000100000002000080010000000b003197be1e300fa1600d1884c3a4bd4a90a154",
        "05bfb546cf2e6cf6095f8c362a936e00000061dfe48bca93d211aa0d00e098032b8c08000000000000003e00",
        "00000000000042006f006f0074003000300030003000090100002c0055006900410070007000000004071400",
        "c9bdb87cebf8344faaea3ee4af6516a10406140021aa2c4614760345836e8ab6f46623317fff040004000000",
        "07000080010000000b003d6772b4f84ed47595d72a2c4c5ffd15f5bb72c7507fe26f2aaee2c69d5633ba2800",
        "000043616c6c696e6720454649204170706c69636174696f6e2066726f6d20426f6f74204f7074696f6e0000",
        "000004000000010000000b00df3f619804a92fdb4057192dc43dd748ea778adc52bc498ce80524c014b81119",
        "04000000000000000100000004000000010000000b00df3f619804a92fdb4057192dc43dd748ea778adc52bc",
        "498ce80524c014b8111904000000000000000200000004000000010000000b00df3f619804a92fdb4057192d",
        "c43dd748ea778adc52bc498ce80524c014b8111904000000000000000300000004000000010000000b00df3f",
        "619804a92fdb4057192dc43dd748ea778adc52bc498ce80524c014b811190400000000000000040000000400",
        "0000010000000b00df3f619804a92fdb4057192dc43dd748ea778adc52bc498ce80524c014b8111904000000",
        "000000000500000004000000010000000b00df3f619804a92fdb4057192dc43dd748ea778adc52bc498ce805",
        "24c014b8111904000000000000000600000004000000010000000b00df3f619804a92fdb4057192dc43dd748",
        "ea778adc52bc498ce80524c014b8111904000000000000000900000006000000010000000b00a1427a81c033",
        "4ff4d14f3861b7a621c790a880e7310f13f519167cd615599ebc22000000ed223b8f1a0000004c4f41444544",
        "5f494d4147453a3a4c6f61644f7074696f6e73000900000006000000010000000b00e1dde81a7e605326b2e9",
        "8a509298bd9f93d0163a137c3f877f22f6e2c897c10715000000ec223b8f0d0000004c696e757820696e6974",
        "7264000500000007000080010000000b00d8043d6b7b85ad358eb3b6ae6a873ab7ef23a26352c5dc4faa5aee",
        "dacf5eb41b1d0000004578697420426f6f7420536572766963657320496e766f636174696f6e050000000700",
        "0080010000000b00b54f7542cbd872a81a9d9dea839b2b8d747c7ebd5ea6615c40f42f44a6dbeba028000000",
        "4578697420426f6f742053657276696365732052657475726e656420776974682053756363657373",
    );

    /// The real log replays to the PCRs the guest's TPM held (read from
    /// `/sys/class/tpm/tpm0/pcr-sha256/` in the same boot), and has the events an appraisal
    /// looks for: the kernel's PE image in PCR 4, the command line and the initrd in PCR 9.
    #[test]
    fn a_real_ovmf_log_replays_to_the_tpms_pcrs() {
        let log = EventLog::parse(&hex::decode(OVMF_LINUX_6_1_LOG).unwrap()).unwrap();
        assert_eq!(
            log.spec_id.banks,
            vec![BankSize {
                alg: TPM_ALG_SHA256,
                digest_size: 32
            }]
        );
        assert_eq!(log.events.len(), 24);
        let values = log.replay_sha256().unwrap();
        let tpm = [
            "1119fe2cc2550e9294b01a6355bfeb7ac1507139f07c0afec49f6644002acca9",
            "8e9d1fe23131f12d6a523e9c32eb3223d4dc25e14eb5fd60163e7ba8de0f248c",
            "3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
            "3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
            "b314de707218aea7a7419df56569d189a74d801e2905f22426ebad208e5b1ead",
            "a5ceb755d043f32431d63e39f5161464620a3437280494b5850dc1b47cc074e0",
            "3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
            "65caf8dd1e0ea7a6347b635d2b379c93b9a1351edc2afc3ecda700e534eb3068",
            "0000000000000000000000000000000000000000000000000000000000000000",
            "e8b7abaaa5032b88f4f53ce9c3d66e1af34190009c675ee22ed2ebdf9dbea331",
        ];
        for (pcr, want) in (0u8..).zip(tpm) {
            assert_eq!(hex::encode(values.get(pcr).unwrap()), want, "PCR {pcr}");
        }
        let kernel: Vec<&LogEvent> = log
            .events_of(4)
            .filter(|e| e.event_type == EV_EFI_BOOT_SERVICES_APPLICATION)
            .collect();
        assert_eq!(kernel.len(), 1);
        assert_eq!(kernel[0].offset, 754);
        let pcr9: Vec<(u32, [u8; 32])> = log
            .events_of(9)
            .filter_map(|e| Some((e.tagged()?.0, e.sha256()?)))
            .collect();
        assert_eq!(
            pcr9,
            vec![
                (
                    LINUX_EFI_LOAD_OPTIONS_EVENT_TAG_ID,
                    efi_load_options_digest("console=ttyS0 panic=-1 rw.test=one two initrd=initrd")
                ),
                (
                    LINUX_EFI_INITRD_EVENT_TAG_ID,
                    <[u8; 32]>::try_from(
                        hex::decode(
                            "e1dde81a7e605326b2e98a509298bd9f93d0163a137c3f877f22f6e2c897c107"
                        )
                        .unwrap()
                    )
                    .unwrap()
                ),
            ]
        );
    }
}
