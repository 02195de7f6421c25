"""Port-forward throughput: bytes of a file served inside a workspace, read on the host, vs docker exec + cat.

Usage: ``.venv/bin/python bench/forward.py [--runs N] [--megabytes M] [--runtime runc|runsc]``.
Starts a private daemon; needs the default workspace image.

  sandboxd    a TCP server in a workspace with the network policy NONE sends the file
              (sendfile) to each connection; the host reads it through `ws.forward(port)`
              (ForwardPort streams through the workspace's agent).
  docker-py   `cat FILE` in a container of the same image, streamed with
              exec_start(stream=True): the direct way to get a container's bytes out.

The two sides' samples are taken in turns within one run, the first of each pair
alternating, because this machine's speed drifts by a third within an hour.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import statistics
import sys
import time

import docker
from _daemon import IMAGE, INSTANCE, private_daemon
from sandboxd_client import Output, SandboxClient

SERVER = """exec python3 -u -c '
import os, socket
s = socket.socket(); s.bind(("127.0.0.1", 8005)); s.listen(4); print("ready", flush=True)
while True:
    c, _ = s.accept()
    with open("/workspace/blob", "rb") as f:
        c.sendfile(f)
    c.close()
'"""


async def interleaved(socket_path: str, runs: int, megabytes: int, runtime: str) -> tuple[list[float], list[float]]:
    """MiB/s of both sides, taken in turns (which goes first alternates)."""
    engine = docker.from_env()
    api = engine.api
    size = megabytes * 1024 * 1024
    ours: list[float] = []
    theirs: list[float] = []
    container = engine.containers.run(
        IMAGE,
        detach=True,
        init=True,
        runtime=runtime,
        labels={"sandboxd.instance": INSTANCE},
        network_mode="none",
        entrypoint=["tail", "-f", "/dev/null"],
    )
    made = container.exec_run(["sh", "-c", f"head -c {megabytes}M /dev/urandom > /tmp/blob"])
    assert made.exit_code == 0, made.output
    try:
        async with SandboxClient(socket_path=socket_path) as client:
            ws = await client.create_workspace(runtime=runtime)
            try:
                await ws.exec(f"head -c {megabytes}M /dev/urandom > /workspace/blob").wait(check=True)
                handle = ws.exec(SERVER, yield_after_s=0.25)
                seen = ""
                async for event in handle:
                    if isinstance(event, Output):
                        seen += event.text
                while "ready" not in seen:
                    async for event in client.input(handle.process_id, yield_after_s=0.25):
                        if isinstance(event, Output):
                            seen += event.text
                async with ws.forward(8005) as address:
                    host, port = address.rsplit(":", 1)

                    async def sandboxd_rate() -> float:
                        start = time.perf_counter()
                        reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 20)
                        total = 0
                        while chunk := await reader.read(1 << 20):
                            total += len(chunk)
                        elapsed = time.perf_counter() - start
                        writer.close()
                        assert total == size, total
                        return total / elapsed / 1024**2

                    def docker_rate() -> float:
                        start = time.perf_counter()
                        exec_id = api.exec_create(container.id, ["cat", "/tmp/blob"])["Id"]
                        total = sum(len(chunk) for chunk in api.exec_start(exec_id, stream=True))
                        elapsed = time.perf_counter() - start
                        assert total == size, total
                        return total / elapsed / 1024**2

                    for index in range(runs):
                        if index % 2 == 0:
                            ours.append(await sandboxd_rate())
                            theirs.append(await asyncio.to_thread(docker_rate))
                        else:
                            theirs.append(await asyncio.to_thread(docker_rate))
                            ours.append(await sandboxd_rate())
            finally:
                await ws.delete()
    finally:
        container.remove(force=True, v=True)
        engine.close()
    return ours, theirs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--megabytes", type=int, default=200)
    parser.add_argument("--runtime", default="runc")
    opts = parser.parse_args()
    started = datetime.datetime.now(datetime.UTC)
    with private_daemon() as socket_path:
        ours, theirs = asyncio.run(interleaved(socket_path, opts.runs, opts.megabytes, opts.runtime))
    print(
        f"{started:%Y-%m-%d %H:%M} UTC; runtime {opts.runtime}; {opts.runs} reads x {opts.megabytes} MiB per side, "
        f"interleaved; image {IMAGE}"
    )
    print(f"{'':28}{'sandboxd':>16}{'docker-py':>16}   ratio (median)")
    mine, raw = statistics.median(ours), statistics.median(theirs)
    print(f"{'forward vs exec + cat':28}{mine:11.1f} MiB/s{raw:11.1f} MiB/s   {mine / raw:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
