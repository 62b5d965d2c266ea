//! The sanitizer (seed 002's `MemorySanitizer`): every record copied to the shared
//! `system_shared_patterns` scope passes through it first.
//!
//! Size: one hand-written byte scanner per secret shape, with their tests (about 800
//! lines). The newer detectors (prefixed keys, phone numbers, listed names) are `regex`
//! patterns (`Detectors`); moving the older scanners onto `regex` too would shrink this
//! file and is open work (issue 10).
//!
//! CONTRACT: [`Sanitizer::text`] returns the text with every e-mail address, IP address
//! (v4 and v6), token or key, the user's own identifiers, project ids and
//! environment-specific names replaced by placeholders (`<EMAIL>`, `<IP>`, `<TOKEN>`,
//! `<USER>`, `<PROJECT_ID>`, ...). [`Sanitizer::value`] applies it to every string of a
//! JSON value (object keys too). Pure and deterministic.
//!
//! # How it works
//! No regex engine: a set of small hand-rolled byte scanners, each one left-to-right pass
//! with bounded look-ahead or whole-run skips, so the total work is linear in the input.
//! Every scanner reports byte spans with a [`Redaction`] kind; overlapping spans are merged
//! (the longest span's placeholder wins, ties go to the more specific kind) and the text is
//! rebuilt once. Existing placeholders (`<TOKEN>`, `<USER>`, ...) are protected, and the
//! passes repeat until one finds nothing (a redaction can change its neighbour's shape), so
//! `text(text(x)) == text(x)`. Inputs over [`MAX_TEXT_BYTES`] are cut (at whitespace when
//! possible) and end with `<TRUNCATED>`; the output never exceeds that size either.
//!
//! What is redacted:
//! - e-mail addresses -> `<EMAIL>` (except `git@host` ssh remotes);
//! - IPv4 (with `:port` or `/cidr`) and IPv6 (full, `::`-compressed, embedded v4, `%zone`)
//!   -> `<IP>`; `0.0.0.0`, `127.0.0.1`, `255.255.255.255`, `169.254.169.254` (metadata
//!   server) and `::1` are kept: they identify nobody and are often the point of a lesson;
//! - tokens -> `<TOKEN>`: `Bearer x`, `Authorization:`/`Cookie:` header values, JWTs,
//!   AWS key ids (`AKIA`/`ASIA`/...), GitHub (`ghp_`, `gho_`, `ghs_`, `ghu_`, `ghr_`,
//!   `github_pat_`), GitLab (`glpat-`), Slack (`xox?-`, `xapp-`), `sk-`/`sk_live_` keys,
//!   Google API keys (`AIza`) and OAuth tokens (`ya29.`), PEM private key blocks, the value
//!   of any `key=value` / `key: value` / `"key": "value"` / `--key value` pair whose key
//!   ends in password, passwd, passphrase, secret, token, api_key/apikey, access_key,
//!   secret_key, private_key, client_secret, credential(s), connection_string, session_id,
//!   sig (the key is kept), URL credentials (`scheme://user:pass@host`), and long
//!   high-entropy strings (>= 24 chars mixing letters and digits or cases, hex >= 32,
//!   slash-separated base64);
//! - the user's `user_id` and `identifiers` (whole token, ASCII case-insensitive) ->
//!   `<USER>`; home directories `/home/<name>`, `/Users/<name>`, `C:\Users\<name>` ->
//!   `/home/<USER>` etc.;
//! - project ids from the context and detected in `projects/<id>`, `--project=<id>`,
//!   `--project <id>`, `gcloud config set project <id>`, `project_id=<id>`,
//!   `GOOGLE_CLOUD_PROJECT=<id>` (and JSON keys `project`/`project_id`/...) ->
//!   `<PROJECT_ID>`; a detected id is also redacted wherever else it occurs in the same
//!   text or JSON value;
//! - GKE contexts `gke_<project>_<zone>_<cluster>` -> `gke_<PROJECT>_<ZONE>_<CLUSTER>`,
//!   GKE node names -> `<NODE>`, AWS ARNs (EKS clusters included) -> `<ARN>`, internal
//!   hosts (`.internal`, `.local`, `.corp`, `.lan`, `.svc`, ...) and FQDNs of 3+ labels
//!   under a known TLD that are not well-known public domains (`*.amazonaws.com` is public
//!   only when every label is a service or region: `eks.amazonaws.com`) -> `<HOST>`, GCP/AWS
//!   regions and zones -> `<ZONE>`, the context's `env_names` -> `<ENV>`, UUIDs -> `<ID>`.
//!
//! # Known limits
//! - Secrets with no recognizable shape are not caught: a short or all-lowercase password
//!   in free text ("the password is hunter"), a password passed as `-p hunter2`, a random
//!   string under 24 characters, a secret split across lines or JSON fields.
//! - Names of people, companies, customers or services in free text ("Bob from Acme said")
//!   are kept, unless listed in the context; so are bare host names without dots
//!   (`prod-db-7`), 2-label domains (`acme.com`), cluster names outside a GKE context,
//!   pod/deployment names, bucket names in `gs://` paths, AWS account ids outside ARNs,
//!   Azure regions (`eastus`), MAC addresses, phone numbers.
//! - FQDNs are only recognized under a fixed TLD list (`google.cloud.storage` is kept,
//!   so are hosts under unlisted TLDs); 4-part versions that are valid IPv4 addresses
//!   (`10.2.0.1`) are redacted as IPs; git SHAs and digests (hex >= 32) become `<TOKEN>`.
//! - Identifier matching is ASCII case-insensitive only, on alphanumeric boundaries
//!   (`alice` is found in `alice-agent` but not in `alice2`).
//! - Key-value detection after `:` or a space skips a few English words ("token: expired"
//!   keeps `expired`) and `$VAR`/`${VAR}` references; a real secret equal to one of those
//!   words would survive.
//! - In [`Sanitizer::value`], two object keys that sanitize to the same string collapse
//!   into one (the last wins).
//! - Over-redaction by design: any value after a secret- or project-named key is taken
//!   (`project: Apollo` hides `Apollo`), `[1::2]`-like slices parse as IPv6, and
//!   `*.svc.cluster.local` service names (even `kube-dns.kube-system...`) become `<HOST>`.
//! - Subdomains of public service domains are kept (`bkt.storage.googleapis.com` leaks
//!   the bucket name); at most 64 detected project ids per record are propagated.
//! - Idempotence holds for texts whose sanitized form fits in [`MAX_TEXT_BYTES`] and that
//!   reach a fixed point within 8 passes (every observed input needs at most 2).

use serde_json::{Map, Value};
use std::borrow::Cow;

/// Inputs longer than this (bytes) are cut and marked with `<TRUNCATED>`; outputs never
/// exceed it.
pub const MAX_TEXT_BYTES: usize = 1 << 20;

const TRUNCATION_MARKER: &str = "<TRUNCATED>";

/// Placeholder names the sanitizer emits; `<NAME>` is never redacted again.
const PLACEHOLDER_NAMES: &[&str] = &[
    "EMAIL",
    "IP",
    "TOKEN",
    "USER",
    "PROJECT_ID",
    "PROJECT",
    "ZONE",
    "CLUSTER",
    "NODE",
    "ARN",
    "HOST",
    "ENV",
    "ID",
    "TRUNCATED",
];

/// The kind of one redaction, and so its placeholder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Redaction {
    /// An e-mail address: `<EMAIL>`.
    Email,
    /// An IPv4 or IPv6 address: `<IP>`.
    Ip,
    /// A token, key, password or other credential: `<TOKEN>`.
    Token,
    /// The user's own identifier: `<USER>`.
    User,
    /// The user name in a home directory path: `<USER>`.
    HomePath,
    /// A project id: `<PROJECT_ID>`.
    ProjectId,
    /// A GKE kubectl context: `gke_<PROJECT>_<ZONE>_<CLUSTER>`.
    GkeContext,
    /// A GKE node name: `<NODE>`.
    Node,
    /// An AWS ARN: `<ARN>`.
    Arn,
    /// An internal or non-public host name: `<HOST>`.
    Host,
    /// A cloud region or zone: `<ZONE>`.
    Zone,
    /// One of the context's environment names: `<ENV>`.
    Env,
    /// A UUID: `<ID>`.
    Id,
    /// A telephone number: `<PHONE>`.
    Phone,
    /// A person's name the user listed: `<NAME>`.
    Name,
}

