//! Channel values after random concurrent writes equal a plain model's fold of the
//! writes in log order, and every refused `reject` write left exactly one conflict event.

use std::sync::Arc;

use proptest::prelude::*;
use serde_json::{json, Value};
use swarm_memory::fold::rules::{ChannelDecl, ChannelKind, ConflictPolicy};
use swarm_memory::{Error, MemStorage, ReadOptions, Storage, Store};

fn patch(t: &mut Value, p: &Value) {
    // RFC 7396, written independently of the engine's.
    if let Value::Object(po) = p {
        if !t.is_object() {
            *t = json!({});
        }
        let to = t.as_object_mut().unwrap();
        for (k, v) in po {
            if v.is_null() {
                to.remove(k);
            } else {
                patch(to.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    } else {
        *t = p.clone();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, .. ProptestConfig::default() })]

    #[test]
    fn concurrent_channel_writes_match_a_model(
        policies in proptest::collection::vec(0u8..3, 3),
        writes in proptest::collection::vec((0u8..3, 0u8..5, any::<bool>(), 0u8..4), 10..60),
    ) {
        let mem = MemStorage::new();
        let storage: Arc<dyn Storage> = Arc::new(mem.clone());
        let store = Arc::new(Store::open_with(storage, std::path::Path::new("/d"), Default::default()).unwrap());
        let kinds = [ChannelKind::Append, ChannelKind::Replace, ChannelKind::Merge];
        let pols = [ConflictPolicy::LastWriteWins, ConflictPolicy::Merge, ConflictPolicy::Reject];
        for (c, kind) in kinds.iter().enumerate() {
            store.declare_channel("r", "lead", &ChannelDecl {
                channel: format!("c{c}"), kind: *kind, on_conflict: pols[policies[c] as usize], max_size_kb: 1024,
            }).unwrap();
        }
        // Four threads write concurrently; each write either carries the version it
        // last saw (possibly stale by now) or none.
        let chunks: Vec<Vec<(u8, u8, bool, u8)>> = writes.chunks(writes.len().div_ceil(4)).map(<[_]>::to_vec).collect();
        let hs: Vec<_> = chunks.into_iter().enumerate().map(|(t, ws)| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut refused = 0u64;
                for (c, k, with_base, v) in ws {
                    let ch = format!("c{c}");
                    let base = with_base.then(|| store.channel("r", None, &ch).map(|s| s.version).unwrap_or(0));
                    let value = if c == 2 { json!({ format!("k{k}"): if v == 0 { Value::Null } else { json!(v) } }) } else { json!({"t": t, "v": v}) };
                    match store.write_channel("r", &format!("w{t}"), &ch, value, base) {
                        Ok(_) => {}
                        Err(Error::Conflict(_)) => refused += 1,
                        Err(e) => panic!("{e}"),
                    }
                }
                refused
            })
        }).collect();
        let refused: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
        // The model: fold the channel events in log order.
        let events: Vec<_> = store.read("r", ReadOptions::default()).unwrap().collect::<Result<_, _>>().unwrap();
        let mut vals = [json!([]), Value::Null, json!({})];
        let mut vers = [0u64; 3];
        let mut reject_conflicts = 0u64;
        for e in &events {
            match e.kind.as_str() {
                "channel_write" => {
                    let c: usize = e.content["channel"].as_str().unwrap()[1..].parse().unwrap();
                    let w = &e.content["value"];
                    let stale = match (pols[policies[c] as usize], e.content.get("base_version").and_then(Value::as_u64)) {
                        (ConflictPolicy::Reject, None) => true,
                        (_, Some(b)) => b != vers[c],
                        (_, None) => false,
                    };
                    match kinds[c] {
                        ChannelKind::Append => vals[c].as_array_mut().unwrap().push(w.clone()),
                        ChannelKind::Replace if stale && pols[policies[c] as usize] == ConflictPolicy::Merge => patch(&mut vals[c], w),
                        ChannelKind::Replace => vals[c] = w.clone(),
                        ChannelKind::Merge => patch(&mut vals[c], w),
                    }
                    vers[c] = e.seq;
                }
                "conflict" if e.content["resolution"] == "reject" => reject_conflicts += 1,
                _ => {}
            }
        }
        for c in 0..3 {
            let got = store.channel("r", None, &format!("c{c}")).unwrap();
            prop_assert_eq!(&got.value, &vals[c], "channel c{}", c);
            prop_assert_eq!(got.version, vers[c]);
        }
        prop_assert_eq!(refused, reject_conflicts, "one conflict event per refused reject write");
    }
}
