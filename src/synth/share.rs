//! The shared scope (seed 002): what a user's synthesis copies to every other user
//! (sanitized patterns and mistakes), and the pattern books and advice read back from the
//! user's own scope and the shared one.

use serde::Serialize;

use crate::error::{Error, Result};
use crate::event::{EventType, SHARED_USER};
use crate::log::meta::Durability;
use crate::query::options::ReadOptions;
use crate::store::Store;
use crate::synth::driver::{
    engine_event, sanitize_learnings, to_value, SynthOptions, LEARNED_SUBJECT, SHARED_RUN,
};
use crate::synth::facts::{FactsFold, Record, FACTS_RUN};
use crate::synth::patterns::{self, InvestigationPattern, PatternBook, ToolMistake};
use crate::synth::sanitize::{SanitizeContext, Sanitizer};

fn fnv(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// A pattern or mistake with the scope it comes from.
#[derive(Clone, Debug, Serialize)]
pub struct Scoped<T> {
    /// `private` (the user's own runs) or `shared` (sanitized, from every user).
    pub scope: &'static str,
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
        let shared = self.shared_store();
        let mut n = 0;
        for (run, l) in items {
            let s = Sanitizer::new(self.sanitize_context(&run, opts)?);
            let mut clean = sanitize_learnings(&s, l);
            let h = fnv(&[self.user(), &run]);
            // The run id stays with its user: the shared copy names an opaque hash.
            clean.run_id = format!("r{h:016x}");
            let rec = Record::Learned {
                run: format!("r{h:016x}"),
                learnings: Box::new(clean),
                shared: None,
            };
            let mut ev = engine_event(
                SHARED_USER,
                EventType::Synth,
                Some(LEARNED_SUBJECT.to_string()),
                to_value(&rec)?,
            );
            ev.id = Some(format!("shared-{h:016x}"));
            shared.append_checked(SHARED_RUN, vec![ev], None, Durability::Sync)?;
            n += 1;
        }
        Ok(n)
    }

    /// What the sanitizer must redact for a run of this user: the user id and the run id
    /// (agent ids are not: they are role names such as `metrics` that also occur in tool
    /// names), the project ids and environment names given.
    pub(crate) fn sanitize_context(
        &self,
        run: &str,
        opts: &SynthOptions,
    ) -> Result<SanitizeContext> {
        Ok(SanitizeContext {
            user_id: self.user().to_string(),
            identifiers: vec![run.to_string()],
            project_ids: opts.project_ids.clone(),
            env_names: opts.env_names.clone(),
        })
    }

    /// The shared scope's pattern book (sanitized learnings of every user).
    pub fn shared_book(&self) -> Result<PatternBook> {
        let shared = self.shared_store();
        let mut fold = FactsFold::new(None);
        match shared.read(SHARED_RUN, ReadOptions::default()) {
            Ok(it) => {
                for e in it {
                    fold.apply(&e?);
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
        let mut book = PatternBook::default();
        let committed = match self.committed_passes() {
            Ok(c) => c,
            Err(Error::RunNotFound(_)) => return Ok(book),
            Err(e) => return Err(e),
        };
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
                book.merge_run(&learnings);
            }
        }
        Ok(book)
    }

    /// Proven investigation patterns for a symptom: the user's own first, then the
    /// shared scope's (seed 002's `get_recommended_investigation_strategy`).
    pub fn patterns(&self, symptom: &str) -> Result<Vec<Scoped<InvestigationPattern>>> {
        let (own, shared) = (self.own_book()?, self.shared_book()?);
        Ok(scoped(own.recommend(symptom), shared.recommend(symptom)))
    }

    /// Known mistakes of a tool, before calling it: the user's own, then the shared
    /// scope's (seed 002's `MistakeAdvisor`).
    pub fn advise(&self, tool: &str) -> Result<Vec<Scoped<ToolMistake>>> {
        let (own, shared) = (self.own_book()?, self.shared_book()?);
        Ok(scoped(own.advise(tool), shared.advise(tool)))
    }
}

/// The user's own items, then the shared scope's.
fn scoped<T: Clone>(own: Vec<&T>, shared: Vec<&T>) -> Vec<Scoped<T>> {
    let tag = |scope: &'static str| {
        move |item: &T| Scoped {
            scope,
            item: item.clone(),
        }
    };
    own.into_iter()
        .map(tag("private"))
        .chain(shared.into_iter().map(tag("shared")))
        .collect()
}
