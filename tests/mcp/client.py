"""Drives `swarm mcp` with the official MCP Python SDK (`mcp` on PyPI), over stdio.

Usage: client.py SCENARIO SWARM_BIN DATA_DIR
With $MCP_URL (and $MCP_TOKEN_ALICE, $MCP_TOKEN_BOB) the sessions go to a `swarm serve`
over streamable HTTP instead (tests/mcp_http.rs), so every tool is driven over both; with
$MCP_BRIDGE too, through `swarm mcp` over stdio with SWARM_URL and SWARM_TOKEN (the bridge).
Scenarios: basic, concurrency, subscribe, subscribe_policy, isolation, lookups, hybrid (needs
$SWARM_EMBED_MODEL). Each prints one JSON line of
results on success; any failed check raises (exit code 1, the assertion on stderr).
Called by tests/mcp.rs (cargo test); nobody here wrote the client side.
"""

import asyncio
import json
import os
import subprocess
import sys
from contextlib import AsyncExitStack

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

SCENARIO, SWARM, DATA = sys.argv[1], sys.argv[2], sys.argv[3]

ALL_TOOLS = {
    "append_entry", "read_entries", "get_context", "get_board", "pick_hypothesis",
    "write_channel", "read_channel", "list_escalations", "list_facts", "explain_fact",
    "get_tool_advice", "list_runs", "search_memory", "add_finding_to_memory",
    "complete_investigation", "record_tool_failure_pattern",
    "get_recommended_investigation_strategy", "track_tool_call", "add_session_to_memory",
    "detect_agent_anti_patterns",
}


def cli(*args, user="alice", stdin=None):
    """Runs the swarm CLI (another process) on the same data dir."""
    r = subprocess.run([SWARM, "--data-dir", DATA, "--user", user, *args],
                       input=stdin, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"swarm {args}: {r.returncode} {r.stderr}"
    return r.stdout


async def connect(stack, user, agents, handler=None):
    """A session of `user` acting as `agents`: a `swarm mcp` process over stdio, or, with
    $MCP_URL set, the server's `/mcp` over streamable HTTP with the token in
    $MCP_TOKEN_<USER> (whose agents must be `agents`; the server serves DATA)."""
    url = os.environ.get("MCP_URL")
    if url and os.environ.get("MCP_BRIDGE"):
        # `swarm mcp` over stdio with SWARM_URL: the stdio bridge to the server's /mcp.
        from mcp.client.stdio import get_default_environment
        env = {**get_default_environment(), "SWARM_URL": url,
               "SWARM_TOKEN": os.environ["MCP_TOKEN_" + user.upper()]}
        params = StdioServerParameters(command=SWARM, args=["mcp"], env=env)
        r, w = await stack.enter_async_context(stdio_client(params))
    elif url:
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client
        token = os.environ["MCP_TOKEN_" + user.upper()]
        client = await stack.enter_async_context(
            create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}))
        streams = await stack.enter_async_context(streamable_http_client(url + "/mcp", http_client=client))
        r, w = streams[0], streams[1]
    else:
        params = StdioServerParameters(
            command=SWARM, args=["--data-dir", DATA, "--user", user, "mcp", "--agent", agents])
        r, w = await stack.enter_async_context(stdio_client(params))
    kw = {"message_handler": handler} if handler else {}
    s = await stack.enter_async_context(ClientSession(r, w, **kw))
    await s.initialize()
    return s


async def call(s, name, args):
    """A successful call's JSON."""
    res = await s.call_tool(name, args)
    text = res.content[0].text
    assert not res.is_error, f"{name} {args} failed: {text}"
    return json.loads(text)


async def refused(s, name, args):
    """A refused call's JSON (a tool error, not a protocol error)."""
    res = await s.call_tool(name, args)
    text = res.content[0].text
    assert res.is_error, f"{name} {args} should have been refused: {text}"
    return json.loads(text)


