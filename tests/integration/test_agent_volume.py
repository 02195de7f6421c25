"""The agent's volume: filled once per agent digest, and no debris of a fill outlives its daemon."""

from __future__ import annotations

import os

import docker
import pytest

from sandboxd.agentbuild import AgentBuild, ensure_agent
from sandboxd.backend.docker import DockerBackend
from sandboxd.settings import Settings
from tests.conftest import new_instance

pytestmark = pytest.mark.docker


async def test_a_filler_left_by_a_killed_daemon_is_removed_by_the_next_fill(
    docker_client: docker.DockerClient, default_image: str
) -> None:
    """A daemon killed while its filler ran leaves that container, exited; the next daemon's
    fill (every start has one) removes it, and leaves a filler that is running alone."""
    instance = new_instance()
    backend = DockerBackend(
        docker_host=Settings.from_env(dict(os.environ)).docker_host, instance=instance, retries=False
    )
    try:
        build = await ensure_agent(backend, route="auto", progress=lambda line: None)
        path = AgentBuild.binary_dir(await backend.architecture())
        labels = {"sandboxd.managed": "true", "sandboxd.volume.kind": "agent-filler", "sandboxd.instance": instance}
        debris = docker_client.containers.run(
            build.image, [f"{path}/sandboxd-agent", "version"], labels=labels, network_mode="none", detach=True
        )
        assert debris.wait(timeout=60)["StatusCode"] == 0
        running = docker_client.containers.run(
            build.image, [f"{path}/sandboxd-agent", "hold"], labels=labels, stdin_open=True, detach=True
        )
        try:
            await backend.fill_volume(build.volume, image=build.image, path=path, labels={})
            with pytest.raises(docker.errors.NotFound):
                docker_client.containers.get(debris.id)
            assert docker_client.containers.get(running.id).status == "running"  # another daemon's, at work
        finally:
            running.remove(force=True)
    finally:
        await backend.close()
