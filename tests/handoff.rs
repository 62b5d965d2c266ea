//! The append hand-off (`store::handoff`): one process commits a run's `sync` appends
//! for every process of its user; a committer that dies or stops loses, duplicates and
//! blocks nothing.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use swarm_memory::{Durability, Error, Event, EventType, NewEvent};

use crate::util::{check_sequence, lib_append, lib_read, Env, Rng};

/// Where a run's committer listens.
fn socket(env: &Env, run: &str) -> std::path::PathBuf {
    env.path()
        .join("anonymous")
        .join(".commit")
        .join(format!("{run}.sock"))
}

fn content_of(e: &Event) -> String {
    e.content.as_str().unwrap_or_default().to_string()
}

/// A store that created `run` with its first append, found no committer at its second,
/// and became the committer at its third.
fn committer_store(env: &Env, run: &str) -> swarm_memory::Store {
    let a = env.store();
    lib_append(&a, run, "created by a");
    lib_append(&a, run, "a appends");
    assert!(!socket(env, run).exists());
    lib_append(&a, run, "a commits");
    assert!(socket(env, run).exists());
    a
}

/// `n` threads appending `make(thread, i)` durably through `b` until `stop`; each
/// returns the events it got back.
fn appenders(
    b: &Arc<swarm_memory::Store>,
    run: &'static str,
    n: usize,
    stop: &Arc<AtomicBool>,
    make: impl Fn(usize, usize) -> NewEvent + Send + Sync + Copy + 'static,
) -> Vec<std::thread::JoinHandle<Vec<Event>>> {
    (0..n)
        .map(|t| {
            let (b, stop) = (b.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut got = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    got.push(b.append(run, make(t, i), Durability::Sync).expect("append"));
                    i += 1;
                }
                got
            })
        })
        .collect()
}

/// Stops `threads` and reads the run: (every acknowledged event, the stored run), the run
/// checked gap-free and holding nothing beyond its three first events and the
/// acknowledged ones.
fn stop_and_read(
    threads: Vec<std::thread::JoinHandle<Vec<Event>>>,
    stop: &AtomicBool,
    store: &swarm_memory::Store,
    run: &str,
) -> (Vec<Event>, Vec<Event>) {
    stop.store(true, Ordering::Relaxed);
    let acked: Vec<Event> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let all = lib_read(store, run);
    check_sequence(&all);
    assert_eq!(
        all.len(),
        3 + acked.len(),
        "stored beyond what was acknowledged"
    );
    (acked, all)
}

