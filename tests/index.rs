//! The index: reads through it equal full scans; a deleted, damaged or stale index is
//! detected and rebuilt to an identical state; it follows rotation and other processes.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use proptest::prelude::*;
use swarm_memory::{
    Durability, Event, EventType, FsStorage, LogOptions, MemStorage, NewEvent, ReadOptions,
    Storage, Store, Ts, Visibility,
};

const RUN: &str = "r1";

fn store_on(storage: Arc<dyn Storage>, root: &Path) -> Store {
    Store::open_with(
        storage,
        root,
        LogOptions {
            segment_bytes: 4096,
            ..LogOptions::default()
        },
    )
    .unwrap()
}

fn mem_store(mem: &MemStorage) -> Store {
    store_on(Arc::new(mem.clone()), Path::new("/data"))
}

fn fs_store(root: &Path) -> Store {
    store_on(Arc::new(FsStorage), root)
}

fn event(i: u64, agent: u8, kind: u8, subject: u8, user: u8) -> NewEvent {
    let mut e = NewEvent::new(
        &format!("agent-{}", agent % 5),
        EventType::ALL[kind as usize % 4],
        format!("finding {i}: {}", "x".repeat((i % 40) as usize)),
    );
    // Runs belong to one user (the partition key), and decisions or actions of
    // different agents on a shared subject would be escalated: give those their own.
    let _ = user;
    e.subject = if e.kind == "decision" || e.kind == "action_taken" {
        Some(format!("act-{i}"))
    } else {
        (!subject.is_multiple_of(4)).then(|| format!("svc-{}", subject % 3))
    };
    e
}

fn append_some(store: &Store, n: u64, seed: u64) {
    for i in 0..n {
        let x = i.wrapping_mul(2654435761).wrapping_add(seed);
        let e = event(i, x as u8, (x >> 8) as u8, (x >> 16) as u8, (x >> 24) as u8);
        store.append(RUN, e, Durability::None).unwrap();
    }
}

fn read(store: &Store, opts: ReadOptions) -> Vec<Event> {
    store
        .read(RUN, opts)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

/// Reads through the index and by a full scan; they must agree. Returns the events.
fn same_as_scan(store: &Store, opts: ReadOptions) -> Vec<Event> {
    let indexed = read(store, opts.clone());
    let scanned = read(
        store,
        ReadOptions {
            full_scan: true,
            ..opts.clone()
        },
    );
    assert_eq!(
        indexed, scanned,
        "index read differs from full scan for {opts:?}"
    );
    indexed
}

fn queries() -> Vec<ReadOptions> {
    let base = ReadOptions::default();
    vec![
        ReadOptions {
            agent: Some("agent-1".into()),
            ..base.clone()
        },
        ReadOptions {
            agent: Some("agent-2".into()),
            kind: Some(EventType::Evidence),
            ..base.clone()
        },
        ReadOptions {
            subject: Some("svc-1".into()),
            user: Some("anonymous".into()),
            ..base.clone()
        },
        ReadOptions {
            kind: Some(EventType::Decision),
            last: Some(5),
            ..base.clone()
        },
        ReadOptions {
            from_seq: Some(37),
            to_seq: Some(140),
            ..base.clone()
        },
        ReadOptions {
            agent: Some("agent-3".into()),
            from_seq: Some(20),
            limit: Some(7),
            ..base.clone()
        },
        ReadOptions {
            agent: Some("nobody".into()),
            ..base
        },
    ]
}

fn index_dir(root: &Path) -> PathBuf {
    root.join("anonymous").join(RUN).join("index")
}

/// The index files of the run (name -> bytes), the lock file left out.
fn index_files(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(index_dir(root)).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if name.ends_with(".idx") {
            out.insert(name, std::fs::read(e.path()).unwrap());
        }
    }
    out
}

/// A run of 300 events over several segments with its index written; returns the files.
fn built_run(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let store = fs_store(root);
    append_some(&store, 300, 7);
    let stats = store.rebuild_index(RUN, |_, _| {}).unwrap();
    assert_eq!(stats.events, 300);
    assert!(stats.segments >= 4, "{stats:?}");
    assert_eq!(stats.persisted_segments, stats.segments);
    let files = index_files(root);
    assert_eq!(files.len(), stats.segments);
    files
}

