"""Drives `/mcp` on `swarm serve` with the official MCP Python SDK (`mcp` on PyPI), over
streamable HTTP.

Usage: http_client.py SCENARIO URL ALICE_TOKEN BOB_TOKEN
Scenarios: basic, concurrency, subscribe, isolation. Each prints one JSON line of results on success; any failed
check raises (exit code 1, the assertion on stderr). Called by tests/mcp_http.rs.
"""

import asyncio
import json
import sys
from contextlib import AsyncExitStack

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

SCENARIO, URL, ALICE, BOB = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]


async def connect(stack, token, handler=None):
    client = await stack.enter_async_context(
        create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}))
    streams = await stack.enter_async_context(streamable_http_client(URL + "/mcp", http_client=client))
    r, w = streams[0], streams[1]
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


async def raw_status(token, body):
    """The HTTP status of one POST to /mcp with `token` (None: no Authorization)."""
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with create_mcp_http_client() as c:
        r = await c.post(URL + "/mcp", headers=headers, content=json.dumps(body))
        return r.status_code


async def delete_status(token):
    """The HTTP status of ending a fresh session with DELETE, as the SDK does on exit
    (it takes 200 or 204; anything else it logs as "Session termination failed")."""
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
               "Authorization": f"Bearer {token}"}
    async with create_mcp_http_client() as c:
        r = await c.post(URL + "/mcp", headers=headers, content=json.dumps(INIT))
        sid = r.headers["mcp-session-id"]
        d = await c.delete(URL + "/mcp", headers={"Authorization": f"Bearer {token}", "mcp-session-id": sid})
        return d.status_code


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}}}


async def basic():
    out = {}
    async with AsyncExitStack() as stack:
        s = await connect(stack, ALICE)
        names = {t.name for t in (await s.list_tools()).tools}
        out["tools"] = len(names)
        assert {"add_finding_to_memory", "search_memory", "append_entry"} <= names, names
        run = "inc-http"
        f = await call(s, "add_finding_to_memory", {"run": run, "subject": "orders-db",
                                                    "finding": "orders-db connection pool exhausted: 100 of 100 in use",
                                                    "confidence": 0.9, "client_id": "h-1"})
        out["stored_seq"] = f["stored"]["seq"]
        hits = await call(s, "search_memory", {"query": "connection pool exhausted"})
        assert hits["hits"] and "pool exhausted" in hits["hits"][0]["entry"]["content"], hits
        out["hits"] = len(hits["hits"])
        err = await refused(s, "append_entry", {"run": run, "type": "evidence", "content": "stale", "expect_seq": 0})
        assert err["error"] == "cas_conflict" and err["current_seq"] == f["stored"]["seq"], err
        out["cas_conflict"] = err["error"]
        err = await refused(s, "append_entry", {"run": run, "type": "evidence", "content": "x", "agent": "intruder"})
        out["forbidden"] = err["error"]
        # Two agents disagree on an action: escalated; the next write on the subject refused.
        await call(s, "append_entry", {"run": run, "type": "action_taken", "subject": "orders-db", "content": "fail over orders-db"})
        esc = await call(s, "append_entry", {"run": run, "type": "action_taken", "subject": "orders-db", "agent": "lead",
                                             "content": "restart orders-db"})
        esc_seq = esc["engine_events"][0]["seq"]
        err = await refused(s, "append_entry", {"run": run, "type": "decision", "subject": "orders-db", "content": "scale orders-db"})
        assert err["error"] == "escalated" and err["escalation_seq"] == esc_seq, err
        out["escalated"] = err["error"]
    out["delete_status"] = await delete_status(ALICE)
    out["no_token"] = await raw_status(None, INIT)
    out["wrong_token"] = await raw_status("swm_nope_0000", INIT)
    try:
        async with AsyncExitStack() as stack:
            await connect(stack, ALICE + "x")
        out["sdk_wrong_token"] = "connected"
    except Exception:  # the SDK raises an exception group (the 401 is checked above)
        out["sdk_wrong_token"] = "refused"
    return out


async def concurrency():
    """Two HTTP sessions, 20 concurrent add_finding_to_memory calls through each, then
    every call retried with its client id through the other session."""
    async with AsyncExitStack() as stack:
        a = await connect(stack, ALICE)
        b = await connect(stack, ALICE)
        run = "inc-conc"

        def args(i, who):
            return {"run": run, "finding": f"finding {i} from {who}: shard {i} lags by {i} s",
                    "subject": f"shard-{i}", "client_id": f"{who}-{i}", "agent": "sre" if who == "a" else "lead"}

        async def burst(who, sender):
            return await asyncio.gather(*[call(sender, "add_finding_to_memory", args(i, who)) for i in range(20)])

        first = await asyncio.gather(burst("a", a), burst("b", b))
        acked = {r["stored"]["id"]: r["stored"]["seq"] for part in first for r in part}
        retry = await asyncio.gather(burst("a", b), burst("b", a))
        same = all(acked.get(r["stored"]["id"]) == r["stored"]["seq"] for part in retry for r in part)
        page = await call(a, "read_entries", {"run": run, "limit": 1000})
        ids = [e["id"] for e in page["entries"]]
        return {"acknowledged": len(acked), "stored": len(ids), "distinct": len(set(ids)),
                "retried_same": same}


async def subscribe():
    """Subscribe to a run over HTTP; an append through another session arrives as
    notifications/resources/updated on the subscriber's stream."""
    got = asyncio.Event()
    uris = []

    async def handler(msg):
        if getattr(msg, "method", None) == "notifications/resources/updated":
            uris.append(str(msg.params.uri))
            got.set()

    async with AsyncExitStack() as stack:
        s = await connect(stack, ALICE, handler)
        other = await connect(stack, ALICE)
        run = "inc-sub"
        await call(s, "append_entry", {"run": run, "type": "evidence", "content": "first"})
        await s.subscribe_resource(f"swarm://runs/{run}")
        await call(other, "append_entry", {"run": run, "type": "evidence", "content": "second"})
        await asyncio.wait_for(got.wait(), timeout=20)
        # A run that does not exist is refused (a watch of it would only hold a tail).
        try:
            await s.subscribe_resource("swarm://runs/no-such-run")
            missing = "accepted"
        except Exception as e:  # the SDK's McpError
            missing = str(e)
        return {"updated": uris[0], "missing": missing}


async def isolation():
    secret = "payments-ledger-7f3a replica lost quorum"
    async with AsyncExitStack() as stack:
        alice = await connect(stack, ALICE)
        bob = await connect(stack, BOB)
        await call(alice, "add_finding_to_memory", {"run": "alice-inc", "finding": secret, "subject": "payments-ledger-7f3a"})
        mine = await call(alice, "search_memory", {"query": "payments ledger replica quorum"})
        assert mine["hits"], mine
        hits = await call(bob, "search_memory", {"query": "payments ledger replica quorum"})
        err = await refused(bob, "read_entries", {"run": "alice-inc"})
        runs = await call(bob, "list_runs", {})
        seen = json.dumps([hits, err, runs])
        assert "7f3a" not in seen, seen
        return {"alice_hits": len(mine["hits"]), "bob_hits": len(hits["hits"]), "bob_read": err["error"],
                "bob_runs": len(runs["runs"])}


SCENARIOS = {"basic": basic, "concurrency": concurrency, "subscribe": subscribe, "isolation": isolation}

if __name__ == "__main__":
    print(json.dumps(asyncio.run(SCENARIOS[SCENARIO]())))
