"""Who is calling: bearer tokens, tenants, and the tenant of the current call.

Tokens live in a JSON file, hashed (sha256 of a 32-byte random token: a fast
hash is enough for values that cannot be guessed), each mapped to a tenant:

    {"tokens": [{"tenant": "team-a", "sha256": "…", "created": "2026-…"}]}

``sandboxd token create --tenant NAME`` adds one and prints the token once.
With no tokens file, every caller of the (owner-only) Unix socket is tenant
``default``. The interceptor binds the tenant to the call with a context
variable, and the domain services read it: a tenant sees only its own
workspaces and processes; anything else is NOT_FOUND, so existence never leaks.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

from .errors import InvalidSpecError, UnauthenticatedError

__all__ = [
    "DEFAULT_TENANT",
    "TOKEN_PREFIX",
    "Authenticator",
    "create_token",
    "current_tenant",
    "default_tokens_path",
    "reset_tenant",
    "tenant_scope",
]

log = structlog.get_logger(__name__)

DEFAULT_TENANT = "default"
TOKEN_PREFIX = "sbd_"
_TENANT_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("sandboxd_tenant", default=DEFAULT_TENANT)


def current_tenant() -> str:
    """The tenant of the call being served (``default`` outside any call)."""
    return _TENANT.get()


def tenant_scope(tenant: str) -> contextvars.Token[str]:
    """Make ``tenant`` the current tenant; pass the result to ``reset_tenant`` to undo."""
    return _TENANT.set(tenant)


def reset_tenant(token: contextvars.Token[str]) -> None:
    """Undo :func:`tenant_scope`.

    A streaming call's generator that its caller abandoned may be closed by the garbage
    collector's finalizer, in a task of another context: the context the scope was set in
    is gone then, and there is nothing to undo.
    """
    with contextlib.suppress(ValueError):
        _TENANT.reset(token)


def default_tokens_path(environ: Mapping[str, str]) -> str:
    """Where ``sandboxd token create`` keeps tokens when no file is named."""
    if os.geteuid() == 0:
        return "/etc/sandboxd/tokens.json"
    home = environ.get("HOME") or os.path.expanduser("~")
    return os.path.join(environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"), "sandboxd", "tokens.json")


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(tokens_file: str | Path, tenant: str) -> str:
    """Add a token for ``tenant`` to ``tokens_file`` (created 0600 when missing); return the token.

    Raises:
        InvalidSpecError: the tenant name is not lowercase letters, digits, ``.``, ``_`` or ``-``.
    """
    if not _TENANT_RE.fullmatch(tenant):
        msg = f"tenant {tenant!r} must be 1-63 lowercase letters, digits, '.', '_' or '-'"
        raise InvalidSpecError(msg)
    path = Path(tokens_file)
    data: dict[str, list[dict[str, str]]] = {"tokens": []}
    if path.exists():
        data = json.loads(path.read_text() or '{"tokens": []}')
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    data.setdefault("tokens", []).append(
        {"tenant": tenant, "sha256": _digest(token), "created": datetime.datetime.now(datetime.UTC).isoformat()}
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(data, out, indent=2)
    temporary.replace(path)
    return token


class Authenticator:
    """Maps a call's bearer token to its tenant.

    Args:
        tokens_file: the tokens file; empty means no tokens (every caller is ``default``).
    """

    def __init__(self, tokens_file: str = "") -> None:
        """Load the tokens (the file is re-read when it changes)."""
        self.tokens_file = tokens_file
        self._loaded_mtime = -1.0
        self._tenants: dict[str, str] = {}

    @property
    def required(self) -> bool:
        """Whether calls must carry a token."""
        return bool(self.tokens_file)

    def tenant_count(self) -> int:
        """How many tenants the tokens name (as last read); 1 without tokens (everyone is ``default``)."""
        return max(1, len(set(self._tenants.values())))

    def load(self) -> None:
        """Read the tokens now (the daemon does this at start).

        Raises:
            InvalidSpecError: the file is missing or is not a tokens file.
        """
        if not self.required:
            return
        try:
            self._reload()
        except UnauthenticatedError as exc:
            raise InvalidSpecError(exc.message) from None

    def _reload(self) -> None:
        path = Path(self.tokens_file)
        try:
            mtime = path.stat().st_mtime
            if mtime == self._loaded_mtime:
                return
            data = json.loads(path.read_text() or "{}")
            tenants = {str(entry["sha256"]): str(entry["tenant"]) for entry in data.get("tokens", [])}
        except OSError as exc:
            msg = f"cannot read the tokens file {self.tokens_file}: {exc.strerror}"
            raise UnauthenticatedError(msg) from None
        except (ValueError, KeyError, TypeError, AttributeError):
            msg = f'the tokens file {self.tokens_file} is not valid (expected {{"tokens": [{{"tenant", "sha256"}}]}})'
            raise UnauthenticatedError(msg) from None
        self._tenants = tenants
        self._loaded_mtime = mtime

    def tenant(self, metadata: Sequence[tuple[str, str | bytes]] | Mapping[str, str]) -> str:
        """The tenant a call's metadata authenticates as.

        Raises:
            UnauthenticatedError: tokens are required and the token is missing or unknown.
        """
        if not self.required:
            return DEFAULT_TENANT
        items = metadata.items() if isinstance(metadata, Mapping) else metadata
        header = next((str(value) for key, value in items if key.lower() == "authorization"), "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            msg = "this daemon needs a bearer token (authorization: Bearer TOKEN; sandboxctl --token)"
            raise UnauthenticatedError(msg)
        try:
            self._reload()
        except UnauthenticatedError as exc:
            log.error("tokens.unreadable", error=exc.message)  # noqa: TRY400 - the path stays in the log
            msg = "the daemon cannot check tokens right now; its log says why"
            raise UnauthenticatedError(msg) from None
        digest = _digest(token.strip())
        for known, tenant in self._tenants.items():
            if hmac.compare_digest(known, digest):
                return tenant
        msg = "the bearer token is not valid"
        raise UnauthenticatedError(msg)
