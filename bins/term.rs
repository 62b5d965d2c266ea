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
    swarm_memory::scratchpad::context::escape_controls(s, keep_lines)
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
