//! The routes of `/v1`, `/healthz` and `/readyz`. Each handler checks the token's limits
//! (its agents, its role), then makes one library call on a blocking thread (the engine's
//! calls do file I/O and may wait on locks and fsyncs) and returns its result as JSON.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::embed::Embedder;
use crate::event::ts::Ts;
use crate::event::{Event, EventType};
use crate::fold::replay::Target;
use crate::fold::rules::{ChannelDecl, ChannelKind, ConflictPolicy, Policy};
use crate::fold::summary::Builtin;
use crate::query::options::ReadOptions;
use crate::scratchpad::board::PickOutcome;
use crate::serve::app::App;
use crate::serve::append;
use crate::serve::extract::{Act, Identity, JsonBody, Keyed, NoParams, Reading, Q};
use crate::serve::problem::Problem;
use crate::serve::sse;
use crate::serve::token::Role;
use crate::synth::dedup::DedupConfig;
use crate::synth::search::{self, Ranker, SearchQuery};
use crate::synth::{FactsQuery, SynthOptions};
use crate::tail::TailOptions;

/// A list of events, in stored field order (through `json!` they would be re-sorted).
#[derive(Serialize)]
struct Events {
    events: Vec<Event>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_from_seq: Option<Option<u64>>,
}

/// Events one `GET .../events` returns at most; `next_from_seq` says where to go on.
pub const READ_PAGE_EVENTS_MAX: usize = 10_000;

/// The whole API. Every path is one `openapi.json` lists (checked in debug builds, so
/// every test that starts a server checks it); `serve_operator_routes_health_metrics_and_openapi`
/// checks each documented method against the running server, and that the others are 405.
#[rustfmt::skip] // a line per concern: the table reads as the outline of the API
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .doc("/healthz", get(healthz)).doc("/readyz", get(readyz)).doc("/metrics", get(metrics))
        .doc("/v1/openapi.json", get(openapi))
        .doc("/v1/runs", get(runs)).doc("/v1/runs/{run}", get(run_info))
        .doc("/v1/runs/{run}/events", get(read).post(append::append))
        .doc("/v1/runs/{run}/verify", get(verify))
        .doc("/v1/runs/{run}/board", get(board)).doc("/v1/runs/{run}/pick", post(pick))
        .doc("/v1/runs/{run}/escalations", get(escalations))
        .doc("/v1/runs/{run}/escalations/{seq}/resolve", post(resolve))
        .doc("/v1/runs/{run}/channels", get(channels).post(declare_channel))
        .doc("/v1/runs/{run}/channels/{channel}", get(channel).post(write_channel))
        .doc("/v1/runs/{run}/policy", get(policy).put(set_policy))
        .doc("/v1/runs/{run}/context", get(context)).doc("/v1/runs/{run}/prune", post(prune))
        .doc("/v1/runs/{run}/replay", get(replay)).doc("/v1/runs/{run}/diff", get(diff))
        .doc("/v1/runs/{run}/metrics", get(run_metrics))
        .doc("/v1/runs/{run}/close", post(close)).doc("/v1/runs/{run}/restore", post(restore))
        .doc("/v1/facts", get(facts)).doc("/v1/facts/{fact}", get(explain))
        .doc("/v1/patterns", get(patterns)).doc("/v1/advise", get(advise))
        .doc("/v1/synth", post(synth)).doc("/v1/search", get(search))
        .doc("/v1/memory-events", get(memory_events))
        .fallback(|| async { Problem::not_found("no such route") })
        .method_not_allowed_fallback(|m: axum::http::Method| async move {
            Problem::new(axum::http::StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed",
                "Method not allowed", format!("this route does not take {m} (its Allow header lists what it takes)"))
        })
        .with_state(app)
}

/// `Router::route` for a documented path.
trait Documented {
    fn doc(self, path: &str, handler: MethodRouter<Arc<App>>) -> Self;
}

impl Documented for Router<Arc<App>> {
    fn doc(self, path: &str, handler: MethodRouter<Arc<App>>) -> Self {
        debug_assert!(
            serde_json::from_str::<Value>(OPENAPI).is_ok_and(|d| d["paths"].get(path).is_some()),
            "route {path} is not in openapi.json"
        );
        self.route(path, handler)
    }
}

