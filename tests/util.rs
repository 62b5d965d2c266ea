//! A small DSL for the integration tests: a temporary data directory, the built `swarm`
//! binary, NDJSON parsing, log-wide invariant checks and a seeded random generator.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use serde_json::{json, Value};
use swarm_memory::log::frame::{self, Decoded};
use swarm_memory::{Durability, Event, EventType, LogOptions, NewEvent, ReadOptions, Store};

/// The `swarm` binary built by cargo for this test run.
pub const SWARM: &str = env!("CARGO_BIN_EXE_swarm");

/// A temporary data directory, removed at drop.
pub struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    /// A data directory on the default temp file system (real disk: real fsync).
    pub fn new() -> Env {
        Env {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// A data directory on tmpfs when there is one (`/dev/shm`), for tests that do many
    /// thousands of fsyncs and do not test the disk; the default temp dir otherwise.
    pub fn fast() -> Env {
        let shm = Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            tempfile::Builder::new()
                .prefix("swarm-test")
                .tempdir_in(shm)
                .or_else(|_| tempfile::tempdir())
        } else {
            tempfile::tempdir()
        };
        Env {
            dir: dir.expect("tempdir"),
        }
    }

    /// The data directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A run's directory.
    pub fn run_dir(&self, run: &str) -> PathBuf {
        self.path().join("anonymous").join(run)
    }

    /// A library handle on the data directory (real file system).
    pub fn store(&self) -> Store {
        Store::open(self.path()).expect("open store")
    }

    /// A library handle whose new runs use `segment_bytes`.
    pub fn store_with_segment_bytes(&self, segment_bytes: u64) -> Store {
        Store::open_with(
            Arc::new(swarm_memory::FsStorage),
            self.path(),
            LogOptions {
                segment_bytes,
                ..LogOptions::default()
            },
        )
        .expect("open store")
    }

    /// A `swarm` command on this data directory, not started.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(SWARM);
        c.env_remove("SWARM_DATA_DIR")
            .env_remove("SWARM_LOG")
            .arg("--data-dir")
            .arg(self.path())
            .env_remove("SWARM_CHECKPOINT_DIR")
            .env_remove("SWARM_ARCHIVE_DIR")
            .env_remove("SWARM_EMBED_MODEL")
            .args(args);
        c
    }

    /// Runs `swarm ARGS` with empty stdin.
    pub fn swarm(&self, args: &[&str]) -> Out {
        let out = self
            .cmd(args)
            .stdin(Stdio::null())
            .output()
            .expect("run swarm");
        Out::from(out, args)
    }

    /// `swarm append --run RUN --agent a --type evidence` and `more` (its outcome unchecked).
    pub fn append_evidence(&self, run: &str, more: &[&str]) -> Out {
        let mut args = vec!["append", "--run", run, "--agent", "a", "--type", "evidence"];
        args.extend_from_slice(more);
        self.swarm(&args)
    }

    /// Runs `swarm ARGS` with `input` on stdin.
    pub fn swarm_stdin(&self, args: &[&str], input: &str) -> Out {
        Out::run(self.cmd(args), args, input)
    }

    /// `swarm append --run RUN --stdin` with one NDJSON line per value; must succeed.
    pub fn append_lines(&self, run: &str, lines: &[Value]) -> Vec<Event> {
        let input: String = lines.iter().map(|l| format!("{l}\n")).collect();
        self.swarm_stdin(&["append", "--run", run, "--stdin"], &input)
            .ok()
            .events()
    }

    /// Every event of a run through `swarm read`; must succeed.
    pub fn read(&self, run: &str) -> Vec<Event> {
        self.swarm(&["read", "--run", run]).ok().events()
    }

    /// `swarm verify --run RUN` as JSON, with its exit code.
    pub fn verify(&self, run: &str) -> (i32, Value) {
        let out = self.swarm(&["verify", "--run", run]);
        let v = serde_json::from_str(out.stdout.trim()).unwrap_or(Value::Null);
        (out.code, v)
    }

    /// Segment files of a run, in log order.
    pub fn segments(&self, run: &str) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(self.run_dir(run))
            .expect("list run dir")
            .map(|e| e.expect("dir entry").path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .and_then(swarm_memory::log::segment::parse_segment_name)
                    .is_some()
            })
            .collect();
        v.sort();
        v
    }

    /// Files of a run ending in `.broken`.
    pub fn broken_files(&self, run: &str) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(self.run_dir(run))
            .expect("list run dir")
            .map(|e| e.expect("dir entry").path())
            .filter(|p| p.to_string_lossy().ends_with(".broken"))
            .collect();
        v.sort();
        v
    }

    /// Every file under the data directory with its bytes.
    pub fn snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut out = BTreeMap::new();
        let mut stack = vec![self.path().to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).expect("list") {
                let p = e.expect("entry").path();
                // A committer's socket (`<user>/.commit/<run>.sock`) is a meeting place
                // of live processes, not data.
                if std::os::unix::fs::FileTypeExt::is_socket(
                    &std::fs::symlink_metadata(&p).expect("stat").file_type(),
                ) {
                    continue;
                }
                if p.is_dir() {
                    out.insert(p.clone(), Vec::new());
                    stack.push(p);
                } else {
                    out.insert(p.clone(), std::fs::read(&p).expect("read file"));
                }
            }
        }
        out
    }

    /// Checks every invariant of a run that must hold whatever happened to its writers:
    /// every line of every segment is a whole frame, `swarm read` returns seqs 1..N
    /// without gaps and with non-decreasing ts, ids are unique, and `swarm verify` is
    /// ok with no torn tail. Returns the events.
    pub fn check_run(&self, run: &str) -> Vec<Event> {
        let mut frames = 0;
        let segs = self.segments(run);
        for (i, seg) in segs.iter().enumerate() {
            frames += check_segment_frames(seg);
            if i + 1 < segs.len() {
                // Sealed segments are trimmed to their last frame at rotation.
                let bytes = std::fs::read(seg).expect("read segment");
                assert_eq!(
                    bytes.last(),
                    Some(&b'\n'),
                    "{}: a sealed segment must end with its last frame",
                    seg.display()
                );
            }
        }
        let events = self.read(run);
        check_sequence(&events);
        let (code, report) = self.verify(run);
        assert_eq!(code, 0, "verify: {report}");
        assert_eq!(report["ok"], true, "{report}");
        assert_eq!(report["records"], events.len(), "{report}");
        assert_eq!(report["frames"], frames, "{report}");
        assert_eq!(report["torn_tail"], Value::Null, "{report}");
        assert_eq!(report["unsynced_records"], 0, "{report}");
        events
    }
}

