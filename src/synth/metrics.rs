//! Swarm metrics of one run (seed 004): duplication, cross-agent influence,
//! discovery-to-visibility latency, conflicts and escalations.
//!
//! CONTRACT: [`run_metrics`] is one streaming pass over a run's events in seq order;
//! memory grows with distinct facts and agents, not with events. Two bounded exceptions:
//! - a window of the last [`SEQ_WINDOW`] seqs, 16 bytes each (ts, agent, fact, flag), to
//!   resolve `refs` (a ref to an older seq is counted in `refs_out_of_window`);
//! - each latency keeps its first [`Latency`] samples exactly (4096, 32 KiB), then
//!   switches to a fixed log histogram (~2000 buckets, relative error <= 1/32).
//!
//! # Definitions
//! - *Client entries*: `hypothesis`, `evidence`, `decision`, `action_taken`; *findings*:
//!   `hypothesis` and `evidence` with non-empty text. `agents` counts client-entry agents.
//! - Duplication: findings go through a [`Deduper`] (scope = subject or "", text =
//!   `text::content_text`). A finding whose fact exists and whose agent has not found it
//!   yet is an *independent rediscovery*, unless one of its refs names an entry of the
//!   same fact by another agent (*informed repeat*: it read the peer's finding). A finding
//!   of a fact its agent already found is *redundant_same_agent*.
//!   `duplication_rate` = independent rediscoveries / findings.
//! - Influence: a client entry is *influenced* when a ref names a client entry by another
//!   agent; `ref_delay` = referencing ts - referenced ts, per such ref.
//! - `discovery_to_visibility` = ts - `meta.observed_at` (RFC 3339), negatives clamped to 0.
//! - `first_peer_reaction` = per client entry, ts of the first client entry by another
//!   agent that refs it - its ts.
//! - Escalations still open: `escalation` seqs not named by a later `resolution`
//!   (`content.escalation`, else its refs).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::ts::Ts;
use crate::event::{Event, EventType};
use crate::synth::dedup::{DedupConfig, Deduper};
use crate::synth::text;

/// Seqs kept to resolve refs (16 bytes each: 16 MiB at most).
pub const SEQ_WINDOW: usize = 1 << 20;
/// Samples kept exactly per latency before switching to the histogram.
const EXACT_MAX: usize = 4096;
/// Histogram buckets: 32 exact, then 32 per power of two up to 2^64.
const BUCKETS: usize = 32 + 59 * 32;

/// A latency distribution, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Samples.
    pub count: u64,
    /// Median (nearest rank).
    pub p50_ms: f64,
    /// 90th percentile (nearest rank).
    pub p90_ms: f64,
    /// Largest.
    pub max_ms: f64,
    /// Samples that were negative (clock skew) and counted as 0.
    pub clamped_negative: u64,
}

