//! Splits the two byte streams of one HTTP/1.1 connection into request/response exchanges.
//!
//! The network tap reassembles each TCP connection to an inference endpoint into `input` (the
//! bytes that arrived at the host: the client's requests) and `output` (the bytes the host sent:
//! its responses). A record is committed per exchange, so the streams must be cut where each
//! message ends, and HTTP/1.1 says that only through each message's framing (RFC 9112 §6:
//! Content-Length, chunked, or no body). This module does that delimiting and nothing else. It is
//! pure and keeps no state: the caller keeps the bytes after `input_used`/`output_used` and calls
//! again when more arrive, and a cut anywhere yields the same exchanges as one call on the whole.
//!
//! What cannot be delimited is reported, never guessed: a response whose body runs until the
//! server closes the connection ([`Pending::UntilClose`]), a switch to another protocol
//! ([`Pending::Switched`]) and malformed framing ([`HttpSplitError`]).

// The streams come from the network: a length a peer declares must never overflow a position.
#![deny(clippy::arithmetic_side_effects)]

use std::fmt;
use std::ops::Range;

use httparse::{EMPTY_HEADER, Header, Status};

/// Header fields accepted in one head or trailer section. More is an error rather than a larger
/// buffer, so that a peer cannot make every call parse an unbounded head.
pub const MAX_HEADERS: usize = 64;

/// One complete exchange: byte ranges within the `input` and `output` slices given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    /// From the request line to the end of the body. Empty lines before the request line (which
    /// RFC 9112 §2.2 lets a server ignore) are consumed but left out of the range.
    pub request: Range<usize>,
    /// Any 1xx interim responses (100 Continue, 103 Early Hints), then the final response to the
    /// end of its body: the interim ones answer the same request.
    pub response: Range<usize>,
}

/// What [`split_exchanges`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The complete exchanges, in order.
    pub exchanges: Vec<Exchange>,
    /// Where the unconsumed input starts: the end of the last exchange's request (0 if none).
    pub input_used: usize,
    /// Where the unconsumed output starts: the end of the last exchange's response (0 if none).
    pub output_used: usize,
    /// Why the split stopped there.
    pub pending: Pending,
}

/// Why [`split_exchanges`] stopped at `input_used`/`output_used`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pending {
    /// Both slices were consumed entirely.
    Nothing,
    /// The next request, or the response to it, has not fully arrived: call again with more
    /// bytes. If the connection closes now, what is left is a partial exchange.
    Incomplete,
    /// The next request is complete (it ends at `request_end`) but its response has neither a
    /// Content-Length nor chunked framing, so its body ends only when the server closes the
    /// connection (RFC 9112 §6.3) and no split can delimit it. Once the connection is closed,
    /// `input[input_used..request_end]` and `output[output_used..]` are that exchange, complete.
    UntilClose {
        /// End of the request that this response answers.
        request_end: usize,
    },
    /// The last exchange switched the connection to another protocol (101 Switching Protocols,
    /// or a 2xx answer to CONNECT): the bytes after it are not HTTP/1.1, so do not call again.
    Switched,
    /// The bytes at `input_used`/`output_used` are malformed. This stands in for `Err` when
    /// complete exchanges precede those bytes, so that they are not lost; a call on the remaining
    /// bytes returns the same error as `Err`, with offsets relative to those bytes.
    Malformed(HttpSplitError),
}

/// Which stream a malformed message is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// `input`: the client's requests.
    Request,
    /// `output`: the host's responses.
    Response,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Request => "request",
            Self::Response => "response",
        })
    }
}

/// A message whose framing cannot be read: nothing after it in that stream can be split.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{side} at byte {at}: {problem}")]
pub struct HttpSplitError {
    /// The stream: `input` for a request, `output` for a response.
    pub side: Side,
    /// Where the message starts within the slice of that stream given to the call.
    pub at: usize,
    /// What is wrong with it.
    pub problem: Problem,
}

/// What is wrong with a malformed message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("invalid request line ({0})")]
    RequestLine(httparse::Error),
    #[error("invalid status line ({0})")]
    StatusLine(httparse::Error),
    #[error("invalid status code {0}")]
    StatusCode(u16),
    #[error("invalid header field ({0})")]
    Header(httparse::Error),
    #[error("more than {} header fields", MAX_HEADERS)]
    TooManyHeaders,
    #[error("Content-Length is not a number")]
    ContentLengthNotNumber,
    #[error("Content-Length is too large")]
    ContentLengthTooLarge,
    /// Repeated Content-Length values that differ (RFC 9110 §8.6): the length is unknowable.
    #[error("conflicting Content-Length values")]
    ConflictingContentLength,
    /// RFC 9112 §6.1 lets Transfer-Encoding win, but warns that this is how requests are
    /// smuggled: a tap that guessed could split differently from the server.
    #[error("both Content-Length and Transfer-Encoding")]
    LengthAndTransferEncoding,
    /// A request whose last coding is not chunked cannot be delimited (RFC 9112 §6.3), nor can
    /// any message with chunked applied twice.
    #[error("unsupported Transfer-Encoding {0}")]
    UnsupportedTransferEncoding(String),
    /// RFC 9112 §6.1: HTTP/1.0 has no Transfer-Encoding, so its framing is faulty.
    #[error("Transfer-Encoding in an HTTP/1.0 message")]
    TransferEncodingInHttp10,
    #[error("invalid chunk size line at byte {at}")]
    ChunkSize { at: usize },
    #[error("chunk size at byte {at} is too large")]
    ChunkTooLarge { at: usize },
    #[error("chunk data not followed by CRLF at byte {at}")]
    ChunkEnd { at: usize },
    #[error("invalid trailer section at byte {at} ({cause})")]
    Trailers { at: usize, cause: httparse::Error },
    #[error("response without a request")]
    NoRequest,
}

