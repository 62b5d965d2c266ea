//! Argument names of a tool-call correction, as the shared scope may show them.

use crate::synth::sanitize::Sanitizer;

/// The argument names of a correction fit to go to the shared scope: a name the
/// sanitizer changes (the user's id, a word of a listed name, a key or token it detects)
/// is dropped, and so is one shaped like data rather than a name (`arg_name_is_data`).
/// Names are recorded lowercased, so a case-sensitive detector (`AKIA...`) may miss one:
/// the shape rule catches those.
pub(crate) fn shareable_arg_names(s: &Sanitizer, names: &[String]) -> Vec<String> {
    names
        .iter()
        .filter(|n| !arg_name_is_data(n) && s.text(n) == **n)
        .cloned()
        .collect()
}

/// An argument name shaped like data: four digits in a row (ids, keys, phone numbers),
/// six digits or more in three groups or more (`ip_10_20_30_40`: an address), or a part
/// between `_` and `.` over 20 characters (a token, a hash). Checked again where other
/// users read shared copies (`ToolMistake::redact`), which may predate it.
pub(crate) fn arg_name_is_data(name: &str) -> bool {
    let (mut run, mut digits, mut groups) = (0, 0, 0);
    for c in name.chars() {
        if c.is_ascii_digit() {
            groups += usize::from(run == 0);
            run += 1;
            digits += 1;
        } else {
            run = 0;
        }
        if run >= 4 {
            return true;
        }
    }
    (digits >= 6 && groups >= 3) || name.split(['_', '.']).any(|part| part.len() > 20)
}
