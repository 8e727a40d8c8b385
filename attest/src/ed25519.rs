//! Ed25519 verification that gives `ed25519_dalek::VerifyingKey::verify_strict`'s verdict on
//! every input, with one step of its work left out.
//!
//! `verify_strict` decompresses the signature's R (a square root in the field, about a tenth of
//! a verification) only to refuse an R of small order: the equation itself is then checked on
//! R's bytes. A point of small order has one of seven y coordinates, and an encoding's y is its
//! low 255 bits reduced mod p, so the encodings that decompress to such a point are 14 byte
//! strings (`SMALL_ORDER_Y`, either sign bit); this module refuses them by their bytes, as
//! libsodium does. Every other R gets the same verdict both ways: the recomputed R is the
//! canonical encoding of a point, so it can equal R's bytes only if R is that canonical encoding.
//! An R that does not decode, or that decodes from a non-canonical encoding, fails the comparison
//! here as it fails it there. The remaining steps are `verify_strict`'s own, in its order: s is
//! canonical (below the group order), A is not of small order, k = SHA-512(R || A || M) over the
//! bytes as given, and R = [s]B - [k]A, compressed. The tests hold the two to each other on the
//! edge cases (every small-order R and A, non-canonical s, R with a small-order component,
//! forgeries that pass the equation but not the checks) and on random and bit-flipped inputs.

use curve25519_dalek::{edwards::EdwardsPoint, scalar::Scalar};
use ed25519_dalek::{Signature, VerifyingKey};
use sha2::{Digest, Sha512};

/// The y coordinates of the eight points of order dividing 8, little-endian, and the two that
/// are below 19 again plus p (non-canonical encodings of the same y): with the sign bit
/// cleared, an encoding is one of these exactly when it decompresses to a small-order point.
const SMALL_ORDER_Y: [[u8; 32]; 7] = [
    // y = 0: the two points of order 4, (+-sqrt(-1), 0).
    [0; 32],
    // y = 1: the identity (and, with the sign bit, its non-canonical x = -0).
    one_at_start(0x01),
    // y = p - 1: the point of order 2, (0, -1).
    p_plus(-1),
    // y = p and p + 1: the non-canonical encodings of y = 0 and y = 1.
    p_plus(0),
    p_plus(1),
    // The two y coordinates of the four points of order 8.
    [
        0x26, 0xe8, 0x95, 0x8f, 0xc2, 0xb2, 0x27, 0xb0, 0x45, 0xc3, 0xf4, 0x89, 0xf2, 0xef, 0x98,
        0xf0, 0xd5, 0xdf, 0xac, 0x05, 0xd3, 0xc6, 0x33, 0x39, 0xb1, 0x38, 0x02, 0x88, 0x6d, 0x53,
        0xfc, 0x05,
    ],
    [
        0xc7, 0x17, 0x6a, 0x70, 0x3d, 0x4d, 0xd8, 0x4f, 0xba, 0x3c, 0x0b, 0x76, 0x0d, 0x10, 0x67,
        0x0f, 0x2a, 0x20, 0x53, 0xfa, 0x2c, 0x39, 0xcc, 0xc6, 0x4e, 0xc7, 0xfd, 0x77, 0x92, 0xac,
        0x03, 0x7a,
    ],
];

const fn one_at_start(b: u8) -> [u8; 32] {
    let mut y = [0; 32];
    y[0] = b;
    y
}

/// p + d for small d, little-endian: p = 2^255 - 19 is ed ff .. ff 7f.
const fn p_plus(d: i8) -> [u8; 32] {
    let mut y = [0xff; 32];
    y[0] = (0xed_i16 + d as i16) as u8;
    y[31] = 0x7f;
    y
}

/// Whether `encoding` decompresses to a point of small order (the sign bit does not matter:
/// -T is of small order when T is).
fn is_small_order_encoding(encoding: &[u8; 32]) -> bool {
    let mut y = *encoding;
    y[31] &= 0x7f;
    SMALL_ORDER_Y.contains(&y)
}

/// `key.verify_strict(message, sig).is_ok()`, computed without decompressing R (see the module
/// documentation for why the verdicts are the same).
pub fn verify_strict(key: &VerifyingKey, message: &[u8], sig: &Signature) -> bool {
    let Some(s) = Option::<Scalar>::from(Scalar::from_canonical_bytes(*sig.s_bytes())) else {
        return false;
    };
    let r = sig.r_bytes();
    if is_small_order_encoding(r) || key.is_weak() {
        return false;
    }
    let mut h = Sha512::new();
    h.update(r);
    h.update(key.as_bytes());
    h.update(message);
    let k = Scalar::from_hash(h);
    let minus_a = -key.to_edwards();
    EdwardsPoint::vartime_double_scalar_mul_basepoint(&k, &minus_a, &s)
        .compress()
        .as_bytes()
        == r
}

