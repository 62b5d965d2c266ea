//! Idempotent retries (same id: same event, nothing written) and `expect_seq`
//! compare-and-swap (mismatch: exit 4, nothing written).

use std::io;
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use swarm_memory::log::storage::{OpenMode, StorageFile};
use swarm_memory::{Durability, LogOptions, MemStorage, Storage, Store};

use crate::util::{ev, ev_id, lib_append, lib_read, new_ev, Env};

fn append_one<'a>(run: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "append",
        "--run",
        run,
        "--agent",
        "a1",
        "--type",
        "evidence",
        "--content",
        "found it",
    ];
    a.extend(extra);
    a
}

#[test]
fn same_id_returns_the_stored_event_and_writes_nothing() {
    let env = Env::new();
    let run = "idem";
    let first = env.swarm(&append_one(run, &["--id", "k1"])).ok().events();
    env.append_lines(run, &[ev("a2", "hypothesis", "something else")]);
    let before = env.snapshot();
    // A retry of k1, even with an outdated expect_seq, is the stored event: the first
    // write won.
    let again = env
        .swarm(&append_one(run, &["--id", "k1", "--expect-seq", "0"]))
        .ok()
        .events();
    assert_eq!(again, first);
    assert_eq!(env.snapshot(), before, "a retry wrote something");
    // The same id with another event is not a retry: refused (exit 4) naming the stored
    // seq, and nothing is written or dropped silently.
    env.swarm_stdin(
        &["append", "--run", run, "--stdin"],
        &format!("{}\n", ev_id("k1", "zz", "different content")),
    )
    .code(4)
    .one_line_error(&["k1", "seq 1"]);
    assert_eq!(env.snapshot(), before);
    assert_eq!(env.check_run(run).len(), 2);
}

/// A retry whose answer was lost while the run was closed and archived gets the stored
/// event, from the archive (exit 0), as before the close; a new event or a changed one
/// is still refused.
#[test]
fn a_retry_after_the_run_was_closed_gets_the_stored_event() {
    let env = Env::new();
    let run = "closing";
    let first = env.swarm(&append_one(run, &["--id", "k1"])).ok().events();
    env.swarm(&["run", "close", run, "--by", "lead"]).ok();
    let again = env.swarm(&append_one(run, &["--id", "k1"])).ok().events();
    assert_eq!(again, first);
    env.swarm(&append_one(run, &["--id", "k2"]))
        .code(5)
        .one_line_error(&["closed and archived"]);
    env.swarm_stdin(
        &["append", "--run", run, "--stdin"],
        &format!("{}\n", ev_id("k1", "a1", "different content")),
    )
    .code(4)
    .one_line_error(&["k1", "different content"]);
    // The same in one process that wrote the run and then closed it.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let e = new_ev(Some("k9"), "kept");
    let stored = store.append("r", e.clone(), Durability::Sync).unwrap();
    store.close_run("r", "lead").unwrap();
    assert_eq!(
        store.append("r", e.clone(), Durability::Sync).unwrap(),
        stored
    );
    // The server's path: several requests committed together.
    let mut out = store.append_many(
        "r",
        vec![(vec![e], None), (vec![new_ev(Some("k10"), "new")], None)],
        Durability::Sync,
    );
    assert!(out.pop().unwrap().is_err());
    assert_eq!(out.pop().unwrap().unwrap(), vec![stored]);
}

