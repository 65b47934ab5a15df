"""What ``finality serve`` and the ``finality`` commands load on a DuckDB ledger: never psycopg, pandas, plotly.

Each costs CPU at every start (a restart after a crash included) for code these processes never run
on that ledger: psycopg is the PostgreSQL ledger's driver; pandas came in through pyarrow's probe
for pandas objects (``engine.arrow``); plotly is the console's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from refserver.testing import RefServer
from service.testing import ServiceProcess, all_terminal, service_in, wait_until

NOT_LOADED = ("psycopg", "psycopg_binary", "psycopg_pool", "pandas", "plotly")
"""Top-level packages no process on a DuckDB ledger imports."""


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, servers: dict[str, RefServer]
) -> Iterator[ServiceProcess]:
    with service_in(tmp_path_factory.mktemp("imports"), servers, startup_timeout=120) as svc:
        yield svc


def mapped_packages(pid: int) -> set[str]:
    """The installed packages whose files (extension modules, bundled libraries) ``pid`` has mapped."""
    found: set[str] = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        parts = Path(fields[5]).parts if len(fields) == 6 else ()
        if "site-packages" in parts and parts[-1] != "site-packages":
            # pandas/_libs/..., psycopg_binary.libs/..., _duckdb.cpython-311-....so: the package's name
            found.add(parts[parts.index("site-packages") + 1].split(".")[0].lstrip("_"))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/maps")
def test_a_duckdb_service_maps_no_part_of_psycopg_or_pandas_while_serving_calls(
    service: ServiceProcess,
) -> None:
    """After calls on the three protocols and an analyst query, neither psycopg's nor pandas' compiled
    modules are loaded in the service (pyarrow's and DuckDB's are: the map is read)."""
    nodes = ["imports-mcp", "imports-aip", "imports-ext"]
    with service.client() as client:
        for node, tool in zip(
            nodes, ("generate_report", "analyze_upload", "apply_batch_change"), strict=True
        ):
            client.submit(call_node=node, tool=tool, arguments={})
        wait_until(lambda: all_terminal(client, nodes), what="the three calls terminal")
        assert client.sql("SELECT count(*) AS n FROM receipts")["rows"] == [[3]]
    assert service.pid is not None
    loaded = mapped_packages(service.pid)
    assert {"pyarrow", "duckdb"} <= loaded
    assert loaded.isdisjoint(NOT_LOADED), sorted(loaded.intersection(NOT_LOADED))


def test_a_finality_command_on_a_duckdb_ledger_imports_none_of_them(tmp_path: Path) -> None:
    """``finality gates --ledger FILE`` (creates the ledger, evaluates, records a run) in a fresh
    interpreter: psycopg, pandas and plotly are not in its ``sys.modules``."""
    probe = (
        "import json, sys\n"
        "from service.cli import main\n"
        f"code = main(['gates', '--ledger', {str(tmp_path / 'ledger.duckdb')!r}, '--json'])\n"
        f"print(json.dumps([code, sorted(m for m in sys.modules if m.partition('.')[0] in {NOT_LOADED!r})]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    code, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert code in (0, 1), done.stderr  # the gates ran (a fresh ledger may fail some)
    assert loaded == []


def test_pyarrow_converts_without_pandas_once_its_probe_is_skipped_and_to_pandas_still_works() -> None:
    """After ``skip_pandas_probe``, building arrays and tables (ints, strings, instants, durations)
    imports no pandas; ``Table.to_pandas`` still imports it when asked."""
    probe = (
        "import sys\n"
        "from datetime import UTC, datetime, timedelta\n"
        "from engine.arrow import skip_pandas_probe\n"
        "skip_pandas_probe()\n"
        "import pyarrow as pa\n"
        "table = pa.Table.from_pylist([{'n': 1, 's': 'x', 't': datetime.now(UTC), 'd': timedelta(1)}])\n"
        "pa.array([1, None]); pa.table({'a': ['b', None]})\n"
        "before = 'pandas' in sys.modules\n"
        "frame = table.to_pandas()\n"
        "print(before, type(frame).__name__, len(frame))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.stdout.split() == ["False", "DataFrame", "1"], done.stderr
