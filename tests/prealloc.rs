//! Preallocated segments (issue 12 item 3): the active segment is zero-filled ahead of
//! its last frame, a sealed one is trimmed to its last frame at rotation. A power loss or
//! a crash in the middle of either must lose nothing acknowledged, show readers nothing
//! that was not written, and leave a log the next append continues.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use swarm_memory::log::segment::{self, content_end};
use swarm_memory::log::storage::OpenMode;
use swarm_memory::{Durability, Event, LogOptions, MemStorage, NewEvent, Storage, Store};

use crate::util::{check_frames, lib_read, new_ev};

const ROOT: &str = "/data";

fn open(mem: &MemStorage, segment_bytes: u64) -> Store {
    open_with(mem, segment_bytes, 1 << 20)
}

fn open_with(mem: &MemStorage, segment_bytes: u64, prealloc_bytes: u64) -> Store {
    Store::open_with(
        Arc::new(mem.clone()),
        Path::new(ROOT),
        LogOptions {
            segment_bytes,
            prealloc_bytes,
            ..LogOptions::default()
        },
    )
    .expect("open store")
}

fn run_dir(run: &str) -> PathBuf {
    Path::new(ROOT).join("anonymous").join(run)
}

fn segments(mem: &MemStorage, run: &str) -> Vec<PathBuf> {
    let dir = run_dir(run);
    let mut bases: Vec<u64> = mem
        .list(&dir)
        .unwrap_or_default()
        .iter()
        .filter_map(|n| segment::parse_segment_name(n))
        .collect();
    bases.sort_unstable();
    bases
        .into_iter()
        .map(|b| segment::segment_path(&dir, b))
        .collect()
}

fn file_len(mem: &MemStorage, p: &Path) -> u64 {
    mem.open(p, OpenMode::Read).unwrap().len().unwrap()
}

fn frames_end(mem: &MemStorage, p: &Path) -> u64 {
    let f = mem.open(p, OpenMode::Read).unwrap();
    content_end(&*f, 0, f.len().unwrap()).unwrap()
}

/// Checks a run after a crash: the acknowledged events are all there, in order, once;
/// every segment is whole frames (and the fill); sealed segments end with their last
/// frame; verify finds no corruption; and the next append continues the seqs.
fn check_after_crash(mem: &MemStorage, run: &str, acked: &[Event], segment_bytes: u64) {
    check_run_after(mem, run, acked, segment_bytes, true);
}

fn check_run_after(
    mem: &MemStorage,
    run: &str,
    acked: &[Event],
    segment_bytes: u64,
    sealed_trimmed: bool,
) {
    let store = open(mem, segment_bytes);
    let got = lib_read(&store, run);
    assert!(got.len() >= acked.len(), "{} < {}", got.len(), acked.len());
    assert_eq!(&got[..acked.len()], acked, "acknowledged events changed");
    let rep = store.verify(run, |_| {}).unwrap();
    assert!(rep.ok, "{rep:?}");
    let next = store
        .append(run, new_ev(None, "after the crash"), Durability::Sync)
        .unwrap();
    let all = lib_read(&store, run);
    assert_eq!(all.last(), Some(&next));
    for (i, e) in all.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "seqs gap-free");
    }
    let segs = segments(mem, run);
    for (i, p) in segs.iter().enumerate() {
        let bytes = mem.contents(p).unwrap();
        check_frames(&p.display().to_string(), &bytes);
        if sealed_trimmed && i + 1 < segs.len() {
            assert_eq!(bytes.last(), Some(&b'\n'), "sealed segment not trimmed");
        }
    }
    let rep = store.verify(run, |_| {}).unwrap();
    assert!(rep.ok && rep.torn_tail.is_none(), "{rep:?}");
}

/// The active segment is preallocated: its file is longer than its frames and the rest
/// is zeros; readers, verify and run info count only the frames. Small groups keep a
/// small fill ahead (at least 32 KiB), large ones up to the chunk (1 MiB here).
#[test]
fn the_active_segment_is_zero_filled_ahead() {
    let mem = MemStorage::new();
    let store = open(&mem, 64 << 20);
    let run = "r";
    let mut acked = Vec::new();
    for i in 0..20 {
        acked.push(
            store
                .append(run, new_ev(None, &format!("event {i}")), Durability::Sync)
                .unwrap(),
        );
    }
    let seg = &segments(&mem, run)[0];
    let (len, end) = (file_len(&mem, seg), frames_end(&mem, seg));
    assert!(len >= end + (32 << 10), "no fill ahead: {len} vs {end}");
    assert!(
        len <= end + (64 << 10) + 4096,
        "small groups, small fill: {len} vs {end}"
    );
    assert_eq!(check_frames("seg", &mem.contents(seg).unwrap()), 20);
    // A batch of about 200 KiB: its fill is the whole chunk.
    let big: Vec<NewEvent> = (0..100)
        .map(|i| new_ev(None, &format!("big {i} {}", "y".repeat(2000))))
        .collect();
    acked.extend(
        store
            .append_batch(run, big, None, Durability::Sync)
            .unwrap(),
    );
    let (len, end) = (file_len(&mem, seg), frames_end(&mem, seg));
    assert!(
        len >= end + (512 << 10),
        "a large group's fill: {len} vs {end}"
    );
    assert!(
        len <= end + (1 << 20) + 4096,
        "at most the chunk: {len} vs {end}"
    );
    assert_eq!(check_frames("seg", &mem.contents(seg).unwrap()), 21);
    assert_eq!(lib_read(&store, run), acked);
    let rep = store.verify(run, |_| {}).unwrap();
    assert!(rep.ok && rep.torn_tail.is_none(), "{rep:?}");
    assert_eq!(rep.bytes, end, "{rep:?}");
    assert_eq!(store.run_info(run).unwrap().bytes, end);
}

