"""Who may act: API tokens bound to a principal and roles, and what each role allows (README: Who may act).

The service configuration's ``[auth]`` table holds each token as the SHA-256 of its text, never the
text itself::

    [auth]
    open_metrics = true                      # /metrics without a token (default true); nothing else is open
    behind_tls = false                       # a TLS-terminating proxy is in front: allows a non-loopback bind
    tokens_file = "tokens.toml"              # optional: tokens kept in their own file ([tokens.<id>] tables)

    [auth.tokens.alice-laptop]               # the id names the token in logs and denials (never its text)
    sha256 = "9f86d0..."                     # finality token new --principal alice --role release-manager
    principal = "alice"
    roles = ["release-manager"]
    expires_at = 2027-01-01T00:00:00Z        # optional

People who sign in to the console through an OpenID Connect provider (Streamlit's ``st.login``)
act with the ID token it issued them; ``[auth.oidc]`` says which provider's tokens the service
accepts and maps each identity (the token's verified ``email``, else its ``sub``) to a principal and
roles. A verified token of an identity that is not mapped is refused (401, naming the identity)::

    [auth.oidc]
    issuer = "https://login.example.com"     # the ID token's iss; its discovery document names the JWKS
    audience = "finality-console"            # the console's client id (the ID token's aud)
    [auth.oidc.identities."alice@example.com"]
    principal = "alice"
    roles = ["release-manager"]

The tokens are read again whenever the file that holds them changes (its size, modification time or
inode), so a token is added, rotated or revoked without a restart; a file that no longer parses
keeps the tokens last read (and says so in the log) rather than locking everyone out.

Roles (each of the first five includes the one before it):

    viewer           reads, gates, metrics, the audit chain
    analyst          + SQL and snapshots
    approver         + answer input rounds
    operator         + cancel, resubmit, resolve reconciliation entries, record a gate run
    release-manager  + shadow, canary, promote, rollback, kill switch
    caller           submit calls; read and cancel its own principal's operations only

Without an ``[auth]`` table the service runs in local mode: no identities, every request may do
everything and names its actor as typed. It is for a laptop and the tests that predate tokens, and
the service refuses to bind anything but loopback in it.

Decides only who may act; never what an action does (the executor's and the rollout's).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path

from engine.errors import ConfigError, ServiceError

logger = logging.getLogger(__name__)

LADDER = ("viewer", "analyst", "approver", "operator", "release-manager")
"""The roles that include each other, lowest first."""
CALLER = "caller"
ROLES = (*LADDER, CALLER)
TOKEN_ENV = "FINALITY_TOKEN"
"""Where the CLI, the client and notebooks find the token when none is passed."""
LOCAL_PRINCIPAL = "local"
"""The principal of every request in local mode (no ``[auth]`` table)."""


class Permission(StrEnum):
    """What a route does, as far as who may do it is concerned."""

    HEALTH = "health"
    READ = "read"
    SQL = "sql"
    ANSWER = "answer"
    OPERATE = "operate"
    ROLLOUT = "rollout"
    SUBMIT = "submit"
    CANCEL = "cancel"
    """Cancel an operation: any from ``operator`` up, a caller its own principal's."""
    OWN_OPERATIONS = "own-operations"
    """Read or cancel an operation: any of them from ``viewer``/``operator`` up, a caller its own."""


_LOWEST: dict[Permission, str] = {
    Permission.HEALTH: "viewer",
    Permission.READ: "viewer",
    Permission.SQL: "analyst",
    Permission.ANSWER: "approver",
    Permission.OPERATE: "operator",
    Permission.CANCEL: "operator",
    Permission.ROLLOUT: "release-manager",
    Permission.OWN_OPERATIONS: "viewer",
}
_CALLER_MAY = frozenset({Permission.HEALTH, Permission.SUBMIT, Permission.OWN_OPERATIONS, Permission.CANCEL})


