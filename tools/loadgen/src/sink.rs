//! `--sink`: a built-in no-op HTTP/1.1 server that answers every request with the same grant,
//! on its own thread (left out of the generator's CPU time), to measure the generator itself.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::RECV_BUF;
use crate::cpu::current_tid;
use crate::http::find;

/// The built-in no-op server of `--sink`: a current-thread runtime on its own OS thread that
/// answers every request with the same granted reply. It lives until the process exits.
pub(crate) struct Sink {
    pub(crate) addr: SocketAddr,
    /// Its thread, whose CPU time is left out of the generator's.
    pub(crate) tid: Option<u32>,
}

/// The body of every sink reply: a grant, as the real server words it.
pub(crate) const SINK_BODY: &str = r#"{"granted":true,"at":"2026-01-01T00:00:00.000Z"}"#;
/// Largest request the sink buffers.
pub(crate) const SINK_MAX_REQUEST: usize = 1024 * 1024;

impl Sink {
    pub(crate) fn start() -> anyhow::Result<Sink> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new().name("bench-sink".into()).spawn(move || {
            let _ = tid_tx.send(current_tid());
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                loop {
                    if let Ok((stream, _)) = listener.accept().await {
                        let _ = stream.set_nodelay(true);
                        tokio::spawn(sink_connection(stream));
                    }
                }
            });
        })?;
        let tid = tid_rx.recv().ok().flatten();
        Ok(Sink { addr, tid })
    }
}

/// Answers every complete request on `stream` (pipelined ones together) until it closes or
/// sends something that is not a request.
pub(crate) async fn sink_connection(mut stream: TcpStream) {
    let reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{SINK_BODY}",
        SINK_BODY.len()
    )
    .into_bytes();
    let mut buf = vec![0u8; RECV_BUF];
    let (mut start, mut end) = (0, 0);
    let mut out = Vec::with_capacity(reply.len());
    loop {
        while let Some(head) = find(&buf[start..end], b"\r\n\r\n") {
            let Some(body) = request_content_length(&buf[start..start + head]) else { return };
            let total = head + 4 + body;
            if end - start < total {
                break;
            }
            start += total;
            out.extend_from_slice(&reply);
        }
        if !out.is_empty() {
            if stream.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        if start == end {
            (start, end) = (0, 0);
        } else if end == buf.len() {
            if start > 0 {
                buf.copy_within(start..end, 0);
                (start, end) = (0, end - start);
            } else if buf.len() < SINK_MAX_REQUEST {
                buf.resize(buf.len() * 2, 0);
            } else {
                return;
            }
        }
        match stream.read(&mut buf[end..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => end += n,
        }
    }
}

/// The `Content-Length` of a request head (0 when absent); `None` when malformed.
pub(crate) fn request_content_length(head: &[u8]) -> Option<usize> {
    let mut length = 0;
    for line in head.split(|&b| b == b'\n').skip(1) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        if line[..colon].eq_ignore_ascii_case(b"content-length") {
            let value = line[colon + 1..].trim_ascii();
            if value.is_empty() || value.len() > 18 || !value.iter().all(u8::is_ascii_digit) {
                return None;
            }
            length = value.iter().fold(0usize, |n, d| n * 10 + usize::from(d - b'0'));
        }
    }
    (length <= SINK_MAX_REQUEST).then_some(length)
}
