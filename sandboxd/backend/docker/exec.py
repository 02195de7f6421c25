"""Exec and streams: commands run in a container, and the raw connections that carry them.

An exec's stream is the engine's hijacked ``/exec/{id}/start`` connection, opened with
asyncio, so a slow or silent command costs no thread and cancellation is immediate. A
socket the container's root listens on is reached straight from the host when it can be.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from urllib.parse import urlparse

import docker.errors
import structlog

from ...errors import BackendError, SandboxdError, WorkspaceNotFoundError, WorkspaceNotRunningError
from .claims import ClaimsMixin
from .client import _STREAM_LIMIT
from .errors import EngineErrorKind, kind_of

_MUX_HEADER = struct.Struct(">BxxxI")
_SOCKET_READ_BYTES = 1024 * 1024
"""Most bytes one read of a direct socket returns (whatever has arrived, up to this)."""
EXEC_RUN_TIMEOUT_S = 60.0
"""The longest :meth:`ExecMixin.exec_run` waits for its command (a mkdir at a claim)."""
_EXEC_RUN_OUTPUT_BYTES = 1024 * 1024
"""What :meth:`ExecMixin.exec_run` keeps of its command's output."""
_EXEC_SILENCE_S = 1.0
"""Silence on an exec's stream after which the engine is asked whether the exec ended."""

log = structlog.get_logger(__name__)


