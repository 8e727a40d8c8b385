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

/// Where the TPM and the IMA list come from.
pub enum TpmSource {
    /// swtpm, and a list file the test writes while extending PCR 10 as the kernel would.
    Simulated {
        swtpm: SwTpm,
        entries: Vec<ImaEntry>,
    },
    /// A VM guest's TPM (`/dev/tpmrm0`, swtpm behind qemu) and the kernel's own IMA:
    /// measuring is running the file.
    Device,
}

/// The TPM the daemon quotes with and the IMA list it ships.
pub struct Platform {
    pub source: TpmSource,
    pub tcti: String,
    /// The binary IMA list the daemon reads (`[tpm] ima_list`).
    pub list: PathBuf,
    /// The boot's event log the daemon ships (`[tpm] event_log`): the guest firmware's, or
    /// none for swtpm (no firmware measured anything into it; a path that does not exist,
    /// so that a test host's own TPM log is never shipped as swtpm's).
    pub event_log: PathBuf,
    /// The CA that issued the TPM's EK certificate (the verifier's `[tpm] ek_roots`).
    pub ca_root: PathBuf,
    pub ca_intermediate: PathBuf,
    /// Where attack programs are written: a file system IMA measures.
    pub scratch: PathBuf,
}

pub fn sha256_file(path: &Path) -> [u8; 32] {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Sha256::digest(&bytes).into()
}

impl Platform {
    /// swtpm in namespace `ns` (where the daemon opens its TCTI) and a fresh simulated boot:
    /// the boot aggregate, then the daemon binary measured when it was exec'd.
    pub fn simulated(ns: &str, dir: &Path) -> Platform {
        let swtpm = SwTpm::start_in_netns(ns);
        let mut p = Platform {
            tcti: swtpm.tcti.clone(),
            ca_root: swtpm.ca_root.clone(),
            ca_intermediate: swtpm.ca_intermediate.clone(),
            list: dir.join("binary_runtime_measurements"),
            event_log: dir.join("swtpm-has-no-event-log"),
            scratch: dir.to_path_buf(),
            source: TpmSource::Simulated {
                swtpm,
                entries: Vec::new(),
            },
        };
        p.reboot();
        p
    }

    /// The guest's TPM and the kernel's IMA. Attack programs go under `scratch`, which must
    /// not be on tmpfs (the tcb policy does not measure it).
    pub fn device(ca_root: &Path, ca_intermediate: &Path, scratch: &Path) -> Platform {
        std::fs::create_dir_all(scratch).unwrap();
        let mut p = Platform {
            source: TpmSource::Device,
            tcti: "device:/dev/tpmrm0".into(),
            list: "/sys/kernel/security/ima/binary_runtime_measurements".into(),
            event_log: rackwarden_attest::tpm::EVENT_LOG_PATH.into(),
            ca_root: ca_root.into(),
            ca_intermediate: ca_intermediate.into(),
            scratch: scratch.into(),
        };
        // What the install would record: the programs the rack runs, run once so the kernel
        // has measured them before the allowlist is taken from its list (the TCTI library
        // the TPM loads, the CLIs the fixture calls, the hooks' `date`).
        p.with_tpm(|_| ());
        // The EK CA files the verifier reads: the tcb policy measures what root reads.
        for f in [ca_root, ca_intermediate] {
            std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        }
        for exe in [
            bin("rackwardend"),
            bin("rackwarden"),
            bin("rackwarden-verifier"),
            PathBuf::from("/usr/bin/date"),
        ] {
            p.measure(&exe);
        }
        p
    }

    /// The list of a new boot after the simulated TPM was reset: the boot aggregate, then the
    /// daemon.
    pub fn reboot(&mut self) {
        if let TpmSource::Simulated { entries, .. } = &mut self.source {
            entries.clear();
        }
        self.measure_digest("boot_aggregate", [0x11; 32]);
        self.measure(&bin("rackwardend"));
    }

    /// The entries of the list as it is now.
    pub fn entries(&self) -> Vec<ImaEntry> {
        match &self.source {
            TpmSource::Simulated { entries, .. } => entries.clone(),
            TpmSource::Device => {
                let bytes = std::fs::read(&self.list).unwrap();
                rackwarden_attest::tpm::parse_ima_binary(&bytes).unwrap()
            }
        }
    }

