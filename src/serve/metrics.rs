//! The server's own counters, served at `/metrics` in the Prometheus text format:
//! requests by status, append latency (a histogram), events appended, the writers'
//! fsyncs and the durable events they covered (so events per fsync), live tail
//! subscribers, the events buffered for them and the ones closed for lagging, the runs'
//! shared readers and the gaps subscribers filled by reading themselves, and the
//! shared watches that wake them (how many, how many subscribers share them, how many
//! are left to polling).
//!
//! Plain atomics and one small mutex-guarded map: no metrics crate is worth its weight
//! for a handful of series, and the text format is a few lines.
//! Never reads or writes a run.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::commit::SyncCounters;
use crate::tail::HubStats;

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
    /// Events handed to subscribers' buffers and not yet written to their connections.
    buffered: AtomicU64,
    /// Events written to subscribers' connections.
    tail_sent: AtomicU64,
    /// Shared readers running (one per run with live subscribers, `serve::feed`).
    readers: AtomicU64,
    /// Reads a subscriber made of the log itself, after joining its run's shared reader,
    /// to fill a gap the reader's feed left it.
    gap_reads: AtomicU64,
    /// Commit turns of the append queues (`serve::commit`), and the requests they took.
    commits: AtomicU64,
    committed_requests: AtomicU64,
    /// Connections closed at accept because `--max-connections` were open.
    connections_refused: AtomicU64,
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

    /// An append queue's drain committed `requests` requests in one turn.
    pub fn commit(&self, requests: usize) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.committed_requests
            .fetch_add(requests as u64, Ordering::Relaxed);
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

    /// A connection was closed at accept: `--max-connections` were open.
    pub fn connection_refused(&self) {
        self.connections_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` events went into a subscriber's buffer.
    pub fn buffered(&self, n: u64) {
        self.buffered.fetch_add(n, Ordering::Relaxed);
    }

    /// A run's shared reader started; the guard counts it until dropped.
    pub fn reader(self: &std::sync::Arc<Self>) -> Reading {
        self.readers.fetch_add(1, Ordering::Relaxed);
        Reading(self.clone())
    }

    /// A subscriber on a shared reader's feed read the log itself to fill a gap.
    pub fn gap_read(&self) {
        self.gap_reads.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` events left a subscriber's buffer: written to its connection (`sent`), or
    /// dropped with a connection that went away.
    pub fn unbuffered(&self, n: u64, sent: bool) {
        self.buffered.fetch_sub(n, Ordering::Relaxed);
        if sent {
            self.tail_sent.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The Prometheus text exposition of every series; `sync` is the writers' durable
    /// path, summed over the server's stores ([`crate::store::Store::sync_totals`]);
    /// `watches`, the live tail's shared watches ([`crate::tail::WatchHub::stats`]).
    pub fn render(&self, sync: SyncCounters, watches: HubStats) -> String {
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
                "swarm_append_commits_total",
                "Commit turns of the append queues: each takes every request queued for its run (one write, one fsync).",
                "counter",
                &self.commits,
            ),
            (
                "swarm_append_committed_requests_total",
                "Append requests taken by commit turns; over swarm_append_commits_total: requests per turn.",
                "counter",
                &self.committed_requests,
            ),
            (
                "swarm_tail_subscribers",
                "Live tail (SSE) subscribers connected now.",
                "gauge",
                &self.subscribers,
            ),
            (
                "swarm_connections_refused_total",
                "Connections closed at accept because --max-connections were open.",
                "counter",
                &self.connections_refused,
            ),
            (
                "swarm_tail_lagged_total",
                "Live tail subscribers closed because they read too slowly.",
                "counter",
                &self.lagged,
            ),
            (
                "swarm_tail_buffered_events",
                "Events queued for live tail subscribers, not yet written to their connections (a subscriber is closed as lagged when its own queue reaches --sse-buffer-events).",
                "gauge",
                &self.buffered,
            ),
            (
                "swarm_tail_sent_events_total",
                "Events written to live tail subscribers' connections.",
                "counter",
                &self.tail_sent,
            ),
            (
                "swarm_tail_shared_readers",
                "Runs whose live tail subscribers share one reader of the log (each new event is read, decoded and encoded once per run, not once per subscriber).",
                "gauge",
                &self.readers,
            ),
            (
                "swarm_tail_gap_reads_total",
                "Reads a live tail subscriber made of the log itself to fill a gap in its run's shared feed (it joined between two reads, or fell behind the feed).",
                "counter",
                &self.gap_reads,
            ),
        ] {
            counter(&mut out, name, help, kind, v.load(Ordering::Relaxed));
        }
        for (name, help, v) in [
            (
                "swarm_fsyncs_total",
                "fdatasync calls this server made on run segments (sync appends, the batch flusher, rotations, repairs).",
                sync.fsyncs,
            ),
            (
                "swarm_fsyncs_coalesced_total",
                "fsyncs saved because another process's fsync had already covered this server's frames.",
                sync.coalesced,
            ),
            (
                "swarm_durable_events_total",
                "Events appended with sync durability and acknowledged; over swarm_fsyncs_total: events per fsync.",
                sync.durable_events,
            ),
        ] {
            counter(&mut out, name, help, "counter", v);
        }
        for (name, help, kind, v) in [
            (
                "swarm_tail_watches",
                "Runs followed by live tail subscribers: each has one watch, shared by all of its subscribers.",
                "gauge",
                watches.watches,
            ),
            (
                "swarm_tail_watch_subscribers",
                "Live tail subscribers sharing those watches (over swarm_tail_watches: subscribers per watch).",
                "gauge",
                watches.subscribers,
            ),
            (
                "swarm_tail_polling_watches",
                "Watches without a working inotify watch: their subscribers are woken by polling (--sse-poll-ms).",
                "gauge",
                watches.watches_polling,
            ),
            (
                "swarm_tail_polling_subscribers",
                "Live tail subscribers woken by polling because their run's watch does not work.",
                "gauge",
                watches.subscribers_polling,
            ),
            (
                "swarm_tail_inotify_instances",
                "inotify instances the live tail holds (one for the whole server, whatever the number of runs and subscribers).",
                "gauge",
                watches.notify_instances,
            ),
            (
                "swarm_tail_notify_wakeups_total",
                "Wake-ups fanned out to a run's subscribers because inotify reported its marks written.",
                "counter",
                watches.notify_wakeups,
            ),
            (
                "swarm_tail_poll_wakeups_total",
                "Wake-ups fanned out to a run's subscribers because the polling sweep found its marks moved.",
                "counter",
                watches.poll_wakeups,
            ),
        ] {
            counter(&mut out, name, help, kind, v);
        }
        out
    }
}