impl Redaction {
    /// The text that replaces a redacted span of this kind.
    pub fn placeholder(self) -> &'static str {
        match self {
            Redaction::Email => "<EMAIL>",
            Redaction::Ip => "<IP>",
            Redaction::Token => "<TOKEN>",
            Redaction::User | Redaction::HomePath => "<USER>",
            Redaction::ProjectId => "<PROJECT_ID>",
            Redaction::GkeContext => "gke_<PROJECT>_<ZONE>_<CLUSTER>",
            Redaction::Node => "<NODE>",
            Redaction::Arn => "<ARN>",
            Redaction::Host => "<HOST>",
            Redaction::Zone => "<ZONE>",
            Redaction::Env => "<ENV>",
            Redaction::Id => "<ID>",
            Redaction::Phone => "<PHONE>",
            Redaction::Name => "<NAME>",
        }
    }

    /// Tie-break between overlapping spans of the same length: the more specific wins.
    fn priority(self) -> u8 {
        match self {
            Redaction::User | Redaction::HomePath => 10,
            Redaction::Email => 9,
            Redaction::Token => 8,
            Redaction::ProjectId => 7,
            Redaction::GkeContext | Redaction::Arn => 6,
            Redaction::Node | Redaction::Ip => 5,
            Redaction::Id => 4,
            Redaction::Host => 3,
            Redaction::Env => 2,
            Redaction::Zone => 1,
            Redaction::Phone | Redaction::Name => 9,
        }
    }
}

/// What the sanitizer knows about the user whose record is being shared.
#[derive(Clone, Debug, Default)]
pub struct SanitizeContext {
    /// The user id (the partition key).
    pub user_id: String,
    /// Other identifiers of the user: agent ids, session ids, run ids, e-mail addresses.
    pub identifiers: Vec<String>,
    /// The user's project ids (also detected in `projects/<id>` paths).
    pub project_ids: Vec<String>,
    /// Environment-specific names to redact (cluster, host names) besides the detected ones.
    pub env_names: Vec<String>,
    /// People's names the user lists (`redact_names` in the user's settings, `swarm synth
    /// --redact-name`): redacted as whole words, any case.
    pub names: Vec<String>,
}

/// The redactor.
#[derive(Clone, Debug)]
pub struct Sanitizer {
    ctx: SanitizeContext,
    /// Whole-token needles, ASCII-lowercased, with their kind.
    needles: Vec<(String, Redaction)>,
    /// The listed names as one case-insensitive, whole-word alternation.
    names: Option<regex::Regex>,
}

impl Sanitizer {
    /// A sanitizer for one user's records.
    pub fn new(ctx: SanitizeContext) -> Sanitizer {
        let mut needles: Vec<(String, Redaction)> = Vec::new();
        let mut add = |s: &str, kind: Redaction| {
            let n = s.trim().to_ascii_lowercase();
            if n.len() >= 2 && !needles.iter().any(|(x, _)| *x == n) {
                needles.push((n, kind));
            }
        };
        add(&ctx.user_id, Redaction::User);
        for s in &ctx.identifiers {
            add(s, Redaction::User);
        }
        for s in &ctx.project_ids {
            add(s, Redaction::ProjectId);
        }
        for s in &ctx.env_names {
            add(s, Redaction::Env);
        }
        let names: Vec<String> = ctx
            .names
            .iter()
            .map(|n| {
                n.split_whitespace()
                    .map(regex::escape)
                    .collect::<Vec<_>>()
                    .join(r"\s+")
            })
            .filter(|n| n.len() >= 2)
            .collect();
        let names = (!names.is_empty())
            .then(|| regex::Regex::new(&format!(r"(?i)\b(?:{})\b", names.join("|"))).ok())
            .flatten();
        Sanitizer {
            ctx,
            needles,
            names,
        }
    }

    /// The context this sanitizer was built with.
    pub fn context(&self) -> &SanitizeContext {
        &self.ctx
    }

    /// The text with every sensitive part replaced.
    pub fn text(&self, s: &str) -> String {
        self.run(s, &[]).0
    }

    /// The sanitized text and the number of redactions made (merged spans).
    pub fn text_counted(&self, s: &str) -> (String, usize) {
        let (out, kinds) = self.run(s, &[]);
        (out, kinds.len())
    }

    /// The sanitized text and the kind of every redaction made, in text order.
    pub fn text_detailed(&self, s: &str) -> (String, Vec<Redaction>) {
        self.run(s, &[])
    }

    /// Every string in `v` (keys included) sanitized. The value of an object key naming a
    /// secret (`password`, `api_key`, `token`, ...) becomes `"<TOKEN>"`, of a key naming a
    /// project (`project`, `project_id`, ...) `"<PROJECT_ID>"`; a project id detected
    /// anywhere in `v` is redacted everywhere in `v`.
    pub fn value(&self, v: &Value) -> Value {
        let mut detected = Vec::new();
        self.collect_projects(v, &mut detected);
        self.value_with(v, &detected)
    }

    fn collect_projects(&self, v: &Value, detected: &mut Vec<String>) {
        match v {
            Value::String(s) => {
                let input = cut_input(s);
                let mut sc = Scanner::new(&input);
                sc.structural();
                for d in sc.detected {
                    push_unique(detected, d);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| self.collect_projects(x, detected)),
            Value::Object(o) => {
                for (k, x) in o {
                    self.collect_projects(&Value::String(k.clone()), detected);
                    if key_class(k) == Some(KeyClass::Project) {
                        if let Value::String(s) = x {
                            if let Some(id) = project_like(s) {
                                push_unique(detected, id);
                            }
                        }
                    }
                    self.collect_projects(x, detected);
                }
            }
            _ => {}
        }
    }

    fn value_with(&self, v: &Value, extra: &[String]) -> Value {
        match v {
            Value::String(s) => Value::String(self.run(s, extra).0),
            Value::Array(a) => Value::Array(a.iter().map(|x| self.value_with(x, extra)).collect()),
            Value::Object(o) => {
                let mut m = Map::new();
                for (k, x) in o {
                    let nk = self.run(k, extra).0;
                    let nx = match (key_class(k), x) {
                        (Some(KeyClass::Secret), Value::String(s))
                            if !s.is_empty() && !is_placeholder_start(s) =>
                        {
                            Value::String(Redaction::Token.placeholder().to_string())
                        }
                        (Some(KeyClass::Secret), Value::Number(_)) => {
                            Value::String(Redaction::Token.placeholder().to_string())
                        }
                        (Some(KeyClass::Project), Value::String(s))
                            if !s.is_empty() && !is_placeholder_start(s) =>
                        {
                            Value::String(Redaction::ProjectId.placeholder().to_string())
                        }
                        (Some(KeyClass::Project), Value::Number(_)) => {
                            Value::String(Redaction::ProjectId.placeholder().to_string())
                        }
                        _ => self.value_with(x, extra),
                    };
                    m.insert(nk, nx);
                }
                Value::Object(m)
            }
            other => other.clone(),
        }
    }

    /// Sanitizes to a fixed point: a redaction can change what its neighbours look like
    /// (`x.10.<TOKEN>` vs `x.10.Xk9...`), so passes repeat until one finds nothing; the
    /// count of unprotected bytes drops with every change, in practice after one extra pass.
    fn run(&self, s: &str, extra: &[String]) -> (String, Vec<Redaction>) {
        let mut known: Vec<String> = extra.to_vec();
        let (mut out, mut kinds) = self.pass(s, &mut known);
        let mut changed = !kinds.is_empty();
        let mut passes = 1;
        while changed && passes < 8 {
            let (o, k) = self.pass(&out, &mut known);
            changed = !k.is_empty();
            if changed {
                out = o;
                kinds.extend(k);
            }
            passes += 1;
        }
        (out, kinds)
    }

    fn pass(&self, s: &str, known: &mut Vec<String>) -> (String, Vec<Redaction>) {
        let input = cut_input(s);
        let mut sc = Scanner::new(&input);
        sc.structural();
        for d in sc.detected.drain(..) {
            push_unique(known, d);
        }
        let mut needles: Vec<(String, Redaction)> = self.needles.clone();
        for d in known.iter() {
            if d.len() >= 2 && !needles.iter().any(|(x, _)| x == d) && needles.len() < 256 {
                needles.push((d.clone(), Redaction::ProjectId));
            }
        }
        sc.needles(&needles);
        let (out, mut kinds) = sc.rebuild();
        let out = self.shapes(out, &mut kinds);
        (cap_output(out), kinds)
    }

    /// The detectors written as regular expressions (linear time, the `regex` crate):
    /// prefixed keys of any vendor, telephone numbers, and the names the user listed.
    fn shapes(&self, s: String, kinds: &mut Vec<Redaction>) -> String {
        let d = detectors();
        let mut out = s;
        if let Some(names) = &self.names {
            out = replace_counted(names, &out, Redaction::Name, kinds, |_| true);
        }
        out = replace_counted(&d.prefixed_key, &out, Redaction::Token, kinds, |m| {
            let secret = m.rsplit(['-', '_']).next().unwrap_or("");
            let digits = secret.bytes().filter(u8::is_ascii_digit).count();
            let letters = secret.bytes().filter(u8::is_ascii_alphabetic).count();
            // Random, not a word: letters and digits mixed, or long.
            (digits >= 2 && letters >= 2) || secret.len() >= 24
        });
        for phone in [&d.phone_intl, &d.phone_nanp] {
            out = replace_counted(phone, &out, Redaction::Phone, kinds, |m| {
                let digits = m.bytes().filter(u8::is_ascii_digit).count();
                (7..=15).contains(&digits)
            });
        }
        out
    }
}

/// The regex detectors, compiled once.
struct Detectors {
    /// `sk-live-…`, `rk_test_…`, `whsec_…`, `pk_prod_…`: a short vendor word, an optional
    /// environment, and a long random part.
    prefixed_key: regex::Regex,
    /// `+1 415 555 0132`, `+44 20 7946 0958`, `+4915112345678`.
    phone_intl: regex::Regex,
    /// `(415) 555-0132`, `415-555-0132`, `415.555.0132`.
    phone_nanp: regex::Regex,
}

fn detectors() -> &'static Detectors {
    static D: std::sync::OnceLock<Detectors> = std::sync::OnceLock::new();
    D.get_or_init(|| Detectors {
        prefixed_key: regex::Regex::new(
            r"\b[A-Za-z][A-Za-z0-9]{1,15}[-_](?:(?:live|test|prod|dev)[-_])?[A-Za-z0-9]{12,}\b",
        )
        .expect("static regex"),
        phone_intl: regex::Regex::new(r"\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}\b")
            .expect("static regex"),
        phone_nanp: regex::Regex::new(r"(?:\(\d{3}\)\s?|\b\d{3}[-.])\d{3}[-.]\d{4}\b")
            .expect("static regex"),
    })
}

