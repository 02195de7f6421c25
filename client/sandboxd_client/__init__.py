"""Python client of the sandboxd daemon.

``SandboxClient`` is the async entry point; ``Workspace`` handles run commands
(``exec`` returns an ``ExecHandle`` to iterate for live events or to ``wait()``
for an ``ExecResult``). Errors are the ``SandboxError`` tree in ``errors``.
"""

from ._client import (
    EditResult,
    FileInfo,
    ImageResult,
    ProcessInfo,
    ReadResult,
    SandboxClient,
    Workspace,
    WorkspaceInfo,
    WriteResult,
)
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
    "EditResult",
    "ExecEvent",
    "ExecHandle",
    "ExecResult",
    "Exited",
    "FailedPreconditionError",
    "FileInfo",
    "Heartbeat",
    "ImageResult",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "Output",
    "PermissionDeniedError",
    "ProcessInfo",
    "ReadResult",
    "ResourceExhaustedError",
    "SandboxClient",
    "SandboxError",
    "Started",
    "UnauthenticatedError",
    "UnavailableError",
    "Workspace",
    "WorkspaceInfo",
    "WriteResult",
    "Yielded",
    "default_socket_path",
]

__version__ = "0.1.0"
