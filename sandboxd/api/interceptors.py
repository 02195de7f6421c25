"""Server interceptor: request context for logs, error mapping, one access-log line per RPC.

Every SandboxdError becomes its declared gRPC status with its message. Any
other exception becomes INTERNAL with a generic message; its traceback goes to
the log only, never onto the wire.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc
import structlog

from ..errors import SandboxdError
from ._types import Context

__all__ = ["ErrorInterceptor"]

log = structlog.get_logger("sandboxd.rpc")

_HEALTH_AND_REFLECTION = ("/grpc.health.", "/grpc.reflection.")


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Binds ``request_id``/``rpc``/``peer``, maps errors to statuses, logs ``rpc.finished``."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Wrap the handler of one RPC."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        quiet = method.startswith(_HEALTH_AND_REFLECTION)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary, method, quiet),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream, method, quiet),  # type: ignore[arg-type]
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        # Client-streaming calls (Upload) get the same treatment: the first argument is
        # then the request iterator instead of a request.
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                _wrap_unary(handler.stream_unary, method, quiet),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                _wrap_stream(handler.stream_stream, method, quiet),  # type: ignore[arg-type]
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


def _begin(context: Context, method: str) -> float:
    structlog.contextvars.clear_contextvars()
    metadata = dict(context.invocation_metadata() or ())
    request_id = str(metadata.get("x-request-id") or secrets.token_hex(8))
    structlog.contextvars.bind_contextvars(request_id=request_id, rpc=method, peer=context.peer())
    return time.monotonic()


async def _fail(context: Context, start: float, quiet: bool, exc: Exception) -> NoReturn:
    """Log the outcome and abort the RPC with the status ``exc`` maps to."""
    if isinstance(exc, grpc.aio.AbortError):  # a handler aborted on purpose: already a status
        _finish(start, context.code() or grpc.StatusCode.UNKNOWN, quiet)
        raise exc
    if isinstance(exc, SandboxdError):
        _finish(start, exc.grpc_code, quiet, exc.message)
        await context.abort(exc.grpc_code, exc.message)
    _finish(start, grpc.StatusCode.INTERNAL, quiet)
    log.error("rpc.internal_error", exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, "internal error in sandboxd; the daemon log has the details")


def _finish(start: float, code: grpc.StatusCode, quiet: bool, message: str = "") -> None:
    if quiet and code == grpc.StatusCode.OK:
        return
    fields: dict[str, Any] = {"code": code.name, "duration_s": round(time.monotonic() - start, 4)}
    if message:
        fields["message"] = message
    log.info("rpc.finished", **fields)


def _wrap_unary(behavior: Callable[..., Awaitable[Any]], method: str, quiet: bool) -> Callable[..., Awaitable[Any]]:
    async def wrapper(request: Any, context: Context) -> Any:
        start = _begin(context, method)
        try:
            response = await behavior(request, context)
        except asyncio.CancelledError:
            _finish(start, grpc.StatusCode.CANCELLED, quiet)
            raise
        except Exception as exc:
            await _fail(context, start, quiet, exc)
        _finish(start, grpc.StatusCode.OK, quiet)
        return response

    return wrapper


def _wrap_stream(
    behavior: Callable[..., AsyncIterator[Any]], method: str, quiet: bool
) -> Callable[..., AsyncIterator[Any]]:
    async def wrapper(request: Any, context: Context) -> AsyncIterator[Any]:
        start = _begin(context, method)
        try:
            async for response in behavior(request, context):
                yield response
        except asyncio.CancelledError:
            _finish(start, grpc.StatusCode.CANCELLED, quiet)
            raise
        except Exception as exc:
            await _fail(context, start, quiet, exc)
        _finish(start, grpc.StatusCode.OK, quiet)

    return wrapper
