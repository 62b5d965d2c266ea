//! A failed fsync poisons the writer: nothing is acknowledged after it, ever, in that
//! process (retrying an fsync can report success for pages the kernel already dropped).

use std::path::Path;
use std::sync::Arc;

use swarm_memory::{Durability, Error, Event, LogOptions, MemStorage, Store};

use crate::util::{check_sequence, lib_append, lib_read, lib_read_written, new_ev};

fn open(mem: &MemStorage) -> Store {
    Store::open_with(
        Arc::new(mem.clone()),
        Path::new("/data"),
        LogOptions::default(),
    )
    .unwrap()
}

#[test]
fn failed_fsync_poisons_every_later_append() {
    let mem = MemStorage::new();
    let run = "poison";
    let store = open(&mem);
    let e1 = lib_append(&store, run, "one");
    mem.fail_syncs(1);
    match store.append(run, new_ev(Some("k2"), "two"), Durability::Sync) {
        Err(Error::Io { op, .. }) => assert_eq!(op, "fsync"),
        other => panic!("want the fsync error, got {other:?}"),
    }
    // The next syncs would succeed, but this process must not acknowledge anything.
    for (what, r) in [
        (
            "sync",
            store.append(run, new_ev(None, "three"), Durability::Sync),
        ),
        (
            "none",
            store.append(run, new_ev(None, "three"), Durability::None),
        ),
        (
            "batch",
            store.append(run, new_ev(None, "three"), Durability::Batch),
        ),
        (
            "retry",
            store.append(run, new_ev(Some("k2"), "two"), Durability::Sync),
        ),
    ] {
        assert!(matches!(r, Err(Error::Poisoned(_))), "{what}: {r:?}");
    }
    let r = store.append_batch(
        run,
        vec![new_ev(None, "a"), new_ev(None, "b")],
        None,
        Durability::Sync,
    );
    assert!(matches!(r, Err(Error::Poisoned(_))), "{r:?}");
    assert_eq!(
        lib_read(&store, run),
        std::slice::from_ref(&e1),
        "a record whose fsync failed is visible"
    );
    // A new process may append again; the log stays consistent. (The unacknowledged
    // record reached the file before its fsync failed, so it may be there; a client
    // retries it by id.)
    drop(store);
    let store = open(&mem);
    let again = store
        .append(run, new_ev(Some("k2"), "two"), Durability::Sync)
        .unwrap();
    assert_eq!(again.seq, 2);
    let e = lib_append(&store, run, "after");
    assert_eq!(e.seq, 3);
    let all = lib_read(&store, run);
    check_sequence(&all);
    assert_eq!(all[0], e1);
}

/// Threads appending when an fsync fails: every event acknowledged before survives a
/// power loss, and once a thread has seen an error it never gets another
/// acknowledgement.
#[test]
fn failed_fsync_under_concurrency() {
    let mem = MemStorage::new();
    let run = "poison-many";
    let store = Arc::new(open(&mem));
    lib_append(&store, run, "zero");
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            let mem = mem.clone();
            std::thread::spawn(move || {
                let mut acked: Vec<Event> = Vec::new();
                // Refused `Poisoned`: the append wrote nothing (a handing process then
                // appends the batch itself).
                let mut refused: Vec<String> = Vec::new();
                let mut failed = false;
                for i in 0..100 {
                    if t == 0 && i == 30 {
                        mem.fail_syncs(1);
                    }
                    let content = format!("t{t} {i}");
                    match store.append(run, new_ev(None, &content), Durability::Sync) {
                        Ok(e) => {
                            assert!(!failed, "thread {t}: acknowledged after a failure");
                            acked.push(e);
                        }
                        Err(Error::Poisoned(_)) => {
                            failed = true;
                            refused.push(content);
                        }
                        Err(Error::Io { op, .. }) => {
                            assert_eq!(op, "fsync");
                            failed = true;
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                // Thread 0 armed the failure before its own append: the next fsync
                // covering that append fails or finds the writer poisoned.
                assert!(failed || t != 0, "thread 0 never saw the failure");
                (acked, refused)
            })
        })
        .collect();
    let (acked, refused): (Vec<Vec<Event>>, Vec<Vec<String>>) =
        handles.into_iter().map(|h| h.join().unwrap()).unzip();
    let acked: Vec<Event> = acked.into_iter().flatten().collect();
    drop(store);
    // Everything written, before any crash: no append refused `Poisoned` is there.
    let written: Vec<Event> = lib_read_written(&open(&mem), run);
    for c in refused.iter().flatten() {
        assert!(
            !written.iter().any(|e| e.content.as_str() == Some(c)),
            "{c:?} was refused `Poisoned` (nothing written), yet it is in the log"
        );
    }
    mem.crash(|_, _| 0);
    let store = open(&mem);
    let all: Vec<Event> = lib_read_written(&store, run);
    check_sequence(&all);
    for a in &acked {
        assert_eq!(
            all.get(a.seq as usize - 1),
            Some(a),
            "acknowledged, then lost"
        );
    }
}