#[cfg(test)]
mod tests {
    use super::*;
    use curve25519_dalek::{
        constants::ED25519_BASEPOINT_POINT as B, edwards::CompressedEdwardsY, traits::IsIdentity,
    };
    use ed25519_dalek::{Signer as _, SigningKey};
    use proptest::prelude::*;

    fn dalek(key: &VerifyingKey, m: &[u8], sig: &Signature) -> bool {
        key.verify_strict(m, sig).is_ok()
    }

    /// Both verdicts, asserted equal; returns the verdict.
    fn agree(key: &VerifyingKey, m: &[u8], sig: &Signature) -> bool {
        let (theirs, ours) = (dalek(key, m, sig), verify_strict(key, m, sig));
        assert_eq!(
            theirs,
            ours,
            "verdicts differ: key {} sig {}",
            hex::encode(key.as_bytes()),
            hex::encode(sig.to_bytes())
        );
        ours
    }

    fn scalar(seed: u64) -> Scalar {
        let mut h = Sha512::new();
        h.update(seed.to_le_bytes());
        Scalar::from_hash(h)
    }

    /// The eight points of order dividing 8, found as the small-order component Q - [1/8][8]Q
    /// of points Q decompressed from hashes (not taken from the list under test).
    fn torsion_points() -> Vec<EdwardsPoint> {
        let inv8 = Scalar::from(8u8).invert();
        let mut found: Vec<EdwardsPoint> = Vec::new();
        let mut seed = 0u64;
        while found.len() < 8 {
            seed += 1;
            let y: [u8; 32] = Sha512::digest(seed.to_le_bytes())[..32].try_into().unwrap();
            let Some(q) = CompressedEdwardsY(y).decompress() else {
                continue;
            };
            let t = q - inv8 * q.mul_by_cofactor();
            assert!(t.is_small_order());
            if !found.contains(&t) {
                found.push(t);
            }
            assert!(seed < 10_000, "fewer than 8 torsion points found");
        }
        found
    }

    /// Every 32-byte string that decompresses to a point whose y is `t`'s: the canonical y,
    /// y + p where that is below 2^255, each with either sign bit.
    fn encodings_of_y(t: &EdwardsPoint) -> Vec<[u8; 32]> {
        let mut y = t.compress().to_bytes();
        y[31] &= 0x7f;
        let mut ys = vec![y];
        if y[1..].iter().all(|b| *b == 0) && y[0] < 19 {
            ys.push(p_plus(y[0] as i8));
        }
        ys.iter()
            .flat_map(|y| {
                let mut s = *y;
                s[31] |= 0x80;
                [*y, s]
            })
            .collect()
    }

    #[test]
    fn the_list_is_exactly_the_small_order_encodings() {
        let mut listed: Vec<[u8; 32]> = Vec::new();
        for t in torsion_points() {
            for e in encodings_of_y(&t) {
                assert!(is_small_order_encoding(&e), "missing {}", hex::encode(e));
                if let Some(p) = CompressedEdwardsY(e).decompress() {
                    assert!(p.is_small_order());
                }
                let mut y = e;
                y[31] &= 0x7f;
                if !listed.contains(&y) {
                    listed.push(y);
                }
            }
        }
        // And nothing else is listed: seven y values, each reached from a torsion point.
        assert_eq!(listed.len(), SMALL_ORDER_Y.len());
        for y in SMALL_ORDER_Y {
            assert!(
                listed.contains(&y),
                "listed but not small order: {}",
                hex::encode(y)
            );
        }
    }

