//! The TPM attack matrix (issue 22), end to end: a real `rackwardend` quoting every statement
//! with a TPM, a real `rackwarden-verifier` that enrolled its AK over HTTPS and appraises
//! each quote and IMA list under `min_root_of_trust = "tpm_ima"`, and root on the host
//! attacking it. Each attack prints `TPM-MATRIX <attack>: <status> <finding>` and must come
//! out contraindicated (the reboot: a warning that shows).
//!
//! On a host the TPM is swtpm and IMA is simulated: the list is a file in the kernel's binary
//! format that the test appends to while extending PCR 10 through the TPM, exactly as the
//! kernel would. swtpm serves one client at a time, so the test measures while the daemon is
//! stopped.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use base64::Engine as _;
use rackwarden::tpm::Tpm;
use rackwarden_attest::{
    dsse::{self, Envelope},
    keys,
    statement::{Challenge, Statement},
    tpm::{ImaEntry, TpmSidecar, encode_ima_binary},
};
use sha2::{Digest, Sha256};

use crate::{
    Daemon, Net, bin,
    epoch::{EpochFixture, Verifier, ids, wait_epoch, wipe_now, write_epoch_config},
    tpm::SwTpm,
};

/// A host with a TPM (swtpm) and a simulated IMA list.
pub struct Platform {
    pub swtpm: SwTpm,
    /// The binary IMA list the daemon reads (`[tpm] ima_list`).
    pub list: PathBuf,
    pub entries: Vec<ImaEntry>,
}

pub fn sha256_file(path: &Path) -> [u8; 32] {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Sha256::digest(&bytes).into()
}

impl Platform {
    /// A fresh boot: the boot aggregate, then the daemon binary measured when it was exec'd.
    pub fn boot(swtpm: SwTpm, dir: &Path) -> Platform {
        let mut p = Platform {
            swtpm,
            list: dir.join("binary_runtime_measurements"),
            entries: Vec::new(),
        };
        p.reboot();
        p
    }

    /// The list of a new boot (after the TPM was reset): the boot aggregate, then the daemon.
    pub fn reboot(&mut self) {
        self.entries.clear();
        self.measure_digest("boot_aggregate", [0x11; 32]);
        self.measure(&bin("rackwardend"));
    }

    /// IMA measures `path` (an exec by root): the list grows and PCR 10 is extended. Only
    /// while no daemon holds swtpm's one connection.
    pub fn measure(&mut self, path: &Path) {
        let digest = sha256_file(path);
        self.measure_digest(&path.display().to_string(), digest);
    }

    fn measure_digest(&mut self, path: &str, digest: [u8; 32]) {
        let e = ImaEntry::ima_ng(path, digest);
        let extend = e.sha256_bank_extend_value();
        self.with_tpm(move |tpm| {
            tpm.extend_pcr(10, extend)
                .unwrap_or_else(|e| panic!("extending PCR 10: {e}"))
        });
        self.entries.push(e);
        std::fs::write(&self.list, encode_ima_binary(&self.entries)).unwrap();
    }
}

impl Platform {
    /// Runs `f` on the TPM, from the namespace swtpm listens in (the daemon's).
    pub fn with_tpm<T: Send + 'static>(&self, f: impl FnOnce(&mut Tpm) -> T + Send + 'static) -> T {
        let tcti = self.swtpm.tcti.clone();
        let run = move || {
            let mut tpm = Tpm::open(&tcti).unwrap_or_else(|e| panic!("swtpm: {e}"));
            f(&mut tpm)
        };
        match &self.swtpm.netns {
            Some(ns) => crate::in_netns(ns, run),
            None => run(),
        }
    }
}

/// The rack: network namespaces, the fixture, a verifier requiring `tpm_ima`, the daemon's
/// config with `[tpm]`.
pub struct Matrix {
    pub net: Net,
    pub fx: EpochFixture,
    pub verifier: Verifier,
    pub platform: Platform,
    pub rack: String,
    pub host: String,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub allowlist: PathBuf,
}

