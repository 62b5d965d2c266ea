//! The BERT encoder of a sentence-transformers model, run on the CPU: candle's matrix
//! product (the `gemm` crate's kernels, AVX-512 where the CPU has it) for the six
//! products of each layer, and plain loops over `f32` rows for everything between them
//! (bias, residual and layer norm fused in one pass, attention per text and head, GELU).
//!
//! Why not candle-transformers' `BertModel`: measured on this project's bench (1,024
//! findings, 2 cores) it ran 0.33× sentence-transformers on PyTorch. Half of its time
//! went to element-wise operations, each a separate pass that allocates a new tensor
//! (broadcast adds, masks, a scalar `erf`, a softmax in several passes), and it needs
//! every text of a batch padded to one length. Here one batch holds texts of any
//! lengths with no padding: the products work on the rows of every text stacked
//! together, and attention runs on each text's own rows.
//!
//! **Invariant:** a text's vector depends only on the text (on a given CPU). The products
//! compute each output row from its own input row, summing in blocks fixed by the
//! summed dimension, the CPU's cache sizes and its kernel (AVX-512 or AVX2), never by
//! the number of rows (its threads split rows and columns). Two gemm paths would break
//! that, and are kept out: a one-row product (run as two rows, see [`product`]) and
//! products of at most 64 columns (hidden sizes under 65 are refused). Every other step
//! reads one row or one text. So the bits are the same whatever the batch, alone or
//! with others, on one core or two (tests:
//! `batch_does_not_change_bits` and `threads_do_not_change_bits` in `model.rs`,
//! `one_or_two_threads_give_the_same_bits` in tests/embed.rs).
//!
//! The arithmetic follows Hugging Face's `BertModel` in f32: embeddings (word, position
//! and token type 0 added) and layer norm; per layer, self-attention (scaled dot products,
//! softmax, no mask: nothing is padded), output projection + residual + layer norm,
//! intermediate projection + activation, output projection + residual + layer norm.
//! The exact GELU uses the same `erf` approximation as PyTorch's vectorised CPU kernel
//! (Abramowitz and Stegun 7.1.26: absolute error 1.5e-7 in exact arithmetic, about
//! 5e-7 evaluated in f32).

use candle_core::safetensors::Load;
use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use crate::error::{Error, Result};

/// The fields of a Hugging Face BERT `config.json` the encoder reads.
#[derive(Clone, Debug, Deserialize)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    #[serde(default = "default_types")]
    pub type_vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default)]
    pub position_embedding_type: Option<String>,
}

fn default_act() -> String {
    "gelu".into()
}

fn default_types() -> usize {
    2
}

fn default_eps() -> f64 {
    1e-12
}

/// Limits that keep a wrong `config.json` from asking for absurd buffers.
const HIDDEN_MAX: usize = 8192;
/// Hidden sizes up to this are refused: gemm multiplies matrices of at most 64 columns
/// by another path, whose sums would depend on the number of rows (module doc).
const HIDDEN_MIN: usize = 64;
const LAYERS_MAX: usize = 128;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    /// `gelu`: x·Φ(x) with the error function.
    GeluErf,
    /// `gelu_new`, `gelu_pytorch_tanh`: the tanh approximation.
    GeluTanh,
    Relu,
}

/// Per-row layer norm weights.
struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

/// A linear layer: the weight transposed to (in, out), contiguous, and the bias.
struct Linear {
    w: Tensor,
    bias: Vec<f32>,
    out: usize,
}

struct Layer {
    /// Query, key and value in one product: (hidden, 3 × hidden).
    qkv: Linear,
    attn_out: Linear,
    attn_norm: Norm,
    up: Linear,
    down: Linear,
    out_norm: Norm,
}

/// The encoder's weights, in f32.
pub struct Bert {
    hidden: usize,
    heads: usize,
    eps: f32,
    act: Act,
    vocab: usize,
    positions: usize,
    word: Vec<f32>,
    position: Vec<f32>,
    token_type0: Vec<f32>,
    emb_norm: Norm,
    layers: Vec<Layer>,
}

fn err(what: impl std::fmt::Display) -> Error {
    Error::invalid("embed model", format!("model.safetensors: {what}"))
}

