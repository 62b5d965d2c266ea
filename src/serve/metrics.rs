//! The server's own counters, served at `/metrics` in the Prometheus text format:
//! requests by status, append latency (a histogram), events appended, live tail
//! subscribers and the ones closed for lagging.
//!
//! Plain atomics and one small mutex-guarded map: no metrics crate is worth its weight
//! for a handful of series, and the text format is a few lines.
//! Never reads or writes a run.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the append latency buckets, in microseconds.
const APPEND_BUCKETS_US: [u64; 12] = [
    250, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 250_000, 1_000_000, 5_000_000,
];

/// What the server counts.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<u16, u64>>,
    append_buckets: [AtomicU64; APPEND_BUCKETS_US.len()],
    append_count: AtomicU64,
    append_sum_us: AtomicU64,
    appended_events: AtomicU64,
    subscribers: AtomicU64,
    lagged: AtomicU64,
}

impl Metrics {
    /// Counts a response with `status`.
    pub fn request(&self, status: u16) {
        let mut m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry(status).or_default() += 1;
    }

    /// Counts an acknowledged append request of `events` events that took `took`.
    pub fn append(&self, events: usize, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        if let Some(i) = APPEND_BUCKETS_US.iter().position(|b| us <= *b) {
            self.append_buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.append_count.fetch_add(1, Ordering::Relaxed);
        self.append_sum_us.fetch_add(us, Ordering::Relaxed);
        self.appended_events
            .fetch_add(events as u64, Ordering::Relaxed);
    }

    /// A live tail subscriber started; the guard counts it until dropped.
    pub fn subscribe(self: &std::sync::Arc<Self>) -> Subscribed {
        self.subscribers.fetch_add(1, Ordering::Relaxed);
        Subscribed(self.clone())
    }

    /// A subscriber was closed because it read too slowly.
    pub fn lagged(&self) {
        self.lagged.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition of every series.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP swarm_http_requests_total HTTP responses by status."
        );
        let _ = writeln!(out, "# TYPE swarm_http_requests_total counter");
        let requests = self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for (status, n) in requests {
            let _ = writeln!(out, "swarm_http_requests_total{{status=\"{status}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP swarm_append_seconds Latency of acknowledged append requests."
        );
        let _ = writeln!(out, "# TYPE swarm_append_seconds histogram");
        let mut cumulative = 0;
        for (i, b) in APPEND_BUCKETS_US.iter().enumerate() {
            cumulative += self.append_buckets[i].load(Ordering::Relaxed);
            let le = *b as f64 / 1e6;
            let _ = writeln!(
                out,
                "swarm_append_seconds_bucket{{le=\"{le}\"}} {cumulative}"
            );
        }
        let count = self.append_count.load(Ordering::Relaxed);
        let _ = writeln!(out, "swarm_append_seconds_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.append_sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "swarm_append_seconds_sum {sum}");
        let _ = writeln!(out, "swarm_append_seconds_count {count}");
        for (name, help, kind, v) in [
            (
                "swarm_appended_events_total",
                "Events stored by acknowledged append requests.",
                "counter",
                &self.appended_events,
            ),
            (
                "swarm_tail_subscribers",
                "Live tail (SSE) subscribers connected now.",
                "gauge",
                &self.subscribers,
            ),
            (
                "swarm_tail_lagged_total",
                "Live tail subscribers closed because they read too slowly.",
                "counter",
                &self.lagged,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "{name} {}", v.load(Ordering::Relaxed));
        }
        out
    }
}

/// Counts one live tail subscriber while it lives.
#[derive(Debug)]
pub struct Subscribed(std::sync::Arc<Metrics>);

impl Subscribed {
    /// The subscriber is being closed because it read too slowly.
    pub fn lagged(&self) {
        self.0.lagged();
    }
}

impl Drop for Subscribed {
    fn drop(&mut self) {
        self.0.subscribers.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_count_every_append() {
        let m = std::sync::Arc::new(Metrics::default());
        m.append(1, Duration::from_micros(100));
        m.append(3, Duration::from_millis(3));
        m.append(1, Duration::from_secs(10));
        m.request(201);
        m.request(201);
        let s = m.subscribe();
        let text = m.render();
        assert!(
            text.contains("swarm_append_seconds_bucket{le=\"0.00025\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("swarm_append_seconds_bucket{le=\"0.005\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("swarm_append_seconds_bucket{le=\"5\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("swarm_append_seconds_bucket{le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("swarm_appended_events_total 5\n"), "{text}");
        assert!(
            text.contains("swarm_http_requests_total{status=\"201\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("swarm_tail_subscribers 1\n"), "{text}");
        drop(s);
        assert!(m.render().contains("swarm_tail_subscribers 0\n"));
    }
}
