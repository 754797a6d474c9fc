"""The OpenAI API through the official `openai` client (and raw aiohttp where the client cannot
go) against the session's `srt-serve` on a tiny model (SmolLM2: test_http_smollm2.py)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import openai
import pytest
from conftest import TINY_SERVER_MODEL

from srt.testing.server_process import ServerProcess

pytestmark = pytest.mark.slow

MODEL = TINY_SERVER_MODEL
PROMPT = "The quick brown fox jumps over the lazy dog"
MESSAGES: Any = [{"role": "user", "content": "Tell me about foxes."}]
GREEDY: Any = {"temperature": 0.0, "max_tokens": 8, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def server(tiny_server: ServerProcess) -> ServerProcess:
    return tiny_server


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def raw_post(server: ServerProcess, path: str, body: bytes | dict[str, Any]) -> tuple[int, Any]:
    """(status, parsed body) of a POST, with bytes sent as they are; an event stream comes back
    as the list of its `data:` payloads, `[DONE]` kept as the string."""

    async def go() -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(server.url + path, data=data, headers=headers) as response,
        ):
            if response.headers["Content-Type"].startswith("text/event-stream"):
                return response.status, [event async for event in events(response)]
            return response.status, await response.json()

    return asyncio.run(go())


async def events(response: aiohttp.ClientResponse) -> Any:
    async for line in response.content:
        if line.startswith(b"data: "):
            payload = line[len(b"data: ") :].strip()
            yield "[DONE]" if payload == b"[DONE]" else json.loads(payload)


# ---- answers -------------------------------------------------------------------------------


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_openapi_describes_the_openai_routes(server: ServerProcess) -> None:
    async def go() -> Any:
        async with (
            aiohttp.ClientSession() as session,
            session.get(server.url + "/openapi.json") as response,
        ):
            return await response.json()

    paths = asyncio.run(go())["paths"]
    for path in ("/v1/completions", "/v1/chat/completions"):
        assert paths[path]["post"]["summary"].startswith(("Completes", "Answers"))
        assert "max_tokens" in paths[path]["post"]["description"]
    assert "/v1/models" in paths


def test_chat_streams_what_it_answers(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY)
    assert answer.id.startswith("chatcmpl-")
    (choice,) = answer.choices
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 8
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    *deltas, usage = chunks
    assert deltas[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in deltas[1:])
    assert "".join(c.choices[0].delta.content or "" for c in deltas) == choice.message.content
    assert [c.choices[0].finish_reason for c in deltas][-1] == "length"
    assert usage.choices == []
    assert usage.usage is not None
    assert usage.usage.completion_tokens == 8
    assert usage.usage.prompt_tokens == answer.usage.prompt_tokens


def test_completions_with_n_stream_each_choice(client: openai.OpenAI) -> None:
    answer = client.completions.create(model=MODEL, prompt=PROMPT, n=2, **GREEDY)
    assert answer.id.startswith("cmpl-")
    assert [c.index for c in answer.choices] == [0, 1]
    texts = [c.text for c in answer.choices]
    assert texts[0] == texts[1]  # greedy
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 16
    streamed = ["", ""]
    finishes: list[tuple[int, str]] = []
    chunks = client.completions.create(model=MODEL, prompt=PROMPT, n=2, stream=True, **GREEDY)
    for chunk in chunks:
        (choice,) = chunk.choices
        streamed[choice.index] += choice.text
        if choice.finish_reason is not None:
            finishes.append((choice.index, choice.finish_reason))
    assert streamed == texts
    assert sorted(finishes) == [(0, "length"), (1, "length")]


def test_prompt_forms_and_echo(client: openai.OpenAI) -> None:
    batch = client.completions.create(model=MODEL, prompt=[PROMPT, "Hello"], **GREEDY)
    single = client.completions.create(model=MODEL, prompt=PROMPT, **GREEDY)
    assert batch.choices[0].text == single.choices[0].text
    assert len(batch.choices) == 2
    echoed = client.completions.create(model=MODEL, prompt=PROMPT, echo=True, **GREEDY)
    assert echoed.choices[0].text == PROMPT + single.choices[0].text
    by_ids = client.completions.create(model=MODEL, prompt=[[5, 6, 7], [8, 9]], **GREEDY)
    assert len(by_ids.choices) == 2
    assert by_ids.usage is not None
    assert by_ids.usage.prompt_tokens == 5


def test_logprobs(client: openai.OpenAI) -> None:
    completion = client.completions.create(model=MODEL, prompt=PROMPT, logprobs=2, **GREEDY)
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens is not None
    assert logprobs.token_logprobs is not None
    assert logprobs.top_logprobs is not None
    assert len(logprobs.tokens) == 8
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    assert all(1 <= len(top) <= 2 for top in logprobs.top_logprobs)
    chat = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=2, **GREEDY
    )
    content = chat.choices[0].logprobs
    assert content is not None
    assert content.content is not None
    assert len(content.content) == 8
    # Greedy: each chosen token is the best of its alternatives.
    assert all(t.top_logprobs[0].logprob == t.logprob for t in content.content)
    assert all(len(t.top_logprobs) == 2 for t in content.content)


def test_echo_with_logprobs_starts_with_the_prompt(client: openai.OpenAI) -> None:
    plain = client.completions.create(model=MODEL, prompt=PROMPT, logprobs=1, **GREEDY)
    echoed = client.completions.create(
        model=MODEL, prompt=PROMPT, echo=True, logprobs=1, **GREEDY
    ).choices[0]
    assert echoed.text == PROMPT + plain.choices[0].text
    logprobs, out = echoed.logprobs, plain.choices[0].logprobs
    assert logprobs is not None
    assert out is not None
    assert logprobs.tokens is not None
    assert logprobs.token_logprobs is not None
    assert logprobs.top_logprobs is not None
    prompt_tokens = len(logprobs.tokens) - 8
    assert plain.usage is not None
    assert prompt_tokens == plain.usage.prompt_tokens
    assert logprobs.tokens[prompt_tokens:] == out.tokens
    assert "".join(logprobs.tokens[:prompt_tokens]).endswith(PROMPT)
    assert logprobs.token_logprobs[0] is None
    assert logprobs.top_logprobs[0] is None
    assert all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert all(len(top) == 1 for top in logprobs.top_logprobs[1:])
    assert logprobs.text_offset == sorted(logprobs.text_offset)
    streamed: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "text_offset": []}
    text = ""
    for chunk in client.completions.create(
        model=MODEL, prompt=PROMPT, echo=True, logprobs=1, stream=True, **GREEDY
    ):
        text += chunk.choices[0].text
        chunk_logprobs = chunk.choices[0].logprobs
        assert chunk_logprobs is not None
        for key, values in streamed.items():
            values += getattr(chunk_logprobs, key)
    assert text == echoed.text
    assert streamed["tokens"] == logprobs.tokens
    assert streamed["text_offset"] == logprobs.text_offset
    assert streamed["token_logprobs"][1:] == pytest.approx(logprobs.token_logprobs[1:], abs=1e-3)


def test_stop_strings_end_the_text(client: openai.OpenAI) -> None:
    free = client.completions.create(model=MODEL, prompt=PROMPT, **GREEDY).choices[0].text
    stop = next(free[i : i + 2] for i in range(1, len(free) - 1) if free[i : i + 2].isprintable())
    stopped = client.completions.create(model=MODEL, prompt=PROMPT, stop=[stop], **GREEDY)
    assert stopped.choices[0].text == free[: free.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"


def test_usage_counts_cached_prompt_tokens(client: openai.OpenAI) -> None:
    prompt = f"cache me {PROMPT} {PROMPT}"
    first = client.completions.create(model=MODEL, prompt=prompt, **GREEDY).usage
    again = client.completions.create(model=MODEL, prompt=prompt, **GREEDY).usage
    assert first is not None
    assert again is not None
    assert again.prompt_tokens == first.prompt_tokens
    assert again.prompt_tokens_details is not None
    assert 0 < (again.prompt_tokens_details.cached_tokens or 0) < again.prompt_tokens


# ---- errors --------------------------------------------------------------------------------


def test_an_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4", messages=MESSAGES)
    assert isinstance(info.value.body, dict)
    assert info.value.body["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"prompt": ""}, "prompt"),
        ({"stop": 5}, "stop"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
    ],
)
def test_bad_fields_are_400_naming_them(
    client: openai.OpenAI, fields: dict[str, Any], param: str
) -> None:
    body = {"model": MODEL, "prompt": PROMPT, **fields}
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(**body)
    assert isinstance(info.value.body, dict)
    assert info.value.body["param"] == param


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_finite_numbers_are_400(server: ServerProcess, literal: bytes) -> None:
    body = b'{"model": "tiny", "prompt": "x", "temperature": ' + literal + b"}"
    status, error = raw_post(server, "/v1/completions", body)
    assert status == 400
    assert error["error"]["type"] == "invalid_request_error"


def test_a_prompt_beyond_the_context_is_400_then_service_goes_on(
    server: ServerProcess, client: openai.OpenAI
) -> None:
    status, error = raw_post(
        server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 10**6}
    )
    assert status == 400
    assert "1000000" in error["error"]["message"]
    assert client.completions.create(model=MODEL, prompt=PROMPT, **GREEDY).choices[0].text


def test_an_aborted_stream_ends_with_finish_reason_abort(server: ServerProcess) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "stream": True, "ignore_eos": True}
    body["stream_options"] = {"include_usage": True}

    async def go() -> list[Any]:
        async with aiohttp.ClientSession() as session:
            response = await session.post(server.url + "/v1/completions", json=body)
            assert response.status == 200
            stream = events(response)
            first = await anext(stream)
            abort = {"rid": first["id"]}  # one prompt sampled once: its rid is the response id
            async with session.post(server.url + "/abort_request", json=abort) as aborted:
                assert aborted.status == 200
            rest = [event async for event in stream]
            response.close()
            return [first, *rest]

    *chunks, usage, done = asyncio.run(go())
    assert done == "[DONE]"
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "abort"
    assert usage["usage"]["completion_tokens"] >= len(chunks) - 1


async def server_load(session: aiohttp.ClientSession, server: ServerProcess) -> dict[str, int]:
    async with session.get(server.url + "/get_server_info") as response:
        load: dict[str, int] = (await response.json())["load"]
        return load


async def wait_load(server: ServerProcess, running: bool) -> dict[str, int]:
    """The server's load once requests run (`running`) or once none runs or waits."""
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            load = await server_load(session, server)
            busy = load["num_running_reqs"] + load["num_waiting_reqs"] > 0
            if busy == running and (not running or load["num_running_reqs"] > 0):
                return load
            await asyncio.sleep(0.05)
    raise AssertionError(f"the server's load stayed {load}")


