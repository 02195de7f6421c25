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
from sandboxd_client import Exited, Output, SandboxClient


async def interleaved(socket_path: str, runs: int, megabytes: int, streams: int) -> dict[str, tuple[list[float], ...]]:
    """Samples of both sides taken in turns (which goes first alternates), so drift hits both alike."""
    engine = docker.from_env()
    api = engine.api
    size = megabytes * 1024 * 1024
    results: dict[str, tuple[list[float], list[float]]] = {"ctrl_c": ([], []), "rate": ([], [])}
    container = engine.containers.run(
        IMAGE,
        detach=True,
        init=True,
        labels={"sandboxd.instance": INSTANCE},
        network_mode="none",
        entrypoint=["tail", "-f", "/dev/null"],
    )

    async def sandboxd_ctrl_c() -> float:
        handle = ws.exec("sleep 1000", yield_after_s=0.25)
        await handle.wait()
        start = time.perf_counter()
        events = [e async for e in client.input(handle.process_id, "\u0003")]
        elapsed = time.perf_counter() - start
        assert isinstance(events[-1], Exited), events[-1]
        assert events[-1].exit_code == 130, events[-1]
        return elapsed

    def docker_ctrl_c() -> float:
        exec_id = api.exec_create(container.id, ["sh", "-c", "echo $$; exec sleep 1000"])["Id"]
        stream = api.exec_start(exec_id, stream=True)
        pid = next(iter(stream)).decode().split()[0]
        start = time.perf_counter()
        container.exec_run(["kill", "-INT", pid])
        for _chunk in stream:
            pass
        code = api.exec_inspect(exec_id)["ExitCode"]
        elapsed = time.perf_counter() - start
        assert code == 130, code
        return elapsed

    async def sandboxd_rate() -> float:
        total = 0
        start = time.perf_counter()
        async for event in ws.exec(f"head -c {megabytes}M /dev/zero", yield_after_s=600):
            if isinstance(event, Output):
                total += len(event.data)
        elapsed = time.perf_counter() - start
        assert total == size, total
        return total / elapsed / 1024**2

    def docker_rate() -> float:
        exec_id = api.exec_create(container.id, ["head", "-c", f"{megabytes}M", "/dev/zero"])["Id"]
        total = 0
        start = time.perf_counter()
        for chunk in api.exec_start(exec_id, stream=True):
            total += len(chunk)
        elapsed = time.perf_counter() - start
        assert total == size, total
        return total / elapsed / 1024**2

    try:
        async with SandboxClient(socket_path=socket_path) as client:
            ws = await client.create_workspace()
            try:
                pairs = [
                    ("ctrl_c", sandboxd_ctrl_c, lambda: asyncio.to_thread(docker_ctrl_c), runs),
                    ("rate", sandboxd_rate, lambda: asyncio.to_thread(docker_rate), streams),
                ]
                for name, ours, theirs, count in pairs:
                    for index in range(count):
                        order = [(0, ours), (1, theirs)] if index % 2 == 0 else [(1, theirs), (0, ours)]
                        for side, call in order:
                            results[name][side].append(await call())
            finally:
                await ws.delete()
    finally:
        container.remove(force=True, v=True)
        engine.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--megabytes", type=int, default=500)
    parser.add_argument("--streams", type=int, default=3, help="streams of --megabytes per side")
    opts = parser.parse_args()
    started = datetime.datetime.now(datetime.UTC)
    with private_daemon() as socket_path:
        results = asyncio.run(interleaved(socket_path, opts.runs, opts.megabytes, opts.streams))
    print(
        f"{started:%Y-%m-%d %H:%M} UTC; Ctrl-C runs: {opts.runs}; streams: {opts.streams} x {opts.megabytes} MiB, "
        f"interleaved; image {IMAGE}"
    )
    print(f"{'':24}{'sandboxd':>16}{'docker-py':>16}   ratio (median)")
    ours, theirs = (statistics.median(side) * 1000 for side in results["ctrl_c"])
    print(f"{'Ctrl-C -> exited (med)':24}{ours:13.1f} ms{theirs:13.1f} ms   {ours / theirs:5.2f}x")
    ours, theirs = (statistics.median(side) for side in results["rate"])
    print(f"{'stream throughput':24}{ours:11.1f} MiB/s{theirs:11.1f} MiB/s   {ours / theirs:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
