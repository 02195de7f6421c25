"""A Docker engine restart under light load, on an engine of the test's own (engine.py).

Calls in the window get UNAVAILABLE, or wait for the agent to be back and succeed (never
INTERNAL, never a hang), and after it every workspace is listed and usable again: the engine
restarts the containers (restart policy ``unless-stopped``), the daemon reconnects to their
agents and takes its lease again.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from sandboxd_client import SandboxClient, UnavailableError

from sandboxd.agentbuild import AgentBuild, agent_digest

from ..conftest import spawned_daemon
from .engine import private_engine
from .helpers import skip_without

WORKSPACES = 3
BACK_WITHIN_S = 30.0
"""How soon after the engine answers again every workspace must run commands."""


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_calls_in_an_engine_restart_are_unavailable_and_every_workspace_comes_back(
    tmp_path: Path, default_image: str, runtime: str, request: pytest.FixtureRequest
) -> None:
    skip_without(runtime, request)
    with (
        private_engine(default_image, AgentBuild(agent_digest()).image) as engine,
        spawned_daemon(tmp_path, DOCKER_HOST=engine.host) as (_daemon, socket_path, log_path),
    ):
        async with SandboxClient(socket_path=socket_path, retries=False) as client:
            workspaces = [await client.create_workspace(runtime=runtime) for _ in range(WORKSPACES)]
            await workspaces[0].write_file("kept.txt", "written before the restart\n")
            calls: list[tuple[float, float, str]] = []  # (started, ended, outcome)
            stop = asyncio.Event()

            async def light_load(workspace) -> None:  # type: ignore[no-untyped-def]
                while not stop.is_set():
                    started = time.monotonic()
                    try:
                        result = await asyncio.wait_for(workspace.exec("true").wait(), 60)
                        outcome = "ok"
                        if result.exit_code != 0:
                            outcome = f"exit {result.exit_code} {result.stop_reason}: {result.message}"
                    except UnavailableError:
                        outcome = "UNAVAILABLE"
                    except Exception as exc:  # any other outcome is the failure this test exists for
                        outcome = f"{type(exc).__name__}: {exc}"
                    calls.append((started, time.monotonic(), outcome))
                    await asyncio.sleep(0.2)

            def ok_since(moment: float) -> int:
                return sum(1 for started, _, outcome in calls if started > moment and outcome == "ok")

            loops = [asyncio.create_task(light_load(workspace)) for workspace in workspaces]
            while ok_since(0) < 2 * WORKSPACES:
                await asyncio.sleep(0.05)
            restarted = time.monotonic()
            await asyncio.to_thread(engine.restart)
            back = time.monotonic()
            # Every loop succeeds again, soon.
            deadline = back + BACK_WITHIN_S
            while ok_since(back) < 3 * WORKSPACES:
                assert time.monotonic() < deadline, (calls[-12:], log_path.read_text()[-3000:])
                await asyncio.sleep(0.2)
            stop.set()
            await asyncio.gather(*loops)
            timeline = [(round(a - restarted, 2), round(b - restarted, 2), o) for a, b, o in calls if b >= restarted]
            # Calls in the window: UNAVAILABLE, or (a command sent again once the agent is back)
            # done; never another error, and none waits long past the engine's return.
            window = [(ended, outcome) for started, ended, outcome in calls if restarted <= started <= back]
            assert window, timeline
            # A command running when the engine stopped its container is gone with it, and says so.
            lost = "exit 255 failed: the workspace's agent restarted while the command ran"
            assert all(outcome in {"ok", "UNAVAILABLE"} or outcome.startswith(lost) for _, _, outcome in calls), (
                timeline
            )
            assert all(started < back for started, _, outcome in calls if outcome.startswith(lost)), timeline
            assert max(ended for ended, _ in window) < back + 15, timeline
            listed = {info.workspace_id for info in await client.list_workspaces()}
            assert listed == {workspace.workspace_id for workspace in workspaces}
            for workspace in workspaces:
                result = await workspace.exec("echo $((6 * 7))").wait()
                assert (result.exit_code, result.stdout) == (0, "42\n")
            # /workspace is a volume: what was written before is there after.
            kept = await workspaces[0].exec("cat kept.txt").wait()
            assert kept.stdout == "written before the restart\n"
            for workspace in workspaces:
                await client.delete_workspace(workspace.workspace_id)
    events = [json.loads(line)["event"] for line in log_path.read_text().splitlines() if line.startswith("{")]
    assert events.count("lease.taken") == 2  # at the start, and again once the engine was back
    assert "lease.lost" in events