/// The OpenAPI 3.1 document of [`router`].
pub const OPENAPI: &str = include_str!("openapi.json");

async fn openapi() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI,
    )
        .into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let sync = app.sync_totals();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.metrics.render(sync, app.watches.stats()),
    )
        .into_response()
}

/// What a read route answers.
type Viewed = Result<Response, Problem>;

/// 200 with `v` as JSON, its fields in their declared order (through `json!` they would
/// be sorted, and the CLI as a client could not print what the embedded CLI prints).
fn answer<T: Serialize>(v: T) -> Viewed {
    Ok(Json(v).into_response())
}
/// What a write route answers.
type Created = Result<Response, Problem>;

fn parse_ts(field: &str, s: Option<String>) -> Result<Option<Ts>, Problem> {
    match s {
        None => Ok(None),
        Some(s) => Ts::parse(&s)
            .map(Some)
            .ok_or_else(|| Problem::invalid(format!("{field}: {s:?} {}", Ts::refusal(&s)))),
    }
}

fn parse_type(s: Option<String>) -> Result<Option<EventType>, Problem> {
    match s {
        None => Ok(None),
        Some(k) => EventType::parse(&k)
            .map(Some)
            .ok_or_else(|| Problem::invalid(format!("type: {k:?} is not an entry type"))),
    }
}

async fn healthz() -> Json<Value> {
    Json(json!({"ok": true}))
}

/// Ready when not shutting down and the data directory can be listed.
async fn readyz(State(app): State<Arc<App>>) -> Response {
    if *app.shutdown.borrow() {
        return Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting-down",
            "Shutting down",
            "the server is shutting down",
        )
        .into_response();
    }
    let dir = app.opts.data_dir.clone();
    let ok = tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&dir).and_then(|_| std::fs::read_dir(&dir).map(|_| ()))
    })
    .await;
    match ok {
        Ok(Ok(())) => Json(json!({"ready": true})).into_response(),
        _ => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not-ready",
            "Not ready",
            "the data directory cannot be read",
        )
        .into_response(),
    }
}

async fn runs(id: Identity) -> Viewed {
    // The engine's own logs (`@facts`, `@patterns`) are listed to admin tokens only (the
    // facts are drawn past every run's read policy).
    let admin = id.token.role == Role::Admin;
    let infos = id
        .call(move |s| {
            let ids = s.run_ids()?;
            ids.iter()
                .filter(|r| admin || !r.starts_with('@'))
                .map(|r| s.run_info(r))
                .collect::<Result<Vec<_>, _>>()
        })
        .await?;
    answer(Keyed("runs", infos))
}