impl Matrix {
    pub fn new(tag: &str) -> Matrix {
        let net = Net::new(tag);
        let fx = EpochFixture::new(&net.dir, 1 << 20);
        let verifier = Verifier::configure(&net, &fx.manifest, &fx.verifier_pub, "64 GiB");
        let (rack, host) = ids(&net);
        verifier.enroll(&rack, &host, &fx.host_pub);
        let platform = Platform::boot(SwTpm::start_in_netns(&net.rack_ns), &net.dir);
        let allowlist = net.dir.join("ima-allowlist.txt");
        // What the operator recorded at install: every file measured so far.
        let lines: String = platform
            .entries
            .iter()
            .filter_map(|e| {
                let (_, d) = e.file_digest.as_ref()?;
                Some(format!("{}  {}\n", hex::encode(d), e.path.as_deref()?))
            })
            .collect();
        std::fs::write(&allowlist, lines).unwrap();
        verifier.extend_config(
            "min_root_of_trust = \"tpm_ima\"",
            &format!(
                "[policy.runtime]\ndaemon_digests = [\"{}\"]\nallowlist = \"{}\"\n\n[tpm]\nek_roots = \"{}\"\nek_intermediates = \"{}\"\n",
                hex::encode(sha256_file(&bin("rackwardend"))),
                allowlist.display(),
                platform.swtpm.ca_root.display(),
                platform.swtpm.ca_intermediate.display(),
            ),
        );
        let sections = fx.sections(&verifier.daemon_lines(), "1 h", "16 MiB")
            + &format!(
                "\n[tpm]\nmode = \"required\"\ntcti = \"{}\"\nima_list = \"{}\"\n",
                platform.swtpm.tcti,
                platform.list.display()
            );
        let config = write_epoch_config(&net, &sections);
        let socket = net.socket_path();
        Matrix {
            net,
            fx,
            verifier,
            platform,
            rack,
            host,
            config,
            socket,
            allowlist,
        }
    }

    /// The daemon's last logged statement's seq.
    pub fn log_tip(&self) -> u64 {
        self.last_logged_seq().unwrap_or(0)
    }

    fn last_logged_seq(&self) -> Option<u64> {
        let env = self.last_logged_opt()?;
        Some(seq_of(&env))
    }

    /// Waits until the daemon delivered its statement `seq` and returns the verdict stored
    /// for exactly that statement (forgeries may sit at the same seq).
    pub fn delivered(&self, seq: u64) -> serde_json::Value {
        wait_epoch(
            &self.socket,
            Duration::from_secs(90),
            &format!("seq {seq} delivered"),
            |e| e["delivery"]["delivered_seq"].as_u64() >= Some(seq),
        );
        let logged = self
            .logged()
            .into_iter()
            .rev()
            .find(|e| seq_of(e) == seq)
            .unwrap_or_else(|| panic!("seq {seq} is not in the daemon's log"));
        self.verifier
            .history(&self.rack, &self.host)
            .into_iter()
            .find(|r| {
                r["envelope"]
                    .as_str()
                    .and_then(|e| serde_json::from_str::<Envelope>(e).ok())
                    .is_some_and(|e| e.payload == logged.payload)
            })
            .map(|r| r["result"].clone())
            .unwrap_or_else(|| panic!("the daemon's seq {seq} is not at the verifier"))
    }

    /// Runs one more epoch on demand and returns its verdict.
    pub fn next_epoch(&self) -> serde_json::Value {
        let next = self.log_tip() + 1;
        wipe_now(&self.socket);
        self.delivered(next)
    }

    /// Starts the daemon (from `exe`, or the build's) and returns it with the verdict on its
    /// first statement (the epoch it runs at start, or one asked for): the first after a
    /// start ships the whole IMA list.
    pub fn start_and_first(&self, exe: Option<&Path>) -> (Daemon, serde_json::Value) {
        let next = self.last_logged_seq().map_or(0, |s| s + 1);
        let d = match exe {
            Some(exe) => Daemon::start_exe(exe, &self.config, &self.socket),
            None => Daemon::start(&self.config, &self.socket),
        };
        // A restart soon after an epoch runs none by itself (the last wipe is recent).
        if next > 0 {
            wipe_now(&self.socket);
        }
        let r = self.delivered(next);
        (d, r)
    }