/// Replaces every match of `re` that `keep` accepts with `kind`'s placeholder, and
/// records each redaction.
fn replace_counted(
    re: &regex::Regex,
    s: &str,
    kind: Redaction,
    kinds: &mut Vec<Redaction>,
    keep: impl Fn(&str) -> bool,
) -> String {
    let mut n = 0;
    let out = re.replace_all(s, |c: &regex::Captures<'_>| {
        let whole = c.get(0).map_or(0..0, |m| m.range());
        let m = &c[0];
        // A standalone token only: not the tail of a longer name (`api-server-6d4c…`).
        let glued = s[..whole.start]
            .chars()
            .next_back()
            .is_some_and(|p| matches!(p, '-' | '_' | '.' | '/'));
        if !glued && keep(m) {
            n += 1;
            kind.placeholder().to_string()
        } else {
            m.to_string()
        }
    });
    kinds.extend(std::iter::repeat_n(kind, n));
    out.into_owned()
}

/// Adds a detected project id (at most 64 per record: each one costs a pass over the text).
fn push_unique(v: &mut Vec<String>, s: String) {
    if !v.contains(&s) && v.len() < 64 {
        v.push(s);
    }
}

fn is_placeholder_start(s: &str) -> bool {
    s.starts_with('<')
}

/// Cuts an over-long input at whitespace (or a char boundary) and marks it.
fn cut_input(s: &str) -> Cow<'_, str> {
    if s.len() <= MAX_TEXT_BYTES {
        return Cow::Borrowed(s);
    }
    Cow::Owned(format!("{} {}", &s[..cut_point(s)], TRUNCATION_MARKER))
}

/// Where to cut `s` so that the cut text plus ` <TRUNCATED>` fits in the limit.
fn cut_point(s: &str) -> usize {
    let mut end = MAX_TEXT_BYTES - TRUNCATION_MARKER.len() - 1;
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    if let Some(ws) = s[..end].rfind(char::is_whitespace) {
        if end - ws <= 4096 {
            end = ws;
        }
    }
    end
}

fn cap_output(out: String) -> String {
    if out.len() <= MAX_TEXT_BYTES {
        return out;
    }
    let body = out
        .strip_suffix(TRUNCATION_MARKER)
        .map(str::trim_end)
        .unwrap_or(&out);
    if body.len() + TRUNCATION_MARKER.len() < MAX_TEXT_BYTES {
        return format!("{body} {TRUNCATION_MARKER}");
    }
    format!("{} {}", &body[..cut_point(body)], TRUNCATION_MARKER)
}

// ---------------------------------------------------------------------------------------
// Byte helpers. Every scanner works on the UTF-8 bytes and only classifies ASCII; spans
// start and end next to ASCII bytes (or at text ends), so they are char boundaries.

#[inline]
fn alnum(c: u8) -> bool {
    c.is_ascii_alphanumeric()
}

#[inline]
fn word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

#[inline]
fn at(b: &[u8], i: usize) -> u8 {
    b.get(i).copied().unwrap_or(0)
}

#[inline]
fn before(b: &[u8], i: usize) -> u8 {
    if i == 0 {
        0
    } else {
        b[i - 1]
    }
}

fn run_end(b: &[u8], mut i: usize, pred: impl Fn(u8) -> bool) -> usize {
    while i < b.len() && pred(b[i]) {
        i += 1;
    }
    i
}

fn starts_with_at(b: &[u8], i: usize, p: &[u8]) -> bool {
    b.len() >= i + p.len() && &b[i..i + p.len()] == p
}

/// The largest char boundary of `s` not after `i`.
fn floor_boundary(s: &str, mut i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[derive(Clone, Copy, Debug)]
struct Span {
    start: usize,
    end: usize,
    kind: Redaction,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyClass {
    Secret,
    Project,
}

const SECRET_SUFFIXES: &[&str] = &[
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "apikey",
    "accesskey",
    "accesskeyid",
    "secretkey",
    "privatekey",
    "signingkey",
    "encryptionkey",
    "masterkey",
    "accountkey",
    "licensekey",
    "subscriptionkey",
    "credential",
    "credentials",
    "connectionstring",
    "sessionid",
    "sessioncookie",
];

const SECRET_EXACT: &[&str] = &["pass", "sig", "pw", "dbpwd", "auth"];

const PROJECT_KEYS: &[&str] = &[
    "project",
    "projectid",
    "googlecloudproject",
    "gcloudproject",
    "cloudsdkcoreproject",
    "gcpproject",
    "gcpprojectid",
    "gcloudprojectid",
];

/// Whether a key names a secret or a project: lowercased with `-`, `_`, `.` removed.
fn key_class(key: &str) -> Option<KeyClass> {
    if key.len() > 64 {
        return None;
    }
    let norm: String = key
        .bytes()
        .filter(|c| !matches!(c, b'-' | b'_' | b'.' | b' '))
        .map(|c| c.to_ascii_lowercase() as char)
        .collect();
    if norm.is_empty() {
        return None;
    }
    if PROJECT_KEYS.contains(&norm.as_str()) {
        return Some(KeyClass::Project);
    }
    if SECRET_EXACT.contains(&norm.as_str()) || SECRET_SUFFIXES.iter().any(|s| norm.ends_with(s)) {
        return Some(KeyClass::Secret);
    }
    None
}

/// Words that follow `token:` or `--project` in prose rather than a value.
const STOPWORDS: &[&str] = &[
    "a",
    "an",
    "and",
    "are",
    "argument",
    "as",
    "at",
    "by",
    "empty",
    "env",
    "expired",
    "false",
    "field",
    "flag",
    "flags",
    "for",
    "from",
    "header",
    "id",
    "if",
    "in",
    "incorrect",
    "invalid",
    "is",
    "it",
    "missing",
    "must",
    "name",
    "needed",
    "nil",
    "none",
    "not",
    "null",
    "of",
    "on",
    "option",
    "or",
    "parameter",
    "provided",
    "required",
    "rejected",
    "set",
    "should",
    "that",
    "the",
    "this",
    "to",
    "true",
    "unset",
    "value",
    "variable",
    "was",
    "were",
    "when",
    "with",
    "wrong",
];

fn is_stopword(v: &str) -> bool {
    v.len() <= 10 && STOPWORDS.iter().any(|w| w.eq_ignore_ascii_case(v))
}

/// `$VAR` / `${VAR}` (upper-case environment reference) or a template.
fn is_reference(v: &str) -> bool {
    if v.starts_with("{{") || v.starts_with('<') || v.chars().all(|c| c == '*') {
        return true;
    }
    let Some(r) = v.strip_prefix('$') else {
        return false;
    };
    let r = r
        .strip_prefix('{')
        .map(|x| x.strip_suffix('}').unwrap_or(x))
        .unwrap_or(r);
    !r.is_empty()
        && r.bytes()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_')
}

/// A project id candidate (lowercased) if `v` looks like one.
fn project_like(v: &str) -> Option<String> {
    let v = v.trim();
    if v.len() < 3 || v.len() > 100 || is_stopword(v) || is_reference(v) || v.starts_with('-') {
        return None;
    }
    if v.bytes()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b':' | b'_'))
    {
        Some(v.to_ascii_lowercase())
    } else {
        None
    }
}

