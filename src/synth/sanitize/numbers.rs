//! The number detectors that need a checksum: payment cards (Luhn), US social security
//! numbers (the ranges never issued), IBANs (ISO 13616 mod 97).

use regex::Regex;

use super::{alnum, at, before, Redaction, Scan};

impl Scan<'_> {
    /// Payment card numbers that pass the Luhn check -> `<CARD>`.
    pub(super) fn cards(&mut self, re: &Regex) {
        let (s, b) = (self.s, self.b);
        for m in re.find_iter(s) {
            let (pv, nx) = (before(b, m.start()), at(b, m.end()));
            // (A `,` is a CSV field's edge: `1001,4111111111111111,123` holds a card.)
            let glued = |c: u8, d: u8| matches!(c, b'.' | b'-') && d.is_ascii_digit();
            if alnum(pv)
                || alnum(nx)
                || glued(pv, before(b, m.start().saturating_sub(1)))
                || glued(nx, at(b, m.end() + 1))
            {
                continue;
            }
            let digits: Vec<u8> = m.as_str().bytes().filter(u8::is_ascii_digit).collect();
            if (13..=19).contains(&digits.len()) && luhn(&digits) {
                self.push(m.start(), m.end(), Redaction::Card);
            }
        }
    }

    /// US social security numbers in issued ranges -> `<ID>`.
    pub(super) fn national_ids(&mut self, re: &Regex) {
        let (s, b) = (self.s, self.b);
        for m in re.find_iter(s) {
            let (pv, nx) = (before(b, m.start()), at(b, m.end()));
            let t = m.as_str();
            // (Never issued: area 000, 666 or 9xx, group 00, serial 0000.)
            let (area, group, serial) = (&t[..3], &t[4..6], &t[7..]);
            if alnum(pv)
                || alnum(nx)
                || t.as_bytes()[3] != t.as_bytes()[6]
                || (matches!(pv, b'-' | b'.' | b'/')
                    && before(b, m.start().saturating_sub(1)).is_ascii_digit())
                || (matches!(nx, b'-' | b'.' | b'/') && at(b, m.end() + 1).is_ascii_digit())
                || area == "000"
                || area == "666"
                || area.starts_with('9')
                || group == "00"
                || serial == "0000"
            {
                continue;
            }
            self.push(m.start(), m.end(), Redaction::Id);
        }
    }

    /// IBANs whose check digits hold -> `<ACCOUNT>`.
    pub(super) fn ibans(&mut self, re: &Regex) {
        let (s, b) = (self.s, self.b);
        for m in re.find_iter(s) {
            if alnum(before(b, m.start())) || alnum(at(b, m.end())) {
                continue;
            }
            // The pattern may take a word after the number (`… 1332 EUR`): try it without
            // its last piece, then one more, before giving up.
            let mut text = m.as_str();
            for _ in 0..3 {
                let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
                if (15..=34).contains(&compact.len()) && iban_valid(&compact) {
                    self.push(m.start(), m.start() + text.len(), Redaction::Account);
                    break;
                }
                match text.rsplit_once(' ') {
                    Some((shorter, _)) => text = shorter,
                    None => break,
                }
            }
        }
    }
}

/// The Luhn check of a payment card number (its digits, most significant first).
fn luhn(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, d)| {
            let d = u32::from(d - b'0');
            if i % 2 == 1 {
                let x = d * 2;
                if x > 9 {
                    x - 9
                } else {
                    x
                }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// The ISO 13616 check of an IBAN without spaces: the first four characters moved to the
/// end, letters as 10..35, the number mod 97 is 1.
fn iban_valid(iban: &str) -> bool {
    let b = iban.as_bytes();
    if b.len() < 5
        || !b[..2].iter().all(u8::is_ascii_uppercase)
        || !b[2..4].iter().all(u8::is_ascii_digit)
    {
        return false;
    }
    let mut rem: u32 = 0;
    for &c in b[4..].iter().chain(&b[..4]) {
        let v = match c {
            b'0'..=b'9' => u32::from(c - b'0'),
            b'A'..=b'Z' => u32::from(c - b'A') + 10,
            _ => return false,
        };
        rem = if v >= 10 {
            (rem * 100 + v) % 97
        } else {
            (rem * 10 + v) % 97
        };
    }
    rem == 1
}
