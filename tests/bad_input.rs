//! A battery of bad inputs through the CLI: each is refused with exit 2 and a one-line
//! message naming the field (and the line, for `--stdin`), and no file changes.

use serde_json::{json, Value};

use crate::util::{ev, Env};

/// `swarm append` of one event with the given extra or replaced arguments.
fn append_args<'a>(run: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["append", "--run", run];
    let has = |k: &str| {
        extra
            .iter()
            .any(|e| *e == k || e.starts_with(&format!("{k}=")))
    };
    if !has("--agent") {
        a.extend(["--agent", "a1"]);
    }
    if !has("--type") {
        a.extend(["--type", "evidence"]);
    }
    if !has("--content") {
        a.extend(["--content", "disk full on db-1"]);
    }
    a.extend(extra);
    a
}

fn deep_json(depth: usize) -> Value {
    let mut v = json!("x");
    for _ in 0..depth {
        v = json!({ "k": v });
    }
    v
}

fn env_with_run(run: &str) -> Env {
    let env = Env::new();
    env.append_lines(
        run,
        &[ev("a1", "evidence", "one"), ev("a2", "hypothesis", "two")],
    );
    env
}

#[test]
fn bad_arguments_are_refused_and_change_nothing() {
    let run = "r1";
    let env = env_with_run(run);
    let long_run = "r".repeat(200);
    let big = "x".repeat(70 * 1024);
    let deep = deep_json(70).to_string();
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (append_args("..", &[]), vec!["run"]),
        (append_args("a/b", &[]), vec!["run"]),
        (append_args("", &[]), vec!["run"]),
        (append_args(&long_run, &[]), vec!["run"]),
        (append_args(".x", &[]), vec!["run"]),
        (vec!["read", "--run", ".."], vec!["run"]),
        (vec!["verify", "--run", "a/b"], vec!["run"]),
        (append_args(run, &["--type", "summary"]), vec!["type"]),
        (append_args(run, &["--type", "checkpoint"]), vec!["type"]),
        (append_args(run, &["--content", ""]), vec!["content"]),
        (append_args(run, &["--content", &big]), vec!["content"]),
        (
            append_args(run, &["--json", "--content", &deep]),
            vec!["content", "deep"],
        ),
        (
            append_args(run, &["--confidence", "1.5"]),
            vec!["confidence"],
        ),
        (append_args(run, &["--confidence=-0.1"]), vec!["confidence"]),
        (append_args(run, &["--ref", "3"]), vec!["refs", "3"]),
        (append_args(run, &["--ref", "99"]), vec!["refs", "99"]),
        (append_args(run, &["--ref", "0"]), vec!["refs", "0"]),
        (append_args(run, &["--id", "a b"]), vec!["id"]),
        (append_args(run, &["--id", "a/b"]), vec!["id"]),
        (
            append_args(run, &["--id", "swarm:123"]),
            vec!["id", "swarm:"],
        ),
        (append_args(run, &["--agent", "x y"]), vec!["agent_id"]),
        (append_args(run, &["--user", ""]), vec!["user_id"]),
        (append_args(run, &["--meta", "[1]"]), vec!["meta"]),
        (append_args(run, &["--meta", "{not json"]), vec!["meta"]),
        (append_args(run, &["--subject", "a\nb"]), vec!["subject"]),
        (
            append_args(run, &["--durability", "foo"]),
            vec!["durability", "foo"],
        ),
        // A new run is not created by a refused append.
        (append_args("fresh", &["--type", "summary"]), vec!["type"]),
        (append_args("fresh", &["--ref", "1"]), vec!["refs"]),
    ];
    for (args, words) in cases {
        let before = env.snapshot();
        let out = env.swarm(&args).code(2).one_line_error(&words);
        assert!(out.stdout.is_empty(), "{args:?} printed {}", out.stdout);
        assert_eq!(env.snapshot(), before, "{args:?} changed files");
    }
    assert_eq!(env.check_run(run).len(), 2);
}

#[test]
fn bad_stdin_lines_are_refused_and_change_nothing() {
    let run = "r1";
    let env = env_with_run(run);
    let with = |k: &str, v: Value| {
        let mut e = ev("a1", "evidence", "fine");
        e[k] = v;
        e.to_string()
    };
    let too_many = Value::Array(
        (0..1025)
            .map(|i| ev("a1", "evidence", &format!("e{i}")))
            .collect(),
    )
    .to_string();
    let bad_in_batch = json!([ev("a1", "evidence", "ok"), ev("a1", "summary", "bad")]).to_string();
    let cases: Vec<(String, Vec<&str>)> = vec![
        (with("colour", json!("red")), vec!["line 1", "colour"]),
        (with("seq", json!(3)), vec!["line 1", "seq"]),
        (
            with("ts", json!("2026-01-01T00:00:00Z")),
            vec!["line 1", "ts"],
        ),
        (with("run_id", json!("other")), vec!["line 1", "run_id"]),
        (with("type", json!("summary")), vec!["line 1", "type"]),
        (with("content", json!("")), vec!["line 1", "content"]),
        (with("content", json!(12)), vec!["line 1", "content"]),
        (with("content", deep_json(70)), vec!["line 1", "content"]),
        (with("confidence", json!(1.5)), vec!["line 1", "confidence"]),
        (with("refs", json!([99])), vec!["line 1", "refs"]),
        (with("id", json!("swarm:x")), vec!["line 1", "id"]),
        (with("meta", json!([1])), vec!["line 1", "meta"]),
        (with("expect_seq", json!(7)), vec!["line 1"]),
        (
            "{\"agent_id\": \"a1\", \"type\":".to_string(),
            vec!["line 1"],
        ),
        ("12".to_string(), vec!["line 1"]),
        (too_many, vec!["line 1", "batch", "1024"]),
        (bad_in_batch, vec!["line 1", "[1].type"]),
        ("[]".to_string(), vec!["line 1", "batch"]),
    ];
    for (line, words) in cases {
        let before = env.snapshot();
        let code = if line.contains("expect_seq") { 4 } else { 2 };
        let out = env
            .swarm_stdin(&["append", "--run", run, "--stdin"], &format!("{line}\n"))
            .code(code)
            .one_line_error(&words);
        assert!(out.stdout.is_empty(), "{line:.80}: printed {}", out.stdout);
        assert_eq!(env.snapshot(), before, "{line:.80} changed files");
    }
    assert_eq!(env.check_run(run).len(), 2);
}

/// The lines before the first bad one stay stored and acknowledged; nothing of the bad
/// line or after it is.
#[test]
fn stdin_stops_at_the_first_bad_line() {
    let run = "r1";
    let env = env_with_run(run);
    let input = format!(
        "{}\n\n{}\n{{not json\n{}\n",
        ev("a1", "evidence", "three"),
        json!([ev("a1", "evidence", "four"), ev("a2", "decision", "five")]),
        ev("a1", "evidence", "never"),
    );
    let out = env
        .swarm_stdin(&["append", "--run", run, "--stdin"], &input)
        .code(2)
        .one_line_error(&["line 4", "JSON"]);
    let acked: Vec<u64> = out.events().iter().map(|e| e.seq).collect();
    assert_eq!(acked, [3, 4, 5]);
    let stored = env.check_run(run);
    let contents: Vec<&str> = stored.iter().filter_map(|e| e.content.as_str()).collect();
    assert_eq!(contents, ["one", "two", "three", "four", "five"]);
}
