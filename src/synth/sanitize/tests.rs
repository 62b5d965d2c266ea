use super::*;
use serde_json::json;

fn ctx() -> SanitizeContext {
    SanitizeContext {
        user_id: "alice.smith".into(),
        identifiers: vec![
            "agent-7f3c".into(),
            "alice@acme.io".into(),
            "run-20261122-001".into(),
        ],
        project_ids: vec!["acme-payments-prod".into()],
        env_names: vec!["payments-east".into(), "blue-canary".into()],
        names: vec![],
    }
}

fn san() -> Sanitizer {
    Sanitizer::new(ctx())
}

/// Sanitizes `input`, checks no secret survives, every kept part does, and idempotence.
fn check(input: &str, secrets: &[&str], keeps: &[&str]) -> String {
    let s = san();
    let out = s.text(input);
    for sec in secrets {
        assert!(
            !out.contains(sec),
            "secret {sec:?} survived in {out:?} (input {input:?})"
        );
    }
    for k in keeps {
        assert!(
            out.contains(k),
            "benign {k:?} lost in {out:?} (input {input:?})"
        );
    }
    assert_eq!(s.text(&out), out, "not idempotent for {input:?}");
    out
}

#[test]
fn emails() {
    let out = check(
        "Paged bob.jones+oncall@acme-corp.com and ops@payments.acme.io about the outage",
        &["bob.jones", "acme-corp", "ops@", "payments.acme.io"],
        &["Paged", "about the outage"],
    );
    assert_eq!(out, "Paged <EMAIL> and <EMAIL> about the outage");
}

#[test]
fn ipv4_forms() {
    let out = check(
        "connect to 10.12.4.7:5432 failed; allowlist 192.168.0.0/16, peer 34.117.9.2.",
        &["10.12.4.7", "5432", "192.168", "34.117"],
        &["connect to", "failed; allowlist", ", peer"],
    );
    assert_eq!(out, "connect to <IP> failed; allowlist <IP>, peer <IP>.");
}

#[test]
fn ipv6_forms() {
    check(
        "dial tcp [2001:db8:85a3::8a2e:370:7334]:443: i/o timeout from fe80::1ff:fe23:4567:890a%eth0 and 2001:0db8:0000:0000:0000:ff00:0042:8329 via ::ffff:10.1.2.3",
        &["2001:db8", "85a3", "fe80", "eth0", "0db8", "8329", "10.1.2.3", "ffff"],
        &["dial tcp", "i/o timeout", "via"],
    );
}

#[test]
fn bearer_and_authorization() {
    check(
        r#"curl -H "Authorization: Bearer abc123DEF456ghi789" https://api.example.com/v1 returned 401"#,
        &["abc123DEF456ghi789"],
        &[
            "curl -H",
            "Authorization:",
            "returned 401",
            "https://api.example.com/v1",
        ],
    );
    check(
        "request sent with Authorization: Basic dXNlcjpodW50ZXIy and got 403",
        &["dXNlcjpodW50ZXIy"],
        &["and got 403"],
    );
    check(
        "retry with bearer Zm9vYmFyLmJhejEyMw then it worked",
        &["Zm9vYmFyLmJhejEyMw"],
        &["then it worked"],
    );
}

#[test]
fn jwt() {
    let jwt =
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c";
    check(
        &format!("token validation failed for {jwt}: signature mismatch"),
        &[jwt, "eyJzdWIi", "SflKxw"],
        &["token validation failed for", "signature mismatch"],
    );
}

#[test]
fn aws_keys() {
    check(
        "export AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE\nexport aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        &["AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI", "bPxRfiCY"],
        &["export AWS_ACCESS_KEY_ID=", "aws_secret_access_key"],
    );
    check(
        "assumed role with temporary key ASIAY34FZKBOKMUTVV7A ok",
        &["ASIAY34FZKBOKMUTVV7A"],
        &["assumed role", " ok"],
    );
    // bare base64 AWS secret (slashes, no key name)
    check(
        "leaked wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY in logs",
        &["wJalrXUtnFEMI", "K7MDENG"],
        &["leaked", "in logs"],
    );
}

#[test]
fn vendor_tokens() {
    let cases = [
        "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
        "gho_16C7e42F292c6912E7710c838347Ae178B4a",
        "ghs_16C7e42F292c6912E7710c838347Ae178B4a",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCD",
        "xoxb-2345678901-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
        "xoxp-2345678901-1234567890123-AbCdEfGhIjKl",
        "sk-proj-Ab3dE6gH9jK2mN5pQ8sT1vW4yZ7",
        "sk-ant-api03-Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg",
        "AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe",
        "glpat-xYz12345AbCdEfGhIjKl",
        "ya29.a0AfH6SMBx3kL9mQ2rT7vW1yZ4",
    ];
    for c in cases {
        let out = check(
            &format!("tool call failed: auth with {c} was rejected by upstream"),
            &[c, &c[..c.len().min(12)]],
            &["tool call failed: auth with", "was rejected by upstream"],
        );
        assert!(out.contains("<TOKEN>"), "{out}");
    }
}

#[test]
fn pem_block() {
    let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7bq9u3Vn\nq2Lx0pZ9kQ==\n-----END RSA PRIVATE KEY-----";
    let out = check(
        &format!("mounted key file:\n{pem}\nthen ssh failed"),
        &["MIIEpAIBAAKCAQEA7bq9u3Vn", "q2Lx0pZ9kQ", "BEGIN RSA"],
        &["mounted key file:", "then ssh failed"],
    );
    assert!(out.contains("<TOKEN>"));
    // a block whose end was cut off is redacted to the end
    check(
        "key: -----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA",
        &["b3BlbnNzaC1rZXktdjEAAAAA"],
        &[],
    );
}

