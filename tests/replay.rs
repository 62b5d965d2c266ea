//! Replay from checkpoints equals replay from the start; damaged or missing checkpoints
//! fall back to an identical state.

use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use swarm_memory::{
    Durability, EventType, LogOptions, MemStorage, NewEvent, ReadOptions, State, Storage, Store,
    Target, Ts,
};

fn mem_store(mem: &MemStorage) -> Store {
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    Store::open_with(
        storage,
        Path::new("/data"),
        LogOptions {
            segment_bytes: 4096,
            ..LogOptions::default()
        },
    )
    .unwrap()
    .with_checkpoints("/ck", 0)
}

fn new_event(i: u32, agent: u8, kind: u8, subject: u8) -> NewEvent {
    let mut e = NewEvent::new(
        &format!("agent-{agent}"),
        EventType::ALL[kind as usize % 4],
        format!("finding {i} about s{subject}"),
    );
    // Decisions and actions get a subject of their own: on a shared subject, agents'
    // disagreeing actions would (rightly) be escalated and block later appends.
    e.subject = if e.kind == "decision" || e.kind == "action_taken" {
        Some(format!("act-{i}"))
    } else {
        (!subject.is_multiple_of(5)).then(|| format!("s{}", subject % 7))
    };
    e
}

/// The state at `seq`, folded directly from the log with no checkpoint.
fn scratch(store: &Store, run: &str, seq: u64) -> State {
    let mut s = State::new(run);
    let it = store
        .read(
            run,
            ReadOptions {
                to_seq: Some(seq),
                ..ReadOptions::default()
            },
        )
        .unwrap();
    for e in it {
        s.apply(&e.unwrap());
    }
    s
}

/// Engine operations mixed into the random runs, so replay is checked on channels,
/// board versions and escalations too.
fn engine_op(store: &Store, i: u32, agent: u8, k: u8) {
    let a = format!("agent-{}", agent % 3);
    let _ = match k % 4 {
        0 => store
            .write_channel("r", &a, "notes", serde_json::json!(format!("n{i}")), None)
            .map(|_| ()),
        1 => store
            .write_channel(
                "r",
                &a,
                "state",
                serde_json::json!({ format!("k{}", i % 3): i }),
                None,
            )
            .map(|_| ()),
        2 => {
            // Actions on a shared subject by different agents: escalations happen.
            let mut e = NewEvent::new(&a, EventType::ActionTaken, format!("act {}", i % 2));
            e.subject = Some("shared".into());
            store.append("r", e, Durability::None).map(|_| ())
        }
        _ => {
            let open = store.escalations("r", false).unwrap();
            match open.first() {
                Some(x) => store
                    .resolve("r", "human", x.seq, Some(x.record.entries[0]), "ok")
                    .map(|_| ()),
                None => Ok(()),
            }
        }
    };
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn replay_from_any_checkpoint_equals_replay_from_start(
        ops in proptest::collection::vec((1u8..4, any::<u8>(), any::<u8>(), any::<u8>(), any::<bool>()), 5..60),
        targets in proptest::collection::vec(0u64..400, 1..8),
    ) {
        let mem = MemStorage::new();
        let store = mem_store(&mem);
        store.declare_channel("r", "lead", &swarm_memory::fold::rules::ChannelDecl { channel: "notes".into(), kind: swarm_memory::fold::rules::ChannelKind::Append, on_conflict: Default::default(), max_size_kb: 1024 }).unwrap();
        store.declare_channel("r", "lead", &swarm_memory::fold::rules::ChannelDecl { channel: "state".into(), kind: swarm_memory::fold::rules::ChannelKind::Merge, on_conflict: Default::default(), max_size_kb: 1024 }).unwrap();
        let mut n = 0u32;
        let mut head = 0;
        for (batch, agent, kind, subject, ck) in ops {
            engine_op(&store, n, agent, kind);
            let evs: Vec<NewEvent> = (0..batch).map(|k| { n += 1; new_event(n, agent % 5, kind.wrapping_add(k), subject.wrapping_add(k)) }).collect();
            head = store.append_batch("r", evs, None, Durability::None).unwrap().last().unwrap().seq;
            if ck {
                store.checkpoint("r", |_| {}).unwrap();
            }
        }
        head = head.max(store.state_at("r", Target::Head, |_| {}).unwrap().state.head_seq);
        for t in targets.into_iter().chain([head, 0]) {
            let t = t.min(head);
            let got = store.state_at("r", Target::Seq(t), |_| {}).unwrap();
            prop_assert_eq!(got.state.to_bytes(), scratch(&store, "r", t).to_bytes());
        }
        let at_head = store.state_at("r", Target::Head, |_| {}).unwrap();
        prop_assert_eq!(at_head.state.to_bytes(), scratch(&store, "r", head).to_bytes());
    }
}