/// Splits one connection's `input` (requests) and `output` (responses) into complete exchanges.
///
/// Requests and responses pair in order (pipelining); an exchange is complete only when its
/// request and its whole final response are both in the slices. A request or response that has
/// not fully arrived stops the split without error ([`Pending::Incomplete`]).
///
/// Each call parses from the start of the slices, so a caller that calls on every segment of a
/// long chunked (streaming) response re-reads its chunk lines each time: cheap next to the
/// bytes, but quadratic in the number of calls per exchange.
///
/// # Errors
///
/// [`HttpSplitError`] when the first unconsumed message is malformed, or when there are response
/// bytes and no request at all for them. When complete exchanges come before such bytes they are
/// returned instead, with the error in [`Split::pending`] ([`Pending::Malformed`]).
pub fn split_exchanges(input: &[u8], output: &[u8]) -> Result<Split, HttpSplitError> {
    let mut exchanges: Vec<Exchange> = Vec::new();
    let (mut input_used, mut output_used) = (0, 0);
    let pending = loop {
        match next_exchange(input, output, input_used, output_used) {
            Ok(Next::Exchange(exchange)) => {
                // Each request holds at least its request line, so the loop always advances.
                input_used = exchange.request.end;
                output_used = exchange.response.end;
                exchanges.push(exchange);
            }
            Ok(Next::Switched(exchange)) => {
                input_used = exchange.request.end;
                output_used = exchange.response.end;
                exchanges.push(exchange);
                break Pending::Switched;
            }
            Ok(Next::Stop(pending)) => break pending,
            Err(error) if exchanges.is_empty() => return Err(error),
            Err(error) => break Pending::Malformed(error),
        }
    };
    Ok(Split {
        exchanges,
        input_used,
        output_used,
        pending,
    })
}

enum Next {
    Exchange(Exchange),
    /// The last exchange of the connection's HTTP life.
    Switched(Exchange),
    Stop(Pending),
}

/// The exchange whose request starts at `input[i..]` and whose response starts at `output[o..]`.
fn next_exchange(input: &[u8], output: &[u8], i: usize, o: usize) -> Result<Next, HttpSplitError> {
    if input.get(i..).is_none_or(<[u8]>::is_empty) {
        // A server answers only what it has received, so an answer without even the start of a
        // request means the streams do not belong together.
        if output.get(o..).is_some_and(|rest| !rest.is_empty()) {
            return Err(HttpSplitError {
                side: Side::Response,
                at: o,
                problem: Problem::NoRequest,
            });
        }
        return Ok(Next::Stop(Pending::Nothing));
    }
    // A response that came before its request is whole (an early 413, or a 100 Continue before
    // the body) waits with it: the exchange is complete only once both are.
    let Some(request) = parse_request(input, i)? else {
        return Ok(Next::Stop(Pending::Incomplete));
    };
    Ok(match parse_response(output, o, &request)? {
        Response::Complete(response) => Next::Exchange(Exchange {
            request: request.range,
            response,
        }),
        Response::Switched(response) => Next::Switched(Exchange {
            request: request.range,
            response,
        }),
        Response::Incomplete => Next::Stop(Pending::Incomplete),
        Response::UntilClose => Next::Stop(Pending::UntilClose {
            request_end: request.range.end,
        }),
    })
}

/// A complete request, and what about it decides how its response is framed.
struct Request {
    range: Range<usize>,
    /// A response to HEAD has no body, whatever its headers say (RFC 9112 §6.3).
    head: bool,
    /// A 2xx response to CONNECT turns the connection into a tunnel.
    connect: bool,
}

