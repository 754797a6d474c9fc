"""Server-sent events as SGLang and OpenAI stream them: `data: <json>\n\n` per chunk, then one
`data: [DONE]\n\n`. An error after the stream began goes out as one `data: {"error": ...}` event
followed by `[DONE]` (the status line was already sent)."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from srt.entrypoints.http.errors import ApiError


async def start_stream(request: web.Request) -> web.StreamResponse:
    """Sends the status line and headers of an event stream."""
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    return response


async def send_event(response: web.StreamResponse, data: Any) -> None:
    await response.write(b"data: " + orjson.dumps(data) + b"\n\n")


async def send_done(response: web.StreamResponse) -> None:
    await response.write(b"data: [DONE]\n\n")


async def send_error(response: web.StreamResponse, error: ApiError) -> None:
    """Ends a stream that already began with an error event and `[DONE]`."""
    await send_event(response, error.body())
    await send_done(response)
