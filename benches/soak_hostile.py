"""The soak's hostile requests: one request each that once took the server down or answered 500
(issue 13). Every one must be refused with a 4xx, or served; never a 5xx, a hang or a dead stage.

They are sent over a raw socket, not aiohttp, because some are not what an HTTP client library
lets you send: header bytes that are not UTF-8, a foreign `Host`. `HOSTILE_REQUESTS` is the list
to rerun after a fix: `soak.py --hostile NAME,...` picks some.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

INT64_PAST = 2**63
"""One past the largest int64: where a value that reaches numpy, torch or Rust overflows."""
HUGE_N = 1_000_000
LONG_LIST = 20_000
LONG_STRING = 100_000
RING_FRAME_PROMPT = 1100
"""Prompt ids whose input logprobs (1024 alternatives each) fill a frame past a 16 MiB ring."""

Headers = list[tuple[bytes, bytes]]


@dataclass(frozen=True)
class Target:
    """What a hostile request needs to know about the server."""

    port: int
    model: str
    vocab_size: int
    api_key: str | None


@dataclass(frozen=True)
class RawRequest:
    method: str
    path: str
    body: bytes
    headers: Headers
    """Besides `Host`, `Content-Length` and `Connection`, which every request carries."""
    host: bytes | None = None
    """The `Host` header; None: the server's own address."""


@dataclass(frozen=True)
class HostileRequest:
    name: str
    build: Callable[[Target], RawRequest]
    needs_api_key: bool = False
    """Only meaningful against a server that checks a key (skipped otherwise)."""


def _auth(target: Target) -> Headers:
    return [(b"Authorization", f"Bearer {target.api_key}".encode())] if target.api_key else []


def _json_post(path: str, body: dict[str, Any]) -> Callable[[Target], RawRequest]:
    """A well-formed, authenticated JSON POST of `body`."""

    def build(target: Target) -> RawRequest:
        headers = [(b"Content-Type", b"application/json"), *_auth(target)]
        return RawRequest("POST", path, json.dumps(body).encode(), headers)

    return build


def _generate(**fields: Any) -> Callable[[Target], RawRequest]:
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 1}} | fields
    return _json_post("/generate", body)


def _generate_params(**params: Any) -> Callable[[Target], RawRequest]:
    return _generate(sampling_params={"max_new_tokens": 1, **params})


def _completions(**fields: Any) -> Callable[[Target], RawRequest]:
    def build(target: Target) -> RawRequest:
        body = {"model": target.model, "prompt": "Hello", "max_tokens": 1} | fields
        return _json_post("/v1/completions", body)(target)

    return build


def _bad_key_header(name: bytes, value: bytes) -> Callable[[Target], RawRequest]:
    """A request whose only key is header `name` with `value` (bytes that are not UTF-8)."""

    def build(target: Target) -> RawRequest:
        body = json.dumps({"text": "Hello", "sampling_params": {"max_new_tokens": 1}}).encode()
        return RawRequest(
            "POST", "/generate", body, [(b"Content-Type", b"application/json"), (name, value)]
        )

    return build


def _text_plain(target: Target) -> RawRequest:
    body = json.dumps({"text": "Hello", "sampling_params": {"max_new_tokens": 1}}).encode()
    return RawRequest("POST", "/generate", body, [(b"Content-Type", b"text/plain"), *_auth(target)])


def _foreign_host(target: Target) -> RawRequest:
    return RawRequest("GET", "/v1/models", b"", _auth(target), host=b"attacker.example")


def _get_flush_cache(target: Target) -> RawRequest:
    return RawRequest("GET", "/flush_cache", b"", _auth(target))


def _ids_out_of_vocab(target: Target) -> RawRequest:
    body = {"input_ids": [1, target.vocab_size + 7], "sampling_params": {"max_new_tokens": 1}}
    return _json_post("/generate", body)(target)


def _top_logprobs_over_vocab(target: Target) -> RawRequest:
    return _generate(return_logprob=True, top_logprobs_num=target.vocab_size + 1)(target)


def _frame_over_ring(target: Target) -> RawRequest:
    ids = [i % target.vocab_size for i in range(RING_FRAME_PROMPT)]
    body = {
        "input_ids": ids,
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 1024,
        "sampling_params": {"max_new_tokens": 1},
    }
    return _json_post("/generate", body)(target)


def _logit_bias_huge(target: Target) -> RawRequest:
    return _completions(logit_bias={str(i): 1.0 for i in range(LONG_LIST)})(target)


HOSTILE_REQUESTS: tuple[HostileRequest, ...] = (
    HostileRequest(
        "auth_header_not_utf8",
        _bad_key_header(b"Authorization", b"Bearer \xff\xfe"),
        needs_api_key=True,
    ),
    HostileRequest(
        "api_key_header_not_utf8", _bad_key_header(b"X-API-Key", b"\xc3\x28"), needs_api_key=True
    ),
    HostileRequest("content_type_text_plain", _text_plain),
    HostileRequest("foreign_host_header", _foreign_host),
    HostileRequest("get_flush_cache", _get_flush_cache),
    HostileRequest("top_k_past_int64", _generate_params(top_k=INT64_PAST)),
    HostileRequest("seed_past_int64", _generate_params(seed=INT64_PAST)),
    HostileRequest("max_new_tokens_past_int64", _generate_params(max_new_tokens=INT64_PAST)),
    HostileRequest(
        "top_logprobs_num_past_int64", _generate(return_logprob=True, top_logprobs_num=INT64_PAST)
    ),
    HostileRequest(
        "completion_prompt_id_past_uint32_echo", _completions(prompt=[2**32], echo=True)
    ),
    HostileRequest("input_ids_out_of_vocab", _ids_out_of_vocab),
    HostileRequest("n_huge_native", _generate_params(n=HUGE_N)),
    HostileRequest("n_huge_openai", _completions(n=HUGE_N)),
    HostileRequest("stop_list_long", _generate_params(stop=[f"stop{i}" for i in range(LONG_LIST)])),
    HostileRequest("stop_string_long", _generate_params(stop=["x" * LONG_STRING])),
    HostileRequest("logit_bias_huge", _logit_bias_huge),
    HostileRequest("top_logprobs_num_over_vocab", _top_logprobs_over_vocab),
    HostileRequest("logprobs_frame_over_ring", _frame_over_ring),
)


async def send_raw(request: RawRequest, port: int, timeout_s: float) -> tuple[int | None, str]:
    """Sends `request` to 127.0.0.1:`port` on a connection of its own; returns the answer's
    status and error message, or None and why when no HTTP answer came within `timeout_s`."""
    host = request.host or f"127.0.0.1:{port}".encode()
    head = [
        f"{request.method} {request.path} HTTP/1.1".encode(),
        b"Host: " + host,
        b"Content-Length: " + str(len(request.body)).encode(),
        b"Connection: close",
        *(name + b": " + value for name, value in request.headers),
    ]
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(b"\r\n".join(head) + b"\r\n\r\n" + request.body)
                await writer.drain()
                answer = await reader.read()  # `Connection: close`: the answer ends at EOF
            finally:
                writer.close()
    except (TimeoutError, OSError) as e:
        return None, f"{type(e).__name__}: {e}"
    status_line, _, rest = answer.partition(b"\r\n")
    parts = status_line.split()
    if len(parts) < 2 or not parts[1].isdigit():
        return None, f"no HTTP answer: {answer[:100]!r}"
    return int(parts[1]), _error_message(rest.partition(b"\r\n\r\n")[2])


def _error_message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return body[:300].decode(errors="replace")
