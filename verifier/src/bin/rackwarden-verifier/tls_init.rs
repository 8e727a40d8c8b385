//! `rackwarden-verifier tls-init`: a CA and a server certificate for `serve`.

use std::path::Path;

use anyhow::Context as _;
use rackwarden_verifier::tls;

pub fn run(names: &[String], out: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let g = tls::generate(names)?;
    std::fs::create_dir_all(out).with_context(|| format!("{}", out.display()))?;
    for (name, text, mode) in [
        ("ca.pem", &g.ca_pem, 0o644),
        ("server.pem", &g.chain_pem, 0o644),
        ("server-leaf.pem", &g.leaf_pem, 0o644),
        ("server.key", &g.key_pem, 0o600),
    ] {
        let path = out.join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .with_context(|| format!("{} (tls-init never overwrites)", path.display()))?;
        std::io::Write::write_all(&mut f, text.as_bytes())
            .and_then(|_| f.sync_all())
            .with_context(|| format!("{}", path.display()))?;
        println!("wrote {}", path.display());
    }
    println!(
        "verifier.toml: tls_cert = \"{}\", tls_key = \"{}\"; hosts: [verifier] ca = <copy of ca.pem> (or pinned_cert = <copy of server-leaf.pem>)",
        out.join("server.pem").display(),
        out.join("server.key").display()
    );
    Ok(())
}
