//! The control socket: one JSON request line in, one JSON response line out, over a Unix
//! stream socket (mode 0660, default `/run/rackwarden/control.sock`). The server thread only
//! forwards requests to the agent loop, which owns the limiter: no locks around BPF state.

use std::{
    io::{BufRead, BufReader, Read, Write},
    os::unix::{fs::PermissionsExt, net::UnixListener, net::UnixStream},
    path::{Path, PathBuf},
    sync::mpsc,
    time::Duration,
};

use crate::status::StatusReport;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    Status,
    /// New rack caps, written like the config's `[cap]` values.
    CapSet {
        egress: Option<String>,
        ingress: Option<String>,
        /// Also rewrite the config file so the change survives a daemon restart.
        persist: bool,
        /// Apply a cap above the one in the config file (the agreed cap) all the same.
        #[serde(default)]
        force: bool,
    },
    /// Start an epoch (challenge, drain, wipe, stage, sign, deliver) now.
    WipeNow,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    Status(Box<StatusReport>),
    CapSet(CapSetOutcome),
    /// The epoch loop was asked; `state` is where it was when asked.
    WipeNow {
        state: Option<crate::epoch::EpochState>,
    },
    Error {
        message: String,
    },
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CapSetOutcome {
    pub egress_host_bytes_per_s: u64,
    pub ingress_host_bytes_per_s: u64,
    pub generation: u32,
    pub persisted: bool,
    /// Where it was persisted, or why not.
    pub persist_detail: String,
}

pub type Envelope = (Request, mpsc::Sender<Response>);

/// What wakes the agent loop: a request on this socket, or the tamper watch's report of a
/// `bpf()` call that may have changed our hooks (checked at once, not at the next poll).
pub enum Wake {
    Request(Envelope),
    Tamper(rackwarden_common::guard::TamperEvent),
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("control socket {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("control socket {path}: bad response: {detail}")]
    Protocol { path: PathBuf, detail: String },
}

/// Binds the socket and serves it on a thread, forwarding each request to `tx`.
pub fn serve(path: &Path, tx: mpsc::Sender<Wake>) -> Result<(), ControlError> {
    let e = |source| ControlError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(e)?;
    }
    // A socket left by a killed daemon would make bind fail; it is ours to replace.
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).map_err(e)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(e)?;
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                if let Err(err) = handle(conn, &tx) {
                    log::debug!("control connection: {err}");
                }
            }
        })
        .map_err(e)?;
    Ok(())
}

fn handle(conn: UnixStream, tx: &mpsc::Sender<Wake>) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    // Bounded: a request is a few hundred bytes; refuse anything absurd.
    reader.by_ref().take(64 * 1024).read_line(&mut line)?;
    let response = match serde_json::from_str::<Request>(&line) {
        Err(err) => Response::Error {
            message: format!("bad request: {err}"),
        },
        Ok(req) => {
            let (rtx, rrx) = mpsc::channel();
            if tx.send(Wake::Request((req, rtx))).is_err() {
                Response::Error {
                    message: "daemon is shutting down".into(),
                }
            } else {
                rrx.recv_timeout(Duration::from_secs(10))
                    .unwrap_or(Response::Error {
                        message: "daemon did not answer in 10 s".into(),
                    })
            }
        }
    };
    let mut out = serde_json::to_vec(&response).map_err(std::io::Error::other)?;
    out.push(b'\n');
    let mut conn = conn;
    conn.write_all(&out)
}

/// Client side: sends one request and returns the response.
pub fn call(path: &Path, req: &Request) -> Result<Response, ControlError> {
    let e = |source| ControlError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut s = UnixStream::connect(path).map_err(e)?;
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .map_err(e)?;
    let mut line = serde_json::to_vec(req).map_err(|err| e(std::io::Error::other(err)))?;
    line.push(b'\n');
    s.write_all(&line).map_err(e)?;
    let mut resp = String::new();
    BufReader::new(s).read_line(&mut resp).map_err(e)?;
    serde_json::from_str(&resp).map_err(|err| ControlError::Protocol {
        path: path.to_path_buf(),
        detail: err.to_string(),
    })
}
