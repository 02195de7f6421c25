"""Create->first-exec latency and `true` round trip: sandboxd vs raw docker-py, side by side.

Usage: ``.venv/bin/python bench/exec_latency.py [--runs N]``. Starts a private
daemon (its own socket and instance label), needs the default workspace image
(``sandboxd images build``), and removes every container it made.

What is compared:
  create->first exec  sandboxd: CreateWorkspace + Exec("true") until exited;
                      docker-py: containers.run(detach) + exec_run("true").
  exec round trip     sandboxd: Exec("true") on a live workspace until exited;
                      docker-py: exec_run(["true"]) on a live container.
sandboxd does more per exec (a supervisor process, a process group, exact exit
status, streaming over gRPC), so the ratio is the price of those guarantees.
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
from collections.abc import Awaitable, Callable
from typing import Any

import docker
from _daemon import IMAGE, INSTANCE, private_daemon
from sandboxd_client import SandboxClient


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return f"median {statistics.median(ordered) * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms"


DOCKER_OPTIONS = {
    "detach": True,
    "init": True,
    "labels": {"sandboxd.instance": INSTANCE},
    "network_mode": "none",
    "cap_drop": ["ALL"],
    "security_opt": ["no-new-privileges"],
    "mem_limit": "1g",
    "pids_limit": 512,
    "entrypoint": ["tail", "-f", "/dev/null"],
}
"""The raw container: the same image and the same hardening sandboxd applies."""


async def timed(call: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await call()
    return time.perf_counter() - start


async def interleaved(socket_path: str, runs: int) -> dict[str, tuple[list[float], list[float]]]:
    """Samples of both sides taken in turns (which goes first alternates), so drift hits both alike."""
    engine = docker.from_env()
    results: dict[str, tuple[list[float], list[float]]] = {"create": ([], []), "rtt": ([], [])}

    async def sandboxd_create() -> None:
        ws = await client.create_workspace()
        await ws.exec("true").wait(check=True)
        created.append(ws)

    def docker_create() -> None:
        container = engine.containers.run(IMAGE, **DOCKER_OPTIONS)
        assert container.exec_run(["true"]).exit_code == 0
        containers.append(container)

    async def sandboxd_true() -> None:
        await live.exec("true").wait(check=True)

    def docker_true() -> None:
        assert raw.exec_run(["true"]).exit_code == 0

    created: list[Any] = []
    containers: list[Any] = []
    try:
        async with SandboxClient(socket_path=socket_path) as client:
            pairs = [
                ("create", sandboxd_create, lambda: asyncio.to_thread(docker_create), max(3, runs // 4)),
                ("rtt", sandboxd_true, lambda: asyncio.to_thread(docker_true), runs),
            ]
            live = await client.create_workspace()
            await live.exec("true").wait()
            raw = engine.containers.run(IMAGE, **DOCKER_OPTIONS)
            raw.exec_run(["true"])
            containers.append(raw)
            for name, ours, theirs, count in pairs:
                for index in range(count):
                    order = [(0, ours), (1, theirs)] if index % 2 == 0 else [(1, theirs), (0, ours)]
                    for side, call in order:
                        results[name][side].append(await timed(call))
            for ws in [live, *created]:
                await ws.delete()
    finally:
        for leftover in engine.containers.list(all=True, filters={"label": f"sandboxd.instance={INSTANCE}"}):
            leftover.remove(force=True, v=True)
        engine.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    opts = parser.parse_args()
    started = datetime.datetime.now(datetime.UTC)
    with private_daemon() as socket_path:
        results = asyncio.run(interleaved(socket_path, opts.runs))
    print(
        f"{started:%Y-%m-%d %H:%M} UTC; runs: {opts.runs} round trips, {len(results['create'][0])} creations, "
        f"interleaved; image {IMAGE}"
    )
    print(f"{'':22}{'sandboxd':>38}   {'docker-py':>38}   ratio (median)")
    for name, key in (("create -> first exec", "create"), ("exec `true` round trip", "rtt")):
        ours, theirs = results[key]
        ratio = statistics.median(ours) / statistics.median(theirs)
        print(f"{name:22}{summary(ours):>38}   {summary(theirs):>38}   {ratio:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
