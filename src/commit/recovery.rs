//! Recovery under the `LOCK` file: catching up with the frames other processes wrote,
//! starting the rules from the newest checkpoint that matches the log, and repairing a
//! torn tail (the bytes after the last whole frame, kept in a `.broken` file).

use std::sync::Arc;

use crate::error::{Error, IoContext, Result};
use crate::event::ts::Ts;
use crate::event::{
    Checked, Event, EventHead, EventType, LogDamaged, ENGINE_AGENT, GENERATED_ID_PREFIX,
};
use crate::fold::checkpoint;
use crate::fold::rules::{needs_content, RuleEvent, Rules};
use crate::log::meta::{Durability, LOCK_FILE};
use crate::log::quarantine::{self, Quarantine, Range};
use crate::log::segment::{self, FrameReader, Step};
use crate::log::storage::OpenMode;
use crate::log::watermark::{self, Pos};

use crate::commit::{lock, LiteEvent, Request, RunLog, Writer};

/// The write lead (`Combine::leader`) held outside a write group, let go on drop (a
/// panic included: every append of the process would wait for it).
struct WriteLead<'a>(&'a RunLog);

impl<'a> WriteLead<'a> {
    fn take(log: &'a RunLog) -> WriteLead<'a> {
        loop {
            {
                let mut c = lock(&log.combine);
                if !c.leader {
                    c.leader = true;
                    return WriteLead(log);
                }
            }
            // A write group is writing: it ends within one `pwrite`.
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
}

impl Drop for WriteLead<'_> {
    fn drop(&mut self) {
        self.0.end_write_lead();
    }
}

/// Copies of torn tails kept at one offset of a segment, at most (`keep_aside`).
const ASIDE_COPIES_MAX: u32 = 1000;

impl RunLog {
    /// Brings the writer up to date with the log: loads the head on first use, reads what
    /// other processes appended, repairs a torn tail, follows rotations. Under `LOCK`.
    pub(super) fn catch_up(&self, w: &mut Writer) -> Result<()> {
        if !w.loaded {
            self.load(w)?;
        }
        loop {
            // No `fstat` of the segment unless the log ends at `end`: on Linux 6.13+ a
            // query of the file's times makes the next write's time update fine-grained,
            // and the `fdatasync` after it then costs a journal commit, which is what
            // preallocation saves (measured: 4,600 against 6,700 syncs/s).
            let mut b = [0u8; 1];
            let seg_path = segment::segment_path(&self.dir, w.seg_base);
            let n = w.seg.read_at(&mut b, w.end).ctx("read", &seg_path)?;
            if n == 1 && b[0] != segment::FILL {
                // Frames other processes appended (trusted, unbounded: see `scan_tail`).
                self.scan_tail(w, None, true, None)?;
            } else if n == 0 {
                let len = w.seg.len().ctx("stat", &seg_path)?;
                w.alloc = len;
                if len < w.end {
                    // Only `swarm repair` cuts a segment below what a writer has seen
                    // (after it moved damaged bytes aside and started a new segment);
                    // anything else is damage. Either way, look at the log afresh: `load`
                    // knows which.
                    tracing::warn!(segment = %seg_path.display(), from = w.end, to = len, "segment shrank; reloading the log");
                    w.loaded = false;
                    self.load(w)?;
                    continue;
                }
                // No fill after the last frame: the segment may be sealed, early, by
                // `swarm repair` in another process (`record_loss`), which went on in a
                // later segment after declaring seqs lost: appending here would hand
                // them out again, and be taken as durable by a mark that is past it.
                // (Only without a fill: a directory read per group when preallocation
                // is off, rare with it.)
                if w.end < self.meta.segment_bytes
                    && segment::list_segments(&*self.storage, &self.dir)?
                        .iter()
                        .any(|&b| b > w.seg_base)
                {
                    tracing::warn!(segment = %seg_path.display(), "a later segment exists; reloading the log");
                    w.loaded = false;
                    self.load(w)?;
                    continue;
                }
            }
            // (Else the fill: nobody appended since this process last looked.)
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
        w.alloc = 0;
        Ok(())
    }

    /// First look at the log: the rules, head seq and ts, and the valid end. Starts from
    /// the newest checkpoint that matches the log (its rules are the fold up to there),
    /// then reads every frame after it.
    pub(super) fn load(&self, w: &mut Writer) -> Result<()> {
        let mut bases = segment::list_segments(&*self.storage, &self.dir)?;
        let durable = self.durable_mark();
        if bases.is_empty() {
            // Every segment file gone from a run whose durable mark says records were
            // acknowledged: an empty first segment (under `LOCK`), which the mark shows
            // short, so the loss is reported and `swarm repair` records it (not "run not
            // found"). Without such a mark (marks lost too) nothing tells which seqs
            // were handed out; a run being archived (its tombstone is written before its
            // files are removed, segments first) lives in its archive: not found, as
            // before, never a run that starts again at seq 1.
            if durable == Pos::default()
                || !self
                    .storage
                    .exists(&self.dir.join(crate::log::meta::META_FILE))
                || self
                    .storage
                    .exists(&self.dir.join(crate::log::meta::ARCHIVED_FILE))
            {
                return Err(Error::RunNotFound(self.run_id.clone()));
            }
            bases.push(1);
        }
        w.damage = None;
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
            let prev = w.seg_base;
            self.switch_segment(w, base)?;
            if base == from.seg {
                w.end = from.off;
                // The run's first segment gone: legal only where `swarm repair` listed
                // its seqs as lost (`scan_tail` refuses the first frame otherwise).
                if w.head_seq == 0
                    && base > 1
                    && quarantine::read(&*self.storage, &self.dir)
                        .gap(1, 1, base)
                        .is_some()
                {
                    w.head_seq = base - 1;
                }
            } else if w.head_seq + 1 < base
                && quarantine::read(&*self.storage, &self.dir)
                    .gap(prev, w.head_seq + 1, base)
                    .is_some()
            {
                // Seqs lost at the previous segment's end, listed by `swarm repair`.
                w.head_seq = base - 1;
            } else if w.head_seq + 1 > base {
                // (A later base is a gap: its first event must declare it; `scan_tail`
                // checks that with the frame.)
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
            self.scan_tail(w, Some(len), i + 1 == bases.len(), Some(durable))?;
        }
        let end = Pos {
            seg: w.seg_base,
            off: w.end,
        };
        if end < durable {
            return Err(self.acknowledged_lost(w, end, "the log ends below its durable mark"));
        }
        self.clamp_watermark(end)?;
        w.ids_upto = Pos::default();
        w.loaded = true;
        // Records readers saw but a power loss took before their fsync (`batch`, `none`):
        // never acknowledged as durable, but their seqs were seen, so they are declared
        // lost rather than handed out again with other content.
        let m = watermark::read(&*self.synced, &self.synced_path).unwrap_or_default();
        if m.visible_seq > w.head_seq {
            let lost_from = w.head_seq + 1;
            let lost_to = m.visible_seq;
            let segment = segment::segment_name(w.seg_base);
            let offset = w.end;
            tracing::warn!(run = %self.run_id, lost_from, lost_to, "records readers had seen were lost before their fsync; declaring their seqs lost");
            self.record_loss(
                w,
                lost_to,
                LogDamaged {
                    lost_from,
                    lost_to,
                    segment,
                    offset,
                    bytes: 0,
                    kept_in: String::new(),
                    reason: "records readers had seen (batch or none durability) were lost before their fsync".into(),
                },
            )?;
        }
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
            let mut m = self.synced_marks();
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
    ///
    /// With `len` (a first look, `load`), frames up to `len`, checking that only the fill
    /// follows the last one. Without (catching up under the lock on a log this process
    /// has checked): up to the fill or the end of the file, whatever its length, trusting
    /// the fill; what other processes wrote since is a few frames.
    pub(super) fn scan_tail(
        &self,
        w: &mut Writer,
        len: Option<u64>,
        last_segment: bool,
        durable: Option<Pos>,
    ) -> Result<()> {
        let path = segment::segment_path(&self.dir, w.seg_base);
        let mut r = match len {
            Some(len) => FrameReader::new(w.seg.clone(), path.clone(), w.end, Some(len))?,
            None => FrameReader::unbounded(w.seg.clone(), path.clone(), w.end)
                .with_chunk(16 << 10)
                .trust_fill(),
        };
        // Where the next valid frame after damage is, once looked for: looking again
        // from there would pass over it (the search starts past the reader's position).
        let mut found_next: Option<Option<u64>> = None;
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
                    for (i, e) in events.iter().enumerate() {
                        if i == 0 && e.seq > w.head_seq + 1 && w.end == 0 {
                            // A new segment after a repair: legal only if its first event
                            // declares exactly the lost seqs.
                            let content: serde_json::Value =
                                serde_json::from_str(e.content.get()).unwrap_or_default();
                            if LogDamaged::declared(e.kind, &content)
                                == Some((w.head_seq + 1, e.seq - 1))
                            {
                                w.head_seq = e.seq - 1;
                            }
                        }
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
                    // An older segment cut inside a frame whose lost seqs `swarm repair`
                    // listed (from its last whole frame on): it ends there; the next
                    // segment's start is checked against the list.
                    let listed = incomplete
                        && !last_segment
                        && quarantine::read(&*self.storage, &self.dir).cut_at(
                            w.seg_base,
                            offset,
                            w.head_seq + 1,
                        );
                    if incomplete && !listed {
                        break (offset, "incomplete frame");
                    }
                    w.end = offset;
                    break (u64::MAX, "");
                }
                Step::Corrupt { offset, reason } => {
                    // Damage `swarm repair` quarantined (the same start, the next valid
                    // frame where it was): stepped over, its seqs stay lost.
                    let next = r.skip_to_next_frame()?;
                    found_next = Some(next);
                    // (Without a next frame only in an older segment: the damage runs
                    // to its end.)
                    let q = quarantine::read(&*self.storage, &self.dir);
                    let listed = q
                        .at(w.seg_base, offset)
                        .filter(|q| q.end == next && (next.is_some() || !last_segment));
                    match listed {
                        Some(q) => {
                            // (Not the damage the scan ends at, if it ends at any.)
                            found_next = None;
                            w.head_seq = q.lost_to;
                            if next.is_none() {
                                break (u64::MAX, "");
                            }
                        }
                        None => break (offset, reason),
                    }
                }
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
        let next = match found_next {
            Some(n) => n,
            None => r.skip_to_next_frame()?,
        };
        if let Some(next) = next {
            return Err(Error::corrupt(
                &path,
                bad_at,
                w.head_seq + 1,
                format!("{reason}; valid records follow at byte {next}, refusing to truncate"),
            ));
        }
        let at = Pos {
            seg: w.seg_base,
            off: bad_at,
        };
        // Read lazily on the catch-up path: damage is rare, the append path is not.
        if at < durable.unwrap_or_else(|| self.durable_mark()) {
            return Err(self.acknowledged_lost(w, at, reason));
        }
        let len = match len {
            Some(len) => len,
            None => w.seg.len().ctx("stat", &path)?,
        };
        self.repair_tail(w, bad_at, len, reason)
    }

    /// The durable mark as `SYNCED` has it; the start of the log when it is missing or
    /// unreadable (then only whole frames can be trusted, and what follows them is a
    /// torn tail, as before marks existed).
    pub(super) fn durable_mark(&self) -> Pos {
        match watermark::read(&*self.synced, &self.synced_path) {
            Ok(m) => m.durable,
            Err(e) => {
                tracing::warn!(path = %self.synced_path.display(), error = %e, "unreadable durable mark; trusting whole frames only");
                Pos::default()
            }
        }
    }

    /// The error for acknowledged bytes found damaged or missing at `at`: appends stop
    /// until `swarm repair` records the loss.
    pub(super) fn acknowledged_lost(&self, w: &mut Writer, at: Pos, reason: &str) -> Error {
        w.damage = Some(at);
        // Look again next time: `swarm repair` in another process may have moved the
        // damage aside and gone on in a new segment by then.
        w.loaded = false;
        let m = watermark::read(&*self.synced, &self.synced_path).unwrap_or_default();
        let from = w.head_seq + 1;
        let upto = m.visible_seq.max(m.durable_seq);
        let seqs = if upto >= from {
            format!("seqs {from}..={upto}")
        } else {
            format!("records from seq {from}")
        };
        Error::corrupt(
            &segment::segment_path(&self.dir, at.seg),
            at.off,
            from,
            format!(
                "{reason}, below the durable mark (segment {}, byte {}): acknowledged {seqs} are lost; appends are refused until `swarm repair --run {}` moves the damage aside",
                m.durable.seg, m.durable.off, self.run_id
            ),
        )
    }

    /// `swarm repair`: when the log's acknowledged bytes end in damage (a cut segment, a
    /// flipped last frame, a lost last segment), moves the damaged bytes aside into a
    /// `.damaged` file, truncates the segment to its intact prefix, and starts a new
    /// segment whose first event, `log_damaged`, declares the lost seqs: numbering goes on
    /// after the highest seq readers may have seen, so no seq is ever reused. Returns the
    /// `log_damaged` event, or `None` when nothing needed repair. Damage followed by valid
    /// records is refused: cutting would drop the valid ones.
    ///
    /// `middle`: damage followed by valid records (found by a read of the whole run),
    /// quarantined first (`log::quarantine`): its bytes copied aside, the range listed,
    /// and after any tail repair one `log_damaged` event per range with lost seqs.
    /// Returns the `log_damaged` events written, the tail's first.
    /// `undeclared`: ranges listed earlier whose `log_damaged` event is missing (a repair
    /// that crashed in between), declared now. `declared`: the losses the log already
    /// declares; a range listed again (its `QUARANTINE` was lost) is not declared twice.
    pub(crate) fn repair(
        &self,
        middle: &[Range],
        undeclared: &[Range],
        declared: &[LogDamaged],
    ) -> Result<Vec<Event>> {
        // Holds the write lead, as a write group does, for as long as it holds the writer:
        // the fsync leader then writes nothing meanwhile, so that it never waits for the
        // writer while this waits for its fsync (the `log_damaged` events are made
        // durable under the writer). Before, a repair beside `sync` appends of the same
        // process could wait for ever.
        let _lead = WriteLead::take(self);
        let mut w = lock(&self.writer);
        let lock_path = self.dir.join(LOCK_FILE);
        w.lock_file.lock().ctx("lock", &lock_path)?;
        let r = (|| {
            let mut listed = self.quarantine_ranges(middle)?;
            for r in undeclared {
                if !listed.contains(r) {
                    listed.push(r.clone());
                }
            }
            let mut out: Vec<Event> = self.repair_locked(&mut w)?.into_iter().collect();
            if !listed.is_empty() {
                if !w.loaded {
                    self.load(&mut w)?;
                }
                listed.retain(|r| {
                    let seg = segment::segment_name(r.segment);
                    !declared.iter().any(|d| {
                        (d.segment.as_str(), d.offset, d.lost_from, d.lost_to)
                            == (seg.as_str(), r.offset, r.lost_from, r.lost_to)
                    })
                });
                out.extend(self.declare_quarantined(&mut w, &listed)?);
            }
            Ok(out)
        })();
        if let Err(e) = w.lock_file.unlock().ctx("unlock", &lock_path) {
            tracing::error!(error = %e, "cannot release the append lock");
        }
        r
    }

    /// Lists `ranges` in the run's quarantine, each one's bytes first copied aside
    /// (`<segment>.<offset>.damaged`, fsynced). Returns the ranges newly listed.
    fn quarantine_ranges(&self, ranges: &[Range]) -> Result<Vec<Range>> {
        let mut q: Quarantine = quarantine::read(&*self.storage, &self.dir);
        let mut listed = Vec::new();
        for r in ranges {
            if q.at(r.segment, r.offset) == Some(r) {
                continue;
            }
            let path = segment::segment_path(&self.dir, r.segment);
            // Seqs lost with their whole segment (the run's first): nothing to copy.
            if !self.storage.exists(&path) {
                self.write_aside(&self.dir.join(&r.kept_in), &[])?;
                q.add(r.clone());
                listed.push(r.clone());
                continue;
            }
            let f = self
                .storage
                .open(&path, OpenMode::Read)
                .ctx("open", &path)?;
            let end = match r.end {
                Some(e) => e,
                None => {
                    let len = f.len().ctx("stat", &path)?;
                    segment::content_end(&*f, r.offset, len).ctx("read", &path)?
                }
            };
            let mut bytes = vec![0u8; end.saturating_sub(r.offset) as usize];
            f.read_exact_at(&mut bytes, r.offset).ctx("read", &path)?;
            self.write_aside(&self.dir.join(&r.kept_in), &bytes)?;
            q.add(r.clone());
            listed.push(r.clone());
        }
        if !listed.is_empty() {
            // The copies' names are durable before the list that names them.
            self.storage
                .sync_dir(&self.dir)
                .ctx("fsync dir", &self.dir)?;
            quarantine::write(&self.storage, &self.dir, &q)?;
        }
        Ok(listed)
    }

    /// One `log_damaged` event per quarantined range that lost seqs, durably, at the end
    /// of the log (no gap to declare there: the lost seqs lie below the head).
    fn declare_quarantined(&self, w: &mut Writer, ranges: &[Range]) -> Result<Vec<Event>> {
        let records: Vec<LogDamaged> = ranges
            .iter()
            .filter(|r| r.lost_to >= r.lost_from)
            .map(|r| LogDamaged {
                lost_from: r.lost_from,
                lost_to: r.lost_to,
                segment: segment::segment_name(r.segment),
                offset: r.offset,
                bytes: r.end.map_or(0, |e| e.saturating_sub(r.offset)),
                kept_in: r.kept_in.clone(),
                reason: format!("quarantined: {}", r.reason),
            })
            .collect();
        self.append_damage_records(w, records)
    }

    /// Appends `records` as `log_damaged` engine events in one durable group. Under
    /// `LOCK`, the writer loaded.
    fn append_damage_records(
        &self,
        w: &mut Writer,
        records: Vec<LogDamaged>,
    ) -> Result<Vec<Event>> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let mut events = Vec::with_capacity(records.len());
        for record in records {
            let content = serde_json::to_value(&record)
                .map_err(|e| Error::invalid("log_damaged", e.to_string()))?;
            events.push(Checked::engine(
                ENGINE_AGENT,
                &self.meta.user_id,
                EventType::LogDamaged,
                content,
                None,
                Vec::new(),
            ));
        }
        let req = Request::new(events, None, Durability::Sync);
        let outcome = self
            .write_group_locked(w, vec![req])?
            .into_iter()
            .next()
            .ok_or_else(|| Error::invalid("log_damaged", "no outcome"))??;
        if let (Some(seg), Some(last)) = (&outcome.seg, outcome.events.last()) {
            self.wait_durable(outcome.end, last.seq, seg)?;
        }
        Ok(outcome.events)
    }

    fn repair_locked(&self, w: &mut Writer) -> Result<Option<Event>> {
        w.loaded = false;
        match self.load(w) {
            Ok(()) => return Ok(None),
            Err(e) if w.damage.is_none() => return Err(e),
            Err(e) => tracing::warn!(error = %e, "repairing"),
        }
        let m = watermark::read(&*self.synced, &self.synced_path).unwrap_or_default();
        let lost_from = w.head_seq + 1;
        // Format-1 marks carry no seqs: then at least one seq is declared lost, so that
        // whatever a reader saw last is not handed out again with other content.
        let lost_to = m.visible_seq.max(m.durable_seq).max(lost_from);
        let seg_path = segment::segment_path(&self.dir, w.seg_base);
        let len = w.seg.len().ctx("stat", &seg_path)?;
        let at = w.end;
        // Nothing left to move when a repair is resumed after a crash that came after the
        // cut: the first attempt's copy stays as it is.
        let (kept, bytes) = self.keep_aside(w, at, len, "damaged", true)?;
        w.seg.set_len(at).ctx("truncate", &seg_path)?;
        w.alloc = at;
        self.fsync_segment(&*w.seg, &seg_path)?;
        let kept_in = kept
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let damaged = self.record_loss(
            w,
            lost_to,
            LogDamaged {
                lost_from,
                lost_to,
                segment: segment::segment_name(w.seg_base),
                offset: at,
                bytes: bytes.len() as u64,
                kept_in,
                reason: "acknowledged bytes damaged or missing".into(),
            },
        )?;
        tracing::warn!(
            run = %self.run_id,
            lost_from,
            lost_to,
            kept_in = %kept.display(),
            "repaired: damaged bytes moved aside, the lost seqs recorded"
        );
        Ok(Some(damaged))
    }

    /// Declares `record`'s seqs lost: starts a new segment at `lost_to + 1` whose first
    /// event is the `log_damaged` record (the gap rule readers check), durably. Under
    /// `LOCK`, with the current segment already cut to its intact end.
    fn record_loss(&self, w: &mut Writer, lost_to: u64, record: LogDamaged) -> Result<Event> {
        // The segment is sealed here: cut its zero fill (only zeros follow `end` now), as
        // `rotate` does, so sealed segments stay plain JSON lines. A crash before the cut
        // leaves the fill, which every reader and the index take as the segment's end.
        let old = segment::segment_path(&self.dir, w.seg_base);
        if w.seg.len().ctx("stat", &old)? > w.end {
            w.seg.set_len(w.end).ctx("trim", &old)?;
            self.fsync_segment(&*w.seg, &old)?;
        }
        let base = lost_to + 1;
        self.switch_segment(w, base)?;
        self.storage
            .sync_dir(&self.dir)
            .ctx("fsync dir", &self.dir)?;
        w.head_seq = lost_to;
        w.damage = None;
        w.loaded = true;
        w.ids_upto = Pos::default();
        w.ids.clear();
        self.append_damage_records(w, vec![record])?
            .into_iter()
            .next()
            .ok_or_else(|| Error::invalid("log_damaged", "no event"))
    }

    /// Rebuilds lost or unreadable marks (`SYNCED` deleted, garbled, emptied) from the
    /// log: under the lock, every CRC-valid frame is read (a torn tail past them is cut as
    /// usual: with no marks nothing is known to be acknowledged), the last segment is
    /// fsynced, and both marks are set to the end of the whole frames, with its seq.
    /// Returns how many events the marks now cover.
    pub(crate) fn rebuild_marks(&self) -> Result<u64> {
        let mut w = lock(&self.writer);
        let lock_path = self.dir.join(LOCK_FILE);
        w.lock_file.lock().ctx("lock", &lock_path)?;
        let r = (|| {
            w.loaded = false;
            self.load(&mut w)?;
            let path = segment::segment_path(&self.dir, w.seg_base);
            self.fsync_segment(&*w.seg, &path)?;
            let end = Pos {
                seg: w.seg_base,
                off: w.end,
            };
            let _io = lock(&self.sync_io);
            self.synced.lock().ctx("lock", &self.synced_path)?;
            let mut m = watermark::read(&*self.synced, &self.synced_path).unwrap_or_default();
            m.advance_durable(end, w.head_seq);
            // Not fsynced, like every `SYNCED` write: marks lost again in a power loss are
            // rebuilt again, from whatever frames the disk kept.
            let r = watermark::write(&*self.synced, &self.synced_path, m);
            let _ = self.synced.unlock();
            r?;
            lock(&self.sync).durable = end;
            Ok(w.head_seq)
        })();
        if let Err(e) = w.lock_file.unlock().ctx("unlock", &lock_path) {
            tracing::error!(error = %e, "cannot release the append lock");
        }
        r
    }

    /// Copies bytes `[at, len)` of the current segment, but for a trailing zero fill, to
    /// `<segment>.<at>.<suffix>`
    /// beside it, fsynced, before they are cut. With `keep_existing`, an existing copy is
    /// left alone when there is nothing left to copy (a resumed repair).
    fn keep_aside(
        &self,
        w: &Writer,
        at: u64,
        len: u64,
        suffix: &str,
        keep_existing: bool,
    ) -> Result<(std::path::PathBuf, Vec<u8>)> {
        let path = segment::segment_path(&self.dir, w.seg_base);
        // The zero fill of a preallocated segment is not part of what was written.
        let end = segment::content_end(&*w.seg, at, len).ctx("read", &path)?;
        let mut bytes = vec![0u8; (end - at) as usize];
        w.seg.read_exact_at(&mut bytes, at).ctx("read", &path)?;
        let name = |n: u32| {
            let seg = segment::segment_name(w.seg_base);
            match n {
                1 => self.dir.join(format!("{seg}.{at}.{suffix}")),
                n => self.dir.join(format!("{seg}.{at}.{n}.{suffix}")),
            }
        };
        let aside = name(1);
        if bytes.is_empty() && keep_existing && self.storage.exists(&aside) {
            return Ok((aside, bytes));
        }
        if keep_existing {
            self.write_aside(&aside, &bytes)?;
            return Ok((aside, bytes));
        }
        // Torn tails can repeat at one offset (a write that keeps failing part-way):
        // each is kept in a file of its own, never over an earlier one. The same bytes
        // as a copy there (a repair resumed after a crash) reuse it.
        // An empty copy holds nothing (a crash between its creation and its write) and
        // is written over.
        for n in 1..=ASIDE_COPIES_MAX {
            let aside = name(n);
            if !self.storage.exists(&aside) {
                self.write_new_aside(&aside, &bytes)?;
                return Ok((aside, bytes));
            }
            let f = self
                .storage
                .open(&aside, OpenMode::Read)
                .ctx("open", &aside)?;
            let len = f.len().ctx("stat", &aside)?;
            if len == 0 {
                self.write_new_aside(&aside, &bytes)?;
                return Ok((aside, bytes));
            }
            if len == bytes.len() as u64 {
                let mut have = vec![0u8; bytes.len()];
                f.read_exact_at(&mut have, 0).ctx("read", &aside)?;
                if have == bytes {
                    return Ok((aside, bytes));
                }
            }
        }
        Err(Error::Io {
            op: "keep aside",
            path: aside,
            source: std::io::Error::other(format!(
                "{ASIDE_COPIES_MAX} cut tails are kept at this offset already; move them away to cut another"
            )),
        })
    }

    /// [`Self::write_aside`] to a file that held nothing: a failed write removes it, so
    /// that the attempts at a full disk do not pile up empty copies (each one new: after
    /// `ASIDE_COPIES_MAX` of them no tail could be cut there again, and the run took no
    /// append, even once space was freed).
    fn write_new_aside(&self, aside: &std::path::Path, bytes: &[u8]) -> Result<()> {
        let r = self.write_aside(aside, bytes);
        if r.is_err() {
            let _ = self.storage.remove_file(aside);
        }
        r.map_err(|e| match e {
            Error::Io { op, path, source }
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
                ) =>
            {
                Error::Io {
                    op,
                    path,
                    source: std::io::Error::new(
                        source.kind(),
                        format!("{source}: a torn tail must be copied aside before it is cut, and there is no space for the copy"),
                    ),
                }
            }
            e => e,
        })
    }

    /// Writes `bytes` as the whole of file `aside` (created or replaced), fsynced.
    fn write_aside(&self, aside: &std::path::Path, bytes: &[u8]) -> Result<()> {
        let f = self
            .storage
            .open(aside, OpenMode::ReadWriteCreate)
            .ctx("create", aside)?;
        f.set_len(0).ctx("truncate", aside)?;
        f.write_all_at(bytes, 0).ctx("write", aside)?;
        f.sync_data().ctx("fsync", aside)
    }

    pub(super) fn repair_tail(
        &self,
        w: &mut Writer,
        at: u64,
        len: u64,
        reason: &str,
    ) -> Result<()> {
        let path = segment::segment_path(&self.dir, w.seg_base);
        let (broken, kept) = self.keep_aside(w, at, len, "broken", false)?;
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
            let mut m = self.synced_marks();
            m.durable = m.durable.min(cut);
            m.visible = m.visible.min(cut);
            watermark::write(&*self.synced, &self.synced_path, m)
        })();
        let _ = self.synced.unlock();
        r?;
        w.end = at;
        w.alloc = at;
        tracing::warn!(
            segment = %path.display(),
            offset = at,
            bytes = kept.len(),
            reason,
            kept_in = %broken.display(),
            "truncated a torn tail left by a writer that died mid-write"
        );
        Ok(())
    }

