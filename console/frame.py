"""Finality console: sets the page config, builds one ``Insights`` per configuration, and runs the chosen page.

Presentation only. Every page reads through ``console.insights`` (the running service over HTTP, or
a ledger file or PostgreSQL ledger read-only when no service runs: ``FINALITY_SERVICE_URL`` /
``FINALITY_LEDGER``).
Each page's URL is its file's name (``/rollout_control``), and any page can be opened first.

Who acts (README: Who may act): when the service has an ``[auth]`` table the console signs people
in with their token before it shows any page; the console's own reads use its ``FINALITY_TOKEN``
(an analyst's), every action goes with the signed-in person's token (the service records that
token's principal), and pages offer only what the person's roles allow (``may``). Where Streamlit's
authentication is configured (an ``[auth]`` table in the console's ``secrets.toml``, with
``expose_tokens = "id"``), the sign-in page offers the OpenID Connect provider (``st.login``): the
ID token it issues is what the person's actions go with, and the service maps its identity to a
principal and roles (``[auth.oidc]`` in the service configuration). Token sign-in stays beside it. In local mode (the
service has no ``[auth]`` table, or a ledger is read in place) the name typed in the sidebar is the
actor, as typed.

    streamlit run app.py

Why pages call ``console_insights()``: Streamlit treats an app with a ``pages/`` folder as a
"pages directory" app until some session has called ``st.navigation``. Until then, a page URL opened
first runs that page's file alone, without this script (no ``Insights``, no sidebar). A page that
finds this script did not run in the current run runs it (its ``st.navigation`` ends that mode for the
server and draws the page as usual, widget events included) and stops its own copy.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable

import streamlit as st

from console.insights import Insights
from console.views import GateView, unanswered
from engine.errors import ConsoleError, SourceUnavailable
from service.auth import LADDER, Permission, allows, would_allow

logger = logging.getLogger("finality.console")


# Session-state flag: set while this script runs (a page drawn by ``navigation.run()`` sees it).
# (No bare string literals at this level: Streamlit's "magic" would draw them.)
_RUNNING = "app_running"
_SIGNED_IN = "app_signed_in"


def pages() -> list[st.Page]:
    """The console's pages; each one's URL path is its file's name."""
    return [
        st.Page("pages/overview.py", title="Overview", icon=":material/dashboard:", default=True),
        st.Page(
            "pages/cancel_latency.py",
            title="Cancel latency",
            icon=":material/timer:",
            url_path="cancel_latency",
        ),
        st.Page(
            "pages/reconciliation.py",
            title="UNKNOWN and reconciliation",
            icon=":material/help:",
            url_path="reconciliation",
        ),
        st.Page(
            "pages/gate_compliance.py",
            title="Gate compliance",
            icon=":material/rule:",
            url_path="gate_compliance",
        ),
        st.Page("pages/operations.py", title="Operations", icon=":material/list:", url_path="operations"),
        st.Page("pages/approvals.py", title="Approvals", icon=":material/approval:", url_path="approvals"),
        st.Page(
            "pages/rollout_control.py",
            title="Rollout control",
            icon=":material/rocket_launch:",
            url_path="rollout_control",
        ),
        st.Page("pages/sql.py", title="SQL", icon=":material/database:", url_path="sql"),
        st.Page(
            "pages/evidence_bundle.py",
            title="Evidence bundle",
            icon=":material/folder_zip:",
            url_path="evidence_bundle",
        ),
    ]


@st.cache_resource(show_spinner=False)
def _insights(service_url: str, ledger: str) -> Insights:
    return Insights.from_env({"FINALITY_SERVICE_URL": service_url, "FINALITY_LEDGER": ledger, **_tuning()})


def _tuning() -> dict[str, str]:
    keys = (
        "FINALITY_CONSOLE_CACHE_S",
        "FINALITY_CONSOLE_GATE_CACHE_S",
        "FINALITY_CONSOLE_GATE_INTERVAL_S",
        "FINALITY_CONSOLE_TIMEOUT_S",
    )
    return {k: os.environ[k] for k in keys if k in os.environ}