def allows(roles: frozenset[str], permission: Permission) -> bool:
    """Whether any of ``roles`` allows ``permission`` (the one rule every route asks)."""
    if CALLER in roles and permission in _CALLER_MAY:
        return True
    lowest = _LOWEST.get(permission)
    if lowest is None:
        return False
    rank = LADDER.index(lowest)
    return any(role in LADDER and LADDER.index(role) >= rank for role in roles)


def would_allow(permission: Permission) -> str:
    """The role a 403 names: the lowest one that allows ``permission``."""
    if permission is Permission.SUBMIT:
        return CALLER
    return _LOWEST[permission]


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request is: the token's principal and roles (``token_id`` names the token, never its text)."""

    principal: str
    roles: frozenset[str]
    token_id: str
    authenticated: bool = True

    @property
    def sees_all_operations(self) -> bool:
        """A caller alone sees only its own principal's operations."""
        return any(role in LADDER for role in self.roles) or not self.authenticated

    def may(self, permission: Permission) -> bool:
        return not self.authenticated or allows(self.roles, permission)

    def as_json(self) -> dict[str, object]:
        return {
            "principal": self.principal,
            "roles": sorted(self.roles, key=ROLES.index),
            "token_id": self.token_id,
            "authenticated": self.authenticated,
        }


LOCAL = Identity(LOCAL_PRINCIPAL, frozenset(ROLES), "local", authenticated=False)


@dataclass(frozen=True, slots=True)
class TokenEntry:
    token_id: str
    sha256: str
    principal: str
    roles: frozenset[str]
    expires_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """The ``[auth]`` table: where the tokens are and what is open."""

    source: Path
    """The file holding the ``[auth]`` table (the service configuration)."""
    tokens_file: Path | None = None
    open_metrics: bool = True
    behind_tls: bool = False
    oidc: OidcConfig | None = None


@dataclass(frozen=True, slots=True)
class OidcConfig:
    """``[auth.oidc]``: whose ID tokens the service accepts, and who each identity is here."""

    issuer: str
    audience: str
    identities: dict[str, tuple[str, frozenset[str]]]
    """``email`` or ``sub`` -> (principal, roles)."""
    jwks_uri: str | None = None
    """Where the provider's signing keys are (None: named by the issuer's discovery document)."""


def token_hash(token: str) -> str:
    """What the configuration stores for ``token``: its SHA-256, hex (tokens are random, so no salt)."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh token: 32 random bytes, URL-safe (``fin_`` marks it as Finality's in a secret scanner)."""
    return "fin_" + secrets.token_urlsafe(32)


_TOKEN_KEYS = {"sha256", "principal", "roles", "expires_at"}
_AUTH_KEYS = {"open_metrics", "behind_tls", "tokens_file", "tokens", "oidc"}
_OIDC_KEYS = {"issuer", "audience", "jwks_uri", "identities"}
_IDENTITY_KEYS = {"principal", "roles"}


def parse_tokens(table: object, where: str) -> dict[str, TokenEntry]:
    """``[<where>.<id>]`` tables as entries by hash.

    Raises:
        ConfigError: naming the offending key.
    """
    # Imported here: engine.limits holds the principal rule, checked like any other principal.
    from engine.errors import IdentifierRefused
    from engine.limits import check_principal

    if not isinstance(table, dict):
        raise ConfigError(where, "must be a table of tokens")
    entries: dict[str, TokenEntry] = {}
    for token_id, raw in table.items():
        at = f"{where}.{token_id}"
        if not isinstance(raw, dict):
            raise ConfigError(at, "must be a table")
        unknown = set(raw) - _TOKEN_KEYS
        if unknown:
            raise ConfigError(
                f"{at}.{sorted(unknown)[0]}", f"unknown key (allowed: {', '.join(sorted(_TOKEN_KEYS))})"
            )
        digest = raw.get("sha256")
        if (
            not isinstance(digest, str)
            or len(digest) != 64
            or any(c not in "0123456789abcdef" for c in digest)
        ):
            raise ConfigError(f"{at}.sha256", "must be the token's SHA-256 as 64 lowercase hex digits")
        principal = raw.get("principal")
        try:
            principal = check_principal(principal)
        except IdentifierRefused as exc:
            raise ConfigError(f"{at}.principal", str(exc)) from exc
        roles = _roles(raw.get("roles"), f"{at}.roles")
        expires = raw.get("expires_at")
        if expires is not None and not (isinstance(expires, datetime) and expires.tzinfo is not None):
            raise ConfigError(
                f"{at}.expires_at", "must be a TOML date-time with an offset (2027-01-01T00:00:00Z)"
            )
        if digest in entries:
            raise ConfigError(f"{at}.sha256", f"the same token as {entries[digest].token_id!r}")
        entries[digest] = TokenEntry(str(token_id), digest, principal, roles, expires)
    return entries


def _roles(raw: object, at: str) -> frozenset[str]:
    if not isinstance(raw, list) or not raw or not all(isinstance(r, str) for r in raw):
        raise ConfigError(at, f"must be a non-empty list of roles ({', '.join(ROLES)})")
    for role in raw:
        if role not in ROLES:
            raise ConfigError(at, f"unknown role {role!r} (one of {', '.join(ROLES)})")
    return frozenset(raw)


def parse_oidc(raw: object) -> OidcConfig:
    """``[auth.oidc]`` as an ``OidcConfig``.

    Raises:
        ConfigError: naming the offending key.
    """
    from engine.errors import IdentifierRefused
    from engine.limits import check_principal

    if not isinstance(raw, dict):
        raise ConfigError("auth.oidc", "must be a table")
    unknown = set(raw) - _OIDC_KEYS
    if unknown:
        raise ConfigError(
            f"auth.oidc.{sorted(unknown)[0]}", f"unknown key (allowed: {', '.join(sorted(_OIDC_KEYS))})"
        )
    texts: dict[str, str | None] = {}
    for key in ("issuer", "audience", "jwks_uri"):
        value = raw.get(key)
        if value is None and key == "jwks_uri":
            texts[key] = None
            continue
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"auth.oidc.{key}", "must be a non-empty string")
        texts[key] = value.strip()
    table = raw.get("identities", {})
    if not isinstance(table, dict):
        raise ConfigError("auth.oidc.identities", "must be a table of identities (email or sub)")
    identities: dict[str, tuple[str, frozenset[str]]] = {}
    for name, entry in table.items():
        at = f"auth.oidc.identities.{name}"
        if not isinstance(entry, dict):
            raise ConfigError(at, "must be a table with principal and roles")
        extra = set(entry) - _IDENTITY_KEYS
        if extra:
            raise ConfigError(f"{at}.{sorted(extra)[0]}", "unknown key (allowed: principal, roles)")
        try:
            principal = check_principal(entry.get("principal"))
        except IdentifierRefused as exc:
            raise ConfigError(f"{at}.principal", str(exc)) from exc
        identities[str(name)] = (principal, _roles(entry.get("roles"), f"{at}.roles"))
    return OidcConfig(
        issuer=str(texts["issuer"]).rstrip("/"),
        audience=str(texts["audience"]),
        identities=identities,
        jwks_uri=texts["jwks_uri"],
    )


