//! `/mcp`: the MCP server of `swarm mcp` (every tool and resource) over streamable HTTP,
//! with the bearer token's identity (issue 14 item 1). rmcp's `StreamableHttpService`
//! speaks the protocol; this file puts the server's checks in front of it.
//!
//! Every request to `/mcp` (the `initialize`, each tool call, the SSE stream) goes
//! through [`admit`] first: no valid token → 401, a reader token → 403, too many live MCP
//! sessions → 503, all before rmcp reads a byte of the body. An admitted request carries
//! the token's [`Session`] (its user's store, its agents) in its HTTP extensions; rmcp
//! hands the request's parts to the handler, where [`TokenAuthority`] finds it. So the
//! identity of a call is the token of *that* request, not of the one that opened the MCP
//! session.
//!
//! **Invariant:** a tool call reaches only the store of its request's token's user and
//! acts only as the token's agents (checked by `Session::agent`).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequestParts, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, SessionConfig};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::embed::Embedder;
use crate::error::{Error, Result};
use crate::mcp::server::SwarmMcp;
use crate::mcp::session::{Authority, Session};
use crate::serve::app::App;
use crate::serve::extract::Identity;
use crate::serve::problem::Problem;
use crate::serve::token::Role;

/// Live MCP sessions at most (each holds a task and a channel); a new one past it is
/// refused with 503 until one ends or idles out.
pub const MCP_SESSIONS_MAX: usize = 1_000;
/// Live MCP sessions one token may hold at most, so that one tenant cannot take every
/// session of the server (past it: 429 until one of its sessions ends or idles out).
pub const MCP_SESSIONS_PER_TOKEN: usize = 64;
/// An MCP session with no request for this long is closed (the client re-initializes).
pub const MCP_SESSION_IDLE: Duration = Duration::from_secs(600);

/// What [`admit`] needs: the server's state and the live sessions.
#[derive(Clone)]
struct Gate {
    app: Arc<App>,
    sessions: Arc<LocalSessionManager>,
    /// The token that opened each session: a session answers no other token (another
    /// user's token with a leaked session id must not join its stream or end it).
    owners: Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>,
}

/// The `/mcp` route.
pub fn router(app: Arc<App>) -> Router {
    let mut sessions = LocalSessionManager::default();
    sessions.session_config = {
        let mut c = SessionConfig::default();
        c.keep_alive = Some(MCP_SESSION_IDLE);
        c
    };
    let sessions = Arc::new(sessions);
    // Host checks guard a token-less local server against DNS rebinding; here every
    // request needs a bearer token a rebound page cannot send, and the server may listen
    // on any address.
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .with_max_request_body_bytes(
            usize::try_from(app.opts.body_limit_bytes).unwrap_or(usize::MAX),
        )
        .with_sse_keep_alive(Some(app.opts.heartbeat));
    // At shutdown, end the MCP sessions and their streams (the graceful shutdown waits
    // for open connections).
    let cancel = config.cancellation_token.clone();
    let mut stop = app.shutdown.clone();
    tokio::spawn(async move {
        let _ = stop.wait_for(|s| *s).await;
        cancel.cancel();
    });
    let service = StreamableHttpService::new(
        || Ok(SwarmMcp::new(Arc::new(TokenAuthority))),
        sessions.clone(),
        config,
    );
    let gate = Gate {
        app,
        sessions,
        owners: Default::default(),
    };
    tokio::spawn(end_revoked_sessions(gate.clone()));
    Router::new()
        .route_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(gate, admit))
}

/// Closes, once a second, every MCP session whose token was revoked (or left the tokens
/// file): its open stream ends, and with it the resource updates it was sent. (Its
/// requests are refused from the revocation on by [`admit`]; a stream opened before it
/// would otherwise run until the client leaves.) Forgets the owners of sessions rmcp
/// closed. Ends at the server's shutdown.
async fn end_revoked_sessions(g: Gate) {
    use rmcp::transport::streamable_http_server::session::SessionManager;
    let mut stop = g.app.shutdown.clone();
    let mut tick = tokio::time::interval(crate::serve::token::TokenSet::RECHECK_MIN);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let owned: Vec<(String, String)> = g
            .owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(s, t)| (s.clone(), t.clone()))
            .collect();
        if owned.is_empty() {
            continue;
        }
        let app = g.app.clone();
        let tokens: std::collections::HashSet<String> =
            owned.iter().map(|(_, t)| t.clone()).collect();
        // (`is_live` may re-read the tokens file.)
        let dead = tokio::task::spawn_blocking(move || {
            tokens
                .into_iter()
                .filter(|t| !app.tokens.is_live(t))
                .collect::<std::collections::HashSet<String>>()
        })
        .await
        .unwrap_or_default();
        let live: Vec<rmcp::transport::common::server_side_http::SessionId> =
            g.sessions.sessions.read().await.keys().cloned().collect();
        for (sid, token) in owned {
            let open = live.iter().find(|k| k.as_ref() == sid.as_str());
            if dead.contains(&token) {
                if let Some(id) = open {
                    if let Err(e) = g.sessions.close_session(id).await {
                        tracing::warn!(error = %e, "cannot close the MCP session of a revoked token");
                    } else {
                        tracing::info!(token = %token, "MCP session of a revoked token closed");
                    }
                }
            } else if open.is_some() {
                continue;
            }
            g.owners
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&sid);
        }
    }
}

