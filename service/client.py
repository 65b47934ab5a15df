"""A small client of the control API, for the CLI, the console and notebooks.

Speaks HTTP to a running ``finality serve``; it holds no rules and builds no SQL. It presents a
token (``Authorization: Bearer``): the one given, else ``FINALITY_TOKEN`` from the environment (the CLI's
``--token``, the console's sign-in and notebooks all end up here). Who acts is the token's principal;
an ``actor`` is sent only when given (local mode records it as typed).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from engine.errors import ServiceRefused, ServiceUnavailable
from service.auth import TOKEN_ENV

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]

Json = dict[str, Any]

API_VERSION = 2
"""The control API's version, named in the service's health answer (``api_version``). Raise it when a
route or an answer's shape changes in a way a console or client of the new release relies on; a
console refuses a service whose version is lower (a health answer without the field is older than
version 2, when it was introduced) with a message, instead of failing later on a missing field."""


def _person(actor: str | None, **rest: Any) -> Json:
    body: Json = dict(rest)
    if actor:
        body["actor"] = actor
    return body


class ServiceClient:
    """Blocking client; every call has an explicit timeout."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        token: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        presented = token if token is not None else os.environ.get(TOKEN_ENV, "").strip()
        headers = {"Authorization": f"Bearer {presented}"} if presented else None
        self._http = httpx.Client(
            base_url=self.base_url, timeout=timeout, transport=transport, headers=headers
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        json: Json | None = None,
        params: Json | None = None,
        wait_s: float = 0.0,
    ) -> Json:
        # A request that waits on the service (``wait_s``) gets that much longer to be answered.
        timeout = httpx.USE_CLIENT_DEFAULT if not wait_s else self._http.timeout.read + wait_s  # type: ignore[operator]
        try:
            response = self._http.request(method, path, json=json, params=params, timeout=timeout)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc, wait_s) from exc
        try:
            body = response.json()
        except ValueError:
            body = {"error": response.text[:500]}
        if response.status_code >= 400:
            message = body.get("error", response.reason_phrase) if isinstance(body, dict) else str(body)
            retry = response.headers.get("retry-after", "")
            raise ServiceRefused(
                response.status_code, str(message), retry_after=int(retry) if retry.isdigit() else None
            )
        if not isinstance(body, dict):
            raise ServiceRefused(
                response.status_code, "the service answered with something other than a JSON object"
            )
        return body

    def _unreachable(self, exc: httpx.HTTPError, wait_s: float = 0.0) -> ServiceUnavailable:
        """What a failed request means to a caller: unreachable, or reached but silent past the timeout."""
        timeout_s = None
        if isinstance(exc, httpx.TimeoutException):
            read = self._http.timeout.read
            timeout_s = (read if read is not None else 0.0) + wait_s
        return ServiceUnavailable(
            f"cannot reach the Finality service at {self.base_url}: {exc or type(exc).__name__}",
            timeout_s=timeout_s,
        )

    def health(self) -> Json:
        return self._call("GET", "/api/v1/health")

    def whoami(self) -> Json:
        """The token's principal and roles (local mode: ``authenticated`` false)."""
        return self._call("GET", "/api/v1/whoami")

    def denials(self, *, limit: int = 100) -> list[Json]:
        """Refused attempts (401/403), newest first."""
        return list(self._call("GET", "/api/v1/access/denials", params={"limit": limit})["denials"])

    def submit(self, *, call_node: str, tool: str, arguments: Json, principal: str | None = None) -> Json:
        body: Json = {"call_node": call_node, "tool": tool, "arguments": arguments}
        if principal:
            body["principal"] = principal
        return self._call("POST", "/api/v1/calls", json=body)

    def submit_and_wait(
        self, *, call_node: str, tool: str, arguments: Json, wait_s: float, principal: str | None = None
    ) -> Json:
        """Submit and let the service hold the answer until the call node holds a receipt or
        ``wait_s`` ends (then the current state, ``receipt`` None). Submitting the same call node
        and request again returns the same operation and, once there, the same receipt."""
        body: Json = {"call_node": call_node, "tool": tool, "arguments": arguments, "wait_s": wait_s}
        if principal:
            body["principal"] = principal
        return self._call("POST", "/api/v1/calls", json=body, wait_s=wait_s)

    def wait(self, call_node: str, *, wait_s: float) -> Json:
        """The operation once it holds a receipt, or as it is when ``wait_s`` ends."""
        return self._call("GET", f"/api/v1/operations/{call_node}", params={"wait_s": wait_s}, wait_s=wait_s)

    def outbox(
        self, consumer: str, *, after: int | None = None, wait_s: float = 0.0, limit: int = 100
    ) -> Json:
        """``consumer``'s ready entries after ``after`` (long-polled up to ``wait_s``): ``entries`` and ``cursor``."""
        params: Json = {"consumer": consumer, "wait_s": wait_s, "limit": limit}
        if after is not None:
            params["after"] = after
        return self._call("GET", "/api/v1/outbox", params=params, wait_s=wait_s)

    def ack(self, entry: Json, *, consumer: str) -> Json:
        """Acknowledge an entry ``outbox`` returned: the downstream advanced on it (idempotent)."""
        return self._call(
            "POST",
            f"/api/v1/outbox/{entry['call_node_id']}/ack",
            json={"consumer": consumer, "status": entry["status"], "result_digest": entry["result_digest"]},
        )

    def outbox_lag(self) -> list[Json]:
        return list(self._call("GET", "/api/v1/outbox/lag")["consumers"])

    def operations(self, **filters: Any) -> list[Json]:
        params = {k: v for k, v in filters.items() if v is not None}
        return list(self._call("GET", "/api/v1/operations", params=params)["operations"])

    def show(self, call_node: str) -> Json:
        return self._call("GET", f"/api/v1/operations/{call_node}")

    def cancel(self, call_node: str, *, reason: str, actor: str | None = None) -> Json:
        return self._call(
            "POST", f"/api/v1/operations/{call_node}/cancel", json=_person(actor, reason=reason)
        )

    def resubmit(self, call_node: str, *, reason: str, actor: str | None = None) -> Json:
        """A person's resubmission (same key) of an operation they declared absent."""
        return self._call(
            "POST", f"/api/v1/operations/{call_node}/resubmit", json=_person(actor, reason=reason)
        )

    def approvals(self, *, include_closed: bool = False) -> list[Json]:
        """The answerable rounds; ``include_closed`` adds answered, expired and closed ones."""
        path = "/api/v1/approvals?all=1" if include_closed else "/api/v1/approvals"
        return list(self._call("GET", path)["approvals"])

    def answer(self, operation_id: str, input_round: int, *, answer: Json, actor: str | None = None) -> Json:
        return self._call(
            "POST", f"/api/v1/approvals/{operation_id}/{input_round}", json=_person(actor, answer=answer)
        )

    def reconciliation(self, *, include_resolved: bool = False) -> list[Json]:
        params = {"all": "1"} if include_resolved else None
        return list(self._call("GET", "/api/v1/reconciliation", params=params)["entries"])

    def resolve(
        self,
        entry_id: int,
        *,
        reason: str,
        actor: str | None = None,
        task_id: str | None = None,
        absent: bool = False,
    ) -> Json:
        body = _person(actor, reason=reason, absent=absent)
        if task_id:
            body["task_id"] = task_id
        return self._call("POST", f"/api/v1/reconciliation/{entry_id}/resolve", json=body)

    def sql(self, query: str, *, max_rows: int = 1000) -> Json:
        return self._call("POST", "/api/v1/sql", json={"query": query, "max_rows": max_rows})

    def sql_frame(self, query: str, *, max_rows: int = 10_000) -> pd.DataFrame:
        """The query's result as a pandas DataFrame, sent by the service as an Arrow stream (not JSON rows).

        ``max_rows`` may be raised up to the service's limit (``[analyst] max_rows``); a result with
        more rows is refused (``ServiceRefused`` naming the limit), never silently cut.
        """
        import pyarrow as pa

        try:
            response = self._http.post("/api/v1/sql/arrow", json={"query": query, "max_rows": max_rows})
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc
        if response.status_code >= 400:
            try:
                message = str(response.json().get("error", response.reason_phrase))
            except ValueError:
                message = response.text[:500]
            raise ServiceRefused(response.status_code, message)
        with pa.ipc.open_stream(response.content) as reader:
            return reader.read_pandas()

    def publish_snapshot(self) -> Json:
        """Ask the service for a fresh snapshot file; returns its name, as-of instant and size."""
        return self._call("POST", "/api/v1/snapshots")

    def download_snapshot(self, name: str, dest: str | Path) -> Path:
        """Copy a published snapshot to ``dest`` (written under a temporary name, then renamed)."""
        target = Path(dest)
        partial = target.with_name(target.name + ".partial")
        try:
            with self._http.stream("GET", f"/api/v1/snapshots/{name}") as response:
                if response.status_code >= 400:
                    response.read()
                    raise ServiceRefused(response.status_code, response.text[:500])
                with partial.open("wb") as out:
                    for chunk in response.iter_bytes():
                        out.write(chunk)
        except httpx.HTTPError as exc:
            partial.unlink(missing_ok=True)
            raise self._unreachable(exc) from exc
        partial.replace(target)
        return target

    def gates(self, *, record: bool = False) -> Json:
        return self._call("POST" if record else "GET", "/api/v1/gates")

    # ------------------------------------------------------------------ rollout (used by the console)
    # The contract of the rollout routes: GET /api/v1/rollout/status; POST /api/v1/rollout/{action}
    # with {actor, reason, ...} for shadow, canary (percentage), promote, rollback,
    # disable-protocol / enable-protocol (protocol).

    def rollout_status(self) -> Json:
        return self._call("GET", "/api/v1/rollout/status")

    def rollout(self, action: str, body: Json) -> Json:
        return self._call("POST", f"/api/v1/rollout/{action}", json=body)

    # ------------------------------------------------------------- rollout reads (CLI: finality rollout/audit)

    def rollout_events(self, *, limit: int = 100) -> list[Json]:
        return list(self._call("GET", "/api/v1/rollout/events", params={"limit": limit})["events"])

    def rollout_audit(self) -> Json:
        return self._call("GET", "/api/v1/rollout/audit")

    def shadow_diffs(self, *, diverged: bool = False, limit: int = 100) -> Json:
        params: Json = {"limit": limit}
        if diverged:
            params["diverged"] = "1"
        return self._call("GET", "/api/v1/rollout/shadow-diffs", params=params)

    def rollout_assignments(self, *, limit: int = 1000) -> list[Json]:
        return list(self._call("GET", "/api/v1/rollout/assignments", params={"limit": limit})["assignments"])

    def metrics(self) -> str:
        try:
            return self._http.get("/metrics").text
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc


__all__ = [
    "API_VERSION",
    "TOKEN_ENV",
    "Json",
    "ServiceClient",
]
