"""`/openapi.json`: an OpenAPI 3.1 description of every route, built from the router itself
(each handler's docstring is its summary), so it cannot fall behind the routes."""

from __future__ import annotations

import inspect
from typing import Any

from aiohttp import web

from srt import __version__
from srt.entrypoints.http.errors import json_response

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


def describe(app: web.Application) -> dict[str, Any]:
    """The OpenAPI document of `app`'s routes."""
    paths: dict[str, dict[str, Any]] = {}
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else None
        if path is None or route.method == "HEAD":
            continue
        methods = ("get", "post") if route.method == "*" else (route.method.lower(),)
        for method in methods:
            paths.setdefault(path, {})[method] = operation(route.handler, method)
    return {
        "openapi": "3.1.0",
        "info": {"title": "srt", "version": __version__},
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": {"Error": ERROR_SCHEMA}},
    }


def operation(handler: Any, method: str) -> dict[str, Any]:
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
    if method == "post":
        out["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    return out


@routes.get("/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    """This description of every route."""
    return json_response(describe(request.app))
