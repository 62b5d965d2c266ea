//! The index: a derived, rebuildable lookup structure beside each run's log.
//!
//! For every segment of the log it keeps the frames (first seq, byte offset, last ts) and
//! the postings of four fields (`type`, `agent_id`, `user_id`, `subject`): for each value,
//! the sorted seqs of the events that carry it. A read with a selective filter intersects
//! the postings, maps the hits to frames and reads only those frames (seek by offset);
//! `from_seq`/`since` become a seek to the first frame that can match.
//!
//! # Who keeps it current
//! Appends never touch the index: the writer's hot path stays exactly as fast as without
//! one. Readers catch the index up instead: when a [`crate::Store`] reads a run it extends
//! its in-memory index from the position it covers to the log's visible position, reading
//! only the new frames (a fast path costs one comparison when nothing was appended). The
//! index is persisted under `<run>/index/` when a segment is sealed (complete and followed
//! by a newer one), when the active segment has [`PERSIST_EVENTS_MIN`] events more than the
//! file on disk, and on an explicit flush or rebuild, under `<run>/index/LOCK` taken with a
//! non-blocking `try_lock`: a reader that does not get it keeps its caught-up copy in
//! memory and never waits for another process.
//!
//! # Never trusted
//! A file is used only if its header and body checksums, format version, run creation time
//! and segment base match, and the log still holds at the recorded position the frame the
//! index ends with (segment long enough, same frame CRC and length there). Anything else is
//! discarded with a warning and rebuilt from the log. Reads check every frame they fetch
//! against the index (CRC, seqs, count, ts); a disagreement invalidates the index and the
//! read goes on by scanning the segment from its start, so a wrong index can cost time but
//! never an event. The byte-exact format is in `docs/index.md`.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::frame;
use crate::read::ReadOptions;
use crate::segment::{self, FrameReader, Step};
use crate::storage::{OpenMode, Storage, StorageFile};
use crate::ts::Ts;
use crate::watermark::{self, Marks, Pos};

/// Directory of a run that holds its index files.
pub const INDEX_DIR: &str = "index";
/// Format version written in every index file header.
pub const INDEX_FORMAT_VERSION: u32 = 1;
/// Bytes of the fixed header of an index file.
pub const INDEX_HEADER_LEN: usize = 80;
/// The active segment's index is written again once it covers this many more events than
/// the file on disk. Small enough that a cold reader catches up at most ~4 MiB of log,
/// large enough that rewriting the file (at most one segment's worth) stays rare.
pub const PERSIST_EVENTS_MIN: u64 = 16_384;
/// Largest index file accepted (one segment's index; a 64 MiB segment needs ~6 MiB).
pub const INDEX_FILE_BYTES_MAX: u64 = 1 << 30;
/// Frames closer than this in a segment are fetched with one read (the gap is read too).
const READ_GAP_BYTES: u64 = 4096;
/// Largest single read of several frames.
const READ_RUN_BYTES_MAX: u64 = 1 << 20;

const MAGIC: &[u8; 4] = b"SWIX";
const LOCK_FILE: &str = "LOCK";

/// The indexed fields, in the order of their sections in an index file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Field {
    Type = 0,
    Agent = 1,
    User = 2,
    Subject = 3,
}

const FIELDS: [Field; 4] = [Field::Type, Field::Agent, Field::User, Field::Subject];

/// Index file name of the segment whose first seq is `base`.
pub fn index_file_name(base: u64) -> String {
    format!("{}.idx", segment::segment_name(base))
}

fn parse_index_file_name(name: &str) -> Option<u64> {
    segment::parse_segment_name(name.strip_suffix(".idx")?)
}

type Postings = HashMap<Box<str>, Vec<u32>>;

/// The index of one segment. Seqs are stored relative to the segment's base (a segment
/// holds far fewer than 2^32 events), which halves the memory of the postings.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SegIndex {
    base: u64,
    /// Offset just after the last indexed frame.
    end: u64,
    /// Last indexed seq (`base - 1` when no frame is indexed).
    head: u64,
    /// CRC-32 written in the header of the last indexed frame.
    last_crc: u32,
    /// Per frame: first seq minus base, byte offset, ts of its last event (micros).
    frame_seq: Vec<u32>,
    frame_off: Vec<u64>,
    frame_ts: Vec<u64>,
    postings: [Postings; 4],
}

/// The fields of a stored event the index needs, parsed without the rest.
#[derive(Deserialize)]
struct IndexHead<'a> {
    #[serde(borrow)]
    run_id: Cow<'a, str>,
    seq: u64,
    ts: Ts,
    #[serde(borrow)]
    agent_id: Cow<'a, str>,
    #[serde(borrow)]
    user_id: Cow<'a, str>,
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    subject: Option<Cow<'a, str>>,
}

/// How an extension of a segment's index ended.
enum Extended {
    /// Reached the limit.
    Done,
    /// Stopped before the limit: damage, a torn frame, or a frame that does not follow.
    Stopped(String),
}

fn push_posting(map: &mut Postings, key: &str, rel: u32) {
    match map.get_mut(key) {
        Some(list) => list.push(rel),
        None => {
            map.insert(key.into(), vec![rel]);
        }
    }
}

impl SegIndex {
    fn new(base: u64) -> SegIndex {
        SegIndex {
            base,
            end: 0,
            head: base.saturating_sub(1),
            last_crc: 0,
            frame_seq: Vec::new(),
            frame_off: Vec::new(),
            frame_ts: Vec::new(),
            postings: Default::default(),
        }
    }