#[test]
fn damaged_or_deleted_checkpoints_fall_back_to_the_same_state() {
    let mem = MemStorage::new();
    let store = mem_store(&mem);
    for i in 0..300 {
        store
            .append(
                "r",
                new_event(i, (i % 3) as u8, (i % 4) as u8, (i % 9) as u8),
                Durability::None,
            )
            .unwrap();
        if i == 99 || i == 199 {
            store.checkpoint("r", |_| {}).unwrap();
        }
    }
    let expected = scratch(&store, "r", 300).to_bytes();
    let fresh = store.state_at("r", Target::Head, |_| {}).unwrap();
    assert_eq!(fresh.stats.from_checkpoint, Some(200));
    assert_eq!(fresh.state.to_bytes(), expected);

    // Damage the newest checkpoint: the older one is used, with a skip counted.
    let newest = store
        .checkpoint_dir("r")
        .join(swarm_memory::fold::checkpoint::checkpoint_name(200));
    let mut bytes = mem.contents(&newest).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    mem.set_contents(&newest, bytes);
    let r = store.state_at("r", Target::Head, |_| {}).unwrap();
    assert_eq!(r.stats.from_checkpoint, Some(100));
    assert_eq!(r.stats.checkpoints_skipped, 1);
    assert_eq!(r.state.to_bytes(), expected);

    // Delete every checkpoint: a full replay gives the same bytes.
    for seq in store.checkpoints("r").unwrap() {
        mem.remove_file(
            &store
                .checkpoint_dir("r")
                .join(swarm_memory::fold::checkpoint::checkpoint_name(seq)),
        )
        .unwrap();
    }
    let r = store.state_at("r", Target::Head, |_| {}).unwrap();
    assert_eq!(r.stats.from_checkpoint, None);
    assert_eq!(r.state.to_bytes(), expected);

    // A checkpoint that no longer matches the log (the log was replaced) is not trusted.
    store.checkpoint("r", |_| {}).unwrap();
    let other = MemStorage::new();
    let store2 = mem_store(&other);
    for i in 0..50 {
        store2
            .append("r", new_event(i, 1, 1, 1), Durability::None)
            .unwrap();
    }
    let ck = store
        .checkpoint_dir("r")
        .join(swarm_memory::fold::checkpoint::checkpoint_name(300));
    let bytes = mem.contents(&ck).unwrap();
    other.create_dir_all(&store.checkpoint_dir("r")).unwrap();
    other
        .open(&ck, swarm_memory::log::storage::OpenMode::CreateNew)
        .unwrap();
    other.set_contents(&ck, bytes);
    let r = store2.state_at("r", Target::Head, |_| {}).unwrap();
    assert_eq!(r.stats.from_checkpoint, None);
    assert_eq!(r.stats.checkpoints_skipped, 1);
    assert_eq!(r.state.head_seq, 50);
}