async fn run_info(id: Identity, Path(run): Path<String>) -> Viewed {
    answer(id.call(move |s| s.run_info(&run)).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadQuery {
    from_seq: Option<u64>,
    to_seq: Option<u64>,
    agent: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    subject: Option<String>,
    since: Option<String>,
    until: Option<String>,
    last: Option<usize>,
    limit: Option<usize>,
    follow: Option<String>,
}

/// `GET /v1/runs/{run}/events`: every filter of `swarm read`, as the token's agent (the
/// run's policy filters what it sees). At most [`READ_PAGE_EVENTS_MAX`] events;
/// `next_from_seq` names the next page. With `follow=1`, a live tail over SSE.
async fn read(
    State(app): State<Arc<App>>,
    Reading { id, reader }: Reading,
    Path(run): Path<String>,
    headers: HeaderMap,
    Q(q): Q<ReadQuery>,
) -> Result<Response, Problem> {
    let follow = match q.follow.as_deref() {
        None | Some("0") | Some("false") => false,
        Some("1") | Some("true") => true,
        Some(f) => return Err(Problem::invalid(format!("follow: {f:?} is not 1 or 0"))),
    };
    let kind = parse_type(q.kind)?;
    if follow {
        if q.to_seq.is_some()
            || q.since.is_some()
            || q.until.is_some()
            || q.last.is_some()
            || q.limit.is_some()
        {
            return Err(Problem::invalid(
                "follow takes from_seq, agent, type, subject and as; to_seq, since, until, last and limit are for reads",
            ));
        }
        let from_seq = match sse::last_event_id(&headers)? {
            Some(seen) => Some(seen.saturating_add(1)),
            None => q.from_seq,
        };
        let sub = sse::Subscription {
            run,
            tail: TailOptions {
                from_seq,
                agent: q.agent,
                kind,
                ..TailOptions::default()
            },
            subject: q.subject,
            reader,
            memory: false,
            token_id: id.token.id.clone(),
        };
        return sse::follow(app, id.store, sub).await;
    }
    let page = q
        .limit
        .unwrap_or(READ_PAGE_EVENTS_MAX)
        .min(READ_PAGE_EVENTS_MAX);
    let opts = ReadOptions {
        from_seq: q.from_seq,
        to_seq: q.to_seq,
        agent: q.agent,
        kind,
        subject: q.subject,
        since: parse_ts("since", q.since)?,
        until: parse_ts("until", q.until)?,
        last: match q.last {
            // `last` holds its events until the read ends: bounded as a page is.
            Some(n) if n > READ_PAGE_EVENTS_MAX => {
                return Err(Problem::invalid(format!(
                    "last is at most {READ_PAGE_EVENTS_MAX} (page older events with from_seq and limit)"
                )));
            }
            n => n,
        },
        // One more than the page, to learn whether there is a next one.
        limit: Some(page + 1),
        reader,
        ..ReadOptions::default()
    };
    let mut events = id
        .call(move |s| s.read(&run, opts)?.collect::<Result<Vec<_>, _>>())
        .await?;
    let next = match events.len() > page {
        true => events.pop().map(|e| e.seq),
        false => None,
    };
    Ok(Json(Events {
        events,
        next_from_seq: Some(next),
    })
    .into_response())
}

/// `GET /v1/memory-events?run=R`: seed 002's memory events of a run of the token's user
/// (`synth::memory_events`), as a live SSE stream, read as the token's agent (the run's
/// policy filters the events they come from). Each SSE `id` is the seq of the source
/// event; `Last-Event-ID` resumes after it.
async fn memory_events(
    State(app): State<Arc<App>>,
    Reading { id, reader }: Reading,
    headers: HeaderMap,
    Q(q): Q<MemoryEventsQuery>,
) -> Result<Response, Problem> {
    let from_seq = match sse::last_event_id(&headers)? {
        Some(seen) => Some(seen.saturating_add(1)),
        None => q.from_seq,
    };
    let sub = sse::Subscription {
        run: q.run,
        tail: TailOptions {
            from_seq,
            ..TailOptions::default()
        },
        subject: None,
        reader,
        memory: true,
        token_id: id.token.id.clone(),
    };
    sse::follow(app, id.store, sub).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MemoryEventsQuery {
    run: String,
    from_seq: Option<u64>,
}

async fn verify(id: Identity, Path(run): Path<String>) -> Viewed {
    answer(id.call(move |s| s.verify(&run, |_| {})).await?)
}

/// `?subject=`: only that subject.
/// `?subject=S&history=true`: one subject; every seq of each subject's history.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BoardQuery {
    subject: Option<String>,
    #[serde(default)]
    history: bool,
}

async fn board(Path(run): Path<String>, r: Reading, Q(q): Q<BoardQuery>) -> Viewed {
    r.view("board", move |s, a| {
        s.board_with(&run, a, q.subject.as_deref(), q.history)
    })
    .await
}

/// The subject an agent picks a hypothesis on.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PickBody {
    subject: String,
}

/// `POST .../pick`: 201 with the decision, or 423 with the escalation a tie caused.
async fn pick(Path(run): Path<String>, a: Act<PickBody>) -> Created {
    let r = a
        .call(move |s, agent, b| s.pick(&run, agent, &b.subject))
        .await?;
    let status = match r {
        PickOutcome::Picked { .. } => StatusCode::CREATED,
        PickOutcome::Escalated { .. } => StatusCode::LOCKED,
    };
    Ok((status, Json(r)).into_response())
}

/// `?all=true`: resolved escalations too.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AllQuery {
    #[serde(default)]
    all: bool,
}

async fn escalations(Path(run): Path<String>, r: Reading, Q(q): Q<AllQuery>) -> Viewed {
    r.view("escalations", move |s, a| s.escalations_as(&run, q.all, a))
        .await
}