async def basic():
    out = {}
    async with AsyncExitStack() as stack:
        s = await connect(stack, "alice", "sre,lead")
        tools = (await s.list_tools()).tools
        names = {t.name for t in tools}
        assert names == ALL_TOOLS, names ^ ALL_TOOLS
        for t in tools:
            assert len(t.description or "") >= 120, (t.name, t.description)
            assert t.input_schema.get("type") == "object", t.name
        out["tools"] = len(tools)
        run = "inc-1"
        e1 = await call(s, "append_entry", {"run": run, "type": "evidence", "subject": "checkout",
                                            "content": "p99 latency of checkout rose from 180 ms to 2.4 s", "confidence": 0.9})
        seq1 = e1["stored"]["seq"]
        h1 = await call(s, "append_entry", {"run": run, "type": "hypothesis", "subject": "root-cause",
                                            "content": "connection pool saturation on orders-db", "confidence": 0.7, "refs": [seq1]})
        h2 = await call(s, "append_entry", {"run": run, "type": "hypothesis", "subject": "root-cause", "agent": "lead",
                                            "content": "dns failure", "confidence": 0.4})
        page = await call(s, "read_entries", {"run": run, "after_seq": 0, "limit": 2})
        assert [e["seq"] for e in page["entries"]] == [1, 2] and page["more"] and page["next_cursor"] == 2
        page = await call(s, "read_entries", {"run": run, "after_seq": page["next_cursor"]})
        assert [e["seq"] for e in page["entries"]] == [3] and not page["more"]
        ctx = await call(s, "get_context", {"run": run, "budget_bytes": 400})
        assert ctx["used_bytes"] <= 400 and "checkout" in ctx["text"]
        board = await call(s, "get_board", {"run": run, "subject": "root-cause"})
        version = board["subjects"][0]["version"]
        assert version == h2["stored"]["seq"]
        # A CAS conflict on the board names the current version.
        err = await refused(s, "append_entry", {"run": run, "type": "evidence", "subject": "root-cause",
                                                "content": "stale write", "expect_subject_seq": h1["stored"]["seq"]})
        assert err["error"] == "cas_conflict" and err["current_version"] == version, err
        err = await refused(s, "append_entry", {"run": run, "type": "evidence", "content": "x", "expect_seq": 1})
        assert err["error"] == "cas_conflict" and err["current_seq"] == 3, err
        out["cas_conflict"] = err["error"]
        pick = await call(s, "pick_hypothesis", {"run": run, "subject": "root-cause", "agent": "lead"})
        assert pick["outcome"] == "picked" and pick["winner"] == h1["stored"]["seq"], pick
        # Two agents disagree on an action: the second is stored and escalated, the next refused.
        await call(s, "append_entry", {"run": run, "type": "action_taken", "subject": "orders-db", "content": "fail over orders-db"})
        esc = await call(s, "append_entry", {"run": run, "type": "action_taken", "subject": "orders-db", "agent": "lead",
                                             "content": "restart orders-db"})
        assert "warning" in esc and esc["engine_events"][0]["type"] == "escalation", esc
        esc_seq = esc["engine_events"][0]["seq"]
        err = await refused(s, "append_entry", {"run": run, "type": "decision", "subject": "orders-db", "content": "scale orders-db"})
        assert err["error"] == "escalated" and err["escalation_seq"] == esc_seq, err
        out["escalated"] = err["escalation_seq"]
        escs = await call(s, "list_escalations", {"run": run})
        assert [e["seq"] for e in escs["escalations"]] == [esc_seq]
        # Acting as an agent the session was not given is forbidden.
        err = await refused(s, "append_entry", {"run": run, "type": "evidence", "content": "x", "agent": "intruder"})
        assert err["error"] == "forbidden", err
        # Channels: a stale base on a reject channel.
        cli("channel", "declare", "--run", run, "--agent", "lead", "--channel", "analysis", "--kind", "replace", "--on-conflict", "reject")
        w1 = await call(s, "write_channel", {"run": run, "channel": "analysis", "value": {"cause": "pool"}, "base_version": 0})
        err = await refused(s, "write_channel", {"run": run, "channel": "analysis", "value": {"cause": "dns"}, "base_version": 0})
        assert err["error"] == "cas_conflict" and err["current_version"] == w1["version"], err
        ch = await call(s, "read_channel", {"run": run, "channel": "analysis"})
        assert ch["value"] == {"cause": "pool"} and ch["version"] == w1["version"]
        # A policy: sre may only write evidence.
        cli("policy", "set", "--run", "inc-policy", "--agent", "lead", "--file", "-",
            stdin=json.dumps({"permissions": {"lead": {"read_types": ["*"], "write_types": ["*"], "read_channels": ["*"], "write_channels": ["*"], "admin": True},
                                              "sre": {"read_types": ["*"], "write_types": ["evidence"], "read_channels": [], "write_channels": []}}}))
        err = await refused(s, "append_entry", {"run": "inc-policy", "type": "decision", "content": "roll back"})
        assert err["error"] == "forbidden", err
        out["forbidden"] = True

        # Seed 002's memory tools.
        t1 = await call(s, "track_tool_call", {"run": run, "tool": "query_metrics", "status": "error",
                                               "error": "invalid filter: resource.type required", "args": {"filter": "latency"}})
        assert t1["recorded"], t1
        await call(s, "track_tool_call", {"run": run, "tool": "query_metrics", "status": "error",
                                          "error": "invalid filter: resource.type required", "args": {"filter": "latency"}})
        await call(s, "record_tool_failure_pattern", {"run": run, "tool": "query_metrics", "error": "invalid filter: resource.type required",
                                                      "failed_args": {"filter": "latency"},
                                                      "corrected_args": {"filter": "latency", "resource.type": "k8s_container"},
                                                      "lesson": "always give resource.type"})
        f = await call(s, "add_finding_to_memory", {"run": run, "finding": "orders-db connection pool exhausted: 100 of 100 connections in use",
                                                    "subject": "orders-db", "confidence": 0.9, "tool": "get_logs_for_trace", "client_id": "f-1"})
        again = await call(s, "add_finding_to_memory", {"run": run, "finding": "orders-db connection pool exhausted: 100 of 100 connections in use",
                                                        "subject": "orders-db", "confidence": 0.9, "tool": "get_logs_for_trace", "client_id": "f-1"})
        assert again["stored"]["seq"] == f["stored"]["seq"], (f, again)
        turn = {"run": run, "turn_id": "turn-1", "messages": [
            {"role": "user", "content": "checkout is slow since 14:00"},
            {"role": "system", "content": "you are an SRE agent"},
            {"role": "assistant", "content": "the orders-db pool looks saturated"}],
            "tool_results": [{"tool": "fetch_trace_exemplar", "status": "ok", "args": {"service": "checkout"},
                              "result": "96% of checkout time is spent waiting on orders-db"}]}
        st = await call(s, "add_session_to_memory", turn)
        assert st["stored"] == 3, st
        st2 = await call(s, "add_session_to_memory", turn)
        assert st2["seqs"] == st["seqs"], (st, st2)
        hits = await call(s, "search_memory", {"query": "connection pool exhausted"})
        assert hits["hits"] and "pool exhausted" in hits["hits"][0]["entry"]["content"], hits
        anti = await call(s, "detect_agent_anti_patterns", {"run": run})
        kinds = {a["kind"] for a in anti["anti_patterns"]}
        assert "repeated_failing_call" in kinds, anti
        out["anti_patterns"] = sorted(kinds)
        done = await call(s, "complete_investigation", {"run": run, "symptom": "high_latency_checkout",
                                                        "root_cause": "connection_pool_saturation",
                                                        "resolution": "increased pool size from 10 to 50"})
        pattern = done["learning"]["pattern"]
        assert pattern and pattern["tool_sequence"], done
        out["pattern"] = pattern["tool_sequence"]
        strat = await call(s, "get_recommended_investigation_strategy", {"symptom": "high_latency_checkout"})
        assert strat["strategies"][0]["scope"] == "private", strat
        advice = await call(s, "get_tool_advice", {"tool": "query_metrics"})
        assert advice["advice"] and advice["advice"][0]["correction"], advice
        facts = await call(s, "list_facts", {})
        assert facts["facts_total"] > 0
        fid = facts["facts"][0]["id"]
        ex = await call(s, "explain_fact", {"fact": fid, "limit": 2})
        assert ex["evidence"] and ex["evidence"][0]["event"], ex
        # Tracking never fails the agent's call, even on a closed run.
        t = await call(s, "track_tool_call", {"run": run, "tool": "query_metrics", "status": "ok"})
        assert t["recorded"] is False and "closed" in t["reason"], t
        runs = await call(s, "list_runs", {})
        assert {r["run_id"] for r in runs["runs"]} >= {run, "inc-policy"}
        # Resources.
        res = await s.list_resources()
        assert f"swarm://runs/{run}" in {str(r.uri) for r in res.resources}
        rr = await s.read_resource(f"swarm://runs/{run}")
        body = json.loads(rr.contents[0].text)
        assert body["run"]["run_id"] == run and body["recent"], body
        out["resources"] = len(res.resources)

        # Arguments a tool does not take are refused, never ignored: a misspelled
        # expected_seq silently skipped the compare-and-swap.
        for t in tools:
            assert t.input_schema.get("additionalProperties") is False, t.name
        res = await s.call_tool("append_entry", {"run": "inc-2", "type": "evidence", "content": "x", "expected_seq": 0})
        assert res.is_error and "expected_seq" in res.content[0].text, res
        # complete_investigation does not create, close and archive a run nobody wrote
        # to, nor close one with nothing said.
        err = await refused(s, "complete_investigation", {"run": "no-such-run", "symptom": "s", "root_cause": "c", "resolution": "r"})
        assert err["error"] == "run_not_found", err
        await call(s, "append_entry", {"run": "inc-2", "type": "evidence", "content": "x"})
        err = await refused(s, "complete_investigation", {"run": "inc-2", "symptom": "s", "root_cause": " ", "resolution": "r"})
        assert err["error"] == "invalid_input" and err["field"] == "root_cause", err
        # Tools that write with record_in do not claim to be read-only.
        for t in tools:
            if "record_in" in t.input_schema.get("properties", {}):
                assert not (t.annotations and t.annotations.read_only_hint), t.name
        # Cursors and limits at their edges.
        page = await call(s, "read_entries", {"run": "inc-2", "after_seq": 2**64 - 1})
        assert page["entries"] == [] and not page["more"], page
        err = await refused(s, "read_entries", {"run": "inc-2", "limit": 0})
        assert err["error"] == "invalid_input" and err["field"] == "limit", err
        # A page of large entries ends at 512 KiB of JSON; the cursor reads the rest.
        big = "y" * 60_000
        for i in range(12):
            await call(s, "append_entry", {"run": "inc-big", "type": "evidence", "content": f"{i} {big}"})
        seen, cursor, pages = [], 0, 0
        while True:
            res = await s.call_tool("read_entries", {"run": "inc-big", "after_seq": cursor, "limit": 500})
            assert not res.is_error and len(res.content[0].text) <= 600_000, len(res.content[0].text)
            page = json.loads(res.content[0].text)
            seen += [e["seq"] for e in page["entries"]]
            cursor, pages = page["next_cursor"], pages + 1
            if not page["more"]:
                break
        assert seen == list(range(1, 13)) and pages >= 2, (seen, pages)
        rr = await s.read_resource("swarm://runs/inc-big")
        assert len(rr.contents[0].text) <= 600_000, len(rr.contents[0].text)
        out["read_pages"] = pages
    return out


