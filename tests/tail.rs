//! The live tail across real processes: concurrent writer processes, SIGKILL and cursor
//! resume, polling only, a half-written last frame, and the async `Stream`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use swarm_memory::{
    log::{frame, segment, watermark},
    Durability, Event, EventType, FsStorage, LogOptions, NewEvent, Store, Tail, TailOptions,
    Visibility,
};

/// Every wait in these tests ends by this deadline (they finish in seconds).
const DEADLINE: Duration = Duration::from_secs(60);

fn swarm(data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_swarm"));
    c.arg("--data-dir").arg(data);
    c
}

/// A run created with small segments, so that the tests cross many rotations (writer
/// processes use the segment size stored in the run).
fn small_segment_store(data: &Path) -> Store {
    Store::open_with(
        Arc::new(FsStorage),
        data,
        LogOptions {
            segment_bytes: 4096,
            ..LogOptions::default()
        },
    )
    .unwrap()
}

/// A child process whose stdout lines are collected by a thread.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
    got: Vec<String>,
}

impl Proc {
    fn spawn(mut cmd: Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(out);
            loop {
                let mut line = Vec::new();
                match r.read_until(b'\n', &mut line) {
                    // A line cut by a kill has no newline: it was never fully printed.
                    Ok(_) if line.ends_with(b"\n") => {
                        line.pop();
                        if tx.send(String::from_utf8(line).unwrap()).is_err() {
                            return;
                        }
                    }
                    _ => return,
                }
            }
        });
        Proc {
            child,
            lines: rx,
            got: Vec::new(),
        }
    }

    /// Collects lines until `done` holds for them, or fails at the deadline.
    fn wait_until(&mut self, what: &str, done: impl Fn(&[String]) -> bool) {
        let end = Instant::now() + DEADLINE;
        while !done(&self.got) {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.got.push(l),
                Err(_) => panic!("timed out waiting for {what}; got {} lines", self.got.len()),
            }
        }
    }

    fn wait_lines(&mut self, n: usize) {
        self.wait_until(&format!("{n} lines"), |g| g.len() >= n);
    }

    /// SIGKILLs the process and returns every whole line it printed.
    fn kill(mut self) -> Vec<String> {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        // The reader thread drains the pipe to EOF, then drops the sender.
        while let Ok(l) = self.lines.recv_timeout(DEADLINE) {
            self.got.push(l);
        }
        std::mem::take(&mut self.got)
    }

    fn stdin(&mut self) -> ChildStdin {
        self.child.stdin.take().unwrap()
    }
}

