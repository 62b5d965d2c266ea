//! [`IndexCell`]: a run's index as one process holds it. Caught up by readers from the
//! log, persisted under `<run>/index/` when worth it, discarded and rebuilt from the log
//! when anything disagrees.

use crate::query::index::format::*;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde::Serialize;

use crate::error::{IoContext, Result};
use crate::event::ts::Ts;
use crate::log::segment::{self};
use crate::log::storage::{OpenMode, Storage, StorageFile};
use crate::log::watermark::{self, Marks, Pos};

/// Figures about a run's index, as `swarm index rebuild` prints them.
#[derive(Clone, Debug, Default, Serialize)]
pub struct IndexStats {
    /// The run.
    pub run: String,
    /// Segments indexed.
    pub segments: usize,
    /// Frames indexed.
    pub frames: u64,
    /// Events indexed.
    pub events: u64,
    /// Last indexed seq.
    pub head_seq: u64,
    /// Log position the index covers up to.
    pub covered: Pos,
    /// Distinct agents.
    pub agents: usize,
    /// Distinct users.
    pub users: usize,
    /// Distinct subjects.
    pub subjects: usize,
    /// Bytes of the index files on disk.
    pub index_bytes: u64,
    /// Segments whose index file on disk covers everything indexed in memory.
    pub persisted_segments: usize,
    /// Index files or in-memory parts found stale or corrupt and rebuilt, with the reason.
    pub discarded: Vec<String>,
    /// Why the index stops before the visible end of the log (damage in the log), if so.
    pub stopped: Option<String>,
    /// Wall time of the operation, in milliseconds.
    pub elapsed_ms: f64,
}

/// What the index covers, frozen for one read.
#[derive(Clone)]
pub(crate) struct IndexSnapshot {
    pub(crate) segs: Vec<Arc<SegIndex>>,
    pub(crate) files: Vec<Arc<dyn StorageFile>>,
    pub(crate) cell: Arc<IndexCell>,
    /// The log's segments as last listed: every one up to the covered position.
    pub(crate) bases: Vec<u64>,
}

impl IndexSnapshot {
    /// Position just after the last indexed frame, the next seq and the last ts.
    pub(crate) fn covered(&self) -> Option<(Pos, u64, Ts)> {
        self.segs
            .last()
            .map(|s| (s.pos(), s.head + 1, Ts(s.last_ts())))
    }

    pub(crate) fn cell(&self) -> &Arc<IndexCell> {
        &self.cell
    }

    /// The log's segments as listed when the index last caught up: complete up to the
    /// covered position (so enough for a read limited to it), maybe not beyond.
    pub(crate) fn bases(&self) -> &[u64] {
        &self.bases
    }

    /// First seq of the first frame that may hold an event at or after `t`.
    pub(crate) fn seq_since(&self, t: Ts) -> u64 {
        for s in &self.segs {
            let i = s.frame_ts.partition_point(|&x| x < t.0);
            if i < s.frames() {
                return s.frame_first_seq(i);
            }
        }
        self.segs.last().map_or(1, |s| s.head + 1)
    }

    /// For the first frame whose last event is after `t`: the seq before it (every event
    /// up to there is at or before `t`) and its last seq (nothing later can be at or
    /// before `t`). `u64::MAX` twice when every indexed frame is at or before `t`.
    pub(crate) fn seq_until(&self, t: Ts) -> (u64, u64) {
        for s in &self.segs {
            let i = s.frame_ts.partition_point(|&x| x <= t.0);
            if i < s.frames() {
                let first = s.frame_first_seq(i);
                return (first - 1, first + s.frame_events(i) - 1);
            }
        }
        (u64::MAX, u64::MAX)
    }

    /// The frame holding `seq`: (segment position in the snapshot, frame index).
    pub(crate) fn frame_at(&self, seq: u64) -> Option<(usize, usize)> {
        let k = self
            .segs
            .iter()
            .position(|s| s.base <= seq && seq <= s.head)?;
        let s = &self.segs[k];
        Some((k, s.frame_of((seq - s.base) as u32)))
    }

