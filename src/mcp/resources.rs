//! Resources: each run of the session's user is `swarm://runs/{run}` (its summary and its
//! latest entries, as the session's first agent may see them). A subscription to a run
//! follows it with a live tail and sends `notifications/resources/updated` whenever new
//! events become visible (a burst of events gives one notification).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures_core::Stream;
use rmcp::model::{
    ListResourcesResult, ReadResourceResult, Resource, ResourceContents, ResourceTemplate,
    ResourceUpdatedNotificationParam,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::json;

use crate::error::Error;
use crate::event::check_run_id;
use crate::mcp::session::Session;
use crate::query::options::ReadOptions;
use crate::tail::TailOptions;

/// The URI prefix of a run.
pub const RUN_URI_PREFIX: &str = "swarm://runs/";
/// Latest entries a run resource shows.
pub const RESOURCE_EVENTS_MAX: usize = 50;
/// Runs listed at most.
pub const RESOURCES_LISTED_MAX: usize = 1000;

fn mcp_error(e: Error) -> McpError {
    match e {
        Error::RunNotFound(_) => McpError::resource_not_found(e.to_string(), None),
        Error::Invalid { .. } => McpError::invalid_params(e.to_string(), None),
        other => McpError::internal_error(crate::mcp::reply::public_message(&other), None),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> crate::error::Result<T> + Send + 'static,
) -> Result<T, McpError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| McpError::internal_error(e.to_string(), None))?
        .map_err(mcp_error)
}

/// The resource subscriptions of one connection: URI → the task that watches the run.
/// Every task is stopped when the connection's handler goes (a closed, expired or
/// revoked session), not only on `resources/unsubscribe`: each holds a tail (a thread
/// and a wake-up source) until then.
pub type Watches = Arc<WatchSet>;

/// Most runs one connection watches at once.
pub const SUBSCRIPTIONS_MAX: usize = 64;

/// See [`Watches`].
#[derive(Default)]
pub struct WatchSet(Mutex<HashMap<String, tokio::task::JoinHandle<()>>>);

