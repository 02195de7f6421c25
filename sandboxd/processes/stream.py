"""A session's output on its way to calls: who reads it, what the agent is told, and each call's stream.

One call streams a session's output at a time; the Exec call that started the command
holds it from the start. Every call's stream ends with exactly one terminal event, and a
call that leaves before it is a cancel: :meth:`OutputStream.caller_left` is the one place
that says what that does to the command.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator
from typing import Protocol

from ..agent import SessionChannel
from ..errors import SandboxdError
from ..models import ExecEvent, ExecStarted, ExitStatus, Heartbeat, Yielded
from ..relay import OutputRelay
from .flow import OutputBudget, OutputFlow

__all__ = ["Command", "OutputStream"]


class Command(Protocol):
    """What an :class:`OutputStream` needs of its session (``ProcessSession`` is the one)."""

    process_id: str
    channel: SessionChannel | None
    last_used: float
    """When a call last used the session (``time.monotonic()``): eviction takes the oldest."""
    shutting_down: bool
    yield_now: bool

    @property
    def exit(self) -> ExitStatus | None:
        """The terminal status, once known."""
        ...

    @property
    def running(self) -> bool:
        """Whether the command still runs."""
        ...

    @property
    def elapsed_s(self) -> float:
        """Seconds since the command started."""
        ...

    @property
    def agent_tails(self) -> bool:
        """Whether the agent answers tail pulls."""
        ...

    @property
    def agent_resumes(self) -> bool:
        """Whether the agent sends again on request and keeps a broken reader's back-pressure (``resume``)."""
        ...

    async def interrupt(self) -> None:
        """Ctrl-C the command."""
        ...

    async def abandon(self) -> None:
        """Ctrl-C a command nobody streamed, and end it if it survives that unseen."""
        ...


