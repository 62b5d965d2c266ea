//! `swarm search`: the user's facts and findings ranked by words and, with a model, by
//! meaning (the library's `synth::search`). Also where the CLI gets its embedding model.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use swarm_memory::embed::{self, Embedder, Table};
use swarm_memory::synth::search::{self, Ranker, SearchQuery};
use swarm_memory::{EventType, ReadOptions, Store, Ts};

use crate::scratch::{invalid, print_json};

/// A model, or why there is none.
pub struct Model {
    /// The model.
    pub embedder: Option<Arc<dyn Embedder>>,
    /// Why there is none (empty with a model).
    pub reason: String,
}

impl Model {
    /// How a search ranks with it.
    pub fn ranker(&self) -> Ranker<'_> {
        Ranker::new(self.embedder.as_deref(), &self.reason)
    }
}

/// The sentence-embedding model: from `explicit` (`--embed-model DIR`), else
/// `SWARM_EMBED_MODEL`, else `DATA_DIR/.models/all-MiniLM-L6-v2` (`embed::locate`); when
/// there is none, why (the search and the synthesizer are then lexical and say so).
pub fn model(explicit: Option<&Path>, data_dir: &Path) -> anyhow::Result<Model> {
    let located = embed::locate(explicit, data_dir);
    Ok(match embed::load(&located)? {
        Some(m) => Model {
            embedder: Some(m),
            reason: String::new(),
        },
        None => Model {
            embedder: None,
            reason: located
                .reason()
                .unwrap_or_else(|| "built without the `semantic` feature".to_string()),
        },
    })
}

/// [`model`] behind the user's vector cache (`DATA_DIR/.vectors/USER/`): each distinct
/// text is embedded once per model, by the synthesizer and the search alike.
pub fn cached_model(explicit: Option<&Path>, data_dir: &Path, user: &str) -> anyhow::Result<Model> {
    let mut m = model(explicit, data_dir)?;
    if let Some(inner) = m.embedder.take() {
        let dir = embed::cache::user_dir(data_dir, user);
        m.embedder = Some(Arc::new(embed::cache::Cached::open(inner, &dir)?));
    }
    Ok(m)
}

/// Fixed vectors computed elsewhere (`.ci/embed_vectors.py`: a JSON object, text to
/// vector) as the model, for measuring: a text the file does not hold is an error.
pub fn table_model(path: &Path) -> anyhow::Result<Model> {
    let bad = |e: String| invalid("embed-vectors", format!("{}: {e}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().to_string(),
    );
    let t = Table::from_json(&format!("vectors:{name}"), &text)?;
    Ok(Model {
        embedder: Some(Arc::new(t)),
        reason: String::new(),
    })
}

#[derive(Args)]
pub struct SearchArgs {
    /// What to look for, in words ("connection pool exhausted orders-db").
    pub(crate) query: String,
    /// Only this run (a closed run is searched only when named).
    #[arg(long)]
    pub(crate) run: Option<String>,
    /// Only what this agent wrote (facts: that it found).
    #[arg(long)]
    pub(crate) agent: Option<String>,
    /// Only this entry type: hypothesis, evidence, decision or action_taken.
    #[arg(long, alias = "type")]
    pub(crate) kind: Option<String>,
    /// Only entries (facts: with evidence) at or after this RFC 3339 time (or date).
    #[arg(long)]
    pub(crate) since: Option<String>,
    /// Hits wanted, 1 to 100 (more is refused).
    #[arg(long, default_value_t = 10)]
    pub(crate) limit: usize,
    /// Search as this agent: only what the runs' policies let it see.
    #[arg(long)]
    pub(crate) as_agent: Option<String>,
    /// One JSON object (mode, model, hits) instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// A sentence-transformers model directory (default: the one under the data dir).
    #[arg(long, env = "SWARM_EMBED_MODEL")]
    pub(crate) embed_model: Option<PathBuf>,
}

pub fn search(store: &Store, data_dir: &Path, a: SearchArgs) -> anyhow::Result<ExitCode> {
    let kind = a.kind.as_deref().map(EventType::parse_client).transpose()?;
    let since = match a.since.as_deref() {
        None => None,
        Some(s) => Some(
            Ts::parse(s).ok_or_else(|| invalid("since", format!("{s:?} {}", Ts::refusal(s))))?,
        ),
    };
    let filters = ReadOptions {
        agent: a.agent,
        kind,
        since,
        reader: a.as_agent,
        ..ReadOptions::default()
    };
    let m = cached_model(a.embed_model.as_deref(), data_dir, store.user())?;
    let q = SearchQuery {
        text: &a.query,
        run: a.run.as_deref(),
        filters,
        limit: a.limit,
        facts: true,
    };
    let ans = search::search(store, &q, m.ranker())?;
    let rows = ans.rows();
    if a.json {
        return print_json(&rows);
    }
    let out = io::stdout();
    let mut out = out.lock();
    let mode = match (&rows.model, &rows.reason) {
        (Some(id), _) => format!("hybrid (words and {id})"),
        (None, Some(why)) => format!("lexical ({why})"),
        (None, None) => rows.mode.to_string(),
    };
    writeln!(
        out,
        "{} hits of {} facts and {} findings; mode: {}",
        rows.hits.len(),
        rows.facts_considered,
        rows.findings_considered,
        crate::term::safe(&mode)
    )?;
    writeln!(
        out,
        "{:>3} {:>7} {:<7} {:<20} {:<16} {:<20} text",
        "#", "score", "source", "id", "agent", "ts"
    )?;
    for (i, h) in rows.hits.iter().enumerate() {
        let id = match (&h.fact_id, &h.run, h.seq) {
            (Some(f), _, _) => f.clone(),
            (None, Some(r), Some(s)) => format!("{r}#{s}"),
            _ => "-".into(),
        };
        let agent = match (&h.agent, &h.agents) {
            (Some(a), _) => a.clone(),
            (None, Some(all)) => all.join(","),
            _ => "-".into(),
        };
        let ts = h.ts.map_or_else(|| "-".into(), |t| t.to_string());
        let text: String = h.text.chars().take(80).collect();
        let line = format!(
            "{:>3} {:>7.4} {:<7} {:<20} {:<16} {:<20} {}",
            i + 1,
            h.score,
            h.source,
            id,
            agent,
            ts.get(..19).unwrap_or(&ts),
            text
        );
        writeln!(out, "{}", crate::term::safe(&line))?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
