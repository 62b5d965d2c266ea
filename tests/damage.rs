//! Damaged bytes: bit flips in a middle record are reported and never dropped silently;
//! a zero-filled or garbage tail is a torn tail, cut (and kept) by the next append.

use std::path::Path;
use std::sync::Arc;

use swarm_memory::log::storage::OpenMode;
use swarm_memory::{Durability, Error, LogOptions, MemStorage, ReadOptions, Storage, Store};

use serde_json::json;

use crate::util::{frame_boundaries, lib_append, lib_read, new_ev, parse_events, Env};

/// A run of five single-event frames; returns the segment path and its frame boundaries.
fn five_frames(env: &Env, run: &str) -> (std::path::PathBuf, Vec<usize>) {
    let store = env.store();
    for i in 1..=5 {
        lib_append(&store, run, &format!("event number {i}"));
    }
    let seg = env.segments(run).remove(0);
    let bounds = frame_boundaries(&std::fs::read(&seg).unwrap());
    assert_eq!(bounds.len(), 6);
    (seg, bounds)
}

/// [`five_frames`] with a bit of the third frame's payload flipped; also returns the
/// segment's bytes as they are now.
fn third_frame_flipped(env: &Env, run: &str) -> (std::path::PathBuf, Vec<usize>, Vec<u8>) {
    let (seg, b) = five_frames(env, run);
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[b[2] + 100] ^= 0x10;
    std::fs::write(&seg, &bytes).unwrap();
    (seg, b, bytes)
}

#[test]
fn cli_bit_flips_in_a_middle_record() {
    let env = Env::new();
    let run = "flip";
    let (seg, b) = five_frames(&env, run);
    let clean = std::fs::read(&seg).unwrap();
    let seg_name = seg.file_name().unwrap().to_string_lossy().into_owned();
    // Header (crc digit, len digit, len padding), payload, trailer '}' and the newline.
    let spots = [
        b[2] + 15,
        b[2] + 37,
        b[2] + 31,
        b[2] + 100,
        b[3] - 2,
        b[3] - 1,
    ];
    for (i, &at) in spots.iter().enumerate() {
        let mut bytes = clean.clone();
        bytes[at] ^= 1 << (i % 8);
        std::fs::write(&seg, &bytes).unwrap();
        let (code, rep) = env.verify(run);
        assert_eq!(code, 3, "flip at {at}: {rep}");
        assert_eq!(rep["ok"], false);
        assert_eq!(rep["corrupt"][0]["seq"], 3, "{rep}");
        assert_eq!(rep["corrupt"][0]["offset"], b[2], "{rep}");
        let out = env.swarm(&["read", "--run", run]).code(3).one_line_error(&[
            &seg_name,
            &format!("offset {}", b[2]),
            "seq 3",
        ]);
        let seqs: Vec<u64> = out.events().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [1, 2], "read stops at the damage");
        // `--last` gives the last events before the damage, then the same error.
        let out = env
            .swarm(&["read", "--run", run, "--last", "1"])
            .code(3)
            .stderr_has(&["corrupt record", &seg_name, &format!("offset {}", b[2])]);
        let seqs: Vec<u64> = out.events().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [2], "--last before the damage");
        let out = env
            .swarm(&["read", "--run", run, "--skip-corrupt"])
            .ok()
            .stderr_has(&["skipped", &format!("{}..{}", b[2], b[3]), &seg_name]);
        let seqs: Vec<u64> = out.events().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [1, 2, 4, 5]);
        let before = env.snapshot();
        env.swarm(&[
            "append",
            "--run",
            run,
            "--agent",
            "a",
            "--type",
            "evidence",
            "--content",
            "more",
        ])
        .code(3)
        .one_line_error(&["refusing to truncate", &format!("offset {}", b[2])]);
        assert_eq!(env.snapshot(), before, "a refused append changed files");
    }
    std::fs::write(&seg, &clean).unwrap();
    env.check_run(run);
}

/// Every bit of the middle frame, through the library on `MemStorage`.
#[test]
fn every_bit_of_a_middle_record() {
    let mem = MemStorage::new();
    let root = Path::new("/data");
    let run = "flip";
    let store = Store::open_with(Arc::new(mem.clone()), root, LogOptions::default()).unwrap();
    for i in 1..=5 {
        lib_append(&store, run, &format!("event number {i}"));
    }
    drop(store);
    let seg = root
        .join("anonymous")
        .join(run)
        .join("seg-00000000000000000001.jsonl");
    let clean = mem.contents(&seg).unwrap();
    let b = frame_boundaries(&clean);
    for at in b[2]..b[3] {
        for bit in 0..8 {
            let mut bytes = clean.clone();
            bytes[at] ^= 1 << bit;
            mem.set_contents(&seg, bytes.clone());
            let store =
                Store::open_with(Arc::new(mem.clone()), root, LogOptions::default()).unwrap();
            let rep = store.verify(run, |_| {}).unwrap();
            assert!(!rep.ok, "flip {at}.{bit}");
            assert_eq!(
                (rep.corrupt[0].seq, rep.corrupt[0].offset),
                (3, b[2] as u64),
                "flip {at}.{bit}"
            );
            let mut it = store.read(run, ReadOptions::default()).unwrap();
            assert_eq!(it.next().unwrap().unwrap().seq, 1);
            assert_eq!(it.next().unwrap().unwrap().seq, 2);
            match it.next() {
                Some(Err(Error::Corrupt { offset, seq, .. })) => {
                    assert_eq!((offset, seq), (b[2] as u64, 3), "flip {at}.{bit}")
                }
                other => panic!("flip {at}.{bit}: {other:?}"),
            }
            let mut it = store
                .read(
                    run,
                    ReadOptions {
                        skip_corrupt: true,
                        ..ReadOptions::default()
                    },
                )
                .unwrap();
            let seqs: Vec<u64> = (&mut it).map(|e| e.unwrap().seq).collect();
            assert_eq!(seqs, [1, 2, 4, 5], "flip {at}.{bit}");
            assert_eq!(it.skipped().len(), 1);
            assert_eq!(it.skipped()[0].offset, b[2] as u64);
            match store.append(run, new_ev(None, "more"), Durability::Sync) {
                Err(Error::Corrupt { offset, .. }) => assert_eq!(offset, b[2] as u64),
                other => panic!("flip {at}.{bit}: append gave {other:?}"),
            }
            assert_eq!(mem.contents(&seg).unwrap(), bytes, "flip {at}.{bit}");
        }
    }
}

/// Damage at the end of a segment that is not the last one is corruption, not a torn
/// tail: later segments hold valid records.
#[test]
fn damage_at_the_end_of_an_older_segment() {
    let mem = MemStorage::new();
    let root = Path::new("/data");
    let run = "older";
    let opts = LogOptions {
        segment_bytes: 4096,
        ..LogOptions::default()
    };
    let store = Store::open_with(Arc::new(mem.clone()), root, opts.clone()).unwrap();
    for i in 0..40 {
        lib_append(&store, run, &format!("{i} {}", "w".repeat(200)));
    }
    drop(store);
    let mut segs: Vec<String> = mem
        .list(&root.join("anonymous").join(run))
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with("seg-"))
        .collect();
    segs.sort();
    assert!(segs.len() >= 3);
    let first = root.join("anonymous").join(run).join(&segs[0]);
    let mut bytes = mem.contents(&first).unwrap();
    let last_frame = *frame_boundaries(&bytes).iter().rev().nth(1).unwrap();
    let n = bytes.len();
    bytes[n - 10] ^= 0x20;
    mem.set_contents(&first, bytes);
    let store = Store::open_with(Arc::new(mem.clone()), root, opts).unwrap();
    let rep = store.verify(run, |_| {}).unwrap();
    assert!(!rep.ok, "{rep:?}");
    assert_eq!(rep.corrupt[0].offset, last_frame as u64);
    let err = store
        .read(run, ReadOptions::default())
        .unwrap()
        .find_map(Result::err);
    assert!(matches!(err, Some(Error::Corrupt { .. })), "{err:?}");
    // A writer folds the whole log into its rules (permissions, escalations) before it
    // appends, so it refuses to append past damage it cannot read rather than decide
    // with rules that may miss what the damaged record said.
    let err = store
        .append(run, new_ev(None, "after damage"), Durability::Sync)
        .unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    // Repair quarantines it (valid records follow in the later segments): the lost seq
    // is declared, and readers and a writer in a fresh store go on past it.
    let lost = rep.corrupt[0].seq;
    let declared = store.repair_all(run).unwrap();
    assert_eq!(declared.len(), 1, "{declared:?}");
    assert_eq!(
        LogDamagedSeqs::of(&declared[0]),
        Some((lost, lost)),
        "{declared:?}"
    );
    let store = Store::open_with(
        Arc::new(mem.clone()),
        root,
        LogOptions {
            segment_bytes: 4096,
            ..LogOptions::default()
        },
    )
    .unwrap();
    assert!(store.verify(run, |_| {}).unwrap().ok);
    let e = store
        .append(run, new_ev(None, "after the repair"), Durability::Sync)
        .unwrap();
    let seqs: Vec<u64> = lib_read(&store, run).iter().map(|e| e.seq).collect();
    let want: Vec<u64> = (1..=e.seq).filter(|&s| s != lost).collect();
    assert_eq!(seqs, want);
    // The live tail too, across the range that runs to the older segment's end.
    let tail = store
        .tail(
            run,
            swarm_memory::TailOptions {
                follow: false,
                ..swarm_memory::TailOptions::default()
            },
        )
        .unwrap();
    let seqs: Vec<u64> = tail.map(|e| e.unwrap().seq).collect();
    assert_eq!(seqs, want);
}

