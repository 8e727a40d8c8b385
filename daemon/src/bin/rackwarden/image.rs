//! `rackwarden image` and `rackwarden manifest`: digests, verified staging, signed manifests.

use anyhow::Context as _;

use crate::args::{ImageCmd, ManifestCmd};

pub fn image_cmd(cmd: &ImageCmd) -> anyhow::Result<()> {
    use rackwarden::{images, progress::Progress};
    use rackwarden_attest::merkle;
    match cmd {
        ImageCmd::Digest {
            files,
            json,
            threads,
        } => {
            let threads = threads.unwrap_or_else(merkle::default_threads);
            let mut out = Vec::new();
            for f in files {
                let file = std::fs::File::open(f).with_context(|| format!("{}", f.display()))?;
                let size = file.metadata()?.len();
                let p = Progress::start(f.display().to_string(), size);
                let d = merkle::digest_file(&file, size, threads, None, Some(&p.done))
                    .with_context(|| format!("{}", f.display()))?;
                drop(p);
                if !*json {
                    println!("{}  {}  {}", d.hex(), size, f.display());
                }
                out.push(serde_json::json!({"file": f, "size": size, "merkle_sha3_256": d.hex()}));
            }
            if *json {
                println!("{}", serde_json::to_string_pretty(&out)?);
            }
        }
        ImageCmd::Stage {
            manifest,
            key,
            source,
            staging,
            json,
        } => {
            let vk = rackwarden_attest::keys::load_verifying_key(key)?;
            let set = images::stage(manifest, &vk, source, staging, merkle::default_threads())?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&set)?);
            } else {
                println!(
                    "staged and sealed {} images in {} (manifest {})",
                    set.images.len(),
                    set.dir.display(),
                    set.manifest_sha3_256
                );
                for i in &set.images {
                    println!("  {}  {:>14}  {}", i.merkle_sha3_256, i.size, i.name);
                }
            }
        }
    }
    Ok(())
}

pub fn manifest_cmd(cmd: &ManifestCmd) -> anyhow::Result<()> {
    use rackwarden::images;
    match cmd {
        ManifestCmd::Create {
            key,
            out,
            sidecars,
            dirs,
        } => {
            let sk = rackwarden_attest::keys::load_signing_key(key)?;
            let m = images::create_manifest(
                dirs,
                out,
                &sk,
                *sidecars,
                rackwarden_attest::merkle::default_threads(),
                None,
            )?;
            println!(
                "wrote {} ({} images, signed by keyid {})",
                out.display(),
                m.images.len(),
                rackwarden_attest::keys::keyid(&sk.verifying_key())
            );
        }
        ManifestCmd::Verify {
            key,
            manifest,
            json,
        } => {
            let vk = rackwarden_attest::keys::load_verifying_key(key)?;
            let vm = images::read_manifest(manifest, &vk)?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&vm.manifest)?);
            } else {
                println!(
                    "{}: signature ok, {} images",
                    manifest.display(),
                    vm.manifest.images.len()
                );
                for i in &vm.manifest.images {
                    println!("  {}  {:>14}  {}", i.merkle_sha3_256, i.size, i.path);
                }
            }
        }
    }
    Ok(())
}
