"""Thin clients for the reference servers' wire protocols, for the refserver tests.

They build requests the way each spec says and return raw ``httpx`` responses, so tests can assert on
status codes and headers as well as bodies. Every wait is bounded by a deadline.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import http_kit

from engine.clock import monotonic_seconds
from engine.testing import wait
from refserver.testing import RefServer

DEADLINE_S = 5.0


def wait_until(predicate: Callable[[], Any], timeout_s: float = DEADLINE_S) -> Any:
    """``engine.testing.wait.wait_until`` at the reference servers' pace: a short deadline, a look every 10 ms."""
    return wait.wait_until(predicate, timeout=timeout_s, every=0.01, what="the reference server")


def sse_messages(response: http_kit.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.startswith("data:"):
            yield json.loads(line[5:])


class Mcp2025Client:
    """A session on an MCP 2025-11-25 server."""

    def __init__(
        self, server: RefServer, token: str | None = None, accept: str = "application/json, text/event-stream"
    ) -> None:
        self.http = http_kit.Client(base_url=server.url, timeout=10)
        self.headers = {"accept": accept, "content-type": "application/json"}
        if token is not None:
            self.headers["authorization"] = f"Bearer {token}"
        self.next_id = 0
        init = self.post(
            {
                "jsonrpc": "2.0",
                "id": self._id(),
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {"elicitation": {}},
                    "clientInfo": {"name": "tests", "version": "0"},
                },
            }
        )
        assert init.status_code == 200, init.text
        self.initialize_result: dict[str, Any] = init.json()["result"]
        self.headers["mcp-session-id"] = init.headers["mcp-session-id"]
        self.headers["mcp-protocol-version"] = "2025-11-25"
        assert self.post({"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    def post(self, message: object, headers: dict[str, str] | None = None) -> http_kit.Response:
        return self.http.post(
            "/mcp", content=json.dumps(message), headers={**self.headers, **(headers or {})}
        )

    def rpc(self, method: str, params: dict[str, Any] | None = None) -> http_kit.Response:
        return self.post({"jsonrpc": "2.0", "id": self._id(), "method": method, "params": params or {}})

    def result(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        response = self.rpc(method, params)
        assert response.status_code == 200, response.text
        body = response.json()
        assert "result" in body, body
        return body["result"]  # type: ignore[no-any-return]

    def error(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        response = self.rpc(method, params)
        body = response.json()
        assert "error" in body, body
        return body["error"]  # type: ignore[no-any-return]

    def stream(
        self, method: str, params: dict[str, Any]
    ) -> contextlib.AbstractContextManager[http_kit.Response]:
        message = {"jsonrpc": "2.0", "id": self._id(), "method": method, "params": params}
        return self.http.stream("POST", "/mcp", content=json.dumps(message), headers=self.headers)

    def answer(self, request_id: str | int, action: str = "accept") -> http_kit.Response:
        result: dict[str, Any] = {"action": action}
        if action == "accept":
            result["content"] = {"approve": True}
        return self.post({"jsonrpc": "2.0", "id": request_id, "result": result})

    def start(self, tool: str, arguments: dict[str, Any] | None = None, **extra: Any) -> str:
        params = {"name": tool, "arguments": arguments or {}, "task": {}, **extra}
        return self.result("tools/call", params)["task"]["taskId"]  # type: ignore[no-any-return]

    def status(self, task_id: str) -> str:
        return self.result("tasks/get", {"taskId": task_id})["status"]  # type: ignore[no-any-return]

    def wait_status(self, task_id: str, *statuses: str) -> str:
        return wait_until(lambda: (s := self.status(task_id)) in statuses and s)  # type: ignore[no-any-return]

    def close(self) -> None:
        self.http.close()


class Mcp2026Client:
    """Stateless requests to an MCP 2026-07-28 server with the tasks extension."""

    def __init__(self, server: RefServer, token: str | None = None) -> None:
        self.http = http_kit.Client(base_url=server.url, timeout=10)
        self.token = token
        self.next_id = 0

    def rpc(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        opt_in: bool = True,
        version: str = "2026-07-28",
        headers: dict[str, str | None] | None = None,
    ) -> http_kit.Response:
        self.next_id += 1
        extensions: dict[str, Any] = {"io.modelcontextprotocol/tasks": {}} if opt_in else {}
        meta = {
            "io.modelcontextprotocol/protocolVersion": version,
            "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
        }
        params = dict(params or {})
        params["_meta"] = {**meta, **params.get("_meta", {})}
        sent = {"content-type": "application/json", "mcp-protocol-version": version, "mcp-method": method}
        if method in ("tasks/get", "tasks/update", "tasks/cancel") and isinstance(params.get("taskId"), str):
            sent["mcp-name"] = params["taskId"]
        if method == "tools/call" and isinstance(params.get("name"), str):
            sent["mcp-name"] = params["name"]
        if self.token is not None:
            sent["authorization"] = f"Bearer {self.token}"
        for name, value in (headers or {}).items():
            if value is None:
                sent.pop(name, None)
            else:
                sent[name] = value
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        return self.http.post("/mcp", content=json.dumps(message), headers=sent)

    def result(self, method: str, params: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        response = self.rpc(method, params, **kwargs)
        assert response.status_code == 200, response.text
        body = response.json()
        assert "result" in body, body
        return body["result"]  # type: ignore[no-any-return]

    def error(self, method: str, params: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        body = self.rpc(method, params, **kwargs).json()
        assert "error" in body, body
        return body["error"]  # type: ignore[no-any-return]

    def start(self, tool: str, arguments: dict[str, Any] | None = None, **extra: Any) -> str:
        result = self.result("tools/call", {"name": tool, "arguments": arguments or {}, **extra})
        assert result["resultType"] == "task", result
        return result["taskId"]  # type: ignore[no-any-return]

    def get(self, task_id: str) -> dict[str, Any]:
        return self.result("tasks/get", {"taskId": task_id})

    def wait_status(self, task_id: str, *statuses: str, timeout_s: float = DEADLINE_S) -> dict[str, Any]:
        return wait_until(lambda: (t := self.get(task_id))["status"] in statuses and t, timeout_s)  # type: ignore[no-any-return]

    def round_trip_s(self, samples: int = 3) -> float:
        """The slowest of ``samples`` server/discover round trips: how long one request takes right now."""
        slowest = 0.0
        for _ in range(samples):
            started = monotonic_seconds()
            self.result("server/discover")
            slowest = max(slowest, monotonic_seconds() - started)
        return slowest

    def close(self) -> None:
        self.http.close()


class AipClient:
    def __init__(self, server: RefServer, token: str | None = None) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.http = http_kit.Client(base_url=server.url, timeout=10, headers=headers)

    def run(self, tool: str, arguments: dict[str, Any] | None = None, **body: Any) -> http_kit.Response:
        return self.http.post(f"/v1/tools/{tool}:run", json={"arguments": arguments or {}, **body})

    def start(self, tool: str, arguments: dict[str, Any] | None = None, **body: Any) -> str:
        response = self.run(tool, arguments, **body)
        assert response.status_code == 200, response.text
        return response.json()["name"]  # type: ignore[no-any-return]

    def get(self, name: str) -> http_kit.Response:
        return self.http.get(f"/v1/{name}")

    def wait_done(self, name: str) -> dict[str, Any]:
        return wait_until(lambda: (op := self.get(name).json()).get("done") and op)  # type: ignore[no-any-return]

    def close(self) -> None:
        self.http.close()
