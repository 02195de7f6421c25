"""Create->first-exec latency, `true` round trip and a small read_file: sandboxd vs raw docker-py.

Usage: ``.venv/bin/python bench/exec_latency.py [--runs N] [--runtime runc|runsc ...]``.
Starts a private daemon (its own socket and instance label), needs the default
workspace image and the agent (``./dev test`` or ``./dev demo`` builds both), and
removes every container it made. Each runtime given (default: runc, and runsc when
the engine has it) is measured on both sides.

What is compared:
  create->first exec  sandboxd: CreateWorkspace + Exec("true") until exited, on a daemon
                      with no warm pool (a container started);
                      docker-py: containers.run(detach) + exec_run("true").
  ... from the pool   the same on a daemon whose pool serves the spec (runc: the default
                      class; runsc: the demand class its first two creates make), each
                      sample once a member is ready (a create that finds none is a cold one).
  exec round trip     sandboxd: Exec("true") on a live workspace until exited;
                      docker-py: exec_run(["true"]) on a live container; taken in turns call
                      by call, in blocks of 30 calls back to back (the median of each block;
                      four blocks, alternating sides), and 1 s apart.
  read_file           sandboxd: ReadFile of a 100-line file (cat -n text);
                      docker-py: exec_run(["cat", path]) of the same file.
sandboxd does more per exec (a process group, exact exit status, a login shell,
streaming over gRPC), so the ratio is the price of those guarantees less what
its agent saves: no `docker exec` per call.
The two sides' samples are taken in turns within one run, the first of each pair
alternating, because this machine's speed drifts by a third within an hour.
Last, the login shell alone: `bash -lc true` timed inside the raw container as the
workspace user, the least a sandboxd command can cost (every command runs in one).
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


SMALL_FILE = "/workspace/bench-100.txt"
PACE_S = 1.0  # between the pairs of the "calls 1 s apart" row
SMALL_TEXT = "".join(f"line {n}: the quick brown fox jumps over the lazy dog\n" for n in range(1, 101))


async def interleaved(
    socket_path: str, pool_socket: str, runs: int, runtime: str
) -> dict[str, tuple[list[float], list[float]]]:
    """Samples of both sides taken in turns (which goes first alternates), so drift hits both alike."""
    engine = docker.from_env()
    results: dict[str, tuple[list[float], list[float]]] = {
        "create": ([], []),
        "pool": ([], []),
        "rtt": ([], []),
        "blocks": ([], []),
        "paced": ([], []),
        "read": ([], []),
        "shell": ([], []),
    }
    options = {**DOCKER_OPTIONS, "runtime": runtime}

    async def sandboxd_create() -> None:
        ws = await client.create_workspace(runtime=runtime)
        await ws.exec("true").wait(check=True)
        created.append(ws)

    def docker_create() -> None:
        container = engine.containers.run(IMAGE, **options)
        assert container.exec_run(["true"]).exit_code == 0
        containers.append(container)

    async def sandboxd_pool_create() -> None:
        ws = await pooled.create_workspace(runtime=runtime)
        await ws.exec("true").wait(check=True)
        pool_created.append(ws)

    async def pool_ready() -> None:
        deadline = time.monotonic() + 120
        while not any(c.ready for c in await pooled.get_pool() if c.runtime == runtime):
            assert time.monotonic() < deadline, "the pool never held a member"
            await asyncio.sleep(0.05)

    async def sandboxd_true() -> None:
        await live.exec("true").wait(check=True)

    def docker_true() -> None:
        assert raw.exec_run(["true"]).exit_code == 0

    async def sandboxd_read() -> None:
        page = await live.read_file(SMALL_FILE)
        assert page.content.count("\n") >= 99, page

    def docker_read() -> None:
        result = raw.exec_run(["cat", SMALL_FILE])
        assert result.exit_code == 0
        assert result.output.decode() == SMALL_TEXT

    created: list[Any] = []
    pool_created: list[Any] = []
    containers: list[Any] = []
    try:
        async with SandboxClient(socket_path=socket_path) as client, SandboxClient(socket_path=pool_socket) as pooled:
            pairs = [
                ("create", sandboxd_create, lambda: asyncio.to_thread(docker_create), max(3, runs // 4)),
                ("rtt", sandboxd_true, lambda: asyncio.to_thread(docker_true), runs),
                # An agent's calls come seconds apart (the model thinks in between): the
                # spare login shell is ready by then, which back to back under gVisor it
                # may not be (it takes longer to start than a docker-py exec).
                ("paced", sandboxd_true, lambda: asyncio.to_thread(docker_true), max(3, runs // 2)),
                ("read", sandboxd_read, lambda: asyncio.to_thread(docker_read), runs),
            ]
            live = await client.create_workspace(runtime=runtime)
            await live.write_file(SMALL_FILE, SMALL_TEXT)
            await live.exec("true").wait()
            raw = engine.containers.run(IMAGE, **options)
            containers.append(raw)
            assert raw.exec_run(["sh", "-c", f'printf %s "$0" > {SMALL_FILE}', SMALL_TEXT]).exit_code == 0
            # Back to back in blocks: 30 calls of one side with nothing between them, then 30 of the
            # other (interleaving call by call gives the login shell a raw call's time to start).
            for block in range(4):
                order = [(0, sandboxd_true), (1, lambda: asyncio.to_thread(docker_true))]
                for side, call in order if block % 2 == 0 else order[::-1]:
                    await asyncio.sleep(1.0)
                    times = [await timed(call) for _ in range(30)]
                    results["blocks"][side].append(statistics.median(times))
            for name, ours, theirs, count in pairs:
                for index in range(count):
                    if name == "paced":
                        await asyncio.sleep(PACE_S)
                    order = [(0, ours), (1, theirs)] if index % 2 == 0 else [(1, theirs), (0, ours)]
                    for side, call in order:
                        results[name][side].append(await timed(call))
            if runtime != "runc":  # asked for twice: the pool makes it a demand class
                for _ in range(2):
                    await sandboxd_pool_create()
            for index in range(max(3, runs // 4)):
                await pool_ready()
                order = [(0, sandboxd_pool_create), (1, lambda: asyncio.to_thread(docker_create))]
                for side, call in order if index % 2 == 0 else order[::-1]:
                    results["pool"][side].append(await timed(call))
                    if side == 1:
                        await pool_ready()
            for _ in range(5):
                results["shell"][0].append(await asyncio.to_thread(login_shell_s, raw))
            for ws in [live, *created, *pool_created]:
                await ws.delete()
    finally:
        for leftover in engine.containers.list(all=True, filters={"label": f"sandboxd.instance={INSTANCE}"}):
            leftover.remove(force=True, v=True)
        engine.close()
    return results


def login_shell_s(container: Any) -> float:
    """Seconds one `bash -lc true` takes inside ``container`` as the workspace user (mean of 20)."""
    loop = "TIMEFORMAT=%R; time (for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do bash -lc true; done)"
    result = container.exec_run(["bash", "-c", loop], user="1000:1000", demux=True)
    assert result.exit_code == 0, result
    return float(result.output[1].decode().split()[-1]) / 20


def default_runtimes() -> list[str]:
    """runc, and runsc when the engine has it registered."""
    engine = docker.from_env()
    try:
        return ["runc", *(["runsc"] if "runsc" in engine.info().get("Runtimes", {}) else [])]
    finally:
        engine.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--runtime", action="append", choices=("runc", "runsc"), help="repeatable")
    opts = parser.parse_args()
    for runtime in opts.runtime or default_runtimes():
        started = datetime.datetime.now(datetime.UTC)
        pool = {"pool_size": 2} if runtime == "runc" else {"pool_size": 0, "demand_bytes": 4 * 1024**3}
        pooled = private_daemon(**pool, instance=f"{INSTANCE}-pool")
        with private_daemon() as socket_path, pooled as pool_socket:
            results = asyncio.run(interleaved(socket_path, pool_socket, opts.runs, runtime))
        print(
            f"{started:%Y-%m-%d %H:%M} UTC; runtime {runtime}; runs: {opts.runs} round trips and reads, "
            f"{len(results['create'][0])} creations, interleaved; image {IMAGE}"
        )
        print(f"{'':24}{'sandboxd':>38}   {'docker-py':>38}   ratio (median)")
        rows = (
            ("create -> first exec", "create"),
            ("... from the pool", "pool"),
            ("exec `true` round trip", "rtt"),
            ("... 30 back to back", "blocks"),
            ("... calls 1 s apart", "paced"),
            ("read_file, 100 lines", "read"),
        )
        for name, key in rows:
            ours, theirs = results[key]
            ratio = statistics.median(ours) / statistics.median(theirs)
            print(f"{name:24}{summary(ours):>38}   {summary(theirs):>38}   {ratio:5.2f}x")
        shell = results["shell"][0]
        floor = statistics.median(shell) / statistics.median(results["rtt"][1])
        where = "(inside the container)"
        print(f"{'`bash -lc true` alone':24}{summary(shell):>38}   {where:>38}   {floor:5.2f}x")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
