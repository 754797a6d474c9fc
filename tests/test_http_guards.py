"""The server's guards through real HTTP: API keys (in any encoding), CORS for listed origins,
the browser-safe defaults (JSON bodies only, POST-only state changes, loopback Host names), the
body limit and the waiting-queue limit (429), on one strictly configured server."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import make_mocked_request

from srt.entrypoints.http.errors import ApiError
from srt.entrypoints.http.middleware import allowed_origin, host_allowed, host_middleware
from srt.server_args import ServerArgs
from srt.server_args_check import ServerArgsError
from srt.testing.server_process import ServerProcess, running_server

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
    """(status, parsed JSON body or text, headers) of one request; `body` bytes are sent as they
    are, as JSON unless `headers` give another Content-Type."""

    async def go() -> tuple[int, Any, dict[str, str]]:
        data = body if isinstance(body, bytes) else None
        payload = None if isinstance(body, bytes) else body
        sent = {"Content-Type": "application/json"} if data is not None else {}
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                method, server.url + path, json=payload, data=data, headers=sent | (headers or {})
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
    assert status == 403
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


def raw_request(server: ServerProcess, head: bytes, body: bytes = b"") -> tuple[int, Any]:
    """(status, parsed JSON body) of one request written byte for byte on a socket: headers no
    client library would send. `head` is the request line and headers, without Host unless it
    holds one."""
    if b"\r\nhost:" not in head.lower():
        head += b"\r\nHost: 127.0.0.1:" + str(server.port).encode()
    message = head + b"\r\nContent-Length: " + str(len(body)).encode()
    message += b"\r\nConnection: close\r\n\r\n" + body
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as connection:
        connection.sendall(message)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    _, _, payload = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), json.loads(payload) if payload else None


@pytest.mark.parametrize(
    "header",
    [
        b"X-API-Key: \xff\xfe\xc3(",
        b"X-API-Key: " + KEY.encode() + b"\x80",
        b"Authorization: Bearer \xff" + KEY.encode(),
        b"Authorization: Bearer s3cret-ke\xc3\xa9",
        b"Authorization: \xe9\xe9 " + KEY.encode(),
    ],
)
def test_a_key_header_in_any_encoding_is_401(server: ServerProcess, header: bytes) -> None:
    status, error = raw_request(server, b"GET /v1/models HTTP/1.1\r\n" + header)
    assert status == 401
    assert error["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain; charset=utf-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/octet-stream",
        "text/json",
        "application/jsonp",
    ],
)
def test_a_body_that_is_not_json_is_415(server: ServerProcess, content_type: str) -> None:
    """What a web page can POST without a CORS preflight is refused before any handler runs:
    the generation does not start, the cache is not flushed, nothing is aborted."""
    for path in ("/generate", "/v1/chat/completions", "/flush_cache", "/abort_request"):
        headers = {**AUTH, "Content-Type": content_type}
        status, error, _ = call(server, "POST", path, json.dumps(GOOD).encode(), headers)
        assert status == 415, path
        assert error["error"]["type"] == "invalid_request_error"
        assert error["error"]["code"] == "unsupported_media_type"


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "Application/JSON; charset=utf-8", "application/vnd.srt+json"],
)
def test_json_bodies_are_accepted(server: ServerProcess, content_type: str) -> None:
    headers = {**AUTH, "Content-Type": content_type}
    assert call(server, "POST", "/generate", json.dumps(GOOD).encode(), headers)[0] == 200


def test_a_body_without_a_content_type_is_accepted(server: ServerProcess) -> None:
    head = b"POST /generate HTTP/1.1\r\nX-API-Key: " + KEY.encode()
    status, answer = raw_request(server, head, json.dumps(GOOD).encode())
    assert status == 200
    assert answer["meta_info"]["completion_tokens"] == 2


@pytest.mark.parametrize("path", ["/flush_cache", "/abort_request"])
def test_state_changes_are_post_only(server: ServerProcess, path: str) -> None:
    status, error, headers = call(server, "GET", path, None, AUTH)
    assert status == 405
    assert headers["Allow"] == "POST"
    assert error["error"]["type"] == "invalid_request_error"
    assert "GET" in error["error"]["message"]


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1", 200),
        ("127.0.0.2:30000", 200),
        ("localhost", 200),
        ("LocalHost:{port}", 200),
        ("[::1]:{port}", 200),
        ("evil.example", 403),
        ("evil.example:{port}", 403),
        ("localhost.evil.example:{port}", 403),
        ("127.0.0.1.evil.example", 403),
        ("0.0.0.0:{port}", 403),
        ("localhost:x", 403),
        ("", 403),
    ],
)
def test_a_loopback_server_answers_only_loopback_host_names(
    server: ServerProcess, host: str, status: int
) -> None:
    """DNS rebinding: a page whose name now resolves to 127.0.0.1 still sends its own name."""
    header = b"Host: " + host.format(port=server.port).encode()
    answer_status, error = raw_request(server, b"GET /health HTTP/1.1\r\n" + header)
    assert answer_status == status
    if status == 403:
        assert error["error"]["code"] == "host_not_allowed"
        assert "--allowed-hosts" in error["error"]["message"]


def test_a_cross_origin_request_from_an_unlisted_origin_is_403(server: ServerProcess) -> None:
    """Browsers send Origin on every cross-origin POST, typeless bodies included."""
    body = json.dumps(GOOD).encode()
    head = b"POST /generate HTTP/1.1\r\nOrigin: http://evil.example\r\nX-API-Key: " + KEY.encode()
    status, error = raw_request(server, head, body)
    assert status == 403
    assert error["error"]["code"] == "origin_not_allowed"
    assert call(server, "POST", "/generate", GOOD, {**AUTH, "Origin": "null"})[0] == 403
    # The server's own pages (the playground), and a listed origin, pass.
    own = {**AUTH, "Origin": server.url}
    assert call(server, "POST", "/generate", GOOD, own)[0] == 200
    assert call(server, "POST", "/generate", GOOD, {**AUTH, "Origin": ORIGIN})[0] == 200


def test_allowed_hosts_adds_names_and_a_wildcard_allows_any() -> None:
    assert host_allowed("srt.internal:8080", ("srt.internal",))
    assert host_allowed("SRT.internal", ("srt.internal",))
    assert host_allowed("[fd00::1]:80", ("fd00::1",))
    assert not host_allowed("other.internal", ("srt.internal",))
    assert host_allowed("anything.example", ("*",))
    assert not host_allowed("[::1", ())
    assert not host_allowed(None, ())
    with pytest.raises(ServerArgsError, match="--allowed-hosts"):
        ServerArgs(allowed_hosts=("srt.internal:8080",))
    with pytest.raises(ServerArgsError, match="--allowed-hosts"):
        ServerArgs(allowed_hosts=("https://srt.internal",))
    assert ServerArgs(allowed_hosts=("srt.internal", "10.0.0.2", "fd00::1", "*")).allowed_hosts


@pytest.mark.parametrize(
    ("bind", "allowed_hosts", "passes"),
    [
        ("127.0.0.1", (), False),
        ("localhost", (), False),
        ("::1", (), False),
        ("0.0.0.0", (), True),
        ("0.0.0.0", ("srt.internal",), False),
        ("127.0.0.1", ("evil.example",), True),
    ],
)
def test_the_host_check_guards_loopback_binds_or_a_given_list(
    bind: str, allowed_hosts: tuple[str, ...], passes: bool
) -> None:
    check = host_middleware(bind, allowed_hosts)
    request = make_mocked_request("GET", "/health", headers={"Host": "evil.example"})

    async def ok(request: Any) -> Any:
        return "answered"

    async def go() -> int:
        try:
            await check(request, ok)
        except ApiError as e:
            return e.status
        return 200

    assert asyncio.run(go()) == (200 if passes else 403)
