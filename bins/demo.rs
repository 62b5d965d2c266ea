//! `swarm demo`: agent processes work an SRE incident together in a new run.
//!
//! Every agent is a separate `swarm append --stdin` process; the orchestrator and the
//! human use the library in this process. Each stage prints what happened and why.

use std::io::{self, IsTerminal, Write};

/// `println!` that returns an error (a closed pipe ends the demo quietly) instead of panicking.
macro_rules! say {
    () => { writeln!(io::stdout().lock())? };
    ($($t:tt)*) => { writeln!(io::stdout().lock(), $($t)*)? };
}
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};

use anyhow::{bail, Context};
use serde_json::{json, Value};
use swarm_memory::{Error, Event, EventType, PickOutcome, ReadOptions, Store, Target, Ts};

/// Starts the demo's agent processes: on the data directory, or (`--server`) as clients
/// of a `swarm serve` the demo started, each agent with a bearer token of its own.
struct Launcher {
    exe: std::path::PathBuf,
    server: Option<DemoServer>,
}

/// The server of `swarm demo --server`: a child `swarm serve` on a free loopback port,
/// stopped with SIGTERM (a graceful shutdown) when the demo ends.
struct DemoServer {
    child: std::process::Child,
    url: String,
    data_dir: std::path::PathBuf,
    user: String,
    /// Agent -> (token, token id).
    tokens: std::sync::Mutex<std::collections::HashMap<String, (String, String)>>,
}

