//! Run lifecycle (seed 000: "archive after run"): close, archive to cold storage, verify,
//! remove from the working set; restore; read an archived run in place.
//!
//! # Archive format (`<archive dir>/<user>/<run>.swarc`)
//! A zstd stream (level 3) of a container: the line `SWARC1\n`, then per file a JSON
//! header line `{"name":"seg-….jsonl","len":N,"crc":"8 hex"}\n` followed by exactly N
//! bytes and a `\n`, then the line `{"end":true,"files":K}\n`. CRC-32 as in frames.
//! Names are the run directory's files (`index/…` for the index) and
//! `checkpoints/<file>` for the newest checkpoint.
//!
//! # Close protocol
//! 1. append `run_closed` (the rules refuse every later append, exit 5);
//! 2. checkpoint the head; 3. write the archive to a temp file, fsync, rename, fsync dir;
//! 4. verify: decompress it, compare every file byte for byte with the working copy, and
//!    open it as a store and `verify` it (all records, same head);
//! 5. write the tombstone `ARCHIVED` (temp, fsync, rename, fsync dir);
//! 6. only then delete the working files (segments, `SYNCED`, index, checkpoints).
//!
//! A crash before 5 leaves the run in the working set, intact (closing again redoes it); a
//! crash after 5 leaves a verified archive that reads are served from.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::event::EventType;
use crate::fold::checkpoint;
use crate::log::storage::{MemStorage, OpenMode, Storage};
use crate::store::Store;

/// Name of the tombstone left in an archived run's directory.
pub const TOMBSTONE: &str = crate::log::meta::ARCHIVED_FILE;
const MAGIC: &[u8] = b"SWARC1\n";
/// Largest archive accepted when reading one back (decoder limit).
pub const ARCHIVE_RAW_BYTES_MAX: u64 = 64 << 30;

/// What `close_run` produced.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ArchiveInfo {
    /// The archive file.
    pub path: PathBuf,
    /// Files in it.
    pub files: usize,
    /// Bytes before compression.
    pub bytes_raw: u64,
    /// Bytes of the archive file.
    pub bytes_archived: u64,
    /// Events in the archived log.
    pub records: u64,
    /// Head seq (the `run_closed` event).
    pub head_seq: u64,
}

#[derive(Serialize, Deserialize)]
struct EntryHeader {
    name: String,
    len: u64,
    crc: String,
}

fn read_all(storage: &dyn Storage, path: &Path) -> Result<Vec<u8>> {
    let f = storage.open(path, OpenMode::Read).ctx("open", path)?;
    let len = f.len().ctx("stat", path)?;
    let mut b = vec![0u8; len as usize];
    f.read_exact_at(&mut b, 0).ctx("read", path)?;
    Ok(b)
}

fn write_atomic(storage: &dyn Storage, path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    storage.create_dir_all(dir).ctx("create", dir)?;
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("x")
    ));
    let f = storage
        .open(&tmp, OpenMode::ReadWriteCreate)
        .ctx("create", &tmp)?;
    f.set_len(0).ctx("truncate", &tmp)?;
    f.write_all_at(bytes, 0).ctx("write", &tmp)?;
    f.sync_data().ctx("fsync", &tmp)?;
    storage.rename(&tmp, path).ctx("rename", &tmp)?;
    storage.sync_dir(dir).ctx("fsync dir", dir)
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::Corrupt {
        path: path.to_path_buf(),
        offset: 0,
        seq: 0,
        reason: reason.into(),
    }
}

/// Parses a decompressed container into (name, bytes) pairs, checking every CRC.
fn unpack(path: &Path, raw: &[u8]) -> Result<Vec<(String, Vec<u8>)>> {
    let rest = raw
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad(path, "not a swarm archive"))?;
    let mut at = 0usize;
    let mut out = Vec::new();
    loop {
        let nl = rest[at..]
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| bad(path, "truncated archive"))?;
        let line = &rest[at..at + nl];
        at += nl + 1;
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) {
            if v.get("end").and_then(|e| e.as_bool()) == Some(true) {
                let n = v.get("files").and_then(|f| f.as_u64()).unwrap_or(u64::MAX);
                if n != out.len() as u64 {
                    return Err(bad(path, "file count differs from the end record"));
                }
                return Ok(out);
            }
        }
        let h: EntryHeader =
            serde_json::from_slice(line).map_err(|e| bad(path, format!("entry header: {e}")))?;
        if h.name.contains("..") || h.name.starts_with('/') {
            return Err(bad(
                path,
                format!("entry name {:?} escapes the run", h.name),
            ));
        }
        let end = at
            .checked_add(h.len as usize)
            .filter(|&e| e < rest.len())
            .ok_or_else(|| bad(path, "entry longer than the archive"))?;
        let data = &rest[at..end];
        if format!("{:08x}", crc32fast::hash(data)) != h.crc {
            return Err(bad(path, format!("crc mismatch in {}", h.name)));
        }
        if rest[end] != b'\n' {
            return Err(bad(path, "missing entry terminator"));
        }
        out.push((h.name, data.to_vec()));
        at = end + 1;
    }
}

