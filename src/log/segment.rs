//! Segment files: naming, listing, and a streaming frame reader.
//!
//! A run's log is a sequence of segment files `seg-<first seq, 20 digits>.jsonl`; the
//! name sorts in log order and tells which segment holds a seq without opening it.
//!
//! The active (last) segment is *preallocated*: writers zero-fill it ahead of its last
//! frame in chunks, so that a durable append overwrites blocks that already exist and
//! its `fdatasync` changes no file size. A frame never holds a zero byte (its payload is
//! compact JSON), so a zero byte where a frame should start is the fill, the end of the
//! log's bytes. A reader checks that only zero bytes follow it ([`FrameReader`]); a
//! writer catching up under the append lock may trust it ([`FrameReader::trust_fill`]).
//! A sealed segment is trimmed to its last frame at rotation.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{IoContext, Result};
use crate::log::frame::{self, Decoded};
use crate::log::storage::{OpenMode, Storage, StorageFile};

/// File name of the segment whose first event has seq `base`.
pub fn segment_name(base: u64) -> String {
    format!("seg-{base:020}.jsonl")
}

/// Parses a segment file name back to its base seq.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("seg-")?.strip_suffix(".jsonl")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether a run directory's log holds records: more than one segment, or a first
/// segment with bytes. An empty first segment alone is a run being created (the segment
/// comes before `run.json`), or a creation cut short. With records but no `run.json`, the
/// run is damaged, not absent (and not to be created anew over its log).
pub(crate) fn log_holds_records(storage: &dyn Storage, run_dir: &Path) -> Result<bool> {
    if !storage.exists(run_dir) {
        return Ok(false);
    }
    Ok(match list_segments(storage, run_dir)?.as_slice() {
        [] => false,
        [1] => crate::log::storage::file_len(storage, &segment_path(run_dir, 1))? > 0,
        _ => true,
    })
}

/// The base seqs of a run's segments, in order.
pub fn list_segments(storage: &dyn Storage, run_dir: &Path) -> Result<Vec<u64>> {
    let mut bases: Vec<u64> = storage
        .list(run_dir)
        .ctx("list", run_dir)?
        .iter()
        .filter_map(|n| parse_segment_name(n))
        .collect();
    bases.sort_unstable();
    Ok(bases)
}

/// Path of a segment.
pub fn segment_path(run_dir: &Path, base: u64) -> PathBuf {
    run_dir.join(segment_name(base))
}

/// One step of a [`FrameReader`].
#[derive(Debug)]
pub enum Step {
    /// A whole frame at `offset`; its payload is in `FrameReader::payload()`.
    Frame {
        /// Byte offset of the frame in the segment.
        offset: u64,
        /// Bytes the frame occupies.
        len: u64,
    },
    /// The end of the readable bytes: `incomplete` is true when bytes follow that may be a
    /// frame still being written (or a torn one).
    End {
        /// Offset just after the last whole frame.
        offset: u64,
        /// Whether unreadable bytes follow.
        incomplete: bool,
    },
    /// Bytes at `offset` are not a frame.
    Corrupt {
        /// Byte offset of the damage.
        offset: u64,
        /// Which check failed.
        reason: &'static str,
    },
}

/// Reads frames from a segment in order, in chunks, up to a byte limit.
///
/// It never holds more than one chunk plus one frame in memory, and it never reads or
/// allocates past `limit` (at most the file's length), whatever a damaged length says.
pub struct FrameReader {
    file: Arc<dyn StorageFile>,
    path: PathBuf,
    buf: Vec<u8>,
    /// File offset of `buf[0]`.
    buf_off: u64,
    /// Index in `buf` of the next unread byte.
    at: usize,
    limit: u64,
    payload: std::ops::Range<usize>,
    /// Bytes read at a time.
    chunk: usize,
    /// A zero byte where a frame starts ends the log without checking what follows.
    trust_fill: bool,
}

