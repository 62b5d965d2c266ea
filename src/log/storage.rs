//! All file I/O of the engine goes through the [`Storage`] trait.
//!
//! The log, the watermark, the run metadata and (later) the index and checkpoints never
//! touch `std::fs` directly: they ask a `Storage` for files. [`FsStorage`] is the real
//! thing (POSIX files, `fdatasync`, `flock(2)` through `std::fs::File::lock`).
//! [`MemStorage`] keeps every file in memory with two images, what was *written* and
//! what was made *durable* by a sync, so tests can simulate a power loss at any moment
//! ([`MemStorage::crash`]) and inject I/O errors ([`MemStorage::fail_syncs`]).
//! A second real backend (an object store, NATS JetStream) plugs in here.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// A file handle from a [`Storage`].
///
/// Reads and writes are positional so one handle can be shared by threads; `append`
/// writes at the current end of the file in one call.
#[allow(clippy::len_without_is_empty)]
pub trait StorageFile: Send + Sync {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (0 at EOF).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Current length of the file in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Truncates or extends the file.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes the file's data durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
    /// Takes the exclusive advisory lock of this file (blocks). Held until `unlock`.
    fn lock(&self) -> io::Result<()>;
    /// Releases the lock taken by `lock` or `lock_shared`.
    fn unlock(&self) -> io::Result<()>;
    /// Takes the shared advisory lock of this file (blocks while anyone holds the
    /// exclusive one; any number may share it). The default takes the exclusive lock:
    /// correct wherever the shared one is only waited on, just less concurrent.
    fn lock_shared(&self) -> io::Result<()> {
        self.lock()
    }
    /// Takes the exclusive advisory lock if nobody holds it; returns whether it did.
    /// Never blocks in the backends of this crate (the index builder uses it so that a
    /// reader never waits for another process's index write); the default, for backends
    /// without a non-blocking lock, waits for `lock`.
    fn try_lock(&self) -> io::Result<bool> {
        self.lock().map(|()| true)
    }

    /// Reads exactly `buf.len()` bytes at `offset`, or fails with `UnexpectedEof`.
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            let n = self.read_at(buf, offset)?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short read"));
            }
            buf = &mut buf[n..];
            offset += n as u64;
        }
        Ok(())
    }
}

/// How to open a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Read only; the file must exist.
    Read,
    /// Read and write; created if missing.
    ReadWriteCreate,
    /// Read and write; the file must not exist yet.
    CreateNew,
}

/// The file system seen by the engine.
pub trait Storage: Send + Sync + 'static {
    /// Opens a file.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>>;
    /// Creates a directory and its parents.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Names of the entries of a directory (not sorted).
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Whether a file or directory exists.
    fn exists(&self, path: &Path) -> bool;
    /// Atomically renames a file.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Removes a directory and everything in it.
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Makes the directory's entries (creations, renames) durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Whether paths name real files of this machine, so that processes can meet at a
    /// Unix socket under the data directory (the append hand-off, `store::handoff`).
    fn is_local_fs(&self) -> bool {
        false
    }
}

/// The real file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct FsStorage;

struct FsFile(File);

impl StorageFile for FsFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        loop {
            match self.0.read_at(buf, offset) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r,
            }
        }
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn lock(&self) -> io::Result<()> {
        self.0.lock()
    }
    fn unlock(&self) -> io::Result<()> {
        self.0.unlock()
    }
    fn lock_shared(&self) -> io::Result<()> {
        self.0.lock_shared()
    }
    fn try_lock(&self) -> io::Result<bool> {
        match self.0.try_lock() {
            Ok(()) => Ok(true),
            Err(std::fs::TryLockError::WouldBlock) => Ok(false),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }
}

impl Storage for FsStorage {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut o = OpenOptions::new();
        // Files the engine creates are the user's alone (0600, before the umask): agents'
        // findings, the shared scope's key.
        o.mode(0o600);
        match mode {
            OpenMode::Read => o.read(true),
            OpenMode::ReadWriteCreate => o.read(true).write(true).create(true),
            OpenMode::CreateNew => o.read(true).write(true).create_new(true),
        };
        Ok(Box::new(FsFile(o.open(path)?)))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        // Directories the engine creates are 0700: one user's runs are not another
        // local account's to read.
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in fs::read_dir(dir)? {
            let e = e?;
            if let Ok(name) = e.file_name().into_string() {
                out.push(name);
            }
        }
        Ok(out)
    }
    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir_all(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }
    fn is_local_fs(&self) -> bool {
        true
    }
}