    /// IMA measures `path` (an exec by root). Simulated: the list grows and PCR 10 is
    /// extended, only while no daemon holds swtpm's one connection. Device: the file runs.
    pub fn measure(&mut self, path: &Path) {
        match &self.source {
            TpmSource::Simulated { .. } => {
                let digest = sha256_file(path);
                self.measure_digest(&path.display().to_string(), digest);
            }
            TpmSource::Device => {
                let st = std::process::Command::new(path)
                    .arg("--version")
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status()
                    .unwrap_or_else(|e| panic!("running {}: {e}", path.display()));
                let _ = st;
            }
        }
    }

    fn measure_digest(&mut self, path: &str, digest: [u8; 32]) {
        let e = ImaEntry::ima_ng(path, digest);
        let extend = e.sha256_bank_extend_value();
        self.with_tpm(move |tpm| {
            tpm.extend_pcr(10, extend)
                .unwrap_or_else(|e| panic!("extending PCR 10: {e}"))
        });
        if let TpmSource::Simulated { entries, .. } = &mut self.source {
            entries.push(e);
            std::fs::write(&self.list, encode_ima_binary(entries)).unwrap();
        }
    }

    /// A power cycle of the simulated TPM (resetCount moves, PCRs from zero) and a new boot's
    /// list. `false` on a device: a guest cannot reboot inside its test run.
    pub fn power_cycle(&mut self) -> bool {
        match &mut self.source {
            TpmSource::Simulated { swtpm, .. } => swtpm.restart(),
            TpmSource::Device => return false,
        }
        self.reboot();
        true
    }

