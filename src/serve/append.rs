//! `POST /v1/runs/{run}/events`: appends, as one JSON body or as an NDJSON stream.
//!
//! - `Content-Type: application/json`: one event object, or an array appended as one
//!   atomic batch; 201 `{"events": [...]}` with every stored event, and the engine's
//!   own it caused (an escalation) when the batch's agents may read them.
//! - `Content-Type: application/x-ndjson`: one event or batch per line, each appended as
//!   soon as its line is complete and acknowledged at once on its own line of the
//!   streamed 200 response (`{"line": N, "events": [...]}`), so a long-lived agent keeps
//!   one request open. The first refused line is answered `{"line": N, "problem": {...}}`
//!   and ends the stream (nothing after it is appended), as `swarm append --stdin` stops
//!   at its first error. Each line is held to the body limit and the nesting limit; a
//!   stream that sends nothing for the request timeout, or a line not whole within it
//!   from its first byte, is answered with a 408 problem line and closed.
//!
//! `expect_seq` (query, or the first event's own) makes an append a compare-and-swap on
//! the run's last seq (412 when it moved).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::event::{Event, NewEvent};
use crate::log::meta::Durability;
use crate::serve::app::App;
use crate::serve::extract::{check_depth, Identity, JsonBody, BODY_DEPTH_MAX, Q};
use crate::serve::problem::Problem;

/// Query parameters of an append.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AppendQuery {
    expect_seq: Option<u64>,
    durability: Option<String>,
}

/// The stored events an append answers with.
#[derive(Serialize)]
struct Stored<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u64>,
    events: &'a [Event],
}

/// Acknowledgement lines buffered ahead of a slow reader (the stream then waits).
const ACKS_BUFFERED: usize = 16;

/// The route: a JSON body or an NDJSON stream, by content type.
pub(crate) async fn append(
    State(app): State<Arc<App>>,
    id: Identity,
    Path(run): Path<String>,
    Q(q): Q<AppendQuery>,
    req: Request,
) -> Result<Response, Problem> {
    id.may_write()?;
    let durability: Durability = match q.durability.as_deref() {
        None => Durability::Sync,
        Some(d) => d.parse().map_err(Problem::from)?,
    };
    let ndjson = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/x-ndjson"));
    let target = Target {
        app: app.clone(),
        id,
        run,
        expect_seq: q.expect_seq,
        durability,
    };
    if ndjson {
        let expects = req
            .headers()
            .get(header::EXPECT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
        let mut data = req.into_body().into_data_stream();
        // hyper sends `100 Continue` when the body is first read, and only before the
        // response's head: read the first chunk before answering, or a client that waits
        // for the 100 sends nothing (curl, for any upload from stdin, waits 1 s first).
        let mut first = None;
        if expects {
            let mut stop = app.shutdown.clone();
            tokio::select! {
                r = tokio::time::timeout(app.opts.request_timeout, data.next()) => {
                    first = r.ok().flatten();
                }
                // (The stream then ends at once, with its shutting-down line.)
                _ = stop.wait_for(|s| *s) => {}
            }
        }
        return Ok(stream(
            target,
            futures_util::stream::iter(first).chain(data),
        ));
    }
    let JsonBody(body, _permit) = JsonBody::from_request(req, &app).await?;
    let stored = target.append(body).await?;
    let ack = Stored {
        line: None,
        events: &stored,
    };
    Ok((StatusCode::CREATED, Json(ack)).into_response())
}

/// Where and how appends go.
struct Target {
    app: Arc<App>,
    id: Identity,
    run: String,
    expect_seq: Option<u64>,
    durability: Durability,
}

impl Target {
    /// Appends one body (an event or a batch) after checking that the token may write
    /// as each event's agent and that no event names another user.
    async fn append(&self, body: Value) -> Result<Vec<Event>, Problem> {
        let parse = |what: String, v: Value| {
            serde_json::from_value::<NewEvent>(v)
                .map_err(|e| Problem::invalid(format!("{what}: {e}")))
        };
        let events: Vec<NewEvent> = match body {
            Value::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, v)| parse(format!("[{i}]"), v))
                .collect::<Result<_, _>>()?,
            v @ Value::Object(_) => vec![parse("event".into(), v)?],
            _ => {
                return Err(Problem::invalid(
                    "the body must be an event object or an array of them",
                ))
            }
        };
        for e in &events {
            self.id.write_as(&e.agent_id)?;
            if e.user_id.as_ref().is_some_and(|u| *u != self.id.token.user) {
                return Err(Problem::forbidden(
                    "an event names another user than the token's",
                ));
            }
        }
        let expect = self
            .expect_seq
            .or_else(|| events.first().and_then(|e| e.expect_seq));
        let started = std::time::Instant::now();
        let stored = self
            .app
            .commits
            .append(
                self.id.store.clone(),
                self.run.clone(),
                events,
                expect,
                self.durability,
            )
            .await?;
        self.app.metrics.append(stored.len(), started.elapsed());
        Ok(stored)
    }
}

/// Answers an NDJSON request with a stream of acknowledgement lines, appending each
/// request line as soon as it is complete.
fn stream<S>(target: Target, body: S) -> Response
where
    S: futures_util::Stream<Item = Result<Bytes, axum::Error>> + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Bytes>(ACKS_BUFFERED);
    tokio::spawn(async move {
        if let Err(last) = lines(&target, body, &tx).await {
            let _ = tx.send(last).await;
        }
    });
    let out = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    let mut r = Body::from_stream(out).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/x-ndjson"),
    );
    r
}