/// Asserts that `bytes` is a sequence of whole frames (each line one frame), followed by
/// nothing or by the zero fill of a preallocated segment, and returns how many.
pub fn check_frames(what: &str, bytes: &[u8]) -> usize {
    let mut at = 0;
    let mut n = 0;
    while at < bytes.len() {
        if bytes[at] == 0 {
            let stray = bytes[at..].iter().position(|&b| b != 0);
            assert_eq!(stray, None, "{what}: bytes after the zero fill at {at}");
            break;
        }
        match frame::decode(&bytes[at..]) {
            Decoded::Frame { payload, len } => {
                let evs: Vec<Event> = serde_json::from_slice(payload)
                    .unwrap_or_else(|e| panic!("{what}: frame at {at} is not events: {e}"));
                assert!(!evs.is_empty(), "{what}: empty frame at {at}");
                at += len;
                n += 1;
            }
            other => panic!("{what}: no whole frame at byte {at}: {other:?}"),
        }
    }
    n
}

/// Reads a segment file and asserts it holds only whole frames.
pub fn check_segment_frames(path: &Path) -> usize {
    let bytes = std::fs::read(path).expect("read segment");
    check_frames(&path.display().to_string(), &bytes)
}

/// Asserts seqs 1, 2, 3, ... in order (a gap only where a `log_damaged` event declares
/// exactly the seqs it skips), non-decreasing ts and unique ids.
pub fn check_sequence(events: &[Event]) {
    let mut ids = HashSet::new();
    let mut want = 1;
    for (i, e) in events.iter().enumerate() {
        if let Some((from, to)) = swarm_memory::event::LogDamaged::declared(e.kind, &e.content) {
            if from == want && e.seq == to + 1 {
                want = e.seq;
            }
        }
        assert_eq!(e.seq, want, "seq gap or reorder at index {i}");
        want += 1;
        if i > 0 {
            assert!(events[i - 1].ts <= e.ts, "ts decreases at seq {}", e.seq);
        }
        assert!(ids.insert(e.id.clone()), "duplicate id {}", e.id);
    }
}

/// The segment file names of a run directory in a [`swarm_memory::MemStorage`], in log
/// order.
pub fn mem_segments(mem: &swarm_memory::MemStorage, dir: &Path) -> Vec<String> {
    use swarm_memory::Storage;
    let mut segs: Vec<String> = mem
        .list(dir)
        .unwrap()
        .into_iter()
        .filter(|n| n.ends_with(".jsonl"))
        .collect();
    segs.sort();
    segs
}