/// How an escalation is resolved: a note, and the winning hypothesis's seq if any.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    note: String,
    winner: Option<u64>,
}

async fn resolve(Path((run, seq)): Path<(String, u64)>, a: Act<ResolveBody>) -> Created {
    a.created(move |s, agent, b| s.resolve(&run, agent, seq, b.winner, &b.note))
        .await
}

async fn channels(Path(run): Path<String>, r: Reading, _: Q<NoParams>) -> Viewed {
    r.view("channels", move |s, a| s.channels(&run, a)).await
}

/// A channel's declaration.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeclareBody {
    channel: String,
    kind: ChannelKind,
    #[serde(default)]
    on_conflict: ConflictPolicy,
    #[serde(default = "max_size_kb_default")]
    max_size_kb: u64,
}

/// The CLI's default channel size limit.
fn max_size_kb_default() -> u64 {
    100
}

async fn declare_channel(Path(run): Path<String>, a: Act<DeclareBody>) -> Created {
    a.created(move |s, agent, b| {
        let decl = ChannelDecl {
            channel: b.channel,
            kind: b.kind,
            on_conflict: b.on_conflict,
            max_size_kb: b.max_size_kb,
        };
        s.declare_channel(&run, agent, &decl)
    })
    .await
}

/// `?history=true`: the channel's writes and conflicts (`swarm channel history`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    #[serde(default)]
    history: bool,
}

/// `GET .../channels/{channel}`: its value and version, or (`history=true`) its writes
/// and conflicts as events, read as the reading agent.
async fn channel(
    Path((run, name)): Path<(String, String)>,
    r: Reading,
    Q(q): Q<HistoryQuery>,
) -> Viewed {
    let n = name.clone();
    if q.history {
        let events =
            r.id.call(move |s| {
                let c = s.channel(&run, r.reader.as_deref(), &n)?;
                let mut seqs: Vec<u64> = c.history.iter().chain(&c.conflicts).copied().collect();
                seqs.sort_unstable();
                let opts = ReadOptions {
                    from_seq: Some(seqs.first().copied().unwrap_or(1)),
                    to_seq: Some(seqs.last().copied().unwrap_or(0)),
                    reader: r.reader,
                    ..ReadOptions::default()
                };
                let mut out = Vec::new();
                for e in s.read(&run, opts)? {
                    let e = e?;
                    if seqs.binary_search(&e.seq).is_ok() {
                        out.push(e);
                    }
                }
                Ok(out)
            })
            .await?;
        return answer(Keyed("events", events));
    }
    let c =
        r.id.call(move |s| s.channel(&run, r.reader.as_deref(), &n))
            .await?;
    answer(json!({
        "channel": name, "kind": c.decl.kind, "on_conflict": c.decl.on_conflict,
        "version": c.version, "value": c.value, "writes": c.history.len(),
        "conflicts": c.conflicts.len(),
    }))
}

/// A channel write: the version it was based on (a CAS when the channel asks for one)
/// and the value.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteBody {
    base_version: Option<u64>,
    value: Value,
    /// Idempotency id: a retry returns the stored write.
    id: Option<String>,
}

async fn write_channel(Path((run, name)): Path<(String, String)>, a: Act<WriteBody>) -> Created {
    a.created(move |s, agent, b| {
        s.write_channel_with_id(&run, agent, &name, b.value, b.base_version, b.id.as_deref())
    })
    .await
}

async fn policy(id: Identity, Path(run): Path<String>) -> Viewed {
    answer(Keyed("policy", id.call(move |s| s.policy(&run)).await?))
}

/// A run's new policy.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyBody {
    policy: Policy,
}

async fn set_policy(Path(run): Path<String>, a: Act<PolicyBody>) -> Created {
    a.created(move |s, agent, b| s.set_policy(&run, agent, &b.policy))
        .await
}

/// A context's size limit.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ContextQuery {
    budget_bytes: usize,
}

/// `GET .../context?budget_bytes=N`: the prompt context of the token's agent (its read
/// permissions apply), never over the budget.
async fn context(Path(run): Path<String>, r: Reading, Q(q): Q<ContextQuery>) -> Viewed {
    let Some(agent) = r.reader else {
        return Err(Problem::invalid(
            "as: a context is an agent's; name the agent (?as=AGENT)",
        ));
    };
    let c =
        r.id.call(move |s| s.context(&run, &agent, q.budget_bytes))
            .await?;
    answer(c)
}

