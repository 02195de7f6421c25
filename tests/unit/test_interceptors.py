"""Error mapping and the access log, on a real in-process gRPC server (no Docker).

The servicer runs over a stand-in WorkspaceManager that only raises: this pins
the error contract of the RPC layer, not any container behaviour.
"""

from __future__ import annotations

import grpc
import pytest
import structlog
from sandboxd_protocol.v1 import workspace_service_pb2 as wpb
from sandboxd_protocol.v1 import workspace_service_pb2_grpc as wgrpc

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


async def test_a_long_message_is_cut_before_it_reaches_the_wire(tmp_path) -> None:
    """A message that grew with the request keeps its head and tail in 2000 characters (trailers are bounded)."""
    error = await _call(tmp_path, errors.InvalidSpecError("x" * 100_000 + ": No such file or directory"))
    assert len(error.details()) <= 2000
    assert error.details().startswith("x" * 900)
    assert error.details().endswith("x: No such file or directory")  # the cause survives the cut
    assert " characters cut] …" in error.details()


def test_quoted_bounds_what_a_message_repeats() -> None:
    """A caller's value is repeated whole when short, else its first 64 characters and its length."""
    assert errors.quoted("ws-1") == "'ws-1'"
    assert errors.quoted("w" * 50_000) == "'" + "w" * 64 + "…' (50000 characters)"


def test_audit_cuts_long_fields_and_keeps_their_size(tmp_path) -> None:
    """A 60 MB command is recorded as its first 1 KiB and its size in bytes, nothing more."""
    import json

    from sandboxd.audit import AuditLog

    log = AuditLog(str(tmp_path / "audit.jsonl"))
    log.event("exec.refused", command="é" * 3_000_000, workspace_id="ws-1")
    log.close()
    line = (tmp_path / "audit.jsonl").read_text()
    entry = json.loads(line)
    assert len(line) < 4096
    assert (entry["command"], entry["command_bytes"], entry["workspace_id"]) == ("é" * 1024 + "…", 6_000_000, "ws-1")


def test_log_lines_never_grow_with_a_field(tmp_path) -> None:
    """Every string field of a log line, nested ones too, is cut to 2000 characters."""
    import io
    import json
    import logging

    from sandboxd.logging import configure_logging

    saved, root = structlog.get_config(), logging.getLogger()
    handlers, level = root.handlers[:], root.level
    stream = io.StringIO()
    configure_logging(fmt="json", stream=stream, cache=False, mask=lambda text: text.replace("hunter2", "[MASK]"))
    try:
        structlog.get_logger("t").info("big", value="v" * 10_000, nested={"inner": ["n" * 5000]}, secret="hunter2")
    finally:  # the suite's own logging set-up comes back
        structlog.configure(**saved)
        root.handlers[:] = handlers
        root.setLevel(level)
    entry = json.loads(stream.getvalue())
    assert (len(entry["value"]), entry["value"][:900], entry["value"][-900:]) == (1999, "v" * 900, "v" * 900)
    assert "… [8026 characters cut] …" in entry["value"]
    assert len(entry["nested"]["inner"][0]) <= 2000
    assert entry["secret"] == "[MASK]"


def test_the_layers_come_in_their_stated_order() -> None:
    """The daemon's interceptors are one job each, outermost first, as the package docstring states."""
    from sandboxd.api import interceptors

    layers = interceptors.server_interceptors()
    assert [type(layer) for layer in layers] == [
        interceptors.AccessLog,
        interceptors.AuditTrail,
        interceptors.ErrorStatus,
        interceptors.Authentication,
        interceptors.DrainGate,
        interceptors.RequestBounds,
    ]


async def test_a_refused_attempt_is_audited_with_what_it_named(tmp_path) -> None:
    """A call without a valid token is refused (UNAUTHENTICATED) and its audit line still names its target."""
    import json

    from sandboxd.api.interceptors import server_interceptors
    from sandboxd.audit import AuditLog
    from sandboxd.tenancy import Authenticator, create_token

    create_token(tmp_path / "tokens.json", "team-a")
    authenticator = Authenticator(str(tmp_path / "tokens.json"))
    audit = AuditLog(str(tmp_path / "audit.jsonl"))
    server = grpc.aio.server(interceptors=server_interceptors(authenticator, audit))
    manager = RaisingManager(AssertionError("a refused call never reaches the servicer"))
    wgrpc.add_WorkspaceServiceServicer_to_server(WorkspaceServicer(manager), server)  # type: ignore[arg-type]
    address = f"unix:{tmp_path}/s.sock"
    server.add_insecure_port(address)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = wgrpc.WorkspaceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.DeleteWorkspace(wpb.DeleteWorkspaceRequest(workspace_id="ws-1"))
    finally:
        await server.stop(0)
        audit.close()
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    (line,) = (tmp_path / "audit.jsonl").read_text().splitlines()
    entry = json.loads(line)
    assert (entry["rpc"], entry["tenant"], entry["workspace_id"], entry["code"]) == (
        "DeleteWorkspace",
        None,
        "ws-1",
        "UNAUTHENTICATED",
    )
