//! `swarm serve --socket PATH`: the API on a Unix socket (mode 0600), the CLI as its
//! client through `SWARM_URL=unix://PATH`; a live socket is refused, a stale one
//! replaced, a file that is not a socket left alone.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Stdio};

use crate::serve::token;
use crate::util::{Env, Out};

/// `swarm serve --socket PATH EXTRA...`; the child and its first stdout line (or the
/// exit when it did not start).
fn start(env: &Env, sock: &Path, extra: &[&str]) -> Result<(Child, String), String> {
    let mut args = vec!["serve", "--socket", sock.to_str().unwrap()];
    args.extend_from_slice(extra);
    let mut child = env
        .cmd(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start swarm serve");
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    if first.is_empty() {
        let out = child.wait_with_output().unwrap();
        return Err(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok((child, first.trim().to_string()))
}

fn stop(mut child: Child) {
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    assert!(child.wait().unwrap().success());
}

/// `swarm ARGS` as a client of the server at `url`.
fn remote(env: &Env, url: &str, token: &str, args: &[&str]) -> Out {
    let mut c = env.cmd(args);
    c.env("SWARM_URL", url).env("SWARM_TOKEN", token);
    Out::run(c, args, "")
}

#[test]
fn serve_on_a_unix_socket_serves_the_cli_and_guards_the_path() {
    let env = Env::fast();
    let sock = env.path().join("swarm.sock");
    let (child, line) = start(&env, &sock, &[]).unwrap();
    assert_eq!(line, format!("listening on unix://{}", sock.display()));
    let meta = std::fs::symlink_metadata(&sock).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let url = format!("unix://{}", sock.display());
    let t = token(&env, "alice", &["db"], "agent");
    // Append and read through the socket, with the embedded CLI's output.
    let a = remote(
        &env,
        &url,
        &t,
        &[
            "append",
            "--run",
            "inc",
            "--agent",
            "db",
            "--type",
            "evidence",
            "--content",
            "disk 100% on db-1",
            "--subject",
            "db-1",
        ],
    )
    .ok();
    assert_eq!(a.events()[0].seq, 1);
    let b = remote(
        &env,
        &url,
        &t,
        &[
            "append",
            "--run",
            "inc",
            "--agent",
            "db",
            "--type",
            "hypothesis",
            "--content",
            "log growth",
        ],
    )
    .ok();
    assert_eq!(b.events()[0].seq, 2);
    let read = remote(
        &env,
        &url,
        &t,
        &["read", "--run", "inc", "--type", "evidence"],
    )
    .ok();
    let evs = read.events();
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].content, serde_json::json!("disk 100% on db-1"));
    let all = remote(&env, &url, &t, &["read", "--run", "inc"]).ok();
    let local = env.swarm(&["--user", "alice", "read", "--run", "inc"]).ok();
    assert_eq!(all.stdout, local.stdout);
    let tail = remote(&env, &url, &t, &["tail", "--run", "inc", "--from-seq", "2"]).ok();
    assert_eq!(tail.events().iter().map(|e| e.seq).collect::<Vec<_>>(), [2]);
    // A live tail over the socket (a chunked SSE stream) sees a later append.
    let mut follow = env
        .cmd(&["tail", "--run", "inc", "--follow", "--from-seq", "1"])
        .env("SWARM_URL", &url)
        .env("SWARM_TOKEN", &t)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let seq = |l: Option<std::io::Result<String>>| -> u64 {
        let v: serde_json::Value = serde_json::from_str(&l.unwrap().unwrap()).unwrap();
        v["seq"].as_u64().unwrap()
    };
    assert_eq!((seq(lines.next()), seq(lines.next())), (1, 2));
    remote(
        &env,
        &url,
        &t,
        &[
            "append",
            "--run",
            "inc",
            "--agent",
            "db",
            "--type",
            "evidence",
            "--content",
            "live",
        ],
    )
    .ok();
    assert_eq!(seq(lines.next()), 3);
    follow.kill().unwrap();
    follow.wait().unwrap();
    // Refusals keep their exit codes over the socket.
    remote(&env, &url, "swm_bogus_token", &["read", "--run", "inc"]).code(5);
    remote(&env, &url, &t, &["read", "--run", "nope"]).code(2);
    // A second server on the live socket is refused; the first goes on serving.
    let err = start(&env, &sock, &[]).unwrap_err();
    assert!(err.contains("another server is listening"), "{err}");
    remote(&env, &url, &t, &["read", "--run", "inc"]).ok();
    // SIGTERM: the socket file goes with the server; the client says it cannot reach it.
    stop(child);
    assert!(!sock.exists());
    let gone = remote(&env, &url, &t, &["read", "--run", "inc"]);
    assert_ne!(gone.code, 0);
    assert!(
        gone.stderr.contains("cannot reach unix://"),
        "{}",
        gone.stderr
    );

    // A stale socket (its server was SIGKILLed) is replaced.
    let (mut killed, _) = start(&env, &sock, &[]).unwrap();
    killed.kill().unwrap();
    killed.wait().unwrap();
    assert!(sock.exists(), "SIGKILL leaves the socket file");
    let (child, _) = start(&env, &sock, &[]).unwrap();
    remote(&env, &url, &t, &["read", "--run", "inc"]).ok();
    stop(child);

    // A file that is not a socket is never removed.
    std::fs::write(&sock, "mine").unwrap();
    let err = start(&env, &sock, &[]).unwrap_err();
    assert!(err.contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&sock).unwrap(), "mine");
    // Too long a path, and a bad SWARM_URL, are clear errors.
    let long = env.path().join("s".repeat(120));
    let err = start(&env, &long, &[]).unwrap_err();
    assert!(err.contains("107 bytes"), "{err}");
    remote(&env, "unix://", &t, &["read", "--run", "inc"])
        .code(2)
        .stderr_has(&["SWARM_URL"]);
    remote(&env, "ftp://x", &t, &["read", "--run", "inc"])
        .code(2)
        .stderr_has(&["unix:///"]);
}

/// `--socket` with `--listen`: both serve the same stores.
#[test]
fn serve_on_a_socket_and_tcp_at_once() {
    let env = Env::fast();
    let sock = env.path().join("s.sock");
    let (child, first) = start(&env, &sock, &["--listen", "127.0.0.1:0"]).unwrap();
    let http = first.strip_prefix("listening on ").unwrap().to_string();
    assert!(http.starts_with("http://127.0.0.1:"), "{first}");
    let t = token(&env, "alice", &["db"], "agent");
    let unix = format!("unix://{}", sock.display());
    // Both listeners are bound before the first line is printed.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !sock.exists() {
        assert!(std::time::Instant::now() < until);
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    remote(
        &env,
        &http,
        &t,
        &[
            "append",
            "--run",
            "r",
            "--agent",
            "db",
            "--type",
            "evidence",
            "--content",
            "x",
        ],
    )
    .ok();
    let r = remote(&env, &unix, &t, &["read", "--run", "r"]).ok();
    assert_eq!(r.events().len(), 1);
    stop(child);
    assert!(!sock.exists());
}
