"""The E2B plane's one ASGI app and its HTTP server (``sandboxd serve --e2b-listen``).

Both of E2B's planes share one port, told apart by path: envd's Connect services
(``/process.Process/...``, ``/filesystem.Filesystem/...``) and its HTTP routes (``/files``,
``/health``), and the REST control plane (``/sandboxes...``, ``/v2/sandboxes...``). So the SDK's
two settings may name the same origin, and so may the domain form (``api.DOMAIN`` and
``49983-ID.DOMAIN``).

Served by Hypercorn: HTTP/1.1 (what the SDK speaks over cleartext, with chunked request bodies
for client streams) and HTTP/2 over TLS (ALPN), with the daemon's certificate when it has one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import structlog
from connectrpc.code import Code
from connectrpc.codec import Codec, proto_binary_codec, proto_json_codec
from connectrpc.errors import ConnectError
from hypercorn.asyncio import serve
from hypercorn.config import Config
from starlette.applications import Starlette

from .control import control_routes
from .envd.filesystem.filesystem_connect import FilesystemASGIApplication
from .envd.process.process_connect import ProcessASGIApplication
from .files import file_routes
from .filesystem import FilesystemService
from .gateway import Gateway
from .process import ProcessHub, ProcessService
from .templates import TemplatePlane

__all__ = ["E2BServer", "create_app"]

log = structlog.get_logger(__name__)

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]

# Largest Connect message (envd's are small: a path, a command line, one input chunk).
_READ_MAX_BYTES = 8 * 1024 * 1024


class _Refusing:
    """A codec whose decode errors are INVALID_ARGUMENT (connectrpc lets a stream's escape as UNKNOWN)."""

    def __init__(self, inner: Codec[Any, Any]) -> None:
        self._inner = inner

    def name(self) -> str:
        return self._inner.name()

    def encode(self, message: Any) -> bytes:
        return self._inner.encode(message)

    def decode(self, data: bytes | bytearray, message_class: type[Any]) -> Any:
        try:
            return self._inner.decode(data, message_class)
        except Exception as exc:
            raise ConnectError(Code.INVALID_ARGUMENT, f"the request message does not decode: {exc}") from None


def create_app(
    gateway: Gateway, hub: ProcessHub, *, base_image: str, max_timeout_s: float, templates: TemplatePlane
) -> ASGIApp:
    """The E2B plane as one ASGI app over ``gateway``.

    Args:
        gateway: sandboxd's services.
        hub: the pumps of the processes started through this app.
        base_image: the image of E2B's ``base`` template (``images/e2b``).
        max_timeout_s: the daemon's longest command timeout.
        templates: the template builds' routes and state.
    """
    options: dict[str, Any] = {
        "read_max_bytes": _READ_MAX_BYTES,
        "compressions": (),
        "codecs": [_Refusing(proto_binary_codec()), _Refusing(proto_json_codec())],
    }
    processes = ProcessASGIApplication(ProcessService(gateway, hub, max_timeout_s), **options)
    filesystem = FilesystemASGIApplication(FilesystemService(gateway), **options)
    rest = Starlette(routes=[*templates.routes(), *control_routes(gateway), *file_routes(gateway)])
    rest.state.base_image = base_image

    async def route(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if path.startswith("/process.Process/"):
                return await processes(scope, receive, send)
            if path.startswith("/filesystem.Filesystem/"):
                return await filesystem(scope, receive, send)
        return await rest(scope, receive, send)

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        try:
            await route(scope, receive, send)
        except Exception:
            # The client has had its 500 (or Connect's internal error); the trace is the daemon's.
            log.exception("e2b.request_failed", path=scope.get("path", ""), method=scope.get("method", ""))

    return app


def _bind(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    sock.listen(128)
    sock.setblocking(False)
    return sock


class E2BServer:
    """The E2B plane, listening.

    Args:
        address: ``HOST:PORT`` (port 0 picks one; :attr:`address` then says which).
        socket_path: the daemon's Unix socket, which the plane calls.
        base_image: the image of E2B's ``base`` template.
        max_timeout_s: the daemon's longest command timeout.
        certfile: PEM certificate for TLS (HTTP/2 by ALPN); None serves cleartext HTTP/1.1.
        keyfile: its key.
        max_upload_bytes: the largest template build upload accepted, in bytes.

    Raises:
        OSError: the address cannot be bound.
    """

    def __init__(
        self,
        address: str,
        socket_path: str,
        *,
        base_image: str,
        max_timeout_s: float,
        certfile: str | None = None,
        keyfile: str | None = None,
        max_upload_bytes: int = 1 << 30,
    ) -> None:
        self.gateway = Gateway(socket_path)
        self.templates = TemplatePlane(self.gateway, base_image=base_image, max_upload_bytes=max_upload_bytes)
        self.hub = ProcessHub()
        self._socket = _bind(address)
        host, port = self._socket.getsockname()[:2]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.tls = certfile is not None
        config = Config()
        # Hypercorn takes the descriptor it is given as its own (and closes it): a duplicate.
        config.bind = [f"fd://{os.dup(self._socket.fileno())}"]
        config.accesslog = None
        config.errorlog = None
        config.graceful_timeout = 1.0
        config.keep_alive_timeout = 75.0
        if certfile is not None:
            config.certfile = certfile
            config.keyfile = keyfile
        self._config = config
        self._app = create_app(
            self.gateway, self.hub, base_image=base_image, max_timeout_s=max_timeout_s, templates=self.templates
        )
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Serve in the background."""
        self._task = asyncio.create_task(
            serve(self._app, self._config, shutdown_trigger=self._stopping.wait),  # type: ignore[arg-type]
            name="e2b-server",
        )
        await asyncio.sleep(0)
        log.info("e2b.listening", address=self.address, tls=self.tls)

    async def stop(self) -> None:
        """Stop serving: streams end once their processes' pumps do; then close the channel."""
        await self.hub.close()
        self.templates.close()
        self._stopping.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 5.0)
        await self.gateway.close()
        self._socket.close()