#[test]
fn key_value_secrets() {
    let out = check(
        "db connect failed: password=hunter2 user=svc; DB_PASSWORD: s3cr3t! api_key=\"abc\" apikey: QWERTY999 client_secret='xyz-789'",
        &["hunter2", "s3cr3t!", "\"abc\"", "QWERTY999", "xyz-789"],
        &["db connect failed:", "password=", "user=svc", "DB_PASSWORD:", "api_key=", "apikey:", "client_secret="],
    );
    assert!(out.contains("password=<TOKEN>"), "{out}");
    check(
        "mysql --password Tr0ub4dor --host db and secret: my-precious, passwd=opensesame access_key=AK0001",
        &["Tr0ub4dor", "my-precious", "opensesame", "AK0001"],
        &["mysql --password", "--host db", "passwd="],
    );
    check(
        r#"{"username": "svc", "password": "P@ss w0rd", "token":"t-123"}"#,
        &["P@ss w0rd", "t-123"],
        &["\"username\": \"svc\"", "\"password\":"],
    );
}

#[test]
fn url_credentials() {
    let out = check(
        "pg_dump postgres://admin:Sup3rS3cret@db.prod.acme.internal:5432/orders failed, redis://:r3d1spw@cache:6379 too",
        &["admin:Sup3rS3cret", "Sup3rS3cret", "r3d1spw", "db.prod.acme.internal"],
        &["pg_dump postgres://", ":5432/orders failed", "redis://", "@cache:6379 too"],
    );
    assert!(
        out.starts_with("pg_dump postgres://<TOKEN>@<HOST>:5432/orders"),
        "{out}"
    );
}

#[test]
fn high_entropy() {
    check(
        "webhook secret Xk9pL2mQ7vR4tY8wZ1aB3cD6eF0g rotated; digest sha256:3a7bd3e2360a3d29eea436fcfb7e44c735d117c42d1c1835420b6b9942dd4f1b",
        &["Xk9pL2mQ7vR4tY8wZ1aB3cD6eF0g", "3a7bd3e2360a3d29"],
        &["webhook secret", "rotated; digest sha256:"],
    );
    check(
        "slack hook https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX1a2B3c4D",
        &["XXXXXXXXXXXXXXXXXXXXXXXX1a2B3c4D"],
        &["https://hooks.slack.com/services/"],
    );
}

#[test]
fn user_identifiers() {
    let out = check(
        "Alice.Smith asked agent-7f3c to retry run-20261122-001; ALICE@ACME.IO was notified",
        &[
            "Alice.Smith",
            "agent-7f3c",
            "run-20261122-001",
            "ACME.IO",
            "7f3c",
        ],
        &["asked", "to retry", "was notified"],
    );
    assert_eq!(
        out,
        "<USER> asked <USER> to retry <USER>; <USER> was notified"
    );
    // home paths
    let out = check(
        "config read from /home/asmith/.kube/config and /Users/Alice2/Library/gcloud and C:\\Users\\bob\\AppData",
        &["asmith", "Alice2", "bob"],
        &["/.kube/config", "/Library/gcloud", "\\AppData"],
    );
    assert!(out.contains("/home/<USER>/.kube/config"), "{out}");
}

#[test]
fn project_ids() {
    let out = check(
        "gcloud compute instances list --project=acme-ledger-42 failed; added flag --project acme-ledger-42 and it worked",
        &["acme-ledger-42"],
        &["gcloud compute instances list", "--project=", "failed; added flag --project", "and it worked"],
    );
    assert_eq!(out, "gcloud compute instances list --project=<PROJECT_ID> failed; added flag --project <PROJECT_ID> and it worked");
    check(
        "query_metrics on projects/acme-payments-prod/timeSeries with GOOGLE_CLOUD_PROJECT=shadow-proj-7 project_id: \"ledger-x1\"; also saw shadow-proj-7 quota",
        &["acme-payments-prod", "shadow-proj-7", "ledger-x1"],
        &["query_metrics on projects/", "/timeSeries", "GOOGLE_CLOUD_PROJECT=", "project_id:", "quota"],
    );
    check(
        "ran gcloud config set project billing-prod-99 first",
        &["billing-prod-99"],
        &["ran gcloud config set project", "first"],
    );
    // a context project id anywhere, any case
    check(
        "ACME-PAYMENTS-PROD quota exceeded",
        &["ACME-PAYMENTS-PROD"],
        &["quota exceeded"],
    );
    // prose after --project is not a value
    check(
        "the --project flag is required",
        &[],
        &["the --project flag is required"],
    );
}

#[test]
fn gke_names() {
    let out = check(
        "kubectl --context gke_acme-ledger-42_us-central1-a_prod-cluster get pods -n kube-system",
        &["acme-ledger-42", "us-central1", "prod-cluster"],
        &["kubectl --context", "get pods -n kube-system"],
    );
    assert!(out.contains("gke_<PROJECT>_<ZONE>_<CLUSTER>"), "{out}");
    let out = check(
        "node gke-prod-cluster-default-pool-3f2a1b2c-x7k9 NotReady: kubelet stopped posting status",
        &["gke-prod-cluster", "3f2a1b2c", "x7k9"],
        &["NotReady: kubelet stopped posting status"],
    );
    assert!(out.contains("<NODE>"));
}

#[test]
fn arns() {
    check(
        "AccessDenied on arn:aws:eks:us-east-1:123456789012:cluster/payments-eks and arn:aws:iam::123456789012:role/deployer.",
        &["123456789012", "payments-eks", "deployer", "us-east-1"],
        &["AccessDenied on", " and "],
    );
}

