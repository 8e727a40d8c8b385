//! The reference server against the replay, over real loopback TCP: honest exchanges pass
//! when the replay runs in another precision, and each attack fails with its own finding.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::DType;
use rackwarden_attest::sampling_key::{KeySource, SamplingKey};
use rackwarden_inference::attacks::{self, substitute};
use rackwarden_inference::bundled::{Variant, cached};
use rackwarden_inference::files::LoadedModel;
use rackwarden_inference::generate::{completion_body, draw};
use rackwarden_inference::protocol::{CompletionRequest, render_completion};
use rackwarden_inference::replay::{RecordedExchange, ReplayModels, replay_exchange};
use rackwarden_inference::serve::{ServeConfig, serve};
use rackwarden_sampler::Seed;
use rackwarden_sampler::verdict::{
    ExchangeReplay, ReplayFailure, ReplayJudgement, StructuralFinding as ReplayFinding,
};

const NAME: &str = "bundled";
const EPOCH: u64 = 7;
const KEY: [u8; 32] = [0x4b; 32];
const TOLERANCE: f64 = 0.05;

/// The bundled model of `variant`, made once per content under the target directory.
fn bundled(variant: Variant) -> PathBuf {
    cached(&Path::new(env!("CARGO_MANIFEST_DIR")).join(".."), variant).unwrap()
}

struct Rack {
    addr: std::net::SocketAddr,
    _keys: tempfile::TempDir,
}

