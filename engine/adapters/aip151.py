"""The Google AIP-151 long-running operations adapter (HTTP/JSON), with AIP-155 request ids.

A submission is a POST that returns an ``Operation``; ``done`` plus ``response`` or ``error`` is its
terminal state, ``error.code == 1`` a cancellation. AIP-193 errors become engine errors. Paths come
from ``AipPaths`` and are never hard-coded; this module never treats an MCP-looking URL as AIP.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Self
from urllib.parse import quote, urlencode

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from engine.adapters.base import (
    CancelResult,
    Capabilities,
    Created,
    Json,
    Outcome,
    ServerView,
    SubmitRequest,
    SubmitResult,
)
from engine.adapters.config import AdapterOptions
from engine.adapters.mcp_2025_11_25 import parse_wire, task_id_of
from engine.adapters.transport import (
    HttpClient,
    HttpResponse,
    bearer,
    encode_json,
    guarded,
    media_type,
    parse_json,
    read_capped,
    request_of,
    unavailable_for_status,
)
from engine.adapters.verify import Expectation, PayloadKind, RpcStatus, summarize, verify_outcome
from engine.errors import (
    BackendRejected,
    BackendUnavailable,
    NegotiationError,
    NotFoundOnServer,
    ProtocolViolation,
)
from engine.model import Operation, Principal, Protocol, ServerStatus, TaskId

ADAPTER_VERSION = "aip-151/1"
CODE_CANCELLED = 1
# Canonical codes that mean "the exchange did not go through; try again" (AIP-194 retries UNAVAILABLE;
# the gateway ones lose the answer, not the request).
_RETRYABLE_STATUSES = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"})
ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"


class AipOperation(BaseModel):
    """``google.longrunning.Operation`` as JSON. proto3 JSON leaves ``done: false`` out.

    ``error`` stays the raw object the server sent (its digest is taken over exactly that); it is
    checked against ``google.rpc.Status`` on the way in.
    """

    # Strict: "done": "yes" or "code": "13" are not what a proto3 JSON encoder writes.
    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(min_length=1)
    metadata: dict[str, object] | None = None
    done: bool = False
    error: dict[str, object] | None = None
    response: dict[str, object] | None = None

    @model_validator(mode="after")
    def _result_matches_done(self) -> Self:
        if self.done and (self.error is None) == (self.response is None):
            raise ValueError("a done operation carries exactly one of error and response")
        if not self.done and (self.error is not None or self.response is not None):
            raise ValueError("an operation that is not done carries neither error nor response")
        if self.error is not None and RpcStatus.model_validate(self.error).code == 0:
            raise ValueError("error.code 0 (OK) is not an error")
        return self

    @property
    def status(self) -> RpcStatus | None:
        return RpcStatus.model_validate(self.error) if self.error is not None else None


class _ListPage(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    operations: list[AipOperation] = Field(default_factory=list)
    next_page_token: str | None = Field(default=None, alias="nextPageToken")


class _ErrorBody(BaseModel):
    class _Error(BaseModel):
        model_config = ConfigDict(extra="allow")
        code: int = 0
        message: str = ""
        status: str | None = None

    error: _Error


EPOCH_HEADER = "X-Finality-Epoch"


def _epoch_echo(operation: AipOperation) -> int | None:
    """The executor epoch the server echoed: in ``response.epoch``, or in ``ErrorInfo.metadata.epoch``."""
    if operation.response is not None:
        echo = operation.response.get("epoch")
        return echo if isinstance(echo, int) and not isinstance(echo, bool) else None
    if operation.status is not None:
        for detail in operation.status.details:
            meta = detail.get("metadata")
            if detail.get("@type") == ERROR_INFO_TYPE and isinstance(meta, dict):
                raw = meta.get("epoch")
                if isinstance(raw, str) and raw.lstrip("-").isdigit():
                    return int(raw)
    return None


def _request_id_of(operation: AipOperation) -> str | None:
    meta = operation.metadata or {}
    for key in ("requestId", "request_id"):
        value = meta.get(key)
        if isinstance(value, str):
            return value
    return None


class Aip151Backend:
    """``Backend`` for a service that runs tool calls as AIP-151 operations."""

    protocol = Protocol.AIP_151
    adapter_version = ADAPTER_VERSION

    def __init__(self, url: str, *, client: HttpClient, token: str | None, options: AdapterOptions) -> None:
        self._client = client
        self._base = url.rstrip("/")
        self._token = token
        self._options = options
        self._paths = options.aip_paths

    # ------------------------------------------------------------------------------- HTTP

    async def _exchange(
        self,
        method: str,
        path: str,
        *,
        what: str,
        body: Json | None = None,
        params: dict[str, str] | None = None,
        limit: timedelta | None = None,
        epoch: int | None = None,
    ) -> Json:
        """One request; the JSON object it answered, or the engine error its failure means."""
        limit = limit or self._options.timeouts.request
        headers = {"Accept": "application/json", **bearer(self._token)}
        if epoch is not None:
            # GET has no body: the asking executor's epoch travels in a header, so that a reply
            # can be told apart from one an older executor asked for.
            headers[EPOCH_HEADER] = str(epoch)
        url = self._base + path
        if params:
            url += ("&" if "?" in url else "?") + urlencode(params)
        if body is None:
            content = None
        else:
            content = encode_json(body)
            headers["Content-Type"] = "application/json"
        request = request_of(method, url, headers, content, self._options, limit)
        async with guarded(what, limit), self._client.open(request) as response:
            raw = await read_capped(response, self._options.max_body_bytes, what)
        if response.status >= 400:
            raise self._failure(response, raw, what)
        if response.status != 200:
            raise ProtocolViolation(f"{what}: unexpected HTTP {response.status}")
        if media_type(response) != "application/json":
            raise ProtocolViolation(f"{what}: unexpected content type {media_type(response) or '(none)'!r}")
        data = parse_json(raw, what)
        if not isinstance(data, dict):
            raise ProtocolViolation(f"{what}: body is not a JSON object")
        return data

    def _failure(self, response: HttpResponse, raw: bytes, what: str) -> Exception:
        """An AIP-193 error (or a bare HTTP status) as the engine error it means."""
        busy = unavailable_for_status(response, what, self._options.clock.now())
        if busy is not None:
            return busy
        status_name: str | None = None
        message = ""
        try:
            parsed = _ErrorBody.model_validate(parse_json(raw, what))
            status_name, message = parsed.error.status, parsed.error.message
        except (ValidationError, ProtocolViolation, BackendUnavailable):
            pass
        detail = f"{what}: HTTP {response.status} {status_name or ''} {message}".rstrip()
        if response.status == 404 or status_name == "NOT_FOUND":
            return NotFoundOnServer(detail)
        if status_name in _RETRYABLE_STATUSES or (response.status >= 500 and status_name is None):
            # A 5xx without an AIP-193 body is a proxy's page, not the service's verdict.
            return BackendUnavailable(detail)
        return BackendRejected(detail, code=status_name or response.status)

    def _operation_path(self, template: str, name: str) -> str:
        # Operation names keep their slashes ("operations/123"); anything else is escaped.
        return template.format(name=quote(name, safe="/"))

    # ---------------------------------------------------------------------------- values

    def _view(self, operation: AipOperation, expected_task: TaskId | None) -> ServerView:
        """The operation as a ``ServerView``; a done operation carries its verified outcome.

        An outcome that fails verification is left off (the status still counts); ``fetch_result``
        re-reads it and reports the violation at the fetch stage.
        """
        task_id = TaskId(operation.name)
        if expected_task is not None and task_id != expected_task:
            raise ProtocolViolation(f"asked about {expected_task!r}, the server answered about {task_id!r}")
        if not operation.done:
            return ServerView(task_id=task_id, status=ServerStatus.WORKING)
        try:
            outcome = self._outcome(operation)
        except ProtocolViolation:
            outcome = None
        status = self._status(operation)
        message = operation.status.message if operation.status is not None else None
        return ServerView(task_id=task_id, status=status, status_message=message or None, outcome=outcome)

    @staticmethod
    def _status(operation: AipOperation) -> ServerStatus:
        if not operation.done:
            return ServerStatus.WORKING
        if operation.response is not None:
            return ServerStatus.COMPLETED
        if operation.status is not None and operation.status.code == CODE_CANCELLED:
            return ServerStatus.CANCELLED
        return ServerStatus.FAILED

    def _outcome(self, operation: AipOperation) -> Outcome:
        expected = Expectation(
            task_id=TaskId(operation.name), max_result_bytes=self._options.max_result_bytes
        )
        status = self._status(operation)
        if operation.response is not None:
            payload, kind = operation.response, PayloadKind.AIP_RESPONSE
        elif operation.error is not None:
            payload, kind = operation.error, PayloadKind.AIP_STATUS
        else:
            raise ProtocolViolation(f"operation {operation.name!r} is not done; it has no outcome")
        return verify_outcome(
            status,
            payload,
            kind,
            expected,
            reported_task_id=operation.name,
            epoch_echo=_epoch_echo(operation),
        )

    # ---------------------------------------------------------------------------- Backend

    def canonical_task_id(self, raw: str) -> TaskId:
        """The operation's full resource name, as the service names it in ``Operation.name``.

        A bare id (``AuLeh...``) denotes the same operation as ``operations/AuLeh...``: it gets the
        collection of the list template (``/v1/operations`` -> ``operations/``). A name that already
        has a collection path is kept as given.
        """
        name = raw.strip().strip("/")
        if "/" in name:
            return TaskId(name)
        collection = self._paths.list.rstrip("/").rsplit("/", 1)[-1]
        return TaskId(f"{collection}/{name}")

    async def negotiate(self, principal: Principal) -> Capabilities:
        """No exchange: AIP-151 fixes the contract. Every call is an operation; ``CancelOperation`` and
        ``ListOperations`` are part of the service. Lookup by key only where the server's config
        declares ``request_id`` deduplication (``AdapterOptions.request_id_dedupe``): AIP-155 lets a
        service ignore ``request_id``."""
        return Capabilities(
            protocol=self.protocol,
            tasks=True,
            cancel=True,
            list=True,
            lookup_by_key=self._options.request_id_dedupe,
            cancel_capability="CancelOperation (AIP-151)",
        )

    async def _run(self, op: Operation, arguments: Json) -> AipOperation:
        path = self._paths.submit.format(tool=quote(op.tool.name, safe=""))
        body: Json = {"request_id": op.idempotency_key, "arguments": arguments, "epoch": int(op.epoch)}
        data = await self._exchange("POST", path, what=f"run {op.tool.name}", body=body)
        return parse_wire(AipOperation, data, f"run {op.tool.name}")

    async def submit(self, request: SubmitRequest) -> SubmitResult:
        """POST the submit template with ``request_id`` = the submission key.

        Always ``Created``: a done operation's view carries its outcome. ``request.ttl`` has no
        place in AIP-151 (the service decides retention) and is not sent.
        """
        operation = await self._run(request.operation, request.arguments)
        return Created(self._view(operation, None))

    async def _get(self, op: Operation) -> AipOperation:
        name = task_id_of(op)
        data = await self._exchange(
            "GET", self._operation_path(self._paths.get, name), what=f"get {name}", epoch=int(op.epoch)
        )
        return parse_wire(AipOperation, data, f"get {name}")

    async def get(self, op: Operation) -> ServerView:
        """GetOperation. Raises ``NotFoundOnServer`` for 404 / ``NOT_FOUND``."""
        return self._view(await self._get(op), task_id_of(op))

    async def fetch_result(self, op: Operation) -> Outcome:
        """GetOperation again, and the done operation's ``response`` or ``error``, verified."""
        operation = await self._get(op)
        if operation.name != op.task_id:
            raise ProtocolViolation(
                f"asked about {op.task_id!r}, the server answered about {operation.name!r}"
            )
        return self._outcome(operation)

    async def cancel(self, op: Operation) -> CancelResult:
        """CancelOperation: best effort and asynchronous, so only ever ``ACKNOWLEDGED``."""
        name = task_id_of(op)
        await self._exchange(
            "POST", self._operation_path(self._paths.cancel, name), what=f"cancel {name}", body={}
        )
        return CancelResult.ACKNOWLEDGED

    async def look_up(self, op: Operation, arguments: Json) -> ServerView | None:
        """Find the operation by its ``request_id`` (only on a service declared to deduplicate it).

        First ListOperations filtered by ``request_id``: an operation whose metadata carries the key
        is the one; a filtered answer that lists none is the service saying, by the key, that it has
        no such request: ``None``, the proof that allows a resubmission under the same key (which
        the declared deduplication keeps safe even if the answer was stale). A service that refuses
        the filter, or lists operations without their keys, proves nothing: then the submission is
        repeated with the same ``request_id``, which returns the original operation or creates the
        one operation for this key now (that needs the original arguments, hence ``arguments``).

        Raises:
            NegotiationError: the service is not declared to deduplicate ``request_id``; a person
                must find the operation.
            ProtocolViolation: two operations listed under one ``request_id``.
        """
        if not self._options.request_id_dedupe:
            raise NegotiationError(
                "the service is not declared to deduplicate request_id (request_id_dedupe); "
                "a lost submission cannot be looked up by key"
            )
        key = op.idempotency_key
        try:
            found = await self._list({"filter": self._paths.request_id_filter.format(key=key)})
        except BackendRejected:
            return self._view(await self._run(op, arguments), None)
        mine = [o for o in found if _request_id_of(o) == key]
        if len(mine) > 1:
            names = ", ".join(o.name for o in mine)
            raise ProtocolViolation(f"the service lists several operations under request_id {key}: {names}")
        if mine:
            return self._view(mine[0], None)
        if found:
            # Listed, but without their keys: this answer cannot tell us anything about ours.
            return self._view(await self._run(op, arguments), None)
        return None

    async def candidates(self, op: Operation) -> list[TaskId]:
        """ListOperations filtered by ``request_id``; without filter support, all operations whose
        metadata names this key, or (if they name none) all of them."""
        key = op.idempotency_key
        try:
            found = await self._list({"filter": self._paths.request_id_filter.format(key=key)})
        except BackendRejected:
            # The service rejects the filter (INVALID_ARGUMENT/UNIMPLEMENTED): filter here instead.
            found = await self._list({})
        return [TaskId(o.name) for o in found if _request_id_of(o) in (None, key)]

    async def _list(self, query: dict[str, str]) -> list[AipOperation]:
        out: list[AipOperation] = []
        token: str | None = None
        for _ in range(self._options.max_pages):
            params = {**query, "page_size": "100"}
            if token:
                params["page_token"] = token
            data = await self._exchange("GET", self._paths.list, what="list operations", params=params)
            try:
                page = _ListPage.model_validate(data)
            except ValidationError as exc:
                raise ProtocolViolation(f"list operations: {summarize(exc)}") from exc
            out.extend(page.operations)
            token = page.next_page_token
            if not token:
                break
        return out

    async def answer_input(self, op: Operation, request_key: str, response: Json) -> None:
        """AIP-151 has no mid-operation input."""
        raise NegotiationError("AIP-151 operations cannot ask for input")

    async def aclose(self) -> None:
        """Nothing to end; the HTTP client belongs to the caller."""


async def probe(url: str, *, client: HttpClient, token: str | None, options: AdapterOptions) -> bool:
    """``GET {list}?page_size=1`` answering a JSON object shaped like a ``ListOperationsResponse``."""
    backend = Aip151Backend(url, client=client, token=token, options=options)
    data = await backend._exchange(
        "GET", options.aip_paths.list, what="list operations", params={"page_size": "1"}
    )
    try:
        _ListPage.model_validate(data)
    except ValidationError:
        return False
    return True


__all__ = [
    "ADAPTER_VERSION",
    "CODE_CANCELLED",
    "EPOCH_HEADER",
    "ERROR_INFO_TYPE",
    "Aip151Backend",
    "AipOperation",
    "probe",
]
