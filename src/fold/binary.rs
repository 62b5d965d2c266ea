//! The compact binary form of a [`State`]: the body of a checkpoint (format version 2,
//! see [`crate::fold::checkpoint`]), before zstd.
//!
//! A state's bulk is regular: per subject a list of seqs, per hypothesis a seq, an agent, a
//! subject and a confidence, names repeated hundreds of thousands of times. JSON spells
//! every name and every seq out in full and is parsed character by character; here each
//! name is written once in a table and referred to by its index, seq lists are deltas,
//! and all integers are LEB128 varints, so the body is a fraction of the JSON and decodes
//! without a parser. The kept events (each subject's latest entry, decisions, actions,
//! summaries) and the rules other than their per-subject table are irregular, small in
//! number, and stay canonical JSON inside it.
//!
//! ```text
//! body     := names state                       (nothing may follow)
//! names    := n, n × str                        every agent, user and subject name, once
//! state    := str(run_id) v(head_seq) opt(head_ts) counts
//!             n × agent      agent   := name counts v(first_seq) v(last_seq) v(last_ts)
//!             n × user       user    := name v(entries)
//!             n × subject    subject := name seqs(seqs) seqs(hypotheses)
//!                                       n × (name v(entries)) json(latest)
//!             n × hypo       hypo    := v(seq − previous hypothesis seq) name optname
//!                                       f64(confidence) seqs(support)
//!             n × json(decision) n × json(action) n × json(summary)
//!             n × subjrule   subjrule := name v(latest_seq) standing opt(blocked_by)
//!             json(the other rules, as `Rules` with no subjects)
//! counts   := v(total) n × (str(type) v(count))
//! standing := 0 | 1 v(seq) name str(norm)
//! seqs     := n, n × v(seq − previous seq, from 0)
//! name     := v(index in names); optname := 0 | 1 + index
//! opt(x)   := 0 | 1 v(x)
//! v        := unsigned LEB128 (≤ 10 bytes); n := v, a count; f64 := 8 bytes LE
//! str      := v(len) UTF-8 bytes; json := str holding compact JSON
//! ```
//!
//! Every map is written in its order, so the same state gives the same bytes. The decoder
//! bounds every count by the bytes left, never allocates more than the body holds, and
//! refuses anything malformed (checksums are the container's; this is the second line).

use std::collections::{BTreeMap, HashMap};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::event::ts::Ts;
use crate::event::EventType;
use crate::fold::rules::{Rules, Standing, SubjectRules};
use crate::fold::state::{AgentState, Counts, HypothesisInfo, State, SubjectState};
use crate::query::index::format::Cursor;

