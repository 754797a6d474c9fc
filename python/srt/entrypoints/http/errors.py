"""Errors over HTTP, always in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

Handlers raise `ApiError`; the server's error middleware turns it (and aiohttp's own HTTP
exceptions, and anything unexpected) into a JSON response. `read_json_object` is the one way a
handler reads its body: malformed JSON, `NaN`/`Infinity` literals (orjson rejects them) and
non-object bodies are 400s; a body over the server's limit is a 413 before any of it is parsed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

# OpenAI's error `type` for each status srt sends.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """An HTTP error answer: `status`, a message for the client, and OpenAI's optional `param`
    (the offending field) and `code`; `headers` go on the response (e.g. `Retry-After`)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": ERROR_TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code if self.code is not None else self.status,
            }
        }

    def response(self) -> web.Response:
        return json_response(self.body(), status=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def json_response(
    data: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    """A JSON response serialized with orjson."""
    return web.Response(
        body=orjson.dumps(data), status=status, headers=headers, content_type="application/json"
    )


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object; ApiError 413 (too large) or 400 (anything else)."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as e:
        raise ApiError(
            413, f"the request body exceeds the limit of {request.client_max_size} bytes"
        ) from e
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise bad_request(f"the body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise bad_request(f"the body must be a JSON object, not {type(body).__name__}")
    return body
