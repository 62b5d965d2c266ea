//! Snapshots of the facts fold: what makes an incremental synth, `swarm facts` and
//! `--explain` cost the new part of the facts log, not all of it.
//!
//! A snapshot is the [`FactsFold`] at a pass's commit, as zstd-compressed (level 1) JSON behind a
//! 72-byte header laid out like a checkpoint's (`src/checkpoint.rs`), magic `SWFF`:
//! magic, version (u32), commit seq, segment base of the commit's frame, frame start,
//! frame end, time of writing (µs), body length, uncompressed length (u64 each), CRC-32 of the
//! body, CRC-32 of bytes 0..68. Written to a temp file, fsynced, renamed, directory
//! fsynced, under `<checkpoint dir>/<user>/@facts/fold-<seq:020>.swff`; the newest 2 are
//! kept. On load every field is checked, the frame it names is read back from the log
//! (same bounds, same last seq, and that last event is the very commit the fold stands
//! at: same event id, so a log of the same shape written later does not match); a snapshot that
//! fails is skipped with a warning (an older one, else a fold from the start). Like a
//! checkpoint it is derived, never needed: deleting it costs time, not facts.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::checkpoint::{self, CheckpointInfo};
use crate::error::{Error, IoContext, Result};
use crate::storage::{OpenMode, Storage};
use crate::synth::facts::FactsFold;
use crate::ts::Ts;

const MAGIC: &[u8; 4] = b"SWFF";
const VERSION: u32 = 1;
const HEADER_BYTES: usize = 72;
/// Snapshots kept per user.
const KEPT: usize = 2;
/// Largest snapshot body accepted, uncompressed.
const BODY_BYTES_MAX: u64 = 2 << 30;

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

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::Corrupt {
        path: path.to_path_buf(),
        offset: 0,
        seq: 0,
        reason: reason.into(),
    }
}

