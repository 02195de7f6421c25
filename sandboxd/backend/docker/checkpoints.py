"""Checkpoints: a running container's processes and memory saved by its runtime, and containers restored from them.

The engine's checkpoint API (Docker Engine with ``experimental`` on) asks the runtime to save
the container: gVisor's ``runsc checkpoint`` writes one file, ``checkpoint.img``, of the
sandbox's whole kernel state (its processes, their memory, its own tmpfs such as /tmp).
The engine keeps checkpoints in the container's own directory, and restores a container only
from its own (a start with a checkpoint directory of the caller's is refused: "custom
checkpointdir is not supported"). So a checkpoint is moved, as soon as it is written, into
this instance's store in the engine's data root (one rename: the same filesystem), and a
container restored from it is given a hard link to it in its own directory just before its
start. Its bytes are never read by the daemon, whatever their size. docs/snapshots.md says
what was found on the way, and what does not work (runc's CRIU on this kernel).

This needs the daemon on the engine's host, as root, where it sees the engine's data root.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

import docker.errors
import structlog

from ...errors import BackendError, FailedPreconditionError, WorkspaceNotFoundError
from ..base import RELISTEN_SIGNAL
from .images import SNAPSHOT_REPOSITORY
from .snapshots import SnapshotsMixin

log = structlog.get_logger(__name__)

CHECKPOINT_FILE = "checkpoint.img"
"""The one file runsc writes (runsc/cmd/checkpoint.go)."""
CHECKPOINT_NAME = "sandboxd"
"""The name of a restored container's checkpoint in its own directory."""
FORK_FILE = "sandboxd-fork"
"""A file beside a restored container's checkpoint image naming the container (see ``_start_restored``)."""
_HOST_SOCKET_RETRIES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
"""Waits between attempts while the agent's connection is still being closed inside the sandbox."""


