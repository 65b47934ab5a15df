"""Who may act (issue 20), over real HTTP: tokens, roles, the actor taken from the identity, denials recorded."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import http_kit
import pytest

from engine.errors import ConfigError, ServiceRefused
from engine.testing.oidc import OidcProvider
from refserver.testing import RefServer
from service.auth import LADDER, ROLES, Permission, allows, check_bind, parse_auth, token_hash
from service.cli import main as cli_main
from service.client import ServiceClient
from service.testing import ServiceProcess, config_text, wait_until

TOKENS = {f"{role}-token": (f"{role}-person", [role]) for role in ROLES}
TOKENS["bob-caller-token"] = ("bob-svc", ["caller"])
TOKENS["expired-token"] = ("old-person", ["release-manager"])


def _auth_table(tokens: dict[str, tuple[str, list[str]]], *, extra: str = "") -> str:
    lines = ["", "[auth]", "open_metrics = true", extra]
    for secret, (principal, roles) in tokens.items():
        lines += [
            f"[auth.tokens.{secret.removesuffix('-token')}]",
            f'sha256 = "{token_hash(secret)}"',
            f'principal = "{principal}"',
            f"roles = {json.dumps(roles)}",
        ]
        if secret == "expired-token":
            lines.append("expires_at = 2020-01-01T00:00:00Z")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory, servers: dict[str, RefServer]) -> Path:
    path = tmp_path_factory.mktemp("auth") / "finality.toml"
    path.write_text(config_text(servers, extra=_auth_table(TOKENS)))
    return path


@pytest.fixture(scope="module")
def service(config_path: Path) -> Iterator[ServiceProcess]:
    with ServiceProcess(config_path.parent / "ledger.duckdb", config_path, startup_timeout=120) as svc:
        yield svc


def _as(service: ServiceProcess, token: str | None) -> http_kit.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return http_kit.Client(base_url=service.url, headers=headers, timeout=60)


# Every route, with a body its lowest allowed role gets past the door with (then refused, if at all,
# for what the body says, never for who sent it), and the lowest role the door lets through.
ROUTES: list[tuple[str, str, dict[str, object] | None, str]] = [
    ("GET", "/api/v1/health", None, "viewer"),
    ("GET", "/api/v1/whoami", None, "viewer"),
    ("GET", "/api/v1/access/denials", None, "viewer"),
    ("GET", "/api/v1/operations", None, "viewer"),
    ("GET", "/api/v1/operations/nobody", None, "viewer"),
    ("GET", "/api/v1/approvals", None, "viewer"),
    ("GET", "/api/v1/reconciliation", None, "viewer"),
    ("GET", "/api/v1/gates", None, "viewer"),
    ("GET", "/api/v1/rollout/status", None, "viewer"),
    ("GET", "/api/v1/rollout/events", None, "viewer"),
    ("GET", "/api/v1/rollout/audit", None, "viewer"),
    ("GET", "/api/v1/rollout/shadow-diffs", None, "viewer"),
    ("GET", "/api/v1/rollout/assignments", None, "viewer"),
    ("GET", "/api/v1/outbox/lag", None, "viewer"),
    ("POST", "/api/v1/outbox/nobody/ack", {"consumer": "billing", "status": "completed"}, "operator"),
    ("POST", "/api/v1/sql", {"query": "SELECT 1 AS one"}, "analyst"),
    ("GET", "/api/v1/snapshots", None, "analyst"),
    ("POST", "/api/v1/approvals/no-such-op/1", {"answer": {"ok": True}}, "approver"),
    ("POST", "/api/v1/operations/nobody/cancel", {"reason": "test"}, "operator"),
    ("POST", "/api/v1/operations/nobody/resubmit", {"reason": "test"}, "operator"),
    ("POST", "/api/v1/reconciliation/999999/resolve", {"reason": "test", "absent": True}, "operator"),
    ("POST", "/api/v1/rollout/promote", {"reason": "test"}, "release-manager"),
    ("POST", "/api/v1/calls", {"call_node": "door", "tool": "no_such_tool", "arguments": {}}, "caller"),
]


def _send(
    client: http_kit.Client, method: str, path: str, body: dict[str, object] | None
) -> http_kit.Response:
    return client.request(method, path, json=body) if body is not None else client.request(method, path)


def test_every_route_but_metrics_refuses_a_request_without_a_token_or_with_a_wrong_one(
    service: ServiceProcess,
) -> None:
    """No token and an unknown token both get 401 (with WWW-Authenticate) on every route; /metrics is open."""
    for token in (None, "not-a-token"):
        with _as(service, token) as client:
            for method, path, body, _ in ROUTES:
                response = _send(client, method, path, body)
                assert response.status_code == 401, (token, method, path, response.text)
                assert response.headers["www-authenticate"].startswith("Bearer")
                assert "token" in response.json()["error"]
            assert client.get("/metrics").status_code == 200


def test_each_role_passes_the_door_of_its_routes_and_gets_403_naming_the_role_elsewhere(
    service: ServiceProcess,
) -> None:
    """For every role and route: allowed (any answer but 401/403) or 403 naming the lowest role that allows it."""
    for role in ROLES:
        with _as(service, f"{role}-token") as client:
            for method, path, body, lowest in ROUTES:
                response = _send(client, method, path, body)
                may = (
                    (role == "caller" and lowest in ("caller", "viewer") and "operations" in path)
                    or (role == "caller" and lowest == "caller")
                    or (role == "caller" and path == "/api/v1/health")
                    or (role == "caller" and path == "/api/v1/whoami")
                    or (role in LADDER and lowest in LADDER and LADDER.index(role) >= LADDER.index(lowest))
                )
                if path.endswith("/cancel") and role == "caller":
                    may = True  # a caller may cancel its own (this one is nobody's: a 404)
                if may:
                    assert response.status_code not in (401, 403), (role, method, path, response.text)
                else:
                    assert response.status_code == 403, (role, method, path, response.text)
                    error = response.json()["error"]
                    assert f"'{lowest}' would allow it" in error, (role, path, error)
                    assert f"{role}-person" in error


def test_an_expired_token_is_refused_naming_its_expiry(service: ServiceProcess) -> None:
    """A token past its expires_at gets 401 saying it expired (and when), not what it would allow."""
    with _as(service, "expired-token") as client:
        response = client.get("/api/v1/rollout/status")
    assert response.status_code == 401
    assert "expired at 2020-01-01" in response.json()["error"]


def test_a_rotated_token_stops_working_and_its_successor_works_without_a_restart(
    service: ServiceProcess, config_path: Path, servers: dict[str, RefServer]
) -> None:
    """Replacing a token's hash in the configuration file takes effect on the next request, same process."""
    pid = service.pid
    rotated = dict(TOKENS)
    rotated["viewer-rotated-token"] = rotated.pop("viewer-token")
    try:
        config_path.write_text(config_text(servers, extra=_auth_table(rotated)))
        with _as(service, "viewer-token") as old, _as(service, "viewer-rotated-token") as new:
            assert old.get("/api/v1/health").status_code == 401
            assert new.get("/api/v1/whoami").json()["principal"] == "viewer-person"
    finally:
        config_path.write_text(config_text(servers, extra=_auth_table(TOKENS)))
    with _as(service, "viewer-token") as back:
        assert back.get("/api/v1/health").status_code == 200
    assert service.pid == pid
    assert service.running