#[test]
fn a_second_store_hands_its_sync_appends_to_the_first() {
    let env = Env::new();
    let run = "handed";
    let a = committer_store(&env, run);
    let b = env.store();
    let mut mine = Vec::new();
    for i in 0..20 {
        mine.push(lib_append(&b, run, &format!("from b {i}")));
    }
    let hb = b.handoff_counters();
    assert_eq!(hb.handed, 20, "{hb:?}");
    assert_eq!(b.sync_counters(run).fsyncs, 0, "b synced nothing itself");
    assert!(a.handoff_counters().committed >= 20);
    // Events handed over get generated ids; each came back as stored.
    for e in &mine {
        assert!(e.id.starts_with("swarm:"), "{}", e.id);
    }
    let all = lib_read(&a, run);
    check_sequence(&all);
    assert_eq!(all.len(), 23);
    for (e, want) in all[3..].iter().zip(&mine) {
        assert_eq!(e, want);
    }
    // Refusals cross the wire as the same errors: a stale compare-and-swap, a forbidden
    // type, an id reused for another event.
    let mut cas = NewEvent::new("agent-1", EventType::Evidence, "cas");
    cas.expect_seq = Some(3);
    match b.append(run, cas, Durability::Sync) {
        Err(Error::SeqConflict {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (3, 23)),
        other => panic!("expected a seq conflict, got {other:?}"),
    }
    let mut first = NewEvent::new("agent-1", EventType::Evidence, "one");
    first.id = Some("k1".into());
    let stored = b.append(run, first.clone(), Durability::Sync).unwrap();
    assert_eq!(b.append(run, first, Durability::Sync).unwrap(), stored);
    let mut other = NewEvent::new("agent-1", EventType::Evidence, "two");
    other.id = Some("k1".into());
    let e = b.append(run, other, Durability::Sync).unwrap_err();
    assert_eq!(e.exit_code(), 4, "{e}");
    assert_eq!(b.handoff_counters().handed, 24);
    // `none` appends are not handed over.
    b.append(
        run,
        NewEvent::new("agent-1", EventType::Evidence, "fast"),
        Durability::None,
    )
    .unwrap();
    assert_eq!(b.handoff_counters().handed, 24);
    // The committer leaves: its socket goes, and the next append finds no committer
    // (appends directly), then becomes one itself.
    drop(a);
    assert!(!socket(&env, run).exists());
    lib_append(&b, run, "after a left");
    std::thread::sleep(Duration::from_millis(250));
    lib_append(&b, run, "b commits now");
    assert!(socket(&env, run).exists());
    let all = lib_read(&b, run);
    check_sequence(&all);
    assert_eq!(all.len(), 27);
    assert_eq!(b.handoff_counters().recovered, 0);
}

/// A committer (a `swarm append --stdin` process) is killed with SIGKILL while this
/// process's threads hand it appends: every append returns, each event is stored exactly
/// once, and the answers lost with the committer are recovered (some of them found
/// stored by it, some stored anew).
#[test]
fn a_committer_killed_mid_append_loses_and_duplicates_nothing() {
    let env = Env::new();
    let run = "killed";
    let mut rng = Rng::from_env("handoff_kill");
    lib_append(&env.store(), run, "created");
    let b = Arc::new(env.store());
    let mut acked: Vec<Event> = Vec::new();
    let mut recovered = 0;
    for round in 0..12 {
        let mut committer = spawn_committer(&env, run, round);
        // Past the time this process appends directly after losing its last committer.
        std::thread::sleep(Duration::from_millis(250));
        let stop = Arc::new(AtomicBool::new(false));
        let threads = appenders(&b, run, 6, &stop, move |t, i| {
            let c = format!("r{round} t{t} n{i}");
            let mut ev = NewEvent::new("agent-1", EventType::Evidence, c.as_str());
            // Every other thread names its events: a client id is recovered the same way
            // as a generated one.
            if t % 2 == 1 {
                ev.id = Some(format!("r{round}-t{t}-n{i}"));
            }
            ev
        });
        std::thread::sleep(Duration::from_millis(20 + rng.below(60)));
        committer.kill().unwrap();
        committer.wait().unwrap();
        // Stopped before this process would look for a committer again (and, finding
        // none, become it): the next round's child commits.
        std::thread::sleep(Duration::from_millis(10));
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            acked.extend(t.join().unwrap());
        }
        recovered = b.handoff_counters().recovered;
    }
    let all = lib_read(&b, run);
    check_sequence(&all);
    let mut count: HashMap<String, usize> = HashMap::new();
    for e in &all {
        *count.entry(content_of(e)).or_default() += 1;
    }
    let by_seq: HashMap<u64, &Event> = all.iter().map(|e| (e.seq, e)).collect();
    for e in &acked {
        assert_eq!(count[&content_of(e)], 1, "stored once: {e:?}");
        assert_eq!(by_seq[&e.seq], e, "acknowledged as stored");
    }
    // Only the test's events and the committers' first lines are in the log: nothing
    // was stored twice or without an answer.
    let committer_lines = all
        .iter()
        .filter(|e| content_of(e).starts_with("committer "))
        .count();
    assert_eq!(all.len(), 1 + acked.len() + committer_lines);
    let h = b.handoff_counters();
    eprintln!(
        "hand-off: {h:?}, found stored: {}",
        b.sync_counters(run).recovered_found
    );
    assert!(h.handed > 0, "{h:?}");
    assert!(
        recovered > 0,
        "no kill landed with an append in flight: {h:?}"
    );
    // Some answers were lost after the committer wrote the batch: found, not rewritten
    // (about one in five per run; the check above proves none was stored twice).
    assert!(b.sync_counters(run).recovered_found > 0, "{h:?}");
}

