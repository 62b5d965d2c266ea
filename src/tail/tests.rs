//! Unit tests of the tail: positions, wake-ups, damage, gaps.

use super::*;
use crate::event::NewEvent;
use crate::log::frame;
use crate::log::meta::{Durability, LogOptions};
use crate::log::storage::MemStorage;

const RUN: &str = "r";

fn mem_store(segment_bytes: u64) -> (MemStorage, Store) {
    let mem = MemStorage::new();
    let store = Store::open_with(
        Arc::new(mem.clone()),
        Path::new("/data"),
        LogOptions {
            segment_bytes,
            ..LogOptions::default()
        },
    )
    .unwrap();
    (mem, store)
}

fn ev(agent: &str, kind: EventType, n: u64) -> NewEvent {
    NewEvent::new(
        agent,
        kind,
        format!("finding number {n} {}", "x".repeat(60)),
    )
}

fn polling() -> TailOptions {
    TailOptions {
        notify: false,
        poll_interval_ms: 1,
        ..TailOptions::default()
    }
}

fn drain(t: &mut Tail) -> Vec<u64> {
    let mut v = Vec::new();
    while let Some(e) = t.try_next().unwrap() {
        v.push(e.seq);
    }
    v
}

#[test]
fn from_seq_inside_a_batch_and_filters() {
    let (_m, store) = mem_store(1 << 20);
    let batch: Vec<NewEvent> = (1..=5)
        .map(|i| ev(if i % 2 == 0 { "b" } else { "a" }, EventType::Evidence, i))
        .collect();
    store
        .append_batch(RUN, batch, None, Durability::Sync)
        .unwrap();
    store
        .append(RUN, ev("a", EventType::Decision, 6), Durability::Sync)
        .unwrap();
    let mut t = store
        .tail(
            RUN,
            TailOptions {
                from_seq: Some(3),
                ..polling()
            },
        )
        .unwrap();
    assert_eq!(drain(&mut t), vec![3, 4, 5, 6]);
    let got: Vec<u64> = store
        .tail(
            RUN,
            TailOptions {
                agent: Some("a".into()),
                follow: false,
                ..polling()
            },
        )
        .unwrap()
        .map(|e| e.unwrap().seq)
        .collect();
    assert_eq!(got, vec![1, 3, 5, 6]);
    let got: Vec<u64> = store
        .tail(
            RUN,
            TailOptions {
                agent: Some("a".into()),
                kind: Some(EventType::Decision),
                follow: false,
                ..polling()
            },
        )
        .unwrap()
        .map(|e| e.unwrap().seq)
        .collect();
    assert_eq!(got, vec![6]);
}

#[test]
fn follows_rotation_interleaved_with_appends() {
    let (_m, store) = mem_store(4096);
    let mut early = store.tail(RUN, polling()).unwrap();
    assert_eq!(
        drain(&mut early),
        Vec::<u64>::new(),
        "run does not exist yet"
    );
    let mut seen = Vec::new();
    for i in 1..=300u64 {
        store
            .append(RUN, ev("a", EventType::Evidence, i), Durability::Sync)
            .unwrap();
        if i % 7 == 0 {
            seen.extend(drain(&mut early));
        }
    }
    seen.extend(drain(&mut early));
    assert_eq!(seen, (1..=300).collect::<Vec<_>>());
    let segs = segment::list_segments(&**store.storage(), &store.run_dir(RUN).unwrap()).unwrap();
    assert!(segs.len() > 5, "only {} segments", segs.len());
    // A tail that starts in a later segment, at its first seq and inside it.
    for from in [segs[3], segs[3] + 1, 300, 301] {
        let mut t = store
            .tail(
                RUN,
                TailOptions {
                    from_seq: Some(from),
                    ..polling()
                },
            )
            .unwrap();
        assert_eq!(drain(&mut t), (from..=300).collect::<Vec<_>>());
    }
}

#[test]
fn not_following_delivers_what_was_visible_at_open() {
    let (_m, store) = mem_store(1 << 20);
    for i in 1..=3 {
        store
            .append(RUN, ev("a", EventType::Evidence, i), Durability::Sync)
            .unwrap();
    }
    let mut t = store
        .tail(
            RUN,
            TailOptions {
                follow: false,
                ..polling()
            },
        )
        .unwrap();
    assert_eq!(t.next().unwrap().unwrap().seq, 1);
    store
        .append(RUN, ev("a", EventType::Evidence, 4), Durability::Sync)
        .unwrap();
    let rest: Vec<u64> = t.by_ref().map(|e| e.unwrap().seq).collect();
    assert_eq!(rest, vec![2, 3]);
    assert!(t.is_finished());
    assert!(matches!(
        store.tail(
            "missing",
            TailOptions {
                follow: false,
                ..polling()
            }
        ),
        Err(Error::RunNotFound(_))
    ));
}