/// The metrics of one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunMetrics {
    /// Events read.
    pub events: u64,
    /// Client entries (hypothesis, evidence, decision, action_taken).
    pub client_entries: u64,
    /// Distinct agents that wrote client entries.
    pub agents: u64,
    /// Events per type name.
    pub entries_by_type: BTreeMap<String, u64>,

    /// Findings (non-empty hypotheses and evidence) run through the deduper.
    pub findings: u64,
    /// Distinct facts among them.
    pub facts: u64,
    /// Facts found by two agents or more.
    pub facts_found_by_several_agents: u64,
    /// Findings of a known fact by an agent new to it, not citing a peer's entry of it.
    pub independent_rediscoveries: u64,
    /// Findings of a known fact by an agent new to it, citing a peer's entry of it.
    pub informed_repeats: u64,
    /// Independent rediscoveries / findings.
    pub duplication_rate: f64,
    /// Findings of a fact their agent had already found.
    pub redundant_same_agent: u64,
    /// Most agents that found one fact.
    pub max_agents_on_one_fact: u64,
    /// Distinct pairs of facts the deduper found contradictory.
    pub contradictions: u64,

    /// Refs in client entries (distinct per entry).
    pub refs: u64,
    /// Refs naming a client entry by another agent.
    pub cross_agent_refs: u64,
    /// Client entries with at least one cross-agent ref.
    pub influenced_entries: u64,
    /// Influenced entries / client entries.
    pub influenced_fraction: f64,
    /// Agents with at least one influenced entry.
    pub agents_influenced: u64,
    /// Refs to seqs outside the window (too old, or not an earlier event of the run).
    pub refs_out_of_window: u64,
    /// Delay from a referenced peer entry to the entry citing it.
    pub ref_delay: Latency,

    /// Delay from `meta.observed_at` (the agent's discovery) to acceptance (visibility).
    pub discovery_to_visibility: Latency,
    /// `meta.observed_at` values that are not RFC 3339 strings.
    pub observed_at_invalid: u64,
    /// `meta.observed_at` values outside the run's window (more than
    /// [`OBSERVED_BEFORE_RUN_MS_MAX`] before its first event, or more than
    /// [`OBSERVED_AFTER_EVENT_MS_MAX`] after the event carrying them): ignored, so one
    /// bad clock cannot make the latencies meaningless.
    pub observed_at_out_of_window: u64,
    /// Delay from an entry to the first entry by another agent that refs it.
    pub first_peer_reaction: Latency,

    /// `conflict` events.
    pub conflicts: u64,
    /// `escalation` events.
    pub escalations: u64,
    /// `resolution` events.
    pub resolutions: u64,
    /// Escalations no resolution names.
    pub open_escalations: u64,
    /// Their seqs.
    pub open_escalation_seqs: Vec<u64>,
}

/// Latency samples in microseconds: exact while few, then a log histogram.
#[derive(Default)]
struct Lat {
    exact: Vec<u64>,
    hist: Vec<u64>,
    count: u64,
    max: u64,
    clamped: u64,
}

fn bucket(v: u64) -> usize {
    if v < 32 {
        return v as usize;
    }
    let e = 63 - v.leading_zeros() as usize; // >= 5
    let sub = ((v >> (e - 5)) - 32) as usize;
    32 + (e - 5) * 32 + sub
}

fn bucket_upper(i: usize) -> u64 {
    if i < 32 {
        return i as u64;
    }
    let e = (i - 32) / 32 + 5;
    let sub = ((i - 32) % 32) as u64;
    ((32 + sub) << (e - 5)).saturating_add((1u64 << (e - 5)) - 1)
}

impl Lat {
    fn push_delta(&mut self, from: Ts, to: Ts) {
        if to < from {
            self.clamped += 1;
        }
        self.push(to.0.saturating_sub(from.0));
    }

    fn push(&mut self, v: u64) {
        self.count += 1;
        self.max = self.max.max(v);
        if self.hist.is_empty() {
            if self.exact.len() < EXACT_MAX {
                self.exact.push(v);
                return;
            }
            self.hist = vec![0; BUCKETS];
            for x in std::mem::take(&mut self.exact) {
                self.hist[bucket(x)] += 1;
            }
        }
        self.hist[bucket(v)] += 1;
    }

    fn percentile(&mut self, p: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((p * self.count as f64).ceil() as u64).clamp(1, self.count);
        if self.hist.is_empty() {
            self.exact.sort_unstable();
            return self.exact[(rank - 1) as usize];
        }
        let mut seen = 0;
        for (i, &c) in self.hist.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return bucket_upper(i).min(self.max);
            }
        }
        self.max
    }

    fn finish(mut self) -> Latency {
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            count: self.count,
            p50_ms: ms(self.percentile(0.5)),
            p90_ms: ms(self.percentile(0.9)),
            max_ms: ms(self.max),
            clamped_negative: self.clamped,
        }
    }
}

/// Agent id of an empty window slot.
const NO_AGENT: u32 = u32::MAX;
/// Agent id of engine events.
const ENGINE_AGENT: u32 = u32::MAX - 1;
/// Fact bits of a slot that is not a finding.
const NO_FACT: u32 = 0x7FFF_FFFF;
/// Flag bit: a peer already reacted to this entry.
const REACTED: u32 = 0x8000_0000;

