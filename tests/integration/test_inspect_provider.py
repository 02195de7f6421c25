"""The Inspect provider's own behaviour beyond Inspect's self-check: services, cleanup, limits, abuse."""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from inspect_ai.util import OutputLimitExceededError, SandboxEnvironmentLimits, SandboxUnavailableError
from inspect_ai.util._sandbox.limits import override_max_exec_output_size
from sandboxd_client import NotFoundError, SandboxClient, SandboxError
from sandboxd_client.inspect import SandboxdConfig, SandboxdSandboxEnvironment
from sandboxd_client.inspect import _environment as provider
from sandboxd_client.inspect._environment import RUN_ID

from tests.conftest import DaemonThread, make_settings

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
    # What a user runs after an eval that kept them, or one that was killed: Inspect's own CLI.
    inspect = Path(sys.executable).with_name("inspect")
    cleaned = subprocess.run(
        [str(inspect), "sandbox", "cleanup", "sandboxd"], capture_output=True, text=True, timeout=120, check=False
    )
    assert cleaned.returncode == 0, cleaned.stderr[-2000:]
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


# -- found by a hostile review; each failed before its fix ---------------------------------------


async def test_a_long_root_command_cannot_be_swapped_by_the_workspace_user(one: Env) -> None:
    """A line past the daemon's bound goes through a file the workspace's user writes: root checks it first."""
    await one.exec(
        [
            "sh",
            "-c",
            '(while :; do for f in /tmp/.inspect-*.sh; do [ -f "$f" ] && '
            "echo 'id -u > /tmp/pwned' > \"$f\"; done; done) >/dev/null 2>&1 &",
        ]
    )
    for _ in range(5):
        result = await one.exec(["sh", "-c", "echo root-ran", "x" * 130_000], user="root")
        assert result.stdout in {"root-ran\n", ""}  # it ran as asked, or refused the changed file
        if not result.stdout:
            assert result.returncode == 126 and "changed before it ran" in result.stderr
    assert (await one.exec(["sh", "-c", "cat /tmp/pwned 2>/dev/null || echo none"])).stdout == "none\n"


async def test_a_full_session_cap_makes_an_exec_wait_not_fail(address: str, one: Env) -> None:
    """The sample's own commands holding every session of its workspace: one more waits for a free one,
    and another sample's workspace is not held up at all."""
    config = SandboxdConfig(address=address)
    other = await Env.sample_init("other", config, {"__sample_id__": "other"})
    # Long enough that all 64 still run once the last starts, however loaded the machine (they
    # are killed at the end: a cancelled exec kills its command).
    busy = [asyncio.create_task(one.exec(["sleep", "120"])) for _ in range(64)]
    try:
        async with SandboxClient(address, retries=False) as client, asyncio.timeout(90):
            while len(await client.list_processes(one.workspace_id)) < 64:  # type: ignore[attr-defined]
                await asyncio.sleep(0.2)
        waiting = asyncio.create_task(one.exec(["echo", "ok"]))
        assert (await asyncio.wait_for(other["default"].exec(["echo", "free"]), 30)).stdout == "free\n"
        assert not waiting.done(), waiting.result()  # it waits for a session; it does not fail
        busy[0].cancel()  # one command ends (a cancelled exec kills it): its session is free
        result = await asyncio.wait_for(waiting, 60)
        assert (result.returncode, result.stdout) == (0, "ok\n"), result
    finally:
        for task in busy:
            task.cancel()
        await asyncio.gather(*busy, return_exceptions=True)
        await Env.sample_cleanup("other", config, other, interrupted=True)