def parse_auth(data: dict[str, object], source: Path) -> AuthConfig | None:
    """The ``[auth]`` table of a parsed configuration (None: local mode); the tokens are the store's.

    Raises:
        ConfigError: naming the offending key.
    """
    raw = data.get("auth")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError("auth", "must be a table")
    unknown = set(raw) - _AUTH_KEYS
    if unknown:
        raise ConfigError(
            f"auth.{sorted(unknown)[0]}", f"unknown key (allowed: {', '.join(sorted(_AUTH_KEYS))})"
        )
    flags: dict[str, bool] = {}
    for key, default in (("open_metrics", True), ("behind_tls", False)):
        value = raw.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"auth.{key}", "must be true or false")
        flags[key] = value
    tokens_file = raw.get("tokens_file")
    if tokens_file is not None and (not isinstance(tokens_file, str) or not tokens_file):
        raise ConfigError("auth.tokens_file", "must be a file name")
    parse_tokens(raw.get("tokens", {}), "auth.tokens")
    return AuthConfig(
        source=source,
        tokens_file=(source.parent / tokens_file) if tokens_file else None,
        open_metrics=flags["open_metrics"],
        behind_tls=flags["behind_tls"],
        oidc=parse_oidc(raw["oidc"]) if "oidc" in raw else None,
    )


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class TokenStore:
    """The tokens the service accepts, read again whenever their file changes (rotation without restart)."""

    def __init__(self, config: AuthConfig, now: Callable[[], datetime]) -> None:
        self.config = config
        self._now = now
        self._lock = threading.Lock()
        self._stamps: tuple[tuple[int, int, int] | None, ...] = ()
        self._entries: dict[str, TokenEntry] = {}
        self._oidc = None if config.oidc is None else OidcVerifier(config.oidc, now)
        self._reload(initial=True)

    def _files(self) -> tuple[Path, ...]:
        files = (self.config.source,)
        return files if self.config.tokens_file is None else (*files, self.config.tokens_file)

    def _read(self) -> dict[str, TokenEntry]:
        text = self.config.source.read_text()
        entries = parse_tokens(tomllib.loads(text).get("auth", {}).get("tokens", {}), "auth.tokens")
        if self.config.tokens_file is not None:
            extra = parse_tokens(
                tomllib.loads(self.config.tokens_file.read_text()).get("tokens", {}), "tokens"
            )
            for digest, entry in extra.items():
                entries.setdefault(digest, entry)
        return entries

    def _reload(self, *, initial: bool = False) -> None:
        stamps = tuple(_stamp(p) for p in self._files())
        if stamps == self._stamps:
            return
        try:
            entries = self._read()
        except (OSError, tomllib.TOMLDecodeError, ConfigError) as exc:
            if initial:
                raise ConfigError(str(self._files()[-1]), f"cannot read the tokens: {exc}") from exc
            # Keep serving with the tokens last read: a half-written file must not lock everyone out.
            logger.error("tokens not reloaded (the previous ones stay in force): %s", exc)
            self._stamps = stamps
            return
        self._entries = entries
        self._stamps = stamps
        if not initial:
            logger.info("tokens reloaded: %d in force", len(entries))

    def identify(self, token: str | None) -> Identity:
        """The identity of a presented token.

        Raises:
            ServiceError: 401 for a missing, unknown or expired token (the reason named, the token not).
        """
        if not token:
            raise ServiceError(
                401, "a token is required: send 'Authorization: Bearer <token>' (README: Who may act)"
            )
        if self._oidc is not None and token.count(".") == 2:
            return self._oidc.identify(token)  # a JWT: an ID token of the configured provider
        with self._lock:
            self._reload()
            entries = self._entries
        digest = token_hash(token)
        entry = entries.get(digest)
        # The lookup is by hash already; compare_digest keeps the final check constant-time anyway.
        if entry is None or not hmac.compare_digest(entry.sha256, digest):
            raise ServiceError(401, "unknown token (revoked, rotated or mistyped)")
        if entry.expires_at is not None and self._now() >= entry.expires_at:
            raise ServiceError(401, f"token {entry.token_id!r} expired at {entry.expires_at.isoformat()}")
        return Identity(entry.principal, entry.roles, entry.token_id)


def _get_json(url: str) -> dict[str, object]:
    """One bounded GET of the provider's discovery document or keys (stdlib: no tool-server client)."""
    import json
    import urllib.request

    with urllib.request.urlopen(url, timeout=5.0) as answer:
        data = json.loads(answer.read())
    if not isinstance(data, dict):
        raise ValueError(f"{url} did not answer a JSON object")
    return data


