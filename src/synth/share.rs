//! The shared scope (seed 002): what a user's synthesis copies to every other user
//! (sanitized patterns and mistakes), and the pattern books and advice read back from the
//! user's own scope and the shared one.

use serde::Serialize;

use crate::error::{Error, IoContext, Result};
use crate::event::{EventType, SHARED_USER};
use crate::log::meta::Durability;
use crate::query::options::ReadOptions;
use crate::store::Store;
use crate::synth::driver::{sanitize_learnings, SynthOptions, LEARNED_SUBJECT, SHARED_RUN};
use crate::synth::facts::{FactsFold, Record, FACTS_RUN};
use crate::synth::findings::{engine_event, to_value};
use crate::synth::patterns::{self, InvestigationPattern, PatternBook, ToolMistake};
use crate::synth::sanitize::{arg_name_is_data, SanitizeContext, Sanitizer};
use crate::synth::settings::{SharePatterns, UserSettings};

/// Largest settings file read.
const SETTINGS_BYTES_MAX: u64 = 64 * 1024;
/// Name of the per-data-dir key of the shared scope's opaque ids.
const SECRET_FILE: &str = ".share-key";

/// The root-cause categories a structured share may carry, each with the words that
/// select it (first match wins; `unknown` otherwise).
const ROOT_CAUSES: &str = "certificate: cert tls ssl x509 handshake
dns: dns resolver nxdomain servfail resolv
rate_limit: rate~limit rate-limit throttl 429 quota
permissions: permission forbidden 403 unauthori iam rbac denied
memory: oom out~of~memory memory heap
disk: disk volume inode filesystem no~space
database: database postgres mysql db~ query replica deadlock connection~pool connection~leak pool
deployment: deploy release rollout canary version image
configuration: config flag setting env~var misconfig timeout
capacity: capacity saturat cpu load scale traffic queue
network: network packet latency partition firewall route socket
dependency: dependency upstream third-party vendor provider api
code_bug: bug regression null exception panic crash";

/// The fix categories a structured share may carry (`other` otherwise).
const FIXES: &str = "rollback: roll~back rollback rolled~back revert
restart: restart bounce reboot recycle
failover: failover fail~over promote switch~over
scale_up: scale add~capacity more~replicas resize increase
config_change: config flag setting raise lower limit
patch: patch fix hotfix deploy
renew: renew rotate reissue";

/// The category of `text` in `table` (lines `name: word word~with~spaces ...`): the first
/// whose words `text` contains, or `none`.
fn category(text: &str, table: &'static str, none: &'static str) -> String {
    // `connection_leak_after_deploy` reads as words: `connection leak` is its cause.
    let t = text.to_lowercase().replace(['_', '-'], " ");
    table
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(_, words)| {
            words
                .split_whitespace()
                .any(|w| t.contains(&w.replace(['~', '-'], " ")))
        })
        .map_or(none, |(c, _)| c)
        .to_string()
}

/// The words a shared symptom may keep (besides those of [`ROOT_CAUSES`] and [`FIXES`]):
/// what a symptom is, never whom or what it happened to. A symptom is free text an agent
/// wrote (`Orion Acquisition ledger stall`): its other words (names of customers,
/// projects, people) would reach every user.
const SYMPTOM_WORDS: &str = "high low slow slowness latency latent timeout timeouts \
    error errors failing failure failures failed fail outage down degraded degradation \
    unavailable unreachable spike spikes surge drop dropped drops stall stalled stuck hang \
    hung hanging crash crashes crashing crashloop restart restarts loop flapping flaky \
    lag lagging backlog behind delay delayed missing lost loss duplicate duplicates \
    corrupt corruption stale inconsistent mismatch wrong full exhausted exhaustion \
    saturated saturation pressure leak leaking oom throttled throttling rejected refused \
    denied expired expiring invalid broken partial intermittent increase increased \
    elevated rising growth growing queue queued consumer producer lag replication \
    replica primary leader election split brain checkout login signin signup auth \
    authentication authorization payment payments billing invoice invoices ledger order \
    orders cart search upload download sync import export ingest ingestion pipeline etl \
    batch job jobs cron schedule scheduler worker workers build deploy deployment release \
    rollout api gateway endpoint request requests response responses http https grpc \
    websocket connection connections pool socket cache caching cdn dns tls ssl cert \
    certificate network packet disk storage volume memory cpu heap gc garbage collection \
    thread threads database db query queries index lock locks deadlock kafka redis \
    postgres mysql mongo elastic queue topic partition partitions message messages email \
    notification notifications push mobile ios android web frontend backend service \
    services node nodes pod pods container containers cluster kubernetes model training \
    inference eval evaluation accuracy data report reports dashboard metrics alert \
    alerts monitoring log logs p50 p95 p99 tail rate quota limit limits";