/// The seqs a `log_damaged` event declares lost.
struct LogDamagedSeqs;

impl LogDamagedSeqs {
    fn of(e: &swarm_memory::Event) -> Option<(u64, u64)> {
        Some((
            e.content["lost_from"].as_u64()?,
            e.content["lost_to"].as_u64()?,
        ))
    }
}

/// Tails a power loss can leave past the last frame. Zeros alone are what a
/// preallocated segment holds past its last frame anyway (the fill): nothing is torn.
/// A garbage tail, and zeros followed by bytes (pages of a torn write that reached the
/// disk out of order), are torn tails: reads and verify report them, the next append
/// cuts them, keeps the bytes in a `.broken` file and continues the seqs.
#[test]
fn zero_and_garbage_tails_are_cut_at_the_next_append() {
    let mut garbage = b"garbage \x01\x02\xff {\"f\":1,\"crc\":\"zz\n more garbage\n".to_vec();
    garbage.extend(std::iter::repeat_n(b'#', 3000));
    let mut late_page = vec![0u8; 8192];
    late_page.extend_from_slice(b"0\"}]}\n{\"f\":1,\"crc\":\"0a1b");
    late_page.extend(std::iter::repeat_n(0u8, 100));
    let late_bytes = 8192 + b"0\"}]}\n{\"f\":1,\"crc\":\"0a1b".len();
    for (tail, torn_bytes) in [
        (vec![0u8; 4096], None),
        (garbage.clone(), Some(garbage.len())),
        (late_page, Some(late_bytes)),
    ] {
        let env = Env::new();
        let run = "tail";
        let store = env.store();
        for i in 1..=3 {
            lib_append(&store, run, &format!("event {i}"));
        }
        drop(store);
        let seg = env.segments(run).remove(0);
        let mut clean = std::fs::read(&seg).unwrap();
        let frames_end = clean.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        clean.truncate(frames_end);
        let mut bytes = clean.clone();
        bytes.extend_from_slice(&tail);
        std::fs::write(&seg, &bytes).unwrap();
        assert_eq!(env.read(run).len(), 3);
        let (code, rep) = env.verify(run);
        assert_eq!(code, 0, "{rep}");
        match torn_bytes {
            None => assert_eq!(rep["torn_tail"], serde_json::Value::Null, "{rep}"),
            Some(n) => {
                assert_eq!(rep["torn_tail"]["offset"], clean.len(), "{rep}");
                assert_eq!(rep["torn_tail"]["bytes"], n, "{rep}");
            }
        }
        let out = env
            .swarm(&[
                "append",
                "--run",
                run,
                "--agent",
                "a",
                "--type",
                "evidence",
                "--content",
                "next",
            ])
            .ok();
        assert_eq!(out.events()[0].seq, 4);
        let broken = env.broken_files(run);
        match torn_bytes {
            None => assert!(broken.is_empty(), "{broken:?}"),
            Some(n) => {
                assert!(out.stderr.contains("torn tail"), "a warning is logged");
                assert_eq!(broken.len(), 1);
                assert_eq!(std::fs::read(&broken[0]).unwrap(), tail[..n]);
            }
        }
        let events = env.check_run(run);
        assert_eq!(events.len(), 4);
        if let Some(n) = torn_bytes {
            let (_, rep) = env.verify(run);
            assert_eq!(rep["repaired_tails"][0]["bytes"], n, "{rep}");
        }
    }
}

/// A damaged *last* record below the durable mark was acknowledged: it is reported
/// (verify fails), appends are refused until `repair` moves it aside, and numbering goes
/// on after it. The same damage past the durable mark (a write whose fsync never
/// published it) is a torn tail: cut at the next append and kept in a `.broken` file.
#[test]
fn damaged_last_record_is_refused_below_the_mark_and_a_torn_tail_past_it() {
    let mem = MemStorage::new();
    let root = Path::new("/data");
    let run = "last";
    let open = || Store::open_with(Arc::new(mem.clone()), root, LogOptions::default()).unwrap();
    let store = open();
    for i in 1..=2 {
        lib_append(&store, run, &format!("event {i}"));
    }
    let dir = root.join("anonymous").join(run);
    let synced_before = mem.contents(&dir.join("SYNCED")).unwrap();
    lib_append(&store, run, "event 3");
    drop(store);
    let seg = dir.join("seg-00000000000000000001.jsonl");
    let mut bytes = mem.contents(&seg).unwrap();
    let b = frame_boundaries(&bytes);
    bytes[b[2] + 60] ^= 4;
    mem.set_contents(&seg, bytes.clone());

    // Past the mark: SYNCED as it was before the third append was published.
    let synced_after = mem.contents(&dir.join("SYNCED")).unwrap();
    mem.set_contents(&dir.join("SYNCED"), synced_before);
    let store = open();
    let rep = store.verify(run, |_| {}).unwrap();
    assert!(rep.ok && rep.torn_tail.is_some(), "{rep:?}");
    let e = lib_append(&store, run, "next");
    assert_eq!(e.seq, 3);
    let broken = dir.join(format!("seg-00000000000000000001.jsonl.{}.broken", b[2]));
    let f = mem.open(&broken, OpenMode::Read).unwrap();
    assert_eq!(f.len().unwrap(), (b[3] - b[2]) as u64);
    drop(store);

    // Below the mark: the third record was acknowledged.
    mem.remove_file(&broken).unwrap();
    mem.set_contents(&seg, bytes.clone());
    mem.set_contents(&dir.join("SYNCED"), synced_after);
    let store = open();
    let rep = store.verify(run, |_| {}).unwrap();
    assert!(!rep.ok, "{rep:?}");
    assert!(rep.corrupt[0].reason.contains("seqs 3..=3"), "{rep:?}");
    let refused = store.append(run, new_ev(None, "next"), Durability::Sync);
    assert!(matches!(refused, Err(Error::Corrupt { .. })), "{refused:?}");
    assert!(
        mem.open(&broken, OpenMode::Read).is_err(),
        "acknowledged bytes cut as a torn tail"
    );
    let damaged = store.repair(run).unwrap().unwrap();
    assert_eq!(
        (damaged.seq, damaged.content["lost_from"].as_u64()),
        (4, Some(3))
    );
    let e = lib_append(&store, run, "next");
    assert_eq!(e.seq, 5);
    assert_eq!(
        lib_read(&store, run)
            .iter()
            .map(|e| e.seq)
            .collect::<Vec<_>>(),
        [1, 2, 4, 5]
    );
    assert!(store.verify(run, |_| {}).unwrap().ok);
}

