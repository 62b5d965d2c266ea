//! The durable and visible marks: the log positions below which records are on stable
//! storage, and may be shown.
//!
//! They live in the run's `SYNCED` file, 56 bytes (format 2): `SWM2`, the *durable*
//! position (base seq of a segment, u64 LE; byte offset in it, u64 LE), the seq of the
//! last event before it (u64 LE), the *visible* position (same layout) and its seq, and
//! the CRC-32 of the first 52 bytes (u32 LE). Everything before `durable` was covered by
//! an `fdatasync`; readers are shown frames that end at or before `visible`, which equals
//! `durable` unless a `batch`- or `none`-mode writer advanced it. The seqs say which
//! events the bytes held, so that when bytes below a mark are lost (a bad restore, a disk
//! that lost blocks) the engine knows which seqs readers may have seen and never hands
//! them out again. Format 1 (`SWMK`, 40 bytes, no seqs) is still read, with seq 0
//! ("unknown"); the next write upgrades it.
//!
//! The same file's `flock` serializes its updates (a read-modify-write that only moves the
//! positions forward); the fsyncs that let `durable` advance run outside it, several at a
//! time. Readers, and writers checking whether their frame is durable already, read it
//! without a lock and retry on a CRC mismatch (a concurrent overwrite).

use std::path::Path;

use crate::error::{IoContext, Result};
use crate::log::storage::{OpenMode, Storage, StorageFile};

/// A position in a run's log: a segment and a byte offset in it. Ordered as the log is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pos {
    /// Base seq of the segment.
    pub seg: u64,
    /// Byte offset in the segment.
    pub off: u64,
}

/// The two positions kept in `SYNCED`, with the seq of the last event before each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    /// Everything before it is on stable storage.
    pub durable: Pos,
    /// Readers may be shown frames that end at or before it. Never behind `durable`.
    pub visible: Pos,
    /// Seq of the last event before `durable` (0: none, or unknown in format 1).
    pub durable_seq: u64,
    /// Seq of the last event before `visible`: the highest seq a reader may have seen.
    pub visible_seq: u64,
}

impl Marks {
    /// Moves `durable` (and `visible`, if behind) forward to `p`, which ends at `seq`.
    pub fn advance_durable(&mut self, p: Pos, seq: u64) {
        if self.durable < p {
            self.durable = p;
            self.durable_seq = self.durable_seq.max(seq);
        }
        self.advance_visible(p, seq);
    }

    /// Moves `visible` forward to `p`, which ends at `seq`.
    pub fn advance_visible(&mut self, p: Pos, seq: u64) {
        if self.visible < p {
            self.visible = p;
            self.visible_seq = self.visible_seq.max(seq);
        }
    }
}

const MAGIC_V1: &[u8; 4] = b"SWMK";
const MAGIC: &[u8; 4] = b"SWM2";
/// Size of a format-1 `SYNCED` file (read, never written).
pub const WATERMARK_V1_LEN: usize = 40;
/// Size of the `SYNCED` file.
pub const WATERMARK_LEN: usize = 56;

