"""How far ahead of the agent a sender may be: bytes sent on a channel against what the agent took.

The agent reports, as a running total, what it took of a channel's input (``k``): a file
operation's helper, a forwarded connection's socket, or (feature ``input_taken``) a command's
stdin. A :class:`SendWindow` holds a sender back while more than its size would be in flight, so
the agent never holds more than it can (it drops stdin past its own bound), and a slow taker
slows the sender, as a full pipe does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["SendWindow"]


class SendWindow:
    """Bytes sent and taken on one channel, and the wait for room between.

    Args:
        size: most bytes in flight (sent and not yet taken), in bytes.
    """

    def __init__(self, size: int) -> None:
        """Start with nothing sent."""
        self.size = size
        self.sent = 0
        """Bytes sent to the agent (or, after a reconnect, what it says it received)."""
        self.taken = 0
        """Bytes the agent said it took, in all."""
        self._room = asyncio.Event()

    def took(self, total: int) -> None:
        """The agent took ``total`` bytes in all: a waiting sender may go on."""
        self.taken = max(self.taken, total)
        self._room.set()

    def reset(self, sent: int, taken: int) -> None:
        """Take the agent's own counts (a reconnect or a takeover): what was lost in flight is gone."""
        self.sent, self.taken = sent, taken
        self._room.set()

    def wake(self) -> None:
        """Something changed (the channel ended, failed...): a waiting sender looks again."""
        self._room.set()

    async def room_for(self, size: int, *, going: Callable[[], bool]) -> bool:
        """Wait until ``size`` more bytes fit in the window.

        Returns:
            True once they fit; False when ``going()`` turned false while they did not (the
            channel ended: the sender should stop).
        """
        while self.sent + size - self.taken > self.size:
            if not going():
                return False
            self._room.clear()
            await self._room.wait()
        return True
