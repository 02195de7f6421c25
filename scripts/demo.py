"""The main job, end to end: start sandboxd with its defaults and show a command streaming back.

Run through ``./dev demo`` (which sets up the virtualenv first). Options:
``--keep`` leaves the daemon running in the foreground afterwards so you can
try ``sandboxctl`` against it; Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sandboxd_client import Exited, Output, SandboxClient, Started, Workspace, default_socket_path

DEMO_COMMAND = (
    'echo "hello from $(hostname) as $(id -un)"; '
    'for i in 1 2 3; do echo "tick $i"; sleep 0.5; done; '
    "echo 'a warning on stderr' >&2; "
    "python3 -c 'import platform; print(\"python\", platform.python_version())'; "
    "exit 3"
)


def say(text: str) -> None:
    print(f"\033[1m==> {text}\033[0m" if sys.stdout.isatty() else f"==> {text}", flush=True)


async def wait_for_health(socket_path: str, daemon: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if daemon.poll() is not None:
                msg = f"the daemon exited with status {daemon.returncode}; see its output above"
                raise SystemExit(msg)
            try:
                response = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.3)
                continue
            if response.status == health_pb2.HealthCheckResponse.SERVING:
                return
    msg = f"the daemon did not become healthy within {timeout_s:.0f} s"
    raise SystemExit(msg)


async def forward_demo(workspace: Workspace) -> None:
    """A web server in the workspace, which has no network, reached from here through its agent."""
    say("serving /workspace over HTTP inside the workspace (network none) and fetching it through a forward")
    await workspace.write_file("/workspace/index.html", "<h1>hello from inside the workspace</h1>\n")
    # In the background (the call returns at once), then until it listens.
    await workspace.exec(
        "cd /workspace && python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 & "
        "until python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000))' 2>/dev/null; "
        "do sleep 0.05; done"
    ).wait(check=True)
    async with workspace.forward(8000) as address:
        reader, writer = await asyncio.open_connection(*address.rsplit(":", 1))
        writer.write(b"GET /index.html HTTP/1.0\r\nHost: demo\r\n\r\n")
        reply = await reader.read()
        writer.close()
        status, _, body = reply.partition(b"\r\n\r\n")
        print(f"    http://{address}/index.html -> {status.splitlines()[0].decode()}: {body.decode().strip()}")


async def show(socket_path: str) -> int:
    async with SandboxClient(socket_path=socket_path) as client:
        say("creating a workspace (hardened defaults: non-root, no capabilities, no network)")
        workspace = await client.create_workspace(labels={"demo": "true"})
        info = workspace.info
        print(
            f"    {info.workspace_id}: image {info.image}, user {info.user}, network {info.network}, "
            f"memory {info.memory_bytes // 1024**2} MiB, pids {info.pids}"
        )
        try:
            say("streaming a command; each line shows when it arrived")
            print(f"    $ {DEMO_COMMAND}")
            start = time.monotonic()
            async for event in workspace.exec(DEMO_COMMAND):
                stamp = f"[{time.monotonic() - start:5.2f}s]"
                match event:
                    case Started():
                        print(f"    {stamp} started, process {event.process_id} (pid {event.pid} in the container)")
                    case Output():
                        for line in event.text.splitlines():
                            print(f"    {stamp} {event.stream}: {line}", flush=True)
                    case Exited():
                        print(f"    {stamp} exited with code {event.exit_code} ({event.stop_reason})")
            await forward_demo(workspace)
        finally:
            say(f"deleting {info.workspace_id} (container and volume)")
            await workspace.delete()
        pool = await client.get_pool()
        if pool:
            ready = sum(c.ready for c in pool)
            say(
                f"the warm pool holds {ready} started, idle workspaces for the next creates; they stay for "
                "the daemon's next start (`docker rm -f $(docker ps -aq --filter label=sandboxd.pool)` "
                "removes them)"
            )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the daemon running afterwards")
    opts = parser.parse_args()
    socket_path = default_socket_path(os.environ)
    say(f"starting sandboxd (socket {socket_path}); the first start builds the workspace image")
    # The daemon's own log stays quiet here so the demo's output reads clearly; image-build
    # progress still shows. SANDBOXD_LOG_LEVEL=info brings the structured log back.
    env = {
        "SANDBOXD_LOG_FORMAT": "console",
        "SANDBOXD_LOG_LEVEL": "warning",
        **os.environ,
    }
    sandboxd = Path(sys.executable).with_name("sandboxd")
    daemon = subprocess.Popen([str(sandboxd), "serve"], env=env)
    try:
        asyncio.run(wait_for_health(socket_path, daemon, timeout_s=900))
        say("the daemon answers health checks: SERVING")
        asyncio.run(show(socket_path))
        if opts.keep:
            say(f"daemon left running; try: SANDBOXD_SOCKET={socket_path} .venv/bin/sandboxctl create  (Ctrl-C stops)")
            daemon.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if daemon.poll() is None:
            say("stopping the daemon")
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
