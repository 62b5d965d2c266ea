//! One segment's index in memory ([`SegIndex`]: frames and postings) and its file format
//! (`index/<base>.idx`; byte-exact in `docs/index.md`): encode, decode, checks.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use crate::error::{Error, IoContext, Result};
use crate::event::ts::Ts;
use crate::log::frame;
use crate::log::segment::{self, FrameReader, Step};
use crate::log::storage::{Storage, StorageFile};
use crate::log::watermark::Pos;

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
pub(crate) const READ_GAP_BYTES: u64 = 4096;
/// Largest single read of several frames.
pub(crate) const READ_RUN_BYTES_MAX: u64 = 1 << 20;

pub(crate) const MAGIC: &[u8; 4] = b"SWIX";
pub(crate) const LOCK_FILE: &str = "LOCK";

/// The indexed fields, in the order of their sections in an index file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Field {
    Type = 0,
    Agent = 1,
    User = 2,
    Subject = 3,
}

pub(crate) const FIELDS: [Field; 4] = [Field::Type, Field::Agent, Field::User, Field::Subject];

/// Index file name of the segment whose first seq is `base`.
pub fn index_file_name(base: u64) -> String {
    format!("{}.idx", segment::segment_name(base))
}

pub(crate) fn parse_index_file_name(name: &str) -> Option<u64> {
    segment::parse_segment_name(name.strip_suffix(".idx")?)
}

pub(crate) type Postings = HashMap<Box<str>, Vec<u32>>;

/// The index of one segment. Seqs are stored relative to the segment's base (a segment
/// holds far fewer than 2^32 events), which halves the memory of the postings.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SegIndex {
    pub(crate) base: u64,
    /// Offset just after the last indexed frame.
    pub(crate) end: u64,
    /// Last indexed seq (`base - 1` when no frame is indexed).
    pub(crate) head: u64,
    /// CRC-32 written in the header of the last indexed frame.
    pub(crate) last_crc: u32,
    /// Per frame: first seq minus base, byte offset, ts of its last event (micros).
    pub(crate) frame_seq: Vec<u32>,
    pub(crate) frame_off: Vec<u64>,
    pub(crate) frame_ts: Vec<u64>,
    pub(crate) postings: [Postings; 4],
}

/// The fields of a stored event the index needs, parsed without the rest.
#[derive(Deserialize)]
pub(crate) struct IndexHead<'a> {
    #[serde(borrow)]
    pub(crate) run_id: Cow<'a, str>,
    pub(crate) seq: u64,
    pub(crate) ts: Ts,
    #[serde(borrow)]
    pub(crate) agent_id: Cow<'a, str>,
    #[serde(borrow)]
    pub(crate) user_id: Cow<'a, str>,
    #[serde(borrow, rename = "type")]
    pub(crate) kind: Cow<'a, str>,
    #[serde(borrow, default)]
    pub(crate) subject: Option<Cow<'a, str>>,
}

/// How [`Extended::Stopped`]'s reason starts at quarantined damage (known and declared
/// lost: not worth a warning on every read).
pub(crate) const QUARANTINED: &str = "quarantined damage: ";

/// How an extension of a segment's index ended.
pub(crate) enum Extended {
    /// Reached the limit.
    Done,
    /// Stopped before the limit: damage, a torn frame, or a frame that does not follow.
    /// The reason starts with [`QUARANTINED`] at damage `swarm repair` quarantined.
    Stopped(String),
}

pub(crate) fn push_posting(map: &mut Postings, key: &str, rel: u32) {
    match map.get_mut(key) {
        Some(list) => list.push(rel),
        None => {
            map.insert(key.into(), vec![rel]);
        }
    }
}