#[test]
fn time_travel_picks_the_last_event_at_or_before_the_time() {
    let mem = MemStorage::new();
    let store = mem_store(&mem);
    let mut stamps = Vec::new();
    for i in 0..40 {
        let e = store
            .append("r", new_event(i, 0, 1, 2), Durability::None)
            .unwrap();
        stamps.push(e.ts);
        if i == 20 {
            store.checkpoint("r", |_| {}).unwrap();
        }
    }
    for (i, ts) in stamps.iter().enumerate() {
        let r = store.state_at("r", Target::Time(*ts), |_| {}).unwrap();
        // The last event with this exact ts (several may share one microsecond).
        let last_with = stamps.iter().rposition(|t| t <= ts).unwrap() as u64 + 1;
        assert!(r.state.head_seq > i as u64);
        assert_eq!(r.state.head_seq, last_with);
    }
    let before = store
        .state_at("r", Target::Time(Ts(stamps[0].0 - 1)), |_| {})
        .unwrap();
    assert_eq!(before.state.head_seq, 0);
}

#[test]
fn automatic_checkpoint_every_n_events() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("data"))
        .unwrap()
        .with_checkpoints(dir.path().join("ck"), 100);
    for i in 0..250 {
        store
            .append("r", new_event(i, 0, 0, 0), Durability::None)
            .unwrap();
    }
    // The crossing appends start background checkpoints; a replay also leaves one when
    // it applied at least the interval. Either way, replay agrees with a fresh fold.
    let r = store.state_at("r", Target::Head, |_| {}).unwrap();
    assert_eq!(r.state.to_bytes(), scratch(&store, "r", 250).to_bytes());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while store.checkpoints("r").unwrap().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint written"
        );
        std::thread::yield_now();
    }
    let r = store.state_at("r", Target::Head, |_| {}).unwrap();
    assert!(r.stats.from_checkpoint.is_some());
    assert_eq!(r.state.to_bytes(), scratch(&store, "r", 250).to_bytes());
}

/// A long-lived store keeps the head state and applies only what was appended since; it
/// must always equal a fresh replay, also after appends by another handle.
#[test]
fn cached_head_state_follows_appends() {
    let mem = MemStorage::new();
    let store = mem_store(&mem);
    let other = mem_store(&mem);
    for round in 0..5u32 {
        for i in 0..30 {
            let who = if i % 2 == 0 { &store } else { &other };
            who.append(
                "r",
                new_event(round * 100 + i, (i % 3) as u8, i as u8, i as u8),
                Durability::None,
            )
            .unwrap();
        }
        let cached = store.head_state("r").unwrap();
        let fresh = mem_store(&mem).state_at("r", Target::Head, |_| {}).unwrap();
        assert_eq!(
            cached.state.to_bytes(),
            fresh.state.to_bytes(),
            "round {round}"
        );
    }
}