const CHUNK: usize = 1 << 20;

/// The fill byte of a preallocated segment.
pub const FILL: u8 = 0;

impl FrameReader {
    /// Opens `path` and reads from `offset` up to `limit` (`None`: the file's length now).
    pub fn open(
        storage: &dyn Storage,
        path: &Path,
        offset: u64,
        limit: Option<u64>,
    ) -> Result<Self> {
        let file: Arc<dyn StorageFile> =
            Arc::from(storage.open(path, OpenMode::Read).ctx("open", path)?);
        FrameReader::new(file, path.to_path_buf(), offset, limit)
    }

    /// Reads from an open file.
    pub fn new(
        file: Arc<dyn StorageFile>,
        path: PathBuf,
        offset: u64,
        limit: Option<u64>,
    ) -> Result<Self> {
        let len = file.len().ctx("stat", &path)?;
        let limit = limit.map_or(len, |l| l.min(len));
        Ok(FrameReader {
            file,
            path,
            buf: Vec::new(),
            buf_off: offset,
            at: 0,
            limit,
            payload: 0..0,
            chunk: CHUNK,
            trust_fill: false,
        })
    }

    /// Reads from an open file up to its end, whatever its length then, without a
    /// `stat` (see `commit::recovery`: a stat of the active segment slows the next
    /// `fdatasync`). The end is where a read returns nothing.
    pub fn unbounded(file: Arc<dyn StorageFile>, path: PathBuf, offset: u64) -> Self {
        FrameReader {
            file,
            path,
            buf: Vec::new(),
            buf_off: offset,
            at: 0,
            limit: u64::MAX,
            payload: 0..0,
            chunk: CHUNK,
            trust_fill: false,
        }
    }

    /// Reads `chunk` bytes at a time instead of 1 MiB: a writer catching up on a few
    /// frames ahead of a preallocated region reads little of the fill.
    pub fn with_chunk(mut self, chunk: usize) -> Self {
        self.chunk = chunk.max(frame::HEADER_LEN);
        self
    }

    /// Takes a zero byte at a frame's start as the end of the log without reading the
    /// rest of the segment, and a frame cut by zero bytes as a torn write, wherever more
    /// bytes follow. Only for a writer holding the append lock on a log it has already
    /// checked: its live peers write each group with one `pwrite`, whose bytes reach the
    /// file in order, so a process killed mid-write leaves a prefix and zeros after it.
    pub fn trust_fill(mut self) -> Self {
        self.trust_fill = true;
        self
    }

    /// The path being read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Offset of the next unread byte.
    pub fn offset(&self) -> u64 {
        self.buf_off + self.at as u64
    }

    /// The payload of the frame returned by the last `Step::Frame`.
    pub fn payload(&self) -> &[u8] {
        &self.buf[self.payload.clone()]
    }

    /// Reads more bytes so that at least `want` unread bytes are buffered, if the limit
    /// allows. Returns false when no more bytes can be read.
    fn fill(&mut self, want: usize) -> Result<bool> {
        let avail_in_file = self
            .limit
            .saturating_sub(self.buf_off + self.buf.len() as u64);
        if avail_in_file == 0 {
            return Ok(false);
        }
        // Drop consumed bytes first.
        if self.at > 0 {
            self.buf.drain(..self.at);
            self.buf_off += self.at as u64;
            self.at = 0;
        }
        let need = want.saturating_sub(self.buf.len()).max(self.chunk);
        let n = (need as u64).min(avail_in_file) as usize;
        let start = self.buf.len();
        self.buf.resize(start + n, 0);
        let mut got = 0;
        while got < n {
            let r = self
                .file
                .read_at(
                    &mut self.buf[start + got..],
                    self.buf_off + (start + got) as u64,
                )
                .ctx("read", &self.path)?;
            if r == 0 {
                break;
            }
            got += r;
        }
        self.buf.truncate(start + got);
        if got == 0 {
            // The file shrank under us; stop at what we have.
            self.limit = self.buf_off + self.buf.len() as u64;
            return Ok(false);
        }
        Ok(true)
    }

