"""A person's reconciliation names a server task in the protocol's one spelling: a bare AIP-151 id is the
operation's full name, the operation keeps its one binding, and the duplicate_operations gate stays 0."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.errors import ServiceRefused
from refserver.testing import RefServer
from service.client import ServiceClient
from service.testing import ServiceProcess, wait_until

# Over before the first poll, kept on the server for the whole test; the result echoes an old epoch,
# so the operation ends UNKNOWN, bound to its task, waiting for a person.
STALE = {"duration_ms": 200, "ttl_ms": 10_000_000, "faults": ["stale_epoch_result"]}


@pytest.fixture
def service(
    tmp_path: Path, write_config: Callable[..., Path], servers: dict[str, RefServer]
) -> Iterator[ServiceProcess]:
    for server in servers.values():
        server.reset()
    with ServiceProcess(tmp_path / "ledger.duckdb", write_config()) as svc:
        yield svc


def _unknown_entry(client: ServiceClient, node: str) -> dict[str, Any] | None:
    op = client.show(node)
    if op["state"] != "UNKNOWN":
        return None
    for entry in client.reconciliation():
        if entry["operation_id"] == op["operation_id"] and entry["kind"] == "unknown":
            return entry
    return None


def _bindings(client: ServiceClient, operation_id: str) -> list[str]:
    result = client.sql(f"SELECT task_id FROM task_bindings WHERE operation_id = '{operation_id}'")
    return [str(row[0]) for row in result["rows"]]


def test_a_bare_aip_id_resolves_to_the_task_already_bound_and_is_no_second_operation(
    service: ServiceProcess,
) -> None:
    """Resolving with ``AuLeh...`` for an operation bound to ``operations/AuLeh...`` keeps one binding;
    duplicate_operations counts 0."""
    with service.client() as client:
        client.submit(call_node="u1", tool="analyze_upload", arguments={"_sim": STALE})
        wait_until(lambda: _unknown_entry(client, "u1") is not None, what="UNKNOWN with an open entry")
        entry = _unknown_entry(client, "u1")
        assert entry is not None
        op = client.show("u1")
        full = str(op["task_id"])
        assert full.startswith("operations/")
        bare = full.removeprefix("operations/")
        client.resolve(int(entry["entry_id"]), actor="ops", reason="found it", task_id=bare, absent=False)
        assert client.show("u1")["task_id"] == full
        assert _bindings(client, str(op["operation_id"])) == [full]
        gates = {g["gate"]: g for g in client.gates()["gates"]}
    assert gates["duplicate_operations"]["value"] == 0
    assert gates["duplicate_operations"]["passed"]


def test_resolving_a_bound_operation_to_another_task_is_refused_with_409(service: ServiceProcess) -> None:
    """An operation bound to one server task is never bound to a second one by a person."""
    with service.client() as client:
        client.submit(call_node="u2", tool="analyze_upload", arguments={"_sim": STALE})
        wait_until(lambda: _unknown_entry(client, "u2") is not None, what="UNKNOWN with an open entry")
        entry = _unknown_entry(client, "u2")
        assert entry is not None
        op = client.show("u2")
        with pytest.raises(ServiceRefused, match="names another task") as refused:
            client.resolve(
                int(entry["entry_id"]), actor="ops", reason="wrong one", task_id="someone-else", absent=False
            )
        assert refused.value.status == 409
        assert client.show("u2")["state"] == "UNKNOWN"
        assert _bindings(client, str(op["operation_id"])) == [str(op["task_id"])]
