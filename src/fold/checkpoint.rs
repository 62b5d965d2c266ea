//! Checkpoints: a run's [`State`] at a frame boundary, zstd-compressed, checksummed.
//!
//! File `<checkpoint dir>/<run>/ckpt-<seq, 20 digits>.swck`, little-endian header:
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0  | 4 | magic `SWCK` |
//! | 4  | 4 | format version ([`CHECKPOINT_VERSION`], 2) |
//! | 8  | 8 | seq: the state's head seq, the last seq of its frame |
//! | 16 | 8 | log position: base seq of the segment holding that frame |
//! | 24 | 8 | log position: byte offset where that frame starts |
//! | 32 | 8 | log position: byte offset where that frame ends (replay resumes here) |
//! | 40 | 8 | head ts, microseconds since the epoch |
//! | 48 | 8 | body length in bytes (compressed) |
//! | 56 | 8 | body length uncompressed |
//! | 64 | 4 | CRC-32 of the body |
//! | 68 | 4 | CRC-32 of header bytes 0..68 |
//! | 72 | … | body: zstd (level 3) of the state in its binary form ([`super::binary`]) |
//!
//! Written to a temp file, fsynced, renamed into place, and the directory fsynced, so a
//! checkpoint is either whole or absent. On load every field is checked (and the frame it
//! names is read back from the log); a bad one is skipped with a warning for an older one
//! or a full replay. Retention: the newest [`CHECKPOINTS_KEPT`] per run.
//!
//! Versions: 1 held the state's canonical JSON (zstd level 3); 2 (since the replay work of
//! issue 12) holds the binary form, several times smaller and decoded without a JSON
//! parser. A checkpoint of another version is never read: it is skipped like a damaged
//! one (replay falls back to an older checkpoint or the start of the log), and the next
//! checkpoint written at or past its seq (by a long enough replay, the automatic ones,
//! `swarm checkpoint`) replaces it; `swarm verify` lists it under `rebuilt`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, IoContext, Result};
use crate::event::ts::Ts;
use crate::fold::binary;
use crate::fold::state::State;
use crate::log::frame::{self, Decoded};
use crate::log::segment;
use crate::log::storage::{OpenMode, Storage};
use crate::log::watermark::Pos;

/// Checkpoint format version: 2, the binary body ([`super::binary`]). Version 1 (a JSON
/// body) and any other are skipped and rebuilt, never read.
pub const CHECKPOINT_VERSION: u32 = 2;
/// Header bytes.
pub const HEADER_BYTES: usize = 72;
/// Checkpoints kept per run; older ones are deleted after a new one is written.
pub const CHECKPOINTS_KEPT: usize = 3;
/// Largest uncompressed state a checkpoint may hold (decoder limit).
pub const STATE_BYTES_MAX: u64 = 2 << 30;
/// Default: a checkpoint is written automatically every this many events.
pub const CHECKPOINT_EVERY_DEFAULT: u64 = 10_000;

const MAGIC: &[u8; 4] = b"SWCK";

/// Where a checkpoint sits in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CheckpointInfo {
    /// Head seq of the state.
    pub seq: u64,
    /// Segment base seq of the frame holding `seq`.
    pub segment: u64,
    /// Offset where that frame starts.
    pub frame_start: u64,
    /// Offset where it ends.
    pub frame_end: u64,
    /// Head ts.
    pub ts: Ts,
}

impl CheckpointInfo {
    /// The log position right after the checkpointed frame.
    pub fn end(&self) -> Pos {
        Pos {
            seg: self.segment,
            off: self.frame_end,
        }
    }
}

/// File name of the checkpoint at `seq`.
pub fn checkpoint_name(seq: u64) -> String {
    format!("ckpt-{seq:020}.swck")
}

fn parse_name(n: &str) -> Option<u64> {
    let d = n.strip_prefix("ckpt-")?.strip_suffix(".swck")?;
    (d.len() == 20 && d.bytes().all(|b| b.is_ascii_digit()))
        .then(|| d.parse().ok())
        .flatten()
}