async def concurrency():
    """Two server processes over one data dir, 20 concurrent add_finding_to_memory calls
    through each: 40 of 40 stored, none duplicated; then every call retried with its
    client id through the other server: still 40."""
    async with AsyncExitStack() as stack:
        a = await connect(stack, "alice", "agent-a,agent-b")
        b = await connect(stack, "alice", "agent-b,agent-a")
        run = "inc-conc"

        def args(i, who):
            return {"run": run, "finding": f"finding {i} from {who}: shard {i} of orders-db lags by {i} s",
                    "subject": f"shard-{i}", "client_id": f"{who}-{i}", "confidence": 0.5,
                    "agent": f"agent-{who}"}

        async def burst(sess, who, sender):
            return await asyncio.gather(*[call(sender, "add_finding_to_memory", args(i, who)) for i in range(20)])

        first = await asyncio.gather(burst(a, "a", a), burst(b, "b", b))
        acked = {r["stored"]["id"]: r["stored"]["seq"] for part in first for r in part}
        assert len(acked) == 40, len(acked)
        # Retries with the same client ids (the same entries), crossed over to the other
        # process, as a client whose first connection died would send them.
        retry = await asyncio.gather(burst(a, "a", b), burst(b, "b", a))
        for part in retry:
            for r in part:
                assert acked[r["stored"]["id"]] == r["stored"]["seq"], r
        lines = [json.loads(l) for l in cli("read", "--run", run).splitlines()]
        ids = [e["id"] for e in lines if e["type"] == "evidence"]
        assert len(ids) == 40 and len(set(ids)) == 40, (len(ids), len(set(ids)))
        assert set(ids) == set(acked)
        return {"acknowledged": len(acked), "stored": len(ids), "distinct": len(set(ids)),
                "retried": sum(len(p) for p in retry)}


