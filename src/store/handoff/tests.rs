//! Hand-off unit tests: the socket writes, a lost answer on a run archived since, a
//! panicking commit thread.

use std::io::Read;
use std::os::unix::net::UnixStream;

/// A store at `dir` whose `run` holds one event ("created"), and a stand-in committer's
/// socket, listening on the run's rendezvous (nothing else commits for it).
fn stand_in_socket(
    dir: &std::path::Path,
    run: &str,
) -> (std::os::unix::net::UnixListener, std::path::PathBuf) {
    use crate::event::{EventType, NewEvent};
    use crate::log::meta::Durability;
    let a = crate::store::Store::open(dir).unwrap();
    let created = NewEvent::new("lead", EventType::Evidence, "created");
    a.append(run, created, Durability::Sync).unwrap();
    let (rendezvous, _, socket) = a.rendezvous(run).unwrap();
    std::fs::create_dir_all(rendezvous).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    (listener, socket)
}

/// Accepts a handing process on a stand-in's socket, greets it as the committer of
/// user "anonymous" at head 1, and reads its request.
fn greet_and_read(listener: &std::os::unix::net::UnixListener) -> (UnixStream, super::Handed) {
    let (s, _) = listener.accept().unwrap();
    let hello = super::Hello {
        v: super::WIRE_VERSION,
        user: "anonymous".into(),
        head: 1,
        pid: std::process::id(),
    };
    super::write_msg(&s, &hello).unwrap();
    let body = super::read_msg(&s).unwrap().unwrap();
    let req: super::Handed = serde_json::from_slice(&body).unwrap();
    (s, req)
}

/// A message larger than the socket's buffer arrives whole, in order.
#[test]
fn send_all_writes_a_large_message_whole() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let msg: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 251) as u8).collect();
    let want = msg.clone();
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        got
    });
    super::send_all(&a, &msg, None).unwrap();
    drop(a);
    assert!(reader.join().unwrap() == want);
}

/// A committer stores a handed batch, the run is closed and archived, and the answer
/// is lost: the handing process finds the batch (its generated ids) in the archive
/// and returns it (it answered "closed and archived" for stored events before). A
/// batch the committer never stored gets that refusal. The committer is a stand-in
/// on the run's socket that stores (or not), archives, and hangs up unanswered.
#[test]
fn a_lost_answer_for_a_run_archived_since_is_found_in_the_archive() {
    use crate::error::Error;
    use crate::event::{EventType, NewEvent};
    use crate::log::meta::Durability;
    use crate::store::Store;
    for stored in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let run = "closing";
        let (listener, _) = stand_in_socket(dir.path(), run);
        let data = dir.path().to_path_buf();
        let committer = std::thread::spawn(move || {
            let (_s, req) = greet_and_read(&listener);
            assert!(req.events[0].id.is_some(), "an id was generated");
            let c = Store::open(&data).unwrap();
            if stored {
                c.append_direct(run, req.events, None, Durability::Sync)
                    .unwrap();
            }
            c.close_run(run, "lead").unwrap();
        });
        let b = Store::open(dir.path()).unwrap();
        let handed = NewEvent::new("agent-1", EventType::Evidence, "handed over");
        let r = b.append(run, handed, Durability::Sync);
        committer.join().unwrap();
        assert_eq!(b.handoff_counters().recovered, 1);
        let archived: Vec<_> = b
            .read(run, crate::query::options::ReadOptions::default())
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        match (stored, r) {
            (true, Ok(e)) => {
                assert_eq!(e.content, "handed over");
                assert!(archived.contains(&e), "as stored: {archived:?}");
            }
            (false, Err(Error::Forbidden(why))) => {
                assert!(why.contains("archived"), "{why}");
                assert!(archived.iter().all(|x| x.content != "handed over"));
            }
            (stored, r) => panic!("stored by the committer: {stored}; answer {r:?}"),
        }
    }
}

