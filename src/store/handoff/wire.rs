//! The hand-off's wire format: each message is a little-endian `u32` length and that
//! many bytes of JSON, at most [`MESSAGE_BYTES_MAX`]. The committer greets each
//! connection with a [`Hello`]; then each request ([`Handed`]) gets one [`Answer`].

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::event::{Checked, Event};

/// Largest message either way: twice a batch's limit (`BATCH_BYTES_MAX`, 8 MiB of
/// encoded events), which covers a batch's request and its answer. A larger batch is
/// appended directly; a connection's partial message never holds more than this.
pub(crate) const MESSAGE_BYTES_MAX: usize = 16 << 20;
pub(super) const WIRE_VERSION: u32 = 1;

/// Sent by the committer when it accepts a connection.
#[derive(Serialize, Deserialize)]
pub(super) struct Hello {
    pub(super) v: u32,
    pub(super) user: String,
    /// The last seq its writer has seen: a lost answer is searched for after it.
    pub(super) head: u64,
    pub(super) pid: u32,
}

/// A handed-off atomic batch.
#[derive(Serialize, Deserialize)]
pub(super) struct Handed {
    pub(super) user: String,
    pub(super) expect_seq: Option<u64>,
    pub(super) events: Vec<Checked>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Answer {
    Stored(Vec<Event>),
    Refused(WireError),
}

/// An [`Error`] on the wire.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(super) enum WireError {
    Invalid {
        field: String,
        reason: String,
    },
    RunNotFound {
        run: String,
    },
    SeqConflict {
        run: String,
        expected: u64,
        actual: u64,
    },
    Forbidden {
        why: String,
    },
    Conflict {
        why: String,
    },
    Escalated {
        subject: String,
        escalation: u64,
    },
    Corrupt {
        path: PathBuf,
        offset: u64,
        seq: u64,
        reason: String,
    },
    Poisoned {
        run: String,
    },
    External {
        why: String,
    },
    Io {
        op: String,
        path: PathBuf,
        message: String,
    },
}

impl From<Error> for WireError {
    fn from(e: Error) -> WireError {
        match e {
            Error::Invalid { field, reason } => WireError::Invalid { field, reason },
            Error::RunNotFound(run) => WireError::RunNotFound { run },
            Error::SeqConflict {
                run,
                expected,
                actual,
            } => WireError::SeqConflict {
                run,
                expected,
                actual,
            },
            Error::Forbidden(why) => WireError::Forbidden { why },
            Error::Conflict(why) => WireError::Conflict { why },
            Error::Escalated {
                subject,
                escalation,
            } => WireError::Escalated {
                subject,
                escalation,
            },
            Error::Corrupt {
                path,
                offset,
                seq,
                reason,
            } => WireError::Corrupt {
                path,
                offset,
                seq,
                reason,
            },
            Error::Poisoned(run) => WireError::Poisoned { run },
            Error::External(why) => WireError::External { why },
            Error::Io { op, path, source } => WireError::Io {
                op: op.to_string(),
                path,
                message: source.to_string(),
            },
        }
    }
}

impl From<WireError> for Error {
    fn from(e: WireError) -> Error {
        match e {
            WireError::Invalid { field, reason } => Error::Invalid { field, reason },
            WireError::RunNotFound { run } => Error::RunNotFound(run),
            WireError::SeqConflict {
                run,
                expected,
                actual,
            } => Error::SeqConflict {
                run,
                expected,
                actual,
            },
            WireError::Forbidden { why } => Error::Forbidden(why),
            WireError::Conflict { why } => Error::Conflict(why),
            WireError::Escalated {
                subject,
                escalation,
            } => Error::Escalated {
                subject,
                escalation,
            },
            WireError::Corrupt {
                path,
                offset,
                seq,
                reason,
            } => Error::Corrupt {
                path,
                offset,
                seq,
                reason,
            },
            WireError::Poisoned { run } => Error::Poisoned(run),
            WireError::External { why } => Error::External(why),
            WireError::Io { op, path, message } => Error::Io {
                op: "append (in the committing process)",
                path,
                source: std::io::Error::other(format!("{op}: {message}")),
            },
        }
    }
}

/// A message as it goes on the wire; `None` when over [`MESSAGE_BYTES_MAX`].
pub(super) fn encode_msg(msg: &impl Serialize) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 4];
    serde_json::to_writer(&mut buf, msg).ok()?;
    let n = buf.len() - 4;
    if n > MESSAGE_BYTES_MAX {
        return None;
    }
    buf[..4].copy_from_slice(&(n as u32).to_le_bytes());
    Some(buf)
}

