//! The checks every frame read passes: its events parse, their seqs follow on (but for
//! a gap a `log_damaged` event declares), their times do not go back, and they belong
//! to the run.

use serde::Deserializer as _;

use crate::event::ts::Ts;
use crate::event::{Event, EventRef, LogDamaged, BATCH_EVENTS_MAX};

/// Parses a frame's events and checks seq continuity, ts order and run id.
pub(crate) fn check_frame(
    payload: &[u8],
    expect: Option<u64>,
    last_ts: Ts,
    run_id: &str,
) -> std::result::Result<Vec<Event>, (Option<u64>, String)> {
    // One UTF-8 check of the whole payload is cheaper than serde_json's check per string.
    let text = std::str::from_utf8(payload).map_err(|e| (None, format!("bad event JSON: {e}")))?;
    let events: Vec<Event> =
        serde_json::from_str(text).map_err(|e| (None, format!("bad event JSON: {e}")))?;
    check_order(&events, expect, last_ts, run_id, |e| {
        (
            e.seq,
            e.ts,
            &e.run_id,
            LogDamaged::declared(e.kind, &e.content),
        )
    })?;
    Ok(events)
}

/// [`check_frame`] for a fold: the same checks, the events borrowed from `payload` with
/// their content unparsed (its JSON syntax checked), and `meta` checked to be an object
/// as [`Event`] requires.
pub(crate) fn check_frame_refs<'a>(
    payload: &'a [u8],
    expect: Option<u64>,
    last_ts: Ts,
    run_id: &str,
) -> std::result::Result<FrameRefs<'a>, (Option<u64>, String)> {
    let text = std::str::from_utf8(payload).map_err(|e| (None, format!("bad event JSON: {e}")))?;
    let mut de = serde_json::Deserializer::from_str(text);
    let events = de
        .deserialize_seq(Presized(text.len()))
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| (None, format!("bad event JSON: {e}")))?;
    if let Some(e) = events
        .iter()
        .find(|e| e.meta.is_some_and(|m| !m.get().starts_with('{')))
    {
        return Err((Some(e.seq), "bad event JSON: meta is not an object".into()));
    }
    check_order(&events, expect, last_ts, run_id, |e| {
        (
            e.seq,
            e.ts,
            &e.run_id,
            LogDamaged::declared(
                e.kind,
                &mut serde_json::Deserializer::from_str(e.content.get()),
            ),
        )
    })?;
    Ok((text, events))
}

/// A frame's text and its events borrowed from it.
pub(crate) type FrameRefs<'a> = (&'a str, Vec<EventRef<'a>>);

/// Parses a frame's array of events into a vector sized once from the payload's length
/// (no stored event is shorter than ~100 bytes; a frame holds at most 1,024), instead of
/// growing it by doubling through a frame of a thousand events.
struct Presized(usize);

impl<'de> serde::de::Visitor<'de> for Presized {
    type Value = Vec<EventRef<'de>>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array of events")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Self::Value, A::Error> {
        let mut v = Vec::with_capacity((self.0 / 96 + 1).min(BATCH_EVENTS_MAX));
        while let Some(e) = seq.next_element()? {
            v.push(e);
        }
        Ok(v)
    }
}

/// The checks of one frame's events, whatever form they were parsed into: not empty, seqs
/// following `expect` without a gap (but for a declared one), ts not decreasing, all of
/// `run_id`. `head` gives an event's seq, ts, run and the gap it declares, if any.
fn check_order<E>(
    events: &[E],
    expect: Option<u64>,
    last_ts: Ts,
    run_id: &str,
    head: impl Fn(&E) -> (u64, Ts, &str, Option<(u64, u64)>),
) -> std::result::Result<(), (Option<u64>, String)> {
    let Some(e0) = events.first() else {
        return Err((None, "empty frame".into()));
    };
    let (seq0, _, _, declared) = head(e0);
    let mut first = expect.unwrap_or(seq0);
    // A gap is legal only where a `log_damaged` event right after it declares exactly
    // the missing seqs (`swarm repair`): those seqs were lost and are never reused.
    if seq0 > first && declared == Some((first, seq0 - 1)) {
        first = seq0;
    }
    let mut ts = last_ts;
    for (want, e) in (first..).zip(events.iter()) {
        let (seq, e_ts, e_run, _) = head(e);
        if seq != want {
            return Err((Some(want), format!("holds seq {seq}, expected {want}")));
        }
        if e_ts < ts {
            return Err((Some(want), format!("ts {e_ts} before the previous {ts}")));
        }
        if e_run != run_id {
            return Err((Some(want), format!("belongs to run {e_run:?}")));
        }
        ts = e_ts;
    }
    Ok(())
}
