"""A throwaway PostgreSQL server for tests and benchmarks: ``initdb`` into a temporary folder, 127.0.0.1 only.

Never used by the service. It runs the binaries of the local PostgreSQL installation (which
``scripts/install-postgres.sh`` provides), as an unprivileged user when started by root (``initdb``
refuses root), and fails with the reason and the server's log when it cannot start: nothing is skipped.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from engine.errors import ClusterError
from engine.ledger import pg_client as pg
from engine.ledger.pg_client import sql

WANTED_MAJOR: Final = 15
"""The major version the project tests against; another one is used only when 15 is absent."""
_TOOLS: Final = ("initdb", "pg_ctl", "postgres")
_SUPERUSER: Final = "postgres"
_SETTINGS: Final = (
    "listen_addresses = '127.0.0.1'",
    "unix_socket_directories = ''",
    # A throwaway cluster: durability buys nothing here and costs seconds per test run.
    "fsync = off",
    "synchronous_commit = off",
    "full_page_writes = off",
    "max_connections = 300",
    "shared_buffers = 128MB",
    "max_locks_per_transaction = 256",
    "max_wal_size = 512MB",
    "log_min_messages = warning",
)


def _has_tools(folder: Path) -> bool:
    return all(os.access(folder / tool, os.X_OK) for tool in _TOOLS)


def _major(bindir: Path) -> int | None:
    try:
        out = subprocess.run(
            [str(bindir / "postgres"), "--version"], capture_output=True, text=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    # "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"
    for word in out.split():
        head = word.split(".")[0]
        if head.isdigit():
            return int(head)
    return None


def find_bindir() -> Path:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``, PostgreSQL 15 preferred.

    Looks at ``$FINALITY_PG_BINDIR``, then ``pg_config --bindir``, then Debian's
    ``/usr/lib/postgresql/*/bin``, then ``initdb`` on the PATH.

    Raises:
        ClusterError: no installation was found (run ``scripts/install-postgres.sh``).
    """
    candidates: list[Path] = []
    if env := os.environ.get("FINALITY_PG_BINDIR"):
        candidates.append(Path(env))
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=30
            ).stdout.strip()
            if out:
                candidates.append(Path(out))
    candidates.extend(Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True))
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    found = [c for c in dict.fromkeys(candidates) if _has_tools(c)]
    if not found:
        raise ClusterError(
            "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found; run `bash scripts/install-postgres.sh` "
            f"(looked in: {', '.join(str(c) for c in dict.fromkeys(candidates)) or 'nowhere'})"
        )
    for folder in found:
        if _major(folder) == WANTED_MAJOR:
            return folder
    return found[0]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_user() -> str | None:
    """Who runs ``initdb`` and ``postgres``: None for the current user, a system user when we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise ClusterError(
        "running as root, and neither a 'postgres' nor a 'nobody' user exists to run PostgreSQL"
    )


def _traversable_by_others(folder: Path) -> bool:
    for part in (folder, *folder.parents):
        with contextlib.suppress(OSError):
            if not part.stat().st_mode & stat.S_IXOTH:
                return False
    return True


def _base_folder(for_another_user: bool) -> Path:
    """Where the cluster's folder goes: memory-backed /dev/shm when there is room (a throwaway
    cluster gains nothing from a disk, and creating a database per test is I/O-bound), else the
    temporary folder. ``$FINALITY_PG_TMPDIR`` overrides both."""
    if env := os.environ.get("FINALITY_PG_TMPDIR"):
        return Path(env)
    shm = Path("/dev/shm")
    with contextlib.suppress(OSError):
        if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 2 * 1024**3:
            return shm
    base = Path(tempfile.gettempdir())
    if for_another_user and not _traversable_by_others(base):
        base = Path("/tmp")
    return base


@dataclass
class TemporaryPostgres:
    """One PostgreSQL server in a temporary folder; ``start`` it, ``url`` databases on it, ``stop`` it."""

    bindir: Path = field(default_factory=find_bindir)
    port: int = 0
    password: str = field(default_factory=lambda: secrets.token_hex(16))
    root: Path | None = None
    user: str | None = None
    _started: bool = False

    @property
    def data(self) -> Path:
        assert self.root is not None
        return self.root / "data"

    @property
    def log(self) -> Path:
        assert self.root is not None
        return self.root / "server.log"

    def _run(self, args: list[str], what: str) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.user is not None:
            runuser = shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin")
            if runuser is None:
                raise ClusterError(
                    "running as root and `runuser` is missing; cannot drop privileges for PostgreSQL"
                )
            command = [runuser, "-u", self.user, "--", *command]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=self.root)
        except (OSError, subprocess.SubprocessError) as exc:
            raise ClusterError(f"{what} failed to run: {exc}") from exc
        if done.returncode != 0:
            raise ClusterError(
                f"{what} failed (exit {done.returncode}): {done.stderr.strip() or done.stdout.strip()}"
                + self._log_tail()
            )

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            lines = self.log.read_text(errors="replace").splitlines()[-20:]
            if lines:
                return "\nserver log:\n" + "\n".join(lines)
        return ""

    def start(self) -> TemporaryPostgres:
        """``initdb`` a new cluster and start it on a free 127.0.0.1 port.

        Raises:
            ClusterError: the binaries are missing, ``initdb`` failed or the server did not start
                (whatever was made is removed again).
        """
        if self._started:
            return self
        try:
            self._initdb()
            self._launch()
            with pg.connect(self.url(), connect_timeout=30) as con:
                con.execute("SELECT 1")
        except pg.Error as exc:
            self.stop()
            raise ClusterError(f"PostgreSQL started but does not accept connections: {exc}") from exc
        except BaseException:
            self.stop()
            raise
        return self

    def _initdb(self) -> None:
        self.user = _server_user()
        self.root = Path(tempfile.mkdtemp(prefix="finality-pg-", dir=_base_folder(self.user is not None)))
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            for path in (self.root, pwfile):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self.root.chmod(0o700)
        try:
            self._run(
                [
                    "initdb",
                    "-D",
                    str(self.data),
                    "-U",
                    _SUPERUSER,
                    f"--pwfile={pwfile}",
                    "--auth=scram-sha-256",
                    "--encoding=UTF8",
                    "--no-locale",
                    "--no-sync",
                    "--no-instructions",
                ],
                "initdb",
            )
        finally:
            pwfile.unlink(missing_ok=True)
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# finality test cluster\n" + "\n".join(_SETTINGS) + "\n")

    def _launch(self) -> None:
        last: ClusterError | None = None
        for _ in range(5):
            self.port = free_port()
            try:
                self._run(
                    [
                        "pg_ctl",
                        "-D",
                        str(self.data),
                        "-l",
                        str(self.log),
                        "-w",
                        "-t",
                        "60",
                        "-o",
                        f"-p {self.port}",
                        "start",
                    ],
                    f"starting PostgreSQL ({self.bindir}) on 127.0.0.1:{self.port}",
                )
            except ClusterError as exc:
                # Another process took the free port between the probe and the bind: try another.
                if "could not bind" not in str(exc) and "already in use" not in str(exc):
                    raise
                last = exc
                continue
            self._started = True
            return
        raise last or ClusterError("PostgreSQL did not start")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{_SUPERUSER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create an empty database and return its URL."""
        with pg.connect(self.url(), autocommit=True) as con:
            con.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its folder."""
        if self._started:
            self._started = False
            with contextlib.suppress(ClusterError):
                self._run(
                    ["pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop"],
                    "stopping PostgreSQL",
                )
        self._discard()

    def _discard(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> TemporaryPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_shared: TemporaryPostgres | None = None
_shared_error: ClusterError | None = None
_shared_lock = threading.Lock()


def shared_cluster() -> TemporaryPostgres:
    """One server per process, started on first use and stopped when the process exits.

    Test suites in several folders share it (each test gets its own database on it).

    Raises:
        ClusterError: PostgreSQL could not be started; the message says why.
    """
    global _shared, _shared_error
    with _shared_lock:
        if _shared_error is not None:
            # Starting failed once in this process: say so again at once rather than retrying per test.
            raise ClusterError(str(_shared_error))
        if _shared is None:
            try:
                cluster = TemporaryPostgres().start()
            except ClusterError as exc:
                _shared_error = exc
                raise
            atexit.register(cluster.stop)
            _shared = cluster
        return _shared


__all__ = [
    "WANTED_MAJOR",
    "TemporaryPostgres",
    "find_bindir",
    "free_port",
    "shared_cluster",
]
