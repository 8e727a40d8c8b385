//! The stolen-key forgery of issue 22 and the rest of the TPM attack matrix, end to end on a
//! host: a real `rackwardend` with a TPM (swtpm, EK certificate from its own CA) and a
//! simulated IMA list, a real `rackwarden-verifier` that enrols the daemon's AK with
//! MakeCredential/ActivateCredential and requires `tpm_ima`, in network namespaces. Needs
//! root (namespaces, eBPF) and swtpm, as CI has.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use rackwarden_tests::{
    require_root,
    tpmmatrix::{Matrix, Platform, run},
};

#[test]
fn a_tpm_host_is_affirming_and_root_cannot_forge_its_evidence() {
    require_root();
    run(Matrix::new("tpmx", |net| {
        Platform::simulated(&net.rack_ns, &net.dir)
    }));
}
