"""Analyst SQL in reader processes of their own: the service only forwards a query and the answer's bytes.

A DuckDB analyst query (``POST /api/v1/sql``, ``/api/v1/sql/arrow``; the console's charts arrive
the same way) runs in a child process of ``finality serve`` (``python -m service.reader_process``)
over the service's private snapshot, in the sandbox (``engine.ledger.sandbox``) with its limits:
time, memory, threads, rows, and here also the answer's size in bytes. The child encodes the
answer (JSON, or an Arrow IPC stream) and sends it back whole; the service's reader thread passes
those bytes on unread. Why a process and not only a niced thread: threads share the interpreter's
lock with the loop that sends polls and cancels, and niceness orders threads on the cores, not on
that lock: a reader at nice 19 that the kernel preempts while it holds the lock (parsing, attaching,
converting rows) makes the loop wait for it at nice 19's share of a core. A child holds a lock of
its own. The child runs at the readers' niceness, in the service's session (its scheduling group:
a session of its own would be a group of its own and get a core's fair share beside the service);
at 19, the lowest, also in the idle scheduling class, which any other wakeup preempts at once (a
nice-19 task that holds a core keeps it to the end of its slice, and cancels waited for that).

``ReaderProcesses`` is a small fixed pool, one child per reader worker thread, each started on its
first query (a service nobody queries starts none) and started afresh after it dies: a child that
ends mid-query answers its caller with ``ReaderLost`` (503, Retry-After) naming the signal, and the
next query gets a new child. ``close`` ends them all (the service calls it on shutdown); a child
whose service died reads end-of-file on its input and exits.

Frames on the child's stdin and stdout: a 4-byte big-endian length, then the bytes. A request is
JSON; a reply is one kind byte (``J`` JSON answer, ``A`` Arrow stream, ``E`` a refusal as JSON)
and the body. Holds no rules about what a query may do: the sandbox owns them.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from queue import LifoQueue
from typing import IO

from engine.clock import monotonic_seconds
from engine.errors import SqlRefused
from engine.priority import lower
from service.readers import ReadersBusy

_LENGTH = struct.Struct(">I")
_GRACE_S = 60.0
"""How long past its query's time limit a child may take to answer before it is ended (a safety
net for a child that hangs): its own timer stops the query at the limit, but at nice 19 on a
loaded machine it may wait long for a CPU (at a load of 13 on 2 cores, more than 10 s)."""
_START_TIMEOUT_S = 120.0
MB = 1 << 20


class ReaderLost(ReadersBusy):
    """The reader process running the query ended before answering; a new one takes the next query."""


def capped(answer: bytes, most: int) -> bytes:
    """``answer`` if it is at most ``most`` bytes (the result-size limit).

    Raises:
        SqlRefused: naming the limit.
    """
    if len(answer) > most:
        raise SqlRefused(
            f"the answer is {len(answer) / MB:,.1f} MB, over the service's result-size limit of "
            f"{most / MB:g} MB ([analyst] max_result_mb); select fewer columns or rows, or aggregate"
        )
    return answer


def _frame(body: bytes) -> bytes:
    return _LENGTH.pack(len(body)) + body


class _Child:
    """One reader process and the pipes to it; used by one thread at a time."""

    def __init__(self, nice: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.reader_process", str(nice)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self._in: IO[bytes] = self.proc.stdin
        self._out = self.proc.stdout.fileno()
        ready = json.loads(self._read(monotonic_seconds() + _START_TIMEOUT_S, 1 << 16, "start"))
        self.pid = int(ready["pid"])
        self.nice = int(ready["nice"])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def call(self, request: dict[str, object], limit_s: float, max_bytes: int) -> tuple[str, bytes]:
        """Send a request whose query's time limit is ``limit_s``; wait for the reply up to ``_GRACE_S`` longer."""
        try:
            self._in.write(_frame(json.dumps(request).encode()))
            self._in.flush()
        except OSError:
            raise self._lost() from None
        reply = self._read(monotonic_seconds() + limit_s + _GRACE_S, max_bytes + 4096, "query")
        return reply[:1].decode(), reply[1:]

    def _read(self, deadline: float, most: int, what: str) -> bytes:
        head = self._exact(_LENGTH.size, deadline, what)
        (length,) = _LENGTH.unpack(head)
        if length > most:
            self.end()
            raise SqlRefused(
                f"the reader process sent {length:,} bytes, over the result-size limit; it was ended"
            )
        return self._exact(length, deadline, what)

    def _exact(self, n: int, deadline: float, what: str) -> bytes:
        chunks: list[bytes] = []
        left = n
        while left:
            remaining = deadline - monotonic_seconds()
            if remaining <= 0:
                self.end()
                if what == "start":
                    raise ReaderLost(
                        f"the reader process did not start within {_START_TIMEOUT_S:g} s", retry_after_s=2
                    )
                raise SqlRefused(
                    "query stopped: its reader process did not answer within the time limit for one "
                    f"query plus {_GRACE_S:g} s, and was ended"
                )
            ready, _, _ = select.select([self._out], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self._out, min(left, 1 << 20))
            if not chunk:
                raise self._lost()
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _lost(self) -> ReaderLost:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.end()
            code = self.proc.returncode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
        self.end()
        return ReaderLost(
            f"the reader process (pid {self.pid if hasattr(self, 'pid') else self.proc.pid}) ended "
            f"before answering this query ({how}); the query was not answered; a new reader process "
            "takes the next one",
            retry_after_s=1,
        )

    def end(self) -> None:
        """Stop the child (closing its input asks it to exit; it is killed if it does not)."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self._in.close()
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class ReaderProcesses:
    """``size`` reader processes at niceness ``nice``, each started on first use and after it dies."""

    def __init__(self, size: int, nice: int = 19) -> None:
        if size < 1:
            raise ValueError("at least one reader process")
        self.size = size
        self.nice = nice
        self._idle: LifoQueue[_Child | None] = LifoQueue()
        for _ in range(size):
            self._idle.put(None)
        self._lock = threading.Lock()
        self._children: dict[int, _Child] = {}
        self._closed = False

    def call(self, request: dict[str, object], limit_s: float, max_bytes: int) -> tuple[str, bytes]:
        """Send one request (its query's time limit ``limit_s``) to a free reader process; its reply's
        kind and body (blocks: a reader thread's).

        Raises:
            ReaderLost: the process ended before answering (or could not start).
            SqlRefused: it did not answer within ``limit_s`` plus ``_GRACE_S``, or answered more than
                ``max_bytes``.
        """
        child = self._idle.get(timeout=limit_s + _GRACE_S + _START_TIMEOUT_S)
        try:
            if child is None or not child.alive():
                child = self._start()
            try:
                return child.call(request, limit_s, max_bytes)
            except (ReaderLost, SqlRefused):
                if not child.alive():
                    self._forget(child)
                    child = None
                raise
        finally:
            self._idle.put(child)

    def _start(self) -> _Child:
        with self._lock:
            if self._closed:
                raise ReaderLost("the service is stopping", retry_after_s=2)
        child = _Child(self.nice)
        with self._lock:
            self._children[child.pid] = child
            closed = self._closed
        if closed:
            child.end()
            raise ReaderLost("the service is stopping", retry_after_s=2)
        return child

    def _forget(self, child: _Child) -> None:
        with self._lock:
            self._children.pop(child.pid, None)

    def processes(self) -> list[dict[str, int]]:
        """The live reader processes: pid and niceness (for health)."""
        with self._lock:
            children = list(self._children.values())
        return [{"pid": c.pid, "nice": c.nice} for c in children if c.alive()]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            children = list(self._children.values())
            self._children.clear()
        for child in children:
            child.end()


# ----------------------------------------------------------------------------------- the child


def _child(nice: int, read: Callable[[int], bytes], write: Callable[[bytes], object]) -> None:
    # Lowered before the imports: a reader's start (about a CPU-second of imports) is a reader's
    # cost too, not the executor's. Where the platform refuses, the reader runs at the service's
    # priority (health says so).
    lower(0, nice)
    import engine.ledger.sandbox  # noqa: F401

    # Ctrl-C in a terminal reaches the whole process group: the service ends its readers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def send(body: bytes) -> None:
        write(_frame(body))

    def exact(n: int) -> bytes | None:
        chunks: list[bytes] = []
        while n:
            chunk = read(n)
            if not chunk:
                return None
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    send(json.dumps({"pid": os.getpid(), "nice": os.getpriority(os.PRIO_PROCESS, 0)}).encode())
    while True:
        head = exact(_LENGTH.size)
        if head is None:
            return  # the service closed our input: it is stopping, or gone
        body = exact(_LENGTH.unpack(head)[0])
        if body is None:
            return
        try:
            kind, answer = _answer(json.loads(body))
        except SqlRefused as exc:
            kind, answer = "E", json.dumps({"message": str(exc)}).encode()
        except Exception as exc:  # one bad query must not end the reader
            kind, answer = "E", json.dumps({"message": f"query failed in the reader process: {exc}"}).encode()
        send(kind.encode() + answer)


def _answer(request: dict[str, object]) -> tuple[str, bytes]:
    """Run one request in the sandbox; the answer's kind and bytes, refused past ``max_bytes``."""
    from engine.ledger.sandbox import SandboxLimits, arrow_stream_bytes, run_arrow, run_query

    def whole(key: str) -> int:
        value = request[key]
        assert isinstance(value, int)
        return value

    timeout_s = request["timeout_s"]
    assert isinstance(timeout_s, int | float)
    limits = SandboxLimits(memory_limit_mb=whole("memory_limit_mb"), threads=whole("threads"))
    path, query = str(request["path"]), str(request["query"])
    timeout = timedelta(seconds=timeout_s)
    # The snapshot is replaced by rename: the sandbox may stay attached while it is the same file.
    if request["op"] == "arrow":
        table = run_arrow(
            path, query, max_rows=whole("max_rows"), timeout=timeout, keep_open=True, limits=limits
        )
        kind, answer = "A", arrow_stream_bytes(table)
    else:
        result = run_query(
            path, query, max_rows=whole("max_rows"), timeout=timeout, keep_open=True, limits=limits
        )
        extra = request.get("extra")
        kind, answer = "J", result.json_bytes(**(extra if isinstance(extra, dict) else {}))
    return kind, capped(answer, whole("max_bytes"))


def main(argv: list[str]) -> int:
    nice = int(argv[0]) if argv else 19
    # The frames go on a private copy of stdout; anything printed (a library's warning) goes to stderr.
    stdin, stdout = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(stdout, view) :]

    _child(nice, lambda n: os.read(stdin, min(n, 1 << 20)), write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


__all__ = ["MB", "ReaderLost", "ReaderProcesses", "capped"]
