"""`/openapi.json`: an OpenAPI 3.1 description of every route, built from the router itself
(each handler's docstring is its summary), so it cannot fall behind the routes; request bodies
come from `request_schemas`, narrowed to the served model once it is loaded."""

from __future__ import annotations

import inspect
import re
from typing import Any

from aiohttp import web

from srt import __version__
from srt.entrypoints.http.context import Phase, context_of
from srt.entrypoints.http.errors import json_response
from srt.entrypoints.http.request_schemas import ModelLimits, Schema, request_bodies
from srt.request_limits import RequestLimits

routes = web.RouteTableDef()

ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "integer", "null"]},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}
PATH_PARAMETER = re.compile(r"\{(\w+)\}")


def describe(app: web.Application, limits: ModelLimits) -> dict[str, Any]:
    """The OpenAPI document of `app`'s routes."""
    bodies = request_bodies(limits)
    paths: dict[str, dict[str, Any]] = {}
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else None
        if path is None or route.method == "HEAD":
            continue
        methods = ("get", "post") if route.method == "*" else (route.method.lower(),)
        for method in methods:
            body = bodies.get(path) if method == "post" else None
            paths.setdefault(path, {})[method] = operation(route.handler, method, path, body)
    return {
        "openapi": "3.1.0",
        "info": {"title": "srt", "version": __version__},
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": {"Error": ERROR_SCHEMA}},
    }


def operation(handler: Any, method: str, path: str, body: Schema | None) -> dict[str, Any]:
    doc = inspect.getdoc(handler) or ""
    summary, _, description = doc.partition("\n")
    error = {
        "description": "an error in OpenAI's shape",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    out: dict[str, Any] = {
        "summary": summary.strip(),
        "operationId": f"{method}_{handler.__name__}",
        "responses": {"200": {"description": "success"}, "default": error},
    }
    if description.strip():
        out["description"] = description.strip()
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in PATH_PARAMETER.findall(path)
    ]
    if parameters:
        out["parameters"] = parameters
    if body is not None:
        out["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": body}},
        }
    return out


@routes.get("/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    """This description of every route."""
    context = context_of(request)
    requests = RequestLimits.of(context.server_args)
    limits = ModelLimits(context.model_name, requests)
    if context.phase is Phase.READY and context.manager is not None:
        manager = context.manager
        limits = ModelLimits(
            context.model_name, requests, manager.vocab_size, manager.context_length
        )
    return json_response(describe(request.app, limits))
