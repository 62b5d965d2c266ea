//! The log's frame format: one line of JSON per atomic commit.
//!
//! ```text
//! {"f":1,"crc":"1a2b3c4d","len":     312,"evs":[{...event...},{...}]}\n
//! ```
//!
//! The first 45 bytes are a fixed-width header: format version 1, the CRC-32 (IEEE,
//! `crc32fast`) of the payload in 8 lowercase hex digits, and the payload length in
//! bytes, right-aligned in 8 columns padded with spaces (JSON allows the spaces). The
//! payload is a JSON array of one or more events (a batch is one frame, so it is atomic:
//! it is either wholly valid or wholly torn). The frame ends with `}` and `\n`.
//! A decoder checks the header, the length, the trailer and the CRC without parsing JSON,
//! and never allocates: it borrows the payload from the caller's buffer.

/// Format version written in every frame (`"f":1`).
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of the fixed header, up to and including `"evs":`.
pub const HEADER_LEN: usize = 45;
/// Bytes after the payload: `}\n`.
pub const TRAILER_LEN: usize = 2;
/// Largest payload a frame may carry. The decoder refuses larger lengths before reading.
pub const PAYLOAD_BYTES_MAX: usize = 16 * 1024 * 1024;

const PREFIX: &[u8; 14] = b"{\"f\":1,\"crc\":\"";
const MID: &[u8; 8] = b"\",\"len\":";
const SUFFIX: &[u8; 7] = b",\"evs\":";

/// Total bytes of a frame with a payload of `payload_len` bytes.
pub fn frame_len(payload_len: usize) -> usize {
    HEADER_LEN + payload_len + TRAILER_LEN
}

/// Appends the frame for `payload` to `out`. The payload must be a compact JSON array
/// without a newline byte (serde_json's compact writer never emits one).
pub fn encode(payload: &[u8], out: &mut Vec<u8>) {
    assert!(
        payload.len() <= PAYLOAD_BYTES_MAX,
        "payload over the frame limit"
    );
    debug_assert!(!payload.contains(&b'\n'));
    let crc = crc32fast::hash(payload);
    out.reserve(frame_len(payload.len()));
    out.extend_from_slice(PREFIX);
    out.extend_from_slice(format!("{crc:08x}").as_bytes());
    out.extend_from_slice(MID);
    out.extend_from_slice(format!("{:>8}", payload.len()).as_bytes());
    out.extend_from_slice(SUFFIX);
    out.extend_from_slice(payload);
    out.extend_from_slice(b"}\n");
}

/// The outcome of decoding at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A whole, checked frame: its payload and its total length in bytes.
    Frame {
        /// The JSON array of events.
        payload: &'a [u8],
        /// Bytes the frame occupies, header and trailer included.
        len: usize,
    },
    /// The buffer is a proper prefix of a frame that may still be completed: at the end of
    /// a file this is a write in progress or a torn write, never a valid record.
    Incomplete,
    /// These bytes are not a frame.
    Corrupt(&'static str),
}

fn hex_val(b: u8) -> Option<u32> {
    match b {
        b'0'..=b'9' => Some(u32::from(b - b'0')),
        b'a'..=b'f' => Some(u32::from(b - b'a' + 10)),
        _ => None,
    }
}

