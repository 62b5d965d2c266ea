//! A request answered before its body was read ends its connection, and says so.
//!
//! A refusal that does not need the body (a reader token on a write route, a body over
//! the limit, a timeout) is answered without reading it. hyper then closes the
//! connection after the answer, because the rest of the body would be read as the next
//! request; but when the body had not arrived yet it sends the answer without
//! `Connection: close`, and a keep-alive client (ureq, a browser, curl with several
//! URLs) sends its next request on a connection the server is closing: that request
//! fails with an unexpected EOF, and a POST is not retried. Saying `Connection: close`
//! on such an answer makes every HTTP/1.1 client open a new connection instead. The
//! body is not drained: it may be large, which is why it was not read.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::header::{HeaderValue, CONNECTION};
use axum::response::Response;
use http_body::{Body as _, Frame, SizeHint};

/// A request body that records whether it was read to its end.
struct Watched {
    inner: Body,
    ended: Arc<AtomicBool>,
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        // A reader may stop at the last frame when the body says it is at its end.
        if matches!(r, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.ended.store(true, Ordering::Relaxed);
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The request with its body watched, and the flag that says whether it was read to
/// its end (`None`: it had no body).
pub(crate) fn watch(req: Request) -> (Request, Option<Arc<AtomicBool>>) {
    let (parts, body) = req.into_parts();
    if body.is_end_stream() {
        return (Request::from_parts(parts, body), None);
    }
    let ended = Arc::new(AtomicBool::new(false));
    let watched = Watched {
        inner: body,
        ended: ended.clone(),
    };
    (Request::from_parts(parts, Body::new(watched)), Some(ended))
}

/// Adds `Connection: close` to `resp` when its request's body was not read to its end.
pub(crate) fn close_if_unread(mut resp: Response, ended: Option<Arc<AtomicBool>>) -> Response {
    if ended.is_some_and(|e| !e.load(Ordering::Relaxed)) {
        resp.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}
