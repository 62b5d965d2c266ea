//! What a handler gets from a request, each checked before any library call: the caller's
//! identity (bearer token → user, agents, role, and that user's `Store`), the agent a read
//! ([`Reading`], `?as=AGENT`) or a write ([`Act`], the body's `agent`) is made as, a JSON
//! body (content type, size and nesting limits) and query parameters (unknown ones
//! refused). Every refusal is a [`Problem`].

use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::{header, request::Parts, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::JSON_DEPTH_MAX;
use crate::serve::app::{blocking, App};
use crate::serve::problem::Problem;
use crate::serve::token::{Role, TokenRecord};
use crate::store::Store;

/// The caller: its token's record and the store of the token's user.
pub struct Identity {
    /// The token's record (never its secret).
    pub token: TokenRecord,
    /// The store acting for the token's user.
    pub store: Arc<Store>,
}

impl Identity {
    /// Runs a library call on the store of the token's user, on a blocking thread.
    pub async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> crate::error::Result<T> + Send + 'static,
    ) -> Result<T, Problem> {
        let store = self.store.clone();
        blocking(move || f(&store)).await
    }

    /// Refuses (403) unless the token may write and may act as `agent`.
    pub fn write_as(&self, agent: &str) -> Result<(), Problem> {
        self.may_write()?;
        self.act_as(agent)
    }

    /// Refuses (403) a reader token, which writes nothing: asked before a write's body
    /// is read and parsed (a parsed body takes many times its size).
    pub fn may_write(&self) -> Result<(), Problem> {
        if self.token.role.may_write() {
            return Ok(());
        }
        Err(Problem::forbidden(format!(
            "token {} has the reader role: it cannot write",
            self.token.id
        )))
    }

    /// Refuses (403) unless the token may act as `agent`.
    pub fn act_as(&self, agent: &str) -> Result<(), Problem> {
        if self.token.owns_agent(agent) {
            return Ok(());
        }
        Err(Problem::forbidden(format!(
            "token {} may not act as agent {agent:?}",
            self.token.id
        )))
    }

    /// Refuses (403) unless the token is an admin's.
    pub fn admin(&self) -> Result<(), Problem> {
        if self.token.role == Role::Admin {
            return Ok(());
        }
        Err(Problem::forbidden(format!(
            "token {} is not an admin token",
            self.token.id
        )))
    }

    /// The agent a read is made as, so that the run's policy filters it: `as` when given
    /// (the token must own it), else the token's only agent. An admin token that names
    /// none reads unfiltered (`None`); any other token must name one when it owns several.
    pub fn reader(&self, as_agent: Option<String>) -> Result<Option<String>, Problem> {
        if let Some(a) = as_agent {
            crate::event::check_id("as", &a)?;
            self.act_as(&a)?;
            return Ok(Some(a));
        }
        if let Some(a) = self.token.sole_agent() {
            return Ok(Some(a.to_string()));
        }
        if self.token.role == Role::Admin {
            return Ok(None);
        }
        Err(Problem::invalid(
            "as: the token acts as several agents; name the one this read is made as (?as=AGENT; in the CLI, --as-agent, or --agent where the command names its agent)",
        ))
    }
}

/// The token of an `Authorization` value `Bearer TOKEN` (the scheme in any case, as
/// RFC 9110 11.1 has it).
fn bearer(v: &str) -> Option<&str> {
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

impl FromRequestParts<Arc<App>> for Identity {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, Problem> {
        let mut values = parts.headers.get_all(header::AUTHORIZATION).iter();
        let value = values
            .next()
            .ok_or_else(|| Problem::unauthorized("no Authorization header (Bearer token)"))?;
        // Which of two tokens acts must not depend on the headers' order (a proxy that
        // adds one).
        if values.next().is_some() {
            return Err(Problem::invalid(
                "Authorization: the request carries more than one; send exactly one",
            ));
        }
        let presented = value.to_str().ok().and_then(bearer).ok_or_else(|| {
            Problem::unauthorized("the Authorization header is not `Bearer TOKEN`")
        })?;
        let token = app
            .tokens
            .check(presented)
            .ok_or_else(|| Problem::unauthorized("the token is unknown or revoked"))?;
        app.admit(&token.id)?;
        // The engine's own logs (`@facts`, `@patterns`) are drawn past every run's read
        // policy: to any token but an admin's they do not exist (404, as another user's
        // run), whatever the route. (The library refuses reads of them made as an agent
        // too: `Store::read` and the views.)
        if token.role != Role::Admin {
            if let Some(run) = engine_run_in_path(parts.uri.path()) {
                return Err(Problem::from(crate::error::Error::RunNotFound(run)));
            }
        }
        let store = app.store_for(&token.user)?;
        Ok(Identity { token, store })
    }
}

/// The run of a `/v1/runs/{run}...` path when it is one of the engine's own logs (its
/// name, percent-decoded, starts with `@`).
fn engine_run_in_path(path: &str) -> Option<String> {
    let rest = path.strip_prefix("/v1/runs/")?;
    let segment = rest.split('/').next().unwrap_or("");
    let decoded = percent_encoding::percent_decode_str(segment).decode_utf8_lossy();
    decoded.starts_with('@').then(|| decoded.into_owned())
}

/// Query parameters as `T` (`T` should deny unknown fields, so that a typo is a 400
/// rather than a filter silently not applied). `as` is left out: [`Reading`] takes it.
pub struct Q<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Q<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Problem> {
        let rest: Vec<&str> = parts
            .uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty() && *p != "as" && !p.starts_with("as="))
            .collect();
        let uri: Uri = format!("/?{}", rest.join("&"))
            .parse()
            .map_err(|_| Problem::invalid("query: not a valid query string"))?;
        match Query::<T>::try_from_uri(&uri) {
            Ok(Query(t)) => Ok(Q(t)),
            Err(e) => {
                let text = e.body_text();
                // (`as` was taken out before: the list serde gives leaves it out.)
                let also = if text.contains("unknown field") {
                    "; `as` (the agent to act as) is taken too"
                } else {
                    ""
                };
                Err(Problem::invalid(format!("query: {text}{also}")))
            }
        }
    }
}

