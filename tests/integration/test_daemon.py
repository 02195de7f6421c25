"""The daemon as a server: health, reflection, error statuses, the CLI (issue 2)."""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from sandboxd_client import SandboxClient, UnavailableError

from tests.conftest import DaemonThread, make_settings

pytestmark = pytest.mark.docker


class TestServer:
    async def test_health_is_serving(self, daemon) -> None:
        """gRPC health checking answers SERVING for the server and each service."""
        async with grpc.aio.insecure_channel(f"unix:{daemon.socket_path}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for service in ("", "sandboxd.v1.WorkspaceService", "sandboxd.v1.ProcessService"):
                response = await stub.Check(health_pb2.HealthCheckRequest(service=service))
                assert response.status == health_pb2.HealthCheckResponse.SERVING

    async def test_reflection_lists_services(self, daemon) -> None:
        """Server reflection lists both sandboxd services, health and reflection."""
        async with grpc.aio.insecure_channel(f"unix:{daemon.socket_path}") as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)

            async def requests():  # type: ignore[no-untyped-def]
                yield reflection_pb2.ServerReflectionRequest(list_services="")

            names = set()
            async for response in stub.ServerReflectionInfo(requests()):
                names |= {s.name for s in response.list_services_response.service}
        assert {
            "sandboxd.v1.WorkspaceService",
            "sandboxd.v1.ProcessService",
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
        } <= names

    def test_socket_is_owner_only(self, daemon) -> None:
        """The Unix socket is mode 0600 and its directory 0700."""
        assert os.stat(daemon.socket_path).st_mode & 0o777 == 0o600
        assert os.stat(os.path.dirname(daemon.socket_path)).st_mode & 0o777 == 0o700

    async def test_docker_unreachable_is_unavailable(self, tmp_path) -> None:
        """With no engine at the configured address, calls fail UNAVAILABLE saying so, quickly."""
        settings = make_settings(tmp_path, docker_host="unix:///nonexistent/docker.sock")
        thread = DaemonThread(settings).start()
        try:
            async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
                with pytest.raises(UnavailableError, match="unreachable") as caught:
                    await client.create_workspace()
                assert "Traceback" not in caught.value.message
                with pytest.raises(UnavailableError, match="unreachable"):
                    await client.list_workspaces()
        finally:
            thread.stop()


class TestProcess:
    def test_serve_and_graceful_sigterm(self, tmp_path, default_image) -> None:
        """`python -m sandboxd` serves on its socket, answers health, and on SIGTERM stops cleanly."""
        import json
        import signal
        import time

        from tests.conftest import TEST_INSTANCE

        socket_path = tmp_path / "run" / "sandboxd.sock"
        env = {**os.environ, "SANDBOXD_LOG_FORMAT": "json"}
        daemon = subprocess.Popen(
            [sys.executable, "-m", "sandboxd", "--socket", str(socket_path), "--instance", TEST_INSTANCE, "--no-build"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while not socket_path.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            with grpc.insecure_channel(f"unix:{socket_path}") as channel:
                response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
            daemon.send_signal(signal.SIGTERM)
            _, stderr = daemon.communicate(timeout=30)
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()
        assert daemon.returncode == 0
        assert not socket_path.exists()
        events = [json.loads(line)["event"] for line in stderr.splitlines() if line.startswith("{")]
        assert events[0] == "daemon.listening"
        assert events[-2:] == ["daemon.stopping", "daemon.stopped"]


class TestCli:
    def _ctl(self, daemon, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sandboxd_client.cli", "--socket", daemon.socket_path, *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=check,
        )

    def test_create_exec_ls_rm(self, daemon) -> None:
        """sandboxctl creates, streams both outputs, exits with the command's code, lists and removes."""
        created = self._ctl(daemon, "create", "--memory", "512m", "--label", "cli=yes", check=True)
        workspace_id = created.stdout.strip()
        try:
            run = self._ctl(daemon, "exec", workspace_id, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
            assert (run.stdout, run.stderr, run.returncode) == ("out\n", "err\n", 7)
            listed = self._ctl(daemon, "ls", "--label", "cli=yes", check=True)
            assert workspace_id in listed.stdout
            assert "512MiB" in listed.stdout
        finally:
            removed = self._ctl(daemon, "rm", workspace_id)
        assert removed.returncode == 0
        assert self._ctl(daemon, "ls", "-q", "--label", "cli=yes").stdout == ""

    def test_error_is_one_line(self, daemon) -> None:
        """A refused call prints exactly one `sandboxctl: ...` line and exits 1."""
        run = self._ctl(daemon, "exec", "ws-nope", "--", "true")
        assert run.returncode == 1
        assert run.stderr.splitlines() == ["sandboxctl: workspace 'ws-nope' not found"]

    def test_daemon_down_is_one_line(self, tmp_path) -> None:
        """With no daemon on the socket, sandboxctl says it cannot connect, in one line."""
        run = subprocess.run(
            [sys.executable, "-m", "sandboxd_client.cli", "--socket", str(tmp_path / "none.sock"), "ls"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 1
        assert len(run.stderr.splitlines()) == 1
        assert run.stderr.startswith("sandboxctl: ")