/// An in-memory file system that models what a power loss keeps.
///
/// Every file has the bytes written so far and the bytes made durable by the last
/// `sync_data`; a directory entry is durable once its parent was `sync_dir`ed.
/// [`MemStorage::crash`] turns the written image into what a power loss could leave:
/// the durable image plus, optionally, a prefix of the bytes written after it.
#[derive(Clone, Default)]
pub struct MemStorage {
    inner: Arc<MemInner>,
}

#[derive(Default)]
struct MemInner {
    fs: Mutex<MemFs>,
    lock_cv: Condvar,
}

#[derive(Default)]
struct MemFs {
    files: HashMap<PathBuf, Arc<Mutex<MemFileData>>>,
    dirs: std::collections::HashSet<PathBuf>,
    locked: std::collections::HashSet<PathBuf>,
    failing_syncs: u32,
    failing_write: Option<FailingWrite>,
    /// Reads of this file fail, so many times ([`MemStorage::fail_next_reads`]).
    failing_reads: Option<(PathBuf, u32)>,
}

/// A `write_all_at` that fails part-way ([`MemStorage::fail_next_write`]).
struct FailingWrite {
    path: PathBuf,
    keep: usize,
    then: Box<dyn FnOnce() + Send>,
}

#[derive(Default)]
struct MemFileData {
    written: Vec<u8>,
    durable: Vec<u8>,
    entry_durable: bool,
}

struct MemFile {
    path: PathBuf,
    data: Arc<Mutex<MemFileData>>,
    storage: MemStorage,
    writable: bool,
}

fn lock_poison_ok<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemStorage {
    /// A new, empty in-memory file system.
    pub fn new() -> MemStorage {
        MemStorage::default()
    }

    /// Simulates a power loss: every file goes back to its durable image, plus the first
    /// `keep(path, unsynced_len)` bytes of what was written after it (a torn write).
    /// Files whose directory entry was never made durable disappear.
    pub fn crash(&self, mut keep: impl FnMut(&Path, usize) -> usize) {
        let mut fs = lock_poison_ok(&self.inner.fs);
        let mut gone = Vec::new();
        for (path, f) in fs.files.iter() {
            let mut d = lock_poison_ok(f);
            if !d.entry_durable {
                gone.push(path.clone());
                continue;
            }
            let durable = d.durable.clone();
            let extra: Vec<u8> =
                if d.written.len() > durable.len() && d.written.starts_with(&durable) {
                    let unsynced = &d.written[durable.len()..];
                    let k = keep(path, unsynced.len()).min(unsynced.len());
                    unsynced[..k].to_vec()
                } else {
                    Vec::new()
                };
            d.written = durable;
            d.written.extend_from_slice(&extra);
        }
        for p in gone {
            fs.files.remove(&p);
        }
        fs.locked.clear();
    }

    /// An independent copy of every file and directory (both images), for tests that try
    /// many crashes from one state.
    pub fn clone_files(&self) -> MemStorage {
        let fs = lock_poison_ok(&self.inner.fs);
        let copy = MemStorage::new();
        {
            let mut c = lock_poison_ok(&copy.inner.fs);
            c.dirs = fs.dirs.clone();
            for (p, f) in fs.files.iter() {
                let d = lock_poison_ok(f);
                c.files.insert(
                    p.clone(),
                    Arc::new(Mutex::new(MemFileData {
                        written: d.written.clone(),
                        durable: d.durable.clone(),
                        entry_durable: d.entry_durable,
                    })),
                );
            }
        }
        copy
    }

    /// Makes the next `n` calls to `sync_data` fail with an I/O error.
    pub fn fail_syncs(&self, n: u32) {
        lock_poison_ok(&self.inner.fs).failing_syncs = n;
    }

    /// Makes the next write of bytes that are not all zeros (a zero fill ahead is let
    /// through) to the file at `path` store only its first `keep` bytes, run `then` (no
    /// lock of this storage held: another process acting in the window), and fail with
    /// an I/O error, as a `pwrite` that fails part-way does.
    pub fn fail_next_write(&self, path: &Path, keep: usize, then: impl FnOnce() + Send + 'static) {
        lock_poison_ok(&self.inner.fs).failing_write = Some(FailingWrite {
            path: path.to_path_buf(),
            keep,
            then: Box::new(then),
        });
    }

    /// Makes the next `n` reads of the file at `path` fail with an I/O error.
    pub fn fail_next_reads(&self, path: &Path, n: u32) {
        lock_poison_ok(&self.inner.fs).failing_reads = Some((path.to_path_buf(), n));
    }

    /// The written bytes of a file (for tests).
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        let fs = lock_poison_ok(&self.inner.fs);
        fs.files
            .get(path)
            .map(|f| lock_poison_ok(f).written.clone())
    }

    /// The written bytes of a file without the zero fill a preallocated segment ends
    /// with: its frames (for tests that rewrite a log).
    pub fn contents_without_fill(&self, path: &Path) -> Option<Vec<u8>> {
        let mut b = self.contents(path)?;
        let end = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
        b.truncate(end);
        Some(b)
    }

    /// Replaces the written bytes of a file (for tests that damage a log).
    pub fn set_contents(&self, path: &Path, bytes: Vec<u8>) {
        let fs = lock_poison_ok(&self.inner.fs);
        if let Some(f) = fs.files.get(path) {
            let mut d = lock_poison_ok(f);
            d.written = bytes.clone();
            d.durable = bytes;
        }
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: not found", path.display()),
    )
}