/// Encodes the marks.
pub fn encode(m: Marks) -> [u8; WATERMARK_LEN] {
    let mut b = [0u8; WATERMARK_LEN];
    b[0..4].copy_from_slice(MAGIC);
    b[4..12].copy_from_slice(&m.durable.seg.to_le_bytes());
    b[12..20].copy_from_slice(&m.durable.off.to_le_bytes());
    b[20..28].copy_from_slice(&m.durable_seq.to_le_bytes());
    b[28..36].copy_from_slice(&m.visible.seg.to_le_bytes());
    b[36..44].copy_from_slice(&m.visible.off.to_le_bytes());
    b[44..52].copy_from_slice(&m.visible_seq.to_le_bytes());
    let crc = crc32fast::hash(&b[0..52]);
    b[52..56].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Decodes the marks (format 2, or format 1 with unknown seqs); `None` if the bytes are
/// not a watermark.
pub fn decode(b: &[u8]) -> Option<Marks> {
    // Per format: its length, and the offsets of the durable position, its seq (format 2
    // only), the visible position and its seq; the CRC covers all but the last 4 bytes.
    let (seqs, vis) = match b.len() {
        WATERMARK_LEN if &b[0..4] == MAGIC => (true, 28),
        WATERMARK_V1_LEN if &b[0..4] == MAGIC_V1 => (false, 20),
        _ => return None,
    };
    let n = b.len() - 4;
    let crc = u32::from_le_bytes(b[n..].try_into().ok()?);
    if crc32fast::hash(&b[..n]) != crc {
        return None;
    }
    let u = |at: usize| b[at..at + 8].try_into().ok().map(u64::from_le_bytes);
    let pos = |at: usize| {
        Some(Pos {
            seg: u(at)?,
            off: u(at + 8)?,
        })
    };
    Some(Marks {
        durable: pos(4)?,
        visible: pos(vis)?,
        durable_seq: if seqs { u(20)? } else { 0 },
        visible_seq: if seqs { u(44)? } else { 0 },
    })
}

/// Reads the marks. An empty file (a run created, nothing appended yet) reads as the
/// start of the log; an unreadable one, after a few retries on a torn concurrent write,
/// is an error: never "nothing visible", which would hide the run.
pub fn read(file: &dyn StorageFile, path: &Path) -> Result<Marks> {
    let mut b = [0u8; WATERMARK_LEN];
    for _ in 0..100 {
        let n = file.read_at(&mut b, 0).ctx("read", path)?;
        if n == 0 {
            return Ok(Marks::default());
        }
        if let Some(p) = decode(&b[..n]) {
            return Ok(p);
        }
        std::thread::yield_now();
    }
    // Never "empty": that would hide every record. The store rebuilds the marks from
    // the log's CRC-valid frames (`Store::marks`), or the caller reports it.
    Err(crate::error::Error::corrupt(
        path,
        0,
        0,
        "unreadable marks (not a format 1 or 2 SYNCED file); they are rebuilt from the log's frames by the next read, append or `swarm repair`".into(),
    ))
}

/// Writes the watermark (caller holds the sync lock).
pub fn write(file: &dyn StorageFile, path: &Path, m: Marks) -> Result<()> {
    debug_assert!(m.visible >= m.durable);
    file.write_all_at(&encode(m), 0).ctx("write", path)
}

/// Reads a run's marks from its `SYNCED` file (no file: nothing is visible yet).
pub(crate) fn read_marks(storage: &dyn Storage, dir: &Path) -> Result<Marks> {
    let path = dir.join(crate::log::meta::SYNCED_FILE);
    match storage.open(&path, OpenMode::Read) {
        Ok(f) => read(&*f, &path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Marks::default()),
        Err(e) => Err(e).ctx("open", &path),
    }
}

impl serde::Serialize for Pos {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Pos", 2)?;
        st.serialize_field("segment", &self.seg)?;
        st.serialize_field("offset", &self.off)?;
        st.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_damage() {
        let p = Marks {
            durable: Pos { seg: 7, off: 12345 },
            visible: Pos { seg: 8, off: 3 },
            durable_seq: 41,
            visible_seq: 44,
        };
        let b = encode(p);
        assert_eq!(decode(&b), Some(p));
        for i in 0..WATERMARK_LEN {
            let mut c = b;
            c[i] ^= 0x10;
            assert_eq!(decode(&c), None);
        }
        assert!(Pos { seg: 1, off: 999 } < Pos { seg: 2, off: 0 });
    }

    /// A format-1 file (40 bytes, `SWMK`, no seqs) written by an older build still
    /// reads, with its seqs unknown (0); a damaged one does not.
    #[test]
    fn format_1_is_still_read() {
        let mut b = [0u8; WATERMARK_V1_LEN];
        b[0..4].copy_from_slice(b"SWMK");
        b[4..12].copy_from_slice(&7u64.to_le_bytes());
        b[12..20].copy_from_slice(&12345u64.to_le_bytes());
        b[20..28].copy_from_slice(&8u64.to_le_bytes());
        b[28..36].copy_from_slice(&3u64.to_le_bytes());
        let crc = crc32fast::hash(&b[0..36]);
        b[36..40].copy_from_slice(&crc.to_le_bytes());
        let m = decode(&b).unwrap();
        assert_eq!(m.durable, Pos { seg: 7, off: 12345 });
        assert_eq!(m.visible, Pos { seg: 8, off: 3 });
        assert_eq!((m.durable_seq, m.visible_seq), (0, 0));
        b[10] ^= 1;
        assert_eq!(decode(&b), None);
    }
}