    fn logged(&self) -> Vec<Envelope> {
        std::fs::read_to_string(self.state().evidence_log())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn last_logged_opt(&self) -> Option<Envelope> {
        self.logged().pop()
    }

    /// The last line of the daemon's evidence log (an envelope with its sidecar).
    pub fn last_logged(&self) -> Envelope {
        let log = self.state().evidence_log();
        let text =
            std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let line = text.lines().last().expect("a statement in the log");
        serde_json::from_str(line).unwrap()
    }

    /// A forgery by root with the stolen host key: the last statement, one seq on, chained
    /// to it, answering a fresh nonce, claiming a wipe. No quote (the caller may add one).
    pub fn forge(&self) -> (Statement, Envelope, [u8; 32]) {
        let last = self.last_logged();
        let payload = base64::engine::general_purpose::STANDARD
            .decode(&last.payload)
            .unwrap();
        let mut st: Statement = serde_json::from_slice(&payload).unwrap();
        let nonce = self
            .verifier
            .post_json(
                "/v1/challenges",
                format!("{{\"host\":\"{}\",\"rack\":\"{}\"}}", self.host, self.rack).into_bytes(),
            )
            .expect("a nonce for the forger")["nonce"]
            .as_str()
            .unwrap()
            .to_string();
        st.predicate.seq += 1;
        st.predicate.prev = hex::encode(rackwarden_attest::sha3(&dsse::pae(
            &last.payload_type,
            &payload,
        )));
        st.predicate.challenge = Challenge::Nonce {
            nonce: nonce.clone(),
        };
        if let Some(w) = st.predicate.wipe.as_mut() {
            w.nonce = nonce;
        }
        st.predicate.epoch_start_unix_ms = st.predicate.epoch_end_unix_ms;
        st.predicate.epoch_end_unix_ms = rackwarden_attest::now_ms();
        let key = keys::load_signing_key(&self.fx.host_key).unwrap();
        let body = st.to_json();
        let env = dsse::sign(&key, dsse::INTOTO_PAYLOAD_TYPE, &body);
        let digest = rackwarden_attest::sha3(&dsse::pae(&env.payload_type, &body));
        (st, env, digest)
    }

    /// Posts an envelope (as root on the host would, straight to the verifier) and returns
    /// its verdict.
    pub fn post(&self, env: &Envelope) -> serde_json::Value {
        let r = self
            .verifier
            .post_statements(env.to_json())
            .expect("the verifier answers");
        let item = &r["results"][0];
        assert_eq!(item["status"], "accepted", "{r}");
        item["result"].clone()
    }

    /// Root quotes `digest` with the daemon's own AK (loaded from its state file) and ships
    /// the whole IMA list: what a forger with root and the TPM can do.
    pub fn quote_as_root(&self, digest: &[u8; 32]) -> TpmSidecar {
        let (ak, digest) = (self.ak_file(), *digest);
        let q = self.platform.with_tpm(move |tpm| {
            tpm.ek().unwrap();
            tpm.load_or_create_ak(&ak).unwrap();
            tpm.quote(&digest, &rackwarden_attest::tpm::DEFAULT_QUOTE_PCRS)
                .unwrap()
        });
        let list = std::fs::read(&self.platform.list).unwrap();
        TpmSidecar::new(&q.attest, &q.signature, &q.pcr_values, Some((0, &list)))
    }

    fn state(&self) -> rackwarden::pins::StatePaths {
        rackwarden::pins::StatePaths::new(self.net.dir.join("state"))
    }

    fn ak_file(&self) -> PathBuf {
        self.state().tpm_ak()
    }
}

fn seq_of(env: &Envelope) -> u64 {
    let payload = base64::engine::general_purpose::STANDARD
        .decode(&env.payload)
        .unwrap_or_default();
    let st: serde_json::Value = serde_json::from_slice(&payload).unwrap_or_default();
    st["predicate"]["seq"].as_u64().unwrap_or(u64::MAX)
}

/// The codes of a verdict, in order.
pub fn codes(result: &serde_json::Value) -> Vec<String> {
    result["findings"]
        .as_array()
        .map(|f| {
            f.iter()
                .filter_map(|x| x["code"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Prints the attack's line and checks the verdict holds `code` at `status`, with a detail
/// naming `naming` (a path or digest the finding must show).
pub fn expect(attack: &str, result: &serde_json::Value, status: &str, code: &str, naming: &str) {
    let found = codes(result);
    let detail = result["findings"]
        .as_array()
        .and_then(|f| {
            f.iter().find(|x| {
                x["code"] == code && x["detail"].as_str().is_some_and(|d| d.contains(naming))
            })
        })
        .and_then(|x| x["detail"].as_str())
        .unwrap_or_else(|| panic!("{attack}: no {code} finding naming `{naming}`: {result:#}"));
    println!(
        "TPM-MATRIX {attack}: {} {code} ({detail})",
        result["status"].as_str().unwrap_or("?"),
    );
    assert!(
        found.iter().any(|c| c == code),
        "{attack}: {code} not in {found:?}: {result:#}"
    );
    assert_eq!(result["status"], status, "{attack}: {result:#}");
}
