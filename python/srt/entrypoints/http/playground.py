"""The browser playground at `/`: one self-contained page (inline CSS and JS, nothing fetched from
elsewhere) that chats with the model through `/v1/chat/completions` with streaming.

The page is a package data file, read once. Its Content-Security-Policy allows exactly its own
inline style and script (by hash) and requests to this server, so even a model answer that
slipped into the DOM as markup could not run script or reach another origin.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from importlib import resources

from aiohttp import web

routes = web.RouteTableDef()

PAGE = "playground.html"


def _hash_source(kind: str, page: str) -> str:
    """The CSP source (`'sha256-...'`) of the single inline `<kind>` element of the page."""
    blocks = re.findall(rf"<{kind}>(.*?)</{kind}>", page, flags=re.DOTALL)
    if len(blocks) != 1:
        raise RuntimeError(f"{PAGE} must hold exactly one inline <{kind}>, found {len(blocks)}")
    digest = hashlib.sha256(blocks[0].encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


@functools.cache
def page_response_parts() -> tuple[bytes, dict[str, str]]:
    """The page's bytes and the headers it is served with."""
    page = resources.files("srt.entrypoints.http").joinpath("static", PAGE).read_text("utf-8")
    policy = "; ".join(
        [
            "default-src 'none'",
            f"style-src {_hash_source('style', page)}",
            f"script-src {_hash_source('script', page)}",
            "connect-src 'self'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )
    headers = {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }
    return page.encode("utf-8"), headers


@routes.get("/")
async def playground(request: web.Request) -> web.Response:
    """The browser playground: a chat page streaming from `/v1/chat/completions`."""
    body, headers = page_response_parts()
    return web.Response(body=body, headers=headers, content_type="text/html", charset="utf-8")
