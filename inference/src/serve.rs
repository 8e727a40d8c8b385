//! The reference server: HTTP/1.1 on a TCP listener, one thread per connection, keep-alive.
//!
//! It is written on the socket rather than on a framework so that every byte it sends is one
//! [`protocol`](crate::protocol) renders: a framework adds headers (`date`, `server`) the
//! replay could not rebuild, and those would be a channel.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rackwarden_attest::sampling_key::SamplingKey;

use crate::files::LoadedModel;
use crate::generate::{admit, complete};
use crate::protocol::{
    ErrorStatus, HeadParse, Routed, body_refused, parse_head, render_completion, render_error,
    render_refusal, route, seed_of,
};

/// What the server serves and where it finds the epoch's sampling key.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The name requests give in `model`.
    pub model_name: String,
    /// `sampling-key.json`, which the daemon rewrites at each statement.
    pub key_file: PathBuf,
}

/// Reads the current sampling key; `None` when it cannot be read (the request is answered 503).
pub fn read_key(path: &Path) -> Option<SamplingKey> {
    let bytes = std::fs::read(path)
        .map_err(|e| log::warn!("sampling key {}: {e}", path.display()))
        .ok()?;
    serde_json::from_slice(&bytes)
        .map_err(|e| log::warn!("sampling key {}: {e}", path.display()))
        .ok()
}

/// The whole response to one complete request (`request` from its request line to the end
/// of its body).
pub fn respond(model: &LoadedModel, cfg: &ServeConfig, head_len: usize, request: &[u8]) -> Vec<u8> {
    let Some(head) = (match parse_head(request) {
        HeadParse::Complete(h) if h.head_len == head_len => Some(h),
        _ => None,
    }) else {
        return render_error(ErrorStatus::BadRequest);
    };
    match route(&head, &request[head_len..], &|m| m == cfg.model_name) {
        Routed::Error(s) => render_refusal(Some(&head), s),
        Routed::Completion(req) => {
            let prompt_ids = match admit(model, &req) {
                Ok(ids) => ids,
                Err(s) => return render_error(s),
            };
            let Some(key) = read_key(&cfg.key_file) else {
                return render_error(ErrorStatus::Unavailable);
            };
            let seed = seed_of(&key.key, request);
            match complete(model, &req, &prompt_ids, key.epoch_seq, &seed) {
                Ok(body) => render_completion(&body),
                Err(e) => {
                    // Admitted requests fit the model: this is the server's own failure,
                    // answered as "not served" (the fixed 503), which replays as such.
                    log::error!("an admitted request failed: {e}");
                    render_error(ErrorStatus::Unavailable)
                }
            }
        }
    }
}

/// Serves one connection until the client closes it or sends what cannot be framed.
pub fn serve_connection(mut stream: TcpStream, model: &LoadedModel, cfg: &ServeConfig) {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        // Empty lines (CRLF or LF) before a request line are skipped (RFC 9112 §2.2), as the
        // tap does; a lone CR is not an empty line and fails the parse, there as here.
        loop {
            if buf.starts_with(b"\r\n") {
                buf.drain(..2);
            } else if buf.starts_with(b"\n") {
                buf.drain(..1);
            } else {
                break;
            }
        }
        let (head_len, total) = match parse_head(&buf) {
            HeadParse::Complete(h) => {
                if let Some(s) = body_refused(&h) {
                    let _ = stream.write_all(&render_refusal(Some(&h), s));
                    return;
                }
                let len = h.content_length.unwrap_or(0) as usize;
                (h.head_len, h.head_len + len)
            }
            HeadParse::Partial => (0, usize::MAX),
            HeadParse::Refused(s) => {
                let _ = stream.write_all(&render_refusal(None, s));
                return;
            }
        };
        if buf.len() >= total {
            let response = respond(model, cfg, head_len, &buf[..total]);
            if stream.write_all(&response).is_err() {
                return;
            }
            buf.drain(..total);
            continue;
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Accepts connections on `listener` for ever, a thread each.
pub fn serve(
    listener: TcpListener,
    model: Arc<LoadedModel>,
    cfg: ServeConfig,
) -> std::io::Result<()> {
    let cfg = Arc::new(cfg);
    for stream in listener.incoming() {
        let stream = stream?;
        let (model, cfg) = (Arc::clone(&model), Arc::clone(&cfg));
        std::thread::spawn(move || serve_connection(stream, &model, &cfg));
    }
    Ok(())
}
