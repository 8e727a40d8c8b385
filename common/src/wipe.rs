//! The wipe stream after its per-segment seed: shared by the host wipe (daemon
//! `wipe::stream`) and the GPU kernels (`gpu-kernel/`), so both write and check exactly the
//! same bytes.
//!
//! ```text
//! key          = SHA3-256("rackwarden/wipe-stream/v2" || 0x00 || nonce[32] || device)[0..16]
//! seed(s)      = AES-128(key, s as a 128-bit big-endian integer)   segment s = offset / 65536
//! k0, k1       = seed bytes 0..4 and 4..8, each a little-endian u32
//! word(s, j)   = lowbias32(j ^ k0) ^ k1                             j = (offset % 65536) / 4
//! lowbias32(x) = x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16
//! bytes        = each word little-endian
//! ```
//!
//! Why two levels: the seed is the cryptographic part (nobody can predict a segment before the
//! nonce is revealed; anyone holding it can recompute any segment alone). The per-word part
//! only has to be a keyed bijection that is cheap enough to run at memory bandwidth: AES per
//! 16 bytes costs a GPU about 10x its HBM bandwidth, lowbias32 about 5 integer operations
//! per 4 bytes. Level 1 (README, "Wipes") trusts the measured daemon to read everything back,
//! so the per-word function needs no strength of its own beyond being keyed by the seed.
//!
//! SHA3 and AES stay on the host; this module is `no_std` so the PTX kernels can use it.

/// Bytes per seeded segment.
pub const SEGMENT_BYTES: u64 = 1 << 16;
/// 32-bit words per segment.
pub const SEGMENT_WORDS: u32 = (SEGMENT_BYTES / 4) as u32;
/// The unit in which mismatches are counted: one differing byte makes one bad 16-byte block.
pub const BLOCK_BYTES: u64 = 16;
/// 16-byte blocks per segment.
pub const SEGMENT_BLOCKS: u64 = SEGMENT_BYTES / BLOCK_BYTES;

/// The two seed words of one segment (`k0`, `k1` above), as the GPU kernels read them from
/// the seed table the host uploads (aligned to 8 so a kernel reads one with one load).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentSeed {
    pub k0: u32,
    pub k1: u32,
}

impl SegmentSeed {
    /// `k0`, `k1` from the first 8 bytes of the AES output for the segment.
    pub fn from_aes_block(block: &[u8; 16]) -> SegmentSeed {
        SegmentSeed {
            k0: u32::from_le_bytes([block[0], block[1], block[2], block[3]]),
            k1: u32::from_le_bytes([block[4], block[5], block[6], block[7]]),
        }
    }
}

/// Word `j` (0..16384) of the segment with `seed`.
#[inline(always)]
pub fn stream_word(seed: SegmentSeed, j: u32) -> u32 {
    let mut x = j ^ seed.k0;
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x ^ seed.k1
}

/// The four words of 16-byte block `b` (0..4096) of the segment with `seed`.
#[inline(always)]
pub fn stream_block(seed: SegmentSeed, b: u32) -> [u32; 4] {
    let j = b * 4;
    [
        stream_word(seed, j),
        stream_word(seed, j + 1),
        stream_word(seed, j + 2),
        stream_word(seed, j + 3),
    ]
}

/// Writes words `j0..` of one segment into `out` (a multiple of 4 bytes, within the segment).
#[inline(always)]
pub fn fill_segment_bytes(seed: SegmentSeed, j0: u32, out: &mut [u8]) {
    for (i, w) in out.chunks_exact_mut(4).enumerate() {
        w.copy_from_slice(&stream_word(seed, j0 + i as u32).to_le_bytes());
    }
}

/// Whether `data` equals words `j0..` of one segment. Branch-free, so it vectorises; callers
/// recount a span in detail only when this says it differs.
#[inline(always)]
pub fn segment_bytes_equal(seed: SegmentSeed, j0: u32, data: &[u8]) -> bool {
    let mut diff = 0u32;
    for (i, w) in data.chunks_exact(4).enumerate() {
        diff |= u32::from_le_bytes([w[0], w[1], w[2], w[3]]) ^ stream_word(seed, j0 + i as u32);
    }
    diff == 0
}

/// Out-of-line entry points for the host. They live here, not in the daemon, so they are
/// compiled at this crate's optimisation level in every profile (see the workspace
/// Cargo.toml), and once per instruction set so the loops vectorise on the CPU at hand.
#[cfg(not(any(target_arch = "bpf", target_arch = "nvptx64")))]
pub mod host {
    use super::{SegmentSeed, fill_segment_bytes, segment_bytes_equal};

    pub fn fill_scalar(seed: SegmentSeed, j0: u32, out: &mut [u8]) {
        fill_segment_bytes(seed, j0, out)
    }

    pub fn equal_scalar(seed: SegmentSeed, j0: u32, data: &[u8]) -> bool {
        segment_bytes_equal(seed, j0, data)
    }

    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    pub unsafe fn fill_avx2(seed: SegmentSeed, j0: u32, out: &mut [u8]) {
        fill_segment_bytes(seed, j0, out)
    }

    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    pub unsafe fn equal_avx2(seed: SegmentSeed, j0: u32, data: &[u8]) -> bool {
        segment_bytes_equal(seed, j0, data)
    }

    /// # Safety
    /// The CPU must have AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fill_avx512(seed: SegmentSeed, j0: u32, out: &mut [u8]) {
        fill_segment_bytes(seed, j0, out)
    }

    /// # Safety
    /// The CPU must have AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn equal_avx512(seed: SegmentSeed, j0: u32, data: &[u8]) -> bool {
        segment_bytes_equal(seed, j0, data)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn a_segment_is_a_permutation_of_its_word_indices() {
        // lowbias32 is a bijection, so no two words of a segment are equal.
        let seed = SegmentSeed {
            k0: 0xdead_beef,
            k1: 0x0123_4567,
        };
        let mut seen: std::vec::Vec<u32> =
            (0..SEGMENT_WORDS).map(|j| stream_word(seed, j)).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), SEGMENT_WORDS as usize);
    }

    #[test]
    fn block_fill_and_compare_agree() {
        let seed = SegmentSeed { k0: 7, k1: 9 };
        let mut buf = [0u8; 64];
        fill_segment_bytes(seed, 8, &mut buf);
        assert!(segment_bytes_equal(seed, 8, &buf));
        assert_eq!(&buf[16..20], &stream_block(seed, 3)[0].to_le_bytes());
        buf[33] ^= 1;
        assert!(!segment_bytes_equal(seed, 8, &buf));
    }
}
