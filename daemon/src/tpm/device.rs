//! One TPM, through tss-esapi: EK, AK, quote, ActivateCredential, PCR extend.
//!
//! Transient handles (EK, AK, sessions) are flushed when done: behind `/dev/tpmrm0` the kernel
//! would do it when the fd closes, but through `swtpm:` or `/dev/tpm0` they outlive us, and a
//! TPM has only a few object slots (libtpms: 3).

use std::{
    collections::BTreeMap,
    convert::TryFrom,
    path::{Path, PathBuf},
    str::FromStr,
    sync::{Arc, Mutex},
};

use sha2::{Digest as _, Sha256};
use tss_esapi::{
    Context, TctiNameConf,
    abstraction::{AsymmetricAlgorithmSelection, DefaultKey, ak, ek, pcr},
    attributes::SessionAttributesBuilder,
    constants::{SessionType, Tss2ResponseCodeKind},
    handles::{AuthHandle, KeyHandle, ObjectHandle, PcrHandle, SessionHandle},
    interface_types::{
        algorithm::{HashingAlgorithm, SignatureSchemeAlgorithm},
        ecc::EccCurve,
        key_bits::RsaKeyBits,
        session_handles::{AuthSession, PolicySession},
    },
    structures::{
        AttestInfo, Data, Digest, DigestValues, EncryptedSecret, HashScheme, IdObject,
        PcrSelectionList, PcrSelectionListBuilder, PcrSlot, Private, Public, SignatureScheme,
    },
    traits::{Marshall, UnMarshall},
};

use super::{
    EK_CERT_NV_INDEX_RSA2048, QUOTE_TRIES, TpmError,
    ak_file::{self, AkBlobs},
    error::cmd,
};

/// A [`Tpm`] shared between the epoch loop and the control socket: the ESAPI context runs one
/// command at a time.
pub type SharedTpm = Arc<Mutex<Tpm>>;

/// The EK as the verifier needs it for enrolment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EkInfo {
    /// TPMT_PUBLIC (`Public::marshall`): the verifier compares its modulus with the cert's and
    /// takes nameAlg and the symmetric algorithm from it for MakeCredential.
    pub public: Vec<u8>,
    /// DER from NV 0x01c00002 with the NV padding cut off; `None` when the TPM has no EK
    /// certificate (some firmware TPMs ship none; the verifier then decides).
    pub certificate: Option<Vec<u8>>,
}

/// Whether the AK was loaded from its state file or is new (then the verifier must enrol it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AkSource {
    Loaded,
    Created,
    /// The stored AK did not load under this TPM's EK (another TPM, or it was cleared).
    Replaced {
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AkInfo {
    /// TPMT_PUBLIC of the AK.
    pub public: Vec<u8>,
    /// Name = nameAlg (0x000b) || SHA-256(TPMT_PUBLIC): what MakeCredential binds to.
    pub name: Vec<u8>,
    pub source: AkSource,
}

/// A quote and the PCR values it covers (their SHA-256 is the quoted pcrDigest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quote {
    /// TPMS_ATTEST (`Attest::marshall`): the bytes the AK signed.
    pub attest: Vec<u8>,
    /// TPMT_SIGNATURE (`Signature::marshall`).
    pub signature: Vec<u8>,
    pub pcr_values: BTreeMap<u8, [u8; 32]>,
}

pub struct Tpm {
    ctx: Context,
    tcti: String,
    ek: Option<KeyHandle>,
    ak: Option<KeyHandle>,
    /// The loaded AK's public part and Name: what enrolment sends the verifier.
    ak_info: Option<AkInfo>,
}

impl std::fmt::Debug for Tpm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tpm")
            .field("tcti", &self.tcti)
            .field("ek_loaded", &self.ek.is_some())
            .field("ak_loaded", &self.ak.is_some())
            .finish()
    }
}

