"""Python client of the sandboxd daemon.

``SandboxClient`` is the async entry point (``SyncSandboxClient`` a blocking
façade); ``Workspace`` handles run commands (``exec`` returns an ``ExecHandle``
to iterate for live events or to ``wait()`` for an ``ExecResult``) and work on
files. Errors are the ``SandboxError`` tree in ``errors``.

For agent engines: ``Environment`` runs the built-in tool calls (``tools``) with
``Approval`` and a ``Trace``; ``exports`` gives OpenAI and Anthropic schemas,
``config`` reads ``system_config.yaml``, ``mcp_server`` serves MCP.
"""

import os as _os

# gRPC core prints some routine events (a failed TLS handshake, a GOAWAY) at INFO on
# stderr unless told otherwise; its documented default is ERROR. Set before grpc loads,
# and only when the caller has not chosen.
_os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from ._auth import TLSOptions
from ._client import (
    EditResult,
    FileInfo,
    ImageResult,
    PoolClassInfo,
    ProcessInfo,
    ReadResult,
    SandboxClient,
    SnapshotInfo,
    TemplateBuildResult,
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
from ._forward import PortForward
from ._paths import default_socket_path
from .approval import Approval, ApprovalDecision
from .environment import (
    Environment,
    ToolCallOutput,
    ToolCallPartial,
    ToolCallStart,
    ToolCallStop,
    ToolEvent,
)
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
    StreamBrokenError,
    UnauthenticatedError,
    UnavailableError,
)
from .sync import SyncSandboxClient
from .tools import (
    BuiltinTool,
    ToolCall,
    ToolDefinitionConfig,
    ToolExecutionContext,
    ToolResult,
    default_tools,
)
from .trace import Trace

__all__ = [
    "AlreadyExistsError",
    "Approval",
    "ApprovalDecision",
    "BuiltinTool",
    "CommandFailedError",
    "DeadlineExceededError",
    "Dropped",
    "EditResult",
    "Environment",
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
    "PoolClassInfo",
    "PortForward",
    "ProcessInfo",
    "ReadResult",
    "ResourceExhaustedError",
    "SandboxClient",
    "SandboxError",
    "SnapshotInfo",
    "Started",
    "StreamBrokenError",
    "SyncSandboxClient",
    "TLSOptions",
    "TemplateBuildResult",
    "ToolCall",
    "ToolCallOutput",
    "ToolCallPartial",
    "ToolCallStart",
    "ToolCallStop",
    "ToolDefinitionConfig",
    "ToolEvent",
    "ToolExecutionContext",
    "ToolResult",
    "Trace",
    "UnauthenticatedError",
    "UnavailableError",
    "Workspace",
    "WorkspaceInfo",
    "WriteResult",
    "Yielded",
    "default_socket_path",
    "default_tools",
]

__version__ = "0.1.0"