def test_a_caller_sees_and_cancels_only_its_own_principals_operations(service: ServiceProcess) -> None:
    """A caller's operation carries its principal; another caller neither lists, reads nor cancels it."""
    with (
        ServiceClient(service.url, token="caller-token") as alice,
        ServiceClient(service.url, token="bob-caller-token") as bob,
        ServiceClient(service.url, token="operator-token") as operator,
    ):
        made = alice.submit(
            call_node="alice-job", tool="generate_report", arguments={"_sim": {"duration_ms": 60_000}}
        )
        assert made["principal"] == "caller-person"
        with pytest.raises(ServiceRefused) as forged:
            alice.submit(call_node="x", tool="generate_report", arguments={}, principal="bob-svc")
        assert forged.value.status == 403
        assert "alice-job" in [op["call_node_id"] for op in alice.operations()]
        assert "alice-job" not in [op["call_node_id"] for op in bob.operations()]
        assert "alice-job" in [op["call_node_id"] for op in operator.operations()]
        for attempt in (lambda: bob.show("alice-job"), lambda: bob.cancel("alice-job", reason="not mine")):
            with pytest.raises(ServiceRefused) as refused:
                attempt()
            assert refused.value.status == 404
        assert operator.show("alice-job")["state"] != "CANCEL_REQUESTED"
        cancelled = alice.cancel("alice-job", reason="my own")
        assert cancelled["cancel_generation"] == 1


