"""benches/soak.py: a short soak against a real srt-serve on a tiny model must find nothing wrong,
and its client must call each way a server can fail a request by its name."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import soak
import soak_traffic
from aiohttp import web
from soak_hostile import HOSTILE_REQUESTS, HostileRequest, RawRequest, Target
from soak_traffic import Action, Outcome, Planned, Result, run_planned


@pytest.mark.slow
def test_short_soak_finds_nothing_wrong(
    tiny_model_factory: Callable[[str], Path], tmp_path: Path
) -> None:
    """A few hundred mixed requests, every hostile one among them, against a server the soak
    starts (with an API key) and stops: no 5xx, nothing lost, the KV bookkeeping intact and
    every slot back, the same three processes throughout, and nothing left running."""
    out = tmp_path / "soak.json"
    flags = {
        "--model": str(tiny_model_factory("llama")),
        "--requests": "300",
        "--warmup-requests": "30",
        "--concurrency": "32",
        "--max-prompt-len": "16",
        "--max-output-len": "4",
        "--long-output-len": "32",
        "--request-timeout": "60",
        "--idle-timeout": "60",
        "--max-seconds": "300",
        "--seed": "0",
        "--json": str(out),
    }
    code = soak.main([part for flag in flags.items() for part in flag])
    report = json.loads(out.read_text())
    assert report["server_errors"] == 0, report["problems"]
    assert report["lost"] == 0, report["problems"]
    assert report["ordinary_refused"] == 0, report["problems"]
    assert report["not_sent"] == 0
    kv = report["kv"]
    assert kv["idle_after_warmup"]
    assert kv["idle_at_end"]
    assert kv["violations_before"] == kv["violations_after"] == 0
    assert kv["slots_returned"]
    assert report["same_process"] == {"main": True, "scheduler": True, "detokenizer": True}
    assert report["server_stop"] == {"exit_code": 0, "left_running": []}
    # The mix really ran: every kind of ending, and each hostile request once.
    outcomes = report["outcomes"]
    for outcome in ("ok", "aborted", "disconnected", "refused"):
        assert outcomes.get(outcome, 0) > 0, outcomes
    assert sum(outcomes.values()) == report["requests"] == 300
    assert {name: len(s) for name, s in report["hostile"].items()} == {
        h.name: 1 for h in HOSTILE_REQUESTS
    }
    assert all(size is not None for size in report["rss"]["end_mib"].values())
    assert report["failures"] == []
    assert code == 0


# ---- the client's verdicts, against a server that fails in every way --------------------------


def sse(*events: Any) -> bytes:
    return b"".join(
        b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n"
        for e in events
    )


async def broken_route(request: web.Request) -> web.StreamResponse:
    """Does to the request what its prompt says."""
    body = await request.json()
    what = body.get("text") or body.get("prompt") or "chat"
    if what == "hang":
        await asyncio.sleep(60)
    if what == "500":
        return web.json_response({"error": {"message": "boom", "code": 500}}, status=500)
    if what == "ok":
        meta = {"finish_reason": {"type": "length"}, "completion_tokens": 3}
        return web.json_response({"text": "abc", "meta_info": meta})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    chunk = {"choices": [{"index": 0, "text": "a", "finish_reason": None}]}
    if what == "truncated":
        await response.write(sse(chunk))
    elif what == "chat":  # [DONE], but no choice ever finished
        await response.write(sse(chunk, b"[DONE]"))
    elif what == "error-event":
        error = {"message": "the server cannot serve requests", "code": 503}
        await response.write(sse({"error": error}, b"[DONE]"))
    elif what == "forever":  # ignores disconnects and aborts alike
        while True:
            await response.write(sse({"text": "a", "meta_info": {"finish_reason": None}}))
            await asyncio.sleep(0.02)
    return response


async def accept_abort(request: web.Request) -> web.Response:
    return web.json_response({"success": True})


async def verdicts(cases: list[Planned], timeout_s: float) -> list[Result]:
    app = web.Application()
    for path in soak_traffic.PATHS.values():
        app.router.add_post(path, broken_route)
    app.router.add_post("/abort_request", accept_abort)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            target = Target(port, "m", 10, None)
            url = f"http://127.0.0.1:{port}"
            return [
                (await run_planned(session, url, target, c, timeout_s, abort_deadline_s=0.3))[0]
                for c in cases
            ]
    finally:
        await runner.cleanup()


def test_client_names_each_failure() -> None:
    def generate(index: int, text: str, **kw: Any) -> Planned:
        return Planned(
            index, kw.pop("action", Action.NORMAL), "generate", payload={"text": text}, **kw
        )

    def server_error_raw(target: Target) -> RawRequest:
        return RawRequest("POST", "/generate", b'{"text": "500"}', [])

    cases = [
        generate(0, "ok"),
        generate(1, "500"),
        generate(2, "hang"),
        generate(3, "error-event", stream=True),
        Planned(4, Action.NORMAL, "completions", True, {"prompt": "truncated"}),
        Planned(5, Action.NORMAL, "chat", True, {"messages": []}),
        generate(6, "forever", action=Action.DISCONNECT, stream=True, cut_after=2),
        generate(7, "forever", action=Action.ABORT, stream=True, rid="r", cut_after=1),
        generate(8, "hang", action=Action.DISCONNECT, cut_after=0.1),
        Planned(9, Action.HOSTILE, "x", hostile=HostileRequest("x", server_error_raw)),
    ]
    results = asyncio.run(verdicts(cases, timeout_s=1.0))
    got = [(r.outcome, r.status) for r in results]
    assert got == [
        (Outcome.OK, 200),
        (Outcome.SERVER_ERROR, 500),
        (Outcome.LOST, None),
        (Outcome.SERVER_ERROR, 503),
        (Outcome.LOST, None),
        (Outcome.LOST, 200),
        (Outcome.DISCONNECTED, None),
        (Outcome.LOST, None),
        (Outcome.DISCONNECTED, None),
        (Outcome.SERVER_ERROR, 500),
    ]
    assert results[0].output_tokens == 3
    assert "no answer within" in results[2].detail
    assert "without [DONE]" in results[4].detail
    assert "0 of 1 outputs" in results[5].detail
    assert "after its abort was accepted" in results[7].detail
