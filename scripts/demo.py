"""The main job, end to end: start sandboxd with its defaults and show a command streaming back.

Run through ``./dev demo`` (which sets up the virtualenv first). Each phase says when it began;
the end says how long each took. The demo leaves no container behind: its daemon removes its
warm pool when it stops, and the agent's volume goes too; the images stay for the next run.

``--keep`` leaves the daemon running in the foreground afterwards, with its warm pool, so you can
try ``sandboxctl`` against it; Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import docker
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
LOG_PATH = Path(sys.prefix) / "demo-daemon.log"
"""The daemon's whole output (image builds included); only its headlines are shown."""


class Clock:
    """Seconds since ``./dev demo`` began (``DEV_STARTED_AT``, epoch seconds), or since this script did."""

    def __init__(self) -> None:
        self.t0 = float(os.environ.get("DEV_STARTED_AT") or time.time())
        self.marks: dict[str, float] = {}

    def now(self) -> float:
        """Seconds since the start."""
        return time.time() - self.t0

    def phase(self, text: str) -> None:
        """A phase's heading, with when it began: ``./dev test``'s form."""
        at = self.now()
        self.marks.setdefault(text, at)
        say(f"{text} (at {at:.0f} s)")


def say(text: str) -> None:
    print(f"\033[1m==> {text}\033[0m" if sys.stdout.isatty() else f"==> {text}", flush=True)


def relay(stream: IO[bytes], log: IO[bytes], clock: Clock) -> None:
    """Copy the daemon's output to the log, each line with when it came; show its headlines.

    A build's own output is indented under them, and goes to the log alone.
    """
    for raw in stream:
        at = clock.now()
        log.write(f"[{at:6.1f} s] ".encode() + raw)  # where a first start's time goes, step by step
        log.flush()
        line = raw.decode(errors="replace").rstrip()
        if line and not line[0].isspace():
            print(f"    [{at:5.0f} s] {line}", flush=True)


async def wait_for_health(socket_path: str, daemon: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    # A channel made before the daemon listens backs off between its connection attempts, up to
    # minutes after a first start's image builds: a short ceiling keeps its next try prompt.
    options = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 250)]
    async with grpc.aio.insecure_channel(f"unix:{socket_path}", options=options) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if daemon.poll() is not None:
                tail = LOG_PATH.read_text(errors="replace").splitlines()[-30:]
                msg = "\n".join([*tail, f"the daemon exited with status {daemon.returncode}; its log is {LOG_PATH}"])
                raise SystemExit(msg)
            try:
                response = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.1)
                continue
            if response.status == health_pb2.HealthCheckResponse.SERVING:
                return
    msg = f"the daemon did not become healthy within {timeout_s:.0f} s; its log is {LOG_PATH}"
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


async def pool_demo(client: SandboxClient) -> None:
    """A create served by the warm pool: a started workspace handed over, not a container started."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(c.ready for c in await client.get_pool()):  # noqa: ASYNC110 - another process's state
        await asyncio.sleep(0.1)
    start = time.monotonic()
    workspace = await client.create_workspace(labels={"demo": "true"})
    took = time.monotonic() - start
    try:
        result = await workspace.exec("echo ready in $PWD").wait()
        say(
            f"another workspace, {workspace.info.workspace_id}, from the warm pool in {took * 1000:.0f} ms: "
            f"{result.stdout.strip()}"
        )
    finally:
        await workspace.delete()


async def show(socket_path: str) -> None:
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
        await pool_demo(client)


def leftovers() -> list[str]:
    """The names of sandboxd's containers still on the engine; the agent's volume is removed.

    That volume is a copy of the agent binary, which a daemon's next start makes again.
    """
    engine = docker.from_env()
    try:
        names = [c.name for c in engine.containers.list(all=True, filters={"label": "sandboxd.managed=true"})]
        for volume in engine.volumes.list(filters={"label": "sandboxd.volume.kind=agent"}):
            with contextlib.suppress(docker.errors.APIError):  # in use by another daemon's workspaces
                volume.remove()
        return names
    finally:
        engine.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--keep", action="store_true", help="keep the daemon and its warm pool running afterwards (Ctrl-C stops it)"
    )
    opts = parser.parse_args()
    clock = Clock()
    socket_path = default_socket_path(os.environ)
    clock.phase(
        f"starting sandboxd (socket {socket_path}); a first start builds the workspace image and the agent "
        f"(their output goes to {LOG_PATH})"
    )
    # The daemon's own log stays quiet here so the demo's output reads clearly; image-build
    # headlines still show. SANDBOXD_LOG_LEVEL=info brings the structured log back.
    env = {
        "SANDBOXD_LOG_FORMAT": "console",
        "SANDBOXD_LOG_LEVEL": "warning",
        # A demo leaves no container running: its warm pool goes when its daemon stops.
        "SANDBOXD_POOL_ON_STOP": "keep" if opts.keep else "remove",
        **os.environ,
    }
    sandboxd = Path(sys.executable).with_name("sandboxd")
    log = LOG_PATH.open("wb")
    daemon = subprocess.Popen([str(sandboxd), "serve"], env=env, stdout=log, stderr=subprocess.PIPE)
    assert daemon.stderr is not None
    relayer = threading.Thread(target=relay, args=(daemon.stderr, log, clock), daemon=True)
    relayer.start()
    status = 0
    try:
        asyncio.run(wait_for_health(socket_path, daemon, timeout_s=900))
        clock.phase("the daemon answers health checks: SERVING")
        asyncio.run(show(socket_path))
        if opts.keep:
            say(
                f"the daemon runs on with its warm pool; try: SANDBOXD_SOCKET={socket_path} .venv/bin/sandboxctl "
                "create. Ctrl-C stops the daemon; its pool's members stay for its next start, and "
                "`docker rm -f $(docker ps -aq --filter label=sandboxd.pool)` removes them"
            )
            daemon.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if daemon.poll() is None:
            clock.phase("stopping the daemon" + ("" if opts.keep else " (it removes its warm pool)"))
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
        relayer.join(5)
        log.close()
    if not opts.keep:
        left = leftovers()
        if left:
            print(f"sandboxd: containers left on the engine: {', '.join(left)}", file=sys.stderr)
            status = 1
    marks = clock.marks
    started = next(iter(marks.values()))
    serving = next((at for text, at in marks.items() if text.startswith("the daemon answers")), None)
    parts = [f"set-up {started:.0f} s"]
    if serving is not None:
        parts += [
            f"daemon start (and its first builds) {serving - started:.0f} s",
            f"demo {clock.now() - serving:.0f} s",
        ]
    clean = "" if opts.keep or status else "; of sandboxd's, the engine holds its images only"
    say(f"done in {clock.now():.0f} s: {', '.join(parts)}{clean}")
    return status


if __name__ == "__main__":
    sys.exit(main())