class OutputStream:
    """The readers of one session's output, the pulls that tell the agent about them, and their streams.

    Args:
        command: the session.
        output: its output relay.
        flow: its flow control.
        heartbeat_interval_s: seconds without an event after which a stream sends a ``Heartbeat``.
        background: where tasks the stream starts are kept (the table cancels them at close).
        budget: the daemon's budget for held output: told who reads now.
    """

    def __init__(
        self,
        command: Command,
        *,
        output: OutputRelay,
        flow: OutputFlow,
        heartbeat_interval_s: float,
        background: set[asyncio.Task[None]],
        budget: OutputBudget | None = None,
    ) -> None:
        """Begin held by the call that starts the command."""
        self._command = command
        self._output = output
        self._flow = flow
        self._budget = budget
        self._heartbeat_interval_s = heartbeat_interval_s
        self._background = background
        self._pulling: asyncio.Task[None] | None = None
        self.attached = 1
        """Calls streaming this output; the Exec call that starts it counts from the start."""
        if budget is not None:
            budget.reading(self, True)
        self.fresh = True
        """Not yet streamed to its caller: never evicted in that state (it would kill a command
        whose Exec call has not even attached)."""
        self.calls = 0
        """Calls that have streamed (or polled) this session's output."""
        self.awaited_until = 0.0
        """Until when (``time.monotonic()``) a caller that was reading before a daemon restart is
        waited for: the agent keeps its back-pressure meanwhile (a reader, to the pulls)."""
        self.resumable_until = 0.0
        """Until when (``time.monotonic()``) a session taken over after a restart is kept from
        eviction but as a last resort: its caller may be coming back to resume it."""

    def _readers_changed(self) -> None:
        if self._budget is not None:
            self._budget.reading(self, self.attached > 0)
        if self.attached == 0 and self._output.closed:
            self._output.forget()  # the session was let go: no call will take what is left

    @property
    def detached(self) -> bool:
        """Whether no call is attached and the first call has had its stream (eviction may pick it)."""
        return self.attached == 0 and not self.fresh

    @property
    def idle(self) -> bool:
        """Detached, and not taken over from a restart moments ago (eviction picks these first).

        A session the last daemon left may have a caller coming back to resume it (the agent
        cannot say whose exit was delivered): evicting an exited one meanwhile would lose its
        last output and its exit, so it goes only when nothing else can.
        """
        return self.detached and time.monotonic() >= max(self.awaited_until, self.resumable_until)

    def adopted(self, *, reading: bool, grace_s: float) -> None:
        """A session taken over after a restart: no call holds it.

        Args:
            reading: a caller was reading it when the last daemon went: it is waited for
                ``grace_s`` seconds, the output held back for it rather than dropped.
            grace_s: how long, in seconds; every adopted session is kept from eviction that
                long but as a last resort (:attr:`idle`).
        """
        self.attached, self.fresh = 0, False
        self.resumable_until = time.monotonic() + grace_s
        self._readers_changed()
        if reading:
            self.awaited_until = time.monotonic() + grace_s
            task = asyncio.create_task(self._stop_awaiting(grace_s))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _stop_awaiting(self, grace_s: float) -> None:
        await asyncio.sleep(grace_s)
        if self.attached == 0:
            await self.pull(force=True)  # nobody came: the agent keeps a head, as with no reader

    @property
    def reading(self) -> bool:
        """Whether a caller streams the output now, or one that did is waited for."""
        return self.attached > 0 or time.monotonic() < self.awaited_until

    def release(self) -> None:
        """The first call is done with the session: from now on it may be evicted when idle."""
        if self.fresh:
            self.fresh = False
            self.attached -= 1  # the starting call's reservation
            self._readers_changed()
            self.schedule_pull()

    def schedule_pull(self) -> None:
        """Tell the agent the position soon, in a task of its own (one at a time)."""
        if self._pulling is None or self._pulling.done():
            self._pulling = asyncio.create_task(self.pull())
            self._background.add(self._pulling)
            self._pulling.add_done_callback(self._background.discard)

    async def pull(self, *, force: bool = False, resend: bool = False) -> None:
        """Tell the agent what callers took and how much more may come (when worth a frame, or ``force``).

        With ``resend`` the agent sends again from its acknowledgement (a caller resumed behind it).
        """
        channel = self._command.channel
        if channel is None:
            return
        output = self._output
        ack, ack_gap = output.ack_position()
        pull = self._flow.next(
            ack=ack,
            ack_gap=ack_gap,
            delivered=output.delivered,
            received=output.received,
            reader=self.reading,
            tails=self._command.agent_tails,
            force=force,
            resend=resend,
            replay=not output.masking,
        )
        if pull is None:
            return
        if pull.tail:
            output.hold(self._flow.buffer_bytes)
        try:
            await channel.pull(
                ack=pull.ack,
                ack_gap=pull.ack_gap,
                until=pull.until,
                reader=pull.reader,
                tail=pull.tail,
                resend=pull.resend,
            )
        except SandboxdError:
            if pull.tail:
                output.release()

    def _attach(self) -> None:
        """A call begins streaming (the call that started the command was counted from the start)."""
        if not self.fresh:
            self.attached += 1
        self.fresh = False
        self._readers_changed()
        self.awaited_until = 0.0  # whoever was waited for after a restart: a caller is here

    def _bystander_end(self) -> ExitStatus | Yielded:
        """The one event of a call that may not stream: the exit once all output is out, else yielded."""
        command = self._command
        if self._output.complete and command.exit is not None:
            return command.exit
        return Yielded(process_id=command.process_id, elapsed_s=command.elapsed_s)

    async def events(
        self, *, yield_after_s: float, started: ExecStarted | None = None, resume_from: int | None = None
    ) -> AsyncGenerator[ExecEvent, None]:
        """Stream output, then exactly one ``ExitStatus`` or ``Yielded``, always last.

        Returns as soon as the command exits; never sits out the window. Emits a
        ``Heartbeat`` after ``heartbeat_interval_s`` without any event. If the
        caller goes away before the terminal event, :meth:`caller_left` decides
        what that means for the command. While one call streams the output,
        another gets only a terminal event at once: output is never split
        between two readers.

        Args:
            yield_after_s: the call's window, in seconds (already clamped).
            started: for the Exec call that started the command: yielded first.
            resume_from: the output position the caller goes on from (``OutputRelay.resume_at``);
                None: from what was last delivered.
        """
        if started is not None:
            streamed = False
            try:
                yield started
                streamed = True
            finally:
                if not streamed:
                    await self.caller_left(streamed=False)
        output, command = self._output, self._command
        self.calls += 1
        if self.attached and not self.fresh:
            # Another call is streaming this output; this one only delivered its input.
            yield self._bystander_end()
            return
        self._attach()
        if resume_from is not None:
            output.resume_at(resume_from, self._flow.acked, resendable=command.agent_resumes)
        # Sent again from the acknowledgement: bytes lost behind a resumed caller, or output the
        # budget gave back to the agent while nobody streamed it.
        resend, output.resend = output.resend, False
        await self.pull(force=True, resend=resend)
        finished = left = False

        async def leave() -> None:
            # Acknowledged before the caller hears its terminal event: a daemon killed right
            # after it has told the agent all the caller took (none of it comes again).
            nonlocal left
            if not left:
                left = True
                self.attached -= 1
                self._readers_changed()
                command.last_used = time.monotonic()
                await asyncio.shield(self.pull(force=True))

        try:
            deadline = time.monotonic() + yield_after_s
            last_event = time.monotonic()
            while True:
                batch = output.take()
                for event, through in batch:
                    yield dataclasses.replace(event, position=output.position_after(through))
                    output.delivered_through(through)
                    last_event = time.monotonic()
                if batch:
                    await self.pull()
                if output.complete and not output.pending and command.exit is not None:
                    finished = True
                    await leave()
                    yield command.exit
                    return
                now = time.monotonic()
                if now >= deadline or command.yield_now:
                    finished = True
                    await leave()
                    yield Yielded(process_id=command.process_id, elapsed_s=command.elapsed_s)
                    return
                beat_at = last_event + self._heartbeat_interval_s
                if now >= beat_at:
                    yield Heartbeat(elapsed_s=command.elapsed_s)
                    last_event = now
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(deadline, beat_at) - now):
                        await output.changed.wait()
        finally:
            await leave()
            if not finished:
                await self.caller_left(streamed=True)

    async def caller_left(self, *, streamed: bool) -> None:
        """A call left before its terminal event: that is a cancel, so Ctrl-C.

        The one place of this rule. A daemon that stops leaves its commands alone (its drain
        ended the call; the next daemon adopts them). A caller that left right after
        ``started``, before any output streamed, may never have had the process id, so a
        command that survives its Ctrl-C unseen is ended too (``abandon``).

        Args:
            streamed: the call streamed output (False: it left at ``started``).
        """
        command = self._command
        if not streamed:
            self.release()
        if not command.running or command.shutting_down:
            return
        await asyncio.shield(command.interrupt() if streamed else command.abandon())