    /// Where a read starting at `seq` should begin: (segment base, offset, first seq of
    /// that frame, ts of the frame before it). `None` when `seq` is not indexed.
    pub(crate) fn seek(&self, seq: u64) -> Option<(u64, u64, u64, Ts)> {
        let (k, i) = self.frame_at(seq)?;
        let s = &self.segs[k];
        let prev_ts = if i > 0 {
            s.frame_ts[i - 1]
        } else if k > 0 {
            self.segs[k - 1].last_ts()
        } else {
            0
        };
        Some((s.base, s.frame_off[i], s.frame_first_seq(i), Ts(prev_ts)))
    }
}

/// A run's index as one process holds it: shared by every read of a [`crate::Store`].
pub(crate) struct IndexCell {
    pub(crate) run: String,
    pub(crate) state: Mutex<RunIndex>,
    /// Set by a read that found the index disagreeing with the log.
    pub(crate) invalid: AtomicBool,
}

#[derive(Default)]
pub(crate) struct RunIndex {
    /// Whether the files on disk were consulted.
    pub(crate) loaded: bool,
    /// `run.json`'s creation time: an index of an earlier run of the same name is refused.
    pub(crate) created: u64,
    /// Indexes of a prefix of the log's segments, in order.
    pub(crate) segs: Vec<Arc<SegIndex>>,
    /// Open handles of those segments.
    pub(crate) files: Vec<Arc<dyn StorageFile>>,
    /// Checked index files not yet part of `segs` (their predecessor is not complete yet).
    pub(crate) spare: HashMap<u64, SegIndex>,
    /// Head seq of each segment's file on disk, as far as this process knows.
    pub(crate) persisted: HashMap<u64, u64>,
    /// Segments whose file on disk is bad and must be rewritten.
    pub(crate) rewrite: HashSet<u64>,
    pub(crate) discarded: Vec<String>,
    pub(crate) stopped: Option<String>,
    /// The log's segments at the last slow-path refresh.
    pub(crate) bases: Vec<u64>,
    /// The run's `SYNCED` file, kept open: reading the watermark is one `pread`.
    pub(crate) synced: Option<Box<dyn StorageFile>>,
    /// Bases of segments in `segs` accepted only as emptied by damage (sealed, no
    /// bytes, at a base no gap rule explains): they hold no seq, and the seq expected
    /// after them is the one expected before them. Never the last of `segs`.
    pub(crate) emptied: HashSet<u64>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How much a refresh writes to disk.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Persist {
    /// When thresholds say so, if the index lock is free.
    Auto,
    /// Everything not on disk yet, waiting for the index lock.
    All,
}

impl IndexCell {
    pub(crate) fn new(run: &str) -> IndexCell {
        IndexCell {
            run: run.to_string(),
            state: Mutex::new(RunIndex::default()),
            invalid: AtomicBool::new(false),
        }
    }

    /// Marks the index as disagreeing with the log: the next refresh rebuilds it from the
    /// log and rewrites its files.
    pub(crate) fn invalidate(&self, reason: &str) {
        tracing::warn!(run = %self.run, reason, "index disagrees with the log; rebuilding it");
        self.invalid.store(true, Ordering::Release);
    }

    /// Reads the run's watermark, catches the index up to its visible position and
    /// freezes it for one read.
    pub(crate) fn snapshot(
        self: &Arc<Self>,
        storage: &Arc<dyn Storage>,
        dir: &Path,
    ) -> Result<(Marks, IndexSnapshot)> {
        let mut st = lock(&self.state);
        let path = dir.join(crate::log::meta::SYNCED_FILE);
        if st.synced.is_none() {
            match storage.open(&path, OpenMode::Read) {
                Ok(f) => st.synced = Some(f),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).ctx("open", &path),
            }
        }
        let marks = match &st.synced {
            Some(f) => watermark::read(&**f, &path)?,
            None => Marks::default(),
        };
        self.refresh(
            &mut st,
            storage,
            dir,
            marks.visible,
            Persist::Auto,
            &mut |_| {},
        )?;
        Ok((
            marks,
            IndexSnapshot {
                segs: st.segs.clone(),
                files: st.files.clone(),
                cell: self.clone(),
                bases: st.bases.clone(),
            },
        ))
    }

