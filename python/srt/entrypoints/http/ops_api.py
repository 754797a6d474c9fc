"""Operations routes: health, model and server information, load, cache flush, aborts,
tokenization, and Prometheus metrics (with `--enable-metrics`).

A load balancer in front of several servers (sglang-router, docs/scale-out.md) manages them
through these: `/health` (its periodic check), `/server_info` and `/model_info` (read when a
worker registers; SGLang's newer names, tried before `/get_server_info` and `/get_model_info`),
`/get_load` (its load monitor), `/flush_cache` (fanned out) and `/metrics` (aggregated)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from aiohttp import web

from srt import __version__
from srt.entrypoints.http.context import Phase, context_of, request_errors
from srt.entrypoints.http.errors import ApiError, bad_request, json_response, read_json_object
from srt.managers.generate_req_input import GenerateReqInput
from srt.managers.hf_tokenizer import tokenizer_files
from srt.managers.metrics import CONTENT_TYPE

routes = web.RouteTableDef()

HEALTH_GENERATE_TIMEOUT_S = 20.0
SECRET_ARGS = ("api_key",)


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    """200 once the model is loaded and warmed up; 503 while starting or shutting down."""
    context = context_of(request)
    if context.phase is not Phase.READY:
        raise ApiError(503, context.why_unavailable, headers={"Retry-After": "1"})
    return web.Response(text="")


@routes.get("/health_generate")
async def health_generate(request: web.Request) -> web.Response:
    """200 if the model generates one token within the timeout, else 503."""
    manager = context_of(request).tokenizer_manager()
    probe = GenerateReqInput(input_ids=[0], sampling_params={"max_new_tokens": 1})
    try:
        async with asyncio.timeout(HEALTH_GENERATE_TIMEOUT_S):
            with request_errors():
                results = [r async for r in manager.generate_request(probe)]
    except TimeoutError as e:
        raise ApiError(
            503, f"no token generated within {HEALTH_GENERATE_TIMEOUT_S:g} seconds"
        ) from e
    if results[0]["meta_info"]["completion_tokens"] != 1:
        raise ApiError(503, "the health probe generated no token")
    return web.Response(text="")


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    """Prometheus metrics (with --enable-metrics): requests, tokens, latencies, load, KV usage,
    cache hit rate, integrity-check violations."""
    manager = context_of(request).tokenizer_manager()
    if manager.metrics is None:
        raise ApiError(404, "metrics are off: start the server with --enable-metrics")
    with request_errors():
        load = await manager.get_load()
    return web.Response(body=manager.metrics.render(load), headers={"Content-Type": CONTENT_TYPE})


@routes.get("/model_info")
@routes.get("/get_model_info")
async def get_model_info(request: web.Request) -> web.Response:
    """The served model: its path, tokenizer (the local directory of its files, which for a
    GGUF model is not the model's path), name and context length."""
    context = context_of(request)
    manager = context.tokenizer_manager()
    args = context.server_args
    return json_response(
        {
            "model_path": args.model_path,
            "tokenizer_path": str(tokenizer_files(args)),
            "served_model_name": context.model_name,
            "is_generation": True,
            "context_length": manager.context_length,
            "vocab_size": manager.vocab_size,
        }
    )


@routes.get("/server_info")
@routes.get("/get_server_info")
async def get_server_info(request: web.Request) -> web.Response:
    """The server's arguments (secrets withheld), version, current load, and the slowest of
    the recent requests with their stage breakdown."""
    context = context_of(request)
    manager = context.tokenizer_manager()
    with request_errors():
        load = await manager.get_load()
    args = {
        name: ("<set>" if name in SECRET_ARGS and value is not None else value)
        for name, value in dataclasses.asdict(context.server_args).items()
    }
    return json_response(
        {
            # One scheduler per server: srt's data parallelism is replicas behind a router.
            "dp_size": 1,
            **args,
            "version": __version__,
            "phase": context.phase.value,
            "load": {k: v for k, v in dataclasses.asdict(load).items() if k != "rid"},
            "slowest_requests": manager.reporter.recent.slowest(),
        }
    )


@routes.get("/get_load")
async def get_load(request: web.Request) -> web.Response:
    """The scheduler's load in SGLang's shape, a list with one entry per data-parallel rank (one
    here): requests running and waiting, and as tokens, those of the KV cache in use (held by
    requests or locked in the prefix cache; evictable ones excluded) plus the waiting requests'
    prompts, as SGLang counts them. sglang-router sums `num_tokens`."""
    manager = context_of(request).tokenizer_manager()
    with request_errors():
        load = await manager.get_load()
    return json_response(
        [
            {
                "dp_rank": 0,
                "num_reqs": load.num_running_reqs + load.num_waiting_reqs,
                "num_waiting_reqs": load.num_waiting_reqs,
                "num_tokens": load.num_used_tokens + load.num_waiting_tokens,
            }
        ]
    )


@routes.get("/request_times/{rid}")
async def request_times(request: web.Request) -> web.Response:
    """The stage breakdown of a recent finished request (404 once it is no longer recent)."""
    rid = request.match_info["rid"]
    entry = context_of(request).tokenizer_manager().reporter.recent.get(rid)
    if entry is None:
        raise ApiError(404, f"no recent finished request has id {rid!r}")
    return json_response(entry)


@routes.post("/flush_cache")
async def flush_cache(request: web.Request) -> web.Response:
    """Empties the radix cache; refused (400) while requests run. POST only: it changes state."""
    manager = context_of(request).tokenizer_manager()
    with request_errors():
        out = await manager.flush_cache()
    if not out.success:
        raise bad_request(f"the cache was not flushed: {out.message}")
    return json_response({"success": True, "message": "the cache was flushed"})


@routes.post("/abort_request")
async def abort_request(request: web.Request) -> web.Response:
    """Aborts request `rid`, or every request with `abort_all` (or an empty `rid`)."""
    manager = context_of(request).tokenizer_manager()
    body = await read_json_object(request)
    rid = body.get("rid", "")
    abort_all = body.get("abort_all", False)
    if not isinstance(rid, str):
        raise bad_request("rid must be a string", "rid")
    if not isinstance(abort_all, bool):
        raise bad_request("abort_all must be true or false", "abort_all")
    with request_errors():
        if abort_all or rid == "":
            await manager.abort_all()
        elif not await manager.abort_request(rid):
            raise ApiError(404, f"no request {rid!r} is in flight", param="rid")
    return json_response({"success": True})


@routes.post("/tokenize")
async def tokenize(request: web.Request) -> web.Response:
    """Token ids of `prompt` (a string or a list of strings), as the model sees them."""
    manager = context_of(request).tokenizer_manager()
    body = await read_json_object(request)
    prompt = body.get("prompt")
    add_special = body.get("add_special_tokens", True)
    single = isinstance(prompt, str)
    texts = [prompt] if single else prompt
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise bad_request("prompt must be a string or a list of strings", "prompt")
    if not isinstance(add_special, bool):
        raise bad_request("add_special_tokens must be true or false", "add_special_tokens")
    with request_errors():
        manager.limits.check_prompts(len(texts), "prompt")
    ids = [manager.tokenizer.encode(t, add_special_tokens=add_special) for t in texts]
    tokens: Any = ids[0] if single else ids
    counts: Any = len(ids[0]) if single else [len(i) for i in ids]
    return json_response(
        {"tokens": tokens, "count": counts, "max_model_len": manager.context_length}
    )


@routes.post("/detokenize")
async def detokenize(request: web.Request) -> web.Response:
    """The text of `tokens` (a list of ids, or a list of such lists)."""
    manager = context_of(request).tokenizer_manager()
    body = await read_json_object(request)
    tokens = body.get("tokens")
    skip_special = body.get("skip_special_tokens", True)
    single = isinstance(tokens, list) and all(_is_id(t) for t in tokens)
    batch = [tokens] if single else tokens
    if not isinstance(batch, list) or not all(
        isinstance(ids, list) and all(_is_id(t) for t in ids) for ids in batch
    ):
        raise bad_request("tokens must be a list of token ids or a list of such lists", "tokens")
    if not isinstance(skip_special, bool):
        raise bad_request("skip_special_tokens must be true or false", "skip_special_tokens")
    with request_errors():
        manager.limits.check_prompts(len(batch), "tokens")
        for ids in batch:
            manager.check_ids(ids, "tokens")
    texts = [manager.tokenizer.decode(ids, skip_special_tokens=skip_special) for ids in batch]
    return json_response({"text": texts[0] if single else texts})


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
