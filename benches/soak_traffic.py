"""The soak's traffic: a seeded plan of mixed requests, and the client that sends one and says
how it ended.

The mix: native `/generate`, `/v1/completions` and `/v1/chat/completions` (4:3:3), half of them
streamed; prompts of 1 to `max_prompt_len` words or token ids, outputs of 1 to `max_output_len`
tokens, with now and then sampling, a seed, `n` = 2, logprobs, stop strings or a batch of two
prompts. About 10% of clients disconnect on purpose (a stream after a chunk or three, or any
request after a moment) and 5% are aborted by id (`POST /abort_request` with the rid the client
chose, so native requests only), both on long outputs (`ignore_eos`) so that the cut lands
mid-generation.

Each request ends in one `Outcome`. A request is LOST when it was neither answered nor refused:
no answer within the client's timeout, a broken connection, a stream that ends without its
final chunk or `[DONE]`, or an aborted request still running `ABORT_END_S` (or the deadline
given) after its abort was accepted. Requests the soak cut itself (DISCONNECTED) end at once by
construction; the server's side of them is checked at the end, when the server must be idle
with its KV slots back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import json
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from soak_hostile import HostileRequest, Target, send_raw
from soak_payloads import PAYLOADS, Options

ABORT_END_S = 60.0
"""By default, an aborted request must end this soon after `/abort_request` accepted its abort:
within a forward pass or two, which on a loaded 2-core machine can take tens of seconds."""
ABORT_RETRY_S = 0.02
DISCONNECT_SHARE = 0.10
ABORT_SHARE = 0.05
APIS = ("generate", "completions", "chat")
API_WEIGHTS = (4, 3, 3)
PATHS = {"generate": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}


class Outcome(enum.StrEnum):
    OK = "ok"
    ABORTED = "aborted"
    """Ended with finish reason "abort"."""
    DISCONNECTED = "disconnected"
    """Cut by the soak on purpose."""
    REFUSED = "refused"
    """A 4xx answer (or a 4xx error event in a stream)."""
    SERVER_ERROR = "server_error"
    """A 5xx answer (or a 5xx error event in a stream)."""
    LOST = "lost"


class Action(enum.StrEnum):
    NORMAL = "normal"
    DISCONNECT = "disconnect"
    ABORT = "abort"
    HOSTILE = "hostile"


@dataclass(frozen=True)
class Shape:
    """What the plan draws from: the server's model, and the lengths asked for."""

    model: str
    vocab_size: int
    context_length: int
    max_prompt_len: int
    max_output_len: int
    long_output_len: int


@dataclass(frozen=True)
class Planned:
    index: int
    action: Action
    api: str
    """One of `APIS`, or a hostile request's name."""
    stream: bool = False
    payload: dict[str, Any] = field(default_factory=dict)
    outputs: int = 1
    """How many outputs (prompts times n) must each end with a finish reason."""
    rid: str | None = None
    cut_after: float = 0.0
    """Disconnect or abort: data chunks to read (a stream) or seconds to wait (otherwise)."""
    hostile: HostileRequest | None = None


@dataclass
class Result:
    index: int
    action: Action
    api: str
    outcome: Outcome
    status: int | None = None
    detail: str = ""
    output_tokens: int = 0
    abort_latency_s: float | None = None
    """Seconds from the acceptance of its abort to its end (an aborted request)."""


def plan_traffic(
    rng: random.Random,
    count: int,
    shape: Shape,
    run_id: str,
    hostile: Iterable[HostileRequest] = (),
) -> list[Planned]:
    """`count` requests: the hostile ones at random places among ordinary ones."""
    hostile = list(hostile)
    mixed: list[Planned | HostileRequest] = [
        _plan_ordinary(rng, shape) for _ in range(max(0, count - len(hostile)))
    ]
    for request in hostile:
        mixed.insert(rng.randrange(len(mixed) + 1), request)
    out = []
    for index, item in enumerate(mixed[:count]):
        if isinstance(item, HostileRequest):
            out.append(Planned(index, Action.HOSTILE, item.name, hostile=item))
        elif item.action is Action.ABORT:
            # Only aborts need to know their rid; the index makes it unique within the run.
            rid = f"soak-{run_id}-{index}"
            payload = item.payload | {"rid": rid}
            out.append(dataclasses.replace(item, index=index, rid=rid, payload=payload))
        else:
            out.append(dataclasses.replace(item, index=index))
    return out


