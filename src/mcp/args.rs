//! The tools' arguments. Each type derives its JSON Schema (`schemars`), which is the
//! tool's `inputSchema`: the field descriptions below are what a model reads, so each one
//! says what to pass and what it does. Declared through two small macros, one line per
//! field with its description, so that no field can go without one.

use serde_json::{Map, Value};

/// Declares argument structs: `Name { field: Type => "description", ... }`, with optional
/// attributes (`#[serde(...)]`) before a field.
/// `Name(agent) { ... }` adds the `agent` field every acting tool takes.
macro_rules! args {
    ($( $(#[$sm:meta])* $name:ident $(($agent:ident))? {
        $( $(#[$fm:meta])* $field:ident : $ty:ty => $doc:literal ),* $(,)?
    } )*) => {
        $(
            $(#[$sm])*
            #[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
            // An argument a tool does not take is refused (its schema says
            // `additionalProperties: false`): a misspelled `expected_seq` was ignored, and
            // the compare-and-swap the agent asked for silently not made.
            #[serde(deny_unknown_fields)]
            pub struct $name {
                $( #[doc = $doc] $(#[$fm])* pub $field: $ty, )*
                $(
                    #[doc = "Act (and read) as this agent: one of the agents this session may act as (default: the first). The run's policy for that agent applies."]
                    pub $agent: Option<String>,
                )?
            }
        )*
    };
}

/// Declares closed sets of choices (snake_case on the wire): `Name { Variant => "description", ... }`.
macro_rules! choices {
    ($( $(#[$em:meta])* $name:ident { $( $variant:ident => $doc:literal ),* $(,)? } )*) => {
        $(
            $(#[$em])*
            #[derive(Clone, Copy, Debug, PartialEq, serde::Deserialize, schemars::JsonSchema)]
            #[serde(rename_all = "snake_case")]
            pub enum $name { $( #[doc = $doc] $variant, )* }
        )*
    };
}

choices! {
    /// The four entry types a client writes.
    EntryKind {
        Hypothesis => "A candidate explanation (\"connection pool saturation on orders-db\").",
        Evidence => "An observation (\"p99 latency rose from 180 ms to 2.4 s at 14:01\").",
        Decision => "A choice the swarm acts on (pinned: never pruned from context).",
        ActionTaken => "Something done to the system (pinned).",
    }
    /// Whether a tool call succeeded.
    CallStatus {
        Ok => "It returned a result.",
        Error => "It failed (an error, an exception, an unusable answer).",
    }
    /// Who said a message of an agent turn.
    MessageRole {
        User => "The person (or calling system) asking: stored as evidence (a reported observation).",
        Assistant => "The model: stored as a hypothesis (its claims, until evidence backs them).",
        System => "Instructions: not stored.",
    }
}

args! {
    /// Arguments of `append_entry`.
    AppendEntryArgs(agent) {
        run: String => "The run (one investigation): 1..128 of A-Z a-z 0-9 . _ : @ -. Created on first append.",
        #[serde(rename = "type")]
        kind: EntryKind => "The entry type.",
        content: Value => "The entry: a text, or a JSON object (at most 64 KiB).",
        subject: Option<String> => "What it is about (a service, a port, a hypothesis slot): entries on one subject form its board history.",
        #[serde(default)]
        refs: Vec<u64> => "Seqs of earlier entries this one builds on (evidence for a hypothesis, the standing decision a new one replaces).",
        confidence: Option<f64> => "Confidence in 0..1.",
        client_id: Option<String> => "Idempotency key: a retry with the same client_id returns the entry already stored instead of storing it twice. Use one per logical write and reuse it on retry.",
        meta: Option<Map<String, Value>> => "Metadata object, e.g. {\"tool\": \"query_metrics\", \"tool_status\": \"ok\"}.",
        expect_seq: Option<u64> => "Append only if the run's last seq is this (0: a new run); else a cas_conflict naming the current seq.",
        expect_subject_seq: Option<u64> => "Append only if the latest entry on `subject` is this seq (its board version; 0: no entry yet); else a cas_conflict naming the current version.",
        session_id: Option<String> => "The agent's session id.",
    }
    /// Arguments of `read_entries`.
    ReadEntriesArgs(agent) {
        run: String => "The run.",
        after_seq: Option<u64> => "Your cursor: only entries after this seq (0 or absent: from the start). Pass back the `next_cursor` of the previous call.",
        limit: Option<usize> => "At most this many entries (default 50, at most 500; fewer when they pass 512 KiB of JSON: then `more` is true).",
        from_agent: Option<String> => "Only entries written by this agent.",
        subject: Option<String> => "Only entries on this subject.",
        #[serde(rename = "type")]
        kind: Option<EntryKind> => "Only this type.",
    }
    /// Arguments of `get_context`.
    ContextArgs(agent) {
        run: String => "The run.",
        budget_bytes: Option<usize> => "Largest context in bytes (default 8000).",
    }
    /// Arguments of `get_board`.
    BoardArgs(agent) {
        run: String => "The run.",
        subject: Option<String> => "Only this subject.",
        #[serde(default)]
        history: bool => "Every seq of each subject's history (default: the 16 most recent; `writes` counts them all).",
    }
    /// Arguments of `pick_hypothesis`.
    PickArgs(agent) {
        run: String => "The run.",
        subject: String => "The subject with two or more competing hypotheses.",
    }
    /// Arguments of `write_channel`.
    WriteChannelArgs(agent) {
        run: String => "The run.",
        channel: String => "The channel (declared by the run's lead).",
        value: Value => "The value (any JSON): appended, replacing or merged (RFC 7396) by the channel's kind.",
        base_version: Option<u64> => "The channel version your write is based on (from read_channel); a stale one is a conflict (refused on `reject` channels).",
        client_id: Option<String> => "Idempotency key: a retry with the same client_id (after a lost answer) returns the write already stored instead of a conflict with its own version.",
    }
    /// Arguments of `read_channel`.
    ReadChannelArgs(agent) {
        run: String => "The run.",
        channel: String => "The channel.",
        #[serde(default)]
        history: bool => "Also the seqs of every write and recorded conflict (default: only the value, version and declaration).",
    }
    /// Arguments of `list_escalations`.
    EscalationsArgs(agent) {
        run: String => "The run.",
        #[serde(default)]
        include_resolved: bool => "Resolved escalations too.",
    }
    /// Arguments of `list_facts`.
    FactsArgs(agent) {
        subject: Option<String> => "Only this subject.",
        #[serde(default)]
        include_superseded: bool => "Superseded facts too (they lost a contradiction).",
        as_of: Option<String> => "The facts as they stood at this RFC 3339 time.",
        limit: Option<usize> => "At most this many facts (default 50, at most 500), most confident first.",
    }
    /// Arguments of `explain_fact`.
    ExplainArgs(agent) {
        fact: String => "The fact id (`F12`).",
        limit: Option<usize> => "Raw events read back, at most (default 10, at most 100).",
    }
    /// Arguments of `get_tool_advice`.
    AdviceArgs(agent) {
        tool: String => "The tool you are about to call (as recorded in track_tool_call).",
        record_in: Option<String> => "The investigation's run this look-up serves: when given, the look-up is recorded there, so the run's memory-event stream shows it (`pattern_applied` when advice was found, else `searched`). Recording never fails the look-up.",
    }
    /// Arguments of `detect_agent_anti_patterns`.
    AntiArgs(agent) {
        run: String => "The run to analyze.",
        of_agent: Option<String> => "Only this agent's anti-patterns.",
    }
    /// Arguments of `list_runs` (none).
    ListRunsArgs {}
    /// Arguments of `search_memory`.
    SearchArgs(agent) {
        query: String => "What to look for, in words (\"connection pool exhausted orders-db\").",
        run: Option<String> => "Only this run.",
        from_agent: Option<String> => "Only what this agent wrote or found.",
        limit: Option<usize> => "Hits wanted (default 10, at most 100).",
        #[serde(rename = "type")]
        kind: Option<EntryKind> => "Only this entry type.",
        subject: Option<String> => "Only this subject.",
        since: Option<String> => "Only from this RFC 3339 time on.",
        until: Option<String> => "Only up to this RFC 3339 time.",
        record_in: Option<String> => "The investigation's run this search serves: when given, the search (query, hit count, the ids found) is recorded there, so the run's memory-event stream shows it (`searched`) and a replay shows what the agent looked up. Recording never fails the search.",
    }
    /// Arguments of `add_finding_to_memory`.
    FindingArgs(agent) {
        run: String => "The investigation's run (created on first write).",
        finding: String => "The finding, as one self-contained sentence with its numbers and names (\"orders-db connection pool exhausted: 100 of 100 connections in use\").",
        subject: Option<String> => "What it is about (a service, a host, a hypothesis slot).",
        confidence: Option<f64> => "Confidence in 0..1.",
        #[serde(default)]
        inferred: bool => "true: an inference (stored as a hypothesis); false (default): an observation (stored as evidence).",
        tool: Option<String> => "The tool whose output showed it (counts as a successful call in the learned tool sequence).",
        client_id: Option<String> => "Idempotency key: retrying with the same client_id never stores the finding twice.",
    }
    /// Arguments of `complete_investigation`.
    CompleteArgs(agent) {
        run: String => "The investigation's run.",
        symptom: String => "The symptom type, a short slug (\"high_latency_checkout\").",
        root_cause: String => "The confirmed root cause (\"connection_pool_saturation\").",
        resolution: String => "What resolved it (\"increased pool size from 10 to 50\").",
        subject: Option<String> => "The subject of the closing decision (default: none).",
        #[serde(default)]
        defer_learning: bool => "true: do not synthesize now (the next `swarm synth` learns the run); false (default): run the synthesizer on the run at once, so its facts and pattern are learned now.",
    }
    /// Arguments of `record_tool_failure_pattern`.
    FailurePatternArgs(agent) {
        run: String => "The investigation's run.",
        tool: String => "The tool that failed.",
        error: String => "Its error message.",
        failed_args: Option<Map<String, Value>> => "The arguments of the failing call.",
        corrected_args: Option<Map<String, Value>> => "The arguments that then worked (the correction is their difference).",
        lesson: Option<String> => "The lesson in words (\"always give resource.type in metric filters\").",
    }
    /// Arguments of `get_recommended_investigation_strategy`.
    StrategyArgs(agent) {
        symptom: String => "The symptom type (\"high_latency_checkout\"); exact match first, then shared words.",
        #[serde(default)]
        own_only: bool => "Only your own patterns, not those shared by other users.",
        limit: Option<usize> => "Strategies wanted (default 5, at most 50).",
        record_in: Option<String> => "The investigation's run this look-up serves: when given, the look-up (symptom, the strategies found) is recorded there, so the run's memory-event stream shows it (`pattern_applied` when a strategy was found, else `searched`). Recording never fails the look-up.",
    }
    /// Arguments of `track_tool_call`.
    TrackArgs(agent) {
        run: String => "The investigation's run.",
        tool: String => "The tool called.",
        args: Option<Map<String, Value>> => "Its arguments.",
        status: CallStatus => "ok or error.",
        error: Option<String> => "The error message, when it failed.",
        call_id: Option<String> => "Idempotency key of this call record (e.g. the framework's tool-call id).",
    }
    /// One message of an agent turn.
    TurnMessage {
        role: MessageRole => "user, assistant or system.",
        content: String => "The message text.",
    }
    /// One tool result of an agent turn.
    TurnToolResult {
        tool: String => "The tool.",
        args: Option<Map<String, Value>> => "Its arguments.",
        status: CallStatus => "ok or error.",
        error: Option<String> => "The error message, when it failed.",
        result: Option<String> => "What it returned, summarized (stored as evidence; absent: only the call is recorded).",
    }
    /// Arguments of `add_session_to_memory`.
    SessionArgs(agent) {
        run: String => "The investigation's run.",
        #[serde(default)]
        messages: Vec<TurnMessage> => "The turn's messages, in order.",
        #[serde(default)]
        tool_results: Vec<TurnToolResult> => "The turn's tool results, in order.",
        turn_id: Option<String> => "Idempotency key of the turn: a retry with the same turn_id stores nothing twice.",
        session_id: Option<String> => "The agent framework's session id.",
    }
}

impl EntryKind {
    /// The engine's type.
    pub fn event_type(self) -> crate::event::EventType {
        use crate::event::EventType;
        match self {
            EntryKind::Hypothesis => EventType::Hypothesis,
            EntryKind::Evidence => EventType::Evidence,
            EntryKind::Decision => EventType::Decision,
            EntryKind::ActionTaken => EventType::ActionTaken,
        }
    }
}

impl CallStatus {
    /// `ok` or `error`, as `meta.tool_status` stores it.
    pub fn as_str(self) -> &'static str {
        match self {
            CallStatus::Ok => "ok",
            CallStatus::Error => "error",
        }
    }
}
