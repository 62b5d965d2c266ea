//! A run's files and settings: `run.json` ([`RunMeta`]), the names of the files beside
//! the segments, and the options every writer of a store shares.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::event::ts::Ts;
use crate::log::storage::{OpenMode, Storage};

/// Default size at which a segment is closed and a new one started.
pub const SEGMENT_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
/// Largest frame payload a batch may produce (the decoder accepts up to 16 MiB).
pub const BATCH_BYTES_MAX: usize = 8 * 1024 * 1024;

/// When an append is acknowledged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// After `fdatasync` (group-committed). A power loss cannot take it away.
    #[default]
    Sync,
    /// After the write; an fsync follows within the batch interval.
    Batch,
    /// After the write; no fsync is issued for it.
    None,
}

impl std::str::FromStr for Durability {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "sync" => Ok(Durability::Sync),
            "batch" => Ok(Durability::Batch),
            "none" => Ok(Durability::None),
            _ => Err(Error::invalid(
                "durability",
                format!("{s:?} is not one of sync, batch, none"),
            )),
        }
    }
}

/// Per-run settings fixed at creation, stored in `run.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    /// Format version of the run directory.
    pub format: u32,
    /// The run id.
    pub run_id: String,
    /// The user who created the run.
    pub user_id: String,
    /// When it was created.
    pub created: Ts,
    /// Segment rotation size, in bytes.
    pub segment_bytes: u64,
}

/// Settings of a store's writers.
#[derive(Clone, Debug)]
pub struct LogOptions {
    /// Segment size for new runs.
    pub segment_bytes: u64,
    /// Longest time a `batch`-mode append stays unsynced.
    pub batch_interval_ms: u64,
    /// The most zero fill a writer keeps ahead of the active segment's last frame (0: no
    /// preallocation). Default: `SWARM_PREALLOC_BYTES`, or [`PREALLOC_BYTES_DEFAULT`]; at
    /// most 64 MiB.
    pub prealloc_bytes: u64,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            batch_interval_ms: 10,
            prealloc_bytes: prealloc_bytes_from_env(),
        }
    }
}

/// The default preallocation chunk: the most zero fill a writer keeps ahead (it keeps
/// less for small groups, `RunLog::preallocate`).
pub const PREALLOC_BYTES_DEFAULT: u64 = 1 << 20;

/// Largest preallocation chunk.
pub const PREALLOC_BYTES_MAX: u64 = 64 << 20;

/// `SWARM_PREALLOC_BYTES`, or [`PREALLOC_BYTES_DEFAULT`] (read once per process).
fn prealloc_bytes_from_env() -> u64 {
    static BYTES: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        std::env::var("SWARM_PREALLOC_BYTES")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(PREALLOC_BYTES_DEFAULT, |b| b.min(PREALLOC_BYTES_MAX))
    })
}

pub(crate) const LOCK_FILE: &str = "LOCK";
/// Taken (`flock`) around each data fsync of the run, so that processes take turns and a
/// process that waited re-reads the durable mark before syncing (cross-process group
/// commit). Holds no data.
pub(crate) const SYNC_LOCK_FILE: &str = "SYNC_LOCK";
pub(crate) const SYNCED_FILE: &str = "SYNCED";
pub(crate) const META_FILE: &str = "run.json";
/// The tombstone a closed and archived run leaves in its directory (see
/// `store::archive`). Writers check for it under `LOCK`: never an append to, nor a new run
/// in the place of, an archived run.
pub const ARCHIVED_FILE: &str = "ARCHIVED";

/// Reads a run's `run.json`.
pub(crate) fn read_meta(storage: &dyn Storage, dir: &Path) -> Result<RunMeta> {
    let path = dir.join(META_FILE);
    let f = storage.open(&path, OpenMode::Read).ctx("open", &path)?;
    let len = f.len().ctx("stat", &path)?;
    if len > 1 << 20 {
        return Err(Error::Corrupt {
            path: path.clone(),
            offset: 0,
            seq: 0,
            reason: "run.json over 1 MiB".into(),
        });
    }
    let mut b = vec![0u8; len as usize];
    f.read_exact_at(&mut b, 0).ctx("read", &path)?;
    serde_json::from_slice(&b).map_err(|e| Error::Corrupt {
        path: path.clone(),
        offset: 0,
        seq: 0,
        reason: format!("bad run.json: {e}"),
    })
}