def _plan_ordinary(rng: random.Random, shape: Shape) -> Planned:
    roll = rng.random()
    action = (
        Action.DISCONNECT
        if roll < DISCONNECT_SHARE
        else Action.ABORT
        if roll < DISCONNECT_SHARE + ABORT_SHARE
        else Action.NORMAL
    )
    api = "generate" if action is Action.ABORT else rng.choices(APIS, API_WEIGHTS)[0]
    stream = rng.random() < 0.5
    plain = action is Action.NORMAL
    options = Options(
        output_len=rng.randint(1, shape.max_output_len) if plain else shape.long_output_len,
        ignore_eos=not plain,
        temperature=0.0 if rng.random() < 0.5 else 0.8,
        top_p=0.9 if rng.random() < 0.3 else None,
        seed=rng.randrange(2**31) if rng.random() < 0.2 else None,
        n=2 if plain and rng.random() < 0.1 else 1,
        logprobs=plain and rng.random() < 0.1,
        stop=plain and rng.random() < 0.1,
    )
    if action is Action.DISCONNECT:
        cut_after = float(rng.randint(1, 3)) if stream else rng.uniform(0.05, 0.5)
    elif action is Action.ABORT:
        cut_after = 1.0 if stream else rng.uniform(0.0, 0.3)
    else:
        cut_after = 0.0
    payload, prompts = PAYLOADS[api](rng, shape, options, stream)
    return Planned(0, action, api, stream, payload, prompts * options.n, cut_after=cut_after)


# ---- sending -----------------------------------------------------------------------------------


@dataclass
class _Progress:
    """What the request's task tells its aborter, and the aborter tells the request."""

    first_chunk: asyncio.Event = field(default_factory=asyncio.Event)
    abort_statuses: list[int] = field(default_factory=list)
    accepted_at: float | None = None
    overdue: bool = False


async def run_planned(
    session: aiohttp.ClientSession,
    base_url: str,
    target: Target,
    planned: Planned,
    timeout_s: float,
    abort_deadline_s: float = ABORT_END_S,
) -> tuple[Result, list[int]]:
    """Sends one planned request and says how it ended; never raises. Also returns the statuses
    of the `/abort_request` calls it made."""
    if planned.hostile is not None:
        status, message = await send_raw(planned.hostile.build(target), target.port, timeout_s)
        return _status_result(planned, status, message), []
    progress = _Progress()
    task = asyncio.create_task(_exchange(session, base_url, planned, progress))
    aborter = None
    if planned.action is Action.ABORT:
        aborter = asyncio.create_task(
            _abort(session, base_url, planned, progress, task, abort_deadline_s)
        )
    wait_s = timeout_s
    if planned.action is Action.DISCONNECT and not planned.stream:
        wait_s = planned.cut_after
    done, _ = await asyncio.wait({task}, timeout=wait_s)
    if aborter is not None:
        aborter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await aborter
    if not done:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if wait_s != timeout_s:
            return Result(planned.index, planned.action, planned.api, Outcome.DISCONNECTED), []
        detail = f"no answer within {timeout_s:g} s"
        return _lost(planned, detail), progress.abort_statuses
    if progress.overdue:
        detail = f"still running {abort_deadline_s:g} s after its abort was accepted"
        return _lost(planned, detail), progress.abort_statuses
    result = task.result()
    if progress.accepted_at is not None:
        result.abort_latency_s = time.monotonic() - progress.accepted_at
    return result, progress.abort_statuses


def _lost(planned: Planned, detail: str) -> Result:
    return Result(planned.index, planned.action, planned.api, Outcome.LOST, detail=detail)


def _status_result(planned: Planned, status: int | None, message: str) -> Result:
    """How a request answered with `status` (None: not at all) ended."""
    if status is None:
        return _lost(planned, message)
    if status >= 500:
        outcome = Outcome.SERVER_ERROR
    elif status >= 400:
        outcome = Outcome.REFUSED
    else:
        outcome = Outcome.OK
    return Result(planned.index, planned.action, planned.api, outcome, status, message)


async def _abort(
    session: aiohttp.ClientSession,
    base_url: str,
    planned: Planned,
    progress: _Progress,
    task: asyncio.Task[Result],
    deadline_s: float,
) -> None:
    """Aborts `planned` by its rid once it runs (after its first chunk, or `cut_after`
    seconds), retrying while the server does not know it yet; then gives it `deadline_s` to
    end, or cancels it as overdue."""
    if planned.stream:
        started = asyncio.create_task(progress.first_chunk.wait())
        await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
    else:
        await asyncio.wait({task}, timeout=planned.cut_after)
    while not task.done():
        try:
            async with session.post(
                f"{base_url}/abort_request", json={"rid": planned.rid}
            ) as response:
                progress.abort_statuses.append(response.status)
                await response.read()
                accepted = response.status == 200
        except aiohttp.ClientError:
            accepted = False
        if accepted:
            break
        if progress.abort_statuses and progress.abort_statuses[-1] != 404:
            return  # refused for a reason retrying will not change; the request runs out
        await asyncio.sleep(ABORT_RETRY_S)
    else:
        return
    progress.accepted_at = time.monotonic()
    done, _ = await asyncio.wait({task}, timeout=deadline_s)
    if not done:
        progress.overdue = True
        task.cancel()


