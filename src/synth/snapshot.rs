//! Snapshots of the facts fold: what makes an incremental synth, `swarm facts` and
//! `--explain` cost the new part of the facts log, not all of it.
//!
//! A snapshot is the [`FactsFold`] at a pass's commit, in the checkpoint container
//! (`src/checkpoint.rs`: the same 72-byte header, both checksums, the same atomic write)
//! with magic `SWFF` and a zstd level 1 JSON body; the header's ts is the time of
//! writing. Stored as `<checkpoint dir>/<user>/@facts/fold-<seq:020>.swff`; the newest 2
//! are kept. On load every field is checked, every index in the fold must point inside
//! it, and the frame the header names is read back from the log: same bounds, same last
//! seq, and that last event is the very commit the fold stands at (same event id, so a
//! log of the same shape written later does not match). A snapshot that fails is skipped
//! with a warning (an older one, else a fold from the start). Like a
//! checkpoint it is derived, never needed: deleting it costs time, not facts.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{IoContext, Result};
use crate::fold::checkpoint::{self, bad, CheckpointInfo, Container};
use crate::log::storage::{OpenMode, Storage};
use crate::synth::facts::FactsFold;

/// Snapshots kept per user.
const KEPT: usize = 2;

/// The checkpoint container with its own magic; level 1: a snapshot is written at the end
/// of every synth, and level 3 cost more time than it saved space.
const SNAPSHOT: Container = Container {
    magic: b"SWFF",
    version: 1,
    what: "facts snapshot",
    level: 1,
    raw_max: 2 << 30,
};

/// File name of the snapshot at commit `seq`.
pub fn name(seq: u64) -> String {
    format!("fold-{seq:020}.swff")
}

fn parse_name(n: &str) -> Option<u64> {
    n.strip_prefix("fold-")?.strip_suffix(".swff")?.parse().ok()
}

/// Snapshot seqs in `dir`, newest first.
pub fn list(storage: &dyn Storage, dir: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = storage
        .list(dir)
        .unwrap_or_default()
        .iter()
        .filter_map(|n| parse_name(n))
        .collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v
}

/// Encodes a snapshot of `fold`, standing at the commit `info` names.
pub fn encode(fold: &FactsFold, info: &CheckpointInfo) -> Result<Vec<u8>> {
    SNAPSHOT.encode_with(info, |w| {
        let mut w = std::io::BufWriter::with_capacity(64 << 10, w);
        serde_json::to_writer(&mut w, fold)?;
        std::io::Write::flush(&mut w)
    })
}

/// Loads and checks a snapshot file (not yet against the log: see [`load_checked`]).
pub fn load(storage: &dyn Storage, path: &Path) -> Result<(FactsFold, CheckpointInfo)> {
    let (json, info) = SNAPSHOT.load(storage, path)?;
    let mut fold: FactsFold =
        serde_json::from_slice(&json).map_err(|e| bad(path, format!("body: {e}")))?;
    fold.after_load().map_err(|e| bad(path, e))?;
    if fold.last_pass.map(|p| p.1) != Some(info.seq) || fold.head_seq != info.seq {
        return Err(bad(
            path,
            "the fold does not stand at the commit the header names",
        ));
    }
    Ok((fold, info))
}

/// The newest snapshot in `dir` that loads and whose commit frame is in the log at
/// `run_dir`; older or damaged ones are skipped with a warning.
pub fn load_checked(
    storage: &dyn Storage,
    dir: &Path,
    run_dir: &Path,
) -> Result<Option<(FactsFold, CheckpointInfo)>> {
    for seq in list(storage, dir) {
        let path = dir.join(name(seq));
        match load(storage, &path) {
            Ok((fold, info)) => {
                let last = checkpoint::last_event_of_frame(storage, run_dir, &info)?;
                if last.is_some_and(|(seq, id, _)| seq == info.seq && id == fold.last_commit_id) {
                    return Ok(Some((fold, info)));
                }
                tracing::warn!(snapshot = %path.display(), "facts snapshot does not match the log; skipped");
            }
            Err(e) => {
                tracing::warn!(snapshot = %path.display(), error = %e, "damaged facts snapshot; skipped")
            }
        }
    }
    Ok(None)
}

/// Where the frame that ends at `end` starts: right after the previous line end (or at
/// the segment's start), looked for backwards in 64 KiB steps, at most one frame's size.
pub fn frame_start_before(
    storage: &dyn Storage,
    run_dir: &Path,
    end: crate::log::watermark::Pos,
) -> Result<Option<u64>> {
    const STEP: u64 = 64 * 1024;
    if end.off == 0 {
        return Ok(None);
    }
    let path = crate::log::segment::segment_path(run_dir, end.seg);
    let f = storage.open(&path, OpenMode::Read).ctx("open", &path)?;
    // The frame's own final newline is at end - 1; look before it.
    let mut hi = end.off - 1;
    let limit = crate::log::frame::frame_len(crate::log::frame::PAYLOAD_BYTES_MAX) as u64;
    while hi > 0 && end.off - hi <= limit {
        let lo = hi.saturating_sub(STEP);
        let mut buf = vec![0u8; (hi - lo) as usize];
        f.read_exact_at(&mut buf, lo).ctx("read", &path)?;
        if let Some(i) = buf.iter().rposition(|&b| b == b'\n') {
            return Ok(Some(lo + i as u64 + 1));
        }
        hi = lo;
    }
    Ok((hi == 0).then_some(0))
}

/// Writes a snapshot atomically (temp, fsync, rename, directory fsync) and keeps the
/// newest `KEPT`.
pub fn write(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    fold: &FactsFold,
    info: &CheckpointInfo,
) -> Result<PathBuf> {
    let path = checkpoint::write_atomic(storage, dir, &name(info.seq), &encode(fold, info)?)?;
    for old in list(&**storage, dir).into_iter().skip(KEPT) {
        let p = dir.join(name(old));
        if let Err(e) = storage.remove_file(&p) {
            tracing::warn!(path = %p.display(), error = %e, "cannot remove an old facts snapshot");
        }
    }
    Ok(path)
}
