"""Memory snapshots: a workspace's running processes kept, and restored running in every fork.

Under gVisor (runsc), the one runtime whose checkpoints work on this machine
(docs/snapshots.md): a REPL keeps its variables, a server keeps listening, a command's
output goes on from the byte its source's callers had taken, and each fork has its own
process ids and its own state. What cannot be kept is refused and leaves nothing; a daemon
killed in the middle of one leaves nothing half made.
"""

from __future__ import annotations

import asyncio
import random
import time
import urllib.request
from pathlib import Path

import docker
import pytest
from sandboxd_client import FailedPreconditionError, SandboxClient

from tests.conftest import DaemonThread, make_settings, spawned_daemon

from .helpers import exec_until, start_ready

pytestmark = [pytest.mark.docker, pytest.mark.runsc]

HTTP_SERVER = "cd /workspace && exec python3 -u -m http.server 8124 --bind 127.0.0.1"
REPL = "exec python3 -u -i -q -c 'print(\"ready\")'"
COUNTER = "i=0; while :; do echo $i; i=$((i+1)); sleep 0.05; done"


@pytest.fixture
async def own(tmp_path: Path, default_image: str, checkpoints_available: bool):  # type: ignore[no-untyped-def]
    """A daemon of its own, with its client and instance."""
    if not checkpoints_available:
        pytest.skip("memory snapshots need runsc and the engine's checkpoints (scripts/enable-checkpoints)")
    thread = DaemonThread(make_settings(tmp_path)).start()
    try:
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            yield client, thread.settings.instance
    finally:
        thread.stop()


def store(docker_client: docker.DockerClient, instance: str) -> list[str]:
    """The checkpoints an instance keeps in the engine's data root."""
    root = Path(docker_client.info()["DockerRootDir"]) / "sandboxd-checkpoints" / instance
    return sorted(entry.name for entry in root.iterdir()) if root.is_dir() else []


def engine_copies(docker_client: docker.DockerClient, container_id: str) -> list[str]:
    """Checkpoints the engine holds in a container's own directory."""
    own = Path(docker_client.info()["DockerRootDir"]) / "containers" / container_id / "checkpoints"
    return sorted(entry.name for entry in own.iterdir()) if own.is_dir() else []


def http_get(address: str, path: str) -> bytes:
    with urllib.request.urlopen(f"http://{address}/{path}", timeout=30) as response:
        return bytes(response.read())


async def say(client: SandboxClient, process_id: str, line: str, expect: str) -> str:
    """Type ``line`` into a REPL and return what it printed up to ``expect``."""
    seen = ""
    handle = client.input(process_id, line + "\n", yield_after_s=0.25)
    deadline = time.monotonic() + 30
    while True:
        result = await handle.wait()
        seen += result.stdout
        if expect in seen or time.monotonic() > deadline:
            return seen
        handle = client.input(process_id, yield_after_s=0.25)


async def test_forks_go_on_running_each_with_its_own_state(own, docker_client: docker.DockerClient) -> None:
    """A REPL's variable, a server, a counting command and /tmp come back running in two forks; the source runs on."""
    client, instance = own
    source = await client.create_workspace(runtime="runsc")
    repl = await start_ready(source, REPL, ready="ready")
    assert "41" in await say(client, repl, "x = 41; print(x)", "41")
    await start_ready(source, HTTP_SERVER, ready="Serving HTTP")
    counter, shown = await exec_until(source, COUNTER, "\n20\n")
    await source.exec("echo kept > /tmp/state").wait(check=True)
    # A terminal session nobody reads at the moment: its terminal is the agent's, inside the sandbox.
    terminal = await start_ready(source, "stty -echo; echo ready; exec cat", ready="ready", tty=True)
    # What the counter's callers took so far: a fork's output goes on from the next byte.
    taken = (await client.input(counter, yield_after_s=0.05).wait()).stdout
    last = int((shown + taken).split()[-1])

    snapshot = await source.snapshot("live", include_memory=True)
    assert snapshot.include_memory and snapshot.memory_bytes > 0
    assert store(docker_client, instance) != []

    # The source runs on: its REPL, its counter, and none of it restarted.
    assert "42" in await say(client, repl, "x += 1; print(x)", "42")
    forks = [await client.create_workspace(from_snapshot="live") for _ in range(2)]
    ids = {source.workspace_id: {p.process_id for p in await client.list_processes(source.workspace_id)}}
    for number, fork in enumerate(forks):
        assert fork.info.runtime == "runsc"
        processes = await client.list_processes(fork.workspace_id)
        ids[fork.workspace_id] = {p.process_id for p in processes}
        repls = [p.process_id for p in processes if p.command == REPL]
        assert len(repls) == 1, processes
        mine = repls[0]
        # The variable is the snapshot's (41), and each fork changes its own.
        assert f"{41 + 100 * (number + 1)}" in await say(
            client, mine, f"x += {100 * (number + 1)}; print(x)", str(41 + 100 * (number + 1))
        )
        # The counter goes on from the byte after the one its source's callers took.
        counting = [p.process_id for p in processes if p.command.startswith("i=0")]
        assert len(counting) == 1
        went_on = ""
        while len(went_on.split()) < 3:
            went_on += (await client.input(counting[0], yield_after_s=0.3).wait()).stdout
        numbers = [int(n) for n in went_on.split()]
        assert numbers[0] == last + 1, (last, numbers[:5])
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
        # The server listens in each fork, serving that fork's own files; /tmp is the snapshot's.
        await fork.write_file("/workspace/who", f"fork {number}\n")
        async with fork.forward(8124) as address:
            assert await asyncio.to_thread(http_get, address, "who") == f"fork {number}\n".encode()
        assert (await fork.exec("cat /tmp/state").wait()).stdout == "kept\n"
        (cat,) = [p.process_id for p in processes if p.command.endswith("exec cat")]
        assert cat != terminal
        echoed = ""
        handle = client.input(cat, f"tty {number}\n", yield_after_s=0.5)
        for _ in range(40):
            echoed += (await handle.wait()).stdout
            if f"tty {number}" in echoed:
                break
            handle = client.input(cat, yield_after_s=0.5)
        assert f"tty {number}" in echoed, echoed
    # Every workspace has process ids of its own.
    sets = list(ids.values())
    assert all(not (a & b) for i, a in enumerate(sets) for b in sets[i + 1 :]), ids
    assert "43" in await say(client, repl, "x += 1; print(x)", "43")  # the forks changed nothing of it

    for fork in forks:
        await fork.delete()
    await source.delete()
    await client.delete_snapshot("live")
    assert store(docker_client, instance) == []


