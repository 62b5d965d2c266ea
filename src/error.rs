//! Errors of the library: one enum, each variant naming what went wrong and where.

use std::io;
use std::path::PathBuf;

/// Result type of the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the engine can refuse or fail with.
///
/// Each variant maps to one process exit code of the `swarm` CLI ([`Error::exit_code`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller's input is not acceptable (exit 2). `field` names the offending field.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field, argument or line that is wrong.
        field: String,
        /// Why it is wrong.
        reason: String,
    },
    /// The run does not exist (exit 2).
    #[error("run {0:?} not found")]
    RunNotFound(String),
    /// A compare-and-swap precondition failed (exit 4); nothing was written.
    #[error("conflict: expected last seq {expected}, run {run:?} is at {actual}")]
    SeqConflict {
        /// The run.
        run: String,
        /// The seq the caller expected to be last.
        expected: u64,
        /// The run's actual last seq.
        actual: u64,
    },
    /// The caller may not do this (exit 5): another user's data, a permission the run's
    /// policy does not grant, a closed run.
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// A compare-and-swap on a subject or a channel failed (exit 4); nothing was written
    /// but, for a `reject` channel, the recorded conflict event.
    #[error("conflict: {0}")]
    Conflict(String),
    /// Actions on the subject are blocked by an open escalation (exit 6).
    #[error("escalated: subject {subject:?} is blocked by {} until a human resolves it (swarm resolve)", escalation_name(*escalation))]
    Escalated {
        /// The blocked subject.
        subject: String,
        /// Seq of the open escalation; 0 when the caller's agent may not read
        /// escalations (the run's policy).
        escalation: u64,
    },
    /// Damaged bytes that are not a torn tail (exit 3): never dropped silently.
    #[error("corrupt record in {} at byte offset {offset}{}: {reason}", path.display(), expected_seq(*seq))]
    Corrupt {
        /// The segment file.
        path: PathBuf,
        /// Byte offset of the first bad byte of the record.
        offset: u64,
        /// The seq the damaged record should carry.
        seq: u64,
        /// What check failed.
        reason: String,
    },
    /// An fsync failed earlier in this process; the writer refuses further appends
    /// (exit 1). Retrying an fsync after a failure can report success for lost data.
    #[error("log of run {0:?} is poisoned by an earlier fsync failure; restart the process")]
    Poisoned(String),
    /// An external command the caller named (a summariser) failed: could not start,
    /// timed out, exited non-zero or printed nothing usable (exit 1). Nothing was written.
    #[error("external command failed: {0}")]
    External(String),
    /// An operating-system I/O error (exit 1).
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What the engine was doing.
        op: &'static str,
        /// The file involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// How an escalation is named in a message: by its seq, or not at all (0: hidden).
fn escalation_name(seq: u64) -> String {
    match seq {
        0 => "an open escalation".to_string(),
        n => format!("escalation #{n}"),
    }
}

/// What every unknown-outcome error says ([`Error::outcome_unknown`]).
pub(crate) const OUTCOME_UNKNOWN: &str = "is unknown (read the run";

/// ` (expected seq N)`, or nothing where the seq is not known (0: seqs start at 1).
fn expected_seq(seq: u64) -> String {
    match seq {
        0 => String::new(),
        n => format!(" (expected seq {n})"),
    }
}

impl Error {
    /// The same error, an `Invalid` one about `from` now about `to`: a point checked by
    /// `state_at` (as `at-seq`) under another argument's name (`diff`'s two points).
    pub fn renamed(self, from: &str, to: &str) -> Error {
        match self {
            Error::Invalid { field, reason } if field == from => Error::Invalid {
                field: to.to_string(),
                reason,
            },
            e => e,
        }
    }

    /// Whether this is the error of a write whose outcome is unknown: its frame may be
    /// in the log (a failed step after its write, a committer that went away). The
    /// caller reads the run, or sends it again with the same id; never again without.
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, Error::Io { source, .. } if source.to_string().contains(OUTCOME_UNKNOWN))
    }

    /// Whether this is a plain refusal for lack of space (ENOSPC, EDQUOT): nothing of
    /// the request was stored, and it may succeed once space is freed.
    pub fn storage_full(&self) -> bool {
        // (A failed fsync covers frames already written: never "nothing stored".)
        matches!(self, Error::Io { op, source, .. }
            if *op != "fsync"
                && matches!(source.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded))
            && !self.outcome_unknown()
    }

    /// The `swarm` CLI exit code for this error (see `swarm --help`).
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Invalid { .. } | Error::RunNotFound(_) => 2,
            Error::Corrupt { .. } => 3,
            Error::SeqConflict { .. } | Error::Conflict(_) => 4,
            Error::Forbidden(_) => 5,
            Error::Escalated { .. } => 6,
            Error::Poisoned(_) | Error::Io { .. } | Error::External(_) => 1,
        }
    }

    /// Damage at `offset` of `path`, where the record with `seq` should be.
    pub(crate) fn corrupt(path: &std::path::Path, offset: u64, seq: u64, reason: String) -> Error {
        Error::Corrupt {
            path: path.to_path_buf(),
            offset,
            seq,
            reason,
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Error {
        Error::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Attaches an operation and a path to an `io::Error`.
pub(crate) trait IoContext<T> {
    fn ctx(self, op: &'static str, path: &std::path::Path) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, op: &'static str, path: &std::path::Path) -> Result<T> {
        self.map_err(|source| Error::Io {
            op,
            path: path.to_path_buf(),
            source,
        })
    }
}
