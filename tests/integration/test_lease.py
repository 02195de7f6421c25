"""One daemon per instance label and engine (sandboxd.lease), on the real engine.

The lease is a container named ``sandboxd-<instance>.lease`` whose stdin the holding daemon
keeps open: these tests start real daemon processes, kill them with SIGKILL, plant debris and
forged holders, and end a holder behind its daemon's back, as an engine restart does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import grpc
import pytest
from sandboxd_protocol.v1 import workspace_service_pb2, workspace_service_pb2_grpc

from sandboxd.agentbuild import AgentBuild, agent_digest

from ..conftest import new_instance, spawned_daemon

pytestmark = pytest.mark.usefixtures("default_image")


def _lease_name(instance: str) -> str:
    return f"sandboxd-{instance}.lease"


def _daemon_command(socket_path: Path, instance: str) -> list[str]:
    return [sys.executable, "-m", "sandboxd", "--socket", str(socket_path), "--instance", instance, "--no-build"]


def _until_taken(log_path: Path, times: int, daemon: subprocess.Popen[bytes]) -> None:
    """Wait (15 s at most) until the daemon has logged ``lease.taken`` ``times`` times, alive all along."""
    deadline = time.monotonic() + 15
    while len([event for event in _events(log_path) if event["event"] == "lease.taken"]) < times:
        assert daemon.poll() is None, log_path.read_text()[-2000:]
        assert time.monotonic() < deadline, log_path.read_text()[-2000:]
        time.sleep(0.05)


def _second_daemon(tmp_path: Path, instance: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Start another daemon on ``instance`` (its own socket) and wait for it to end; return it and its time."""
    started = time.monotonic()
    run = subprocess.run(
        _daemon_command(tmp_path / "second" / "sandboxd.sock", instance),
        env={
            **os.environ,
            "SANDBOXD_POOL_SIZE": "0",
            "SANDBOXD_POOL_DEMAND_MEMORY_BYTES": "0",
            "SANDBOXD_AUDIT_LOG": str(tmp_path / "second.jsonl"),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return run, time.monotonic() - started


def _hold_argv() -> list[str]:
    client = docker.from_env()
    try:
        return [f"{AgentBuild.binary_dir(client.info()['Architecture'])}/sandboxd-agent", "hold"]
    finally:
        client.close()


def _fake_holder(client: docker.DockerClient, instance: str, holder: str) -> docker.models.containers.Container:
    """A running lease container nobody attaches to (its stdin stays open): a holder that never goes."""
    return client.containers.run(
        AgentBuild(agent_digest()).image,
        entrypoint=_hold_argv(),
        command=[],
        name=_lease_name(instance),
        labels={"sandboxd.instance": instance, "sandboxd.lease": holder},
        stdin_open=True,
        network_mode="none",
        detach=True,
    )


def _until_gone(client: docker.DockerClient, instance: str, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while client.containers.list(all=True, filters={"name": _lease_name(instance)}, ignore_removed=True):
        assert time.monotonic() < deadline, "the lease outlived its daemon"
        time.sleep(0.05)


def _create_workspace(socket_path: str, workspace_id: str) -> None:
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        stub = workspace_service_pb2_grpc.WorkspaceServiceStub(channel)
        stub.CreateWorkspace(workspace_service_pb2.CreateWorkspaceRequest(workspace_id=workspace_id), timeout=60)


def _listed(socket_path: str) -> list[str]:
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        stub = workspace_service_pb2_grpc.WorkspaceServiceStub(channel)
        reply = stub.ListWorkspaces(workspace_service_pb2.ListWorkspacesRequest(), timeout=30)
    return [workspace.workspace_id for workspace in reply.workspaces]


def _events(log_path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]


def test_a_second_daemon_on_the_label_refuses_in_one_line_and_a_killed_ones_successor_starts(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    instance = new_instance()
    first_dir, third_dir = tmp_path / "first", tmp_path / "third"
    first_dir.mkdir()
    third_dir.mkdir()
    with spawned_daemon(first_dir, instance) as (first, socket_path, _log):
        _create_workspace(socket_path, "kept")
        run, took = _second_daemon(tmp_path, instance)
        assert run.returncode == 1, run.stderr
        assert took < 5.0  # its holder is seen alive: refused without waiting (about 1 s measured, README)
        failed = [line for line in run.stderr.splitlines() if "daemon.failed" in line]
        assert len(failed) == 1, run.stderr
        message = str(json.loads(failed[0])["error"]) if failed[0].startswith("{") else failed[0]
        assert f"instance {instance!r} is already served on this Docker engine by sandboxd pid {first.pid}" in message
        assert f"unix:{socket_path}" in message
        assert "Traceback" not in run.stderr
        assert "daemon.adopted" not in run.stderr  # refused before touching a container
        assert first.poll() is None
        assert _listed(socket_path) == ["kept"]  # the first daemon's workspaces are its own still
        first.send_signal(signal.SIGKILL)
        first.wait()
        killed = time.monotonic()
        with spawned_daemon(third_dir, instance) as (_third, third_socket, third_log):
            assert time.monotonic() - killed < 10.0
            assert _listed(third_socket) == ["kept"]  # adopted by the successor
            events = [event["event"] for event in _events(third_log)]
            assert events.index("lease.taken") < events.index("daemon.adopted")
            with grpc.insecure_channel(f"unix:{third_socket}") as channel:
                stub = workspace_service_pb2_grpc.WorkspaceServiceStub(channel)
                stub.DeleteWorkspace(workspace_service_pb2.DeleteWorkspaceRequest(workspace_id="kept"), timeout=60)
    # The last daemon was killed (SIGKILL) too: its lease goes with it, within moments.
    _until_gone(docker_client, instance)


def test_a_graceful_stop_hands_the_lease_over_at_once(tmp_path: Path, docker_client: docker.DockerClient) -> None:
    instance = new_instance()
    (tmp_path / "a").mkdir()
    with spawned_daemon(tmp_path / "a", instance) as (first, _socket, _log):
        holder = docker_client.containers.get(_lease_name(instance))
        assert holder.labels["sandboxd.instance"] == instance
        assert "sandboxd.managed" not in holder.labels  # no workspace listing sees it
        assert json.loads(holder.labels["sandboxd.lease"])["pid"] == first.pid
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0
    # Gone when the daemon is: a successor has nothing to wait for.
    assert docker_client.containers.list(all=True, filters={"name": _lease_name(instance)}, ignore_removed=True) == []


def test_debris_of_a_lease_is_cleared_and_a_forged_holder_is_named_plainly(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    instance = new_instance()
    # A lease container that ended (an engine restart ends every holder): debris, removed by the
    # next daemon. (One created and never started is another daemon's take under way, waited for.)
    debris = docker_client.containers.run(
        AgentBuild(agent_digest()).image,
        entrypoint=_hold_argv(),
        command=[],
        name=_lease_name(instance),
        labels={"sandboxd.instance": instance, "sandboxd.lease": "{}"},
        network_mode="none",
        detach=True,
    )
    assert debris.wait(timeout=30)["StatusCode"] == 0  # no stdin: `hold` ends at once
    (tmp_path / "a").mkdir()
    with spawned_daemon(tmp_path / "a", instance) as (first, _socket, _log):
        assert (
            json.loads(docker_client.containers.get(_lease_name(instance)).labels["sandboxd.lease"])["pid"] == first.pid
        )
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=30)
    # A running holder whose label is not JSON (or 100 KiB of it): the refusal is one plain line.
    fake = _fake_holder(docker_client, instance, "\x1b[2J" + "x" * 100_000)
    try:
        run, took = _second_daemon(tmp_path, instance)
    finally:
        fake.remove(force=True)
    assert run.returncode == 1
    assert took < 8.0  # a holder that names no live process is waited for (FIRST_WAIT_S): about 2.6 s
    failed = [line for line in run.stderr.splitlines() if "daemon.failed" in line]
    assert len(failed) == 1, run.stderr
    assert f"by another daemon (its lease is the container {_lease_name(instance)})" in failed[0]
    assert len(failed[0]) < 1000


def test_a_lease_ended_behind_the_daemons_back_is_taken_again_or_the_daemon_stops(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    """What an engine restart does to a lease (its holder ends), played by ending the holder."""
    instance = new_instance()
    (tmp_path / "a").mkdir()
    with spawned_daemon(tmp_path / "a", instance) as (first, socket_path, log_path):
        original = docker_client.containers.get(_lease_name(instance))
        original.kill()
        _until_taken(log_path, 2, first)
        assert "lease.lost" in [event["event"] for event in _events(log_path)]
        again = docker_client.containers.get(_lease_name(instance))
        assert again.id != original.id
        assert json.loads(again.labels["sandboxd.lease"])["pid"] == first.pid
        assert _listed(socket_path) == []  # serving throughout
        # Now another holder takes the name while this one's lease is away: this daemon must stop,
        # not go on serving workspaces that are no longer its own. (Renamed first, so that the
        # other can take the name while this daemon still holds its own, then that one ends.)
        again.rename(f"{_lease_name(instance)}-old")
        other = _fake_holder(docker_client, instance, json.dumps({"pid": 4242, "host": "elsewhere", "since": "then"}))
        try:
            again.kill()
            assert first.wait(timeout=20) == 1
        finally:
            other.remove(force=True)
        events = _events(log_path)
        failed = [event for event in events if event["event"] == "daemon.failed"]
        assert len(failed) == 1
        assert "by sandboxd pid 4242 on host elsewhere, since then" in str(failed[0]["error"])
        assert events[-2]["event"] == "daemon.stopped"


def test_a_lease_restarted_behind_the_daemons_back_is_still_its_own(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    """`docker restart` of the lease: it comes back running, attached to nobody, naming this daemon."""
    instance = new_instance()
    (tmp_path / "a").mkdir()
    with spawned_daemon(tmp_path / "a", instance) as (first, _socket, log_path):
        docker_client.containers.get(_lease_name(instance)).restart(timeout=1)
        _until_taken(log_path, 2, first)
        assert first.poll() is None  # it did not refuse itself
        holder = docker_client.containers.get(_lease_name(instance))
        assert json.loads(holder.labels["sandboxd.lease"])["pid"] == first.pid
        run, _took = _second_daemon(tmp_path, instance)  # and the label is still held
        assert run.returncode == 1
        assert f"by sandboxd pid {first.pid}" in run.stderr


def test_two_daemons_started_at_once_one_serves_and_the_other_refuses(tmp_path: Path) -> None:
    instance = new_instance()
    for attempt in range(2):
        runs = [
            subprocess.Popen(
                _daemon_command(tmp_path / f"{attempt}-{n}" / "sandboxd.sock", instance),
                env={
                    **os.environ,
                    "SANDBOXD_POOL_SIZE": "0",
                    "SANDBOXD_POOL_DEMAND_MEMORY_BYTES": "0",
                    "SANDBOXD_AUDIT_LOG": "off",
                    "SANDBOXD_LOG_FORMAT": "json",
                },
                stderr=subprocess.PIPE,
                text=True,
            )
            for n in range(2)
        ]
        try:
            deadline = time.monotonic() + 30
            while all(run.poll() is None for run in runs):
                assert time.monotonic() < deadline, "neither daemon refused"
                time.sleep(0.05)
            (loser,) = [run for run in runs if run.poll() is not None]
            (winner,) = [run for run in runs if run is not loser]
            stderr = loser.stderr.read() if loser.stderr else ""
            assert loser.returncode == 1, stderr
            assert "daemon.listening" not in stderr  # refused before it served
            assert f"by sandboxd pid {winner.pid}" in stderr
            time.sleep(3)  # the winner keeps serving: its keeper found no rival
            assert winner.poll() is None
        finally:
            for run in runs:
                if run.poll() is None:
                    run.send_signal(signal.SIGTERM)
                    run.wait(timeout=30)
                if run.stderr:
                    run.stderr.close()


def test_a_paused_lease_whose_daemon_is_gone_is_taken_over(tmp_path: Path, docker_client: docker.DockerClient) -> None:
    """A lease container paused (by anyone with the engine's socket) cannot end when its daemon
    dies: a successor resumes it, the holder then reads its end of input and goes, and the
    successor starts with the lease its own."""
    instance = new_instance()
    (tmp_path / "first").mkdir()
    (tmp_path / "next").mkdir()
    with spawned_daemon(tmp_path / "first", instance) as (first, _socket, _log):
        lease = docker_client.containers.get(_lease_name(instance))
        lease.pause()
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert docker_client.containers.get(_lease_name(instance)).status == "paused"  # it stays
    with spawned_daemon(tmp_path / "next", instance) as (successor, socket_path, _next_log):
        assert _listed(socket_path) == []
        holder = json.loads(docker_client.containers.get(_lease_name(instance)).labels["sandboxd.lease"])
        assert holder["pid"] == successor.pid
        successor.send_signal(signal.SIGTERM)
        assert successor.wait(timeout=30) == 0
