//! The on-disk format, pinned: a log written by format version 1 is read back exactly,
//! and re-encoding its events gives the same bytes. A format change must bump
//! `FORMAT_VERSION` and keep this fixture readable.

use std::path::Path;

use swarm_memory::log::frame::{self, Decoded};
use swarm_memory::{Event, ReadOptions, Store};

/// Copies a fixture directory.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn format_v1_fixture_reads_back_and_reencodes_identically() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/golden-v1");
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture, dir.path());
    let store = Store::open(dir.path()).unwrap();
    let events: Vec<Event> = store
        .read("golden", ReadOptions::default())
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["e1", "e2", "e3"]);
    assert_eq!(events[0].ts.to_string(), "2026-11-22T23:10:03.644318Z");
    assert_eq!(events[0].meta.as_ref().unwrap()["tool"], "query_metrics");
    assert_eq!(events[1].content["detail"], "ünïcode ✓ \"quoted\"");
    assert_eq!(events[1].refs, vec![1]);
    assert_eq!(events[2].ts, events[1].ts, "one batch, one timestamp");
    assert!(store.verify("golden", |_| {}).unwrap().ok);

    // Byte-exact: every line re-encodes to itself.
    let seg = fixture.join("anonymous/golden/seg-00000000000000000001.jsonl");
    let bytes = std::fs::read(seg).unwrap();
    let mut at = 0;
    let mut frames = 0;
    while at < bytes.len() {
        let Decoded::Frame { payload, len } = frame::decode(&bytes[at..]) else {
            panic!("not a frame at {at}");
        };
        let evs: Vec<Event> = serde_json::from_slice(payload).unwrap();
        let mut again = Vec::new();
        frame::encode(&serde_json::to_vec(&evs).unwrap(), &mut again);
        assert_eq!(again, &bytes[at..at + len], "frame at {at}");
        at += len;
        frames += 1;
    }
    assert_eq!(frames, 2);
}
