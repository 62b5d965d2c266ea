//! The local sentence-embedding model (feature `semantic`): a sentence-transformers
//! directory (all-MiniLM-L6-v2 and any other BERT model saved the same way) run on the
//! CPU by the encoder in `bert.rs` (candle's matrix product, this crate's loops).
//!
//! What it reads from the directory, as sentence-transformers does:
//! - `config.json` (the BERT shape), `tokenizer.json` (the Hugging Face tokenizer),
//!   `model.safetensors` (the weights, f32, f16 or bf16);
//! - `sentence_bert_config.json`: `max_seq_length`, the number of tokens kept (longer
//!   texts are truncated, like sentence-transformers does; 256 for MiniLM);
//! - `1_Pooling/config.json` (found through `modules.json` when present): mean pooling
//!   over the tokens or the CLS token. Other poolings are refused.
//!
//! The vectors are L2-normalised whatever `modules.json` says (the [`Embedder`] contract).
//!
//! **Invariant:** a text's vector does not depend on the texts it is embedded with: its
//! bits are the same alone or in any call, on one core or two. Padding would break that
//! (measured with candle's BERT: a 15-token text padded to 32 tokens changed 369 of its
//! 384 values in the last bits), so nothing is padded: a batch stacks its texts' rows
//! for the products and runs attention on each text's own rows (`bert.rs`). Texts are
//! sorted by length and cut into batches of up to [`BATCH_TEXTS_MAX`], run on every core
//! at once. Tests: `batch_does_not_change_bits` and `threads_do_not_change_bits` here,
//! `one_or_two_threads_give_the_same_bits` in tests/embed.rs.

use std::fs;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::embed::bert::{Bert, Config};
use crate::embed::{l2_normalize, Embedder};
use crate::error::{Error, IoContext, Result};

/// Texts sent to the network at once (of any lengths: their rows are stacked).
pub const BATCH_TEXTS_MAX: usize = 32;

/// The version of the arithmetic (`bert.rs`), part of the model id: vectors computed by
/// another version differ in their last bits, so a vector cache made by it is not reused.
const FORWARD_VERSION: u32 = 2;

/// `max_seq_length` when `sentence_bert_config.json` is missing (BERT's position limit
/// caps it too).
const SEQ_TOKENS_DEFAULT: usize = 256;

/// Refuse a `model.safetensors` larger than this: a guard against a wrong path (a
/// multi-gigabyte LLM), not a limit of the code.
const WEIGHTS_BYTES_MAX: u64 = 2 << 30;

/// How token vectors become one sentence vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of the token vectors under the attention mask (sentence-transformers'
    /// `pooling_mode_mean_tokens`).
    Mean,
    /// The first token's vector (`pooling_mode_cls_token`).
    Cls,
}

/// A sentence-transformers BERT model loaded on the CPU.
pub struct Model {
    id: String,
    dim: usize,
    seq_tokens_max: usize,
    pooling: Pooling,
    tokenizer: Tokenizer,
    bert: Bert,
}

#[derive(Deserialize)]
struct SentenceBertConfig {
    max_seq_length: Option<usize>,
}

#[derive(Deserialize)]
struct ModuleEntry {
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize, Default)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
}

fn model_err(dir: &Path, what: impl std::fmt::Display) -> Error {
    Error::invalid("embed model", format!("{}: {what}", dir.display()))
}

fn read_json<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> Result<T> {
    let path = dir.join(name);
    let bytes = fs::read(&path).ctx("read model file", &path)?;
    serde_json::from_slice(&bytes).map_err(|e| model_err(dir, format!("{name}: {e}")))
}

/// The pooling the directory asks for: `modules.json` names the pooling module's folder
/// (`1_Pooling` by default); no pooling config means mean pooling, the
/// sentence-transformers default.
fn read_pooling(dir: &Path) -> Result<Pooling> {
    let mut folder = PathBuf::from("1_Pooling");
    if dir.join("modules.json").is_file() {
        let modules: Vec<ModuleEntry> = read_json(dir, "modules.json")?;
        if let Some(m) = modules.iter().find(|m| m.kind.ends_with(".Pooling")) {
            if m.path.split('/').any(|c| c == "..") || Path::new(&m.path).is_absolute() {
                return Err(model_err(
                    dir,
                    format!("modules.json: bad path {:?}", m.path),
                ));
            }
            folder = PathBuf::from(&m.path);
        }
    }
    let rel = folder.join("config.json");
    if !dir.join(&rel).is_file() {
        return Ok(Pooling::Mean);
    }
    let c: PoolingConfig = read_json(dir, &rel.to_string_lossy())?;
    match (
        c.pooling_mode_mean_tokens,
        c.pooling_mode_cls_token,
        c.pooling_mode_max_tokens || c.pooling_mode_mean_sqrt_len_tokens,
    ) {
        (true, false, false) => Ok(Pooling::Mean),
        (false, true, false) => Ok(Pooling::Cls),
        _ => Err(model_err(
            dir,
            format!("{}: only mean or CLS pooling is supported", rel.display()),
        )),
    }
}

/// The hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Refuses a weights file over [`WEIGHTS_BYTES_MAX`].
fn check_weights_len(dir: &Path, len: u64) -> Result<()> {
    if len > WEIGHTS_BYTES_MAX {
        return Err(model_err(
            dir,
            format!("model.safetensors is {len} bytes, over the {WEIGHTS_BYTES_MAX}-byte limit"),
        ));
    }
    Ok(())
}

/// What besides the weights decides a text's vector: the network's shape
/// (`config.json`), the tokenizer (`tokenizer.json`), the tokens kept per text
/// (`max_seq_length`) and the pooling.
struct Setup {
    config: Config,
    seq_tokens_max: usize,
    pooling: Pooling,
    /// The hex SHA-256 of all of them (part of the model id).
    hash: String,
}

/// Reads and checks the small files of the directory (not the weights).
fn read_setup(dir: &Path) -> Result<Setup> {
    let read = |name: &str| {
        let path = dir.join(name);
        fs::read(&path).ctx("read model file", &path)
    };
    let config_bytes = read("config.json")?;
    let config: Config = serde_json::from_slice(&config_bytes)
        .map_err(|e| model_err(dir, format!("config.json: {e}")))?;
    let seq_tokens_max = if dir.join("sentence_bert_config.json").is_file() {
        let c: SentenceBertConfig = read_json(dir, "sentence_bert_config.json")?;
        c.max_seq_length.unwrap_or(SEQ_TOKENS_DEFAULT)
    } else {
        SEQ_TOKENS_DEFAULT
    }
    .min(config.max_position_embeddings);
    let pooling = read_pooling(dir)?;
    let tokenizer_bytes = read("tokenizer.json")?;
    let mut h = Sha256::new();
    for part in [&config_bytes[..], &tokenizer_bytes[..]] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.update(format!("max_seq_length={seq_tokens_max};pooling={pooling:?}").as_bytes());
    Ok(Setup {
        config,
        seq_tokens_max,
        pooling,
        hash: hex(&h.finalize()),
    })
}

/// A model's id: its directory's name, the start of its weights' SHA-256, and the start
/// of its setup's ([`Setup`]: another tokenizer, pooling or `max_seq_length` gives other
/// vectors from the same weights, so a vector cache must not be shared across them).
fn model_id(dir: &Path, weights: &str, setup: &str) -> String {
    let name = dir
        .canonicalize()
        .unwrap_or_else(|_| dir.to_path_buf())
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    format!(
        "{name}@sha256:{}.{}.f{FORWARD_VERSION}",
        &weights[..16],
        &setup[..8]
    )
}

/// A model whose weights are loaded on the first call that embeds (an empty call
/// included): its id and dimension are known at once (the weights are hashed as a
/// stream, not held), so a run whose texts are all in the vector cache (a warm synth, a
/// search of known facts, an idle server) never holds the ~90 MiB of weights. The
/// small files (config, tokenizer, pooling) are checked at once; the weights, on first
/// use: an error there is returned by that call and every later one.
pub struct Lazy {
    dir: PathBuf,
    id: String,
    dim: usize,
    model: std::sync::OnceLock<std::result::Result<Model, String>>,
}

