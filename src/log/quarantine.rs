//! Quarantined damage: ranges of a run's segments whose acknowledged bytes were found
//! damaged *with valid records after them* (a flipped bit in the middle of a segment),
//! declared lost by `swarm repair`.
//!
//! Such damage cannot be cut off as a torn tail is (the valid records after it would go
//! with it), and until it is declared every full read of the run stops there: the board,
//! replay, context, and a writer that opens the run (it checks the last segment) refuse
//! it. `repair` copies the damaged bytes aside (`<segment>.<offset>.damaged`), lists the
//! range here (`QUARANTINE`, written atomically and fsynced before anything relies on
//! it), and appends one `log_damaged` event per range naming the lost seqs. Readers and
//! writers then step over a listed range, and only a listed one: the damage must start
//! at the listed offset and the next valid frame at the listed end, so damage that
//! spreads, or new damage anywhere else, is reported as before. The seqs inside are
//! never handed out again (they lie below the head). A lost or garbled `QUARANTINE`
//! makes the damage show again (exit 3) until `repair` lists it again: it fails safe.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{IoContext, Result};
use crate::log::storage::{OpenMode, Storage};

/// The file, in the run directory.
pub const QUARANTINE_FILE: &str = "QUARANTINE";

/// One quarantined range.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Range {
    /// The segment's base seq (its file name).
    pub segment: u64,
    /// Where the damage starts.
    pub offset: u64,
    /// Where the next valid frame starts; `None`: the damage runs to the segment's end.
    pub end: Option<u64>,
    /// First seq lost.
    pub lost_from: u64,
    /// Last seq lost.
    pub lost_to: u64,
    /// The copy of the damaged bytes, beside the segment.
    pub kept_in: String,
    /// What was wrong with them.
    pub reason: String,
}

/// The quarantined ranges of a run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Quarantine {
    /// Format version (1).
    pub version: u32,
    /// The ranges, in log order.
    pub ranges: Vec<Range>,
}

impl Quarantine {
    /// The range whose damage starts at `offset` of segment `segment`.
    pub fn at(&self, segment: u64, offset: u64) -> Option<&Range> {
        self.ranges
            .iter()
            .find(|r| r.segment == segment && r.offset == offset)
    }

    /// The range listing seqs `want..base` as lost at the end of segment `segment`
    /// (cut short, or followed by a lost segment): the read of `segment` ended wanting
    /// `want`, and the next segment starts at `base`.
    pub fn gap(&self, segment: u64, want: u64, base: u64) -> Option<&Range> {
        self.ranges.iter().find(|r| {
            r.segment == segment
                && r.end.is_none()
                && r.lost_from == want
                && r.lost_to.checked_add(1) == Some(base)
        })
    }

    /// Whether a range lists as lost everything from `offset` of segment `segment` to
    /// that segment's end, from seq `lost_from` on: then an incomplete frame there (a
    /// segment cut inside a frame) is that segment's end. The range starts there, or
    /// at the start of a later segment when the ones between were emptied too (readers
    /// find the seqs missing only where frames resume, and list them at the last
    /// segment they read, an empty one); each reader still checks the next segment's
    /// first seq against the range, so a segment between that holds frames is an error.
    pub fn cut_at(&self, segment: u64, offset: u64, lost_from: u64) -> bool {
        self.ranges.iter().any(|r| {
            r.end.is_none()
                && r.lost_from == lost_from
                && ((r.segment, r.offset) == (segment, offset)
                    || (r.segment > segment && r.offset == 0))
        })
    }

    /// Adds `r`, replacing a range that starts at the same place (damage that spread
    /// since it was listed); keeps log order.
    pub fn add(&mut self, r: Range) {
        self.ranges
            .retain(|x| (x.segment, x.offset) != (r.segment, r.offset));
        self.ranges.push(r);
        self.ranges.sort_by_key(|r| (r.segment, r.offset));
    }
}

/// Reads `dir`'s quarantine: none when the file is absent; a garbled one is none too,
/// with a warning (the damage it listed is then reported again: fails safe).
pub fn read(storage: &dyn Storage, dir: &Path) -> Quarantine {
    let path = dir.join(QUARANTINE_FILE);
    if !storage.exists(&path) {
        return Quarantine::default();
    }
    let parsed = (|| -> Result<Quarantine> {
        let f = storage.open(&path, OpenMode::Read).ctx("open", &path)?;
        let len = f.len().ctx("stat", &path)?;
        let mut b = vec![0u8; len.min(16 << 20) as usize];
        f.read_exact_at(&mut b, 0).ctx("read", &path)?;
        serde_json::from_slice(&b)
            .map_err(|e| crate::error::Error::corrupt(&path, 0, 0, format!("bad JSON: {e}")))
    })();
    parsed.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "unreadable quarantine list: its damage is reported again until `swarm repair` lists it");
        Quarantine::default()
    })
}

/// Writes `dir`'s quarantine atomically and durably.
pub fn write(storage: &Arc<dyn Storage>, dir: &Path, q: &Quarantine) -> Result<()> {
    let mut q = q.clone();
    q.version = 1;
    let bytes = serde_json::to_vec_pretty(&q)
        .map_err(|e| crate::error::Error::invalid("quarantine", e.to_string()))?;
    crate::log::storage::write_atomic(storage, dir, QUARANTINE_FILE, &bytes)?;
    Ok(())
}
