"""Many workspaces at once, for minutes, through faults: every output and exit checked.

Usage: ``.venv/bin/python bench/soak.py [--minutes 60] [--workspaces 32] [--callers 4]
[--daemon-kill-every-s 300] [--engine-restart-at-s 1800] [--agent-kill-every-s 120] [--runtime runc]``.

Starts a private daemon (its own process, socket and instance label; no warm pool), creates
the workspaces, and runs ``--callers`` callers in each. A caller loops over the mixed work:

  true     exec("true"): exit 0, nothing printed
  seq      exec("seq 1 100000"): the 588,895 bytes exactly, exit 0, no gap
  file     a 1 MiB file of random bytes written, its sha256 read back by a command, removed
  ctrl_c   exec("sleep 30") yielded after 0.5 s, then Ctrl-C until it ends (130, interrupted)
  later    exec of a background counter yielded at once, polled again a few turns later, whose
           every line must be there in order; then killed
  fork     (with --forks) a files-only snapshot of the workspace and a fork of it, in which the
           caller's marker file must be; both removed

Faults, each optional: the daemon is SIGKILLed every ``--daemon-kill-every-s`` seconds and
started again (same instance: it adopts everything), the engine is restarted once at
``--engine-restart-at-s``, and an agent is SIGKILLed every ``--agent-kill-every-s`` seconds
(the daemon's view of its workspace's commands is then lost, which is reported, not hidden).

A call that fails with UNAVAILABLE (the daemon or the engine away) is retried by the caller within
its budget, the way a client with retries does; any other failure is counted by its status and
message. At the end it prints, per kind, calls and errors; wrong outputs, wrong exits and lost
processes (a process id whose caller can no longer reach it, but for one evicted or one whose
agent was killed); the daemon's RSS and descriptors and the engine's containers, volumes,
networks and images sampled each 10 s; and returns non-zero when anything was wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import datetime
import hashlib
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import docker
from sandboxd_client import (
    AlreadyExistsError,
    NotFoundError,
    SandboxClient,
    SandboxError,
    StreamBrokenError,
    UnavailableError,
    Workspace,
)

T = TypeVar("T")

IMAGE = "sandboxd/base:bookworm"
SEQ = "".join(f"{i}\n" for i in range(1, 100001)).encode()
ONE_MIB = 1 << 20
KINDS = ("true", "seq", "file", "ctrl_c", "later")
RETRY_BUDGET_S = 60.0
"""How long a caller keeps retrying a call that fails UNAVAILABLE (a daemon restart takes seconds,
an engine restart tens)."""


@dataclasses.dataclass
class Report:
    """What a soak run counted."""

    calls: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    retried: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    errors: collections.Counter[tuple[str, str]] = dataclasses.field(default_factory=collections.Counter)
    wrong_outputs: list[str] = dataclasses.field(default_factory=list)
    wrong_exits: list[str] = dataclasses.field(default_factory=list)
    lost: list[str] = dataclasses.field(default_factory=list)
    fault_ended: list[str] = dataclasses.field(default_factory=list)
    """Commands a fault ended, and said so (an agent killed: its commands and output are lost,
    and their callers are told, never given a clean exit)."""
    latencies: dict[str, list[float]] = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    samples: list[dict[str, float]] = dataclasses.field(default_factory=list)
    faults: list[str] = dataclasses.field(default_factory=list)

    @property
    def wrong(self) -> int:
        """Everything that must be zero: wrong outputs, wrong exits, lost processes, errors."""
        return len(self.wrong_outputs) + len(self.wrong_exits) + len(self.lost) + sum(self.errors.values())


class Daemon:
    """The daemon under test, as its own process: started, killed and started again on one instance."""

    def __init__(self, directory: Path, instance: str, env: dict[str, str], log_path: Path | None = None) -> None:
        """Describe it (``env``: more settings, DOCKER_HOST among them); its log to ``log_path`` or ``directory``."""
        self.socket_path = str(directory / "soak.sock")
        self.log_path = log_path or directory / "daemon.log"
        self.instance = instance
        self.env = {
            **os.environ,
            "SANDBOXD_SOCKET": self.socket_path,
            "SANDBOXD_INSTANCE": instance,
            "SANDBOXD_LOG_LEVEL": os.environ.get("SOAK_LOG_LEVEL", "warning"),
            "SANDBOXD_LOG_FORMAT": "json",
            "SANDBOXD_POOL_SIZE": "0",
            "SANDBOXD_POOL_DEMAND_MEMORY_BYTES": "0",
            "SANDBOXD_AUDIT_LOG": str(directory / "audit.jsonl"),
            **env,
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it; return once its socket accepts connections."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(Path(sys.executable).with_name("sandboxd")), "serve", "--no-build"], env=self.env, stderr=log
            )
        deadline = time.monotonic() + 60
        while not _accepts(self.socket_path):
            if self.process.poll() is not None or time.monotonic() > deadline:
                msg = f"the daemon did not start: {self.log_path.read_text()[-2000:]}"
                raise RuntimeError(msg)
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL it, as a crash would."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        """SIGTERM it and wait."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(60)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


