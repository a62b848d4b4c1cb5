//! The lean HTTP/1.1 keep-alive client: one request written, one reply read by
//! `Content-Length` into a reused buffer (chunked replies are refused), and the few facts read
//! from a reply body (`"granted"`, `"permit"`).

use std::ops::Range;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::{MAX_BODY, RECV_BUF};

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WireError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("the server closed the connection")]
    Eof,
    #[error("reply uses Transfer-Encoding (chunked); the load generator needs Content-Length")]
    Chunked,
    #[error("reply has no Content-Length")]
    NoLength,
    #[error("malformed reply: {0}")]
    Malformed(&'static str),
    #[error("reply head larger than {RECV_BUF} bytes")]
    HeadTooLarge,
    #[error("reply body larger than {MAX_BODY} bytes")]
    BodyTooLarge,
}

/// A reply read into a [`RecvBuf`]; its body is valid until the next read.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) close: bool,
    pub(crate) body: Range<usize>,
}

/// A connection's receive buffer: replies are parsed in place, leftovers kept for the next one.
pub(crate) struct RecvBuf {
    pub(crate) buf: Vec<u8>,
    pub(crate) start: usize,
    pub(crate) end: usize,
    /// Bytes of the last reply, consumed when the next one is read.
    pub(crate) pending: usize,
}

impl RecvBuf {
    pub(crate) fn new() -> RecvBuf {
        RecvBuf { buf: vec![0; RECV_BUF], start: 0, end: 0, pending: 0 }
    }

    pub(crate) fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
        self.pending = 0;
    }

    pub(crate) fn body(&self, reply: &Reply) -> &[u8] {
        &self.buf[reply.body.clone()]
    }

    /// Read more bytes after `end`, making room first (compacting, or growing when one reply
    /// does not fit: callers bound the size).
    pub(crate) async fn fill<R: AsyncRead + Unpin>(&mut self, io: &mut R) -> Result<(), WireError> {
        if self.end == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                self.buf.resize(self.buf.len() * 2, 0);
            }
        }
        let n = io.read(&mut self.buf[self.end..]).await?;
        if n == 0 {
            return Err(WireError::Eof);
        }
        self.end += n;
        Ok(())
    }

    pub(crate) async fn read_reply<R: AsyncRead + Unpin>(&mut self, io: &mut R) -> Result<Reply, WireError> {
        self.start += self.pending;
        self.pending = 0;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        let mut scanned = 0;
        let head_len = loop {
            let available = &self.buf[self.start..self.end];
            if let Some(i) = find(&available[scanned..], b"\r\n\r\n") {
                break scanned + i + 4;
            }
            if available.len() >= RECV_BUF {
                return Err(WireError::HeadTooLarge);
            }
            scanned = available.len().saturating_sub(3);
            self.fill(io).await?;
        };
        let head = parse_head(&self.buf[self.start..self.start + head_len])?;
        if head.content_length > MAX_BODY {
            return Err(WireError::BodyTooLarge);
        }
        let total = head_len + head.content_length;
        while self.end - self.start < total {
            self.fill(io).await?;
        }
        self.pending = total;
        Ok(Reply { status: head.status, close: head.close, body: self.start + head_len..self.start + total })
    }
}

pub(crate) struct Head {
    pub(crate) status: u16,
    pub(crate) content_length: usize,
    pub(crate) close: bool,
}

/// Parse a reply head (status line and headers, through the blank line).
pub(crate) fn parse_head(head: &[u8]) -> Result<Head, WireError> {
    let mut lines = head.split(|&b| b == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let status_line = lines.next().unwrap_or_default();
    if status_line.len() < 12 || !status_line.starts_with(b"HTTP/1.") || status_line[8] != b' ' {
        return Err(WireError::Malformed("status line"));
    }
    let code = &status_line[9..12];
    if !code.iter().all(u8::is_ascii_digit) {
        return Err(WireError::Malformed("status code"));
    }
    let status = code.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    let http10 = status_line[7] == b'0';
    let mut close = http10;
    let mut content_length = None;
    for line in lines.filter(|l| !l.is_empty()) {
        let colon = line.iter().position(|&b| b == b':').ok_or(WireError::Malformed("header line"))?;
        let name = &line[..colon];
        let value = line[colon + 1..].trim_ascii();
        if name.eq_ignore_ascii_case(b"content-length") {
            if value.is_empty() || value.len() > 18 || !value.iter().all(u8::is_ascii_digit) {
                return Err(WireError::Malformed("Content-Length"));
            }
            content_length = Some(value.iter().fold(0usize, |n, d| n * 10 + usize::from(d - b'0')));
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if !value.eq_ignore_ascii_case(b"identity") {
                return Err(WireError::Chunked);
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            if contains_ignore_case(value, b"close") {
                close = true;
            } else if contains_ignore_case(value, b"keep-alive") {
                close = false;
            }
        }
    }
    let content_length = match content_length {
        Some(n) => n,
        None if status < 200 || status == 204 || status == 304 => 0,
        None => return Err(WireError::NoLength),
    };
    Ok(Head { status, content_length, close })
}

pub(crate) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

pub(crate) fn contains_ignore_case(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Granted,
    Refused,
    None,
}

/// The value after `"name"` and its colon, whitespace skipped.
pub(crate) fn json_value<'a>(body: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let at = find(body, name)?;
    let rest = body[at + name.len()..].trim_ascii_start();
    Some(rest.strip_prefix(b":")?.trim_ascii_start())
}

pub(crate) fn verdict(body: &[u8]) -> Verdict {
    match json_value(body, b"\"granted\"") {
        Some(v) if v.starts_with(b"true") => Verdict::Granted,
        Some(v) if v.starts_with(b"false") => Verdict::Refused,
        _ => Verdict::None,
    }
}

/// The raw contents of the `"permit"` string, escapes kept.
pub(crate) fn permit(body: &[u8]) -> Option<&[u8]> {
    let value = json_value(body, b"\"permit\"")?.strip_prefix(b"\"")?;
    let mut escaped = false;
    for (i, &b) in value.iter().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' => escaped = true,
            b'"' => return Some(&value[..i]),
            _ => {}
        }
    }
    None
}

pub(crate) async fn exchange<S>(stream: &mut S, recv: &mut RecvBuf, request: &[u8]) -> Result<Reply, WireError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(request).await?;
    recv.read_reply(stream).await
}
