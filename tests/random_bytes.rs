//! A bounded random-bytes test of the frame decoder and the segment `FrameReader` (the
//! CI-sized companion of `fuzz/fuzz_targets/frame_decode.rs`): random buffers and
//! mutated valid frames must never panic, and anything returned as a frame must be
//! exactly a frame `encode` would write, CRC included.

use std::path::Path;
use std::sync::Arc;

use swarm_memory::log::frame::{self, Decoded, HEADER_LEN};
use swarm_memory::log::segment::{FrameReader, Step};
use swarm_memory::log::storage::{OpenMode, Storage};
use swarm_memory::MemStorage;

use crate::util::Rng;

/// Checks one decode result against the bytes it came from.
fn check_decode(buf: &[u8]) -> Option<usize> {
    match frame::decode(buf) {
        Decoded::Frame { payload, len } => {
            assert!(len <= buf.len());
            assert_eq!(len, frame::frame_len(payload.len()));
            assert_eq!(&buf[HEADER_LEN..HEADER_LEN + payload.len()], payload);
            let mut again = Vec::new();
            frame::encode(payload, &mut again);
            assert_eq!(
                again,
                &buf[..len],
                "a decoded frame is not what encode writes"
            );
            Some(len)
        }
        Decoded::Incomplete => {
            // Only a proper prefix of a frame may be incomplete: no newline in it.
            assert!(!buf.contains(&b'\n'), "incomplete but holds a newline");
            None
        }
        Decoded::Corrupt(reason) => {
            assert!(!reason.is_empty());
            None
        }
    }
}

fn random_payload(rng: &mut Rng) -> Vec<u8> {
    let n = rng.below(4) as usize + 1;
    let items: Vec<String> = (0..n)
        .map(|i| {
            let len = rng.below(120) as usize;
            let s: String = (0..len)
                .map(|_| char::from(b' ' + rng.below(94) as u8))
                .collect();
            serde_json::json!({"seq": i, "content": s}).to_string()
        })
        .collect();
    format!("[{}]", items.join(",")).into_bytes()
}

fn mutate(rng: &mut Rng, buf: &mut Vec<u8>) {
    for _ in 0..rng.range(1, 4) {
        if buf.is_empty() {
            buf.push(rng.next_u64() as u8);
            continue;
        }
        let at = rng.below(buf.len() as u64) as usize;
        match rng.below(7) {
            0 => buf[at] ^= 1 << rng.below(8),
            1 => buf[at] = rng.next_u64() as u8,
            2 => buf.truncate(at),
            3 => buf.insert(at, rng.next_u64() as u8),
            4 => {
                buf.remove(at);
            }
            5 => {
                // Digits and spaces where the decoder parses numbers.
                buf[at] = b"0123456789 \n}"[rng.below(13) as usize];
            }
            _ => {
                let end = (at + rng.below(64) as usize).min(buf.len());
                let dup = buf[at..end].to_vec();
                let to = rng.below(buf.len() as u64) as usize;
                buf.splice(to..to, dup);
            }
        }
    }
}

#[test]
fn decoder_never_panics_and_never_returns_a_bad_frame() {
    let mut rng = Rng::from_env("decoder_never_panics_and_never_returns_a_bad_frame");
    let mut frames = 0;
    for round in 0..30_000 {
        let buf = match round % 3 {
            0 => {
                let n = rng.below(120) as usize;
                rng.bytes(n)
            }
            1 => {
                // A valid header start followed by random bytes.
                let mut b = br#"{"f":1,"crc":""#.to_vec();
                let n = rng.below(100) as usize;
                b.extend(rng.bytes(n));
                b
            }
            _ => {
                let mut b = Vec::new();
                frame::encode(&random_payload(&mut rng), &mut b);
                if rng.below(4) > 0 {
                    mutate(&mut rng, &mut b);
                }
                b
            }
        };
        if check_decode(&buf).is_some() {
            frames += 1;
        }
        let _ = frame::find_next_frame(&buf);
    }
    assert!(
        frames > 1000,
        "only {frames} valid frames: the generator is off"
    );
}

#[test]
fn frame_reader_never_panics_and_returns_only_checked_frames() {
    let mut rng = Rng::from_env("frame_reader_never_panics_and_returns_only_checked_frames");
    let mem = MemStorage::new();
    let dir = Path::new("/r");
    mem.create_dir_all(dir).unwrap();
    for round in 0..1500 {
        let mut bytes = Vec::new();
        for _ in 0..rng.range(0, 6) {
            frame::encode(&random_payload(&mut rng), &mut bytes);
        }
        if rng.below(5) > 0 {
            mutate(&mut rng, &mut bytes);
        }
        if rng.below(3) == 0 {
            // A preallocated segment's zero fill, sometimes with bytes after it (pages
            // of a torn write that reached the disk out of order).
            bytes.resize(bytes.len() + rng.range(1, 5000) as usize, 0);
            if rng.below(2) == 0 {
                let n = rng.range(1, 50) as usize;
                bytes.extend(rng.bytes(n));
            }
        }
        let path = dir.join(format!("seg-{round}"));
        let f = mem.open(&path, OpenMode::CreateNew).unwrap();
        f.write_all_at(&bytes, 0).unwrap();
        let limit = match rng.below(3) {
            0 => Some(rng.below(bytes.len() as u64 + 10)),
            _ => None,
        };
        let end = limit.map_or(bytes.len(), |l| (l as usize).min(bytes.len()));
        let mut r = FrameReader::new(Arc::from(f), path.clone(), 0, limit).unwrap();
        let mut at = 0u64;
        for _ in 0..10_000 {
            match r.step().unwrap() {
                Step::Frame { offset, len } => {
                    assert_eq!(offset, at, "frames are contiguous");
                    let o = offset as usize;
                    assert!(o + len as usize <= end, "frame past the limit");
                    assert_eq!(
                        check_decode(&bytes[o..end]),
                        Some(len as usize),
                        "the reader returned what the decoder refuses"
                    );
                    assert_eq!(r.payload(), &bytes[o + HEADER_LEN..o + len as usize - 2]);
                    at = offset + len;
                }
                Step::End { offset, incomplete } => {
                    assert_eq!(offset, at);
                    let rest = &bytes[offset as usize..end];
                    match rest.iter().position(|&b| b == 0) {
                        // The zero fill ends the bytes; a frame cut by it is incomplete.
                        Some(p) if rest[p..].iter().all(|&b| b == 0) => {
                            assert_eq!(incomplete, p > 0, "zero fill at {p}")
                        }
                        _ => assert_eq!(incomplete, !rest.is_empty()),
                    }
                    break;
                }
                Step::Corrupt { offset, .. } => {
                    assert_eq!(offset, at);
                    match r.skip_to_next_frame().unwrap() {
                        Some(next) => {
                            assert!(next > offset && (next as usize) < end);
                            at = next;
                        }
                        None => break,
                    }
                }
            }
        }
        mem.remove_file(&path).unwrap();
    }
}