/// Seqs of a run's checkpoints, newest first.
pub fn list(storage: &dyn Storage, dir: &Path) -> Result<Vec<u64>> {
    if !storage.exists(dir) {
        return Ok(Vec::new());
    }
    let mut v: Vec<u64> = storage
        .list(dir)
        .ctx("list", dir)?
        .iter()
        .filter_map(|n| parse_name(n))
        .collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    Ok(v)
}

/// The file layout checkpoints and facts-fold snapshots share: the 72-byte header above
/// (with its own magic and version), then a zstd body (binary for checkpoints, JSON for
/// snapshots).
pub(crate) struct Container {
    /// Magic bytes.
    pub magic: &'static [u8; 4],
    /// Format version.
    pub version: u32,
    /// What the file is, for error messages.
    pub what: &'static str,
    /// zstd level of the body.
    pub level: i32,
    /// Largest uncompressed body accepted.
    pub raw_max: u64,
}

/// A writer that counts the bytes written through it.
struct Counted<'a> {
    inner: &'a mut dyn std::io::Write,
    bytes: u64,
}

impl std::io::Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

const CHECKPOINT: Container = Container {
    magic: MAGIC,
    version: CHECKPOINT_VERSION,
    what: "checkpoint",
    level: 3,
    raw_max: STATE_BYTES_MAX,
};

impl Container {
    /// Header and compressed body for `raw` (the uncompressed body), standing at `info`.
    pub(crate) fn encode(&self, raw: &[u8], info: &CheckpointInfo) -> Result<Vec<u8>> {
        self.encode_with(info, |w| w.write_all(raw))
    }

    /// Header and compressed body of what `body` writes, standing at `info`: the body is
    /// compressed as it is written, straight after the header's place in the one buffer
    /// returned (the uncompressed body is never held whole, nor the compressed one
    /// twice: at the end of a synth of a million events these were 50 MiB of its peak).
    pub(crate) fn encode_with(
        &self,
        info: &CheckpointInfo,
        body: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
    ) -> Result<Vec<u8>> {
        let io = |source| Error::Io {
            op: "compress",
            path: PathBuf::new(),
            source,
        };
        let mut enc =
            zstd::stream::Encoder::new(vec![0u8; HEADER_BYTES], self.level).map_err(io)?;
        let mut counted = Counted {
            inner: &mut enc,
            bytes: 0,
        };
        body(&mut counted).map_err(io)?;
        let raw_len = counted.bytes;
        let mut out = enc.finish().map_err(io)?;
        let body_crc = crc32fast::hash(&out[HEADER_BYTES..]);
        let mut h = Vec::with_capacity(HEADER_BYTES);
        h.extend_from_slice(self.magic);
        h.extend_from_slice(&self.version.to_le_bytes());
        for v in [
            info.seq,
            info.segment,
            info.frame_start,
            info.frame_end,
            info.ts.0,
            (out.len() - HEADER_BYTES) as u64,
            raw_len,
        ] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        h.extend_from_slice(&body_crc.to_le_bytes());
        let hcrc = crc32fast::hash(&h[..68]);
        h.extend_from_slice(&hcrc.to_le_bytes());
        out[..HEADER_BYTES].copy_from_slice(&h);
        Ok(out)
    }

