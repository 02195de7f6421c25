"""Template builds: an image from a Dockerfile and a context, kept as the caller's snapshot.

Against the real engine's builder: what the steps made is in every workspace started from the
template (under runc and gVisor); the same content again is answered from the image at once;
two builds of one name at once make one image; a failing step says its output and leaves the
old template as it was; a missing base image is named; a build past its timeout or cancelled
stops its step's container; a context past the limit is refused as it arrives.
"""

from __future__ import annotations

import asyncio
import io
import secrets
import tarfile
import time
from pathlib import Path

import pytest
from sandboxd_client import (
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    SandboxClient,
)

from tests.conftest import DaemonThread, make_settings

from .helpers import skip_without

pytestmark = pytest.mark.docker

RUNTIMES = ["runc", pytest.param("runsc", marks=pytest.mark.runsc)]


def tar_of(files: dict[str, bytes]) -> bytes:
    """An uncompressed tar archive of ``files`` (path -> content)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def build_containers(docker_client, marker: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Containers (any state) whose command holds ``marker``: a build step's, left or not."""
    found = []
    for container in docker_client.containers.list(all=True):
        command = " ".join(container.attrs.get("Config", {}).get("Cmd") or [])
        if marker in command:
            found.append(container.id)
    return found


@pytest.fixture
async def own(tmp_path: Path, default_image: str):  # type: ignore[no-untyped-def]
    """A daemon of its own with a small context limit and a 3 s ready bound, and its client."""
    settings = make_settings(tmp_path, template_context_bytes=2 * 1024 * 1024, template_ready_timeout_s=3.0)
    thread = DaemonThread(settings).start()
    try:
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            yield client
    finally:
        thread.stop()


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_built_template_holds_what_its_steps_made(
    own: SandboxClient, default_image: str, runtime: str, request: pytest.FixtureRequest
) -> None:
    """COPY from the context, a multi-step RUN, ENV and WORKDIR are in a workspace started from it."""
    skip_without(runtime, request)
    context = tar_of({"app/main.py": b"print('hello from the template')\n", "data.txt": b"payload-1\n"})
    dockerfile = (
        f"FROM {default_image}\n"
        "USER root\n"
        "COPY app /opt/app\n"
        "COPY data.txt /opt/data.txt\n"
        "RUN mkdir -p /srv/made && echo step-one > /srv/made/one \\\n"
        " && echo step-two > /srv/made/two && chmod -R a+rX /srv/made\n"
        "ENV TEMPLATE_FLAVOUR=mint\n"
        "WORKDIR /srv/made\n"
    )
    lines: list[str] = []
    built = await own.build_template("tpl-steps", dockerfile, context=context, on_log=lines.append)
    assert built.cached is False
    assert built.template.is_template and built.template.name == "tpl-steps"
    assert any(line.startswith("Step ") and "COPY app /opt/app" in line for line in lines), lines
    workspace = await own.create_workspace(from_snapshot="tpl-steps", runtime=runtime)
    try:
        result = await workspace.exec(
            'python3 /opt/app/main.py; cat /opt/data.txt; cat one two; echo "$TEMPLATE_FLAVOUR"; pwd'
        ).wait()
        assert (result.exit_code, result.stdout) == (
            0,
            "hello from the template\npayload-1\nstep-one\nstep-two\nmint\n/srv/made\n",
        )
    finally:
        await workspace.delete()
    assert [s.name for s in await own.list_snapshots()] == ["tpl-steps"]
    # Its name works as an image too; a snapshot taken of a workspace does not.
    by_image = await own.create_workspace(image="tpl-steps", runtime=runtime)
    try:
        assert (await by_image.exec("pwd; cat one").wait()).stdout == "/srv/made\nstep-one\n"
        await by_image.snapshot("taken-not-built")
        with pytest.raises(NotFoundError):
            await own.create_workspace(image="taken-not-built")
        await own.delete_snapshot("taken-not-built")
    finally:
        await by_image.delete()
    await own.delete_snapshot("tpl-steps")
    with pytest.raises(NotFoundError):
        await own.get_snapshot("tpl-steps")