impl Lazy {
    /// Opens the sentence-transformers directory `dir` without loading its weights.
    pub fn open(dir: &Path) -> Result<Lazy> {
        let setup = read_setup(dir)?;
        Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| model_err(dir, format!("tokenizer.json: {e}")))?;
        let w_path = dir.join("model.safetensors");
        let mut f = fs::File::open(&w_path).ctx("open model file", &w_path)?;
        check_weights_len(dir, f.metadata().ctx("stat model file", &w_path)?.len())?;
        let mut h = Sha256::new();
        std::io::copy(&mut f, &mut h).ctx("read model file", &w_path)?;
        let hash = hex(&h.finalize());
        Ok(Lazy {
            dir: dir.to_path_buf(),
            id: model_id(dir, &hash, &setup.hash),
            dim: setup.config.hidden_size,
            model: std::sync::OnceLock::new(),
        })
    }

    /// The loaded model (loading it the first time).
    fn model(&self) -> Result<&Model> {
        let m = self.model.get_or_init(|| {
            let m = Model::load(&self.dir).map_err(|e| e.to_string())?;
            if m.id != self.id {
                return Err(format!(
                    "{}: the weights changed since the model was opened ({} then, {} now)",
                    self.dir.display(),
                    self.id,
                    m.id
                ));
            }
            Ok(m)
        });
        m.as_ref()
            .map_err(|e| Error::invalid("embed model", e.clone()))
    }
}

impl Embedder for Lazy {
    fn id(&self) -> &str {
        &self.id
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        self.model()?.embed(texts)
    }
}

impl Model {
    /// Loads the sentence-transformers directory `dir` (see the module doc for the files).
    pub fn load(dir: &Path) -> Result<Model> {
        let setup = read_setup(dir)?;
        let (config, seq_tokens_max, pooling) =
            (&setup.config, setup.seq_tokens_max, setup.pooling);

        let tok_path = dir.join("tokenizer.json");
        let mut tokenizer = Tokenizer::from_file(&tok_path)
            .map_err(|e| model_err(dir, format!("tokenizer.json: {e}")))?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length: seq_tokens_max,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|e| model_err(dir, format!("tokenizer truncation: {e}")))?;

