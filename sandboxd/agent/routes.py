"""The link's channels: a process session's, a file operation's and a forwarded connection's.

Each channel turns its frames into calls of what it serves and its calls into frames. A
channel reaches the link only through :class:`Frames`, the few things it needs of it, so
the link depends on the channels and never the other way round.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Mapping
from typing import Any, Protocol

from ..errors import FailedPreconditionError, SandboxdError
from .codec import (
    MAX_PAYLOAD_BYTES,
    U31,
    U64,
    FileReply,
    FileResult,
    HelperDecoder,
    Kind,
    int_field,
    json_object,
    output_frame,
    text_field,
)
from .errors import AgentLost, FileOperationError, FileOperationRefused, ForwardError, ProtocolError
from .messages import ExitReport, SessionEvents, StartRequest, Welcome
from .window import SendWindow

__all__ = [
    "FILE_INPUT_WINDOW_BYTES",
    "FILE_OUTPUT_WINDOW_BYTES",
    "FORWARD_CONNECT_TIMEOUT_S",
    "FORWARD_WINDOW_BYTES",
    "STDIN_WINDOW_BYTES",
    "ForwardedConnection",
    "Frames",
    "Route",
    "SessionChannel",
    "forward",
    "run_file_operation",
]

FILE_OUTPUT_WINDOW_BYTES = 256 * 1024
"""File-operation output the agent sends beyond the daemon's acknowledgement (PROTOCOL.md)."""
FILE_INPUT_WINDOW_BYTES = 1 << 20
"""File-operation input the daemon sends beyond what the agent's helper took (PROTOCOL.md)."""
FORWARD_WINDOW_BYTES = 512 * 1024
"""Most bytes of a forwarded connection in flight each way (the agent's ``ForwardWindow``)."""
STDIN_WINDOW_BYTES = 8 * 1024**2
"""Stdin sent to an agent with the ``input_taken`` feature that its command has not taken yet, at
most: half the agent's bound (it drops what comes past 16 MiB unread)."""
FORWARD_CONNECT_TIMEOUT_S = 15.0
"""Longest wait for the agent to say a forwarded connection is open (its own dial gives up at 10 s)."""


class Route(Protocol):
    """What the link tells a channel (called on the link's reader task; none may block)."""

    def on_frame(self, kind: bytes, payload: bytes) -> None:
        """One frame of this channel."""
        ...

    def on_disconnect(self) -> None:
        """The connection broke; frames in flight are lost."""
        ...

    def on_reconnect(self, welcome: Welcome) -> None:
        """A new connection is up; ``welcome`` lists what the agent still holds."""
        ...


class Frames(Protocol):
    """What a channel needs of the link: its number, and a way to send.

    :class:`~sandboxd.agent.link.AgentLink` is the one implementation; the channels name
    only this, so that the link's module imports theirs and not the other way round.
    """

    workspace_id: str

    async def connect(self) -> Welcome:
        """Open the connection if it is not; return the agent's welcome.

        Raises:
            AgentLost: the agent does not answer, or speaks another protocol.
        """
        ...

    def register(self, route: Route, channel: int = 0) -> int:
        """Give ``route`` the frames of ``channel`` (0: the next free number); return the number."""
        ...

    def unregister(self, channel: int, route: Route) -> None:
        """Stop giving ``route`` the frames of ``channel`` (nothing if another holds it now)."""
        ...

    async def send(self, kind: bytes, channel: int, payload: bytes | Mapping[str, Any] = b"") -> None:
        """Send one frame, connecting first if needed.

        Raises:
            AgentLost: the agent cannot be reached.
        """
        ...

    @property
    def connected(self) -> bool:
        """Whether a connection is up."""
        ...