/// Encodes `state`.
pub(crate) fn encode(state: &State) -> Vec<u8> {
    // Every field is named, so a field added to `State` fails to compile here until it is
    // given a place in the format (and the format version is bumped); fields of the
    // inner structs are checked by the round-trip test.
    let State {
        run_id,
        head_seq,
        head_ts,
        counts,
        agents,
        users,
        subjects,
        decisions,
        actions,
        hypotheses,
        summaries,
        rules,
    } = state;
    let mut w = Writer::default();
    w.str(run_id);
    w.v(*head_seq);
    w.opt(head_ts.map(|t| t.0));
    w.counts(counts);
    w.v(agents.len() as u64);
    for (name, a) in agents {
        w.name(name);
        w.counts(&a.counts);
        w.v(a.first_seq);
        w.v(a.last_seq);
        w.v(a.last_ts.0);
    }
    w.v(users.len() as u64);
    for (name, n) in users {
        w.name(name);
        w.v(*n);
    }
    w.v(subjects.len() as u64);
    for (name, s) in subjects {
        w.name(name);
        w.seqs(&s.seqs);
        w.seqs(&s.hypotheses);
        w.v(s.agents.len() as u64);
        for (agent, n) in &s.agents {
            w.name(agent);
            w.v(*n);
        }
        w.json(&s.latest);
    }
    w.v(hypotheses.len() as u64);
    let mut prev = 0;
    for (seq, h) in hypotheses {
        let HypothesisInfo {
            agent,
            subject,
            confidence,
            support,
        } = h;
        w.v(seq.wrapping_sub(prev));
        prev = *seq;
        w.name(agent);
        match subject {
            None => w.v(0),
            Some(s) => {
                let i = w.index(s);
                w.v(u64::from(i) + 1);
            }
        }
        w.body.extend_from_slice(&confidence.to_le_bytes());
        w.seqs(support);
    }
    for list in [decisions, actions, summaries] {
        w.v(list.len() as u64);
        for e in list {
            w.json(e);
        }
    }
    w.v(rules.subjects.len() as u64);
    for (name, r) in &rules.subjects {
        let SubjectRules {
            latest_seq,
            standing,
            blocked_by,
        } = r;
        w.name(name);
        w.v(*latest_seq);
        match standing {
            None => w.v(0),
            Some(Standing { seq, agent, norm }) => {
                w.v(1);
                w.v(*seq);
                w.name(agent);
                w.str(norm);
            }
        }
        w.opt(*blocked_by);
    }
    w.json(&Rules {
        subjects: BTreeMap::new(),
        ..rules.clone()
    });
    let mut out = Vec::with_capacity(w.body.len() + 16 * w.names.len());
    put_v(&mut out, w.names.len() as u64);
    for n in &w.names {
        put_v(&mut out, n.len() as u64);
        out.extend_from_slice(n.as_bytes());
    }
    out.extend_from_slice(&w.body);
    out
}

/// Decodes a body written by [`encode`]; the reason when it is not one.
pub(crate) fn decode(body: &[u8]) -> Result<State, String> {
    let mut r = Reader(Cursor { b: body, at: 0 });
    let n = r.count(1)?;
    let mut names = Vec::with_capacity(n);
    for _ in 0..n {
        names.push(r.str()?);
    }
    let name = |r: &mut Reader<'_>| -> Result<String, String> {
        let i = r.v()?;
        names
            .get(i as usize)
            .map(|s| s.to_string())
            .ok_or_else(|| format!("name index {i} out of {} names", names.len()))
    };
    let run_id = r.str()?.to_string();
    let head_seq = r.v()?;
    let head_ts = r.opt()?.map(Ts);
    let counts = r.counts()?;
    let n = r.count(5)?;
    let mut agents = Vec::with_capacity(n);
    for _ in 0..n {
        let k = name(&mut r)?;
        agents.push((
            k,
            AgentState {
                counts: r.counts()?,
                first_seq: r.v()?,
                last_seq: r.v()?,
                last_ts: Ts(r.v()?),
            },
        ));
    }
    let n = r.count(2)?;
    let mut users = Vec::with_capacity(n);
    for _ in 0..n {
        users.push((name(&mut r)?, r.v()?));
    }
    let n = r.count(5)?;
    let mut subjects = Vec::with_capacity(n);
    for _ in 0..n {
        let k = name(&mut r)?;
        let seqs = r.seqs()?;
        let hypotheses = r.seqs()?;
        let m = r.count(2)?;
        let mut agents = Vec::with_capacity(m);
        for _ in 0..m {
            agents.push((name(&mut r)?, r.v()?));
        }
        subjects.push((
            k,
            SubjectState {
                seqs,
                latest: r.json()?,
                hypotheses,
                agents: agents.into_iter().collect(),
            },
        ));
    }
    let n = r.count(12)?;
    let mut hypotheses = Vec::with_capacity(n);
    let mut seq = 0u64;
    for _ in 0..n {
        seq = seq.checked_add(r.v()?).ok_or("hypothesis seq overflows")?;
        let agent = name(&mut r)?;
        let subject = match r.v()? {
            0 => None,
            i => Some(
                names
                    .get((i - 1) as usize)
                    .ok_or_else(|| format!("name index {} out of range", i - 1))?
                    .to_string(),
            ),
        };
        let confidence = f64::from_le_bytes(r.array()?);
        hypotheses.push((
            seq,
            HypothesisInfo {
                agent,
                subject,
                confidence,
                support: r.seqs()?,
            },
        ));
    }
    let mut lists = [Vec::new(), Vec::new(), Vec::new()];
    for list in &mut lists {
        let n = r.count(1)?;
        list.reserve(n);
        for _ in 0..n {
            list.push(r.json()?);
        }
    }
    let [decisions, actions, summaries] = lists;
    let n = r.count(4)?;
    let mut subject_rules = Vec::with_capacity(n);
    for _ in 0..n {
        let k = name(&mut r)?;
        let latest_seq = r.v()?;
        let standing = match r.v()? {
            0 => None,
            1 => Some(Standing {
                seq: r.v()?,
                agent: name(&mut r)?,
                norm: r.str()?.to_string(),
            }),
            t => return Err(format!("standing tag {t}")),
        };
        subject_rules.push((
            k,
            SubjectRules {
                latest_seq,
                standing,
                blocked_by: r.opt()?,
            },
        ));
    }
    let mut rules: Rules = r.json()?;
    if !rules.subjects.is_empty() {
        return Err("rules hold subjects outside their table".into());
    }
    rules.subjects = subject_rules.into_iter().collect();
    if r.at() != body.len() {
        return Err(format!("{} bytes after the state", body.len() - r.at()));
    }
    Ok(State {
        run_id,
        head_seq,
        head_ts,
        counts,
        // Written in map order: collecting sorted pairs builds each map in one pass.
        agents: agents.into_iter().collect(),
        users: users.into_iter().collect(),
        subjects: subjects.into_iter().collect(),
        decisions,
        actions,
        hypotheses: hypotheses.into_iter().collect(),
        summaries,
        rules,
    })
}