/// Query parameters that take none but `as`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// The `as` query parameter alone (the others are `Q`'s).
#[derive(Deserialize)]
struct AsParam {
    #[serde(rename = "as")]
    agent: Option<String>,
}

/// A read made as an agent: the caller, and the agent whose read permissions the run's
/// policy applies (`?as=AGENT`, else the token's only agent; see [`Identity::reader`]).
pub struct Reading {
    /// The caller.
    pub id: Identity,
    /// The agent the read is made as (`None`: an admin token reading unfiltered).
    pub reader: Option<String>,
}

impl FromRequestParts<Arc<App>> for Reading {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, Problem> {
        let id = Identity::from_request_parts(parts, app).await?;
        let agent = Query::<AsParam>::try_from_uri(&parts.uri)
            .map_err(|e| Problem::invalid(format!("query: {}", e.body_text())))?
            .0
            .agent;
        let reader = id.reader(agent)?;
        Ok(Reading { id, reader })
    }
}

impl Reading {
    /// Runs `f` (given the reader) on a blocking thread and answers `{key: result}`.
    pub async fn view<T: Serialize + Send + 'static>(
        self,
        key: &'static str,
        f: impl FnOnce(&Store, Option<&str>) -> crate::error::Result<T> + Send + 'static,
    ) -> Result<Response, Problem> {
        let reader = self.reader;
        let out = self.id.call(move |s| f(s, reader.as_deref())).await?;
        Ok(Json(Keyed(key, out)).into_response())
    }
}

/// `{key: value}`, serialized as it is: the value's fields keep their declared order
/// (`json!` would sort them).
pub struct Keyed<T>(pub &'static str, pub T);

impl<T: Serialize> Serialize for Keyed<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry(self.0, &self.1)?;
        m.end()
    }
}

/// A write made as an agent: the JSON body's `agent` member names it (the token must own
/// it and may write: else 403, nothing written), the rest of the body is `B`.
pub struct Act<B> {
    /// The caller.
    pub id: Identity,
    /// The agent the write is made as.
    pub agent: String,
    /// The rest of the body.
    pub body: B,
    /// The body's share of the server's body budget, held until the answer.
    pub permit: BodyPermit,
}

impl<B: DeserializeOwned + Send> FromRequest<Arc<App>> for Act<B> {
    type Rejection = Problem;

    async fn from_request(req: Request, app: &Arc<App>) -> Result<Self, Problem> {
        // The token first: a caller without one never gets its body read.
        let (mut parts, body) = req.into_parts();
        let id = Identity::from_request_parts(&mut parts, app).await?;
        id.may_write()?;
        let JsonBody(v, permit) =
            JsonBody::from_request(Request::from_parts(parts, body), app).await?;
        let Value::Object(mut m) = v else {
            return Err(Problem::invalid("the body must be a JSON object"));
        };
        let Some(Value::String(agent)) = m.remove("agent") else {
            return Err(Problem::invalid(
                "agent: the body must name the agent it acts as (a string)",
            ));
        };
        id.write_as(&agent)?;
        let body = serde_json::from_value(Value::Object(m))
            .map_err(|e| Problem::invalid(format!("body: {e}")))?;
        Ok(Act {
            id,
            agent,
            body,
            permit,
        })
    }
}

