"""gVisor (runsc) workspaces: what is the same as under runc, and what the daemon refuses."""

from __future__ import annotations

import pytest
from sandboxd_client import InvalidArgumentError

pytestmark = [pytest.mark.docker, pytest.mark.runsc]


@pytest.fixture(autouse=True)
def _needs_runsc(runsc_available: bool) -> None:
    if not runsc_available:
        pytest.skip("the engine has no runsc runtime (scripts/install-runsc registers it)")


@pytest.mark.workspace(runtime="runsc")
async def test_runsc_workspace_runs_under_gvisor(workspace) -> None:  # type: ignore[no-untyped-def]
    assert workspace.info.runtime == "runsc"
    assert (await workspace.exec("echo hi").wait()).stdout == "hi\n"
    first = (await workspace.exec("dmesg | head -1").wait()).stdout
    assert "gVisor" in first
    # The same hardening as under runc: not root, no capabilities.
    identity = (
        await workspace.exec(
            "id -u; grep CapEff /proc/self/status; cat /sys/class/net/*/operstate 2>/dev/null | sort | uniq"
        ).wait()
    ).stdout
    lines = identity.split("\n")
    assert lines[0] == "1000"
    assert lines[1].split()[1] == "0000000000000000"


async def test_bridge_network_under_runsc_is_refused(client) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgumentError, match="network 'bridge' is not available under runtime 'runsc'"):
        await client.create_workspace(runtime="runsc", network="bridge")


@pytest.mark.workspace(runtime="runsc", disk_bytes=16 * 1024**2, read_only_root_filesystem=True)
async def test_disk_cap_and_read_only_root_under_runsc(workspace) -> None:  # type: ignore[no-untyped-def]
    result = await workspace.exec("dd if=/dev/zero of=/workspace/fill bs=1M count=64; touch /home/sandbox/x").wait()
    assert "No space left on device" in result.stderr
    assert "Read-only file system" in result.stderr
    assert int((await workspace.exec("stat -c %s /workspace/fill").wait()).stdout) <= 16 * 1024**2