impl Drop for Proc {
    /// A failed test must not leave a following tail running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn seqs(lines: &[String]) -> Vec<u64> {
    lines
        .iter()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

fn last_seq_is(lines: &[String], seq: u64) -> bool {
    lines
        .last()
        .is_some_and(|l| seqs(std::slice::from_ref(l))[0] == seq)
}

/// The NDJSON lines a writer process gets for its `i`-th entry (every fourth is a batch of 3).
fn writer_input(agent: &str, from: usize, to: usize) -> String {
    let ev = |i: usize, k: usize| json!({"agent_id": agent, "type": "evidence", "content": format!("{agent}-{i}-{k}")});
    (from..to)
        .map(|i| {
            if i % 4 == 3 {
                format!("{}\n", json!([ev(i, 0), ev(i, 1), ev(i, 2)]))
            } else {
                format!("{}\n", ev(i, 0))
            }
        })
        .collect()
}

fn entries(from: usize, to: usize) -> usize {
    (from..to).map(|i| if i % 4 == 3 { 3 } else { 1 }).sum()
}

fn read_all(data: &Path, run: &str) -> Vec<String> {
    let out = swarm(data).args(["read", "--run", run]).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn tail_follow(data: &Path, run: &str, extra: &[&str]) -> Proc {
    let mut c = swarm(data);
    c.args(["tail", "--run", run, "--follow"]).args(extra);
    Proc::spawn(c)
}

#[test]
fn four_writer_processes_tailers_before_during_and_after_get_every_event_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let run = "busy";
    // Started before the run even exists.
    let mut before = tail_follow(data, run, &[]);
    let store = small_segment_store(data);
    store
        .append(
            run,
            NewEvent::new("lead", EventType::Decision, "start"),
            Durability::Sync,
        )
        .unwrap();
    let per_writer = 40;
    let mut writers: Vec<Proc> = (0..4)
        .map(|_| {
            let mut c = swarm(data);
            c.args(["append", "--run", run, "--stdin"]);
            Proc::spawn(c)
        })
        .collect();
    let mut inputs: Vec<ChildStdin> = writers.iter_mut().map(Proc::stdin).collect();
    for (w, input) in inputs.iter_mut().enumerate() {
        input
            .write_all(writer_input(&format!("w{w}"), 0, per_writer / 2).as_bytes())
            .unwrap();
    }
    let half = 1 + 4 * entries(0, per_writer / 2);
    before.wait_lines(half);
    // Started while the second half is still to be written.
    let during = tail_follow(data, run, &[]);
    for (w, input) in inputs.iter_mut().enumerate() {
        input
            .write_all(writer_input(&format!("w{w}"), per_writer / 2, per_writer).as_bytes())
            .unwrap();
    }
    drop(inputs);
    for mut w in writers {
        assert!(w.child.wait().unwrap().success());
    }
    let after = tail_follow(data, run, &[]);
    // A last event marks the end: everything before it has been delivered once it is.
    let total = 1 + 4 * entries(0, per_writer) as u64;
    let end = store
        .append(
            run,
            NewEvent::new("lead", EventType::Decision, "end"),
            Durability::Sync,
        )
        .unwrap();
    assert_eq!(end.seq, total + 1);
    let log = read_all(data, run);
    assert_eq!(log.len() as u64, total + 1);
    let segments = segment::list_segments(&FsStorage, &data.join("anonymous").join(run)).unwrap();
    assert!(segments.len() > 10, "only {} segments", segments.len());
    for (name, mut t) in [("before", before), ("during", during), ("after", after)] {
        t.wait_until("the end marker", |g| last_seq_is(g, end.seq));
        let got = t.kill();
        // Exactly once, in order, and byte-for-byte what `swarm read` prints.
        assert_eq!(
            seqs(&got),
            (1..=end.seq).collect::<Vec<_>>(),
            "tailer {name}"
        );
        assert_eq!(got, log, "tailer {name}");
    }
    // Each writer's entries appear in the order it wrote them.
    for w in 0..4 {
        let agent = format!("w{w}");
        let mine: Vec<String> = log
            .iter()
            .map(|l| serde_json::from_str::<Event>(l).unwrap())
            .filter(|e| e.agent_id == agent)
            .map(|e| e.content.as_str().unwrap().to_string())
            .collect();
        let want: Vec<String> = (0..per_writer)
            .flat_map(|i| {
                let k = if i % 4 == 3 { 3 } else { 1 };
                (0..k).map(move |k| format!("w{w}-{i}-{k}"))
            })
            .collect();
        assert_eq!(mine, want);
    }
}

#[test]
fn a_killed_tail_resumes_from_its_cursor_at_least_once_with_at_most_one_repeat() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let run = "resume";
    let store = small_segment_store(data);
    store
        .append(
            run,
            NewEvent::new("lead", EventType::Decision, "start"),
            Durability::Sync,
        )
        .unwrap();
    let cursor = data.join("lead.cursor");
    let cursor_arg = cursor.to_str().unwrap();
    let mut writer = {
        let mut c = swarm(data);
        c.args(["append", "--run", run, "--stdin"]);
        Proc::spawn(c)
    };
    let mut input = writer.stdin();
    let mut outputs: Vec<Vec<String>> = Vec::new();
    let mut fed = 0;
    for round in 0..3 {
        let mut t = tail_follow(data, run, &["--cursor-file", cursor_arg]);
        // Feed the writer and kill the tail while it is still receiving that round.
        input
            .write_all(writer_input("w", fed, fed + 60).as_bytes())
            .unwrap();
        input.flush().unwrap();
        fed += 60;
        let first_new = outputs
            .last()
            .and_then(|o| seqs(o).last().copied())
            .unwrap_or(0);
        t.wait_until("some events of this round", |g| {
            g.len() >= 10 && seqs(g).last().is_some_and(|&s| s > first_new + 10)
        });
        let got = t.kill();
        assert!(!got.is_empty(), "round {round}");
        outputs.push(got);
    }
    drop(input);
    assert!(writer.child.wait().unwrap().success());
    let end = store
        .append(
            run,
            NewEvent::new("lead", EventType::Decision, "end"),
            Durability::Sync,
        )
        .unwrap();
    let mut last = tail_follow(data, run, &["--cursor-file", cursor_arg]);
    last.wait_until("the end marker", |g| last_seq_is(g, end.seq));
    outputs.push(last.kill());

