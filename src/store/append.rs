//! The append path of [`Store`]: a client's batch is checked (`check_batch`), passes the
//! archive gate, goes to the run's committer (`store::handoff`) or this process's writer,
//! and is followed by an automatic checkpoint or prune when one is due.

use std::collections::HashMap;
use std::sync::Arc;

use crate::commit::{Request, RunLog};
use crate::error::{Error, Result};
use crate::event::{
    check_run_id, Checked, Event, EventType, NewEvent, BATCH_EVENTS_MAX, ENGINE_AGENT,
};
use crate::log::meta::{self, Durability};
use crate::query::options::ReadOptions;
use crate::store::Store;

/// A batch `check_batch` accepted, on its way to the writer.
pub(crate) struct CheckedBatch {
    pub events: Vec<Checked>,
    pub expect_seq: Option<u64>,
    /// Each event's encoded JSON tail ([`Checked::encode_tail`]) when the appending
    /// thread encoded them already (a committer's own appends: `store::handoff`), so
    /// that the committing thread, which every append of the run waits on, does not;
    /// empty otherwise.
    pub tails: Vec<Vec<u8>>,
}

impl CheckedBatch {
    pub(crate) fn new(events: Vec<Checked>, expect_seq: Option<u64>) -> CheckedBatch {
        CheckedBatch {
            events,
            expect_seq,
            tails: Vec::new(),
        }
    }
}

impl Store {
    /// Appends one event. With `ev.expect_seq` it is a compare-and-swap on the run's
    /// last seq. Creates the run if it does not exist.
    pub fn append(&self, run: &str, ev: NewEvent, durability: Durability) -> Result<Event> {
        let expect = ev.expect_seq;
        // The first stored event is the caller's; engine events (an escalation) may follow.
        let v = self.append_batch(run, vec![ev], expect, durability)?;
        v.into_iter()
            .next()
            .ok_or_else(|| Error::invalid("batch", "no event stored"))
    }

    /// Appends events as one atomic batch: all are stored, with consecutive seqs, or none.
    /// `expect_seq` applies to the batch; the events' own `expect_seq` must be absent or
    /// equal to it.
    pub fn append_batch(
        &self,
        run: &str,
        events: Vec<NewEvent>,
        expect_seq: Option<u64>,
        durability: Durability,
    ) -> Result<Vec<Event>> {
        let agents = writers(&events);
        let batch = self.check_batch(run, events, expect_seq)?;
        let stored = self.append_checked(run, batch, expect_seq, durability)?;
        Ok(self.shown_to_writers(run, &agents, stored))
    }

    /// The stored events of a batch as its agents may see them: an event of the
    /// engine's that the append caused (an escalation quotes the decisions it is
    /// between) only when every agent of the batch may read it, as a read of theirs
    /// would show it. The append has happened: this never fails (when the rules cannot
    /// be read, the engine's events are left out).
    fn shown_to_writers(&self, run: &str, agents: &[String], stored: Vec<Event>) -> Vec<Event> {
        if !stored.iter().any(|e| e.agent_id == ENGINE_AGENT) {
            return stored;
        }
        let head = self.head_state(run).ok();
        stored
            .into_iter()
            .filter(|e| {
                e.agent_id != ENGINE_AGENT
                    || head
                        .as_ref()
                        .is_some_and(|h| agents.iter().all(|a| h.state.rules.may_read_event(a, e)))
            })
            .collect()
    }

    /// Appends several independent atomic batches to one run, each as
    /// [`Store::append_batch`] would, with one outcome each, in order: one refused does
    /// not refuse the others. They share one write and one fsync, made by the calling
    /// thread (a server commits the requests that queued during its last commit this
    /// way). `batches`: each batch's events and `expect_seq`.
    pub fn append_many(
        &self,
        run: &str,
        batches: Vec<(Vec<NewEvent>, Option<u64>)>,
        durability: Durability,
    ) -> Vec<Result<Vec<Event>>> {
        let agents: Vec<Vec<String>> = batches.iter().map(|(events, _)| writers(events)).collect();
        let checked: Vec<Result<CheckedBatch>> = batches
            .into_iter()
            .map(|(events, expect)| {
                Ok(CheckedBatch::new(
                    self.check_batch(run, events, expect)?,
                    expect,
                ))
            })
            .collect();
        self.append_many_checked(run, checked, durability)
            .into_iter()
            .zip(agents)
            .map(|(r, agents)| r.map(|stored| self.shown_to_writers(run, &agents, stored)))
            .collect()
    }

