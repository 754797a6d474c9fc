"""An API fuzzer: schemathesis builds requests for every route from the server's own
`/openapi.json` (valid ones that reach the model, and invalid ones that must be refused) and
sends them to a real `srt-serve` on a tiny model. Whatever it sends, the server answers below
500, every error is in OpenAI's shape, and no stage dies: the same processes serve `/health`
afterwards.

Bounded for CI: a few examples per route (deterministic, so a failure reproduces), a short
context so that no generation runs long, and a timeout on every request."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from srt.entrypoints.http.context import ServerContext
from srt.entrypoints.http.native_api import GENERATE_FIELDS
from srt.entrypoints.http.openai_protocol import CHAT_FIELDS, COMPLETION_FIELDS, SAMPLING_FIELDS
from srt.entrypoints.http.openapi import describe
from srt.entrypoints.http.request_schemas import ModelLimits
from srt.entrypoints.http.server import build_app
from srt.entrypoints.http.sglang_fields import CHAT_DEFAULTS, COMPLETION_DEFAULTS, GENERATE_DEFAULTS
from srt.request_limits import RequestLimits
from srt.server_args import ServerArgs
from srt.testing.server_process import ServerProcess, running_server

pytestmark = pytest.mark.slow

MAX_EXAMPLES = 20
REQUEST_TIMEOUT_S = 60.0
CONTEXT_LENGTH = 160
BODY_ROUTES = (
    "/generate",
    "/v1/completions",
    "/v1/chat/completions",
    "/tokenize",
    "/detokenize",
    "/abort_request",
)


@pytest.fixture(scope="module")
def server(tiny_model_factory: Callable[[str], Path]) -> Iterator[ServerProcess]:
    flags = ["--context-length", str(CONTEXT_LENGTH), "--max-running-requests", "8"]
    with running_server(tiny_model_factory("llama"), *flags) as server:
        yield server


@pytest.fixture(scope="module")
def stages(server: ServerProcess) -> list[psutil.Process]:
    """The server's processes before the fuzzer starts."""
    main = psutil.Process(server.process.pid)
    return [main, *main.children(recursive=True)]


@pytest.fixture(scope="module")
def api_schema(server: ServerProcess, stages: list[psutil.Process]) -> Any:
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


def test_the_description_covers_every_field(api_schema: Any) -> None:
    """The parsers' own field lists, all described: the fuzzer reaches every field."""
    raw = api_schema.raw_schema["paths"]

    def fields(path: str) -> set[str]:
        body = raw[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        return set(body["properties"])

    assert fields("/generate") == set(GENERATE_FIELDS) | set(GENERATE_DEFAULTS)
    assert fields("/v1/completions") == COMPLETION_FIELDS | set(SAMPLING_FIELDS) | set(
        COMPLETION_DEFAULTS
    )
    assert fields("/v1/chat/completions") == CHAT_FIELDS | set(SAMPLING_FIELDS) | set(CHAT_DEFAULTS)
    for path in BODY_ROUTES:
        assert fields(path), path
    sampling = raw["/generate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    params = sampling["properties"]["sampling_params"]["anyOf"][0]["properties"]
    assert {"temperature", "top_p", "max_new_tokens", "stop", "logit_bias", "n"} <= set(params)
    assert "requestBody" not in raw["/flush_cache"]["post"]
    assert "get" not in raw["/flush_cache"]


def cases() -> list[tuple[str, str, GenerationMode]]:
    """(method, path, mode) for every route as the server describes it (built here without a
    model: the routes do not depend on it): valid requests for each, and invalid ones for those
    that take any input."""
    args = ServerArgs()
    app = build_app(ServerContext(args, "fuzzed"))
    paths = describe(app, ModelLimits("fuzzed", RequestLimits.of(args)))["paths"]
    out = []
    for path, item in paths.items():
        for method, operation in item.items():
            modes = [GenerationMode.POSITIVE]
            if "requestBody" in operation:
                modes.append(GenerationMode.NEGATIVE)
            out += [(method.upper(), path, mode) for mode in modes]
    return out


@pytest.mark.parametrize(("method", "path", "mode"), cases())
def test_no_request_breaks_the_server(
    api_schema: Any, server: ServerProcess, method: str, path: str, mode: GenerationMode
) -> None:
    operation = api_schema[path][method]

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def fuzz(case: Any) -> None:
        response = case.call(base_url=server.url, timeout=REQUEST_TIMEOUT_S)
        where = f"{case.method} {case.path} {case.body!r}"
        assert response.status_code < 500, f"{where} -> {response.status_code}: {response.text}"
        if response.status_code >= 400:
            check_error_shape(response, where)

    fuzz()


def check_error_shape(response: Any, where: str) -> None:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, where
    assert isinstance(error["message"], str), where
    assert isinstance(error["type"], str), where


def test_every_stage_survived(server: ServerProcess, stages: list[psutil.Process]) -> None:
    """After the fuzzer: the same processes, all running, and the server healthy."""
    main = psutil.Process(server.process.pid)
    assert [main, *main.children(recursive=True)] == stages
    assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in stages)
    assert server.health_status() == 200
