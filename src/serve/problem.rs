//! Error responses: RFC 9457 problem details (`application/problem+json`), and the map
//! from the library's error classes to HTTP statuses.
//!
//! **Invariant:** a 404 for a run says only that the run was not found, in words that
//! depend on nothing but the run id the caller gave: another user's run and a run that
//! does not exist get byte-identical bodies. A 5xx names no file or path (those go to the
//! server's log).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::error::Error;

/// One problem details body.
#[derive(Debug, Serialize)]
pub struct Problem {
    /// A URI naming the kind of problem (relative: `/problems/<kind>`).
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the kind.
    pub title: &'static str,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong in this request.
    pub detail: String,
    /// Extra members for some kinds (the seq to retry from, the blocking escalation).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub extra: Option<serde_json::Map<String, serde_json::Value>>,
    /// Seconds for a `Retry-After` header (429, 503).
    #[serde(skip)]
    pub retry_after_s: Option<u64>,
}

impl Problem {
    /// A problem of `kind` with `status`.
    pub fn new(
        status: StatusCode,
        kind: &str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Problem {
        Problem {
            kind: format!("/problems/{kind}"),
            title,
            status: status.as_u16(),
            detail: detail.into(),
            extra: None,
            retry_after_s: None,
        }
    }

    /// 400: the request itself is wrong.
    pub fn invalid(detail: impl Into<String>) -> Problem {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "invalid",
            "Invalid request",
            detail,
        )
    }

    /// 401: no token, or one that is not (or no longer) valid.
    pub fn unauthorized(detail: impl Into<String>) -> Problem {
        Problem::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Missing or invalid token",
            detail,
        )
    }

    /// 403: the token may not do this.
    pub fn forbidden(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::FORBIDDEN, "forbidden", "Forbidden", detail)
    }

    /// 404 for anything but a run (runs go through [`Error::RunNotFound`]).
    pub fn not_found(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::NOT_FOUND, "not-found", "Not found", detail)
    }

    /// 413: the body is over the limit.
    pub fn too_large(limit: u64) -> Problem {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too-large",
            "Request body too large",
            format!("the body is over the limit of {limit} bytes"),
        )
    }

    /// 415: the body is not JSON.
    pub fn unsupported_media(detail: impl Into<String>) -> Problem {
        Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "Unsupported media type",
            detail,
        )
    }

    /// 429: the token made more than `per_s` requests a second; retry after `wait_s`.
    pub fn too_many_requests(per_s: u32, wait_s: u64) -> Problem {
        let mut p = Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate-limited",
            "Too many requests",
            format!("the token is limited to {per_s} requests a second; retry in {wait_s} s"),
        );
        p.retry_after_s = Some(wait_s);
        p
    }

    /// 503: the server holds as many request bodies as its budget allows; retry soon.
    pub fn bodies_busy(budget: u64) -> Problem {
        let mut p = Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            "Server busy",
            format!(
                "this body does not fit in the {budget} bytes of request bodies the server holds at once (--body-budget-bytes); retry in 1 s"
            ),
        );
        p.retry_after_s = Some(1);
        p
    }

    /// 500, with nothing of the cause (it is logged).
    pub fn internal() -> Problem {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error",
            "the server could not complete the request; its log has the cause",
        )
    }

    fn with(mut self, key: &str, v: impl Into<serde_json::Value>) -> Problem {
        self.extra
            .get_or_insert_with(serde_json::Map::new)
            .insert(key.to_string(), v.into());
        self
    }
}

/// `Retry-After` of a refusal for lack of space (an operator has to free some).
const STORAGE_FULL_RETRY_S: u64 = 30;

