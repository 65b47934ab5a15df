"""When the executor's group commit is due: advances wait for company only as long as that delays nothing (issue 18)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from engine.runtime.driver import Wake
from engine.testing import make_operation
from refserver.testing import RefServer
from service.executor import FLUSH_DELAY, FLUSH_PATIENCE
from service.executor.groups import commit_deadline
from service.testing import ServiceProcess, all_terminal, service_in, wait_until

NOW = datetime(2026, 12, 2, 16, 0, tzinfo=UTC)


def wake(at: datetime | None) -> Wake:
    return Wake(make_operation("n"), at)


def test_an_advance_whose_next_poll_is_a_poll_interval_away_waits_for_company() -> None:
    """A status read a second away: its writes wait ``FLUSH_PATIENCE`` (not ``FLUSH_DELAY``) for
    other advances' writes, and the commit still ends long before that read is due."""
    due = commit_deadline(wake(NOW + timedelta(seconds=1)), NOW)
    assert due == NOW + FLUSH_PATIENCE
    assert due > NOW + FLUSH_DELAY
    assert due <= NOW + timedelta(seconds=1) - FLUSH_PATIENCE


def test_an_advance_whose_next_request_is_soon_commits_after_the_short_delay() -> None:
    """A request due at once (a result fetch) or within twice ``FLUSH_PATIENCE`` is not held back."""
    for at in (NOW, NOW + timedelta(milliseconds=100), NOW + 2 * FLUSH_PATIENCE - timedelta(microseconds=1)):
        assert commit_deadline(wake(at), NOW) == NOW + FLUSH_DELAY


def test_a_parked_or_finished_operation_commits_after_the_short_delay() -> None:
    """No next request (a receipt someone may be waiting for, an operation parked for a person)."""
    assert commit_deadline(wake(None), NOW) == NOW + FLUSH_DELAY


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, servers: dict[str, RefServer]
) -> Iterator[ServiceProcess]:
    with service_in(tmp_path_factory.mktemp("group-cadence"), servers) as svc:
        yield svc


def gauge(metrics: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", metrics, re.M)
    assert found is not None, f"{name} not in /metrics"
    return float(found.group(1))


def test_metrics_count_the_group_commits_and_the_writes_they_carried(service: ServiceProcess) -> None:
    """/metrics says how many group commits the executor made and what they carried, so a group's
    fixed cost can be put per task in production as in the benchmarks."""
    with service.client() as client:
        before = client.metrics()
        client.submit(call_node="groups-1", tool="generate_report", arguments={})
        wait_until(lambda: all_terminal(client, ["groups-1"]), what="terminal")
        after = client.metrics()
    commits = gauge(after, "finality_executor_group_commits") - gauge(
        before, "finality_executor_group_commits"
    )
    writes = gauge(after, "finality_executor_group_writes") - gauge(before, "finality_executor_group_writes")
    assert commits >= 1
    assert writes >= commits
    assert gauge(after, "finality_executor_write_transactions") > gauge(
        before, "finality_executor_write_transactions"
    )
