"""The ``finality`` command line: parse, call the engine, print, and exit with a meaningful code.

Exit codes: 0 done (a terminal receipt exists), 2 usage or configuration error (or a call the
server/tool cannot run within the given limits), 3 the call ended without a receipt (reconciliation,
approval pending, wait budget spent). Presentation only: no rule lives here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from contextlib import closing
from datetime import timedelta
from typing import TYPE_CHECKING

from engine.adapters.config import AdapterOptions
from engine.arrow import skip_pandas_probe
from engine.clock import SystemClock
from engine.errors import (
    BackendError,
    ConfigError,
    EngineError,
    IdentifierRefused,
    LedgerError,
    LedgerUnavailable,
    NegotiationError,
)
from engine.errors import ServiceRefused as ServiceRefusedError
from engine.limits import check_call_node, check_principal, encoded_size
from service.auth import ROLES, TOKEN_ENV, check_bind, new_token, token_hash
from service.config import LimitsConfig

if TYPE_CHECKING:  # both ledgers (DuckDB, PostgreSQL) offer this port
    from engine.ledger.port import LedgerPort
from engine.model import RECEIPT_STATES, ToolRef
from engine.runtime.call import CallSpec, run_call
from engine.runtime.report import operation_report

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NO_RECEIPT = 3

DEFAULT_SERVICE_URL = "http://127.0.0.1:8700"
"""Where ``finality serve`` listens unless told otherwise (its ``--port`` default)."""


def default_service_url() -> str:
    """The service the commands talk to: ``FINALITY_SERVICE_URL`` if set, else the local default port."""
    return os.environ.get("FINALITY_SERVICE_URL", "").strip() or DEFAULT_SERVICE_URL


def _seconds(text: str) -> timedelta:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from exc
    if value < 0:
        raise argparse.ArgumentTypeError("seconds must not be negative")
    return timedelta(seconds=value)


def _json_object(text: str) -> dict[str, object]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="finality", description=__doc__)
    parser.add_argument(
        "--token",
        help="the control API token (default: $FINALITY_TOKEN); the actor recorded is its principal",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    token = sub.add_parser("token", help="make a new API token for the [auth] table (README: Who may act)")
    token_actions = token.add_subparsers(dest="token_command", required=True)
    new = token_actions.add_parser("new", help="print a fresh token and the TOML entry that admits it")
    new.add_argument("--principal", required=True)
    new.add_argument("--role", action="append", required=True, help="repeatable; one of " + ", ".join(ROLES))
    new.add_argument("--id", help="the token's name in the configuration (default: the principal)")

    call = sub.add_parser("call", help="drive one long-running tool call to its end")
    call.add_argument("--server", required=True, help="MCP endpoint URL, or AIP-151 service root")
    call.add_argument(
        "--protocol",
        default="auto",
        choices=["auto", "mcp-2025-11-25", "mcp-2026-07-28", "aip-151", "legacy-sync"],
    )
    call.add_argument("--tool", required=True)
    call.add_argument("--tool-version", default="unversioned")
    call.add_argument("--descriptor-version", default="1")
    call.add_argument("--side-effect-free", action="store_true", help="declare the tool free of side effects")
    call.add_argument("--args", type=_json_object, default={}, help="tool arguments, a JSON object")
    call.add_argument("--call-node", required=True)
    call.add_argument("--ledger", required=True)
    call.add_argument("--principal", default="anonymous")
    call.add_argument(
        "--max-argument-bytes",
        type=int,
        default=LimitsConfig().body_bytes,
        help="refuse arguments larger than this as compact JSON (default: the service's body limit)",
    )
    call.add_argument("--token")
    call.add_argument("--cancel-after", type=_seconds, metavar="SECONDS")
    call.add_argument("--wait-budget", type=_seconds, default=timedelta(minutes=15), metavar="SECONDS")
    call.add_argument(
        "--sync-limit", type=_seconds, metavar="SECONDS", help="the tool's published synchronous limit"
    )
    call.add_argument("--answer", type=_json_object, help="answer every input round with this JSON object")
    call.add_argument(
        "--request-id-dedupe",
        action="store_true",
        help="AIP-151: the service deduplicates request_id, so a lost submission may be looked up by key",
    )
    call.add_argument("--json", action="store_true")

    show = sub.add_parser("show", help="print a call node's operation from the ledger")
    show.add_argument("--call-node", required=True)
    show.add_argument("--ledger", required=True)
    show.add_argument("--json", action="store_true")

    gates = sub.add_parser(
        "gates", help="the six release gates: from the running service, or from a ledger file while none runs"
    )
    _service_or_ledger(gates)
    gates.add_argument("--json", action="store_true")
    gates.add_argument("--qps", type=float, help="override the configured QPS cap (ledger file only)")
    gates.add_argument("--no-record", action="store_true", help="do not append this evaluation to gate_runs")

    sub.add_parser(
        "explore", help="deterministic race explorer (see `finality explore --help`)", add_help=False
    )

    ref = sub.add_parser("refserver", help="run a reference task server", add_help=False)
    ref.add_argument("rest", nargs=argparse.REMAINDER)

    serve = sub.add_parser("serve", help="run the executor and the control API (owns the ledger)")
    serve.add_argument(
        "--ledger",
        help="ledger file, or postgresql://... URL shared by several executors (default: the config's 'ledger')",
    )
    serve.add_argument("--config", required=True, help="TOML configuration")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8700)
    serve.add_argument("--seed", type=int, help="seed for poll jitter (reproducible schedules)")
    serve.add_argument(
        "--lease-s",
        type=float,
        help="PostgreSQL ledger: lease length in seconds (default: the config's lease_s)",
    )
    serve.add_argument(
        "--explore",
        type=int,
        metavar="N",
        help="meanwhile explore N interleavings of the shipped code and record them for the "
        "terminal_divergence gate (which needs 10,000)",
    )

    def service_command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument(
            "--service",
            default=default_service_url(),
            help=f"control API base URL (default: $FINALITY_SERVICE_URL or {DEFAULT_SERVICE_URL})",
        )
        p.add_argument("--json", action="store_true")
        return p

    service_command("health", "is the service up")
    submit = service_command("submit", "submit a call to the service")
    submit.add_argument("--call-node", required=True)
    submit.add_argument("--tool", required=True)
    submit.add_argument("--args", type=_json_object, default={})
    submit.add_argument("--principal")
    submit.add_argument(
        "--wait",
        type=float,
        nargs="?",
        const=60.0,
        default=None,
        metavar="SECONDS",
        help="wait (the service holds the answer; default 60 s) until the call holds a receipt; "
        "exit 0 with the receipt, 3 when the wait ends first (the call goes on: nothing is cancelled)",
    )
    ops = service_command("ops", "list operations (a table; --json for JSON lines)")
    ops.add_argument("--state")
    ops.add_argument("--protocol")
    ops.add_argument("--tool")
    ops.add_argument("--limit", type=int, default=50)
    get = service_command("get", "show one operation (same object as 'show')")
    get.add_argument("--call-node", required=True)
    cancel = service_command("cancel", "request cancellation (recorded before it is sent)")
    cancel.add_argument("--call-node", required=True)
    cancel.add_argument("--actor", help="local mode only: with a token the actor is its principal")
    cancel.add_argument("--reason", required=True)
    service_command("approvals", "pending input rounds")
    answer = service_command("answer", "answer one input round")
    answer.add_argument("--operation", required=True)
    answer.add_argument("--round", type=int, required=True)
    answer.add_argument("--actor", help="local mode only: with a token the actor is its principal")
    answer.add_argument("--answer", type=_json_object, required=True)
    recon = service_command("reconcile", "list or resolve reconciliation entries")
    recon.add_argument("--resolve", type=int, metavar="ENTRY_ID")
    recon.add_argument("--actor")
    recon.add_argument("--reason")
    recon.add_argument("--task-id", help="bind an UNKNOWN operation to this server task")
    recon.add_argument("--absent", action="store_true", help="the server has no such operation")
    recon.add_argument("--all", action="store_true", help="include resolved entries")
    sql = sub.add_parser(
        "sql", help="read-only SQL: on the running service's snapshot, or on a ledger file while none runs"
    )
    _service_or_ledger(sql)
    sql.add_argument("--json", action="store_true")
    sql.add_argument("query")
    sql.add_argument("--max-rows", type=int, default=1000)
    export = sub.add_parser(
        "export", help="write every ledger table as Parquet (from a snapshot file or a PostgreSQL ledger)"
    )
    export.add_argument("--parquet", required=True, metavar="DIR", help="folder to write the files into")
    export.add_argument(
        "--ledger",
        required=True,
        help="a snapshot file (finality snapshot --out), a ledger file no service holds, or a postgresql:// URL",
    )
    export.add_argument("--json", action="store_true")
    snap = service_command("snapshot", "publish a snapshot of the service's ledger and copy it to a file")
    snap.add_argument("--out", required=True, help="where to write the snapshot (a DuckDB file)")
    _rollout_parsers(sub)
    return parser


# ------------------------------------------------------------------------------------------ rollout


def _service_or_ledger(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--service",
        help=f"control API base URL (default: $FINALITY_SERVICE_URL or {DEFAULT_SERVICE_URL}, when it answers)",
    )
    parser.add_argument("--ledger", help="a ledger file or postgresql:// URL, read while no service holds it")


def _pick_service(args: argparse.Namespace) -> str | None:
    """The service URL to use, or None for ``--ledger``: an explicit ``--service`` wins; with only
    ``--ledger``, the file (unless a service holds its lock: then that service); with neither, the
    default service, and a message naming ``--ledger`` when it does not answer."""
    from engine.errors import ServiceUnavailable
    from service.client import ServiceClient

    if args.service:
        return str(args.service)
    url = default_service_url()
    if args.ledger:
        return None
    try:
        with ServiceClient(url, timeout=5.0) as client:
            client.health()
    except ServiceUnavailable as exc:
        raise ConfigError(
            "--service/--ledger", f"no service answers at {url} ({exc}); pass --ledger FILE to read a ledger"
        ) from exc
    return url


def _ledger_or_service(args: argparse.Namespace, read: object) -> tuple[object, str | None]:
    """Run ``read(ledger_target)``; when the file is locked by a running service that answers, say
    so and return ``(None, url)`` so the caller asks that service instead."""
    from engine.errors import ServiceUnavailable
    from service.client import ServiceClient

    try:
        return read(args.ledger), None  # type: ignore[operator]
    except Exception as exc:  # DuckDB says "Could not set lock" with its own IOException
        if "lock" not in str(exc).lower():
            raise
        url = default_service_url()
        try:
            with ServiceClient(url, timeout=5.0) as client:
                client.health()
        except ServiceUnavailable:
            raise LedgerError(
                f"{args.ledger} is locked by another process; pass --service URL of the service that holds it"
            ) from exc
        print(f"finality: {args.ledger} is held by the service at {url}; asking it instead", file=sys.stderr)
        return None, url


def _percent(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r}") from exc
    return value


def _rollout_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rollout = sub.add_parser(
        "rollout", help="shadow, canary, promote, roll back, kill switch (through the service)"
    )
    actions = rollout.add_subparsers(dest="rollout_command", required=True)

    def action(name: str, help_text: str, *, acts: bool = True) -> argparse.ArgumentParser:
        p = actions.add_parser(name, help=help_text)
        p.add_argument("--service", default="http://127.0.0.1:8700", help="control API base URL")
        p.add_argument("--json", action="store_true")
        if acts:
            p.add_argument(
                "--actor", help="local mode only: with a token the actor recorded is the token's principal"
            )
            p.add_argument("--reason", required=True, help="why (recorded in the audit log)")
        return p

    action("status", "stage, canary share, epoch, kill switch, shadow divergence, gates", acts=False)
    shadow = action("shadow", "shadow side-effect-free tools on the new adapter (off -> shadow)")
    shadow.add_argument(
        "--tool", action="append", default=[], help="tool to shadow (repeatable; default: all eligible)"
    )
    canary = action("canary", "route PCT %% of new calls to the new adapter (5 %% at most first)")
    canary.add_argument("percentage", type=_percent, metavar="PCT")
    canary.add_argument("--override", action="store_true", help="go ahead although a gate fails (recorded)")
    promote = action("promote", "canary -> full (blocked while a gate fails)")
    promote.add_argument("--override", action="store_true", help="go ahead although a gate fails (recorded)")
    action("rollback", "new calls to the old path, raise the epoch, adopt in-flight operations")
    for name, text in (
        ("disable-protocol", "refuse new calls on an adapter protocol version"),
        ("enable-protocol", "accept new calls on a disabled protocol version again"),
    ):
        p = action(name, text)
        p.add_argument("protocol", metavar="VERSION", help="e.g. mcp-2025-11-25")
    events = action("events", "the audit log, newest first", acts=False)
    events.add_argument("--limit", type=int, default=50)
    diffs = action("diffs", "shadow comparisons, newest first", acts=False)
    diffs.add_argument("--diverged", action="store_true", help="only pairs that diverged")
    diffs.add_argument("--limit", type=int, default=50)

    audit = sub.add_parser("audit", help="check the rollout audit log")
    audit_actions = audit.add_subparsers(dest="audit_command", required=True)
    verify = audit_actions.add_parser(
        "verify", help="detect edited, deleted or reordered rollout_events rows"
    )
    where = verify.add_mutually_exclusive_group()
    where.add_argument("--ledger", help="ledger file (read-only; only while no service holds it)")
    where.add_argument("--service", help="control API base URL (default when --ledger is not given)")
    verify.add_argument("--json", action="store_true")


def _print_rollout_status(status: dict[str, object]) -> None:
    print(
        f"stage       {status['stage']}   new-adapter share {status['percentage']}%   epoch {status['epoch']}"
    )
    shadowed = status["shadow_tools"]
    assert isinstance(shadowed, list)
    print(f"salt        {status['salt']}   shadowed tools {', '.join(map(str, shadowed)) or '-'}")
    kill = status.get("kill_switch") or []
    assert isinstance(kill, list)
    for row in kill:
        print(
            f"disabled    {row['protocol']}: {row['remaining']} operation(s) still to finish {row['remaining_by_state']}"
        )
    shadow = status.get("shadow")
    if isinstance(shadow, dict) and shadow.get("shadow_operations"):
        print(
            f"shadow      {shadow['compared']} compared, {shadow['diverged']} diverged "
            f"(status {shadow['status_differs']}, result {shadow['result_differs']}), "
            f"{shadow['awaiting_comparison']} awaiting"
        )
    print(f"fenced      {status['fenced_replies']} stale-epoch replies refused")
    gates = status["gates"]
    assert isinstance(gates, dict)
    print(f"gates       {'all pass' if gates['passed'] else 'FAIL'}")
    for line in gates["failing"]:
        print(f"  FAIL {line}")
    audit = status["audit"]
    assert isinstance(audit, dict)
    print(
        f"audit       {audit['events']} events, {'verified' if audit['verified'] else 'BROKEN: ' + str(audit['detail'])}"
    )


def cmd_rollout(args: argparse.Namespace) -> int:
    from service.client import ServiceClient

    command = args.rollout_command
    with ServiceClient(args.service) as client:
        if command == "status":
            status = client.rollout_status()
            if args.json:
                print(json.dumps(status, default=str))
            else:
                _print_rollout_status(status)
            return EXIT_OK
        if command == "events":
            _emit(client.rollout_events(limit=args.limit), args.json)
            return EXIT_OK
        if command == "diffs":
            _emit(client.shadow_diffs(diverged=args.diverged, limit=args.limit), args.json)
            return EXIT_OK
        body: dict[str, object] = {"reason": args.reason}
        if args.actor:
            body["actor"] = args.actor
        if command == "shadow" and args.tool:
            body["tools"] = args.tool
        if command == "canary":
            body["percentage"] = args.percentage
        if command in ("canary", "promote") and args.override:
            body["override"] = True
        if command in ("disable-protocol", "enable-protocol"):
            body["protocol"] = args.protocol
        result = client.rollout(command, body)
    if args.json:
        print(json.dumps(result, default=str))
        return EXIT_OK
    after = result["after"]
    print(
        f"#{result['seq']} {result['action']} by {result['actor']}: now {after['stage']} "
        f"({after['canary_percent']}% canary), epoch {after['epoch']}"
    )
    detail = result.get("detail") or {}
    if result.get("override"):
        print("OVERRIDE: promoted although these gates fail:")
        for gate in detail.get("overridden_gates", []):
            print(f"  {gate['summary']}")
    flips = detail.get("arm_flips")
    if flips:
        print(
            f"arm flips: {flips['keys_flipped']} of {flips['keys_considered']} known keys change arm "
            f"({flips['to_canary']} to canary, {flips['to_control']} to control); "
            f"{flips['in_flight_affected']} in flight finish where they are"
        )
    adoption = result.get("adoption")
    if adoption:
        print(
            f"epoch {adoption['from_epoch']} -> {adoption['to_epoch']}: adopted {adoption['adopted']} "
            f"in-flight operation(s) {adoption['adopted_by_state']}"
        )
    return EXIT_OK


def cmd_audit(args: argparse.Namespace) -> int:
    if args.ledger:
        from rollout.controller import verify_ledger

        with closing(_open(args.ledger, read_only=True)) as ledger:
            report = verify_ledger(ledger).as_json()
    else:
        from service.client import ServiceClient

        with ServiceClient(args.service or "http://127.0.0.1:8700") as client:
            report = client.rollout_audit()
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{report['checked']} rollout event(s) checked: {'chain intact' if report['ok'] else 'CHAIN BROKEN'}"
        )
        problems = report["problems"]
        assert isinstance(problems, list)
        for problem in problems:
            print(f"  {problem}")
    return EXIT_OK if report["ok"] else 1


def _print_report(report: dict[str, object], as_json: bool) -> None:
    if as_json:
        print(json.dumps(report, default=str))
        return
    receipt = report["receipt"]
    print(f"call node   {report['call_node']}")
    print(f"operation   {report['operation_id']} ({report['protocol']}, task {report['task_id']})")
    print(f"state       {report['state']}   server status {report['server_status']}")
    print(f"receipt     {json.dumps(receipt) if receipt else 'none'}")
    if report["effect_reconciliation_required"]:
        print("EFFECT_RECONCILIATION_REQUIRED: the cancelled work may have had effects")
    transitions = report["transitions"]
    assert isinstance(transitions, list)
    for row in transitions:
        mark = "" if row["accepted"] else "  (rejected)"
        print(f"  {row['at']}  {row['from']} -> {row['to']}  {row['event']}  {row['cause']}{mark}")


def _open(target: str, *, read_only: bool = False) -> LedgerPort:
    """A DuckDB file or a ``postgresql://`` URL (``engine.ledger.open_ledger``)."""
    from engine.ledger import open_ledger

    return open_ledger(target, read_only=read_only)


