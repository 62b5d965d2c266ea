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

/// The text a finding's content stands for: a string as it is; for an object, its
/// `text`, `claim`, `finding` or `summary` string field (first present), else the object
/// as compact JSON (serde_json keeps keys sorted, so equal objects give equal text).
pub fn content_text(content: &serde_json::Value) -> std::borrow::Cow<'_, str> {
    use serde_json::Value;
    match content {
        Value::String(s) => std::borrow::Cow::Borrowed(s.as_str()),
        Value::Object(o) => {
            for k in ["text", "claim", "finding", "summary"] {
                if let Some(Value::String(s)) = o.get(k) {
                    return std::borrow::Cow::Borrowed(s.as_str());
                }
            }
            std::borrow::Cow::Owned(content.to_string())
        }
        other => std::borrow::Cow::Owned(other.to_string()),
    }
}
