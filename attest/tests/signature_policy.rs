//! The one signature policy every check in rackwarden uses (envelopes here; log checkpoints
//! and enrolment go through the same `verify_strict`): ed25519-dalek's `verify_strict`.
//! These signatures satisfy the cofactorless equation `[s]B = R + [k]A` yet must be refused:
//! a weak (small-order) key, a small-order R, a non-canonical s. The plain `verify` accepts
//! some of them, which is what each test shows first, so a weaker policy fails here.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::{Engine as _, engine::general_purpose::STANDARD as B64};
use curve25519_dalek::{
    constants::{ED25519_BASEPOINT_POINT as B, EIGHT_TORSION},
    edwards::EdwardsPoint,
    scalar::Scalar,
    traits::IsIdentity,
};
use ed25519_dalek::{Signature, Signer as _, SigningKey, Verifier as _, VerifyingKey};
use rackwarden_attest::{
    dsse::{self, Envelope, EnvelopeError, INTOTO_PAYLOAD_TYPE},
    keys::keyid,
};
use sha2::{Digest as _, Sha512};

fn envelope(vk: &VerifyingKey, body: &[u8], sig: &Signature) -> Envelope {
    Envelope {
        payload: B64.encode(body),
        payload_type: INTOTO_PAYLOAD_TYPE.into(),
        signatures: vec![dsse::Signature {
            keyid: keyid(vk),
            sig: B64.encode(sig.to_bytes()),
        }],
        tpm: None,
    }
}

fn refused(vk: &VerifyingKey, body: &[u8], sig: &Signature) -> bool {
    matches!(
        dsse::verify_envelope(&envelope(vk, body, sig), vk, INTOTO_PAYLOAD_TYPE),
        Err(EnvelopeError::BadSignature)
    )
}

fn challenge(r: &[u8; 32], vk: &VerifyingKey, m: &[u8]) -> Scalar {
    let mut h = Sha512::new();
    h.update(r);
    h.update(vk.as_bytes());
    h.update(m);
    Scalar::from_hash(h)
}

fn scalar(seed: u8) -> Scalar {
    Scalar::from_hash(Sha512::new_with_prefix([seed]))
}

#[test]
fn a_good_signature_passes_and_every_bit_flip_is_refused() {
    let key = SigningKey::from_bytes(&[7; 32]);
    let vk = key.verifying_key();
    let body = b"{\"x\":1}";
    let pae = dsse::pae(INTOTO_PAYLOAD_TYPE, body);
    let sig = key.sign(&pae);
    assert!(dsse::verify_envelope(&envelope(&vk, body, &sig), &vk, INTOTO_PAYLOAD_TYPE).is_ok());
    for bit in 0..512 {
        let mut b = sig.to_bytes();
        b[bit / 8] ^= 1 << (bit % 8);
        assert!(refused(&vk, body, &Signature::from_bytes(&b)), "bit {bit}");
    }
}

#[test]
fn a_non_canonical_s_is_refused() {
    let key = SigningKey::from_bytes(&[9; 32]);
    let vk = key.verifying_key();
    let body = b"statement";
    let sig = key.sign(&dsse::pae(INTOTO_PAYLOAD_TYPE, body));
    // s + L: the same scalar mod L, only its encoding is wrong (L < 2^253, so it fits).
    const L: [u8; 32] = [
        0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde,
        0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
    ];
    let (mut s, mut carry) = (*sig.s_bytes(), 0u16);
    for (x, l) in s.iter_mut().zip(L) {
        let v = *x as u16 + l as u16 + carry;
        *x = v as u8;
        carry = v >> 8;
    }
    assert_eq!(Scalar::from_bytes_mod_order(s).to_bytes(), *sig.s_bytes());
    assert!(refused(
        &vk,
        body,
        &Signature::from_components(*sig.r_bytes(), s)
    ));
}

/// A = [a]B + T8 (T8 of order 8) and s = k a: the equation gives R = -[k]T8, so for each
/// small-order R some body puts the challenge k there. `verify` accepts such a signature.
#[test]
fn a_small_order_r_is_refused_even_when_the_equation_holds() {
    let a = scalar(1);
    let t8 = *EIGHT_TORSION
        .iter()
        .find(|t| !(Scalar::from(4u8) * **t).is_identity())
        .unwrap();
    let vk = VerifyingKey::from_bytes(&(a * B + t8).compress().to_bytes()).unwrap();
    for t in EIGHT_TORSION.iter().filter(|t| !t.is_identity()) {
        let r = t.compress().to_bytes();
        let (body, sig) = (0u32..2000)
            .find_map(|i| {
                let body = format!("{{\"i\":{i}}}").into_bytes();
                let k = challenge(&r, &vk, &dsse::pae(INTOTO_PAYLOAD_TYPE, &body));
                (-(k * t8) == *t).then(|| (body, Signature::from_components(r, (k * a).to_bytes())))
            })
            .expect("a body whose challenge puts -[k]T8 on R");
        let pae = dsse::pae(INTOTO_PAYLOAD_TYPE, &body);
        assert!(vk.verify(&pae, &sig).is_ok(), "the equation holds");
        assert!(
            refused(&vk, &body, &sig),
            "small-order R {}",
            hex::encode(r)
        );
    }
}

/// A weak key (A of small order): R = [s]B satisfies the equation for every message.
#[test]
fn a_small_order_key_is_refused() {
    let body = b"forged";
    let pae = dsse::pae(INTOTO_PAYLOAD_TYPE, body);
    let mut weak_accepted_by_verify = 0;
    for t in EIGHT_TORSION.iter() {
        let weak = VerifyingKey::from_bytes(&t.compress().to_bytes()).unwrap();
        let s = scalar(2);
        let sig = Signature::from_components((s * B).compress().to_bytes(), s.to_bytes());
        let k = challenge(sig.r_bytes(), &weak, &pae);
        if EdwardsPoint::vartime_double_scalar_mul_basepoint(&k, &-weak.to_edwards(), &s)
            .compress()
            .to_bytes()
            == *sig.r_bytes()
            && weak.verify(&pae, &sig).is_ok()
        {
            weak_accepted_by_verify += 1;
        }
        assert!(
            refused(&weak, body, &sig),
            "weak key {}",
            hex::encode(weak.as_bytes())
        );
    }
    assert!(
        weak_accepted_by_verify > 0,
        "no weak-key forgery that verify accepts"
    );
}
