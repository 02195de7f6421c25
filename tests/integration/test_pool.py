"""The warm pool: a matching create takes a started member, and nobody can tell.

Each test runs its own daemon with its own pool (the shared test daemon keeps none), on a
private instance label, and looks at the engine itself to see what was claimed.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sandboxd_client import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    SandboxClient,
)

from tests.conftest import DaemonThread, make_settings, new_instance, spawned_daemon

pytestmark = pytest.mark.docker


async def until_ready(client: SandboxClient, ready: int, name: str = "default", timeout: float = 60) -> None:
    """Wait until the class holds ``ready`` members."""
    deadline = time.monotonic() + timeout
    while True:
        classes = {c.name: c for c in await client.get_pool()}
        if classes[name].ready == ready:
            return
        assert time.monotonic() < deadline, f"the pool never held {ready}: {classes[name]}"
        await asyncio.sleep(0.05)


def containers(docker_client, instance: str) -> list:  # type: ignore[type-arg, no-untyped-def]
    # Workspaces and members: the instance's lease (no sandboxd.managed label) is none of them.
    return docker_client.containers.list(
        all=True, filters={"label": [f"sandboxd.instance={instance}", "sandboxd.managed=true"]}, ignore_removed=True
    )


def container_ids(docker_client, instance: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The ids of what ``containers`` lists, in one call: a list inspects each container, and one
    removed meanwhile is a 404."""
    selector = {"label": [f"sandboxd.instance={instance}", "sandboxd.managed=true"]}
    return [c["Id"] for c in docker_client.api.containers(all=True, filters=selector)]


def stop(thread: DaemonThread) -> None:
    """Stop a pool's daemon, then remove its members: they stay for the next run of the daemon,
    and must be all that stays (the suite's finalizer checks nothing else is left)."""
    thread.stop()
    remove_members(thread.settings.instance)


def remove_members(instance: str) -> None:
    import docker

    client = docker.from_env()
    try:
        for container in containers(client, instance):
            assert "sandboxd.pool" in container.labels, f"not a member: {container.labels}"
            container.remove(force=True, v=True)
        for volume in client.volumes.list(filters={"label": f"sandboxd.instance={instance}"}):
            volume.remove(force=True)
    finally:
        client.close()


@pytest.fixture
async def pooled(tmp_path: Path, default_image: str) -> AsyncIterator[tuple[SandboxClient, DaemonThread]]:
    """A daemon keeping 2 members of the default class, with its client."""
    thread = DaemonThread(make_settings(tmp_path, pool_size=2)).start()
    try:
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            await until_ready(client, 2)
            yield client, thread
    finally:
        stop(thread)


async def test_a_claimed_member_is_a_fresh_workspace(pooled, docker_client) -> None:
    """Its own id, its env, labels and spec, an empty /workspace, the same host name; the pool refills."""
    client, thread = pooled
    began = time.monotonic()
    ws = await client.create_workspace(env={"GREETING": "hi"}, labels={"test": "pool"})
    took = time.monotonic() - began
    container = docker_client.containers.get(ws.info.container_id)
    assert container.labels["sandboxd.pool"] == "default"  # it was a member
    assert ws.workspace_id.startswith("ws-") and ws.info.state == "running"
    assert (ws.info.labels, ws.info.env, ws.info.working_dir) == ({"test": "pool"}, {"GREETING": "hi"}, "/workspace")
    got = await client.get_workspace(ws.workspace_id)
    assert (got.info.labels, got.info.container_id) == ({"test": "pool"}, ws.info.container_id)
    assert [w.workspace_id for w in await client.list_workspaces()] == [ws.workspace_id]  # no member listed
    result = await ws.exec("echo $GREETING; hostname; ls -A /workspace; id -un; pwd").wait()
    assert result.stdout == "hi\nsandbox\nsandbox\n/workspace\n"
    (default,) = await client.get_pool()
    assert (default.claims, default.misses, default.size) == (1, 0, 2)
    refill = time.monotonic()
    await until_ready(client, 2)
    print(f"claim {took * 1000:.1f} ms, refill {time.monotonic() - refill:.2f} s")
    await ws.delete()
    with pytest.raises(NotFoundError):
        await client.get_workspace(ws.workspace_id)
    selector = {"label": f"sandboxd.instance={thread.settings.instance}"}
    names = {v.name for v in docker_client.volumes.list(filters=selector)}
    assert not [n for n in names if ws.workspace_id in n]  # its claim record went with it
    assert len(containers(docker_client, thread.settings.instance)) == 2  # the members, nothing else


