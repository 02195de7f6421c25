"""The grpc.aio server: servicers, health checking, reflection, socket set-up, graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from sandboxd_client._pb.sandboxd.v1 import (
    file_service_pb2,
    file_service_pb2_grpc,
    process_service_pb2,
    process_service_pb2_grpc,
    workspace_service_pb2,
    workspace_service_pb2_grpc,
)

from ..backend.base import Backend
from ..errors import SandboxdError
from ..files import FileManager
from ..images import ensure_default_image
from ..processes import ProcessTable
from ..settings import Settings
from ..workspaces import WorkspaceManager
from .files import FileServicer
from .interceptors import ErrorInterceptor
from .processes import ProcessServicer
from .workspaces import WorkspaceServicer

__all__ = ["SERVICE_NAMES", "Daemon", "serve"]

log = structlog.get_logger(__name__)

SERVICE_NAMES = (
    workspace_service_pb2.DESCRIPTOR.services_by_name["WorkspaceService"].full_name,
    process_service_pb2.DESCRIPTOR.services_by_name["ProcessService"].full_name,
    file_service_pb2.DESCRIPTOR.services_by_name["FileService"].full_name,
)
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass
class Daemon:
    """A started daemon: the server plus the domain objects behind it."""

    server: grpc.aio.Server
    backend: Backend
    processes: ProcessTable
    workspaces: WorkspaceManager
    files: FileManager
    health: health.aio.HealthServicer
    addresses: list[str]

    async def stop(self, grace_s: float) -> None:
        """Stop accepting calls, give in-flight ones ``grace_s`` seconds, then release everything."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
        await self.processes.close()
        await self.files.close()
        await self.backend.close()
        log.info("daemon.stopped")


def _prepare_socket(path: Path) -> None:
    """Create the socket's directory (0700) and clear a stale socket; refuse a live one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.parent.stat().st_uid == os.geteuid():
        path.parent.chmod(0o700)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            msg = f"{path} exists and is not a socket; refusing to replace it"
            raise SandboxdError(msg)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # stale: nobody listens
        else:
            msg = f"another daemon is already listening on {path}"
            raise SandboxdError(msg)
        finally:
            probe.close()


async def start(settings: Settings, backend: Backend) -> Daemon:
    """Build the servicers over ``backend`` and start listening.

    Raises:
        SandboxdError: the socket is taken or a port cannot be bound.
    """
    processes = ProcessTable(backend, settings)
    workspaces = WorkspaceManager(backend, settings, processes)
    server = grpc.aio.server(
        interceptors=[ErrorInterceptor()],
        options=[
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ],
    )
    workspace_service_pb2_grpc.add_WorkspaceServiceServicer_to_server(WorkspaceServicer(workspaces), server)
    process_service_pb2_grpc.add_ProcessServiceServicer_to_server(ProcessServicer(workspaces, processes), server)
    files = FileManager(backend, workspaces)
    file_service_pb2_grpc.add_FileServiceServicer_to_server(FileServicer(files), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    addresses = []
    socket_path = Path(settings.socket_path)
    await asyncio.to_thread(_prepare_socket, socket_path)
    old_umask = os.umask(0o177)  # the socket is born 0600, not chmod-ed after the fact
    try:
        server.add_insecure_port(f"unix:{socket_path}")
    finally:
        os.umask(old_umask)
    os.chmod(socket_path, 0o600)  # belt and braces: some gRPC versions create it later
    addresses.append(f"unix:{socket_path}")
    if settings.listen_address:
        port = server.add_insecure_port(settings.listen_address)
        if port == 0:
            msg = f"cannot listen on {settings.listen_address}"
            raise SandboxdError(msg)
        host = settings.listen_address.rsplit(":", 1)[0]
        addresses.append(f"{host}:{port}")
        log.warning("daemon.tcp_unauthenticated", address=addresses[-1])
    await server.start()
    for name in ("", *SERVICE_NAMES):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("daemon.listening", addresses=addresses, instance=settings.instance)
    return Daemon(
        server=server,
        backend=backend,
        processes=processes,
        workspaces=workspaces,
        files=files,
        health=health_servicer,
        addresses=addresses,
    )


async def serve(
    settings: Settings,
    backend: Backend,
    *,
    build_image: bool = True,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Run the daemon until SIGTERM or SIGINT, then stop gracefully.

    Args:
        settings: daemon settings.
        backend: the container engine.
        build_image: find or build the default workspace image before serving.
        progress: receives image-build progress lines.
    """
    if build_image and settings.build_default_image:
        try:
            await ensure_default_image(
                backend,
                settings.default_image,
                route=settings.image_route,
                progress=progress or (lambda line: log.info("image.progress", line=line)),
            )
        except SandboxdError as exc:
            # Serve anyway: workspaces on other images work, and the error says what to do.
            log.error("image.unavailable", image=settings.default_image, error=exc.message)  # noqa: TRY400
    daemon = await start(settings, backend)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        log.info("daemon.stopping", grace_s=settings.shutdown_grace_s)
        await daemon.stop(settings.shutdown_grace_s)
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(Path(settings.socket_path).unlink)
