"""Edges of a workspace's life the daemon's records must get right: claims, quotas, the reaper, refusals, leaving.

Each test runs its own daemon (on a private instance label) so that it can hold one engine
call at a chosen point and look at what the daemon holds of a workspace.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sandboxd_client import (
    AlreadyExistsError,
    NotFoundError,
    Output,
    ResourceExhaustedError,
    SandboxClient,
    SandboxError,
)

from tests.conftest import DaemonThread, make_settings
from tests.integration.helpers import one_file_tar, start_ready, trickle
from tests.integration.test_forward import ECHO_SERVER
from tests.integration.test_pool import stop as stop_pool
from tests.integration.test_pool import until_ready

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]


@contextlib.asynccontextmanager
async def own_daemon(tmp_path: Path, **overrides: object) -> AsyncIterator[tuple[SandboxClient, DaemonThread]]:
    """A daemon of the test's own, with its client; its workspaces are removed by the caller."""
    thread = DaemonThread(make_settings(tmp_path, **overrides)).start()
    try:
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            yield client, thread
    finally:
        thread.stop()


class Gate:
    """Holds the first call of one of the daemon's backend methods until the test opens it (``after``: its return)."""

    def __init__(self, thread: DaemonThread, name: str, *, after: bool = False) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        backend = thread.daemon.workspaces.backend  # type: ignore[attr-defined]
        original = getattr(backend, name)

        async def held(*args: Any, **kwargs: Any) -> Any:
            first = not self.entered.is_set()
            if first and after:
                result = await original(*args, **kwargs)
            if first:
                self.entered.set()
                while not self.opened.is_set():
                    await asyncio.sleep(0.02)
            return result if first and after else await original(*args, **kwargs)

        setattr(backend, name, held)

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 60), "the held call never came"


def looked_for_idle(thread: DaemonThread) -> list[float]:
    """When (``time.monotonic()``) each of the idle reaper's looks began, from now on."""
    looks: list[float] = []
    backend = thread.daemon.workspaces.backend  # type: ignore[attr-defined]
    original = backend.container_labels

    async def listing() -> Any:
        looks.append(time.monotonic())
        return await original()

    backend.container_labels = listing
    return looks


def record(thread: DaemonThread, workspace_id: str) -> Any:
    """What the daemon holds of a workspace (None: nothing)."""
    return thread.daemon.workspaces.records.get(workspace_id)  # type: ignore[attr-defined]


async def test_a_claimed_member_reports_its_claim_time(tmp_path: Path, default_image: str) -> None:
    """create_time is when the caller's create made the workspace, not when the pool started its member."""
    thread = DaemonThread(make_settings(tmp_path, pool_size=1)).start()
    try:
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            await until_ready(client, 1)
            before = datetime.datetime.now(datetime.UTC)
            ws = await client.create_workspace()
            try:
                assert (await client.get_pool())[0].claims == 1
                assert ws.info.create_time >= before
                assert (await client.get_workspace(ws.workspace_id)).info.create_time == ws.info.create_time
                assert [w.create_time for w in await client.list_workspaces()] == [ws.info.create_time]
            finally:
                await ws.delete()
    finally:
        stop_pool(thread)


async def test_a_create_in_flight_counts_once_toward_the_quota(tmp_path: Path, default_image: str) -> None:
    """Quota 2, one create in flight: a second create is let in, a third is refused."""
    async with own_daemon(tmp_path, tenant_max_workspaces=2) as (client, thread):
        gate = Gate(thread, "commit_container")
        first = asyncio.create_task(client.create_workspace())
        made = []
        try:
            await gate.wait_entered()  # the first's container exists, not yet committed
            made.append(await client.create_workspace())
            gate.opened.set()
            made.append(await first)
            with pytest.raises(ResourceExhaustedError):
                made.append(await client.create_workspace())
        finally:
            gate.opened.set()
            with contextlib.suppress(SandboxError):
                made.append(await first)
            for ws in {w.workspace_id: w for w in made}.values():
                await ws.delete()