/// libtss2's device TCTI opens the TPM without `O_CLOEXEC`, so every program the daemon
/// starts (the workload hooks, `cryptsetup`, ...) would inherit a descriptor to the TPM that
/// the guard, which checks opens, cannot take back. Every descriptor of ours on a TPM device
/// is marked close-on-exec right after the open.
fn close_tpm_fds_on_exec() {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        log::warn!("cannot list /proc/self/fd: the TPM descriptor may be inherited by children");
        return;
    };
    for e in fds.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let is_tpm = std::fs::read_link(e.path()).is_ok_and(|t| {
            t.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("tpm"))
                && t.starts_with("/dev")
        });
        if is_tpm {
            // SAFETY: fcntl on a descriptor number this process holds; F_SETFD touches only
            // its flags.
            let r = unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
            if r != 0 {
                log::warn!(
                    "cannot mark the TPM descriptor {fd} close-on-exec: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    }
}

impl Tpm {
    /// Opens the TPM behind `tcti` (`device:/dev/tpmrm0`, `swtpm:host=127.0.0.1,port=P`).
    /// For a device, a missing node or a permission problem is said as such before libtss2
    /// reports a bare TCTI failure.
    pub fn open(tcti: &str) -> Result<Tpm, TpmError> {
        if let Some(path) = device_path(tcti) {
            probe_device(&path)?;
        }
        if let Some(addr) = socket_addr(tcti) {
            probe_socket(tcti, &addr)?;
        }
        let conf = TctiNameConf::from_str(tcti).map_err(|source| TpmError::TctiSyntax {
            tcti: tcti.to_string(),
            source,
        })?;
        let ctx = Context::new(conf).map_err(|source| TpmError::Open {
            tcti: tcti.to_string(),
            source,
        })?;
        close_tpm_fds_on_exec();
        let mut tpm = Tpm {
            ctx,
            tcti: tcti.to_string(),
            ek: None,
            ak: None,
            ak_info: None,
        };
        if !behind_resource_manager(tcti) {
            tpm.flush_stale_transients();
        }
        Ok(tpm)
    }

    /// Without a resource manager (a `swtpm:`/`mssim:` socket, or `/dev/tpm0`) transient
    /// objects outlive the process that loaded them: a daemon killed with SIGKILL leaves its
    /// EK and AK in the TPM's few object slots, and the next start could not load its AK
    /// ("out of memory for object contexts"). Such a TPM has one user, the daemon, so what is
    /// loaded at open is stale. Failures are logged: the loads that follow say what is wrong.
    fn flush_stale_transients(&mut self) {
        use tss_esapi::constants::{CapabilityType, tss::TPM2_TRANSIENT_FIRST};
        use tss_esapi::structures::CapabilityData;
        let handles =
            match self
                .ctx
                .get_capability(CapabilityType::Handles, TPM2_TRANSIENT_FIRST, 64)
            {
                Ok((CapabilityData::Handles(list), _)) => list.into_inner(),
                Ok(_) => Vec::new(),
                Err(e) => {
                    log::warn!("listing the transient objects at {}: {e}", self.tcti);
                    return;
                }
            };
        for h in handles {
            match self.ctx.tr_from_tpm_public(h) {
                Ok(obj) => {
                    log::info!("flushing a stale transient object {h:?} at {}", self.tcti);
                    self.flush(obj, "stale transient object");
                }
                Err(e) => log::warn!("transient object {h:?} at {}: {e}", self.tcti),
            }
        }
    }

    pub fn tcti(&self) -> &str {
        &self.tcti
    }

    /// The vendor string (TPM_PT_VENDOR_STRING_1..4); swtpm says "SW   TPM".
    pub fn vendor(&mut self) -> Result<String, TpmError> {
        tss_esapi::utils::get_tpm_vendor(&mut self.ctx)
            .map_err(cmd("TPM2_GetCapability (vendor strings)"))
    }

    /// The RSA-2048 EK from the TCG default template, created once per [`Tpm`] and kept loaded.
    fn ek_handle(&mut self) -> Result<KeyHandle, TpmError> {
        if let Some(h) = self.ek {
            return Ok(h);
        }
        let h = ek::create_ek_object_2(
            &mut self.ctx,
            AsymmetricAlgorithmSelection::Rsa(RsaKeyBits::Rsa2048),
            DefaultKey,
        )
        .map_err(cmd("TPM2_CreatePrimary (RSA-2048 EK, default template)"))?;
        self.ek = Some(h);
        Ok(h)
    }

    /// The EK's TPMT_PUBLIC and its certificate.
    pub fn ek(&mut self) -> Result<EkInfo, TpmError> {
        let h = self.ek_handle()?;
        let (public, _, _) = self
            .ctx
            .read_public(h)
            .map_err(cmd("TPM2_ReadPublic (EK)"))?;
        let public = public
            .marshall()
            .map_err(cmd("marshalling the EK's TPMT_PUBLIC"))?;
        let certificate = match ek::retrieve_ek_pubcert(
            &mut self.ctx,
            AsymmetricAlgorithmSelection::Rsa(RsaKeyBits::Rsa2048),
        ) {
            Ok(raw) => Some(trim_der(&raw)?),
            // No such NV index: this TPM was shipped without an RSA EK certificate.
            Err(tss_esapi::Error::Tss2Error(rc))
                if rc.kind() == Some(Tss2ResponseCodeKind::Handle) =>
            {
                None
            }
            Err(e) => return Err(cmd("TPM2_NV_Read (EK certificate, NV 0x01c00002)")(e)),
        };
        Ok(EkInfo {
            public,
            certificate,
        })
    }

    /// Loads the AK stored at `path`, or creates one (ECC P-256, ECDSA-SHA256, restricted
    /// signing, under the EK) and stores it there. A stored AK that this TPM refuses as not its
    /// own is replaced; a file that cannot be read or parsed is an error, not a new AK (the
    /// verifier enrolled that AK; an operator should look).
    pub fn load_or_create_ak(&mut self, path: &Path) -> Result<AkInfo, TpmError> {
        let ek = self.ek_handle()?;
        self.flush_ak();
        let (handle, public, source) = match ak_file::read(path)? {
            Some(blobs) => match self.load_ak(ek, &blobs, path) {
                Ok(h) => (h, blobs.public, AkSource::Loaded),
                Err(e) if is_foreign_blob(&e) => {
                    let (h, public) = self.create_ak(ek, path)?;
                    let reason = e.to_string();
                    (h, public, AkSource::Replaced { reason })
                }
                Err(e) => return Err(e),
            },
            None => {
                let (h, public) = self.create_ak(ek, path)?;
                (h, public, AkSource::Created)
            }
        };
        self.ak = Some(handle);
        let name = self
            .ctx
            .tr_get_name(handle.into())
            .map_err(cmd("Esys_TR_GetName (AK)"))?;
        let info = AkInfo {
            public,
            name: name.value().to_vec(),
            source,
        };
        self.ak_info = Some(info.clone());
        Ok(info)
    }

    /// The AK `load_or_create_ak` loaded, if it did.
    pub fn ak_info(&self) -> Option<&AkInfo> {
        self.ak_info.as_ref()
    }

    fn load_ak(
        &mut self,
        ek: KeyHandle,
        blobs: &AkBlobs,
        path: &Path,
    ) -> Result<KeyHandle, TpmError> {
        let bad = |why: String| TpmError::AkFileFormat {
            path: path.to_owned(),
            why,
        };
        let public = Public::unmarshall(&blobs.public)
            .map_err(|e| bad(format!("`public` is not a TPMT_PUBLIC: {e}")))?;
        let private = Private::try_from(blobs.private.clone())
            .map_err(|e| bad(format!("`private` is not a TPM2B_PRIVATE: {e}")))?;
        ak::load_ak(&mut self.ctx, ek, None, private, public).map_err(cmd(
            "TPM2_Load (stored AK under the EK, PolicySecret session)",
        ))
    }

    /// Creates, loads and stores a new AK; returns its handle and TPMT_PUBLIC.
    fn create_ak(&mut self, ek: KeyHandle, path: &Path) -> Result<(KeyHandle, Vec<u8>), TpmError> {
        let created = ak::create_ak_2(
            &mut self.ctx,
            ek,
            HashingAlgorithm::Sha256,
            AsymmetricAlgorithmSelection::Ecc(EccCurve::NistP256),
            SignatureSchemeAlgorithm::EcDsa,
            None,
            DefaultKey,
        )
        .map_err(cmd("TPM2_Create (ECC P-256 AK under the EK)"))?;
        let blobs = AkBlobs {
            public: created
                .out_public
                .marshall()
                .map_err(cmd("marshalling the AK's TPMT_PUBLIC"))?,
            private: created.out_private.value().to_vec(),
        };
        let handle = ak::load_ak(
            &mut self.ctx,
            ek,
            None,
            created.out_private,
            created.out_public,
        )
        .map_err(cmd("TPM2_Load (new AK under the EK, PolicySecret session)"))?;
        // Stored only once it loaded: the file never holds an AK this TPM cannot use.
        if let Err(e) = ak_file::write(path, &blobs) {
            self.flush(handle.into(), "AK");
            return Err(e);
        }
        Ok((handle, blobs.public))
    }

    /// Quotes the sha256 bank's `pcrs` with the AK over `extra_data` (the verifier's nonce or a
    /// statement's SHA-256), and returns the values quoted. PCRs read before the quote may have
    /// changed by the time it runs, so it repeats (at most [`QUOTE_TRIES`] times) until the
    /// values read hash to the quoted digest.
    pub fn quote(&mut self, extra_data: &[u8], pcrs: &[u8]) -> Result<Quote, TpmError> {
        let ak = self.ak.ok_or(TpmError::NoAk)?;
        let pcrs = sorted_pcrs(pcrs)?;
        let selection = selection(&pcrs)?;
        let data = Data::try_from(extra_data.to_vec()).map_err(|_| TpmError::ExtraDataTooLong {
            len: extra_data.len(),
        })?;
        let scheme = SignatureScheme::EcDsa {
            hash_scheme: HashScheme::new(HashingAlgorithm::Sha256),
        };
        for _ in 0..QUOTE_TRIES {
            let values = self.read_pcrs_selected(&pcrs, &selection)?;
            let (attest, signature) = self
                .ctx
                .execute_with_nullauth_session(|c| {
                    c.quote(ak, data.clone(), scheme, selection.clone())
                })
                .map_err(cmd("TPM2_Quote"))?;
            let AttestInfo::Quote { info } = attest.attested() else {
                return Err(TpmError::NotAQuote);
            };
            if info.pcr_digest().value() != pcr_digest(&values).as_slice() {
                continue;
            }
            return Ok(Quote {
                attest: attest
                    .marshall()
                    .map_err(cmd("marshalling the quote's TPMS_ATTEST"))?,
                signature: signature
                    .marshall()
                    .map_err(cmd("marshalling the quote's TPMT_SIGNATURE"))?,
                pcr_values: values,
            });
        }
        Err(TpmError::PcrRace { tries: QUOTE_TRIES })
    }

    /// The sha256 bank's current values of `pcrs`.
    pub fn read_pcrs(&mut self, pcrs: &[u8]) -> Result<BTreeMap<u8, [u8; 32]>, TpmError> {
        let pcrs = sorted_pcrs(pcrs)?;
        let selection = selection(&pcrs)?;
        self.read_pcrs_selected(&pcrs, &selection)
    }

    fn read_pcrs_selected(
        &mut self,
        pcrs: &[u8],
        selection: &PcrSelectionList,
    ) -> Result<BTreeMap<u8, [u8; 32]>, TpmError> {
        let data = self
            .ctx
            .execute_without_session(|c| pcr::read_all(c, selection.clone()))
            .map_err(cmd("TPM2_PCR_Read (sha256 bank)"))?;
        let bank = data.pcr_bank(HashingAlgorithm::Sha256);
        let mut values = BTreeMap::new();
        for &pcr in pcrs {
            let value = bank
                .and_then(|b| b.get_digest(slot(pcr).ok()?))
                .and_then(|d| <[u8; 32]>::try_from(d.value()).ok())
                .ok_or(TpmError::PcrMissing { pcr })?;
            values.insert(pcr, value);
        }
        Ok(values)
    }

    /// Answers a credential challenge made for this TPM's EK and the loaded AK's Name: the TPM
    /// releases the credential only if the AK is loaded beside that EK (the verifier's proof
    /// that the AK lives in the certified TPM). `id_object` is the TPM2B_ID_OBJECT body,
    /// `encrypted_secret` the TPM2B_ENCRYPTED_SECRET body.
    pub fn activate_credential(
        &mut self,
        id_object: &[u8],
        encrypted_secret: &[u8],
    ) -> Result<Vec<u8>, TpmError> {
        let ak = self.ak.ok_or(TpmError::NoAk)?;
        let ek = self.ek_handle()?;
        let id_object =
            IdObject::try_from(id_object.to_vec()).map_err(|_| TpmError::ChallengeTooLarge {
                what: "id object",
                len: id_object.len(),
            })?;
        let secret = EncryptedSecret::try_from(encrypted_secret.to_vec()).map_err(|_| {
            TpmError::ChallengeTooLarge {
                what: "encrypted secret",
                len: encrypted_secret.len(),
            }
        })?;
        let session = self.ek_policy_session(ek)?;
        let result = self.activate_in_session(session, ak, ek, id_object, secret);
        self.ctx.clear_sessions();
        self.flush(SessionHandle::from(session).into(), "EK policy session");
        result
    }

    /// A policy session satisfying the EK's authPolicy, PolicySecret(TPM_RH_ENDORSEMENT) (the
    /// RSA-2048 default template has no policyOR part), with the EK's own symmetric algorithm
    /// and nameAlg as keylime does.
    fn ek_policy_session(&mut self, ek: KeyHandle) -> Result<AuthSession, TpmError> {
        let (ek_public, _, _) = self
            .ctx
            .read_public(ek)
            .map_err(cmd("TPM2_ReadPublic (EK)"))?;
        let symmetric = ek_public
            .symmetric_algorithm()
            .ok_or(TpmError::EkTemplate {
                what: "symmetric algorithm",
            })?;
        let session = self
            .ctx
            .start_auth_session(
                None,
                None,
                None,
                SessionType::Policy,
                symmetric.into(),
                ek_public.name_hashing_algorithm(),
            )
            .map_err(cmd("TPM2_StartAuthSession (policy, for the EK)"))?
            .ok_or(TpmError::EkTemplate {
                what: "policy session handle back from TPM2_StartAuthSession",
            })?;
        let (attributes, mask) = SessionAttributesBuilder::new()
            .with_encrypt(true)
            .with_decrypt(true)
            .build();
        if let Err(e) = self.ctx.tr_sess_set_attributes(session, attributes, mask) {
            self.flush(SessionHandle::from(session).into(), "EK policy session");
            return Err(cmd("Esys_TRSess_SetAttributes (EK policy session)")(e));
        }
        Ok(session)
    }

    fn activate_in_session(
        &mut self,
        session: AuthSession,
        ak: KeyHandle,
        ek: KeyHandle,
        id_object: IdObject,
        secret: EncryptedSecret,
    ) -> Result<Vec<u8>, TpmError> {
        let policy = PolicySession::try_from(session)
            .map_err(cmd("TPM2_PolicySecret (session is not a policy session)"))?;
        self.ctx
            .execute_with_nullauth_session(|c| {
                c.policy_secret(
                    policy,
                    AuthHandle::Endorsement,
                    Default::default(),
                    Default::default(),
                    Default::default(),
                    None,
                )
            })
            .map_err(cmd("TPM2_PolicySecret (endorsement hierarchy, for the EK)"))?;
        // The AK (userWithAuth, empty auth) takes a password session; the EK its policy.
        let digest: Digest = self
            .ctx
            .execute_with_sessions((Some(AuthSession::Password), Some(session), None), |c| {
                c.activate_credential(ak, ek, id_object, secret)
            })
            .map_err(cmd("TPM2_ActivateCredential"))?;
        Ok(digest.value().to_vec())
    }

    /// Extends sha256 PCR `pcr` with `digest` (the kernel's IMA does this for PCR 10; tests
    /// simulate a measurement list with it).
    pub fn extend_pcr(&mut self, pcr: u8, digest: [u8; 32]) -> Result<(), TpmError> {
        if pcr >= 24 {
            return Err(TpmError::PcrOutOfRange { pcr });
        }
        // ESYS_TR_PCR0 is 0: the ESYS handle of PCR n is n.
        let handle =
            PcrHandle::try_from(u32::from(pcr)).map_err(|_| TpmError::PcrOutOfRange { pcr })?;
        let mut values = DigestValues::new();
        values.set(
            HashingAlgorithm::Sha256,
            Digest::try_from(digest.to_vec()).map_err(cmd("TPM2_PCR_Extend (digest)"))?,
        );
        self.ctx
            .execute_with_nullauth_session(|c| c.pcr_extend(handle, values))
            .map_err(cmd("TPM2_PCR_Extend (sha256 bank)"))
    }

    fn flush_ak(&mut self) {
        self.ak_info = None;
        if let Some(h) = self.ak.take() {
            self.flush(h.into(), "AK");
        }
    }

    /// Flushes a transient handle; a failure is only logged (nothing more can be done, and
    /// behind a resource manager the handle goes with the fd anyway).
    fn flush(&mut self, handle: ObjectHandle, what: &str) {
        if let Err(e) = self.ctx.flush_context(handle) {
            log::warn!(
                "{}",
                TpmError::Command {
                    command: "TPM2_FlushContext",
                    source: e
                }
            );
            log::warn!("the {what} stays loaded in the TPM at {}", self.tcti);
        }
    }
}

impl Drop for Tpm {
    fn drop(&mut self) {
        self.flush_ak();
        if let Some(h) = self.ek.take() {
            self.flush(h.into(), "EK");
        }
    }
}

/// `device:/dev/tpmrm<N>`: the kernel's resource manager flushes what a process loaded when
/// its fd closes, and other users share the TPM.
fn behind_resource_manager(tcti: &str) -> bool {
    device_path(tcti).is_some_and(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("tpmrm"))
    })
}

