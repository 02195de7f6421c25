"""A command run as another user (ExecRequest.user), and what root may do (root_capabilities).

The workspace's own user has no capabilities. A caller may still run one command as root, or
as any user the image has, and give root commands a few capabilities at create: they reach a
command only when it runs as uid 0, whatever runtime.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sandboxd_client import FailedPreconditionError, InvalidArgumentError

from .helpers import skip_without

pytestmark = pytest.mark.docker

RUNTIMES = ["runc", pytest.param("runsc", marks=pytest.mark.runsc)]

_CHOWN, _DAC_OVERRIDE = 1 << 0, 1 << 1


@pytest.fixture
async def make(client, request: pytest.FixtureRequest) -> AsyncIterator[object]:  # type: ignore[no-untyped-def]
    """Create workspaces under the test's runtime; delete them afterwards."""
    made = []
    runtime = request.node.callspec.params["runtime"]
    skip_without(runtime, request)

    async def create(**options: object):  # type: ignore[no-untyped-def]
        workspace = await client.create_workspace(runtime=runtime, **options)
        made.append(workspace)
        return workspace

    yield create
    for workspace in made:
        await workspace.delete()


async def _capabilities(workspace, user: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    result = await workspace.exec("id -u; grep ^Cap /proc/self/status", user=user).wait(check=True)
    uid, *lines = result.stdout.splitlines()
    caps = {name.rstrip(":"): int(value, 16) for name, value in (line.split() for line in lines)}
    return {"uid": int(uid), **caps}


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_command_runs_as_the_user_it_names(make, runtime: str) -> None:  # type: ignore[no-untyped-def]
    workspace = await make()
    for user, expected in [
        ("", "1000 1000 sandbox"),
        ("root", "0 0 root"),
        ("0", "0 0 root"),
        ("sandbox", "1000 1000 sandbox"),
        ("nobody", "65534 65534 nobody"),
        ("1234:5678", "1234 5678 1234"),  # no name: id says the number
    ]:
        result = await workspace.exec("echo $(id -u) $(id -g) $(id -un 2>/dev/null)", user=user).wait()
        assert (result.stdout.strip(), result.exit_code) == (expected, 0), user


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_root_keeps_the_root_capabilities_and_no_one_else_does(make, runtime: str) -> None:  # type: ignore[no-untyped-def]
    workspace = await make(root_capabilities=["CHOWN", "cap_dac_override"])
    root = await _capabilities(workspace, "root")
    assert root["uid"] == 0
    assert (root["CapEff"], root["CapPrm"], root["CapBnd"]) == (_CHOWN | _DAC_OVERRIDE,) * 3
    for user in ("", "nobody"):
        other = await _capabilities(workspace, user)
        # gVisor's /proc has no CapAmb line (it has no ambient capabilities).
        assert (other["CapEff"], other["CapPrm"], other["CapBnd"], other.get("CapAmb", 0)) == (0, 0, 0, 0), user
    # What they are for: root hands a directory to a user, and writes a file no mode lets it.
    result = await workspace.exec(
        "mkdir /opt/theirs && chown nobody /opt/theirs && stat -c %U /opt/theirs"
        " && touch /etc/locked && chmod 0 /etc/locked && echo written > /etc/locked && cat /etc/locked",
        user="root",
    ).wait()
    assert (result.stdout, result.stderr, result.exit_code) == ("nobody\nwritten\n", "", 0)
    result = await workspace.exec("chown sandbox /opt/theirs").wait()
    assert "Operation not permitted" in result.stderr and result.exit_code == 1


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_root_without_root_capabilities_has_none(make, runtime: str) -> None:  # type: ignore[no-untyped-def]
    workspace = await make()
    root = await _capabilities(workspace, "root")
    assert (root["uid"], root["CapEff"], root["CapPrm"], root["CapBnd"]) == (0, 0, 0, 0)
    result = await workspace.exec("chown sandbox /etc/hostname", user="root").wait()
    assert "Operation not permitted" in result.stderr and result.exit_code == 1


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_user_the_image_lacks_is_invalid_argument_naming_it(make, runtime: str) -> None:  # type: ignore[no-untyped-def]
    workspace = await make()
    with pytest.raises(InvalidArgumentError, match="nosuchuser"):
        await workspace.exec("true", user="nosuchuser").wait()
    with pytest.raises(InvalidArgumentError, match="'a b' is not a user name"):
        await workspace.exec("true", user="a b").wait()
    assert (await workspace.exec("echo still here").wait()).stdout == "still here\n"


@pytest.mark.parametrize("runtime", [pytest.param("runsc", marks=pytest.mark.runsc)])
async def test_under_gvisor_an_added_capability_for_a_non_root_command_says_why(make, runtime: str) -> None:  # type: ignore[no-untyped-def]
    """gVisor has no ambient capabilities, the only way one reaches a non-root command: the start says so."""
    workspace = await make(added_capabilities=["NET_BIND_SERVICE"])
    with pytest.raises(FailedPreconditionError, match="no ambient capabilities"):
        await workspace.exec("true").wait()
    root = await _capabilities(workspace, "root")
    assert (root["uid"], root["CapEff"]) == (0, 1 << 10)  # NET_BIND_SERVICE: root keeps it