impl DemoServer {
    fn start(exe: &Path, data_dir: &Path, user: &str) -> anyhow::Result<DemoServer> {
        use std::io::BufRead;
        let mut child = Command::new(exe)
            .env_remove("SWARM_URL")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting swarm serve")?;
        let mut first = String::new();
        io::BufReader::new(child.stdout.take().context("server stdout")?)
            .read_line(&mut first)
            .context("reading the server's address")?;
        let Some(url) = first.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("swarm serve did not start (it printed {first:?})");
        };
        Ok(DemoServer {
            url: url.to_string(),
            child,
            data_dir: data_dir.to_path_buf(),
            user: user.to_string(),
            tokens: Default::default(),
        })
    }

    /// The token of `agent` (made on first use: `swarm token add`, role agent, that
    /// agent only).
    fn token(&self, exe: &Path, agent: &str) -> anyhow::Result<String> {
        let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((t, _)) = tokens.get(agent) {
            return Ok(t.clone());
        }
        let out = Command::new(exe)
            .env_remove("SWARM_URL")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args([
                "--user", &self.user, "token", "add", "--role", "agent", "--agent", agent,
            ])
            .stdin(Stdio::null())
            .output()
            .context("swarm token add")?;
        if !out.status.success() {
            bail!(
                "swarm token add failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let t = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim()
            .to_string();
        // The token's record (its id, for the revocation at the end) is on stderr.
        let id = String::from_utf8_lossy(&out.stderr)
            .lines()
            .find_map(|l| serde_json::from_str::<Value>(l).ok())
            .and_then(|v| v["id"].as_str().map(str::to_string))
            .context("swarm token add printed no token id")?;
        tokens.insert(agent.to_string(), (t.clone(), id));
        Ok(t)
    }

    /// Revokes the demo's tokens (they were never shown; revoked all the same).
    fn revoke_tokens(&self, exe: &Path) -> anyhow::Result<usize> {
        let tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        for (_, id) in tokens.values() {
            let st = Command::new(exe)
                .env_remove("SWARM_URL")
                .arg("--data-dir")
                .arg(&self.data_dir)
                .args(["--user", &self.user, "token", "revoke", id])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .context("swarm token revoke")?;
            if !st.success() {
                bail!("swarm token revoke {id} failed");
            }
        }
        Ok(tokens.len())
    }

    /// SIGTERM, then the exit status (SIGKILL after 10 s).
    fn stop(&mut self) -> anyhow::Result<Option<i32>> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(st.code());
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                return Ok(self.child.wait()?.code());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for DemoServer {
    /// A demo that ends early does not leave its server behind.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Launcher {
    /// `swarm` with the arguments for `agent`: `--data-dir` and `--user`, or the server's
    /// address and the agent's token.
    fn command(&self, data_dir: &Path, user: &str, agent: &str) -> anyhow::Result<Command> {
        let mut c = Command::new(&self.exe);
        c.arg("--data-dir").arg(data_dir).args(["--user", user]);
        match &self.server {
            Some(s) => {
                c.env("SWARM_URL", &s.url)
                    .env("SWARM_TOKEN", s.token(&self.exe, agent)?);
            }
            None => {
                c.env_remove("SWARM_URL");
            }
        }
        Ok(c)
    }
}

/// One agent process fed NDJSON lines; returns the events it stored.
fn agent_process(
    exe: &Launcher,
    data_dir: &Path,
    user: &str,
    run: &str,
    lines: Vec<Value>,
) -> anyhow::Result<std::process::Child> {
    let agent = lines
        .first()
        .and_then(|l| l["agent_id"].as_str())
        .unwrap_or("agent")
        .to_string();
    let mut child = exe
        .command(data_dir, user, &agent)?
        .args(["append", "--run", run, "--stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting an agent process")?;
    let mut stdin = child.stdin.take().context("agent stdin")?;
    let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::thread::spawn(move || {
        let _ = stdin.write_all(body.as_bytes());
    });
    Ok(child)
}

fn wait_agent(
    agent: &str,
    child: std::process::Child,
) -> anyhow::Result<(Vec<Event>, String, Option<i32>)> {
    let out = child.wait_with_output().context("waiting for an agent")?;
    let events = out
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(serde_json::from_slice)
        .collect::<Result<Vec<Event>, _>>()
        .with_context(|| format!("agent {agent} printed something that is not an event"))?;
    Ok((
        events,
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
        out.status.code(),
    ))
}

fn ev(
    run: &str,
    id: &str,
    agent: &str,
    kind: &str,
    subject: &str,
    content: &str,
    conf: f64,
) -> Value {
    // observed_at: when the agent made the finding (here: when its script is written);
    // `swarm metrics` measures discovery-to-visibility from it.
    json!({"id": format!("{run}.{id}"), "agent_id": agent, "type": kind, "subject": subject,
           "content": content, "confidence": conf, "session_id": format!("{agent}-s1"),
           "meta": {"observed_at": Ts::now().to_string()}})
}

/// The same entry with `meta` (the tool call it reports, the symptom, the root cause).
fn with_meta(mut v: Value, meta: Value) -> Value {
    if let (Some(m), Some(add)) = (
        v.get_mut("meta").and_then(Value::as_object_mut),
        meta.as_object(),
    ) {
        m.extend(add.clone());
    }
    v
}

fn line(e: &Event) -> String {
    let content = e
        .content
        .as_str()
        .map_or_else(|| e.content.to_string(), str::to_string);
    let refs = if e.refs.is_empty() {
        String::new()
    } else {
        format!(
            "  <- {}",
            e.refs
                .iter()
                .map(|r| format!("#{r}"))
                .collect::<Vec<_>>()
                .join(" ")
        )
    };
    let content: String = if content.chars().count() > 90 {
        content
            .chars()
            .take(89)
            .chain(std::iter::once('…'))
            .collect()
    } else {
        content
    };
    format!(
        "  #{:<3} {}  {:<12} {:<12} [{}] {}{}",
        e.seq,
        &e.ts.to_string()[11..23],
        e.agent_id,
        e.kind.as_str(),
        e.subject.as_deref().unwrap_or("-"),
        content,
        refs
    )
}

/// Runs the demo.
pub fn run(
    data_dir: &Path,
    checkpoint_dir: &Path,
    archive_dir: &Path,
    user: &str,
    run: Option<String>,
    server: bool,
) -> anyhow::Result<ExitCode> {
    let run = run.unwrap_or_else(|| format!("demo-{}", Ts::now().0 / 1000));
    let mut exe = Launcher {
        exe: std::env::current_exe().context("locating the swarm binary")?,
        server: None,
    };
    let store = Store::open(data_dir)?
        .with_checkpoints(checkpoint_dir, 10_000)
        .with_archive_dir(archive_dir)
        .with_user(user, true)?;
    say!(
        "swarm demo: run {run:?} (user {user:?}) in {}",
        data_dir.display()
    );

    // A fourth agent follows the run live from its own process before anything is written
    // (in a data dir that exists: read-only commands refuse a missing one).
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating the data dir {}", data_dir.display()))?;
    if server {
        let s = DemoServer::start(&exe.exe, data_dir, user)?;
        say!(
            "   --server: the agents are clients of `swarm serve` at {} (SWARM_URL), each with a token
   of its own (role agent, that agent only); the orchestrator and the human stay in this process",
            s.url
        );
        exe.server = Some(s);
    }
    let mut tail = exe
        .command(data_dir, user, "tail-watcher")?
        .args([
            "tail", "--run", &run, "--follow", "--agent", "logs", "--type", "evidence",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the tailing agent")?;
    let tail_out = tail.stdout.take().context("tail stdout")?;
    let (seen_tx, seen_rx) = std::sync::mpsc::channel::<(Event, Ts)>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for l in io::BufReader::new(tail_out).lines().map_while(Result::ok) {
            if let Ok(e) = serde_json::from_str::<Event>(&l) {
                if seen_tx.send((e, Ts::now())).is_err() {
                    return;
                }
            }
        }
    });

    // Stage 1: three investigators in three processes, appending at the same time.
    say!("\n1. three agent processes investigate concurrently (durable appends, one log);");
    say!("   a fourth, `swarm tail --follow`, watches the logs agent's evidence live:");
    let r = &run;
    let scripts = vec![
        (
            "metrics",
            vec![
                with_meta(
                    ev(
                        r,
                        "m0",
                        "metrics",
                        "evidence",
                        "checkout-latency",
                        "query failed",
                        0.1,
                    ),
                    json!({"tool": "query_metrics", "tool_status": "error",
                           "error": "invalid filter: resource.type required",
                           "args": {"filter": "metric.type=\"latency\""}}),
                ),
                with_meta(
                    ev(
                        r,
                        "m1",
                        "metrics",
                        "evidence",
                        "checkout-latency",
                        "p99 latency of checkout rose from 180 ms to 2.4 s at 14:01",
                        0.95,
                    ),
                    json!({"tool": "query_metrics", "tool_status": "ok",
                           "args": {"filter": "metric.type=\"latency\"", "resource.type": "k8s_container"}}),
                ),
                with_meta(
                    ev(
                        r,
                        "m2",
                        "metrics",
                        "hypothesis",
                        "root-cause",
                        "connection pool saturation on orders-db",
                        0.7,
                    ),
                    json!({"symptom": "high_latency_checkout"}),
                ),
                ev(
                    r,
                    "m3",
                    "metrics",
                    "evidence",
                    "orders-db",
                    "orders-db connection pool exhausted: 100 of 100 connections in use",
                    0.9,
                ),
                ev(
                    r,
                    "m4",
                    "metrics",
                    "evidence",
                    "orders-svc",
                    "orders-svc listens on port 8080",
                    0.8,
                ),
            ],
        ),
        (
            "logs",
            vec![
                ev(
                    r,
                    "l1",
                    "logs",
                    "evidence",
                    "checkout",
                    "checkout pods log 'timeout acquiring connection' 3,214 times since 14:01",
                    0.9,
                ),
                ev(
                    r,
                    "l2",
                    "logs",
                    "hypothesis",
                    "root-cause",
                    "deploy 2026.11.22-3 of orders-svc leaks connections",
                    0.8,
                ),
                with_meta(
                    ev(
                        r,
                        "l3",
                        "logs",
                        "evidence",
                        "orders-svc",
                        "orders-svc deploy 2026.11.22-3 rolled out at 13:58",
                        0.95,
                    ),
                    json!({"tool": "get_logs_for_trace", "tool_status": "ok"}),
                ),
                ev(
                    r,
                    "l4",
                    "logs",
                    "evidence",
                    "orders-db",
                    "all 100 connections of the orders-db pool are in use (pool exhausted)",
                    0.85,
                ),
                ev(
                    r,
                    "l5",
                    "logs",
                    "evidence",
                    "orders-svc",
                    "orders-svc is serving on port 8080",
                    0.7,
                ),
            ],
        ),
        (
            "traces",
            vec![
                with_meta(
                    ev(
                        r,
                        "t1",
                        "traces",
                        "evidence",
                        "checkout",
                        "trace exemplars: 96% of checkout time spent waiting on orders-db",
                        0.85,
                    ),
                    json!({"tool": "fetch_trace_exemplar", "tool_status": "ok"}),
                ),
                ev(
                    r,
                    "t4",
                    "traces",
                    "evidence",
                    "orders-db",
                    "orders-db pool is saturated, every one of the 100 connections is busy",
                    0.8,
                ),
                ev(
                    r,
                    "t5",
                    "traces",
                    "evidence",
                    "orders-svc",
                    "orders-svc listens on port 3000 according to its config",
                    0.6,
                ),
                ev(
                    r,
                    "t2",
                    "traces",
                    "hypothesis",
                    "root-cause",
                    "orders-svc retries without closing connections after 13:58",
                    0.8,
                ),
            ],
        ),
    ];
    let mut children = Vec::new();
    for (agent, lines) in scripts {
        children.push((agent, agent_process(&exe, data_dir, user, &run, lines)?));
    }
    for (agent, child) in children {
        let (events, err, code) = wait_agent(agent, child)?;
        if code != Some(0) {
            bail!("agent {agent} failed ({code:?}): {err}");
        }
        say!(
            "   agent {agent:<8} stored {} entries: seqs {:?}",
            events.len(),
            events.iter().map(|e| e.seq).collect::<Vec<_>>()
        );
    }

    // Stage 2: an agent builds on a peer's finding (refs it), then the orchestrator picks.
    let all: Vec<Event> = store
        .read(&run, ReadOptions::default())?
        .collect::<Result<_, _>>()?;
    let leak = all
        .iter()
        .find(|e| e.id == format!("{run}.l2"))
        .context("the leak hypothesis")?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let (deploy, seen_at) = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let (e, at) = seen_rx
            .recv_timeout(left)
            .context("the tailing agent never delivered the deploy finding")?;
        if e.id == format!("{run}.l3") {
            break (e, at);
        }
    };
    let _ = tail.kill();
    let _ = tail.wait();
    let deploy = &deploy;
    say!(
        "\n2. the tailing agent got the logs agent's finding #{} {:.1} ms after it was stored,\n   and writes evidence that builds on it (refs):",
        deploy.seq,
        seen_at.0.saturating_sub(deploy.ts.0) as f64 / 1000.0
    );
    let (support, _, _) = wait_agent(
        "traces",
        agent_process(
            &exe,
            data_dir,
            user,
            &run,
            vec![json!({
            "id": format!("{run}.t3"), "agent_id": "traces", "type": "evidence", "subject": "root-cause",
            "content": "connection leak starts with the 13:58 deploy: open connections grow 4/s after it",
            "confidence": 0.9, "refs": [deploy.seq, leak.seq]})],
        )?,
    )?;
    for e in &support {
        say!("{}", line(e));
    }
    say!("   competing hypotheses on root-cause; the orchestrator picks (confidence, then evidence, then recency):");
    match store.pick(&run, "orchestrator", "root-cause")? {
        PickOutcome::Picked {
            decision,
            winner,
            losers,
            rule,
        } => {
            say!("{}", line(&decision));
            say!("   winner #{winner} by {rule}; losers {losers:?} stay in the log as context");
        }
        PickOutcome::Escalated { escalation } => {
            say!("   tie, escalated: {}", line(&escalation))
        }
    }

    // Stage 3: contradictory actions are a hard stop.
    say!("\n3. two agents act on orders-svc without building on each other's action:");
    let (a, _, _) = wait_agent(
        "lead",
        agent_process(
            &exe,
            data_dir,
            user,
            &run,
            vec![ev(
                r,
                "a1",
                "lead",
                "action_taken",
                "orders-svc",
                "rolled back orders-svc to 2026.11.22-2",
                0.9,
            )],
        )?,
    )?;
    let (b, _, _) = wait_agent(
        "sre-bot",
        agent_process(
            &exe,
            data_dir,
            user,
            &run,
            vec![ev(
                r,
                "a2",
                "sre-bot",
                "action_taken",
                "orders-svc",
                "scaled orders-svc from 6 to 12 replicas",
                0.6,
            )],
        )?,
    )?;
    for e in a.iter().chain(&b) {
        say!("{}", line(e));
    }
    let open = store.escalations(&run, false)?;
    for x in &open {
        say!("   ESCALATION #{}: {}", x.seq, x.record.reason);
    }
    let (_, err, code) = wait_agent(
        "sre-bot",
        agent_process(
            &exe,
            data_dir,
            user,
            &run,
            vec![ev(
                r,
                "a3",
                "sre-bot",
                "action_taken",
                "orders-svc",
                "restarted orders-svc pods",
                0.5,
            )],
        )?,
    )?;
    say!(
        "   a further action is refused (exit {}): {}",
        code.unwrap_or(-1),
        err.trim_start_matches("swarm: ")
    );
    if let Some(x) = open.first() {
        let res = store.resolve(
            &run,
            "alice",
            x.seq,
            Some(x.record.entries[0]),
            "rollback is the fix; scaling only hid the leak",
        )?;
        say!("   a human resolves it:\n{}", line(&res));
        let (ok, _, _) = wait_agent(
            "sre-bot",
            agent_process(
                &exe,
                data_dir,
                user,
                &run,
                vec![json!({
            "id": format!("{run}.a4"), "agent_id": "sre-bot", "type": "action_taken", "subject": "orders-svc",
            "content": "scaled orders-svc back to 6 replicas", "refs": [x.record.entries[0]]})],
            )?,
        )?;
        for e in &ok {
            say!("{}", line(e));
        }
    }

    // Stage 4: time travel.
    let events: Vec<Event> = store
        .read(&run, ReadOptions::default())?
        .collect::<Result<_, _>>()?;
    let mid = events.len() as u64 / 2;
    let then = store.state_at(&run, Target::Seq(mid), |_| {})?;
    say!(
        "\n4. replay: what did the swarm know at seq {mid} ({})?",
        then.state
            .head_ts
            .map(|t| t.to_string())
            .unwrap_or_default()
    );
    for (subject, s) in &then.state.subjects {
        say!(
            "   {subject:<16} latest #{:<3} by {:<8} {}",
            s.latest.seq,
            s.latest.agent_id,
            s.latest.content.as_str().unwrap_or("")
        );
    }
    say!("\n   the whole timeline:");
    for e in &events {
        say!("{}", line(e));
    }

    // Stage 5: the run goes long; pruning keeps the working view and the prompts bounded.
    store.set_policy(
        &run,
        "lead",
        &swarm_memory::fold::rules::Policy {
            permissions: None,
            prune_max_entries: Some(8),
        },
    )?;
    let chatter: Vec<Value> = (0..12)
        .map(|i| {
            ev(
                r,
                &format!("n{i}"),
                "metrics",
                "evidence",
                "orders-db",
                &format!("pool usage sample {i}: {}/100 connections", 90 - 5 * i),
                0.6,
            )
        })
        .collect();
    wait_agent(
        "metrics",
        agent_process(&exe, data_dir, user, &run, chatter)?,
    )?;
    let mut summary = None;
    while let Some(s) = store.prune(&run, "pruner", &swarm_memory::fold::summary::Builtin, false)? {
        summary = Some(s);
    }
    let state = store.state_at(&run, Target::Head, |_| {})?.state;
    say!("\n5. the run grew past the policy's threshold (8 unpinned entries): summaries replace the oldest half");
    for s in &state.summaries {
        say!(
            "   summary #{} covers seqs {}..{} ({} entries); decisions and actions stay pinned",
            s.seq,
            s.content["from_seq"],
            s.content["to_seq"],
            s.content["summarized"]
        );
    }
    if summary.is_none() && state.summaries.is_empty() {
        say!("   (a writer's background pruner has not run yet)");
    }
    let ctx = store.context(&run, "traces", 1200)?;
    say!(
        "   the traces agent's prompt context: {} of 1200 bytes, {} items:",
        ctx.used_bytes,
        ctx.items.len()
    );
    for i in &ctx.items {
        let t: String = i.text.chars().take(110).collect();
        say!("     {:<7} {t}", i.role);
    }
    let events: Vec<Event> = store
        .read(&run, ReadOptions::default())?
        .collect::<Result<_, _>>()?;

    // Stage 6: verify.
    let report = store.verify(&run, |_| {})?;
    let count = |k: EventType| events.iter().filter(|e| e.kind == k).count();
    say!(
        "\n6. verify: ok={} records={} frames={} bytes={} corrupt={}\n   {} hypotheses, {} evidence, {} decisions, {} actions, {} escalations; seqs 1..{} gap-free",
        report.ok,
        report.records,
        report.frames,
        report.bytes,
        report.corrupt.len(),
        count(EventType::Hypothesis),
        count(EventType::Evidence),
        count(EventType::Decision),
        count(EventType::ActionTaken),
        count(EventType::Escalation),
        events.len()
    );
    // Stage 7: the incident is over: the lead records the root cause, then the run is
    // closed and archived to cold storage.
    wait_agent(
        "lead",
        agent_process(
            &exe,
            data_dir,
            user,
            &run,
            vec![with_meta(
                ev(
                    r,
                    "d9",
                    "lead",
                    "decision",
                    "incident",
                    "root cause: connection leak in orders-svc 2026.11.22-3; rolled back",
                    0.9,
                ),
                json!({"root_cause": "connection_leak_after_deploy",
                       "resolution": "rolled back orders-svc to 2026.11.22-2; fix the retry path to close connections"}),
            )],
        )?,
    )?;
    let archived = store.close_run(&run, "lead")?;
    let back: Vec<Event> = store
        .read(&run, ReadOptions::default())?
        .collect::<Result<_, _>>()?;
    let pinned = back.iter().filter(|e| e.kind.is_pinned()).count();
    say!(
        "\n7. closed and archived to {} ({} -> {} bytes, verified); {} events still readable from it,\n   all {} decisions and actions included; appends are now refused",
        archived.path.display(),
        archived.bytes_raw,
        archived.bytes_archived,
        back.len(),
        pinned
    );
    memory_stream(&run, &back)?;
    if let Some(s) = exe.server.as_mut() {
        let code = s.stop()?;
        let revoked = s.revoke_tokens(&exe.exe)?;
        say!(
            "\n   swarm serve at {} stopped by SIGTERM: exit {}; the {revoked} agent tokens revoked",
            s.url,
            code.map_or("by a signal".to_string(), |c| c.to_string())
        );
        if code != Some(0) {
            bail!("swarm serve did not shut down cleanly");
        }
    }
    synthesis(&store, &run)?;
    if io::stdout().is_terminal() {
        say!("\nnext: swarm read --run {run} | jq .   |   swarm replay --run {run} --timeline");
        say!("      swarm facts --table   |   swarm facts --explain F1   |   swarm metrics --run {run}");
    }
    if !report.ok {
        return Err(Error::Corrupt {
            path: data_dir.to_path_buf(),
            offset: 0,
            seq: 0,
            reason: "the demo run failed verification".into(),
        }
        .into());
    }
    Ok(ExitCode::SUCCESS)
}

/// The incident's memory events (seed 002's UI stream, `swarm memory-events`): counts by
/// action, and the first event of each action.
fn memory_stream(run: &str, events: &[Event]) -> anyhow::Result<()> {
    use swarm_memory::synth::memory_events::derive;
    let all: Vec<_> = events.iter().flat_map(derive).collect();
    let count = |a: &str| all.iter().filter(|m| m.action == a).count();
    say!(
        "\n   memory events (swarm memory-events --run {run}): {} stored, {} tool_tracked, {} pattern_learned",
        count("stored"),
        count("tool_tracked"),
        count("pattern_learned")
    );
    for action in ["stored", "tool_tracked", "pattern_learned"] {
        if let Some(m) = all.iter().find(|m| m.action == action) {
            say!(
                "     seq {:>3} {:<15} {:<8} {}",
                m.seq,
                m.action,
                m.category,
                m.title
            );
        }
    }
    Ok(())
}

/// Stage 8: the nightly job. Synthesizes every run of the user into deduplicated,
/// evidence-linked facts, explains one back to its raw events, shows the contradiction's
/// resolution and the patterns learned from the closed run, and the run's metrics.
fn synthesis(store: &Store, run: &str) -> anyhow::Result<()> {
    use swarm_memory::synth::{metrics, FactsQuery, SynthOptions};
    let r = store.synth(&SynthOptions::default(), |_| {})?;
    say!(
        "\n8. the nightly synthesis: {} new events of {} runs -> {} new facts ({} exact and {} near duplicates merged),\n   {} contradictions, {} resolutions, {} closed runs learned from, {} sanitized copies shared ({} ms)",
        r.events,
        r.runs.len(),
        r.facts_new,
        r.matched_exact,
        r.matched_near,
        r.contradictions_new,
        r.resolutions,
        r.learned_runs.len(),
        r.shared_copies,
        r.elapsed_ms
    );
    let all = store.facts(&FactsQuery {
        include_superseded: true,
        ..FactsQuery::default()
    })?;
    let mut mine: Vec<_> = all
        .facts
        .iter()
        .filter(|f| f.runs.iter().any(|x| x == run))
        .collect();
    // Most corroborated first; contradicted ones next.
    mine.sort_by_key(|f| {
        (
            std::cmp::Reverse(f.agents.len()),
            f.contradictions.is_empty(),
            std::cmp::Reverse(f.evidence),
        )
    });
    say!(
        "   {} facts found in this run; the most corroborated:",
        mine.len()
    );
    for f in mine.iter().take(8) {
        let t: String = f.text.chars().take(70).collect();
        say!(
            "   {:<5} {:<16} conf {:.2}  {} agent(s), {} evidence  {:<10} {t}",
            f.id,
            f.subject.as_deref().unwrap_or("-"),
            f.confidence,
            f.agents.len(),
            f.evidence,
            f.status
        );
    }
    let mut contras: Vec<_> = all
        .contradictions
        .iter()
        .filter(|c| mine.iter().any(|f| f.id == c.a || f.id == c.b))
        .collect();
    // Decided by evidence first: they are the interesting ones (a value sampled over
    // time yields a chain of recency decisions: the latest reading stands).
    contras.sort_by_key(|c| c.reason.as_deref() != Some("evidence_weight"));
    for c in contras.iter().take(3) {
        say!(
            "   contradiction {} on {}: {:?} vs {:?} -> {} stands ({})",
            c.id,
            c.subject,
            c.a_text,
            c.b_text,
            c.winner.as_deref().unwrap_or("?"),
            c.reason.as_deref().unwrap_or("unresolved")
        );
    }
    if contras.len() > 3 {
        say!(
            "   (+{} more contradictions; the superseded facts stay, marked with the time they stopped being valid)",
            contras.len() - 3
        );
    }
    if let Some(best) = mine.iter().max_by_key(|f| (f.agents.len(), f.evidence)) {
        let ex = store.explain_fact(&best.id, 10)?;
        say!(
            "   `swarm facts --explain {}`: {:?}, found independently by {}; its evidence chain:",
            best.id,
            best.text,
            best.agents.join(", ")
        );
        for l in &ex.evidence {
            match &l.event {
                Some(e) => say!("     {} ({}){}", l.matched, l.run, line(e).trim_start()),
                None => say!(
                    "     {} #{}: {}",
                    l.run,
                    l.seq,
                    l.error.as_deref().unwrap_or("")
                ),
            }
        }
    }
    for p in store.patterns("high_latency_checkout")? {
        say!(
            "   pattern ({}): {} -> {} via {} (seen {}x, confidence {:.1})",
            p.scope,
            p.item.symptom_type,
            p.item.root_cause_category,
            p.item.tool_sequence.join(" > "),
            p.item.occurrence_count,
            p.item.confidence
        );
    }
    for m in store.advise("query_metrics")?.iter().take(2) {
        say!(
            "   advice before query_metrics ({}): {:?} seen {}x; fix: {}",
            m.scope,
            m.item.error,
            m.item.occurrence_count,
            m.item.correction.as_deref().unwrap_or("unknown")
        );
    }
    let m = store.metrics(run, &swarm_memory::synth::dedup::DedupConfig::default())?;
    say!("   metrics of the run (`swarm metrics --run {run}`):");
    for l in metrics::render_table(&m).lines() {
        say!("     {l}");
    }
    Ok(())
}