impl Store {
    fn archive_path(&self, run: &str) -> PathBuf {
        self.archive_root()
            .join(self.user())
            .join(format!("{run}.swarc"))
    }

    /// Whether the run is closed and archived (its files replaced by a tombstone).
    pub(crate) fn is_closed_archive(&self, run: &str) -> Result<bool> {
        Ok(self.tombstone(run)?.is_some())
    }

    /// The policy of a closed run: final (it refuses every append), so `read` once and
    /// kept (see [`Store::policy`]).
    pub(crate) fn closed_policy(
        &self,
        run: &str,
        read: impl FnOnce() -> Result<Option<crate::fold::rules::Policy>>,
    ) -> Result<Option<crate::fold::rules::Policy>> {
        let mut known = self
            .closed_policies
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(p) = known.get(run) {
            return Ok(p);
        }
        drop(known);
        let p = read()?;
        let mut known = self
            .closed_policies
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let gone = known.insert(run, p.clone(), |_| true);
        drop(gone);
        Ok(p)
    }

    fn tombstone(&self, run: &str) -> Result<Option<PathBuf>> {
        let p = self.run_dir(run)?.join(TOMBSTONE);
        if !self.storage().exists(&p) {
            return Ok(None);
        }
        let b = read_all(&**self.storage(), &p)?;
        let mut v: serde_json::Value =
            serde_json::from_slice(&b).map_err(|e| bad(&p, e.to_string()))?;
        let a = PathBuf::from(
            v.get("archive")
                .and_then(|a| a.as_str())
                .ok_or_else(|| bad(&p, "no archive path"))?,
        );
        if v.get("relative_to").and_then(|r| r.as_str()) == Some("data_dir") {
            return Ok(Some(self.root().join(a)));
        }
        if a.is_absolute() {
            return Ok(Some(a));
        }
        // A tombstone written before archive paths were kept relative to the data dir
        // holds a path relative to the working directory of the process that closed the
        // run. Where that file exists (or one at the same place under the data dir), the
        // tombstone is rewritten to the new form so any working directory can read it.
        let found = [self.root().join(&a), a.clone()]
            .into_iter()
            .find(|c| self.storage().exists(c));
        let Some(found) = found else {
            return Err(bad(
                &p,
                format!(
                    "archive {} (relative to the working directory that closed the run) is not found; run from that directory once, or move the archive under the data dir",
                    a.display()
                ),
            ));
        };
        let (stored, rel) = self.archive_ref(&found);
        v["archive"] = serde_json::Value::String(stored);
        if rel {
            v["relative_to"] = "data_dir".into();
        }
        if let Err(e) = write_atomic(&**self.storage(), &p, v.to_string().as_bytes()) {
            tracing::warn!(tombstone = %p.display(), error = %e, "cannot migrate the archive path");
        }
        Ok(Some(found))
    }

    /// How a tombstone names `archive`: relative to the data dir when it lies under it
    /// (true), else as an absolute path (false).
    fn archive_ref(&self, archive: &Path) -> (String, bool) {
        if let Ok(rel) = archive.strip_prefix(self.root()) {
            return (rel.to_string_lossy().into_owned(), true);
        }
        let abs = std::path::absolute(archive).unwrap_or_else(|_| archive.to_path_buf());
        (abs.to_string_lossy().into_owned(), false)
    }

    /// Whether the run is archived (out of the working set); the archive's path.
    pub fn archived(&self, run: &str) -> Result<Option<PathBuf>> {
        self.tombstone(run)
    }

    /// A read-only store over an archived run, served from its archive file.
    pub(crate) fn archived_store(&self, run: &str) -> Result<Option<Store>> {
        let Some(path) = self.tombstone(run)? else {
            return Ok(None);
        };
        #[cfg(test)]
        ARCHIVE_READS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(path.clone());
        let files = self.read_archive(&path)?;
        Ok(Some(self.store_over(run, &files)?))
    }