def test_an_aborted_request_answers_what_it_generated(server: ServerProcess) -> None:
    """An operator's abort is no error (no retry): the choice ends with finish reason abort."""
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    long: Any = {"extra_body": {"ignore_eos": True}}

    async def go() -> Any:
        answer = asyncio.ensure_future(
            client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, **long)
        )
        await wait_load(server, running=True)
        async with (
            aiohttp.ClientSession() as session,
            session.post(server.url + "/abort_request", json={"abort_all": True}) as aborted,
        ):
            assert aborted.status == 200
        return await answer

    answer = asyncio.run(go())
    assert [c.finish_reason for c in answer.choices] == ["abort", "abort"]
    assert answer.usage is not None
    assert answer.usage.prompt_tokens > 0
    again = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    assert again.chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY).choices


def test_a_client_gone_mid_stream_has_its_request_aborted(server: ServerProcess) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "stream": True, "ignore_eos": True}

    async def go() -> str:
        async with aiohttp.ClientSession() as session:
            response = await session.post(server.url + "/v1/chat/completions", json=body)
            assert response.status == 200
            first = await anext(events(response))
            response.close()  # the client goes away after one chunk
        return str(first["id"])  # one prompt sampled once: its rid is the response id

    rid = asyncio.run(go())
    load = asyncio.run(wait_load(server, running=False))
    assert load["invariant_violations"] == 0
    for _ in range(100):  # the log line may trail the load by a moment
        if f"Finish: rid={rid} finish_reason=abort" in server.output():
            break
        time.sleep(0.05)
    assert f"Finish: rid={rid} finish_reason=abort" in server.output()


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        ("/v1/completions", {"prompt": [2**32], "echo": True}, "prompt"),
        ("/v1/completions", {"prompt": [2**31 - 1], "echo": True}, "prompt"),
        ("/v1/completions", {"prompt": [2**31 - 1]}, "prompt"),
        ("/v1/completions", {"prompt": [PROMPT] * 129}, "prompt"),
        ("/v1/completions", {"prompt": [PROMPT] * 9, "n": 128}, "n"),
        ("/v1/completions", {"top_k": 2**63}, "top_k"),
        ("/v1/completions", {"max_tokens": 2**63}, "max_tokens"),
        ("/v1/completions", {"stop": ["s"] * 100_000}, "stop"),
        ("/v1/completions", {"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
        ("/v1/completions", {"logit_bias": {"99999999": 1}}, "logit_bias"),
        ("/v1/chat/completions", {"max_completion_tokens": 2**63}, "max_completion_tokens"),
        ("/v1/chat/completions", {"top_k": 2**63}, "top_k"),
        ("/v1/chat/completions", {"stop_token_ids": [1] * 100_000}, "stop_token_ids"),
    ],
)
def test_hostile_sizes_and_integers_are_400_naming_the_field(
    server: ServerProcess,
    client: openai.OpenAI,
    path: str,
    fields: dict[str, Any],
    param: str,
) -> None:
    prompt = {"messages": MESSAGES} if "chat" in path else {"prompt": PROMPT}
    status, error = raw_post(server, path, {"model": MODEL, **prompt, **fields})
    assert status == 400, error
    assert error["error"]["param"] == param, error
    assert client.completions.create(model=MODEL, prompt=PROMPT, **GREEDY).choices[0].text
