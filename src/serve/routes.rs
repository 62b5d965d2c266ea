//! The routes of `/v1`, `/healthz` and `/readyz`. Each handler checks the token's limits
//! (its agents, its role), then makes one library call on a blocking thread (the engine's
//! calls do file I/O and may wait on locks and fsyncs) and returns its result as JSON.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::event::ts::Ts;
use crate::event::{Event, EventType, NewEvent};
use crate::fold::replay::Target;
use crate::fold::rules::{ChannelDecl, ChannelKind, ConflictPolicy, Policy};
use crate::fold::summary::Builtin;
use crate::log::meta::Durability;
use crate::query::options::ReadOptions;
use crate::serve::app::{blocking, App};
use crate::serve::extract::{Identity, JsonBody, Q};
use crate::serve::problem::Problem;
use crate::serve::sse;
use crate::store::Store;

/// A list of events, in stored field order (through `json!` they would be re-sorted).
#[derive(Serialize)]
struct Events {
    events: Vec<Event>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_from_seq: Option<Option<u64>>,
}

/// Events one `GET .../events` returns at most; `next_from_seq` says where to go on.
pub const READ_PAGE_EVENTS_MAX: usize = 10_000;

/// The whole API.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/runs", get(runs))
        .route("/v1/runs/{run}", get(run_info))
        .route("/v1/runs/{run}/events", get(read).post(append))
        .route("/v1/runs/{run}/verify", get(verify))
        .route("/v1/runs/{run}/board", get(board))
        .route("/v1/runs/{run}/pick", post(pick))
        .route("/v1/runs/{run}/escalations", get(escalations))
        .route("/v1/runs/{run}/escalations/{seq}/resolve", post(resolve))
        .route(
            "/v1/runs/{run}/channels",
            get(channels).post(declare_channel),
        )
        .route(
            "/v1/runs/{run}/channels/{channel}",
            get(channel).post(write_channel),
        )
        .route("/v1/runs/{run}/policy", get(policy).put(set_policy))
        .route("/v1/runs/{run}/context", get(context))
        .route("/v1/runs/{run}/prune", post(prune))
        .route("/v1/runs/{run}/replay", get(replay))
        .fallback(|| async { Problem::not_found("no such route") })
        .with_state(app)
}

/// Deserializes a body value, naming what is wrong.
fn from_body<T: serde::de::DeserializeOwned>(what: &str, v: Value) -> Result<T, Problem> {
    serde_json::from_value(v).map_err(|e| Problem::invalid(format!("{what}: {e}")))
}

/// The steps every write route shares: the body as `B`, the token may write as the agent
/// `B` names, the library call on a blocking thread, 201 with its result.
async fn write<B, T>(
    id: Identity,
    what: &str,
    body: Value,
    agent: fn(&B) -> &str,
    call: impl FnOnce(&Store, B) -> crate::error::Result<T> + Send + 'static,
) -> Result<Response, Problem>
where
    B: DeserializeOwned + Send + 'static,
    T: Serialize + Send + 'static,
{
    let b: B = from_body(what, body)?;
    id.write_as(agent(&b))?;
    let store = id.store;
    let out = blocking(move || call(&store, b)).await?;
    Ok((StatusCode::CREATED, Json(out)).into_response())
}

