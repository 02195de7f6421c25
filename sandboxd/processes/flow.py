"""Flow control of one session's output: how far the agent may send, what it may forget, and when to say so.

The agent numbers a session's output bytes and sends them up to a limit (``until``) the
daemon sets, keeping each byte until the daemon acknowledges it (``ack``). An
:class:`OutputFlow` decides every ``P`` (pull) frame of a session: the window while a
caller reads, the acknowledgement, whether a change is worth a frame, and when the last
reader left with more in flight than the session keeps (a tail pull, which lets the daemon
cut the output to its head). It does no I/O and reads no clock: the session gives it the
relay's offsets and sends what it returns. An :class:`OutputBudget` bounds what the daemon
holds across every session: reading callers share it as windows, and the output held for
sessions nobody streams goes back to their agents past it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import weakref
from typing import Protocol

import structlog

from .. import metrics

__all__ = [
    "ACK_STEP_BYTES",
    "MIN_SHARE_BYTES",
    "REPLAY_BYTES",
    "STREAM_WINDOW_BYTES",
    "WINDOW_BYTES",
    "OutputBudget",
    "OutputFlow",
    "Pull",
]

log = structlog.get_logger("sandboxd.processes")

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

REPLAY_BYTES = 8 * 1024 * 1024
"""Output a caller has been sent that the agent keeps while the caller reads: bytes still on their
way to it when its stream broke (a daemon killed, a connection dropped) come again from the agent
when it resumes (``InputRequest.resume_from``). Several times what gRPC keeps in flight on a
stream (without it, up to 1.7 MB were lost at a SIGKILL here). Once the caller's call ends (its
last event sent), all it was sent is acknowledged: a session nobody reads keeps its whole buffer
for unread output. None is kept where secrets are masked (``OutputFlow.next(replay=False)``)."""

ACK_STEP_BYTES = 256 * 1024
"""Delivered bytes that make a new acknowledgement worth a frame (the end of a batch always does)."""

MIN_SHARE_BYTES = 256 * 1024
"""The least window a reading caller gets however many read at once: every stream moves."""


class Holder(Protocol):
    """A session whose output the daemon may hold (``ProcessSession``)."""

    @property
    def held_bytes(self) -> int:
        """Output bytes held for its callers now."""
        ...

    def give_back_output(self) -> int:
        """Let its held output go to its agent, which sends it again when a caller streams it; the bytes freed."""
        ...


class OutputBudget:
    """The daemon's budget for the command output it holds, shared by every session.

    Output is held between the agents and the calls streaming it, and for sessions nobody
    streams. Callers reading at once share the budget as their windows (each is let at least
    :data:`MIN_SHARE_BYTES` ahead of what it has taken); past the budget, the output held for
    sessions nobody streams goes back to their agents, the largest first, until three
    quarters of it are used: each agent keeps every byte it was not told to forget and sends
    it again when a caller streams it. Nothing is refused or dropped for it.

    It is each relay's meter (``held_changed``).

    Args:
        limit_bytes: the budget, in bytes.
    """

    def __init__(self, limit_bytes: int) -> None:
        """Start with nothing held and nobody reading."""
        self.limit = limit_bytes
        self.held = 0
        """Output bytes held now, across every session."""
        self._readers: weakref.WeakSet[object] = weakref.WeakSet()
        self._holders: weakref.WeakSet[Holder] = weakref.WeakSet()
        self._relief: asyncio.Handle | None = None

    def track(self, holder: Holder) -> None:
        """Count ``holder`` among the sessions whose held output may go back to their agents."""
        self._holders.add(holder)

    def reading(self, reader: object, now: bool) -> None:
        """Whether ``reader`` (a session's stream) has a caller reading now."""
        if now:
            self._readers.add(reader)
        else:
            self._readers.discard(reader)
            self._check()  # what it holds may go back now

    def share(self) -> int:
        """The window of one reading caller: the budget over the callers reading, at least :data:`MIN_SHARE_BYTES`."""
        return max(MIN_SHARE_BYTES, self.limit // max(1, len(self._readers)))

    def held_changed(self, delta: int) -> None:
        """A relay holds ``delta`` bytes more (less, when negative); past the budget, relief follows."""
        self.held += delta
        self._check()

    def _check(self) -> None:
        if self.held > self.limit and self._relief is None:
            self._relief = asyncio.get_running_loop().call_soon(self._relieve)

    def _relieve(self) -> None:
        self._relief = None
        target = self.limit * 3 // 4
        for holder in sorted(self._holders, key=lambda h: h.held_bytes, reverse=True):
            if self.held <= target or not holder.held_bytes:
                break
            freed = holder.give_back_output()
            if freed:
                metrics.OUTPUT_GIVEN_BACK_BYTES.inc(freed)
        if self.held > self.limit:
            log.info("process.output_budget_full", held_bytes=self.held, budget_bytes=self.limit)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Pull:
    """One pull frame's content (PROTOCOL.md, ``P``); offsets count both streams' bytes together."""

    ack: int
    """Output offset up to which callers took the output: the agent may forget what lies before it."""
    ack_gap: int
    """How much of a gap at ``ack`` callers were told of."""
    until: int
    """Offset up to which the agent may send."""
    reader: bool
    """Whether a caller is reading now."""
    tail: bool = False
    """Ask the agent where its held output ends (its answer is ``on_tail``)."""
    resend: bool = False
    """Ask the agent to send again from ``ack`` (a caller resumed behind what it was sent)."""


class OutputFlow:
    """The window, acknowledgement and pull state of one session's output.

    Args:
        buffer_bytes: output the session keeps for callers, in bytes (its ``max_output_bytes``
            or the daemon's default); at least 1.
    """

    def __init__(self, *, buffer_bytes: int, budget: OutputBudget | None = None) -> None:
        """Start with nothing said to the agent; a reader's window is within ``budget``'s share."""
        self.buffer_bytes = buffer_bytes
        self.budget = budget
        self.ack_step = max(1, min(ACK_STEP_BYTES, buffer_bytes // 4))
        """Progress, in bytes, worth a frame: an acknowledgement frees the agent's buffer, so a
        small buffer needs them often."""
        self._sent: Pull | None = None
        """The last pull the agent was sent on this connection (None: nothing it is known to have)."""
        self.acked = 0
        """Where the agent was last told it may forget the output (or told so at a restart)."""
        self.granted = 0
        """The furthest ``until`` the agent was ever allowed. It sends nothing beyond the latest
        (PROTOCOL.md, Output), so output past this is no agent of ours: the daemon keeps no more
        than it granted, whatever comes."""

    def window(self, *, tails: bool) -> int:
        """Bytes the agent may send beyond callers' take while one reads (see ``STREAM_WINDOW_BYTES``).

        Within the budget's share of each reading caller.

        Args:
            tails: the agent answers tail pulls (its welcome lists ``tail``).
        """
        window = max(STREAM_WINDOW_BYTES, self.buffer_bytes) if tails else min(WINDOW_BYTES, self.buffer_bytes)
        return window if self.budget is None else min(window, self.budget.share())

    def next(
        self,
        *,
        ack: int,
        ack_gap: int,
        delivered: int,
        received: int,
        reader: bool,
        tails: bool,
        force: bool = False,
        resend: bool = False,
        replay: bool = True,
    ) -> Pull | None:
        """The pull to send now, or None when nothing is worth a frame; a pull returned counts as sent.

        Args:
            ack: the offset that may be acknowledged (``OutputRelay.ack_position``).
            ack_gap: the gap at ``ack`` callers were told of.
            delivered: the offset up to which callers took the output.
            received: the offset of the next byte expected from the agent.
            reader: whether a caller is reading now.
            tails: the agent answers tail pulls.
            force: send even a pull that changes little (a caller arrives or leaves).
            resend: ask the agent to send again from the acknowledgement (implies ``force``).
            replay: keep ``REPLAY_BYTES`` for a replay while a caller reads. Off where secrets
                are masked: an acknowledgement there must fall where the masking held nothing
                (a daemon that takes the session over starts its masking at it).

        Returns:
            While a caller reads, a pull allowing a window beyond ``delivered``; else one allowing
            nothing beyond ``received``. It asks for the tail when the last reader just left with
            more allowed in flight than the session keeps (the caller then holds the output back
            to ``buffer_bytes`` beyond ``delivered`` until the answer, ``OutputRelay.hold``).
        """
        if reader and replay:
            # Kept while a caller reads: what is still on its way to it comes again if its stream breaks.
            kept = max(delivered - REPLAY_BYTES, self.acked)
            if kept < ack:
                ack, ack_gap = kept, 0
        until = delivered + self.window(tails=tails) if reader else received
        last = self._sent
        if (
            not force
            and not resend
            and last is not None
            and reader == last.reader
            and ack - last.ack < self.ack_step
            and until - last.until < self.ack_step
        ):
            return None  # nothing worth a frame: the agent has room enough, and little to forget
        # The last reader leaves with more allowed in flight than the session keeps: ask where
        # the agent's held output ends, to cut it to its head.
        tail = not reader and last is not None and last.reader and last.until - delivered > self.buffer_bytes and tails
        self._sent = Pull(ack=ack, ack_gap=ack_gap, until=until, reader=reader, tail=tail, resend=resend)
        self.acked = max(self.acked, ack)
        self.granted = max(self.granted, until)
        return self._sent

    def lost(self) -> None:
        """The connection broke: what was in flight is lost, so the next pull is sent whatever it says."""
        self._sent = None