    /// Runs `f` on the TPM, from the namespace swtpm listens in (the daemon's).
    pub fn with_tpm<T: Send + 'static>(&self, f: impl FnOnce(&mut Tpm) -> T + Send + 'static) -> T {
        let tcti = self.tcti.clone();
        let run = move || {
            let mut tpm = Tpm::open(&tcti).unwrap_or_else(|e| panic!("{tcti}: {e}"));
            f(&mut tpm)
        };
        match &self.source {
            TpmSource::Simulated { swtpm, .. } => match &swtpm.netns {
                Some(ns) => crate::in_netns(ns, run),
                None => run(),
            },
            TpmSource::Device => run(),
        }
    }

    /// The SHA-256 IMA recorded for the daemon binary (what the policy must accept).
    fn daemon_digest(&self) -> String {
        let daemon = bin("rackwardend").display().to_string();
        self.entries()
            .iter()
            .rev()
            .find(|e| e.path.as_deref() == Some(daemon.as_str()))
            .and_then(|e| e.file_digest.as_ref())
            .map(|(_, d)| hex::encode(d))
            .unwrap_or_else(|| panic!("{daemon} is not in the IMA list"))
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
    /// `platform`: made for the rack namespace and directory (see [`Platform::simulated`]).
    pub fn new(tag: &str, platform: impl FnOnce(&Net) -> Platform) -> Matrix {
        let net = Net::new(tag);
        let fx = EpochFixture::new(&net.dir, 1 << 20);
        let verifier = Verifier::configure(&net, &fx.manifest, &fx.verifier_pub, "64 GiB");
        let (rack, host) = ids(&net);
        verifier.enroll(&rack, &host, &fx.host_pub);
        let platform = platform(&net);
        // A guest maps shared libraries (the verifier's, the TCTI's) that nothing loaded
        // before the allowlist is taken from its list; an operator's allowlist would name
        // them, this test excludes their directories instead.
        let exclude = match platform.source {
            TpmSource::Device => "exclude = [\"/lib/\", \"/lib64/\", \"/usr/lib/\"]\n",
            TpmSource::Simulated { .. } => "",
        };
        let allowlist = net.dir.join("ima-allowlist.txt");
        // What the operator recorded at install: every file measured so far.
        let lines: String = platform
            .entries()
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
                "[policy.runtime]\ndaemon_digests = [\"{}\"]\nallowlist = \"{}\"\n{exclude}\n[tpm]\nek_roots = \"{}\"\nek_intermediates = \"{}\"\n",
                platform.daemon_digest(),
                allowlist.display(),
                platform.ca_root.display(),
                platform.ca_intermediate.display(),
            ),
        );
        let sections = fx.sections(&verifier.daemon_lines(), "1 h", "16 MiB")
            + &format!(
                "\n[tpm]\nmode = \"required\"\ntcti = \"{}\"\nima_list = \"{}\"\nevent_log = \"{}\"\n",
                platform.tcti,
                platform.list.display(),
                platform.event_log.display()
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
        self.forge_with(|_| {})
    }

    /// [`Matrix::forge`], with `edit` applied to the statement before it is signed (the
    /// claims a forger changes).
    pub fn forge_with(&self, edit: impl FnOnce(&mut Statement)) -> (Statement, Envelope, [u8; 32]) {
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
        edit(&mut st);
        let key = keys::load_signing_key(&self.fx.host_key).unwrap();
        let body = st.to_json().unwrap();
        let env = dsse::sign(&key, dsse::INTOTO_PAYLOAD_TYPE, &body);
        let digest = rackwarden_attest::sha3(&dsse::pae(&env.payload_type, &body));
        (st, env, digest)
    }

    /// Posts an envelope (as root on the host would, straight to the verifier) and returns
    /// its verdict.
    pub fn post(&self, env: &Envelope) -> serde_json::Value {
        let r = self
            .verifier
            .post_statements(env.to_json().unwrap())
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

fn make_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The whole matrix on `m`: honest, then each attack by root, each printed and checked.
pub fn run(mut m: Matrix) {
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
    let forger = m.platform.scratch.join("forge");
    std::fs::write(
        &forger,
        b"#!/bin/sh\n# a program that signs what it likes\n",
    )
    .unwrap();
    make_executable(&forger);
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
    let unknown = m.platform.scratch.join("miner");
    std::fs::write(&unknown, b"#!/bin/sh\n# not in the allowlist\n").unwrap();
    make_executable(&unknown);
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
    let modified = m.platform.scratch.join("modified/rackwardend");
    std::fs::create_dir_all(modified.parent().unwrap()).unwrap();
    let mut exe = std::fs::read(bin("rackwardend")).unwrap();
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
    if !m.platform.power_cycle() {
        println!(
            "TPM-MATRIX reboot: not in this run (a guest cannot reboot inside its test run; the host matrix power-cycles its swtpm)"
        );
        return;
    }
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

/// TPM2_GetRandom(8) as raw bytes in `printf` octal: tag TPM_ST_NO_SESSIONS, size 12,
/// TPM_CC_GetRandom, bytesRequested 8. What a root shell can write to the TPM with builtins.
const GET_RANDOM: &str = r"\200\001\000\000\000\014\000\000\001\173\000\010";

/// Root's shell writes a raw TPM command to `dev` (the shell's builtins only: IMA sees
/// nothing new). `Err` with the shell's error when the open or the write fails.
fn shell_writes_tpm_command(dev: &Path) -> Result<(), String> {
    let out = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            "exec 3<>{} && printf '{GET_RANDOM}' >&3",
            dev.display()
        ))
        .output()
        .unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// A shell that opens the TPM device on fd 3, then waits on a FIFO for the word to send it
/// TPM2_GetRandom through that descriptor and exit.
struct EarlyTpmHolder {
    child: std::process::Child,
    fifo: PathBuf,
}

impl EarlyTpmHolder {
    fn start(dev: &Path, scratch: &Path) -> EarlyTpmHolder {
        let fifo = scratch.join("tpm-holder.fifo");
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success(), "mkfifo {}", fifo.display());
        let child = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!(
                "exec 3<>{} || exit 2; read go < {}; printf '{GET_RANDOM}' >&3 || exit 3",
                dev.display(),
                fifo.display()
            ))
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let fd = PathBuf::from(format!("/proc/{}/fd/3", child.id()));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !fd.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the holder never opened {}",
                dev.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        EarlyTpmHolder { child, fifo }
    }

    /// Tells the holder to write its command through the descriptor it kept; panics unless
    /// the write went through.
    fn send_tpm_command(&mut self) -> &'static str {
        use std::io::Read as _;
        std::fs::write(&self.fifo, "go\n").unwrap();
        let status = self.child.wait().unwrap();
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        assert!(
            status.success(),
            "the holder's descriptor no longer reaches the TPM ({status}): {err}"
        );
        "its holder still sends the TPM commands"
    }
}

impl Drop for EarlyTpmHolder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.fifo);
    }
}

/// `major:minor` of the TPM resource manager's device (sysfs).
fn tpmrm_major_minor() -> Option<(u32, u32)> {
    let text = std::fs::read_to_string("/sys/class/tpmrm/tpmrm0/dev").ok()?;
    let (ma, mi) = text.trim().split_once(':')?;
    Some((ma.parse().ok()?, mi.parse().ok()?))
}

