"""Giving memory back after large requests.

A WriteFile of 16 MiB is copied a few times on its way in (gRPC's buffer, bytes, the parsed
message); once the call is done those blocks are free, but glibc keeps freed heap memory in
its arenas, so a burst of large requests would leave the daemon's resident size at the
burst's peak. The RPC layer tells a :class:`HeapTrimmer` the size of every large request,
and its task asks glibc to return free memory (``malloc_trim``) at most once a second after
enough of them. Elsewhere (musl, macOS) there is nothing to ask and the task ends at once.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable

__all__ = ["TRIM_AFTER_BYTES", "TRIM_INTERVAL_S", "HeapTrimmer"]

TRIM_AFTER_BYTES = 8 * 1024 * 1024
"""Large request bytes seen since the last look that make a trim worth its few milliseconds."""

TRIM_INTERVAL_S = 1.0
"""How often the trimmer looks, in seconds."""


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


class HeapTrimmer:
    """Counts large requests' bytes; :meth:`run` returns free heap memory after enough of them."""

    def __init__(self) -> None:
        """Find glibc's ``malloc_trim`` (None elsewhere)."""
        self._seen = 0
        self._again = False
        self._trim = _malloc_trim()

    def note(self, size_bytes: int) -> None:
        """Count a large request (called from the event loop, for each one)."""
        self._seen += size_bytes

    async def run(self) -> None:
        """Trim when due, for the daemon's whole life (returns at once without glibc)."""
        if self._trim is None:
            return
        while True:
            await asyncio.sleep(TRIM_INTERVAL_S)
            busy = self._seen >= TRIM_AFTER_BYTES
            if busy or self._again:
                # Once more a second after the last large request: what it held is freed only
                # when its call ends, after the trim that its arrival caused.
                self._seen, self._again = 0, busy
                await asyncio.to_thread(self._trim, 0)