def cmd_call(args: argparse.Namespace) -> int:
    # The control API's identifier rules and argument limit hold here too, before the ledger opens.
    for flag, check, value in (
        ("--call-node", check_call_node, args.call_node),
        ("--principal", check_principal, args.principal),
    ):
        try:
            check(value)
        except IdentifierRefused as exc:
            raise ConfigError(flag, str(exc)) from exc
    size = encoded_size(args.args)
    if size > args.max_argument_bytes:
        raise ConfigError(
            "--args", f"arguments of {size} bytes exceed the limit of {args.max_argument_bytes} bytes"
        )
    tool = ToolRef(
        name=args.tool,
        version=args.tool_version,
        descriptor_version=args.descriptor_version,
        side_effects=not args.side_effect_free,
    )
    spec = CallSpec(
        server=args.server,
        protocol=args.protocol,
        tool=tool,
        arguments=args.args,
        call_node=args.call_node,
        principal=args.principal,
        token=args.token,
        wait_budget=args.wait_budget,
        cancel_after=args.cancel_after,
        sync_limit=args.sync_limit,
        answer=args.answer,
        options=AdapterOptions(request_id_dedupe=args.request_id_dedupe),
    )
    with closing(_open(args.ledger)) as ledger:
        op = asyncio.run(run_call(spec, ledger, SystemClock()))
        report = operation_report(ledger, op.call_node_id)
    assert report is not None
    _print_report(report, args.json)
    return EXIT_OK if op.state in RECEIPT_STATES else EXIT_NO_RECEIPT