#[test]
fn deleted_index_is_rebuilt_identically() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let files = built_run(root);
    std::fs::remove_dir_all(index_dir(root)).unwrap();
    // A fresh process rebuilds in memory on its first query and answers the same.
    let store = fs_store(root);
    let expected: Vec<Vec<Event>> = queries()
        .into_iter()
        .map(|q| same_as_scan(&store, q))
        .collect();
    assert!(expected.iter().any(|v| !v.is_empty()));
    // Sealed segments are written by readers on their own; the rest on flush.
    let stats = store.flush_index(RUN).unwrap();
    assert!(stats.discarded.is_empty(), "{stats:?}");
    assert_eq!(index_files(root), files);
    // And an explicit rebuild gives the same bytes again.
    store.rebuild_index(RUN, |_, _| {}).unwrap();
    assert_eq!(index_files(root), files);
}

/// Recomputes the header checksum after a test changed header fields on purpose.
fn fix_header_crc(b: &mut [u8]) {
    let crc = crc32fast::hash(&b[0..76]);
    b[76..80].copy_from_slice(&crc.to_le_bytes());
}

fn fix_body_crc(b: &mut [u8]) {
    let crc = crc32fast::hash(&b[80..]);
    b[64..68].copy_from_slice(&crc.to_le_bytes());
    fix_header_crc(b);
}

#[test]
fn damaged_index_is_detected_and_rebuilt() {
    type Damage = fn(&mut Vec<u8>);
    let damages: Vec<(&str, Damage)> = vec![
        ("bit flip in the body", |b| {
            let i = b.len() - 3;
            b[i] ^= 0x04;
        }),
        ("bit flip in the header", |b| b[30] ^= 0x01),
        ("truncated", |b| b.truncate(b.len() / 2)),
        ("empty", |b| b.clear()),
        ("wrong version", |b| {
            b[4..8].copy_from_slice(&2u32.to_le_bytes());
            fix_header_crc(b);
        }),
        ("stale: covers more than the segment", |b| {
            let end = u64::from_le_bytes(b[24..32].try_into().unwrap()) + 100;
            b[24..32].copy_from_slice(&end.to_le_bytes());
            fix_header_crc(b);
        }),
        ("stale: another frame at the recorded position", |b| {
            b[48] ^= 0xff;
            fix_header_crc(b);
        }),
        ("of another run", |b| {
            b[8] ^= 0x01;
            fix_header_crc(b);
        }),
    ];
    for (what, damage) in damages {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let files = built_run(root);
        for victim in [files.keys().next().unwrap(), files.keys().last().unwrap()] {
            let path = index_dir(root).join(victim);
            let mut b = files[victim].clone();
            damage(&mut b);
            std::fs::write(&path, &b).unwrap();
            let store = fs_store(root);
            for q in queries() {
                same_as_scan(&store, q);
            }
            let stats = store.index_stats(RUN).unwrap();
            assert!(
                stats.discarded.iter().any(|d| d.contains(victim.as_str())),
                "{what} in {victim} not detected: {stats:?}"
            );
            assert_eq!(stats.events, 300, "{what}");
            store.flush_index(RUN).unwrap();
            assert_eq!(
                index_files(root),
                files,
                "{what} in {victim}: not rebuilt identically"
            );
        }
    }
}

#[test]
fn index_that_disagrees_with_the_log_is_dropped_mid_read() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let files = built_run(root);
    // A well-formed file that lies about a frame's time: only a read can notice it.
    let name = files.keys().next().unwrap();
    let mut b = files[name].clone();
    let frames = u32::from_le_bytes(b[52..56].try_into().unwrap()) as usize;
    let ts0 = 80 + frames * 12;
    b[ts0..ts0 + 8].copy_from_slice(&0u64.to_le_bytes());
    fix_body_crc(&mut b);
    std::fs::write(index_dir(root).join(name), &b).unwrap();
    let store = fs_store(root);
    let first = read(&store, ReadOptions::default()).remove(0);
    let all = same_as_scan(
        &store,
        ReadOptions {
            agent: Some(first.agent_id.clone()),
            ..ReadOptions::default()
        },
    );
    assert_eq!(all[0], first);
    let stats = store.index_stats(RUN).unwrap();
    assert!(
        stats.discarded.iter().any(|d| d.contains("disagreeing")),
        "{stats:?}"
    );
    store.flush_index(RUN).unwrap();
    assert_eq!(index_files(root), files);
}