    /// [`Store::append_many`] of checked batches (a committer's queue,
    /// `store::handoff`).
    pub(crate) fn append_many_checked(
        &self,
        run: &str,
        checked: Vec<Result<CheckedBatch>>,
        durability: Durability,
    ) -> Vec<Result<Vec<Event>>> {
        // (`check_batch` refused the engine's logs already: no batch to show the gate.)
        let Ok(log) = self
            .append_gate(run, &[])
            .and_then(|()| self.writer(run, &self.user))
        else {
            // Each batch on its own then, to get its own error.
            return checked
                .into_iter()
                .map(|c| {
                    c.and_then(|b| self.append_checked(run, b.events, b.expect_seq, durability))
                })
                .collect();
        };
        let mut out: Vec<Option<Result<Vec<Event>>>> = Vec::with_capacity(checked.len());
        let mut reqs = Vec::new();
        // Retries (every event with its id), kept in case the run turns out archived
        // (closed by another process since this one cached its writer).
        let mut retries: Vec<Option<Vec<Checked>>> = Vec::new();
        for c in checked {
            match c {
                Ok(CheckedBatch {
                    events: batch,
                    expect_seq: expect,
                    tails,
                }) => {
                    // A handed batch's generated ids make it no retry: looking for it in
                    // an archive (a full read) is the recovery's, done directly.
                    let retry = batch.iter().all(|c| {
                        c.id.as_deref()
                            .is_some_and(|id| !id.starts_with(crate::event::GENERATED_ID_PREFIX))
                    });
                    retries.push(retry.then(|| batch.clone()));
                    let mut req = Request::new(batch, expect, durability);
                    // (Empty: encoded by the writer, `RunLog::append_many`.)
                    req.tails = tails;
                    reqs.push(req);
                    out.push(None);
                }
                Err(e) => out.push(Some(Err(e))),
            }
        }
        let mut stored = log.append_many(reqs).into_iter().zip(retries);
        let out: Vec<Result<Vec<Event>>> = out
            .into_iter()
            .map(|o| match o {
                Some(refused) => refused,
                None => match stored.next() {
                    Some((r, Some(batch))) => self.or_stored_in_archive(run, r, &batch),
                    Some((r, _)) => r,
                    None => Err(Error::invalid("batch", "append result lost")),
                },
            })
            .collect();
        for events in out.iter().flatten() {
            self.maybe_checkpoint(&log, run, events);
        }
        self.after_append(&log, run);
        out
    }

    /// Checks a client's batch for `run`: the run id, the size, the user, `expect_seq`,
    /// every event, and (on a run that does not exist yet) its refs.
    pub(super) fn check_batch(
        &self,
        run: &str,
        events: Vec<NewEvent>,
        expect_seq: Option<u64>,
    ) -> Result<Vec<Checked>> {
        check_run_id(run)?;
        if run.starts_with('@') {
            return Err(Error::Forbidden(format!(
                "run ids starting with '@' ({run:?}) are the engine's own logs (facts, patterns); clients cannot append to them"
            )));
        }
        if events.is_empty() {
            return Err(Error::invalid("batch", "no events"));
        }
        if events.len() > BATCH_EVENTS_MAX {
            return Err(Error::invalid(
                "batch",
                format!("{} events, limit {BATCH_EVENTS_MAX}", events.len()),
            ));
        }
        let mut batch = Vec::with_capacity(events.len());
        for (i, mut e) in events.into_iter().enumerate() {
            match &e.user_id {
                None => e.user_id = Some(self.user.clone()),
                Some(u) if *u != self.user => {
                    return Err(Error::Forbidden(format!(
                        "event {i} names user {u:?} but the caller is {:?}",
                        self.user
                    )))
                }
                Some(_) => {}
            }
            if e.expect_seq.is_some() && e.expect_seq != expect_seq {
                return Err(Error::invalid(
                    "expect_seq",
                    format!("event {i} of the batch has its own; give it once, for the batch"),
                ));
            }
            batch.push(e.check().map_err(|err| match err {
                Error::Invalid { field, reason } if i > 0 => Error::Invalid {
                    field: format!("[{i}].{field}"),
                    reason,
                },
                other => other,
            })?);
        }
        self.refuse_on_new_run(run, &batch, expect_seq)?;
        Ok(batch)
    }

