//! [`Graph`]: approximate nearest neighbours of a finding among one scope's kept wordings,
//! once the scope is too large for brute force (a hierarchical navigable small-world
//! graph, Malkov and Yashunin 2016).
//!
//! CONTRACT:
//! - Nodes are the scope's vectors, numbered `0..n` in the order they were added; the
//!   graph holds links only, the vectors stay in the scope's one array
//!   (`ScopeVectors::data`), which every call borrows.
//! - Deterministic: the graph is a function of the vectors and the order they were
//!   inserted in, nothing else. A node's level comes from a hash of its number, not from
//!   a random generator; every similarity is [`embed::dot`] (fixed summation order); ties
//!   between equal similarities go to the lower node. Insertion is sequential. So the
//!   same vectors inserted in the same order give the same graph and the same answers on
//!   every machine, run and thread count (the deduper keeps the insertion order across
//!   restarts: see `Deduper::add_vector` and `findings::restore`).
//! - Approximate: [`Graph::search`] may miss a true neighbour; `tests` measure its
//!   recall against brute force. The deduper uses brute force (exact) while a scope holds
//!   at most `SemanticConfig::exact_max` wordings, so small memories never meet the
//!   approximation.
//!
//! Why not a crate: the Rust HNSW crates draw levels from a thread-local random generator
//! and some insert in parallel, so the same input can give another graph; the deduper's
//! answers must be the same bits on every run and after a restore (the synthesizer's
//! crash-safety rests on it). This is the textbook algorithm with the neighbour-selection
//! heuristic, in about 200 lines.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::embed;

/// Links per node on the upper levels.
const M: usize = 16;
/// Links per node on level 0 (the dense level holds every node).
const M0: usize = 2 * M;
/// Candidates kept while linking a new node.
const EF_BUILD: usize = 80;
/// Highest level a node can get (the level distribution makes level 12 a 1-in-16^12
/// event; the cap bounds memory against a pathological hash).
const LEVEL_MAX: usize = 12;

/// A node with its similarity to the query: ordered by similarity, then the lower node
/// first (`a > b` means `a` is nearer, or as near with a lower number).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Near {
    pub(crate) sim: f32,
    pub(crate) node: u32,
}

impl Eq for Near {}

impl Ord for Near {
    fn cmp(&self, o: &Near) -> Ordering {
        self.sim
            .total_cmp(&o.sim)
            .then_with(|| o.node.cmp(&self.node))
    }
}

impl PartialOrd for Near {
    fn partial_cmp(&self, o: &Near) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// The level of node `k`: geometric with ratio 1/M, from a hash of `k` (splitmix64).
fn level_of(k: u32) -> usize {
    let mut z = u64::from(k).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    // Uniform in (0, 1): 53 bits, never 0.
    let u = ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let level = (-u.ln() / (M as f64).ln()).floor();
    (level as usize).min(LEVEL_MAX)
}

/// A set of visited nodes, one bit each.
struct Visited(Vec<u64>);

impl Visited {
    fn new(n: usize) -> Visited {
        Visited(vec![0; n.div_ceil(64)])
    }

    /// Marks `k`; whether it was new.
    fn insert(&mut self, k: u32) -> bool {
        let (w, b) = (k as usize / 64, 1u64 << (k % 64));
        let new = self.0[w] & b == 0;
        self.0[w] |= b;
        new
    }
}

/// The links of one scope's vectors.
#[derive(Default)]
pub(crate) struct Graph {
    /// Per node, its links on each of its levels (level 0 first).
    links: Vec<Vec<Vec<u32>>>,
    /// The node on the top level where every search starts.
    entry: u32,
    /// The top level.
    top: usize,
}

/// The vector of node `k` in `data` (`dim` floats each).
fn vector(data: &[f32], dim: usize, k: u32) -> &[f32] {
    &data[k as usize * dim..(k as usize + 1) * dim]
}

impl Graph {
    /// Number of nodes linked.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.links.len()
    }

    /// Every node's links (for tests comparing two graphs).
    #[cfg(test)]
    pub(crate) fn links(&self) -> &[Vec<Vec<u32>>] {
        &self.links
    }

    /// From `from`, the nearest node on `level` by greedy steps.
    fn greedy(&self, q: &[f32], mut from: Near, level: usize, data: &[f32], dim: usize) -> Near {
        loop {
            let mut best = from;
            for &n in &self.links[from.node as usize][level] {
                let c = Near {
                    sim: embed::dot(q, vector(data, dim, n)),
                    node: n,
                };
                if c > best {
                    best = c;
                }
            }
            if best == from {
                return from;
            }
            from = best;
        }
    }

