//! AK enrolment end to end (issue 22): the real `rackwarden-verifier serve` over TLS on
//! loopback, configured to trust the EK roots of swtpm's local CA, and hosts whose TPM is a
//! real swtpm driven through the daemon's `rackwarden::tpm::Tpm`. A host signs its EK and AK
//! with its enrolled ed25519 key, the verifier answers with a credential made for that AK
//! under that EK, and the AK is enrolled only when the host returns the secret its TPM
//! released. What must be refused is: a wrong secret, an EK another CA certified, an AK from
//! outside the host's TPM, a request signed by another host's (or an unknown, or a retired)
//! key, and any request to a verifier with no `[tpm]`. Root is not needed.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::OnceLock,
    time::Duration,
};

use base64::Engine as _;
use ed25519_dalek::SigningKey;
use rackwarden::tpm::{AkInfo, EkInfo, Tpm, Tss2ResponseCodeKind};
use rackwarden_attest::{
    dsse, keys,
    tpm::{TPM_ENROLL_PAYLOAD_TYPE, TpmActivation, TpmCredential, TpmEnrollRequest, TpmEnrolled},
};
use rackwarden_tests::{
    bin, tls_init,
    tpm::{Manufactured, SwTpm, manufactured},
};
use rackwarden_verifier::store::Store;
use serde_json::Value;

const RACK: &str = "rack-a";

/// One TLS CA and server certificate for every verifier of this test binary.
fn tls_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("rwt-tpmenroll-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        tls_init("127.0.0.1", &d);
        d
    })
}

/// What `[tpm]` says, or nothing (no section).
struct EkTrust {
    roots: PathBuf,
    intermediates: Option<PathBuf>,
    challenge_ttl: &'static str,
}

impl EkTrust {
    /// The swtpm local CA of this binary's manufactured TPMs: root and issuing intermediate.
    fn swtpm_ca() -> EkTrust {
        let m = manufactured();
        EkTrust {
            roots: m.ca_root(),
            intermediates: Some(m.ca_intermediate()),
            challenge_ttl: "1 min",
        }
    }
}

/// A verifier process serving TLS on 127.0.0.1, its stderr in `verifier.log`. Killed (by its
/// PID) and its directory removed on drop. Hosts' keys are enrolled with the CLI before it
/// serves: a key enrolled while it serves is seen at the first miss a second after the key
/// table was last read (as for statements), which a test would have to wait for.
struct Verifier {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    config: PathBuf,
    client: reqwest::blocking::Client,
}

impl Verifier {
    /// Writes the config; nothing runs yet.
    fn configure(tag: &str, tpm: Option<EkTrust>) -> Verifier {
        let dir = std::env::temp_dir().join(format!("rwt-tpmenroll-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let tpm_section = match tpm {
            None => String::new(),
            Some(t) => format!(
                "\n[tpm]\nek_roots = \"{}\"\n{}challenge_ttl = \"{}\"\n",
                t.roots.display(),
                t.intermediates
                    .map(|i| format!("ek_intermediates = \"{}\"\n", i.display()))
                    .unwrap_or_default(),
                t.challenge_ttl
            ),
        };
        let config = dir.join("verifier.toml");
        std::fs::write(
            &config,
            format!(
                r#"listen = "127.0.0.1:{port}"
tls_cert = "{tls}/server.pem"
tls_key = "{tls}/server.key"
database = "{db}"

[policy]
min_root_of_trust = "none"
id = "tpm-enroll-test"
nonce_ttl = "10 min"
max_wipe_interval = "15 min"
max_residue_host = "2 GiB"
max_residue_gpu = "1 GiB"
# The test host's own disks are residue (issue 25); the storage tests judge them at 0.
max_residue_persistent = "1024 TiB"
# The test host is a development machine: its own RAM and disks (hundreds of GB) are
# residue in the state bound; 1 PB keeps the bound's limit (10 TB) above them.
trainable_state = "1 PB"
max_epoch_fraction = 0.01

[racks.{RACK}]
egress = "10 MB/s"
ingress = "10 MB/s"
{tpm_section}"#,
                tls = tls_dir().display(),
                db = dir.join("v.sqlite").display(),
            ),
        )
        .unwrap();
        let ca = std::fs::read(tls_dir().join("ca.pem")).unwrap();
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(20))
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .build()
            .unwrap();
        Verifier {
            child: None,
            port,
            dir,
            config,
            client,
        }
    }