impl From<Error> for Problem {
    fn from(e: Error) -> Problem {
        match e {
            Error::Invalid { .. } => Problem::invalid(e.to_string()),
            Error::RunNotFound(run) => Problem::new(
                StatusCode::NOT_FOUND,
                "run-not-found",
                "Run not found",
                format!("run {run:?} not found"),
            ),
            Error::SeqConflict {
                expected, actual, ..
            } => Problem::new(
                StatusCode::PRECONDITION_FAILED,
                "seq-conflict",
                "The run's last seq is not the expected one",
                e.to_string(),
            )
            .with("expected_seq", expected)
            .with("actual_seq", actual),
            Error::Conflict(_) => {
                Problem::new(StatusCode::CONFLICT, "conflict", "Conflict", e.to_string())
            }
            Error::Forbidden(_) => Problem::forbidden(e.to_string()),
            Error::Escalated { escalation, .. } => Problem::new(
                StatusCode::LOCKED,
                "escalated",
                "Blocked by an open escalation",
                e.to_string(),
            )
            .with("escalation", (escalation > 0).then_some(escalation)),
            Error::Poisoned(_) => {
                tracing::error!(error = %e, "request failed");
                Problem::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "Service unavailable",
                    "the run's writer refuses appends after an fsync failure; the server must be restarted",
                )
            }
            Error::Corrupt {
                ref path,
                offset,
                seq,
                ref reason,
            } => {
                tracing::error!(error = %e, "request failed");
                // The segment's name, not the server's path.
                let file = path
                    .file_name()
                    .map_or_else(String::new, |f| f.to_string_lossy().into_owned());
                Problem::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "corrupt",
                    "Damaged log",
                    format!("corrupt record in {file} at byte offset {offset} (expected seq {seq}): {reason}; `swarm verify` and `swarm repair` on the server's data dir"),
                )
                .with("seq", seq)
            }
            Error::Io { .. } if e.outcome_unknown() => {
                tracing::error!(error = %e, "request failed");
                Problem::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "outcome-unknown",
                    "Outcome unknown",
                    "a step after the write failed (the server's log has the cause): whether the events are stored is unknown; read the run, or send them again with the same ids (never without)",
                )
            }
            Error::Io { .. } if e.storage_full() => {
                tracing::error!(error = %e, "request failed");
                let mut p = Problem::new(
                    StatusCode::INSUFFICIENT_STORAGE,
                    "storage-full",
                    "Storage full",
                    "the server's disk is full: nothing of this request was stored; retry once space is freed",
                );
                p.retry_after_s = Some(STORAGE_FULL_RETRY_S);
                p
            }
            Error::Io { .. } | Error::External(_) => {
                tracing::error!(error = %e, "request failed");
                Problem::internal()
            }
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_else(|_| b"{}".to_vec());
        let mut r = (status, body).into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(s) = self.retry_after_s {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"swarm\""),
            );
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(kind: std::io::ErrorKind, msg: &str) -> Error {
        Error::Io {
            op: "write",
            path: "/data/alice/inc/seg".into(),
            source: std::io::Error::new(kind, msg),
        }
    }

    /// A full disk is a 507 that says nothing was stored (and when to retry); a write
    /// whose outcome is unknown says so, whatever its cause (a full disk too); any other
    /// I/O error stays a generic 500.
    #[test]
    fn a_full_disk_and_an_unknown_outcome_have_answers_of_their_own() {
        let full = Problem::from(io(
            std::io::ErrorKind::StorageFull,
            "No space left on device",
        ));
        assert_eq!(
            (full.status, full.retry_after_s),
            (507, Some(STORAGE_FULL_RETRY_S))
        );
        assert_eq!(full.kind, "/problems/storage-full");
        let r = full.into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "30");
        let unknown = format!(
            "No space left on device; this append's frame may be in the log: whether it {} the run, or append again with the same id)",
            crate::error::OUTCOME_UNKNOWN
        );
        let p = Problem::from(io(std::io::ErrorKind::StorageFull, &unknown));
        assert_eq!(
            (p.status, p.kind.as_str()),
            (500, "/problems/outcome-unknown")
        );
        assert!(p.detail.contains("same ids"), "{}", p.detail);
        let p = Problem::from(io(std::io::ErrorKind::PermissionDenied, "denied"));
        assert_eq!((p.status, p.kind.as_str()), (500, "/problems/internal"));
    }
}
