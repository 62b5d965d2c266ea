//! Fuzzes the frame decoder and the segment `FrameReader`: no input may panic them, and
//! whatever they return as a frame must be exactly what `frame::encode` writes (length,
//! trailer and CRC checked). The bounded CI companion is `tests/random_bytes.rs`.

#![no_main]

use std::path::Path;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use swarm_memory::log::frame::{self, Decoded};
use swarm_memory::log::segment::{FrameReader, Step};
use swarm_memory::log::storage::{OpenMode, Storage};
use swarm_memory::MemStorage;

/// Asserts that a frame the decoder accepted at the start of `buf` is canonical.
fn check_frame(buf: &[u8]) -> Option<usize> {
    match frame::decode(buf) {
        Decoded::Frame { payload, len } => {
            let mut again = Vec::new();
            frame::encode(payload, &mut again);
            assert_eq!(&again[..], &buf[..len], "decoded frame is not canonical");
            Some(len)
        }
        Decoded::Incomplete => {
            assert!(!buf.contains(&b'\n'), "incomplete frame holding a newline");
            None
        }
        Decoded::Corrupt(_) => None,
    }
}

fuzz_target!(|data: &[u8]| {
    check_frame(data);
    if let Some(at) = frame::find_next_frame(data) {
        assert!(check_frame(&data[at..]).is_some());
    }

    let mem = MemStorage::new();
    let dir = Path::new("/fuzz");
    mem.create_dir_all(dir).unwrap();
    let path = dir.join("seg");
    let file = mem.open(&path, OpenMode::CreateNew).unwrap();
    file.write_all_at(data, 0).unwrap();
    let mut r = FrameReader::new(Arc::from(file), path, 0, None).unwrap();
    let mut at = 0u64;
    // Every step moves forward, so this many steps always reach the end.
    for _ in 0..data.len() + 2 {
        match r.step().unwrap() {
            Step::Frame { offset, len } => {
                assert_eq!(offset, at);
                let o = offset as usize;
                assert_eq!(check_frame(&data[o..]), Some(len as usize));
                assert_eq!(
                    r.payload(),
                    &data[o + frame::HEADER_LEN..o + len as usize - 2]
                );
                at = offset + len;
            }
            Step::End { offset, incomplete } => {
                assert_eq!(offset, at);
                assert_eq!(incomplete, (offset as usize) < data.len());
                return;
            }
            Step::Corrupt { offset, .. } => {
                assert_eq!(offset, at);
                match r.skip_to_next_frame().unwrap() {
                    Some(next) => {
                        assert!(next > offset);
                        at = next;
                    }
                    None => return,
                }
            }
        }
    }
    panic!("the reader did not reach the end");
});
