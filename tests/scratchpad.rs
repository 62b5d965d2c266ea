//! Seed 000's eval set as scenarios of several agent processes: conflict resolution,
//! scratchpad bloat, audit completeness; plus user isolation.

use serde_json::{json, Value};

use crate::util::Env;

fn entry(agent: &str, kind: &str, subject: &str, content: &str, conf: f64) -> Value {
    json!({"agent_id": agent, "type": kind, "subject": subject, "content": content, "confidence": conf})
}

/// Contradictory actions by two agent processes: an escalation lands in the same frame as
/// the second action, later actions on the subject are refused (exit 6, naming it) while
/// evidence still goes through, and a human's resolution unblocks. Never a silent pick.
#[test]
fn conflict_resolution_escalates_contradictory_actions() {
    let env = Env::new();
    let a = env.append_lines(
        "r",
        &[entry(
            "db",
            "action_taken",
            "orders-db",
            "failed over to replica",
            0.9,
        )],
    );
    let b = env.append_lines(
        "r",
        &[entry(
            "app",
            "action_taken",
            "orders-db",
            "restarted primary",
            0.8,
        )],
    );
    assert_eq!(a.len(), 1);
    assert_eq!(b.len(), 2, "the action and the engine's escalation: {b:?}");
    assert_eq!(b[1].kind.as_str(), "escalation");
    let esc = b[1].seq;
    let out = env
        .swarm_stdin(
            &["append", "--run", "r", "--stdin"],
            &format!(
                "{}\n",
                entry("db", "decision", "orders-db", "keep replica", 0.5)
            ),
        )
        .code(6);
    assert!(out.stderr.contains(&format!("#{esc}")), "{}", out.stderr);
    env.append_lines(
        "r",
        &[entry("db", "evidence", "orders-db", "replica lag 0 s", 0.9)],
    );
    let open = env.swarm(&["escalations", "--run", "r"]).ok();
    assert!(open.stdout.contains(&format!("\"seq\":{esc}")));
    env.swarm(&[
        "resolve",
        "--run",
        "r",
        "--escalation",
        &esc.to_string(),
        "--winner",
        &a[0].seq.to_string(),
        "--by",
        "alice",
        "--note",
        "failover stands",
    ])
    .ok();
    assert!(env
        .swarm(&["escalations", "--run", "r"])
        .ok()
        .stdout
        .trim()
        .is_empty());
    // The standing action is the winner: building on it is fine; contradicting it again
    // without a ref escalates again.
    let ok = env.append_lines("r", &[json!({"agent_id": "app", "type": "action_taken", "subject": "orders-db", "content": "drained primary", "refs": [a[0].seq]})]);
    assert_eq!(ok.len(), 1);
}

/// Competing hypotheses: the pick follows confidence, then evidence, then recency, cites
/// winner and losers; an exact tie is escalated (exit 6), never guessed.
#[test]
fn conflict_resolution_pick_and_tie() {
    let env = Env::new();
    let h = env.append_lines(
        "r",
        &[
            entry("a", "hypothesis", "cause", "pool saturation", 0.6),
            entry("b", "hypothesis", "cause", "bad deploy", 0.6),
        ],
    );
    env.append_lines("r", &[json!({"agent_id": "c", "type": "evidence", "subject": "cause", "content": "deploy at 13:58", "refs": [h[1].seq]})]);
    let out = env
        .swarm(&["pick", "--run", "r", "--subject", "cause"])
        .ok();
    let v: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["outcome"], "picked");
    assert_eq!(
        v["winner"], h[1].seq,
        "more supporting evidence wins at equal confidence"
    );
    assert_eq!(v["rule"], "evidence");
    assert_eq!(v["decision"]["refs"][0], h[1].seq);
    // A tie on every rule.
    let env = Env::new();
    env.append_lines("r", &[entry("a", "hypothesis", "cause", "x", 0.5)]);
    env.append_lines("r", &[entry("a", "hypothesis", "cause", "y", 0.5)]);
    let out = env
        .swarm(&["pick", "--run", "r", "--subject", "cause"])
        .code(6);
    assert!(
        out.stdout.contains("\"outcome\":\"escalated\""),
        "{}",
        out.stdout
    );
}

/// Eight `pick` processes at once, and one more after them, store one decision on a
/// decidable subject and open one escalation on a tie: each stored its own (8 identical
/// decisions; 8 escalations, and resolving one left the subject blocked by another).
#[test]
fn concurrent_picks_store_one_decision_or_one_escalation() {
    let env = Env::new();
    env.append_lines(
        "r",
        &[
            entry("a", "hypothesis", "cause", "pool saturation", 0.7),
            entry("b", "hypothesis", "cause", "bad deploy", 0.6),
            entry("c", "hypothesis", "tie", "x", 0.5),
            entry("c", "hypothesis", "tie", "y", 0.5),
        ],
    );
    let picks = |subject: &str| -> Vec<Value> {
        let kids: Vec<_> = (0..8)
            .map(|_| {
                env.cmd(&["pick", "--run", "r", "--subject", subject])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut out: Vec<Value> = kids
            .into_iter()
            .map(|k| {
                let o = k.wait_with_output().unwrap();
                serde_json::from_slice(&o.stdout)
                    .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)))
            })
            .collect();
        let again = env.swarm(&["pick", "--run", "r", "--subject", subject]);
        out.push(serde_json::from_str(again.stdout.trim()).unwrap());
        out
    };
    let decided = picks("cause");
    let seqs: std::collections::BTreeSet<_> = decided
        .iter()
        .map(|v| v["decision"]["seq"].as_u64())
        .collect();
    assert_eq!(seqs.len(), 1, "{decided:?}");
    assert!(decided.iter().all(|v| v["outcome"] == "picked"));
    let tied = picks("tie");
    assert!(tied.iter().all(|v| v["outcome"] == "escalated"), "{tied:?}");
    let seqs: std::collections::BTreeSet<_> = tied
        .iter()
        .map(|v| v["escalation"]["seq"].as_u64())
        .collect();
    assert_eq!(seqs.len(), 1, "{tied:?}");
    let all = env.read("r");
    let count = |kind: &str, subject: &str| {
        all.iter()
            .filter(|e| e.kind.as_str() == kind && e.subject.as_deref() == Some(subject))
            .count()
    };
    assert_eq!(count("decision", "cause"), 1);
    assert_eq!(count("escalation", "tie"), 1);
    // A seq that is no escalation is named as such.
    let wrong = env.swarm(&[
        "resolve",
        "--run",
        "r",
        "--escalation",
        "999",
        "--by",
        "human",
        "--note",
        "x",
    ]);
    assert_ne!(wrong.code, 0);
    assert!(
        wrong
            .stderr
            .contains("#999 is not an escalation of this run"),
        "{}",
        wrong.stderr
    );
    // Resolving it unblocks the subject.
    let esc = seqs.into_iter().next().flatten().unwrap().to_string();
    env.swarm(&[
        "resolve",
        "--run",
        "r",
        "--escalation",
        &esc,
        "--by",
        "human",
        "--note",
        "x",
    ])
    .ok();
    env.swarm(&[
        "append",
        "--run",
        "r",
        "--agent",
        "c",
        "--type",
        "action_taken",
        "--subject",
        "tie",
        "--content",
        "restart",
    ])
    .ok();
}

