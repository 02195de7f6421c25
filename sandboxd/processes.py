"""Process sessions: commands running in workspaces, run by each workspace's agent.

A :class:`ProcessSession` is one command on one channel of the workspace's
:class:`~sandboxd.agent.AgentLink`. The agent runs it, keeps its output until
callers have taken it (bounded, head kept, drops counted), and enforces its
timeout; Exec and Input calls attach to the session and stream that output until
the command exits or the caller's yield window closes. The :class:`ProcessTable`
holds at most ``max_sessions`` sessions, a fair share per tenant, and evicts
exited ones first, then the least recently used idle one (seed 000). Sessions
outlive the daemon: a restarted daemon adopts them from the agents.
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
import posixpath
import re
import secrets
import signal
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any

import structlog
from sandboxd_protocol.limits import (
    MAX_COMMAND_BYTES,
    MAX_ENV_BYTES,
    MAX_ENV_ENTRIES,
    MAX_ID_BYTES,
    MAX_INPUT_BYTES,
    MAX_PATH_BYTES,
    utf8_size,
)

from . import metrics
from .agent import (
    MAX_MESSAGE_CHARS,
    AgentLink,
    ExitReport,
    ProtocolError,
    SessionChannel,
    SessionState,
    StartRequest,
    Welcome,
)
from .backend.base import Backend
from .errors import (
    FailedPreconditionError,
    InvalidSpecError,
    ProcessNotFoundError,
    QuotaExceededError,
    SandboxdError,
    quoted,
)
from .logging import cut_text
from .models import (
    ExecEvent,
    ExecSpec,
    ExecStarted,
    ExitStatus,
    Heartbeat,
    StopReason,
    Yielded,
    signal_name,
)
from .relay import OutputRelay
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


MAX_KILL_GRACE_S = 60.0
"""Longest grace a Kill may ask for between SIGTERM and SIGKILL (C12: a ladder always ends)."""


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
    """Build the terminal status from the agent's report (SPEC §6 rules).

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
            (``sandboxd_protocol.limits``: 128 KiB for a call, 32 KiB for a workspace).

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
        if not _ENV_NAME_RE.fullmatch(key):
            msg = f"{field} name {quoted(key)} is not a valid environment variable name"
            raise InvalidSpecError(msg)
        if "\0" in value:
            msg = f"{field} value of {quoted(key)} contains a NUL character"
            raise InvalidSpecError(msg)


class InterruptPlan(enum.Enum):
    """How Ctrl-C reaches a command."""

    PROCESS_GROUP = "SIGINT to the command's process group"
    TERMINAL = "ETX written to the terminal; the line discipline signals the foreground group"
    TREE_KILL = "the whole tree killed: console signals cannot reach a Windows command's pipes"


def interrupt_plan(os_name: str, *, tty: bool) -> InterruptPlan:
    """Choose how Ctrl-C is delivered, from the container's OS (seed 000).

    On Windows the agent's tree kill (a Job Object, else ``taskkill /T /F``) stands in for
    Ctrl-C, which cannot reach processes whose console is a pipe.
    """
    if os_name.lower() == "windows":
        return InterruptPlan.TREE_KILL
    return InterruptPlan.TERMINAL if tty else InterruptPlan.PROCESS_GROUP


class ExecContext:
    """What a session needs to know about its workspace.

    Args:
        workspace_id: the workspace.
        user: user commands run as (``name``, ``uid`` or ``uid:gid``; the agent resolves it).
        working_dir: default working directory (relative workdirs resolve against it).
        memory_limit_bytes: the workspace's memory limit, reported with OOM kills.
        os: the container's OS (``linux`` or ``windows``), which decides how Ctrl-C is delivered.
        env: the workspace's environment, given to every command (never to sandboxd's own tools).
        tenant: the tenant owning the workspace; only its calls may see the workspace's processes.
        secrets: resolves ``secret:NAME`` env values and masks their values in output.
        container_id: the workspace's container; commands run in exactly it (empty: by name).
        link: the connection to the workspace's agent.
        capabilities: capabilities the workspace added back (commands keep exactly these).
    """

    def __init__(
        self,
        *,
        workspace_id: str,
        user: str,
        working_dir: str,
        memory_limit_bytes: int,
        link: AgentLink,
        os: str = "linux",
        env: Mapping[str, str] | None = None,
        tenant: str = DEFAULT_TENANT,
        secrets: SecretStore | None = None,
        container_id: str = "",
        capabilities: tuple[str, ...] = (),
    ) -> None:
        """Bundle the workspace facts."""
        self.workspace_id = workspace_id
        self.user = user
        self.working_dir = working_dir
        self.memory_limit_bytes = memory_limit_bytes
        self.link = link
        self.os = os
        self.env = dict(env or {})
        self.tenant = tenant
        self.secrets = secrets or SecretStore("", {})
        self.container_id = container_id
        self.capabilities = capabilities


