"""The request layer: what a request may cost before it is read, and refusing one that cannot be read.

A message larger than its RPC takes (``sandboxd_protocol.limits``) is never parsed: it costs
its bytes and nothing more. One larger than ``EAGER_BYTES`` waits unread
(:class:`~sandboxd.api.interceptors._call.Unparsed`) until its caller has authenticated.
Either way, a request that cannot be read is refused with its own status once the call is
admitted, so that the refusal is authenticated and audited like any other.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from sandboxd_protocol.limits import request_limit

from ...errors import InvalidSpecError, RequestTooLargeError
from ...memory import HeapTrimmer
from .._types import Context
from ._call import CallState, Malformed, Unparsed
from ._layer import Behavior, Layer

__all__ = ["EAGER_BYTES", "RequestBounds"]

EAGER_BYTES = 64 * 1024
"""Requests up to this size are parsed before authentication, so that a refused attempt's
audit line still names what it tried (the workspace, the command)."""


class RequestBounds(Layer):
    """Reads requests within their RPC's bound, and refuses those it could not read.

    Args:
        trimmer: told the size of every large request, so that their memory is given back.
    """

    def __init__(self, trimmer: HeapTrimmer | None = None) -> None:
        """Note large requests to ``trimmer``."""
        self.trimmer = trimmer

    def request_deserializer(
        self, deserializer: Callable[[bytes], Any] | None, method: str
    ) -> Callable[[bytes], Any] | None:
        """``deserializer`` made tolerant: see :func:`_tolerant`."""
        return _tolerant(deserializer, method.rsplit("/", 1)[-1], self.trimmer)

    @contextlib.asynccontextmanager
    async def around(self, state: CallState, request: Any, context: Context) -> AsyncIterator[Any]:
        """Refuse a request that was refused unread (raises its InvalidSpecError or RequestTooLargeError)."""
        _refuse_malformed(request)
        yield request

    def request_stream(self, behavior: Behavior) -> Behavior:
        """For client-streaming calls: a malformed message in the request stream refuses the call.

        The call has authenticated before its stream is read, so each message is parsed as it comes.
        """

        def wrapper(request_iterator: AsyncIterator[Any], context: Context) -> Any:
            async def checked() -> AsyncIterator[Any]:
                async for request in request_iterator:
                    message = request.parse() if isinstance(request, Unparsed) else request
                    _refuse_malformed(message)
                    yield message

            return behavior(checked(), context)

        return wrapper


def _tolerant(
    deserializer: Callable[[bytes], Any] | None, rpc: str, trimmer: HeapTrimmer | None = None
) -> Callable[[bytes], Any] | None:
    """Wrap a request deserializer: oversized or undecodable bytes become :class:`Malformed`.

    A message larger than ``rpc`` takes is never parsed; one larger than ``EAGER_BYTES``
    becomes :class:`Unparsed`. gRPC would answer a deserializer's exception with UNKNOWN and
    the exception's text; bad wire format and invalid UTF-8 in a string field are the
    caller's mistake.
    """
    if deserializer is None:
        return None
    message_type = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    name = message_type.full_name if message_type is not None else "request"
    limit = request_limit(rpc)

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception:  # protobuf raises DecodeError, or RuntimeError on some builds
            return Malformed(
                InvalidSpecError(
                    f"malformed request: not a valid {name} message (bad wire format, or invalid UTF-8 in a "
                    "string field)"
                )
            )

    def deserialize(data: bytes) -> Any:
        if trimmer is not None and len(data) > EAGER_BYTES:
            trimmer.note(len(data))
        if len(data) > limit:
            hint = "; larger files go through Upload (sandboxctl cp)" if rpc == "WriteFile" else ""
            return Malformed(
                RequestTooLargeError(f"the {rpc} request is {len(data)} bytes; {rpc} takes at most {limit}{hint}")
            )
        return Unparsed(data, parse) if len(data) > EAGER_BYTES else parse(data)

    return deserialize


def _refuse_malformed(request: Any) -> None:
    """Raise the error of a request refused unread."""
    if isinstance(request, Malformed):
        raise request.error
