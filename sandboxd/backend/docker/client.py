"""The engine client every resource module builds on: one SDK connection, calls, raw streams.

Blocking SDK calls run through ``asyncio.to_thread`` (:meth:`DockerClient._call`), each
translated into a ``SandboxdError`` and retried when idempotent and transient. Exec
streams, attaches and followed logs do not take a thread: :meth:`DockerClient._hijack`
and :meth:`DockerClient._connect` speak HTTP to the engine's socket with asyncio.
"""

from __future__ import annotations

import asyncio
import datetime
import socket
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlparse

import docker
import docker.errors
import structlog
import tenacity
from sandboxd_protocol.retry import RetryPolicy

from ... import metrics
from ...errors import BackendError, DockerUnavailableError
from .errors import EngineErrorKind, classify, reason, translate

API_VERSION = "1.41"
"""Docker Engine API version spoken (Docker 20.10 and every later engine accept it)."""

LABEL_MANAGED = "sandboxd.managed"
LABEL_INSTANCE = "sandboxd.instance"
LABEL_WORKSPACE = "sandboxd.workspace_id"
WORKSPACE_MOUNT = "/workspace"
_STREAM_LIMIT = 4 * 1024 * 1024

log = structlog.get_logger(__name__)
T = TypeVar("T")


_PASSED_THROUGH = frozenset({EngineErrorKind.NOT_FOUND, EngineErrorKind.IMAGE_NOT_FOUND})
"""Kinds raised as the SDK's own exceptions: each caller gives not-found its own meaning."""


ENGINE_RETRY = RetryPolicy(first_wait_s=0.1, growth=2.0, max_wait_s=1.0, jitter_s=0.3, max_attempts=4, max_total_s=2.5)
"""Idempotent engine calls retried on a transient failure, bounded (shorter than the client's) so
that an engine that is gone is reported UNAVAILABLE within a few seconds."""


def _is_transient(exc: BaseException) -> bool:
    """Whether an engine call's error is worth another attempt: no engine, or a 5xx answer."""
    return isinstance(exc, DockerUnavailableError) or (isinstance(exc, BackendError) and exc.transient)