async def test_the_same_content_again_is_answered_from_the_image(own: SandboxClient, default_image: str) -> None:
    """A second build of the same Dockerfile and context is cached, in well under a second; a change builds."""
    dockerfile = f"FROM {default_image}\nCOPY note /note\n"
    start = 'echo "$HOME \\ it\'s"\nsleep 1 # two lines'
    first = await own.build_template("tpl-cache", dockerfile, context=tar_of({"note": b"one"}), start_command=start)
    assert (first.template.start_command, first.template.ready_command) == (start, "")
    started = time.monotonic()
    again = await own.build_template("tpl-cache", dockerfile, context=tar_of({"note": b"one"}), start_command=start)
    took = time.monotonic() - started
    assert again.cached is True and again.template.build_digest == first.template.build_digest
    assert took < 1.0, f"a cached build took {took:.2f} s"
    changed = await own.build_template("tpl-cache", dockerfile, context=tar_of({"note": b"two"}))
    assert changed.cached is False and changed.template.build_digest != first.template.build_digest
    forced = await own.build_template("tpl-cache", dockerfile, context=tar_of({"note": b"two"}), force=True)
    assert forced.cached is False


async def test_two_builds_of_one_name_at_once_make_one_template(own: SandboxClient, default_image: str) -> None:
    """Parallel trials building the same template: both succeed, one builds, the other is answered from it."""
    dockerfile = f"FROM {default_image}\nUSER root\nRUN echo parallel > /parallel\n"
    results = await asyncio.gather(*(own.build_template("tpl-twice", dockerfile) for _ in range(2)))
    assert sorted(r.cached for r in results) == [False, True]
    assert len({r.template.build_digest for r in results}) == 1
    assert [s.name for s in await own.list_snapshots()] == ["tpl-twice"]


async def test_a_failing_step_says_its_output_and_keeps_the_old_template(
    own: SandboxClient, default_image: str
) -> None:
    """RUN that prints and exits 3: FAILED_PRECONDITION with that output; the template built before stays."""
    await own.build_template("tpl-fail", f"FROM {default_image}\nUSER root\nRUN echo good > /good\n")
    bad = f"FROM {default_image}\nRUN echo first-line\nRUN echo the-reason-it-broke >&2; exit 3\n"
    with pytest.raises(FailedPreconditionError) as caught:
        await own.build_template("tpl-fail", bad)
    assert "step 3 failed" in caught.value.message and "the-reason-it-broke" in caught.value.message
    assert "non-zero code: 3" in caught.value.message
    workspace = await own.create_workspace(from_snapshot="tpl-fail")
    try:
        assert (await workspace.exec("cat /good").wait()).stdout == "good\n"
    finally:
        await workspace.delete()


async def test_a_base_image_the_engine_lacks_is_named(own: SandboxClient) -> None:
    """FROM an image that is not there (no registry answers): NOT_FOUND naming it, nothing built."""
    missing = f"sandboxd-test/never-built-{secrets.token_hex(4)}:1"
    with pytest.raises(NotFoundError) as caught:
        await own.build_template("tpl-missing", f"FROM {missing}\nRUN true\n")
    assert missing in caught.value.message
    assert await own.list_snapshots() == []


async def test_bad_requests_are_clean_errors(own: SandboxClient, default_image: str) -> None:
    """A bad name, an empty Dockerfile, a context that is no tar, a relative working_dir: INVALID_ARGUMENT."""
    cases = [
        ("../up", f"FROM {default_image}\n", b"", ""),
        ("tpl-empty", "  \n", b"", ""),
        ("tpl-notar", f"FROM {default_image}\n", b"this is not a tar archive" * 100, ""),
        ("tpl-relative", f"FROM {default_image}\n", b"", "relative/dir"),
    ]
    for name, dockerfile, context, working_dir in cases:
        with pytest.raises(InvalidArgumentError):
            await own.build_template(name, dockerfile, context=context, working_dir=working_dir)
    assert await own.list_snapshots() == []