    /// The next frame, the end, or damage.
    pub fn step(&mut self) -> Result<Step> {
        let mut rereads = 0;
        loop {
            let unread = &self.buf[self.at..];
            // `None`: a prefix of a frame; `Some(reason)`: not a frame.
            let (corrupt, extent) = match frame::decode(unread) {
                Decoded::Frame { payload, len } => {
                    let start = self.at + frame::HEADER_LEN;
                    self.payload = start..start + payload.len();
                    let offset = self.offset();
                    self.at += len;
                    return Ok(Step::Frame {
                        offset,
                        len: len as u64,
                    });
                }
                Decoded::Incomplete => (None, declared_extent(unread)),
                Decoded::Corrupt(reason) => (Some(reason), declared_extent(unread)),
            };
            // A zero byte where the frame should be: the preallocated fill, or a frame
            // torn by it (a write in progress or cut short, like bytes ending at EOF).
            let nul = memchr::memchr(FILL, &unread[..extent.min(unread.len())]);
            if let Some(nul) = nul {
                let offset = self.offset();
                if self.trust_fill || self.only_fill_from(self.at + nul)? {
                    return Ok(Step::End {
                        offset,
                        incomplete: nul > 0,
                    });
                }
                // Bytes follow the zeros: a writer writing there right now (its bytes
                // reach the file in order, so the first zero we saw is gone when read
                // again), or a crash's leftovers (pages that reached the disk out of
                // order), which stay. Read again from the frame's start while it moves.
                let mut b = [0u8; 1];
                let now = self
                    .file
                    .read_at(&mut b, offset + nul as u64)
                    .ctx("read", &self.path)?;
                if now == 1 && b[0] != FILL && rereads < 8 {
                    rereads += 1;
                    self.buf.truncate(self.at);
                    continue;
                }
                return Ok(Step::Corrupt {
                    offset,
                    reason: match (corrupt, nul) {
                        (_, 0) => "bytes after the zero fill",
                        (Some(reason), _) => reason,
                        (None, _) => "zero bytes inside a frame",
                    },
                });
            }
            if let Some(reason) = corrupt {
                return Ok(Step::Corrupt {
                    offset: self.offset(),
                    reason,
                });
            }
            if !self.fill(extent)? {
                let offset = self.offset();
                let incomplete = !self.buf[self.at..].is_empty();
                return Ok(Step::End { offset, incomplete });
            }
        }
    }

    /// Whether every byte from `buf[at]` to the limit is the fill byte. Reads the rest of
    /// the segment in chunks without keeping it.
    fn only_fill_from(&mut self, at: usize) -> Result<bool> {
        if self.buf[at..].iter().any(|&b| b != FILL) {
            return Ok(false);
        }
        let mut pos = self.buf_off + self.buf.len() as u64;
        let mut tmp = vec![0u8; (64 << 10).min(self.limit.saturating_sub(pos)) as usize];
        while pos < self.limit {
            let want = (tmp.len() as u64).min(self.limit - pos) as usize;
            let n = self
                .file
                .read_at(&mut tmp[..want], pos)
                .ctx("read", &self.path)?;
            if n == 0 {
                break;
            }
            if tmp[..n].iter().any(|&b| b != FILL) {
                return Ok(false);
            }
            pos += n as u64;
        }
        Ok(true)
    }

    /// After a `Step::Corrupt`, looks for the next whole frame up to the limit and moves
    /// there. Returns its offset, or `None` (and moves to the limit) when none follows.
    pub fn skip_to_next_frame(&mut self) -> Result<Option<u64>> {
        loop {
            if let Some(rel) = frame::find_next_frame(&self.buf[self.at..]) {
                self.at += rel;
                return Ok(Some(self.offset()));
            }
            // Keep the last header's worth of bytes: a frame may start in them.
            let keep = frame::HEADER_LEN.min(self.buf.len() - self.at);
            let skip_to = self.buf.len() - keep;
            let want = keep + CHUNK;
            self.at = skip_to.max(self.at);
            if !self.fill(want)? {
                // A frame that starts in the kept bytes but is not whole is not a frame.
                self.at = self.buf.len();
                return Ok(None);
            }
        }
    }

