"""Port forwarding: one TCP connection to a port inside a workspace, carried by its agent.

A :class:`PortForwarder` serves ``ForwardPort`` calls. The workspace's agent dials
``127.0.0.1:port`` in the workspace's own network namespace (PROTOCOL.md, Forwarded
connections), so a server the agent engine started is reachable whatever the network
policy, ``none`` included, and nothing is published on the engine's host. Each direction
holds at most the agent's window in flight; the daemon holds at most one window per
connection (plus the one message being written to the caller), whatever either end does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import structlog

from . import metrics
from .agent import ForwardedConnection, ForwardError
from .errors import FailedPreconditionError, InvalidSpecError, QuotaExceededError
from .workspaces import WorkspaceManager

__all__ = ["EOF", "MAX_FORWARDS", "MAX_FORWARDS_PER_WORKSPACE", "PortForwarder"]

log = structlog.get_logger(__name__)

MAX_FORWARDS_PER_WORKSPACE = 128
"""Most forwarded connections open at once into one workspace (a browser opens six per host)."""
MAX_FORWARDS = 512
"""Most open at once into all of a daemon's workspaces: each may hold about 1.5 MiB of the daemon's
memory for a caller that stops reading (its window, gRPC's own buffers)."""

EOF = None
"""What :meth:`PortForwarder.forward` yields once the workspace's server closed its side."""


async def _read_unless_failed(connection: ForwardedConnection, pump: asyncio.Task[None]) -> bytes | None:
    """The server's next bytes, unless the caller's side failed first (a bad message, one too large).

    Raises:
        Exception: the caller's side's failure, at once (the connection is then closed).
    """
    if pump.done():
        return await connection.read()
    reading = asyncio.ensure_future(connection.read())
    await asyncio.wait({reading, pump}, return_when=asyncio.FIRST_COMPLETED)
    if pump.done() and pump.exception() is not None and not reading.done():
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, ForwardError):
            await reading
        raise pump.exception()  # type: ignore[misc]
    return await reading


class PortForwarder:
    """Opens forwarded connections into workspaces, counting them per workspace.

    Args:
        workspaces: where the workspace, its tenant and its agent link are looked up.
    """

    def __init__(self, workspaces: WorkspaceManager) -> None:
        """Count no connections yet."""
        self.workspaces = workspaces
        self._open: dict[str, int] = {}

    async def forward(
        self, workspace_id: str, port: int, incoming: AsyncIterator[bytes]
    ) -> AsyncIterator[bytes | None]:
        """Relay one connection: yield ``b""`` once it is open, then the server's bytes, ``EOF`` at its end.

        ``incoming`` is the caller's bytes; its end closes the connection's writing half.
        The generator returns once both sides are done; leaving it early closes the
        connection. The workspace counts as in use meanwhile (the idle reaper leaves it).

        Raises:
            InvalidSpecError: the port is outside 1-65535.
            WorkspaceNotFoundError: no such workspace of the caller's.
            QuotaExceededError: ``MAX_FORWARDS_PER_WORKSPACE`` connections are open into it, or
                ``MAX_FORWARDS`` into all workspaces.
            FailedPreconditionError: nothing listens on the port (or the connect failed),
                or the connection failed midway.
        """
        if not 1 <= port <= 65535:
            msg = f"port {port} is not a TCP port (1-65535)"
            raise InvalidSpecError(msg)
        context = await self.workspaces.exec_context(workspace_id)
        if self._open.get(workspace_id, 0) >= MAX_FORWARDS_PER_WORKSPACE:
            msg = (
                f"workspace {workspace_id!r} has {MAX_FORWARDS_PER_WORKSPACE} forwarded connections open; "
                "close one before opening another"
            )
            raise QuotaExceededError(msg)
        if sum(self._open.values()) >= MAX_FORWARDS:
            msg = f"the daemon has {MAX_FORWARDS} forwarded connections open; close one before opening another"
            raise QuotaExceededError(msg)
        self._open[workspace_id] = self._open.get(workspace_id, 0) + 1
        metrics.FORWARDS_OPEN.inc()
        pump: asyncio.Task[None] | None = None
        try:
            async with self.workspaces.in_use(workspace_id), context.link.forward(port) as connection:
                log.info("forward.opened", workspace_id=workspace_id, port=port)
                yield b""

                async def send() -> None:
                    async for data in incoming:
                        await connection.write(data)
                    await connection.close_write()

                pump = asyncio.create_task(send(), name=f"forward-{workspace_id}-{port}")
                while (data := await _read_unless_failed(connection, pump)) is not None:
                    yield data
                yield EOF
                await pump  # the caller's side ends when it ends (a half-closed connection)
        except ForwardError as exc:
            if exc.code == "refused":
                msg = f"nothing listens on port {port} in workspace {workspace_id!r} (connection refused)"
                raise FailedPreconditionError(msg) from None
            msg = f"workspace {workspace_id!r}: {exc.message}"
            raise FailedPreconditionError(msg) from None
        finally:
            if pump is not None and not pump.done():
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError, ForwardError):
                    await pump
            metrics.FORWARDS_OPEN.dec()
            self._open[workspace_id] -= 1
            if not self._open[workspace_id]:
                del self._open[workspace_id]