/// Power loss at every point of a group that preallocates: the unsynced bytes (a frame
/// whose fsync never returned and the zero fill written before it) survive in any prefix.
/// Nothing acknowledged is lost, nothing torn is shown, appends go on.
#[test]
fn power_loss_during_preallocation() {
    let run = "p";
    // 64 KiB segments filled ahead 2 KiB at a time: most groups extend the fill.
    let segment_bytes = 64 << 10;
    let mut cuts = 0;
    let mut preallocating = 0;
    for step in 1..12 {
        let mem = MemStorage::new();
        let store = open_with(&mem, segment_bytes, 2048);
        let mut acked = Vec::new();
        for i in 0..step * 3 {
            let text = format!("durable {i} {}", "x".repeat(200));
            acked.push(
                store
                    .append(run, new_ev(None, &text), Durability::Sync)
                    .unwrap(),
            );
        }
        // A group whose fsync fails (the power goes during it): never acknowledged, its
        // write may include a preallocation.
        let len_before = segments(&mem, run).pop().map_or(0, |p| file_len(&mem, &p));
        mem.fail_syncs(1);
        assert!(store
            .append(run, new_ev(None, &"y".repeat(900)), Durability::Sync)
            .is_err());
        let seg = segments(&mem, run).pop().unwrap();
        let written = mem.contents(&seg).unwrap();
        if written.len() as u64 > len_before.max(frames_end(&mem, &seg)) {
            preallocating += 1;
        }
        drop(store);
        for keep in (0..written.len() + 1).step_by(173) {
            let m = mem.clone_files();
            m.crash(|p, n| if p == seg { keep.min(n) } else { n });
            check_after_crash(&m, run, &acked, segment_bytes);
            cuts += 1;
        }
    }
    assert!(cuts > 50, "{cuts}");
    assert!(
        preallocating >= 3,
        "only {preallocating} failed groups preallocated"
    );
}

/// A crash between a rotation's trim and its fsync leaves the full segment with its
/// fill, or trimmed; and a sealed segment that kept its fill (written by a version that
/// did not trim, or a crash we cannot produce here) still reads to its last frame.
#[test]
fn a_full_segment_with_its_fill_reads_and_rotates() {
    let mem = MemStorage::new();
    let run = "t";
    let segment_bytes = 4096;
    let store = open(&mem, segment_bytes);
    let mut acked = Vec::new();
    while segments(&mem, run).len() < 3 {
        acked.push(
            store
                .append(run, new_ev(None, &"z".repeat(300)), Durability::Sync)
                .unwrap(),
        );
    }
    drop(store);
    let segs = segments(&mem, run);
    // Put a fill back behind the first (sealed) segment's last frame.
    let first = &segs[0];
    let mut bytes = mem.contents(first).unwrap();
    assert_eq!(bytes.last(), Some(&b'\n'), "trimmed at rotation");
    bytes.resize(bytes.len() + 3000, 0);
    mem.set_contents(first, bytes);
    check_run_after(&mem, run, &acked, segment_bytes, false);

    // A crash after the trim's truncate but before its fsync: the durable image
    // still has the fill; a power loss brings it back.
    let mem = MemStorage::new();
    let store = open(&mem, segment_bytes);
    let mut acked = Vec::new();
    let mut last_len = 0;
    loop {
        acked.push(
            store
                .append(run, new_ev(None, &"w".repeat(300)), Durability::Sync)
                .unwrap(),
        );
        let seg = segments(&mem, run)[0].clone();
        let end = frames_end(&mem, &seg);
        if end >= segment_bytes {
            break;
        }
        last_len = end;
    }
    assert!(last_len > 0);
    drop(store);
    // The segment is full but not rotated yet (the next append rotates): trim it as
    // the rotation would, without its fsync, then lose power.
    let seg = segments(&mem, run)[0].clone();
    let f = mem.open(&seg, OpenMode::ReadWriteCreate).unwrap();
    f.set_len(frames_end(&mem, &seg)).unwrap();
    mem.crash(|_, n| n);
    check_after_crash(&mem, run, &acked, segment_bytes);
}
