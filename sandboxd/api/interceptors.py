"""Server interceptor: request context for logs, authentication, error mapping, audit, one access line per RPC.

Every SandboxdError becomes its declared gRPC status with its message. Any
other exception becomes INTERNAL with a generic message; its traceback goes to
the log only, never onto the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import secrets
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
import structlog
from sandboxd_protocol.limits import request_limit

from .. import metrics
from ..audit import STATE_CHANGING, AuditLog, audit_fields, set_audit_tenant, start_audit
from ..errors import QUOTED_CHARS, DaemonStoppingError, InvalidSpecError, RequestTooLargeError, SandboxdError
from ..logging import cut_text
from ..memory import HeapTrimmer
from ..tenancy import Authenticator, reset_tenant, tenant_scope
from ._types import Context

__all__ = ["Drain", "ErrorInterceptor"]

log = structlog.get_logger("sandboxd.rpc")

_HEALTH_AND_REFLECTION = ("/grpc.health.", "/grpc.reflection.")
MAX_STATUS_MESSAGE_CHARS = 2000
"""Longest status message sent: gRPC carries it in trailers, and HTTP/2 bounds their size."""


_YIELD_S = 1.0
"""How long the calls streaming commands get to yield once the grace is over."""


class Drain:
    """The daemon's graceful stop as its calls see it (SIGTERM; ``SANDBOXD_SHUTDOWN_GRACE_S``).

    Once :meth:`run` begins, a new call is refused with UNAVAILABLE by the daemon itself,
    while the server still accepts connections: stopping the server outright instead makes
    gRPC cancel whatever arrives in that moment, which callers see as CANCELLED, a word they
    take for their own cancel. Calls in flight get the grace to end. Then a call streaming a
    command yields (its final event names the process, to poll once a daemon serves again:
    C13); any other still running (a forward, an upload) ends with UNAVAILABLE saying so.
    Health checks and reflection are never refused: health says NOT_SERVING.
    """

    def __init__(self) -> None:
        """Nothing is stopping yet."""
        self.stopping = False
        self.expired = False
        self._grace_s = 0.0
        self._calls: dict[asyncio.Task[Any], Context] = {}
        self._idle = asyncio.Event()

    def enter(self, context: Context) -> bool:
        """Count a call in; return False when it is not counted (no task: a test's direct call).

        Raises:
            DaemonStoppingError: the daemon is stopping.
        """
        if self.stopping:
            msg = "the daemon is stopping; call again once a daemon serves (a successor adopts the workspaces)"
            raise DaemonStoppingError(msg)
        task = asyncio.current_task()
        if task is None:
            return False
        self._calls[task] = context
        return True

    def leave(self) -> None:
        """Count the current call out."""
        task = asyncio.current_task()
        if task is not None:
            self._calls.pop(task, None)
        if self.stopping and not self._calls:
            self._idle.set()

    async def run(self, grace_s: float, *, expiring: Callable[[], None] = lambda: None) -> None:
        """Refuse new calls, wait up to ``grace_s`` for those in flight, then end the rest (UNAVAILABLE).

        ``expiring`` is called when the grace is over, and given a moment to end calls its own
        way (a command's stream yields, with its process id); the rest are then ended.
        """
        self.stopping, self._grace_s = True, grace_s
        if not self._calls:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), grace_s)
            return
        expiring()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), _YIELD_S)
            return
        self.expired = True
        message = (
            f"the daemon stopped before this call ended (its shutdown grace is {self._grace_s:g} s); "
            "a command it started runs on in its workspace, for the next daemon to adopt"
        )
        for task, context in list(self._calls.items()):
            context.set_code(grpc.StatusCode.UNAVAILABLE)
            context.set_details(message)
            task.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), 2.0)


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Binds ``request_id``/``rpc``/``peer``, authenticates, maps errors to statuses, logs ``rpc.finished``.

    Args:
        authenticator: turns a call's bearer token into its tenant (health and
            reflection need none).
        audit: where state-changing calls are recorded.
        trimmer: told the size of every large request, so that their memory is given back.
        drain: the graceful stop every call but health and reflection is counted in.
    """

    def __init__(
        self,
        authenticator: Authenticator | None = None,
        audit: AuditLog | None = None,
        trimmer: HeapTrimmer | None = None,
        drain: Drain | None = None,
    ) -> None:
        """Configure authentication, auditing, memory trimming and the graceful stop."""
        self.authenticator = authenticator or Authenticator()
        self.audit = audit
        self.trimmer = trimmer
        self.drain = drain or Drain()

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
        audited = self.audit is not None and self.audit.enabled and method.rsplit("/", 1)[-1] in STATE_CHANGING
        call = _Call(
            method,
            quiet,
            None if quiet else self.authenticator,
            self.audit if audited else None,
            None if quiet else self.drain,
        )
        deserializer = _tolerant(handler.request_deserializer, method.rsplit("/", 1)[-1], self.trimmer)
        # A refused unary call returns None with its status set (see _fail): nothing to serialise.
        serializer = handler.response_serializer
        unary_serializer = None if serializer is None else _none_as_empty(serializer)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary, call),
                request_deserializer=deserializer,
                response_serializer=unary_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream, call),  # type: ignore[arg-type]
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        # Client-streaming calls (Upload) get the same treatment: the first argument is
        # then the request iterator instead of a request.
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                _wrap_unary(_checked_stream(handler.stream_unary), call),
                request_deserializer=deserializer,
                response_serializer=unary_serializer,
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                _wrap_stream(_checked_stream(handler.stream_stream), call),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