#[test]
fn hosts_zones_envs_uuids() {
    let out = check(
        "timeout to api.payments.acme.io from ip-10-0-3-17.ec2.internal in us-east-1b; see https://cloud.google.com/kubernetes-engine/docs",
        &["api.payments.acme.io", "ip-10-0-3-17", "us-east-1b"],
        &["timeout to", "from", "https://cloud.google.com/kubernetes-engine/docs"],
    );
    assert!(out.contains("<HOST>") && out.contains("<ZONE>"), "{out}");
    check(
        "redis-master.cache.svc.cluster.local unreachable in europe-west4 on payments-east and Blue-Canary",
        &["redis-master", "europe-west4", "payments-east", "Blue-Canary"],
        &["unreachable in", "on", "and"],
    );
    check(
        "trace 3f2a9c1e-8b7d-4e6f-a5c4-1b2d3e4f5a6b lost; region asia-northeast1 is fine",
        &["3f2a9c1e-8b7d", "asia-northeast1"],
        &["trace", "lost; region", "is fine"],
    );
    check(
        "printer.local and nas01.lan and build.corp down",
        &["printer.local", "nas01.lan", "build.corp"],
        &["down"],
    );
}

#[test]
fn json_values() {
    let s = san();
    let v = json!({
        "tool": "query_metrics",
        "error": "query_metrics requires resource.type in the filter",
        "correction": "added flag --project=acme-ledger-42",
        "password": "hunter2",
        "apiKey": 12345,
        "project_id": "side-proj-9",
        "notes": ["seen in side-proj-9 by alice@acme.io", {"10.0.0.9": "host ip"}],
        "alice.smith": true,
        "ok": null
    });
    let out = s.value(&v);
    let text = out.to_string();
    for sec in [
        "acme-ledger-42",
        "hunter2",
        "12345",
        "side-proj-9",
        "alice",
        "10.0.0.9",
    ] {
        assert!(!text.contains(sec), "{sec} survived in {text}");
    }
    assert_eq!(out["tool"], "query_metrics");
    assert_eq!(
        out["error"],
        "query_metrics requires resource.type in the filter"
    );
    assert_eq!(out["correction"], "added flag --project=<PROJECT_ID>");
    assert_eq!(out["password"], "<TOKEN>");
    assert_eq!(out["project_id"], "<PROJECT_ID>");
    assert_eq!(out["notes"][0], "seen in <PROJECT_ID> by <USER>");
    assert_eq!(out["notes"][1]["<IP>"], "host ip");
    assert_eq!(out["<USER>"], true);
    assert_eq!(out["ok"], Value::Null);
    assert_eq!(s.value(&out), out, "value() not idempotent");
}

#[test]
fn benign_text_survives() {
    let s = san();
    let keep = [
        "query_metrics requires resource.type in the filter",
        "detect_connection_pool_issues found 3 idle connections in kube-system",
        "upgraded to v1.2.3 then 2026.11.22-3 and version 1.29.4-gke.1043000",
        "started at 14:03:00 took 250ms, p99 latency 1.5s, error rate 12.5% (ratio 3:1)",
        "at 2026-11-22T14:03:00.123Z the pod restarted 17 times",
        "use list_log_entries with severity>=ERROR and resource.labels.cluster_name",
        "bind to 0.0.0.0 not 127.0.0.1; metadata server 169.254.169.254 and ::1",
        "token: expired; the bearer token was missing; password is required",
        "max_tokens=4096 and token_count=17 exceeded the limit",
        "the --project flag must precede the subcommand",
        "see https://kubernetes.io/docs/concepts/ and monitoring.googleapis.com",
        "std::collections::HashMap and Vec::new and f64::EPSILON",
        "OOMKilled container api-server-6d4cf56db6-x2x7k exceeded limits",
        "ConnectionPoolExhaustedException thrown by getHTTPResponseCodeForURLRequest",
        "run kubectl rollout restart deployment/frontend -n default",
        "sk-learn and scikit-learn are fine, so is tokenizer",
        "/var/log/pods/default_frontend/app/0.log and config.prod.yaml",
        "python -m google.cloud.storage and os.path.join",
        "gcloud projects list then projects/{project_id}/logs",
    ];
    for k in keep {
        assert_eq!(s.text(k), k, "benign text changed");
    }
    let (_, n) = s.text_counted(keep[0]);
    assert_eq!(n, 0);
}

