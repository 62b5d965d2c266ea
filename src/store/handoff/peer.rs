//! The other end of a hand-off: whose process it is, how long to wait for its answer,
//! and what an append whose answer was lost says when its recovery fails.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
#[cfg(test)]
use std::sync::Mutex;
use std::time::Duration;

use crate::error::Error;

#[cfg(test)]
use super::lock;
use super::ANSWER_WAIT_MAX;

/// How long a handing process waits for its answer from the committer at `socket`
/// (`Sent::Stuck`).
pub(super) fn answer_wait(_socket: &Path) -> Duration {
    #[cfg(test)]
    if let Some((_, ms)) = lock(&ANSWER_WAIT_FOR_TESTS)
        .iter()
        .find(|(p, _)| p == _socket)
    {
        return Duration::from_millis(*ms);
    }
    ANSWER_WAIT_MAX
}

/// `answer_wait()` for the sockets of tests that set it.
#[cfg(test)]
pub(super) static ANSWER_WAIT_FOR_TESTS: Mutex<Vec<(PathBuf, u64)>> = Mutex::new(Vec::new());

/// Whether the process at the other end of `s` runs as this process's account.
pub(super) fn same_account(s: &UnixStream) -> bool {
    rustix::net::sockopt::socket_peercred(s).is_ok_and(|c| c.uid == rustix::process::geteuid())
}

/// The error of a batch whose committer went away with it in flight, when appending
/// it here failed too: the committer may have stored it, and the caller never saw the
/// ids generated for it, so any failure but a refusal (an I/O error, damage found on
/// the way, this process's writer poisoned) says the outcome is unknown. (Refusals are
/// definite: the recovery looked for the batch's ids first, and found none stored.)
pub(super) fn recovery_failed(run: &str, e: Error) -> Error {
    match e {
        Error::Invalid { .. }
        | Error::SeqConflict { .. }
        | Error::Forbidden(_)
        | Error::Conflict(_)
        | Error::Escalated { .. } => e,
        e if e.to_string().contains("unknown") => e,
        e => Error::Io {
            op: "append",
            path: PathBuf::from(run),
            source: std::io::Error::other(format!(
                "{e}; the run's committer went away with this append in flight and may have stored it: whether it is stored is unknown (read the run)"
            )),
        },
    }
}
