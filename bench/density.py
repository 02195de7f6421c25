"""How far one machine goes: idle workspaces in steps, what each costs, and callers at once.

Usage: ``.venv/bin/python bench/density.py [--runtime runc] [--steps 10,50,100,250,500,750,1000]
[--concurrency 1,2,4,8,16,32,64,128] [--png bench/density-runc.png]``.

Starts a private daemon (its own process, socket and instance label; no warm pool) and
creates idle workspaces (the default spec: no network, 1 GiB, 512 pids) up to each step,
four creates at once. At each step, once the engine has settled:

  daemon     its RSS (MiB) and its CPU while everything idles (% of one core, over 10 s)
  engine     dockerd, containerd, the containerd shims and gVisor's sandboxes and gofers (runsc):
             their RSS together and CPU
  agent      the RSS of each workspace's agent (median, MiB), and its threads
  host       MemAvailable gone since before the first workspace, per workspace (MiB)
  tasks      the machine's tasks (threads) against kernel.pid_max
  exec       p50 and p99 of `true` on 40 random workspaces, 0.1 s apart, each of which ran a
             command before (its login shell ready, as for an agent's calls seconds apart)
  read       p50 and p99 of a 100-line read_file on random workspaces, the same way
  create     p50 and p99 of the step's creates

It stops at the first step that fails (a create refused, a call that errs), or before a step
that would take the machine's tasks past 95% of kernel.pid_max (each workspace's threads,
measured at the steps before) or its available memory under 2 GiB, and says what limit it met. Then, with all but 32
workspaces removed, 1 to 128 callers run `true` in loops on those 32 for 10 s each: calls per
second and p50/p99.

Everything it made is removed at the end. Tables print as it goes; with matplotlib
installed, ``--png`` draws the curves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import docker
from sandboxd_client import SandboxClient, SandboxError, Workspace

SMALL = "".join(f"line {n}: the quick brown fox jumps over the lazy dog\n" for n in range(1, 101))
_TICK = os.sysconf("SC_CLK_TCK")
_ENGINE = ("dockerd", "containerd")
_SHIMS = ("containerd-shim", "containerd-shim-runc-v2", "runsc", "runsc-gofer", "runsc-sandbox", "fuse-overlayfs")


def _status(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _by_name(names: tuple[str, ...]) -> list[int]:
    """The processes whose name or first argument is one of ``names`` (a gVisor sandbox is named
    ``exe``: its first argument is ``runsc-sandbox``)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as comm:
                    name = comm.read().strip()
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    first = cmdline.read(64).split(b"\0", 1)[0].decode(errors="replace")
            except OSError:
                continue
            if name in names or first in names:
                found.append(int(entry))
    return found


def _mem_available_mib() -> float:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _tasks() -> int:
    with open("/proc/loadavg") as loadavg:
        return int(loadavg.read().split()[3].split("/")[1])


def _pid_max() -> int:
    with open("/proc/sys/kernel/pid_max") as pid_max:
        return int(pid_max.read())


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else 0.0


class Daemon:
    """The daemon under measure: its own process, so its RSS and CPU are its own."""

    def __init__(self, directory: Path, runtime: str) -> None:
        """Start it and wait until its socket answers."""
        self.instance = f"density-{secrets.token_hex(4)}"
        self.socket_path = str(directory / "density.sock")
        env = {
            **os.environ,
            "SANDBOXD_SOCKET": self.socket_path,
            "SANDBOXD_INSTANCE": self.instance,
            "SANDBOXD_LOG_LEVEL": "warning",
            "SANDBOXD_POOL_SIZE": "0",
            "SANDBOXD_POOL_DEMAND_MEMORY_BYTES": "0",
            "SANDBOXD_DEFAULT_RUNTIME": runtime,
            "SANDBOXD_AUDIT_LOG": str(directory / "audit.jsonl"),
        }
        self.log = (directory / "daemon.log").open("wb")
        self.process = subprocess.Popen(
            [str(Path(sys.executable).with_name("sandboxd")), "serve", "--no-build"], env=env, stderr=self.log
        )
        deadline = time.monotonic() + 60
        while not Path(self.socket_path).exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                msg = "the daemon did not start"
                raise RuntimeError(msg)
            time.sleep(0.05)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(120)
        self.log.close()