def console_insights() -> Insights:
    """What a page reads through; when the page was run without this script (opened first by its URL
    while Streamlit was still in its pages-directory mode), run the console around it instead."""
    if not st.session_state.get(_RUNNING):
        main()  # st.navigation ends that mode, then draws this same page inside the console as usual
        st.stop()  # ...so the copy of the page Streamlit started alone stops here
    insights: Insights = st.session_state["app_insights"]
    return insights


def live_section(body: Callable[[], None]) -> Callable[[], None]:
    """A page's live section: a fragment that reads again every ``app_refresh_s`` seconds.

    A read it does not get (the service timed out, cannot be reached, its readers are busy, or a
    query failed: every ``ConsoleError``) ends the section with one line saying so and when it reads
    again; the rest of the page stays as drawn. Without this, a fragment's own refresh showed the
    exception's traceback in the page, and a whole-page run lost everything below the section.
    """
    refresh_s = float(st.session_state["app_refresh_s"])

    @st.fragment(run_every=refresh_s)
    @functools.wraps(body)
    def run() -> None:
        try:
            insights: Insights = st.session_state["app_insights"]
            with insights.reading():  # a refresh's reads share one attach of a ledger file
                body()
        except ConsoleError as exc:
            st.warning(unanswered(exc, refresh_s), icon=":material/cloud_off:")

    return run


def gate_stamp(insights: Insights, gates: GateView, key: str) -> None:
    """Next to the gates: when they were evaluated, how long ago and why that is current, and a
    "Re-evaluate now" button (the service evaluates and records a run; a file console reads the file)."""
    left, right = st.columns([5, 1])
    left.caption(gates.stamp(insights.now()))
    right.button(
        "Re-evaluate now",
        key=key,
        on_click=_reevaluate,
        args=(insights,),
        help="Evaluate the six gates on the ledger now instead of showing the latest recorded run.",
    )
    failure = st.session_state.pop("app_gates_error", None)
    if failure:
        st.error(failure)


def _reevaluate(insights: Insights) -> None:
    # A button callback runs before the page's next run, so the page then shows the fresh evaluation.
    try:
        insights.reevaluate()
    except ConsoleError as exc:
        st.session_state["app_gates_error"] = f"Re-evaluation failed: {exc}"


def _signs_in() -> bool:
    insights: Insights | None = st.session_state.get("app_insights")
    return insights is not None and insights.signs_in


def signed_in() -> dict[str, object] | None:
    """The signed-in person (``principal``, ``roles``, ``token_id``, ``token``), or None."""
    person = st.session_state.get(_SIGNED_IN)
    return person if isinstance(person, dict) else None


def acting_name() -> str:
    """Who the console acts as: the one name every action records as its actor ("" while none is given).

    The signed-in principal when the service has identities (the service records that, whatever is
    sent); in local mode the name typed in the sidebar (kept in the URL as ``?actor=``, so a reload
    keeps it). Every page and dialog asks only this function.
    """
    if _signs_in():
        person = signed_in()
        return str(person["principal"]) if person else ""
    return str(st.session_state.get("app_actor", "")).strip()


def acting_token() -> str | None:
    """The signed-in person's token, which every action is sent with (None in local mode)."""
    person = signed_in()
    return str(person["token"]) if person and _signs_in() else None


def may(permission: Permission) -> bool:
    """Whether the signed-in person's roles allow ``permission`` (always, in local mode): pages leave
    out what it does not (the service refuses it all the same)."""
    if not _signs_in():
        return True
    person = signed_in()
    roles = person["roles"] if person else []
    return isinstance(roles, list) and allows(frozenset(str(r) for r in roles), permission)


def not_allowed(permission: Permission, what: str) -> None:
    """Say why ``what`` is not offered: the person's roles, and the role that would allow it."""
    person = signed_in() or {}
    held = person.get("roles")
    roles = ", ".join(str(r) for r in held) if isinstance(held, list) and held else "none"
    st.info(f"{what} needs the role **{would_allow(permission)}**; you are signed in with: {roles}.")


def acting_as(what: str = "this action") -> bool:
    """Show who is acting (in a dialog or form) and return whether someone is; without anyone,
    say what is missing instead: the action is not offered under a made-up actor."""
    name = acting_name()
    if name:
        how = "signed in" if _signs_in() else "local mode: the name as typed"
        st.caption(f"Acting as **{name}** ({how}; recorded as the actor of {what}).")
        return True
    st.warning("Type your name in the sidebar first: it is recorded as the actor of " + what + ".")
    return False


