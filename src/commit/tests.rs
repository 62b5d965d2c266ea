//! The commit layer's tests: failed writes and fsyncs, torn tails, retries in groups,
//! panics in a group (on `MemStorage`, with injected faults).
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use crate::error::Error;
use crate::event::{EventType, NewEvent};
use crate::log::storage::{MemStorage, OpenMode};
use crate::query::options::{ReadOptions, Visibility};
use crate::store::Store;

use crate::log::meta::{Durability, LogOptions};

use super::Slot;

/// A flush extends its cover over the whole frames another process wrote after this
/// process's last one (and stops before a torn one).
#[test]
fn a_flush_covers_other_processes_later_frames() {
    let mem = MemStorage::new();
    let (a, b) = (store(&mem, 1 << 20), store(&mem, 1 << 20));
    let ev = || NewEvent::new("x", EventType::Evidence, "e");
    a.append("r", ev(), Durability::None).unwrap();
    b.append("r", ev(), Durability::None).unwrap();
    b.append("r", ev(), Durability::None).unwrap();
    let log = a.writer("r", "anonymous").unwrap();
    let (own, seg) = {
        let s = super::lock(&log.sync);
        let (p, _, f) = s.written.clone().unwrap();
        (p, f)
    };
    let path = crate::log::segment::segment_path(&log.dir, own.seg);
    let (to, seq) = log.whole_frames_after(&seg, &path, own, 1);
    assert_eq!(seq, 3);
    // The frames end where the preallocated zero fill begins.
    let len = seg.len().unwrap();
    assert_eq!(
        to.off,
        crate::log::segment::content_end(&*seg, 0, len).unwrap()
    );
    assert!(len > to.off, "the segment is preallocated");
    // A torn frame after them is not covered.
    seg.write_all_at(b"{\"crc\":\"0", to.off).unwrap();
    assert_eq!(log.whole_frames_after(&seg, &path, own, 1), (to, 3));
}

/// An append whose frame is written when the writer is poisoned (another thread's
/// fsync of the run failed) gets an `fsync` error saying its outcome is unknown, never
/// `Poisoned`, which says it wrote nothing: a handing process retries a `Poisoned`
/// batch itself and would find this frame and acknowledge it after an fsync of its
/// own, blind to the error. An append refused before its write stays `Poisoned`.
#[test]
fn a_written_append_of_a_poisoned_writer_has_an_unknown_outcome() {
    let mem = MemStorage::new();
    let s = store(&mem, 1 << 20);
    let ev = || NewEvent::new("x", EventType::Evidence, "e");
    let e = s.append("r", ev(), Durability::None).unwrap();
    let log = s.writer("r", "anonymous").unwrap();
    let (end, seg) = {
        let st = super::lock(&log.sync);
        let (p, _, f) = st.written.clone().unwrap();
        (p, f)
    };
    log.poisoned
        .store(true, std::sync::atomic::Ordering::Release);
    // (Not durable: `none` never syncs.)
    match log.wait_durable(end, e.seq, &seg) {
        Err(Error::Io { op, source, .. }) => {
            assert_eq!(op, "fsync");
            assert!(source.to_string().contains("unknown"), "{source}");
        }
        other => panic!("want an unknown outcome, got {other:?}"),
    }
    // A waiter settled by another thread's poisoned fsync round gets the same.
    let w = Slot::waiter();
    {
        let mut st = super::lock(&log.sync);
        st.waiters.push(((end, e.seq, seg.clone()), w.clone()));
        let woken = log.settle_waiters(&mut st, None);
        assert_eq!(woken.len(), 1);
    }
    assert!(w.done.load(std::sync::atomic::Ordering::Acquire));
    let r = super::lock(&w.result).take().expect("a result");
    assert!(
        matches!(r, Err(Error::Io { op: "fsync", .. })),
        "{:?}",
        r.err()
    );
    let r = s.append("r", ev(), Durability::Sync);
    assert!(matches!(r, Err(Error::Poisoned(_))), "{r:?}");
}

/// `a`'s next `pwrite` stores only its first `keep` bytes and fails; in that window
/// `b` (another process, in effect), whose own frame is not durable yet, flushes, and
/// a reader reads the run. Returns `a`'s answer, what the reader saw (seq and
/// content), and `a` and a reader for afterwards.
fn a_write_fails_while_another_process_flushes(
    keep: usize,
) -> (
    crate::error::Result<crate::Event>,
    Vec<(u64, String)>,
    Store,
    Store,
) {
    let mem = MemStorage::new();
    let (a, b) = (store(&mem, 1 << 20), store(&mem, 1 << 20));
    let ev = |c: &str| NewEvent::new("x", EventType::Evidence, c);
    assert_eq!(a.append("r", ev("one"), Durability::Sync).unwrap().seq, 1);
    // Written and visible, not durable yet: `b`'s next flush has work to do.
    assert_eq!(b.append("r", ev("two"), Durability::None).unwrap().seq, 2);
    let al = a.writer("r", "anonymous").unwrap();
    let seg_path = crate::log::segment::segment_path(&al.dir, super::lock(&al.writer).seg_base);
    let bl = b.writer("r", "anonymous").unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (seen2, mem2) = (seen.clone(), mem.clone());
    mem.fail_next_write(&seg_path, keep, move || {
        let (end, seq, file) = super::lock(&bl.sync).written.clone().unwrap();
        bl.wait_durable(end, seq, &file).unwrap();
        let reader = store(&mem2, 1 << 20);
        *seen2.lock().unwrap() = reader
            .read("r", ReadOptions::default())
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| (e.seq, e.content.to_string()))
            .collect::<Vec<_>>();
    });
    let r = a.append("r", ev("three"), Durability::Sync);
    let seen = seen.lock().unwrap().clone();
    (r, seen, a, store(&mem, 1 << 20))
}

