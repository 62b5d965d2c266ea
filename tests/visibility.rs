//! The visibility rule: in `sync` mode a reader is never shown a record that a power
//! loss could still take away; and a group fsync never covers bytes that a later repair
//! may cut.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use swarm_memory::log::frame;
use swarm_memory::log::storage::{OpenMode, StorageFile};
use swarm_memory::{Durability, Event, LogOptions, MemStorage, Storage, Store};

use crate::util::{lib_append, lib_read, new_ev, Env};

fn written(store: &Store, run: &str) -> Vec<Event> {
    crate::util::lib_read_written(store, run)
}

/// The frame a `sync`-mode writer that died between its write and its fsync leaves
/// behind: whole and valid, but not covered by `SYNCED`.
fn orphan_frame(after: &Event) -> (Event, Vec<u8>) {
    let mut e = after.clone();
    e.seq += 1;
    e.id = "orphan".into();
    e.content = "written, never synced".into();
    let payload = serde_json::to_vec(&vec![&e]).unwrap();
    let mut bytes = Vec::new();
    frame::encode(&payload, &mut bytes);
    (e, bytes)
}

#[test]
fn unsynced_record_is_invisible_until_a_sync_covers_it() {
    let mem = MemStorage::new();
    let root = Path::new("/data");
    let run = "vis";
    let open = || Store::open_with(Arc::new(mem.clone()), root, LogOptions::default()).unwrap();
    let store = open();
    let e1 = lib_append(&store, run, "one");
    let e2 = lib_append(&store, run, "two");
    let (orphan, bytes) = orphan_frame(&e2);
    let seg = root
        .join("anonymous")
        .join(run)
        .join("seg-00000000000000000001.jsonl");
    let f = mem.open(&seg, OpenMode::ReadWriteCreate).unwrap();
    f.write_all_at(&bytes, frames_end(&*f)).unwrap();

    let reader = open();
    assert_eq!(lib_read(&reader, run), [e1.clone(), e2.clone()]);
    let rep = reader.verify(run, |_| {}).unwrap();
    assert!(rep.ok, "{rep:?}");
    assert_eq!((rep.records, rep.unsynced_records), (3, 1), "{rep:?}");
    assert_eq!(written(&reader, run).len(), 3);

    // A power loss now may take the orphan away, and that is allowed: nobody saw it.
    // The next sync-mode append (the same process here) covers it with its fsync.
    let e4 = lib_append(&store, run, "four");
    assert_eq!(e4.seq, 4);
    let all = vec![e1, e2, orphan, e4];
    assert_eq!(lib_read(&reader, run), all);
    assert_eq!(reader.verify(run, |_| {}).unwrap().unsynced_records, 0);
    drop((store, reader));
    mem.crash(|_, _| 0);
    assert_eq!(written(&open(), run), all);
}

#[test]
fn unsynced_record_is_invisible_cli() {
    let env = Env::new();
    let run = "vis";
    let store = env.store();
    lib_append(&store, run, "one");
    let e2 = lib_append(&store, run, "two");
    drop(store);
    let (orphan, bytes) = orphan_frame(&e2);
    let seg = env.segments(run).remove(0);
    let mut all = std::fs::read(&seg).unwrap();
    // Written where a writer writes: after the frames, over the preallocated fill.
    let end = all.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    all[end..end + bytes.len()].copy_from_slice(&bytes);
    std::fs::write(&seg, all).unwrap();
    assert_eq!(env.read(run).len(), 2);
    let (code, rep) = env.verify(run);
    assert_eq!(code, 0);
    assert_eq!(rep["unsynced_records"], 1, "{rep}");
    let e = env
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
    assert_eq!(e[0].seq, 4);
    let got = env.check_run(run);
    assert_eq!(got[2], orphan);
}

type Hook = Arc<Mutex<Option<Box<dyn FnOnce() + Send>>>>;

/// A storage that runs a hook when the `SYNCED` lock is taken: the moment a syncer
/// measures the segment before its fsync.
#[derive(Clone)]
struct Hooked {
    mem: MemStorage,
    hook: Hook,
}

struct HookedFile {
    inner: Box<dyn StorageFile>,
    hook: Hook,
}

impl StorageFile for HookedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
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
        let hook = self.hook.lock().unwrap().take();
        if let Some(h) = hook {
            h();
        }
        self.inner.lock()
    }
    fn unlock(&self) -> io::Result<()> {
        self.inner.unlock()
    }
}

impl Storage for Hooked {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let inner = self.mem.open(path, mode)?;
        if path.file_name().is_some_and(|n| n == "SYNCED") {
            return Ok(Box::new(HookedFile {
                inner,
                hook: self.hook.clone(),
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

/// Another process's writer dies mid-`write` (a SIGKILL can cut a large write short)
/// just before our group fsync measures the segment. Its torn bytes must not count as
/// durable: the next append cuts them and writes its own frame over that range, and
/// that frame must get its own fsync before it is acknowledged.
#[test]
fn torn_bytes_of_a_dead_writer_are_never_counted_durable() {
    let mem = MemStorage::new();
    let root = Path::new("/data");
    let run = "torn-at-sync";
    let seg: PathBuf = root
        .join("anonymous")
        .join(run)
        .join("seg-00000000000000000001.jsonl");
    let hook: Hook = Arc::new(Mutex::new(None));
    let storage = Hooked {
        mem: mem.clone(),
        hook: hook.clone(),
    };
    let open = |s: Arc<dyn Storage>| Store::open_with(s, root, LogOptions::default()).unwrap();
    let store = open(Arc::new(storage));
    // The dead writer's frame: a big batch of which only the first 3000 bytes landed.
    let mut big = Vec::new();
    frame::encode(format!("[\"{}\"]", "q".repeat(8000)).as_bytes(), &mut big);
    let m = mem.clone();
    let s = seg.clone();
    *hook.lock().unwrap() = Some(Box::new(move || {
        let f = m.open(&s, OpenMode::ReadWriteCreate).unwrap();
        f.write_all_at(&big[..3000], frames_end(&*f)).unwrap();
    }));
    let e1 = lib_append(&store, run, "one");
    assert!(hook.lock().unwrap().is_none(), "the hook ran");
    let e2 = store
        .append(run, new_ev(None, "two"), Durability::Sync)
        .unwrap();
    assert_eq!(e2.seq, 2);
    assert_eq!(
        lib_read(&store, run),
        [e1.clone(), e2.clone()],
        "a sync-acknowledged event is not visible"
    );
    drop(store);
    mem.crash(|_, _| 0);
    assert_eq!(
        written(&open(Arc::new(mem.clone())), run),
        [e1, e2],
        "a sync-acknowledged event was lost at a power loss"
    );
}

/// Where the next frame of a segment goes: after its frames, before any preallocated fill.
fn frames_end(f: &dyn swarm_memory::log::storage::StorageFile) -> u64 {
    swarm_memory::log::segment::content_end(f, 0, f.len().unwrap()).unwrap()
}
