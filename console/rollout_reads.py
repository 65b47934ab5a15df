"""The rollout as the console shows it: its status and actions, the outbox lag, shadow comparisons, refused
attempts and the audit log; and an analyst's own read-only SQL."""

from __future__ import annotations

import pandas as pd  # type: ignore[import-untyped]

from console.core import (
    InsightsCore,
    _choices,
    _limit,
    _required,
)
from console.queries import (
    PROTOCOLS,
    ROLLOUT_ACTIONS,
)
from console.views import Json, RolloutStatus, SqlResult, parse_rollout_status
from engine.errors import (
    ActionRefused,
)

__all__ = ["RolloutReads"]


class RolloutReads(InsightsCore):
    """The rollout's status, actions and records, downstream lag, and analysts' SQL."""

    # rollout --------------------------------------------------------------------------------

    def rollout_status(self) -> RolloutStatus | None:
        """The rollout as the service reports it; None when no service runs or it has no rollout API yet."""
        raw = self.source.rollout_status()
        return parse_rollout_status(raw) if raw is not None else None

    def rollout_action(
        self,
        action: str,
        *,
        actor: str,
        reason: str,
        percentage: float | None = None,
        protocol: str | None = None,
        token: str | None = None,
    ) -> Json:
        """Ask the service for a rollout action (``shadow``, ``canary``, ``promote``, ``rollback``, ...)."""
        if action not in ROLLOUT_ACTIONS:
            raise ActionRefused(400, f"unknown rollout action {action!r}")
        body: Json = {"actor": _required(actor, "actor"), "reason": _required(reason, "reason")}
        if percentage is not None:
            body["percentage"] = percentage
        if protocol is not None:
            body["protocol"] = _choices([protocol], PROTOCOLS)[0]
        result = self.source.rollout(action, body, token)
        self.clear_cache()
        return result

    def outbox_lag(self) -> pd.DataFrame | None:
        """Per downstream consumer: entries acknowledged and behind, its last acknowledgement, and the
        age in seconds of the oldest entry it has not acknowledged (None: a ledger without acks)."""
        if not self.has_table("outbox_acks"):
            return None
        frame = self._named("outbox_lag")
        now = pd.Timestamp(self.now())
        frame["oldest_waiting_s"] = [
            None if pd.isna(t) else (now - pd.Timestamp(t)).total_seconds()
            for t in frame["oldest_unacked_at"]
        ]
        return frame

    def shadow_summary(self) -> pd.DataFrame | None:
        """Per tool: the old path and the new one, pairs compared and diverged (None: no shadow table)."""
        if not self.has_table("shadow_diffs"):
            return None
        return self._named("shadow_summary")

    def shadow_diverged(self, *, limit: int = 100) -> pd.DataFrame | None:
        """Diverged shadow pairs, newest first, with both sides' call nodes (None: no shadow table)."""
        if not self.has_table("shadow_diffs"):
            return None
        return self._named("shadow_diverged", limit=_limit(limit))

    def access_denials(self, *, limit: int = 200) -> pd.DataFrame | None:
        """Refused control-API attempts (401/403), newest first; None while the ledger has no such table."""
        if not self.has_table("access_denials"):
            return None
        frame = self._named("access_denials", limit=_limit(limit))
        frame["recorded_at"] = pd.to_datetime(frame["recorded_at"], utc=True, format="ISO8601")
        return frame

    def audit_log(self, *, limit: int = 200) -> pd.DataFrame | None:
        """The rollout audit log (newest first), or None while the ledger has no ``rollout_events`` table."""
        if not self.has_table("rollout_events"):
            return None
        frame = self._named("audit_log", limit=_limit(limit))
        for column in frame.columns:
            if column.endswith("_at"):
                frame[column] = pd.to_datetime(frame[column], utc=True, format="ISO8601")
        return frame

    # SQL ------------------------------------------------------------------------------------

    def run_sql(self, sql: str, *, max_rows: int = 1000) -> SqlResult:
        """An analyst's own read-only query, through the sandbox (never cached)."""
        columns, rows, truncated, elapsed = self.source.query(sql, max(1, min(int(max_rows), 100_000)))
        return SqlResult(pd.DataFrame(rows, columns=columns), truncated, elapsed, sql)