impl StorageFile for MemFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        {
            let mut fs = lock_poison_ok(&self.storage.inner.fs);
            if let Some((p, n)) = &mut fs.failing_reads {
                if *p == self.path && *n > 0 {
                    *n -= 1;
                    return Err(io::Error::other("injected read failure"));
                }
            }
        }
        let d = lock_poison_ok(&self.data);
        let off = offset as usize;
        if off >= d.written.len() {
            return Ok(0);
        }
        let n = buf.len().min(d.written.len() - off);
        buf[..n].copy_from_slice(&d.written[off..off + n]);
        Ok(n)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "read-only"));
        }
        let failing = {
            let mut fs = lock_poison_ok(&self.storage.inner.fs);
            match fs.failing_write.take() {
                Some(f) if f.path == self.path && buf.iter().any(|&b| b != 0) => Some(f),
                other => {
                    fs.failing_write = other;
                    None
                }
            }
        };
        let buf_all = buf;
        let buf = match &failing {
            Some(f) => &buf[..f.keep.min(buf.len())],
            None => buf,
        };
        {
            let mut d = lock_poison_ok(&self.data);
            let off = offset as usize;
            if d.written.len() < off + buf.len() {
                d.written.resize(off + buf.len(), 0);
            }
            d.written[off..off + buf.len()].copy_from_slice(buf);
        }
        match failing {
            Some(f) => {
                (f.then)();
                Err(io::Error::other(format!(
                    "injected write failure after {} of {} bytes",
                    buf.len(),
                    buf_all.len()
                )))
            }
            None => Ok(()),
        }
    }
    fn len(&self) -> io::Result<u64> {
        Ok(lock_poison_ok(&self.data).written.len() as u64)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        lock_poison_ok(&self.data).written.resize(len as usize, 0);
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        {
            let mut fs = lock_poison_ok(&self.storage.inner.fs);
            if fs.failing_syncs > 0 {
                fs.failing_syncs -= 1;
                return Err(io::Error::other("injected fsync failure"));
            }
        }
        let mut d = lock_poison_ok(&self.data);
        d.durable = d.written.clone();
        Ok(())
    }
    fn lock(&self) -> io::Result<()> {
        let mut fs = lock_poison_ok(&self.storage.inner.fs);
        while fs.locked.contains(&self.path) {
            fs = self
                .storage
                .inner
                .lock_cv
                .wait(fs)
                .unwrap_or_else(|e| e.into_inner());
        }
        fs.locked.insert(self.path.clone());
        Ok(())
    }
    fn unlock(&self) -> io::Result<()> {
        let mut fs = lock_poison_ok(&self.storage.inner.fs);
        fs.locked.remove(&self.path);
        self.storage.inner.lock_cv.notify_all();
        Ok(())
    }
    fn try_lock(&self) -> io::Result<bool> {
        let mut fs = lock_poison_ok(&self.storage.inner.fs);
        Ok(fs.locked.insert(self.path.clone()))
    }
}

