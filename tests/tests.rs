//! The integration tests of swarm-memory: one binary, one module per concern.
//!
//! Tests that run the CLI use the `swarm` binary cargo built for this run; tests of the
//! engine's crash behaviour use `MemStorage`, which keeps a written and a durable image
//! of every file.

mod util;

mod bad_input;
mod channels;
mod cli;
mod cli_safety;
mod concurrent;
mod damage;
#[cfg(feature = "semantic")]
mod embed;
mod fsync_failure;
mod golden;
mod handoff;
mod index;
mod kill;
#[cfg(feature = "mcp")]
mod mcp;
#[cfg(feature = "mcp")]
mod mcp_http;
mod memory_events;
mod model;
mod prealloc;
mod random_bytes;
mod replay;
mod retry;
mod scratchpad;
mod search;
mod semantic;
mod serve;
mod serve_cli;
mod serve_crash;
mod serve_feed;
#[cfg(feature = "mcp")]
mod serve_model;
mod serve_socket;
mod serve_tls;
mod synth;
mod tail;
mod truncate;
mod visibility;