fn cerr(e: candle_core::Error) -> Error {
    Error::invalid("embed model", format!("inference: {e}"))
}

/// The tensors of a safetensors file, found by name with or without a `bert.` prefix.
struct Weights<'a> {
    st: safetensors::SafeTensors<'a>,
    prefix: &'static str,
}

impl Weights<'_> {
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let full = format!("{}{name}", self.prefix);
        let view = self
            .st
            .tensor(&full)
            .map_err(|_| err(format!("no tensor {full:?}")))?;
        if view.shape() != shape {
            return Err(err(format!(
                "{full:?} has shape {:?}, config.json says {shape:?}",
                view.shape()
            )));
        }
        view.load(&Device::Cpu)
            .and_then(|t| t.to_dtype(DType::F32))
            .map_err(|e| err(format!("{full:?}: {e}")))
    }

    fn vec(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.tensor(name, shape)?
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| err(format!("{name:?}: {e}")))
    }

    /// Layer norm weights: `weight`/`bias`, or the older `gamma`/`beta`.
    fn norm(&self, name: &str, h: usize) -> Result<Norm> {
        let has = |s: &str| {
            self.st
                .tensor(&format!("{}{name}.{s}", self.prefix))
                .is_ok()
        };
        let (g, b) = if !has("weight") && has("gamma") {
            ("gamma", "beta")
        } else {
            ("weight", "bias")
        };
        Ok(Norm {
            gamma: self.vec(&format!("{name}.{g}"), &[h])?,
            beta: self.vec(&format!("{name}.{b}"), &[h])?,
        })
    }

    /// Linear layers `names` (each `out × in` in the file) stacked along their outputs.
    fn linear(&self, names: &[&str], out: usize, input: usize) -> Result<Linear> {
        let mut ws = Vec::new();
        let mut bias = Vec::new();
        for n in names {
            ws.push(self.tensor(&format!("{n}.weight"), &[out, input])?);
            bias.extend(self.vec(&format!("{n}.bias"), &[out])?);
        }
        let w = Tensor::cat(&ws, 0)
            .and_then(|w| w.t())
            .and_then(|w| w.contiguous())
            .map_err(|e| err(format!("{}: {e}", names[0])))?;
        Ok(Linear {
            w,
            bias,
            out: out * names.len(),
        })
    }
}

