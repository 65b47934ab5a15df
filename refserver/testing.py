"""``RefServer``: start a reference server as a subprocess for an integration test, and stop it after.

Example::

    from refserver.testing import RefServer

    with RefServer("mcp-2025-11-25", time_scale=0.01) as server:
        ...  # talk to server.endpoint ("http://127.0.0.1:PORT/mcp") with your client
        assert server.stats()["operations_created"]["total"] == 1

Use ``async with`` inside async tests (start and stop then run in a worker thread). Admin calls
(``stats``, ``set_faults``, ``reset``) are short blocking requests to loopback and are fine in async
tests too. Every wait here is bounded; a server that does not print ``READY`` in time is killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from refserver.clock import SystemClock

_CLOCK = SystemClock()  # the start-up budget is counted on the monotonic clock

PROTOCOLS = ("mcp-2025-11-25", "mcp-2026-07-28", "aip-151")
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent


class StartupFailed(RuntimeError):
    """A child did not print its ``READY`` line: it exited, printed something else, or took too long."""


class StartupTimeout(StartupFailed, TimeoutError):
    """The child's start budget (or the wall-time ceiling) was spent before its first line."""


STARVED_CEILING = 10
"""However starved a child is of CPU, its start fails after this many times its budget of wall time."""


def run_queue_wait_s(pid: int) -> float:
    """Seconds process ``pid``'s main thread spent runnable but waiting for a CPU (Linux schedstat).

    0.0 where the kernel does not say (another OS, or the process is gone): the caller then falls
    back to plain wall time.
    """
    try:
        with open(f"/proc/{pid}/schedstat", encoding="ascii") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def read_ready_line(
    process: subprocess.Popen[bytes],
    budget: timedelta,
    *,
    run_queue_wait: Callable[[int], float] = run_queue_wait_s,
) -> str:
    """The text after ``READY `` on ``process``'s first stdout line, within ``budget`` of its own time.

    A start is charged the wall time that passed minus the time the child sat in the run queue: on
    a loaded machine a child that is merely waiting for a CPU is not failing to start, while one that
    is stuck (a lock, a hung connection, a loop printing nothing) still fails after ``budget``.
    ``STARVED_CEILING`` times the budget of wall time ends even a child starved of CPU forever.
    ``run_queue_wait`` reads the run-queue time of a pid (tests pass their own).

    Raises:
        StartupTimeout: the budget (or the ceiling) was spent before a line came.
        StartupFailed: stdout closed first (the process exited), or the line is not ``READY ...``.
    """
    assert process.stdout is not None
    budget_s = budget.total_seconds()
    started = _CLOCK.monotonic()
    queued_before = run_queue_wait(process.pid)
    buffer = b""
    fd = process.stdout.fileno()
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while b"\n" not in buffer:
            waited = _CLOCK.monotonic() - started
            charged = waited - max(0.0, run_queue_wait(process.pid) - queued_before)
            if charged >= budget_s or waited >= STARVED_CEILING * budget_s:
                raise StartupTimeout(
                    f"no READY line within {budget_s:g} s of its own time ({waited:.1f} s of wall time)"
                )
            # Look again at least every second: the run-queue credit is only known by asking.
            if not selector.select(min(budget_s - charged, 1.0)):
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                raise StartupFailed("the process exited before READY")
            buffer += chunk
    line = buffer.split(b"\n", 1)[0].decode(errors="replace").strip()
    if not line.startswith("READY "):
        raise StartupFailed(f"unexpected first line {line!r}")
    return line.removeprefix("READY ").strip()


class RefServerError(RuntimeError):
    """The server did not start, or an admin call failed."""