async def test_what_a_claim_applies(pooled, docker_client) -> None:
    """A missing working directory is made, the workspace user's; the idle TTL is the claimer's; an id is kept."""
    client, _thread = pooled
    ws = await client.create_workspace(workspace_id="ws-claimed-here", working_dir="/srv/app", idle_ttl_s=2.0)
    assert ws.workspace_id == "ws-claimed-here"
    assert "sandboxd.pool" in docker_client.containers.get(ws.info.container_id).labels
    assert (await ws.exec("pwd; stat -c '%U %a' /srv/app /srv").wait()).stdout == "/srv/app\nsandbox 755\nroot 755\n"
    with pytest.raises(AlreadyExistsError):
        await client.create_workspace(workspace_id="ws-claimed-here")
    (default,) = await client.get_pool()
    assert default.claims == 1  # the refused create took no member
    deadline = time.monotonic() + 20
    while docker_client.api.containers(all=True, filters={"id": ws.info.container_id}):  # summaries: no inspect to race
        assert time.monotonic() < deadline, "the claimer's idle TTL did not remove it"
        await asyncio.sleep(0.2)


async def test_a_spec_of_no_class_and_an_empty_pool_are_normal_creates(tmp_path: Path, docker_client) -> None:
    """Other limits start a container; so does a create that finds the class empty (a miss)."""
    thread = DaemonThread(make_settings(tmp_path, pool_size=1)).start()
    try:
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            await until_ready(client, 1)
            other = await client.create_workspace(memory_bytes=512 * 1024**2)
            assert "sandboxd.pool" not in docker_client.containers.get(other.info.container_id).labels
            first = await client.create_workspace()
            second = await client.create_workspace()  # the refill has had no time: a normal create
            labels = [docker_client.containers.get(w.info.container_id).labels for w in (first, second)]
            assert ["sandboxd.pool" in each for each in labels] == [True, False]
            (default,) = await client.get_pool()
            assert (default.claims, default.misses) == (1, 1)
            for ws in (other, first, second):
                assert (await ws.exec("echo ok").wait()).stdout == "ok\n"
                await ws.delete()
    finally:
        stop(thread)


async def test_a_member_removed_behind_the_daemons_back_is_never_handed_out(pooled, docker_client) -> None:
    """`docker rm -f` of a ready member: the next create gets the other member (or a fresh container)."""
    client, thread = pooled
    (victim, *_rest) = [c for c in containers(docker_client, thread.settings.instance) if "sandboxd.pool" in c.labels]
    victim.remove(force=True, v=True)
    for _ in range(2):
        ws = await client.create_workspace()
        assert ws.info.container_id != victim.id
        assert (await ws.exec("echo alive").wait()).stdout == "alive\n"
        await ws.delete()


async def test_members_count_toward_no_quota_and_cannot_be_named(tmp_path: Path) -> None:
    """With a quota of one workspace and two members, the first create is fine and the second refused."""
    thread = DaemonThread(make_settings(tmp_path, pool_size=2, tenant_max_workspaces=1)).start()
    try:
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            await until_ready(client, 2)
            ws = await client.create_workspace()
            with pytest.raises(ResourceExhaustedError):
                await client.create_workspace()
            with pytest.raises(InvalidArgumentError):
                await client.get_workspace("pool.0123456789ab")
            await ws.delete()
    finally:
        stop(thread)