#[test]
fn edge_cases() {
    let s = Sanitizer::new(SanitizeContext {
        user_id: "alice".into(),
        identifiers: vec![],
        project_ids: vec!["my-secret-project".into()],
        env_names: vec![],
        names: vec![],
    });
    let cases = [
        // seed 002's own examples
        (
            "my-secret-project -> gke_proj_us-central1_cluster",
            "<PROJECT_ID> -> gke_<PROJECT>_<ZONE>_<CLUSTER>",
        ),
        (
            "Authorization: Bearer abc.def-123 was rejected by the API",
            "Authorization: <TOKEN> was rejected by the API",
        ),
        (
            r#"Authorization: Digest username="bob", response="6629fae4939", nonce=abc"#,
            "Authorization: <TOKEN>",
        ),
        (
            r#"curl -H "Authorization: Digest username=\"bob\", nonce=\"n1\"" -v"#,
            r#"curl -H "Authorization: <TOKEN>" -v"#,
        ),
        (
            "Cookie: session=abc123; csrftoken=def456 then 302",
            "Cookie: <TOKEN> then 302",
        ),
        (
            "ssh git@github.com:org/repo.git failed",
            "ssh git@github.com:org/repo.git failed",
        ),
        (
            "ec2.us-east-1.amazonaws.com, storage.googleapis.com, b1.s3.amazonaws.com",
            "ec2.<ZONE>.amazonaws.com, storage.googleapis.com, <HOST>",
        ),
        (
            // A digit glued to the id is an edge; another letter is not.
            "alice-agent and alice2 and Alice and alicea",
            "<USER>-agent and <USER>2 and <USER> and alicea",
        ),
        (
            "1.2.3.4 and v10.2.0.1 and 300.1.1.1 and 1.2.3.4.5",
            "<IP> and v10.2.0.1 and 300.1.1.1 and 1.2.3.4.5",
        ),
        (
            "at 12:30 MAC 00:1a:2b:3c:4d:5e and fe80::1 and dead::beef",
            "at 12:30 MAC 00:1a:2b:3c:4d:5e and <IP> and dead::beef",
        ),
        (
            "apikey=${API_KEY} password=$PGPASSWORD secret=****",
            "apikey=${API_KEY} password=$PGPASSWORD secret=****",
        ),
        (
            "X-Api-Key: 0123abcdXYZ and x-api-key=foo",
            "X-Api-Key: <TOKEN> and x-api-key=<TOKEN>",
        ),
        (
            r#"{"apiKey":"AbC123","accessToken": "zzz"}"#,
            r#"{"apiKey":"<TOKEN>","accessToken": "<TOKEN>"}"#,
        ),
        (
            "us-east-1a us-central1-f europe-west4 asia-south1-c",
            "<ZONE> <ZONE> <ZONE> <ZONE>",
        ),
        (
            "projects/-/locations projects/123456789012/x projects/my-proj",
            "projects/-/locations projects/<PROJECT_ID>/x projects/<PROJECT_ID>",
        ),
        ("tokens: 500, token limit", "tokens: 500, token limit"),
        (
            "annotate eks.amazonaws.com/role-arn; sts.us-east-1.amazonaws.com ok; logs-bkt.s3.amazonaws.com",
            "annotate eks.amazonaws.com/role-arn; sts.<ZONE>.amazonaws.com ok; <HOST>",
        ),
        (
            "com.google.cloud.storage and networking.gke.io/managed-certificates",
            "com.google.cloud.storage and networking.gke.io/managed-certificates",
        ),
        (
            "deployer@ledger-77.iam.gserviceaccount.com lacks roles/logging.viewer on ledger-77",
            "<EMAIL> lacks roles/logging.viewer on <PROJECT_ID>",
        ),
    ];
    for (input, want) in cases {
        let out = s.text(input);
        assert_eq!(out, want, "for {input:?}");
        assert_eq!(s.text(&out), out);
    }
}

#[test]
fn counted_and_detailed() {
    let s = san();
    let (out, n) = s.text_counted("mail bob@x.io from 10.0.0.1 with token=abc");
    assert_eq!(out, "mail <EMAIL> from <IP> with token=<TOKEN>");
    assert_eq!(n, 3);
    let (_, kinds) = s.text_detailed("mail bob@x.io from 10.0.0.1");
    assert_eq!(kinds, vec![Redaction::Email, Redaction::Ip]);
}

#[test]
fn placeholders_are_stable() {
    let s = Sanitizer::new(SanitizeContext {
        user_id: "user".into(),
        identifiers: vec!["token".into(), "ip".into()],
        project_ids: vec!["project_id".into()],
        env_names: vec!["zone".into(), "host".into()],
        names: vec![],
    });
    let x = "user saw <TOKEN> at <IP> on gke_<PROJECT>_<ZONE>_<CLUSTER> in /home/<USER>/x password=<TOKEN> --project=<PROJECT_ID> <HOST>";
    let out = s.text(x);
    assert_eq!(out, x.replacen("user saw", "<USER> saw", 1));
    assert_eq!(s.text(&out), out);
}

#[test]
fn huge_input_is_cut_and_linear() {
    let s = san();
    let mut big = String::new();
    while big.len() < MAX_TEXT_BYTES + 1000 {
        big.push_str("a.b.c.d-e_f-sk-gke-1:2:3::4 ");
    }
    let out = s.text(&big);
    assert!(out.len() <= MAX_TEXT_BYTES);
    assert!(out.ends_with(TRUNCATION_MARKER));
    assert_eq!(s.text(&out), out);
    // pathological runs stay fast (would be quadratic with naive rescans)
    let long = "sk-".repeat(200_000);
    let t = std::time::Instant::now();
    let _ = s.text(&long);
    let dots = "a.".repeat(300_000);
    let _ = s.text(&dots);
    let ats = "a@".repeat(300_000);
    let _ = s.text(&ats);
    let urls = "x://u:p@a ".repeat(100_000);
    let _ = s.text(&urls);
    let ips = "1.1.1.1.".repeat(100_000) + &"1:".repeat(200_000);
    let _ = s.text(&ips);
    assert!(t.elapsed().as_secs() < 20, "too slow: {:?}", t.elapsed());
}

#[test]
fn fuzz_no_panic_and_idempotent() {
    // random mixes of shape-bearing ASCII and multi-byte characters
    let alphabet: Vec<char> =
        "aZ09._-:/@=<>\"'\\ \n;,%+{}[]$*#?&~`|AKIAghp_sk-eyJgke_projects/home/Usersé日😀"
            .chars()
            .collect();
    let s = san();
    let mut rng = Rng(0xDEAD_BEEF_1234_5678);
    for _ in 0..3000 {
        let n = (rng.next() % 80) as usize;
        let text: String = (0..n).map(|_| *rng.pick(&alphabet)).collect();
        let out = s.text(&text);
        assert_eq!(s.text(&out), out, "not idempotent: {text:?}");
    }
}

