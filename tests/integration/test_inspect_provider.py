"""The Inspect provider's own behaviour beyond Inspect's self-check: services, cleanup, limits, abuse."""

from __future__ import annotations

import shlex
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from inspect_ai.util import OutputLimitExceededError, SandboxUnavailableError
from inspect_ai.util._sandbox.limits import override_max_exec_output_size
from sandboxd_client import NotFoundError, SandboxClient
from sandboxd_client.inspect import SandboxdConfig, SandboxdSandboxEnvironment
from sandboxd_client.inspect._environment import RUN_ID

from tests.conftest import DaemonThread

pytestmark = pytest.mark.docker

Env = SandboxdSandboxEnvironment


@pytest.fixture
def address(daemon: DaemonThread, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test daemon's address, also as SANDBOXD_ADDRESS (what ``inspect sandbox cleanup`` reads)."""
    monkeypatch.setenv("SANDBOXD_ADDRESS", f"unix:{daemon.socket_path}")
    return f"unix:{daemon.socket_path}"


@pytest_asyncio.fixture
async def one(address: str, request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    """A sample's default workspace, removed afterwards."""
    config = SandboxdConfig(address=address)
    task = request.node.name
    environments = await Env.sample_init(task, config, {"__sample_id__": "s1"})
    try:
        yield environments["default"]  # type: ignore[misc]
    finally:
        await Env.sample_cleanup(task, config, environments, interrupted=False)
        await Env.task_cleanup(task, config, cleanup=True)


async def _provider_workspaces(address: str) -> list[str]:
    async with SandboxClient(address, retries=False) as client:
        return [w.workspace_id for w in await client.list_workspaces({"inspect.provider": "sandboxd"})]


async def test_a_sample_gets_a_workspace_per_service_default_first(address: str) -> None:
    config = SandboxdConfig.model_validate(
        {
            "address": address,
            "env": {"SHARED": "top"},
            "memory": "256m",
            "services": {"db": {"env": {"ROLE": "db"}, "memory": "128MiB"}, "web": {}},
        }
    )
    environments = await Env.sample_init("services", config, {"__sample_id__": 7})
    try:
        assert list(environments) == ["default", "db", "web"]
        ids = {name: env.workspace_id for name, env in environments.items()}  # type: ignore[attr-defined]
        assert len(set(ids.values())) == 3
        db = await environments["db"].exec(["sh", "-c", "echo $SHARED $ROLE"])
        assert db.stdout == "top db\n"
        async with SandboxClient(address, retries=False) as client:
            info = (await client.get_workspace(ids["db"])).info
        assert (info.memory_bytes, info.labels["inspect.service"], info.labels["inspect.sample"]) == (
            128 * 2**20,
            "db",
            "7",
        )
        assert (info.labels["inspect.task"], info.labels["inspect.run"]) == ("services", RUN_ID)
    finally:
        await Env.sample_cleanup("services", config, environments, interrupted=True)
    assert not set(ids.values()) & set(await _provider_workspaces(address))


async def test_a_sample_whose_one_service_cannot_start_leaves_nothing(address: str) -> None:
    config = SandboxdConfig.model_validate(
        {"address": address, "services": {"broken": {"image": "sandboxd-test/no-such-image:1"}}}
    )
    before = set(await _provider_workspaces(address))
    with pytest.raises(NotFoundError, match="no-such-image"):
        await Env.sample_init("broken", config, {})
    assert set(await _provider_workspaces(address)) == before


async def test_without_cleanup_the_workspaces_stay_and_are_named_then_cli_cleanup_removes_them(
    address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = SandboxdConfig(address=address)
    environments = await Env.sample_init("kept", config, {"__sample_id__": 1})
    kept = environments["default"].workspace_id  # type: ignore[attr-defined]
    # Inspect skips sample_cleanup then, and calls task_cleanup once the eval ends, as "shutdown".
    await Env.task_cleanup("shutdown", config, cleanup=False)
    printed = capsys.readouterr().out
    assert kept in printed and "inspect sandbox cleanup sandboxd" in printed
    assert kept in await _provider_workspaces(address)
    await Env.cli_cleanup(None)
    assert await _provider_workspaces(address) == []


async def test_a_flood_past_the_output_limit_raises_and_kills_the_command(one: Env) -> None:
    began = time.monotonic()
    with override_max_exec_output_size(64 * 1024), pytest.raises(OutputLimitExceededError) as raised:
        await one.exec(["sh", "-c", "yes flood-marker; sleep 600"])
    assert time.monotonic() - began < 20
    assert raised.value.truncated_output is not None
    assert len(raised.value.truncated_output) == 64 * 1024
    assert raised.value.truncated_output.startswith("flood-marker\n")
    left = await one.exec(["sh", "-c", "ps -eo args | grep -c '[f]lood-marker' || true"])
    assert left.stdout == "0\n"


async def test_files_past_the_daemon_s_write_bound_keep_the_write_s_rules(one: Env) -> None:
    data = bytes(range(256)) * (20 * 4096)  # 20 MiB: past WriteFile's 16 MiB, through Upload
    await one.write_file("big/blob.bin", data)
    assert await one.read_file("big/blob.bin", text=False) == data
    await one.exec(["chmod", "0444", "big/blob.bin"])
    with pytest.raises(PermissionError):
        await one.write_file("big/blob.bin", data)
    with pytest.raises(IsADirectoryError):
        await one.write_file("big", data)
    assert await one.read_file("big/blob.bin", text=False) == data  # untouched by the refusals


async def test_a_symlink_is_read_through_and_a_loop_is_a_clean_error(one: Env) -> None:
    await one.exec(["sh", "-c", "ln -s /etc/hostname host; ln -s loop loop"])
    assert await one.read_file("host") == (await one.exec(["cat", "/etc/hostname"])).stdout
    with pytest.raises(OSError, match="loop"):
        await one.read_file("loop")


async def test_a_command_line_past_the_daemon_s_bound_runs_whole_and_leaves_no_script(one: Env) -> None:
    words = [f"w{i:06d}" for i in range(40_000)]  # about 320 KiB of argv
    result = await one.exec(["sh", "-c", 'echo "$#" "$1" "${40000}"', "sh", *words])
    assert result.stdout == "40000 w000000 w039999\n"
    assert (await one.exec(["sh", "-c", "ls -A /tmp | grep -c inspect- || true"])).stdout == "0\n"


async def test_a_workspace_removed_under_the_sample_is_unavailable(one: Env, address: str) -> None:
    async with SandboxClient(address, retries=False) as client:
        await client.delete_workspace(one.workspace_id)
    with pytest.raises(SandboxUnavailableError, match=one.workspace_id):
        await one.exec(["true"])
    with pytest.raises(SandboxUnavailableError):
        await one.read_file("anything")


async def test_the_connection_is_a_sandboxctl_command_line(one: Env, address: str) -> None:
    connection = await one.connection(user="root")
    assert connection.type == "sandboxd"
    assert shlex.split(connection.command) == [
        "sandboxctl",
        "--address",
        address,
        "exec",
        "-it",
        "--user",
        "root",
        one.workspace_id,
        "--",
        "bash -l",
    ]