    /// Runs `serve` and waits until it listens.
    fn serve(&mut self) {
        let log = std::fs::File::create(self.dir.join("verifier.log")).unwrap();
        let child = Command::new(bin("rackwarden-verifier"))
            .arg("--config")
            .arg(&self.config)
            .arg("serve")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let child = self.child.insert(child);
        for _ in 0..400 {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("verifier exited ({status}):\n{}", self.log());
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("verifier did not listen within 10 s:\n{}", self.log());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("verifier.log")).unwrap_or_default()
    }

    /// Runs a CLI subcommand against this verifier's config; its stdout.
    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new(bin("rackwarden-verifier"))
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "rackwarden-verifier {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Enrols a fresh ed25519 key for `host` with the CLI, as an operator does.
    fn enroll_key(&self, host: &str) -> SigningKey {
        let k = keys::generate();
        let p = self.dir.join(format!("{host}.pub"));
        std::fs::write(&p, keys::public_pem(&k.verifying_key())).unwrap();
        self.cli(&[
            "enroll",
            "--rack",
            RACK,
            "--host",
            host,
            "--key",
            p.to_str().unwrap(),
        ]);
        k
    }

    fn post(&self, path: &str, body: Vec<u8>) -> (u16, Value) {
        let r = self
            .client
            .post(format!("https://127.0.0.1:{}{path}", self.port))
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .unwrap();
        let code = r.status().as_u16();
        (code, r.json().unwrap_or(Value::Null))
    }

    /// The row the verifier stored for `host`, read from its database.
    fn enrollment(&self, host: &str) -> Option<rackwarden_verifier::store::TpmEnrollment> {
        Store::open(&self.dir.join("v.sqlite"))
            .unwrap()
            .tpm_enrollment(RACK, host)
            .unwrap()
    }
}

