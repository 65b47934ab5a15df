"""The network's and the caller's steps of a run of the shipped code (a part of ``shipped.WireWorld``).

What the explorer may do to a message in flight (deliver, drop the request or only the reply, delay,
duplicate, throttle, truncate) and what the caller may do (click cancel, answer an input round),
each through the shipped code: the in-process network and the executor's own driver or service
seat. It judges nothing (``checks.RunChecks``) and keys nothing (``keys.StateKeys``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from engine.errors import BackendError, EngineError, LedgerError, NegotiationError
from engine.explore.checks import Kinds, RunChecks
from engine.explore.wire import Kind, Message

_EXCUSING = frozenset({Kind.SUBMIT, Kind.LOOKUP, Kind.RESULT})
"""Faults on these requests excuse an operation left for a person (the run was faulted)."""


class ActorSteps(RunChecks):
    """The steps of the network and of the caller; the world's state is ``WireWorld``'s."""

    drops: int
    delays: int
    dups: int
    throttles: int
    corrupts: int
    cancels: int
    answering: Any

    async def _network(self, verb: str, msg: Message) -> None:
        net = self.net
        if verb != "deliver" and msg.kind in _EXCUSING:
            self.faulted = True
        if verb == "deliver":
            if msg.reply is None:
                net.deliver(msg)
            else:
                net.deliver_reply(msg)
        elif verb == "drop":
            self.drops -= 1
            net.lose(msg, "request lost")
        elif verb == "drop-reply":
            self.drops -= 1
            net.lose(msg, "reply lost")
        elif verb == "delay":
            self.delays -= 1
            net.time_out(msg)
        elif verb == "duplicate":
            self.dups -= 1
            net.duplicate(msg)
        elif verb == "throttle":
            self.throttles -= 1
            net.throttle(msg)
        elif verb == "truncate":
            self.corrupts -= 1
            net.deliver_reply(msg, truncate=True)
        else:
            raise ValueError(f"unknown network step {verb!r}")

    def _caller(self, verb: str) -> None:
        op = self.ledger.get(self.op_id)
        assert op is not None
        inc = self.executors[self.active]
        if verb == "cancel":
            self.cancels -= 1
            try:
                if inc.seat is not None:
                    after = inc.seat.cancel(op, actor="caller", reason="cancel clicked")
                else:
                    after = inc.driver.request_cancel(op, actor="caller", reason="cancel clicked")
            except EngineError:
                return
            self.max_generation = max(self.max_generation, after.cancel_generation)
            return
        if verb == "answer":
            message = self._round_message(op.input_round) or ""
            round_ = op.input_round

            async def work() -> None:
                await inc.driver.answer(
                    op, input_round=round_, answer={"approve": True, "note": message}, actor="caller"
                )

            async def start() -> None:
                self.answering = self.loop.create_task(self._guard(work))

            self._run(start())
            return
        raise ValueError(f"unknown caller step {verb!r}")

    async def _guard(self, work: Callable[[], Any]) -> None:
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except EngineError as exc:
            # A refused answer (the round moved on) is the caller's problem, not a divergence.
            if isinstance(exc, LedgerError):
                self.findings.append((Kinds.REFUSED, f"{type(exc).__name__}: {exc}"))
                self.aborted = True
        except (BackendError, NegotiationError):
            pass  # the answer did not get through; the driver re-sends it when the round shows again


__all__ = ["ActorSteps"]