def updates():
    """A message handler that records `notifications/resources/updated`: the handler, an
    event set at each one, and the list of their URIs."""
    got = asyncio.Event()
    uris = []

    async def handler(msg):
        if getattr(msg, "method", None) == "notifications/resources/updated":
            uris.append(str(msg.params.uri))
            got.set()

    return handler, got, uris


async def subscribe():
    """Subscribe to a run; another process appends; the update arrives."""
    handler, got, uris = updates()

    async with AsyncExitStack() as stack:
        s = await connect(stack, "alice", "watcher", handler)
        run = "inc-sub"
        await call(s, "append_entry", {"run": run, "type": "evidence", "content": "first"})
        await s.subscribe_resource(f"swarm://runs/{run}")
        cli("append", "--run", run, "--agent", "other-process", "--type", "evidence", "--content", "second")
        await asyncio.wait_for(got.wait(), timeout=20)
        assert uris[0] == f"swarm://runs/{run}", uris
        return {"updated": uris[0]}


async def subscribe_policy():
    """A subscriber is told only of changes its agent may read: under a policy that shows
    "watcher" evidence but not hypotheses, another process's hypothesis brings no
    notification, and the evidence after it brings one."""
    handler, got, uris = updates()

    run = "inc-sub-policy"
    cli("append", "--run", run, "--agent", "lead", "--type", "evidence", "--content", "first")
    policy = {"permissions": {
        "lead": {"read_channels": ["*"], "write_channels": ["*"], "read_types": ["*"],
                 "write_types": ["*"], "admin": True},
        "watcher": {"read_channels": ["*"], "write_channels": ["*"], "read_types": ["evidence"],
                    "write_types": ["evidence"]},
        "*": {"read_channels": ["*"], "write_channels": ["*"], "read_types": ["*"],
              "write_types": ["*"]}}}
    cli("policy", "set", "--run", run, "--agent", "lead", "--file", "-", stdin=json.dumps(policy))
    async with AsyncExitStack() as stack:
        s = await connect(stack, "alice", "watcher", handler)
        await s.subscribe_resource(f"swarm://runs/{run}")
        cli("append", "--run", run, "--agent", "other-process", "--type", "hypothesis",
            "--content", "a hidden hypothesis")
        try:
            await asyncio.wait_for(got.wait(), timeout=3)
        except asyncio.TimeoutError:
            pass
        hidden = list(uris)
        assert hidden == [], f"notified of a hypothesis the watcher may not read: {hidden}"
        cli("append", "--run", run, "--agent", "other-process", "--type", "evidence",
            "--content", "visible evidence")
        await asyncio.wait_for(got.wait(), timeout=20)
        assert uris[0] == f"swarm://runs/{run}", uris
        return {"after_hidden": len(hidden), "after_visible": len(uris)}


