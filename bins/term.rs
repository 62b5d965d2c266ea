//! Text for a terminal: what agents wrote is shown escaped, never interpreted.
//!
//! Content comes from any agent; printed raw, an escape sequence in it could move the
//! cursor, recolour or retitle the reader's terminal, or hide lines (`\r`). Every
//! human-facing output (tables, timelines, context text) goes through [`safe`]; JSON
//! output is exact and needs nothing (serde_json escapes control characters).

/// `s` with every control character (C0 but `\n` and `\t` where `keep_lines`, DEL, C1)
/// and every Unicode format character that reorders or hides text (bidi embeddings,
/// overrides and isolates, zero-width characters, the BOM) written as a visible escape:
/// `\x1b`, `\r`, `\u{9b}`, `\u{202e}`. A right-to-left override would otherwise make
/// `exe.txt` of `txt.exe` in the reader's terminal.
pub fn escape(s: &str, keep_lines: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\n' | '\t' if keep_lines => out.push(c),
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if (0x80..0xa0).contains(&(c as u32))
                || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}') =>
            {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

/// One line of a table or timeline: every control character escaped, line breaks too.
pub fn safe(s: &str) -> String {
    escape(s, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_a_terminal_would_interpret() {
        assert_eq!(
            safe("a\x1b[31mred\rb\u{9b}2J\x07"),
            "a\\x1b[31mred\\rb\\u{9b}2J\\x07"
        );
        assert_eq!(escape("one\ntwo\tx\x1b", true), "one\ntwo\tx\\x1b");
        assert_eq!(safe("plain ünïcode ✓"), "plain ünïcode ✓");
        assert_eq!(
            safe("invoice\u{202e}fdp.exe zero\u{200b}width \u{2066}iso\u{2069}\u{feff}"),
            "invoice\\u{202e}fdp.exe zero\\u{200b}width \\u{2066}iso\\u{2069}\\u{feff}"
        );
    }
}
