"""What the domain relies on from a backend, written against the ``Backend`` Protocol alone.

Every test here takes a ``Backend`` and the ``ContainerSpec`` the domain would send
(:func:`sandboxd.workspaces.container_spec`), and checks only what the Protocol promises:
containers made, found, listed by label and removed; the agent's channel, straight or
through an exec, and the same agent found again by a backend that starts afresh (a daemon
restart); limits that hold; network modes; pause and resume; a snapshot a new container
starts from; claims; leftovers reaped; an unreachable engine said as UNAVAILABLE.

It runs for the Docker backend under runc and runsc. A second backend (docs/kubernetes.md
maps each test to the mechanism that will satisfy it) joins by adding itself to ``BACKENDS``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import pytest

from sandboxd.agent import AgentLink
from sandboxd.agentbuild import AgentBuild, ensure_agent
from sandboxd.backend.base import Backend, ContainerInfo, ContainerSpec, ImageInfo
from sandboxd.backend.docker import DockerBackend
from sandboxd.errors import (
    DockerUnavailableError,
    FailedPreconditionError,
    SandboxdError,
    WorkspaceExistsError,
    WorkspaceNotFoundError,
)
from sandboxd.models import NetworkPolicy, ResourceLimits, Runtime, WorkspaceSpec
from sandboxd.settings import Settings
from sandboxd.workspaces import (
    AGENT_SOCKET_DIR,
    AGENT_SOCKET_NAME,
    FALLBACK_USER,
    LABEL_AGENT,
    LABEL_SPEC,
    LABEL_TENANT,
    WorkspaceManager,
    container_spec,
)
from tests.conftest import new_instance

from .helpers import skip_without

pytestmark = pytest.mark.docker

RUNTIMES = ["runc", pytest.param("runsc", marks=pytest.mark.runsc)]
LABELS = {"conformance": "yes"}
USER = FALLBACK_USER


def _docker(instance: str, *, reachable: bool = True) -> Backend:
    host = Settings.from_env(dict(os.environ)).docker_host if reachable else "unix:///nonexistent/docker.sock"
    return DockerBackend(docker_host=host, instance=instance, retries=False)


BACKENDS: dict[str, Callable[..., Backend]] = {"docker": _docker}
"""Each backend under test, made for an instance label (one per test: nothing is shared), and
with ``reachable=False`` pointed at an engine that is not there."""


@pytest.fixture(params=sorted(BACKENDS))
async def make_backend(request: pytest.FixtureRequest, default_image: str) -> AsyncIterator[Callable[[], Backend]]:
    """Makes backends of one instance: a second one made is the same engine seen by a restarted daemon."""
    instance = new_instance()
    made: list[Backend] = []

    def make() -> Backend:
        backend = BACKENDS[request.param](instance)
        made.append(backend)
        return backend

    yield make
    cleaner = made[0] if made else make()
    for info in await cleaner.list_containers({}):
        await cleaner.remove_container(info.workspace_id)
    await cleaner.remove_orphans()
    for backend in made:
        await backend.close()


@pytest.fixture
async def backend(make_backend: Callable[[], Backend]) -> Backend:
    return make_backend()


@pytest.fixture
async def agent(backend: Backend) -> AgentBuild:
    return await ensure_agent(backend, route="auto", progress=lambda line: None)


def _spec(
    backend_image: str,
    agent: AgentBuild,
    runtime: str,
    *,
    limits: ResourceLimits | None = None,
    pool_class: str = "",
    network: str = "none",
    image_labels: dict[str, str] | None = None,
) -> ContainerSpec:
    """The ContainerSpec the domain sends for a default workspace of ``runtime`` (resolved as it resolves)."""
    manager = WorkspaceManager(backend=None, settings=Settings.from_env({}), processes=None)  # type: ignore[arg-type]
    resolved = manager.resolve(
        WorkspaceSpec(image=backend_image, labels=LABELS, runtime=Runtime(runtime), limits=limits or ResourceLimits())
    )
    image = ImageInfo(image_id="", user="", os="linux", labels=image_labels or {})
    return container_spec(
        resolved,
        f"ws-{secrets.token_hex(6)}",
        tenant="conformance",
        network=network,
        image=image,
        agent=agent,
        pool_class=pool_class,
    )


async def _made(backend: Backend, spec: ContainerSpec) -> ContainerInfo:
    """Create and commit, as the domain does once the agent answered."""
    await backend.create_container(spec)
    await backend.commit_container(spec.workspace_id)
    return await backend.inspect_container(spec.workspace_id)


async def _run(backend: Backend, info: ContainerInfo, script: str, user: str = USER) -> tuple[int, str]:
    code, output = await backend.exec_run(
        info.workspace_id, ["sh", "-c", script], user=user, container_id=info.container_id
    )
    return code, output.decode("utf-8", "replace")


def _link(backend: Backend, info: ContainerInfo, *, straight: bool) -> AgentLink:
    socket_dir = info.mounts.get(AGENT_SOCKET_DIR, "") if straight else ""
    return AgentLink(
        backend,
        info.workspace_id,
        info.container_id,
        socket_path=f"{socket_dir}/{AGENT_SOCKET_NAME}" if socket_dir else "",
        runtime=info.runtime,
        host_sockets={info.runtime} if straight else set(),
    )


async def _answers(backend: Backend, info: ContainerInfo) -> bool:
    """Whether the container runs commands (again: the engine restarts one whose sandbox ended)."""
    try:
        return (await _run(backend, info, "true"))[0] == 0
    except SandboxdError:
        return False


async def _until(check: Callable[[], Awaitable[bool]], what: str, within_s: float = 30) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not await check():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_create_inspect_list_remove(
    backend: Backend, agent: AgentBuild, default_image: str, runtime: str, request: pytest.FixtureRequest
) -> None:
    """A made container runs with its labels; it is found by id and by label, once; removed, it is gone."""
    skip_without(runtime, request)
    spec = _spec(default_image, agent, runtime)
    info = await _made(backend, spec)
    assert (info.workspace_id, info.running, info.paused, info.os) == (spec.workspace_id, True, False, "linux")
    assert info.runtime == runtime
    assert {key: info.labels[key] for key in (*LABELS, LABEL_TENANT)} == {**LABELS, LABEL_TENANT: "conformance"}
    with pytest.raises(WorkspaceExistsError):
        await backend.create_container(spec)
    assert [i.workspace_id for i in await backend.list_containers(LABELS)] == [spec.workspace_id]
    assert await backend.list_containers({**LABELS, "conformance": "no"}) == []
    assert (await backend.container_labels())[spec.workspace_id][LABEL_TENANT] == "conformance"
    assert await backend.container_states() == [("running", runtime)]
    assert (await _run(backend, info, "id -u")) == (0, "1000\n")
    assert await backend.remove_container(spec.workspace_id) is True
    with pytest.raises(WorkspaceNotFoundError):
        await backend.inspect_container(spec.workspace_id)
    assert await backend.remove_container(spec.workspace_id) is False
    assert await backend.volume_labels(spec.workspace_id) is None


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_the_agent_channel_and_the_same_agent_after_a_restart(
    make_backend: Callable[[], Backend], default_image: str, runtime: str, request: pytest.FixtureRequest
) -> None:
    """The agent answers through the backend's exec (the bridge) and, where the host sees it, its socket.

    A backend made afresh (a restarted daemon) finds the container by its id and reaches the
    very same agent process.
    """
    skip_without(runtime, request)
    first = make_backend()
    agent = await ensure_agent(first, route="auto", progress=lambda line: None)
    info = await _made(first, _spec(default_image, agent, runtime))
    bridged = _link(first, info, straight=False)
    welcome = await bridged.connect()
    assert (bridged.transport, welcome.agent) == ("bridge", agent.tag)
    await bridged.close()
    again = make_backend()
    found = await again.inspect_container(info.workspace_id)
    assert (found.container_id, found.running) == (info.container_id, True)
    # Straight to its socket where the backend's host sees it (Docker's here), else the exec again.
    straight = _link(again, found, straight=True)
    assert (await straight.connect()).pid == welcome.pid  # the same agent, not a new one
    assert straight.transport in {"socket", "bridge"}
    await straight.close()


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_limits_hold(
    backend: Backend, agent: AgentBuild, default_image: str, runtime: str, request: pytest.FixtureRequest
) -> None:
    """Memory, processes and the /workspace cap each stop a command that goes past them."""
    skip_without(runtime, request)
    limits = ResourceLimits(memory_bytes=96 * 2**20, cpu_millis=500, pids=64, disk_bytes=8 * 2**20)
    info = await _made(backend, _spec(default_image, agent, runtime, limits=limits))
    code, output = await _run(backend, info, "head -c 16777216 /dev/zero 2>&1 >/workspace/big; echo $?")
    assert "No space left" in output and output.split()[-1] != "0", output
    code, output = await _run(backend, info, "wc -c < /workspace/big")
    assert int(output) <= limits.disk_bytes
    # tail holds a whole line, and this one has no end: 256 MiB of it cannot fit in 96.
    code, _ = await _run(backend, info, "head -c 268435456 /dev/zero | tail -n 1 >/dev/null")
    assert code != 0
    await _until(lambda: _answers(backend, info), "the container did not come back after the memory limit")
    code, output = await _run(backend, info, "for i in $(seq 100); do sleep 2 & done; wait")
    if runtime == "runsc" and "Cannot fork" not in output:
        # gVisor may end the whole sandbox when every pid is taken (README, gVisor): the exec fails.
        assert code != 0, output
    else:
        assert "Cannot fork" in output, output


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_network_modes(
    backend: Backend, agent: AgentBuild, default_image: str, runtime: str, request: pytest.FixtureRequest
) -> None:
    """``none`` has loopback alone; runc also moves to ``bridge``, to its own network and back."""
    skip_without(runtime, request)
    info = await _made(backend, _spec(default_image, agent, runtime))
    interfaces = "sed -n '3,$p' /proc/net/dev | cut -d: -f1 | tr -d ' '"
    assert (await _run(backend, info, interfaces))[1].split() == ["lo"]
    if runtime == "runsc":
        return  # the engine's gVisor runs with --network=none here (README, gVisor): no other mode exists
    await backend.set_network(info.workspace_id, str(NetworkPolicy.BRIDGE))
    assert sorted((await _run(backend, info, interfaces))[1].split()) == ["eth0", "lo"]
    own = await backend.create_network(info.workspace_id)
    await backend.set_network(info.workspace_id, own)
    subnet = await backend.network_subnet(info.workspace_id)
    assert subnet.count(".") == 3 and "/" in subnet
    assert own in (await backend.inspect_container(info.workspace_id)).networks
    await backend.set_network(info.workspace_id, "none")
    await backend.remove_network(info.workspace_id)
    assert (await _run(backend, info, interfaces))[1].split() == ["lo"]


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_pause_and_resume(
    backend: Backend, agent: AgentBuild, default_image: str, runtime: str, request: pytest.FixtureRequest
) -> None:
    """Paused it is neither running nor resumable twice; resumed it runs commands again."""
    skip_without(runtime, request)
    info = await _made(backend, _spec(default_image, agent, runtime))
    await backend.pause_container(info.workspace_id)
    paused = await backend.inspect_container(info.workspace_id)
    assert (paused.running, paused.paused) == (False, True)
    with pytest.raises(FailedPreconditionError):
        await backend.pause_container(info.workspace_id)
    await backend.resume_container(info.workspace_id)
    assert (await backend.inspect_container(info.workspace_id)).running
    with pytest.raises(FailedPreconditionError):
        await backend.resume_container(info.workspace_id)
    assert await _run(backend, info, "echo back") == (0, "back\n")


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_snapshot_is_what_a_new_container_starts_from(
    backend: Backend, agent: AgentBuild, default_image: str, runtime: str, request: pytest.FixtureRequest
) -> None:
    """Its root filesystem's changes and its /workspace, in an image listed by its labels."""
    skip_without(runtime, request)
    info = await _made(backend, _spec(default_image, agent, runtime))
    assert await _run(backend, info, "echo root > /etc/conformance", user="0:0") == (0, "")
    assert await _run(backend, info, "echo files > /workspace/kept") == (0, "")
    ref = f"sandboxd/snapshot:conformance-{secrets.token_hex(4)}"
    labels = {"sandboxd.conformance": info.workspace_id}
    image = await backend.snapshot_container(info.workspace_id, ref, labels, max_workspace_bytes=2**20)
    fork = dataclasses.replace(_spec(ref, agent, runtime, image_labels=dict(image.labels)), seed_workspace=True)
    try:
        assert image.labels["sandboxd.conformance"] == info.workspace_id
        assert [i.image_id for i in await backend.list_images(labels)] == [image.image_id]
        forked = await _made(backend, fork)
        assert await _run(backend, forked, "cat /etc/conformance /workspace/kept") == (0, "root\nfiles\n")
    finally:
        await backend.remove_container(fork.workspace_id)
        await backend.remove_image(ref)
    assert await backend.list_images(labels) == []