async def isolation():
    """bob cannot see, search or infer alice's findings through any tool or resource."""
    secret = "payments-ledger-7f3a replica lost quorum"
    async with AsyncExitStack() as stack:
        alice = await connect(stack, "alice", "sre")
        bob = await connect(stack, "bob", "sre")
        await call(alice, "add_finding_to_memory", {"run": "alice-inc", "finding": secret, "subject": "payments-ledger-7f3a", "tool": "query_metrics"})
        await call(alice, "track_tool_call", {"run": "alice-inc", "tool": "query_metrics", "status": "ok"})
        await call(alice, "complete_investigation", {"run": "alice-inc", "symptom": "ledger_quorum_loss",
                                                     "root_cause": "database replica lost quorum", "resolution": "restarted payments-ledger-7f3a"})
        seen = []
        hits = await call(bob, "search_memory", {"query": "payments ledger replica quorum"})
        assert hits["hits"] == [], hits
        seen.append(hits)
        err = await refused(bob, "read_entries", {"run": "alice-inc"})
        assert err["error"] == "run_not_found", err
        seen.append(await call(bob, "list_runs", {}))
        seen.append(await call(bob, "list_facts", {}))
        err = await refused(bob, "explain_fact", {"fact": "F1"})
        seen.append(err)
        strat = await call(bob, "get_recommended_investigation_strategy", {"symptom": "ledger_quorum_loss"})
        seen.append(strat)
        assert all(p["scope"] == "shared" for p in strat["strategies"]), strat
        res = await bob.list_resources()
        assert not res.resources, res
        try:
            await bob.read_resource("swarm://runs/alice-inc")
            raise AssertionError("bob read alice's run")
        except AssertionError:
            raise
        except Exception:
            pass
        # Writing into a run id alice uses creates bob's own run, never touches alice's.
        await call(bob, "append_entry", {"run": "alice-inc", "type": "evidence", "content": "bob's note"})
        text = json.dumps(seen)
        for word in ["7f3a", "payments-ledger", "quorum lost", secret]:
            assert word not in text, (word, text)
        alice_side = cli("read", "--run", "alice-inc", user="alice")
        assert "bob's note" not in alice_side
        return {"shared_strategies": len(strat["strategies"]), "bob_hits": 0}


