"""Inspect AI's own conformance checks for sandbox providers, run against sandboxd.

``inspect_ai.util._sandbox.self_check`` is the suite Inspect runs on its docker and local
providers (44 checks in inspect-ai 0.3.285: files text and binary, 50 MiB both ways, UTF-8,
permissions, directories, exec with input, cwd, env, users, timeouts that kill a whole tree,
output limits). They are imported as they are published, with a ``sandbox_env`` fixture
giving one workspace per runtime, shared by the checks (they clean up after themselves), as
Inspect's own runner does. None is marked xfail.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from inspect_ai.util import SandboxEnvironment
from inspect_ai.util._sandbox.self_check import *  # noqa: F403
from sandboxd_client.inspect import SandboxdConfig, SandboxdSandboxEnvironment

from tests.conftest import DaemonThread

pytestmark = [pytest.mark.docker, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(
    scope="module", loop_scope="module", params=["runc", pytest.param("runsc", marks=pytest.mark.runsc)]
)
async def _environment(
    request: pytest.FixtureRequest, daemon: DaemonThread, runsc_available: bool
) -> AsyncIterator[SandboxEnvironment]:
    if request.param == "runsc" and not runsc_available:
        pytest.skip("the engine has no runsc runtime")
    task = f"self_check_{request.param}"
    config = SandboxdConfig(address=f"unix:{daemon.socket_path}", runtime=request.param)
    await SandboxdSandboxEnvironment.task_init(task, config)
    environments = await SandboxdSandboxEnvironment.sample_init(task, config, {"__sample_id__": 1})
    try:
        yield environments["default"]
    finally:
        await SandboxdSandboxEnvironment.sample_cleanup(task, config, environments, interrupted=False)
        await SandboxdSandboxEnvironment.task_cleanup(task, config, cleanup=True)


@pytest.fixture
def sandbox_env(_environment: SandboxEnvironment) -> SandboxEnvironment:
    """The workspace every check of one runtime shares (function-scoped, as Inspect asks)."""
    return _environment
