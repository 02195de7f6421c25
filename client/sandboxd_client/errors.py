"""Client-side errors and the one table that maps gRPC status codes onto them.

::

    SandboxError
    ├── InvalidArgumentError        INVALID_ARGUMENT
    ├── NotFoundError               NOT_FOUND
    ├── AlreadyExistsError          ALREADY_EXISTS
    ├── FailedPreconditionError     FAILED_PRECONDITION
    ├── ResourceExhaustedError      RESOURCE_EXHAUSTED
    ├── UnavailableError            UNAVAILABLE
    ├── UnauthenticatedError        UNAUTHENTICATED
    ├── PermissionDeniedError       PERMISSION_DENIED
    ├── DeadlineExceededError       DEADLINE_EXCEEDED
    ├── InternalError               INTERNAL, UNKNOWN and anything unlisted
    └── CommandFailedError          (a non-zero exit with check=True; also an ExecResult)

A call cancelled by its caller ends in ``asyncio.CancelledError``, as any cancelled
awaitable does (gRPC raises it itself). A call the *daemon* ended with CANCELLED (which gRPC
does to calls that arrive as a daemon stops) is an :class:`UnavailableError`: a cancel the
caller never asked for must not look like one, and UNAVAILABLE is what it means, retried as
such.
"""

from __future__ import annotations

import grpc

__all__ = [
    "AlreadyExistsError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "SandboxError",
    "StreamBrokenError",
    "UnauthenticatedError",
    "UnavailableError",
    "from_rpc_error",
]


class SandboxError(Exception):
    """Root of every error the client raises."""

    def __init__(self, message: str, *, code: grpc.StatusCode | None = None) -> None:
        """Create the error with the daemon's ``message`` and status ``code``."""
        super().__init__(message)
        self.message = message
        self.code = code


class InvalidArgumentError(SandboxError):
    """The daemon rejected a request field."""


class NotFoundError(SandboxError):
    """No such workspace or process (or it was evicted or lost)."""


class AlreadyExistsError(SandboxError):
    """A workspace with that id exists."""


class FailedPreconditionError(SandboxError):
    """The object is not in a state that allows the call."""


class ResourceExhaustedError(SandboxError):
    """A cap or quota is reached."""


class UnavailableError(SandboxError):
    """The daemon, or the Docker engine behind it, cannot be reached."""

    workspace_id: str = ""
    """Of a create that got no answer: the id it asked for (the workspace may exist); else empty."""
    request_id: str = ""
    """Of a create that got no answer: its request id, to repeat it with; else empty."""


class StreamBrokenError(UnavailableError):
    """A command's stream broke and the daemon did not come back in time: the command may still run.

    Go on with ``client.input(process_id, resume_from=resume_from)``: its output continues
    after the last byte this stream gave, and its exit is the real one.
    """

    def __init__(self, message: str, *, process_id: str, resume_from: int) -> None:
        """Say which process to attach to, and from where."""
        super().__init__(message, code=grpc.StatusCode.UNAVAILABLE)
        self.process_id = process_id
        """The command's process id."""
        self.resume_from = resume_from
        """The output position after the last event received (0: none)."""


class UnauthenticatedError(SandboxError):
    """Missing or bad credentials."""


class PermissionDeniedError(SandboxError):
    """The caller may not do this."""


class DeadlineExceededError(SandboxError):
    """The call outlived its deadline."""


class InternalError(SandboxError):
    """The daemon failed unexpectedly; its log has the details."""


_ERRORS: dict[grpc.StatusCode, type[SandboxError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
}


def from_rpc_error(error: grpc.RpcError) -> SandboxError:
    """Return the exception to raise for a failed call.

    A status of CANCELLED reaches here only from the daemon's side (a caller's own cancel
    is raised by gRPC as ``asyncio.CancelledError`` and never becomes an ``RpcError``), so
    it is an :class:`UnavailableError`.
    """
    code = error.code() if hasattr(error, "code") else None
    details = (error.details() if hasattr(error, "details") else None) or str(code)
    if code == grpc.StatusCode.CANCELLED:
        message = f"the daemon ended the call ({details}): it may be stopping or restarting"
        return UnavailableError(message, code=grpc.StatusCode.UNAVAILABLE)
    cls = _ERRORS.get(code, InternalError) if code is not None else InternalError
    return cls(details, code=code)