def _accepts(socket_path: str) -> bool:
    import socket

    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(socket_path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


AGENT_LOST = "the workspace's agent restarted while the command ran"
"""How a command's end reads when its agent was killed under it (it is lost, and said so)."""


def _fault_ended(result: Any) -> bool:
    return getattr(result, "stop_reason", "") == "failed" and AGENT_LOST in getattr(result, "message", "")


class Caller:
    """One caller of one workspace: the mixed work in a loop, every result checked."""

    def __init__(
        self, client: SandboxClient, ws: Workspace, name: str, report: Report, *, forks: bool, kinds: list[str]
    ) -> None:
        """Bind it to its workspace; ``name`` tells its files and markers apart."""
        self.client, self.ws, self.name, self.report, self.forks = client, ws, name, report, forks
        self.kinds = kinds
        self.later: list[tuple[str, int]] = []
        """Background counters started, with the turn they are polled at."""
        self.counted: dict[str, str] = {}
        """What each background counter has printed so far."""
        self.turn = 0

    async def retried(self, kind: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, again after UNAVAILABLE while the budget lasts (the daemon or the engine away)."""
        deadline = time.monotonic() + RETRY_BUDGET_S
        while True:
            try:
                return await call()
            except UnavailableError:
                if time.monotonic() > deadline:
                    raise
                self.report.retried[kind] += 1
                await asyncio.sleep(0.2)

    async def run(self, until: float) -> None:
        kinds = list(self.kinds) + (["fork"] if self.forks else [])
        offset = int(self.name.rsplit("-", 1)[-1]) if self.name[-1].isdigit() else 0
        while time.monotonic() < until:
            kind = kinds[(self.turn + offset) % len(kinds)]
            self.turn += 1
            began = time.monotonic()
            try:
                await getattr(self, f"do_{kind}")()
            except SandboxError as exc:
                self.failed(kind, exc)
            else:
                self.report.latencies[kind].append(time.monotonic() - began)
            self.report.calls[kind] += 1
            await self.poll_later(force=False)
        await self.poll_later(force=True)

    def failed(self, kind: str, exc: SandboxError) -> None:
        """Count a call that failed, by kind and words (the start says what failed, the end why)."""
        said = exc.message if len(exc.message) <= 320 else f"{exc.message[:120]} ... {exc.message[-200:]}"
        self.report.errors[(kind, f"{type(exc).__name__}: {said}")] += 1

    async def exec_result(self, kind: str, command: str, **options: Any) -> Any:
        return await self.retried(kind, lambda: self.ws.exec(command, **options).wait())

    async def do_true(self) -> None:
        result = await self.exec_result("true", "true")
        if _fault_ended(result):
            self.report.fault_ended.append(f"true {result.process_id}")
        elif (result.exit_code, result.stop_reason, result.stdout_bytes, result.stderr_bytes) != (
            0,
            "exited",
            b"",
            b"",
        ):
            self.report.wrong_exits.append(f"true: {result}")

    async def do_seq(self) -> None:
        result = await self.exec_result("seq", "seq 1 100000")
        if _fault_ended(result):
            self.report.fault_ended.append(f"seq {result.process_id}")
        elif result.stdout_bytes != SEQ or result.dropped_bytes:
            self.report.wrong_outputs.append(
                f"seq: {len(result.stdout_bytes)} bytes of {len(SEQ)}, dropped {result.dropped_bytes}, "
                f"exit {result.exit_code} ({result.stop_reason}) {result.process_id}"
            )
        elif (result.exit_code, result.stop_reason) != (0, "exited"):
            self.report.wrong_exits.append(f"seq: {result}")

    async def do_file(self) -> None:
        data = secrets.token_bytes(ONE_MIB)
        path = f"/tmp/{self.name}.bin"
        await self.retried("file", lambda: self.ws.write_file(path, data))
        result = await self.exec_result("file", f"sha256sum < {path}")
        if _fault_ended(result):
            self.report.fault_ended.append(f"file {result.process_id}")
        elif result.stdout.split()[:1] != [hashlib.sha256(data).hexdigest()]:
            self.report.wrong_outputs.append(f"file: {result}")
        tries = 0

        async def remove() -> None:
            nonlocal tries
            tries += 1
            try:
                await self.client.remove(self.ws.workspace_id, path)
            except NotFoundError:
                if tries == 1:
                    raise
                # Sent again after UNAVAILABLE: the first one removed it before the daemon went.

        await self.retried("file", remove)

    async def do_ctrl_c(self) -> None:
        began = time.monotonic()
        first = await self.exec_result("ctrl_c", "sleep 30", yield_after_s=0.5, timeout_s=120)
        if _fault_ended(first):
            self.report.fault_ended.append(f"ctrl_c {first.process_id}")
            return
        if first.exit_code is not None or not first.process_id:
            self.report.wrong_exits.append(f"ctrl_c: sleep ended by itself: {first}")
            return
        process_id = first.process_id
        interrupted = time.monotonic()
        try:
            ended = await self.retried("ctrl_c", lambda: self.client.input(process_id, "\u0003").wait())
            deadline = time.monotonic() + 30
            while ended.exit_code is None and time.monotonic() < deadline:
                ended = await self.retried("ctrl_c", lambda: self.client.input(process_id, yield_after_s=1).wait())
        except NotFoundError as exc:
            self.report.lost.append(f"ctrl_c {process_id}: {exc.message}")
            return
        if _fault_ended(ended):
            self.report.fault_ended.append(f"ctrl_c {process_id}")
        elif (ended.exit_code, ended.stop_reason) != (130, "interrupted"):
            self.report.wrong_exits.append(
                f"ctrl_c {process_id}: {ended.exit_code} ({ended.stop_reason}), Ctrl-C {interrupted - began:.1f} s "
                f"after the exec began, {time.monotonic() - began:.1f} s ago"
            )

    async def do_later(self) -> None:
        command = "i=0; while :; do i=$((i+1)); echo $i; sleep 0.05; done"
        first = await self.exec_result("later", command, yield_after_s=0.25, timeout_s=120)
        if _fault_ended(first):
            self.report.fault_ended.append(f"later {first.process_id}")
            return
        if first.exit_code is not None or not first.process_id:
            self.report.wrong_exits.append(f"later: the counter ended: {first}")
            return
        self.later.append((first.process_id, self.turn + 3))
        self.counted[first.process_id] = first.stdout

    async def poll_later(self, *, force: bool) -> None:
        due = [(p, t) for p, t in self.later if force or t <= self.turn]
        self.later = [(p, t) for p, t in self.later if not (force or t <= self.turn)]
        for process_id, _turn in due:
            seen = self.counted.pop(process_id, "")
            try:
                deadline = time.monotonic() + 30
                while True:  # its shell may still be starting on a loaded machine: until it has counted
                    polled = await self.retried(
                        "later", lambda pid=process_id: self.client.input(pid, yield_after_s=0.3).wait()
                    )
                    seen += polled.stdout
                    if seen or polled.exit_code is not None or time.monotonic() > deadline:
                        break
                ended = await self.retried("later", lambda pid=process_id: self.client.kill(pid, grace_s=0.5))
            except NotFoundError as exc:
                self.report.lost.append(f"later {process_id}: {exc.message}")
                continue
            except StreamBrokenError as exc:
                # A poll whose stream broke (the daemon went) and whose resume was refused.
                if "not found" in exc.message:
                    self.report.lost.append(f"later {process_id}: {exc.message}")
                else:
                    self.failed("later", exc)
                continue
            except SandboxError as exc:
                self.failed("later", exc)
                continue
            if _fault_ended(polled) or _fault_ended(ended):
                self.report.fault_ended.append(f"later {process_id}")
                continue
            numbers = seen.split()
            if not numbers or numbers != [str(i) for i in range(1, len(numbers) + 1)] or not seen.endswith("\n"):
                self.report.wrong_outputs.append(f"later {process_id}: {seen[:80]!r}...{seen[-40:]!r}")
            if ended.exit_code is None or ended.stop_reason != "killed":
                self.report.wrong_exits.append(f"later {process_id}: {ended}")

    async def do_fork(self) -> None:
        marker = secrets.token_hex(8)
        name = f"{self.name}-{marker}"
        await self.retried("fork", lambda: self.ws.write_file(f"/workspace/{self.name}.marker", marker))
        sent: list[bool] = []

        async def snapshot() -> None:
            try:
                sent.append(True)
                await self.ws.snapshot(name)
            except AlreadyExistsError:
                if len(sent) == 1:
                    raise
                # Sent again after UNAVAILABLE: the first one made it before the daemon went (the
                # name is this call's own).

        await self.retried("fork", snapshot)
        # One create, however often it is sent: the same id and request id each time, so a
        # daemon that made it before it went answers with it (or makes it if it never did).
        workspace_id, request_id = f"ws-{secrets.token_hex(6)}", str(uuid.uuid4())
        try:
            fork = await self.retried(
                "fork",
                lambda: self.client.create_workspace(
                    from_snapshot=name, workspace_id=workspace_id, request_id=request_id
                ),
            )
            try:
                result = await self.retried("fork", lambda: fork.exec(f"cat /workspace/{self.name}.marker").wait())
                if result.stdout != marker:
                    self.report.wrong_outputs.append(f"fork: {result.stdout!r} != {marker!r}")
            finally:
                await self.retried("fork", fork.delete)
        finally:
            await self.retried("fork", lambda: self.client.delete_snapshot(name))


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def sample(
    daemon: Daemon, report: Report, instance: str, began: float, until: float, engine_client: Callable[[], Any]
) -> None:
    """Every 10 s: the daemon's RSS and descriptors, and what of the run the engine holds."""
    engine = engine_client()
    try:
        while time.monotonic() < until:
            selector = {"label": f"sandboxd.instance={instance}"}
            with contextlib.suppress(Exception):  # the engine restarting
                report.samples.append(
                    {
                        "minute": (time.monotonic() - began) / 60,
                        "rss_mib": _rss_mib(daemon.pid),
                        "fds": _fds(daemon.pid),
                        "containers": len(engine.containers.list(all=True, filters=selector)),
                        "volumes": len(engine.volumes.list(filters=selector)),
                        "networks": len(engine.networks.list(filters=selector)),
                        "images": len(engine.images.list(filters=selector)),
                    }
                )
            await asyncio.sleep(10)
    finally:
        engine.close()


async def faults(
    daemon: Daemon,
    report: Report,
    opts: argparse.Namespace,
    instance: str,
    began: float,
    engine_client: Callable[[], Any],
    restart_engine: Callable[[], None] | None,
) -> None:
    """The faults, at their times: daemon kills, one engine restart, agent kills."""
    next_kill = began + opts.daemon_kill_every_s if opts.daemon_kill_every_s else float("inf")
    restart_at = began + opts.engine_restart_at_s if opts.engine_restart_at_s else float("inf")
    next_agent = began + opts.agent_kill_every_s if opts.agent_kill_every_s else float("inf")
    end = began + opts.minutes * 60
    while True:
        soonest = min(next_kill, restart_at, next_agent)
        if soonest >= end - 5:
            return
        await asyncio.sleep(max(0.0, soonest - time.monotonic()))
        at = f"{(time.monotonic() - began) / 60:.1f} min"
        if soonest == next_kill:
            daemon.kill()
            await asyncio.to_thread(daemon.start)
            report.faults.append(f"{at}: the daemon was SIGKILLed and started again")
            next_kill += opts.daemon_kill_every_s
        elif soonest == restart_at:
            assert restart_engine is not None
            await asyncio.to_thread(restart_engine)
            report.faults.append(f"{at}: the engine was restarted")
            restart_at = float("inf")
        else:
            engine = engine_client()
            try:
                selector = {"label": [f"sandboxd.instance={instance}", "sandboxd.managed=true"]}
                running = engine.containers.list(filters=selector)
                if running:
                    victim = running[secrets.randbelow(len(running))]
                    init = victim.attrs["State"]["Pid"]
                    children = await asyncio.to_thread(Path(f"/proc/{init}/task/{init}/children").read_text)
                    for agent in children.split():
                        os.kill(int(agent), signal.SIGKILL)  # from the host: no process inside may
                    report.faults.append(f"{at}: the agent of {victim.name} was SIGKILLed")
            except (OSError, docker.errors.APIError) as exc:
                report.faults.append(f"{at}: no agent could be killed: {exc}")
            finally:
                engine.close()
            next_agent += opts.agent_kill_every_s


@contextlib.contextmanager
def _engine(opts: argparse.Namespace) -> Iterator[tuple[dict[str, str], Callable[[], Any], Callable[[], None] | None]]:
    """The engine the run uses: the machine's, or (to restart one) a private dockerd of its own
    holding the workspace image and the agent. Yields the daemon's settings for it, a client
    factory, and how to restart it (None: not restartable)."""
    if not opts.engine_restart_at_s:
        yield {}, docker.from_env, None
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from sandboxd.agentbuild import AgentBuild, agent_digest
    from tests.integration.engine import private_engine

    with private_engine(IMAGE, AgentBuild(agent_digest()).image) as engine:
        yield {"DOCKER_HOST": engine.host}, engine.client, engine.restart


async def soak(opts: argparse.Namespace, directory: Path) -> Report:
    """Run the soak; return what it counted."""
    instance = f"soak-{secrets.token_hex(4)}"
    report = Report()
    with _engine(opts) as (engine_env, engine_client, restart_engine):
        daemon = Daemon(
            directory,
            instance,
            {"SANDBOXD_DEFAULT_RUNTIME": opts.runtime, **engine_env},
            log_path=Path(opts.keep_log) if opts.keep_log else None,
        )
        daemon.start()
        try:
            async with SandboxClient(socket_path=daemon.socket_path, resume_s=RETRY_BUDGET_S) as client:
                workspaces = await asyncio.gather(
                    *(client.create_workspace(labels={"soak": instance}, pids=1024) for _ in range(opts.workspaces))
                )
                began = time.monotonic()
                until = began + opts.minutes * 60
                callers = [
                    Caller(client, ws, f"c{w}-{c}", report, forks=opts.forks, kinds=opts.kinds.split(","))
                    for w, ws in enumerate(workspaces)
                    for c in range(opts.callers)
                ]
                sampler = asyncio.create_task(sample(daemon, report, instance, began, until, engine_client))
                faulter = asyncio.create_task(
                    faults(daemon, report, opts, instance, began, engine_client, restart_engine)
                )
                await asyncio.gather(*(caller.run(until) for caller in callers))
                faulter.cancel()
                sampler.cancel()
                await asyncio.gather(faulter, sampler, return_exceptions=True)
                for ws in workspaces:
                    with contextlib.suppress(SandboxError):
                        await ws.delete()
        finally:
            daemon.stop()
            _remove_everything(instance, engine_client)
    return report


def _remove_everything(instance: str, engine_client: Callable[[], Any]) -> None:
    engine = engine_client()
    try:
        for leftover in engine.containers.list(all=True, filters={"label": f"sandboxd.instance={instance}"}):
            if leftover.status == "paused":
                leftover.unpause()
            leftover.remove(force=True, v=True)
        for volume in engine.volumes.list(filters={"label": f"sandboxd.instance={instance}"}):
            volume.remove(force=True)
        for image in engine.images.list(filters={"label": f"sandboxd.instance={instance}"}):
            with contextlib.suppress(docker.errors.APIError):
                engine.images.remove(image.id, force=True)
    finally:
        engine.close()


def print_report(report: Report, opts: argparse.Namespace, started: datetime.datetime) -> None:
    print(
        f"{started:%Y-%m-%d %H:%M} UTC; {opts.workspaces} workspaces x {opts.callers} callers, "
        f"{opts.minutes:g} min, {opts.runtime}"
    )
    for fault in report.faults:
        print(f"  fault {fault}")
    print(f"{'kind':8} {'calls':>7} {'retried':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for kind in sorted(report.calls):
        times = sorted(report.latencies.get(kind, [])) or [0.0]
        p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
        print(
            f"{kind:8} {report.calls[kind]:7d} {report.retried[kind]:8d} "
            f"{statistics.median(times) * 1000:8.1f} {p99 * 1000:8.1f}"
        )
    print(f"errors: {sum(report.errors.values())}")
    for (kind, what), count in report.errors.most_common(20):
        print(f"  {count:5d} {kind}: {what}")
    print(f"ended by a fault, and said so: {len(report.fault_ended)}")
    for title, items in (
        ("wrong outputs", report.wrong_outputs),
        ("wrong exits", report.wrong_exits),
        ("lost", report.lost),
    ):
        print(f"{title}: {len(items)}")
        for item in items[:10]:
            print(f"  {item}")
    if report.samples:
        print(f"{'minute':>6} {'rss MiB':>8} {'fds':>5} {'ctrs':>5} {'vols':>5} {'nets':>5} {'imgs':>5}")
        step = max(1, len(report.samples) // 12)
        for row in report.samples[::step] + report.samples[-1:]:
            print(
                f"{row['minute']:6.1f} {row['rss_mib']:8.1f} {row['fds']:5.0f} {row['containers']:5.0f} "
                f"{row['volumes']:5.0f} {row['networks']:5.0f} {row['images']:5.0f}"
            )
        print(f"daemon RSS peak {max(r['rss_mib'] for r in report.samples):.1f} MiB")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--workspaces", type=int, default=32)
    parser.add_argument("--callers", type=int, default=4)
    parser.add_argument("--runtime", default="runc")
    parser.add_argument("--forks", action="store_true", help="add snapshot-and-fork to the mixed work")
    parser.add_argument("--kinds", default=",".join(KINDS), help="the kinds of work, comma-separated")
    parser.add_argument("--daemon-kill-every-s", type=float, default=0.0)
    parser.add_argument("--engine-restart-at-s", type=float, default=0.0)
    parser.add_argument("--agent-kill-every-s", type=float, default=0.0)
    parser.add_argument(
        "--keep-log",
        default="",
        help="the daemon's log (SOAK_LOG_LEVEL, default warning), written as it goes",
    )
    return parser


def main() -> int:
    opts = parser().parse_args()
    started = datetime.datetime.now(datetime.UTC)
    with tempfile.TemporaryDirectory(prefix="sandboxd-soak-") as tmp:
        report = asyncio.run(soak(opts, Path(tmp)))
    print_report(report, opts, started)
    return 1 if report.wrong else 0


if __name__ == "__main__":
    sys.exit(main())
