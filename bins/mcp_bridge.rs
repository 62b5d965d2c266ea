//! `swarm mcp` with `SWARM_URL` set (`http://`, `https://` or `unix:///PATH`, as every
//! command reaches a server: `crate::http`): an MCP server over stdio whose tools run on a
//! `swarm serve`, as the user and agents of the bearer token in `SWARM_TOKEN` (issue 14:
//! "identity from `SWARM_TOKEN` against a server"). A byte-level bridge: each JSON-RPC
//! line read on stdin is POSTed to the server's `/mcp` (streamable HTTP), and every
//! message the server answers with (a JSON body, or the events of an SSE stream) is
//! written to stdout as one line; the session's GET stream (resource updates) is
//! forwarded the same way. The server does everything else (identity, tools, limits), so
//! a stdio client and an HTTP client see the same server.
//!
//! Limits: at most [`IN_FLIGHT_MAX`] requests in flight (stdin is not read further until
//! one ends); a request line over [`LINE_BYTES_MAX`] is answered with an error without
//! being sent. A request the server refuses (401, 403, 413, unreachable) is answered with
//! a JSON-RPC error naming the cause, so the client never waits for an answer that
//! cannot come.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::process::ExitCode;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use serde_json::{json, Value};

use crate::http::Transport;

/// Requests forwarded at once.
pub const IN_FLIGHT_MAX: usize = 64;
/// Longest request line read from stdin, in bytes (the server's own body limit is lower).
pub const LINE_BYTES_MAX: usize = 16 << 20;
/// How long one request may take (a tool call that synthesizes a run included).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
/// GET stream reconnections after it drops, before the bridge stops listening.
const STREAM_RETRIES_MAX: u32 = 5;

struct Bridge {
    /// `SWARM_URL/mcp`, as messages name it.
    endpoint: String,
    token: Option<String>,
    /// Requests (a read timeout of [`REQUEST_TIMEOUT`]) and the GET stream (none).
    post: Transport,
    stream: Transport,
    session: Mutex<Option<String>>,
    out: Mutex<io::Stdout>,
}

impl Bridge {
    fn emit(&self, line: &str) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        // A closed stdout ends the client's session: nothing left to tell it.
        let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    }

    /// The headers of a request to `/mcp`: what it accepts, the token, the session.
    fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = vec![("Accept", "application/json, text/event-stream".to_string())];
        if let Some(t) = &self.token {
            h.push(("Authorization", format!("Bearer {t}")));
        }
        if let Some(s) = self
            .session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            h.push(("Mcp-Session-Id", s.clone()));
        }
        h
    }

    /// Writes every message of an SSE body as a line; stops at its end. Returns whether
    /// one of them answered the request `id`.
    fn forward_sse(&self, body: impl Read, id: Option<&Value>) -> io::Result<bool> {
        let mut data = String::new();
        let mut answered = false;
        let mut flush = |data: &mut String| {
            if !data.is_empty() {
                answered |= answers(data, id);
                self.emit(data);
                data.clear();
            }
        };
        for line in BufReader::new(body).lines() {
            let line = line?;
            if line.is_empty() {
                flush(&mut data);
            } else if let Some(d) = line.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(d.strip_prefix(' ').unwrap_or(d));
            }
        }
        flush(&mut data);
        Ok(answered)
    }

    /// Forwards one message; answers a request the server cannot take with an error.
    fn forward(&self, line: &str, msg: &Value) {
        let id = msg
            .get("id")
            .filter(|_| msg.get("method").is_some())
            .cloned();
        let fail = |why: String| match &id {
            Some(id) => self.emit(
                &json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": why}})
                    .to_string(),
            ),
            None => eprintln!("swarm mcp: {why}"),
        };
        let mut headers = self.headers();
        headers.push(("Content-Type", "application/json".to_string()));
        let resp = match self
            .post
            .send("POST", "/mcp", &headers, Some(line.as_bytes()))
        {
            Ok(r) if r.status >= 400 => {
                let status = r.status;
                let mut body = String::new();
                let _ = r.body.take(64 * 1024).read_to_string(&mut body);
                let detail = serde_json::from_str::<Value>(&body)
                    .ok()
                    .and_then(|v| v["detail"].as_str().map(str::to_string))
                    .unwrap_or(body);
                let hint = match status {
                    401 => " (SWARM_TOKEN is missing, unknown or revoked)",
                    403 => " (the token's role may not use the tools: an agent token is needed)",
                    _ => "",
                };
                return fail(format!(
                    "{} answered {status}{hint}: {}",
                    self.endpoint,
                    detail.trim()
                ));
            }
            Ok(r) => r,
            Err(e) => return fail(format!("{e:#}")),
        };
        if let Some(s) = resp.header("mcp-session-id") {
            *self.session.lock().unwrap_or_else(|e| e.into_inner()) = Some(s.to_string());
        }
        if resp.status == 202 {
            return;
        }
        let sse = resp
            .header("content-type")
            .and_then(|c| c.split(';').next())
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"));
        let mut body = resp.body.take(LINE_BYTES_MAX as u64 * 4);
        let read = if sse {
            self.forward_sse(body, id.as_ref())
        } else {
            let mut s = String::new();
            body.read_to_string(&mut s).map(|_| {
                self.emit(&s);
                answers(&s, id.as_ref())
            })
        };
        match read {
            Err(e) => fail(format!("the answer of {} broke off: {e}", self.endpoint)),
            // The stream ended without the answer (the server stopped mid-request): the
            // client must not wait for it.
            Ok(false) if id.is_some() => fail(format!(
                "{} ended the exchange without an answer",
                self.endpoint
            )),
            Ok(_) => {}
        }
    }

    /// The session's GET stream (server-initiated messages: resource updates), forwarded
    /// until the session ends; reconnects a few times if it drops.
    fn listen(&self) {
        let mut retries = 0;
        while retries <= STREAM_RETRIES_MAX {
            match self.stream.send("GET", "/mcp", &self.headers(), None) {
                // 405: the server offers no GET stream; 404: the session ended.
                Ok(resp) if matches!(resp.status, 404 | 405) => return,
                Ok(resp) if resp.status < 300 => {
                    retries = 0;
                    let _ = self.forward_sse(resp.body, None);
                }
                Ok(_) | Err(_) => {}
            }
            retries += 1;
            thread::sleep(Duration::from_millis(200 * u64::from(retries)));
        }
    }
}

