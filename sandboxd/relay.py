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
from collections.abc import Mapping

from sandboxd_protocol.redact import StreamRedactor

from .agent import ProtocolError
from .models import OutputChunk, OutputDropped

__all__ = ["MAX_CHUNK_BYTES", "OutputRelay", "Piece"]

MAX_CHUNK_BYTES = 1024 * 1024
"""Largest output chunk sent as one event; adjacent chunks of a stream are merged up to it."""


@dataclasses.dataclass
class Piece:
    """An event on its way to callers, with the agent's offset it accounts for."""

    event: OutputChunk | OutputDropped
    raw_end: int
    """Every output byte before this offset is accounted for once this piece is delivered."""
    gap: int = 0
    """For a gap: its whole size at ``raw_end`` (acknowledged with it)."""


class OutputRelay:
    """The output of one session between the agent and its callers.

    Args:
        redactors: one secret masker per stream (``stdout``, ``stderr``).
    """

    def __init__(self, redactors: Mapping[str, StreamRedactor[bytes]]) -> None:
        """Start at offset 0 with nothing held."""
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
        self._closed = False

    def resume(self, ack: int, ack_gap: int) -> None:
        """Go on from the agent's acknowledged position (a session taken over after a restart)."""
        self.received = self.delivered = ack
        self.delivered_gap = ack_gap

    def add_output(self, stream: str, offset: int, data: bytes) -> None:
        """Output from the agent at ``offset``.

        Raises:
            ProtocolError: bytes beyond the next expected offset (a gap nobody reported).
        """
        if offset + len(data) <= self.received:
            return  # sent again after a reconnect: callers have it already
        if offset > self.received:
            msg = f"output at offset {offset}, expected {self.received}"
            raise ProtocolError(msg)
        data = data[self.received - offset :]
        self.received += len(data)
        redactor = self._redactors[stream]
        masked = redactor.feed(data)
        self._held_from[stream] = self.received - redactor.held if redactor.held else None
        if masked:
            # Bytes the masking holds back are not in this chunk: delivering it does not cover them.
            self._pieces.append(Piece(OutputChunk(stream=stream, data=masked), raw_end=self.received - redactor.held))
        self.changed.set()
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
        self._pieces.append(Piece(OutputDropped(dropped_bytes=total - seen), raw_end=offset, gap=total))
        self.changed.set()

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
                self._pieces.append(Piece(OutputChunk(stream=stream, data=rest), raw_end=self.end))
            self._held_from[stream] = None
        self.complete = True
        self.changed.set()

    def close(self) -> None:
        """No more output will come (the session failed): what is here is all callers get."""
        self._closed = self.complete = True
        self.changed.set()

    def rewind(self, ack: int) -> None:
        """A new connection: the agent sends again from its ``ack``; what callers have not taken comes again."""
        self._pieces.clear()
        self.received = max(self.delivered, ack)
        self._gap_at, self._gap_seen = -1, 0
        for redactor in self._redactors.values():
            redactor.flush()  # bytes held back are sent again by the agent
        self._held_from = dict.fromkeys(self._redactors)
        if not self._closed:
            self.complete = False  # the end waits for the output sent again
            self._check_complete()

    def ack_position(self) -> tuple[int, int]:
        """What may be acknowledged: ``(offset, gap at it)``, short of any byte the masking holds."""
        held = [offset for offset in self._held_from.values() if offset is not None]
        ack = min([self.delivered, *held])
        return ack, self.delivered_gap if ack == self.delivered else 0

    @property
    def pending(self) -> bool:
        """Whether events wait for a caller."""
        return bool(self._pieces)

    def take(self) -> list[tuple[OutputChunk | OutputDropped, Piece]]:
        """Everything waiting, adjacent chunks of one stream merged (up to 1 MiB), each with its last piece.

        Fewer, larger messages are what lets a fast producer stream at full speed. Call
        :meth:`delivered_through` with a piece once its event reached the caller.
        """
        pieces = list(self._pieces)
        self._pieces.clear()
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
