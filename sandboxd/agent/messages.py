"""The agent's JSON messages, checked and typed: what it reports, what the daemon asks of it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

import structlog

from .codec import PROTOCOL_VERSION, U31, U64, int_field, json_object, text_field
from .errors import ProtocolError

__all__ = ["ExitReport", "SessionEvents", "SessionState", "StartRequest", "Welcome"]

log = structlog.get_logger("sandboxd.agent")


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
    killed: bool = False
    """A Kill was asked for (by this daemon, or by one before it)."""

    @classmethod
    def parse(cls, report: Mapping[str, Any]) -> ExitReport:
        """Check and read an exit report.

        Raises:
            ProtocolError: a field missing, of the wrong type, or out of range.
        """
        return cls(
            exit_code=int_field(report, "exit_code", 0, 255),
            signal=int_field(report, "signal", 0, 64),
            oom_kills=int_field(report, "oom_kills", 0, U31, default=0),
            timed_out=bool(report.get("timed_out")),
            leftovers=int_field(report, "leftovers", 0, U31, default=0),
            spill_path=text_field(report, "spill_path", 4096),
            end=int_field(report, "end", 0, U64),
            dropped=int_field(report, "dropped", 0, U64, default=0),
            killed=report.get("killed") is True,
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
    end: int
    """Output offset just past the last byte the command has produced so far."""
    exit: ExitReport | None
    failed: str | None
    """Why the command never started, if it did not."""
    interrupted: bool
    """A Ctrl-C reached the command."""
    reading: bool
    """A caller was reading its output when the last connection broke, and the agent still holds
    its back-pressure (feature ``resume``): that caller may come back for the next byte."""
    daemon_state: Mapping[str, Any]
    """What the daemon asked the agent to keep (``StartRequest.daemon_state``)."""
    input_received: int = 0
    """Bytes of stdin the agent has taken from daemons (feature ``input_taken``)."""
    input_taken: int = 0
    """Of those, bytes the command's stdin took (or that went with a stdin it closed)."""

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
            channel=int_field(state, "channel", 1, 2**32 - 1),
            process_id=text_field(state, "process_id", 64),
            pid=int_field(state, "pid", 0, U31, default=0),
            ack=int_field(state, "ack", 0, U64, default=0),
            ack_gap=int_field(state, "ack_gap", 0, U64, default=0),
            end=int_field(state, "end", 0, U64, default=0),
            exit=ExitReport.parse(exit_report) if isinstance(exit_report, dict) else None,
            failed=(text_field(failed, "message", 16384) or "unknown error") if isinstance(failed, dict) else None,
            interrupted=bool(state.get("interrupted")),
            reading=state.get("reading") is True,
            daemon_state=daemon_state if isinstance(daemon_state, dict) else {},
            input_received=int_field(state, "input_received", 0, U64, default=0),
            input_taken=int_field(state, "input_taken", 0, U64, default=0),
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
        body = json_object(payload, "welcome")
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
            agent=text_field(body, "agent", 64),
            pid=int_field(body, "pid", 0, U31, default=0),
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
    root_capabilities: tuple[str, ...]
    daemon_state: Mapping[str, Any]

    def payload(self) -> dict[str, Any]:
        """The ``S`` frame's JSON object."""
        body = dataclasses.asdict(self)
        body["env"] = list(self.env.items())
        body["capabilities"] = list(self.capabilities)
        body["root_capabilities"] = list(self.root_capabilities)
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