/// One JSON line.
fn line_of(v: &impl Serialize) -> Bytes {
    let mut b = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
    b.push(b'\n');
    Bytes::from(b)
}

/// Reads request lines and appends them; `Err` carries the problem line that ends the
/// stream.
async fn lines<S>(target: &Target, mut data: S, tx: &mpsc::Sender<Bytes>) -> Result<(), Bytes>
where
    S: futures_util::Stream<Item = Result<Bytes, axum::Error>> + Unpin,
{
    let limit = usize::try_from(target.app.opts.body_limit_bytes).unwrap_or(usize::MAX);
    let idle = target.app.opts.request_timeout;
    let mut stop = target.app.shutdown.clone();
    let (mut buf, mut n) = (Vec::new(), 0u64);
    // The bytes of a line being received are the server's body budget's, as a JSON
    // body's are (`BodyPermit`): held as they come, given back as lines are handled.
    let mut held = crate::serve::extract::BodyPermit::new(&target.app);
    let problem = |n: u64, p: Problem| line_of(&json!({"line": n, "problem": p}));
    // The token is asked again as the stream runs (at most once a second): a revoked
    // token's stream stops at its next line, not when the client hangs up.
    let mut asked = std::time::Instant::now();
    // When the line in `buf` began: each line must be whole within the request timeout,
    // however its bytes trickle in (a byte every 29 s held the request, its task and its
    // connection for ever under a 30 s timeout that only counted the wait for a chunk).
    let mut line_began: Option<std::time::Instant> = None;
    loop {
        let wait = line_began.map_or(idle, |t| idle.saturating_sub(t.elapsed()));
        // At shutdown the stream ends between lines with a problem line (a line being
        // appended is finished first): it was cut at the shutdown timeout, mid-body.
        let next = tokio::select! {
            biased; // a body that ended, or a chunk that came, goes first
            r = tokio::time::timeout(wait, data.next()) => r,
            _ = stop.wait_for(|s| *s) => {
                let p = Problem::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "shutting-down",
                    "Shutting down",
                    format!("the server is stopping: line {} and those after it were not appended; send them again once it is back", n + 1),
                );
                return Err(problem(n + 1, p));
            }
        };
        let chunk = match next {
            Err(_) => {
                let what = match line_began {
                    Some(_) => "a line not complete",
                    None => "no line",
                };
                let p = Problem::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "timeout",
                    "Request timeout",
                    format!("{what} within {} ms", idle.as_millis()),
                );
                return Err(problem(n + 1, p));
            }
            Ok(None) => None,
            Ok(Some(Err(e))) => {
                return Err(problem(
                    n + 1,
                    Problem::invalid(format!("cannot read the body: {e}")),
                ))
            }
            Ok(Some(Ok(c))) => Some(c),
        };
        let end = chunk.is_none();
        if let Some(c) = chunk {
            if let Err(p) = held.hold(buf.len() + c.len()) {
                return Err(problem(n + 1, p));
            }
            buf.extend_from_slice(&c);
        }
        // Every complete line, and at the end whatever is left.
        let mut drained = false;
        while let Some(pos) = buf
            .iter()
            .position(|&b| b == b'\n')
            .or((end && !buf.is_empty()).then(|| buf.len() - 1))
        {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            drained = true;
            let text = line.trim_ascii();
            if text.is_empty() {
                continue;
            }
            n += 1;
            if text.len() > limit {
                return Err(problem(n, Problem::too_large(limit as u64)));
            }
            // Each line after the first (the request itself was admitted) is a request as
            // far as the token's rate limit goes: over it, the stream waits for the bucket
            // to refill (within the request timeout), as a client told `Retry-After` would.
            if n > 1 {
                let waited = std::time::Instant::now();
                while let Err(p) = target.app.admit(&target.id.token.id) {
                    if waited.elapsed() >= idle {
                        return Err(problem(n, p));
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
            if asked.elapsed() >= crate::serve::token::TokenSet::RECHECK_MIN {
                asked = std::time::Instant::now();
                if !target.app.tokens.is_live(&target.id.token.id) {
                    return Err(problem(n, Problem::unauthorized("the token was revoked")));
                }
            }
            let stored = async {
                check_depth(text, BODY_DEPTH_MAX)?;
                let v: Value = serde_json::from_slice(text)
                    .map_err(|e| Problem::invalid(format!("the line is not JSON: {e}")))?;
                target.append(v).await
            };
            match stored.await {
                Ok(events) => {
                    let ack = line_of(&Stored {
                        line: Some(n),
                        events: &events,
                    });
                    if tx.send(ack).await.is_err() {
                        return Ok(()); // the client is gone
                    }
                }
                Err(p) => return Err(problem(n, p)),
            }
        }
        if buf.len() > limit {
            return Err(problem(n + 1, Problem::too_large(limit as u64)));
        }
        // (Smaller than before: giving back never fails.)
        let _ = held.hold(buf.len());
        if end {
            return Ok(());
        }
        // What is left of the buffer is a line begun now, unless it is the one that
        // was already being received.
        line_began = match (buf.is_empty(), line_began) {
            (true, _) => None,
            (false, Some(t)) if !drained => Some(t),
            (false, _) => Some(std::time::Instant::now()),
        };
    }
}
