"""Ctrl-C -> exited latency and stream throughput: sandboxd vs raw docker-py, side by side.

Usage: ``.venv/bin/python bench/exec_stream.py [--runs N] [--megabytes M]``.
Starts a private daemon; needs the default workspace image.

  Ctrl-C -> exited   sandboxd: Input("\\u0003") on a yielded `sleep 1000` until its
                     exited event; docker-py: a second exec `kill -INT PID` on a
                     streaming `sleep 1000` exec until its stream ends and
                     exec_inspect has the exit code (Docker has no Ctrl-C for a
                     piped exec).
  throughput         `head -c M MiB /dev/zero` streamed to the client: sandboxd's
                     Exec stream vs docker-py exec_start(stream=True).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

import docker
from _daemon import IMAGE, INSTANCE, private_daemon
from sandboxd_client import Exited, Output, SandboxClient


async def sandboxd_numbers(socket_path: str, runs: int, megabytes: int) -> tuple[list[float], float]:
    latencies = []
    async with SandboxClient(socket_path=socket_path) as client:
        ws = await client.create_workspace()
        try:
            for _ in range(runs):
                handle = ws.exec("sleep 1000", yield_after_s=0.25)
                await handle.wait()
                start = time.perf_counter()
                events = [e async for e in client.input(handle.process_id, "\u0003")]
                latencies.append(time.perf_counter() - start)
                assert isinstance(events[-1], Exited), events[-1]
                assert events[-1].exit_code == 130
            total = 0
            start = time.perf_counter()
            async for event in ws.exec(f"head -c {megabytes}M /dev/zero", yield_after_s=600):
                if isinstance(event, Output):
                    total += len(event.data)
            elapsed = time.perf_counter() - start
            assert total == megabytes * 1024 * 1024, total
        finally:
            await ws.delete()
    return latencies, total / elapsed / 1024**2


def docker_numbers(runs: int, megabytes: int) -> tuple[list[float], float]:
    client = docker.from_env()
    api = client.api
    container = client.containers.run(
        IMAGE,
        detach=True,
        init=True,
        labels={"sandboxd.instance": INSTANCE},
        network_mode="none",
        entrypoint=["tail", "-f", "/dev/null"],
    )
    latencies = []
    try:
        for _ in range(runs):
            exec_id = api.exec_create(container.id, ["sh", "-c", "echo $$; exec sleep 1000"])["Id"]
            stream = api.exec_start(exec_id, stream=True)
            pid = next(iter(stream)).decode().split()[0]
            start = time.perf_counter()
            container.exec_run(["kill", "-INT", pid])
            for _chunk in stream:
                pass
            code = api.exec_inspect(exec_id)["ExitCode"]
            latencies.append(time.perf_counter() - start)
            assert code == 130, code
        exec_id = api.exec_create(container.id, ["head", "-c", f"{megabytes}M", "/dev/zero"])["Id"]
        total = 0
        start = time.perf_counter()
        for chunk in api.exec_start(exec_id, stream=True):
            total += len(chunk)
        elapsed = time.perf_counter() - start
        assert total == megabytes * 1024 * 1024, total
    finally:
        container.remove(force=True, v=True)
        client.close()
    return latencies, total / elapsed / 1024**2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--megabytes", type=int, default=500)
    opts = parser.parse_args()
    with private_daemon() as socket_path:
        sd_latency, sd_rate = asyncio.run(sandboxd_numbers(socket_path, opts.runs, opts.megabytes))
    dk_latency, dk_rate = docker_numbers(opts.runs, opts.megabytes)
    print(f"Ctrl-C runs: {opts.runs}; stream: {opts.megabytes} MiB; image {IMAGE}")
    print(f"{'':24}{'sandboxd':>16}{'docker-py':>16}   ratio")
    ours, theirs = statistics.median(sd_latency) * 1000, statistics.median(dk_latency) * 1000
    print(f"{'Ctrl-C -> exited (med)':24}{ours:13.1f} ms{theirs:13.1f} ms   {ours / theirs:5.2f}x")
    print(f"{'stream throughput':24}{sd_rate:11.1f} MiB/s{dk_rate:11.1f} MiB/s   {sd_rate / dk_rate:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
