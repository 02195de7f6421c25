"""The drain layer: the daemon's graceful stop, as each call sees it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from ...errors import DaemonStoppingError
from .._types import Context
from ._call import CallState, Status, is_quiet
from ._layer import Layer

__all__ = ["Drain", "DrainGate"]

_YIELD_S = 1.0
"""How long the calls streaming commands get to yield once the grace is over."""


class Drain:
    """The daemon's graceful stop as its calls see it (SIGTERM; ``SANDBOXD_SHUTDOWN_GRACE_S``).

    Once :meth:`run` begins, a new call is refused with UNAVAILABLE by the daemon itself,
    while the server still accepts connections: stopping the server outright instead makes
    gRPC cancel whatever arrives in that moment, which callers see as CANCELLED, a word they
    take for their own cancel. Calls in flight get the grace to end. Then a call streaming a
    command yields (its final event names the process, to poll once a daemon serves
    again); any other still running (a forward, an upload) ends with UNAVAILABLE saying so.
    Health checks and reflection are never refused: health says NOT_SERVING.
    """

    def __init__(self) -> None:
        """Nothing is stopping yet."""
        self.stopping = False
        self.expired = False
        self._grace_s = 0.0
        self._calls: dict[asyncio.Task[Any], Context] = {}
        self._idle = asyncio.Event()

    def enter(self, context: Context) -> bool:
        """Count a call in; return False when it is not counted (no task: a test's direct call).

        Raises:
            DaemonStoppingError: the daemon is stopping.
        """
        if self.stopping:
            msg = "the daemon is stopping; call again once a daemon serves (a successor adopts the workspaces)"
            raise DaemonStoppingError(msg)
        task = asyncio.current_task()
        if task is None:
            return False
        self._calls[task] = context
        return True

    def leave(self) -> None:
        """Count the current call out."""
        task = asyncio.current_task()
        if task is not None:
            self._calls.pop(task, None)
        if self.stopping and not self._calls:
            self._idle.set()

    async def run(self, grace_s: float, *, expiring: Callable[[], None] = lambda: None) -> None:
        """Refuse new calls, wait up to ``grace_s`` for those in flight, then end the rest (UNAVAILABLE).

        ``expiring`` is called when the grace is over, and given a moment to end calls its own
        way (a command's stream yields, with its process id); the rest are then ended.
        """
        self.stopping, self._grace_s = True, grace_s
        if not self._calls:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), grace_s)
            return
        expiring()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), _YIELD_S)
            return
        self.expired = True
        message = (
            f"the daemon stopped before this call ended (its shutdown grace is {self._grace_s:g} s); "
            "a command it started runs on in its workspace, for the next daemon to adopt"
        )
        for task, context in list(self._calls.items()):
            context.set_code(grpc.StatusCode.UNAVAILABLE)
            context.set_details(message)
            task.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), 2.0)


class DrainGate(Layer):
    """Counts each call in and out of ``drain``; refuses one once it stops; ends one at the grace.

    A call ended by the drain has its status set by :meth:`Drain.run` (UNAVAILABLE, saying
    why); it is recorded as UNAVAILABLE, "the daemon stopped before this call ended". Health
    checks and reflection are never counted or refused.

    Args:
        drain: the daemon's graceful stop.
    """

    def __init__(self, drain: Drain | None = None) -> None:
        """Count calls in ``drain``."""
        self.drain = drain or Drain()

    @contextlib.asynccontextmanager
    async def around(self, state: CallState, request: Any, context: Context) -> AsyncIterator[Any]:
        """Count the call in (raises DaemonStoppingError once stopping) and out, however it ends."""
        if is_quiet(state.method):
            yield request
            return
        counted = self.drain.enter(context)
        try:
            yield request
        except asyncio.CancelledError:
            if not self.drain.expired:
                raise
            # The drain's cancel is answered: the call ends with the status the drain set.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            state.status = Status(grpc.StatusCode.UNAVAILABLE, "the daemon stopped before this call ended")
        finally:
            if counted:
                self.drain.leave()