const WELL_KNOWN_V4: &[&str] = &["0.0.0.0", "127.0.0.1", "255.255.255.255", "169.254.169.254"];

const ZONE_PREFIXES: &[&str] = &[
    "us",
    "europe",
    "asia",
    "australia",
    "northamerica",
    "southamerica",
    "me",
    "africa",
    "eu",
    "ap",
    "sa",
    "ca",
    "af",
    "il",
    "mx",
    "cn",
];

const ZONE_DIRECTIONS: &[&str] = &[
    "central",
    "east",
    "west",
    "north",
    "south",
    "northeast",
    "southeast",
    "northwest",
    "southwest",
];

/// TLDs under which a 3+ label name is taken for a host (file extensions left out).
const TLDS: &[&str] = &[
    "com", "net", "org", "io", "dev", "app", "cloud", "ai", "co", "us", "uk", "de", "fr", "eu",
    "jp", "cn", "in", "ru", "br", "au", "ca", "nl", "se", "ch", "es", "it", "info", "biz", "me",
    "tv", "xyz", "tech", "site", "online", "gov", "edu", "mil", "int", "gg", "ly", "nz", "za",
    "kr", "tw", "hk", "sg", "ie", "be", "at", "dk", "no", "fi", "cz", "pt", "gr", "ro", "hu", "il",
    "mx", "ar", "cl", "systems", "services", "network", "company", "team", "tools", "run", "page",
    "host", "link",
];

const INTERNAL_SUFFIXES: &[&str] = &[
    "internal",
    "local",
    "corp",
    "lan",
    "localdomain",
    "intranet",
    "intra",
    "svc",
    "home.arpa",
    "private",
];

/// Public documentation and service domains kept as they are (and their subdomains).
const PUBLIC_DOMAINS: &[&str] = &[
    "googleapis.com",
    "google.com",
    "gstatic.com",
    "kubernetes.io",
    "k8s.io",
    "github.com",
    "githubusercontent.com",
    "gitlab.com",
    "docker.com",
    "docker.io",
    "gcr.io",
    "pkg.dev",
    "quay.io",
    "aws.amazon.com",
    "amazon.com",
    "microsoft.com",
    "azure.com",
    "stackoverflow.com",
    "python.org",
    "pypi.org",
    "rust-lang.org",
    "crates.io",
    "npmjs.com",
    "npmjs.org",
    "mozilla.org",
    "wikipedia.org",
    "readthedocs.io",
    "readthedocs.org",
    "grafana.com",
    "prometheus.io",
    "hashicorp.com",
    "terraform.io",
    "istio.io",
    "elastic.co",
    "postgresql.org",
    "mysql.com",
    "redis.io",
    "nginx.org",
    "nginx.com",
    "apache.org",
    "golang.org",
    "go.dev",
    "cncf.io",
    "ubuntu.com",
    "debian.org",
    "redhat.com",
    "anthropic.com",
    "openai.com",
    "slack.com",
    "atlassian.com",
    "pagerduty.com",
    "datadoghq.com",
    "sentry.io",
    "cloudflare.com",
    "letsencrypt.org",
    "ietf.org",
    "w3.org",
    "opentelemetry.io",
    "envoyproxy.io",
    "argoproj.io",
    "linkerd.io",
    "cert-manager.io",
    "example.com",
    "example.org",
    "example.net",
    "x-k8s.io",
    "gke.io",
    "openshift.io",
    "knative.dev",
    "crossplane.io",
    "fluxcd.io",
    "cilium.io",
    "tekton.dev",
    "googlesource.com",
    "vaultproject.io",
    "consul.io",
    "gserviceaccount.com",
];

/// Token prefixes: (prefix, minimum body length, exact body length, body byte class).
struct Prefix {
    prefix: &'static [u8],
    min_body: usize,
    exact: bool,
    class: fn(u8) -> bool,
    /// Body must contain a digit or an upper-case letter (keeps `sk-learn-style-words`).
    mixed: bool,
}

fn c_alnum(c: u8) -> bool {
    c.is_ascii_alphanumeric()
}
fn c_alnum_us(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}
fn c_b64url(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
}
fn c_b64url_dot(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b'=')
}
fn c_upper_digit(c: u8) -> bool {
    c.is_ascii_uppercase() || c.is_ascii_digit()
}

const PREFIXES: &[Prefix] = &[
    Prefix {
        prefix: b"ghp_",
        min_body: 20,
        exact: false,
        class: c_alnum,
        mixed: false,
    },
    Prefix {
        prefix: b"gho_",
        min_body: 20,
        exact: false,
        class: c_alnum,
        mixed: false,
    },
    Prefix {
        prefix: b"ghs_",
        min_body: 20,
        exact: false,
        class: c_alnum,
        mixed: false,
    },
    Prefix {
        prefix: b"ghu_",
        min_body: 20,
        exact: false,
        class: c_alnum,
        mixed: false,
    },
    Prefix {
        prefix: b"ghr_",
        min_body: 20,
        exact: false,
        class: c_alnum,
        mixed: false,
    },
    Prefix {
        prefix: b"github_pat_",
        min_body: 20,
        exact: false,
        class: c_alnum_us,
        mixed: false,
    },
    Prefix {
        prefix: b"glpat-",
        min_body: 16,
        exact: false,
        class: c_b64url,
        mixed: false,
    },
    Prefix {
        prefix: b"xoxb-",
        min_body: 10,
        exact: false,
        class: c_b64url,
        mixed: false,
    },
    Prefix {
        prefix: b"xoxp-",
        min_body: 10,
        exact: false,
        class: c_b64url,
        mixed: false,
    },
    Prefix {
        prefix: b"xoxa-",
        min_body: 10,
        exact: false,
        class: c_b64url,
        mixed: false,
    },
    Prefix {
        prefix: b"xoxr-",
        min_body: 10,
        exact: false,
        class: c_b64url,
        mixed: false,
    },
    Prefix {
        prefix: b"xoxs-",
        min_body: 10,
        exact: false,
        class: c_b64url,
        mixed: false,
    },
    Prefix {
        prefix: b"xapp-",
        min_body: 10,
        exact: false,
        class: c_b64url,
        mixed: false,
    },
    Prefix {
        prefix: b"sk_live_",
        min_body: 16,
        exact: false,
        class: c_alnum_us,
        mixed: false,
    },
    Prefix {
        prefix: b"sk_test_",
        min_body: 16,
        exact: false,
        class: c_alnum_us,
        mixed: false,
    },
    Prefix {
        prefix: b"rk_live_",
        min_body: 16,
        exact: false,
        class: c_alnum_us,
        mixed: false,
    },
    Prefix {
        prefix: b"sk-",
        min_body: 20,
        exact: false,
        class: c_b64url,
        mixed: true,
    },
    Prefix {
        prefix: b"AIza",
        min_body: 30,
        exact: false,
        class: c_b64url,
        mixed: false,
    },
    Prefix {
        prefix: b"ya29.",
        min_body: 20,
        exact: false,
        class: c_b64url_dot,
        mixed: false,
    },
    Prefix {
        prefix: b"eyJ",
        min_body: 17,
        exact: false,
        class: c_b64url_dot,
        mixed: false,
    },
    Prefix {
        prefix: b"npm_",
        min_body: 30,
        exact: false,
        class: c_alnum,
        mixed: false,
    },
    Prefix {
        prefix: b"hf_",
        min_body: 30,
        exact: false,
        class: c_alnum,
        mixed: false,
    },
    Prefix {
        prefix: b"AKIA",
        min_body: 16,
        exact: true,
        class: c_upper_digit,
        mixed: false,
    },
    Prefix {
        prefix: b"ASIA",
        min_body: 16,
        exact: true,
        class: c_upper_digit,
        mixed: false,
    },
    Prefix {
        prefix: b"AGPA",
        min_body: 16,
        exact: true,
        class: c_upper_digit,
        mixed: false,
    },
    Prefix {
        prefix: b"AIDA",
        min_body: 16,
        exact: true,
        class: c_upper_digit,
        mixed: false,
    },
    Prefix {
        prefix: b"AROA",
        min_body: 16,
        exact: true,
        class: c_upper_digit,
        mixed: false,
    },
    Prefix {
        prefix: b"ANPA",
        min_body: 16,
        exact: true,
        class: c_upper_digit,
        mixed: false,
    },
    Prefix {
        prefix: b"ANVA",
        min_body: 16,
        exact: true,
        class: c_upper_digit,
        mixed: false,
    },
    Prefix {
        prefix: b"AIPA",
        min_body: 16,
        exact: true,
        class: c_upper_digit,
        mixed: false,
    },
];

