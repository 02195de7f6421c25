"""Images: inspect, pull, import, build, list and remove images (snapshots.py makes a container's).

Also the engine's own facts (ping, architecture) and the agent volume an image fills.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import io
import re
import secrets
import socket
import tarfile
import threading
from collections.abc import AsyncGenerator, Callable, Mapping
from pathlib import Path
from typing import Any

import docker.errors
import structlog
from docker.types import Mount

from ...errors import (
    BackendError,
    BuildFailedError,
    DockerUnavailableError,
    ImageNotFoundError,
    InvalidSpecError,
    SandboxdError,
)
from ..base import LABEL_SNAPSHOT_PART, ImageInfo
from .claims import ClaimsMixin
from .client import API_VERSION, LABEL_INSTANCE, LABEL_MANAGED, _parse_time
from .errors import EngineErrorKind, kind_of, reason

SNAPSHOT_REPOSITORY = "sandboxd/snapshot"
_BUILD_QUEUE = 256
"""Log events of a build held for its reader at most (the engine's builder waits meanwhile)."""
_MAX_BUILD_LINE = 16 * 1024
"""Characters of a build's log line kept (a step that prints one huge line)."""
_STEP_RE = re.compile(r"^Step (\d+)/\d+ : ")
_MADE_RE = re.compile(r"^ ---> ([0-9a-f]{12,64})$")
_RUNNING_RE = re.compile(r"^ ---> Running in ([0-9a-f]{12,64})$")
_BUILD_STEP_FAILED = ("returned a non-zero code", "COPY failed", "ADD failed", "failed to compute cache key")
_BUILD_NO_IMAGE = ("pull access denied", "repository does not exist", "manifest unknown", "not found: manifest")


def _word(value: str) -> str:
    """``value`` as one double-quoted Dockerfile word, nothing in it expanded.

    Raises:
        InvalidSpecError: it holds a line break, which a Dockerfile word cannot.
    """
    if "\n" in value or "\r" in value:
        msg = f"a label holds a line break: {value[:80]!r}"
        raise InvalidSpecError(msg)
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def _add_member(archive: Path, name: str, data: bytes) -> None:
    """Append file ``name`` holding ``data`` to the uncompressed tar ``archive``."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    with tarfile.open(archive, "a:") as tar:
        tar.addfile(info, io.BytesIO(data))


def _build_error(cause: object, ref: str, step: int) -> SandboxdError:
    """The error a failed build raises: a step's failure, a FROM image missing, or the engine's."""
    if isinstance(cause, SandboxdError):
        return cause
    if isinstance(cause, docker.errors.APIError):
        text = str(cause.explanation or cause)
    elif isinstance(cause, Exception):
        return DockerUnavailableError(f"building {ref}: the engine's connection broke: {cause}")
    else:
        text = str(cause)
    text = text.strip()
    lowered = text.lower()
    if any(marker.lower() in lowered for marker in _BUILD_NO_IMAGE):
        return ImageNotFoundError(f"a FROM image is not on the engine and could not be pulled: {text}")
    if "dockerfile parse error" in lowered or "unknown instruction" in lowered or "line greater than" in lowered:
        return InvalidSpecError(f"the Dockerfile does not parse: {text}")
    if "error processing tar file" in lowered:
        return InvalidSpecError(f"the build context cannot be unpacked by the engine: {text}")
    if any(marker.lower() in lowered for marker in _BUILD_STEP_FAILED) or step:
        return BuildFailedError(text, step=step)
    return BackendError(f"building {ref} failed: {text}")


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
            working_dir=config.get("WorkingDir") or "",
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

    async def build_archive(
        self,
        archive: Path,
        ref: str,
        *,
        dockerfile: str,
        labels: Mapping[str, str],
        no_cache: bool,
        memory_bytes: int,
        network: str = "default",
    ) -> AsyncGenerator[str, None]:
        """Build the tar ``archive`` with ``dockerfile`` (its text, added to it) as ``ref``; yield each log line.

        Closing the iterator early cancels the build.

        The build has an engine connection of its own: cutting it (shutdown of its socket) is
        how a build is stopped, since the engine ends a build whose client went away and
        removes its step's container.
        """
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        room = threading.Semaphore(_BUILD_QUEUE)
        stopped = threading.Event()
        sockets: list[socket.socket] = []
        # The labels as one LABEL step of the Dockerfile's own (the engine's ``labels`` parameter
        # adds a step, and a container, per label).
        marks = {**labels, LABEL_MANAGED: "true", LABEL_INSTANCE: self.instance}
        name = f".sandboxd-{secrets.token_hex(8)}.Dockerfile"
        text = (
            dockerfile.rstrip("\n") + "\nLABEL " + " ".join(f"{_word(k)}={_word(v)}" for k, v in marks.items()) + "\n"
        )
        await asyncio.to_thread(_add_member, archive, name, text.encode())
        params = {
            "t": ref,
            "dockerfile": name,
            "rm": "1",
            "forcerm": "1",
            "nocache": "1" if no_cache else "0",
            "memory": str(memory_bytes),
            "memswap": str(memory_bytes),
            # One CPU at most, as a workspace's default: a step is no more than a workspace.
            "cpuperiod": "100000",
            "cpuquota": "100000",
            "networkmode": network,
        }

        def put(kind: str, value: Any) -> None:
            # Back-pressure: a step that prints faster than the caller reads waits here.
            while not room.acquire(timeout=0.5):
                if stopped.is_set():
                    return
            loop.call_soon_threadsafe(items.put_nowait, (kind, value))

        def run() -> None:
            api = docker.APIClient(base_url=self.docker_host, version=API_VERSION, timeout=int(self._timeout_s))
            try:
                with archive.open("rb") as data:
                    response = api._post(
                        api._url("/build"),
                        params=params,
                        data=data,
                        headers={"Content-Type": "application/x-tar"},
                        stream=True,
                        timeout=None,
                    )
                    raw = api._get_raw_response_socket(response)
                    sockets.append(getattr(raw, "_sock", raw))
                    if stopped.is_set():
                        return
                    for item in api._stream_helper(response, decode=True):
                        put("item", item)
                        if stopped.is_set():
                            return
                put("end", None)
            except Exception as exc:  # handed to the caller, who raises what it means
                put("error", exc)
            finally:
                api.close()

        thread = threading.Thread(target=run, name="image-build", daemon=True)
        thread.start()
        step = 0
        made: list[str] = []  # the images of the steps this build ran (not those the cache gave)
        steps_run: list[str] = []  # the containers its steps ran in
        cached = finished = False  # cached: the next image named is not this build's own
        try:
            while True:
                kind, value = await items.get()
                room.release()
                if kind == "end":
                    finished = True
                    return
                if kind == "error":
                    raise _build_error(value, ref, step) from value
                if "error" in value:
                    detail = value.get("errorDetail") or {}
                    raise _build_error(str(detail.get("message") or value["error"]), ref, step)
                for line in str(value.get("stream", "")).splitlines():
                    if line.strip():
                        match = _STEP_RE.match(line)
                        if match:
                            step = int(match.group(1))
                            # A FROM step's image is the base's: never this build's to remove.
                            cached = line[match.end() :].upper().startswith("FROM ")
                        made_id = _MADE_RE.match(line)
                        running = _RUNNING_RE.match(line)
                        if running:
                            steps_run.append(running.group(1))
                        if line.strip() == "---> Using cache":
                            cached = True
                        elif made_id:
                            if not cached:
                                made.append(made_id.group(1))
                            cached = False
                        yield line.rstrip()[:_MAX_BUILD_LINE]
        finally:
            stopped.set()
            for sock in sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            await asyncio.to_thread(thread.join)
            if not finished:
                # A build that failed or was stopped keeps nothing: its steps' containers (the
                # engine leaves one it had made but not started when the build's client went) and
                # their images (untagged and unlabelled, so no sweep would find them), the last first.
                for container_id in reversed(steps_run):
                    with contextlib.suppress(SandboxdError, docker.errors.APIError):
                        await self._call(self._api().remove_container, container_id, force=True)
                for image_id in reversed(made):
                    with contextlib.suppress(SandboxdError, docker.errors.APIError):
                        await self._call(self._api().remove_image, image_id)

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