fn contents(s: &Store) -> Vec<(u64, String)> {
    s.read("r", ReadOptions::default())
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (e.seq, e.content.to_string()))
        .collect()
}

/// A `pwrite` that fails after a whole frame reached the file, while another process
/// flushes: that flush publishes the frame (it extends its cover over whole frames
/// after its own) and a reader reads it as durable. The writer must not cut it (it
/// did: the reader saw seq 3 "three" published durable, and the next load found it
/// gone and declared seq 3 lost); its append has an unknown outcome, and the next one
/// goes after it.
#[test]
fn a_failed_write_never_takes_back_a_frame_another_process_published() {
    let (r, seen, a, reader) = a_write_fails_while_another_process_flushes(usize::MAX);
    assert_eq!(seen.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert!(seen[2].1.contains("three"), "{seen:?}");
    let ev = NewEvent::new("x", EventType::Evidence, "four");
    let next = a.append("r", ev, Durability::Sync).unwrap().seq;
    let now = contents(&reader);
    assert_eq!(now[..3], seen[..], "what a reader saw was taken back");
    assert_eq!(next, 4);
    assert!(now[3].1.contains("four"), "{now:?}");
    assert!(
        matches!(&r, Err(Error::Io { source, .. }) if source.to_string().contains("unknown")),
        "{r:?}"
    );
}

/// A `pwrite` that fails before a whole frame reached the file: nothing of it can be
/// published, so the append failed for sure (a plain write error), the bytes are cut at
/// once, and the next append takes the seq.
#[test]
fn a_failed_write_of_no_whole_frame_fails_for_sure() {
    let (r, seen, a, reader) = a_write_fails_while_another_process_flushes(10);
    assert!(
        matches!(&r, Err(Error::Io { source, .. })
            if source.to_string().contains("injected") && !source.to_string().contains("unknown")),
        "{r:?}"
    );
    assert_eq!(seen.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 2]);
    let ev = NewEvent::new("x", EventType::Evidence, "four");
    assert_eq!(a.append("r", ev, Durability::Sync).unwrap().seq, 3);
    let now = contents(&reader);
    assert_eq!(now.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert!(now[2].1.contains("four"), "{now:?}");
}

/// A `pwrite` that fails after its whole frame reached the file, when reading the
/// file back to learn that fails too: nothing is known, so the outcome is unknown
/// (it was a plain failure, "not stored", and an id-less retry stored it twice).
#[test]
fn a_failed_write_whose_read_back_fails_has_an_unknown_outcome() {
    let mem = MemStorage::new();
    let (a, _, seg_path) = run_of_one(&mem);
    let (mem2, p2) = (mem.clone(), seg_path.clone());
    mem.fail_next_write(&seg_path, usize::MAX, move || mem2.fail_next_reads(&p2, 1));
    let r = a.append("r", ev("two"), Durability::Sync);
    stored_though_unknown(&mem, &a, r);
}

fn ev(c: &str) -> NewEvent {
    NewEvent::new("x", EventType::Evidence, c)
}

/// A store on `mem` whose run "r" holds one event, "one"; the run's directory and
/// its segment's path.
fn run_of_one(mem: &MemStorage) -> (Store, std::path::PathBuf, std::path::PathBuf) {
    let a = store(mem, 1 << 20);
    assert_eq!(a.append("r", ev("one"), Durability::Sync).unwrap().seq, 1);
    let al = a.writer("r", "anonymous").unwrap();
    let seg_path = crate::log::segment::segment_path(&al.dir, super::lock(&al.writer).seg_base);
    (a, al.dir.clone(), seg_path)
}

/// `r`, the answer of appending "two" after "one", is an unknown outcome of an
/// injected failure, and "two" is stored: the next append goes after it.
fn stored_though_unknown(mem: &MemStorage, a: &Store, r: crate::error::Result<crate::Event>) {
    assert!(
        matches!(&r, Err(Error::Io { source, .. })
            if source.to_string().contains("injected") && source.to_string().contains("unknown")),
        "{r:?}"
    );
    assert_eq!(a.append("r", ev("three"), Durability::Sync).unwrap().seq, 3);
    let now = contents(&store(mem, 1 << 20));
    assert_eq!(now.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert!(now[1].1.contains("two"), "{now:?}");
}

/// A retry of an event stored before, in one write group with a new append whose
/// `pwrite` fails before a whole frame reached the file: the new append fails for
/// sure, the retry gets its stored event (it was told "failed" with the group, and
/// a caller that then appended again without the id stored it twice).
#[test]
fn a_stored_retry_in_a_failed_write_group_gets_its_event() {
    let mem = MemStorage::new();
    let a = store(&mem, 1 << 20);
    let mut x = NewEvent::new("x", EventType::Evidence, "one");
    x.id = Some("X".into());
    assert_eq!(a.append("r", x.clone(), Durability::Sync).unwrap().seq, 1);
    let al = a.writer("r", "anonymous").unwrap();
    let seg_path = crate::log::segment::segment_path(&al.dir, super::lock(&al.writer).seg_base);
    mem.fail_next_write(&seg_path, 10, || {});
    let two = NewEvent::new("x", EventType::Evidence, "two");
    let r = a.append_many(
        "r",
        vec![(vec![x], None), (vec![two], None)],
        Durability::Sync,
    );
    assert_eq!(r[0].as_ref().map(|e| e[0].seq).ok(), Some(1), "{r:?}");
    assert!(
        matches!(&r[1], Err(Error::Io { source, .. })
            if source.to_string().contains("injected") && !source.to_string().contains("unknown")),
        "{r:?}"
    );
    let three = NewEvent::new("x", EventType::Evidence, "three");
    assert_eq!(a.append("r", three, Durability::Sync).unwrap().seq, 2);
}

/// A step after a group's successful write fails (here its visible mark's write):
/// the group's frames are in the log, so its appends have an unknown outcome, not
/// the plain error (which says "not stored": an id-less retry stored it twice).
#[test]
fn an_error_after_a_groups_write_is_an_unknown_outcome() {
    let mem = MemStorage::new();
    let (a, dir, _) = run_of_one(&mem);
    mem.fail_next_write(&dir.join(crate::log::meta::SYNCED_FILE), 0, || {});
    let r = a.append("r", ev("two"), Durability::None);
    stored_though_unknown(&mem, &a, r);
}

/// A `pwrite` that fails part-way through a frame (a full disk, mostly): its bytes
/// are cut at once (nobody can have published part of a frame), so the next append
/// finds no torn tail to copy aside, and no `.broken` file is made (at a full disk
/// each attempt made a new, empty one, until none could be made and the run took no
/// append even once space was freed).
#[test]
fn a_write_that_fails_part_way_through_a_frame_is_cut_at_once() {
    let mem = MemStorage::new();
    let (a, dir, seg_path) = run_of_one(&mem);
    let end = frame_end(&mem, &seg_path);
    for keep in [10, 20, 10] {
        mem.fail_next_write(&seg_path, keep, || {});
        let r = a.append("r", ev("torn"), Durability::Sync);
        assert!(
            matches!(&r, Err(Error::Io { source, .. })
                if source.to_string().contains("injected") && !source.to_string().contains("unknown")),
            "{r:?}"
        );
        assert_eq!(mem.contents(&seg_path).unwrap().len(), end, "{keep}");
    }
    assert_eq!(a.append("r", ev("two"), Durability::Sync).unwrap().seq, 2);
    assert_eq!(broken_copies(&mem, &dir), Vec::<usize>::new());
    let now = contents(&store(&mem, 1 << 20));
    assert_eq!(now.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 2]);
}

/// Torn tails a dead writer left at one offset, again and again, are each kept aside
/// in a file of their own (the second overwrote the first); an empty copy (a crash
/// between its creation and its write) is written over, not counted.
#[test]
fn torn_tails_cut_at_one_offset_are_each_kept() {
    let mem = MemStorage::new();
    let (a, dir, seg_path) = run_of_one(&mem);
    drop(a);
    let end = frame_end(&mem, &seg_path);
    let name = seg_path.file_name().unwrap().to_string_lossy().into_owned();
    let empty = dir.join(format!("{name}.{end}.broken"));
    crate::log::storage::Storage::open(&mem, &empty, OpenMode::ReadWriteCreate).unwrap();
    for keep in [10, 20] {
        let mut bytes = mem.contents(&seg_path).unwrap();
        bytes.truncate(end);
        bytes.extend(std::iter::repeat_n(b'x', keep));
        mem.set_contents(&seg_path, bytes);
        // A new process's writer cuts it (and appends nothing).
        assert!(store(&mem, 1 << 20).repair_all("r").unwrap().is_empty());
    }
    assert_eq!(broken_copies(&mem, &dir), vec![10, 20]);
    let b = store(&mem, 1 << 20);
    assert_eq!(b.append("r", ev("two"), Durability::Sync).unwrap().seq, 2);
}

/// A torn tail whose copy cannot be written (a full disk) is not cut, and the failed
/// copy is removed: attempts leave no files behind, and once the copy can be written
/// the tail is cut and the run appends again.
#[test]
fn a_torn_tail_whose_copy_fails_leaves_no_copy_behind() {
    let mem = MemStorage::new();
    let (a, dir, seg_path) = run_of_one(&mem);
    drop(a);
    let end = frame_end(&mem, &seg_path);
    let mut bytes = mem.contents(&seg_path).unwrap();
    bytes.truncate(end);
    bytes.extend(std::iter::repeat_n(b'x', 12));
    mem.set_contents(&seg_path, bytes);
    let name = seg_path.file_name().unwrap().to_string_lossy().into_owned();
    let aside = dir.join(format!("{name}.{end}.broken"));
    for _ in 0..3 {
        mem.fail_next_write(&aside, 0, || {});
        let r = store(&mem, 1 << 20).append("r", ev("two"), Durability::Sync);
        assert!(r.is_err(), "{r:?}");
        assert_eq!(broken_copies(&mem, &dir), Vec::<usize>::new());
    }
    let b = store(&mem, 1 << 20);
    assert_eq!(b.append("r", ev("two"), Durability::Sync).unwrap().seq, 2);
    assert_eq!(broken_copies(&mem, &dir), vec![12]);
}

/// A `sync` append whose frame was made durable but whose mark could not be written
/// (`SYNCED`'s first block at a full disk): the frame is in the log, so the outcome is
/// unknown (it was the plain error, "not stored", and an id-less retry stored it
/// twice).
#[test]
fn a_durable_frame_whose_mark_fails_has_an_unknown_outcome() {
    let mem = MemStorage::new();
    let (a, dir, _) = run_of_one(&mem);
    mem.fail_next_write(&dir.join(crate::log::meta::SYNCED_FILE), 0, || {});
    let r = a.append("r", ev("two"), Durability::Sync);
    stored_though_unknown(&mem, &a, r);
}

/// A flush whose fsync fails (a full disk at writeback, say: NFS, quotas) covers frames
/// already written: its appends have an unknown outcome, never "nothing was stored"
/// (a server answered that as 507 storage-full), and the error keeps its op.
#[test]
fn a_failed_fsync_is_never_storage_full() {
    let mem = MemStorage::new();
    let (a, _, _) = run_of_one(&mem);
    mem.fail_syncs(1);
    let r = a.append("r", ev("two"), Durability::Sync);
    match &r {
        Err(e @ Error::Io { op, .. }) => {
            assert_eq!(*op, "fsync");
            assert!(e.outcome_unknown() && !e.storage_full(), "{e}");
        }
        other => panic!("want the fsync's error: {other:?}"),
    }
    let full = Error::Io {
        op: "fsync",
        path: "/x".into(),
        source: std::io::Error::new(std::io::ErrorKind::StorageFull, "no space"),
    };
    assert!(!full.storage_full());
}

/// The end of the first frame of the segment at `path` (its only one, in these tests).
fn frame_end(mem: &MemStorage, path: &Path) -> usize {
    let bytes = mem.contents(path).unwrap();
    bytes.iter().position(|&b| b == b'\n').unwrap() + 1
}

/// The sizes of the torn-tail copies in `dir`, smallest first.
fn broken_copies(mem: &MemStorage, dir: &Path) -> Vec<usize> {
    let mut kept: Vec<usize> = crate::log::storage::Storage::list(mem, dir)
        .unwrap()
        .iter()
        .filter(|n| n.ends_with(".broken"))
        .map(|n| mem.contents(&dir.join(n)).unwrap().len())
        .collect();
    kept.sort();
    kept
}

/// A group of a new `none` append between an event with an id and a retry of that
/// event: the new append is visible once answered (the visible mark stopped at the
/// retry's frame, the first one, and the second was answered but not shown).
#[test]
fn a_group_with_a_retry_of_its_own_frame_shows_every_answered_append() {
    let mem = MemStorage::new();
    let a = store(&mem, 1 << 20);
    let mut x = NewEvent::new("x", EventType::Evidence, "one");
    x.id = Some("X".into());
    let two = NewEvent::new("x", EventType::Evidence, "two");
    let r = a.append_many(
        "r",
        vec![(vec![x.clone()], None), (vec![two], None), (vec![x], None)],
        Durability::None,
    );
    let got: Vec<u64> = r.iter().map(|e| e.as_ref().unwrap()[0].seq).collect();
    assert_eq!(got, vec![1, 2, 1]);
    assert_eq!(
        seqs(&store(&mem, 1 << 20), "r", Visibility::Visible),
        vec![1, 2]
    );
}

/// Two handles on one run of one event; `a`'s next write group panics where `hook`
/// says (the hook is taken). Returns the storage, both handles and `a`'s answer. The
/// run's directory is this test's own (the hook is a process-wide static keyed by it:
/// under `/data`, another test's group on run `r` running beside it took the panic).
fn panic_in_a_group(
    hook: &std::sync::Mutex<Option<std::path::PathBuf>>,
    root: &str,
) -> (MemStorage, Store, Store, crate::error::Result<crate::Event>) {
    let mem = MemStorage::new();
    let (a, b) = (panic_store(&mem, root), panic_store(&mem, root));
    let ev = || NewEvent::new("x", EventType::Evidence, "e");
    a.append("r", ev(), Durability::Sync).unwrap();
    *super::lock(hook) = Some(a.writer("r", "anonymous").unwrap().dir.clone());
    let r = a.append("r", ev(), Durability::Sync);
    assert!(super::lock(hook).is_none(), "the group did not run");
    (mem, a, b, r)
}

/// A write group that panics (a bug) answers its appends `Poisoned` (no hang), poisons
/// this handle's writer as a failed fsync does, and lets the run's `LOCK` go: another
/// handle's append (another process, in effect) goes on, gap-free.
#[test]
fn a_panicking_write_group_lets_the_append_lock_go() {
    let ev = || NewEvent::new("x", EventType::Evidence, "e");
    let (mem, a, b, r) = panic_in_a_group(&super::writer::PANIC_IN_NEXT_GROUP, "/panic-in-group");
    assert!(matches!(r, Err(Error::Poisoned(_))), "{r:?}");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(b.append("r", ev(), Durability::Sync).map(|e| e.seq));
    });
    let seq = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the other handle's append waits for LOCK for ever");
    assert_eq!(seq.unwrap(), 2);
    let r = a.append("r", ev(), Durability::Sync);
    assert!(matches!(r, Err(Error::Poisoned(_))), "{r:?}");
    assert_eq!(seqs(&a, "r", Visibility::Visible), vec![1, 2]);
    let c = panic_store(&mem, "/panic-in-group");
    assert_eq!(c.append("r", ev(), Durability::Sync).unwrap().seq, 3);
}

