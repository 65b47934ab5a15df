"""In-process wire for the shipped-code explorer: a virtual-time event loop, the network between the
real adapters and the reference servers, and the ledger port the real ``Driver`` writes through.

Nothing here decides what an operation does. ``Network`` holds every HTTP exchange the adapters
start (``Gate`` is the ``HttpClient`` they are given) until the explorer says what happens to
it: deliver it to the reference server (``refserver``'s own Starlette app, called as ASGI in this
process, under the same virtual clock), lose the request or only its reply, deliver it late or
twice, answer 503 in the server's place, or cut the reply short. ``VirtualLoop`` is an asyncio loop
whose time is the virtual clock, so the adapters' own timeouts and the servers' waits run on it and
``settle`` can tell when every coroutine is blocked on the explorer. ``Recording`` logs every write
the driver makes through its ledger (``engine.ledger.memory.MemoryPort`` or the real DuckDB one).
Must not be used outside simulations: it reads no wall clock and does no real I/O.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
import selectors
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum, StrEnum
from typing import Any
from urllib.parse import urlsplit

from engine.adapters.transport import (
    ExchangeFailed,
    ExchangeTimedOut,
    HttpClient,
    HttpRequest,
    HttpResponse,
    headers_of,
)
from engine.ledger.port import BatchOutcome, GroupOutcome, WriteGroup, refusals
from engine.model import Operation, Receipt, TaskId, Transition
from refserver.app import Admin, build_app
from refserver.context import Options
from refserver.context import Protocol as ServerProtocol

Json = dict[str, Any]
START = datetime(2026, 1, 1, tzinfo=UTC)


class VirtualTime:
    """Seconds since ``START``; moved only by the explorer (never by the wall clock)."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0

    def now(self) -> datetime:
        return START + timedelta(seconds=self.seconds)


class EngineClock:
    """``engine.clock.Clock`` on virtual time."""

    def __init__(self, vt: VirtualTime) -> None:
        self._vt = vt

    def now(self) -> datetime:
        return self._vt.now()

    async def sleep(self, delay: timedelta) -> None:
        await asyncio.sleep(max(0.0, delay.total_seconds()))


class ServerClock:
    """``refserver.clock.Clock`` on virtual time."""

    def __init__(self, vt: VirtualTime) -> None:
        self._vt = vt

    def monotonic(self) -> float:
        return 1000.0 + self._vt.seconds

    def now(self) -> datetime:
        return self._vt.now()


class _NoSelector(selectors.BaseSelector):
    """The virtual loop does no I/O: there is never a file to wait on, so ``select`` returns at once
    (an epoll call per loop iteration was a measurable share of a run)."""

    def __init__(self) -> None:
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        return []

    def get_map(self) -> Any:
        return self._keys


class VirtualLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose ``time()`` is the virtual clock: a timer fires once the explorer has
    moved time past it, never because the wall clock did."""

    def __init__(self, vt: VirtualTime) -> None:
        super().__init__(_NoSelector())
        self._vt = vt
        self.held: list[WriterJob] | None = None
        """Where work handed to a thread (``asyncio.to_thread``: the service's group commit) waits
        for the explorer to run it (``WriterJob.run``); None: handed to a real thread as usual."""

    def run_in_executor(  # type: ignore[override]  # the same call, typed loosely
        self, executor: Any, func: Callable[..., Any], *args: Any
    ) -> asyncio.Future[Any]:
        if self.held is None:
            return super().run_in_executor(executor, func, *args)
        job = WriterJob(func, args, self.create_future())
        self.held.append(job)
        return job.future

    def time(self) -> float:
        return 1000.0 + self._vt.seconds

    def busy(self) -> bool:
        """Whether some callback is ready to run, or a timer is due at the virtual now."""
        # CPython's loop keeps its run queue in ``_ready`` and its timers in ``_scheduled``; the
        # explorer needs to know when every coroutine waits on it, which asyncio has no API for.
        if self._ready:  # type: ignore[attr-defined]
            return True
        scheduled = self._scheduled  # type: ignore[attr-defined]
        now = self.time()
        return any(not h.cancelled() and h.when() <= now for h in scheduled)


@dataclass
class WriterJob:
    """A call the code under test handed to a thread, held until the explorer runs it on its own
    thread (a crash first: it never runs, as a commit the process died in never lands)."""

    func: Callable[..., Any]
    args: tuple[Any, ...]
    future: asyncio.Future[Any]

    def run(self) -> None:
        if self.future.done():
            return
        try:
            result = self.func(*self.args)
        except Exception as exc:
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)


async def settle(loop: VirtualLoop) -> None:
    """Run every coroutine until each one waits on the explorer (or on a future virtual instant)."""
    for _ in range(100_000):
        await asyncio.sleep(0)
        if not loop.busy():
            return
    raise RuntimeError("the simulation did not settle (a coroutine spins without waiting)")


class Kind(StrEnum):
    """What a request is for, read from the wire (method or path)."""

    SUBMIT = "submit"
    GET = "get"
    RESULT = "result"
    CANCEL = "cancel"
    LOOKUP = "lookup"
    INPUT = "input"
    HANDSHAKE = "handshake"


def kind_of(request: HttpRequest, body: bytes) -> Kind:
    """The request's purpose, from its JSON-RPC method or its AIP-151 path and verb."""
    path = request.path
    if path.endswith("/mcp"):
        try:
            message = json.loads(body)
        except ValueError:
            return Kind.HANDSHAKE
        method = message.get("method") if isinstance(message, dict) else None
        if method is None:
            return Kind.INPUT  # a JSON-RPC response: the answer to an elicitation
        return {
            "tools/call": Kind.SUBMIT,
            "tasks/get": Kind.GET,
            "tasks/result": Kind.RESULT,
            "tasks/cancel": Kind.CANCEL,
            "tasks/list": Kind.LOOKUP,
            "tasks/update": Kind.INPUT,
        }.get(str(method), Kind.HANDSHAKE)
    if path.endswith(":run"):
        return Kind.SUBMIT
    if path.endswith(":cancel"):
        return Kind.CANCEL
    if path.rstrip("/").endswith("/operations"):
        return Kind.LOOKUP
    return Kind.GET


@dataclass(eq=False)
class Stream:
    """A reply as the server produces it: status and headers, then body chunks until ``ended``."""

    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    started: bool = False
    ended: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def poke(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def body(self) -> bytes:
        return b"".join(self.chunks)


@dataclass(eq=False)
class Message:
    """One exchange on the wire: a request in flight, or (``reply`` set) its reply in flight."""

    rid: int
    kind: Kind
    owner: int
    """The executor incarnation (or caller) that sent it."""
    epoch: int
    request: HttpRequest
    body: bytes
    waiter: asyncio.Future[HttpResponse] | None
    reply: Stream | None = None
    truncated: bool = False

    @property
    def waiting(self) -> bool:
        return self.waiter is not None and not self.waiter.done()


class Network:
    """Every exchange in flight, and the reference server they may reach."""

    def __init__(
        self,
        loop: VirtualLoop,
        app: Callable[..., Any],
        *,
        passthrough: frozenset[Kind],
        handshakes: dict[tuple[str, str, bytes], Canned] | None = None,
    ) -> None:
        self.loop = loop
        self.app = app
        self.passthrough = passthrough
        self.handshakes = handshakes
        """Replies to handshakes (``initialize``, ``tools/list``, ...) the server already gave for the
        same request bytes; a new executor's handshake is answered from here (see ``RefServer``)."""
        self._dispatch = _dispatcher(app)
        self.inflight: list[Message] = []
        self.delivered: list[Message] = []
        """Requests that reached the server, in order (the server's own record of what it was asked)."""
        self.failures = 0
        """Exchanges that ended without a reply (lost, timed out, throttled, cut): a retry may do better."""
        self._rid = 0
        self.fenced: set[int] = set()
        """Senders in an advance begun on an operation another epoch owns (they must send nothing)."""
        self.fenced_sends: list[str] = []
        """What such senders sent anyway (a divergence: the FENCED path talked to the server)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._disconnect = asyncio.Event()
        self.on_send: Callable[[Message], None] | None = None
        """Told of every request as it leaves its sender (the checks judge what was durable then)."""

    def gate(self, owner: int, epoch: int) -> Gate:
        return Gate(self, owner, epoch)

    def client(self, owner: int, epoch: int) -> HttpClient:
        """An HTTP client whose every request goes through this network as ``owner`` at ``epoch``."""
        return self.gate(owner, epoch)

    # ------------------------------------------------------------------------- client side

    async def send(self, owner: int, epoch: int, request: HttpRequest) -> HttpResponse:
        body = request.body or b""
        self._rid += 1
        waiter: asyncio.Future[HttpResponse] = self.loop.create_future()
        msg = Message(self._rid, kind_of(request, body), owner, epoch, request, body, waiter)
        if owner in self.fenced:
            self.fenced_sends.append(f"{msg.kind} from executor {owner} (epoch {epoch})")
        if self.on_send is not None:
            self.on_send(msg)
        if msg.kind in self.passthrough:
            self.deliver(msg)
        else:
            self.inflight.append(msg)
        return await waiter

    # ------------------------------------------------------------------------ explorer side

    def deliver(self, msg: Message) -> None:
        """The request reaches the server; its reply goes in flight once the server starts it."""
        if msg in self.inflight:
            self.inflight.remove(msg)
        stream = Stream()
        reply = Message(msg.rid, msg.kind, msg.owner, msg.epoch, msg.request, msg.body, msg.waiter, stream)
        self.delivered.append(msg)
        task = self.loop.create_task(self._serve(msg, stream, reply))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, msg: Message, stream: Stream, reply: Message) -> None:
        request = msg.request
        canned_key = None
        if msg.kind is Kind.HANDSHAKE and self.handshakes is not None:
            canned_key = (request.method, request.path, msg.body)
            canned = self.handshakes.get(canned_key)
            if canned is not None:
                stream.status, stream.headers, stream.chunks = (
                    canned.status,
                    list(canned.headers),
                    [canned.body],
                )
                stream.started = stream.ended = True
                self._started(msg, reply)
                stream.poke()
                return
        url = urlsplit(request.url)
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": url.scheme,
            "path": url.path,
            "raw_path": url.path.encode(),
            "query_string": url.query.encode(),
            "root_path": "",
            "headers": [(k.lower().encode(), v.encode()) for k, v in request.headers.items()],
            "client": ("127.0.0.1", 1),
            "server": (url.hostname, url.port or 80),
        }
        sent_body = False

        async def receive() -> dict[str, Any]:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": msg.body, "more_body": False}
            await self._disconnect.wait()
            return {"type": "http.disconnect"}

        async def send(event: dict[str, Any]) -> None:
            if event["type"] == "http.response.start":
                stream.status = int(event["status"])
                stream.headers = list(event.get("headers", []))
                stream.started = True
                self._started(msg, reply)
            elif event["type"] == "http.response.body":
                chunk = event.get("body", b"")
                if chunk:
                    stream.chunks.append(chunk)
                if not event.get("more_body", False):
                    stream.ended = True
            stream.poke()

        try:
            await self._dispatch(scope, receive, send)
        except Exception:
            pass
        finally:
            stream.ended = True
            stream.poke()
        if canned_key is not None and self.handshakes is not None and 200 <= stream.status < 300:
            self.handshakes[canned_key] = Canned(stream.status, tuple(stream.headers), stream.body())

    def _started(self, msg: Message, reply: Message) -> None:
        if msg.kind in self.passthrough:
            self._complete(reply, truncate=False)
        else:
            self.inflight.append(reply)

    def _complete(self, reply: Message, *, truncate: bool) -> None:
        stream = reply.reply
        assert stream is not None
        if reply.waiter is None or reply.waiter.done():
            return
        headers = [(k.decode(), v.decode()) for k, v in stream.headers if k.lower() != b"content-length"]
        reply.waiter.set_result(_Reply(stream.status, headers_of(headers), stream, truncate))

    def deliver_reply(self, reply: Message, *, truncate: bool = False) -> None:
        self.inflight.remove(reply)
        if truncate:
            self.failures += 1
        self._complete(reply, truncate=truncate)

    @property
    def busy(self) -> bool:
        """Whether the server is still working on some request (a coroutine is running)."""
        return bool(self._tasks)

    def lose(self, msg: Message, why: str) -> None:
        """The request or its reply is lost: the sender's wait ends in a timeout."""
        self.inflight.remove(msg)
        self.failures += 1
        if msg.waiting:
            assert msg.waiter is not None
            msg.waiter.set_exception(ExchangeTimedOut(why))

    def time_out(self, msg: Message) -> None:
        """The sender gives up waiting; the request stays in flight and may still arrive (late)."""
        self.failures += 1
        if msg.waiting:
            assert msg.waiter is not None
            msg.waiter.set_exception(ExchangeTimedOut("no reply in time"))

    def duplicate(self, msg: Message) -> None:
        twin = Message(msg.rid, msg.kind, msg.owner, msg.epoch, msg.request, msg.body, None)
        self.inflight.insert(self.inflight.index(msg) + 1, twin)

    def throttle(self, msg: Message) -> None:
        """Answered 503 in the server's place (a proxy or load shedder); the server never saw it."""
        self.inflight.remove(msg)
        self.failures += 1
        if msg.waiting:
            assert msg.waiter is not None
            busy = Stream(503, [(b"retry-after", b"1")], [b"busy"], started=True, ended=True)
            msg.waiter.set_result(_Reply(503, headers_of({"retry-after": "1"}), busy, truncate=False))

    def orphan(self, owner: int) -> None:
        """The owner died: replies to it go nowhere (its requests may still reach the server)."""
        self.inflight = [m for m in self.inflight if m.reply is None or m.owner != owner]

    async def close(self) -> None:
        self._disconnect.set()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


@dataclass(frozen=True, slots=True)
class Canned:
    """A reply the server gave, kept to answer the same handshake request again."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


def _dispatcher(app: Any) -> Callable[..., Any]:
    """Call the protocol's endpoint for a request straight from the app's routes.

    What answers is the reference server's own endpoint function and its own response object (the
    bytes a real client gets over HTTP); skipped is Starlette's middleware stack and router, which
    cost about a fifth of a run. A request no route takes fully (wrong method, unknown path) goes
    through the whole app as before; an exception goes to the app's own handlers.
    """
    routes = getattr(app, "routes", None)
    handlers = getattr(app, "exception_handlers", None)
    if not routes or handlers is None:
        return app  # type: ignore[no-any-return]
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.routing import Match

    async def dispatch(scope: dict[str, Any], receive: Any, send: Any) -> None:
        for route in routes:
            match, child = route.matches(scope)
            if match is Match.FULL:
                scope.update(child)
                request = Request(scope, receive)
                try:
                    response = await route.endpoint(request)
                except Exception as exc:
                    handler = handlers.get(HTTPException if isinstance(exc, HTTPException) else Exception)
                    if handler is None:
                        raise
                    response = await handler(request, exc)
                await response(scope, receive, send)
                return
            if match is not Match.NONE:
                break
        await app(scope, receive, send)

    return dispatch


class RefServer:
    """The reference server's app for one protocol and option set, built once and reset for each run.

    Building the Starlette app and its context cost more than a short run; ``reset`` gives every
    run the state of a fresh server (no tasks, keys, answers; the store's seeded generator and the
    task numbering restarted). MCP 2025-11-25 sessions survive a reset (as they do over the admin
    API), so the handshake replies in ``handshakes`` stay valid: a session id names a connection,
    while tasks belong to the principal, so every executor sharing one changes no outcome.
    """

    def __init__(self, protocol: ServerProtocol, *, idempotency: bool) -> None:
        self.vt = VirtualTime()
        self._ids: Iterator[int] = itertools.count(1)
        self.app = build_app(
            Options(protocol=protocol, idempotency=idempotency, seed=0),
            ServerClock(self.vt),
            new_id=lambda: f"t{next(self._ids)}",
        )
        self.ctx = self.app.state.ctx
        self.loop = VirtualLoop(self.vt)
        """The run's event loop, reused too (its time is this server's virtual clock)."""
        self.handshakes: dict[tuple[str, str, bytes], Canned] = {}
        self.in_use = False
        self.cached = False

    def protocol_state(self) -> object:
        """What the protocol module keeps between requests besides the store (AIP-151: the creates it
        dropped on purpose); MCP 2025-11-25's session table is left out (see the class docstring)."""
        owners = {getattr(getattr(route, "endpoint", None), "__self__", None) for route in self.app.routes}
        return tuple(
            sorted(
                repr(canon(owner, frozenset({"ctx", "store", "methods", "sessions"})))
                for owner in owners
                if owner is not None and not isinstance(owner, Admin)
            )
        )

    def release(self) -> None:
        """The run is over (every task on the loop ended): the next run may reuse the server."""
        self.in_use = False
        if not self.cached:
            self.loop.close()

    def reset(self) -> None:
        self.vt.seconds = 0.0
        self._ids = itertools.count(1)
        self.ctx.reset()
        # What the admin API's reset does: the context, then the protocol's own per-server state.
        protocols = {getattr(getattr(route, "endpoint", None), "__self__", None) for route in self.app.routes}
        for owner in protocols:
            if owner is not None and not isinstance(owner, Admin):
                owner.reset()


