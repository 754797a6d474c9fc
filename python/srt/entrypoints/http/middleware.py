"""What wraps every route: OpenAI-shaped errors, API-key checks and CORS.

Order (outermost first): errors, then auth. CORS headers are added as a response is prepared,
so that streams and error answers carry them too; preflight requests are answered before auth
(browsers send them without credentials).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from srt.entrypoints.http.context import context_of
from srt.entrypoints.http.errors import ApiError
from srt.logs import escape

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Routes open without the API key: probes and scrapes, and the playground page itself (a static
# page a browser loads by navigation, which cannot carry the key; its API calls do).
OPEN_PATHS = ("/health", "/health_generate", "/metrics", "/")
CORS_ALLOW_HEADERS = "Authorization, Content-Type, X-API-Key"
CORS_ALLOW_METHODS = "GET, POST, OPTIONS"


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure answered as `{"error": {...}}`: ApiError, aiohttp's HTTP errors (404 for an
    unknown route, 405, 413), and anything unexpected as a 500 (logged with its traceback)."""
    try:
        return await handler(request)
    except ApiError as e:
        error = e
    except web.HTTPException as e:
        if e.status < 400:
            raise
        error = ApiError(e.status, _http_error_message(request, e))
    except Exception:
        logger.exception("%s %s failed", request.method, escape(request.path))
        error = ApiError(500, "internal server error")
    log = logger.debug if request.path == "/health" else logger.info  # probes poll it
    log(
        "%s %s -> %d: %s", request.method, escape(request.path), error.status, escape(error.message)
    )
    return error.response()


def _http_error_message(request: web.Request, e: web.HTTPException) -> str:
    if e.status == 404:
        return f"no route {request.path}"
    if e.status == 405:
        return f"{request.method} is not allowed on {request.path}"
    if e.status == 413:
        return f"the request body exceeds the limit of {request.client_max_size} bytes"
    return e.reason


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """With `--api-key`, every route but `OPEN_PATHS` needs it, as `Authorization: Bearer KEY`
    or `X-API-Key: KEY`, compared in constant time."""
    key = context_of(request).server_args.api_key
    if key is None or request.path in OPEN_PATHS:
        return await handler(request)
    given = request.headers.get("X-API-Key")
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if given is None and scheme.lower() == "bearer":
        given = token.strip()
    if given is None or not hmac.compare_digest(given.encode(), key.encode()):
        raise ApiError(
            401,
            "a valid API key is required (Authorization: Bearer KEY or X-API-Key: KEY)",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return await handler(request)


def cors_middleware(origins: tuple[str, ...]) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Answers CORS preflights for the allowed `origins` (an empty tuple: no CORS at all)."""

    @web.middleware
    async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
        is_preflight = request.method == "OPTIONS" and (
            "Access-Control-Request-Method" in request.headers
        )
        if is_preflight and allowed_origin(origins, request) is not None:
            return web.Response(status=204)
        return await handler(request)

    return cors


def allowed_origin(origins: tuple[str, ...], request: web.Request) -> str | None:
    """The `Access-Control-Allow-Origin` value for this request, or None (no CORS headers)."""
    origin = request.headers.get("Origin")
    if origin is None or not origins:
        return None
    if "*" in origins:
        return "*"
    return origin if origin in origins else None


async def add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare` hook: CORS headers for an allowed origin. Never credentials: the
    API key travels in a header the page sets, so no cookie or HTTP auth is ever needed."""
    origins = context_of(request).server_args.allowed_origins
    allowed = allowed_origin(origins, request)
    if allowed is None:
        return
    response.headers["Access-Control-Allow-Origin"] = allowed
    if allowed != "*":
        response.headers["Vary"] = "Origin"
    if request.method == "OPTIONS":
        response.headers["Access-Control-Allow-Methods"] = CORS_ALLOW_METHODS
        response.headers["Access-Control-Allow-Headers"] = CORS_ALLOW_HEADERS
        response.headers["Access-Control-Max-Age"] = "600"