/// The path a `device[:path]` TCTI opens (libtss2's default is /dev/tpm0).
fn device_path(tcti: &str) -> Option<PathBuf> {
    match tcti.split_once(':') {
        Some(("device", path)) if !path.is_empty() => Some(PathBuf::from(path)),
        None if tcti == "device" => Some(PathBuf::from("/dev/tpm0")),
        Some(("device", _)) => Some(PathBuf::from("/dev/tpm0")),
        _ => None,
    }
}

/// The command socket a `swtpm:`/`mssim:` TCTI connects to (`host=H,port=P`; libtss2's
/// defaults are localhost and 2321).
fn socket_addr(tcti: &str) -> Option<String> {
    let (kind, conf) = tcti.split_once(':').unwrap_or((tcti, ""));
    if kind != "swtpm" && kind != "mssim" {
        return None;
    }
    let (mut host, mut port) = ("localhost".to_string(), "2321".to_string());
    for kv in conf.split(',').filter(|kv| !kv.is_empty()) {
        match kv.split_once('=') {
            Some(("host", h)) => host = h.to_string(),
            Some(("port", p)) => port = p.to_string(),
            _ => {}
        }
    }
    Some(format!("{host}:{port}"))
}

/// Connects to the TPM's command socket once, so that a wrong port or a simulator that is not
/// running is said in words (libtss2 says only that the TCTI failed, on its own stderr).
fn probe_socket(tcti: &str, addr: &str) -> Result<(), TpmError> {
    use std::net::ToSocketAddrs as _;
    let unreachable = |source| TpmError::SocketUnreachable {
        tcti: tcti.to_string(),
        addr: addr.to_string(),
        source,
    };
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "the host has no address");
    for a in addr.to_socket_addrs().map_err(unreachable)? {
        match std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(2)) {
            Ok(_) => return Ok(()),
            Err(e) => last = e,
        }
    }
    Err(unreachable(last))
}