_SERVERS: dict[tuple[ServerProtocol, bool], RefServer] = {}


def ref_server(protocol: ServerProtocol, *, idempotency: bool) -> RefServer:
    """A reset server for one run: the process's cached one, or a new one if that one is in use."""
    cached = _SERVERS.get((protocol, idempotency))
    if cached is None or cached.in_use:
        server = RefServer(protocol, idempotency=idempotency)
        if cached is None:
            server.cached = True
            _SERVERS[(protocol, idempotency)] = server
    else:
        server = cached
        server.reset()
    server.in_use = True
    return server


# ------------------------------------------------------------------------------ state keys

_OPAQUE_MODULES = ("httpx", "asyncio", "starlette", "refserver.clock", "engine.explore.wire")

# What ``canon`` does with a value, decided once per type (the walk runs over every object of the
# ledger, the server and the driver at each quiet point; asking ``isinstance`` down a list of kinds
# per value was most of a state key's cost).
_PLAIN, _SEQ, _MAP, _SET, _RNG, _OPAQUE, _REPR, _DICT, _SLOTS = range(9)
_KINDS: dict[type, tuple[int, tuple[str, ...]]] = {}
_FROZEN: dict[tuple[int, frozenset[str], int], tuple[object, object]] = {}
"""Renderings of frozen dataclass instances, by identity (the instance is kept so its id is not
reused); a frozen instance's fields never change, so it is rendered once (cleared past a bound)."""
_FROZEN_BOUND = 50_000


