"""The base of every interceptor of the daemon: one job around a call, whatever the call's kind.

gRPC has four kinds of handler (unary or streaming, each way). A layer writes its job once,
as :meth:`Layer.around` (what happens before the call, and after it however it ends) and
:meth:`Layer.on_response` (what each response tells it); the base wraps all four kinds with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from .._types import Context
from ._call import CallState, current_call, open_call

__all__ = ["Behavior", "Layer"]

Behavior = Callable[..., Any]
"""A handler's behaviour: ``(request or request iterator, context)`` to a response or a response iterator."""


class Layer(grpc.aio.ServerInterceptor):
    """A server interceptor doing one job around each call (the jobs, in order: :mod:`sandboxd.api.interceptors`)."""

    opens_call = False
    """True for the outermost layer, which begins the call's :class:`CallState`."""

    def around(self, state: CallState, request: Any, context: Context) -> contextlib.AbstractAsyncContextManager[Any]:
        """The job around one call: entered before the call, left after it, however it ends.

        Args:
            state: the call's shared state.
            request: the request (or, for a client-streaming call, the request iterator) as
                the layer above passes it.
            context: the call's context.

        Returns:
            An async context manager whose value is the request to pass on. Leaving it with
            an exception suppressed ends the call there (its status must then be set).
        """
        return _passing(request)

    def on_response(self, state: CallState, response: Any) -> None:
        """Note one response on its way out: each of a stream's, or a unary call's result."""

    def request_deserializer(
        self, deserializer: Callable[[bytes], Any] | None, method: str
    ) -> Callable[[bytes], Any] | None:
        """The deserializer for ``method``'s requests (the one from below, unless the layer reads requests)."""
        return deserializer

    def unary_serializer(self, serializer: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
        """The serializer of a unary response (the one from below, unless the layer may return None)."""
        return serializer

    def request_stream(self, behavior: Behavior) -> Behavior:
        """The behaviour of a client-streaming call, given its request iterator (unchanged by default)."""
        return behavior

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Wrap the handler of one RPC (the layers below have wrapped it already)."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        deserializer = self.request_deserializer(handler.request_deserializer, method)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, method),
                request_deserializer=deserializer,
                response_serializer=self.unary_serializer(handler.response_serializer),
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(handler.unary_stream, method),  # type: ignore[arg-type]
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        # Client-streaming calls (Upload) are wrapped the same way: the first argument is
        # then the request iterator instead of a request.
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(self.request_stream(handler.stream_unary), method),
                request_deserializer=deserializer,
                response_serializer=self.unary_serializer(handler.response_serializer),
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._stream(self.request_stream(handler.stream_stream), method),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _state(self, method: str) -> CallState:
        return open_call(method) if self.opens_call else current_call(method)

    def _unary(self, behavior: Callable[..., Awaitable[Any]], method: str) -> Callable[..., Awaitable[Any]]:
        async def unary(request: Any, context: Context) -> Any:
            state = self._state(method)
            async with self.around(state, request, context) as passed:
                response = await behavior(passed, context)
                if state.status is None:  # else a layer below answered the call, with no response
                    self.on_response(state, response)
                return response
            return None  # this layer answered the call: its status is set

        return unary

    def _stream(self, behavior: Callable[..., AsyncIterator[Any]], method: str) -> Callable[..., AsyncIterator[Any]]:
        async def stream(request: Any, context: Context) -> AsyncIterator[Any]:
            state = self._state(method)
            async with self.around(state, request, context) as passed:
                responses = behavior(passed, context)
                try:
                    async for response in responses:
                        self.on_response(state, response)
                        yield response
                except GeneratorExit:
                    # gRPC closes the stream this way when a write to a caller who went away
                    # fails. The layers below end first, the servicer's own end (what it
                    # records, a forward's byte counts) first of all, then this one's.
                    close = getattr(responses, "aclose", None)
                    if close is not None:
                        with contextlib.suppress(Exception):
                            await close()
                    raise

        return stream


@contextlib.asynccontextmanager
async def _passing(request: Any) -> AsyncIterator[Any]:
    yield request
