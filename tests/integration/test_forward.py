"""Port forwarding: a server inside a workspace with no network, reached from the host.

Every connection is one ForwardPort stream through the workspace's agent, which dials the
port on the workspace's own loopback. The workspace tests run under runc and gVisor.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from sandboxd_client import FailedPreconditionError, SandboxClient
from sandboxd_protocol.v1 import network_service_pb2 as npb
from sandboxd_protocol.v1 import network_service_pb2_grpc as ngrpc

from tests.conftest import DaemonThread, rss_bytes, spawned_daemon

from .helpers import start_ready
from .test_any_image import busybox_image as busybox_image  # the fixture

pytestmark = pytest.mark.docker

HTTP_SERVER = "cd /workspace && exec python3 -u -m http.server 8000 --bind 127.0.0.1"
"""Prints "Serving HTTP on ..." once it listens (unbuffered: the test waits for that line)."""

ECHO_SERVER = """exec python3 -u -c '
import hashlib, socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8001)); s.listen(8); print("ready", flush=True)
while True:
    c, _ = s.accept(); h = hashlib.sha256(); n = 0
    while data := c.recv(1 << 16):
        h.update(data); n += len(data)
    c.sendall(f"{n} {h.hexdigest()}".encode()); c.close()
'"""
"""Reads a connection to its end (the client's half-close), then answers its size and digest."""


def http_get(address: str, path: str) -> bytes:
    with urllib.request.urlopen(f"http://{address}/{path}", timeout=60) as response:
        return bytes(response.read())


async def serve_file(workspace, size: int) -> bytes:  # type: ignore[no-untyped-def]
    data = os.urandom(size)
    await workspace.write_file("/workspace/blob.bin", data)
    await start_ready(workspace, HTTP_SERVER, ready="Serving HTTP")
    return data


async def test_a_server_in_a_workspace_without_network_is_reached_byte_exact(workspace) -> None:  # type: ignore[no-untyped-def]
    """5 MiB over one connection, then 20 GETs at once, all exact, with the network policy NONE."""
    assert workspace.info.network == "none"
    data = await serve_file(workspace, 5 * 1024 * 1024)
    forward = workspace.forward(8000)
    async with forward as address:
        assert address.startswith("127.0.0.1:")
        got = await asyncio.to_thread(http_get, address, "blob.bin")
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest()
        assert len(got) == len(data)
        loop = asyncio.get_running_loop()
        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            many = await asyncio.gather(*(loop.run_in_executor(pool, http_get, address, "blob.bin") for _ in range(20)))
        assert [len(body) for body in many] == [len(data)] * 20
        assert all(body == data for body in many)
    assert forward.errors == []
    assert forward.connections == 21
    with pytest.raises(OSError):  # the listener is gone with the block
        socket.create_connection(("127.0.0.1", int(address.rsplit(":", 1)[1])), timeout=5).close()


async def test_both_directions_are_exact_and_a_half_close_reaches_the_server(workspace) -> None:  # type: ignore[no-untyped-def]
    """3 MiB up; the client's shutdown(SHUT_WR) is the server's EOF; its answer still comes back."""
    await start_ready(workspace, ECHO_SERVER)
    payload = os.urandom(3 * 1024 * 1024 + 17)
    async with workspace.forward(8001) as address:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(payload)
        await writer.drain()
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), 60)
        writer.close()
    assert answer.decode() == f"{len(payload)} {hashlib.sha256(payload).hexdigest()}"


async def test_a_port_where_nothing_listens_is_a_clean_error(workspace, client: SandboxClient) -> None:  # type: ignore[no-untyped-def]
    """The local connection closes at once; the error names the port; the call is FAILED_PRECONDITION."""
    errors: list[Exception] = []
    async with workspace.forward(8009, on_error=errors.append) as address:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        assert await asyncio.wait_for(reader.read(), 30) == b""
        writer.close()
    (error,) = errors
    assert isinstance(error, FailedPreconditionError)
    assert error.message == f"nothing listens on port 8009 in workspace {workspace.workspace_id!r} (connection refused)"
    stub = ngrpc.NetworkServiceStub(client._channel)

    async def first(*messages: npb.ForwardPortRequest) -> grpc.aio.AioRpcError:
        async def requests():  # type: ignore[no-untyped-def]
            for message in messages:
                yield message

        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in stub.ForwardPort(requests()):
                pass
        return caught.value

    target = npb.ForwardPortTarget(workspace_id=workspace.workspace_id, port=8009)
    refused = await first(npb.ForwardPortRequest(target=target))
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    bad_port = await first(npb.ForwardPortRequest(target=npb.ForwardPortTarget(workspace_id=workspace.workspace_id)))
    assert (bad_port.code(), bad_port.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "port 0 is not a TCP port (1-65535)",
    )
    no_target = await first(npb.ForwardPortRequest(data=b"GET / HTTP/1.0\r\n\r\n"))
    assert no_target.code() == grpc.StatusCode.INVALID_ARGUMENT
    unknown = await first(npb.ForwardPortRequest(target=npb.ForwardPortTarget(workspace_id="ws-nosuch", port=80)))
    assert unknown.code() == grpc.StatusCode.NOT_FOUND


