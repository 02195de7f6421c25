"""The daemon's server interceptors: one job each, applied to every call in one order.

:func:`server_interceptors` builds them; gRPC runs the first as the outermost::

    AccessLog        binds request_id/rpc/peer for every log line; rpc.finished and the RPC metrics
      AuditTrail     opens the audit record; writes a state-changing call's line with its outcome
        ErrorStatus  SandboxdError -> its status and message; anything else -> INTERNAL, logged
          Authentication   bearer token -> tenant (UNAUTHENTICATED); then the call is admitted
            DrainGate      counts the call for the graceful stop; refuses it once stopping
              RequestBounds  size caps and unreadable requests, refused with their own status
                (servicer)

Why this order: the access log is outermost so that everything below logs with the call's
context and its one line covers every outcome. The audit trail sits above authentication
so that a refused attempt is on record, and both record the status the error layer chose
(which it notes on the call's shared state, :mod:`._call`). Every refusal below the error
layer is a SandboxdError, so it reaches the caller as its status. A call is authenticated
before the drain counts it and before its request is refused as unreadable: a caller
without a token learns nothing else. Health checks and reflection are never authenticated,
audited or drained.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from ...audit import AuditLog
from ...memory import HeapTrimmer
from ...tenancy import Authenticator
from .access import AccessLog
from .auditing import AuditTrail
from .auth import Authentication
from .bounds import RequestBounds
from .drain import Drain, DrainGate
from .status import MAX_STATUS_MESSAGE_CHARS, ErrorStatus

__all__ = [
    "MAX_STATUS_MESSAGE_CHARS",
    "AccessLog",
    "AuditTrail",
    "Authentication",
    "Drain",
    "DrainGate",
    "ErrorInterceptor",
    "ErrorStatus",
    "RequestBounds",
    "server_interceptors",
]


def server_interceptors(
    authenticator: Authenticator | None = None,
    audit: AuditLog | None = None,
    trimmer: HeapTrimmer | None = None,
    drain: Drain | None = None,
) -> list[grpc.aio.ServerInterceptor]:
    """The daemon's interceptors in their order, outermost first (see the module docstring).

    Args:
        authenticator: turns a call's bearer token into its tenant (None: every caller is
            ``default``).
        audit: where state-changing calls are recorded (None: nowhere).
        trimmer: told the size, in bytes, of every large request, so that its memory is given back.
        drain: the graceful stop every call but health and reflection is counted in.

    Returns:
        A list to pass as ``grpc.aio.server(interceptors=...)``.
    """
    return [
        AccessLog(),
        AuditTrail(audit),
        ErrorStatus(),
        Authentication(authenticator),
        DrainGate(drain),
        RequestBounds(trimmer),
    ]


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """All of :func:`server_interceptors`, in their order, as one interceptor.

    The daemon installed one interceptor of this name before its jobs were split; it is
    kept for code that installs a single interceptor (the unit tests' in-process servers).
    The arguments are those of :func:`server_interceptors`.
    """

    def __init__(
        self,
        authenticator: Authenticator | None = None,
        audit: AuditLog | None = None,
        trimmer: HeapTrimmer | None = None,
        drain: Drain | None = None,
    ) -> None:
        """Build the layers."""
        self.layers = server_interceptors(authenticator, audit, trimmer, drain)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Run the layers as gRPC runs a list of interceptors: the first is the outermost."""
        return await _chained(self.layers, continuation, handler_call_details)


async def _chained(
    layers: Sequence[grpc.aio.ServerInterceptor],
    continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
    handler_call_details: grpc.HandlerCallDetails,
) -> grpc.RpcMethodHandler[Any, Any] | None:
    if not layers:
        return await continuation(handler_call_details)
    rest = functools.partial(_chained, layers[1:], continuation)
    return await layers[0].intercept_service(rest, handler_call_details)
