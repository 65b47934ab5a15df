"""``ServiceProcess``: run ``finality serve`` as a subprocess for integration tests, demos and benchmarks.

Starts the service on a free loopback port, waits (bounded, in the child's own time rather than wall
time on a loaded machine) for its ``READY`` line, and stops it
with SIGTERM, or SIGKILL to test crash recovery. Not used by the service itself. Its bounded wait for
a condition (``wait_until``) is ``engine.testing.wait``'s, named here for the suites that start a service.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from engine.errors import ServiceProcessError
from engine.testing.wait import wait_until
from refserver.testing import RefServer, StartupFailed, read_ready_line
from service.client import ServiceClient

_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServiceProcess:
    """``finality serve --ledger L --config C`` on 127.0.0.1 (``L`` a DuckDB path or a PostgreSQL URL)."""

    def __init__(
        self,
        ledger: str | Path,
        config: str | Path,
        *,
        port: int | None = None,
        seed: int = 0,
        startup_timeout: float = 30.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.ledger: str | Path = ledger if "://" in str(ledger) else Path(ledger)
        self.config = Path(config)
        self.port = port or 0
        """The port asked for; 0 until the first start when none was given: the child binds port 0
        itself and its READY line names the port, so no other process can take it between a probe
        and the bind (a probed free port raced other workers' servers in CI). A restart reuses it."""
        self.seed = seed
        self.startup_timeout = startup_timeout
        self.extra_args = list(extra_args)
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self.pid: int | None = None
        """The last started process's id (kept after it ends: leases name their owner by it)."""

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``; known once the process has started (or when a port was given)."""
        if not self.port:
            raise ServiceProcessError("the service has not started yet: its port is chosen when it binds")
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        if self._stderr is not None:  # started again after a stop or a kill: a fresh capture
            self._stderr.close()
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "service",
                "serve",
                "--ledger",
                str(self.ledger),
                "--config",
                str(self.config),
                "--port",
                str(self.port),
                "--seed",
                str(self.seed),
                *self.extra_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
        )
        self.pid = self._process.pid
        try:
            self._wait_ready()
        except BaseException:
            # close() may never run (a failed __enter__ has no __exit__): release the capture here,
            # or it is collected later as an unclosed file inside some other test.
            self.kill()
            self.close()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self._process is not None
        try:
            url = read_ready_line(self._process, timedelta(seconds=self.startup_timeout))
        except StartupFailed as exc:
            raise ServiceProcessError(f"{exc}:\n{self.stderr()}") from None
        self.port = int(url.rsplit(":", 1)[1])

    def client(self, token: str | None = None) -> ServiceClient:
        """A client of this service presenting ``token`` (None: ``FINALITY_TOKEN``, if set)."""
        return ServiceClient(self.url, timeout=30.0, token=token)

    def stderr(self, limit: int = 6000) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-limit:]

    def returncode(self) -> int | None:
        """The process's exit status once it has exited (None while it runs or before ``start``)."""
        return None if self._process is None else self._process.poll()

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, exactly like a crash."""
        self._end(signal.SIGKILL)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; the exit status (None if it was not running)."""
        return self._end(signal.SIGTERM, timeout)

    def _end(self, sig: signal.Signals, timeout: float = 10.0) -> int | None:
        process, self._process = self._process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=timeout)
        if process.stdout is not None:
            process.stdout.close()
        return process.returncode

    def close(self) -> None:
        """Stop the process if running, and release its captured stderr."""
        self.stop()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def start_all(processes: Sequence[ServiceProcess]) -> None:
    """Start several services on one ledger at once (their start-ups overlap: a migration is run by
    one of them under the ledger's lock). If any fails to start, every one is stopped and the first
    error is raised."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, len(processes))) as pool:
        futures = [pool.submit(p.start) for p in processes]
    errors = [e for f in futures if (e := f.exception()) is not None]
    if errors:
        for process in processes:
            process.close()
        raise errors[0]


def all_terminal(client: ServiceClient, call_nodes: list[str]) -> bool:
    """Every call node's operation holds a receipt."""
    return all(client.show(node)["terminal"] for node in call_nodes)


def config_text(
    servers: Mapping[str, RefServer], *, global_qps: float = 100, extra: str = "", top: str = ""
) -> str:
    """A service config over reference servers named ``mcp`` (2025-11-25), ``aip`` and ``ext`` (2026-07-28).

    ``top`` adds top-level keys; ``extra`` is appended after the last table.
    """
    return f"""
global_qps = {global_qps}
rollout_salt = "test"
{top}

[poll]
default_interval_ms = 100
min_interval_ms = 20
max_interval_ms = 500
retry_backoff_ms = 50

[servers.mcp]
url = "{servers["mcp"].endpoint}"
protocol = "mcp-2025-11-25"
qps = 200

[servers.aip]
url = "{servers["aip"].url}"
protocol = "aip-151"
qps = 200
request_id_dedupe = {"true" if servers["aip"].dedupes_request_id else "false"}

[servers.ext]
url = "{servers["ext"].endpoint}"
protocol = "mcp-2026-07-28"
qps = 200

[tools.generate_report]
server = "mcp"
side_effect_free = true

[tools.analyze_upload]
server = "aip"
side_effect_free = true

[tools.apply_batch_change]
server = "ext"
{extra}
"""


def service_in(
    folder: Path, servers: Mapping[str, RefServer], *, startup_timeout: float = 30.0
) -> ServiceProcess:
    """A service (not started yet) with its config and a fresh ledger in ``folder``, over ``servers``:
    what a test module shares when each of its tests uses call nodes of its own."""
    config = folder / "finality.toml"
    config.write_text(config_text(servers))
    return ServiceProcess(folder / "ledger.duckdb", config, startup_timeout=startup_timeout)


__all__ = [
    "ServiceProcess",
    "all_terminal",
    "config_text",
    "free_port",
    "service_in",
    "start_all",
    "wait_until",
]
