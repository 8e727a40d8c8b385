//! The keyed fill stream, v2: an AES-128 seed per 64 KiB segment, expanded per word by a
//! keyed bijection (the definition and the reason for two levels are in
//! `rackwarden_common::wipe`, which the GPU kernels share).
//!
//! ```text
//! key        = SHA3-256("rackwarden/wipe-stream/v2" || 0x00 || nonce[32] || device_id)[0..16]
//! seed(s)    = AES-128(key, s as a 128-bit big-endian integer)      s = offset / 65536
//! word(s, j) = lowbias32(j ^ k0) ^ k1                                 j = (offset % 65536) / 4
//! ```
//! Anyone holding the nonce recomputes any segment without the ones before it; nobody
//! predicts a byte before the verifier reveals the nonce. `testdata/wipe_stream_v2.py` is an
//! independent reference (hashlib + openssl) and the known answers below come from it.

use aes::cipher::{BlockEncrypt, KeyInit, generic_array::GenericArray};
use rackwarden_attest::{Digest as _, Sha3_256};
use rackwarden_common::wipe::{self as common, SEGMENT_BYTES, SegmentSeed};

pub const DOMAIN: &[u8] = b"rackwarden/wipe-stream/v2";
/// The unit of mismatch counting (one differing byte = one bad 16-byte block).
pub const BLOCK: usize = common::BLOCK_BYTES as usize;
/// Bytes compared at once during verification; a span that differs is recounted block by
/// block.
const VERIFY_SPAN: usize = 4096;

/// The instruction set the per-word loops run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Simd {
    Avx512,
    Avx2,
    Scalar,
}

