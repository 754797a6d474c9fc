"""SGLang's native API and the operations routes, through real HTTP against `srt-serve` on a tiny
model: one server for the module."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import aiohttp
import pytest

from srt.testing.server_process import ServerProcess

pytestmark = pytest.mark.slow

GREEDY = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
PROMPT = "The quick brown fox jumps over the lazy dog"
UNTIL_CONTEXT_ENDS = {"max_new_tokens": None, "ignore_eos": True}
"""A request that runs for as long as the context allows: long enough to be cut short."""


@pytest.fixture(scope="module")
def server(tiny_server: ServerProcess) -> ServerProcess:
    return tiny_server


def call(server: ServerProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """(status, parsed JSON body) of one request; `body` bytes are sent as they are, as JSON."""

    async def go() -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else None
        payload = None if isinstance(body, bytes) else body
        headers = {"Content-Type": "application/json"} if data is not None else None
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                method, server.url + path, json=payload, data=data, headers=headers
            ) as response,
        ):
            text = await response.text()
            return response.status, json.loads(text) if text else None

    return asyncio.run(go())


async def read_events(response: aiohttp.ClientResponse) -> list[Any]:
    """The `data:` payloads of an SSE body, `[DONE]` kept as the string."""
    events = []
    async for line in response.content:
        if line.startswith(b"data: "):
            payload = line[len(b"data: ") :].strip()
            events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return events


async def start_long_stream(
    session: aiohttp.ClientSession, server: ServerProcess, rid: str
) -> aiohttp.ClientResponse:
    """A streamed request `rid` that runs until the context ends, once its first event is in."""
    body = {"text": PROMPT, "rid": rid, "stream": True, "sampling_params": UNTIL_CONTEXT_ENDS}
    response = await session.post(server.url + "/generate", json=body)
    await response.content.readline()
    return response


def stream(server: ServerProcess, body: dict[str, Any]) -> list[Any]:
    async def go() -> list[Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(server.url + "/generate", json={**body, "stream": True}) as response,
        ):
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            return await read_events(response)

    return asyncio.run(go())


def load(server: ServerProcess) -> dict[str, Any]:
    status, info = call(server, "GET", "/get_server_info")
    assert status == 200
    loaded: dict[str, Any] = info["load"]
    return loaded


# ---- /generate ---------------------------------------------------------------------------------


def test_generate_single(server: ServerProcess) -> None:
    status, out = call(server, "POST", "/generate", {"text": PROMPT, "sampling_params": GREEDY})
    assert status == 200
    assert len(out["output_ids"]) == 8
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 8
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert meta["prompt_tokens"] > 0
    assert meta["e2e_latency"] > 0
    assert {"id", "cached_tokens"} <= set(meta)


def test_generate_batch_input_ids_and_n(server: ServerProcess) -> None:
    _, single = call(server, "POST", "/generate", {"text": PROMPT, "sampling_params": GREEDY})
    status, batch = call(
        server, "POST", "/generate", {"text": [PROMPT, "Hello"], "sampling_params": GREEDY}
    )
    assert status == 200
    assert [len(r["output_ids"]) for r in batch] == [8, 8]
    assert batch[0]["output_ids"] == single["output_ids"]
    _, ids = call(server, "POST", "/tokenize", {"prompt": PROMPT})
    status, by_ids = call(
        server, "POST", "/generate", {"input_ids": ids["tokens"], "sampling_params": GREEDY}
    )
    assert status == 200
    assert by_ids["output_ids"] == single["output_ids"]
    status, samples = call(
        server, "POST", "/generate", {"text": PROMPT, "sampling_params": {**GREEDY, "n": 2}}
    )
    assert status == 200
    assert [s["output_ids"] for s in samples] == [single["output_ids"]] * 2


def test_stream_is_cumulative_and_ends_like_the_plain_answer(server: ServerProcess) -> None:
    _, plain = call(server, "POST", "/generate", {"text": PROMPT, "sampling_params": GREEDY})
    events = stream(server, {"text": PROMPT, "sampling_params": GREEDY})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) >= 2
    for earlier, later in itertools.pairwise(chunks):
        assert later["text"].startswith(earlier["text"])
        assert later["output_ids"][: len(earlier["output_ids"])] == earlier["output_ids"]
    assert chunks[-1]["text"] == plain["text"]
    assert chunks[-1]["output_ids"] == plain["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_batch_stream_carries_indexes(server: ServerProcess) -> None:
    events = stream(server, {"text": [PROMPT, "Hello"], "sampling_params": GREEDY})
    finals = {c["index"]: c for c in events[:-1] if c["meta_info"]["finish_reason"]}
    assert sorted(finals) == [0, 1]
    assert all(len(c["output_ids"]) == 8 for c in finals.values())


def test_logprobs_come_back(server: ServerProcess) -> None:
    body = {
        "text": PROMPT,
        "sampling_params": GREEDY,
        "return_logprob": True,
        "top_logprobs_num": 2,
    }
    status, out = call(server, "POST", "/generate", body)
    assert status == 200
    logprobs = out["meta_info"]["output_token_logprobs"]
    assert [token for _, token, _ in logprobs] == out["output_ids"]
    assert all(logprob <= 0 for logprob, _, _ in logprobs)
    assert all(len(top) == 2 for top in out["meta_info"]["output_top_logprobs"])


def test_200_concurrent_streams_all_complete(server: ServerProcess) -> None:
    async def one(session: aiohttp.ClientSession, i: int) -> Any:
        body = {"text": f"{i} {PROMPT}", "sampling_params": {**GREEDY, "max_new_tokens": 4}}
        async with session.post(server.url + "/generate", json={**body, "stream": True}) as r:
            assert r.status == 200
            return await read_events(r)

    async def go() -> list[Any]:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            return await asyncio.gather(*(one(session, i) for i in range(200)))

    results = asyncio.run(go())
    assert all(events[-1] == "[DONE]" for events in results)
    assert all(len(events[-2]["output_ids"]) == 4 for events in results)
    assert load(server)["invariant_violations"] == 0


def test_disconnect_aborts_the_request(server: ServerProcess) -> None:
    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            response = await start_long_stream(session, server, "gone-client")
            response.close()  # the client goes away mid-stream

    asyncio.run(go())
    logged = "Finish: rid=gone-client finish_reason=abort"
    for _ in range(200):
        now = load(server)
        if (now["num_running_reqs"], now["num_waiting_reqs"]) == (0, 0) and (
            logged in server.output()
        ):
            break
        asyncio.run(asyncio.sleep(0.05))
    assert (now["num_running_reqs"], now["num_waiting_reqs"]) == (0, 0)
    assert now["invariant_violations"] == 0
    assert logged in server.output()


# ---- operations --------------------------------------------------------------------------------


def test_model_and_server_info(server: ServerProcess) -> None:
    status, model = call(server, "GET", "/get_model_info")
    assert status == 200
    assert model["is_generation"] is True
    assert model["context_length"] > 0
    status, info = call(server, "GET", "/get_server_info")
    assert status == 200
    assert info["phase"] == "ready"
    assert info["api_key"] is None
    assert info["load"]["max_total_tokens"] > 0
    assert info["dp_size"] == 1
    # SGLang's newer names, which sglang-router asks first.
    assert call(server, "GET", "/model_info") == (200, model)
    assert call(server, "GET", "/server_info")[1].keys() == info.keys()


def test_tokenize_and_detokenize_round_trip(server: ServerProcess) -> None:
    status, tokens = call(server, "POST", "/tokenize", {"prompt": PROMPT})
    assert status == 200
    assert tokens["count"] == len(tokens["tokens"]) > 0
    status, text = call(server, "POST", "/detokenize", {"tokens": tokens["tokens"]})
    assert status == 200
    assert text["text"] == PROMPT
    status, batch = call(server, "POST", "/tokenize", {"prompt": [PROMPT, "Hi"]})
    assert status == 200
    assert batch["tokens"][0] == tokens["tokens"]


def test_flush_cache_when_idle_and_refused_while_running(server: ServerProcess) -> None:
    assert call(server, "POST", "/flush_cache")[0] == 200

    async def go() -> tuple[int, Any, list[Any]]:
        async with aiohttp.ClientSession() as session:
            response = await start_long_stream(session, server, "flush-blocker")
            async with session.post(server.url + "/flush_cache") as refused:
                status, error = refused.status, await refused.json()
            async with session.post(
                server.url + "/abort_request", json={"rid": "flush-blocker"}
            ) as aborted:
                assert aborted.status == 200
            return status, error, await read_events(response)

    status, error, events = asyncio.run(go())
    assert status == 400
    assert "not flushed" in error["error"]["message"]
    assert events[-2]["meta_info"]["finish_reason"]["type"] == "abort"
    assert call(server, "POST", "/abort_request", {"rid": "flush-blocker"})[0] == 404


def test_openapi_describes_every_route(server: ServerProcess) -> None:
    status, spec = call(server, "GET", "/openapi.json")
    assert status == 200
    for path in ("/generate", "/health", "/health_generate", "/flush_cache", "/tokenize"):
        assert path in spec["paths"], path
    assert spec["paths"]["/generate"]["post"]["summary"]


def test_health_generate(server: ServerProcess) -> None:
    assert call(server, "GET", "/health_generate")[0] == 200
    assert call(server, "GET", "/health")[0] == 200


# ---- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"text": "a", "sampling_params": {"temperature": NaN}}', "not valid JSON"),
        (b'{"text": "a", "sampling_params": {"top_p": Infinity}}', "not valid JSON"),
        (b'{"text": "a", "sampling_params": {"temperature": "hot"}}', "temperature"),
        (b'{"text": "a", "sampling_params": {"top_p": 2}}', "top_p"),
        (b'{"text": "a", "sampling_params": {"max_new_tokens": -1}}', "max_new_tokens"),
        (b'{"text": "a", "stream": "yes"}', "stream"),
        (b'{"text": "a", "colour": 1}', "colour"),
        (b'{"text": ""}', "empty"),
        (b'{"input_ids": [1, 99999999]}', "outside the vocabulary"),
        (b'{"text": 5}', "text"),
    ],
)
def test_bad_requests_are_400_in_openai_shape(
    server: ServerProcess, body: bytes, needle: str
) -> None:
    status, error = call(server, "POST", "/generate", body)
    assert status == 400
    assert set(error["error"]) == {"message", "type", "param", "code"}
    assert error["error"]["type"] == "invalid_request_error"
    assert needle in error["error"]["message"]
    assert call(server, "POST", "/generate", {"text": "ok", "sampling_params": GREEDY})[0] == 200


def test_context_overflow_names_both_numbers(server: ServerProcess) -> None:
    _, model = call(server, "GET", "/get_model_info")
    context = model["context_length"]
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": context}}
    status, error = call(server, "POST", "/generate", body)
    assert status == 400
    assert str(context) in error["error"]["message"]
    assert "max_new_tokens" in error["error"]["message"]


def test_duplicate_in_flight_rid_is_400(server: ServerProcess) -> None:
    async def go() -> tuple[int, Any]:
        async with aiohttp.ClientSession() as session:
            first = await start_long_stream(session, server, "twice")
            body = {"text": PROMPT, "rid": "twice", "sampling_params": UNTIL_CONTEXT_ENDS}
            async with session.post(server.url + "/generate", json=body) as second:
                result = second.status, await second.json()
            first.close()
            return result

    status, error = asyncio.run(go())
    assert status == 400
    assert "already in flight" in error["error"]["message"]


def test_unknown_route_and_method(server: ServerProcess) -> None:
    status, error = call(server, "GET", "/nope")
    assert status == 404
    assert error["error"]["type"] == "not_found_error"
    status, error = call(server, "GET", "/generate")
    assert status == 405
    assert "error" in error


def test_no_cors_headers_by_default(server: ServerProcess) -> None:
    async def go() -> aiohttp.ClientResponse:
        async with (
            aiohttp.ClientSession() as session,
            session.get(server.url + "/health", headers={"Origin": "http://a.example"}) as r,
        ):
            return r

    response = asyncio.run(go())
    assert "Access-Control-Allow-Origin" not in response.headers


# ---- hostile sizes and integers: a 400 naming the field, and the server goes on ---------------

BIAS_301 = {str(i): 1 for i in range(301)}  # OpenAI's limit, and the default one, is 300


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/generate", {"text": "a", "sampling_params": {"n": 400_000}}, "sampling_params.n"),
        ("/generate", {"text": ["a"] * 129}, "text"),
        ("/generate", {"input_ids": [[1]] * 129}, "input_ids"),
        ("/generate", {"text": ["a"] * 9, "sampling_params": {"n": 128}}, "sampling_params.n"),
        ("/generate", {"text": "a", "sampling_params": {"stop": ["s"] * 100_000}},
         "sampling_params.stop"),
        ("/generate", {"text": "a", "sampling_params": {"stop": "s" * 5000}},
         "sampling_params.stop"),
        ("/generate", {"text": "a", "sampling_params": {"stop_token_ids": [1] * 100_000}},
         "sampling_params.stop_token_ids"),
        ("/generate", {"text": "a", "sampling_params": {"logit_bias": BIAS_301}},
         "sampling_params.logit_bias"),
        ("/generate", {"text": "a", "return_logprob": True, "top_logprobs_num": 1024},
         "top_logprobs_num"),
        ("/generate", {"text": "a", "return_logprob": True, "top_logprobs_num": 2**63},
         "top_logprobs_num"),
        ("/generate", {"text": "a", "sampling_params": {"top_k": 2**63}}, "sampling_params.top_k"),
        ("/generate", {"text": "a", "sampling_params": {"seed": 2**63}}, "sampling_params.seed"),
        ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 2**63}},
         "sampling_params.max_new_tokens"),
        ("/generate", {"text": "a", "return_logprob": True, "logprob_start_len": 2**63},
         "logprob_start_len"),
        ("/generate", {"input_ids": [1, 2**63]}, "input_ids"),
        ("/generate", {"input_ids": [1, 99999999]}, "input_ids"),
        ("/generate", {"text": "a", "sampling_params": {"logit_bias": {str(2**32): 1}}},
         "sampling_params.logit_bias"),
        ("/tokenize", {"prompt": ["a"] * 129}, "prompt"),
        ("/detokenize", {"tokens": [[1]] * 129}, "tokens"),
        ("/detokenize", {"tokens": [1, 2**64 - 1]}, "tokens"),
        ("/detokenize", {"tokens": [1, 10**9]}, "tokens"),
    ],
)  # fmt: skip
def test_hostile_sizes_and_integers_are_400_naming_the_field(
    server: ServerProcess, path: str, body: dict[str, Any], param: str
) -> None:
    status, error = call(server, "POST", path, body)
    assert status == 400, error
    assert error["error"]["param"] == param, error
    assert error["error"]["type"] == "invalid_request_error"
    assert call(server, "POST", "/generate", {"text": "ok", "sampling_params": GREEDY})[0] == 200