def test_a_forged_actor_is_refused_and_the_tokens_principal_is_recorded(service: ServiceProcess) -> None:
    """A body naming another actor gets 403; without one the rollout event and the cancel record the principal."""
    with ServiceClient(service.url, token="release-manager-token") as manager:
        with pytest.raises(ServiceRefused) as forged:
            manager.rollout("rollback", {"actor": "ceo", "reason": "blame someone else"})
        assert forged.value.status == 403
        assert "may not act as 'ceo'" in str(forged.value)
        manager.rollout("disable-protocol", {"reason": "kill switch drill", "protocol": "aip-151"})
        manager.rollout("enable-protocol", {"reason": "drill over", "protocol": "aip-151"})
        newest = manager.rollout_events(limit=2)
        assert [e["action"] for e in newest] == ["enable-protocol", "disable-protocol"]
        assert {e["actor"] for e in newest} == {"release-manager-person"}
    with (
        ServiceClient(service.url, token="operator-token") as operator,
        ServiceClient(service.url, token="caller-token") as caller,
    ):
        caller.submit(
            call_node="to-cancel", tool="generate_report", arguments={"_sim": {"duration_ms": 60_000}}
        )
        with pytest.raises(ServiceRefused) as forged_cancel:
            operator.cancel("to-cancel", reason="r", actor="somebody-else")
        assert forged_cancel.value.status == 403
        operator.cancel("to-cancel", reason="operator stops it", actor="operator-person")
        query = (
            "SELECT t.cause FROM transitions t JOIN op_identity i USING (operation_id) "
            "WHERE i.call_node_id = 'to-cancel' AND t.to_state = 'CANCEL_REQUESTED'"
        )
        # Analyst SQL reads a snapshot of the ledger that follows the executor's group commits.
        wait_until(lambda: bool(operator.sql(query)["rows"]), timeout=60, what="the cancel in analyst SQL")
        rows = operator.sql(query)["rows"]
    assert rows
    assert "operator-person" in json.dumps(rows)


def test_denied_attempts_are_recorded_with_who_what_and_when(service: ServiceProcess) -> None:
    """A viewer's refused rollback and an unknown token's attempt appear in the denials, newest first."""
    with _as(service, "viewer-token") as viewer, _as(service, "wrong") as stranger:
        assert viewer.post("/api/v1/rollout/rollback", json={"reason": "try"}).status_code == 403
        assert stranger.post("/api/v1/rollout/rollback", json={"reason": "try"}).status_code == 401
        denials = viewer.get("/api/v1/access/denials", params={"limit": 10}).json()["denials"]
        metrics = viewer.get("/metrics").text
    mine = next(
        d for d in denials if d["principal"] == "viewer-person" and d["path"] == "/api/v1/rollout/rollback"
    )
    assert mine["status"] == 403
    assert mine["needed_role"] == "release-manager"
    assert mine["token_id"] == "viewer"
    assert mine["method"] == "POST"
    assert mine["recorded_at"]
    assert any(d["status"] == 401 and d["principal"] == "" for d in denials)
    assert 'finality_access_refusals{status="403"}' in metrics


def test_the_role_ladder_includes_the_lower_roles_and_a_caller_only_its_own() -> None:
    """Each ladder role allows what the one below it does; a caller submits but reads no gates or SQL."""
    for lower, higher in itertools.pairwise(LADDER):
        for permission in Permission:
            if allows(frozenset({lower}), permission):
                assert allows(frozenset({higher}), permission), (lower, higher, permission)
    assert allows(frozenset({"caller"}), Permission.SUBMIT)
    assert not allows(frozenset({"release-manager"}), Permission.SUBMIT)
    assert not allows(frozenset({"caller"}), Permission.READ)
    assert not allows(frozenset({"caller"}), Permission.SQL)


def test_binding_beyond_loopback_is_refused_without_tokens_and_tls_in_front(tmp_path: Path) -> None:
    """0.0.0.0 is refused in local mode and without auth.behind_tls, each with its reason; loopback is fine."""
    source = tmp_path / "finality.toml"
    with pytest.raises(ConfigError, match=r"without an \[auth\] table"):
        check_bind("0.0.0.0", None)
    plain = parse_auth({"auth": {}}, source)
    with pytest.raises(ConfigError, match=r"clear text.*behind_tls"):
        check_bind("0.0.0.0", plain)
    check_bind("0.0.0.0", parse_auth({"auth": {"behind_tls": True}}, source))
    check_bind("127.0.0.1", None)


def test_finality_serve_refuses_a_public_bind_in_local_mode(
    tmp_path: Path, servers: dict[str, RefServer], capsys: pytest.CaptureFixture[str]
) -> None:
    """`finality serve --host 0.0.0.0` without [auth] exits with usage status and the reason."""
    config = tmp_path / "finality.toml"
    config.write_text(config_text(servers))
    code = cli_main(
        ["serve", "--config", str(config), "--ledger", str(tmp_path / "l.duckdb"), "--host", "0.0.0.0"]
    )
    assert code == 2
    assert "refusing to bind 0.0.0.0" in capsys.readouterr().err
    assert not (tmp_path / "l.duckdb").exists()