    /// Catches up and reports; with `flush`, writes everything not yet on disk (waiting
    /// for the index lock); with `rebuild`, first forgets the index in memory and on disk.
    pub(crate) fn stats(
        &self,
        storage: &Arc<dyn Storage>,
        dir: &Path,
        visible: Pos,
        flush: bool,
        rebuild: bool,
        progress: &mut dyn FnMut(u64),
    ) -> Result<IndexStats> {
        let t0 = Instant::now();
        let mut st = lock(&self.state);
        if rebuild {
            *st = RunIndex {
                loaded: true,
                ..RunIndex::default()
            };
            remove_index_files(storage, dir)?;
        }
        let mode = if flush || rebuild {
            Persist::All
        } else {
            Persist::Auto
        };
        self.refresh(&mut st, storage, dir, visible, mode, progress)?;
        let mut agents = HashSet::new();
        let mut users = HashSet::new();
        let mut subjects = HashSet::new();
        for s in &st.segs {
            agents.extend(s.postings[Field::Agent as usize].keys());
            users.extend(s.postings[Field::User as usize].keys());
            subjects.extend(s.postings[Field::Subject as usize].keys());
        }
        let idx_dir = dir.join(INDEX_DIR);
        let mut index_bytes = 0;
        for s in &st.segs {
            let p = idx_dir.join(index_file_name(s.base));
            if let Ok(f) = storage.open(&p, OpenMode::Read) {
                index_bytes += f.len().unwrap_or(0);
            }
        }
        let last = st.segs.last();
        Ok(IndexStats {
            run: self.run.clone(),
            segments: st.segs.len(),
            frames: st.segs.iter().map(|s| s.frames() as u64).sum(),
            events: st.segs.iter().map(|s| s.events()).sum(),
            head_seq: last.map_or(0, |s| s.head),
            covered: last.map_or(Pos::default(), |s| s.pos()),
            agents: agents.len(),
            users: users.len(),
            subjects: subjects.len(),
            index_bytes,
            persisted_segments: st
                .segs
                .iter()
                .filter(|s| st.persisted.get(&s.base) == Some(&s.head))
                .count(),
            discarded: st.discarded.clone(),
            stopped: st.stopped.clone(),
            elapsed_ms: t0.elapsed().as_secs_f64() * 1e3,
        })
    }

