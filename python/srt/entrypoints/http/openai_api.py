"""The OpenAI API: `/v1/completions`, `/v1/chat/completions` and `/v1/models`.

A request is mapped (`openai_protocol`) and checked whole (by the tokenizer manager) before
anything is sent, and a stream starts only
once its first result is in, so that every refusal (a bad field, a prompt beyond the context, a
full queue) is an HTTP error with its status. Later errors go out as an SSE error event followed
by `[DONE]`. A client that goes away closes the result generator, which aborts its requests.

A request aborted by someone else (`/abort_request`, or a shutdown whose grace period it
outlasted) is no error, as in SGLang and vLLM: the answer (or the stream, to its usage chunk and
`[DONE]`) carries what it generated, its choices ending with finish reason "abort". An error
status would make OpenAI's clients retry a request that was stopped on purpose.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any

from aiohttp import web

from srt.entrypoints.http.context import context_of, request_errors
from srt.entrypoints.http.errors import ApiError, json_response, read_json_object
from srt.entrypoints.http.openai_protocol import (
    OpenAIRequest,
    check_model,
    parse_chat_request,
    parse_completion_request,
)
from srt.entrypoints.http.openai_responses import ResponseBuilder
from srt.entrypoints.http.sse import send_done, send_error, send_event, start_stream

routes = web.RouteTableDef()

Parser = Callable[..., OpenAIRequest]


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    """Lists the one model this server serves (OpenAI's `GET /v1/models`)."""
    return json_response({"object": "list", "data": [model_card(request)]})


@routes.get("/v1/models/{model}")
async def retrieve_model(request: web.Request) -> web.Response:
    """Describes the served model; 404 (`model_not_found`) for any other name."""
    check_model({"model": request.match_info["model"]}, context_of(request).model_name)
    return json_response(model_card(request))


@routes.post("/v1/completions")
async def completions(request: web.Request) -> web.StreamResponse:
    """Completes prompts (OpenAI's `POST /v1/completions`); SSE with `stream`.

    `prompt` (a string, a list of strings, a list of token ids or a list of such lists),
    `max_tokens` (default: up to the context length), `temperature`, `top_p`, `n`, `stop`,
    `seed`, `presence_penalty`, `frequency_penalty`, `logit_bias`, `logprobs` (top alternatives
    per token), `echo`, `stream` with `stream_options.include_usage`, `user`, and SGLang's extra
    sampling fields (`top_k`, `min_p`, `repetition_penalty`, `min_tokens`, `stop_token_ids`,
    `ignore_eos`, `skip_special_tokens`, `spaces_between_special_tokens`, `no_stop_trim`, and
    the grammars `json_schema`, `regex`, `ebnf`), and OpenAI's `response_format`. With `echo`
    and `logprobs`, the logprobs start with the prompt's tokens (the first null).
    Answers a `text_completion` with `usage` (`prompt_tokens_details.cached_tokens`), or its
    chunks as server-sent events ending with `[DONE]`. An aborted request's choices end with
    finish reason "abort" (see the module's note)."""
    return await serve(request, parse_completion_request)


@routes.post("/v1/chat/completions")
async def chat_completions(request: web.Request) -> web.StreamResponse:
    """Answers a chat (OpenAI's `POST /v1/chat/completions`); SSE with `stream`.

    `messages` (system, developer, user and assistant messages with text content) rendered with
    the model's chat template, `max_completion_tokens` or `max_tokens` (default: up to the
    context length), `temperature`, `top_p`, `n`, `stop`, `seed`, `presence_penalty`,
    `frequency_penalty`, `logit_bias`, `logprobs` with `top_logprobs`, `stream` with
    `stream_options.include_usage`, `user`, and SGLang's extra sampling fields as for
    `/v1/completions`, `response_format` (`json_object`, `json_schema`) among them, and tools:
    `tools`, `tool_choice` (`none`, `auto` with the server's `--tool-call-parser`, `required`
    and a named function forced by a grammar), `parallel_tool_calls`, with assistant
    `tool_calls` and `tool` results in `messages` (see `openai_tools`). Audio is refused.
    Answers a `chat.completion` with `usage` (calls in `message.tool_calls`, finish reason
    "tool_calls"), or `chat.completion.chunk` server-sent events (each choice's first delta
    carries the assistant role; a call's first delta its id and name, later ones fragments of
    its arguments) ending with `[DONE]`. An aborted request's choices end with finish reason
    "abort" (see the module's note)."""
    parser = context_of(request).server_args.tool_call_parser
    return await serve(request, functools.partial(parse_chat_request, tool_call_parser=parser))


def model_card(request: web.Request) -> dict[str, Any]:
    ctx = context_of(request)
    return {
        "id": ctx.model_name,
        "object": "model",
        "created": int(ctx.started_at),
        "owned_by": "srt",
        "root": ctx.server_args.model_path,
    }


async def serve(request: web.Request, parse: Parser) -> web.StreamResponse:
    """Checks, runs and answers one completions or chat request."""
    ctx = context_of(request)
    body = await read_json_object(request)
    manager = ctx.tokenizer_manager()
    req = parse(body, ctx.model_name)
    async with contextlib.aclosing(manager.generate_request(req.obj)) as results:
        if not req.stream:
            with openai_errors(req):
                answers = [result async for result in results]
            builder = ResponseBuilder(req, ctx.model_name, manager.tokenizer)
            with openai_errors(req):  # a refusal by the scheduler: an HTTP error
                return json_response(builder.response(answers))
        with openai_errors(req):
            first = await anext(results)
        builder = ResponseBuilder(req, ctx.model_name, manager.tokenizer)
        with openai_errors(req):  # a refusal before the stream began: an HTTP error
            first_chunk = builder.chunk(first)
        response = await start_stream(request)
        try:
            await send_event(response, first_chunk)
            await stream_rest(response, results, builder)
        except ApiError as e:
            await send_error(response, e)
        return response


@contextlib.contextmanager
def openai_errors(req: OpenAIRequest) -> Iterator[None]:
    """`request_errors`, each error's `param` named as the body names it."""
    try:
        with request_errors():
            yield
    except ApiError as e:
        e.param = req.param_of(e.param)
        raise


async def stream_rest(
    response: web.StreamResponse,
    results: AsyncGenerator[dict[str, Any], None],
    builder: ResponseBuilder,
) -> None:
    with request_errors():
        async for result in results:
            await send_event(response, builder.chunk(result))
    usage = builder.usage_chunk()
    if usage is not None:
        await send_event(response, usage)
    await send_done(response)
