"""The outermost layer: the call's log context, its one ``rpc.finished`` line, and the RPC metrics."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog

from ... import metrics
from .._types import Context
from ._call import CallState, Status, is_quiet
from ._layer import Layer

__all__ = ["AccessLog"]

log = structlog.get_logger("sandboxd.rpc")


class AccessLog(Layer):
    """Binds ``request_id``/``rpc``/``peer`` to every log line of a call; logs and counts how it ended.

    ``request_id`` is the caller's ``x-request-id`` metadata, or 16 random hex digits. The
    ``rpc.finished`` line has the status code, ``duration_s`` (seconds, 4 decimals) and any
    message; a health check or reflection call that succeeds logs none. A process stream's
    events are counted as they pass: time to its start, output bytes, dropped bytes, its end.
    """

    opens_call = True

    @contextlib.asynccontextmanager
    async def around(self, state: CallState, request: Any, context: Context) -> AsyncIterator[Any]:
        """Bind the log context first of all; log and count the outcome last of all."""
        structlog.contextvars.clear_contextvars()
        metadata = dict(tuple(context.invocation_metadata() or ()))
        request_id = str(metadata.get("x-request-id") or secrets.token_hex(8))
        structlog.contextvars.bind_contextvars(request_id=request_id, rpc=state.method, peer=context.peer())
        try:
            yield request
        except BaseException as exc:
            _finished(state, state.outcome(exc))
            raise
        else:
            _finished(state, state.outcome(None))
        finally:
            state.request = None  # the call is over: nothing need keep its request (a 16 MiB write)

    def on_response(self, state: CallState, response: Any) -> None:
        """What a process stream's response tells the metrics: a start, drops, an end.

        Output bytes are counted where the output is (``ProcessServicer``): reading a response's
        bytes field here made a copy of every chunk.
        """
        kind = response.WhichOneof("event") if "event" in response.DESCRIPTOR.oneofs_by_name else None
        if kind == "started":
            metrics.EXEC_START_SECONDS.observe(time.monotonic() - state.start)
        elif kind == "dropped":
            metrics.OUTPUT_DROPPED_BYTES.inc(response.dropped.dropped_bytes)
        elif kind == "exited":
            exited = response.exited
            reason = exited.DESCRIPTOR.fields_by_name["stop_reason"].enum_type.values_by_number[exited.stop_reason]
            metrics.PROCESS_ENDS.labels(stop_reason=reason.name.removeprefix("STOP_REASON_").lower()).inc()
            if exited.oom_killed:
                metrics.OOM_KILLS.inc()


def _finished(state: CallState, status: Status) -> None:
    elapsed = state.elapsed_s()
    metrics.RPC_REQUESTS.labels(method=state.rpc, code=status.code.name).inc()
    metrics.RPC_SECONDS.labels(method=state.rpc).observe(elapsed)
    if is_quiet(state.method) and status.code == grpc.StatusCode.OK:
        return
    fields: dict[str, Any] = {"code": status.code.name, "duration_s": round(elapsed, 4)}
    if status.message:
        fields["message"] = status.message
    log.info("rpc.finished", **fields)
