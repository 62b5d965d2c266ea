//! Recovery under the `LOCK` file: catching up with the frames other processes wrote,
//! starting the rules from the newest checkpoint that matches the log, and repairing a
//! torn tail (the bytes after the last whole frame, kept in a `.broken` file).

use std::sync::Arc;

use crate::error::{Error, IoContext, Result};
use crate::event::ts::Ts;
use crate::event::{EventHead, GENERATED_ID_PREFIX};
use crate::fold::checkpoint;
use crate::fold::rules::{needs_content, RuleEvent, Rules};
use crate::log::segment::{self, FrameReader, Step};
use crate::log::storage::OpenMode;
use crate::log::watermark::{self, Pos};

use crate::commit::{lock, LiteEvent, RunLog, Writer};

impl RunLog {
    /// Brings the writer up to date with the log: loads the head on first use, reads what
    /// other processes appended, repairs a torn tail, follows rotations. Under `LOCK`.
    pub(super) fn catch_up(&self, w: &mut Writer) -> Result<()> {
        if !w.loaded {
            self.load(w)?;
        }
        loop {
            let seg_path = segment::segment_path(&self.dir, w.seg_base);
            let len = w.seg.len().ctx("stat", &seg_path)?;
            if len < w.end {
                return Err(Error::corrupt(
                    &seg_path,
                    len,
                    w.head_seq + 1,
                    format!(
                        "segment shrank from {} to {len} bytes under the lock",
                        w.end
                    ),
                ));
            }
            if len > w.end {
                self.scan_tail(w, len, true)?;
            }
            if w.end < self.meta.segment_bytes {
                return Ok(());
            }
            let next = w.head_seq + 1;
            let next_path = segment::segment_path(&self.dir, next);
            if !self.storage.exists(&next_path) {
                return Ok(());
            }
            self.switch_segment(w, next)?;
        }
    }

    pub(super) fn switch_segment(&self, w: &mut Writer, base: u64) -> Result<()> {
        let path = segment::segment_path(&self.dir, base);
        w.seg = Arc::from(
            self.storage
                .open(&path, OpenMode::ReadWriteCreate)
                .ctx("open", &path)?,
        );
        w.seg_base = base;
        w.end = 0;
        Ok(())
    }

    /// First look at the log: the rules, head seq and ts, and the valid end. Starts from
    /// the newest checkpoint that matches the log (its rules are the fold up to there),
    /// then reads every frame after it.
    pub(super) fn load(&self, w: &mut Writer) -> Result<()> {
        let bases = segment::list_segments(&*self.storage, &self.dir)?;
        if bases.is_empty() {
            return Err(Error::RunNotFound(self.run_id.clone()));
        }
        w.rules = Rules::default();
        w.head_seq = 0;
        w.head_ts = Ts(0);
        let mut from = Pos {
            seg: bases[0],
            off: 0,
        };
        if let Some((rules, info)) = self.newest_checkpoint()? {
            w.rules = rules;
            w.head_seq = info.seq;
            w.head_ts = info.ts;
            from = info.end();
        }
        for (i, &base) in bases.iter().enumerate() {
            if base < from.seg {
                continue;
            }
            self.switch_segment(w, base)?;
            if base == from.seg {
                w.end = from.off;
            } else if w.head_seq + 1 != base {
                let path = segment::segment_path(&self.dir, base);
                return Err(Error::corrupt(
                    &path,
                    0,
                    w.head_seq + 1,
                    format!("segment starts at seq {base}"),
                ));
            }
            let len = w
                .seg
                .len()
                .ctx("stat", &segment::segment_path(&self.dir, base))?;
            self.scan_tail(w, len, i + 1 == bases.len())?;
        }
        self.clamp_watermark(Pos {
            seg: w.seg_base,
            off: w.end,
        })?;
        w.ids_upto = Pos::default();
        w.loaded = true;
        Ok(())
    }