    /// Loads the client ids of every frame since `ids_upto` (lazily: only appends that
    /// carry an id pay for it).
    pub(super) fn catch_up_ids(&self, w: &mut Writer) -> Result<()> {
        let head = Pos {
            seg: w.seg_base,
            off: w.end,
        };
        let ids = &mut w.ids;
        self.walk_heads(w.ids_upto, head, |h, at| {
            if !h.id.starts_with(GENERATED_ID_PREFIX) {
                ids.insert(h.id.into_owned(), (h.seq, at));
            }
        })?;
        w.ids_upto = head;
        Ok(())
    }

    /// For a group holding recovered hand-offs (`Request::recover_since`): finds their
    /// generated ids in the frames after the earliest such seq and adds them to `ids`
    /// (client ids are there already), so that `prepare` returns a batch the committer
    /// stored instead of storing it again. Returns the ids added, to forget after the
    /// group. Rare (a committing process died mid-request), so a scan is fine.
    pub(super) fn find_recovered(&self, w: &mut Writer, reqs: &[Request]) -> Result<Vec<String>> {
        let Some(since) = reqs.iter().filter_map(|r| r.recover_since).min() else {
            return Ok(Vec::new());
        };
        let want: std::collections::HashSet<&str> = reqs
            .iter()
            .filter(|r| r.recover_since.is_some())
            .flat_map(|r| r.batch.iter().filter_map(|c| c.id.as_deref()))
            .filter(|id| id.starts_with(GENERATED_ID_PREFIX))
            .collect();
        if want.is_empty() {
            return Ok(Vec::new());
        }
        // The segment holding `since + 1`: the last whose base is at or below it.
        let bases = segment::list_segments(&*self.storage, &self.dir)?;
        let from = bases
            .iter()
            .rev()
            .find(|&&b| b <= since.saturating_add(1))
            .or(bases.first())
            .map_or(Pos::default(), |&seg| Pos { seg, off: 0 });
        let head = Pos {
            seg: w.seg_base,
            off: w.end,
        };
        let mut found = Vec::new();
        let ids = &mut w.ids;
        self.walk_heads(from, head, |h, at| {
            if h.seq > since && want.contains(h.id.as_ref()) {
                found.push(h.id.to_string());
                ids.insert(h.id.into_owned(), (h.seq, at));
            }
        })?;
        Ok(found)
    }