async def test_the_reaper_looks_again_once_a_long_snapshot_is_done(tmp_path: Path, default_image: str) -> None:
    """A snapshot longer than the idle TTL: the reaper that waited for it counts the TTL from its end."""
    settings = make_settings(tmp_path)
    thread = DaemonThread(settings).start()
    try:
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            ws = await client.create_workspace(idle_ttl_s=2)
            gate = Gate(thread, "snapshot_container", after=True)
            looks = looked_for_idle(thread)
            taking = asyncio.create_task(ws.snapshot("edge"))
            try:
                await gate.wait_entered()
                idle_from = time.monotonic() + 2  # its TTL, counted from before the snapshot's hold
                # The reaper comes for it while the snapshot holds it: it waits for the snapshot's
                # lock, or it passes it by (twice, so once wholly after the TTL).
                deadline = time.monotonic() + 30
                lock = thread.daemon.workspaces.records._locks.get(ws.workspace_id)  # type: ignore[attr-defined]
                while not lock._waiters and len([t for t in looks if t >= idle_from]) < 2:
                    assert time.monotonic() < deadline, "the reaper never came for the workspace"
                    await asyncio.sleep(0.05)
                opened = datetime.datetime.now(datetime.UTC)
                gate.opened.set()
                await taking
                deadline = time.monotonic() + 30
                while ws.workspace_id in {w.workspace_id for w in await client.list_workspaces()}:
                    assert time.monotonic() < deadline, "the workspace was never reaped"
                    await asyncio.sleep(0.1)
            finally:
                gate.opened.set()
                with contextlib.suppress(SandboxError):
                    await taking
                with contextlib.suppress(NotFoundError):
                    await ws.delete()
                with contextlib.suppress(NotFoundError):
                    await client.delete_snapshot("edge")
    finally:
        thread.stop()
    events = [json.loads(line) for line in Path(settings.audit_log).read_text().splitlines()]
    (reaped,) = [e for e in events if e.get("event") == "workspace.reaped"]
    assert (datetime.datetime.fromisoformat(reaped["time"]) - opened).total_seconds() >= 1.9


async def test_a_workspace_deleted_during_a_file_call_leaves_no_record(tmp_path: Path, default_image: str) -> None:
    """The call in flight ends after the delete; nothing of the workspace stays, nor of a failed create."""
    async with own_daemon(tmp_path) as (client, thread):
        ws = await client.create_workspace()
        archive = one_file_tar("slow.txt", b"slow\n" * 40960)
        upload = asyncio.create_task(
            client.upload(ws.workspace_id, "/workspace", trickle(archive, pieces=20, pause_s=0.5))
        )
        try:
            deadline = time.monotonic() + 30
            while (held := record(thread, ws.workspace_id)) is None or not held.busy:
                assert time.monotonic() < deadline, "the upload never began"
                await asyncio.sleep(0.02)
            await ws.delete()
        finally:
            with contextlib.suppress(SandboxError):
                await upload
        assert record(thread, ws.workspace_id) is None
        with pytest.raises(SandboxError):
            await client.create_workspace(workspace_id="ws-000000edge01", image="sandboxd-test/absent:1")
        assert record(thread, "ws-000000edge01") is None


async def test_a_workspace_deleted_during_a_forward_leaves_no_record(tmp_path: Path, default_image: str) -> None:
    """A forwarded connection open across a delete ends with it; nothing of the workspace stays in the daemon."""
    async with own_daemon(tmp_path) as (client, thread):
        ws = await client.create_workspace()
        await start_ready(ws, ECHO_SERVER)
        forward = ws.forward(8001)
        async with forward as address:
            host, port = address.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"held open")
            await writer.drain()
            deadline = time.monotonic() + 20
            while (held := record(thread, ws.workspace_id)) is None or not held.busy:
                assert time.monotonic() < deadline, "the forward never opened"
                await asyncio.sleep(0.01)
            await ws.delete()
            assert await asyncio.wait_for(reader.read(), 30) == b""
            writer.close()
        deadline = time.monotonic() + 20
        while thread.daemon.drain._calls:  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, "the forward's call never ended"
            await asyncio.sleep(0.02)
        assert record(thread, ws.workspace_id) is None


async def test_a_call_during_a_delete_finds_the_workspace_gone(tmp_path: Path, default_image: str) -> None:
    """An exec that comes while a delete removes the container is NOT_FOUND, and leaves no record or session."""
    async with own_daemon(tmp_path) as (client, thread):
        ws = await client.create_workspace()
        gate = Gate(thread, "remove_container")
        deleting = asyncio.create_task(ws.delete())
        try:
            await gate.wait_entered()  # its sessions ended and its link closed; the container is still there
            with pytest.raises(NotFoundError):
                await ws.exec("true").wait()
        finally:
            gate.opened.set()
            await deleting
        assert record(thread, ws.workspace_id) is None
        assert thread.daemon.processes.list(ws.workspace_id) == []  # type: ignore[attr-defined]


