//! The vector cache: [`Cached`] wraps any [`Embedder`] and keeps every vector it computed
//! in a file, by the BLAKE3 hash of the text, so that a text is embedded once per model.
//!
//! One file per model id under the directory the caller gives (the CLI's is
//! `<data dir>/.vectors/<user>/`, shared by `swarm synth` and `swarm search`: a directory
//! per user keeps one user's vectors out of another's files):
//! `<id, sanitised>-<blake3(id), 8 hex>.vec`. A different model (another name or other
//! weights) never reads another model's vectors.
//!
//! File format (little-endian):
//!
//! | bytes | content |
//! |---|---|
//! | 0..8 | magic `SWVECS01` (format version 1) |
//! | 8..12 | `dim`, u32 |
//! | 12..14 | length `n` of the model id, u16 |
//! | 14..14+n | the model id, UTF-8 |
//! | then 4 | CRC-32 (`crc32fast`) of the bytes above |
//! | then, repeated | a record: 32-byte BLAKE3 hash of the text, `dim` f32 values, CRC-32 of both |
//!
//! Records have one fixed size, so a crash mid-append leaves a tail shorter than a record
//! (or a full one whose CRC fails): it is cut at the next open, silently. A record whose
//! CRC fails before the last one (damage, not a crash) drops it and everything after it,
//! with a warning: it is a cache, the vectors are computed again. A header that does not
//! match (another format, id or dimension) empties the file, with a warning.
//!
//! **Invariant:** only whole records are appended, under an exclusive `flock` of the file
//! (`std::fs::File::lock`), after cutting any torn tail left by a crashed process; several
//! processes may share one cache file. New vectors are durable after [`Cached::flush`]
//! (write + `fdatasync`); dropping a `Cached` flushes too, best effort.
//!
//! **Memory:** only the index (key -> record number, about 50 bytes a vector) is held;
//! a vector found in the file is read from it when asked for (`pread`, one record, its
//! key and CRC checked again: a record another process cut or that was damaged since is
//! computed again). Vectors computed by this process stay in memory until
//! [`Cached::flush`] writes them, which an embedding call does itself once
//! [`PENDING_VECTORS_MAX`] are waiting. So a long-lived process (`swarm serve`) or a synth over
//! a large cache does not hold the cache's vectors (up to the 2 GiB cap) in memory.
//!
//! **Limit:** the file never grows past [`Cached::with_limit`] bytes (default
//! [`CACHE_BYTES_MAX_DEFAULT`], 2 GiB). Past it, new vectors are still computed and kept
//! for this process, but no longer written, and one warning says so: a full cache slows
//! later runs down, it never fails them.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::embed::Embedder;
use crate::error::{Error, IoContext, Result};

/// Texts sent to the wrapped model per call.
pub const EMBED_BATCH_TEXTS: usize = 64;

/// Default cap on one cache file.
pub const CACHE_BYTES_MAX_DEFAULT: u64 = 2 << 30;

/// Computed vectors held before an embedding call writes them out itself (one flush,
/// one `fdatasync`): bounds the memory of a long cold run (6 MiB at 384 dimensions).
pub const PENDING_VECTORS_MAX: usize = 4096;

const MAGIC: &[u8; 8] = b"SWVECS01";
const KEY_BYTES: usize = 32;
const ID_BYTES_MAX: usize = 1024;
const DIM_MAX: usize = 65_536;

type Key = [u8; KEY_BYTES];

/// What a [`Cached`] did since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// Texts whose vector came from the cache (file or memory).
    pub hits: u64,
    /// Texts that were not in the cache.
    pub misses: u64,
    /// Distinct texts sent to the model (misses less repeats within one call).
    pub embedded: u64,
    /// Vectors read from the file at open.
    pub loaded: u64,
    /// Vectors written to the file by [`Cached::flush`].
    pub written: u64,
}

/// Where a cached vector is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Loc {
    /// Record `n` of the file (0: the first after the header), read when asked for.
    File(u64),
    /// `Inner::mem[n * dim..]`: computed by this process, not (yet) in the file.
    Mem(usize),
}

