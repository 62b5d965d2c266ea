//! The sanitizer (seed 002's `MemorySanitizer`): every text that may leave a user for the
//! shared `system_shared_patterns` scope passes through it first.
//!
//! CONTRACT: [`Sanitizer::text`] returns the text with every e-mail address, IP address
//! (v4 and v6), phone number, token or key, the user's own identifiers, the names the user
//! listed, project ids and environment-specific names replaced by placeholders
//! (`<EMAIL>`, `<IP>`, `<PHONE>`, `<TOKEN>`, `<USER>`, `<NAME>`, `<PROJECT_ID>`, ...).
//! [`Sanitizer::value`] applies it to every string of a JSON value (object keys too).
//! Pure and deterministic.
//!
//! # How it works
//! One [`regex::RegexSet`] holds every detector's pattern; one pass of the set tells which
//! detectors match at all, and only those run their own [`regex::Regex`] to find spans.
//! The `regex` crate runs in time linear in the input (no backtracking), so the whole
//! sanitizer is linear. The crate has no look-around, so a detector's match is a
//! *candidate*: a short check next to it (the byte before and after, an octet <= 255, a
//! word list) accepts it, trims it or drops it. Every accepted span has a [`Redaction`]
//! kind; overlapping spans are merged (the longest span's placeholder wins, ties go to the
//! more specific kind) and the text is rebuilt once. Existing placeholders are protected,
//! and passes repeat until one finds nothing (a redaction can change its neighbour's
//! shape), so `text(text(x)) == text(x)`. Inputs over [`MAX_TEXT_BYTES`] are cut (at
//! whitespace when possible) and end with `<TRUNCATED>`; outputs never exceed it.
//!
//! What is redacted:
//! - e-mail addresses -> `<EMAIL>` (except `git@host` ssh remotes), in any script
//!   (`josé@…`), URL-encoded (`carol%40acme.com`) or spelled out (`carol at acme dot
//!   com`, `carol[at]acme[dot]com`);
//! - IPv4 (with `:port` or `/cidr`; also with `_` between the octets) and IPv6 (full, `::`-compressed, embedded v4, `%zone`)
//!   -> `<IP>`; `0.0.0.0`, `127.0.0.1`, `255.255.255.255`, `169.254.169.254` (metadata
//!   server) and `::1` are kept: they identify nobody and are often the point of a lesson;
//! - phone numbers -> `<PHONE>`: international (`+` and 8 to 15 digits in groups:
//!   `+1 415 555 0132`, `+44 20 7946 0958`, `+4915123456789`) and national (`(415)
//!   555-0132`, `415-555-0132`, `415.555.0132`, `415 555-0132`, `020 7946 0958`, and
//!   after a trunk `0`: `07700 900123`, `030/12345678`, `06.12.34.56.78`, `03-1234-5678`,
//!   `(11) 91234-5678`, `(020) 7946 0958`, `070-123 45 67`); with `00` for the `+`
//!   (`0049 30 12345678`); Russian `8 (912) 345-67-89`, Indian `98765 43210`, Spanish
//!   `612 345 678`; unbroken Chinese mobiles (`13800138000`) and North American numbers
//!   (`4155550132`); any 7 to 15 digits after a phone key (`tel:4155550132`,
//!   `phone: 98765 43210`, `mobile=…`); never a version, date, IP, duration or port
//!   (separators and digit counts rule them out);
//! - tokens -> `<TOKEN>`: `Bearer x`, `Authorization:`/`Cookie:` header values, JWTs,
//!   AWS key ids (`AKIA`/`ASIA`/...), GitHub (`ghp_`, `gho_`, `ghs_`, `ghu_`, `ghr_`,
//!   `github_pat_`), GitLab (`glpat-`), Slack (`xox?-`, `xapp-`), `sk-` keys, Google API
//!   keys (`AIza`) and OAuth tokens (`ya29.`), npm and Hugging Face tokens; *any* prefixed
//!   key shape `<word>[-_](live|test|prod)[-_]<10+ letters and digits>` (`sk-live-…`,
//!   `rk_test_…`, `pk_prod_…`) and `<word>_<16+ random letters and digits>` (`whsec_…`);
//!   PEM private key blocks; the value of any `key=value` / `key: value` /
//!   `"key": "value"` / `--key value` pair whose key ends in password, passwd, passphrase,
//!   secret, token, api_key/apikey, access_key, secret_key, private_key, client_secret,
//!   credential(s), connection_string, session_id, pwd (not the shell's `PWD`), hmac_key,
//!   auth_key, app_key, key_base, `_pass` in an upper-case name or after a service or
//!   account word (`DB_PASS`, `redis-pass`; not `first_pass`), or is pass, sig, pin, otp
//!   (the key is kept); the value of a JSON key naming a phone -> `<PHONE>`; URL
//!   credentials (`scheme://user:pass@host`, the password with `/`, `#` or `?` in it
//!   too); long high-entropy strings (>= 24 chars mixing letters and digits or
//!   cases, hex >= 32, slash-separated base64);
//! - the user's `user_id` and `identifiers` (whole token, case-insensitive) ->
//!   `<USER>`; home directories `/home/<name>`, `/Users/<name>`, `C:\Users\<name>` ->
//!   `/home/<USER>` etc.;
//! - the names the user listed (`names`: people, customers, services), whole and each
//!   word of 3+ letters of a multi-word name (whole token, case-insensitive: `ZOË`) ->
//!   `<NAME>`;
//! - payment card numbers under a network's prefix (Visa, Mastercard, Amex, Discover,
//!   JCB, UnionPay, Diners), grouped (4-4-4-4 with spaces, dashes, dots or underscores;
//!   Amex 4-6-5) or run together, that pass the Luhn check -> `<CARD>`; US social
//!   security numbers (`123-45-6789`, `123 45 6789`, issued ranges only) -> `<ID>`; IBANs
//!   in capitals, compact or in groups of four, whose mod-97 check holds -> `<ACCOUNT>`
//!   (`numbers.rs`);
//! - before any of it, characters that hide a shape are made plain: zero-width and
//!   other invisible characters dropped, no-break and other spaces as ` `, full-width
//!   ASCII as ASCII (`carol＠acme.com`, `０７７００ 900123`); the output carries the plain
//!   form.
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
//!   string under 24 characters without a key-like prefix, a secret split across lines or
//!   JSON fields. This is why the shared scope carries structured fields by default
//!   (DESIGN.md, "The shared scope"), and free text only when the user asks for it.
//! - Names of people, companies, customers or services in free text are kept unless
//!   listed; so are bare host names without dots (`prod-db-7`), 2-label domains
//!   (`acme.com`), cluster names outside a GKE context, pod/deployment names, bucket names
//!   in `gs://` paths, AWS account ids outside ARNs, Azure regions (`eastus`), MAC
//!   addresses, phone numbers written without separators, without `+` and without a
//!   phone key, national ids other than the US SSN.
//! - FQDNs are only recognized under a fixed TLD list; 4-part versions that are valid
//!   IPv4 addresses (`10.2.0.1`) are redacted as IPs; git SHAs and digests (hex >= 32)
//!   become `<TOKEN>`; a list of 2-digit numbers after a leading `0` (`05 10 15 20 25`)
//!   looks like a national phone number and is redacted.
//! - Identifier and name matching is whole-token: a letter next to a digit is a token
//!   edge (`alice` is found in `alice-agent` and `alice2`), two letters are not
//!   (`danawhitfield`, `dwhitfield` and other joined spellings are kept); letters whose
//!   lowercase has another UTF-8 length (`İ`) are compared as written.
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