    #[test]
    fn good_signatures_and_every_bit_flip() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let vk = key.verifying_key();
        for len in [0usize, 1, 64, 2316] {
            let m = vec![0x5a; len];
            let sig = key.sign(&m);
            assert!(agree(&vk, &m, &sig));
            let bytes = sig.to_bytes();
            for bit in 0..512 {
                let mut b = bytes;
                b[bit / 8] ^= 1 << (bit % 8);
                assert!(!agree(&vk, &m, &Signature::from_bytes(&b)));
            }
            let mut m2 = m.clone();
            m2.push(0);
            assert!(!agree(&vk, &m2, &sig));
        }
    }

    #[test]
    fn a_non_canonical_s_is_refused() {
        let key = SigningKey::from_bytes(&[9; 32]);
        let vk = key.verifying_key();
        let m = b"statement";
        let sig = key.sign(m);
        // s + L: the same scalar, non-canonical (L < 2^253, so s + L < 2^254 fits).
        const L: [u8; 32] = [
            0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9,
            0xde, 0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
        ];
        let (mut s, mut carry) = (*sig.s_bytes(), 0u16);
        for (x, l) in s.iter_mut().zip(L) {
            let v = *x as u16 + l as u16 + carry;
            *x = v as u8;
            carry = v >> 8;
        }
        // The same scalar mod L, so only its encoding is wrong.
        assert_eq!(Scalar::from_bytes_mod_order(s).to_bytes(), *sig.s_bytes());
        let forged = Signature::from_components(*sig.r_bytes(), s);
        assert!(!agree(&vk, m, &forged));
    }

    /// Signatures that satisfy the equation R = [s]B - [k]A but have R or A of small order,
    /// which the cofactorless equation alone would accept: both must refuse them.
    #[test]
    fn small_order_r_and_a_are_refused_even_when_the_equation_holds() {
        let a = scalar(1);
        let torsion = torsion_points();
        // A = [a]B + T8 with T8 of order 8, which generates all eight torsion points. With
        // s = k * a the equation gives R = -[k]T8: for each small-order R some message makes k
        // land there (one in eight does).
        let t8 = *torsion
            .iter()
            .find(|t| !(Scalar::from(4u8) * *t).is_identity())
            .unwrap();
        let vk = VerifyingKey::from_bytes(&(a * B + t8).compress().to_bytes()).unwrap();
        for t in &torsion {
            let r = t.compress().to_bytes();
            let forgery = (0u32..1000).find_map(|i| {
                let m = i.to_le_bytes();
                let mut h = Sha512::new();
                h.update(r);
                h.update(vk.as_bytes());
                h.update(m);
                let k = Scalar::from_hash(h);
                (-(k * t8) == *t).then(|| (m, Signature::from_components(r, (k * a).to_bytes())))
            });
            let (m, sig) = forgery.expect("a message that puts -[k]T8 on R");
            // The equation holds: only the small-order check can refuse it.
            let s = Scalar::from_canonical_bytes(*sig.s_bytes()).unwrap();
            let mut h = Sha512::new();
            h.update(r);
            h.update(vk.as_bytes());
            h.update(m);
            let lhs = EdwardsPoint::vartime_double_scalar_mul_basepoint(
                &Scalar::from_hash(h),
                &-vk.to_edwards(),
                &s,
            );
            assert_eq!(lhs.compress().to_bytes(), r);
            assert!(
                !agree(&vk, &m, &sig),
                "small-order R {} accepted",
                hex::encode(r)
            );
        }
        // A of small order (a weak key): with A the identity the equation holds for R = [s]B
        // whatever k is.
        let m = b"forged";
        for t in &torsion {
            for enc in encodings_of_y(t) {
                let Ok(weak) = VerifyingKey::from_bytes(&enc) else {
                    continue;
                };
                let s = scalar(2);
                let r = (s * B).compress().to_bytes();
                assert!(!agree(
                    &weak,
                    m,
                    &Signature::from_components(r, s.to_bytes())
                ));
            }
        }
    }

    /// A key with a small-order component, and R with one chosen so that the cofactorless
    /// equation holds: `verify_strict` accepts these (only small-order R and A are refused),
    /// and so must we.
    #[test]
    fn mixed_order_r_and_a_agree() {
        let m = b"mixed";
        let a = scalar(3);
        let torsion = torsion_points();
        let mut accepted = 0;
        for ta in &torsion {
            let big_a = a * B + ta;
            let Ok(vk) = VerifyingKey::from_bytes(&big_a.compress().to_bytes()) else {
                continue;
            };
            for (i, tr) in torsion.iter().enumerate() {
                let r = scalar(100 + i as u64);
                let big_r = (r * B + tr).compress().to_bytes();
                let mut h = Sha512::new();
                h.update(big_r);
                h.update(vk.as_bytes());
                h.update(m);
                let k = Scalar::from_hash(h);
                let s = r + k * a;
                // Holds exactly when [k](-T_A) = T_R; either way both must agree.
                if agree(&vk, m, &Signature::from_components(big_r, s.to_bytes())) {
                    accepted += 1;
                }
            }
        }
        assert!(accepted > 0, "no mixed-order case satisfied the equation");
    }

    proptest! {
        #[test]
        fn random_signatures_and_keys_agree(
            key in any::<[u8; 32]>(),
            sig in proptest::collection::vec(any::<u8>(), 64),
            m in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let sig = Signature::from_bytes(&sig.try_into().unwrap());
            if let Ok(vk) = VerifyingKey::from_bytes(&key) {
                agree(&vk, &m, &sig);
            }
        }

        #[test]
        fn valid_signatures_with_one_byte_changed_agree(
            seed in any::<[u8; 32]>(),
            m in proptest::collection::vec(any::<u8>(), 0..256),
            at in 0usize..64,
            to in any::<u8>(),
        ) {
            let key = SigningKey::from_bytes(&seed);
            let mut b = key.sign(&m).to_bytes();
            b[at] = to;
            agree(&key.verifying_key(), &m, &Signature::from_bytes(&b));
        }
    }
}
