"""Who may act, in the browser (issue 20 points 3 and 5): OpenID Connect sign-in through a provider on
127.0.0.1, and what an approver, an operator, an analyst and a caller each see and do.

One provider, one service, one console and one Chromium for the whole module. The service's
``[auth]`` table has ``open_metrics = false`` (tested here too: /metrics then needs a token) and an
``[auth.oidc]`` table mapping one provider identity to an approver. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import http_kit
import pytest
from browser_support import ARTIFACTS, CHROMIUM, FLAGS, ROUND_TTL_MS, streamlit_console

from demo.seed import seed_ledger
from engine.testing.oidc import OidcProvider
from refserver.testing import RefServer
from service.auth import token_hash
from service.testing import ServiceProcess, free_port, wait_until

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="chromium is absent (scripts/install-browser.sh installs Debian's chromium)"
)

TOKENS = {
    "console-reads": ("console-reader", ["analyst"]),
    "approver": ("april-approver", ["approver"]),
    "operator": ("otto-operator", ["operator"]),
    "analyst": ("ann-analyst", ["analyst"]),
    "caller": ("cal-caller", ["caller"]),
}
OIDC_PEOPLE = {"olga@example.com": "sub-olga", "stranger@example.com": "sub-stranger"}


def _secret(name: str) -> str:
    return f"{name}-role-browser-token"


@pytest.fixture(scope="module")
def provider() -> Iterator[OidcProvider]:
    with OidcProvider(people=dict(OIDC_PEOPLE)) as idp:
        yield idp


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, provider: OidcProvider) -> Iterator[ServiceProcess]:
    folder = tmp_path_factory.mktemp("roles")
    ledger = folder / "roles.duckdb"
    seed_ledger(ledger, operations=200, seed=6)
    auth = ["[auth]", "open_metrics = false"]
    for name, (principal, roles) in TOKENS.items():
        auth += [
            f"[auth.tokens.{name}]",
            f'sha256 = "{token_hash(_secret(name))}"',
            f'principal = "{principal}"',
            f"roles = {json.dumps(roles)}",
        ]
    auth += [
        "[auth.oidc]",
        f'issuer = "{provider.issuer}"',
        f'audience = "{provider.client_id}"',
        '[auth.oidc.identities."olga@example.com"]',
        'principal = "olga"',
        'roles = ["approver"]',
    ]
    with RefServer("mcp-2025-11-25", time_scale=0.05) as server:
        config = folder / "finality.toml"
        config.write_text(
            f'global_qps = 100\nrollout_salt = "roles"\n\n[servers.mcp]\nurl = "{server.endpoint}"\n'
            'protocol = "mcp-2025-11-25"\n\n[tools.generate_report]\nserver = "mcp"\nside_effect_free = true\n\n'
            + "\n".join(auth)
            + "\n"
        )
        with ServiceProcess(ledger, config, startup_timeout=120) as svc:
            yield svc


@pytest.fixture(scope="module")
def console(
    service: ServiceProcess, provider: OidcProvider, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The console with Streamlit's authentication pointed at the provider (a secrets.toml of its own)."""
    folder = tmp_path_factory.mktemp("roles-console")
    port = free_port()
    secrets = folder / "secrets.toml"
    secrets.write_text(
        "[auth]\n"
        f'redirect_uri = "http://127.0.0.1:{port}/oauth2callback"\n'
        'cookie_secret = "a-test-cookie-secret-that-is-long-enough-0123456789"\n'
        f'client_id = "{provider.client_id}"\n'
        f'client_secret = "{provider.client_secret}"\n'
        f'server_metadata_url = "{provider.discovery_url}"\n'
        'expose_tokens = "id"\n'
    )
    env = {"FINALITY_SERVICE_URL": service.url, "FINALITY_TOKEN": _secret("console-reads")}
    with streamlit_console(
        env, folder / "streamlit.log", port=port, args=("--secrets.files", str(secrets))
    ) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