def _sign_in(insights: Insights) -> None:
    token = str(st.session_state.get("app_token_input", "")).strip()
    st.session_state["app_token_input"] = ""
    if not token:
        st.session_state["app_sign_in_error"] = "Paste your token first."
        return
    _admit(insights, token, "token")


def _admit(insights: Insights, token: str, via: str) -> None:
    """Sign in whoever the service says ``token`` is (a pasted API token, or the provider's ID token),
    or say why not (in ``app_sign_in_error``)."""
    try:
        who = insights.whoami(token)
    except ConsoleError as exc:
        st.session_state["app_sign_in_error"] = f"Sign-in refused: {exc}"
        return
    if not who or not who.get("authenticated"):
        st.session_state["app_sign_in_error"] = "The service does not know this token."
        return
    refusal = _console_refuses(who)
    if refusal:
        st.session_state["app_sign_in_error"] = refusal
        return
    st.session_state[_SIGNED_IN] = {
        "principal": who["principal"],
        "roles": list(who.get("roles", [])),
        "token_id": who.get("token_id", ""),
        "token": token,
        "via": via,
    }
    st.session_state.pop("app_sign_in_error", None)


def _console_refuses(who: dict[str, object]) -> str:
    """Why this identity may not use the console ("" if it may): the console reads every operation
    (with its own token), so a principal that may see only its own (a caller alone) is turned away."""
    held = who.get("roles")
    roles = {str(r) for r in held} if isinstance(held, list) else set()
    if roles & set(LADDER):
        return ""
    return (
        f"Sign-in refused: {who.get('principal')!r} has the roles {', '.join(sorted(roles)) or 'none'}; "
        "the console shows every operation, so it needs at least the viewer role. A caller submits "
        "and reads its own operations through the API (`finality` CLI, FINALITY_TOKEN)."
    )


def _sign_out() -> None:
    person = st.session_state.pop(_SIGNED_IN, None)
    if isinstance(person, dict) and person.get("via") == "oidc":
        st.session_state["app_oidc_signed_out"] = True  # st.logout() is called in the next run


def _oidc_configured() -> bool:
    """Whether Streamlit's own authentication has a provider (the console's ``secrets.toml`` ``[auth]``)."""
    try:
        return st.secrets.load_if_toml_exists() and "auth" in st.secrets
    except Exception:  # a secrets file that does not parse: token sign-in only, as without one
        logger.exception("the console's secrets.toml could not be read; OpenID Connect sign-in is off")
        return False


def _oidc_person(insights: Insights) -> None:
    """After ``st.login``: the provider's ID token, as the service sees it, becomes the signed-in person."""
    if st.session_state.pop("app_oidc_signed_out", False):
        st.logout()
        return
    if not st.user.is_logged_in:
        return
    try:
        token = str(st.user.tokens["id"])
    except (KeyError, AttributeError):
        st.session_state["app_sign_in_error"] = (
            'The console\'s secrets.toml [auth] needs expose_tokens = "id": the ID token is what your '
            "actions are sent with."
        )
        return
    _admit(insights, token, "oidc")


def _sign_in_page(insights: Insights) -> None:
    """The only thing shown until someone signs in (the service has identities)."""
    st.title("Sign in to the Finality console")
    st.write(
        "The service asks who acts. Paste your API token (from whoever runs the service: "
        "`finality token new`; `make demo` prints one per role). It stays in this browser session only."
    )
    if _oidc_configured():
        if st.user.is_logged_in:
            st.caption(f"Signed in at the provider as {st.user.get('email') or st.user.get('sub')}.")
            st.button("Sign out of the provider", key="app_oidc_logout", on_click=st.logout)
        else:
            st.button(
                "Sign in with OpenID Connect",
                key="app_oidc_login",
                type="primary",
                on_click=st.login,
                help="Your organisation's sign-in; the service maps your identity to a principal and roles.",
            )
        st.write("Or with a token:")
    with st.form("app_sign_in", clear_on_submit=False):
        st.text_input("Token", type="password", key="app_token_input")
        st.form_submit_button("Sign in", type="primary", on_click=_sign_in, args=(insights,))
    failure = st.session_state.get("app_sign_in_error")
    if failure:
        st.error(failure)