/// Auxiliary files lost or garbled never make events disappear: `SYNCED` is rebuilt from
/// the log's CRC-valid frames (read, tail and verify all see every event, verify says
/// what it rebuilt), the index and checkpoints are derived and rebuilt, and a lost or
/// garbled `run.json` is reported (exit 3, naming the repair) instead of "no such run".
#[test]
fn lost_or_garbled_auxiliary_files_hide_nothing() {
    let env = Env::new();
    let run = "aux";
    let lines: Vec<serde_json::Value> = (0..30)
        .map(|i| serde_json::json!({"agent_id": format!("a{}", i % 3), "type": "evidence", "subject": "s", "content": format!("event {i}")}))
        .collect();
    env.append_lines(run, &lines);
    env.swarm(&["checkpoint", "--run", run]).ok();
    env.swarm(&["index", "rebuild", "--run", run]).ok();
    let all = env.read(run);
    assert_eq!(all.len(), 30);
    let by_agent = env
        .swarm(&["read", "--run", run, "--agent", "a1"])
        .ok()
        .events();
    let state = env.swarm(&["replay", "--run", run]).ok().stdout;
    let dir = env.run_dir(run);
    let synced = dir.join("SYNCED");
    let garbage =
        |p: &std::path::Path| std::fs::write(p, b"not the marks you are looking for").unwrap();
    for (what, damage) in [
        (
            "SYNCED deleted",
            Box::new(|| std::fs::remove_file(&synced).unwrap()) as Box<dyn Fn()>,
        ),
        ("SYNCED garbled", Box::new(|| garbage(&synced))),
        (
            "SYNCED emptied",
            Box::new(|| std::fs::write(&synced, b"").unwrap()),
        ),
    ] {
        damage();
        let out = env.swarm(&["read", "--run", run]).ok();
        assert_eq!(out.events(), all, "{what}: read");
        damage();
        assert_eq!(
            env.swarm(&["tail", "--run", run]).ok().events(),
            all,
            "{what}: tail"
        );
        damage();
        let (code, rep) = env.verify(run);
        assert_eq!(code, 0, "{what}: {rep}");
        assert_eq!(rep["records"], 30, "{what}: {rep}");
        if what != "SYNCED emptied" {
            assert!(
                rep["rebuilt"][0].as_str().unwrap().contains("SYNCED"),
                "{what}: {rep}"
            );
        }
        // Appends go on after the rebuilt marks.
        damage();
        let e = env
            .swarm(&[
                "append",
                "--run",
                run,
                "--agent",
                "a0",
                "--type",
                "evidence",
                "--content",
                "later",
            ])
            .ok()
            .events();
        assert_eq!(e[0].seq, 31, "{what}");
        let out = env.read(run);
        assert_eq!(out[..30], all[..], "{what}");
        let cut = out.len();
        // Back to 30 events for the next case: drop the appended frame the honest way.
        let seg = env.segments(run).remove(0);
        let bytes = std::fs::read(&seg).unwrap();
        let bounds = frame_boundaries(&bytes);
        std::fs::write(&seg, &bytes[..bounds[bounds.len() - 2]]).unwrap();
        std::fs::remove_file(&synced).unwrap();
        assert_eq!(env.read(run).len(), cut - 1, "{what}");
    }
    // Index files and checkpoints: deleted, then garbled; reads and replay agree.
    for garble in [false, true] {
        // Fresh derived files each round, so there is something to delete or garble.
        env.swarm(&["checkpoint", "--run", run]).ok();
        env.swarm(&["index", "rebuild", "--run", run]).ok();
        let files = |d: &std::path::Path| std::fs::read_dir(d).map_or(0, |r| r.count());
        assert!(files(&dir.join("index")) > 0);
        for sub in ["index"] {
            for f in std::fs::read_dir(dir.join(sub)).unwrap() {
                let p = f.unwrap().path();
                if garble {
                    garbage(&p)
                } else if p.is_file() {
                    std::fs::remove_file(&p).unwrap()
                }
            }
        }
        let ck = env.path().join(".checkpoints").join("anonymous").join(run);
        for f in std::fs::read_dir(&ck).unwrap() {
            let p = f.unwrap().path();
            if garble {
                garbage(&p)
            } else {
                std::fs::remove_file(&p).unwrap()
            }
        }
        let (code, rep) = env.verify(run);
        assert_eq!(code, 0, "{rep}");
        if garble {
            let listed = rep["rebuilt"].to_string();
            assert!(
                listed.contains("ckpt-") && listed.contains("index"),
                "garbled files not reported: {rep}"
            );
        }
        assert_eq!(
            env.swarm(&["read", "--run", run, "--agent", "a1"])
                .ok()
                .events(),
            by_agent
        );
        let again = env.swarm(&["replay", "--run", run]).ok().stdout;
        let st =
            |s: &str| serde_json::from_str::<serde_json::Value>(s.trim()).unwrap()["state"].clone();
        assert_eq!(st(&again), st(&state), "garbled {garble}");
    }
    // run.json: lost, then garbled. Never "not found"; repair rebuilds it.
    for garble in [false, true] {
        let meta = dir.join("run.json");
        if garble {
            garbage(&meta)
        } else {
            std::fs::remove_file(&meta).unwrap()
        }
        if !garble {
            env.swarm(&["read", "--run", run])
                .code(3)
                .one_line_error(&["run.json", "swarm repair"]);
            // A writer does not create a new run.json over the log (another creation
            // time and segment size), nor write anything.
            let before = env.snapshot();
            env.append_evidence(run, &["--content", "refused"])
                .code(3)
                .one_line_error(&["run.json", "swarm repair"]);
            assert_eq!(env.snapshot(), before);
        }
        let (code, rep) = env.verify(run);
        assert_eq!(code, 3, "{rep}");
        env.swarm(&["repair", "--run", run]).ok();
        assert_eq!(env.read(run), all);
        assert_eq!(env.verify(run).0, 0);
    }
}

/// A run is created segment first, `run.json` second. In between (or after a crash in
/// between) the run holds no record: readers are told it does not exist yet, not that it
/// is damaged, and the next append creates it from seq 1. A first segment that holds
/// bytes without `run.json` is still damage.
#[test]
fn a_run_caught_between_its_first_segment_and_run_json_is_not_there_yet() {
    let env = Env::new();
    let run = "creating";
    let dir = env.run_dir(run);
    std::fs::create_dir_all(&dir).unwrap();
    let seg = dir.join(swarm_memory::log::segment::segment_name(1));
    std::fs::File::create(&seg).unwrap();
    let out = env.swarm(&["read", "--run", run]).code(2);
    assert!(
        out.stderr.contains("not found") || out.stderr.contains("no run"),
        "{}",
        out.stderr
    );
    let stored = env.append_lines(run, &[serde_json::json!({"agent_id": "a", "type": "evidence", "subject": "s", "content": "first"})]);
    assert_eq!(stored.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1]);
    assert_eq!(env.read(run).len(), 1);
    // The same shape with a record in the segment: damage, named with its repair.
    std::fs::remove_file(dir.join("run.json")).unwrap();
    env.swarm(&["read", "--run", run])
        .code(3)
        .one_line_error(&["run.json", "swarm repair"]);
}

/// A run closed and archived by another process while this one has it open: the
/// writer's next append is refused (checked under `LOCK`, once a write group), and
/// neither it nor a new writer puts a file back in the archived run's directory.
#[test]
fn an_archived_run_refuses_a_writer_that_had_it_open() {
    let env = Env::new();
    let run = "archived-under-a-writer";
    let (a, b) = (env.store(), env.store());
    lib_append(&a, run, "one");
    lib_append(&b, run, "two");
    b.close_run(run, "lead").unwrap();
    let dir = env.run_dir(run);
    let files = || {
        let mut v: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let before = files();
    assert!(before.contains(&"ARCHIVED".to_string()), "{before:?}");
    for (store, what) in [
        (&a, "the writer that had it open"),
        (&env.store(), "a new one"),
    ] {
        for durability in [Durability::Sync, Durability::None] {
            match store.append(run, new_ev(None, "late"), durability) {
                Err(Error::Forbidden(m)) => assert!(m.contains("archived"), "{what}: {m}"),
                other => panic!("{what}: {other:?}"),
            }
        }
        assert_eq!(files(), before, "{what}");
    }
}

/// Records appended with `none` durability are shown to readers before their fsync; a power
/// loss can take them while `SYNCED` (which is not fsynced either) survives. Their seqs
/// were seen, so the next append declares them lost with a `log_damaged` event and goes on
/// after them: a tailer whose cursor is past them misses nothing, no seq means two things.
#[test]
fn seqs_readers_saw_that_a_power_loss_took_are_never_reused() {
    let env = Env::new();
    let run = "unsynced";
    let store = env.store();
    for i in 1..=3 {
        lib_append(&store, run, &format!("durable {i}"));
    }
    for i in 4..=5 {
        store
            .append(
                run,
                new_ev(None, &format!("seen, never synced {i}")),
                Durability::None,
            )
            .unwrap();
    }
    let seen: Vec<u64> = lib_read(&store, run).iter().map(|e| e.seq).collect();
    assert_eq!(seen, [1, 2, 3, 4, 5], "readers saw the unsynced records");
    drop(store);
    // The power loss: the unsynced frames are gone, SYNCED's newer marks survived.
    let seg = env.segments(run).remove(0);
    let b = frame_boundaries(&std::fs::read(&seg).unwrap());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(b[3] as u64)
        .unwrap();
    let store = env.store();
    let next = lib_append(&store, run, "after the power loss");
    let events = lib_read(&store, run);
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 6, 7], "{events:?}");
    assert_eq!(next.seq, 7);
    let gap = &events[3];
    assert_eq!(gap.kind, swarm_memory::EventType::LogDamaged);
    assert_eq!(gap.content["lost_from"], 4);
    assert_eq!(gap.content["lost_to"], 5);
    assert!(
        gap.content["reason"].as_str().unwrap().contains("fsync"),
        "{gap:?}"
    );
    let (code, rep) = env.verify(run);
    assert_eq!(code, 0, "{rep}");
    // A reopened store finds the declared gap and does not declare it again.
    drop(store);
    let store = env.store();
    assert_eq!(lib_append(&store, run, "later").seq, 8);
    env.check_run(run);
}

