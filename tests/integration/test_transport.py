"""How the daemon reaches a workspace's agent: straight to its socket from the host, or through the bridge.

A daemon on the engine's machine, as root, connects to the agent's socket at the host path
of the container's private volume: runc shows the socket there, and so does gVisor
registered with ``--host-uds=create`` (``scripts/install-runsc``). No ``docker exec`` is
left at all, so no bridge runs in the workspace. With ``SANDBOXD_AGENT_TRANSPORT=bridge``
(what a remote engine or a daemon in a container gets) the same calls go through one
exec'd bridge per connection. Both, under both runtimes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sandboxd_client import SandboxClient

from sandboxd.agent import AgentLink
from sandboxd.backend.docker import DockerBackend
from tests.conftest import DaemonThread, make_settings

from .helpers import collect, skip_without, start_ready

pytestmark = pytest.mark.docker

RUNTIMES = ["runc", pytest.param("runsc", marks=pytest.mark.runsc)]
BRIDGES = (
    "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done 2>/dev/null"
    " | grep -c '^/.sandboxd/sandboxd-agent bridge'"
)
"""Bridges running in the workspace (from /proc: busybox has no full ps)."""


@pytest.fixture(scope="module")
def bridge_daemon(default_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonThread]:
    """A daemon that always takes the bridge."""
    thread = DaemonThread(make_settings(tmp_path_factory.mktemp("bridge"), agent_transport="bridge")).start()
    yield thread
    thread.stop()


@pytest.fixture
async def bridged(bridge_daemon: DaemonThread) -> AsyncIterator[SandboxClient]:
    async with SandboxClient(socket_path=bridge_daemon.socket_path, retries=False) as connected:
        yield connected


def agent_socket(docker_client, workspace_id: str) -> tuple[str, Path]:  # type: ignore[no-untyped-def]
    """The workspace's container id and the host path of its agent's socket."""
    (container,) = docker_client.containers.list(
        filters={"label": f"sandboxd.workspace_id={workspace_id}"}, ignore_removed=True
    )
    (mount,) = [m for m in container.attrs["Mounts"] if m["Destination"] == "/run/sandboxd"]
    assert mount["Type"] == "volume"
    return container.id, Path(mount["Source"]) / "agent.sock"


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_the_daemon_goes_straight_to_the_agents_socket(
    client, docker_client, runtime: str, request: pytest.FixtureRequest
) -> None:
    """No bridge in the workspace, whatever it runs; the socket the host sees is root's alone."""
    skip_without(runtime, request)
    ws = await client.create_workspace(runtime=runtime, labels={"test": "transport"})
    try:
        process_id = await start_ready(ws, "echo ready; sleep 100")
        assert (await ws.write_file("/workspace/a.txt", "one\n")).size_bytes == 4
        assert "1\tone" in (await ws.read_file("/workspace/a.txt")).content
        deadline = time.monotonic() + 30  # a bridge a link took before it went straight ends
        while (bridges := (await ws.exec(BRIDGES).wait()).stdout) != "0\n":
            assert time.monotonic() < deadline, f"{bridges.strip()} bridges still run"
            await asyncio.sleep(0.2)
        events = [e async for e in client.input(process_id, "\u0003")]
        assert events[-1].exit_code == 130
        _container, path = agent_socket(docker_client, ws.workspace_id)
        directory = path.parent.stat()
        assert (stat.S_IMODE(directory.st_mode), directory.st_uid) == (0o700, 0)
        listening = path.stat()
        assert stat.S_ISSOCK(listening.st_mode) and listening.st_uid == 0
    finally:
        await ws.delete()
    assert not path.parent.exists()  # the private volume went with the container


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_through_the_bridge_the_same_calls_work(bridged, runtime: str, request: pytest.FixtureRequest) -> None:
    """One bridge for every call of the workspace; exit codes, Ctrl-C, a stream and files as straight."""
    skip_without(runtime, request)
    ws = await bridged.create_workspace(runtime=runtime, labels={"test": "transport-bridge"})
    try:
        assert (await ws.exec("echo hi").wait()).stdout == "hi\n"
        assert (await ws.exec("kill -9 $$").wait()).exit_code == 137
        process_id = await start_ready(ws, "echo ready; sleep 100")
        events = [e async for e in bridged.input(process_id, "\u0003")]
        assert events[-1].exit_code == 130
        _, out, _ = await collect(ws.exec("head -c 3000000 /dev/zero | tr '\\0' x; echo", max_output_bytes=4 << 20))
        assert out == "x" * 3_000_000 + "\n"
        await ws.write_file("/workspace/crlf.txt", "a\r\nb\r\n")
        await ws.edit_file("/workspace/crlf.txt", "b", "c")
        assert (await ws.exec("od -c /workspace/crlf.txt | head -1").wait()).stdout.split()[1:] == [
            "a",
            "\\r",
            "\\n",
            "c",
            "\\r",
            "\\n",
        ]
        assert (await ws.exec(BRIDGES).wait()).stdout == "1\n"
    finally:
        await ws.delete()


