"""The daemon's own image under docker compose, driven by the real client (pytest-docker)."""

from __future__ import annotations

import time
from pathlib import Path

import docker
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sandboxd_client import Exited, Output, SandboxClient, Yielded

from tests.e2e.conftest import E2E_INSTANCE

pytestmark = pytest.mark.e2e


def _healthy(socket_path: Path) -> bool:
    if not socket_path.exists():
        return False
    try:
        with grpc.insecure_channel(f"unix:{socket_path}") as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    except grpc.RpcError:
        return False
    return response.status == health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="session")
def daemon_socket(docker_services, e2e_run_dir: Path) -> Path:
    """The containerised daemon's socket, once health says SERVING."""
    socket_path = e2e_run_dir / "sandboxd.sock"
    docker_services.wait_until_responsive(check=lambda: _healthy(socket_path), timeout=90, pause=0.5)
    return socket_path


def _leftovers() -> tuple[list[str], list[str]]:
    client = docker.from_env()
    try:
        selector = {"label": f"sandboxd.instance={E2E_INSTANCE}"}
        # Workspaces left behind: the running daemon's own lease (no sandboxd.managed label) is none.
        managed = {"label": [f"sandboxd.instance={E2E_INSTANCE}", "sandboxd.managed=true"]}
        containers = [c.name for c in client.containers.list(all=True, filters=managed, ignore_removed=True)]
        volumes = [v.name for v in client.volumes.list(filters=selector)]
        return containers, volumes
    finally:
        client.close()


class TestDaemonImage:
    async def test_health_and_runs_as_non_root(self, daemon_socket: Path, docker_compose_project_name: str) -> None:
        """The containerised daemon answers SERVING, runs as a non-root user, and Docker calls it healthy."""
        async with SandboxClient(socket_path=str(daemon_socket), retries=False) as client:
            assert await client.health() == "SERVING"
        client = docker.from_env()
        try:
            selector = {"label": f"com.docker.compose.project={docker_compose_project_name}"}
            (container,) = client.containers.list(filters=selector, ignore_removed=True)
            deadline = time.monotonic() + 60
            while container.attrs["State"]["Health"]["Status"] != "healthy" and time.monotonic() < deadline:
                time.sleep(1)
                container.reload()
            user = container.exec_run(["id", "-u"]).output.decode().strip()
        finally:
            client.close()
        assert container.attrs["Config"]["User"] == "sandboxd"
        assert user == "10001"
        assert container.attrs["State"]["Health"]["Status"] == "healthy"

    async def test_workspace_exec_ctrl_c_edit_delete(self, daemon_socket: Path) -> None:
        """Create, stream output live, Ctrl-C, edit a file, delete — and nothing leaks."""
        async with SandboxClient(socket_path=str(daemon_socket), retries=False) as client:
            ws = await client.create_workspace(labels={"e2e": "flow"})
            try:
                arrivals = []
                start = time.monotonic()
                async for event in ws.exec("for i in 1 2 3; do echo tick $i; sleep 0.4; done"):
                    if isinstance(event, Output):
                        arrivals.append((time.monotonic() - start, event.text))
                assert "".join(text for _, text in arrivals) == "tick 1\ntick 2\ntick 3\n"
                assert arrivals[-1][0] - arrivals[0][0] > 0.6, "output must stream as produced, not at the end"

                events = [e async for e in ws.exec("sleep 60", yield_after_s=0.5)]
                assert isinstance(events[-1], Yielded)
                stopped = [e async for e in client.input(events[-1].process_id, "\u0003")]
                assert isinstance(stopped[-1], Exited)
                assert (stopped[-1].exit_code, stopped[-1].stop_reason) == (130, "interrupted")

                await ws.write_file("app.cfg", "mode=slow\nlevel=1\n")
                edit = await ws.edit_file("app.cfg", "mode=slow", "mode=fast")
                assert edit.replacements == 1
                assert (await ws.exec("cat app.cfg").wait()).stdout == "mode=fast\nlevel=1\n"
            finally:
                await ws.delete()
        assert _leftovers() == ([], [])

    async def test_survives_a_restart_of_its_container(self, docker_services, daemon_socket: Path) -> None:
        """`docker restart` of the daemon: health comes back and the workspace is still listed and usable."""
        async with SandboxClient(socket_path=str(daemon_socket), retries=False) as client:
            ws = await client.create_workspace(labels={"e2e": "restart"})
            await ws.write_file("kept.txt", "still here\n")
        try:
            docker_services._docker_compose.execute("restart sandboxd")
            docker_services.wait_until_responsive(check=lambda: _healthy(daemon_socket), timeout=90, pause=0.5)
            async with SandboxClient(socket_path=str(daemon_socket), retries=False) as client:
                listed = [w.workspace_id for w in await client.list_workspaces({"e2e": "restart"})]
                assert listed == [ws.workspace_id]
                again = await client.get_workspace(ws.workspace_id)
                assert (await again.exec("cat kept.txt").wait()).stdout == "still here\n"
        finally:
            async with SandboxClient(socket_path=str(daemon_socket), retries=False) as client:
                await client.delete_workspace(ws.workspace_id)
        assert _leftovers() == ([], [])