    // Every run of the tail delivers consecutive seqs; each restart begins after the
    // last event the previous one printed, or repeats exactly that one (printed, killed
    // before its cursor was saved).
    let mut union = Vec::new();
    let mut prev_last = 0;
    for (i, out) in outputs.iter().enumerate() {
        let s = seqs(out);
        assert!(s.windows(2).all(|w| w[1] == w[0] + 1), "run {i}: {s:?}");
        assert!(
            s[0] == prev_last + 1 || (s[0] == prev_last && prev_last > 0),
            "run {i} starts at {} after {prev_last}",
            s[0]
        );
        prev_last = *s.last().unwrap();
        union.extend(s);
    }
    union.dedup();
    assert_eq!(union, (1..=end.seq).collect::<Vec<_>>());
    // The last tail was killed too, after printing the end marker: its cursor holds the
    // marker or the event before it, and a one-shot tail from it prints at most the marker.
    let saved: Value = serde_json::from_slice(&std::fs::read(&cursor).unwrap()).unwrap();
    let saved = saved["seq"].as_u64().unwrap();
    assert!(
        saved == end.seq || saved + 1 == end.seq,
        "cursor at {saved}"
    );
    let rest = swarm(data)
        .args(["tail", "--run", run, "--cursor-file", cursor_arg])
        .output()
        .unwrap();
    assert!(rest.status.success());
    let rest: Vec<String> = String::from_utf8(rest.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(seqs(&rest), (saved + 1..=end.seq).collect::<Vec<_>>());
}

#[test]
fn polling_only_still_delivers() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let run = "polled";
    let mut t = tail_follow(
        data,
        run,
        &["--no-notify", "--poll-ms", "10", "--type", "decision"],
    );
    let mut c = swarm(data);
    c.args(["append", "--run", run, "--stdin"]);
    let mut w = Proc::spawn(c);
    let body: String = (0..30)
        .map(|i| {
            let kind = if i % 3 == 0 { "decision" } else { "evidence" };
            format!(
                "{}\n",
                json!({"agent_id": "a", "type": kind, "content": format!("n{i}")})
            )
        })
        .collect();
    let mut input = w.stdin();
    input.write_all(body.as_bytes()).unwrap();
    drop(input);
    assert!(w.child.wait().unwrap().success());
    t.wait_until("the last decision", |g| last_seq_is(g, 28));
    let got = t.kill();
    assert_eq!(seqs(&got), (1..=28).step_by(3).collect::<Vec<_>>());
}

/// A following tail goes on after `SYNCED` is lost and rebuilt by a reader: the rebuilt
/// file is a new one, which the tail (holding the old one open, and watching it) opens
/// again once idle for a while. It stopped for good, without an error, before.
#[test]
fn a_following_tail_survives_synced_lost_and_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let run = "rebuilt";
    // Three single-event frames a writer process appends (`writer_input`).
    let append = |from: usize| {
        let mut w = Proc::spawn({
            let mut c = swarm(data);
            c.args(["append", "--run", run, "--stdin"]);
            c
        });
        w.stdin()
            .write_all(writer_input("a", from, from + 3).as_bytes())
            .unwrap();
        assert!(w.child.wait().unwrap().success());
    };
    append(0);
    let mut t = tail_follow(data, run, &[]);
    t.wait_lines(3);
    std::fs::remove_file(data.join("anonymous").join(run).join("SYNCED")).unwrap();
    assert_eq!(read_all(data, run).len(), 3, "a read rebuilds SYNCED");
    append(4);
    t.wait_until("the events after the rebuild", |g| last_seq_is(g, 6));
    assert_eq!(seqs(&t.kill()), (1..=6).collect::<Vec<_>>());
}