async def test_a_forward_ends_when_its_workspace_is_deleted(client: SandboxClient) -> None:
    """A connection the server holds open is closed on the host once the workspace goes."""
    workspace = await client.create_workspace(labels={"test": "forward-delete"})
    await start_ready(workspace, ECHO_SERVER)
    forward = workspace.forward(8001)
    async with forward as address:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"held open")
        await writer.drain()
        deadline = time.monotonic() + 20
        while not forward.active:  # accepted: its stream is open
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await client.delete_workspace(workspace.workspace_id)
        assert await asyncio.wait_for(reader.read(), 30) == b""
        writer.close()
    assert len(forward.errors) == 1, forward.errors


async def test_sandboxctl_port_forward_serves_until_ctrl_c(workspace, daemon: DaemonThread) -> None:  # type: ignore[no-untyped-def]
    """Like kubectl port-forward: prints its address, serves many connections, exits 0 on SIGINT, listens no more."""
    data = await serve_file(workspace, 256 * 1024)
    process = subprocess.Popen(
        [sys.executable, "-m", "sandboxd_client.cli", "--socket", daemon.socket_path, "port-forward",
         workspace.workspace_id, ":8000", ":8009"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stderr is not None
        first = await asyncio.to_thread(process.stdout.readline)
        second = await asyncio.to_thread(process.stdout.readline)
        assert first.startswith("Forwarding from 127.0.0.1:") and first.endswith(" -> 8000\n"), first
        assert second.endswith(" -> 8009\n"), second
        address = first.split()[2]
        bodies = await asyncio.gather(*(asyncio.to_thread(http_get, address, "blob.bin") for _ in range(5)))
        assert bodies == [data] * 5
        refused_address = second.split()[2].rsplit(":", 1)
        with socket.create_connection((refused_address[0], int(refused_address[1])), timeout=10) as refused:
            assert refused.recv(10) == b""
        line = await asyncio.to_thread(process.stderr.readline)
        assert (
            line
            == f"error: nothing listens on port 8009 in workspace {workspace.workspace_id!r} (connection refused)\n"
        )
        process.send_signal(signal.SIGINT)
        assert await asyncio.to_thread(process.wait, 15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(address.rsplit(":", 1)[1])), timeout=5).close()


async def test_a_slow_reader_does_not_grow_the_daemons_memory(tmp_path: Path) -> None:
    """500 MiB forwarded to a reader that stops for seconds: the daemon holds a window, not the stream."""
    total = 500 * 1024 * 1024
    with spawned_daemon(tmp_path) as (process, socket_path, _log):
        async with SandboxClient(socket_path=socket_path, retries=False) as client:
            workspace = await client.create_workspace(labels={"test": "forward-rss"})
            try:
                server = (
                    "exec python3 -u -c '\nimport socket\n"
                    's = socket.socket(); s.bind(("127.0.0.1", 8002)); s.listen(1); print("ready", flush=True)\n'
                    "c, _ = s.accept(); block = bytes(1 << 20)\n"
                    f"for _ in range({total >> 20}): c.sendall(block)\n"
                    "c.close()\n'"
                )
                await start_ready(workspace, server)
                baseline = rss_bytes(process.pid)
                peak = baseline
                async with workspace.forward(8002) as address:
                    host, port = address.rsplit(":", 1)
                    reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 20)
                    received = len(await reader.readexactly(1 << 20))
                    for _ in range(20):  # the reader stops for 2 s: everything upstream fills and waits
                        await asyncio.sleep(0.1)
                        peak = max(peak, rss_bytes(process.pid))
                    while chunk := await reader.read(1 << 20):
                        received += len(chunk)
                        if received % (32 << 20) < len(chunk):
                            peak = max(peak, rss_bytes(process.pid))
                    writer.close()
            finally:
                await client.delete_workspace(workspace.workspace_id)
    assert received == total
    assert peak - baseline < 48 * 1024 * 1024, f"the daemon grew by {(peak - baseline) >> 20} MiB"