// ---------------------------------------------------------------------------------------

struct Scanner<'a> {
    s: &'a str,
    b: &'a [u8],
    lower: String,
    spans: Vec<Span>,
    /// Project ids found by structure (lowercased), redacted elsewhere too.
    detected: Vec<String>,
    /// `@` positions that end URL userinfo (not e-mail addresses).
    url_ats: Vec<usize>,
    /// Existing placeholders: never redacted again.
    protected: Vec<(usize, usize)>,
}

impl<'a> Scanner<'a> {
    fn new(s: &'a str) -> Scanner<'a> {
        Scanner {
            s,
            b: s.as_bytes(),
            lower: s.to_ascii_lowercase(),
            spans: Vec::new(),
            detected: Vec::new(),
            url_ats: Vec::new(),
            protected: Vec::new(),
        }
    }

    fn push(&mut self, start: usize, end: usize, kind: Redaction) {
        if start < end {
            self.spans.push(Span { start, end, kind });
        }
    }

    /// Every shape-based detector (all but the context's whole-token needles).
    fn structural(&mut self) {
        self.placeholders();
        self.pem();
        self.url_credentials();
        self.emails();
        self.ipv4();
        self.ipv6();
        self.uuids();
        self.zones();
        self.prefixed_tokens();
        self.entropy();
        self.hosts();
        self.arns();
        self.gke();
        self.home_paths();
        self.key_values();
        self.auth_headers();
        self.project_paths();
    }

    fn placeholders(&mut self) {
        let b = self.b;
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'<' {
                let e = run_end(b, i + 1, |c| c.is_ascii_uppercase() || c == b'_');
                if at(b, e) == b'>'
                    && e - i - 1 <= 12
                    && PLACEHOLDER_NAMES.contains(&&self.s[i + 1..e])
                {
                    self.protected.push((i, e + 1));
                    i = e + 1;
                    continue;
                }
            }
            i += 1;
        }
    }

    fn pem(&mut self) {
        let s = self.s;
        let mut from = 0;
        while let Some(k) = s[from..].find("-----BEGIN ") {
            let start = from + k;
            let hdr = start + 11;
            let Some(h) = s[hdr..].find("-----") else {
                break;
            };
            let hdr_end = hdr + h;
            if h <= 64 && s[hdr..hdr_end].contains("PRIVATE KEY") {
                let body = hdr_end + 5;
                let end = match s[body..].find("-----END ") {
                    Some(e) => {
                        let e = body + e + 9;
                        match s[e..].find("-----") {
                            Some(f) if f <= 64 => e + f + 5,
                            _ => s.len(),
                        }
                    }
                    None => s.len(),
                };
                self.push(start, end, Redaction::Token);
                from = end;
            } else {
                from = hdr_end + 5;
            }
        }
    }

    fn url_credentials(&mut self) {
        let b = self.b;
        let mut from = 0;
        while let Some(k) = self.s[from..].find("://") {
            let p = from + k;
            from = p + 3;
            if !before(b, p).is_ascii_alphabetic() {
                continue;
            }
            let u = p + 3;
            let mut j = u;
            while j < b.len()
                && j - u < 256
                && !b[j].is_ascii_whitespace()
                && !matches!(b[j], b'/' | b'?' | b'#' | b'@' | b'"' | b'\'' | b'<' | b'>')
            {
                j += 1;
            }
            if at(b, j) == b'@' && j > u {
                let kind = if b[u..j].contains(&b':') {
                    Redaction::Token
                } else {
                    Redaction::User
                };
                self.push(u, j, kind);
                self.url_ats.push(j);
                from = j + 1;
            }
        }
    }

