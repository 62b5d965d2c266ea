//! A model-based property test: random appends (single, batch, with and without ids and
//! `expect_seq`), idempotent retries, reopens, simulated power losses and reads on
//! `MemStorage`, checked against a plain in-memory model.
//!
//! The rules checked:
//! - an event acknowledged in `sync` mode survives any crash, and so does everything
//!   before it in the log (one fsync covers the whole file; rotation syncs the old one);
//! - events acknowledged in `none` mode may be lost only at a crash, and only as a
//!   suffix; nothing else is ever lost, nothing is duplicated, seqs stay gap-free;
//! - a retry returns the stored event, a partly stored batch is refused, a wrong
//!   `expect_seq` is refused, and neither writes anything;
//! - reads return exactly the model (after a crash, until the next append, readers may
//!   be shown less: the watermark file is not fsynced, so it can be stale or gone).
//!
//! `batch` mode is left out: its flusher thread syncs at times the test does not
//! control, which a crash model cannot pin down (its rule is the `none` one anyway).

use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use swarm_memory::{
    Durability, Error, Event, EventType, LogOptions, MemStorage, NewEvent, ReadOptions, Storage,
    Store, Visibility,
};

const RUN: &str = "model";

#[derive(Clone, Debug)]
enum Expect {
    No,
    Right,
    Wrong(u64),
}

#[derive(Clone, Debug)]
enum Op {
    Append {
        n: usize,
        ids: bool,
        sync: bool,
        expect: Expect,
        len: usize,
    },
    Retry {
        pick: usize,
        sync: bool,
    },
    RetryLost {
        pick: usize,
    },
    PartialRetry {
        pick: usize,
    },
    Reopen,
    Crash {
        seed: u64,
    },
    Read {
        from: u64,
        limit: Option<usize>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let expect = prop_oneof![
        4 => Just(Expect::No),
        2 => Just(Expect::Right),
        1 => (1u64..3).prop_map(Expect::Wrong),
    ];
    prop_oneof![
        8 => (1usize..=4, any::<bool>(), any::<bool>(), expect, 10usize..400)
            .prop_map(|(n, ids, sync, expect, len)| Op::Append { n, ids, sync, expect, len }),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(pick, sync)| Op::Retry { pick, sync }),
        1 => any::<usize>().prop_map(|pick| Op::RetryLost { pick }),
        1 => any::<usize>().prop_map(|pick| Op::PartialRetry { pick }),
        1 => Just(Op::Reopen),
        2 => any::<u64>().prop_map(|seed| Op::Crash { seed }),
        2 => (0u64..60, proptest::option::of(1usize..8))
            .prop_map(|(from, limit)| Op::Read { from, limit }),
    ]
}

/// An acknowledged request whose events all carry client ids, so it can be retried.
struct Sent {
    events: Vec<NewEvent>,
    first_seq: u64,
    lost: bool,
}

struct Model {
    /// Acknowledged events still in the log, in seq order: 1, 2, 3, ... but for the gaps
    /// `log_damaged` events declare (seqs readers saw that a crash took).
    events: Vec<Event>,
    /// The highest seq ever handed out: no seq at or below it is handed out again.
    max_seq: u64,
    /// `events[..durable]` survive any crash.
    durable: usize,
    sent: Vec<Sent>,
    /// False after a crash until the next write: readers may see a prefix only.
    settled: bool,
    next_id: u64,
}

fn head_of(m: &Model) -> u64 {
    m.events.last().map_or(0, |e| e.seq)
}

/// After a crash that took records readers had seen, the next write of any kind first
/// appends a `log_damaged` event declaring them lost: take it into the model, checking it
/// comes right after the model's head, only after a crash, and covers only seqs that
/// were handed out.
fn absorb_gap(store: &Store, m: &mut Model) -> Result<(), TestCaseError> {
    let h = head_of(m);
    let opts = ReadOptions {
        visibility: Visibility::Written,
        from_seq: Some(h + 1),
        limit: Some(1),
        ..ReadOptions::default()
    };
    let next = match store.read(RUN, opts) {
        Err(Error::RunNotFound(_)) => return Ok(()),
        Err(e) => return Err(TestCaseError::fail(format!("read: {e}"))),
        Ok(it) => it
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TestCaseError::fail(format!("read: {e}")))?,
    };
    if let Some(e) = next.first().filter(|e| e.kind == EventType::LogDamaged) {
        prop_assert!(!m.settled, "a gap declared without a crash: {:?}", e);
        prop_assert_eq!(&e.content["lost_from"], &serde_json::json!(h + 1));
        prop_assert_eq!(&e.content["lost_to"], &serde_json::json!(e.seq - 1));
        prop_assert!(e.seq - 1 <= m.max_seq, "declared seqs never handed out");
        m.max_seq = m.max_seq.max(e.seq);
        m.events.push(e.clone());
        m.durable = m.events.len();
    }
    Ok(())
}

