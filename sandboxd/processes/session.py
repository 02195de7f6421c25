"""One command's session: what the agent says of it, and the policy of its calls (input, Ctrl-C, kill)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import signal
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from typing import Any

import structlog
from sandboxd_protocol.limits import MAX_INPUT_BYTES

from ..agent import MAX_MESSAGE_CHARS, AgentLink, ExitReport, ProtocolError, SessionChannel, SessionState
from ..errors import FailedPreconditionError, InvalidSpecError, SandboxdError
from ..logging import cut_text
from ..models import ExecEvent, ExecSpec, ExecStarted, ExitStatus, StopReason
from ..relay import OutputRelay
from ..settings import Settings
from .context import ExecContext, start_request
from .flow import OutputBudget, OutputFlow
from .rules import (
    CTRL_C,
    MAX_TERMINAL_CELLS,
    SPILL_DIR,
    InterruptPlan,
    clamp_yield,
    input_window,
    interrupt_plan,
    start_error,
)
from .state import CommandState
from .stream import OutputStream

__all__ = ["START_TIMEOUT_S", "ProcessSession"]

log = structlog.get_logger("sandboxd.processes")

START_TIMEOUT_S = 60.0
"""Longest wait for the agent to say a command runs (a loaded gVisor sandbox is slow, not this slow)."""
RESUME_GRACE_S = 25.0
"""How long a daemon that took over a session a caller was reading waits for that caller to come
back (``resume_from``), holding the output back for it; the agent holds it 30 s from the break
(``session.ReaderGrace``), so a daemon that took 5 s to come back still waits its full grace."""


class ProcessSession:
    """One command, run by the workspace's agent on one channel of its link.

    The session is what the agent says of the command (it implements
    :class:`~sandboxd.agent.SessionEvents`) and the policy of its calls (Ctrl-C, input,
    signals, the kill ladder, eviction). Its parts: the command's state and exit status
    (:class:`~sandboxd.processes.state.CommandState`), its output on the way to callers
    (:class:`~sandboxd.relay.OutputRelay`), the flow control the agent is told
    (:class:`~sandboxd.processes.flow.OutputFlow`) and the calls that stream it
    (:class:`~sandboxd.processes.stream.OutputStream`); every frame goes through a
    :class:`~sandboxd.agent.SessionChannel`. Output reaches callers in the order the command
    produced it, each byte once, and the terminal :class:`ExitStatus` comes after all of it.
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
        budget: OutputBudget | None = None,
    ) -> None:
        """Prepare a session; :meth:`start` runs it (or :meth:`adopt` takes over a running one).

        ``budget`` is the daemon's for held output: the session's windows are within it, and
        it may give the session's held output back to the agent (:meth:`give_back_output`).
        """
        self.link = link
        self.context = context
        self.spec = spec
        self.process_id = process_id
        self.settings = settings
        self.timeout_s = spec.timeout_s if spec.timeout_s is not None else settings.exec_timeout_s
        self.channel: SessionChannel | None = None
        self.pid = 0
        self.start_time = datetime.datetime.now(datetime.UTC)
        self.last_used = time.monotonic()
        self.state = CommandState(
            process_id=process_id,
            workspace_id=context.workspace_id,
            mask=functools.partial(context.secrets.mask_text, tenant=context.tenant),
        )
        self.output = OutputRelay(
            {stream: context.secrets.redactor(context.tenant, tty=spec.tty) for stream in ("stdout", "stderr")},
            meter=budget,
        )
        self.flow = OutputFlow(buffer_bytes=spec.max_output_bytes or settings.output_buffer_bytes, budget=budget)
        self.spill_path = f"{SPILL_DIR}/{process_id}.out"
        """Where the whole output goes once it passes ``spec.spill_after_bytes``."""
        self._background: set[asyncio.Task[None]] = background if background is not None else set()
        self.stream = OutputStream(
            self,
            output=self.output,
            flow=self.flow,
            heartbeat_interval_s=settings.heartbeat_interval_s,
            background=self._background,
            budget=budget,
        )
        if budget is not None:
            budget.track(self)
        self.shutting_down = False
        """Set when the daemon stops: departing streams then leave their commands alone."""
        self.stdin_closed = spec.stdin_closed and not spec.tty
        """Its stdin pipe was closed (at start, or by an Input): more input has nowhere to go. (A
        terminal's close is an end-of-file character: the terminal takes input still.)"""
        self.yield_now = False
        """Set as the daemon's drain ends: a call streaming this command yields at once."""

    # -- life cycle ------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether the top-level command still runs."""
        return self.state.running

    @property
    def exit(self) -> ExitStatus | None:
        """The exit status, once the agent reported it (callers get it after the output)."""
        return self.state.exit

    @property
    def idle(self) -> bool:
        """Whether eviction picks it first: detached, and not just taken over from a restart."""
        return self.stream.idle

    @property
    def detached(self) -> bool:
        """Whether no call is attached and the first call has had its stream (eviction may pick it)."""
        return self.stream.detached

    @property
    def elapsed_s(self) -> float:
        """Seconds since the command started."""
        return self.state.elapsed_s

    async def start(self) -> ExecStarted:
        """Start the command; return once the agent says it runs.

        Raises:
            InvalidSpecError: the working directory, the user or the shell cannot be used.
            QuotaExceededError: the workspace's process limit is reached.
            FailedPreconditionError: the agent cannot be reached.
        """
        channel = self.channel = await SessionChannel.open(self.link, self)
        try:
            await channel.start(
                start_request(
                    self.context,
                    self.spec,
                    process_id=self.process_id,
                    timeout_s=self.timeout_s,
                    grace_s=self.settings.kill_grace_s,
                    buffer_bytes=self.flow.buffer_bytes,
                    spill_path=self.spill_path,
                    start_time=self.start_time,
                )
            )
            if self.spec.stdin_closed:
                # Frames on the channel keep their order: the agent closes the stdin of the command
                # it has just started, before the command can block on it.
                await channel.close_input()
            await self.stream.pull(force=True)
            try:
                async with asyncio.timeout(START_TIMEOUT_S):
                    await asyncio.shield(self.state.started)
            except TimeoutError:
                self._fail(f"the workspace's agent did not start the command within {START_TIMEOUT_S:g} s")
                await self.state.started  # raises the failure
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
        self.output.resume(state.ack, state.ack_gap, state.end)
        self.flow.acked = state.ack
        self.state.ctrl_c_delivered = state.interrupted
        self.stream.adopted(reading=state.reading, grace_s=RESUME_GRACE_S)
        self.channel.stdin.reset(state.input_received, state.input_taken)
        self.state.run()
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
        self.state.run()

    def on_start_failed(self, stage: str, message: str) -> None:
        """The command could not start: the error the Exec call gets depends on why (:func:`start_error`)."""
        self._fail_start(start_error(stage, cut_text(message, MAX_MESSAGE_CHARS)))

    def on_output(self, stream: str, offset: int, data: bytes) -> None:
        """Output for callers; output past what the agent was allowed to send fails the session."""
        if offset + len(data) > self.flow.granted:
            self.on_broken(
                f"the workspace's agent sent output up to offset {offset + len(data)},"
                f" past the {self.flow.granted} it was allowed"
            )
            return
        try:
            self.output.add_output(stream, offset, data)
        except ProtocolError as exc:
            self.on_broken(f"the workspace's agent sent a bad frame: {exc.message}")

    def on_dropped(self, offset: int, total: int) -> None:
        """Output the agent could not keep."""
        self.output.add_gap(offset, total)

    def on_exited(self, report: ExitReport) -> None:
        """The command ended (callers get it once its output is delivered)."""
        self.state.report(
            report, memory_limit_bytes=self.context.memory_limit_bytes, trimmed_bytes=self.output.trimmed_bytes
        )
        self.output.set_end(report.end)

    def on_broken(self, message: str) -> None:
        """The agent refused this session's frames or sent bad ones: the session fails."""
        self._fail(message)

    def on_disconnect(self) -> None:
        """The link broke: what was in flight is sent again once it is back."""
        self.flow.lost()

    def on_reconnect(self, state: SessionState | None) -> None:
        """The link is back: go on from the acknowledgement, or fail if the agent lost the command."""
        if state is None:
            if self.state.started.done() and not self.output.complete:
                self._fail("the workspace's agent restarted while the command ran; the command and its output are lost")
            return
        self.output.rewind(state.ack)
        self.state.count_trimmed(self.output.trimmed_bytes)
        if state.exit is not None and self.exit is None:
            self.on_exited(state.exit)
        self.stream.schedule_pull()

    # -- flow control ------------------------------------------------------------------------------
    @property
    def agent_tails(self) -> bool:
        """Whether the agent answers tail pulls (its welcome lists ``tail``)."""
        return self._agent_says("tail")

    @property
    def agent_resumes(self) -> bool:
        """Whether the agent sends again on request and keeps a broken reader's back-pressure."""
        return self._agent_says("resume")

    @property
    def held_bytes(self) -> int:
        """Output bytes the daemon holds for this session's callers now."""
        return self.output.held_bytes

    def give_back_output(self) -> int:
        """Let the output held for callers go, when none streams it; return the bytes freed.

        The agent sends it again when a caller streams it (it keeps every byte it was not told
        to forget). Nothing goes while a caller reads, or with an agent that cannot send again.
        """
        if self.stream.reading or not self.agent_resumes:
            return 0
        freed = self.output.give_back(self.flow.acked)
        if freed:
            self.state.count_trimmed(self.output.trimmed_bytes)  # a trim not yet told is undone
            log.debug("process.output_given_back", process_id=self.process_id, freed_bytes=freed)
        return freed

    def on_tail(self, end: int) -> None:
        """Where the agent's held output ends, asked when the last caller left: more than the session keeps is cut."""
        dropped = self.output.trim(end)
        self.state.count_trimmed(self.output.trimmed_bytes)
        if dropped:
            log.info("process.output_trimmed", process_id=self.process_id, dropped_bytes=dropped)

    # -- ending --------------------------------------------------------------------------------
    def _fail_start(self, error: SandboxdError) -> None:
        self.state.fail_start(error)
        self.output.close()

    def _fail(self, message: str) -> None:
        """End the session without an exit report from the agent."""
        self.state.fail(message, dropped_bytes=self.output.dropped_bytes)
        self.output.close()

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
        if data and self.stdin_closed and self.running:
            # Written past the end of input, it would be dropped without a word.
            msg = f"process {self.process_id} cannot take input any more: its stdin is closed"
            raise FailedPreconditionError(msg)
        self.last_used = time.monotonic()
        ok = not data or await self._deliver(lambda channel: channel.write(data, going=lambda: self.running))
        if close and ok:
            ok = await self._deliver(lambda channel: channel.close_input())
            self.stdin_closed = self.stdin_closed or (ok and not self.spec.tty)
        if not ok and self.running:
            msg = f"process {self.process_id} cannot take input any more"
            raise FailedPreconditionError(msg)

    def _agent_says(self, feature: str) -> bool:
        """Whether the agent's welcome lists ``feature``."""
        welcome = self.link.welcome
        return welcome is not None and feature in welcome.features

    async def interrupt(self) -> None:
        """Ctrl-C, as :func:`interrupt_plan` chooses for the container's OS.

        POSIX: SIGINT to the command's process group, or ETX (0x03) written to the
        terminal in tty mode so the line discipline delivers it. Windows: a tree
        kill. Never escalates by itself: a command that catches SIGINT
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
                self.state.ctrl_c_delivered |= delivered
            case InterruptPlan.PROCESS_GROUP:
                sent = await self._deliver(lambda channel: channel.signal(int(signal.SIGINT), interrupt=True))
                self.state.ctrl_c_delivered |= sent
            case InterruptPlan.TREE_KILL:
                # A tree kill always ends the command: its death is the interrupt, whatever its code.
                self.state.requested.add(StopReason.INTERRUPTED)
                await self._deliver(lambda channel: channel.kill(0.0))

    async def abandon(self) -> None:
        """Ctrl-C a command whose starting call left before it streamed (a cancel).

        If it still runs ``kill_grace_s`` later and no call has streamed it since, its whole
        tree is ended (stop reason ``interrupted``): its caller may never have received the
        process id, so nobody else could stop a command that outlives its Ctrl-C (one that
        catches SIGINT, or a child of the command's that a shell took it for).
        """
        await self.interrupt()
        if self.running:
            self._spawn(self._end_unseen(self.stream.calls))

    async def _end_unseen(self, calls: int) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.settings.kill_grace_s):
                await self.state.exited.wait()
        if self.running and self.stream.calls == calls and not self.shutting_down:
            log.info("process.abandoned", process_id=self.process_id, workspace_id=self.context.workspace_id)
            await self.kill(reason=StopReason.INTERRUPTED)

    async def input(
        self,
        *,
        chars: str = "",
        data: bytes = b"",
        close_stdin: bool = False,
        yield_after_s: float | None = None,
        resume_from: int | None = None,
    ) -> AsyncIterator[ExecEvent]:
        """One Input call: write (or Ctrl-C), then stream what the command prints next.

        ``chars`` equal to :data:`CTRL_C` alone is Ctrl-C (:meth:`interrupt`); ``data`` is raw
        bytes, never read as Ctrl-C. The window is :func:`input_window`'s. ``resume_from`` is
        the output position the caller goes on from (``OutputRelay.resume_at``).

        Yields:
            As :meth:`events`: output, then exactly one ``ExitStatus`` or ``Yielded``, last.

        Raises:
            InvalidSpecError: more than ``MAX_INPUT_BYTES`` to write.
            FailedPreconditionError: the command can no longer take input.
        """
        if resume_from is not None and resume_from > self.output.reach:
            # No caller was given a byte that does not exist yet: a forged position would make
            # this process's output vanish for every caller.
            msg = f"resume_from {resume_from} is past the output of {self.process_id} ({self.output.reach} so far)"
            raise InvalidSpecError(msg)
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
        async for event in self.stream.events(yield_after_s=window, resume_from=resume_from):
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
        """SIGTERM everything the command started, wait ``grace_s``, then SIGKILL.

        An exited command's leftovers (``server &``) are killed at once.

        Returns:
            The final status; its ``signal`` says which signal ended the command.
        """
        self.last_used = time.monotonic()
        grace = self.settings.kill_grace_s if grace_s is None else grace_s
        if self.running:
            self.state.requested.add(reason)
            if await self._deliver(lambda channel: channel.kill(grace)):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(grace + 10.0):
                        await self.state.exited.wait()
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
    def exec_events(self, started: ExecStarted) -> AsyncGenerator[ExecEvent, None]:
        """The stream of the Exec call that started the command (:meth:`ProcessTable.start`).

        Its window is the spec's ``yield_after_s``, clamped (:func:`clamp_yield`).

        Yields:
            ``started`` first, then as :meth:`events`: output, then exactly one ``ExitStatus``
            or ``Yielded``, last. A caller that leaves before the last is handled as
            :meth:`OutputStream.caller_left <sandboxd.processes.stream.OutputStream.caller_left>` says.
        """
        window = clamp_yield(self.spec.yield_after_s, self.timeout_s)
        return self.stream.events(yield_after_s=window, started=started)

    def events(self, *, yield_after_s: float) -> AsyncGenerator[ExecEvent, None]:
        """One call's stream: output, then exactly one ``ExitStatus`` or ``Yielded``, always last.

        See :meth:`OutputStream.events <sandboxd.processes.stream.OutputStream.events>`.
        """
        return self.stream.events(yield_after_s=yield_after_s)

    async def close(self, reason: str = "") -> None:
        """Stop following the command (it may keep running in the agent) and let its channel go.

        A session still running is finished as ``failed`` with ``reason``, so that any
        call streaming it ends at once instead of waiting on output that will never come.
        """
        if self.exit is None and self.state.started.done():
            self._fail(reason or "the daemon stopped following this command")
        elif not self.state.started.done():
            self._fail_start(FailedPreconditionError(reason or "the daemon stopped following this command"))
        self.output.close()
        self.state.count_trimmed(self.output.trimmed_bytes)  # output that will never come is dropped
        if not self.stream.reading:
            self.output.forget()  # out of the table for good: no call will take it
        if self.channel is not None:
            self.channel.close()
