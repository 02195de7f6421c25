"""E2B's template builds through the unmodified ``e2b`` SDK: ``Template.build``, ``exists``, then sandboxes of it.

The SDK builds from images this engine has (no registry answers here): the default workspace
image, or one built FROM it by the test. Its COPY steps upload their files to the plane, its RUN,
ENV, WORKDIR and USER steps become the build's Dockerfile, and its log is polled as E2B's is.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox, Template
from e2b.exceptions import BuildException

from tests.conftest import DaemonThread, make_settings

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def e2b_daemon(tmp_path_factory: pytest.TempPathFactory, e2b_image: str) -> Iterator[DaemonThread]:
    """A daemon with the E2B plane on, its template uploads limited to 4 MiB."""
    settings = make_settings(
        tmp_path_factory.mktemp("e2b-templates"), e2b_address="127.0.0.1:0", template_context_bytes=4 << 20
    )
    thread = DaemonThread(settings).start()
    yield thread
    thread.stop()


def test_a_template_built_by_the_sdk_runs_its_sandboxes(e2b_env: str, default_image: str, tmp_path: Path) -> None:
    """from_image, COPY of a directory and a file, RUN as root, ENV, WORKDIR: all in a sandbox of it."""
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text("print('built by the sdk')\n")
    (tmp_path / "notes.txt").write_text("note-1\n")
    template = (
        Template(file_context_path=str(tmp_path))
        .from_image(default_image)
        .copy("app", "/home/user/app")
        .copy("notes.txt", "/opt/notes.txt", mode=0o600, user="root")
        .run_cmd("mkdir -p /srv/tool && echo tool-made > /srv/tool/made && chmod -R a+rX /srv/tool", user="root")
        .set_envs({"TOOL_HOME": "/srv/tool"})
        .set_workdir("/home/user/app")
    )
    logs: list[str] = []
    info = Template.build(template, "sdk-built", on_build_logs=lambda entry: logs.append(entry.message))
    assert info.template_id == "sdk-built"
    assert any("COPY" in line for line in logs), logs
    assert Template.exists("sdk-built") is True
    assert Template.exists("never-built") is False
    sandbox = Sandbox.create(template="sdk-built")
    try:
        result = sandbox.commands.run("python3 main.py; cat $TOOL_HOME/made; pwd; id -un")
        assert result.stdout == "built by the sdk\ntool-made\n/home/user/app\nuser\n"
        listed = sandbox.commands.run("stat -c '%a %U' /opt/notes.txt", user="root").stdout
        assert listed == "600 root\n"
    finally:
        sandbox.kill()
    # The same template again: every upload is present and the build is answered from the image.
    logs.clear()
    started = time.monotonic()
    Template.build(template, "sdk-built", on_build_logs=lambda entry: logs.append(entry.message))
    assert any("already cached" in line for line in logs), logs
    assert any("cached" in line and "ready" in line for line in logs), logs
    assert time.monotonic() - started < 5


def test_a_failing_step_fails_the_build_with_its_output(e2b_env: str, default_image: str) -> None:
    """RUN that prints its reason and exits 5: BuildException carrying that output; no template."""
    template = Template().from_image(default_image).run_cmd("echo the-step-said-this; exit 5")
    with pytest.raises(BuildException) as caught:
        Template.build(template, "sdk-fails")
    assert "the-step-said-this" in str(caught.value)
    assert Template.exists("sdk-fails") is False


def test_a_missing_base_image_is_named(e2b_env: str) -> None:
    """from_image of an image the engine lacks: the build fails naming it."""
    template = Template().from_image("sandboxd-test/absent-image:1").run_cmd("true")
    with pytest.raises(BuildException) as caught:
        Template.build(template, "sdk-absent")
    assert "sandboxd-test/absent-image:1" in str(caught.value)


def test_parallel_builds_of_one_alias_make_one_template(e2b_env: str, default_image: str) -> None:
    """Four trials check ``exists`` and build the same alias at once: all succeed, one template."""
    template = Template().from_image(default_image).run_cmd("echo parallel > /tmp/parallel")
    barrier = threading.Barrier(4)

    def trial() -> str:
        barrier.wait()
        if not Template.exists("sdk-parallel"):
            Template.build(template, "sdk-parallel")
        sandbox = Sandbox.create(template="sdk-parallel")
        try:
            return sandbox.commands.run("cat /tmp/parallel").stdout
        finally:
            sandbox.kill()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda _: trial(), range(4))) == ["parallel\n"] * 4


def test_an_upload_past_the_limit_is_refused(e2b_env: str, default_image: str, tmp_path: Path) -> None:
    """A COPY of 6 MiB of incompressible bytes against a 4 MiB upload limit: the build fails, nothing kept."""
    (tmp_path / "big.bin").write_bytes(__import__("os").urandom(6 << 20))
    template = Template(file_context_path=str(tmp_path)).from_image(default_image).copy("big.bin", "/tmp/big.bin")
    with pytest.raises(Exception) as caught:
        Template.build(template, "sdk-too-big")
    assert "413" in str(caught.value) or "at most" in str(caught.value)
    assert Template.exists("sdk-too-big") is False