#[test]
fn cursor_resumes_and_a_wrong_position_falls_back_to_the_seq() {
    let (mem, store) = mem_store(4096);
    let batch: Vec<NewEvent> = (1..=4).map(|i| ev("a", EventType::Evidence, i)).collect();
    store
        .append_batch(RUN, batch, None, Durability::Sync)
        .unwrap();
    for i in 5..=60 {
        store
            .append(RUN, ev("a", EventType::Evidence, i), Durability::Sync)
            .unwrap();
    }
    let cur = PathBuf::from("/cursor.json");
    let opts = TailOptions {
        cursor_file: Some(cur.clone()),
        ..polling()
    };
    // Stop inside the batch: the cursor points at the batch's frame, seq 2.
    let mut t = store.tail(RUN, opts.clone()).unwrap();
    assert_eq!(t.try_next().unwrap().unwrap().seq, 1);
    assert_eq!(t.try_next().unwrap().unwrap().seq, 2);
    t.commit().unwrap();
    assert_eq!(t.try_next().unwrap().unwrap().seq, 3);
    drop(t); // seq 3 was delivered but not committed: it comes again.
    let mut t = store.tail(RUN, opts.clone()).unwrap();
    assert_eq!(drain(&mut t), (3..=60).collect::<Vec<_>>());
    t.commit().unwrap();
    let saved = Cursor::load(&mem, &cur).unwrap().unwrap();
    assert_eq!(saved.seq, 60);
    let mut t = store.tail(RUN, opts.clone()).unwrap();
    assert_eq!(drain(&mut t), Vec::<u64>::new());
    store
        .append(RUN, ev("a", EventType::Evidence, 61), Durability::Sync)
        .unwrap();
    assert_eq!(drain(&mut t), vec![61]);

    // Positions that do not hold the seq: mid-frame, past the end, a missing segment.
    for (segment, offset) in [
        (saved.segment, saved.offset + 7),
        (saved.segment, 1 << 30),
        (999_999, 0),
        (1, 0),
    ] {
        let bad = Cursor {
            segment,
            offset,
            ..saved.clone()
        };
        bad.save(&mem, &cur, false).unwrap();
        let mut t = store.tail(RUN, opts.clone()).unwrap();
        assert_eq!(drain(&mut t), vec![61], "cursor at {segment}:{offset}");
    }

    // A cursor of another run, and a damaged cursor file, are refused.
    Cursor {
        run: "other".into(),
        ..saved.clone()
    }
    .save(&mem, &cur, false)
    .unwrap();
    assert!(matches!(
        store.tail(RUN, opts.clone()),
        Err(Error::Invalid { .. })
    ));
    mem.set_contents(&cur, b"{\"format\":1,\"ru".to_vec());
    assert!(matches!(store.tail(RUN, opts), Err(Error::Invalid { .. })));
}

fn raw_frame(run: &str, seq: u64, ts: u64) -> Vec<u8> {
    let e = serde_json::json!([{"run_id": run, "seq": seq, "ts": Ts(ts).to_string(), "id": format!("raw{seq}"),
        "agent_id": "raw", "user_id": "u", "type": "evidence", "content": "raw"}]);
    let mut out = Vec::new();
    frame::encode(e.to_string().as_bytes(), &mut out);
    out
}

fn set_visible(mem: &MemStorage, run_dir: &Path, pos: Pos) {
    let m = Marks {
        durable: pos,
        visible: pos,
        ..Marks::default()
    };
    mem.set_contents(&run_dir.join(SYNCED_FILE), watermark::encode(m).to_vec());
}

