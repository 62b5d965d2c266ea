//! `swarm serve` through a real HTTP client against the real server process, started on
//! an ephemeral port in a temporary data directory (it prints its address first).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::serve_cli::metric;
use crate::util::Env;

/// A running `swarm serve`; killed at drop unless stopped.
pub(crate) struct Server {
    pub(crate) child: Child,
    /// `http://127.0.0.1:PORT` (`https://` with `--tls-cert`; then `http` cannot reach
    /// it: it trusts no self-signed certificate)
    pub(crate) url: String,
    pub(crate) http: ureq::Agent,
}

impl Server {
    pub(crate) fn start(env: &Env, extra: &[&str]) -> Server {
        Server::start_at(env, "127.0.0.1:0", extra)
    }

    /// Starts the server on `listen` (port 0: any free port).
    pub(crate) fn start_at(env: &Env, listen: &str, extra: &[&str]) -> Server {
        Server::try_start_at(env, listen, extra)
            .unwrap_or_else(|| panic!("the server did not start on {listen}"))
    }

    /// Starts the server on `listen`; `None` when it exits before it listens (the port is
    /// taken).
    pub(crate) fn try_start_at(env: &Env, listen: &str, extra: &[&str]) -> Option<Server> {
        let mut args = vec!["serve", "--listen", listen];
        args.extend_from_slice(extra);
        let mut child = env
            .cmd(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start swarm serve");
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut first)
            .expect("read the server's first line");
        let Some(url) = first.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        };
        let http = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(10))
            .timeout_read(Duration::from_secs(30))
            .timeout_write(Duration::from_secs(30))
            .build();
        Some(Server {
            child,
            url: url.to_string(),
            http,
        })
    }

    pub(crate) fn addr(&self) -> &str {
        let u = self.url.trim_start_matches("https://");
        u.trim_start_matches("http://")
    }

    pub(crate) fn get(&self, path: &str, token: Option<&str>) -> Resp {
        let mut r = self.http.get(&format!("{}{path}", self.url));
        if let Some(t) = token {
            r = r.set("Authorization", &format!("Bearer {t}"));
        }
        Resp::from(r.call())
    }

    pub(crate) fn post(&self, path: &str, token: Option<&str>, body: &Value) -> Resp {
        self.post_raw(path, token, "application/json", body.to_string().as_bytes())
    }

    pub(crate) fn post_raw(
        &self,
        path: &str,
        token: Option<&str>,
        ctype: &str,
        body: &[u8],
    ) -> Resp {
        let mut r = self
            .http
            .post(&format!("{}{path}", self.url))
            .set("Content-Type", ctype);
        if let Some(t) = token {
            r = r.set("Authorization", &format!("Bearer {t}"));
        }
        Resp::from(r.send_bytes(body))
    }

    /// Opens a live tail; `last_event_id` resumes after that seq.
    pub(crate) fn follow(&self, path: &str, token: &str, last_event_id: Option<u64>) -> Sse {
        let mut r = self
            .http
            .get(&format!("{}{path}", self.url))
            .set("Authorization", &format!("Bearer {token}"));
        if let Some(id) = last_event_id {
            r = r.set("Last-Event-ID", &id.to_string());
        }
        let resp = r.call().expect("open the event stream");
        assert_eq!(resp.content_type(), "text/event-stream");
        Sse {
            lines: BufReader::new(Box::new(resp.into_reader())),
        }
    }

    /// The exit status, once the server exits (after a signal sent otherwise).
    pub(crate) fn stop_waiting(mut self) -> std::process::ExitStatus {
        self.child.wait().expect("wait for the server")
    }

    /// SIGTERM, then the exit status.
    pub(crate) fn stop(mut self) -> std::process::ExitStatus {
        let ok = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(ok.success());
        self.child.wait().expect("wait for the server")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An answer: status, content type, headers, body.
pub(crate) struct Resp {
    pub(crate) status: u16,
    pub(crate) ctype: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: String,
}

impl Resp {
    pub(crate) fn from(r: Result<ureq::Response, ureq::Error>) -> Resp {
        let r = match r {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("request failed: {e}"),
        };
        let (status, ctype) = (r.status(), r.content_type().to_string());
        let headers = r
            .headers_names()
            .into_iter()
            .filter_map(|k| {
                let v = r.header(&k)?.to_string();
                Some((k, v))
            })
            .collect();
        Resp {
            status,
            ctype,
            headers,
            body: r.into_string().expect("body"),
        }
    }

    /// The value of header `name` (any case), if the answer has it.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// Asserts a problem+json answer with `status`; returns the body.
    pub(crate) fn problem(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "{}", self.body);
        assert_eq!(self.ctype, "application/problem+json", "{}", self.body);
        let v = self.json();
        assert_eq!(v["status"], status);
        assert!(v["type"].is_string() && v["title"].is_string() && v["detail"].is_string());
        v
    }

    pub(crate) fn seqs(&self) -> Vec<u64> {
        assert_eq!(self.status / 100, 2, "{}", self.body);
        self.json()["events"]
            .as_array()
            .expect("events")
            .iter()
            .map(|e| e["seq"].as_u64().expect("seq"))
            .collect()
    }
}

/// One server-sent event.
#[derive(Debug)]
pub(crate) struct Msg {
    pub(crate) event: Option<String>,
    pub(crate) id: Option<u64>,
    pub(crate) data: String,
}

pub(crate) struct Sse {
    lines: BufReader<Box<dyn Read + Send + Sync>>,
}

impl Sse {
    /// Reads events in order from seq 1 up to the `lagged` event, which must name the
    /// first one not sent (nothing skipped silently); returns that seq.
    pub(crate) fn until_lagged(&mut self) -> u64 {
        let mut expect = 1;
        loop {
            let m = self.next().expect("events, then lagged");
            if m.event.as_deref() == Some("lagged") {
                let d: Value = serde_json::from_str(&m.data).unwrap();
                assert_eq!(d["resume_from_seq"], expect, "no event skipped silently");
                return expect;
            }
            assert_eq!(m.id, Some(expect));
            expect += 1;
        }
    }

    /// The next event (comments skipped); `None` at the end of the stream.
    pub(crate) fn next(&mut self) -> Option<Msg> {
        loop {
            if let Some(m) = self.next_or_comment()? {
                return Some(m);
            }
        }
    }

    /// The next event, or `Some(None)` for a comment (a heartbeat) met before one;
    /// `None` at the end of the stream.
    pub(crate) fn next_or_comment(&mut self) -> Option<Option<Msg>> {
        let mut m = Msg {
            event: None,
            id: None,
            data: String::new(),
        };
        let mut any = false;
        loop {
            let mut line = String::new();
            if self.lines.read_line(&mut line).expect("read the stream") == 0 {
                return None;
            }
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if any {
                    return Some(Some(m));
                }
                continue;
            }
            if line.starts_with(':') {
                if !any {
                    return Some(None);
                }
                continue;
            }
            any = true;
            let (k, v) = line.split_once(':').unwrap_or((line, ""));
            let v = v.strip_prefix(' ').unwrap_or(v);
            match k {
                "event" => m.event = Some(v.to_string()),
                "id" => m.id = Some(v.parse().expect("id is a seq")),
                "data" => m.data.push_str(v),
                _ => {}
            }
        }
    }

    /// The next event, which must be a run event: its seq (checked against `id:`).
    pub(crate) fn next_seq(&mut self) -> u64 {
        let m = self.next().expect("an event");
        assert_eq!(m.event, None, "{m:?}");
        let e: Value = serde_json::from_str(&m.data).expect("event JSON");
        let seq = e["seq"].as_u64().expect("seq");
        assert_eq!(m.id, Some(seq));
        seq
    }
}

/// Puts a policy on `run` (as agent `lead`, whose token is `lead`): `lead` may do
/// anything, `db` read and write evidence only.
pub(crate) fn put_db_evidence_only_policy(srv: &Server, lead: &str, run: &str) {
    let all = json!(["*"]);
    let policy = json!({"agent": "lead", "policy": {"permissions": {
        "lead": {"read_types": all, "write_types": all, "read_channels": all, "write_channels": all, "admin": true},
        "db": {"read_types": ["evidence"], "write_types": ["evidence"], "read_channels": all, "write_channels": all}}}});
    let put = srv
        .http
        .put(&format!("{}/v1/runs/{run}/policy", srv.url))
        .set("Authorization", &format!("Bearer {lead}"))
        .set("Content-Type", "application/json")
        .send_string(&policy.to_string());
    assert_eq!(Resp::from(put).status, 201);
}

/// `swarm --user USER token add --agent A... --role ROLE`: the token (last stdout line).
pub(crate) fn token(env: &Env, user: &str, agents: &[&str], role: &str) -> String {
    let mut args = vec!["--user", user, "token", "add", "--role", role];
    for a in agents {
        args.extend(["--agent", a]);
    }
    let out = env
        .cmd(&args)
        .stdin(Stdio::null())
        .output()
        .expect("token add");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(stdout.lines().count(), 1, "the token alone: {stdout:?}");
    stdout.trim().to_string()
}