async def test_a_runsc_class_from_the_pool_file(tmp_path: Path, runsc_available: bool, docker_client) -> None:
    """A class of the pool file (gVisor, 256 MiB) serves the creates that ask for exactly that."""
    if not runsc_available:
        pytest.skip("the engine has no runsc runtime")
    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text("- name: gvisor-small\n  size: 1\n  runtime: runsc\n  memory_bytes: 268435456\n")
    thread = DaemonThread(make_settings(tmp_path, pool_file=str(pool_file))).start()
    try:
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            await until_ready(client, 1, "gvisor-small", timeout=120)
            ws = await client.create_workspace(runtime="runsc", memory_bytes=256 * 1024**2)
            assert docker_client.containers.get(ws.info.container_id).labels["sandboxd.pool"] == "gvisor-small"
            assert (await ws.exec("dmesg | head -1").wait()).stdout.startswith("[    0.000000] Starting gVisor")
            await ws.delete()
    finally:
        stop(thread)


async def test_the_pool_follows_demand_within_its_budget(tmp_path: Path, docker_client) -> None:
    """A spec no class serves, asked for twice, gets a demand class of two members (its budget
    holds two of its 256 MiB limits, not three); the next create of it is claimed from there;
    another spec asked for twice then finds the budget spent; a demand class nobody asks for
    goes with its members, and so do the rest when the daemon stops."""
    mib = 1024**2
    settings = make_settings(
        tmp_path, pool_size=0, pool_demand_memory_bytes=(2 * 256 + 100) * mib, pool_demand_idle_s=15.0
    )
    thread = DaemonThread(settings).start()
    instance = settings.instance
    made = []
    try:
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            assert await client.get_pool() == []
            for _ in range(2):  # asked for twice: each a normal create
                made.append(await client.create_workspace(memory_bytes=256 * mib))
            (demand,) = await client.get_pool()
            assert (demand.name, demand.size) == ("demand-1", 2)
            await until_ready(client, 2, "demand-1", timeout=120)
            claimed = await client.create_workspace(memory_bytes=256 * mib, env={"WHO": "claimer"})
            made.append(claimed)
            assert docker_client.containers.get(claimed.info.container_id).labels["sandboxd.pool"] == "demand-1"
            assert (await claimed.exec("echo $WHO; id -un").wait()).stdout == "claimer\nsandbox\n"
            for _ in range(2):  # another spec, asked for twice: over the budget, no class
                made.append(await client.create_workspace(memory_bytes=300 * mib))
            assert [c.name for c in await client.get_pool()] == ["demand-1"]
            for ws in made:
                await ws.delete()
            # Nobody asks for it again: after its idle time (and a check), it goes with its members.
            deadline = time.monotonic() + 60
            while await client.get_pool():
                assert time.monotonic() < deadline, "the idle demand class stayed"
                await asyncio.sleep(0.5)
            deadline = time.monotonic() + 30
            while container_ids(docker_client, instance):
                assert time.monotonic() < deadline, "its members stayed"
                await asyncio.sleep(0.2)
            # Asked for again: made again; stopping the daemon removes its members.
            for _ in range(2):
                await (await client.create_workspace(memory_bytes=256 * mib)).delete()
            assert [c.name for c in await client.get_pool()] == ["demand-2"]
            await until_ready(client, 2, "demand-2", timeout=120)
    finally:
        thread.stop()
    assert container_ids(docker_client, instance) == []


def test_a_bad_pool_file_stops_the_start_in_one_line(tmp_path: Path) -> None:
    """An unknown field, a bad size or two classes of one spec: the daemon says which, and does not start."""
    from sandboxd.errors import InvalidSpecError

    for text, said in (
        ("- name: a\n  size: 1\n  colour: red\n", "unknown fields ['colour']"),
        ("- name: a\n  size: -1\n", "size must be an integer"),
        ("- name: a\n  size: 1\n- name: b\n  size: 1\n", "has the spec of 'a'"),
        ("- name: a\n  size: 1\n  memory_bytes: 12\n", "pool class 'a': limits.memory_bytes"),
        ("- name: a\n  size: 1\n  network: allowlist\n", "network 'allowlist' cannot be pooled"),
    ):
        pool_file = tmp_path / "pool.yaml"
        pool_file.write_text(text)
        thread = DaemonThread(make_settings(tmp_path, pool_file=str(pool_file)))
        with pytest.raises(InvalidSpecError, match=said.replace("[", r"\[").replace("]", r"\]")):
            thread.start()
        thread.loop.call_soon_threadsafe(thread.loop.stop)
        thread.thread.join(10)
        thread.loop.close()


