//! The optional LLM step: pairs the deterministic deduper finds borderline go to an
//! external command, which answers whether they state the same fact. Its failures
//! (time-out, garbage, cap reached) leave the deterministic answer standing.

use std::time::Duration;

use serde_json::Value;

use crate::synth::dedup::Judge;

/// The optional LLM step: borderline pairs go to an external command.
#[derive(Clone, Debug)]
pub struct LlmOptions {
    /// Run with `sh -c`; gets `{"scope","a","b","score","question"}` as JSON on stdin and
    /// must print `{"same": true|false}`.
    pub cmd: String,
    /// Longest one call may take; past it the deterministic answer stands.
    pub timeout: Duration,
    /// Most calls per synth run; past it the deterministic answer stands.
    pub calls_max: u64,
}

/// The [`Judge`] that asks the external command, within its call cap.
pub(crate) struct LlmJudge<'a> {
    pub(crate) opts: &'a LlmOptions,
    pub(crate) calls: u64,
    pub(crate) fallbacks: u64,
}

impl Judge for LlmJudge<'_> {
    fn same(&mut self, scope: &str, a: &str, b: &str, score: f64) -> Option<bool> {
        if self.calls >= self.opts.calls_max {
            return None;
        }
        self.calls += 1;
        let input = serde_json::json!({
            "question": "Do a and b state the same fact about the subject? Answer {\"same\": true} or {\"same\": false}.",
            "scope": scope, "a": a, "b": b, "score": score,
        });
        let answer = crate::scratchpad::prune::run_filter(
            &self.opts.cmd,
            self.opts.timeout,
            input.to_string().into_bytes(),
            4096,
        );
        let same = answer.ok().and_then(|out| {
            let v: Value = serde_json::from_str(out.trim()).ok()?;
            v.get("same")?.as_bool()
        });
        if same.is_none() {
            self.fallbacks += 1;
            tracing::debug!("llm step: no usable answer; the deterministic result stands");
        }
        same
    }
}