/// One series with its help and type lines.
fn counter(out: &mut String, name: &str, help: &str, kind: &str, v: u64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name} {v}");
}

/// Counts one live tail subscriber while it lives.
#[derive(Debug)]
pub struct Subscribed(std::sync::Arc<Metrics>);

impl Subscribed {
    /// The counters it counts in.
    pub fn metrics(&self) -> std::sync::Arc<Metrics> {
        self.0.clone()
    }

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

/// Counts one shared reader while it runs.
#[derive(Debug)]
pub struct Reading(std::sync::Arc<Metrics>);

impl Drop for Reading {
    fn drop(&mut self) {
        self.0.readers.fetch_sub(1, Ordering::Relaxed);
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
        m.commit(2);
        let s = m.subscribe();
        m.buffered(2);
        m.unbuffered(1, true);
        let r = m.reader();
        let text = m.render(
            SyncCounters {
                fsyncs: 2,
                coalesced: 1,
                durable_events: 7,
                recovered_found: 0,
            },
            HubStats {
                notify_instances: 1,
                watches: 2,
                subscribers: 300,
                ..HubStats::default()
            },
        );
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
        assert!(text.contains("swarm_append_commits_total 1\n"), "{text}");
        assert!(
            text.contains("swarm_append_committed_requests_total 2\n"),
            "{text}"
        );
        assert!(
            text.contains("swarm_http_requests_total{status=\"201\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("swarm_tail_subscribers 1\n"), "{text}");
        assert!(text.contains("swarm_tail_buffered_events 1\n"), "{text}");
        assert!(text.contains("swarm_tail_sent_events_total 1\n"), "{text}");
        assert!(text.contains("swarm_tail_shared_readers 1\n"), "{text}");
        assert!(text.contains("swarm_fsyncs_total 2\n"), "{text}");
        assert!(text.contains("swarm_fsyncs_coalesced_total 1\n"), "{text}");
        assert!(text.contains("swarm_durable_events_total 7\n"), "{text}");
        assert!(text.contains("swarm_tail_watches 2\n"), "{text}");
        assert!(
            text.contains("swarm_tail_watch_subscribers 300\n"),
            "{text}"
        );
        assert!(
            text.contains("swarm_tail_polling_subscribers 0\n"),
            "{text}"
        );
        assert!(text.contains("swarm_tail_inotify_instances 1\n"), "{text}");
        assert!(text.contains("# TYPE swarm_tail_watches gauge\n"), "{text}");
        drop(s);
        drop(r);
        let text = m.render(SyncCounters::default(), HubStats::default());
        assert!(text.contains("swarm_tail_subscribers 0\n"), "{text}");
        assert!(text.contains("swarm_tail_shared_readers 0\n"), "{text}");
    }
}
