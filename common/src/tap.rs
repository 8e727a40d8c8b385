//! The tap: how the policer hands every packet it passes to the daemon. Shared by the tapped
//! policer object (`ebpf/src/tap.rs`) and the daemon's reader (`daemon/src/taps/ring.rs`).
//!
//! A passed frame is copied into the ring buffer `RW_TAP` as one or more chunks, each a slot
//! reserved in the ring: a [`TapChunkHeader`] followed by room for 128, 1,536 or
//! [`TAP_CHUNK_BYTES`] bytes, of which the header's `chunk_len` are the frame's. The chunks of
//! one frame are written by one program run on one CPU, in order, so the reader puts a frame
//! together per (CPU, direction) and knows it whole when the bytes add up to `frame_len`. A
//! frame the ring cannot take whole is dropped by the policer (fail closed): the kernel's
//! passed counters then count only frames that were tapped whole.

/// Bytes of frame data in one chunk. A 1,500-byte MTU frame is one chunk; a GSO super-packet
/// (up to 64 KiB at tc) is up to 17.
pub const TAP_CHUNK_BYTES: u32 = 4096;
/// The most chunks one frame may take. Larger frames (BIG TCP: GSO above 64 KiB) are
/// dropped and counted as `too_large` in [`TapStats`].
pub const TAP_MAX_CHUNKS: u32 = 20;
/// The largest frame the tap records.
pub const TAP_MAX_FRAME: u32 = TAP_CHUNK_BYTES * TAP_MAX_CHUNKS;
/// The ring buffer's size: 32 MiB, about 3 s of traffic at 10 MB/s, the time the daemon may
/// fall behind before the tap starts dropping.
pub const TAP_RING_BYTES: u32 = 32 * 1024 * 1024;
/// `TapChunkHeader::magic`: the reader refuses anything else (a foreign writer, a layout
/// change).
pub const TAP_CHUNK_MAGIC: u32 = 0x5257_5431; // "RWT1"

/// What precedes each chunk's bytes in the ring.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TapChunkHeader {
    pub magic: u32,
    /// `DIR_EGRESS` or `DIR_INGRESS`.
    pub dir: u32,
    /// The CPU the program ran on (`bpf_get_smp_processor_id`).
    pub cpu: u32,
    /// The whole frame's length (`skb->len`), as charged to the bucket.
    pub frame_len: u32,
    /// Where in the frame this chunk's bytes start.
    pub chunk_offset: u32,
    /// How many bytes follow this header.
    pub chunk_len: u32,
    /// Per CPU and direction, the frame's number: a gap tells the reader a frame was dropped
    /// after some of its chunks were written.
    pub frame_seq: u64,
    /// `bpf_ktime_get_ns` when the frame was charged.
    pub ktime_ns: u64,
}

/// Per CPU and direction, what the tap could not record (each such frame was dropped) and
/// the frame numbers it handed out.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TapStats {
    /// Frames dropped because the ring was full (the daemon fell behind or is down).
    pub ring_full_frames: u64,
    pub ring_full_bytes: u64,
    /// Frames dropped because they were larger than [`TAP_MAX_FRAME`].
    pub too_large_frames: u64,
    pub too_large_bytes: u64,
    /// Frames dropped because the frame's bytes could not be read (`bpf_skb_load_bytes`).
    pub unreadable_frames: u64,
    pub unreadable_bytes: u64,
    /// The next frame number on this CPU and direction.
    pub next_frame_seq: u64,
}

impl TapStats {
    /// Field-wise sum (the per-CPU values folded); `next_frame_seq` is summed too, so it
    /// reads as the number of frames the tap numbered.
    pub fn add(&mut self, o: &TapStats) {
        self.ring_full_frames = self.ring_full_frames.wrapping_add(o.ring_full_frames);
        self.ring_full_bytes = self.ring_full_bytes.wrapping_add(o.ring_full_bytes);
        self.too_large_frames = self.too_large_frames.wrapping_add(o.too_large_frames);
        self.too_large_bytes = self.too_large_bytes.wrapping_add(o.too_large_bytes);
        self.unreadable_frames = self.unreadable_frames.wrapping_add(o.unreadable_frames);
        self.unreadable_bytes = self.unreadable_bytes.wrapping_add(o.unreadable_bytes);
        self.next_frame_seq = self.next_frame_seq.wrapping_add(o.next_frame_seq);
    }
}
