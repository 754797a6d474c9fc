"""SGLang's native API: `/generate`, and the operations routes around the model.

`/generate` takes SGLang's `GenerateReqInput` schema (`text` or `input_ids`, single or batched,
`sampling_params`, `rid`, `stream`, `return_logprob`, `top_logprobs_num`, ...) and answers as
SGLang does: one object (a list for a batch or `n` > 1), or with `stream` an SSE stream whose
chunks each carry a request's whole text and output ids so far (SGLang's cumulative streaming),
with `index` for a batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aiohttp import web

from srt.entrypoints.http import sse
from srt.entrypoints.http.context import (
    REQUEST_ERRORS,
    abort_error,
    api_error,
    context_of,
    request_errors,
)
from srt.entrypoints.http.errors import bad_request, json_response, read_json_object
from srt.entrypoints.http.sglang_fields import GENERATE_DEFAULTS, without_defaults
from srt.managers.generate_req_input import GenerateReqInput

routes = web.RouteTableDef()
# SGLang's schema: a chat (`messages`, with its `tools`) is the OpenAI chat API's.
GENERATE_FIELDS = tuple(
    f.name for f in dataclasses.fields(GenerateReqInput) if f.name not in ("messages", "tools")
)
ACCUMULATED_META = (
    "output_token_logprobs",
    "output_top_logprobs",
    "input_token_logprobs",
    "input_top_logprobs",
)


def generate_input(body: dict[str, Any]) -> GenerateReqInput:
    """The `GenerateReqInput` of a `/generate` body; unknown fields are a 400 (SGLang's fields
    at their defaults are accepted: `sglang_fields`)."""
    body = without_defaults(body, GENERATE_DEFAULTS)
    unknown = sorted(set(body) - set(GENERATE_FIELDS))
    if unknown:
        raise bad_request(
            f"unknown field {unknown[0]!r} (known: {', '.join(GENERATE_FIELDS)})", unknown[0]
        )
    return GenerateReqInput(**body)


@routes.post("/generate")
async def generate(request: web.Request) -> web.StreamResponse:
    """Generates for one prompt or a batch (SGLang's native schema); SSE with `stream`."""
    manager = context_of(request).tokenizer_manager()
    obj = generate_input(await read_json_object(request))
    if obj.stream is True:
        return await stream_generate(request, obj)
    with request_errors():
        results = [r async for r in manager.generate_request(obj)]
    for result in results:
        error = abort_error(result["meta_info"]["finish_reason"])
        if error is not None:
            raise error
    single = obj.is_single and len(results) == 1
    return json_response(results[0] if single else results)


async def stream_generate(request: web.Request, obj: GenerateReqInput) -> web.StreamResponse:
    """SGLang's stream: every chunk holds its request's text, ids and logprobs so far."""
    manager = context_of(request).tokenizer_manager()
    chunks = manager.generate_request(obj)
    with request_errors():  # a request refused before anything was sent is a plain error
        first = await anext(chunks, None)
    response = await sse.start_stream(request)
    so_far: dict[int, dict[str, Any]] = {}
    try:
        chunk = first
        while chunk is not None:
            error = abort_error(chunk["meta_info"]["finish_reason"])
            if error is not None:
                await sse.send_error(response, error)
                return response
            await sse.send_event(response, accumulate(so_far, chunk))
            chunk = await anext(chunks, None)
    except REQUEST_ERRORS as e:
        await sse.send_error(response, api_error(e))
        return response
    finally:
        await chunks.aclose()
    await sse.send_done(response)
    return response


def accumulate(so_far: dict[int, dict[str, Any]], chunk: dict[str, Any]) -> dict[str, Any]:
    """`chunk` (what is new for its request) turned into everything its request has so far."""
    index = chunk.get("index", 0)
    total = so_far.get(index)
    if total is None:
        so_far[index] = total = {"text": "", "output_ids": [], "meta_info": {}}
    total["text"] += chunk["text"]
    total["output_ids"] = total["output_ids"] + chunk["output_ids"]
    meta = dict(chunk["meta_info"])
    for key in ACCUMULATED_META:
        if key in meta:
            meta[key] = total["meta_info"].get(key, []) + meta[key]
    total["meta_info"] = meta
    out = dict(total)
    if "index" in chunk:
        out["index"] = index
    return out
