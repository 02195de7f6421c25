"""What goes wrong between the daemon and a workspace's agent."""

from __future__ import annotations

import grpc

from ..errors import FailedPreconditionError, SandboxdError

__all__ = [
    "AgentBehindEngine",
    "AgentLost",
    "FileOperationError",
    "FileOperationRefused",
    "ForwardError",
    "ProtocolError",
]


class ProtocolError(SandboxdError):
    """The agent sent something the protocol does not allow."""


class AgentLost(FailedPreconditionError):
    """The workspace's agent cannot be reached right now (or was restarted)."""


class AgentBehindEngine(AgentLost):
    """The agent cannot be reached because the Docker engine cannot (restarting): UNAVAILABLE.

    An :class:`AgentLost` still, so that whatever waits out a lost agent (a reconnect, a
    resent start) waits this out too; but the caller is told what it is, as for any call
    made while the engine is away.
    """

    grpc_code = grpc.StatusCode.UNAVAILABLE


class FileOperationError(FailedPreconditionError):
    """The agent could not run a file operation (its helper did not start, or the call broke)."""


class FileOperationRefused(SandboxdError):
    """The file operation failed in the container, as its helper says.

    ``code`` is one of ``internal/fileops``' codes: ``not_found``, ``permission``,
    ``exists``, ``is_directory``, ``not_directory``, ``invalid``, ``not_empty``, ``busy``, ``binary``,
    ``too_large``, ``conflict``, ``network``, ``no_space``, ``io``...
    """

    def __init__(self, code: str, message: str) -> None:
        """Carry the helper's code and message."""
        super().__init__(message)
        self.code = code


class ForwardError(FailedPreconditionError):
    """A forwarded connection could not be opened, or failed: ``code`` is the agent's.

    ``refused`` (nothing listens on the port), ``io`` (the connection failed), ``protocol``,
    or ``lost`` (the connection to the agent broke).
    """

    def __init__(self, code: str, message: str) -> None:
        """Carry the agent's code and message."""
        super().__init__(message)
        self.code = code