def cmd_show(args: argparse.Namespace) -> int:
    with closing(_open(args.ledger, read_only=True)) as ledger:
        report = operation_report(ledger, args.call_node)
    if report is None:
        print(f"finality: no operation for call node {args.call_node!r}", file=sys.stderr)
        return EXIT_USAGE
    _print_report(report, args.json)
    return EXIT_OK if report["terminal"] else EXIT_NO_RECEIPT


def cmd_gates(args: argparse.Namespace) -> int:
    from rollout.gates import Thresholds, evaluate

    url = _pick_service(args)
    body: dict[str, object] | None = None
    if url is None:

        def read(target: str) -> dict[str, object]:
            clock = SystemClock()
            with closing(_open(target, read_only=args.no_record)) as ledger:
                report = evaluate(ledger.gate_inputs(clock.now()), Thresholds(qps=args.qps))
                run_id = None if args.no_record else ledger.record_gate_run(report.results, clock.now())
            return {
                "run_id": run_id,
                "passed": report.passed,
                "gates": [_gate_json(r) for r in report.results],
            }

        found, url = _ledger_or_service(args, read)
        body = found if isinstance(found, dict) else None
    if body is None:
        from service.client import ServiceClient

        if args.qps is not None:
            raise ConfigError(
                "--qps", "a QPS override is evaluated on a ledger file (--ledger), not the service"
            )
        assert url is not None
        with ServiceClient(url) as client:
            body = client.gates(record=not args.no_record)
    passed = bool(body.get("passed"))
    if args.json:
        print(json.dumps(body, default=str))
    else:
        _print_gates(body)
    return EXIT_OK if passed else 1