struct Inner {
    /// Key -> where its vector is. Only the index stays in memory (about 50 bytes a
    /// vector): the vectors of the file are read from it when asked for, so a process's
    /// memory does not grow with the cache file (up to 2 GiB).
    index: HashMap<Key, Loc>,
    /// The vectors computed since the last flush (or since the file filled up), end to
    /// end.
    mem: Vec<f32>,
    /// Keys computed since the last flush, in order.
    pending: Vec<Key>,
    /// Set once the size cap was reached: nothing more is written.
    full: bool,
}

/// A caching [`Embedder`]: see the module doc.
pub struct Cached {
    inner_model: Arc<dyn Embedder>,
    path: PathBuf,
    file: File,
    header_bytes: u64,
    bytes_max: u64,
    state: Mutex<Inner>,
    hits: AtomicU64,
    misses: AtomicU64,
    embedded: AtomicU64,
    loaded: u64,
    written: AtomicU64,
    /// A record read back from the file failed its check (said once).
    warned: std::sync::atomic::AtomicBool,
}

/// The folder under the data dir that holds the vector caches (a dot name: no user id
/// starts with a dot).
pub const VECTORS_DIR: &str = ".vectors";

/// The directory of `user`'s vector caches, `<data_dir>/.vectors/<user>/`: shared by the
/// CLI's `swarm synth` and `swarm search`, `swarm mcp` and `swarm serve`, never by two
/// users. `user` must be a checked user id (no `/`, no leading `.`).
pub fn user_dir(data_dir: &Path, user: &str) -> PathBuf {
    data_dir.join(VECTORS_DIR).join(user)
}

/// The cache file of model `id` under `dir`.
pub fn cache_file(dir: &Path, id: &str) -> PathBuf {
    let safe: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '@') {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    let h = blake3::hash(id.as_bytes()).to_hex();
    dir.join(format!("{safe}-{}.vec", &h[..8]))
}

fn header(id: &str, dim: usize) -> Vec<u8> {
    let mut h = Vec::with_capacity(18 + id.len());
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&(dim as u32).to_le_bytes());
    h.extend_from_slice(&(id.len() as u16).to_le_bytes());
    h.extend_from_slice(id.as_bytes());
    let crc = crc32fast::hash(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h
}

fn record(key: &Key, v: &[f32]) -> Vec<u8> {
    let mut r = Vec::with_capacity(KEY_BYTES + 4 * v.len() + 4);
    r.extend_from_slice(key);
    for x in v {
        r.extend_from_slice(&x.to_le_bytes());
    }
    let crc = crc32fast::hash(&r);
    r.extend_from_slice(&crc.to_le_bytes());
    r
}

fn key(text: &str) -> Key {
    *blake3::hash(text.as_bytes()).as_bytes()
}

