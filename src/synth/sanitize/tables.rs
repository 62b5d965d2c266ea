//! Word lists of the sanitizer (key names, TLDs, public domains, cloud regions) and the
//! checks built on them that accept or refuse a detector's candidate.

use std::borrow::Cow;

use regex::Regex;
use serde_json::Value;

pub(super) const SECRET_SUFFIXES: &[&str] = &[
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
    // `MYSQL_PWD`, `HMAC_KEY`, `AUTH_KEY`, `SECRET_KEY_BASE`, `APP_KEY`, ...
    "pwd",
    "hmackey",
    "authkey",
    "keybase",
    "appkey",
    "sharedkey",
    "clientkey",
    "privkey",
];

pub(super) const SECRET_EXACT: &[&str] = &[
    "pass", "sig", "pw", "dbpwd", "auth", "pin", "pincode", "otp", "otpcode",
];

pub(super) const PROJECT_KEYS: &[&str] = &[
    "project",
    "projectid",
    "googlecloudproject",
    "gcloudproject",
    "cloudsdkcoreproject",
    "gcpproject",
    "gcpprojectid",
    "gcloudprojectid",
];

/// Words that follow `token:` or `--project` in prose rather than a value.
pub(super) const STOPWORDS: &[&str] = &[
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

pub(super) const WELL_KNOWN_V4: &[&str] =
    &["0.0.0.0", "127.0.0.1", "255.255.255.255", "169.254.169.254"];

pub(super) const ZONE_PREFIXES: &[&str] = &[
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

pub(super) const ZONE_DIRECTIONS: &[&str] = &[
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
pub(super) const TLDS: &[&str] = &[
    "com", "net", "org", "io", "dev", "app", "cloud", "ai", "co", "us", "uk", "de", "fr", "eu",
    "jp", "cn", "in", "ru", "br", "au", "ca", "nl", "se", "ch", "es", "it", "info", "biz", "me",
    "tv", "xyz", "tech", "site", "online", "gov", "edu", "mil", "int", "gg", "ly", "nz", "za",
    "kr", "tw", "hk", "sg", "ie", "be", "at", "dk", "no", "fi", "cz", "pt", "gr", "ro", "hu", "il",
    "mx", "ar", "cl", "systems", "services", "network", "company", "team", "tools", "run", "page",
    "host", "link",
];

pub(super) const INTERNAL_SUFFIXES: &[&str] = &[
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
pub(super) const PUBLIC_DOMAINS: &[&str] = &[
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

/// First labels of Java/Kotlin package names (`com.google.cloud`), never host names.
pub(super) const REVERSE_DNS_ROOTS: &[&str] = &[
    "com", "org", "net", "io", "dev", "java", "javax", "jakarta", "android", "kotlin", "scala",
];

/// AWS service labels under `amazonaws.com` that name no customer resource.
pub(super) const AWS_SERVICES: &[&str] = &[
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum KeyClass {
    Secret,
    Project,
}

/// A key as [`key_class`] and [`phone_key`] compare it: ASCII-lowercased, with `-`, `_`,
/// `.` and spaces removed (`API-Key` and `api_key` are `apikey`).
fn key_norm(key: &str) -> String {
    key.bytes()
        .filter(|c| !matches!(c, b'-' | b'_' | b'.' | b' '))
        .map(|c| c.to_ascii_lowercase() as char)
        .collect()
}

/// Whether a key names a secret or a project: lowercased with `-`, `_`, `.` removed.
pub(super) fn key_class(key: &str) -> Option<KeyClass> {
    if key.len() > 64 {
        return None;
    }
    let norm = key_norm(key);
    if norm.is_empty() {
        None
    } else if PROJECT_KEYS.contains(&norm.as_str()) {
        Some(KeyClass::Project)
    } else if SECRET_EXACT.contains(&norm.as_str())
        || (SECRET_SUFFIXES.iter().any(|s| norm.ends_with(s))
            // (`PWD` and `OLDPWD` are the shell's directories.)
            && !matches!(norm.as_str(), "pwd" | "oldpwd"))
        || pass_suffix(key)
    {
        Some(KeyClass::Secret)
    } else {
        None
    }
}

/// `DB_PASS`, `redis-pass`, `smtp.pass`: `pass` after a separator (not `bypass`,
/// `compass`), in an upper-case environment name or after a word that names a service or
/// an account (`first_pass`, `all_pass`, `num_pass` are counts and flags).
pub(super) fn pass_suffix(key: &str) -> bool {
    const OWNERS: &[&str] = &[
        "db",
        "database",
        "redis",
        "mysql",
        "pg",
        "postgres",
        "sql",
        "mongo",
        "smtp",
        "mail",
        "imap",
        "ldap",
        "admin",
        "root",
        "user",
        "amqp",
        "rabbit",
        "rabbitmq",
        "ftp",
        "sftp",
        "ssh",
        "vnc",
        "wifi",
        "proxy",
        "api",
        "app",
        "auth",
        "login",
        "bind",
        "keystore",
        "truststore",
        "cert",
        "key",
        "basic",
        "http",
        "registry",
        "docker",
        "service",
        "svc",
    ];
    let k = key.as_bytes();
    if !(k.len() > 5
        && k[k.len() - 4..].eq_ignore_ascii_case(b"pass")
        && matches!(k[k.len() - 5], b'_' | b'-' | b'.'))
    {
        return false;
    }
    let head = &key[..key.len() - 5];
    let owner = head
        .rsplit(['_', '-', '.'])
        .next()
        .is_some_and(|w| OWNERS.iter().any(|o| o.eq_ignore_ascii_case(w)));
    owner || !key.bytes().any(|c| c.is_ascii_lowercase())
}

/// A key naming a phone number (`phone`, `mobilePhone`, `phone_number`, `tel`, `fax`).
pub(super) fn phone_key(key: &str) -> bool {
    if key.len() > 32 {
        return false;
    }
    let norm = key_norm(key);
    let base = norm
        .strip_suffix("number")
        .or_else(|| norm.strip_suffix("num"))
        .or_else(|| norm.strip_suffix("no"))
        .unwrap_or(&norm);
    matches!(
        base,
        "phone"
            | "telephone"
            | "tel"
            | "telefon"
            | "telefono"
            | "mobile"
            | "mobilephone"
            | "mob"
            | "cell"
            | "cellphone"
            | "fax"
            | "sms"
            | "whatsapp"
            | "homephone"
            | "workphone"
            | "officephone"
            | "contactphone"
    )
}

pub(super) fn is_stopword(v: &str) -> bool {
    v.len() <= 10 && STOPWORDS.iter().any(|w| w.eq_ignore_ascii_case(v))
}

/// `$VAR` / `${VAR}` (upper-case environment reference), a template or a mask.
pub(super) fn is_reference(v: &str) -> bool {
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
pub(super) fn project_like(v: &str) -> Option<String> {
    let v = v.trim();
    if v.len() < 3 || v.len() > 100 || is_stopword(v) || is_reference(v) || v.starts_with('-') {
        return None;
    }
    v.bytes()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b':' | b'_'))
        .then(|| v.to_ascii_lowercase())
}

/// Whether a lowercased dotted name is a host that identifies someone.
pub(super) fn is_host(name: &str, zone_label: &Regex) -> bool {
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
        return !labels[..labels.len() - 2]
            .iter()
            .all(|l| AWS_SERVICES.contains(l) || zone_label.is_match(l));
    }
    !PUBLIC_DOMAINS.iter().any(|d| under(d))
}

/// Whether a piece (no `/`) of a token-like run looks random: a credential.
pub(super) fn random_piece(p: &[u8]) -> bool {
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
pub(super) fn base64_with_slashes(run: &[u8]) -> bool {
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

/// How often the character class changes (lower, upper, digit, other) along `s`.
pub(super) fn switches(s: &[u8]) -> usize {
    let class = |c: u8| match c {
        b'a'..=b'z' => 0,
        b'A'..=b'Z' => 1,
        b'0'..=b'9' => 2,
        _ => 3,
    };
    s.windows(2).filter(|w| class(w[0]) != class(w[1])).count()
}

/// `s` with the characters that hide a shape from the detectors made plain: invisible
/// ones dropped (zero-width spaces and joiners, the word joiner, the BOM, soft hyphens:
/// `ghp_<U+200B>abc…`, `carol<U+200B>@acme.com`), other spaces as ` ` (no-break,
/// figure, narrow, ideographic: `+44<U+00A0>20…`), full-width ASCII as ASCII (`０７７００`,
/// `carol＠acme.com`). Borrowed when there is none (the common case).
pub(super) fn plain_chars(s: &str) -> Cow<'_, str> {
    // Dropped: zero-width and joiners, direction marks and embeddings, invisible
    // operators, the Mongolian vowel separator, the combining grapheme joiner, variation
    // selectors, the word joiner, the BOM, soft hyphens.
    let dropped = |c: char| {
        matches!(c, '\u{00AD}' | '\u{034F}' | '\u{180E}' | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{2069}'
            | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}')
    };
    let spaces = |c: char| {
        matches!(
            c,
            '\u{00A0}' | '\u{2000}'..='\u{200A}' | '\u{202F}' | '\u{205F}' | '\u{3000}'
        )
    };
    let odd =
        |c: char| dropped(c) || spaces(c) || matches!(c, '\u{FF01}'..='\u{FF5E}' | '\u{FE6B}');
    if s.is_ascii() || !s.chars().any(odd) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .filter_map(|c| match c {
                c if dropped(c) => None,
                c if spaces(c) => Some(' '),
                '\u{FE6B}' => Some('@'),
                '\u{FF01}'..='\u{FF5E}' => char::from_u32(c as u32 - 0xFEE0),
                c => Some(c),
            })
            .collect(),
    )
}

/// `s` lowercased char by char where the lowercase letter has the same UTF-8 length
/// (`ZOË` -> `zoë`), so byte offsets into `s` and into its lowercase agree.
pub(super) fn lower_same_len(s: &str) -> String {
    if s.is_ascii() {
        return s.to_ascii_lowercase();
    }
    s.chars()
        .map(|c| {
            let mut l = c.to_lowercase();
            match (l.next(), l.next()) {
                (Some(x), None) if x.len_utf8() == c.len_utf8() => x,
                _ => c,
            }
        })
        .collect()
}

/// Whether two chars side by side (one may be the text's start or end) part two tokens.
pub(super) fn token_edge(a: Option<char>, b: Option<char>) -> bool {
    let (Some(a), Some(b)) = (a, b) else {
        return true;
    };
    // Han, kana, Hangul: words run together, so a listed name there has no other edge.
    let spaceless = |c: char| {
        matches!(c, '\u{3040}'..='\u{30FF}' | '\u{3400}'..='\u{9FFF}' | '\u{AC00}'..='\u{D7AF}'
            | '\u{F900}'..='\u{FAFF}')
    };
    if spaceless(a) || spaceless(b) {
        return true;
    }
    !((a.is_alphabetic() && b.is_alphabetic()) || (a.is_numeric() && b.is_numeric()))
}

/// A JSON value under a phone key that is a number: 7 to 15 digits, with nothing but
/// `+`, spaces, dots, dashes and parentheses between them.
pub(super) fn phone_value(v: &Value) -> bool {
    let s = match v {
        Value::String(s) => plain_chars(s),
        Value::Number(n) => Cow::Owned(n.to_string()),
        _ => return false,
    };
    let digits = s.bytes().filter(u8::is_ascii_digit).count();
    (7..=15).contains(&digits)
        && s.bytes()
            .all(|c| c.is_ascii_digit() || matches!(c, b'+' | b' ' | b'.' | b'-' | b'(' | b')'))
}
