//! [`Graph`]: approximate nearest neighbours of a finding among one scope's kept wordings,
//! once the scope is too large for brute force (a hierarchical navigable small-world
//! graph, Malkov and Yashunin 2016).
//!
//! CONTRACT:
//! - Nodes are the scope's vectors, numbered `0..n` in the order they were added. The
//!   graph holds its links and an 8-bit copy of each vector ([`Codes`]); the floats stay
//!   in the scope's one array (`ScopeVectors::data`), which `insert` and `search` borrow.
//! - Deterministic: the graph is a function of the vectors and the order they were
//!   inserted in, nothing else. A node's level comes from a hash of its number, not from
//!   a random generator; the walk's similarities are integer sums of the codes (exact,
//!   whatever the order), the answers' are [`embed::dot`] (fixed summation order); ties
//!   between equal similarities go to the lower node. Insertion is sequential, and
//!   linking a node that was just searched for reuses that walk, which is the walk
//!   linking would make (`a_search_before_linking_gives_the_same_graph`). So the same
//!   vectors inserted in the same order give the same graph and the same answers on
//!   every machine, run and thread count (the deduper keeps the insertion order across
//!   restarts: see `Deduper::add_vector` and `findings::restore`).
//! - Approximate: [`Graph::search`] may miss a true neighbour; `tests` measure its
//!   recall against brute force. The walk runs on the codes (one scale per vector: a
//!   quarter of the bytes of the floats; the walk was 58 % of a warm 100,000-event
//!   synth, stalled on loading vectors), and the nodes it finds are scored again with
//!   the floats: the similarities `search` returns are exact. The deduper uses brute
//!   force (exact) while a scope holds at most `SemanticConfig::exact_max` wordings, so
//!   small memories never meet the approximation.
//!
//! Why not a crate: the Rust HNSW crates draw levels from a thread-local random generator
//! and some insert in parallel, so the same input can give another graph; the deduper's
//! answers must be the same bits on every run and after a restore (the synthesizer's
//! crash-safety rests on it). This is the textbook algorithm with the neighbour-selection
//! heuristic, in about 300 lines.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::embed;

/// Links per node on the upper levels.
const M: usize = 16;
/// Links per node on level 0 (the dense level holds every node).
const M0: usize = 2 * M;
/// Candidates kept while linking a new node: the breadth the deduper searches with
/// (`SemanticConfig::ann_ef`), so that linking a node the deduper has just searched for
/// reuses that search ([`Graph::insert`]).
const EF_BUILD: usize = 96;
/// How far below the caller's floor an approximate (8-bit) similarity may be and still be
/// scored exactly: the codes' error on a dot product of unit vectors is about 1e-3.
const MARGIN: f32 = 0.03;
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
    /// Level 0's links, [`STRIDE0`] slots a node: the count, then the links. Flat, so a
    /// step of the walk reads one place in memory, not three (node, level, list).
    level0: Vec<u32>,
    /// Per node, its links on levels 1 and up (empty for most nodes).
    upper: Vec<Vec<Vec<u32>>>,
    /// The node on the top level where every search starts.
    entry: u32,
    /// The top level.
    top: usize,
    /// Every node's vector in 8-bit integers, `dim` each, in node order ([`Codes`]).
    codes: Codes,
    /// The last search's walk on level 0, for [`Graph::insert`] (the deduper searches a
    /// finding's neighbours, then links it when it is kept: the same walk).
    last: std::sync::Mutex<Option<Walk>>,
}

/// A search's walk on level 0: the graph's size and the query's code when it was made,
/// its breadth, and the nodes it found (by the codes' similarities).
struct Walk {
    nodes: usize,
    code: Vec<i8>,
    scale: f32,
    ef: usize,
    found: Vec<Near>,
}

/// Vectors quantised to `i8`: `v[i] ≈ code[i] × scale`, one scale per vector (its largest
/// magnitude over 127), so the dot product of two is an exact integer sum times the
/// product of their scales.
#[derive(Default)]
struct Codes {
    dim: usize,
    codes: Vec<i8>,
    scales: Vec<f32>,
}

/// A vector in [`Codes`]' form.
struct Code {
    code: Vec<i8>,
    scale: f32,
}