#[test]
fn half_written_frame_waits_and_damage_before_a_frame_is_corrupt() {
    let (mem, store) = mem_store(1 << 20);
    store
        .append(RUN, ev("a", EventType::Evidence, 1), Durability::Sync)
        .unwrap();
    let dir = store.run_dir(RUN).unwrap();
    let seg = segment::segment_path(&dir, 1);
    let good = mem.contents_without_fill(&seg).unwrap();
    let f2 = raw_frame(RUN, 2, 2_000_000_000_000_000);
    for visibility in [Visibility::Visible, Visibility::Written] {
        mem.set_contents(&seg, good.clone());
        set_visible(
            &mem,
            &dir,
            Pos {
                seg: 1,
                off: good.len() as u64,
            },
        );
        let mut t = store
            .tail(
                RUN,
                TailOptions {
                    visibility,
                    ..polling()
                },
            )
            .unwrap();
        assert_eq!(drain(&mut t), vec![1]);
        let half = [&good[..], &f2[..f2.len() / 2]].concat();
        mem.set_contents(&seg, half);
        assert_eq!(drain(&mut t), Vec::<u64>::new(), "{visibility:?}");
        let whole = [&good[..], &f2[..]].concat();
        mem.set_contents(&seg, whole.clone());
        if visibility == Visibility::Visible {
            // Written but not yet visible: not delivered until the mark moves.
            assert_eq!(drain(&mut t), Vec::<u64>::new());
            set_visible(
                &mem,
                &dir,
                Pos {
                    seg: 1,
                    off: whole.len() as u64,
                },
            );
        }
        assert_eq!(drain(&mut t), vec![2], "{visibility:?}");
    }
    // Garbage at the tail with nothing whole after it waits; a whole frame after
    // damage is corruption.
    let garbage = [&good[..], b"{\"f\":1,\"crc\":\"zz"].concat();
    mem.set_contents(&seg, garbage.clone());
    set_visible(
        &mem,
        &dir,
        Pos {
            seg: 1,
            off: garbage.len() as u64,
        },
    );
    let mut t = store.tail(RUN, polling()).unwrap();
    assert_eq!(drain(&mut t), vec![1]);
    let damaged = [&garbage[..], &f2[..]].concat();
    mem.set_contents(&seg, damaged.clone());
    set_visible(
        &mem,
        &dir,
        Pos {
            seg: 1,
            off: damaged.len() as u64,
        },
    );
    assert!(matches!(t.try_next(), Err(Error::Corrupt { .. })));
}

#[test]
fn a_gap_in_seqs_is_corruption() {
    let (mem, store) = mem_store(1 << 20);
    store
        .append(RUN, ev("a", EventType::Evidence, 1), Durability::Sync)
        .unwrap();
    let dir = store.run_dir(RUN).unwrap();
    let seg = segment::segment_path(&dir, 1);
    let bytes = [
        &mem.contents_without_fill(&seg).unwrap()[..],
        &raw_frame(RUN, 3, 2_000_000_000_000_000)[..],
    ]
    .concat();
    mem.set_contents(&seg, bytes.clone());
    set_visible(
        &mem,
        &dir,
        Pos {
            seg: 1,
            off: bytes.len() as u64,
        },
    );
    let mut t = store.tail(RUN, polling()).unwrap();
    assert_eq!(t.try_next().unwrap().unwrap().seq, 1);
    match t.try_next() {
        Err(Error::Corrupt { seq, reason, .. }) => {
            assert_eq!(seq, 2);
            assert!(reason.contains("expected 2"), "{reason}");
        }
        other => panic!("expected corruption, got {other:?}"),
    }
}

/// With a polling interval far beyond the deadline, only an inotify wake-up can
/// deliver the event appended by another thread: through the tail's own inotify
/// wait, and through the `notify` crate's watcher thread.
#[test]
fn inotify_wakes_the_tail_without_polling() {
    for via_notify_crate in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store
            .append(RUN, ev("a", EventType::Evidence, 1), Durability::Sync)
            .unwrap();
        let mut t = store
            .tail(
                RUN,
                TailOptions {
                    poll_interval_ms: 3_600_000,
                    ..TailOptions::default()
                },
            )
            .unwrap();
        if via_notify_crate {
            t.waiter.force_notify_crate();
        }
        assert_eq!(t.try_next().unwrap().unwrap().seq, 1);
        assert!(t.waiter.is_watching());
        let root = dir.path().to_path_buf();
        let writer = std::thread::spawn(move || {
            let store = Store::open(root).unwrap();
            for i in 2..=4 {
                store
                    .append(RUN, ev("b", EventType::Evidence, i), Durability::Sync)
                    .unwrap();
            }
        });
        // The tail blocks in `next` (no deadline, so no polling for an hour) on its
        // own thread; the test gives up waiting for it after a bounded time.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for e in t.by_ref().take(3) {
                let _ = tx.send(e.unwrap().seq);
            }
        });
        let got: Vec<u64> = (0..3)
            .map(|_| {
                rx.recv_timeout(Duration::from_secs(30))
                    .unwrap_or_else(|_| panic!("no wake-up (notify crate: {via_notify_crate})"))
            })
            .collect();
        assert_eq!(got, vec![2, 3, 4]);
        writer.join().unwrap();
    }
}

