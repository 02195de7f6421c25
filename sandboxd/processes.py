"""Process sessions: commands running in workspaces, driven over the supervisor protocol.

A :class:`ProcessSession` owns one ``docker exec`` of the in-container
supervisor (``sandboxd/supervisor.py``). A pump task reads the supervisor's
frames into a bounded :class:`~sandboxd.output.OutputBuffer`; Exec and Input
calls attach to the session and stream what the buffer holds until the command
exits or the caller's yield window closes. The :class:`ProcessTable` holds at
most ``max_sessions`` sessions and evicts exited ones first, then the least
recently used idle one (seed 000).
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import dataclasses
import datetime
import enum
import functools
import json
import posixpath
import re
import secrets
import signal
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any

import structlog
from sandboxd_client.limits import (
    MAX_COMMAND_BYTES,
    MAX_ENV_BYTES,
    MAX_ENV_ENTRIES,
    MAX_ID_BYTES,
    MAX_INPUT_BYTES,
    MAX_PATH_BYTES,
    utf8_size,
)

from . import frames
from .backend.base import Backend, ExecStream
from .errors import (
    FailedPreconditionError,
    InvalidSpecError,
    ProcessNotFoundError,
    QuotaExceededError,
    SandboxdError,
    quoted,
)
from .incontainer import MAX_CONTAINER_MESSAGE_CHARS, engine_refusal, looks_like_frames, script_argv
from .logging import cut_text
from .models import (
    ExecEvent,
    ExecSpec,
    ExecStarted,
    ExitStatus,
    Heartbeat,
    OutputChunk,
    OutputDropped,
    StopReason,
    Yielded,
    signal_name,
)
from .output import OutputBuffer
from .secrets import SecretStore
from .settings import Settings
from .tenancy import DEFAULT_TENANT, current_tenant

__all__ = [
    "CTRL_C",
    "CTRL_C_EXIT_WAIT_S",
    "INPUT_POLL_YIELD_S",
    "INPUT_WRITE_YIELD_S",
    "MARKER_ENV",
    "MAX_COMMAND_BYTES",
    "MAX_INPUT_BYTES",
    "MAX_TERMINAL_CELLS",
    "MIN_YIELD_S",
    "ExecContext",
    "InterruptPlan",
    "ProcessSession",
    "ProcessTable",
    "check_env",
    "clamp_yield",
    "exit_status",
    "input_window",
    "interrupt_plan",
]

log = structlog.get_logger(__name__)

MARKER_ENV = "SANDBOXD_PROCESS_ID"
"""Environment entry every process of a command inherits; teardown finds strays by it."""

SPILL_DIR = "/workspace/.sandboxd/spill"
"""Where spill files go: on the workspace volume, readable with read_file."""

MAX_TERMINAL_CELLS = 10_000
"""Largest terminal width or height accepted, in character cells."""


MIN_YIELD_S = 0.25
"""Shortest yield window (seed 000: 250 ms)."""

DEFAULT_YIELD_S = 60.0
"""Exec yield window when the caller sets none (seed 000: 60000 ms)."""

INPUT_WRITE_YIELD_S = 0.25
"""Input window after a write when the caller sets none (seed 000: 250 ms)."""

INPUT_POLL_YIELD_S = 5.0
"""Input window of a pure poll when the caller sets none (seed 000: 5000 ms)."""

CTRL_C_EXIT_WAIT_S = 1.0
"""Shortest window of an Input call that delivers Ctrl-C, in seconds. Dying of SIGINT takes a
loaded machine longer than the 250 ms of a write; the call still returns the moment the command
exits, and a command that survives Ctrl-C (a REPL) costs the call this long at most."""

CTRL_C = "\u0003"
"""Input ``chars`` that mean Ctrl-C (seed 000), when they are all the call writes."""

NON_INTERACTIVE_ENV = {
    "TERM": "dumb",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "NO_COLOR": "1",
    "LANG": "C.UTF-8",
    # Nothing can answer an editor: git commit, git merge and crontab -e must not wait for one.
    "GIT_EDITOR": "true",
    "EDITOR": "true",
    "VISUAL": "true",
    "GIT_MERGE_AUTOEDIT": "no",
}
"""SPEC §6 defaults for commands without a terminal; the caller's values win."""

EDITOR_ENV = frozenset({"GIT_EDITOR", "EDITOR", "VISUAL"})
"""Set together or not at all: a caller naming any of them has an editor that works without a
terminal, and git would prefer the default GIT_EDITOR over the caller's EDITOR."""

TTY_ENV = {"TERM": "xterm-256color", "LANG": "C.UTF-8"}

_PROCESS_ID_RE = re.compile(r"^p-[0-9a-f]{12}$")
_STOP_PRIORITY = (StopReason.INTERRUPTED, StopReason.TIMEOUT, StopReason.FAILED, StopReason.KILLED)
_STDERR_TAIL_BYTES = 4096


def supervisor_source() -> str:
    """Return the supervisor's source text, sent with every exec."""
    return script_argv("supervisor.py", {}, tokens=True)[4]


def clamp_yield(requested_s: float | None, timeout_s: float, default_s: float = DEFAULT_YIELD_S) -> float:
    """Clamp a yield window to ``[250 ms, timeout - 1 s]`` (SPEC §6).

    Args:
        requested_s: the caller's window in seconds, or None for ``default_s``.
        timeout_s: the command's timeout in seconds.
        default_s: window used when none is requested.

    Returns:
        The window in seconds; never below 0.25 even when the timeout is shorter.
    """
    window = default_s if requested_s is None else requested_s
    return max(MIN_YIELD_S, min(window, timeout_s - 1.0))