async def test_a_delete_whose_caller_leaves_still_removes_the_workspace(tmp_path: Path, default_image: str) -> None:
    """A delete cancelled after its sessions were ended runs to its end: no container is left without them."""
    async with own_daemon(tmp_path) as (client, thread):
        ws = await client.create_workspace()
        gate = Gate(thread, "remove_container")
        deleting = asyncio.create_task(ws.delete())
        try:
            await gate.wait_entered()
            deleting.cancel()  # the caller leaves while the engine is asked to remove it
            with contextlib.suppress(asyncio.CancelledError):
                await deleting
            deadline = time.monotonic() + 30
            while not all(task.cancelling() for task in thread.daemon.drain._calls):  # type: ignore[attr-defined]
                assert time.monotonic() < deadline, "the daemon never saw the caller leave"
                await asyncio.sleep(0.02)
        finally:
            gate.opened.set()
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    await client.get_workspace(ws.workspace_id)
                except NotFoundError:
                    break
                assert time.monotonic() < deadline, "the workspace was left half removed"
                await asyncio.sleep(0.1)
            # A workspace being removed is NOT_FOUND already; its record goes once the removal is done.
            while record(thread, ws.workspace_id) is not None:
                assert time.monotonic() < deadline, "the workspace's record outlived its removal"
                await asyncio.sleep(0.05)
        finally:
            with contextlib.suppress(NotFoundError):
                await ws.delete()


async def test_a_refused_create_leaves_the_holder_as_it_was(tmp_path: Path, default_image: str) -> None:
    """ALREADY_EXISTS for a taken id: the holder keeps its idle clock, its agent link and its command."""
    async with own_daemon(tmp_path) as (client, thread):
        ws = await client.create_workspace(idle_ttl_s=600)
        try:
            process_id = await start_ready(ws, "echo ready; sleep 60")
            held = record(thread, ws.workspace_id)
            used, context = held.last_used, held.context
            assert used is not None and context is not None
            with pytest.raises(AlreadyExistsError):
                await client.create_workspace(workspace_id=ws.workspace_id)
            held = record(thread, ws.workspace_id)
            assert held.last_used is not None and held.last_used >= used
            assert held.context is context and context.link.connected
            events = [e async for e in client.input(process_id, yield_after_s=0.25)]
            assert not [e for e in events if isinstance(e, Output)], events
            assert type(events[-1]).__name__ == "Yielded", events  # still running, still followed
        finally:
            await ws.delete()


async def test_leaving_an_exec_interrupts_once_and_a_yielded_command_not_at_all(
    tmp_path: Path, default_image: str
) -> None:
    """The caller that leaves mid-stream is one Ctrl-C; the command that yielded is not interrupted."""
    async with own_daemon(tmp_path) as (client, _thread):
        ws = await client.create_workspace()
        try:
            yielded = await start_ready(ws, "trap 'echo y >> /tmp/yielded' INT; echo ready; sleep 60 & wait")
            handle = ws.exec(
                "trap 'echo x >> /tmp/left' INT; echo ready; while :; do sleep 0.1; done", yield_after_s=60
            )
            events = aiter(handle)
            async for event in events:
                if isinstance(event, Output) and "ready" in event.text:
                    break
            await events.aclose()  # the caller leaves mid-stream
            deadline = time.monotonic() + 20
            while (await ws.exec("cat /tmp/left 2>/dev/null").wait()).stdout == "":
                assert time.monotonic() < deadline, "the caller's leaving never interrupted the command"
                await asyncio.sleep(0.1)
            running = {p.process_id: p.running for p in await client.list_processes(ws.workspace_id)}
            assert running[yielded] and running[handle.process_id]  # both trap Ctrl-C and run on
            await client.kill(handle.process_id)
            assert (await ws.exec("cat /tmp/left; cat /tmp/yielded 2>/dev/null").wait()).stdout == "x\n"
        finally:
            await ws.delete()


async def test_a_start_whose_answer_died_with_the_connection_is_settled_by_the_welcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent started the command and said so on a connection that then died: the
    reconnect's welcome holds the command, which settles the start at once (it waited 60 s)."""
    from sandboxd.agent.codec import Kind
    from sandboxd.agent.routes import SessionChannel

    original = SessionChannel.on_frame
    lost: list[int] = []

    def lossy(self: SessionChannel, kind: bytes, payload: bytes) -> None:
        if kind == Kind.STARTED and not lost:
            lost.append(self.number)  # the answer is lost, and the connection with it
            link: Any = self.link
            asyncio.get_running_loop().create_task(link._stream.close(discard_input=True))
            return
        original(self, kind, payload)

    async with own_daemon(tmp_path) as (client, _thread):
        ws = await client.create_workspace()
        try:
            monkeypatch.setattr(SessionChannel, "on_frame", lossy)
            began = time.monotonic()
            done = await asyncio.wait_for(ws.exec("echo settled").wait(), 30)
            took = time.monotonic() - began
            assert lost, "no start answer was dropped"
            assert (done.exit_code, done.stdout) == (0, "settled\n")
            assert took < 10, f"the start waited {took:.1f} s"
        finally:
            monkeypatch.undo()
            await ws.delete()
