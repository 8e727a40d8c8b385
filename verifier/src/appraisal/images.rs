//! Images: the host refused no image, and every image it loaded is in the signed manifest.

use rackwarden_attest::statement::{IMAGE_DIGEST, Statement};

use super::{FindingCode as C, Judge, Status};

pub(super) fn check(j: &mut Judge, st: &Statement) {
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
        for s in &st.subject {
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
