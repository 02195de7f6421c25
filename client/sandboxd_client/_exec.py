"""Exec and Input streams as async iterators of typed events, and their results.

Output arrives as raw bytes (the daemon never decodes); the client keeps one
incremental UTF-8 decoder per stream, so a character split across chunks is
never turned into U+FFFD, and flushes both decoders before the terminal event.
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import grpc
from sandboxd_protocol.retry import RetryPolicy
from sandboxd_protocol.v1 import process_service_pb2 as ppb

from .errors import SandboxError, StreamBrokenError, UnavailableError, from_rpc_error

__all__ = [
    "CommandFailedError",
    "Dropped",
    "ExecEvent",
    "ExecHandle",
    "ExecResult",
    "Exited",
    "Heartbeat",
    "Output",
    "Started",
    "Yielded",
]

StreamName = Literal["stdout", "stderr"]


@dataclasses.dataclass(frozen=True)
class Started:
    """The command runs; ``process_id`` drives it later."""

    process_id: str
    pid: int


@dataclasses.dataclass(frozen=True)
class Output:
    """A chunk of output: the raw ``data`` and the ``text`` it completes (UTF-8, incremental).

    ``text`` is decoded when first read, not before: a caller that wants bytes pays nothing for
    it. A character split across chunks is whole in the chunk that completes it, never U+FFFD;
    bytes that are not UTF-8 are U+FFFD.
    """

    stream: StreamName
    data: bytes
    position: int = 0
    """The command's output position once a caller has this chunk (``Input(resume_from=)``)."""
    carried: bytes = dataclasses.field(default=b"", repr=False, compare=False)
    """The start of a character the stream's earlier chunks ended with, which this one may complete."""
    held: int = dataclasses.field(default=0, repr=False, compare=False)
    """How many bytes at the end of ``carried + data`` start a character a later chunk completes."""

    @functools.cached_property
    def text(self) -> str:
        """The text this chunk completes (the character carried into it, and its own bytes)."""
        whole = self.carried + self.data if self.carried else self.data
        return whole[: len(whole) - self.held].decode("utf-8", "replace")


@dataclasses.dataclass(frozen=True)
class Dropped:
    """The daemon's buffer was full while nobody read: ``dropped_bytes`` are missing here."""

    dropped_bytes: int
    position: int = 0
    """The output position after the gap."""


@dataclasses.dataclass(frozen=True)
class Exited:
    """The command ended (always the last event of its stream)."""

    exit_code: int
    signal: str
    stop_reason: str
    """``exited``, ``interrupted``, ``timeout``, ``failed`` or ``killed``."""
    oom_killed: bool
    memory_limit_bytes: int
    dropped_bytes: int
    elapsed_s: float
    message: str
    spill_path: str = ""
    """The workspace file holding the whole output, when it passed ``spill_after_bytes``."""


@dataclasses.dataclass(frozen=True)
class Yielded:
    """The command still runs; the stream ended because the yield window closed."""

    process_id: str
    elapsed_s: float


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    """The stream is alive (sent after a long silence)."""

    elapsed_s: float


ExecEvent = Started | Output | Dropped | Exited | Yielded | Heartbeat

_STOP_REASONS = {
    ppb.STOP_REASON_UNSPECIFIED: "",
    ppb.STOP_REASON_EXITED: "exited",
    ppb.STOP_REASON_INTERRUPTED: "interrupted",
    ppb.STOP_REASON_TIMEOUT: "timeout",
    ppb.STOP_REASON_FAILED: "failed",
    ppb.STOP_REASON_KILLED: "killed",
}


def exited_from_proto(message: ppb.ExecExited) -> Exited:
    """Return the client form of an ``ExecExited`` message."""
    return Exited(
        exit_code=message.exit_code,
        signal=message.signal,
        stop_reason=_STOP_REASONS.get(message.stop_reason, ""),
        oom_killed=message.oom_killed,
        memory_limit_bytes=message.memory_limit_bytes,
        dropped_bytes=message.dropped_bytes,
        elapsed_s=message.elapsed.ToNanoseconds() / 1e9,
        message=message.message,
        spill_path=message.spill_path,
    )


