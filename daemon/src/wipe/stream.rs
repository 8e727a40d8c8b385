//! The keyed fill stream: AES-128 in counter mode.
//!
//! ```text
//! key        = SHA3-256("rackwarden/wipe-stream/v1" || 0x00 || nonce[32] || device_id)[0..16]
//! block i    = AES-128(key, i as a 128-bit big-endian integer)     (16 bytes)
//! byte at o  = block (o / 16), byte (o % 16)
//! ```
//! Identical to `openssl enc -aes-128-ctr -K <key> -iv 00..00` over zeros (tested), so anyone
//! holding the nonce can recompute any block without computing the ones before it, and
//! nobody can predict a byte before the verifier reveals the nonce. AES-NI runs it at several
//! GB/s per core, above memory bandwidth.

use aes::cipher::{BlockEncrypt, KeyInit, generic_array::GenericArray};
use sha3::{Digest, Sha3_256};

pub const DOMAIN: &[u8] = b"rackwarden/wipe-stream/v1";
/// Bytes generated per AES block.
pub const BLOCK: usize = 16;
/// Bytes generated and compared at once during verification (fits in L1).
const VERIFY_SPAN: usize = 4096;

#[derive(Clone)]
pub struct KeyedStream {
    cipher: aes::Aes128,
    /// Round keys for the VAES path, when this CPU has it.
    #[cfg(target_arch = "x86_64")]
    vaes: Option<super::vaes::RoundKeys>,
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
        let key = derive_key(nonce, device);
        KeyedStream {
            cipher: aes::Aes128::new(&GenericArray::from(key)),
            // SAFETY: `expand` needs AES-NI, which `available` checked.
            #[cfg(target_arch = "x86_64")]
            vaes: super::vaes::available().then(|| unsafe { super::vaes::expand(&key) }),
        }
    }

    /// The portable stream only (the `aes` crate), whatever the CPU: the reference the VAES
    /// path is tested against.
    pub fn portable(nonce: &[u8; 32], device: &str) -> KeyedStream {
        KeyedStream {
            cipher: aes::Aes128::new(&GenericArray::from(derive_key(nonce, device))),
            #[cfg(target_arch = "x86_64")]
            vaes: None,
        }
    }

    /// Whether the VAES path is in use.
    pub fn accelerated(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        return self.vaes.is_some();
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// Writes the stream bytes for `[offset, offset + out.len())` into `out`.
    /// `offset` and `out.len()` must be multiples of 16 (callers work in 1 MiB blocks).
    pub fn fill(&self, offset: u64, out: &mut [u8]) {
        debug_assert!(offset.is_multiple_of(BLOCK as u64) && out.len().is_multiple_of(BLOCK));
        #[cfg(target_arch = "x86_64")]
        if let Some(rk) = &self.vaes {
            let head = out.len() - out.len() % 512;
            // SAFETY: `vaes` is only set when the CPU passed `vaes::available`.
            unsafe { super::vaes::fill(rk, offset / BLOCK as u64, &mut out[..head]) };
            if head < out.len() {
                self.fill_portable(offset + head as u64, &mut out[head..]);
            }
            return;
        }
        self.fill_portable(offset, out);
    }

    fn fill_portable(&self, offset: u64, out: &mut [u8]) {
        let first = (offset / BLOCK as u64) as u128;
        for (i, b) in out.chunks_exact_mut(BLOCK).enumerate() {
            b.copy_from_slice(&(first + i as u128).to_be_bytes());
        }
        // SAFETY: `out` is a multiple of 16 bytes; aes::Block is [u8; 16] with alignment 1.
        let blocks = unsafe {
            std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut aes::Block, out.len() / BLOCK)
        };
        self.cipher.encrypt_blocks(blocks);
    }

    /// Number of 16-byte blocks of `data` (which starts at stream byte `offset`) that differ
    /// from the stream.
    pub fn count_mismatches(&self, offset: u64, data: &[u8]) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if let Some(rk) = &self.vaes
            && data.len().is_multiple_of(512)
        {
            // Fast path: compare in registers; only a differing span is recounted in detail.
            let mut bad = 0;
            for (i, span) in data.chunks(VERIFY_SPAN).enumerate() {
                let off = offset + (i * VERIFY_SPAN) as u64;
                // SAFETY: as in `fill`.
                if span.len() % 512 != 0
                    || !unsafe { super::vaes::equal(rk, off / BLOCK as u64, span) }
                {
                    bad += self.count_portable(off, span);
                }
            }
            return bad;
        }
        self.count_portable(offset, data)
    }

    fn count_portable(&self, offset: u64, data: &[u8]) -> u64 {
        let mut expect = [0u8; VERIFY_SPAN];
        let mut bad = 0u64;
        for (i, span) in data.chunks(VERIFY_SPAN).enumerate() {
            let e = &mut expect[..span.len()];
            self.fill(offset + (i * VERIFY_SPAN) as u64, e);
            if e != span {
                bad += span
                    .chunks(BLOCK)
                    .zip(e.chunks(BLOCK))
                    .filter(|(a, b)| a != b)
                    .count() as u64;
            }
        }
        bad
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_access_equals_sequential() {
        let s = KeyedStream::new(&[9u8; 32], "host-ram");
        let mut all = vec![0u8; 1 << 16];
        s.fill(0, &mut all);
        for off in [0usize, 16, 4096, 40_000, (1 << 16) - 32] {
            let mut part = vec![0u8; 32];
            s.fill(off as u64, &mut part);
            assert_eq!(&part[..], &all[off..off + 32], "offset {off}");
        }
        assert_eq!(s.count_mismatches(0, &all), 0);
        let mut bad = all.clone();
        bad[5000] ^= 1;
        bad[9000] ^= 1;
        assert_eq!(s.count_mismatches(0, &bad), 2);
    }

    #[test]
    fn accelerated_path_equals_the_portable_one() {
        let fast = KeyedStream::new(&[3u8; 32], "gpu0");
        let slow = KeyedStream::portable(&[3u8; 32], "gpu0");
        println!("VAES path in use: {}", fast.accelerated());
        for (off, len) in [
            (0u64, 512usize),
            (16, 4096),
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

    /// Known answer for nonce = 32 zero bytes, device `host-ram`, computed outside this code:
    /// the key with Python's hashlib.sha3_256, the first 32 stream bytes with
    /// `openssl enc -aes-128-ctr -nosalt -K <key> -iv 00..00` over zeros.
    #[test]
    fn known_answer() {
        let key = derive_key(&[0u8; 32], "host-ram");
        assert_eq!(hex::encode(key), KAT_KEY);
        let mut out = [0u8; 32];
        KeyedStream::new(&[0u8; 32], "host-ram").fill(0, &mut out);
        assert_eq!(hex::encode(out), KAT_STREAM);
    }

    const KAT_KEY: &str = "6045ba8decd46bf47711ff6aec2d5ba7";
    const KAT_STREAM: &str = "cd8b6d74b6be89f6a78bc9c684f82329486a7d184b721bece3c69ad65a9c0c01";

    #[test]
    fn matches_openssl_aes_128_ctr() {
        let nonce = [0x42u8; 32];
        let key = derive_key(&nonce, "gpu3");
        let mut ours = vec![0u8; 4096];
        KeyedStream::new(&nonce, "gpu3").fill(0, &mut ours);
        let mut child = std::process::Command::new("openssl")
            .args([
                "enc",
                "-aes-128-ctr",
                "-nosalt",
                "-K",
                &hex::encode(key),
                "-iv",
                &"00".repeat(16),
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("openssl (installed by cargo xtask setup)");
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&[0u8; 4096]).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.stdout, ours);
    }
}
