//! Images: the host refused no image, and every image it loaded is in the signed manifest.
//! A statement that loaded no image names its host as its one subject (in-toto wants at
//! least one): that subject must be this host and the key that signed.

use rackwarden_attest::statement::{HOST_KEY_DIGEST, IMAGE_DIGEST, Statement, Subject};

use super::{Context, FindingCode as C, Judge, Status};

/// Whether `s` is the host subject of this statement's own host and signing key.
fn is_this_host(s: &Subject, st: &Statement, ctx: &Context) -> bool {
    let p = &st.predicate;
    s.name == format!("host:{}/{}", p.rack_id, p.host_id)
        && s.digest.len() == 1
        && s.digest.get(HOST_KEY_DIGEST) == Some(&ctx.keyid)
}

pub(super) fn check(j: &mut Judge, st: &Statement, ctx: &Context) {
    if let Some(r) = &st.predicate.images {
        for i in r.images.iter().filter(|i| !i.ok) {
            j.add(
                C::ImageRefused,
                Status::Contraindicated,
                format!("{}: {}", i.name, i.finding.clone().unwrap_or_default()),
            );
        }
    }
    if let Some(allowed) = &j.policy.allowed_images {
        for s in st.subject.iter().filter(|s| !is_this_host(s, st, ctx)) {
            let d = s.digest.get(IMAGE_DIGEST).cloned().unwrap_or_default();
            if !allowed.contains(&d) {
                j.add(
                    C::ImageNotInManifest,
                    Status::Contraindicated,
                    format!("{} ({d}) is not in the signed manifest", s.name),
                );
            }
        }
    }
}
