//! `EventIter` and `FrameWalk` unit tests.

use super::*;

/// A chunk keeps each event's strings as places in its own text, not as copies, and
/// gives back the frames' events as parsed, frame by frame.
#[test]
fn a_chunk_points_into_its_text() {
    let frames = [
        r#"[{"run_id":"r","seq":1,"ts":"2026-11-22T14:03:00Z","id":"a1","agent_id":"db","user_id":"u","type":"evidence","content":"one","subject":"s"}]"#,
        r#"[{"run_id":"r","seq":2,"ts":"2026-11-22T14:03:01Z","id":"a2","agent_id":"ops","user_id":"u","type":"hypothesis","content":{"k":2}}]"#,
    ];
    let mut chunk = Chunk::new();
    let mut want = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        let events: Vec<EventRef<'_>> = serde_json::from_str(f).unwrap();
        want.push(format!("{:?}", events[0]));
        let bounds = FrameBounds {
            seg: 1,
            start: i as u64 * 100,
            end: i as u64 * 100 + 100,
        };
        chunk.push(f, &events, bounds);
    }
    assert!(
        chunk.events.iter().all(EventSpans::borrows_only),
        "{:?}",
        chunk.events
    );
    let mut got = Vec::new();
    let mut sink = |events: &[EventRef<'_>], b: FrameBounds| {
        got.push((format!("{:?}", events[0]), b.start));
        true
    };
    assert!(chunk.drain(&mut sink));
    assert_eq!(got, [(want[0].clone(), 0), (want[1].clone(), 100)]);
}
