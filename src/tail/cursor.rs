//! Cursor files: where a tail stands, saved so a restarted consumer resumes with no gap
//! and at most one repeat.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::event::ts::Ts;
use crate::log::storage::{OpenMode, Storage};
use crate::log::watermark::Pos;
use crate::tail::{CURSOR_BYTES_MAX, CURSOR_FORMAT};

/// A saved tail position: the last event delivered and where its frame starts.
///
/// Stored as one JSON line:
/// `{"format":1,"run":"R","seq":S,"segment":B,"offset":O,"created":"T"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cursor {
    /// Cursor format version ([`CURSOR_FORMAT`]).
    pub format: u32,
    /// The run.
    pub run: String,
    /// Seq of the last event delivered.
    pub seq: u64,
    /// Base seq of the segment holding its frame.
    pub segment: u64,
    /// Byte offset of its frame in that segment.
    pub offset: u64,
    /// When the run was created (its `run.json`): a run deleted and created again under
    /// the same name has another, and a cursor of the old one is not resumed from (its
    /// seq would skip the new run's first events). Absent in cursors of older builds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<Ts>,
}

impl Cursor {
    /// Position of the frame holding the cursor's event.
    pub fn pos(&self) -> Pos {
        Pos {
            seg: self.segment,
            off: self.offset,
        }
    }

    /// Reads a cursor file; `None` when it does not exist.
    pub fn load(storage: &dyn Storage, path: &Path) -> Result<Option<Cursor>> {
        let f = match storage.open(path, OpenMode::Read) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).ctx("open", path),
        };
        let len = f.len().ctx("stat", path)?;
        let field = || format!("cursor file {}", path.display());
        if len > CURSOR_BYTES_MAX {
            return Err(Error::invalid(
                field(),
                format!("{len} bytes, limit {CURSOR_BYTES_MAX}"),
            ));
        }
        let mut b = vec![0u8; len as usize];
        f.read_exact_at(&mut b, 0).ctx("read", path)?;
        if b.trim_ascii().is_empty() {
            // `touch cursor` or a crash of a tool that truncated it first: nothing was
            // committed, so there is nothing to resume from.
            tracing::warn!(cursor = %path.display(), "empty cursor file; starting as if there were none");
            return Ok(None);
        }
        let c: Cursor = serde_json::from_slice(&b).map_err(|e| {
            Error::invalid(
                field(),
                format!("not a cursor ({e}); delete it to start from --from-seq"),
            )
        })?;
        if c.format != CURSOR_FORMAT {
            return Err(Error::invalid(
                field(),
                format!("format {} (this build reads {CURSOR_FORMAT})", c.format),
            ));
        }
        Ok(Some(c))
    }

    /// Writes the cursor atomically: a temporary file beside `path`, renamed over it.
    /// With `fsync`, the file and then its directory are synced as well.
    pub fn save(&self, storage: &dyn Storage, path: &Path, fsync: bool) -> Result<()> {
        let mut name = path
            .file_name()
            .ok_or_else(|| Error::invalid("cursor file", "the path has no file name"))?
            .to_os_string();
        name.push(".tmp");
        let tmp = path.with_file_name(name);
        let mut bytes = serde_json::to_vec(self).map_err(|e| Error::Io {
            op: "encode",
            path: tmp.clone(),
            source: std::io::Error::other(e),
        })?;
        bytes.push(b'\n');
        let f = storage
            .open(&tmp, OpenMode::ReadWriteCreate)
            .ctx("create", &tmp)?;
        f.set_len(0).ctx("truncate", &tmp)?;
        f.write_all_at(&bytes, 0).ctx("write", &tmp)?;
        if fsync {
            f.sync_data().ctx("fsync", &tmp)?;
        }
        drop(f);
        storage.rename(&tmp, path).ctx("rename", &tmp)?;
        if fsync {
            let dir = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            storage.sync_dir(dir).ctx("fsync dir", dir)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::log::storage::MemStorage;

    #[test]
    fn an_empty_cursor_file_is_no_cursor_and_garbage_is_an_error() {
        let mem = MemStorage::new();
        let p = Path::new("/c/lead.cursor");
        assert_eq!(Cursor::load(&mem, p).unwrap(), None);
        mem.create_dir_all(Path::new("/c")).unwrap();
        mem.open(p, OpenMode::ReadWriteCreate).unwrap();
        for empty in [&b""[..], b"\n", b"  \n\t"] {
            mem.set_contents(p, empty.to_vec());
            assert_eq!(Cursor::load(&mem, p).unwrap(), None);
        }
        mem.set_contents(p, b"{\"seq\":".to_vec());
        assert_eq!(mem.contents(p).unwrap(), b"{\"seq\":");
        let r = Cursor::load(&mem, p);
        assert!(matches!(r, Err(Error::Invalid { .. })), "{r:?}");
    }
}
