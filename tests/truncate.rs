//! A log cut at every byte offset. Bytes below the durable mark were acknowledged: a cut
//! there is corruption (reads return the intact prefix and end with an error naming the
//! lost seqs, `verify` fails, appends are refused) until `swarm repair` records the loss,
//! after which numbering goes on past every seq a reader may have seen. Bytes past the
//! durable mark were never acknowledged: a cut there is a torn tail, repaired silently by
//! the next append, which continues the seqs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use swarm_memory::log::storage::OpenMode;
use swarm_memory::{
    Durability, Error, Event, EventType, FsStorage, LogOptions, MemStorage, ReadOptions, Storage,
    Store,
};

use crate::util::{frame_boundaries, lib_read, lib_read_written, new_ev, Env};

fn read_file(s: &dyn Storage, p: &Path) -> Vec<u8> {
    let f = s.open(p, OpenMode::Read).expect("open");
    let mut b = vec![0; f.len().expect("len") as usize];
    f.read_exact_at(&mut b, 0).expect("read");
    b
}

fn write_file(s: &dyn Storage, p: &Path, bytes: &[u8]) {
    let f = s.open(p, OpenMode::ReadWriteCreate).expect("open");
    f.set_len(0).expect("truncate");
    f.write_all_at(bytes, 0).expect("write");
    f.sync_data().expect("sync");
}

fn files_ending(s: &dyn Storage, dir: &Path, ending: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = s
        .list(dir)
        .expect("list")
        .into_iter()
        .filter(|n| n.ends_with(ending))
        .map(|n| dir.join(n))
        .collect();
    v.sort();
    v
}

/// Resets the run directory to one segment holding `seg_bytes` and the given `SYNCED`.
fn reset(s: &dyn Storage, dir: &Path, seg_bytes: &[u8], synced: &[u8]) {
    for n in s.list(dir).expect("list") {
        let keep = n == "run.json" || n == "LOCK" || n == "SYNCED";
        if !keep {
            let p = dir.join(&n);
            if s.list(&p).is_err() {
                s.remove_file(&p).expect("remove");
            }
        }
    }
    write_file(s, &dir.join("seg-00000000000000000001.jsonl"), seg_bytes);
    write_file(s, &dir.join("SYNCED"), synced);
}

/// Five frames, one of them a batch of three: seven events.
fn build(store: &Store, run: &str) -> Vec<Event> {
    for c in ["first", "second"] {
        store
            .append(run, new_ev(None, c), Durability::Sync)
            .unwrap();
    }
    let batch = (0..3)
        .map(|i| new_ev(Some(&format!("b{i}")), "in a batch"))
        .collect();
    store
        .append_batch(run, batch, None, Durability::Sync)
        .unwrap();
    for c in ["sixth", "seventh, the last"] {
        store
            .append(run, new_ev(None, c), Durability::Sync)
            .unwrap();
    }
    lib_read(store, run)
}

/// The events a read returns before it fails, and its error.
fn read_until_error(store: &Store, run: &str) -> (Vec<Event>, Option<Error>) {
    let mut got = Vec::new();
    for r in store.read(run, ReadOptions::default()).expect("read") {
        match r {
            Ok(e) => got.push(e),
            Err(e) => return (got, Some(e)),
        }
    }
    (got, None)
}