/// Byte offsets of the frame boundaries of a segment (0, end of frame 1, ...).
pub fn frame_boundaries(bytes: &[u8]) -> Vec<usize> {
    let mut v = vec![0];
    let mut at = 0;
    while let Decoded::Frame { len, .. } = frame::decode(&bytes[at..]) {
        at += len;
        v.push(at);
    }
    v
}

/// What a `swarm` process did.
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    args: String,
}

impl Out {
    /// Runs `c` (the command `swarm ARGS`) with `input` on stdin.
    pub fn run(mut c: Command, args: &[&str], input: &str) -> Out {
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn swarm");
        let mut stdin = child.stdin.take().expect("stdin");
        let input = input.to_string();
        // A writer thread, so a child that stops reading early cannot block us.
        let feeder = std::thread::spawn(move || {
            let _ = stdin.write_all(input.as_bytes());
        });
        let out = child.wait_with_output().expect("wait swarm");
        let _ = feeder.join();
        Out::from(out, args)
    }

    fn from(o: Output, args: &[&str]) -> Out {
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            args: args.join(" "),
        }
    }

    /// Asserts exit 0.
    pub fn ok(self) -> Out {
        self.code(0)
    }

    /// Asserts the exit code.
    pub fn code(self, code: i32) -> Out {
        assert_eq!(
            self.code, code,
            "swarm {}: exit {} (want {code})\nstdout: {}\nstderr: {}",
            self.args, self.code, self.stdout, self.stderr
        );
        self
    }

    /// Asserts stderr is exactly one line and contains every one of `words`.
    pub fn one_line_error(self, words: &[&str]) -> Out {
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "swarm {}: want one stderr line, got {:?}",
            self.args,
            self.stderr
        );
        for w in words {
            assert!(
                lines[0].contains(w),
                "swarm {}: stderr {:?} does not name {w:?}",
                self.args,
                lines[0]
            );
        }
        self
    }

    /// Asserts stderr contains every one of `words`.
    pub fn stderr_has(self, words: &[&str]) -> Out {
        for w in words {
            assert!(
                self.stderr.contains(w),
                "swarm {}: stderr {:?} does not name {w:?}",
                self.args,
                self.stderr
            );
        }
        self
    }

    /// Stdout parsed as NDJSON events.
    pub fn events(&self) -> Vec<Event> {
        parse_events(&self.stdout)
    }
}

/// Parses NDJSON events.
pub fn parse_events(s: &str) -> Vec<Event> {
    s.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not an event: {e}: {l}")))
        .collect()
}

/// An event object as `swarm append --stdin` takes it.
pub fn ev(agent: &str, kind: &str, content: &str) -> Value {
    json!({"agent_id": agent, "type": kind, "content": content})
}

/// An event object with an idempotency id.
pub fn ev_id(id: &str, agent: &str, content: &str) -> Value {
    json!({"id": id, "agent_id": agent, "type": "evidence", "content": content})
}

/// A library event with an id.
pub fn new_ev(id: Option<&str>, content: &str) -> NewEvent {
    NewEvent {
        id: id.map(str::to_string),
        ..NewEvent::new("agent-1", EventType::Evidence, content)
    }
}

/// Appends through the library and panics on error.
pub fn lib_append(store: &Store, run: &str, content: &str) -> Event {
    store
        .append(run, new_ev(None, content), Durability::Sync)
        .expect("append")
}

/// Every event of a run through the library; panics on error.
pub fn lib_read(store: &Store, run: &str) -> Vec<Event> {
    store
        .read(run, ReadOptions::default())
        .expect("read")
        .collect::<Result<_, _>>()
        .expect("read event")
}

/// Every event written to `run`, the ones past the visible mark included (what a reader
/// would see if the marks said so: a power loss test's view of the file).
pub fn lib_read_written(store: &Store, run: &str) -> Vec<Event> {
    store
        .read(
            run,
            ReadOptions {
                visibility: swarm_memory::Visibility::Written,
                ..ReadOptions::default()
            },
        )
        .expect("read")
        .collect::<Result<_, _>>()
        .expect("read event")
}

/// SplitMix64: a tiny seeded generator, so a failing run can be replayed from its seed.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded from the clock; the seed is printed so a failure can be replayed
    /// with `SWARM_TEST_SEED`.
    pub fn from_env(test: &str) -> Rng {
        let seed = std::env::var("SWARM_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        eprintln!("{test}: SWARM_TEST_SEED={seed}");
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// Random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}