def _gate_json(r: object) -> dict[str, object]:
    from engine.model import GateRecord

    assert isinstance(r, GateRecord)
    return {
        "gate": r.gate,
        "passed": r.passed,
        "value": r.value,
        "threshold": r.threshold,
        "verdict": r.verdict,
        "inputs": r.inputs,
    }


def _print_gates(body: dict[str, object]) -> None:
    from rollout.gates import gate_threshold, gate_value

    gates = body.get("gates") or []
    assert isinstance(gates, list)
    rows = [
        [
            "PASS" if g.get("passed") else "FAIL",
            str(g.get("gate")),
            gate_value(str(g.get("gate")), g.get("value")),
            gate_threshold(str(g.get("gate")), g.get("threshold")),
            str(g.get("verdict")),
        ]
        for g in gates
    ]
    _print_table(["", "gate", "value", "passes when", "verdict"], rows)
    failing = sum(1 for g in gates if not g.get("passed"))
    run = f" (recorded as run #{body['run_id']})" if body.get("run_id") is not None else ""
    print(("all gates pass" if not failing else f"{failing} gate(s) fail") + run)


def _print_table(header: list[str], rows: list[list[str]], *, max_width: int = 60) -> None:
    """Columns padded to their widest cell (a cell longer than ``max_width`` is cut with an ellipsis)."""
    cut = [[c if len(c) <= max_width else c[: max_width - 1] + "…" for c in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cut) for i in range(len(header))]
    for row in cut:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