/// A fork of a filtered, caught-up tail (the server's shared reader of a run) delivers
/// every later event, unfiltered, across segments, without re-reading the history; a
/// tail reopened with the cursor of an event resumes right after it.
#[test]
fn fork_follows_on_unfiltered_and_resume_continues_after_a_cursor() {
    let (_m, store) = mem_store(4096);
    for i in 1..=40 {
        let agent = if i % 2 == 0 { "b" } else { "a" };
        store
            .append(RUN, ev(agent, EventType::Evidence, i), Durability::Sync)
            .unwrap();
    }
    let mut t = Tail::open(
        &store,
        RUN,
        TailOptions {
            agent: Some("a".into()),
            ..polling()
        },
    )
    .unwrap();
    assert_eq!(drain(&mut t).len(), 20);
    let mut f = t.fork(WakeSource::new());
    assert_eq!(f.position().next_seq, 41);
    assert!(drain(&mut f).is_empty());
    for i in 41..=90 {
        store
            .append(RUN, ev("b", EventType::Evidence, i), Durability::Sync)
            .unwrap();
    }
    assert_eq!(drain(&mut f), (41..=90).collect::<Vec<_>>());
    let c = f.cursor().cloned().unwrap();
    assert_eq!(c.seq, 90);
    // The filtered original sees none of them (all are b's).
    assert!(drain(&mut t).is_empty());
    // Reopened at the cursor of seq 60 (taken from a fresh tail), it resumes at 61.
    let mut at = Tail::open(&store, RUN, polling()).unwrap();
    let c60 = loop {
        let e = at.try_next().unwrap().unwrap();
        if e.seq == 60 {
            break at.cursor().cloned().unwrap();
        }
    };
    let mut r = Tail::open(
        &store,
        RUN,
        TailOptions {
            from_seq: Some(61),
            ..polling()
        },
    )
    .unwrap()
    .with_resume(c60);
    assert_eq!(drain(&mut r), (61..=90).collect::<Vec<_>>());
    // A fork of a tail that has not located the run yet starts from seq 1.
    let fresh = Tail::open(&store, RUN, polling()).unwrap();
    assert_eq!(fresh.fork(WakeSource::new()).position().next_seq, 1);
}

/// A run deleted and created again under its name: a cursor of the old run is not
/// resumed from (its seq would skip the new run's first events), and a cursor without
/// the run's creation time (older builds) still resumes.
#[test]
fn a_cursor_of_a_deleted_and_recreated_run_starts_over() {
    let dir = tempfile::tempdir().unwrap();
    let cur = dir.path().join("cursor.json");
    let load = || {
        Cursor::load(&crate::log::storage::FsStorage, &cur)
            .unwrap()
            .unwrap()
    };
    let opts = TailOptions {
        cursor_file: Some(cur.clone()),
        ..polling()
    };
    let store = Store::open(dir.path()).unwrap();
    for i in 1..=8 {
        store
            .append(RUN, ev("a", EventType::Evidence, i), Durability::Sync)
            .unwrap();
    }
    let mut t = store.tail(RUN, opts.clone()).unwrap();
    assert_eq!(drain(&mut t), (1..=8).collect::<Vec<_>>());
    t.commit().unwrap();
    drop((t, store));
    let old = load();
    assert!(old.created.is_some(), "{old:?}");

    std::fs::remove_dir_all(dir.path().join("anonymous").join(RUN)).unwrap();
    // Creation times are in microseconds: make sure the new run's differs.
    std::thread::sleep(std::time::Duration::from_millis(2));
    let store = Store::open(dir.path()).unwrap();
    // A following tail opened while the run is gone learns the new run's creation time
    // when it appears.
    let mut t = store.tail(RUN, opts.clone()).unwrap();
    assert_eq!(drain(&mut t), Vec::<u64>::new());
    for i in 1..=3 {
        store
            .append(RUN, ev("b", EventType::Evidence, i), Durability::Sync)
            .unwrap();
    }
    assert_eq!(
        drain(&mut t),
        vec![1, 2, 3],
        "the new run's events were skipped (tail opened before the run)"
    );
    t.commit().unwrap();
    drop(t);
    let new = load();
    assert_ne!(new.created, old.created);

    // The old cursor, with the new run already there when the tail opens.
    old.save(&crate::log::storage::FsStorage, &cur, false)
        .unwrap();
    let mut t = store.tail(RUN, opts.clone()).unwrap();
    assert_eq!(
        drain(&mut t),
        vec![1, 2, 3],
        "the new run's events were skipped"
    );
    drop(t);

    // A cursor of this run, from an older build (no creation time): resumed.
    Cursor {
        seq: 2,
        created: None,
        ..new.clone()
    }
    .save(&crate::log::storage::FsStorage, &cur, false)
    .unwrap();
    let mut t = store.tail(RUN, opts).unwrap();
    assert_eq!(drain(&mut t), vec![3]);
}