/// Decodes the frame at the start of `buf`.
pub fn decode(buf: &[u8]) -> Decoded<'_> {
    // Check whatever part of the fixed header is present, so garbage is reported as
    // garbage even when it is shorter than a header.
    let check = |range: std::ops::Range<usize>, want: &[u8]| -> bool {
        let end = range.end.min(buf.len());
        if range.start >= end {
            return true;
        }
        buf[range.start..end] == want[..end - range.start]
    };
    if !check(0..14, PREFIX) {
        return Decoded::Corrupt("bad frame header");
    }
    let mut crc = 0u32;
    for &b in buf.iter().take(22).skip(14) {
        match hex_val(b) {
            Some(v) => crc = crc << 4 | v,
            None => return Decoded::Corrupt("bad crc field"),
        }
    }
    if !check(22..30, MID) {
        return Decoded::Corrupt("bad frame header");
    }
    let mut len = 0usize;
    let mut seen_digit = false;
    for &b in buf.iter().take(38).skip(30) {
        match b {
            b' ' if !seen_digit => {}
            // JSON numbers have no leading zero.
            b'0' if !seen_digit => return Decoded::Corrupt("bad len field"),
            b'0'..=b'9' => {
                seen_digit = true;
                len = len * 10 + usize::from(b - b'0');
            }
            _ => return Decoded::Corrupt("bad len field"),
        }
    }
    if buf.len() >= 38 && !seen_digit {
        return Decoded::Corrupt("bad len field");
    }
    if !check(38..45, SUFFIX) {
        return Decoded::Corrupt("bad frame header");
    }
    if buf.len() < HEADER_LEN {
        return Decoded::Incomplete;
    }
    if !(2..=PAYLOAD_BYTES_MAX).contains(&len) {
        return Decoded::Corrupt("len out of range");
    }
    let total = frame_len(len);
    if buf.len() < total {
        // A payload byte can never be '\n' (compact JSON), so a newline inside the
        // claimed payload means this frame was cut and something else follows.
        if buf[HEADER_LEN..].contains(&b'\n') {
            return Decoded::Corrupt("frame cut short");
        }
        return Decoded::Incomplete;
    }
    let payload = &buf[HEADER_LEN..HEADER_LEN + len];
    if buf[HEADER_LEN + len..total] != *b"}\n" {
        return Decoded::Corrupt("bad frame trailer");
    }
    if crc32fast::hash(payload) != crc {
        return Decoded::Corrupt("crc mismatch");
    }
    Decoded::Frame {
        payload,
        len: total,
    }
}

/// Finds the start of the next frame header in `buf` after position 0 that decodes to a
/// whole frame; used to tell a torn tail (nothing valid follows) from damage in the middle
/// of a log (valid frames follow).
pub fn find_next_frame(buf: &[u8]) -> Option<usize> {
    let mut from = 1;
    while from < buf.len() {
        let rel = buf[from..]
            .windows(PREFIX.len())
            .position(|w| w == PREFIX)?;
        let at = from + rel;
        if let Decoded::Frame { .. } = decode(&buf[at..]) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        encode(payload, &mut v);
        v
    }

    #[test]
    fn golden_bytes() {
        let f = frame(br#"[{"a":1}]"#);
        assert_eq!(
            std::str::from_utf8(&f).unwrap(),
            "{\"f\":1,\"crc\":\"f2cb737d\",\"len\":       9,\"evs\":[{\"a\":1}]}\n"
        );
        let v: serde_json::Value = serde_json::from_slice(&f).unwrap();
        assert_eq!(v["len"], 9);
        assert_eq!(v["f"], 1);
    }

    #[test]
    fn every_prefix_is_incomplete_and_whole_is_frame() {
        let f = frame(br#"[{"x":"hello"}]"#);
        for cut in 0..f.len() {
            assert_eq!(decode(&f[..cut]), Decoded::Incomplete, "cut at {cut}");
        }
        assert!(matches!(decode(&f), Decoded::Frame { len, .. } if len == f.len()));
    }

    #[test]
    fn every_bit_flip_is_detected() {
        let f = frame(br#"[{"x":"hello world"}]"#);
        for i in 0..f.len() {
            for bit in 0..8 {
                let mut g = f.clone();
                g[i] ^= 1 << bit;
                // A flip may turn a padding space into a digit and make the frame look
                // longer (incomplete), but it must never decode as a valid frame.
                assert!(
                    !matches!(decode(&g), Decoded::Frame { .. }),
                    "flip at byte {i} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn zeros_and_garbage_are_corrupt() {
        assert!(matches!(decode(&[0u8; 100]), Decoded::Corrupt(_)));
        assert!(matches!(decode(b"hello\n"), Decoded::Corrupt(_)));
    }

    #[test]
    fn huge_len_refused_without_allocating() {
        let mut f = frame(b"[1]");
        f[30..38].copy_from_slice(b"99999999");
        assert_eq!(decode(&f), Decoded::Corrupt("len out of range"));
    }

    #[test]
    fn next_frame_skips_damage() {
        let mut buf = frame(b"[1]");
        buf[20] = b'z';
        let at = buf.len();
        buf.extend(frame(b"[2]"));
        assert_eq!(find_next_frame(&buf), Some(at));
        assert_eq!(find_next_frame(&buf[..at + 10]), None);
    }
}