def _set_actor() -> None:
    typed = st.session_state["app_actor_input"].strip()
    if not typed:
        # An emptied box falls back to the console's configured actor (FINALITY_ACTOR), if it has one:
        # a box that comes back empty from a rerun (seen once in a clean-clone browser run) must not
        # silently disable every action, and a person who clears it returns to the configured name.
        typed = os.environ.get("FINALITY_ACTOR", "").strip()
        st.session_state["app_actor_input"] = typed
    st.session_state["app_actor"] = typed
    _keep_actor_in_url()


def _keep_actor_in_url() -> None:
    name = st.session_state.get("app_actor", "")
    if name and name != os.environ.get("FINALITY_ACTOR", "").strip():  # the environment's name needs no URL
        st.query_params["actor"] = name
    elif "actor" in st.query_params:
        del st.query_params["actor"]


def main() -> None:
    st.set_page_config(page_title="Finality console", page_icon=":material/verified:", layout="wide")
    navigation = st.navigation(pages())
    try:
        insights = _insights(
            os.environ.get("FINALITY_SERVICE_URL", "").strip(), os.environ.get("FINALITY_LEDGER", "").strip()
        )
    except ConsoleError as exc:
        st.title("Finality console")
        st.error(str(exc))
        st.stop()

    st.session_state["app_insights"] = insights
    if insights.signs_in and signed_in() is None and _oidc_configured():
        _oidc_person(insights)
    if insights.signs_in and signed_in() is None:
        _sign_in_page(insights)
        st.stop()
    st.session_state["app_refresh_s"] = float(os.environ.get("FINALITY_CONSOLE_REFRESH_S", "10"))
    # The actor lives under a plain key (widget keys are dropped on pages where the widget is not drawn).
    # A reload starts a new session: the name comes back from the URL (``?actor=``).
    st.session_state.setdefault(
        "app_actor", (st.query_params.get("actor") or os.environ.get("FINALITY_ACTOR", "")).strip()
    )
    st.session_state.setdefault("app_actor_input", st.session_state["app_actor"])
    _keep_actor_in_url()  # a page switch drops the query string: put the name back

    with st.sidebar:
        info = insights.info
        if info.kind == "service":
            st.caption(f"Live: service at {info.location}")
        elif info.kind == "postgres":
            st.caption(f"Read-only: PostgreSQL ledger {info.location}")
            if info.note:
                st.warning(info.note)
        else:
            st.caption(f"Read-only: ledger file {info.location}")
            if info.note:
                st.warning(info.note)
        person = signed_in()
        if insights.signs_in and person is not None:
            held = person["roles"]
            roles = ", ".join(str(r) for r in held) if isinstance(held, list) else ""
            st.markdown(f"Signed in as **{person['principal']}** ({roles})")
            st.button("Sign out", key="app_sign_out", on_click=_sign_out)
        else:
            if info.kind == "service":
                st.caption(
                    "Local mode: the service has no [auth] table; the name you type is recorded as typed."
                )
            st.text_input(
                "Your name (recorded as the actor of every action)",
                key="app_actor_input",
                on_change=_set_actor,
                placeholder="required before any action",
            )
            if not acting_name():
                st.caption(":orange[No name yet: actions stay disabled until you give one.]")

    st.session_state[_RUNNING] = True
    try:
        with insights.reading():  # the page's reads share one attach of a ledger file
            navigation.run()
    except ConsoleError as exc:
        # A read the service did not answer says so in one line; any other refusal in its own words.
        st.error(unanswered(exc, None) if isinstance(exc, SourceUnavailable) else str(exc))
    except Exception:
        logger.exception("console page %s failed", navigation.title)
        st.error("This page failed; the error is in the console's log.")
    finally:
        st.session_state[_RUNNING] = False


# Where each gate's and alert's operations are: the page and its query string (Operations applies
# ``state`` and ``duplicated`` as its filters). A gate with no operations behind it (coverage, a
# rate, a share) has none.
GATE_LINKS: dict[str, tuple[str, dict[str, str]]] = {
    "terminal_divergence": ("pages/gate_compliance.py", {}),
    "cancel_confirmation": ("pages/operations.py", {"state": "CANCEL_REQUESTED"}),
    "unknown_reconciliation": ("pages/reconciliation.py", {}),
    "duplicate_operations": ("pages/operations.py", {"duplicated": "1"}),
}


