"""A process session's output on its way from the agent to callers: in order, masked, each byte once.

The agent numbers a session's output bytes (both streams together) and keeps them
until the daemon acknowledges them. An :class:`OutputRelay` holds what arrived and
callers have not taken, masks secrets on the way (a secret split across chunks
is held back until it can be told apart), and says which offset may be
acknowledged: never a byte the masking still holds, so a reconnect or a daemon
restart resends exactly what no caller has seen.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

from sandboxd_protocol.redact import StreamRedactor

from .agent import ProtocolError
from .models import OutputChunk, OutputDropped

__all__ = ["MAX_CHUNK_BYTES", "Meter", "OutputRelay", "Piece", "partial_character"]

MAX_CHUNK_BYTES = 1024 * 1024
"""Largest output chunk sent as one event; adjacent chunks of a stream are merged up to it."""


def partial_character(data: bytes) -> int:
    """How many bytes at the end of ``data`` are the start of a UTF-8 character cut short (0 to 3).

    Bytes that are not UTF-8 have none: a cut after them is as good as any.
    """
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the last lead byte (or ASCII)
            needed = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
            return back if needed > back else 0
    return 0


@dataclasses.dataclass
class Piece:
    """An event on its way to callers, with the agent's offset it accounts for."""

    event: OutputChunk | OutputDropped
    raw_end: int
    """Every output byte before this offset is accounted for once this piece is delivered."""
    gap: int = 0
    """For a gap: its whole size at ``raw_end`` (acknowledged with it)."""
    start: int = -1
    """For a chunk that is the agent's bytes one for one (nothing masked, nothing held back
    around it): the offset of its first byte; else -1 (it cannot be cut by offset)."""


_Pieces = collections.deque[Piece]


def _bytes(pieces: Iterable[Piece]) -> int:
    """The output bytes ``pieces`` hold (a gap holds none)."""
    return sum(len(p.event.data) for p in pieces if isinstance(p.event, OutputChunk))


class Meter(Protocol):
    """Where a relay reports how many output bytes it holds (the daemon's budget sums them)."""

    def held_changed(self, delta: int) -> None:
        """The relay holds ``delta`` bytes more (less, when negative)."""


def _cut(piece: Piece, event: OutputChunk, at: int) -> tuple[Piece, Piece]:
    """An unmasked ``piece`` (``event``: the agent's bytes one for one from ``piece.start``) cut at offset ``at``."""
    size = at - piece.start
    return (
        Piece(dataclasses.replace(event, data=event.data[:size]), raw_end=at, start=piece.start),
        Piece(dataclasses.replace(event, data=event.data[size:]), raw_end=piece.raw_end, start=at),
    )


def _split(pieces: _Pieces, cut: int, limit: int) -> tuple[_Pieces, _Pieces, int]:
    """``pieces`` (from offset ``cut`` on) as a head ending at ``limit`` at most, the rest, and the head's end.

    A piece of unmasked bytes across ``limit`` is split there, and the head gives the rest
    the start of a character it would cut short (across pieces of one stream).
    """
    start = cut
    head: _Pieces = collections.deque()
    rest = collections.deque(pieces)
    while rest and rest[0].raw_end <= limit:
        head.append(piece := rest.popleft())
        cut = max(cut, piece.raw_end)
    first = rest[0] if rest else None
    event = first.event if first is not None else None
    if first is not None and isinstance(event, OutputChunk) and first.start >= 0 and limit > first.start:
        fits, rest[0] = _cut(first, event, limit)  # the head takes what fits of the agent's bytes
        head.append(fits)
        cut = limit
    tail, stream = b"", head[-1].event.stream if head and isinstance(head[-1].event, OutputChunk) else ""
    for piece in reversed(head):
        last = piece.event
        if not isinstance(last, OutputChunk) or last.stream != stream or len(tail) >= 4:
            break
        tail = last.data + tail
    partial = partial_character(tail[-4:])
    while partial and head and isinstance(last := head[-1].event, OutputChunk):
        piece = head.pop()
        if len(last.data) <= partial:
            rest.appendleft(piece)
            partial -= len(last.data)
            cut = head[-1].raw_end if head else start
            continue
        end = piece.raw_end - partial
        head.append(Piece(OutputChunk(stream=last.stream, data=last.data[:-partial]), raw_end=end, start=piece.start))
        rest.appendleft(
            Piece(
                OutputChunk(stream=last.stream, data=last.data[-partial:]),
                raw_end=piece.raw_end,
                start=end if piece.start >= 0 else -1,
            )
        )
        cut, partial = piece.raw_end - partial, 0
    return head, rest, cut