fn put_v(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The encoder: the body, and the names table it refers to (written before it).
#[derive(Default)]
struct Writer<'s> {
    body: Vec<u8>,
    names: Vec<&'s str>,
    index: HashMap<&'s str, u32>,
}

impl<'s> Writer<'s> {
    fn v(&mut self, v: u64) {
        put_v(&mut self.body, v);
    }

    fn opt(&mut self, v: Option<u64>) {
        match v {
            None => self.v(0),
            Some(v) => {
                self.v(1);
                self.v(v);
            }
        }
    }

    fn str(&mut self, s: &str) {
        self.v(s.len() as u64);
        self.body.extend_from_slice(s.as_bytes());
    }

    fn json(&mut self, v: &impl Serialize) {
        // Serializing plain maps, vectors, strings and numbers cannot fail.
        let j = serde_json::to_vec(v).unwrap_or_default();
        self.v(j.len() as u64);
        self.body.extend_from_slice(&j);
    }

    fn index(&mut self, s: &'s str) -> u32 {
        let next = self.names.len() as u32;
        let i = *self.index.entry(s).or_insert(next);
        if i == next {
            self.names.push(s);
        }
        i
    }

    fn name(&mut self, s: &'s str) {
        let i = self.index(s);
        self.v(u64::from(i));
    }

    fn seqs(&mut self, seqs: &[u64]) {
        self.v(seqs.len() as u64);
        let mut prev = 0;
        for &s in seqs {
            self.v(s.wrapping_sub(prev));
            prev = s;
        }
    }

    fn counts(&mut self, c: &Counts) {
        self.v(c.total);
        self.v(c.by_type.len() as u64);
        for (k, n) in &c.by_type {
            self.str(k.as_str());
            self.v(*n);
        }
    }
}