/// Whether `w` (lowercase) is a word a shared symptom may keep.
fn symptom_word(w: &str) -> bool {
    let listed = |table: &str| {
        table
            .split(|c: char| c.is_whitespace() || c == '~' || c == ':')
            .any(|x| x == w)
    };
    // (`db~` and `name:` split into an empty word too: never a word of a symptom.)
    !w.is_empty() && (listed(SYMPTOM_WORDS) || listed(ROOT_CAUSES) || listed(FIXES))
}

/// The shared form of a symptom: its words of [`symptom_word`]'s closed vocabulary, at
/// most 4, as a slug (`unspecified` when none is left).
fn symptom_slug(text: &str) -> String {
    let words: Vec<String> = text
        .split(|c: char| !c.is_ascii_alphanumeric())
        .map(str::to_ascii_lowercase)
        .filter(|w| symptom_word(w))
        .take(4)
        .collect();
    if words.is_empty() {
        "unspecified".into()
    } else {
        words.join("_")
    }
}

/// A short `snake_case` slug of sanitized text: letters only, at most 4 words of at most
/// 16 letters (no numbers, ids or placeholders survive it).
fn slug(text: &str) -> String {
    text.split(|c: char| !c.is_ascii_alphabetic())
        .filter(|w| (2..=16).contains(&w.len()))
        .take(4)
        .map(str::to_ascii_lowercase)
        .collect::<Vec<_>>()
        .join("_")
}

/// What the structured shared scope says a correction changed: the names of the
/// arguments, recorded when the run was learned (`ToolMistake::changed_args`), never the
/// correction's text (its values: hosts, names, paths). Learnings without them say only
/// that arguments changed.
fn argument_names(names: &[String]) -> String {
    if names.is_empty() {
        "changed arguments".into()
    } else {
        format!("changed: {}", names.join(", "))
    }
}

/// The structured form of (already sanitized) learnings: every free-text field replaced
/// by a slug or a category of a closed vocabulary.
fn structured(mut l: patterns::RunLearnings) -> patterns::RunLearnings {
    if let Some(p) = &mut l.pattern {
        p.symptom_type = symptom_slug(&p.symptom_type);
        p.root_cause_category = category(&p.root_cause_category, ROOT_CAUSES, "unknown");
        p.resolution_summary = category(&p.resolution_summary, FIXES, "other");
        for t in &mut p.tool_sequence {
            *t = slug(t);
        }
        p.fingerprint = patterns::fingerprint(&[
            &p.symptom_type,
            &p.root_cause_category,
            &p.tool_sequence.join("\u{1}"),
        ]);
    }
    for m in &mut l.mistakes {
        m.tool = slug(&m.tool);
        m.error = m.category.clone();
        m.correction = m
            .correction
            .as_ref()
            .map(|_| argument_names(&m.changed_args));
        m.fingerprint = patterns::fingerprint(&[&m.tool, &m.error]);
    }
    l
}

/// A pattern or mistake with the scope it comes from.
#[derive(Clone, Debug, Serialize)]
pub struct Scoped<T> {
    /// `private` (the user's own runs) or `shared` (sanitized, from every user).
    pub scope: &'static str,
    /// For shared advice: how many distinct users taught it. One user's advice is one
    /// user's word, however many runs repeat it: weigh it accordingly.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub users: Option<usize>,
    /// The pattern or mistake.
    #[serde(flatten)]
    pub item: T,
}

