"""The HTTP side of `bench_serving.py`: one streamed `/v1/completions` request, what the server
says about itself, its cache flush, and the CPU time of its process tree.

Any OpenAI-compatible server works; `/get_model_info` (the tokenizer's path) and `/flush_cache`
are SGLang's and srt's extras, used where the server offers them.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import psutil
from serving_datasets import BenchRequest
from serving_metrics import RequestResult


def new_session(api_key: str | None, timeout_s: float) -> aiohttp.ClientSession:
    """A session that opens a new connection for every request: a reused keep-alive connection
    hides connection cost and distorts some servers' figures."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True, limit=0),
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
    )


async def _error_text(response: aiohttp.ClientResponse) -> str:
    body = await response.text()
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body[:500]
    return f"HTTP {response.status}: {message}"


async def discover_model(session: aiohttp.ClientSession, base_url: str) -> str:
    """The first model `/v1/models` lists."""
    try:
        async with session.get(f"{base_url}/v1/models") as response:
            if response.status != 200:
                raise ValueError(f"GET /v1/models: {await _error_text(response)}")
            # Whatever its Content-Type: sglang-router 0.3.2 labels its own list text/plain.
            models = (await response.json(content_type=None)).get("data") or []
    except aiohttp.ClientError as e:
        raise ValueError(f"cannot reach {base_url}: {e}") from e
    if not models:
        raise ValueError(f"{base_url}/v1/models lists no model; pass --model")
    return str(models[0]["id"])


async def discover_tokenizer(session: aiohttp.ClientSession, base_url: str) -> str | None:
    """The tokenizer path the server reports in `/get_model_info` (srt, SGLang), if any."""
    try:
        async with session.get(f"{base_url}/get_model_info") as response:
            if response.status != 200:
                return None
            info = await response.json()
    except (aiohttp.ClientError, ValueError):
        return None
    path = info.get("tokenizer_path") if isinstance(info, dict) else None
    return str(path) if path else None


async def flush_cache(session: aiohttp.ClientSession, base_url: str) -> bool | None:
    """Empties the server's prefix cache: True when it did, None when the server has no
    `/flush_cache`. A refusal (srt refuses while requests run) is retried for a few seconds,
    then raised."""
    error = ""
    for _ in range(10):
        async with session.post(f"{base_url}/flush_cache") as response:
            if response.status in (404, 405):
                return None
            if response.status == 200:
                return True
            error = await _error_text(response)
        await asyncio.sleep(0.5)
    raise ValueError(f"POST /flush_cache failed: {error}")


async def send_request(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    request: BenchRequest,
    index: int,
    ignore_eos: bool,
) -> RequestResult:
    """Streams one completion and times it; never raises: a failure is a result with its
    error."""
    payload: dict[str, Any] = {
        "model": model,
        "prompt": request.prompt,
        "max_tokens": request.output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        payload["ignore_eos"] = True
    result = RequestResult(index, request.output_len, request.prompt_len)
    usage: dict[str, Any] | None = None
    start = time.perf_counter()
    try:
        async with session.post(f"{base_url}/v1/completions", json=payload) as response:
            if response.status != 200:
                result.error = await _error_text(response)
                return result
            done = False
            async for raw in response.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = f"error event: {chunk['error'].get('message', chunk)}"
                    return result
                if any(choice.get("text") for choice in chunk.get("choices") or []):
                    result.chunk_times.append(time.perf_counter() - start)
                usage = chunk.get("usage") or usage
            result.e2e = time.perf_counter() - start
    except (TimeoutError, aiohttp.ClientError, ValueError) as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    if not done:
        result.error = "the stream ended without [DONE]"
    elif not result.chunk_times:
        result.error = "the stream carried no text"
    else:
        result.success = True
        result.ttft = result.chunk_times[0]
        result.output_len = len(result.chunk_times)
        if usage is not None:
            result.output_len = int(usage.get("completion_tokens", result.output_len))
            result.prompt_len = int(usage.get("prompt_tokens", result.prompt_len))
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                result.cached_tokens = int(details["cached_tokens"])
    return result


class ProcessTreeCpu:
    """CPU seconds (user + system) of a process and all its descendants since `start()`.
    Processes are told apart by pid and creation time, so a reused pid is not mistaken for an
    old one; a child that ended and was reaped counts through its parent's `children_*`
    times."""

    def __init__(self, pid: int) -> None:
        try:
            self.root = psutil.Process(pid)
        except psutil.NoSuchProcess as e:
            raise ValueError(f"--server-pid {pid}: no such process") from e
        self.started: dict[tuple[int, float], float] = {}

    def _sample(self) -> dict[tuple[int, float], float]:
        times = {}
        for process in [self.root, *self.root.children(recursive=True)]:
            try:
                with process.oneshot():
                    cpu = process.cpu_times()
                    key = (process.pid, process.create_time())
            except psutil.NoSuchProcess:
                continue
            times[key] = cpu.user + cpu.system + cpu.children_user + cpu.children_system
        return times

    def start(self) -> None:
        self.started = self._sample()

    def seconds(self) -> float:
        return sum(t - self.started.get(key, 0.0) for key, t in self._sample().items())