def input_window(requested_s: float | None, *, wrote: bool, ctrl_c: bool, timeout_s: float) -> float:
    """The window of one Input call, in seconds (seed 000, SPEC §2.3).

    Args:
        requested_s: the caller's window, or None for seed 000's default: 250 ms after
            a write (chars, raw data or closing stdin), 5 s for a pure poll.
        wrote: the call writes something.
        ctrl_c: the call delivers Ctrl-C; its window is then at least ``CTRL_C_EXIT_WAIT_S``,
            so that the death it causes is usually seen in the same call.
        timeout_s: the command's timeout (the window stays a second under it).

    Returns:
        The window, clamped like :func:`clamp_yield`.
    """
    default_s = INPUT_WRITE_YIELD_S if wrote or ctrl_c else INPUT_POLL_YIELD_S
    window = clamp_yield(requested_s, timeout_s, default_s=default_s)
    return max(window, CTRL_C_EXIT_WAIT_S) if ctrl_c else window


def exit_status(
    *,
    exit_code: int,
    signal_number: int,
    oom_kills: int,
    memory_limit_bytes: int,
    requested: set[StopReason],
    dropped_bytes: int,
    elapsed_s: float,
    message: str = "",
    spill_path: str = "",
    ctrl_c_delivered: bool = False,
) -> ExitStatus:
    """Build the terminal status from the supervisor's report (SPEC §6 rules).

    A death by signal N is exit code 128+N with the signal's name. A shell's own
    exit code 129..192 is read the same way: that is how a shell reports a child
    killed by a signal. OOM is claimed only when the cgroup counted an OOM kill
    while the command ran and the command died of SIGKILL.

    ``ctrl_c_delivered``: a Ctrl-C reached the command at some point. The stop reason is
    ``interrupted`` exactly when the command then died of SIGINT (or its shell reports 130),
    whenever that is observed: also after the Ctrl-C call itself yielded (a loaded machine
    may take longer than its window to deliver the death). A command that caught the Ctrl-C
    keeps its own reason however it ends later, and whichever call sees it end: a trap that
    exits 42, a REPL that exits 0 (``exited``), a Kill (``killed``), a timeout (``timeout``).
    """
    number = signal_number
    if not number and 128 < exit_code <= 128 + 64:
        number = exit_code - 128
    oom = oom_kills > 0 and number == signal.SIGKILL
    if ctrl_c_delivered and number == signal.SIGINT:
        requested = requested | {StopReason.INTERRUPTED}
    reason = next((r for r in _STOP_PRIORITY if r in requested), StopReason.EXITED)
    return ExitStatus(
        exit_code=exit_code,
        signal=signal_name(number) if number else "",
        stop_reason=reason,
        oom_killed=oom,
        memory_limit_bytes=memory_limit_bytes if oom else 0,
        dropped_bytes=dropped_bytes,
        elapsed_s=elapsed_s,
        message=message or (f"killed by the OOM killer (memory limit {memory_limit_bytes} bytes)" if oom else ""),
        spill_path=spill_path,
    )


_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_env(env: Mapping[str, str], field: str, *, max_bytes: int = MAX_ENV_BYTES) -> None:
    """Reject environment names that are not POSIX names, values holding NUL, and oversized maps.

    Args:
        env: the variables.
        field: the request field, named in the message.
        max_bytes: most bytes of all ``NAME=value`` entries together
            (``sandboxd_client.limits``: 128 KiB for a call, 32 KiB for a workspace).

    Raises:
        InvalidSpecError: naming ``field`` and the offending variable or the size.
    """
    if len(env) > MAX_ENV_ENTRIES:
        msg = f"{field} has {len(env)} variables; the limit is {MAX_ENV_ENTRIES}"
        raise InvalidSpecError(msg)
    size = sum(utf8_size(key) + utf8_size(value) + 1 for key, value in env.items())
    if size > max_bytes:
        msg = f"{field} is {size} bytes (names and values); the limit is {max_bytes}"
        raise InvalidSpecError(msg)
    for key, value in env.items():
        if not _ENV_NAME_RE.match(key):
            msg = f"{field} name {quoted(key)} is not a valid environment variable name"
            raise InvalidSpecError(msg)
        if "\0" in value:
            msg = f"{field} value of {quoted(key)} contains a NUL character"
            raise InvalidSpecError(msg)


class InterruptPlan(enum.Enum):
    """How Ctrl-C reaches a POSIX command."""

    PROCESS_GROUP = "SIGINT to the command's process group"
    TERMINAL = "ETX written to the terminal; the line discipline signals the foreground group"


def interrupt_plan(os_name: str, *, pid: int, tty: bool) -> InterruptPlan | list[str]:
    """Choose how Ctrl-C is delivered, from the container's OS (seed 000).

    Returns:
        An :class:`InterruptPlan` for Linux containers; for Windows containers,
        where console signals cannot reach piped processes, the argv of a tree
        kill of the command: ``taskkill /T /F /PID <pid>``.
    """
    if os_name.lower() == "windows":
        return ["taskkill", "/T", "/F", "/PID", str(pid)]
    return InterruptPlan.TERMINAL if tty else InterruptPlan.PROCESS_GROUP


MAX_CHUNK_BYTES = 1024 * 1024
"""Largest output chunk sent as one event; adjacent chunks of a stream are merged up to it."""


def coalesce(items: list[OutputChunk | OutputDropped]) -> list[OutputChunk | OutputDropped]:
    """Merge adjacent chunks of the same stream (order kept) into chunks of at most 1 MiB.

    Fewer, larger messages are what lets a fast producer stream at full speed.
    """
    merged: list[OutputChunk | OutputDropped] = []
    pending: list[bytes] = []
    size = 0
    stream = ""
    for item in items:
        if isinstance(item, OutputChunk) and item.stream == stream and size + len(item.data) <= MAX_CHUNK_BYTES:
            pending.append(item.data)
            size += len(item.data)
            continue
        if pending:
            merged.append(OutputChunk(stream=stream, data=b"".join(pending)))
        pending, size, stream = [], 0, ""
        if isinstance(item, OutputChunk):
            pending, size, stream = [item.data], len(item.data), item.stream
        else:
            merged.append(item)
    if pending:
        merged.append(OutputChunk(stream=stream, data=b"".join(pending)))
    return merged


