//! The client's side of the protocol: a request as a client sends it, and one response read
//! off a connection exactly as it crossed (framed by its content-length). The demo, the tests
//! and the benchmarks ask the server with these.

use std::io::{self, Read, Write};

/// A completion request for `model` with `prompt`, as a client sends it.
pub fn completion_request(model: &str, prompt: &str, max_tokens: u32, temperature: f64) -> Vec<u8> {
    let body = serde_json::json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": temperature,
    })
    .to_string();
    request_with_body(&body)
}

/// `POST /v1/completions` carrying `body`.
pub fn request_with_body(body: &str) -> Vec<u8> {
    format!(
        "POST /v1/completions HTTP/1.1\r\nhost: rack\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Sends `request` on `stream` and reads one response, head and body (no body for `HEAD`),
/// exactly the bytes that crossed.
pub fn ask(stream: &mut (impl Read + Write), request: &[u8]) -> io::Result<Vec<u8>> {
    stream.write_all(request)?;
    let head_only = request.starts_with(b"HEAD ");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = out.windows(4).position(|w| w == b"\r\n\r\n") {
            if head_only {
                return Ok(out);
            }
            let head = String::from_utf8_lossy(&out[..end]).to_string();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| io::Error::other(format!("no content-length in {head:?}")))?;
            if out.len() >= end + 4 + len {
                return Ok(out);
            }
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("closed after {} bytes", out.len()),
            ));
        }
        out.extend_from_slice(&buf[..n]);
    }
}
