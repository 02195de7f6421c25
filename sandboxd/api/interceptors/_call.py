"""What the interceptors of one call share: its state, its outcome, and the request before it is read.

The layers are separate gRPC interceptors, and gRPC passes nothing between them but the
request and the context. The state of the call being served lives in a context variable
instead: the outermost layer opens it, and every layer of the same call sees the same one.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import grpc

from ...errors import SandboxdError

__all__ = ["CallState", "Malformed", "Status", "Unparsed", "current_call", "is_quiet", "open_call"]

_HEALTH_AND_REFLECTION = ("/grpc.health.", "/grpc.reflection.")


def is_quiet(method: str) -> bool:
    """Whether ``method`` is a health check or reflection: never authenticated, audited or drained."""
    return method.startswith(_HEALTH_AND_REFLECTION)


@dataclasses.dataclass(frozen=True)
class Status:
    """How a call ended, as the access log, the metrics and the audit trail record it.

    Attributes:
        code: the gRPC status.
        message: the message recorded with it; empty for OK, CANCELLED and INTERNAL (whose
            wire message is a generic one, with the details in the daemon log only).
    """

    code: grpc.StatusCode
    message: str = ""


@dataclasses.dataclass(frozen=True)
class Malformed:
    """Stands in for a request that is refused unread, so that the call can refuse it cleanly."""

    error: SandboxdError


class Unparsed:
    """A large request's bytes, parsed only once its caller has authenticated.

    A caller without a valid token then costs the bytes gRPC already holds, never the
    copies parsing makes (a 16 MiB WriteFile is several).
    """

    __slots__ = ("_data", "_parse")

    def __init__(self, data: bytes, parse: Callable[[bytes], Any]) -> None:
        """Hold ``data`` until :meth:`parse`; ``parse`` returns the message or :class:`Malformed`."""
        self._data, self._parse = data, parse

    def parse(self) -> Any:
        """The request, or :class:`Malformed`; the bytes are let go either way."""
        data, self._data = self._data, b""
        return self._parse(data)


AdmitHook = Callable[[Any, bool], None]
"""Called with the admitted request, and whether it was read only then (it was :class:`Unparsed`)."""


class CallState:
    """One call as its interceptors see it.

    Attributes:
        method: the full method name, ``/sandboxd.v1.WorkspaceService/CreateWorkspace``.
        start: ``time.monotonic()`` when the call began, then again once it is admitted:
            durations and the time to a command's start measure the call's own work, not
            its authentication or the parsing of its request.
        status: how the call ended, once a layer has answered it (an error, the drain);
            None while it runs, and for a call that ends normally or is cancelled.
        request: the request once admitted (read, if it was :class:`Unparsed`); None before.
    """

    __slots__ = ("_elapsed_s", "_hooks", "method", "request", "start", "status")

    def __init__(self, method: str) -> None:
        """A call of ``method`` beginning now."""
        self.method = method
        self.start = time.monotonic()
        self.status: Status | None = None
        self.request: Any = None
        self._hooks: list[AdmitHook] = []
        self._elapsed_s: float | None = None

    @property
    def rpc(self) -> str:
        """The method's own name: ``CreateWorkspace``."""
        return self.method.rsplit("/", 1)[-1]

    def on_admit(self, hook: AdmitHook) -> None:
        """Have ``hook`` called once the call is admitted (see :meth:`admit`)."""
        self._hooks.append(hook)

    def admit(self, request: Any) -> Any:
        """Let the call in once its caller is known: read the request if it waits unread.

        Returns:
            The request (parsed now if it was :class:`Unparsed`; it may be :class:`Malformed`).
        """
        late = isinstance(request, Unparsed)
        if late:
            request = request.parse()
        self.request = request
        for hook in self._hooks:
            hook(request, late)
        self.start = time.monotonic()
        return request

    def outcome(self, exc: BaseException | None) -> Status:
        """How the call ended, given the exception leaving a layer (None: it returned)."""
        if self.status is not None:
            return self.status
        if exc is None:
            return Status(grpc.StatusCode.OK)
        if isinstance(exc, asyncio.CancelledError | GeneratorExit):
            return Status(grpc.StatusCode.CANCELLED)
        return Status(grpc.StatusCode.UNKNOWN)  # nothing else passes the error layer

    def elapsed_s(self) -> float:
        """Seconds from :attr:`start` to the first time this is asked: every record of the call gives one duration."""
        if self._elapsed_s is None:
            self._elapsed_s = time.monotonic() - self.start
        return self._elapsed_s


_CURRENT: contextvars.ContextVar[CallState | None] = contextvars.ContextVar("sandboxd_call", default=None)


def open_call(method: str) -> CallState:
    """Begin the state of a call of ``method`` in the current context (the outermost layer does this)."""
    state = CallState(method)
    _CURRENT.set(state)
    return state


def current_call(method: str) -> CallState:
    """The state of the call being served; a layer installed alone opens its own."""
    state = _CURRENT.get()
    if state is None or state.method != method:
        state = open_call(method)
    return state
