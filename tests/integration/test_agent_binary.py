"""The agent itself: the real binary run as a process on the host, spoken to with the daemon's codec.

The binary is the one workspaces get (taken out of the agent image). It runs as an
unprivileged user here (nobody, when the suite runs as root), so it starts commands
as that same user and has nothing to drop; everything else -- frames, sessions,
acknowledged output, reconnects, the kill ladder, file operations -- is what runs in
every workspace. The daemon's side is :class:`sandboxd.agent.AgentLink` over a local
"bridge" process instead of a ``docker exec`` of it. Forged frames come from a fake
bridge that writes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import random
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from sandboxd.agent import (
    AgentLink,
    AgentLost,
    ExitReport,
    FileData,
    FileOperationRefused,
    FileResult,
    SessionChannel,
    SessionState,
    StartRequest,
)
from sandboxd.agentbuild import AgentBuild, agent_digest
from tests.conftest import new_instance

pytestmark = pytest.mark.docker


def _user() -> tuple[int, int]:
    """Who the agent runs as: the suite's own user, or nobody when that is root."""
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


UID, GID = _user()


def _as_agent_user(argv: Sequence[str]) -> list[str]:
    """``argv`` run as the agent's user (when the suite is root), by util-linux's ``setpriv``.

    Neither a ``preexec_fn`` nor Popen's user/group: both make Python fork instead of vfork,
    and the child then runs gRPC's fork handlers, which abort it (SIGABRT, SIGBUS) while the
    suite's gRPC threads run.
    """
    if os.geteuid() != 0:
        return list(argv)
    return ["setpriv", f"--reuid={UID}", f"--regid={GID}", "--clear-groups", *argv]


