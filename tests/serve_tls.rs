//! `swarm serve --tls-cert --tls-key`: HTTPS on the TCP listener, with a self-signed
//! certificate made here (rcgen). The CLI through `SWARM_URL=https://...` trusts it with
//! `SWARM_CA_CERT` and prints what the embedded CLI prints; without it the certificate is
//! refused; plain HTTP gets no answer; bad PEM files stop the server, naming the file;
//! a followed tail streams over TLS.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::serve::{token, Server};
use crate::util::{Env, Out};

/// A self-signed certificate for 127.0.0.1 and localhost: its PEM files in the data dir.
struct Pem {
    cert: PathBuf,
    key: PathBuf,
}

fn self_signed(env: &Env, name: &str) -> Pem {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("make a certificate");
    let (cert, key) = (
        env.path().join(format!("{name}-cert.pem")),
        env.path().join(format!("{name}-key.pem")),
    );
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    Pem { cert, key }
}

fn start_tls(env: &Env, pem: &Pem) -> Server {
    let srv = Server::start(
        env,
        &[
            "--tls-cert",
            pem.cert.to_str().unwrap(),
            "--tls-key",
            pem.key.to_str().unwrap(),
        ],
    );
    assert!(srv.url.starts_with("https://127.0.0.1:"), "{}", srv.url);
    srv
}

/// `swarm ARGS` as a client of `srv` with `token`, trusting `ca` (if any).
fn remote(env: &Env, srv: &Server, token: &str, ca: Option<&PathBuf>, args: &[&str]) -> Out {
    let mut c = env.cmd(args);
    c.env("SWARM_URL", &srv.url)
        .env("SWARM_TOKEN", token)
        .env_remove("SWARM_CA_CERT");
    if let Some(ca) = ca {
        c.env("SWARM_CA_CERT", ca);
    }
    Out::run(c, args, "")
}

fn local(env: &Env, args: &[&str]) -> Out {
    let mut all = vec!["--user", "alice"];
    all.extend_from_slice(args);
    let mut c = env.cmd(&all);
    c.env_remove("SWARM_URL");
    Out::run(c, &all, "")
}

