//! The CLI as a client of `swarm serve`: with `SWARM_URL` set (and `SWARM_TOKEN`, the
//! bearer token), every command with a server route talks to the server instead of the
//! files, with the same flags, the same output and the same exit codes (`scratch.rs`:
//! the scratchpad commands; `memory.rs`: facts, search, memory events, patterns, advice,
//! metrics, synth; `runs.rs`: runs, verify, replay, run close/restore). The commands
//! that only make sense on the files ([`FILES_ONLY`]) refuse (exit 2) rather than
//! silently use local files.
//!
//! The user is the token's (`--user` is not sent: the server takes the user from the
//! token only). Output is byte-identical to the embedded mode's: the server serializes
//! the library's own types in their field order, and this client prints events through
//! the same `Event` type and every other value as the raw JSON the server sent.

use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use swarm_memory::Event;

use crate::http::Transport;
use crate::prune::ContextArgs;
use crate::scratch::BoardArgs;
use crate::{AppendArgs, Cmd, ReadArgs, TailArgs};

mod memory;
mod runs;
mod scratch;

/// The commands that work on the data directory itself and refuse under `SWARM_URL`.
pub const FILES_ONLY: &str = "repair, index, checkpoint, quality, model, token and demo";

/// How often `tail --follow` asks again for a run that does not exist yet, in ms.
const RUN_WAIT_MS: u64 = 250;