fn quantise(v: &[f32]) -> Code {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if max == 0.0 || !max.is_finite() {
        return Code {
            code: vec![0; v.len()],
            scale: 0.0,
        };
    }
    let k = 127.0 / max;
    Code {
        code: v
            .iter()
            .map(|x| (x * k).round().clamp(-127.0, 127.0) as i8)
            .collect(),
        scale: max / 127.0,
    }
}

/// The exact integer dot product of two codes (any summation order gives the same sum:
/// the compiler vectorises it freely). At most 127² × 8192 dimensions: no overflow.
/// Compiled for the CPU's best vector instructions, chosen at run time
/// ([`embed::simd`]): the sum is exact, so every choice gives the same result.
fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    debug_assert_eq!(a.len(), b.len());
    embed::simd(
        #[inline(always)]
        || {
            a.iter()
                .zip(b)
                .map(|(&x, &y)| i32::from(x) * i32::from(y))
                .sum()
        },
    )
}

impl Codes {
    fn push(&mut self, v: &[f32]) {
        self.dim = v.len();
        let c = quantise(v);
        self.codes.extend_from_slice(&c.code);
        self.scales.push(c.scale);
    }

    /// Reads one byte of every cache line of the codes of `nodes`, all before any is
    /// used: the loads are independent, so the CPU fetches the lines in parallel (a
    /// prefetch without `unsafe`). The dot products that follow then find them in its
    /// first-level cache; computed one by one, each waited for its own lines from the
    /// last-level cache or memory (the walk's main cost).
    fn touch(&self, nodes: &[u32]) {
        let mut x = 0u8;
        for &k in nodes {
            let at = k as usize * self.dim;
            for b in self.codes[at..at + self.dim].iter().step_by(64) {
                x ^= *b as u8;
            }
        }
        std::hint::black_box(x);
    }

    /// The approximate similarity of `q` to node `k`.
    fn sim(&self, q: &Code, k: u32) -> f32 {
        let at = k as usize * self.dim;
        dot_i8(&q.code, &self.codes[at..at + self.dim]) as f32 * (q.scale * self.scales[k as usize])
    }

    /// The approximate similarity of nodes `a` and `b`.
    fn sim2(&self, a: u32, b: u32) -> f32 {
        let (x, y) = (a as usize * self.dim, b as usize * self.dim);
        dot_i8(&self.codes[x..x + self.dim], &self.codes[y..y + self.dim]) as f32
            * (self.scales[a as usize] * self.scales[b as usize])
    }

    fn code(&self, k: u32) -> Code {
        let at = k as usize * self.dim;
        Code {
            code: self.codes[at..at + self.dim].to_vec(),
            scale: self.scales[k as usize],
        }
    }
}

/// Slots of a node's level-0 list in [`Graph::level0`]: its count and room for
/// `M0 + M0 / 2` links (a list grows by half before it is cut: `Graph::insert`).
const STRIDE0: usize = 1 + M0 + M0 / 2;

/// The vector of node `k` in `data` (`dim` floats each).
fn vector(data: &[f32], dim: usize, k: u32) -> &[f32] {
    &data[k as usize * dim..(k as usize + 1) * dim]
}

impl Graph {
    /// Number of nodes linked.
    pub(crate) fn len(&self) -> usize {
        self.upper.len()
    }

    /// Every node's links, per level (for tests comparing two graphs).
    #[cfg(test)]
    pub(crate) fn links(&self) -> Vec<Vec<Vec<u32>>> {
        (0..self.len() as u32)
            .map(|k| {
                (0..=self.upper[k as usize].len())
                    .map(|l| self.links_of(k, l).to_vec())
                    .collect()
            })
            .collect()
    }

    /// The links of node `k` on `level`.
    fn links_of(&self, k: u32, level: usize) -> &[u32] {
        if level == 0 {
            let at = k as usize * STRIDE0;
            &self.level0[at + 1..at + 1 + self.level0[at] as usize]
        } else {
            &self.upper[k as usize][level - 1]
        }
    }

    /// Replaces the links of node `k` on `level`.
    fn set_links(&mut self, k: u32, level: usize, links: &[u32]) {
        if level == 0 {
            let at = k as usize * STRIDE0;
            assert!(links.len() < STRIDE0, "level-0 list over its room");
            self.level0[at] = links.len() as u32;
            self.level0[at + 1..at + 1 + links.len()].copy_from_slice(links);
        } else {
            self.upper[k as usize][level - 1] = links.to_vec();
        }
    }