_OPS_COLUMNS = ("call_node_id", "state", "protocol", "tool_name", "created_at", "updated_at")


def _print_ops(rows: list[dict[str, object]]) -> None:
    columns = [c for c in _OPS_COLUMNS if any(c in r for r in rows)] or list(_OPS_COLUMNS)
    table = [
        [_short_time(r.get(c)) if c.endswith("_at") else str(r.get(c) or "") for c in columns] for r in rows
    ]
    _print_table([c.removesuffix("_id").removesuffix("_name") for c in columns], table)
    print(f"{len(rows)} operation(s), newest first (--json for every field)")


def _short_time(value: object) -> str:
    text = "" if value is None else str(value)
    return text.replace("T", " ")[:19]


def _print_reconciliation(entries: list[dict[str, object]]) -> None:
    """One line per entry: id, kind, operation, age, reason and the candidates as a count and a sample."""
    from datetime import datetime

    now = SystemClock().now()
    rows = []
    for e in entries:
        raw = e.get("candidates")
        try:
            candidates = json.loads(raw) if isinstance(raw, str) else (raw or [])
        except json.JSONDecodeError:
            candidates = [raw]
        listed = candidates if isinstance(candidates, list) else [candidates]
        sample = ", ".join(str(c) for c in listed[:3]) + (
            f" (+{len(listed) - 3} more)" if len(listed) > 3 else ""
        )
        opened = e.get("opened_at")
        age = ""
        if opened is not None:
            try:
                at = datetime.fromisoformat(str(opened))
                age = f"{(now - at).total_seconds() / 60:.1f} min"
            except ValueError:
                age = str(opened)
        rows.append(
            [
                str(e.get("entry_id")),
                str(e.get("kind")),
                str(e.get("status")),
                str(e.get("operation_id"))[:13],
                age,
                str(e.get("reason")),
                f"{len(listed)}: {sample}" if listed else "none",
            ]
        )
    _print_table(["entry", "kind", "status", "operation", "age", "reason", "candidates"], rows, max_width=48)
    print(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} (--json for every field and candidate)")