/// A closed run whose archive file is gone is lost data like any other: `runs` and
/// `verify` list every run and name it (exit 3). They stopped at the missing file with
/// an I/O error (exit 1) and listed no run at all.
#[test]
fn a_missing_archive_is_damage_not_a_stop() {
    let env = Env::new();
    let store = env.store();
    lib_append(&store, "healthy", "connection pool exhausted on orders-db");
    lib_append(&store, "closed", "disk full on ingest-3");
    drop(store);
    env.swarm(&["run", "close", "closed", "--by", "lead"]).ok();
    std::fs::remove_file(env.path().join(".archive/anonymous/closed.swarc")).unwrap();

    let out = env.swarm(&["runs", "--json"]).code(3);
    let rows: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2, "{}", out.stdout);
    let closed = rows.iter().find(|r| r["run_id"] == "closed").unwrap();
    assert!(
        closed["damaged"]
            .as_str()
            .unwrap()
            .contains("archive is missing"),
        "{closed}"
    );
    let out = env.swarm(&["verify"]).code(3);
    assert!(out.stdout.contains("\"healthy\""), "{}", out.stdout);
    let out = env.swarm(&["verify", "--run", "closed"]).code(3);
    let report: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(report["ok"], false, "{report}");
    assert!(
        report["error"]
            .as_str()
            .unwrap()
            .contains("archive is missing"),
        "{report}"
    );
    assert!(!out.stderr.contains("expected seq 0"), "{}", out.stderr);
}

/// One damaged run does not stop the commands that cover every run of the user: `runs`
/// lists every run (the damaged one with where its damage is) and exits 3; `synth --all`
/// synthesizes every intact record, names the damaged ones in its report and exits 3;
/// `search` answers from the other runs and the intact records.
#[test]
fn a_damaged_run_does_not_stop_user_wide_commands() {
    let env = Env::new();
    let (seg, b) = five_frames(&env, "broken");
    let store = env.store();
    lib_append(&store, "healthy", "connection pool exhausted on orders-db");
    drop(store);
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[b[2] + 100] ^= 0x04;
    std::fs::write(&seg, &bytes).unwrap();
    // And a closed run whose archive no longer reads back.
    let store = env.store();
    lib_append(&store, "closed", "disk full on ingest-3");
    drop(store);
    env.swarm(&["run", "close", "closed", "--by", "lead"]).ok();
    let archive = env.path().join(".archive/anonymous/closed.swarc");
    let mut z = std::fs::read(&archive).unwrap();
    let mid = z.len() / 2;
    z[mid] ^= 0xff;
    std::fs::write(&archive, &z).unwrap();

    let out = env.swarm(&["runs"]).code(3);
    assert!(out.stdout.contains("healthy"), "{}", out.stdout);
    assert!(out.stdout.contains("broken"), "{}", out.stdout);
    assert!(out.stdout.contains("damaged bytes at"), "{}", out.stdout);
    let out = env.swarm(&["runs", "--json"]).code(3);
    let rows: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3);
    let closed = rows.iter().find(|r| r["run_id"] == "closed").unwrap();
    assert!(
        closed["damaged"].as_str().unwrap().contains("archive"),
        "{closed}"
    );
    let broken = rows.iter().find(|r| r["run_id"] == "broken").unwrap();
    assert!(
        broken["damaged"].as_str().unwrap().contains("seq 3"),
        "{broken}"
    );
    assert_eq!(broken["head_seq"], 5, "{broken}");
    let healthy = rows.iter().find(|r| r["run_id"] == "healthy").unwrap();
    assert!(healthy.get("damaged").is_none(), "{healthy}");

    let out = env.swarm(&["synth", "--all"]).code(3);
    let rep: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let runs = rep["runs"].as_array().unwrap();
    let of = |name: &str| runs.iter().find(|r| r["run"] == name).cloned().unwrap();
    assert_eq!(of("healthy")["events"], 1, "{rep}");
    assert!(of("healthy").get("damaged").is_none(), "{rep}");
    assert_eq!(of("broken")["events"], 4, "every intact record: {rep}");
    assert!(of("closed")["damaged"][0].as_str().is_some(), "{rep}");
    assert!(
        of("broken")["damaged"][0]
            .as_str()
            .unwrap()
            .contains("seq 3"),
        "{rep}"
    );

    let out = env
        .swarm(&["search", "connection pool exhausted", "--json"])
        .ok();
    assert!(out.stdout.contains("orders-db"), "{}", out.stdout);
    // As an agent too (the damaged run's policy cannot be read: that run is left out).
    let out = env
        .swarm(&[
            "search",
            "connection pool exhausted",
            "--as-agent",
            "db",
            "--json",
        ])
        .ok();
    assert!(out.stdout.contains("orders-db"), "{}", out.stdout);
    // The damaged run asked for by name reports its damage.
    env.swarm(&[
        "search",
        "connection pool exhausted",
        "--run",
        "broken",
        "--as-agent",
        "db",
    ])
    .code(3);

    // Repair does not cut damage that valid records follow (that would drop them): it
    // quarantines it, and the run is whole again for every command.
    let out = env.swarm(&["repair", "--run", "broken"]).ok();
    let ev: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(ev["type"], "log_damaged", "{ev}");
    assert_eq!(
        (&ev["content"]["lost_from"], &ev["content"]["lost_to"]),
        (&3.into(), &3.into()),
        "{ev}"
    );
    let after = std::fs::read(&seg).unwrap();
    assert_eq!(
        &after[..b[5]],
        &bytes[..b[5]],
        "nothing cut, nothing rewritten"
    );
    let out = env.swarm(&["runs", "--json"]).code(3);
    let broken: serde_json::Value = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["run_id"] == "broken")
        .unwrap();
    assert!(broken.get("damaged").is_none(), "{broken}");
    assert_eq!(broken["head_seq"], 6, "{broken}");
}

