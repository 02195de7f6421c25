"""Images and snapshots: inspect, pull, import, build and remove images; snapshot a container.

Also the engine's own facts (ping, architecture) and the agent volume an image fills.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import docker.errors
import structlog
from docker.types import Mount

from ...errors import (
    BackendError,
    DockerUnavailableError,
    ImageNotFoundError,
    InvalidSpecError,
    QuotaExceededError,
    SandboxdError,
    WorkspaceNotFoundError,
)
from ..base import LABEL_SNAPSHOT_PART, ImageInfo
from . import layers
from .claims import ClaimsMixin
from .client import LABEL_INSTANCE, LABEL_MANAGED, LABEL_WORKSPACE, WORKSPACE_MOUNT, _parse_time
from .errors import EngineErrorKind, kind_of, reason

SNAPSHOT_REPOSITORY = "sandboxd/snapshot"

log = structlog.get_logger(__name__)


class ImagesMixin(ClaimsMixin):
    """The engine, its images, and snapshots of workspace containers."""

    _root: Path | None = None

    async def _engine_root(self) -> Path:
        """The engine's data root (``docker info``'s DockerRootDir), asked once."""
        if self._root is None:
            info = await self._call(self._api().info, idempotent=True)
            self._root = Path(str(info.get("DockerRootDir") or "/var/lib/docker"))
        return self._root

    async def ping(self) -> None:
        """Return when the engine answers; DockerUnavailableError otherwise."""
        await self._call(self._api().ping, idempotent=True)

    async def image_info(self, ref: str) -> ImageInfo | None:
        """Return the local image ``ref``, or None when it is not present."""
        try:
            attrs = await self._call(self._api().inspect_image, ref, idempotent=True)
        except (docker.errors.NotFound, docker.errors.ImageNotFound):
            return None
        except BackendError as exc:
            if kind_of(exc) is EngineErrorKind.INVALID_REFERENCE:
                msg = f"image {ref!r} is not a valid image reference"
                raise InvalidSpecError(msg) from exc
            raise
        config = attrs.get("Config") or {}
        return ImageInfo(
            image_id=attrs["Id"],
            user=config.get("User") or "",
            os=attrs.get("Os") or "linux",
            labels=config.get("Labels") or {},
            ref=ref,
            size_bytes=int(attrs.get("Size") or 0),
            created=_parse_time(attrs["Created"]) if attrs.get("Created") else None,
        )

    async def pull_image(self, ref: str) -> ImageInfo:
        """Pull ``ref``; ImageNotFoundError when no registry provides it."""
        repository, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "latest")
        try:
            await self._call(self._api().pull, repository, tag=tag)
        except (docker.errors.NotFound, docker.errors.ImageNotFound, BackendError, DockerUnavailableError) as exc:
            msg = f"image {ref!r} is not present and could not be pulled: {reason(exc)}"
            raise ImageNotFoundError(msg) from exc
        info = await self.image_info(ref)
        if info is None:
            msg = f"image {ref!r} was pulled but is not present"
            raise ImageNotFoundError(msg)
        return info

    async def import_image(self, rootfs_tar: Path, ref: str) -> None:
        """Create image ``ref`` from a root filesystem tarball."""
        repository, _, tag = ref.rpartition(":")
        await self._call(self._api().import_image_from_file, str(rootfs_tar), repository=repository, tag=tag)

    async def build_image(
        self,
        context: Path,
        ref: str,
        *,
        build_args: Mapping[str, str],
        labels: Mapping[str, str],
        on_line: Callable[[str], None],
        target: str = "",
        no_cache: bool = False,
    ) -> None:
        """Build ``context`` as ``ref`` (up to stage ``target``; ``no_cache`` reruns every step), streaming its log."""

        def build() -> None:
            stream = self._api().build(
                path=str(context),
                tag=ref,
                buildargs=dict(build_args),
                labels=dict(labels),
                rm=True,
                forcerm=True,
                decode=True,
                target=target or None,
                nocache=no_cache,
            )
            for item in stream:
                if "error" in item:
                    msg = f"building {ref} failed: {item['error'].strip()}"
                    raise BackendError(msg)
                text = item.get("stream", "")
                for line in text.splitlines():
                    if line.strip():
                        on_line(line.rstrip())

        await self._call(build)

    async def remove_image(self, ref: str, *, prune: bool = False) -> None:
        """Untag ``ref`` (its layers stay as build cache, unless ``prune``); nothing happens if it is not there.

        An image containers still use loses its tag only; its layers go with the last of them.
        """
        with contextlib.suppress(docker.errors.NotFound, docker.errors.ImageNotFound):
            await self._call(self._api().remove_image, ref, force=prune, noprune=not prune)

    async def architecture(self) -> str:
        """The engine's CPU architecture, as it reports it (``x86_64``, ``aarch64``)."""
        info = await self._call(self._api().info, idempotent=True)
        return str(info.get("Architecture", ""))

    async def fill_volume(self, name: str, *, image: str, path: str, labels: Mapping[str, str]) -> None:
        """Make volume ``name`` hold what ``image`` has at ``path`` (the agent binary), once.

        Docker copies an image's content into an empty named volume mounted over it; a
        volume that holds something already is left as it is. The copy is made by a
        container of ``image`` that runs ``PATH/sandboxd-agent version`` and is removed.

        A filler a daemon killed meanwhile left behind (it ended, and nobody removed it) is
        removed first: every daemon start fills, so such debris lives until the next start.

        Raises:
            BackendError: the image does not run there.
        """
        api = self._api()
        ended = {"label": [f"{LABEL_MANAGED}=true", "sandboxd.volume.kind=agent-filler"], "status": ["exited", "dead"]}
        for debris in await self._call(api.containers, all=True, filters=ended, idempotent=True):
            with contextlib.suppress(SandboxdError, docker.errors.NotFound):
                await self._call(api.remove_container, debris["Id"], force=True)
        try:
            await self._call(api.inspect_volume, name, idempotent=True)
        except docker.errors.NotFound:
            await self._call(
                api.create_volume, name=name, labels={**labels, LABEL_MANAGED: "true", "sandboxd.volume.kind": "agent"}
            )
        holder = await self._call(
            api.create_container,
            image,
            command=[f"{path}/sandboxd-agent", "version"],
            labels={LABEL_MANAGED: "true", "sandboxd.volume.kind": "agent-filler"},
            host_config=api.create_host_config(
                mounts=[Mount(target=path, source=name, type="volume")], network_mode="none"
            ),
        )
        try:
            await self._call(api.start, holder["Id"])
            result = await self._call(api.wait, holder["Id"], timeout=60)
            if result.get("StatusCode") != 0:
                logs = await self._call(api.logs, holder["Id"], tail=5)
                msg = f"the agent in {image} does not run: {logs.decode('utf-8', 'replace').strip()}"
                raise BackendError(msg)
        finally:
            with contextlib.suppress(SandboxdError):
                await self._call(api.remove_container, holder["Id"], force=True)

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

        ``docker commit`` takes the root filesystem (the container frozen meanwhile) but never a
        volume, so a second step copies /workspace in: a container of the commit, never
        started, is given the volume's files as a tar stream read from the workspace (a few
        MiB at a time, whatever its size), and is committed as ``ref``.
        """
        api = self._api()
        await self._load_claims()
        name = self._ref(workspace_id)
        try:
            attrs = await self._call(api.inspect_container, name, idempotent=True)
        except docker.errors.NotFound as exc:
            msg = f"workspace {workspace_id!r} not found"
            raise WorkspaceNotFoundError(msg) from exc
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
                    await self._call(api.pause, attrs["Id"])
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

    async def list_images(self, labels: Mapping[str, str]) -> list[ImageInfo]:
        """This daemon's images carrying every label in ``labels`` (snapshots), oldest first."""
        selector = {LABEL_MANAGED: "true", LABEL_INSTANCE: self.instance, **labels}
        filters = {"label": [f"{k}={v}" for k, v in selector.items()]}
        listed = await self._call(self._api().images, filters=filters, idempotent=True)
        found = []
        for summary in listed:
            tags = [t for t in summary.get("RepoTags") or [] if t.startswith(f"{SNAPSHOT_REPOSITORY}:")]
            if tags:
                found.append((summary.get("Created", 0), summary, tags[0]))
        return [
            ImageInfo(
                image_id=summary["Id"],
                user="",
                os="linux",
                labels=summary.get("Labels") or {},
                ref=tag,
                size_bytes=int(summary.get("Size") or 0),
                created=datetime.datetime.fromtimestamp(created, datetime.UTC),
            )
            for created, summary, tag in sorted(found, key=lambda item: item[0])
        ]

    async def remove_unused_images(self) -> list[str]:
        """Remove this daemon's images nothing needs; return their ids.

        A deleted snapshot's once no workspace runs from it, and the intermediate image of a
        snapshot cut short.
        """
        api = self._api()
        removed = []
        for filters in (
            {"label": [f"{LABEL_INSTANCE}={self.instance}", f"{LABEL_SNAPSHOT_PART}=true"]},
            {"label": [f"{LABEL_INSTANCE}={self.instance}"], "dangling": True},
        ):
            for image in await self._call(api.images, filters=filters, idempotent=True):
                with contextlib.suppress(docker.errors.NotFound, docker.errors.ImageNotFound, BackendError):
                    await self._call(api.remove_image, image["Id"])  # refused while a container uses it
                    removed.append(image["Id"])
        return removed


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
