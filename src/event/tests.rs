use super::*;
use serde_json::json;

/// A frame's events detached as spans point into its text (no copies but for the
/// strings that held escapes) and, borrowed again from the text at another offset,
/// are the same events.
#[test]
fn spans_point_into_the_text_and_give_the_events_back() {
    let frame = concat!(
        r#"[{"run_id":"r","seq":1,"ts":"2026-11-22T14:03:00Z","id":"a1","agent_id":"db","#,
        r#""user_id":"u","type":"evidence","content":"plain","confidence":0.5,"subject":"s1"},"#,
        r#"{"run_id":"r","seq":2,"ts":"2026-11-22T14:03:01Z","id":"a2","agent_id":"d\\u0062","#,
        r#""user_id":"u","type":"decision","content":{"k":[1,2]},"refs":[1],"#,
        r#""session_id":"x","meta":{"tool":"q"}}]"#
    );
    let events: Vec<EventRef<'_>> = serde_json::from_str(frame).unwrap();
    let prefix = "some earlier frame's text ";
    let spans: Vec<EventSpans> = events
        .iter()
        .map(|e| e.spans(frame, prefix.len()))
        .collect();
    assert!(matches!(spans[0].agent_id, Span::At(..)));
    assert!(matches!(spans[0].content, Span::At(..)));
    assert!(matches!(spans[1].meta, Some(Span::At(..))));
    // `d\u0062` held an escape: built by the parse, so copied.
    assert!(matches!(spans[1].agent_id, Span::Owned(_)));
    let chunk = format!("{prefix}{frame}");
    for (e, s) in events.iter().zip(&spans) {
        let back = s.event_ref(&chunk);
        assert_eq!(format!("{back:?}"), format!("{e:?}"));
    }
}

/// The pre-encoded path writes exactly what serde_json writes for the whole event.
#[test]
fn pre_encoded_events_are_byte_identical_to_serde() {
    let mut meta = Map::new();
    meta.insert("tool".into(), json!("kubectl \"get\"\n"));
    let full = NewEvent {
        id: Some("client-1@x".into()),
        confidence: Some(0.25),
        refs: vec![1, 7],
        subject: Some("orders-db/pool \u{2603}".into()),
        session_id: Some("s-1".into()),
        meta: Some(meta),
        ..NewEvent::new(
            "db",
            EventType::Hypothesis,
            json!({"text": "p99 \u{1f525} 2.3 s\t\u{1}", "n": [1, 2.5, null, true]}),
        )
    };
    let plain = NewEvent::new("a1", EventType::Evidence, "disk full on db-1");
    for (i, ne) in [full, plain].into_iter().enumerate() {
        let c = ne.check().unwrap();
        let tail = c.encode_tail();
        let ts = Ts(1_795_600_726_007_288 + i as u64);
        let id = c.id.clone().unwrap_or_else(|| "swarm:00ff.1".into());
        let ev = c.into_event("run \"x\"", 42 + i as u64, ts, id.clone());
        let mut out = Vec::new();
        write_event_json(
            &mut out,
            &serde_json::to_vec("run \"x\"").unwrap(),
            ev.seq,
            &serde_json::to_vec(&ts).unwrap(),
            &id,
            &tail,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            serde_json::to_string(&ev).unwrap()
        );
    }
}

fn ok() -> NewEvent {
    NewEvent::new("a1", EventType::Evidence, "disk full on db-1")
}

#[test]
fn accepts_a_plain_event() {
    let c = ok().check().unwrap();
    assert_eq!(c.user_id, "anonymous");
}