/// `swarm repair` on damage that valid records follow (a flipped bit in the middle of
/// the last segment, which no writer could open and no repair could cut): the damaged
/// bytes are copied aside, the range listed in `QUARANTINE`, a `log_damaged` event names
/// the lost seq; every read, the board, replay, tail and a writer in a new process step
/// over it, and only over it; a lost list brings the damage back (fails safe).
#[test]
fn repair_quarantines_damage_that_valid_records_follow() {
    let env = Env::new();
    let run = "q";
    let (seg, b, bytes) = third_frame_flipped(&env, run);
    let append =
        |content: &str| env.append_evidence(run, &["--subject", "s", "--content", content]);
    // Before: a new writer refuses the run, and so do the board and replay.
    append("refused")
        .code(3)
        .one_line_error(&["offset", "seq 3"]);
    env.swarm(&["board", "--run", run]).code(3);
    env.swarm(&["replay", "--run", run, "--at-seq", "5"])
        .code(3);

    let out = env.swarm(&["repair", "--run", run]).ok();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{}", out.stdout);
    let ev: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(ev["seq"], 6, "{ev}");
    let c = &ev["content"];
    assert_eq!(
        (c["lost_from"].as_u64(), c["lost_to"].as_u64()),
        (Some(3), Some(3)),
        "{ev}"
    );
    assert_eq!(c["offset"].as_u64(), Some(b[2] as u64), "{ev}");
    let dir = seg.parent().unwrap();
    let kept = std::fs::read(dir.join(c["kept_in"].as_str().unwrap())).unwrap();
    assert_eq!(
        kept,
        bytes[b[2]..b[3]],
        "the damaged bytes are kept as they were"
    );
    assert!(dir.join("QUARANTINE").exists());

    // After: everything but seq 3, in every mode, exit 0.
    let seqs =
        |out: &crate::util::Out| -> Vec<u64> { out.events().iter().map(|e| e.seq).collect() };
    assert_eq!(
        seqs(&env.swarm(&["read", "--run", run]).ok()),
        [1, 2, 4, 5, 6]
    );
    assert_eq!(
        seqs(
            &env.swarm(&["read", "--run", run, "--from-seq", "2", "--limit", "2"])
                .ok()
        ),
        [2, 4]
    );
    assert_eq!(
        seqs(&env.swarm(&["tail", "--run", run, "--from-seq", "1"]).ok()),
        [1, 2, 4, 5, 6]
    );
    let (code, rep) = env.verify(run);
    assert_eq!(code, 0, "{rep}");
    assert_eq!(rep["quarantined"][0]["lost_from"], 3, "{rep}");
    assert_eq!(rep["corrupt"].as_array().map(Vec::len), Some(0), "{rep}");
    env.swarm(&["replay", "--run", run, "--at-seq", "5"]).ok();
    // At the lost seq: the state at the seq before it (not "past the run's head").
    let at3 = env.swarm(&["replay", "--run", run, "--at-seq", "3"]).ok();
    let at2 = env.swarm(&["replay", "--run", run, "--at-seq", "2"]).ok();
    let state = |o: &crate::util::Out| {
        let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
        v["state"].clone()
    };
    assert_eq!(state(&at3), state(&at2));
    assert_eq!(state(&at3)["head_seq"], 2);
    env.swarm(&["replay", "--run", run, "--at-seq", "7"])
        .code(2);
    // A writer in a new process opens the run and goes on after the head.
    let e = append("after the repair").ok();
    assert_eq!(seqs(&e), [7]);
    let board = env.swarm(&["board", "--run", run]).ok();
    assert!(
        board.stdout.contains("after the repair"),
        "{}",
        board.stdout
    );
    // An append with an id reads every id of the run (its retry check): past the range.
    let out = env
        .append_evidence(run, &["--content", "x", "--id", "my-1"])
        .ok();
    assert_eq!(seqs(&out), [8]);
    // Repairing again finds nothing to do.
    assert_eq!(
        env.swarm(&["repair", "--run", run]).ok().stdout.trim(),
        "null"
    );

    // New damage elsewhere is reported as before: the list covers its range only.
    let mut again = std::fs::read(&seg).unwrap();
    again[b[4] + 100] ^= 0x10;
    std::fs::write(&seg, &again).unwrap();
    let (code, rep) = env.verify(run);
    assert_eq!(code, 3, "{rep}");
    assert_eq!(rep["corrupt"][0]["seq"], 5, "{rep}");
    again[b[4] + 100] ^= 0x10;
    std::fs::write(&seg, &again).unwrap();
    // A lost list brings the damage back (exit 3) until repair lists it again, without
    // declaring the loss a second time (it did: two `log_damaged` events for seq 3).
    std::fs::remove_file(dir.join("QUARANTINE")).unwrap();
    let (code, rep) = env.verify(run);
    assert_eq!(code, 3, "{rep}");
    assert_eq!(rep["corrupt"][0]["seq"], 3, "{rep}");
    env.swarm(&["repair", "--run", run]).ok();
    assert_eq!(env.verify(run).0, 0);
    assert_eq!(
        seqs(&env.swarm(&["read", "--run", run]).ok()),
        [1, 2, 4, 5, 6, 7, 8]
    );
    let declared = env
        .swarm(&["read", "--run", run, "--type", "log_damaged"])
        .ok();
    assert_eq!(declared.stdout.lines().count(), 1, "{}", declared.stdout);
}

/// A repair that crashed after listing a range in `QUARANTINE` but before its
/// `log_damaged` event was durable: the range is already stepped over, and the next
/// repair writes the missing event (once), so every quarantined loss is in the log.
#[test]
fn a_repair_that_crashed_before_declaring_the_loss_is_finished_by_the_next() {
    let env = Env::new();
    let run = "crashed";
    let (seg, b, bytes) = third_frame_flipped(&env, run);
    let dir = seg.parent().unwrap();
    let name = seg.file_name().unwrap().to_string_lossy().into_owned();
    let kept = format!("{name}.{}.damaged", b[2]);
    std::fs::write(dir.join(&kept), &bytes[b[2]..b[3]]).unwrap();
    let list = serde_json::json!({"version": 1, "ranges": [{
        "segment": 1, "offset": b[2], "end": b[3], "lost_from": 3, "lost_to": 3,
        "kept_in": kept, "reason": "crc mismatch"}]});
    std::fs::write(dir.join("QUARANTINE"), list.to_string()).unwrap();
    let seqs =
        |out: &crate::util::Out| -> Vec<u64> { out.events().iter().map(|e| e.seq).collect() };
    assert_eq!(seqs(&env.swarm(&["read", "--run", run]).ok()), [1, 2, 4, 5]);
    let out = env.swarm(&["repair", "--run", run]).ok();
    let ev: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(ev["type"], "log_damaged", "{ev}");
    assert_eq!(ev["content"]["lost_from"], 3, "{ev}");
    assert_eq!(ev["content"]["offset"], b[2], "{ev}");
    assert_eq!(
        env.swarm(&["repair", "--run", run]).ok().stdout.trim(),
        "null"
    );
    assert_eq!(
        seqs(&env.swarm(&["read", "--run", run]).ok()),
        [1, 2, 4, 5, 6]
    );
}

/// Damage with exactly one valid frame after it, past the durable mark (`none` mode):
/// the next writer refuses to truncate (it would cut the valid frame as a torn tail).
#[test]
fn one_valid_frame_after_damage_is_never_cut_as_a_torn_tail() {
    let env = Env::new();
    let run = "one";
    let add = |content: &str, durability: &str| {
        env.append_evidence(run, &["--content", content, "--durability", durability])
            .ok();
    };
    add("event number 1", "sync");
    add("event number 2", "sync");
    add("event number 3", "none");
    add("event number 4", "none");
    let seg = env.segments(run).remove(0);
    let mut bytes = std::fs::read(&seg).unwrap();
    let b = frame_boundaries(&bytes);
    bytes[b[2] + 100] ^= 0x10;
    std::fs::write(&seg, &bytes).unwrap();
    env.append_evidence(run, &["--content", "x"])
        .code(3)
        .one_line_error(&["valid records follow"]);
    assert_eq!(std::fs::read(&seg).unwrap(), bytes, "nothing cut");
}

/// Lost blocks in the middle of a sealed segment (a whole frame of zeros, valid frames
/// after it), quarantined by `repair`: a tail steps over the range as a read does. It took
/// the zeros for a preallocated fill, left the segment there and failed at the next one.
#[test]
fn a_tail_steps_over_zeroed_frames_repair_quarantined_in_a_sealed_segment() {
    let mem = MemStorage::new();
    let open = || small_segments(&mem);
    let (dir, segs) = filled(&mem, "z", 120);
    let dir = dir.as_path();
    assert!(segs.len() >= 3, "{segs:?}");
    let seg = dir.join(&segs[1]);
    let mut bytes = mem.contents(&seg).unwrap();
    let b = frame_boundaries(&bytes);
    bytes[b[3]..b[4]].fill(0);
    mem.set_contents(&seg, bytes);
    let store = open();
    let lost = store.repair("z").unwrap().expect("a loss declared");
    assert_eq!(
        lost.content["lost_from"], lost.content["lost_to"],
        "{lost:?}"
    );
    let read: Vec<u64> = lib_read(&store, "z").iter().map(|e| e.seq).collect();
    let tailed: Vec<u64> = store
        .tail(
            "z",
            swarm_memory::TailOptions {
                follow: false,
                ..swarm_memory::TailOptions::default()
            },
        )
        .unwrap()
        .map(|e| e.unwrap().seq)
        .collect();
    assert_eq!(tailed, read);
    assert_eq!(read.len(), 120, "119 events and the log_damaged record");
}