@dataclasses.dataclass(eq=True)
class ExecResult:
    """Everything a finished (or yielded) exec produced.

    A non-zero exit code is data, not an error; ``wait(check=True)`` raises
    :class:`CommandFailedError` instead.
    """

    exit_code: int | None
    """None when the command was still running when the stream ended (yielded)."""
    stdout: str = ""
    stderr: str = ""
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    signal: str = ""
    stop_reason: str = ""
    oom_killed: bool = False
    dropped_bytes: int = 0
    process_id: str = ""
    message: str = ""
    spill_path: str = ""

    @property
    def running(self) -> bool:
        """Whether the command was still running when the result was taken."""
        return self.exit_code is None


class CommandFailedError(SandboxError, ExecResult):
    """A command exited non-zero under ``check=True``; it is also the :class:`ExecResult`."""

    def __init__(self, result: ExecResult) -> None:
        """Wrap ``result``."""
        detail = f" ({result.signal})" if result.signal else ""
        SandboxError.__init__(self, f"command exited with code {result.exit_code}{detail}")
        ExecResult.__init__(self, **{f.name: getattr(result, f.name) for f in dataclasses.fields(ExecResult)})

    __hash__ = Exception.__hash__


def _held_back(data: bytes) -> int:
    """How many bytes at the end of ``data`` an incremental UTF-8 decoder keeps for the next chunk.

    Only the last three bytes can start a character still to be completed; the decoder meets
    whatever starts there afresh (a byte that is not a continuation ends any sequence before
    it), so decoding from the last such byte alone says what it keeps, without decoding the rest.
    """
    start = len(data)
    for back in range(1, min(3, len(data)) + 1):
        if data[-back] & 0xC0 != 0x80:
            start = len(data) - back
            break
    tail = data[start:]
    if not tail:
        return 0
    _text, consumed = codecs.utf_8_decode(tail, "replace", False)
    return len(tail) - consumed


class _Decoders:
    """Where each stream's chunks are cut into whole characters (the decoding is left to ``text``)."""

    def __init__(self) -> None:
        self.carry: dict[StreamName, bytes] = {"stdout": b"", "stderr": b""}

    def output(self, stream: StreamName, data: bytes, position: int = 0) -> Output:
        carried = self.carry[stream]
        whole = carried + data if carried else data
        held = _held_back(whole)
        self.carry[stream] = whole[len(whole) - held :] if held else b""
        return Output(stream=stream, data=data, position=position, carried=carried, held=held)

    def flush(self) -> list[Output]:
        """The characters left incomplete at the end, as U+FFFD each (as a final decode gives them)."""
        tails = []
        for name, carried in self.carry.items():
            if carried:
                tails.append(Output(stream=name, data=b"", carried=carried))
        self.carry = {"stdout": b"", "stderr": b""}
        return tails


def _event(response: Any, decoders: _Decoders) -> ExecEvent | None:
    match response.WhichOneof("event"):
        case "started":
            return Started(process_id=response.started.process_id, pid=response.started.pid)
        case "output":
            which = response.output.WhichOneof("data")
            if which is None:
                return None
            return decoders.output(which, getattr(response.output, which), response.output.position)
        case "dropped":
            return Dropped(dropped_bytes=response.dropped.dropped_bytes, position=response.dropped.position)
        case "exited":
            return exited_from_proto(response.exited)
        case "yielded":
            return Yielded(
                process_id=response.yielded.process_id, elapsed_s=response.yielded.elapsed.ToNanoseconds() / 1e9
            )
        case "heartbeat":
            return Heartbeat(elapsed_s=response.heartbeat.elapsed.ToNanoseconds() / 1e9)
    return None


_RESUMED_AFTER = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND})
"""Errors worth another resume attempt: the daemon is away, or back and not yet holding the process."""


def _details(error: grpc.RpcError) -> str:
    return error.details() or "no details" if isinstance(error, grpc.aio.AioRpcError) else str(error)


class _Prepended:
    """A call's stream with the events already read from it first (a resume reads one to know it is back)."""

    def __init__(self, first: list[Any], call: Any) -> None:
        self._first = first
        self._call = call

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._events()

    async def _events(self) -> AsyncIterator[Any]:
        for response in self._first:
            yield response
        async for response in self._call:
            yield response

    def cancel(self) -> None:
        self._call.cancel()


