//! The stolen-key forgery of issue 22 and the rest of the TPM attack matrix, end to end on a
//! host: a real `rackwardend` with a TPM (swtpm, EK certificate from its own CA) and a
//! simulated IMA list, a real `rackwarden-verifier` that enrols the daemon's AK with
//! MakeCredential/ActivateCredential and requires `tpm_ima`, in network namespaces. Needs
//! root (namespaces, eBPF) and swtpm, as CI has.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use rackwarden_tests::{
    require_root,
    tpmmatrix::{Matrix, codes, expect, sha256_file},
};

#[test]
fn a_tpm_host_is_affirming_and_root_cannot_forge_its_evidence() {
    require_root();
    let mut m = Matrix::new("tpmx");
    m.verifier.start();
    // honest: the AK is enrolled before the first statement; it is quoted and its IMA list
    // replays, every entry allowed.
    let (mut daemon, r) = m.start_and_first(None);
    assert_eq!(r["status"], "affirming", "{r:#}");
    assert_eq!(r["root_of_trust"], "tpm_ima", "{r:#}");
    println!("TPM-MATRIX honest: affirming (root of trust tpm_ima)");
    let honest = m.last_logged();
    assert!(
        honest.tpm.is_some(),
        "the log keeps the quote beside the envelope"
    );
    let r = m.next_epoch();
    assert_eq!(
        (r["status"].as_str(), r["root_of_trust"].as_str()),
        (Some("affirming"), Some("tpm_ima")),
        "{r:#}"
    );
    daemon.stop();

    // forged: root reads the ed25519 key and signs a wipe that never ran, chained and
    // answering a fresh nonce. Without a quote it is contraindicated.
    let (_, forged, _) = m.forge();
    let r = m.post(&forged);
    expect("forged", &r, "contraindicated", "quote_missing", "enrolled");

    // replayed: the honest quote of the last statement attached to the forgery.
    let (_, mut replayed, _) = m.forge();
    replayed.tpm = m.last_logged().tpm;
    let r = m.post(&replayed);
    expect(
        "replayed",
        &r,
        "contraindicated",
        "quote_not_for_statement",
        "extraData",
    );

    // forged with a quote: root runs a forging program (IMA measures it) and asks the TPM
    // to quote the forgery with the daemon's own AK.
    let forger = m.net.dir.join("forge");
    std::fs::write(
        &forger,
        b"#!/bin/sh\n# a program that signs what it likes\n",
    )
    .unwrap();
    m.platform.measure(&forger);
    let (_, mut quoted, digest) = m.forge();
    quoted.tpm = Some(m.quote_as_root(&digest));
    let r = m.post(&quoted);
    let forger_path = forger.display().to_string();
    expect(
        "forged with a quote",
        &r,
        "contraindicated",
        "executable_not_allowed",
        &forger_path,
    );

    // unknown: a program outside the allowlist ran; the next honest statement (the daemon
    // ships its whole list after a start) names it.
    let unknown = m.net.dir.join("miner");
    std::fs::write(&unknown, b"#!/bin/sh\n# not in the allowlist\n").unwrap();
    m.platform.measure(&unknown);
    let (d, r) = m.start_and_first(None);
    let unknown_path = unknown.display().to_string();
    expect(
        "unknown",
        &r,
        "contraindicated",
        "executable_not_allowed",
        &unknown_path,
    );
    drop(d);

    // modified: the daemon binary changed by one byte and started; IMA measures the new one.
    let modified = m.net.dir.join("modified/rackwardend");
    std::fs::create_dir_all(modified.parent().unwrap()).unwrap();
    let mut exe = std::fs::read(rackwarden_tests::bin("rackwardend")).unwrap();
    exe.push(0);
    std::fs::write(&modified, exe).unwrap();
    std::fs::set_permissions(
        &modified,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    m.platform.measure(&modified);
    let (d, r) = m.start_and_first(Some(&modified));
    let modified_digest = hex::encode(sha256_file(&modified));
    expect(
        "modified",
        &r,
        "contraindicated",
        "daemon_modified",
        &modified_digest,
    );
    drop(d);

    // reboot: the TPM is power-cycled (resetCount moves) and the list starts again from the
    // boot aggregate with only allowed files: a warning that shows, and the level verified
    // again from the new boot's list.
    m.platform.swtpm.restart();
    m.platform.reboot();
    let (d, r) = m.start_and_first(None);
    println!(
        "TPM-MATRIX reboot: {} tpm_reboot ({:?})",
        r["status"],
        codes(&r)
    );
    assert!(codes(&r).contains(&"tpm_reboot".to_string()), "{r:#}");
    assert_eq!(r["root_of_trust"], "tpm_ima", "{r:#}");
    drop(d);
}