        let w_path = dir.join("model.safetensors");
        check_weights_len(
            dir,
            fs::metadata(&w_path).ctx("stat model file", &w_path)?.len(),
        )?;
        let weights = fs::read(&w_path).ctx("read model file", &w_path)?;
        let hash = sha256_hex(&weights);
        let id = model_id(dir, &hash, &setup.hash);
        let bert = Bert::load(config, &weights).map_err(|e| model_err(dir, e))?;
        drop(weights);
        Ok(Model {
            id,
            dim: bert.hidden(),
            seq_tokens_max,
            pooling,
            tokenizer,
            bert,
        })
    }

    /// Tokens kept per text (`max_seq_length`).
    pub fn seq_tokens_max(&self) -> usize {
        self.seq_tokens_max
    }

    /// The pooling in use.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Token ids of `text` after truncation (with `[CLS]` and `[SEP]`).
    pub fn tokens(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| Error::invalid("text", format!("tokenizer: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Runs one batch through the network: one unit vector per id list, in order.
    fn embed_ids(&self, ids: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let h = self.bert.hidden();
        let out = self.bert.forward(ids)?;
        let mut start = 0;
        let mut vectors = Vec::with_capacity(ids.len());
        for row in ids {
            let n = row.len();
            let tokens = &out[start * h..(start + n) * h];
            let mut v = match self.pooling {
                Pooling::Cls => tokens[..h].to_vec(),
                Pooling::Mean => {
                    let mut sum = vec![0f32; h];
                    for t in tokens.chunks_exact(h) {
                        for (s, x) in sum.iter_mut().zip(t) {
                            *s += x;
                        }
                    }
                    sum.iter_mut().for_each(|s| *s /= n as f32);
                    sum
                }
            };
            l2_normalize(&mut v);
            vectors.push(v);
            start += n;
        }
        Ok(vectors)
    }
}

impl Embedder for Model {
    fn id(&self) -> &str {
        &self.id
    }

    fn dim(&self) -> usize {
        self.dim
    }

    /// Tokenises every text, sorts them by token count (so a batch's texts cost about
    /// the same) and runs batches of up to [`BATCH_TEXTS_MAX`] on every core at once;
    /// the vectors come back in the callers' order.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let ids = texts
            .iter()
            .map(|t| self.tokens(t))
            .collect::<Result<Vec<_>>>()?;
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&i| (ids[i].len(), i));
        let chunks: Vec<&[usize]> = order.chunks(BATCH_TEXTS_MAX).collect();
        // A text's vector does not depend on its batch (module doc), so the split and
        // the threads do not change the bits.
        let done = chunks
            .par_iter()
            .map(|chunk| {
                let batch: Vec<Vec<u32>> = chunk.iter().map(|&i| ids[i].clone()).collect();
                self.embed_ids(&batch)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut out = vec![Vec::new(); ids.len()];
        for (chunk, vectors) in chunks.iter().zip(done) {
            for (&i, v) in chunk.iter().zip(vectors) {
                out[i] = v;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model directory named by `SWARM_EMBED_MODEL`, or None with a printed notice
    /// (a failure under CI, where the model must be there: `.ci/run` installs it).
    fn model() -> Option<Model> {
        match std::env::var_os("SWARM_EMBED_MODEL") {
            Some(p) => Some(Model::load(Path::new(&p)).unwrap()),
            None if std::env::var_os("CI").is_some() => panic!(
                "SWARM_EMBED_MODEL is not set: install the model (swarm model fetch, see README) and point SWARM_EMBED_MODEL at it"
            ),
            None => {
                eprintln!("SKIPPED: SWARM_EMBED_MODEL is not set (swarm model fetch installs the model)");
                None
            }
        }
    }

    const TEXTS: [&str; 8] = [
        "disk full on db-1",
        "disk full on db-2",
        "p99 on checkout went up to 2.3 s",
        "checkout's 99th percentile latency is now ~2300ms after the deploy of v2.14.1 to eu-west-1",
        "db pool exhausted",
        "no free DB connections left: the orders service waits 30 s for a connection and then fails every request with HTTP 503, starting 14:02 UTC",
        "ok",
        "The weather is lovely today.",
    ];

    /// The id names the setup as well as the weights: the same weights with another
    /// pooling, `max_seq_length` or tokenizer give other vectors, so another id (a vector
    /// cache is one file per id). Before, only the weights and the directory's name were
    /// in it, and a cache kept serving the old setup's vectors.
    #[test]
    fn the_model_id_changes_with_pooling_length_and_tokenizer() {
        let Some(src) = std::env::var_os("SWARM_EMBED_MODEL").map(PathBuf::from) else {
            assert!(model().is_none());
            return;
        };
        let tmp = tempfile::tempdir().unwrap();
        // The same directory name, so only the setup can tell the ids apart.
        let dir = tmp
            .path()
            .join(src.canonicalize().unwrap().file_name().unwrap());
        let copy = |from: &Path, to: &Path| {
            for e in fs::read_dir(from).unwrap() {
                let e = e.unwrap();
                let to = to.join(e.file_name());
                if e.file_type().unwrap().is_dir() {
                    fs::create_dir_all(&to).unwrap();
                    for f in fs::read_dir(e.path()).unwrap() {
                        let f = f.unwrap();
                        fs::copy(f.path(), to.join(f.file_name())).unwrap();
                    }
                } else if e.file_name() == "model.safetensors" {
                    std::os::unix::fs::symlink(e.path().canonicalize().unwrap(), &to).unwrap();
                } else {
                    fs::copy(e.path(), &to).unwrap();
                }
            }
        };
        fs::create_dir_all(&dir).unwrap();
        copy(&src, &dir);
        let id = |d: &Path| Lazy::open(d).unwrap().id().to_string();
        let base = id(&src);
        assert_eq!(id(&dir), base, "a copy of the same files has the same id");
        let mut seen = vec![base];
        let pooling = fs::read_to_string(dir.join("1_Pooling/config.json")).unwrap();
        let mean: serde_json::Value = serde_json::from_str(&pooling).unwrap();
        assert_eq!(mean["pooling_mode_mean_tokens"], true, "{pooling}");
        let cls = serde_json::json!({"word_embedding_dimension": mean["word_embedding_dimension"],
            "pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false});
        fs::write(dir.join("1_Pooling/config.json"), cls.to_string()).unwrap();
        let now = id(&dir);
        assert!(
            !seen.contains(&now),
            "the pooling changed, the id did not: {now}"
        );
        seen.push(now);
        let mut edit = |name: &str, from: &str, to: &str| {
            let p = dir.join(name);
            let text = fs::read_to_string(&p).unwrap();
            assert!(text.contains(from), "{name}: {text}");
            fs::write(&p, text.replacen(from, to, 1)).unwrap();
            let now = id(&dir);
            assert!(
                !seen.contains(&now),
                "{name} changed, the id did not: {now}"
            );
            seen.push(now);
        };
        edit("sentence_bert_config.json", "256", "128");
        edit(
            "tokenizer.json",
            "\"lowercase\":true",
            "\"lowercase\":false",
        );
    }

    /// The lazy model has the eager one's id and dimension before loading anything, and
    /// gives the same bits once it loads.
    #[test]
    fn lazy_model_loads_on_first_use_with_the_same_id_and_bits() {
        let Some(m) = model() else { return };
        let dir = std::env::var_os("SWARM_EMBED_MODEL").unwrap();
        let lazy = Lazy::open(Path::new(&dir)).unwrap();
        assert_eq!((lazy.id(), lazy.dim()), (m.id(), m.dim()));
        assert!(lazy.model.get().is_none(), "weights loaded before use");
        assert_eq!(lazy.embed(&TEXTS).unwrap(), m.embed(&TEXTS).unwrap());
        assert!(lazy.model.get().is_some());
    }

    #[test]
    fn batch_does_not_change_bits() {
        let Some(m) = model() else { return };
        let together = m.embed(&TEXTS).unwrap();
        // Texts of one token count and of others share a batch (stacked rows).
        assert_eq!(
            m.tokens(TEXTS[0]).unwrap().len(),
            m.tokens(TEXTS[1]).unwrap().len()
        );
        // Many texts (several batches, hundreds of stacked rows): each text's vector is
        // the one it has alone.
        let many: Vec<String> = (0..70)
            .map(|i| format!("{} (note {i})", TEXTS[i % TEXTS.len()]))
            .collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let all = m.embed(&refs).unwrap();
        for i in [0, 5, 33, 69] {
            let alone = m.embed(&refs[i..=i]).unwrap();
            assert!(
                alone[0]
                    .iter()
                    .zip(&all[i])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "vector of {:?} differs alone and among 70",
                refs[i]
            );
        }
        for (i, t) in TEXTS.iter().enumerate() {
            let alone = m.embed(&[t]).unwrap();
            assert_eq!(alone[0].len(), m.dim());
            let same = alone[0]
                .iter()
                .zip(&together[i])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "vector of {t:?} differs alone and in a batch");
        }
        let n = crate::embed::dot(&together[0], &together[0]);
        assert!((n - 1.0).abs() < 1e-5);
    }

    /// A one-token input (possible with a tokenizer that adds no `[CLS]`/`[SEP]`) gets
    /// the same bits alone as stacked with other texts: gemm's one-row path is avoided.
    #[test]
    fn a_one_row_batch_has_the_bits_it_has_in_a_batch() {
        let Some(m) = model() else { return };
        let h = m.dim();
        let alone = m.bert.forward(&[vec![2054]]).unwrap();
        let stacked = m
            .bert
            .forward(&[vec![2054], vec![101, 2054, 2003, 102]])
            .unwrap();
        assert_eq!(alone.len(), h);
        assert!(alone
            .iter()
            .zip(&stacked[..h])
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    #[test]
    fn threads_do_not_change_bits() {
        let Some(m) = model() else { return };
        let pool = |n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap()
        };
        let one = pool(1).install(|| m.embed(&TEXTS).unwrap());
        let two = pool(2).install(|| m.embed(&TEXTS).unwrap());
        for (a, b) in one.iter().zip(&two) {
            assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }

    #[test]
    fn long_texts_are_truncated() {
        let Some(m) = model() else { return };
        let long = "the disk of broker-3 is full ".repeat(200);
        assert_eq!(m.tokens(&long).unwrap().len(), m.seq_tokens_max());
        assert_eq!(m.embed(&[&long]).unwrap()[0].len(), m.dim());
        assert!(m.id().contains("@sha256:"));
    }
}