class SessionChannel:
    """A process session's side of its channel: every frame it sends, every frame it gets decoded.

    Sending raises :class:`AgentLost` when the agent cannot be reached.
    """

    def __init__(self, link: Frames, events: SessionEvents, number: int) -> None:
        """Take channel ``number`` for ``events`` (:meth:`open` numbers a new one)."""
        self.link = link
        self.events = events
        self.number = link.register(self, number)
        self._unanswered: StartRequest | None = None
        """A start sent and not yet answered (``s`` or ``f``): sent again if its connection dies."""
        self._resend: asyncio.Task[None] | None = None
        self.stdin = SendWindow(STDIN_WINDOW_BYTES)
        """What the command's stdin was sent and took (feature ``input_taken``): every frame wakes a writer."""

    @classmethod
    async def open(cls, link: Frames, events: SessionEvents) -> SessionChannel:
        """A new channel, numbered once the link is up (above every channel the agent holds).

        Raises:
            AgentLost: the agent cannot be reached.
        """
        await link.connect()
        return cls(link, events, 0)

    async def start(self, request: StartRequest) -> None:
        """Ask the agent to start the command; ``on_started`` or ``on_start_failed`` follows."""
        self._unanswered = request
        await self.link.send(Kind.START, self.number, request.payload())

    async def write(self, data: bytes, *, going: Callable[[], bool] | None = None) -> None:
        """Bytes for the command's stdin (or terminal), in payloads of at most 1 MiB.

        With ``going`` (whether the command still runs), an agent that says what stdin took
        (``input_taken``) gets no more than ``STDIN_WINDOW_BYTES`` ahead of it: the writer waits,
        as at a full pipe, where the agent would drop input, until there is room or ``going()``
        is false. Without it the bytes go at once (a Ctrl-C must not wait behind unread input).
        """
        wait = going if going is not None and "input_taken" in (await self.link.connect()).features else None
        for start in range(0, len(data), MAX_PAYLOAD_BYTES):
            piece = data[start : start + MAX_PAYLOAD_BYTES]
            if wait is not None and not await self.stdin.room_for(len(piece), going=wait):
                return  # the command is gone: what it did not take is moot
            await self.link.send(Kind.INPUT, self.number, piece)
            self.stdin.sent += len(piece)

    async def close_input(self) -> None:
        """End the command's input (in tty mode, EOF characters)."""
        await self.link.send(Kind.CLOSE_INPUT, self.number)

    async def signal(self, number: int, *, interrupt: bool) -> None:
        """Signal ``number`` to the process group (0 sends none); ``interrupt`` marks a Ctrl-C."""
        await self.link.send(Kind.SIGNAL, self.number, {"signal": number, "interrupt": interrupt})

    async def kill(self, grace_s: float) -> None:
        """The kill ladder over the whole tree: SIGTERM, SIGKILL after ``grace_s`` seconds."""
        await self.link.send(Kind.KILL, self.number, {"grace_s": grace_s})

    async def resize(self, columns: int, rows: int) -> None:
        """The terminal's new size."""
        await self.link.send(Kind.WINDOW, self.number, {"columns": columns, "rows": rows})

    async def pull(
        self, *, ack: int, ack_gap: int, until: int, reader: bool, tail: bool = False, resend: bool = False
    ) -> None:
        """Acknowledge output up to ``ack`` (and ``ack_gap`` of a gap there); allow it up to ``until``.

        With ``tail`` the agent answers where its held output ends (``on_tail``; only an agent
        whose welcome lists the ``tail`` feature does). With ``resend`` it sends the output
        again from ``ack`` (feature ``resume``).
        """
        body: dict[str, Any] = {"ack": ack, "ack_gap": ack_gap, "until": until, "reader": reader}
        if tail:
            body["tail"] = True
        if resend:
            body["resend"] = True
        await self.link.send(Kind.PULL, self.number, body)

    async def discard(self) -> None:
        """Let the agent forget the session (a running command is killed) and close the channel."""
        try:
            await self.link.send(Kind.DISCARD, self.number)
        finally:
            self.close()

    def close(self) -> None:
        """Stop hearing this channel's frames (the agent may keep the session)."""
        self.link.unregister(self.number, self)
        self.stdin.wake()

    # -- from the agent ---------------------------------------------------------------------------
    def on_frame(self, kind: bytes, payload: bytes) -> None:
        """Decode one frame of this channel for the events."""
        events = self.events
        if kind in (Kind.STARTED, Kind.FAILED, Kind.ERROR):
            self._unanswered = None
        try:
            if kind == Kind.OUTPUT:
                events.on_output(*output_frame(payload))
            elif kind == Kind.DROPPED:
                report = json_object(payload, "dropped report")
                events.on_dropped(int_field(report, "offset", 0, U64), int_field(report, "bytes", 0, U64))
            elif kind == Kind.TAIL:
                events.on_tail(int_field(json_object(payload, "tail report"), "end", 0, U64))
            elif kind == Kind.FILE_TOOK:  # on a session: its stdin took the input so far
                self.stdin.took(int_field(json_object(payload, "input report"), "bytes", 0, U64))
            elif kind == Kind.STARTED:
                events.on_started(int_field(json_object(payload, "start report"), "pid", 1, U31))
            elif kind == Kind.FAILED:
                report = json_object(payload, "start failure")
                events.on_start_failed(
                    text_field(report, "stage", 64), text_field(report, "message", 16384) or "unknown error"
                )
            elif kind == Kind.EXITED:
                events.on_exited(ExitReport.parse(json_object(payload, "exit report")))
            elif kind == Kind.ERROR:
                report = json_object(payload, "error")
                events.on_broken(f"the workspace's agent refused this command: {text_field(report, 'message', 500)}")
            else:
                events.on_broken(f"the agent sent a frame of kind {kind!r} on a process session")
        except ProtocolError as exc:
            events.on_broken(f"the workspace's agent sent a bad frame: {exc.message}")
        self.stdin.wake()  # after the events: a writer sees the command's state as this frame left it

    def on_disconnect(self) -> None:
        """Pass the broken connection on."""
        self.events.on_disconnect()
        self.stdin.wake()

    def on_reconnect(self, welcome: Welcome) -> None:
        """Pass on what the agent still holds of this session; send a start it never had again."""
        state = next((s for s in welcome.sessions if s.channel == self.number), None)
        if state is not None:  # the agent's counts are the truth: input lost in flight is gone
            self.stdin.reset(state.input_received, state.input_taken)
        else:
            self.stdin.wake()
        if state is None and self._unanswered is not None:
            # The connection died with the start frame in it: the agent never saw the command.
            self._resend = asyncio.create_task(self._start_again(self._unanswered))
            return
        if state is not None and self._unanswered is not None and (state.pid or state.failed is not None):
            # The agent took the start and answered on the connection that died: its answer is
            # the welcome's, so the start is settled now, not left to wait out START_TIMEOUT_S.
            # (No pid and no failure: it is starting still, and answers on this connection.)
            self._unanswered = None
            if state.failed is not None:
                self.events.on_start_failed("", state.failed)
            else:
                self.events.on_started(state.pid)
        self.events.on_reconnect(state)

    async def _start_again(self, request: StartRequest) -> None:
        try:
            await self.start(request)
        except AgentLost as exc:
            self.events.on_broken(exc.message)