/// A sealed segment that lost its last records: cut at a frame boundary, cut inside a
/// frame (as a file system cuts: by blocks), emptied; and the run's first segment
/// emptied. Before, the run was stuck for good (every read stopped at the next segment,
/// appends were refused, and `repair` failed with the same error), or, for the first
/// segment, filtered reads silently started later. Now every read, tail (both
/// visibilities) and the index report the missing seqs until `repair` lists and declares
/// them; then reads, tails, the index, appends and a fresh handle go on past them.
#[test]
fn repair_lists_records_lost_at_the_end_of_a_sealed_segment() {
    for how in ["at a frame", "inside a frame", "emptied", "first emptied"] {
        let mem = MemStorage::new();
        let open = || small_segments(&mem);
        let (dir, segs) = filled(&mem, "z", 120);
        let dir = dir.as_path();
        assert!(segs.len() >= 3, "{segs:?}");
        let base = |i: usize| swarm_memory::log::segment::parse_segment_name(&segs[i]).unwrap();
        let k = if how == "first emptied" { 0 } else { 1 };
        let seg = dir.join(&segs[k]);
        let mut bytes = mem.contents(&seg).unwrap();
        let b = frame_boundaries(&bytes);
        let (cut, lost_from) = match how {
            "at a frame" => (b[b.len() - 3], base(k + 1) - 2),
            "inside a frame" => (b[b.len() - 3] + 10, base(k + 1) - 2),
            _ => (0, base(k)),
        };
        let lost_to = base(k + 1) - 1;
        bytes.truncate(cut);
        mem.set_contents(&seg, bytes);

        let store = open();
        let report = store.verify("z", |_| {}).unwrap();
        assert!(!report.ok, "{how}");
        assert_eq!(report.corrupt.len(), 1, "{how}: {:?}", report.corrupt);
        let d = &report.corrupt[0];
        let at = if how == "inside a frame" {
            cut - 10
        } else {
            cut
        };
        assert_eq!((d.offset, d.seq), (at as u64, lost_from), "{how}: {d:?}");
        assert!(
            d.segment.ends_with(&segs[k]),
            "{how}: the segment that lost them: {d:?}"
        );
        assert!(
            d.reason
                .contains(&format!("seqs {lost_from}..={lost_to} are missing")),
            "{how}: {d:?}"
        );
        let read = |opts: ReadOptions| -> Result<Vec<u64>, Error> {
            store.read("z", opts)?.map(|e| e.map(|e| e.seq)).collect()
        };
        let by_agent = || ReadOptions {
            agent: Some("agent-1".into()),
            ..Default::default()
        };
        assert!(read(ReadOptions::default()).is_err(), "{how}");
        assert!(read(by_agent()).is_err(), "{how}: an indexed read too");
        let tail = |visibility: swarm_memory::Visibility| -> Result<Vec<u64>, Error> {
            store
                .tail(
                    "z",
                    swarm_memory::TailOptions {
                        follow: false,
                        visibility,
                        ..swarm_memory::TailOptions::default()
                    },
                )?
                .map(|e| e.map(|e| e.seq))
                .collect()
        };
        use swarm_memory::Visibility::{Visible, Written};
        assert!(tail(Visible).is_err(), "{how}");
        assert!(
            tail(Written).is_err(),
            "{how}: a tail of what is written too"
        );
        let refused = store.append(
            "z",
            swarm_memory::NewEvent::new("a", swarm_memory::EventType::Evidence, json!("x")),
            swarm_memory::Durability::Sync,
        );
        assert!(
            matches!(refused, Err(Error::Corrupt { .. })),
            "{how}: {refused:?}"
        );
        // A read that skips damage keeps every intact event (it dropped the next
        // segment's first frame before).
        let skipping = read(ReadOptions {
            skip_corrupt: true,
            ..Default::default()
        })
        .unwrap();
        let intact: Vec<u64> = (1..=120)
            .filter(|s| !(lost_from..=lost_to).contains(s))
            .collect();
        assert_eq!(skipping, intact, "{how}");

        let lost = store.repair_all("z").unwrap();
        assert_eq!(lost.len(), 1, "{how}: {lost:?}");
        assert_eq!(lost[0].content["lost_from"], json!(lost_from), "{how}");
        assert_eq!(lost[0].content["lost_to"], json!(lost_to), "{how}");
        assert!(store.verify("z", |_| {}).unwrap().ok, "{how}");
        assert!(
            store.repair_all("z").unwrap().is_empty(),
            "{how}: nothing left"
        );
        let after = lib_append(&store, "z", "after the repair");
        assert_eq!(after.seq, lost[0].seq + 1);
        drop(store);

        let store = open();
        let want: Vec<u64> = (1..=after.seq)
            .filter(|s| !(lost_from..=lost_to).contains(s))
            .collect();
        let read = |opts: ReadOptions| seqs_read(&store, "z", opts);
        assert_eq!(read(ReadOptions::default()), want, "{how}");
        let by_agent: Vec<u64> = want.iter().copied().filter(|&s| s != lost[0].seq).collect();
        assert_eq!(read(by_agent_opts()), by_agent, "{how}");
        let index = store.rebuild_index("z", |_, _| {}).unwrap();
        assert_eq!(index.head_seq, after.seq, "{how}: the index covers the gap");
        assert_eq!(read(by_agent_opts()), by_agent, "{how}: through the index");
        for tailed in tails_read(&store, "z") {
            assert_eq!(tailed, want, "{how}");
        }
        // The fold reaches the head.
        assert_eq!(store.head_state("z").unwrap().state.head_seq, after.seq);
        // Cut further: damage that spreads is reported again, never stepped over.
        if cut > 0 {
            let mut bytes = mem.contents(&seg).unwrap();
            bytes.truncate(b[b.len() - 4]);
            mem.set_contents(&seg, bytes);
            let store = open();
            let report = store.verify("z", |_| {}).unwrap();
            assert!(!report.ok, "{how}");
            assert_eq!(report.corrupt[0].seq, lost_from - 1, "{how}");
        }
    }
}

/// A segment cut short, with the next segment empty (created by the rotation, nothing
/// written to it yet): reads and `verify` report the acknowledged seqs missing below the
/// durable mark, and `repair` declares them through the empty segment.
#[test]
fn seqs_lost_before_an_empty_last_segment_are_reported_and_repaired() {
    // Cut at a frame boundary, and inside a frame (that case was stuck: the writer
    // refused the incomplete frame of a segment that is not the last, and so did repair).
    for inside in [0usize, 10] {
        lost_before_an_empty_last_segment(inside);
    }
}

fn lost_before_an_empty_last_segment(inside: usize) {
    let mem = MemStorage::new();
    let open = || small_segments(&mem);
    let (dir, segs) = filled(&mem, "e", 60);
    let dir = dir.as_path();
    let n = segs.len();
    // The rotation after seq 60 created the next segment; nothing was written to it.
    mem.set_contents(&dir.join("seg-00000000000000000061.jsonl"), Vec::new());
    let last = dir.join(&segs[n - 1]);
    let mut bytes = mem.contents(&last).unwrap();
    let b = frame_boundaries(&bytes);
    bytes.truncate(b[b.len() - 3] + inside);
    mem.set_contents(&last, bytes);

    let store = open();
    let report = store.verify("e", |_| {}).unwrap();
    assert!(!report.ok, "{report:?}");
    let d = &report.corrupt[0];
    assert_eq!(d.seq, 59, "{d:?}");
    assert_eq!(d.offset, b[b.len() - 3] as u64, "{d:?}");
    assert!(d.reason.contains("seqs 59..=60"), "{d:?}");
    assert!(store
        .read("e", ReadOptions::default())
        .unwrap()
        .any(|e| e.is_err()));
    store.repair_all("e").unwrap();
    assert!(store.verify("e", |_| {}).unwrap().ok);
    let after = lib_append(&store, "e", "after");
    let events = lib_read(&open(), "e");
    let declared = events
        .iter()
        .find(|e| e.kind == swarm_memory::EventType::LogDamaged)
        .expect("the loss declared");
    assert_eq!(
        (&declared.content["lost_from"], &declared.content["lost_to"]),
        (&json!(59), &json!(60))
    );
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let want: Vec<u64> = (1..=58).chain([declared.seq, after.seq]).collect();
    assert_eq!(seqs, want);
    // Reads through a rebuilt index and both kinds of tail see the same.
    let store = open();
    let index = store.rebuild_index("e", |_, _| {}).unwrap();
    assert_eq!(index.head_seq, after.seq, "the index covers the gap");
    let by_agent = seqs_read(&store, "e", by_agent_opts());
    assert_eq!(by_agent, (1..=58).chain([after.seq]).collect::<Vec<_>>());
    for tailed in tails_read(&store, "e") {
        assert_eq!(tailed, want, "both tails");
    }
}