class DockerClient:
    """The connection to one engine, shared by every resource mixin of :class:`DockerBackend`.

    Args:
        docker_host: engine address, ``unix:///path`` or ``tcp://host:port``.
        instance: value of the ``sandboxd.instance`` label on everything created.
        timeout_s: timeout of each blocking API call, in seconds.
        retries: retry idempotent calls on transient failures (bounded, jittered).
    """

    def __init__(self, *, docker_host: str, instance: str, timeout_s: float = 60.0, retries: bool = True) -> None:
        """Configure the client; nothing connects until the first call."""
        self.docker_host = docker_host
        self.instance = instance
        self._timeout_s = timeout_s
        self._retries = retries
        self._api_client: docker.APIClient | None = None

    def _api(self) -> docker.APIClient:
        if self._api_client is None:
            try:
                self._api_client = docker.APIClient(
                    base_url=self.docker_host, version=API_VERSION, timeout=int(self._timeout_s)
                )
            except docker.errors.DockerException as exc:
                msg = f"cannot use Docker engine address {self.docker_host!r}: {exc}"
                raise DockerUnavailableError(msg) from exc
        return self._api_client

    def _check_socket(self) -> None:
        """Fail fast when nothing listens on the engine's Unix socket.

        docker-py's ``UnixHTTPConnection.connect`` leaks its socket when the connect
        fails; probing first (tens of microseconds) keeps an engine outage from
        leaking a descriptor per call.
        """
        url = urlparse(self.docker_host)
        if url.scheme != "unix":
            return
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(url.path)
        except FileNotFoundError:
            msg = f"Docker engine unreachable at {self.docker_host}: no such socket"
            raise DockerUnavailableError(msg) from None
        except OSError as exc:
            msg = f"Docker engine unreachable at {self.docker_host}: {exc.strerror or exc}"
            raise DockerUnavailableError(msg) from None
        finally:
            probe.close()

    async def _call(self, fn: Callable[..., T], *args: Any, idempotent: bool = False, **kwargs: Any) -> T:
        """Run a blocking SDK call off the event loop, translating its errors."""

        def probed() -> T:
            self._check_socket()
            return fn(*args, **kwargs)

        async def attempt() -> T:
            try:
                result = await asyncio.to_thread(probed)
            except Exception as exc:  # every SDK failure is translated, none escapes raw but not-found
                if isinstance(exc, docker.errors.APIError) and classify(exc) in _PASSED_THROUGH:
                    metrics.DOCKER_CALLS.labels(outcome="not_found").inc()
                    raise
                error = translate(exc, docker_host=self.docker_host)
                unavailable = isinstance(error, DockerUnavailableError)
                metrics.DOCKER_CALLS.labels(outcome="unavailable" if unavailable else "error").inc()
                if isinstance(error, DockerUnavailableError):
                    # The pool's connections died with the engine: start over with fresh ones.
                    await self.close()
                raise error from exc
            metrics.DOCKER_CALLS.labels(outcome="ok").inc()
            return result

        if not (idempotent and self._retries):
            return await attempt()
        return await ENGINE_RETRY.call(attempt, _is_transient, before_sleep=_retrying(getattr(fn, "__name__", str(fn))))

    def _own(self) -> dict[str, list[str]]:
        """The engine's filter for what this daemon's instance made."""
        return {"label": [f"{LABEL_MANAGED}=true", f"{LABEL_INSTANCE}={self.instance}"]}

    async def _own_containers(self) -> list[dict[str, Any]]:
        """This instance's containers in every state, as the engine lists them (summaries)."""
        listed: list[dict[str, Any]] = await self._call(
            self._api().containers, all=True, filters=self._own(), idempotent=True
        )
        return listed

    def _name(self, workspace_id: str) -> str:
        """The workspace's container's name (a claimed member is renamed so), and a fresh one's volume's."""
        return f"sandboxd-{self.instance}-{workspace_id}"

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        url = urlparse(self.docker_host)
        try:
            # A large reader limit: a fast command's output must not pause the transport every 128 KiB.
            if url.scheme == "unix":
                return await asyncio.open_unix_connection(url.path, limit=_STREAM_LIMIT)
            if url.scheme in {"tcp", "http"}:
                return await asyncio.open_connection(url.hostname, url.port or 2375, limit=_STREAM_LIMIT)
        except OSError as exc:
            msg = f"Docker engine unreachable at {self.docker_host}: {reason(exc)}"
            raise DockerUnavailableError(msg) from exc
        msg = f"Docker engine address {self.docker_host!r}: only unix:// and tcp:// are supported for exec streams"
        raise DockerUnavailableError(msg)

    async def _hijack(
        self, path: str, body: bytes, doing: str
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
        """POST ``path`` asking the engine to upgrade the connection to a raw stream; return it and the HTTP status."""
        reader, writer = await self._connect()
        request = (
            f"POST /v{API_VERSION}/{path} HTTP/1.1\r\n"
            "Host: docker\r\nContent-Type: application/json\r\n"
            "Connection: Upgrade\r\nUpgrade: tcp\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        try:
            writer.write(request + body)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
        except (OSError, asyncio.IncompleteReadError) as exc:
            writer.close()
            msg = f"Docker engine at {self.docker_host} hung up {doing}: {reason(exc)}"
            raise DockerUnavailableError(msg) from exc
        except BaseException:
            writer.close()  # cancelled (the daemon stopping): the connection must not outlive its loop
            raise
        return reader, writer, int(head.split(b" ", 2)[1])

    async def close(self) -> None:
        """Release the SDK's connection pool."""
        if self._api_client is not None:
            await asyncio.to_thread(self._api_client.close)
            self._api_client = None


def _retrying(call: str) -> Callable[[tenacity.RetryCallState], None]:
    """What a retry of an engine call says: a log line and a count."""

    def said(state: tenacity.RetryCallState) -> None:
        metrics.DOCKER_RETRIES.inc()
        log.warning("retry.scheduled", call=call, attempt=state.attempt_number)

    return said


def _parse_time(text: str) -> datetime.datetime:
    # Docker gives nanoseconds ("2024-01-01T00:00:00.123456789Z"); Python takes micro.
    head, _, frac = text.rstrip("Z").partition(".")
    micro = (frac + "000000")[:6]
    return datetime.datetime.fromisoformat(f"{head}.{micro}").replace(tzinfo=datetime.UTC)