def _page(browser: Any, shot: str) -> Any:
    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.shot = shot
    return page


def _failed(page: Any) -> None:
    page.screenshot(path=str(ARTIFACTS / f"console-role-{page.shot}-failed.png"), full_page=True)
    (ARTIFACTS / f"console-role-{page.shot}-failed.txt").write_text(page.inner_text("body"))


def _sign_in_with_token(page: Any, console: str, name: str) -> None:
    page.goto(console, timeout=60_000)
    page.get_by_role("heading", name="Sign in to the Finality console").wait_for(timeout=60_000)
    page.get_by_label("Token").fill(_secret(name))
    page.get_by_role("button", name="Sign in", exact=True).click()


def _open(page: Any, title: str) -> None:
    page.get_by_role("link", name=title, exact=True).first.click(timeout=60_000)
    page.get_by_role("heading", name=title, exact=True).wait_for(timeout=60_000)


def test_metrics_need_a_token_when_open_metrics_is_false(service: ServiceProcess) -> None:
    """auth.open_metrics = false: /metrics answers 401 without a token and the metrics with a viewer's."""
    anonymous = http_kit.get(f"{service.url}/metrics", timeout=30)
    assert anonymous.status_code == 401
    assert anonymous.headers.get("www-authenticate", "").lower().startswith("bearer")
    signed = http_kit.get(
        f"{service.url}/metrics", headers={"Authorization": f"Bearer {_secret('analyst')}"}, timeout=30
    )
    assert signed.status_code == 200
    assert "finality_" in signed.text


def test_the_service_maps_a_verified_id_token_to_its_principal_and_refuses_others(
    service: ServiceProcess, provider: OidcProvider
) -> None:
    """The provider's ID token for a mapped email is that principal with its roles; an unmapped
    identity, another audience and a token signed by another key are 401."""

    def whoami(token: str) -> http_kit.Response:
        return http_kit.get(
            f"{service.url}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"}, timeout=30
        )

    mapped = whoami(provider.id_token("olga@example.com"))
    assert mapped.status_code == 200, mapped.text
    assert mapped.json()["principal"] == "olga"
    assert mapped.json()["roles"] == ["approver"]
    stranger = whoami(provider.id_token("stranger@example.com"))
    assert stranger.status_code == 401
    assert "'stranger@example.com' has no principal here" in stranger.text
    assert whoami(provider.id_token("olga@example.com", audience="someone-else")).status_code == 401
    with OidcProvider(people=dict(OIDC_PEOPLE)) as impostor:
        forged = impostor.id_token("olga@example.com")
    assert whoami(forged).status_code == 401


def test_a_person_signs_in_through_the_openid_connect_provider_as_their_mapped_principal(
    console: str, provider: OidcProvider, browser: Any
) -> None:
    """Sign in with OpenID Connect -> the provider's page -> back in the console as the principal the
    service maps the email to (olga, approver): no rollout controls, the dialog-free pages say why."""
    page = _page(browser, "oidc")
    try:
        page.goto(console, timeout=60_000)
        page.get_by_role("button", name="Sign in with OpenID Connect").click(timeout=60_000)
        page.get_by_role("heading", name="Test identity provider").wait_for(timeout=60_000)
        page.get_by_role("button", name="Sign in as olga@example.com").click()
        page.get_by_text("Signed in as olga").wait_for(timeout=90_000)
        page.get_by_role("heading", name="Overview").wait_for(timeout=60_000)
        assert "olga@example.com" in provider.issued
        _open(page, "Rollout control")
        page.get_by_text("needs the role release-manager").wait_for(timeout=60_000)
        assert page.get_by_role("button", name="Roll back…").count() == 0
        page.screenshot(path=str(ARTIFACTS / "console-role-oidc.png"), full_page=True)
    except Exception:
        _failed(page)
        raise
    finally:
        page.context.close()


