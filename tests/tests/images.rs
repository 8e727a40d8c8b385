//! Precommitted images: the digest against an independent implementation, staging and
//! sealing, and every refusal case.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use rackwarden::images::{self, ImageError};
use rackwarden_attest::{keys, merkle};

struct Dir(PathBuf);
impl Dir {
    fn new(tag: &str) -> Dir {
        let p = std::env::temp_dir().join(format!("rwi-{tag}-{}", std::process::id()));
        let _ = remove_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }
}
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = remove_all(&self.0);
    }
}
/// Sealed sets are read-only: make them writable again before removing.
fn remove_all(p: &Path) -> std::io::Result<()> {
    let _ = Command::new("chmod")
        .args(["-R", "u+w"])
        .arg(p)
        .stderr(std::process::Stdio::null())
        .status();
    std::fs::remove_dir_all(p)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| ((i % 251) as u8).wrapping_add(seed))
        .collect()
}

fn python_digest(path: &Path) -> String {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../attest/testdata/merkle_sha3_256.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(path)
        .output()
        .expect("python3 (installed by cargo xtask setup)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn digest_agrees_with_python_hashlib_for_every_thread_count() {
    let d = Dir::new("py");
    let mut cases: Vec<(PathBuf, usize)> = Vec::new();
    for (name, n) in [
        ("empty", 0),
        ("one", 1),
        ("mib", 1 << 20),
        ("mib1", (1 << 20) + 1),
        ("three5", 3 * (1 << 20) + 5),
        ("odd", 7 * (1 << 20) + 12_345),
    ] {
        let p = d.0.join(name);
        std::fs::write(&p, pattern(n, 3)).unwrap();
        cases.push((p, n));
    }
    // A 1 GiB sparse file: 1024 leaves of zeros, plus a few bytes written at the end.
    let sparse = d.0.join("sparse");
    {
        let f = std::fs::File::create(&sparse).unwrap();
        f.set_len(1 << 30).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(b"end", (1 << 30) - 3).unwrap();
    }
    cases.push((sparse, 1 << 30));
    for (p, n) in &cases {
        let want = python_digest(p);
        for threads in [1, 2, 8] {
            let got = merkle::digest_path(p, threads).unwrap();
            assert_eq!(
                got.hex(),
                want,
                "{} ({n} B) with {threads} threads",
                p.display()
            );
            assert_eq!(got.size, *n as u64);
        }
    }
    // The CLI prints the same.
    let out = Command::new(rackwarden_tests::bin("rackwarden"))
        .args(["image", "digest", "--json"])
        .arg(&cases[4].0)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["merkle_sha3_256"], python_digest(&cases[4].0));
}

/// A source set: two files at the top, one nested, one of several chunks.
fn make_source(root: &Path) {
    std::fs::create_dir_all(root.join("model")).unwrap();
    std::fs::write(
        root.join("model/weights.bin"),
        pattern(3 * (1 << 20) + 5, 0),
    )
    .unwrap();
    std::fs::write(root.join("serve.py"), b"print('inference only')\n").unwrap();
    std::fs::write(root.join("tokenizer.json"), b"{}").unwrap();
}

fn setup(
    tag: &str,
    sidecars: bool,
) -> (Dir, PathBuf, PathBuf, PathBuf, ed25519_dalek::VerifyingKey) {
    let d = Dir::new(tag);
    let src = d.0.join("src");
    make_source(&src);
    let (_, _, vkey) = keys::write_keypair(&d.0.join("verifier"), "verifier").unwrap();
    let manifest = d.0.join("manifest.dsse.json");
    images::create_manifest(
        std::slice::from_ref(&src),
        &manifest,
        &vkey,
        sidecars,
        2,
        None,
    )
    .unwrap();
    let staging = d.0.join("staging");
    (d, src, manifest, staging, vkey.verifying_key())
}

fn no_partials(staging: &Path) {
    let sets = staging.join("sets");
    if let Ok(rd) = std::fs::read_dir(&sets) {
        for e in rd.flatten() {
            assert!(
                !e.path().to_string_lossy().ends_with(".partial"),
                "left behind: {}",
                e.path().display()
            );
        }
    }
}

#[test]
fn a_matching_set_is_staged_sealed_and_reported() {
    let (_d, src, manifest, staging, vk) = setup("ok", true);
    let set = images::stage(&manifest, &vk, &src, &staging, 2).unwrap();
    assert_eq!(set.images.len(), 3);
    let current = std::fs::read_link(staging.join("current")).unwrap();
    assert_eq!(current, set.dir);
    for i in &set.images {
        let mode = std::fs::metadata(&i.path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o444, "{} not sealed", i.path.display());
        assert_eq!(
            merkle::digest_path(&i.path, 1).unwrap().hex(),
            i.merkle_sha3_256
        );
    }
    assert_eq!(
        std::fs::metadata(&set.dir).unwrap().permissions().mode() & 0o777,
        0o555
    );
    let subjects = set.subjects();
    assert!(
        subjects
            .iter()
            .any(|s| s.name == "model/weights.bin" && s.digest["merkle_sha3_256"].len() == 64)
    );
    assert!(set.report().images.iter().all(|i| i.ok));
    no_partials(&staging);
}