    /// Appends validated events (client or engine) as one atomic batch.
    pub(crate) fn append_checked(
        &self,
        run: &str,
        batch: Vec<Checked>,
        expect_seq: Option<u64>,
        durability: Durability,
    ) -> Result<Vec<Event>> {
        // A retry (every event with its id) may come after the run was closed and
        // archived: it gets the stored events, as before the close. Kept only for batches
        // that carry ids, and used only when the run turns out archived.
        let retry = batch.iter().all(|c| c.id.is_some()).then(|| batch.clone());
        let r = match durability {
            // Another process may commit this run's durable appends (`store::handoff`).
            Durability::Sync => match self.hand_off(run, batch, expect_seq) {
                Ok(r) => r,
                Err(batch) => self.append_direct(run, batch, expect_seq, durability),
            },
            _ => self.append_direct(run, batch, expect_seq, durability),
        };
        match retry {
            Some(batch) => self.or_stored_in_archive(run, r, &batch),
            None => r,
        }
    }

    /// `r`, but a refusal because the run is closed and archived becomes the stored
    /// events when every event of `batch` (by id) is in the archive: a retry, or a
    /// recovered hand-off, of a batch stored before the close.
    fn or_stored_in_archive(
        &self,
        run: &str,
        r: Result<Vec<Event>>,
        batch: &[Checked],
    ) -> Result<Vec<Event>> {
        match r {
            Err(Error::Forbidden(why)) => match self.stored_in_archive(run, batch)? {
                Some(stored) => Ok(stored),
                None => Err(Error::Forbidden(why)),
            },
            r => r,
        }
    }

    /// Appends through this process's own writer.
    pub(super) fn append_direct(
        &self,
        run: &str,
        batch: Vec<Checked>,
        expect_seq: Option<u64>,
        durability: Durability,
    ) -> Result<Vec<Event>> {
        self.append_request(run, Request::new(batch, expect_seq, durability))
    }

    /// A handed-off batch whose answer was lost: appended through this process's writer,
    /// which first returns it if the committer stored it (every event has an id). If the
    /// run was closed and archived since, the committer may have stored it first: then
    /// the archive holds its ids (generated ones included).
    pub(super) fn append_recovered(
        &self,
        run: &str,
        batch: Vec<Checked>,
        expect_seq: Option<u64>,
        since: u64,
    ) -> Result<Vec<Event>> {
        let ids = batch.clone();
        let mut req = Request::new(batch, expect_seq, Durability::Sync);
        req.recover_since = Some(since);
        let r = self.append_request(run, req);
        self.or_stored_in_archive(run, r, &ids)
    }

    pub(super) fn append_request(&self, run: &str, req: Request) -> Result<Vec<Event>> {
        self.append_gate(run, &req.batch)?;
        let log = self.writer(run, &self.user)?;
        let stored = log.append(req)?;
        self.maybe_checkpoint(&log, run, &stored);
        self.after_append(&log, run);
        Ok(stored)
    }

    /// The same store sharing this one's writers, appending only directly: a committer
    /// serves other processes through it (`store::handoff`).
    pub(super) fn committing_store(&self) -> Store {
        let mut s = self.same_config();
        s.logs = self.logs.clone();
        s
    }