impl WatchSet {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, tokio::task::JoinHandle<()>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for WatchSet {
    fn drop(&mut self) {
        for (_, task) in self.lock().drain() {
            task.abort();
        }
    }
}

/// The run a URI names.
pub fn run_of(uri: &str) -> crate::error::Result<&str> {
    let run = uri.strip_prefix(RUN_URI_PREFIX).ok_or_else(|| {
        Error::invalid(
            "uri",
            format!("{uri:?} is not a run resource ({RUN_URI_PREFIX}<run>)"),
        )
    })?;
    check_run_id(run)?;
    if run.starts_with('@') {
        return Err(Error::RunNotFound(run.to_string()));
    }
    Ok(run)
}

/// The resource templates: one, the run.
pub fn templates() -> Vec<ResourceTemplate> {
    vec![ResourceTemplate::new(format!("{RUN_URI_PREFIX}{{run}}"), "run")
        .with_title("A run (one investigation) of swarm-memory")
        .with_description(
            "A run's summary and its latest entries as JSON; subscribe to be told when new entries are visible",
        )
        .with_mime_type("application/json")]
}

/// The user's runs.
pub async fn list(s: Arc<Session>) -> Result<ListResourcesResult, McpError> {
    let ids = blocking(move || s.store.run_ids()).await?;
    let items = ids
        .into_iter()
        .filter(|r| !r.starts_with('@'))
        .take(RESOURCES_LISTED_MAX)
        .map(|r| {
            Resource::new(format!("{RUN_URI_PREFIX}{r}"), r.clone())
                .with_description(format!("run {r}: its summary and latest entries"))
                .with_mime_type("application/json")
        })
        .collect();
    Ok(ListResourcesResult::with_all_items(items))
}

/// One run as JSON.
pub async fn read(s: Arc<Session>, uri: &str) -> Result<ReadResourceResult, McpError> {
    let run = run_of(uri).map_err(mcp_error)?.to_string();
    let uri = uri.to_string();
    let text = blocking(move || {
        let info = s.store.run_info(&run)?;
        let mut recent: Vec<_> = s
            .store
            .read(
                &run,
                ReadOptions {
                    last: Some(RESOURCE_EVENTS_MAX),
                    reader: Some(s.agent(None)?),
                    ..ReadOptions::default()
                },
            )?
            .collect::<crate::error::Result<_>>()?;
        // The newest that fit in `READ_BYTES_MAX` (at least one), like `read_entries`.
        let mut bytes = 0;
        let keep = recent
            .iter()
            .rev()
            .take_while(|e| {
                bytes += serde_json::to_vec(e).map_or(0, |v| v.len());
                bytes <= crate::mcp::scratch::READ_BYTES_MAX
            })
            .count()
            .max(1)
            .min(recent.len());
        recent.drain(..recent.len() - keep);
        Ok(json!({"run": info, "recent": recent}).to_string())
    })
    .await?;
    Ok(ReadResourceResult::new(vec![ResourceContents::text(
        text, uri,
    )
    .with_mime_type("application/json")]))
}

/// Starts watching a run for this connection (a second subscription to the same URI
/// replaces the first).
pub async fn subscribe(
    s: Arc<Session>,
    watches: &Watches,
    uri: String,
    context: RequestContext<RoleServer>,
) -> Result<(), McpError> {
    let run = run_of(&uri).map_err(mcp_error)?.to_string();
    {
        let w = watches.lock();
        if w.len() >= SUBSCRIPTIONS_MAX && !w.contains_key(&uri) {
            return Err(mcp_error(Error::invalid(
                "uri",
                format!("this connection watches {SUBSCRIPTIONS_MAX} runs already, the most it may; unsubscribe from one first"),
            )));
        }
    }
    // The session's agent, as `resources/read` reads: a change it may not read is not
    // announced to it (the announcement alone tells that a hidden entry was written).
    let agent = s.agent(None).map_err(mcp_error)?;
    let store = s.clone();
    let r = run.clone();
    let (stream, rules) = blocking(move || {
        // A run that does not exist is refused (as a live tail over HTTP is): a watch
        // of a name nobody writes would only hold its tail.
        let h = store.store.head_state(&r)?;
        let (head, rules) = (h.state.head_seq, h.state.rules.clone());
        let opts = TailOptions {
            from_seq: Some(head + 1),
            ..TailOptions::default()
        };
        Ok((store.store.tail(&r, opts)?.into_stream()?, rules))
    })
    .await?;
    let peer = context.peer.clone();
    let u = uri.clone();
    let task = tokio::spawn(async move {
        let mut stream = stream;
        let mut rules: crate::fold::rules::Rules = rules;
        loop {
            let next = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await;
            let mut batch = match next {
                Some(Ok(e)) => vec![e],
                Some(Err(e)) => {
                    tracing::warn!(uri = %u, error = %e, "resource watch ended");
                    return;
                }
                None => return,
            };
            // Coalesce a burst: take what is already queued, then notify once.
            while let std::task::Poll::Ready(Some(Ok(e))) = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(Pin::new(&mut stream).poll_next(cx))
            })
            .await
            {
                batch.push(e);
            }
            let mut shown = false;
            for e in &batch {
                if e.kind == crate::event::EventType::Policy {
                    // The rules as of now: a new policy applies from here on.
                    let (st, r) = (s.clone(), run.clone());
                    match blocking(move || Ok(st.store.head_state(&r)?.state.rules.clone())).await {
                        Ok(x) => rules = x,
                        Err(e) => {
                            tracing::warn!(uri = %u, error = ?e, "resource watch ended");
                            return;
                        }
                    }
                }
                shown |= rules.may_read_event(&agent, e);
            }
            if !shown {
                continue;
            }
            let note = ResourceUpdatedNotificationParam::new(u.clone());
            if peer.notify_resource_updated(note).await.is_err() {
                return; // the client is gone
            }
        }
    });
    let old = watches.lock().insert(uri, task);
    if let Some(old) = old {
        old.abort();
    }
    Ok(())
}

/// Stops watching a run.
pub fn unsubscribe(watches: &Watches, uri: &str) {
    let removed = watches.lock().remove(uri);
    if let Some(t) = removed {
        t.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection's watches end with it, not only when unsubscribed.
    #[test]
    fn watches_stop_when_their_connection_goes() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let watches: Watches = Arc::default();
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(async move {
                let _tx = tx; // dropped when the task ends
                std::future::pending::<()>().await
            });
            watches.lock().insert("swarm://runs/r".into(), task);
            drop(watches);
            let ended = tokio::time::timeout(std::time::Duration::from_secs(5), rx).await;
            assert!(
                matches!(ended, Ok(Err(_))),
                "the watch task still runs: {ended:?}"
            );
        });
    }

    #[test]
    fn run_uris_are_checked() {
        assert_eq!(run_of("swarm://runs/inc-42").ok(), Some("inc-42"));
        assert!(run_of("swarm://runs/../bob/x").is_err());
        assert!(run_of("swarm://runs/@facts").is_err());
        assert!(run_of("file:///etc/passwd").is_err());
    }
}