def cmd_export(args: argparse.Namespace) -> int:
    from engine.ledger import is_postgres

    try:
        ledger = _open(args.ledger, read_only=True)
    except LedgerUnavailable as exc:
        if is_postgres(args.ledger) or "lock" not in str(exc).lower():
            raise
        raise LedgerUnavailable(
            f"{exc} -- a running service holds its ledger file: export a snapshot of it instead "
            "(finality snapshot --out FILE, then finality export --ledger FILE)"
        ) from exc
    with closing(ledger):
        written = ledger.export_parquet(args.parquet)
    if args.json:
        print(json.dumps(written))
    else:
        for table, rows in written.items():
            print(f"{table}\t{rows:,} rows")
        print(f"{len(written)} tables written to {args.parquet}")
    return EXIT_OK


def cmd_sql(args: argparse.Namespace) -> int:
    url = _pick_service(args)
    result: dict[str, object] | None = None
    if url is None:
        from engine.ledger.sandbox import run_query

        found, url = _ledger_or_service(
            args, lambda target: run_query(target, args.query, max_rows=args.max_rows).as_json()
        )
        result = found if isinstance(found, dict) else None
    if result is None:
        from service.client import ServiceClient

        assert url is not None
        with ServiceClient(url) as client:
            result = client.sql(args.query, max_rows=args.max_rows)
    if args.json:
        print(json.dumps(result, default=str))
        return EXIT_OK
    columns = result["columns"]
    rows = result["rows"]
    assert isinstance(columns, list)
    assert isinstance(rows, list)
    print("\t".join(str(c) for c in columns))
    for row in rows:
        print("\t".join("" if v is None else str(v) for v in row))
    if result.get("truncated"):
        print(f"(truncated at {len(rows)} rows)", file=sys.stderr)
    return EXIT_OK


