//! Each flow's two byte streams, put back in order, and what each epoch added to them.
//!
//! TCP: segments are placed by sequence number, so reordering is undone and a byte sent twice
//! (a retransmit) enters the stream once and is counted as retransmitted. UDP and frames
//! without ports: each frame's payload is appended in the order the tap saw it. Each epoch,
//! every flow that carried a frame yields its part of both streams (from which offset, which
//! bytes) and the frame bytes it carried per direction; those frame bytes add up, over all
//! flows, to exactly what the tap saw.

use std::collections::{BTreeMap, HashMap};

use rackwarden_attest::evidence::Direction;

use super::frame::{FlowId, ParsedFrame, TcpSegment};

/// Out-of-order TCP bytes held per stream waiting for a gap to fill. A stream that holds more
/// stops holding: later segments are counted as retransmitted-or-lost (their frame bytes are
/// still committed), and the flow's record says the stream has a hole.
const MAX_HELD_BYTES: usize = 16 << 20;

/// One direction of one flow, across epochs.
#[derive(Default)]
struct Stream {
    /// The TCP sequence number of stream offset 0 (None until the first segment).
    base: Option<u32>,
    /// The stream offset of the next byte expected in order.
    next: u64,
    /// Segments ahead of `next`, by stream offset.
    held: BTreeMap<u64, Vec<u8>>,
    held_bytes: usize,
    /// This epoch's part.
    epoch: EpochPart,
}

/// What one direction of a flow added in the epoch being recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EpochPart {
    /// Stream offset of `bytes[0]`.
    pub start: u64,
    /// The in-order bytes this epoch added.
    pub bytes: Vec<u8>,
    /// Frame bytes (as the kernel charged them) of this direction's frames this epoch.
    pub wire: u64,
    /// Payload bytes that arrived again (TCP retransmits) and were kept once.
    pub retransmitted: u64,
    /// Payload bytes dropped from the stream because too much was held out of order: the
    /// stream has a hole here.
    pub unheld: u64,
    pub frames: u64,
}

impl Stream {
    fn begin_epoch(&mut self) {
        self.epoch = EpochPart {
            start: self.next,
            ..EpochPart::default()
        };
    }

    fn deliver(&mut self, data: &[u8]) {
        self.epoch.bytes.extend_from_slice(data);
        self.next += data.len() as u64;
    }

    fn push_datagram(&mut self, payload: &[u8]) {
        self.deliver(payload);
    }

    fn push_tcp(&mut self, seg: TcpSegment, payload: &[u8]) {
        let base = *self.base.get_or_insert_with(|| {
            if seg.syn {
                seg.seq.wrapping_add(1)
            } else {
                seg.seq
            }
        });
        if payload.is_empty() {
            return;
        }
        // Where the segment starts, relative to `next`, in a window of +-2 GiB: sequence
        // numbers wrap at 4 GiB, stream offsets do not.
        let expected = base.wrapping_add(self.next as u32);
        let delta = i64::from(seg.seq.wrapping_sub(expected) as i32);
        let Some(at) = self.next.checked_add_signed(delta) else {
            // Before the stream's start: an old duplicate.
            self.epoch.retransmitted += payload.len() as u64;
            return;
        };
        self.place(at, payload);
        self.release_held();
    }

    /// Puts the bytes at stream offset `at` in order, or holds them.
    fn place(&mut self, at: u64, payload: &[u8]) {
        let end = at + payload.len() as u64;
        if end <= self.next {
            self.epoch.retransmitted += payload.len() as u64;
            return;
        }
        if at <= self.next {
            let skip = (self.next - at) as usize;
            self.epoch.retransmitted += skip as u64;
            self.deliver(&payload[skip..]);
            return;
        }
        if self.held.contains_key(&at) {
            // The same start again: keep the longer one, count the other as retransmitted.
            let old = self.held.get(&at).map(Vec::len).unwrap_or(0);
            if old >= payload.len() {
                self.epoch.retransmitted += payload.len() as u64;
                return;
            }
            self.epoch.retransmitted += old as u64;
            self.held_bytes -= old;
        }
        if self.held_bytes + payload.len() > MAX_HELD_BYTES {
            self.epoch.unheld += payload.len() as u64;
            return;
        }
        self.held_bytes += payload.len();
        self.held.insert(at, payload.to_vec());
    }

    fn release_held(&mut self) {
        while let Some((&at, _)) = self.held.first_key_value() {
            if at > self.next {
                break;
            }
            let Some((_, data)) = self.held.pop_first() else {
                break;
            };
            self.held_bytes -= data.len();
            self.place(at, &data);
        }
    }

    /// Bytes still held out of order (the stream has a gap before them).
    fn held(&self) -> usize {
        self.held_bytes
    }
}

/// Both directions of one flow.
#[derive(Default)]
struct Flow {
    streams: [Stream; 2],
    active: bool,
}