impl SegIndex {
    pub(crate) fn new(base: u64) -> SegIndex {
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

    pub(crate) fn events(&self) -> u64 {
        self.head + 1 - self.base
    }

    pub(crate) fn frames(&self) -> usize {
        self.frame_seq.len()
    }

    pub(crate) fn last_ts(&self) -> u64 {
        self.frame_ts.last().copied().unwrap_or(0)
    }

    pub(crate) fn frame_end(&self, i: usize) -> u64 {
        self.frame_off.get(i + 1).copied().unwrap_or(self.end)
    }

    pub(crate) fn frame_first_seq(&self, i: usize) -> u64 {
        self.base + u64::from(self.frame_seq[i])
    }

    pub(crate) fn frame_events(&self, i: usize) -> u64 {
        let next = self
            .frame_seq
            .get(i + 1)
            .map_or(self.head + 1, |&s| self.base + u64::from(s));
        next - self.frame_first_seq(i)
    }

    /// The frame holding relative seq `rel` (which must be indexed).
    pub(crate) fn frame_of(&self, rel: u32) -> usize {
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

    pub(crate) fn pos(&self) -> Pos {
        Pos {
            seg: self.base,
            off: self.end,
        }
    }

    /// Adds one frame's events. Refuses a frame that does not continue the index.
    pub(crate) fn push_frame(
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
    /// Whether damage met is quarantined is read from `storage` (`swarm repair`).
    pub(crate) fn extend(
        &mut self,
        (file, storage): (&Arc<dyn StorageFile>, &dyn Storage),
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
                    // An older segment cut inside a frame, the seqs from its last whole
                    // frame on listed as lost (`swarm repair`): it ends there.
                    let dir = path.parent().unwrap_or(Path::new("."));
                    let listed = incomplete
                        && crate::log::quarantine::read(storage, dir).cut_at(
                            self.base,
                            offset,
                            self.head + 1,
                        );
                    if incomplete && !listed {
                        break Extended::Stopped(format!("incomplete frame at byte {offset}"));
                    }
                    break Extended::Done;
                }
                Step::Corrupt { offset, reason } => {
                    // Frames are indexed contiguously: the index ends at damage, even
                    // damage `swarm repair` quarantined (reads scan on past it).
                    let dir = path.parent().unwrap_or(Path::new("."));
                    let quarantined = crate::log::quarantine::read(storage, dir)
                        .at(self.base, offset)
                        .is_some();
                    let what = if quarantined { QUARANTINED } else { "" };
                    break Extended::Stopped(format!("{what}{reason} at byte {offset}"));
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
    pub(crate) fn check_position(
        &self,
        file: &dyn StorageFile,
        path: &Path,
    ) -> Result<Result<(), String>> {
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

    /// The posting lists of `keys` clipped to `[lo, hi]` (relative seqs), shortest
    /// first, with the clipped bounds; `None` when nothing can match (a key has no
    /// postings, or the range misses this segment).
    pub(crate) fn lists_in(
        &self,
        keys: &[(Field, &str)],
        lo: u64,
        hi: u64,
    ) -> Option<(Vec<&[u32]>, u32, u32)> {
        if self.head < self.base || hi < self.base || lo > self.head {
            return None;
        }
        let lo = (lo.max(self.base) - self.base) as u32;
        let hi = (hi.min(self.head) - self.base) as u32;
        if lo > hi {
            return None;
        }
        let mut lists: Vec<&[u32]> = Vec::with_capacity(keys.len());
        for (f, key) in keys {
            let l = self.postings[*f as usize].get(*key)?;
            let a = l.partition_point(|&s| s < lo);
            let b = l.partition_point(|&s| s <= hi);
            lists.push(&l[a..b]);
        }
        lists.sort_by_key(|l| l.len());
        Some((lists, lo, hi))
    }

    /// The indexed seqs (relative) in `[lo, hi]` that carry every key, in order.
    pub(crate) fn hits(&self, keys: &[(Field, &str)], lo: u64, hi: u64) -> Vec<u32> {
        match self.lists_in(keys, lo, hi) {
            None => Vec::new(),
            Some((lists, lo, hi)) if lists.is_empty() => (lo..=hi).collect(),
            Some((lists, _, _)) => intersect(&lists),
        }
    }

    /// The last `n` indexed seqs (relative) in `[lo, hi]` that carry every key, in order:
    /// walks the lists from their ends and stops early, so `last 50` costs ~50 steps.
    pub(crate) fn last_hits(&self, keys: &[(Field, &str)], lo: u64, hi: u64, n: usize) -> Vec<u32> {
        let Some((lists, lo, hi)) = self.lists_in(keys, lo, hi).filter(|_| n > 0) else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(n.min(4096));
        match lists.len() {
            0 => out.extend((lo.max((hi + 1).saturating_sub(n as u32))..=hi).rev()),
            _ => {
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
    pub(crate) fn encode(&self, created: u64) -> Vec<u8> {
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
    pub(crate) fn decode(b: &[u8], base: u64, created: u64) -> Result<SegIndex, String> {
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
pub(crate) struct Header {
    pub(crate) created: u64,
    pub(crate) base: u64,
    pub(crate) end: u64,
    pub(crate) head: u64,
    pub(crate) last_off: u64,
    pub(crate) last_crc: u32,
    pub(crate) frames: u32,
    pub(crate) body_len: u64,
    pub(crate) body_crc: u32,
}

pub(crate) fn decode_header(b: &[u8]) -> Result<Header, String> {
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

pub(crate) struct Cursor<'a> {
    pub(crate) b: &'a [u8],
    pub(crate) at: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| format!("body ends inside a table at byte {}", self.at))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    pub(crate) fn u16(&mut self) -> Result<u16, String> {
        let s = self.bytes(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, String> {
        let s = self.bytes(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    pub(crate) fn u32s(&mut self, n: usize) -> Result<Vec<u32>, String> {
        let s = self.bytes(n.checked_mul(4).ok_or("table too long")?)?;
        Ok(s.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
    pub(crate) fn u64s(&mut self, n: usize) -> Result<Vec<u64>, String> {
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
pub(crate) fn read_frame_header(
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
pub(crate) fn intersect(lists: &[&[u32]]) -> Vec<u32> {
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
pub(crate) fn gallop(l: &[u32], from: usize, x: u32) -> usize {
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
