"""What every route of one server shares: its arguments, its phase and its TokenizerManager.

The server listens from the start, so the phase gates the routes: while STARTING (stages loading,
warm-up running), STOPPING (SIGTERM received) or DEAD (a stage process died), every route that
needs the model answers 503; `/health` says which.
"""

from __future__ import annotations

import contextlib
import enum
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from srt.entrypoints.http.errors import ApiError, bad_request
from srt.managers.tokenizer_manager import EngineDeadError, TokenizerManager
from srt.request_limits import RequestError
from srt.server_args import ServerArgs


class Phase(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    DEAD = "dead"


@dataclass(eq=False)
class ServerContext:
    server_args: ServerArgs
    model_name: str
    """The name `/v1/models` lists and OpenAI requests must ask for."""
    phase: Phase = Phase.STARTING
    why_unavailable: str = "the server is starting: the model is loading"
    manager: TokenizerManager | None = None
    started_at: float = field(default_factory=time.time)

    def tokenizer_manager(self) -> TokenizerManager:
        """The manager, for a route that needs the model; ApiError 503 unless the server is
        ready."""
        if self.phase is not Phase.READY or self.manager is None:
            raise ApiError(503, self.why_unavailable, headers={"Retry-After": "1"})
        return self.manager

    def set_unavailable(self, phase: Phase, why: str) -> None:
        self.phase = phase
        self.why_unavailable = why


CONTEXT = web.AppKey("srt_context", ServerContext)


def context_of(request: web.Request) -> ServerContext:
    return request.app[CONTEXT]


REQUEST_ERRORS = (ValueError, EngineDeadError)
"""What the tokenizer manager raises about a request: see `api_error`."""


def api_error(e: ValueError | EngineDeadError) -> ApiError:
    """A bad request (ValueError) is a 400 (naming the field of a `RequestError`), a dead
    pipeline a 503."""
    if isinstance(e, EngineDeadError):
        return ApiError(503, f"the server cannot serve requests: {e}")
    return bad_request(str(e), e.param if isinstance(e, RequestError) else None)


@contextlib.contextmanager
def request_errors() -> Iterator[None]:
    """Raises the `api_error` of what the tokenizer manager raises inside."""
    try:
        yield
    except REQUEST_ERRORS as e:
        raise api_error(e) from e


def abort_error(finish_reason: Mapping[str, Any] | None) -> ApiError | None:
    """The error of a request the scheduler refused (an abort carrying an HTTP status), if so."""
    if finish_reason is None or finish_reason.get("type") != "abort":
        return None
    status = finish_reason.get("status_code") or 0
    if status < 400:
        return None
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    param = finish_reason.get("param")
    return ApiError(status, str(finish_reason.get("message", "")), param=param, headers=headers)
