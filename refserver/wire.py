"""HTTP delivery shared by the protocol modules: JSON replies, SSE streams and deliberately broken ones.

A broken delivery sends the headers (with the full ``Content-Length``) and part of the body, then
returns without finishing the response, which makes uvicorn close the connection: the client sees a
response that started and never ended. Nothing here knows about tasks or protocols.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from enum import StrEnum
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from refserver.clock import pause

GARBAGE_BODY: Final = b"<html><body>upstream hiccup</body></html>{not json"


class Delivery(StrEnum):
    """How a reply reaches the client."""

    NORMAL = "normal"
    BROKEN = "broken"  # partial body, then the connection is dropped
    TRUNCATED = "truncated"  # status 200, syntactically cut JSON, consistent Content-Length
    GARBAGE = "garbage"  # status 200, application/json, not JSON at all


class Abort:
    """Marker an event stream yields to drop the connection mid-stream."""


ABORT: Final = Abort()


def dumps(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


class Reply(Response):
    """A JSON response that may be delayed or delivered broken on purpose."""

    media_type = "application/json"

    def __init__(
        self,
        content: object,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        *,
        delivery: Delivery = Delivery.NORMAL,
        delay_s: float = 0.0,
    ) -> None:
        body = dumps(content)
        if delivery is Delivery.TRUNCATED:
            body = body[: max(1, len(body) // 2)]
        elif delivery is Delivery.GARBAGE:
            body = GARBAGE_BODY
        super().__init__(body, status_code, headers, self.media_type)
        self.delivery = delivery
        self.delay_s = delay_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.delay_s > 0:
            await pause(self.delay_s)
        if self.delivery is not Delivery.BROKEN:
            await super().__call__(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await send(
            {"type": "http.response.body", "body": self.body[: len(self.body) // 2], "more_body": True}
        )
        # Returning here leaves the response unfinished; the server closes the connection.


class EventStream(Response):
    """A ``text/event-stream`` response fed by an async iterator; yielding ``ABORT`` drops the connection."""

    media_type = "text/event-stream"

    def __init__(
        self, events: AsyncIterator[bytes | Abort], headers: Mapping[str, str] | None = None
    ) -> None:
        self.events = events
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", "content-type": self.media_type, **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for item in self.events:
                if isinstance(item, Abort):
                    return
                await send({"type": "http.response.body", "body": item, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            # The client went away; there is nobody left to tell.
            return


def sse_event(message: object) -> bytes:
    return b"event: message\ndata: " + dumps(message) + b"\n\n"


def _accept_q(request: Request) -> dict[str, float]:
    """Media ranges from the Accept header with their q values (missing header = accept anything)."""
    header = request.headers.get("accept")
    if not header:
        return {"*/*": 1.0}
    out: dict[str, float] = {}
    for part in header.split(","):
        fields = [f.strip() for f in part.split(";")]
        if not fields[0]:
            continue
        q = 1.0
        for param in fields[1:]:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        out[fields[0].lower()] = q
    return out


def accepts_sse(request: Request) -> bool:
    q = _accept_q(request)
    return q.get("text/event-stream", 0.0) > 0


def prefers_sse(request: Request) -> bool:
    """True when the client ranks an event stream strictly above plain JSON."""
    q = _accept_q(request)
    sse = q.get("text/event-stream", 0.0)
    plain = max(q.get("application/json", 0.0), q.get("application/*", 0.0), q.get("*/*", 0.0))
    return sse > plain


__all__ = [
    "ABORT",
    "GARBAGE_BODY",
    "Abort",
    "Delivery",
    "EventStream",
    "Reply",
    "accepts_sse",
    "dumps",
    "prefers_sse",
    "sse_event",
]