/// A data directory, a server on it (with `extra` options) and an agent token of alice's
/// for `agents`.
fn alice(agents: &[&str], extra: &[&str]) -> (Env, Server, String) {
    let env = Env::fast();
    let srv = Server::start(&env, extra);
    let t = token(&env, "alice", agents, "agent");
    (env, srv, t)
}

fn ev(agent: &str, content: &str) -> Value {
    json!({"agent_id": agent, "type": "evidence", "content": content})
}

#[test]
fn serve_append_then_read_round_trip() {
    let (env, srv, t) = alice(&["db"], &[]);
    assert_eq!(srv.get("/healthz", None).json()["ok"], true);
    assert_eq!(srv.get("/readyz", None).json()["ready"], true);

    let one = srv.post("/v1/runs/inc/events", Some(&t), &ev("db", "disk full"));
    assert_eq!(one.status, 201, "{}", one.body);
    let stored = one.json();
    assert_eq!(stored["events"][0]["seq"], 1);
    assert_eq!(stored["events"][0]["user_id"], "alice");
    let batch = json!([ev("db", "disk 100%"), {"agent_id": "db", "type": "hypothesis", "content": "log growth", "subject": "db-1"}]);
    assert_eq!(
        srv.post("/v1/runs/inc/events", Some(&t), &batch).seqs(),
        [2, 3]
    );

    let all = srv.get("/v1/runs/inc/events", Some(&t));
    assert_eq!(all.seqs(), [1, 2, 3]);
    assert_eq!(all.json()["events"][1]["content"], "disk 100%");
    assert!(all.json()["next_from_seq"].is_null());
    // The same events as the embedded reader sees, field for field.
    let embedded = env.swarm(&["--user", "alice", "read", "--run", "inc"]);
    let lines: Vec<Value> = embedded
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines, *all.json()["events"].as_array().unwrap());
    // Filters of `swarm read`.
    let q = |p: &str| {
        srv.get(&format!("/v1/runs/inc/events?{p}"), Some(&t))
            .seqs()
    };
    assert_eq!(q("type=hypothesis"), [3]);
    assert_eq!(q("subject=db-1"), [3]);
    assert_eq!(q("from_seq=2&to_seq=2"), [2]);
    assert_eq!(q("last=2"), [2, 3]);
    assert_eq!(q("agent=nobody"), Vec::<u64>::new());
    let page = srv.get("/v1/runs/inc/events?limit=2", Some(&t));
    assert_eq!(page.seqs(), [1, 2]);
    assert_eq!(page.json()["next_from_seq"], 3);
    srv.get("/v1/runs/inc/events?from-seq=2", Some(&t))
        .problem(400);
    // `last` holds what it reads until the end: bounded as a page is.
    srv.get("/v1/runs/inc/events?last=10001", Some(&t))
        .problem(400);
    assert_eq!(q("last=10000"), [1, 2, 3]);
    srv.get("/v1/runs/inc/events?type=bogus", Some(&t))
        .problem(400);

    let runs = srv.get("/v1/runs", Some(&t)).json();
    assert_eq!(runs["runs"][0]["run_id"], "inc");
    assert_eq!(runs["runs"][0]["events"], 3);
    let v = srv.get("/v1/runs/inc/verify", Some(&t));
    assert_eq!(v.json()["ok"], true, "{}", v.body);
    srv.get("/v1/nothing", Some(&t)).problem(404);
}

#[test]
fn serve_batch_is_atomic_and_cas_refuses() {
    let (_env, srv, t) = alice(&["db*"], &[]);
    srv.post("/v1/runs/inc/events", Some(&t), &ev("db-1", "first"));
    // The second event is invalid: neither is stored.
    let bad = json!([ev("db-1", "ok"), {"agent_id": "db-1", "type": "evidence", "content": "x", "confidence": 2.0}]);
    let p = srv.post("/v1/runs/inc/events", Some(&t), &bad).problem(400);
    assert!(p["detail"].as_str().unwrap().contains("confidence"), "{p}");
    // A stale expect_seq: 412, nothing stored.
    let p = srv
        .post(
            "/v1/runs/inc/events?expect_seq=0",
            Some(&t),
            &ev("db-1", "late"),
        )
        .problem(412);
    assert_eq!(p["actual_seq"], 1);
    let ok = srv.post(
        "/v1/runs/inc/events?expect_seq=1",
        Some(&t),
        &ev("db-2", "next"),
    );
    assert_eq!(ok.seqs(), [2]);
    assert_eq!(
        srv.get("/v1/runs/inc/events?as=db-1", Some(&t)).seqs(),
        [1, 2]
    );
}