/// The server's address, when the CLI is to be its client.
pub fn url() -> Option<String> {
    std::env::var("SWARM_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .map(|u| u.trim_end_matches('/').to_string())
}

/// A request the server refused: its problem's detail, and the exit code the embedded
/// mode gives the same error class.
#[derive(Debug)]
pub struct Refused {
    /// The exit code.
    pub code: i32,
    detail: String,
    /// The HTTP status, when the server answered with one.
    status: Option<u16>,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for Refused {}

/// The embedded mode's exit code for each status (`swarm --help`, exit codes).
fn exit_code(status: u16) -> i32 {
    match status {
        400 | 404 | 408 | 413 | 415 => 2,
        409 | 412 => 4,
        401 | 403 => 5,
        423 => 6,
        _ => 1,
    }
}

struct Client {
    server: Transport,
    token: Option<String>,
}

/// A request to send: its method, and its path with the encoded query.
struct Req {
    method: &'static str,
    target: String,
}

impl Client {
    fn new(url: &str) -> anyhow::Result<Client> {
        Ok(Client {
            server: Transport::new(url)?,
            token: std::env::var("SWARM_TOKEN").ok().filter(|t| !t.is_empty()),
        })
    }

    fn request(&self, method: &'static str, path: &str, query: &[(&str, String)]) -> Req {
        let mut target = path.to_string();
        for (i, (k, v)) in query.iter().enumerate() {
            target.push(if i == 0 { '?' } else { '&' });
            target.extend(url_escape(k));
            target.push('=');
            target.extend(url_escape(v));
        }
        Req { method, target }
    }

    /// The body of a request that succeeded; a refusal becomes [`Refused`].
    fn send(&self, r: Req, body: Option<&str>) -> anyhow::Result<Box<dyn Read + Send>> {
        let a = self.answer(r, body)?;
        if a.status < 400 {
            return Ok(a.body);
        }
        Err(refusal(a.status, a.body))
    }

    /// The server's answer, whatever its status.
    fn answer(&self, r: Req, body: Option<&str>) -> anyhow::Result<crate::http::Answer> {
        let mut headers = Vec::new();
        if let Some(t) = &self.token {
            headers.push(("Authorization", format!("Bearer {t}")));
        }
        if body.is_some() {
            headers.push(("Content-Type", "application/json".to_string()));
        }
        self.server
            .send(r.method, &r.target, &headers, body.map(str::as_bytes))
    }

    /// The text of a request's answer; `Err` for a refusal.
    fn text(
        &self,
        method: &'static str,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<String> {
        let body = body.map(Value::to_string);
        let mut text = String::new();
        self.send(self.request(method, path, &[]), body.as_deref())?
            .read_to_string(&mut text)
            .with_context(|| {
                // A write was answered 2xx, so it was done: only its answer was lost.
                let done = if method == "GET" {
                    ""
                } else {
                    " (the server did the write: its answer was cut short; read it back)"
                };
                crate::http::ServerIo(format!(
                    "reading the answer of {}{done}",
                    self.server.name()
                ))
            })?;
        Ok(text)
    }

    fn get_text(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<String> {
        let mut text = String::new();
        self.send(self.request("GET", path, query), None)?
            .read_to_string(&mut text)
            .with_context(|| {
                crate::http::ServerIo(format!("reading the answer of {}", self.server.name()))
            })?;
        Ok(text)
    }
}

/// A refusal: the problem's detail and the exit code of its status.
fn refusal(status: u16, body: impl Read) -> anyhow::Error {
    let mut text = String::new();
    let _ = body.take(1 << 20).read_to_string(&mut text);
    let v = serde_json::from_str::<Value>(&text).ok();
    let detail = v
        .as_ref()
        .and_then(|v| v["detail"].as_str().map(str::to_string))
        .unwrap_or_else(|| format!("the server answered {status}: {text}"));
    // Damage is exit 3, as in the embedded mode.
    let corrupt = v
        .as_ref()
        .and_then(|v| v["type"].as_str())
        .is_some_and(|t| t.ends_with("/corrupt"));
    Refused {
        code: if corrupt { 3 } else { exit_code(status) },
        detail,
        status: Some(status),
    }
    .into()
}

/// Refuses a flag the server cannot honour (exit 2), naming it.
fn not_remote(flag: &str, why: &str) -> anyhow::Error {
    crate::invalid(flag, format!("not available through SWARM_URL ({why})"))
}

/// Prints each element of the list `key` of a JSON answer as one line, as sent.
fn print_items(text: &str, key: &str) -> anyhow::Result<ExitCode> {
    let items: Vec<&RawValue> = serde_json::from_str(member(text, key)?.get())?;
    let out = io::stdout();
    let mut out = out.lock();
    for e in items {
        out.write_all(e.get().as_bytes())?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The member `key` of a JSON answer, as sent.
fn member<'a>(text: &'a str, key: &str) -> anyhow::Result<&'a RawValue> {
    let m: std::collections::BTreeMap<&str, &RawValue> = serde_json::from_str(text)?;
    m.get(key)
        .copied()
        .with_context(|| format!("the server's answer has no {key:?}"))
}

/// Prints a JSON answer as one line (a read: a stdout failure is an error).
fn print_raw(text: &str) -> anyhow::Result<ExitCode> {
    crate::scratch::print_json(&raw(text)?)
}

/// Prints the answer of a write as one line ([`crate::scratch::print_ack`]: the write
/// happened, so a stdout failure is exit 7, never a retryable error).
fn print_ack(text: &str, what: &str) -> anyhow::Result<ExitCode> {
    // The stored event's seq is named (as the embedded mode does), so that a script
    // whose stdout failed can find its write without retrying it.
    let seq = serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| {
            [&v["seq"], &v["decision"]["seq"], &v["escalation"]["seq"]]
                .into_iter()
                .find_map(serde_json::Value::as_u64)
        });
    let what = match seq {
        Some(seq) if !what.contains("seq") => format!("{what} as seq {seq}"),
        _ => what.to_string(),
    };
    Ok(crate::scratch::print_ack(&raw(text)?, &what))
}

fn raw(text: &str) -> anyhow::Result<Box<RawValue>> {
    Ok(RawValue::from_string(text.trim().to_string())?)
}

fn run_path(run: &str, rest: &str) -> String {
    let mut p = String::from("/v1/runs/");
    p.extend(url_escape(run));
    p.push_str(rest);
    p
}

/// Percent-encodes a path segment or a query part (run ids are `[A-Za-z0-9._:@-]`, but
/// an invalid one must reach the server intact to be refused there with the embedded
/// mode's message).
fn url_escape(s: &str) -> impl Iterator<Item = String> + '_ {
    s.bytes().map(|b| match b {
        b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' | b':' | b'@' => {
            (b as char).to_string()
        }
        _ => format!("%{b:02X}"),
    })
}