#[test]
fn fuzz_fragments_idempotent() {
    let frags = [
        "password=",
        "token: ",
        "--project ",
        "projects/",
        "Bearer ",
        "Authorization: ",
        "://",
        "@",
        "user",
        ":",
        "10.",
        "0.",
        "1",
        "::",
        "fe80",
        "gke_",
        "gke-",
        "a-b-c-1234",
        "_",
        "us-central1",
        "-a",
        ".internal",
        ".corp",
        "acme",
        ".com",
        "arn:aws:",
        "AKIA",
        "ABCDEFGHIJKLMNOP",
        "ghp_",
        "Xk9pL2mQ7vR4tY8wZ1aB3cD6",
        "eyJ",
        "<TOKEN>",
        "<IP>",
        "\"",
        " ",
        ",",
        "/home/",
        "bob",
        "=",
        "é",
        "日",
        "alice.smith",
        "acme-payments-prod",
        "3f2a9c1e-8b7d-4e6f-a5c4-1b2d3e4f5a6b",
        "-----BEGIN PRIVATE KEY-----",
        "-----END ",
        "/",
        "+",
        "\n",
        "set ",
        "sk-",
        "xoxb-",
        "Cookie: ",
        "; ",
        "{\"",
        "\":",
    ];
    let s = san();
    let mut rng = Rng(0x0123_4567_89AB_CDEF);
    for _ in 0..5000 {
        let n = 1 + (rng.next() % 14) as usize;
        let text: String = (0..n).map(|_| *rng.pick(&frags)).collect();
        let out = s.text(&text);
        assert_eq!(s.text(&out), out, "not idempotent: {text:?}");
    }
}

/// Deterministic xorshift64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[(self.next() % v.len() as u64) as usize]
    }
}

#[test]
fn property_no_catalogued_secret_survives() {
    // (text embedded, secret substring that must not survive)
    let catalogue: &[(&str, &str)] = &[
        ("carol.white@bigbank.com", "carol.white"),
        ("10.244.3.17", "10.244.3.17"),
        ("172.16.9.4:8443", "172.16.9.4"),
        ("2001:db8:aaaa::17", "2001:db8:aaaa"),
        ("Bearer QmVhcmVyVG9rZW4xMjM0NTY", "QmVhcmVyVG9rZW4xMjM0NTY"),
        ("AKIAZ7Q2W3E4R5T6Y7U8", "AKIAZ7Q2W3E4R5T6Y7U8"),
        (
            "ghp_Ab12Cd34Ef56Gh78Ij90Kl12Mn34Op56",
            "Ab12Cd34Ef56Gh78Ij90",
        ),
        ("xoxb-111222333-444555666777-zYxWvUtSrQpO", "444555666777"),
        ("sk-Qw3Er5Ty7Ui9Op1As3Df5Gh7Jk9", "Qw3Er5Ty7Ui9Op1As3Df5"),
        (
            "AIzaSyB1c2D3e4F5g6H7i8J9k0L1m2N3o4P5q6R",
            "SyB1c2D3e4F5g6H7i8J9",
        ),
        (
            "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJ4In0.c2lnbmF0dXJlMTIz",
            "eyJpc3MiOiJ4In0",
        ),
        ("password=Zebra!42", "Zebra!42"),
        ("DB_PASSWORD: muffin-88", "muffin-88"),
        ("client_secret=\"cs-777-abc\"", "cs-777-abc"),
        ("https://deploy:Pa55word@git.acme.corp/repo.git", "Pa55word"),
        ("--project=ledger-prod-31", "ledger-prod-31"),
        ("projects/quartz-analytics-9/topics/x", "quartz-analytics-9"),
        ("GOOGLE_CLOUD_PROJECT=ember-ml-2", "ember-ml-2"),
        ("gke_ember-ml-2_europe-west1-b_train-pool", "train-pool"),
        ("gke-train-cluster-gpu-pool-9a8b7c6d-q1w2", "9a8b7c6d"),
        ("arn:aws:iam::210987654321:user/ci-bot", "210987654321"),
        ("vault.secure.acme.internal", "vault.secure"),
        ("build-07.ci.acmecorp.com", "build-07.ci"),
        ("us-west-2", "us-west-2"),
        ("europe-west4-c", "europe-west4"),
        ("0b3e4d2a-9c8f-4e7d-b6a5-f4e3d2c1b0a9", "0b3e4d2a-9c8f"),
        ("/home/dmitri/.ssh/id_rsa", "dmitri"),
        ("alice.smith", "alice.smith"),
        ("agent-7f3c", "agent-7f3c"),
        ("acme-payments-prod", "acme-payments-prod"),
        ("payments-east", "payments-east"),
        (
            "d41d8cd98f00b204e9800998ecf8427e0c1a2b3c",
            "d41d8cd98f00b204e980",
        ),
        ("Authorization: Digest c2VjcmV0ZGlnZXN0", "c2VjcmV0ZGlnZXN0"),
        ("api_key: KEY-77-ALPHA", "KEY-77-ALPHA"),
        ("secret=topsecretvalue", "topsecretvalue"),
    ];
    let benign: &[&str] = &[
        "query_metrics",
        "requires",
        "resource.type",
        "the",
        "filter",
        "--dry-run",
        "kubectl",
        "failed",
        "with",
        "error",
        "timeout",
        "after",
        "30s",
        "retry",
        "v1.2.3",
        "list_log_entries",
        "kube-system",
        "OOMKilled",
        "14:03:00",
        "99.9%",
        "connection",
        "pool",
        "exhausted",
        "on",
        "node",
        "flag",
        "added",
    ];
    let seps: &[&str] = &[
        " ", " ", " ", ", ", "; ", " (", ") ", "\n", " \"", "\" ", ": ", " - ",
    ];
    let s = san();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..2000 {
        let mut text = String::new();
        let mut used = Vec::new();
        let n = 3 + (rng.next() % 12) as usize;
        for k in 0..n {
            if k > 0 {
                let sep: &&str = rng.pick(seps);
                text.push_str(sep);
            }
            if rng.next().is_multiple_of(3) {
                let (leak, secret) = *rng.pick(catalogue);
                text.push_str(leak);
                used.push(secret);
            } else {
                let w: &&str = rng.pick(benign);
                text.push_str(w);
            }
        }
        let out = s.text(&text);
        for sec in &used {
            assert!(
                !out.contains(sec),
                "{sec:?} survived in {out:?} (from {text:?})"
            );
        }
        assert_eq!(s.text(&out), out, "not idempotent: {text:?}");
        let v = json!({ "text": text, "list": [text.clone()] });
        let vo = s.value(&v).to_string();
        for sec in &used {
            assert!(!vo.contains(sec), "{sec:?} survived in value {vo}");
        }
    }
}

