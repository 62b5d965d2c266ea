//! Segment files: naming, listing, and a streaming frame reader.
//!
//! A run's log is a sequence of segment files `seg-<first seq, 20 digits>.jsonl`; the
//! name sorts in log order and tells which segment holds a seq without opening it.

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
}

const CHUNK: usize = 1 << 20;

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
        })
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
        let need = want.saturating_sub(self.buf.len()).max(CHUNK);
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
        loop {
            let unread = &self.buf[self.at..];
            match frame::decode(unread) {
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
                Decoded::Incomplete => {
                    let want = if unread.len() >= frame::HEADER_LEN {
                        // The header is whole and checked, so its length is bounded.
                        let len: usize = std::str::from_utf8(&unread[30..38])
                            .ok()
                            .and_then(|s| s.trim().parse().ok())
                            .unwrap_or(0);
                        frame::frame_len(len)
                    } else {
                        frame::HEADER_LEN
                    };
                    if !self.fill(want)? {
                        let offset = self.offset();
                        let incomplete = !self.buf[self.at..].is_empty();
                        return Ok(Step::End { offset, incomplete });
                    }
                }
                Decoded::Corrupt(reason) => {
                    return Ok(Step::Corrupt {
                        offset: self.offset(),
                        reason,
                    })
                }
            }
        }
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
}
