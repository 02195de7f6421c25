"""Load: many workspaces, each running four kinds of calls in loops at once; then unread floods.

Usage: ``.venv/bin/python bench/load.py [--workspaces 32] [--seconds 60] [--floods 10]``.
Starts a private daemon (no warm pool) with its default settings: each workspace holds its own
64 process sessions, and the daemon's held output is bounded by its budget.

  load     every workspace runs four loops at once, one of each kind:
             true       exec("true") to its exit
             seq        exec("seq 1 100000"), all 588,895 bytes of it streamed back
             file       a 1 MiB write_file, then `wc -c` of it in the workspace
             ctrl_c     exec("sleep 100") yielded, then Input("\\u0003") until it exits 130
           and prints calls per second, p50/p99 latency and errors per kind, and where the
           machine's CPU went: the daemon, this client, the workspaces (agents and
           commands, by cgroup), the engine's processes, the rest.
  floods   --floods workspaces each start `yes` that nobody reads, for --seconds.

The load's other side is raw docker-py on the same engine and image: as many containers
(same limits, no network), one thread per loop, each kind as a docker-py user runs it
(``exec_run`` of ``bash -lc``, ``put_archive``, and for Ctrl-C a second exec sending SIGINT).
The two sides take turns (sandboxd, docker-py, docker-py, sandboxd: --seconds in all for each),
and the ratios of their p50s are printed.

The daemon's RSS (/proc) is sampled every half second: before, at its peak and after each part.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import datetime
import io
import os
import sys
import tarfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import docker
from _daemon import IMAGE, INSTANCE, private_daemon_process
from sandboxd_client import Exited, SandboxClient, Workspace, Yielded

KINDS = ("true", "seq", "file", "ctrl_c")
ONE_MIB = b"x" * (1 << 20)
SLICES = 2
"""Turns each side takes: the load alternates between sandboxd and docker-py (the machine drifts)."""


def _tar(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


ONE_MIB_TAR = _tar("load.bin", ONE_MIB)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


_TICK = os.sysconf("SC_CLK_TCK")
_ENGINE = ("dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2", "docker-init", "runsc", "runsc-gofer")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def engine_cpu_s() -> float:
    """CPU seconds of the engine's own processes: dockerd, containerd and the shims (by name)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as comm:
                    name = comm.read().strip()
            except OSError:
                continue
            if name in _ENGINE:
                total += process_cpu_s(int(entry))
    return total