/// Double faults: a sealed segment cut short (at a frame or inside one) and the next
/// sealed segment emptied. The seqs lost in both are one range; `repair` declares it,
/// and reads, the index and both tails step over it.
#[test]
fn a_cut_segment_followed_by_an_emptied_one() {
    for inside in [0usize, 10] {
        let mem = MemStorage::new();
        let open = || small_segments(&mem);
        let (dir, segs) = filled(&mem, "w", 160);
        let dir = dir.as_path();
        assert!(segs.len() >= 4, "{segs:?}");
        let base = |i: usize| swarm_memory::log::segment::parse_segment_name(&segs[i]).unwrap();
        let first = dir.join(&segs[1]);
        let mut bytes = mem.contents(&first).unwrap();
        let b = frame_boundaries(&bytes);
        bytes.truncate(b[b.len() - 3] + inside);
        mem.set_contents(&first, bytes);
        mem.set_contents(&dir.join(&segs[2]), Vec::new());
        let (lost_from, lost_to) = (base(2) - 2, base(3) - 1);

        let store = open();
        let report = store.verify("w", |_| {}).unwrap();
        assert!(!report.ok, "{inside}");
        assert!(
            report.corrupt[0]
                .reason
                .contains(&format!("seqs {lost_from}..=")),
            "{inside}: {:?}",
            report.corrupt
        );
        let lost = store.repair_all("w").unwrap();
        let declared: Vec<(u64, u64)> = lost
            .iter()
            .map(|e| {
                (
                    e.content["lost_from"].as_u64().unwrap(),
                    e.content["lost_to"].as_u64().unwrap(),
                )
            })
            .collect();
        let covered: Vec<u64> = declared.iter().flat_map(|&(a, b)| a..=b).collect();
        assert_eq!(
            covered,
            (lost_from..=lost_to).collect::<Vec<_>>(),
            "{inside}: {declared:?}"
        );
        assert!(store.verify("w", |_| {}).unwrap().ok, "{inside}");
        let after = lib_append(&store, "w", "after the repair");
        drop(store);

        let store = open();
        let declared_seqs: Vec<u64> = lost.iter().map(|e| e.seq).collect();
        let want: Vec<u64> = (1..=after.seq)
            .filter(|s| !(lost_from..=lost_to).contains(s))
            .collect();
        let read = |opts: ReadOptions| seqs_read(&store, "w", opts);
        assert_eq!(read(ReadOptions::default()), want, "{inside}");
        let by_agent: Vec<u64> = want
            .iter()
            .copied()
            .filter(|s| !declared_seqs.contains(s))
            .collect();
        let index = store.rebuild_index("w", |_, _| {}).unwrap();
        assert_eq!(
            index.head_seq, after.seq,
            "{inside}: the index covers the gap"
        );
        assert_eq!(
            read(by_agent_opts()),
            by_agent,
            "{inside}: through the index"
        );
        for tailed in tails_read(&store, "w") {
            assert_eq!(tailed, want, "{inside}");
        }
        assert_eq!(store.head_state("w").unwrap().state.head_seq, after.seq);
    }
}

/// Two losses repaired one after the other, in neighbouring segments (an index that
/// chained only through segments holding frames stopped at the second for good), and a
/// loss found before an earlier repair's emptied segment (an index that ended on the
/// emptied segment let filtered reads skip the new loss silently).
#[test]
fn losses_repaired_one_after_another_and_a_new_loss_before_an_old_one() {
    let cut_end = |mem: &MemStorage, p: &Path| {
        let mut bytes = mem.contents(p).unwrap();
        let b = frame_boundaries(&bytes);
        bytes.truncate(b[b.len() - 3]);
        mem.set_contents(p, bytes);
    };
    for case in [
        "emptied then cut before",
        "emptied then emptied",
        "cut then emptied",
    ] {
        let mem = MemStorage::new();
        let open = || small_segments(&mem);
        let (dir, segs) = filled(&mem, "v", 200);
        let dir = dir.as_path();
        assert!(segs.len() >= 6, "{segs:?}");
        let seg = |i: usize| dir.join(&segs[i]);
        type Damage<'a> = Box<dyn Fn() + 'a>;
        let (first, second): (Damage, Damage) = match case {
            "cut then emptied" => (
                Box::new(|| cut_end(&mem, &seg(2))),
                Box::new(|| mem.set_contents(&seg(3), Vec::new())),
            ),
            "emptied then emptied" => (
                Box::new(|| mem.set_contents(&seg(2), Vec::new())),
                Box::new(|| mem.set_contents(&seg(3), Vec::new())),
            ),
            _ => (
                Box::new(|| mem.set_contents(&seg(3), Vec::new())),
                Box::new(|| cut_end(&mem, &seg(2))),
            ),
        };
        first();
        let store = open();
        assert_eq!(store.repair_all("v").unwrap().len(), 1, "{case}");
        store.rebuild_index("v", |_, _| {}).unwrap();
        drop(store);
        second();
        let store = open();
        let filtered = |store: &Store| -> Result<Vec<u64>, Error> {
            store
                .read("v", by_agent_opts())?
                .map(|e| e.map(|e| e.seq))
                .collect()
        };
        // Before the second repair every read reports the new loss, indexed ones too.
        assert!(filtered(&store).is_err(), "{case}: {:?}", filtered(&store));
        let index = store.rebuild_index("v", |_, _| {}).unwrap();
        assert!(filtered(&store).is_err(), "{case}: through a rebuilt index");
        assert!(index.head_seq < 200, "{case}: {index:?}");
        let lost = store.repair_all("v").unwrap();
        assert_eq!(lost.len(), 1, "{case}: {lost:?}");
        assert!(store.verify("v", |_| {}).unwrap().ok, "{case}");
        let after = lib_append(&store, "v", "after");
        drop(store);
        let store = open();
        let all: Vec<swarm_memory::Event> = lib_read(&store, "v");
        let declared: Vec<u64> = all
            .iter()
            .filter(|e| e.kind == swarm_memory::EventType::LogDamaged)
            .map(|e| e.seq)
            .collect();
        assert_eq!(declared.len(), 2, "{case}");
        let want: Vec<u64> = all
            .iter()
            .filter(|e| !declared.contains(&e.seq))
            .map(|e| e.seq)
            .collect();
        let index = store.rebuild_index("v", |_, _| {}).unwrap();
        assert_eq!(
            index.head_seq, after.seq,
            "{case}: the index reaches the head"
        );
        assert_eq!(index.stopped, None, "{case}");
        assert_eq!(filtered(&store).unwrap(), want, "{case}");
    }
}

/// A store on `mem` whose new runs use 4 KiB segments.
fn small_segments(mem: &MemStorage) -> Store {
    Store::open_with(
        Arc::new(mem.clone()),
        Path::new("/d"),
        LogOptions {
            segment_bytes: 4096,
            ..LogOptions::default()
        },
    )
    .unwrap()
}

/// `n` durable events of varied sizes in `run`.
fn fill(store: &Store, run: &str, n: usize) {
    for i in 0..n {
        lib_append(store, run, &format!("event {i} {}", "y".repeat(i % 40)));
    }
}

/// A store with 4 KiB segments on `mem`, `n` events written to `run` and closed: the
/// run's directory and its segment files' names.
fn filled(mem: &MemStorage, run: &str, n: usize) -> (std::path::PathBuf, Vec<String>) {
    fill(&small_segments(mem), run, n);
    let dir = Path::new("/d/anonymous").join(run);
    let segs = crate::util::mem_segments(mem, &dir);
    (dir, segs)
}

/// The seqs a read of `run` with `opts` returns, in order.
fn seqs_read(store: &Store, run: &str, opts: ReadOptions) -> Vec<u64> {
    store
        .read(run, opts)
        .unwrap()
        .map(|e| e.unwrap().seq)
        .collect()
}

/// The seqs both kinds of tail (not following) read from `run`, in order.
fn tails_read(store: &Store, run: &str) -> [Vec<u64>; 2] {
    [
        swarm_memory::Visibility::Visible,
        swarm_memory::Visibility::Written,
    ]
    .map(|visibility| {
        store
            .tail(
                run,
                swarm_memory::TailOptions {
                    follow: false,
                    visibility,
                    ..swarm_memory::TailOptions::default()
                },
            )
            .unwrap()
            .map(|e| e.unwrap().seq)
            .collect()
    })
}

fn by_agent_opts() -> ReadOptions {
    ReadOptions {
        agent: Some("agent-1".into()),
        ..Default::default()
    }
}

