"""envd's ``process.Process`` service on sandboxd's ProcessService.

envd lets any number of streams follow one process (the ``Start`` call's, and each
``Connect``), each seeing the output from when it joined, and a process outlives the streams
that follow it. sandboxd gives a process's output to one reader. So each process started here
gets one :class:`_Pump`: one ``Exec`` stream, then ``Input`` polls, read from start to exit
whoever listens, and handed to every stream that follows it. A slow follower holds the pump
back (its queue is bounded), and so the command: memory stays bounded, as envd's does.

Rules taken from envd (E2B's ``packages/envd``) and the SDK 2.63.0:

- a stream opens with ``start{pid}``, ends with ``end{exitCode, exited, status, error?}``, and
  says ``keepalive`` while nothing else happens;
- ``Connect-Timeout-Ms`` on ``Start`` is the process's lifetime; none means no limit (the
  daemon's longest, a day);
- ``stdin: false`` (the SDK's default) means stdin is closed from the start;
- processes are named by pid (or tag); ``SendSignal`` SIGKILL kills the tree; NOT_FOUND for a
  pid the sandbox has no running process of.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shlex
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from google.protobuf import duration_pb2
from sandboxd_protocol.v1 import process_service_pb2 as ppb

from .envd.process import process_pb as epb
from .envd.process.process_connect import Process
from .gateway import Caller, Gateway, caller_from_headers, mapped_errors, oneof

if TYPE_CHECKING:
    from connectrpc.request import RequestContext

    Ctx = RequestContext[Any, Any]

__all__ = ["ProcessHub", "ProcessService", "sandbox_id"]

# The longest an Exec or Input call streams before it yields; the pump then polls again.
_WINDOW = duration_pb2.Duration(seconds=3600)
# Events a follower may fall behind by before it holds the pump (and so the command) back.
_QUEUE_EVENTS = 64


# Go's words for the signals a command is usually ended by (syscall.Signal.String()).
_SIGNAL_WORDS = {"SIGKILL": "killed", "SIGTERM": "terminated", "SIGINT": "interrupt", "SIGHUP": "hangup"}
_Event = epb.ProcessEvent | ConnectError | None
_KEEPALIVE = epb.ProcessEvent(event=oneof("keepalive", epb.ProcessEvent.KeepAlive()))


def sandbox_id(ctx: Ctx) -> str:
    """The sandbox an envd request is for (the SDK's ``E2b-Sandbox-Id`` header).

    Raises:
        ConnectError: INVALID_ARGUMENT when the header is missing.
    """
    value = ctx.request_headers.get("e2b-sandbox-id", "").strip()
    if not value:
        raise ConnectError(Code.INVALID_ARGUMENT, "the E2b-Sandbox-Id header names no sandbox")
    return value


def _end(exited: ppb.ExecExited) -> epb.ProcessEvent | ConnectError:
    if exited.stop_reason == ppb.STOP_REASON_TIMEOUT:
        # envd's process lives as long as its request's deadline: at the deadline the stream ends
        # DEADLINE_EXCEEDED (the SDK's TimeoutException), not with an exit code.
        return ConnectError(Code.DEADLINE_EXCEEDED, "the command outlived its timeout and was killed")
    # As envd reports it (Go's os.ProcessState): a death by signal is exit code -1, not 128+N.
    signalled = bool(exited.signal)
    status = (
        f"signal: {_SIGNAL_WORDS.get(exited.signal, exited.signal)}" if signalled else f"exit status {exited.exit_code}"
    )
    error = exited.message if exited.stop_reason == ppb.STOP_REASON_FAILED and exited.message else None
    code = -1 if signalled else exited.exit_code
    end = epb.ProcessEvent.EndEvent(exit_code=code, exited=not signalled, status=status, error=error)
    return epb.ProcessEvent(event=oneof("end", end))


def _failed(error: str) -> epb.ProcessEvent:
    return epb.ProcessEvent(
        event=oneof("end", epb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status="unknown", error=error))
    )


def _input(given: epb.ProcessInput | None) -> bytes:
    """The bytes of envd's ``ProcessInput`` (stdin or pty, the same pipe or terminal here)."""
    return given.input.value if given is not None and given.input is not None else b""


@dataclasses.dataclass
class _Pump:
    """One process's output, read once from sandboxd and handed to each stream that follows it."""

    workspace_id: str
    process_id: str
    pid: int
    config: epb.ProcessConfig
    tag: str | None
    tty: bool
    followers: set[asyncio.Queue[_Event]] = dataclasses.field(default_factory=set)
    end: epb.ProcessEvent | ConnectError | None = None
    task: asyncio.Task[None] | None = None

    def follow(self) -> asyncio.Queue[_Event]:
        """A new follower's queue: events from now on, the end, then None."""
        queue: asyncio.Queue[_Event] = asyncio.Queue(_QUEUE_EVENTS)
        if self.end is not None:
            queue.put_nowait(self.end)
            queue.put_nowait(None)
        else:
            self.followers.add(queue)
        return queue

    async def _give(self, event: epb.ProcessEvent) -> None:
        for queue in list(self.followers):
            await queue.put(event)

    def _data(self, output: ppb.ExecOutput) -> epb.ProcessEvent:
        which = output.WhichOneof("data") or "stdout"
        chunk = output.stderr if which == "stderr" else output.stdout
        data = epb.ProcessEvent.DataEvent(output=oneof("pty" if self.tty else which, chunk))
        return epb.ProcessEvent(event=oneof("data", data))

    async def _gone(self, gateway: Gateway, caller: Caller) -> bool:
        """Whether the process's workspace is no more (it was killed under the command)."""
        try:
            await gateway.workspace(self.workspace_id, caller)
        except grpc.aio.AioRpcError as exc:
            return exc.code() == grpc.StatusCode.NOT_FOUND
        return False

    async def run(self, gateway: Gateway, caller: Caller, stream: AsyncIterator[ppb.ExecResponse]) -> None:
        """Read the Exec stream, then Input polls, to the exit; hand each event to the followers."""
        ended: epb.ProcessEvent | ConnectError | None = None
        try:
            while ended is None:
                async for response in stream:
                    kind = response.WhichOneof("event")
                    if kind == "output":
                        await self._give(self._data(response.output))
                    elif kind == "heartbeat":
                        await self._give(_KEEPALIVE)
                    elif kind == "exited":
                        ended = _end(response.exited)
                        if response.exited.stop_reason == ppb.STOP_REASON_FAILED and await self._gone(gateway, caller):
                            # envd's stream breaks when its sandbox is killed; the SDK then asks
                            # /health, hears it is gone, and says so (SandboxNotRunningException).
                            ended = ConnectError(Code.UNAVAILABLE, "the sandbox's stream ended before its command did")
                if ended is None:
                    stream = gateway.processes.Input(
                        ppb.InputRequest(process_id=self.process_id, yield_after=_WINDOW), metadata=caller.metadata()
                    )
        except grpc.aio.AioRpcError as exc:
            ended = _failed(exc.details() or exc.code().name)
        except asyncio.CancelledError:
            # The daemon is stopping: each follower hears so now, where its queue has room.
            self.end = _failed("the daemon is stopping")
            for queue in list(self.followers):
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(self.end)
                    queue.put_nowait(None)
            self.followers.clear()
            raise
        self.end = ended or _failed("the stream ended")
        # A follower that is behind gets its end once it has read what came before (it is waited
        # for, as for its output); one that leaves meanwhile empties its queue, which frees this.
        for queue in list(self.followers):
            await queue.put(self.end)
            await queue.put(None)
        self.followers.clear()


class ProcessHub:
    """The pumps of the processes started through the E2B plane, by sandboxd process id.

    A pump is dropped once its process has ended and a minute has passed (a ``Connect`` to a
    process that has just ended still gets its end).
    """

    def __init__(self) -> None:
        self._pumps: dict[str, _Pump] = {}

    def get(self, process_id: str) -> _Pump | None:
        """The pump of ``process_id``, if it was started here."""
        return self._pumps.get(process_id)

    def add(self, pump: _Pump, gateway: Gateway, caller: Caller, stream: AsyncIterator[ppb.ExecResponse]) -> None:
        """Start ``pump`` on ``stream`` (the Exec call past its ``started`` event)."""
        self._pumps[pump.process_id] = pump

        async def run() -> None:
            try:
                await pump.run(gateway, caller, stream)
                await asyncio.sleep(60)
            finally:
                self._pumps.pop(pump.process_id, None)

        pump.task = asyncio.create_task(run(), name=f"e2b-pump-{pump.process_id}")

    async def close(self) -> None:
        """Stop every pump (the daemon is stopping; its commands are the next daemon's)."""
        tasks = [p.task for p in self._pumps.values() if p.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _command(config: epb.ProcessConfig) -> str:
    """The shell command line for envd's ``cmd`` and ``args``.

    The SDK runs everything as ``/bin/bash -l -c CMD``; sandboxd runs ``bash -lc COMMAND``, so
    that is ``CMD`` itself, one shell and no quoting in between.
    """
    args = list(config.args)
    if config.cmd in ("/bin/bash", "bash") and len(args) == 3 and args[:2] == ["-l", "-c"]:
        return args[2]
    return shlex.join([config.cmd, *args])


class ProcessService(Process):
    """The ``process.Process`` Connect service (see the module docstring).

    Args:
        gateway: sandboxd's services.
        hub: the pumps of the processes started here.
        max_timeout_s: the daemon's longest command timeout (a process with no limit gets it).
    """

    def __init__(self, gateway: Gateway, hub: ProcessHub, max_timeout_s: float) -> None:
        self.gateway = gateway
        self.hub = hub
        self.max_timeout_s = max_timeout_s

    async def _running(self, ctx: Ctx) -> list[tuple[ppb.ProcessInfo, _Pump | None]]:
        """The sandbox's running processes, each with its pump if it was started here."""
        workspace_id = sandbox_id(ctx)
        caller = caller_from_headers(ctx.request_headers)
        with mapped_errors():
            listed = await self.gateway.processes.ListProcesses(
                ppb.ListProcessesRequest(workspace_id=workspace_id), metadata=caller.metadata()
            )
        return [
            (info, self.hub.get(info.process_id))
            for info in listed.processes
            if info.state == ppb.PROCESS_STATE_RUNNING
        ]

    async def _find(self, ctx: Ctx, selector: epb.ProcessSelector | None) -> _Pump | str:
        """The pump, or the sandboxd process id, of the process ``selector`` names in the sandbox.

        Raises:
            ConnectError: NOT_FOUND when the sandbox has no running process of that pid or tag.
        """
        chosen = selector.selector if selector is not None else None
        if chosen is None:
            raise ConnectError(Code.INVALID_ARGUMENT, "the process selector names no pid or tag")
        for info, pump in await self._running(ctx):
            if chosen.field == "pid" and info.pid == chosen.value:
                return pump or info.process_id
            if chosen.field == "tag" and pump is not None and pump.tag == chosen.value:
                return pump
        raise ConnectError(Code.NOT_FOUND, f"process with {chosen.field} {chosen.value!r} not found")

    async def list(self, request: epb.ListRequest, ctx: Ctx, /) -> epb.ListResponse:
        """The sandbox's running processes."""
        infos = []
        for info, pump in await self._running(ctx):
            config = (
                pump.config if pump is not None else epb.ProcessConfig(cmd="/bin/bash", args=["-l", "-c", info.command])
            )
            infos.append(epb.ProcessInfo(config=config, pid=info.pid, tag=pump.tag if pump is not None else None))
        return epb.ListResponse(processes=infos)

    async def start(self, request: epb.StartRequest, ctx: Ctx, /) -> AsyncIterator[epb.StartResponse]:
        """Run a command; stream ``start``, its output, ``end``."""
        workspace_id = sandbox_id(ctx)
        caller = caller_from_headers(ctx.request_headers)
        config = request.process or epb.ProcessConfig()
        if not config.cmd:
            raise ConnectError(Code.INVALID_ARGUMENT, "process.cmd is empty")
        timeout_s = (ctx.timeout_ms or 0) / 1000 or self.max_timeout_s
        tty = request.pty is not None
        exec_request = ppb.ExecRequest(
            workspace_id=workspace_id,
            command=_command(config),
            workdir=await self.gateway.resolve(workspace_id, caller, config.cwd) if config.cwd else "",
            env=dict(config.envs),
            yield_after=_WINDOW,
            timeout=_duration(min(timeout_s, self.max_timeout_s)),
            tty=tty,
            user=caller.user,
            # envd keeps stdin open unless told not to (an unset field is open, for older SDKs);
            # the SDK says stdin: false for commands, and nothing for a terminal.
            stdin_closed=not tty and request.has_field("stdin") and not request.stdin,
        )
        if request.pty is not None and request.pty.size is not None:
            exec_request.terminal_size.columns = request.pty.size.cols
            exec_request.terminal_size.rows = request.pty.size.rows
        stream = self.gateway.processes.Exec(exec_request, metadata=caller.metadata())
        with mapped_errors():
            first = await anext(aiter(stream))
        started = first.started
        pump = _Pump(
            workspace_id=workspace_id,
            process_id=started.process_id,
            pid=started.pid,
            config=config,
            tag=request.tag,
            tty=tty,
        )
        queue = pump.follow()
        self.hub.add(pump, self.gateway, caller, stream)
        yield epb.StartResponse(event=_start(started.pid))
        async for event in _drain(pump, queue):
            yield epb.StartResponse(event=event)

    async def connect(self, request: epb.ConnectRequest, ctx: Ctx, /) -> AsyncIterator[epb.ConnectResponse]:
        """Follow a running process: ``start``, its output from now on, ``end``."""
        found = await self._find(ctx, request.process)
        if isinstance(found, str):
            raise ConnectError(Code.FAILED_PRECONDITION, f"process {found} was not started through the E2B API")
        queue = found.follow()
        yield epb.ConnectResponse(event=_start(found.pid))
        async for event in _drain(found, queue):
            yield epb.ConnectResponse(event=event)

    async def _input(self, ctx: Ctx, selector: epb.ProcessSelector | None, **fields: object) -> None:
        found = await self._find(ctx, selector)
        process_id = found if isinstance(found, str) else found.process_id
        caller = caller_from_headers(ctx.request_headers)
        # A zero window: this call only writes; the pump reads the output.
        request = ppb.InputRequest(process_id=process_id, yield_after=duration_pb2.Duration(), **fields)  # type: ignore[arg-type]
        with mapped_errors():
            async for _ in self.gateway.processes.Input(request, metadata=caller.metadata()):
                pass

    async def send_input(self, request: epb.SendInputRequest, ctx: Ctx, /) -> epb.SendInputResponse:
        """Write bytes to the process's stdin (or its terminal)."""
        await self._input(ctx, request.process, data=_input(request.input))
        return epb.SendInputResponse()

    async def stream_input(
        self, request: AsyncIterator[epb.StreamInputRequest], ctx: Ctx, /
    ) -> epb.StreamInputResponse:
        """Write each ``data`` event's bytes, in order, to the process the ``start`` event names."""
        selector: epb.ProcessSelector | None = None
        async for message in request:
            event = message.event.value if message.event is not None else None
            if isinstance(event, epb.StreamInputRequest.StartEvent):
                selector = event.process
            elif isinstance(event, epb.StreamInputRequest.DataEvent):
                if selector is None:
                    raise ConnectError(Code.INVALID_ARGUMENT, "the first StreamInput message must be start")
                await self._input(ctx, selector, data=_input(event.input))
        return epb.StreamInputResponse()

    async def close_stdin(self, request: epb.CloseStdinRequest, ctx: Ctx, /) -> epb.CloseStdinResponse:
        """Close the process's stdin (end of input)."""
        await self._input(ctx, request.process, close_stdin=True)
        return epb.CloseStdinResponse()

    async def send_signal(self, request: epb.SendSignalRequest, ctx: Ctx, /) -> epb.SendSignalResponse:
        """SIGKILL: kill the process and everything it started; SIGTERM: signal its process group."""
        found = await self._find(ctx, request.process)
        process_id = found if isinstance(found, str) else found.process_id
        caller = caller_from_headers(ctx.request_headers)
        with mapped_errors():
            if request.signal == epb.Signal.SIGKILL:
                await self.gateway.processes.Kill(
                    ppb.KillRequest(process_id=process_id, grace=duration_pb2.Duration()), metadata=caller.metadata()
                )
            elif request.signal == epb.Signal.SIGTERM:
                await self.gateway.processes.Signal(
                    ppb.SignalRequest(process_id=process_id, signal="SIGTERM"), metadata=caller.metadata()
                )
            else:
                raise ConnectError(Code.INVALID_ARGUMENT, f"signal {request.signal} is not SIGTERM or SIGKILL")
        return epb.SendSignalResponse()

    async def update(self, request: epb.UpdateRequest, ctx: Ctx, /) -> epb.UpdateResponse:
        """Resize the process's terminal."""
        if request.pty is None or request.pty.size is None:
            return epb.UpdateResponse()
        size = ppb.TerminalSize(columns=request.pty.size.cols, rows=request.pty.size.rows)
        await self._input(ctx, request.process, terminal_size=size)
        return epb.UpdateResponse()


def _duration(seconds: float) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(int(seconds * 1e9))
    return duration


def _start(pid: int) -> epb.ProcessEvent:
    return epb.ProcessEvent(event=oneof("start", epb.ProcessEvent.StartEvent(pid=pid)))


async def _drain(pump: _Pump, queue: asyncio.Queue[_Event]) -> AsyncIterator[epb.ProcessEvent]:
    """A follower's events up to and with the end; it stops following when it leaves.

    Raises:
        ConnectError: the end is an error (DEADLINE_EXCEEDED: the command's timeout).
    """
    try:
        while (event := await queue.get()) is not None:
            if isinstance(event, ConnectError):
                raise event
            yield event
    finally:
        pump.followers.discard(queue)
        while not queue.empty():  # room for an event the pump may be waiting to put: it goes on
            queue.get_nowait()
