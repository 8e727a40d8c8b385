//! Which IMA entries go with a quote. Each statement ships the entries measured since the
//! previous one, and exactly those that the quoted PCR 10 covers: IMA may extend PCR 10
//! between the quote and our reading of the list, and an entry shipped before the quote that
//! covers it would not replay. Entries past the match wait for the next statement.
//!
//! The cursor lives in memory only: every daemon start begins at the boot aggregate
//! (offset 0, PCR 10 all zero), so the first statement after a start ships the whole list
//! and the verifier resynchronises whatever it saw before.

use rackwarden_attest::tpm::{
    ImaEntry, ImaError, encode_ima_binary, parse_ima_binary, replay_pcr10,
};

/// How far this run has shipped the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImaCursor {
    /// Entries before this index went with earlier statements.
    pub offset: u64,
    /// Where that entry starts in the binary list (so only the new tail is parsed).
    byte_offset: usize,
    /// PCR 10 replayed through the entries before `offset`.
    pub pcr10: [u8; 32],
}

/// The entries that go with one quote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImaShipment {
    /// Index of the first entry shipped.
    pub offset: u64,
    /// The entries in the kernel's binary format.
    pub entries: Vec<u8>,
    pub count: usize,
    /// False when no prefix of the new entries replays to the quoted PCR 10: everything from
    /// `offset` is shipped anyway (the verifier says what does not replay) and the cursor
    /// starts over at the boot aggregate.
    pub replays: bool,
}

impl Default for ImaCursor {
    fn default() -> Self {
        ImaCursor::at_boot_aggregate()
    }
}

impl ImaCursor {
    /// Nothing shipped yet: the next shipment starts with the boot aggregate.
    pub fn at_boot_aggregate() -> ImaCursor {
        ImaCursor {
            offset: 0,
            byte_offset: 0,
            pcr10: [0; 32],
        }
    }

    /// The entries of `list` (the whole binary list, read after the quote) that take PCR 10
    /// from the cursor to `quoted_pcr10`, the fewest that do; the cursor moves past them.
    /// A list that does not parse from the cursor on is an error, and the cursor starts over.
    pub fn ship(&mut self, list: &[u8], quoted_pcr10: &[u8; 32]) -> Result<ImaShipment, ImaError> {
        let offset = self.offset;
        // A list shorter than what was shipped is not this boot's (or not IMA's): no entries
        // replay on top of the cursor, so it starts over.
        let tail = list.get(self.byte_offset..).unwrap_or_default();
        let entries = match parse_ima_binary(tail) {
            Ok(e) => e,
            Err(e) => {
                *self = ImaCursor::at_boot_aggregate();
                return Err(e);
            }
        };
        match covered_by(self.pcr10, &entries, quoted_pcr10) {
            Some(count) => {
                let shipped = &entries[..count];
                let bytes = encode_ima_binary(shipped);
                self.offset = offset.saturating_add(count as u64);
                self.byte_offset = self.byte_offset.saturating_add(bytes.len());
                self.pcr10 = *quoted_pcr10;
                Ok(ImaShipment {
                    offset,
                    entries: bytes,
                    count,
                    replays: true,
                })
            }
            None => {
                *self = ImaCursor::at_boot_aggregate();
                Ok(ImaShipment {
                    offset,
                    entries: encode_ima_binary(&entries),
                    count: entries.len(),
                    replays: false,
                })
            }
        }
    }
}