async def test_a_context_past_the_limit_is_refused_as_it_arrives(own: SandboxClient, default_image: str) -> None:
    """3 MiB of context against a 2 MiB limit: RESOURCE_EXHAUSTED, nothing built."""

    async def pieces():  # type: ignore[no-untyped-def]
        for _ in range(3):
            yield b"\0" * (1024 * 1024)

    with pytest.raises(ResourceExhaustedError) as caught:
        await own.build_template("tpl-big", f"FROM {default_image}\n", context=pieces())
    assert "SANDBOXD_TEMPLATE_CONTEXT_BYTES" in caught.value.message
    assert await own.list_snapshots() == []


async def test_a_build_past_its_timeout_stops_its_step(own: SandboxClient, default_image: str, docker_client) -> None:  # type: ignore[no-untyped-def]
    """A step that sleeps past the build's 10 s timeout: DEADLINE_EXCEEDED soon after, its container gone."""
    marker = f"sleep-{secrets.token_hex(4)}"
    dockerfile = f"FROM {default_image}\nRUN echo {marker}; sleep 600\n"
    seen: list[str] = []
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        await own.build_template("tpl-slow", dockerfile, timeout_s=10, on_log=seen.append)
    assert time.monotonic() - started < 40
    assert marker in seen  # the step did run (and printed) before it was stopped
    deadline = time.monotonic() + 20
    while build_containers(docker_client, marker) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert build_containers(docker_client, marker) == []
    assert await own.list_snapshots() == []


async def test_a_cancelled_build_stops_its_step(own: SandboxClient, default_image: str, docker_client) -> None:  # type: ignore[no-untyped-def]
    """The caller gives up once the step runs: the engine stops it and keeps nothing."""
    marker = f"cancel-{secrets.token_hex(4)}"
    running = asyncio.Event()

    def on_log(line: str) -> None:
        if line == marker:
            running.set()

    build = asyncio.ensure_future(
        own.build_template("tpl-cancel", f"FROM {default_image}\nRUN echo {marker}; sleep 600\n", on_log=on_log)
    )
    await asyncio.wait_for(running.wait(), 60)
    assert build_containers(docker_client, marker) != []
    build.cancel()
    with pytest.raises(asyncio.CancelledError):
        await build
    deadline = time.monotonic() + 20
    while build_containers(docker_client, marker) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert build_containers(docker_client, marker) == []
    assert await own.list_snapshots() == []


SERVER = "python3 -m http.server 8123 --bind 127.0.0.1 --directory /opt/site"
FETCH = "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8123/').read().decode())\""


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_workspace_from_a_template_is_handed_out_once_ready(
    own: SandboxClient, default_image: str, runtime: str, request: pytest.FixtureRequest
) -> None:
    """The start command (a web server) runs in the background; the create returns once the ready
    command (a fetch from it) succeeds, so the first command reaches the server without waiting."""
    skip_without(runtime, request)
    dockerfile = f"FROM {default_image}\nUSER root\nRUN mkdir -p /opt/site && echo served-page > /opt/site/index.html\n"
    await own.build_template("tpl-ready", dockerfile, start_command=SERVER, ready_command=FETCH)
    workspace = await own.create_workspace(from_snapshot="tpl-ready", runtime=runtime)
    try:
        assert (await workspace.exec(FETCH).wait()).stdout == "served-page\n\n"  # the page, and print's newline
        listed = await own.list_processes(workspace.workspace_id)
        assert [p.running for p in listed if p.command == SERVER] == [True]
        # The ready command's tries left no sessions: the one fetch listed is the test's own.
        assert [p.command for p in listed if p.command == FETCH] == [FETCH]
    finally:
        await workspace.delete()


async def test_a_template_that_never_gets_ready_is_no_workspace(own: SandboxClient, default_image: str) -> None:
    """A ready command that always fails: FAILED_PRECONDITION after its 3 s bound, with its output; nothing left."""
    await own.build_template(
        "tpl-never", f"FROM {default_image}\n", ready_command="echo not-yet-because-reasons; exit 1"
    )
    started = time.monotonic()
    with pytest.raises(FailedPreconditionError) as caught:
        await own.create_workspace(from_snapshot="tpl-never")
    assert 3 <= time.monotonic() - started < 30
    assert "not-yet-because-reasons" in caught.value.message and "exit 1" in caught.value.message
    assert await own.list_workspaces() == []