/// Runs `cmd` against the server at `base`.
pub fn run(base: String, cmd: Cmd) -> anyhow::Result<ExitCode> {
    let c = Client::new(&base)?;
    match cmd {
        Cmd::Append(a) => append(&c, a),
        Cmd::Read(a) => read(&c, a),
        Cmd::Tail(a) => tail(&c, a),
        Cmd::Board(a) => board(&c, a),
        Cmd::Context(a) => context(&c, a),
        Cmd::Escalations { run, all, as_agent } => scratch::escalations(&c, &run, all, as_agent),
        Cmd::Pick(a) => scratch::pick(&c, a),
        Cmd::Resolve(a) => scratch::resolve(&c, a),
        Cmd::Policy(p) => scratch::policy(&c, p),
        Cmd::Channel(ch) => scratch::channel(&c, ch),
        Cmd::Prune(a) => scratch::prune(&c, a),
        Cmd::Runs { json } => runs::runs(&c, json),
        Cmd::Verify { run } => runs::verify(&c, run),
        Cmd::Replay(a) => runs::replay(&c, a),
        Cmd::Run(r) => runs::run(&c, r),
        Cmd::Facts(a) => memory::facts(&c, a),
        Cmd::Search(a) => memory::search(&c, a),
        Cmd::MemoryEvents(a) => memory::memory_events(&c, a),
        Cmd::Patterns { symptom, as_agent } => memory::lookup(
            &c,
            "/v1/patterns",
            ("symptom", symptom),
            as_agent,
            "patterns",
        ),
        Cmd::Advise { tool, as_agent } => {
            memory::lookup(&c, "/v1/advise", ("tool", tool), as_agent, "mistakes")
        }
        Cmd::Metrics { run, json } => memory::metrics(&c, &run, json),
        Cmd::Synth(a) => memory::synth(&c, a),
        _ => Err(files_only()),
    }
}

/// The refusal (exit 2) of a command that works on the data directory itself.
pub fn files_only() -> anyhow::Error {
    Refused {
        code: 2,
        detail: format!("this command works on the data directory itself and is not available through SWARM_URL (the file-only commands: {FILES_ONLY}); unset SWARM_URL to run it on the server's data directory"),
        status: None,
    }
    .into()
}

#[derive(Deserialize)]
struct Events {
    events: Vec<Event>,
    #[serde(default)]
    next_from_seq: Option<u64>,
}

