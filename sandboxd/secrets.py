"""Secrets by reference: ``secret:NAME`` env values, resolved late, masked on the way out.

A workspace or exec env value of exactly ``secret:NAME`` is replaced, only in
the environment handed to the command, by the value from the secrets file
(a JSON object) or ``SANDBOXD_SECRET_<NAME>`` in the daemon's environment.
Specs keep the reference; values are never returned or logged, and every
occurrence of a known value in command output becomes ``[REDACTED:NAME]``
before it leaves the daemon -- also when the value is split across chunks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from sandboxd_protocol.redact import StreamRedactor

from .errors import InvalidSpecError, quoted

__all__ = ["MIN_SECRET_CHARS", "REFERENCE_PREFIX", "BytesRedactor", "SecretStore"]

REFERENCE_PREFIX = "secret:"
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
_ENV_PREFIX = "SANDBOXD_SECRET_"
MIN_SECRET_CHARS = 4
"""Shortest secret value accepted: shorter ones cannot be masked without mangling output."""


class SecretStore:
    """The secrets the daemon knows.

    Args:
        secrets_file: JSON object; each entry ``"NAME": "value"`` (any tenant may use it) or
            ``"NAME": {"value": "...", "tenants": ["team-a"]}`` (only those tenants may); empty
            for none. Values are masked in every tenant's output either way.
        environ: the daemon's environment (``SANDBOXD_SECRET_<NAME>`` entries count, for all tenants).
    """

    def __init__(self, secrets_file: str, environ: Mapping[str, str]) -> None:
        """Load the secrets.

        Raises:
            InvalidSpecError: the secrets file cannot be read or is not a JSON object, or a
                name is malformed or a value shorter than ``MIN_SECRET_CHARS``.
        """
        self.tenants: dict[str, frozenset[str]] = {}
        """Secrets kept to some tenants: name -> the tenants that may use it."""
        self.values: dict[str, str] = {
            key[len(_ENV_PREFIX) :]: value for key, value in environ.items() if key.startswith(_ENV_PREFIX) and value
        }
        if secrets_file:
            try:
                data = json.loads(Path(secrets_file).read_text() or "{}")
            except OSError as exc:
                msg = f"cannot read the secrets file {secrets_file}: {exc.strerror}"
                raise InvalidSpecError(msg) from None
            except ValueError:
                data = None
            if not isinstance(data, dict):
                msg = f'the secrets file {secrets_file} must be a JSON object {{"NAME": "value"}}'
                raise InvalidSpecError(msg)
            for name, entry in data.items():
                self._load_entry(secrets_file, str(name), entry)
        for name, value in self.values.items():
            if not _NAME_RE.fullmatch(name):
                msg = f"secret name {name!r} must be letters, digits, '_', '.' or '-', starting with a letter or '_'"
                raise InvalidSpecError(msg)
            if len(value) < MIN_SECRET_CHARS:
                # Masking a two-letter value would shred every output that contains those letters.
                msg = f"secret {name!r} is shorter than {MIN_SECRET_CHARS} characters, too short to mask in output"
                raise InvalidSpecError(msg)

    def _load_entry(self, secrets_file: str, name: str, entry: object) -> None:
        if isinstance(entry, dict):
            value, tenants = entry.get("value"), entry.get("tenants")
            if not isinstance(value, str) or not (
                isinstance(tenants, list) and tenants and all(isinstance(t, str) for t in tenants)
            ):
                msg = (
                    f'secret {name!r} in {secrets_file}: an object entry needs a string "value" '
                    'and a non-empty list of tenant names in "tenants"'
                )
                raise InvalidSpecError(msg)
            self.tenants[name] = frozenset(tenants)
        elif entry:
            value = str(entry)
        else:
            return
        if value:
            self.values[name] = value

    def allowed(self, name: str, tenant: str) -> bool:
        """Whether ``tenant`` may use the secret ``name`` (it exists and is not kept from that tenant)."""
        return name in self.values and (name not in self.tenants or tenant in self.tenants[name])

    def check(self, env: Mapping[str, str], field: str, tenant: str) -> None:
        """Refuse references to secrets the daemon does not have, or keeps from ``tenant``.

        Both read the same ("unknown secret"): a tenant learns nothing of others' secrets.

        Raises:
            InvalidSpecError: naming the variable and the unknown secret.
        """
        for key, value in env.items():
            if value.startswith(REFERENCE_PREFIX):
                name = value[len(REFERENCE_PREFIX) :]
                named = _NAME_RE.fullmatch(name) is not None
                if not named or not self.allowed(name, tenant):
                    hint = f" (set it in the secrets file or SANDBOXD_SECRET_{name})" if named else ""
                    msg = f"{field} {key}: unknown secret {quoted(name)}{hint}"
                    raise InvalidSpecError(msg)

    def resolve(self, env: Mapping[str, str], tenant: str) -> dict[str, str]:
        """The env with every reference ``tenant`` may use replaced by its value (for the command only)."""
        resolved = {}
        for key, value in env.items():
            if value.startswith(REFERENCE_PREFIX) and self.allowed(value[len(REFERENCE_PREFIX) :], tenant):
                resolved[key] = self.values[value[len(REFERENCE_PREFIX) :]]
            else:
                resolved[key] = value
        return resolved

    def visible_to(self, tenant: str) -> dict[str, str]:
        """The secrets ``tenant`` may use (name -> value): the only ones masked in its commands' output.

        Masking one kept from it would tell it, by the mask or by what is held back, what
        the value is (or begins with): a tenant learns nothing of secrets it cannot use.
        """
        return {name: value for name, value in self.values.items() if self.allowed(name, tenant)}

    def mask_text(self, text: str, tenant: str | None = None) -> str:
        """``text`` with every value replaced by ``[REDACTED:NAME]``: all of them, or ``tenant``'s."""
        values = self.values if tenant is None else self.visible_to(tenant)
        return StreamRedactor(_masks(values, tty=False), "").redact(text)

    def redactor(self, tenant: str, *, tty: bool = False) -> BytesRedactor:
        """A fresh redactor for one output stream of ``tenant``'s command.

        ``tty``: a terminal turns each newline into CR LF; multi-line values are masked in that
        form as well.
        """
        return BytesRedactor(self.visible_to(tenant), tty=tty)


def _masks(values: Mapping[str, str], *, tty: bool) -> dict[str, str]:
    masks = {}
    for name, value in values.items():
        masks[value] = f"[REDACTED:{name}]"
        if tty and "\n" in value:
            masks[value.replace("\r\n", "\n").replace("\n", "\r\n")] = f"[REDACTED:{name}]"
    return masks


class BytesRedactor(StreamRedactor[bytes]):
    """Masks each secret as ``[REDACTED:NAME]`` in a byte stream, across chunk boundaries."""

    def __init__(self, values: Mapping[str, str], *, tty: bool = False) -> None:
        """Mask the ``values`` (name -> value); ``tty`` adds their CR LF forms."""
        super().__init__({v.encode(): m.encode() for v, m in _masks(values, tty=tty).items()}, b"")