async def test_what_the_host_sees_of_a_runtime_is_learnt_from_a_yes_only(client, docker_client) -> None:
    """Each link of a runtime not yet seen asks once, after its bridge's welcome; only a yes is kept.

    A no may be one workspace's own doing (its root planted something at the path): it must not
    send every later workspace of that runtime through the bridge. (A runtime is played here by
    a fresh runtime name, a "no" by a socket path that does not exist.)
    """
    ws = await client.create_workspace(labels={"test": "transport-learn"})
    container, path = agent_socket(docker_client, ws.workspace_id)
    backend = Counting(docker_host="unix:///var/run/docker.sock", instance="unused")
    seen: set[str] = set()
    links: list[AgentLink] = []
    runtime = f"learnt-{secrets.token_hex(3)}"

    async def link_through(socket_path: str) -> str:
        links.append(
            link := AgentLink(
                backend, ws.workspace_id, container, socket_path=socket_path, runtime=runtime, host_sockets=seen
            )
        )
        await link.connect()
        transport = link.transport
        await link.close()
        return transport

    try:
        for tried in (1, 2):
            assert await link_through("/nonexistent/agent.sock") == "bridge"
            assert (backend.tried, seen) == (tried, set())  # asked after its welcome; the no is not kept
        assert await link_through(str(path)) == "socket"  # asked after its welcome, and kept that connection
        assert (backend.tried, seen) == (3, {runtime})
        assert await link_through(str(path)) == "socket"  # straight there: one attempt
        assert backend.tried == 4
        assert (await ws.exec("echo still").wait()).stdout == "still\n"  # the daemon's own link is back
    finally:
        for link in links:
            await link.close()
        await backend.close()
        await ws.delete()


