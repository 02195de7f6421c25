"""The daemon's side of the agent protocol (``agent/PROTOCOL.md``): the one module that speaks it.

Every workspace runs ``sandboxd-agent`` as its main process. An :class:`AgentLink`
is the daemon's one connection to it: a ``docker exec`` of ``sandboxd-agent bridge``
(as root) carrying length-prefixed frames in both directions, multiplexing every
process session and file operation as a numbered channel. A link that breaks is
made again (with backoff) while any channel is open; the agent keeps each session's
unacknowledged output meanwhile, so nothing is lost but frames in flight, which the
session asks for again.

Nothing outside this module sees a frame. A process session talks through a
:class:`SessionChannel` and hears back through the :class:`SessionEvents` it
implements; a file operation is one call of :meth:`AgentLink.file_operation`.

Frames coming from the agent are checked like any input: a length out of bounds
ends the connection (its calls fail cleanly and the link reconnects); a payload
that is not what its kind must carry fails only the call of its channel.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import dataclasses
import json
import os
import struct
import time
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Mapping
from typing import Any, Protocol

import grpc
import structlog

from .agentbuild import AGENT_PATH
from .backend.base import Backend, ExecStream
from .errors import DockerUnavailableError, FailedPreconditionError, SandboxdError

__all__ = [
    "AGENT_PATH",
    "MAX_MESSAGE_CHARS",
    "MAX_PAYLOAD_BYTES",
    "PROTOCOL_VERSION",
    "AgentBehindEngine",
    "AgentLink",
    "AgentLost",
    "ExitReport",
    "FileData",
    "FileLine",
    "FileOperationError",
    "FileOperationRefused",
    "FileReply",
    "FileResult",
    "ForwardError",
    "ForwardedConnection",
    "ProtocolError",
    "SessionChannel",
    "SessionEvents",
    "SessionState",
    "StartRequest",
    "Welcome",
]

log = structlog.get_logger(__name__)

PROTOCOL_VERSION = 1
MAX_PAYLOAD_BYTES = 1 << 20
"""Largest payload either side sends (PROTOCOL.md)."""

_HEADER = struct.Struct(">IcI")
_OUTPUT_HEADER = struct.Struct(">cQ")
CONNECT_TIMEOUT_S = 20.0
"""How long a new connection may take to be answered (a gVisor exec is slow under load)."""
RECONNECT_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
RECONNECT_ATTEMPTS = 40
"""Attempts before a link gives up until the next call (about 70 s: a container restart fits)."""
BRIDGE_CHECK_S = 2.0
"""Silence on a link with calls waiting after which the engine is asked if the bridge still runs."""
LEARN_AGAIN_S = (0.1, 0.3, 0.6, 1.0, 2.0, 4.0, 8.0, 15.0)
"""Waits before asking again whether the host sees a runtime's sockets, after a first no (31 s in all:
gVisor under load has been seen to take more than 4 s)."""
FREEZE_TIMEOUT_S = 5.0
"""How long the agent may take to answer a freeze (it answers at once unless it is stuck)."""
PRESENT_WAIT_S = 3.0
"""How long a direct connection tries a socket that is there but does not answer, before the bridge."""
LISTEN_WAIT_S = 10.0
"""How long a direct connection waits for a starting agent to listen (the bridge waits as long)."""
FILE_OUTPUT_WINDOW_BYTES = 256 * 1024
"""File-operation output the agent sends beyond the daemon's acknowledgement (PROTOCOL.md)."""
FILE_INPUT_WINDOW_BYTES = 1 << 20
"""File-operation input the daemon sends beyond what the agent's helper took (PROTOCOL.md)."""
FORWARD_WINDOW_BYTES = 512 * 1024
"""Most bytes of a forwarded connection in flight each way (the agent's ``ForwardWindow``)."""
FORWARD_CONNECT_TIMEOUT_S = 15.0
"""Longest wait for the agent to say a forwarded connection is open (its own dial gives up at 10 s)."""
MAX_HELPER_FRAME_BYTES = 4 * 1024 * 1024
"""Largest frame of a file operation's reply (its data comes in 64 KiB frames; a listing's result is bigger)."""
MAX_MESSAGE_CHARS = 16384
"""Longest error message taken from the agent: room for a request's paths (4 KiB each), which the
RPC layer then shortens for the caller."""
_HELPER_HEADER = struct.Struct(">cI")
_U64 = 2**64 - 1
_U31 = 2**31 - 1


class _Kind:
    """Frame kinds (one byte each): upper case from the daemon, lower case from the agent."""

    HELLO = b"H"
    START = b"S"
    INPUT = b"I"
    CLOSE_INPUT = b"C"
    SIGNAL = b"G"
    KILL = b"K"
    WINDOW = b"W"
    PULL = b"P"
    DISCARD = b"D"
    FILE_OP = b"F"
    FILE_DATA = b"B"
    FILE_END = b"E"
    FILE_ACK = b"A"
    FREEZE = b"Z"
    CONNECT = b"N"
    WELCOME = b"w"
    STARTED = b"s"
    FAILED = b"f"
    OUTPUT = b"o"
    DROPPED = b"d"
    TAIL = b"t"
    EXITED = b"x"
    FILE_TOOK = b"k"
    FILE_OUT = b"b"
    RESULT = b"r"
    ERROR = b"e"
    FROZEN = b"z"
    CONNECTED = b"n"
    HUNG_UP = b"h"