#[test]
fn batch_retry_and_partly_stored_batch() {
    let env = Env::new();
    let run = "idem-batch";
    let batch = json!([
        ev_id("b1", "a", "one"),
        ev_id("b2", "a", "two"),
        ev_id("b3", "a", "three")
    ]);
    let first = env.append_lines(run, std::slice::from_ref(&batch));
    assert_eq!(first.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
    let before = env.snapshot();
    assert_eq!(env.append_lines(run, &[batch]), first);
    assert_eq!(env.snapshot(), before, "a batch retry wrote something");
    // b2 is stored, b9 is not: a batch is retried whole or not at all.
    let mixed = json!([ev_id("b9", "a", "new"), ev_id("b2", "a", "two")]);
    env.swarm_stdin(&["append", "--run", run, "--stdin"], &format!("{mixed}\n"))
        .code(2)
        .one_line_error(&["line 1", "b2", "whole"]);
    // The same id twice in one batch.
    let twice = json!([ev_id("c1", "a", "x"), ev_id("c1", "a", "y")]);
    env.swarm_stdin(&["append", "--run", run, "--stdin"], &format!("{twice}\n"))
        .code(2)
        .one_line_error(&["line 1", "c1", "twice"]);
    assert_eq!(env.snapshot(), before);
    assert_eq!(env.check_run(run).len(), 3);
}

#[test]
fn expect_seq_is_a_compare_and_swap() {
    let env = Env::new();
    let run = "cas";
    // expect 0 on a run that does not exist yet: creates it.
    let e = env
        .swarm(&append_one(run, &["--expect-seq", "0"]))
        .ok()
        .events();
    assert_eq!(e[0].seq, 1);
    let e = env
        .swarm(&append_one(run, &["--expect-seq", "1"]))
        .ok()
        .events();
    assert_eq!(e[0].seq, 2);
    let before = env.snapshot();
    for stale in ["0", "1", "3", "99"] {
        env.swarm(&append_one(run, &["--expect-seq", stale]))
            .code(4)
            .one_line_error(&["conflict", &format!("expected last seq {stale}"), "at 2"]);
        assert_eq!(env.snapshot(), before, "a refused CAS wrote something");
    }
    // Batches carry one expect_seq.
    let batch = json!([
        {"agent_id": "a", "type": "evidence", "content": "x", "expect_seq": 2},
        {"agent_id": "a", "type": "evidence", "content": "y"}
    ]);
    let got = env.append_lines(run, std::slice::from_ref(&batch));
    assert_eq!(got.iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 4]);
    let before = env.snapshot();
    env.swarm_stdin(&["append", "--run", run, "--stdin"], &format!("{batch}\n"))
        .code(4)
        .one_line_error(&["line 1", "conflict"]);
    assert_eq!(env.snapshot(), before);
    // A CAS on a run that does not exist, expecting something else than 0, creates
    // nothing.
    let before = env.snapshot();
    env.swarm(&append_one("nothing-here", &["--expect-seq", "5"]))
        .code(4)
        .one_line_error(&["conflict"]);
    assert_eq!(env.snapshot(), before, "a refused CAS created a run");
    assert_eq!(env.check_run(run).len(), 4);
}

/// A storage whose next segment write, once armed, reports that it started and then
/// takes a while: appends from other threads queue up behind it and are combined.
#[derive(Clone)]
struct SlowWrite {
    mem: MemStorage,
    armed: Arc<Mutex<Option<mpsc::Sender<()>>>>,
}

struct SlowFile {
    inner: Box<dyn StorageFile>,
    armed: Arc<Mutex<Option<mpsc::Sender<()>>>>,
}

impl StorageFile for SlowFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let armed = self.armed.lock().unwrap().take();
        if let Some(tx) = armed {
            let _ = tx.send(());
            // Simulates a slow disk; nothing waits for this sleep to end.
            std::thread::sleep(Duration::from_millis(30));
        }
        self.inner.write_all_at(buf, offset)
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }
    fn lock(&self) -> io::Result<()> {
        self.inner.lock()
    }
    fn unlock(&self) -> io::Result<()> {
        self.inner.unlock()
    }
}

impl Storage for SlowWrite {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let inner = self.mem.open(path, mode)?;
        if path.to_string_lossy().ends_with(".jsonl") {
            return Ok(Box::new(SlowFile {
                inner,
                armed: self.armed.clone(),
            }));
        }
        Ok(inner)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.mem.create_dir_all(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.mem.list(dir)
    }
    fn exists(&self, path: &Path) -> bool {
        self.mem.exists(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.mem.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.mem.remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.mem.remove_dir_all(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.mem.sync_dir(path)
    }
}

/// Threads of one process sending the same new id at the same moment (a retry racing
/// its original): their appends are combined into one group write, and every one of
/// them must get the one stored event.
#[test]
fn concurrent_retries_of_one_id_in_one_process() {
    let armed = Arc::new(Mutex::new(None));
    let storage = SlowWrite {
        mem: MemStorage::new(),
        armed: armed.clone(),
    };
    let store =
        Store::open_with(Arc::new(storage), Path::new("/data"), LogOptions::default()).unwrap();
    let run = "race";
    lib_append(&store, run, "created");
    for round in 0..12 {
        let (tx, started) = mpsc::channel();
        *armed.lock().unwrap() = Some(tx);
        let id = format!("id-{round}");
        let seqs: Vec<u64> = std::thread::scope(|s| {
            let blocker = s.spawn(|| lib_append(&store, run, "slow write"));
            started.recv().unwrap();
            let racers: Vec<_> = (0..6)
                .map(|t| {
                    let (store, id) = (&store, &id);
                    s.spawn(move || {
                        let mode = if t % 2 == 0 {
                            Durability::Sync
                        } else {
                            Durability::None
                        };
                        match store.append(run, new_ev(Some(id), "same"), mode) {
                            Ok(e) => e.seq,
                            Err(e) => panic!("round {round}, thread {t}: {e}"),
                        }
                    })
                })
                .collect();
            blocker.join().unwrap();
            racers.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(seqs.iter().all(|&s| s == seqs[0]), "{id}: seqs {seqs:?}");
    }
    let stored = lib_read(&store, run);
    crate::util::check_sequence(&stored);
    assert_eq!(stored.len(), 1 + 12 * 2);
}
