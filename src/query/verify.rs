//! `verify`: every frame of a run checked, damage and torn tails reported, nothing changed.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

use crate::error::{Error, IoContext, Result};
use crate::log::storage::{OpenMode, Storage};
use crate::log::watermark::{read_marks, Pos};
use crate::query::options::{ReadOptions, Visibility};
use crate::query::read::{EventIter, Skipped, TornTail};

/// What `verify` found in one run.
#[derive(Clone, Debug, Serialize)]
pub struct VerifyReport {
    /// The run.
    pub run: String,
    /// True when no corruption was found (a torn tail is not corruption).
    pub ok: bool,
    /// Segment files.
    pub segments: usize,
    /// Whole frames (atomic commits).
    pub frames: u64,
    /// Events in them.
    pub records: u64,
    /// Bytes of whole frames.
    pub bytes: u64,
    /// Last seq found.
    pub head_seq: u64,
    /// Events written but not yet visible to readers (not yet durable in sync mode).
    pub unsynced_records: u64,
    /// Durable and visible positions.
    pub durable: Pos,
    /// Visible position.
    pub visible: Pos,
    /// Bytes after the last whole record, to be cut by the next writer.
    pub torn_tail: Option<TornTail>,
    /// Tails cut earlier, kept in `.broken` files.
    pub repaired_tails: Vec<RepairedTail>,
    /// Damaged records (never dropped silently).
    pub corrupt: Vec<Skipped>,
    /// Damage `swarm repair` quarantined (declared lost, its bytes kept aside): stepped
    /// over by every read, not counted as corruption.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<crate::log::quarantine::Range>,
    /// Auxiliary files found lost or unreadable: the `SYNCED` marks (rebuilt from the
    /// log before the check), damaged or stale checkpoints and index files (derived:
    /// ignored and rebuilt), and `run.json` (then `ok` is false: `swarm repair`).
    pub rebuilt: Vec<String>,
}

/// A torn tail a writer cut off earlier.
#[derive(Clone, Debug, Serialize)]
pub struct RepairedTail {
    /// The `.broken` file holding the removed bytes.
    pub file: PathBuf,
    /// How many bytes.
    pub bytes: u64,
}

pub(crate) fn verify(
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    run_id: &str,
    mut progress: impl FnMut(u64),
) -> Result<VerifyReport> {
    let marks = read_marks(&*storage, &dir)?;
    let opts = ReadOptions {
        skip_corrupt: true,
        visibility: Visibility::Written,
        ..ReadOptions::default()
    };
    let mut it = EventIter::new(storage.clone(), dir.clone(), run_id, opts)?;
    let mut records = 0u64;
    let mut head_seq = 0u64;
    let mut corrupt_err: Vec<Skipped> = Vec::new();
    let mut unsynced = 0u64;
    let mut visible_seq = 0u64;
    while let Some(r) = it.next() {
        match r {
            Ok(e) => {
                records += 1;
                head_seq = e.seq;
                if it.position() <= marks.visible {
                    visible_seq = e.seq;
                }
                if records.is_multiple_of(65_536) {
                    progress(records);
                }
            }
            Err(Error::Corrupt {
                path,
                offset,
                seq,
                reason,
            }) => {
                corrupt_err.push(Skipped {
                    segment: path,
                    offset,
                    resumed_at: offset,
                    seq,
                    reason,
                    gap_to: None,
                });
                break;
            }
            Err(e) => return Err(e),
        }
    }
    if head_seq > visible_seq {
        unsynced = head_seq - visible_seq;
    }
    let mut corrupt = it.skipped().to_vec();
    corrupt.extend(corrupt_err);
    let mut repaired = Vec::new();
    let mut names = storage.list(&dir).ctx("list", &dir)?;
    names.sort();
    for n in names.iter().filter(|n| n.ends_with(".broken")) {
        let p = dir.join(n);
        let f = storage.open(&p, OpenMode::Read).ctx("open", &p)?;
        repaired.push(RepairedTail {
            bytes: f.len().ctx("stat", &p)?,
            file: p,
        });
    }
    Ok(VerifyReport {
        run: run_id.to_string(),
        ok: corrupt.is_empty(),
        segments: it.segments(),
        frames: it.frames(),
        records,
        bytes: it.bytes(),
        head_seq,
        unsynced_records: unsynced,
        durable: marks.durable,
        visible: marks.visible,
        torn_tail: it.torn_tail().cloned(),
        repaired_tails: repaired,
        corrupt,
        quarantined: it.quarantined().to_vec(),
        rebuilt: Vec::new(),
    })
}