/// A `swarm append --stdin` that appended two events (and so commits for the run), and
/// waits for more lines.
fn spawn_committer(env: &Env, run: &str, round: u32) -> Child {
    let mut child = env
        .cmd(&["append", "--run", run, "--stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn swarm append");
    let mut stdin = child.stdin.take().unwrap();
    // It becomes the committer at its second append.
    for n in 0..2 {
        let line =
            json!({"agent": "c", "type": "evidence", "content": format!("committer {round} {n}")});
        writeln!(stdin, "{line}").unwrap();
    }
    stdin.flush().unwrap();
    // Kept open (leaked into the thread) so the child waits for more.
    std::thread::spawn(move || {
        let _keep = stdin;
        std::thread::sleep(Duration::from_secs(600));
    });
    let mut out = BufReader::new(child.stdout.take().unwrap());
    for _ in 0..2 {
        let mut ack = String::new();
        out.read_line(&mut ack).unwrap();
        assert!(ack.contains("committer"), "{ack}");
    }
    child
}

/// A store that commits for others is dropped while they append: their appends in
/// flight are answered, later ones go directly, nothing is lost or doubled.
#[test]
fn a_committer_dropped_while_others_append_answers_what_it_read() {
    let env = Env::new();
    let run = "dropped";
    let a = committer_store(&env, run);
    let b = Arc::new(env.store());
    let stop = Arc::new(AtomicBool::new(false));
    let threads = appenders(&b, run, 4, &stop, |t, i| {
        NewEvent::new(
            "agent-1",
            EventType::Evidence,
            format!("t{t} n{i}").as_str(),
        )
    });
    std::thread::sleep(Duration::from_millis(50));
    drop(a);
    std::thread::sleep(Duration::from_millis(50));
    let (_, all) = stop_and_read(threads, &stop, &b, run);
    let mut seen = std::collections::HashSet::new();
    for e in &all[3..] {
        assert!(seen.insert(content_of(e)), "stored twice: {e:?}");
    }
    assert!(b.handoff_counters().handed > 0);
}

#[test]
fn one_shot_commands_never_commit_and_swarm_handoff_0_appends_directly() {
    let env = Env::new();
    let run = "oneshot";
    let one = |extra: &[(&str, &str)]| {
        let mut c = env.cmd(&[
            "append",
            "--run",
            run,
            "--agent",
            "x",
            "--type",
            "evidence",
            "--content",
            "one",
        ]);
        for (k, v) in extra {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = out.stdout.split(|&b| b == b'\n').next().unwrap().to_vec();
        serde_json::from_slice::<Event>(&line).expect("event JSON")
    };
    for _ in 0..3 {
        one(&[]);
    }
    // One append each: none of them became the committer.
    assert!(!env.path().join("anonymous").join(".commit").exists());
    let a = env.store();
    for i in 0..3 {
        lib_append(&a, run, &format!("a {i}"));
    }
    assert!(socket(&env, run).exists());
    // A one-shot command hands its append to `a`: its id is a handed-off one.
    assert!(one(&[]).id.contains(".h"));
    // With SWARM_HANDOFF=0 it appends itself: its id is its writer's own.
    assert!(!one(&[("SWARM_HANDOFF", "0")]).id.contains(".h"));
    assert_eq!(lib_read(&a, run).len(), 8);
}

/// The committer's own threads (48, woken in a tree after each fsync) and another
/// store's handed-off appends share groups: every append gets back exactly the event it
/// sent, at the seq it is stored at, once.
#[test]
fn many_local_threads_and_handed_appends_share_groups_and_get_their_own_answers() {
    let env = Env::new();
    let run = "shared";
    let a = Arc::new(committer_store(&env, run));
    let b = Arc::new(env.store());
    let stop = Arc::new(AtomicBool::new(false));
    let make = |t: usize, i: usize| {
        NewEvent::new(
            "agent-1",
            EventType::Evidence,
            format!("t{t} n{i}").as_str(),
        )
    };
    let mut threads = appenders(&a, run, 48, &stop, make);
    threads.extend(appenders(&b, run, 4, &stop, move |t, i| make(100 + t, i)));
    std::thread::sleep(Duration::from_millis(400));
    let (acked, all) = stop_and_read(threads, &stop, &a, run);
    let by_seq: HashMap<u64, &Event> = all.iter().map(|e| (e.seq, e)).collect();
    for e in &acked {
        let stored = by_seq.get(&e.seq).expect("acknowledged seq not stored");
        assert_eq!(
            content_of(stored),
            content_of(e),
            "answered another append's event"
        );
        assert_eq!(stored.id, e.id);
    }
    let thread_of = |e: &Event| -> usize {
        let c = content_of(e);
        c[1..c.find(' ').unwrap()].parse().unwrap()
    };
    let from_a = acked.iter().filter(|e| thread_of(e) < 100).count();
    assert!(
        from_a > 48,
        "the local threads appended too little: {from_a}"
    );
    assert!(b.handoff_counters().handed > 0, "nothing was handed off");
    assert!(a.handoff_counters().committed as usize >= acked.len());
}

/// Reads one length-prefixed message from the committer's socket.
fn read_frame(s: &mut std::os::unix::net::UnixStream) -> Option<serde_json::Value> {
    use std::io::Read;
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut body).ok()?;
    serde_json::from_slice(&body).ok()
}

/// The commit loop reads every connection itself: a batch larger than it reads from one
/// connection in a turn (1 MiB) arrives whole while other processes' appends go on; a
/// request that is not JSON is refused on its connection only; a length over the limit
/// and a request cut by its sender's exit end their connections with nothing written;
/// and the committer goes on serving everyone else.
#[test]
fn the_commit_loop_serves_large_bad_and_cut_requests_without_stalling_others() {
    use std::os::unix::net::UnixStream;
    let env = Env::new();
    let run = "loop";
    let a = committer_store(&env, run);
    let b = Arc::new(env.store());
    let stop = Arc::new(AtomicBool::new(false));
    let threads = appenders(&b, run, 3, &stop, |t, i| {
        NewEvent::new(
            "agent-1",
            EventType::Evidence,
            format!("small {t}.{i}").as_str(),
        )
    });
    // 40 events of 60 KiB: about 2.4 MB in one request.
    let c = env.store();
    let big: Vec<NewEvent> = (0..40)
        .map(|i| {
            let text = format!("big {i} {}", "x".repeat(60 << 10));
            NewEvent::new("agent-2", EventType::Evidence, text.as_str())
        })
        .collect();
    lib_append(&c, run, "c first");
    let stored = c.append_batch(run, big, None, Durability::Sync).unwrap();
    assert_eq!(stored.len(), 40);
    assert!(
        c.handoff_counters().handed >= 1,
        "the big batch was handed over"
    );
    // Raw clients.
    let path = socket(&env, run);
    let mut bad = UnixStream::connect(&path).unwrap();
    let hello = read_frame(&mut bad).expect("hello");
    assert_eq!(hello["user"], "anonymous");
    let junk = b"not json";
    bad.write_all(&(junk.len() as u32).to_le_bytes()).unwrap();
    bad.write_all(junk).unwrap();
    let refused = read_frame(&mut bad).expect("an answer");
    assert!(refused.get("refused").is_some(), "{refused}");
    let mut huge = UnixStream::connect(&path).unwrap();
    read_frame(&mut huge).expect("hello");
    huge.write_all(&u32::MAX.to_le_bytes()).unwrap();
    assert!(read_frame(&mut huge).is_none(), "closed without an answer");
    let mut cut = UnixStream::connect(&path).unwrap();
    read_frame(&mut cut).expect("hello");
    let req = json!({"user": "anonymous", "expect_seq": null, "events": []}).to_string();
    cut.write_all(&(req.len() as u32 + 100).to_le_bytes())
        .unwrap();
    cut.write_all(req.as_bytes()).unwrap();
    drop(cut);
    // The refused connection still works.
    bad.write_all(&(junk.len() as u32).to_le_bytes()).unwrap();
    bad.write_all(junk).unwrap();
    assert!(read_frame(&mut bad).unwrap().get("refused").is_some());
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let acked: Vec<Event> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    assert!(
        acked.len() > 3,
        "the small appends went on: {}",
        acked.len()
    );
    let all = lib_read(&a, run);
    check_sequence(&all);
    // a's three, c's first and its 40 big ones, and the small ones: nothing of the raw
    // clients' requests.
    assert_eq!(all.len(), 3 + 1 + 40 + acked.len());
    for e in stored.iter().chain(&acked) {
        assert_eq!(&all[e.seq as usize - 1], e, "as acknowledged");
    }
    let big: Vec<&Event> = all
        .iter()
        .filter(|e| content_of(e).starts_with("big "))
        .collect();
    assert_eq!(big.len(), 40);
    assert!(
        big.windows(2).all(|w| w[1].seq == w[0].seq + 1),
        "one batch, together"
    );
}

/// Files of `dir` this process holds open (`/proc/self/fd`): segments, marks, locks,
/// index files, committer locks.
fn open_files_under(dir: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|p| p.starts_with(dir))
        .count()
}