#[cfg(test)]
pub(super) fn write_msg(s: &UnixStream, msg: &impl Serialize) -> std::io::Result<()> {
    let buf = encode_msg(msg)
        .ok_or_else(|| std::io::Error::other(format!("message over {MESSAGE_BYTES_MAX} bytes")))?;
    send_all(s, &buf, None)
}

/// [`write_msg`] on a non-blocking socket, giving up after `limit`.
pub(super) fn write_msg_within(
    s: &UnixStream,
    msg: &impl Serialize,
    limit: Duration,
) -> std::io::Result<()> {
    let buf = encode_msg(msg)
        .ok_or_else(|| std::io::Error::other(format!("message over {MESSAGE_BYTES_MAX} bytes")))?;
    send_all(s, &buf, Some(Instant::now() + limit))
}

/// Writes all of `buf` with `send(MSG_NOSIGNAL)`: a peer that went away is an `EPIPE`
/// error, never a `SIGPIPE`, which kills a process that does not ignore it (Rust's
/// runtime ignores it, but a host that embeds the library may not). On a non-blocking
/// socket with a full buffer it waits in `poll` until `deadline` (`TimedOut` then);
/// without one, `WouldBlock` ends it (a write timeout, `SO_SNDTIMEO`, as `write_all`).
pub(super) fn send_all(
    s: &UnixStream,
    mut buf: &[u8],
    deadline: Option<Instant>,
) -> std::io::Result<()> {
    while !buf.is_empty() {
        match rustix::net::send(s, buf, rustix::net::SendFlags::NOSIGNAL) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) if deadline.is_some() => {
                let left = deadline
                    .and_then(|d| d.checked_duration_since(Instant::now()))
                    .unwrap_or_default();
                let ts = rustix::event::Timespec {
                    tv_sec: left.as_secs() as i64,
                    tv_nsec: left.subsec_nanos() as i64,
                };
                let mut fds = [rustix::event::PollFd::new(s, rustix::event::PollFlags::OUT)];
                match rustix::event::poll(&mut fds, Some(&ts)) {
                    Ok(0) => return Err(std::io::ErrorKind::TimedOut.into()),
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// [`read_msg`], waiting at most `limit` for it to begin (`TimedOut` after).
pub(super) fn read_msg_timed(s: &UnixStream, limit: Duration) -> std::io::Result<Option<Vec<u8>>> {
    if !wait_readable(s, Some(limit))? {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    read_body(s)
}

/// Waits until `s` is readable (a message, or its end): `false` after `limit`.
///
/// In `poll`, not in `recv`: a Unix socket wakes every thread sleeping in `recv` on it
/// when the other side consumes what this side sent (write space), so each message
/// would cost a wake-up for nothing; `poll` filters by event.
fn wait_readable(s: &UnixStream, limit: Option<Duration>) -> std::io::Result<bool> {
    let until = limit.map(|l| std::time::Instant::now() + l);
    loop {
        let left = until.map(|u| u.saturating_duration_since(std::time::Instant::now()));
        let ts = left.map(|l| rustix::event::Timespec {
            tv_sec: l.as_secs() as i64,
            tv_nsec: l.subsec_nanos() as i64,
        });
        let mut fds = [rustix::event::PollFd::new(s, rustix::event::PollFlags::IN)];
        match rustix::event::poll(&mut fds, ts.as_ref()) {
            Ok(0) if left.is_some_and(|l| l.is_zero()) => return Ok(false),
            Ok(0) | Err(rustix::io::Errno::INTR) => {}
            Ok(_) => return Ok(true),
            Err(e) => return Err(e.into()),
        }
    }
}

/// The next message, or `None` at the end of the stream before one began (tests: a
/// stand-in committer's side).
#[cfg(test)]
pub(super) fn read_msg(s: &UnixStream) -> std::io::Result<Option<Vec<u8>>> {
    wait_readable(s, None)?;
    read_body(s)
}

/// The next message of a readable stream (`wait_readable`).
fn read_body(mut s: &UnixStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match s.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > MESSAGE_BYTES_MAX {
        return Err(std::io::Error::other(format!(
            "message of {n} bytes, limit {MESSAGE_BYTES_MAX}"
        )));
    }
    let mut body = vec![0u8; n];
    s.read_exact(&mut body)?;
    Ok(Some(body))
}

/// [`Handed`], borrowed.
#[derive(Serialize)]
pub(super) struct HandedRef<'a> {
    pub(super) user: &'a str,
    pub(super) expect_seq: Option<u64>,
    pub(super) events: &'a [Checked],
}