def _kind(kind: type, value: object) -> tuple[int, tuple[str, ...]]:
    if issubclass(kind, str | int | float | bytes | datetime | timedelta | Enum) or value is None:
        found: tuple[int, tuple[str, ...]] = (_PLAIN, ())
    elif issubclass(kind, list | tuple):
        found = (_SEQ, ())
    elif issubclass(kind, dict):
        found = (_MAP, ())
    elif issubclass(kind, set | frozenset):
        found = (_SET, ())
    elif issubclass(kind, random.Random):
        found = (_RNG, ())
    elif kind.__module__.startswith(_OPAQUE_MODULES) or (callable(value) and not hasattr(value, "__dict__")):
        found = (_OPAQUE, ())
    elif issubclass(kind, itertools.count):
        found = (_REPR, ())
    elif hasattr(value, "__dict__"):
        found = (_DICT, ())
    else:
        slots = getattr(kind, "__slots__", None)
        if slots is None:
            found = (_REPR, ())
        else:
            names = (slots,) if isinstance(slots, str) else tuple(slots)
            frozen = getattr(getattr(kind, "__dataclass_params__", None), "frozen", False)
            found = (-_SLOTS if frozen else _SLOTS, names)
    _KINDS[kind] = found
    return found


def canon(value: object, skip: frozenset[str] = frozenset(), depth: int = 0) -> object:
    """A hashable, comparable rendering of ``value`` for state keys: equal data, equal key.

    Plain values stay as they are; containers, dataclasses and objects become tuples of their
    contents (attributes named in ``skip`` left out); a random generator becomes the hash of its
    state. Objects of the I/O plumbing (HTTP client, event loop, clocks) are reduced to their type:
    they hold no state a run's future depends on. Pure (its caches only remember what a type is and
    how a frozen instance, which cannot change, was rendered).
    """
    kind = type(value)
    found = _KINDS.get(kind)
    if found is None:
        found = _kind(kind, value)
    how = found[0]
    if how == _PLAIN:
        return value
    if depth > 8:
        return kind.__name__
    d = depth + 1
    if how == _SEQ:
        return tuple([canon(v, skip, d) for v in value])  # type: ignore[attr-defined]
    if how == _MAP:
        return tuple([(canon(k, skip, d), canon(v, skip, d)) for k, v in value.items()])  # type: ignore[attr-defined]
    if how == _SET:
        return tuple(sorted(repr(canon(v, skip, d)) for v in value))  # type: ignore[attr-defined]
    if how == _RNG:
        return hash(value.getstate())  # type: ignore[attr-defined]
    if how == _OPAQUE:
        return kind.__name__
    if how == _REPR:
        return repr(value)
    if how == _DICT:
        fields = value.__dict__
        return (
            kind.__name__,
            tuple([(k, canon(v, skip, d)) for k, v in fields.items() if k not in skip and not callable(v)]),
        )
    frozen = how < 0
    if frozen:
        memo = (id(value), skip, depth)
        hit = _FROZEN.get(memo)
        if hit is not None and hit[0] is value:
            return hit[1]
    out = (
        kind.__name__,
        tuple(
            [
                (n, canon(v, skip, d))
                for n in found[1]
                if n not in skip and hasattr(value, n) and not callable(v := getattr(value, n))
            ]
        ),
    )
    if frozen:
        if len(_FROZEN) > _FROZEN_BOUND:
            _FROZEN.clear()
        _FROZEN[memo] = (value, out)
    return out


