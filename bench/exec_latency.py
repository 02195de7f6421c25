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
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

import docker
from _daemon import IMAGE, INSTANCE, private_daemon
from sandboxd_client import SandboxClient


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return f"median {statistics.median(ordered) * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms"


async def sandboxd_numbers(socket_path: str, runs: int) -> tuple[list[float], list[float]]:
    create, round_trip = [], []
    async with SandboxClient(socket_path=socket_path) as client:
        for _ in range(max(3, runs // 4)):
            start = time.perf_counter()
            ws = await client.create_workspace()
            await ws.exec("true").wait(check=True)
            create.append(time.perf_counter() - start)
            await ws.delete()
        ws = await client.create_workspace()
        try:
            await ws.exec("true").wait()
            for _ in range(runs):
                start = time.perf_counter()
                await ws.exec("true").wait(check=True)
                round_trip.append(time.perf_counter() - start)
        finally:
            await ws.delete()
    return create, round_trip


def docker_numbers(runs: int) -> tuple[list[float], list[float]]:
    client = docker.from_env()
    labels = {"sandboxd.instance": INSTANCE}
    create, round_trip = [], []
    options = {
        "detach": True,
        "init": True,
        "labels": labels,
        "network_mode": "none",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "mem_limit": "1g",
        "pids_limit": 512,
        "entrypoint": ["tail", "-f", "/dev/null"],
    }
    try:
        for _ in range(max(3, runs // 4)):
            start = time.perf_counter()
            container = client.containers.run(IMAGE, **options)
            assert container.exec_run(["true"]).exit_code == 0
            create.append(time.perf_counter() - start)
            container.remove(force=True)
        container = client.containers.run(IMAGE, **options)
        container.exec_run(["true"])
        for _ in range(runs):
            start = time.perf_counter()
            assert container.exec_run(["true"]).exit_code == 0
            round_trip.append(time.perf_counter() - start)
        container.remove(force=True)
    finally:
        for leftover in client.containers.list(all=True, filters={"label": f"sandboxd.instance={INSTANCE}"}):
            leftover.remove(force=True, v=True)
        client.close()
    return create, round_trip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    opts = parser.parse_args()
    with private_daemon() as socket_path:
        sd_create, sd_rtt = asyncio.run(sandboxd_numbers(socket_path, opts.runs))
    dk_create, dk_rtt = docker_numbers(opts.runs)
    print(f"runs: {opts.runs} round trips, {len(sd_create)} creations; image {IMAGE}")
    print(f"{'':22}{'sandboxd':>38}   {'docker-py':>38}   ratio (median)")
    for name, ours, theirs in (
        ("create -> first exec", sd_create, dk_create),
        ("exec `true` round trip", sd_rtt, dk_rtt),
    ):
        ratio = statistics.median(ours) / statistics.median(theirs)
        print(f"{name:22}{summary(ours):>38}   {summary(theirs):>38}   {ratio:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