/// `force`: prune even under the threshold.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PruneBody {
    #[serde(default)]
    force: bool,
}

/// `POST .../prune`: with the built-in summariser only (a summariser command would let
/// a client run programs on the server).
async fn prune(Path(run): Path<String>, a: Act<PruneBody>) -> Created {
    let r = a
        .call(move |s, agent, b| s.prune(&run, agent, &Builtin, b.force))
        .await?;
    Ok(match r {
        Some(e) => (StatusCode::CREATED, Json(e)).into_response(),
        None => {
            Json(json!({"pruned": false, "reason": "working view under the threshold (or empty)"}))
                .into_response()
        }
    })
}

/// A point of a run: `at_seq` or `at` (a time), or neither (its head).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayQuery {
    at_seq: Option<u64>,
    at: Option<String>,
}

fn target(at_seq: Option<u64>, at: Option<String>) -> Result<Target, Problem> {
    match (at_seq, parse_ts("at", at)?) {
        (Some(_), Some(_)) => Err(Problem::invalid("give at_seq or at, not both")),
        (Some(s), None) => Ok(Target::Seq(s)),
        (None, Some(t)) => Ok(Target::Time(t)),
        (None, None) => Ok(Target::Head),
    }
}

/// A run at a point as an agent saw it.
#[derive(Serialize)]
struct AgentReplay {
    replay: crate::fold::replay::ReplayStats,
    view: crate::store::travel::AgentView,
}

/// What `replay` answers: an agent's view, or the whole state.
enum Replayed {
    View(AgentReplay),
    State(Value),
}

/// `GET .../replay?at_seq=N|at=T`: the run at a point, as the token's agent sees it (its
/// agent view: what the run's policy lets it read). An admin token that names no agent
/// gets the whole state.
async fn replay(Path(run): Path<String>, r: Reading, Q(q): Q<ReplayQuery>) -> Viewed {
    let target = target(q.at_seq, q.at)?;
    let out =
        r.id.call(move |s| {
            let st = s.state_at(&run, target, |_| {})?;
            Ok(match r.reader {
                // In field order: the view as `swarm replay --agent` prints it.
                Some(agent) => Replayed::View(AgentReplay {
                    view: s.agent_view(&run, &st.state, &agent)?,
                    replay: st.stats,
                }),
                // Through a JSON value (members sorted), as `swarm replay` prints it.
                None => Replayed::State(json!({"replay": st.stats, "state": st.state})),
            })
        })
        .await?;
    match out {
        Replayed::View(v) => answer(v),
        Replayed::State(v) => answer(v),
    }
}

/// Two points of a run, each a seq or a time (`to`: the head when neither is given).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DiffQuery {
    from_seq: Option<u64>,
    from: Option<String>,
    to_seq: Option<u64>,
    to: Option<String>,
}

/// `GET .../diff?from_seq=A|from=T&to_seq=B|to=T`: what changed between two points (admin
/// tokens: a diff names every subject's entries).
async fn diff(id: Identity, Path(run): Path<String>, Q(q): Q<DiffQuery>) -> Viewed {
    id.admin()?;
    let from = match target(q.from_seq, q.from)? {
        Target::Head => return Err(Problem::invalid("from_seq or from: required")),
        t => t,
    };
    let to = target(q.to_seq, q.to)?;
    let d = id
        .call(move |s| {
            let a = s
                .state_at(&run, from, |_| {})
                .map_err(|e| e.renamed("at-seq", "from_seq"))?;
            let b = s
                .state_at(&run, to, |_| {})
                .map_err(|e| e.renamed("at-seq", "to_seq"))?;
            s.diff(&run, &a.state, &b.state)
        })
        .await?;
    answer(d)
}

/// `GET .../metrics`: the run's quality metrics (`swarm metrics --json`); admin tokens.
async fn run_metrics(id: Identity, Path(run): Path<String>) -> Viewed {
    id.admin()?;
    let m = id
        .call(move |s| s.metrics(&run, &DedupConfig::default()))
        .await?;
    answer(m)
}

