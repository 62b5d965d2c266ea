//! `swarm runs`: a summary of each run, damaged ones included.

use serde::Serialize;

use crate::error::{Error, IoContext, Result};
use crate::event::ts::Ts;
use crate::event::Event;
use crate::log::meta;
use crate::log::segment;
use crate::log::storage::file_len;
use crate::query::options::ReadOptions;
use crate::query::read::EventIter;
use crate::store::Store;

/// A summary of one run, as `swarm runs` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct RunInfo {
    /// The run id.
    pub run_id: String,
    /// Its owner.
    pub user_id: String,
    /// Visible events (the head seq).
    pub events: u64,
    /// Head seq.
    pub head_seq: u64,
    /// Bytes in its segments.
    pub bytes: u64,
    /// Segment files.
    pub segments: usize,
    /// Time of the first event.
    pub first_ts: Option<Ts>,
    /// Time of the last visible event.
    pub last_ts: Option<Ts>,
    /// Creation time.
    pub created: Ts,
    /// Damaged records met while reading the first and the last events (skipped: the
    /// other figures are what could be read), named with where they are. Absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub damaged: Option<String>,
}

impl Store {
    /// A summary of one run.
    pub fn run_info(&self, run: &str) -> Result<RunInfo> {
        let dir = self.existing_run(run)?;
        match self.archived_store(run) {
            Ok(Some(a)) => return a.run_info(run),
            Ok(None) => {}
            // A closed run whose archive does not read back is listed, with why.
            Err(e @ Error::Corrupt { .. }) => {
                let meta = meta::read_meta(&*self.storage, &dir)?;
                return Ok(RunInfo {
                    run_id: run.to_string(),
                    user_id: meta.user_id,
                    events: 0,
                    head_seq: 0,
                    bytes: 0,
                    segments: 0,
                    first_ts: None,
                    last_ts: None,
                    created: meta.created,
                    damaged: Some(format!("archive not readable: {e}")),
                });
            }
            Err(e) => return Err(e),
        }
        let meta = meta::read_meta(&*self.storage, &dir)?;
        let bases = segment::list_segments(&*self.storage, &dir)?;
        let mut bytes = 0;
        for (i, &b) in bases.iter().enumerate() {
            let p = segment::segment_path(&dir, b);
            let len = file_len(&*self.storage, &p)?;
            bytes += match i + 1 == bases.len() {
                // The active segment: what was written, not its preallocated fill.
                true => {
                    let f = self
                        .storage
                        .open(&p, crate::log::storage::OpenMode::Read)
                        .ctx("open", &p)?;
                    segment::content_end(&*f, 0, len).ctx("read", &p)?
                }
                false => len,
            };
        }
        // Damaged records are skipped and reported, not fatal: a listing of the user's
        // runs must show every run, a damaged one too (`swarm verify` tells the rest).
        let mut damaged = None;
        let mut note = |it: &EventIter| {
            if let Some(s) = it.skipped().first() {
                damaged.get_or_insert_with(|| {
                    format!(
                        "damaged bytes at {} byte {} (seq {}): {}; see swarm verify",
                        self.shown_path(&s.segment),
                        s.offset,
                        s.seq,
                        s.reason
                    )
                });
            }
        };
        let mut it = self.read(
            run,
            ReadOptions {
                limit: Some(1),
                skip_corrupt: true,
                ..ReadOptions::default()
            },
        )?;
        let first = it.next().transpose()?;
        note(&it);
        // The last visible event: read from the last segment that has one.
        let mut last: Option<Event> = None;
        for &b in bases.iter().rev() {
            let mut it = self.read(
                run,
                ReadOptions {
                    from_seq: Some(b),
                    skip_corrupt: true,
                    ..ReadOptions::default()
                },
            )?;
            for e in it.by_ref() {
                last = Some(e?);
            }
            note(&it);
            if last.is_some() {
                break;
            }
        }
        let head = last.as_ref().map_or(0, |e| e.seq);
        Ok(RunInfo {
            run_id: run.to_string(),
            user_id: meta.user_id,
            events: head,
            head_seq: head,
            bytes,
            segments: bases.len(),
            first_ts: first.map(|e| e.ts),
            last_ts: last.map(|e| e.ts),
            created: meta.created,
            damaged,
        })
    }
}
