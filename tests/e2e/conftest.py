"""pytest-docker fixtures: the daemon image under docker compose, reached through a shared socket."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

E2E_INSTANCE = f"e2e-{secrets.token_hex(4)}"


@pytest.fixture(scope="session")
def e2e_run_dir() -> Iterator[Path]:
    """Host directory mounted as the container's /run/sandboxd (its socket appears here)."""
    path = Path(tempfile.mkdtemp(prefix="sandboxd-e2e-"))
    path.chmod(0o777)  # the daemon runs as uid 10001 in its container
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def docker_compose_file() -> str:
    return str(Path(__file__).with_name("docker-compose.yml"))


@pytest.fixture(scope="session")
def docker_compose_command() -> str:
    """`docker compose` where the CLI plugin exists, else the standalone `docker-compose`."""
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    if probe.returncode == 0:
        return "docker compose"
    if shutil.which("docker-compose"):
        return "docker-compose"
    pytest.fail("neither `docker compose` nor `docker-compose` is available")


@pytest.fixture(scope="session")
def docker_compose_project_name() -> str:
    return f"sandboxd{E2E_INSTANCE.replace('-', '')}"


@pytest.fixture(scope="session")
def docker_setup(e2e_run_dir: Path) -> list[str]:
    """Point the compose file at this run's image, socket directory, label and socket group.

    The image is this tree's daemon, built here (``scripts/build-daemon-image``, about 40 s, while
    the other workers go on), unless ``SANDBOXD_DAEMON_IMAGE`` names one to test instead.
    """
    image = os.environ.get("SANDBOXD_DAEMON_IMAGE", "")
    if not image:
        image = "sandboxd/daemon:dev"
        script = Path(__file__).resolve().parents[2] / "scripts" / "build-daemon-image"
        env = {**os.environ, "PYTHON": sys.executable}
        built = subprocess.run([str(script), image], capture_output=True, text=True, check=False, env=env)
        if built.returncode != 0:
            pytest.fail(f"building the daemon image failed: {(built.stdout + built.stderr)[-3000:]}")
    probe = subprocess.run(["docker", "image", "inspect", image], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.fail(f"the daemon image {image} is missing")
    os.environ.update(
        {
            "SANDBOXD_IMAGE": image,
            "E2E_RUN_DIR": str(e2e_run_dir),
            "E2E_INSTANCE": E2E_INSTANCE,
            "DOCKER_GID": str(os.stat("/var/run/docker.sock").st_gid),
        }
    )
    return ["up -d"]


@pytest.fixture(scope="session")
def docker_cleanup() -> list[str]:
    return ["down -v"]
