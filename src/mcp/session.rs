//! Who a tool call acts as: the user (a [`Store`] opened for that user) and the agents
//! the caller may write as. An [`Authority`] turns a request into a [`Session`]; the
//! stdio server has one fixed session (`--user`, `--agent`), the HTTP server (`/mcp` on
//! `swarm serve`) one per request, from its bearer token.
//!
//! **Invariant:** a tool's arguments never name a user: the store of the session is the
//! only one a call touches, and an `agent` argument must be one of the session's agents.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::event::check_id;
use crate::store::Store;

/// Why `search_memory` is lexical when the session was given no model.
pub const MCP_LEXICAL_REASON: &str = "no embedding model given to this MCP session";

/// The identity a tool call acts with.
pub struct Session {
    /// The store, opened for the session's user (the partition key).
    pub store: Arc<Store>,
    /// The agents the caller may act as: exact ids, or `prefix*` patterns (a bearer
    /// token's agents; `*` alone: any). The first exact id is the default.
    pub agents: Vec<String>,
    /// The embedding model `search_memory` ranks with (hybrid search); `None`: lexical.
    pub embedder: Option<Arc<dyn crate::embed::Embedder>>,
    /// Why there is no model (said in `search_memory`'s answer).
    pub no_model_reason: String,
    /// Whether the caller is the user's admin (an `admin` token): shown figures over all
    /// the user's runs (`complete_investigation`'s `facts_total`). `false` by default:
    /// an agent's session is shown figures of the runs it acts on only.
    pub admin: bool,
}

impl Session {
    /// A session of `store`'s user acting as `agents` (at least one, each a valid id or
    /// a valid id prefix followed by `*`).
    pub fn new(store: Arc<Store>, agents: Vec<String>) -> Result<Session> {
        if agents.is_empty() {
            return Err(Error::invalid("agent", "give at least one agent id"));
        }
        for a in &agents {
            match a.strip_suffix('*') {
                Some("") => {}
                Some(prefix) => check_id("agent_id", prefix)?,
                None => check_id("agent_id", a)?,
            }
        }
        Ok(Session {
            store,
            agents,
            embedder: None,
            no_model_reason: MCP_LEXICAL_REASON.to_string(),
            admin: false,
        })
    }

    /// The session as the user's admin (`true`: an `admin` token) or an agent's.
    pub fn with_admin(mut self, admin: bool) -> Session {
        self.admin = admin;
        self
    }

    /// The session with an embedding model for `search_memory` (`None`: lexical, with
    /// `reason` in its answers).
    pub fn with_model(
        mut self,
        embedder: Option<Arc<dyn crate::embed::Embedder>>,
        reason: String,
    ) -> Session {
        self.embedder = embedder;
        self.no_model_reason = reason;
        self
    }

    /// Whether the session may act as agent `a`.
    fn may_act_as(&self, a: &str) -> bool {
        self.agents.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => a.starts_with(prefix),
            None => p == a,
        })
    }

    /// The user.
    pub fn user(&self) -> &str {
        self.store.user()
    }

    /// The agent a call acts as: `asked` if the session may act as it, else the default.
    /// Acting as an agent the session was not given is forbidden.
    pub fn agent(&self, asked: Option<&str>) -> Result<String> {
        match asked {
            None => self
                .agents
                .iter()
                .find(|a| !a.ends_with('*'))
                .cloned()
                .ok_or_else(|| {
                    Error::invalid(
                        "agent",
                        format!(
                            "this session acts as agents matching {:?}; name the agent",
                            self.agents
                        ),
                    )
                }),
            Some(a) if self.may_act_as(a) => {
                check_id("agent", a)?;
                Ok(a.to_string())
            }
            Some(a) => Err(Error::Forbidden(format!(
                "this session acts as {:?}, not as agent {a:?}",
                self.agents
            ))),
        }
    }
}

/// Resolves the session of a request. `extensions` are the request's (the HTTP transport
/// puts the request's headers there, so a token-based authority can read the bearer
/// token); a failure refuses the call with the error it returns.
pub trait Authority: Send + Sync + 'static {
    /// The session the request acts with.
    fn session(&self, extensions: &rmcp::model::Extensions) -> Result<Arc<Session>>;
}

/// One session for every request: the stdio server's identity from its flags.
pub struct Fixed(pub Arc<Session>);

impl Authority for Fixed {
    fn session(&self, _: &rmcp::model::Extensions) -> Result<Arc<Session>> {
        Ok(self.0.clone())
    }
}