def test_token_configuration_errors_name_the_key(tmp_path: Path) -> None:
    """An unknown role, a bad hash or a naive expiry is refused naming the key."""
    source = tmp_path / "finality.toml"
    good = {"sha256": token_hash("t"), "principal": "p", "roles": ["viewer"]}
    from service.auth import parse_tokens

    for change, key in (
        ({"roles": ["admin"]}, "auth.tokens.x.roles"),
        ({"sha256": "abc"}, "auth.tokens.x.sha256"),
        ({"colour": "red"}, "auth.tokens.x.colour"),
    ):
        with pytest.raises(ConfigError) as refused:
            parse_tokens({"x": {**good, **change}}, "auth.tokens")
        assert key in str(refused.value)
    with pytest.raises(ConfigError, match=r"auth\.open_metrics"):
        parse_auth({"auth": {"open_metrics": "yes"}}, source)


def test_the_cli_reads_the_token_from_the_flag_and_the_environment(
    service: ServiceProcess, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`finality health` is refused without a token, answers with --token, and with FINALITY_TOKEN."""
    monkeypatch.setenv("FINALITY_TOKEN", "")  # restored afterwards: the CLI's --token sets the variable
    assert cli_main(["health", "--service", service.url]) != 0
    assert "token" in capsys.readouterr().err
    assert cli_main(["--token", "viewer-token", "health", "--service", service.url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "ok"
    monkeypatch.setenv("FINALITY_TOKEN", "viewer-token")
    assert cli_main(["health", "--service", service.url, "--json"]) == 0


def test_the_oidc_table_maps_identities_and_names_each_mistake(tmp_path: Path) -> None:
    """[auth.oidc]: issuer, audience and identities parse into a mapping; a missing audience, an
    unknown role or key of an identity is refused naming the key."""
    source = tmp_path / "finality.toml"
    good = {
        "issuer": "https://login.example.com/",
        "audience": "finality-console",
        "identities": {"alice@example.com": {"principal": "alice", "roles": ["approver"]}},
    }
    parsed = parse_auth({"auth": {"oidc": good}}, source)
    assert parsed is not None
    assert parsed.oidc is not None
    assert parsed.oidc.issuer == "https://login.example.com"
    assert parsed.oidc.identities == {"alice@example.com": ("alice", frozenset({"approver"}))}
    for change, key in (
        ({"audience": ""}, "auth.oidc.audience"),
        ({"colour": "red"}, "auth.oidc.colour"),
        ({"identities": {"a@b": {"principal": "a", "roles": ["admin"]}}}, "auth.oidc.identities.a@b.roles"),
        (
            {"identities": {"a@b": {"principal": "a", "roles": ["viewer"], "x": 1}}},
            "auth.oidc.identities.a@b.x",
        ),
    ):
        with pytest.raises(ConfigError) as refused:
            parse_auth({"auth": {"oidc": {**good, **change}}}, source)
        assert key in str(refused.value)


def test_the_service_keeps_answering_while_the_identity_providers_keys_are_slow(
    tmp_path: Path, servers: dict[str, RefServer]
) -> None:
    """The first ID token makes the service fetch the provider's keys; while the provider holds them
    back, health (and the executor, on the same loop) answers at once; the token then verifies."""
    with OidcProvider(people={"olga@example.com": "sub-olga"}) as provider:
        oidc = (
            f'[auth.oidc]\nissuer = "{provider.issuer}"\naudience = "{provider.client_id}"\n'
            '[auth.oidc.identities."olga@example.com"]\nprincipal = "olga"\nroles = ["viewer"]\n'
        )
        config = tmp_path / "finality.toml"
        config.write_text(config_text(servers, extra=_auth_table({"viewer-token": ("v", ["viewer"])}) + oidc))
        with ServiceProcess(tmp_path / "ledger.duckdb", config, startup_timeout=120) as svc:
            provider.keys_released.clear()
            token = provider.id_token("olga@example.com")
            answer: dict[str, http_kit.Response] = {}

            def ask() -> None:
                answer["whoami"] = http_kit.get(
                    f"{svc.url}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"}, timeout=60
                )

            asker = threading.Thread(target=ask)
            asker.start()
            try:
                # The service is fetching the keys and the provider holds them: health must still
                # answer meanwhile.
                assert provider.keys_asked.wait(timeout=60), "the service never asked for the keys"
                health = http_kit.get(
                    f"{svc.url}/api/v1/health", headers={"Authorization": "Bearer viewer-token"}, timeout=3
                )
                assert health.status_code == 200
                assert "whoami" not in answer
            finally:
                provider.keys_released.set()
                asker.join(timeout=60)
            assert answer["whoami"].status_code == 200, answer["whoami"].text
            assert answer["whoami"].json()["principal"] == "olga"
