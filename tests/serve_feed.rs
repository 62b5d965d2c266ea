//! The SSE tail's shared reader per run (`src/serve/feed.rs`), through real HTTP clients
//! against the real server: many subscribers with different filters on one run while
//! several writers append, a stalled subscriber among readers, a subscriber whose agent
//! the run's policy restricts, and resuming mid-stream while the feed is live.

use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::serve::{put_db_evidence_only_policy, token, Server, Sse};
use crate::serve_cli::metric;
use crate::util::Env;

/// Every event of `run` as `tok` (with `as_agent`) may read it, paging.
fn all_events(srv: &Server, tok: &str, run: &str, as_agent: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut from = 1;
    loop {
        let v = srv
            .get(
                &format!("/v1/runs/{run}/events?from_seq={from}&as={as_agent}"),
                Some(tok),
            )
            .json();
        out.extend(v["events"].as_array().expect("events").iter().cloned());
        match v["next_from_seq"].as_u64() {
            Some(n) => from = n,
            None => return out,
        }
    }
}

/// Reads run events from `sse` until it has `want()` of them (known once the writers are
/// done; heartbeats let it look); the stream must not end or send anything else first.
fn collect(mut sse: Sse, want: Arc<OnceLock<Vec<u64>>>) -> (Vec<u64>, Sse) {
    let mut got = Vec::new();
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(
            Instant::now() < until,
            "still waiting after {} events",
            got.len()
        );
        if let Some(w) = want.get() {
            if got.len() >= w.len() {
                return (got, sse);
            }
        }
        match sse.next_or_comment() {
            None => panic!("the stream ended after {} events", got.len()),
            Some(None) => {}
            Some(Some(m)) => {
                assert_eq!(m.event, None, "{m:?}");
                let e: Value = serde_json::from_str(&m.data).expect("event JSON");
                assert_eq!(m.id, e["seq"].as_u64(), "{m:?}");
                got.push(m.id.expect("id"));
            }
        }
    }
}

/// Waits until `/metrics` shows `name` at `want`.
fn wait_metric(srv: &Server, name: &str, want: u64) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let m = srv.get("/metrics", None).body;
        if metric(&m, name) == want {
            return;
        }
        assert!(Instant::now() < until, "{name} is not {want}\n{m}");
        thread::sleep(Duration::from_millis(50));
    }
}