/// Whether the JSON-RPC message `text` is the answer (a result or an error) to `id`.
fn answers(text: &str, id: Option<&Value>) -> bool {
    let Some(id) = id else { return false };
    serde_json::from_str::<Value>(text).is_ok_and(|v| {
        v.get("id") == Some(id) && (v.get("result").is_some() || v.get("error").is_some())
    })
}

/// Runs the bridge until stdin closes; then ends the server's session.
pub fn run(base: &str) -> anyhow::Result<ExitCode> {
    let base = base.trim_end_matches('/');
    let bridge = Arc::new(Bridge {
        endpoint: format!("{base}/mcp"),
        token: std::env::var("SWARM_TOKEN").ok().filter(|t| !t.is_empty()),
        post: Transport::with_read_timeout(base, Some(REQUEST_TIMEOUT))?,
        stream: Transport::with_read_timeout(base, None)?,
        session: Mutex::new(None),
        out: Mutex::new(io::stdout()),
    });
    if bridge.token.is_none() {
        eprintln!("swarm mcp: SWARM_TOKEN is not set; the server will refuse the session (make one with `swarm token add`)");
    }
    // Permits: a request takes one before it is sent and gives it back when it ends.
    let (give, take): (SyncSender<()>, Receiver<()>) = sync_channel(IN_FLIGHT_MAX);
    for _ in 0..IN_FLIGHT_MAX {
        give.send(())?;
    }
    let mut workers = Vec::new();
    let mut listening = false;
    let mut stdin = io::stdin().lock();
    let mut line = String::new();
    loop {
        line.clear();
        let n = (&mut stdin)
            .take(LINE_BYTES_MAX as u64 + 1)
            .read_line(&mut line)?;
        if n == 0 {
            break;
        }
        if line.len() > LINE_BYTES_MAX {
            bridge.emit(
                &json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600,
                    "message": format!("a message over {LINE_BYTES_MAX} bytes was not sent")}})
                .to_string(),
            );
            // Skip the rest of the oversized line.
            let mut rest = Vec::new();
            stdin.read_until(b'\n', &mut rest)?;
            continue;
        }
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        let msg: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                bridge.emit(
                    &json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700,
                        "message": format!("not JSON: {e}")}})
                    .to_string(),
                );
                continue;
            }
        };
        let initialized = msg["method"] == "notifications/initialized";
        let is_init = msg["method"] == "initialize";
        take.recv()?;
        let (b, give, text) = (Arc::clone(&bridge), give.clone(), text.to_string());
        let worker = thread::spawn(move || {
            b.forward(&text, &msg);
            let _ = give.send(());
        });
        // The session id comes with initialize's answer: nothing else may go before it.
        if is_init || initialized {
            let _ = worker.join();
        } else {
            workers.push(worker);
            workers.retain(|w| !w.is_finished());
        }
        if initialized && !listening {
            listening = true;
            let b = Arc::clone(&bridge);
            thread::spawn(move || b.listen());
        }
    }
    for w in workers {
        let _ = w.join();
    }
    if bridge
        .session
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_some()
    {
        let _ = bridge.post.send("DELETE", "/mcp", &bridge.headers(), None);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_result_or_error_for_the_same_id_answers() {
        let id = json!(7);
        assert!(answers(
            r#"{"jsonrpc":"2.0","id":7,"result":{}}"#,
            Some(&id)
        ));
        assert!(answers(
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":1}}"#,
            Some(&id)
        ));
        assert!(!answers(
            r#"{"jsonrpc":"2.0","id":8,"result":{}}"#,
            Some(&id)
        ));
        assert!(!answers(
            r#"{"jsonrpc":"2.0","method":"notifications/progress"}"#,
            Some(&id)
        ));
        assert!(!answers("not json", Some(&id)));
        assert!(!answers(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#, None));
    }
}