/// Appends (three each: the third makes this process the run's committer), an indexed
/// read and the head state of each of `runs` runs, through `s`.
fn use_runs(s: &swarm_memory::Store, runs: usize) {
    for r in 0..runs {
        let run = format!("r{r:02}");
        for i in 0..3 {
            lib_append(s, &run, &format!("{run} {i}"));
        }
        let last = swarm_memory::ReadOptions {
            last: Some(1),
            ..swarm_memory::ReadOptions::default()
        };
        let got: Vec<Event> = s.read(&run, last).unwrap().map(Result::unwrap).collect();
        assert_eq!(got[0].seq, 3);
        assert_eq!(s.head_state(&run).unwrap().state.head_seq, 3);
    }
}

/// A store that meets many runs keeps at most `with_open_runs_max` of them open: the
/// writers, indexes, head states and committers of the runs least recently used are let
/// go (their files closed; their committers stopped, so their sockets are gone), and a
/// run met again goes on where it was, gap-free, through the same store. (A `Store`
/// kept every run's writer, index and committer for life: a server ran out of file
/// descriptors at some number of runs.)
#[test]
fn a_store_keeps_a_bounded_number_of_runs_open() {
    const RUNS: usize = 24;
    // The same work on a store whose bound is past the runs: what is kept without one.
    let unbounded = Env::new();
    let u = unbounded.store();
    use_runs(&u, RUNS);
    let open_unbounded = open_files_under(unbounded.path());
    let env = Env::new();
    let s = env.store().with_open_runs_max(4);
    use_runs(&s, RUNS);
    let open = open_files_under(env.path());
    assert!(
        open <= 5 * 8 && open_unbounded >= RUNS * 4,
        "open files: {open} with a bound of 4 runs, {open_unbounded} without"
    );
    assert!(socket(&unbounded, "r00").exists());
    assert!(
        !socket(&env, "r00").exists(),
        "the oldest run's committer runs on"
    );
    assert!(socket(&env, &format!("r{:02}", RUNS - 1)).exists());
    let totals = s.sync_totals();
    assert_eq!(
        totals.durable_events,
        u.sync_totals().durable_events,
        "the counts of writers let go stay in the totals"
    );
    for r in 0..RUNS {
        let run = format!("r{r:02}");
        assert_eq!(lib_append(&s, &run, "again").seq, 4, "{run}");
        let events = lib_read(&s, &run);
        check_sequence(&events);
        assert_eq!(events.len(), 4, "{run}");
    }
    assert!(open_files_under(env.path()) <= 5 * 8);
}

