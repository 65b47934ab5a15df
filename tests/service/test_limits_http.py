"""Size limits, identifier rules and per-principal limits of the control API, over real HTTP."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import http_kit
import pytest

from engine.errors import ConfigError, ServiceRefused, TooMany
from engine.ledger.duckdb import Ledger
from engine.limits import RULES
from refserver.testing import RefServer
from service.config import LimitsConfig, parse_config
from service.guard import PrincipalLimiter
from service.testing import ServiceProcess, wait_until

LIMITS = """
[limits]
answer_bytes = 2048
"""


@pytest.fixture
def service(
    tmp_path: Path, write_config: Callable[..., Path], servers: dict[str, RefServer]
) -> Iterator[ServiceProcess]:
    for server in servers.values():
        server.reset()
    extra = "max_argument_bytes = 1000\n"  # appended under [tools.apply_batch_change]
    with ServiceProcess(
        tmp_path / "ledger.duckdb", write_config(extra=extra + LIMITS), startup_timeout=120
    ) as svc:
        yield svc


def _post(service: ServiceProcess, path: str, body: object | bytes) -> http_kit.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http_kit.post(
        f"{service.url}{path}", content=content, headers={"content-type": "application/json"}, timeout=60
    )


def _stored_operations(service: ServiceProcess) -> int:
    with service.client() as client:
        return len(client.operations(limit=10_000))


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_body_over_the_limit_is_refused_with_413_naming_it_and_nothing_is_stored(
    service: ServiceProcess,
) -> None:
    """A 3 MiB submission is refused (413 naming 1048576 bytes) and the ledger holds no operation."""
    arguments = {"blob": "x" * (3 << 20)}
    response = _post(
        service, "/api/v1/calls", {"call_node": "big", "tool": "generate_report", "arguments": arguments}
    )
    assert response.status_code == 413
    assert "1048576 bytes (1 MiB)" in response.json()["error"]
    assert _stored_operations(service) == 0


def test_every_body_route_holds_the_body_limit(service: ServiceProcess) -> None:
    """Cancels, answers, resolutions, rollout actions and SQL refuse an oversized body with 413."""
    big = {"actor": "alice", "reason": "r" * (2 << 20)}
    for path in (
        "/api/v1/operations/x/cancel",
        "/api/v1/operations/x/resubmit",
        "/api/v1/approvals/op/1",
        "/api/v1/reconciliation/1/resolve",
        "/api/v1/rollout/rollback",
        "/api/v1/sql",
    ):
        response = _post(service, path, big)
        assert response.status_code == 413, path
        assert "limit of 1048576 bytes" in response.json()["error"], path


def test_a_tool_argument_limit_is_refused_with_413_naming_the_tool(service: ServiceProcess) -> None:
    """apply_batch_change takes at most 1000 bytes of arguments; 1100 is refused naming tool and limit."""
    response = _post(
        service,
        "/api/v1/calls",
        {"call_node": "n1", "tool": "apply_batch_change", "arguments": {"b": "y" * 1100}},
    )
    assert response.status_code == 413
    assert "'apply_batch_change'" in response.json()["error"]
    assert "1000 bytes" in response.json()["error"]
    assert _stored_operations(service) == 0


def test_an_answer_over_the_answer_limit_is_refused_with_413(service: ServiceProcess) -> None:
    """An answer of more than limits.answer_bytes (2048 here) is refused before any lookup."""
    response = _post(service, "/api/v1/approvals/op-1/1", {"actor": "alice", "answer": {"a": "z" * 3000}})
    assert response.status_code == 413
    assert "2048 bytes" in response.json()["error"]
    assert "limits.answer_bytes" in response.json()["error"]


def test_rss_stays_flat_after_50_oversized_requests(service: ServiceProcess) -> None:
    """Fifty 8 MiB bodies cost the service no lasting memory (RSS grows by < 40 MiB) and store nothing."""
    body = json.dumps({"call_node": "big", "tool": "generate_report", "arguments": {"b": "x" * (8 << 20)}})
    assert service.pid is not None
    assert _post(service, "/api/v1/calls", body.encode()).status_code == 413  # warm-up
    before = _rss_kib(service.pid)
    for _ in range(50):
        assert _post(service, "/api/v1/calls", body.encode()).status_code == 413
    after = _rss_kib(service.pid)
    assert after - before < 40 * 1024, f"RSS grew from {before} KiB to {after} KiB"
    assert _stored_operations(service) == 0


def test_a_body_without_declared_length_is_cut_at_the_limit(service: ServiceProcess) -> None:
    """A chunked body (no Content-Length) that grows past the limit is refused with 413 too."""

    def chunks() -> Iterator[bytes]:
        yield b'{"call_node": "c", "tool": "generate_report", "arguments": {"b": "'
        for _ in range(40):
            yield b"x" * (64 << 10)
        yield b'"}}'

    response = http_kit.post(f"{service.url}/api/v1/calls", content=chunks(), timeout=60)
    assert response.status_code == 413
    assert _stored_operations(service) == 0


@pytest.mark.parametrize(
    ("body", "rule"),
    [
        ({"call_node": "n" * 20_000, "tool": "generate_report"}, "call_node"),
        ({"call_node": "a\u0000b", "tool": "generate_report"}, "call_node"),
        ({"call_node": "tab\there", "tool": "generate_report"}, "call_node"),
        ({"call_node": "é" * 200, "tool": "generate_report"}, "call_node"),
        ({"call_node": "ok", "tool": "generate_report", "principal": "two words"}, "principal"),
        ({"call_node": "ok", "tool": "generate_report", "principal": "p" * 129}, "principal"),
    ],
)
def test_submissions_breaking_an_identifier_rule_get_422_naming_it_and_store_nothing(
    service: ServiceProcess, body: dict[str, object], rule: str
) -> None:
    """Long, NUL-bearing, unprintable or over-256-byte call node ids and bad principals: 422, nothing stored."""
    response = _post(service, "/api/v1/calls", {**body, "arguments": {}})
    assert response.status_code == 422
    assert RULES[rule].text in response.json()["error"]  # type: ignore[index]
    assert _stored_operations(service) == 0


def test_actors_and_reasons_breaking_a_rule_get_422_on_every_action_route(service: ServiceProcess) -> None:
    """A control character in an actor or a reason is refused (422) by cancels, resolutions and rollout."""
    for path, body, rule in (
        ("/api/v1/operations/x/cancel", {"actor": "al\u0007ice", "reason": "r"}, "actor"),
        ("/api/v1/operations/x/cancel", {"actor": "alice", "reason": "line\nbreak"}, "reason"),
        ("/api/v1/reconciliation/1/resolve", {"actor": "a" * 129, "reason": "r"}, "actor"),
        ("/api/v1/approvals/op/1", {"actor": "\u0000", "answer": {}}, "actor"),
        ("/api/v1/rollout/rollback", {"actor": "alice", "reason": "r" * 2001}, "reason"),
    ):
        response = _post(service, path, body)
        assert response.status_code == 422, (path, response.text)
        assert RULES[rule].text in response.json()["error"], path  # type: ignore[index]
    with service.client() as client:
        assert client.rollout_events(limit=100) == [] or all(
            e["action"] != "rollback" for e in client.rollout_events(limit=100)
        )


def test_submissions_over_the_rate_get_429_with_retry_after_and_show_in_metrics(
    tmp_path: Path, write_config: Callable[..., Path], servers: dict[str, RefServer]
) -> None:
    """At 0.01 submissions/s with a burst of 2, a principal's third call is refused (429, Retry-After)."""
    limits = "\n[limits]\nsubmissions_per_s_per_principal = 0.01\nsubmission_burst = 2\n"
    with ServiceProcess(
        tmp_path / "ledger.duckdb", write_config(extra=limits), startup_timeout=120
    ) as service:
        with service.client() as client:
            for i in range(2):
                client.submit(call_node=f"r{i}", tool="generate_report", arguments={}, principal="team-a")
            with pytest.raises(ServiceRefused) as refused:
                client.submit(call_node="r2", tool="generate_report", arguments={}, principal="team-a")
            assert refused.value.status == 429
            assert refused.value.retry_after is not None
            assert refused.value.retry_after >= 1
            assert "limits.submissions_per_s_per_principal" in refused.value.message
            # Another principal has its own budget.
            client.submit(call_node="b0", tool="generate_report", arguments={}, principal="team-b")
            metrics = client.metrics()
        assert _stored_operations(service) == 3
    assert 'finality_limit_refusals{limit="submissions_per_s",principal="team-a"} 1.0' in metrics
    assert 'finality_limit{limit="submissions_per_s_per_principal"} 0.01' in metrics


