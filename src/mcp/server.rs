//! [`SwarmMcp`]: the MCP server handler. It resolves each request's [`Session`] through
//! its [`Authority`], runs the tool's engine call on a blocking thread (appends wait for
//! `fdatasync`), and turns the answer into a tool result ([`crate::mcp::reply`]).
//! The tools themselves live in `scratch.rs` and `memory.rs`, the resources in
//! `resources.rs`; `mod.rs` puts the tool routers together.

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{
    CallToolResult, Extensions, ListResourceTemplatesResult, ListResourcesResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities,
    ServerConfig, SubscribeRequestParams, UnsubscribeRequestParams,
};
use rmcp::service::RequestContext;
use rmcp::{tool_handler, ErrorData as McpError, RoleServer, ServerHandler};

use crate::mcp::reply::{self, ToolResult};
use crate::mcp::resources::{self, Watches};
use crate::mcp::session::{Authority, Session};

/// What the server tells a model when it connects.
const INSTRUCTIONS: &str = "\
swarm-memory: an event-sourced shared memory for a swarm of agents.
A run is one investigation (an incident, a research task): an append-only log of typed
entries (hypothesis, evidence, decision, action_taken) that every agent of the swarm reads.
At the start of an investigation: get_recommended_investigation_strategy (proven tool
sequences for the symptom) and search_memory (have we seen this before?). Before calling a
tool that may fail: get_tool_advice. While working: append_entry / add_finding_to_memory
for what you learn, track_tool_call for each tool call, read_entries with your cursor to
see what peers wrote, get_context for a prompt-sized view. When solved:
complete_investigation (closes the run and learns the pattern). Refusals come back as tool
errors whose JSON names the cause (cas_conflict with the current version, escalated with
the escalation seq, forbidden) and a hint.";

/// The MCP server: every tool and resource of swarm-memory, for the sessions its
/// [`Authority`] gives.
#[derive(Clone)]
pub struct SwarmMcp {
    pub(crate) authority: Arc<dyn Authority>,
    pub(crate) tool_router: ToolRouter<SwarmMcp>,
    /// Resource subscriptions of this connection: URI → the task that watches the run.
    pub(crate) watches: Watches,
}

impl SwarmMcp {
    /// A server over `authority` with the given tools (see `SwarmMcp::new` in `mod.rs`).
    pub(crate) fn with_router(
        authority: Arc<dyn Authority>,
        tool_router: ToolRouter<SwarmMcp>,
    ) -> SwarmMcp {
        SwarmMcp {
            authority,
            tool_router,
            watches: Watches::default(),
        }
    }

    /// The session of a request.
    pub(crate) fn session(&self, ext: &Extensions) -> crate::error::Result<Arc<Session>> {
        self.authority.session(ext)
    }

    /// The session of a resource request (a refusal is a protocol error there: resources
    /// have no tool-error channel).
    fn resource_session(&self, ext: &Extensions) -> Result<Arc<Session>, McpError> {
        self.session(ext)
            .map_err(|e| McpError::invalid_request(e.to_string(), None))
    }

    /// Runs `f` (engine calls: blocking file I/O and fsyncs) on a blocking thread with the
    /// request's session and turns its answer into a tool result.
    pub(crate) async fn call<F>(&self, ext: &Extensions, f: F) -> Result<CallToolResult, McpError>
    where
        F: FnOnce(&Session) -> ToolResult + Send + 'static,
    {
        let session = match self.session(ext) {
            Ok(s) => s,
            Err(e) => return Ok(reply::failure(&e.into())),
        };
        let r = tokio::task::spawn_blocking(move || f(&session))
            .await
            .map_err(|e| McpError::internal_error(format!("tool task failed: {e}"), None))?;
        Ok(match r {
            Ok(v) => reply::success(v),
            Err(e) => reply::failure(&e),
        })
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SwarmMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_resources_subscribe()
                .build(),
        )
        .with_server_info(rmcp::model::Implementation::new(
            "swarm-memory",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(INSTRUCTIONS)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        resources::list(self.resource_session(&context.extensions)?).await
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(
            resources::templates(),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        resources::read(self.resource_session(&context.extensions)?, &request.uri)
            .await
            .map(ReadResourceResponse::from)
    }

    #[allow(deprecated)] // resources/subscribe is what 2025-era clients (and the Python SDK's ClientSession) send
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let s = self.resource_session(&context.extensions)?;
        resources::subscribe(s, &self.watches, request.uri, context).await
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        resources::unsubscribe(&self.watches, &request.uri);
        Ok(())
    }
}