fn mix(seed: u64, path: &Path) -> u64 {
    let mut h = seed ^ 0xcbf2_9ce4_8422_2325;
    for b in path.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    }
    h ^ (h >> 29)
}

fn read(store: &Store, opts: ReadOptions) -> Result<Vec<Event>, TestCaseError> {
    let it = store
        .read(RUN, opts)
        .map_err(|e| TestCaseError::fail(format!("read: {e}")))?;
    it.collect::<Result<Vec<_>, _>>()
        .map_err(|e| TestCaseError::fail(format!("read: {e}")))
}

fn written(store: &Store) -> Result<Vec<Event>, TestCaseError> {
    read(
        store,
        ReadOptions {
            visibility: Visibility::Written,
            ..ReadOptions::default()
        },
    )
}

fn durability(sync: bool) -> Durability {
    if sync {
        Durability::Sync
    } else {
        Durability::None
    }
}

fn run_ops(small_segments: bool, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mem = MemStorage::new();
    let opts = LogOptions {
        segment_bytes: if small_segments { 4096 } else { 1 << 20 },
        ..LogOptions::default()
    };
    let open = || Store::open_with(Arc::new(mem.clone()), Path::new("/m"), opts.clone()).unwrap();
    let mut store = open();
    let mut m = Model {
        events: Vec::new(),
        max_seq: 0,
        durable: 0,
        sent: Vec::new(),
        settled: true,
        next_id: 0,
    };
    for op in ops {
        match op {
            Op::Append {
                n,
                ids,
                sync,
                expect,
                len,
            } => {
                let head = head_of(&m);
                let evs: Vec<NewEvent> = (0..n)
                    .map(|j| {
                        m.next_id += 1;
                        let mut e = NewEvent::new(
                            &format!("agent-{}", j % 3),
                            EventType::ALL[j % 4],
                            format!("{} {}", m.next_id, "c".repeat(len)),
                        );
                        if ids {
                            e.id = Some(format!("id-{}", m.next_id));
                        }
                        if head > 0 && j == 0 {
                            e.refs = vec![head];
                        }
                        e
                    })
                    .collect();
                let expect_seq = match expect {
                    Expect::No => None,
                    Expect::Right => Some(head),
                    Expect::Wrong(d) => Some(head + d),
                };
                let r = store.append_batch(RUN, evs.clone(), expect_seq, durability(sync));
                absorb_gap(&store, &mut m)?;
                // (A gap declared after a crash may make a "wrong" expectation right.)
                if let Expect::Wrong(d) = expect {
                    if head + d != head_of(&m) {
                        prop_assert!(matches!(r, Err(Error::SeqConflict { .. })), "{r:?}");
                        continue;
                    }
                }
                if let (Err(Error::SeqConflict { .. }), true) = (&r, head_of(&m) > head) {
                    // The expected head was the model's; a declared gap moved it.
                    continue;
                }
                let got = r.map_err(|e| TestCaseError::fail(format!("append: {e}")))?;
                let head = head_of(&m);
                prop_assert_eq!(got.len(), n);
                for (i, (g, e)) in got.iter().zip(&evs).enumerate() {
                    prop_assert_eq!(g.seq, head + 1 + i as u64);
                    prop_assert_eq!(&g.content, &e.content);
                    if let Some(id) = &e.id {
                        prop_assert_eq!(&g.id, id);
                    } else {
                        prop_assert!(g.id.starts_with("swarm:"));
                    }
                    if let Some(last) = m.events.last() {
                        prop_assert!(g.ts >= last.ts);
                    }
                }
                m.max_seq = m.max_seq.max(head + n as u64);
                m.events.extend(got);
                if sync {
                    m.durable = m.events.len();
                }
                m.settled = true;
                if ids {
                    m.sent.push(Sent {
                        events: evs,
                        first_seq: head + 1,
                        lost: false,
                    });
                }
            }
            Op::Retry { pick, sync } => {
                let live: Vec<&Sent> = m.sent.iter().filter(|s| !s.lost).collect();
                if live.is_empty() {
                    continue;
                }
                let s = live[pick % live.len()];
                let Some(first) = m.events.iter().position(|e| e.seq == s.first_seq) else {
                    return Err(TestCaseError::fail("a live request is not in the model"));
                };
                let want = m.events[first..first + s.events.len()].to_vec();
                let got = store
                    .append_batch(RUN, s.events.clone(), None, durability(sync))
                    .map_err(|e| TestCaseError::fail(format!("retry: {e}")))?;
                prop_assert_eq!(&got, &want, "a retry is not the stored event");
                if sync {
                    m.durable = m.durable.max(first + want.len());
                }
                absorb_gap(&store, &mut m)?;
            }
            Op::RetryLost { pick } => {
                let lost: Vec<usize> = (0..m.sent.len()).filter(|&i| m.sent[i].lost).collect();
                if lost.is_empty() {
                    continue;
                }
                let i = lost[pick % lost.len()];
                let mut evs = m.sent[i].events.clone();
                for e in &mut evs {
                    e.refs.clear();
                }
                let got = store
                    .append_batch(RUN, evs.clone(), None, Durability::Sync)
                    .map_err(|e| TestCaseError::fail(format!("retry of a lost one: {e}")))?;
                absorb_gap(&store, &mut m)?;
                let head = head_of(&m);
                prop_assert_eq!(got[0].seq, head + 1, "a lost event's id is free again");
                m.max_seq = m.max_seq.max(head + got.len() as u64);
                m.events.extend(got);
                m.durable = m.events.len();
                m.settled = true;
                m.sent[i] = Sent {
                    events: evs,
                    first_seq: head + 1,
                    lost: false,
                };
            }
            Op::PartialRetry { pick } => {
                let live: Vec<&Sent> = m.sent.iter().filter(|s| !s.lost).collect();
                if live.is_empty() {
                    continue;
                }
                let s = live[pick % live.len()];
                m.next_id += 1;
                let mut fresh = s.events[0].clone();
                fresh.id = Some(format!("id-{}", m.next_id));
                fresh.refs.clear();
                let r = store.append_batch(
                    RUN,
                    vec![fresh, s.events[0].clone()],
                    None,
                    Durability::Sync,
                );
                prop_assert!(
                    matches!(&r, Err(Error::Invalid { field, .. }) if field == "id"),
                    "{r:?}"
                );
                absorb_gap(&store, &mut m)?;
            }
            Op::Reopen => {
                drop(store);
                store = open();
            }
            Op::Crash { seed } => {
                drop(store);
                mem.crash(|path, unsynced| match mix(seed, path) % 4 {
                    0 => 0,
                    1 => unsynced,
                    _ => (mix(seed ^ 1, path) % (unsynced as u64 + 1)) as usize,
                });
                store = open();
                if m.events.is_empty() && !mem.exists(Path::new("/m/model/run.json")) {
                    continue;
                }
                let got = written(&store)?;
                prop_assert!(
                    got.len() >= m.durable && got.len() <= m.events.len(),
                    "after a crash {} events, durable {} of {}",
                    got.len(),
                    m.durable,
                    m.events.len()
                );
                prop_assert_eq!(
                    &got[..],
                    &m.events[..got.len()],
                    "not a prefix of the model"
                );
                m.events.truncate(got.len());
                let kept = head_of(&m);
                for s in &mut m.sent {
                    if s.first_seq > kept {
                        s.lost = true;
                    }
                }
                m.settled = false;
            }
            Op::Read { from, limit } => {
                if m.events.is_empty() {
                    continue;
                }
                let got = read(
                    &store,
                    ReadOptions {
                        from_seq: Some(from),
                        limit,
                        ..ReadOptions::default()
                    },
                )?;
                let want: Vec<Event> = m
                    .events
                    .iter()
                    .filter(|e| e.seq >= from)
                    .take(limit.unwrap_or(usize::MAX))
                    .cloned()
                    .collect();
                if m.settled {
                    prop_assert_eq!(got, want);
                } else {
                    prop_assert!(want.starts_with(&got), "a read after a crash shows more");
                }
            }
        }
    }
    // Settle and check the whole log once more, also across one last crash.
    if !m.events.is_empty() {
        let last = store
            .append(
                RUN,
                NewEvent::new("closer", EventType::Decision, "done"),
                Durability::Sync,
            )
            .map_err(|e| TestCaseError::fail(format!("closing append: {e}")))?;
        absorb_gap(&store, &mut m)?;
        prop_assert_eq!(last.seq, head_of(&m) + 1);
        m.events.push(last);
        prop_assert_eq!(read(&store, ReadOptions::default())?, m.events.clone());
        let rep = store.verify(RUN, |_| {}).unwrap();
        prop_assert!(rep.ok && rep.torn_tail.is_none(), "{:?}", rep);
        drop(store);
        mem.crash(|_, n| n / 2);
        prop_assert_eq!(written(&open())?, m.events);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn log_matches_the_model(small in any::<bool>(), ops in proptest::collection::vec(op(), 1..60)) {
        run_ops(small, ops)?;
    }
}