    /// The `ef` nearest nodes to `q` on `level` reachable from `entries`, nearest first.
    fn search_level(
        &self,
        q: &[f32],
        entries: &[Near],
        ef: usize,
        level: usize,
        data: &[f32],
        dim: usize,
    ) -> Vec<Near> {
        let mut visited = Visited::new(self.links.len());
        let mut todo: BinaryHeap<Near> = BinaryHeap::new();
        let mut found: BinaryHeap<Reverse<Near>> = BinaryHeap::new();
        for &e in entries {
            if visited.insert(e.node) {
                todo.push(e);
                found.push(Reverse(e));
            }
        }
        while found.len() > ef {
            found.pop();
        }
        while let Some(c) = todo.pop() {
            let worst = found.peek().map(|r| r.0);
            if found.len() >= ef && worst.is_some_and(|w| c < w) {
                break;
            }
            for &n in &self.links[c.node as usize][level] {
                if !visited.insert(n) {
                    continue;
                }
                let near = Near {
                    sim: embed::dot(q, vector(data, dim, n)),
                    node: n,
                };
                let worst = found.peek().map(|r| r.0);
                if found.len() < ef || worst.is_some_and(|w| near > w) {
                    todo.push(near);
                    found.push(Reverse(near));
                    if found.len() > ef {
                        found.pop();
                    }
                }
            }
        }
        let mut out: Vec<Near> = found.into_iter().map(|r| r.0).collect();
        out.sort_unstable_by(|a, b| b.cmp(a));
        out
    }

    /// At most `m` of `candidates` (nearest first, similarities to the node being linked)
    /// by the heuristic: a candidate is kept when it is nearer to the node than to every
    /// one already kept (links that spread in several directions); the rest fill the
    /// remaining places, nearest first.
    fn select(candidates: &[Near], m: usize, data: &[f32], dim: usize) -> Vec<u32> {
        let mut kept: Vec<Near> = Vec::with_capacity(m);
        let mut skipped: Vec<u32> = Vec::new();
        for &c in candidates {
            if kept.len() == m {
                break;
            }
            let cv = vector(data, dim, c.node);
            if kept
                .iter()
                .all(|r| embed::dot(cv, vector(data, dim, r.node)) < c.sim)
            {
                kept.push(c);
            } else {
                skipped.push(c.node);
            }
        }
        let mut out: Vec<u32> = kept.into_iter().map(|c| c.node).collect();
        let room = m.saturating_sub(out.len());
        out.extend(skipped.into_iter().take(room));
        out
    }

    /// Links node `k`, the next one (`k == self.len()`), whose vector is in `data`.
    pub(crate) fn insert(&mut self, k: u32, data: &[f32], dim: usize) {
        debug_assert_eq!(k as usize, self.links.len());
        let level = level_of(k);
        self.links.push(vec![Vec::new(); level + 1]);
        if k == 0 {
            self.entry = 0;
            self.top = level;
            return;
        }
        let q = vector(data, dim, k);
        let mut ep = Near {
            sim: embed::dot(q, vector(data, dim, self.entry)),
            node: self.entry,
        };
        for l in (level + 1..=self.top).rev() {
            ep = self.greedy(q, ep, l, data, dim);
        }
        let mut entries = vec![ep];
        for l in (0..=level.min(self.top)).rev() {
            let found = self.search_level(q, &entries, EF_BUILD, l, data, dim);
            let mine = Graph::select(&found, M, data, dim);
            let most = if l == 0 { M0 } else { M };
            for &n in &mine {
                let theirs = &mut self.links[n as usize][l];
                theirs.push(k);
                // A full list grows by half before the heuristic cuts it back to `most`:
                // the cut costs a dot product per pair of links, and done on every
                // insertion it was most of a large synth's time (60 % at 100,000
                // events); every `most / 2` insertions it is a few per cent, and the
                // longer lists in between find a little more.
                if theirs.len() > most + most / 2 {
                    let nv = vector(data, dim, n);
                    let mut cands: Vec<Near> = theirs
                        .iter()
                        .map(|&x| Near {
                            sim: embed::dot(nv, vector(data, dim, x)),
                            node: x,
                        })
                        .collect();
                    cands.sort_unstable_by(|a, b| b.cmp(a));
                    self.links[n as usize][l] = Graph::select(&cands, most, data, dim);
                }
            }
            self.links[k as usize][l] = mine;
            entries = found;
        }
        if level > self.top {
            self.top = level;
            self.entry = k;
        }
    }