class OidcVerifier:
    """Verifies ID tokens of the ``[auth.oidc]`` provider and maps their identity to a principal.

    The provider's signing keys (its JWKS) are fetched over HTTP on the first token and again when a
    token names a key not yet seen (key rotation), at most once a minute; a fetch is bounded by 5 s.
    """

    def __init__(self, config: OidcConfig, now: Callable[[], datetime]) -> None:
        self.config = config
        self._now = now
        self._lock = threading.Lock()
        self._keys: object | None = None
        self._fetched_at: datetime | None = None

    def _jwks_uri(self) -> str:
        if self.config.jwks_uri:
            return self.config.jwks_uri
        found = _get_json(f"{self.config.issuer}/.well-known/openid-configuration")
        return str(found["jwks_uri"])

    def _key_set(self, kid: str | None) -> object:
        from joserfc.jwk import KeySet

        with self._lock:
            keys = self._keys
            known = keys is not None and (kid is None or any(k.kid == kid for k in keys.keys))  # type: ignore[attr-defined]
            recent = self._fetched_at is not None and (self._now() - self._fetched_at).total_seconds() < 60
            if keys is None or (not known and not recent):
                try:
                    keys = KeySet.import_key_set(_get_json(self._jwks_uri()))  # type: ignore[arg-type]
                except (OSError, ValueError, KeyError) as exc:
                    raise ServiceError(
                        503, f"cannot read the OpenID Connect provider's keys ({self.config.issuer}): {exc}"
                    ) from exc
                self._keys, self._fetched_at = keys, self._now()
            return keys

    def identify(self, token: str) -> Identity:
        """The identity an ID token maps to.

        Raises:
            ServiceError: 401 for a token that does not verify (signature, issuer, audience, expiry)
                or whose identity has no principal in ``[auth.oidc.identities]``.
        """
        from joserfc import jws, jwt
        from joserfc.errors import JoseError

        try:
            kid = jws.extract_compact(token.encode()).headers().get("kid")
        except (JoseError, ValueError) as exc:
            raise ServiceError(401, f"ID token refused: {exc}") from exc
        keys = self._key_set(str(kid) if kid else None)
        try:
            decoded = jwt.decode(token, keys, algorithms=["RS256", "ES256", "PS256", "EdDSA"])  # type: ignore[arg-type]
            registry = jwt.JWTClaimsRegistry(
                now=int(self._now().timestamp()),
                iss={"essential": True, "value": self.config.issuer},
                aud={"essential": True, "value": self.config.audience},
                exp={"essential": True},
            )
            registry.validate(decoded.claims)
        except (JoseError, ValueError) as exc:
            raise ServiceError(401, f"ID token refused: {exc}") from exc
        claims = decoded.claims
        email = claims.get("email") if claims.get("email_verified", True) is not False else None
        for name in (email, claims.get("sub")):
            if isinstance(name, str) and name in self.config.identities:
                principal, roles = self.config.identities[name]
                return Identity(principal, roles, f"oidc:{name}")
        shown = email or claims.get("sub")
        raise ServiceError(
            401, f"OpenID Connect identity {shown!r} has no principal here (add it to [auth.oidc.identities])"
        )


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None without one)."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def check_bind(host: str, auth: AuthConfig | None) -> None:
    """Refuse a bind the configuration does not allow, with the reason.

    Raises:
        ConfigError: a non-loopback host in local mode, or without ``auth.behind_tls``.
    """
    if host in LOOPBACK_HOSTS or host.startswith("127."):
        return
    if auth is None:
        raise ConfigError(
            "--host",
            f"refusing to bind {host}: without an [auth] table anyone who reaches the port could act; "
            "add tokens (README: Who may act) or bind 127.0.0.1",
        )
    if not auth.behind_tls:
        raise ConfigError(
            "--host",
            f"refusing to bind {host}: tokens would cross the network in clear text; put a TLS-terminating "
            "proxy in front and set auth.behind_tls = true, or bind 127.0.0.1",
        )


__all__ = [
    "CALLER",
    "LADDER",
    "LOCAL",
    "LOCAL_PRINCIPAL",
    "LOOPBACK_HOSTS",
    "ROLES",
    "TOKEN_ENV",
    "AuthConfig",
    "Identity",
    "OidcConfig",
    "OidcVerifier",
    "Permission",
    "TokenEntry",
    "TokenStore",
    "allows",
    "bearer",
    "check_bind",
    "new_token",
    "parse_auth",
    "parse_oidc",
    "parse_tokens",
    "token_hash",
    "would_allow",
]