/// What a ref needs to know about an earlier event: 16 bytes.
#[derive(Clone, Copy)]
struct Slot {
    ts: u64,
    agent: u32,
    fact_flags: u32,
}

const EMPTY: Slot = Slot {
    ts: 0,
    agent: NO_AGENT,
    fact_flags: NO_FACT,
};

/// The last `cap` seqs.
struct Window {
    base: u64,
    slots: VecDeque<Slot>,
    cap: usize,
}

impl Window {
    fn insert(&mut self, seq: u64, s: Slot) {
        if self.cap == 0 {
            return;
        }
        if self.slots.is_empty() {
            self.base = seq;
        }
        let end = self.base + self.slots.len() as u64;
        if seq < self.base {
            return;
        }
        if seq < end {
            self.slots[(seq - self.base) as usize] = s;
            return;
        }
        if seq - end >= self.cap as u64 {
            self.slots.clear();
            self.base = seq;
        } else {
            for _ in end..seq {
                self.slots.push_back(EMPTY);
            }
        }
        self.slots.push_back(s);
        while self.slots.len() > self.cap {
            self.slots.pop_front();
            self.base += 1;
        }
    }

    fn get_mut(&mut self, seq: u64) -> Option<&mut Slot> {
        let i = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        self.slots.get_mut(i).filter(|s| s.agent != NO_AGENT)
    }
}

/// How long before a run's first event a discovery may have been made and still count
/// (an alert that fired before the incident's run was opened).
pub const OBSERVED_BEFORE_RUN_MS_MAX: u64 = 24 * 3600 * 1000;
/// How far after the event carrying it an `observed_at` may lie (clock skew between
/// agents); later ones are out of the window. Smaller skews are clamped to 0.
pub const OBSERVED_AFTER_EVENT_MS_MAX: u64 = 10 * 60 * 1000;

/// Measures a run.
pub fn run_metrics(events: impl Iterator<Item = Event>, cfg: &DedupConfig) -> RunMetrics {
    run_metrics_windowed(events, cfg, SEQ_WINDOW)
}