impl Drop for Verifier {
    fn drop(&mut self) {
        // Child::kill signals our own child by its PID; wait reaps it.
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A host: its enrolled ed25519 key and its TPM (EK and AK read through the daemon's code).
struct Host {
    name: String,
    key: SigningKey,
    tpm: Tpm,
    ek: EkInfo,
    ak: AkInfo,
}

impl Host {
    fn new(name: &str, key: SigningKey, swtpm: &SwTpm) -> Host {
        let mut tpm =
            Tpm::open(&swtpm.tcti).unwrap_or_else(|e| panic!("{e}\nswtpm log:\n{}", swtpm.log()));
        let ek = tpm.ek().unwrap();
        let ak = tpm.load_or_create_ak(&swtpm.dir.join("ak.json")).unwrap();
        Host {
            name: name.into(),
            key,
            tpm,
            ek,
            ak,
        }
    }

    /// The request naming this host's EK and `ak_public`, signed with `signer`.
    fn request(&self, ak_public: &[u8], signer: &SigningKey) -> Vec<u8> {
        let req = TpmEnrollRequest {
            rack: RACK.into(),
            host: self.name.clone(),
            ek_public: hex::encode(&self.ek.public),
            ek_certificate: self
                .ek
                .certificate
                .as_ref()
                .map(|c| base64::engine::general_purpose::STANDARD.encode(c)),
            ak_public: hex::encode(ak_public),
        };
        dsse::sign(
            signer,
            TPM_ENROLL_PAYLOAD_TYPE,
            &serde_json::to_vec(&req).unwrap(),
        )
        .to_json()
        .unwrap()
    }

    /// Its own EK and AK, signed with its own key: what the daemon sends.
    fn own_request(&self) -> Vec<u8> {
        self.request(&self.ak.public, &self.key)
    }

    fn ask(&self, v: &Verifier, body: Vec<u8>) -> TpmCredential {
        let (code, body) = v.post("/v1/tpm/enroll", body);
        assert_eq!(code, 200, "{body}\nverifier log:\n{}", v.log());
        serde_json::from_value(body).unwrap()
    }

    /// What the host's TPM makes of the credential (its loaded AK is the activation object).
    fn activate(&mut self, c: &TpmCredential) -> Result<Vec<u8>, rackwarden::tpm::TpmError> {
        self.tpm.activate_credential(
            &hex::decode(&c.credential_blob).unwrap(),
            &hex::decode(&c.encrypted_secret).unwrap(),
        )
    }

    fn answer(&self, v: &Verifier, c: &TpmCredential, secret: &[u8]) -> (u16, Value) {
        let a = TpmActivation {
            rack: RACK.into(),
            host: self.name.clone(),
            challenge_id: c.challenge_id.clone(),
            secret: hex::encode(secret),
        };
        v.post("/v1/tpm/activate", serde_json::to_vec(&a).unwrap())
    }

    /// The whole exchange, as the daemon runs it; the verifier's answer.
    fn enrol(&mut self, v: &Verifier) -> TpmEnrolled {
        let c = self.ask(v, self.own_request());
        let secret = self
            .activate(&c)
            .unwrap_or_else(|e| panic!("the host's TPM refused its own credential: {e}"));
        let (code, body) = self.answer(v, &c, &secret);
        assert_eq!(code, 200, "{body}\nverifier log:\n{}", v.log());
        serde_json::from_value(body).unwrap()
    }
}

fn random32() -> [u8; 32] {
    let mut b = [0u8; 32];
    let mut f = std::fs::File::open("/dev/urandom").unwrap();
    std::io::Read::read_exact(&mut f, &mut b).unwrap();
    b
}

fn reason(body: &Value) -> String {
    body["error"].as_str().unwrap_or_default().to_string()
}

/// A verifier serving with `tpm` and an ed25519 key enrolled for each of `hosts`.
fn serving(tag: &str, tpm: Option<EkTrust>, hosts: &[&str]) -> (Verifier, Vec<SigningKey>) {
    let mut v = Verifier::configure(tag, tpm);
    let host_keys = hosts.iter().map(|h| v.enroll_key(h)).collect();
    v.serve();
    (v, host_keys)
}

#[test]
fn a_host_enrols_the_ak_of_its_certified_tpm_and_can_replace_it() {
    let (v, mut host_keys) = serving("flow", Some(EkTrust::swtpm_ca()), &["h1"]);
    let swtpm = SwTpm::start();
    let mut h = Host::new("h1", host_keys.remove(0), &swtpm);
    assert_eq!(v.cli(&["tpm-enrollments"]).trim(), "no AK enrolled");

    let enrolled = h.enrol(&v);
    let ak_name = hex::encode(&h.ak.name);
    assert_eq!(enrolled.ak_name, ak_name);
    assert!(
        enrolled.ek_issuer.contains("swtpm-localca-rootca"),
        "the root that anchored the chain: {}",
        enrolled.ek_issuer
    );
    let row = v.enrollment("h1").expect("the AK is enrolled");
    assert_eq!(row.ak_name, ak_name);
    assert_eq!(row.ak_public, hex::encode(&h.ak.public));
    assert_eq!(row.ek_public, hex::encode(&h.ek.public));
    assert_eq!(row.ek_issuer, enrolled.ek_issuer);
    assert!(row.ek_certificate.is_some());

    let listing = v.cli(&["tpm-enrollments"]);
    let line = listing
        .lines()
        .find(|l| l.contains("h1"))
        .unwrap_or_else(|| panic!("h1 not listed:\n{listing}"));
    for want in [RACK, ak_name.as_str(), "swtpm-localca-rootca"] {
        assert!(line.contains(want), "{want} missing from: {line}");
    }
    let json: Value = serde_json::from_str(&v.cli(&["tpm-enrollments", "--json"])).unwrap();
    assert_eq!(json[0]["ak_name"], ak_name.as_str());
    assert_eq!(json[0]["enrolled_ms"].as_u64(), Some(row.enrolled_ms));
    let log = v.log();
    assert!(
        log.contains(&format!("{RACK}/h1: AK {ak_name} enrolled")),
        "an info line per enrolment:\n{log}"
    );

    // A new AK (the TPM was cleared, or the daemon lost its AK file) enrols in its place.
    let old_name = ak_name;
    h.ak = h
        .tpm
        .load_or_create_ak(&swtpm.dir.join("ak-2.json"))
        .unwrap();
    let again = h.enrol(&v);
    let new_name = hex::encode(&h.ak.name);
    assert_ne!(new_name, old_name);
    assert_eq!(again.ak_name, new_name);
    assert_eq!(v.enrollment("h1").unwrap().ak_name, new_name);
    let listing = v.cli(&["tpm-enrollments"]);
    assert_eq!(listing.lines().filter(|l| l.contains("h1")).count(), 1);
    assert!(v.log().contains(&format!("replacing AK {old_name}")));

    // The operator rotates the host's key while the verifier runs: the old key enrols no
    // more, the new one does (once the verifier has read its key table again, at the first
    // miss a second after the last read).
    let old_key = std::mem::replace(&mut h.key, v.enroll_key("h1"));
    let (code, body) = v.post("/v1/tpm/enroll", h.request(&h.ak.public, &old_key));
    assert_eq!(code, 403, "{body}");
    assert!(reason(&body).contains("retired"), "{body}");
    std::thread::sleep(Duration::from_millis(1100));
    h.enrol(&v);
    assert_eq!(v.enrollment("h1").unwrap().ak_name, new_name);
}

#[test]
fn a_wrong_secret_is_refused_and_uses_the_challenge_up() {
    let (v, mut host_keys) = serving("secret", Some(EkTrust::swtpm_ca()), &["h1"]);
    let swtpm = SwTpm::start();
    let mut h = Host::new("h1", host_keys.remove(0), &swtpm);
    let c = h.ask(&v, h.own_request());
    let secret = h.activate(&c).unwrap();

    let (code, body) = h.answer(&v, &c, &random32());
    assert_eq!(code, 403, "{body}");
    assert!(reason(&body).contains("wrong secret"), "{body}");
    // The right secret, too late: the wrong answer used the challenge up.
    let (code, body) = h.answer(&v, &c, &secret);
    assert_eq!(code, 403, "{body}");
    assert!(reason(&body).contains("unknown challenge"), "{body}");
    assert!(v.enrollment("h1").is_none(), "nothing enrolled");

    // A challenge answered in another host's name is used up too.
    let c = h.ask(&v, h.own_request());
    let secret = h.activate(&c).unwrap();
    let a = TpmActivation {
        rack: RACK.into(),
        host: "h2".into(),
        challenge_id: c.challenge_id.clone(),
        secret: hex::encode(&secret),
    };
    let (code, body) = v.post("/v1/tpm/activate", serde_json::to_vec(&a).unwrap());
    assert_eq!(code, 403, "{body}");
    assert!(reason(&body).contains("issued to rack-a/h1"), "{body}");
    let (code, _) = h.answer(&v, &c, &secret);
    assert_eq!(code, 403);
    assert!(v.enrollment("h1").is_none());

    // And the exchange still works with a fresh challenge.
    h.enrol(&v);
    assert!(v.enrollment("h1").is_some());
}

#[test]
fn an_expired_challenge_is_refused() {
    let trust = EkTrust {
        challenge_ttl: "1 s",
        ..EkTrust::swtpm_ca()
    };
    let (v, mut host_keys) = serving("expiry", Some(trust), &["h1"]);
    let swtpm = SwTpm::start();
    let mut h = Host::new("h1", host_keys.remove(0), &swtpm);
    let c = h.ask(&v, h.own_request());
    let secret = h.activate(&c).unwrap();
    std::thread::sleep(Duration::from_millis(1300));
    let (code, body) = h.answer(&v, &c, &secret);
    assert_eq!(code, 403, "{body}");
    assert!(reason(&body).contains("expired"), "{body}");
    assert!(v.enrollment("h1").is_none());
}

#[test]
fn an_ek_certified_by_another_ca_is_refused_naming_the_certificate_problem() {
    let swtpm = SwTpm::start();
    // Another manufacturer's CA with the very same names (swtpm calls every local CA
    // CN=swtpm-localca): the signature, not the name, decides.
    let other = Manufactured::new("other-ca");
    let other_ca = EkTrust {
        roots: other.ca_root(),
        intermediates: Some(other.ca_intermediate()),
        challenge_ttl: "1 min",
    };
    let (v, mut host_keys) = serving("other-ca", Some(other_ca), &["h1"]);
    let h = Host::new("h1", host_keys.remove(0), &swtpm);
    let (code, body) = v.post("/v1/tpm/enroll", h.own_request());
    assert_eq!(code, 403, "{body}");
    let why = reason(&body);
    assert!(
        why.contains("EK certificate refused") && why.contains("does not verify"),
        "{why}"
    );
    assert!(v.enrollment("h1").is_none());
    drop((h, v));

    // A CA that has nothing to do with TPMs (the verifier's own TLS CA): no issuer found.
    let tls_ca = EkTrust {
        roots: tls_dir().join("ca.pem"),
        intermediates: None,
        challenge_ttl: "1 min",
    };
    let (v, mut host_keys) = serving("tls-ca", Some(tls_ca), &["h1"]);
    let h = Host::new("h1", host_keys.remove(0), &swtpm);
    let (code, body) = v.post("/v1/tpm/enroll", h.own_request());
    assert_eq!(code, 403, "{body}");
    let why = reason(&body);
    assert!(
        why.contains("EK certificate refused") && why.contains("no configured root"),
        "{why}"
    );
    drop((h, v));

    // Without its certificate, an EK is not enrolled at all.
    let (v, mut host_keys) = serving("no-cert", Some(EkTrust::swtpm_ca()), &["h1"]);
    let mut h = Host::new("h1", host_keys.remove(0), &swtpm);
    h.ek.certificate = None;
    let (code, body) = v.post("/v1/tpm/enroll", h.own_request());
    assert_eq!(code, 403, "{body}");
    assert!(reason(&body).contains("no EK certificate"), "{body}");
}

#[test]
fn a_host_cannot_enrol_an_ak_from_outside_its_tpm() {
    let (v, mut host_keys) = serving("foreign-ak", Some(EkTrust::swtpm_ca()), &["h1"]);
    let own = SwTpm::start();
    let mut h = Host::new("h1", host_keys.remove(0), &own);
    // Another TPM (its own EK seed): its AK is a genuine restricted signing key, but not one
    // that lives beside h1's certified EK.
    let other = Manufactured::new("foreign-ak");
    let foreign = SwTpm::start_from(&other);
    let mut f = Host::new("h1", h.key.clone(), &foreign);
    assert_ne!(f.ak.name, h.ak.name);
    assert_ne!(f.ek.public, h.ek.public);

    // The request is well formed and h1's EK is certified: the verifier issues a credential,
    // made for the foreign AK's Name under h1's EK.
    let c = h.ask(&v, h.request(&f.ak.public, &h.key));
    // h1's TPM unwraps the seed (its EK) but the Name bound into the credential is not its
    // AK's: the integrity check fails and nothing is released.
    let e = h.activate(&c).unwrap_err();
    assert_eq!(
        e.response_code(),
        Some(Tss2ResponseCodeKind::Integrity),
        "{e}"
    );
    // The TPM holding the AK cannot unwrap what was made for h1's EK.
    assert!(f.activate(&c).is_err());
    // So the host has only guesses to send, and a guess uses the challenge up.
    let (code, body) = h.answer(&v, &c, &random32());
    assert_eq!(code, 403, "{body}");
    assert!(reason(&body).contains("wrong secret"), "{body}");
    assert!(
        v.enrollment("h1").is_none(),
        "the foreign AK is not enrolled"
    );

    // h1's own AK enrols through the same verifier.
    let enrolled = h.enrol(&v);
    assert_eq!(enrolled.ak_name, hex::encode(&h.ak.name));
}

#[test]
fn a_request_not_signed_by_the_hosts_current_key_is_refused() {
    let (v, mut host_keys) = serving("keys", Some(EkTrust::swtpm_ca()), &["h1", "h2"]);
    let k2 = host_keys.remove(1);
    let swtpm = SwTpm::start();
    let h1 = Host::new("h1", host_keys.remove(0), &swtpm);

    // h2's key is enrolled, but for h2: it cannot enrol an AK for h1.
    let (code, body) = v.post("/v1/tpm/enroll", h1.request(&h1.ak.public, &k2));
    assert_eq!(code, 403, "{body}");
    let why = reason(&body);
    assert!(
        why.contains("names rack-a/h1") && why.contains("enrolled for rack-a/h2"),
        "{why}"
    );

    // A key nobody enrolled.
    let (code, body) = v.post(
        "/v1/tpm/enroll",
        h1.request(&h1.ak.public, &keys::generate()),
    );
    assert_eq!(code, 404, "{body}");
    assert!(
        reason(&body).contains("signed by no enrolled key"),
        "{body}"
    );

    // h1's keyid with another key's signature: the signature decides, not the keyid.
    let mut env: Value = serde_json::from_slice(&h1.own_request()).unwrap();
    let forged: Value =
        serde_json::from_slice(&h1.request(&h1.ak.public, &keys::generate())).unwrap();
    env["signatures"][0]["sig"] = forged["signatures"][0]["sig"].clone();
    let (code, body) = v.post("/v1/tpm/enroll", serde_json::to_vec(&env).unwrap());
    assert_eq!(code, 403, "{body}");
    assert!(reason(&body).contains("signature"), "{body}");

    // A statement envelope (another payload type) signed by h1 is not an enrolment request.
    let wrong_type = dsse::sign(&h1.key, dsse::INTOTO_PAYLOAD_TYPE, b"{}")
        .to_json()
        .unwrap();
    let (code, body) = v.post("/v1/tpm/enroll", wrong_type);
    assert_eq!(code, 403, "{body}");
    assert!(reason(&body).contains("payloadType"), "{body}");

    // A key the operator retired while the verifier runs enrols nothing.
    v.cli(&["retire", "--rack", RACK, "--host", "h1"]);
    let (code, body) = v.post("/v1/tpm/enroll", h1.own_request());
    assert_eq!(code, 403, "{body}");
    assert!(reason(&body).contains("retired"), "{body}");
    assert!(v.enrollment("h1").is_none());
}

#[test]
fn a_verifier_without_tpm_config_says_it_enrols_no_aks() {
    let (v, mut host_keys) = serving("no-tpm", None, &["h1"]);
    let swtpm = SwTpm::start();
    let h = Host::new("h1", host_keys.remove(0), &swtpm);
    let (code, body) = v.post("/v1/tpm/enroll", h.own_request());
    assert_eq!(code, 409, "{body}");
    let why = reason(&body);
    assert!(
        why.contains("enrols no AKs") && why.contains("[tpm] ek_roots"),
        "{why}"
    );
    let a = TpmActivation {
        rack: RACK.into(),
        host: "h1".into(),
        challenge_id: "00".into(),
        secret: "00".into(),
    };
    let (code, body) = v.post("/v1/tpm/activate", serde_json::to_vec(&a).unwrap());
    assert_eq!(code, 409, "{body}");

    // Bodies are JSON, as on every other POST.
    let r = v
        .client
        .post(format!("https://127.0.0.1:{}/v1/tpm/enroll", v.port))
        .header("Content-Type", "text/plain")
        .body(h.own_request())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 415);
}

#[test]
fn one_tpm_attests_for_one_host() {
    let (v, mut host_keys) = serving("one-ek", Some(EkTrust::swtpm_ca()), &["h1", "h2"]);
    let swtpm = SwTpm::start();
    let k2 = host_keys.remove(1);
    let mut h1 = Host::new("h1", host_keys.remove(0), &swtpm);
    h1.enrol(&v);
    // swtpm serves one client at a time: h1 lets go of the TPM before h2 opens it.
    drop(h1);
    let h2 = Host::new("h2", k2, &swtpm);
    let (code, body) = v.post("/v1/tpm/enroll", h2.own_request());
    assert_eq!(code, 403, "{body}");
    assert!(
        reason(&body).contains(&format!("already enrolled for {RACK}/h1")),
        "{body}"
    );
    assert!(v.enrollment("h2").is_none());
}