    /// Bytes in `[offset, limit)`: used to save a torn tail before truncating it.
    pub fn read_range(&self, from: u64, to: u64) -> Result<Vec<u8>> {
        let mut v = vec![0u8; (to - from) as usize];
        self.file
            .read_exact_at(&mut v, from)
            .ctx("read", &self.path)?;
        Ok(v)
    }
}

/// How many bytes the frame starting at `unread[0]` needs: its declared length when the
/// header is whole (the decoder checked it, so it is bounded), else a header's worth.
fn declared_extent(unread: &[u8]) -> usize {
    if unread.len() >= frame::HEADER_LEN {
        let len: Option<usize> = std::str::from_utf8(&unread[30..38])
            .ok()
            .and_then(|s| s.trim().parse().ok());
        if let Some(len) = len.filter(|&l| l <= frame::PAYLOAD_BYTES_MAX) {
            return frame::frame_len(len);
        }
    }
    frame::HEADER_LEN
}

/// The end of the bytes of `[from, len)` that are not the fill: the offset just past the
/// last non-zero byte, or `from` when there is none. Reads backwards from `len`, so it
/// costs about the size of the preallocated region.
pub fn content_end(file: &dyn StorageFile, from: u64, len: u64) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 64 << 10];
    let mut end = len;
    while end > from {
        let start = end.saturating_sub(buf.len() as u64).max(from);
        let chunk = &mut buf[..(end - start) as usize];
        file.read_exact_at(chunk, start)?;
        if let Some(i) = chunk.iter().rposition(|&b| b != FILL) {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::storage::MemStorage;

    #[test]
    fn names_sort_and_parse() {
        assert_eq!(segment_name(1), "seg-00000000000000000001.jsonl");
        assert_eq!(parse_segment_name(&segment_name(123456)), Some(123456));
        assert_eq!(parse_segment_name("seg-1.jsonl"), None);
        assert_eq!(
            parse_segment_name("seg-00000000000000000001.jsonl.5.broken"),
            None
        );
    }

    #[test]
    fn reads_frames_across_chunks_and_reports_tail() {
        let s = MemStorage::new();
        let dir = Path::new("/r");
        s.create_dir_all(dir).unwrap();
        let p = dir.join("seg");
        let f = s.open(&p, OpenMode::CreateNew).unwrap();
        let mut bytes = Vec::new();
        let big = format!("[\"{}\"]", "x".repeat(3 * CHUNK));
        frame::encode(b"[1]", &mut bytes);
        frame::encode(big.as_bytes(), &mut bytes);
        frame::encode(b"[3]", &mut bytes);
        bytes.extend_from_slice(b"{\"f\":1,\"cr");
        f.write_all_at(&bytes, 0).unwrap();
        let mut r = FrameReader::open(&s, &p, 0, None).unwrap();
        let mut payloads = Vec::new();
        loop {
            match r.step().unwrap() {
                Step::Frame { .. } => payloads.push(r.payload().len()),
                Step::End { incomplete, .. } => {
                    assert!(incomplete);
                    break;
                }
                Step::Corrupt { .. } => panic!("corrupt"),
            }
        }
        assert_eq!(payloads, vec![3, big.len(), 3]);
    }

    fn steps(r: &mut FrameReader) -> (usize, Step) {
        let mut frames = 0;
        loop {
            match r.step().unwrap() {
                Step::Frame { .. } => frames += 1,
                other => return (frames, other),
            }
        }
    }

    fn file_with(bytes: &[u8]) -> (MemStorage, PathBuf) {
        let s = MemStorage::new();
        let dir = Path::new("/r");
        s.create_dir_all(dir).unwrap();
        let p = dir.join("seg");
        let f = s.open(&p, OpenMode::CreateNew).unwrap();
        f.write_all_at(bytes, 0).unwrap();
        (s, p)
    }

    #[test]
    fn zero_fill_ends_the_log() {
        let mut bytes = Vec::new();
        frame::encode(b"[1]", &mut bytes);
        frame::encode(b"[2]", &mut bytes);
        let end = bytes.len() as u64;
        bytes.resize(bytes.len() + 3 * CHUNK + 7, FILL);
        let (s, p) = file_with(&bytes);
        for trust in [false, true] {
            let mut r = FrameReader::open(&s, &p, 0, None).unwrap();
            if trust {
                r = r.with_chunk(4096).trust_fill();
            }
            match steps(&mut r) {
                (2, Step::End { offset, incomplete }) => {
                    assert_eq!(offset, end);
                    assert!(!incomplete);
                }
                other => panic!("{other:?}"),
            }
        }
        let f = s.open(&p, OpenMode::Read).unwrap();
        assert_eq!(content_end(&*f, 0, bytes.len() as u64).unwrap(), end);
        assert_eq!(
            content_end(&*f, end + 5, bytes.len() as u64).unwrap(),
            end + 5
        );
    }

    #[test]
    fn a_frame_cut_by_the_fill_is_incomplete() {
        let mut bytes = Vec::new();
        frame::encode(b"[1]", &mut bytes);
        let end = bytes.len() as u64;
        let mut torn = Vec::new();
        frame::encode(b"[2,3,4]", &mut torn);
        // Cut in the header and in the payload.
        for cut in [5, frame::HEADER_LEN + 3] {
            let mut b = bytes.clone();
            b.extend_from_slice(&torn[..cut]);
            b.resize(b.len() + 10_000, FILL);
            let (s, p) = file_with(&b);
            let mut r = FrameReader::open(&s, &p, 0, None).unwrap();
            match steps(&mut r) {
                (1, Step::End { offset, incomplete }) => {
                    assert_eq!(offset, end);
                    assert!(incomplete, "cut at {cut}");
                }
                other => panic!("cut at {cut}: {other:?}"),
            }
            let f = s.open(&p, OpenMode::Read).unwrap();
            assert_eq!(
                content_end(&*f, end, b.len() as u64).unwrap(),
                end + cut as u64
            );
        }
    }

    #[test]
    fn bytes_after_the_fill_are_damage_unless_trusted() {
        let mut bytes = Vec::new();
        frame::encode(b"[1]", &mut bytes);
        let end = bytes.len() as u64;
        bytes.resize(bytes.len() + 5000, FILL);
        bytes.extend_from_slice(b"leftover page");
        bytes.resize(bytes.len() + 100, FILL);
        let (s, p) = file_with(&bytes);
        let mut r = FrameReader::open(&s, &p, 0, None).unwrap();
        match steps(&mut r) {
            (1, Step::Corrupt { offset, reason }) => {
                assert_eq!(offset, end);
                assert_eq!(reason, "bytes after the zero fill");
            }
            other => panic!("{other:?}"),
        }
        let mut r = FrameReader::open(&s, &p, 0, None).unwrap().trust_fill();
        assert!(matches!(
            steps(&mut r),
            (
                1,
                Step::End {
                    incomplete: false,
                    ..
                }
            )
        ));
        // A whole frame after the fill is found by the skip, as after any damage.
        let mut b = bytes.clone();
        frame::encode(b"[9]", &mut b);
        let (s, p) = file_with(&b);
        let mut r = FrameReader::open(&s, &p, 0, None).unwrap();
        assert!(matches!(steps(&mut r), (1, Step::Corrupt { .. })));
        assert!(r.skip_to_next_frame().unwrap().is_some());
    }
}