    /// The (about) `ef` nearest nodes to `q`, nearest first.
    pub(crate) fn search(&self, q: &[f32], ef: usize, data: &[f32], dim: usize) -> Vec<Near> {
        if self.links.is_empty() {
            return Vec::new();
        }
        let mut ep = Near {
            sim: embed::dot(q, vector(data, dim, self.entry)),
            node: self.entry,
        };
        for l in (1..=self.top).rev() {
            ep = self.greedy(q, ep, l, data, dim);
        }
        self.search_level(q, &[ep], ef, 0, data, dim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic generator (splitmix64) of points in clusters, like sentence
    /// embeddings: `clusters` random centres, each point a centre plus noise, normalised.
    fn clustered(n: usize, dim: usize, clusters: usize, noise: f32, seed: u64) -> Vec<f32> {
        let mut s = seed;
        let mut next = move || {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            ((z >> 11) as f64 / (1u64 << 53) as f64) as f32 * 2.0 - 1.0
        };
        let centres: Vec<f32> = (0..clusters * dim).map(|_| next()).collect();
        let mut out = Vec::with_capacity(n * dim);
        for i in 0..n {
            let c = &centres[(i % clusters) * dim..(i % clusters + 1) * dim];
            let mut v: Vec<f32> = c.iter().map(|x| x + noise * next()).collect();
            embed::l2_normalize(&mut v);
            out.extend_from_slice(&v);
        }
        out
    }

    fn exact(q: &[f32], data: &[f32], dim: usize, k: usize) -> Vec<u32> {
        let mut all: Vec<Near> = data
            .chunks_exact(dim)
            .enumerate()
            .map(|(i, v)| Near {
                sim: embed::dot(q, v),
                node: i as u32,
            })
            .collect();
        all.sort_unstable_by(|a, b| b.cmp(a));
        all.into_iter().take(k).map(|n| n.node).collect()
    }

    fn build(data: &[f32], dim: usize) -> Graph {
        let mut g = Graph::default();
        for k in 0..data.len() / dim {
            g.insert(k as u32, data, dim);
        }
        g
    }

    #[test]
    fn levels_are_geometric_and_fixed() {
        let levels: Vec<usize> = (0..100_000).map(level_of).collect();
        let above0 = levels.iter().filter(|&&l| l > 0).count();
        // P(level > 0) = 1/16.
        assert!((5_500..7_000).contains(&above0), "{above0}");
        assert!(levels.iter().all(|&l| l <= LEVEL_MAX));
        assert_eq!(levels, (0..100_000).map(level_of).collect::<Vec<_>>());
    }

    #[test]
    fn search_finds_the_true_neighbours() {
        // 6,000 points in 300 clusters of 20, 64 dimensions; queries are fresh points
        // of the same clusters: the 16 nearest by brute force must be found.
        let dim = 64;
        let data = clustered(6_000, dim, 300, 0.6, 7);
        let g = build(&data, dim);
        assert_eq!(g.len(), 6_000);
        let queries = clustered(300, dim, 300, 0.6, 99);
        let (mut hit, mut total) = (0usize, 0usize);
        for q in queries.chunks_exact(dim) {
            let truth = exact(q, &data, dim, 16);
            let got: Vec<u32> = g
                .search(q, 96, &data, dim)
                .iter()
                .take(16)
                .map(|n| n.node)
                .collect();
            hit += truth.iter().filter(|t| got.contains(t)).count();
            total += truth.len();
        }
        let recall = hit as f64 / total as f64;
        eprintln!("recall@16 {recall:.3}");
        assert!(recall >= 0.95, "recall@16 {recall:.3}");
    }

    #[test]
    fn the_same_insertions_give_the_same_graph_and_answers() {
        let dim = 32;
        let data = clustered(2_000, dim, 50, 0.8, 3);
        let (a, b) = (build(&data, dim), build(&data, dim));
        assert_eq!(a.links, b.links);
        assert_eq!((a.entry, a.top), (b.entry, b.top));
        let q = &data[..dim];
        assert_eq!(a.search(q, 50, &data, dim), b.search(q, 50, &data, dim));
        // Results are nearest first, ties to the lower node.
        let r = a.search(q, 50, &data, dim);
        assert!(r.windows(2).all(|w| w[0] >= w[1]));
        assert_eq!(r[0].node, 0);
    }
}
