//! Pruning (seed 000): when the working view grows past the policy's threshold, the
//! oldest half of its unpinned entries is summarised into one `summary` event. Decisions
//! and actions are pinned: never summarised away. The raw log is never rewritten.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::event::{Event, EventType};
use crate::fold::rules::SummaryRecord;
use crate::fold::summary::{summarize, Summarizer, SUMMARY_BYTES_MAX};
use crate::query::options::ReadOptions;
use crate::store::Store;

/// How many lost prune races a caller retries before it reports the conflict (each
/// loss means another pruner made progress, so this bounds work, not correctness).
const PRUNE_RACES_MAX: u32 = 16;

/// An external command (run with `sh -c`): the events as a JSON array on stdin, the
/// summary text on stdout (e.g. an LLM command line).
#[derive(Clone, Debug)]
pub struct CommandSummarizer {
    /// The name stored in each summary (`cmd:<name>`); never the command line, which
    /// may hold a key.
    pub name: Option<String>,
    /// The command line.
    pub cmd: String,
    /// Longest it may run.
    pub timeout: Duration,
}

impl Summarizer for CommandSummarizer {
    fn name(&self) -> String {
        match &self.name {
            Some(n) => format!("cmd:{}", n.chars().take(64).collect::<String>()),
            None => "cmd".into(),
        }
    }

    fn write(&self, events: &[Event]) -> Result<String> {
        run_command(&self.cmd, self.timeout, events)
    }
}

fn run_command(cmd: &str, timeout: Duration, events: &[Event]) -> Result<String> {
    let input =
        serde_json::to_vec(events).map_err(|e| Error::invalid("summarizer", e.to_string()))?;
    run_filter(cmd, timeout, input, SUMMARY_BYTES_MAX)
        .map_err(|reason| Error::External(format!("summarizer: {reason}; the run is unchanged")))
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
        summarizer: &dyn Summarizer,
        force: bool,
    ) -> Result<Option<Event>> {
        crate::event::refuse_reserved_agent(agent)?;
        crate::event::refuse_engine_run(run)?;
        self.prune_as(run, agent, summarizer, force)
    }

    /// [`Store::prune`] as any agent, the engine's own name included (its automatic
    /// prune).
    pub(crate) fn prune_as(
        &self,
        run: &str,
        agent: &str,
        summarizer: &dyn Summarizer,
        force: bool,
    ) -> Result<Option<Event>> {
        // A concurrent pruner (another process's, or this store's background one) may
        // summarise the same range first: the rules then refuse this summary (its range no
        // longer starts right after the last one). The loser re-reads the state and
        // prunes what is left, so no caller fails for losing a race.
        let mut lost = 0;
        loop {
            let state = self
                .state_at(run, crate::fold::replay::Target::Head, |_| {})?
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
            let text = summarize(summarizer, &half)?;
            let rec = SummaryRecord {
                from_seq: from,
                to_seq: to,
                summarized: half.len() as u64,
                text,
                summarizer: summarizer.name(),
            };
            let v =
                serde_json::to_value(&rec).map_err(|e| Error::invalid("summary", e.to_string()))?;
            match self.engine_event(run, agent, EventType::Summary, v, None, Vec::new()) {
                Err(Error::Conflict(e)) if lost < PRUNE_RACES_MAX => {
                    lost += 1;
                    tracing::debug!(run, error = %e, "prune lost a race; reading the state again");
                }
                r => return r.map(Some),
            }
        }
    }
}
