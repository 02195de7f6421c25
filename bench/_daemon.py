"""A private sandboxd for a benchmark run: its own socket and instance label, stopped afterwards."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

INSTANCE = f"bench-{secrets.token_hex(4)}"
"""Label value of everything a benchmark run creates."""
IMAGE = "sandboxd/base:bookworm"


@contextlib.contextmanager
def private_daemon(
    *, pool_size: int = 0, pool_file: str = "", demand_bytes: int = 0, instance: str = INSTANCE
) -> Iterator[str]:
    """Start `sandboxd serve` on a temporary socket; yield the socket path; stop it on exit.

    The warm pool is off unless ``pool_size``, ``pool_file`` or ``demand_bytes`` (its demand
    classes' budget) says otherwise: a create is then a container started, as the create
    figures mean. Two at once need two instances (``instance``, INSTANCE by default).
    """
    env = {"SANDBOXD_POOL_DEMAND_MEMORY_BYTES": str(demand_bytes), "SANDBOXD_INSTANCE": instance}
    with private_daemon_process(pool_size=pool_size, pool_file=pool_file, env=env) as (socket_path, _pid):
        yield socket_path


@contextlib.contextmanager
def private_daemon_process(
    *, pool_size: int = 0, pool_file: str = "", env: dict[str, str] | None = None
) -> Iterator[tuple[str, int]]:
    """:func:`private_daemon` with more settings (``env``), yielding the socket path and the daemon's pid."""
    with tempfile.TemporaryDirectory() as tmp:
        socket_path = str(Path(tmp) / "bench.sock")
        env = {
            **os.environ,
            "SANDBOXD_SOCKET": socket_path,
            "SANDBOXD_INSTANCE": INSTANCE,
            "SANDBOXD_LOG_LEVEL": "warning",
            "SANDBOXD_POOL_SIZE": str(pool_size),
            "SANDBOXD_POOL_FILE": pool_file,
            "SANDBOXD_POOL_DEMAND_MEMORY_BYTES": "0",
            **(env or {}),
        }
        daemon = subprocess.Popen([str(Path(sys.executable).with_name("sandboxd")), "serve", "--no-build"], env=env)
        try:
            for _ in range(100):
                if Path(socket_path).exists():
                    break
                time.sleep(0.1)
            yield socket_path, daemon.pid
        finally:
            daemon.terminate()
            daemon.wait(30)
            remove_everything(env["SANDBOXD_INSTANCE"])


def remove_everything(instance: str = INSTANCE) -> None:
    """Remove what the run left under its instance label (the pool's members stay after the daemon)."""
    import docker

    engine = docker.from_env()
    try:
        for leftover in engine.containers.list(all=True, filters={"label": f"sandboxd.instance={instance}"}):
            if leftover.status == "paused":
                leftover.unpause()
            leftover.remove(force=True, v=True)
        for volume in engine.volumes.list(filters={"label": f"sandboxd.instance={instance}"}):
            volume.remove(force=True)
    finally:
        engine.close()


async def snapshot_and_fork(client: Any, ws: Any, name: str, *, include_memory: bool = False) -> tuple[float, float]:
    """Seconds to snapshot ``ws`` as ``name``, and to fork it to a first exec; both removed after."""
    began = time.perf_counter()
    await ws.snapshot(name, include_memory=include_memory)
    snapshot_s = time.perf_counter() - began
    began = time.perf_counter()
    fork = await client.create_workspace(from_snapshot=name)
    await fork.exec("true").wait(check=True)
    fork_s = time.perf_counter() - began
    await fork.delete()
    await client.delete_snapshot(name)
    return snapshot_s, fork_s
