"""Python client of the sandboxd daemon.

``SandboxClient`` is the async entry point; ``Workspace`` handles run commands
(``exec`` returns an ``ExecHandle`` to iterate for live events or to ``wait()``
for an ``ExecResult``). Errors are the ``SandboxError`` tree in ``errors``.
"""

from ._client import ProcessInfo, SandboxClient, Workspace, WorkspaceInfo
from ._exec import (
    CommandFailedError,
    Dropped,
    ExecEvent,
    ExecHandle,
    ExecResult,
    Exited,
    Heartbeat,
    Output,
    Started,
    Yielded,
)
from ._paths import default_socket_path
from .errors import (
    AlreadyExistsError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    SandboxError,
    UnauthenticatedError,
    UnavailableError,
)

__all__ = [
    "AlreadyExistsError",
    "CommandFailedError",
    "DeadlineExceededError",
    "Dropped",
    "ExecEvent",
    "ExecHandle",
    "ExecResult",
    "Exited",
    "FailedPreconditionError",
    "Heartbeat",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "Output",
    "PermissionDeniedError",
    "ProcessInfo",
    "ResourceExhaustedError",
    "SandboxClient",
    "SandboxError",
    "Started",
    "UnauthenticatedError",
    "UnavailableError",
    "Workspace",
    "WorkspaceInfo",
    "Yielded",
    "default_socket_path",
]

__version__ = "0.1.0"
