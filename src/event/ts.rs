//! Timestamps: microseconds since the Unix epoch, written as RFC 3339 UTC.
//!
//! The format is fixed (`2026-11-22T14:03:00.123456Z`, 27 bytes) so it sorts as text and
//! is written on the append hot path without allocation. Parsing accepts any RFC 3339
//! date-time (fraction optional, `Z` or a numeric offset) and a bare date.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since 1970-01-01T00:00:00Z.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ts(pub u64);

/// Largest timestamp accepted: 9999-12-31T23:59:59.999999Z.
pub const TS_MAX: Ts = Ts(253_402_300_799_999_999);

impl Ts {
    /// The current wall-clock time.
    pub fn now() -> Ts {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Ts(d.as_micros().min(TS_MAX.0 as u128) as u64)
    }

    /// Why [`Ts::parse`] refused `s`, to follow the quoted input in a message: out of
    /// range (before 1970: times are kept from the Unix epoch on) or not a time at all.
    pub fn refusal(s: &str) -> &'static str {
        let year: Option<i64> = s.get(..4).and_then(|y| y.parse().ok());
        // (1970 too: `1970-01-01T00:30:00+01:00` is before the epoch.)
        let later = s.replacen(s.get(..4).unwrap_or_default(), "1971", 1);
        match year {
            Some(y) if y <= 1970 && Ts::parse(&later).is_some() => {
                "is before 1970-01-01T00:00:00Z, the earliest time kept"
            }
            _ => "is not an RFC 3339 time (2026-11-22T14:03:00Z) or a date (2026-11-22)",
        }
    }

    /// Parses RFC 3339 (`2026-11-22T14:03:00Z`, `...00.5+01:00`) or a date (`2026-11-22`).
    pub fn parse(s: &str) -> Option<Ts> {
        let b = s.as_bytes();
        // Fields are 2 to 4 ASCII digits: folded directly (every event read parses one
        // timestamp, so this is on the replay's hot path).
        let num = |r: std::ops::Range<usize>| -> Option<i64> {
            let part = b.get(r)?;
            if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
                return None;
            }
            Some(part.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
        };
        let year = num(0..4)?;
        if b.get(4) != Some(&b'-') || b.get(7) != Some(&b'-') {
            return None;
        }
        let month = num(5..7)?;
        let day = num(8..10)?;
        if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
            return None;
        }
        let days = days_from_civil(year, month, day);
        if b.len() == 10 {
            return Ts::from_secs_micros(days * 86_400, 0);
        }
        if !matches!(b.get(10), Some(b'T') | Some(b't') | Some(b' ')) {
            return None;
        }
        let (h, m, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
        if b.get(13) != Some(&b':') || b.get(16) != Some(&b':') || h > 23 || m > 59 || sec > 60 {
            return None;
        }
        let mut i = 19;
        let mut micros = 0i64;
        if b.get(i) == Some(&b'.') {
            i += 1;
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                if i - start < 6 {
                    micros = micros * 10 + i64::from(b[i] - b'0');
                }
                i += 1;
            }
            let digits = i - start;
            if digits == 0 {
                return None;
            }
            for _ in digits..6 {
                micros *= 10;
            }
        }
        let offset_secs = match b.get(i) {
            Some(b'Z') | Some(b'z') if i + 1 == b.len() => 0,
            Some(&sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
                let oh = num(i + 1..i + 3)?;
                let om = num(i + 4..i + 6)?;
                if oh > 23 || om > 59 {
                    return None;
                }
                let o = oh * 3600 + om * 60;
                if sign == b'+' {
                    o
                } else {
                    -o
                }
            }
            _ => return None,
        };
        let secs = days * 86_400 + h * 3600 + m * 60 + sec.min(59) - offset_secs;
        Ts::from_secs_micros(secs, micros)
    }

    fn from_secs_micros(secs: i64, micros: i64) -> Option<Ts> {
        let us = secs.checked_mul(1_000_000)?.checked_add(micros)?;
        if us < 0 || us as u64 > TS_MAX.0 {
            return None;
        }
        Some(Ts(us as u64))
    }

    /// Writes the fixed 27-byte form into `out`.
    pub fn write_to(self, out: &mut [u8; 27]) {
        let secs = (self.0 / 1_000_000) as i64;
        let micros = self.0 % 1_000_000;
        let days = secs.div_euclid(86_400);
        let sod = secs.rem_euclid(86_400);
        let (y, mo, d) = civil_from_days(days);
        let put = |out: &mut [u8; 27], at: usize, v: u64, width: usize| {
            let mut v = v;
            for k in (0..width).rev() {
                out[at + k] = b'0' + (v % 10) as u8;
                v /= 10;
            }
        };
        out.copy_from_slice(b"0000-00-00T00:00:00.000000Z");
        put(out, 0, y as u64, 4);
        put(out, 5, mo as u64, 2);
        put(out, 8, d as u64, 2);
        put(out, 11, (sod / 3600) as u64, 2);
        put(out, 14, (sod / 60 % 60) as u64, 2);
        put(out, 17, (sod % 60) as u64, 2);
        put(out, 20, micros, 6);
    }
}