class ExecMixin(ClaimsMixin):
    """Commands in a workspace's container, and direct connections to its sockets."""

    async def exec_stream(
        self,
        workspace_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        user: str,
        container_id: str = "",
    ) -> DockerExecStream:
        """Start ``argv`` with stdin attached; return the raw multiplexed stream."""
        exec_id = await self._exec_create(workspace_id, argv, env=env, user=user, stdin=True, container_id=container_id)
        body = json.dumps({"Detach": False, "Tty": False}).encode()
        reader, writer, status = await self._hijack(f"exec/{exec_id}/start", body, "starting an exec")
        if status not in (101, 200):
            writer.close()
            msg = f"Docker engine refused to start the exec (HTTP {status})"
            if status == 409:
                msg = f"workspace {workspace_id!r} is not running"
                raise WorkspaceNotRunningError(msg)
            raise BackendError(msg)
        return DockerExecStream(reader, writer, inspect=functools.partial(self._exec_exit_code, exec_id))

    async def _exec_exit_code(self, exec_id: str) -> int | None:
        try:
            inspected = await self._call(self._api().exec_inspect, exec_id, idempotent=True)
        except docker.errors.NotFound:
            return -1  # the engine has forgotten it: it ended (and its record was cleaned up)
        except SandboxdError:
            return None
        if inspected.get("Running"):
            return None
        code = inspected.get("ExitCode")
        return None if code is None else int(code)

    async def exec_run(
        self, workspace_id: str, argv: Sequence[str], *, user: str, container_id: str = ""
    ) -> tuple[int, bytes]:
        """Run ``argv`` to completion; return ``(exit_code, stdout + stderr)``, the first 1 MiB of it.

        Read from the exec's stream, which under gVisor can stay open after the command ended
        (a sandbox that hit its memory or process limit; found by the backend conformance
        suite, where a blocking read waited for ever): once it has been silent for a second,
        the engine is asked whether the exec ended, and once it has, the stream gets one more
        silent second before it is closed (output still on its way is kept).

        Raises:
            BackendError: it did not end within ``EXEC_RUN_TIMEOUT_S``.
        """
        stream = await self.exec_stream(workspace_id, argv, env={}, user=user, container_id=container_id)
        output = bytearray()
        heard = time.monotonic()

        async def drain() -> None:
            nonlocal heard
            while (chunk := await stream.read()) is not None:
                heard = time.monotonic()
                output.extend(chunk[1][: max(0, _EXEC_RUN_OUTPUT_BYTES - len(output))])

        reading = asyncio.ensure_future(drain())
        try:
            async with asyncio.timeout(EXEC_RUN_TIMEOUT_S):
                ended = 0.0
                while not reading.done():
                    await asyncio.wait([reading], timeout=_EXEC_SILENCE_S)
                    if reading.done() or time.monotonic() - heard < _EXEC_SILENCE_S:
                        continue
                    # An exit the engine reports can come before the command's output is read
                    # (a busy host): the stream is given one more silent second after the exit.
                    if not ended:
                        ended = time.monotonic() if await stream.exit_code() is not None else 0.0
                    elif time.monotonic() - max(heard, ended) >= _EXEC_SILENCE_S:
                        break
        except TimeoutError:
            msg = f"{' '.join(argv)[:200]!r} in workspace {workspace_id!r} did not end within {EXEC_RUN_TIMEOUT_S} s"
            raise BackendError(msg) from None
        finally:
            reading.cancel()
            await stream.close(discard_input=True)
        code = await stream.exit_code()
        return (code if code is not None else -1), bytes(output)

    async def _exec_create(
        self,
        workspace_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        user: str,
        stdin: bool,
        container_id: str,
    ) -> str:
        try:
            created = await self._call(
                self._api().exec_create,
                container_id or self._ref(workspace_id),
                list(argv),
                stdin=stdin,
                stdout=True,
                stderr=True,
                tty=False,
                environment=dict(env),
                user=user,
                workdir="/",
            )
        except docker.errors.NotFound as exc:
            msg = f"workspace {workspace_id!r} not found"
            raise WorkspaceNotFoundError(msg) from exc
        except BackendError as exc:
            if kind_of(exc) is EngineErrorKind.NOT_RUNNING:
                msg = f"workspace {workspace_id!r} is not running"
                raise WorkspaceNotRunningError(msg) from exc
            raise
        return str(created["Id"])

    async def open_socket(self, host_path: str, container_id: str) -> UnixSocketStream | None:
        """Connect to a Unix socket of a container's root at its host path (see Backend).

        Only with an engine on a Unix socket, the one way to be on its machine. The path is
        the container's to change (a symlink its root plants there is followed here, on the
        host), so what answers must prove to be of ``container_id``: a listener of uid 0 (a
        container's root is the host's under runc and gVisor, no user namespace) whose
        process is in the container's cgroup (the agent under runc, gVisor's gofer for it).
        """
        if urlparse(self.docker_host).scheme != "unix" or not container_id:
            return None
        try:
            reader, writer = await asyncio.open_unix_connection(host_path, limit=_STREAM_LIMIT)
        except FileNotFoundError:
            return None  # not there (yet)
        except (OSError, ValueError) as exc:
            # Not ours to enter, a path too long for a socket address, or refused: said, as a
            # refusal sends the workspace's link through the bridge.
            log.info("backend.socket_refused", path=host_path, error=str(exc))
            return None
        peer = writer.get_extra_info("socket")
        pid, uid, _gid = struct.unpack("3i", peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != 0 or not _in_container(pid, container_id):
            writer.close()
            log.warning("backend.socket_not_the_containers", path=host_path, uid=uid, pid=pid)
            return None
        return UnixSocketStream(reader, writer)


class _Connection:
    """A two-way byte connection: writes, and a bounded close (its reads are the subclass's)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Wrap an open connection."""
        self._reader = reader
        self._writer = writer

    async def write(self, data: bytes) -> None:
        """Write to the other end (an exec's stdin)."""
        self._writer.write(data)
        await self._writer.drain()

    async def close(self, *, discard_input: bool = False) -> None:
        """Close the connection: flush pending stdin (at most 2 s), or drop it with ``discard_input``.

        A graceful close waits for the write buffer to drain, which never happens
        when the process is gone and the engine stops reading its stdin (a write to
        a full disk that failed early): so the wait is bounded, then the connection
        is aborted.
        """
        transport = self._writer.transport
        self._writer.close()  # marks the writer closed; the transport flushes, then closes
        if discard_input:
            transport.abort()
        with contextlib.suppress(ConnectionError, OSError):
            try:
                await asyncio.wait_for(self._writer.wait_closed(), 2.0)
            except TimeoutError:
                transport.abort()
                await self._writer.wait_closed()


class DockerExecStream(_Connection):
    """One hijacked exec connection: Docker's 8-byte-header multiplexed stdout/stderr plus stdin."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        inspect: Callable[[], Awaitable[int | None]],
    ) -> None:
        """Wrap an upgraded connection whose response headers are already consumed."""
        super().__init__(reader, writer)
        self._inspect = inspect

    async def read(self) -> tuple[int, bytes] | None:
        """Return the next ``(fd, data)`` chunk, or None at end of stream."""
        try:
            header = await self._reader.readexactly(_MUX_HEADER.size)
            fd, size = _MUX_HEADER.unpack(header)
            data = await self._reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        return fd, data

    async def exit_code(self) -> int | None:
        """Return the exec's exit code once Docker reports it ended, else None."""
        return await self._inspect()


class UnixSocketStream(_Connection):
    """A direct connection to a container's Unix socket, shaped as an exec stream (all fd 1)."""

    async def read(self) -> tuple[int, bytes] | None:
        """Return what has arrived (up to 1 MiB) as ``(1, data)``, or None at end of stream."""
        try:
            data = await self._reader.read(_SOCKET_READ_BYTES)
        except ConnectionError:
            return None
        return (1, data) if data else None

    async def exit_code(self) -> int | None:
        """Always None: a socket has no exit code (its end is its end of stream)."""
        return None


def _in_container(pid: int, container_id: str) -> bool:
    """Whether process ``pid`` (as this machine numbers it) is in the container's cgroup.

    Docker names a container's cgroup after its full id, under either cgroup driver and
    version. False when the process cannot be seen (a daemon in a pid namespace of its own).
    """
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/cgroup") as groups:
            return container_id in groups.read()
    except OSError:
        return False


async def _no_exit_code() -> int | None:
    return None
