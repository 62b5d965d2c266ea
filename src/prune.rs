//! Pruning (seed 000): when the working view grows past the policy's threshold, the
//! oldest half of its unpinned entries is summarised into one `summary` event. Decisions
//! and actions are pinned: never summarised away. The raw log is never rewritten.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::error::{Error, Result};
use crate::event::{Event, EventType};
use crate::read::ReadOptions;
use crate::rules::SummaryRecord;
use crate::store::Store;

/// Largest summary text accepted, in bytes.
pub const SUMMARY_BYTES_MAX: usize = 16 * 1024;

/// Who writes the summary.
#[derive(Clone, Debug)]
pub enum Summarizer {
    /// Built in, deterministic, extractive: per subject, the highest-confidence and the
    /// latest entries, first sentence of each.
    Builtin,
    /// An external command (run with `sh -c`): the events as a JSON array on stdin, the
    /// summary text on stdout (e.g. an LLM command line).
    Command {
        /// The command line.
        cmd: String,
        /// Longest it may run.
        timeout: Duration,
    },
}

impl Summarizer {
    fn name(&self) -> String {
        match self {
            Summarizer::Builtin => "builtin-extractive".into(),
            Summarizer::Command { cmd, .. } => {
                format!("cmd:{}", cmd.chars().take(64).collect::<String>())
            }
        }
    }

    fn summarize(&self, events: &[Event]) -> Result<String> {
        let text = match self {
            Summarizer::Builtin => builtin(events),
            Summarizer::Command { cmd, timeout } => run_command(cmd, *timeout, events)?,
        };
        let text = text.trim().to_string();
        if text.is_empty() {
            return Err(Error::invalid(
                "summarizer",
                "produced an empty summary; the run is unchanged",
            ));
        }
        if text.len() > SUMMARY_BYTES_MAX {
            return Err(Error::invalid(
                "summarizer",
                format!(
                    "produced {} bytes, limit {SUMMARY_BYTES_MAX}; the run is unchanged",
                    text.len()
                ),
            ));
        }
        Ok(text)
    }
}

fn first_sentence(v: &Value) -> String {
    let s = v.as_str().map_or_else(|| v.to_string(), str::to_string);
    let end = s.find(". ").map_or(s.len(), |i| i + 1);
    let t: String = s[..end].chars().take(160).collect();
    t.replace('\n', " ")
}

fn builtin(events: &[Event]) -> String {
    use std::collections::BTreeMap;
    let mut by_subject: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    for e in events {
        by_subject
            .entry(e.subject.as_deref().unwrap_or("(no subject)"))
            .or_default()
            .push(e);
    }
    let mut agents: Vec<&str> = events.iter().map(|e| e.agent_id.as_str()).collect();
    agents.sort_unstable();
    agents.dedup();
    let (first, last) = (
        events.first().map_or(0, |e| e.seq),
        events.last().map_or(0, |e| e.seq),
    );
    let mut out = format!(
        "Summary of {} entries, seqs {first}..{last}, by {}.\n",
        events.len(),
        agents.join(", ")
    );
    for (subject, evs) in by_subject {
        let mut best: Vec<&&Event> = evs.iter().collect();
        best.sort_by(|a, b| {
            b.confidence
                .unwrap_or(0.0)
                .total_cmp(&a.confidence.unwrap_or(0.0))
                .then(b.seq.cmp(&a.seq))
        });
        let mut picked: Vec<&Event> = best.into_iter().take(2).copied().collect();
        if let Some(latest) = evs.last() {
            if !picked.iter().any(|p| p.seq == latest.seq) {
                picked.push(latest);
            }
        }
        picked.sort_by_key(|e| e.seq);
        out.push_str(&format!("- {subject} ({} entries):", evs.len()));
        for e in picked {
            out.push_str(&format!(
                " [#{} {} {}] {}",
                e.seq,
                e.agent_id,
                e.kind.as_str(),
                first_sentence(&e.content)
            ));
        }
        out.push('\n');
        if out.len() > SUMMARY_BYTES_MAX - 512 {
            out.push_str("- (more subjects omitted)\n");
            break;
        }
    }
    out
}

fn run_command(cmd: &str, timeout: Duration, events: &[Event]) -> Result<String> {
    let input =
        serde_json::to_vec(events).map_err(|e| Error::invalid("summarizer", e.to_string()))?;
    run_filter(cmd, timeout, input, SUMMARY_BYTES_MAX).map_err(|reason| {
        Error::invalid("summarizer-cmd", format!("{reason}; the run is unchanged"))
    })
}

/// Runs `cmd` with `sh -c`, feeds `input` on its stdin and returns what it printed on
/// stdout (at most `out_max` bytes are read), or why it failed: it could not start, did
/// not finish within `timeout` (it is killed), exited non-zero (with its stderr), or
/// printed something that is not UTF-8.
pub(crate) fn run_filter(
    cmd: &str,
    timeout: Duration,
    input: Vec<u8>,
    out_max: usize,
) -> std::result::Result<String, String> {
    let mut child = Command::new("sh")
        .args(["-c", cmd])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = (&mut stdout).take(out_max as u64 + 1).read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{cmd:?} did not finish within {} ms",
                    timeout.as_millis()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(format!("waiting for {cmd:?}: {e}")),
        }
    };
    let _ = writer.join();
    let out = reader.join().unwrap_or_default();
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = (&mut e).take(2048).read_to_string(&mut err);
        }
        return Err(format!("{cmd:?} exited with {status}: {}", err.trim()));
    }
    String::from_utf8(out).map_err(|_| format!("{cmd:?} printed something that is not UTF-8"))
}

impl Store {
    /// Summarises the oldest half of the working view if the policy's threshold is
    /// crossed (or always, with `force`, when there is anything to summarise). Returns
    /// the `summary` event, or `None` when nothing was to be done. A failing summariser
    /// leaves the run unchanged; a concurrent pruner that got there first makes this one
    /// fail with a conflict (the summary must start right after the previous one).
    pub fn prune(
        &self,
        run: &str,
        agent: &str,
        summarizer: &Summarizer,
        force: bool,
    ) -> Result<Option<Event>> {
        let state = self
            .state_at(run, crate::replay::Target::Head, |_| {})?
            .state;
        if !force && !state.rules.wants_prune() {
            return Ok(None);
        }
        let from = state.rules.pruned_upto + 1;
        let working: Vec<Event> = self
            .read(
                run,
                ReadOptions {
                    from_seq: Some(from),
                    to_seq: Some(state.head_seq),
                    ..ReadOptions::default()
                },
            )?
            .filter(|e| {
                e.as_ref()
                    .map_or(true, |e| e.kind.is_client() && !e.kind.is_pinned())
            })
            .collect::<Result<_>>()?;
        if working.is_empty() {
            return Ok(None);
        }
        let half: Vec<Event> = working[..working.len().div_ceil(2)].to_vec();
        let to = half.last().map_or(from, |e| e.seq);
        let text = summarizer.summarize(&half)?;
        let rec = SummaryRecord {
            from_seq: from,
            to_seq: to,
            summarized: half.len() as u64,
            text,
            summarizer: summarizer.name(),
        };
        let v = serde_json::to_value(&rec).map_err(|e| Error::invalid("summary", e.to_string()))?;
        self.engine_append(run, agent, EventType::Summary, v, None, Vec::new())
            .map(Some)
    }
}