/// A server on loopback with the sampling key of [`EPOCH`].
fn start(dir: &Path) -> Rack {
    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("sampling-key.json");
    let key = SamplingKey {
        epoch_seq: EPOCH,
        key: KEY,
        source: KeySource::VerifierNonce,
    };
    std::fs::write(&key_file, serde_json::to_vec(&key).unwrap()).unwrap();
    let model = Arc::new(LoadedModel::open(dir, DType::F32).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = ServeConfig {
        model_name: NAME.into(),
        key_file,
    };
    std::thread::spawn(move || serve(listener, model, cfg));
    Rack { addr, _keys: keys }
}

fn request_bytes(body: &str) -> Vec<u8> {
    rackwarden_inference::client::request_with_body(body)
}

/// Sends `request` and reads one response, exactly the bytes on the wire.
fn exchange(rack: &Rack, request: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(rack.addr).unwrap();
    rackwarden_inference::client::ask(&mut s, request).unwrap()
}

fn replay_models(dir: &Path, dtype: DType) -> ReplayModels {
    ReplayModels {
        models: vec![(NAME.into(), LoadedModel::open(dir, dtype).unwrap())],
    }
}

fn keys() -> BTreeMap<u64, [u8; 32]> {
    BTreeMap::from([(EPOCH, KEY), (EPOCH + 1, [0x4c; 32])])
}

fn replay(models: &ReplayModels, epoch: u64, request: &[u8], response: &[u8]) -> ReplayJudgement {
    let r = replay_exchange(
        models,
        &keys(),
        &RecordedExchange {
            epoch_seq: epoch,
            request,
            response,
        },
    );
    // What is stored reads back as itself.
    let json = serde_json::to_string(&r).unwrap();
    assert_eq!(serde_json::from_str::<ExchangeReplay>(&json).unwrap(), r);
    r.judge(TOLERANCE)
}

fn finding(o: ReplayJudgement) -> ReplayFinding {
    match o {
        ReplayJudgement::Failed(ReplayFailure::Structural(f)) => f,
        other => panic!("expected a structural finding, got {other:?}"),
    }
}

fn diverged(o: &ReplayJudgement) -> bool {
    matches!(o, ReplayJudgement::Failed(ReplayFailure::Diverged { .. }))
}

const BODY: &str =
    r#"{"model":"bundled","prompt":"The verifier","max_tokens":48,"temperature":0.8}"#;

#[test]
fn honest_exchanges_replay_in_another_precision_within_the_key_window() {
    for variant in [Variant::Random, Variant::Trained] {
        let dir = bundled(variant);
        let rack = start(&dir);
        let models = replay_models(&dir, DType::F64);
        let req = request_bytes(BODY);
        let resp = exchange(&rack, &req);
        for epoch in [EPOCH, EPOCH + 1] {
            match replay(&models, epoch, &req, &resp) {
                ReplayJudgement::Passed { tokens, .. } => assert_eq!(tokens, 48, "{variant:?}"),
                other => panic!("{variant:?}: {other:?}"),
            }
        }
        assert_eq!(
            finding(replay(&models, EPOCH + 2, &req, &resp)),
            ReplayFinding::KeyEpoch {
                named: EPOCH,
                record: EPOCH + 2
            }
        );
        // The same request twice: the same seed, the same bytes.
        assert_eq!(exchange(&rack, &req), resp);
        // A request the server refuses gets its fixed error, which replays as such.
        // So does one the model cannot hold (prompt and max_tokens beyond its 256 positions):
        // a client's oversized request is no finding against an honest host.
        let long = request_bytes(r#"{"model":"bundled","prompt":"x","max_tokens":300}"#);
        let r = exchange(&rack, &long);
        assert!(
            r.starts_with(b"HTTP/1.1 400 "),
            "{}",
            String::from_utf8_lossy(&r)
        );
        assert_eq!(
            replay(&models, EPOCH, &long, &r),
            ReplayJudgement::NotGenerated
        );
        // A temperature the replay's drift would be magnified by past any tolerance: refused.
        let cold = request_bytes(r#"{"model":"bundled","prompt":"x","temperature":0.001}"#);
        let r = exchange(&rack, &cold);
        assert!(r.starts_with(b"HTTP/1.1 400 "));
        assert_eq!(
            replay(&models, EPOCH, &cold, &r),
            ReplayJudgement::NotGenerated
        );
        // HEAD gets the refusal's head without its body, as the tap frames it.
        let head = b"HEAD /v1/completions HTTP/1.1\r\nhost: rack\r\n\r\n".to_vec();
        let r = exchange(&rack, &head);
        assert!(r.starts_with(b"HTTP/1.1 405 ") && r.ends_with(b"\r\n\r\n"));
        assert_eq!(
            replay(&models, EPOCH, &head, &r),
            ReplayJudgement::NotGenerated
        );
        // A host that does not serve a model the verifier holds answers 404: not served.
        let not_here = rackwarden_inference::protocol::render_error(
            rackwarden_inference::protocol::ErrorStatus::NotFound,
        );
        assert_eq!(
            replay(&models, EPOCH, &req, &not_here),
            ReplayJudgement::NotGenerated
        );
        let bad = request_bytes(r#"{"model":"other","prompt":"x"}"#);
        let r = exchange(&rack, &bad);
        assert_eq!(
            replay(&models, EPOCH, &bad, &r),
            ReplayJudgement::NotGenerated
        );
    }
}

#[test]
fn bytes_appended_another_requests_response_and_a_seed_of_the_hosts_choice_fail() {
    let dir = bundled(Variant::Trained);
    let rack = start(&dir);
    let models = replay_models(&dir, DType::F64);
    let req = request_bytes(BODY);
    let resp = exchange(&rack, &req);

    let mut appended = resp.clone();
    appended.extend_from_slice(b"\x00weights");
    assert_eq!(
        finding(replay(&models, EPOCH, &req, &appended)),
        ReplayFinding::NotCanonical {
            offset: resp.len() as u64
        }
    );

    // An extra header is a byte the tokens do not determine.
    let with_header =
        String::from_utf8(resp.clone())
            .unwrap()
            .replacen("\r\n\r\n", "\r\nx-note: 1\r\n\r\n", 1);
    assert!(matches!(
        finding(replay(&models, EPOCH, &req, with_header.as_bytes())),
        ReplayFinding::NotCanonical { .. } | ReplayFinding::NotACompletion { .. }
    ));

    let other_req = request_bytes(&BODY.replace("The verifier", "The verifiez"));
    let other_resp = exchange(&rack, &other_req);
    assert!(matches!(
        finding(replay(&models, EPOCH, &req, &other_resp)),
        ReplayFinding::SeedNotDerived { .. }
    ));

    // A host that seeds with a key of its own, naming that seed, is caught at the seed; one
    // that names the derived seed but draws with its own is caught at the tokens.
    let model = LoadedModel::open(&dir, DType::F32).unwrap();
    let request: CompletionRequest = serde_json::from_str(BODY).unwrap();
    let prompt = model.tokenizer.encode(&request.prompt).unwrap();
    let own = Seed([0x99; 32]);
    let derived = rackwarden_inference::protocol::seed_of(&KEY, &req);
    let (ids, finish) = draw(&model, &request, &prompt, &own).unwrap();
    let named_own = completion_body(
        &model,
        &request,
        prompt.len(),
        EPOCH,
        &own,
        ids.clone(),
        finish,
    )
    .unwrap();
    assert!(matches!(
        finding(replay(&models, EPOCH, &req, &render_completion(&named_own))),
        ReplayFinding::SeedNotDerived { .. }
    ));
    let named_derived =
        completion_body(&model, &request, prompt.len(), EPOCH, &derived, ids, finish).unwrap();
    let j = replay(&models, EPOCH, &req, &render_completion(&named_derived));
    assert!(
        diverged(&j)
            || matches!(
                j,
                ReplayJudgement::Failed(ReplayFailure::Structural(
                    ReplayFinding::TokenShape { .. }
                ))
            ),
        "{j:?}"
    );
}

/// Serves `request` from `fake` while naming `honest`'s digest: what a host serving another
/// model would send.
fn served_by(
    fake: &LoadedModel,
    honest: &LoadedModel,
    req: &[u8],
    request: &CompletionRequest,
) -> Vec<u8> {
    let prompt = fake.tokenizer.encode(&request.prompt).unwrap();
    let seed = rackwarden_inference::protocol::seed_of(&KEY, req);
    let (ids, finish) = draw(fake, request, &prompt, &seed).unwrap();
    let mut body = completion_body(fake, request, prompt.len(), EPOCH, &seed, ids, finish).unwrap();
    body.model_sha3_256 = hex::encode(honest.digest);
    render_completion(&body)
}

#[test]
fn a_substituted_and_a_quantised_model_are_caught_by_the_tokens() {
    let dir = bundled(Variant::Trained);
    let honest = LoadedModel::open(&dir, DType::F32).unwrap();
    let models = replay_models(&dir, DType::F64);
    let tmp = tempfile::tempdir().unwrap();

    // Same architecture, every weight moved by 5%; and a 4-bit quantised copy.
    let perturbed = tmp.path().join("perturbed");
    substitute(&dir, &perturbed, attacks::perturbed(0.05)).unwrap();
    let quantised = tmp.path().join("q4");
    substitute(&dir, &quantised, attacks::quantised_4bit).unwrap();
    for fake_dir in [perturbed, quantised] {
        let fake = LoadedModel::open(&fake_dir, DType::F32).unwrap();
        let mut caught = 0;
        for i in 0..32 {
            let body = BODY.replace("The verifier", &format!("Request {i} of the"));
            let req = request_bytes(&body);
            let request: CompletionRequest = serde_json::from_str(&body).unwrap();
            let resp = served_by(&fake, &honest, &req, &request);
            match replay(&models, EPOCH, &req, &resp) {
                j if diverged(&j) => caught += 1,
                ReplayJudgement::Passed { .. } => {}
                other => panic!("{}: {other:?}", fake_dir.display()),
            }
        }
        // The bench measures d at about 0.75 and 0.9 on 200 exchanges: at d = 0.75, fewer
        // than 16 of 32 happens with probability about 1e-3.
        assert!(
            caught >= 16,
            "{}: {caught} of 32 exchanges caught",
            fake_dir.display()
        );
    }
}

/// A steganographic host hides one bit wherever another token is within its room of the
/// seeded winner. Within the tolerance it passes (the bits it hid are the covert channel the
/// tolerance leaves, measured in `cargo xtask bench replay`); with ten times the room it is
/// caught at a token that trails by more than the tolerance.
#[test]
fn a_steganographic_host_passes_within_the_tolerance_and_is_caught_beyond_it() {
    let dir = bundled(Variant::Trained);
    let host = LoadedModel::open(&dir, DType::F32).unwrap();
    let models = replay_models(&dir, DType::F64);
    let mut secret = std::iter::repeat([true, false, true, true]).flatten();
    let (mut hidden_within, mut caught_beyond, mut tokens) = (0, 0, 0);
    for i in 0..12 {
        let body = BODY.replace("The verifier", &format!("Exchange {i}: the verifier"));
        let req = request_bytes(&body);
        let request: CompletionRequest = serde_json::from_str(&body).unwrap();
        let prompt = host.tokenizer.encode(&request.prompt).unwrap();
        let seed = rackwarden_inference::protocol::seed_of(&KEY, &req);
        let serve = |room: f64, secret: &mut dyn Iterator<Item = bool>| {
            let (ids, hidden) =
                attacks::hide_bits(&host, &request, &prompt, &seed, room, secret).unwrap();
            let finish = if ids.len() < request.max_tokens as usize {
                rackwarden_inference::protocol::FinishReason::Stop
            } else {
                rackwarden_inference::protocol::FinishReason::Length
            };
            let body =
                completion_body(&host, &request, prompt.len(), EPOCH, &seed, ids, finish).unwrap();
            (render_completion(&body), hidden)
        };
        // Within: 90% of the tolerance, so the replay's drift cannot push a choice over it.
        let (resp, hidden) = serve(0.9 * TOLERANCE, &mut secret);
        match replay(&models, EPOCH, &req, &resp) {
            ReplayJudgement::Passed { tokens: n, .. } => tokens += n,
            other => panic!("exchange {i}, within the tolerance: {other:?}"),
        }
        hidden_within += hidden;
        let (resp, _) = serve(10.0 * TOLERANCE, &mut secret);
        if diverged(&replay(&models, EPOCH, &req, &resp)) {
            caught_beyond += 1;
        }
    }
    println!(
        "hidden within the tolerance: {hidden_within} bits in {tokens} tokens; caught beyond it: {caught_beyond} of 12"
    );
    assert!(hidden_within > 0, "the tolerance leaves some room");
    assert!(
        (hidden_within as f64) / (tokens as f64) < 0.1,
        "{hidden_within} bits in {tokens} tokens"
    );
    assert!(caught_beyond >= 9, "{caught_beyond} of 12 caught");
}