/// The damage of a run that valid records follow (found by reading every record): what
/// `swarm repair` quarantines, as ranges with the seqs each lost (from the seq expected
/// at the damage to the one before the next intact record). Damage with nothing intact
/// after it is a tail (cut by repair's other path), and damage right after other damage
/// is left out (its lost seqs are not known): both stay reported.
pub(crate) fn middle_damage(
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    run_id: &str,
) -> Result<Vec<crate::log::quarantine::Range>> {
    let opts = ReadOptions {
        skip_corrupt: true,
        visibility: Visibility::Written,
        ..ReadOptions::default()
    };
    let mut it = EventIter::new(storage.clone(), dir, run_id, opts)?;
    let mut ranges = Vec::new();
    let mut seen = 0;
    while let Some(e) = it.next() {
        let Ok(e) = e else { break };
        let skipped = it.skipped();
        // Exactly one new damage since the last intact record: it ends here.
        if skipped.len() == seen + 1 {
            let d = &skipped[seen];
            // Seqs missing at a segment's end: listed as lost there, nothing to copy.
            let gap = d.gap_to.zip(
                d.segment
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(crate::log::segment::parse_segment_name),
            );
            if let Some((lost_to, base)) = gap {
                ranges.push(crate::log::quarantine::Range {
                    segment: base,
                    offset: d.offset,
                    end: None,
                    lost_from: d.seq,
                    lost_to,
                    kept_in: format!(
                        "{}.{}.damaged",
                        crate::log::segment::segment_name(base),
                        d.offset
                    ),
                    reason: match (base, d.offset, crate::log::segment::segment_name(base)) {
                        (1, 0, name) if d.seq == 1 => format!(
                            "seqs 1..={lost_to} missing: the run's first segment, {name}, is gone"
                        ),
                        (_, _, name) => format!(
                            "seqs {}..={lost_to} missing after byte {} of {name} (cut short, or the segment after it lost)",
                            d.seq, d.offset
                        ),
                    },
                });
                seen = skipped.len();
                continue;
            }
            let base = d
                .segment
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(crate::log::segment::parse_segment_name);
            let same_segment = d.resumed_at > d.offset && it.position().seg == base.unwrap_or(0);
            let crc_damage = base.is_some_and(|_| !whole_frame_at(&*storage, &d.segment, d.offset));
            if let Some(base) = base.filter(|_| d.resumed_at > d.offset && crc_damage) {
                ranges.push(crate::log::quarantine::Range {
                    segment: base,
                    offset: d.offset,
                    end: same_segment.then_some(d.resumed_at),
                    lost_from: d.seq,
                    lost_to: e.seq.saturating_sub(1).max(d.seq.saturating_sub(1)),
                    kept_in: format!(
                        "{}.{}.damaged",
                        crate::log::segment::segment_name(base),
                        d.offset
                    ),
                    reason: d.reason.clone(),
                });
            }
        }
        seen = skipped.len();
    }
    Ok(ranges)
}

/// Whether a CRC-valid frame starts at `offset` of `path`: then the damage there is in
/// what it says (seqs, times, run, JSON), which readers other than `EventIter` cannot
/// step over; repair leaves it reported rather than list it.
fn whole_frame_at(storage: &dyn Storage, path: &std::path::Path, offset: u64) -> bool {
    crate::log::segment::FrameReader::open(storage, path, offset, None)
        .and_then(|mut r| r.step())
        .is_ok_and(|s| matches!(s, crate::log::segment::Step::Frame { .. }))
}