#[test]
fn serve_tail_gets_appends_from_another_process() {
    let (env, srv, t) = alice(&["db"], &[]);
    srv.post("/v1/runs/inc/events", Some(&t), &ev("db", "before"));
    let mut sse = srv.follow("/v1/runs/inc/events?follow=1", &t, None);
    assert_eq!(sse.next_seq(), 1);
    // An embedded-mode writer on the same data directory.
    let out = env.swarm(&[
        "--user",
        "alice",
        "append",
        "--run",
        "inc",
        "--agent",
        "net",
        "--type",
        "evidence",
        "--content",
        "from the CLI",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let m = sse.next().expect("the CLI's event");
    let e: Value = serde_json::from_str(&m.data).unwrap();
    assert_eq!(
        (m.id, e["content"].as_str()),
        (Some(2), Some("from the CLI"))
    );
}

#[test]
fn serve_tail_resumes_after_last_event_id_with_no_gap_and_no_repeat() {
    let (_env, srv, t) = alice(&["db"], &[]);
    for i in 0..3 {
        srv.post("/v1/runs/inc/events", Some(&t), &ev("db", &format!("e{i}")));
    }
    let mut sse = srv.follow("/v1/runs/inc/events?follow=1", &t, None);
    assert_eq!([sse.next_seq(), sse.next_seq(), sse.next_seq()], [1, 2, 3]);
    drop(sse);
    // Missed while disconnected.
    let batch = json!([ev("db", "e3"), ev("db", "e4")]);
    srv.post("/v1/runs/inc/events", Some(&t), &batch);
    let mut sse = srv.follow("/v1/runs/inc/events?follow=1", &t, Some(3));
    assert_eq!([sse.next_seq(), sse.next_seq()], [4, 5]);
    srv.post("/v1/runs/inc/events", Some(&t), &ev("db", "live"));
    assert_eq!(sse.next_seq(), 6);
    // from_seq does the same for a client without the header.
    let mut sse = srv.follow("/v1/runs/inc/events?follow=1&from_seq=5", &t, None);
    assert_eq!([sse.next_seq(), sse.next_seq()], [5, 6]);
}

/// More followers of one run than Linux gives a user inotify instances (128) share one
/// watch: `/metrics` shows one watch with every subscriber on it and none polling; with
/// the polling safety net ten minutes away, every one of them still gets an event
/// appended after it connected (so through the watch), and the watch goes with the last.
#[test]
fn serve_tail_followers_of_a_run_share_one_watch() {
    const FOLLOWERS: u64 = 300;
    // Heartbeats show the server closed connections soon.
    let (_env, srv, t) = alice(
        &["db"],
        &["--sse-poll-ms", "600000", "--heartbeat-ms", "500"],
    );
    let scrape = || srv.get("/metrics", None).body;
    srv.post("/v1/runs/inc/events", Some(&t), &ev("db", "before"));
    let mut streams: Vec<Sse> = (0..FOLLOWERS)
        .map(|_| srv.follow("/v1/runs/inc/events?follow=1", &t, None))
        .collect();
    for s in &mut streams {
        assert_eq!(s.next_seq(), 1);
    }
    let m = scrape();
    for (name, want) in [
        ("swarm_tail_subscribers", FOLLOWERS),
        ("swarm_tail_watches", 1),
        ("swarm_tail_watch_subscribers", FOLLOWERS),
        ("swarm_tail_polling_watches", 0),
        ("swarm_tail_polling_subscribers", 0),
        ("swarm_tail_inotify_instances", 1),
    ] {
        assert_eq!(metric(&m, name), want, "{name} in\n{m}");
    }
    let r = srv.post("/v1/runs/inc/events", Some(&t), &ev("db", "after"));
    assert_eq!(r.status, 201, "{}", r.body);
    // The client's read timeout (30 s) bounds the wait; polling alone would take 10 min.
    for s in &mut streams {
        assert_eq!(s.next_seq(), 2);
    }
    let m = scrape();
    assert!(metric(&m, "swarm_tail_notify_wakeups_total") >= 1, "{m}");
    assert_eq!(metric(&m, "swarm_tail_poll_wakeups_total"), 0, "{m}");
    assert_eq!(
        metric(&m, "swarm_tail_sent_events_total"),
        2 * FOLLOWERS,
        "{m}"
    );
    // Another run gets a watch of its own, on the same inotify instance.
    srv.post("/v1/runs/other/events", Some(&t), &ev("db", "x"));
    let mut other = srv.follow("/v1/runs/other/events?follow=1", &t, None);
    assert_eq!(other.next_seq(), 1);
    let m = scrape();
    assert_eq!(metric(&m, "swarm_tail_watches"), 2, "{m}");
    assert_eq!(metric(&m, "swarm_tail_inotify_instances"), 1, "{m}");
    drop(streams);
    drop(other);
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let m = scrape();
        if metric(&m, "swarm_tail_subscribers") == 0 && metric(&m, "swarm_tail_watches") == 0 {
            assert_eq!(metric(&m, "swarm_tail_watch_subscribers"), 0, "{m}");
            break;
        }
        assert!(Instant::now() < until, "the watches stayed\n{m}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn serve_refuses_missing_and_revoked_tokens() {
    let (env, srv, t) = alice(&["db"], &[]);
    assert_eq!(
        srv.post("/v1/runs/inc/events", Some(&t), &ev("db", "x"))
            .status,
        201
    );
    srv.get("/v1/runs/inc/events", None).problem(401);
    srv.post("/v1/runs/inc/events", None, &ev("db", "y"))
        .problem(401);
    srv.get("/v1/runs/inc/events", Some("swm_000000000000_00"))
        .problem(401);
    // The scheme in any case (RFC 9110 11.1); two Authorization headers are refused,
    // whatever their order (which one acted depended on it).
    let reader = token(&env, "alice", &["db"], "reader");
    let with = |value: String| {
        let r = srv.http.get(&format!("{}/v1/runs/inc/events", srv.url));
        Resp::from(r.set("Authorization", &value).call())
    };
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let r = with(format!("{scheme} {t}"));
        assert_eq!(r.status, 200, "{scheme}: {}", r.body);
    }
    with(format!("Basic {t}")).problem(401);
    for (a, b) in [(&t, &reader), (&reader, &t)] {
        let mut c = TcpStream::connect(srv.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let req = format!(
            "GET /v1/runs/inc/events HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {a}\r\nAuthorization: Bearer {b}\r\n\r\n"
        );
        c.write_all(req.as_bytes()).unwrap();
        let mut answer = String::new();
        let _ = c.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(answer.contains("more than one"), "{answer}");
    }
    let id = t.split('_').nth(1).unwrap();
    let out = env.swarm(&["token", "revoke", id]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    srv.get("/v1/runs/inc/events", Some(&t)).problem(401);
    srv.post("/v1/runs/inc/events", Some(&t), &ev("db", "z"))
        .problem(401);
    // `token list` shows the record, revoked, and no secret.
    let list = env.swarm(&["token", "list"]);
    assert!(list.stdout.contains("\"revoked\""), "{}", list.stdout);
    assert!(!list.stdout.contains(t.rsplit('_').next().unwrap()));
    // The tokens file keeps a hash, never the secret.
    let file = std::fs::read_to_string(env.path().join(".tokens.json")).unwrap();
    assert!(file.contains("sha256") && !file.contains(t.rsplit('_').next().unwrap()));
    assert_eq!(
        env.store()
            .with_user("alice", true)
            .unwrap()
            .read("inc", Default::default())
            .unwrap()
            .count(),
        1
    );
}

/// A stream opened with a token ends once the token is revoked (it went on for as long
/// as the connection lived): within a heartbeat interval, a `revoked` event naming where
/// to resume, then the end.
#[test]
fn a_revoked_token_ends_its_open_event_stream() {
    let (env, srv, t) = alice(&["db"], &["--heartbeat-ms", "100"]);
    assert_eq!(
        srv.post("/v1/runs/inc/events", Some(&t), &ev("db", "a"))
            .status,
        201
    );
    let mut sse = srv.follow("/v1/runs/inc/events?follow=1", &t, None);
    let first = sse.next().expect("the first event");
    assert_eq!(first.id, Some(1));
    let id = t.split('_').nth(1).unwrap();
    let out = env.swarm(&["token", "revoke", id]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    // Appends go on (through the files): the stream does not wait for one to end.
    let store = env.store().with_user("alice", true).unwrap();
    crate::util::lib_append(&store, "inc", "after the revocation");
    let until = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    loop {
        // (Heartbeats come every 100 ms: the deadline is looked at between them.)
        assert!(Instant::now() < until, "the stream went on: {seen:?}");
        match sse.next_or_comment() {
            Some(Some(m)) if m.event.as_deref() == Some("revoked") => {
                assert!(m.data.contains("\"resume_from_seq\""), "{}", m.data);
                break;
            }
            Some(Some(m)) => seen.push(m.id),
            Some(None) => {}
            None => panic!("ended without saying why: {seen:?}"),
        }
    }
    assert!(sse.next().is_none(), "the stream ends");
}

/// An idle stream ends within DESIGN.md's 5 s of its token's revocation, however long
/// its heartbeat interval: it asked only when a heartbeat or an event woke it (a review
/// saw 14 s at the default 15 s heartbeat).
#[test]
fn an_idle_stream_hears_of_its_revoked_token_in_time() {
    let (env, srv, t) = alice(&["db"], &["--heartbeat-ms", "60000"]);
    assert_eq!(
        srv.post("/v1/runs/inc/events", Some(&t), &ev("db", "a"))
            .status,
        201
    );
    let mut sse = srv.follow("/v1/runs/inc/events?follow=1", &t, None);
    assert_eq!(sse.next().expect("the first event").id, Some(1));
    let id = t.split('_').nth(1).unwrap();
    let revoked_at = Instant::now();
    assert_eq!(env.swarm(&["token", "revoke", id]).code, 0);
    let m = sse
        .next_or_comment()
        .expect("a message")
        .expect("not a comment");
    assert_eq!(m.event.as_deref(), Some("revoked"), "{}", m.data);
    let took = revoked_at.elapsed();
    assert!(took < Duration::from_secs(8), "{took:?}");
}

/// `--deny-anonymous` reaches the server (it was taken by the CLI only): an anonymous
/// token minted before gets a 403 on every route, and `token add` refuses to mint one.
#[test]
fn serve_deny_anonymous_refuses_anonymous_tokens() {
    let env = Env::fast();
    let anon = token(&env, "anonymous", &["db"], "agent");
    let alice = token(&env, "alice", &["db"], "agent");
    let srv = Server::start(&env, &["--deny-anonymous"]);
    srv.post("/v1/runs/inc/events", Some(&anon), &ev("db", "x"))
        .problem(403);
    srv.get("/v1/runs", Some(&anon)).problem(403);
    assert_eq!(
        srv.post("/v1/runs/inc/events", Some(&alice), &ev("db", "y"))
            .status,
        201
    );
    let out = env.swarm(&["--deny-anonymous", "token", "add", "--agent", "db"]);
    assert_eq!(out.code, 5, "{}", out.stderr);
    assert!(
        out.stdout.trim().is_empty(),
        "no token minted: {}",
        out.stdout
    );
}

#[test]
fn serve_hides_another_users_runs() {
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    let alice = token(&env, "alice", &["db"], "agent");
    let bob = token(&env, "bob", &["db"], "agent");
    // What "no such run" looks like, before bob's run exists.
    let missing = srv.get("/v1/runs/secret/events", Some(&bob));
    missing.problem(404);
    srv.post(
        "/v1/runs/secret/events",
        Some(&bob),
        &ev("db", "bob's finding"),
    );
    let admin = token(&env, "alice", &["*"], "admin");
    // Read, tail, replay, every view: the same 404 as a run that does not exist, for an
    // agent token and for an admin token of alice's.
    for path in [
        "/v1/runs/secret/events",
        "/v1/runs/secret/events?follow=1",
        "/v1/runs/secret/events?follow=1&from_seq=1",
        "/v1/runs/secret",
        "/v1/runs/secret/verify",
        "/v1/runs/secret/board",
        "/v1/runs/secret/context?budget_bytes=1000&as=db",
        "/v1/runs/secret/channels",
        "/v1/runs/secret/escalations",
        "/v1/runs/secret/policy",
        "/v1/runs/secret/replay",
    ] {
        for t in [&alice, &admin] {
            let r = srv.get(path, Some(t));
            assert_eq!((r.status, &r.body), (404, &missing.body), "{path}");
        }
    }
    // Writes that need the run: the same 404.
    for (path, body) in [
        (
            "/v1/runs/secret/pick",
            json!({"agent": "db", "subject": "s"}),
        ),
        (
            "/v1/runs/secret/escalations/1/resolve",
            json!({"agent": "db", "note": "n"}),
        ),
    ] {
        let r = srv.post(path, Some(&alice), &body);
        assert_eq!((r.status, &r.body), (404, &missing.body), "{path}");
    }
    // Listing (the only search over runs there is) shows none of bob's.
    assert_eq!(srv.get("/v1/runs", Some(&alice)).json()["runs"], json!([]));
    assert_eq!(srv.get("/v1/runs", Some(&admin)).json()["runs"], json!([]));
    // Alice writing to "secret" writes her own run; bob's is untouched.
    srv.post("/v1/runs/secret/events", Some(&alice), &ev("db", "alice's"));
    assert_eq!(srv.get("/v1/runs/secret/events", Some(&bob)).seqs(), [1]);
    let b = srv.get("/v1/runs/secret/events", Some(&bob)).json();
    assert_eq!(b["events"][0]["content"], "bob's finding");
    // A body cannot claim another user.
    let claim = json!({"agent_id": "db", "type": "evidence", "content": "x", "user_id": "bob"});
    srv.post("/v1/runs/secret/events", Some(&alice), &claim)
        .problem(403);
    assert_eq!(srv.get("/v1/runs/secret/events", Some(&bob)).seqs(), [1]);
}

#[test]
fn serve_token_acts_only_as_its_agents_and_role() {
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    let db = token(&env, "alice", &["db*"], "agent");
    let reader = token(&env, "alice", &["*"], "reader");
    srv.post("/v1/runs/inc/events", Some(&db), &ev("db-1", "mine"));
    srv.post("/v1/runs/inc/events", Some(&db), &ev("net", "not mine"))
        .problem(403);
    let mixed = json!([ev("db-2", "mine"), ev("net", "not mine")]);
    srv.post("/v1/runs/inc/events", Some(&db), &mixed)
        .problem(403);
    srv.post("/v1/runs/inc/events", Some(&reader), &ev("db-1", "reader"))
        .problem(403);
    // A reader token is refused before its body is read (a parsed body takes many times
    // its size): a body that is not JSON is a 403, not a 400.
    for path in [
        "/v1/runs/inc/events",
        "/v1/runs/inc/channels",
        "/v1/runs/inc/close",
    ] {
        srv.post_raw(path, Some(&reader), "application/json", b"{not json")
            .problem(403);
    }
    srv.get("/v1/runs/inc/events?as=net", Some(&db))
        .problem(403);
    // Every write route checks the acting agent the same way (the `agent` member).
    let declare = json!({"agent": "net", "channel": "c", "kind": "replace"});
    srv.post("/v1/runs/inc/channels", Some(&db), &declare)
        .problem(403);
    srv.post(
        "/v1/runs/inc/pick",
        Some(&db),
        &json!({"agent": "net", "subject": "s"}),
    )
    .problem(403);
    srv.post("/v1/runs/inc/close", Some(&db), &json!({"agent": "net"}))
        .problem(403);
    // Nothing of that was written.
    assert_eq!(
        srv.get("/v1/runs/inc/events?as=db-1", Some(&db)).seqs(),
        [1]
    );
    assert_eq!(
        srv.get("/v1/runs/inc/events?as=anyone", Some(&reader))
            .seqs(),
        [1]
    );
    // `as` is an agent id like any other: an empty or malformed one is refused.
    for bad in ["", "a%20b", "a%2Fb"] {
        srv.get(&format!("/v1/runs/inc/events?as={bad}"), Some(&reader))
            .problem(400);
    }
    // Replay: an agent gets its own view, never another agent's; the whole state needs
    // an admin token.
    srv.get("/v1/runs/inc/replay?as=net", Some(&db))
        .problem(403);
    let view = srv.get("/v1/runs/inc/replay?as=db-1", Some(&db)).json();
    assert!(
        view["view"].is_object() && view.get("state").is_none(),
        "{view}"
    );
    let admin = token(&env, "alice", &["*"], "admin");
    let r = srv.get("/v1/runs/inc/replay?at_seq=1", Some(&admin));
    assert_eq!(r.json()["state"]["head_seq"], 1, "{}", r.body);
}

/// Sends a request's head, then (after a pause) its body, on one keep-alive connection;
/// returns the answer's head (lower case) and whether the server then closed the
/// connection.
fn head_then_body(srv: &Server, path: &str, token: &str, body: &[u8]) -> (String, bool) {
    let mut c = TcpStream::connect(srv.addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(150));
    let _ = c.write_all(body);
    let mut r = BufReader::new(c);
    let mut answer = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
            break;
        }
        answer.push_str(&line.to_ascii_lowercase());
    }
    let len: usize = answer
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |n| n.trim().parse().unwrap());
    r.read_exact(&mut vec![0; len]).unwrap();
    // Closed: end of stream (or a reset); kept alive: no byte within the wait.
    r.get_ref()
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut one = [0u8; 1];
    let closed = match r.read(&mut one) {
        Ok(n) => n == 0,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    };
    (answer, closed)
}

#[test]
fn an_answer_given_before_the_body_arrived_says_the_connection_closes() {
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    let db = token(&env, "alice", &["db"], "agent");
    let reader = token(&env, "alice", &["*"], "reader");
    // Refused before the body was read (it arrives after the answer): hyper closes the
    // connection, so the answer must say so, or a keep-alive client sends its next
    // request into the closing connection (an unexpected EOF; a POST is not retried).
    for path in ["/v1/runs/inc/events", "/v1/runs/inc/close"] {
        let (head, closed) = head_then_body(&srv, path, &reader, b"{not json");
        assert!(head.starts_with("http/1.1 403"), "{head}");
        assert!(
            closed,
            "{path}: the refusal left the connection open: {head}"
        );
        assert!(head.contains("connection: close\r\n"), "{path}: {head}");
    }
    // A body read to its end keeps the connection, and the answer does not say close.
    let body = ev("db", "late body").to_string();
    let (head, closed) = head_then_body(&srv, "/v1/runs/inc/events", &db, body.as_bytes());
    assert!(head.starts_with("http/1.1 201"), "{head}");
    assert!(!closed && !head.contains("connection: close"), "{head}");
    // The same through the keep-alive client the other tests use: refusals and writes
    // interleaved on its pooled connections, every answer read.
    for i in 0..20 {
        srv.post_raw(
            "/v1/runs/inc/close",
            Some(&reader),
            "application/json",
            b"{x",
        )
        .problem(403);
        srv.post(
            "/v1/runs/inc/events",
            Some(&db),
            &ev("db", &format!("n{i}")),
        );
    }
    assert_eq!(srv.get("/v1/runs/inc/events", Some(&db)).seqs().len(), 21);
}

#[test]
fn serve_refuses_bad_bodies_and_writes_nothing() {
    let (_env, srv, t) = alice(&["db"], &[]);
    let path = "/v1/runs/inc/events";
    srv.post(path, Some(&t), &ev("db", "first"));
    // Over the 9 MiB limit, declared up front or streamed in chunks: 413 either way (a
    // raw socket, as the server answers before the client has sent it all).
    let big =
        json!({"agent_id": "db", "type": "evidence", "content": "x".repeat(10 << 20)}).to_string();
    let head = format!("Content-Length: {}\r\n", big.len());
    assert!(raw_post(&srv, &t, &head, big.clone().into_bytes()).starts_with("HTTP/1.1 413"));
    let mut chunked = Vec::new();
    for c in big.as_bytes().chunks(1 << 16) {
        chunked.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        chunked.extend_from_slice(c);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let head = "Transfer-Encoding: chunked\r\n";
    assert!(raw_post(&srv, &t, head, chunked).starts_with("HTTP/1.1 413"));
    srv.post_raw(
        path,
        Some(&t),
        "application/json",
        b"{\"agent_id\": \"db\",",
    )
    .problem(400);
    srv.post_raw(
        path,
        Some(&t),
        "text/plain",
        ev("db", "x").to_string().as_bytes(),
    )
    .problem(415);
    let deep = format!(
        "{{\"agent_id\":\"db\",\"type\":\"evidence\",\"content\":{}1{}}}",
        "[".repeat(500),
        "]".repeat(500)
    );
    srv.post_raw(path, Some(&t), "application/json", deep.as_bytes())
        .problem(400);
    srv.post_raw(path, Some(&t), "application/json", b"42")
        .problem(400);
    let unknown = json!({"agent_id": "db", "type": "evidence", "content": "x", "colour": "red"});
    srv.post(path, Some(&t), &unknown).problem(400);
    assert_eq!(srv.get(path, Some(&t)).seqs(), [1]);
}

/// POSTs `body` to `/v1/runs/inc/events` on a raw socket (a thread writes it, ignoring a
/// closed connection) and returns what the server answered.
fn raw_post(srv: &Server, token: &str, headers: &str, body: Vec<u8>) -> String {
    let mut c = TcpStream::connect(srv.addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST /v1/runs/inc/events HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n{headers}\r\n"
    );
    c.write_all(head.as_bytes()).unwrap();
    let mut w = c.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(&body);
    });
    let mut buf = Vec::new();
    let _ = c.read_to_end(&mut buf);
    let _ = c.shutdown(std::net::Shutdown::Both);
    let _ = writer.join();
    String::from_utf8_lossy(&buf).into_owned()
}

#[test]
fn serve_cuts_off_a_client_that_never_finishes_its_request() {
    let (_env, srv, t) = alice(&["db"], &["--request-timeout-ms", "300"]);
    let limit = Duration::from_secs(20);
    // Headers never finished: the connection is closed.
    let mut c = TcpStream::connect(srv.addr()).unwrap();
    c.set_read_timeout(Some(limit)).unwrap();
    c.write_all(b"POST /v1/runs/inc/events HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let started = Instant::now();
    let mut buf = Vec::new();
    let r = c.read_to_end(&mut buf);
    assert!(
        r.is_ok() && started.elapsed() < limit,
        "not cut off: {r:?} after {:?}",
        started.elapsed()
    );
    // Headers complete, body never finished: 408, and nothing written.
    let mut c = TcpStream::connect(srv.addr()).unwrap();
    c.set_read_timeout(Some(limit)).unwrap();
    let head = format!(
        "POST /v1/runs/inc/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {t}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"agent_id\""
    );
    c.write_all(head.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let _ = c.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    srv.get("/v1/runs/inc/events", Some(&t)).problem(404);
}

#[test]
fn serve_ends_tails_and_exits_zero_on_sigterm() {
    let (_env, srv, t) = alice(&["db"], &[]);
    srv.post("/v1/runs/inc/events", Some(&t), &ev("db", "x"));
    let mut sse = srv.follow("/v1/runs/inc/events?follow=1", &t, None);
    assert_eq!(sse.next_seq(), 1);
    let status = srv.stop();
    let m = sse.next().expect("a shutdown event");
    assert_eq!(m.event.as_deref(), Some("shutdown"), "{m:?}");
    let d: Value = serde_json::from_str(&m.data).unwrap();
    assert_eq!(d["resume_from_seq"], 2);
    assert!(sse.next().is_none());
    assert_eq!(status.code(), Some(0));
}

/// A server (with `extra` options), a run of one event and a subscriber that then
/// reads nothing while `batches` batches of 90 events of 60 KB are appended.
fn a_subscriber_that_does_not_read(extra: &[&str], batches: usize) -> (Env, Server, String, Sse) {
    let (env, srv, t) = alice(&["db"], extra);
    srv.post("/v1/runs/inc/events", Some(&t), &ev("db", "x"));
    let sse = srv.follow("/v1/runs/inc/events?follow=1", &t, None);
    let big = "y".repeat(60_000);
    for _ in 0..batches {
        let batch: Vec<Value> = (0..90).map(|_| ev("db", &big)).collect();
        assert_eq!(
            srv.post("/v1/runs/inc/events", Some(&t), &json!(batch))
                .status,
            201
        );
    }
    (env, srv, t, sse)
}

#[test]
fn serve_closes_a_slow_subscriber_naming_where_to_resume() {
    // A subscriber that does not read while ~20 MiB are appended: the socket buffers
    // fill, then its 4-event buffer.
    let (_env, srv, t, mut sse) = a_subscriber_that_does_not_read(&["--sse-buffer-events", "4"], 4);
    let expect = sse.until_lagged();
    assert!(expect <= 361, "it fell behind before the end");
    assert!(sse.next().is_none());
    // Resuming from there delivers the rest.
    let mut sse = srv.follow("/v1/runs/inc/events?follow=1", &t, Some(expect - 1));
    assert_eq!(sse.next_seq(), expect);
}

/// A subscriber that stopped reading for good (its socket full, so not even a heartbeat
/// can be written) is disconnected once a write made no progress for the request
/// timeout: its stream slot comes back (it was held for ever, with its task, its queue and
/// its connection, and a SIGTERM waited the whole shutdown timeout for it).
#[test]
fn serve_disconnects_a_subscriber_that_stopped_reading() {
    let extra = [
        "--sse-streams-per-token",
        "1",
        "--request-timeout-ms",
        "2000",
        "--heartbeat-ms",
        "200",
    ];
    let (_env, srv, t) = alice(&["db"], &extra);
    srv.post("/v1/runs/inc/events", Some(&t), &ev("db", "x"));
    let path = "/v1/runs/inc/events?follow=1";
    let sse = srv.follow(path, &t, None);
    // ~14 MB in small requests (each well within the short request timeout, under load).
    let big = "y".repeat(60_000);
    for _ in 0..24 {
        let batch: Vec<Value> = (0..10).map(|_| ev("db", &big)).collect();
        let r = srv.post("/v1/runs/inc/events", Some(&t), &json!(batch));
        assert_eq!(r.status, 201, "{}", r.body);
    }
    stream_slot_within(&srv, path, &t, Duration::from_secs(30), || {});
    drop(sse);
    // Shut down promptly too (nothing left to wait for).
    let stopped = Instant::now();
    assert!(srv.stop().success());
    assert!(
        stopped.elapsed() < Duration::from_secs(10),
        "{:?}",
        stopped.elapsed()
    );
}

/// One token holds at most `--sse-streams-per-token` event streams open (each holds a
/// task, a queue and file descriptors): past it 429, while another token still opens
/// one; a stream that ends gives its place back.
#[test]
fn serve_bounds_the_event_streams_of_one_token() {
    let (env, srv, t) = alice(&["db"], &["--sse-streams-per-token", "3"]);
    let other = token(&env, "alice", &["db"], "agent");
    srv.post("/v1/runs/inc/events", Some(&t), &ev("db", "x"));
    let path = "/v1/runs/inc/events?follow=1";
    let mut open: Vec<Sse> = (0..3).map(|_| srv.follow(path, &t, None)).collect();
    for s in &mut open {
        assert_eq!(s.next_seq(), 1);
    }
    let full = srv.get(path, Some(&t));
    assert_eq!(full.problem(429)["type"], "/problems/sse-streams-per-token");
    assert_eq!(full.header("retry-after"), Some("1"));
    let mut o = srv.follow(path, &other, None);
    assert_eq!(o.next_seq(), 1);
    drop(open.pop());
    // The server sees the closed connection at its next write (a heartbeat at most).
    stream_slot_within(&srv, path, &t, Duration::from_secs(20), || {
        srv.post("/v1/runs/inc/events", Some(&t), &ev("db", "y"));
    });
}

/// Opens the stream at `path` with token `t` once the token has a free stream slot
/// again, trying (after `before` each time) for at most `within`.
fn stream_slot_within(srv: &Server, path: &str, t: &str, within: Duration, before: impl Fn()) {
    let started = Instant::now();
    loop {
        before();
        let r = srv
            .http
            .get(&format!("{}{path}", srv.url))
            .set("Authorization", &format!("Bearer {t}"))
            .call();
        match r {
            Ok(r) => {
                assert_eq!(r.content_type(), "text/event-stream");
                return;
            }
            Err(ureq::Error::Status(429, _)) if started.elapsed() < within => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("no free stream slot after {:?}: {e}", started.elapsed()),
        }
    }
}

/// A subscriber's queue is bounded in bytes too (`SSE_BUFFER_BYTES`, 4 MiB): at the
/// default 1,024 events of 60 KB each, a client that stopped reading held ~60 MiB for as
/// long as its connection lived; now it is closed as lagged after ~4 MiB.
#[test]
fn serve_bounds_a_slow_subscribers_queue_in_bytes() {
    let (_env, _srv, _t, mut sse) = a_subscriber_that_does_not_read(&[], 6);
    let expect = sse.until_lagged();
    assert!(expect <= 541, "it fell behind before the end");
}

/// A subscriber that stops reading holds back neither the writers nor the subscriber
/// that shares its run's watch: that one gets every event as it is appended, while the
/// stalled one is closed as lagged once its socket and its buffer are full.
#[test]
fn serve_a_stalled_subscriber_holds_back_no_one_on_its_watch() {
    let (_env, srv, t) = alice(&["db"], &["--sse-buffer-events", "8"]);
    srv.post("/v1/runs/inc/events", Some(&t), &ev("db", "x"));
    let stalled = srv.follow("/v1/runs/inc/events?follow=1", &t, None);
    let mut reader = srv.follow("/v1/runs/inc/events?follow=1", &t, None);
    assert_eq!(reader.next_seq(), 1);
    // ~21 MiB in batches of 4, each read by `reader` before the next is appended.
    let big = "y".repeat(60_000);
    let mut next = 2;
    for _ in 0..90 {
        let batch: Vec<Value> = (0..4).map(|_| ev("db", &big)).collect();
        let r = srv.post("/v1/runs/inc/events", Some(&t), &json!(batch));
        assert_eq!(r.status, 201, "{}", r.body);
        for _ in 0..4 {
            assert_eq!(reader.next_seq(), next);
            next += 1;
        }
    }
    let m = srv.get("/metrics", None).body;
    assert_eq!(
        metric(&m, "swarm_tail_lagged_total"),
        1,
        "the stalled one: {m}"
    );
    assert_eq!(metric(&m, "swarm_tail_watches"), 1, "{m}");
    drop(stalled);
}

#[test]
fn serve_scratchpad_routes_apply_the_runs_policy_to_the_tokens_agent() {
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    let lead = token(&env, "alice", &["lead"], "agent");
    let db = token(&env, "alice", &["db"], "agent");
    let r = "/v1/runs/inc";
    srv.post(
        &format!("{r}/events"),
        Some(&lead),
        &json!({"agent_id": "lead", "type": "hypothesis", "content": "dns", "subject": "cause"}),
    );
    srv.post(
        &format!("{r}/events"),
        Some(&db),
        &json!({"agent_id": "db", "type": "evidence", "content": "disk full", "subject": "db-1"}),
    );
    put_db_evidence_only_policy(&srv, &lead, "inc");
    assert!(
        srv.get(&format!("{r}/policy"), Some(&db)).json()["policy"]["permissions"]["db"]
            .is_object()
    );
    // db's reads, board and tail show only evidence; the policy refuses its hypothesis.
    let types = |resp: Resp| -> Vec<String> {
        resp.json()["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["type"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        types(srv.get(&format!("{r}/events?type=hypothesis"), Some(&db))),
        Vec::<String>::new()
    );
    assert_eq!(
        types(srv.get(&format!("{r}/events?type=hypothesis"), Some(&lead))),
        ["hypothesis"]
    );
    let board = srv.get(&format!("{r}/board"), Some(&db)).json();
    let subjects: Vec<&str> = board["board"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["subject"].as_str().unwrap())
        .collect();
    assert_eq!(subjects, ["db-1"]);
    // Its replay is its agent view, without the hypothesis either.
    let v = srv.get(&format!("{r}/replay"), Some(&db)).json();
    let seen = v["view"]["subjects"].as_object().unwrap();
    assert_eq!(seen.keys().collect::<Vec<_>>(), ["db-1"], "{v}");
    assert!(!v.to_string().contains("dns"), "{v}");
    srv.post(
        &format!("{r}/events"),
        Some(&db),
        &json!({"agent_id": "db", "type": "hypothesis", "content": "x"}),
    )
    .problem(403);
    let mut sse = srv.follow(&format!("{r}/events?follow=1"), &db, None);
    let m = sse.next().unwrap();
    assert_eq!(m.id, Some(2), "the hypothesis (seq 1) is not shown: {m:?}");
    // Channels: declare, write with a base version, read.
    let ch = srv.post(
        &format!("{r}/channels"),
        Some(&lead),
        &json!({"agent": "lead", "channel": "notes", "kind": "replace", "on_conflict": "reject"}),
    );
    assert_eq!(ch.status, 201, "{}", ch.body);
    let v = srv.get(&format!("{r}/channels/notes"), Some(&db)).json()["version"]
        .as_u64()
        .unwrap();
    let w = srv.post(
        &format!("{r}/channels/notes"),
        Some(&db),
        &json!({"agent": "db", "value": {"cause": "disk"}, "base_version": v}),
    );
    assert_eq!(w.status, 201, "{}", w.body);
    srv.post(
        &format!("{r}/channels/notes"),
        Some(&db),
        &json!({"agent": "db", "value": "stale", "base_version": v}),
    )
    .problem(409);
    assert_eq!(
        srv.get(&format!("{r}/channels/notes"), Some(&db)).json()["value"]["cause"],
        "disk"
    );
    assert_eq!(
        srv.get(&format!("{r}/channels"), Some(&db)).json()["channels"],
        json!(["notes"])
    );
    // Context as db: within the budget, and without the hypothesis it may not read.
    let c = srv
        .get(&format!("{r}/context?budget_bytes=4000"), Some(&db))
        .json();
    assert!(c["used_bytes"].as_u64().unwrap() <= 4000);
    assert!(
        c["text"].as_str().unwrap().contains("disk full")
            && !c["text"].as_str().unwrap().contains("dns"),
        "{c}"
    );
    assert_eq!(
        srv.get(&format!("{r}/escalations"), Some(&db)).json()["escalations"],
        json!([])
    );
}

#[test]
fn serve_limits_each_tokens_request_rate_with_429_and_retry_after() {
    let (env, srv, t) = alice(&["db"], &["--rate-limit-per-s", "3"]);
    let other = token(&env, "alice", &["db"], "agent");
    let mut limited = None;
    for _ in 0..20 {
        let r = srv
            .http
            .get(&format!("{}/v1/runs", srv.url))
            .set("Authorization", &format!("Bearer {t}"))
            .call();
        if let Err(ureq::Error::Status(429, r)) = r {
            limited = Some(r);
            break;
        }
    }
    let r = limited.expect("a 429 within 20 quick requests at 3 a second");
    let wait: u64 = r
        .header("Retry-After")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!(wait >= 1);
    assert_eq!(r.content_type(), "application/problem+json");
    // The limit is per token: another token of the same user is not held back.
    assert_eq!(srv.get("/v1/runs", Some(&other)).status, 200);
}

/// An NDJSON append request to run `inc` left open (chunked), and the reader of its
/// response.
fn ndjson_append(srv: &Server, t: &str) -> (TcpStream, BufReader<TcpStream>) {
    let mut c = TcpStream::connect(srv.addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST /v1/runs/inc/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {t}\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    c.write_all(head.as_bytes()).unwrap();
    let r = BufReader::new(c.try_clone().unwrap());
    (c, r)
}

/// One request chunk per line; the request stays open between lines.
fn send_line(c: &mut TcpStream, line: &str) {
    let l = format!("{line}\n");
    let _ = c.write_all(format!("{:x}\r\n{l}\r\n", l.len()).as_bytes());
}

/// The next acknowledgement (or problem) line of the response; `None` at its end.
fn next_ack(r: &mut BufReader<TcpStream>) -> Option<Value> {
    let mut l = String::new();
    while r.read_line(&mut l).ok()? > 0 {
        if l.starts_with("HTTP/1.1") {
            assert!(l.starts_with("HTTP/1.1 200"), "{l}");
        }
        if l.starts_with('{') {
            return Some(serde_json::from_str(&l).unwrap());
        }
        l.clear();
    }
    None
}

/// An NDJSON append stream open at SIGTERM ends with a problem line and a whole body,
/// at once (it was cut mid-body at the shutdown timeout, a line in flight or not); and
/// one that asks `Expect: 100-continue` is told to go on before it sends a line (curl
/// asks it for any upload from stdin, and waited 1 s; a strict client sent nothing).
#[test]
fn serve_ndjson_streams_end_cleanly_at_shutdown_and_answer_expect() {
    let (_env, srv, t) = alice(&["db"], &[]);
    let mut c = TcpStream::connect(srv.addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let head = format!(
        "POST /v1/runs/inc/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {t}\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
    );
    c.write_all(head.as_bytes()).unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 100"), "{status}");
    let mut blank = String::new();
    r.read_line(&mut blank).unwrap();
    send_line(&mut c, &ev("db", "one").to_string());
    assert_eq!(next_ack(&mut r).unwrap()["line"], 1);
    let stopped = Instant::now();
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &srv.child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let last = next_ack(&mut r).expect("a problem line");
    assert_eq!(last["line"], 2, "{last}");
    assert_eq!(last["problem"]["type"], "/problems/shutting-down", "{last}");
    // The chunked body ends whole (its last chunk), and the server exits at once.
    let mut rest = String::new();
    let _ = r.read_to_string(&mut rest);
    assert!(rest.contains("0\r\n\r\n"), "{rest:?}");
    assert!(srv.stop_waiting().success());
    assert!(
        stopped.elapsed() < Duration::from_secs(10),
        "{:?}",
        stopped.elapsed()
    );
}

#[test]
fn serve_ndjson_appends_are_acknowledged_line_by_line() {
    let (_env, srv, t) = alice(&["db"], &[]);
    let (mut c, mut r) = ndjson_append(&srv, &t);
    let send = send_line;
    let mut ack = || next_ack(&mut r);
    send(&mut c, &ev("db", "one").to_string());
    // Acknowledged while the request is still open.
    let a = ack().expect("the first line's acknowledgement");
    assert_eq!(
        (a["line"].as_u64(), a["events"][0]["seq"].as_u64()),
        (Some(1), Some(1))
    );
    send(
        &mut c,
        &json!([ev("db", "two"), ev("db", "three")]).to_string(),
    );
    let a = ack().expect("the batch's acknowledgement");
    assert_eq!(a["line"], 2);
    assert_eq!(a["events"].as_array().unwrap().len(), 2);
    // The first refused line ends the stream; nothing after it is appended.
    send(&mut c, &ev("net", "not mine").to_string());
    let a = ack().expect("the refusal");
    assert_eq!(
        (a["line"].as_u64(), a["problem"]["status"].as_u64()),
        (Some(3), Some(403))
    );
    send(&mut c, &ev("db", "after the refusal").to_string());
    assert!(ack().is_none(), "the stream ended");
    assert_eq!(srv.get("/v1/runs/inc/events", Some(&t)).seqs(), [1, 2, 3]);
}

/// A line of an NDJSON append must be whole within the request timeout, however its
/// bytes trickle in: a client sending a byte every 150 ms under a 600 ms timeout gets a
/// 408 problem line and the stream ends (each byte reset the timeout: a byte every 29 s
/// held the request, its task and its connection for ever under the default 30 s).
#[test]
fn serve_ndjson_cuts_off_a_line_that_trickles_in() {
    let (_env, srv, t) = alice(&["db"], &["--request-timeout-ms", "600"]);
    let (mut c, mut r) = ndjson_append(&srv, &t);
    send_line(&mut c, &ev("db", "whole").to_string());
    assert_eq!(next_ack(&mut r).expect("the first line's ack")["line"], 1);
    let mut w = c.try_clone().unwrap();
    let line = format!("{}\n", ev("db", "trickled"));
    let trickle = std::thread::spawn(move || {
        for b in line.bytes() {
            if w.write_all(format!("1\r\n{}\r\n", b as char).as_bytes())
                .is_err()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(150));
        }
    });
    let started = Instant::now();
    let a = next_ack(&mut r).expect("a problem line");
    assert_eq!(
        (a["line"].as_u64(), a["problem"]["status"].as_u64()),
        (Some(2), Some(408)),
        "{a}"
    );
    assert!(
        a["problem"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("a line not complete")),
        "{a}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(next_ack(&mut r).is_none(), "the stream ended");
    drop(c);
    let _ = trickle.join();
    assert_eq!(srv.get("/v1/runs/inc/events", Some(&t)).seqs(), [1]);
}

/// A token revoked while its NDJSON append stream is open: the stream's next line after
/// the token is asked again (at most a second later) is refused with 401, and nothing
/// more is appended (the stream went on for as long as the connection lived).
#[test]
fn serve_ndjson_stops_at_a_revoked_token() {
    let (env, srv, t) = alice(&["db"], &[]);
    let (mut c, mut r) = ndjson_append(&srv, &t);
    let send = send_line;
    let mut ack = || next_ack(&mut r);
    send(&mut c, &ev("db", "one").to_string());
    assert_eq!(ack().expect("acknowledged")["line"], 1);
    let id = t.split('_').nth(1).unwrap();
    assert_eq!(env.swarm(&["token", "revoke", id]).code, 0);
    // Past the recheck interval: the next line is refused.
    std::thread::sleep(Duration::from_millis(1100));
    send(&mut c, &ev("db", "after the revocation").to_string());
    let a = ack().expect("the refusal");
    assert_eq!(
        (a["line"].as_u64(), a["problem"]["status"].as_u64()),
        (Some(2), Some(401)),
        "{a}"
    );
    let store = env.store().with_user("alice", true).unwrap();
    let seqs: Vec<u64> = crate::util::lib_read(&store, "inc")
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, [1]);
}

/// `GET /v1/search`: the token's user only, findings read as the token's agent (the run's
/// policy hides what it hides from reads), facts for admin tokens only.
/// The facts log (`@facts`) is drawn past every run's read policy: to an agent token it
/// does not exist on any route (404, as another user's run, `%40` spelling included) and
/// `/v1/runs` does not list it; an admin token reads it, but not as one of its agents.
/// (A hypothesis the policy hides from `db` came back to `db` through `@facts` before.)
#[test]
fn serve_hides_the_facts_log_from_agent_tokens() {
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    let lead = token(&env, "alice", &["lead"], "agent");
    let db = token(&env, "alice", &["db"], "agent");
    let admin = token(&env, "alice", &["*"], "admin");
    let r = "/v1/runs/inc";
    srv.post(
        &format!("{r}/events"),
        Some(&lead),
        &json!({"agent_id": "lead", "type": "hypothesis", "content": "SECRET zebra hypothesis about the resolver"}),
    );
    srv.post(
        &format!("{r}/events"),
        Some(&db),
        &ev("db", "resolver p99 at 2 s"),
    );
    put_db_evidence_only_policy(&srv, &lead, "inc");
    assert_eq!(srv.post("/v1/synth", Some(&admin), &json!({})).status, 201);
    // The admin token sees the facts log, unfiltered.
    let all = srv.get("/v1/runs/@facts/events", Some(&admin));
    assert_eq!(all.status, 200);
    assert!(all.body.contains("zebra"), "{}", all.body);
    let listed = |t: &str| -> Vec<String> {
        srv.get("/v1/runs", Some(t)).json()["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["run_id"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    assert!(
        listed(&admin).iter().any(|r| r == "@facts"),
        "{:?}",
        listed(&admin)
    );
    for t in [&db, &lead] {
        for path in [
            "/v1/runs/@facts/events",
            "/v1/runs/%40facts/events",
            "/v1/runs/%40FACTS/events",
            "/v1/runs/@facts",
            "/v1/runs/@facts/board",
            "/v1/runs/@facts/context?budget_bytes=4000",
            "/v1/runs/@facts/replay?at_seq=1",
            "/v1/runs/@facts/events?follow=1",
        ] {
            let got = srv.get(path, Some(t));
            assert_eq!(got.status, 404, "{path}: {}", got.body);
            assert!(!got.body.contains("zebra"), "{path}: {}", got.body);
        }
        assert!(
            !listed(t).iter().any(|r| r.starts_with('@')),
            "{:?}",
            listed(t)
        );
    }
    // An admin token reading *as* an agent gets the agent's view: no facts log there.
    srv.get("/v1/runs/@facts/events?as=db", Some(&admin))
        .problem(404);
    // The run itself still hides the hypothesis from db.
    let own = srv.get(&format!("{r}/events"), Some(&db));
    assert!(!own.body.contains("zebra"), "{}", own.body);
}

#[test]
fn serve_search_answers_as_the_tokens_user_and_agent() {
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    let lead = token(&env, "alice", &["lead"], "agent");
    let db = token(&env, "alice", &["db"], "agent");
    let admin = token(&env, "alice", &["*"], "admin");
    let bob = token(&env, "bob", &["db"], "agent");
    let r = "/v1/runs/inc";
    srv.post(
        &format!("{r}/events"),
        Some(&lead),
        &json!({"agent_id": "lead", "type": "hypothesis", "content": "dns resolver timeouts slow checkout"}),
    );
    srv.post(
        &format!("{r}/events"),
        Some(&db),
        &ev("db", "dns resolver timeouts on db-1"),
    );
    srv.post(
        &format!("{r}/events"),
        Some(&bob),
        &ev("db", "dns resolver timeouts on bob-ledger"),
    );
    put_db_evidence_only_policy(&srv, &lead, "inc");
    let hits = |token: &str, query: &str| -> Vec<(String, String)> {
        let v = srv.get(&format!("/v1/search?{query}"), Some(token)).json();
        assert_eq!(v["mode"], "lexical", "{v}");
        assert!(v["reason"].is_string(), "{v}");
        v["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h["source"].as_str().unwrap().to_string(),
                    h["text"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let finding = |t: &str| ("finding".to_string(), t.to_string());
    let hyp = || finding("dns resolver timeouts slow checkout");
    let ev_db = || finding("dns resolver timeouts on db-1");
    // db may read evidence only; lead reads both; bob reads his own.
    assert_eq!(hits(&db, "q=dns%20resolver%20timeouts"), [ev_db()]);
    let mut l = hits(&lead, "q=dns%20resolver%20timeouts");
    l.sort();
    assert_eq!(l, [ev_db(), hyp()]);
    assert_eq!(
        hits(&bob, "q=dns%20resolver%20timeouts"),
        [finding("dns resolver timeouts on bob-ledger")]
    );
    assert_eq!(hits(&bob, "q=db-1%20checkout"), Vec::new());
    // Filters and limit.
    assert_eq!(hits(&lead, "q=dns&type=hypothesis"), [hyp()]);
    assert_eq!(hits(&lead, "q=dns&agent=db"), [ev_db()]);
    assert_eq!(hits(&lead, "q=dns&limit=1").len(), 1);
    srv.get("/v1/search?q=dns&run=other", Some(&lead))
        .problem(404);
    // Facts (synthesized from every run, past its policy) reach admin tokens only.
    assert_eq!(srv.post("/v1/synth", Some(&admin), &json!({})).status, 201);
    let a = hits(&admin, "q=dns%20resolver%20timeouts");
    assert!(a.iter().any(|(s, _)| s == "fact"), "{a:?}");
    assert!(a.iter().all(|(_, t)| !t.contains("bob")), "{a:?}");
    assert!(hits(&lead, "q=dns").iter().all(|(s, _)| s == "finding"));
    // Refusals.
    srv.get("/v1/search", Some(&lead)).problem(400);
    let p = srv
        .get("/v1/search?q=dns&bogus=1", Some(&lead))
        .problem(400);
    // The accepted parameters named include `as`, which the list serde gives leaves out.
    let detail = p["detail"].as_str().unwrap();
    assert!(
        detail.contains("bogus") && detail.contains("`as`"),
        "{detail}"
    );
    srv.get("/v1/search?q=the", Some(&lead)).problem(400);
    srv.get("/v1/search?q=dns", None).problem(401);
}

/// At most `--max-connections` connections are open at once (each held a task and a
/// descriptor for as long as its client kept it): one past it is answered 503
/// `too-many-connections` with `Retry-After` and closed (it was reset without an answer,
/// so its client could not tell a full server from a dead one), and a place comes back
/// when a connection ends.
#[test]
fn serve_bounds_its_open_connections() {
    let env = Env::fast();
    let srv = Server::start(&env, &["--max-connections", "2"]);
    let health = || -> String {
        let mut c = TcpStream::connect(srv.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let mut buf = Vec::new();
        let _ = c.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    };
    assert!(health().starts_with("HTTP/1.1 200"));
    // Two idle connections hold both places.
    let idle: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(srv.addr()).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let refused = health();
    let (head, body) = refused.split_once("\r\n\r\n").unwrap_or((&refused, ""));
    assert!(head.starts_with("HTTP/1.1 503 "), "{refused}");
    let head = head.to_ascii_lowercase();
    assert!(head.contains("retry-after: 1"), "{refused}");
    assert!(head.contains("connection: close"), "{refused}");
    assert!(
        head.contains("content-type: application/problem+json"),
        "{refused}"
    );
    let p: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(p["type"], "/problems/too-many-connections", "{p}");
    assert!(p["detail"].as_str().unwrap().contains("limit of 2"), "{p}");
    // A client that sends a whole body before it reads still gets the answer (the
    // server reads what it sends rather than reset the connection).
    {
        let mut c = TcpStream::connect(srv.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let body = vec![b'x'; 32 * 1024];
        let head = format!(
            "POST /v1/runs/r/events HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        c.write_all(head.as_bytes()).unwrap();
        let _ = c.write_all(&body);
        let mut buf = Vec::new();
        let _ = c.read_to_end(&mut buf);
        let text = String::from_utf8_lossy(&buf);
        assert!(text.starts_with("HTTP/1.1 503 "), "{text}");
        assert!(text.contains("too-many-connections"), "{text}");
    }
    let m = {
        drop(idle);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = health();
            if r.starts_with("HTTP/1.1 200") || Instant::now() > deadline {
                break r;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    assert!(m.starts_with("HTTP/1.1 200"), "{m}");
    let metrics = srv.get("/metrics", None).body;
    // (One at least: the retries above may be refused until the server sees the idle
    // ones go.)
    assert!(
        metric(&metrics, "swarm_connections_refused_total") >= 1,
        "{metrics}"
    );
}

/// Files under `dir` that process `pid` holds open.
fn files_open_under(pid: u32, dir: &std::path::Path) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|p| p.starts_with(dir))
        .count()
}

/// The server keeps at most `--open-users` users' stores, each with at most
/// `--open-runs-per-user` runs open: the files of the users and runs least recently
/// served are closed, every user's events stay readable, appends go on gap-free, and
/// `/metrics` keeps counting the durable events of the stores it closed. (Every store
/// and every run it had met stayed open for the server's life: it ran out of file
/// descriptors at some number of users and runs.)
#[test]
fn serve_bounds_the_users_and_runs_it_keeps_open() {
    let env = Env::new();
    let srv = Server::start(&env, &["--open-users", "2", "--open-runs-per-user", "2"]);
    let pid = srv.child.id();
    let users: Vec<(String, String)> = (0..5)
        .map(|u| {
            let user = format!("u{u}");
            let t = token(&env, &user, &["db"], "agent");
            (user, t)
        })
        .collect();
    for (_, t) in &users {
        for run in ["r0", "r1", "r2", "r3"] {
            for i in 0..3 {
                let r = srv.post(
                    &format!("/v1/runs/{run}/events?durability=sync"),
                    Some(t),
                    &ev("db", &format!("{run} {i}")),
                );
                assert_eq!(r.status, 201, "{}", r.body);
            }
        }
    }
    let data = env.path();
    assert_eq!(
        files_open_under(pid, &data.join("u0")),
        0,
        "u0's store is open"
    );
    let open = files_open_under(pid, data);
    // (Per run: the segment, SYNCED, SYNC_LOCK, the index's handles, a committer's lock.)
    assert!(open <= 3 * 3 * 8, "{open} files open under the data dir");
    for (user, t) in &users {
        for run in ["r0", "r1", "r2", "r3"] {
            let seqs = srv.get(&format!("/v1/runs/{run}/events"), Some(t)).seqs();
            assert_eq!(seqs, [1, 2, 3], "{user} {run}");
            let r = srv.post(
                &format!("/v1/runs/{run}/events"),
                Some(t),
                &ev("db", "again"),
            );
            assert_eq!(r.json()["events"][0]["seq"], 4, "{user} {run}");
        }
    }
    let metrics = srv.get("/metrics", None).body;
    assert!(
        metric(&metrics, "swarm_durable_events_total") >= 5 * 4 * 3,
        "{metrics}"
    );
}

/// Request bodies held at once are capped, all clients together: a client holding a
/// large body nearly all sent takes its share, a second large one is answered 503 `busy`
/// with `Retry-After`, a small one still passes, and the share comes back when the first
/// connection goes; one that declares a size and sends nothing holds nothing. Before, each held body added its size to the server's memory until
/// an allocation failed and the server aborted.
#[test]
fn serve_bounds_the_bodies_it_holds() {
    let env = Env::fast();
    let srv = Server::start(
        &env,
        &[
            "--body-limit-bytes",
            "65536",
            "--body-budget-bytes",
            "100000",
        ],
    );
    let t = token(&env, "anonymous", &["a"], "agent");
    let post_head = |len: usize| {
        format!(
            "POST /v1/runs/r/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {t}\r\n\
             Content-Type: application/json\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
        )
    };
    let event = |pad: usize| {
        let body = json!({"agent_id": "a", "type": "evidence", "content": "x".repeat(pad)});
        body.to_string()
    };
    let send = |body: &str| -> String {
        let mut c = TcpStream::connect(srv.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(post_head(body.len()).as_bytes()).unwrap();
        let _ = c.write_all(body.as_bytes());
        let mut buf = Vec::new();
        let _ = c.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    };
    // A client that declares a large body and sends nothing holds nothing of it.
    let big = event(60_000);
    let mut idle = TcpStream::connect(srv.addr()).unwrap();
    idle.write_all(post_head(big.len()).as_bytes()).unwrap();
    // A large body, all but its last bytes sent, held.
    let mut holder = TcpStream::connect(srv.addr()).unwrap();
    holder.write_all(post_head(big.len()).as_bytes()).unwrap();
    holder.write_all(&big.as_bytes()[..big.len() - 10]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let refused = send(&big);
    assert!(refused.starts_with("HTTP/1.1 503 "), "{refused}");
    assert!(
        refused.to_ascii_lowercase().contains("retry-after: 1"),
        "{refused}"
    );
    assert!(refused.contains("/problems/busy"), "{refused}");
    let small = send(&event(10));
    assert!(small.starts_with("HTTP/1.1 201 "), "{small}");
    drop(holder);
    let deadline = Instant::now() + Duration::from_secs(10);
    let passed = loop {
        let r = send(&big);
        if r.starts_with("HTTP/1.1 201 ") || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(passed.starts_with("HTTP/1.1 201 "), "{passed}");
    // An NDJSON append stream holds the line it is receiving.
    let mut stream = TcpStream::connect(srv.addr()).unwrap();
    let head = format!(
        "POST /v1/runs/r/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {t}\r\n\
         Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let part = &big.as_bytes()[..big.len() - 10];
    stream
        .write_all(format!("{:x}\r\n", part.len()).as_bytes())
        .unwrap();
    stream.write_all(part).unwrap();
    stream.write_all(b"\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let refused = send(&big);
    assert!(refused.starts_with("HTTP/1.1 503 "), "{refused}");
    drop((idle, stream));
}
