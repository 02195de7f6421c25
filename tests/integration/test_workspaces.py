"""Workspace life cycle and hardened defaults against the real engine (issue 2)."""

from __future__ import annotations

import re
import socket

import pytest
from sandboxd_client import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)

pytestmark = pytest.mark.docker


class TestHardening:
    async def test_user_is_not_root(self, workspace) -> None:
        """Commands run as the image's non-root user."""
        result = await workspace.exec("id -u; id -un").wait()
        assert result.stdout == "1000\nsandbox\n"

    async def test_no_capabilities(self, workspace) -> None:
        """The effective, permitted and bounding capability sets are empty."""
        result = await workspace.exec("grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status").wait()
        values = re.findall(r"Cap\w+:\s+([0-9a-f]+)", result.stdout)
        assert values == ["0000000000000000"] * 3

    async def test_no_new_privileges(self, workspace) -> None:
        """no-new-privileges is set for every process."""
        result = await workspace.exec("grep NoNewPrivs /proc/self/status").wait()
        assert result.stdout.split() == ["NoNewPrivs:", "1"]

    async def test_pids_limit(self, workspace) -> None:
        """The pids cgroup caps processes at the daemon default (a number, 512)."""
        result = await workspace.exec(
            "cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max"
        ).wait()
        assert result.stdout.strip() == "512"

    async def test_memory_limit(self, workspace) -> None:
        """The memory cgroup caps the workspace at the daemon default (1 GiB)."""
        result = await workspace.exec(
            "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
        ).wait()
        assert int(result.stdout) == 1024**3

    async def test_only_loopback(self, workspace) -> None:
        """With network none, lo is the only interface."""
        result = await workspace.exec("ls /sys/class/net").wait()
        assert result.stdout.split() == ["lo"]

    async def test_pid1_is_docker_init(self, workspace) -> None:
        """Docker's init is PID 1, so orphans are reaped."""
        result = await workspace.exec("cat /proc/1/comm").wait()
        assert result.stdout.strip() == "docker-init"

    async def test_no_docker_socket(self, workspace) -> None:
        """The Docker socket is not inside the workspace."""
        result = await workspace.exec("test -e /var/run/docker.sock || test -e /run/docker.sock; echo $?").wait()
        assert result.stdout == "1\n"

    async def test_keepalive_survives_kill_all(self, workspace) -> None:
        """`kill -9 -1` from the workspace user cannot stop the workspace."""
        await workspace.exec("kill -9 -1").wait()
        result = await workspace.exec("echo alive").wait()
        assert result.stdout == "alive\n"

    @pytest.mark.workspace(memory_bytes=256 * 1024**2, pids=64, cpu_millis=500)
    async def test_limits_are_applied(self, workspace) -> None:
        """Explicit limits reach the cgroups and are reported back."""
        result = await workspace.exec(
            "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max "
            "/sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us"
        ).wait()
        memory, pids, quota, period = (int(x) for x in result.stdout.split())
        assert (memory, pids) == (256 * 1024**2, 64)
        assert quota / period == pytest.approx(0.5)
        assert (workspace.info.memory_bytes, workspace.info.pids, workspace.info.cpu_millis) == (256 * 1024**2, 64, 500)


class TestLoosening:
    @pytest.mark.workspace(network="bridge")
    async def test_bridge_network_has_an_interface(self, workspace) -> None:
        """Network bridge, asked for explicitly, adds eth0."""
        result = await workspace.exec("ls /sys/class/net").wait()
        assert sorted(result.stdout.split()) == ["eth0", "lo"]

    @pytest.mark.workspace(added_capabilities=["NET_BIND_SERVICE"])
    async def test_added_capability_is_in_the_bounding_set(self, workspace) -> None:
        """An added capability appears in the bounding set (bit 10) and nothing else does."""
        result = await workspace.exec("grep CapBnd /proc/self/status").wait()
        assert int(result.stdout.split()[1], 16) == 1 << 10


class TestLifecycle:
    async def test_create_get_list_delete(self, client, docker_client) -> None:
        """A workspace is listed, found by label, and leaves no container or volume after delete."""
        ws = await client.create_workspace(labels={"team": "lifecycle"}, env={"FOO": "bar"})
        try:
            got = await client.get_workspace(ws.workspace_id)
            assert got.info.state == "running"
            assert got.info.env == {"FOO": "bar"}
            assert got.info.user == "sandbox"
            assert got.info.working_dir == "/workspace"
            listed = await client.list_workspaces({"team": "lifecycle"})
            assert [w.workspace_id for w in listed] == [ws.workspace_id]
            container = docker_client.containers.get(ws.info.container_id)
            assert container.labels["sandboxd.managed"] == "true"
            assert container.labels["sandboxd.workspace_id"] == ws.workspace_id
            assert (
                docker_client.volumes.get(ws.info.volume_name).attrs["Labels"]["sandboxd.workspace_id"]
                == ws.workspace_id
            )
            result = await ws.exec('printf %s "$FOO"').wait()
            assert result.stdout == "bar"
        finally:
            await client.delete_workspace(ws.workspace_id)
        assert await client.list_workspaces({"team": "lifecycle"}) == []
        import docker.errors

        with pytest.raises(docker.errors.NotFound):
            docker_client.containers.get(ws.info.container_id)
        with pytest.raises(docker.errors.NotFound):
            docker_client.volumes.get(ws.info.volume_name)

    async def test_files_persist_on_the_volume(self, workspace) -> None:
        """Files written in /workspace are there for the next command."""
        await workspace.exec("echo data > kept.txt").wait(check=True)
        result = await workspace.exec("cat /workspace/kept.txt").wait()
        assert result.stdout == "data\n"

    async def test_chosen_id_and_duplicate(self, client) -> None:
        """A caller-chosen id is used; the same id again is ALREADY_EXISTS."""
        ws = await client.create_workspace(workspace_id="chosen-id-1")
        try:
            assert ws.workspace_id == "chosen-id-1"
            with pytest.raises(AlreadyExistsError, match="chosen-id-1"):
                await client.create_workspace(workspace_id="chosen-id-1")
        finally:
            await ws.delete()

    async def test_stopped_workspace_is_failed_precondition(self, client, docker_client) -> None:
        """Exec in a workspace whose container was stopped is FAILED_PRECONDITION."""
        ws = await client.create_workspace()
        try:
            docker_client.containers.get(ws.info.container_id).stop(timeout=1)
            with pytest.raises(FailedPreconditionError, match="not running"):
                await ws.exec("true").wait()
            assert (await ws.refresh()).state == "stopped"
        finally:
            await ws.delete()