impl Simd {
    fn detect() -> Simd {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Simd::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Simd::Avx2;
            }
        }
        Simd::Scalar
    }

    fn fill(self, seed: SegmentSeed, j0: u32, out: &mut [u8]) {
        match self {
            // SAFETY: `detect` chose these only when the CPU has the feature.
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512 => unsafe { common::host::fill_avx512(seed, j0, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `detect` chose AVX2 only when the CPU has it.
            Simd::Avx2 => unsafe { common::host::fill_avx2(seed, j0, out) },
            _ => common::host::fill_scalar(seed, j0, out),
        }
    }

    fn equal(self, seed: SegmentSeed, j0: u32, data: &[u8]) -> bool {
        match self {
            // SAFETY: as in `fill`.
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512 => unsafe { common::host::equal_avx512(seed, j0, data) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `detect` chose AVX2 only when the CPU has it.
            Simd::Avx2 => unsafe { common::host::equal_avx2(seed, j0, data) },
            _ => common::host::equal_scalar(seed, j0, data),
        }
    }
}

#[derive(Clone)]
pub struct KeyedStream {
    cipher: aes::Aes128,
    simd: Simd,
}

/// The AES key for `nonce` and `device`.
pub fn derive_key(nonce: &[u8; 32], device: &str) -> [u8; 16] {
    let mut h = Sha3_256::new();
    h.update(DOMAIN);
    h.update([0u8]);
    h.update(nonce);
    h.update(device.as_bytes());
    let d = h.finalize();
    let mut k = [0u8; 16];
    k.copy_from_slice(&d[..16]);
    k
}

impl KeyedStream {
    pub fn new(nonce: &[u8; 32], device: &str) -> KeyedStream {
        KeyedStream::with_simd(nonce, device, Simd::detect())
    }

    /// The plain scalar loops whatever the CPU: the reference the vector paths are tested
    /// against.
    pub fn scalar(nonce: &[u8; 32], device: &str) -> KeyedStream {
        KeyedStream::with_simd(nonce, device, Simd::Scalar)
    }

    fn with_simd(nonce: &[u8; 32], device: &str, simd: Simd) -> KeyedStream {
        KeyedStream {
            cipher: aes::Aes128::new(&GenericArray::from(derive_key(nonce, device))),
            simd,
        }
    }

    pub fn simd(&self) -> Simd {
        self.simd
    }

    /// The seed of segment `s`.
    pub fn seed(&self, s: u64) -> SegmentSeed {
        let mut b = GenericArray::from((s as u128).to_be_bytes());
        self.cipher.encrypt_block(&mut b);
        SegmentSeed::from_aes_block(&b.into())
    }

    /// Seeds of segments `first..first + out.len()` (the GPU's seed table), AES in batches so
    /// AES-NI pipelines.
    pub fn seeds(&self, first: u64, out: &mut [SegmentSeed]) {
        const BATCH: usize = 64;
        let mut blocks = [aes::Block::default(); BATCH];
        for (c, chunk) in out.chunks_mut(BATCH).enumerate() {
            let base = first + (c * BATCH) as u64;
            for (i, b) in blocks[..chunk.len()].iter_mut().enumerate() {
                *b = GenericArray::from(((base + i as u64) as u128).to_be_bytes());
            }
            self.cipher.encrypt_blocks(&mut blocks[..chunk.len()]);
            for (seed, b) in chunk.iter_mut().zip(&blocks) {
                *seed = SegmentSeed::from_aes_block(&(*b).into());
            }
        }
    }

    /// Calls `f(seed, first word, range in the buffer)` for each segment piece of the stream
    /// bytes `[offset, offset + len)`.
    fn pieces(
        &self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(SegmentSeed, u32, std::ops::Range<usize>),
    ) {
        let mut done = 0usize;
        while done < len {
            let at = offset + done as u64;
            let within = at % SEGMENT_BYTES;
            let n = ((SEGMENT_BYTES - within) as usize).min(len - done);
            f(
                self.seed(at / SEGMENT_BYTES),
                (within / 4) as u32,
                done..done + n,
            );
            done += n;
        }
    }

    /// Writes the stream bytes for `[offset, offset + out.len())` into `out`.
    /// `offset` and `out.len()` must be multiples of 16 (callers work in 1 MiB blocks).
    pub fn fill(&self, offset: u64, out: &mut [u8]) {
        debug_assert!(offset.is_multiple_of(BLOCK as u64) && out.len().is_multiple_of(BLOCK));
        self.pieces(offset, out.len(), |seed, j0, r| {
            self.simd.fill(seed, j0, &mut out[r])
        });
    }

    /// Number of 16-byte blocks of `data` (which starts at stream byte `offset`, a multiple
    /// of 16) that differ from the stream.
    pub fn count_mismatches(&self, offset: u64, data: &[u8]) -> u64 {
        debug_assert!(offset.is_multiple_of(BLOCK as u64) && data.len().is_multiple_of(BLOCK));
        let mut bad = 0u64;
        self.pieces(offset, data.len(), |seed, j0, r| {
            let piece = &data[r];
            for (i, span) in piece.chunks(VERIFY_SPAN).enumerate() {
                let js = j0 + (i * VERIFY_SPAN / 4) as u32;
                if !self.simd.equal(seed, js, span) {
                    bad += span
                        .chunks(BLOCK)
                        .enumerate()
                        .filter(|(b, blk)| {
                            !common::host::equal_scalar(seed, js + (b * BLOCK / 4) as u32, blk)
                        })
                        .count() as u64;
                }
            }
        });
        bad
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_access_equals_sequential() {
        let s = KeyedStream::new(&[9u8; 32], "host-ram");
        let mut all = vec![0u8; 1 << 18];
        s.fill(0, &mut all);
        for off in [0usize, 16, 4096, 40_000, 65_520, 131_072, (1 << 18) - 32] {
            let mut part = vec![0u8; 32];
            s.fill(off as u64, &mut part);
            assert_eq!(&part[..], &all[off..off + 32], "offset {off}");
        }
        assert_eq!(s.count_mismatches(0, &all), 0);
        let mut bad = all.clone();
        bad[5000] ^= 1;
        bad[9000] ^= 1;
        bad[70_000] ^= 0x80;
        assert_eq!(s.count_mismatches(0, &bad), 3);
        assert_eq!(s.count_mismatches(65_536, &bad[65_536..]), 1);
    }

    #[test]
    fn vector_paths_equal_the_scalar_one() {
        let fast = KeyedStream::new(&[3u8; 32], "gpu0");
        let slow = KeyedStream::scalar(&[3u8; 32], "gpu0");
        println!("vector path in use: {:?}", fast.simd());
        for (off, len) in [
            (0u64, 512usize),
            (16, 4096),
            (65_536 - 48, 4096),
            (1 << 20, (1 << 20) + 48),
            (4096 * 1000 + 32, 1040),
        ] {
            let mut a = vec![0u8; len];
            let mut b = vec![0u8; len];
            fast.fill(off, &mut a);
            slow.fill(off, &mut b);
            assert_eq!(a, b, "offset {off} len {len}");
            assert_eq!(fast.count_mismatches(off, &b), 0);
            b[len / 2] ^= 1;
            assert_eq!(fast.count_mismatches(off, &b), 1);
            assert_eq!(slow.count_mismatches(off, &b), 1);
        }
    }

    #[test]
    fn seed_table_equals_single_seeds() {
        let s = KeyedStream::new(&[5u8; 32], "gpu1");
        let mut table = vec![SegmentSeed::default(); 200];
        s.seeds(1000, &mut table);
        for (i, seed) in table.iter().enumerate() {
            assert_eq!(*seed, s.seed(1000 + i as u64), "segment {}", 1000 + i);
        }
    }

    #[test]
    fn nonces_and_devices_give_different_streams() {
        let mut a = [0u8; 64];
        let mut b = [0u8; 64];
        let mut c = [0u8; 64];
        KeyedStream::new(&[1u8; 32], "gpu0").fill(0, &mut a);
        KeyedStream::new(&[2u8; 32], "gpu0").fill(0, &mut b);
        KeyedStream::new(&[1u8; 32], "gpu1").fill(0, &mut c);
        assert_ne!(a, b);
        assert_ne!(a, c);
    }

    /// Known answers from `testdata/wipe_stream_v2.py`, which computes the key with Python's
    /// hashlib and the seeds with `openssl enc -aes-128-ecb`: nothing of ours.
    #[test]
    fn known_answers_from_the_independent_reference() {
        let raw = include_str!("../../testdata/wipe_stream_v2.json");
        let vectors: Vec<serde_json::Value> = serde_json::from_str(raw).unwrap();
        assert_eq!(vectors.len(), 5);
        for v in vectors {
            let nonce: [u8; 32] = hex::decode(v["nonce"].as_str().unwrap())
                .unwrap()
                .try_into()
                .unwrap();
            let device = v["device"].as_str().unwrap();
            let offset = v["offset"].as_u64().unwrap();
            let want = hex::decode(v["bytes"].as_str().unwrap()).unwrap();
            assert_eq!(
                hex::encode(derive_key(&nonce, device)),
                v["key"].as_str().unwrap()
            );
            let mut got = vec![0u8; want.len()];
            KeyedStream::new(&nonce, device).fill(offset, &mut got);
            assert_eq!(
                hex::encode(&got),
                hex::encode(&want),
                "{device} at {offset}"
            );
            KeyedStream::scalar(&nonce, device).fill(offset, &mut got);
            assert_eq!(
                hex::encode(&got),
                hex::encode(&want),
                "{device} at {offset} (scalar)"
            );
        }
    }

    /// The seeds are AES-128 of big-endian counters: the same as `openssl enc -aes-128-ecb`
    /// over those counters, run here and now.
    #[test]
    fn seeds_match_openssl_aes_128_ecb() {
        let nonce = [0x42u8; 32];
        let key = derive_key(&nonce, "gpu3");
        let counters: Vec<u8> = (0u128..256).flat_map(|c| c.to_be_bytes()).collect();
        let mut child = std::process::Command::new("openssl")
            .args([
                "enc",
                "-aes-128-ecb",
                "-nopad",
                "-nosalt",
                "-K",
                &hex::encode(key),
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("openssl (installed by cargo xtask setup)");
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&counters).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.stdout.len(), 4096);
        let mut table = vec![SegmentSeed::default(); 256];
        KeyedStream::new(&nonce, "gpu3").seeds(0, &mut table);
        for (i, seed) in table.iter().enumerate() {
            let block: [u8; 16] = out.stdout[i * 16..i * 16 + 16].try_into().unwrap();
            assert_eq!(*seed, SegmentSeed::from_aes_block(&block), "segment {i}");
        }
    }
}