class CheckpointsMixin(SnapshotsMixin):
    """Checkpoints of running containers (gVisor's), kept in the engine's data root."""

    _checkpoints_on = False
    _snapshots_in_progress = 0
    _restore_locks: ClassVar[weakref.WeakValueDictionary[str, asyncio.Lock]] = weakref.WeakValueDictionary()

    @contextlib.asynccontextmanager
    async def snapshot_in_progress(self) -> AsyncIterator[None]:
        """Held while a snapshot is made: the debris sweep leaves its parts alone (see Backend)."""
        self._snapshots_in_progress += 1
        try:
            yield
        finally:
            self._snapshots_in_progress -= 1

    async def sweep_snapshot_debris(self) -> list[str]:
        """Remove what snapshots cut short left, unless one is being made (see Backend)."""
        if self._snapshots_in_progress:
            return []
        removed = await self._sweep_checkpoints([summary["Id"] for summary in await self._own_containers()])
        if self._snapshots_in_progress:
            return removed
        return removed + await self.remove_unused_images()

    def _store_in(self, root: Path) -> Path:
        """This instance's checkpoint directory in the engine's data root ``root``."""
        return root / "sandboxd-checkpoints" / self.instance

    async def _checkpoint_store(self) -> Path:
        """This instance's checkpoint directory in the engine's data root (made if missing).

        Raises:
            FailedPreconditionError: the engine's checkpoints are off, or its data root is not
                this machine's to write in.
        """
        if not self._checkpoints_on:
            info = await self._call(self._api().info, idempotent=True)
            if not info.get("ExperimentalBuild"):
                msg = (
                    "memory snapshots need the Docker engine's checkpoints, an experimental feature: set "
                    '"experimental": true in /etc/docker/daemon.json and restart the engine '
                    "(docs/snapshots.md)"
                )
                raise FailedPreconditionError(msg)
            self._checkpoints_on = True
        root = await self._engine_root()
        store = self._store_in(root)
        try:
            await asyncio.to_thread(store.mkdir, mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            msg = (
                f"memory snapshots need the daemon on the engine's host as root: it cannot write in the "
                f"engine's data root {root} ({exc.strerror or exc})"
            )
            raise FailedPreconditionError(msg) from exc
        return store

    async def checkpoint_container(self, workspace_id: str, key: str) -> int:
        """Save the running container's processes and memory as checkpoint ``key`` (it runs on); return its bytes.

        Raises:
            WorkspaceNotFoundError: no such container.
            FailedPreconditionError: the runtime cannot save it (what it holds is named).
        """
        store = await self._checkpoint_store()
        api = self._api()
        attrs = await self._container_attrs(workspace_id)
        container_id = attrs["Id"]
        name = f"sandboxd-{key[:16]}"
        url = api._url("/containers/{0}/checkpoints", container_id)

        def create() -> None:
            response = api._post_json(url, data={"CheckpointID": name, "Exit": False})
            api._raise_for_status(response)

        for delay in (*_HOST_SOCKET_RETRIES, None):
            try:
                await self._call(create)
                break
            except BackendError as exc:
                # The agent closes its end as soon as it has answered: a moment later, it is gone.
                if "bound host socket" in exc.message and delay is not None:
                    await asyncio.sleep(delay)
                    continue
                raise FailedPreconditionError(_checkpoint_refusal(workspace_id, exc.message)) from exc
        made = await self._engine_root() / "containers" / container_id / "checkpoints" / name
        target = store / key
        try:
            await asyncio.to_thread(_replace_dir, made, target)
            size = (target / CHECKPOINT_FILE).stat().st_size
        except OSError as exc:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(shutil.rmtree, made, True)
            msg = f"the checkpoint of workspace {workspace_id!r} could not be kept: {exc}"
            raise BackendError(msg) from exc
        return size

    async def _sweep_checkpoints(self, container_ids: list[str]) -> list[str]:
        """Remove what a daemon stopped in the middle of a memory snapshot left; return what went.

        Checkpoints in the store that no snapshot's image holds, and the engine's own copy of
        one in a container of this instance (``containers``), not yet moved to the store.
        Nothing when the engine's data root is not this machine's.
        """
        root = await self._engine_root()
        store = self._store_in(root)

        def leftovers() -> list[Path]:
            found = [entry for entry in store.iterdir()] if store.is_dir() else []
            for container_id in container_ids:
                own = root / "containers" / container_id / "checkpoints"
                with contextlib.suppress(OSError):
                    found += [entry for entry in own.iterdir() if entry.name.startswith("sandboxd-")]
            return found

        try:
            candidates = await asyncio.to_thread(leftovers)
        except OSError:
            return []
        removed = []
        for entry in candidates:
            if entry.parent == store and await self.image_info(f"{SNAPSHOT_REPOSITORY}:{entry.name}") is not None:
                continue
            await asyncio.to_thread(shutil.rmtree, entry, True)
            removed.append(str(entry))
        with contextlib.suppress(OSError):
            await asyncio.to_thread(store.rmdir)  # empty: the instance keeps none
        return removed

    async def remove_checkpoint(self, key: str) -> None:
        """Remove checkpoint ``key`` (containers restored from it keep running)."""
        store = await self._checkpoint_store()
        await asyncio.to_thread(shutil.rmtree, store / key, True)
        with contextlib.suppress(OSError):
            await asyncio.to_thread(store.rmdir)  # the instance's last: nothing of it is left

    async def checkpoint_exists(self, key: str) -> bool:
        """Whether checkpoint ``key`` is kept."""
        store = await self._checkpoint_store()
        return (store / key / CHECKPOINT_FILE).exists()

    async def _start_restored(self, container_id: str, key: str) -> None:
        """Start the created container from checkpoint ``key``, then tell its agent to listen again."""
        store = await self._checkpoint_store()
        source = store / key / CHECKPOINT_FILE
        own = await self._engine_root() / "containers" / container_id / "checkpoints" / CHECKPOINT_NAME

        def place() -> None:
            own.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.link(source, own / CHECKPOINT_FILE)
            # The engine uploads the directory to containerd as content named by its digest, and
            # two uploads of one digest at once collide ("content sha256:...: already exists"):
            # a file naming the fork makes each fork's its own (runsc reads only its image).
            (own / FORK_FILE).write_text(container_id)

        try:
            await asyncio.to_thread(place)
        except FileNotFoundError as exc:
            msg = "the snapshot's memory is gone (its snapshot was deleted meanwhile)"
            raise FailedPreconditionError(msg) from exc
        api = self._api()

        def start() -> None:
            url = api._url("/containers/{0}/start", container_id)
            api._raise_for_status(api._post(url, params={"checkpoint": CHECKPOINT_NAME}))

        # Each fork's upload is content of its own (FORK_FILE), so forks of one checkpoint start
        # at once: ten in about two forks' time, where one at a time took ten. Should the engine
        # still meet one upload under way with another, that start is made again, alone.
        lock = self._restore_locks.setdefault(key, asyncio.Lock())
        try:
            try:
                await self._call(start)
            except BackendError as exc:
                if "already exists" not in exc.message:
                    raise
                async with lock:
                    await self._call(start)
        finally:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(shutil.rmtree, own, True)
        await self.signal_container(container_id, RELISTEN_SIGNAL)

    async def signal_container(self, container: str, signum: int) -> None:
        """Send ``signum`` to the container's main process (the engine's init hands it to the agent).

        Raises:
            WorkspaceNotFoundError: no such container.
        """
        try:
            await self._call(self._api().kill, container, signal=int(signum))
        except docker.errors.NotFound as exc:
            msg = f"container {container!r} not found"
            raise WorkspaceNotFoundError(msg) from exc


def _replace_dir(source: Path, target: Path) -> None:
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a removal of the last may have taken it
    if target.exists():
        shutil.rmtree(target)
    os.rename(source, target)


def _checkpoint_refusal(workspace_id: str, said: str) -> str:
    """What a caller is told of a checkpoint the runtime refused, from the runtime's own words."""
    if "bound host socket" in said:
        return (
            f"workspace {workspace_id!r} cannot be snapshotted with its memory: one of its processes has a Unix "
            "socket bound in a directory shared with the host (such as /workspace), which gVisor cannot save; "
            f"close it, or snapshot its files only (the runtime said: {said})"
        )
    if "criu" in said.lower():
        return (
            f"workspace {workspace_id!r} cannot be snapshotted with its memory: runc's checkpoints need CRIU, "
            f"which does not work with this kernel (docs/snapshots.md; the runtime said: {said})"
        )
    return f"workspace {workspace_id!r} cannot be snapshotted with its memory: the runtime said: {said}"
