//! The server SIGKILLed again and again under durable appends from 16 client processes.
//!
//! Each client is a shell loop that POSTs its events one at a time with `curl` (a real
//! HTTP client in its own process) and, when the connection fails or is refused while
//! the server is down, retries the same body, so the same `id`. It prints the response
//! of every append that got a 2xx. Meanwhile the test kills the server with SIGKILL at
//! points spread over the run (and a random delay) and restarts it on the same port. At
//! the end every acknowledged event must be stored exactly once, at the seq its
//! acknowledgement named, and the run's seqs must be gap-free.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use swarm_memory::{Event, ReadOptions};

use crate::serve::{token, Server};
use crate::util::{check_sequence, Env, Rng};

const CLIENTS: usize = 16;
const EVENTS_PER_CLIENT: usize = 40;
const KILLS: usize = 6;
/// A client gives up (and fails the test) after this long.
const CLIENT_DEADLINE_S: u64 = 60;

/// One client: appends `N` events with ids `c<K>-<i>`, retrying a refused or broken
/// connection (and a 503) with the same body; prints each 2xx response body on a line,
/// and the id of each retried request to the file `$RETRIES`.
const CLIENT: &str = r#"
set -u
for i in $(seq 1 "$N"); do
  body="{\"id\":\"c$K-$i\",\"agent_id\":\"a$K\",\"type\":\"evidence\",\"content\":\"event $i of client $K\"}"
  while :; do
    out=$(curl -sS --max-time 10 -w '\n%{http_code}' \
      -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
      --data-binary "$body" "$URL/v1/runs/crash/events" 2>/dev/null) || out=$'\n000'
    code=${out##*$'\n'}
    case $code in
      2??) printf '%s\n' "${out%$'\n'*}"; break ;;
      000|503)
        echo "c$K-$i" >> "$RETRIES"
        if [ "$SECONDS" -ge "$DEADLINE" ]; then echo "c$K-$i: gave up" >&2; exit 1; fi
        sleep 0.05 ;;
      *) echo "c$K-$i: HTTP $code: ${out%$'\n'*}" >&2; exit 1 ;;
    esac
  done
done
"#;

/// Starts the server on `addr`, retrying while the port is not free yet.
fn restart(env: &Env, addr: &str) -> Server {
    let started = Instant::now();
    loop {
        match Server::try_start_at(env, addr, &[]) {
            Some(s) => return s,
            None if started.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            None => panic!("cannot restart the server on {addr}"),
        }
    }
}

#[test]
fn serve_sigkilled_under_16_clients_keeps_every_acknowledged_append_once() {
    let env = Env::fast();
    let out_dir = tempfile::tempdir().expect("tempdir");
    let mut rng = Rng::from_env("serve_crash");
    let mut srv = Server::start(&env, &[]);
    let addr = srv.addr().to_string();
    let t = token(&env, "alice", &["a*"], "agent");
    let mut clients: Vec<Child> = (0..CLIENTS)
        .map(|k| {
            let out = File::create(out_dir.path().join(format!("c{k}"))).expect("out file");
            Command::new("bash")
                .arg("-c")
                .arg(CLIENT)
                .env("N", EVENTS_PER_CLIENT.to_string())
                .env("K", k.to_string())
                .env("TOKEN", &t)
                .env("URL", &srv.url)
                .env("DEADLINE", CLIENT_DEADLINE_S.to_string())
                .env("RETRIES", out_dir.path().join(format!("r{k}")))
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start a client")
        })
        .collect();
    // Kill at progress points spread over the run (plus a random delay), so every kill
    // lands while clients are appending, however fast the machine is: the clients cannot
    // get past the next point while the server is down.
    let acked = |dir: &Path| -> usize {
        (0..CLIENTS)
            .map(|k| {
                std::fs::read_to_string(dir.join(format!("c{k}"))).map_or(0, |t| t.lines().count())
            })
            .sum()
    };
    let total = CLIENTS * EVENTS_PER_CLIENT;
    let mut kills = 0;
    while kills < KILLS {
        let point = total * (kills + 1) / (KILLS + 2);
        let started = Instant::now();
        while acked(out_dir.path()) < point {
            assert!(started.elapsed() < Duration::from_secs(60), "no progress");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(rng.range(0, 10)));
        srv.child.kill().expect("SIGKILL the server");
        srv.child.wait().expect("reap the server");
        kills += 1;
        srv = restart(&env, &addr);
    }
    for (k, c) in clients.iter_mut().enumerate() {
        assert!(c.wait().expect("wait").success(), "client {k} failed");
    }
    // The last server still answers, and stops cleanly.
    assert_eq!(srv.stop().code(), Some(0));

    let mut acked: HashMap<String, u64> = HashMap::new();
    for k in 0..CLIENTS {
        let text = std::fs::read_to_string(out_dir.path().join(format!("c{k}"))).expect("read");
        assert_eq!(
            text.lines().count(),
            EVENTS_PER_CLIENT,
            "client {k}: {text}"
        );
        for line in text.lines() {
            let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
            let e: Event = serde_json::from_value(v["events"][0].clone()).expect("an event");
            assert!(
                acked.insert(e.id.clone(), e.seq).is_none(),
                "{} acked twice",
                e.id
            );
        }
    }
    let store = env.store().with_user("alice", true).expect("alice");
    let events: Vec<Event> = store
        .read("crash", ReadOptions::default())
        .expect("read")
        .collect::<Result<_, _>>()
        .expect("read every event");
    check_sequence(&events);
    assert_eq!(
        events.len(),
        CLIENTS * EVENTS_PER_CLIENT,
        "nothing more, nothing less"
    );
    for e in &events {
        assert_eq!(
            acked.get(&e.id),
            Some(&e.seq),
            "{} stored at seq {}",
            e.id,
            e.seq
        );
    }
    let report = store.verify("crash", |_| {}).expect("verify");
    assert!(report.ok, "{report:?}");
    // The kills cut requests off: clients had to retry.
    let retried: usize = (0..CLIENTS)
        .map(|k| {
            std::fs::read_to_string(out_dir.path().join(format!("r{k}")))
                .map_or(0, |t| t.lines().count())
        })
        .sum();
    assert!(retried > 0, "no request was cut off by a kill");
    eprintln!("serve_crash: {kills} kills, {retried} retried requests");
}