/// A committer stores a handed batch and goes away unanswered, and appending the batch
/// here fails too (the run's `LOCK` is not a file): the caller never saw the ids the
/// batch was given, and the committer may have stored it, so the answer says the
/// outcome is unknown (it was the plain I/O error, "not stored": a retry stored the
/// event twice).
#[test]
fn a_lost_answer_whose_recovery_fails_has_an_unknown_outcome() {
    use crate::error::Error;
    use crate::event::{EventType, NewEvent};
    use crate::log::meta::{Durability, LOCK_FILE};
    use crate::store::Store;
    let dir = tempfile::tempdir().unwrap();
    let run = "lost";
    let (listener, _) = stand_in_socket(dir.path(), run);
    let data = dir.path().to_path_buf();
    let lock_path = Store::open(dir.path())
        .unwrap()
        .run_dir(run)
        .unwrap()
        .join(LOCK_FILE);
    let lock_path2 = lock_path.clone();
    let committer = std::thread::spawn(move || {
        let (_s, req) = greet_and_read(&listener);
        let c = Store::open(&data).unwrap();
        c.append_direct(run, req.events, None, Durability::Sync)
            .unwrap();
        drop(c);
        std::fs::remove_file(&lock_path2).unwrap();
        std::fs::create_dir(&lock_path2).unwrap();
    });
    let b = Store::open(dir.path()).unwrap();
    let handed = NewEvent::new("agent-1", EventType::Evidence, "handed over");
    let r = b.append(run, handed, Durability::Sync);
    committer.join().unwrap();
    assert_eq!(b.handoff_counters().recovered, 1);
    assert!(
        matches!(&r, Err(Error::Io { source, .. }) if source.to_string().contains("unknown")),
        "{r:?}"
    );
    drop(b);
    std::fs::remove_dir(&lock_path).unwrap();
    let c = Store::open(dir.path()).unwrap();
    let stored: Vec<_> = c
        .read(run, crate::query::options::ReadOptions::default())
        .unwrap()
        .map(|e| e.unwrap().content.to_string())
        .collect();
    assert_eq!(
        stored.iter().filter(|t| t.contains("handed over")).count(),
        1,
        "{stored:?}"
    );
}

/// A handed batch of id-less events (given generated ids by the handing process) to a
/// run closed since is refused at once: it is no retry, so the archive is not read for
/// it (it was, in full, for each such batch, on the commit thread).
#[test]
fn handed_batches_to_a_closed_run_do_not_read_its_archive() {
    use crate::error::Error;
    use crate::event::{EventType, NewEvent};
    use crate::log::meta::Durability;
    use crate::store::Store;
    let dir = tempfile::tempdir().unwrap();
    let run = "closing";
    let ev = |c: &str| NewEvent::new("agent-1", EventType::Evidence, c);
    let a = Store::open(dir.path()).unwrap();
    // (The run's first append creates it, the next ones look for a committer and
    // then become it.)
    for c in ["one", "two", "three"] {
        a.append(run, ev(c), Durability::Sync).unwrap();
    }
    let b = Store::open(dir.path()).unwrap();
    b.append(run, ev("four"), Durability::Sync).unwrap();
    assert!(b.hands_off(run), "b hands its appends to a");
    Store::open(dir.path())
        .unwrap()
        .close_run(run, "lead")
        .unwrap();
    for _ in 0..3 {
        let r = b.append(run, ev("late"), Durability::Sync);
        assert!(
            matches!(&r, Err(Error::Forbidden(w)) if w.contains("archived")),
            "{r:?}"
        );
    }
    let reads = super::super::archive::ARCHIVE_READS
        .lock()
        .unwrap()
        .iter()
        .filter(|p| p.starts_with(dir.path()))
        .count();
    assert_eq!(reads, 0);
}

/// Looking for a run's committer (up to `HELLO_TIMEOUT` when it does not greet) holds
/// no lock other runs' appends need: they stalled behind it.
#[test]
fn a_committer_that_does_not_greet_stalls_no_other_run() {
    use crate::event::{EventType, NewEvent};
    use crate::log::meta::Durability;
    use crate::store::Store;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let ev = || NewEvent::new("agent-1", EventType::Evidence, "e");
    let a = Store::open(dir.path()).unwrap();
    for run in ["slow", "other"] {
        a.append(run, ev(), Durability::Sync).unwrap();
    }
    let (rendezvous, _, socket) = a.rendezvous("slow").unwrap();
    drop(a);
    std::fs::create_dir_all(rendezvous).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let (accepted, on_accept) = std::sync::mpsc::channel();
    let (done, on_done) = std::sync::mpsc::channel::<()>();
    let stand_in = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        accepted.send(()).unwrap();
        // No hello until the other run's append is done (or the test gives up).
        let _ = on_done.recv_timeout(Duration::from_secs(10));
        drop(s);
    });
    let b = std::sync::Arc::new(Store::open(dir.path()).unwrap());
    // The first append of each run only looks (it connects, never commits).
    let b2 = b.clone();
    let slow = std::thread::spawn(move || b2.append("slow", ev(), Durability::Sync));
    on_accept.recv_timeout(Duration::from_secs(10)).unwrap();
    let t = Instant::now();
    b.append("other", ev(), Durability::Sync).unwrap();
    let took = t.elapsed();
    done.send(()).unwrap();
    stand_in.join().unwrap();
    slow.join().unwrap().unwrap();
    assert!(
        took < Duration::from_secs(1),
        "another run's append waited {took:?} for the look for this run's committer"
    );
}