#[test]
fn patterns_compile() {
    // The detectors are built once, on first use; every pattern must compile.
    let e = engine();
    assert_eq!(e.res.len(), DETS.len());
    assert_eq!(e.set.len(), DETS.len());
}

#[test]
fn prefixed_key_shapes() {
    for key in [
        "sk-live-abcdef123456",
        "rk_test_51HxYzAbCdEf9876",
        "pk_prod_0a1b2c3d4e5f6g",
        "acme-live-9f8e7d6c5b4a",
        "whsec_MfKQ9r8GKYqqu7aF5LxqXrNN",
        "tok_prod_Zx81mmQ0aa",
    ] {
        let out = check(
            &format!("the call failed until we rotated {key}, then it worked"),
            &[key, &key[key.len() - 8..]],
            &["the call failed until we rotated", "then it worked"],
        );
        assert!(out.contains("<TOKEN>"), "{out}");
    }
    // words joined by separators are not keys
    for keep in [
        "run the e2e_test_suite before prod-live-traffic",
        "sk-learn-tutorial and pre_prod_rollout and list_log_entries",
        "api-server-6d4cf56db6-x2x7k and detect_connection_pool_issues",
    ] {
        assert_eq!(san().text(keep), keep);
    }
}

#[test]
fn phone_numbers() {
    for (phone, tail) in [
        ("+1 415 555 0132", "0132"),
        ("+1-415-555-0132", "0132"),
        ("+44 20 7946 0958", "7946"),
        ("+49 (0)30 901820", "901820"),
        ("+4915123456789", "23456789"),
        ("(415) 555-0132", "555-0132"),
        ("415-555-0132", "555-0132"),
        ("415.555.0132", "555.0132"),
        ("020 7946 0958", "7946 0958"),
        ("1-415-555-0132", "555-0132"),
        ("1 415 555 0132", "555 0132"),
        ("415 555 0132", "555 0132"),
        ("tel:+14155550132", "4155550132"),
        ("phone=+1 415 555 0132", "0132"),
    ] {
        let out = check(
            &format!("paged the on-call at {phone} twice"),
            &[phone, tail],
            &["paged the on-call at", "twice"],
        );
        assert!(out.contains("<PHONE>"), "{out}");
    }
    // versions, dates, IPs, durations, ports, counts
    for keep in [
        "upgraded 1.29.4 to 2026.11.22-3 on 2026-11-22 at 14:03:00",
        "listen on :5432 and :8443, p99 1500ms over 86400s, 12345678 rows",
        "error rate +12.5% after 3 retries, +300 ms",
        "build 20261122 took 1234.5678 s and version 10.2.3.4567",
        "latencies 120 450 1200 ms, ports 143 110 8080 and 1.100.200.3000",
    ] {
        assert_eq!(san().text(keep), keep);
    }
}

#[test]
fn listed_names() {
    let s = Sanitizer::new(SanitizeContext {
        user_id: "bob".into(),
        names: vec!["Dana Whitfield".into(), "Initech".into()],
        ..SanitizeContext::default()
    });
    let out = s.text("Dana Whitfield from INITECH said dana knows; whitfield2 and Danapoint stay");
    assert_eq!(
        out,
        "<NAME> from <NAME> said <NAME> knows; <NAME>2 and Danapoint stay"
    );
    assert_eq!(s.text(&out), out);
}

#[test]
fn prefixed_keys_phones_and_listed_names() {
    let s = Sanitizer::new(SanitizeContext {
        user_id: "bob".into(),
        names: vec!["Dana Whitfield".into(), "Okonkwo".into()],
        ..SanitizeContext::default()
    });
    for (leak, placeholder) in [
        (
            "resolved by rotating sk-live-abcdef123456 in the vault",
            "<TOKEN>",
        ),
        ("stripe key rk_test_51HxYzAbCdEf12 was revoked", "<TOKEN>"),
        ("webhook secret whsec_9f8e7d6c5b4a3f2e1d0c", "<TOKEN>"),
        ("on-call at +1 415 555 0132 confirmed", "<PHONE>"),
        ("call (415) 555-0132 for the bridge", "<PHONE>"),
        ("escalate to 415-555-0132 after hours", "<PHONE>"),
        ("the London desk, +44 20 7946 0958", "<PHONE>"),
        ("paged dana whitfield about the rollback", "<NAME>"),
        ("Okonkwo approved the failover", "<NAME>"),
    ] {
        let out = s.text(leak);
        assert!(out.contains(placeholder), "{leak:?} -> {out:?}");
        for secret in [
            "abcdef123456",
            "51HxYzAbCdEf12",
            "9f8e7d6c5b4a",
            "555",
            "7946",
            "whitfield",
            "Okonkwo",
        ] {
            assert!(
                !out.to_lowercase().contains(&secret.to_lowercase()) || !leak.contains(secret),
                "{leak:?} -> {out:?}"
            );
        }
    }
    for benign in [
        "deployed v4.17.3 on 2026-11-25 at 14:02",
        "p99 rose to 2300 ms on port 8080",
        "pod api-server-6d4cf56db6-x2x7k restarted 3 times",
        "build 20261125 passed 1532 tests",
        "checkout-service-deployment scaled to 12 replicas",
    ] {
        assert_eq!(s.text(benign), benign);
    }
}