/// `POST .../close {"agent": A}`: closes and archives the run (the run's policy decides
/// whether the agent may).
async fn close(Path(run): Path<String>, a: Act<NoParams>) -> Created {
    a.created(move |s, agent, _| s.close_run(&run, agent)).await
}

/// `POST .../restore`: brings an archived run back (admin tokens).
async fn restore(id: Identity, Path(run): Path<String>) -> Created {
    id.admin()?;
    let info = id.call(move |s| s.restore_run(&run)).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

/// The facts asked for.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FactsParams {
    subject: Option<String>,
    as_of: Option<String>,
    #[serde(default)]
    all: bool,
}

/// `GET /v1/facts`: the user's synthesized facts (admin tokens: facts are drawn from
/// every run of the user, past any one run's read policy).
async fn facts(id: Identity, Q(q): Q<FactsParams>) -> Viewed {
    id.admin()?;
    let query = FactsQuery {
        subject: q.subject,
        as_of: parse_ts("as_of", q.as_of)?,
        include_superseded: q.all,
        reader: None,
    };
    answer(id.call(move |s| s.facts(&query)).await?)
}

/// The search asked for.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchParams {
    q: Option<String>,
    run: Option<String>,
    agent: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    since: Option<String>,
    limit: Option<usize>,
}

/// `GET /v1/search?q=...`: the token's user's memory searched (`swarm search --json`'s
/// answer). Findings are read as the reading agent (the runs' policies apply); facts,
/// drawn from every run past any run's read policy, only for admin tokens (as
/// `GET /v1/facts`). Hybrid with the server's model, through the user's own vector
/// cache; lexical without one, saying why.
async fn search(State(app): State<Arc<App>>, r: Reading, Q(p): Q<SearchParams>) -> Viewed {
    let Some(text) = p.q else {
        return Err(Problem::invalid("q: required (the words to look for)"));
    };
    let facts = r.id.token.role == Role::Admin;
    let filters = ReadOptions {
        agent: p.agent,
        kind: parse_type(p.kind)?,
        since: parse_ts("since", p.since)?,
        reader: r.reader,
        ..ReadOptions::default()
    };
    let embedder = app.embedder_for(r.id.store.user()).await?;
    let rows =
        r.id.call(move |s| {
            let q = SearchQuery {
                text: &text,
                run: p.run.as_deref(),
                filters,
                limit: p.limit.unwrap_or(10),
                facts,
            };
            let ranker = Ranker::new(
                embedder.as_deref().map(|e| e as &dyn Embedder),
                app.vectors.reason(),
            );
            let rows = search::search(s, &q, ranker).map(|a| a.rows());
            if let Some(e) = &embedder {
                // New vectors go to the user's cache file now (a no-op without any).
                if let Err(err) = e.flush() {
                    tracing::warn!(error = %err, "cannot write the vector cache");
                }
            }
            rows
        })
        .await?;
    answer(rows)
}

/// How many evidence links an explanation lists.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExplainQuery {
    #[serde(default = "explain_limit_default")]
    limit: usize,
}

/// The CLI's default number of evidence links.
fn explain_limit_default() -> usize {
    20
}

/// `GET /v1/facts/{fact}`: a fact with its evidence (admin tokens, as facts).
async fn explain(id: Identity, Path(fact): Path<String>, Q(q): Q<ExplainQuery>) -> Viewed {
    id.admin()?;
    answer(id.call(move |s| s.explain_fact(&fact, q.limit)).await?)
}

/// A symptom or a tool to look up.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LookupQuery {
    symptom: Option<String>,
    tool: Option<String>,
}

/// `GET /v1/patterns?symptom=S`: investigation patterns, the user's own and the shared,
/// sanitized ones. Read as the token's agent (`?as=`): the user's own come only from
/// runs whose policy shows that agent every entry type (`Store::own_book_as`).
async fn patterns(r: Reading, Q(q): Q<LookupQuery>) -> Viewed {
    let Some(symptom) = q.symptom else {
        return Err(Problem::invalid("symptom: required"));
    };
    r.view("patterns", move |s, a| s.patterns_as(&symptom, a))
        .await
}

