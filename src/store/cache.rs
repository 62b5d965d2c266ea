//! [`Bounded`]: a store's per-run caches (writers, indexes, head states, hand-off routes)
//! hold at most a fixed number of runs. A long-lived store (`swarm serve`) that meets
//! many runs kept every one's writer (four descriptors), index (a descriptor per
//! segment), head state and committer (a thread and its sockets) for life: the process
//! ran out of descriptors or memory at some number of runs. Past the bound, the least
//! recently used entries that nobody holds are dropped; an entry in use is never
//! dropped (the cache then stays over its bound until one is free). Each of these
//! caches is rebuilt from the files when its run is met again, as a new process would.
//!
//! Invariant: dropping an entry changes no answer, only the cost of the next one.

use std::collections::HashMap;

/// Runs a store keeps open at once by default ([`crate::Store::with_open_runs_max`]).
pub const OPEN_RUNS_MAX_DEFAULT: usize = 256;

/// A map from run to `V` of at most `max` entries (past which idle ones are dropped,
/// least recently used first).
pub(crate) struct Bounded<V> {
    map: HashMap<String, (V, u64)>,
    tick: u64,
    max: usize,
}

impl<V: Clone> Bounded<V> {
    pub(crate) fn new(max: usize) -> Bounded<V> {
        Bounded {
            map: HashMap::new(),
            tick: 0,
            max: max.max(1),
        }
    }

    /// The entry of `run`, marked as used now.
    pub(crate) fn get(&mut self, run: &str) -> Option<V> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(run).map(|(v, used)| {
            *used = tick;
            v.clone()
        })
    }

    /// The entry of `run`, not marked as used.
    pub(crate) fn peek(&self, run: &str) -> Option<&V> {
        self.map.get(run).map(|(v, _)| v)
    }

    pub(crate) fn contains_key(&self, run: &str) -> bool {
        self.map.contains_key(run)
    }

    pub(crate) fn remove(&mut self, run: &str) -> Option<V> {
        self.map.remove(run).map(|(v, _)| v)
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.map.values().map(|(v, _)| v)
    }

    pub(crate) fn drain(&mut self) -> Vec<V> {
        self.map.drain().map(|(_, (v, _))| v).collect()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Puts `v` for `run`. Over the bound, drops entries `idle` says nobody uses, least
    /// recently used first, down to three quarters of the bound (so that the scan is
    /// paid once per quarter of it), never `run`'s. Returns what it dropped (and what
    /// `run` held before), for the caller to drop after it lets its lock go: dropping a
    /// writer may flush it, and stopping a committer waits for its thread.
    #[must_use = "drop the evicted entries outside the cache's lock"]
    pub(crate) fn insert(&mut self, run: &str, v: V, idle: impl Fn(&V) -> bool) -> Vec<V> {
        self.tick += 1;
        let mut out: Vec<V> = self
            .map
            .insert(run.to_string(), (v, self.tick))
            .map(|(old, _)| old)
            .into_iter()
            .collect();
        if self.map.len() <= self.max {
            return out;
        }
        let keep = self.max - self.max / 4;
        let mut idle: Vec<(u64, String)> = self
            .map
            .iter()
            .filter(|(k, (v, _))| k.as_str() != run && idle(v))
            .map(|(k, (_, used))| (*used, k.clone()))
            .collect();
        idle.sort_unstable();
        let over = self.map.len().saturating_sub(keep);
        for (_, k) in idle.into_iter().take(over) {
            out.extend(self.map.remove(&k).map(|(v, _)| v));
        }
        out
    }

    /// Changes the bound (entries over it go at the next insert).
    pub(crate) fn set_max(&mut self, max: usize) {
        self.max = max.max(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Past the bound the least recently used idle entries go, down to three quarters
    /// of it; an entry in use (held outside the cache) and the one just put stay.
    #[test]
    fn drops_the_least_recently_used_idle_entries() {
        let mut c: Bounded<Arc<u32>> = Bounded::new(8);
        let idle = |v: &Arc<u32>| Arc::strong_count(v) == 1;
        for i in 0..8 {
            assert!(c.insert(&format!("r{i}"), Arc::new(i), idle).is_empty());
        }
        let held = c.get("r0").unwrap(); // the oldest, but in use
        assert!(c.get("r1").is_some()); // used again: now among the newest
        let dropped = c.insert("r8", Arc::new(8), idle);
        let mut dropped: Vec<u32> = dropped.iter().map(|v| **v).collect();
        dropped.sort_unstable();
        assert_eq!(dropped, vec![2, 3, 4]);
        assert_eq!(c.len(), 6);
        for k in ["r0", "r1", "r5", "r6", "r7", "r8"] {
            assert!(c.contains_key(k), "{k}");
        }
        drop(held);
        // Every entry in use: the cache stays over its bound.
        let mut all: Vec<Arc<u32>> = ["r0", "r1", "r5", "r6", "r7", "r8"]
            .iter()
            .map(|k| c.get(k).unwrap())
            .collect();
        for i in 9..12 {
            let v = Arc::new(i);
            all.push(v.clone());
            assert!(c.insert(&format!("r{i}"), v, idle).is_empty());
        }
        assert_eq!(c.len(), 9);
        // Free again: the next insert goes down to three quarters, oldest first.
        drop(all);
        let dropped = c.insert("r12", Arc::new(12), idle);
        let mut dropped: Vec<u32> = dropped.iter().map(|v| **v).collect();
        dropped.sort_unstable();
        assert_eq!(dropped, vec![0, 1, 5, 6]);
        assert_eq!(c.len(), 6);
        assert!(c.contains_key("r12"));
    }
}
