"""A read's answer is encoded on the readers' pool, never on the loop that answers health and runs the executor.

In-process: the control API over a real DuckDB ledger, called through Starlette's test client; the
analyst reads are a stand-in whose answer records the thread that encodes it.
"""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import pyarrow as pa
from starlette.testclient import TestClient

from engine.clock import SystemClock
from engine.ledger.duckdb import Ledger
from service.api import build_api
from service.config import parse_config
from service.executor import Executor
from service.readers import ReaderPool


class _Encoded:
    """A value whose JSON form (``str``) notes the thread it is made on."""

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def __str__(self) -> str:
        self.seen.append(threading.current_thread().name)
        return "encoded"


class _Reads:
    snapshotting = False

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def query(self, query: str, max_rows: int) -> dict[str, object]:
        return {"columns": ["v"], "rows": [[_Encoded(self.seen)]], "truncated": False, "row_count": 1}

    def query_json(self, query: str, max_rows: int) -> bytes:
        return json.dumps(self.query(query, max_rows), default=str).encode()

    def arrow(self, query: str, max_rows: int) -> pa.Table:
        raise NotImplementedError

    def arrow_ipc(self, query: str, max_rows: int) -> bytes:
        raise NotImplementedError

    def reader_processes(self) -> list[dict[str, int]]:
        return []

    def publish(self) -> dict[str, object]:
        return {"name": _Encoded(self.seen)}

    def snapshots(self) -> list[dict[str, object]]:
        return []

    def snapshot_path(self, name: str) -> Path:
        raise NotImplementedError


def test_an_analyst_answer_and_a_snapshots_answer_are_encoded_on_a_reader_thread(tmp_path: Path) -> None:
    """POST /api/v1/sql and POST /api/v1/snapshots build their JSON on the readers' pool, not on the loop."""
    seen: list[str] = []
    ledger = Ledger.open(tmp_path / "ledger.duckdb")
    # A server the test never calls: the executor is not started, only the API is built over it.
    config = parse_config({"servers": {"mcp": {"url": "http://127.0.0.1:9", "protocol": "mcp-2025-11-25"}}})
    executor = Executor(ledger=ledger, config=config, clock=SystemClock(), rng=random.Random(0))
    readers = ReaderPool(workers=1, queue_limit=0)
    app = build_api(executor, ledger, sql=_Reads(seen), readers=readers)
    try:
        with TestClient(app) as client:
            answer = client.post("/api/v1/sql", json={"query": "SELECT 1"})
            made = client.post("/api/v1/snapshots")
    finally:
        readers.close()
        ledger.close()
    assert answer.status_code == 200, answer.text
    assert answer.json()["rows"] == [["encoded"]]
    assert made.status_code == 201, made.text
    assert made.json() == {"name": "encoded"}
    assert len(seen) == 2
    assert all(name.startswith("finality-reader") for name in seen), seen
