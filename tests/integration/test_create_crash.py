"""A create either completes or leaves nothing its caller cannot find.

A container stays provisionally named until its create is complete (its agent answered);
a daemon killed before then leaves it to its successor, which removes it. The client holds
every id before it sends, and a create carries a ``request_id``: repeated, it gets the
workspace the first made, or a new one of that id if the first never completed, never a
second. The same for a raw caller that sends a ``request_id`` and no id.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
import uuid
from pathlib import Path

import docker
import grpc
import pytest
from sandboxd_client import AlreadyExistsError, InvalidArgumentError, SandboxClient, UnavailableError
from sandboxd_protocol.v1 import workspace_service_pb2 as wpb
from sandboxd_protocol.v1 import workspace_service_pb2_grpc as wgrpc

from tests.conftest import new_instance, spawned_daemon

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

CREATES = 20
AT_ONCE = 5
LABELS = {"test": "create-crash"}
PROVISIONAL = ".creating"


def _containers(docker_client: docker.DockerClient, instance: str) -> dict[str, str]:
    """Name -> id of the instance's workspace containers (the lease's is not one).

    From the listing alone: the engine may still be carrying out a removal the killed daemon asked for.
    """
    found = docker_client.api.containers(
        all=True, filters={"label": ["sandboxd.managed=true", f"sandboxd.instance={instance}"]}
    )
    return {summary["Names"][0].lstrip("/"): summary["Id"] for summary in found}


def _raw_create(stub: wgrpc.WorkspaceServiceStub, request_id: str, workspace_id: str = "") -> grpc.aio.UnaryUnaryCall:
    spec = wpb.WorkspaceSpec(labels=LABELS)
    return stub.CreateWorkspace(
        wpb.CreateWorkspaceRequest(spec=spec, workspace_id=workspace_id, request_id=request_id), timeout=120
    )


async def _send(client: SandboxClient, workspace_id: str, request_id: str) -> tuple[str, str]:
    """One create as its caller makes it: by the client with an id, or raw with the request id alone.

    Returns the workspace's id and its container's.
    """
    if workspace_id:
        ws = await client.create_workspace(labels=LABELS, workspace_id=workspace_id, request_id=request_id)
        return ws.workspace_id, ws.info.container_id
    reply = await _raw_create(wgrpc.WorkspaceServiceStub(client._channel), request_id)
    return reply.workspace.workspace_id, reply.workspace.container_id


async def _listed(client: SandboxClient) -> dict[str, str]:
    """Workspace id -> container id of every workspace the daemon lists."""
    return {w.workspace_id: w.container_id for w in await client.list_workspaces()}


async def test_a_kill_at_a_random_point_of_twenty_creates_loses_none_and_leaves_none_unheld(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    """Half through the client (which makes the ids), half raw with a request id alone.

    After a SIGKILL at a random moment and a restart: nothing provisional is left, every
    create that returned still exists, and repeating every request gets each caller one
    workspace, the one it already had if it had one; then the workspaces are exactly those.
    """
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    instance = new_instance()
    requests = [str(uuid.uuid4()) for _ in range(CREATES)]
    ids = [f"ws-{uuid.uuid4().hex[:12]}" if i % 2 == 0 else "" for i in range(CREATES)]  # raw ones hold none
    returned: dict[int, tuple[str, str]] = {}
    with spawned_daemon(tmp_path / "first", instance) as (daemon, socket_path, _log):
        gate = asyncio.Semaphore(AT_ONCE)
        client = SandboxClient(socket_path=socket_path, retries=False)

        async def create(i: int) -> None:
            async with gate:
                returned[i] = await _send(client, ids[i], requests[i])

        kill_after = rng.uniform(0.3, 4.0)
        killed = asyncio.Event()

        def kill() -> None:
            daemon.kill()
            killed.set()

        asyncio.get_running_loop().call_later(kill_after, kill)
        outcomes = await asyncio.gather(*(create(i) for i in range(CREATES)), return_exceptions=True)
        # The creates may all be done before the kill's moment: a blocking wait here would keep
        # the loop from ever running the kill (it did, on a fast host).
        await asyncio.wait_for(killed.wait(), 10)
        await asyncio.to_thread(daemon.wait, 30)
        await client.close()
    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, UnavailableError) and ids[i]:
            assert (outcome.workspace_id, outcome.request_id) == (ids[i], requests[i])
        elif isinstance(outcome, BaseException) and not isinstance(outcome, (UnavailableError, grpc.aio.AioRpcError)):
            raise outcome
    names = _containers(docker_client, instance)
    print(f"seed {seed}: killed after {kill_after:.2f} s, {len(returned)} returned, {len(names)} containers left")

    with spawned_daemon(tmp_path / "second", instance) as (_successor, socket_path, _log):
        async with SandboxClient(socket_path=socket_path, retries=False) as client:
            left = _containers(docker_client, instance)
            assert not [name for name in left if name.endswith(PROVISIONAL)], left
            survived = await _listed(client)
            for workspace_id, container_id in returned.values():
                assert survived.get(workspace_id) == container_id, f"create of {workspace_id} returned, then was lost"
            again = {i: await _send(client, ids[i], requests[i]) for i in range(CREATES)}
            for i, first in returned.items():
                assert again[i] == first, "a repeated request made a second workspace"
            held = {workspace_id for workspace_id, _ in again.values()}
            assert len(held) == CREATES
            assert set(survived) <= held, "a workspace survived that no caller got back"
            now = await _listed(client)
            assert set(now) == held
            for workspace_id in held:
                assert (await (await client.get_workspace(workspace_id)).exec("echo up").wait()).stdout == "up\n"
            for workspace_id in held:
                await client.delete_workspace(workspace_id)
            assert _containers(docker_client, instance) == {}


async def test_a_create_killed_before_it_completed_is_removed_and_made_again(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    """SIGKILL while a create's container runs but its agent has not answered: the successor removes it.

    The repeated request then makes a new container under the same id.
    """
    instance = new_instance()
    with spawned_daemon(tmp_path / "first", instance) as (daemon, socket_path, _log):
        seen: list[str] = []

        def kill_when_provisional() -> None:
            # Watched from a thread: the window between the start and the agent's answer is short.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                running = docker_client.api.containers(
                    filters={"label": f"sandboxd.instance={instance}", "status": "running"}
                )
                provisional = [name for c in running if (name := c["Names"][0].lstrip("/")).endswith(PROVISIONAL)]
                if provisional:
                    daemon.kill()
                    seen.extend(provisional)
                    return
                time.sleep(0.005)

        watcher = threading.Thread(target=kill_when_provisional)
        watcher.start()
        async with SandboxClient(socket_path=socket_path, retries=False) as client:
            attempts: list[tuple[str, str]] = []
            unanswered: UnavailableError | None = None
            while daemon.poll() is None and len(attempts) < 40:
                request_id, workspace_id = str(uuid.uuid4()), f"ws-{uuid.uuid4().hex[:12]}"
                attempts.append((workspace_id, request_id))
                try:
                    await client.create_workspace(labels=LABELS, workspace_id=workspace_id, request_id=request_id)
                except UnavailableError as error:
                    unanswered = error
                    break
        watcher.join()
        daemon.wait(timeout=30)
    assert seen, "no create was caught between its start and its agent's answer"
    (name,) = seen
    workspace_id, request_id = attempts[-1]
    assert unanswered is not None
    assert (unanswered.workspace_id, unanswered.request_id) == (workspace_id, request_id)
    assert name.endswith(f"-{workspace_id}{PROVISIONAL}")
    caught = _containers(docker_client, instance)[name]

    with spawned_daemon(tmp_path / "second", instance) as (_successor, socket_path, log_path):
        async with SandboxClient(socket_path=socket_path, retries=False) as client:
            assert name not in _containers(docker_client, instance)
            assert name in log_path.read_text()  # daemon.orphans_removed names it
            assert workspace_id not in await _listed(client)
            ws = await client.create_workspace(labels=LABELS, workspace_id=workspace_id, request_id=request_id)
            assert ws.info.container_id != caught
            assert (await ws.exec("echo made").wait()).stdout == "made\n"
            for made, _request in attempts:
                await client.delete_workspace(made)  # the ones before it completed: no NOT_FOUND
            assert _containers(docker_client, instance) == {}


class TestRepeatedCreate:
    """The daemon's side of a repeated request, against the shared daemon."""

    async def test_a_repeated_request_gets_the_same_workspace_and_another_request_does_not(self, client) -> None:
        request_id = str(uuid.uuid4())
        first = await client.create_workspace(labels=LABELS, request_id=request_id)
        try:
            again = await client.create_workspace(labels=LABELS, workspace_id=first.workspace_id, request_id=request_id)
            assert (again.workspace_id, again.info.container_id) == (first.workspace_id, first.info.container_id)
            with pytest.raises(AlreadyExistsError, match=f"workspace '{first.workspace_id}' already exists"):
                await client.create_workspace(labels=LABELS, workspace_id=first.workspace_id)
            listed = [w.workspace_id for w in await client.list_workspaces(LABELS)]
            assert listed.count(first.workspace_id) == 1
        finally:
            await first.delete()

    async def test_a_request_id_alone_finds_its_workspace_even_when_sent_twice_at_once(self, client) -> None:
        stub = wgrpc.WorkspaceServiceStub(client._channel)
        request_id = str(uuid.uuid4())
        one, two = await asyncio.gather(_raw_create(stub, request_id), _raw_create(stub, request_id))
        workspace_id = one.workspace.workspace_id
        try:
            assert two.workspace.workspace_id == workspace_id
            assert two.workspace.container_id == one.workspace.container_id
            later = await _raw_create(stub, request_id)
            assert later.workspace.container_id == one.workspace.container_id
            other = await _raw_create(stub, str(uuid.uuid4()))
            assert other.workspace.workspace_id != workspace_id
            await client.delete_workspace(other.workspace.workspace_id)
        finally:
            await client.delete_workspace(workspace_id)

    async def test_a_create_whose_caller_went_away_is_kept_for_its_repeat_and_removed_without_one(self, client) -> None:
        """The daemon sees the call cancelled (its deadline passed): the create runs to its end.

        Repeated, the request gets that workspace, which stays; not repeated, it is removed.
        """
        stub = wgrpc.WorkspaceServiceStub(client._channel)
        kept_request, gone_request = str(uuid.uuid4()), str(uuid.uuid4())
        kept_id, gone_id = f"ws-{uuid.uuid4().hex[:12]}", f"ws-{uuid.uuid4().hex[:12]}"
        for workspace_id, request_id in ((kept_id, kept_request), (gone_id, gone_request)):
            request = wpb.CreateWorkspaceRequest(
                spec=wpb.WorkspaceSpec(labels=LABELS), workspace_id=workspace_id, request_id=request_id
            )
            with pytest.raises(grpc.aio.AioRpcError) as cut:
                await stub.CreateWorkspace(request, timeout=0.05)
            assert cut.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        try:
            again = await client.create_workspace(labels=LABELS, workspace_id=kept_id, request_id=kept_request)
            assert again.workspace_id == kept_id
            deadline = time.monotonic() + 30
            while gone_id in {w.workspace_id for w in await client.list_workspaces(LABELS)}:
                assert time.monotonic() < deadline, "the create nobody waited for was not removed"
                await asyncio.sleep(0.1)
            # The abandoned one's removal has run by now: the repeated one was spared it.
            assert (await again.exec("echo kept").wait()).stdout == "kept\n"
            assert (await client.get_workspace(kept_id)).info.container_id == again.info.container_id
        finally:
            await client.delete_workspace(kept_id)

    async def test_a_request_id_names_one_create(self, client) -> None:
        """Reused for another id (at once, or later) or another spec, it is refused in plain words."""
        request_id = str(uuid.uuid4())
        ids = [f"ws-{uuid.uuid4().hex[:12]}" for _ in range(4)]
        outcomes = await asyncio.gather(
            *(client.create_workspace(labels=LABELS, workspace_id=i, request_id=request_id) for i in ids),
            return_exceptions=True,
        )
        (made,) = [o for o in outcomes if not isinstance(o, BaseException)]
        try:
            refused = [o for o in outcomes if isinstance(o, BaseException)]
            assert [type(o) for o in refused] == [AlreadyExistsError] * 3
            assert all(f"made workspace '{made.workspace_id}'" in o.message for o in refused)
            with pytest.raises(AlreadyExistsError, match=f"made workspace '{made.workspace_id}'"):
                await client.create_workspace(labels=LABELS, workspace_id=ids[0] + "x", request_id=request_id)
            with pytest.raises(AlreadyExistsError, match="from another spec or snapshot"):
                await client.create_workspace(
                    labels={"other": "spec"}, workspace_id=made.workspace_id, request_id=request_id
                )
            assert [w.workspace_id for w in await client.list_workspaces(LABELS)].count(made.workspace_id) == 1
            assert not {w.workspace_id for w in await client.list_workspaces()} & (set(ids) - {made.workspace_id})
        finally:
            await made.delete()

    async def test_a_repeat_whose_caller_goes_away_never_removes_what_the_first_made(self, client) -> None:
        """The first create answered; repeats cut short by tight deadlines leave its workspace alone."""
        stub = wgrpc.WorkspaceServiceStub(client._channel)
        request_id = str(uuid.uuid4())
        first = await client.create_workspace(labels=LABELS, request_id=request_id)
        try:
            request = wpb.CreateWorkspaceRequest(
                spec=wpb.WorkspaceSpec(labels=LABELS), workspace_id=first.workspace_id, request_id=request_id
            )
            for deadline_ms in (1, 2, 3, 5, 7, 10, 15, 25):
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await stub.CreateWorkspace(request, timeout=deadline_ms / 1000)
            again = await client.create_workspace(labels=LABELS, workspace_id=first.workspace_id, request_id=request_id)
            assert again.info.container_id == first.info.container_id
            assert (await first.exec("echo still").wait()).stdout == "still\n"
        finally:
            await first.delete()

    @pytest.mark.parametrize("request_id", ["has space", "x" * 65, "é", "a/b"])
    async def test_a_malformed_request_id_is_refused(self, client, request_id: str) -> None:
        with pytest.raises(InvalidArgumentError, match=r"request_id .* must be 1-64 letters, digits"):
            await client.create_workspace(request_id=request_id)