def test_a_principal_at_its_in_flight_limit_gets_429_until_an_operation_ends(
    tmp_path: Path, write_config: Callable[..., Path], servers: dict[str, RefServer]
) -> None:
    """With one operation in flight allowed, a second is refused (429) while the first runs, then taken."""
    for server in servers.values():
        server.reset()
    limits = "\n[limits]\nin_flight_per_principal = 1\n"
    with (
        ServiceProcess(
            tmp_path / "ledger.duckdb", write_config(extra=limits), startup_timeout=120
        ) as service,
        service.client() as client,
    ):
        client.submit(
            call_node="long",
            tool="generate_report",
            arguments={"_sim": {"duration_ms": 20_000}},
            principal="p1",
        )
        with pytest.raises(ServiceRefused) as refused:
            client.submit(call_node="next", tool="generate_report", arguments={}, principal="p1")
        assert refused.value.status == 429
        assert refused.value.retry_after == 1
        assert "limits.in_flight_per_principal" in refused.value.message
        assert 'finality_principal_in_flight{principal="p1"} 1.0' in client.metrics()
        wait_until(lambda: client.show("long")["terminal"], timeout=60, what="the long call's receipt")
        client.submit(call_node="next", tool="generate_report", arguments={}, principal="p1")


def test_the_rate_limiter_refills_at_its_rate_on_the_injected_clock() -> None:
    """Two per second with a burst of 2: a third at t=0 waits 0.5 s (Retry-After 1); at t=0.5 it passes."""
    now = [0.0]
    limiter = PrincipalLimiter(
        LimitsConfig(submissions_per_s_per_principal=2, submission_burst=2),
        now=lambda: now[0],
        in_flight=lambda p: 0,
    )
    limiter.admit("a")
    limiter.admit("a")
    with pytest.raises(TooMany, match=r"retry in 0\.50 s") as refused:
        limiter.admit("a")
    assert refused.value.retry_after == 1
    now[0] = 0.5
    limiter.admit("a")
    assert limiter.refusals == {("submissions_per_s", "a"): 1}