async def test_read_file_holds_no_more_than_the_limit_whatever_the_file_does(
    one: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = 1024 * 1024
    monkeypatch.setattr(SandboxEnvironmentLimits, "MAX_READ_FILE_SIZE", limit)
    client = provider._client(one._address)
    real, pulled = client.download, [0]

    async def counting(*args: Any, **kwargs: Any) -> AsyncIterator[bytes]:
        n = 0
        async for chunk in real(*args, **kwargs):
            n += len(chunk)
            pulled[0] = max(pulled[0], n)
            yield chunk

    monkeypatch.setattr(client, "download", counting)
    await one.exec(
        [
            "sh",
            "-c",
            "echo x > small; truncate -s 64M big; (while :; do ln -sfn small g; ln -sfn big g; done) >/dev/null 2>&1 &",
        ]
    )
    for _ in range(100):
        # ln -sfn unlinks before it links: now and then g is not there at all.
        with contextlib.suppress(OutputLimitExceededError, FileNotFoundError):
            await one.read_file("g", text=False)
        assert pulled[0] <= limit + 2 * 1024 * 1024, f"read_file pulled {pulled[0]} bytes into memory"


async def test_stdin_is_closed_without_input_and_fed_then_closed_with_it(one: Env) -> None:
    """As Inspect's docker provider: a reader ends at once without input, and reads all of it with."""
    without = await asyncio.wait_for(one.exec(["sh", "-c", "cat; echo end"]), 30)
    assert (without.stdout, without.returncode) == ("end\n", 0)
    data = "".join(f"line {i}\n" for i in range(200_000))  # 2.5 MB: more than one Input call carries
    fed = await asyncio.wait_for(one.exec(["sh", "-c", "wc -lc; cat >/dev/null"], input=data), 60)
    assert (fed.stdout.split(), fed.returncode) == (["200000", str(len(data))], 0)


async def test_input_that_is_not_unicode_raises_at_once(one: Env) -> None:
    with pytest.raises(UnicodeEncodeError):
        await asyncio.wait_for(one.exec(["cat"], input="half an emoji: \ud83d"), 20)


async def test_a_write_past_16_mib_keeps_a_small_write_s_rules(one: Env) -> None:
    big = b"N" * (17 * 1024 * 1024)
    await one.exec(["sh", "-c", "echo outside > /tmp/target; ln -s /tmp/target link"])
    await one.write_file("link", big)  # through the symlink, as `>` would
    ls = (await one.exec(["sh", "-c", "stat -c '%F' link; stat -c %s /tmp/target"])).stdout
    assert ls == f"symbolic link\n{len(big)}\n", ls
    # A file it may write in a directory it may not create files in (sticky /tmp, root's file).
    await one.exec(["sh", "-c", "echo orig > /tmp/shared; chmod 666 /tmp/shared"], user="root")
    await one.write_file("/tmp/shared", b"small")
    await one.write_file("/tmp/shared", big)
    assert await one.read_file("/tmp/shared", text=False) == big


async def test_a_cancelled_exec_kills_its_command_even_one_that_ignores_ctrl_c(one: Env) -> None:
    task = asyncio.create_task(one.exec(["bash", "-c", "trap '' INT; echo ready > /tmp/ready; sleep 301"]))
    while (await one.exec(["sh", "-c", "cat /tmp/ready 2>/dev/null || true"])).stdout != "ready\n":
        await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    left = await one.exec(["sh", "-c", "ps -eo args | grep -c '^sleep 301' || true"])
    assert left.stdout == "0\n"


async def test_no_timeout_is_no_limit_and_a_zero_one_is_a_timeout(default_image: str, tmp_path: Path, one: Env) -> None:
    with pytest.raises(TimeoutError):
        await one.exec(["true"], timeout=0)
    assert (await one.exec(["echo", "ok"], timeout=2 * 86400)).stdout == "ok\n"
    thread = DaemonThread(make_settings(tmp_path, exec_timeout_s=2.0)).start()
    try:
        config = SandboxdConfig(address=f"unix:{thread.socket_path}")
        environments = await Env.sample_init("t", config, {})
        try:
            result = await environments["default"].exec(["sh", "-c", "sleep 3; echo done"])
            assert result.stdout == "done\n"  # past the daemon's default timeout of 2 s
        finally:
            await Env.sample_cleanup("t", config, environments, interrupted=False)
            await Env.task_cleanup("t", config, cleanup=True)
    finally:
        thread.stop()


async def test_a_long_non_ascii_sample_id_or_task_name_starts(address: str) -> None:
    config = SandboxdConfig(address=address)
    environments = await Env.sample_init("タスク" * 400, config, {"__sample_id__": "問題" * 400})
    try:
        async with SandboxClient(address, retries=False) as client:
            info = (await client.get_workspace(environments["default"].workspace_id)).info  # type: ignore[attr-defined]
        labels = info.labels
        assert labels["inspect.sample"] == "問題" * 170 + "問"  # 1024 bytes at most, whole characters
    finally:
        await Env.sample_cleanup("t", config, environments, interrupted=False)


async def test_a_file_that_shrinks_while_read_is_an_os_error(one: Env) -> None:
    await one.exec(
        [
            "sh",
            "-c",
            "(while :; do truncate -s 1 g; sleep 0.01; truncate -s 40M g; sleep 0.01; done) >/dev/null 2>&1 &",
        ]
    )
    for _ in range(60):
        try:
            await one.read_file("g", text=False)
        except SandboxError as exc:
            pytest.fail(f"{type(exc).__name__}: {exc}")
        except OSError:
            pass


async def test_an_env_value_that_looks_like_a_secret_reference_is_literal(one: Env) -> None:
    result = await one.exec(["sh", "-c", 'echo "$X"'], env={"X": "secret:nope"})
    assert (result.returncode, result.stdout) == (0, "secret:nope\n")