async def test_what_cannot_be_kept_is_refused_and_leaves_nothing(own, docker_client: docker.DockerClient) -> None:
    """runc, a socket bound on /workspace, an open forward, a paused or capped workspace: refused, all working after."""
    client, instance = own
    plain = await client.create_workspace(runtime="runc")
    with pytest.raises(FailedPreconditionError, match="gVisor"):
        await plain.snapshot("no", include_memory=True)
    await plain.delete()

    source = await client.create_workspace(runtime="runsc")
    binder = await start_ready(
        source,
        "exec python3 -u -c 'import socket,time; s=socket.socket(socket.AF_UNIX); "
        's.bind("/workspace/app.sock"); s.listen(); print("bound"); time.sleep(600)\'',
        ready="bound",
    )
    with pytest.raises(FailedPreconditionError, match="Unix socket"):
        await source.snapshot("no", include_memory=True)
    assert await client.list_snapshots() == []
    assert store(docker_client, instance) == []
    assert engine_copies(docker_client, source.info.container_id) == []
    assert (await source.exec("echo still").wait()).stdout == "still\n"  # its agent listens again
    await client.kill(binder)

    await start_ready(source, HTTP_SERVER, ready="Serving HTTP")
    async with source.forward(8124) as address:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")  # the forwarded connection is open
        with pytest.raises(FailedPreconditionError, match="port forward"):
            await source.snapshot("no", include_memory=True)
        writer.close()
    await source.pause()
    with pytest.raises(FailedPreconditionError, match="paused"):
        await source.snapshot("no", include_memory=True)
    await source.resume()
    # A fork or a restore that cannot take the processes is refused before anything is made or removed.
    kept = await source.snapshot("kept", include_memory=True)
    assert kept.include_memory
    for asked in ({"runtime": "runc"}, {"disk_bytes": 64 * 1024 * 1024}):
        with pytest.raises(FailedPreconditionError, match="running processes"):
            await client.create_workspace(from_snapshot="kept", **asked)
    plain = await client.create_workspace(runtime="runc")
    with pytest.raises(FailedPreconditionError, match="runsc"):
        await plain.restore("kept")
    assert (await plain.exec("echo intact").wait()).stdout == "intact\n"
    await plain.delete()
    await client.delete_snapshot("kept")
    capped = await client.create_workspace(runtime="runsc", disk_bytes=64 * 1024 * 1024)
    with pytest.raises(FailedPreconditionError, match="capped"):
        await capped.snapshot("no", include_memory=True)
    assert await client.list_snapshots() == []
    assert (await source.exec("echo fine").wait()).stdout == "fine\n"
    # Once nothing stands in the way, the same workspace is kept.
    kept = await source.snapshot("yes", include_memory=True)
    assert kept.include_memory
    await client.delete_snapshot("yes")
    for workspace in (capped, source):
        await workspace.delete()