class _FileRoute:
    """One file operation's channel: output queued for its call, input window, the end."""

    def __init__(self) -> None:
        self.output: collections.deque[bytes] = collections.deque()
        self.changed = asyncio.Event()
        """Set by every frame: the call has something new."""
        self.input = SendWindow(FILE_INPUT_WINDOW_BYTES)
        """The operation's input: every frame wakes its feeder."""
        self.exit_code: int | None = None
        self.error = ""

    def _wake(self) -> None:
        self.changed.set()
        self.input.wake()

    def going(self) -> bool:
        """Whether the helper may still take input (it has not ended or failed)."""
        return not self.error and self.exit_code is None

    def on_frame(self, kind: bytes, payload: bytes) -> None:
        if kind == Kind.FILE_OUT:
            self.output.append(payload)
        elif kind == Kind.FILE_TOOK:
            with contextlib.suppress(ProtocolError):
                self.input.took(int_field(json_object(payload, "report"), "bytes", 0, U64))
        elif kind == Kind.RESULT:
            try:
                self.exit_code = int_field(json_object(payload, "result"), "exit_code", 0, 255)
            except ProtocolError as exc:
                self.error = exc.message
        elif kind == Kind.ERROR and self.exit_code is not None:
            # After the helper's end: about input the daemon sent while it died, which the
            # agent no longer had an operation for. The end is what the caller is told.
            pass
        elif kind == Kind.ERROR:
            try:
                self.error = text_field(json_object(payload, "error"), "message", 2000) or "unknown error"
            except ProtocolError as exc:
                self.error = exc.message
        else:
            self.error = f"the agent sent a frame of kind {kind!r} on a file operation"
        self._wake()

    def on_disconnect(self) -> None:
        self.error = self.error or "the connection to the workspace's agent broke during the file operation"
        self._wake()

    def on_reconnect(self, welcome: Welcome) -> None:
        del welcome  # a file operation does not outlive its connection