fn append(c: &Client, a: AppendArgs) -> anyhow::Result<ExitCode> {
    let query = [("durability", a.durability.clone())];
    let path = run_path(&a.run, "/events");
    let out = io::stdout();
    let mut out = out.lock();
    let post = |body: &str, out: &mut io::StdoutLock| -> anyhow::Result<Option<ExitCode>> {
        let resp = c.send(c.request("POST", &path, &query), Some(body))?;
        // A 2xx is sent once the events are stored: an answer cut short after it says so.
        let stored: Events = serde_json::from_reader(resp).map_err(|e| {
            anyhow::Error::new(e).context(crate::http::ServerIo(format!(
                "{} stored the append but its answer was cut short: read the run, or append \
                 again with the same --id to get the stored event",
                c.server.name()
            )))
        })?;
        Ok(crate::acknowledge(out, &stored.events).err())
    };
    if a.stdin {
        let stdin = io::stdin();
        for (n, line) in stdin.lock().lines().enumerate() {
            let line = line.context("reading stdin")?;
            if line.trim().is_empty() {
                continue;
            }
            let r = post(line.trim(), &mut out).map_err(|e| match e.downcast::<Refused>() {
                Ok(r) => anyhow::Error::new(Refused {
                    code: r.code,
                    detail: format!("line {}: {}", n + 1, r.detail),
                    status: r.status,
                }),
                Err(e) => e,
            })?;
            if let Some(code) = r {
                return Ok(code);
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let content = match (a.json, a.content) {
        (true, Some(c)) => serde_json::from_str::<Value>(&c)
            .map_err(|e| crate::invalid("content", format!("not JSON: {e}")))?,
        (false, Some(c)) => Value::String(c),
        (_, None) => bail!(crate::invalid("content", "missing")),
    };
    let mut ev = serde_json::json!({
        "agent_id": a.agent.unwrap_or_default(),
        "type": a.kind.unwrap_or_default(),
        "content": content,
    });
    let meta = match a.meta {
        Some(m) => match serde_json::from_str::<Value>(&m) {
            Ok(v @ Value::Object(_)) => Some(v),
            _ => bail!(crate::invalid("meta", "must be a JSON object")),
        },
        None => None,
    };
    let optional = [
        ("id", a.id.map(Value::from)),
        ("confidence", a.confidence.map(Value::from)),
        ("refs", (!a.refs.is_empty()).then(|| Value::from(a.refs))),
        ("subject", a.subject.map(Value::from)),
        ("session_id", a.session.map(Value::from)),
        ("meta", meta),
        ("expect_seq", a.expect_seq.map(Value::from)),
        ("expect_subject_seq", a.expect_subject_seq.map(Value::from)),
    ];
    for (k, v) in optional {
        if let Some(v) = v {
            ev[k] = v;
        }
    }
    Ok(post(&ev.to_string(), &mut out)?.unwrap_or(ExitCode::SUCCESS))
}

fn read(c: &Client, a: ReadArgs) -> anyhow::Result<ExitCode> {
    if a.skip_corrupt {
        bail!(crate::invalid(
            "skip-corrupt",
            "not available through SWARM_URL (run it on the server's data directory)"
        ));
    }
    let mut query: Vec<(&str, String)> = Vec::new();
    let optional = [
        ("agent", a.agent),
        ("type", a.kind),
        ("subject", a.subject),
        ("last", a.last.map(|n| n.to_string())),
        ("to_seq", a.to_seq.map(|n| n.to_string())),
        ("since", a.since),
        ("until", a.until),
        ("as", a.as_agent),
    ];
    query.extend(optional.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));
    let path = run_path(&a.run, "/events");
    let out = io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, out.lock());
    let (mut from, mut left) = (a.from_seq, a.limit);
    loop {
        let mut q = query.clone();
        q.extend(from.map(|s| ("from_seq", s.to_string())));
        q.extend(left.map(|n| ("limit", n.to_string())));
        let page: Events = serde_json::from_str(&c.get_text(&path, &q)?)?;
        for e in &page.events {
            serde_json::to_writer(&mut out, e)?;
            out.write_all(b"\n")?;
        }
        left = left.map(|n| n.saturating_sub(page.events.len()));
        match page.next_from_seq {
            Some(next) if left != Some(0) => from = Some(next),
            _ => break,
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn tail(c: &Client, a: TailArgs) -> anyhow::Result<ExitCode> {
    if a.cursor_file.is_some() {
        bail!(crate::invalid(
            "cursor-file",
            "not available through SWARM_URL (resume with --from-seq)"
        ));
    }
    let mut query: Vec<(&str, String)> = Vec::new();
    query.extend(a.agent.map(|v| ("agent", v)));
    query.extend(a.kind.map(|v| ("type", v)));
    query.extend(a.as_agent.map(|v| ("as", v)));
    let path = run_path(&a.run, "/events");
    let out = io::stdout();
    let mut out = out.lock();
    if !a.follow {
        // What is there now, then the end: a read.
        let mut from = a.from_seq;
        loop {
            let mut q = query.clone();
            q.extend(from.map(|s| ("from_seq", s.to_string())));
            let page: Events = serde_json::from_str(&c.get_text(&path, &q)?)?;
            for e in &page.events {
                serde_json::to_writer(&mut out, e)?;
                out.write_all(b"\n")?;
            }
            out.flush()?;
            match page.next_from_seq {
                Some(next) => from = Some(next),
                None => return Ok(ExitCode::SUCCESS),
            }
        }
    }
    query.push(("follow", "1".into()));
    follow_stream(c, &path, &query, a.from_seq.unwrap_or(1), false)
}

/// Follows an SSE stream of `path` from seq `from`, reconnecting after a `lagged`, and
/// waiting for a run that does not exist yet; `memory`: the stream's data are memory
/// events (printed as sent), else events.
fn follow_stream(
    c: &Client,
    path: &str,
    query: &[(&str, String)],
    mut from: u64,
    memory: bool,
) -> anyhow::Result<ExitCode> {
    let out = io::stdout();
    let mut out = out.lock();
    loop {
        let mut q = query.to_vec();
        q.push(("from_seq", from.to_string()));
        let resp = match c.send(c.request("GET", path, &q), None) {
            Ok(r) => r,
            // Like the embedded tail, a run that does not exist yet is waited for (a
            // 404 says no more than that: another user's run looks the same).
            Err(e) if e.downcast_ref::<Refused>().and_then(|r| r.status) == Some(404) => {
                std::thread::sleep(Duration::from_millis(RUN_WAIT_MS));
                continue;
            }
            Err(e) => return Err(e),
        };
        match follow(BufReader::new(resp), &mut out, &mut from, memory)? {
            // Too slow a reader: the server closed the stream naming where to go on, and
            // nothing was skipped; go on from there.
            Some(resume) => from = resume,
            None => bail!(Refused {
                code: 1,
                detail: format!("the server closed the stream; resume with --from-seq {from}"),
                status: None,
            }),
        }
    }
}

/// Prints the events of one SSE stream; `Some(seq)` when it ended with `lagged`.
fn follow(
    stream: impl BufRead,
    out: &mut impl Write,
    next: &mut u64,
    memory: bool,
) -> anyhow::Result<Option<u64>> {
    let (mut event, mut data, mut id) = (String::new(), String::new(), None);
    for line in stream.lines() {
        let line = match line {
            Ok(l) => l,
            Err(_) => return Ok(None),
        };
        if !line.is_empty() {
            if let Some(v) = line.strip_prefix("data:") {
                data.push_str(v.strip_prefix(' ').unwrap_or(v));
            } else if let Some(v) = line.strip_prefix("event:") {
                event = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("id:") {
                id = v.trim().parse::<u64>().ok();
            }
            continue;
        }
        match event.as_str() {
            // A memory event, as sent; its id is the seq of the event it came from (a
            // reconnection after it resumes past that event: its other memory events
            // were sent before it, in the same stream).
            "" if memory && !data.is_empty() => {
                out.write_all(data.as_bytes())?;
                out.write_all(b"\n")?;
                out.flush()?;
                if let Some(seq) = id {
                    *next = seq + 1;
                }
            }
            "" if !data.is_empty() => {
                let e: Event = serde_json::from_str(&data)?;
                let mut line = serde_json::to_vec(&e)?;
                line.push(b'\n');
                out.write_all(&line)?;
                out.flush()?;
                *next = e.seq + 1;
            }
            "lagged" => {
                let v: Value = serde_json::from_str(&data)?;
                return Ok(v["resume_from_seq"].as_u64());
            }
            // The token was revoked: a refusal (exit 5, as a 401), saying so; it said
            // only that the server closed the stream (exit 1).
            "revoked" => {
                let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
                let from = v["resume_from_seq"].as_u64().unwrap_or(*next);
                bail!(Refused {
                    code: exit_code(401),
                    detail: format!(
                        "the token this stream was opened with was revoked; the stream ended before seq {from}"
                    ),
                    status: Some(401),
                });
            }
            "shutdown" => {
                bail!(Refused {
                    code: 1,
                    detail: format!(
                        "the server is shutting down; resume with --from-seq {next} when it is back"
                    ),
                    status: None,
                });
            }
            "error" => {
                let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
                bail!(Refused {
                    code: exit_code(v["status"].as_u64().unwrap_or(500) as u16),
                    detail: v["detail"].as_str().unwrap_or("the stream failed").into(),
                    status: None,
                });
            }
            _ => {}
        }
        event.clear();
        data.clear();
    }
    Ok(None)
}

fn board(c: &Client, a: BoardArgs) -> anyhow::Result<ExitCode> {
    let mut query: Vec<(&str, String)> = Vec::new();
    query.extend(a.subject.map(|v| ("subject", v)));
    query.extend(a.agent.map(|v| ("as", v)));
    if a.history {
        query.push(("history", "true".into()));
    }
    print_items(&c.get_text(&run_path(&a.run, "/board"), &query)?, "board")
}

fn context(c: &Client, a: ContextArgs) -> anyhow::Result<ExitCode> {
    let query = [
        ("as", a.agent.clone()),
        ("budget_bytes", a.budget_bytes.to_string()),
    ];
    let text = c.get_text(&run_path(&a.run, "/context"), &query)?;
    let out = io::stdout();
    let mut out = out.lock();
    if a.json {
        out.write_all(text.trim_end().as_bytes())?;
        out.write_all(b"\n")?;
    } else {
        // Exactly the budgeted bytes, as the embedded mode prints them: the text is
        // already escaped, and each line carries its own end.
        let v: Value = serde_json::from_str(&text)?;
        out.write_all(v["text"].as_str().unwrap_or_default().as_bytes())?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Every event of a run's read (following `next_from_seq` pages), each given to `f`.
fn each_event(
    c: &Client,
    run: &str,
    query: &[(&str, String)],
    mut f: impl FnMut(&Event) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let path = run_path(run, "/events");
    let mut from = None;
    loop {
        let mut q = query.to_vec();
        q.extend(from.map(|s: u64| ("from_seq", s.to_string())));
        let page: Events = serde_json::from_str(&c.get_text(&path, &q)?)?;
        for e in &page.events {
            f(e)?;
        }
        match page.next_from_seq {
            Some(next) => from = Some(next),
            None => return Ok(()),
        }
    }
}