async def test_busybox_httpd_in_an_image_with_nothing_else(client: SandboxClient, busybox_image: str) -> None:
    """FROM scratch plus busybox-static: its httpd is reached the same way (the agent dials, no tool of the image)."""
    workspace = await client.create_workspace(image=busybox_image, labels={"test": "forward-busybox"})
    try:
        await workspace.write_file("/workspace/index.html", "<h1>busybox</h1>\n")
        started = await workspace.exec("busybox httpd -p 127.0.0.1:8000 -h /workspace").wait()
        assert started.exit_code == 0  # it daemonizes once it listens
        async with workspace.forward(8000) as address:
            assert await asyncio.to_thread(http_get, address, "index.html") == b"<h1>busybox</h1>\n"
    finally:
        await workspace.delete()


FLOOD_SERVER = """exec python3 -u -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8006)); s.listen(8); print("ready", flush=True)
block = bytes(1 << 16)
while True:
    c, _ = s.accept()
    try:
        while True: c.sendall(block)
    except OSError: c.close()
'"""


@pytest.mark.workspace(runtime="runc")
async def test_a_bad_message_mid_stream_fails_the_call_at_once_and_every_call_is_audited(  # type: ignore[no-untyped-def]
    workspace, client: SandboxClient, daemon: DaemonThread, runtime: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second target or an oversized message ends the call with its status (not at the server's EOF);
    a stream that names no target is refused in time; a call cancelled while the daemon waits to write
    to it is audited with what it moved."""
    import json

    from sandboxd.api import network

    if runtime == "runsc":
        pytest.skip("the daemon's handling, the same under every runtime")
    await start_ready(workspace, ECHO_SERVER)
    await start_ready(workspace, FLOOD_SERVER)
    stub = ngrpc.NetworkServiceStub(client._channel)
    target = npb.ForwardPortRequest(target=npb.ForwardPortTarget(workspace_id=workspace.workspace_id, port=8001))

    async def status_of(*messages: npb.ForwardPortRequest, hold_s: float = 30) -> tuple[grpc.StatusCode, float]:
        async def requests():  # type: ignore[no-untyped-def]
            for message in messages:
                yield message
            await asyncio.sleep(hold_s)  # the client's side stays open: only the daemon can end the call

        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in stub.ForwardPort(requests()):
                pass
        return caught.value.code(), time.monotonic() - started

    code, took = await status_of(target, target)
    assert (code, took < 10) == (grpc.StatusCode.INVALID_ARGUMENT, True)
    code, took = await status_of(target, npb.ForwardPortRequest(data=b"x"), target)
    assert (code, took < 10) == (grpc.StatusCode.INVALID_ARGUMENT, True)
    code, took = await status_of(target, npb.ForwardPortRequest(data=bytes(2 << 20)))
    assert (code, took < 10) == (grpc.StatusCode.RESOURCE_EXHAUSTED, True)
    monkeypatch.setattr(network, "FIRST_MESSAGE_TIMEOUT_S", 0.5)
    code, took = await status_of(hold_s=30)
    assert (code, took < 10) == (grpc.StatusCode.INVALID_ARGUMENT, True)

    flood = npb.ForwardPortRequest(target=npb.ForwardPortTarget(workspace_id=workspace.workspace_id, port=8006))

    async def never_ends():  # type: ignore[no-untyped-def]
        yield flood
        await asyncio.sleep(60)

    call = stub.ForwardPort(never_ends())
    first = await call.read()
    assert first.WhichOneof("message") == "connected"
    audit = Path(daemon.settings.audit_log)
    before = len(audit.read_text().splitlines())
    await asyncio.sleep(1.0)  # nothing read: the daemon's writes to this call block, the windows fill
    call.cancel()
    deadline = time.monotonic() + 20
    while True:
        entries = [json.loads(line) for line in audit.read_text().splitlines()[before:]]
        mine = [e for e in entries if e.get("rpc") == "ForwardPort" and e.get("port") == 8006 and "code" in e]
        if mine:
            break
        assert time.monotonic() < deadline, "the cancelled call left no audit line"
        await asyncio.sleep(0.05)
    assert mine[0]["code"] == "CANCELLED" and mine[0]["bytes_from_workspace"] > 0