async def lookups():
    """Look-ups named with `record_in` become seed 002's `searched` and `pattern_applied`
    memory events of that run (derived from the log: `swarm memory-events`), each linked
    to its seq; look-ups and tracked calls never become facts."""
    async with AsyncExitStack() as stack:
        s = await connect(stack, "alice", "sre")
        old = "inc-old"
        await call(s, "add_finding_to_memory", {"run": old, "finding": "orders-db connection pool exhausted: 100 of 100 connections in use",
                                                "subject": "orders-db", "tool": "query_metrics"})
        await call(s, "record_tool_failure_pattern", {"run": old, "tool": "query_metrics", "error": "missing resource.type",
                                                      "failed_args": {"filter": "latency"},
                                                      "corrected_args": {"filter": "latency", "resource.type": "k8s_container"},
                                                      "lesson": "give resource.type in metric filters"})
        await call(s, "track_tool_call", {"run": old, "tool": "get_logs_for_trace", "status": "ok"})
        await call(s, "complete_investigation", {"run": old, "symptom": "high_latency_checkout",
                                                 "root_cause": "connection_pool_saturation",
                                                 "resolution": "increased pool size from 10 to 50"})
        run = "inc-new"
        hits = await call(s, "search_memory", {"query": "connection pool exhausted", "record_in": run})
        assert hits["hits"] and hits["recorded"]["run"] == run and hits["recorded"]["seq"] >= 1, hits
        strat = await call(s, "get_recommended_investigation_strategy", {"symptom": "high_latency_checkout", "record_in": run})
        assert strat["strategies"] and "seq" in strat["recorded"], strat
        none = await call(s, "get_recommended_investigation_strategy", {"symptom": "dns_failure_everywhere", "record_in": run})
        assert none["strategies"] == [] and "seq" in none["recorded"], none
        advice = await call(s, "get_tool_advice", {"tool": "query_metrics", "record_in": run})
        assert advice["advice"] and "seq" in advice["recorded"], advice
        plain = await call(s, "search_memory", {"query": "connection pool exhausted"})
        assert "recorded" not in plain, plain
        # Recording never fails the look-up: a closed run refuses the write, not the search.
        closed = await call(s, "search_memory", {"query": "pool", "record_in": old})
        assert closed["hits"] and "error" in closed["recorded"], closed
        events = [json.loads(line) for line in cli("memory-events", "--run", run).splitlines() if line.strip()]
        got = [(e["action"], e["category"], e["tool_name"], e["seq"]) for e in events]
        want = [("searched", "search", "search_memory", hits["recorded"]["seq"]),
                ("pattern_applied", "pattern", "get_recommended_investigation_strategy", strat["recorded"]["seq"]),
                ("searched", "search", "get_recommended_investigation_strategy", none["recorded"]["seq"]),
                ("pattern_applied", "pattern", "get_tool_advice", advice["recorded"]["seq"])]
        assert got == want, (got, want)
        assert events[0]["metadata"]["hits"] == len(hits["hits"]), events[0]
        # The new run's look-ups are not findings: synthesizing it makes no fact of them,
        # and the old run's tracked calls made none either.
        cli("synth")
        facts = await call(s, "list_facts", {"limit": 100})
        texts = [f["text"] for f in facts["facts"]]
        assert texts, facts
        for t in texts:
            assert not t.startswith(("called ", "searched the memory", "applied a learned", "no learned")), texts
            assert "succeeded after a correction" not in t and " failed: " not in t, texts
        return {"actions": [g[0] for g in got], "facts": len(texts)}


