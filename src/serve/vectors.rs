//! The server's embedding model: loaded once at start (`--embed-model DIR`, else
//! `SWARM_EMBED_MODEL`, else `<data dir>/.models/all-MiniLM-L6-v2`: `embed::locate`), and
//! one vector cache per user in front of it, for `GET /v1/search` and `/mcp`'s
//! `search_memory` (hybrid search). Without a model both rank by words and say why.
//!
//! **Invariant:** a user's texts and vectors go only to that user's cache
//! (`<data dir>/.vectors/<user>/`, `embed::cache::user_dir`): a search for one user never
//! reads or fills another user's cache. The model itself holds no user data.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::embed::cache::{self, Cached};
use crate::embed::{self, Embedder, Located};
use crate::error::{Error, Result};

/// The model, the reason there is none, and each user's cache.
pub struct Vectors {
    model: Option<Arc<dyn Embedder>>,
    /// Why there is no model (empty with one).
    reason: String,
    /// Where the model was looked for.
    located: Located,
    caches: Mutex<HashMap<String, Arc<Cached>>>,
}

impl Vectors {
    /// Finds and loads the model (see the module doc). No model there: lexical search,
    /// with the reason; files there that do not load: an error (a server started with a
    /// broken model should not quietly search by words).
    pub fn load(explicit: Option<&Path>, data_dir: &Path) -> Result<Vectors> {
        let located = embed::locate(explicit, data_dir);
        let model = embed::load(&located).map_err(|e| {
            Error::invalid(
                "embed-model",
                format!(
                    "the model at {} (from {}) does not load: {e}",
                    located.path.display(),
                    located.origin.as_str()
                ),
            )
        })?;
        let reason = match &model {
            Some(_) => String::new(),
            None => located
                .reason()
                .unwrap_or_else(|| "built without the `semantic` feature".to_string()),
        };
        Ok(Vectors::with(model, reason, located))
    }

    fn with(model: Option<Arc<dyn Embedder>>, reason: String, located: Located) -> Vectors {
        Vectors {
            model,
            reason,
            located,
            caches: Mutex::new(HashMap::new()),
        }
    }

    /// The start-up log line: how the server searches, and why.
    pub fn describe(&self) -> String {
        match &self.model {
            Some(m) => format!(
                "search: hybrid (words and {}, {} dimensions; {}; vectors cached per user under {})",
                m.id(),
                m.dim(),
                self.located,
                cache::VECTORS_DIR
            ),
            None => format!("search: lexical ({})", self.reason),
        }
    }

    /// Whether searches rank with a model.
    pub fn has_model(&self) -> bool {
        self.model.is_some()
    }

    /// Why searches are lexical (empty with a model).
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The model behind `user`'s own vector cache (opened on first use, which reads the
    /// cache file: call it on a blocking thread); `None` without a model. `user` must be
    /// a checked user id (the token's: its store is open).
    pub fn for_user(&self, data_dir: &Path, user: &str) -> Result<Option<Arc<Cached>>> {
        let Some(model) = &self.model else {
            return Ok(None);
        };
        if let Some(c) = self.lock().get(user) {
            return Ok(Some(c.clone()));
        }
        // Opened outside the map's lock (it reads the whole file); the first one in wins.
        let opened = Arc::new(Cached::open(
            model.clone(),
            &cache::user_dir(data_dir, user),
        )?);
        let c = self
            .lock()
            .entry(user.to_string())
            .or_insert(opened)
            .clone();
        Ok(Some(c))
    }

    /// Writes every user's new vectors to its cache file (blocking: an `fdatasync` per
    /// cache with new vectors). A failure is logged: a cache never fails a search.
    pub fn flush_all(&self) {
        let caches: Vec<Arc<Cached>> = self.lock().values().cloned().collect();
        for c in caches {
            if let Err(e) = c.flush() {
                tracing::warn!(path = %c.path().display(), error = %e, "cannot write the vector cache");
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Cached>>> {
        self.caches.lock().unwrap_or_else(|e| e.into_inner())
    }
}