    /// Calls `f` with every event head (id and seq) of the frames from `from` to `head`,
    /// and its frame's start. Damage `swarm repair` quarantined is stepped over; other
    /// damage is an error.
    fn walk_heads(
        &self,
        from: Pos,
        head: Pos,
        mut f: impl FnMut(EventHead<'_>, Pos),
    ) -> Result<()> {
        let bases = segment::list_segments(&*self.storage, &self.dir)?;
        for &base in &bases {
            if base > head.seg {
                break;
            }
            if base < from.seg {
                continue;
            }
            let start = if base == from.seg { from.off } else { 0 };
            let limit = if base == head.seg {
                Some(head.off)
            } else {
                None
            };
            let path = segment::segment_path(&self.dir, base);
            let mut r = FrameReader::open(&*self.storage, &path, start, limit)?;
            loop {
                match r.step()? {
                    Step::Frame { offset, .. } => {
                        let heads: Vec<EventHead> =
                            serde_json::from_slice(r.payload()).map_err(|e| {
                                Error::corrupt(&path, offset, 0, format!("bad event JSON: {e}"))
                            })?;
                        for h in heads {
                            f(
                                h,
                                Pos {
                                    seg: base,
                                    off: offset,
                                },
                            );
                        }
                    }
                    Step::End { .. } => break,
                    Step::Corrupt { offset, reason } => {
                        // Damage `swarm repair` quarantined holds no ids any more.
                        let next = r.skip_to_next_frame()?;
                        let listed = quarantine::read(&*self.storage, &self.dir)
                            .at(base, offset)
                            .is_some_and(|q| q.end == next);
                        if !listed {
                            return Err(Error::corrupt(&path, offset, 0, reason.to_string()));
                        }
                        if next.is_none() {
                            break;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