/// Cuts the run's only segment at every offset (or those `pick` selects) below its
/// durable mark, and checks reads, `verify`, the refused append, `repair`, and the
/// appends after it. With `mem`, also simulates a power loss after the repair: the
/// repair and the next acknowledged append survive it.
fn sweep(storage: Arc<dyn Storage>, root: &Path, mem: Option<&MemStorage>) {
    let run = "cut";
    let dir = root.join("anonymous").join(run);
    let open = || Store::open_with(storage.clone(), root, LogOptions::default()).unwrap();
    let all = build(&open(), run);
    assert_eq!(all.len(), 7);
    let seg = dir.join("seg-00000000000000000001.jsonl");
    let mut bytes = read_file(&*storage, &seg);
    // The frames, without the preallocated fill after them (cutting inside the fill
    // loses nothing; every cut below is inside the frames).
    bytes.truncate(bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1));
    let synced_bytes = read_file(&*storage, &dir.join("SYNCED"));
    let bounds = frame_boundaries(&bytes);
    assert_eq!(bounds.len(), 6, "five frames");
    assert_eq!(*bounds.last().unwrap(), bytes.len());
    let events_before = [0usize, 1, 2, 5, 6, 7];
    for cut in 0..bytes.len() {
        reset(&*storage, &dir, &bytes[..cut], &synced_bytes);
        let frames = bounds.iter().rposition(|&b| b <= cut).unwrap();
        let whole_end = bounds[frames];
        let k = events_before[frames];
        let store = open();
        // The intact prefix, then an error naming the lost seqs and the repair.
        let (got, err) = read_until_error(&store, run);
        assert_eq!(got, all[..k], "read after a cut at {cut}");
        let msg = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            msg.contains(&format!("seqs {}..=7", k + 1)) && msg.contains("swarm repair"),
            "cut at {cut}: {msg:?}"
        );
        let rep = store.verify(run, |_| {}).unwrap();
        assert!(!rep.ok, "cut at {cut}: verify says ok");
        assert_eq!(rep.records, k as u64, "cut at {cut}");
        assert!(
            rep.corrupt
                .iter()
                .any(|c| c.reason.contains("durable mark")),
            "cut at {cut}: {rep:?}"
        );
        // Appends are refused until the loss is recorded, and nothing is written.
        let refused = store.append(run, new_ev(None, "too early"), Durability::Sync);
        assert!(
            matches!(&refused, Err(Error::Corrupt { reason, .. }) if reason.contains("swarm repair")),
            "cut at {cut}: {refused:?}"
        );
        assert_eq!(read_file(&*storage, &seg), &bytes[..cut], "cut at {cut}");
        // Repair: the damaged bytes aside, the lost seqs recorded, numbering after 7.
        let damaged = store.repair(run).unwrap().expect("a repair");
        assert_eq!(damaged.kind, EventType::LogDamaged);
        assert_eq!(damaged.seq, 8, "cut at {cut}");
        assert_eq!(damaged.content["lost_from"], k as u64 + 1, "cut at {cut}");
        assert_eq!(damaged.content["lost_to"], 7, "cut at {cut}");
        let aside = files_ending(&*storage, &dir, ".damaged");
        assert_eq!(aside.len(), 1, "cut at {cut}");
        assert_eq!(read_file(&*storage, &aside[0]), &bytes[whole_end..cut]);
        assert!(
            store.repair(run).unwrap().is_none(),
            "a second repair is a no-op"
        );
        let new = store
            .append(run, new_ev(None, "after the repair"), Durability::Sync)
            .unwrap_or_else(|e| panic!("append after the repair of a cut at {cut}: {e}"));
        assert_eq!(new.seq, 9, "cut at {cut}: a seq readers saw was reused");
        let mut want = all[..k].to_vec();
        want.push(damaged.clone());
        want.push(new.clone());
        assert_eq!(
            lib_read(&store, run),
            want,
            "read after the repair, cut {cut}"
        );
        let rep = store.verify(run, |_| {}).unwrap();
        assert!(rep.ok && rep.torn_tail.is_none(), "cut at {cut}: {rep:?}");
        // A fresh handle (a new process) reads and appends the same way.
        drop(store);
        let store = open();
        assert_eq!(lib_read(&store, run), want, "cut at {cut}: reopened");
        drop(store);
        if let Some(mem) = mem {
            mem.crash(|_, _| 0);
            let written: Vec<Event> = lib_read_written(&open(), run);
            assert_eq!(
                written, want,
                "cut at {cut}: the repair or an acknowledged append did not survive a power loss"
            );
        }
    }
}

#[test]
fn every_offset_below_the_durable_mark_real_files() {
    let env = Env::fast();
    sweep(Arc::new(FsStorage), env.path(), None);
}

#[test]
fn every_offset_below_the_durable_mark_mem_with_power_loss() {
    let mem = MemStorage::new();
    sweep(Arc::new(mem.clone()), Path::new("/data"), Some(&mem));
}

/// Bytes past the durable mark were never acknowledged: a frame written but cut before
/// its fsync published it is a torn tail. Every cut inside it reads as the durable
/// prefix, verifies ok (reported as a torn tail), and the next append cuts it (kept in a
/// `.broken` file) and continues the seqs.
#[test]
fn every_offset_past_the_durable_mark_is_a_torn_tail() {
    let env = Env::fast();
    let storage: Arc<dyn Storage> = Arc::new(FsStorage);
    let root = env.path();
    let run = "tail";
    let dir = root.join("anonymous").join(run);
    let open = || Store::open_with(storage.clone(), root, LogOptions::default()).unwrap();
    let all = build(&open(), run);
    let seg = dir.join("seg-00000000000000000001.jsonl");
    let durable = read_file(&*storage, &seg);
    let synced_bytes = read_file(&*storage, &dir.join("SYNCED"));
    // One more frame: its bytes lie past the durable mark once SYNCED is put back.
    open()
        .append(run, new_ev(None, "never acknowledged"), Durability::Sync)
        .unwrap();
    let longer = read_file(&*storage, &seg);
    for cut in durable.len() + 1..longer.len() {
        reset(&*storage, &dir, &longer[..cut], &synced_bytes);
        let store = open();
        assert_eq!(lib_read(&store, run), all, "cut at {cut}");
        let rep = store.verify(run, |_| {}).unwrap();
        assert!(rep.ok, "cut at {cut}: {rep:?}");
        let t = rep.torn_tail.expect("a torn tail");
        assert_eq!(
            (t.offset, t.bytes),
            (durable.len() as u64, (cut - durable.len()) as u64)
        );
        let new = store
            .append(run, new_ev(None, "after the cut"), Durability::Sync)
            .unwrap_or_else(|e| panic!("append after a cut at {cut}: {e}"));
        assert_eq!(new.seq, 8, "cut at {cut}");
        let broken = files_ending(&*storage, &dir, ".broken");
        assert_eq!(broken.len(), 1, "cut at {cut}");
        assert_eq!(
            read_file(&*storage, &broken[0]),
            &longer[durable.len()..cut]
        );
    }
}

