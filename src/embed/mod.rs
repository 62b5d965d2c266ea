//! Sentence embeddings: the seam between the synthesizer / search and a model.
//!
//! CONTRACT: an [`Embedder`] turns texts into unit-length vectors (L2-normalised, so the
//! dot product is the cosine) of [`Embedder::dim`] dimensions. The same text gives the
//! same vector on every call, on one core or many (no sampling, no batch-dependent
//! padding effects beyond float rounding that [`Embedder::id`] pins down). [`Embedder::id`]
//! names the model and its weights (name and content hash): vectors cached under one id
//! are never used under another.
//!
//! Implementations: the local BERT model (feature `semantic`, `embed::model`), the
//! vector cache that wraps any embedder (`embed::cache`), and [`Table`], fixed vectors
//! for tests.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};

#[cfg(feature = "semantic")]
pub(crate) mod bert;
pub mod cache;
#[cfg(feature = "semantic")]
pub mod install;
#[cfg(feature = "semantic")]
pub mod model;

/// The environment variable naming a model directory (after `--embed-model`).
pub const MODEL_ENV: &str = "SWARM_EMBED_MODEL";

/// The default model's directory under `<data dir>/models/`.
pub const DEFAULT_MODEL: &str = "all-MiniLM-L6-v2";

/// The files a sentence-transformers directory must hold for [`load`].
pub const MODEL_FILES: [&str; 3] = ["config.json", "tokenizer.json", "model.safetensors"];

/// Where a model directory came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The caller's explicit path (`--embed-model DIR`).
    Explicit,
    /// The environment variable [`MODEL_ENV`].
    Env,
    /// The default location, `<data dir>/.models/all-MiniLM-L6-v2`.
    DataDir,
}

impl Origin {
    /// How a user would name this origin.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Explicit => "--embed-model",
            Origin::Env => MODEL_ENV,
            Origin::DataDir => "the data dir default",
        }
    }
}

/// The model directory [`locate`] chose, and whether a model is there.
#[derive(Clone, Debug)]
pub struct Located {
    /// The directory tried (only one is: an explicit or env path that holds no model is
    /// reported, not silently replaced by the default).
    pub path: PathBuf,
    /// Where the path came from.
    pub origin: Origin,
    /// The files of [`MODEL_FILES`] that are missing there (empty: a model is there).
    pub missing: Vec<&'static str>,
}

impl Located {
    /// Whether every file a model needs is there.
    pub fn found(&self) -> bool {
        self.missing.is_empty()
    }

    /// Why no model is used, or None when one is there.
    pub fn reason(&self) -> Option<String> {
        if self.found() {
            return None;
        }
        let what = if self.path.is_dir() {
            format!("missing {}", self.missing.join(", "))
        } else {
            "no such directory".to_string()
        };
        Some(format!(
            "model not found at {} (from {}): {what}; install it with `swarm model fetch` or point --embed-model / {MODEL_ENV} at a sentence-transformers directory",
            self.path.display(),
            self.origin.as_str()
        ))
    }
}

impl fmt::Display for Located {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason() {
            None => write!(
                f,
                "model at {} (from {})",
                self.path.display(),
                self.origin.as_str()
            ),
            Some(r) => f.write_str(&r),
        }
    }
}

/// The folder under the data dir that holds installed models (a dot name: user ids
/// cannot start with a dot, so no user's data shares it).
pub const MODELS_DIR: &str = ".models";

/// Where `swarm model fetch` installs the default model and [`locate`] looks last:
/// `<data_dir>/.models/all-MiniLM-L6-v2`.
pub fn default_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(MODELS_DIR).join(DEFAULT_MODEL)
}

/// Where the model is: `explicit` (`--embed-model DIR`) if given, else the directory in
/// [`MODEL_ENV`] if set and not empty, else `<data_dir>/.models/all-MiniLM-L6-v2`. Only the
/// first of these that is given is tried.
pub fn locate(explicit: Option<&Path>, data_dir: &Path) -> Located {
    let env = std::env::var_os(MODEL_ENV).filter(|v| !v.is_empty());
    let (path, origin) = match (explicit, env) {
        // The CLI's `--embed-model` takes its value from the variable when not given:
        // the same path is named by where it most likely came from.
        (Some(p), Some(e)) if p.as_os_str() == e => (p.to_path_buf(), Origin::Env),
        (Some(p), _) => (p.to_path_buf(), Origin::Explicit),
        (None, Some(e)) => (PathBuf::from(e), Origin::Env),
        (None, None) => (default_dir(data_dir), Origin::DataDir),
    };
    let missing = MODEL_FILES
        .into_iter()
        .filter(|f| !path.join(f).is_file())
        .collect();
    Located {
        path,
        origin,
        missing,
    }
}

/// Opens the model [`locate`] found: `None` when there is none (the caller falls back to
/// lexical matching and says so, with [`Located::reason`]) or when the library was built
/// without the `semantic` feature; an error when its files are there but do not open.
/// The weights load on the first embedding call ([`model::Lazy`]): a run that finds
/// every text in its vector cache never holds them.
pub fn load(located: &Located) -> Result<Option<Arc<dyn Embedder>>> {
    if !located.found() {
        return Ok(None);
    }
    #[cfg(feature = "semantic")]
    {
        let m = model::Lazy::open(&located.path)?;
        Ok(Some(Arc::new(m)))
    }
    #[cfg(not(feature = "semantic"))]
    {
        tracing::warn!("built without the `semantic` feature: the embedding model is not used");
        Ok(None)
    }
}