    /// Reads and checks a file: every header field, both checksums, the sizes; returns
    /// the uncompressed body and where it stands. Never allocates more than the file
    /// holds (plus the declared, bounded, uncompressed size).
    pub(crate) fn load(
        &self,
        storage: &dyn Storage,
        path: &Path,
    ) -> Result<(Vec<u8>, CheckpointInfo)> {
        let f = storage.open(path, OpenMode::Read).ctx("open", path)?;
        let len = f.len().ctx("stat", path)?;
        if len < HEADER_BYTES as u64 {
            return Err(bad(path, format!("shorter than a {} header", self.what)));
        }
        let mut h = [0u8; HEADER_BYTES];
        f.read_exact_at(&mut h, 0).ctx("read", path)?;
        if &h[0..4] != self.magic {
            return Err(bad(path, format!("not a {} (bad magic)", self.what)));
        }
        let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[i..i + 8]);
            u64::from_le_bytes(b)
        };
        if crc32fast::hash(&h[..68]) != u32_at(68) {
            return Err(bad(path, "header checksum mismatch"));
        }
        let version = u32_at(4);
        if version != self.version {
            return Err(bad(
                path,
                format!(
                    "format version {version}; this build reads only version {}",
                    self.version
                ),
            ));
        }
        let info = CheckpointInfo {
            seq: u64_at(8),
            segment: u64_at(16),
            frame_start: u64_at(24),
            frame_end: u64_at(32),
            ts: Ts(u64_at(40)),
        };
        let body_len = u64_at(48);
        let raw_len = u64_at(56);
        if body_len != len - HEADER_BYTES as u64 {
            return Err(bad(
                path,
                format!(
                    "body is {} bytes, header says {body_len}",
                    len - HEADER_BYTES as u64
                ),
            ));
        }
        if raw_len > self.raw_max {
            return Err(bad(
                path,
                format!("uncompressed size {raw_len} over the limit"),
            ));
        }
        let mut body = vec![0u8; body_len as usize];
        f.read_exact_at(&mut body, HEADER_BYTES as u64)
            .ctx("read", path)?;
        if crc32fast::hash(&body) != u32_at(64) {
            return Err(bad(path, "body checksum mismatch"));
        }
        let raw = zstd::bulk::decompress(&body, raw_len as usize)
            .map_err(|e| bad(path, format!("zstd: {e}")))?;
        if raw.len() as u64 != raw_len {
            return Err(bad(path, "uncompressed size differs from the header"));
        }
        Ok((raw, info))
    }
}

pub(crate) use crate::log::storage::write_atomic;

/// Encodes a checkpoint file.
pub fn encode(state: &State, info: &CheckpointInfo) -> Result<Vec<u8>> {
    CHECKPOINT.encode(&binary::encode(state), info)
}

/// A damaged derived file (checkpoint, snapshot) at `path`.
pub(crate) fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::Corrupt {
        path: path.to_path_buf(),
        offset: 0,
        seq: 0,
        reason: reason.into(),
    }
}

/// Reads and checks a checkpoint file; never allocates more than the file holds (plus
/// the declared, bounded, uncompressed size).
pub fn load(storage: &dyn Storage, path: &Path) -> Result<(State, CheckpointInfo)> {
    let (body, info) = CHECKPOINT.load(storage, path)?;
    let state = binary::decode(&body).map_err(|e| bad(path, format!("state: {e}")))?;
    if state.head_seq != info.seq {
        return Err(bad(
            path,
            format!(
                "state head {} differs from header seq {}",
                state.head_seq, info.seq
            ),
        ));
    }
    Ok((state, info))
}

/// Checks that the log still holds, at the checkpoint's position, the frame it names:
/// a whole frame from `frame_start` to `frame_end` whose last event is `seq`, written at
/// `ts`. The time tells the frame the state was folded from from another of the same
/// length and seq at the same place (seqs reused after a power loss took `SYNCED` and
/// the frames past the durable mark, a run made again under a kept checkpoint
/// directory): a foreign state would be the start of every replay and of the rules.
pub fn matches_log(storage: &dyn Storage, run_dir: &Path, info: &CheckpointInfo) -> Result<bool> {
    Ok(last_event_of_frame(storage, run_dir, info)?
        .is_some_and(|(seq, _, ts)| seq == info.seq && ts == info.ts))
}

/// Whether the log holds, exactly at `info`'s bounds, a whole frame whose last event is
/// `info.seq` (its time not checked).
pub fn frame_ends_at(storage: &dyn Storage, run_dir: &Path, info: &CheckpointInfo) -> Result<bool> {
    Ok(last_event_of_frame(storage, run_dir, info)?.is_some_and(|(seq, _, _)| seq == info.seq))
}

