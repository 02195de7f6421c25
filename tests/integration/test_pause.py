"""Pause and resume: a paused workspace is frozen whole, uses no CPU, and goes on where it was.

Every test runs under runc (the cgroup freezer) and gVisor (runsc's own pause). What a paused
workspace's loop wrote is read from the host, at its volume: any call into the workspace
would resume it.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import pytest
from sandboxd_client import Exited, FailedPreconditionError, NotFoundError, Yielded

from tests.conftest import DaemonThread, make_settings

from .helpers import collect, skip_without, start_ready

pytestmark = pytest.mark.docker

RUNTIMES = ["runc", pytest.param("runsc", marks=pytest.mark.runsc)]

COUNTER = (
    "i=0; while :; do i=$((i+1)); echo $i; echo $i > /workspace/count.new; mv /workspace/count.new /workspace/count; "
    "sleep 0.02; done"
)
"""Counts for as long as it runs, to stdout and to a file (ready: the file's first number). The file is
replaced whole, never written in place: a pause between a truncation and its write would leave it empty."""


def volume_file(docker_client, workspace, name: str) -> Path:  # type: ignore[no-untyped-def]
    container = docker_client.containers.get(workspace.info.container_id)
    (mount,) = [m for m in container.attrs["Mounts"] if m["Destination"] == "/workspace"]
    return Path(mount["Source"]) / name


def cpu_ns(docker_client, workspace) -> int:  # type: ignore[no-untyped-def]
    """CPU the workspace's cgroup has used, as the engine reports it."""
    stats = docker_client.api.stats(workspace.info.container_id, stream=False)
    return int(stats["cpu_stats"]["cpu_usage"]["total_usage"])


async def until_counted(path: Path, past: int = 0) -> int:
    """The counter's value once it is above ``past`` (it runs)."""
    deadline = time.monotonic() + 20
    while True:
        text = path.read_text() if path.exists() else ""
        if text.strip() and int(text) > past:
            return int(text)
        assert time.monotonic() < deadline, f"the counter did not pass {past}: {text!r}"
        await asyncio.sleep(0.02)


async def test_a_paused_workspace_stands_still_and_goes_on_where_it_was(workspace, docker_client, runtime: str) -> None:
    """No count and no CPU while paused; the same command counts on after, its output unbroken.

    Under runc the cgroup freezer leaves not one time slice. gVisor's user-space kernel keeps
    its own housekeeping (about 3% of a CPU here, paused or idle alike): there the workspace's
    processes stand still, which the counter shows.
    """
    process_id = await start_ready(workspace, f"echo ready; {COUNTER}")
    count = volume_file(docker_client, workspace, "count")
    await until_counted(count)
    began = cpu_ns(docker_client, workspace)
    await asyncio.sleep(1.0)
    running = cpu_ns(docker_client, workspace) - began
    paused = await workspace.pause()
    assert paused.state == "paused"
    assert (await workspace.client.get_workspace(workspace.workspace_id)).info.state == "paused"
    frozen_at = int(count.read_text())
    began = cpu_ns(docker_client, workspace)
    await asyncio.sleep(1.0)  # the window in which nothing may move
    assert int(count.read_text()) == frozen_at
    frozen = cpu_ns(docker_client, workspace) - began
    if runtime == "runsc":
        assert frozen < running / 2, (frozen, running)
    else:
        assert frozen == 0, frozen
    resumed = await workspace.resume()
    assert resumed.state == "running"
    await until_counted(count, frozen_at)
    events, out, _ = await collect(workspace.client.input(process_id, yield_after_s=0.5))
    assert isinstance(events[-1], Yielded)  # the same command, still running
    # Ended by Kill, not Ctrl-C: under gVisor a SIGINT that meets bash as it forks can leave it
    # spinning for ever (README, gVisor), and this loop forks all the time.
    killed = await workspace.client.kill(process_id)
    assert (killed.stop_reason, killed.exit_code) == ("killed", 143)
    events, rest, _ = await collect(workspace.client.input(process_id, yield_after_s=2))
    numbers = [int(n) for n in (out + rest).split()]
    # Every number once, in order, across the pause: nothing lost, nothing repeated.
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    assert numbers[-1] > frozen_at
    assert isinstance(events[-1], Exited) and events[-1].exit_code == 143


async def test_a_timeout_does_not_run_while_paused(workspace) -> None:
    """A command with 3 s to live, paused for 4: alive after the resume, then timed out in its time."""
    process_id = await start_ready(workspace, "echo ready; sleep 100", timeout_s=3)
    await workspace.pause()
    await asyncio.sleep(4.0)  # past the command's whole timeout, frozen
    began = time.monotonic()
    await workspace.resume()
    events, _, _ = await collect(workspace.client.input(process_id, yield_after_s=0.5))
    assert isinstance(events[-1], Yielded), events[-1]  # a clock that counted the pause killed it at the thaw
    while isinstance(events[-1], Yielded):  # an Input's window stays a second under the timeout
        assert time.monotonic() - began < 20, "the timeout never came after the resume"
        events, _, _ = await collect(workspace.client.input(process_id, yield_after_s=2))
    exited = events[-1]
    assert isinstance(exited, Exited) and exited.stop_reason == "timeout", exited
    assert time.monotonic() - began > 1.0  # what it had left, not nothing


async def test_a_call_resumes_a_paused_workspace(workspace) -> None:
    """Exec, a file call and Input each resume the workspace they need (auto_resume, the default)."""
    process_id = await start_ready(workspace, "echo ready; read line; echo got $line")
    await workspace.pause()
    assert (await workspace.exec("echo awake").wait()).stdout == "awake\n"
    assert (await workspace.refresh()).state == "running"
    await workspace.pause()
    assert (await workspace.write_file("/workspace/a.txt", "one\n")).size_bytes == 4
    await workspace.pause()
    events, out, _ = await collect(workspace.client.input(process_id, "hi\n", yield_after_s=5))
    assert out == "got hi\n" and isinstance(events[-1], Exited)
    assert (await workspace.refresh()).state == "running"


async def test_update_network_resumes_a_paused_workspace(workspace) -> None:
    """UpdateNetwork holds the workspace's lock while it resumes it: it answers (it used to wait
    for that same lock for ever), and the workspace runs on with its new network."""
    await workspace.pause()
    info = await asyncio.wait_for(workspace.update_network("none"), 30)
    assert info.state == "running"
    assert info.network == "none"
    assert (await workspace.exec("echo awake").wait()).stdout == "awake\n"


@pytest.mark.workspace(auto_resume=False)
async def test_update_network_on_a_paused_workspace_without_auto_resume_is_refused(workspace) -> None:
    """Refused as every other call that needs its processes, and it stays paused."""
    await workspace.pause()
    with pytest.raises(FailedPreconditionError, match="is paused"):
        await asyncio.wait_for(workspace.update_network("none"), 30)
    assert (await workspace.refresh()).state == "paused"
    await workspace.resume()


@pytest.mark.workspace(auto_resume=False)
async def test_without_auto_resume_calls_on_a_paused_workspace_are_refused(workspace) -> None:
    """FAILED_PRECONDITION saying it is paused, for commands, input and files; resume lets them through."""
    assert workspace.info.auto_resume is False
    process_id = await start_ready(workspace, "echo ready; sleep 100")
    await workspace.pause()
    for call in (
        lambda: workspace.exec("true").wait(),
        lambda: workspace.read_file("/etc/hostname"),
        lambda: collect(workspace.client.input(process_id, "x")),
        lambda: workspace.client.kill(process_id),
    ):
        with pytest.raises(FailedPreconditionError, match="is paused"):
            await call()
    assert (await workspace.refresh()).state == "paused"
    await workspace.resume()
    assert (await workspace.exec("echo back").wait()).stdout == "back\n"


async def test_pause_and_resume_out_of_turn_are_clean_errors(workspace, client) -> None:
    """Pausing a paused workspace, resuming a running one, and unknown ids: a status and a message."""
    with pytest.raises(FailedPreconditionError, match="is not paused"):
        await workspace.resume()
    await workspace.pause()
    with pytest.raises(FailedPreconditionError, match="already paused"):
        await workspace.pause()
    for call in (client.pause_workspace, client.resume_workspace):
        with pytest.raises(NotFoundError):
            await call("ws-nosuchthing")
    await workspace.resume()
    assert (await workspace.refresh()).state == "running"


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_paused_workspace_can_be_deleted(
    client, runtime: str, docker_client, request: pytest.FixtureRequest
) -> None:
    """Nothing is left of it (gVisor cannot remove a paused sandbox: it is thawed first)."""
    skip_without(runtime, request)
    ws = await client.create_workspace(runtime=runtime, labels={"test": "pause-delete"})
    await start_ready(ws, "echo ready; sleep 100")
    await ws.pause()
    await ws.delete()
    assert not docker_client.containers.list(all=True, filters={"id": ws.info.container_id}, ignore_removed=True)
    with pytest.raises(NotFoundError):
        await client.get_workspace(ws.workspace_id)


async def test_resume_then_exec_is_quick(workspace) -> None:
    """Resume to the first command's output, median of 5: well under a second (bench/ has the figure)."""
    samples = []
    for _ in range(5):
        await workspace.pause()
        began = time.perf_counter()
        await workspace.resume()
        assert (await workspace.exec("true").wait()).exit_code == 0
        samples.append(time.perf_counter() - began)
    assert statistics.median(samples) < 1.0, samples


async def test_the_idle_ttl_may_pause_instead_of_delete(default_image: str, tmp_path: Path, docker_client) -> None:
    """idle_action=pause: the reaper pauses it (files and commands kept); the next call resumes it.

    Watched from the engine: a Get would be a call, and keep it from ever being idle.
    """
    from sandboxd_client import SandboxClient

    thread = DaemonThread(make_settings(tmp_path)).start()
    try:
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            ws = await client.create_workspace(idle_ttl_s=1.0, idle_action="pause", labels={"test": "idle-pause"})
            assert ws.info.idle_action == "pause"
            await ws.write_file("/workspace/kept.txt", "kept\n")
            deadline = time.monotonic() + 20
            container = docker_client.containers.get(ws.info.container_id)
            while not container.attrs["State"]["Paused"]:
                assert time.monotonic() < deadline, "the idle TTL never paused it"
                await asyncio.sleep(0.2)
                container.reload()
            assert (await client.get_workspace(ws.workspace_id)).info.state == "paused"
            assert (await ws.exec("cat /workspace/kept.txt").wait()).stdout == "kept\n"
            assert (await ws.refresh()).state == "running"
            await ws.delete()
    finally:
        thread.stop()


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_paused_workspace_stays_paused_across_a_daemon_restart(
    default_image: str, tmp_path: Path, runtime: str, request: pytest.FixtureRequest
) -> None:
    """A new daemon sees it paused, resumes it on the next call, and its command is still there."""
    from sandboxd_client import SandboxClient

    skip_without(runtime, request)
    settings = make_settings(tmp_path)
    thread = DaemonThread(settings).start()
    ws_id = process_id = ""
    try:
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            ws = await client.create_workspace(runtime=runtime, labels={"test": "pause-restart"})
            ws_id = ws.workspace_id
            process_id = await start_ready(ws, "echo ready; sleep 100", timeout_s=60)
            await ws.pause()
    finally:
        thread.stop()
    thread = DaemonThread(settings).start()
    try:
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            ws = await client.get_workspace(ws_id)
            assert ws.info.state == "paused"
            assert (await ws.exec("echo resumed").wait()).stdout == "resumed\n"
            assert process_id in {p.process_id for p in await client.list_processes(ws_id) if p.running}
            await ws.delete()
    finally:
        thread.stop()