impl fmt::Display for Ts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut b = [0u8; 27];
        self.write_to(&mut b);
        // The buffer holds ASCII digits and separators only.
        f.write_str(std::str::from_utf8(&b).map_err(|_| fmt::Error)?)
    }
}

impl serde::Serialize for Ts {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut b = [0u8; 27];
        self.write_to(&mut b);
        s.serialize_str(std::str::from_utf8(&b).map_err(serde::ser::Error::custom)?)
    }
}

impl<'de> serde::Deserialize<'de> for Ts {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Ts, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Ts;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an RFC 3339 timestamp")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Ts, E> {
                Ts::parse(v).ok_or_else(|| E::custom(format!("bad timestamp {v:?}")))
            }
        }
        d.deserialize_str(V)
    }
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

// Howard Hinnant's algorithms (public domain), proleptic Gregorian calendar.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid time before the epoch is said to be out of range, not "not RFC 3339".
    #[test]
    fn a_refusal_says_why() {
        assert!(Ts::parse("1969-01-01T00:00:00Z").is_none());
        assert!(Ts::refusal("1969-01-01T00:00:00Z").contains("before 1970"));
        assert!(Ts::refusal("1970-01-01T00:30:00+01:00").contains("before 1970"));
        assert!(Ts::refusal("1969-13-01").contains("not an RFC 3339"));
        assert!(Ts::refusal("yesterday").contains("not an RFC 3339"));
        assert!(Ts::refusal("").contains("not an RFC 3339"));
    }

    #[test]
    fn known_values() {
        assert_eq!(Ts(0).to_string(), "1970-01-01T00:00:00.000000Z");
        let t = Ts::parse("2026-11-22T14:03:00.123456Z").unwrap();
        assert_eq!(t.to_string(), "2026-11-22T14:03:00.123456Z");
        assert_eq!(t.0, 1_795_356_180_123_456);
        assert_eq!(Ts::parse("2026-11-22T15:03:00.123456+01:00"), Some(t));
        assert_eq!(
            Ts::parse("2024-02-29").unwrap().to_string(),
            "2024-02-29T00:00:00.000000Z"
        );
        assert_eq!(
            Ts::parse("2000-03-01T00:00:00.5Z").unwrap().0 % 1_000_000,
            500_000
        );
        assert_eq!(TS_MAX.to_string(), "9999-12-31T23:59:59.999999Z");
    }

    #[test]
    fn rejects_garbage() {
        for s in [
            "",
            "2026",
            "2026-13-01",
            "2023-02-29",
            "2026-11-22T25:00:00Z",
            "2026-11-22T10:00:00",
            "2026-11-22T10:00:00.Z",
            "2026-11-22T10:00:00+1:00",
            "1969-12-31T23:59:59Z",
            "２０２６-11-22",
        ] {
            assert_eq!(Ts::parse(s), None, "{s}");
        }
    }

    #[test]
    fn roundtrip_many() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let t = Ts(x % TS_MAX.0);
            assert_eq!(Ts::parse(&t.to_string()), Some(t));
        }
    }
}