async def _timed(call: Any) -> float:
    began = time.perf_counter()
    await call
    return time.perf_counter() - began


async def _create_many(client: SandboxClient, count: int, runtime: str) -> tuple[list[Workspace], list[float], str]:
    """``count`` creates, four at once: the workspaces, their times, and the first failure's words."""
    made: list[Workspace] = []
    times: list[float] = []
    failure = ""
    gate = asyncio.Semaphore(4)

    async def one() -> None:
        nonlocal failure
        async with gate:
            if failure:
                return
            began = time.perf_counter()
            try:
                ws = await client.create_workspace(labels={"bench": "density"}, runtime=runtime)
                await ws.write_file("/workspace/small.txt", SMALL)
            except SandboxError as exc:
                failure = failure or f"{type(exc).__name__}: {exc.message}"
                return
            times.append(time.perf_counter() - began)
            made.append(ws)

    await asyncio.gather(*(one() for _ in range(count)))
    return made, times, failure


def _agents(engine: docker.DockerClient, instance: str) -> tuple[list[float], list[int]]:
    """The RSS (MiB) and threads of each workspace's agent (the child of its container's init)."""
    rss, threads = [], []
    for container in engine.containers.list(filters={"label": f"sandboxd.instance={instance}"}):
        init = container.attrs["State"]["Pid"]
        try:
            children = Path(f"/proc/{init}/task/{init}/children").read_text().split()
        except OSError:
            continue
        for child in children:
            rss.append(_status(int(child), "VmRSS") / 1024)
            threads.append(_status(int(child), "Threads"))
    return rss, threads


async def _paced(workspaces: list[Workspace], calls: int, what: str) -> tuple[list[float], str]:
    """``calls`` calls 0.1 s apart on distinct random workspaces, each of which has run a command
    before (its login shell for the next one is ready, as for an agent's calls seconds apart)."""
    samples: list[float] = []
    chosen = random.sample(workspaces, min(calls, len(workspaces)))
    if what == "exec":
        for ws in chosen:
            await ws.exec("true").wait()
        await asyncio.sleep(1)
    for ws in (chosen * calls)[:calls]:
        try:
            if what == "exec":
                samples.append(await _timed(ws.exec("true").wait(check=True)))
            else:
                samples.append(await _timed(ws.read_file("/workspace/small.txt")))
        except SandboxError as exc:
            return samples, f"{what}: {type(exc).__name__}: {exc.message}"
        await asyncio.sleep(0.1)
    return samples, ""


async def _measure(
    daemon: Daemon, engine: docker.DockerClient, workspaces: list[Workspace], before_mib: float
) -> dict[str, Any]:
    await asyncio.sleep(5)  # the engine settles after the creates
    engine_pids = _by_name(_ENGINE)
    shim_pids = _by_name(_SHIMS)
    cpu0 = _cpu_s(daemon.process.pid), sum(_cpu_s(p) for p in engine_pids + shim_pids)
    await asyncio.sleep(10)
    cpu1 = _cpu_s(daemon.process.pid), sum(_cpu_s(p) for p in engine_pids + shim_pids)
    agent_rss, agent_threads = _agents(engine, daemon.instance)
    execs, exec_error = await _paced(workspaces, 40, "exec")
    reads, read_error = await _paced(workspaces, 40, "read")
    n = len(workspaces)
    return {
        "workspaces": n,
        "daemon_rss": _status(daemon.process.pid, "VmRSS") / 1024,
        "daemon_cpu": (cpu1[0] - cpu0[0]) / 10 * 100,
        "engine_rss": sum(_status(p, "VmRSS") for p in engine_pids + shim_pids) / 1024,
        "engine_cpu": (cpu1[1] - cpu0[1]) / 10 * 100,
        "agent_rss": statistics.median(agent_rss) if agent_rss else 0.0,
        "agent_threads": statistics.median(agent_threads) if agent_threads else 0,
        "host_per_ws": (before_mib - _mem_available_mib()) / max(1, n),
        "tasks": _tasks(),
        "exec_p50": statistics.median(execs) * 1000 if execs else 0.0,
        "exec_p99": _pct(execs, 0.99) * 1000,
        "read_p50": statistics.median(reads) * 1000 if reads else 0.0,
        "read_p99": _pct(reads, 0.99) * 1000,
        "error": exec_error or read_error,
    }


