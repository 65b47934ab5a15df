"""A tiny OpenID Connect provider on 127.0.0.1 for tests: discovery, authorize, token, JWKS, userinfo.

Enough of the authorization-code flow for a real client (Streamlit's ``st.login`` through Authlib)
to sign a person in: ``/authorize`` shows one page with a "Sign in as <email>" button per known
person, which redirects back with a one-time code; ``/token`` exchanges it (client id and secret
checked, basic or in the form) for an RS256-signed ID token carrying the request's nonce;
``/jwks`` publishes the public key. ``id_token(email)`` mints a token without the browser (the
service's verification tests).

For tests only: one thread, one key per provider, no consent, no refresh tokens. Not a model of
any real provider's quirks.
"""

from __future__ import annotations

import html
import json
import secrets
import threading
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from engine.clock import SystemClock


@dataclass
class OidcProvider:
    """Run with ``with OidcProvider(people={"alice@example.com": "alice-sub"}) as idp: idp.issuer``."""

    people: dict[str, str]
    """email -> sub of the people who can sign in."""
    client_id: str = "finality-console"
    client_secret: str = "console-secret"
    lifetime: timedelta = timedelta(hours=1)
    codes: dict[str, dict[str, str]] = field(default_factory=dict)
    issued: list[str] = field(default_factory=list)
    """The email of every ID token issued at /token, in order."""
    keys_released: threading.Event = field(default_factory=threading.Event)
    """``/jwks`` answers once this is set (set from the start; clear it to hold the keys back, as
    a slow provider would, for at most 30 s)."""
    keys_asked: threading.Event = field(default_factory=threading.Event)
    """Set when ``/jwks`` is first asked for."""

    def __post_init__(self) -> None:
        from joserfc.jwk import RSAKey

        self._key = RSAKey.generate_key(2048, parameters={"kid": "test-1", "use": "sig", "alg": "RS256"})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.keys_released.set()

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def discovery_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"

    def __enter__(self) -> OidcProvider:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def discovery(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "jwks_uri": f"{self.issuer}/jwks",
            "userinfo_endpoint": f"{self.issuer}/userinfo",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "scopes_supported": ["openid", "email", "profile"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "claims_supported": ["sub", "email", "email_verified", "name"],
        }

    def jwks(self) -> dict[str, Any]:
        return {"keys": [self._key.as_dict(private=False)]}

    def id_token(
        self,
        email: str,
        *,
        nonce: str | None = None,
        audience: str | None = None,
        now: datetime | None = None,
    ) -> str:
        """An ID token for ``email`` signed by this provider's key."""
        from joserfc import jwt

        # A token's iat and exp are wall-clock time: the client checks them against its own clock.
        at = now or SystemClock().now()
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": self.people.get(email, email),
            "aud": audience or self.client_id,
            "iat": int(at.timestamp()),
            "exp": int((at + self.lifetime).timestamp()),
            "email": email,
            "email_verified": True,
            "name": email.split("@")[0],
        }
        if nonce:
            claims["nonce"] = nonce
        return jwt.encode({"alg": "RS256", "kid": "test-1"}, claims, self._key)


def _handler(provider: OidcProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _json(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def _form(self) -> dict[str, str]:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length).decode()
            return {k: v[0] for k, v in urllib.parse.parse_qs(raw).items()}

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
            if url.path == "/.well-known/openid-configuration":
                self._json(200, provider.discovery())
            elif url.path == "/jwks":
                provider.keys_asked.set()
                provider.keys_released.wait(timeout=30)
                self._json(200, provider.jwks())
            elif url.path == "/authorize":
                if query.get("client_id") != provider.client_id or "redirect_uri" not in query:
                    self._json(400, {"error": "invalid_request"})
                    return
                hidden = "".join(
                    f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                    for k, v in query.items()
                )
                buttons = "".join(
                    f'<button type="submit" name="email" value="{html.escape(e)}">Sign in as {html.escape(e)}</button>'
                    for e in provider.people
                )
                page = f"<html><body><h1>Test identity provider</h1><form method='post'>{hidden}{buttons}</form></body></html>"
                data = page.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif url.path == "/userinfo":
                self._json(401, {"error": "invalid_token"})
            else:
                self._json(404, {"error": "not_found"})

        def do_POST(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            form = self._form()
            if url.path == "/authorize":
                email = form.get("email", "")
                if email not in provider.people:
                    self._json(400, {"error": "access_denied"})
                    return
                code = secrets.token_urlsafe(16)
                provider.codes[code] = {
                    "email": email,
                    "nonce": form.get("nonce", ""),
                    "redirect_uri": form["redirect_uri"],
                }
                back = (
                    form["redirect_uri"]
                    + "?"
                    + urllib.parse.urlencode({"code": code, "state": form.get("state", "")})
                )
                self.send_response(302)
                self.send_header("Location", back)
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif url.path == "/token":
                client_id, client_secret = form.get("client_id"), form.get("client_secret")
                auth = self.headers.get("Authorization", "")
                if auth.lower().startswith("basic "):
                    import base64

                    user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
                    client_id, client_secret = urllib.parse.unquote(user), urllib.parse.unquote(password)
                if (client_id, client_secret) != (provider.client_id, provider.client_secret):
                    self._json(401, {"error": "invalid_client"})
                    return
                grant = provider.codes.pop(form.get("code", ""), None)
                if grant is None or grant["redirect_uri"] != form.get("redirect_uri"):
                    self._json(400, {"error": "invalid_grant"})
                    return
                provider.issued.append(grant["email"])
                self._json(
                    200,
                    {
                        "access_token": secrets.token_urlsafe(24),
                        "token_type": "Bearer",
                        "expires_in": int(provider.lifetime.total_seconds()),
                        "id_token": provider.id_token(grant["email"], nonce=grant["nonce"] or None),
                    },
                )
            else:
                self._json(404, {"error": "not_found"})

    return Handler


__all__ = ["OidcProvider"]
