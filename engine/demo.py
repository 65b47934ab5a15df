"""``make demo``: a small living Finality on this machine, everything under ``data/demo/``.

Starts three reference servers (MCP 2025-11-25, the MCP tasks extension on 2026-07-28, AIP-151)
with realistic, time-scaled durations and a small rate of each seed fault; records a race-explorer
run into a fresh ledger; starts ``finality serve`` on that ledger; runs a workload generator
(calls, some cancels, a person answering approvals); and starts the Streamlit console. Prints the
console URL. Ctrl-C stops every process it started. A demo harness, not part of the engine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from engine.client import ServiceClient, ServiceRefused, ServiceUnavailable
from engine.service.testing import ServiceProcess, free_port
from refserver.testing import RefServer

ROOT = Path(__file__).resolve().parents[1]
FAULTS = [
    "create_response_lost",
    "poll_out_of_order",
    "input_replayed",
    "complete_on_cancel",
    "cancel_ack_lost",
    "result_lost",
    "result_truncated",
    "stale_epoch_result",
    "not_found_before_expiry",
    "poll_429",
    "poll_503",
    "connection_reset",
    "slow_response",
]


def fault_plan(rate: float, seed: int) -> dict[str, object]:
    return {"seed": seed, "rules": [{"fault": name, "tool": "*", "rate": rate} for name in FAULTS]}


def write_config(folder: Path, servers: dict[str, RefServer]) -> Path:
    config = folder / "finality.toml"
    config.write_text(
        f"""# Written by `make demo`.
global_qps = 60
rollout_salt = "demo"

[poll]
default_interval_ms = 500
min_interval_ms = 50
max_interval_ms = 5000
retry_backoff_ms = 100

[servers.reports]
url = "{servers["mcp25"].endpoint}"
protocol = "mcp-2025-11-25"
qps = 40

[servers.reports_next]
url = "{servers["mcp26"].endpoint}"
protocol = "mcp-2026-07-28"
qps = 40

[servers.uploads]
url = "{servers["aip"].url}"
protocol = "aip-151"
qps = 40

[tools.generate_report]
server = "reports"
shadow_server = "reports_next"
side_effect_free = true
version = "2.3.0"
wait_budget_s = 120

[tools.analyze_upload]
server = "uploads"
side_effect_free = true
version = "1.9.0"
wait_budget_s = 120

[tools.apply_batch_change]
server = "reports_next"
version = "0.8.0"
wait_budget_s = 120
"""
    )
    return config


def workload(url: str, stop: threading.Event, seed: int, rate: float) -> None:
    """Submit calls at ``rate`` per second; cancel a few; answer approvals like a person would."""
    rng = random.Random(seed)
    tools = ["generate_report", "generate_report", "analyze_upload", "apply_batch_change"]
    n = 0
    with ServiceClient(url, timeout=10) as client:
        while not stop.is_set():
            n += 1
            tool = rng.choice(tools)
            sim: dict[str, object] = {
                "duration_ms": rng.choice([20_000, 40_000, 90_000]),
                "ttl_ms": 3_600_000,
            }
            if tool == "generate_report" and rng.random() < 0.1:
                sim["input_rounds"] = 1
            if rng.random() < 0.05:
                sim["outcome"] = rng.choice(["failed", "is_error"])
            node = f"demo-{seed}-{n}"
            try:
                client.submit(call_node=node, tool=tool, arguments={"job": n, "_sim": sim})
                if rng.random() < 0.08:
                    threading.Timer(rng.uniform(1, 4), _cancel, args=(url, node)).start()
                for approval in client.approvals():
                    client.answer(
                        str(approval["operation_id"]),
                        int(str(approval["input_round"])),
                        actor="demo-approver",
                        answer={"approved": True},
                    )
                if n % 20 == 0:
                    client.gates(record=True)
            except (ServiceRefused, ServiceUnavailable) as exc:
                print(f"workload: {exc}", file=sys.stderr)
            stop.wait(1 / rate)


def _cancel(url: str, node: str) -> None:
    try:
        with ServiceClient(url, timeout=10) as client:
            client.cancel(node, actor="demo-operator", reason="the user closed the report")
    except (ServiceRefused, ServiceUnavailable):
        pass  # already finished: nothing to cancel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default=str(ROOT / "data" / "demo"))
    parser.add_argument("--time-scale", type=float, default=0.1, help="reference servers' time scale")
    parser.add_argument("--rate", type=float, default=2.0, help="calls per second")
    parser.add_argument("--fault-rate", type=float, default=0.02)
    parser.add_argument("--console-port", type=int, default=8501)
    parser.add_argument("--service-port", type=int, default=8700)
    parser.add_argument("--no-console", action="store_true")
    parser.add_argument("--seconds", type=float, help="stop by itself after this long")
    args = parser.parse_args(argv)
    data = Path(args.data)
    if data.exists():
        shutil.rmtree(data)
    data.mkdir(parents=True)
    ledger = data / "finality.duckdb"
    servers = {
        "mcp25": RefServer(
            "mcp-2025-11-25", time_scale=args.time_scale, fault_plan=fault_plan(args.fault_rate, 1)
        ),
        "mcp26": RefServer(
            "mcp-2026-07-28", time_scale=args.time_scale, fault_plan=fault_plan(args.fault_rate, 2)
        ),
        "aip": RefServer("aip-151", time_scale=args.time_scale, fault_plan=fault_plan(args.fault_rate, 3)),
    }
    stop = threading.Event()
    console: subprocess.Popen[bytes] | None = None
    service: ServiceProcess | None = None
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        for server in servers.values():
            server.start()
        print("reference servers:", ", ".join(f"{k} {s.url}" for k, s in servers.items()), flush=True)
        explored = subprocess.run(
            [
                sys.executable,
                "-m",
                "engine",
                "explore",
                "--permutations",
                "10000",
                "--ledger",
                str(ledger),
                "--json",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        summary = "recorded" if explored.returncode in (0, 1) else f"failed: {explored.stderr[-300:]}"
        print(f"race explorer: {summary}", flush=True)
        config = write_config(data, servers)
        service = ServiceProcess(ledger, config, port=args.service_port).start()
        print(f"service: {service.url} (ledger {ledger})", flush=True)
        threading.Thread(target=workload, args=(service.url, stop, 7, args.rate), daemon=True).start()
        if not args.no_console:
            env = dict(os.environ, FINALITY_SERVICE_URL=service.url, FINALITY_LEDGER=str(ledger))
            port = args.console_port or free_port()
            console = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "streamlit",
                    "run",
                    str(ROOT / "app.py"),
                    "--server.port",
                    str(port),
                    "--server.headless",
                    "true",
                    "--browser.gatherUsageStats",
                    "false",
                ],
                env=env,
                stdout=(data / "console.log").open("wb"),
                stderr=subprocess.STDOUT,
            )
            print(f"\n  Finality console: http://127.0.0.1:{port}\n", flush=True)
        print("Ctrl-C stops everything.", flush=True)
        deadline = time.monotonic() + args.seconds if args.seconds else None
        while not stop.is_set():
            if deadline is not None and time.monotonic() > deadline:
                break
            stop.wait(1)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        if console is not None:
            console.terminate()
            try:
                console.wait(timeout=10)
            except subprocess.TimeoutExpired:
                console.kill()
        if service is not None:
            with ServiceClient(service.url, timeout=5) as client, contextlib.suppress(ServiceUnavailable):
                print(json.dumps(client.health()), flush=True)
            service.close()
        for server in servers.values():
            server.stop()
        print("demo stopped; data kept under", data, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
