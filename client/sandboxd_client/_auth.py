"""Channel set-up: Unix socket or TLS over TCP, and the bearer token on every call."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc

__all__ = ["TLSOptions", "open_channel"]

RECONNECT_BACKOFF_MAX_MS = 1000
"""Longest wait between reconnection attempts to a daemon that went away, in milliseconds.

gRPC's default grows to 120 s, so a client that lived through a daemon restart would fail
every call for up to half a minute after the daemon serves again; a daemon on this machine
(or one TLS handshake away) is worth a try every second."""

_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS),
    # Subchannels (and their backoff) are shared process-wide by default: a client made after an
    # outage would inherit an old one's wait. Each channel keeps its own.
    ("grpc.use_local_subchannel_pool", 1),
]


@dataclasses.dataclass(frozen=True)
class TLSOptions:
    """TLS for a TCP address (the daemon serves TCP only over TLS).

    Attributes:
        ca_file: PEM bundle that signed the daemon's certificate; empty means the system roots.
        cert_file: PEM client certificate, for daemons that require mutual TLS.
        key_file: PEM key of ``cert_file``.
        server_name: name to check the daemon's certificate against, when it differs from the host.
    """

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> TLSOptions:
        """``SANDBOXD_TLS_CA``, ``SANDBOXD_TLS_CERT``, ``SANDBOXD_TLS_KEY``, ``SANDBOXD_TLS_SERVER_NAME``."""
        return cls(
            ca_file=environ.get("SANDBOXD_TLS_CA", ""),
            cert_file=environ.get("SANDBOXD_TLS_CERT", ""),
            key_file=environ.get("SANDBOXD_TLS_KEY", ""),
            server_name=environ.get("SANDBOXD_TLS_SERVER_NAME", ""),
        )

    def credentials(self) -> grpc.ChannelCredentials:
        """Channel credentials; raises ``ValueError`` naming a file that cannot be read."""
        if bool(self.cert_file) != bool(self.key_file):
            msg = "a client certificate needs both cert_file and key_file"
            raise ValueError(msg)
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file) if self.ca_file else None,
            private_key=_read(self.key_file) if self.key_file else None,
            certificate_chain=_read(self.cert_file) if self.cert_file else None,
        )


def _read(path: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as exc:
        msg = f"cannot read {path}: {exc.strerror}"
        raise ValueError(msg) from None


class _Bearer:
    """Adds ``authorization: Bearer TOKEN`` to every call (also over the Unix socket, which has no TLS)."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(*self._header)
        return grpc.aio.ClientCallDetails(
            method=details.method,
            timeout=details.timeout,
            metadata=metadata,
            credentials=details.credentials,
            wait_for_ready=details.wait_for_ready,
        )


# grpc.aio files each interceptor under the first call kind it implements, so one class per kind.
class _BearerUnaryUnary(_Bearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._details(client_call_details), request)


class _BearerUnaryStream(_Bearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._details(client_call_details), request)


class _BearerStreamUnary(_Bearer, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


class _BearerStreamStream(_Bearer, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


def open_channel(address: str, *, token: str = "", tls: TLSOptions | None = None) -> grpc.aio.Channel:
    """A channel to ``address``: plain over ``unix:``, TLS over TCP.

    Args:
        address: ``unix:/path`` or ``HOST:PORT``.
        token: bearer token sent with every call; empty sends none.
        tls: TLS settings for TCP; None means the system roots and no client certificate.

    Raises:
        ValueError: a TLS file cannot be read, or TLS options were given for a Unix socket.
    """
    interceptors: list[grpc.aio.ClientInterceptor] | None = None
    if token:
        interceptors = [
            kind(token) for kind in (_BearerUnaryUnary, _BearerUnaryStream, _BearerStreamUnary, _BearerStreamStream)
        ]
    if address.startswith("unix:"):
        if tls is not None and tls != TLSOptions():
            msg = "TLS options apply to TCP addresses only; the Unix socket is protected by its file mode"
            raise ValueError(msg)
        return grpc.aio.insecure_channel(address, options=_OPTIONS, interceptors=interceptors)
    tls = tls or TLSOptions()
    options: list[tuple[str, Any]] = list(_OPTIONS)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.aio.secure_channel(address, tls.credentials(), options=options, interceptors=interceptors)