#[test]
fn stale_index_after_power_loss_is_rebuilt() {
    let mem = MemStorage::new();
    let store = mem_store(&mem);
    append_some(&store, 120, 1);
    store.flush_index(RUN).unwrap();
    // Visible but never synced: the index covers them, a power loss takes them away.
    for i in 0..40 {
        store
            .append(RUN, event(i, 1, 1, 1, 1), Durability::None)
            .unwrap();
    }
    let mut before = store.flush_index(RUN).unwrap();
    // The index must cover unsynced bytes of the last segment for the crash to matter.
    while before.covered.off == 0 {
        store
            .append(RUN, event(0, 1, 1, 1, 1), Durability::None)
            .unwrap();
        before = store.flush_index(RUN).unwrap();
    }
    drop(store);
    mem.crash(|_, _| 0);
    let store = mem_store(&mem);
    for i in 0..60 {
        store
            .append(RUN, event(i, 2, 2, 2, 2), Durability::Sync)
            .unwrap();
    }
    for q in queries() {
        same_as_scan(&store, q);
    }
    let stats = store.index_stats(RUN).unwrap();
    assert!(!stats.discarded.is_empty(), "{stats:?}");
    assert_eq!(
        stats.head_seq,
        read(&store, ReadOptions::default()).len() as u64
    );
}

#[test]
fn index_reads_see_unsynced_tail_and_keep_the_torn_tail_report() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let store = fs_store(root);
    append_some(&store, 50, 3);
    store.flush_index(RUN).unwrap();
    // Bytes of a frame being written: not visible, not corruption, reported as torn.
    let seg = std::fs::read_dir(root.join("anonymous").join(RUN))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .max()
        .unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&seg)
        .unwrap()
        .write_all(b"{\"f\":1,\"crc\":\"00")
        .unwrap();
    let opts = ReadOptions {
        agent: Some("agent-1".into()),
        visibility: Visibility::Written,
        ..ReadOptions::default()
    };
    let mut it = store.read(RUN, opts.clone()).unwrap();
    let got: Vec<Event> = it.by_ref().collect::<Result<_, _>>().unwrap();
    assert!(!got.is_empty());
    assert!(it.torn_tail().is_some());
    same_as_scan(&store, opts);
}

#[derive(Clone, Debug)]
enum Op {
    Append(Vec<(u8, u8, u8, u8)>),
    Query(u8, u8, u8, u8, u8, u16, u16, u8),
    Reopen,
    Flush,
    /// A power loss keeping this many bytes of each file's unsynced tail (mod its length).
    Crash(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => proptest::collection::vec(any::<(u8, u8, u8, u8)>(), 1..6).prop_map(Op::Append),
        4 => any::<(u8, u8, u8, u8, u8, u16, u16, u8)>()
            .prop_map(|(a, b, c, d, e, f, g, h)| Op::Query(a, b, c, d, e, f, g, h)),
        1 => Just(Op::Reopen),
        1 => Just(Op::Flush),
        1 => any::<u16>().prop_map(Op::Crash),
    ]
}