    pub(crate) fn refresh(
        &self,
        st: &mut RunIndex,
        storage: &Arc<dyn Storage>,
        dir: &Path,
        visible: Pos,
        persist: Persist,
        progress: &mut dyn FnMut(u64),
    ) -> Result<()> {
        if self.invalid.swap(false, Ordering::AcqRel) {
            // Do not reload the files either: the disagreement may come from them.
            let rewrite: HashSet<u64> = st
                .segs
                .iter()
                .map(|s| s.base)
                .chain(st.persisted.keys().copied())
                .collect();
            let discarded = std::mem::take(&mut st.discarded);
            *st = RunIndex {
                loaded: true,
                rewrite,
                discarded,
                ..RunIndex::default()
            };
            st.discarded
                .push("a read found the index disagreeing with the log".into());
        }
        // Fast path: nothing appended since the last look.
        if st.loaded
            && persist == Persist::Auto
            && st.segs.last().is_some_and(|s| s.pos() == visible)
        {
            return Ok(());
        }
        let created = crate::log::meta::read_meta(&**storage, dir)?.created.0;
        if st.created != 0 && st.created != created {
            tracing::warn!(run = %self.run, "run was recreated; dropping its index");
            *st = RunIndex::default();
        }
        st.created = created;
        let bases = segment::list_segments(&**storage, dir)?;
        st.bases = bases.clone();
        if !st.loaded {
            self.load_files(st, storage, dir, &bases)?;
            st.loaded = true;
        }
        self.check_segments(st, dir, &bases)?;
        st.stopped = None;
        for (k, &base) in bases.iter().enumerate() {
            if base > visible.seg {
                break;
            }
            let path = segment::segment_path(dir, base);
            if k == st.segs.len() {
                // The run's first seq is 1: a first segment that starts later means the
                // ones before it are gone. A sealed segment emptied by damage at a base
                // no gap rule explains holds no seq, whatever its name says: readers
                // carry on past it wanting the same seq, to the next segment, where
                // `swarm repair` lists the seqs lost since (at the emptied segment, the
                // last one read). The index does the same (`emptied`), and never ends on
                // such a segment (below).
                let prev = st.segs.last().map_or(1, |s| s.base);
                let expected = st
                    .segs
                    .iter()
                    .rev()
                    .find(|s| !st.emptied.contains(&s.base))
                    .map_or(1, |s| s.head + 1);
                let file: Arc<dyn StorageFile> =
                    Arc::from(storage.open(&path, OpenMode::Read).ctx("open", &path)?);
                // The gap rule: a segment may start after a gap its first event declares,
                // or after seqs `swarm repair` listed as lost at the previous one's end.
                let fits = base == expected
                    || (base > expected
                        && (declares_gap(&file, &path, expected, base)
                            || crate::log::quarantine::read(&**storage, dir)
                                .gap(prev, expected, base)
                                .is_some()));
                let emptied = !fits && base < visible.seg && file.len().ctx("stat", &path)? == 0;
                if emptied {
                    st.emptied.insert(base);
                } else {
                    st.emptied.remove(&base);
                }
                if !fits && !emptied {
                    st.stopped = Some(format!(
                        "segment {} starts at seq {base}, expected {expected}",
                        path.display()
                    ));
                    break;
                }
                let seg = match st.spare.remove(&base) {
                    Some(s) => match s.check_position(&*file, &path)? {
                        Ok(()) => s,
                        Err(reason) => {
                            self.discard(st, dir, base, &reason);
                            SegIndex::new(base)
                        }
                    },
                    None => SegIndex::new(base),
                };
                st.segs.push(Arc::new(seg));
                st.files.push(file);
            }
            let file = st.files[k].clone();
            let sealed = base < visible.seg;
            let limit = if sealed {
                file.len().ctx("stat", &path)?
            } else {
                visible.off
            };
            // A sealed segment ends at its length or at a zero fill a crash left before
            // its trim (a rotation or a declared loss cut short): whole either way.
            let mut whole = st.segs[k].end >= limit;
            if !whole {
                let seg = Arc::make_mut(&mut st.segs[k]);
                let outcome = seg.extend((&file, &**storage), &path, limit, &self.run, progress)?;
                whole = sealed && matches!(outcome, Extended::Done) || seg.end >= limit;
                if let Extended::Stopped(reason) = outcome {
                    if reason.starts_with(super::format::QUARANTINED) {
                        tracing::debug!(segment = %path.display(), reason, "the index stops before the end of the log");
                    } else {
                        tracing::warn!(segment = %path.display(), reason, "the index stops before the end of the log");
                    }
                    st.stopped = Some(format!("{}: {reason}", path.display()));
                    break;
                }
            }
            if !whole {
                break;
            }
        }
        // An emptied segment the index could not go past says nothing of the seqs after
        // the last one indexed: the index ends before it (reads scan on from there and
        // report what is missing).
        while st.segs.last().is_some_and(|s| st.emptied.contains(&s.base)) {
            if let Some(s) = st.segs.pop() {
                st.emptied.remove(&s.base);
            }
            st.files.pop();
        }
        self.persist(st, storage, dir, persist)
    }

    pub(crate) fn discard(&self, st: &mut RunIndex, dir: &Path, base: u64, reason: &str) {
        let p = dir.join(INDEX_DIR).join(index_file_name(base));
        tracing::warn!(file = %p.display(), reason, "index file not usable; rebuilding it from the log");
        st.discarded.push(format!("{}: {reason}", p.display()));
        st.rewrite.insert(base);
        st.persisted.remove(&base);
    }

    /// Reads and checks the index files of the log's segments into `spare`.
    pub(crate) fn load_files(
        &self,
        st: &mut RunIndex,
        storage: &Arc<dyn Storage>,
        dir: &Path,
        bases: &[u64],
    ) -> Result<()> {
        let idx_dir = dir.join(INDEX_DIR);
        if !storage.exists(&idx_dir) {
            return Ok(());
        }
        let names = storage.list(&idx_dir).ctx("list", &idx_dir)?;
        let present: HashSet<u64> = names
            .iter()
            .filter_map(|n| parse_index_file_name(n))
            .collect();
        for &base in bases {
            if !present.contains(&base) {
                continue;
            }
            let p = idx_dir.join(index_file_name(base));
            let bytes = match read_file(&**storage, &p)? {
                Ok(b) => b,
                Err(reason) => {
                    self.discard(st, dir, base, &reason);
                    continue;
                }
            };
            match SegIndex::decode(&bytes, base, st.created) {
                Ok(s) => {
                    st.persisted.insert(base, s.head);
                    st.spare.insert(base, s);
                }
                Err(reason) => self.discard(st, dir, base, &reason),
            }
        }
        Ok(())
    }