#[test]
fn serve_tls_serves_the_cli_with_its_ca_and_refuses_without() {
    let env = Env::fast();
    let pem = self_signed(&env, "server");
    let srv = start_tls(&env, &pem);
    let t = token(&env, "alice", &["*"], "admin");
    let append = |content: &str, id: &str| {
        vec![
            "append",
            "--run",
            "inc",
            "--agent",
            "db-1",
            "--type",
            "evidence",
            "--content",
            content,
            "--id",
            id,
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>()
    };
    let a = append("over tls", "e1");
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let out = remote(&env, &srv, &t, Some(&pem.cert), &a).ok();
    assert_eq!(out.events()[0].seq, 1);
    let b = append("on the files", "e2");
    let b: Vec<&str> = b.iter().map(String::as_str).collect();
    local(&env, &b).ok();
    for args in [
        &["read", "--run", "inc"][..],
        &["read", "--run", "inc", "--from-seq", "2"],
        &["board", "--run", "inc"],
    ] {
        let r = remote(&env, &srv, &t, Some(&pem.cert), args).ok();
        let l = local(&env, args).ok();
        assert_eq!(r.stdout, l.stdout, "swarm {args:?}");
    }
    // Without the CA: the unknown certificate is refused, with a message, not a panic.
    let r = remote(&env, &srv, &t, None, &["read", "--run", "inc"]);
    assert_ne!(r.code, 0);
    assert_ne!(r.code, 101, "a panic: {}", r.stderr);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    let r = r.stderr_has(&["certificate", "SWARM_CA_CERT"]);
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    // Another certificate as the CA: refused too.
    let other = self_signed(&env, "other");
    let r = remote(&env, &srv, &t, Some(&other.cert), &["read", "--run", "inc"]);
    assert_ne!(r.code, 0);
    // A CA file that is not there: named.
    let missing = env.path().join("no-such-ca.pem");
    remote(&env, &srv, &t, Some(&missing), &["read", "--run", "inc"])
        .code(2)
        .stderr_has(&["SWARM_CA_CERT", "no-such-ca.pem"]);
    assert!(srv.stop().success());
}

#[test]
fn serve_tls_gives_plain_http_no_answer() {
    let env = Env::fast();
    let pem = self_signed(&env, "server");
    let srv = start_tls(&env, &pem);
    let addr = srv.url.trim_start_matches("https://");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    // The server ends the connection (maybe after a TLS alert): never an HTTP answer.
    let _ = s.read_to_end(&mut got);
    assert!(
        !got.starts_with(b"HTTP/") && !String::from_utf8_lossy(&got).contains("ok"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    // The server still serves TLS clients after that.
    let t = token(&env, "alice", &["*"], "admin");
    let args = [
        "append",
        "--run",
        "r",
        "--agent",
        "a",
        "--type",
        "evidence",
        "--content",
        "x",
    ];
    remote(&env, &srv, &t, Some(&pem.cert), &args).ok();
}

/// `swarm serve` with these TLS files: it must not start, and its error names `file`.
fn refused(env: &Env, cert: &Path, key: &Path, file: &Path) {
    let args = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    let out = Out::run(env.cmd(&args), &args, "");
    assert_ne!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.is_empty(), "it listened: {}", out.stdout);
    out.stderr_has(&[file.file_name().unwrap().to_str().unwrap()]);
}

#[test]
fn serve_tls_refuses_bad_files_naming_them() {
    let env = Env::fast();
    let good = self_signed(&env, "good");
    let other = self_signed(&env, "other");
    let missing = env.path().join("missing.pem");
    let empty = env.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let garbage = env.path().join("garbage.pem");
    std::fs::write(
        &garbage,
        "-----BEGIN PRIVATE KEY-----\nnot base64 at all!\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    refused(&env, &missing, &good.key, &missing);
    refused(&env, &good.cert, &missing, &missing);
    refused(&env, &empty, &good.key, &empty);
    // The certificate file as the key: no key in it.
    refused(&env, &good.cert, &good.cert, &good.cert);
    refused(&env, &good.cert, &garbage, &garbage);
    // Another certificate's key.
    refused(&env, &good.cert, &other.key, &other.key);
    // A key file alone: clap asks for the other.
    let args = ["serve", "--tls-key", good.key.to_str().unwrap()];
    assert_eq!(Out::run(env.cmd(&args), &args, "").code, 2);
}

#[test]
fn serve_tls_follow_sees_a_later_append() {
    let env = Env::fast();
    let pem = self_signed(&env, "server");
    let srv = start_tls(&env, &pem);
    let t = token(&env, "alice", &["db"], "agent");
    let mut tail = env
        .cmd(&["tail", "--run", "live", "--follow"])
        .env("SWARM_URL", &srv.url)
        .env("SWARM_TOKEN", &t)
        .env("SWARM_CA_CERT", &pem.cert)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let args = [
        "append",
        "--run",
        "live",
        "--agent",
        "db",
        "--type",
        "evidence",
        "--content",
        "later",
    ];
    remote(&env, &srv, &t, Some(&pem.cert), &args).ok();
    let mut line = String::new();
    BufReader::new(tail.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = tail.kill();
    let _ = tail.wait();
    let e: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        (e["seq"].as_u64(), e["content"].as_str()),
        (Some(1), Some("later"))
    );
}

/// `swarm mcp` with `SWARM_URL=https://...` and `SWARM_CA_CERT`: the stdio bridge speaks
/// TLS to the server's `/mcp` and answers `initialize` and `tools/list`.
#[test]
fn serve_tls_carries_the_mcp_bridge() {
    let env = Env::fast();
    let pem = self_signed(&env, "server");
    let srv = start_tls(&env, &pem);
    let t = token(&env, "alice", &["sre"], "agent");
    let mut child = env
        .cmd(&["mcp"])
        .env("SWARM_URL", &srv.url)
        .env("SWARM_TOKEN", &t)
        .env("SWARM_CA_CERT", &pem.cert)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for line in [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    ] {
        writeln!(stdin, "{line}").unwrap();
    }
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut answers = Vec::new();
    while answers.len() < 2 {
        let l = lines.next().expect("an answer").unwrap();
        let v: serde_json::Value = serde_json::from_str(&l).unwrap();
        if v.get("id").is_some() {
            answers.push(v);
        }
    }
    drop(stdin);
    let _ = child.wait();
    assert!(
        answers[0]["result"]["serverInfo"].is_object(),
        "{:?}",
        answers[0]
    );
    let tools = answers[1]["result"]["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 20, "{:?}", answers[1]);
}
