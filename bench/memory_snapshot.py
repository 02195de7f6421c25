"""Memory snapshots under gVisor: sandboxd's snapshot and fork vs the engine's checkpoint and restore called directly.

Usage: ``.venv/bin/python bench/memory_snapshot.py [--runs N] [--mib M]``.
Needs runsc and the engine's checkpoints (``scripts/enable-checkpoints``), the default
workspace image and the agent (``./dev test`` builds both); starts a private daemon and
removes everything it made.

Both sides hold one Python process with ``--mib`` MiB of touched memory (200 by default):
sandboxd's in a runsc workspace, the raw side's as the main process of a runsc container of
the same image and hardening. The two sides' samples are taken in turns (which goes first
alternates):
  snapshot with memory
      sandboxd: SnapshotWorkspace(include_memory) (the agent lets go of its socket, the
      checkpoint, the commit of the root filesystem and the copy of /workspace);
      raw: the engine's checkpoint API with leave-running (``docker checkpoint create
      --leave-running``), and, for what the files cost, that checkpoint and a commit.
  fork -> first exec
      sandboxd: CreateWorkspace(from_snapshot) + Exec("true"); raw: a container created of
      the same image, the checkpoint linked into its directory, started from it, exec_run("true").
Then ten forks of one memory snapshot at once against one alone (to a first exec each), and
the daemon's resident memory after snapshots of 20 MiB and of the run's size.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import docker
from _daemon import IMAGE, private_daemon_process, snapshot_and_fork
from exec_latency import DOCKER_OPTIONS, summary
from sandboxd_client import SandboxClient


def hold(mib: int) -> str:
    """A Python program that touches ``mib`` MiB, says "ready", and sleeps."""
    return (
        f"import time; b = bytearray({mib} << 20); b[::4096] = b'x' * len(b[::4096]); "
        "print('ready', flush=True); time.sleep(10**6)"
    )


async def holding(client: SandboxClient, mib: int) -> Any:
    """A runsc workspace whose Python process holds ``mib`` MiB, once it says it is ready."""
    ws = await client.create_workspace(runtime="runsc", memory_bytes=1 << 30)
    async for event in ws.exec(f'exec python3 -c "{hold(mib)}"', yield_after_s=30):
        if "ready" in getattr(event, "text", ""):
            break
    return ws


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Raw:
    """The engine's checkpoint and restore, through docker-py's low-level client."""

    def __init__(self, engine: docker.DockerClient, mib: int) -> None:
        self.engine = engine
        self.api = engine.api
        self.root = Path(engine.info()["DockerRootDir"])
        options = {**DOCKER_OPTIONS, "runtime": "runsc", "entrypoint": ["python3", "-c", hold(mib)]}
        self.options = options
        self.source = engine.containers.run(IMAGE, **options)
        for line in self.source.logs(stream=True):
            if b"ready" in line:
                break

    def checkpoint(self, name: str) -> None:
        response = self.api._post_json(
            self.api._url("/containers/{0}/checkpoints", self.source.id), data={"CheckpointID": name, "Exit": False}
        )
        self.api._raise_for_status(response)

    def commit(self, tag: str) -> str:
        return str(self.source.commit(f"sandboxd-bench/memory:{tag}").id)

    def restore(self, name: str, image: str) -> Any:
        created = self.api.create_container(
            image,
            entrypoint=self.options["entrypoint"],
            labels=self.options["labels"],
            host_config=self.api.create_host_config(
                init=True,
                runtime="runsc",
                network_mode="none",
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                mem_limit="1g",
                pids_limit=512,
            ),
        )
        own = self.root / "containers" / created["Id"] / "checkpoints" / name
        own.mkdir(parents=True)
        os.link(
            self.root / "containers" / self.source.id / "checkpoints" / name / "checkpoint.img", own / "checkpoint.img"
        )
        # As sandboxd does: a file naming the container makes each restore's upload content of
        # its own (the engine's uploads of one digest at once collide), so restores run at once.
        (own / "fork").write_text(created["Id"])
        response = self.api._post(self.api._url("/containers/{0}/start", created["Id"]), params={"checkpoint": name})
        self.api._raise_for_status(response)
        container = self.engine.containers.get(created["Id"])
        assert container.exec_run(["true"]).exit_code == 0
        return container

    def forget(self, name: str) -> None:
        self.api._raise_for_status(
            self.api._delete(self.api._url("/containers/{0}/checkpoints/{1}", self.source.id, name))
        )


async def run(socket_path: str, pid: int, runs: int, mib: int) -> dict[str, Any]:
    engine = docker.from_env()
    results: dict[str, Any] = {key: ([], []) for key in ("snapshot", "fork")}
    results["with_commit"] = []
    raw = await asyncio.to_thread(Raw, engine, mib)
    try:
        async with SandboxClient(socket_path=socket_path) as client:
            ws = await holding(client, mib)
            for index in range(runs):
                for side in ("ours", "theirs") if index % 2 == 0 else ("theirs", "ours"):
                    if side == "ours":
                        snapshot_s, fork_s = await snapshot_and_fork(client, ws, f"bench-{index}", include_memory=True)
                        results["snapshot"][0].append(snapshot_s)
                        results["fork"][0].append(fork_s)
                    else:
                        name = f"bench{index}"
                        began = time.perf_counter()
                        await asyncio.to_thread(raw.checkpoint, name)
                        results["snapshot"][1].append(time.perf_counter() - began)
                        image = await asyncio.to_thread(raw.commit, name)
                        results["with_commit"].append(time.perf_counter() - began)
                        began = time.perf_counter()
                        restored = await asyncio.to_thread(raw.restore, name, image)
                        results["fork"][1].append(time.perf_counter() - began)
                        await asyncio.to_thread(restored.remove, force=True, v=True)
                        await asyncio.to_thread(raw.forget, name)
                        await asyncio.to_thread(engine.images.remove, image, force=True)
            # Ten forks of one memory snapshot at once, against one alone (each to its first exec).
            await ws.snapshot("bench-ten", include_memory=True)

            async def fork_and_exec() -> float:
                began = time.perf_counter()
                fork = await client.create_workspace(from_snapshot="bench-ten")
                await fork.exec("true").wait(check=True)
                took = time.perf_counter() - began
                forks.append(fork)
                return took

            forks: list[Any] = []
            one, ten = [], []
            for _ in range(2):
                one.append(await fork_and_exec())
                began = time.perf_counter()
                await asyncio.gather(*(fork_and_exec() for _ in range(10)))
                ten.append(time.perf_counter() - began)
                for fork in forks:
                    await fork.delete()
                forks.clear()
            await client.delete_snapshot("bench-ten")
            results["ten"] = (one, ten)
            # The raw engine's ten restores of one checkpoint at once, against one alone.
            await asyncio.to_thread(raw.checkpoint, "bench-ten")
            image = await asyncio.to_thread(raw.commit, "bench-ten")
            raw_one, raw_ten = [], []
            for _ in range(2):
                began = time.perf_counter()
                restored = [await asyncio.to_thread(raw.restore, "bench-ten", image)]
                raw_one.append(time.perf_counter() - began)
                began = time.perf_counter()
                restored += await asyncio.gather(
                    *(asyncio.to_thread(raw.restore, "bench-ten", image) for _ in range(10))
                )
                raw_ten.append(time.perf_counter() - began)
                for container in restored:
                    await asyncio.to_thread(container.remove, force=True, v=True)
            await asyncio.to_thread(raw.forget, "bench-ten")
            await asyncio.to_thread(engine.images.remove, image, force=True)
            results["raw_ten"] = (raw_one, raw_ten)
            # The daemon's memory after snapshots of a small and of the run's size.
            sizes = []
            for size in (20, mib):
                small = await holding(client, size)
                await small.snapshot(f"rss-{size}", include_memory=True)
                fork = await client.create_workspace(from_snapshot=f"rss-{size}")
                sizes.append((size, rss_mib(pid)))
                for each in (fork, small):
                    await each.delete()
                await client.delete_snapshot(f"rss-{size}")
            results["rss"] = sizes
            await ws.delete()
    finally:
        await asyncio.to_thread(raw.source.remove, force=True, v=True)
        engine.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--mib", type=int, default=200)
    opts = parser.parse_args()
    started = datetime.datetime.now(datetime.UTC)
    with private_daemon_process() as (socket_path, pid):
        results = asyncio.run(run(socket_path, pid, opts.runs, opts.mib))
    print(
        f"{started:%Y-%m-%d %H:%M} UTC; runtime runsc; a {opts.mib} MiB Python process; "
        f"{opts.runs} samples a side, interleaved; {IMAGE}"
    )
    print(f"{'':30}{'sandboxd':>38}   {'raw engine':>38}   ratio (median)")
    for name, key in (("snapshot with memory", "snapshot"), ("fork -> first exec", "fork")):
        ours, theirs = results[key]
        ratio = statistics.median(ours) / statistics.median(theirs)
        print(f"{name:30}{summary(ours):>38}   {summary(theirs):>38}   {ratio:5.2f}x")
    print(f"{'raw checkpoint + commit':30}{'':>38}   {summary(results['with_commit']):>38}")
    for what, key in (("sandboxd: ten forks", "ten"), ("raw engine: ten restores", "raw_ten")):
        one, ten = results[key]
        print(
            f"{what} of one memory snapshot at once: {statistics.median(ten) * 1000:.0f} ms, one alone "
            f"{statistics.median(one) * 1000:.0f} ms: {statistics.median(ten) / statistics.median(one):.2f}x"
        )
    print("daemon RSS after a snapshot and a fork: " + ", ".join(f"{s} MiB: {r:.0f} MiB" for s, r in results["rss"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
