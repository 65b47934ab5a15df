"""Operations as the console shows them: arms and in-flight work, alerts, cancel latency, reconciliation,
the operations list and one operation's timeline, approvals; and a person's actions on them (resolve,
cancel, answer), sent through the source with the acting person's token."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import pandas as pd  # type: ignore[import-untyped]

from console.core import (
    InsightsCore,
    _all_arms,
    _choices,
    _limit,
    _missing,
    _op_filter,
    _path_part,
    _Raw,
    _required,
)
from console.queries import (
    ARMS,
    PROTOCOLS,
    STATES,
    lit_list,
)
from console.views import Json
from engine.errors import (
    ActionRefused,
)

__all__ = ["OperationReads"]


class OperationReads(InsightsCore):
    """Reads over operations and their open questions, and a person's actions on them."""

    # overview -------------------------------------------------------------------------------

    def arms(self) -> pd.DataFrame:
        """Operations and in-flight operations per arm (``last_assigned_at``: creation time on old ledgers)."""
        return self._named("arms" if self.has_table("rollout_assignments") else "arms_by_adapter")

    def in_flight(self) -> pd.DataFrame:
        return self._named("in_flight")

    def alerts(self) -> dict[str, float]:
        frame = self._named("alerts", now=self.now())
        row = frame.iloc[0].to_dict() if len(frame) else {}
        return {k: float(v) if v is not None and not pd.isna(v) else 0.0 for k, v in row.items()}

    # cancel latency -------------------------------------------------------------------------

    def cancel_span(self, *, since: datetime, until: datetime) -> datetime | None:
        """When the first confirmed cancel in ``[since, until)`` was accepted (None: there is none)."""
        frame = self._named("cancel_span", since=since, until=until)
        if frame.empty or _missing(frame.iloc[0]["first_at"]):
            return None
        first: datetime = frame.iloc[0]["first_at"].to_pydatetime()
        return first

    def cancel_latency_over_time(
        self,
        *,
        since: datetime,
        until: datetime,
        bucket: timedelta = timedelta(hours=1),
        by: str = "protocol",
        protocols: Sequence[str] = PROTOCOLS,
        arms: Sequence[str] = ARMS,
    ) -> pd.DataFrame:
        group = {"protocol": "protocol", "arm": "arm", "all": "'all'"}[by]
        chosen = _choices(arms, ARMS)
        if by != "arm" and _all_arms(chosen):
            # Every operation's arm is one of ARMS, so all of them selected filters nothing: the
            # arm (a join with a million-row table) is not read at all.
            arm_parts: dict[str, object] = {
                "arm": _Raw("NULL"),
                "arm_join": _Raw(""),
                "arm_filter": _Raw("TRUE"),
            }
        else:
            arm_parts = {"arm_filter": _Raw(f"arm IN {lit_list(list(chosen))}")}
        return self._named(
            "cancel_latency_over_time",
            since=since,
            until=until,
            bucket=bucket,
            group=_Raw(group),
            protocols=_choices(protocols, PROTOCOLS),
            **arm_parts,
        )

    def cancel_latency_summary(
        self,
        *,
        since: datetime,
        until: datetime,
        protocols: Sequence[str] = PROTOCOLS,
        arms: Sequence[str] = ARMS,
    ) -> pd.DataFrame:
        return self._named(
            "cancel_latency_summary",
            since=since,
            until=until,
            protocols=_choices(protocols, PROTOCOLS),
            arms=_choices(arms, ARMS),
        )

    def slowest_cancels(
        self,
        *,
        since: datetime,
        until: datetime,
        protocols: Sequence[str] = PROTOCOLS,
        arms: Sequence[str] = ARMS,
        limit: int = 25,
    ) -> pd.DataFrame:
        chosen_protocols = _choices(protocols, PROTOCOLS)
        chosen_arms = _choices(arms, ARMS)
        if set(chosen_protocols) == set(PROTOCOLS) and _all_arms(chosen_arms):
            # Every operation's protocol is one of PROTOCOLS and its arm one of ARMS: nothing to filter.
            filter_join, where = "", "TRUE"
        else:
            arm, join = self._arm()
            filter_join = f"JOIN op_identity i USING (operation_id) {join}"
            where = (
                f"i.protocol IN {lit_list(list(chosen_protocols))} AND {arm} IN {lit_list(list(chosen_arms))}"
            )
        return self._named(
            "slowest_cancels",
            now=self.now(),
            since=since,
            until=until,
            filter_join=_Raw(filter_join),
            filter=_Raw(where),
            limit=_limit(limit),
        )

    # reconciliation -------------------------------------------------------------------------

    def unknown_age_histogram(
        self, *, kinds: Sequence[str] = ("unknown",), bin_min: int = 5, cap_min: int = 240
    ) -> pd.DataFrame:
        return self._named(
            "unknown_age_histogram",
            now=self.now(),
            kinds=_choices(kinds, ("unknown", "effects")),
            bin_min=max(1, int(bin_min)),
            cap_min=max(1, int(cap_min)),
        )

    def reconciliation_aging(
        self, *, kinds: Sequence[str] = ("unknown", "effects"), limit: int = 500
    ) -> pd.DataFrame:
        return self._named(
            "reconciliation_aging",
            now=self.now(),
            kinds=_choices(kinds, ("unknown", "effects")),
            limit=_limit(limit),
        )

    def reconciliation_resolved(self, *, limit: int = 50) -> pd.DataFrame:
        return self._named("reconciliation_resolved", limit=_limit(limit))

    def resolve(
        self,
        entry_id: int,
        *,
        actor: str,
        reason: str,
        task_id: str | None = None,
        absent: bool = False,
        token: str | None = None,
    ) -> Json:
        """Resolve a reconciliation entry (through the service: a person's decision, with actor and reason;
        ``token``: the signed-in person's, whose principal the service records as the actor)."""
        actor, reason = _required(actor, "actor"), _required(reason, "reason")
        body: Json = {
            "actor": actor,
            "reason": reason,
            "absent": absent,
            "task_id": (task_id or "").strip() or None,
        }
        result = self.source.resolve(int(entry_id), body, token)
        self.clear_cache()
        return result

    # operations -----------------------------------------------------------------------------

    def filter_options(self) -> dict[str, list[str]]:
        frame = self._named("filter_options")
        out: dict[str, list[str]] = {"protocol": [], "tool": [], "bounds": []}
        for field_name, value in frame.itertuples(index=False):
            if value is not None:
                out.setdefault(str(field_name), []).append(str(value))
        out["state"] = list(STATES)
        out["arm"] = list(ARMS)
        return out

    def operations(
        self,
        *,
        states: Sequence[str] = (),
        protocols: Sequence[str] = (),
        tools: Sequence[str] = (),
        arms: Sequence[str] = (),
        since: datetime | None = None,
        until: datetime | None = None,
        duplicated: bool = False,
        limit: int = 200,
    ) -> pd.DataFrame:
        """The newest operations matching the filters; ``duplicated``: only those the
        duplicate_operations gate counts (bound to a second server task)."""
        arm, join = self._arm()
        where = _op_filter(arm, states, protocols, tools, arms, since, until, duplicated)
        picking_join = join if arms else ""  # the arm is joined to the picked rows only, unless filtered on
        # Pick the newest ids first and join the rest to those only: a top-N over a million-row
        # join is what makes this slow, not the filters.
        candidates = f"op_identity i {picking_join}" + (
            " JOIN op_state s USING (operation_id)" if states or duplicated else ""
        )
        return self._named("operations", where=_Raw(where), candidates=_Raw(candidates), limit=_limit(limit))

    def operations_by_state(
        self,
        *,
        states: Sequence[str] = (),
        protocols: Sequence[str] = (),
        tools: Sequence[str] = (),
        arms: Sequence[str] = (),
        since: datetime | None = None,
        until: datetime | None = None,
        duplicated: bool = False,
    ) -> pd.DataFrame:
        arm, join = self._arm() if arms else ("", "")
        where = _op_filter(arm, states, protocols, tools, arms, since, until, duplicated)
        # Join only what the filter reads: op_state alone answers "per state" for everything.
        needs_identity = bool(protocols or tools or arms or since or until)
        source = "op_state s" + (f" JOIN op_identity i USING (operation_id) {join}" if needs_identity else "")
        return self._named("operations_by_state", where=_Raw(where), source=_Raw(source))

    def operation(self, key: str) -> dict[str, object] | None:
        """One operation by call node id or operation id (None if there is none)."""
        frame = self._named("operation", key=key.strip())
        if frame.empty:
            return None
        return {k: (None if _missing(v) else v) for k, v in frame.iloc[0].to_dict().items()}

    def timeline(self, key: str) -> pd.DataFrame:
        """Transitions, protocol requests and the receipt of one call node, in time order."""
        return self._named("operation_timeline", key=key.strip())

    def cancel(self, call_node: str, *, actor: str, reason: str, token: str | None = None) -> Json:
        body = {"actor": _required(actor, "actor"), "reason": _required(reason, "reason")}
        result = self.source.cancel(_path_part(call_node), body, token)
        self.clear_cache()
        return result

    # approvals ------------------------------------------------------------------------------

    def approvals_pending(self, *, limit: int = 200) -> pd.DataFrame:
        """Rounds a person can answer now, newest first: the operation is in INPUT_REQUIRED at this very
        round and the deadline has not passed (a round whose operation moved on is not listed)."""
        return self._named("approvals_pending", now=self.now(), limit=_limit(limit))

    def approvals_answered(self, *, limit: int = 50) -> pd.DataFrame:
        return self._named("approvals_answered", limit=_limit(limit))

    def answer(
        self, operation_id: str, input_round: int, *, actor: str, answer: Json, token: str | None = None
    ) -> Json:
        """Answer one input round; the service refuses (409) an answer to a round that is no longer open."""
        if not isinstance(answer, dict):
            raise ActionRefused(400, "an answer must be a JSON object")
        body = {"actor": _required(actor, "actor"), "answer": answer}
        result = self.source.answer(_path_part(operation_id), int(input_round), body, token)
        self.clear_cache()
        return result