    pub(super) fn newest_checkpoint(&self) -> Result<Option<(Rules, checkpoint::CheckpointInfo)>> {
        let Some(ck_dir) = &self.ck_dir else {
            return Ok(None);
        };
        for seq in checkpoint::list(&*self.storage, ck_dir)? {
            let path = ck_dir.join(checkpoint::checkpoint_name(seq));
            match checkpoint::load(&*self.storage, &path) {
                Ok((state, info))
                    if state.run_id == self.run_id
                        && checkpoint::matches_log(&*self.storage, &self.dir, &info)? =>
                {
                    return Ok(Some((state.rules, info)));
                }
                Ok(_) => {
                    tracing::warn!(checkpoint = %path.display(), "checkpoint does not match the log; skipped")
                }
                Err(e) => {
                    tracing::warn!(checkpoint = %path.display(), error = %e, "damaged checkpoint; skipped")
                }
            }
        }
        Ok(None)
    }

    /// Lowers the watermark to `end`, the end of the log's whole frames, if it points
    /// past it. `SYNCED` is not fsynced, so after a power loss its newer `visible` can
    /// survive while the unsynced frames it covered did not; and a cut segment leaves
    /// both marks past its end. Left alone, such a mark would cover the next frames
    /// written there: shown to readers before their fsync, or, for `durable`,
    /// acknowledged without one. Under `LOCK`: every live writer's frames are whole and
    /// before `end`, so no mark a live process set is lowered.
    pub(super) fn clamp_watermark(&self, end: Pos) -> Result<()> {
        let mut s = lock(&self.sync);
        s.durable = s.durable.min(end);
        self.synced.lock().ctx("lock", &self.synced_path)?;
        let r = (|| {
            let mut m = watermark::read(&*self.synced, &self.synced_path)?;
            if m.durable > end || m.visible > end {
                tracing::warn!(
                    path = %self.synced_path.display(),
                    ?m,
                    ?end,
                    "watermark past the end of the log; lowered"
                );
                m.durable = m.durable.min(end);
                m.visible = m.visible.min(end);
                watermark::write(&*self.synced, &self.synced_path, m)?;
            }
            Ok(())
        })();
        let _ = self.synced.unlock();
        r
    }

    /// Reads frames in `[w.end, len)` of the current segment, moving the head; a torn tail
    /// is cut off (kept in a `.broken` file), damage followed by valid frames is an error.
    pub(super) fn scan_tail(&self, w: &mut Writer, len: u64, last_segment: bool) -> Result<()> {
        let path = segment::segment_path(&self.dir, w.seg_base);
        let mut r = FrameReader::new(w.seg.clone(), path.clone(), w.end, Some(len))?;
        let (bad_at, reason) = loop {
            match r.step()? {
                Step::Frame { offset, len } => {
                    let events: Vec<LiteEvent> =
                        serde_json::from_slice(r.payload()).map_err(|e| {
                            Error::corrupt(
                                &path,
                                offset,
                                w.head_seq + 1,
                                format!("bad event JSON: {e}"),
                            )
                        })?;
                    for e in &events {
                        if e.seq != w.head_seq + 1 {
                            return Err(Error::corrupt(
                                &path,
                                offset,
                                w.head_seq + 1,
                                format!("holds seq {}", e.seq),
                            ));
                        }
                        let content = if needs_content(e.kind) {
                            serde_json::from_str(e.content.get()).map_err(|err| {
                                Error::corrupt(&path, offset, e.seq, format!("bad content: {err}"))
                            })?
                        } else {
                            serde_json::Value::Null
                        };
                        w.rules.apply(&RuleEvent {
                            seq: e.seq,
                            agent: &e.agent_id,
                            kind: e.kind,
                            subject: e.subject.as_deref(),
                            refs: &e.refs,
                            content: &content,
                        });
                        w.head_seq = e.seq;
                        w.head_ts = e.ts;
                    }
                    w.end = offset + len;
                }
                Step::End { offset, incomplete } => {
                    if incomplete {
                        break (offset, "incomplete frame");
                    }
                    w.end = offset;
                    break (u64::MAX, "");
                }
                Step::Corrupt { offset, reason } => break (offset, reason),
            }
        };
        if bad_at == u64::MAX {
            return Ok(());
        }
        if !last_segment {
            return Err(Error::corrupt(
                &path,
                bad_at,
                w.head_seq + 1,
                format!("{reason} in a segment that is not the last"),
            ));
        }
        // Damage at `bad_at`. We hold the append lock, so no live writer is mid-write.
        if let Some(next) = r.skip_to_next_frame()? {
            return Err(Error::corrupt(
                &path,
                bad_at,
                w.head_seq + 1,
                format!("{reason}; valid records follow at byte {next}, refusing to truncate"),
            ));
        }
        self.repair_tail(w, bad_at, len, reason)
    }