/// A committer that reads a handed batch and does not answer (a stopped process) holds
/// the append no longer than the answer wait: it returns an unknown outcome (it waited
/// for as long as the committer was stopped), and the run's next append goes directly.
#[test]
fn a_committer_that_does_not_answer_holds_an_append_for_a_bounded_time() {
    use crate::error::Error;
    use crate::event::{EventType, NewEvent};
    use crate::log::meta::Durability;
    use crate::store::Store;
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let run = "stopped";
    let ev = || NewEvent::new("agent-1", EventType::Evidence, "e");
    let (listener, socket) = stand_in_socket(dir.path(), run);
    super::lock(&super::peer::ANSWER_WAIT_FOR_TESTS).push((socket.clone(), 300));
    let (done, on_done) = std::sync::mpsc::channel::<()>();
    let stand_in = std::thread::spawn(move || {
        let _conn = greet_and_read(&listener);
        // Stopped: no answer (until the test is done).
        let _ = on_done.recv_timeout(Duration::from_secs(30));
    });
    let b = Store::open(dir.path()).unwrap();
    let r = b.append(run, ev(), Durability::Sync);
    assert!(
        matches!(&r, Err(Error::Io { source, .. })
            if source.to_string().contains("not answered") && source.to_string().contains("unknown")),
        "{r:?}"
    );
    assert_eq!(b.append(run, ev(), Durability::Sync).unwrap().seq, 2);
    done.send(()).unwrap();
    stand_in.join().unwrap();
}

/// The commit thread panics with an append in flight: its waiter gets an error saying
/// its outcome is unknown (it waited for ever before); then, under many threads of this
/// store and of a handing one, every append returns, the log stays gap-free with each
/// acknowledged event once, and the committer's lock is let go: another store commits
/// (the handing store or a third one).
#[test]
fn a_panicking_commit_thread_hangs_nothing() {
    use crate::error::Error;
    use crate::event::{EventType, NewEvent};
    use crate::log::meta::Durability;
    use crate::store::Store;
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let run = "panics";
    let ev = |c: String| NewEvent::new("agent-1", EventType::Evidence, c.as_str());
    let a = Arc::new(Store::open(dir.path()).unwrap());
    for i in 0..3 {
        a.append(run, ev(format!("a setup {i}")), Durability::Sync)
            .unwrap();
    }
    let (_, _, socket) = a.rendezvous(run).unwrap();
    assert!(socket.exists(), "a commits");
    let b = Arc::new(Store::open(dir.path()).unwrap());
    b.append(run, ev("b setup".into()), Durability::Sync)
        .unwrap();
    assert_eq!(b.handoff_counters().handed, 1);

    *super::lock(&super::PANIC_IN_NEXT_COMMIT) = Some(socket.clone());
    // Alone in the queue: the panicking group holds this append, whose waiter is
    // answered as the commit thread unwinds.
    let r = a.append(run, ev("in the panicking group".into()), Durability::Sync);
    // An unknown outcome (it was an `Invalid`, a 400 "bad request" over HTTP).
    match r {
        Err(e @ Error::Io { .. }) => {
            assert!(e.outcome_unknown(), "{e}");
            assert!(e.to_string().contains("commit thread failed"), "{e}")
        }
        r => panic!("{r:?}"),
    }
    assert!(
        super::lock(&super::PANIC_IN_NEXT_COMMIT).is_none(),
        "it panicked"
    );
    // (Removed as the commit thread unwinds, right after it answered.)
    let t = std::time::Instant::now();
    while socket.exists() && t.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(!socket.exists(), "the socket is removed");
    let (tx, rx) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    for t in 0..6 {
        let (s, tx) = (if t < 4 { a.clone() } else { b.clone() }, tx.clone());
        threads.push(std::thread::spawn(move || {
            for i in 0..20 {
                let c = format!("t{t} n{i}");
                let r = s.append(run, ev(c.clone()), Durability::Sync);
                tx.send((c, r)).unwrap();
            }
        }));
    }
    drop(tx);
    let mut answers = Vec::new();
    while answers.len() < 120 {
        match rx.recv_timeout(std::time::Duration::from_secs(30)) {
            Ok(a) => answers.push(a),
            Err(e) => panic!("{} of 120 appends returned: {e}", answers.len()),
        }
    }
    for t in threads {
        t.join().unwrap();
    }
    let failed: Vec<&String> = answers
        .iter()
        .filter_map(|(c, r)| match r {
            Ok(_) => None,
            Err(Error::Invalid { reason, .. }) if reason.contains("commit thread failed") => {
                Some(c)
            }
            Err(e) => panic!("{c}: {e}"),
        })
        .collect();
    let log: Vec<crate::event::Event> = a
        .read(run, crate::query::options::ReadOptions::default())
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    for (i, e) in log.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "gap-free");
    }
    let count = |c: &str| log.iter().filter(|e| e.content == c).count();
    for (c, r) in &answers {
        match r {
            Ok(e) => {
                assert_eq!(count(c), 1, "{c} stored once");
                assert_eq!(&log[e.seq as usize - 1], e, "as acknowledged");
            }
            // Unknown outcome: stored once or not at all.
            Err(_) => assert!(count(c) <= 1, "{c}"),
        }
    }
    assert!(
        failed.len() < 120,
        "appends after the panic go on: {} failed",
        failed.len()
    );
    // The lock is free: a third store becomes the committer at its second append.
    let c = Store::open(dir.path()).unwrap();
    c.append(run, ev("c 1".into()), Durability::Sync).unwrap();
    c.append(run, ev("c 2".into()), Durability::Sync).unwrap();
    assert!(socket.exists(), "another store commits");
    b.append(run, ev("b after".into()), Durability::Sync)
        .unwrap();
}

