"""The error layer: every exception a call raises becomes its gRPC status, set on the context.

Every SandboxdError becomes its declared gRPC status with its message. Any other exception
becomes INTERNAL with a generic message; its traceback goes to the log only, never onto the
wire.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
import structlog

from ...errors import QUOTED_CHARS, SandboxdError
from ...logging import cut_text
from .._types import Context
from ._call import CallState, Status
from ._layer import Layer

__all__ = ["MAX_STATUS_MESSAGE_CHARS", "ErrorStatus"]

log = structlog.get_logger("sandboxd.rpc")

MAX_STATUS_MESSAGE_CHARS = 2000
"""Longest status message sent: gRPC carries it in trailers, and HTTP/2 bounds their size."""

_INTERNAL_MESSAGE = "internal error in sandboxd; the daemon log has the details"


class ErrorStatus(Layer):
    """Answers a call that raised with the status its exception maps to, and records it on the call.

    The status is set on the context and the handler returns (a unary call returns None,
    sent as an empty message): that, rather than raising ``context.abort()``'s exception,
    matters for memory, since that exception chained to the original keeps the frames, and
    with them the request (a 16 MiB WriteFile), in a reference cycle until the cyclic
    collector happens to run. A handler's own ``context.abort()`` passes through, its status
    recorded.
    """

    @contextlib.asynccontextmanager
    async def around(self, state: CallState, request: Any, context: Context) -> AsyncIterator[Any]:
        """Turn an exception from the layers below or the servicer into the call's status."""
        try:
            yield request
        except Exception as exc:
            _answer(context, state, exc, request)

    def unary_serializer(self, serializer: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
        """A refused unary call returns None with its status set: nothing to serialise."""
        return None if serializer is None else _none_as_empty(serializer)


def _answer(context: Context, state: CallState, exc: Exception, request: Any) -> None:
    """Set the status ``exc`` maps to, and note it on ``state``; re-raise an abort.

    Raises:
        grpc.aio.AbortError: ``exc`` itself, when a handler aborted on purpose (its status is set).
    """
    if isinstance(exc, grpc.aio.AbortError):
        state.status = Status(context.code() or grpc.StatusCode.UNKNOWN)
        raise exc
    if isinstance(exc, SandboxdError):
        # The request as admitted (parsed), when the call got that far.
        subject = state.request if state.request is not None else request
        code, message = exc.grpc_code, _caller_facing(exc.message, subject)
        state.status = Status(code, message)
    else:
        code, message = grpc.StatusCode.INTERNAL, _INTERNAL_MESSAGE
        state.status = Status(code)
        log.error("rpc.internal_error", exc_info=exc)
    traceback.clear_frames(exc.__traceback__)
    context.set_code(code)
    context.set_details(message)


def _none_as_empty(serializer: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    def serialize(response: Any) -> bytes:
        return b"" if response is None else serializer(response)

    return serialize


def _strings(value: Any) -> Iterator[str]:
    """Every string in a request: fields, map keys and values, repeated and nested ones."""
    if isinstance(value, str):
        yield value
    elif hasattr(value, "ListFields"):
        for _field, item in value.ListFields():
            yield from _strings(item)
    elif hasattr(value, "items"):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif not isinstance(value, bytes | int | float) and hasattr(value, "__iter__"):
        for item in value:
            yield from _strings(item)


def _caller_facing(message: str, request: Any) -> str:
    """``message`` with every long value of the request shortened, and the whole cut to a bound.

    A status travels in HTTP/2 trailers, and a message must not grow with what the caller
    sent (a 4000-byte path in "…: No such file or directory"), wherever it was written.
    """
    if hasattr(request, "ListFields"):
        long = {value for value in _strings(request) if QUOTED_CHARS < len(value) <= len(message)}
        for value in sorted(long, key=len, reverse=True):
            message = message.replace(value, f"{value[:QUOTED_CHARS]}… ({len(value)} characters)")
    return cut_text(message, MAX_STATUS_MESSAGE_CHARS)