    pub(super) fn repair_tail(
        &self,
        w: &mut Writer,
        at: u64,
        len: u64,
        reason: &str,
    ) -> Result<()> {
        let path = segment::segment_path(&self.dir, w.seg_base);
        let mut torn = vec![0u8; (len - at) as usize];
        w.seg.read_exact_at(&mut torn, at).ctx("read", &path)?;
        let broken = self
            .dir
            .join(format!("{}.{at}.broken", segment::segment_name(w.seg_base)));
        let bf = self
            .storage
            .open(&broken, OpenMode::ReadWriteCreate)
            .ctx("create", &broken)?;
        bf.set_len(0).ctx("truncate", &broken)?;
        bf.write_all_at(&torn, 0).ctx("write", &broken)?;
        bf.sync_data().ctx("fsync", &broken)?;
        self.storage
            .sync_dir(&self.dir)
            .ctx("fsync dir", &self.dir)?;
        let _io = lock(&self.sync_io);
        let cut = Pos {
            seg: w.seg_base,
            off: at,
        };
        {
            // The cut bytes were never a whole frame, so no durable position of this
            // process can lie past them; lower the cache anyway, never trust it blindly.
            let mut s = lock(&self.sync);
            s.durable = s.durable.min(cut);
        }
        self.synced.lock().ctx("lock", &self.synced_path)?;
        let r = (|| {
            w.seg.set_len(at).ctx("truncate", &path)?;
            self.fsync_segment(&*w.seg, &path)?;
            let mut m = watermark::read(&*self.synced, &self.synced_path)?;
            m.durable = m.durable.min(cut);
            m.visible = m.visible.min(cut);
            watermark::write(&*self.synced, &self.synced_path, m)
        })();
        let _ = self.synced.unlock();
        r?;
        w.end = at;
        tracing::warn!(
            segment = %path.display(),
            offset = at,
            bytes = len - at,
            reason,
            kept_in = %broken.display(),
            "truncated a torn tail left by a writer that died mid-write"
        );
        Ok(())
    }

    /// Loads the client ids of every frame since `ids_upto` (lazily: only appends that
    /// carry an id pay for it).
    pub(super) fn catch_up_ids(&self, w: &mut Writer) -> Result<()> {
        let bases = segment::list_segments(&*self.storage, &self.dir)?;
        let head = Pos {
            seg: w.seg_base,
            off: w.end,
        };
        for &base in &bases {
            if base > head.seg {
                break;
            }
            if base < w.ids_upto.seg {
                continue;
            }
            let from = if base == w.ids_upto.seg {
                w.ids_upto.off
            } else {
                0
            };
            let limit = if base == head.seg {
                Some(head.off)
            } else {
                None
            };
            let path = segment::segment_path(&self.dir, base);
            let mut r = FrameReader::open(&*self.storage, &path, from, limit)?;
            loop {
                match r.step()? {
                    Step::Frame { offset, .. } => {
                        let heads: Vec<EventHead> =
                            serde_json::from_slice(r.payload()).map_err(|e| {
                                Error::corrupt(&path, offset, 0, format!("bad event JSON: {e}"))
                            })?;
                        for h in heads {
                            if !h.id.starts_with(GENERATED_ID_PREFIX) {
                                w.ids.insert(
                                    h.id.into_owned(),
                                    (
                                        h.seq,
                                        Pos {
                                            seg: base,
                                            off: offset,
                                        },
                                    ),
                                );
                            }
                        }
                    }
                    Step::End { .. } => break,
                    Step::Corrupt { offset, reason } => {
                        return Err(Error::corrupt(&path, offset, 0, reason.to_string()))
                    }
                }
            }
        }
        w.ids_upto = head;
        Ok(())
    }
}