/// The server's checks before rmcp sees the request (see the module's doc).
async fn admit(State(g): State<Gate>, req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    let id = match Identity::from_request_parts(&mut parts, &g.app).await {
        Ok(id) => id,
        Err(p) => return p.into_response(),
    };
    if !id.token.role.may_write() {
        return Problem::forbidden(format!(
            "token {} has the reader role; the MCP tools need an agent or admin token",
            id.token.id
        ))
        .into_response();
    }
    let sid = parts
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(sid) = &sid {
        let owner = g
            .owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(sid)
            .cloned();
        if owner.is_some_and(|o| o != id.token.id) {
            // What rmcp answers for a session it does not know: nothing is confirmed.
            return (
                axum::http::StatusCode::NOT_FOUND,
                "Not Found: Session not found",
            )
                .into_response();
        }
    }
    let opens_session = sid.is_none();
    if opens_session && g.sessions.sessions.read().await.len() >= MCP_SESSIONS_MAX {
        return Problem::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "mcp_sessions_full",
            "Too many MCP sessions",
            format!("{MCP_SESSIONS_MAX} MCP sessions are open; retry when one ends"),
        )
        .into_response();
    }
    if opens_session {
        let live: std::collections::HashSet<String> = g
            .sessions
            .sessions
            .read()
            .await
            .keys()
            .map(|k| k.to_string())
            .collect();
        let mut owners = g.owners.lock().unwrap_or_else(|e| e.into_inner());
        // Sessions rmcp closed (idle, ended) leave the map here.
        owners.retain(|s, _| live.contains(s));
        let mine = owners.values().filter(|t| **t == id.token.id).count();
        if mine >= MCP_SESSIONS_PER_TOKEN {
            return Problem::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                "mcp_sessions_per_token",
                "Too many MCP sessions for this token",
                format!(
                    "token {} holds {MCP_SESSIONS_PER_TOKEN} MCP sessions; end one (DELETE) or let one idle out",
                    id.token.id
                ),
            )
            .into_response();
        }
    }
    // search_memory ranks with the server's model through the user's own vector cache.
    let embedder = match g.app.embedder_for(id.store.user()).await {
        Ok(e) => e.map(|c| c as Arc<dyn Embedder>),
        Err(p) => return p.into_response(),
    };
    let session = match Session::new(id.store, id.token.agents.clone()) {
        Ok(s) => Arc::new(
            s.with_model(embedder, g.app.vectors.reason().to_string())
                .with_admin(id.token.role == Role::Admin),
        ),
        Err(e) => return Problem::from(e).into_response(),
    };
    parts.extensions.insert(session);
    let closes_session = parts.method == axum::http::Method::DELETE;
    let token_id = id.token.id.clone();
    let mut res = next.run(Request::from_parts(parts, body)).await;
    if opens_session {
        if let Some(new) = res
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        {
            // (Sessions rmcp closed left the map when this one was admitted.)
            g.owners
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(new.to_string(), token_id);
        }
    } else if closes_session && res.status().is_success() {
        if let Some(sid) = &sid {
            g.owners
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(sid);
        }
    }
    // rmcp answers a session's DELETE with 202; the MCP SDKs take 200 or 204 for "ended"
    // (the Python SDK logs "Session termination failed: 202" otherwise).
    if closes_session && res.status() == axum::http::StatusCode::ACCEPTED {
        *res.status_mut() = axum::http::StatusCode::NO_CONTENT;
        *res.body_mut() = axum::body::Body::empty();
    }
    res
}

/// The session of an MCP request: the one [`admit`] put in its HTTP request's
/// extensions (rmcp passes the request's parts on in the MCP request's extensions).
struct TokenAuthority;

impl Authority for TokenAuthority {
    fn session(&self, extensions: &rmcp::model::Extensions) -> Result<Arc<Session>> {
        extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.extensions.get::<Arc<Session>>())
            .cloned()
            .ok_or_else(|| Error::Forbidden("this request carries no token identity".into()))
    }
}