/// The daemon's statement came with a quote the verifier verified: its level is `tpm` or
/// better. (Not necessarily `tpm_ima`: in the guest the attack matrix ran a modified daemon
/// earlier in this boot, and IMA's list keeps it until reboot.)
fn assert_quoted(r: &serde_json::Value) {
    let quote_findings: Vec<String> = codes(r)
        .into_iter()
        .filter(|c| c.starts_with("quote_") || c == "pcr_values_mismatch" || c == "ak_not_enrolled")
        .collect();
    assert!(
        matches!(r["root_of_trust"].as_str(), Some("tpm" | "tpm_ima")) && quote_findings.is_empty(),
        "the daemon quotes under the guard: {r:#}"
    );
}

/// The TPM kept for the daemon (issue 41): with the guard sealed, the daemon still quotes
/// every statement, and root's shell writing raw TPM commands (to the device, or to a node
/// made anew for it with `mknod`) is refused; before the guard, the same shell reached the
/// TPM, which is the attack: root loading the daemon's AK and quoting what it likes. Run last
/// in a boot: the sealed guard stays until reboot.
pub fn run_guarded(mut m: Matrix) {
    crate::set_protection(m.config.clone(), "lsm");
    let dev = Path::new("/dev/tpmrm0");
    shell_writes_tpm_command(dev)
        .unwrap_or_else(|e| panic!("before the guard, root's shell reaches the TPM: {e}"));
    m.verifier.start();
    // A process that opened the TPM before the guard sealed, and keeps it: what the guard
    // cannot refuse (it checks opens), so every statement counts it.
    let mut holder = EarlyTpmHolder::start(dev, &m.platform.scratch);
    let (mut daemon, r) = m.start_and_first(None);
    assert_quoted(&r);
    let r = m.next_epoch();
    assert_quoted(&r);
    let st = crate::status_json(&m.socket);
    let guard = &st["self_protection"]["lsm_guard"];
    assert_eq!(guard["state"], "sealed", "{:#}", st["self_protection"]);
    assert!(
        guard["tpm_devices"].as_u64() >= Some(2),
        "the guard keeps tpm0 and tpmrm0: {guard:#}"
    );
    assert_eq!(
        guard["tpm_held_elsewhere"].as_u64(),
        Some(1),
        "the early holder's descriptor is counted: {guard:#}"
    );
    assert!(
        codes(&r).iter().any(|c| c == "tpm_held_elsewhere"),
        "the verdict names the early holder: {r:#}"
    );
    let reached = holder.send_tpm_command();
    println!(
        "TPM-MATRIX a descriptor opened before the seal: {reached}, counted in the statement (tpm_held_elsewhere = 1) and a tpm_held_elsewhere warning"
    );
    let refused_before = guard["refusals"].as_u64().unwrap_or(0);

    let err = shell_writes_tpm_command(dev).expect_err("root's shell still reaches the TPM");
    assert!(err.contains("not permitted"), "{err}");
    let (major, minor) = tpmrm_major_minor().expect("the guest's tpmrm0");
    let node = m.platform.scratch.join("tpm-anew");
    let _ = std::fs::remove_file(&node);
    let made = std::process::Command::new("mknod")
        .arg(&node)
        .args(["c", &major.to_string(), &minor.to_string()])
        .status()
        .unwrap();
    assert!(made.success(), "mknod {}", node.display());
    let err_anew = shell_writes_tpm_command(&node).expect_err("a node made anew reaches the TPM");
    let _ = std::fs::remove_file(&node);
    assert!(err_anew.contains("not permitted"), "{err_anew}");
    let err_tpm0 = shell_writes_tpm_command(Path::new("/dev/tpm0"))
        .expect_err("root's shell reaches the TPM through /dev/tpm0");
    assert!(err_tpm0.contains("not permitted"), "{err_tpm0}");

    // The daemon quotes on: the guard keeps the TPM for it, not from it; with the early
    // holder gone, the TPM is the daemon's alone.
    let r = m.next_epoch();
    assert_quoted(&r);
    assert!(
        !codes(&r).iter().any(|c| c == "tpm_held_elsewhere"),
        "the holder is gone: {r:#}"
    );
    let st = crate::status_json(&m.socket);
    let refused = st["self_protection"]["lsm_guard"]["refusals"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        refused >= refused_before + 3,
        "three refusals counted ({refused_before} -> {refused})"
    );
    println!(
        "TPM-MATRIX raw TPM commands from root's shell: refused by the guard ({err}); a node made anew: refused; the daemon's next statement: quoted, {} (guard {})",
        r["root_of_trust"].as_str().unwrap_or("?"),
        r["guard"].as_str().unwrap_or("-")
    );
    daemon.stop();
}