impl Store {
    /// A store acting for the shared patterns scope (internal: clients cannot be it).
    pub(crate) fn shared_store(&self) -> Store {
        self.same_config_as(SHARED_USER)
    }

    /// Copies the learnings of `runs` (from the private fold) to the shared scope,
    /// sanitized. Idempotent: each copy has an id derived from the user and the run.
    pub(crate) fn share_learnings(
        &self,
        items: Vec<(String, patterns::RunLearnings)>,
        opts: &SynthOptions,
    ) -> Result<u64> {
        let settings = self.user_settings()?;
        let mode = opts.share_patterns.unwrap_or(settings.share_patterns);
        if mode == SharePatterns::Off || items.is_empty() {
            return Ok(0);
        }
        let key = self.share_key()?;
        let shared = self.shared_store();
        let mut n = 0;
        for (run, l) in items {
            let s = Sanitizer::new(self.sanitize_context(&run, opts, &settings));
            let mut clean = sanitize_learnings(&s, l);
            if mode == SharePatterns::Structured {
                clean = structured(clean);
            }
            // Keyed with a per-data-dir secret: a guessed (user, run) cannot be confirmed
            // from the shared scope.
            let shared_run = self.shared_run_id(&key, &run);
            // The run id stays with its user: the shared copy names an opaque hash.
            clean.run_id.clone_from(&shared_run);
            // Who taught it, as an opaque id of the same key: counts distinct users.
            let mut who = blake3::Hasher::new_keyed(&key);
            who.update(b"user\0");
            who.update(self.user().as_bytes());
            clean.contributor = format!("u{}", &who.finalize().to_hex()[..16]);
            let rec = Record::Learned {
                run: shared_run.clone(),
                learnings: Box::new(clean),
                shared: None,
            };
            let mut ev = engine_event(
                SHARED_USER,
                EventType::Synth,
                Some(LEARNED_SUBJECT.to_string()),
                to_value(&rec)?,
            );
            ev.id = Some(format!("shared-{}", &shared_run[1..]));
            match shared.append_checked(SHARED_RUN, vec![ev], None, Durability::Sync) {
                Ok(_) => n += 1,
                // The run's copy is already shared in another form: made in the other
                // mode (the user changed `share_patterns`) or by an older sanitizer. The
                // first copy stands (the shared log is append-only, and a second copy
                // would count the run twice); this run is not the user's to fail over.
                Err(Error::Conflict(_)) => {
                    tracing::info!(
                        run = %run,
                        "the run's shared copy was sent before in another form; the first stands"
                    );
                }
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    /// This user's settings (`<data dir>/<user>/settings.json`); defaults when absent.
    pub fn user_settings(&self) -> Result<UserSettings> {
        let path = self
            .root()
            .join(self.user())
            .join(crate::event::USER_SETTINGS_FILE);
        if !self.storage().exists(&path) {
            return Ok(UserSettings::default());
        }
        let len = crate::log::storage::file_len(&**self.storage(), &path)?;
        if len > SETTINGS_BYTES_MAX {
            return Err(Error::invalid(
                path.display().to_string(),
                format!("{len} bytes, limit {SETTINGS_BYTES_MAX}"),
            ));
        }
        let f = self
            .storage()
            .open(&path, crate::log::storage::OpenMode::Read)
            .ctx("open", &path)?;
        let mut b = vec![0u8; len as usize];
        f.read_exact_at(&mut b, 0).ctx("read", &path)?;
        serde_json::from_slice(&b)
            .map_err(|e| Error::invalid(path.display().to_string(), e.to_string()))
    }

    /// The data dir's 32-byte key for the shared scope's opaque ids, created (mode 0600)
    /// on first use. Two processes creating it at once agree: the loser reads the winner's.
    fn share_key(&self) -> Result<[u8; 32]> {
        let path = self.root().join(SECRET_FILE);
        let st = self.storage();
        if !st.exists(&path) {
            let mut key = [0u8; 32];
            getrandom::fill(&mut key).map_err(|e| Error::Io {
                op: "random",
                path: path.clone(),
                source: std::io::Error::other(e.to_string()),
            })?;
            match st.open(&path, crate::log::storage::OpenMode::CreateNew) {
                Ok(f) => {
                    f.write_all_at(&key, 0).ctx("write", &path)?;
                    f.sync_data().ctx("fsync", &path)?;
                    st.sync_dir(self.root()).ctx("fsync dir", self.root())?;
                    return Ok(key);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e).ctx("create", &path),
            }
        }
        let f = st
            .open(&path, crate::log::storage::OpenMode::Read)
            .ctx("open", &path)?;
        let mut key = [0u8; 32];
        f.read_exact_at(&mut key, 0).ctx("read", &path)?;
        Ok(key)
    }

    /// What the sanitizer must redact for a run of this user: the user id and the run id
    /// (agent ids are not: they are role names such as `metrics` that also occur in tool
    /// names), the project ids and environment names given.
    pub(crate) fn sanitize_context(
        &self,
        run: &str,
        opts: &SynthOptions,
        settings: &UserSettings,
    ) -> SanitizeContext {
        // The names of the command and of the user's settings: every pass of the
        // sanitizer over this user's text knows both (the first pass, over the events,
        // runs before the learnings are cut to their lengths, so a name cut in two
        // there would no longer be found whole).
        let mut names = opts.redact_names.clone();
        names.extend(settings.redact_names.iter().cloned());
        SanitizeContext {
            user_id: self.user().to_string(),
            identifiers: vec![run.to_string()],
            project_ids: opts.project_ids.clone(),
            env_names: opts.env_names.clone(),
            names,
        }
    }

    /// The opaque id a run's learnings carry in the shared scope: keyed with a
    /// per-data-dir secret, so a guessed (user, run) cannot be confirmed from it.
    fn shared_run_id(&self, key: &[u8; 32], run: &str) -> String {
        let mut hasher = blake3::Hasher::new_keyed(key);
        hasher.update(self.user().as_bytes());
        hasher.update(&[0]);
        hasher.update(run.as_bytes());
        let digest = hasher.finalize();
        let h = u64::from_le_bytes(digest.as_bytes()[..8].try_into().unwrap_or_default());
        format!("r{h:016x}")
    }

    /// The shared scope's pattern book (sanitized learnings of every user).
    pub fn shared_book(&self) -> Result<PatternBook> {
        self.shared_book_hiding(&[])
    }

    /// The shared book less the copies of this user's own runs `hidden` (their shared
    /// ids are derived here): a `sanitized` copy keeps the resolution's and the errors'
    /// wording, so a read made as an agent leaves out the runs [`Store::own_book_as`]
    /// leaves out.
    fn shared_book_hiding(&self, hidden: &[String]) -> Result<PatternBook> {
        let mut ids = std::collections::BTreeSet::new();
        if !hidden.is_empty() && self.storage().exists(&self.root().join(SECRET_FILE)) {
            let key = self.share_key()?;
            ids.extend(hidden.iter().map(|run| self.shared_run_id(&key, run)));
        }
        let hidden = ids;
        let shared = self.shared_store();
        let mut fold = FactsFold::new(None);
        match shared.read(SHARED_RUN, ReadOptions::default()) {
            Ok(it) => {
                for e in it {
                    let e = e?;
                    let run = e.content.get("run").and_then(serde_json::Value::as_str);
                    if run.is_none_or(|r| !hidden.contains(r)) {
                        fold.apply(&e);
                    }
                }
            }
            Err(Error::RunNotFound(_)) => {}
            Err(e) => return Err(e),
        }
        Ok(fold.book)
    }

    /// The user's own pattern book: the `learned` records of committed passes, found
    /// through the subject index (they carry the subject [`LEARNED_SUBJECT`]).
    pub fn own_book(&self) -> Result<PatternBook> {
        self.own_book_as(None)
    }

    /// [`Store::own_book`] for a read made as `reader`: only the learnings of runs whose
    /// policy shows the agent every entry type (a run's pattern quotes its decisions and
    /// resolution, its mistakes the tools' arguments and errors), as
    /// [`crate::synth::FactGate`] decides for facts.
    pub fn own_book_as(&self, reader: Option<&str>) -> Result<PatternBook> {
        Ok(self.own_book_and_hidden(reader)?.0)
    }

    /// Both books as `reader` reads them: its own ([`Store::own_book_as`]) and the
    /// shared one less this user's copies of the runs left out of the first.
    fn books_as(&self, reader: Option<&str>) -> Result<(PatternBook, PatternBook)> {
        let (own, hidden) = self.own_book_and_hidden(reader)?;
        Ok((own, self.shared_book_hiding(&hidden)?))
    }

    /// [`Store::own_book_as`], and the runs whose learnings it left out.
    fn own_book_and_hidden(&self, reader: Option<&str>) -> Result<(PatternBook, Vec<String>)> {
        let mut book = PatternBook::default();
        let mut hidden = Vec::new();
        let committed = match self.committed_passes() {
            Ok(c) => c,
            Err(Error::RunNotFound(_)) => return Ok((book, hidden)),
            Err(e) => return Err(e),
        };
        let mut gate = self.fact_gate(reader);
        for e in self.read(
            FACTS_RUN,
            ReadOptions {
                subject: Some(LEARNED_SUBJECT.to_string()),
                ..ReadOptions::default()
            },
        )? {
            let e = e?;
            if !committed.contains(e.seq) {
                continue;
            }
            if let Ok(Record::Learned { learnings, .. }) = serde_json::from_value(e.content) {
                if gate.admits(std::slice::from_ref(&learnings.run_id), None) {
                    book.merge_run(&learnings);
                } else {
                    hidden.push(learnings.run_id);
                }
            }
        }
        Ok((book, hidden))
    }

    /// Proven investigation patterns for a symptom: the user's own first, then the
    /// shared scope's (seed 002's `get_recommended_investigation_strategy`).
    pub fn patterns(&self, symptom: &str) -> Result<Vec<Scoped<InvestigationPattern>>> {
        self.patterns_as(symptom, None)
    }

    /// [`Store::patterns`] for a read made as `reader` ([`Store::own_book_as`]).
    pub fn patterns_as(
        &self,
        symptom: &str,
        reader: Option<&str>,
    ) -> Result<Vec<Scoped<InvestigationPattern>>> {
        let exact = patterns::slugify(symptom);
        if exact.is_empty() {
            return Err(Error::invalid(
                "symptom",
                "empty: name the symptom to look up",
            ));
        }
        let (own, shared) = self.books_as(reader)?;
        // The book lists exact matches first, then patterns sharing a word: keep them so.
        Ok(scoped(
            own.recommend(symptom),
            shared.recommend(symptom),
            |p| p.symptom_type != exact,
        ))
    }

    /// Known mistakes of a tool, before calling it: the user's own, then the shared
    /// scope's (seed 002's `MistakeAdvisor`).
    pub fn advise(&self, tool: &str) -> Result<Vec<Scoped<ToolMistake>>> {
        self.advise_as(tool, None)
    }

    /// [`Store::advise`] for a read made as `reader` ([`Store::own_book_as`]).
    pub fn advise_as(&self, tool: &str, reader: Option<&str>) -> Result<Vec<Scoped<ToolMistake>>> {
        if tool.trim().is_empty() {
            return Err(Error::invalid("tool", "empty: name the tool to look up"));
        }
        let (own, shared) = self.books_as(reader)?;
        Ok(scoped(own.advise(tool), shared.advise(tool), |_| false))
    }
}

/// What another user may learn of a shared item: how many users taught it, never who
/// (their opaque ids link one tenant's incidents across items) nor exactly when (times
/// are cut to the UTC day).
pub(crate) trait Redacted {
    /// Distinct users who taught it.
    fn users(&self) -> usize;
    /// Drops the contributors and coarsens the times.
    fn redact(&mut self);
}

/// A time cut to the start of its UTC day.
fn day(t: crate::event::ts::Ts) -> crate::event::ts::Ts {
    const DAY_US: u64 = 86_400_000_000;
    crate::event::ts::Ts(t.0 - t.0 % DAY_US)
}

impl Redacted for InvestigationPattern {
    fn users(&self) -> usize {
        self.provenance.contributors.len()
    }
    fn redact(&mut self) {
        self.provenance.contributors.clear();
        self.provenance.first_seen = self.provenance.first_seen.map(day);
        self.last_seen = day(self.last_seen);
    }
}

impl Redacted for ToolMistake {
    fn users(&self) -> usize {
        self.provenance.contributors.len()
    }
    fn redact(&mut self) {
        self.provenance.contributors.clear();
        self.provenance.first_seen = self.provenance.first_seen.map(day);
        self.corrected_at = self.corrected_at.map(day);
        // Copies shared before the names went through the sanitizer: the shape rule.
        if self.changed_args.iter().any(|n| arg_name_is_data(n)) {
            self.changed_args.retain(|n| !arg_name_is_data(n));
            if self
                .correction
                .as_deref()
                .is_some_and(|c| c.starts_with("changed: "))
            {
                self.correction = Some(argument_names(&self.changed_args));
            }
        }
        // A structured copy shared before the names were recorded: its names were parsed
        // from the correction's text and may be values (hosts): not shown.
        if self.changed_args.is_empty()
            && self
                .correction
                .as_deref()
                .is_some_and(|c| c.starts_with("changed: "))
        {
            self.correction = Some(argument_names(&[]));
        }
    }
}

/// The user's own items (in the book's order), then the shared scope's, each redacted
/// ([`Redacted`]): by `later` (its `false` group first: exact matches before the ones
/// sharing a word), then those taught by more users first (one user alone can raise an
/// item's confidence and occurrences, not its count of users).
fn scoped<T: Clone + Redacted>(
    own: Vec<&T>,
    shared: Vec<&T>,
    later: impl Fn(&T) -> bool,
) -> Vec<Scoped<T>> {
    let mine = own.into_iter().map(|item| Scoped {
        scope: "private",
        users: None,
        item: item.clone(),
    });
    let mut theirs: Vec<(bool, Scoped<T>)> = shared
        .into_iter()
        .map(|item| {
            let group = later(item);
            let mut item = item.clone();
            let users = item.users();
            item.redact();
            let s = Scoped {
                scope: "shared",
                users: Some(users),
                item,
            };
            (group, s)
        })
        .collect();
    // Stable: the book's order (confidence, occurrences, fingerprint) among equals.
    theirs.sort_by_key(|(group, s)| (*group, std::cmp::Reverse(s.users)));
    mine.chain(theirs.into_iter().map(|(_, s)| s)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--help` says exact match first: a pattern of the exact symptom comes before one
    /// that shares a word, however many more users taught the second.
    #[test]
    fn shared_exact_matches_come_before_shared_words() {
        let p = |symptom: &str, users: &[&str]| InvestigationPattern {
            fingerprint: format!("{symptom}{}", users.len()),
            symptom_type: symptom.into(),
            provenance: patterns::Provenance {
                contributors: users.iter().map(|u| u.to_string()).collect(),
                first_seen: None,
            },
            ..InvestigationPattern::default()
        };
        let (a, b, c) = (
            p("checkout_latency", &["u1", "u2"]),
            p("checkout_latency_spike", &["u1", "u2", "u3"]),
            p("checkout_latency", &["u1"]),
        );
        let got = scoped(vec![], vec![&b, &c, &a], |x| {
            x.symptom_type != "checkout_latency"
        });
        let order: Vec<_> = got
            .iter()
            .map(|s| (s.item.symptom_type.as_str(), s.users))
            .collect();
        assert_eq!(
            order,
            [
                ("checkout_latency", Some(2)),
                ("checkout_latency", Some(1)),
                ("checkout_latency_spike", Some(3))
            ]
        );
    }

    #[test]
    fn a_shared_symptom_keeps_only_words_of_its_vocabulary() {
        assert_eq!(
            symptom_slug("orion_acquisition_ledger_stall"),
            "ledger_stall"
        );
        assert_eq!(
            symptom_slug("whitfield_acmecorp_billing_outage"),
            "billing_outage"
        );
        assert_eq!(
            symptom_slug("high_latency_checkout"),
            "high_latency_checkout"
        );
        assert_eq!(symptom_slug("dana_whitfield"), "unspecified");
        assert_eq!(symptom_slug("_db__outage_"), "db_outage");
    }

    #[test]
    fn corrections_keep_argument_names_and_no_values() {
        use serde_json::json;
        // A host without a dot, a person's name and a path, in the values of a call that
        // failed and then succeeded: the shared correction names the keys only (it was
        // parsed from the correction's text, and `target: acme-billing-db:5432` read as
        // an argument named `acme-billing-db`).
        let failed = json!({"target": "acme-billing-db:5432", "owner": "dana-whitfield:orders",
            "resource.type": "gce_instance"});
        let ok = json!({"target": "acme-billing-db-replica:5432", "owner": "dana-whitfield:orders",
            "resource.type": "k8s_container", "--namespace": "prod", "Dana Whitfield": 1});
        let names = crate::synth::patterns::changed_arg_names(Some(&failed), Some(&ok));
        assert_eq!(names, ["resource.type", "target"]);
        let shared = argument_names(&names);
        assert_eq!(shared, "changed: resource.type, target");
        let text = crate::synth::patterns::describe_args_diff(Some(&failed), Some(&ok)).unwrap();
        assert!(text.contains("acme-billing-db"), "{text}");
        let mut l = patterns::RunLearnings::default();
        l.mistakes.push(patterns::ToolMistake {
            tool: "query_db".into(),
            correction: Some(text),
            changed_args: names,
            ..Default::default()
        });
        let m = &structured(l).mistakes[0];
        assert_eq!(
            m.correction.as_deref(),
            Some("changed: resource.type, target")
        );
        // Learnings made before the names were recorded: no names, never the text.
        let mut old = patterns::RunLearnings::default();
        old.mistakes.push(patterns::ToolMistake {
            correction: Some("changed target from acme-billing-db:5432 to x:1".into()),
            ..Default::default()
        });
        assert_eq!(
            structured(old).mistakes[0].correction.as_deref(),
            Some("changed arguments")
        );
        // A copy shared before the names were recorded, its names parsed from the text
        // (a host among them): not shown to other users.
        let mut leaked = patterns::ToolMistake {
            correction: Some("changed: acme-billing-db, target".into()),
            ..Default::default()
        };
        leaked.redact();
        assert_eq!(leaked.correction.as_deref(), Some("changed arguments"));
        // A copy shared before its names went through the sanitizer: names shaped like
        // data (a key, an account number) are not shown; the others are.
        let mut leaked = patterns::ToolMistake {
            correction: Some(
                "changed: acct_55501324, sk_live_51hxyzabcdef12ghijkl34mn, timeout_ms".into(),
            ),
            changed_args: vec![
                "acct_55501324".into(),
                "sk_live_51hxyzabcdef12ghijkl34mn".into(),
                "timeout_ms".into(),
            ],
            ..Default::default()
        };
        leaked.redact();
        assert_eq!(leaked.changed_args, ["timeout_ms"]);
        assert_eq!(leaked.correction.as_deref(), Some("changed: timeout_ms"));
        // Before sharing: what the sanitizer changes goes too (a word of a listed name).
        let s = Sanitizer::new(SanitizeContext {
            names: vec!["Dana Whitfield".into()],
            ..Default::default()
        });
        let names =
            ["whitfield", "resource.type", "x_3f9a0c1b2d4e5f60718293a4b5"].map(String::from);
        assert_eq!(
            crate::synth::sanitize::shareable_arg_names(&s, &names),
            ["resource.type"]
        );
        assert_eq!(
            category("connection_leak_after_deploy", ROOT_CAUSES, "unknown"),
            "database"
        );
    }
}
