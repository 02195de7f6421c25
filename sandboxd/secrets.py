"""Secrets by reference (seed 002): ``secret:NAME`` env values, resolved late, masked on the way out.

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

from .errors import InvalidSpecError

__all__ = ["MIN_SECRET_CHARS", "REFERENCE_PREFIX", "BytesRedactor", "SecretStore"]

REFERENCE_PREFIX = "secret:"
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
_ENV_PREFIX = "SANDBOXD_SECRET_"
MIN_SECRET_CHARS = 4
"""Shortest secret value accepted: shorter ones cannot be masked without mangling output."""


class SecretStore:
    """The secrets the daemon knows.

    Args:
        secrets_file: JSON object ``{"NAME": "value"}``; empty for none.
        environ: the daemon's environment (``SANDBOXD_SECRET_<NAME>`` entries count).
    """

    def __init__(self, secrets_file: str, environ: Mapping[str, str]) -> None:
        """Load the secrets.

        Raises:
            InvalidSpecError: the secrets file cannot be read or is not a JSON object, or a
                name is malformed or a value shorter than ``MIN_SECRET_CHARS``.
        """
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
            self.values.update({str(k): str(v) for k, v in data.items() if v})
        for name, value in self.values.items():
            if not _NAME_RE.match(name):
                msg = f"secret name {name!r} must be letters, digits, '_', '.' or '-', starting with a letter or '_'"
                raise InvalidSpecError(msg)
            if len(value) < MIN_SECRET_CHARS:
                # Masking a two-letter value would shred every output that contains those letters.
                msg = f"secret {name!r} is shorter than {MIN_SECRET_CHARS} characters, too short to mask in output"
                raise InvalidSpecError(msg)

    def check(self, env: Mapping[str, str], field: str) -> None:
        """Refuse references to secrets the daemon does not have.

        Raises:
            InvalidSpecError: naming the variable and the unknown secret.
        """
        for key, value in env.items():
            if value.startswith(REFERENCE_PREFIX):
                name = value[len(REFERENCE_PREFIX) :]
                if not _NAME_RE.match(name) or name not in self.values:
                    msg = (
                        f"{field} {key}: unknown secret {name!r} (set it in the secrets file or SANDBOXD_SECRET_{name})"
                    )
                    raise InvalidSpecError(msg)

    def resolve(self, env: Mapping[str, str]) -> dict[str, str]:
        """The env with every reference replaced by its value (for the command only)."""
        resolved = {}
        for key, value in env.items():
            if value.startswith(REFERENCE_PREFIX) and value[len(REFERENCE_PREFIX) :] in self.values:
                resolved[key] = self.values[value[len(REFERENCE_PREFIX) :]]
            else:
                resolved[key] = value
        return resolved

    def mask_text(self, text: str) -> str:
        """``text`` with every known value replaced by ``[REDACTED:NAME]``."""
        for name, value in sorted(self.values.items(), key=lambda item: -len(item[1])):
            text = text.replace(value, f"[REDACTED:{name}]")
        return text

    def redactor(self) -> BytesRedactor:
        """A fresh redactor for one output stream."""
        return BytesRedactor(self.values)


class BytesRedactor:
    """Masks secret values in a byte stream, even when one is split across chunks.

    A chunk's tail that begins some secret (at most the longest value but one
    bytes) is held back until the next chunk, or the end, shows whether the
    secret follows; other bytes pass at once, so a prompt is never delayed.
    Masks are never scanned again, so a value that appears inside a mask cannot
    make the output grow.
    """

    def __init__(self, values: Mapping[str, str]) -> None:
        """Mask each ``values`` entry as ``[REDACTED:NAME]``."""
        pairs = sorted(
            ((v.encode(), f"[REDACTED:{n}]".encode()) for n, v in values.items() if v), key=lambda p: -len(p[0])
        )
        self._masks = dict(pairs)
        self._pattern = re.compile(b"|".join(re.escape(value) for value, _ in pairs)) if pairs else None
        self._hold = max((len(value) for value, _ in pairs), default=1) - 1
        self._pending = b""

    @property
    def active(self) -> bool:
        """Whether there is anything to mask."""
        return self._pattern is not None

    def _scan(self, data: bytes, *, final: bool) -> bytes:
        assert self._pattern is not None
        out, position = [], 0
        for match in self._pattern.finditer(data):
            out += [data[position : match.start()], self._masks[match.group()]]
            position = match.end()
        rest = data[position:]
        keep = b"" if final else self._partial(rest)
        out.append(rest[: len(rest) - len(keep)])
        self._pending = keep
        return b"".join(out)

    def _partial(self, data: bytes) -> bytes:
        """The longest tail of ``data`` that begins some secret: only it must wait for more."""
        for size in range(min(self._hold, len(data)), 0, -1):
            tail = data[-size:]
            if any(value.startswith(tail) for value in self._masks):
                return tail
        return b""

    def feed(self, data: bytes) -> bytes:
        """What can be released now, masked."""
        if self._pattern is None:
            return data
        return self._scan(self._pending + data, final=False)

    def flush(self) -> bytes:
        """The held-back rest, masked."""
        if self._pattern is None:
            return b""
        return self._scan(self._pending, final=True)