    /// The stored events of a retried batch on an archived run: `Some` when every id of
    /// `batch` is in the archive with the same event (a different one is a conflict, as
    /// on an open run); `None` when the run is not archived or an id is not stored.
    pub(super) fn stored_in_archive(
        &self,
        run: &str,
        batch: &[Checked],
    ) -> Result<Option<Vec<Event>>> {
        let Some(archive) = self.archived_store(run)? else {
            return Ok(None);
        };
        let want: HashMap<&str, usize> = batch
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.id.as_deref().map(|id| (id, i)))
            .collect();
        let mut found: Vec<Option<Event>> = vec![None; batch.len()];
        for e in archive.read(run, ReadOptions::default())? {
            let e = e?;
            if let Some(&i) = want.get(e.id.as_str()) {
                found[i] = Some(e);
            }
        }
        let Some(stored) = found.into_iter().collect::<Option<Vec<Event>>>() else {
            return Ok(None);
        };
        for (asked, e) in batch.iter().zip(&stored) {
            if let Some(field) = asked.differs_from(e) {
                return Err(Error::Conflict(format!(
                    "id {:?} is already stored in closed run {run:?} with a different {field}; \
                     a retry must carry the same event",
                    e.id
                )));
            }
        }
        Ok(Some(stored))
    }

    /// Refuses appends to an archived run, and anything but the synthesizer's events in
    /// the engine's own logs.
    pub(super) fn append_gate(&self, run: &str, batch: &[Checked]) -> Result<()> {
        // A run this process writes already is checked under its `LOCK`, once a write
        // group (`RunLog::write_group_locked`); the first append here says where the
        // archive is.
        let cached = self
            .logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .runs
            .contains_key(run);
        if !cached {
            if let Some(p) = self.archived(run)? {
                return Err(Error::Forbidden(format!(
                    "run {run:?} is closed and archived at {}",
                    self.shown_path(&p)
                )));
            }
        }
        // The engine's own logs take only the synthesizer's events: no policy, channel,
        // summary or close can be written into a facts log.
        if run.starts_with('@')
            && batch.iter().any(|c| {
                !matches!(
                    c.kind,
                    EventType::SynthBegin | EventType::Synth | EventType::SynthCommit
                )
            })
        {
            return Err(Error::Forbidden(format!(
                "{run:?} is an engine log (facts, patterns); only the synthesizer writes it"
            )));
        }
        Ok(())
    }

    /// After an append: starts an automatic prune when one is due.
    pub(super) fn after_append(&self, log: &Arc<RunLog>, run: &str) {
        if log.claim_prune() {
            // Off the append path, with the built-in summariser; a concurrent pruner in
            // another process makes this one fail its CAS harmlessly. Through this
            // store's writers: the summary's own append then finds this prune running
            // and starts none of its own (with writers of its own it started one that
            // nobody waited for, and a process that exited then left that summary
            // written past the durable mark: `Store::wait_background`).
            let mut store = self.same_config();
            store.logs = self.logs.clone();
            let run_id = run.to_string();
            let log = log.clone();
            let spawned = std::thread::Builder::new()
                .name("swarm-prune".into())
                .spawn(move || {
                    let r = store.prune_as(&run_id, ENGINE_AGENT, &crate::fold::summary::Builtin, false);
                    match r {
                        // Another process's pruner summarised the range first: expected.
                        Err(Error::Conflict(e)) => tracing::debug!(run = %run_id, error = %e, "automatic prune lost the race"),
                        Err(e) => tracing::warn!(run = %run_id, error = %e, "automatic prune failed"),
                        Ok(_) => {}
                    }
                    log.release_prune();
                });
            if let Err(e) = spawned {
                tracing::warn!(run, error = %e, "cannot start the prune thread");
            }
        }
    }

    /// Refuses, before the run is created, a request that cannot succeed on an empty run
    /// (an `expect_seq` other than 0, a ref to a seq it would not have), so that a
    /// refused append never leaves a new empty run behind. The writer checks again under
    /// the lock; if another process creates the run meanwhile, the refusal still
    /// describes the run as it was when checked.
    pub(super) fn refuse_on_new_run(
        &self,
        run: &str,
        batch: &[Checked],
        expect_seq: Option<u64>,
    ) -> Result<()> {
        let cached = self
            .logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .runs
            .contains_key(run);
        if cached
            || self.hands_off(run)
            || self
                .storage
                .exists(&self.run_dir(run)?.join(meta::META_FILE))
        {
            return Ok(());
        }
        if let Some(expected) = expect_seq.filter(|&e| e != 0) {
            return Err(Error::SeqConflict {
                run: run.to_string(),
                expected,
                actual: 0,
            });
        }
        for (i, e) in batch.iter().enumerate() {
            let seq = i as u64 + 1;
            if let Some(bad) = e.refs.iter().find(|&&x| x == 0 || x >= seq) {
                return Err(Error::invalid(
                    "refs",
                    format!("seq {bad} does not name an earlier event (this one gets seq {seq})"),
                ));
            }
        }
        Ok(())
    }
}

/// The agents a batch writes as, once each.
fn writers(events: &[NewEvent]) -> Vec<String> {
    let mut agents: Vec<String> = events.iter().map(|e| e.agent_id.clone()).collect();
    agents.sort_unstable();
    agents.dedup();
    agents
}