impl Bert {
    /// Reads the encoder's weights from the bytes of `model.safetensors`.
    pub fn load(config: &Config, bytes: &[u8]) -> Result<Bert> {
        let c = config;
        let h = c.hidden_size;
        if h <= HIDDEN_MIN
            || h > HIDDEN_MAX
            || c.num_attention_heads == 0
            || !h.is_multiple_of(c.num_attention_heads)
            || c.num_hidden_layers > LAYERS_MAX
            || c.intermediate_size == 0
            || c.intermediate_size > 8 * HIDDEN_MAX
            || c.type_vocab_size == 0
        {
            return Err(Error::invalid(
                "embed model",
                format!(
                    "config.json: unsupported shape (hidden {h}, {} heads, {} layers, intermediate {})",
                    c.num_attention_heads, c.num_hidden_layers, c.intermediate_size
                ),
            ));
        }
        if let Some(p) = &c.position_embedding_type {
            if p != "absolute" {
                return Err(Error::invalid(
                    "embed model",
                    format!("config.json: position_embedding_type {p:?} (only absolute)"),
                ));
            }
        }
        let act = match c.hidden_act.as_str() {
            "gelu" => Act::GeluErf,
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Act::GeluTanh,
            "relu" => Act::Relu,
            other => {
                return Err(Error::invalid(
                    "embed model",
                    format!("config.json: hidden_act {other:?} is not supported"),
                ))
            }
        };
        let st = safetensors::SafeTensors::deserialize(bytes).map_err(err)?;
        let prefix = if st.tensor("embeddings.word_embeddings.weight").is_ok() {
            ""
        } else {
            "bert."
        };
        let w = Weights { st, prefix };
        let token_types = w.vec(
            "embeddings.token_type_embeddings.weight",
            &[c.type_vocab_size, h],
        )?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            let att = format!("{p}.attention.self");
            layers.push(Layer {
                qkv: w.linear(
                    &[
                        &format!("{att}.query"),
                        &format!("{att}.key"),
                        &format!("{att}.value"),
                    ],
                    h,
                    h,
                )?,
                attn_out: w.linear(&[&format!("{p}.attention.output.dense")], h, h)?,
                attn_norm: w.norm(&format!("{p}.attention.output.LayerNorm"), h)?,
                up: w.linear(
                    &[&format!("{p}.intermediate.dense")],
                    c.intermediate_size,
                    h,
                )?,
                down: w.linear(&[&format!("{p}.output.dense")], h, c.intermediate_size)?,
                out_norm: w.norm(&format!("{p}.output.LayerNorm"), h)?,
            });
        }
        Ok(Bert {
            hidden: h,
            heads: c.num_attention_heads,
            eps: c.layer_norm_eps as f32,
            act,
            vocab: c.vocab_size,
            positions: c.max_position_embeddings,
            word: w.vec("embeddings.word_embeddings.weight", &[c.vocab_size, h])?,
            position: w.vec(
                "embeddings.position_embeddings.weight",
                &[c.max_position_embeddings, h],
            )?,
            token_type0: token_types[..h].to_vec(),
            emb_norm: w.norm("embeddings.LayerNorm", h)?,
            layers,
        })
    }

    /// The hidden size (the vectors' dimension).
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// The last layer's token vectors of each text, stacked: row `r` of text `t` is at
    /// `(start(t) + r) × hidden`, texts in order. Every id list must be non-empty,
    /// within the vocabulary and the position table.
    pub fn forward(&self, texts: &[Vec<u32>]) -> Result<Vec<f32>> {
        let h = self.hidden;
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        for ids in texts {
            if ids.is_empty() || ids.len() > self.positions {
                return Err(Error::invalid(
                    "embed model",
                    format!("{} tokens (1 to {} allowed)", ids.len(), self.positions),
                ));
            }
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.vocab) {
                return Err(Error::invalid(
                    "embed model",
                    format!("token id {bad} outside the vocabulary of {}", self.vocab),
                ));
            }
        }
        let rows: usize = texts.iter().map(Vec::len).sum();
        let mut x = vec![0f32; rows * h];
        let mut r = 0;
        for ids in texts {
            for (pos, &id) in ids.iter().enumerate() {
                let row = &mut x[r * h..(r + 1) * h];
                let word = &self.word[id as usize * h..(id as usize + 1) * h];
                let p = &self.position[pos * h..(pos + 1) * h];
                for k in 0..h {
                    row[k] = word[k] + self.token_type0[k] + p[k];
                }
                layer_norm(row, &self.emb_norm, self.eps);
                r += 1;
            }
        }
        let mut ctx = vec![0f32; rows * h];
        for layer in &self.layers {
            // Products are read in place from candle's storage (no copy out).
            let qkv = product(x.clone(), rows, &layer.qkv)?;
            with_slice(&qkv, |qkv| {
                self.attention(texts, qkv, &layer.qkv.bias, &mut ctx)
            })?;
            let a = product(ctx.clone(), rows, &layer.attn_out)?;
            with_slice(&a, |a| {
                residual_norm(&mut x, a, &layer.attn_out.bias, &layer.attn_norm, self.eps)
            })?;
            let up = product(x.clone(), rows, &layer.up)?;
            let mut up = with_slice(&up, <[f32]>::to_vec)?;
            for row in up.chunks_exact_mut(layer.up.out) {
                activate(self.act, row, &layer.up.bias);
            }
            let down = product(up, rows, &layer.down)?;
            with_slice(&down, |d| {
                residual_norm(&mut x, d, &layer.down.bias, &layer.out_norm, self.eps)
            })?;
        }
        Ok(x)
    }

    /// Self-attention of every text on its own rows: `qkv` holds each row's query, key
    /// and value without `bias`, `ctx` receives each row's context vector.
    fn attention(&self, texts: &[Vec<u32>], qkv: &[f32], bias: &[f32], ctx: &mut [f32]) {
        let h = self.hidden;
        let d = h / self.heads;
        let scale = 1.0 / (d as f32).sqrt();
        let mut start = 0;
        let mut keys: Vec<f32> = Vec::new();
        let mut values: Vec<f32> = Vec::new();
        let mut p: Vec<f32> = Vec::new();
        let mut q: Vec<f32> = Vec::with_capacity(d);
        for ids in texts {
            let n = ids.len();
            let row = |r: usize| &qkv[(start + r) * 3 * h..(start + r + 1) * 3 * h];
            for off in (0..h).step_by(d) {
                // This head's keys and values of the text, contiguous.
                keys.clear();
                values.clear();
                let with_bias = |out: &mut Vec<f32>, r: usize, at: usize| {
                    let v = &row(r)[at..at + d];
                    out.extend(v.iter().zip(&bias[at..at + d]).map(|(v, b)| v + b));
                };
                for r in 0..n {
                    with_bias(&mut keys, r, h + off);
                    with_bias(&mut values, r, 2 * h + off);
                }
                for i in 0..n {
                    q.clear();
                    with_bias(&mut q, i, off);
                    p.clear();
                    p.extend(keys.chunks_exact(d).map(|k| super::dot(&q, k) * scale));
                    let max = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    for s in p.iter_mut() {
                        *s = exp(*s - max);
                    }
                    let sum = lanes_sum(p.iter().copied());
                    let out = &mut ctx[(start + i) * h + off..(start + i) * h + off + d];
                    out.fill(0.0);
                    for (w, v) in p.iter().zip(values.chunks_exact(d)) {
                        let w = w / sum;
                        for k in 0..d {
                            out[k] += w * v[k];
                        }
                    }
                }
            }
            start += n;
        }
    }
}

