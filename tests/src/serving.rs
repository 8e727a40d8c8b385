//! The reference inference server on a test rack (issue 28): the bundled model served in the
//! rack's namespace, completions asked from outside, and the verifier's replay run over what
//! the tap committed. Shared by the taps suite and the demo.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::thread;

use rackwarden_inference::{
    bundled::{Variant, cached},
    files::LoadedModel,
    replay::ReplayModels,
    serve::{ServeConfig, serve_connection},
};

use crate::{Net, RACK_ADDR, in_netns};

/// The name requests give for the bundled model.
pub const MODEL_NAME: &str = "bundled";

/// The trained bundled model, made once per content under `target/models/`.
pub fn bundled_model() -> PathBuf {
    cached(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
        Variant::Trained,
    )
    .expect("the bundled model")
}

/// Serves `connections` connections on `RACK_ADDR:port` inside `ns`, seeded from `key_file`
/// (the daemon's `sampling-key.json`), then returns. Listening when this returns.
pub fn serve_in(
    ns: &str,
    model_dir: &Path,
    key_file: PathBuf,
    port: u16,
    connections: usize,
) -> thread::JoinHandle<()> {
    let (ns, dir) = (ns.to_string(), model_dir.to_path_buf());
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let h = thread::spawn(move || {
        rackwarden::netns::enter(&ns).expect("enter netns");
        let model = LoadedModel::open(&dir, candle_core::DType::F32).expect("load the model");
        let cfg = ServeConfig {
            model_name: MODEL_NAME.into(),
            key_file,
        };
        let l = TcpListener::bind((RACK_ADDR, port)).expect("bind the inference port");
        let _ = ready_tx.send(());
        for _ in 0..connections {
            let (s, _) = l.accept().expect("accept");
            serve_connection(s, &model, &cfg);
        }
    });
    let _ = ready.recv();
    h
}

/// A completion request for the bundled model, as a client sends it.
pub fn completion_request(prompt: &str, max_tokens: u32) -> Vec<u8> {
    rackwarden_inference::client::completion_request(MODEL_NAME, prompt, max_tokens, 0.8)
}

/// Sends `request` to the rack's `port` from outside and reads one response, framed by its
/// content-length: exactly the bytes that crossed.
pub fn ask(net: &Net, port: u16, request: Vec<u8>) -> Vec<u8> {
    in_netns(&net.out_ns, move || {
        let mut s = TcpStream::connect((RACK_ADDR, port)).expect("connect");
        rackwarden_inference::client::ask(&mut s, &request).expect("one response")
    })
}

/// Runs the verifier's replay service once over its database, with the bundled model.
pub fn replay_pending(db: &rackwarden_verifier::store::DatabaseUrl, model_dir: &Path) -> usize {
    let store = rackwarden_verifier::store::Store::connect(db).expect("the verifier's database");
    let models = ReplayModels {
        models: vec![(
            MODEL_NAME.into(),
            LoadedModel::open(model_dir, candle_core::DType::F64).expect("load the model"),
        )],
    };
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    };
    rackwarden_replay::run_once(&store, &models, 64, now, &mut Default::default())
        .expect("the replay")
}