class ForwardRoute:
    """One forwarded connection's channel: the server's bytes queued for the call, the input window."""

    def __init__(self) -> None:
        self.output: collections.deque[bytes] = collections.deque()
        self.held = 0
        self.changed = asyncio.Event()
        self.input = SendWindow(FORWARD_WINDOW_BYTES)
        """What the client wrote: every frame wakes a waiting writer."""
        self.connected = asyncio.get_running_loop().create_future()
        self.hung_up = False
        self.error: ForwardError | None = None

    def _fail(self, code: str, message: str) -> None:
        if self.error is None:
            self.error = ForwardError(code, message)
        if not self.connected.done():
            self.connected.set_exception(self.error)

    def on_frame(self, kind: bytes, payload: bytes) -> None:
        if kind == Kind.CONNECTED:
            if not self.connected.done():
                self.connected.set_result(None)
        elif kind == Kind.FILE_OUT:
            if self.held + len(payload) > FORWARD_WINDOW_BYTES:
                self._fail("protocol", "the workspace's agent sent more than the forward's window")
            else:
                self.output.append(payload)
                self.held += len(payload)
        elif kind == Kind.FILE_TOOK:
            with contextlib.suppress(ProtocolError):
                self.input.took(int_field(json_object(payload, "report"), "bytes", 0, U64))
        elif kind == Kind.HUNG_UP:
            self.hung_up = True
        elif kind == Kind.ERROR:
            try:
                report = json_object(payload, "error")
                self._fail(
                    text_field(report, "code", 40) or "io", text_field(report, "message", 2000) or "unknown error"
                )
            except ProtocolError as exc:
                self._fail("protocol", exc.message)
        else:
            self._fail("protocol", f"the agent sent a frame of kind {kind!r} on a forwarded connection")
        self.changed.set()
        self.input.wake()

    def on_disconnect(self) -> None:
        self._fail("lost", "the connection to the workspace's agent broke")
        self.changed.set()
        self.input.wake()

    def on_reconnect(self, welcome: Welcome) -> None:
        del welcome  # a forwarded connection does not outlive its agent connection


class ForwardedConnection:
    """One TCP connection to a port in the workspace, through the agent (PROTOCOL.md, Forwarded connections).

    Each direction holds at most ``FORWARD_WINDOW_BYTES`` in flight: :meth:`write` waits
    for the agent to take what it was sent, and the agent waits for :meth:`read` to take
    what it sent.
    """

    def __init__(self, link: Frames, channel: int, route: ForwardRoute) -> None:
        """Wrap an open channel (:func:`forward` makes them)."""
        self._link, self._channel, self._route = link, channel, route
        self._taken = self._acked = 0

    async def read(self) -> bytes | None:
        """The server's next bytes, or None once it closed its side.

        Raises:
            ForwardError: the connection failed.
        """
        route = self._route
        while not route.output:
            if route.error is not None:
                raise route.error
            if route.hung_up:
                return None
            route.changed.clear()
            await route.changed.wait()
        data = route.output.popleft()
        route.held -= len(data)
        self._taken += len(data)
        if self._taken - self._acked >= FORWARD_WINDOW_BYTES // 4 or not route.output:
            self._acked = self._taken
            await self._link.send(Kind.FILE_ACK, self._channel, {"ack": self._acked})
        return data

    async def write(self, data: bytes) -> None:
        """Send bytes to the server, waiting while the window is full.

        Raises:
            ForwardError: the connection failed.
        """
        route = self._route
        piece_bytes = FORWARD_WINDOW_BYTES // 2
        for start in range(0, len(data), piece_bytes):
            piece = data[start : start + piece_bytes]
            await route.input.room_for(len(piece), going=lambda: route.error is None)
            if route.error is not None:
                raise route.error
            await self._link.send(Kind.FILE_DATA, self._channel, piece)
            route.input.sent += len(piece)

    async def close_write(self) -> None:
        """The client's side is done: the agent shuts the connection's writing half."""
        if self._route.error is None:
            await self._link.send(Kind.FILE_END, self._channel)


