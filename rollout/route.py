"""Routing of a new call: which server it goes to, on which arm, and whether a shadow runs beside it.

Pure: the executor asks a ``Router`` (the rollout state plus each tool's old and new server and
each server's protocol) for every new call node and records the answer. Existing operations are
never routed again: an operation stays on the server it was submitted to until it is terminal.

The protocol kill switch: a new call whose server speaks a disabled protocol is sent to the
tool's other path when that is safe (back to the old path always; on to the new path only while
the canary or full stage already sends traffic there), and refused with 409 otherwise. A shadow
on a disabled protocol is simply not started.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from engine.errors import RolloutRefused
from rollout.assign import Arm, arm_for, bucket
from rollout.plan import RolloutState, Stage, ToolInfo


@dataclass(frozen=True, slots=True)
class ToolPaths:
    """A tool's old path (its configured server) and new path (its ``shadow_server``), by server name."""

    name: str
    old_server: str
    new_server: str | None
    side_effect_free: bool

    @property
    def info(self) -> ToolInfo:
        return ToolInfo(self.name, self.side_effect_free, self.new_server is not None)


@dataclass(frozen=True, slots=True)
class Route:
    server: str
    arm: Arm
    bucket: int
    shadow_server: str | None = None
    rerouted_from: str | None = None
    """The server the arm chose, when the kill switch sent the call elsewhere."""


@dataclass
class Router:
    """The rollout state in force plus the static paths; ``state`` is replaced after every action."""

    state: RolloutState
    tools: Mapping[str, ToolPaths]
    protocols: Mapping[str, str]
    """Server name -> protocol version it speaks (as negotiated)."""

    def _disabled(self, server: str) -> bool:
        return self.protocols.get(server) in self.state.disabled_protocols

    def route(self, call_node: str, tool: str) -> Route:
        """Where a new call node goes.

        Raises:
            RolloutRefused: 400 for an unknown tool; 409 when its server's protocol is disabled and
                no other path may take it.
        """
        paths = self.tools.get(tool)
        if paths is None:
            raise RolloutRefused(400, f"unknown tool {tool!r}")
        state = self.state
        b = bucket(call_node, state.salt)
        if paths.new_server is None:
            arm = Arm.FIXED
        elif state.stage is Stage.FULL:
            arm = Arm.CANARY
        elif state.stage is Stage.CANARY:
            arm = arm_for(call_node, state.salt, state.canary_bp)
        else:
            arm = Arm.CONTROL
        chosen = paths.new_server if arm is Arm.CANARY and paths.new_server else paths.old_server
        shadow = None
        if (
            state.stage is Stage.SHADOW
            and tool in state.shadow_tools
            and paths.side_effect_free
            and paths.new_server is not None
            and not self._disabled(paths.new_server)
        ):
            shadow = paths.new_server
        if not self._disabled(chosen):
            return Route(chosen, arm, b, shadow)
        version = self.protocols.get(chosen)
        if arm is Arm.CANARY:
            if not self._disabled(paths.old_server):
                return Route(paths.old_server, Arm.CONTROL, b, None, rerouted_from=chosen)
        elif (
            paths.new_server is not None
            and state.stage in (Stage.CANARY, Stage.FULL)
            and not self._disabled(paths.new_server)
        ):
            return Route(paths.new_server, Arm.CANARY, b, None, rerouted_from=chosen)
        raise RolloutRefused(
            409,
            f"protocol {version} is disabled (kill switch): new calls to tool {tool!r} on server "
            f"{chosen!r} are refused; existing operations keep being polled, cancelled and reconciled. "
            f"Enable it with `finality rollout enable-protocol {version}`.",
        )


__all__ = [
    "Route",
    "Router",
    "ToolPaths",
]
