//! The quote over one statement, the IMA entries it covers and, once per boot, the boot's
//! event log: the [`TpmSidecar`] that goes beside the envelope.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use rackwarden_attest::tpm::{BOOT_LOG_PCRS, BootEvidence, ImaSource, TpmSidecar};

use super::{SharedTpm, TpmError, ima_cursor::ImaCursor};

/// PCR 10 is where IMA measures (CONFIG_IMA_MEASURE_PCR_IDX).
const IMA_PCR: u8 = 10;

/// Quotes statements with the AK and keeps the IMA cursor between them.
pub struct StatementQuoter {
    tpm: SharedTpm,
    pcrs: Vec<u8>,
    /// The IMA list, where it can be read and PCR 10 is quoted (without PCR 10 in the quote,
    /// nothing the list says could be checked).
    ima_list: Option<PathBuf>,
    cursor: ImaCursor,
    boot_log: BootLogShipment,
}

/// Whether the boot's event log still has to go: with the first quote after start and after
/// the AK is enrolled. PCRs 0-9 do not change within a boot, so once is enough for the
/// verifier, which keeps what the log measured for the boot.
#[derive(Debug)]
enum BootLogShipment {
    /// The next quote ships it (it covers PCRs 0-9).
    Pending {
        log: PathBuf,
    },
    Shipped {
        log: PathBuf,
    },
    /// The quote does not cover PCRs 0-9, or the host has no event log: nothing could check it.
    Never,
}

impl std::fmt::Debug for StatementQuoter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatementQuoter")
            .field("pcrs", &self.pcrs)
            .field("ima_list", &self.ima_list)
            .field("cursor", &self.cursor)
            .field("boot_log", &self.boot_log)
            .finish()
    }
}

impl StatementQuoter {
    pub fn new(tpm: SharedTpm, pcrs: &[u8], ima: &ImaSource, event_log: &Path) -> StatementQuoter {
        let boot_log = if BOOT_LOG_PCRS.clone().all(|p| pcrs.contains(&p)) {
            BootLogShipment::Pending {
                log: event_log.to_path_buf(),
            }
        } else {
            log::warn!(
                "tpm: [tpm] pcrs does not cover PCRs 0-9: the boot event log {} is not shipped (nothing could replay it)",
                event_log.display()
            );
            BootLogShipment::Never
        };
        let ima_list = match ima {
            ImaSource::Measured { list } if pcrs.contains(&IMA_PCR) => Some(PathBuf::from(list)),
            ImaSource::Measured { list } => {
                log::warn!(
                    "tpm: PCR 10 is not in [tpm] pcrs: the IMA list {list} is not shipped (nothing could replay it)"
                );
                None
            }
            ImaSource::Unavailable { .. } => None,
        };
        StatementQuoter {
            tpm,
            pcrs: pcrs.to_vec(),
            ima_list,
            cursor: ImaCursor::at_boot_aggregate(),
            boot_log,
        }
    }

    /// Quotes `chain_digest` (the statement's SHA3-256 of its PAE) over the configured PCRs,
    /// then reads the IMA list and ships the entries the quoted PCR 10 covers. The quote
    /// comes first: an entry measured after it must not be shipped as covered by it.
    pub fn quote_statement(&mut self, chain_digest: &[u8; 32]) -> Result<TpmSidecar, TpmError> {
        let quote = self.quote_twice(chain_digest)?;
        let ima = self.ima_delta(&quote.pcr_values);
        let mut sidecar = TpmSidecar::new(
            &quote.attest,
            &quote.signature,
            &quote.pcr_values,
            ima.as_ref()
                .map(|(offset, bytes)| (*offset, bytes.as_slice())),
        );
        sidecar.boot = self.boot_evidence();
        Ok(sidecar)
    }

    /// The next quote ships the whole IMA list, from the boot aggregate, and the boot's
    /// event log.
    pub fn restart_ima(&mut self) {
        self.cursor = ImaCursor::at_boot_aggregate();
        if let BootLogShipment::Shipped { log } = &self.boot_log {
            self.boot_log = BootLogShipment::Pending { log: log.clone() };
        }
    }

    /// The event log and command line, when they are due. A log that cannot be read now is
    /// tried again with the next quote; a host without one (no UEFI event log) never ships.
    fn boot_evidence(&mut self) -> Option<BootEvidence> {
        let BootLogShipment::Pending { log } = &self.boot_log else {
            return None;
        };
        let log = log.clone();
        let read = std::fs::read(&log).and_then(|l| {
            let cmdline = std::fs::read_to_string("/proc/cmdline")?;
            Ok((l, cmdline))
        });
        match read {
            Ok((bytes, cmdline)) => {
                log::info!(
                    "tpm: shipping the boot event log {} ({} bytes) with this quote",
                    log.display(),
                    bytes.len()
                );
                self.boot_log = BootLogShipment::Shipped { log };
                Some(BootEvidence::new(&bytes, &cmdline))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                log::warn!(
                    "tpm: no boot event log at {}: the verifier cannot judge this host's boot",
                    log.display()
                );
                self.boot_log = BootLogShipment::Never;
                None
            }
            Err(e) => {
                log::warn!(
                    "tpm: cannot read the boot event log {}: {e}; trying again with the next quote",
                    log.display()
                );
                None
            }
        }
    }

    /// A quote, tried once more after a failed TPM command: a statement without a quote from
    /// a host whose AK is enrolled is contraindicated, and a transport error that passes (seen
    /// as TSS2_TCTI_RC_IO_ERROR from swtpm on a loaded machine) should not cost one.
    fn quote_twice(&self, chain_digest: &[u8; 32]) -> Result<super::Quote, TpmError> {
        let mut tpm = self.tpm.lock().unwrap_or_else(|p| p.into_inner());
        match tpm.quote(chain_digest, &self.pcrs) {
            Err(e @ TpmError::Command { .. }) => {
                log::warn!("tpm: {e}; quoting once more");
                tpm.quote(chain_digest, &self.pcrs)
            }
            other => other,
        }
    }

    /// The IMA entries for a quote of `pcr_values`, or `None` when there is no list to ship
    /// or it could not be read this time (the quote still goes; the cursor stays, so the
    /// entries go with a later statement).
    fn ima_delta(&mut self, pcr_values: &BTreeMap<u8, [u8; 32]>) -> Option<(u64, Vec<u8>)> {
        let list_path = self.ima_list.as_ref()?;
        let quoted = pcr_values.get(&IMA_PCR)?;
        let list = match std::fs::read(list_path) {
            Ok(l) => l,
            Err(e) => {
                log::warn!(
                    "tpm: cannot read the IMA list {}: {e}; this quote goes without IMA entries",
                    list_path.display()
                );
                return None;
            }
        };
        let from = self.cursor.offset;
        match self.cursor.ship(&list, quoted) {
            Ok(s) if s.replays => Some((s.offset, s.entries)),
            Ok(s) => {
                log::warn!(
                    "tpm: no prefix of the {} IMA entries from {from} replays to the quoted PCR 10: shipping them all; the next statement ships the whole list again",
                    s.count
                );
                Some((s.offset, s.entries))
            }
            Err(e) => {
                log::warn!(
                    "tpm: the IMA list {} does not parse from entry {from}: {e}; this quote goes without IMA entries and the next ships the whole list",
                    list_path.display()
                );
                None
            }
        }
    }
}