    /// From `from`, the nearest node on `level` by greedy steps.
    fn greedy(&self, q: &Code, mut from: Near, level: usize) -> Near {
        loop {
            let mut best = from;
            for &n in self.links_of(from.node, level) {
                let c = Near {
                    sim: self.codes.sim(q, n),
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

    /// The `ef` nearest nodes to `q` on `level` reachable from `entries`, nearest first
    /// (by the codes' similarities).
    fn search_level(&self, q: &Code, entries: &[Near], ef: usize, level: usize) -> Vec<Near> {
        let mut visited = Visited::new(self.len());
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
        let mut fresh: Vec<u32> = Vec::new();
        while let Some(c) = todo.pop() {
            let worst = found.peek().map(|r| r.0);
            if found.len() >= ef && worst.is_some_and(|w| c < w) {
                break;
            }
            fresh.clear();
            fresh.extend(
                self.links_of(c.node, level)
                    .iter()
                    .copied()
                    .filter(|&n| visited.insert(n)),
            );
            self.codes.touch(&fresh);
            for &n in &fresh {
                let near = Near {
                    sim: self.codes.sim(q, n),
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
    fn select(&self, candidates: &[Near], m: usize) -> Vec<u32> {
        let mut kept: Vec<Near> = Vec::with_capacity(m);
        let mut skipped: Vec<u32> = Vec::new();
        for &c in candidates {
            if kept.len() == m {
                break;
            }
            if kept.iter().all(|r| self.codes.sim2(c.node, r.node) < c.sim) {
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

    /// Gives node `k` its links `mine` on level `l`, and links each of them back to it
    /// (cutting a list that grew past its room).
    fn link(&mut self, k: u32, l: usize, mine: &[u32]) {
        let most = if l == 0 { M0 } else { M };
        for &n in mine {
            let mut theirs = self.links_of(n, l).to_vec();
            theirs.push(k);
            // A full list grows by half before the heuristic cuts it back to `most`:
            // the cut costs a dot product per pair of links, and done on every
            // insertion it was most of a large synth's time (60 % at 100,000
            // events); every `most / 2` insertions it is a few per cent, and the
            // longer lists in between find a little more.
            if theirs.len() > most + most / 2 {
                let mut cands: Vec<Near> = theirs
                    .iter()
                    .map(|&x| Near {
                        sim: self.codes.sim2(n, x),
                        node: x,
                    })
                    .collect();
                cands.sort_unstable_by(|a, b| b.cmp(a));
                theirs = self.select(&cands, most);
            }
            self.set_links(n, l, &theirs);
        }
        self.set_links(k, l, mine);
    }

    /// Links node `k`, the next one (`k == self.len()`), whose vector is in `data`.
    pub(crate) fn insert(&mut self, k: u32, data: &[f32], dim: usize) {
        debug_assert_eq!(k as usize, self.len());
        self.codes.push(vector(data, dim, k));
        let level = level_of(k);
        self.upper.push(vec![Vec::new(); level]);
        self.level0.resize(self.level0.len() + STRIDE0, 0);
        if k == 0 {
            self.entry = 0;
            self.top = level;
            return;
        }
        let q = self.codes.code(k);
        // A node of level 0 walks as a search does (greedy down to level 1, then level 0
        // with the same breadth): the last search's walk, if it was this node's, is that
        // walk, the same nodes bit for bit (the graph has not changed since).
        let walked = match self.last.get_mut().ok().and_then(Option::take) {
            Some(w)
                if level == 0
                    && w.nodes == k as usize
                    && w.ef == EF_BUILD
                    && w.scale.to_bits() == q.scale.to_bits()
                    && w.code == q.code =>
            {
                Some(w.found)
            }
            _ => None,
        };
        if let Some(found) = walked {
            let mine = self.select(&found, M);
            self.link(k, 0, &mine);
            return;
        }
        let mut ep = Near {
            sim: self.codes.sim(&q, self.entry),
            node: self.entry,
        };
        for l in (level + 1..=self.top).rev() {
            ep = self.greedy(&q, ep, l);
        }
        let mut entries = vec![ep];
        for l in (0..=level.min(self.top)).rev() {
            let found = self.search_level(&q, &entries, EF_BUILD, l);
            let mine = self.select(&found, M);
            self.link(k, l, &mine);
            entries = found;
        }
        if level > self.top {
            self.top = level;
            self.entry = k;
        }
    }

    /// The (about) `ef` nearest nodes to `q`, nearest first, with their exact
    /// similarities ([`embed::dot`] over `data`, the floats the graph was built from).
    /// Nodes whose approximate similarity is below `min - MARGIN` are dropped unscored
    /// (the caller wants none below `min`; the codes' error is far within the margin).
    pub(crate) fn search(
        &self,
        q: &[f32],
        ef: usize,
        min: f32,
        data: &[f32],
        dim: usize,
    ) -> Vec<Near> {
        if self.upper.is_empty() {
            return Vec::new();
        }
        let code = quantise(q);
        let mut ep = Near {
            sim: self.codes.sim(&code, self.entry),
            node: self.entry,
        };
        for l in (1..=self.top).rev() {
            ep = self.greedy(&code, ep, l);
        }
        let mut out = self.search_level(&code, &[ep], ef, 0);
        if let Ok(mut last) = self.last.lock() {
            *last = Some(Walk {
                nodes: self.len(),
                code: code.code.clone(),
                scale: code.scale,
                ef,
                found: out.clone(),
            });
        }
        out.retain(|n| n.sim >= min - MARGIN);
        // Every float vector's lines asked for before the first is used (see
        // `Codes::touch`): these are scattered over a scope's whole array.
        let mut x = 0f32;
        for n in &out {
            x += vector(data, dim, n.node).iter().step_by(16).sum::<f32>();
        }
        std::hint::black_box(x);
        for n in &mut out {
            n.sim = embed::dot(q, vector(data, dim, n.node));
        }
        out.sort_unstable_by(|a, b| b.cmp(a));
        out
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
                .search(q, 96, -1.0, &data, dim)
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
        assert_eq!(a.links(), b.links());
        assert_eq!((a.entry, a.top), (b.entry, b.top));
        let q = &data[..dim];
        assert_eq!(
            a.search(q, 50, -1.0, &data, dim),
            b.search(q, 50, -1.0, &data, dim)
        );
        // Results are nearest first, ties to the lower node.
        let r = a.search(q, 50, -1.0, &data, dim);
        assert!(r.windows(2).all(|w| w[0] >= w[1]));
        assert_eq!(r[0].node, 0);
    }

    #[test]
    fn a_search_before_linking_gives_the_same_graph() {
        // The deduper searches a finding, then links it: the insert reuses that walk.
        // Searching first (with the linking breadth, with another breadth, or for
        // another vector) must leave the graph exactly as plain insertions make it.
        let dim = 48;
        let data = clustered(3_000, dim, 60, 0.7, 11);
        let plain = build(&data, dim);
        let mut searched = Graph::default();
        for k in 0..data.len() / dim {
            let v = &data[k * dim..(k + 1) * dim];
            match k % 3 {
                0 => drop(searched.search(v, EF_BUILD, -1.0, &data, dim)),
                1 => drop(searched.search(v, EF_BUILD / 2, -1.0, &data, dim)),
                _ => drop(searched.search(&data[..dim], EF_BUILD, -1.0, &data, dim)),
            }
            searched.insert(k as u32, &data, dim);
        }
        assert_eq!(plain.links(), searched.links());
        assert_eq!((plain.entry, plain.top), (searched.entry, searched.top));
    }

    #[test]
    fn codes_keep_similarities_within_a_hundredth() {
        let dim = 384;
        let data = clustered(400, dim, 20, 0.9, 5);
        let mut codes = Codes::default();
        for v in data.chunks_exact(dim) {
            codes.push(v);
        }
        let mut worst = 0f32;
        for a in 0..400u32 {
            let b = (a * 7 + 3) % 400;
            let exact = embed::dot(vector(&data, dim, a), vector(&data, dim, b));
            worst = worst.max((codes.sim2(a, b) - exact).abs());
            let q = quantise(vector(&data, dim, a));
            assert_eq!(codes.sim(&q, b), codes.sim2(a, b));
        }
        assert!(worst < 0.01, "{worst}");
        assert!(worst < MARGIN / 3.0, "{worst}");
        // A zero vector has a zero code and scale: every similarity 0.
        let z = quantise(&[0.0; 8]);
        assert_eq!((z.scale, z.code.iter().all(|&c| c == 0)), (0.0, true));
    }
}
