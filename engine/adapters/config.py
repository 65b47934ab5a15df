"""Adapter options: size caps, per-call timeouts, AIP-151 path templates and the client's identity.

Plain frozen values, checked once when built. No I/O; nothing here knows a wire format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from engine.clock import Clock, SystemClock
from engine.errors import ConfigError

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long one HTTP exchange may take, by kind of call.

    Each value bounds the whole exchange (connect, send, and every byte of the reply), not just the
    gap between two bytes, so a server that trickles a stream cannot hold a caller forever.
    """

    connect: timedelta = timedelta(seconds=5)
    request: timedelta = timedelta(seconds=30)
    """Ordinary calls: negotiation, submit, get, cancel, list, answers."""
    result_wait: timedelta = timedelta(seconds=60)
    """The blocking MCP 2025-11-25 ``tasks/result``; on expiry the caller keeps polling."""
    sync_call: timedelta = timedelta(seconds=120)
    """A synchronous ``tools/call`` (legacy adapter): the tool's whole run must fit."""
    input_probe: timedelta = timedelta(seconds=2)
    """The short ``tasks/result`` stream read that collects a pending elicitation request."""

    def __post_init__(self) -> None:
        for name in ("connect", "request", "result_wait", "sync_call", "input_probe"):
            value = getattr(self, name)
            if value <= timedelta(0):
                raise ConfigError(f"timeouts.{name}", f"must be positive, got {value}")


@dataclass(frozen=True, slots=True)
class AipPaths:
    """AIP-151 REST path templates, relative to the server URL.

    Google's proto and python-api-core disagree on these paths, so they are configuration, never
    code. ``{tool}`` is the tool name, ``{name}`` the operation name the server assigned
    (``operations/...``, slashes kept), ``{key}`` the submission key.
    """

    submit: str = "/v1/tools/{tool}:run"
    get: str = "/v1/{name}"
    cancel: str = "/v1/{name}:cancel"
    list: str = "/v1/operations"
    request_id_filter: str = 'request_id = "{key}"'
    """The AIP-160 ``filter`` that finds operations created under one AIP-155 ``request_id``."""

    def __post_init__(self) -> None:
        needs = {"submit": "{tool}", "get": "{name}", "cancel": "{name}", "request_id_filter": "{key}"}
        for name, placeholder in needs.items():
            if placeholder not in getattr(self, name):
                raise ConfigError(f"aip_paths.{name}", f"must contain {placeholder}")
        for name in ("submit", "get", "cancel", "list"):
            if not getattr(self, name).startswith("/"):
                raise ConfigError(f"aip_paths.{name}", "must start with '/'")


@dataclass(frozen=True, slots=True)
class ClientInfo:
    """How Finality names itself to MCP servers (``clientInfo``)."""

    name: str = "finality"
    version: str = "0.1.0"


@dataclass(frozen=True, slots=True)
class AdapterOptions:
    """Everything an adapter is tuned by. One value per server connection."""

    max_result_bytes: int = 2 * MIB
    """Largest accepted terminal outcome, measured as canonical JSON."""
    max_body_bytes: int = 4 * MIB
    """Largest HTTP body read; reading stops (``ProtocolViolation``) as soon as a body passes it."""
    timeouts: Timeouts = field(default_factory=Timeouts)
    aip_paths: AipPaths = field(default_factory=AipPaths)
    client_info: ClientInfo = field(default_factory=ClientInfo)
    max_pages: int = 50
    """Cap on followed list cursors, so a server that always answers ``nextCursor`` cannot loop us."""
    clock: Clock = field(default_factory=SystemClock)
    """Only read to turn an HTTP-date ``Retry-After`` into a delay."""
    request_id_dedupe: bool = False
    """AIP-151: the service is declared (``request_id_dedupe = true`` in the server's config) to
    deduplicate AIP-155 ``request_id``. AIP-155 makes ``request_id`` optional, so a service may ignore
    it; only with this declaration is a lost submission looked up by its key (and a key lookup that
    finds nothing read as the service's proof that it never created the operation). Off: a lost
    create response goes to reconciliation, as on MCP without idempotency."""

    def __post_init__(self) -> None:
        if self.max_result_bytes <= 0:
            raise ConfigError("max_result_bytes", f"must be positive, got {self.max_result_bytes}")
        if self.max_body_bytes <= 0:
            raise ConfigError("max_body_bytes", f"must be positive, got {self.max_body_bytes}")
        if self.max_pages <= 0:
            raise ConfigError("max_pages", f"must be positive, got {self.max_pages}")


__all__ = [
    "MIB",
    "AdapterOptions",
    "AipPaths",
    "ClientInfo",
    "Timeouts",
]