async def test_a_claimed_workspace_outlives_kill_9_and_no_member_leaks(tmp_path: Path, docker_client) -> None:
    """kill -9 with a pool of 2 and one claimed: the claimed one answers with its id and files, the
    members are taken back, and the engine holds exactly those three containers. Its create's
    request, repeated, gets it back (the claim record keeps the request id)."""
    instance = new_instance()
    request_id = str(uuid.uuid4())
    with spawned_daemon(tmp_path, instance, SANDBOXD_POOL_SIZE="2") as (process, socket_path, _log):
        async with SandboxClient(socket_path=socket_path, retries=False) as client:
            await until_ready(client, 2)
            ws = await client.create_workspace(labels={"test": "pool-restart"}, request_id=request_id)
            await ws.write_file("/workspace/kept.txt", "kept\n")
            await until_ready(client, 2)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    with spawned_daemon(tmp_path, instance, SANDBOXD_POOL_SIZE="2") as (_process, socket_path, _log):
        async with SandboxClient(socket_path=socket_path, retries=False) as client:
            again = await client.get_workspace(ws.workspace_id)
            assert (again.info.labels, again.info.container_id) == ({"test": "pool-restart"}, ws.info.container_id)
            assert (await again.exec("cat /workspace/kept.txt").wait()).stdout == "kept\n"
            assert [w.workspace_id for w in await client.list_workspaces()] == [ws.workspace_id]
            await until_ready(client, 2)
            repeated = await client.create_workspace(
                labels={"test": "pool-restart"}, workspace_id=ws.workspace_id, request_id=request_id
            )
            assert repeated.info.container_id == ws.info.container_id
            (default,) = await client.get_pool()
            assert (default.starting, default.claims) == (0, 0)  # the repeat claimed no member
            assert len(containers(docker_client, instance)) == 3  # pool size + claimed: no member leaked
            await again.delete()
    remove_members(instance)


async def test_a_claimed_member_whose_claim_record_is_lost_is_never_handed_out(tmp_path: Path, docker_client) -> None:
    """Tenant A's claimed workspace, its record removed (a `docker volume prune`) while the daemon is
    down: at the next start it is removed, not taken back into the pool with A's files for B."""
    settings = make_settings(tmp_path, pool_size=2)
    thread = DaemonThread(settings).start()
    try:
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            await until_ready(client, 2)
            ws = await client.create_workspace(workspace_id="ws-victim")
            await ws.write_file("/workspace/id_rsa", "A-PRIVATE-KEY\n")  # a file call leaves no session
            await until_ready(client, 2)
    finally:
        thread.stop()
    docker_client.volumes.get(f"sandboxd-{settings.instance}-ws-victim.claim").remove(force=True)
    thread = DaemonThread(settings).start()
    try:
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            await until_ready(client, 2)
            assert not docker_client.api.containers(all=True, filters={"id": ws.info.container_id})
            for _ in range(3):
                other = await client.create_workspace()
                assert other.info.container_id != ws.info.container_id
                assert (await other.exec("ls -A /workspace").wait()).stdout == ""
                await other.delete()
            assert await client.list_workspaces() == []
    finally:
        stop(thread)


async def test_creates_the_caller_gives_up_on_leave_nothing(pooled, docker_client) -> None:
    """Creates cancelled at every moment (a claim, a working directory made, a normal create): once
    the pool is full again the engine holds its members and nothing else, and no workspace is listed."""
    client, thread = pooled
    for timeout in (0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16):
        for spec in ({}, {"working_dir": "/srv/x"}, {"memory_bytes": 512 * 1024**2}):
            with contextlib.suppress(TimeoutError):
                made = await asyncio.wait_for(client.create_workspace(**spec), timeout)
                await made.delete()  # finished in time: not what this test is about
    deadline = time.monotonic() + 60
    while True:
        (default,) = await client.get_pool()
        # Summaries: a listing that inspects each would trip over one being removed meanwhile.
        present = docker_client.api.containers(
            all=True, filters={"label": [f"sandboxd.instance={thread.settings.instance}", "sandboxd.managed=true"]}
        )
        if default.ready == 2 and default.starting == 0 and len(present) == 2:
            break
        assert time.monotonic() < deadline, (default, [c["Names"] for c in present])
        await asyncio.sleep(0.2)
    assert await client.list_workspaces() == []


