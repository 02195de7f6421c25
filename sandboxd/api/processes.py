"""ProcessService servicer: proto in, domain call, proto out."""

from __future__ import annotations

import contextlib
import re
import signal
from collections.abc import AsyncIterator

from sandboxd_protocol.v1 import process_service_pb2 as ppb
from sandboxd_protocol.v1 import process_service_pb2_grpc as pgrpc

from .. import metrics
from ..audit import audit_fields
from ..errors import InvalidSpecError, quoted
from ..models import ExecEvent, OutputChunk, StopReason
from ..processes import MAX_KILL_GRACE_S, ProcessTable
from ..workspaces import WorkspaceManager
from . import convert
from ._types import Context

__all__ = ["ProcessServicer", "parse_signal"]


_NUMBER_RE = re.compile(r"[0-9]{1,3}")
_REALTIME_RE = re.compile(r"SIGRT(MIN\+|MAX-)([0-9]{1,2})")


def parse_signal(text: str) -> int:
    """A signal by name (``TERM``, ``SIGTERM``, ``SIGRTMIN+2``) or number (``15``), in ASCII.

    Raises:
        InvalidSpecError: not a signal of this platform.
    """
    name = text.strip().upper()
    if _NUMBER_RE.fullmatch(name) and 0 < int(name) <= signal.SIGRTMAX:
        return int(name)
    name = name if name.startswith("SIG") else f"SIG{name}"
    if realtime := _REALTIME_RE.fullmatch(name):
        offset = int(realtime.group(2))
        number = signal.SIGRTMIN + offset if realtime.group(1) == "MIN+" else signal.SIGRTMAX - offset
        if signal.SIGRTMIN <= number <= signal.SIGRTMAX:
            return int(number)
    elif name.isascii() and name in signal.Signals.__members__:
        return int(signal.Signals[name])
    msg = f"unknown signal {quoted(text)}"
    raise InvalidSpecError(msg)


def _count(event: ExecEvent) -> None:
    """Output on its way to a caller, for the metrics."""
    if isinstance(event, OutputChunk):
        metrics.OUTPUT_BYTES.labels(stream=event.stream).inc(len(event.data))


class ProcessServicer(pgrpc.ProcessServiceServicer):
    """Serves ``sandboxd.v1.ProcessService``."""

    def __init__(self, workspaces: WorkspaceManager, processes: ProcessTable) -> None:
        """Serve commands in ``workspaces`` tracked by ``processes``."""
        self.workspaces = workspaces
        self.processes = processes

    async def Exec(self, request: ppb.ExecRequest, context: Context) -> AsyncIterator[ppb.ExecResponse]:
        """Start a command and stream its events (started, output..., exited | yielded)."""
        spec = convert.exec_spec(request)
        self.processes.check_spec(spec)  # bounds first: nothing is looked up for a request refused anyway
        exec_context = await self.workspaces.exec_context(request.workspace_id)
        session, started = await self.processes.start(exec_context, spec)
        # Closed here, not by the garbage collector: a caller leaving is handled in this call's task.
        async with contextlib.aclosing(session.exec_events(started)) as events:
            async for event in events:
                _count(event)
                yield convert.exec_response(event)

    async def Input(self, request: ppb.InputRequest, context: Context) -> AsyncIterator[ppb.InputResponse]:
        """Write to stdin or deliver Ctrl-C, then stream output until exit or the window closes."""
        session = self.processes.get(request.process_id)
        audit_fields(workspace_id=session.context.workspace_id)
        await self.workspaces.awake(session.context.workspace_id)
        requested = convert.duration_s(request.yield_after, "yield_after") if request.HasField("yield_after") else None
        if request.HasField("terminal_size"):
            size = request.terminal_size
            await session.resize(size.columns or 80, size.rows or 24)
        resume_from = request.resume_from if request.HasField("resume_from") else None
        if resume_from is not None and resume_from < 0:
            msg = f"resume_from must be an output position (0 or more), got {resume_from}"
            raise InvalidSpecError(msg)
        events = session.input(
            chars=request.chars,
            data=request.data,
            close_stdin=request.close_stdin,
            yield_after_s=requested,
            resume_from=resume_from,
        )
        async for event in events:
            _count(event)
            yield convert.input_response(event)

    async def Signal(self, request: ppb.SignalRequest, context: Context) -> ppb.SignalResponse:
        """Send one signal to the command's process group."""
        session = self.processes.get(request.process_id)
        audit_fields(workspace_id=session.context.workspace_id)
        await self.workspaces.awake(session.context.workspace_id)
        number = parse_signal(request.signal)
        if number == signal.SIGINT:
            await session.interrupt()
        else:
            await session.send_signal(int(number))
        return ppb.SignalResponse()

    async def Kill(self, request: ppb.KillRequest, context: Context) -> ppb.KillResponse:
        """End the command and everything it started: SIGTERM, grace, SIGKILL."""
        session = self.processes.get(request.process_id)
        audit_fields(workspace_id=session.context.workspace_id)
        await self.workspaces.awake(session.context.workspace_id)
        grace = (
            convert.duration_s(request.grace, "grace", high_s=MAX_KILL_GRACE_S) if request.HasField("grace") else None
        )
        status = await session.kill(reason=StopReason.KILLED, grace_s=grace)
        return ppb.KillResponse(exited=convert.exit_to_proto(status))

    async def ListProcesses(self, request: ppb.ListProcessesRequest, context: Context) -> ppb.ListProcessesResponse:
        """List the process sessions of one workspace."""
        await self.workspaces.get(request.workspace_id)
        infos = []
        for session in self.processes.list(request.workspace_id):
            info = ppb.ProcessInfo(
                process_id=session.process_id,
                workspace_id=session.context.workspace_id,
                command=session.spec.command,
                pid=session.pid,
                state=ppb.PROCESS_STATE_RUNNING if session.running else ppb.PROCESS_STATE_EXITED,
                tty=session.spec.tty,
            )
            info.start_time.FromDatetime(session.start_time)
            if session.exit is not None:
                info.exited.CopyFrom(convert.exit_to_proto(session.exit))
            infos.append(info)
        return ppb.ListProcessesResponse(processes=infos)