impl<B: Send + 'static> Act<B> {
    /// Runs the library call (given the store, the agent and the body) on a blocking
    /// thread.
    pub async fn call<T: Send + 'static>(
        self,
        f: impl FnOnce(&Store, &str, B) -> crate::error::Result<T> + Send + 'static,
    ) -> Result<T, Problem> {
        let (agent, body, permit) = (self.agent, self.body, self.permit);
        // The share goes with the body into the library call: a request given up (a
        // timeout, a client gone) does not free it while the call still holds the body.
        self.id
            .call(move |s| {
                let _permit = permit;
                f(s, &agent, body)
            })
            .await
    }

    /// [`Act::call`], answered 201 with its result.
    pub async fn created<T: Serialize + Send + 'static>(
        self,
        f: impl FnOnce(&Store, &str, B) -> crate::error::Result<T> + Send + 'static,
    ) -> Result<Response, Problem> {
        let out = self.call(f).await?;
        Ok((StatusCode::CREATED, Json(out)).into_response())
    }
}

/// A JSON request body: `Content-Type: application/json` (else 415), at most the
/// server's body limit (else 413, read no further), nested at most a little deeper than
/// the events' own limit (else 400), and well-formed (else 400).
pub struct JsonBody(pub Value, pub BodyPermit);

/// The share of the server's body budget a request holds: the bytes of its body received
/// so far (in KiB), taken as they arrive (a client that declares a size and sends nothing
/// holds nothing) and given back when this is dropped; keep it with the body's value.
pub struct BodyPermit {
    budget: Arc<tokio::sync::Semaphore>,
    kib: u32,
    limit: u64,
}

impl BodyPermit {
    /// An empty share of `app`'s budget.
    pub(crate) fn new(app: &App) -> BodyPermit {
        BodyPermit {
            budget: app.body_budget.clone(),
            kib: 0,
            limit: app.opts.body_budget_bytes,
        }
    }

    /// Holds `bytes` in all (more or fewer than before); `Err` (503 `busy`) when the
    /// budget has not that much left (what was held stays held).
    pub(crate) fn hold(&mut self, bytes: usize) -> Result<(), Problem> {
        let want = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
        if want > self.kib {
            let more = self
                .budget
                .try_acquire_many(want - self.kib)
                .map_err(|_| Problem::bodies_busy(self.limit))?;
            more.forget();
        } else {
            self.budget.add_permits((self.kib - want) as usize);
        }
        self.kib = want;
        Ok(())
    }
}

impl Drop for BodyPermit {
    fn drop(&mut self) {
        self.budget.add_permits(self.kib as usize);
    }
}

impl FromRequest<Arc<App>> for JsonBody {
    type Rejection = Problem;

    async fn from_request(req: Request, app: &Arc<App>) -> Result<Self, Problem> {
        let ct = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let mime = ct.split(';').next().unwrap_or("").trim();
        if !mime.eq_ignore_ascii_case("application/json") {
            return Err(Problem::unsupported_media(format!(
                "the body must be application/json, not {:?}",
                ct
            )));
        }
        let limit = app.opts.body_limit_bytes;
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit) {
            return Err(Problem::too_large(limit));
        }
        // Its share of the budget grows with the bytes received.
        let mut permit = BodyPermit::new(app);
        let max = usize::try_from(limit).unwrap_or(usize::MAX);
        let mut body = req.into_body();
        let mut bytes = Vec::new();
        while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
            let frame = match frame {
                Ok(f) => f,
                Err(e) => return Err(Problem::invalid(format!("cannot read the body: {e}"))),
            };
            if let Ok(chunk) = frame.into_data() {
                if bytes.len() + chunk.len() > max {
                    return Err(Problem::too_large(limit));
                }
                permit.hold(bytes.len() + chunk.len())?;
                bytes.extend_from_slice(&chunk);
            }
        }
        check_depth(&bytes, BODY_DEPTH_MAX)?;
        let v = serde_json::from_slice(&bytes)
            .map_err(|e| Problem::invalid(format!("the body is not JSON: {e}")))?;
        Ok(JsonBody(v, permit))
    }
}

/// Nesting allowed in a body: an event's content or meta (`JSON_DEPTH_MAX`) inside an
/// event object inside a batch array.
pub(crate) const BODY_DEPTH_MAX: usize = JSON_DEPTH_MAX + 2;

/// Refuses JSON nested deeper than `max` before it is parsed (one pass over the bytes,
/// skipping strings), so a deep body costs no recursion.
pub(crate) fn check_depth(bytes: &[u8], max: usize) -> Result<(), Problem> {
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    for &b in bytes {
        if in_str {
            match (esc, b) {
                (true, _) => esc = false,
                (false, b'\\') => esc = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return Err(Problem::invalid(format!(
                        "the body is nested deeper than {max} levels"
                    )));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_only_outside_strings() {
        assert!(check_depth(br#"[[{"a":"[[[[[["}]]"#, 3).is_ok());
        assert!(check_depth(br#"[[[["#, 3).is_err());
        assert!(check_depth(br#"{"a":"\"[[[[[[[["}"#, 1).is_ok());
    }
}