@dataclasses.dataclass(frozen=True)
class _Malformed:
    """Stands in for a request that is refused unread, so that the call can refuse it cleanly."""

    error: SandboxdError


class _Unparsed:
    """A large request's bytes, parsed only once its caller has authenticated.

    A caller without a valid token then costs the bytes gRPC already holds, never the
    copies parsing makes (a 16 MiB WriteFile is several).
    """

    __slots__ = ("_data", "_parse")

    def __init__(self, data: bytes, parse: Callable[[bytes], Any]) -> None:
        self._data, self._parse = data, parse

    def parse(self) -> Any:
        """The request, or :class:`_Malformed`; the bytes are let go either way."""
        data, self._data = self._data, b""
        return self._parse(data)


_EAGER_BYTES = 64 * 1024
"""Requests up to this size are parsed before authentication, so that a refused attempt's
audit line still names what it tried (the workspace, the command)."""


def _none_as_empty(serializer: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    def serialize(response: Any) -> bytes:
        return b"" if response is None else serializer(response)

    return serialize


def _tolerant(
    deserializer: Callable[[bytes], Any] | None, rpc: str, trimmer: HeapTrimmer | None = None
) -> Callable[[bytes], Any] | None:
    """Wrap a request deserializer: oversized or undecodable bytes become :class:`_Malformed`.

    A message larger than ``rpc`` takes (``sandboxd_protocol.limits``) is never parsed: it
    costs its bytes and nothing more; one larger than ``_EAGER_BYTES`` waits as
    :class:`_Unparsed` until the caller has authenticated. gRPC would answer a
    deserializer's exception with UNKNOWN and the exception's text; bad wire format and
    invalid UTF-8 in a string field are the caller's mistake.
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
            return _Malformed(
                InvalidSpecError(
                    f"malformed request: not a valid {name} message (bad wire format, or invalid UTF-8 in a "
                    "string field)"
                )
            )

    def deserialize(data: bytes) -> Any:
        if trimmer is not None and len(data) > _EAGER_BYTES:
            trimmer.note(len(data))
        if len(data) > limit:
            hint = "; larger files go through Upload (sandboxctl cp)" if rpc == "WriteFile" else ""
            return _Malformed(
                RequestTooLargeError(f"the {rpc} request is {len(data)} bytes; {rpc} takes at most {limit}{hint}")
            )
        return _Unparsed(data, parse) if len(data) > _EAGER_BYTES else parse(data)

    return deserialize


def _parsed(request: Any) -> Any:
    """The request itself: an :class:`_Unparsed` one is parsed now (its caller has authenticated)."""
    return request.parse() if isinstance(request, _Unparsed) else request


def _refuse_malformed(request: Any) -> None:
    """The status of a request refused unread (checked after authentication, so it is audited)."""
    if isinstance(request, _Malformed):
        raise request.error


def _checked_stream(behavior: Callable[..., Any]) -> Callable[..., Any]:
    """For client-streaming calls: a malformed message in the request stream refuses the call.

    The call has authenticated before its stream is read, so each message is parsed as it comes.
    """

    def wrapper(request_iterator: AsyncIterator[Any], context: Context) -> Any:
        async def checked() -> AsyncIterator[Any]:
            async for request in request_iterator:
                message = _parsed(request)
                _refuse_malformed(message)
                yield message

        return behavior(checked(), context)

    return wrapper


@dataclasses.dataclass(frozen=True)
class _Call:
    method: str
    quiet: bool
    authenticator: Authenticator | None
    audit: AuditLog | None
    drain: Drain | None


def _begin(context: Context, call: _Call, request: Any) -> tuple[float, contextvars.Token[str] | None, Any]:
    """Bind the log context, start the audit record, authenticate (raises UnauthenticatedError).

    Returns:
        The start time, the tenant scope to reset, and the request, parsed if it was not yet.
    """
    structlog.contextvars.clear_contextvars()
    metadata = tuple(context.invocation_metadata() or ())
    request_id = str(dict(metadata).get("x-request-id") or secrets.token_hex(8))
    structlog.contextvars.bind_contextvars(request_id=request_id, rpc=call.method, peer=context.peer())
    start_audit(call.method, context.peer())
    unparsed = isinstance(request, _Unparsed)
    if call.audit is not None and not unparsed:
        _audit_request(request)  # before authenticating: refused attempts are audited too
    scope = None
    if call.authenticator is not None:
        tenant = call.authenticator.tenant(metadata)
        structlog.contextvars.bind_contextvars(tenant=tenant)
        set_audit_tenant(tenant)
        scope = tenant_scope(tenant)
    if unparsed:
        request = _parsed(request)
        if call.audit is not None:
            _audit_request(request)
    if call.audit is not None and call.method.endswith("/CreateWorkspace"):
        call.audit.begin()  # a crash mid-create still leaves the attempt on record
    return time.monotonic(), scope, request


_AUDITED_REQUEST_FIELDS = (
    "workspace_id",
    "name",
    "from_snapshot",
    "process_id",
    "command",
    "workdir",
    "path",
    "source_path",
    "destination_path",
    "signal",
    "replace_all",
    "recursive",
)


def _audit_request(request: Any) -> None:
    """Record what a request names (never stdin or file contents, only their sizes)."""
    descriptor = getattr(request, "DESCRIPTOR", None)
    if descriptor is None:  # a client stream (Upload): its servicer records the target
        return
    names = descriptor.fields_by_name
    audit_fields(**{name: getattr(request, name) for name in _AUDITED_REQUEST_FIELDS if name in names})
    for name in ("chars", "data", "content"):
        if name in names and getattr(request, name):
            audit_fields(input_bytes=len(getattr(request, name)))
    if "chars" in names and request.chars == "\u0003":
        audit_fields(ctrl_c=True)


def _audit_response(response: Any) -> None:
    """Record outcomes: a new workspace's id, a process id, exit code and stop reason, a yield."""
    names = response.DESCRIPTOR.fields_by_name
    if "workspace" in names and response.HasField("workspace"):
        audit_fields(workspace_id=response.workspace.workspace_id)
    if "started" in names and response.HasField("started"):
        audit_fields(process_id=response.started.process_id)
    if "yielded" in names and response.HasField("yielded"):
        audit_fields(yielded=True)
    if "exited" in names and response.HasField("exited"):
        exited = response.exited
        stop_reason = exited.DESCRIPTOR.fields_by_name["stop_reason"].enum_type.values_by_number[exited.stop_reason]
        audit_fields(
            exit_code=exited.exit_code,
            signal=exited.signal or None,
            stop_reason=stop_reason.name.removeprefix("STOP_REASON_").lower(),
            oom_killed=exited.oom_killed or None,
        )


def _count_response(response: Any, start: float) -> None:
    """What a process stream's response tells the metrics: a start, output, drops, an end."""
    kind = response.WhichOneof("event") if "event" in response.DESCRIPTOR.oneofs_by_name else None
    if kind == "started":
        metrics.EXEC_START_SECONDS.observe(time.monotonic() - start)
    elif kind == "output":
        for stream in ("stdout", "stderr"):
            if size := len(getattr(response.output, stream)):
                metrics.OUTPUT_BYTES.labels(stream=stream).inc(size)
    elif kind == "dropped":
        metrics.OUTPUT_DROPPED_BYTES.inc(response.dropped.dropped_bytes)
    elif kind == "exited":
        exited = response.exited
        reason = exited.DESCRIPTOR.fields_by_name["stop_reason"].enum_type.values_by_number[exited.stop_reason]
        metrics.PROCESS_ENDS.labels(stop_reason=reason.name.removeprefix("STOP_REASON_").lower()).inc()
        if exited.oom_killed:
            metrics.OOM_KILLS.inc()


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


def _fail(context: Context, start: float, call: _Call, exc: Exception, request: Any = None) -> None:
    """Log the outcome and set the status ``exc`` maps to; the handler then returns.

    Setting the status rather than raising ``context.abort()``'s exception matters for
    memory: that exception chained to ``exc`` keeps the frames, and with them the request
    (a 16 MiB WriteFile), in a reference cycle until the cyclic collector happens to run.
    """
    if isinstance(exc, grpc.aio.AbortError):  # a handler aborted on purpose: already a status
        _finish(start, context.code() or grpc.StatusCode.UNKNOWN, call)
        raise exc
    if isinstance(exc, SandboxdError):
        code, message = exc.grpc_code, _caller_facing(exc.message, request)
        _finish(start, code, call, message)
    else:
        code, message = grpc.StatusCode.INTERNAL, "internal error in sandboxd; the daemon log has the details"
        _finish(start, code, call)
        log.error("rpc.internal_error", exc_info=exc)
    traceback.clear_frames(exc.__traceback__)
    context.set_code(code)
    context.set_details(message)


def _finish(start: float, code: grpc.StatusCode, call: _Call, message: str = "") -> None:
    elapsed = time.monotonic() - start
    method = call.method.rsplit("/", 1)[-1]
    metrics.RPC_REQUESTS.labels(method=method, code=code.name).inc()
    metrics.RPC_SECONDS.labels(method=method).observe(elapsed)
    duration = round(elapsed, 4)
    if call.audit is not None:
        call.audit.finish(code=code.name, duration_s=duration, message=message)
    if call.quiet and code == grpc.StatusCode.OK:
        return
    fields: dict[str, Any] = {"code": code.name, "duration_s": duration}
    if message:
        fields["message"] = message
    log.info("rpc.finished", **fields)


def _wrap_unary(behavior: Callable[..., Awaitable[Any]], call: _Call) -> Callable[..., Awaitable[Any]]:
    async def wrapper(request: Any, context: Context) -> Any:
        start, scope, counted = time.monotonic(), None, False
        try:
            start, scope, request = _begin(context, call, request)
            counted = call.drain is not None and call.drain.enter(context)
            _refuse_malformed(request)
            response = await behavior(request, context)
            if call.audit is not None:
                _audit_response(response)
        except asyncio.CancelledError:
            if _ended_by_drain(call, start):
                return None
            _finish(start, grpc.StatusCode.CANCELLED, call)
            raise
        except Exception as exc:
            _fail(context, start, call, exc, request)
            return None
        finally:
            if scope is not None:
                reset_tenant(scope)
            if counted and call.drain is not None:
                call.drain.leave()
        _finish(start, grpc.StatusCode.OK, call)
        return response

    return wrapper


def _wrap_stream(behavior: Callable[..., AsyncIterator[Any]], call: _Call) -> Callable[..., AsyncIterator[Any]]:
    async def wrapper(request: Any, context: Context) -> AsyncIterator[Any]:
        start, scope, counted = time.monotonic(), None, False
        responses: AsyncIterator[Any] | None = None
        try:
            start, scope, request = _begin(context, call, request)
            counted = call.drain is not None and call.drain.enter(context)
            _refuse_malformed(request)
            responses = behavior(request, context)
            async for response in responses:
                _count_response(response, start)
                if call.audit is not None:
                    _audit_response(response)
                    if call.method.endswith("/Exec") and response.HasField("started"):
                        call.audit.begin()  # the command runs now, whatever becomes of this call
                yield response
        except asyncio.CancelledError:
            if _ended_by_drain(call, start):
                return
            _finish(start, grpc.StatusCode.CANCELLED, call)
            raise
        except GeneratorExit:
            # gRPC closes the stream this way when a write to a caller who went away fails: the
            # servicer's own end (what it records, a forward's byte counts) comes before the record.
            close = getattr(responses, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()
            _finish(start, grpc.StatusCode.CANCELLED, call)
            raise
        except Exception as exc:
            _fail(context, start, call, exc, request)
            return
        finally:
            if scope is not None:
                reset_tenant(scope)
            if counted and call.drain is not None:
                call.drain.leave()
        _finish(start, grpc.StatusCode.OK, call)

    return wrapper


def _ended_by_drain(call: _Call, start: float) -> bool:
    """Whether a cancel is the drain's, ending the call at the shutdown grace (its status is set)."""
    if call.drain is None or not call.drain.expired:
        return False
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()  # the drain's cancel is answered: the call ends with its status
    _finish(start, grpc.StatusCode.UNAVAILABLE, call, "the daemon stopped before this call ended")
    return True