/// A store on `mem` under `root`, which no other test uses (`panic_in_a_group`).
fn panic_store(mem: &MemStorage, root: &str) -> Store {
    Store::open_with(
        Arc::new(mem.clone()),
        Path::new(root),
        LogOptions {
            segment_bytes: 1 << 20,
            ..LogOptions::default()
        },
    )
    .unwrap()
}

/// A write group that panics after its `pwrite` answers its appends with an unknown
/// outcome, not `Poisoned` ("wrote nothing"): the frame is whole in the file, and
/// another handle (another process, in effect) finds it there and goes on after it.
#[test]
fn a_write_group_that_panics_after_its_write_has_an_unknown_outcome() {
    let ev = || NewEvent::new("x", EventType::Evidence, "e");
    let (_mem, a, b, r) =
        panic_in_a_group(&super::writer::PANIC_AFTER_NEXT_WRITE, "/panic-after-write");
    assert!(
        matches!(&r, Err(Error::Io { source, .. }) if source.to_string().contains("unknown")),
        "{r:?}"
    );
    let r = a.append("r", ev(), Durability::Sync);
    assert!(matches!(r, Err(Error::Poisoned(_))), "{r:?}");
    assert_eq!(b.append("r", ev(), Durability::Sync).unwrap().seq, 3);
    assert_eq!(seqs(&b, "r", Visibility::Visible), vec![1, 2, 3]);
}

