"""The audit trail: one JSON line per state-changing call, appended, never rewritten.

Each line has the time, tenant, peer, RPC, outcome (gRPC code, message) and
duration, plus what the servicer recorded with :func:`audit_fields`: the
workspace, the command (known secret values masked), the process, its exit code
and stop reason, the path. Life-cycle events the daemon causes itself (a
workspace reaped at its idle TTL) are written with :meth:`AuditLog.event`.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from . import metrics
from .errors import InvalidSpecError

__all__ = ["STATE_CHANGING", "AuditLog", "audit_fields", "start_audit"]

log = structlog.get_logger(__name__)

STATE_CHANGING = frozenset(
    {
        "CreateWorkspace",
        "DeleteWorkspace",
        "PauseWorkspace",
        "ResumeWorkspace",
        "SetWorkspaceLifetime",
        "SnapshotWorkspace",
        "RestoreWorkspace",
        "DeleteSnapshot",
        "BuildTemplate",
        "Exec",
        "Input",
        "Signal",
        "Kill",
        "WriteFile",
        "EditFile",
        "Remove",
        "Move",
        "Upload",
        "ForwardPort",
        "UpdateNetwork",
    }
)
"""RPC names that change something, and so are audited."""

_RECORD: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("sandboxd_audit", default=None)


def start_audit(method: str, peer: str) -> None:
    """Begin the record of the call being served (the interceptor does this)."""
    _RECORD.set({"rpc": method.rsplit("/", 1)[-1], "peer": peer, "fields": {}})


def audit_fields(**fields: Any) -> None:
    """Add facts to the current call's record (no-op outside a call)."""
    record = _RECORD.get()
    if record is not None:
        record["fields"].update({k: v for k, v in fields.items() if v is not None})


def set_audit_tenant(tenant: str) -> None:
    """Note the authenticated tenant on the current record."""
    record = _RECORD.get()
    if record is not None:
        record["tenant"] = tenant


MAX_FIELD_CHARS = 1024
"""Longest string kept whole in an audit line; a longer one (a refused 60 MB command) keeps
its first ``MAX_FIELD_CHARS`` characters, and ``<field>_bytes`` gives its full size."""


def _bounded(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` with every long string cut to a prefix, its full UTF-8 size beside it."""
    bounded: dict[str, Any] = {}
    for key, value in entry.items():
        if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
            bounded[key] = value[:MAX_FIELD_CHARS] + "…"
            bounded[f"{key}_bytes"] = len(value.encode("utf-8", "surrogatepass"))
        else:
            bounded[key] = value
    return bounded


class AuditLog:
    """Appends audit lines to ``path`` (created 0600; ``off`` disables the trail).

    Args:
        path: the file.
        mask: applied to every string written (masks secret values).
    """

    def __init__(self, path: str, *, mask: Callable[[str], str] = lambda text: text) -> None:
        """Open the trail for appending.

        Raises:
            InvalidSpecError: the file cannot be created or opened (the daemon will not
                run without the trail it was asked to keep).
        """
        self.path = path
        self.mask = mask
        self._lock = threading.Lock()
        self._fd = -1
        self._torn = False
        if path and path != "off":
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            except OSError as exc:
                msg = (
                    f"cannot open the audit log {path}: {exc.strerror} "
                    "(set SANDBOXD_AUDIT_LOG to a writable path, or to 'off')"
                )
                raise InvalidSpecError(msg) from None

    @property
    def enabled(self) -> bool:
        """Whether lines are written."""
        return self._fd >= 0

    def finish(self, *, code: str, duration_s: float, message: str = "") -> None:
        """Write the current call's line, if it is a state-changing call."""
        record = _RECORD.get()
        if record is None or record["rpc"] not in STATE_CHANGING:
            return
        self._write(
            {
                "rpc": record["rpc"],
                "tenant": record.get("tenant"),  # None: the call never authenticated
                "peer": record["peer"],
                **record["fields"],
                "code": code,
                "message": message,
                "duration_s": duration_s,
            }
        )

    def begin(self) -> None:
        """Write the current call's line ahead of its outcome, marked ``"phase": "begin"``.

        For calls that start something that outlives a crash of the daemon (a command,
        a workspace): the trail then shows it even if the final line is never written.
        """
        record = _RECORD.get()
        if record is None or record["rpc"] not in STATE_CHANGING:
            return
        self._write(
            {
                "rpc": record["rpc"],
                "phase": "begin",
                "tenant": record.get("tenant"),
                "peer": record["peer"],
                **record["fields"],
            }
        )

    def event(self, event: str, **fields: Any) -> None:
        """Write a line for something the daemon did by itself."""
        self._write({"event": event, **fields})

    def _write(self, entry: dict[str, Any]) -> None:
        if not self.enabled:
            return
        entry = {"time": datetime.datetime.now(datetime.UTC).isoformat(), **entry}
        # Masked before encoding: JSON escaping would hide a value with quotes or backslashes.
        masked = {key: self.mask(value) if isinstance(value, str) else value for key, value in entry.items()}
        line = (json.dumps(_bounded(masked), ensure_ascii=False, default=str) + "\n").encode()
        with self._lock:
            try:
                self._reopen_if_moved()
                if self._torn:
                    # The last line was cut short by a failed write: end it, or this one joins it.
                    line = b"\n" + line
                self._torn = True
                view = memoryview(line)
                while view:
                    view = view[os.write(self._fd, view) :]
                self._torn = False
            except OSError as exc:  # a full disk must not take calls down; it is logged loudly
                metrics.AUDIT_WRITE_FAILURES.inc()
                log.error("audit.write_failed", error=str(exc))  # noqa: TRY400 - no traceback needed

    def _reopen_if_moved(self) -> None:
        """Follow the path: after logrotate (or a deletion) lines go to a new file there, not the old one."""
        try:
            current = os.stat(self.path)
        except FileNotFoundError:
            current = None
        opened = os.fstat(self._fd)
        if current is not None and (current.st_ino, current.st_dev) == (opened.st_ino, opened.st_dev):
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.close(self._fd)
        self._fd, self._torn = fd, False
        log.info("audit.reopened", path=self.path)

    def close(self) -> None:
        """Close the file."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
