"""SIGTERM during load: the daemon drains within ``SANDBOXD_SHUTDOWN_GRACE_S`` and loses nothing.

A real daemon process under concurrent calls of every kind (commands, a flood of output,
file writes and reads) is sent SIGTERM: calls in flight end with their results or a clean
UNAVAILABLE, a stream still open at the grace's end yields (naming its process), the process
exits 0 within the grace (plus its own release), and its successor on the same label lists
every workspace, runs commands in each, and still holds the commands started before the stop,
running on in their workspaces all along.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest
from sandboxd_client import SandboxClient, UnavailableError, Yielded

from ..conftest import new_instance, spawned_daemon
from .helpers import start_ready, until_caught

GRACE_S = 3.0
RELEASE_S = 4.0
"""What the stop may take beyond the grace: closing sessions, links and the lease."""


async def test_sigterm_under_load_drains_within_the_grace_and_loses_no_workspace(
    tmp_path: Path, default_image: str
) -> None:
    instance = new_instance()
    with spawned_daemon(tmp_path / "first", instance, SANDBOXD_SHUTDOWN_GRACE_S=str(GRACE_S)) as (daemon, socket, _):
        async with SandboxClient(socket_path=socket, retries=False) as client:
            workspaces = [await client.create_workspace() for _ in range(4)]
            beating = await start_ready(workspaces[0], "echo ready; while :; do date +%s%N >> beat; sleep 0.05; done")
            outcomes: list[tuple[float, str]] = []

            async def loop(workspace, kind: str) -> None:  # type: ignore[no-untyped-def]
                n = 0
                while True:
                    n += 1
                    try:
                        if kind == "true":
                            result = await workspace.exec("true").wait()
                            ok = result.exit_code == 0
                        elif kind == "seq":
                            result = await workspace.exec("seq 1 100000").wait()
                            ok = result.exit_code == 0 and result.stdout.endswith("\n100000\n")
                        else:
                            data = f"{n}\n" * 100_000
                            await workspace.write_file(f"file-{n % 3}.txt", data)
                            read = await workspace.exec(f"md5sum < file-{n % 3}.txt").wait()
                            ok = read.exit_code == 0
                        outcomes.append((time.monotonic(), "ok" if ok else "wrong result"))
                    except UnavailableError:
                        outcomes.append((time.monotonic(), "UNAVAILABLE"))
                        return
                    except Exception as exc:  # any other outcome is what this test exists to catch
                        outcomes.append((time.monotonic(), f"{type(exc).__name__}: {exc}"))
                        return

            # A stream the grace cannot wait out: a command that runs past it, its output followed.
            long_call = workspaces[1].exec("echo started; sleep 60; echo done", yield_after_s=120)
            long_started = asyncio.Event()

            async def follow_long() -> object:
                last: object = None
                try:
                    async for last in long_call:
                        if getattr(last, "text", "") == "started\n":
                            long_started.set()
                except Exception as exc:  # its end is what is asserted
                    return exc
                return last

            long_task = asyncio.create_task(follow_long())
            await asyncio.wait_for(long_started.wait(), 30)
            kinds = ("true", "seq", "file")
            loops = [
                asyncio.create_task(loop(workspace, kinds[i % 3]))
                for i, workspace in enumerate(workspaces)
                for _ in range(2)
            ]
            while len(outcomes) < 24:
                await asyncio.sleep(0.05)
            await asyncio.to_thread(until_caught, daemon.pid, signal.SIGTERM)
            signalled = time.monotonic()
            daemon.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(daemon.wait, GRACE_S + RELEASE_S + 30)
            took = time.monotonic() - signalled
            await asyncio.wait_for(asyncio.gather(*loops), 30)
            long_end = await asyncio.wait_for(long_task, 30)
        assert code == 0
        assert took < GRACE_S + RELEASE_S, took
        # Before the signal: all fine. After it: results, or UNAVAILABLE (nothing else, no hang).
        assert {outcome for at, outcome in outcomes if at < signalled} == {"ok"}
        # The stream still open at the grace ended with a final event: yielded, naming the process
        # to poll once a daemon serves again.
        assert isinstance(long_end, Yielded), long_end
        assert long_end.process_id == long_call.process_id
        assert {outcome for _, outcome in outcomes} <= {"ok", "UNAVAILABLE"}, [
            (round(at - signalled, 3), outcome) for at, outcome in outcomes[-12:]
        ]
    with spawned_daemon(tmp_path / "second", instance) as (_successor, socket, _):
        async with SandboxClient(socket_path=socket, retries=False) as client:
            listed = {info.workspace_id for info in await client.list_workspaces()}
            assert listed == {workspace.workspace_id for workspace in workspaces}
            for info in listed:
                result = await client.exec(info, "echo $((6 * 7))").wait()
                assert (result.exit_code, result.stdout) == (0, "42\n")
            # The commands started before the stop ran on, and are this daemon's now.
            running = [
                process.process_id
                for workspace in workspaces[:2]
                for process in await client.list_processes(workspace.workspace_id)
                if process.running
            ]
            assert sorted(running) == sorted([beating, long_call.process_id])
            before = (await client.exec(workspaces[0].workspace_id, "wc -l < beat").wait()).stdout
            deadline = time.monotonic() + 10
            while (await client.exec(workspaces[0].workspace_id, "wc -l < beat").wait()).stdout == before:
                assert time.monotonic() < deadline, "the command started before the stop is not running"
                await asyncio.sleep(0.1)
            for info in listed:
                await client.delete_workspace(info)


async def test_a_second_sigterm_waits_for_the_first_and_a_caller_leaving_in_the_grace_still_means_ctrl_c(
    tmp_path: Path, default_image: str
) -> None:
    instance = new_instance()
    with spawned_daemon(tmp_path / "first", instance, SANDBOXD_SHUTDOWN_GRACE_S=str(GRACE_S)) as (daemon, socket, _):
        async with SandboxClient(socket_path=socket, retries=False) as client:
            ws = await client.create_workspace()
            calls = [ws.exec("echo started; sleep 60", yield_after_s=120) for _ in range(2)]
            started = [asyncio.Event(), asyncio.Event()]

            async def follow(n: int) -> object:
                last: object = None
                try:
                    async for last in calls[n]:
                        if getattr(last, "text", "") == "started\n":
                            started[n].set()
                except Exception as exc:  # its end is what is asserted
                    return exc
                return last

            followers = [asyncio.create_task(follow(n)) for n in range(2)]
            await asyncio.wait_for(asyncio.gather(*(event.wait() for event in started)), 30)
            await asyncio.to_thread(until_caught, daemon.pid, signal.SIGTERM)
            signalled = time.monotonic()
            daemon.send_signal(signal.SIGTERM)
            daemon.send_signal(signal.SIGTERM)  # impatience: it must not cut the drain short
            followers[1].cancel()  # this caller leaves within the grace: Ctrl-C, as ever
            code = await asyncio.to_thread(daemon.wait, GRACE_S + RELEASE_S + 30)
            took = time.monotonic() - signalled
            kept = await asyncio.wait_for(followers[0], 30)
        assert code == 0
        assert GRACE_S <= took < GRACE_S + RELEASE_S
        assert isinstance(kept, Yielded), kept
        assert kept.process_id == calls[0].process_id
    with spawned_daemon(tmp_path / "second", instance) as (_successor, socket, _):
        async with SandboxClient(socket_path=socket, retries=False) as client:
            processes = {p.process_id: p for p in await client.list_processes(ws.workspace_id)}
            assert processes[calls[0].process_id].running
            left = processes[calls[1].process_id]
            assert not left.running
            assert left.exited is not None and left.exited.stop_reason == "interrupted", left
            await client.delete_workspace(ws.workspace_id)


async def test_a_command_still_starting_when_the_grace_ends_runs_on_for_the_successor(
    tmp_path: Path, default_image: str, docker_client
) -> None:  # type: ignore[no-untyped-def]
    """The workspace frozen (docker pause) as the command is sent: its start is not answered in the grace."""
    instance = new_instance()
    with spawned_daemon(tmp_path / "first", instance, SANDBOXD_SHUTDOWN_GRACE_S="1") as (daemon, socket, _):
        async with SandboxClient(socket_path=socket, retries=False) as client:
            ws = await client.create_workspace()
            container = docker_client.containers.get(ws.info.container_id)
            container.pause()
            try:
                starting = asyncio.create_task(ws.exec("date > started; sleep 60", yield_after_s=120).wait())
                # Sent: the daemon holds its session (the frozen agent has not answered the start).
                deadline = time.monotonic() + 20
                while not await client.list_processes(ws.workspace_id):
                    assert time.monotonic() < deadline, "the exec never reached the daemon"
                    await asyncio.sleep(0.05)
                await asyncio.to_thread(until_caught, daemon.pid, signal.SIGTERM)
                daemon.send_signal(signal.SIGTERM)
                assert await asyncio.to_thread(daemon.wait, 30) == 0
                with pytest.raises(UnavailableError, match="runs on in its workspace"):
                    await asyncio.wait_for(starting, 30)
            finally:
                container.unpause()
    with spawned_daemon(tmp_path / "second", instance) as (_successor, socket, _):
        async with SandboxClient(socket_path=socket, retries=False) as client:
            deadline = time.monotonic() + 20
            while (await client.exec(ws.workspace_id, "cat started").wait()).exit_code != 0:
                assert time.monotonic() < deadline, "the command sent before the stop never ran"
                await asyncio.sleep(0.1)
            processes = await client.list_processes(ws.workspace_id)
            assert any(p.command.startswith("date > started") and p.running for p in processes), processes
            await client.delete_workspace(ws.workspace_id)