/// [`run_metrics`] with a ref window of `window` seqs.
pub fn run_metrics_windowed(
    events: impl Iterator<Item = Event>,
    cfg: &DedupConfig,
    window: usize,
) -> RunMetrics {
    let mut m = RunMetrics::default();
    let mut agent_ids: HashMap<String, u32> = HashMap::new();
    let mut influenced_agents: Vec<bool> = Vec::new();
    let mut dd = Deduper::new(cfg.clone());
    // Per fact: the agents that found it (sorted).
    let mut fact_agents: Vec<Vec<u32>> = Vec::new();
    let mut contradictions: BTreeSet<(usize, usize)> = BTreeSet::new();
    let mut win = Window {
        base: 0,
        slots: VecDeque::new(),
        cap: window,
    };
    let (mut ref_delay, mut visibility, mut reaction) =
        (Lat::default(), Lat::default(), Lat::default());
    let mut open: BTreeSet<u64> = BTreeSet::new();
    let mut refs: Vec<u64> = Vec::new();
    let mut run_start: Option<Ts> = None;

    for e in events {
        m.events += 1;
        *m.entries_by_type
            .entry(e.kind.as_str().to_string())
            .or_default() += 1;

        let run_start = *run_start.get_or_insert(e.ts);
        if let Some(v) = e.meta.as_ref().and_then(|meta| meta.get("observed_at")) {
            match v.as_str().and_then(Ts::parse) {
                Some(obs)
                    if obs.0 + OBSERVED_BEFORE_RUN_MS_MAX * 1000 < run_start.0
                        || obs.0 > e.ts.0 + OBSERVED_AFTER_EVENT_MS_MAX * 1000 =>
                {
                    m.observed_at_out_of_window += 1;
                }
                Some(obs) => visibility.push_delta(obs, e.ts),
                None => m.observed_at_invalid += 1,
            }
        }

        match e.kind {
            EventType::Conflict => m.conflicts += 1,
            EventType::Escalation => {
                m.escalations += 1;
                open.insert(e.seq);
            }
            EventType::Resolution => {
                m.resolutions += 1;
                match e.content.get("escalation").and_then(Value::as_u64) {
                    Some(s) => {
                        open.remove(&s);
                    }
                    None => e.refs.iter().for_each(|s| {
                        open.remove(s);
                    }),
                }
            }
            _ => {}
        }

        if !e.kind.is_client() {
            let slot = Slot {
                ts: e.ts.0,
                agent: ENGINE_AGENT,
                fact_flags: NO_FACT,
            };
            win.insert(e.seq, slot);
            continue;
        }

        m.client_entries += 1;
        let next = agent_ids.len() as u32;
        let agent = *agent_ids.entry(e.agent_id.clone()).or_insert(next);
        if agent == next {
            influenced_agents.push(false);
        }

        refs.clear();
        refs.extend(e.refs.iter().copied());
        refs.sort_unstable();
        refs.dedup();

        // Duplication.
        let mut fact = None;
        if matches!(e.kind, EventType::Hypothesis | EventType::Evidence) {
            let t = text::content_text(&e.content);
            if !text::normalize(&t).is_empty() {
                m.findings += 1;
                let scope = e.subject.as_deref().unwrap_or("");
                let c = dd.classify(scope, &t, None);
                let f = match c.matched.fact() {
                    Some(f) if f < fact_agents.len() => {
                        dd.add_variant(f, &t);
                        let finders = &mut fact_agents[f];
                        match finders.binary_search(&agent) {
                            Ok(_) => m.redundant_same_agent += 1,
                            Err(pos) => {
                                finders.insert(pos, agent);
                                let informed = refs.iter().any(|&r| {
                                    win.get_mut(r).is_some_and(|s| {
                                        s.agent != agent && (s.fact_flags & NO_FACT) as usize == f
                                    })
                                });
                                if informed {
                                    m.informed_repeats += 1;
                                } else {
                                    m.independent_rediscoveries += 1;
                                }
                            }
                        }
                        f
                    }
                    _ => {
                        let f = dd.add_fact(scope, &t);
                        fact_agents.resize_with(f + 1, Vec::new);
                        fact_agents[f].push(agent);
                        f
                    }
                };
                for (g, _) in c.contradicts {
                    if g != f {
                        contradictions.insert((f.min(g), f.max(g)));
                    }
                }
                fact = Some(f);
            }
        }

        // Influence and reactions.
        m.refs += refs.len() as u64;
        let mut influenced = false;
        for &r in &refs {
            let found = if r < e.seq { win.get_mut(r) } else { None };
            let Some(s) = found else {
                m.refs_out_of_window += 1;
                continue;
            };
            if s.agent == ENGINE_AGENT || s.agent == agent {
                continue;
            }
            m.cross_agent_refs += 1;
            influenced = true;
            ref_delay.push_delta(Ts(s.ts), e.ts);
            if s.fact_flags & REACTED == 0 {
                s.fact_flags |= REACTED;
                reaction.push_delta(Ts(s.ts), e.ts);
            }
        }
        if influenced {
            m.influenced_entries += 1;
            influenced_agents[agent as usize] = true;
        }

        let fact_bits = fact.map_or(NO_FACT, |f| (f as u32).min(NO_FACT - 1));
        win.insert(
            e.seq,
            Slot {
                ts: e.ts.0,
                agent,
                fact_flags: fact_bits,
            },
        );
    }

    m.agents = agent_ids.len() as u64;
    m.facts = fact_agents.len() as u64;
    m.facts_found_by_several_agents = fact_agents.iter().filter(|a| a.len() > 1).count() as u64;
    m.max_agents_on_one_fact = fact_agents.iter().map(Vec::len).max().unwrap_or(0) as u64;
    m.duplication_rate = ratio(m.independent_rediscoveries, m.findings);
    m.contradictions = contradictions.len() as u64;
    m.influenced_fraction = ratio(m.influenced_entries, m.client_entries);
    m.agents_influenced = influenced_agents.iter().filter(|&&b| b).count() as u64;
    m.ref_delay = ref_delay.finish();
    m.discovery_to_visibility = visibility.finish();
    m.first_peer_reaction = reaction.finish();
    m.open_escalations = open.len() as u64;
    m.open_escalation_seqs = open.into_iter().collect();
    m
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

fn fmt_lat(l: &Latency) -> String {
    if l.count == 0 {
        return "n=0".to_string();
    }
    let mut s = format!(
        "n={}  p50={:.1}ms  p90={:.1}ms  max={:.1}ms",
        l.count, l.p50_ms, l.p90_ms, l.max_ms
    );
    if l.clamped_negative > 0 {
        s.push_str(&format!("  ({} negative, as 0)", l.clamped_negative));
    }
    s
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// A readable table of the metrics.
pub fn render_table(m: &RunMetrics) -> String {
    let types = m
        .entries_by_type
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ");
    let open = if m.open_escalation_seqs.is_empty() {
        m.open_escalations.to_string()
    } else {
        let seqs: Vec<String> = m
            .open_escalation_seqs
            .iter()
            .take(10)
            .map(|s| format!("#{s}"))
            .collect();
        let more = if m.open_escalation_seqs.len() > 10 {
            " ..."
        } else {
            ""
        };
        format!("{} ({}{more})", m.open_escalations, seqs.join(" "))
    };
    let sections: Vec<(&str, Vec<(&str, String)>)> = vec![
        (
            "run",
            vec![
                ("events", m.events.to_string()),
                ("client entries", m.client_entries.to_string()),
                ("agents", m.agents.to_string()),
                ("by type", types),
            ],
        ),
        (
            "duplication",
            vec![
                ("findings", m.findings.to_string()),
                ("facts", m.facts.to_string()),
                (
                    "facts found by 2+ agents",
                    m.facts_found_by_several_agents.to_string(),
                ),
                (
                    "independent rediscoveries",
                    m.independent_rediscoveries.to_string(),
                ),
                ("informed repeats", m.informed_repeats.to_string()),
                ("duplication rate", pct(m.duplication_rate)),
                ("redundant (same agent)", m.redundant_same_agent.to_string()),
                (
                    "max agents on one fact",
                    m.max_agents_on_one_fact.to_string(),
                ),
                ("contradictions", m.contradictions.to_string()),
            ],
        ),
        (
            "influence",
            vec![
                ("refs", m.refs.to_string()),
                ("cross-agent refs", m.cross_agent_refs.to_string()),
                (
                    "influenced entries",
                    format!("{} ({})", m.influenced_entries, pct(m.influenced_fraction)),
                ),
                ("agents influenced", m.agents_influenced.to_string()),
                ("refs out of window", m.refs_out_of_window.to_string()),
                ("ref delay", fmt_lat(&m.ref_delay)),
            ],
        ),
        (
            "latency",
            vec![
                (
                    "discovery -> visibility",
                    fmt_lat(&m.discovery_to_visibility),
                ),
                ("invalid observed_at", m.observed_at_invalid.to_string()),
                (
                    "observed_at outside run",
                    m.observed_at_out_of_window.to_string(),
                ),
                ("first peer reaction", fmt_lat(&m.first_peer_reaction)),
            ],
        ),
        (
            "conflicts",
            vec![
                ("conflicts", m.conflicts.to_string()),
                ("escalations", m.escalations.to_string()),
                ("resolutions", m.resolutions.to_string()),
                ("open escalations", open),
            ],
        ),
    ];
    let width = sections
        .iter()
        .flat_map(|(_, rows)| rows.iter().map(|(k, _)| k.len()))
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (title, rows) in sections {
        out.push_str(title);
        out.push('\n');
        for (k, v) in rows {
            out.push_str(&format!("  {k:<width$}  {v}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const MS: u64 = 1000;

    fn ev(seq: u64, ms: u64, agent: &str, kind: EventType, subject: &str, content: Value) -> Event {
        Event {
            run_id: "r".into(),
            seq,
            ts: Ts(1_000_000_000 + ms * MS),
            id: format!("e{seq}"),
            agent_id: agent.into(),
            user_id: "u".into(),
            kind,
            content,
            confidence: None,
            refs: vec![],
            subject: (!subject.is_empty()).then(|| subject.to_string()),
            session_id: None,
            meta: None,
        }
    }

    fn refs(mut e: Event, r: &[u64]) -> Event {
        e.refs = r.to_vec();
        e
    }

    fn observed(mut e: Event, v: Value) -> Event {
        let mut m = serde_json::Map::new();
        m.insert("observed_at".into(), v);
        e.meta = Some(m);
        e
    }

    fn at(ms: u64) -> Value {
        json!(Ts(1_000_000_000 + ms * MS).to_string())
    }

    fn run() -> Vec<Event> {
        use EventType::*;
        vec![
            observed(
                ev(1, 1000, "a", Hypothesis, "db", json!("pool saturated")),
                at(800),
            ),
            observed(
                ev(
                    2,
                    2000,
                    "b",
                    Evidence,
                    "db",
                    json!({"text": "pool saturated"}),
                ),
                at(1500),
            ),
            observed(
                ev(3, 3000, "a", Evidence, "db", json!("Pool  saturated.")),
                json!("garbage"),
            ),
            observed(
                refs(
                    ev(4, 4000, "c", Evidence, "db", json!("pool saturated")),
                    &[1],
                ),
                at(4100),
            ),
            refs(
                ev(5, 6000, "b", Decision, "db", json!("grow the pool")),
                &[1, 2, 2],
            ),
            refs(
                ev(6, 6500, "c", Evidence, "cache", json!("cache cold")),
                &[2, 99],
            ),
            ev(
                7,
                8000,
                "swarm:engine",
                Escalation,
                "db",
                json!({"subject": "db"}),
            ),
            ev(
                8,
                9000,
                "swarm:engine",
                Escalation,
                "db",
                json!({"subject": "db"}),
            ),
            refs(
                ev(
                    9,
                    10000,
                    "human",
                    Resolution,
                    "db",
                    json!({"escalation": 7, "note": "x"}),
                ),
                &[7],
            ),
            ev(10, 11000, "swarm:engine", Conflict, "", json!({})),
        ]
    }

    #[test]
    fn hand_built_run_has_known_answers() {
        let m = run_metrics(run().into_iter(), &DedupConfig::default());
        assert_eq!((m.events, m.client_entries, m.agents), (10, 6, 3));
        let types: Vec<(&str, u64)> = m
            .entries_by_type
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        assert_eq!(
            types,
            [
                ("conflict", 1),
                ("decision", 1),
                ("escalation", 2),
                ("evidence", 4),
                ("hypothesis", 1),
                ("resolution", 1)
            ]
        );
        // Duplication: #2 rediscovers a's fact on its own, #3 is a's repeat, #4 read #1.
        assert_eq!((m.findings, m.facts), (5, 2));
        assert_eq!(m.facts_found_by_several_agents, 1);
        assert_eq!(m.independent_rediscoveries, 1);
        assert_eq!(m.informed_repeats, 1);
        assert_eq!(m.redundant_same_agent, 1);
        assert_eq!(m.duplication_rate, 0.2);
        assert_eq!(m.max_agents_on_one_fact, 3);
        assert_eq!(m.contradictions, 0);
        // Influence: 4->1 (3000ms), 5->1 (5000ms), 5->2 own, 6->2 (4500ms), 6->99 out.
        assert_eq!(
            (m.refs, m.cross_agent_refs, m.refs_out_of_window),
            (5, 3, 1)
        );
        assert_eq!((m.influenced_entries, m.agents_influenced), (3, 2));
        assert_eq!(m.influenced_fraction, 0.5);
        let lat = |n, p50, p90, max, neg| Latency {
            count: n,
            p50_ms: p50,
            p90_ms: p90,
            max_ms: max,
            clamped_negative: neg,
        };
        assert_eq!(m.ref_delay, lat(3, 4500.0, 5000.0, 5000.0, 0));
        // Observed: 200ms, 500ms, garbage, 100ms in the future (clamped).
        assert_eq!(m.discovery_to_visibility, lat(3, 200.0, 500.0, 500.0, 1));
        assert_eq!(m.observed_at_out_of_window, 0);
        assert_eq!(m.observed_at_invalid, 1);
        // First reactions: #1 by #4 (3000ms), #2 by #6 (4500ms).
        assert_eq!(m.first_peer_reaction, lat(2, 3000.0, 4500.0, 4500.0, 0));
        assert_eq!((m.conflicts, m.escalations, m.resolutions), (1, 2, 1));
        assert_eq!(
            (m.open_escalations, m.open_escalation_seqs.clone()),
            (1, vec![8])
        );

        let t = render_table(&m);
        assert!(t.contains("duplication rate           20.0%"), "{t}");
        assert!(t.contains("open escalations           1 (#8)"), "{t}");
        assert!(serde_json::to_string(&m).is_ok());
    }

    #[test]
    fn observed_at_outside_the_run_is_ignored_and_counted() {
        let at = |seq: u64, secs: u64, obs: &str| {
            let mut e = ev(seq, 0, "a", EventType::Evidence, "", json!("x"));
            e.ts = Ts(Ts::parse("2026-11-25T10:00:00Z").unwrap().0 + secs * 1_000_000);
            observed(e, json!(obs))
        };
        let events = vec![
            at(1, 0, "2026-11-25T09:59:59Z"),  // 1 s before: counts
            at(2, 10, "1970-01-01T00:00:00Z"), // a broken clock: ignored
            at(3, 20, "2026-11-26T12:00:00Z"), // a day ahead of the event: ignored
            at(4, 30, "2026-11-24T09:00:00Z"), // 25 h before the run: ignored
        ];
        let m = run_metrics(events.into_iter(), &DedupConfig::default());
        assert_eq!(m.observed_at_out_of_window, 3);
        assert_eq!(m.discovery_to_visibility.count, 1);
        assert_eq!(m.discovery_to_visibility.max_ms, 1000.0);
    }

    #[test]
    fn refs_beyond_the_window_are_counted() {
        let m = run_metrics_windowed(run().into_iter(), &DedupConfig::default(), 2);
        // 4->1 and 5->1 fall out; 5->2 (own) and 6->2 still hit? #2 is 4 seqs before #6.
        assert_eq!(m.refs, 5);
        assert_eq!(m.cross_agent_refs, 0);
        assert_eq!(m.refs_out_of_window, 5);
        // #4 no longer sees #1: an independent rediscovery.
        assert_eq!((m.independent_rediscoveries, m.informed_repeats), (2, 0));
    }

    #[test]
    fn empty_run() {
        let m = run_metrics(std::iter::empty(), &DedupConfig::default());
        assert_eq!(m, RunMetrics::default());
        assert!(render_table(&m).contains("events"));
    }

    #[test]
    fn latency_switches_to_histogram() {
        let mut l = Lat::default();
        for v in 1..=10_000u64 {
            l.push(v * MS);
        }
        let r = l.finish();
        assert_eq!(r.count, 10_000);
        assert_eq!(r.max_ms, 10_000.0);
        assert!((r.p50_ms - 5000.0).abs() / 5000.0 < 1.0 / 32.0, "{r:?}");
        assert!((r.p90_ms - 9000.0).abs() / 9000.0 < 1.0 / 32.0, "{r:?}");
        for v in [0, 1, 31, 32, 33, 1000, u64::MAX / 3, u64::MAX] {
            let b = bucket(v);
            assert!(b < BUCKETS && bucket_upper(b) >= v, "{v}");
        }
    }
}