/// A sentence-embedding model.
pub trait Embedder: Send + Sync {
    /// The model's name, weights hash and setup hash (config, tokenizer, pooling, tokens
    /// kept), e.g. `all-MiniLM-L6-v2@sha256:1a2b3c4d5e6f7a8b.0c1d2e3f.f2` (`.f2`: the
    /// version of the model code's arithmetic).
    fn id(&self) -> &str;
    /// Dimensions of every vector.
    fn dim(&self) -> usize;
    /// One unit vector per text, in order.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>>;
}

impl std::fmt::Debug for dyn Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Embedder({}, {} dimensions)", self.id(), self.dim())
    }
}

/// Runs `f` compiled for the best vector instructions this CPU has (AVX2 or AVX-512 on
/// x86-64, chosen at run time by `pulp`, without `unsafe` here); the baseline build
/// targets SSE2 only. `f` must be `#[inline(always)]` and everything it calls too, or it
/// runs as the baseline code. Only for loops whose result does not depend on the
/// instructions: exact integer sums, or float operations in a fixed order (the compiler
/// never reorders float adds nor fuses a multiply and an add unless told to, so the
/// vector width changes the speed, not the bits).
#[inline(always)]
pub fn simd<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(feature = "semantic")]
    {
        static ARCH: std::sync::OnceLock<pulp::Arch> = std::sync::OnceLock::new();
        ARCH.get_or_init(pulp::Arch::new).dispatch(f)
    }
    #[cfg(not(feature = "semantic"))]
    f()
}

/// Dot product of two vectors of one length (the cosine of unit vectors).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    // Eight independent sums, so the compiler can keep them in SIMD lanes (a single
    // running sum is a chain of dependent adds it may not reorder); a fixed order, so
    // the result is the same bits on every machine and run, whatever vector
    // instructions run it ([`simd`]).
    simd(
        #[inline(always)]
        || {
            let mut acc = [0.0f32; 8];
            let (ac, at) = a.split_at(a.len() - a.len() % 8);
            let (bc, bt) = b.split_at(ac.len().min(b.len()));
            for (x, y) in ac.chunks_exact(8).zip(bc.chunks_exact(8)) {
                for k in 0..8 {
                    acc[k] += x[k] * y[k];
                }
            }
            let tail: f32 = at.iter().zip(bt).map(|(x, y)| x * y).sum();
            ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
        },
    )
}

/// Scales `v` to unit length (a zero vector stays zero).
pub fn l2_normalize(v: &mut [f32]) {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
}

/// Fixed vectors by exact text: for tests and for vectors computed elsewhere. A text it
/// does not hold is an error, never a made-up vector.
pub struct Table {
    id: String,
    dim: usize,
    vectors: HashMap<String, Vec<f32>>,
}

impl Table {
    /// A table of `dim`-dimensional vectors under the model id `id`.
    pub fn new(id: &str, dim: usize) -> Table {
        Table {
            id: id.to_string(),
            dim,
            vectors: HashMap::new(),
        }
    }

    /// A table from a JSON object `{"text": [floats], ...}` (every vector of one length).
    pub fn from_json(id: &str, json: &str) -> Result<Table> {
        let map: HashMap<String, Vec<f32>> = serde_json::from_str(json).map_err(|e| {
            Error::invalid("vectors", format!("not a JSON object of float arrays: {e}"))
        })?;
        let dim = map.values().next().map_or(0, Vec::len);
        let mut t = Table::new(id, dim);
        for (text, v) in map {
            t.insert(&text, v)?;
        }
        Ok(t)
    }

    /// Adds (or replaces) the vector of `text`, normalised.
    pub fn insert(&mut self, text: &str, mut v: Vec<f32>) -> Result<()> {
        if v.len() != self.dim {
            return Err(Error::invalid(
                "vector",
                format!("{} dimensions for a table of {}", v.len(), self.dim),
            ));
        }
        l2_normalize(&mut v);
        self.vectors.insert(text.to_string(), v);
        Ok(())
    }
}

impl Embedder for Table {
    fn id(&self) -> &str {
        &self.id
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        texts
            .iter()
            .map(|t| {
                self.vectors.get(*t).cloned().ok_or_else(|| {
                    Error::invalid("text", format!("no vector for {t:?} in table {}", self.id))
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_agrees_with_a_plain_sum_at_every_length() {
        for n in [0usize, 1, 7, 8, 9, 16, 383, 384] {
            let a: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
                .collect();
            let b: Vec<f32> = (0..n)
                .map(|i| ((i * 104_729) % 89) as f32 / 89.0 - 0.5)
                .collect();
            let plain: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            assert!((f64::from(dot(&a, &b)) - plain).abs() < 1e-4, "n {n}");
        }
    }

    #[test]
    fn table_normalises_and_refuses_unknown_texts() {
        let mut t = Table::new("t@0", 2);
        t.insert("a", vec![3.0, 4.0]).unwrap();
        let v = t.embed(&["a"]).unwrap();
        assert!((v[0][0] - 0.6).abs() < 1e-6 && (v[0][1] - 0.8).abs() < 1e-6);
        assert!((dot(&v[0], &v[0]) - 1.0).abs() < 1e-6);
        assert!(t.embed(&["b"]).is_err());
        assert!(t.insert("c", vec![1.0]).is_err());
    }
}