/// The header of a version-1 checkpoint (the format before the binary body), written the
/// way that version's code wrote it: the state's canonical JSON, zstd level 3.
fn v1_checkpoint(state: &State, info: &swarm_memory::fold::checkpoint::CheckpointInfo) -> Vec<u8> {
    let json = state.to_bytes();
    let body = zstd::bulk::compress(&json, 3).unwrap();
    let mut out = b"SWCK".to_vec();
    out.extend_from_slice(&1u32.to_le_bytes());
    for v in [
        info.seq,
        info.segment,
        info.frame_start,
        info.frame_end,
        info.ts.0,
        body.len() as u64,
        json.len() as u64,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    let hcrc = crc32fast::hash(&out[..68]);
    out.extend_from_slice(&hcrc.to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn version_of(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[4..8].try_into().unwrap())
}

/// A checkpoint of the old format (version 1, a JSON body), as the code before the binary
/// body wrote it (`tests/fixtures/checkpoint-v1`, the golden run's head): never read, but
/// skipped like a damaged one, listed by `verify` under `rebuilt`, and replaced by the next
/// checkpoint, with the same state throughout.
#[test]
fn old_version_checkpoint_fixture_is_ignored_and_rebuilt() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let dir = tempfile::tempdir().unwrap();
    crate::golden::copy_dir(&fixtures.join("golden-v1"), dir.path());
    let store = Store::open(dir.path()).unwrap();
    let name = swarm_memory::fold::checkpoint::checkpoint_name(3);
    let expected = scratch(&store, "golden", 3).to_bytes();
    let old = std::fs::read(fixtures.join("checkpoint-v1").join(&name)).unwrap();
    assert_eq!(version_of(&old), 1, "the fixture is a version-1 checkpoint");
    let ck = store.checkpoint_dir("golden").join(&name);
    std::fs::create_dir_all(ck.parent().unwrap()).unwrap();
    std::fs::write(&ck, &old).unwrap();
    assert_eq!(store.checkpoints("golden").unwrap(), vec![3]);

    let r = store.state_at("golden", Target::Head, |_| {}).unwrap();
    assert_eq!(r.stats.from_checkpoint, None);
    assert_eq!(r.stats.checkpoints_skipped, 1);
    assert_eq!(r.state.to_bytes(), expected);
    let rep = store.verify("golden", |_| {}).unwrap();
    assert!(rep.ok);
    assert!(
        rep.rebuilt
            .iter()
            .any(|x| x.contains(&name) && x.contains("format version 1")),
        "{:?}",
        rep.rebuilt
    );

    // Rebuilt: the next checkpoint replaces it, and is used, with the same state.
    store.checkpoint("golden", |_| {}).unwrap();
    assert_eq!(
        version_of(&std::fs::read(&ck).unwrap()),
        swarm_memory::fold::checkpoint::CHECKPOINT_VERSION
    );
    let r = store.state_at("golden", Target::Head, |_| {}).unwrap();
    assert_eq!(r.stats.from_checkpoint, Some(3));
    assert_eq!(r.stats.checkpoints_skipped, 0);
    assert_eq!(r.state.to_bytes(), expected);
    assert!(store.verify("golden", |_| {}).unwrap().rebuilt.is_empty());
}

/// The same on a run with channels, escalations and resolutions: an old-version
/// checkpoint at the head is skipped, and the replay that had to apply the whole log (more
/// than the checkpoint interval) writes a current one in its place; states never differ.
#[test]
fn old_version_checkpoint_is_rebuilt_by_a_long_replay() {
    let mem = MemStorage::new();
    let store = mem_store(&mem);
    for k in ["notes", "state"] {
        let kind = match k {
            "notes" => swarm_memory::fold::rules::ChannelKind::Append,
            _ => swarm_memory::fold::rules::ChannelKind::Merge,
        };
        let decl = swarm_memory::fold::rules::ChannelDecl {
            channel: k.into(),
            kind,
            on_conflict: Default::default(),
            max_size_kb: 1024,
        };
        store.declare_channel("r", "lead", &decl).unwrap();
    }
    for i in 0..240u32 {
        engine_op(&store, i, (i % 5) as u8, (i % 7) as u8);
        store
            .append(
                "r",
                new_event(i, (i % 5) as u8, (i % 4) as u8, (i % 11) as u8),
                Durability::None,
            )
            .unwrap();
    }
    let info = store.checkpoint("r", |_| {}).unwrap().unwrap();
    let expected = scratch(&store, "r", info.seq);
    assert!(!expected.rules.channels.is_empty() && !expected.rules.escalations.is_empty());
    let ck = store
        .checkpoint_dir("r")
        .join(swarm_memory::fold::checkpoint::checkpoint_name(info.seq));
    mem.set_contents(&ck, v1_checkpoint(&expected, &info));

    let interval = Store::open_with(
        Arc::new(mem.clone()),
        Path::new("/data"),
        LogOptions::default(),
    )
    .unwrap()
    .with_checkpoints("/ck", 100);
    let r = interval.state_at("r", Target::Head, |_| {}).unwrap();
    assert_eq!(r.stats.from_checkpoint, None);
    assert_eq!(r.stats.checkpoints_skipped, 1);
    assert!(r.stats.events_applied >= 100);
    assert_eq!(r.state.to_bytes(), expected.to_bytes());
    assert_eq!(
        version_of(&mem.contents(&ck).unwrap()),
        swarm_memory::fold::checkpoint::CHECKPOINT_VERSION,
        "the replay wrote a current checkpoint in its place"
    );
    let r = interval.state_at("r", Target::Head, |_| {}).unwrap();
    assert_eq!(r.stats.from_checkpoint, Some(info.seq));
    assert_eq!(r.state.to_bytes(), expected.to_bytes());
    let back = swarm_memory::fold::checkpoint::load(&mem, &ck).unwrap();
    assert_eq!(back.0, expected);
    assert_eq!(back.1, info);
}

/// A replay over several segments reads and parses on a second thread ahead of the fold
/// (`FrameWalk`), in chunks of thousands of events. It must give the state a fold of a
/// plain read gives, at every target (inside a chunk, at chunk and segment boundaries),
/// stop at the target, and report damage in a middle segment as the read does, while a
/// target before the damage is still answered.
#[test]
fn pipelined_replay_matches_a_plain_fold_and_reports_damage() {
    let mem = MemStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    let store = Store::open_with(
        storage,
        Path::new("/data"),
        LogOptions {
            segment_bytes: 256 << 10,
            ..LogOptions::default()
        },
    )
    .unwrap()
    .with_checkpoints("/ck", 0);
    let mut n = 0u32;
    let mut checkpointed = false;
    // Batches of 1 to 37 events: frames of every size, chunks ending mid-segment.
    while n < 12_000 {
        if n >= 3_000 && !checkpointed {
            // A checkpoint in the first segments: a replay to the head starts there and
            // still walks several segments (on two threads).
            store.checkpoint("r", |_| {}).unwrap();
            checkpointed = true;
        }
        let size = 1 + n % 37;
        let evs: Vec<NewEvent> = (0..size)
            .map(|k| {
                n += 1;
                new_event(n, (n % 7) as u8, (n % 4) as u8, (n % 11) as u8 + k as u8)
            })
            .collect();
        store
            .append_batch("r", evs, None, Durability::None)
            .unwrap();
    }
    let head = store.state_at("r", Target::Head, |_| {}).unwrap();
    let from = head.stats.from_checkpoint.expect("from the checkpoint");
    assert_eq!(head.stats.events_applied, head.state.head_seq - from);
    let segments: Vec<_> = {
        let dir = Path::new("/data/anonymous/r");
        let mut v: Vec<_> = mem
            .list(dir)
            .unwrap()
            .into_iter()
            .filter(|name| name.ends_with(".jsonl"))
            .map(|name| dir.join(name))
            .collect();
        v.sort();
        v
    };
    assert!(segments.len() >= 4, "{} segments", segments.len());
    assert_eq!(
        head.state.to_bytes(),
        scratch(&store, "r", head.state.head_seq).to_bytes()
    );
    for t in [1, 4095, 4096, 4097, 8192, 9001, head.state.head_seq - 1] {
        let got = store.state_at("r", Target::Seq(t), |_| {}).unwrap();
        assert_eq!(got.state.head_seq, t);
        assert_eq!(
            got.state.to_bytes(),
            scratch(&store, "r", t).to_bytes(),
            "at {t}"
        );
    }

    // A flipped byte in the middle of the last segment but one (after the checkpoint).
    let seg = &segments[segments.len() - 2];
    let mut bytes = mem.contents(seg).unwrap();
    let first_seq: u64 = seg.file_stem().unwrap().to_str().unwrap()[4..]
        .parse()
        .unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x20;
    mem.set_contents(seg, bytes);
    match store.state_at("r", Target::Head, |_| {}) {
        Err(swarm_memory::Error::Corrupt { path, seq, .. }) => {
            assert_eq!(&path, seg);
            assert!(seq > first_seq, "damage reported at seq {seq}");
        }
        other => panic!("damage in a middle segment: {:?}", other.map(|r| r.stats)),
    }
    // Before the damage the state is still there, the same as a plain fold's.
    let before = first_seq + 1;
    let got = store.state_at("r", Target::Seq(before), |_| {}).unwrap();
    assert_eq!(
        got.state.to_bytes(),
        scratch(&store, "r", before).to_bytes()
    );
}