/// Forms a fresh-eyes review (2026-11-29) got through to the shared scope: national
/// phone numbers, numbers after a phone key, addresses in other scripts, encoded or spelled
/// out, a password with `/` in a URL, secrets under common variable names, an address or a
/// listed name glued to an identifier, invisible and full-width characters.
#[test]
fn forms_that_leaked_before_are_redacted() {
    let s = Sanitizer::new(SanitizeContext {
        user_id: "bob".into(),
        names: vec!["Zoë Müller".into(), "Dana Whitfield".into()],
        ..SanitizeContext::default()
    });
    let cases: &[(&str, &str)] = &[
        ("call 07700 900123 now", "call <PHONE> now"),
        (
            "Berlin 030 12345678, mobil 0151 23456789",
            "Berlin <PHONE>, mobil <PHONE>",
        ),
        ("fax 030/12345678", "fax <PHONE>"),
        (
            "Paris 06.12.34.56.78 ou 06-12-34-56-78",
            "Paris <PHONE> ou <PHONE>",
        ),
        (
            "Tokyo 03-1234-5678, 090-1234-5678",
            "Tokyo <PHONE>, <PHONE>",
        ),
        ("São Paulo (11) 91234-5678", "São Paulo <PHONE>"),
        ("desk 415 555-0132", "desk <PHONE>"),
        (
            "phone:415-555-0132 tel:4155550132",
            "phone:<PHONE> tel:<PHONE>",
        ),
        ("mobile = 98765 43210", "mobile = <PHONE>"),
        ("josé@acme.com and müller@firma.de", "<EMAIL> and <EMAIL>"),
        ("carol.w%40acme.com", "<EMAIL>"),
        (
            "carol at acme dot com, carol[at]acme[dot]com",
            "<EMAIL>, <EMAIL>",
        ),
        ("carol\u{200b}@acme.com", "<EMAIL>"),
        ("carol\u{ff20}acme.com", "<EMAIL>"),
        (
            "pager +44\u{00a0}20\u{00a0}7946\u{00a0}0958",
            "pager <PHONE>",
        ),
        ("\u{ff10}\u{ff17}\u{ff17}\u{ff10}\u{ff10} 900123", "<PHONE>"),
        (
            "postgres://app:Xy9/Qz8+Kp2@db.example.com/x",
            "postgres://<TOKEN>@db.example.com/x",
        ),
        (
            "DB_PASS=hunter22 REDIS_PASS=hunter23",
            "DB_PASS=<TOKEN> REDIS_PASS=<TOKEN>",
        ),
        (
            "MYSQL_PWD=hunter44 SECRET_KEY_BASE=abcdef",
            "MYSQL_PWD=<TOKEN> SECRET_KEY_BASE=<TOKEN>",
        ),
        (
            "HMAC_KEY=k1 AUTH_KEY=k2 APP_KEY=k3",
            "HMAC_KEY=<TOKEN> AUTH_KEY=<TOKEN> APP_KEY=<TOKEN>",
        ),
        ("pin: 4821, otp: 998877", "pin: <TOKEN>, otp: <TOKEN>"),
        (
            "host_10.20.30.40 and ssh_10.20.30.40",
            "host_<IP> and ssh_<IP>",
        ),
        ("node_fe80::1ff:fe23:4567:890a", "node_<IP>"),
        (
            "ZOË MÜLLER and Müller's and whitfield2",
            "<NAME> and <NAME>'s and <NAME>2",
        ),
        ("page_whitfield2", "page_<NAME>2"),
    ];
    expect_each(&s, cases);
    // What stays: prose, dates, versions, durations, lists, ports, keys that only end in
    // `pass`.
    for benign in [
        "hosted at github.com and deployed at acme.com",
        "look at the dashboard",
        "on 2025-11-29 at 03:45, v1.2.3 and 10.2.3",
        "p99 120 450 1200 ms across regions",
        "latency 250 ms; 3 of 5 retries; ports 8080 8443",
        "bypass: true and compass: north",
        "phone home failed 3 times",
        "microphone: 3 devices",
        "sla 99.95 for 30 days",
    ] {
        assert_eq!(s.text(benign), benign);
    }
}