fn parse_ts(field: &str, s: Option<String>) -> Result<Option<Ts>, Problem> {
    match s {
        None => Ok(None),
        Some(s) => Ts::parse(&s)
            .map(Some)
            .ok_or_else(|| Problem::invalid(format!("{field}: {s:?} is not an RFC 3339 time"))),
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

async fn runs(id: Identity) -> Result<Json<Value>, Problem> {
    let store = id.store;
    let infos = blocking(move || {
        store
            .run_ids()?
            .iter()
            .map(|r| store.run_info(r))
            .collect::<crate::error::Result<Vec<_>>>()
    })
    .await?;
    Ok(Json(json!({ "runs": infos })))
}

async fn run_info(id: Identity, Path(run): Path<String>) -> Result<Json<Value>, Problem> {
    let store = id.store;
    let info = blocking(move || store.run_info(&run)).await?;
    Ok(Json(json!(info)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendQuery {
    expect_seq: Option<u64>,
    durability: Option<String>,
}

/// `POST /v1/runs/{run}/events`: one event object, or an array appended as one atomic
/// batch. `expect_seq` (query, or the first event's own) makes it a compare-and-swap on
/// the run's last seq (412 when it moved). Answers 201 with every stored event, the
/// engine's own included (an escalation the append caused).
async fn append(
    id: Identity,
    Path(run): Path<String>,
    Q(q): Q<AppendQuery>,
    JsonBody(body): JsonBody,
) -> Result<Response, Problem> {
    let durability: Durability = match q.durability.as_deref() {
        None => Durability::Sync,
        Some(d) => d
            .parse()
            .map_err(|e: crate::error::Error| Problem::from(e))?,
    };
    let events: Vec<NewEvent> = match body {
        Value::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| from_body(&format!("[{i}]"), v))
            .collect::<Result<_, _>>()?,
        v @ Value::Object(_) => vec![from_body("event", v)?],
        _ => {
            return Err(Problem::invalid(
                "the body must be an event object or an array of them",
            ))
        }
    };
    for e in &events {
        id.write_as(&e.agent_id)?;
        if e.user_id.as_ref().is_some_and(|u| *u != id.token.user) {
            return Err(Problem::forbidden(
                "an event names another user than the token's",
            ));
        }
    }
    let expect = q
        .expect_seq
        .or_else(|| events.first().and_then(|e| e.expect_seq));
    let store = id.store;
    let stored = blocking(move || store.append_batch(&run, events, expect, durability)).await?;
    Ok((
        StatusCode::CREATED,
        Json(Events {
            events: stored,
            next_from_seq: None,
        }),
    )
        .into_response())
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
    #[serde(rename = "as")]
    as_agent: Option<String>,
    follow: Option<String>,
}

/// `GET /v1/runs/{run}/events`: every filter of `swarm read`, as the token's agent (the
/// run's policy filters what it sees). At most [`READ_PAGE_EVENTS_MAX`] events;
/// `next_from_seq` names the next page. With `follow=1`, a live tail over SSE.
async fn read(
    State(app): State<Arc<App>>,
    id: Identity,
    Path(run): Path<String>,
    headers: HeaderMap,
    Q(q): Q<ReadQuery>,
) -> Result<Response, Problem> {
    let follow = match q.follow.as_deref() {
        None | Some("0") | Some("false") => false,
        Some("1") | Some("true") => true,
        Some(f) => return Err(Problem::invalid(format!("follow: {f:?} is not 1 or 0"))),
    };
    let reader = id.reader(q.as_agent)?;
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
            from_seq,
            agent: q.agent,
            kind,
            subject: q.subject,
            reader,
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
        last: q.last,
        // One more than the page, to learn whether there is a next one.
        limit: Some(page + 1),
        reader,
        ..ReadOptions::default()
    };
    let store = id.store;
    let mut events = blocking(move || {
        store
            .read(&run, opts)?
            .collect::<crate::error::Result<Vec<_>>>()
    })
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

async fn verify(id: Identity, Path(run): Path<String>) -> Result<Json<Value>, Problem> {
    let store = id.store;
    let report = blocking(move || store.verify(&run, |_| {})).await?;
    Ok(Json(json!(report)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AsQuery {
    #[serde(rename = "as")]
    as_agent: Option<String>,
    subject: Option<String>,
}

async fn board(
    id: Identity,
    Path(run): Path<String>,
    Q(q): Q<AsQuery>,
) -> Result<Json<Value>, Problem> {
    let reader = id.reader(q.as_agent)?;
    let store = id.store;
    let b = blocking(move || store.board(&run, reader.as_deref(), q.subject.as_deref())).await?;
    Ok(Json(json!({ "board": b })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PickBody {
    subject: String,
    agent: String,
}

/// `POST .../pick`: 201 with the decision, or 423 with the escalation a tie caused.
async fn pick(
    id: Identity,
    Path(run): Path<String>,
    JsonBody(b): JsonBody,
) -> Result<Response, Problem> {
    let b: PickBody = from_body("pick", b)?;
    id.write_as(&b.agent)?;
    let store = id.store;
    let r = blocking(move || store.pick(&run, &b.agent, &b.subject)).await?;
    let status = match r {
        crate::scratchpad::board::PickOutcome::Picked { .. } => StatusCode::CREATED,
        crate::scratchpad::board::PickOutcome::Escalated { .. } => StatusCode::LOCKED,
    };
    Ok((status, Json(json!(r))).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AllQuery {
    #[serde(default)]
    all: bool,
}

async fn escalations(
    id: Identity,
    Path(run): Path<String>,
    Q(q): Q<AllQuery>,
) -> Result<Json<Value>, Problem> {
    let store = id.store;
    let e = blocking(move || store.escalations(&run, q.all)).await?;
    Ok(Json(json!({ "escalations": e })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    by: String,
    note: String,
    winner: Option<u64>,
}

async fn resolve(
    id: Identity,
    Path((run, seq)): Path<(String, u64)>,
    JsonBody(b): JsonBody,
) -> Result<Response, Problem> {
    write(
        id,
        "resolve",
        b,
        |b: &ResolveBody| &b.by,
        move |s, b| s.resolve(&run, &b.by, seq, b.winner, &b.note),
    )
    .await
}

async fn channels(
    id: Identity,
    Path(run): Path<String>,
    Q(q): Q<AsQuery>,
) -> Result<Json<Value>, Problem> {
    let reader = id.reader(q.as_agent)?;
    let store = id.store;
    let c = blocking(move || store.channels(&run, reader.as_deref())).await?;
    Ok(Json(json!({ "channels": c })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeclareBody {
    agent: String,
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

async fn declare_channel(
    id: Identity,
    Path(run): Path<String>,
    JsonBody(b): JsonBody,
) -> Result<Response, Problem> {
    write(
        id,
        "channel",
        b,
        |b: &DeclareBody| &b.agent,
        move |s, b| {
            let decl = ChannelDecl {
                channel: b.channel,
                kind: b.kind,
                on_conflict: b.on_conflict,
                max_size_kb: b.max_size_kb,
            };
            s.declare_channel(&run, &b.agent, &decl)
        },
    )
    .await
}

async fn channel(
    id: Identity,
    Path((run, name)): Path<(String, String)>,
    Q(q): Q<AsQuery>,
) -> Result<Json<Value>, Problem> {
    let reader = id.reader(q.as_agent)?;
    let store = id.store;
    let n = name.clone();
    let c = blocking(move || store.channel(&run, reader.as_deref(), &n)).await?;
    Ok(Json(json!({
        "channel": name, "kind": c.decl.kind, "on_conflict": c.decl.on_conflict,
        "version": c.version, "value": c.value, "writes": c.history.len(),
        "conflicts": c.conflicts.len(),
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteBody {
    agent: String,
    value: Value,
    base_version: Option<u64>,
}

async fn write_channel(
    id: Identity,
    Path((run, name)): Path<(String, String)>,
    JsonBody(b): JsonBody,
) -> Result<Response, Problem> {
    write(
        id,
        "channel write",
        b,
        |b: &WriteBody| &b.agent,
        move |s, b| s.write_channel(&run, &b.agent, &name, b.value, b.base_version),
    )
    .await
}

async fn policy(id: Identity, Path(run): Path<String>) -> Result<Json<Value>, Problem> {
    let store = id.store;
    let p = blocking(move || store.policy(&run)).await?;
    Ok(Json(json!({ "policy": p })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyBody {
    agent: String,
    policy: Policy,
}

async fn set_policy(
    id: Identity,
    Path(run): Path<String>,
    JsonBody(b): JsonBody,
) -> Result<Response, Problem> {
    write(
        id,
        "policy",
        b,
        |b: &PolicyBody| &b.agent,
        move |s, b| s.set_policy(&run, &b.agent, &b.policy),
    )
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ContextQuery {
    #[serde(rename = "as")]
    as_agent: Option<String>,
    budget_bytes: usize,
}

/// `GET .../context?budget_bytes=N`: the prompt context of the token's agent (its read
/// permissions apply), never over the budget.
async fn context(
    id: Identity,
    Path(run): Path<String>,
    Q(q): Q<ContextQuery>,
) -> Result<Json<Value>, Problem> {
    let agent = match id.reader(q.as_agent)? {
        Some(a) => a,
        None => {
            return Err(Problem::invalid(
                "as: a context is an agent's; name the agent (?as=AGENT)",
            ))
        }
    };
    let store = id.store;
    let c = blocking(move || store.context(&run, &agent, q.budget_bytes)).await?;
    Ok(Json(json!(c)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PruneBody {
    agent: String,
    #[serde(default)]
    force: bool,
}

/// `POST .../prune`: with the built-in summariser only (a summariser command would let
/// a client run programs on the server).
async fn prune(
    id: Identity,
    Path(run): Path<String>,
    JsonBody(b): JsonBody,
) -> Result<Response, Problem> {
    let b: PruneBody = from_body("prune", b)?;
    id.write_as(&b.agent)?;
    let store = id.store;
    let r = blocking(move || store.prune(&run, &b.agent, &Builtin, b.force)).await?;
    Ok(match r {
        Some(e) => (StatusCode::CREATED, Json(e)).into_response(),
        None => {
            Json(json!({"pruned": false, "reason": "working view under the threshold (or empty)"}))
                .into_response()
        }
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayQuery {
    at_seq: Option<u64>,
    at: Option<String>,
}

/// `GET .../replay?at_seq=N|at=T`: the run's whole state at a point. Admin tokens only
/// for now: the state holds every subject's entries, which a run's read policy may hide
/// from an agent.
async fn replay(
    id: Identity,
    Path(run): Path<String>,
    Q(q): Q<ReplayQuery>,
) -> Result<Json<Value>, Problem> {
    id.admin()?;
    let target = match (q.at_seq, parse_ts("at", q.at)?) {
        (Some(_), Some(_)) => return Err(Problem::invalid("give at_seq or at, not both")),
        (Some(s), None) => Target::Seq(s),
        (None, Some(t)) => Target::Time(t),
        (None, None) => Target::Head,
    };
    let store = id.store;
    let r = blocking(move || store.state_at(&run, target, |_| {})).await?;
    Ok(Json(json!({"replay": r.stats, "state": r.state})))
}