/// `x` (rows × in, row-major) times the layer's weight: rows × out, without the bias.
/// One row is multiplied as two (a zero row added, its output dropped): gemm sends a
/// one-row product to its matrix-vector path, which sums in another order than the
/// blocked kernel every larger product uses, so a one-token text would get other bits
/// alone than in a batch.
fn product(mut x: Vec<f32>, rows: usize, l: &Linear) -> Result<Tensor> {
    let input = x.len() / rows.max(1);
    if rows == 1 {
        x.resize(2 * input, 0.0);
        return Tensor::from_vec(x, (2, input), &Device::Cpu)
            .and_then(|t| t.matmul(&l.w))
            .and_then(|t| t.narrow(0, 0, 1))
            .map_err(cerr);
    }
    Tensor::from_vec(x, (rows, input), &Device::Cpu)
        .and_then(|t| t.matmul(&l.w))
        .map_err(cerr)
}

/// Calls `f` with the f32 contents of a contiguous CPU tensor, read in place.
fn with_slice<T>(t: &Tensor, f: impl FnOnce(&[f32]) -> T) -> Result<T> {
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        return Err(cerr(candle_core::Error::Msg("not a CPU tensor".into())));
    };
    let all = cpu.as_slice::<f32>().map_err(cerr)?;
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(f(&all[start..end])),
        None => Err(cerr(candle_core::Error::Msg("not contiguous".into()))),
    }
}

/// `x += out + bias` row by row, then each row's layer norm.
fn residual_norm(x: &mut [f32], out: &[f32], bias: &[f32], norm: &Norm, eps: f32) {
    let h = bias.len();
    for (row, o) in x.chunks_exact_mut(h).zip(out.chunks_exact(h)) {
        for k in 0..h {
            row[k] += o[k] + bias[k];
        }
        layer_norm(row, norm, eps);
    }
}

/// Layer norm of one row in place (mean and variance in f32, like PyTorch's CPU kernel
/// for f32 inputs; the sums in eight lanes, a fixed order).
fn layer_norm(row: &mut [f32], n: &Norm, eps: f32) {
    let len = row.len() as f32;
    let mean = lanes_sum(row.iter().copied()) / len;
    let var = lanes_sum(row.iter().map(|v| (v - mean) * (v - mean))) / len;
    let inv = 1.0 / (var + eps).sqrt();
    for ((v, g), b) in row.iter_mut().zip(&n.gamma).zip(&n.beta) {
        *v = (*v - mean) * inv * g + b;
    }
}

