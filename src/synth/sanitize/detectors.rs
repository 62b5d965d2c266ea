//! The detectors: one pattern each, in one [`RegexSet`] (which detectors match at all)
//! and one [`Regex`] each (where), compiled once per process.

use std::sync::OnceLock;

use regex::{Regex, RegexSet};

use super::tables::{PROJECT_KEYS, SECRET_EXACT, SECRET_SUFFIXES, ZONE_DIRECTIONS, ZONE_PREFIXES};
use super::PLACEHOLDER_NAMES;

/// One detector per pattern, in [`patterns`] order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Det {
    Placeholder,
    Pem,
    UrlCredentials,
    Email,
    Ipv4,
    Ipv6,
    Uuid,
    Zone,
    Vendor,
    Prefixed,
    Entropy,
    Host,
    Arn,
    Gke,
    GkeNode,
    Home,
    KeyValue,
    Bearer,
    AuthHeader,
    ProjectPath,
    Phone,
    KeyedPhone,
    SpelledEmail,
    Card,
    Ssn,
    Iban,
}

pub(super) const DETS: [Det; 26] = [
    Det::Placeholder,
    Det::Pem,
    Det::UrlCredentials,
    Det::Email,
    Det::Ipv4,
    Det::Ipv6,
    Det::Uuid,
    Det::Zone,
    Det::Vendor,
    Det::Prefixed,
    Det::Entropy,
    Det::Host,
    Det::Arn,
    Det::Gke,
    Det::GkeNode,
    Det::Home,
    Det::KeyValue,
    Det::Bearer,
    Det::AuthHeader,
    Det::ProjectPath,
    Det::Phone,
    Det::KeyedPhone,
    Det::SpelledEmail,
    Det::Card,
    Det::Ssn,
    Det::Iban,
];

/// `a[-_.]?b[-_.]?c`: a key word as written with any separators (`api_key`, `API-KEY`).
pub(super) fn spaced(word: &str) -> String {
    let chars: Vec<String> = word.chars().map(|c| c.to_string()).collect();
    chars.join("[-_.]?")
}

pub(super) fn alternation(words: &[&str], f: impl Fn(&str) -> String) -> String {
    let mut w: Vec<&str> = words.to_vec();
    // Longer first: `northeast` before `north`, `europe` before `eu`.
    w.sort_by_key(|x| std::cmp::Reverse(x.len()));
    w.iter().map(|x| f(x)).collect::<Vec<_>>().join("|")
}