/// The seq, id and time of the last event of the whole frame the log holds exactly at
/// `info`'s bounds, if it holds one there.
pub(crate) fn last_event_of_frame(
    storage: &dyn Storage,
    run_dir: &Path,
    info: &CheckpointInfo,
) -> Result<Option<(u64, String, Ts)>> {
    let path = segment::segment_path(run_dir, info.segment);
    let Ok(f) = storage.open(&path, OpenMode::Read) else {
        return Ok(None);
    };
    let len = f.len().ctx("stat", &path)?;
    if info.frame_end > len || info.frame_start >= info.frame_end {
        return Ok(None);
    }
    let n = info.frame_end - info.frame_start;
    if n > frame::frame_len(frame::PAYLOAD_BYTES_MAX) as u64 {
        return Ok(None);
    }
    let mut buf = vec![0u8; n as usize];
    f.read_exact_at(&mut buf, info.frame_start)
        .ctx("read", &path)?;
    let Decoded::Frame { payload, len } = frame::decode(&buf) else {
        return Ok(None);
    };
    if len as u64 != n {
        return Ok(None);
    }
    #[derive(serde::Deserialize)]
    struct Head {
        seq: u64,
        id: String,
        ts: Ts,
    }
    let heads: Vec<Head> = match serde_json::from_slice(payload) {
        Ok(v) => v,
        Err(_) => return Ok(None),
    };
    Ok(heads.into_iter().last().map(|h| (h.seq, h.id, h.ts)))
}

/// Writes a checkpoint atomically and applies the retention policy.
pub fn write(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    state: &State,
    info: &CheckpointInfo,
) -> Result<PathBuf> {
    let path = write_atomic(
        storage,
        dir,
        &checkpoint_name(info.seq),
        &encode(state, info)?,
    )?;
    for old in list(&**storage, dir)?.into_iter().skip(CHECKPOINTS_KEPT) {
        let p = dir.join(checkpoint_name(old));
        match storage.remove_file(&p) {
            // Another process's retention removed it first.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %p.display(), error = %e, "cannot remove an old checkpoint")
            }
            Ok(()) => {}
        }
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::storage::MemStorage;

    #[test]
    fn roundtrip_and_every_damage_detected() {
        let s: Arc<dyn Storage> = Arc::new(MemStorage::new());
        let dir = Path::new("/ck/r");
        let mut st = State::new("r");
        st.head_seq = 7;
        let info = CheckpointInfo {
            seq: 7,
            segment: 1,
            frame_start: 100,
            frame_end: 200,
            ts: Ts(5),
        };
        let p = write(&s, dir, &st, &info).unwrap();
        let (back, i2) = load(&*s, &p).unwrap();
        assert_eq!(back, st);
        assert_eq!(i2, info);
        let good = encode(&st, &info).unwrap();
        let mem = MemStorage::new();
        mem.create_dir_all(dir).unwrap();
        let q = dir.join("x");
        mem.open(&q, OpenMode::CreateNew).unwrap();
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0x01;
            mem.set_contents(&q, b);
            assert!(load(&mem, &q).is_err(), "flip at {i}");
        }
        for cut in 0..good.len() {
            mem.set_contents(&q, good[..cut].to_vec());
            assert!(load(&mem, &q).is_err(), "cut at {cut}");
        }
    }

    /// A frame of the same seq and length at the checkpoint's place, written at another
    /// time, is not the one the state was folded from.
    #[test]
    fn a_frame_of_another_time_does_not_match() {
        let mem = MemStorage::new();
        let run_dir = Path::new("/data/u/r");
        mem.create_dir_all(run_dir).unwrap();
        let seg = crate::log::segment::segment_path(run_dir, 1);
        mem.open(&seg, OpenMode::CreateNew).unwrap();
        let frame = |ts: &str| {
            let mut out = Vec::new();
            let payload = format!(
                r#"[{{"run_id":"r","seq":1,"ts":"{ts}","id":"a","agent_id":"x","user_id":"u","type":"evidence","content":"e"}}]"#
            );
            crate::log::frame::encode(payload.as_bytes(), &mut out);
            out
        };
        let (first, again) = (
            frame("2026-11-29T10:00:00.000001Z"),
            frame("2026-11-29T10:00:00.000002Z"),
        );
        assert_eq!(first.len(), again.len());
        let info = CheckpointInfo {
            seq: 1,
            segment: 1,
            frame_start: 0,
            frame_end: first.len() as u64,
            ts: Ts::parse("2026-11-29T10:00:00.000001Z").unwrap(),
        };
        mem.set_contents(&seg, first);
        assert!(matches_log(&mem, run_dir, &info).unwrap());
        mem.set_contents(&seg, again);
        assert!(!matches_log(&mem, run_dir, &info).unwrap());
        assert!(frame_ends_at(&mem, run_dir, &info).unwrap());
    }

    #[test]
    fn retention_keeps_newest() {
        let s: Arc<dyn Storage> = Arc::new(MemStorage::new());
        let dir = Path::new("/ck/r");
        for seq in 1..=5 {
            let mut st = State::new("r");
            st.head_seq = seq;
            let info = CheckpointInfo {
                seq,
                segment: 1,
                frame_start: 0,
                frame_end: 1,
                ts: Ts(0),
            };
            write(&s, dir, &st, &info).unwrap();
        }
        assert_eq!(list(&*s, dir).unwrap(), vec![5, 4, 3]);
    }
}

