"""``service.testing.ServiceProcess``: the subprocess harness every integration test starts the service with."""

from __future__ import annotations

import gc
import socket
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

import service.testing
from engine.errors import ServiceProcessError
from service.testing import ServiceProcess


def test_a_service_without_a_given_port_binds_its_own_even_when_a_probed_port_is_taken(
    tmp_path: Path, write_config: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two CI workers once probed the same free port: the second service failed to bind it. A probe
    # that returns a port some other process holds must not matter, because the child binds its own.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(service.testing, "free_port", lambda: int(taken.getsockname()[1]))
        process = ServiceProcess(tmp_path / "ledger.duckdb", write_config(), startup_timeout=120)
        with process, process.client() as client:
            assert process.port not in (0, taken.getsockname()[1])
            assert client.health()["status"] == "ok"
    with pytest.raises(ServiceProcessError, match="not started"):
        _ = ServiceProcess(tmp_path / "other.duckdb", tmp_path / "finality.toml").url


def test_a_failed_start_raises_with_the_childs_stderr_and_leaves_no_file_open(tmp_path: Path) -> None:
    config = tmp_path / "finality.toml"
    config.write_text("this is [not toml\n")
    process = ServiceProcess(tmp_path / "ledger.duckdb", config, startup_timeout=120)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with pytest.raises(ServiceProcessError) as failed:
            process.start()
        message = str(failed.value)
        del process, failed  # the traceback holds the process too
        gc.collect()
    assert "toml" in message.lower() or "config" in message.lower()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