class RefServer:
    """A reference server subprocess on a free loopback port.

    Args:
        protocol: ``"mcp-2025-11-25"``, ``"mcp-2026-07-28"`` or ``"aip-151"``.
        time_scale: multiplier for every ``_sim`` duration (0.01 makes the 2 s default take 20 ms).
        seed: seed for fault plans and interval jitter.
        idempotency: MCP only: advertise and honour ``idempotencyKey``.
        elicitation_id: MCP 2025-11-25 only: send every elicitation under this one JSON-RPC id.
        no_cancel: MCP 2025-11-25 only: declare no ``tasks.cancel`` and refuse ``tasks/cancel``.
        ignore_request_id: AIP-151 only: accept ``request_id`` and ignore it (no deduplication).
        tokens: bearer token -> principal; when given, every request needs a token.
        fault_plan: initial plan, ``{"seed": 1, "rules": [...]}``; also restored by ``reset()``.
        page_size: page size of task/operation listings.
        startup_timeout: how long to wait for the ``READY`` line, not counting time the server spent
            waiting for a CPU (see ``read_ready_line``).
        stop_timeout: how long ``stop`` waits after SIGTERM before SIGKILL.
    """

    def __init__(
        self,
        protocol: str,
        *,
        time_scale: float = 1.0,
        seed: int = 0,
        idempotency: bool = False,
        elicitation_id: int | str | None = None,
        no_cancel: bool = False,
        ignore_request_id: bool = False,
        tokens: Mapping[str, str] | None = None,
        fault_plan: Mapping[str, Any] | None = None,
        page_size: int | None = None,
        startup_timeout: timedelta = timedelta(seconds=20),
        stop_timeout: timedelta = timedelta(seconds=5),
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}; got {protocol!r}")
        self.protocol = protocol
        self._args = [
            "--protocol",
            protocol,
            "--port",
            "0",
            "--time-scale",
            repr(time_scale),
            "--seed",
            str(seed),
        ]
        if idempotency:
            self._args.append("--idempotency")
        self.dedupes_request_id = protocol == "aip-151" and not ignore_request_id
        """Whether this server deduplicates AIP-155 ``request_id`` (AIP-151 unless told to ignore it)."""
        if ignore_request_id:
            self._args.append("--ignore-request-id")
        if no_cancel:
            self._args.append("--no-cancel")
        if elicitation_id is not None:
            self._args += ["--elicitation-id", str(elicitation_id)]
        for token, principal in (tokens or {}).items():
            self._args += ["--token", f"{token}={principal}"]
        if page_size is not None:
            self._args += ["--page-size", str(page_size)]
        self._fault_plan = dict(fault_plan) if fault_plan is not None else None
        self._startup_timeout = startup_timeout
        self._stop_timeout = stop_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._plan_path: Path | None = None
        self._url: str | None = None

    # -- addresses ---------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs (benchmarks read its CPU time)."""
        return self._process.pid if self._process is not None else None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:41234``."""
        if self._url is None:
            raise RefServerError("the server is not running; use it as a context manager or call start()")
        return self._url

    @property
    def endpoint(self) -> str:
        """Where the protocol lives: ``{url}/mcp`` for MCP, ``{url}/v1`` for AIP-151."""
        return f"{self.url}/v1" if self.protocol == "aip-151" else f"{self.url}/mcp"

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the subprocess and wait for its READY line.

        Raises:
            RefServerError: it exited or stayed silent past ``startup_timeout`` (stderr is quoted).
        """
        if self._process is not None:
            raise RefServerError("already started")
        args = list(self._args)
        if self._fault_plan is not None:
            handle, name = tempfile.mkstemp(prefix="refserver-plan-", suffix=".json")
            with os.fdopen(handle, "w", encoding="utf-8") as plan_file:
                json.dump(self._fault_plan, plan_file)
            self._plan_path = Path(name)
            args += ["--fault-plan", name]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        # Lives as long as the subprocess; closed in stop().
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._process = subprocess.Popen(
            [sys.executable, "-m", "refserver", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
        )
        try:
            self._url = self._read_ready()
        except BaseException:
            self.stop()
            raise

    def _read_ready(self) -> str:
        if self._process is None:
            raise RefServerError("not started")
        try:
            return read_ready_line(self._process, self._startup_timeout)
        except StartupFailed as exc:
            raise RefServerError(f"{exc}; stderr:\n{self._stderr_tail()}") from None

    def _stderr_tail(self, limit: int = 4000) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-limit:]

    def stop(self) -> None:
        """Terminate the subprocess (SIGKILL after ``stop_timeout``) and clean up; safe to call twice."""
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=self._stop_timeout.total_seconds())
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=self._stop_timeout.total_seconds())
            if process.stdout is not None:
                process.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self._plan_path is not None:
            self._plan_path.unlink(missing_ok=True)
            self._plan_path = None
        self._url = None

    def stderr(self) -> str:
        """What the server logged so far (for failure messages)."""
        return self._stderr_tail(limit=100_000)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)

    # -- admin -------------------------------------------------------------------------------------

    def _admin(self, method: str, path: str, body: object = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise RefServerError(f"{method} {path} answered {exc.code}: {detail}") from exc
        except OSError as exc:
            raise RefServerError(f"{method} {path} failed: {exc}") from exc

    def stats(self) -> dict[str, Any]:
        """Server-side counters: ``operations_created``, ``tasks``, ``requests``, ``executions``,
        ``faults_fired``, ``stale_answers`` and ``fault_plan``."""
        result: dict[str, Any] = self._admin("GET", "/admin/stats")
        return result

    def counts(self) -> dict[str, Any]:
        """``operations_created`` and ``requests`` alone: cheap however many tasks the server holds."""
        result: dict[str, Any] = self._admin("GET", "/admin/counts")
        return result

    def set_faults(self, rules: Sequence[Mapping[str, Any]], *, seed: int | None = None) -> None:
        """Replace the fault plan; each rule is ``{"fault", "tool", "rate" | "count", "params"}``.

        Raises:
            RefServerError: the server refused the plan (the message says why).
        """
        plan: dict[str, Any] = {"rules": [dict(rule) for rule in rules]}
        if seed is not None:
            plan["seed"] = seed
        self._admin("POST", "/admin/faults", plan)

    def reset(self) -> None:
        """Forget all tasks, executions and counters; restore the initial fault plan."""
        self._admin("POST", "/admin/reset", {})


__all__ = [
    "PROTOCOLS",
    "RefServer",
    "RefServerError",
    "StartupFailed",
    "StartupTimeout",
    "read_ready_line",
    "run_queue_wait_s",
]