async def test_a_socket_not_there_yet_is_waited_for_and_one_that_refuses_is_not(
    client, docker_client, tmp_path: Path
) -> None:
    """The agent's socket gets its name once it listens (agent_linux.go listenAtOnce): a file not
    there yet is a starting agent, waited for; a file there that refuses is no agent, and the link
    goes through the bridge at once (it used to try such a file for 3 s)."""
    ws = await client.create_workspace(labels={"test": "transport-known-late"})
    container, path = agent_socket(docker_client, ws.workspace_id)
    late = tmp_path / "late.sock"
    backend = Counting(docker_host="unix:///var/run/docker.sock", instance="unused")

    def link_at(socket_path: Path) -> AgentLink:
        return AgentLink(
            backend, ws.workspace_id, container, socket_path=str(socket_path), runtime="known", host_sockets={"known"}
        )

    links = [link_at(late), link_at(tmp_path / "refusing.sock")]
    try:
        connecting = asyncio.create_task(links[0].connect())
        deadline = time.monotonic() + 2
        while backend.tried < 2:  # not there: it is trying again
            assert time.monotonic() < deadline and not connecting.done(), "the connect did not try the socket again"
            await asyncio.sleep(0.01)
        late.symlink_to(path)  # it appears, listening
        await connecting
        assert links[0].transport == "socket"
        (tmp_path / "refusing.sock").write_text("")  # there, and nothing listens
        backend.tried = 0
        began = time.monotonic()
        await links[1].connect()
        assert (links[1].transport, backend.tried) == ("bridge", 2)
        assert time.monotonic() - began < 2.5  # one attempt, the bridge's exec, one more after its welcome
    finally:
        for link in links:
            await link.close()
        await backend.close()
        await ws.delete()


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_socket_that_refused_once_does_not_keep_its_workspace_on_the_bridge(
    client, docker_client, runtime: str, request: pytest.FixtureRequest
) -> None:
    """A runtime known to show its sockets, and one connect refused (a loaded gVisor sandbox's
    host socket, its backlog not yet served): the bridge answers, the link goes straight right
    after its welcome, and the bridge it left ends (it used to stay for the workspace's life)."""
    skip_without(runtime, request)
    ws = await client.create_workspace(runtime=runtime, labels={"test": "transport-refused-once"})
    container, path = agent_socket(docker_client, ws.workspace_id)
    backend = RefusingOnce(docker_host="unix:///var/run/docker.sock", instance="unused")
    link = AgentLink(
        backend, ws.workspace_id, container, socket_path=str(path), runtime=runtime, host_sockets={runtime}
    )
    try:
        await link.connect()
        assert (link.transport, backend.tried) == ("socket", 2)  # refused, then straight after the bridge's welcome
        deadline = time.monotonic() + 30
        while (bridges := (await ws.exec(BRIDGES).wait()).stdout) != "0\n":
            assert time.monotonic() < deadline, f"{bridges.strip()} bridges still run"
            await asyncio.sleep(0.2)
    finally:
        await link.close()
        await backend.close()
        await ws.delete()


SOCKET_STATES = """
import os, socket, time
def step(said, then):
    open("/run/states/" + said, "w").close()
    while not os.path.exists("/run/states/" + then):
        time.sleep(0.01)
s = socket.socket(socket.AF_UNIX)
s.bind("/run/states/s.sock")
step("bound", "listen")
s.listen()
step("listening", "accept")
c, _ = s.accept()
c.sendall(b"hello")
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_what_the_host_sees_of_a_sockets_bind_listen_and_accept(
    docker_client, default_image: str, runtime: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The cause of "the socket's file is there before it answers", reproduced in a few lines.

    A Unix socket's file exists from bind(2); connects are refused until listen(2), and get no
    byte until accept(2). Under runc the agent's bind and listen are microseconds apart; under
    gVisor (--host-uds=create) bind makes the host's socket in the gofer at once and listen is a
    later round trip to it (runsc/fsgofer/lisafs.go ``BindAt``, then ``ListenHandler``), which a
    throttled sandbox stretches to hundreds of milliseconds. So the agent listens under another
    name and renames its socket into place (agent_linux.go ``listenAtOnce``).
    """
    skip_without(runtime, request)
    run = tmp_path / "states"
    run.mkdir()

    def reached(name: str) -> None:
        deadline = time.monotonic() + 30
        while not (run / name).exists():
            assert time.monotonic() < deadline, f"the socket's owner never said {name!r}"
            time.sleep(0.01)

    container = docker_client.containers.run(
        default_image,
        ["python3", "-c", SOCKET_STATES],
        user="0:0",
        runtime=runtime,
        network_mode="none",
        volumes={str(run): {"bind": "/run/states", "mode": "rw"}},
        labels={"sandboxd.test": "socket-states"},
        detach=True,
    )
    try:
        reached("bound")
        host = run / "s.sock"
        assert host.exists()
        with socket.socket(socket.AF_UNIX) as probe, pytest.raises(ConnectionRefusedError):
            probe.connect(str(host))  # the file is there; nothing listens
        (run / "listen").touch()
        reached("listening")
        with socket.socket(socket.AF_UNIX) as early:
            early.connect(str(host))  # taken into the backlog at once
            early.settimeout(1)
            with pytest.raises(TimeoutError):
                early.recv(5)  # and silent until accepted
            (run / "accept").touch()
            early.settimeout(30)
            assert early.recv(5) == b"hello"
    finally:
        container.remove(force=True)