async def _concurrency(workspaces: list[Workspace], levels: list[int]) -> list[dict[str, float]]:
    rows = []
    pool = workspaces[:32]
    for callers in levels:
        samples: list[float] = []
        errors = 0
        until = time.monotonic() + 10

        async def caller(index: int, until: float, samples: list[float]) -> None:
            nonlocal errors
            ws = pool[index % len(pool)]
            while time.monotonic() < until:
                try:
                    samples.append(await _timed(ws.exec("true").wait(check=True)))
                except SandboxError:
                    errors += 1

        began = time.monotonic()
        await asyncio.gather(*(caller(i, until, samples) for i in range(callers)))
        took = time.monotonic() - began
        rows.append(
            {
                "callers": callers,
                "per_s": len(samples) / took,
                "p50": statistics.median(samples) * 1000 if samples else 0.0,
                "p99": _pct(samples, 0.99) * 1000,
                "errors": errors,
            }
        )
        print(
            f"  {callers:4d} callers: {rows[-1]['per_s']:7.1f} calls/s  p50 {rows[-1]['p50']:7.1f} ms  "
            f"p99 {rows[-1]['p99']:7.1f} ms  errors {errors}",
            flush=True,
        )
        await asyncio.sleep(2)
    return rows


HEADER = (
    f"{'ws':>5} {'daemon MiB':>10} {'d CPU%':>6} {'engine MiB':>10} {'e CPU%':>6} {'agent MiB':>9} {'thr':>4} "
    f"{'host MiB/ws':>11} {'tasks':>6} {'exec p50':>8} {'p99':>6} {'read p50':>8} {'p99':>6} "
    f"{'create p50':>10} {'p99':>6}"
)


def _row(row: dict[str, Any]) -> str:
    return (
        f"{row['workspaces']:5d} {row['daemon_rss']:10.1f} {row['daemon_cpu']:6.1f} {row['engine_rss']:10.0f} "
        f"{row['engine_cpu']:6.1f} {row['agent_rss']:9.1f} {row['agent_threads']:4.0f} {row['host_per_ws']:11.1f} "
        f"{row['tasks']:6d} {row['exec_p50']:8.1f} {row['exec_p99']:6.1f} {row['read_p50']:8.1f} "
        f"{row['read_p99']:6.1f} {row['create_p50']:10.0f} {row['create_p99']:6.0f}"
    )


async def run(opts: argparse.Namespace, directory: Path) -> tuple[list[dict[str, Any]], list[dict[str, float]], str]:
    daemon = Daemon(directory, opts.runtime)
    engine = docker.from_env(timeout=300)
    rows: list[dict[str, Any]] = []
    concurrency: list[dict[str, float]] = []
    limit = ""
    workspaces: list[Workspace] = []
    try:
        async with SandboxClient(socket_path=daemon.socket_path) as client:
            await asyncio.sleep(2)
            before_mib = _mem_available_mib()
            tasks_before = _tasks()
            per_workspace = 0.0
            print(f"pid_max {_pid_max()}, tasks before {tasks_before}, MemAvailable {before_mib:.0f} MiB")
            print(HEADER, flush=True)
            for step in opts.steps:
                if _mem_available_mib() < 2048:
                    limit = f"memory: under 2 GiB available before step {step}"
                    break
                needed = _tasks() + (step - len(workspaces)) * per_workspace
                if rows and needed > 0.95 * _pid_max():
                    # Stopped short: a machine at its pid_max cannot even start a shell to clean up.
                    limit = (
                        f"PIDs: {step} workspaces would need about {needed:.0f} tasks (threads), "
                        f"{per_workspace:.0f} a workspace, past 95% of kernel.pid_max ({_pid_max()})"
                    )
                    break
                made, times, failure = await _create_many(client, step - len(workspaces), opts.runtime)
                workspaces += made
                if failure:
                    limit = f"at {len(workspaces)} workspaces, a create failed: {failure}"
                    break
                row = await _measure(daemon, engine, workspaces, before_mib)
                row["create_p50"] = statistics.median(times) * 1000 if times else 0.0
                row["create_p99"] = _pct(times, 0.99) * 1000
                rows.append(row)
                per_workspace = (row["tasks"] - tasks_before) / max(1, len(workspaces))
                print(_row(row), flush=True)
                if row["error"]:
                    limit = f"at {len(workspaces)} workspaces, {row['error']}"
                    break
            # The callers at once run where nothing else is: 32 workspaces, the rest removed.
            for ws in workspaces[32:]:
                with contextlib.suppress(SandboxError):
                    await ws.delete()
            workspaces = workspaces[:32]
            if opts.concurrency and workspaces:
                print(f"callers at once on {len(workspaces)} workspaces (the others removed), 10 s each:")
                concurrency = await _concurrency(workspaces, opts.concurrency)
            for ws in workspaces:
                with contextlib.suppress(SandboxError):
                    await ws.delete()
    finally:
        daemon.stop()
        for leftover in engine.containers.list(all=True, filters={"label": f"sandboxd.instance={daemon.instance}"}):
            leftover.remove(force=True, v=True)
        for volume in engine.volumes.list(filters={"label": f"sandboxd.instance={daemon.instance}"}):
            volume.remove(force=True)
        engine.close()
    return rows, concurrency, limit


