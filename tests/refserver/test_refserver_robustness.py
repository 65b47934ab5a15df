"""Arbitrary JSON in requests never crashes a server: every answer is a 2xx/4xx with a JSON body."""

from __future__ import annotations

import json

import http_kit
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from refserver_clients import Mcp2025Client

from refserver.testing import RefServer

KEYS = [
    "name",
    "arguments",
    "task",
    "taskId",
    "_sim",
    "ttl",
    "cursor",
    "inputResponses",
    "_meta",
    "idempotencyKey",
]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=4),
    max_leaves=8,
)
METHODS = st.sampled_from(
    [
        "tools/call",
        "tasks/get",
        "tasks/cancel",
        "tasks/list",
        "tasks/update",
        "tools/list",
        "server/discover",
        "bogus",
    ]
)


@pytest.fixture(scope="module")
def servers():
    with (
        RefServer("mcp-2025-11-25", time_scale=0.001) as legacy,
        RefServer("mcp-2026-07-28", time_scale=0.001) as modern,
        RefServer("aip-151", time_scale=0.001) as aip,
    ):
        session = Mcp2025Client(legacy)
        with (
            http_kit.Client(base_url=modern.url, timeout=10) as modern_http,
            http_kit.Client(base_url=aip.url, timeout=10) as aip_http,
        ):
            yield session, modern_http, aip_http
        session.close()


def assert_clean(response: http_kit.Response) -> None:
    assert response.status_code < 500, response.text
    if response.content:
        assert response.headers["content-type"].startswith(("application/json", "text/event-stream"))
        if response.headers["content-type"].startswith("application/json"):
            json.loads(response.content)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=METHODS, params=JSON, arguments=JSON)
def test_arbitrary_params_get_a_clean_error_or_result(servers, method, params, arguments):
    """Whatever params and arguments look like, each protocol answers without a 5xx or a non-JSON body."""
    legacy, modern, aip = servers
    if isinstance(params, dict) and "arguments" in params:
        params["arguments"] = arguments
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    assert_clean(legacy.post(message))
    headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": method}
    assert_clean(modern.post("/mcp", content=json.dumps(message), headers=headers))
    assert_clean(aip.post("/v1/tools/generate_report:run", content=json.dumps({"arguments": arguments})))
    assert_clean(
        aip.get("/v1/operations", params={"filter": str(params)[:20], "page_token": str(arguments)[:8]})
    )
