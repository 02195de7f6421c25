"""PortForward: a local TCP listener whose every connection reaches a port inside a workspace."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import grpc
from sandboxd_protocol.limits import MAX_FORWARD_CHUNK_BYTES
from sandboxd_protocol.v1 import network_service_pb2 as npb

from .errors import SandboxError, from_rpc_error

if TYPE_CHECKING:
    from sandboxd_protocol.v1 import network_service_pb2_grpc as ngrpc

__all__ = ["PortForward"]

log = logging.getLogger(__name__)

_READ_BYTES = 256 * 1024
"""Largest piece read from a local connection at once (one message to the daemon)."""


class PortForward:
    """Listens on ``local_host:local_port``; each connection is one ``ForwardPort`` call to ``port`` in the workspace.

    Use as ``async with ws.forward(8000) as address:`` (``address`` is ``"127.0.0.1:PORT"``),
    or :meth:`start` and :meth:`close`. Any number of connections at once, each its own
    stream, each with bounded buffering both ways (a slow reader holds back the server).
    A connection the workspace refuses (nothing listens on the port) is closed at once and
    its error kept in :attr:`errors` and passed to ``on_error``.

    Args:
        stub: the client's NetworkService stub.
        workspace_id: the workspace.
        port: the TCP port on the workspace's loopback (1-65535).
        local_host: the address to listen on; the loopback unless told (anyone who can
            reach the listener reaches the workspace's server).
        local_port: the local port; 0 picks a free one.
        on_error: called with each connection's error.
    """

    def __init__(
        self,
        stub: ngrpc.NetworkServiceStub,
        workspace_id: str,
        port: int,
        *,
        local_host: str = "127.0.0.1",
        local_port: int = 0,
        on_error: Callable[[SandboxError], None] | None = None,
    ) -> None:
        """Prepare the listener; nothing listens until :meth:`start`."""
        if not 1 <= port <= 65535:
            msg = f"port {port} is not a TCP port (1-65535)"
            raise ValueError(msg)
        self._stub = stub
        self.workspace_id = workspace_id
        self.port = port
        self.local_host = local_host
        self.local_port = local_port
        self.on_error = on_error
        self.errors: list[SandboxError] = []
        """Each failed connection's error, oldest first (the last 100)."""
        self.connections = 0
        """Connections accepted so far."""
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def active(self) -> int:
        """Connections open right now (each one ``ForwardPort`` call)."""
        return len(self._handlers)

    @property
    def address(self) -> str:
        """``host:port`` of the local listener (IPv6 hosts in brackets)."""
        host = f"[{self.local_host}]" if ":" in self.local_host else self.local_host
        return f"{host}:{self.local_port}"

    async def start(self) -> str:
        """Start listening; return :attr:`address`.

        Raises:
            OSError: the local address cannot be listened on (in use, not this host's).
        """
        self._server = await asyncio.start_server(self._accept, self.local_host, self.local_port)
        self.local_port = self._server.sockets[0].getsockname()[1]
        return self.address

    async def close(self) -> None:
        """Stop listening and end every forwarded connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        for task in list(self._handlers):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> str:
        """Start listening; the address is what ``as`` gets."""
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        """Close the listener and its connections."""
        await self.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.connections += 1
        try:
            await self._relay(reader, writer)
        except asyncio.CancelledError:
            pass  # closed; (asyncio's stream callback raises on a task that ends cancelled)
        except SandboxError as error:
            self.errors = [*self.errors[-99:], error]
            if self.on_error is not None:
                self.on_error(error)
            else:
                log.warning("forward to port %d in %s: %s", self.port, self.workspace_id, error)
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def requests() -> AsyncIterator[npb.ForwardPortRequest]:
            target = npb.ForwardPortTarget(workspace_id=self.workspace_id, port=self.port)
            yield npb.ForwardPortRequest(target=target)
            with contextlib.suppress(OSError):
                while data := await reader.read(min(_READ_BYTES, MAX_FORWARD_CHUNK_BYTES)):
                    yield npb.ForwardPortRequest(data=data)
            # The local side is done: the request stream's end half-closes the connection.

        call = self._stub.ForwardPort(requests())
        try:
            async for message in call:
                kind = message.WhichOneof("message")
                if kind == "data":
                    writer.write(message.data)
                    await writer.drain()  # back-pressure: no more is read until the client takes this
                elif kind == "eof" and writer.can_write_eof():
                    writer.write_eof()
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        except OSError:
            pass  # the local client went away: the call is cancelled below
        finally:
            call.cancel()
