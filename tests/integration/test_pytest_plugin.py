"""The pytest plugin, used the way a test author would: pytest runs on sample files (issue 6)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker


def _owner(directory: Path) -> str:
    return hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:16]


def _labelled(docker_client, directory: Path) -> tuple[list[str], list[str]]:  # type: ignore[no-untyped-def]
    selector = {"label": f"pytest.owner={_owner(directory)}"}
    # From the listing alone: a container may go between a listing and its inspection.
    containers = [c["Names"][0].lstrip("/") for c in docker_client.api.containers(all=True, filters=selector)]
    volumes = [v.name for v in docker_client.volumes.list(filters=selector)]
    return containers, volumes


def _cleanup(docker_client, directory: Path) -> None:  # type: ignore[no-untyped-def]
    selector = {"label": f"pytest.owner={_owner(directory)}"}
    for container in docker_client.containers.list(all=True, filters=selector, ignore_removed=True):
        container.remove(force=True, v=True)
    for volume in docker_client.volumes.list(filters=selector):
        volume.remove(force=True)


def _pytest(directory: Path, env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def project(tmp_path: Path, docker_client):  # type: ignore[no-untyped-def]
    """An empty test project directory; whatever its runs leave is removed afterwards."""
    directory = tmp_path / "project"
    directory.mkdir()
    yield directory
    _cleanup(docker_client, directory)


def _env(daemon) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {**os.environ, "SANDBOXD_SOCKET": daemon.socket_path}


def _no_daemon_env(tmp_path: Path) -> dict[str, str]:
    """An environment naming no daemon, whose default socket nobody listens on: the plugin starts its own."""
    runtime = tmp_path / "xdg"
    runtime.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in {"SANDBOXD_SOCKET", "SANDBOXD_ADDRESS"}}
    env["XDG_RUNTIME_DIR"] = str(runtime)
    return env


class TestFixtures:
    def test_workspace_fixture_and_cleanup(self, daemon, project: Path, docker_client) -> None:
        """A test using only `workspace` runs `echo hi`; afterwards nothing with its label is left."""
        (project / "test_sample.py").write_text(
            textwrap.dedent(
                """
                import pytest

                def test_hi(workspace):
                    assert workspace.exec("echo hi").stdout == "hi\\n"

                @pytest.mark.sandboxd(memory_bytes=256 * 1024**2)
                def test_marker_options(workspace):
                    assert workspace.info.memory_bytes == 256 * 1024**2
                    assert workspace.info.labels["pytest.nodeid"] == "test_sample.py::test_marker_options"
                """
            )
        )
        run = _pytest(project, _env(daemon))
        assert run.returncode == 0, run.stdout + run.stderr
        assert "2 passed" in run.stdout
        assert _labelled(docker_client, project) == ([], [])

    def test_a_snapshot_set_up_runs_once_per_session(self, daemon, project: Path, docker_client) -> None:
        """Three tests of one snapshot and set-up: the set-up ran once, each test forks it, and each
        has its own copy; the snapshot is gone after the session."""
        (project / "test_snap.py").write_text(
            textwrap.dedent(
                """
                import pytest

                SETUP = "echo ran >> /workspace/setup-runs; mkdir -p ~/.deps && echo installed > ~/.deps/lib"
                mark = pytest.mark.sandboxd(snapshot="deps", setup=SETUP)

                @pytest.mark.parametrize("n", [1, 2, 3])
                @mark
                def test_fork(workspace, n):
                    assert workspace.info.from_snapshot.startswith("deps-")
                    out = workspace.exec("cat /workspace/setup-runs ~/.deps/lib; ls /workspace").stdout
                    assert out == "ran\\ninstalled\\nsetup-runs\\n"
                    workspace.write_file(f"/workspace/mine-{n}", "x")

                @pytest.mark.sandboxd(snapshot="broken", setup="echo no; exit 4")
                def test_failing_setup(workspace):
                    pass
                """
            )
        )
        run = _pytest(project, _env(daemon))
        assert run.returncode == 1, run.stdout + run.stderr
        assert "3 passed" in run.stdout and "1 error" in run.stdout, run.stdout
        assert "the set-up exited 4" in run.stdout and "no" in run.stdout
        assert _labelled(docker_client, project) == ([], [])
        assert not docker_client.images.list(filters={"label": f"pytest.owner={_owner(project)}"})

    def test_failure_report_names_workspace_and_commands(self, daemon, project: Path) -> None:
        """A failing test's report shows its workspace id and the last commands run in it."""
        (project / "test_fails.py").write_text(
            textwrap.dedent(
                """
                def test_boom(workspace):
                    workspace.exec("echo preparing")
                    result = workspace.exec("echo boom; exit 3")
                    assert result.exit_code == 0
                """
            )
        )
        run = _pytest(project, _env(daemon))
        assert run.returncode == 1
        section = run.stdout.split("sandboxd", 1)[1]
        assert "workspace ws-" in section
        assert "$ echo preparing    [exit 0]" in section
        assert "$ echo boom; exit 3    [exit 3]" in section

    def test_leftovers_of_a_killed_run_are_reaped(self, daemon, project: Path, docker_client) -> None:
        """pytest SIGKILLed mid-test leaves its workspace; the next run of the project removes it."""
        (project / "test_slow.py").write_text("def test_slow(workspace):\n    import time\n    time.sleep(120)\n")
        slow = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_slow.py"],
            cwd=project,
            env=_env(daemon),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 60
            # Its workspace made: named as its id, no longer provisionally (``.creating``).
            while time.monotonic() < deadline and not [
                name for name in _labelled(docker_client, project)[0] if not name.endswith(".creating")
            ]:
                time.sleep(0.5)
            left = _labelled(docker_client, project)
            assert left[0] and not left[0][0].endswith(".creating"), "the slow test never created its workspace"
            slow.send_signal(signal.SIGKILL)
            slow.wait(30)
        finally:
            if slow.poll() is None:
                slow.kill()
                slow.wait()
        assert _labelled(docker_client, project) == left, "a killed run cannot clean up after itself"
        (project / "test_slow.py").unlink()
        (project / "test_next.py").write_text(
            "def test_next(sandboxd_client):\n    assert sandboxd_client.health() == 'SERVING'\n"
        )
        run = _pytest(project, _env(daemon))
        assert run.returncode == 0, run.stdout + run.stderr
        assert _labelled(docker_client, project) == ([], [])

    def test_starts_its_own_daemon_when_none_is_configured(self, project: Path, docker_client, tmp_path: Path) -> None:
        """With no daemon configured or answering, the plugin starts one for the session and stops it after."""
        (project / "test_own.py").write_text(
            textwrap.dedent(
                """
                import subprocess

                def test_own(workspace):
                    assert workspace.exec('id -un').stdout == 'sandbox\\n'
                    running = subprocess.run(["pgrep", "-af", "sandboxd-pytest-"], capture_output=True, text=True)
                    print("daemon seen:", running.stdout.split("--socket ")[1].split("/")[2][:16])
                """
            )
        )
        env = _no_daemon_env(tmp_path)
        run = _pytest(project, env, "-s", "-W", "error::ResourceWarning")  # no leaked loop or socket either
        assert run.returncode == 0, run.stdout + run.stderr
        assert "daemon seen: sandboxd-pytest-" in run.stdout
        assert _labelled(docker_client, project) == ([], [])
        # Nothing of its daemon's instance either (a warm pool's members would outlive it).
        instance = f"pytest-{_owner(project)[:8]}-main"
        assert docker_client.api.containers(all=True, filters={"label": f"sandboxd.instance={instance}"}) == []
        leftover_daemons = subprocess.run(
            ["pgrep", "-f", "sandboxd-pytest-"], capture_output=True, text=True, check=False
        ).stdout.split()
        assert leftover_daemons == []

    def test_xdist_workers_own_daemons_leave_each_other_alone(
        self, project: Path, docker_client, tmp_path: Path
    ) -> None:
        """Two workers, each starting its own daemon: the second's start must not end the first's command."""
        (project / "test_a.py").write_text(
            "def test_long(workspace):\n    assert workspace.exec('sleep 6; echo done').stdout == 'done\\n'\n"
        )
        (project / "test_b.py").write_text(
            "import time\n\n\ndef test_later(workspace):\n    time.sleep(2)\n"
            "    assert workspace.exec('echo hi').stdout == 'hi\\n'\n"
        )
        env = _no_daemon_env(tmp_path)
        run = _pytest(project, env, "-n", "2", "--dist", "loadfile", "-p", "no:randomly")
        assert run.returncode == 0, run.stdout + run.stderr
        assert "2 passed" in run.stdout
        assert _labelled(docker_client, project) == ([], [])

    def test_bad_marker_options_and_a_hung_command_are_reported(self, daemon, project: Path) -> None:
        (project / "test_odd.py").write_text(
            textwrap.dedent(
                """
                import pytest

                @pytest.mark.sandboxd(network="host")
                def test_bad_network(workspace):
                    pass

                @pytest.mark.sandboxd({"memory_bytes": 5})
                def test_positional(workspace):
                    pass

                @pytest.mark.timeout(3)
                def test_hangs(workspace):
                    workspace.exec("echo before")
                    workspace.exec("sleep 60")
                """
            )
        )
        run = _pytest(project, _env(daemon), "-p", "no:randomly")
        assert run.returncode == 1
        assert "@pytest.mark.sandboxd(('network', 'host'),): KeyError" in run.stdout
        assert "@pytest.mark.sandboxd takes keyword options only" in run.stdout
        assert "$ sleep 60    [still running]" in run.stdout
