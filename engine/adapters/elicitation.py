"""Server requests for input (elicitation, sampling, roots) turned into ``InputRequest`` values. Pure.

Parses with the wire models of the protocol version that carried the request and checks a person's
answer before it is sent. It never answers on a person's behalf.
"""

from __future__ import annotations

import jsonschema
from jsonschema.exceptions import SchemaError
from mcp_types import _v2025_11_25 as v2025
from mcp_types import _v2026_07_28 as v2026
from pydantic import BaseModel, ValidationError

from engine.adapters.base import InputRequest, Json
from engine.adapters.verify import summarize
from engine.errors import ConfigError, ProtocolViolation
from engine.model import digest_of

ELICIT = "elicitation/create"
INPUT_METHODS = frozenset({ELICIT, "sampling/createMessage", "roots/list"})


ROUND_KEY_SEPARATOR = "#"


def round_key(wire_id: str, method: str, params: Json) -> str:
    """The identity of one input round: the server's id for it plus a digest of what it asks.

    Servers may reuse ids (some send JSON-RPC id 0 for every elicitation), so the id alone cannot
    tell a replay of the answered question from a new one. The digest covers the method, the message
    and the requested schema (``_meta`` aside, which carries routing, not the question): the same
    question under the same id is a replay; anything else is a new round. ``wire_id_of`` recovers
    the id to answer under.
    """
    asked = {k: v for k, v in params.items() if k != "_meta"}
    digest = digest_of({"method": method, "params": asked})
    return f"{wire_id}{ROUND_KEY_SEPARATOR}{digest.removeprefix('sha256:')[:16]}"


def wire_id_of(key: str) -> str:
    """The server's own id inside a round key made by ``round_key`` (the key itself otherwise)."""
    wire_id, sep, _ = key.rpartition(ROUND_KEY_SEPARATOR)
    return wire_id if sep else key


def input_request_of(key: str, method: str, params: Json, *, version: str) -> InputRequest:
    """The person-facing form of one server request.

    Args:
        key: the round key the answer must be bound to (``round_key`` of the server's id and the
            request).
        method: the server's request method.
        params: its params.
        version: ``"2025-11-25"`` or ``"2026-07-28"``: which wire models parse it.

    Raises:
        ProtocolViolation: an unknown method or malformed params.
    """
    if method not in INPUT_METHODS:
        raise ProtocolViolation(f"server asked for input with unknown method {method!r}")
    if method != ELICIT:
        # Sampling and roots have no form; the person sees the request itself and answers with the
        # method's result object.
        return InputRequest(
            key=key,
            message=f"the server asks the client for {method}",
            requested_schema=params,
            schema_digest=digest_of(params),
        )
    url_mode = params.get("mode") == "url"
    models: dict[tuple[str, bool], type[BaseModel]] = {
        ("2025-11-25", False): v2025.ElicitRequestFormParams,
        ("2025-11-25", True): v2025.ElicitRequestURLParams,
        ("2026-07-28", False): v2026.ElicitRequestFormParams,
        ("2026-07-28", True): v2026.ElicitRequestURLParams,
    }
    try:
        models[(version, url_mode)].model_validate(params)
    except ValidationError as exc:
        raise ProtocolViolation(f"malformed elicitation request: {summarize(exc)}") from exc
    message = str(params.get("message", ""))
    if url_mode:
        schema: Json = {}
        message = f"{message} ({params.get('url')})"
    else:
        raw = params.get("requestedSchema")
        schema = raw if isinstance(raw, dict) else {}
    return InputRequest(key=key, message=message, requested_schema=schema, schema_digest=digest_of(schema))


def check_answer(method: str | None, response: Json) -> None:
    """Refuse an answer that is not the result type of the request it answers (when known)."""
    if method != ELICIT:
        return
    try:
        v2025.ElicitResult.model_validate(response)
    except ValidationError as exc:
        raise ConfigError("input response", f"not an elicitation result: {summarize(exc)}") from exc


def answer_problem(requested_schema: Json, answer: Json) -> tuple[str, str] | None:
    """What is wrong with a person's answer for the schema the server requested: ``(field, message)``,
    or ``None`` when it fits.

    ``answer`` is an elicitation result (``{"action": ..., "content": ...}``) or the content itself;
    only accepted content is checked (a decline or cancel carries none). A missing required property
    is named by its own path (``content.approve``), anything else by the path of the failing value.
    """
    action = answer.get("action") if "action" in answer else "accept"
    if action != "accept" or not requested_schema:
        return None
    content = answer.get("content", {}) if "action" in answer else answer
    try:
        validator_class = jsonschema.validators.validator_for(
            requested_schema, default=jsonschema.Draft202012Validator
        )
        validator = validator_class(requested_schema)
        errors = sorted(validator.iter_errors(content), key=lambda e: list(e.absolute_path))
    except SchemaError:
        return None  # the server's schema itself is broken: nothing a person's answer can fix
    if not errors:
        return None
    error = errors[0]
    path = ["content", *(str(p) for p in error.absolute_path)]
    if error.validator == "required" and isinstance(error.instance, dict):
        required = error.validator_value if isinstance(error.validator_value, list) else []
        missing = [str(name) for name in required if name not in error.instance]
        if missing:
            path.append(missing[0])
    return ".".join(path), error.message


__all__ = [
    "ELICIT",
    "INPUT_METHODS",
    "ROUND_KEY_SEPARATOR",
    "answer_problem",
    "check_answer",
    "input_request_of",
    "round_key",
    "wire_id_of",
]