    fn emails(&mut self) {
        let b = self.b;
        let local =
            |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'%' | b'+' | b'-');
        let mut left_limit = 0;
        for i in 0..b.len() {
            if b[i] != b'@' {
                continue;
            }
            let floor = left_limit;
            left_limit = i + 1;
            if self.url_ats.binary_search(&i).is_ok() {
                continue;
            }
            let mut l = i;
            while l > floor && local(b[l - 1]) {
                l -= 1;
            }
            while l < i && b[l] == b'.' {
                l += 1;
            }
            if l == i || &self.lower[l..i] == "git" {
                continue;
            }
            // domain: labels of [A-Za-z0-9-] separated by single dots
            let mut e = i + 1;
            let mut labels = 0;
            let mut last_start = e;
            loop {
                let st = e;
                e = run_end(b, e, |c| c.is_ascii_alphanumeric() || c == b'-');
                if e == st {
                    e = st.saturating_sub(1).max(i + 1);
                    break;
                }
                labels += 1;
                last_start = st;
                if at(b, e) == b'.' && alnum(at(b, e + 1)) {
                    e += 1;
                } else {
                    break;
                }
            }
            let tld = &b[last_start..e];
            if labels >= 2 && tld.len() >= 2 && tld.iter().all(|c| c.is_ascii_alphabetic()) {
                self.push(l, e, Redaction::Email);
                // `sa@<project>.iam.gserviceaccount.com` names the project
                if let Some(proj) = self.lower[i + 1..e].strip_suffix(".iam.gserviceaccount.com") {
                    if let Some(id) = project_like(proj) {
                        push_unique(&mut self.detected, id);
                    }
                }
            }
        }
    }

    fn ipv4(&mut self) {
        let b = self.b;
        let mut i = 0;
        while i < b.len() {
            if b[i].is_ascii_digit() && !(word(before(b, i)) || before(b, i) == b'.') {
                if let Some(mut end) = ipv4_at(b, i) {
                    let nx = at(b, end);
                    if !(word(nx) || (nx == b'.' && alnum(at(b, end + 1)))) {
                        let quad_end = end;
                        if nx == b':' {
                            let p = run_end(b, end + 1, |c| c.is_ascii_digit());
                            if p > end + 1 && p - end - 1 <= 5 && !word(at(b, p)) {
                                end = p;
                            }
                        } else if nx == b'/' {
                            let p = run_end(b, end + 1, |c| c.is_ascii_digit());
                            if p > end + 1 && p - end - 1 <= 2 && !word(at(b, p)) {
                                end = p;
                            }
                        }
                        if !WELL_KNOWN_V4.contains(&&self.s[i..quad_end]) {
                            self.push(i, end, Redaction::Ip);
                        }
                        i = end;
                        continue;
                    }
                }
            }
            i += 1;
        }
    }

    fn ipv6(&mut self) {
        let b = self.b;
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            let pv = before(b, i);
            if (c.is_ascii_hexdigit() || (c == b':' && at(b, i + 1) == b':'))
                && !(word(pv) || pv == b':' || pv == b'.')
            {
                if let Some(mut end) = ipv6_at(b, i) {
                    if !word(at(b, end)) {
                        if at(b, end) == b'%' {
                            let z = run_end(b, end + 1, |c| c.is_ascii_alphanumeric());
                            if z > end + 1 && z - end <= 17 {
                                end = z;
                            }
                        } else if at(b, end) == b'/' {
                            let p = run_end(b, end + 1, |c| c.is_ascii_digit());
                            if p > end + 1 && p - end - 1 <= 3 && !word(at(b, p)) {
                                end = p;
                            }
                        }
                        if &self.s[i..end] != "::1" {
                            self.push(i, end, Redaction::Ip);
                        }
                        i = end;
                        continue;
                    }
                }
            }
            i += 1;
        }
    }

    fn uuids(&mut self) {
        let b = self.b;
        let mut i = 0;
        while i + 36 <= b.len() {
            if b[i].is_ascii_hexdigit()
                && !alnum(before(b, i))
                && uuid_at(b, i)
                && !alnum(at(b, i + 36))
            {
                self.push(i, i + 36, Redaction::Id);
                i += 36;
                continue;
            }
            i += 1;
        }
    }

    fn zones(&mut self) {
        let b = self.b;
        let mut i = 0;
        while i < b.len() {
            if b[i].is_ascii_lowercase() && !alnum(before(b, i)) {
                let w1 = run_end(b, i, |c| c.is_ascii_lowercase());
                if let Some(end) = zone_at(b, i, w1) {
                    self.push(i, end, Redaction::Zone);
                    i = end;
                    continue;
                }
                i = w1;
                continue;
            }
            i += 1;
        }
    }

    fn prefixed_tokens(&mut self) {
        let b = self.b;
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            let pv = before(b, i);
            if !matches!(
                c,
                b'g' | b'x' | b's' | b'r' | b'A' | b'y' | b'e' | b'n' | b'h'
            ) || alnum(pv)
                || pv == b'_'
                || pv == b'-'
            {
                i += 1;
                continue;
            }
            let mut matched = false;
            for p in PREFIXES {
                if !starts_with_at(b, i, p.prefix) {
                    continue;
                }
                let bs = i + p.prefix.len();
                let be = run_end(b, bs, p.class);
                let mut be2 = be;
                if matches!(p.prefix, b"eyJ" | b"ya29.") {
                    while be2 > bs && matches!(b[be2 - 1], b'.') {
                        be2 -= 1;
                    }
                }
                let n = be2 - bs;
                let ok = if p.exact {
                    n == p.min_body && !alnum(at(b, be2))
                } else {
                    n >= p.min_body
                        && (!p.mixed
                            || b[bs..be2]
                                .iter()
                                .any(|c| c.is_ascii_digit() || c.is_ascii_uppercase()))
                };
                if ok {
                    self.push(i, be2, Redaction::Token);
                    i = be2;
                    matched = true;
                    break;
                }
            }
            if !matched {
                // skip the rest of this token-like run: linear time
                let e = run_end(b, i, c_b64url);
                i = e.max(i + 1);
            }
        }
    }

    fn entropy(&mut self) {
        let b = self.b;
        let tok = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'_' | b'-');
        let mut i = 0;
        while i < b.len() {
            if !tok(b[i]) {
                i += 1;
                continue;
            }
            let mut e = run_end(b, i, tok);
            let run_e = e;
            while e < b.len() && b[e] == b'=' && e - run_e < 2 {
                e += 1;
            }
            if e - i >= 24 {
                let run = &b[i..e];
                let mut hit = false;
                if run.contains(&b'+') && random_piece(run) {
                    self.push(i, e, Redaction::Token);
                    hit = true;
                } else {
                    let mut ps = i;
                    for (k, &c) in run
                        .iter()
                        .enumerate()
                        .chain(std::iter::once((run.len(), &b'/')))
                    {
                        if c == b'/' {
                            let pe = i + k;
                            if pe > ps && random_piece(&b[ps..pe]) {
                                self.push(ps, pe, Redaction::Token);
                                hit = true;
                            }
                            ps = pe + 1;
                        }
                    }
                }
                if !hit && base64_with_slashes(run) {
                    self.push(i, e, Redaction::Token);
                }
            }
            i = e.max(i + 1);
        }
    }

    fn hosts(&mut self) {
        let b = self.b;
        let hc = |c: u8| c.is_ascii_alphanumeric() || c == b'.' || c == b'-';
        let mut i = 0;
        while i < b.len() {
            if !hc(b[i]) {
                i += 1;
                continue;
            }
            let e = run_end(b, i, hc);
            let (st, en) = (i, e);
            i = e;
            if before(b, st) == b'_' || at(b, en) == b'_' {
                continue;
            }
            let mut s0 = st;
            let mut e0 = en;
            while s0 < e0 && matches!(b[s0], b'.' | b'-') {
                s0 += 1;
            }
            while e0 > s0 && matches!(b[e0 - 1], b'.' | b'-') {
                e0 -= 1;
            }
            if e0 - s0 < 4 || e0 - s0 > 253 {
                continue;
            }
            let name = &self.lower[s0..e0];
            if is_host(name) {
                self.push(s0, e0, Redaction::Host);
            }
        }
    }

    fn arns(&mut self) {
        let b = self.b;
        let mut from = 0;
        while let Some(k) = self.s[from..].find("arn:") {
            let i = from + k;
            from = i + 4;
            if alnum(before(b, i)) {
                continue;
            }
            let r = &self.s[i + 4..];
            if !(r.starts_with("aws:") || r.starts_with("aws-cn:") || r.starts_with("aws-us-gov:"))
            {
                continue;
            }
            let mut e = i;
            while e < b.len()
                && e - i < 2048
                && b[e].is_ascii()
                && !b[e].is_ascii_whitespace()
                && !matches!(
                    b[e],
                    b'"' | b'\'' | b'`' | b',' | b';' | b')' | b']' | b'}' | b'<' | b'>'
                )
            {
                e += 1;
            }
            while e > i && b[e - 1] == b'.' {
                e -= 1;
            }
            self.push(i, e, Redaction::Arn);
            from = e.max(from);
        }
    }

    fn gke(&mut self) {
        let b = self.b;
        let mut i = 0;
        while i + 4 < b.len() {
            if b[i] == b'g' && !(word(before(b, i)) || before(b, i) == b'-' || before(b, i) == b'.')
            {
                if starts_with_at(b, i, b"gke_") {
                    let e = run_end(b, i, |c| {
                        c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
                    });
                    let parts: Vec<&str> = self.s[i..e].split('_').collect();
                    if parts.len() >= 4 && parts.iter().all(|p| !p.is_empty()) {
                        self.push(i, e, Redaction::GkeContext);
                        if let Some(id) = project_like(parts[1]) {
                            push_unique(&mut self.detected, id);
                        }
                    }
                    i = e;
                    continue;
                }
                if starts_with_at(b, i, b"gke-") {
                    let e = run_end(b, i, |c| {
                        c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'
                    });
                    let name = &self.s[i..e];
                    let parts: Vec<&str> = name.split('-').collect();
                    let n = parts.len();
                    if n >= 4 && !word(at(b, e)) && parts.iter().all(|p| !p.is_empty()) {
                        let last = parts[n - 1];
                        let digit = |p: &str| p.bytes().any(|c| c.is_ascii_digit());
                        if (4..=8).contains(&last.len()) && (digit(last) || digit(parts[n - 2])) {
                            self.push(i, e, Redaction::Node);
                        }
                    }
                    i = e;
                    continue;
                }
            }
            i += 1;
        }
    }

    fn home_paths(&mut self) {
        let b = self.b;
        for pat in ["/home/", "/Users/", "\\Users\\"] {
            let mut from = 0;
            while let Some(k) = self.s[from..].find(pat) {
                let st = from + k + pat.len();
                from = st;
                if at(b, st) == b'<' {
                    continue;
                }
                let e = run_end(b, st, |c| {
                    !(c.is_ascii_whitespace()
                        || matches!(
                            c,
                            b'/' | b'\\'
                                | b'"'
                                | b'\''
                                | b'`'
                                | b':'
                                | b','
                                | b';'
                                | b')'
                                | b']'
                                | b'}'
                                | b'<'
                                | b'>'
                        ))
                });
                let e = floor_boundary(self.s, e.min(st + 64));
                if e > st {
                    self.push(st, e, Redaction::HomePath);
                }
                from = e.max(st);
            }
        }
    }

    /// `key=value`, `key: value`, `"key": "value"`, `--key value` for secret and project keys.
    fn key_values(&mut self) {
        let b = self.b;
        let kc = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.');
        let mut i = 0;
        while i < b.len() {
            if !kc(b[i]) {
                i += 1;
                continue;
            }
            let ks = i;
            let ke = run_end(b, i, kc);
            i = ke;
            if ke - ks > 64 {
                continue;
            }
            let key = &self.s[ks..ke];
            let Some(class) = key_class(key) else {
                continue;
            };
            let flag = key.starts_with('-');
            let after_set = ks >= 4 && b[ks - 4..ks].eq_ignore_ascii_case(b"set ");
            // separator
            let mut p = ke;
            if matches!(at(b, p), b'"' | b'\'') {
                p += 1;
            }
            let sp0 = p;
            while matches!(at(b, p), b' ' | b'\t') && p - sp0 < 4 {
                p += 1;
            }
            let sep = match at(b, p) {
                b'=' if !matches!(at(b, p + 1), b'=' | b'>') => {
                    p += 1;
                    b'='
                }
                b':' if at(b, p + 1) != b':' && !(at(b, p + 1) == b'/' && at(b, p + 2) == b'/') => {
                    p += 1;
                    b':'
                }
                _ if p > sp0
                    && (flag || (after_set && class == KeyClass::Project))
                    && sp0 == ke =>
                {
                    b' '
                }
                _ => continue,
            };
            let sp1 = p;
            while matches!(at(b, p), b' ' | b'\t') && p - sp1 < 4 {
                p += 1;
            }
            let (vs, ve, quoted) = match at(b, p) {
                q @ (b'"' | b'\'') => {
                    let vs = p + 1;
                    let mut e = vs;
                    while e < b.len() && b[e] != q && b[e] != b'\n' && e - vs < 4096 {
                        if b[e] == b'\\' {
                            e += 1;
                        }
                        e += 1;
                    }
                    (vs, floor_boundary(self.s, e.min(b.len())), true)
                }
                _ => {
                    let proj = class == KeyClass::Project;
                    let e = run_end(b, p, |c| {
                        !(c.is_ascii_whitespace()
                            || matches!(
                                c,
                                b'"' | b'\''
                                    | b'`'
                                    | b','
                                    | b';'
                                    | b'&'
                                    | b')'
                                    | b']'
                                    | b'}'
                                    | b'<'
                                    | b'>'
                            )
                            || (proj && c == b'/'))
                    });
                    let mut e = floor_boundary(self.s, e.min(p + 4096));
                    while e > p && b[e - 1] == b'.' && !alnum(at(b, e)) {
                        e -= 1;
                    }
                    (p, e, false)
                }
            };
            if ve <= vs {
                continue;
            }
            let v = &self.s[vs..ve];
            if is_reference(v) || v.starts_with('-') && sep == b' ' {
                continue;
            }
            if !quoted && sep != b'=' && is_stopword(v) {
                continue;
            }
            match class {
                KeyClass::Secret => self.push(vs, ve, Redaction::Token),
                KeyClass::Project => {
                    if let Some(id) = project_like(v) {
                        self.push(vs, ve, Redaction::ProjectId);
                        push_unique(&mut self.detected, id);
                    }
                }
            }
            i = ve.max(i);
        }
    }

    /// `Bearer x`, `Authorization: <scheme> x`, `Cookie: ...`.
    fn auth_headers(&mut self) {
        let b = self.b;
        let vc = |c: u8| {
            c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'~' | b'+' | b'/' | b'=' | b'-')
        };
        let mut i = 0;
        while i < b.len() {
            if !b[i].is_ascii_alphabetic() {
                i += 1;
                continue;
            }
            let ws = i;
            let we = run_end(b, i, |c| c.is_ascii_alphabetic());
            i = we;
            if alnum(before(b, ws)) || at(b, we).is_ascii_digit() {
                continue;
            }
            let w = &self.lower[ws..we];
            if w == "bearer" {
                let p = run_end(b, we, |c| c == b' ');
                if p == we || p - we > 4 {
                    continue;
                }
                let e = run_end(b, p, vc);
                let v = &self.s[p..e];
                if e - p >= 8 && !v.bytes().all(|c| c.is_ascii_lowercase()) {
                    self.push(p, e, Redaction::Token);
                    i = e;
                }
            } else if w == "authorization" || w == "cookie" {
                let q = match before(b, ws) {
                    c @ (b'"' | b'\'') => c,
                    _ => 0,
                };
                let mut p = we;
                if matches!(at(b, p), b'"' | b'\'') {
                    p += 1;
                }
                if !matches!(at(b, p), b':' | b'=') {
                    continue;
                }
                p = run_end(b, p + 1, |c| c == b' ' || c == b'"' || c == b'\'');
                let vs = p;
                if vs >= b.len() || at(b, vs) == b'<' {
                    continue;
                }
                let piece_end = |from: usize| {
                    run_end(b, from, |c| {
                        !(c.is_ascii_whitespace() || matches!(c, b'"' | b'\'' | b'`'))
                    })
                };
                let mut e = piece_end(vs);
                if w == "authorization" {
                    // optional scheme word, then the credential or a parameter list
                    let first = &self.lower[vs..e];
                    let scheme = matches!(
                        first,
                        "bearer"
                            | "basic"
                            | "token"
                            | "digest"
                            | "negotiate"
                            | "apikey"
                            | "bot"
                            | "ntlm"
                            | "aws4-hmac-sha256"
                    );
                    let p2 = run_end(b, e, |c| c == b' ');
                    let e2 = piece_end(p2);
                    if scheme && p2 > e && e2 > p2 {
                        let piece = &self.s[p2..e2];
                        if piece.trim_end_matches('=').contains('=')
                            || (piece.ends_with('=') && at(b, e2) == b'"')
                        {
                            // parameters (Digest, AWS4): up to the opening quote or line end
                            let mut k = p2;
                            while k < b.len() && b[k] != b'\n' && (q == 0 || b[k] != q) {
                                if b[k] == b'\\' {
                                    k += 1;
                                }
                                k += 1;
                            }
                            e = k.min(b.len());
                        } else {
                            e = e2;
                        }
                    }
                } else {
                    // cookie list: name=value; name=value
                    while self.s[vs..e].ends_with(';') {
                        let p2 = run_end(b, e, |c| c == b' ');
                        let e2 = piece_end(p2);
                        if e2 == p2 || !self.s[p2..e2].contains('=') {
                            break;
                        }
                        e = e2;
                    }
                }
                let e = floor_boundary(self.s, e.min(vs + 4096));
                let v = &self.s[vs..e];
                if e > vs && !is_stopword(v.trim_end_matches(['.', ','])) {
                    self.push(vs, e, Redaction::Token);
                    i = e;
                }
            }
        }
    }

    fn project_paths(&mut self) {
        let b = self.b;
        let mut from = 0;
        while let Some(k) = self.lower[from..].find("projects/") {
            let i = from + k;
            from = i + 9;
            if word(before(b, i)) {
                continue;
            }
            let st = i + 9;
            let e = run_end(b, st, |c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'
            });
            if e - st < 2 || word(at(b, e)) || at(b, e) == b'.' && alnum(at(b, e + 1)) {
                continue;
            }
            let v = &self.s[st..e];
            if let Some(id) = project_like(v) {
                self.push(st, e, Redaction::ProjectId);
                push_unique(&mut self.detected, id);
            }
            from = e;
        }
    }

    /// The context's identifiers and the detected project ids, whole-token.
    fn needles(&mut self, needles: &[(String, Redaction)]) {
        let b = self.b;
        let mut found = Vec::new();
        for (n, kind) in needles {
            for (k, _) in self.lower.match_indices(n.as_str()) {
                let e = k + n.len();
                let edge_ok = |x: u8, y: u8| !(alnum(x) && alnum(y));
                let first = n.as_bytes()[0];
                let last = n.as_bytes()[n.len() - 1];
                if edge_ok(before(b, k), first) && edge_ok(at(b, e), last) {
                    found.push(Span {
                        start: k,
                        end: e,
                        kind: *kind,
                    });
                }
            }
        }
        self.spans.extend(found);
    }

    fn inside_placeholder(&self, sp: &Span) -> bool {
        let idx = self.protected.partition_point(|p| p.0 <= sp.start);
        idx > 0 && sp.end <= self.protected[idx - 1].1
    }

    fn rebuild(mut self) -> (String, Vec<Redaction>) {
        let mut spans: Vec<Span> = std::mem::take(&mut self.spans)
            .into_iter()
            .filter(|sp| !self.inside_placeholder(sp))
            .collect();
        spans.sort_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
        let mut out = String::with_capacity(self.s.len());
        let mut kinds = Vec::new();
        let mut pos = 0;
        let mut k = 0;
        while k < spans.len() {
            let start = spans[k].start;
            let mut end = spans[k].end;
            let mut best = spans[k];
            k += 1;
            while k < spans.len() && spans[k].start < end {
                let c = spans[k];
                let (cl, bl) = (c.end - c.start, best.end - best.start);
                if cl > bl || (cl == bl && c.kind.priority() > best.kind.priority()) {
                    best = c;
                }
                end = end.max(c.end);
                k += 1;
            }
            out.push_str(&self.s[pos..start]);
            out.push_str(best.kind.placeholder());
            kinds.push(best.kind);
            pos = end;
        }
        out.push_str(&self.s[pos..]);
        (out, kinds)
    }
}