async def test_a_claim_gives_a_member_a_workspaces_id_for_good(
    make_backend: Callable[[], Backend], default_image: str
) -> None:
    """The member answers as the workspace, with its labels, here and to a backend made afresh."""
    backend = make_backend()
    agent = await ensure_agent(backend, route="auto", progress=lambda line: None)
    member = await _made(backend, _spec(default_image, agent, "runc", pool_class="default"))
    workspace_id = f"ws-{secrets.token_hex(6)}"
    labels = {**LABELS, LABEL_TENANT: "conformance", **{k: member.labels[k] for k in (LABEL_SPEC, LABEL_AGENT)}}
    claimed = await backend.claim_container(member, workspace_id, labels)
    assert (claimed.workspace_id, claimed.container_id) == (workspace_id, member.container_id)
    with pytest.raises(WorkspaceNotFoundError):
        await backend.inspect_container(member.workspace_id)
    after = make_backend()
    found = await after.inspect_container(workspace_id)
    assert (found.container_id, found.labels[LABEL_TENANT]) == (member.container_id, "conformance")
    assert [i.workspace_id for i in await after.list_containers(LABELS)] == [workspace_id]
    assert await after.remove_container(workspace_id) is True
    assert await after.list_containers({}) == []


async def test_leftovers_are_reaped_and_the_rest_kept(make_backend: Callable[[], Backend], default_image: str) -> None:
    """A container never committed (its daemon died mid-create) goes at the next start; a made one stays."""
    backend = make_backend()
    agent = await ensure_agent(backend, route="auto", progress=lambda line: None)
    kept = await _made(backend, _spec(default_image, agent, "runc"))
    cut_short = _spec(default_image, agent, "runc")
    await backend.create_container(cut_short)  # and never committed
    restarted = make_backend()
    removed = await restarted.remove_orphans()
    assert any(cut_short.workspace_id in name for name in removed), removed
    assert [i.workspace_id for i in await restarted.list_containers({})] == [kept.workspace_id]
    assert await restarted.volume_labels(cut_short.workspace_id) is None
    assert await restarted.remove_orphans() == []


