"""Error mapping and the access log, on a real in-process gRPC server (no Docker).

The servicer runs over a stand-in WorkspaceManager that only raises: this pins
the error contract of the RPC layer, not any container behaviour.
"""

from __future__ import annotations

import grpc
import pytest
import structlog
from sandboxd_client._pb.sandboxd.v1 import workspace_service_pb2 as wpb
from sandboxd_client._pb.sandboxd.v1 import workspace_service_pb2_grpc as wgrpc

from sandboxd import errors
from sandboxd.api.interceptors import ErrorInterceptor
from sandboxd.api.workspaces import WorkspaceServicer


class RaisingManager:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    async def get(self, workspace_id: str) -> None:
        raise self.exc


async def _call(tmp_path, exc: BaseException) -> grpc.aio.AioRpcError:  # type: ignore[no-untyped-def]
    server = grpc.aio.server(interceptors=[ErrorInterceptor()])
    wgrpc.add_WorkspaceServiceServicer_to_server(WorkspaceServicer(RaisingManager(exc)), server)  # type: ignore[arg-type]
    address = f"unix:{tmp_path}/s.sock"
    server.add_insecure_port(address)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await wgrpc.WorkspaceServiceStub(channel).GetWorkspace(wpb.GetWorkspaceRequest(workspace_id="x"))
            return caught.value
    finally:
        await server.stop(0)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (errors.WorkspaceNotFoundError("workspace 'x' not found"), grpc.StatusCode.NOT_FOUND),
        (errors.InvalidSpecError("bad"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.WorkspaceExistsError("exists"), grpc.StatusCode.ALREADY_EXISTS),
        (errors.WorkspaceNotRunningError("stopped"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.QuotaExceededError("full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (errors.DockerUnavailableError("down"), grpc.StatusCode.UNAVAILABLE),
        (errors.ExecTimeoutError("late"), grpc.StatusCode.DEADLINE_EXCEEDED),
    ],
)
async def test_sandboxd_errors_keep_code_and_message(tmp_path, exc, code) -> None:
    """Each error class reaches the wire as its declared status with its message."""
    error = await _call(tmp_path, exc)
    assert (error.code(), error.details()) == (code, exc.message)


async def test_unexpected_error_is_internal_without_traceback(tmp_path) -> None:
    """An unexpected exception is INTERNAL with a generic message; the details stay in the log."""
    with structlog.testing.capture_logs() as logs:
        error = await _call(tmp_path, RuntimeError("secret internals at /srv/x.py line 3"))
    assert error.code() == grpc.StatusCode.INTERNAL
    assert "secret internals" not in error.details()
    assert "Traceback" not in error.details()
    assert any(entry["event"] == "rpc.internal_error" for entry in logs)


async def test_one_access_line_per_rpc(tmp_path) -> None:
    """Every RPC logs exactly one rpc.finished line with its code and method."""
    with structlog.testing.capture_logs() as logs:
        await _call(tmp_path, errors.WorkspaceNotFoundError("nope"))
    finished = [entry for entry in logs if entry["event"] == "rpc.finished"]
    assert len(finished) == 1
    assert finished[0]["code"] == "NOT_FOUND"