def plot(rows: list[dict[str, Any]], concurrency: list[dict[str, float]], path: str, title: str) -> None:
    """The curves, when matplotlib is installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    n = [r["workspaces"] for r in rows]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    axes[0][0].plot(n, [r["daemon_rss"] for r in rows], "o-", label="daemon RSS")
    axes[0][0].plot(n, [r["engine_rss"] for r in rows], "s-", label="engine RSS (dockerd, containerd, shims)")
    axes[0][0].set(xlabel="idle workspaces", ylabel="MiB", title="memory")
    # Host memory per workspace from MemAvailable is noise (page cache) over a few workspaces.
    many = [r for r in rows if r["workspaces"] >= 50]
    axes[0][1].plot(
        [r["workspaces"] for r in many], [r["host_per_ws"] for r in many], "o-", label="host memory per workspace"
    )
    axes[0][1].plot(n, [r["agent_rss"] for r in rows], "s-", label="agent RSS (median)")
    axes[0][1].set(xlabel="idle workspaces", ylabel="MiB", title="cost of one workspace")
    axes[1][0].plot(n, [r["exec_p50"] for r in rows], "o-", label="exec p50")
    axes[1][0].plot(n, [r["exec_p99"] for r in rows], "o--", label="exec p99")
    axes[1][0].plot(n, [r["read_p50"] for r in rows], "s-", label="read_file p50")
    axes[1][0].plot(n, [r["create_p50"] / 10 for r in rows], "^-", label="create p50 / 10")
    axes[1][0].set(xlabel="idle workspaces", ylabel="ms", title="latency with all present")
    if concurrency:
        c = [r["callers"] for r in concurrency]
        axes[1][1].plot(c, [r["per_s"] for r in concurrency], "o-", label="calls/s")
        twin = axes[1][1].twinx()
        twin.plot(c, [r["p99"] for r in concurrency], "s--", color="tab:red", label="p99 ms")
        twin.set_ylabel("p99 ms")
        axes[1][1].set_xscale("log", base=2)
        axes[1][1].set(xlabel="callers on 32 workspaces", ylabel="calls/s", title="exec true at once")
    for ax in (axes[0][0], axes[0][1], axes[1][0], axes[1][1]):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"plot: {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default="runc")
    parser.add_argument("--steps", default="10,50,100,250,500,750,1000")
    parser.add_argument("--concurrency", default="1,2,4,8,16,32,64,128")
    parser.add_argument("--png", default="")
    opts = parser.parse_args()
    opts.steps = [int(s) for s in opts.steps.split(",") if s]
    opts.concurrency = [int(s) for s in opts.concurrency.split(",") if s]
    started = datetime.datetime.now(datetime.UTC)
    print(f"{started:%Y-%m-%d %H:%M} UTC; {opts.runtime}")
    with tempfile.TemporaryDirectory(prefix="sandboxd-density-") as tmp:
        rows, concurrency, limit = asyncio.run(run(opts, Path(tmp)))
    print(f"first limit: {limit or 'none within the steps'}")
    if opts.png and rows:
        plot(rows, concurrency, opts.png, f"sandboxd density, {opts.runtime}, {started:%Y-%m-%d %H:%M} UTC")
    return 1 if limit and "memory" not in limit else 0


if __name__ == "__main__":
    sys.exit(main())