/// The detectors' patterns, in [`DETS`] order.
pub(super) fn patterns() -> Vec<String> {
    const HEX: &str = "[0-9A-Fa-f]";
    let zone = format!(
        "(?:{})-(?:{})(?:[0-9]{{1,2}}(?:-[a-z])?|-[0-9]{{1,2}}[a-z]?)",
        alternation(ZONE_PREFIXES, str::to_string),
        alternation(ZONE_DIRECTIONS, str::to_string)
    );
    let key_value = format!(
        concat!(
            r#"(?i:(?P<key>[A-Za-z0-9_.-]*(?:{suffixes})|[A-Za-z0-9_.-]*[-_.]pass|-{{0,2}}(?:{exact})|-{{0,2}}(?:{projects})))"#,
            r#"(?P<q>["']?)(?P<sp0>[ \t]{{0,4}})(?P<sep>[=:]?)[ \t]{{0,4}}"#,
            r#"(?:"(?P<dq>(?:[^"\\\n]|\\.)*)"?|'(?P<sq>(?:[^'\\\n]|\\.)*)'?|(?P<v>[^\s"'`,;&)\]}}<>]+))"#
        ),
        suffixes = alternation(SECRET_SUFFIXES, spaced),
        exact = alternation(SECRET_EXACT, str::to_string),
        projects = alternation(PROJECT_KEYS, spaced),
    );
    let placeholder = format!("<(?:{})>", PLACEHOLDER_NAMES.join("|"));
    let p: [(Det, String); 26] = [
        (Det::Placeholder, placeholder),
        (
            Det::Pem,
            r"(?s)-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]{0,64}-----|\z)"
                .into(),
        ),
        // `user:pass@`, the password with any of `/?#:` in it (`Xy9/Qz8+Kp2`), or
        // userinfo without those.
        (
            Det::UrlCredentials,
            r#"[A-Za-z]://([^\s/?#@"'<>]+|[^\s/?#@:"'<>]*:[^\s@"'<>]+)@"#.into(),
        ),
        // Letters of any script (`josé@`, `müller@`), and `%40` for `@` (URL-encoded).
        (
            Det::Email,
            // (The top-level label ASCII: `carol@acme.comまで` ends at `.com`.)
            r"[\p{L}\p{N}._%+-]+(?:@|%40)[\p{L}\p{N}-]+(?:\.[\p{L}\p{N}-]+)*\.[A-Za-z]{2,24}"
                .into(),
        ),
        // (Also with `_` between the octets, as in an argument or a tool name:
        // `ip_10_20_30_40`.)
        (
            Det::Ipv4,
            r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}|[0-9]{1,3}(?:_[0-9]{1,3}){3}".into(),
        ),
        (
            Det::Ipv6,
            format!(r"(?:{HEX}{{1,4}})?(?::{HEX}{{0,4}}){{2,}}(?:\.[0-9]{{1,3}}){{0,3}}"),
        ),
        (
            Det::Uuid,
            format!("{HEX}{{8}}-{HEX}{{4}}-{HEX}{{4}}-{HEX}{{4}}-{HEX}{{12}}"),
        ),
        (Det::Zone, zone),
        (
            Det::Vendor,
            concat!(
                r"gh[posur]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{16,}",
                r"|xox[bpars]-[A-Za-z0-9_-]{10,}|xapp-[A-Za-z0-9_-]{10,}|sk-[A-Za-z0-9_-]{20,}",
                r"|AIza[A-Za-z0-9_-]{30,}|ya29\.[A-Za-z0-9_.=-]{20,}|eyJ[A-Za-z0-9_.=-]{17,}",
                r"|npm_[A-Za-z0-9]{30,}|hf_[A-Za-z0-9]{30,}",
                r"|A(?:KIA|SIA|GPA|IDA|ROA|NPA|NVA|IPA)[A-Z0-9]{16}"
            )
            .into(),
        ),
        (
            Det::Prefixed,
            r"[A-Za-z]{2,12}[-_](?:live|test|prod)[-_][A-Za-z0-9]{10,}|[a-z]{2,8}_[A-Za-z0-9]{16,}"
                .into(),
        ),
        (Det::Entropy, r"[A-Za-z0-9+/_-]{20,}={0,2}".into()),
        (Det::Host, r"[A-Za-z0-9-]*\.[A-Za-z0-9.-]*".into()),
        (
            Det::Arn,
            r#"arn:aws(?:-cn|-us-gov)?:[\x21-\x7E&&[^"'`,;)\]}<>]]*"#.into(),
        ),
        (Det::Gke, r"gke_[A-Za-z0-9_-]+".into()),
        (Det::GkeNode, r"gke-[a-z0-9-]+".into()),
        (
            Det::Home,
            r#"(?:/home/|/Users/|\\Users\\)([^\s/\\"'`:,;)\]}<>]+)"#.into(),
        ),
        (Det::KeyValue, key_value),
        (Det::Bearer, r"(?i:bearer) {1,4}([A-Za-z0-9._~+/=-]+)".into()),
        (
            Det::AuthHeader,
            r#"(?i:authorization|cookie)["']?[:=][ "']*"#.into(),
        ),
        (Det::ProjectPath, r"(?i:projects)/([a-z0-9-]+)".into()),
        (
            Det::Phone,
            concat!(
                r"\+[1-9][0-9]{0,3}(?:[ .-]?\(?[0-9]{1,4}\)?){2,6}",
                r"|\([0-9]{3}\) ?[0-9]{3}[-. ][0-9]{4}|[0-9]{3}[-.][0-9]{3}[-.][0-9]{4}",
                // North American numbers with the country code and no `+`
                // (`1-415-555-0132`), or spaced (`415 555 0132`).
                // (Valid area and exchange codes only, 2-9 first: `120 450 1200 ms` is
                // three latencies, not a number.)
                r"|1[-. ][2-9][0-9]{2}[-. ][2-9][0-9]{2}[-. ][0-9]{4}|[2-9][0-9]{2} [2-9][0-9]{2} [0-9]{4}",
                r"|0[1-9][0-9]{0,3}(?: [0-9]{2,4}){2,4}",
                // Mixed separators (`415 555-0132`); national numbers after a trunk
                // `0`: French (`06.12.34.56.78`), Dutch (`06-12345678`), German and British (`030 12345678`,
                // `0151 23456789`, `030/12345678`, `07700 900123`), Japanese
                // (`03-1234-5678`, `090-1234-5678`); Brazilian (`(11) 91234-5678`).
                r"|[2-9][0-9]{2}[ .-][2-9][0-9]{2}[ .-][0-9]{4}",
                r"|0[1-9](?:[.-][0-9]{2}){4}|0[1-9][0-9]{1,4}[ /-][0-9]{5,8}|0[1-9]-[0-9]{8}",
                r"|0[0-9]{1,3}-[0-9]{3,4}-[0-9]{4}|\([0-9]{2,3}\) ?[0-9]{4,5}-[0-9]{4}",
                // International with `00` for the `+` (`0049 30 12345678`); a trunk
                // code in brackets (`(020) 7946 0958`); Russian (`8 (912) 345-67-89`),
                // Indian (`98765 43210`), Spanish (`612 345 678`), Swedish
                // (`070-123 45 67`); unbroken: Chinese mobiles (`13800138000`) and
                // North American numbers (`4155550132`: area and exchange 2-9 first).
                // (The group after the country code never starts with the trunk `0`.)
                r"|00[1-9][0-9]{0,2}[ .-]?[1-9][0-9]{0,4}(?:[ .-][0-9]{2,8}){1,4}",
                r"|\(0[1-9][0-9]{0,3}\) ?[0-9]{2,4}(?:[ -][0-9]{2,4}){1,3}",
                r"|8 ?\([0-9]{3}\) ?[0-9]{3}-[0-9]{2}-[0-9]{2}|[6-9][0-9]{4} [0-9]{5}",
                r"|[6-9][0-9]{2} [0-9]{3} [0-9]{3}|0[1-9][0-9]{1,2}-[0-9]{3} [0-9]{2} [0-9]{2}",
                r"|1[3-9][0-9]{9}|[2-9][0-9]{2}[2-9][0-9]{6}"
            )
            .into(),
        ),
        // A number after a phone-like key and `:` or `=`, whatever its form
        // (`tel:4155550132`, `phone: 98765 43210`, `"mobilePhone": "(415)5550132"`).
        (
            Det::KeyedPhone,
            concat!(
                r#"(?i:(?:tele|cell|mobile|home|work|office)?phone(?:[-_ .]?(?:number|num|no))?"#,
                r#"|tel(?:efon|efono|efone)?\.?|mobile|mob|cell|fax|sms|whatsapp)"#,
                r#"["']?[ \t]{0,3}[:=][ \t]{0,3}["']?(\+?\(?[0-9][0-9 ().-]{5,24}[0-9])"#
            )
            .into(),
        ),
        // An address spelled out: `carol at acme dot com`, `carol[at]acme[dot]com`.
        (
            Det::SpelledEmail,
            // (`at` as a word only with `dot` as a word: `hosted at github.com` is prose. The
            // word boundary is ASCII's: a Unicode one makes the whole set fall back from the
            // lazy DFA to the much slower PikeVM.)
            format!(
                concat!(
                    r"(?i:[\p{{L}}\p{{N}}._+-]+ ?(?:\[at\]|\(at\)|\{{at\}}) ?[\p{{L}}\p{{N}}-]+",
                    // (A plain `.` takes no spaces: `(at) Google. It was` is prose.)
                    r"(?:(?: ?(?:\[dot\]|\(dot\)|\{{dot\}}) ?|\.)[\p{{L}}\p{{N}}-]+)*?",
                    r"(?: ?(?:\[dot\]|\(dot\)|\{{dot\}}) ?|\.)(?:{tld})(?-u:\b)",
                    r"|[\p{{L}}\p{{N}}._+-]+ at [\p{{L}}\p{{N}}-]+(?: dot [\p{{L}}\p{{N}}-]+)*? dot (?:{word_tld})(?-u:\b))"
                ),
                tld = "com|org|net|edu|gov|io|dev|ai|app|co|uk|de|fr|es|it|nl|jp|in|br|au|ca|ch|se|eu|us",
                // (Spelled in words, only TLDs that are no English word: `breaks at the dot
                // in hostnames` is prose.)
                word_tld = "com|org|net|edu|gov"
            ),
        ),
        // Payment cards, always under a network's prefix (Visa 4, Mastercard 51-55 and
        // 22-27, Discover 6011/65, JCB 35, UnionPay 62; `3000 3001 3002 3003` is a list):
        // four groups of four (the last 1-7) with spaces, dashes, dots or underscores,
        // American Express's 4-6-5, or the digits run together (Visa 13/16/19, the others
        // 16, Amex 15, Diners 14); kept only if the Luhn check passes.
        (
            Det::Card,
            concat!(
                r"(?:4[0-9]{3}|5[1-5][0-9]{2}|2[2-7][0-9]{2}|6011|65[0-9]{2}|35[0-9]{2}|62[0-9]{2})",
                r"(?:[ ._-][0-9]{4}){2}[ ._-][0-9]{1,7}",
                r"|3[47][0-9]{2}[ -]?[0-9]{6}[ -]?[0-9]{5}",
                r"|4[0-9]{12}(?:[0-9]{3}(?:[0-9]{3})?)?",
                r"|(?:5[1-5][0-9]{2}|2[2-7][0-9]{2}|6011|65[0-9]{2}|35[0-9]{2})[0-9]{12}",
                r"|62[0-9]{14,17}|3(?:0[0-5]|[68][0-9])[0-9]{11}"
            )
            .into(),
        ),
        // A US social security number (`123-45-6789`, `123 45 6789`, `123.45.6789`).
        (Det::Ssn, r"[0-9]{3}[ .-][0-9]{2}[ .-][0-9]{4}".into()),
        // An IBAN, compact or in groups of four, kept only if its check digits hold.
        (
            Det::Iban,
            r"[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?".into(),
        ),
    ];
    debug_assert!(p.iter().zip(DETS).all(|((d, _), e)| *d == e));
    p.into_iter().map(|(_, s)| s).collect()
}

pub(super) struct Engine {
    pub(super) set: RegexSet,
    pub(super) res: Vec<Regex>,
    /// A whole label that is a region or zone (`us-east-1`), for `amazonaws.com` hosts.
    pub(super) zone_label: Regex,
}

pub(super) fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let p = patterns();
        // The patterns are constants of this file (a unit test compiles them), not input.
        let compile = |s: &str| Regex::new(s).expect("sanitizer pattern compiles");
        Engine {
            set: RegexSet::new(&p).expect("sanitizer patterns compile"),
            res: p.iter().map(|s| compile(s)).collect(),
            zone_label: compile(&format!("^(?:{})$", p[Det::Zone as usize])),
        }
    })
}