    fn events(&self) -> u64 {
        self.head + 1 - self.base
    }

    fn frames(&self) -> usize {
        self.frame_seq.len()
    }

    fn last_ts(&self) -> u64 {
        self.frame_ts.last().copied().unwrap_or(0)
    }

    fn frame_end(&self, i: usize) -> u64 {
        self.frame_off.get(i + 1).copied().unwrap_or(self.end)
    }

    fn frame_first_seq(&self, i: usize) -> u64 {
        self.base + u64::from(self.frame_seq[i])
    }

    fn frame_events(&self, i: usize) -> u64 {
        let next = self
            .frame_seq
            .get(i + 1)
            .map_or(self.head + 1, |&s| self.base + u64::from(s));
        next - self.frame_first_seq(i)
    }

    /// The frame holding relative seq `rel` (which must be indexed).
    fn frame_of(&self, rel: u32) -> usize {
        // Frame i starts at seq i or later, so the frame of `rel` is at most `rel`; when no
        // frame before it held several events (agents append one at a time), it is `rel`.
        let i = rel as usize;
        if self.frame_seq.get(i) == Some(&rel) {
            return i;
        }
        let upto = (i + 1).min(self.frame_seq.len());
        self.frame_seq[..upto]
            .partition_point(|&s| s <= rel)
            .saturating_sub(1)
    }

    fn pos(&self) -> Pos {
        Pos {
            seg: self.base,
            off: self.end,
        }
    }

    /// Adds one frame's events. Refuses a frame that does not continue the index.
    fn push_frame(
        &mut self,
        off: u64,
        len: u64,
        heads: &[IndexHead],
        run_id: &str,
    ) -> Result<(), String> {
        if heads.is_empty() {
            return Err("frame holds no events".into());
        }
        if off != self.end {
            return Err(format!("frame at {off}, index ends at {}", self.end));
        }
        let mut want = self.head + 1;
        let mut ts = self.last_ts();
        for h in heads {
            if h.seq != want {
                return Err(format!("holds seq {}, expected {want}", h.seq));
            }
            if h.ts.0 < ts {
                return Err(format!("ts {} before the previous {}", h.ts, Ts(ts)));
            }
            if h.run_id != run_id {
                return Err(format!("belongs to run {:?}", h.run_id));
            }
            want += 1;
            ts = h.ts.0;
        }
        let first = heads[0].seq - self.base;
        let last = want - 1 - self.base;
        if last > u64::from(u32::MAX) {
            return Err("segment holds more events than the index can address".into());
        }
        let first = first as u32;
        self.frame_seq.push(first);
        self.frame_off.push(off);
        self.frame_ts.push(ts);
        for (i, h) in heads.iter().enumerate() {
            let rel = first + i as u32;
            push_posting(&mut self.postings[Field::Type as usize], &h.kind, rel);
            push_posting(&mut self.postings[Field::Agent as usize], &h.agent_id, rel);
            push_posting(&mut self.postings[Field::User as usize], &h.user_id, rel);
            if let Some(s) = &h.subject {
                push_posting(&mut self.postings[Field::Subject as usize], s, rel);
            }
        }
        self.head = want - 1;
        self.end = off + len;
        Ok(())
    }

