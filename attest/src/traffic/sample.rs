//! Which bytes the verifier asks about: offsets derived from its randomness and the committed
//! root, so the host, and any auditor later, can re-derive exactly what was demanded.

use sha3::{
    Shake256,
    digest::{ExtendableOutput, Update, XofReader},
};

use super::{TrafficRoot, idx};
use crate::evidence::Direction;

/// The first bytes of the sampling input (`rackwarden/traffic-sample/v1` and a NUL).
pub const SAMPLE_DOMAIN: &[u8] = b"rackwarden/traffic-sample/v1\0";

/// `k` byte offsets in `dir`, each uniform over `0 .. root.bytes[dir]`, drawn with
/// replacement (the same offset may come twice; so may two offsets in one record).
///
/// The stream is SHAKE256 of [`SAMPLE_DOMAIN`] || `randomness` || `root.sha3_256` ||
/// u64_be(egress bytes) || u64_be(ingress bytes) || the direction byte (0 egress, 1
/// ingress), read as consecutive big-endian u64s. With `n` the direction's bytes and `m` the
/// largest multiple of `n` not above 2^64, a value `v < m` gives the offset `v mod n` and a
/// value `v >= m` is skipped, so every offset is exactly equally likely. The offsets for `k`
/// are the first `k` of those for any larger `k`. An empty direction gives none.
pub fn sample_offsets(
    randomness: &[u8; 32],
    root: &TrafficRoot,
    dir: Direction,
    k: u32,
) -> Vec<u64> {
    let n = root.bytes[idx(dir)];
    if n == 0 || k == 0 {
        return Vec::new();
    }
    let mut xof = Shake256::default();
    xof.update(SAMPLE_DOMAIN);
    xof.update(randomness);
    xof.update(&root.sha3_256);
    xof.update(&root.bytes[0].to_be_bytes());
    xof.update(&root.bytes[1].to_be_bytes());
    xof.update(&[idx(dir) as u8]);
    let mut reader = xof.finalize_xof();
    // 2^64 mod n; the values at or above m = 2^64 - rem would favour the low offsets.
    let rem = (u64::MAX % n + 1) % n;
    let accept = |v: u64| rem == 0 || v < 0u64.wrapping_sub(rem);
    // Each value is rejected with probability below 1/2, so k values need about 2k reads at
    // worst; the capacity is capped so that a large k does not allocate before it draws.
    let mut out = Vec::with_capacity(k.min(1 << 16) as usize);
    let mut block = [0u8; 8];
    while out.len() < k as usize {
        reader.read(&mut block);
        let v = u64::from_be_bytes(block);
        if accept(v) {
            out.push(v % n);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_of(egress: u64, ingress: u64) -> TrafficRoot {
        TrafficRoot {
            sha3_256: [7; 32],
            bytes: [egress, ingress],
            records: 3,
        }
    }

    /// The derivation written out from the documentation, without the rejection shortcut.
    fn reference(r: &[u8; 32], root: &TrafficRoot, dir: Direction, k: usize) -> Vec<u64> {
        let mut input = Vec::new();
        input.extend_from_slice(b"rackwarden/traffic-sample/v1\0");
        input.extend_from_slice(r);
        input.extend_from_slice(&root.sha3_256);
        input.extend_from_slice(&root.bytes[0].to_be_bytes());
        input.extend_from_slice(&root.bytes[1].to_be_bytes());
        input.push(match dir {
            Direction::Egress => 0,
            Direction::Ingress => 1,
        });
        let n = root.bytes[idx(dir)] as u128;
        let m = (1u128 << 64) / n * n;
        let mut stream = vec![0u8; 8 * 4 * k + 64];
        let mut xof = Shake256::default();
        xof.update(&input);
        xof.finalize_xof().read(&mut stream);
        stream
            .chunks(8)
            .map(|c| u64::from_be_bytes(c.try_into().unwrap()) as u128)
            .filter(|&v| v < m)
            .map(|v| (v % n) as u64)
            .take(k)
            .collect()
    }

    #[test]
    fn matches_the_documented_derivation() {
        let r = [0x42; 32];
        // Powers of two (nothing rejected), small n, and n just above 2^63 (about half of
        // all values rejected).
        for n in [1, 2, 3, 10, 1 << 20, 1_000_003, (1 << 63) + 1, u64::MAX] {
            for dir in Direction::ALL {
                let root = root_of(n, n / 2 + 1);
                let got = sample_offsets(&r, &root, dir, 50);
                assert_eq!(got, reference(&r, &root, dir, 50), "n={n} {dir:?}");
                let bound = root.bytes[idx(dir)];
                assert!(got.iter().all(|&o| o < bound));
            }
        }
    }

    #[test]
    fn deterministic_and_keyed() {
        let root = root_of(1_000_000, 5_000);
        let a = sample_offsets(&[1; 32], &root, Direction::Egress, 20);
        assert_eq!(a, sample_offsets(&[1; 32], &root, Direction::Egress, 20));
        assert_ne!(a, sample_offsets(&[2; 32], &root, Direction::Egress, 20));
        let mut other = root;
        other.sha3_256[0] ^= 1;
        assert_ne!(a, sample_offsets(&[1; 32], &other, Direction::Egress, 20));
        // Same count in both directions, still different streams.
        let same = root_of(1_000_000, 1_000_000);
        assert_ne!(
            sample_offsets(&[1; 32], &same, Direction::Egress, 20),
            sample_offsets(&[1; 32], &same, Direction::Ingress, 20)
        );
        // A smaller k is a prefix.
        assert_eq!(
            sample_offsets(&[1; 32], &root, Direction::Egress, 7),
            a[..7].to_vec()
        );
    }

    #[test]
    fn empty_direction_or_no_draws() {
        assert!(sample_offsets(&[1; 32], &root_of(0, 10), Direction::Egress, 5).is_empty());
        assert_eq!(
            sample_offsets(&[1; 32], &root_of(0, 10), Direction::Ingress, 5).len(),
            5
        );
        assert!(sample_offsets(&[1; 32], &root_of(9, 10), Direction::Ingress, 0).is_empty());
    }
}