@contextlib.contextmanager
def open_directory() -> Iterator[Path]:
    """A fresh directory the agent's user can reach (pytest's are private to the suite's user)."""
    directory = Path(tempfile.mkdtemp(prefix="sandboxd-agent-test-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def agent_binary(docker_client) -> Iterator[Path]:  # type: ignore[no-untyped-def]
    """The agent for this machine's architecture, copied out of the agent image."""
    build = AgentBuild(agent_digest())
    arch = AgentBuild.binary_dir(docker_client.info()["Architecture"])
    container = docker_client.containers.create(build.image, ["version"])
    with contextlib.ExitStack() as stack:
        directory = stack.enter_context(open_directory())
        try:
            stream, _ = container.get_archive(f"{arch}/sandboxd-agent")
            archive = directory / "agent.tar"
            with archive.open("wb") as out:
                for chunk in stream:
                    out.write(chunk)
            with tarfile.open(archive) as tar:
                tar.extract("sandboxd-agent", directory, filter="data")
        finally:
            container.remove(force=True)
        binary = directory / "sandboxd-agent"
        binary.chmod(0o755)
        yield binary


class LocalStream:
    """A local process's stdin and stdout/stderr, as an engine's exec stream."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self._reads: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue()
        self._pumps = [
            asyncio.create_task(self._pump(1, process.stdout)),
            asyncio.create_task(self._pump(2, process.stderr)),
        ]
        self._open = 2

    async def _pump(self, fd: int, reader: asyncio.StreamReader | None) -> None:
        assert reader is not None
        while data := await reader.read(65536):
            await self._reads.put((fd, data))
        self._open -= 1
        if not self._open:
            await self._reads.put(None)

    async def read(self) -> tuple[int, bytes] | None:
        return await self._reads.get()

    async def write(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        await self.process.stdin.drain()

    async def exit_code(self) -> int | None:
        return self.process.returncode

    async def close(self, *, discard_input: bool = False) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        await self.process.wait()
        for pump in self._pumps:
            pump.cancel()


class LocalBackend:
    """Runs the bridge (``argv``: the agent's path replaced by ``bridge``) as a local process."""

    def __init__(self, bridge: Sequence[str], env: Mapping[str, str], *, as_agent_user: bool = True) -> None:
        self.bridge = list(bridge)
        self.env = dict(env)
        self.opened = 0
        self.as_agent_user = as_agent_user

    async def exec_stream(self, workspace_id: str, argv: Sequence[str], **kwargs: Any) -> LocalStream:
        self.opened += 1
        command = [*self.bridge, *argv[1:]]
        process = await asyncio.create_subprocess_exec(
            *(_as_agent_user(command) if self.as_agent_user else command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
        )
        return LocalStream(process)


class Agent:
    """One agent process, and links to it."""

    def __init__(self, binary: Path, directory: Path) -> None:
        self.binary = binary
        self.socket = directory / "run" / "agent.sock"
        self.socket.parent.mkdir(mode=0o700)
        os.chown(self.socket.parent, UID, GID)
        self.env = {"PATH": "/usr/bin:/bin", "SANDBOXD_AGENT_SOCKET": str(self.socket), "LANG": "C.UTF-8"}
        self.process: subprocess.Popen[bytes] | None = None
        self.links: list[AgentLink] = []

    def start(self) -> None:
        self.process = subprocess.Popen(
            _as_agent_user([str(self.binary), "serve"]), env=self.env, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 10
        while not self.socket.exists():
            assert self.process.poll() is None, self.process.stderr.read() if self.process.stderr else b""
            assert time.monotonic() < deadline
            time.sleep(0.01)

    def link(self, bridge: Sequence[str] | None = None) -> AgentLink:
        backend = LocalBackend(bridge or [str(self.binary)], self.env)
        link = AgentLink(backend, "ws-host", "c-host")  # type: ignore[arg-type]
        self.links.append(link)
        return link

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            if self.process.stderr is not None:
                self.process.stderr.close()


@pytest.fixture
async def agent(agent_binary: Path) -> AsyncIterator[Agent]:
    with open_directory() as directory:
        running = Agent(agent_binary, directory)
        running.start()
        yield running
        for link in running.links:
            await link.close()
        running.stop()


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory the agent's user owns."""
    with open_directory() as directory:
        if os.geteuid() == 0:
            os.chown(directory, UID, GID)
        yield directory


class Recorder:
    """A session's events, as the daemon's ProcessSession would get them."""

    def __init__(self) -> None:
        self.pid = 0
        self.failed: tuple[str, str] | None = None
        self.output: dict[int, tuple[str, bytes]] = {}
        self.gaps: list[tuple[int, int]] = []
        self.exit: ExitReport | None = None
        self.broken: list[str] = []
        self.reconnects: list[SessionState | None] = []
        self.changed = asyncio.Event()

    def _poke(self) -> None:
        self.changed.set()

    def on_started(self, pid: int) -> None:
        self.pid = pid
        self._poke()

    def on_start_failed(self, stage: str, message: str) -> None:
        self.failed = (stage, message)
        self._poke()

    def on_output(self, stream: str, offset: int, data: bytes) -> None:
        self.output[offset] = (stream, data)
        self._poke()

    def on_dropped(self, offset: int, total: int) -> None:
        self.gaps.append((offset, total))
        self._poke()

    def on_exited(self, report: ExitReport) -> None:
        self.exit = report
        self._poke()

    def on_broken(self, message: str) -> None:
        self.broken.append(message)
        self._poke()

    def on_disconnect(self) -> None:
        self._poke()

    def on_reconnect(self, state: SessionState | None) -> None:
        self.reconnects.append(state)
        self._poke()

    def text(self, stream: str | None = None) -> bytes:
        """The output in offset order (each offset once), of one stream or both."""
        return b"".join(data for _, (name, data) in sorted(self.output.items()) if stream in (None, name))

    def received(self) -> int:
        return max((offset + len(data) for offset, (_, data) in self.output.items()), default=0)

    async def until(self, condition: Any, timeout_s: float = 20.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                self.changed.clear()
                await self.changed.wait()


def request(command: str, **overrides: Any) -> StartRequest:
    fields: dict[str, Any] = {
        # Each its own: the marker a process id puts in the environment is how the kill ladder
        # finds a command's orphans (another test's command must never look like one of them).
        "process_id": f"p-{secrets.token_hex(6)}",
        "command": command,
        "cwd": "/tmp",
        "env": {"LANG": "C.UTF-8"},
        "user": f"{UID}:{GID}",
        "tty": False,
        "columns": 80,
        "rows": 24,
        "timeout_s": 60.0,
        "grace_s": 0.5,
        "buffer_bytes": 1 << 20,
        "spill_path": "",
        "spill_after_bytes": 0,
        "merge_stderr": False,
        "capabilities": (),
        "root_capabilities": (),
        "daemon_state": {"workspace_id": "ws-host"},
    }
    fields.update(overrides)
    return StartRequest(**fields)


async def run(link: AgentLink, command: str, **overrides: Any) -> Recorder:
    """Start ``command``, read all of its output, and return once it has exited."""
    recorder = Recorder()
    channel = await SessionChannel.open(link, recorder)
    await channel.start(request(command, **overrides))
    await channel.pull(ack=0, ack_gap=0, until=1 << 40, reader=True)
    await recorder.until(lambda: recorder.exit is not None or recorder.failed is not None)
    if recorder.exit is not None:
        await recorder.until(lambda: recorder.received() >= recorder.exit.end)  # type: ignore[union-attr]
    return recorder


def sleeping(marker: str) -> list[int]:
    """Live processes of the agent's user whose command line holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != UID or (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if marker.encode() in (entry / "cmdline").read_bytes().replace(b"\0", b" "):
                found.append(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
    return found


class TestCommands:
    async def test_output_and_exit_code(self, agent: Agent) -> None:
        """Both streams numbered together, in order; the exit code exact."""
        done = await run(agent.link(), "echo out; echo err >&2; echo more; exit 3")
        assert (done.text("stdout"), done.text("stderr")) == (b"out\nmore\n", b"err\n")
        assert done.exit is not None
        assert (done.exit.exit_code, done.exit.signal, done.exit.end) == (3, 0, 13)

    async def test_a_signal_death_is_128_plus_n(self, agent: Agent) -> None:
        done = await run(agent.link(), "kill -9 $$")
        assert done.exit is not None and (done.exit.exit_code, done.exit.signal) == (137, 9)

    async def test_the_text_of_the_command_is_in_no_argv(self, agent: Agent) -> None:
        """A one-line command reaches its shell on a pipe: `pgrep -f` finds only the command's own processes."""
        done = await run(agent.link(), "sleep 31415 & tr '\\0' ' ' < /proc/$$/cmdline; kill $!")
        assert b"31415" not in done.text("stdout")
        assert done.text("stdout") == b"bash -lc __sandboxd \\\n  "

    async def test_the_pid_reported_is_the_commands_own(self, agent: Agent) -> None:
        """The helper executes the shell in its own place: the pid the agent reports is the shell's $$."""
        recorder = Recorder()
        link = agent.link()
        channel = await SessionChannel.open(link, recorder)
        await channel.start(request("echo $$"))
        await channel.pull(ack=0, ack_gap=0, until=1 << 20, reader=True)
        await recorder.until(lambda: recorder.exit is not None)
        assert recorder.pid == int(recorder.text())

    async def test_a_bad_working_directory_fails_the_start(self, agent: Agent) -> None:
        done = await run(agent.link(), "true", cwd="/nonexistent/dir")
        assert done.failed is not None and done.failed[0] == "chdir"
        assert "/nonexistent/dir" in done.failed[1]

    async def test_ctrl_c_reaches_the_process_group(self, agent: Agent) -> None:
        """SIGINT to the group, with its default disposition: the command dies of it, 130."""
        recorder = Recorder()
        link = agent.link()
        channel = await SessionChannel.open(link, recorder)
        await channel.start(request("echo ready; sleep 100"))
        await channel.pull(ack=0, ack_gap=0, until=1 << 20, reader=True)
        await recorder.until(lambda: b"ready" in recorder.text())
        await channel.signal(int(signal.SIGINT), interrupt=True)
        await recorder.until(lambda: recorder.exit is not None)
        assert recorder.exit is not None and (recorder.exit.exit_code, recorder.exit.signal) == (130, 2)

    async def test_the_kill_ladder_reaches_setsid_and_double_forks(self, agent: Agent) -> None:
        """TERM, then KILL after the grace, of everything the command started, escapees included."""
        recorder = Recorder()
        link = agent.link()
        channel = await SessionChannel.open(link, recorder)
        n = random.randrange(10_000, 99_999)
        command = (
            f"trap '' TERM; setsid sleep {n}1 & (setsid sh -c 'sleep {n}2 & echo' &); sleep {n}3 & "
            "sleep 0.3; echo ready; wait"
        )
        await channel.start(request(command))
        await channel.pull(ack=0, ack_gap=0, until=1 << 20, reader=True)
        await recorder.until(lambda: b"ready" in recorder.text())
        assert len(sleeping(f"sleep {n}")) == 3
        started = time.monotonic()
        await channel.kill(0.5)
        await recorder.until(lambda: recorder.exit is not None)
        assert time.monotonic() - started < 5
        assert recorder.exit is not None and recorder.exit.signal == signal.SIGKILL
        assert sleeping(f"sleep {n}") == []

    async def test_a_timeout_ends_everything(self, agent: Agent) -> None:
        done = await run(agent.link(), "sleep 1000 & setsid sleep 1001 & sleep 1002", timeout_s=1.0)
        assert done.exit is not None and done.exit.timed_out
        assert done.exit.leftovers == 0

    async def test_a_background_server_does_not_hold_the_exit(self, agent: Agent) -> None:
        """`server &` with the pipe still open: the exit comes at once, the server stays (its timeout bounds it)."""
        n = random.randrange(10_000, 99_999)
        started = time.monotonic()
        done = await run(agent.link(), f"sleep {n} & echo started", timeout_s=3.0)
        assert time.monotonic() - started < 2
        assert done.text() == b"started\n"
        assert done.exit is not None and (done.exit.exit_code, done.exit.leftovers) == (0, 1)
        assert len(sleeping(f"sleep {n}")) == 1
        deadline = time.monotonic() + 10  # the command's timeout ends its leftovers too
        while sleeping(f"sleep {n}"):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)

    async def test_tty_mode(self, agent: Agent) -> None:
        """A terminal: both streams on it, `test -t`, its size."""
        done = await run(agent.link(), "test -t 1 && echo tty; stty size; echo err >&2", tty=True, columns=100)
        assert done.text().replace(b"\r\n", b"\n") == b"tty\n24 100\nerr\n"


class TestOutput:
    async def test_back_pressure_loses_nothing(self, agent: Agent) -> None:
        """A reader that acknowledges as it goes gets every byte of 20 MB through a 64 KiB buffer."""
        recorder = Recorder()
        link = agent.link()
        channel = await SessionChannel.open(link, recorder)
        await channel.start(request("head -c 20000000 /dev/zero", buffer_bytes=65536))
        await channel.pull(ack=0, ack_gap=0, until=65536, reader=True)
        taken = 0
        async with asyncio.timeout(60):
            while recorder.exit is None or taken < recorder.exit.end:
                await recorder.until(lambda seen=taken: recorder.received() > seen or recorder.exit is not None)
                taken = recorder.received()
                await channel.pull(ack=taken, ack_gap=0, until=taken + 65536, reader=True)
        assert recorder.exit is not None
        assert (taken, recorder.exit.end, recorder.exit.dropped, recorder.gaps) == (20_000_000, 20_000_000, 0, [])

    async def test_without_a_reader_the_head_is_kept_and_the_rest_counted(self, agent: Agent) -> None:
        recorder = Recorder()
        channel = await SessionChannel.open(agent.link(), recorder)
        await channel.start(request("head -c 1000000 /dev/zero; echo; echo tail", buffer_bytes=4096))
        await channel.pull(ack=0, ack_gap=0, until=0, reader=False)
        await recorder.until(lambda: recorder.exit is not None)
        await channel.pull(ack=0, ack_gap=0, until=1 << 20, reader=True)
        assert recorder.exit is not None
        await recorder.until(lambda: recorder.received() >= 4096 and bool(recorder.gaps))
        assert recorder.received() == 4096
        assert recorder.gaps[-1] == (4096, 1_000_006 - 4096)
        assert recorder.exit.dropped == 1_000_006 - 4096

    async def test_a_reconnect_resends_from_the_acknowledgement(self, agent: Agent) -> None:
        """The connection drops mid-stream: a new one continues from the exact byte, no repeat, no gap."""
        first = agent.link()
        recorder = Recorder()
        channel = await SessionChannel.open(first, recorder)
        started = request("for i in $(seq 1 400); do echo line-$i; sleep 0.005; done")
        await channel.start(started)
        await channel.pull(ack=0, ack_gap=0, until=1 << 20, reader=True)
        await recorder.until(lambda: recorder.text().count(b"\n") >= 50)
        kept = recorder.text()
        channel.close()
        await first.close()
        second = agent.link()
        welcome = await second.connect()
        [state] = welcome.sessions
        assert state.process_id == started.process_id
        resumed = Recorder()
        channel = SessionChannel(second, resumed, state.channel)
        await channel.pull(ack=len(kept), ack_gap=0, until=1 << 20, reader=True)
        await resumed.until(lambda: resumed.exit is not None and resumed.received() >= resumed.exit.end, 30)
        rest = b"".join(data for offset, (_, data) in sorted(resumed.output.items()) if offset >= len(kept))
        expected = b"".join(b"line-%d\n" % i for i in range(1, 401))
        assert kept + rest[: len(expected) - len(kept)] == expected
        assert min(resumed.output) >= state.ack  # nothing before the acknowledgement came again


class TestFiles:
    async def test_write_then_read(self, agent: Agent, scratch: Path) -> None:
        link = agent.link()
        target = scratch / "f.txt"

        async def body() -> AsyncIterator[bytes]:
            yield b"hello "
            yield b"world\n"

        replies = [r async for r in link.file_operation(f"{UID}:{GID}", {"op": "write", "path": str(target)}, body())]
        assert isinstance(replies[-1], FileResult)
        assert target.read_bytes() == b"hello world\n"
        operation = {"op": "read", "path": str(target), "max_bytes": 1024}
        replies = [r async for r in link.file_operation(f"{UID}:{GID}", operation)]
        assert b"".join(r.data for r in replies if isinstance(r, FileData)) == b"hello world\n"

    async def test_an_error_carries_its_code(self, agent: Agent) -> None:
        link = agent.link()
        with pytest.raises(FileOperationRefused) as caught:
            async for _ in link.file_operation(f"{UID}:{GID}", {"op": "read", "path": "/nonexistent/x"}):
                pass
        assert caught.value.code == "not_found"
        assert "No such file or directory" in caught.value.message


FORGED_BRIDGE = r"""
import os, struct, sys, json
def frame(kind, channel, payload):
    return struct.pack(">IcI", len(payload) + 5, kind, channel) + payload
sys.stdin.buffer.read(9 + len(b'{"protocol":1}'))  # the hello
out = sys.stdout.buffer
out.write(frame(b"w", 0, json.dumps({"protocol": 1, "agent": "forged", "pid": 1, "sessions": []}).encode()))
out.flush()
sys.stdin.buffer.read(9)  # the start's header: its channel is in use now
mode = sys.argv[1]  # (the daemon appends "bridge")
if mode == "oversized":
    out.write(struct.pack(">IcI", 0xFFFFFFF0, b"o", 1) + b"x" * 100)
elif mode == "truncated":
    out.write(frame(b"s", 1, b'{"pid": 4}')[:7])
    out.flush()
    sys.exit(0)
elif mode == "unknown":
    out.write(frame(b"s", 1, b'{"pid": 4}') + frame(b"Q", 1, b"") + frame(b"s", 99, b'{"pid": 5}'))
out.flush()
sys.stdin.buffer.read()
"""


class TestForgedFrames:
    @pytest.mark.parametrize("mode", ["oversized", "truncated", "unknown"])
    async def test_a_bad_frame_fails_the_call_and_nothing_else(self, scratch: Path, mode: str) -> None:
        """A bridge that sends an oversized, truncated or unknown frame (or one for a channel that does
        not exist): the session concerned fails or its connection is dropped -- never the daemon, never
        unbounded memory (an oversized frame is refused by its header, before any of it is buffered)."""
        script = scratch / "forged.py"
        script.write_text(FORGED_BRIDGE)
        backend = LocalBackend([sys.executable, str(script), mode], {"PATH": "/usr/bin:/bin"}, as_agent_user=False)
        link = AgentLink(backend, "ws-forged", "c")  # type: ignore[arg-type]
        recorder = Recorder()
        try:
            channel = await SessionChannel.open(link, recorder)
            await channel.start(request("true"))
            if mode == "unknown":
                await recorder.until(lambda: bool(recorder.broken))
                assert recorder.pid == 4
                assert recorder.broken == ["the agent sent a frame of kind b'Q' on a process session"]
            else:
                await recorder.until(lambda: backend.opened >= 2, 10)  # dropped, and the link tries again
                assert recorder.pid == 0 and recorder.exit is None
        finally:
            await link.close()


async def test_the_agent_refuses_bad_frames_and_keeps_serving(agent: Agent) -> None:
    """Frames the agent cannot take are answered with an error on their channel; it keeps serving."""
    link = agent.link()
    await link.connect()
    await link.send(b"Z", 5, b"")  # unknown kind
    await link.send(b"I", 77, b"input for nobody")  # no such session
    await link.send(b"S", 9, b"{not json")
    done = await run(link, "echo still")
    assert done.text() == b"still\n"
    assert agent.alive()
    # An oversized frame ends that connection only.
    stream = link._stream
    assert stream is not None
    await stream.write(struct.pack(">IcI", 0x7FFFFFFF, b"I", 1))
    with contextlib.suppress(AgentLost):
        await asyncio.sleep(0.5)
    done = await run(agent.link(), "echo after")
    assert done.text() == b"after\n"
    assert agent.alive()


class TestInstall:
    """``sandboxd-agent install PATH``: what a Kubernetes init container runs (docs/kubernetes.md)."""

    def test_it_copies_itself_whole_as_a_non_root_user_on_a_read_only_root(  # type: ignore[no-untyped-def]
        self, docker_client, default_image: str
    ) -> None:
        """As the init container runs it: uid 65532, no capabilities, a read-only root, a shared volume."""
        build = AgentBuild(agent_digest())
        arch = AgentBuild.binary_dir(docker_client.info()["Architecture"])
        volume = docker_client.volumes.create(labels={"sandboxd.instance": new_instance()})
        mounts = {volume.name: {"bind": "/agent", "mode": "rw"}}

        def run(image: str, *argv: str, user: str = "65532:65532") -> bytes:
            output: bytes = docker_client.containers.run(
                image,
                entrypoint=list(argv),
                volumes=mounts,
                user=user,
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges:true"],
                network_mode="none",
                remove=True,
                stderr=True,
            )
            return output

        try:
            run(default_image, "chmod", "1777", "/agent", user="0:0")  # an emptyDir's mode
            assert run(build.image, f"/{arch}/sandboxd-agent", "install", "/agent/sandboxd-agent") == b""
            assert run(build.image, "/agent/sandboxd-agent", "version").decode().strip() == build.tag
            assert run(default_image, "stat", "-c", "%a %u", "/agent/sandboxd-agent") == b"755 65532\n"
            with pytest.raises(docker.errors.ContainerError) as missing:
                run(build.image, f"/{arch}/sandboxd-agent", "install", "/agent/no/such/dir/sandboxd-agent")
            assert missing.value.exit_status == 1
            assert missing.value.stderr.startswith(b"sandboxd-agent: open /agent/no/such/dir/")
            with pytest.raises(docker.errors.ContainerError) as usage:
                run(build.image, f"/{arch}/sandboxd-agent", "install")
            assert (usage.value.exit_status, usage.value.stderr) == (2, b"sandboxd-agent: install takes one path\n")
            assert run(default_image, "ls", "-A", "/agent") == b"sandboxd-agent\n"  # no temporary file left
        finally:
            volume.remove(force=True)