    fn read_archive(&self, path: &Path) -> Result<Vec<(String, Vec<u8>)>> {
        // The run is closed and its log was removed once archived: a missing archive is
        // lost data, damage to report (exit 3), not an I/O error that stops a listing of
        // every run.
        let z = match read_all(&**self.storage(), path) {
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(bad(
                    path,
                    "the archive is missing (the run is closed and its log was removed once \
                     archived): restore the file from a backup",
                ))
            }
            r => r?,
        };
        let mut raw = Vec::new();
        zstd::stream::read::Decoder::new(&z[..])
            .map_err(|e| bad(path, format!("zstd: {e}")))?
            .take(ARCHIVE_RAW_BYTES_MAX)
            .read_to_end(&mut raw)
            .map_err(|e| bad(path, format!("zstd: {e}")))?;
        unpack(path, &raw)
    }

    fn store_over(&self, run: &str, files: &[(String, Vec<u8>)]) -> Result<Store> {
        let mem = MemStorage::new();
        let root = Path::new("/archived");
        let s = Store::open_with(
            Arc::new(mem.clone()),
            root,
            crate::log::meta::LogOptions::default(),
        )?
        .with_checkpoints("/archived-ck", 0)
        .with_user(self.user(), true)?;
        let run_dir = s.run_dir(run)?;
        for (name, data) in files {
            let p = match name.strip_prefix("checkpoints/") {
                Some(n) => s.checkpoint_dir(run).join(n),
                None => run_dir.join(name),
            };
            let dir = p.parent().unwrap_or(root);
            mem.create_dir_all(dir).ctx("create", dir)?;
            let f = mem.open(&p, OpenMode::CreateNew).ctx("create", &p)?;
            f.write_all_at(data, 0).ctx("write", &p)?;
        }
        Ok(s)
    }

    fn run_files(&self, run: &str) -> Result<Vec<(String, PathBuf)>> {
        let dir = self.run_dir(run)?;
        let st = &**self.storage();
        let mut out = Vec::new();
        let mut names = st.list(&dir).ctx("list", &dir)?;
        names.sort();
        for n in names {
            if n == "LOCK" || n == TOMBSTONE || n.ends_with(".tmp") || n.starts_with('.') {
                continue;
            }
            let p = dir.join(&n);
            if n == "index" {
                let mut sub = st.list(&p).ctx("list", &p)?;
                sub.sort();
                for s in sub
                    .into_iter()
                    .filter(|s| !s.ends_with(".tmp") && !s.starts_with('.'))
                {
                    out.push((format!("index/{s}"), p.join(&s)));
                }
                continue;
            }
            out.push((n, p));
        }
        let ck = self.checkpoint_dir(run);
        if let Some(seq) = checkpoint::list(st, &ck)?.first() {
            let name = checkpoint::checkpoint_name(*seq);
            out.push((format!("checkpoints/{name}"), ck.join(name)));
        }
        Ok(out)
    }

    /// Closes a run (appends `run_closed`; appends are refused from then on), archives it
    /// into one zstd file under the archive directory, verifies the archive against the
    /// log, and only then removes the run from the working set. See the module docs.
    pub fn close_run(&self, run: &str, agent: &str) -> Result<ArchiveInfo> {
        crate::event::refuse_engine_run(run)?;
        if let Some(p) = self.tombstone(run)? {
            return Err(Error::Forbidden(format!(
                "run {run:?} is already archived at {}",
                self.shown_path(&p)
            )));
        }
        let state = self.head_state(run)?.state;
        if state.rules.closed.is_none() {
            self.engine_append(
                run,
                agent,
                EventType::RunClosed,
                serde_json::json!({"by": agent}),
                None,
                Vec::new(),
            )?;
        }
        // From here the run is closed: an I/O failure (a full disk, mostly) says so.
        self.archive_closed(run).map_err(|e| match e {
            Error::Io { op, path, source } => Error::Io {
                op,
                path,
                // (Not its kind: at a full disk that would read "nothing was stored".)
                source: std::io::Error::other(format!("{source}; run {run:?} is closed (it takes no appends) but not archived yet: run `swarm run close` again once the cause is fixed")),
            },
            e => e,
        })
    }

    /// The rest of [`Self::close_run`], once the run is closed: a checkpoint, the archive,
    /// its check, the tombstone, the working files removed.
    fn archive_closed(&self, run: &str) -> Result<ArchiveInfo> {
        self.checkpoint(run, |_| {})?;
        let head = self.head_state(run)?.state.head_seq;
        let files = self.run_files(run)?;
        let st = &**self.storage();
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).map_err(|e| Error::Io {
            op: "compress",
            path: PathBuf::new(),
            source: e,
        })?;
        let mut raw_len = 0u64;
        let mut put = |b: &[u8]| -> Result<()> {
            raw_len += b.len() as u64;
            enc.write_all(b).map_err(|e| Error::Io {
                op: "compress",
                path: PathBuf::new(),
                source: e,
            })
        };
        put(MAGIC)?;
        let mut originals = Vec::new();
        for (name, p) in &files {
            let mut data = read_all(st, p)?;
            if crate::log::segment::parse_segment_name(name).is_some() {
                // The active segment's preallocated zero fill is not part of the log: the
                // archive keeps the segment trimmed to its last frame, as a sealed one.
                let end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
                data.truncate(end);
            }
            let h = EntryHeader {
                name: name.clone(),
                len: data.len() as u64,
                crc: format!("{:08x}", crc32fast::hash(&data)),
            };
            let mut line =
                serde_json::to_vec(&h).map_err(|e| Error::invalid("archive", e.to_string()))?;
            line.push(b'\n');
            put(&line)?;
            put(&data)?;
            put(b"\n")?;
            originals.push((name.clone(), data));
        }
        put(format!("{{\"end\":true,\"files\":{}}}\n", files.len()).as_bytes())?;
        let z = enc.finish().map_err(|e| Error::Io {
            op: "compress",
            path: PathBuf::new(),
            source: e,
        })?;
        let path = self.archive_path(run);
        write_atomic(st, &path, &z)?;
        if let Some(parent) = path.parent().and_then(Path::parent) {
            let _ = st.sync_dir(parent);
        }
        // Verify the archive against the working copy before anything is removed.
        let back = self.read_archive(&path)?;
        if back != originals {
            return Err(bad(
                &path,
                "archive differs from the run's files; the run is left in place",
            ));
        }
        let arch = self.store_over(run, &back)?;
        let report = arch.verify(run, |_| {})?;
        if !report.ok || report.head_seq != head {
            return Err(bad(&path, format!("archived log does not verify (ok {}, head {} vs {head}); the run is left in place", report.ok, report.head_seq)));
        }
        let dir = self.run_dir(run)?;
        let (stored, rel) = self.archive_ref(&path);
        let mut tomb = serde_json::json!({"archive": stored, "head_seq": head});
        if rel {
            tomb["relative_to"] = "data_dir".into();
        }
        write_atomic(st, &dir.join(TOMBSTONE), tomb.to_string().as_bytes())?;
        // Segments first, `QUARANTINE` and `SYNCED` after them: a reader that still
        // finds a segment in this window needs the list of its known damage (without
        // it, damage `swarm repair` declared is reported again instead of the reader
        // moving on to the archive).
        let is_segment = |name: &str| crate::log::segment::parse_segment_name(name).is_some();
        let in_order = files
            .iter()
            .filter(|(n, _)| is_segment(n))
            .chain(files.iter().filter(|(n, _)| !is_segment(n)));
        for (name, p) in in_order {
            if name == crate::log::meta::META_FILE {
                continue;
            }
            if let Err(e) = st.remove_file(p) {
                tracing::warn!(path = %p.display(), error = %e, "cannot remove an archived file");
            }
        }
        let _ = st.remove_dir_all(&dir.join("index"));
        let _ = st.remove_dir_all(&self.checkpoint_dir(run));
        let _ = st.sync_dir(&dir);
        Ok(ArchiveInfo {
            path,
            files: files.len(),
            bytes_raw: raw_len,
            bytes_archived: z.len() as u64,
            records: report.records,
            head_seq: head,
        })
    }

    /// Brings an archived run back into the working set (it stays closed for appends).
    pub fn restore_run(&self, run: &str) -> Result<ArchiveInfo> {
        let Some(path) = self.tombstone(run)? else {
            return Err(Error::invalid("run", format!("{run:?} is not archived")));
        };
        let files = self.read_archive(&path)?;
        let st = &**self.storage();
        let dir = self.run_dir(run)?;
        let mut raw = 0u64;
        for (name, data) in &files {
            raw += data.len() as u64;
            let p = match name.strip_prefix("checkpoints/") {
                Some(n) => self.checkpoint_dir(run).join(n),
                None => dir.join(name),
            };
            write_atomic(st, &p, data)?;
        }
        st.remove_file(&dir.join(TOMBSTONE))
            .ctx("remove", &dir.join(TOMBSTONE))?;
        st.sync_dir(&dir).ctx("fsync dir", &dir)?;
        let report = self.verify(run, |_| {})?;
        Ok(ArchiveInfo {
            bytes_archived: read_all(st, &path)?.len() as u64,
            path,
            files: files.len(),
            bytes_raw: raw,
            records: report.records,
            head_seq: report.head_seq,
        })
    }
}

/// Every archive `archived_store` read, for tests that count them.
#[cfg(test)]
pub(crate) static ARCHIVE_READS: std::sync::Mutex<Vec<std::path::PathBuf>> =
    std::sync::Mutex::new(Vec::new());
