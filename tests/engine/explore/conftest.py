"""Fixtures the explorer's tests share: one-line bugs in the shipped code the explorer must catch."""

from __future__ import annotations

import pytest

from engine.adapters.base import CancelResult
from engine.adapters.mcp_2026_07_28 import Mcp2026Backend
from engine.model import Operation
from service.explore_seat import plug_into_the_explorer

# The group scenarios run the service executor, which the engine does not import: plug it in as
# every composition root does.
plug_into_the_explorer()


@pytest.fixture
def ack_taken_as_confirmed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-line adapter bug: the 2026-07-28 cancel acknowledgement read as a confirmed cancel."""
    original = Mcp2026Backend.cancel

    async def cancel(self: Mcp2026Backend, op: Operation) -> CancelResult:
        await original(self, op)
        return CancelResult.CONFIRMED

    monkeypatch.setattr(Mcp2026Backend, "cancel", cancel)
