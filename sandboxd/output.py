"""Bounded output buffering: what a process printed and nobody has read yet.

SPEC §2.3: the daemon never holds unbounded output. Undelivered output is kept
up to a cap; past it the *head* is kept and later bytes are dropped and counted,
and the gap is reported where it happened. While a caller is attached and
reading, the producer waits for room instead (back-pressure through the pipe),
so a reader that keeps up never loses a byte.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses

from .models import OutputChunk, OutputDropped

__all__ = ["OutputBuffer", "utf8_cut"]


def utf8_cut(data: bytes, limit: int) -> int:
    """Return the largest cut point ``<= limit`` that does not split a UTF-8 sequence.

    Bytes that are not UTF-8 at all are cut at ``limit`` exactly; the cut backs up
    at most three bytes, past a trailing lead byte and its continuation bytes.
    """
    if limit >= len(data):
        return len(data)
    cut = limit
    back = 0
    while cut > 0 and back < 3 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
        back += 1
    if (data[cut] & 0xC0) == 0x80:
        return limit  # not UTF-8: a byte cut is as good as any
    return cut


@dataclasses.dataclass
class _Gap:
    dropped_bytes: int


class OutputBuffer:
    """FIFO of output chunks capped at ``max_bytes`` of payload (plus at most one chunk in flight).

    Args:
        max_bytes: most undelivered bytes held (SPEC default 1 MiB).
        readers: readers counted as attached from the start (a call that is about to read).
    """

    def __init__(self, max_bytes: int, *, readers: int = 0) -> None:
        """Create an empty buffer."""
        self.max_bytes = max_bytes
        self._items: collections.deque[OutputChunk | _Gap] = collections.deque()
        self._size = 0
        self._readers = readers
        self._closed = False
        self.dropped_bytes = 0
        """Total bytes dropped over the buffer's life."""
        self._changed = asyncio.Condition()

    @property
    def size(self) -> int:
        """Bytes of payload currently held."""
        return self._size

    async def attach(self) -> None:
        """Register a reader: from now on a full buffer pauses the producer."""
        async with self._changed:
            self._readers += 1

    async def detach(self) -> None:
        """Unregister a reader; a producer waiting for room re-decides (and may drop)."""
        async with self._changed:
            self._readers -= 1
            self._changed.notify_all()

    async def put(self, stream: str, data: bytes) -> None:
        """Append ``data`` from ``stream``, waiting for room while a reader is attached."""
        async with self._changed:
            # Wait for room, but an empty buffer always takes the chunk: a chunk larger than
            # the whole cap would otherwise wait forever.
            while self._size and self._size + len(data) > self.max_bytes and self._readers > 0 and not self._closed:
                await self._changed.wait()
            if self._readers > 0 and not self._size:
                self._items.append(OutputChunk(stream=stream, data=data))
                self._size += len(data)
                self._changed.notify_all()
                return
            room = self.max_bytes - self._size
            keep = len(data) if len(data) <= room else utf8_cut(data, max(room, 0))
            if keep:
                self._items.append(OutputChunk(stream=stream, data=data[:keep]))
                self._size += keep
            if keep < len(data):
                self._drop(len(data) - keep)
            self._changed.notify_all()

    def _drop(self, count: int) -> None:
        self.dropped_bytes += count
        last = self._items[-1] if self._items else None
        if isinstance(last, _Gap):
            last.dropped_bytes += count
        else:
            self._items.append(_Gap(count))

    async def take(self) -> list[OutputChunk | OutputDropped]:
        """Remove and return everything held, in order (possibly nothing)."""
        async with self._changed:
            items = [OutputDropped(dropped_bytes=i.dropped_bytes) if isinstance(i, _Gap) else i for i in self._items]
            self._items.clear()
            self._size = 0
            self._changed.notify_all()
            return items

    async def wait(self, timeout_s: float) -> None:
        """Return when something was added or ``timeout_s`` seconds passed."""
        async with self._changed:
            if self._items or self._closed:
                return
            try:
                async with asyncio.timeout(timeout_s):
                    await self._changed.wait()
            except TimeoutError:
                return

    async def close(self) -> None:
        """No more output will come: wake everyone."""
        async with self._changed:
            self._closed = True
            self._changed.notify_all()

    @property
    def empty(self) -> bool:
        """Whether nothing is held."""
        return not self._items