class ExecHandle:
    """One Exec (or Input) call: iterate it for events, or ``await wait()`` for the result.

    Events come in order: at most one ``Started`` (Exec only) first, output,
    then exactly one ``Exited`` or ``Yielded``, always last. With ``follow``,
    a ``Yielded`` is not surfaced: the handle keeps polling with Input until the
    command exits, so one iteration covers the whole command.

    Iterating keeps no output in memory (stream gigabytes through it);
    ``wait()`` collects it into the :class:`ExecResult`. After a plain
    iteration, ``result`` carries the exit status with empty output fields.

    A stream that breaks once the command has started (the daemon restarted, the connection
    dropped) is resumed: the handle attaches again with ``Input(resume_from=)`` within its
    ``resume`` policy and goes on from the last byte it gave, so nothing comes twice and
    nothing is missing, and the exit is the command's real one. When the policy runs out it
    raises :class:`~sandboxd_client.errors.StreamBrokenError`, which says the process id and
    position to attach with later.
    """

    def __init__(
        self,
        open_stream: Callable[[], Any],
        poll: Callable[[str], Any],
        *,
        follow: bool,
        process_id: str = "",
        resume: Callable[[str, int, float | None], Any] | None = None,
        resume_policy: RetryPolicy | None = None,
        window_s: float | None = None,
        carries_input: bool = False,
    ) -> None:
        """Prepare the call; nothing is sent until iteration starts.

        Args:
            open_stream: opens the call (Exec, or Input).
            poll: opens an Input that only polls ``process_id`` (after a yield with ``follow``).
            follow: keep polling after a yield until the command exits.
            process_id: the process, when known before the stream says it (an Input).
            resume: opens an Input going on from ``(process_id, position, window_s)``; None:
                a broken stream raises at once.
            resume_policy: how long and how often to try ``resume`` after a break.
            window_s: the call's yield window, in seconds (None: the daemon's default), so that
                a resumed call yields when the first would have.
            carries_input: the call writes to the process (chars, data, Ctrl-C or an end of
                input). Broken before the daemon's first answer, it is not resumed: the input
                may or may not have reached the process (a resume would only poll), so the
                caller is told, with ``UnavailableError``.
        """
        self._open_stream = open_stream
        self._poll = poll
        self._resume = resume
        self._resume_policy = resume_policy
        self._window_s = window_s
        self.position: int | None = None
        """The output position after the last output event received (None: none yet)."""
        self._follow = follow
        self._decoders = _Decoders()
        self._consumed = False
        self.process_id = process_id
        """Set once the command has started (or given for an Input call)."""
        self.result: ExecResult | None = None
        """Set when the stream has ended."""
        self._carries_input = carries_input
        self._answered = False
        """The daemon answered this call at least once: its input, if any, was written."""
        self._collect = False
        self._stdout = bytearray()
        self._stderr = bytearray()
        self._dropped = 0

    def __aiter__(self) -> AsyncIterator[ExecEvent]:
        """Iterate the events; a handle can be iterated once."""
        if self._consumed:
            msg = "an ExecHandle can be iterated only once"
            raise RuntimeError(msg)
        self._consumed = True
        return self._events()

    async def _events(self) -> AsyncIterator[ExecEvent]:
        began = time.monotonic()
        call = self._open_stream()
        try:
            while True:
                terminal: Exited | Yielded | None = None
                try:
                    async for response in call:
                        self._answered = True
                        event = _event(response, self._decoders)
                        if event is None:
                            continue
                        if isinstance(event, Exited | Yielded):
                            terminal = event
                            break
                        self._record(event)
                        yield event
                except grpc.RpcError as error:
                    if not self._resumable(error):
                        raise
                    if self._carries_input and not self._answered:
                        msg = (
                            f"the daemon went away before it answered this input to {self.process_id}, "
                            f"which may or may not have reached the process ({_details(error)}); send it "
                            "again if it must arrive"
                        )
                        raise UnavailableError(msg, code=grpc.StatusCode.UNAVAILABLE) from None
                    call = await self._resumed(error, began)
                    continue
                if terminal is None:
                    msg = "the daemon ended the stream without an exited or yielded event"
                    raise SandboxError(msg)
                if isinstance(terminal, Yielded) and self._follow:
                    call = self._poll(terminal.process_id)
                    continue
                for tail in self._decoders.flush():
                    self._record(tail)
                    yield tail
                self._finish(terminal)
                yield terminal
                return
        except grpc.RpcError as error:
            for tail in self._decoders.flush():
                self._record(tail)
            raise from_rpc_error(error) from None
        finally:
            # Leaving early (break, cancel) cancels the call; the daemon treats that as Ctrl-C.
            if self.result is None:
                call.cancel()

    def _resumable(self, error: grpc.RpcError) -> bool:
        """Whether a stream broke (not refused) once the command had a process id to attach to."""
        code = error.code() if isinstance(error, grpc.aio.AioRpcError) else None
        return self._resume is not None and bool(self.process_id) and code == grpc.StatusCode.UNAVAILABLE

    async def _resumed(self, broke: grpc.RpcError, began: float) -> Any:
        """An Input call going on after the last event received, once one opens (its first event came).

        Raises:
            StreamBrokenError: the resume policy ran out (the last error's words in the message).
        """
        resume, policy = self._resume, self._resume_policy
        assert resume is not None
        assert policy is not None
        position = self.position or 0
        window = None if self._window_s is None else max(0.25, self._window_s - (time.monotonic() - began))
        first: list[Any] = []

        async def attempt() -> Any:
            call = resume(self.process_id, position, window)
            try:
                first.append(await call.__aiter__().__anext__())  # the daemon answered: it is back
            except StopAsyncIteration:
                pass
            except BaseException:
                call.cancel()
                raise
            return call

        def again(error: BaseException) -> bool:
            return isinstance(error, grpc.aio.AioRpcError) and error.code() in _RESUMED_AFTER

        try:
            call = await policy.call(attempt, again)
        except grpc.RpcError as error:
            said = error.details() if isinstance(error, grpc.aio.AioRpcError) else str(error)
            msg = (
                f"the stream of process {self.process_id} broke ({_details(broke)}) and the daemon did not take"
                f" it back ({said}); attach with input({self.process_id!r}, resume_from={position})"
            )
            raise StreamBrokenError(msg, process_id=self.process_id, resume_from=position) from None
        return _Prepended(first, call)

    def _record(self, event: ExecEvent) -> None:
        if isinstance(event, Dropped) or (isinstance(event, Output) and event.data):  # not a decoder's tail
            self.position = event.position
        if isinstance(event, Started):
            self.process_id = event.process_id
        elif isinstance(event, Output) and self._collect:
            if event.stream == "stdout":
                self._stdout += event.data
            else:
                self._stderr += event.data
        elif isinstance(event, Dropped):
            self._dropped += event.dropped_bytes

    def _finish(self, terminal: Exited | Yielded) -> None:
        # Decoded once, whole: the same text as each chunk's joined, for a fraction of the work.
        common = {
            "stdout": self._stdout.decode("utf-8", "replace"),
            "stderr": self._stderr.decode("utf-8", "replace"),
            "stdout_bytes": bytes(self._stdout),
            "stderr_bytes": bytes(self._stderr),
            "process_id": self.process_id,
        }
        if isinstance(terminal, Exited):
            self.result = ExecResult(
                exit_code=terminal.exit_code,
                signal=terminal.signal,
                stop_reason=terminal.stop_reason,
                oom_killed=terminal.oom_killed,
                dropped_bytes=terminal.dropped_bytes,
                message=terminal.message,
                spill_path=terminal.spill_path,
                **common,  # type: ignore[arg-type]
            )
        else:
            self.result = ExecResult(exit_code=None, dropped_bytes=self._dropped, **common)  # type: ignore[arg-type]

    async def wait(self, *, check: bool = False) -> ExecResult:
        """Consume the stream and return the result.

        Raises:
            CommandFailedError: ``check`` is set and the command exited non-zero.
        """
        if not self._consumed:
            self._collect = True
            async for _ in self:
                pass
        assert self.result is not None
        if check and self.result.exit_code not in (0, None):
            raise CommandFailedError(self.result)
        return self.result
