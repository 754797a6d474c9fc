"""The server's guards through real HTTP: API keys, CORS for listed origins, the body limit and
the waiting-queue limit (429), on one strictly configured server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import make_mocked_request
from http_server import ServerProcess, running_server

from srt.entrypoints.http.middleware import allowed_origin

pytestmark = pytest.mark.slow

KEY = "s3cret-key"
ORIGIN = "http://app.example"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = {"max_new_tokens": None, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tiny_model_factory: Callable[[str], Path]) -> Iterator[ServerProcess]:
    flags = ["--api-key", KEY, "--allowed-origins", ORIGIN, "--max-request-bytes", "65536"]
    flags += ["--max-running-requests", "1", "--max-queued-requests", "1", "--enable-metrics"]
    with running_server(tiny_model_factory("llama"), *flags) as server:
        yield server


def call(
    server: ServerProcess,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, dict[str, str]]:
    """(status, parsed JSON body or text, headers) of one request."""

    async def go() -> tuple[int, Any, dict[str, str]]:
        data = body if isinstance(body, bytes) else None
        payload = None if isinstance(body, bytes) else body
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                method, server.url + path, json=payload, data=data, headers=headers
            ) as response,
        ):
            text = await response.text()
            try:
                parsed = json.loads(text) if text else None
            except json.JSONDecodeError:
                parsed = text
            return response.status, parsed, dict(response.headers)

    return asyncio.run(go())


GOOD = {"text": "Hello", "sampling_params": {"max_new_tokens": 2}}


@pytest.mark.parametrize(
    "headers",
    [
        None,
        {"Authorization": "Bearer wrong"},
        {"Authorization": KEY},
        {"X-API-Key": "s3cret-kez"},
        {"Authorization": f"Basic {KEY}"},
    ],
)
def test_a_missing_or_wrong_key_is_401(server: ServerProcess, headers: dict[str, str]) -> None:
    for method, path, body in [
        ("POST", "/generate", GOOD),
        ("GET", "/v1/models", None),
        ("GET", "/get_server_info", None),
        ("POST", "/flush_cache", None),
    ]:
        status, error, response_headers = call(server, method, path, body, headers)
        assert status == 401, path
        assert error["error"]["code"] == "invalid_api_key"
        assert response_headers["WWW-Authenticate"] == "Bearer"


def test_the_key_opens_every_route(server: ServerProcess) -> None:
    assert call(server, "POST", "/generate", GOOD, AUTH)[0] == 200
    assert call(server, "POST", "/generate", GOOD, {"X-API-Key": KEY})[0] == 200
    assert call(server, "GET", "/v1/models", None, {"authorization": f"bearer {KEY}"})[0] == 200


def test_probes_and_metrics_need_no_key(server: ServerProcess) -> None:
    assert call(server, "GET", "/health")[0] == 200
    assert call(server, "GET", "/health_generate")[0] == 200
    status, text, headers = call(server, "GET", "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    assert "srt_requests_total" in text


def test_cors_for_a_listed_origin_only(server: ServerProcess) -> None:
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
    status, _, headers = call(server, "OPTIONS", "/v1/chat/completions", None, preflight)
    assert status == 204
    assert headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "Authorization" in headers["Access-Control-Allow-Headers"]
    assert "POST" in headers["Access-Control-Allow-Methods"]
    assert "Access-Control-Allow-Credentials" not in headers
    # Answers, errors included, carry the header for the listed origin.
    status, _, headers = call(server, "POST", "/generate", GOOD, {"Origin": ORIGIN})
    assert status == 401
    assert headers["Access-Control-Allow-Origin"] == ORIGIN
    assert headers["Vary"] == "Origin"
    # Another origin gets no CORS header at all, and no preflight answer.
    other = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
    status, _, headers = call(server, "OPTIONS", "/generate", None, other)
    assert status != 204
    assert "Access-Control-Allow-Origin" not in headers


def test_a_wildcard_origin_never_comes_with_credentials() -> None:
    request = make_mocked_request("GET", "/", headers={"Origin": "http://x.example"})
    assert allowed_origin(("*",), request) == "*"
    assert allowed_origin((), request) is None
    assert allowed_origin(("http://y.example",), request) is None


def test_a_body_over_the_limit_is_413_before_tokenizing(server: ServerProcess) -> None:
    body = json.dumps({"text": "x" * 70000}).encode()
    status, error, _ = call(server, "POST", "/generate", body, AUTH)
    assert status == 413
    assert "65536" in error["error"]["message"]
    assert call(server, "POST", "/generate", GOOD, AUTH)[0] == 200


def test_a_full_waiting_queue_is_429_with_retry_after(server: ServerProcess) -> None:
    async def go() -> tuple[int, Any, str | None]:
        async with aiohttp.ClientSession(headers=AUTH) as session:
            url = server.url + "/generate"
            running = await session.post(url, json={"text": "a", "stream": True, **_long()})
            await running.content.readline()  # admitted: the one running slot is taken
            waiting = asyncio.ensure_future(session.post(url, json={"text": "b", **_long()}))
            await asyncio.sleep(0.5)  # b reaches the waiting queue first
            async with session.post(url, json={"text": "c", **_long()}) as refused:
                answer = refused.status, await refused.json(), refused.headers.get("Retry-After")
            async with session.post(server.url + "/abort_request", json={"abort_all": True}):
                pass
            running.close()
            (await waiting).close()
            return answer

    status, error, retry_after = asyncio.run(go())
    assert status == 429
    assert retry_after is not None
    assert "--max-queued-requests" in error["error"]["message"]
    assert error["error"]["type"] == "rate_limit_error"
    assert call(server, "POST", "/generate", GOOD, AUTH)[0] == 200


def _long() -> dict[str, Any]:
    return {"sampling_params": LONG}