/// `GET /v1/advise?tool=T`: known mistakes with a tool, the user's own and shared ones,
/// read as the token's agent as `/v1/patterns` is.
async fn advise(r: Reading, Q(q): Q<LookupQuery>) -> Viewed {
    let Some(tool) = q.tool else {
        return Err(Problem::invalid("tool: required"));
    };
    r.view("mistakes", move |s, a| s.advise_as(&tool, a)).await
}

/// `POST /v1/synth`: one synthesizer pass over the user's runs, default options (admin
/// tokens; the LLM judge is the CLI's).
/// The options of `POST /v1/synth` (all optional; no body: the defaults). `swarm synth`'s
/// flags, less `--llm-cmd`: a server never runs a command a client names.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SynthBody {
    /// Synthesize only these runs (default: every run of the token's user).
    #[serde(default)]
    runs: Vec<String>,
    /// Source events per atomic pass.
    pass_events: Option<u64>,
    #[serde(default)]
    project_ids: Vec<String>,
    #[serde(default)]
    env_names: Vec<String>,
    #[serde(default)]
    redact_names: Vec<String>,
    /// `off`, `structured` or `sanitized` (default: the user's setting).
    share_patterns: Option<String>,
    /// Refused with a reason (rather than as an unknown field).
    llm_cmd: Option<Value>,
}

/// `POST /v1/synth`: one synthesizer pass over the token's user's runs (admin tokens),
/// semantic with the server's embedding model when it has one (as `swarm synth` with
/// one), else lexical and the report says why. The body (optional) gives the options.
async fn synth(State(app): State<Arc<App>>, id: Identity, req: axum::extract::Request) -> Created {
    id.admin()?;
    let empty = req
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_none()
        && req
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .is_none_or(|v| v.as_bytes() == b"0");
    let body: SynthBody = if empty {
        SynthBody::default()
    } else {
        use axum::extract::FromRequest;
        let JsonBody(v, _permit) = JsonBody::from_request(req, &app).await?;
        serde_json::from_value(v).map_err(|e| Problem::invalid(format!("synth options: {e}")))?
    };
    if body.llm_cmd.is_some() {
        return Err(Problem::invalid(
            "llm_cmd: the server never runs a command a client names; run `swarm synth --llm-cmd` on the data directory",
        ));
    }
    let share_patterns = body
        .share_patterns
        .as_deref()
        .map(str::parse)
        .transpose()
        .map_err(|e: crate::error::Error| Problem::invalid(format!("share_patterns: {e}")))?;
    let embedder = app.embedder_for(id.store.user()).await?;
    let opts = SynthOptions {
        runs: (!body.runs.is_empty()).then_some(body.runs),
        pass_events_max: body
            .pass_events
            .unwrap_or(crate::synth::PASS_EVENTS_MAX_DEFAULT)
            .max(1),
        project_ids: body.project_ids,
        env_names: body.env_names,
        redact_names: body.redact_names,
        share_patterns,
        embedder: embedder.clone().map(|e| e as Arc<dyn Embedder>),
        no_model_reason: app.vectors.reason().to_string(),
        ..SynthOptions::default()
    };
    let r = id
        .call(move |s| {
            let r = s.synth(&opts, |_| {});
            if let Some(e) = &embedder {
                if let Err(err) = e.flush() {
                    tracing::warn!(error = %err, "cannot write the vector cache");
                }
            }
            r
        })
        .await?;
    Ok((StatusCode::CREATED, Json(r)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openapi_declares_every_path_parameter() {
        let doc: Value = serde_json::from_str(OPENAPI).expect("openapi.json is JSON");
        assert_eq!(doc["openapi"], "3.1.0");
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().expect("a path item") {
                assert!(
                    ["get", "post", "put"].contains(&method.as_str()),
                    "{method}"
                );
                let declared = op["parameters"].to_string();
                for p in path.split('/').filter(|s| s.starts_with('{')) {
                    let name = p.trim_matches(|c| c == '{' || c == '}');
                    assert!(
                        declared.contains(&format!("\"name\":\"{name}\""))
                            || declared.contains(&format!("parameters/{name}\"")),
                        "{method} {path}: {name} undeclared"
                    );
                }
            }
        }
    }
}