    /// Re-checks the in-memory segments against the log; drops any that no longer match,
    /// and everything after it.
    pub(crate) fn check_segments(
        &self,
        st: &mut RunIndex,
        dir: &Path,
        bases: &[u64],
    ) -> Result<()> {
        let mut keep = st.segs.len();
        for k in 0..st.segs.len() {
            let base = st.segs[k].base;
            let path = segment::segment_path(dir, base);
            if bases.get(k) != Some(&base) {
                keep = k;
                self.discard(st, dir, base, "the log's segments changed");
                break;
            }
            if let Err(reason) = st.segs[k].check_position(&*st.files[k], &path)? {
                keep = k;
                self.discard(st, dir, base, &reason);
                break;
            }
        }
        for s in st.segs.drain(keep..) {
            st.rewrite.insert(s.base);
            st.persisted.remove(&s.base);
        }
        st.files.truncate(keep);
        Ok(())
    }

    pub(crate) fn persist(
        &self,
        st: &mut RunIndex,
        storage: &Arc<dyn Storage>,
        dir: &Path,
        mode: Persist,
    ) -> Result<()> {
        let mut todo = Vec::new();
        for (k, s) in st.segs.iter().enumerate() {
            let on_disk = st.persisted.get(&s.base).copied();
            if on_disk == Some(s.head) && !st.rewrite.contains(&s.base) {
                continue;
            }
            // The chain holds a later segment only once this one is complete.
            let complete_sealed = k + 1 < st.segs.len();
            let behind = s.head - on_disk.unwrap_or(s.base - 1).min(s.head);
            let due = mode == Persist::All
                || complete_sealed
                || behind >= PERSIST_EVENTS_MIN
                || st.rewrite.contains(&s.base);
            if due && (s.frames() > 0 || mode == Persist::All) {
                todo.push(k);
            }
        }
        if todo.is_empty() {
            return Ok(());
        }
        let r = self.write_files(st, storage, dir, &todo, mode);
        match (r, mode) {
            (Ok(()), _) => Ok(()),
            (Err(e), Persist::All) => Err(e),
            (Err(e), Persist::Auto) => {
                // The index in memory is still right; the next reader retries.
                tracing::warn!(run = %self.run, error = %e, "cannot write the index; keeping it in memory");
                Ok(())
            }
        }
    }

    pub(crate) fn write_files(
        &self,
        st: &mut RunIndex,
        storage: &Arc<dyn Storage>,
        dir: &Path,
        todo: &[usize],
        mode: Persist,
    ) -> Result<()> {
        let idx_dir = dir.join(INDEX_DIR);
        storage.create_dir_all(&idx_dir).ctx("create", &idx_dir)?;
        let lock_path = idx_dir.join(LOCK_FILE);
        let lock_file = storage
            .open(&lock_path, OpenMode::ReadWriteCreate)
            .ctx("open", &lock_path)?;
        match mode {
            Persist::All => lock_file.lock().ctx("lock", &lock_path)?,
            Persist::Auto => {
                if !lock_file.try_lock().ctx("lock", &lock_path)? {
                    // Another process is writing the index; ours stays in memory.
                    return Ok(());
                }
            }
        }
        let r = (|| {
            let mut wrote = false;
            for &k in todo {
                let s = &st.segs[k];
                let p = idx_dir.join(index_file_name(s.base));
                // Never replace a file that covers more (another process got further).
                if !st.rewrite.contains(&s.base) {
                    if let Some(head) = file_head(&**storage, &p, s.base, st.created)? {
                        if head >= s.head {
                            st.persisted.insert(s.base, head.min(s.head));
                            continue;
                        }
                    }
                }
                let bytes = s.encode(st.created);
                let tmp = idx_dir.join(format!("{}.tmp", index_file_name(s.base)));
                let f = storage
                    .open(&tmp, OpenMode::ReadWriteCreate)
                    .ctx("create", &tmp)?;
                f.set_len(0).ctx("truncate", &tmp)?;
                f.write_all_at(&bytes, 0).ctx("write", &tmp)?;
                f.sync_data().ctx("fsync", &tmp)?;
                storage.rename(&tmp, &p).ctx("rename", &tmp)?;
                st.persisted.insert(s.base, s.head);
                st.rewrite.remove(&s.base);
                wrote = true;
            }
            if wrote {
                storage.sync_dir(&idx_dir).ctx("fsync dir", &idx_dir)?;
            }
            Ok(())
        })();
        let _ = lock_file.unlock();
        r
    }
}

