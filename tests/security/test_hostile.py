"""Hostile workloads: each attack must leave the daemon answering, the neighbour untouched, and nothing escaped.

Every test runs an attack in its own workspace while a neighbour workspace keeps
a long-running command, and a watcher thread checks the daemon's health every
200 ms for the whole module. After each attack the neighbour must still answer
and its command must still run.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sandboxd_client import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    SandboxClient,
    Workspace,
)

from tests.conftest import DaemonThread
from tests.integration.helpers import one_file_tar, ps, start_trapped, start_yielded, trickle, until_alive

pytestmark = pytest.mark.timeout(180)

NEIGHBOUR_MARK = "neighbour-sleeper-4711"


class HealthWatch:
    """Checks the daemon's health in a thread; remembers every answer that was not SERVING."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.checks = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-watch", daemon=True)

    def _run(self) -> None:
        with grpc.insecure_channel(f"unix:{self.socket_path}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while not self._stop.wait(0.2):
                try:
                    status = stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status
                    if status != health_pb2.HealthCheckResponse.SERVING:
                        self.failures.append(f"status {status}")
                except grpc.RpcError as error:
                    self.failures.append(f"{error.code()}: {error.details()}")
                self.checks += 1

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture(scope="module")
def health_watch(daemon: DaemonThread) -> Iterator[HealthWatch]:
    with HealthWatch(daemon.socket_path) as watch:
        yield watch
    assert watch.checks > 10, "the health watcher hardly ran"
    assert watch.failures == []


@pytest.fixture
async def neighbour(client: SandboxClient, health_watch: HealthWatch) -> AsyncIterator[Workspace]:
    """A workspace minding its own business next to each attack, with a command that must survive."""
    ws = await client.create_workspace(labels={"test": "neighbour"})
    await ws.write_file("/workspace/precious.txt", "do not touch\n")
    process_id = await start_yielded(ws, f"exec -a {NEIGHBOUR_MARK} sleep 600")
    failures_before = len(health_watch.failures)
    yield ws
    began = time.monotonic()
    assert (await ws.exec("echo still here").wait()).stdout == "still here\n"
    assert time.monotonic() - began < 15
    assert await ps(ws, rf"{NEIGHBOUR_MARK}.*") != []
    assert "do not touch" in (await ws.read_file("/workspace/precious.txt")).content
    assert health_watch.failures[failures_before:] == []
    await client.kill(process_id)
    await ws.delete()


@pytest.fixture
async def attacker(client: SandboxClient, request: pytest.FixtureRequest) -> AsyncIterator[Workspace]:
    marker = request.node.get_closest_marker("attacker")
    options = dict(marker.kwargs) if marker else {}
    ws = await client.create_workspace(labels={"test": "attacker"}, **options)
    yield ws
    await ws.delete()


@pytest.mark.attacker(pids=64)
async def test_fork_bomb(client, attacker, neighbour) -> None:  # type: ignore[no-untyped-def]
    """The bomb's shell returns at once; its copies hold every pid until its 5 s timeout's kill
    ladder ends them all, then the workspace is back to the processes it had."""
    count = "echo $(( $(ps -e --no-headers | wc -l) - 2 ))"  # less this probe's shell and ps
    baseline = int((await attacker.exec(count).wait(check=True)).stdout)
    started = time.monotonic()
    result = await attacker.exec(":(){ :|:& };:", timeout_s=5).wait()
    # The shell returns at once, unless bash's fork retries (sleeps on EAGAIN) hold it to the timeout.
    assert (result.exit_code, result.stop_reason) in {(0, "exited"), (137, "timeout")}, result
    now = None
    while time.monotonic() - started < 25:
        try:
            now = int((await attacker.exec(count).wait(check=True)).stdout)
        except ResourceExhaustedError:  # while the bomb holds every pid nothing new starts
            now = None
        if now is not None and now <= baseline:
            break
        await asyncio.sleep(0.5)
    assert now is not None
    assert now <= baseline, f"{now} processes, {baseline} before the bomb"
    assert (await attacker.exec("echo recovered").wait()).stdout == "recovered\n"


@pytest.mark.attacker(memory_bytes=64 * 1024**2)
async def test_memory_bomb(client, attacker, neighbour) -> None:  # type: ignore[no-untyped-def]
    result = await attacker.exec("python3 -c 'a = []\nwhile True: a.append(bytearray(10**6))'").wait()
    assert result.oom_killed
    assert result.exit_code == 137 and result.signal == "SIGKILL"
    assert (await attacker.exec("echo alive").wait()).stdout == "alive\n"


async def test_output_flood(client, attacker, neighbour) -> None:  # type: ignore[no-untyped-def]
    """`yes` for 3 s with nobody reading and a 64 KiB buffer: dropped and counted, never hoarded."""
    process_id = await start_yielded(attacker, "timeout 3 yes", max_output_bytes=64 * 1024)
    await asyncio.sleep(3.5)
    result = await client.input(process_id, "").wait()
    assert result.exit_code == 124  # timeout(1)'s code: yes ran its whole 3 s
    assert result.dropped_bytes > 10 * 1024**2
    assert len(result.stdout_bytes) <= 64 * 1024 + 65536


@pytest.mark.attacker(cpu_millis=500)
async def test_cpu_burner_is_held_to_its_quota(client, attacker, neighbour) -> None:  # type: ignore[no-untyped-def]
    """Two busy loops for 3 s of wall time may use at most about half a CPU, not two."""
    command = (
        "TIMEFORMAT='%U %S'; time (timeout 3 sh -c 'while :; do :; done' & "
        "timeout 3 sh -c 'while :; do :; done' & wait)"
    )
    result = await attacker.exec(command).wait()
    user, system = (float(x) for x in (result.stdout + result.stderr).split()[-2:])
    cpu_seconds = user + system
    assert 0.5 <= cpu_seconds <= 2.2, cpu_seconds  # quota: 0.5 CPU x 3 s = 1.5 s; unbounded: ~6 s


@pytest.mark.attacker(disk_bytes=32 * 1024**2)
async def test_disk_fill_stops_at_the_cap(client, attacker, neighbour) -> None:  # type: ignore[no-untyped-def]
    await attacker.write_file("/workspace/keep.txt", "kept\n")
    result = await attacker.exec("dd if=/dev/zero of=/workspace/fill bs=1M count=100").wait()
    assert result.exit_code == 1
    assert "No space left on device" in result.stderr
    used = int((await attacker.exec("du -sk /workspace | cut -f1").wait()).stdout)
    assert used <= 32 * 1024
    # A write into the full volume fails cleanly and leaves the old file whole (atomic replace).
    with pytest.raises(ResourceExhaustedError, match="space"):
        await attacker.write_file("/workspace/keep.txt", "x" * 4 * 1024**2)
    assert (await attacker.read_file("/workspace/keep.txt")).content.endswith("kept")
    await attacker.exec("rm /workspace/fill").wait()
    await attacker.write_file("/workspace/keep.txt", "room again\n")
    # The cap is the workspace's own, not the host's: the host filesystem never saw the data.
    assert (await attacker.exec("df -k /workspace | tail -1").wait()).stdout.split()[0] == "tmpfs"


async def test_setsid_and_double_fork_escape_from_kill(client, attacker, neighbour) -> None:  # type: ignore[no-untyped-def]
    process_id = await start_yielded(
        attacker,
        "setsid sleep 1001 & (sleep 1002 &); nohup sleep 1003 >/dev/null 2>&1 & "
        "setsid sh -c 'sleep 1004 & exec sleep 1005' & sleep 1006",
    )
    assert len(await until_alive(attacker, r"sleep 100[1-6]", 6)) == 6
    exited = await client.kill(process_id, grace_s=1)
    assert exited.signal == "SIGTERM"  # nothing here ignores SIGTERM: it is what ends the command
    assert await ps(attacker, r"sleep 100[1-6]") == []


async def test_symlink_race_against_the_file_api(client, attacker, neighbour) -> None:  # type: ignore[no-untyped-def]
    """While the workspace flips a path between a directory and a symlink to /etc, file calls never
    write outside what the workspace user may write, and nothing reaches the host."""
    host_passwd = hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()
    container_passwd = (await attacker.exec("sha256sum /etc/passwd").wait()).stdout
    flipper = await start_yielded(
        attacker,
        "cd /workspace; while :; do rm -rf race; mkdir race; rm -rf race; ln -s /etc race; done",
    )
    outcomes: dict[str, int] = {}
    for i in range(40):
        try:
            await attacker.write_file("/workspace/race/passwd", f"root::0:0::/root:/bin/sh {i}\n")
            outcome = "written"
        except (PermissionDeniedError, FailedPreconditionError, NotFoundError, InvalidArgumentError) as exc:
            outcome = type(exc).__name__
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    await client.kill(flipper)
    assert sum(outcomes.values()) == 40, outcomes  # every call answered with a clean status
    assert (await attacker.exec("sha256sum /etc/passwd").wait()).stdout == container_passwd
    assert hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest() == host_passwd


async def test_file_operations_cannot_be_hijacked(client, attacker, neighbour) -> None:  # type: ignore[no-untyped-def]
    """A command may not open a file operation's pipes to the daemon (to forge its replies) or read it.

    An upload trickles in for 3 s; meanwhile the workspace finds that operation's process and
    tries `/proc/PID/fd/1` (write), `/proc/PID/fd/0` (read) and `/proc/PID/environ`.
    """
    archive = one_file_tar("slow.bin", b"x" * 200_000)
    upload = asyncio.create_task(
        client.upload(attacker.workspace_id, "/workspace", trickle(archive, pieces=6, pause_s=0.5))
    )
    probe = (
        'sleep 1; pid=$(pgrep -u "$(id -u)" -f "sandboxd-agent spa[w]n" | head -1); '
        '[ -n "$pid" ] || { echo no-op; exit; }; '
        'for f in fd/1 fd/2; do (exec 3>/proc/$pid/$f) 2>/dev/null && echo "$f open" || echo "$f denied"; done; '
        'for f in fd/0 environ; do (exec 3</proc/$pid/$f) 2>/dev/null && echo "$f open" || echo "$f denied"; done'
    )
    result = await attacker.exec(probe).wait()
    assert result.stdout == "fd/1 denied\nfd/2 denied\nfd/0 denied\nenviron denied\n"
    assert await upload == 1
    assert (await attacker.exec("wc -c < /workspace/slow.bin").wait()).stdout.strip() == "200000"


async def test_no_way_to_the_docker_socket(client, attacker, neighbour) -> None:  # type: ignore[no-untyped-def]
    script = (
        "ls -la /var/run/docker.sock /run/docker.sock 2>&1; "
        "find / -xdev \\( -name 'docker.sock' -o -name 'containerd.sock' \\) 2>/dev/null; "
        "env | grep -i '^DOCKER' ; "
        "curl -s --max-time 2 --unix-socket /var/run/docker.sock http://docker/version; echo curl=$?"
    )
    result = await attacker.exec(script).wait()
    assert "No such file or directory" in result.stdout
    assert "docker.sock" not in result.stdout.replace("cannot access '/var/run/docker.sock'", "").replace(
        "cannot access '/run/docker.sock'", ""
    )
    assert "curl=7" in result.stdout  # couldn't connect
    assert "DOCKER" not in result.stdout


async def test_raw_and_packet_sockets_are_refused(client, attacker, neighbour) -> None:  # type: ignore[no-untyped-def]
    script = """
import socket
for family, kind, proto in ((socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
                            (socket.AF_PACKET, socket.SOCK_RAW, 0)):
    try:
        socket.socket(family, kind, proto)
        print("opened")
    except PermissionError as exc:
        print("refused", exc.errno)
"""
    result = await attacker.exec(f"python3 -c '{script}'").wait()
    assert result.stdout.split("\n")[:2] == ["refused 1", "refused 1"]  # EPERM: no CAP_NET_RAW


async def test_mount_and_namespaces_are_refused(client, attacker, neighbour) -> None:  # type: ignore[no-untyped-def]
    script = (
        "mkdir -p /tmp/m; mount -t tmpfs none /tmp/m; echo mount=$?; "
        "unshare -Urm true; echo unshare=$?; "
        "mount --bind /workspace /tmp/m; echo bind=$?"
    )
    result = await attacker.exec(script).wait()
    codes = dict(line.split("=") for line in result.stdout.split())
    assert codes["mount"] != "0" and codes["unshare"] != "0" and codes["bind"] != "0", result
    assert (await attacker.exec("grep -c ' /tmp/m ' /proc/mounts").wait()).stdout.strip() == "0"


async def test_other_workspaces_are_invisible_and_untraceable(client, attacker, neighbour) -> None:  # type: ignore[no-untyped-def]
    listing = (await attacker.exec("ps -eo pid=,args=").wait()).stdout
    assert NEIGHBOUR_MARK not in listing
    assert len(listing.splitlines()) < 15  # its own few processes only: a private PID namespace
    script = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
result = libc.ptrace(16, 1, None, None)  # PTRACE_ATTACH to PID 1
print(result, ctypes.get_errno())
"""
    result = await attacker.exec(f"python3 -c '{script}'").wait()
    assert result.stdout.split() == ["-1", "1"]  # EPERM
    # kill -9 -1 reaches only the attacker's own processes.
    await attacker.exec("kill -9 -1", timeout_s=5).wait()
    assert (await attacker.exec("echo after").wait()).stdout == "after\n"


@pytest.mark.attacker(read_only_root_filesystem=True)
async def test_read_only_root_filesystem(client, attacker, neighbour) -> None:  # type: ignore[no-untyped-def]
    script = (
        "for p in /etc/x /usr/x /var/x /home/sandbox/x /x; do touch $p 2>/dev/null && echo $p=ok || echo $p=no; done; "
        "touch /workspace/x && echo /workspace=ok; touch /tmp/x && echo /tmp=ok"
    )
    result = await attacker.exec(script).wait()
    assert result.stdout.split() == [
        "/etc/x=no",
        "/usr/x=no",
        "/var/x=no",
        "/home/sandbox/x=no",
        "/x=no",
        "/workspace=ok",
        "/tmp=ok",
    ]
    assert "Read-only file system" in (await attacker.exec("touch /etc/y").wait()).stderr
    with pytest.raises(PermissionDeniedError):
        await attacker.write_file("/etc/motd", "defaced\n")
    await attacker.write_file("/tmp/scratch.txt", "fine\n")
    assert attacker.info.read_only_root_filesystem
    # The daemon's own machinery (the agent, spill files) still works.
    result = await attacker.exec("seq 1 50000", spill_after_bytes=1024).wait()
    assert result.spill_path.startswith("/workspace/.sandboxd/spill/")
    # The agent's volume is read-only too.
    helper = await attacker.exec(
        "tr '\\0' '\\n' < /proc/$PPID/cmdline | head -1; touch /.sandboxd/x 2>/dev/null || echo no"
    ).wait()
    assert helper.stdout == "/.sandboxd/sandboxd-agent\nno\n"


async def test_yielded_attack_does_not_hold_the_daemon(client, attacker, neighbour) -> None:  # type: ignore[no-untyped-def]
    """A command that ignores SIGINT and SIGTERM and floods stderr: Ctrl-C, then kill, end it."""
    process_id = await start_trapped(
        attacker, "trap '' INT TERM", "while :; do echo spam >&2; done", max_output_bytes=4096
    )
    await client.input(process_id, "\u0003", yield_after_s=0.5).wait()
    exited = await client.kill(process_id, grace_s=0.5)
    assert exited.signal == "SIGKILL"
