"""Snapshots of workspace containers: a container's files made an image, and a fork's /workspace given from one.

Where the daemon sees the engine's storage (on its host, as root), a snapshot's one new layer is
written from the container's overlay upper directory and its /workspace volume (layers.py) and
loaded on top of its image's layers; elsewhere the engine commits it. A fork's /workspace is
copied from its snapshot image's top layer on the host, or by the engine, or (a capped one) by
a holder container after its start.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import docker.errors
import structlog

from ...errors import BackendError, QuotaExceededError, WorkspaceNotFoundError
from ..base import LABEL_SNAPSHOT_PART, ContainerSpec, ImageInfo
from . import layers
from .client import LABEL_INSTANCE, LABEL_MANAGED, LABEL_WORKSPACE, WORKSPACE_MOUNT
from .images import ImagesMixin

log = structlog.get_logger(__name__)


class SnapshotsMixin(ImagesMixin):
    """Images of containers' files (snapshots), and the /workspace a fork of one starts with."""

    async def snapshot_container(
        self,
        workspace_id: str,
        ref: str,
        labels: Mapping[str, str],
        *,
        max_workspace_bytes: int,
        max_root_bytes: int = 0,
        frozen: Callable[[bool], Awaitable[None]] | None = None,
        later_labels: Awaitable[Mapping[str, str]] | None = None,
    ) -> ImageInfo:
        """Make image ``ref`` of the container's root filesystem and its /workspace (see Backend).

        Where the daemon can read the container's overlay upper directory and its volume, one
        layer is written from them and loaded on top of the image's (:meth:`_snapshot_by_layer`);
        elsewhere (a remote engine, a tree too deep to walk) the engine commits it
        (:meth:`_snapshot_by_commit`).
        """
        await self._load_claims()
        name = self._ref(workspace_id)
        attrs = await self._container_attrs(workspace_id)
        upper = layers.readable_upper(attrs)
        volume = next(
            (m.get("Source", "") for m in attrs.get("Mounts") or [] if m.get("Destination") == WORKSPACE_MOUNT), ""
        )
        if upper is not None and volume and os.access(volume, os.R_OK | os.X_OK):
            with contextlib.suppress(layers.TooDeep):  # a tree too deep to walk: the engine commits it
                return await self._snapshot_by_layer(
                    attrs,
                    str(upper),
                    volume,
                    ref,
                    labels,
                    max_workspace_bytes=max_workspace_bytes,
                    max_root_bytes=max_root_bytes,
                    frozen=frozen,
                    later_labels=later_labels,
                )
        return await self._snapshot_by_commit(
            workspace_id,
            name,
            ref,
            labels,
            max_workspace_bytes=max_workspace_bytes,
            frozen=frozen,
            later_labels=later_labels,
        )

    async def _snapshot_by_layer(
        self,
        attrs: Mapping[str, Any],
        upper: str,
        volume: str,
        ref: str,
        labels: Mapping[str, str],
        *,
        max_workspace_bytes: int,
        max_root_bytes: int,
        frozen: Callable[[bool], Awaitable[None]] | None,
        later_labels: Awaitable[Mapping[str, str]] | None,
    ) -> ImageInfo:
        """Make image ``ref`` of one layer written from the container's upper directory and its volume (layers.py).

        The container stands paused while its upper directory is read (what changed in its root
        filesystem: a moment, as it is only what changed), unless it is paused already;
        /workspace is read while it runs, as ``_copy_workspace`` streams it.
        """
        api = self._api()
        workspace_id = attrs["Config"]["Labels"].get(LABEL_WORKSPACE, "")
        base = await self._call(api.inspect_image, attrs["Image"], idempotent=True)
        spool_dir = await self._engine_root() / "sandboxd-spool"
        await asyncio.to_thread(spool_dir.mkdir, mode=0o700, exist_ok=True)
        paused = bool((attrs.get("State") or {}).get("Paused"))
        began = time.monotonic()
        with tempfile.TemporaryFile(dir=spool_dir) as spool:
            # What changed in the root filesystem is bounded too (a sparse file there counts at its
            # full length, and the workspace stands frozen while it is read).
            writer = layers.LayerWriter(spool, max_root_bytes)
            if frozen is not None:
                await frozen(True)
            try:
                if not paused:
                    # Under load the kernel's freezer can fail to stop every task in time ("unable
                    # to freeze", a 500, after which runc thaws it): the pause is tried again.
                    await self._call(api.pause, attrs["Id"], idempotent=True)
                try:
                    merged = ((attrs.get("GraphDriver") or {}).get("Data") or {}).get("MergedDir")
                    if merged:
                        await asyncio.to_thread(layers.sync_mount, merged)
                    try:
                        await asyncio.to_thread(writer.add_upper, upper)
                    except layers.TooBig:
                        raise _too_big(workspace_id, "root filesystem changes are", max_root_bytes) from None
                finally:
                    if not paused:
                        await asyncio.shield(self._call(api.unpause, attrs["Id"]))
            finally:
                if frozen is not None:
                    await asyncio.shield(frozen(False))
            thawed = time.monotonic()
            try:
                await asyncio.to_thread(writer.add_workspace, volume, max_workspace_bytes)
                diff_id, size = await asyncio.to_thread(writer.close)
            except layers.TooBig:
                raise _too_big(workspace_id, "/workspace is", max_workspace_bytes) from None
            if later_labels is not None:
                labels = {**labels, **await later_labels}
            written = time.monotonic()
            config = layers.image_config(base, attrs, labels, diff_id)
            archive = layers.load_archive(spool, size, config, len(base["RootFS"]["Layers"]), ref)

            def load() -> None:
                for said in api.load_image(archive):
                    if isinstance(said, dict) and said.get("error"):
                        msg = f"the engine did not take the snapshot's layer: {said['error']}"
                        raise BackendError(msg)

            await self._call(load)
        log.info(
            "snapshot.layer_written",
            workspace_id=workspace_id,
            layer_bytes=size,
            frozen_s=round(thawed - began, 4),
            workspace_s=round(written - thawed, 4),
            load_s=round(time.monotonic() - written, 4),
        )
        info = await self.image_info(ref)
        if info is None:
            msg = f"the snapshot image {ref} vanished as it was made"
            raise BackendError(msg)
        return info

    async def _snapshot_by_commit(
        self,
        workspace_id: str,
        name: str,
        ref: str,
        labels: Mapping[str, str],
        *,
        max_workspace_bytes: int,
        frozen: Callable[[bool], Awaitable[None]] | None,
        later_labels: Awaitable[Mapping[str, str]] | None,
    ) -> ImageInfo:
        """Make image ``ref`` with ``docker commit``, then /workspace copied into a second commit.

        Where the daemon cannot read the container's layer (a remote engine, a daemon not root).
        """
        api = self._api()
        if frozen is not None:
            await frozen(True)
        try:
            first = await self._call(api.commit, name, conf={"Labels": self._part_labels()})
        except docker.errors.NotFound as exc:
            msg = f"workspace {workspace_id!r} not found"
            raise WorkspaceNotFoundError(msg) from exc
        finally:
            if frozen is not None:
                await asyncio.shield(frozen(False))
        holder = None
        try:
            holder = await self._holder(first["Id"])
            try:
                within = await self._copy_workspace(name, holder["Id"], max_workspace_bytes)
            except docker.errors.NotFound as exc:
                msg = f"workspace {workspace_id!r} not found"
                raise WorkspaceNotFoundError(msg) from exc
            if not within:
                raise _too_big(workspace_id, "/workspace is", max_workspace_bytes)
            repository, _, tag = ref.rpartition(":")
            final = {**labels, **(await later_labels if later_labels is not None else {}), LABEL_SNAPSHOT_PART: ""}
            await self._call(api.commit, holder["Id"], repository=repository, tag=tag, conf={"Labels": final})
        finally:
            if holder is not None:
                with contextlib.suppress(docker.errors.NotFound, BackendError):
                    await self._call(api.remove_container, holder["Id"], force=True, v=True)
            with contextlib.suppress(docker.errors.NotFound, docker.errors.ImageNotFound, BackendError):
                await self._call(api.remove_image, first["Id"], noprune=False)
        info = await self.image_info(ref)
        if info is None:
            msg = f"the snapshot image {ref} vanished as it was made"
            raise BackendError(msg)
        return info

    async def _holder(self, image: str) -> dict[str, Any]:
        """A container of ``image`` that never starts, to read or write its files through the engine.

        An image takes its container's labels, and a container its image's, for good: a
        workspace's own (its id, spec, tenant...) are blanked on the holder, so that it is no
        workspace (a start after a crash removes it, as a container never started).
        """
        api = self._api()
        inherited = (await self._call(api.inspect_image, image, idempotent=True))["Config"]["Labels"] or {}
        blanked = {key: "" for key in inherited if key.startswith("sandboxd.")}
        holder: dict[str, Any] = await self._call(
            api.create_container,
            image,
            entrypoint=["/.sandboxd/none"],
            command=[],
            labels={**blanked, **self._part_labels()},
            network_disabled=True,
            host_config=api.create_host_config(network_mode="none"),
        )
        return holder

    async def _seed_workspace(self, container_id: str, image: str) -> None:
        """Copy ``image``'s /workspace into the running container's.

        A capped /workspace is a tmpfs volume: the engine copies the image's files into it at
        create, as into a plain one, and loses them with that mount.
        """
        holder = await self._holder(image)
        try:
            # The cap bounds it: the engine refuses what does not fit (no space left on device).
            await self._copy_workspace(holder["Id"], container_id, limit=None)
        finally:
            with contextlib.suppress(docker.errors.NotFound, BackendError):
                await self._call(self._api().remove_container, holder["Id"], force=True, v=True)

    def _part_labels(self) -> dict[str, str]:
        """The labels of a snapshot's intermediate image and of a holder container."""
        return {LABEL_MANAGED: "true", LABEL_INSTANCE: self.instance, LABEL_SNAPSHOT_PART: "true"}

    async def _copy_workspace(self, source: str, destination: str, limit: int | None) -> bool:
        """Stream ``source``'s /workspace into ``destination``'s, as the engine's tar archive.

        Returns:
            False when the archive ran past ``limit`` bytes (it was cut there, and the engine
            refused what it got); True when it all went across.
        """
        api = self._api()
        within = [True]

        def copy() -> None:
            # docker-py's get_archive hides its response: closing it is what stops the engine
            # reading a sparse file's gigabytes of nothing for a stream cut short.
            response = api._get(
                api._url("/containers/{0}/archive", source),
                params={"path": WORKSPACE_MOUNT},
                stream=True,
            )
            try:
                api._raise_for_status(response)
                chunks = response.iter_content(1024 * 1024)
                api.put_archive(destination, "/", chunks if limit is None else _bounded(chunks, limit, within))
            finally:
                response.close()

        try:
            await self._call(copy)
        except BackendError:
            if within[0]:
                raise  # the engine refuses a stream cut short ("unexpected EOF"): that is the bound's
        return within[0]

    async def _workspace_layer(self, spec: ContainerSpec) -> Path | None:
        """The image's /workspace in its top layer, where this process can read it; None otherwise.

        A snapshot's image has all of /workspace in its last layer (layers.py, or the second
        commit of ``_snapshot_by_commit``).
        """
        try:
            attrs = await self._call(self._api().inspect_image, spec.image, idempotent=True)
        except (docker.errors.NotFound, docker.errors.ImageNotFound):
            return None
        upper = await asyncio.to_thread(layers.readable_upper, attrs)  # an image's top layer, as a container's
        if upper is None:
            return None
        workspace = upper / layers.WORKSPACE
        readable = await asyncio.to_thread(lambda: workspace.is_dir() and os.access(workspace, os.R_OK | os.X_OK))
        return workspace if readable else None

    async def _copy_into_volume(self, source: Path, volume: str) -> None:
        """Copy ``source`` (an image layer's /workspace) into the new volume, as the engine would: ``cp -a``.

        Raises:
            BackendError: the copy failed (the volume is not this host's to write in, a disk full).
        """
        mountpoint = (await self._call(self._api().inspect_volume, volume, idempotent=True)).get("Mountpoint", "")
        process = await asyncio.create_subprocess_exec(
            "cp",
            "-a",
            "--reflink=auto",
            "--",
            f"{source}/.",
            f"{mountpoint}/",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, said = await process.communicate()
        if process.returncode != 0:
            msg = (
                f"the snapshot's /workspace could not be copied into the fork's: {said.decode(errors='replace')[:500]}"
            )
            raise BackendError(msg)
        # The volume's root takes the image's directory's owner and mode, as the engine's copy gives it.
        stat = await asyncio.to_thread(source.stat)
        await asyncio.to_thread(os.chown, mountpoint, stat.st_uid, stat.st_gid)
        await asyncio.to_thread(os.chmod, mountpoint, stat.st_mode & 0o7777)


def _too_big(workspace_id: str, what: str, bound: int) -> QuotaExceededError:
    """A snapshot past one of its bounds (``what``: "/workspace is", "root filesystem changes are")."""
    return QuotaExceededError(
        f"workspace {workspace_id!r}'s {what} over {bound} bytes as an archive (a sparse file counts at its full "
        "length): too big to snapshot"
    )


def _bounded(stream: Iterator[bytes], limit: int, within: list[bool]) -> Iterator[bytes]:
    """``stream`` up to ``limit`` bytes; past it, it ends and ``within[0]`` is False.

    It ends rather than raises: what the HTTP client does with an exception from a request's
    body is its own (seen: the request was ended as if complete).
    """
    seen = 0
    for chunk in stream:
        seen += len(chunk)
        if seen > limit:
            within[0] = False
            return
        yield chunk
