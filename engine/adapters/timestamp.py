"""Wire time values (ISO 8601 instants, millisecond durations) read into engine types. Pure.

Never reads the clock: an instant on the wire is the server's claim, turned into an aware UTC value.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from engine.errors import ProtocolViolation


def parse_instant(text: str, field: str) -> datetime:
    """An ISO 8601 timestamp as aware UTC; a timestamp without zone is read as UTC."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ProtocolViolation(f"{field} is not an ISO 8601 timestamp: {text!r}") from exc
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def millis(value: int | None) -> timedelta | None:
    """A non-negative millisecond count as a duration; absent or negative means "not stated"."""
    if value is None or value < 0:
        return None
    return timedelta(milliseconds=value)


__all__ = [
    "millis",
    "parse_instant",
]