def test_unknown_or_bad_limit_keys_are_refused_naming_the_key(servers: dict[str, RefServer]) -> None:
    """limits.body_byte (typo) and a negative answer_bytes are refused with the key named."""
    base = {"servers": {"s": {"url": "http://127.0.0.1:1/mcp"}}}
    with pytest.raises(ConfigError, match=r"limits\.body_byte"):
        parse_config({**base, "limits": {"body_byte": 1}})
    with pytest.raises(ConfigError, match=r"limits\.answer_bytes"):
        parse_config({**base, "limits": {"answer_bytes": -1}})
    assert (
        parse_config({**base, "limits": {"submissions_per_s_per_principal": 5}}).limits.submission_burst == 10
    )


def test_the_ledger_refuses_what_breaks_an_identifier_rule_even_bypassing_the_api(tmp_path: Path) -> None:
    """DuckDB ledger: CHECK constraints refuse a NUL call node id, a long one and a principal with a space."""
    from engine.ledger import duckdb_client

    with Ledger.open(tmp_path / "l.duckdb") as ledger:
        con = ledger._con
        columns = [r[0] for r in con.execute("DESCRIBE op_identity").fetchall()]
        good = {c: "v" for c in columns} | {"side_effects": False, "created_at": "2026-01-01T00:00:00Z"}
        for i, (column, value) in enumerate(
            [("call_node_id", "a\u0000b"), ("call_node_id", "n" * 300), ("principal", "two words")]
        ):
            row = good | {
                "operation_id": f"o{i}",
                "idempotency_key": f"k{i}",
                "call_node_id": f"c{i}",
                column: value,
            }
            with pytest.raises(duckdb_client.ConstraintException):
                con.execute(
                    f"INSERT INTO op_identity ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                    list(row.values()),
                )
        assert con.execute("SELECT count(*) FROM op_identity").fetchone() == (0,)


def test_finality_call_refuses_a_rule_breaking_call_node_before_opening_the_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`finality call` with a 300-byte call node id exits 2 naming the rule; no ledger file is made."""
    from service.cli import main

    ledger = tmp_path / "calls.duckdb"
    argv = ["call", "--server", "http://127.0.0.1:1/mcp", "--tool", "t", "--ledger", str(ledger)]
    assert main([*argv, "--call-node", "n" * 300]) == 2
    assert RULES["call_node"].text in capsys.readouterr().err
    assert (
        main(
            [
                *argv,
                "--call-node",
                "ok",
                "--args",
                json.dumps({"b": "x" * 2000}),
                "--max-argument-bytes",
                "1000",
            ]
        )
        == 2
    )
    assert "exceed the limit of 1000 bytes" in capsys.readouterr().err
    assert not ledger.exists()