/// Opens and closes the device node so that "no such device" and "permission denied" are
/// reported as such (libtss2 says only that the TCTI failed to initialize).
fn probe_device(path: &Path) -> Result<(), TpmError> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(TpmError::NoDevice {
            path: path.to_owned(),
        }),
        Err(source) => Err(TpmError::DeviceAccess {
            path: path.to_owned(),
            source,
        }),
    }
}

/// True for TPM2_Load failures that say the blob is not this TPM's (another TPM, a cleared
/// endorsement hierarchy): the AK must be made afresh. Warnings and TPM-state errors (out of
/// memory, lockout, not started) are not, and stay errors.
fn is_foreign_blob(e: &TpmError) -> bool {
    use Tss2ResponseCodeKind as K;
    matches!(
        e.response_code(),
        Some(K::Integrity | K::Size | K::Value | K::Key | K::Binding | K::Attributes | K::Type)
    )
}

fn sorted_pcrs(pcrs: &[u8]) -> Result<Vec<u8>, TpmError> {
    if pcrs.is_empty() {
        return Err(TpmError::NoPcrs);
    }
    if let Some(&pcr) = pcrs.iter().find(|&&p| p >= 24) {
        return Err(TpmError::PcrOutOfRange { pcr });
    }
    let mut v = pcrs.to_vec();
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

fn slot(pcr: u8) -> Result<PcrSlot, TpmError> {
    1u32.checked_shl(u32::from(pcr))
        .and_then(|bit| PcrSlot::try_from(bit).ok())
        .ok_or(TpmError::PcrOutOfRange { pcr })
}

fn selection(pcrs: &[u8]) -> Result<PcrSelectionList, TpmError> {
    let slots = pcrs
        .iter()
        .map(|&p| slot(p))
        .collect::<Result<Vec<_>, _>>()?;
    PcrSelectionListBuilder::new()
        .with_selection(HashingAlgorithm::Sha256, &slots)
        .build()
        .map_err(cmd("building the PCR selection (sha256 bank)"))
}

/// The quote's pcrDigest over `values`: SHA-256 of the values in ascending PCR order (one
/// selection, so list order is PCR order).
fn pcr_digest(values: &BTreeMap<u8, [u8; 32]>) -> [u8; 32] {
    let mut h = Sha256::new();
    for v in values.values() {
        h.update(v);
    }
    h.finalize().into()
}

/// Cuts the NV padding after a DER certificate: NV indices are sized by the manufacturer and
/// hold the certificate followed by zeros or 0xff; the outer SEQUENCE says how long it is.
pub(super) fn trim_der(raw: &[u8]) -> Result<Vec<u8>, TpmError> {
    let bad = |why| TpmError::EkCertificate {
        index: EK_CERT_NV_INDEX_RSA2048,
        why,
    };
    let (&tag, rest) = raw.split_first().ok_or(bad("the index is empty"))?;
    if tag != 0x30 {
        return Err(bad("it does not start with a SEQUENCE"));
    }
    let (&first, rest) = rest.split_first().ok_or(bad("it ends in its length"))?;
    let (len, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return Err(bad("its length is indefinite or over 4 bytes"));
        }
        let bytes = rest.get(..n).ok_or(bad("it ends in its length"))?;
        let len = bytes
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, 2 + n)
    };
    let total = header + len;
    raw.get(..total)
        .map(<[u8]>::to_vec)
        .ok_or(bad("its length runs past the end of the index"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tpm_trim_der_cuts_nv_padding() {
        let mut cert = vec![0x30, 0x82, 0x01, 0x00];
        cert.extend(std::iter::repeat_n(7u8, 0x100));
        let mut nv = cert.clone();
        nv.extend([0xff; 40]);
        assert_eq!(trim_der(&nv).unwrap(), cert);
        assert_eq!(trim_der(&cert).unwrap(), cert);
        assert_eq!(
            trim_der(&[0x30, 0x03, 1, 2, 3, 0]).unwrap(),
            vec![0x30, 3, 1, 2, 3]
        );
        for bad in [
            &[][..],
            &[0x31, 0][..],
            &[0x30, 0x82, 0x01][..],
            &[0x30, 0x05, 1][..],
        ] {
            assert!(trim_der(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tpm_pcr_lists_are_checked_and_sorted() {
        assert_eq!(sorted_pcrs(&[10, 0, 7, 10]).unwrap(), vec![0, 7, 10]);
        assert!(matches!(sorted_pcrs(&[]), Err(TpmError::NoPcrs)));
        assert!(matches!(
            sorted_pcrs(&[1, 24]),
            Err(TpmError::PcrOutOfRange { pcr: 24 })
        ));
        assert_eq!(slot(10).unwrap(), PcrSlot::Slot10);
    }

    #[test]
    fn tpm_pcr_digest_is_sha256_of_values_in_pcr_order() {
        let values = BTreeMap::from([(10u8, [2u8; 32]), (0u8, [1u8; 32])]);
        let mut cat = vec![1u8; 32];
        cat.extend([2u8; 32]);
        assert_eq!(pcr_digest(&values), <[u8; 32]>::from(Sha256::digest(&cat)));
    }

    #[test]
    fn tpm_is_send_so_shared_tpm_crosses_threads() {
        fn send<T: Send + Sync>() {}
        send::<SharedTpm>();
    }

    #[test]
    fn tpm_device_paths() {
        assert_eq!(
            device_path("device:/dev/tpmrm0"),
            Some("/dev/tpmrm0".into())
        );
        assert_eq!(device_path("device"), Some("/dev/tpm0".into()));
        assert_eq!(device_path("swtpm:host=127.0.0.1,port=2321"), None);
    }

    #[test]
    fn tpm_open_missing_device_names_it() {
        let e = Tpm::open("device:/nonexistent/tpmrm9").unwrap_err();
        assert!(matches!(e, TpmError::NoDevice { .. }), "{e}");
        assert!(e.to_string().contains("/nonexistent/tpmrm9"), "{e}");
    }
}