/// A second review of the mends above (2026-11-29): names in scripts without spaces and
/// beside curly quotes, an address followed by other scripts, phone keys in JSON and
/// their other spellings, a Dutch mobile, invisible direction marks, and what must stay
/// (a dev server's `host:port/@path`, prose with `at the dot`, the shell's `PWD`, counts
/// named `*_pass`, numbers after a phone-like word without `:`).
#[test]
fn forms_a_second_review_found_are_redacted_and_prose_stays() {
    let s = Sanitizer::new(SanitizeContext {
        user_id: "bob".into(),
        names: vec!["田中".into(), "Zoë Müller".into()],
        ..SanitizeContext::default()
    });
    let cases: &[(&str, &str)] = &[
        ("田中さんに連絡", "<NAME>さんに連絡"),
        (
            "Zoë\u{2019}s laptop, «Zoë»",
            "<NAME>\u{2019}s laptop, «<NAME>»",
        ),
        ("메일은 carol@acme.com으로", "메일은 <EMAIL>으로"),
        ("carol@acme.comまで", "<EMAIL>まで"),
        ("carol\u{200e}@acme.com", "<EMAIL>"),
        (r#""phone": "4155550132""#, r#""phone": "<PHONE>""#),
        (
            "Telephone: 4155550132, phone_number=4155550133",
            "Telephone: <PHONE>, phone_number=<PHONE>",
        ),
        ("tel:(415)5550132", "tel:<PHONE>"),
        ("or 06-12345678", "or <PHONE>"),
    ];
    expect_each(&s, cases);
    let v = serde_json::json!({"pass\u{200b}word": "hunter2", "phone": "4155550132",
                               "mobilePhone": 4_155_550_133_u64, "port": 8080});
    let out = s.value(&v);
    assert_eq!(
        out,
        serde_json::json!({"password": "<TOKEN>", "phone": "<PHONE>", "mobilePhone": "<PHONE>",
                           "port": 8080})
    );
    assert_eq!(s.value(&out), out);
    for benign in [
        "GET http://localhost:5173/@vite/client 404",
        "the parser breaks at the dot in hostnames",
        "PWD=/srv/app and OLDPWD=/tmp",
        "first_pass: 12 ms, all_pass=false",
        "mobile 1 234 567 users; sms: 29-11-2025",
        "salt: 16 bytes",
    ] {
        assert_eq!(s.text(benign), benign);
    }
    // What the first mends caught still is.
    assert_eq!(
        s.text("DB_PASS=x1 MYSQL_PWD=x2"),
        "DB_PASS=<TOKEN> MYSQL_PWD=<TOKEN>"
    );
}

/// Payment cards (Luhn), US social security numbers and IBANs (mod 97): personal data
/// the shared scope must not carry; numbers of the same shape that fail the checks stay.
#[test]
fn cards_national_ids_and_ibans_are_redacted() {
    let s = Sanitizer::new(SanitizeContext::default());
    let cases: &[(&str, &str)] = &[
        ("card 4111 1111 1111 1111 declined", "card <CARD> declined"),
        ("4111-1111-1111-1111, 4111111111111111", "<CARD>, <CARD>"),
        (
            "amex 3782 822463 10005; mc 5500000000000004",
            "amex <CARD>; mc <CARD>",
        ),
        ("SSN 123-45-6789 on file", "SSN <ID> on file"),
        ("IBAN GB82 WEST 1234 5698 7654 32", "IBAN <ACCOUNT>"),
        ("to DE89370400440532013000.", "to <ACCOUNT>."),
    ];
    expect_each(&s, cases);
    for benign in [
        "card 4111 1111 1111 1112 (fails Luhn)",
        "area 666-12-3456 and 000-12-3456 are never issued",
        "GB82 WEST 1234 5698 7654 33 fails its check",
        "on 2025-11-29 12:03:04, build 1700000000000",
        "trace 4111111111111111234 is longer than a card",
    ] {
        assert_eq!(s.text(benign), benign);
    }
}

/// A third review (2026-11-29): number lists, zeroed hexdumps and zero-padded ids are not
/// cards or phones; a card in CSV, an IBAN followed by its currency, other separators and
/// an SSN after a key are redacted.
#[test]
fn numbers_a_third_review_found() {
    let s = Sanitizer::new(SanitizeContext::default());
    let cases: &[(&str, &str)] = &[
        ("1001,4111111111111111,123,12/27", "1001,<CARD>,123,12/27"),
        (
            "order 1001 4111 1111 1111 1111 exp",
            "order 1001 <CARD> exp",
        ),
        (
            "4111.1111.1111.1111 and 4111_1111_1111_1111",
            "<CARD> and <CARD>",
        ),
        (
            "IBAN ES91 2100 0418 4502 0005 1332 EUR",
            "IBAN <ACCOUNT> EUR",
        ),
        ("AT611904300234573201 EUR", "<ACCOUNT> EUR"),
        ("ssn-123-45-6789, 123 45 6789", "ssn-<ID>, <ID>"),
    ];
    expect_each(&s, cases);
    for benign in [
        "ports 3000 3001 3002 3003, years 2023 2024 2025 2026",
        "batch 1000 2000 3000 4000 done; 2048 4096 8192 16384",
        "00000000: 0000 0000 0000 0000 0000 0000 0000 0000",
        "offset=0012345678, seq 001 002 003 004",
        "sms: 2024-11-29 10:31:02 delivered",
        "I worked (at) Google. It was fun",
    ] {
        assert_eq!(s.text(benign), benign);
    }
}

/// Each input sanitizes to what it should, and sanitizing that again changes nothing.
fn expect_each(s: &Sanitizer, cases: &[(&str, &str)]) {
    for (input, want) in cases {
        let out = s.text(input);
        assert_eq!(out, *want, "for {input:?}");
        assert_eq!(s.text(&out), out, "not idempotent for {input:?}");
    }
}

/// Forms a fourth review found shared: phone numbers dialled with `00`, in national
/// formats, or unbroken; an IPv4 address with `_` between its octets (an argument or
/// tool name: `ip_10_20_30_40`), which the argument-name shape rule now drops too.
#[test]
fn numbers_a_fourth_review_found() {
    let s = san();
    let cases: &[(&str, &str)] = &[
        ("call 0049 30 12345678 now", "call <PHONE> now"),
        ("call 0044 7700 900123 now", "call <PHONE> now"),
        ("office (020) 7946 0958", "office <PHONE>"),
        ("mobile 8 (912) 345-67-89", "mobile <PHONE>"),
        ("cn 13800138000 ok", "cn <PHONE> ok"),
        ("us 4155550132 ok", "us <PHONE> ok"),
        ("in 98765 43210 ok", "in <PHONE> ok"),
        ("es 612 345 678 ok", "es <PHONE> ok"),
        ("se 070-123 45 67 ok", "se <PHONE> ok"),
        ("call_4155550132", "call_<PHONE>"),
        ("ip_10_20_30_40 and 10_20_30_42", "ip_<IP> and <IP>"),
    ];
    expect_each(&s, cases);
    for benign in [
        "epoch 1732924800 and 1732924800123 ms",
        "p50 120 ms, p99 450 ms, 3 of 512 pods",
        "offset=0012345678, seq 001 002 003 004",
        "batch 1000 2000 3000 4000 done",
        "version 1.2.3 on port 8080",
    ] {
        assert_eq!(s.text(benign), benign);
    }
    assert!(arg_name_is_data("ip_10_20_30_40"));
    for name in [
        "v2_api",
        "s3_bucket",
        "ec2_instance_id",
        "x509_cert",
        "page_size_100",
    ] {
        assert!(!arg_name_is_data(name), "{name}");
    }
}