class OutputRelay:
    """The output of one session between the agent and its callers.

    Args:
        redactors: one secret masker per stream (``stdout``, ``stderr``).
    """

    def __init__(self, redactors: Mapping[str, StreamRedactor[bytes]], *, meter: Meter | None = None) -> None:
        """Start at offset 0 with nothing held; ``meter`` is told how many bytes it holds."""
        self._meter = meter
        self.held_bytes = 0
        """Output bytes here that callers have not taken (what :meth:`give_back` frees)."""
        self._awaiting_resend = False
        """The agent was asked to send again from the acknowledgement: frames it sent before it
        read that ask come first, beyond what is here, and are let go until the first sent again."""
        self._redactors = dict(redactors)
        self._pieces: collections.deque[Piece] = collections.deque()
        self.changed = asyncio.Event()
        """Set when there is something new for callers."""
        self.received = 0
        """Offset of the next output byte expected from the agent."""
        self.delivered = 0
        """Offset up to which callers have taken the output."""
        self.delivered_gap = 0
        """How much of a gap at ``delivered`` callers were told of."""
        self._gap_at = -1
        self._gap_seen = 0
        self._held_from: dict[str, int | None] = dict.fromkeys(self._redactors)
        """Where each stream's bytes held back by the masking begin (not acknowledgeable yet)."""
        self.end: int | None = None
        """Offset just past the command's last byte, once it exited."""
        self.complete = False
        """All output up to the end has arrived (or never will): the exit may go to callers."""
        self.dropped_bytes = 0
        self.trimmed_bytes = 0
        """Of ``dropped_bytes``, those the daemon dropped: a :meth:`trim`, or output that never came
        before a :meth:`close` (the agent's own gaps are in its exit report)."""
        self._trim: tuple[int, int] | None = None
        """A trim callers have not taken yet: ``(end, bytes)``."""
        self._holding: tuple[int, int] | None = None
        """While :meth:`hold` keeps the rest back: where the head ends so far, and where it must end."""
        self._held_back: collections.deque[Piece] = collections.deque()
        self._hold_next: int | None = None
        """A hold asked for while one waits for its answer: it begins when that one is settled."""
        self._closed = False
        self.resend = False
        """Set by :meth:`resume_at` when the agent must send again from its acknowledgement."""
        self.produced = 0
        """Where the agent said its output ended when this relay took it over (:meth:`resume`)."""
        self._skip_to = 0
        """Output before this position is a resumed caller's already: its events are not sent again."""

    def resume(self, ack: int, ack_gap: int, end: int = 0) -> None:
        """Go on from the agent's acknowledged position (a session taken over after a restart).

        ``end`` is where the agent's output ended when it said so: no caller can be past it.
        """
        self.received = self.delivered = ack
        self.delivered_gap = ack_gap
        self.produced = max(ack, end)

    @property
    def closed(self) -> bool:
        """Whether no more output will come (:meth:`close`)."""
        return self._closed

    @property
    def masking(self) -> bool:
        """Whether any secret is masked here: an acknowledgement must then fall where the masking held nothing."""
        return any(redactor.active for redactor in self._redactors.values())

    @property
    def reach(self) -> int:
        """The furthest output position a caller can have been given: past it, no byte exists yet."""
        return max(self.received, self.produced)

    def add_output(self, stream: str, offset: int, data: bytes) -> None:
        """Output from the agent at ``offset``.

        Raises:
            ProtocolError: bytes beyond the next expected offset (a gap nobody reported).
        """
        if offset + len(data) <= self.received:
            return  # sent again after a reconnect: callers have it already
        if offset > self.received:
            if self._awaiting_resend:
                return  # sent before the agent read the ask to send again: it comes again after
            msg = f"output at offset {offset}, expected {self.received}"
            raise ProtocolError(msg)
        self._awaiting_resend = False  # what was sent again has begun: nothing stale comes after it
        data = data[self.received - offset :]
        self.received += len(data)
        redactor = self._redactors[stream]
        held_before = self._held_from[stream] is not None
        masked = redactor.feed(data)
        self._held_from[stream] = self.received - redactor.held if redactor.held else None
        if masked:
            # Bytes the masking holds back are not in this chunk: delivering it does not cover them.
            exact = not held_before and not redactor.held and len(masked) == len(data)
            start = self.received - len(data) if exact else -1
            self._append(
                Piece(OutputChunk(stream=stream, data=masked), raw_end=self.received - redactor.held, start=start)
            )
        self._check_complete()

    def add_gap(self, offset: int, total: int) -> None:
        """Output the agent dropped at ``offset``: ``total`` bytes there so far (told again as it grows)."""
        if offset != self.received:
            return  # a gap already reported (or not this one's place): nothing new
        seen = 0
        if offset == self._gap_at:
            seen = self._gap_seen  # this gap grew since it was last told
        elif offset == self.delivered:
            seen = self.delivered_gap  # told before a reconnect, and taken
        if total <= seen:
            return
        self._gap_at, self._gap_seen = offset, total
        self.dropped_bytes += total - seen
        self._append(Piece(OutputDropped(dropped_bytes=total - seen), raw_end=offset, gap=total))

    def set_end(self, end: int) -> None:
        """The command exited after ``end`` bytes of output."""
        self.end = end
        self._check_complete()

    def _check_complete(self) -> None:
        """Once all output up to the end is here: the masking's held-back rest goes, then the exit may."""
        if self.complete or self.end is None or self.received < self.end:
            return
        for stream, redactor in self._redactors.items():
            if rest := redactor.flush():
                self._append(Piece(OutputChunk(stream=stream, data=rest), raw_end=self.end))
            self._held_from[stream] = None
        self.complete = True
        self.changed.set()

    def _set_held(self, held: int) -> None:
        if held != self.held_bytes:
            if self._meter is not None:
                self._meter.held_changed(held - self.held_bytes)
            self.held_bytes = held

    def _recount(self) -> None:
        self._set_held(_bytes(self._pieces) + _bytes(self._held_back))

    def _append(self, piece: Piece) -> None:
        if self._skip_to:
            kept = next(self._skipped([piece]), None)
            if kept is None:
                return  # a resumed caller has it (the masking saw it)
            piece = kept
        if isinstance(piece.event, OutputChunk):
            self._set_held(self.held_bytes + len(piece.event.data))
        if self._holding is not None:
            self._held_back.append(piece)  # beyond the head: it waits for the agent's answer
            return
        self._pieces.append(piece)
        self.changed.set()

    def hold(self, keep: int) -> None:
        """The last caller left: what waits beyond its first ``keep`` bytes is held back.

        Until :meth:`trim` is told where the agent's output ends, a caller gets only the head:
        ``keep`` bytes at most from where the caller left, ending on a whole UTF-8 character
        (pieces that masking changed are kept or held back whole). A caller that leaves again
        before the answer gets its own hold once the first is settled (its answer comes next).
        """
        if self._closed:
            return
        if self._holding is not None:
            self._hold_next = keep
            return
        # After a gap of a trim not yet taken, the head begins past it (it is told first).
        base = max(self.delivered, self._trim[0] if self._trim is not None else 0)
        limit = base + keep
        self._pieces, self._held_back, cut = _split(self._pieces, self.delivered, limit)
        self._holding = (cut, limit)

    def trim(self, end: int) -> int:
        """The agent's output held for callers ends at ``end`` (its answer to a tail pull): cut to the head.

        What lies beyond the head, here and still on its way up to ``end``, counts as dropped,
        reported where the head ends like a gap of the agent's own and acknowledged with it:
        a caller that walked away from a fast stream finds at most the head unread (the
        head is kept, the rest counted). When it all fits in the head, what was held back is
        let go to callers. Returns the bytes dropped.
        """
        dropped = self._settle(end)
        if self._hold_next is not None and self._holding is None:
            keep, self._hold_next = self._hold_next, None
            self.hold(keep)
        return dropped

    def _settle(self, end: int) -> int:
        holding, self._holding = self._holding, None
        back, self._held_back = self._held_back, collections.deque()
        if holding is None:
            return 0
        cut, limit = holding
        if self._closed or end <= limit or end < self.received:
            self._pieces.extend(back)  # nothing beyond the head after all (or no answer will come)
            if back:
                self.changed.set()
            return 0
        more, rest, cut = _split(back, cut, limit)
        self._pieces.extend(more)
        for stream, redactor in self._redactors.items():
            # What the masking holds from before the cut is the head's; the rest is in the gap.
            held, start = redactor.flush(), self._held_from[stream]
            if held and start is not None and start < cut:
                kept = held[: cut - start]
                self._pieces.append(Piece(OutputChunk(stream=stream, data=kept), raw_end=start + len(kept)))
        self._held_from = dict.fromkeys(self._redactors)
        # The agent's own gaps in what goes: inside the cut, told with it; at its end, told after it.
        inside = sum(p.event.dropped_bytes for p in rest if isinstance(p.event, OutputDropped) and p.raw_end < end)
        after = [p for p in rest if isinstance(p.event, OutputDropped) and p.raw_end >= end]
        dropped = end - cut
        self._pieces.append(Piece(OutputDropped(dropped_bytes=dropped + inside), raw_end=end))
        self._pieces.extend(after)
        self._gap_at, self._gap_seen = (end, after[-1].gap) if after else (-1, 0)
        self.received = end  # what is still on its way is in the gap: taken as sent again
        self.dropped_bytes += dropped
        self.trimmed_bytes += dropped
        self._trim = (end, dropped)
        self._recount()
        self.changed.set()
        self._check_complete()
        return dropped

    def release(self) -> None:
        """Let go of a hold no answer will come for (the tail pull could not be sent)."""
        self.trim(-1)

    def close(self) -> None:
        """No more output will come: what is here is all callers get.

        Output the command wrote that has not come (its exit said where its output ends, and
        the session is let go before the rest arrived: its workspace deleted, the daemon
        stopping) is a gap of that many bytes, told before the exit: a stream never ends as if
        complete with output missing.
        """
        if self._closed:
            return
        self._closed = True
        self._hold_next = None
        self._settle(-1)  # no answer will come to a hold: what it held back goes too
        if not self.complete and self.end is not None and self.received < self.end:
            missing = self.end - self.received
            self._append(Piece(OutputDropped(dropped_bytes=missing), raw_end=self.end))
            self.received = self.end
            self.dropped_bytes += missing
            self.trimmed_bytes += missing
        self.complete = True
        self.changed.set()

    def rewind(self, ack: int) -> None:
        """A new connection: the agent sends again from its ``ack``; what callers have not taken comes again.

        A trim callers have not taken is undone: the agent sends its bytes again, and they come.
        """
        if self._trim is not None:
            self.dropped_bytes -= self._trim[1]
            self.trimmed_bytes -= self._trim[1]
            self._trim = None
        self._holding, self._held_back, self._hold_next = None, collections.deque(), None
        self._pieces.clear()
        self._set_held(0)
        self.received = max(self.delivered, ack)
        self._gap_at, self._gap_seen = -1, 0
        for redactor in self._redactors.values():
            redactor.flush()  # bytes held back are sent again by the agent
        self._held_from = dict.fromkeys(self._redactors)
        if not self._closed:
            self.complete = False  # the end waits for the output sent again
            self._check_complete()

    def forget(self) -> None:
        """Nobody will take what is here (the session is let go with no caller reading): let it go."""
        self._pieces.clear()
        self._held_back.clear()
        self._set_held(0)

    def give_back(self, acknowledged: int) -> int:
        """Let go of the output held here for callers, none of whom streams it now; return the bytes freed.

        The agent keeps every byte it was not told to forget (from ``acknowledged``, where it was
        last told): it sends them again once :attr:`resend` is asked for, when a caller streams
        this output again. Nothing is let go while a hold waits for the agent's answer, or once
        the session is closed (no more can come).
        """
        if self._closed or self._holding is not None or not self.held_bytes:
            return 0
        freed = self.held_bytes
        self.rewind(acknowledged)
        self.resend = self._awaiting_resend = True
        return freed

    def ack_position(self) -> tuple[int, int]:
        """What may be acknowledged: ``(offset, gap at it)``, short of any byte the masking holds.

        Never past what arrived: a caller that resumed ahead of it (:meth:`resume_at`) has those
        bytes, but the masking must still see them.
        """
        held = [offset for offset in self._held_from.values() if offset is not None]
        ack = min([self.delivered, self.received, *held])
        return ack, self.delivered_gap if ack == self.delivered else 0

    @property
    def pending(self) -> bool:
        """Whether events wait for a caller (or may, once a hold is settled)."""
        return bool(self._pieces) or self._holding is not None

    def take(self) -> list[tuple[OutputChunk | OutputDropped, Piece]]:
        """Everything waiting, adjacent chunks of one stream merged (up to 1 MiB), each with its last piece.

        Fewer, larger messages are what lets a fast producer stream at full speed. Call
        :meth:`delivered_through` with a piece once its event reached the caller.
        """
        pieces = list(self._pieces)
        self._pieces.clear()
        self._set_held(_bytes(self._held_back))
        self.changed.clear()
        merged: list[tuple[OutputChunk | OutputDropped, Piece]] = []
        pending: list[bytes] = []
        size = 0
        stream = ""
        last: Piece | None = None
        for piece in pieces:
            event = piece.event
            if isinstance(event, OutputChunk) and event.stream == stream and size + len(event.data) <= MAX_CHUNK_BYTES:
                pending.append(event.data)
                size += len(event.data)
                last = piece
                continue
            if pending and last is not None:
                merged.append((OutputChunk(stream=stream, data=b"".join(pending)), last))
            pending, size, stream = [], 0, ""
            if isinstance(event, OutputChunk):
                pending, size, stream, last = [event.data], len(event.data), event.stream, piece
            else:
                merged.append((event, piece))
        if pending and last is not None:
            merged.append((OutputChunk(stream=stream, data=b"".join(pending)), last))
        return merged

    def delivered_through(self, piece: Piece) -> None:
        """A caller has everything up to and including ``piece``."""
        if piece.gap:
            self.delivered, self.delivered_gap = piece.raw_end, piece.gap
        elif piece.raw_end > self.delivered:
            self.delivered, self.delivered_gap = piece.raw_end, 0
        if self._trim is not None and self.delivered >= self._trim[0]:
            self._trim = None  # told: it stays dropped whatever comes

    def position_after(self, piece: Piece) -> int:
        """The output position a caller is at once it has ``piece``: every byte before it was delivered.

        Short of any byte the masking still holds back (as :meth:`ack_position`): a stream
        resumed there gets those bytes, and, when a secret's first bytes were held back in one
        stream while the other went on, the other's bytes after them once more.
        """
        held = [offset for offset in self._held_from.values() if offset is not None]
        return min([max(self.delivered, piece.raw_end), *held])

    def resume_at(self, position: int, acknowledged: int, *, resendable: bool = True) -> None:
        """A caller goes on from ``position`` (the last it received): nothing before it comes again.

        Ahead of what this relay delivered (a daemon that took the session over after a restart
        starts from the agent's acknowledgement, which lags behind what its predecessor sent):
        what comes before ``position`` is let go. Behind it (bytes lost in flight on a broken
        stream): the agent sends again from ``acknowledged``, the position it was last told,
        and what callers lost before that is a gap (``OutputDropped``): never silently.

        Every byte still goes through the masking from a position where it held nothing (an
        acknowledgement is always one: :attr:`masking` keeps a reader's replay off): only the
        events are skipped, so a position inside a masked value (forged, or a client's own
        mistake) never shows the value's rest. A masked event across ``position`` comes whole,
        once more.

        Args:
            position: the caller's position (an event's ``position``; 0: nothing received).
            acknowledged: where the agent was last told it may forget the output.
            resendable: the agent can send again (its welcome lists ``resume``); without it,
                what the caller lost behind is a gap.

        Returns:
            Nothing; whether the agent must send again is :attr:`resend`.
        """
        self.resend = False
        if position == self.delivered:
            return
        if position > self.delivered:
            self._skip_to = max(self._skip_to, position)
            self._pieces = collections.deque(self._skipped(self._pieces))
            self._recount()
            self.delivered, self.delivered_gap = position, 0
            return
        if not resendable:
            lost = self.delivered - position
            self.dropped_bytes += lost
            self._pieces.appendleft(Piece(OutputDropped(dropped_bytes=lost), raw_end=self.delivered))
            self.changed.set()
            return
        self._pieces.clear()
        self._holding, self._held_back, self._hold_next, self._trim = None, collections.deque(), None, None
        self._set_held(0)
        for redactor in self._redactors.values():
            redactor.flush()  # the agent sends again from a position where they held nothing
        self._held_from = dict.fromkeys(self._redactors)
        self._gap_at, self._gap_seen = -1, 0
        if acknowledged > position:
            self.dropped_bytes += acknowledged - position
            self._pieces.append(Piece(OutputDropped(dropped_bytes=acknowledged - position), raw_end=acknowledged))
            self.changed.set()
        self._skip_to = position
        self.delivered, self.delivered_gap, self.received = position, 0, acknowledged
        self.resend = self._awaiting_resend = True
        if not self._closed:
            self.complete = False
            self._check_complete()

    def _skipped(self, pieces: Iterable[Piece]) -> Iterator[Piece]:
        """``pieces`` less what lies before the skip point (a caller has it): unmasked bytes across it are cut."""
        for piece in pieces:
            if piece.gap or piece.raw_end > self._skip_to:
                event = piece.event
                if isinstance(event, OutputChunk) and 0 <= piece.start < self._skip_to:
                    _, piece = _cut(piece, event, self._skip_to)  # where the caller is
                yield piece