impl Cached {
    /// Opens (or creates) the cache of `model`'s vectors under `dir`, reading the vectors
    /// already there and cutting a torn tail (see the module doc).
    pub fn open(model: Arc<dyn Embedder>, dir: &Path) -> Result<Cached> {
        let id = model.id().to_string();
        let dim = model.dim();
        if id.len() > ID_BYTES_MAX || dim == 0 || dim > DIM_MAX {
            return Err(Error::invalid(
                "embed model",
                format!("model id of {} bytes or {dim} dimensions", id.len()),
            ));
        }
        // The vectors say something about the user's texts: 0700 / 0600, like the logs.
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .ctx("create vector cache dir", dir)?;
        let path = cache_file(dir, &id);
        let mut file = OpenOptions::new()
            .mode(0o600)
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .ctx("open vector cache", &path)?;
        file.lock().ctx("lock vector cache", &path)?;
        let head = header(&id, dim);
        let loaded = Self::read_all(&mut file, &path, &head, dim);
        let unlocked = file.unlock().ctx("unlock vector cache", &path);
        let index = loaded?;
        unlocked?;
        let loaded = index.len() as u64;
        Ok(Cached {
            inner_model: model,
            path,
            file,
            header_bytes: head.len() as u64,
            bytes_max: CACHE_BYTES_MAX_DEFAULT,
            state: Mutex::new(Inner {
                index,
                mem: Vec::new(),
                pending: Vec::new(),
                full: false,
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            embedded: AtomicU64::new(0),
            loaded,
            written: AtomicU64::new(0),
            warned: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Caps the cache file at `bytes` (see the module doc's limit).
    pub fn with_limit(mut self, bytes: u64) -> Cached {
        self.bytes_max = bytes;
        self
    }

    /// The cache file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What this cache did so far.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            embedded: self.embedded.load(Ordering::Relaxed),
            loaded: self.loaded,
            written: self.written.load(Ordering::Relaxed),
        }
    }

    /// Reads the header and checks every whole record (the file is locked), keeping the
    /// index of their keys; rewrites the header of an empty or mismatched file and cuts
    /// what follows the last good record.
    fn read_all(
        file: &mut File,
        path: &Path,
        head: &[u8],
        dim: usize,
    ) -> Result<HashMap<Key, Loc>> {
        let len = file.metadata().ctx("stat vector cache", path)?.len();
        let mut found = vec![0u8; head.len()];
        let mut r = BufReader::with_capacity(1 << 20, &mut *file);
        let header_ok =
            len >= head.len() as u64 && r.read_exact(&mut found).is_ok() && found == head;
        let mut index = HashMap::new();
        if !header_ok {
            drop(r);
            if len > 0 {
                tracing::warn!(
                    path = %path.display(),
                    "vector cache header does not match this model or format: emptied (the vectors are computed again)"
                );
            }
            file.set_len(0).ctx("truncate vector cache", path)?;
            file.seek(SeekFrom::Start(0))
                .ctx("seek vector cache", path)?;
            file.write_all(head).ctx("write vector cache", path)?;
            file.sync_data().ctx("sync vector cache", path)?;
            return Ok(index);
        }
        let rec = KEY_BYTES + 4 * dim + 4;
        let body = len - head.len() as u64;
        let whole = body / rec as u64;
        let mut buf = vec![0u8; rec];
        let mut good = 0u64;
        while good < whole {
            r.read_exact(&mut buf).ctx("read vector cache", path)?;
            let crc = u32::from_le_bytes(buf[rec - 4..].try_into().unwrap_or_default());
            if crc32fast::hash(&buf[..rec - 4]) != crc {
                break;
            }
            let mut k = [0u8; KEY_BYTES];
            k.copy_from_slice(&buf[..KEY_BYTES]);
            index.insert(k, Loc::File(good));
            good += 1;
        }
        drop(r);
        let keep = head.len() as u64 + good * rec as u64;
        if keep < len {
            if good + 1 < whole {
                tracing::warn!(
                    path = %path.display(),
                    offset = keep,
                    dropped = whole - good,
                    "damaged record in the vector cache: it and the records after it are dropped (the vectors are computed again)"
                );
            } else {
                tracing::debug!(path = %path.display(), offset = keep, "torn tail of the vector cache cut");
            }
            file.set_len(keep).ctx("truncate vector cache", path)?;
        }
        Ok(index)
    }

    /// The vector of record `n` of the file, if it is still there, whole, and `key`'s;
    /// `None` (said once) when another process cut the file or it was damaged since it
    /// was opened: the vector is then computed again.
    fn read_record(&self, n: u64, key: &Key, dim: usize) -> Option<Vec<f32>> {
        use std::os::unix::fs::FileExt;
        let rec = KEY_BYTES + 4 * dim + 4;
        let mut buf = vec![0u8; rec];
        let at = self.header_bytes + n * rec as u64;
        let ok = self.file.read_exact_at(&mut buf, at).is_ok()
            && buf[..KEY_BYTES] == key[..]
            && crc32fast::hash(&buf[..rec - 4]).to_le_bytes() == buf[rec - 4..];
        if !ok {
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    path = %self.path.display(),
                    offset = at,
                    "a vector cache record changed since the file was opened: computed again"
                );
            }
            return None;
        }
        Some(
            buf[KEY_BYTES..rec - 4]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        )
    }

    fn state(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves a consistent map (inserts are whole).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the vectors computed since the last flush and syncs them (one `fdatasync`);
    /// returns how many were written. Under the file's exclusive lock, so concurrent
    /// processes append whole records.
    pub fn flush(&self) -> Result<usize> {
        let mut st = self.state();
        if st.pending.is_empty() || st.full {
            st.pending.clear();
            return Ok(0);
        }
        let dim = self.inner_model.dim();
        let rec = (KEY_BYTES + 4 * dim + 4) as u64;
        let mut bytes = Vec::with_capacity(st.pending.len() * rec as usize);
        let mut keys: Vec<Key> = Vec::with_capacity(st.pending.len());
        for k in &st.pending {
            if let Some(&Loc::Mem(at)) = st.index.get(k) {
                bytes.extend_from_slice(&record(k, &st.mem[at * dim..(at + 1) * dim]));
                keys.push(*k);
            }
        }
        let n = bytes.len() as u64 / rec;
        let path = &self.path;
        let mut file = &self.file;
        file.lock().ctx("lock vector cache", path)?;
        let res = (|| -> Result<Option<u64>> {
            let len = file.metadata().ctx("stat vector cache", path)?.len();
            // Cut a torn tail another process left (no writer is active: we hold the lock).
            let whole = self.header_bytes + (len.saturating_sub(self.header_bytes) / rec) * rec;
            if whole + bytes.len() as u64 > self.bytes_max {
                return Ok(None);
            }
            if whole != len {
                file.set_len(whole).ctx("truncate vector cache", path)?;
            }
            file.seek(SeekFrom::Start(whole))
                .ctx("seek vector cache", path)?;
            file.write_all(&bytes).ctx("write vector cache", path)?;
            file.sync_data().ctx("sync vector cache", path)?;
            Ok(Some((whole - self.header_bytes) / rec))
        })();
        let unlocked = file.unlock().ctx("unlock vector cache", path);
        let wrote = res?;
        unlocked?;
        st.pending.clear();
        if let Some(first) = wrote {
            // Written and synced: from now on read from the file, and out of memory (every
            // vector in memory was pending: nothing is kept in memory alone until the file
            // is full).
            for (j, k) in keys.iter().enumerate() {
                st.index.insert(*k, Loc::File(first + j as u64));
            }
            st.mem = Vec::new();
        }
        if wrote.is_none() {
            st.full = true;
            tracing::warn!(
                path = %path.display(),
                bytes_max = self.bytes_max,
                "vector cache is full: new vectors are no longer cached (remove the file to start it again)"
            );
            return Ok(0);
        }
        self.written.fetch_add(n, Ordering::Relaxed);
        Ok(n as usize)
    }
}

impl Embedder for Cached {
    fn id(&self) -> &str {
        self.inner_model.id()
    }

    fn dim(&self) -> usize {
        self.inner_model.dim()
    }

    /// Vectors from the cache (memory, or read from the file); the rest from the
    /// wrapped model in batches of [`EMBED_BATCH_TEXTS`] (each distinct text once), then
    /// kept.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let dim = self.dim();
        let keys: Vec<Key> = texts.iter().map(|t| key(t)).collect();
        let mut out: Vec<Option<Vec<f32>>> = vec![None; keys.len()];
        // In-memory vectors are copied under the lock (a flush moves them to the file);
        // file records are read after it.
        let mut in_file: Vec<(usize, u64)> = Vec::new();
        {
            let st = self.state();
            for (i, k) in keys.iter().enumerate() {
                match st.index.get(k) {
                    Some(Loc::Mem(at)) => out[i] = Some(st.mem[at * dim..(at + 1) * dim].to_vec()),
                    Some(Loc::File(n)) => in_file.push((i, *n)),
                    None => {}
                }
            }
        }
        for (i, n) in in_file {
            out[i] = self.read_record(n, &keys[i], dim);
        }
        let mut todo: Vec<(Key, &str)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for ((k, t), v) in keys.iter().zip(texts).zip(&out) {
            if v.is_some() {
                self.hits.fetch_add(1, Ordering::Relaxed);
            } else {
                self.misses.fetch_add(1, Ordering::Relaxed);
                if seen.insert(*k) {
                    todo.push((*k, *t));
                }
            }
        }
        // The model runs without the lock, so other threads' hits are not held up.
        let mut fresh: HashMap<Key, Vec<f32>> = HashMap::with_capacity(todo.len());
        for chunk in todo.chunks(EMBED_BATCH_TEXTS) {
            let batch: Vec<&str> = chunk.iter().map(|(_, t)| *t).collect();
            let vs = self.inner_model.embed(&batch)?;
            if vs.len() != batch.len() || vs.iter().any(|v| v.len() != dim) {
                return Err(Error::invalid(
                    "embed model",
                    format!("{} returned vectors of the wrong count or size", self.id()),
                ));
            }
            self.embedded
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            let mut st = self.state();
            for ((k, _), v) in chunk.iter().zip(vs) {
                if !matches!(st.index.get(k), Some(Loc::Mem(_))) {
                    let at = st.mem.len() / dim;
                    st.mem.extend_from_slice(&v);
                    st.index.insert(*k, Loc::Mem(at));
                    st.pending.push(*k);
                }
                fresh.insert(*k, v);
            }
        }
        if self.state().pending.len() >= PENDING_VECTORS_MAX {
            // A cache: a failed write costs time later, never this call's answer (the
            // vectors stay pending and the next flush tries again).
            if let Err(e) = self.flush() {
                tracing::warn!(path = %self.path.display(), "vector cache not flushed: {e}");
            }
        }
        keys.iter()
            .zip(out)
            .map(|(k, v)| match v {
                Some(v) => Ok(v),
                None => fresh
                    .get(k)
                    .cloned()
                    .ok_or_else(|| Error::invalid("embed model", "vector missing after embedding")),
            })
            .collect()
    }
}

impl Drop for Cached {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::warn!(path = %self.path.display(), "vector cache not flushed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embed::Table;
    use std::sync::atomic::AtomicUsize;

    /// A [`Table`] that counts the texts it is asked for.
    struct Counting {
        table: Table,
        calls: AtomicUsize,
        texts: AtomicUsize,
    }

    impl Embedder for Counting {
        fn id(&self) -> &str {
            self.table.id()
        }
        fn dim(&self) -> usize {
            self.table.dim()
        }
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            self.texts.fetch_add(texts.len(), Ordering::Relaxed);
            self.table.embed(texts)
        }
    }

    fn counting(id: &str, n: usize) -> Arc<Counting> {
        let mut table = Table::new(id, 3);
        for i in 0..n {
            table
                .insert(&format!("text {i}"), vec![i as f32 + 1.0, 2.0, -(i as f32)])
                .unwrap();
        }
        Arc::new(Counting {
            table,
            calls: AtomicUsize::new(0),
            texts: AtomicUsize::new(0),
        })
    }

    fn texts(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("text {i}")).collect()
    }

    #[test]
    fn hits_do_not_call_the_model_and_reopen_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let model = counting("m@1", 100);
        let owned = texts(100);
        let all: Vec<&str> = owned.iter().map(String::as_str).collect();
        let c = Cached::open(model.clone(), dir.path()).unwrap();
        let first = c.embed(&all[..70]).unwrap();
        assert_eq!(model.texts.load(Ordering::Relaxed), 70);
        assert_eq!(model.calls.load(Ordering::Relaxed), 2); // 64 + 6
        let again = c.embed(&all[..70]).unwrap();
        assert_eq!(first, again);
        assert_eq!(model.texts.load(Ordering::Relaxed), 70);
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.embedded), (70, 70, 70));
        assert_eq!(c.flush().unwrap(), 70);
        drop(c);

        let c = Cached::open(model.clone(), dir.path()).unwrap();
        assert_eq!(c.stats().loaded, 70);
        let v = c.embed(&all).unwrap();
        assert_eq!(&v[..70], &first[..]);
        assert_eq!(model.texts.load(Ordering::Relaxed), 100);
        assert_eq!(v, model.table.embed(&all).unwrap());
        // Repeats inside one call are embedded once.
        let c2 = Cached::open(counting("m@2", 3), dir.path()).unwrap();
        c2.embed(&["text 1", "text 1", "text 2"]).unwrap();
        assert_eq!(c2.stats().embedded, 2);
    }

    /// Vectors in the file are read from it when asked for, not held: a flush leaves
    /// nothing in memory, and a record damaged after the cache opened is computed again
    /// (right), the others still read.
    #[test]
    fn file_vectors_are_read_when_asked_and_a_changed_record_is_computed_again() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let model = counting("m@1", 10);
        let owned = texts(10);
        let all: Vec<&str> = owned.iter().map(String::as_str).collect();
        let c = Cached::open(model.clone(), dir.path()).unwrap();
        let first = c.embed(&all).unwrap();
        assert_eq!(c.state().mem.len(), 30);
        assert_eq!(c.flush().unwrap(), 10);
        assert!(
            c.state().mem.is_empty(),
            "flushed vectors are read from the file"
        );
        assert_eq!(c.embed(&all).unwrap(), first);
        assert_eq!(model.texts.load(Ordering::Relaxed), 10);
        // Damage the floats of record 4 ("text 4") behind the cache's back.
        let rec = (KEY_BYTES + 4 * 3 + 4) as u64;
        let f = OpenOptions::new().write(true).open(c.path()).unwrap();
        f.write_all_at(&[0xff; 4], c.header_bytes + 4 * rec + 40)
            .unwrap();
        assert_eq!(c.embed(&all).unwrap(), first);
        assert_eq!(
            model.texts.load(Ordering::Relaxed),
            11,
            "only the damaged record is computed again"
        );
    }

    /// A long cold run does not pile vectors up in memory: a call that leaves
    /// `PENDING_VECTORS_MAX` of them waiting writes them out itself.
    #[test]
    fn many_new_vectors_are_written_out_by_the_call_that_computed_them() {
        let dir = tempfile::tempdir().unwrap();
        let n = PENDING_VECTORS_MAX + 10;
        let model = counting("m@1", n);
        let owned = texts(n);
        let all: Vec<&str> = owned.iter().map(String::as_str).collect();
        let c = Cached::open(model.clone(), dir.path()).unwrap();
        assert_eq!(c.embed(&all[..10]).unwrap().len(), 10);
        assert_eq!(c.stats().written, 0);
        let v = c.embed(&all).unwrap();
        assert_eq!(v, model.table.embed(&all).unwrap());
        assert_eq!(c.stats().written, n as u64);
        assert!(c.state().mem.is_empty());
        assert_eq!(c.embed(&all).unwrap(), v);
    }

    #[test]
    fn torn_tail_is_dropped_and_damage_drops_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let model = counting("m@1", 10);
        let owned = texts(10);
        let all: Vec<&str> = owned.iter().map(String::as_str).collect();
        let c = Cached::open(model.clone(), dir.path()).unwrap();
        c.embed(&all).unwrap();
        c.flush().unwrap();
        let path = c.path().to_path_buf();
        drop(c);
        let len = fs::metadata(&path).unwrap().len();
        let rec = (KEY_BYTES + 4 * 3 + 4) as u64;
        // A torn tail: half of the last record.
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len - rec / 2).unwrap();
        drop(f);
        let c = Cached::open(model.clone(), dir.path()).unwrap();
        assert_eq!(c.stats().loaded, 9);
        assert_eq!(fs::metadata(&path).unwrap().len(), len - rec);
        c.embed(&all).unwrap();
        assert_eq!(c.stats().embedded, 1);
        c.flush().unwrap();
        drop(c);
        assert_eq!(fs::metadata(&path).unwrap().len(), len);
        // A flipped bit in the 4th record: it and the rest are dropped.
        let mut bytes = fs::read(&path).unwrap();
        let head = len - 10 * rec;
        bytes[(head + 3 * rec + 40) as usize] ^= 1;
        fs::write(&path, &bytes).unwrap();
        let c = Cached::open(model.clone(), dir.path()).unwrap();
        assert_eq!(c.stats().loaded, 3);
        assert_eq!(fs::metadata(&path).unwrap().len(), head + 3 * rec);
        let v = c.embed(&all).unwrap();
        assert_eq!(v, model.table.embed(&all).unwrap());
    }

    #[test]
    fn another_model_uses_another_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = Cached::open(counting("mini@sha256:aa", 5), dir.path()).unwrap();
        a.embed(&["text 1"]).unwrap();
        a.flush().unwrap();
        let b_model = counting("mini@sha256:bb", 5);
        let b = Cached::open(b_model.clone(), dir.path()).unwrap();
        assert_ne!(a.path(), b.path());
        assert_eq!(b.stats().loaded, 0);
        b.embed(&["text 1"]).unwrap();
        assert_eq!(b_model.texts.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_full_cache_stops_writing_but_still_embeds() {
        let dir = tempfile::tempdir().unwrap();
        let model = counting("m@1", 10);
        let owned = texts(10);
        let all: Vec<&str> = owned.iter().map(String::as_str).collect();
        let c = Cached::open(model.clone(), dir.path())
            .unwrap()
            .with_limit(200);
        c.embed(&all).unwrap();
        assert_eq!(c.flush().unwrap(), 0);
        let len = fs::metadata(c.path()).unwrap().len();
        assert!(len < 200, "{len}");
        assert_eq!(c.embed(&all).unwrap(), model.table.embed(&all).unwrap());
    }
}