def link(page: str, label: str, params: dict[str, str] | None = None) -> None:
    """A link to another console page, with its filter in the query string (and the acting name kept)."""
    query = dict(params or {})
    name = "" if _signs_in() else acting_name()  # a signed-in name is the session's, never the URL's
    if name and name != os.environ.get("FINALITY_ACTOR", "").strip():
        query["actor"] = name
    st.page_link(page, label=label, query_params=query or None)


WRAP_ROW_PX = 68
"""A table row tall enough for three lines: Streamlit's data grid wraps a cell's text only in rows
taller than 4 rem (64 px), so a long verdict, reason or next step reads in full instead of being cut."""


CHAR_PX = 6.6
"""About the widest a character of the data grid's 14 px font runs on average (measured at 1440x900:
60 characters in 373 px, 6.2 px), so an estimate of lines from it errs toward one line too many."""


LINE_PX = 20
"""One wrapped line of a data grid cell (three lines fill a WRAP_ROW_PX row with its padding)."""


def wrapped_row_px(texts: dict[int, list[str]], *, most_lines: int = 16) -> int:
    """The row height that shows the longest of ``texts`` (per column width in px, that column's cells)
    in full, wrapped at word boundaries: at least WRAP_ROW_PX (a three-line row), at most ``most_lines``.
    One height for every row: the grid has no per-row heights, so the longest cell decides."""
    lines = 3
    for width, cells in texts.items():
        # Word wrapping leaves up to a word's width empty at a line's end: count six characters less.
        per_line = max(8, int((width - 16) / CHAR_PX) - 6)
        for cell in cells:
            lines = max(lines, -(-len(str(cell)) // per_line))
    return max(WRAP_ROW_PX, 8 + LINE_PX * min(lines, most_lines))


def wrapped_height(rows: int) -> int:
    """The height that shows ``rows`` rows of WRAP_ROW_PX and the header whole (the grid's automatic
    height counts one-line rows, so it cut the last tall row)."""
    return 38 + rows * WRAP_ROW_PX + 2


def gate_table(gates: GateView, key: str) -> None:
    """The six gates as one table (PASS/FAIL coloured, values and thresholds in their units) across
    the page; the short columns are fixed so that the verdict, the answer, gets the rest of the width."""
    import pandas as pd  # type: ignore[import-untyped]

    from console.views import gate_threshold, gate_value

    rows = pd.DataFrame(
        [
            {
                "result": "PASS" if r.passed else "FAIL",
                "gate": r.gate,
                "value": gate_value(r.gate, r.value),
                "passes when": gate_threshold(r.gate, r.threshold),
                "detail": r.verdict,
            }
            for r in gates.results
        ]
    )
    st.dataframe(
        rows.style.map(
            lambda v: "color: white; background-color: #c62828" if v == "FAIL" else "color: #1b5e20",
            subset=["result"],
        ),
        hide_index=True,
        key=key,
        width="stretch",
        row_height=WRAP_ROW_PX,
        height=wrapped_height(len(rows)),
        column_config={
            "result": st.column_config.TextColumn(width=56),
            "gate": st.column_config.TextColumn(width=175),
            "value": st.column_config.TextColumn(width=95),
            "passes when": st.column_config.TextColumn(width=105),
            "detail": st.column_config.TextColumn(width=540),
        },
    )


def facts(pairs: list[tuple[str, object]]) -> None:
    """Labelled values on one line, never cut off (a row of ``st.metric`` truncates long values)."""
    st.markdown(" · ".join(f"{label} **{value}**" for label, value in pairs))


__all__ = [
    "GATE_LINKS",
    "WRAP_ROW_PX",
    "Permission",
    "acting_as",
    "acting_name",
    "acting_token",
    "console_insights",
    "facts",
    "gate_stamp",
    "gate_table",
    "link",
    "live_section",
    "main",
    "may",
    "not_allowed",
    "pages",
    "signed_in",
    "wrapped_height",
    "wrapped_row_px",
]