async def run_file_operation(
    link: Frames, user: str, operation: Mapping[str, Any], stdin: AsyncIterable[bytes] | None = None
) -> AsyncGenerator[FileReply, None]:
    """Run one file operation as ``user``; yield its replies as they come, a :class:`FileResult` last.

    Input from ``stdin`` is sent within the agent's window. Leaving early (an error,
    a cancel, ``aclose``) tells the agent to kill the operation's helper.

    Raises:
        AgentLost: the agent cannot be reached.
        FileOperationRefused: the operation failed (``code`` says how).
        FileOperationError: the helper could not start, broke the protocol, or the
            connection broke meanwhile.
    """
    await link.connect()  # numbered above every channel the agent holds
    route = _FileRoute()
    channel = link.register(route)
    feeder: asyncio.Task[None] | None = None
    decoder = HelperDecoder()
    done = False
    acked = received = 0
    try:
        await link.send(Kind.FILE_OP, channel, {"user": user, "operation": dict(operation)})
        if stdin is not None:
            feeder = asyncio.create_task(_feed(link, channel, route, stdin))
        while True:
            while route.output:
                data = route.output.popleft()
                received += len(data)
                try:
                    replies = decoder.feed(data)
                except FileOperationRefused:
                    done = True
                    raise
                except ProtocolError as exc:
                    raise FileOperationError(exc.message) from None
                for reply in replies:
                    yield reply
                    if isinstance(reply, FileResult):
                        done = True
                        return
                if received - acked >= FILE_OUTPUT_WINDOW_BYTES // 2 or not route.output:
                    acked = received
                    await link.send(Kind.FILE_ACK, channel, {"ack": acked})
            if route.error:
                raise FileOperationError(route.error)
            if route.exit_code is not None:
                # Its helper died before answering: most often it could not start the threads
                # its runtime needs in a workspace at its process (or memory) limit.
                msg = (
                    f"the file operation ended without a result (its helper exited with {route.exit_code}; "
                    "the workspace may be out of processes or memory)"
                )
                raise FileOperationError(msg)
            route.changed.clear()
            await route.changed.wait()
    finally:
        if feeder is not None:
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError, SandboxdError):
                await feeder
        link.unregister(channel, route)
        if not done and route.exit_code is None and link.connected:
            with contextlib.suppress(SandboxdError):
                await asyncio.shield(link.send(Kind.DISCARD, channel))


async def _feed(link: Frames, channel: int, route: _FileRoute, stdin: AsyncIterable[bytes]) -> None:
    async for chunk in stdin:
        for start in range(0, len(chunk), FILE_INPUT_WINDOW_BYTES // 4):
            piece = chunk[start : start + FILE_INPUT_WINDOW_BYTES // 4]
            if not await route.input.room_for(len(piece), going=route.going):
                return  # the helper is done (it failed early): the rest is moot
            await link.send(Kind.FILE_DATA, channel, piece)
            route.input.sent += len(piece)
    await link.send(Kind.FILE_END, channel)


@contextlib.asynccontextmanager
async def forward(link: Frames, port: int) -> AsyncGenerator[ForwardedConnection, None]:
    """Open a TCP connection to ``port`` on the workspace's loopback; it is closed on leaving.

    Raises:
        AgentLost: the agent cannot be reached.
        ForwardError: nothing listens there (``refused``), or the connect failed.
        FailedPreconditionError: the agent predates forwarding (a workspace made by an
            older release).
    """
    welcome = await link.connect()
    if "forward" not in welcome.features:
        msg = f"workspace {link.workspace_id!r}'s agent cannot forward ports: delete the workspace and create it again"
        raise FailedPreconditionError(msg)
    route = ForwardRoute()
    channel = link.register(route)
    try:
        await link.send(Kind.CONNECT, channel, {"port": port})
        try:
            async with asyncio.timeout(FORWARD_CONNECT_TIMEOUT_S):
                await route.connected
        except TimeoutError:
            msg = f"the agent did not open port {port} in {FORWARD_CONNECT_TIMEOUT_S:g} s"
            raise ForwardError(code="io", message=msg) from None
        yield ForwardedConnection(link, channel, route)
    finally:
        link.unregister(channel, route)
        if link.connected and route.error is None:
            with contextlib.suppress(SandboxdError):
                await asyncio.shield(link.send(Kind.DISCARD, channel))