/// A whole segment file lost, through the CLI on real files: the run's first one (reads
/// started silently at the next segment's first seq, and `verify` said ok), one in the
/// middle (reads and appends stopped for good, `repair` failed), and the last one
/// (`verify` listed the loss twice). `verify` names the missing seqs (exit 3), a tail
/// refuses to pass them, `repair` declares them, and the run reads, tails, indexes and
/// takes appends again.
#[test]
fn cli_repair_declares_a_lost_segment() {
    for which in ["first", "middle", "last"] {
        let env = Env::new();
        let run = "gone";
        let store = env.store_with_segment_bytes(4096);
        for i in 0..150 {
            lib_append(&store, run, &format!("event {i} {}", "y".repeat(i % 40)));
        }
        drop(store);
        let segs = env.segments(run);
        assert!(segs.len() >= 4, "{segs:?}");
        let name = |p: &Path| p.file_name().unwrap().to_str().unwrap().to_string();
        let base = |p: &Path| swarm_memory::log::segment::parse_segment_name(&name(p)).unwrap();
        let (gone, lost_from, lost_to) = match which {
            "first" => (&segs[0], 1, base(&segs[1]) - 1),
            "middle" => (&segs[1], base(&segs[1]), base(&segs[2]) - 1),
            _ => (&segs[segs.len() - 1], base(&segs[segs.len() - 1]), 150),
        };
        std::fs::remove_file(gone).unwrap();

        let (code, v) = env.verify(run);
        assert_eq!(code, 3, "{which}: {v}");
        let corrupt = v["corrupt"].as_array().unwrap();
        assert_eq!(corrupt.len(), 1, "{which}: one loss, listed once: {v}");
        assert_eq!(corrupt[0]["seq"], json!(lost_from), "{which}: {v}");
        let reason = corrupt[0]["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains(&format!("seqs {lost_from}..={lost_to}")),
            "{which}: {v}"
        );
        env.swarm(&["read", "--run", run]).code(3);
        // Through the index too (it once started a run without its first segment at
        // the next one's first seq, silently).
        env.swarm(&["read", "--run", run, "--agent", "agent-1"])
            .code(3);
        env.swarm(&["read", "--run", run, "--since", "2000-01-01T00:00:00Z"])
            .code(3);
        env.swarm(&["tail", "--run", run]).code(3);
        env.append_evidence(run, &["--content", "refused"]).code(3);
        env.swarm(&["repair", "--run", run]).ok();
        let (code, v) = env.verify(run);
        assert_eq!(code, 0, "{which}: {v}");
        env.append_evidence(run, &["--content", "after"]).ok();
        let want: Vec<u64> = (1..=152)
            .filter(|s| !(lost_from..=lost_to).contains(s))
            .collect();
        let seqs: Vec<u64> = env.read(run).iter().map(|e| e.seq).collect();
        assert_eq!(
            seqs, want,
            "{which}: 150 events less the lost, log_damaged, one more"
        );
        let index: serde_json::Value = serde_json::from_str(
            env.swarm(&["index", "rebuild", "--run", run])
                .ok()
                .stdout
                .trim(),
        )
        .unwrap();
        assert_eq!(
            index["head_seq"],
            json!(152),
            "{which}: the index covers the gap: {index}"
        );
        let tailed: Vec<u64> = parse_events(&env.swarm(&["tail", "--run", run]).ok().stdout)
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(tailed, want, "{which}");
        let filtered = env
            .swarm(&["read", "--run", run, "--type", "log_damaged"])
            .ok()
            .events();
        assert_eq!(filtered.len(), 1, "{which}");
        assert_eq!(filtered[0].content["lost_from"], json!(lost_from));
        assert_eq!(filtered[0].content["lost_to"], json!(lost_to));
    }
}

/// Records the names of the files removed, in order.
struct Removals {
    mem: MemStorage,
    removed: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Storage for Removals {
    fn open(
        &self,
        path: &Path,
        mode: OpenMode,
    ) -> std::io::Result<Box<dyn swarm_memory::log::storage::StorageFile>> {
        self.mem.open(path, mode)
    }
    fn create_dir_all(&self, path: &Path) -> std::io::Result<()> {
        self.mem.create_dir_all(path)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        self.mem.list(dir)
    }
    fn exists(&self, path: &Path) -> bool {
        self.mem.exists(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.mem.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        self.removed.lock().unwrap().push(name);
        self.mem.remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> std::io::Result<()> {
        self.mem.remove_dir_all(path)
    }
    fn sync_dir(&self, path: &Path) -> std::io::Result<()> {
        self.mem.sync_dir(path)
    }
}

/// Closing a repaired run removes its segments before its list of known damage (and
/// its marks): a reader that still finds a segment while the run is archived steps over
/// the declared damage instead of reporting it again. `QUARANTINE` went first before.
#[test]
fn closing_a_run_removes_its_damage_list_after_its_segments() {
    let mem = MemStorage::new();
    let store = small_segments(&mem);
    fill(&store, "q", 60);
    drop(store);
    let dir = Path::new("/d/anonymous/q");
    let segs = crate::util::mem_segments(&mem, dir);
    let seg = dir.join(&segs[0]);
    let mut bytes = mem.contents(&seg).unwrap();
    let b = frame_boundaries(&bytes);
    bytes.truncate(b[b.len() - 2]);
    mem.set_contents(&seg, bytes);
    let removed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let store = Store::open_with(
        Arc::new(Removals {
            mem: mem.clone(),
            removed: removed.clone(),
        }),
        Path::new("/d"),
        LogOptions {
            segment_bytes: 4096,
            ..LogOptions::default()
        },
    )
    .unwrap();
    assert_eq!(store.repair_all("q").unwrap().len(), 1);
    assert!(mem.contents(&dir.join("QUARANTINE")).is_some());
    removed.lock().unwrap().clear();
    store.close_run("q", "lead").unwrap();
    let removed = removed.lock().unwrap().clone();
    let at = |name: &str| removed.iter().position(|n| n == name);
    let quarantine = at("QUARANTINE").expect("QUARANTINE removed");
    let last_segment = removed
        .iter()
        .rposition(|n| swarm_memory::log::segment::parse_segment_name(n).is_some())
        .expect("segments removed");
    assert!(last_segment < quarantine, "{removed:?}");
    assert!(
        at("SYNCED").is_some_and(|s| last_segment < s),
        "{removed:?}"
    );
    // Archived whole: the declared loss and every event read back from the archive.
    let events = lib_read(&store, "q");
    assert!(events
        .iter()
        .any(|e| e.kind == swarm_memory::EventType::LogDamaged));
}

/// A long-lived store (a server) that cached a run's head state, then a `swarm repair` in
/// another process that declares a seq of it lost: the cached state is folded again
/// without it (it kept showing the lost entry, and would have kept enforcing a lost
/// policy).
#[test]
fn a_cached_head_state_forgets_what_another_process_repair_declared_lost() {
    use swarm_memory::EventType;
    let env = Env::new();
    let run = "c";
    let server = env.store();
    let (seg, b) = five_frames(&env, run);
    let evidence = |s: &swarm_memory::Store| {
        let st = s.head_state(run).unwrap().state;
        st.counts
            .by_type
            .get(&EventType::Evidence)
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(evidence(&server), 5);
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[b[2] + 100] ^= 0x10;
    std::fs::write(&seg, &bytes).unwrap();
    let declared = env.store().repair_all(run).unwrap();
    assert_eq!(declared.len(), 1, "{declared:?}");
    assert_eq!(evidence(&env.store()), 4);
    assert_eq!(evidence(&server), 4);
}

/// A checkpoint written before a record in the middle was lost, kept where `swarm repair`
/// did not look (another checkpoint directory, a backup restored), is not used to answer
/// a replay: it folded the event the repair declared lost, and a replay from it counted
/// 200 events where the log has 199.
#[test]
fn a_checkpoint_that_folded_a_lost_event_is_not_used() {
    let env = Env::new();
    let lines: String = (1..=200)
        .map(|i| {
            format!(
                "{{\"agent_id\":\"a{}\",\"type\":\"evidence\",\"content\":\"e{i}\"}}\n",
                i % 3
            )
        })
        .collect();
    env.swarm_stdin(&["append", "--run", "r", "--stdin"], &lines)
        .ok();
    let elsewhere = env.path().join("../ck-elsewhere");
    let ck = elsewhere.to_str().unwrap();
    env.swarm(&["--checkpoint-dir", ck, "checkpoint", "--run", "r"])
        .ok();
    let seg = env.segments("r").remove(0);
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = bytes
        .windows(15)
        .position(|w| w == b"\"content\":\"e50\"")
        .unwrap();
    bytes[at + 13] ^= 1;
    std::fs::write(&seg, &bytes).unwrap();
    env.swarm(&["repair", "--run", "r"]).ok();
    let total = |ck: &str| -> (u64, serde_json::Value) {
        let out = env
            .swarm(&[
                "--checkpoint-dir",
                ck,
                "replay",
                "--run",
                "r",
                "--at-seq",
                "200",
            ])
            .ok();
        let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
        (v["state"]["counts"]["total"].as_u64().unwrap(), v)
    };
    let none = env.path().join("../ck-none");
    let (without, _) = total(none.to_str().unwrap());
    let (with, v) = total(ck);
    assert_eq!(without, 199);
    assert_eq!(with, without, "{}", v["replay"]);
    // At the head (the fold meets the `log_damaged` event itself): the same.
    let out = env
        .swarm(&["--checkpoint-dir", ck, "replay", "--run", "r"])
        .ok();
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let head = v["state"]["counts"]["total"].as_u64().unwrap();
    // (The head also counts the `log_damaged` event: one more than at seq 200.)
    assert_eq!(head, without + 1, "{}", v["replay"]);
}