/// Reads a whole index file; the inner error says why it cannot be used.
pub(crate) fn read_file(storage: &dyn Storage, p: &Path) -> Result<Result<Vec<u8>, String>> {
    let f = match storage.open(p, OpenMode::Read) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Err("vanished".into())),
        Err(e) => return Err(e).ctx("open", p),
    };
    let len = f.len().ctx("stat", p)?;
    if len > INDEX_FILE_BYTES_MAX {
        return Ok(Err(format!("{len} bytes, over the limit")));
    }
    let mut b = vec![0u8; len as usize];
    f.read_exact_at(&mut b, 0).ctx("read", p)?;
    Ok(Ok(b))
}

/// Head seq recorded in an index file's header, if it is a valid one for this segment.
pub(crate) fn file_head(
    storage: &dyn Storage,
    p: &Path,
    base: u64,
    created: u64,
) -> Result<Option<u64>> {
    let f = match storage.open(p, OpenMode::Read) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).ctx("open", p),
    };
    let mut h = [0u8; INDEX_HEADER_LEN];
    if f.read_exact_at(&mut h, 0).is_err() {
        return Ok(None);
    }
    Ok(decode_header(&h)
        .ok()
        .filter(|h| h.base == base && h.created == created)
        .map(|h| h.head))
}

pub(crate) fn remove_index_files(storage: &Arc<dyn Storage>, dir: &Path) -> Result<()> {
    let idx_dir = dir.join(INDEX_DIR);
    if !storage.exists(&idx_dir) {
        return Ok(());
    }
    // Under the index lock, as every writer of these files: another process writing one
    // (its temporary file, then the rename) lost it from under it and failed.
    let lock_path = idx_dir.join(LOCK_FILE);
    let lock_file = storage
        .open(&lock_path, OpenMode::ReadWriteCreate)
        .ctx("open", &lock_path)?;
    lock_file.lock().ctx("lock", &lock_path)?;
    let r = (|| {
        for n in storage.list(&idx_dir).ctx("list", &idx_dir)? {
            if n.starts_with("seg-") {
                let p = idx_dir.join(&n);
                match storage.remove_file(&p) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e).ctx("remove", &p),
                }
            }
        }
        storage.sync_dir(&idx_dir).ctx("fsync dir", &idx_dir)
    })();
    let _ = lock_file.unlock();
    r
}

/// Whether the segment at `path` (first seq `base`) starts with a `log_damaged` event
/// declaring exactly the seqs `from..base` lost (the gap rule). Unreadable: no.
fn declares_gap(file: &Arc<dyn StorageFile>, path: &Path, from: u64, base: u64) -> bool {
    #[derive(serde::Deserialize)]
    struct First {
        #[serde(rename = "type")]
        kind: crate::event::EventType,
        content: serde_json::Value,
    }
    let Ok(len) = file.len() else { return false };
    let Ok(mut r) = segment::FrameReader::new(file.clone(), path.to_path_buf(), 0, Some(len))
    else {
        return false;
    };
    let Ok(segment::Step::Frame { .. }) = r.step() else {
        return false;
    };
    let Ok(events) = serde_json::from_slice::<Vec<First>>(r.payload()) else {
        return false;
    };
    events.first().is_some_and(|e| {
        crate::event::LogDamaged::declared(e.kind, &e.content) == Some((from, base - 1))
    })
}