/// A sum in eight interleaved lanes (vectorisable, and a fixed order).
fn lanes_sum(it: impl Iterator<Item = f32>) -> f32 {
    let mut acc = [0f32; 8];
    for (i, v) in it.enumerate() {
        acc[i % 8] += v;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// The activation of one row in place, after adding the bias.
fn activate(act: Act, row: &mut [f32], bias: &[f32]) {
    match act {
        Act::GeluErf => {
            for (x, b) in row.iter_mut().zip(bias) {
                let v = *x + b;
                *x = 0.5 * v * (1.0 + erf(v * std::f32::consts::FRAC_1_SQRT_2));
            }
        }
        Act::GeluTanh => {
            let c = (2.0 / std::f32::consts::PI).sqrt();
            for (x, b) in row.iter_mut().zip(bias) {
                let v = *x + b;
                *x = 0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh());
            }
        }
        Act::Relu => {
            for (x, b) in row.iter_mut().zip(bias) {
                *x = (*x + b).max(0.0);
            }
        }
    }
}

/// The error function, Abramowitz and Stegun 7.1.26 (absolute error 1.5e-7 in exact
/// arithmetic, about 5e-7 in f32), as
/// PyTorch's vectorised CPU `erf` computes it.
#[inline(always)]
fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let r = ((((1.061_405_4 * t - 1.453_152_1) * t + 1.421_413_8) * t - 0.284_496_72) * t
        + 0.254_829_6)
        * t;
    (1.0 - r * exp(-a * a)).copysign(x)
}

/// e^x in f32 without a call into libm, so loops over rows vectorise: x = n·ln 2 + r,
/// e^r by its degree-6 polynomial on |r| <= ln 2 / 2 (relative error about 2e-7), 2^n
/// put in the exponent bits. x is clamped to [-87, 88], so the result is always a
/// finite normal number (the softmax and the GELU only need e^x for x <= 0).
#[inline(always)]
fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    // Round to nearest by the 1.5 * 2^23 trick (no call to `round`).
    const SHIFT: f32 = 12_582_912.0;
    let n = (x * std::f32::consts::LOG2_E + SHIFT) - SHIFT;
    let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (0.166_666_67
                    + r * (0.041_666_668 + r * (0.008_333_334 + r * 0.001_388_889)))));
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_is_within_its_bound() {
        // Reference values of erf (to 10 digits).
        let cases = [
            (0.0f32, 0.0f64),
            (0.1, 0.1124629160),
            (0.5, 0.5204998778),
            (1.0, 0.8427007929),
            (-1.0, -0.8427007929),
            (2.0, 0.9953222650),
            (-3.0, -0.9999779095),
            (6.0, 1.0),
        ];
        for (x, want) in cases {
            let got = erf(x) as f64;
            assert!((got - want).abs() < 4e-7, "erf({x}) = {got}, want {want}");
        }
    }

    #[test]
    fn exp_is_close_to_libm() {
        let mut worst = 0f64;
        for i in 0..=20_000 {
            let x = -87.0 + i as f32 * (87.0 + 10.0) / 20_000.0;
            let want = (x as f64).exp();
            let rel = ((exp(x) as f64 - want) / want).abs();
            worst = worst.max(rel);
        }
        assert!(worst < 1e-6, "worst relative error {worst}");
        assert_eq!(exp(-200.0), exp(-87.0));
    }

    #[test]
    fn layer_norm_centres_and_scales() {
        let n = Norm {
            gamma: vec![1.0; 4],
            beta: vec![0.5; 4],
        };
        let mut row = [1.0f32, 2.0, 3.0, 4.0];
        layer_norm(&mut row, &n, 1e-12);
        let mean: f32 = row.iter().sum::<f32>() / 4.0;
        assert!((mean - 0.5).abs() < 1e-6);
        let var: f32 = row.iter().map(|v| (v - 0.5) * (v - 0.5)).sum::<f32>() / 4.0;
        assert!((var - 1.0).abs() < 1e-5);
    }
}