class _VolumeSweptAway(DockerBackend):
    """The real engine, and a /workspace volume removed the moment it is made (as a sweep of
    leftovers, or a demand class let go, would between the volume's create and the container's)."""

    async def _create_volume(self, spec: ContainerSpec, name: str, labels: Mapping[str, str]) -> None:
        await super()._create_volume(spec, name, labels)
        await self._call(self._api().remove_volume, name, force=True)


async def test_a_volume_gone_before_its_container_comes_back_labelled_and_capped(default_image: str) -> None:
    """The engine makes a missing named volume a container mounts: it comes from the mount's
    options, labelled (so it is swept with its container, never left behind) and capped."""
    instance = new_instance()
    backend = _VolumeSweptAway(docker_host=Settings.from_env(dict(os.environ)).docker_host, instance=instance)
    spec = dataclasses.replace(
        _spec(default_image, await ensure_agent(backend, route="auto", progress=lambda line: None), "runc"),
        disk_bytes=64 << 20,
    )
    try:
        info = await _made(backend, spec)
        labels = await backend.volume_labels(spec.workspace_id) or {}
        assert (labels.get("sandboxd.instance"), labels.get("sandboxd.workspace_id")) == (instance, spec.workspace_id)
        code, out = await _run(backend, info, "df -B1 /workspace | tail -1")
        assert code == 0 and int(out.split()[1]) == 64 << 20, out
        await backend.remove_container(spec.workspace_id)
        assert await backend.volume_labels(spec.workspace_id) is None
    finally:
        await backend.remove_container(spec.workspace_id)
        await backend.close()


@pytest.mark.parametrize("name", sorted(BACKENDS))
async def test_an_unreachable_engine_is_unavailable(name: str) -> None:
    """Every call says so in one error: the domain turns it into UNAVAILABLE."""
    gone = BACKENDS[name](new_instance(), reachable=False)
    try:
        for call in (gone.ping(), gone.inspect_container("ws-1"), gone.list_containers({})):
            with pytest.raises(DockerUnavailableError):
                await call
    finally:
        await gone.close()
