"""The audit layer: each state-changing call's record, refused attempts included."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from ...audit import STATE_CHANGING, AuditLog, audit_fields, start_audit
from .._types import Context
from ._call import CallState, Unparsed
from ._layer import Layer

__all__ = ["AuditTrail"]

_AUDITED_REQUEST_FIELDS = (
    "workspace_id",
    "name",
    "from_snapshot",
    "process_id",
    "command",
    "workdir",
    "path",
    "source_path",
    "destination_path",
    "signal",
    "replace_all",
    "recursive",
)


class AuditTrail(Layer):
    """Opens every call's audit record; writes a state-changing call's line to ``audit``.

    It sits above authentication, so a refused attempt is on record too, with what it
    tried when its request was small enough to read before authentication. A
    ``CreateWorkspace`` writes a ``begin`` line once admitted, and an ``Exec`` once its
    command has started: what outlives a crash of the daemon is then on record.

    Args:
        audit: the trail; None (or one that is off) records nothing, though the servicers
            may still add fields to the record.
    """

    def __init__(self, audit: AuditLog | None = None) -> None:
        """Record to ``audit``."""
        self.audit = audit

    def _trail(self, state: CallState) -> AuditLog | None:
        """The trail, if this call is one it records."""
        if self.audit is not None and self.audit.enabled and state.rpc in STATE_CHANGING:
            return self.audit
        return None

    @contextlib.asynccontextmanager
    async def around(self, state: CallState, request: Any, context: Context) -> AsyncIterator[Any]:
        """Open the record, note what the request names, and write the line with the outcome."""
        start_audit(state.method, context.peer())
        trail = self._trail(state)
        if trail is None:
            yield request
            return
        if not isinstance(request, Unparsed):
            _audit_request(request)  # before authenticating: refused attempts are audited too
        state.on_admit(lambda admitted, late: self._admitted(trail, state, admitted, late=late))
        try:
            yield request
        except BaseException as exc:
            status = state.outcome(exc)
            trail.finish(code=status.code.name, duration_s=round(state.elapsed_s(), 4), message=status.message)
            raise
        status = state.outcome(None)
        trail.finish(code=status.code.name, duration_s=round(state.elapsed_s(), 4), message=status.message)

    @staticmethod
    def _admitted(trail: AuditLog, state: CallState, request: Any, *, late: bool) -> None:
        if late:
            _audit_request(request)
        if state.method.endswith("/CreateWorkspace"):
            trail.begin()  # a crash mid-create still leaves the attempt on record

    def on_response(self, state: CallState, response: Any) -> None:
        """Record outcomes: a new workspace's id, a process id, exit code and stop reason, a yield."""
        trail = self._trail(state)
        if trail is None:
            return
        _audit_response(response)
        if state.method.endswith("/Exec") and response.HasField("started"):
            trail.begin()  # the command runs now, whatever becomes of this call


def _audit_request(request: Any) -> None:
    """Record what a request names (never stdin or file contents, only their sizes)."""
    descriptor = getattr(request, "DESCRIPTOR", None)
    if descriptor is None:  # a client stream (Upload): its servicer records the target
        return
    names = descriptor.fields_by_name
    audit_fields(**{name: getattr(request, name) for name in _AUDITED_REQUEST_FIELDS if name in names})
    for name in ("chars", "data", "content"):
        if name in names and getattr(request, name):
            audit_fields(input_bytes=len(getattr(request, name)))
    if "chars" in names and request.chars == "\u0003":
        audit_fields(ctrl_c=True)


def _audit_response(response: Any) -> None:
    """Record outcomes: a new workspace's id, a process id, exit code and stop reason, a yield."""
    names = response.DESCRIPTOR.fields_by_name
    if "workspace" in names and response.HasField("workspace"):
        audit_fields(workspace_id=response.workspace.workspace_id)
    if "started" in names and response.HasField("started"):
        audit_fields(process_id=response.started.process_id)
    if "yielded" in names and response.HasField("yielded"):
        audit_fields(yielded=True)
    if "exited" in names and response.HasField("exited"):
        exited = response.exited
        stop_reason = exited.DESCRIPTOR.fields_by_name["stop_reason"].enum_type.values_by_number[exited.stop_reason]
        audit_fields(
            exit_code=exited.exit_code,
            signal=exited.signal or None,
            stop_reason=stop_reason.name.removeprefix("STOP_REASON_").lower(),
            oom_killed=exited.oom_killed or None,
        )