    /// Indexes the frames of the segment in `[self.end, limit)`.
    fn extend(
        &mut self,
        file: &Arc<dyn StorageFile>,
        path: &Path,
        limit: u64,
        run_id: &str,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Extended> {
        let start = self.end;
        let mut r = FrameReader::new(file.clone(), path.to_path_buf(), start, Some(limit))?;
        let mut reported = start;
        let outcome = loop {
            match r.step()? {
                Step::Frame { offset, len } => {
                    let heads: Vec<IndexHead> = match serde_json::from_slice(r.payload()) {
                        Ok(h) => h,
                        Err(e) => {
                            break Extended::Stopped(format!(
                                "bad event JSON at byte {offset}: {e}"
                            ))
                        }
                    };
                    if let Err(reason) = self.push_frame(offset, len, &heads, run_id) {
                        break Extended::Stopped(format!("frame at byte {offset}: {reason}"));
                    }
                    if self.end - reported >= 1 << 20 {
                        progress(self.end - reported);
                        reported = self.end;
                    }
                }
                Step::End { offset, incomplete } => {
                    if incomplete {
                        break Extended::Stopped(format!("incomplete frame at byte {offset}"));
                    }
                    break Extended::Done;
                }
                Step::Corrupt { offset, reason } => {
                    break Extended::Stopped(format!("{reason} at byte {offset}"))
                }
            }
        };
        progress(self.end - reported);
        if self.end > start {
            let (crc, _) = read_frame_header(&**file, path, *self.frame_off.last().unwrap_or(&0))?
                .map_err(|reason| Error::Corrupt {
                    path: path.to_path_buf(),
                    offset: *self.frame_off.last().unwrap_or(&0),
                    seq: self.head,
                    reason,
                })?;
            self.last_crc = crc;
        }
        Ok(outcome)
    }

    /// Checks that the log still holds, where this index ends, the frame it ends with.
    fn check_position(&self, file: &dyn StorageFile, path: &Path) -> Result<Result<(), String>> {
        let len = file.len().ctx("stat", path)?;
        if len < self.end {
            return Ok(Err(format!(
                "segment is {len} bytes, the index covers {}",
                self.end
            )));
        }
        let Some(&last_off) = self.frame_off.last() else {
            return Ok(Ok(()));
        };
        Ok(match read_frame_header(file, path, last_off)? {
            Err(reason) => Err(format!("no frame header at byte {last_off}: {reason}")),
            Ok((crc, flen)) if crc != self.last_crc || last_off + flen != self.end => Err(format!(
                "the frame at byte {last_off} is not the indexed one (crc {crc:08x}, {flen} bytes; \
                 index: crc {:08x}, {} bytes)",
                self.last_crc,
                self.end - last_off
            )),
            Ok(_) => Ok(()),
        })
    }

    /// The indexed seqs (relative) in `[lo, hi]` that carry every key, in order.
    fn hits(&self, keys: &[(Field, &str)], lo: u64, hi: u64) -> Vec<u32> {
        if self.head < self.base || hi < self.base || lo > self.head {
            return Vec::new();
        }
        let lo = (lo.max(self.base) - self.base) as u32;
        let hi = (hi.min(self.head) - self.base) as u32;
        if lo > hi {
            return Vec::new();
        }
        let mut lists: Vec<&[u32]> = Vec::with_capacity(keys.len());
        for (f, key) in keys {
            match self.postings[*f as usize].get(*key) {
                Some(l) => {
                    let a = l.partition_point(|&s| s < lo);
                    let b = l.partition_point(|&s| s <= hi);
                    lists.push(&l[a..b]);
                }
                None => return Vec::new(),
            }
        }
        if lists.is_empty() {
            return (lo..=hi).collect();
        }
        lists.sort_by_key(|l| l.len());
        intersect(&lists)
    }

    /// The last `n` indexed seqs (relative) in `[lo, hi]` that carry every key, in order:
    /// walks the lists from their ends and stops early, so `last 50` costs ~50 steps.
    fn last_hits(&self, keys: &[(Field, &str)], lo: u64, hi: u64, n: usize) -> Vec<u32> {
        if self.head < self.base || hi < self.base || lo > self.head || n == 0 {
            return Vec::new();
        }
        let lo = (lo.max(self.base) - self.base) as u32;
        let hi = (hi.min(self.head) - self.base) as u32;
        if lo > hi {
            return Vec::new();
        }
        let mut lists: Vec<&[u32]> = Vec::with_capacity(keys.len());
        for (f, key) in keys {
            match self.postings[*f as usize].get(*key) {
                Some(l) => {
                    let a = l.partition_point(|&s| s < lo);
                    let b = l.partition_point(|&s| s <= hi);
                    lists.push(&l[a..b]);
                }
                None => return Vec::new(),
            }
        }
        let mut out = Vec::with_capacity(n.min(4096));
        match lists.len() {
            0 => out.extend((lo.max((hi + 1).saturating_sub(n as u32))..=hi).rev()),
            _ => {
                lists.sort_by_key(|l| l.len());
                // `ends[i]`: how many of list i's values are still below the candidate.
                let mut ends: Vec<usize> = lists[1..].iter().map(|l| l.len()).collect();
                'outer: for &x in lists[0].iter().rev() {
                    for (l, end) in lists[1..].iter().zip(ends.iter_mut()) {
                        *end = l[..*end].partition_point(|&v| v <= x);
                        if *end == 0 {
                            break 'outer;
                        }
                        if l[*end - 1] != x {
                            continue 'outer;
                        }
                    }
                    out.push(x);
                    if out.len() == n {
                        break;
                    }
                }
            }
        }
        out.reverse();
        out
    }

