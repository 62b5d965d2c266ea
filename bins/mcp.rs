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
    #[arg(
        long = "agent",
        env = "SWARM_AGENT",
        value_delimiter = ',',
        required = true
    )]
    agents: Vec<String>,
}

pub fn mcp(store: Store, args: McpArgs) -> anyhow::Result<ExitCode> {
    let session = Session::new(Arc::new(store), args.agents)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(swarm_memory::mcp::serve_stdio(session))?;
    Ok(ExitCode::SUCCESS)
}
