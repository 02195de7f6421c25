"""Images: inspect, pull, import, build, list and remove images (snapshots.py makes a container's).

Also the engine's own facts (ping, architecture) and the agent volume an image fills.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Mapping
from pathlib import Path

import docker.errors
import structlog
from docker.types import Mount

from ...errors import (
    BackendError,
    DockerUnavailableError,
    ImageNotFoundError,
    InvalidSpecError,
    SandboxdError,
)
from ..base import LABEL_SNAPSHOT_PART, ImageInfo
from .claims import ClaimsMixin
from .client import LABEL_INSTANCE, LABEL_MANAGED, _parse_time
from .errors import EngineErrorKind, kind_of, reason

SNAPSHOT_REPOSITORY = "sandboxd/snapshot"

log = structlog.get_logger(__name__)


class ImagesMixin(ClaimsMixin):
    """The engine, its images (snapshots among them: listed and removed here), and its data root."""

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