/// Builds a query from random bytes: each filter present or not, ranges around the data.
fn random_query(all: &[Event], q: (u8, u8, u8, u8, u8, u16, u16, u8)) -> ReadOptions {
    let (agent, kind, subject, user, flags, a, b, n) = q;
    let head = all.len() as u64;
    let pick = |x: u8| (x & 0x80) != 0;
    let ts_of = |i: u16| all.get(i as usize % all.len().max(1)).map(|e| e.ts);
    ReadOptions {
        agent: pick(agent).then(|| format!("agent-{}", agent % 6)),
        kind: pick(kind).then(|| EventType::ALL[kind as usize % 4]),
        subject: pick(subject).then(|| format!("svc-{}", subject % 4)),
        user: pick(user).then(|| format!("user-{}", user % 3)),
        from_seq: (flags & 1 != 0).then(|| u64::from(a) % (head + 3)),
        to_seq: (flags & 2 != 0).then(|| u64::from(b) % (head + 3)),
        since: (flags & 4 != 0).then(|| ts_of(a)).flatten(),
        until: (flags & 8 != 0)
            .then(|| ts_of(b))
            .flatten()
            .map(|t| Ts(t.0 + 1)),
        limit: (flags & 16 != 0).then_some(n as usize % 7),
        last: (flags & 32 != 0).then_some(n as usize % 9),
        visibility: if flags & 64 != 0 {
            Visibility::Written
        } else {
            Visibility::Visible
        },
        ..ReadOptions::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    #[test]
    fn index_queries_equal_full_scans(ops in proptest::collection::vec(op(), 1..40)) {
        let mem = MemStorage::new();
        let mut store = mem_store(&mem);
        let mut n = 0u64;
        let mut crashed = false;
        store.append(RUN, event(0, 0, 0, 0, 0), Durability::Sync).unwrap();
        for op in ops {
            match op {
                Op::Append(evs) => {
                    let batch: Vec<NewEvent> = evs
                        .iter()
                        .map(|&(a, k, s, u)| {
                            n += 1;
                            event(n, a, k, s, u)
                        })
                        .collect();
                    let d = if n.is_multiple_of(3) { Durability::Sync } else { Durability::None };
                    if batch.len() == 1 || n.is_multiple_of(2) {
                        store.append_batch(RUN, batch, None, d).unwrap();
                    } else {
                        for e in batch {
                            store.append(RUN, e, d).unwrap();
                        }
                    }
                }
                Op::Query(a, b, c, d, e, f, g, h) => {
                    let all = read(&store, ReadOptions { full_scan: true, ..ReadOptions::default() });
                    let opts = random_query(&all, (a, b, c, d, e, f, g, h));
                    let indexed = read(&store, opts.clone());
                    let scanned = read(&store, ReadOptions { full_scan: true, ..opts.clone() });
                    prop_assert_eq!(indexed, scanned, "{:?}", opts);
                }
                Op::Reopen => store = mem_store(&mem),
                Op::Flush => {
                    let s = store.flush_index(RUN).unwrap();
                    prop_assert!(crashed || s.discarded.is_empty(), "{:?}", s);
                }
                Op::Crash(keep) => {
                    // Index files are durable (fsync, rename, dir fsync); the log's
                    // unsynced tail is not: what the index covers may be gone or torn.
                    drop(store);
                    mem.crash(|_, unsynced| keep as usize % (unsynced + 1));
                    store = mem_store(&mem);
                    crashed = true;
                }
            }
        }
        let stats = store.index_stats(RUN).unwrap();
        prop_assert!(crashed || stats.discarded.is_empty(), "{:?}", stats);
        let all = read(&store, ReadOptions { full_scan: true, ..ReadOptions::default() });
        prop_assert_eq!(stats.head_seq, all.last().map_or(0, |e| e.seq));
        if !crashed {
            prop_assert_eq!(stats.head_seq, n + 1);
        }
    }
}

fn swarm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_swarm"))
}