async def hybrid():
    """With a model (`--embed-model`), search_memory finds a paraphrase that shares no
    word with the finding; the answer says it ranked in hybrid mode."""
    model = os.environ["SWARM_EMBED_MODEL"]
    params = StdioServerParameters(
        command=SWARM, args=["--data-dir", DATA, "--user", "alice", "mcp", "--agent", "sre", "--embed-model", model])
    async with AsyncExitStack() as stack:
        r, w = await stack.enter_async_context(stdio_client(params))
        s = await stack.enter_async_context(ClientSession(r, w))
        await s.initialize()
        for text in ["orders-db connection pool exhausted: 100 of 100 connections in use",
                     "disk full on the log volume of kafka-3",
                     "TLS certificate for api-gateway expired at 09:00"]:
            await call(s, "add_finding_to_memory", {"run": "inc-h", "finding": text})
        hits = await call(s, "search_memory", {"query": "the database has no free sessions left"})
        assert hits["mode"] == "hybrid" and hits["model"], hits
        top = hits["hits"][0]["entry"]["content"]
        assert "pool exhausted" in top, hits
        return {"mode": hits["mode"], "top": top}


SCENARIOS = {"basic": basic, "concurrency": concurrency, "subscribe": subscribe,
             "subscribe_policy": subscribe_policy, "isolation": isolation,
             "lookups": lookups, "hybrid": hybrid}

if __name__ == "__main__":
    print(json.dumps(asyncio.run(SCENARIOS[SCENARIO]())))