/// The request starting at `input[start..]`, or `None` if it has not fully arrived.
fn parse_request(input: &[u8], start: usize) -> Result<Option<Request>, HttpSplitError> {
    let buf = input.get(start..).unwrap_or_default();
    let at = start.saturating_add(empty_lines(buf));
    let fail = |problem| HttpSplitError {
        side: Side::Request,
        at,
        problem,
    };
    let mut headers = [EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let head_len = match request.parse(buf) {
        Ok(Status::Complete(len)) => len,
        Ok(Status::Partial) => return Ok(None),
        Err(error) => return Err(fail(head_problem(error, Problem::RequestLine))),
    };
    // Within the slice: head_len <= buf.len(), so this does not saturate.
    let head_end = start.saturating_add(head_len);
    let version = request.version.unwrap_or(1);
    let end = match framing(request.headers, version, Side::Request).map_err(fail)? {
        Framing::Length(len) => length_end(input, head_end, len).map_err(fail)?,
        Framing::Chunked => chunked_end(input, head_end).map_err(fail)?,
        // RFC 9112 §6.3: a request with neither header has no body.
        Framing::Unframed => Some(head_end),
    };
    let method = request.method.unwrap_or_default();
    Ok(end.map(|end| Request {
        range: at..end,
        head: method == "HEAD",
        connect: method == "CONNECT",
    }))
}

enum Response {
    Complete(Range<usize>),
    Switched(Range<usize>),
    Incomplete,
    UntilClose,
}

/// The response to `request` starting at `output[start..]`, 1xx interim responses included.
fn parse_response(
    output: &[u8],
    start: usize,
    request: &Request,
) -> Result<Response, HttpSplitError> {
    let mut pos = start;
    let mut first: Option<usize> = None;
    loop {
        let buf = output.get(pos..).unwrap_or_default();
        let at = pos.saturating_add(empty_lines(buf));
        let fail = |problem| HttpSplitError {
            side: Side::Response,
            at,
            problem,
        };
        let mut headers = [EMPTY_HEADER; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut headers);
        let head_len = match response.parse(buf) {
            Ok(Status::Complete(len)) => len,
            Ok(Status::Partial) => return Ok(Response::Incomplete),
            Err(error) => return Err(fail(head_problem(error, Problem::StatusLine))),
        };
        let head_end = pos.saturating_add(head_len);
        let begin = *first.get_or_insert(at);
        let code = response.code.unwrap_or_default();
        // RFC 9112 §6.3 rules 1 and 2: these responses have no body whatever their headers say.
        match code {
            0..=99 => return Err(fail(Problem::StatusCode(code))),
            101 => return Ok(Response::Switched(begin..head_end)),
            // Interim: the final response to the same request follows (RFC 9110 §15.2).
            100..=199 => {
                pos = head_end;
                continue;
            }
            200..=299 if request.connect => return Ok(Response::Switched(begin..head_end)),
            204 | 304 => return Ok(Response::Complete(begin..head_end)),
            _ if request.head => return Ok(Response::Complete(begin..head_end)),
            _ => {}
        }
        let version = response.version.unwrap_or(1);
        let end = match framing(response.headers, version, Side::Response).map_err(fail)? {
            Framing::Length(len) => length_end(output, head_end, len).map_err(fail)?,
            Framing::Chunked => chunked_end(output, head_end).map_err(fail)?,
            Framing::Unframed => return Ok(Response::UntilClose),
        };
        return Ok(end.map_or(Response::Incomplete, |end| Response::Complete(begin..end)));
    }
}

/// The count of the CR and LF bytes that start `buf`: the empty lines httparse skips before a
/// start line, so that ranges and error offsets point at the start line itself.
fn empty_lines(buf: &[u8]) -> usize {
    buf.iter()
        .take_while(|&&byte| byte == b'\r' || byte == b'\n')
        .count()
}

/// Tells a bad start line from bad header fields, which httparse reports alike.
fn head_problem(error: httparse::Error, start_line: fn(httparse::Error) -> Problem) -> Problem {
    match error {
        httparse::Error::HeaderName | httparse::Error::HeaderValue => Problem::Header(error),
        httparse::Error::TooManyHeaders => Problem::TooManyHeaders,
        _ => start_line(error),
    }
}

/// How a message's body is delimited, from its header fields alone.
enum Framing {
    Length(usize),
    Chunked,
    /// Neither header (or, in a response, codings that do not end in chunked): no body for a
    /// request, a body until close for a response.
    Unframed,
}

/// RFC 9112 §6.1–6.3, for a message that may have a body.
fn framing(headers: &[Header<'_>], version: u8, side: Side) -> Result<Framing, Problem> {
    let mut length: Option<usize> = None;
    let mut transfer_encoding = false;
    let mut codings = false;
    let mut chunked: usize = 0;
    let mut last_chunked = false;
    for header in headers {
        if header.name.eq_ignore_ascii_case("content-length") {
            // "Content-Length: 42, 42" and repeated fields are one length if they agree.
            for element in header.value.split(|&byte| byte == b',') {
                let value = decimal(trim_ows(element))?;
                match length {
                    Some(known) if known != value => return Err(Problem::ConflictingContentLength),
                    _ => length = Some(value),
                }
            }
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            transfer_encoding = true;
            for element in header.value.split(|&byte| byte == b',') {
                let element = trim_ows(element);
                if element.is_empty() {
                    continue; // RFC 9110 §5.6.1: empty list elements do not count.
                }
                let name = trim_ows(
                    element
                        .split(|&byte| byte == b';')
                        .next()
                        .unwrap_or_default(),
                );
                codings = true;
                last_chunked = name.eq_ignore_ascii_case(b"chunked");
                if last_chunked {
                    chunked = chunked.saturating_add(1);
                }
            }
        }
    }
    if !transfer_encoding {
        return Ok(length.map_or(Framing::Unframed, Framing::Length));
    }
    if length.is_some() {
        return Err(Problem::LengthAndTransferEncoding);
    }
    if version == 0 {
        return Err(Problem::TransferEncodingInHttp10);
    }
    if last_chunked && chunked == 1 {
        return Ok(Framing::Chunked);
    }
    // A response whose codings do not end in chunked runs until close (RFC 9112 §6.3 rule 4).
    if side == Side::Response && codings && !last_chunked && chunked <= 1 {
        return Ok(Framing::Unframed);
    }
    Err(Problem::UnsupportedTransferEncoding(codings_text(headers)))
}

/// The Transfer-Encoding values, for an error message: lossy and cut short, as a peer wrote them.
fn codings_text(headers: &[Header<'_>]) -> String {
    let values: Vec<String> = headers
        .iter()
        .filter(|header| header.name.eq_ignore_ascii_case("transfer-encoding"))
        .map(|header| String::from_utf8_lossy(header.value).into_owned())
        .collect();
    values.join(", ").chars().take(64).collect()
}

/// 1*DIGIT, as Content-Length allows: no sign, no spaces inside, no empty value.
fn decimal(digits: &[u8]) -> Result<usize, Problem> {
    if digits.is_empty() {
        return Err(Problem::ContentLengthNotNumber);
    }
    digits.iter().try_fold(0usize, |value, &byte| {
        let digit = char::from(byte)
            .to_digit(10)
            .ok_or(Problem::ContentLengthNotNumber)?;
        value
            .checked_mul(10)
            .and_then(|value| value.checked_add(digit as usize))
            .ok_or(Problem::ContentLengthTooLarge)
    })
}

/// Optional whitespace (space and tab) trimmed from both ends.
fn trim_ows(mut bytes: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = bytes {
        bytes = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = bytes {
        bytes = rest;
    }
    bytes
}

/// The end of a body of `len` bytes after `head_end`, or `None` if it has not fully arrived.
fn length_end(buf: &[u8], head_end: usize, len: usize) -> Result<Option<usize>, Problem> {
    let end = head_end
        .checked_add(len)
        .ok_or(Problem::ContentLengthTooLarge)?;
    Ok((end <= buf.len()).then_some(end))
}

/// The end of a chunked body starting at `pos` (RFC 9112 §7.1): chunks, the last chunk, the
/// trailer section and its empty line. `None` if it has not fully arrived.
fn chunked_end(buf: &[u8], mut pos: usize) -> Result<Option<usize>, Problem> {
    loop {
        let Some((data_start, size)) = chunk_size_line(buf, pos)? else {
            return Ok(None);
        };
        if size == 0 {
            return trailers_end(buf, data_start);
        }
        let data_end = data_start
            .checked_add(size)
            .ok_or(Problem::ChunkTooLarge { at: pos })?;
        let Some(after) = buf.get(data_end..) else {
            return Ok(None);
        };
        // Strict CRLF after the data: a lenient end is where parsers disagree (smuggling).
        match after {
            [b'\r', b'\n', ..] => pos = data_end.saturating_add(2),
            [] | [b'\r'] => return Ok(None),
            _ => return Err(Problem::ChunkEnd { at: data_end }),
        }
    }
}

/// Where a chunk size line is in its parse.
#[derive(Clone, Copy)]
enum Line {
    Size,
    /// Whitespace after the size, before `;` or the line end (BWS).
    Space,
    Extension,
    Cr,
}

/// The chunk size line at `buf[start..]`: where the chunk data starts, and its size; `None` if
/// the line has not fully arrived. Parsed here rather than by `httparse::parse_chunk_size`,
/// which caps the size at 16 hex digits (leading zeros included) and accepts any byte, a bare LF
/// included, in extensions: this reads any number of digits with checked arithmetic, and takes
/// only visible characters, spaces and tabs in extensions, whose meaning it ignores.
fn chunk_size_line(buf: &[u8], start: usize) -> Result<Option<(usize, usize)>, Problem> {
    let invalid = Problem::ChunkSize { at: start };
    let mut size: usize = 0;
    let mut digits = false;
    let mut line = Line::Size;
    for (index, &byte) in buf.get(start..).unwrap_or_default().iter().enumerate() {
        line = match (line, byte) {
            (Line::Size, _) if byte.is_ascii_hexdigit() => {
                let digit = char::from(byte).to_digit(16).unwrap_or_default();
                size = size
                    .checked_mul(16)
                    .and_then(|size| size.checked_add(digit as usize))
                    .ok_or(Problem::ChunkTooLarge { at: start })?;
                digits = true;
                Line::Size
            }
            (Line::Size, _) if !digits => return Err(invalid),
            (Line::Size | Line::Space, b' ' | b'\t') => Line::Space,
            (Line::Size | Line::Space, b';') => Line::Extension,
            (Line::Size | Line::Space | Line::Extension, b'\r') => Line::Cr,
            (Line::Extension, b'\t' | b' '..=b'~' | 0x80..=0xff) => Line::Extension,
            (Line::Cr, b'\n') => {
                let data_start = start.saturating_add(index).saturating_add(1);
                return Ok(Some((data_start, size)));
            }
            _ => return Err(invalid),
        };
    }
    Ok(None)
}

/// The end of the trailer section at `buf[pos..]` (after the last chunk), or `None`.
fn trailers_end(buf: &[u8], pos: usize) -> Result<Option<usize>, Problem> {
    let mut fields = [EMPTY_HEADER; MAX_HEADERS];
    match httparse::parse_headers(buf.get(pos..).unwrap_or_default(), &mut fields) {
        Ok(Status::Complete((len, _))) => Ok(Some(pos.saturating_add(len))),
        Ok(Status::Partial) => Ok(None),
        Err(cause) => Err(Problem::Trailers { at: pos, cause }),
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn exchange(request: Range<usize>, response: Range<usize>) -> Exchange {
        Exchange { request, response }
    }

    fn split(input: &[u8], output: &[u8]) -> Split {
        split_exchanges(input, output).expect("valid streams")
    }

    fn error(input: &[u8], output: &[u8]) -> HttpSplitError {
        split_exchanges(input, output).expect_err("malformed streams")
    }

    #[test]
    fn single_exchange_with_content_length() {
        let input = b"POST /v1/embed HTTP/1.1\r\nHost: gpu\r\nContent-Length: 5\r\n\r\nhello";
        let output = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        let s = split(input, output);
        assert_eq!(s.exchanges, [exchange(0..input.len(), 0..output.len())]);
        assert_eq!((s.input_used, s.output_used), (input.len(), output.len()));
        assert_eq!(s.pending, Pending::Nothing);
    }

    #[test]
    fn chunked_request_and_response_with_extensions_and_trailers() {
        let input = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gpu\r\n\
            Transfer-Encoding: gzip, chunked\r\n\r\n\
            5;name=value\r\nhello\r\nA ; a=\"b c\";d\r\n0123456789\r\n\
            0;last\r\nX-Checksum: abc\r\n\r\n";
        let output = b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n\
            16\r\ndata: {\"choices\":[]}\n\n\r\n\
            000\r\nServer-Timing: total;dur=12\r\nX-Other: 1\r\n\r\n";
        let s = split(input, output);
        assert_eq!(s.exchanges, [exchange(0..input.len(), 0..output.len())]);
        assert_eq!(s.pending, Pending::Nothing);
        // Without the trailer section's empty line the body has not ended.
        let cut = split(input, &output[..output.len() - 2]);
        assert_eq!((cut.exchanges.len(), cut.pending), (0, Pending::Incomplete));
    }

    #[test]
    fn pipelined_three_exchanges() {
        let requests = [
            &b"GET /health HTTP/1.1\r\nHost: gpu\r\n\r\n"[..],
            b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
            b"GET /v1/models HTTP/1.1\r\n\r\n",
        ];
        let responses = [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"[..],
            b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nbad\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"data\":[]}",
        ];
        let (input, output) = (requests.concat(), responses.concat());
        let s = split(&input, &output);
        let (mut i, mut o) = (0, 0);
        let expected: Vec<Exchange> = (0..3)
            .map(|k| {
                let e = exchange(i..i + requests[k].len(), o..o + responses[k].len());
                (i, o) = (e.request.end, e.response.end);
                e
            })
            .collect();
        assert_eq!(s.exchanges, expected);
        assert_eq!((s.input_used, s.output_used), (input.len(), output.len()));
        // Only two responses so far: the third request waits for its own.
        let two = responses[..2].concat();
        let s = split(&input, &two);
        assert_eq!(s.exchanges, expected[..2]);
        assert_eq!(
            (s.input_used, s.output_used),
            (expected[1].request.end, two.len())
        );
        assert_eq!(s.pending, Pending::Incomplete);
    }

    #[test]
    fn response_to_head_has_no_body() {
        let input = b"HEAD /v1/models HTTP/1.1\r\n\r\nGET /v1/models HTTP/1.1\r\n\r\n";
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\nTransfer-Encoding: chunked\r\n\r\n";
        let get = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]";
        let output = [&head[..], get].concat();
        let s = split(input, &output);
        assert_eq!(
            s.exchanges,
            [
                exchange(0..28, 0..head.len()),
                exchange(28..input.len(), head.len()..output.len())
            ]
        );
    }

    #[test]
    fn no_content_204_and_not_modified_304() {
        let input = b"DELETE /v1/files/1 HTTP/1.1\r\n\r\nGET /x HTTP/1.1\r\n\r\n";
        let output = b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 304 Not Modified\r\nContent-Length: 99\r\n\r\n";
        let s = split(input, output);
        assert_eq!(
            s.exchanges,
            [
                exchange(0..31, 0..27),
                exchange(31..input.len(), 27..output.len())
            ]
        );
        assert_eq!(s.pending, Pending::Nothing);
    }

    #[test]
    fn continue_100_belongs_to_the_final_response() {
        let head = b"POST /v1/audio HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n";
        let interim =
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n";
        let last = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        // The server said Continue before the body arrived: nothing is complete yet.
        let s = split(head, interim);
        assert_eq!((s.exchanges.len(), s.input_used, s.output_used), (0, 0, 0));
        assert_eq!(s.pending, Pending::Incomplete);
        let input = [&head[..], b"wav!"].concat();
        let s = split(&input, interim);
        assert_eq!((s.exchanges.len(), s.pending), (0, Pending::Incomplete));
        let output = [&interim[..], last].concat();
        let s = split(&input, &output);
        assert_eq!(s.exchanges, [exchange(0..input.len(), 0..output.len())]);
    }

    #[test]
    fn incomplete_request_head() {
        let s = split(b"POST /v1/completions HTTP/1.1\r\nContent-Le", b"");
        assert_eq!((s.exchanges.len(), s.input_used, s.output_used), (0, 0, 0));
        assert_eq!(s.pending, Pending::Incomplete);
    }

    #[test]
    fn incomplete_body_stops_at_the_previous_exchange() {
        let first = b"GET /a HTTP/1.1\r\n\r\n";
        let input = [
            &first[..],
            b"POST /b HTTP/1.1\r\nContent-Length: 10\r\n\r\n12345",
        ]
        .concat();
        let response = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx";
        // An early answer to the second request does not complete it either.
        let output = [
            &response[..],
            b"HTTP/1.1 413 Too Large\r\nContent-Length: 0\r\n\r\n",
        ]
        .concat();
        let s = split(&input, &output);
        assert_eq!(s.exchanges, [exchange(0..first.len(), 0..response.len())]);
        assert_eq!((s.input_used, s.output_used), (first.len(), response.len()));
        assert_eq!(s.pending, Pending::Incomplete);
    }

    #[test]
    fn malformed_status_line_reports_its_offset() {
        let input = b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n";
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        let output = [&ok[..], b"HTTP/1.1 2x0 OK\r\n\r\n"].concat();
        let s = split(input, &output);
        assert_eq!(s.exchanges.len(), 1);
        let Pending::Malformed(e) = s.pending else {
            panic!("expected a malformed response, got {:?}", s.pending)
        };
        assert_eq!((e.side, e.at), (Side::Response, ok.len()));
        assert_eq!(
            e.to_string(),
            "response at byte 38: invalid status line (invalid response status)"
        );
        // The next call, on what is left, reports the same with its own offsets.
        let e = error(&input[s.input_used..], &output[s.output_used..]);
        assert_eq!(
            (e.side, e.at, e.problem),
            (
                Side::Response,
                0,
                Problem::StatusLine(httparse::Error::Status)
            )
        );
        let e = error(b"GET / HTTP/1.1\r\n\r\n", b"HTTP/1.1 042 Odd\r\n\r\n");
        assert_eq!(e.problem, Problem::StatusCode(42));
    }

    #[test]
    fn bad_chunk_size_is_an_error() {
        let head = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        for (chunks, problem) in [
            (&b"zz\r\n"[..], Problem::ChunkSize { at: head.len() }),
            (b"\r\n", Problem::ChunkSize { at: head.len() }),
            (b"5\nhello", Problem::ChunkSize { at: head.len() }),
            (b"5;a\nb\r\nhello", Problem::ChunkSize { at: head.len() }),
            (
                b"ffffffffffffffffff\r\n",
                Problem::ChunkTooLarge { at: head.len() },
            ),
            (
                b"ffffffffffffffff\r\n",
                Problem::ChunkTooLarge { at: head.len() },
            ),
            (b"2\r\nhello\r\n", Problem::ChunkEnd { at: head.len() + 5 }),
        ] {
            let e = error(&[&head[..], chunks].concat(), b"");
            assert_eq!(
                (e.side, e.at, e.problem),
                (Side::Request, 0, problem),
                "{chunks:?}"
            );
        }
        // Leading zeros are not a size limit.
        let input = [&head[..], b"00000000000000000000001\r\nx\r\n0\r\n\r\n"].concat();
        assert_eq!(split(&input, b"").pending, Pending::Incomplete);
    }

    #[test]
    fn response_without_request() {
        let e = error(b"", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
        assert_eq!(
            (e.side, e.at, e.problem.clone()),
            (Side::Response, 0, Problem::NoRequest)
        );
        assert_eq!(
            e.to_string(),
            "response at byte 0: response without a request"
        );
        let input = b"GET / HTTP/1.1\r\n\r\n";
        let one = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        let s = split(input, &[&one[..], one].concat());
        assert_eq!(s.exchanges.len(), 1);
        assert_eq!(
            s.pending,
            Pending::Malformed(HttpSplitError {
                side: Side::Response,
                at: one.len(),
                problem: Problem::NoRequest
            })
        );
    }

    #[test]
    fn openai_completions_json() {
        let request_body = br#"{"model":"llama-3-8b-instruct","prompt":"Say hello","max_tokens":16,"temperature":0}"#;
        let response_body = br#"{"id":"cmpl-7f3a","object":"text_completion","created":1717000000,"model":"llama-3-8b-instruct","choices":[{"index":0,"text":" Hello!","logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}"#;
        let request_head = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: gpu-node-7:8000\r\nUser-Agent: OpenAI/Python 1.30.1\r\n\
             Authorization: Bearer sk-test\r\nContent-Type: application/json\r\nAccept: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            request_body.len()
        );
        let response_head = format!(
            "HTTP/1.1 200 OK\r\ndate: Wed, 29 May 2024 16:26:40 GMT\r\nserver: uvicorn\r\n\
             content-length: {}\r\ncontent-type: application/json\r\n\r\n",
            response_body.len()
        );
        let input = [request_head.as_bytes(), request_body].concat();
        let output = [response_head.as_bytes(), response_body].concat();
        let s = split(&input, &output);
        assert_eq!(s.exchanges, [exchange(0..input.len(), 0..output.len())]);
        let e = &s.exchanges[0];
        assert_eq!(
            &input[e.request.start + request_head.len()..e.request.end],
            request_body
        );
        assert_eq!(
            &output[e.response.start + response_head.len()..e.response.end],
            response_body
        );
    }

    #[test]
    fn response_until_close_is_pending() {
        let input = b"GET /a HTTP/1.1\r\n\r\nGET /stream HTTP/1.1\r\n\r\n";
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        let output = [
            &ok[..],
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: 1\n\n",
        ]
        .concat();
        let s = split(input, &output);
        assert_eq!(s.exchanges.len(), 1);
        assert_eq!((s.input_used, s.output_used), (19, ok.len()));
        assert_eq!(
            s.pending,
            Pending::UntilClose {
                request_end: input.len()
            }
        );
        // Codings that do not end in chunked also run until close, in a response only.
        let gzip = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n\x1f\x8b";
        assert_eq!(
            split(b"GET / HTTP/1.1\r\n\r\n", gzip).pending,
            Pending::UntilClose { request_end: 18 }
        );
    }

    #[test]
    fn switching_protocols_ends_the_split() {
        let input = b"GET /v1/realtime HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\x81\x05hello";
        let output = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x02hi";
        let s = split(input, output);
        assert_eq!(
            s.exchanges,
            [exchange(0..input.len() - 7, 0..output.len() - 4)]
        );
        assert_eq!(s.pending, Pending::Switched);
        let s = split(
            b"CONNECT gpu:443 HTTP/1.1\r\n\r\n\x16\x03",
            b"HTTP/1.1 200 OK\r\n\r\n\x16\x03",
        );
        assert_eq!((s.exchanges.len(), s.pending), (1, Pending::Switched));
    }

    #[test]
    fn bad_framing_headers_are_errors() {
        let problem = |head: &str| error(head.as_bytes(), b"").problem;
        assert_eq!(
            problem("POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Problem::LengthAndTransferEncoding
        );
        assert_eq!(
            problem("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n").to_string(),
            "unsupported Transfer-Encoding gzip"
        );
        assert_eq!(
            problem(
                "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"
            ),
            Problem::UnsupportedTransferEncoding("chunked, chunked".into())
        );
        assert_eq!(
            problem("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Problem::TransferEncodingInHttp10
        );
        for value in ["five", "-1", "+5", "", "5 5", "0x10"] {
            assert_eq!(
                problem(&format!(
                    "POST / HTTP/1.1\r\nContent-Length: {value}\r\n\r\n"
                )),
                Problem::ContentLengthNotNumber,
                "{value}"
            );
        }
        assert_eq!(
            problem("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n"),
            Problem::ContentLengthTooLarge
        );
        assert_eq!(
            problem("POST / HTTP/1.1\r\nContent-Length: 3, 4\r\n\r\n"),
            Problem::ConflictingContentLength
        );
        assert_eq!(
            error(
                b"POST / HTTP/1.1\r\nContent-Length: 18446744073709551615\r\n\r\n",
                b""
            )
            .problem,
            Problem::ContentLengthTooLarge
        );
        // Agreeing repeats are one length.
        let s = split(
            b"POST / HTTP/1.1\r\nContent-Length: 1, 1\r\nContent-Length: 1\r\n\r\nx",
            b"",
        );
        assert_eq!((s.exchanges.len(), s.pending), (0, Pending::Incomplete));
        let many: String = (0..65).map(|n| format!("X-{n}: v\r\n")).collect();
        let e = error(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes(), b"");
        assert_eq!(
            e.to_string(),
            "request at byte 0: more than 64 header fields"
        );
        let e = error(b"\r\nGET / HTTP/9.9\r\n\r\n", b"");
        assert_eq!(
            (e.at, e.problem),
            (2, Problem::RequestLine(httparse::Error::Version))
        );
    }

    // ---- properties ----

    #[derive(Debug, Clone)]
    struct Chunking {
        sizes: Vec<usize>,
        upper: bool,
        extensions: bool,
        trailers: bool,
    }

    #[derive(Debug, Clone)]
    struct Spec {
        method: &'static str,
        stray_crlf: bool,
        request_body: Vec<u8>,
        request_chunked: Option<Chunking>,
        expect_continue: bool,
        early_hints: bool,
        status: u16,
        response_body: Vec<u8>,
        response_chunked: Option<Chunking>,
    }

    fn chunking() -> impl Strategy<Value = Chunking> {
        (
            prop::collection::vec(1usize..20, 1..4),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(sizes, upper, extensions, trailers)| Chunking {
                sizes,
                upper,
                extensions,
                trailers,
            })
    }

    fn spec() -> impl Strategy<Value = Spec> {
        (
            prop::sample::select(vec!["GET", "POST", "HEAD", "PUT", "DELETE"]),
            any::<bool>(),
            prop::collection::vec(any::<u8>(), 0..40),
            prop::option::of(chunking()),
            any::<bool>(),
            any::<bool>(),
            prop::sample::select(vec![200u16, 201, 204, 304, 404, 500]),
            prop::collection::vec(any::<u8>(), 0..60),
            prop::option::of(chunking()),
        )
            .prop_map(
                |(
                    method,
                    stray_crlf,
                    request_body,
                    request_chunked,
                    expect_continue,
                    early_hints,
                    status,
                    response_body,
                    response_chunked,
                )| Spec {
                    method,
                    stray_crlf,
                    request_body,
                    request_chunked,
                    expect_continue,
                    early_hints,
                    status,
                    response_body,
                    response_chunked,
                },
            )
    }

    fn chunked(body: &[u8], chunking: &Chunking) -> Vec<u8> {
        let mut out = Vec::new();
        let mut sizes = chunking.sizes.iter().cycle();
        let mut rest = body;
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at((*sizes.next().unwrap()).min(rest.len()));
            let size = if chunking.upper {
                format!("{:X}", chunk.len())
            } else {
                format!("{:x}", chunk.len())
            };
            out.extend(size.as_bytes());
            if chunking.extensions {
                out.extend(b" ;name=value;q=\"a b\"");
            }
            out.extend(b"\r\n");
            out.extend(chunk);
            out.extend(b"\r\n");
            rest = tail;
        }
        out.extend(if chunking.extensions {
            &b"0;last\r\n"[..]
        } else {
            b"0\r\n"
        });
        if chunking.trailers {
            out.extend(b"X-Checksum: abc\r\nX-Other: 1\r\n");
        }
        out.extend(b"\r\n");
        out
    }

    /// The framing header fields and the body as sent.
    fn framed(body: &[u8], chunking: &Option<Chunking>) -> (String, Vec<u8>) {
        match chunking {
            Some(chunking) => (
                "Transfer-Encoding: chunked\r\n".into(),
                chunked(body, chunking),
            ),
            None if body.is_empty() => (String::new(), Vec::new()),
            None => (format!("Content-Length: {}\r\n", body.len()), body.to_vec()),
        }
    }

    /// (request bytes, offset of the request line within them, response bytes)
    fn build(spec: &Spec) -> (Vec<u8>, usize, Vec<u8>) {
        let mut request = Vec::new();
        if spec.stray_crlf {
            request.extend(b"\r\n");
        }
        let line = request.len();
        request.extend(format!("{} /v1/x HTTP/1.1\r\nHost: gpu\r\n", spec.method).as_bytes());
        if spec.expect_continue {
            request.extend(b"Expect: 100-continue\r\n");
        }
        let (fields, body) = framed(&spec.request_body, &spec.request_chunked);
        request.extend(format!("{fields}\r\n").as_bytes());
        request.extend(body);

        let mut response = Vec::new();
        if spec.expect_continue {
            response.extend(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        if spec.early_hints {
            response.extend(b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n");
        }
        response.extend(format!("HTTP/1.1 {} Reason\r\nServer: test\r\n", spec.status).as_bytes());
        let (fields, body) = framed(&spec.response_body, &spec.response_chunked);
        if spec.status == 204 {
            response.extend(b"\r\n");
        } else if spec.method == "HEAD" || spec.status == 304 {
            // The fields GET would have had, without the body.
            response.extend(format!("{fields}\r\n").as_bytes());
        } else {
            if spec.response_chunked.is_none() && body.is_empty() {
                response.extend(b"Content-Length: 0\r\n");
            }
            response.extend(format!("{fields}\r\n").as_bytes());
            response.extend(body);
        }
        (request, line, response)
    }

    struct Streams {
        input: Vec<u8>,
        output: Vec<u8>,
        /// Where each request's bytes (stray CRLF included) start, and where its response ends.
        request_starts: Vec<usize>,
        response_ends: Vec<usize>,
        expected: Vec<Exchange>,
        pending: Pending,
    }

    fn streams(specs: &[Spec], until_close: &Option<Vec<u8>>) -> Streams {
        let mut s = Streams {
            input: Vec::new(),
            output: Vec::new(),
            request_starts: Vec::new(),
            response_ends: Vec::new(),
            expected: Vec::new(),
            pending: Pending::Nothing,
        };
        for spec in specs {
            let (request, line, response) = build(spec);
            let (i, o) = (s.input.len(), s.output.len());
            s.request_starts.push(i);
            s.input.extend(&request);
            s.output.extend(&response);
            s.response_ends.push(s.output.len());
            s.expected
                .push(exchange(i + line..s.input.len(), o..s.output.len()));
        }
        if let Some(body) = until_close {
            s.request_starts.push(s.input.len());
            s.input
                .extend(b"GET /v1/stream HTTP/1.1\r\nAccept: text/event-stream\r\n\r\n");
            s.output
                .extend(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n");
            s.output.extend(body);
            s.response_ends.push(s.output.len());
            s.pending = Pending::UntilClose {
                request_end: s.input.len(),
            };
        }
        s
    }

    /// Offsets within a slice given at `base` made absolute.
    fn shift(pending: Pending, base: usize) -> Pending {
        match pending {
            Pending::UntilClose { request_end } => Pending::UntilClose {
                request_end: base + request_end,
            },
            other => other,
        }
    }

    /// What every result must satisfy, whatever the bytes.
    fn check_invariants(input: &[u8], output: &[u8], result: &Result<Split, HttpSplitError>) {
        let within = |e: &HttpSplitError| match e.side {
            Side::Request => assert!(e.at <= input.len()),
            Side::Response => assert!(e.at <= output.len()),
        };
        let s = match result {
            Ok(s) => s,
            Err(e) => return within(e),
        };
        let (mut i, mut o) = (0, 0);
        for e in &s.exchanges {
            assert!(
                i <= e.request.start
                    && e.request.start < e.request.end
                    && e.request.end <= input.len()
            );
            assert!(
                o <= e.response.start
                    && e.response.start < e.response.end
                    && e.response.end <= output.len()
            );
            (i, o) = (e.request.end, e.response.end);
        }
        assert_eq!((s.input_used, s.output_used), (i, o));
        match &s.pending {
            Pending::Nothing => assert_eq!((i, o), (input.len(), output.len())),
            Pending::UntilClose { request_end } => {
                assert!(i < *request_end && *request_end <= input.len())
            }
            Pending::Malformed(e) => {
                assert!(!s.exchanges.is_empty());
                within(e);
            }
            Pending::Incomplete | Pending::Switched => {}
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Bytes arriving in any order a real connection allows (a response only after its
        /// request has started), split call after call by a caller that keeps the unconsumed
        /// bytes, give exactly the exchanges of one split of the whole: none lost, none twice.
        #[test]
        fn cuts_neither_lose_nor_duplicate_exchanges(
            specs in prop::collection::vec(spec(), 0..5),
            until_close in prop::option::of(prop::collection::vec(any::<u8>(), 0..30)),
            cuts in prop::collection::vec((0usize..=1000, 0usize..=1000), 1..4),
        ) {
            let s = streams(&specs, &until_close);
            let whole = split(&s.input, &s.output);
            prop_assert_eq!(&whole.exchanges, &s.expected);
            prop_assert_eq!(&whole.pending, &s.pending);

            let (mut ci, mut co) = (0, 0);
            let mut arrivals: Vec<(usize, usize)> = cuts
                .iter()
                .map(|&(fi, fo)| {
                    ci = ci.max(s.input.len() * fi / 1000);
                    // The responses to the requests that have started.
                    let started = s.request_starts.iter().filter(|&&start| start < ci).count();
                    let bound = if started == 0 { 0 } else { s.response_ends[started - 1] };
                    co = co.max(bound * fo / 1000);
                    (ci, co)
                })
                .collect();
            arrivals.push((s.input.len(), s.output.len()));

            let (mut base_in, mut base_out) = (0, 0);
            let mut got = Vec::new();
            let mut pending = Pending::Nothing;
            for (ci, co) in arrivals {
                let step = split_exchanges(&s.input[base_in..ci], &s.output[base_out..co]);
                let step = match step {
                    Ok(step) => step,
                    Err(e) => return Err(TestCaseError::fail(format!("cut at ({ci}, {co}): {e}"))),
                };
                for e in step.exchanges {
                    got.push(exchange(
                        base_in + e.request.start..base_in + e.request.end,
                        base_out + e.response.start..base_out + e.response.end,
                    ));
                }
                pending = shift(step.pending, base_in);
                base_in += step.input_used;
                base_out += step.output_used;
            }
            prop_assert_eq!(got, s.expected);
            prop_assert_eq!(pending, s.pending);
            prop_assert_eq!((base_in, base_out), (whole.input_used, whole.output_used));
        }

        #[test]
        fn arbitrary_bytes_never_panic(
            input in prop::collection::vec(any::<u8>(), 0..300),
            output in prop::collection::vec(any::<u8>(), 0..300),
        ) {
            check_invariants(&input, &output, &split_exchanges(&input, &output));
            let input = [&b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"[..], &input].concat();
            check_invariants(&input, &output, &split_exchanges(&input, &output));
            let output = [&b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"[..], &output].concat();
            check_invariants(&input, &output, &split_exchanges(&input, &output));
        }

        /// Valid streams with bytes overwritten, inserted or cut reach the deep paths.
        #[test]
        fn damaged_streams_never_panic(
            specs in prop::collection::vec(spec(), 1..4),
            damage in prop::collection::vec((any::<bool>(), any::<bool>(), any::<usize>(), any::<u8>()), 1..6),
            keep in (0usize..=1000, 0usize..=1000),
        ) {
            let mut s = streams(&specs, &None);
            for (in_output, insert, at, byte) in damage {
                let bytes = if in_output { &mut s.output } else { &mut s.input };
                let at = at % (bytes.len() + 1);
                if insert || at == bytes.len() {
                    bytes.insert(at, byte);
                } else {
                    bytes[at] = byte;
                }
            }
            let input = &s.input[..s.input.len() * keep.0 / 1000];
            let output = &s.output[..s.output.len() * keep.1 / 1000];
            check_invariants(input, output, &split_exchanges(input, output));
        }
    }
}