fn ipv4_at(b: &[u8], i: usize) -> Option<usize> {
    let mut p = i;
    for k in 0..4 {
        let st = p;
        let mut v: u32 = 0;
        while p < b.len() && p - st < 3 && b[p].is_ascii_digit() {
            v = v * 10 + u32::from(b[p] - b'0');
            p += 1;
        }
        if p == st || v > 255 || at(b, p).is_ascii_digit() {
            return None;
        }
        if k < 3 {
            if at(b, p) != b'.' {
                return None;
            }
            p += 1;
        }
    }
    Some(p)
}

fn ipv6_at(b: &[u8], i: usize) -> Option<usize> {
    let mut p = i;
    let mut groups = 0;
    let mut dbl = false;
    let mut digit = false;
    loop {
        if at(b, p) == b':' && at(b, p + 1) == b':' {
            if dbl {
                break;
            }
            dbl = true;
            p += 2;
            if !at(b, p).is_ascii_hexdigit() {
                break;
            }
            continue;
        }
        let st = p;
        while p - st < 4 && at(b, p).is_ascii_hexdigit() {
            p += 1;
        }
        if p == st {
            break;
        }
        if at(b, p).is_ascii_hexdigit() {
            return None;
        }
        if at(b, p) == b'.' {
            let e = ipv4_at(b, st)?;
            groups += 2;
            p = e;
            digit = true;
            break;
        }
        if b[st..p].iter().any(u8::is_ascii_digit) {
            digit = true;
        }
        groups += 1;
        if groups > 8 {
            return None;
        }
        if at(b, p) == b':' && at(b, p + 1) != b':' && at(b, p + 1).is_ascii_hexdigit() {
            p += 1;
            continue;
        }
        if at(b, p) == b':' && at(b, p + 1) == b':' {
            continue;
        }
        break;
    }
    let ok = if dbl {
        (1..=7).contains(&groups)
    } else {
        groups == 8
    };
    (ok && digit).then_some(p)
}

