"""A private Docker engine for tests that restart one: its own dockerd, containerd and data.

Restarting the machine's engine would end every other test's containers; a second dockerd
with its own sockets, data root and containerd (the one it starts for itself) is a real
engine to restart at will. It runs in a network namespace of its own with no bridge network
(workspaces with network ``none`` need none, and the daemon reaches it and its agents by Unix
sockets, which are files), so it cannot touch the machine's interfaces or iptables; it takes
the machine engine's runtimes (runsc), storage driver and MTU. Everything it holds goes with
its data root when the test ends.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
import requests.exceptions

_MAIN_CONFIG = Path("/etc/docker/daemon.json")
_CARRIED = ("runtimes", "storage-driver", "mtu", "default-runtime")


class PrivateEngine:
    """One dockerd of the test's own, started, stopped and restarted by the test."""

    def __init__(self, root: Path) -> None:
        """Keep everything under ``root`` (short: its socket's path must fit a socket address)."""
        self.root = root
        self.socket = root / "docker.sock"
        self.host = f"unix://{self.socket}"
        self._process: subprocess.Popen[bytes] | None = None
        self._log = root / "dockerd.log"
        main = json.loads(_MAIN_CONFIG.read_text()) if _MAIN_CONFIG.exists() else {}
        config = {key: main[key] for key in _CARRIED if key in main}
        (root / "daemon.json").write_text(json.dumps(config))

    def start(self) -> None:
        """Start dockerd and return once it answers (at most 60 s)."""
        with self._log.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    # A network namespace of its own: a dockerd told --bridge=none deletes the
                    # docker0 it finds, and the machine's engine would lose its bridge.
                    "unshare",
                    "--net",
                    "dockerd",
                    f"--config-file={self.root / 'daemon.json'}",
                    f"--host={self.host}",
                    f"--data-root={self.root / 'data'}",
                    f"--exec-root={self.root / 'exec'}",
                    f"--pidfile={self.root / 'docker.pid'}",
                    "--bridge=none",
                    "--iptables=false",
                    "--ip6tables=false",
                ],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while True:
            try:
                # Probed first with a socket of its own: the SDK leaks the one of a refused connect.
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    probe.connect(str(self.socket))
                with contextlib.closing(self.client()) as client:
                    client.ping()
            except (OSError, docker.errors.DockerException, requests.exceptions.ConnectionError):
                if self._process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the private engine did not start: {self._log.read_text()[-2000:]}")
                time.sleep(0.1)
            else:
                return

    def stop(self) -> None:
        """Stop dockerd as ``systemctl stop docker`` does (SIGTERM), and wait for it to end."""
        if self._process is None:
            return
        self._process.send_signal(signal.SIGTERM)
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None

    def restart(self) -> None:
        """What ``systemctl restart docker`` does: stop, then start."""
        self.stop()
        self.start()

    def client(self) -> docker.DockerClient:
        """A client of this engine."""
        return docker.DockerClient(base_url=self.host, version="1.41", timeout=60)  # no request made here

    def load(self, *refs: str) -> None:
        """Copy images from the machine's engine into this one (``docker save | docker load``)."""
        with contextlib.closing(docker.from_env(timeout=300)) as main, contextlib.closing(self.client()) as private:
            for ref in refs:
                private.images.load(b"".join(main.images.get(ref).save(named=True)))

    def close(self) -> None:
        """Remove every container, stop the engine, and remove its data."""
        if self._process is not None:
            with (
                contextlib.suppress(docker.errors.DockerException, requests.exceptions.ConnectionError),
                contextlib.closing(self.client()) as client,
            ):
                for container in client.containers.list(all=True, ignore_removed=True):
                    container.remove(force=True, v=True)
        self.stop()
        subprocess.run(["umount", "-R", str(self.root / "exec")], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def private_engine(*images: str) -> Iterator[PrivateEngine]:
    """A started private engine holding ``images``; skipped where dockerd cannot run (not root)."""
    if shutil.which("dockerd") is None or shutil.which("unshare") is None or not _is_root():
        pytest.skip("a private engine needs dockerd, unshare and root")
    root = Path(tempfile.mkdtemp(prefix="sbx-engine-", dir="/tmp"))
    engine = PrivateEngine(root)
    try:
        engine.start()
        engine.load(*images)
        yield engine
    finally:
        engine.close()


def _is_root() -> bool:
    import os

    return os.geteuid() == 0