class Counting(DockerBackend):
    """The real backend, counting direct connection attempts."""

    tried = 0

    async def open_socket(self, host_path: str, container_id: str):  # type: ignore[no-untyped-def]
        self.tried += 1
        return await super().open_socket(host_path, container_id)


class RefusingOnce(Counting):
    """The real backend, whose first direct connection is refused."""

    async def open_socket(self, host_path: str, container_id: str):  # type: ignore[no-untyped-def]
        stream = await super().open_socket(host_path, container_id)
        if self.tried == 1 and stream is not None:
            await stream.close(discard_input=True)
            return None
        return stream


LISTENER = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen()
print("listening", flush=True)
c, _ = s.accept()
c.sendall(b"hello")
c.recv(1)
"""


OTHER_UID = 54321
SYSTEM_PYTHON = "/usr/bin/python3"
"""A Python any user may run (the suite's own may sit in root's home)."""


@contextlib.contextmanager
def listener(path: Path, uid: int) -> Iterator[subprocess.Popen[str]]:
    with subprocess.Popen(
        [SYSTEM_PYTHON, "-c", LISTENER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        user=uid,
        cwd="/",
    ) as process:
        try:
            assert process.stdout is not None and process.stderr is not None
            if process.stdout.readline() != "listening\n":
                process.kill()
                pytest.fail(f"the listener as uid {uid} did not start: {process.stderr.read()}")
            yield process
        finally:
            process.kill()


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
    reason="needs root, and a system python3, to listen as another user",
)
async def test_only_the_containers_root_is_taken_for_its_agent(client, docker_client) -> None:
    """The path is the container's to change; what answers there must be of the container.

    A workspace whose user is root plants a symlink to the host's Docker socket (followed on
    the host, where the daemon connects): refused, like a socket of another uid or a root one
    of the host, or the agent's own asked for as another container's.
    """
    ws = await client.create_workspace(user="0:0", labels={"test": "transport-forged"})
    backend = DockerBackend(docker_host="unix:///var/run/docker.sock", instance="unused")
    try:
        container, path = agent_socket(docker_client, ws.workspace_id)
        stream = await backend.open_socket(str(path), container)
        assert stream is not None
        await stream.close(discard_input=True)
        assert await backend.open_socket(str(path), "0" * 64) is None
        with tempfile.TemporaryDirectory(prefix="sandboxd-transport-", dir="/tmp") as shared:
            Path(shared).chmod(0o777)  # and /tmp, unlike pytest's own, is open to every user
            # A uid no other test uses (the host agent and its commands run as nobody).
            for name, uid in (("other.sock", OTHER_UID), ("root.sock", 0)):
                with listener(Path(shared) / name, uid):
                    assert await backend.open_socket(str(Path(shared) / name), container) is None
        planted = await ws.exec("ln -sf /var/run/docker.sock /run/sandboxd/agent.sock && echo planted").wait()
        assert planted.stdout == "planted\n"
        assert path.is_symlink()
        assert await backend.open_socket(str(path), container) is None
        assert await backend.open_socket(str(path.parent / "gone.sock"), container) is None
        assert await backend.open_socket(str(path.parent / ("x" * 200)), container) is None  # too long
        remote = DockerBackend(docker_host="tcp://127.0.0.1:1", instance="unused")
        assert await remote.open_socket(str(path), container) is None  # not on the engine's machine
    finally:
        await backend.close()
        await ws.delete()