#[test]
fn index_stays_right_under_concurrent_appends_from_other_processes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let store = fs_store(root);
    // Created here so that the run's small segment size (in run.json) makes the other
    // processes rotate segments while they append.
    store
        .append(RUN, event(0, 0, 0, 0, 0), Durability::Sync)
        .unwrap();
    let mut writers = Vec::new();
    for w in 0..3u64 {
        let mut child = swarm()
            .arg("--data-dir")
            .arg(root)
            .args(["append", "--run", RUN, "--stdin", "--durability"])
            .arg(if w == 0 { "sync" } else { "none" })
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let body: String = (0..150u64)
            .map(|i| {
                format!(
                    "{{\"agent_id\":\"agent-{}\",\"type\":\"evidence\",\"subject\":\"svc-{}\",\"content\":\"w{w} e{i} {}\"}}\n",
                    i % 4,
                    i % 3,
                    "y".repeat((i % 30) as usize)
                )
            })
            .collect();
        std::thread::spawn(move || stdin.write_all(body.as_bytes()));
        writers.push(child);
    }
    // Other processes read through (and write) the index meanwhile.
    let mut readers = Vec::new();
    for r in 0..2 {
        readers.push(
            swarm()
                .arg("--data-dir")
                .arg(root)
                .args(["read", "--run", RUN, "--agent"])
                .arg(format!("agent-{r}"))
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    let q = ReadOptions {
        agent: Some("agent-2".into()),
        ..ReadOptions::default()
    };
    let mut seen: Vec<Vec<Event>> = Vec::new();
    let mut more_readers = 0;
    while writers.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
        seen.push(read(&store, q.clone()));
        if more_readers < 6 {
            more_readers += 1;
            readers.push(
                swarm()
                    .arg("--data-dir")
                    .arg(root)
                    .args(["read", "--run", RUN, "--agent", "agent-1", "--last", "3"])
                    .stdout(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
        }
    }
    for mut c in writers.into_iter().chain(readers) {
        assert!(c.wait().unwrap().success());
    }
    let fresh = fs_store(root);
    let final_all = same_as_scan(&fresh, q.clone());
    // agent-2 wrote i % 4 == 2 of 0..150 in each of the 3 writers.
    assert_eq!(final_all.len(), 3 * 37);
    // Every read during the appends was a prefix of the final answer: nothing missed.
    for s in seen {
        assert_eq!(s[..], final_all[..s.len()]);
    }
    for q in queries() {
        same_as_scan(&fresh, q);
    }
    same_as_scan(&store, q);
    let stats = fresh.index_stats(RUN).unwrap();
    assert!(stats.discarded.is_empty(), "{stats:?}");
    assert_eq!(stats.events, 451);
    assert!(stats.segments > 3, "{stats:?}");
}

#[test]
fn cli_index_rebuild_and_read_filters() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let store = fs_store(root);
    append_some(&store, 80, 11);
    let out = swarm()
        .arg("--data-dir")
        .arg(root)
        .args(["index", "rebuild"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<serde_json::Value> = out
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["run"], RUN);
    assert_eq!(lines[0]["events"], 80);
    assert!(
        out.stderr.is_empty(),
        "no progress bar when not a terminal: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = swarm()
        .arg("--data-dir")
        .arg(root)
        .args([
            "read", "--run", RUN, "--agent", "agent-1", "--type", "evidence", "--last", "2",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let got: Vec<Event> = out
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    let want: Vec<Event> = read(
        &store,
        ReadOptions {
            agent: Some("agent-1".into()),
            kind: Some(EventType::Evidence),
            full_scan: true,
            ..ReadOptions::default()
        },
    );
    assert_eq!(got[..], want[want.len().saturating_sub(2)..]);
    let status = swarm()
        .arg("--data-dir")
        .arg(root)
        .args(["index", "status", "--run", RUN])
        .output()
        .unwrap();
    assert!(status.status.success());
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["head_seq"], 80);
}

#[test]
fn corruption_in_the_log_is_reported_as_by_a_scan() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let store = fs_store(root);
    append_some(&store, 200, 5);
    let mut segs: Vec<PathBuf> = std::fs::read_dir(root.join("anonymous").join(RUN))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    segs.sort();
    // Damage a byte inside a middle segment: valid records follow, so it is corruption.
    let victim = &segs[segs.len() / 2];
    let mut b = std::fs::read(victim).unwrap();
    let at = b.len() / 2;
    b[at] ^= 0x20;
    std::fs::write(victim, &b).unwrap();
    let fresh = fs_store(root);
    let q = ReadOptions {
        agent: Some("agent-1".into()),
        ..ReadOptions::default()
    };
    let indexed: Result<Vec<Event>, _> = fresh.read(RUN, q.clone()).unwrap().collect();
    let scanned: Result<Vec<Event>, _> = fresh
        .read(
            RUN,
            ReadOptions {
                full_scan: true,
                ..q.clone()
            },
        )
        .unwrap()
        .collect();
    match (indexed, scanned) {
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        other => panic!("both reads must fail the same way: {other:?}"),
    }
    let skip = ReadOptions {
        skip_corrupt: true,
        ..q
    };
    same_as_scan(&fresh, skip);
    let stats = fresh.index_stats(RUN).unwrap();
    assert!(stats.stopped.is_some(), "{stats:?}");
    // Damage in the log is the log's: the index is not blamed, dropped and rebuilt.
    assert!(stats.discarded.is_empty(), "{stats:?}");
    assert!(stats.head_seq < 200, "{stats:?}");
}

/// The run's directory in a [`mem_store`].
const MEM_RUN_DIR: &str = "/data/anonymous/r1";

/// A run of `n` events in a [`mem_store`], its index written; its segment file names.
fn indexed_mem_run(n: u64, seed: u64) -> (MemStorage, Vec<String>) {
    let mem = MemStorage::new();
    let store = mem_store(&mem);
    append_some(&store, n, seed);
    store.flush_index(RUN).unwrap();
    drop(store);
    let segs = crate::util::mem_segments(&mem, Path::new(MEM_RUN_DIR));
    (mem, segs)
}

/// A crash between sealing a segment and cutting its zero fill (a rotation's trim, or the
/// trim before a declared loss) leaves the fill in a segment a later one follows: the
/// index takes it as that segment's end, as readers do, and goes on to the next one.
#[test]
fn a_fill_left_in_a_sealed_segment_ends_it_for_the_index() {
    let (mem, segs) = indexed_mem_run(120, 7);
    let dir = Path::new(MEM_RUN_DIR);
    assert!(segs.len() >= 3, "{segs:?}");
    // The fill a crash before the trim leaves, in the first and in a middle segment.
    for name in &segs[..2] {
        let p = dir.join(name);
        let mut bytes = mem.contents(&p).unwrap();
        bytes.resize(bytes.len() + 3000, 0);
        mem.set_contents(&p, bytes);
    }
    for rebuild in [false, true] {
        let store = mem_store(&mem);
        let stats = if rebuild {
            store.rebuild_index(RUN, |_, _| {}).unwrap()
        } else {
            store.index_stats(RUN).unwrap()
        };
        assert_eq!(stats.head_seq, 120, "{stats:?}");
        assert_eq!(stats.segments, segs.len(), "{stats:?}");
        assert!(stats.stopped.is_none(), "{stats:?}");
        let q = ReadOptions {
            agent: Some("agent-3".into()),
            ..ReadOptions::default()
        };
        let got = same_as_scan(&store, q);
        assert!(!got.is_empty());
        assert!(got.iter().any(|e| e.seq > 100), "{:?}", got.last());
        let v = store.verify(RUN, |_| {}).unwrap();
        assert!(v.ok && v.head_seq == 120 && v.records == 120, "{v:?}");
    }
}

/// Damage in the middle of a sealed, already indexed segment, quarantined by `repair`:
/// the index still ends where it did (its load checks pass), so a read it plans meets the
/// damaged frame mid-way. The events the plan read before it are returned (they were
/// dropped once), the read goes on by scanning, and the segment's index file is removed
/// so the next store rebuilds it instead of falling back again.
#[test]
fn a_planned_read_that_meets_quarantined_damage_returns_every_intact_event() {
    let (mem, segs) = indexed_mem_run(200, 3);
    let dir = Path::new(MEM_RUN_DIR);
    assert!(segs.len() >= 4, "{segs:?}");
    // A byte of the sixth frame of the second segment, inside its JSON.
    let seg = dir.join(&segs[1]);
    let mut bytes = mem.contents(&seg).unwrap();
    let at = crate::util::frame_boundaries(&bytes)[5] + 120;
    bytes[at] = if bytes[at] == b'Q' { b'R' } else { b'Q' };
    mem.set_contents(&seg, bytes);
    let store = mem_store(&mem);
    store.repair(RUN).unwrap();
    let idx_file =
        Path::new(MEM_RUN_DIR)
            .join("index")
            .join(swarm_memory::query::index::index_file_name(
                segs[1]
                    .trim_start_matches("seg-")
                    .trim_end_matches(".jsonl")
                    .parse()
                    .unwrap(),
            ));
    assert!(mem.contents(&idx_file).is_some(), "the segment was indexed");
    for kind in [EventType::Hypothesis, EventType::Evidence] {
        let q = ReadOptions {
            kind: Some(kind),
            ..ReadOptions::default()
        };
        same_as_scan(&store, q.clone());
        same_as_scan(&mem_store(&mem), q);
    }
    assert!(
        mem.contents(&idx_file).is_none() || {
            // Rebuilt from the log by a later refresh: it stops at the damage now.
            let s = mem_store(&mem).index_stats(RUN).unwrap();
            s.stopped.is_some()
        }
    );
}