/// A flipped byte in the last frame (below the mark) is reported and refused, never cut
/// as a torn tail; `swarm repair` through the CLI records it and appends go on.
#[test]
fn a_flip_in_the_last_frame_through_the_cli() {
    let env = Env::new();
    let run = "flip";
    let store = env.store();
    let all = build(&store, run);
    drop(store);
    let seg = env.segments(run).remove(0);
    let mut bytes = std::fs::read(&seg).unwrap();
    let bounds = frame_boundaries(&bytes);
    let at = bounds[4] + 60;
    bytes[at] ^= 0x20;
    std::fs::write(&seg, &bytes).unwrap();
    let out = env.swarm(&["read", "--run", run]).code(3);
    assert_eq!(out.events(), all[..6]);
    assert!(out.stderr.contains("seqs 7..=7"), "{}", out.stderr);
    let (code, rep) = env.verify(run);
    assert_eq!(code, 3, "{rep}");
    env.swarm(&[
        "append",
        "--run",
        run,
        "--agent",
        "a",
        "--type",
        "evidence",
        "--content",
        "x",
    ])
    .code(3)
    .one_line_error(&["swarm repair --run flip"]);
    assert!(
        env.broken_files(run).is_empty(),
        "acknowledged bytes were cut as a torn tail"
    );
    let repaired = env.swarm(&["repair", "--run", run]).ok();
    let ev: serde_json::Value = serde_json::from_str(repaired.stdout.trim()).unwrap();
    assert_eq!(ev["type"], "log_damaged");
    assert_eq!(
        (ev["seq"].as_u64(), ev["content"]["lost_from"].as_u64()),
        (Some(8), Some(7))
    );
    let next = env
        .swarm(&[
            "append",
            "--run",
            run,
            "--agent",
            "a",
            "--type",
            "evidence",
            "--content",
            "x",
        ])
        .ok()
        .events();
    assert_eq!(next[0].seq, 9);
    let (code, rep) = env.verify(run);
    assert_eq!(code, 0, "{rep}");
    let got = env.read(run);
    assert_eq!(
        got.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6, 8, 9]
    );
    // Replay and checkpoints handle the recorded gap.
    env.swarm(&["checkpoint", "--run", run]).ok();
    let r = env.swarm(&["replay", "--run", run]).ok();
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(v["state"]["head_seq"], 9);
}

/// A consumer with a cursor across a repair: it saw seqs 1..=7; bytes holding 6 and 7 are
/// lost and repaired; it resumes and gets every new event exactly once, none under a
/// reused seq.
#[test]
fn a_tailer_with_a_cursor_sees_every_event_once_across_a_repair() {
    let env = Env::new();
    let run = "cur";
    let store = env.store();
    let all = build(&store, run);
    drop(store);
    let cursor = env.path().join("c.cursor");
    let c = cursor.to_str().unwrap();
    let first = env
        .swarm(&["tail", "--run", run, "--cursor-file", c])
        .ok()
        .events();
    assert_eq!(first, all);
    let seg = env.segments(run).remove(0);
    let bytes = std::fs::read(&seg).unwrap();
    let bounds = frame_boundaries(&bytes);
    std::fs::write(&seg, &bytes[..bounds[3]]).unwrap();
    env.swarm(&["tail", "--run", run, "--cursor-file", c])
        .code(3);
    env.swarm(&["repair", "--run", run]).ok();
    for i in 0..3 {
        env.swarm(&[
            "append",
            "--run",
            run,
            "--agent",
            "a",
            "--type",
            "evidence",
            "--content",
            &format!("new {i}"),
        ])
        .ok();
    }
    let next = env
        .swarm(&["tail", "--run", run, "--cursor-file", c])
        .ok()
        .events();
    assert_eq!(
        next.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [8, 9, 10, 11]
    );
    assert_eq!(next[0].kind, EventType::LogDamaged);
    assert!(env
        .swarm(&["tail", "--run", run, "--cursor-file", c])
        .ok()
        .events()
        .is_empty());
}
