"""Any image works: the core of the exec, Ctrl-C, timeout and file suites on four images (issue 11).

The agent is the only thing of sandboxd in a workspace, and it needs nothing from the
image: the default image; Debian without python3; Debian without bash (commands run
under ``sh -c``); and ``FROM scratch`` with only Debian's busybox-static (no libc, no
/etc/passwd). Each runs under runc and gVisor's runsc.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from .helpers import collect, start_ready

pytestmark = pytest.mark.docker

IMAGES = ("default", "nopython", "nobash", "busybox")
BUSYBOX_IMAGE = "sandboxd-test/busybox:1"


@pytest.fixture(scope="session")
def busybox_image(docker_client, default_image: str) -> str:  # type: ignore[no-untyped-def]
    """``images/busybox``: FROM scratch plus busybox-static, built from the local Debian base."""
    recipe = Path(__file__).resolve().parents[2] / "images" / "busybox"
    docker_client.images.build(
        path=str(recipe), tag=BUSYBOX_IMAGE, buildargs={"BASE_IMAGE": default_image}, rm=True, forcerm=True
    )
    return BUSYBOX_IMAGE


@pytest.fixture(params=IMAGES)
def image(request: pytest.FixtureRequest, default_image: str) -> str:
    """Each of the four images."""
    if request.param == "default":
        return default_image
    if request.param == "busybox":
        return str(request.getfixturevalue("busybox_image"))
    return str(request.getfixturevalue("derived_images")[request.param])


@pytest.fixture
async def workspace(client, image: str, runtime: str, request: pytest.FixtureRequest) -> AsyncIterator[object]:  # type: ignore[no-untyped-def]
    """A workspace of ``image`` under ``runtime``."""
    if runtime == "runsc" and not request.getfixturevalue("runsc_available"):
        pytest.skip("the engine has no runsc runtime (scripts/install-runsc registers it)")
    created = await client.create_workspace(image=image, runtime=runtime, labels={"test": "any-image"})
    yield created
    await client.delete_workspace(created.workspace_id)


async def processes(workspace) -> list[str]:  # type: ignore[no-untyped-def]
    """Command lines of the workspace's live processes, read from /proc (busybox has no full ps)."""
    script = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done 2>/dev/null"
    result = await workspace.exec(script).wait()
    return [line.strip() for line in result.stdout.splitlines() if line.strip()]


async def test_echo(workspace) -> None:
    """`echo hi` is exactly hi\\n, exit 0."""
    result = await workspace.exec("echo hi").wait()
    assert (result.stdout_bytes, result.stderr_bytes, result.exit_code, result.stop_reason) == (
        b"hi\n",
        b"",
        0,
        "exited",
    )


async def test_sigkill_is_137(workspace) -> None:
    """`kill -9 $$` is 137, SIGKILL."""
    result = await workspace.exec("kill -9 $$").wait()
    assert (result.exit_code, result.signal) == (137, "SIGKILL")


async def test_ctrl_c_is_130(workspace) -> None:
    """Ctrl-C on `sleep 100` ends it with 130, SIGINT, interrupted."""
    process_id = await start_ready(workspace, "echo ready; sleep 100")
    events, _, _ = await collect(workspace.client.input(process_id, "\u0003"))
    final = events[-1]
    assert (final.exit_code, final.signal, final.stop_reason) == (130, "SIGINT", "interrupted")


async def test_timeout_leaves_nothing(workspace) -> None:
    """A timeout ends `sleep 1000 & setsid sleep 1001 & sleep 1002` and everything it started."""
    started = time.monotonic()
    result = await workspace.exec("sleep 1000 & setsid sleep 1001 & sleep 1002", timeout_s=2, follow=True).wait()
    assert result.stop_reason == "timeout"
    assert time.monotonic() - started < 15
    assert [p for p in await processes(workspace) if "sleep 100" in p] == []


async def test_write_then_read(workspace) -> None:
    """write_file then read_file give back exactly what was written, and the bytes on disk are it."""
    text = "first line\n  ünïcode ✓\n\tlast\n"
    await workspace.write_file("notes/round.txt", text)
    page = await workspace.read_file("notes/round.txt")
    assert page.content.splitlines() == ["     1\tfirst line", "     2\t  ünïcode ✓", "     3\t\tlast"]
    result = await workspace.exec("base64 notes/round.txt").wait()
    assert base64.b64decode(result.stdout) == text.encode()


async def test_edit_keeps_crlf(workspace) -> None:
    """edit_file on a CRLF file changes the text and keeps every CRLF."""
    await workspace.write_file("crlf.ini", b"x=1\r\ny=2\r\n")
    await workspace.edit_file("crlf.ini", "y=2", "y=3")
    result = await workspace.exec("base64 crlf.ini").wait()
    assert base64.b64decode(result.stdout) == b"x=1\r\ny=3\r\n"