def cmd_token(args: argparse.Namespace) -> int:
    """Print a fresh token (shown once: only its hash goes into the configuration)."""
    for role in args.role:
        if role not in ROLES:
            raise ConfigError("--role", f"unknown role {role!r} (one of {', '.join(ROLES)})")
    principal = check_principal(args.principal)
    secret = new_token()
    print(f"token (shown once; give it to {principal}, keep only the hash):\n  {secret}\n")
    print("add to the service configuration (read again on change, no restart):\n")
    print(f"[auth.tokens.{json.dumps(args.id or principal)}]")
    print(f'sha256 = "{token_hash(secret)}"')
    print(f"principal = {json.dumps(principal)}")
    print(f"roles = {json.dumps(args.role)}")
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    import logging

    from service import event_loop
    from service.config import load_config
    from service.serve import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = load_config(args.config)
    check_bind(args.host, config.auth)
    ledger = args.ledger or config.ledger
    if ledger is None:
        raise ConfigError("--ledger", "no ledger given (and the config names none)")
    event_loop.run(
        serve(
            config,
            ledger,
            host=args.host,
            port=args.port,
            seed=args.seed,
            lease_s=args.lease_s,
            explore=args.explore,
        )
    )
    return EXIT_OK


def _emit(value: object, as_json: bool) -> None:
    if as_json or not isinstance(value, list):
        print(json.dumps(value, default=str, indent=None if as_json else 2))
        return
    for row in value:
        print(json.dumps(row, default=str))


