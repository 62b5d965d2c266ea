//! The visibility watermark: the log position below which records may be shown.
//!
//! It lives in the run's `SYNCED` file, 40 bytes: `SWMK`, the *durable* position (base
//! seq of a segment, u64 LE; byte offset in it, u64 LE), the *visible* position (same
//! layout), and the CRC-32 of the first 36 bytes (u32 LE). Everything before `durable`
//! was covered by an `fdatasync`; readers are shown frames that end at or before
//! `visible`, which equals `durable` unless a `batch`- or `none`-mode writer advanced it.
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

/// The two positions kept in `SYNCED`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    /// Everything before it is on stable storage.
    pub durable: Pos,
    /// Readers may be shown frames that end at or before it. Never behind `durable`.
    pub visible: Pos,
}

const MAGIC: &[u8; 4] = b"SWMK";
/// Size of the `SYNCED` file.
pub const WATERMARK_LEN: usize = 40;

/// Encodes the marks.
pub fn encode(m: Marks) -> [u8; WATERMARK_LEN] {
    let mut b = [0u8; WATERMARK_LEN];
    b[0..4].copy_from_slice(MAGIC);
    b[4..12].copy_from_slice(&m.durable.seg.to_le_bytes());
    b[12..20].copy_from_slice(&m.durable.off.to_le_bytes());
    b[20..28].copy_from_slice(&m.visible.seg.to_le_bytes());
    b[28..36].copy_from_slice(&m.visible.off.to_le_bytes());
    let crc = crc32fast::hash(&b[0..36]);
    b[36..40].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Decodes the marks; `None` if the bytes are not a watermark.
pub fn decode(b: &[u8]) -> Option<Marks> {
    if b.len() != WATERMARK_LEN || &b[0..4] != MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes(b[36..40].try_into().ok()?);
    if crc32fast::hash(&b[0..36]) != crc {
        return None;
    }
    let u = |r: std::ops::Range<usize>| b[r].try_into().ok().map(u64::from_le_bytes);
    Some(Marks {
        durable: Pos {
            seg: u(4..12)?,
            off: u(12..20)?,
        },
        visible: Pos {
            seg: u(20..28)?,
            off: u(28..36)?,
        },
    })
}

/// Reads the watermark. A missing or unreadable one reads as the start of the log
/// (nothing visible): the safe side. Retries a few times on a torn concurrent write.
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
    tracing::warn!(path = %path.display(), "unreadable watermark; treating as empty");
    Ok(Marks::default())
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
}