#[test]
fn refuses_bad_fields_naming_them() {
    let cases: Vec<(&str, NewEvent)> = vec![
        (
            "agent_id",
            NewEvent {
                agent_id: "".into(),
                ..ok()
            },
        ),
        (
            "agent_id",
            NewEvent {
                agent_id: "a/b".into(),
                ..ok()
            },
        ),
        (
            "agent_id",
            NewEvent {
                agent_id: "x".repeat(129),
                ..ok()
            },
        ),
        (
            "type",
            NewEvent {
                kind: "summary".into(),
                ..ok()
            },
        ),
        (
            "content",
            NewEvent {
                content: json!(1),
                ..ok()
            },
        ),
        (
            "content",
            NewEvent {
                content: json!(""),
                ..ok()
            },
        ),
        (
            "content",
            NewEvent {
                content: json!("x".repeat(70_000)),
                ..ok()
            },
        ),
        (
            "confidence",
            NewEvent {
                confidence: Some(1.5),
                ..ok()
            },
        ),
        (
            "confidence",
            NewEvent {
                confidence: Some(f64::NAN),
                ..ok()
            },
        ),
        (
            "id",
            NewEvent {
                id: Some("swarm:1".into()),
                ..ok()
            },
        ),
        (
            "subject",
            NewEvent {
                subject: Some("a\nb".into()),
                ..ok()
            },
        ),
        (
            "refs",
            NewEvent {
                refs: vec![1; 65],
                ..ok()
            },
        ),
    ];
    for (field, ev) in cases {
        match ev.check() {
            Err(Error::Invalid { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
    let mut deep = json!("x");
    for _ in 0..70 {
        deep = json!({ "k": deep });
    }
    assert!(NewEvent {
        content: deep,
        ..ok()
    }
    .check()
    .is_err());
}

#[test]
fn json_len_counts_what_serde_json_writes() {
    let values = [
        json!("plain"),
        json!("quote \" backslash \\ newline \n tab \t nul \u{0} del \u{7f} é ☃"),
        json!({"a": [1, 2.5, -3e300, null, true], "b": {"c": "d\u{1f}"}}),
        json!({}),
    ];
    for v in values {
        assert_eq!(json_len(&v), serde_json::to_vec(&v).unwrap().len(), "{v}");
    }
}

#[test]
fn meta_limits_apply() {
    let mut deep = json!("x");
    for _ in 0..JSON_DEPTH_MAX {
        deep = json!([deep]);
    }
    let mut m = Map::new();
    m.insert("k".into(), deep);
    let ev = NewEvent {
        meta: Some(m),
        ..ok()
    };
    assert!(matches!(ev.check(), Err(Error::Invalid { field, .. }) if field == "meta"));
    let mut m = Map::new();
    m.insert("k".into(), json!("x".repeat(META_BYTES_MAX)));
    let ev = NewEvent {
        meta: Some(m),
        ..ok()
    };
    assert!(matches!(ev.check(), Err(Error::Invalid { field, .. }) if field == "meta"));
}

#[test]
fn run_ids_cannot_escape() {
    for bad in [
        "..",
        ".",
        "../x",
        "a/b",
        "",
        ".hidden",
        "-rf",
        "a b",
        "settings.json",
        "Settings.json",
        "SETTINGS.JSON",
    ] {
        assert!(check_run_id(bad).is_err(), "{bad}");
    }
    check_run_id("incident-2026.11.22").unwrap();
    check_run_id("settings.json.old").unwrap();
}

/// A handed event (checked again by the committer) may carry a generated id only of
/// the handing form, `swarm:<16 hex>.h<n>`; any other id under the reserved prefix is
/// refused, as on a direct append.
#[test]
fn a_handed_event_carries_only_a_generated_id_of_the_handing_form() {
    let checked = |id: &str| {
        let mut c = NewEvent::new("a", EventType::Evidence, "x")
            .check()
            .unwrap();
        c.id = Some(id.to_string());
        c.recheck().map(|c| c.id)
    };
    let good = "swarm:0123456789abcdef.h42";
    assert_eq!(checked(good).unwrap().as_deref(), Some(good));
    assert_eq!(checked("mine-1").unwrap().as_deref(), Some("mine-1"));
    for bad in [
        "swarm:0123456789abcdef.1e240",
        "swarm:x",
        "swarm:0123456789abcdef.h",
        "swarm:0123456789abcdeg.h1",
        "swarm:0123456789abcdef.h1x",
    ] {
        assert!(checked(bad).is_err(), "{bad}");
    }
}