/// Picking again answers with the standing decision: the first pick's decision made its
/// agent (`lead`, also the author of one hypothesis) the most recent, and the second pick
/// stored a decision for the other hypothesis "by recency".
#[test]
fn picking_again_does_not_flip_the_decision() {
    let env = Env::new();
    env.append_lines(
        "r",
        &[
            entry("lead", "hypothesis", "rc", "A", 0.7),
            entry("db-1", "hypothesis", "rc", "B", 0.7),
        ],
    );
    let pick = || -> Value {
        let out = env.swarm(&["pick", "--run", "r", "--subject", "rc", "--agent", "lead"]);
        serde_json::from_str(out.ok().stdout.trim()).unwrap()
    };
    let (first, second) = (pick(), pick());
    assert_eq!(first["winner"], second["winner"], "{first} / {second}");
    assert_eq!(first["decision"]["seq"], second["decision"]["seq"]);
    // Something new on the subject: the next pick decides again.
    env.append_lines("r", &[json!({"agent_id": "c", "type": "evidence", "subject": "rc", "content": "supports A", "refs": [1]})]);
    let third = pick();
    assert_eq!(third["winner"], 1, "{third}");
    assert_ne!(third["decision"]["seq"], first["decision"]["seq"]);
}

/// Scratchpad bloat: three agent processes write a long run with a small pruning
/// threshold; summaries cover contiguous ranges, decisions are never summarised away, and
/// the context stays within every budget however long the run gets.
#[test]
fn scratchpad_bloat_is_pruned_and_context_stays_bounded() {
    let env = Env::new();
    env.append_lines(
        "r",
        &[entry(
            "lead",
            "decision",
            "plan",
            "investigate orders-db first",
            0.9,
        )],
    );
    let policy = env.path().join("policy.json");
    std::fs::write(&policy, r#"{"prune_max_entries": 15}"#).unwrap();
    env.swarm(&[
        "policy",
        "set",
        "--run",
        "r",
        "--agent",
        "lead",
        "--file",
        policy.to_str().unwrap(),
    ])
    .ok();
    let mut kids = Vec::new();
    for agent in ["metrics", "logs", "traces"] {
        let lines: String = (0..40)
            .map(|i| {
                format!(
                    "{}\n",
                    entry(
                        agent,
                        "evidence",
                        &format!("s{}", i % 5),
                        &format!("{agent} finding {i}: latency p99 {} ms", 100 + i),
                        0.5
                    )
                )
            })
            .collect();
        let mut c = env
            .cmd(&["append", "--run", "r", "--stdin"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = c.stdin.take().unwrap();
        std::thread::spawn(move || {
            use std::io::Write;
            let _ = stdin.write_all(lines.as_bytes());
        });
        kids.push(c);
    }
    for mut c in kids {
        assert!(c.wait().unwrap().success());
    }
    // Whatever the background pruners of the writers did, explicit prunes finish the job.
    // A prune that loses the range's compare-and-swap to another pruner reads the state
    // again and prunes what is left: it never fails its caller.
    for _ in 0..20 {
        let out = env.swarm(&["prune", "--run", "r"]).ok();
        if out.stdout.contains("\"pruned\":false") {
            break;
        }
    }
    let all = env.read("r");
    let summaries: Vec<_> = all
        .iter()
        .filter(|e| e.kind.as_str() == "summary")
        .collect();
    assert!(!summaries.is_empty());
    let mut next = 1;
    for s in &summaries {
        assert_eq!(
            s.content["from_seq"], next,
            "summaries cover contiguous ranges"
        );
        next = s.content["to_seq"].as_u64().unwrap() + 1;
    }
    let unpinned_after = all
        .iter()
        .filter(|e| e.seq >= next && e.kind.as_str() == "evidence")
        .count();
    assert!(
        unpinned_after <= 15,
        "working view {unpinned_after} over the threshold"
    );
    for budget in [150usize, 400, 1000, 4000] {
        let out = env
            .swarm(&[
                "context",
                "--run",
                "r",
                "--agent",
                "metrics",
                "--budget-bytes",
                &budget.to_string(),
                "--json",
            ])
            .ok();
        let v: Value = serde_json::from_str(out.stdout.trim()).unwrap();
        let text = v["text"].as_str().unwrap();
        assert!(
            text.len() <= budget,
            "context of {} bytes over budget {budget}",
            text.len()
        );
        assert_eq!(v["used_bytes"], text.len());
        // Pinned entries come first (DESIGN: pinned, then summaries, then recent ones):
        // however many summaries the writers' background pruners left, the decision is
        // in the context whenever its line fits the budget at all, before any summary.
        let decision_line = "#1 decision lead [plan]: investigate orders-db first".len();
        if decision_line <= budget {
            assert!(
                text.contains("investigate orders-db first"),
                "pinned decision missing at budget {budget}"
            );
            assert!(
                v["items"][0]["role"] == "pinned",
                "the decision is the first item at budget {budget}"
            );
        }
    }
}

/// `swarm context` prints at most `--budget-bytes` bytes, counted as printed: control
/// and invisible characters (escaped for the terminal), multi-byte UTF-8 and each line's
/// end. The CLI escaped after the library had counted (U+200B, 3 bytes, printed as the 8
/// of `\u{200b}`) and added a newline nobody counted: 234 bytes for a budget of 200.
#[test]
fn context_prints_no_more_than_its_budget() {
    let env = Env::new();
    let nasty = [
        "a\x1b[31mred\x1b[0m\u{202e}abc\x7f",
        "zero\u{200b}width\u{feff} and\ttab\nnew line\r",
        "ünïcödé 中文 ✓ 🦀 \u{9b}2J",
        "plain ascii evidence with some length to it",
    ];
    let lines: Vec<Value> = (0..12)
        .map(|i| entry("a", "evidence", "s\u{200b}", nasty[i % nasty.len()], 0.5))
        .collect();
    env.append_lines("c", &lines);
    for budget in (0..=400).step_by(13) {
        let b = budget.to_string();
        let args = [
            "context",
            "--run",
            "c",
            "--agent",
            "a",
            "--budget-bytes",
            &b,
        ];
        let text = env.swarm(&args).ok().stdout;
        assert!(
            text.len() <= budget,
            "{} bytes printed for a budget of {budget}: {text:?}",
            text.len()
        );
        assert!(
            !text.chars().any(|c| (c.is_control() && c != '\n')
                || matches!(c, '\u{200b}' | '\u{202e}' | '\u{feff}')),
            "{text:?}"
        );
        let mut json_args = args.to_vec();
        json_args.push("--json");
        let v: Value = serde_json::from_str(env.swarm(&json_args).ok().stdout.trim()).unwrap();
        assert_eq!(v["text"].as_str().unwrap(), text, "budget {budget}");
        assert_eq!(v["used_bytes"], text.len(), "budget {budget}");
        if budget >= 200 {
            assert!(text.lines().count() >= 2, "{budget}: {text:?}");
        }
    }
}

/// Sets `run`'s policy: `lead` an admin shown everything, `db` as `db_rights` say.
fn lead_and_db(env: &Env, run: &str, db_rights: &str) {
    let policy = env.path().join("pol.json");
    let lead = r#"{"read_types":["*"],"write_types":["*"],"read_channels":["*"],"write_channels":["*"],"admin":true}"#;
    let text = format!(r#"{{"permissions":{{"lead":{lead},"db":{db_rights}}}}}"#);
    std::fs::write(&policy, text).unwrap();
    let p = policy.to_str().unwrap();
    env.swarm(&[
        "policy", "set", "--run", run, "--agent", "lead", "--file", p,
    ])
    .ok();
}

/// An agent that may not read summaries (they quote every type) keeps, after a prune,
/// the entries it may read that the summary replaced: they left its context with nothing
/// in their place (10 lines before the prune, 5 after, `omitted` empty).
#[test]
fn a_prune_takes_nothing_from_an_agent_not_shown_summaries() {
    let env = Env::new();
    lead_and_db(
        &env,
        "c",
        r#"{"read_types":["evidence"],"write_types":["evidence"]}"#,
    );
    let lines: Vec<Value> = (1..=10)
        .map(|i| {
            entry(
                "lead",
                "evidence",
                &format!("s{i}"),
                &format!("evidence number {i}"),
                0.5,
            )
        })
        .collect();
    env.append_lines("c", &lines);
    let ctx = |agent: &str| -> Value {
        let args = [
            "context",
            "--run",
            "c",
            "--agent",
            agent,
            "--budget-bytes",
            "100000",
            "--json",
        ];
        serde_json::from_str(env.swarm(&args).ok().stdout.trim()).unwrap()
    };
    let before = ctx("db");
    assert_eq!(before["items"].as_array().unwrap().len(), 10, "{before}");
    env.swarm(&["prune", "--run", "c", "--force", "--agent", "lead"])
        .ok();
    let after = ctx("db");
    assert_eq!(
        after["text"], before["text"],
        "db's context after the prune"
    );
    // The lead, shown summaries, gets the summary instead of the entries it replaced.
    let lead = ctx("lead");
    let items = lead["items"].as_array().unwrap();
    assert!(items.iter().any(|i| i["role"] == "summary"), "{lead}");
    assert!(items.len() < 10, "{lead}");
}

/// `replay --agent A` counts what A may read, not the run's whole length: it said
/// `visible_entries: 22` to an agent shown 2 events, which told it how many were hidden.
#[test]
fn an_agents_replay_counts_only_what_it_may_read() {
    let env = Env::new();
    lead_and_db(
        &env,
        "r",
        r#"{"read_types":["evidence"],"write_types":["evidence"],"read_channels":["ops"]}"#,
    );
    let mut lines: Vec<Value> = (1..=6)
        .map(|i| entry("lead", "hypothesis", &format!("secret{i}"), "hidden", 0.5))
        .collect();
    lines.push(entry("lead", "evidence", "s", "visible", 0.5));
    env.append_lines("r", &lines);
    for (channel, n) in [("ops", 2), ("secret", 3)] {
        env.swarm(&[
            "channel",
            "declare",
            "--run",
            "r",
            "--agent",
            "lead",
            "--channel",
            channel,
            "--kind",
            "append",
        ])
        .ok();
        for i in 0..n {
            let v = format!("{{\"n\":{i}}}");
            env.swarm(&[
                "channel",
                "write",
                "--run",
                "r",
                "--agent",
                "lead",
                "--channel",
                channel,
                "--value",
                &v,
            ])
            .ok();
        }
    }
    for agent in ["db", "lead", "nobody"] {
        let read = env.swarm(&["read", "--run", "r", "--as-agent", agent]).ok();
        let readable = read.stdout.lines().count();
        let v: Value = serde_json::from_str(
            env.swarm(&["replay", "--run", "r", "--agent", agent])
                .ok()
                .stdout
                .trim(),
        )
        .unwrap();
        assert_eq!(v["visible_entries"], readable, "{agent}: {v}");
    }
}

/// A failing, silent or slow summariser leaves the run byte for byte unchanged.
#[test]
fn failing_summarizer_changes_nothing() {
    let env = Env::new();
    env.append_lines(
        "r",
        &[
            entry("a", "evidence", "s", "one", 0.5),
            entry("a", "evidence", "s", "two", 0.5),
        ],
    );
    let before = env.snapshot();
    for cmd in ["false", "true", "sleep 5"] {
        env.swarm(&[
            "prune",
            "--run",
            "r",
            "--force",
            "--summarizer-cmd",
            cmd,
            "--timeout-secs",
            "1",
        ])
        .code(1);
    }
    let after = env.snapshot();
    let seg = |m: &std::collections::BTreeMap<std::path::PathBuf, Vec<u8>>| {
        m.iter()
            .filter(|(p, _)| p.to_string_lossy().contains("seg-"))
            .map(|(_, b)| b.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(seg(&before), seg(&after));
    let out = env
        .swarm(&[
            "prune",
            "--run",
            "r",
            "--force",
            "--summarizer-cmd",
            "SECRET_KEY=sk-live-abcdef123456 python3 -c 'import json,sys; print(len(json.load(sys.stdin)), \"events\")'",
            "--summarizer-name",
            "counter",
        ])
        .ok();
    assert!(out.stdout.contains("1 events"), "{}", out.stdout);
    // The summary names the summariser; the command line (and the key in it) is not stored.
    assert!(
        out.stdout.contains("\"summarizer\":\"cmd:counter\""),
        "{}",
        out.stdout
    );
    let stored = env.snapshot();
    assert!(!stored
        .values()
        .any(|b| b.windows(7).any(|w| w == b"sk-live")));
}

/// Audit completeness: every decision and action written by several processes is in the
/// archive after close, byte for byte; the closed run refuses appends; restore round-trips.
#[test]
fn audit_trail_survives_close_archive_and_restore() {
    let env = Env::new();
    for agent in ["a", "b", "c"] {
        env.append_lines(
            "r",
            &[
                entry(agent, "decision", &format!("{agent}-plan"), "decide", 0.5),
                entry(agent, "evidence", "shared", "seen", 0.5),
                entry(agent, "action_taken", &format!("{agent}-svc"), "acted", 0.5),
            ],
        );
    }
    env.swarm(&["prune", "--run", "r", "--force"]).ok();
    let before = env.read("r");
    let mut seg_before = std::fs::read(&env.segments("r")[0]).unwrap();
    // The frames; the active segment's zero fill after them is not archived.
    seg_before.truncate(
        seg_before
            .iter()
            .rposition(|&b| b != 0)
            .map_or(0, |i| i + 1),
    );
    let out = env.swarm(&["run", "close", "r", "--by", "lead"]).ok();
    assert!(out.stdout.contains(".swarc"));
    assert!(env.segments("r").is_empty(), "the run left the working set");
    let after = env.read("r");
    let audit = |v: &[swarm_memory::Event]| {
        v.iter()
            .filter(|e| e.kind.is_pinned())
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(audit(&before), audit(&after));
    assert_eq!(audit(&after).len(), 6);
    assert_eq!(after.last().unwrap().kind.as_str(), "run_closed");
    env.swarm(&["verify", "--run", "r"]).ok();
    env.swarm(&[
        "append",
        "--run",
        "r",
        "--agent",
        "a",
        "--type",
        "evidence",
        "--content",
        "late",
    ])
    .code(5);
    env.swarm(&["run", "restore", "r"]).ok();
    let seg_after = std::fs::read(&env.segments("r")[0]).unwrap();
    assert_eq!(
        &seg_after[..seg_before.len()],
        &seg_before[..],
        "restored bytes are the original bytes"
    );
    env.swarm(&[
        "append",
        "--run",
        "r",
        "--agent",
        "a",
        "--type",
        "evidence",
        "--content",
        "late",
    ])
    .code(5);
}

/// User isolation: another user's run is not found on any path, and writing the same run
/// id goes to the writer's own partition.
#[test]
fn users_never_see_each_others_runs() {
    let env = Env::new();
    env.swarm_stdin(
        &["--user", "alice", "append", "--run", "r", "--stdin"],
        &format!("{}\n", entry("a", "evidence", "s", "alice's secret", 0.5)),
    )
    .ok();
    for args in [
        vec!["read", "--run", "r"],
        vec!["verify", "--run", "r"],
        vec!["replay", "--run", "r"],
        vec!["board", "--run", "r"],
        vec![
            "context",
            "--run",
            "r",
            "--agent",
            "x",
            "--budget-bytes",
            "100",
        ],
        vec!["checkpoint", "--run", "r"],
    ] {
        let mut full = vec!["--user", "bob"];
        full.extend(args);
        env.swarm(&full).code(2);
    }
    assert!(!env
        .swarm(&["--user", "bob", "runs", "--json"])
        .ok()
        .stdout
        .contains("\"r\""));
    env.swarm_stdin(
        &["--user", "bob", "append", "--run", "r", "--stdin"],
        &format!("{}\n", entry("b", "evidence", "s", "bob's", 0.5)),
    )
    .ok();
    let bob = env
        .swarm(&["--user", "bob", "read", "--run", "r"])
        .ok()
        .stdout;
    assert!(!bob.contains("secret"));
    let alice = env
        .swarm(&["--user", "alice", "read", "--run", "r"])
        .ok()
        .stdout;
    assert!(alice.contains("secret") && !alice.contains("bob's"));
    env.swarm(&["--user", "anonymous", "--deny-anonymous", "runs"])
        .code(5);
}

/// The board stays small however long the run: a subject lists its 16 latest seqs and
/// counts every write; `--history` lists them all.
#[test]
fn board_lists_recent_history_and_counts_every_write() {
    let env = Env::new();
    let lines: Vec<Value> = (0..40)
        .map(|i| {
            let subject = if i == 1 { "quiet" } else { "busy" };
            entry("a", "evidence", subject, &format!("reading {i}"), 0.5)
        })
        .collect();
    let stored = env.append_lines("r", &lines);
    let seqs = |subject: &str| -> Vec<u64> {
        stored
            .iter()
            .filter(|e| e.subject.as_deref() == Some(subject))
            .map(|e| e.seq)
            .collect()
    };
    let (busy, quiet) = (seqs("busy"), seqs("quiet"));
    assert_eq!((busy.len(), quiet.len()), (39, 1));
    let board = |extra: &[&str]| -> Vec<Value> {
        let mut args = vec!["board", "--run", "r"];
        args.extend_from_slice(extra);
        env.swarm(&args)
            .ok()
            .stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let history = |e: &Value| -> Vec<u64> {
        e["history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect()
    };
    let short = board(&[]);
    assert_eq!(short.len(), 2);
    assert_eq!(short[0]["subject"], "busy");
    assert_eq!(short[0]["writes"], 39);
    assert_eq!(
        history(&short[0]),
        busy[39 - 16..].to_vec(),
        "the 16 latest, oldest first"
    );
    assert_eq!(short[0]["version"], *busy.last().unwrap());
    assert_eq!(short[1]["writes"], 1);
    assert_eq!(history(&short[1]), quiet);
    let full = board(&["--history"]);
    assert_eq!(full[0]["writes"], 39);
    assert_eq!(history(&full[0]), busy, "every seq with --history");
    let one = board(&["--subject", "busy"]);
    assert_eq!(one.len(), 1);
    assert_eq!(history(&one[0]).len(), 16);
}

/// Cross-agent influence: a later agent acts on a peer's finding, never on stale state.
/// B reads the board, A writes a newer finding, B's write based on the old version is
/// refused (exit 4); B re-reads and its next entry builds on A's finding.
#[test]
fn cross_agent_influence_never_acts_on_stale_state() {
    let env = Env::new();
    env.append_lines(
        "r",
        &[entry("b", "evidence", "orders-db", "pool at 60/100", 0.6)],
    );
    let board = |env: &Env| -> Value {
        serde_json::from_str(
            env.swarm(&["board", "--run", "r", "--subject", "orders-db"])
                .ok()
                .stdout
                .trim(),
        )
        .unwrap()
    };
    let seen = board(&env)["version"].as_u64().unwrap();
    let a = env.append_lines(
        "r",
        &[entry(
            "a",
            "evidence",
            "orders-db",
            "pool pinned at 100/100",
            0.9,
        )],
    );
    env.swarm(&[
        "append",
        "--run",
        "r",
        "--agent",
        "b",
        "--type",
        "action_taken",
        "--subject",
        "orders-db",
        "--content",
        "no action needed",
        "--expect-subject-seq",
        &seen.to_string(),
    ])
    .code(4);
    let now = board(&env);
    assert_eq!(now["version"], a[0].seq);
    assert_eq!(now["value"]["agent_id"], "a");
    let out = env
        .swarm(&[
            "append",
            "--run",
            "r",
            "--agent",
            "b",
            "--type",
            "action_taken",
            "--subject",
            "orders-db",
            "--content",
            "raised max_connections to 200",
            "--ref",
            &a[0].seq.to_string(),
            "--expect-subject-seq",
            &a[0].seq.to_string(),
        ])
        .ok();
    let e = out.events();
    assert_eq!(
        e[0].refs,
        vec![a[0].seq],
        "the action builds on the peer's finding"
    );
}

/// Several processes prune one run while writers append (whose background pruners race
/// them too): every pruner exits 0 (a lost race re-reads the state and prunes what is
/// left, or reports nothing to do), summaries never overlap, and every unpinned entry is
/// either still in the working view or covered by exactly one summary.
#[test]
fn concurrent_pruners_never_fail_a_caller() {
    let env = Env::new();
    let policy = env.path().join("policy.json");
    std::fs::write(&policy, r#"{"prune_max_entries": 10}"#).unwrap();
    env.append_lines("r", &[entry("lead", "decision", "plan", "start", 0.9)]);
    env.swarm(&[
        "policy",
        "set",
        "--run",
        "r",
        "--agent",
        "lead",
        "--file",
        policy.to_str().unwrap(),
    ])
    .ok();
    let mut writers = Vec::new();
    for agent in ["metrics", "logs"] {
        let lines: String = (0..60)
            .map(|i| {
                format!(
                    "{}\n",
                    entry(
                        agent,
                        "evidence",
                        &format!("s{}", i % 4),
                        &format!("{agent} {i}"),
                        0.5
                    )
                )
            })
            .collect();
        let mut c = env
            .cmd(&["append", "--run", "r", "--stdin"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = c.stdin.take().unwrap();
        std::thread::spawn(move || {
            use std::io::Write;
            let _ = stdin.write_all(lines.as_bytes());
        });
        writers.push(c);
    }
    let pruners: Vec<_> = (0..4)
        .map(|_| {
            let mut cmd = env.cmd(&["prune", "--run", "r", "--force"]);
            std::thread::spawn(move || {
                (0..5)
                    .map(|_| cmd.output().expect("run prune"))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for p in pruners {
        for out in p.join().unwrap() {
            assert_eq!(
                out.status.code(),
                Some(0),
                "a pruner failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    for w in writers {
        let out = w.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let events = env.check_run("r");
    let mut covered = std::collections::BTreeMap::new();
    let summaries: Vec<_> = events
        .iter()
        .filter(|e| e.kind.as_str() == "summary")
        .collect();
    assert!(!summaries.is_empty());
    let mut last_to = 0;
    for s in &summaries {
        let (from, to) = (
            s.content["from_seq"].as_u64().unwrap(),
            s.content["to_seq"].as_u64().unwrap(),
        );
        assert_eq!(
            from,
            last_to + 1,
            "summaries overlap or leave a hole: {:?}",
            s.content
        );
        last_to = to;
        for seq in from..=to {
            *covered.entry(seq).or_insert(0) += 1;
        }
    }
    for e in events
        .iter()
        .filter(|e| e.kind.is_client() && !e.kind.is_pinned())
    {
        assert!(
            covered.get(&e.seq).copied().unwrap_or(0) <= 1,
            "seq {} summarised twice",
            e.seq
        );
    }
    // Pinned entries are never summarised away: the decision is still in the context.
    let ctx = env
        .swarm(&[
            "context",
            "--run",
            "r",
            "--agent",
            "lead",
            "--budget-bytes",
            "100000",
        ])
        .ok();
    assert!(ctx.stdout.contains("start"), "{}", ctx.stdout);
}

/// A run's read policy holds for what quotes entries, not only for the entries: an agent
/// shown evidence alone gets no escalation (it quotes two decisions), no prune summary
/// (it quotes hypotheses), and only facts whose every source it may read, from the
/// facts list, `explain`, and search (library calls, which the CLI, HTTP and MCP use).
#[test]
fn quoting_events_and_facts_follow_the_read_policy() {
    use swarm_memory::fold::rules::Policy;
    use swarm_memory::synth::search::{search, Ranker, SearchQuery};
    use swarm_memory::synth::{FactsQuery, SynthOptions};
    use swarm_memory::{Durability, EventType, NewEvent, ReadOptions};

    let dir = tempfile::tempdir().unwrap();
    let store = alice_store(dir.path());
    let add = |agent: &str, kind: EventType, subject: &str, text: &str| {
        let mut e = NewEvent::new(agent, kind, text.to_string());
        e.subject = Some(subject.to_string());
        e.confidence = Some(0.8);
        store.append("r", e, Durability::None)
    };
    let policy: Policy = serde_json::from_value(json!({
        "permissions": {
            "lead": {"read_types": ["*"], "write_types": ["*"], "admin": true},
            "ops": {"read_types": ["*"], "write_types": ["*"]},
            "db": {"read_types": ["evidence"], "write_types": ["evidence", "hypothesis"]}
        },
        "prune_max_entries": 1000
    }))
    .unwrap();
    store.set_policy("r", "lead", &policy).unwrap();
    add(
        "lead",
        EventType::Hypothesis,
        "root",
        "SECRETHYPO vendor breach",
    )
    .unwrap();
    add(
        "db",
        EventType::Evidence,
        "pool",
        "connection pool exhausted at 40",
    )
    .unwrap();
    // The same words as a hypothesis of the lead's: formed lexically (by subject), the
    // fact holds both types, so db, not shown hypotheses, must not get it.
    add(
        "lead",
        EventType::Hypothesis,
        "pool",
        "connection pool exhausted at 40",
    )
    .unwrap();
    add("db", EventType::Evidence, "disk", "disk full on ingest-3").unwrap();
    add(
        "lead",
        EventType::Decision,
        "payments",
        "SECRETA fail over payments",
    )
    .unwrap();
    // A second agent's contradicting decision is escalated.
    let _ = add(
        "ops",
        EventType::Decision,
        "payments",
        "SECRETB keep payments",
    );
    let esc = store.escalations("r", true).unwrap();
    assert_eq!(esc.len(), 1, "the contradicting decision is escalated");
    assert_eq!(
        store.escalations_as("r", true, Some("lead")).unwrap().len(),
        1
    );
    assert!(store
        .escalations_as("r", true, Some("db"))
        .unwrap()
        .is_empty());
    store
        .prune("r", "lead", &swarm_memory::fold::summary::Builtin, true)
        .unwrap()
        .expect("a summary");

    let read_as = |agent: &str| -> Vec<swarm_memory::Event> {
        let opts = ReadOptions {
            reader: Some(agent.into()),
            ..ReadOptions::default()
        };
        let it = store.read("r", opts).unwrap();
        it.collect::<Result<_, _>>().unwrap()
    };
    let as_db = read_as("db");
    let text = serde_json::to_string(&as_db).unwrap();
    assert!(text.contains("connection pool exhausted"), "{text}");
    for secret in ["SECRETHYPO", "secreta", "SECRETA", "secretb", "SECRETB"] {
        assert!(!text.contains(secret), "{secret} reached db: {text}");
    }
    for kind in ["escalation", "summary"] {
        assert!(as_db.iter().all(|e| e.kind.as_str() != kind), "{kind}");
    }
    // The lead is shown everything, the summary and the escalation included.
    let as_lead = read_as("lead");
    for kind in ["escalation", "summary", "hypothesis"] {
        assert!(as_lead.iter().any(|e| e.kind.as_str() == kind), "{kind}");
    }
    let ctx = serde_json::to_string(&store.context("r", "db", 8000).unwrap()).unwrap();
    assert!(!ctx.contains("SECRET") && !ctx.contains("secret"), "{ctx}");
    let ctx = serde_json::to_string(&store.context("r", "lead", 8000).unwrap()).unwrap();
    assert!(ctx.contains("summary"), "{ctx}");

    store.synth(&SynthOptions::default(), |_| {}).unwrap();
    let all = store.facts(&FactsQuery::default()).unwrap();
    let kinds = |a: &swarm_memory::synth::FactsAnswer| {
        a.facts
            .iter()
            .map(|f| f.kind.clone())
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert!(kinds(&all).contains("hypothesis"), "{:?}", kinds(&all));
    let for_db = store
        .facts(&FactsQuery {
            reader: Some("db".into()),
            ..FactsQuery::default()
        })
        .unwrap();
    assert_eq!(kinds(&for_db).into_iter().collect::<Vec<_>>(), ["evidence"]);
    let mixed = all
        .facts
        .iter()
        .find(|f| f.text.contains("connection pool"))
        .unwrap();
    assert_eq!(
        mixed.kinds.as_deref(),
        Some(&["evidence".to_string(), "hypothesis".to_string()][..])
    );
    let texts: Vec<_> = for_db.facts.iter().map(|f| f.text.as_str()).collect();
    assert_eq!(texts, ["disk full on ingest-3"]);
    assert!(store.explain_fact_as(&mixed.id, 10, Some("db")).is_err());
    let hypo = all.facts.iter().find(|f| f.kind == "hypothesis").unwrap();
    assert!(store.explain_fact_as(&hypo.id, 10, Some("db")).is_err());
    assert!(store.explain_fact_as(&hypo.id, 10, Some("lead")).is_ok());
    let q = |reader: &str| SearchQuery {
        filters: ReadOptions {
            reader: Some(reader.into()),
            ..ReadOptions::default()
        },
        ..SearchQuery::new("SECRETHYPO vendor breach")
    };
    let hits = |reader: &str| {
        let a = search(&store, &q(reader), Ranker::Lexical("test")).unwrap();
        serde_json::to_string(&a.hits).unwrap()
    };
    assert!(hits("lead").contains("SECRETHYPO"));
    assert!(!hits("db").contains("SECRETHYPO"), "{}", hits("db"));
}

/// The board shows an agent nothing of the entries its policy hides: beside a subject
/// whose latest entry it may read, `writes`, `history`, `hypotheses` and `blocked_by`
/// counted and listed the seqs of hypotheses, decisions and escalations hidden from it.
#[test]
fn board_counts_and_lists_only_entries_the_reader_may_read() {
    use swarm_memory::fold::rules::Policy;
    use swarm_memory::{Durability, EventType, NewEvent};

    let dir = tempfile::tempdir().unwrap();
    let store = alice_store(dir.path());
    let add = |agent: &str, kind: EventType, text: &str| {
        let mut e = NewEvent::new(agent, kind, text.to_string());
        e.subject = Some("db".to_string());
        e.confidence = Some(0.5);
        store.append("r", e, Durability::None)
    };
    let policy: Policy = serde_json::from_value(json!({
        "permissions": {
            "lead": {"read_types": ["*"], "write_types": ["*"], "admin": true},
            "ops": {"read_types": ["*"], "write_types": ["*"]},
            "db": {"read_types": ["evidence"], "write_types": ["evidence"]}
        }
    }))
    .unwrap();
    store.set_policy("r", "lead", &policy).unwrap();
    let e1 = add("db", EventType::Evidence, "pool at 40").unwrap().seq;
    add("lead", EventType::Hypothesis, "vendor breach").unwrap();
    add("lead", EventType::Decision, "fail over").unwrap();
    // Contradicts the lead's decision: escalated, the subject blocked.
    let _ = add("ops", EventType::Decision, "keep it");
    let e2 = add("db", EventType::Evidence, "pool at 41").unwrap().seq;

    let entry = |reader: Option<&str>, full: bool| {
        let b = store.board_with("r", reader, Some("db"), full).unwrap();
        assert_eq!(b.len(), 1);
        b.into_iter().next().unwrap()
    };
    let lead = entry(Some("lead"), true);
    assert_eq!(lead.writes, 5);
    assert_eq!(lead.hypotheses.len(), 1);
    assert!(lead.blocked_by.is_some());
    for full in [false, true] {
        let db = entry(Some("db"), full);
        assert_eq!(db.version, e2);
        assert_eq!(db.writes, 2, "{db:?}");
        assert_eq!(db.history, [e1, e2], "{db:?}");
        assert!(db.hypotheses.is_empty(), "{db:?}");
        assert_eq!(db.blocked_by, None, "{db:?}");
    }
    // Unfiltered (the CLI as the user) and an agent shown everything see it all.
    assert_eq!(entry(None, false).history, lead.history);
}

/// An agent that may write a channel but not read it learns neither the channel's version
/// nor its size from a refused write: the conflict and the size errors named both. A
/// reader of the channel keeps the detailed errors.
#[test]
fn channel_errors_hide_version_and_size_from_a_writer_that_may_not_read() {
    use swarm_memory::fold::rules::{ChannelDecl, ChannelKind, ConflictPolicy, Policy};

    let dir = tempfile::tempdir().unwrap();
    let store = alice_store(dir.path());
    let policy: Policy = serde_json::from_value(json!({
        "permissions": {
            "lead": {"read_types": ["*"], "write_types": ["*"], "read_channels": ["*"],
                     "write_channels": ["*"], "admin": true},
            "drop": {"read_types": ["*"], "write_channels": ["*"]}
        }
    }))
    .unwrap();
    store.set_policy("r", "lead", &policy).unwrap();
    for (name, kind) in [("cas", ChannelKind::Replace), ("log", ChannelKind::Append)] {
        let decl = ChannelDecl {
            channel: name.into(),
            kind,
            on_conflict: ConflictPolicy::Reject,
            max_size_kb: 1,
        };
        store.declare_channel("r", "lead", &decl).unwrap();
    }
    let v1 = store
        .write_channel("r", "lead", "cas", json!("a"), Some(0))
        .unwrap()
        .seq;
    let v2 = store
        .write_channel("r", "lead", "cas", json!("b"), Some(v1))
        .unwrap()
        .seq;
    let log = store
        .write_channel("r", "lead", "log", json!("x".repeat(700)), Some(0))
        .unwrap()
        .seq;
    let stale = |agent: &str| {
        store
            .write_channel("r", agent, "cas", json!("c"), Some(v1))
            .unwrap_err()
            .to_string()
    };
    let big = |agent: &str| {
        store
            .write_channel("r", agent, "log", json!("y".repeat(400)), Some(log))
            .unwrap_err()
            .to_string()
    };
    assert!(
        stale("lead").contains(&format!("version {v2}")),
        "{}",
        stale("lead")
    );
    assert!(big("lead").contains("bytes"), "{}", big("lead"));
    let (s, b) = (stale("drop"), big("drop"));
    assert!(s.contains("not at the version"), "{s}");
    assert!(!s.contains(&v2.to_string()), "{s}");
    assert!(b.contains("size limit"), "{b}");
    assert!(
        !b.contains("bytes") && !b.chars().any(|c| c.is_ascii_digit()),
        "{b}"
    );
}

/// Messages a remote client gets (over HTTP and MCP) name no absolute path of the server:
/// an append to or a second close of an archived run said "archived at /abs/…", and
/// verify's `rebuilt` named the `SYNCED` file by its absolute path.
#[test]
fn messages_name_paths_relative_to_the_data_and_archive_dirs() {
    use swarm_memory::{Durability, EventType, NewEvent};

    let dir = tempfile::tempdir().unwrap();
    let abs = dir.path().to_string_lossy().into_owned();
    let store = alice_store(dir.path());
    let add = |run: &str| {
        let e = NewEvent::new("lead", EventType::Evidence, "pool at 40".to_string());
        store.append(run, e, Durability::Sync)
    };
    add("r").unwrap();
    add("v").unwrap();
    store.close_run("r", "lead").unwrap();
    // A process that never wrote the run (this one refuses it from its cached log).
    let other = alice_store(dir.path());
    let e = NewEvent::new("lead", EventType::Evidence, "pool at 41".to_string());
    let appended = other
        .append("r", e, Durability::Sync)
        .unwrap_err()
        .to_string();
    assert!(appended.contains("r.swarc"), "{appended}");
    assert!(!appended.contains(&abs), "{appended}");
    let closed = store.close_run("r", "lead").unwrap_err().to_string();
    assert!(
        closed.contains("r.swarc") && !closed.contains(&abs),
        "{closed}"
    );

    std::fs::remove_file(store.run_dir("v").unwrap().join("SYNCED")).unwrap();
    let rebuilt = store.verify("v", |_| {}).unwrap().rebuilt.join("; ");
    assert!(rebuilt.contains("alice/v/SYNCED: missing"), "{rebuilt}");
    assert!(!rebuilt.contains(&abs), "{rebuilt}");
}

/// The engine events an agent writes itself follow the run's policy too: an agent not
/// shown hypotheses cannot prune (the summary quotes them and is answered to its writer),
/// pick or resolve (they name hypotheses, decisions, their agents and seqs); only an admin
/// closes the run; and a replay's view of an earlier point hides what the policy in force
/// now hides (a policy set after an entry was written hides it from every read).
/// The engine's own name skips the run's permission checks, so no caller may act as it:
/// an agent naming `swarm-engine` could otherwise replace a policy without being its
/// admin, close the run, or write a channel and a resolution past the policy (a review
/// did so over HTTP with a `swarm-*` token), and read what the policy hid.
#[test]
fn no_caller_acts_as_the_engine() {
    use swarm_memory::fold::rules::Policy;
    use swarm_memory::{Durability, Error, EventType, NewEvent};

    let dir = tempfile::tempdir().unwrap();
    let store = alice_store(dir.path());
    let policy: Policy = serde_json::from_value(json!({
        "permissions": {
            "lead": {"read_types": ["*"], "write_types": ["*"], "admin": true},
            "*": {"read_types": ["evidence"], "write_types": ["evidence"]}
        }
    }))
    .unwrap();
    store.set_policy("r", "lead", &policy).unwrap();
    let mut e = NewEvent::new("lead", EventType::Hypothesis, "SECRETHYPO".to_string());
    e.subject = Some("cause".to_string());
    store.append("r", e, Durability::None).unwrap();
    let open: Policy = serde_json::from_value(json!({
        "permissions": {"*": {"read_types": ["*"], "write_types": ["*"], "admin": true}}
    }))
    .unwrap();
    let refused = |r: Result<(), Error>, what: &str| match r {
        Err(Error::Invalid { ref reason, .. }) if reason.contains("reserved") => {}
        other => panic!("{what}: {other:?}"),
    };
    let engine = "swarm-engine";
    refused(store.set_policy("r", engine, &open).map(|_| ()), "policy");
    refused(store.close_run("r", engine).map(|_| ()), "close");
    refused(
        store
            .prune("r", engine, &swarm_memory::fold::summary::Builtin, true)
            .map(|_| ()),
        "prune",
    );
    let decl = serde_json::from_value(json!({"channel": "c", "kind": "replace", "max_size_kb": 4}))
        .unwrap();
    refused(
        store.declare_channel("r", engine, &decl).map(|_| ()),
        "declare",
    );
    refused(
        store
            .write_channel("r", engine, "c", json!(1), None)
            .map(|_| ()),
        "channel write",
    );
    // The policy is the lead's, and what it hides stays hidden.
    assert_eq!(store.policy("r").unwrap().unwrap(), policy);
    let opts = swarm_memory::ReadOptions {
        reader: Some("db".into()),
        ..Default::default()
    };
    let seen: Vec<String> = store
        .read("r", opts)
        .unwrap()
        .map(|e| e.unwrap().content.to_string())
        .collect();
    assert!(!seen.iter().any(|c| c.contains("SECRETHYPO")), "{seen:?}");
}

#[test]
fn agents_write_engine_events_only_as_the_policy_allows() {
    use swarm_memory::fold::replay::Target;
    use swarm_memory::fold::rules::Policy;
    use swarm_memory::{Durability, Error, EventType, NewEvent};

    let dir = tempfile::tempdir().unwrap();
    let store = alice_store(dir.path());
    let add = |agent: &str, kind: EventType, subject: &str, text: &str, conf: f64| {
        let mut e = NewEvent::new(agent, kind, text.to_string());
        e.subject = Some(subject.to_string());
        e.confidence = Some(conf);
        store.append("r", e, Durability::None)
    };
    // Written before any policy: the policy set later hides it all the same.
    add(
        "lead",
        EventType::Hypothesis,
        "cause",
        "SECRETHYPO vendor breach",
        0.5,
    )
    .unwrap();
    add(
        "lead",
        EventType::Hypothesis,
        "cause",
        "SECRETTWO expired cert",
        0.5,
    )
    .unwrap();
    let policy: Policy = serde_json::from_value(json!({
        "permissions": {
            "lead": {"read_types": ["*"], "write_types": ["*"], "admin": true},
            "db": {"read_types": ["evidence"], "write_types": ["evidence"]}
        }
    }))
    .unwrap();
    store.set_policy("r", "lead", &policy).unwrap();
    add("db", EventType::Evidence, "pool", "pool exhausted", 0.8).unwrap();
    let forbidden = |r: Result<_, Error>, what: &str| match r {
        Err(Error::Forbidden(_)) => {}
        Err(e) => panic!("{what}: {e}"),
        Ok(_) => panic!("{what} was allowed"),
    };
    let head = store.head_state("r").unwrap().state.head_seq;
    forbidden(
        store
            .prune("r", "db", &swarm_memory::fold::summary::Builtin, true)
            .map(|_| ()),
        "db's prune",
    );
    forbidden(store.pick("r", "db", "cause").map(|_| ()), "db's pick");
    forbidden(store.close_run("r", "db").map(|_| ()), "db's close");
    assert_eq!(
        store.head_state("r").unwrap().state.head_seq,
        head,
        "nothing was written"
    );
    // A failed CAS on a subject whose entries db is not shown does not name their seq.
    let mut probe = NewEvent::new("db", EventType::Evidence, "probe".to_string());
    probe.subject = Some("cause".into());
    probe.expect_subject_seq = Some(1);
    match store.append("r", probe, Durability::None) {
        Err(Error::Conflict(m)) => assert!(!m.contains("is at seq"), "{m}"),
        other => panic!("expected a conflict: {other:?}"),
    }
    // The lead's pick ties and escalates; db may not resolve it.
    let esc = match store.pick("r", "lead", "cause").unwrap() {
        swarm_memory::PickOutcome::Escalated { .. } => store.escalations("r", true).unwrap()[0].seq,
        other => panic!("expected a tie: {other:?}"),
    };
    forbidden(
        store.resolve("r", "db", esc, Some(1), "probe").map(|_| ()),
        "db's resolve",
    );
    // A replay of the point before the policy, as db: the hypotheses stay hidden.
    let at = store.state_at("r", Target::Seq(2), |_| {}).unwrap().state;
    let view = store.agent_view("r", &at, "db").unwrap();
    let text = serde_json::to_string(&view).unwrap();
    assert!(!text.contains("SECRET"), "{text}");
    let lead = serde_json::to_string(&store.agent_view("r", &at, "lead").unwrap()).unwrap();
    assert!(lead.contains("SECRETTWO"), "{lead}");
    // A policy that leaves no admin (nobody could change it again) or names a type that
    // does not exist (a typo hides or bars a type silently) is refused.
    for bad in [
        json!({"permissions": {"db": {"read_types": ["evidence"], "write_types": ["evidence"]}}}),
        json!({"permissions": {"lead": {"read_types": ["*"], "write_types": ["*"], "admin": true},
                               "db": {"read_types": ["evidnce"]}}}),
    ] {
        let p: Policy = serde_json::from_value(bad.clone()).unwrap();
        match store.set_policy("r", "lead", &p) {
            Err(Error::Invalid { field, .. }) => assert_eq!(field, "policy", "{bad}"),
            other => panic!("{bad} was not refused: {other:?}"),
        }
    }
    // The lead, an admin shown everything, prunes and closes.
    store
        .prune("r", "lead", &swarm_memory::fold::summary::Builtin, true)
        .unwrap()
        .expect("a summary");
    store.close_run("r", "lead").unwrap();
}

/// `last: N` read as an agent gives the last N events that agent is shown, however many
/// hidden ones come after them (the index plans the last N of all events; those may be
/// all hidden), with and without a key filter.
#[test]
fn last_n_as_an_agent_counts_the_events_it_is_shown() {
    use swarm_memory::fold::rules::Policy;
    use swarm_memory::{Durability, EventType, NewEvent, ReadOptions};

    let dir = tempfile::tempdir().unwrap();
    let store = alice_store(dir.path());
    let add = |agent: &str, kind: EventType, text: String| {
        let mut e = NewEvent::new(agent, kind, text);
        e.subject = Some("svc".into());
        store.append("r", e, Durability::None).unwrap()
    };
    add("lead", EventType::Evidence, "first".into());
    let policy: Policy = serde_json::from_value(json!({
        "permissions": {
            "lead": {"read_types": ["*"], "write_types": ["*"], "admin": true},
            "db": {"read_types": ["evidence"], "write_types": ["evidence"]}
        }
    }))
    .unwrap();
    store.set_policy("r", "lead", &policy).unwrap();
    for i in 0..5 {
        add("db", EventType::Evidence, format!("evidence {i}"));
    }
    for i in 0..20 {
        add("lead", EventType::Hypothesis, format!("hidden {i}"));
    }
    for (agent, subject) in [(None, None), (Some("db"), None), (None, Some("svc"))] {
        let opts = ReadOptions {
            reader: Some("db".into()),
            last: Some(3),
            agent: agent.map(str::to_string),
            subject: subject.map(str::to_string),
            ..ReadOptions::default()
        };
        let got: Vec<swarm_memory::Event> = store
            .read("r", opts.clone())
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let texts: Vec<&str> = got.iter().filter_map(|e| e.content.as_str()).collect();
        assert_eq!(
            texts,
            ["evidence 2", "evidence 3", "evidence 4"],
            "{opts:?}"
        );
        let scanned: Vec<swarm_memory::Event> = store
            .read(
                "r",
                ReadOptions {
                    full_scan: true,
                    ..opts
                },
            )
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(got, scanned);
    }
    // The lead is shown everything: its last 3 are the run's last 3.
    let lead: Vec<swarm_memory::Event> = store
        .read(
            "r",
            ReadOptions {
                reader: Some("lead".into()),
                last: Some(3),
                ..ReadOptions::default()
            },
        )
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let texts: Vec<&str> = lead.iter().filter_map(|e| e.content.as_str()).collect();
    assert_eq!(texts, ["hidden 17", "hidden 18", "hidden 19"]);
}

/// A store of user alice in `dir`, checkpoints by hand only.
fn alice_store(dir: &std::path::Path) -> swarm_memory::Store {
    swarm_memory::Store::open(dir.join("data"))
        .unwrap()
        .with_user("alice", false)
        .unwrap()
        .with_checkpoints(dir.join("ck"), 0)
}

/// A `Store` switched to another user keeps none of the previous user's caches (they are
/// keyed by run name alone): alice's head state and index of her run `r` were answered
/// for bob's run `r`.
#[test]
fn a_store_switched_to_another_user_forgets_the_first_users_runs() {
    let env = Env::new();
    let bob_own = env.store().with_user("bob", true).unwrap();
    crate::util::lib_append(&bob_own, "r", "bob's only event");
    drop(bob_own);
    let alice = env.store().with_user("alice", true).unwrap();
    for i in 0..3 {
        crate::util::lib_append(&alice, "r", &format!("alice's secret {i}"));
    }
    assert_eq!(alice.head_state("r").unwrap().state.head_seq, 3);
    let by_agent = || swarm_memory::ReadOptions {
        agent: Some("agent-1".into()),
        ..Default::default()
    };
    assert_eq!(alice.read("r", by_agent()).unwrap().count(), 3);
    let bob = alice.with_user("bob", true).unwrap();
    assert_eq!(
        bob.head_state("r").unwrap().state.head_seq,
        1,
        "bob got alice's cached head"
    );
    let seen: Vec<String> = bob
        .read("r", by_agent())
        .unwrap()
        .map(|e| e.unwrap().content.to_string())
        .collect();
    assert_eq!(seen, ["\"bob's only event\""], "bob's filtered read");
}

/// An agent's view lists the latest `UNSEEN_MAX` of the entries it has not seen (an
/// agent that never wrote has the whole run unseen) and counts them all.
#[test]
fn an_agent_view_lists_a_bounded_number_of_unseen_entries() {
    use swarm_memory::fold::replay::Target;
    use swarm_memory::{Durability, EventType, NewEvent};

    let dir = tempfile::tempdir().unwrap();
    let store = alice_store(dir.path());
    let n = swarm_memory::store::travel::UNSEEN_MAX as u64 + 5;
    let batch: Vec<NewEvent> = (0..n)
        .map(|i| NewEvent::new("db", EventType::Evidence, format!("reading {i}")))
        .collect();
    store
        .append_batch("r", batch, None, Durability::None)
        .unwrap();
    let at = store.state_at("r", Target::Head, |_| {}).unwrap().state;
    let view = store.agent_view("r", &at, "lead").unwrap();
    assert_eq!(view.unseen_count, n);
    let seqs: Vec<u64> = view.unseen_since_last_write.iter().map(|e| e.seq).collect();
    assert_eq!(seqs.len(), swarm_memory::store::travel::UNSEEN_MAX);
    assert_eq!((seqs[0], *seqs.last().unwrap()), (6, n));
}

/// An agent whose policy hides escalations (they quote the decisions they are between)
/// gets none back from its own append that caused one, and the refusal of its next
/// decision on the blocked subject does not name the escalation's seq: the append's
/// answer listed every stored event, the engine's escalation included, with the other
/// agent's decision quoted in it.
#[test]
fn an_append_answers_only_what_its_agent_may_read() {
    use swarm_memory::fold::rules::Policy;
    use swarm_memory::{Durability, Error, EventType, NewEvent};

    let dir = tempfile::tempdir().unwrap();
    let store = alice_store(dir.path());
    let decide = |agent: &str, text: &str| {
        let mut e = NewEvent::new(agent, EventType::Decision, text.to_string());
        e.subject = Some("payments".to_string());
        store.append_batch("r", vec![e], None, Durability::None)
    };
    let policy: Policy = serde_json::from_value(json!({
        "permissions": {
            "lead": {"read_types": ["*"], "write_types": ["*"], "admin": true},
            "w": {"read_types": ["evidence"], "write_types": ["evidence", "decision"]}
        }
    }))
    .unwrap();
    store.set_policy("r", "lead", &policy).unwrap();
    decide("lead", "SECRETA fail over payments").unwrap();
    let got = decide("w", "keep payments where they are").unwrap();
    assert_eq!(store.escalations("r", true).unwrap().len(), 1, "escalated");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].agent_id, "w");
    assert!(!serde_json::to_string(&got).unwrap().contains("SECRETA"));
    match decide("w", "keep payments, really") {
        Err(Error::Escalated { escalation, .. }) => assert_eq!(escalation, 0, "seq shown"),
        other => panic!("{other:?}"),
    }
    // The lead, shown escalations, is told which one blocks it.
    match decide("lead", "fail over payments now") {
        Err(Error::Escalated { escalation, .. }) => assert!(escalation > 0),
        other => panic!("{other:?}"),
    }
}

/// The engine's own logs take no scratchpad commands (`prune @facts` exited 0, and with
/// `--force` could write a summary into the facts log), and a resolution keeps its reason:
/// an empty `--note` is refused (exit 2).
#[test]
fn engine_logs_and_empty_notes_are_refused() {
    let env = Env::new();
    env.swarm(&[
        "append",
        "--run",
        "r",
        "--agent",
        "db",
        "--type",
        "evidence",
        "--content",
        "x",
    ])
    .ok();
    env.swarm(&["synth", "--all"]).ok();
    for args in [
        &["prune", "--run", "@facts", "--force"][..],
        &["run", "close", "@facts", "--by", "lead"],
    ] {
        let out = env.swarm(args).code(5);
        assert!(out.stderr.contains("engine's own logs"), "{}", out.stderr);
    }
    let out = env
        .swarm(&[
            "resolve",
            "--run",
            "r",
            "--escalation",
            "1",
            "--by",
            "alice",
            "--note",
            " ",
        ])
        .code(2);
    assert!(out.stderr.contains("note"), "{}", out.stderr);
}

/// A channel write retried with its id after a lost answer returns the stored write: the
/// retry carried the base version the write itself moved past, so it was a conflict (exit
/// 4) that could not tell the agent's own write from another's. The same id with another
/// value is a conflict.
#[test]
fn a_channel_write_retried_with_its_id_is_stored_once() {
    let env = Env::new();
    env.append_lines("r", &[entry("lead", "evidence", "s", "start", 0.5)]);
    env.swarm(&[
        "channel",
        "declare",
        "--run",
        "r",
        "--agent",
        "lead",
        "--channel",
        "plan",
        "--kind",
        "replace",
        "--on-conflict",
        "reject",
    ])
    .ok();
    let write = |value: &str| {
        env.swarm(&[
            "channel",
            "write",
            "--run",
            "r",
            "--agent",
            "lead",
            "--channel",
            "plan",
            "--value",
            value,
            "--base-version",
            "0",
            "--id",
            "w-1",
        ])
    };
    let first: Value = serde_json::from_str(write(r#"{"a":1}"#).ok().stdout.trim()).unwrap();
    let again: Value = serde_json::from_str(write(r#"{"a":1}"#).ok().stdout.trim()).unwrap();
    assert_eq!(first["seq"], again["seq"], "{first} {again}");
    let out = write(r#"{"a":2}"#).code(4);
    assert!(out.stderr.contains("w-1"), "{}", out.stderr);
    let read = env
        .swarm(&["read", "--run", "r", "--type", "channel_write"])
        .ok();
    assert_eq!(read.stdout.lines().count(), 1, "{}", read.stdout);
}

/// An agent that may not write a channel gets the same refusal whether or not the channel
/// is declared: 403 for a declared one and 400 ("not declared") for another told it which
/// channels the lead had declared.
#[test]
fn a_channel_write_refusal_does_not_tell_which_channels_exist() {
    let env = Env::new();
    lead_and_db(
        &env,
        "r",
        r#"{"read_types":["evidence"],"write_types":["evidence"]}"#,
    );
    env.swarm(&[
        "channel",
        "declare",
        "--run",
        "r",
        "--agent",
        "lead",
        "--channel",
        "secret",
        "--kind",
        "append",
    ])
    .ok();
    let write = |channel: &str| {
        env.swarm(&[
            "channel",
            "write",
            "--run",
            "r",
            "--agent",
            "db",
            "--channel",
            channel,
            "--value",
            "1",
        ])
        .code(5)
    };
    let (declared, not) = (write("secret"), write("nonexistent"));
    assert_eq!(
        declared.stderr.replace("secret", "X"),
        not.stderr.replace("nonexistent", "X")
    );
}