def cmd_service(args: argparse.Namespace) -> int:
    from service.client import ServiceClient

    with ServiceClient(args.service) as client:
        match args.command:
            case "health":
                _emit(client.health(), args.json)
            case "submit" if args.wait is not None:
                report = client.submit_and_wait(
                    call_node=args.call_node,
                    tool=args.tool,
                    arguments=args.args,
                    principal=args.principal,
                    wait_s=args.wait,
                )
                _print_report(report, args.json)
                return EXIT_OK if report.get("receipt") is not None else EXIT_NO_RECEIPT
            case "submit":
                _emit(
                    client.submit(
                        call_node=args.call_node,
                        tool=args.tool,
                        arguments=args.args,
                        principal=args.principal,
                    ),
                    args.json,
                )
            case "ops":
                rows = client.operations(
                    state=args.state, protocol=args.protocol, tool=args.tool, limit=args.limit
                )
                if args.json:
                    for row in rows:
                        print(json.dumps(row, default=str))
                else:
                    _print_ops(rows)
            case "get":
                report = client.show(args.call_node)
                _print_report(report, args.json)
                return EXIT_OK if report.get("terminal") else EXIT_NO_RECEIPT
            case "cancel":
                _print_report(client.cancel(args.call_node, actor=args.actor, reason=args.reason), args.json)
            case "approvals":
                _emit(client.approvals(), args.json)
            case "answer":
                _print_report(
                    client.answer(args.operation, args.round, actor=args.actor, answer=args.answer), args.json
                )
            case "reconcile":
                if args.resolve is None:
                    entries = client.reconciliation(include_resolved=args.all)
                    if args.json:
                        for entry in entries:
                            print(json.dumps(entry, default=str))
                    else:
                        _print_reconciliation(entries)
                else:
                    if not args.reason:
                        raise ConfigError("--reason", "resolving needs a reason")
                    _emit(
                        client.resolve(
                            args.resolve,
                            actor=args.actor,
                            reason=args.reason,
                            task_id=args.task_id,
                            absent=args.absent,
                        ),
                        args.json,
                    )
            case "snapshot":
                made = client.publish_snapshot()
                path = client.download_snapshot(str(made["name"]), args.out)
                made = {**made, "out": str(path)}
                if args.json:
                    print(json.dumps(made, default=str))
                else:
                    print(f"snapshot as of {made['as_of']} written to {path} ({made['bytes']:,} bytes)")
    return EXIT_OK


_SERVICE_COMMANDS = {
    "health",
    "submit",
    "ops",
    "get",
    "cancel",
    "approvals",
    "answer",
    "reconcile",
    "snapshot",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; a reader that closes the pipe early (``| head``) ends it quietly."""
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Python would print a traceback flushing stdout at exit: point it at /dev/null instead.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


def _main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["explore"]:
        from engine.explore.cli import main as explore_main
        from service.explore_seat import plug_into_the_explorer

        plug_into_the_explorer()  # the group scenarios run this service's own executor
        return explore_main(argv[1:])
    if argv[:1] == ["refserver"]:
        from refserver.cli import main as refserver_main

        return refserver_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    # No command holds a pandas object: pyarrow must not import pandas to ask (engine.arrow).
    skip_pandas_probe()
    if args.token:
        # Every ServiceClient this command makes presents it (service.client reads the variable).
        os.environ[TOKEN_ENV] = args.token
    try:
        match args.command:
            case "token":
                return cmd_token(args)
            case "call":
                return cmd_call(args)
            case "show":
                return cmd_show(args)
            case "serve":
                return cmd_serve(args)
            case "gates":
                return cmd_gates(args)
            case "export":
                return cmd_export(args)
            case "sql":
                return cmd_sql(args)
            case "rollout":
                return cmd_rollout(args)
            case "audit":
                return cmd_audit(args)
            case command if command in _SERVICE_COMMANDS:
                return cmd_service(args)
    except ServiceRefusedError as exc:
        print(f"finality: {exc}", file=sys.stderr)
        if exc.retry_after is not None:
            print(f"finality: the service asks to retry in {exc.retry_after} s", file=sys.stderr)
        return EXIT_USAGE if exc.status in (400, 404, 409, 413, 422) else EXIT_NO_RECEIPT
    except (ConfigError, LedgerError, NegotiationError) as exc:
        print(f"finality: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BackendError as exc:
        print(f"finality: server: {exc}", file=sys.stderr)
        return EXIT_NO_RECEIPT
    except EngineError as exc:
        print(f"finality: {exc}", file=sys.stderr)
        return EXIT_NO_RECEIPT
    except KeyboardInterrupt:
        print("finality: stopped waiting (the operation goes on; this is not a cancel)", file=sys.stderr)
        return EXIT_NO_RECEIPT
    parser.error(f"unknown command {args.command}")
    return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "DEFAULT_SERVICE_URL",
    "EXIT_NO_RECEIPT",
    "EXIT_OK",
    "EXIT_USAGE",
    "build_parser",
    "cmd_audit",
    "cmd_call",
    "cmd_export",
    "cmd_gates",
    "cmd_rollout",
    "cmd_serve",
    "cmd_service",
    "cmd_show",
    "cmd_sql",
    "cmd_token",
    "default_service_url",
    "main",
]
