//! The tool catalogue: every tool's name, its description (what a model reads to decide
//! when to call it and what comes back), its arguments (`args.rs`) and the function that
//! does it (`scratch.rs`, `memory.rs`). The `tools!` macro binds each one to `SwarmMcp`
//! through rmcp's `#[tool_router]`: one async method per tool that runs the function on
//! a blocking thread with the request's session ([`SwarmMcp::call`]).

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, Extensions};
use rmcp::{tool, tool_router, ErrorData as McpError};

use crate::mcp::args::{
    AdviceArgs, AntiArgs, AppendEntryArgs, BoardArgs, CompleteArgs, ContextArgs, EscalationsArgs,
    ExplainArgs, FactsArgs, FailurePatternArgs, FindingArgs, ListRunsArgs, PickArgs,
    ReadChannelArgs, ReadEntriesArgs, SearchArgs, SessionArgs, StrategyArgs, TrackArgs,
    WriteChannelArgs,
};
use crate::mcp::memory;
use crate::mcp::scratch;
use crate::mcp::server::SwarmMcp;

/// `name(Args) => function;`, each with its doc (the description) and `#[tool(...)]`.
macro_rules! tools {
    ($( $(#[$attr:meta])* $name:ident($args:ty) => $run:path; )*) => {
        #[tool_router(router = tool_router, vis = "pub(crate)")]
        impl SwarmMcp {
            $(
                $(#[$attr])*
                async fn $name(
                    &self,
                    Parameters(a): Parameters<$args>,
                    ext: Extensions,
                ) -> Result<CallToolResult, McpError> {
                    self.call(&ext, move |s| $run(s, a)).await
                }
            )*
        }
    };
}

tools! {
    /// Append a typed entry to a run's shared scratchpad (the log every agent of the swarm
    /// reads). Call it for each hypothesis you form, each piece of evidence you observe,
    /// each decision and each action taken. Use refs to cite the entries it builds on,
    /// client_id so a retry never stores it twice, and expect_seq / expect_subject_seq to
    /// write only if nobody wrote since you read (a cas_conflict error names the current
    /// version: re-read and retry). A decision or action that disagrees with the standing
    /// one on its subject is stored and escalated; while an escalation is open, further
    /// decisions and actions on that subject fail with an `escalated` error naming the
    /// escalation seq. Returns the stored entry (its seq, ts, id) and any engine event
    /// written with it.
    #[tool]
    append_entry(AppendEntryArgs) => scratch::append;

    /// Read a run's entries after your cursor, in seq order, as your agent may see them
    /// (the run's policy applies). Call it to catch up on what peers wrote since your last
    /// read; pass the returned next_cursor as after_seq next time. Filters: type, writer
    /// agent, subject. Returns {entries, next_cursor, more}.
    #[tool(annotations(read_only_hint = true))]
    read_entries(ReadEntriesArgs) => scratch::read_entries;

    /// What to put in your prompt about a run, never over a byte budget: its summaries,
    /// the pinned decisions and actions, then the most recent entries, filtered by your
    /// read permissions. Call it when (re)building your context instead of reading the
    /// whole run. Returns {text, items, used_bytes, omitted, head_seq}.
    #[tool(annotations(read_only_hint = true))]
    get_context(ContextArgs) => scratch::context;

    /// The board of a run: for each subject, its authoritative (latest) entry, its version
    /// (use it as expect_subject_seq), evidence links, its number of writes and the seqs
    /// of the 16 latest (all of them with history: true), competing hypotheses and the
    /// escalation blocking it, if any. Call it before deciding on a subject. Returns
    /// {subjects: [...]} (one with `subject`).
    #[tool(annotations(read_only_hint = true))]
    get_board(BoardArgs) => scratch::board;

    /// As the orchestrator, pick between competing hypotheses on a subject: highest
    /// confidence, then most supporting evidence, then recency. Appends a decision citing
    /// the winner and the losers and returns it (outcome `picked`); a tie on every rule is
    /// escalated to a human instead of guessed (outcome `escalated`, with the escalation).
    #[tool]
    pick_hypothesis(PickArgs) => scratch::pick;

    /// Write a value to a run's channel (a shared, typed slot declared by the lead:
    /// append, replace or merge). Pass the version you read as base_version: a stale one
    /// is a cas_conflict on `reject` channels naming the current version (re-read and
    /// retry), and is recorded (then merged or overwritten) on the others. Returns the
    /// stored write and the channel's new version.
    #[tool]
    write_channel(WriteChannelArgs) => scratch::write_channel;

    /// Read a run's channel: its current value, its version (pass it as base_version when
    /// you write), its declaration and its number of writes and conflicts (with history,
    /// their seqs).
    #[tool(annotations(read_only_hint = true))]
    read_channel(ReadChannelArgs) => scratch::read_channel;

    /// The run's open escalations (with include_resolved, resolved ones too): the subject,
    /// why it was escalated, the two entries that disagree and their agents. Call it after
    /// an `escalated` error; decisions and actions on the subject wait until a human
    /// resolves it (swarm resolve).
    #[tool(annotations(read_only_hint = true))]
    list_escalations(EscalationsArgs) => scratch::escalations;

    /// The synthesized facts of your memory: findings of all your runs, deduplicated,
    /// each with a confidence that grows with independent evidence, contradictions and
    /// which side stands. Call it to know what is established (optionally for one subject,
    /// or as it stood at a time). Facts are made by the synthesizer (`swarm synth`, and
    /// complete_investigation), not at each append. You get the facts whose every source
    /// your agent may read under each run's policy. Returns {facts, contradictions,
    /// facts_total}.
    #[tool(annotations(read_only_hint = true))]
    list_facts(FactsArgs) => scratch::facts;

    /// A fact's evidence chain: its wordings, every evidence link (run, seq, agent, how
    /// it matched) and, for the first `limit`, the raw entry read back from its run. Call
    /// it to check why a fact is believed before acting on it.
    #[tool(annotations(read_only_hint = true))]
    explain_fact(ExplainArgs) => scratch::explain;

    /// Known mistakes of a tool before you call it: errors seen when calling it (yours,
    /// then those shared by other users, sanitized), how often, and the correction that
    /// made the next call succeed. Call it before a tool whose syntax is tricky. Returns
    /// {advice: [...]}, empty when nothing is known.
    // Not read-only: with `record_in` it appends the look-up to that run.
    #[tool(annotations(read_only_hint = false))]
    get_tool_advice(AdviceArgs) => scratch::advice;

    /// The runs (investigations) of your memory, with their number of events and times.
    /// Call it to find a run id. Returns {runs: [...]}.
    #[tool(annotations(read_only_hint = true))]
    list_runs(ListRunsArgs) => scratch::runs;

    /// Have we seen this before? Search your memory, the facts synthesized from all your
    /// past investigations and the findings of your open runs, for words of a symptom,
    /// an error or a component. Call it at the start of an investigation and whenever
    /// you meet something unfamiliar. Filters: run, agent, type, subject, time. Returns
    /// ranked hits: facts (deduplicated, with confidence and the agents that found them)
    /// and findings (entries with their run and seq), only what your agent may read
    /// under each run's policy. Ranked by words, and by meaning when the server has an
    /// embedding model (the answer's `mode` says which).
    // Not read-only: with `record_in` it appends the look-up to that run.
    #[tool(annotations(read_only_hint = false))]
    search_memory(SearchArgs) => memory::search_memory;

    /// Store a finding in the investigation's run: an important observation, a confirmed
    /// insight, a correct API syntax. Write it as one self-contained sentence with its
    /// numbers and names; give a subject so peers see it on the board. Retries with the
    /// same client_id store it once. It becomes (or strengthens) a fact at the next
    /// synthesis. Returns the stored entry (seq, ts, id).
    #[tool]
    add_finding_to_memory(FindingArgs) => memory::add_finding;

    /// Mark an investigation complete once its root cause is confirmed and resolved:
    /// records the closing decision (symptom, root cause, resolution), closes and archives
    /// the run (no more writes), and runs the synthesizer on it so its findings become
    /// facts and its successful tool sequence becomes a pattern (a sanitized copy is
    /// shared with other users, by the user's settings). Returns the decision, the closed
    /// run and what was learned ({facts_new, pattern}; an admin token also gets
    /// facts_total and shared_copies, figures over all the user's runs).
    #[tool]
    complete_investigation(CompleteArgs) => memory::complete;

    /// Record a tool-calling mistake and its correction, after you figured out the
    /// correct usage: the failing call (tool, error, arguments) and the corrected
    /// arguments. Stored as two tool calls in the run; when the investigation completes,
    /// the mistake and its correction (the argument difference) are learned, and a
    /// sanitized copy is shared so no other agent repeats it (get_tool_advice shows it).
    /// Returns the stored entries.
    #[tool]
    record_tool_failure_pattern(FailurePatternArgs) => memory::record_failure;

    /// Proven tool sequences for a symptom, at the start of a new investigation: your own
    /// patterns first, then those shared by every user (sanitized), each with its root
    /// cause, tool sequence, resolution, occurrence count and confidence (0.6 + 0.1 per
    /// repeat). Follow a high-confidence sequence to skip exploration. Returns
    /// {strategies: [...]}, empty when the symptom is new.
    // Not read-only: with `record_in` it appends the look-up to that run.
    #[tool(annotations(read_only_hint = false))]
    get_recommended_investigation_strategy(StrategyArgs) => memory::strategy;

    /// Record one tool call you made (name, arguments, ok or error, the error message),
    /// right after making it, so the sequence of tools that solved the investigation and
    /// the mistakes you corrected are learned. Fast (no fsync wait) and never fails your
    /// work: a call that cannot be recorded answers {recorded: false, reason}, never an
    /// error. After a failure it also returns known corrections for the tool, if any.
    #[tool]
    track_tool_call(TrackArgs) => memory::track;

    /// Store a whole agent turn in the investigation's run: its user and assistant
    /// messages and its tool results, as one atomic batch (user messages as evidence,
    /// assistant messages as hypotheses, tool results as evidence carrying the call),
    /// so the synthesizer extracts facts and tool patterns from them without an explicit
    /// complete_investigation. Call it after each turn (what an after-agent callback
    /// does). Retries with the same turn_id store nothing twice. Returns the stored seqs.
    #[tool]
    add_session_to_memory(SessionArgs) => memory::add_session;

    /// Find inefficiencies in how agents worked a run, from the tool calls recorded in it:
    /// the same failing call repeated, arguments already known to fail, the same tool
    /// called more than three times in a row, call loops, and long tool sequences that
    /// found nothing. Call it periodically or after a slow investigation, then store the
    /// lessons with add_finding_to_memory. Returns {anti_patterns: [{kind, agent, tool,
    /// seqs, description, suggestion}]}.
    #[tool(annotations(read_only_hint = true))]
    detect_agent_anti_patterns(AntiArgs) => memory::anti_patterns;
}