/// The smallest `k` such that extending `start` with `entries[..k]` gives `quoted`.
fn covered_by(start: [u8; 32], entries: &[ImaEntry], quoted: &[u8; 32]) -> Option<usize> {
    let mut pcr = start;
    if pcr == *quoted {
        return Some(0);
    }
    for (i, e) in entries.iter().enumerate() {
        pcr = replay_pcr10(pcr, std::slice::from_ref(e));
        if pcr == *quoted {
            return Some(i + 1);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(i: u8) -> ImaEntry {
        ImaEntry::ima_ng(&format!("/usr/bin/tool{i}"), [i; 32])
    }

    #[test]
    fn tpm_ima_cursor_ships_what_the_quote_covers_then_the_rest() {
        let all: Vec<ImaEntry> = (0..5).map(entry).collect();
        let list = encode_ima_binary(&all);
        let mut c = ImaCursor::at_boot_aggregate();
        // The quote covered 3 entries; 2 more were measured before we read the list.
        let s = c.ship(&list, &replay_pcr10([0; 32], &all[..3])).unwrap();
        assert_eq!((s.offset, s.count, s.replays), (0, 3, true));
        assert_eq!(parse_ima_binary(&s.entries).unwrap(), all[..3]);
        assert_eq!(c.offset, 3);
        // The next quote covers all five: the two left over go now.
        let s = c.ship(&list, &replay_pcr10([0; 32], &all)).unwrap();
        assert_eq!((s.offset, s.count, s.replays), (3, 2, true));
        assert_eq!(parse_ima_binary(&s.entries).unwrap(), all[3..]);
        // Nothing new measured: an empty shipment at the end.
        let s = c.ship(&list, &replay_pcr10([0; 32], &all)).unwrap();
        assert_eq!((s.offset, s.count, s.replays), (5, 0, true));
        assert!(s.entries.is_empty());
    }

    #[test]
    fn tpm_ima_cursor_without_a_match_ships_all_and_starts_over() {
        let all: Vec<ImaEntry> = (0..3).map(entry).collect();
        let list = encode_ima_binary(&all);
        let mut c = ImaCursor::at_boot_aggregate();
        c.ship(&list, &replay_pcr10([0; 32], &all[..1])).unwrap();
        // A PCR 10 the list cannot explain (something extended it outside IMA).
        let s = c.ship(&list, &[7; 32]).unwrap();
        assert_eq!((s.offset, s.count, s.replays), (1, 2, false));
        assert_eq!(c, ImaCursor::at_boot_aggregate());
        // So the next statement ships the whole list from the boot aggregate.
        let s = c.ship(&list, &replay_pcr10([0; 32], &all)).unwrap();
        assert_eq!((s.offset, s.count, s.replays), (0, 3, true));
    }

    #[test]
    fn tpm_ima_cursor_list_damage_is_an_error_and_starts_over() {
        let all: Vec<ImaEntry> = (0..2).map(entry).collect();
        let mut list = encode_ima_binary(&all);
        let mut c = ImaCursor::at_boot_aggregate();
        c.ship(&list, &replay_pcr10([0; 32], &all[..1])).unwrap();
        let last = list.len() - 1;
        list[last] ^= 1;
        assert!(c.ship(&list, &replay_pcr10([0; 32], &all)).is_err());
        assert_eq!(c, ImaCursor::at_boot_aggregate());
        // A list shorter than what was shipped: nothing replays, start over.
        let mut c = ImaCursor::at_boot_aggregate();
        let list = encode_ima_binary(&all);
        c.ship(&list, &replay_pcr10([0; 32], &all)).unwrap();
        let s = c.ship(&list[..10], &[9; 32]).unwrap();
        assert_eq!((s.offset, s.count, s.replays), (2, 0, false));
    }

    #[test]
    fn tpm_ima_cursor_prefers_the_fewest_entries() {
        // An entry for another PCR does not move PCR 10: it waits until a PCR 10 entry
        // after it is covered.
        let mut other = entry(1);
        other.pcr = 11;
        let all = vec![entry(0), other, entry(2)];
        let list = encode_ima_binary(&all);
        let mut c = ImaCursor::at_boot_aggregate();
        let s = c.ship(&list, &replay_pcr10([0; 32], &all[..1])).unwrap();
        assert_eq!(s.count, 1);
        let s = c.ship(&list, &replay_pcr10([0; 32], &all)).unwrap();
        assert_eq!((s.offset, s.count), (1, 2));
    }
}