async def test_a_daemon_killed_during_a_checkpoint_leaves_nothing_half_made(
    tmp_path: Path, docker_client: docker.DockerClient, checkpoints_available: bool
) -> None:
    """SIGKILL at a random moment of a memory snapshot of a 200 MiB process: the successor leaves no part of it."""
    if not checkpoints_available:
        pytest.skip("memory snapshots need runsc and the engine's checkpoints (scripts/enable-checkpoints)")
    seed = random.randrange(1 << 30)
    with spawned_daemon(tmp_path / "first") as (daemon, socket_path, _log):
        instance = daemon.args[daemon.args.index("--instance") + 1]
        async with SandboxClient(socket_path=socket_path, retries=False) as client:
            source = await client.create_workspace(runtime="runsc")
            await start_ready(
                source,
                'exec python3 -u -c \'import time; b = bytearray(200 << 20); b[::4096] = b"x" * len(b[::4096]);'
                ' print("ready"); time.sleep(600)\'',
                ready="ready",
            )
            taking = asyncio.ensure_future(source.snapshot("half", include_memory=True))
            await asyncio.sleep(random.Random(seed).uniform(0.05, 1.5))
            daemon.kill()
            await asyncio.to_thread(daemon.wait, 30)
            await asyncio.gather(taking, return_exceptions=True)
    print(f"seed {seed}")
    # The engine may finish the commit or checkpoint it was asked for after the successor's start
    # (it does not stop for a caller that is gone): its sweep, every second here, removes that too.
    with spawned_daemon(tmp_path / "second", instance, SANDBOXD_SNAPSHOT_SWEEP_S="1") as (
        _successor,
        socket_path,
        _log,
    ):
        async with SandboxClient(socket_path=socket_path, retries=False) as client:
            deadline = time.monotonic() + 60
            while True:
                snapshots = await client.list_snapshots()
                left = (
                    store(docker_client, instance),
                    engine_copies(docker_client, source.info.container_id),
                    [i.id for i in docker_client.images.list(filters={"label": f"sandboxd.instance={instance}"})],
                )
                whole = len(snapshots) == 1 and len(left[0]) == 1 and left[1] == [] and len(left[2]) == 1
                if left == ([], [], []) or whole or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            if whole:
                # The engine finished all of it before the successor looked: a whole snapshot, which forks.
                assert snapshots[0].include_memory
                fork = await client.create_workspace(from_snapshot="half")
                assert any(p.command.startswith("exec python3") for p in await client.list_processes(fork.workspace_id))
                await fork.delete()
                await client.delete_snapshot("half")
            else:
                assert (snapshots, left) == ([], ([], [], [])), f"seed {seed}: left behind {left}"
            again = await client.get_workspace(source.workspace_id)
            assert (await again.exec("echo back").wait()).stdout == "back\n"  # resumed, its agent listening
            await again.delete()


async def test_a_rollback_brings_back_the_processes_and_files_of_the_snapshot(own) -> None:
    """RestoreWorkspace to a memory snapshot: the same id, a new container, the REPL's variable and files back."""
    client, _instance = own
    source = await client.create_workspace(runtime="runsc", labels={"keep": "me"})
    repl = await start_ready(source, REPL, ready="ready")
    assert "1" in await say(client, repl, "x = 1; print(x)", "1")
    await source.write_file("/workspace/before", "before\n")
    await source.snapshot("good", include_memory=True)
    assert "99" in await say(client, repl, "x = 99; print(x)", "99")
    await source.exec("rm /workspace/before; echo after > /workspace/after").wait(check=True)
    old_container = source.info.container_id

    restored = await client.restore_workspace(source.workspace_id, "good")
    assert restored.workspace_id == source.workspace_id
    assert restored.container_id != old_container
    assert restored.labels == {"keep": "me"}  # its own spec
    processes = await client.list_processes(source.workspace_id)
    repls = [p.process_id for p in processes if p.command == REPL]
    assert len(repls) == 1 and repls[0] != repl, processes
    assert "2" in await say(client, repls[0], "x += 1; print(x)", "2")  # x was 1 again
    listing = (await source.exec("ls /workspace").wait()).stdout.split()
    assert "before" in listing and "after" not in listing, listing
    plain = await client.create_workspace(runtime="runc")
    with pytest.raises(FailedPreconditionError, match="runsc"):
        await plain.restore("good")
    await plain.delete()
    await source.delete()
    await client.delete_snapshot("good")


async def test_forks_of_one_memory_snapshot_made_at_once_all_run(own) -> None:
    """Four forks at once of one memory snapshot: each runs, with process ids of its own."""
    client, _instance = own
    source = await client.create_workspace(runtime="runsc")
    await start_ready(source, REPL, ready="ready")
    await source.snapshot("many", include_memory=True)
    forks = await asyncio.gather(*(client.create_workspace(from_snapshot="many") for _ in range(4)))
    ids = [{p.process_id for p in await client.list_processes(f.workspace_id)} for f in forks]
    assert all(len(each) == 1 for each in ids), ids
    assert len(set().union(*ids)) == 4
    for fork in forks:
        assert (await fork.exec("echo up").wait()).stdout == "up\n"
        await fork.delete()
    await source.delete()
    await client.delete_snapshot("many")