/// Appends bytes to the end of a file, as a writer's `pwrite` would.
fn append_raw(path: &Path, bytes: &[u8]) -> u64 {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    // Where the next frame goes: the end of the frames, before any preallocated fill.
    let at = std::fs::read(path)
        .unwrap()
        .iter()
        .rposition(|&b| b != 0)
        .map_or(0, |i| i as u64 + 1);
    f.write_all_at(bytes, at).unwrap();
    at + bytes.len() as u64
}

/// Moves the visible and durable marks, as a writer does after its fsync.
fn set_visible(run_dir: &Path, seg: u64, off: u64) {
    let pos = watermark::Pos { seg, off };
    let m = watermark::Marks {
        durable: pos,
        visible: pos,
        ..watermark::Marks::default()
    };
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(run_dir.join("SYNCED"))
        .unwrap();
    f.write_all_at(&watermark::encode(m), 0).unwrap();
}

fn segment_path(run_dir: &Path) -> PathBuf {
    let segs = segment::list_segments(&FsStorage, run_dir).unwrap();
    segment::segment_path(run_dir, *segs.last().unwrap())
}

#[test]
fn a_half_written_last_frame_is_not_corruption_and_is_delivered_once_complete() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let run = "torn";
    let store = Store::open(data).unwrap();
    let first = store
        .append(
            run,
            NewEvent::new("a", EventType::Evidence, "one"),
            Durability::Sync,
        )
        .unwrap();
    let run_dir = data.join("anonymous").join(run);
    let seg = segment_path(&run_dir);
    // The next frame, encoded as a writer would, written in two halves.
    let mut second = first.clone();
    second.seq = 2;
    second.id = "raw-2".into();
    second.content = json!("two");
    let mut bytes = Vec::new();
    frame::encode(&serde_json::to_vec(&[&second]).unwrap(), &mut bytes);
    let (head, rest) = bytes.split_at(bytes.len() / 2);

    let mut cli = tail_follow(data, run, &[]);
    let mut written = store
        .tail(
            run,
            TailOptions {
                visibility: Visibility::Written,
                ..TailOptions::default()
            },
        )
        .unwrap();
    cli.wait_lines(1);
    assert_eq!(written.next_timeout(DEADLINE).unwrap().unwrap().seq, 1);
    append_raw(&seg, head);
    // Not corrupt: a one-shot tail and verify succeed and show only the first event.
    let once = swarm(data).args(["tail", "--run", run]).output().unwrap();
    assert!(
        once.status.success(),
        "{}",
        String::from_utf8_lossy(&once.stderr)
    );
    assert_eq!(String::from_utf8(once.stdout).unwrap().lines().count(), 1);
    assert!(once.stderr.is_empty());
    let verify = swarm(data).args(["verify", "--run", run]).output().unwrap();
    assert!(verify.status.success());
    // The tail that reads unsynced bytes waits on the half frame without an error.
    assert!(written.try_next().unwrap().is_none());

    let end = append_raw(&seg, rest);
    let got = written.next_timeout(DEADLINE).unwrap().unwrap();
    assert_eq!((got.seq, got.content.as_str()), (2, Some("two")));
    // The visible tail delivers it once the mark covers it.
    set_visible(&run_dir, 1, end);
    cli.wait_lines(2);
    // A real writer continues after it; both tails go on, with nothing repeated.
    let third = store
        .append(
            run,
            NewEvent::new("a", EventType::Evidence, "three"),
            Durability::Sync,
        )
        .unwrap();
    assert_eq!(third.seq, 3);
    cli.wait_until("seq 3", |g| last_seq_is(g, 3));
    assert_eq!(written.next_timeout(DEADLINE).unwrap().unwrap().seq, 3);
    assert_eq!(seqs(&cli.kill()), vec![1, 2, 3]);
    assert!(written.try_next().unwrap().is_none());
}

