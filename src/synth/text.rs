//! Normalization of a finding's wording, and the signature two findings are compared by.
//!
//! CONTRACT (used by `dedup`, `metrics` and the driver): every function here is pure and
//! deterministic (no randomness, no global state), so a signature can always be rebuilt
//! from the stored text.

/// Text of a finding, lowercased, whitespace collapsed, a final `.` dropped.
pub fn normalize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for w in text.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.extend(w.chars().flat_map(char::to_lowercase));
    }
    while out.ends_with('.') {
        out.pop();
    }
    out
}

/// 64-bit FNV-1a of `scope`, a 0 byte, and the normalized text: equal keys mean an exact
/// duplicate within the scope.
pub fn exact_key(scope: &str, text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: u8| {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    };
    scope.bytes().for_each(&mut eat);
    eat(0);
    normalize(text).bytes().for_each(&mut eat);
    h
}