/// A peer that went away is an error (`EPIPE`), never a signal.
#[test]
fn send_all_to_a_closed_peer_is_an_error() {
    let (a, b) = UnixStream::pair().unwrap();
    drop(b);
    let e = super::send_all(&a, b"hello", None).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
}

/// A committing store's appends start automatic prunes through its commit loop, whose
/// summaries start none of their own: once `wait_background` (what a command-line
/// writer calls before it exits) returns, no prune runs, so a process that exits then
/// leaves no summary written past the durable mark. (The summary's own append started a
/// prune of its own, on writers nobody waited for: CI's `check_run` found such a frame
/// after every process had exited.) Every round's run verifies clean.
#[test]
fn after_wait_background_no_prune_is_left_running() {
    use crate::event::{EventType, NewEvent};
    use crate::log::meta::Durability;
    use crate::store::Store;
    let policy: crate::fold::rules::Policy =
        serde_json::from_str(r#"{"prune_max_entries": 3}"#).unwrap();
    let mut pruned = 0;
    for _ in 0..6 {
        let dir = tempfile::tempdir().unwrap();
        let run = "pruned";
        let a = Store::open(dir.path()).unwrap();
        let start = NewEvent::new("lead", EventType::Decision, "start");
        a.append(run, start, Durability::Sync).unwrap();
        a.set_policy(run, "lead", &policy).unwrap();
        for i in 0..15 {
            let text = format!("reading {i}");
            let ev = NewEvent::new("metrics", EventType::Evidence, text.as_str());
            a.append(run, ev, Durability::Sync).unwrap();
        }
        assert!(
            matches!(
                super::lock(&a.handoff.map).get(run),
                Some(super::Route::Commit(_))
            ),
            "the store commits for the run"
        );
        assert!(a.wait_background(std::time::Duration::from_secs(30)));
        drop(a);
        let b = Store::open(dir.path()).unwrap();
        let rep = b.verify(run, |_| {}).unwrap();
        assert!(rep.ok && rep.unsynced_records == 0, "{rep:?}");
        let read = b
            .read(run, crate::query::options::ReadOptions::default())
            .unwrap()
            .map(|e| e.unwrap());
        pruned += read.filter(|e| e.kind == EventType::Summary).count();
    }
    assert!(pruned > 0, "no automatic prune ran");
}

/// Clients that send a batch whose answer overflows their socket buffer and then never
/// read cannot hold the run's appends for long: a group's answers get one deadline
/// together (`ANSWERS_WRITE_TIMEOUT`), not 5 s each, and each stalled connection is shut.
/// Another process's appends go back to the committer within 4 s (1.1 s measured; 5.1 s
/// before, when each stalled answer had 5 s: it appended directly meanwhile), and the
/// stalled batches are stored once each.
#[test]
fn clients_that_do_not_read_their_answers_do_not_stall_the_run() {
    use crate::event::{EventType, NewEvent};
    use crate::log::meta::Durability;
    use crate::store::Store;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let run = "stalled";
    let ev = |c: String| NewEvent::new("agent-1", EventType::Evidence, c.as_str());
    let a = Store::open(dir.path()).unwrap();
    for i in 0..3 {
        a.append(run, ev(format!("a setup {i}")), Durability::Sync)
            .unwrap();
    }
    let (_, _, socket) = a.rendezvous(run).unwrap();
    assert!(socket.exists(), "a commits");
    // Three raw clients, each with a batch of about 2 MB (its answer is larger than a
    // Unix socket's buffer), none of which reads its answer.
    let mut stalled = Vec::new();
    for c in 0..3 {
        let s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        super::read_msg(&s).unwrap().expect("hello");
        let events: Vec<NewEvent> = (0..32)
            .map(|i| ev(format!("stalled {c}.{i} {}", "x".repeat(60 << 10))))
            .collect();
        let req = super::Handed {
            user: "anonymous".into(),
            expect_seq: None,
            events: a.check_batch(run, events, None).unwrap(),
        };
        super::write_msg(&s, &req).unwrap();
        stalled.push(s);
    }
    // Another process appends until the committer takes one of its appends again
    // (while the committer is held, a process appends directly after the hello's 2 s).
    let b = Store::open(dir.path()).unwrap();
    let t = Instant::now();
    let mut n = 0;
    while b.handoff_counters().handed == 0 && t.elapsed() < Duration::from_secs(10) {
        b.append(run, ev(format!("b {n}")), Durability::Sync)
            .unwrap();
        n += 1;
    }
    let took = t.elapsed();
    assert!(
        b.handoff_counters().handed >= 1 && took < Duration::from_secs(4),
        "the committer took no append for {took:?} behind clients that do not read"
    );
    let log: Vec<crate::event::Event> = a
        .read(run, crate::query::options::ReadOptions::default())
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    for c in 0..3 {
        let n = log
            .iter()
            .filter(|e| {
                e.content
                    .as_str()
                    .is_some_and(|s| s.starts_with(&format!("stalled {c}.")))
            })
            .count();
        assert_eq!(n, 32, "client {c}'s batch stored once, whole");
    }
    drop(stalled);
}

/// Partial messages are bounded over all connections (`BUFFERED_MAX`, 16 MiB in unit
/// tests): two clients that each send most of a 12 MiB message and stop hold at most
/// that much; the one whose bytes would pass it is ended, the other stays connected,
/// and appends go on.
#[test]
fn partial_messages_are_bounded_over_all_connections() {
    use crate::event::{EventType, NewEvent};
    use crate::log::meta::Durability;
    use crate::store::Store;
    use std::io::{Read, Write};
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let run = "trickle";
    let ev = |c: &str| NewEvent::new("agent-1", EventType::Evidence, c);
    let a = Store::open(dir.path()).unwrap();
    for i in 0..3 {
        a.append(run, ev(&format!("a {i}")), Durability::Sync)
            .unwrap();
    }
    let (_, _, socket) = a.rendezvous(run).unwrap();
    let body = vec![b'x'; 10 << 20];
    let mut clients = Vec::new();
    for _ in 0..2 {
        let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        super::read_msg(&s).unwrap().expect("hello");
        s.write_all(&(12u32 << 20).to_le_bytes()).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        // The second client's writes fail once the committer ends its connection.
        let _ = s.write_all(&body);
        clients.push(s);
    }
    // Ended: its read sees the end (or a reset); the other is still open (no data, the
    // read times out).
    let ended = |s: &mut std::os::unix::net::UnixStream| {
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut b = [0u8; 1];
        match s.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        }
    };
    let states: Vec<bool> = clients.iter_mut().map(ended).collect();
    assert_eq!(states, vec![false, true], "the second connection is ended");
    a.append(run, ev("after"), Durability::Sync).unwrap();
    let b = Store::open(dir.path()).unwrap();
    b.append(run, ev("b after"), Durability::Sync).unwrap();
    assert_eq!(b.handoff_counters().handed, 1, "the committer still serves");
}