/// A run being archived (its tombstone written, its segments removed, `SYNCED` and
/// `run.json` not yet): a writer that loads it in that window (a repair that passed
/// its archive check before the tombstone) finds no run, and creates no segment in
/// the archived run's directory (it created an empty first one, which the marks
/// showed short, and a repair then declared every seq lost there).
#[test]
fn a_run_being_archived_gets_no_new_segment() {
    let mem = MemStorage::new();
    let a = store(&mem, 1 << 20);
    for _ in 0..3 {
        a.append(
            "r",
            NewEvent::new("x", EventType::Evidence, "e"),
            Durability::Sync,
        )
        .unwrap();
    }
    let log = a.writer("r", "anonymous").unwrap();
    let dir = log.dir.clone();
    let tomb = dir.join(crate::log::meta::ARCHIVED_FILE);
    crate::log::storage::Storage::open(&mem, &tomb, crate::log::storage::OpenMode::CreateNew)
        .unwrap();
    mem.set_contents(&tomb, b"{}".to_vec());
    for base in crate::log::segment::list_segments(&mem, &dir).unwrap() {
        crate::log::storage::Storage::remove_file(
            &mem,
            &crate::log::segment::segment_path(&dir, base),
        )
        .unwrap();
    }
    let r = log.rebuild_marks();
    assert!(matches!(r, Err(Error::RunNotFound(_))), "{r:?}");
    assert!(crate::log::segment::list_segments(&mem, &dir)
        .unwrap()
        .is_empty());
}

