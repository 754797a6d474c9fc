"""What wraps every route: OpenAI-shaped errors, browser-safe guards, API-key checks and CORS.

Order (outermost first): errors, the Host check, CORS, auth, the Content-Type check. CORS headers
are added as a response is prepared, so that streams and error answers carry them too; preflight
requests are answered before auth (browsers send them without credentials).

Browser-safe defaults: a web page open in the operator's browser must not be able to drive a
local server. Of SGLang, vLLM and llama.cpp's server, vLLM is the most careful, and srt goes a
step further where none of them closes a hole:

- A POST body is JSON only: `application/json` or `application/*+json`, or no Content-Type at
  all (raw clients); anything else is a 415 before a handler reads it. A page can send
  `text/plain` or a form without a CORS preflight (CVE-2021-32677 in FastAPI, closed the same
  way; vLLM's `validate_json_request` answers 415 too, even without a Content-Type; SGLang
  relies on FastAPI, and llama.cpp's server parses any body). A typeless body passes here
  because a page cannot send one cross-origin without an `Origin` (below).
- Routes that change state (`/flush_cache`, `/abort_request`) are POST only, as vLLM's
  `/reset_prefix_cache` is (SGLang's `/flush_cache` takes GET too: an `<img src>` could call it).
- A cross-origin request from an origin not in `--allowed-origins` is a 403, whatever its
  method (what gin's CORS middleware does for Ollama; llama.cpp is moving that way). Browsers
  send `Origin` on every cross-origin POST, so a page cannot get past the Content-Type check
  with a body that carries no Content-Type (a typeless Blob).
- Bound to a loopback address, the server answers only requests whose `Host` names loopback
  (`localhost`, `127.x.x.x`, `[::1]`, any port) or a name in `--allowed-hosts`: a page whose
  own name was re-pointed at 127.0.0.1 (DNS rebinding) is same-origin to the browser, and only
  its `Host` gives it away. None of the three checks this; Ollama does (`allowedHost`).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

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
LOOPBACK_NAMES = ("localhost",)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure answered as `{"error": {...}}`: ApiError, aiohttp's HTTP errors (404 for an
    unknown route, 405 with its `Allow` header, 413), and anything unexpected as a 500 (logged
    with its traceback)."""
    try:
        return await handler(request)
    except ApiError as e:
        error = e
    except web.HTTPException as e:
        if e.status < 400:
            raise
        allow = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
        error = ApiError(e.status, _http_error_message(request, e), headers=allow)
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


# ---- DNS rebinding -------------------------------------------------------------------------


def is_loopback_address(host: str) -> bool:
    """Whether a listening address (`--host`) is a loopback name or address."""
    return host.lower() in LOOPBACK_NAMES or _is_loopback_ip(host)


def host_name(host: str) -> str | None:
    """The name or address of a `Host` header value, without its port (IPv6 without brackets);
    None when the value is malformed."""
    if host.startswith("["):
        address, bracket, port = host[1:].partition("]")
        if not bracket or (port and not (port.startswith(":") and port[1:].isdigit())):
            return None
        return address
    name, colon, port = host.partition(":")
    if colon and not port.isdigit():
        return None
    return name


def host_allowed(host: str | None, allowed_hosts: tuple[str, ...]) -> bool:
    """Whether a request with this `Host` may reach a loopback-bound server: a loopback name or
    address, or one of `allowed_hosts` (`*`: any)."""
    if "*" in allowed_hosts:
        return True
    name = host_name(host) if host is not None else None
    if not name:
        return False
    name = name.lower()
    return (
        name in LOOPBACK_NAMES
        or _is_loopback_ip(name)
        or name in (allowed.lower() for allowed in allowed_hosts)
    )


def _is_loopback_ip(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_middleware(bind_host: str, allowed_hosts: tuple[str, ...]) -> Middleware:
    """403 for a request whose `Host` is not allowed (see `host_allowed`), when the server
    listens on a loopback address or `allowed_hosts` was given; otherwise every Host passes."""
    checked = is_loopback_address(bind_host) or bool(allowed_hosts)

    @web.middleware
    async def host_check(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host")
        if checked and not host_allowed(host, allowed_hosts):
            raise ApiError(
                403,
                f"this server does not answer to the host {host!r}: it serves loopback names "
                "(localhost, 127.0.0.1, [::1]); start it with --allowed-hosts to add others",
                code="host_not_allowed",
            )
        return await handler(request)

    return host_check


# ---- API keys ------------------------------------------------------------------------------


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """With `--api-key`, every route but `OPEN_PATHS` needs it, as `Authorization: Bearer KEY`
    or `X-API-Key: KEY`. The header's raw bytes are compared with the key's UTF-8 in constant
    time, so a header in any encoding (or none) is simply not the key: a 401, never a 500."""
    key = context_of(request).server_args.api_key
    if key is None or request.path in OPEN_PATHS:
        return await handler(request)
    given = _raw_header(request, b"x-api-key")
    scheme, _, token = (_raw_header(request, b"authorization") or b"").partition(b" ")
    if given is None and scheme.lower() == b"bearer":
        given = token.strip()
    if given is None or not hmac.compare_digest(given, key.encode("utf-8")):
        raise ApiError(
            401,
            "a valid API key is required (Authorization: Bearer KEY or X-API-Key: KEY)",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return await handler(request)


def _raw_header(request: web.Request, name: bytes) -> bytes | None:
    """The first value of header `name` (lower case) as the client sent its bytes."""
    for key, value in request.raw_headers:
        if key.lower() == name:
            return value
    return None


# ---- request bodies ------------------------------------------------------------------------


def is_json_content_type(content_type: str) -> bool:
    """Whether a Content-Type is JSON: `application/json` or `application/<anything>+json`,
    with any parameters (FastAPI's rule)."""
    media_type = content_type.partition(";")[0].strip().lower()
    kind, _, subtype = media_type.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


@web.middleware
async def content_type_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """415 for a POST body to a route whose Content-Type is present and not JSON, before its
    handler runs (an unknown route stays a 404, a wrong method a 405). An empty body has nothing
    to misread: clients label it as they please (aiohttp sends `application/octet-stream`)."""
    content_type = request.headers.get("Content-Type")
    if (
        request.method == "POST"
        and request.body_exists
        and content_type is not None
        and request.match_info.http_exception is None
        and not is_json_content_type(content_type)
    ):
        raise ApiError(
            415,
            f"the body must be JSON (Content-Type: application/json), not {content_type!r}",
            code="unsupported_media_type",
        )
    return await handler(request)


# ---- CORS ----------------------------------------------------------------------------------


def cors_middleware(origins: tuple[str, ...]) -> Middleware:
    """Answers CORS preflights for the allowed `origins` (an empty tuple: no CORS at all), and
    refuses (403) any cross-origin request from another origin."""

    @web.middleware
    async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is None or _is_same_origin(request, origin):
            return await handler(request)
        if allowed_origin(origins, request) is None:
            raise ApiError(
                403,
                f"cross-origin requests from {origin!r} are not allowed; start the server with "
                "--allowed-origins to allow an origin",
                code="origin_not_allowed",
            )
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            return web.Response(status=204)
        return await handler(request)

    return cors


def _is_same_origin(request: web.Request, origin: str) -> bool:
    """Whether `Origin` is this server as the browser reached it (the playground's own calls)."""
    return origin.lower() == f"{request.scheme}://{request.headers.get('Host', '')}".lower()


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