class ExecContext:
    """What a session needs to know about its workspace.

    Args:
        workspace_id: the workspace.
        user: user commands run as.
        working_dir: default working directory (relative workdirs resolve against it).
        memory_limit_bytes: the workspace's memory limit, reported with OOM kills.
        os: the container's OS (``linux`` or ``windows``), which decides how Ctrl-C is delivered.
        env: the workspace's environment, given to every command (never to sandboxd's own tools).
        tenant: the tenant owning the workspace; only its calls may see the workspace's processes.
        secrets: resolves ``secret:NAME`` env values and masks their values in output.
        container_id: the workspace's container; commands run in exactly it (empty: by name).
        python: the interpreter of the in-container helpers (an execute-only copy when the
            workspace has one; see ``incontainer.PROTECTED_PYTHON_SCRIPT``).
    """

    def __init__(
        self,
        *,
        workspace_id: str,
        user: str,
        working_dir: str,
        memory_limit_bytes: int,
        os: str = "linux",
        env: Mapping[str, str] | None = None,
        tenant: str = DEFAULT_TENANT,
        secrets: SecretStore | None = None,
        container_id: str = "",
        python: str = "python3",
    ) -> None:
        """Bundle the workspace facts."""
        self.workspace_id = workspace_id
        self.user = user
        self.working_dir = working_dir
        self.memory_limit_bytes = memory_limit_bytes
        self.os = os
        self.env = dict(env or {})
        self.tenant = tenant
        self.secrets = secrets or SecretStore("", {})
        self.container_id = container_id
        self.python = python


def _report_int(report: object, key: str, low: int, high: int, *, default: int | None = None) -> int:
    """An integer field of a supervisor report, within ``[low, high]``.

    Raises:
        frames.FrameError: missing (without a default), not an integer, or out of range.
    """
    if not isinstance(report, dict):
        msg = "a supervisor report is not an object"
        raise frames.FrameError(msg)
    value = report.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        msg = f"a supervisor report's {key} is {value!r}, not an integer in [{low}, {high}]"
        raise frames.FrameError(msg)
    return value