impl Storage for MemStorage {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let mut fs = lock_poison_ok(&self.inner.fs);
        let parent = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let existing = fs.files.get(path).cloned();
        let data = match (mode, existing) {
            (OpenMode::Read, Some(d)) | (OpenMode::ReadWriteCreate, Some(d)) => d,
            (OpenMode::Read, None) => return Err(not_found(path)),
            (OpenMode::CreateNew, Some(_)) => {
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, "exists"))
            }
            (_, None) => {
                if !fs.dirs.contains(&parent) {
                    return Err(not_found(&parent));
                }
                let d = Arc::new(Mutex::new(MemFileData::default()));
                fs.files.insert(path.to_path_buf(), d.clone());
                d
            }
        };
        Ok(Box::new(MemFile {
            path: path.to_path_buf(),
            data,
            storage: self.clone(),
            writable: mode != OpenMode::Read,
        }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut fs = lock_poison_ok(&self.inner.fs);
        let mut p = Some(path);
        while let Some(d) = p {
            fs.dirs.insert(d.to_path_buf());
            p = d.parent();
        }
        Ok(())
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let fs = lock_poison_ok(&self.inner.fs);
        if !fs.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        let mut out: Vec<String> = Vec::new();
        let names = fs.files.keys().chain(fs.dirs.iter());
        for p in names {
            if p.parent() == Some(dir) {
                if let Some(n) = p.file_name().and_then(|n| n.to_str()) {
                    out.push(n.to_string());
                }
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }
    fn exists(&self, path: &Path) -> bool {
        let fs = lock_poison_ok(&self.inner.fs);
        fs.files.contains_key(path) || fs.dirs.contains(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut fs = lock_poison_ok(&self.inner.fs);
        let f = fs.files.remove(from).ok_or_else(|| not_found(from))?;
        lock_poison_ok(&f).entry_durable = false;
        fs.files.insert(to.to_path_buf(), f);
        Ok(())
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut fs = lock_poison_ok(&self.inner.fs);
        fs.files
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| not_found(path))
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut fs = lock_poison_ok(&self.inner.fs);
        fs.files.retain(|p, _| !p.starts_with(path));
        fs.dirs.retain(|p| !p.starts_with(path));
        Ok(())
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let fs = lock_poison_ok(&self.inner.fs);
        for (p, f) in fs.files.iter() {
            if p.parent() == Some(path) {
                lock_poison_ok(f).entry_durable = true;
            }
        }
        Ok(())
    }
}

/// The length of the file at `path` (opened for reading), with the path in any error.
pub(crate) fn file_len(storage: &dyn Storage, path: &Path) -> crate::error::Result<u64> {
    use crate::error::IoContext;
    let f = storage.open(path, OpenMode::Read).ctx("open", path)?;
    f.len().ctx("stat", path)
}

/// Writes `bytes` as `dir/name` atomically: a temp file, fsynced, renamed into place, the
/// directory fsynced; a failure removes the temp file and leaves any older file alone.
pub(crate) fn write_atomic(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> crate::error::Result<PathBuf> {
    use crate::error::IoContext;
    storage.create_dir_all(dir).ctx("create", dir)?;
    let path = dir.join(name);
    // Unique per process and call: two threads may write the same name at once.
    static TMP_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".{name}.{}.{}.{}.tmp",
        std::process::id(),
        crate::event::ts::Ts::now().0,
        TMP_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let f = storage
        .open(&tmp, OpenMode::CreateNew)
        .ctx("create", &tmp)?;
    let r = (|| {
        f.write_all_at(bytes, 0).ctx("write", &tmp)?;
        f.sync_data().ctx("fsync", &tmp)?;
        storage.rename(&tmp, &path).ctx("rename", &tmp)?;
        storage.sync_dir(dir).ctx("fsync dir", dir)
    })();
    if r.is_err() {
        let _ = storage.remove_file(&tmp);
    }
    r?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_crash_keeps_durable_and_drops_unsynced_entries() {
        let s = MemStorage::new();
        let dir = Path::new("/d");
        s.create_dir_all(dir).unwrap();
        let a = s.open(&dir.join("a"), OpenMode::CreateNew).unwrap();
        a.write_all_at(b"hello", 0).unwrap();
        a.sync_data().unwrap();
        s.sync_dir(dir).unwrap();
        a.write_all_at(b" world", 5).unwrap();
        let b = s.open(&dir.join("b"), OpenMode::CreateNew).unwrap();
        b.write_all_at(b"x", 0).unwrap();
        b.sync_data().unwrap();
        s.crash(|_, _| 2);
        assert_eq!(s.contents(&dir.join("a")).unwrap(), b"hello w");
        assert!(
            s.contents(&dir.join("b")).is_none(),
            "entry never dir-synced"
        );
    }

    #[test]
    fn mem_injected_sync_failure() {
        let s = MemStorage::new();
        s.create_dir_all(Path::new("/d")).unwrap();
        let a = s.open(Path::new("/d/a"), OpenMode::CreateNew).unwrap();
        s.fail_syncs(1);
        assert!(a.sync_data().is_err());
        assert!(a.sync_data().is_ok());
    }

    #[test]
    fn try_lock_does_not_block() {
        for s in [
            Arc::new(MemStorage::new()) as Arc<dyn Storage>,
            Arc::new(FsStorage) as Arc<dyn Storage>,
        ] {
            let dir = tempfile::tempdir().unwrap();
            s.create_dir_all(dir.path()).unwrap();
            let p = dir.path().join("LOCK");
            let a = s.open(&p, OpenMode::ReadWriteCreate).unwrap();
            let b = s.open(&p, OpenMode::ReadWriteCreate).unwrap();
            assert!(a.try_lock().unwrap());
            assert!(
                !b.try_lock().unwrap(),
                "second handle must not get the lock"
            );
            a.unlock().unwrap();
            assert!(b.try_lock().unwrap());
            b.unlock().unwrap();
        }
    }
}