def containers_cpu_s() -> float:
    """CPU seconds of everything in the run's workspace containers (cgroup v1 cpuacct, or v2 cpu.stat)."""
    import docker

    client = docker.from_env()
    total = 0.0
    try:
        for container in client.containers.list(filters={"label": f"sandboxd.instance={INSTANCE}"}):
            for path in (f"/sys/fs/cgroup/cpuacct/docker/{container.id}/cpuacct.usage",):
                with contextlib.suppress(OSError), open(path) as usage:
                    total += int(usage.read()) / 1e9
    finally:
        client.close()
    return total


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent not idle (/proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / _TICK


class CpuShare:
    """Where the machine's CPU went during a part: the daemon, this client, the workspaces, the engine."""

    def __init__(self, daemon_pid: int) -> None:
        self.daemon_pid = daemon_pid

    def read(self) -> dict[str, float]:
        return {
            "machine": machine_busy_s(),
            "daemon": process_cpu_s(self.daemon_pid),
            "bench client": process_cpu_s(os.getpid()),
            "workspaces": containers_cpu_s(),
            "engine": engine_cpu_s(),
        }

    def __enter__(self) -> CpuShare:
        self.before = self.read()
        return self

    def __exit__(self, *exc: object) -> None:
        self.spent = {key: value - self.before[key] for key, value in self.read().items()}

    @staticmethod
    def describe(spent: dict[str, float], seconds: float) -> str:
        spent = dict(spent)
        machine = spent.pop("machine")
        parts = ", ".join(f"{name} {value:.0f}" for name, value in spent.items())
        other = machine - sum(spent.values())
        return (
            f"CPU seconds ({os.cpu_count()} cores x {seconds:g} s = {os.cpu_count() * seconds:.0f}): "
            f"machine busy {machine:.0f}: {parts}, the rest {other:.0f}"
        )


class Sampler:
    """The daemon's RSS every half second while a part runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Sampler:
        self.before = rss_mib(self.pid)
        self.peak = self.before
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_mib(self.pid))
            await asyncio.sleep(0.5)

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self.after = rss_mib(self.pid)


async def call_true(ws: Workspace) -> None:
    result = await ws.exec("true").wait()
    assert result.exit_code == 0, result


async def call_seq(ws: Workspace) -> None:
    result = await ws.exec("seq 1 100000").wait()
    assert result.exit_code == 0, result
    assert len(result.stdout) == 588_895, len(result.stdout)


async def call_file(ws: Workspace) -> None:
    await ws.write_file("/workspace/load.bin", ONE_MIB)
    result = await ws.exec("wc -c < /workspace/load.bin").wait()
    assert result.stdout.strip() == str(1 << 20), result.stdout


async def call_ctrl_c(ws: Workspace) -> None:
    events = [event async for event in ws.exec("sleep 100", yield_after_s=0.25)]
    assert isinstance(events[-1], Yielded), events[-1]
    process_id = events[-1].process_id
    events = [event async for event in ws.client.input(process_id, "\u0003")]
    while isinstance(events[-1], Yielded):
        events = [event async for event in ws.client.input(process_id, yield_after_s=1)]
    assert isinstance(events[-1], Exited), events[-1]
    assert events[-1].exit_code == 130, events[-1]


CALLS: dict[str, Callable[[Workspace], Awaitable[None]]] = {
    "true": call_true,
    "seq": call_seq,
    "file": call_file,
    "ctrl_c": call_ctrl_c,
}


async def loop(
    ws: Workspace, kind: str, until: float, times: dict[str, list[float]], errors: dict[str, list[str]]
) -> None:
    while time.monotonic() < until:
        start = time.perf_counter()
        try:
            await CALLS[kind](ws)
        except Exception as exc:  # every failure is counted and shown, the loop goes on
            errors[kind].append(f"{type(exc).__name__}: {exc}"[:200])
        else:
            times[kind].append(time.perf_counter() - start)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def raw_call(container: Any, kind: str) -> None:
    """One call of ``kind`` the way a docker-py user makes it: ``exec_run`` of ``bash -lc``."""
    api = container.client.api
    if kind == "true":
        assert container.exec_run(["bash", "-lc", "true"]).exit_code == 0
    elif kind == "seq":
        result = container.exec_run(["bash", "-lc", "seq 1 100000"])
        assert result.exit_code == 0, result
        assert len(result.output) == 588_895, len(result.output)
    elif kind == "file":
        assert container.put_archive("/tmp", ONE_MIB_TAR)
        result = container.exec_run(["bash", "-lc", "wc -c < /tmp/load.bin"])
        assert result.output.strip() == str(1 << 20).encode(), result.output
    else:  # Ctrl-C has no call in the engine's API: SIGINT by a second exec, once the sleep is there
        exec_id = api.exec_create(container.id, ["bash", "-lc", "sleep 100"])["Id"]
        api.exec_start(exec_id, detach=True)
        signal = container.exec_run(["bash", "-c", "until pkill -INT -f '^sleep 100$'; do sleep 0.01; done"])
        assert signal.exit_code == 0, signal
        while (inspected := api.exec_inspect(exec_id))["Running"]:
            time.sleep(0.005)
        assert inspected["ExitCode"] == 130, inspected


def raw_slice(
    containers: list[Any], seconds: float, times: dict[str, list[float]], errors: dict[str, list[str]]
) -> None:
    """Every container runs the four kinds in loops at once for ``seconds``, one thread per loop."""
    until = time.monotonic() + seconds

    def loop(container: Any, kind: str) -> None:
        while time.monotonic() < until:
            start = time.perf_counter()
            try:
                raw_call(container, kind)
            except Exception as exc:  # counted and shown, as on the sandboxd side
                errors[kind].append(f"{type(exc).__name__}: {exc}"[:200])
            else:
                times[kind].append(time.perf_counter() - start)

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(containers) * len(KINDS)) as pool:
        for future in [pool.submit(loop, c, kind) for c in containers for kind in KINDS]:
            future.result()


def print_table(name: str, seconds: float, times: dict[str, list[float]], errors: dict[str, list[str]]) -> None:
    print(f"{name}")
    print(f"{'kind':8}{'calls':>8}{'per s':>9}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}")
    for kind in KINDS:
        done = times[kind]
        p50, p99 = percentile(done, 0.5) * 1000, percentile(done, 0.99) * 1000
        print(f"{kind:8}{len(done):8}{len(done) / seconds:9.1f}{p50:10.1f}{p99:10.1f}{len(errors[kind]):8}")
        for error in sorted(set(errors[kind]))[:3]:
            print(f"    {error}")


async def run(socket_path: str, pid: int, opts: argparse.Namespace) -> int:
    engine = docker.from_env(max_pool_size=opts.workspaces * len(KINDS) + 8, timeout=300)
    async with SandboxClient(socket_path=socket_path, retries=False) as client:
        made = time.perf_counter()
        workspaces = await asyncio.gather(
            *(client.create_workspace(labels={"bench": "load"}) for _ in range(opts.workspaces))
        )
        print(f"created {len(workspaces)} workspaces in {time.perf_counter() - made:.1f} s")
        # The same image and limits, started as a docker-py user does (no agent, no daemon).
        containers = [
            engine.containers.run(
                IMAGE,
                ["sleep", "infinity"],
                detach=True,
                init=True,
                network_mode="none",
                mem_limit=1 << 30,
                nano_cpus=1_000_000_000,
                pids_limit=512,
                labels={"sandboxd.instance": INSTANCE},
            )
            for _ in range(opts.workspaces)
        ]
        try:
            sides = {
                "sandboxd": ({k: [] for k in KINDS}, {k: [] for k in KINDS}),
                "docker-py": ({k: [] for k in KINDS}, {k: [] for k in KINDS}),
            }
            spent: dict[str, dict[str, float]] = {}
            slice_s = opts.seconds / SLICES
            async with Sampler(pid) as load:
                for number in range(2 * SLICES):
                    # Turns: sandboxd, docker-py, docker-py, sandboxd, ... so neither side always goes first.
                    side = ("sandboxd", "docker-py")[(number + number // 2) % 2]
                    times, errors = sides[side]
                    with CpuShare(pid) as cpu:
                        if side == "sandboxd":
                            until = time.monotonic() + slice_s
                            await asyncio.gather(
                                *(loop(ws, kind, until, times, errors) for ws in workspaces for kind in KINDS)
                            )
                        else:
                            await asyncio.to_thread(raw_slice, containers, slice_s, times, errors)
                    for key, value in cpu.spent.items():
                        spent.setdefault(side, {}).setdefault(key, 0.0)
                        spent[side][key] += value
            for side, (times, errors) in sides.items():
                print(
                    f"\nload, {side}: {opts.workspaces} workspaces x {len(KINDS)} loops, "
                    f"{SLICES} turns of {slice_s:g} s (interleaved)"
                )
                print_table("", opts.seconds, times, errors)
                print(CpuShare.describe(spent[side], opts.seconds))
            for kind in KINDS:
                ours, theirs = percentile(sides["sandboxd"][0][kind], 0.5), percentile(sides["docker-py"][0][kind], 0.5)
                print(f"p50 {kind}: sandboxd/docker-py {ours / theirs:.2f}x")
            print(f"daemon RSS: before {load.before:.1f} MiB, peak {load.peak:.1f}, after {load.after:.1f}")
            flooders = workspaces[: opts.floods]
            async with Sampler(pid) as floods:
                for ws in flooders:
                    events = [event async for event in ws.exec("yes", yield_after_s=0.25, timeout_s=opts.seconds + 30)]
                    assert isinstance(events[-1], Yielded), events[-1]
                await asyncio.sleep(opts.seconds)
            print(f"\nfloods: {len(flooders)} unread `yes` for {opts.seconds:g} s")
            print(
                f"daemon RSS: before {floods.before:.1f} MiB, peak {floods.peak:.1f}, after {floods.after:.1f} "
                f"(growth {floods.peak - floods.before:+.1f} MiB)"
            )
            total_errors = sum(len(e) for e in sides["sandboxd"][1].values())
        finally:
            await asyncio.gather(*(ws.delete() for ws in workspaces), return_exceptions=True)
            for container in containers:
                container.remove(force=True)
            engine.close()
    return 1 if total_errors else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspaces", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--floods", type=int, default=10)
    opts = parser.parse_args()
    started = datetime.datetime.now(datetime.UTC)
    print(f"{started:%Y-%m-%d %H:%M} UTC; the daemon's default settings (64 sessions a workspace)")
    with private_daemon_process() as (socket_path, pid):
        return asyncio.run(run(socket_path, pid, opts))


if __name__ == "__main__":
    sys.exit(main())