#[test]
fn generated_ids_are_the_prefix_and_the_counter_in_hex() {
    let mem = MemStorage::new();
    let s = store(&mem, 1 << 20);
    s.append(
        "r",
        NewEvent::new("x", EventType::Evidence, "e"),
        Durability::None,
    )
    .unwrap();
    let log = s.writer("r", "anonymous").unwrap();
    for n in [0u64, 9, 10, 255, 4096, u64::MAX] {
        log.id_counter
            .store(n, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(log.generated_id(), format!("{}{n:x}", log.id_prefix));
    }
}

fn store(mem: &MemStorage, segment_bytes: u64) -> Store {
    Store::open_with(
        Arc::new(mem.clone()),
        Path::new("/data"),
        LogOptions {
            segment_bytes,
            ..LogOptions::default()
        },
    )
    .unwrap()
}

fn seqs(s: &Store, run: &str, visibility: Visibility) -> Vec<u64> {
    let opts = ReadOptions {
        visibility,
        ..ReadOptions::default()
    };
    s.read(run, opts).unwrap().map(|e| e.unwrap().seq).collect()
}

/// Many threads append in `sync` mode (their fsyncs overlap, across segment
/// rotations); after a power loss that keeps nothing unsynced, every acknowledged
/// event is there and readers see exactly the gap-free prefix.
#[test]
fn acknowledged_sync_appends_survive_a_power_loss() {
    let mem = MemStorage::new();
    let s = Arc::new(store(&mem, 4096));
    let acked: Vec<u64> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..8)
            .map(|t| {
                let s = s.clone();
                sc.spawn(move || {
                    (0..40)
                        .map(|i| {
                            let ev = NewEvent::new(
                                &format!("a{t}"),
                                EventType::Evidence,
                                format!("finding {i}"),
                            );
                            s.append("r", ev, Durability::Sync).unwrap().seq
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    // Every acknowledged event is visible at once (visible == durable in sync mode).
    assert_eq!(
        seqs(&s, "r", Visibility::Visible),
        (1..=320).collect::<Vec<_>>()
    );
    drop(s);
    mem.crash(|_, _| 0);
    let s = store(&mem, 4096);
    // `SYNCED` itself is never fsynced, so what survives is read as written.
    let after: HashSet<u64> = seqs(&s, "r", Visibility::Written).into_iter().collect();
    for q in &acked {
        assert!(after.contains(q), "acknowledged seq {q} lost");
    }
    let ev = NewEvent::new("a0", EventType::Decision, "go on");
    assert_eq!(s.append("r", ev, Durability::Sync).unwrap().seq, 321);
}

/// A repair in a process whose threads append `sync` to the same run: its
/// `log_damaged` event is made durable while it holds the writer, so it must not wait
/// for the fsync leader, whose next write needs the writer (they waited for each
/// other for ever).
#[test]
fn a_repair_beside_sync_appends_in_the_same_process_ends() {
    let mem = MemStorage::new();
    let s = Arc::new(store(&mem, 1 << 20));
    let ev = |t: usize, i: u32| {
        NewEvent::new(
            &format!("a{t}"),
            EventType::Evidence,
            format!("finding {i}"),
        )
    };
    for i in 0..5 {
        s.append("r", ev(0, i), Durability::Sync).unwrap();
    }
    // A bit of the third frame flipped on disk; this process's writer has passed it.
    flip_in_frame(&mem, &s, 2, 20, 0x10);
    // Threads of their own, not scoped: on a deadlock the test fails, not hangs.
    // At most 500 appends each (the in-memory files are copied as they grow: an
    // unbounded loop made the run, and the repair's read of it, slow on a loaded
    // machine), the repair started once they are under way.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let appenders: Vec<_> = (0..6)
        .map(|t| {
            let (s, stop, done) = (s.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                for i in 0..500 {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    s.append("r", ev(t, i), Durability::Sync).unwrap();
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .collect();
    let (tx, rx) = std::sync::mpsc::channel();
    let s2 = s.clone();
    std::thread::spawn(move || {
        while done.load(std::sync::atomic::Ordering::Relaxed) < 60 {
            std::thread::yield_now();
        }
        let _ = tx.send(s2.repair_all("r").map(|v| v.len()));
    });
    let r = rx.recv_timeout(std::time::Duration::from_secs(20));
    let r = r.expect("the repair did not end within 20 s");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for a in appenders {
        a.join().unwrap();
    }
    assert_eq!(r.unwrap(), 1, "one log_damaged event");
    let seqs = seqs(&s, "r", Visibility::Visible);
    assert!(!seqs.contains(&3) && seqs.len() > 5, "{seqs:?}");
}

/// The frame boundaries of a segment's bytes.
fn frame_bounds(bytes: &[u8]) -> Vec<usize> {
    use crate::log::frame::{self, Decoded};
    let mut bounds = vec![0];
    while let Decoded::Frame { len, .. } = frame::decode(&bytes[*bounds.last().unwrap()..]) {
        bounds.push(bounds.last().unwrap() + len);
    }
    bounds
}

/// Flips `mask` in byte `at` of frame `frame` of run `r`'s first segment, its fill
/// kept.
fn flip_in_frame(mem: &MemStorage, s: &Store, frame: usize, at: usize, mask: u8) {
    let seg = crate::log::segment::segment_path(&s.run_dir("r").unwrap(), 1);
    let mut bytes = mem.contents_without_fill(&seg).unwrap();
    let bounds = frame_bounds(&bytes);
    bytes[bounds[frame] + at] ^= mask;
    let fill = mem.contents(&seg).unwrap().len() - bytes.len();
    bytes.extend(std::iter::repeat_n(0, fill));
    mem.set_contents(&seg, bytes);
}

/// A live writer of another process, whose view ends where `swarm repair` later cut
/// the segment and sealed it (the last frame, acknowledged, was damaged): its next
/// append goes on after the `log_damaged` event, never into the sealed segment (where
/// it reused the seq declared lost, and was taken as durable unsynced, the published
/// mark being past it). (Review, 2026-11-29.)
#[test]
fn a_live_writer_goes_on_after_a_repair_of_another_process() {
    let mem = MemStorage::new();
    let (a, b) = (store(&mem, 1 << 20), store(&mem, 1 << 20));
    let ev = |i: u32| NewEvent::new("x", EventType::Evidence, format!("e{i}"));
    for i in 0..4 {
        b.append("r", ev(i), Durability::Sync).unwrap();
    }
    assert_eq!(a.append("r", ev(4), Durability::Sync).unwrap().seq, 5);
    flip_in_frame(&mem, &a, 4, 60, 0x01);
    // log_damaged{5..=5} is seq 6, in a new segment.
    let repaired = store(&mem, 1 << 20).repair_all("r").unwrap();
    assert_eq!(repaired.len(), 1);
    assert_eq!(repaired[0].seq, 6);
    let acked = b.append("r", ev(10), Durability::Sync).unwrap();
    assert_eq!(acked.seq, 7, "the live writer goes on after the repair");
    assert_eq!(a.append("r", ev(11), Durability::Sync).unwrap().seq, 8);
    drop((a, b));
    // Acknowledged means fsynced: it survives a power loss.
    mem.crash(|_, _| 0);
    let s = store(&mem, 1 << 20);
    assert_eq!(seqs(&s, "r", Visibility::Visible), [1, 2, 3, 4, 6, 7, 8]);
    assert_eq!(s.append("r", ev(12), Durability::Sync).unwrap().seq, 9);
}

/// A torn tail after a quarantined range in the same (last) segment is cut as any
/// torn tail: the scan's note of where valid records follow the quarantined damage
/// is not taken for the tail's (it refused the run's appends, and `swarm repair`
/// could not mend it). (Review, 2026-11-29.)
#[test]
fn a_torn_tail_after_a_quarantined_range_is_cut() {
    use crate::log::segment;
    let mem = MemStorage::new();
    let a = store(&mem, 1 << 20);
    let ev = |i: u32| NewEvent::new("x", EventType::Evidence, format!("e{i}"));
    for i in 0..6 {
        a.append("r", ev(i), Durability::Sync).unwrap();
    }
    let seg = segment::segment_path(&a.run_dir("r").unwrap(), 1);
    let fill = |bytes: &mut Vec<u8>| {
        let n = mem
            .contents(&seg)
            .unwrap()
            .len()
            .saturating_sub(bytes.len());
        bytes.extend(std::iter::repeat_n(0, n.max(8192)));
    };
    let mut bytes = mem.contents_without_fill(&seg).unwrap();
    let bounds = frame_bounds(&bytes);
    bytes[bounds[2] + 60] ^= 0x01;
    fill(&mut bytes);
    mem.set_contents(&seg, bytes);
    let repaired = a.repair_all("r").unwrap();
    assert_eq!(repaired.len(), 1, "seq 3 quarantined, declared as seq 7");
    drop(a);
    // A writer died mid-write: part of a frame after the last whole one.
    let mut bytes = mem.contents_without_fill(&seg).unwrap();
    let bounds = frame_bounds(&bytes[..]);
    let last = bounds[bounds.len() - 2];
    let torn = bytes[last..last + 30].to_vec();
    bytes.extend(torn);
    fill(&mut bytes);
    mem.set_contents(&seg, bytes);
    let c = store(&mem, 1 << 20);
    assert_eq!(c.append("r", ev(99), Durability::Sync).unwrap().seq, 8);
    assert_eq!(seqs(&c, "r", Visibility::Visible), [1, 2, 4, 5, 6, 7, 8]);
}

/// An id reused by another agent, whose event the run's policy hides from it, is
/// refused without naming the stored event's seq or fields; the author's own retry
/// with other fields is told which field differs (as is an agent that may read the
/// event: `tests/cli_safety.rs`). (Review, 2026-11-29.)
#[test]
fn an_id_of_an_event_hidden_from_the_caller_tells_nothing_of_it() {
    let mem = MemStorage::new();
    let s = store(&mem, 1 << 20);
    let with_id = |agent: &str, content: &str| {
        let mut e = NewEvent::new(agent, EventType::Hypothesis, content);
        e.id = Some("turn-7.1".into());
        e
    };
    s.append(
        "r",
        NewEvent::new("a", EventType::Evidence, "first"),
        Durability::Sync,
    )
    .unwrap();
    // "b" may write anything but read only evidence.
    let policy = serde_json::from_value(serde_json::json!({"permissions": {
        "a": {"read_channels": ["*"], "write_channels": ["*"], "read_types": ["*"],
              "write_types": ["*"], "admin": true},
        "b": {"read_channels": ["*"], "write_channels": ["*"], "read_types": ["evidence"],
              "write_types": ["*"]}}}))
    .unwrap();
    s.set_policy("r", "a", &policy).unwrap();
    let stored = s
        .append("r", with_id("a", "secret plan"), Durability::Sync)
        .unwrap();
    let other = s
        .append("r", with_id("b", "probe"), Durability::Sync)
        .unwrap_err()
        .to_string();
    assert!(other.contains("another agent"), "{other}");
    let seq = format!("seq {}", stored.seq);
    assert!(
        !other.contains(&seq) && !other.contains("content") && !other.contains("agent_id"),
        "{other}"
    );
    let own = s
        .append("r", with_id("a", "changed"), Durability::Sync)
        .unwrap_err()
        .to_string();
    assert!(own.contains(&seq) && own.contains("content"), "{own}");
}

/// An fsync fails while other threads' fsyncs may be in flight: no append is
/// acknowledged unless it survives a power loss, and the writer stays poisoned.
#[test]
fn a_failed_fsync_acknowledges_nothing_lost_and_poisons() {
    let mem = MemStorage::new();
    let s = Arc::new(store(&mem, 1 << 20));
    let ev = |i: u32| NewEvent::new("a", EventType::Evidence, format!("e{i}"));
    s.append("r", ev(0), Durability::Sync).unwrap();
    mem.fail_syncs(1);
    let results: Vec<Result<u64, String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..6)
            .map(|t| {
                let s = s.clone();
                sc.spawn(move || {
                    (0..10)
                        .map(|i| {
                            s.append("r", ev(t * 100 + i), Durability::Sync)
                                .map(|e| e.seq)
                                .map_err(|e| e.to_string())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert!(
        results.iter().any(Result::is_err),
        "the injected failure was seen"
    );
    let err = s.append("r", ev(999), Durability::Sync).unwrap_err();
    assert!(err.to_string().contains("poison"), "{err}");
    drop(s);
    mem.crash(|_, _| 0);
    let s = store(&mem, 1 << 20);
    // `SYNCED` itself is never fsynced, so what survives is read as written.
    let after: HashSet<u64> = seqs(&s, "r", Visibility::Written).into_iter().collect();
    for q in results.iter().filter_map(|r| r.as_ref().ok()) {
        assert!(after.contains(q), "acknowledged seq {q} lost");
    }
}

/// A store past its open-runs bound lets a writer go only when dropping it cannot
/// fsync: a writer holding `batch` data whose flush then failed was dropped poisoned,
/// and the writer opened next for the run acknowledged appends after the failure.
#[test]
fn a_writer_let_go_with_batch_data_keeps_its_poison() {
    let mem = MemStorage::new();
    let s = Store::open_with(
        Arc::new(mem.clone()),
        Path::new("/data"),
        LogOptions {
            // No background flush during the test: the batch data waits for one.
            batch_interval_ms: 600_000,
            ..LogOptions::default()
        },
    )
    .unwrap()
    .with_open_runs_max(1);
    let ev = |i: u32| NewEvent::new("a", EventType::Evidence, format!("e{i}"));
    s.append("r2", ev(0), Durability::Sync).unwrap();
    s.append("r1", ev(1), Durability::Sync).unwrap();
    // Acknowledged, not yet fsynced.
    s.append("r1", ev(2), Durability::Batch).unwrap();
    mem.fail_syncs(1);
    // Meeting r2 again puts r1's writer over the bound.
    s.append("r2", ev(3), Durability::None).unwrap();
    // Whichever fsync took the failure, this process must not acknowledge r1's
    // appends after it (the batch data it covered may be gone from the page cache).
    let flushed = s.append("r1", ev(4), Durability::Sync);
    assert!(
        matches!(
            flushed,
            Err(crate::error::Error::Poisoned(_)) | Err(crate::error::Error::Io { .. })
        ),
        "an fsync of r1 failed in this process, yet r1 acknowledged: {flushed:?}"
    );
    let again = s.append("r1", ev(5), Durability::Sync);
    assert!(
        matches!(again, Err(crate::error::Error::Poisoned(_))),
        "r1 not poisoned after its failed fsync: {again:?}"
    );
}