class ProtocolError(SandboxdError):
    """The agent sent something the protocol does not allow."""


class AgentLost(FailedPreconditionError):
    """The workspace's agent cannot be reached right now (or was restarted)."""


class AgentBehindEngine(AgentLost):
    """The agent cannot be reached because the Docker engine cannot (restarting): UNAVAILABLE.

    An :class:`AgentLost` still, so that whatever waits out a lost agent (a reconnect, a
    resent start) waits this out too; but the caller is told what it is, as for any call
    made while the engine is away.
    """

    grpc_code = grpc.StatusCode.UNAVAILABLE


class FileOperationError(FailedPreconditionError):
    """The agent could not run a file operation (its helper did not start, or the call broke)."""


class FileOperationRefused(SandboxdError):
    """The file operation failed in the container, as its helper says.

    ``code`` is one of ``internal/fileops``' codes: ``not_found``, ``permission``,
    ``exists``, ``is_directory``, ``not_directory``, ``invalid``, ``not_empty``, ``busy``, ``binary``,
    ``too_large``, ``conflict``, ``network``, ``no_space``, ``io``...
    """

    def __init__(self, code: str, message: str) -> None:
        """Carry the helper's code and message."""
        super().__init__(message)
        self.code = code


class ForwardError(FailedPreconditionError):
    """A forwarded connection could not be opened, or failed: ``code`` is the agent's.

    ``refused`` (nothing listens on the port), ``io`` (the connection failed), ``protocol``,
    or ``lost`` (the connection to the agent broke).
    """

    def __init__(self, code: str, message: str) -> None:
        """Carry the agent's code and message."""
        super().__init__(message)
        self.code = code


@dataclasses.dataclass(frozen=True)
class FileData:
    """Bytes of a file operation's output (a file's content, a tar stream)."""

    data: bytes


@dataclasses.dataclass(frozen=True)
class FileLine:
    """One selected line of a text read: its whole length in characters, and its first bytes."""

    chars: int
    data: bytes


@dataclasses.dataclass(frozen=True)
class FileResult:
    """A file operation's result (its last item), every string valid Unicode."""

    value: dict[str, Any]


FileReply = FileData | FileLine | FileResult


def from_container_json(payload: bytes) -> Any:
    """JSON from the container, every string made valid Unicode.

    File names are bytes: one that is not UTF-8 arrives as lone surrogates, which no
    gRPC message can carry; they are shown as U+FFFD, as file contents are.

    Raises:
        ValueError: not JSON.
    """

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            try:
                return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            except UnicodeEncodeError:
                return value.encode("utf-8", "replace").decode("utf-8", "replace")
        if isinstance(value, list):
            return [clean(item) for item in value]
        if isinstance(value, dict):
            return {clean(key): clean(item) for key, item in value.items()}
        return value

    return clean(json.loads(payload))