async def test_an_image_labelled_as_a_member_makes_a_workspace_like_any_other(
    tmp_path: Path, docker_client, default_image: str
) -> None:
    """An image that carries `sandboxd.pool=default` (an image can label its containers) makes a
    workspace that is no member: listed, kept across a restart, never taken into the pool."""
    image, _logs = docker_client.images.build(
        fileobj=io.BytesIO(f"FROM {default_image}\nLABEL sandboxd.pool=default\n".encode()),
        tag="sandboxd-test/labelled:1",
        rm=True,
    )
    settings = make_settings(tmp_path, pool_size=1)
    try:
        thread = DaemonThread(settings).start()
        try:
            async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
                ws = await client.create_workspace(image="sandboxd-test/labelled:1", workspace_id="ws-labelled")
                await ws.write_file("/workspace/mine.txt", "mine\n")
                assert docker_client.containers.get(ws.info.container_id).labels["sandboxd.pool"] == ""
        finally:
            thread.stop()
        thread = DaemonThread(settings).start()
        try:
            async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
                again = await client.get_workspace("ws-labelled")
                assert (await again.exec("cat /workspace/mine.txt").wait()).stdout == "mine\n"
                await again.delete()
        finally:
            stop(thread)
    finally:
        docker_client.images.remove(image.id, force=True)


async def test_a_claimed_container_removed_behind_the_daemons_back_frees_its_id(pooled, docker_client) -> None:
    """`docker rm -f` of a claimed workspace's container: its id can be created again (from the pool),
    the stale claim record goes, and deleting the new one removes it."""
    client, thread = pooled
    first = await client.create_workspace(workspace_id="ws-again")
    docker_client.api.remove_container(first.info.container_id, force=True, v=True)
    with pytest.raises(NotFoundError):
        await client.get_workspace("ws-again")
    await until_ready(client, 2)
    second = await client.create_workspace(workspace_id="ws-again")
    assert second.info.container_id != first.info.container_id
    assert (await client.get_workspace("ws-again")).info.container_id == second.info.container_id
    assert (await second.exec("echo back").wait()).stdout == "back\n"
    await second.delete()
    assert not docker_client.api.containers(all=True, filters={"id": second.info.container_id})
    with pytest.raises(NotFoundError):
        await client.get_workspace("ws-again")
    await until_ready(client, 2)
    present = docker_client.api.containers(
        all=True, filters={"label": [f"sandboxd.instance={thread.settings.instance}", "sandboxd.managed=true"]}
    )
    assert len(present) == 2  # the members, nothing else
    volumes = docker_client.volumes.list(filters={"label": f"sandboxd.instance={thread.settings.instance}"})
    assert not [v.name for v in volumes if "ws-again" in v.name]


async def test_a_daemon_told_to_remove_its_pool_at_stop_leaves_no_container(tmp_path: Path, docker_client) -> None:
    """SANDBOXD_POOL_ON_STOP=remove: after SIGTERM the engine holds none of the daemon's containers
    or volumes, where the default keeps the ready members for the next start."""
    instance = new_instance()
    with spawned_daemon(tmp_path, instance, SANDBOXD_POOL_SIZE="2", SANDBOXD_POOL_ON_STOP="remove") as (
        process,
        socket_path,
        _log,
    ):
        async with SandboxClient(socket_path=socket_path, retries=False) as client:
            await until_ready(client, 2)
            ws = await client.create_workspace()
            await until_ready(client, 2)
            await ws.delete()
        assert len(container_ids(docker_client, instance)) == 2
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    try:
        assert container_ids(docker_client, instance) == []
        assert docker_client.volumes.list(filters={"label": f"sandboxd.instance={instance}"}) == []
    finally:
        remove_members(instance)
