//! A log cut at every byte offset: exactly the whole-frame prefix comes back, the rest is
//! a torn tail (not corruption), and the next append repairs it and continues the seqs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use swarm_memory::log::storage::OpenMode;
use swarm_memory::{
    Durability, Event, FsStorage, LogOptions, MemStorage, ReadOptions, Storage, Store, Visibility,
};

use crate::util::{frame_boundaries, lib_read, new_ev, Env};

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

fn broken_files(s: &dyn Storage, dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = s
        .list(dir)
        .expect("list")
        .into_iter()
        .filter(|n| n.ends_with(".broken"))
        .map(|n| dir.join(n))
        .collect();
    v.sort();
    v
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

/// Cuts the run's only segment at every offset (or those `pick` selects), and checks
/// reads, `verify`, and the repairing append. With `mem`, also simulates a power loss
/// right after that append: a `sync`-acknowledged event must survive it.
fn sweep(storage: Arc<dyn Storage>, root: &Path, mem: Option<&MemStorage>) {
    let run = "cut";
    let dir = root.join("anonymous").join(run);
    let open = || Store::open_with(storage.clone(), root, LogOptions::default()).unwrap();
    let all = build(&open(), run);
    assert_eq!(all.len(), 7);
    let seg = dir.join("seg-00000000000000000001.jsonl");
    let synced = dir.join("SYNCED");
    let bytes = read_file(&*storage, &seg);
    let synced_bytes = read_file(&*storage, &synced);
    let bounds = frame_boundaries(&bytes);
    assert_eq!(bounds.len(), 6, "five frames");
    assert_eq!(*bounds.last().unwrap(), bytes.len());
    let events_before = [0usize, 1, 2, 5, 6, 7];
    for cut in 0..=bytes.len() {
        for b in broken_files(&*storage, &dir) {
            storage.remove_file(&b).unwrap();
        }
        write_file(&*storage, &seg, &bytes[..cut]);
        write_file(&*storage, &synced, &synced_bytes);
        let frames = bounds.iter().rposition(|&b| b <= cut).unwrap();
        let whole_end = bounds[frames];
        let k = events_before[frames];
        let store = open();
        assert_eq!(lib_read(&store, run), all[..k], "read after a cut at {cut}");
        let rep = store.verify(run, |_| {}).unwrap();
        assert!(rep.ok, "cut at {cut}: {rep:?}");
        assert_eq!(rep.records, k as u64, "cut at {cut}");
        match &rep.torn_tail {
            None => assert_eq!(cut, whole_end, "cut at {cut}: torn tail not reported"),
            Some(t) => {
                assert_eq!(
                    (t.offset, t.bytes),
                    (whole_end as u64, (cut - whole_end) as u64),
                    "cut at {cut}"
                );
            }
        }
        let new = store
            .append(run, new_ev(None, "after the cut"), Durability::Sync)
            .unwrap_or_else(|e| panic!("append after a cut at {cut}: {e}"));
        assert_eq!(new.seq, k as u64 + 1, "cut at {cut}");
        let broken = broken_files(&*storage, &dir);
        if cut == whole_end {
            assert!(broken.is_empty(), "cut at {cut}: {broken:?}");
        } else {
            assert_eq!(broken.len(), 1, "cut at {cut}");
            assert_eq!(read_file(&*storage, &broken[0]), &bytes[whole_end..cut]);
            assert!(broken[0]
                .to_string_lossy()
                .contains(&format!(".{whole_end}.")));
        }
        let mut want = all[..k].to_vec();
        want.push(new.clone());
        assert_eq!(
            lib_read(&store, run),
            want,
            "read after the repair, cut {cut}"
        );
        let rep = store.verify(run, |_| {}).unwrap();
        assert!(rep.ok && rep.torn_tail.is_none(), "cut at {cut}: {rep:?}");
        drop(store);
        if let Some(mem) = mem {
            // Everything written, durable or not: after a power loss the watermark file
            // itself may be gone, which hides records until the next append.
            mem.crash(|_, _| 0);
            let written: Vec<Event> = open()
                .read(
                    run,
                    ReadOptions {
                        visibility: Visibility::Written,
                        ..ReadOptions::default()
                    },
                )
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert_eq!(
                written, want,
                "cut at {cut}: a sync-acknowledged append did not survive a power loss"
            );
        }
    }
}

#[test]
fn every_offset_real_files() {
    let env = Env::fast();
    sweep(Arc::new(FsStorage), env.path(), None);
}

#[test]
fn every_offset_mem_with_power_loss() {
    let mem = MemStorage::new();
    sweep(Arc::new(mem.clone()), Path::new("/data"), Some(&mem));
}

/// A few cuts through the CLI: mid-header, mid-payload, the final newline missing, and
/// a cut at a frame boundary.
#[test]
fn cli_cuts() {
    let env = Env::new();
    let run = "cut";
    let store = env.store();
    let all = build(&store, run);
    drop(store);
    let seg = env.segments(run).remove(0);
    let bytes = std::fs::read(&seg).unwrap();
    let bounds = frame_boundaries(&bytes);
    let synced = std::fs::read(env.run_dir(run).join("SYNCED")).unwrap();
    // (cut, whole frames before it, events in them)
    let cuts = [
        (bounds[1] + 20, 1, 1),
        (bounds[3] + 100, 3, 5),
        (bounds[5] - 1, 4, 6),
        (bounds[2], 2, 2),
    ];
    for (cut, frames, k) in cuts {
        for b in env.broken_files(run) {
            std::fs::remove_file(b).unwrap();
        }
        std::fs::write(&seg, &bytes[..cut]).unwrap();
        std::fs::write(env.run_dir(run).join("SYNCED"), &synced).unwrap();
        assert_eq!(env.read(run), all[..k], "cut at {cut}");
        let (code, rep) = env.verify(run);
        assert_eq!(code, 0, "cut at {cut}: {rep}");
        if cut == bounds[frames] {
            assert!(rep["torn_tail"].is_null(), "{rep}");
        } else {
            assert_eq!(rep["torn_tail"]["offset"], bounds[frames], "{rep}");
            assert_eq!(rep["torn_tail"]["bytes"], cut - bounds[frames], "{rep}");
        }
        let ev = env
            .swarm(&[
                "append",
                "--run",
                run,
                "--agent",
                "a",
                "--type",
                "evidence",
                "--content",
                "after the cut",
            ])
            .ok()
            .events();
        assert_eq!(ev[0].seq, k as u64 + 1);
        assert_eq!(
            env.broken_files(run).len(),
            usize::from(cut != bounds[frames])
        );
        let got = env.check_run(run);
        assert_eq!(got[..k], all[..k]);
    }
}
