"""The connection to one workspace's agent: handshake, reconnects, and the dispatch of frames.

Every workspace runs ``sandboxd-agent`` as its main process. An :class:`AgentLink`
is the daemon's one connection to it: a ``docker exec`` of ``sandboxd-agent bridge``
(as root) carrying length-prefixed frames in both directions, multiplexing every
process session and file operation as a numbered channel. A link that breaks is
made again (with backoff) while any channel is open; the agent keeps each session's
unacknowledged output meanwhile, so nothing is lost but frames in flight, which the
session asks for again.

Nothing outside this package sees a frame. A process session talks through a
:class:`~sandboxd.agent.routes.SessionChannel` and hears back through the :class:`SessionEvents` it
implements; a file operation is one call of :meth:`AgentLink.file_operation`.

Frames coming from the agent are checked like any input: a length out of bounds
ends the connection (its calls fail cleanly and the link reconnects); a payload
that is not what its kind must carry fails only the call of its channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Mapping
from typing import Any

import structlog

from ..backend.base import Backend, ExecStream
from ..errors import FailedPreconditionError, SandboxdError
from .codec import PROTOCOL_VERSION, FileReply, FrameDecoder, Kind, encode, json_object, text_field
from .dial import Dialer
from .errors import AgentLost, ProtocolError
from .messages import Welcome
from .routes import ForwardedConnection, ForwardRoute, Route, forward, run_file_operation

__all__ = ["AgentLink"]

log = structlog.get_logger("sandboxd.agent")

CONNECT_TIMEOUT_S = 20.0
"""How long a new connection may take to be answered (a gVisor exec is slow under load)."""
RECONNECT_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
RECONNECT_ATTEMPTS = 40
"""Attempts before a link gives up until the next call (about 70 s: a container restart fits)."""
BRIDGE_CHECK_S = 2.0
"""Silence on a link with calls waiting after which the engine is asked if the bridge still runs."""
FREEZE_TIMEOUT_S = 5.0
"""How long the agent may take to answer a freeze (it answers at once unless it is stuck)."""
LETTING_GO_S = 5.0
"""How long an agent may take to close its connection once it said it lets go for a checkpoint."""


class AgentLink:
    """The connection to one workspace's agent.

    A :class:`~sandboxd.agent.dial.Dialer` opens it (straight to the agent's socket, else
    through a bridge): the arguments are the dialer's.
    """

    def __init__(
        self,
        backend: Backend,
        workspace_id: str,
        container_id: str,
        *,
        socket_path: str = "",
        runtime: str = "",
        host_sockets: set[str] | None = None,
    ) -> None:
        """Prepare a link; :meth:`connect` (or the first send) opens it."""
        self.backend = backend
        self.workspace_id = workspace_id
        self.container_id = container_id
        self._dialer = Dialer(
            backend, workspace_id, container_id, socket_path=socket_path, runtime=runtime, host_sockets=host_sockets
        )
        self.transport = ""
        """How the current connection goes: ``socket`` or ``bridge`` (empty before the first)."""
        self.welcome: Welcome | None = None
        self._stream: ExecStream | None = None
        self._reader: asyncio.Task[None] | None = None
        self._reconnector: asyncio.Task[None] | None = None
        self._routes: dict[int, Route] = {}
        self._next_channel = 1
        self._connect_lock = asyncio.Lock()
        self._write_lock = asyncio.Lock()
        self._closed = False
        self._heard_at = 0.0
        self._freeze_lock = asyncio.Lock()
        self._frozen_answer: asyncio.Future[bool] | None = None
        self._renames: set[asyncio.Task[None]] = set()
        self._available = asyncio.Event()
        self._available.set()  # cleared while the agent has let go for a checkpoint
        self.on_welcome: Callable[[Welcome], None] | None = None
        """Told of every new connection's welcome (the daemon adopts sessions from it)."""

    @property
    def connected(self) -> bool:
        """Whether a connection is up."""
        return self._stream is not None

    async def connect(self) -> Welcome:
        """Open the connection if it is not (one at a time); return the agent's welcome.

        Raises:
            AgentLost: the agent does not answer, or speaks another protocol.
        """
        await self._available.wait()
        async with self._connect_lock:
            if self._stream is not None and self.welcome is not None:
                return self.welcome
            if self._closed:
                msg = f"the link to workspace {self.workspace_id!r}'s agent is closed"
                raise AgentLost(msg)
            return await self._open()

    async def _open(self) -> Welcome:
        try:
            return await self._open_once()
        except AgentLost:
            if not self._dialer.away():
                raise
        # An agent that let go for a checkpoint (its mark says so) whose daemon died before saying
        # it was taken. Told, it listens again. Never without the mark: an agent still starting
        # (a container restarting) could be ended by the signal before it is ready for it.
        log.info("agent.relisten_asked", workspace_id=self.workspace_id)
        await self._dialer.relisten()
        return await self._open_once()

    async def _open_once(self) -> Welcome:
        stream = await self._dialer.direct()
        transport = "socket"
        if stream is None:
            transport = "bridge"
            stream = await self._dialer.bridge()
        decoder = FrameDecoder()
        pending: list[tuple[bytes, int, bytes]] = []
        welcome = await self._greet(stream, decoder, pending)
        if transport == "bridge" and (straight := await self._dialer.straight_after_bridge()) is not None:
            await stream.close(discard_input=True)
            stream, transport = straight, "socket"
            decoder, pending = FrameDecoder(), []
            welcome = await self._greet(stream, decoder, pending)
        self._stream, self.welcome, self.transport = stream, welcome, transport
        known = [s.channel for s in welcome.sessions]
        self._next_channel = max([self._next_channel, *(c + 1 for c in known)])
        # The link outlives the call that opened it: its reader (and what it starts) logs as the
        # workspace's, not as that call (a fresh context, not a copy of the call's).
        self._reader = asyncio.create_task(
            self._read(stream, decoder, pending), name=f"agent-{self.workspace_id}", context=contextvars.Context()
        )
        log.info(
            "agent.connected",
            workspace_id=self.workspace_id,
            agent=welcome.agent,
            sessions=len(known),
            transport=transport,
        )
        if self.on_welcome is not None:
            self.on_welcome(welcome)
        for route in list(self._routes.values()):
            route.on_reconnect(welcome)
        return welcome

    async def _greet(
        self, stream: ExecStream, decoder: FrameDecoder, pending: list[tuple[bytes, int, bytes]]
    ) -> Welcome:
        """Say hello on a new connection and read the agent's welcome (frames before it go to ``pending``).

        Raises:
            AgentLost: no welcome in time, or another protocol (the connection is closed).
        """
        stderr = bytearray()
        try:
            await stream.write(encode(Kind.HELLO, 0, {"protocol": PROTOCOL_VERSION}))
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                return Welcome.parse(await self._first_welcome(stream, decoder, pending, stderr), self.workspace_id)
        except BaseException as exc:
            # Cancelled too (the daemon stopping mid-connect): the connection must not outlive its loop.
            await stream.close(discard_input=True)
            if not isinstance(exc, (TimeoutError, ProtocolError, OSError, ConnectionError)):
                raise
            if isinstance(exc, TimeoutError):
                reason = "it did not answer in time"
            elif isinstance(exc, ProtocolError):
                reason = exc.message
            else:
                reason = str(exc)
            msg = f"workspace {self.workspace_id!r}'s agent cannot be reached: {reason}"
            raise AgentLost(msg) from None

    async def _first_welcome(
        self,
        stream: ExecStream,
        decoder: FrameDecoder,
        pending: list[tuple[bytes, int, bytes]],
        stderr: bytearray,
    ) -> bytes:
        while (chunk := await stream.read()) is not None:
            fd, data = chunk
            if fd != 1:
                stderr += data[: max(0, 2000 - len(stderr))]
                continue
            for frame in decoder.feed(data):
                if frame[0] == Kind.WELCOME and frame[1] == 0:
                    return frame[2]
                if frame[0] == Kind.ERROR and frame[1] == 0:
                    raise ProtocolError(text_field(json_object(frame[2], "error"), "message", 500) or "it refused")
                pending.append(frame)
        said = bytes(stderr).decode("utf-8", "replace").strip()
        msg = f"the bridge ended before the agent answered{': ' + said if said else ''}"
        raise ProtocolError(msg)

    async def _read(self, stream: ExecStream, decoder: FrameDecoder, pending: list[tuple[bytes, int, bytes]]) -> None:
        structlog.contextvars.bind_contextvars(workspace_id=self.workspace_id)
        watch = asyncio.create_task(self._watch(stream), name=f"agent-{self.workspace_id}-watch")
        try:
            for frame in pending:
                self._dispatch(*frame)
            while (chunk := await stream.read()) is not None:
                self._heard_at = time.monotonic()
                fd, data = chunk
                if fd != 1:
                    continue
                for frame in decoder.feed(data):
                    self._dispatch(*frame)
        except ProtocolError as exc:
            log.warning("agent.protocol_error", workspace_id=self.workspace_id, error=exc.message)
        except (OSError, ConnectionError) as exc:
            log.info("agent.stream_error", workspace_id=self.workspace_id, error=str(exc))
        finally:
            watch.cancel()
            if self._stream is stream:
                self._stream = None
                await stream.close(discard_input=True)
                for route in list(self._routes.values()):
                    route.on_disconnect()
                if self._routes and not self._closed:
                    self._reconnector = asyncio.create_task(self._reconnect(), name=f"agent-{self.workspace_id}-back")

    async def _watch(self, stream: ExecStream) -> None:
        """End a connection whose bridge is gone: under gVisor its exec's stream stays open.

        While calls wait on the link and it has been silent for a while, the engine is asked
        whether the bridge still runs.
        """
        while True:
            await asyncio.sleep(BRIDGE_CHECK_S)
            if not self._routes or time.monotonic() - self._heard_at < BRIDGE_CHECK_S:
                continue
            if await stream.exit_code() is not None:
                log.warning("agent.bridge_ended", workspace_id=self.workspace_id)
                await stream.close(discard_input=True)  # the reader sees the end and reconnects
                return

    def _dispatch(self, kind: bytes, channel: int, payload: bytes) -> None:
        if channel == 0:
            if kind == Kind.FROZEN:
                answer = self._frozen_answer
                if answer is not None and not answer.done():
                    try:
                        answer.set_result(json_object(payload, "frozen").get("frozen") is True)
                    except ProtocolError as exc:
                        answer.set_exception(exc)
            elif kind == Kind.ERROR:
                log.warning(
                    "agent.error", workspace_id=self.workspace_id, payload=payload[:500].decode("utf-8", "replace")
                )
            return
        route = self._routes.get(channel)
        if route is None:
            return  # a channel the daemon has let go (an evicted session's last frames)
        try:
            route.on_frame(kind, payload)
        except Exception:  # one channel's trouble is never the link's
            log.exception("agent.channel_failed", workspace_id=self.workspace_id, channel=channel)

    async def _reconnect(self) -> None:
        delays = (*RECONNECT_BACKOFF_S, *([RECONNECT_BACKOFF_S[-1]] * RECONNECT_ATTEMPTS))
        for delay in delays[:RECONNECT_ATTEMPTS]:
            await asyncio.sleep(delay)
            if self._closed or not self._routes or self._stream is not None:
                return
            try:
                await self.connect()
            except AgentLost:
                continue
            return
        log.warning("agent.unreachable", workspace_id=self.workspace_id)

    def register(self, route: Route, channel: int = 0) -> int:
        """Give ``route`` the frames of ``channel`` (0: the next free number); return the number."""
        if not channel:
            channel = self._next_channel
            self._next_channel += 1
        self._routes[channel] = route
        return channel

    def unregister(self, channel: int, route: Route) -> None:
        """Stop giving ``route`` the frames of ``channel`` (nothing if another holds it now)."""
        if self._routes.get(channel) is route:
            del self._routes[channel]

    async def send(self, kind: bytes, channel: int, payload: bytes | Mapping[str, Any] = b"") -> None:
        """Send one frame, connecting first if needed.

        Raises:
            AgentLost: the agent cannot be reached.
        """
        if self._stream is None:
            await self.connect()
        stream = self._stream
        if stream is None:
            msg = f"workspace {self.workspace_id!r}'s agent is not connected"
            raise AgentLost(msg)
        frame = encode(kind, channel, payload)
        async with self._write_lock:
            try:
                await stream.write(frame)
            except (OSError, ConnectionError) as exc:
                msg = f"workspace {self.workspace_id!r}'s agent connection broke: {exc}"
                raise AgentLost(msg) from None

    def rename(self, channel: int, process_id: str, daemon_state: Mapping[str, Any]) -> None:
        """Tell the agent a session's new process id and daemon state (a restored copy's: PROTOCOL.md, ``R``).

        Sent in the background: until it is through, the agent names the session as before,
        and a daemon that starts meanwhile renames it again.
        """

        async def send() -> None:
            try:
                await self.send(Kind.RENAME, channel, {"process_id": process_id, "daemon_state": dict(daemon_state)})
            except SandboxdError as exc:
                log.warning("agent.rename_failed", workspace_id=self.workspace_id, channel=channel, error=exc.message)

        task = asyncio.get_running_loop().create_task(send())
        self._renames.add(task)
        task.add_done_callback(self._renames.discard)

    @contextlib.asynccontextmanager
    async def let_go(self) -> AsyncIterator[None]:
        """Have the agent let go of the host for a checkpoint, inside the block; it listens again after.

        The agent stops its sessions' timers, stops listening and closes the connection (a socket
        bound or connected to the host cannot be saved: PROTOCOL.md, ``Z``); until the block
        ends, nothing connects (calls wait). After it, the container is signalled to listen
        again and the link connects as usual (its welcome, frozen, has the timers restarted).

        Raises:
            FailedPreconditionError: the agent predates checkpoints, or a port forward is open
                (its connection would be cut).
            AgentLost: the agent cannot be reached, or did not let go in time.
        """
        welcome = await self.connect()
        if "checkpoint" not in welcome.features:
            msg = (
                f"workspace {self.workspace_id!r} runs an agent without checkpoints (made by an older sandboxd): "
                "recreate it to snapshot its memory"
            )
            raise FailedPreconditionError(msg)
        if any(isinstance(route, ForwardRoute) for route in self._routes.values()):
            msg = (
                f"workspace {self.workspace_id!r} has a port forward open, whose connection a memory snapshot "
                "would cut: close it first"
            )
            raise FailedPreconditionError(msg)
        async with self._connect_lock:
            self._available.clear()
        try:
            await self._freeze_exchange(True, checkpoint=True)
            yield
        finally:
            await asyncio.shield(self._dialer.relisten())
            self._available.set()

    async def freeze(self, frozen: bool) -> None:
        """Stop (``frozen``) or restart every timeout and kill grace of the agent's sessions.

        Said before the workspace is paused and after it is resumed, so that the time it
        stood frozen counts toward no command's timeout (PROTOCOL.md, ``Z``). Nothing with
        an agent that lacks the ``freeze`` feature.

        Raises:
            AgentLost: the agent cannot be reached, or did not answer within ``FREEZE_TIMEOUT_S``.
        """
        welcome = await self.connect()
        if "freeze" not in welcome.features:
            return
        said = await self._freeze_exchange(frozen)
        if said is not frozen:
            msg = f"workspace {self.workspace_id!r}'s agent answered a freeze with frozen={said}"
            raise ProtocolError(msg)

    async def _freeze_exchange(self, frozen: bool, *, checkpoint: bool = False) -> bool:
        """Send ``Z`` and return what the agent's ``z`` says; with ``checkpoint``, also wait for it to hang up.

        Raises:
            AgentLost: no answer within ``FREEZE_TIMEOUT_S`` (or no hang-up within ``LETTING_GO_S``).
        """
        async with self._freeze_lock:
            answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._frozen_answer = answer
            try:
                await self.send(
                    Kind.FREEZE, 0, {"frozen": frozen, "checkpoint": True} if checkpoint else {"frozen": frozen}
                )
                async with asyncio.timeout(FREEZE_TIMEOUT_S):
                    said = await answer
                if checkpoint and (reader := self._reader) is not None:
                    async with asyncio.timeout(LETTING_GO_S):
                        await asyncio.shield(reader)
            except TimeoutError:
                what = "let go for a checkpoint in time" if checkpoint else f"answer a freeze in {FREEZE_TIMEOUT_S:g} s"
                msg = f"workspace {self.workspace_id!r}'s agent did not {what}"
                raise AgentLost(msg) from None
            finally:
                self._frozen_answer = None
        return said

    def file_operation(
        self, user: str, operation: Mapping[str, Any], stdin: AsyncIterable[bytes] | None = None
    ) -> AsyncGenerator[FileReply, None]:
        """Run one file operation as ``user`` over this link: see :func:`~sandboxd.agent.routes.run_file_operation`."""
        return run_file_operation(self, user, operation, stdin)

    def forward(self, port: int) -> contextlib.AbstractAsyncContextManager[ForwardedConnection]:
        """Open a TCP connection to ``port`` on the workspace's loopback; it is closed on leaving.

        Raises:
            AgentLost: the agent cannot be reached.
            ForwardError: nothing listens there (``refused``), or the connect failed.
            FailedPreconditionError: the agent predates forwarding (a workspace made by an
                older release).
        """
        return forward(self, port)

    async def close(self) -> None:
        """Close the connection for good (the workspace is going, or the daemon stops)."""
        self._closed = True
        for task in (self._reconnector, self._reader):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.close(discard_input=True)