/// A committer let go past the open-runs bound while another process hands it appends
/// nonstop (that process then commits for the run itself, and the first hands to it):
/// every acknowledged append is stored once, nothing hangs, the run stays gap-free.
#[test]
fn a_committer_let_go_under_load_loses_and_duplicates_nothing() {
    let env = Env::new();
    let a = env.store().with_open_runs_max(1);
    for run in ["e0", "e1", "e2"] {
        for i in 0..3 {
            lib_append(&a, run, &format!("{run} {i}"));
        }
    }
    let b = Arc::new(env.store());
    let stop = Arc::new(AtomicBool::new(false));
    let hs = appenders(&b, "e0", 3, &stop, |t, i| {
        NewEvent::new("b", EventType::Evidence, format!("b {t} {i}"))
    });
    let mut mine = Vec::new();
    let until = std::time::Instant::now() + Duration::from_secs(3);
    let mut i = 0;
    while std::time::Instant::now() < until {
        for run in ["e1", "e2", "e0"] {
            mine.push(lib_append(&a, run, &format!("a {run} {i}")));
        }
        i += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let got: Vec<Event> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
    assert!(!got.is_empty());
    let fresh = env.store();
    let events = lib_read(&fresh, "e0");
    check_sequence(&events);
    let by_id: HashMap<&str, &Event> = events.iter().map(|e| (e.id.as_str(), e)).collect();
    for e in got.iter().chain(mine.iter().filter(|e| e.run_id == "e0")) {
        assert_eq!(
            by_id.get(e.id.as_str()).copied(),
            Some(e),
            "acknowledged {e:?}"
        );
    }
    let acked = got.len() + mine.iter().filter(|e| e.run_id == "e0").count() + 3;
    assert_eq!(events.len(), acked, "stored once each");
}
