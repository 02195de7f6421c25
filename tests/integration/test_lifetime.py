"""A workspace's lifetime: it ends that long after its create, busy or not, as its idle action says.

And ``ExecRequest.stdin_closed``: a command that starts with its stdin at end-of-file. Both are
what E2B's API needs of sandboxd (a sandbox's ``timeout``, a command's ``stdin: false``), and
both are sandboxd's own API first.
"""

from __future__ import annotations

import asyncio
import datetime
import time

import pytest
from sandboxd_client import FailedPreconditionError, InvalidArgumentError, NotFoundError, SandboxClient

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]


async def _until(predicate, timeout_s: float = 20.0) -> float:  # type: ignore[no-untyped-def]
    """Poll ``predicate`` (async) until true; return the seconds it took."""
    started = time.monotonic()
    while not await predicate():
        assert time.monotonic() - started < timeout_s, "the condition never came"
        await asyncio.sleep(0.1)
    return time.monotonic() - started


async def _gone(client: SandboxClient, workspace_id: str) -> bool:
    try:
        await client.get_workspace(workspace_id)
    except NotFoundError:
        return True
    return False


async def test_a_workspace_ends_at_its_lifetime_even_while_a_command_runs(client: SandboxClient) -> None:
    before = datetime.datetime.now(datetime.UTC)
    workspace = await client.create_workspace(lifetime_s=3, labels={"test": "lifetime"})
    try:
        info = workspace.info
        assert info.lifetime_s == 3.0
        assert info.expire_time is not None
        assert before + datetime.timedelta(seconds=2.5) <= info.expire_time <= before + datetime.timedelta(seconds=8)
        started = await workspace.exec("sleep 600", yield_after_s=0.5).wait()  # busy: it runs on
        assert started.exit_code is None
        took = await _until(lambda: _gone(client, workspace.workspace_id))
        assert datetime.datetime.now(datetime.UTC) >= info.expire_time
        assert took < 10
    finally:
        if not await _gone(client, workspace.workspace_id):
            await workspace.delete()


async def test_set_lifetime_moves_the_end_and_zero_means_never(client: SandboxClient) -> None:
    workspace = await client.create_workspace(lifetime_s=2, labels={"test": "lifetime"})
    try:
        moved = await client.set_lifetime(workspace.workspace_id, 3600)
        assert moved.expire_time is not None
        assert moved.expire_time > datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=3500)
        assert (await client.get_workspace(workspace.workspace_id)).info.expire_time == moved.expire_time
        await asyncio.sleep(3.5)  # past the 2 s it was made with: the reaper looks every second
        assert not await _gone(client, workspace.workspace_id)
        never = await client.set_lifetime(workspace.workspace_id, 0)
        assert never.expire_time is None
        again = await client.set_lifetime(workspace.workspace_id, 1)
        assert again.expire_time is not None
        await _until(lambda: _gone(client, workspace.workspace_id))
    finally:
        if not await _gone(client, workspace.workspace_id):
            await workspace.delete()


async def test_a_pause_lifetime_pauses_and_a_resume_starts_it_again(client: SandboxClient) -> None:
    workspace = await client.create_workspace(lifetime_s=2, idle_action="pause", labels={"test": "lifetime"})
    try:

        async def paused() -> bool:
            return (await client.get_workspace(workspace.workspace_id)).info.state == "paused"

        await _until(paused)
        assert (await client.get_workspace(workspace.workspace_id)).info.expire_time is None
        resumed_at = datetime.datetime.now(datetime.UTC)
        resumed = await client.resume_workspace(workspace.workspace_id)
        assert resumed.state == "running"
        after = (await client.get_workspace(workspace.workspace_id)).info.expire_time
        assert after is not None
        assert resumed_at + datetime.timedelta(seconds=1.5) <= after <= resumed_at + datetime.timedelta(seconds=6)
    finally:
        await workspace.delete()


async def test_lifetimes_out_of_range_are_refused(client: SandboxClient) -> None:
    with pytest.raises(InvalidArgumentError, match="lifetime must be 0"):
        await client.create_workspace(lifetime_s=0.5)
    with pytest.raises(InvalidArgumentError, match="lifetime must be 0"):
        await client.create_workspace(lifetime_s=400 * 86400)
    workspace = await client.create_workspace(labels={"test": "lifetime"})
    try:
        assert workspace.info.expire_time is None  # none asked for: no end
        with pytest.raises(InvalidArgumentError, match="lifetime must be 0"):
            await client.set_lifetime(workspace.workspace_id, 0.2)
        with pytest.raises(InvalidArgumentError):
            await client.set_lifetime(workspace.workspace_id, -5)
    finally:
        await workspace.delete()
    with pytest.raises(NotFoundError):
        await client.set_lifetime(workspace.workspace_id, 60)


async def test_stdin_closed_gives_end_of_file_at_once(client: SandboxClient, workspace_id: str) -> None:
    started = time.monotonic()
    result = await client.exec(workspace_id, "cat; echo read-eof", stdin_closed=True, timeout_s=30).wait()
    assert (result.exit_code, result.stdout) == (0, "read-eof\n")
    assert time.monotonic() - started < 10
    held = await client.exec(workspace_id, "sleep 30", stdin_closed=True, yield_after_s=0.3).wait()
    assert held.exit_code is None
    with pytest.raises(FailedPreconditionError, match="cannot take input"):
        await client.input(held.process_id, "too late\n").wait()
    await client.kill(held.process_id)