/// The decoder: the index files' bounds-checked cursor, with this format's reads.
struct Reader<'a>(Cursor<'a>);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        self.0.bytes(n)
    }

    fn at(&self) -> usize {
        self.0.at
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn v(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let [b] = self.array::<1>()?;
            let part = u64::from(b & 0x7f);
            if shift == 63 && part > 1 {
                return Err(format!("varint overflows at byte {}", self.at()));
            }
            v |= part << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!("varint longer than 10 bytes at byte {}", self.at()))
    }

    fn opt(&mut self) -> Result<Option<u64>, String> {
        match self.v()? {
            0 => Ok(None),
            1 => Ok(Some(self.v()?)),
            t => Err(format!("option tag {t} at byte {}", self.at())),
        }
    }

    /// A count of items that take at least `min_bytes` each: never more than the bytes
    /// left allow, so a damaged count cannot make the decoder allocate.
    fn count(&mut self, min_bytes: usize) -> Result<usize, String> {
        let n = self.v()?;
        let left = (self.0.b.len() - self.at()) / min_bytes;
        if n > left as u64 {
            return Err(format!("count {n} at byte {} exceeds the body", self.at()));
        }
        Ok(n as usize)
    }

    fn str(&mut self) -> Result<&'a str, String> {
        let n = self.count(1)?;
        let at = self.at();
        std::str::from_utf8(self.take(n)?).map_err(|e| format!("bad UTF-8 at byte {at}: {e}"))
    }

    fn json<T: DeserializeOwned>(&mut self) -> Result<T, String> {
        let at = self.at();
        let s = self.str()?;
        serde_json::from_str(s).map_err(|e| format!("bad JSON at byte {at}: {e}"))
    }

    fn seqs(&mut self) -> Result<Vec<u64>, String> {
        let n = self.count(1)?;
        let mut out = Vec::with_capacity(n);
        let mut prev = 0u64;
        for _ in 0..n {
            prev = prev
                .checked_add(self.v()?)
                .ok_or_else(|| format!("seq overflows at byte {}", self.at()))?;
            out.push(prev);
        }
        Ok(out)
    }

    fn counts(&mut self) -> Result<Counts, String> {
        let total = self.v()?;
        let n = self.count(2)?;
        let mut by_type = BTreeMap::new();
        for _ in 0..n {
            let name = self.str()?;
            let kind =
                EventType::parse(name).ok_or_else(|| format!("unknown entry type {name:?}"))?;
            by_type.insert(kind, self.v()?);
        }
        Ok(Counts { total, by_type })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Event;
    use serde_json::json;

    /// An event of the fold's tests, with an object content, a confidence, refs and a
    /// session.
    fn ev(seq: u64, agent: &str, kind: EventType, subject: Option<&str>) -> Event {
        let mut e = crate::fold::state::tests::ev(seq, agent, kind, subject);
        e.content = json!({"text": format!("c{seq}"), "n": [seq, 1.5, null]});
        e.confidence = Some(0.25 * (seq % 4) as f64);
        e.refs = (1..seq).rev().take(2).collect();
        e.session_id = Some("s-1".into());
        e
    }

    fn sample(events: u64) -> State {
        let mut s = State::new("r");
        let kinds = EventType::ALL;
        for seq in 1..=events {
            let subject = (seq % 7 != 0).then(|| format!("svc-ü-{}", seq % 5));
            s.apply(&ev(
                seq,
                &format!("agent-{}", seq % 3),
                kinds[(seq % 4) as usize],
                subject.as_deref(),
            ));
        }
        s.rules.pruned_upto = 17;
        s.rules
            .subjects
            .entry("svc-ü-1".into())
            .or_default()
            .blocked_by = Some(9);
        s
    }

    #[test]
    fn roundtrip_is_exact_and_deterministic() {
        let s = sample(200);
        let b = encode(&s);
        let back = decode(&b).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.to_bytes(), s.to_bytes());
        assert_eq!(encode(&back), b);
        assert_eq!(decode(&encode(&State::new("x"))).unwrap(), State::new("x"));
        assert!(
            b.len() < s.to_bytes().len(),
            "binary {} vs JSON {}",
            b.len(),
            s.to_bytes().len()
        );
    }

    #[test]
    fn damage_is_refused_never_a_panic() {
        let b = encode(&sample(24));
        for cut in 0..b.len() {
            assert!(decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = b.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
        // Bit flips: decoded or refused, never a panic or an allocation past the body.
        for i in 0..b.len() {
            for bit in [0x01u8, 0x80] {
                let mut x = b.clone();
                x[i] ^= bit;
                let _ = decode(&x);
            }
        }
        assert!(decode(&[0xff; 11]).is_err());
        assert!(decode(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x7f]).is_err());
    }
}
