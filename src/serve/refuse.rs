//! The answer to a connection past `--max-connections`: a 503 problem, not a reset.
//!
//! Closing such a connection at accept told its client nothing (curl: "Connection reset
//! by peer", Python: `RemoteDisconnected`), so it could not tell a full server from a dead
//! one, and a POST was not retried. Now the connection gets one fixed answer, a 503
//! `too-many-connections` with `Retry-After: 1` and `Connection: close`, written before its
//! request is read (HTTP/1.1 lets a server answer early). Then the write side is shut and
//! whatever the client sends is read and dropped until it closes: closing with unread
//! bytes would send a reset, and a reset can make the client's kernel drop the answer
//! before the client read it.
//!
//! Bounded like everything else: at most [`REFUSALS_AT_ONCE`] such answers at once, each
//! for at most [`REFUSAL_TIME`] and [`DRAIN_MAX`] bytes; past that a connection is closed
//! at accept as before. A TLS connection past the limit is closed at accept too: answering
//! it would need a handshake, the costliest part of a connection, just when the server is
//! at its limit.

use std::time::Duration;

use axum::http::StatusCode;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::serve::problem::Problem;

/// Connections answered 503 at once; one past it is closed at accept.
pub(super) const REFUSALS_AT_ONCE: usize = 64;
/// The longest a refused connection is kept, answer and drain together.
pub(super) const REFUSAL_TIME: Duration = Duration::from_secs(1);
/// Bytes of a refused connection's request read (and dropped) at most.
pub(super) const DRAIN_MAX: usize = 64 * 1024;

/// The whole answer to a connection past `max` open ones: head and problem body.
pub(super) fn answer(max: usize) -> Vec<u8> {
    let mut p = Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "too-many-connections",
        "Too many connections",
        format!("the server has its limit of {max} connections open; retry in 1 s"),
    );
    p.retry_after_s = Some(1);
    let body = serde_json::to_vec(&p).unwrap_or_default();
    let mut out = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Writes `answer` on `io`, shuts its write side, and reads what the client sends until
/// it closes, [`DRAIN_MAX`] bytes, or [`REFUSAL_TIME`] from the start.
pub(super) async fn refuse<I>(mut io: I, answer: &[u8])
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let work = async {
        io.write_all(answer).await?;
        io.shutdown().await?;
        let mut buf = [0u8; 4096];
        let mut read = 0;
        while read < DRAIN_MAX {
            match io.read(&mut buf).await? {
                0 => break,
                n => read += n,
            }
        }
        Ok::<(), std::io::Error>(())
    };
    if let Ok(Err(e)) = tokio::time::timeout(REFUSAL_TIME, work).await {
        tracing::debug!(error = %e, "a refused connection's answer was not delivered");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answer is one whole HTTP/1.1 response whose body is the length it says.
    #[test]
    fn the_answer_is_a_whole_response() {
        let a = answer(7);
        let text = String::from_utf8(a).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        assert!(head.contains("retry-after: 1") && head.contains("connection: close"));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["type"], "/problems/too-many-connections");
        assert_eq!(v["status"], 503);
        assert!(v["detail"].as_str().unwrap().contains("limit of 7"), "{v}");
    }
}