class TestErrors:
    async def test_unknown_workspace_is_not_found(self, client) -> None:
        """Get, exec and delete of an unknown id are NOT_FOUND with the id in the message."""
        with pytest.raises(NotFoundError, match="ws-doesnotexist"):
            await client.get_workspace("ws-doesnotexist")
        with pytest.raises(NotFoundError, match="ws-doesnotexist"):
            await client.exec("ws-doesnotexist", "true").wait()
        with pytest.raises(NotFoundError, match="ws-doesnotexist"):
            await client.delete_workspace("ws-doesnotexist")

    async def test_negative_memory_is_invalid(self, client) -> None:
        """A negative memory limit is INVALID_ARGUMENT naming the field."""
        with pytest.raises(InvalidArgumentError, match="memory_bytes"):
            await client.create_workspace(memory_bytes=-1)

    @pytest.mark.parametrize(
        ("options", "field"),
        [
            ({"labels": {"sandboxd.managed": "false"}}, "reserved"),
            ({"env": {"BAD-NAME": "x"}}, "BAD-NAME"),
            ({"workspace_id": "Bad_Id"}, "workspace_id"),
            ({"added_capabilities": ["CAP_EVERYTHING"]}, "CAP_EVERYTHING"),
            ({"working_dir": "relative"}, "working_dir"),
            ({"pids": 3}, "pids"),
            ({"cpu_millis": 1}, "cpu_millis"),
        ],
    )
    async def test_invalid_specs(self, client, options, field) -> None:
        """Each malformed field is INVALID_ARGUMENT with a message naming it."""
        with pytest.raises(InvalidArgumentError, match=field):
            await client.create_workspace(**options)

    async def test_missing_image_is_not_found(self, client) -> None:
        """An image that is neither present nor pullable is NOT_FOUND naming it."""
        with pytest.raises(NotFoundError, match="sandboxd-test/no-such-image"):
            await client.create_workspace(image="sandboxd-test/no-such-image:1")

    async def test_long_commands(self, workspace) -> None:
        """A 100 KB command runs; one past the argv limit is INVALID_ARGUMENT naming the limit."""
        result = await workspace.exec(": " + "x" * 100_000 + "; echo ok").wait()
        assert result.stdout == "ok\n"
        with pytest.raises(InvalidArgumentError, match="limit is 122880"):
            await workspace.exec(": " + "x" * 130_000).wait()

    async def test_empty_command_is_invalid(self, workspace) -> None:
        """An empty command is INVALID_ARGUMENT."""
        with pytest.raises(InvalidArgumentError, match="command"):
            await workspace.exec("   ").wait()


class TestSyncClient:
    def test_blocking_client_round_trip(self, daemon) -> None:
        """SyncSandboxClient, as the README shows it: create, exec, files, errors, delete."""
        from sandboxd_client import CommandFailedError, NotFoundError, SyncSandboxClient

        with SyncSandboxClient(socket_path=daemon.socket_path, retries=False) as client:
            ws = client.create_workspace(labels={"test": "sync"})
            try:
                assert ws.exec("echo hi").stdout == "hi\n"
                assert ws.exec("exit 3").exit_code == 3
                # Nothing can write to a blocking exec's stdin: a reader ends at once, not at its timeout.
                assert (ws.exec("cat; echo end", timeout_s=30).stdout, ws.history[-1]) == (
                    "end\n",
                    ("cat; echo end", 0),
                )
                with pytest.raises(CommandFailedError):
                    ws.exec("exit 3", check=True)
                ws.write_file("notes.txt", "a\nb\n")
                assert ws.edit_file("notes.txt", "b", "B").replacements == 1
                assert "B" in ws.read_file("notes.txt").content
                assert [info.workspace_id for info in client.list_workspaces({"test": "sync"})] == [ws.workspace_id]
                ws.exec(
                    'python3 -u -c \'import socket; s = socket.socket(); s.bind(("127.0.0.1", 8004)); s.listen(1); '
                    'print("ready", flush=True); c, _ = s.accept(); c.sendall(b"from inside")\' &'
                    " until [ -e /proc/net/tcp ] && grep -q ':1F44 ' /proc/net/tcp; do sleep 0.05; done"
                )
                with ws.forward(8004) as address:
                    host, port = address.rsplit(":", 1)
                    with socket.create_connection((host, int(port)), timeout=30) as connection:
                        assert connection.recv(100) == b"from inside"
            finally:
                ws.delete()
            with pytest.raises(NotFoundError):
                client.get_workspace(ws.workspace_id)