/// 50 subscribers of one run with mixed filters (agent, type, subject, none), 40 of them
/// connected before 4 writer threads append 2,000 events and 10 while they do (so they
/// join the shared reader mid-flight, after catching up from seq 1): every one gets
/// exactly the events its filter admits, in seq order, with no gap and no duplicate. One
/// shared reader serves them, and it stops with the last of them.
#[test]
fn serve_feed_fifty_filtered_subscribers_get_exactly_their_events() {
    const WRITERS: usize = 4;
    const PER_WRITER: usize = 500;
    let env = Env::fast();
    let srv = Arc::new(Server::start(
        &env,
        &["--heartbeat-ms", "200", "--sse-buffer-events", "4096"],
    ));
    let agents = ["a0", "a1", "a2", "a3"];
    let tok = token(&env, "alice", &agents, "agent");
    srv.post(
        "/v1/runs/inc/events",
        Some(&tok),
        &json!({"agent_id": "a0", "type": "evidence", "content": "first"}),
    );
    let filters: Vec<String> = (0..50)
        .map(|i| match i % 5 {
            0 => String::new(),
            1 => format!("&agent=a{}", i % 4),
            2 => ["&type=evidence", "&type=hypothesis"][i % 2].to_string(),
            3 => format!("&subject=s{}", i % 3),
            _ => format!("&agent=a{}&type=evidence", i % 4),
        })
        .collect();
    let wants: Vec<Arc<OnceLock<Vec<u64>>>> = (0..50).map(|_| Arc::default()).collect();
    let open = |i: usize| {
        let sse = srv.follow(
            &format!("/v1/runs/inc/events?follow=1&as=a0{}", filters[i]),
            &tok,
            None,
        );
        let want = wants[i].clone();
        thread::spawn(move || collect(sse, want).0)
    };
    let mut readers: Vec<_> = (0..40).map(open).collect();
    wait_metric(&srv, "swarm_tail_shared_readers", 1);
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (srv, tok) = (srv.clone(), tok.clone());
            thread::spawn(move || {
                let mut i = 0;
                while i < PER_WRITER {
                    // Single events and small batches, of both types and three subjects.
                    let n = 1 + i % 3;
                    let batch: Vec<Value> = (i..(i + n).min(PER_WRITER))
                        .map(|k| {
                            let kind = ["evidence", "hypothesis"][k % 2];
                            json!({
                                "agent_id": format!("a{w}"),
                                "type": kind,
                                "subject": format!("s{}", k % 3),
                                "content": format!("w{w} e{k}"),
                            })
                        })
                        .collect();
                    let r = srv.post("/v1/runs/inc/events", Some(&tok), &json!(batch));
                    assert_eq!(r.status, 201, "{}", r.body);
                    i += batch.len();
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    readers.extend((40..50).map(open));
    for w in writers {
        w.join().expect("writer");
    }
    let log = all_events(&srv, &tok, "inc", "a0");
    assert_eq!(log.len(), 1 + WRITERS * PER_WRITER);
    for (i, f) in filters.iter().enumerate() {
        let q: Vec<(&str, &str)> = f.split('&').filter_map(|kv| kv.split_once('=')).collect();
        let want: Vec<u64> = log
            .iter()
            .filter(|e| {
                q.iter().all(|(k, v)| match *k {
                    "agent" => e["agent_id"] == *v,
                    "type" => e["type"] == *v,
                    "subject" => e["subject"] == *v,
                    _ => unreachable!(),
                })
            })
            .map(|e| e["seq"].as_u64().unwrap())
            .collect();
        assert!(!want.is_empty(), "filter {f:?}");
        wants[i].set(want).unwrap();
    }
    for (i, r) in readers.into_iter().enumerate() {
        let got = r.join().expect("reader");
        assert_eq!(
            &got,
            wants[i].get().unwrap(),
            "subscriber {i} ({:?})",
            filters[i]
        );
    }
    // The threads dropped their streams: the shared reader goes with the last one.
    wait_metric(&srv, "swarm_tail_subscribers", 0);
    wait_metric(&srv, "swarm_tail_shared_readers", 0);
    wait_metric(&srv, "swarm_tail_watches", 0);
}

/// A subscriber whose client never reads is closed as lagged, naming the first event it
/// was not sent, while the subscribers sharing its run's reader get every event.
#[test]
fn serve_feed_a_stalled_subscriber_lags_alone() {
    let env = Env::fast();
    let srv = Server::start(&env, &["--sse-buffer-events", "8"]);
    let tok = token(&env, "alice", &["db"], "agent");
    let ev = |c: &str| json!({"agent_id": "db", "type": "evidence", "content": c});
    srv.post("/v1/runs/inc/events", Some(&tok), &ev("x"));
    let mut stalled = srv.follow("/v1/runs/inc/events?follow=1", &tok, None);
    let mut readers: Vec<Sse> = (0..3)
        .map(|_| srv.follow("/v1/runs/inc/events?follow=1", &tok, None))
        .collect();
    for r in &mut readers {
        assert_eq!(r.next_seq(), 1);
    }
    // ~21 MiB in batches of 4, each read by every reader before the next is appended:
    // far more than the stalled one's socket buffers and its 8-event queue hold.
    let big = "y".repeat(60_000);
    let mut next = 2;
    for _ in 0..90 {
        let batch: Vec<Value> = (0..4).map(|_| ev(&big)).collect();
        let r = srv.post("/v1/runs/inc/events", Some(&tok), &json!(batch));
        assert_eq!(r.status, 201, "{}", r.body);
        for r in &mut readers {
            for k in 0..4 {
                assert_eq!(r.next_seq(), next + k);
            }
        }
        next += 4;
    }
    let m = srv.get("/metrics", None).body;
    assert_eq!(metric(&m, "swarm_tail_lagged_total"), 1, "{m}");
    assert_eq!(metric(&m, "swarm_tail_shared_readers"), 1, "{m}");
    // The stalled one: what was queued for it, in order, then `lagged` naming the next.
    let expect = stalled.until_lagged();
    assert!(expect < next, "it fell behind before the end");
    assert!(stalled.next().is_none());
    // Resuming from there delivers the rest, and the readers go on.
    let mut again = srv.follow("/v1/runs/inc/events?follow=1", &tok, Some(expect - 1));
    assert_eq!(again.next_seq(), expect);
    srv.post("/v1/runs/inc/events", Some(&tok), &ev("after"));
    for r in &mut readers {
        assert_eq!(r.next_seq(), next);
    }
}

/// Through the shared reader, which reads every event, a subscriber whose agent the
/// run's policy lets read only evidence never gets a hypothesis, while a subscriber on
/// the same feed that may read everything gets them all.
#[test]
fn serve_feed_applies_the_runs_policy_to_each_subscriber() {
    let env = Env::fast();
    let srv = Server::start(&env, &[]);
    let lead = token(&env, "alice", &["lead"], "agent");
    let db = token(&env, "alice", &["db"], "agent");
    let r = "/v1/runs/inc";
    srv.post(
        &format!("{r}/events"),
        Some(&lead),
        &json!({"agent_id": "lead", "type": "evidence", "content": "start"}),
    );
    put_db_evidence_only_policy(&srv, &lead, "inc");
    let head = all_events(&srv, &lead, "inc", "lead").len() as u64;
    // Both follow live, from the next event on: the feed carries everything.
    let from = format!("{r}/events?follow=1&from_seq={}", head + 1);
    let mut as_db = srv.follow(&from, &db, None);
    let mut as_lead = srv.follow(&from, &lead, None);
    for i in 0..60 {
        let kind = ["hypothesis", "evidence", "hypothesis"][i % 3];
        let w = srv.post(
            &format!("{r}/events"),
            Some(&lead),
            &json!({"agent_id": "lead", "type": kind, "content": format!("e{i}")}),
        );
        assert_eq!(w.status, 201, "{}", w.body);
    }
    let m = srv.get("/metrics", None).body;
    assert_eq!(metric(&m, "swarm_tail_shared_readers"), 1, "{m}");
    for i in 0..60 {
        let m = as_lead.next().expect("an event");
        let e: Value = serde_json::from_str(&m.data).unwrap();
        assert_eq!(m.id, Some(head + 1 + i));
        assert_eq!(
            e["type"],
            ["hypothesis", "evidence", "hypothesis"][i as usize % 3]
        );
    }
    for i in 0..20 {
        let m = as_db.next().expect("an event");
        let e: Value = serde_json::from_str(&m.data).unwrap();
        assert_eq!(e["type"], "evidence", "{m:?}");
        assert_eq!(m.id, Some(head + 2 + 3 * i));
    }
    // What it was sent is what a read as db shows.
    let read: Vec<u64> = all_events(&srv, &db, "inc", "db")
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .filter(|s| *s > head)
        .collect();
    assert_eq!(read, (0..20).map(|i| head + 2 + 3 * i).collect::<Vec<_>>());
}

/// A client that reconnects with `Last-Event-ID` while the run's feed is live (another
/// subscriber keeps it running and a writer keeps appending) resumes right after that
/// event, again and again, with no gap and no duplicate.
#[test]
fn serve_feed_resumes_after_last_event_id_while_live() {
    const EVENTS: u64 = 600;
    let env = Env::fast();
    let srv = Arc::new(Server::start(&env, &[]));
    let tok = token(&env, "alice", &["db"], "agent");
    let ev = |c: String| json!({"agent_id": "db", "type": "evidence", "content": c});
    srv.post("/v1/runs/inc/events", Some(&tok), &ev("first".into()));
    let mut keeper = srv.follow("/v1/runs/inc/events?follow=1", &tok, None);
    assert_eq!(keeper.next_seq(), 1);
    let writer = {
        let srv = srv.clone();
        let tok = tok.clone();
        thread::spawn(move || {
            for i in 1..EVENTS {
                let r = srv.post("/v1/runs/inc/events", Some(&tok), &ev(format!("e{i}")));
                assert_eq!(r.status, 201, "{}", r.body);
                if i % 50 == 0 {
                    thread::sleep(Duration::from_millis(20));
                }
            }
        })
    };
    let mut got = Vec::new();
    let mut sse = srv.follow("/v1/runs/inc/events?follow=1", &tok, None);
    let mut reconnects = 0;
    while got.len() < EVENTS as usize {
        got.push(sse.next_seq());
        // Every 37 events, drop the connection and resume after the last one seen.
        if got.len() % 37 == 0 {
            drop(sse);
            sse = srv.follow("/v1/runs/inc/events?follow=1", &tok, got.last().copied());
            reconnects += 1;
        }
    }
    writer.join().expect("writer");
    assert_eq!(got, (1..=EVENTS).collect::<Vec<_>>());
    assert!(reconnects >= 10);
    for s in 2..=EVENTS {
        assert_eq!(keeper.next_seq(), s);
    }
    let m = srv.get("/metrics", None).body;
    assert_eq!(metric(&m, "swarm_tail_shared_readers"), 1, "{m}");
}