/// Encodes a snapshot of `fold`, standing at the commit `info` names.
pub fn encode(fold: &FactsFold, info: &CheckpointInfo) -> Result<Vec<u8>> {
    let json =
        serde_json::to_vec(fold).map_err(|e| Error::invalid("facts snapshot", e.to_string()))?;
    let body = zstd::bulk::compress(&json, 1).map_err(|e| Error::Io {
        op: "compress",
        path: PathBuf::new(),
        source: e,
    })?;
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    for v in [
        info.seq,
        info.segment,
        info.frame_start,
        info.frame_end,
        info.ts.0,
        body.len() as u64,
        json.len() as u64,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    let hcrc = crc32fast::hash(&out[..68]);
    out.extend_from_slice(&hcrc.to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Loads and checks a snapshot file (not yet against the log: see [`load_checked`]).
pub fn load(storage: &dyn Storage, path: &Path) -> Result<(FactsFold, CheckpointInfo)> {
    let f = storage.open(path, OpenMode::Read).ctx("open", path)?;
    let len = f.len().ctx("stat", path)?;
    if len < HEADER_BYTES as u64 {
        return Err(bad(path, format!("{len} bytes, shorter than the header")));
    }
    let mut h = [0u8; HEADER_BYTES];
    f.read_exact_at(&mut h, 0).ctx("read", path)?;
    let u64_at = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&h[o..o + 8]);
        u64::from_le_bytes(b)
    };
    let u32_at = |o: usize| {
        let mut b = [0u8; 4];
        b.copy_from_slice(&h[o..o + 4]);
        u32::from_le_bytes(b)
    };
    if &h[..4] != MAGIC || u32_at(4) != VERSION {
        return Err(bad(path, "not a facts snapshot of version 1"));
    }
    if crc32fast::hash(&h[..68]) != u32_at(68) {
        return Err(bad(path, "header checksum mismatch"));
    }
    let info = CheckpointInfo {
        seq: u64_at(8),
        segment: u64_at(16),
        frame_start: u64_at(24),
        frame_end: u64_at(32),
        ts: Ts(u64_at(40)),
    };
    let (body_len, raw_len) = (u64_at(48), u64_at(56));
    if body_len != len - HEADER_BYTES as u64 || raw_len > BODY_BYTES_MAX {
        return Err(bad(path, "body length does not match the header"));
    }
    let mut body = vec![0u8; body_len as usize];
    f.read_exact_at(&mut body, HEADER_BYTES as u64)
        .ctx("read", path)?;
    if crc32fast::hash(&body) != u32_at(64) {
        return Err(bad(path, "body checksum mismatch"));
    }
    let json = zstd::bulk::decompress(&body, raw_len as usize)
        .map_err(|e| bad(path, format!("zstd: {e}")))?;
    let mut fold: FactsFold =
        serde_json::from_slice(&json).map_err(|e| bad(path, format!("body: {e}")))?;
    fold.after_load();
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
                if commit_in_log(storage, run_dir, &info)?.as_deref()
                    == Some(fold.last_commit_id.as_str())
                {
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

/// The id of the last event of the frame `info` names, if the log holds a whole frame
/// there ending with seq `info.seq`: the snapshot is used only with the log that holds
/// its very commit, not one of the same shape (a data directory wiped and refilled).
fn commit_in_log(
    storage: &dyn Storage,
    run_dir: &Path,
    info: &CheckpointInfo,
) -> Result<Option<String>> {
    if !checkpoint::matches_log(storage, run_dir, info)? {
        return Ok(None);
    }
    let path = crate::segment::segment_path(run_dir, info.segment);
    let f = storage.open(&path, OpenMode::Read).ctx("open", &path)?;
    let mut buf = vec![0u8; (info.frame_end - info.frame_start) as usize];
    f.read_exact_at(&mut buf, info.frame_start)
        .ctx("read", &path)?;
    let crate::frame::Decoded::Frame { payload, .. } = crate::frame::decode(&buf) else {
        return Ok(None);
    };
    #[derive(serde::Deserialize)]
    struct Head {
        seq: u64,
        id: String,
    }
    let heads: Vec<Head> = match serde_json::from_slice(payload) {
        Ok(v) => v,
        Err(_) => return Ok(None),
    };
    Ok(heads
        .into_iter()
        .last()
        .filter(|h| h.seq == info.seq)
        .map(|h| h.id))
}

/// Where the frame that ends at `end` starts: right after the previous line end (or at
/// the segment's start), looked for backwards in 64 KiB steps, at most one frame's size.
pub fn frame_start_before(
    storage: &dyn Storage,
    run_dir: &Path,
    end: crate::watermark::Pos,
) -> Result<Option<u64>> {
    const STEP: u64 = 64 * 1024;
    if end.off == 0 {
        return Ok(None);
    }
    let path = crate::segment::segment_path(run_dir, end.seg);
    let f = storage.open(&path, OpenMode::Read).ctx("open", &path)?;
    // The frame's own final newline is at end - 1; look before it.
    let mut hi = end.off - 1;
    let limit = crate::frame::frame_len(crate::frame::PAYLOAD_BYTES_MAX) as u64;
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
/// newest [`KEPT`].
pub fn write(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    fold: &FactsFold,
    info: &CheckpointInfo,
) -> Result<PathBuf> {
    storage.create_dir_all(dir).ctx("create", dir)?;
    let bytes = encode(fold, info)?;
    let path = dir.join(name(info.seq));
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        name(info.seq),
        std::process::id(),
        Ts::now().0
    ));
    let f = storage
        .open(&tmp, OpenMode::CreateNew)
        .ctx("create", &tmp)?;
    let r = (|| {
        f.write_all_at(&bytes, 0).ctx("write", &tmp)?;
        f.sync_data().ctx("fsync", &tmp)?;
        storage.rename(&tmp, &path).ctx("rename", &tmp)?;
        storage.sync_dir(dir).ctx("fsync dir", dir)
    })();
    if r.is_err() {
        let _ = storage.remove_file(&tmp);
    }
    r?;
    for old in list(&**storage, dir).into_iter().skip(KEPT) {
        let p = dir.join(name(old));
        if let Err(e) = storage.remove_file(&p) {
            tracing::warn!(path = %p.display(), error = %e, "cannot remove an old facts snapshot");
        }
    }
    Ok(path)
}
