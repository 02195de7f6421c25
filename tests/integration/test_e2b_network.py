"""E2B's network options through the unmodified ``e2b`` SDK: the create's allow and deny lists and ``update_network``.

They become sandboxd's network policy and egress allowlist, read back here through sandboxd's
own API; what the allowlist cannot express is refused, never accepted and then not applied.
(The allowlist's enforcement has tests of its own, against its proxy.)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException
from sandboxd_client import SandboxClient

from tests.conftest import DaemonThread, make_settings

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def e2b_daemon(tmp_path_factory: pytest.TempPathFactory, e2b_image: str) -> Iterator[DaemonThread]:
    """A daemon with the E2B plane on."""
    thread = DaemonThread(make_settings(tmp_path_factory.mktemp("e2b-network"), e2b_address="127.0.0.1:0")).start()
    yield thread
    thread.stop()


async def network_of(daemon: DaemonThread, sandbox_id: str) -> tuple[str, list[str]]:
    async with SandboxClient(socket_path=daemon.socket_path, retries=False) as client:
        info = (await client.get_workspace(sandbox_id)).info
        return info.network, [rule.split(":")[0] for rule in info.allowed_hosts]


async def test_a_deny_all_with_allowed_hosts_is_the_allowlist(e2b_env: str, e2b_daemon: DaemonThread) -> None:
    sandbox = Sandbox.create(network={"deny_out": ["0.0.0.0/0"], "allow_out": ["example.com", "10.9.0.0/16"]})
    try:
        assert await network_of(e2b_daemon, sandbox.sandbox_id) == ("allowlist", ["example.com", "10.9.0.0/16"])
        # update_network replaces it whole: denying everything now is no network at all.
        sandbox.update_network({"deny_out": ["0.0.0.0/0"]})
        assert await network_of(e2b_daemon, sandbox.sandbox_id) == ("none", [])
        assert sandbox.commands.run("echo still-here").stdout == "still-here\n"
    finally:
        sandbox.kill()


def test_what_the_allowlist_cannot_express_is_refused(e2b_env: str) -> None:
    with pytest.raises(SandboxException) as caught:
        Sandbox.create(network={"deny_out": ["10.0.0.0/8"]})
    assert "deny 0.0.0.0/0" in str(caught.value)