class _State(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    EXITED = "exited"


class ProcessSession:
    """One command and its supervisor.

    Output events are delivered in the order the command produced them per
    stream; the terminal :class:`ExitStatus` comes after all of its output.
    """

    def __init__(
        self,
        *,
        backend: Backend,
        context: ExecContext,
        spec: ExecSpec,
        settings: Settings,
        process_id: str,
        background: set[asyncio.Task[None]] | None = None,
    ) -> None:
        """Prepare a session; :meth:`start` runs it.

        ``background`` collects the session's clean-up tasks (reaps after a lost
        supervisor or an abandoned start), so their owner can finish them on shutdown.
        """
        self.backend = backend
        self.context = context
        self.spec = spec
        self.process_id = process_id
        self.settings = settings
        self.timeout_s = spec.timeout_s if spec.timeout_s is not None else settings.exec_timeout_s
        # The Exec call that starts the command reads it next: it counts as attached from the
        # start, or output printed before its stream attaches could be dropped past the cap.
        self.buffer = OutputBuffer(spec.max_output_bytes or settings.output_buffer_bytes, readers=1)
        self._reserved_reader = True
        self.pid = 0
        self.start_time = datetime.datetime.now(datetime.UTC)
        self._started_at = time.monotonic()
        self.last_used = time.monotonic()
        self.exit: ExitStatus | None = None
        self._state = _State.STARTING
        self._stream: ExecStream | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._timer_task: asyncio.Task[None] | None = None
        self._started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._exited = asyncio.Event()
        self._requested: set[StopReason] = set()
        self._ctrl_c_delivered = False
        """A Ctrl-C reached the command (see ``exit_status``)."""
        self._stderr_tail = b""
        # Secret values are masked per stream before output is buffered (seed 002).
        self._redactors = {
            stream: context.secrets.redactor(context.tenant, tty=spec.tty) for stream in ("stdout", "stderr")
        }
        self.spill_path = f"{SPILL_DIR}/{process_id}.out"
        """Where the whole output goes once it passes ``spec.spill_after_bytes``."""
        self.leftovers = 0
        """Processes of the command still alive when it exited (its supervisor bounds them)."""
        self._write_lock = asyncio.Lock()
        self._attached = 0
        self._fresh = True
        """Not yet streamed to its caller: never evicted in that state (it would kill a command
        whose Exec call has not even attached)."""
        self._background: set[asyncio.Task[None]] = background if background is not None else set()
        self.shutting_down = False
        """Set when the daemon stops: departing streams then leave their commands alone."""

    # -- life cycle ------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether the top-level command still runs."""
        return self._state is not _State.EXITED

    @property
    def idle(self) -> bool:
        """Whether no call is attached and the first call has had its stream (eviction may pick it)."""
        return self._attached == 0 and not self._fresh

    def release(self) -> None:
        """The first call is done with the session: from now on it may be evicted when idle."""
        self._fresh = False
        if self._reserved_reader:  # it left without ever reading
            self._reserved_reader = False
            self._spawn(self.buffer.detach())

    @property
    def elapsed_s(self) -> float:
        """Seconds since the command started."""
        return time.monotonic() - self._started_at

    def _argv(self) -> list[str]:
        config = {
            "command": self.spec.command,
            "cwd": self._workdir(),
            "tty": self.spec.tty,
            "columns": self.spec.columns,
            "rows": self.spec.rows,
            "marker": f"{MARKER_ENV}={self.process_id}",
            "timeout_s": self.timeout_s,
            "grace_s": self.settings.kill_grace_s,
            "spill_path": self.spill_path if self.spec.spill_after_bytes > 0 else "",
            "spill_after_bytes": self.spec.spill_after_bytes,
            # The environment goes over stdin: an argv is world-readable (`ps`), secrets included.
            "env_on_stdin": True,
            "merge_stderr": self.spec.merge_stderr,
        }
        return script_argv("supervisor.py", config, tokens=True, python=self.context.python)

    def _workdir(self) -> str:
        workdir = self.spec.workdir or self.context.working_dir
        return posixpath.normpath(posixpath.join(self.context.working_dir, workdir))

    def _env(self) -> dict[str, str]:
        """The command's environment on top of the image's: defaults, workspace env, exec env, marker."""
        defaults = TTY_ENV if self.spec.tty else NON_INTERACTIVE_ENV
        env = self.context.secrets.resolve({**self.context.env, **self.spec.env}, self.context.tenant)
        if EDITOR_ENV & env.keys():
            defaults = {key: value for key, value in defaults.items() if key not in EDITOR_ENV}
        return {**defaults, **env, MARKER_ENV: self.process_id}

    async def start(self) -> ExecStarted:
        """Start the command; return once it runs.

        Raises:
            InvalidSpecError: the working directory or the shell cannot be used.
            FailedPreconditionError: the image cannot run the supervisor (no python3).
        """
        # The exec itself gets no caller environment: only the supervisor's child does.
        opening = asyncio.ensure_future(
            self.backend.exec_stream(
                self.context.workspace_id,
                self._argv(),
                env={},
                user=self.context.user,
                container_id=self.context.container_id,
            )
        )
        try:
            self._stream = await asyncio.shield(opening)
        except asyncio.CancelledError:
            # Cancelled while the engine was starting the exec: the command may be starting
            # anyway, with nobody to see it. Let the opening finish, then end what it started.
            await asyncio.shield(self._abandon_opening(opening))
            raise
        with contextlib.suppress(ConnectionError, OSError):  # a stream already gone ends in the pump
            await self._stream.write(frames.encode_env(self._env()))
        self._pump_task = asyncio.create_task(self._pump(), name=f"pump-{self.process_id}")
        try:
            await self._started
        except asyncio.CancelledError:
            # The caller left while the command was starting: it must not live on unseen.
            await asyncio.shield(self._abandon())
            raise
        except BaseException:
            await self.close()
            raise
        log.info("process.started", process_id=self.process_id, workspace_id=self.context.workspace_id, pid=self.pid)
        # A fast command may have exited (and the pump recorded it) before this resumed.
        if self._state is _State.STARTING:
            self._state = _State.RUNNING
            self._timer_task = asyncio.create_task(self._timeout(), name=f"timeout-{self.process_id}")
        return ExecStarted(process_id=self.process_id, pid=self.pid, start_time=self.start_time)

    async def _abandon_opening(self, opening: asyncio.Future[ExecStream]) -> None:
        try:
            self._stream = await opening
        except Exception:  # it failed to start: then there is nothing to end
            return
        await self._abandon()

    async def _abandon(self) -> None:
        """Kill a command nobody will ever see: tell its supervisor, then reap by marker as a backstop."""
        with contextlib.suppress(ConnectionError, OSError):
            if self._stream is not None:
                async with self._write_lock:
                    await self._stream.write(frames.encode_kill(0.0))
        await self.close()
        self._spawn(self._reap_later(1.0))

    async def _reap_later(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        await self.reap(grace_s=self.settings.kill_grace_s)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _pump(self) -> None:
        assert self._stream is not None
        decoder = frames.FrameDecoder()
        first = True
        try:
            while (chunk := await self._stream.read()) is not None:
                fd, data = chunk
                if fd != 1:
                    self._stderr_tail = (self._stderr_tail + data)[-_STDERR_TAIL_BYTES:]
                    continue
                if first and not looks_like_frames(data, frames.STARTED + frames.FAILED):
                    # Not the supervisor speaking: the engine's own error text (e.g. no python3).
                    await self._engine_refused(data)
                    return
                first = False
                for kind, payload in decoder.feed(data):
                    if await self._on_frame(kind, payload):
                        return
            self._fail(self._lost_message(), exit_code=await self._stream.exit_code())
            if not self.shutting_down:
                # Its supervisor is gone (`kill -9 $PPID`, `kill -9 -1`): nothing else bounds what
                # the command started any more, so end it all now.
                self._spawn(self.reap(grace_s=self.settings.kill_grace_s))
        except (frames.FrameError, ValueError) as exc:  # ValueError: a report that is not JSON
            self._fail(f"the supervisor's output is corrupt: {exc}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the pump must always end the session, whatever broke
            log.exception("process.pump_failed", process_id=self.process_id)
            self._fail(f"the daemon lost the command's stream: {exc}")
        finally:
            for stream, redactor in self._redactors.items():
                if rest := redactor.flush():  # what a lost supervisor left held back
                    await self.buffer.put(stream, rest)
            await self.buffer.close()

    async def _on_frame(self, kind: bytes, payload: bytes) -> bool:
        """Handle one supervisor frame; return True when it was the last."""
        if kind in (frames.STDOUT, frames.STDERR):
            stream = "stdout" if kind == frames.STDOUT else "stderr"
            if masked := self._redactors[stream].feed(payload):
                await self.buffer.put(stream, masked)
        elif kind == frames.STARTED:
            self.pid = _report_int(json.loads(payload), "pid", 1, 2**31 - 1)
            if not self._started.done():
                self._started.set_result(None)
        elif kind == frames.FAILED:
            report = json.loads(payload)
            if not isinstance(report, dict):
                msg = "a start failure report is not an object"
                raise frames.FrameError(msg)
            stage = report.get("stage")
            detail = report.get("message")
            detail = (
                cut_text(detail, MAX_CONTAINER_MESSAGE_CHARS) if isinstance(detail, str) and detail else "unknown error"
            )
            if stage == "fork":
                error: SandboxdError = QuotaExceededError(
                    f"cannot start the command: {detail} (the workspace's process limit is reached)"
                )
            elif stage in {"chdir", "exec"}:
                error = InvalidSpecError(f"cannot start the command: {detail}")
            else:
                error = FailedPreconditionError(f"cannot start the command: {detail}")
            self._fail_start(error)
            return True
        elif kind == frames.EXITED:
            for stream, redactor in self._redactors.items():
                if rest := redactor.flush():
                    await self.buffer.put(stream, rest)
            report = json.loads(payload)
            # Checked like any input: a process of the workspace may have forged it.
            exit_code = _report_int(report, "exit_code", 0, 255)
            signal_number = _report_int(report, "signal", 0, 64)
            oom_kills = _report_int(report, "oom_kills", 0, 2**31, default=0)
            leftovers = _report_int(report, "leftovers", 0, 2**31, default=0)
            spill_path = report.get("spill_path") or ""
            if not isinstance(spill_path, str):
                msg = "the exit report's spill_path is not a string"
                raise frames.FrameError(msg)
            if report.get("timed_out"):
                self._requested.add(StopReason.TIMEOUT)
            self.leftovers = leftovers
            self._finish(
                exit_status(
                    spill_path=spill_path[:4096],
                    exit_code=exit_code,
                    signal_number=signal_number,
                    oom_kills=oom_kills,
                    memory_limit_bytes=self.context.memory_limit_bytes,
                    requested=self._requested,
                    dropped_bytes=self.buffer.dropped_bytes,
                    elapsed_s=self.elapsed_s,
                    ctrl_c_delivered=self._ctrl_c_delivered,
                )
            )
            return True
        return False

    async def _engine_refused(self, head: bytes) -> None:
        assert self._stream is not None
        text = head
        while len(text) < _STDERR_TAIL_BYTES and (chunk := await self._stream.read()) is not None:
            text += chunk[1]
        self._fail_start(engine_refusal(text))

    def _lost_message(self) -> str:
        tail = self._stderr_tail.decode("utf-8", "replace").strip()
        if tail:
            return f"the command's supervisor ended without an exit status: {tail.splitlines()[-1][:500]}"
        return "the command's supervisor ended without an exit status (was it killed?)"

    def _fail_start(self, error: SandboxdError) -> None:
        # Its text comes from the container (a command can write to its supervisor's stderr).
        error.message = self.context.secrets.mask_text(error.message, self.context.tenant)
        error.args = (error.message,)
        if not self._started.done():
            self._started.set_exception(error)
        self._finish(
            ExitStatus(exit_code=127, stop_reason=StopReason.FAILED, elapsed_s=self.elapsed_s, message=error.message)
        )

    def _fail(self, message: str, *, exit_code: int | None = None) -> None:
        """End the session without a report from the supervisor.

        ``exit_code`` is the supervisor's own, when the engine knows it: a supervisor
        killed by SIGKILL (say, by ``kill -9 -1`` in the command) gives 137.
        """
        if not self._started.done():
            self._fail_start(FailedPreconditionError(message))
            return
        self._requested.add(StopReason.FAILED)
        code = exit_code if exit_code is not None and exit_code > 0 else 255
        self._finish(
            exit_status(
                exit_code=code,
                signal_number=0,
                oom_kills=0,
                memory_limit_bytes=0,
                requested=self._requested,
                dropped_bytes=self.buffer.dropped_bytes,
                elapsed_s=self.elapsed_s,
                message=message,
            )
        )

    def _finish(self, status: ExitStatus) -> None:
        if self.exit is not None:
            return
        # Messages and paths may carry text from the container: secrets never leave in them.
        mask = functools.partial(self.context.secrets.mask_text, tenant=self.context.tenant)
        self.exit = dataclasses.replace(status, message=mask(status.message), spill_path=mask(status.spill_path))
        status = self.exit
        self._state = _State.EXITED
        self._exited.set()
        if self._timer_task is not None and self._timer_task is not asyncio.current_task():
            self._timer_task.cancel()
        log.info(
            "process.exited",
            process_id=self.process_id,
            workspace_id=self.context.workspace_id,
            exit_code=status.exit_code,
            signal=status.signal,
            stop_reason=str(status.stop_reason),
            oom_killed=status.oom_killed,
            dropped_bytes=status.dropped_bytes,
            leftovers=self.leftovers,
            duration_s=round(status.elapsed_s, 3),
        )

    async def _timeout(self) -> None:
        """Backstop for the supervisor, which enforces the timeout itself in the container.

        Fires only if the supervisor has not reported an exit well after the
        deadline (say it was killed): then the daemon kills the tree itself.
        """
        backstop_s = self.timeout_s + self.settings.kill_grace_s + 5.0
        await asyncio.sleep(max(0.0, backstop_s - self.elapsed_s))
        if self.running:
            log.warning("process.timeout_backstop", process_id=self.process_id, timeout_s=self.timeout_s)
            await self.kill(reason=StopReason.TIMEOUT)

    # -- driving ----------------------------------------------------------------------------------------
    async def _send(self, frame: bytes) -> bool:
        """Send a frame to the supervisor; False when it can no longer be reached."""
        if self._stream is None or not self.running:
            return False
        async with self._write_lock:
            try:
                await self._stream.write(frame)
            except (ConnectionError, OSError):
                return False
        return True

    async def write_stdin(self, data: bytes, *, close: bool = False) -> None:
        """Write ``data`` to the command's stdin (and close it when ``close``).

        Raises:
            FailedPreconditionError: the command has exited.
        """
        if len(data) > MAX_INPUT_BYTES:
            msg = f"one Input call carries at most {MAX_INPUT_BYTES} bytes, got {len(data)}; write large data to a file"
            raise InvalidSpecError(msg)
        self.last_used = time.monotonic()
        ok = True
        if data:
            ok = await self._send(frames.encode(frames.STDIN, data))
        if close and ok:
            ok = await self._send(frames.encode(frames.CLOSE_STDIN))
        if not ok and self.running:
            msg = f"process {self.process_id} cannot take input any more"
            raise FailedPreconditionError(msg)

    async def interrupt(self) -> None:
        """Ctrl-C, as :func:`interrupt_plan` chooses for the container's OS.

        POSIX: SIGINT to the command's process group, or ETX (0x03) written to the
        terminal in tty mode so the line discipline delivers it. Windows: a tree
        kill. Never escalates by itself (SPEC §6): a command that catches SIGINT
        keeps running.
        """
        self.last_used = time.monotonic()
        if not self.running:
            return
        plan = interrupt_plan(self.context.os, pid=self.pid, tty=self.spec.tty)
        match plan:
            case InterruptPlan.TERMINAL:
                delivered = await self._send(frames.encode(frames.STDIN, b"\x03"))
                # Signal 0 delivers nothing: it only marks the command as interrupted, so what
                # it leaves behind when it exits is killed as for a piped command.
                await self._send(frames.encode_signal(0, interrupt=True))
                self._ctrl_c_delivered |= delivered
            case InterruptPlan.PROCESS_GROUP:
                self._ctrl_c_delivered |= await self._send(frames.encode_signal(int(signal.SIGINT), interrupt=True))
            case list():
                # A tree kill always ends the command: its death is the interrupt, whatever its code.
                self._requested.add(StopReason.INTERRUPTED)
                await self.backend.exec_run(
                    self.context.workspace_id, plan, user=self.context.user, container_id=self.context.container_id
                )

    async def input(
        self, *, chars: str = "", data: bytes = b"", close_stdin: bool = False, yield_after_s: float | None = None
    ) -> AsyncIterator[ExecEvent]:
        """One Input call: write (or Ctrl-C), then stream what the command prints next.

        ``chars`` equal to :data:`CTRL_C` alone is Ctrl-C (:meth:`interrupt`); ``data`` is raw
        bytes, never read as Ctrl-C. The window is :func:`input_window`'s.

        Yields:
            As :meth:`events`: output, then exactly one ``ExitStatus`` or ``Yielded``, last.

        Raises:
            InvalidSpecError: more than ``MAX_INPUT_BYTES`` to write.
            FailedPreconditionError: the command can no longer take input.
        """
        ctrl_c = chars == CTRL_C
        if ctrl_c:
            await self.interrupt()
            if data or close_stdin:
                await self.write_stdin(data, close=close_stdin)
        elif chars or data or close_stdin:
            await self.write_stdin(chars.encode() + data, close=close_stdin)
        window = input_window(
            yield_after_s, wrote=bool(chars or data or close_stdin), ctrl_c=ctrl_c, timeout_s=self.timeout_s
        )
        async for event in self.events(yield_after_s=window):
            yield event

    async def resize(self, columns: int, rows: int) -> None:
        """Set the terminal size of a tty command (its foreground group gets SIGWINCH).

        Raises:
            InvalidSpecError: a size outside 1..10000 cells.
        """
        if not (1 <= columns <= MAX_TERMINAL_CELLS and 1 <= rows <= MAX_TERMINAL_CELLS):
            msg = f"terminal size must be 1..{MAX_TERMINAL_CELLS} columns and rows, got {columns}x{rows}"
            raise InvalidSpecError(msg)
        self.last_used = time.monotonic()
        if self.spec.tty:
            await self._send(frames.encode_resize(columns, rows))

    async def send_signal(self, number: int) -> None:
        """Send signal ``number`` to the command's process group."""
        self.last_used = time.monotonic()
        if not await self._send(frames.encode_signal(number, interrupt=False)):
            msg = f"process {self.process_id} has exited"
            raise FailedPreconditionError(msg)

    async def kill(self, *, reason: StopReason = StopReason.KILLED, grace_s: float | None = None) -> ExitStatus:
        """SIGTERM everything the command started, wait ``grace_s``, then SIGKILL (SPEC §6).

        Returns:
            The final status; its ``signal`` says which signal ended the command.
        """
        self.last_used = time.monotonic()
        grace = self.settings.kill_grace_s if grace_s is None else grace_s
        if self.running:
            self._requested.add(reason)
            if await self._send(frames.encode_kill(grace)):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(grace + 10.0):
                        await self._exited.wait()
        # Strays of an exited command (or a supervisor that is gone) are found by their marker.
        await self.reap(grace_s=0.0 if not self.running else grace)
        if self.running:
            self._fail("the command could not be stopped")
        assert self.exit is not None
        return self.exit

    async def reap(self, *, grace_s: float) -> None:
        """Kill every process still carrying this session's marker (best effort)."""
        config = {"mode": "reap", "marker": f"{MARKER_ENV}={self.process_id}", "grace_s": grace_s}
        try:
            await self.backend.exec_run(
                self.context.workspace_id,
                script_argv("supervisor.py", config, tokens=True, python=self.context.python),
                user=self.context.user,
                container_id=self.context.container_id,
            )
        except SandboxdError as exc:
            log.warning("process.reap_failed", process_id=self.process_id, error=exc.message)

    # -- streaming -------------------------------------------------------------------------------------
    async def events(self, *, yield_after_s: float) -> AsyncIterator[ExecEvent]:
        """Stream buffered output, then exactly one ``ExitStatus`` or ``Yielded``, always last.

        Returns as soon as the command exits; never sits out the window. Emits a
        ``Heartbeat`` after ``heartbeat_interval_s`` without any event. If the
        caller goes away before the terminal event, the command is interrupted
        (SPEC §2.3: a cancel counts as Ctrl-C). While one call streams the
        output, another gets only a terminal event at once: output is never
        split between two readers.
        """
        if self._attached:
            # Another call is streaming this output; this one only delivered its input.
            yield self.exit or Yielded(process_id=self.process_id, elapsed_s=self.elapsed_s)
            return
        self._attached += 1
        if self._reserved_reader:
            self._reserved_reader = False  # the starting call's reservation becomes this attachment
        else:
            await self.buffer.attach()
        finished = False
        try:
            deadline = time.monotonic() + yield_after_s
            last_event = time.monotonic()
            while True:
                items = await self.buffer.take()
                for item in coalesce(items):
                    yield item
                if items:
                    last_event = time.monotonic()
                if self.exit is not None and self.buffer.empty:
                    finished = True
                    yield self.exit
                    return
                now = time.monotonic()
                if now >= deadline:
                    finished = True
                    yield Yielded(process_id=self.process_id, elapsed_s=self.elapsed_s)
                    return
                beat_at = last_event + self.settings.heartbeat_interval_s
                if now >= beat_at:
                    yield Heartbeat(elapsed_s=self.elapsed_s)
                    last_event = now
                    continue
                await self.buffer.wait(min(deadline, beat_at) - now)
        finally:
            self._attached -= 1
            self.last_used = time.monotonic()
            self.release()
            await asyncio.shield(self.buffer.detach())
            if not finished and self.running and not self.shutting_down:
                await asyncio.shield(self.interrupt())

    async def close(self, reason: str = "") -> None:
        """Stop following the command (it may keep running) and release the stream.

        A session still running is finished as ``failed`` with ``reason``, so that
        any call streaming it ends at once instead of waiting on output that will
        never come.
        """
        if self.exit is None and self._started.done():
            self._requested.add(StopReason.FAILED)
            self._finish(
                ExitStatus(
                    exit_code=255,
                    stop_reason=StopReason.FAILED,
                    dropped_bytes=self.buffer.dropped_bytes,
                    elapsed_s=self.elapsed_s,
                    message=reason or "the daemon stopped following this command",
                )
            )
        for task in (self._timer_task, self._pump_task):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._stream is not None:
            await self._stream.close()
        await self.buffer.close()


class ProcessTable:
    """All live process sessions of the daemon, capped at ``settings.max_sessions``.

    A session belongs to its workspace's tenant: other tenants get NOT_FOUND.
    After a restart, :meth:`end_lost` ends the commands the previous run left
    in a workspace and remembers their ids, so calls on them say they were lost.

    Eviction (seed 000): an exited session first (oldest first), else the least
    recently used idle one, whose whole tree is killed. An evicted id stays known
    so that later calls get NOT_FOUND saying it was evicted.
    """

    def __init__(self, backend: Backend, settings: Settings, *, tenants: Callable[[], int] = lambda: 1) -> None:
        """Create an empty table.

        Args:
            backend: the container engine.
            settings: the caps (``max_sessions``, ``tenant_max_sessions``).
            tenants: how many tenants are configured now (the tokens file's); sets each
                tenant's default share of the sessions.
        """
        self.backend = backend
        self.settings = settings
        self._tenants = tenants
        self._sessions: dict[str, ProcessSession] = {}
        self._evicted: collections.OrderedDict[str, tuple[str, str]] = collections.OrderedDict()
        """Ids no longer in the table: why (a sentence's predicate) and the tenant that may hear it."""
        self._lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()

    def get(self, process_id: str) -> ProcessSession:
        """Return a session.

        Raises:
            ProcessNotFoundError: unknown id, or evicted (the message says which).
        """
        if utf8_size(process_id) > MAX_ID_BYTES:
            msg = f"process_id is {utf8_size(process_id)} bytes; process ids are at most {MAX_ID_BYTES}"
            raise InvalidSpecError(msg)
        session = self._sessions.get(process_id)
        tenant = current_tenant()
        if session is not None and session.context.tenant == tenant:
            return session
        if session is None and process_id in self._evicted and self._evicted[process_id][1] == tenant:
            msg = f"process {process_id} {self._evicted[process_id][0]}"
            raise ProcessNotFoundError(msg)
        msg = f"process {process_id!r} not found"
        raise ProcessNotFoundError(msg)

    def list(self, workspace_id: str) -> list[ProcessSession]:
        """Return the sessions of one workspace, oldest first."""
        return [s for s in self._sessions.values() if s.context.workspace_id == workspace_id]

    def check_spec(self, spec: ExecSpec) -> None:
        """Check every field of an Exec against its bound (``sandboxd_client.limits``), before any work.

        Raises:
            InvalidSpecError: naming the field, its size and its bound.
        """
        if not 0 <= spec.max_output_bytes <= self.settings.max_output_buffer_bytes:
            msg = (
                f"max_output_bytes must be 0 (the daemon default) to {self.settings.max_output_buffer_bytes} "
                f"(SANDBOXD_MAX_OUTPUT_BUFFER_BYTES), got {spec.max_output_bytes}"
            )
            raise InvalidSpecError(msg)
        if spec.spill_after_bytes < 0:
            msg = f"spill_after_bytes must not be negative, got {spec.spill_after_bytes}"
            raise InvalidSpecError(msg)
        if spec.timeout_s is not None and not 0 < spec.timeout_s <= self.settings.max_exec_timeout_s:
            msg = (
                f"timeout must be more than 0 s and at most {self.settings.max_exec_timeout_s:g} s, "
                f"got {spec.timeout_s:g} s"
            )
            raise InvalidSpecError(msg)
        if not (1 <= spec.columns <= MAX_TERMINAL_CELLS and 1 <= spec.rows <= MAX_TERMINAL_CELLS):
            msg = f"terminal size must be 1..{MAX_TERMINAL_CELLS} columns and rows, got {spec.columns}x{spec.rows}"
            raise InvalidSpecError(msg)
        if utf8_size(spec.command) > MAX_COMMAND_BYTES:
            msg = (
                f"command is {utf8_size(spec.command)} bytes; the limit is "
                f"{MAX_COMMAND_BYTES} (one argument of `bash -lc`); write long scripts to a file first"
            )
            raise InvalidSpecError(msg)
        if not spec.command.strip():
            msg = "command must not be empty"
            raise InvalidSpecError(msg)
        if utf8_size(spec.workdir) > MAX_PATH_BYTES:
            msg = f"workdir is {utf8_size(spec.workdir)} bytes; the limit is {MAX_PATH_BYTES}"
            raise InvalidSpecError(msg)
        if "\0" in spec.command or "\0" in spec.workdir:
            msg = "command and workdir must not contain NUL characters"
            raise InvalidSpecError(msg)
        check_env(spec.env, "env")

    async def start(self, context: ExecContext, spec: ExecSpec) -> tuple[ProcessSession, ExecStarted]:
        """Start a command as a new session, evicting one first when the table is full.

        Raises:
            InvalidSpecError: a field out of its bound (:meth:`check_spec`, checked again here
                so that no caller can skip it), or an unknown secret reference.
            QuotaExceededError: no session can be made room for.
        """
        self.check_spec(spec)
        context.secrets.check(spec.env, "env", context.tenant)
        async with self._lock:
            tenant = context.tenant
            tenant_cap = self.tenant_share()
            while True:
                mine = sum(1 for s in self._sessions.values() if s.context.tenant == tenant)
                if mine >= tenant_cap:
                    self._evict_one(tenant, f"tenant {tenant!r} is at its {tenant_cap} process sessions")
                elif len(self._sessions) >= self.settings.max_sessions:
                    self._evict_one(
                        tenant,
                        f"the daemon is at its {self.settings.max_sessions} process sessions",
                        others=True,
                    )
                else:
                    break
            process_id = f"p-{secrets.token_hex(6)}"
            session = ProcessSession(
                backend=self.backend,
                context=context,
                spec=spec,
                settings=self.settings,
                process_id=process_id,
                background=self._retiring,
            )
            self._sessions[process_id] = session
        try:
            started = await session.start()
        except BaseException:
            self._sessions.pop(process_id, None)
            raise
        return session, started

    def tenant_share(self) -> int:
        """Most sessions one tenant may hold: ``tenant_max_sessions``, else a fair share of the daemon's.

        The fair share is ``max_sessions`` divided by the number of configured tenants (all
        of it with one), so the shares sum to the cap and no tenant can take another's last
        slot with commands the other may not end.
        """
        if self.settings.tenant_max_sessions:
            return self.settings.tenant_max_sessions
        return max(1, self.settings.max_sessions // max(1, self._tenants()))

    def _evict_one(self, tenant: str, full: str, *, others: bool = False) -> None:
        """Take one session out of the table now for ``tenant``'s new one; kill it in the background.

        Seed 000's order, fair between tenants: an exited session (``tenant``'s own first;
        then, with ``others``, the oldest idle one of any tenant: an exited session holds
        only unread output), then with ``others`` the least recently used idle session of a
        tenant holding more than its share (shares shrink when a tenant is added to the tokens
        file), then ``tenant``'s own least recently used idle one. No other running command is
        a candidate: one tenant's load never ends another's commands within their share.

        Raises:
            QuotaExceededError: nothing may go (every candidate is attached, or there is none).
        """
        everyone = list(self._sessions.values())
        sessions = [s for s in everyone if s.context.tenant == tenant]
        share = self.tenant_share()
        held = collections.Counter(s.context.tenant for s in everyone)
        candidates = (
            ([s for s in sessions if not s.running], "it had exited and the session table was full"),
            (
                [s for s in everyone if others and not s.running and s.idle],
                "it had exited and the session table was full",
            ),
            (
                [s for s in everyone if others and s.running and s.idle and held[s.context.tenant] > share],
                "it was the least recently used idle session of a tenant over its share when the table was full",
            ),
            (
                [s for s in sessions if s.running and s.idle],
                "it was the least recently used idle session when the table was full",
            ),
        )
        found = next(((group, why) for group, why in candidates if group), None)
        if found is None:
            busy = f"all {len(sessions)} of its sessions are in use by active calls" if sessions else "it has none"
            msg = f"{full} and none can be evicted for tenant {tenant!r}: {busy}"
            raise QuotaExceededError(msg)
        victim, why = min(found[0], key=lambda s: s.last_used), found[1]
        self._sessions.pop(victim.process_id, None)
        self._remember_evicted(victim.process_id, f"was evicted: {why}", victim.context.tenant)
        log.info("process.evicted", process_id=victim.process_id, reason=why)
        task = asyncio.create_task(self._retire(victim))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, victim: ProcessSession) -> None:
        if victim.running:
            await victim.kill(reason=StopReason.KILLED)
        await victim.close()

    def _remember_evicted(self, process_id: str, why: str, tenant: str) -> None:
        self._evicted[process_id] = (why, tenant)
        while len(self._evicted) > 4096:
            self._evicted.popitem(last=False)

    async def forget_workspace(self, workspace_id: str, why: str) -> None:
        """Drop every session of a workspace (its container is going away)."""
        for session in self.list(workspace_id):
            self._sessions.pop(session.process_id, None)
            self._remember_evicted(session.process_id, f"was evicted: {why}", session.context.tenant)
            await session.close(why)

    async def end_lost(self, workspace_id: str, *, user: str, tenant: str) -> builtins.list[str]:
        """End the commands an earlier daemon run left in a workspace; return their process ids.

        Their supervisors lost the daemon that read them, so nobody could ever see
        their output or exit status again: they are killed (SIGTERM, grace, SIGKILL)
        rather than left to run unseen until their timeouts, and their ids stay
        known so that later calls say what happened.
        """
        config = {"mode": "reap", "marker": f"{MARKER_ENV}=", "grace_s": self.settings.kill_grace_s}
        code, output = await self.backend.exec_run(
            workspace_id, script_argv("supervisor.py", config, tokens=True), user=user
        )
        try:
            report = json.loads(output.decode("utf-8", "replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            log.warning("process.lost_scan_failed", workspace_id=workspace_id, exit_code=code)
            return []
        lost = [pid for pid in str(report.get("markers", "")).split(",") if _PROCESS_ID_RE.match(pid)]
        for process_id in lost:
            why = (
                "was lost: the daemon restarted while it ran, so its output and exit status are gone; "
                "the daemon ended it and everything it started"
            )
            self._remember_evicted(process_id, why, tenant)
        if lost:
            log.warning("process.lost", workspace_id=workspace_id, process_ids=lost)
        return lost

    async def close(self) -> None:
        """Release every session's stream; the commands themselves keep running (each under its timeout)."""
        for session in list(self._sessions.values()):
            session.shutting_down = True
        for session in list(self._sessions.values()):
            await session.close("the daemon is shutting down")
        self._sessions.clear()
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)

    def sessions(self) -> Mapping[str, ProcessSession]:
        """Read-only view of all sessions."""
        return dict(self._sessions)