/// The next item of a stream, without a futures-util dependency.
async fn next<S: futures_core::Stream + Unpin>(s: &mut S) -> Option<S::Item> {
    std::future::poll_fn(|cx| std::pin::Pin::new(&mut *s).poll_next(cx)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_stream_delivers_from_another_process_and_commits_a_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    let run = "streamed";
    let cursor = data.join("stream.cursor");
    let store = small_segment_store(&data);
    store
        .append(
            run,
            NewEvent::new("lead", EventType::Decision, "start"),
            Durability::Sync,
        )
        .unwrap();
    let mut stream = Tail::open(
        &store,
        run,
        TailOptions {
            cursor_file: Some(cursor.clone()),
            ..TailOptions::default()
        },
    )
    .unwrap()
    .into_stream()
    .unwrap();
    let first = tokio::time::timeout(DEADLINE, next(&mut stream))
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.seq, 1);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_swarm"))
        .arg("--data-dir")
        .arg(&data)
        .args(["append", "--run", run, "--stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut input, writer_input("w", 0, 30).as_bytes())
        .await
        .unwrap();
    drop(input);
    let n = 1 + entries(0, 30) as u64;
    let mut got = vec![first.seq];
    while got.len() < n as usize {
        let e = tokio::time::timeout(DEADLINE, next(&mut stream))
            .await
            .expect("stream stalled")
            .expect("stream ended")
            .unwrap();
        got.push(e.seq);
    }
    assert_eq!(got, (1..=n).collect::<Vec<_>>());
    assert!(child.wait().await.unwrap().success());
    stream.commit().unwrap();
    drop(stream);
    // A tail opened from the committed cursor starts after the last event streamed.
    let mut resumed = store
        .tail(
            run,
            TailOptions {
                cursor_file: Some(cursor),
                follow: false,
                ..TailOptions::default()
            },
        )
        .unwrap();
    assert!(resumed.next().is_none());
    assert_eq!(resumed.position().next_seq, n + 1);
}

/// Tails through the library across a close (ported from the lifecycle branch): a live
/// tail and one far behind both read to `run_closed` and end, though the run was archived
/// (its working segments deleted) before they read them; a tail opened on the archived
/// run replays it and ends; its cursor is saved on the caller's storage.
#[test]
fn library_tail_of_closed_and_archived_runs() {
    use swarm_memory::{Cursor, MemStorage};
    const RUN: &str = "r";
    let mem = MemStorage::new();
    let store = Store::open_with(
        std::sync::Arc::new(mem.clone()),
        std::path::Path::new("/data"),
        LogOptions {
            segment_bytes: 4096,
            ..LogOptions::default()
        },
    )
    .unwrap();
    let polling = TailOptions {
        notify: false,
        poll_interval_ms: 1,
        ..TailOptions::default()
    };
    let drain = |t: &mut Tail| -> Vec<u64> {
        std::iter::from_fn(|| t.try_next().unwrap())
            .map(|e| e.seq)
            .collect()
    };
    let ev = |i: u64| {
        NewEvent::new(
            "a",
            EventType::Evidence,
            format!("finding {i} {}", "x".repeat(60)),
        )
    };
    for i in 1..=3 {
        store.append(RUN, ev(i), Durability::Sync).unwrap();
    }
    let mut live = store.tail(RUN, polling.clone()).unwrap();
    assert_eq!(drain(&mut live), vec![1, 2, 3]);
    let mut behind = store.tail(RUN, polling.clone()).unwrap();
    assert_eq!(behind.try_next().unwrap().unwrap().seq, 1);
    for i in 4..=60 {
        store.append(RUN, ev(i), Durability::Sync).unwrap();
    }
    store.close_run(RUN, "lead").unwrap();
    assert!(store.archived(RUN).unwrap().is_some());
    let rest: Vec<Event> = live.by_ref().map(|e| e.unwrap()).collect();
    assert_eq!(rest.len(), 58);
    assert_eq!(rest.last().unwrap().kind, EventType::RunClosed);
    assert!(live.is_finished());
    let seqs: Vec<u64> = behind.by_ref().map(|e| e.unwrap().seq).collect();
    assert_eq!(seqs, (2..=61).collect::<Vec<_>>());
    let cur = std::path::PathBuf::from("/cursor.json");
    let mut t = store
        .tail(
            RUN,
            TailOptions {
                from_seq: Some(59),
                cursor_file: Some(cur.clone()),
                ..polling
            },
        )
        .unwrap();
    assert_eq!(drain(&mut t), vec![59, 60, 61]);
    t.commit().unwrap();
    assert!(t.next().is_none(), "following an archived run ends");
    assert_eq!(Cursor::load(&mem, &cur).unwrap().unwrap().seq, 61);
}