#[test]
fn every_refusal_names_the_file_and_leaves_nothing_valid() {
    // A content change in chunk #2, same size: with a sidecar the chunk is named.
    let (_d, src, manifest, staging, vk) = setup("bad", true);
    let good = images::stage(&manifest, &vk, &src, &staging, 2).unwrap();
    let w = src.join("model/weights.bin");
    let mut bytes = std::fs::read(&w).unwrap();
    bytes[2 * (1 << 20) + 17] ^= 0xff;
    std::fs::write(&w, &bytes).unwrap();
    let e = images::stage(&manifest, &vk, &src, &staging, 2).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            ImageError::Mismatch {
                first_bad_chunk: Some(2),
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("model/weights.bin") && msg.contains("#2"),
        "{msg}"
    );
    // The previous verified set is still the current one; nothing partial remains.
    assert_eq!(
        std::fs::read_link(staging.join("current")).unwrap(),
        good.dir
    );
    no_partials(&staging);
    bytes[2 * (1 << 20) + 17] ^= 0xff;
    std::fs::write(&w, &bytes).unwrap();

    // Wrong size.
    std::fs::write(src.join("serve.py"), b"print('training')\n# longer\n").unwrap();
    let e = images::stage(&manifest, &vk, &src, &staging, 2).unwrap_err();
    assert!(
        matches!(&e, ImageError::WrongSize { name, .. } if name == "serve.py"),
        "{e}"
    );
    std::fs::write(src.join("serve.py"), b"print('inference only')\n").unwrap();

    // Missing file.
    std::fs::rename(src.join("tokenizer.json"), src.join("../tok.json")).unwrap();
    let e = images::stage(&manifest, &vk, &src, &staging, 2).unwrap_err();
    assert!(
        matches!(&e, ImageError::Missing { name, .. } if name == "tokenizer.json"),
        "{e}"
    );
    std::fs::rename(src.join("../tok.json"), src.join("tokenizer.json")).unwrap();

    // Extra file in a sealed set.
    std::fs::write(src.join("model/optimizer_state.bin"), b"adam moments").unwrap();
    let e = images::stage(&manifest, &vk, &src, &staging, 2).unwrap_err();
    assert!(
        matches!(&e, ImageError::Extra { path } if path.ends_with("model/optimizer_state.bin")),
        "{e}"
    );
    std::fs::remove_file(src.join("model/optimizer_state.bin")).unwrap();

    // Unsigned, tampered, or signed by someone else.
    let env_text = std::fs::read_to_string(&manifest).unwrap();
    let env: serde_json::Value = serde_json::from_str(&env_text).unwrap();
    use base64::Engine as _;
    let payload = base64::engine::general_purpose::STANDARD
        .decode(env["payload"].as_str().unwrap())
        .unwrap();
    let unsigned = manifest.with_file_name("unsigned.json");
    std::fs::write(&unsigned, &payload).unwrap();
    assert!(matches!(
        images::stage(&unsigned, &vk, &src, &staging, 2),
        Err(ImageError::Manifest { .. })
    ));
    let tampered = manifest.with_file_name("tampered.json");
    std::fs::write(
        &tampered,
        env_text.replacen("\"payload\":\"ey", "\"payload\":\"ez", 1),
    )
    .unwrap();
    assert!(matches!(
        images::stage(&tampered, &vk, &src, &staging, 2),
        Err(ImageError::Manifest { .. })
    ));
    let other = keys::generate();
    assert!(matches!(
        images::stage(&manifest, &other.verifying_key(), &src, &staging, 2),
        Err(ImageError::Manifest { .. })
    ));

    // Without a sidecar, a mismatch still refuses, and says the chunk is unknown.
    let (_d2, src2, manifest2, staging2, vk2) = setup("noside", false);
    std::fs::write(src2.join("tokenizer.json"), b"[]").unwrap();
    let e = images::stage(&manifest2, &vk2, &src2, &staging2, 2).unwrap_err();
    assert!(matches!(
        e,
        ImageError::Mismatch {
            first_bad_chunk: None,
            ..
        }
    ));
    assert!(e.to_string().contains("chunk unknown"));
    assert!(
        !staging2.join("current").exists(),
        "a refused first staging must not create `current`"
    );
    no_partials(&staging2);
}

#[test]
fn interrupted_staging_leaves_nothing_that_looks_valid() {
    let (_d, src, manifest, staging, vk) = setup("intr", false);
    // What a crash mid-staging leaves: a sealed-looking partial directory.
    let partial = staging.join("sets/deadbeef-1.partial");
    std::fs::create_dir_all(partial.join("model")).unwrap();
    std::fs::write(partial.join("model/weights.bin"), b"half").unwrap();
    std::fs::set_permissions(
        partial.join("model"),
        std::fs::Permissions::from_mode(0o555),
    )
    .unwrap();
    assert!(!staging.join("current").exists());
    let set = images::stage(&manifest, &vk, &src, &staging, 2).unwrap();
    assert!(!partial.exists(), "the interrupted set must be removed");
    assert_eq!(
        std::fs::read_link(staging.join("current")).unwrap(),
        set.dir
    );
    no_partials(&staging);
}
