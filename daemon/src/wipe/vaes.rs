//! AES-128-CTR with VAES (AVX-512: four AES blocks per instruction), for CPUs that have it.
//! Produces exactly the bytes of [`super::stream::KeyedStream`]'s portable path (the `aes`
//! crate); tests compare the two. Counters are built in registers and verification compares
//! in registers, so neither pass touches memory more than once.
//!
//! Block index `b` becomes the 128-bit big-endian counter `b`: eight zero bytes, then `b` as a
//! big-endian u64 (stream offsets are below 2^64 bytes, so the high half is always zero).

use core::arch::x86_64::*;

/// Whether this CPU runs the VAES path.
pub fn available() -> bool {
    std::arch::is_x86_feature_detected!("aes")
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("vaes")
}

#[derive(Clone, Copy)]
pub struct RoundKeys([__m128i; 11]);

// SAFETY: plain data (round keys).
unsafe impl Send for RoundKeys {}
unsafe impl Sync for RoundKeys {}

macro_rules! expand_step {
    ($k:expr, $rcon:literal) => {{
        let t = _mm_aeskeygenassist_si128($k, $rcon);
        let t = _mm_shuffle_epi32(t, 0xff);
        let mut k = $k;
        k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
        k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
        k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
        _mm_xor_si128(k, t)
    }};
}

/// AES-128 key schedule with AES-NI.
///
/// # Safety
/// The CPU must support AES-NI (see [`available`]).
#[target_feature(enable = "aes,sse2")]
pub unsafe fn expand(key: &[u8; 16]) -> RoundKeys {
    // SAFETY: unaligned load of 16 bytes we own.
    let k0 = unsafe { _mm_loadu_si128(key.as_ptr() as *const __m128i) };
    let k1 = expand_step!(k0, 0x01);
    let k2 = expand_step!(k1, 0x02);
    let k3 = expand_step!(k2, 0x04);
    let k4 = expand_step!(k3, 0x08);
    let k5 = expand_step!(k4, 0x10);
    let k6 = expand_step!(k5, 0x20);
    let k7 = expand_step!(k6, 0x40);
    let k8 = expand_step!(k7, 0x80);
    let k9 = expand_step!(k8, 0x1b);
    let k10 = expand_step!(k9, 0x36);
    RoundKeys([k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10])
}

/// Four big-endian counters `first..first+4` in one register.
#[target_feature(enable = "avx512f,avx512bw")]
fn counters(first: u64) -> __m512i {
    // Elements (u64, little-endian order): [0, b, 0, b+1, 0, b+2, 0, b+3], then each u64 is
    // byte-reversed so lane j reads 00..00 || BE64(b+j).
    let v = _mm512_set_epi64(
        (first + 3) as i64,
        0,
        (first + 2) as i64,
        0,
        (first + 1) as i64,
        0,
        first as i64,
        0,
    );
    let rev = _mm512_set_epi8(
        8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1,
        2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
        13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7,
    );
    _mm512_shuffle_epi8(v, rev)
}

/// Keystream for 8 registers (32 blocks, 512 bytes) starting at block `first`.
#[target_feature(enable = "avx512f,avx512bw,vaes")]
fn keystream8(rk: &[__m512i; 11], first: u64) -> [__m512i; 8] {
    let mut x = [_mm512_setzero_si512(); 8];
    for (i, xi) in x.iter_mut().enumerate() {
        *xi = _mm512_xor_si512(counters(first + 4 * i as u64), rk[0]);
    }
    for r in rk.iter().take(10).skip(1) {
        for xi in x.iter_mut() {
            *xi = _mm512_aesenc_epi128(*xi, *r);
        }
    }
    for xi in x.iter_mut() {
        *xi = _mm512_aesenclast_epi128(*xi, rk[10]);
    }
    x
}

#[target_feature(enable = "avx512f")]
fn broadcast(rk: &RoundKeys) -> [__m512i; 11] {
    let mut out = [_mm512_setzero_si512(); 11];
    for (o, k) in out.iter_mut().zip(rk.0.iter()) {
        *o = _mm512_broadcast_i32x4(*k);
    }
    out
}

/// Writes the keystream for blocks starting at `first_block` into `out` (a multiple of 512
/// bytes).
///
/// # Safety
/// The CPU must pass [`available`].
#[target_feature(enable = "avx512f,avx512bw,vaes")]
pub unsafe fn fill(rk: &RoundKeys, first_block: u64, out: &mut [u8]) {
    debug_assert!(out.len().is_multiple_of(512));
    let k = broadcast(rk);
    // Memory being wiped is written once and not read again soon: non-temporal stores skip
    // the read-for-ownership of each line, which otherwise doubles memory traffic.
    let streaming = (out.as_ptr() as usize).is_multiple_of(64);
    for (c, chunk) in out.chunks_exact_mut(512).enumerate() {
        let ks = keystream8(&k, first_block + 32 * c as u64);
        for (i, v) in ks.iter().enumerate() {
            let p = chunk.as_mut_ptr().wrapping_add(64 * i) as *mut __m512i;
            if streaming {
                // SAFETY: 64-byte aligned store inside the 512-byte chunk.
                unsafe { _mm512_stream_si512(p as *mut _, *v) };
            } else {
                // SAFETY: 64-byte store inside the 512-byte chunk.
                unsafe { _mm512_storeu_si512(p, *v) };
            }
        }
    }
    if streaming {
        // Order the non-temporal stores before anything that reads the memory back.
        _mm_sfence();
    }
}

/// True when `data` (a multiple of 512 bytes, starting at block `first_block`) equals the
/// keystream.
///
/// # Safety
/// The CPU must pass [`available`].
#[target_feature(enable = "avx512f,avx512bw,vaes")]
pub unsafe fn equal(rk: &RoundKeys, first_block: u64, data: &[u8]) -> bool {
    debug_assert!(data.len().is_multiple_of(512));
    let k = broadcast(rk);
    let mut acc = _mm512_setzero_si512();
    for (c, chunk) in data.chunks_exact(512).enumerate() {
        let ks = keystream8(&k, first_block + 32 * c as u64);
        for (i, v) in ks.iter().enumerate() {
            // SAFETY: 64-byte load inside the 512-byte chunk.
            let d = unsafe { _mm512_loadu_si512(chunk.as_ptr().add(64 * i) as *const __m512i) };
            acc = _mm512_or_si512(acc, _mm512_xor_si512(d, *v));
        }
    }
    _mm512_test_epi64_mask(acc, acc) == 0
}