def test_an_approver_answers_and_is_recorded_an_operator_is_offered_resolve_an_analyst_only_reads(
    console: str, service: ServiceProcess, browser: Any
) -> None:
    """Approver: Approve is offered and the answer records april-approver; no resolve form, no rollout
    controls. Operator: the resolve form, no Approve. Analyst: SQL runs; no Approve, no resolve form."""
    with service.client(token=_secret("caller")) as caller:
        caller.submit(
            call_node="roles-approval",
            tool="generate_report",
            arguments={"_sim": {"input_rounds": 1, "duration_ms": 2000, "ttl_ms": ROUND_TTL_MS}},
        )
        wait_until(
            lambda: caller.show("roles-approval")["state"] == "INPUT_REQUIRED",
            timeout=60,
            what="roles-approval to ask for input",
        )
        operation_id = str(caller.show("roles-approval")["operation_id"])

    page = _page(browser, "approver")
    try:
        _sign_in_with_token(page, console, "approver")
        page.get_by_text("Signed in as april-approver").wait_for(timeout=60_000)
        _open(page, "UNKNOWN and reconciliation")
        page.get_by_text("Resolving an entry needs the role operator").wait_for(timeout=60_000)
        assert page.get_by_role("button", name="Resolve").count() == 0
        _open(page, "Rollout control")
        page.get_by_text("needs the role release-manager").wait_for(timeout=60_000)
        _open(page, "Approvals")
        card = page.locator(f".st-key-approval-{operation_id}-1")
        card.get_by_role("button", name="Approve").click(timeout=60_000)
        page.get_by_text("roles-approval round 1 answered as april-approver").wait_for(timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "console-role-approver.png"), full_page=True)
    except Exception:
        _failed(page)
        raise
    finally:
        page.context.close()

    page = _page(browser, "operator")
    try:
        _sign_in_with_token(page, console, "operator")
        page.get_by_text("Signed in as otto-operator").wait_for(timeout=60_000)
        _open(page, "UNKNOWN and reconciliation")
        page.get_by_role("button", name="Resolve").wait_for(timeout=60_000)
        page.get_by_text("Acting as otto-operator").wait_for(timeout=30_000)
        _open(page, "Rollout control")
        page.get_by_text("needs the role release-manager").wait_for(timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "console-role-operator.png"), full_page=True)
    except Exception:
        _failed(page)
        raise
    finally:
        page.context.close()

    page = _page(browser, "analyst")
    try:
        _sign_in_with_token(page, console, "analyst")
        page.get_by_text("Signed in as ann-analyst").wait_for(timeout=60_000)
        _open(page, "UNKNOWN and reconciliation")
        page.get_by_text("Resolving an entry needs the role operator").wait_for(timeout=60_000)
        _open(page, "SQL")
        page.get_by_role("button", name="Run").click(timeout=60_000)
        page.get_by_test_id("stDataFrame").first.wait_for(timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "console-role-analyst.png"), full_page=True)
    except Exception:
        _failed(page)
        raise
    finally:
        page.context.close()

    with service.client(token=_secret("analyst")) as analyst:
        rows = analyst.sql(f"SELECT status, actor FROM approvals WHERE operation_id = '{operation_id}'")[
            "rows"
        ]
    assert rows == [["answered", "april-approver"]]


def test_a_caller_is_not_signed_in_to_the_console_and_is_told_why(console: str, browser: Any) -> None:
    """A caller may see only its own operations; the console shows all of them, so the sign-in is
    refused, naming the role it needs and where a caller works instead."""
    page = _page(browser, "caller")
    try:
        _sign_in_with_token(page, console, "caller")
        page.get_by_text("needs at least the viewer role").wait_for(timeout=60_000)
        assert page.get_by_role("heading", name="Overview").count() == 0
        page.screenshot(path=str(ARTIFACTS / "console-role-caller.png"), full_page=True)
    except Exception:
        _failed(page)
        raise
    finally:
        page.context.close()