mod args;
mod detectors;
mod numbers;
mod tables;
#[cfg(test)]
mod tests;

pub(crate) use self::args::{arg_name_is_data, shareable_arg_names};
use std::borrow::Cow;

use regex::{Captures, Regex};
use serde_json::{Map, Value};

use self::detectors::{engine, Det, Engine, DETS};
use self::tables::{
    base64_with_slashes, is_host, is_reference, is_stopword, key_class, lower_same_len, phone_key,
    phone_value, plain_chars, project_like, random_piece, switches, token_edge, KeyClass,
    WELL_KNOWN_V4,
};

/// Inputs longer than this (bytes) are cut and marked with `<TRUNCATED>`; outputs never
/// exceed it.
pub const MAX_TEXT_BYTES: usize = 1 << 20;

const TRUNCATION_MARKER: &str = "<TRUNCATED>";

/// Placeholder names the sanitizer emits; `<NAME>` is never redacted again.
const PLACEHOLDER_NAMES: &[&str] = &[
    "EMAIL",
    "IP",
    "PHONE",
    "TOKEN",
    "USER",
    "NAME",
    "PROJECT_ID",
    "PROJECT",
    "ZONE",
    "CLUSTER",
    "NODE",
    "ARN",
    "HOST",
    "ENV",
    "ID",
    "CARD",
    "ACCOUNT",
    "TRUNCATED",
];

/// The kind of one redaction, and so its placeholder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Redaction {
    /// An e-mail address: `<EMAIL>`.
    Email,
    /// An IPv4 or IPv6 address: `<IP>`.
    Ip,
    /// A phone number: `<PHONE>`.
    Phone,
    /// A token, key, password or other credential: `<TOKEN>`.
    Token,
    /// The user's own identifier: `<USER>`.
    User,
    /// The user name in a home directory path: `<USER>`.
    HomePath,
    /// A name the user listed (a person, a customer): `<NAME>`.
    Name,
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
    /// A UUID or a national id number (US SSN `123-45-6789`): `<ID>`.
    Id,
    /// A payment card number (13-19 digits that pass the Luhn check): `<CARD>`.
    Card,
    /// A bank account number (an IBAN that passes its mod-97 check): `<ACCOUNT>`.
    Account,
}

