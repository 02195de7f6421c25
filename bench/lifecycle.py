"""Workspace lifecycle at pool speed: a claim, the refill, back-to-back creates, resume; vs raw docker-py.

Usage: ``.venv/bin/python bench/lifecycle.py [--runs N] [--runtime runc|runsc ...]``.
Starts a private daemon with a warm pool of 2 (its own socket and instance label), needs
the default workspace image and the agent (``./dev test`` builds both), and removes
everything it made.

What is compared, the two sides' samples taken in turns (which goes first alternates):
  create -> first exec, from the pool
      sandboxd: CreateWorkspace + Exec("true") until exited, the pool full before each
      (its refill is waited for, untimed); docker-py: containers.run(detach) + exec_run("true").
  refill vs a cold create
      sandboxd: from a claim until the pool holds 2 again; and CreateWorkspace + Exec("true")
      of a spec no class has (a container started), to compare with.
  20 back-to-back creates, pool of 2
      sandboxd: 20 CreateWorkspace + Exec("true") in a row, not waiting for the refill
      (claims while it keeps up, normal creates when it does not); docker-py: 20
      containers.run + exec_run in a row. Every one must succeed.
  resume -> first exec
      sandboxd: ResumeWorkspace + Exec("true") of a paused workspace;
      docker-py: unpause + exec_run("true") of a paused container.
  snapshot, 1,000 files
      sandboxd: SnapshotWorkspace of a workspace with 1,000 small files in /workspace (its root
      filesystem and its volume); docker-py: commit of a container with the same files in its
      root filesystem (a volume a commit would not take).
  fork -> first exec
      sandboxd: CreateWorkspace(from_snapshot) + Exec("true"), the 1,000 files copied into the
      fork's volume; docker-py: containers.run of the committed image + exec_run("true").
  20 forks at once
      the wall time of 20 of those at once (sandboxd: 20 creates and execs in one gather;
      docker-py: 20 threads), once a side; the issue's bound is against one fork's median.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import statistics
import sys
import tempfile
import time
from typing import Any

import docker
from _daemon import IMAGE, private_daemon, snapshot_and_fork
from exec_latency import DOCKER_OPTIONS, default_runtimes, summary
from sandboxd_client import SandboxClient

POOL = 2


async def pool_state(client: SandboxClient) -> tuple[int, int, int]:
    """The pool class of the run: ready members, claims, misses."""
    (pool_class,) = await client.get_pool()
    return pool_class.ready, pool_class.claims, pool_class.misses


async def until_full(client: SandboxClient) -> float:
    """Seconds until the pool holds POOL ready members again (polled every 5 ms)."""
    began = time.perf_counter()
    while (await pool_state(client))[0] < POOL:  # noqa: ASYNC110 - the daemon's state, polled over gRPC
        await asyncio.sleep(0.005)
    return time.perf_counter() - began


async def run(socket_path: str, runs: int, runtime: str) -> dict[str, Any]:
    engine = docker.from_env()
    options = {**DOCKER_OPTIONS, "runtime": runtime}
    results: dict[str, Any] = {
        key: ([], []) for key in ("claim", "refill", "burst", "resume", "snapshot", "fork", "forks20")
    }
    results["kinds"] = []

    def raw_create() -> Any:
        container = engine.containers.run(IMAGE, **options)
        assert container.exec_run(["true"]).exit_code == 0
        return container

    try:
        async with SandboxClient(socket_path=socket_path) as client:

            async def create(**spec: Any) -> Any:
                ws = await client.create_workspace(runtime=runtime, **spec)
                await ws.exec("true").wait(check=True)
                return ws

            await until_full(client)
            for index in range(runs):
                order = ("ours", "theirs") if index % 2 == 0 else ("theirs", "ours")
                for side in order:
                    if side == "ours":
                        await until_full(client)
                        began = time.perf_counter()
                        ws = await create()
                        results["claim"][0].append(time.perf_counter() - began)
                        results["refill"][0].append(await until_full(client))
                        await ws.delete()
                        began = time.perf_counter()
                        cold = await create(pids=513)  # no class has it: a container started
                        results["refill"][1].append(time.perf_counter() - began)
                        await cold.delete()
                    else:
                        began = time.perf_counter()
                        container = await asyncio.to_thread(raw_create)
                        results["claim"][1].append(time.perf_counter() - began)
                        await asyncio.to_thread(container.remove, force=True, v=True)

            # 20 in a row each: the pool's refill races the creates; what is made stays until the end.
            await until_full(client)
            _, claims_before, misses_before = await pool_state(client)
            made: list[Any] = []
            raw: list[Any] = []
            for index in range(20):
                for side in ("ours", "theirs") if index % 2 == 0 else ("theirs", "ours"):
                    began = time.perf_counter()
                    if side == "ours":
                        made.append(await create())
                        results["burst"][0].append(time.perf_counter() - began)
                    else:
                        raw.append(await asyncio.to_thread(raw_create))
                        results["burst"][1].append(time.perf_counter() - began)
            _, claims, misses = await pool_state(client)
            results["kinds"] = [claims - claims_before, misses - misses_before]
            for ws in made:
                await ws.delete()
            for container in raw:
                await asyncio.to_thread(container.remove, force=True, v=True)

            live = await create()
            container = await asyncio.to_thread(raw_create)
            for index in range(runs):
                for side in ("ours", "theirs") if index % 2 == 0 else ("theirs", "ours"):
                    if side == "ours":
                        await live.pause()
                        began = time.perf_counter()
                        await live.resume()
                        await live.exec("true").wait(check=True)
                        results["resume"][0].append(time.perf_counter() - began)
                    else:
                        await asyncio.to_thread(container.pause)
                        began = time.perf_counter()
                        await asyncio.to_thread(container.unpause)
                        assert (await asyncio.to_thread(container.exec_run, ["true"])).exit_code == 0
                        results["resume"][1].append(time.perf_counter() - began)
            many = "for i in $(seq 1000); do echo $i > /workspace/f$i; done"
            await live.exec(many).wait(check=True)
            assert (
                await asyncio.to_thread(container.exec_run, ["sh", "-c", many.replace("/workspace", "/tmp")])
            ).exit_code == 0
            for index in range(max(3, runs // 3)):
                for side in ("ours", "theirs") if index % 2 == 0 else ("theirs", "ours"):
                    if side == "ours":
                        snapshot_s, fork_s = await snapshot_and_fork(client, live, f"bench-{index}")
                        results["snapshot"][0].append(snapshot_s)
                        results["fork"][0].append(fork_s)
                    else:
                        began = time.perf_counter()
                        image = await asyncio.to_thread(container.commit, f"sandboxd-bench/commit:{index}")
                        results["snapshot"][1].append(time.perf_counter() - began)
                        began = time.perf_counter()
                        forked = await asyncio.to_thread(engine.containers.run, image.id, **options)
                        assert (await asyncio.to_thread(forked.exec_run, ["true"])).exit_code == 0
                        results["fork"][1].append(time.perf_counter() - began)
                        await asyncio.to_thread(forked.remove, force=True, v=True)
                        await asyncio.to_thread(engine.images.remove, image.id, force=True)
            # 20 forks of one snapshot at once, each side once.
            await live.snapshot("bench-many")
            image = await asyncio.to_thread(container.commit, "sandboxd-bench/commit:many")

            async def one_fork() -> Any:
                fork = await client.create_workspace(from_snapshot="bench-many")
                await fork.exec("true").wait(check=True)
                return fork

            def one_raw() -> Any:
                forked = engine.containers.run(image.id, **options)
                assert forked.exec_run(["true"]).exit_code == 0
                return forked

            began = time.perf_counter()
            forks = await asyncio.gather(*(one_fork() for _ in range(20)))
            results["forks20"][0].append(time.perf_counter() - began)
            began = time.perf_counter()
            raws = await asyncio.gather(*(asyncio.to_thread(one_raw) for _ in range(20)))
            results["forks20"][1].append(time.perf_counter() - began)
            for fork in forks:
                await fork.delete()
            for forked in raws:
                await asyncio.to_thread(forked.remove, force=True, v=True)
            await client.delete_snapshot("bench-many")
            await asyncio.to_thread(engine.images.remove, image.id, force=True)
            await live.delete()
            await asyncio.to_thread(container.remove, force=True, v=True)
    finally:
        engine.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--runtime", action="append", choices=("runc", "runsc"), help="repeatable")
    opts = parser.parse_args()
    for runtime in opts.runtime or default_runtimes():
        started = datetime.datetime.now(datetime.UTC)
        pool_file = ""
        if runtime != "runc":  # the default class is runc's: the run's class is runsc's
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
                f.write(f"- name: bench\n  size: {POOL}\n  runtime: {runtime}\n")
            pool_file = f.name
        with private_daemon(pool_size=POOL if runtime == "runc" else 0, pool_file=pool_file) as socket_path:
            results = asyncio.run(run(socket_path, opts.runs, runtime))
        print(f"{started:%Y-%m-%d %H:%M} UTC; runtime {runtime}; {opts.runs} samples a side, interleaved; {IMAGE}")
        print(f"{'':30}{'sandboxd':>38}   {'docker-py':>38}   ratio (median)")
        rows = (
            ("create -> first exec, pool", "claim", "containers.run + exec_run"),
            ("refill | cold create", "refill", ""),
            ("20 back-to-back creates", "burst", ""),
            ("resume -> first exec", "resume", "unpause + exec_run"),
            ("snapshot, 1,000 files", "snapshot", "commit"),
            ("fork -> first exec", "fork", "containers.run + exec_run"),
            ("20 forks at once (wall)", "forks20", ""),
        )
        for name, key, _ in rows:
            ours, theirs = results[key]
            ratio = statistics.median(ours) / statistics.median(theirs)
            print(f"{name:30}{summary(ours):>38}   {summary(theirs):>38}   {ratio:5.2f}x")
        one = statistics.median(results["fork"][0])
        print(f"(20 forks at once: {results['forks20'][0][0] / one:.2f}x one fork's median)")
        claims, misses = results["kinds"]
        print(f"(refill's right side: sandboxd's own cold create; back-to-back: {claims} claims, {misses} misses)")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