_RPC_ID = re.compile(rb'"id":\s*\d+')


def without_rpc_ids(body: bytes) -> bytes:
    """``body`` with its numeric JSON-RPC ids blanked: an adapter numbers its requests and only
    checks that a reply carries the id it sent, so two runs that differ only in how many requests
    came before behave alike (a renaming, not a different state)."""
    return _RPC_ID.sub(b'"id":#', body)


def message_key(msg: Message) -> tuple[object, ...]:
    """A message in flight as data: who sent it under which epoch, what it asks, its reply so far."""
    reply = msg.reply
    return (
        msg.kind,
        msg.owner,
        msg.epoch,
        msg.request.method,
        msg.request.path,
        without_rpc_ids(msg.body),
        msg.waiting,
        None if reply is None else (reply.status, without_rpc_ids(reply.body()), reply.ended),
    )


class _Reply:
    """A reply as the adapters read it: the client reads the server's chunks as they come (an SSE
    stream stays open)."""

    def __init__(self, status: int, headers: Mapping[str, str], stream: Stream, truncate: bool) -> None:
        self.status = status
        self.headers = headers
        self._stream = stream
        self._truncate = truncate

    async def chunks(self) -> AsyncIterator[bytes]:
        stream = self._stream
        i = 0
        while True:
            while i < len(stream.chunks):
                chunk = stream.chunks[i]
                i += 1
                if self._truncate:
                    # Cut the body short: half of the first chunk, then the connection closes.
                    yield chunk[: max(1, len(chunk) // 2)]
                    raise ExchangeFailed("peer closed connection without sending complete body")
                yield chunk
            if stream.ended:
                return
            await stream.changed.wait()


class Gate(HttpClient):
    """The adapters' HTTP client: every request waits in the network for the explorer."""

    def __init__(self, net: Network, owner: int, epoch: int) -> None:
        self._net = net
        self.owner = owner
        self.epoch = epoch

    def open(self, request: HttpRequest) -> AbstractAsyncContextManager[HttpResponse]:
        return self._exchange(request)

    @asynccontextmanager
    async def _exchange(self, request: HttpRequest) -> AsyncIterator[HttpResponse]:
        yield await self._net.send(self.owner, self.epoch, request)


# ---------------------------------------------------------------------------------- the ledger


@dataclass(frozen=True, slots=True)
class Write:
    """One transition the driver recorded, and which executor incarnation recorded it."""

    writer: int
    writer_epoch: int
    transition: Transition
    payload: Json | None
    receipt: bool


class Recording:
    """The ledger as one executor incarnation sees it: every write is also logged for the checks."""

    def __init__(self, inner: Any, log: list[Write], writer: int, writer_epoch: int) -> None:
        self._inner = inner
        self._log = log
        self._writer = writer
        self._epoch = writer_epoch

    def moved_to(self, epoch: int) -> None:
        """The executor process this log names raised its own epoch (a rollback in the service):
        what it writes from now on is written at ``epoch``."""
        self._epoch = epoch

    def apply(self, transition: Transition) -> Operation:
        out = self._inner.apply(transition)
        self._log.append(Write(self._writer, self._epoch, transition, None, False))
        return out  # type: ignore[no-any-return]

    def accept_terminal(self, transition: Transition, payload: Json | None) -> Receipt:
        out = self._inner.accept_terminal(transition, payload)
        self._log.append(Write(self._writer, self._epoch, transition, payload, True))
        return out  # type: ignore[no-any-return]

    def apply_many(self, transitions: Sequence[Transition]) -> Sequence[BatchOutcome]:
        out: Sequence[BatchOutcome] = self._inner.apply_many(transitions)
        refused = dict(refusals(out))
        self._log.extend(
            Write(self._writer, self._epoch, t, None, False)
            for i, t in enumerate(transitions)
            if i not in refused
        )
        return out

    def commit_group(self, group: WriteGroup) -> GroupOutcome:
        """A group commit (the service executor's write groups): what it made durable is logged."""
        out: GroupOutcome = self._inner.commit_group(group)
        refused = dict(refusals(out.transitions))
        for i, t in enumerate(group.transitions):
            if i not in refused:
                self._log.append(Write(self._writer, self._epoch, t, None, False))
        refused = dict(refusals(out.acceptances))
        for i, (t, payload) in enumerate(group.acceptances):
            if i not in refused:
                self._log.append(Write(self._writer, self._epoch, t, payload, True))
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class SeenRows:
    """The DuckDB ledger as the explorer's own steps read it: a row once read by ``get`` is answered
    from memory until something else is called on the ledger.

    A DuckDB read is a SQL query, and the explorer's own reads (what is enabled, what an advance
    changed, the idle mark) were three quarters of a DuckDB run's queries. Every write reaches the
    ledger through this object (the explorer's own calls) or through ``writer`` (what the drivers'
    ``Recording``s are given), and either forgets every row before and after the call, so a row
    answered from memory is the one the ledger holds. The drivers' own reads go to the ledger
    itself: what the shipped code runs is unchanged.
    """

    _READS = frozenset({"get"})
    """Calls of the drivers that change nothing (every other call may write, so it forgets)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._rows: dict[str, Operation | None] = {}
        self.writer = _Forgetting(self)

    def get(self, operation_id: str) -> Operation | None:
        rows = self._rows
        if operation_id in rows:
            return rows[operation_id]
        op: Operation | None = self._inner.get(operation_id)
        rows[operation_id] = op
        return op

    @property
    def ledger(self) -> Any:
        """The DuckDB ledger itself."""
        return self._inner

    def forget(self) -> None:
        self._rows.clear()

    def __getattr__(self, name: str) -> Any:
        return _forgetting(self, getattr(self._inner, name))


class _Forgetting:
    """The ledger as the drivers see it, telling ``SeenRows`` of every call that may write."""

    def __init__(self, seen: SeenRows) -> None:
        self._seen = seen

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._seen._inner, name)
        if name in SeenRows._READS:
            return value
        return _forgetting(self._seen, value)


def _forgetting(seen: SeenRows, value: Any) -> Any:
    if not callable(value):
        return value

    def call(*args: Any, **kwargs: Any) -> Any:
        seen.forget()
        try:
            return value(*args, **kwargs)
        finally:
            seen.forget()

    return call


def task_id_of(value: str | None) -> TaskId | None:
    return TaskId(value) if value is not None else None


__all__ = [
    "START",
    "Canned",
    "EngineClock",
    "Gate",
    "Json",
    "Kind",
    "Message",
    "Network",
    "Recording",
    "RefServer",
    "SeenRows",
    "ServerClock",
    "Stream",
    "VirtualLoop",
    "VirtualTime",
    "Write",
    "WriterJob",
    "canon",
    "kind_of",
    "message_key",
    "ref_server",
    "settle",
    "task_id_of",
    "without_rpc_ids",
]