impl Redaction {
    /// The text that replaces a redacted span of this kind.
    pub fn placeholder(self) -> &'static str {
        match self {
            Redaction::Email => "<EMAIL>",
            Redaction::Ip => "<IP>",
            Redaction::Phone => "<PHONE>",
            Redaction::Token => "<TOKEN>",
            Redaction::User | Redaction::HomePath => "<USER>",
            Redaction::Name => "<NAME>",
            Redaction::ProjectId => "<PROJECT_ID>",
            Redaction::GkeContext => "gke_<PROJECT>_<ZONE>_<CLUSTER>",
            Redaction::Node => "<NODE>",
            Redaction::Arn => "<ARN>",
            Redaction::Host => "<HOST>",
            Redaction::Zone => "<ZONE>",
            Redaction::Env => "<ENV>",
            Redaction::Id => "<ID>",
            Redaction::Card => "<CARD>",
            Redaction::Account => "<ACCOUNT>",
        }
    }

    /// Tie-break between overlapping spans of the same length: the more specific wins.
    fn priority(self) -> u8 {
        match self {
            Redaction::User | Redaction::HomePath => 12,
            Redaction::Name => 11,
            Redaction::Email => 10,
            Redaction::Token | Redaction::Card | Redaction::Account => 9,
            Redaction::ProjectId => 8,
            Redaction::GkeContext | Redaction::Arn => 7,
            Redaction::Node | Redaction::Ip => 6,
            Redaction::Phone => 5,
            Redaction::Id => 4,
            Redaction::Host => 3,
            Redaction::Env => 2,
            Redaction::Zone => 1,
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
    /// Names the user listed (people, customers, services): `<NAME>`.
    pub names: Vec<String>,
}

/// The redactor.
#[derive(Clone, Debug)]
pub struct Sanitizer {
    ctx: SanitizeContext,
    /// Whole-token needles, ASCII-lowercased, with their kind.
    needles: Vec<(String, Redaction)>,
}

impl Sanitizer {
    /// A sanitizer for one user's records.
    pub fn new(ctx: SanitizeContext) -> Sanitizer {
        let mut needles: Vec<(String, Redaction)> = Vec::new();
        let mut add = |s: &str, kind: Redaction| {
            let n = lower_same_len(plain_chars(s).trim());
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
        for s in &ctx.names {
            add(s, Redaction::Name);
            // "Dana Whitfield" is also written "Dana" or "Whitfield".
            let words: Vec<&str> = s.split_whitespace().collect();
            if words.len() > 1 {
                for w in words.iter().filter(|w| w.chars().count() >= 3) {
                    add(w, Redaction::Name);
                }
            }
        }
        Sanitizer { ctx, needles }
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
        collect_projects(v, &mut detected);
        self.value_with(v, &detected)
    }

    fn value_with(&self, v: &Value, extra: &[String]) -> Value {
        match v {
            Value::String(s) => Value::String(self.run(s, extra).0),
            Value::Array(a) => Value::Array(a.iter().map(|x| self.value_with(x, extra)).collect()),
            Value::Object(o) => {
                let mut m = Map::new();
                for (k, x) in o {
                    let redacted = |kind: Redaction| Value::String(kind.placeholder().to_string());
                    let fixed = match x {
                        Value::String(s) => !s.is_empty() && !s.starts_with('<'),
                        Value::Number(_) => true,
                        _ => false,
                    };
                    // (The key as the detectors see it: `pass<U+200B>word` is `password`.)
                    let plain = plain_chars(k);
                    let nx = match key_class(&plain) {
                        Some(KeyClass::Secret) if fixed => redacted(Redaction::Token),
                        Some(KeyClass::Project) if fixed => redacted(Redaction::ProjectId),
                        _ if phone_key(&plain) && phone_value(x) => redacted(Redaction::Phone),
                        _ => self.value_with(x, extra),
                    };
                    m.insert(self.run(k, extra).0, nx);
                }
                Value::Object(m)
            }
            other => other.clone(),
        }
    }

    /// Sanitizes to a fixed point: a redaction can change what its neighbours look like
    /// (`x.10.<TOKEN>` vs `x.10.Xk9...`), so passes repeat until one finds nothing.
    fn run(&self, s: &str, extra: &[String]) -> (String, Vec<Redaction>) {
        let s = plain_chars(s);
        let mut known: Vec<String> = extra.to_vec();
        let (mut out, mut kinds) = self.pass(&s, &mut known);
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
        let mut sc = Scan::new(&input);
        sc.structural();
        for d in sc.detected.drain(..) {
            push_unique(known, d);
        }
        let mut needles = self.needles.clone();
        for d in known.iter() {
            if d.len() >= 2 && !needles.iter().any(|(x, _)| x == d) && needles.len() < 256 {
                needles.push((d.clone(), Redaction::ProjectId));
            }
        }
        sc.needles(&needles);
        let (out, kinds) = sc.rebuild();
        (cap_output(out), kinds)
    }
}

/// Project ids detected anywhere in `v` (structure or a project-named key).
fn collect_projects(v: &Value, detected: &mut Vec<String>) {
    match v {
        Value::String(s) => {
            let input = cut_input(s);
            let mut sc = Scan::new(&input);
            sc.structural();
            for d in sc.detected {
                push_unique(detected, d);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_projects(x, detected)),
        Value::Object(o) => {
            for (k, x) in o {
                collect_projects(&Value::String(k.clone()), detected);
                if let (Some(KeyClass::Project), Value::String(s)) = (key_class(k), x) {
                    if let Some(id) = project_like(s) {
                        push_unique(detected, id);
                    }
                }
                collect_projects(x, detected);
            }
        }
        _ => {}
    }
}

/// Adds a detected project id (at most 64 per record: each one costs a search).
fn push_unique(v: &mut Vec<String>, s: String) {
    if !v.contains(&s) && v.len() < 64 {
        v.push(s);
    }
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
// The detectors.

fn alnum(c: u8) -> bool {
    c.is_ascii_alphanumeric()
}

fn word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The byte at `i`, or 0 past the end.
fn at(b: &[u8], i: usize) -> u8 {
    b.get(i).copied().unwrap_or(0)
}

/// The byte before `i`, or 0 at the start.
fn before(b: &[u8], i: usize) -> u8 {
    if i == 0 {
        0
    } else {
        b[i - 1]
    }
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

/// One pass over one text: the spans found and the project ids detected.
struct Scan<'a> {
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

impl<'a> Scan<'a> {
    fn new(s: &'a str) -> Scan<'a> {
        Scan {
            s,
            b: s.as_bytes(),
            lower: lower_same_len(s),
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

    /// Every shape-based detector (all but the context's whole-token needles), each one
    /// only if the set says its pattern occurs.
    fn structural(&mut self) {
        let e = engine();
        let hits = e.set.matches(self.s);
        for (i, det) in DETS.iter().enumerate() {
            if hits.matched(i) {
                self.detect(*det, &e.res[i], e);
            }
        }
    }

    fn detect(&mut self, det: Det, re: &Regex, e: &Engine) {
        let (s, b) = (self.s, self.b);
        match det {
            Det::Placeholder => {
                self.protected = re.find_iter(s).map(|m| (m.start(), m.end())).collect()
            }
            Det::Pem => re
                .find_iter(s)
                .for_each(|m| self.push(m.start(), m.end(), Redaction::Token)),
            Det::UrlCredentials => {
                for c in re.captures_iter(s) {
                    let Some(u) = c.get(1) else { continue };
                    // `host:5173/@vite/client`, `registry:5000/app@sha256:…`: a host and
                    // its port, then a path with an `@` in it, not `user:password@`.
                    let port_then_path = u.as_str().split_once(':').is_some_and(|(_, rest)| {
                        rest.split_once('/').is_some_and(|(port, _)| {
                            (1..=5).contains(&port.len())
                                && port.bytes().all(|c| c.is_ascii_digit())
                        })
                    });
                    if u.len() > 256 || port_then_path {
                        continue;
                    }
                    let kind = if u.as_str().contains(':') {
                        Redaction::Token
                    } else {
                        Redaction::User
                    };
                    self.push(u.start(), u.end(), kind);
                    self.url_ats.push(u.end());
                }
            }
            Det::Email => {
                for m in re.find_iter(s) {
                    // `@`, or `%40` (URL-encoded).
                    let (at_sign, at_len) = match m.as_str().find('@') {
                        Some(i) => (m.start() + i, 1),
                        None => (m.start() + m.as_str().find("%40").unwrap_or(0), 3),
                    };
                    let l = m.start() + m.as_str().len() - m.as_str().trim_start_matches('.').len();
                    let tld = m.as_str().rsplit('.').next().unwrap_or("");
                    if self.url_ats.contains(&at_sign)
                        || l >= at_sign
                        || &self.lower[l..at_sign] == "git"
                        || tld.len() < 2
                        || !tld.bytes().all(|c| c.is_ascii_alphabetic())
                    {
                        continue;
                    }
                    self.push(l, m.end(), Redaction::Email);
                    // `sa@<project>.iam.gserviceaccount.com` names the project
                    let domain = &self.lower[at_sign + at_len..m.end()];
                    if let Some(id) = domain
                        .strip_suffix(".iam.gserviceaccount.com")
                        .and_then(project_like)
                    {
                        push_unique(&mut self.detected, id);
                    }
                }
            }
            Det::Ipv4 => {
                for m in re.find_iter(s) {
                    let (st, mut end) = (m.start(), m.end());
                    let (pv, nx) = (before(b, st), at(b, end));
                    // (`_` is a boundary: `host_10.20.30.40` names the address.)
                    if alnum(pv)
                        || pv == b'.'
                        || alnum(nx)
                        || (nx == b'.' && alnum(at(b, end + 1)))
                        || m.as_str()
                            .split(['.', '_'])
                            .any(|o| o.parse::<u16>().map_or(true, |v| v > 255))
                    {
                        continue;
                    }
                    // `:port` (up to 5 digits) or `/cidr` (up to 2)
                    let digits = b
                        .get(end + 1..)
                        .map_or(0, |r| r.iter().take_while(|c| c.is_ascii_digit()).count());
                    let max = match nx {
                        b':' => 5,
                        b'/' => 2,
                        _ => 0,
                    };
                    if (1..=max).contains(&digits) && !word(at(b, end + 1 + digits)) {
                        end += 1 + digits;
                    }
                    if !WELL_KNOWN_V4.contains(&m.as_str()) {
                        self.push(st, end, Redaction::Ip);
                    }
                }
            }
            Det::Ipv6 => {
                for m in re.find_iter(s) {
                    let (st, mut end) = (m.start(), m.end());
                    let pv = before(b, st);
                    if alnum(pv) || pv == b':' || pv == b'.' {
                        continue;
                    }
                    let mut cand = m.as_str();
                    if cand.parse::<std::net::Ipv6Addr>().is_err() && cand.ends_with(':') {
                        cand = &cand[..cand.len() - 1];
                        end -= 1;
                    }
                    if cand.parse::<std::net::Ipv6Addr>().is_err()
                        || alnum(at(b, end))
                        || cand == "::1"
                        || !cand.bytes().any(|c| c.is_ascii_digit())
                    {
                        continue;
                    }
                    let tail =
                        |pred: fn(&u8) -> bool| b[end + 1..].iter().take_while(|c| pred(c)).count();
                    match at(b, end) {
                        b'%' => {
                            let z = tail(u8::is_ascii_alphanumeric);
                            if (1..=16).contains(&z) {
                                end += 1 + z;
                            }
                        }
                        b'/' => {
                            let z = tail(u8::is_ascii_digit);
                            if (1..=3).contains(&z) && !word(at(b, end + 1 + z)) {
                                end += 1 + z;
                            }
                        }
                        _ => {}
                    }
                    self.push(st, end, Redaction::Ip);
                }
            }
            Det::Uuid => {
                for m in re.find_iter(s) {
                    if !alnum(before(b, m.start())) && !alnum(at(b, m.end())) {
                        self.push(m.start(), m.end(), Redaction::Id);
                    }
                }
            }
            Det::Zone => {
                for m in re.find_iter(s) {
                    if alnum(before(b, m.start())) {
                        continue;
                    }
                    let mut end = m.end();
                    if alnum(at(b, end)) {
                        // `us-central1-ab`, `us-east-1ab`: the zone letter was not one
                        end -= if b[end - 2] == b'-' { 2 } else { 1 };
                        if !b[end - 1].is_ascii_digit() || alnum(at(b, end)) {
                            continue;
                        }
                    }
                    self.push(m.start(), end, Redaction::Zone);
                }
            }
            Det::Vendor => {
                for m in re.find_iter(s) {
                    let pv = before(b, m.start());
                    if alnum(pv) || pv == b'_' || pv == b'-' {
                        continue;
                    }
                    let t = m.as_str();
                    let mut end = m.end();
                    if t.starts_with("eyJ") || t.starts_with("ya29.") {
                        end -= t.len() - t.trim_end_matches('.').len();
                    }
                    let body = &t[3..];
                    let ok = if t.starts_with('A') && !t.starts_with("AIza") {
                        !alnum(at(b, end))
                    } else if t.starts_with("sk-") {
                        body.len() >= 20
                            && body
                                .bytes()
                                .any(|c| c.is_ascii_digit() || c.is_ascii_uppercase())
                    } else {
                        true
                    };
                    if ok {
                        self.push(m.start(), end, Redaction::Token);
                    }
                }
            }
            Det::Prefixed => {
                for m in re.find_iter(s) {
                    let pv = before(b, m.start());
                    let t = m.as_str();
                    let body = t.rsplit(['-', '_']).next().unwrap_or("");
                    let mixed = body.bytes().any(|c| c.is_ascii_digit())
                        && body.bytes().any(|c| c.is_ascii_alphabetic());
                    let random = body.len() < 16 || switches(body.as_bytes()) * 4 >= body.len();
                    if !(alnum(pv) || pv == b'_' || pv == b'-') && mixed && random {
                        self.push(m.start(), m.end(), Redaction::Token);
                    }
                }
            }
            Det::Entropy => {
                for m in re.find_iter(s) {
                    if m.len() >= 24 {
                        self.entropy(m.start(), m.end());
                    }
                }
            }
            Det::Host => {
                for m in re.find_iter(s) {
                    let (st, en) = (m.start(), m.end());
                    if before(b, st) == b'_' || at(b, en) == b'_' {
                        continue;
                    }
                    let name = m.as_str().trim_matches(['.', '-']);
                    let s0 =
                        st + (m.as_str().len() - m.as_str().trim_start_matches(['.', '-']).len());
                    if (4..=253).contains(&name.len())
                        && is_host(&self.lower[s0..s0 + name.len()], &e.zone_label)
                    {
                        self.push(s0, s0 + name.len(), Redaction::Host);
                    }
                }
            }
            Det::Arn => {
                for m in re.find_iter(s) {
                    if !alnum(before(b, m.start())) {
                        let end = m.start() + m.as_str().trim_end_matches('.').len().min(2048);
                        self.push(m.start(), end, Redaction::Arn);
                    }
                }
            }
            Det::Gke => {
                for m in re.find_iter(s) {
                    let pv = before(b, m.start());
                    let parts: Vec<&str> = m.as_str().split('_').collect();
                    if word(pv)
                        || pv == b'-'
                        || pv == b'.'
                        || parts.len() < 4
                        || parts.iter().any(|p| p.is_empty())
                    {
                        continue;
                    }
                    self.push(m.start(), m.end(), Redaction::GkeContext);
                    if let Some(id) = project_like(parts[1]) {
                        push_unique(&mut self.detected, id);
                    }
                }
            }
            Det::GkeNode => {
                for m in re.find_iter(s) {
                    let pv = before(b, m.start());
                    let parts: Vec<&str> = m.as_str().split('-').collect();
                    let n = parts.len();
                    if word(pv)
                        || pv == b'-'
                        || pv == b'.'
                        || word(at(b, m.end()))
                        || n < 4
                        || parts.iter().any(|p| p.is_empty())
                    {
                        continue;
                    }
                    let digit = |p: &str| p.bytes().any(|c| c.is_ascii_digit());
                    if (4..=8).contains(&parts[n - 1].len())
                        && (digit(parts[n - 1]) || digit(parts[n - 2]))
                    {
                        self.push(m.start(), m.end(), Redaction::Node);
                    }
                }
            }
            Det::Home => {
                for c in re.captures_iter(s) {
                    let Some(u) = c.get(1) else { continue };
                    if !u.as_str().starts_with('<') {
                        let end = floor_boundary(s, u.end().min(u.start() + 64));
                        self.push(u.start(), end, Redaction::HomePath);
                    }
                }
            }
            Det::KeyValue => {
                // Not `captures_iter`: a refused candidate may hide a key in its value.
                let mut from = 0;
                while let Some(c) = re.captures_at(s, from) {
                    let end = c.get(0).map_or(s.len(), |m| m.end());
                    from = self.key_value(&c).filter(|&r| r > from).unwrap_or(end);
                    while from < s.len() && !s.is_char_boundary(from) {
                        from += 1;
                    }
                    if from >= s.len() {
                        break;
                    }
                }
            }
            Det::Bearer => {
                for c in re.captures_iter(s) {
                    let (Some(all), Some(v)) = (c.get(0), c.get(1)) else {
                        continue;
                    };
                    if !alnum(before(b, all.start()))
                        && v.len() >= 8
                        && !v.as_str().bytes().all(|c| c.is_ascii_lowercase())
                    {
                        self.push(v.start(), v.end(), Redaction::Token);
                    }
                }
            }
            Det::AuthHeader => {
                for m in re.find_iter(s) {
                    if !alnum(before(b, m.start())) {
                        self.auth_header(m.start(), m.end());
                    }
                }
            }
            Det::ProjectPath => {
                for c in re.captures_iter(s) {
                    let (Some(all), Some(v)) = (c.get(0), c.get(1)) else {
                        continue;
                    };
                    let nx = at(b, v.end());
                    if word(before(b, all.start()))
                        || v.len() < 2
                        || word(nx)
                        || (nx == b'.' && alnum(at(b, v.end() + 1)))
                    {
                        continue;
                    }
                    if let Some(id) = project_like(v.as_str()) {
                        self.push(v.start(), v.end(), Redaction::ProjectId);
                        push_unique(&mut self.detected, id);
                    }
                }
            }
            Det::Phone => {
                for m in re.find_iter(s) {
                    let t = m.as_str().trim_end_matches(['(', ' ', '.', '-']);
                    let end = m.start() + t.len();
                    let (pv, nx) = (before(b, m.start()), at(b, end));
                    let digits = t.bytes().filter(u8::is_ascii_digit).count();
                    let ok = if t.starts_with('+') {
                        (8..=15).contains(&digits)
                    } else if t.starts_with("00") {
                        // (`00` dialled for the `+`.)
                        (10..=17).contains(&digits)
                    } else {
                        (9..=12).contains(&digits)
                    };
                    let glued =
                        matches!(nx, b'.' | b'-' | b':' | b'/') && at(b, end + 1).is_ascii_digit();
                    // `tel:+1...`, `phone=+1...`: a `+` number after a scheme or a key.
                    let keyed = t.starts_with('+') && matches!(pv, b':' | b'=');
                    let boundary =
                        keyed || !(alnum(pv) || matches!(pv, b'+' | b'.' | b'-' | b':' | b'/'));
                    if ok && boundary && !(alnum(nx) || glued) {
                        self.push(m.start(), end, Redaction::Phone);
                    }
                }
            }
            Det::KeyedPhone => {
                for c in re.captures_iter(s) {
                    let (Some(all), Some(v)) = (c.get(0), c.get(1)) else {
                        continue;
                    };
                    let t = v.as_str().trim_end_matches(['(', ' ', '.', '-']);
                    let end = v.start() + t.len();
                    let digits = t.bytes().filter(u8::is_ascii_digit).count();
                    // A key of its own (`microphone: 3` is not one), a number of phone
                    // length that is not a date and ends there. A date in any order
                    // (`2025-11-29`, `29-11-2025`, `2025.11.29`), maybe with a time
                    // after it: three groups of digits, 8 in all, one separator.
                    let head = t.split(' ').next().unwrap_or(t);
                    let groups: Vec<&str> = head.split(['-', '.', '/']).collect();
                    let date = groups.len() == 3
                        && head.bytes().filter(u8::is_ascii_digit).count() == 8
                        && groups.iter().all(|g| g.bytes().all(|c| c.is_ascii_digit()));
                    if !alnum(before(b, all.start()))
                        && (7..=15).contains(&digits)
                        && !date
                        && !alnum(at(b, end))
                    {
                        self.push(v.start(), end, Redaction::Phone);
                    }
                }
            }
            Det::Card => self.cards(re),
            Det::Ssn => self.national_ids(re),
            Det::Iban => self.ibans(re),
            Det::SpelledEmail => {
                for m in re.find_iter(s) {
                    if !alnum(before(b, m.start())) {
                        self.push(m.start(), m.end(), Redaction::Email);
                    }
                }
            }
        }
    }

    /// One `key=value` candidate: redacts the value of a secret- or project-named key.
    /// Returns where to search again when the candidate was refused in a way that may hide
    /// another key inside its value (`--password --token abc`).
    fn key_value(&mut self, c: &Captures<'_>) -> Option<usize> {
        let b = self.b;
        let (Some(key), Some(sep)) = (c.name("key"), c.name("sep")) else {
            return None;
        };
        let (key_start, key_str) = (key.start(), key.as_str());
        let kc = |x: u8| alnum(x) || matches!(x, b'_' | b'-' | b'.');
        if kc(before(b, key_start)) || key_str.len() > 64 {
            return None;
        }
        let class = key_class(key_str)?;
        let flag = key_str.starts_with('-');
        let after_set = key_start >= 4 && b[key_start - 4..key_start].eq_ignore_ascii_case(b"set ");
        let spaced_only = sep.is_empty();
        let q = c.name("q").map_or("", |m| m.as_str());
        let sp0 = c.name("sp0").map_or(0, |m| m.len());
        if spaced_only
            && !(sp0 > 0 && q.is_empty() && (flag || (after_set && class == KeyClass::Project)))
        {
            return None;
        }
        let after_sep = &b[sep.end()..];
        match sep.as_str() {
            "=" if matches!(at(after_sep, 0), b'=' | b'>') => return None,
            ":" if at(after_sep, 0) == b':' || after_sep.starts_with(b"//") => return None,
            _ => {}
        }
        let (v, quoted) = match (c.name("dq").or(c.name("sq")), c.name("v")) {
            (Some(v), _) => (v, true),
            (None, Some(v)) => (v, false),
            _ => return None,
        };
        let (vs, mut ve) = (
            v.start(),
            floor_boundary(self.s, v.end().min(v.start() + 4096)),
        );
        if !quoted {
            if class == KeyClass::Project {
                ve = vs + self.s[vs..ve].find('/').unwrap_or(ve - vs);
            }
            ve = vs + self.s[vs..ve].trim_end_matches('.').len();
        }
        let val = &self.s[vs..ve];
        if val.is_empty() || is_reference(val) {
            return None;
        }
        if val.starts_with('-') && spaced_only {
            return Some(vs);
        }
        if !quoted && sep.as_str() != "=" && is_stopword(val) {
            return None;
        }
        match class {
            KeyClass::Secret => self.push(vs, ve, Redaction::Token),
            KeyClass::Project => {
                if let Some(id) = project_like(val) {
                    self.push(vs, ve, Redaction::ProjectId);
                    push_unique(&mut self.detected, id);
                }
            }
        }
        None
    }

    /// `Authorization: <scheme> x` (or a parameter list), `Cookie: a=b; c=d`, the header
    /// name and separator ending at `vs`.
    fn auth_header(&mut self, ws: usize, vs: usize) {
        let (s, b) = (self.s, self.b);
        if vs >= b.len() || b[vs] == b'<' {
            return;
        }
        let q = match before(b, ws) {
            c @ (b'"' | b'\'') => c,
            _ => 0,
        };
        let piece_end = |from: usize| {
            from + b[from..]
                .iter()
                .take_while(|c| !(c.is_ascii_whitespace() || matches!(c, b'"' | b'\'' | b'`')))
                .count()
        };
        let spaces = |from: usize| from + b[from..].iter().take_while(|c| **c == b' ').count();
        let mut e = piece_end(vs);
        if self.lower[ws..].starts_with("authorization") {
            let scheme = matches!(
                &self.lower[vs..e],
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
            let p2 = spaces(e);
            let e2 = piece_end(p2);
            if scheme && p2 > e && e2 > p2 {
                let piece = &s[p2..e2];
                if piece.trim_end_matches('=').contains('=')
                    || (piece.ends_with('=') && at(b, e2) == b'"')
                {
                    // parameters (Digest, AWS4): up to the opening quote or the line end
                    let mut k = p2;
                    while k < b.len() && b[k] != b'\n' && (q == 0 || b[k] != q) {
                        k += if b[k] == b'\\' { 2 } else { 1 };
                    }
                    e = k.min(b.len());
                } else {
                    e = e2;
                }
            }
        } else {
            // cookie list: name=value; name=value
            while s[vs..e].ends_with(';') {
                let p2 = spaces(e);
                let e2 = piece_end(p2);
                if e2 == p2 || !s[p2..e2].contains('=') {
                    break;
                }
                e = e2;
            }
        }
        let e = floor_boundary(s, e.min(vs + 4096));
        if e > vs && !is_stopword(s[vs..e].trim_end_matches(['.', ','])) {
            self.push(vs, e, Redaction::Token);
        }
    }

    /// A run of token characters (`[A-Za-z0-9+/_-]`, `=` padding) of 24+ bytes: the whole
    /// run, or its `/`-separated pieces, when they look random.
    fn entropy(&mut self, i: usize, e: usize) {
        let run = &self.b[i..e];
        if run.contains(&b'+') && random_piece(run) {
            self.push(i, e, Redaction::Token);
            return;
        }
        let mut hit = false;
        let mut ps = i;
        for (k, &c) in run
            .iter()
            .enumerate()
            .chain(std::iter::once((run.len(), &b'/')))
        {
            if c == b'/' {
                let pe = i + k;
                if pe > ps && random_piece(&self.b[ps..pe]) {
                    self.push(ps, pe, Redaction::Token);
                    hit = true;
                }
                ps = pe + 1;
            }
        }
        if !hit && base64_with_slashes(run) {
            self.push(i, e, Redaction::Token);
        }
    }

    /// The context's identifiers, listed names and the detected project ids, whole-token.
    fn needles(&mut self, needles: &[(String, Redaction)]) {
        let mut found = Vec::new();
        for (n, kind) in needles {
            let (first, last) = (n.chars().next(), n.chars().next_back());
            for (k, _) in self.lower.match_indices(n.as_str()) {
                let e = k + n.len();
                // A letter next to a digit is an edge (`dana2`, `whitfield2`, `2alice`),
                // and so is a letter of a script written without spaces (`田中さん`);
                // two other letters or two digits are not (`danaher`, `agent-1` in
                // `agent-10`). Compared as chars: `Zoë’s`, `«Zoë»`.
                let (prev, next) = (self.s[..k].chars().next_back(), self.s[e..].chars().next());
                if token_edge(prev, first) && token_edge(next, last) {
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

    /// The text with each group of overlapping spans replaced by one placeholder.
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