#[cfg(test)]
mod streamed_tests {
    use super::*;
    use crate::log::storage::MemStorage;

    const BIG: Container = Container {
        magic: b"TST1",
        version: 1,
        what: "test",
        level: 3,
        raw_max: 1 << 40,
    };

    fn roundtrip(body: &[u8], chunk: usize) {
        let info = CheckpointInfo {
            seq: 1,
            segment: 1,
            frame_start: 0,
            frame_end: 10,
            ts: Ts(1),
        };
        let bytes = BIG
            .encode_with(&info, |w| {
                let mut w = std::io::BufWriter::with_capacity(64 << 10, w);
                for c in body.chunks(chunk.max(1)) {
                    std::io::Write::write_all(&mut w, c)?;
                }
                std::io::Write::flush(&mut w)
            })
            .unwrap();
        let mem = MemStorage::new();
        let dir = Path::new("/t");
        mem.create_dir_all(dir).unwrap();
        let p = dir.join("x");
        mem.open(&p, OpenMode::CreateNew).unwrap();
        mem.set_contents(&p, bytes.clone());
        let (back, i2) = BIG.load(&mem, &p).unwrap();
        assert_eq!(i2, info);
        assert!(back == body, "body of {} bytes differs", body.len());
        // The same as the one-shot encoding reads.
        let one = BIG.encode(body, &info).unwrap();
        mem.set_contents(&p, one);
        assert!(BIG.load(&mem, &p).unwrap().0 == body);
    }

    /// Streamed bodies (no content size in the zstd frame) load: empty, small, written
    /// in odd chunks, and far larger than the level's window.
    #[test]
    fn a_streamed_body_loads_at_every_size() {
        roundtrip(b"", 1);
        roundtrip(b"{}", 1);
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let mut big = Vec::with_capacity(24 << 20);
        while big.len() < 24 << 20 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Half random, half repeats from far back: matches beyond the window.
            if x.is_multiple_of(3) && big.len() > 8 << 20 {
                let from = (x as usize >> 8) % (big.len() - 4096);
                let piece = big[from..from + 1000].to_vec();
                big.extend_from_slice(&piece);
            } else {
                big.extend_from_slice(&x.to_le_bytes());
            }
        }
        roundtrip(&big, 7777);
    }
}