class _HelperDecoder:
    """The file-operation helper's reply frames (one kind byte, 4-byte length, payload)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[FileReply]:
        """Whole replies now complete.

        Raises:
            FileOperationRefused: the helper's error.
            ProtocolError: a frame that is too big, unknown or malformed.
        """
        self._buffer += data
        out: list[FileReply] = []
        while len(self._buffer) >= _HELPER_HEADER.size:
            kind, length = _HELPER_HEADER.unpack_from(self._buffer)
            if length > MAX_HELPER_FRAME_BYTES:
                msg = f"the file operation sent a frame of {length} bytes"
                raise ProtocolError(msg)
            end = _HELPER_HEADER.size + length
            if len(self._buffer) < end:
                break
            payload = bytes(self._buffer[_HELPER_HEADER.size : end])
            del self._buffer[:end]
            out.append(self._reply(kind, payload))
        return out

    @staticmethod
    def _reply(kind: bytes, payload: bytes) -> FileReply:
        if kind == b"D":
            return FileData(payload)
        if kind == b"L" and len(payload) >= 8:
            (chars,) = struct.unpack_from(">Q", payload)
            return FileLine(chars, payload[8:])
        if kind in (b"R", b"E"):
            try:
                value = from_container_json(payload)
            except ValueError:
                value = None
            if not isinstance(value, dict):
                msg = "the file operation's reply is not a JSON object"
                raise ProtocolError(msg)
            if kind == b"R":
                return FileResult(value)
            code, message = value.get("code"), value.get("message")
            if not isinstance(code, str) or not isinstance(message, str):
                msg = "the file operation's error is malformed"
                raise ProtocolError(msg)
            raise FileOperationRefused(code[:64], message[:MAX_MESSAGE_CHARS])
        msg = f"the file operation sent a frame of kind {kind!r}"
        raise ProtocolError(msg)


def _json_object(payload: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(payload)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        msg = f"the agent's {what} is not a JSON object"
        raise ProtocolError(msg)
    return value


def _int(report: Mapping[str, Any], key: str, low: int, high: int, *, default: int | None = None) -> int:
    """An integer field of an agent report, within ``[low, high]``.

    Raises:
        ProtocolError: missing (without a default), not an integer, or out of range.
    """
    value = report.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        msg = f"the agent's report has {key} = {shown}, not an integer in [{low}, {high}]"
        raise ProtocolError(msg)
    return value


def _text(report: Mapping[str, Any], key: str, limit: int) -> str:
    value = report.get(key) or ""
    if not isinstance(value, str):
        msg = f"the agent's report has a {key} that is not a string"
        raise ProtocolError(msg)
    return value[:limit]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExitReport:
    """A command's end as the agent reports it (``x``)."""

    exit_code: int
    signal: int
    oom_kills: int
    timed_out: bool
    leftovers: int
    """Processes of the command still alive when it exited."""
    spill_path: str
    end: int
    """Offset just past the command's last output byte."""
    dropped: int
    """Output bytes the agent dropped (nobody read them in time)."""

    @classmethod
    def parse(cls, report: Mapping[str, Any]) -> ExitReport:
        """Check and read an exit report.

        Raises:
            ProtocolError: a field missing, of the wrong type, or out of range.
        """
        return cls(
            exit_code=_int(report, "exit_code", 0, 255),
            signal=_int(report, "signal", 0, 64),
            oom_kills=_int(report, "oom_kills", 0, _U31, default=0),
            timed_out=bool(report.get("timed_out")),
            leftovers=_int(report, "leftovers", 0, _U31, default=0),
            spill_path=_text(report, "spill_path", 4096),
            end=_int(report, "end", 0, _U64),
            dropped=_int(report, "dropped", 0, _U64, default=0),
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class SessionState:
    """A session the agent holds, as it describes it to a (re)connecting daemon."""

    channel: int
    process_id: str
    pid: int
    ack: int
    """Output offset up to which the daemon acknowledged (callers took) the output."""
    ack_gap: int
    """How much of a gap at ``ack`` callers were already told of."""
    exit: ExitReport | None
    failed: str | None
    """Why the command never started, if it did not."""
    interrupted: bool
    """A Ctrl-C reached the command."""
    daemon_state: Mapping[str, Any]
    """What the daemon asked the agent to keep (``StartRequest.daemon_state``)."""

    @classmethod
    def parse(cls, state: Mapping[str, Any]) -> SessionState:
        """Check and read one ``STATE`` of a welcome.

        Raises:
            ProtocolError: a field missing, of the wrong type, or out of range.
        """
        exit_report = state.get("exit")
        failed = state.get("failed")
        daemon_state = state.get("daemon_state")
        return cls(
            channel=_int(state, "channel", 1, 2**32 - 1),
            process_id=_text(state, "process_id", 64),
            pid=_int(state, "pid", 0, _U31, default=0),
            ack=_int(state, "ack", 0, _U64, default=0),
            ack_gap=_int(state, "ack_gap", 0, _U64, default=0),
            exit=ExitReport.parse(exit_report) if isinstance(exit_report, dict) else None,
            failed=(_text(failed, "message", 16384) or "unknown error") if isinstance(failed, dict) else None,
            interrupted=bool(state.get("interrupted")),
            daemon_state=daemon_state if isinstance(daemon_state, dict) else {},
        )


@dataclasses.dataclass(frozen=True)
class Welcome:
    """What the agent said when the connection opened."""

    agent: str
    """The agent's version."""
    pid: int
    sessions: tuple[SessionState, ...]
    features: frozenset[str] = frozenset()
    """What the agent does beyond the protocol's first release (PROTOCOL.md): ``tail``, ``freeze``."""
    frozen: bool = False
    """Whether its timers stand still (a pause the daemon has not yet ended with a thaw)."""

    @classmethod
    def parse(cls, payload: bytes, workspace_id: str) -> Welcome:
        """Check and read a ``w`` frame; a session state that does not parse is left out (and logged).

        Raises:
            ProtocolError: not a welcome of this protocol version.
        """
        body = _json_object(payload, "welcome")
        if body.get("protocol") != PROTOCOL_VERSION:
            msg = f"it speaks protocol {str(body.get('protocol'))[:20]}, this daemon {PROTOCOL_VERSION}"
            raise ProtocolError(msg)
        sessions = []
        for raw in body.get("sessions") or []:
            try:
                sessions.append(SessionState.parse(raw if isinstance(raw, dict) else {}))
            except ProtocolError as exc:
                log.warning("agent.bad_session_state", workspace_id=workspace_id, error=exc.message)
        listed = body.get("features")
        features = frozenset(f for f in listed[:32] if isinstance(f, str)) if isinstance(listed, list) else frozenset()
        return cls(
            agent=_text(body, "agent", 64),
            pid=_int(body, "pid", 0, _U31, default=0),
            sessions=tuple(sessions),
            features=features,
            frozen=body.get("frozen") is True,
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class StartRequest:
    """A command for the agent to start (``S``; fields as PROTOCOL.md names them)."""

    process_id: str
    command: str
    cwd: str
    env: Mapping[str, str]
    user: str
    tty: bool
    columns: int
    rows: int
    timeout_s: float
    grace_s: float
    buffer_bytes: int
    spill_path: str
    spill_after_bytes: int
    merge_stderr: bool
    capabilities: tuple[str, ...]
    daemon_state: Mapping[str, Any]

    def payload(self) -> dict[str, Any]:
        """The ``S`` frame's JSON object."""
        body = dataclasses.asdict(self)
        body["env"] = list(self.env.items())
        body["capabilities"] = list(self.capabilities)
        body["daemon_state"] = dict(self.daemon_state)
        return body


class SessionEvents(Protocol):
    """What a process session hears from the agent (called on the link's reader task; none may block)."""

    def on_started(self, pid: int) -> None:
        """The command runs (reported before it can run a single instruction)."""
        ...

    def on_start_failed(self, stage: str, message: str) -> None:
        """The command could not start; ``stage`` is ``user``, ``chdir``, ``exec``, ``fork``..."""
        ...

    def on_output(self, stream: str, offset: int, data: bytes) -> None:
        """Output bytes at ``offset`` (both streams numbered together), ``stream`` ``stdout`` or ``stderr``."""
        ...

    def on_dropped(self, offset: int, total: int) -> None:
        """Output lost at ``offset``: ``total`` bytes so far at that place."""
        ...

    def on_tail(self, end: int) -> None:
        """The answer to a tail pull: the agent's held output ends at ``end``."""
        ...

    def on_exited(self, report: ExitReport) -> None:
        """The command ended; every output byte before ``report.end`` has been (or is being) sent."""
        ...

    def on_broken(self, message: str) -> None:
        """The agent refused a frame of this session or sent one it must not: the session cannot go on."""
        ...

    def on_disconnect(self) -> None:
        """The connection broke; frames in flight are lost."""
        ...

    def on_reconnect(self, state: SessionState | None) -> None:
        """A new connection is up; ``state`` is what the agent still holds of this session (None: nothing)."""
        ...


class _Route(Protocol):
    def on_frame(self, kind: bytes, payload: bytes) -> None: ...
    def on_disconnect(self) -> None: ...
    def on_reconnect(self, welcome: Welcome) -> None: ...


class _Decoder:
    """Splits the agent's byte stream into frames; a bad length is fatal for the connection."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, int, bytes]]:
        # A stream's bytes pass here at hundreds of MiB/s: each payload is copied once, straight
        # out of what arrived; only the frame a read ended inside waits in the buffer.
        out: list[tuple[bytes, int, bytes]] = []
        with memoryview(data) as view:
            pos = self._finish(view, out)
            while len(view) - pos >= _HEADER.size:
                length, kind, channel = self._header(view, pos)
                if len(view) - pos < 4 + length:
                    break
                out.append((kind, channel, bytes(view[pos + _HEADER.size : pos + 4 + length])))
                pos += 4 + length
            self._buffer += view[pos:]
        return out

    def _finish(self, view: memoryview, out: list[tuple[bytes, int, bytes]]) -> int:
        """Complete the frame begun in an earlier read; return how much of ``view`` it took."""
        if not self._buffer:
            return 0
        pos = min(max(_HEADER.size - len(self._buffer), 0), len(view))
        self._buffer += view[:pos]
        if len(self._buffer) < _HEADER.size:
            return pos
        length, kind, channel = self._header(self._buffer, 0)
        take = min(4 + length - len(self._buffer), len(view) - pos)
        self._buffer += view[pos : pos + take]
        if len(self._buffer) == 4 + length:
            with memoryview(self._buffer) as whole:
                out.append((kind, channel, bytes(whole[_HEADER.size :])))
            self._buffer = bytearray()
        return pos + take

    @staticmethod
    def _header(buffer: memoryview | bytearray, pos: int) -> tuple[int, bytes, int]:
        length, kind, channel = _HEADER.unpack_from(buffer, pos)
        if length < 5 or length - 5 > MAX_PAYLOAD_BYTES:
            msg = f"the agent sent a frame of {length} bytes"
            raise ProtocolError(msg)
        return length, kind, channel


def _present(path: str) -> bool:
    """Whether anything is at ``path`` (a stat of a local tmpfs: it does not block)."""
    return os.path.lexists(path)


def encode(kind: bytes, channel: int, payload: bytes | Mapping[str, Any] = b"") -> bytes:
    """One frame."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload, separators=(",", ":")).encode()
    return _HEADER.pack(len(body) + 5, kind, channel) + body


def _output(payload: bytes) -> tuple[str, int, bytes]:
    """An ``o`` frame: ``(stream, offset, data)``.

    Raises:
        ProtocolError: too short, or no stream named.
    """
    if len(payload) < _OUTPUT_HEADER.size:
        msg = "the agent's output frame is too short"
        raise ProtocolError(msg)
    stream, offset = _OUTPUT_HEADER.unpack_from(payload)
    if stream not in (b"1", b"2"):
        msg = "the agent's output frame names no stream"
        raise ProtocolError(msg)
    return ("stdout" if stream == b"1" else "stderr"), offset, payload[_OUTPUT_HEADER.size :]


class SessionChannel:
    """A process session's side of its channel: every frame it sends, every frame it gets decoded.

    Sending raises :class:`AgentLost` when the agent cannot be reached.
    """

    def __init__(self, link: AgentLink, events: SessionEvents, number: int) -> None:
        """Take channel ``number`` for ``events`` (:meth:`open` numbers a new one)."""
        self.link = link
        self.events = events
        self.number = link._register(self, number)
        self._unanswered: StartRequest | None = None
        """A start sent and not yet answered (``s`` or ``f``): sent again if its connection dies."""
        self._resend: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, link: AgentLink, events: SessionEvents) -> SessionChannel:
        """A new channel, numbered once the link is up (above every channel the agent holds).

        Raises:
            AgentLost: the agent cannot be reached.
        """
        await link.connect()
        return cls(link, events, 0)

    async def start(self, request: StartRequest) -> None:
        """Ask the agent to start the command; ``on_started`` or ``on_start_failed`` follows."""
        self._unanswered = request
        await self.link._send(_Kind.START, self.number, request.payload())

    async def write(self, data: bytes) -> None:
        """Bytes for the command's stdin (or terminal), in payloads of at most 1 MiB."""
        for start in range(0, len(data), MAX_PAYLOAD_BYTES):
            await self.link._send(_Kind.INPUT, self.number, data[start : start + MAX_PAYLOAD_BYTES])

    async def close_input(self) -> None:
        """End the command's input (in tty mode, EOF characters)."""
        await self.link._send(_Kind.CLOSE_INPUT, self.number)

    async def signal(self, number: int, *, interrupt: bool) -> None:
        """Signal ``number`` to the process group (0 sends none); ``interrupt`` marks a Ctrl-C."""
        await self.link._send(_Kind.SIGNAL, self.number, {"signal": number, "interrupt": interrupt})

    async def kill(self, grace_s: float) -> None:
        """The kill ladder over the whole tree: SIGTERM, SIGKILL after ``grace_s`` seconds."""
        await self.link._send(_Kind.KILL, self.number, {"grace_s": grace_s})

    async def resize(self, columns: int, rows: int) -> None:
        """The terminal's new size."""
        await self.link._send(_Kind.WINDOW, self.number, {"columns": columns, "rows": rows})

    async def pull(self, *, ack: int, ack_gap: int, until: int, reader: bool, tail: bool = False) -> None:
        """Acknowledge output up to ``ack`` (and ``ack_gap`` of a gap there); allow it up to ``until``.

        With ``tail`` the agent answers where its held output ends (``on_tail``; only an agent
        whose welcome lists the ``tail`` feature does).
        """
        body: dict[str, Any] = {"ack": ack, "ack_gap": ack_gap, "until": until, "reader": reader}
        if tail:
            body["tail"] = True
        await self.link._send(_Kind.PULL, self.number, body)

    async def discard(self) -> None:
        """Let the agent forget the session (a running command is killed) and close the channel."""
        try:
            await self.link._send(_Kind.DISCARD, self.number)
        finally:
            self.close()

    def close(self) -> None:
        """Stop hearing this channel's frames (the agent may keep the session)."""
        self.link._unregister(self.number, self)

    # -- from the agent ---------------------------------------------------------------------------
    def on_frame(self, kind: bytes, payload: bytes) -> None:
        """Decode one frame of this channel for the events."""
        events = self.events
        if kind in (_Kind.STARTED, _Kind.FAILED, _Kind.ERROR):
            self._unanswered = None
        try:
            if kind == _Kind.OUTPUT:
                events.on_output(*_output(payload))
            elif kind == _Kind.DROPPED:
                report = _json_object(payload, "dropped report")
                events.on_dropped(_int(report, "offset", 0, _U64), _int(report, "bytes", 0, _U64))
            elif kind == _Kind.TAIL:
                events.on_tail(_int(_json_object(payload, "tail report"), "end", 0, _U64))
            elif kind == _Kind.STARTED:
                events.on_started(_int(_json_object(payload, "start report"), "pid", 1, _U31))
            elif kind == _Kind.FAILED:
                report = _json_object(payload, "start failure")
                events.on_start_failed(_text(report, "stage", 64), _text(report, "message", 16384) or "unknown error")
            elif kind == _Kind.EXITED:
                events.on_exited(ExitReport.parse(_json_object(payload, "exit report")))
            elif kind == _Kind.ERROR:
                report = _json_object(payload, "error")
                events.on_broken(f"the workspace's agent refused this command: {_text(report, 'message', 500)}")
            else:
                events.on_broken(f"the agent sent a frame of kind {kind!r} on a process session")
        except ProtocolError as exc:
            events.on_broken(f"the workspace's agent sent a bad frame: {exc.message}")

    def on_disconnect(self) -> None:
        """Pass the broken connection on."""
        self.events.on_disconnect()

    def on_reconnect(self, welcome: Welcome) -> None:
        """Pass on what the agent still holds of this session; send a start it never had again."""
        state = next((s for s in welcome.sessions if s.channel == self.number), None)
        if state is None and self._unanswered is not None:
            # The connection died with the start frame in it: the agent never saw the command.
            self._resend = asyncio.create_task(self._start_again(self._unanswered))
            return
        self.events.on_reconnect(state)

    async def _start_again(self, request: StartRequest) -> None:
        try:
            await self.start(request)
        except AgentLost as exc:
            self.events.on_broken(exc.message)


def _in_flight(route: _Route) -> bool:
    """Whether a route would lose something with its connection: a file operation, a forward, a start unanswered."""
    if isinstance(route, SessionChannel):
        return route._unanswered is not None
    return isinstance(route, (_FileRoute, _ForwardRoute))


class _FileRoute:
    """One file operation's channel: output queued for its call, input window, the end."""

    def __init__(self) -> None:
        self.output: collections.deque[bytes] = collections.deque()
        self.changed = asyncio.Event()
        """Set by every frame: the call has something new."""
        self.room = asyncio.Event()
        """Set by every frame: the input feeder may have room again."""
        self.took = 0
        self.exit_code: int | None = None
        self.error = ""

    def _wake(self) -> None:
        self.changed.set()
        self.room.set()

    def on_frame(self, kind: bytes, payload: bytes) -> None:
        if kind == _Kind.FILE_OUT:
            self.output.append(payload)
        elif kind == _Kind.FILE_TOOK:
            with contextlib.suppress(ProtocolError):
                self.took = max(self.took, _int(_json_object(payload, "report"), "bytes", 0, _U64))
        elif kind == _Kind.RESULT:
            try:
                self.exit_code = _int(_json_object(payload, "result"), "exit_code", 0, 255)
            except ProtocolError as exc:
                self.error = exc.message
        elif kind == _Kind.ERROR:
            try:
                self.error = _text(_json_object(payload, "error"), "message", 2000) or "unknown error"
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


class _ForwardRoute:
    """One forwarded connection's channel: the server's bytes queued for the call, the input window."""

    def __init__(self) -> None:
        self.output: collections.deque[bytes] = collections.deque()
        self.held = 0
        self.changed = asyncio.Event()
        self.room = asyncio.Event()
        self.connected = asyncio.get_running_loop().create_future()
        self.took = 0
        self.hung_up = False
        self.error: ForwardError | None = None

    def _fail(self, code: str, message: str) -> None:
        if self.error is None:
            self.error = ForwardError(code, message)
        if not self.connected.done():
            self.connected.set_exception(self.error)

    def on_frame(self, kind: bytes, payload: bytes) -> None:
        if kind == _Kind.CONNECTED:
            if not self.connected.done():
                self.connected.set_result(None)
        elif kind == _Kind.FILE_OUT:
            if self.held + len(payload) > FORWARD_WINDOW_BYTES:
                self._fail("protocol", "the workspace's agent sent more than the forward's window")
            else:
                self.output.append(payload)
                self.held += len(payload)
        elif kind == _Kind.FILE_TOOK:
            with contextlib.suppress(ProtocolError):
                self.took = max(self.took, _int(_json_object(payload, "report"), "bytes", 0, _U64))
        elif kind == _Kind.HUNG_UP:
            self.hung_up = True
        elif kind == _Kind.ERROR:
            try:
                report = _json_object(payload, "error")
                self._fail(_text(report, "code", 40) or "io", _text(report, "message", 2000) or "unknown error")
            except ProtocolError as exc:
                self._fail("protocol", exc.message)
        else:
            self._fail("protocol", f"the agent sent a frame of kind {kind!r} on a forwarded connection")
        self.changed.set()
        self.room.set()

    def on_disconnect(self) -> None:
        self._fail("lost", "the connection to the workspace's agent broke")
        self.changed.set()
        self.room.set()

    def on_reconnect(self, welcome: Welcome) -> None:
        del welcome  # a forwarded connection does not outlive its agent connection


class ForwardedConnection:
    """One TCP connection to a port in the workspace, through the agent (PROTOCOL.md, Forwarded connections).

    Each direction holds at most ``FORWARD_WINDOW_BYTES`` in flight: :meth:`write` waits
    for the agent to take what it was sent, and the agent waits for :meth:`read` to take
    what it sent.
    """

    def __init__(self, link: AgentLink, channel: int, route: _ForwardRoute) -> None:
        """Wrap an open channel (:meth:`AgentLink.forward` makes them)."""
        self._link, self._channel, self._route = link, channel, route
        self._sent = self._taken = self._acked = 0

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
            await self._link._send(_Kind.FILE_ACK, self._channel, {"ack": self._acked})
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
            while self._sent + len(piece) - route.took > FORWARD_WINDOW_BYTES:
                if route.error is not None:
                    raise route.error
                route.room.clear()
                await route.room.wait()
            if route.error is not None:
                raise route.error
            await self._link._send(_Kind.FILE_DATA, self._channel, piece)
            self._sent += len(piece)

    async def close_write(self) -> None:
        """The client's side is done: the agent shuts the connection's writing half."""
        if self._route.error is None:
            await self._link._send(_Kind.FILE_END, self._channel)


class AgentLink:
    """The connection to one workspace's agent.

    The connection goes straight to the agent's socket where this machine sees it (the
    engine is local and the runtime shows the container's sockets on the host), else through
    a ``docker exec`` of the bridge (PROTOCOL.md, Transport).

    Args:
        backend: the engine, for the socket or the ``docker exec`` of the bridge.
        workspace_id: the workspace.
        container_id: its container (calls go to exactly it).
        socket_path: the agent's socket as the engine's host sees it; empty: the bridge only.
        runtime: the container's runtime (what the host sees of it is learnt per runtime).
        host_sockets: the runtimes whose containers' sockets this host is known to see, shared
            by the links of one engine: runc's always, gVisor's with ``--host-uds=create``, a
            virtual machine's never. A link adds its runtime once its agent answered there.
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
        self.socket_path = socket_path
        self.runtime = runtime
        self.host_sockets = host_sockets if host_sockets is not None else set()
        self.transport = ""
        """How the current connection goes: ``socket`` or ``bridge`` (empty before the first)."""
        self.welcome: Welcome | None = None
        self._stream: ExecStream | None = None
        self._reader: asyncio.Task[None] | None = None
        self._reconnector: asyncio.Task[None] | None = None
        self._routes: dict[int, _Route] = {}
        self._next_channel = 1
        self._connect_lock = asyncio.Lock()
        self._write_lock = asyncio.Lock()
        self._closed = False
        self._heard_at = 0.0
        self._learner: asyncio.Task[None] | None = None
        self._freeze_lock = asyncio.Lock()
        self._frozen_answer: asyncio.Future[bool] | None = None
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
        async with self._connect_lock:
            if self._stream is not None and self.welcome is not None:
                return self.welcome
            if self._closed:
                msg = f"the link to workspace {self.workspace_id!r}'s agent is closed"
                raise AgentLost(msg)
            return await self._open()

    async def _direct(self) -> ExecStream | None:
        """A connection to the agent's socket from the host, when the host is known to see it."""
        if not self.socket_path or self.runtime not in self.host_sockets:
            return None
        began = time.monotonic()
        while (stream := await self.backend.open_socket(self.socket_path, self.container_id)) is None:
            # Only a socket not there yet is worth the full wait (a workspace just created: its
            # agent is starting). One there that does not answer gets a moment (gVisor under load
            # shows the file before it answers, seen in CI), then it is the bridge's to try.
            waited = time.monotonic() - began
            if waited > (PRESENT_WAIT_S if _present(self.socket_path) else LISTEN_WAIT_S):
                return None
            await asyncio.sleep(0.005 if waited < 0.1 else 0.05)
        return stream

    async def _learn_host_sockets(self) -> bool:
        """After a bridge's welcome (the agent listens): whether the agent answers from this host.

        Only a yes is kept for the runtime. A no is this workspace's alone (a workspace whose
        root planted something at the path, an agent restarting): the next link asks again,
        at the cost of one connect.
        """
        if not self.socket_path or self.runtime in self.host_sockets:
            return False
        if await self._probe():
            return True
        if self._learner is None:
            # gVisor can show the host its socket a moment after the agent answered through the
            # bridge (seen under load): asked again a few times, and the link moves there then.
            self._learner = asyncio.create_task(self._learn_later(), name=f"agent-{self.workspace_id}-learn")
        return False

    async def _probe(self) -> bool:
        probe = await self.backend.open_socket(self.socket_path, self.container_id)
        if probe is None:
            return False
        await probe.close(discard_input=True)
        self.host_sockets.add(self.runtime)
        log.info("agent.host_sockets", runtime=self.runtime or "default")
        return True

    async def _learn_later(self) -> None:
        for delay in LEARN_AGAIN_S:
            await asyncio.sleep(delay)
            if self._closed:
                return
            if self.runtime in self.host_sockets or await self._probe():
                break
        else:
            log.warning(
                "agent.host_sockets_unseen",
                workspace_id=self.workspace_id,
                runtime=self.runtime or "default",
                present=_present(self.socket_path),
            )
            return
        # Off the bridge, once no file operation or forward is in flight (its call would end with the
        # connection; a session's output is sent again from where the daemon has it) and no start
        # waits for its answer (the answer would be lost with the connection).
        while not self._closed and self.transport == "bridge" and self._stream is not None:
            if not any(_in_flight(route) for route in self._routes.values()):
                log.info("agent.moving_to_socket", workspace_id=self.workspace_id)
                await self._stream.close(discard_input=True)  # the reader reconnects, straight
                return
            await asyncio.sleep(0.05)

    async def _open(self) -> Welcome:
        stream = await self._direct()
        transport = "socket"
        if stream is None:
            transport = "bridge"
            try:
                stream = await self.backend.exec_stream(
                    self.workspace_id, [AGENT_PATH, "bridge"], env={}, user="0:0", container_id=self.container_id
                )
            except DockerUnavailableError as exc:
                raise AgentBehindEngine(exc.message) from None
            except SandboxdError as exc:
                msg = f"workspace {self.workspace_id!r}'s agent cannot be reached: {exc.message}"
                raise AgentLost(msg) from None
        decoder = _Decoder()
        pending: list[tuple[bytes, int, bytes]] = []
        stderr = bytearray()
        try:
            await stream.write(encode(_Kind.HELLO, 0, {"protocol": PROTOCOL_VERSION}))
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                welcome = Welcome.parse(await self._first_welcome(stream, decoder, pending, stderr), self.workspace_id)
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
        if transport == "bridge" and await self._learn_host_sockets():
            # The first workspace of its runtime showed the host its socket: go straight to it.
            await stream.close(discard_input=True)
            return await self._open()
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

    async def _first_welcome(
        self,
        stream: ExecStream,
        decoder: _Decoder,
        pending: list[tuple[bytes, int, bytes]],
        stderr: bytearray,
    ) -> bytes:
        while (chunk := await stream.read()) is not None:
            fd, data = chunk
            if fd != 1:
                stderr += data[: max(0, 2000 - len(stderr))]
                continue
            for frame in decoder.feed(data):
                if frame[0] == _Kind.WELCOME and frame[1] == 0:
                    return frame[2]
                if frame[0] == _Kind.ERROR and frame[1] == 0:
                    raise ProtocolError(_text(_json_object(frame[2], "error"), "message", 500) or "it refused")
                pending.append(frame)
        said = bytes(stderr).decode("utf-8", "replace").strip()
        msg = f"the bridge ended before the agent answered{': ' + said if said else ''}"
        raise ProtocolError(msg)

    async def _read(self, stream: ExecStream, decoder: _Decoder, pending: list[tuple[bytes, int, bytes]]) -> None:
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
            if kind == _Kind.FROZEN:
                answer = self._frozen_answer
                if answer is not None and not answer.done():
                    try:
                        answer.set_result(_json_object(payload, "frozen").get("frozen") is True)
                    except ProtocolError as exc:
                        answer.set_exception(exc)
            elif kind == _Kind.ERROR:
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

    def _register(self, route: _Route, channel: int = 0) -> int:
        if not channel:
            channel = self._next_channel
            self._next_channel += 1
        self._routes[channel] = route
        return channel

    def _unregister(self, channel: int, route: _Route) -> None:
        if self._routes.get(channel) is route:
            del self._routes[channel]

    async def _send(self, kind: bytes, channel: int, payload: bytes | Mapping[str, Any] = b"") -> None:
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
        async with self._freeze_lock:
            self._frozen_answer = answer = asyncio.get_running_loop().create_future()
            try:
                await self._send(_Kind.FREEZE, 0, {"frozen": frozen})
                async with asyncio.timeout(FREEZE_TIMEOUT_S):
                    said = await answer
            except TimeoutError:
                msg = f"workspace {self.workspace_id!r}'s agent did not answer a freeze in {FREEZE_TIMEOUT_S:g} s"
                raise AgentLost(msg) from None
            finally:
                self._frozen_answer = None
        if said is not frozen:
            msg = f"workspace {self.workspace_id!r}'s agent answered a freeze with frozen={said}"
            raise ProtocolError(msg)

    async def file_operation(
        self, user: str, operation: Mapping[str, Any], stdin: AsyncIterable[bytes] | None = None
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
        await self.connect()  # numbered above every channel the agent holds
        route = _FileRoute()
        channel = self._register(route)
        feeder: asyncio.Task[None] | None = None
        decoder = _HelperDecoder()
        done = False
        acked = received = 0
        try:
            await self._send(_Kind.FILE_OP, channel, {"user": user, "operation": dict(operation)})
            if stdin is not None:
                feeder = asyncio.create_task(self._feed(channel, route, stdin))
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
                        await self._send(_Kind.FILE_ACK, channel, {"ack": acked})
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
            self._unregister(channel, route)
            if not done and route.exit_code is None and self._stream is not None:
                with contextlib.suppress(SandboxdError):
                    await asyncio.shield(self._send(_Kind.DISCARD, channel))

    @contextlib.asynccontextmanager
    async def forward(self, port: int) -> AsyncGenerator[ForwardedConnection, None]:
        """Open a TCP connection to ``port`` on the workspace's loopback; it is closed on leaving.

        Raises:
            AgentLost: the agent cannot be reached.
            ForwardError: nothing listens there (``refused``), or the connect failed.
            FailedPreconditionError: the agent predates forwarding (a workspace made by an
                older release).
        """
        welcome = await self.connect()
        if "forward" not in welcome.features:
            msg = (
                f"workspace {self.workspace_id!r}'s agent cannot forward ports: "
                "delete the workspace and create it again"
            )
            raise FailedPreconditionError(msg)
        route = _ForwardRoute()
        channel = self._register(route)
        try:
            await self._send(_Kind.CONNECT, channel, {"port": port})
            try:
                async with asyncio.timeout(FORWARD_CONNECT_TIMEOUT_S):
                    await route.connected
            except TimeoutError:
                msg = f"the agent did not open port {port} in {FORWARD_CONNECT_TIMEOUT_S:g} s"
                raise ForwardError(code="io", message=msg) from None
            yield ForwardedConnection(self, channel, route)
        finally:
            self._unregister(channel, route)
            if self._stream is not None and route.error is None:
                with contextlib.suppress(SandboxdError):
                    await asyncio.shield(self._send(_Kind.DISCARD, channel))

    async def _feed(self, channel: int, route: _FileRoute, stdin: AsyncIterable[bytes]) -> None:
        sent = 0
        async for chunk in stdin:
            for start in range(0, len(chunk), FILE_INPUT_WINDOW_BYTES // 4):
                piece = chunk[start : start + FILE_INPUT_WINDOW_BYTES // 4]
                while sent + len(piece) - route.took > FILE_INPUT_WINDOW_BYTES:
                    if route.error or route.exit_code is not None:
                        return  # the helper is done (it failed early): the rest is moot
                    route.room.clear()
                    await route.room.wait()
                await self._send(_Kind.FILE_DATA, channel, piece)
                sent += len(piece)
        await self._send(_Kind.FILE_END, channel)

    async def close(self) -> None:
        """Close the connection for good (the workspace is going, or the daemon stops)."""
        self._closed = True
        for task in (self._reconnector, self._reader, self._learner):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.close(discard_input=True)