    /// Encodes the index file (header and body).
    fn encode(&self, created: u64) -> Vec<u8> {
        let n = self.frames();
        let mut body = Vec::with_capacity(n * 20 + self.events() as usize * 16 + 64);
        for s in &self.frame_seq {
            body.extend_from_slice(&s.to_le_bytes());
        }
        for o in &self.frame_off {
            body.extend_from_slice(&o.to_le_bytes());
        }
        for t in &self.frame_ts {
            body.extend_from_slice(&t.to_le_bytes());
        }
        for f in FIELDS {
            let map = &self.postings[f as usize];
            let mut keys: Vec<&Box<str>> = map.keys().collect();
            keys.sort();
            body.extend_from_slice(&(keys.len() as u32).to_le_bytes());
            for k in keys {
                body.extend_from_slice(&(k.len() as u16).to_le_bytes());
                body.extend_from_slice(k.as_bytes());
                let list = &map[k];
                body.extend_from_slice(&(list.len() as u32).to_le_bytes());
                for s in list {
                    body.extend_from_slice(&s.to_le_bytes());
                }
            }
        }
        let mut out = Vec::with_capacity(INDEX_HEADER_LEN + body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&INDEX_FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&created.to_le_bytes());
        out.extend_from_slice(&self.base.to_le_bytes());
        out.extend_from_slice(&self.end.to_le_bytes());
        out.extend_from_slice(&self.head.to_le_bytes());
        out.extend_from_slice(&self.frame_off.last().copied().unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&self.last_crc.to_le_bytes());
        out.extend_from_slice(&(n as u32).to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        out.extend_from_slice(&[0u8; 8]);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        debug_assert_eq!(out.len(), INDEX_HEADER_LEN);
        out.extend_from_slice(&body);
        out
    }

    /// Decodes and checks an index file: checksums, version, the run and segment it claims
    /// to be for, and the consistency of every table.
    fn decode(b: &[u8], base: u64, created: u64) -> Result<SegIndex, String> {
        let h = decode_header(b)?;
        if h.created != created {
            return Err(format!(
                "built for a run created at {}, this one was created at {}",
                Ts(h.created),
                Ts(created)
            ));
        }
        if h.base != base {
            return Err(format!("for segment base {}, expected {base}", h.base));
        }
        let body = &b[INDEX_HEADER_LEN..];
        if body.len() as u64 != h.body_len {
            return Err(format!(
                "body is {} bytes, header says {}",
                body.len(),
                h.body_len
            ));
        }
        if crc32fast::hash(body) != h.body_crc {
            return Err("body checksum mismatch".into());
        }
        if base == 0 || h.head < base - 1 {
            return Err(format!("head seq {} before segment base {base}", h.head));
        }
        let mut c = Cursor { b: body, at: 0 };
        let n = h.frames as usize;
        let frame_seq = c.u32s(n)?;
        let frame_off = c.u64s(n)?;
        let frame_ts = c.u64s(n)?;
        let events = h.head + 1 - base;
        if n == 0 {
            if events != 0 || h.end != 0 {
                return Err("no frames but events or bytes covered".into());
            }
        } else {
            if frame_seq[0] != 0 || frame_off[0] != 0 {
                return Err("first frame does not start the segment".into());
            }
            let strictly = |v: &[u64]| v.windows(2).all(|w| w[0] < w[1]);
            if !frame_seq.windows(2).all(|w| w[0] < w[1]) || !strictly(&frame_off) {
                return Err("frame table not in order".into());
            }
            if !frame_ts.windows(2).all(|w| w[0] <= w[1]) {
                return Err("frame times go backwards".into());
            }
            if u64::from(frame_seq[n - 1]) >= events || frame_off[n - 1] >= h.end {
                return Err("last frame outside the covered range".into());
            }
            if frame_off[n - 1] != h.last_off {
                return Err("last frame offset disagrees with the header".into());
            }
        }
        let mut postings: [Postings; 4] = Default::default();
        for f in FIELDS {
            let keys = c.u32()? as usize;
            let mut prev: Option<&str> = None;
            let mut total = 0u64;
            let map = &mut postings[f as usize];
            for _ in 0..keys {
                let klen = c.u16()? as usize;
                let kb = c.bytes(klen)?;
                let key = std::str::from_utf8(kb).map_err(|_| "key is not UTF-8".to_string())?;
                if key.is_empty() || prev.is_some_and(|p| p >= key) {
                    return Err("keys not in order".into());
                }
                prev = Some(key);
                let count = c.u32()? as usize;
                let list = c.u32s(count)?;
                if list.is_empty()
                    || !list.windows(2).all(|w| w[0] < w[1])
                    || u64::from(list[count - 1]) >= events
                {
                    return Err(format!("posting list of {key:?} out of order or range"));
                }
                total += count as u64;
                map.insert(key.into(), list);
            }
            let complete = f != Field::Subject;
            if (complete && total != events) || total > events {
                return Err(format!(
                    "postings of section {} hold {total} seqs for {events} events",
                    f as usize
                ));
            }
        }
        if c.at != body.len() {
            return Err("trailing bytes after the postings".into());
        }
        Ok(SegIndex {
            base,
            end: h.end,
            head: h.head,
            last_crc: h.last_crc,
            frame_seq,
            frame_off,
            frame_ts,
            postings,
        })
    }
}

/// The fixed header of an index file.
#[derive(Debug)]
struct Header {
    created: u64,
    base: u64,
    end: u64,
    head: u64,
    last_off: u64,
    last_crc: u32,
    frames: u32,
    body_len: u64,
    body_crc: u32,
}

fn decode_header(b: &[u8]) -> Result<Header, String> {
    if b.len() < INDEX_HEADER_LEN {
        return Err(format!("{} bytes, shorter than the header", b.len()));
    }
    if &b[0..4] != MAGIC {
        return Err("bad magic".into());
    }
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let u64_at = |i: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[i..i + 8]);
        u64::from_le_bytes(a)
    };
    if crc32fast::hash(&b[0..76]) != u32_at(76) {
        return Err("header checksum mismatch".into());
    }
    let version = u32_at(4);
    if version != INDEX_FORMAT_VERSION {
        return Err(format!(
            "format version {version}, this build reads {INDEX_FORMAT_VERSION}"
        ));
    }
    if b[68..76] != [0u8; 8] {
        return Err("reserved header bytes not zero".into());
    }
    Ok(Header {
        created: u64_at(8),
        base: u64_at(16),
        end: u64_at(24),
        head: u64_at(32),
        last_off: u64_at(40),
        last_crc: u32_at(48),
        frames: u32_at(52),
        body_len: u64_at(56),
        body_crc: u32_at(64),
    })
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| format!("body ends inside a table at byte {}", self.at))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16, String> {
        let s = self.bytes(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32, String> {
        let s = self.bytes(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u32s(&mut self, n: usize) -> Result<Vec<u32>, String> {
        let s = self.bytes(n.checked_mul(4).ok_or("table too long")?)?;
        Ok(s.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
    fn u64s(&mut self, n: usize) -> Result<Vec<u64>, String> {
        let s = self.bytes(n.checked_mul(8).ok_or("table too long")?)?;
        Ok(s.chunks_exact(8)
            .map(|c| {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                u64::from_le_bytes(a)
            })
            .collect())
    }
}

/// Reads the CRC field and total length of the frame header at `off`. The outer error is
/// I/O; the inner one says why the bytes are not a frame header.
fn read_frame_header(
    file: &dyn StorageFile,
    path: &Path,
    off: u64,
) -> Result<Result<(u32, u64), String>> {
    let mut h = [0u8; frame::HEADER_LEN];
    match file.read_exact_at(&mut h, off) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Ok(Err("segment ends inside it".into()))
        }
        Err(e) => return Err(e).ctx("read", path),
    }
    if !matches!(frame::decode(&h), frame::Decoded::Incomplete) {
        return Ok(Err("bad frame header".into()));
    }
    let hex = std::str::from_utf8(&h[14..22]).ok();
    let crc = hex.and_then(|s| u32::from_str_radix(s, 16).ok());
    let len = std::str::from_utf8(&h[30..38])
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok());
    match (crc, len) {
        (Some(c), Some(l)) => Ok(Ok((c, frame::frame_len(l) as u64))),
        _ => Ok(Err("bad frame header".into())),
    }
}

/// Intersection of sorted lists, the shortest first: walks the shortest and gallops in the
/// others, so the cost follows the rarest key.
fn intersect(lists: &[&[u32]]) -> Vec<u32> {
    let (first, rest) = match lists.split_first() {
        Some(x) => x,
        None => return Vec::new(),
    };
    let mut cursors = vec![0usize; rest.len()];
    let mut out = Vec::with_capacity(first.len());
    'outer: for &x in first.iter() {
        for (l, c) in rest.iter().zip(cursors.iter_mut()) {
            *c = gallop(l, *c, x);
            if *c >= l.len() {
                break 'outer;
            }
            if l[*c] != x {
                continue 'outer;
            }
        }
        out.push(x);
    }
    out
}

/// First index at or after `from` whose value is `>= x`.
fn gallop(l: &[u32], from: usize, x: u32) -> usize {
    let mut step = 1;
    let mut lo = from;
    let mut hi = from;
    while hi < l.len() && l[hi] < x {
        lo = hi + 1;
        hi += step;
        step *= 2;
    }
    let hi = hi.min(l.len());
    lo + l[lo..hi].partition_point(|&v| v < x)
}

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
    segs: Vec<Arc<SegIndex>>,
    files: Vec<Arc<dyn StorageFile>>,
    cell: Arc<IndexCell>,
    /// The log's segments as last listed: every one up to the covered position.
    bases: Vec<u64>,
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
    fn seq_since(&self, t: Ts) -> u64 {
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
    fn seq_until(&self, t: Ts) -> (u64, u64) {
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
    fn frame_at(&self, seq: u64) -> Option<(usize, usize)> {
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

/// One frame a planned read fetches.
#[derive(Debug)]
pub(crate) struct PlannedFrame {
    pub off: u64,
    pub len: u64,
    pub first_seq: u64,
    pub events: u64,
    pub ts: Ts,
}

/// One contiguous read of a segment covering one or more wanted frames.
pub(crate) struct ReadRun {
    pub seg_base: u64,
    pub file: Arc<dyn StorageFile>,
    pub start: u64,
    pub end: u64,
    pub frames: Vec<PlannedFrame>,
}

impl ReadRun {
    /// The segment's path (built only for error messages: it costs an allocation).
    pub(crate) fn path(&self, dir: &Path) -> PathBuf {
        segment::segment_path(dir, self.seg_base)
    }
}

/// The frames a filtered read must fetch, computed segment by segment from the postings.
pub(crate) struct Plan {
    snap: IndexSnapshot,
    keys: Vec<(Field, String)>,
    lo: u64,
    hi: u64,
    /// Hits up to here surely match the time range; those in `(hi_sure, hi]` may not (a
    /// frame whose events straddle `until`), so `last` does not count them.
    hi_sure: u64,
    /// Next segment (position in the snapshot) whose hits are not computed yet.
    next_seg: usize,
    /// Wanted frames, per segment: (segment position, frame indexes, next to read).
    queue: VecDeque<(usize, Vec<usize>, usize)>,
}

/// The key filters of a read, as index fields.
fn key_filters(opts: &ReadOptions) -> Vec<(Field, String)> {
    let mut keys = Vec::new();
    if let Some(k) = opts.kind {
        keys.push((Field::Type, k.as_str().to_string()));
    }
    if let Some(a) = &opts.agent {
        keys.push((Field::Agent, a.clone()));
    }
    if let Some(u) = &opts.user {
        keys.push((Field::User, u.clone()));
    }
    if let Some(s) = &opts.subject {
        keys.push((Field::Subject, s.clone()));
    }
    keys
}

/// Whether a read gains from the index at all.
pub(crate) fn useful_for(opts: &ReadOptions) -> bool {
    !opts.full_scan
        && (opts.from_seq.is_some_and(|s| s > 1)
            || opts.since.is_some()
            || opts.last.is_some()
            || !key_filters(opts).is_empty())
}

/// How an index-backed read proceeds.
pub(crate) enum Access {
    /// Fetch only the planned frames, then scan what the index does not cover.
    Plan(Plan),
    /// Start scanning at an indexed frame: (segment base, offset, its first seq, ts before).
    Seek(u64, u64, u64, Ts),
    /// Start scanning where the index ends (same fields).
    SeekCovered(u64, u64, u64, Ts),
    /// Nothing to gain: scan.
    Scan,
}

impl Plan {
    /// Chooses how to read with this snapshot.
    pub(crate) fn access(snap: IndexSnapshot, opts: &ReadOptions) -> Access {
        let Some((cov_pos, next_seq, _)) = snap.covered() else {
            return Access::Scan;
        };
        let mut lo = opts.from_seq.unwrap_or(1).max(1);
        let mut hi = opts.to_seq.unwrap_or(u64::MAX);
        let mut hi_sure = hi;
        if let Some(t) = opts.since {
            lo = lo.max(snap.seq_since(t));
        }
        if let Some(t) = opts.until {
            let (sure, maybe) = snap.seq_until(t);
            hi = hi.min(maybe);
            hi_sure = hi_sure.min(sure);
        }
        let keys = key_filters(opts);
        if keys.is_empty() && opts.last.is_none() {
            if lo >= next_seq {
                let ts = Ts(snap.segs.last().map_or(0, |s| s.last_ts()));
                return Access::SeekCovered(cov_pos.seg, cov_pos.off, next_seq, ts);
            }
            return match snap.seek(lo) {
                Some((base, off, first, ts)) if first > 1 => Access::Seek(base, off, first, ts),
                _ => Access::Scan,
            };
        }
        let mut plan = Plan {
            snap,
            keys,
            lo,
            hi,
            hi_sure,
            next_seg: 0,
            queue: VecDeque::new(),
        };
        if let Some(n) = opts.last {
            plan.plan_last(n);
        }
        Access::Plan(plan)
    }

    /// Highest seq the read can return (`u64::MAX` when open).
    pub(crate) fn hi(&self) -> u64 {
        self.hi
    }

    pub(crate) fn snapshot(&self) -> &IndexSnapshot {
        &self.snap
    }

    fn seg_frames(&self, k: usize, hits: &[u32]) -> Vec<usize> {
        let s = &self.snap.segs[k];
        let mut frames: Vec<usize> = Vec::with_capacity(hits.len());
        for &h in hits {
            let i = match frames.last() {
                // Hits ascend; most share or follow the previous frame.
                Some(&p) if s.frame_events(p) + u64::from(s.frame_seq[p]) > u64::from(h) => p,
                _ => s.frame_of(h),
            };
            if frames.last() != Some(&i) {
                frames.push(i);
            }
        }
        frames
    }

    fn keys(&self) -> Vec<(Field, &str)> {
        self.keys.iter().map(|(f, k)| (*f, k.as_str())).collect()
    }

    /// Plans the frames of the last `n` hits, walking segments from the end.
    fn plan_last(&mut self, n: usize) {
        let keys = self.keys();
        let mut need = n;
        let mut parts = Vec::new();
        for k in (0..self.snap.segs.len()).rev() {
            if need == 0 {
                break;
            }
            let s = &self.snap.segs[k];
            // Hits above `hi_sure` may fail the time filter: take them all, uncounted.
            let mut hits = if self.hi > self.hi_sure {
                s.hits(&keys, self.lo.max(self.hi_sure.saturating_add(1)), self.hi)
            } else {
                Vec::new()
            };
            let sure = s.last_hits(&keys, self.lo, self.hi.min(self.hi_sure), need);
            need -= sure.len();
            hits.splice(0..0, sure);
            let frames = self.seg_frames(k, &hits);
            if !frames.is_empty() {
                parts.push((k, frames, 0));
            }
        }
        parts.reverse();
        self.queue = parts.into();
        self.next_seg = self.snap.segs.len();
    }

    /// The next contiguous read, or `None` when every planned frame was handed out.
    pub(crate) fn next_run(&mut self) -> Option<ReadRun> {
        loop {
            if let Some((k, frames, at)) = self.queue.front_mut() {
                if *at < frames.len() {
                    let s = &self.snap.segs[*k];
                    let first = frames[*at];
                    let start = s.frame_off[first];
                    let mut end = s.frame_end(first);
                    let mut planned = Vec::new();
                    while *at < frames.len() {
                        let i = frames[*at];
                        let (off, fend) = (s.frame_off[i], s.frame_end(i));
                        if !planned.is_empty()
                            && (off - end > READ_GAP_BYTES || fend - start > READ_RUN_BYTES_MAX)
                        {
                            break;
                        }
                        planned.push(PlannedFrame {
                            off,
                            len: fend - off,
                            first_seq: s.frame_first_seq(i),
                            events: s.frame_events(i),
                            ts: Ts(s.frame_ts[i]),
                        });
                        end = fend;
                        *at += 1;
                    }
                    return Some(ReadRun {
                        seg_base: s.base,
                        file: self.snap.files[*k].clone(),
                        start,
                        end,
                        frames: planned,
                    });
                }
                self.queue.pop_front();
                continue;
            }
            if self.next_seg >= self.snap.segs.len() {
                return None;
            }
            let k = self.next_seg;
            self.next_seg += 1;
            let s = &self.snap.segs[k];
            if s.base > self.hi {
                self.next_seg = self.snap.segs.len();
                return None;
            }
            let hits = s.hits(&self.keys(), self.lo, self.hi);
            let frames = self.seg_frames(k, &hits);
            if !frames.is_empty() {
                self.queue.push_back((k, frames, 0));
            }
        }
    }
}

/// A run's index as one process holds it: shared by every read of a [`crate::Store`].
pub(crate) struct IndexCell {
    run: String,
    state: Mutex<RunIndex>,
    /// Set by a read that found the index disagreeing with the log.
    invalid: AtomicBool,
}

#[derive(Default)]
struct RunIndex {
    /// Whether the files on disk were consulted.
    loaded: bool,
    /// `run.json`'s creation time: an index of an earlier run of the same name is refused.
    created: u64,
    /// Indexes of a prefix of the log's segments, in order.
    segs: Vec<Arc<SegIndex>>,
    /// Open handles of those segments.
    files: Vec<Arc<dyn StorageFile>>,
    /// Checked index files not yet part of `segs` (their predecessor is not complete yet).
    spare: HashMap<u64, SegIndex>,
    /// Head seq of each segment's file on disk, as far as this process knows.
    persisted: HashMap<u64, u64>,
    /// Segments whose file on disk is bad and must be rewritten.
    rewrite: HashSet<u64>,
    discarded: Vec<String>,
    stopped: Option<String>,
    /// The log's segments at the last slow-path refresh.
    bases: Vec<u64>,
    /// The run's `SYNCED` file, kept open: reading the watermark is one `pread`.
    synced: Option<Box<dyn StorageFile>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How much a refresh writes to disk.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Persist {
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
        let path = dir.join(crate::log::SYNCED_FILE);
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

    fn refresh(
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
        let created = crate::log::read_meta(&**storage, dir)?.created.0;
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
                let expected = match st.segs.last() {
                    None => base,
                    Some(prev) => prev.head + 1,
                };
                if base != expected {
                    st.stopped = Some(format!(
                        "segment {} starts at seq {base}, expected {expected}",
                        path.display()
                    ));
                    break;
                }
                let file: Arc<dyn StorageFile> =
                    Arc::from(storage.open(&path, OpenMode::Read).ctx("open", &path)?);
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
            if st.segs[k].end < limit {
                let seg = Arc::make_mut(&mut st.segs[k]);
                if let Extended::Stopped(reason) =
                    seg.extend(&file, &path, limit, &self.run, progress)?
                {
                    tracing::warn!(segment = %path.display(), reason, "the index stops before the end of the log");
                    st.stopped = Some(format!("{}: {reason}", path.display()));
                    break;
                }
            }
            if st.segs[k].end < limit {
                break;
            }
        }
        self.persist(st, storage, dir, persist)
    }

    fn discard(&self, st: &mut RunIndex, dir: &Path, base: u64, reason: &str) {
        let p = dir.join(INDEX_DIR).join(index_file_name(base));
        tracing::warn!(file = %p.display(), reason, "index file not usable; rebuilding it from the log");
        st.discarded.push(format!("{}: {reason}", p.display()));
        st.rewrite.insert(base);
        st.persisted.remove(&base);
    }

    /// Reads and checks the index files of the log's segments into `spare`.
    fn load_files(
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
    fn check_segments(&self, st: &mut RunIndex, dir: &Path, bases: &[u64]) -> Result<()> {
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

    fn persist(
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

    fn write_files(
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
fn read_file(storage: &dyn Storage, p: &Path) -> Result<Result<Vec<u8>, String>> {
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
fn file_head(storage: &dyn Storage, p: &Path, base: u64, created: u64) -> Result<Option<u64>> {
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

fn remove_index_files(storage: &Arc<dyn Storage>, dir: &Path) -> Result<()> {
    let idx_dir = dir.join(INDEX_DIR);
    if !storage.exists(&idx_dir) {
        return Ok(());
    }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head<'a>(
        seq: u64,
        ts: u64,
        agent: &'a str,
        kind: &'a str,
        subject: Option<&'a str>,
    ) -> IndexHead<'a> {
        IndexHead {
            run_id: "r".into(),
            seq,
            ts: Ts(ts),
            agent_id: agent.into(),
            user_id: "u".into(),
            kind: kind.into(),
            subject: subject.map(Cow::Borrowed),
        }
    }

    fn sample() -> SegIndex {
        let mut s = SegIndex::new(10);
        s.push_frame(0, 100, &[head(10, 5, "a", "evidence", Some("db"))], "r")
            .unwrap();
        s.push_frame(
            100,
            150,
            &[
                head(11, 6, "b", "decision", None),
                head(12, 6, "a", "evidence", Some("web")),
            ],
            "r",
        )
        .unwrap();
        s.push_frame(250, 80, &[head(13, 9, "a", "hypothesis", Some("db"))], "r")
            .unwrap();
        s.last_crc = 0xdeadbeef;
        s
    }

    #[test]
    fn roundtrip() {
        let s = sample();
        let b = s.encode(42);
        assert_eq!(SegIndex::decode(&b, 10, 42).unwrap(), s);
        // Deterministic: the same index encodes to the same bytes.
        assert_eq!(SegIndex::decode(&b, 10, 42).unwrap().encode(42), b);
    }

    #[test]
    fn refuses_push_that_does_not_follow() {
        let mut s = sample();
        assert!(s
            .push_frame(330, 10, &[head(15, 9, "a", "evidence", None)], "r")
            .is_err());
        assert!(s
            .push_frame(330, 10, &[head(14, 8, "a", "evidence", None)], "r")
            .is_err());
        assert!(s
            .push_frame(331, 10, &[head(14, 9, "a", "evidence", None)], "r")
            .is_err());
        let mut other = head(14, 9, "a", "evidence", None);
        other.run_id = "x".into();
        assert!(s.push_frame(330, 10, &[other], "r").is_err());
        assert_eq!(s, sample());
    }

    #[test]
    fn every_bit_flip_and_truncation_is_refused() {
        let b = sample().encode(42);
        for i in 0..b.len() {
            for bit in 0..8 {
                let mut c = b.clone();
                c[i] ^= 1 << bit;
                assert!(
                    SegIndex::decode(&c, 10, 42).is_err(),
                    "flip at {i} bit {bit}"
                );
            }
        }
        for cut in 0..b.len() {
            assert!(SegIndex::decode(&b[..cut], 10, 42).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn refuses_other_version_run_and_segment() {
        let mut b = sample().encode(42);
        assert!(SegIndex::decode(&b, 11, 42)
            .unwrap_err()
            .contains("segment base"));
        assert!(SegIndex::decode(&b, 10, 43)
            .unwrap_err()
            .contains("created"));
        b[4..8].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32fast::hash(&b[0..76]);
        b[76..80].copy_from_slice(&crc.to_le_bytes());
        assert!(SegIndex::decode(&b, 10, 42)
            .unwrap_err()
            .contains("version 2"));
    }

    #[test]
    fn hits_intersect_and_clip() {
        let s = sample();
        let k = |f, v: &'static str| (f, v);
        assert_eq!(s.hits(&[k(Field::Agent, "a")], 0, u64::MAX), vec![0, 2, 3]);
        assert_eq!(
            s.hits(
                &[k(Field::Agent, "a"), k(Field::Type, "evidence")],
                0,
                u64::MAX
            ),
            vec![0, 2]
        );
        assert_eq!(
            s.hits(
                &[k(Field::Agent, "a"), k(Field::Subject, "db")],
                11,
                u64::MAX
            ),
            vec![3]
        );
        assert_eq!(
            s.hits(&[k(Field::Agent, "zz")], 0, u64::MAX),
            Vec::<u32>::new()
        );
        assert_eq!(s.hits(&[], 11, 12), vec![1, 2]);
        assert_eq!(s.frame_of(2), 1);
        assert_eq!(s.frame_of(3), 2);
        assert_eq!(s.frame_events(1), 2);
    }

    /// Pins the byte format of docs/index.md: the expected bytes are written out field by
    /// field from the documented layout, independently of `encode`.
    #[test]
    fn golden_bytes() {
        let s = sample();
        let mut body = Vec::new();
        for v in [0u32, 1, 3] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        for v in [0u64, 100, 250] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        for v in [5u64, 6, 9] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        let section = |body: &mut Vec<u8>, keys: &[(&str, &[u32])]| {
            body.extend_from_slice(&(keys.len() as u32).to_le_bytes());
            for (k, list) in keys {
                body.extend_from_slice(&(k.len() as u16).to_le_bytes());
                body.extend_from_slice(k.as_bytes());
                body.extend_from_slice(&(list.len() as u32).to_le_bytes());
                for v in *list {
                    body.extend_from_slice(&v.to_le_bytes());
                }
            }
        };
        section(
            &mut body,
            &[
                ("decision", &[1]),
                ("evidence", &[0, 2]),
                ("hypothesis", &[3]),
            ],
        );
        section(&mut body, &[("a", &[0, 2, 3]), ("b", &[1])]);
        section(&mut body, &[("u", &[0, 1, 2, 3])]);
        section(&mut body, &[("db", &[0, 3]), ("web", &[2])]);
        let mut want = Vec::new();
        want.extend_from_slice(b"SWIX");
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(&42u64.to_le_bytes()); // run created
        want.extend_from_slice(&10u64.to_le_bytes()); // base
        want.extend_from_slice(&330u64.to_le_bytes()); // covered end
        want.extend_from_slice(&13u64.to_le_bytes()); // head seq
        want.extend_from_slice(&250u64.to_le_bytes()); // last frame offset
        want.extend_from_slice(&0xdeadbeefu32.to_le_bytes()); // last frame crc
        want.extend_from_slice(&3u32.to_le_bytes()); // frames
        want.extend_from_slice(&(body.len() as u64).to_le_bytes());
        want.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        want.extend_from_slice(&[0u8; 8]);
        let crc = crc32fast::hash(&want);
        want.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(want.len(), INDEX_HEADER_LEN);
        want.extend_from_slice(&body);
        assert_eq!(s.encode(42), want);
    }

    proptest::proptest! {
        /// Random bytes and random damage never make the decoder panic or accept garbage
        /// silently (a bounded stand-in for a fuzz target).
        #[test]
        fn decode_never_panics(
            noise in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
            edits in proptest::collection::vec((proptest::prelude::any::<u16>(), proptest::prelude::any::<u8>()), 1..8),
        ) {
            let _ = SegIndex::decode(&noise, 10, 42);
            let mut b = sample().encode(42);
            for (at, v) in edits {
                let i = at as usize % b.len();
                b[i] = v;
            }
            if let Ok(s) = SegIndex::decode(&b, 10, 42) {
                // Only an edit that changed nothing can pass every check.
                proptest::prop_assert_eq!(s, sample());
            }
        }
    }

    #[test]
    fn intersect_matches_naive() {
        let a: Vec<u32> = (0..1000).filter(|x| x % 3 == 0).collect();
        let b: Vec<u32> = (0..1000).filter(|x| x % 5 == 0).collect();
        let c: Vec<u32> = (0..1000).filter(|x| x % 7 != 0).collect();
        let want: Vec<u32> = (0..1000).filter(|x| x % 15 == 0 && x % 7 != 0).collect();
        assert_eq!(intersect(&[&b, &a, &c]), want);
        assert_eq!(gallop(&a, 0, 1000), a.len());
        assert_eq!(gallop(&a, 5, 0), 5);
    }
}