async def _exchange(
    session: aiohttp.ClientSession, base_url: str, planned: Planned, progress: _Progress
) -> Result:
    try:
        async with session.post(base_url + PATHS[planned.api], json=planned.payload) as response:
            if response.status != 200:
                return _status_result(planned, response.status, await _error_text(response))
            if planned.stream:
                return await _read_stream(response, planned, progress)
            return _finished(planned, _Ends.of_answer(planned.api, await response.json()))
    except (aiohttp.ClientError, ValueError) as e:
        return _lost(planned, f"{type(e).__name__}: {e}")


async def _error_text(response: aiohttp.ClientResponse) -> str:
    body = await response.read()
    try:
        return str(json.loads(body)["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return body[:300].decode(errors="replace")


async def _read_stream(
    response: aiohttp.ClientResponse, planned: Planned, progress: _Progress
) -> Result:
    ends = _Ends()
    chunks = 0
    async for raw in response.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return _finished(planned, ends)
        chunk = json.loads(data)
        if "error" in chunk:
            error = chunk["error"]
            return _status_result(planned, _event_status(error), str(error.get("message")))
        chunks += 1
        progress.first_chunk.set()
        ends.add_chunk(planned.api, chunk)
        if planned.action is Action.DISCONNECT and chunks >= planned.cut_after:
            response.close()
            return Result(planned.index, planned.action, planned.api, Outcome.DISCONNECTED)
    return _lost(planned, f"the stream ended without [DONE] after {chunks} chunks")


def _event_status(error: dict[str, Any]) -> int:
    """The HTTP status an SSE error event stands for (srt puts it in `code`)."""
    code = error.get("code")
    if isinstance(code, int) and not isinstance(code, bool):
        return code
    return 500 if error.get("type") in ("server_error", "service_unavailable") else 400


@dataclass
class _Ends:
    """The finish reason and output token count of each output of one request."""

    reasons: dict[int, str] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    usage_tokens: int | None = None

    @classmethod
    def of_answer(cls, api: str, body: Any) -> _Ends:
        ends = cls()
        if api == "generate":
            for index, item in enumerate(body if isinstance(body, list) else [body]):
                ends.add_native(index, item["meta_info"])
        else:
            ends.add_choices(body["choices"], count_tokens=False)
            ends.usage_tokens = int(body["usage"]["completion_tokens"])
        return ends

    def add_chunk(self, api: str, chunk: dict[str, Any]) -> None:
        if api == "generate":
            self.add_native(int(chunk.get("index", 0)), chunk["meta_info"])
            return
        self.add_choices(chunk.get("choices") or [], count_tokens=True)
        if chunk.get("usage"):
            self.usage_tokens = int(chunk["usage"]["completion_tokens"])

    def add_native(self, index: int, meta: dict[str, Any]) -> None:
        self.tokens[index] = int(meta.get("completion_tokens", 0))  # cumulative
        reason = meta.get("finish_reason")
        if reason:
            self.reasons[index] = str(reason.get("type"))

    def add_choices(self, choices: list[dict[str, Any]], count_tokens: bool) -> None:
        for choice in choices:
            index = int(choice.get("index", 0))
            if count_tokens and (choice.get("text") or (choice.get("delta") or {}).get("content")):
                self.tokens[index] = self.tokens.get(index, 0) + 1  # about one token a chunk
            if choice.get("finish_reason"):
                self.reasons[index] = str(choice["finish_reason"])

    @property
    def output_tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else sum(self.tokens.values())


def _finished(planned: Planned, ends: _Ends) -> Result:
    """A complete answer: OK (or ABORTED) when every output ended with a finish reason."""
    result = Result(planned.index, planned.action, planned.api, Outcome.OK, 200)
    result.output_tokens = ends.output_tokens
    if len(ends.reasons) < planned.outputs:
        result.outcome = Outcome.LOST
        result.detail = f"{len(ends.reasons)} of {planned.outputs} outputs have a finish reason"
    elif "abort" in ends.reasons.values():
        result.outcome = Outcome.ABORTED
    return result