/// One flow's epoch: its two parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowEpoch {
    pub flow: FlowId,
    pub egress: EpochPart,
    pub ingress: EpochPart,
    /// Bytes held out of order at the cut, egress and ingress (not yet in the streams).
    pub held: [u64; 2],
}

#[derive(Default)]
pub struct FlowTable {
    flows: HashMap<FlowId, Flow>,
    /// Payload bytes the flows hold in memory for the current epoch.
    buffered: u64,
}

impl FlowTable {
    /// Adds one tapped frame (`frame_len` bytes as charged) to its flow.
    pub fn push(&mut self, dir: Direction, frame: &[u8], parsed: &ParsedFrame) {
        let flow = self.flows.entry(parsed.flow).or_insert_with(|| {
            let mut f = Flow::default();
            for s in &mut f.streams {
                s.begin_epoch();
            }
            f
        });
        flow.active = true;
        let s = &mut flow.streams[rackwarden_attest::traffic::idx(dir)];
        s.epoch.wire += frame.len() as u64;
        s.epoch.frames += 1;
        let payload = frame.get(parsed.payload.clone()).unwrap_or(&[]);
        let before = s.epoch.bytes.len();
        match parsed.tcp {
            Some(seg) => s.push_tcp(seg, payload),
            None => s.push_datagram(payload),
        }
        self.buffered += (s.epoch.bytes.len() - before) as u64;
    }

    /// Payload bytes held in memory for the epoch in progress.
    pub fn buffered(&self) -> u64 {
        self.buffered
    }

    /// Ends the epoch: every flow that carried a frame, in a fixed order (by flow), and a
    /// fresh epoch for all. Flows that carried nothing this epoch and hold nothing are
    /// forgotten.
    pub fn cut(&mut self) -> Vec<FlowEpoch> {
        let mut out = Vec::new();
        self.flows.retain(|id, f| {
            if f.active {
                let [e, i] = &mut f.streams;
                out.push(FlowEpoch {
                    flow: *id,
                    egress: std::mem::take(&mut e.epoch),
                    ingress: std::mem::take(&mut i.epoch),
                    held: [e.held() as u64, i.held() as u64],
                });
            }
            let keep = f.active || f.streams.iter().any(|s| s.held() > 0);
            f.active = false;
            for s in &mut f.streams {
                s.begin_epoch();
            }
            keep
        });
        self.buffered = 0;
        out.sort_by_key(|f| f.flow);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::taps::frame::parse;

    fn frame(seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
        crate::taps::frame::tests::tcp4(seq, flags, payload)
    }

    #[test]
    fn reordered_and_retransmitted_segments_make_one_stream() {
        let mut t = FlowTable::default();
        let syn = frame(99, 0x02, b"");
        let segs = [
            frame(100, 0x10, b"hello "),
            frame(112, 0x10, b"wide "), // ahead: held
            frame(106, 0x10, b"there "),
            frame(100, 0x10, b"hello "), // retransmit
            frame(109, 0x10, b"re wi"),  // overlaps bytes already in order
            frame(117, 0x10, b"world"),
        ];
        let mut wire = 0;
        for f in std::iter::once(&syn).chain(segs.iter()) {
            wire += f.len() as u64;
            t.push(Direction::Egress, f, &parse(f, Direction::Egress));
        }
        let out = t.cut();
        assert_eq!(out.len(), 1);
        let e = &out[0].egress;
        assert_eq!(e.bytes, b"hello there wide world");
        assert_eq!(e.start, 0);
        assert_eq!(e.retransmitted, 6 + 5);
        assert_eq!(e.wire, wire, "every frame byte belongs to the flow");
        // The next epoch continues the stream where this one stopped.
        let more = frame(122, 0x10, b"!");
        t.push(Direction::Egress, &more, &parse(&more, Direction::Egress));
        let out = t.cut();
        assert_eq!(out[0].egress.start, 22);
        assert_eq!(out[0].egress.bytes, b"!");
    }

    #[test]
    fn a_gap_at_the_cut_is_held_and_reported() {
        let mut t = FlowTable::default();
        for f in [frame(1, 0x10, b"ab"), frame(5, 0x10, b"ef")] {
            t.push(Direction::Egress, &f, &parse(&f, Direction::Egress));
        }
        let out = t.cut();
        assert_eq!(out[0].egress.bytes, b"ab");
        assert_eq!(out[0].held, [2, 0]);
        let f = frame(3, 0x10, b"cd");
        t.push(Direction::Egress, &f, &parse(&f, Direction::Egress));
        let out = t.cut();
        assert_eq!(out[0].egress.bytes, b"cdef");
        assert_eq!(out[0].held, [0, 0]);
    }

    #[test]
    fn sequence_numbers_wrap_without_breaking_the_stream() {
        let mut t = FlowTable::default();
        for f in [frame(u32::MAX - 1, 0x10, b"abc"), frame(1, 0x10, b"de")] {
            t.push(Direction::Ingress, &f, &parse(&f, Direction::Ingress));
        }
        assert_eq!(t.cut()[0].ingress.bytes, b"abcde");
    }
}
