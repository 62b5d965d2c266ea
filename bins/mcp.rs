//! `swarm mcp`: the MCP server over stdio (feature `mcp`).

use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use swarm_memory::mcp::session::Session;
use swarm_memory::Store;

/// Arguments of `swarm mcp`.
#[derive(Args)]
pub struct McpArgs {
    /// The agent id the tools write as (repeatable: a tool's `agent` argument may name
    /// any of them; the first is the default). The user is --user / SWARM_USER.
    /// Required on the data directory; with SWARM_URL set, the server's tools act as the
    /// user and agents of SWARM_TOKEN instead (--user and --agent are not used).
    #[arg(long = "agent", env = "SWARM_AGENT", value_delimiter = ',')]
    pub agents: Vec<String>,
    /// The sentence-embedding model `search_memory` ranks with (else SWARM_EMBED_MODEL,
    /// else DATA_DIR/.models/all-MiniLM-L6-v2); without one its search is lexical and
    /// says why.
    #[arg(long, value_name = "DIR")]
    embed_model: Option<std::path::PathBuf>,
}

pub fn mcp(store: Store, data_dir: &std::path::Path, args: McpArgs) -> anyhow::Result<ExitCode> {
    if args.agents.is_empty() {
        return Err(crate::invalid(
            "agent",
            "give --agent ID (or SWARM_AGENT): the agent the tools write as; or set SWARM_URL and SWARM_TOKEN to use a server's tools as the token's agents",
        ));
    }
    let m = crate::search::cached_model(args.embed_model.as_deref(), data_dir, store.user())?;
    let session = Session::new(Arc::new(store), args.agents)?.with_model(m.embedder, m.reason);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(swarm_memory::mcp::serve_stdio(session))?;
    Ok(ExitCode::SUCCESS)
}
