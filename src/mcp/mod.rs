//! The MCP server (issue 14, feature `mcp`): seed 002's memory tools and the scratchpad
//! as tools any agent framework can call, and each run as a resource, over the official
//! Rust SDK (`rmcp`).
//!
//! - `session.rs`: who a call acts as ([`session::Session`]) and where that comes from
//!   ([`session::Authority`]: fixed flags for stdio, a token for HTTP later).
//! - `server.rs`: [`SwarmMcp`], the handler: sessions, blocking calls, resources.
//! - `args.rs`: the tools' arguments (their JSON Schemas are the tools' input schemas).
//! - `tools.rs`: the tool catalogue: names, descriptions, arguments, functions.
//! - `scratch.rs`: the scratchpad tools; `memory.rs`: seed 002's memory tools (plain
//!   functions of a session and their arguments).
//! - `search_memory` calls the library's search (`crate::synth::search`).
//! - `anti.rs`: agent anti-patterns over tracked tool calls (pure).
//! - `resources.rs`: `swarm://runs/{run}` and its subscriptions.
//! - `reply.rs`: tool results and the tool errors that name their cause.
//!
//! Mounting on HTTP (the `serve` layer, issue 13): the tool layer is transport-free. The
//! server builds `SwarmMcp::new(authority)` per MCP session with an [`session::Authority`]
//! that maps the request's bearer token (rmcp puts the HTTP request parts in the
//! request's extensions) to a [`session::Session`], and mounts rmcp's
//! `StreamableHttpService` at `/mcp`; nothing here changes.
//!
//! **Invariant:** every tool goes through a [`crate::store::Store`] operation, so it gets
//! the permission checks the CLI gets; no tool argument names a user, and an `agent`
//! argument must be one the session may act as.
//! **Invariant:** a refusal is a tool error whose JSON names its cause, never a protocol
//! error a model cannot read.
//! Never imports: `bins` (nothing does); nothing below it imports it.

pub mod anti;
pub mod args;
pub mod lookup;
pub mod memory;
pub mod reply;
pub mod resources;
pub mod scratch;
pub mod server;
pub mod session;
pub mod tools;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::mcp::server::SwarmMcp;
use crate::mcp::session::{Authority, Fixed, Session};

impl SwarmMcp {
    /// A server with every tool, acting for the sessions `authority` gives.
    pub fn new(authority: Arc<dyn Authority>) -> SwarmMcp {
        SwarmMcp::with_router(authority, SwarmMcp::tool_router())
    }
}

/// Serves one session over stdin/stdout until the client closes the connection.
pub async fn serve_stdio(session: Session) -> Result<()> {
    use rmcp::ServiceExt;
    let server = SwarmMcp::new(Arc::new(Fixed(Arc::new(session))));
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| {
            Error::invalid(
                "stdin",
                format!("no MCP client on stdin: the initialize handshake failed ({e}); `swarm mcp` is started by an MCP client (JSON-RPC over stdio), not run by hand"),
            )
        })?;
    running.waiting().await.map_err(|e| Error::Io {
        op: "serve MCP over",
        path: "stdio".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(())
}