WINDOW_BYTES = 4 * 1024 * 1024
"""Most output the daemon lets an agent without the ``tail`` feature send beyond what callers
have taken, while one reads: a session's ``max_output_bytes`` up to this (the agent keeps every
byte until acknowledged, so a restart loses none, and a caller that walks away must find no
more unread than the session keeps)."""

STREAM_WINDOW_BYTES = 16 * 1024 * 1024
"""The same with an agent that can say where its held output ends (``tail``): what a caller
leaves unread beyond ``max_output_bytes`` is then dropped when it walks away (``OutputRelay.trim``),
so the window need not be held to the buffer. A larger window streams faster (fewer waits for an
acknowledgement's round trip); this one is the agent's bound (``output.MaxWindow``) and, per
session, the daemon's (``max_output_buffer_bytes``): a stream at full speed holds at most this."""

_ACK_STEP_BYTES = 256 * 1024
"""Delivered bytes that make a new acknowledgement worth a frame (the end of a batch always does)."""

START_TIMEOUT_S = 60.0
"""Longest wait for the agent to say a command runs (a loaded gVisor sandbox is slow, not this slow)."""


class _State(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    EXITED = "exited"


class ProcessSession:
    """One command, run by the workspace's agent on one channel of its link.

    The session is the command's state machine (starting, running, exited) and the
    policy of its calls (yield windows, Ctrl-C, the kill ladder, eviction); its output
    goes through an :class:`~sandboxd.relay.OutputRelay`, and every frame through a
    :class:`~sandboxd.agent.SessionChannel`. Output reaches callers in the order the
    command produced it, each byte once: the session lets the agent send at most
    :data:`WINDOW_BYTES` beyond what callers have taken and acknowledges what they took.
    The terminal :class:`ExitStatus` comes after all of the command's output.
    """

    def __init__(
        self,
        *,
        link: AgentLink,
        context: ExecContext,
        spec: ExecSpec,
        settings: Settings,
        process_id: str,
        background: set[asyncio.Task[None]] | None = None,
    ) -> None:
        """Prepare a session; :meth:`start` runs it (or :meth:`adopt` takes over a running one)."""
        self.link = link
        self.context = context
        self.spec = spec
        self.process_id = process_id
        self.settings = settings
        self.timeout_s = spec.timeout_s if spec.timeout_s is not None else settings.exec_timeout_s
        self.channel: SessionChannel | None = None
        self.pid = 0
        self.start_time = datetime.datetime.now(datetime.UTC)
        self._started_at = time.monotonic()
        self.last_used = time.monotonic()
        self.exit: ExitStatus | None = None
        """The exit status, once the agent reported it (callers get it after the output)."""
        self._state = _State.STARTING
        self._started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # A start abandoned by its caller fails with nobody awaiting it: that is no error to log.
        self._started.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._exited = asyncio.Event()
        self._requested: set[StopReason] = set()
        self._ctrl_c_delivered = False
        """A Ctrl-C reached the command (see ``exit_status``)."""
        self.output = OutputRelay(
            {stream: context.secrets.redactor(context.tenant, tty=spec.tty) for stream in ("stdout", "stderr")}
        )
        self._pull_sent: tuple[int, int, int, bool] | None = None
        self._buffer_bytes = spec.max_output_bytes or settings.output_buffer_bytes
        self._ack_step = max(1, min(_ACK_STEP_BYTES, self._buffer_bytes // 4))
        """An acknowledgement frees the agent's buffer: a small buffer needs them often."""
        self._pulling: asyncio.Task[None] | None = None
        self._agent_dropped: int | None = None
        """The agent's count of dropped bytes in its exit report."""
        self.spill_path = f"{SPILL_DIR}/{process_id}.out"
        """Where the whole output goes once it passes ``spec.spill_after_bytes``."""
        self.leftovers = 0
        """Processes of the command still alive when it exited (its timeout still bounds them)."""
        self._attached = 1
        """Calls streaming this output; the Exec call that starts it counts from the start."""
        self._fresh = True
        """Not yet streamed to its caller: never evicted in that state (it would kill a command
        whose Exec call has not even attached)."""
        self._calls = 0
        """Calls that have streamed (or polled) this session's output."""
        self._background: set[asyncio.Task[None]] = background if background is not None else set()
        self.shutting_down = False
        """Set when the daemon stops: departing streams then leave their commands alone."""
        self.yield_now = False
        """Set as the daemon's drain ends: a call streaming this command yields at once."""

    # -- life cycle ------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether the top-level command still runs."""
        return self._state is not _State.EXITED

    @property
    def idle(self) -> bool:
        """Whether no call is attached and the first call has had its stream (eviction may pick it)."""
        return self._attached == 0 and not self._fresh

    @property
    def dropped_bytes(self) -> int:
        """Output bytes callers were told were dropped so far."""
        return self.output.dropped_bytes

    def release(self) -> None:
        """The first call is done with the session: from now on it may be evicted when idle."""
        if self._fresh:
            self._fresh = False
            self._attached -= 1  # the starting call's reservation
            self._schedule_pull()

    @property
    def elapsed_s(self) -> float:
        """Seconds since the command started."""
        return time.monotonic() - self._started_at

    def _workdir(self) -> str:
        workdir = self.spec.workdir or self.context.working_dir
        return posixpath.normpath(posixpath.join(self.context.working_dir, workdir))

    def _env(self) -> dict[str, str]:
        """The command's environment over the image's: defaults, workspace env, exec env (the agent adds the marker)."""
        defaults = TTY_ENV if self.spec.tty else NON_INTERACTIVE_ENV
        env = self.context.secrets.resolve({**self.context.env, **self.spec.env}, self.context.tenant)
        if EDITOR_ENV & env.keys():
            defaults = {key: value for key, value in defaults.items() if key not in EDITOR_ENV}
        return {**defaults, **env}

    def _daemon_state(self) -> dict[str, Any]:
        """What a restarted daemon needs to take the session over; kept by the agent (no secrets)."""
        return {
            "workspace_id": self.context.workspace_id,
            "container_id": self.context.container_id,
            "tenant": self.context.tenant,
            "command": self.spec.command,
            "tty": self.spec.tty,
            "columns": self.spec.columns,
            "rows": self.spec.rows,
            "timeout_s": self.timeout_s,
            "max_output_bytes": self.spec.max_output_bytes,
            "spill_after_bytes": self.spec.spill_after_bytes,
            "merge_stderr": self.spec.merge_stderr,
            "start_time": self.start_time.isoformat(),
        }

    def _request(self) -> StartRequest:
        return StartRequest(
            process_id=self.process_id,
            command=self.spec.command,
            cwd=self._workdir(),
            env=self._env(),
            user=self.context.user,
            tty=self.spec.tty,
            columns=self.spec.columns,
            rows=self.spec.rows,
            timeout_s=self.timeout_s,
            grace_s=self.settings.kill_grace_s,
            buffer_bytes=self._buffer_bytes,
            spill_path=self.spill_path if self.spec.spill_after_bytes > 0 else "",
            spill_after_bytes=self.spec.spill_after_bytes,
            merge_stderr=self.spec.merge_stderr,
            capabilities=self.context.capabilities,
            daemon_state=self._daemon_state(),
        )

    async def start(self) -> ExecStarted:
        """Start the command; return once the agent says it runs.

        Raises:
            InvalidSpecError: the working directory, the user or the shell cannot be used.
            QuotaExceededError: the workspace's process limit is reached.
            FailedPreconditionError: the agent cannot be reached.
        """
        channel = self.channel = await SessionChannel.open(self.link, self)
        try:
            await channel.start(self._request())
            await self._pull(force=True)
            try:
                async with asyncio.timeout(START_TIMEOUT_S):
                    await asyncio.shield(self._started)
            except TimeoutError:
                self._fail(f"the workspace's agent did not start the command within {START_TIMEOUT_S:g} s")
                await self._started  # raises the failure
        except asyncio.CancelledError:
            # The caller left while the command was starting: it must not live on unseen. Unless
            # the daemon is stopping (its drain ended the call): then it is the next daemon's.
            if not self.shutting_down:
                self._spawn(self._abandon())
            raise
        except BaseException:
            channel.close()
            raise
        log.info("process.started", process_id=self.process_id, workspace_id=self.context.workspace_id, pid=self.pid)
        return ExecStarted(process_id=self.process_id, pid=self.pid, start_time=self.start_time)

    def adopt(self, state: SessionState) -> None:
        """Take over a session the agent kept across a daemon restart (``state`` from its welcome).

        Output continues from the agent's acknowledged offset: nothing a caller took is
        sent again, nothing held is lost.
        """
        self.channel = SessionChannel(self.link, self, state.channel)
        self.pid = state.pid
        self.output.resume(state.ack, state.ack_gap)
        self._ctrl_c_delivered = state.interrupted
        self._attached, self._fresh = 0, False
        self._state = _State.RUNNING
        if not self._started.done():
            self._started.set_result(None)
        if state.exit is not None:
            self.on_exited(state.exit)
        elif state.failed is not None:
            self._fail(f"the command could not start: {state.failed}")

    async def _abandon(self) -> None:
        """End a command nobody will ever see."""
        if self.channel is not None:
            with contextlib.suppress(SandboxdError):
                await self.channel.discard()
        await self.close()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- what the agent says (SessionEvents) ------------------------------------------------------
    def on_started(self, pid: int) -> None:
        """The command runs."""
        self.pid = pid
        if self._state is _State.STARTING:
            self._state = _State.RUNNING
        if not self._started.done():
            self._started.set_result(None)

    def on_start_failed(self, stage: str, message: str) -> None:
        """The command could not start: the error the Exec call gets depends on why."""
        detail = cut_text(message, MAX_MESSAGE_CHARS)
        if stage in {"fork", "died"}:  # out of processes (or memory): the workspace's limits
            error: SandboxdError = QuotaExceededError(f"cannot start the command: {detail}")
        elif stage in {"chdir", "exec", "user"}:
            error = InvalidSpecError(f"cannot start the command: {detail}")
        else:
            error = FailedPreconditionError(f"cannot start the command: {detail}")
        self._fail_start(error)

    def on_output(self, stream: str, offset: int, data: bytes) -> None:
        """Output for callers."""
        try:
            self.output.add_output(stream, offset, data)
        except ProtocolError as exc:
            self.on_broken(f"the workspace's agent sent a bad frame: {exc.message}")

    def on_dropped(self, offset: int, total: int) -> None:
        """Output the agent could not keep."""
        self.output.add_gap(offset, total)

    def on_exited(self, report: ExitReport) -> None:
        """The command ended (callers get it once its output is delivered)."""
        self.leftovers = report.leftovers
        if self.exit is None:
            self._agent_dropped = report.dropped
        if report.timed_out:
            self._requested.add(StopReason.TIMEOUT)
        self._finish(
            exit_status(
                spill_path=report.spill_path,
                exit_code=report.exit_code,
                signal_number=report.signal,
                oom_kills=report.oom_kills,
                memory_limit_bytes=self.context.memory_limit_bytes,
                requested=self._requested,
                dropped_bytes=report.dropped + self.output.trimmed_bytes,
                elapsed_s=self.elapsed_s,
                ctrl_c_delivered=self._ctrl_c_delivered,
            )
        )
        self.output.set_end(report.end)

    def on_broken(self, message: str) -> None:
        """The agent refused this session's frames or sent bad ones: the session fails."""
        self._fail(message)

    def on_disconnect(self) -> None:
        """The link broke: what was in flight is sent again once it is back."""
        self._pull_sent = None

    def on_reconnect(self, state: SessionState | None) -> None:
        """The link is back: go on from the acknowledgement, or fail if the agent lost the command."""
        if state is None:
            if self._started.done() and not self.output.complete:
                self._fail("the workspace's agent restarted while the command ran; the command and its output are lost")
            return
        self.output.rewind(state.ack)
        self._count_trimmed()
        if state.exit is not None and self.exit is None:
            self.on_exited(state.exit)
        self._schedule_pull()

    # -- flow control ------------------------------------------------------------------------------
    @property
    def _tails(self) -> bool:
        """Whether the agent answers tail pulls (its welcome lists ``tail``)."""
        welcome = self.link.welcome
        return welcome is not None and "tail" in welcome.features

    @property
    def _window(self) -> int:
        """What the agent may send beyond callers' take while one reads (see ``STREAM_WINDOW_BYTES``)."""
        if self._tails:
            return max(STREAM_WINDOW_BYTES, self._buffer_bytes)
        return min(WINDOW_BYTES, self._buffer_bytes)

    def on_tail(self, end: int) -> None:
        """Where the agent's held output ends, asked when the last caller left: more than the session keeps is cut."""
        dropped = self.output.trim(end)
        self._count_trimmed()
        if dropped:
            log.info("process.output_trimmed", process_id=self.process_id, dropped_bytes=dropped)

    def _count_trimmed(self) -> None:
        """The exit's dropped count: the agent's, and what trims dropped since (undone by a rewind)."""
        if self.exit is not None and self._agent_dropped is not None:
            total = self._agent_dropped + self.output.trimmed_bytes
            self.exit = dataclasses.replace(self.exit, dropped_bytes=total)

    def _schedule_pull(self) -> None:
        if self._pulling is None or self._pulling.done():
            self._pulling = asyncio.create_task(self._pull())
            self._background.add(self._pulling)
            self._pulling.add_done_callback(self._background.discard)

    async def _pull(self, *, force: bool = False) -> None:
        """Tell the agent what callers took and how much more may come."""
        if self.channel is None:
            return
        ack, ack_gap = self.output.ack_position()
        reader = self._attached > 0
        until = self.output.delivered + self._window if reader else self.output.received
        last = self._pull_sent
        if (
            not force
            and last is not None
            and reader == last[3]
            and ack - last[0] < self._ack_step
            and until - last[2] < self._ack_step
        ):
            return  # nothing worth a frame: the agent has room enough, and little to forget
        # The last reader leaves with more allowed in flight than the session keeps: ask where
        # the agent's held output ends, to cut it to its head (on_tail).
        tail = (
            not reader
            and last is not None
            and last[3]
            and last[2] - self.output.delivered > self._buffer_bytes
            and self._tails
        )
        self._pull_sent = (ack, ack_gap, until, reader)
        if tail:
            self.output.hold(self._buffer_bytes)
        try:
            await self.channel.pull(ack=ack, ack_gap=ack_gap, until=until, reader=reader, tail=tail)
        except SandboxdError:
            if tail:
                self.output.release()

    # -- ending --------------------------------------------------------------------------------
    def _fail_start(self, error: SandboxdError) -> None:
        # Its text comes from the container (a command can make its start fail with any message).
        error.message = self.context.secrets.mask_text(error.message, self.context.tenant)
        error.args = (error.message,)
        if not self._started.done():
            self._started.set_exception(error)
        self._finish(
            ExitStatus(exit_code=127, stop_reason=StopReason.FAILED, elapsed_s=self.elapsed_s, message=error.message)
        )
        self.output.close()

    def _fail(self, message: str) -> None:
        """End the session without an exit report from the agent."""
        if not self._started.done():
            self._fail_start(FailedPreconditionError(message))
            return
        self._requested.add(StopReason.FAILED)
        self._finish(
            exit_status(
                exit_code=255,
                signal_number=0,
                oom_kills=0,
                memory_limit_bytes=0,
                requested=self._requested,
                dropped_bytes=self.dropped_bytes,
                elapsed_s=self.elapsed_s,
                message=message,
            )
        )
        self.output.close()

    def _finish(self, status: ExitStatus) -> None:
        if self.exit is not None:
            return
        # Messages and paths may carry text from the container: secrets never leave in them.
        mask = functools.partial(self.context.secrets.mask_text, tenant=self.context.tenant)
        self.exit = dataclasses.replace(status, message=mask(status.message), spill_path=mask(status.spill_path))
        status = self.exit
        self._state = _State.EXITED
        self._exited.set()
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

    # -- driving ----------------------------------------------------------------------------------------
    async def _deliver(self, send: Callable[[SessionChannel], Coroutine[Any, Any, None]]) -> bool:
        """Send something to the running command; False when it has exited or the agent cannot be reached."""
        if not self.running or self.channel is None:
            return False
        try:
            await send(self.channel)
        except SandboxdError:
            return False
        return True

    async def write_stdin(self, data: bytes, *, close: bool = False) -> None:
        """Write ``data`` to the command's stdin (and close it when ``close``).

        Raises:
            InvalidSpecError: more than ``MAX_INPUT_BYTES``.
            FailedPreconditionError: the command can no longer take input.
        """
        if len(data) > MAX_INPUT_BYTES:
            msg = f"one Input call carries at most {MAX_INPUT_BYTES} bytes, got {len(data)}; write large data to a file"
            raise InvalidSpecError(msg)
        self.last_used = time.monotonic()
        ok = not data or await self._deliver(lambda channel: channel.write(data))
        if close and ok:
            ok = await self._deliver(lambda channel: channel.close_input())
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
        plan = interrupt_plan(self.context.os, tty=self.spec.tty)
        match plan:
            case InterruptPlan.TERMINAL:
                delivered = await self._deliver(lambda channel: channel.write(b"\x03"))
                # Signal 0 delivers nothing: it only marks the command as interrupted, so what
                # it leaves behind when it exits is killed as for a piped command.
                await self._deliver(lambda channel: channel.signal(0, interrupt=True))
                self._ctrl_c_delivered |= delivered
            case InterruptPlan.PROCESS_GROUP:
                sent = await self._deliver(lambda channel: channel.signal(int(signal.SIGINT), interrupt=True))
                self._ctrl_c_delivered |= sent
            case InterruptPlan.TREE_KILL:
                # A tree kill always ends the command: its death is the interrupt, whatever its code.
                self._requested.add(StopReason.INTERRUPTED)
                await self._deliver(lambda channel: channel.kill(0.0))

    async def abandon(self) -> None:
        """Ctrl-C a command whose starting call left before it streamed (a cancel, SPEC §2.3).

        If it still runs ``kill_grace_s`` later and no call has streamed it since, its whole
        tree is ended (stop reason ``interrupted``): its caller may never have received the
        process id, so nobody else could stop a command that outlives its Ctrl-C (one that
        catches SIGINT, or a child of the command's that a shell took it for).
        """
        await self.interrupt()
        if self.running:
            self._spawn(self._end_unseen(self._calls))

    async def _end_unseen(self, calls: int) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.settings.kill_grace_s):
                await self._exited.wait()
        if self.running and self._calls == calls and not self.shutting_down:
            log.info("process.abandoned", process_id=self.process_id, workspace_id=self.context.workspace_id)
            await self.kill(reason=StopReason.INTERRUPTED)

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
            await self._deliver(lambda channel: channel.resize(columns, rows))

    async def send_signal(self, number: int) -> None:
        """Send signal ``number`` to the command's process group.

        Raises:
            FailedPreconditionError: the command has exited.
        """
        self.last_used = time.monotonic()
        if not await self._deliver(lambda channel: channel.signal(number, interrupt=False)):
            msg = f"process {self.process_id} has exited"
            raise FailedPreconditionError(msg)

    async def kill(self, *, reason: StopReason = StopReason.KILLED, grace_s: float | None = None) -> ExitStatus:
        """SIGTERM everything the command started, wait ``grace_s``, then SIGKILL (SPEC §6).

        An exited command's leftovers (``server &``) are killed at once.

        Returns:
            The final status; its ``signal`` says which signal ended the command.
        """
        self.last_used = time.monotonic()
        grace = self.settings.kill_grace_s if grace_s is None else grace_s
        if self.running:
            self._requested.add(reason)
            if await self._deliver(lambda channel: channel.kill(grace)):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(grace + 10.0):
                        await self._exited.wait()
            if self.running:
                self._fail("the command could not be stopped")
        elif self.channel is not None:
            with contextlib.suppress(SandboxdError):
                await self.channel.kill(0.0)
        assert self.exit is not None
        return self.exit

    async def discard(self) -> None:
        """Let the agent forget the session (a running command is killed with its tree) and close it."""
        if self.channel is not None:
            with contextlib.suppress(SandboxdError):
                await self.channel.discard()
        await self.close("it was evicted")

    # -- streaming -------------------------------------------------------------------------------------
    async def events(self, *, yield_after_s: float) -> AsyncIterator[ExecEvent]:
        """Stream output, then exactly one ``ExitStatus`` or ``Yielded``, always last.

        Returns as soon as the command exits; never sits out the window. Emits a
        ``Heartbeat`` after ``heartbeat_interval_s`` without any event. If the
        caller goes away before the terminal event, the command is interrupted
        (SPEC §2.3: a cancel counts as Ctrl-C). While one call streams the
        output, another gets only a terminal event at once: output is never
        split between two readers.
        """
        output = self.output
        self._calls += 1
        if self._attached and not self._fresh:
            # Another call is streaming this output; this one only delivered its input.
            if output.complete and self.exit is not None:
                yield self.exit
            else:
                yield Yielded(process_id=self.process_id, elapsed_s=self.elapsed_s)
            return
        if not self._fresh:
            self._attached += 1
        self._fresh = False
        await self._pull(force=True)
        finished = left = False

        async def leave() -> None:
            # Acknowledged before the caller hears its terminal event: a daemon killed right
            # after it has told the agent all the caller took (none of it comes again).
            nonlocal left
            if not left:
                left = True
                self._attached -= 1
                self.last_used = time.monotonic()
                await asyncio.shield(self._pull(force=True))

        try:
            deadline = time.monotonic() + yield_after_s
            last_event = time.monotonic()
            while True:
                batch = output.take()
                for event, through in batch:
                    yield event
                    output.delivered_through(through)
                    last_event = time.monotonic()
                if batch:
                    await self._pull()
                if output.complete and not output.pending and self.exit is not None:
                    finished = True
                    await leave()
                    yield self.exit
                    return
                now = time.monotonic()
                if now >= deadline or self.yield_now:
                    finished = True
                    await leave()
                    yield Yielded(process_id=self.process_id, elapsed_s=self.elapsed_s)
                    return
                beat_at = last_event + self.settings.heartbeat_interval_s
                if now >= beat_at:
                    yield Heartbeat(elapsed_s=self.elapsed_s)
                    last_event = now
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(deadline, beat_at) - now):
                        await output.changed.wait()
        finally:
            await leave()
            if not finished and self.running and not self.shutting_down:
                await asyncio.shield(self.interrupt())

    async def close(self, reason: str = "") -> None:
        """Stop following the command (it may keep running in the agent) and let its channel go.

        A session still running is finished as ``failed`` with ``reason``, so that any
        call streaming it ends at once instead of waiting on output that will never come.
        """
        if self.exit is None and self._started.done():
            self._fail(reason or "the daemon stopped following this command")
        elif not self._started.done():
            self._fail_start(FailedPreconditionError(reason or "the daemon stopped following this command"))
        self.output.close()
        if self.channel is not None:
            self.channel.close()


class ProcessTable:
    """All live process sessions of the daemon, capped at ``settings.max_sessions``.

    A session belongs to its workspace's tenant: other tenants get NOT_FOUND.
    After a restart, :meth:`adopt` takes over the sessions each workspace's agent kept.

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
        self._stopping = False
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

    def session_counts(self) -> dict[str, int]:
        """How many sessions the table holds, running and exited (for the metrics)."""
        running = sum(1 for s in self._sessions.values() if s.exit is None)
        return {"running": running, "exited": len(self._sessions) - running}

    def check_spec(self, spec: ExecSpec) -> None:
        """Check every field of an Exec against its bound (``sandboxd_protocol.limits``), before any work.

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
                f"{MAX_COMMAND_BYTES}; write long scripts to a file first"
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
                link=context.link,
                context=context,
                spec=spec,
                settings=self.settings,
                process_id=process_id,
                background=self._retiring,
            )
            self._sessions[process_id] = session
            session.shutting_down = self._stopping
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
        metrics.SESSIONS_EVICTED.inc()
        task = asyncio.create_task(self._retire(victim))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, victim: ProcessSession) -> None:
        if victim.running:
            await victim.kill(reason=StopReason.KILLED)
        await victim.discard()

    def _remember_evicted(self, process_id: str, why: str, tenant: str) -> None:
        self._evicted[process_id] = (why, tenant)
        while len(self._evicted) > 4096:
            self._evicted.popitem(last=False)

    def drop(self, session: ProcessSession) -> None:
        """Take a session of the daemon's own out of the table, leaving no trace of it."""
        if self._sessions.get(session.process_id) is session:
            del self._sessions[session.process_id]

    async def forget_workspace(self, workspace_id: str, why: str) -> None:
        """Drop every session of a workspace (its container is going away)."""
        for session in self.list(workspace_id):
            self._sessions.pop(session.process_id, None)
            self._remember_evicted(session.process_id, f"was evicted: {why}", session.context.tenant)
            await session.close(why)

    def adopt(self, context: ExecContext, welcome: Welcome) -> builtins.list[str]:
        """Take over the sessions a workspace's agent kept while no daemon was connected.

        Each comes back with its process id, its exit status if it has one, and its output
        from the exact byte callers had taken. Sessions this table follows already, and
        those of another workspace or container, are left alone.

        Returns:
            The process ids adopted.
        """
        adopted = []
        for state in welcome.sessions:
            saved = state.daemon_state
            if not _PROCESS_ID_RE.fullmatch(state.process_id) or state.process_id in self._sessions:
                continue
            if saved.get("workspace_id") != context.workspace_id or saved.get("container_id") != context.container_id:
                continue
            try:
                spec = ExecSpec(
                    command=str(saved.get("command", "")),
                    tty=bool(saved.get("tty")),
                    columns=int(saved.get("columns") or 80),
                    rows=int(saved.get("rows") or 24),
                    timeout_s=float(saved.get("timeout_s") or self.settings.exec_timeout_s),
                    max_output_bytes=int(saved.get("max_output_bytes") or 0),
                    spill_after_bytes=int(saved.get("spill_after_bytes") or 0),
                    merge_stderr=bool(saved.get("merge_stderr")),
                )
                start_time = datetime.datetime.fromisoformat(str(saved.get("start_time")))
            except (ValueError, TypeError) as exc:
                log.warning("process.adopt_failed", process_id=state.process_id, error=str(exc))
                continue
            session = ProcessSession(
                link=context.link,
                context=context,
                spec=spec,
                settings=self.settings,
                process_id=state.process_id,
                background=self._retiring,
            )
            session.start_time = start_time
            session.adopt(state)
            self._sessions[state.process_id] = session
            session.shutting_down = self._stopping
            adopted.append(state.process_id)
        if adopted:
            log.info("process.adopted", workspace_id=context.workspace_id, process_ids=adopted)
        return adopted

    def yield_all(self) -> None:
        """The daemon's grace is over: every call streaming a command yields now, with its process id.

        The caller polls that process id again once a daemon serves (C13): the command runs on,
        for the next daemon to adopt; nothing is interrupted.
        """
        self.stop_interrupting()
        for session in list(self._sessions.values()):
            session.yield_now = True
            session.output.changed.set()

    def stop_interrupting(self) -> None:
        """The daemon is stopping: a stream that ends now (its call ended by the stop) Ctrl-Cs nothing.

        A caller who leaves an exec's stream early means Ctrl-C (SPEC §2.3); a daemon that stops
        does not: its commands run on, for the next daemon to adopt.
        """
        self._stopping = True
        for session in list(self._sessions.values()):
            session.shutting_down = True

    async def close(self) -> None:
        """Release every session's stream; the commands themselves keep running (each under its timeout)."""
        self.stop_interrupting()
        for session in list(self._sessions.values()):
            await session.close("the daemon is shutting down")
        self._sessions.clear()
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)

    def sessions(self) -> Mapping[str, ProcessSession]:
        """Read-only view of all sessions."""
        return dict(self._sessions)