fn uuid_at(b: &[u8], i: usize) -> bool {
    let mut p = i;
    for (k, n) in [8usize, 4, 4, 4, 12].iter().enumerate() {
        if !b[p..p + n].iter().all(u8::is_ascii_hexdigit) {
            return false;
        }
        p += n;
        if k < 4 {
            if b[p] != b'-' {
                return false;
            }
            p += 1;
        }
    }
    true
}

/// A GCP (`us-central1`, `us-central1-a`) or AWS (`us-east-1`, `us-east-1a`) region/zone
/// starting at `i`, whose first word ends at `w1`.
fn zone_at(b: &[u8], i: usize, w1: usize) -> Option<usize> {
    let first = std::str::from_utf8(&b[i..w1]).ok()?;
    if !ZONE_PREFIXES.contains(&first) || at(b, w1) != b'-' {
        return None;
    }
    let d0 = w1 + 1;
    let d1 = run_end(b, d0, |c| c.is_ascii_lowercase());
    let dir = std::str::from_utf8(&b[d0..d1]).ok()?;
    if !ZONE_DIRECTIONS.contains(&dir) {
        return None;
    }
    let mut e;
    if at(b, d1).is_ascii_digit() {
        // GCP
        e = run_end(b, d1, |c| c.is_ascii_digit());
        if e - d1 > 2 {
            return None;
        }
        if at(b, e) == b'-' && at(b, e + 1).is_ascii_lowercase() && !alnum(at(b, e + 2)) {
            e += 2;
        }
    } else if at(b, d1) == b'-' && at(b, d1 + 1).is_ascii_digit() {
        // AWS
        e = run_end(b, d1 + 1, |c| c.is_ascii_digit());
        if e - d1 - 1 > 2 {
            return None;
        }
        if at(b, e).is_ascii_lowercase() && !alnum(at(b, e + 1)) {
            e += 1;
        }
    } else {
        return None;
    }
    (!alnum(at(b, e))).then_some(e)
}

fn is_host(name: &str) -> bool {
    let labels: Vec<&str> = name.split('.').collect();
    if labels.len() < 2
        || labels
            .iter()
            .any(|l| l.is_empty() || l.len() > 63 || l.starts_with('-') || l.ends_with('-'))
    {
        return false;
    }
    let tld = labels[labels.len() - 1];
    if !tld.bytes().all(|c| c.is_ascii_lowercase()) {
        return false;
    }
    let under = |suffix: &str| {
        name == suffix
            || (name.len() > suffix.len()
                && name.ends_with(suffix)
                && name.as_bytes()[name.len() - suffix.len() - 1] == b'.')
    };
    if INTERNAL_SUFFIXES.iter().any(|s| under(s)) {
        return !name.starts_with("kubernetes.default.svc");
    }
    if labels.len() < 3 || !TLDS.contains(&tld) || REVERSE_DNS_ROOTS.contains(&labels[0]) {
        return false;
    }
    if under("amazonaws.com") {
        // service endpoints (`eks.amazonaws.com`, `sts.us-east-1.amazonaws.com`) are
        // public; anything naming a bucket, database or account is not
        return !labels[..labels.len() - 2].iter().all(|l| {
            AWS_SERVICES.contains(l)
                || zone_at(
                    l.as_bytes(),
                    0,
                    run_end(l.as_bytes(), 0, |c| c.is_ascii_lowercase()),
                ) == Some(l.len())
        });
    }
    !PUBLIC_DOMAINS.iter().any(|d| under(d))
}

/// First labels of Java/Kotlin package names (`com.google.cloud`), never host names.
const REVERSE_DNS_ROOTS: &[&str] = &[
    "com", "org", "net", "io", "dev", "java", "javax", "jakarta", "android", "kotlin", "scala",
];

/// AWS service labels under `amazonaws.com` that name no customer resource.
const AWS_SERVICES: &[&str] = &[
    "s3",
    "ec2",
    "eks",
    "sts",
    "iam",
    "ecr",
    "api",
    "logs",
    "monitoring",
    "lambda",
    "rds",
    "sqs",
    "sns",
    "dynamodb",
    "elasticloadbalancing",
    "autoscaling",
    "cloudformation",
    "ssm",
    "secretsmanager",
    "kms",
    "route53",
    "elasticache",
    "ecs",
    "events",
    "states",
    "apigateway",
    "ssmmessages",
    "ec2messages",
    "elasticfilesystem",
    "glue",
    "athena",
    "kinesis",
    "firehose",
    "cloudwatch",
    "xray",
    "codebuild",
    "codecommit",
    "es",
    "sagemaker",
    "bedrock",
    "dkr",
];

/// Whether a piece (no `/`) of a token-like run looks random: a credential.
fn random_piece(p: &[u8]) -> bool {
    let mut p = p;
    while let [rest @ .., b'='] = p {
        p = rest;
    }
    if p.len() >= 32 && p.iter().all(u8::is_ascii_hexdigit) {
        return true;
    }
    if p.len() < 24 {
        return false;
    }
    let segs: Vec<&[u8]> = p.split(|&c| c == b'_' || c == b'-').collect();
    for seg in &segs {
        if seg.len() < 16 {
            continue;
        }
        let l = seg.iter().filter(|c| c.is_ascii_lowercase()).count();
        let u = seg.iter().filter(|c| c.is_ascii_uppercase()).count();
        let d = seg.iter().filter(|c| c.is_ascii_digit()).count();
        let sw = switches(seg);
        if l + u > 0 && d > 0 && sw * 4 >= seg.len() {
            return true;
        }
        if d == 0 && l > 0 && u > 0 && seg.len() >= 20 && sw * 3 >= seg.len() {
            return true;
        }
    }
    let mixed = |s: &&[u8]| {
        s.len() >= 4 && s.iter().any(u8::is_ascii_alphabetic) && s.iter().any(u8::is_ascii_digit)
    };
    segs.len() >= 4 && segs.iter().all(mixed)
}

/// Standard base64 with `/` (no `-`/`_`), mixing classes, not a path of words.
fn base64_with_slashes(run: &[u8]) -> bool {
    if run.len() < 32 || !run.contains(&b'/') || run.iter().any(|&c| c == b'_' || c == b'-') {
        return false;
    }
    for piece in run.split(|&c| c == b'/') {
        let lower_word = piece.len() >= 3 && piece.iter().all(u8::is_ascii_lowercase);
        let cap_word = piece.len() >= 3
            && piece[0].is_ascii_uppercase()
            && piece[1..].iter().all(u8::is_ascii_lowercase);
        if lower_word || cap_word {
            return false;
        }
    }
    let letters = run.iter().filter(|c| c.is_ascii_alphabetic()).count();
    let alnums = run.iter().filter(|c| c.is_ascii_alphanumeric()).count();
    letters > 0 && alnums > letters && switches(run) * 3 >= run.len()
}

fn switches(s: &[u8]) -> usize {
    let class = |c: u8| {
        if c.is_ascii_lowercase() {
            0
        } else if c.is_ascii_uppercase() {
            1
        } else if c.is_ascii_digit() {
            2
        } else {
            3
        }
    };
    s.windows(2).filter(|w| class(w[0]) != class(w[1])).count()
}

#[cfg(test)]
mod tests {
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
            names: Vec::new(),
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
            names: Vec::new(),
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
                "alice-agent and alice2 and Alice",
                "<USER>-agent and alice2 and <USER>",
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
            names: Vec::new(),
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
}
