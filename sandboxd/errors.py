"""Errors the daemon raises, each carrying the gRPC status it maps to.

The hierarchy::

    SandboxdError                          INTERNAL
    ├── InvalidSpecError                   INVALID_ARGUMENT
    ├── NotFoundError                      NOT_FOUND
    │   ├── WorkspaceNotFoundError
    │   ├── ProcessNotFoundError
    │   ├── ImageNotFoundError
    │   └── PathNotFoundError
    ├── AlreadyExistsError                 ALREADY_EXISTS
    │   ├── WorkspaceExistsError
    │   └── PathExistsError
    ├── PermissionDeniedError              PERMISSION_DENIED
    ├── UnauthenticatedError               UNAUTHENTICATED
    ├── FailedPreconditionError            FAILED_PRECONDITION
    │   ├── WorkspaceNotRunningError
    │   └── ProcessExitedError
    ├── QuotaExceededError                 RESOURCE_EXHAUSTED
    │   └── RequestTooLargeError
    ├── DockerUnavailableError             UNAVAILABLE
    ├── BackendError                       INTERNAL
    └── ExecTimeoutError                   DEADLINE_EXCEEDED

Every message is written for the caller: it says what was wrong and, where it
helps, what to do. One interceptor turns these into gRPC statuses; anything
else becomes INTERNAL with a generic message and its traceback goes to the log
only. A value from the request is quoted with :func:`quoted`, so that no message
(nor the log line and audit entry that repeat it) grows with what a caller sent.
"""

from __future__ import annotations

from typing import ClassVar

import grpc

__all__ = [
    "QUOTED_CHARS",
    "AlreadyExistsError",
    "BackendError",
    "BuildFailedError",
    "DaemonStoppingError",
    "DockerUnavailableError",
    "ExecTimeoutError",
    "FailedPreconditionError",
    "ImageNotFoundError",
    "InvalidSpecError",
    "LeaseHeldError",
    "NotFoundError",
    "PathExistsError",
    "PathNotFoundError",
    "PermissionDeniedError",
    "ProcessExitedError",
    "ProcessNotFoundError",
    "QuotaExceededError",
    "RequestTooLargeError",
    "SandboxdError",
    "UnauthenticatedError",
    "WorkspaceExistsError",
    "WorkspaceNotFoundError",
    "WorkspaceNotRunningError",
    "quoted",
]

QUOTED_CHARS = 64
"""Most characters of a caller's value repeated in a message."""


def quoted(value: str, limit: int = QUOTED_CHARS) -> str:
    """``repr(value)``, cut to its first ``limit`` characters with the full length said.

    >>> quoted("ws-1")
    "'ws-1'"
    >>> quoted("x" * 100, 4)
    "'xxxx…' (100 characters)"
    """
    if len(value) <= limit:
        return repr(value)
    shown = repr(value[:limit])
    return f"{shown[:-1]}…{shown[-1]} ({len(value)} characters)"


class SandboxdError(Exception):
    """Root of every error the daemon reports to callers."""

    grpc_code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        """Create the error with a caller-facing ``message``."""
        super().__init__(message)
        self.message = message


class InvalidSpecError(SandboxdError):
    """A request field is malformed or out of range."""

    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(SandboxdError):
    """The named object does not exist (or is not visible to the caller)."""

    grpc_code = grpc.StatusCode.NOT_FOUND


class WorkspaceNotFoundError(NotFoundError):
    """No workspace with that id."""


class ProcessNotFoundError(NotFoundError):
    """No process session with that id (never existed, evicted, or lost)."""


class ImageNotFoundError(NotFoundError):
    """The image is not present and could not be pulled."""


class PathNotFoundError(NotFoundError):
    """No such file or directory in the workspace."""


class AlreadyExistsError(SandboxdError):
    """The object to create exists already."""

    grpc_code = grpc.StatusCode.ALREADY_EXISTS


class WorkspaceExistsError(AlreadyExistsError):
    """A workspace with the requested id already exists."""


class PathExistsError(AlreadyExistsError):
    """The destination path exists and may not be replaced."""


class PermissionDeniedError(SandboxdError):
    """The workspace user may not do this (file permissions), or the caller may not."""

    grpc_code = grpc.StatusCode.PERMISSION_DENIED


class UnauthenticatedError(SandboxdError):
    """The call carries no valid credentials."""

    grpc_code = grpc.StatusCode.UNAUTHENTICATED


class FailedPreconditionError(SandboxdError):
    """The object is not in a state that allows the call."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION


class WorkspaceNotRunningError(FailedPreconditionError):
    """The workspace's container is not running."""


class ProcessExitedError(FailedPreconditionError):
    """The process has already exited."""


class BuildFailedError(FailedPreconditionError):
    """An image build's step failed (a command's non-zero exit, a COPY of what the context lacks).

    Args:
        message: the caller-facing message, with the step's last output.
        step: the failing step, counted from 1 (0: not known).
    """

    def __init__(self, message: str, *, step: int = 0) -> None:
        super().__init__(message)
        self.step = step


class QuotaExceededError(SandboxdError):
    """A configured cap (sessions, workspaces, memory) is reached."""

    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class RequestTooLargeError(QuotaExceededError):
    """A request message is larger than its RPC takes (see ``sandboxd_protocol.limits``)."""


class LeaseHeldError(FailedPreconditionError):
    """Another daemon holds this instance label on the engine (``sandboxd.lease``)."""

    def __init__(self, message: str, holder: str) -> None:
        """``holder``: the lease's ``sandboxd.lease`` label, as the other daemon wrote it (JSON)."""
        super().__init__(message)
        self.holder = holder


class DaemonStoppingError(SandboxdError):
    """The daemon is stopping (SIGTERM): the call was refused, or ended at the shutdown grace."""

    grpc_code = grpc.StatusCode.UNAVAILABLE


class DockerUnavailableError(SandboxdError):
    """The Docker engine cannot be reached."""

    grpc_code = grpc.StatusCode.UNAVAILABLE


class BackendError(SandboxdError):
    """The container engine refused or failed an operation.

    Args:
        message: the caller-facing message.
        transient: whether the same call may succeed if retried (the engine failed rather
            than refused: an HTTP 5xx); idempotent calls are retried on it.
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class ExecTimeoutError(SandboxdError):
    """An operation outlived its deadline."""

    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED
