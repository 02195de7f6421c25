"""The E2B plane's one way into sandboxd: its own gRPC API, over the daemon's Unix socket.

Every E2B call becomes calls on sandboxd's services with the caller's credential, so what the
gRPC API enforces (authentication, the tenant's scope and quotas, the audit trail, request
bounds, the drain) holds for the E2B plane by construction, not by a second copy of the rules.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import posixpath
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from protobuf import Oneof
from sandboxd_protocol.v1 import (
    file_service_pb2_grpc,
    network_service_pb2_grpc,
    process_service_pb2_grpc,
    workspace_service_pb2_grpc,
)
from sandboxd_protocol.v1 import workspace_service_pb2 as wpb

__all__ = ["Caller", "Gateway", "caller_from_headers", "connect_error", "http_status", "mapped_errors", "oneof"]

# A workspace's working directory never changes; the cache is bounded and forgets removed ones.
_WORKING_DIRS = 4096
_WORKING_DIR_TTL_S = 300.0
# The daemon's own bounds apply to each call; these only have to let the largest through.
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# gRPC and Connect share their codes; Connect spells them in lower case (and CANCELED once).
_CODES = {status: Code[status.name.replace("CANCELLED", "CANCELED")] for status in grpc.StatusCode if status.value[0]}

# E2B's REST API and envd's /files answer with HTTP statuses (its SDK maps them to exceptions).
_HTTP = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


def oneof(field: str, value: object) -> Any:
    """A protobuf-py oneof value (the generated types name each field as a literal type)."""
    return Oneof(field, value)


def connect_error(error: grpc.aio.AioRpcError) -> ConnectError:
    """The Connect error an E2B client gets for a failed sandboxd call: same code, same words."""
    return ConnectError(_CODES.get(error.code(), Code.UNKNOWN), error.details() or error.code().name.lower())


@contextlib.contextmanager
def mapped_errors() -> Iterator[None]:
    """Sandboxd's errors, raised as Connect errors of the same code and words."""
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        raise connect_error(exc) from None


def http_status(error: grpc.aio.AioRpcError) -> int:
    """The HTTP status E2B's REST API and /files use for a failed sandboxd call."""
    return _HTTP.get(error.code(), 500)


@dataclass(frozen=True)
class Caller:
    """Who an E2B request speaks for, in sandboxd's terms.

    Attributes:
        token: the sandboxd bearer token (E2B's API key, or the access token it was given back
            as ``envdAccessToken``); empty when the request carried none.
        user: the user envd's ``Authorization: Basic`` header names (``base64("user:")``), or
            ``/files``' ``username``; empty means the workspace's own user.
    """

    token: str = ""
    user: str = ""

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The gRPC metadata that carries the token (none without one)."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


def caller_from_headers(headers: Mapping[str, str], *, user: str = "") -> Caller:
    """The caller of an E2B request: ``X-API-Key`` (control plane) or ``X-Access-Token`` (envd).

    Args:
        headers: the request's headers (any case).
        user: a user named outside the headers (``/files``' ``username``), which wins.

    Raises:
        ConnectError: INVALID_ARGUMENT for an ``Authorization`` header that is not Basic.
    """
    lowered = {key.lower(): value for key, value in headers.items()}
    token = lowered.get("x-api-key") or lowered.get("x-access-token") or ""
    if not user and (authorization := lowered.get("authorization", "")):
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() != "basic":
            raise ConnectError(Code.INVALID_ARGUMENT, "the Authorization header must be Basic base64(USER:)")
        try:
            user = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")[0]
        except (binascii.Error, UnicodeDecodeError):
            raise ConnectError(Code.INVALID_ARGUMENT, "the Authorization header is not valid base64") from None
    return Caller(token=token.strip(), user=user)


class Gateway:
    """sandboxd's services, as the E2B plane calls them.

    Args:
        socket_path: the daemon's Unix socket (always served, whatever else it listens on).
    """

    def __init__(self, socket_path: str) -> None:
        self.channel = grpc.aio.insecure_channel(
            f"unix:{socket_path}",
            options=[
                ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
            ],
        )
        self.workspaces = workspace_service_pb2_grpc.WorkspaceServiceStub(self.channel)
        self.processes = process_service_pb2_grpc.ProcessServiceStub(self.channel)
        self.files = file_service_pb2_grpc.FileServiceStub(self.channel)
        self.network = network_service_pb2_grpc.NetworkServiceStub(self.channel)
        self._working_dirs: dict[str, tuple[str, float]] = {}

    async def resolve(self, workspace_id: str, caller: Caller, path: str) -> str:
        """``path`` as envd means it: a relative one (``~`` too) is the workspace's working directory's.

        sandboxd reads a relative path against ``/workspace``; envd against the user's home,
        which E2B's base template makes the working directory. A workspace that cannot be read
        leaves the path as it is: the call made with it then fails as it should.
        """
        if path.startswith("/"):
            return path
        if path == "~" or path.startswith("~/"):
            path = path[2:]
        base = await self._working_dir(workspace_id, caller)
        return posixpath.normpath(posixpath.join(base, path)) if base else path

    async def workspace(self, workspace_id: str, caller: Caller) -> wpb.Workspace:
        """The workspace as ``caller`` may see it (``GetWorkspace``); its working directory is kept.

        Raises:
            grpc.aio.AioRpcError: sandboxd's refusal (NOT_FOUND for another tenant's too).
        """
        got = await self.workspaces.GetWorkspace(
            wpb.GetWorkspaceRequest(workspace_id=workspace_id), metadata=caller.metadata()
        )
        if workspace_id not in self._working_dirs and len(self._working_dirs) >= _WORKING_DIRS:
            self._working_dirs.pop(next(iter(self._working_dirs)))
        self._working_dirs[workspace_id] = (got.workspace.spec.working_dir, time.monotonic())
        workspace: wpb.Workspace = got.workspace
        return workspace

    async def _working_dir(self, workspace_id: str, caller: Caller) -> str:
        known = self._working_dirs.get(workspace_id)
        if known is not None and time.monotonic() - known[1] < _WORKING_DIR_TTL_S:
            return known[0]
        try:
            return (await self.workspace(workspace_id, caller)).spec.working_dir
        except grpc.aio.AioRpcError:
            return ""

    async def close(self) -> None:
        """Close the channel (calls in flight end with CANCELLED)."""
        await self.channel.close()
