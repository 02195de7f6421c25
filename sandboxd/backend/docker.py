"""DockerBackend: the Docker SDK behind the :class:`~sandboxd.backend.base.Backend` seam.

Blocking SDK calls run through ``asyncio.to_thread``. Exec streams do not: the
daemon opens the hijacked ``/exec/{id}/start`` connection itself with asyncio,
so a slow or silent command costs no thread and cancellation is immediate.
Every ``docker.errors`` / ``requests`` failure is translated here into a
``SandboxdError`` (``raise ... from exc``); nothing above this module sees the SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import functools
import json
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import docker
import docker.errors
import requests.exceptions
import structlog
import tenacity
from docker.types import DriverConfig, Mount

from .. import metrics
from ..errors import (
    BackendError,
    DockerUnavailableError,
    FailedPreconditionError,
    ImageNotFoundError,
    InvalidSpecError,
    LeaseHeldError,
    QuotaExceededError,
    SandboxdError,
    WorkspaceExistsError,
    WorkspaceNotFoundError,
    WorkspaceNotRunningError,
)
from .base import (
    LABEL_EGRESS_OF,
    LABEL_EGRESS_RULES,
    LABEL_LEASE,
    LABEL_POOL,
    LABEL_SNAPSHOT_PART,
    ContainerInfo,
    ContainerSpec,
    ImageInfo,
)

__all__ = ["API_VERSION", "LABEL_INSTANCE", "LABEL_MANAGED", "LABEL_MEMBER", "LABEL_WORKSPACE", "DockerBackend"]

API_VERSION = "1.41"
"""Docker Engine API version spoken (Docker 20.10 and every later engine accept it)."""

LABEL_MANAGED = "sandboxd.managed"
LABEL_INSTANCE = "sandboxd.instance"
LABEL_WORKSPACE = "sandboxd.workspace_id"
LABEL_CLAIM_OF = "sandboxd.claim_of"
"""On a claim record (a volume): the id the claimed container was created with."""
LABEL_CLAIM_CONTAINER = "sandboxd.claim_container"
"""On a claim record: the claimed container's id (what every call names it by: it never changes)."""
LABEL_MEMBER = "sandboxd.pool_member"
"""In a claimed container's labels as this backend reports them: the id it was created with."""
PROVISIONAL_SUFFIX = ".creating"
"""A container's name is the workspace's plus this until its create is complete (``commit_container``):
one found so at a start is a create the daemon did not finish, and is removed."""
CLAIM_SUFFIX = ".claim"
"""A claim record's volume is the workspace's name plus this (a workspace id has no dot)."""
SNAPSHOT_REPOSITORY = "sandboxd/snapshot"
HOSTNAME = "sandbox"
"""Every workspace's host name: the same for a claimed pool member as for a fresh container."""
WORKSPACE_MOUNT = "/workspace"
MAIN_USER = "0:0"
"""The main process (PID 1 is Docker's init; this is its only child) runs as root, with only the
capabilities the spec names: the workspace user, who can signal every process of its own uid,
cannot stop the container with `kill -9 -1`."""
_MUX_HEADER = struct.Struct(">BxxxI")
_STREAM_LIMIT = 4 * 1024 * 1024
_SOCKET_READ_BYTES = 1024 * 1024
"""Most bytes one read of a direct socket returns (whatever has arrived, up to this)."""
EXEC_RUN_TIMEOUT_S = 60.0
"""The longest :meth:`DockerBackend.exec_run` waits for its command (a mkdir at a claim)."""
_EXEC_RUN_OUTPUT_BYTES = 1024 * 1024
"""What :meth:`DockerBackend.exec_run` keeps of its command's output."""
_EXEC_SILENCE_S = 1.0
"""Silence on an exec's stream after which the engine is asked whether the exec ended."""
_PRIVATE_DIR_OPTIONS = {"type": "tmpfs", "device": "tmpfs", "o": "size=1m,mode=0700,nosuid,nodev,noexec"}

log = structlog.get_logger(__name__)
T = TypeVar("T")


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, DockerUnavailableError) or (
        isinstance(exc, BackendError) and getattr(exc, "transient", False)
    )


class DockerBackend:
    """Workspaces as Docker containers on one engine.

    Args:
        docker_host: engine address, ``unix:///path`` or ``tcp://host:port``.
        instance: value of the ``sandboxd.instance`` label on everything created.
        timeout_s: timeout of each blocking API call, in seconds.
        retries: retry idempotent calls on transient failures (bounded, jittered).
    """

    def __init__(self, *, docker_host: str, instance: str, timeout_s: float = 60.0, retries: bool = True) -> None:
        """Configure the backend; nothing connects until the first call."""
        self.docker_host = docker_host
        self.instance = instance
        self._timeout_s = timeout_s
        self._retries = retries
        self._api_client: docker.APIClient | None = None
        self._claims: dict[str, str] | None = None
        """Workspace id -> the id its container was created with, for claimed containers
        (:meth:`claim_container`); None until read from the claim records."""
        self._claimed: dict[str, dict[str, str]] = {}
        """Created-with id -> the labels the claimed container answers with."""
        self._claim_ids: dict[str, str] = {}
        """Workspace id -> its claimed container's id."""
        self._provisional_ids: dict[str, str] = {}
        """Workspace id -> the id of its container while it is being created (provisionally named)."""

    # -- plumbing --------------------------------------------------------------
    def _api(self) -> docker.APIClient:
        if self._api_client is None:
            try:
                self._api_client = docker.APIClient(
                    base_url=self.docker_host, version=API_VERSION, timeout=int(self._timeout_s)
                )
            except docker.errors.DockerException as exc:
                msg = f"cannot use Docker engine address {self.docker_host!r}: {exc}"
                raise DockerUnavailableError(msg) from exc
        return self._api_client

    def _check_socket(self) -> None:
        """Fail fast when nothing listens on the engine's Unix socket.

        docker-py's ``UnixHTTPConnection.connect`` leaks its socket when the connect
        fails; probing first (tens of microseconds) keeps an engine outage from
        leaking a descriptor per call.
        """
        url = urlparse(self.docker_host)
        if url.scheme != "unix":
            return
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(url.path)
        except FileNotFoundError:
            msg = f"Docker engine unreachable at {self.docker_host}: no such socket"
            raise DockerUnavailableError(msg) from None
        except OSError as exc:
            msg = f"Docker engine unreachable at {self.docker_host}: {exc.strerror or exc}"
            raise DockerUnavailableError(msg) from None
        finally:
            probe.close()

    def _translate(self, exc: Exception) -> SandboxdError:
        if isinstance(exc, SandboxdError):
            return exc
        if isinstance(exc, requests.exceptions.ConnectionError | FileNotFoundError | ConnectionError):
            return DockerUnavailableError(f"Docker engine unreachable at {self.docker_host}: {_reason(exc)}")
        if isinstance(exc, requests.exceptions.Timeout):
            return DockerUnavailableError(f"Docker engine at {self.docker_host} did not answer in time")
        if isinstance(exc, docker.errors.APIError):
            error = BackendError(f"Docker engine error: {exc.explanation or exc}")
            error.transient = exc.status_code is not None and exc.status_code >= 500  # type: ignore[attr-defined]
            return error
        if isinstance(exc, docker.errors.DockerException):
            return DockerUnavailableError(f"Docker engine at {self.docker_host} failed: {exc}")
        return BackendError(f"Docker call failed: {exc}")

    async def _call(self, fn: Callable[..., T], *args: Any, idempotent: bool = False, **kwargs: Any) -> T:
        """Run a blocking SDK call off the event loop, translating its errors."""

        def probed() -> T:
            self._check_socket()
            return fn(*args, **kwargs)

        async def attempt() -> T:
            try:
                result = await asyncio.to_thread(probed)
            except (docker.errors.NotFound, docker.errors.ImageNotFound):
                metrics.DOCKER_CALLS.labels(outcome="not_found").inc()
                raise
            except Exception as exc:  # every SDK failure is translated, none escapes raw
                error = self._translate(exc)
                unavailable = isinstance(error, DockerUnavailableError)
                metrics.DOCKER_CALLS.labels(outcome="unavailable" if unavailable else "error").inc()
                if isinstance(error, DockerUnavailableError):
                    # The pool's connections died with the engine: start over with fresh ones.
                    await self.close()
                raise error from exc
            metrics.DOCKER_CALLS.labels(outcome="ok").inc()
            return result

        if not (idempotent and self._retries):
            return await attempt()
        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(_is_transient),
            wait=tenacity.wait_exponential_jitter(multiplier=0.1, exp_base=2, max=1.0, jitter=0.3),
            # Bounded so that an engine that is gone is reported UNAVAILABLE within a few seconds.
            stop=tenacity.stop_after_attempt(4) | tenacity.stop_after_delay(2.5),
            before_sleep=_retrying(getattr(fn, "__name__", str(fn))),
            reraise=True,
        )
        return await retrying(attempt)

    def _name(self, workspace_id: str) -> str:
        """The workspace's container's name (a claimed member is renamed so), and a fresh one's volume's."""
        return f"sandboxd-{self.instance}-{workspace_id}"

    def _provisional_name(self, workspace_id: str) -> str:
        """The name a container bears until :meth:`commit_container` (ids have no dot: it is no other's)."""
        return f"{self._name(workspace_id)}{PROVISIONAL_SUFFIX}"

    def _ref(self, workspace_id: str) -> str:
        """What calls name the workspace's container by: a claimed or uncommitted one's id, else its name."""
        return self._claim_ids.get(workspace_id) or self._provisional_ids.get(workspace_id) or self._name(workspace_id)

    def _volume_name(self, workspace_id: str) -> str:
        """The name of the workspace's /workspace volume: a claimed workspace's keeps its member's."""
        return self._name((self._claims or {}).get(workspace_id, workspace_id))

    def _labels(self, labels: Mapping[str, str]) -> Mapping[str, str]:
        """A container's labels as callers see them: a claimed one's are its claim's."""
        return self._claimed.get(labels.get(LABEL_WORKSPACE, ""), labels)

    async def _load_claims(self, *, again: bool = False) -> None:
        """Read the claim records (once, or ``again``)."""
        if self._claims is not None and not again:
            return
        selector = {"label": [f"{LABEL_INSTANCE}={self.instance}", LABEL_CLAIM_OF]}
        volumes = (await self._call(self._api().volumes, filters=selector, idempotent=True)).get("Volumes") or []
        claims, claimed, ids = {}, {}, {}
        for volume in volumes:
            record = volume.get("Labels") or {}
            member, workspace_id = record.get(LABEL_CLAIM_OF, ""), record.get(LABEL_WORKSPACE, "")
            if member and workspace_id and volume["Name"] == self._claim_name(workspace_id):
                claims[workspace_id] = member
                claimed[member] = _claimed_labels(record, member)
                if record.get(LABEL_CLAIM_CONTAINER):
                    ids[workspace_id] = record[LABEL_CLAIM_CONTAINER]
        self._claims, self._claimed, self._claim_ids = claims, claimed, ids

    async def _drop_stale_claim(self, workspace_id: str) -> None:
        """Forget a claim whose container is gone (removed behind the daemon's back), with its record."""
        await self._load_claims()
        member = (self._claims or {}).get(workspace_id)
        container = self._claim_ids.get(workspace_id)
        if member is None:
            return
        if container:
            try:
                await self._call(self._api().inspect_container, container, idempotent=True)
            except docker.errors.NotFound:
                pass
            else:
                return  # it is there: not stale
        log.warning("workspace.stale_claim_removed", workspace_id=workspace_id, member=member)
        with contextlib.suppress(docker.errors.NotFound, BackendError):
            await self._call(self._api().remove_volume, self._volume_name(workspace_id), force=True, idempotent=True)
        await self._remove_private_volumes(member)
        await self._remove_private_volumes(workspace_id)  # the record among them
        if self._claims is not None:
            self._claims.pop(workspace_id, None)
        self._claimed.pop(member, None)
        self._claim_ids.pop(workspace_id, None)

    def _claim_name(self, workspace_id: str) -> str:
        return f"sandboxd-{self.instance}-{workspace_id}{CLAIM_SUFFIX}"

    def _info(self, attrs: Mapping[str, Any]) -> ContainerInfo:
        labels = self._labels(attrs["Config"]["Labels"] or {})
        volume = next(
            (m.get("Name", "") for m in attrs.get("Mounts", []) if m.get("Destination") == WORKSPACE_MOUNT), ""
        )
        return ContainerInfo(
            workspace_id=labels.get(LABEL_WORKSPACE, ""),
            container_id=attrs["Id"],
            volume_name=volume,
            labels=labels,
            running=bool(attrs["State"].get("Running")) and not attrs["State"].get("Paused"),
            paused=bool(attrs["State"].get("Paused")),
            image_id=attrs.get("Image") or "",
            create_time=_parse_time(attrs["Created"]),
            os=attrs.get("Platform") or "linux",
            runtime=(attrs.get("HostConfig") or {}).get("Runtime") or "",
            mounts={
                m["Destination"]: m["Source"]
                for m in attrs.get("Mounts", [])
                if m.get("Type") == "volume" and m.get("Destination") and m.get("Source")
            },
            networks=tuple(sorted((attrs.get("NetworkSettings") or {}).get("Networks") or {})),
        )

    # -- engine and images ------------------------------------------------------------
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
            if "invalid reference" in exc.message:
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
            msg = f"image {ref!r} is not present and could not be pulled: {_reason(exc)}"
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

        Raises:
            BackendError: the image does not run there.
        """
        api = self._api()
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

    # -- containers ---------------------------------------------------------------------
    async def create_container(self, spec: ContainerSpec) -> ContainerInfo:
        """Create volume and container, start it, and return it running, provisionally named (see Backend)."""
        api = self._api()
        await self._drop_stale_claim(spec.workspace_id)
        name = self._name(spec.workspace_id)
        labels = {**spec.labels, LABEL_MANAGED: "true", LABEL_INSTANCE: self.instance}
        labels[LABEL_WORKSPACE] = spec.workspace_id
        provisional = self._provisional_name(spec.workspace_id)
        existing = await self._call(api.containers, all=True, filters={"name": f"^/{name}(\\{PROVISIONAL_SUFFIX})?$"})
        if existing:
            msg = f"workspace {spec.workspace_id!r} already exists"
            raise WorkspaceExistsError(msg)
        try:
            await self._call(api.inspect_volume, name, idempotent=True)
        except docker.errors.NotFound:
            pass
        else:
            # A volume with no container: its workspace was removed behind the daemon's back.
            # The engine would hand it, files and all, to the new workspace (perhaps another
            # tenant's): it goes first.
            log.warning("workspace.leftover_volume_removed", workspace_id=spec.workspace_id)
            with contextlib.suppress(docker.errors.NotFound):
                await self._call(api.remove_volume, name, force=True, idempotent=True)
            await self._remove_private_volumes(spec.workspace_id)
        mounts = [Mount(target=WORKSPACE_MOUNT, source=name, type="volume")]
        if spec.agent_volume:
            mounts.append(Mount(target=spec.agent_mount, source=spec.agent_volume, type="volume", read_only=True))
        private_labels = {LABEL_MANAGED: "true", LABEL_INSTANCE: self.instance, LABEL_WORKSPACE: spec.workspace_id}
        for path in spec.private_dirs:
            # An anonymous volume on a tmpfs, gone with the container: unlike a tmpfs mount, the
            # engine's host sees it, so a daemon on that machine reaches the socket in it directly.
            mounts.append(
                Mount(
                    target=path,
                    source=None,
                    type="volume",
                    # Nothing of the image's own directory there: Docker would copy it in and
                    # hand the volume to that directory's owner.
                    no_copy=True,
                    labels=private_labels,
                    driver_config=DriverConfig("local", _PRIVATE_DIR_OPTIONS),
                )
            )
        tmpfs: dict[str, str] = {}
        if spec.read_only_root_filesystem:
            tmpfs["/tmp"] = f"rw,nosuid,nodev,mode=1777,size={spec.memory_bytes}"
        capabilities = sorted({*spec.added_capabilities, *spec.agent_capabilities})
        host_config = api.create_host_config(
            init=True,
            mounts=mounts,
            cap_drop=["ALL"],
            cap_add=capabilities or None,
            security_opt=["no-new-privileges:true"] if spec.no_new_privileges else None,
            pids_limit=spec.pids,
            mem_limit=spec.memory_bytes,
            memswap_limit=spec.memory_bytes,
            nano_cpus=spec.cpu_millis * 1_000_000,
            network_mode=spec.network,
            runtime=spec.runtime,
            # An engine restart brings workspaces back; the daemon re-adopts them by label.
            restart_policy={"Name": "unless-stopped"},
            read_only=spec.read_only_root_filesystem,
            tmpfs=tmpfs or None,
            dns_opt=list(spec.dns_options) or None,
        )
        driver_opts = None
        if spec.disk_bytes:
            # The local driver mounts a size-capped tmpfs: a hard cap that works on every storage
            # driver (fuse-overlayfs and overlay2 on ext4 have no per-volume quota). Mode 1777:
            # the workspace user, whoever it is, must own its files.
            driver_opts = {"type": "tmpfs", "device": "tmpfs", "o": f"size={spec.disk_bytes},mode=1777"}
        await self._call(api.create_volume, name=name, labels=labels, driver_opts=driver_opts)
        try:
            created = await self._call(
                api.create_container,
                spec.image,
                name=provisional,
                entrypoint=list(spec.entrypoint) or ["sleep", "infinity"],
                command=[],
                user=MAIN_USER,
                environment=dict(spec.env),
                working_dir=spec.working_dir,
                labels=labels,
                hostname=HOSTNAME,
                host_config=host_config,
                # Not disabled even with no network: UpdateNetwork may connect it later (a container
                # created with its network disabled takes no interface from a network it joins).
            )
            self._provisional_ids[spec.workspace_id] = created["Id"]
            await self._call(api.start, created["Id"])
            if spec.disk_bytes and spec.seed_workspace:
                await self._seed_workspace(created["Id"], spec.image)
        except docker.errors.ImageNotFound as exc:
            await self.remove_container(spec.workspace_id)
            msg = f"image {spec.image!r} is not present on the Docker engine"
            raise ImageNotFoundError(msg) from exc
        except docker.errors.NotFound as exc:
            await self.remove_container(spec.workspace_id)
            raise self._translate(docker.errors.APIError(str(exc))) from exc
        except BackendError as exc:
            if "Conflict" in exc.message or "already in use" in exc.message:
                # Another create of this name won the race: what exists is its workspace.
                msg = f"workspace {spec.workspace_id!r} already exists"
                raise WorkspaceExistsError(msg) from exc
            await self.remove_container(spec.workspace_id)
            if "no space left on device" in exc.message:
                # The engine's copy of the image's /workspace into a capped volume: too big for it.
                msg = f"the image's /workspace does not fit the workspace's cap of {spec.disk_bytes} bytes"
                raise QuotaExceededError(msg) from exc
            msg = f"the Docker engine rejected the workspace: {exc.message}"
            raise InvalidSpecError(msg) from exc
        except BaseException:
            await asyncio.shield(self.remove_container(spec.workspace_id))
            raise
        return await self.inspect_container(spec.workspace_id)

    async def commit_container(self, workspace_id: str) -> None:
        """Give a created container its workspace's name (see Backend): one rename."""
        container_id = self._provisional_ids.get(workspace_id)
        if container_id is None:
            return
        try:
            await self._call(self._api().rename, container_id, self._name(workspace_id))
        except docker.errors.NotFound as exc:
            msg = f"workspace {workspace_id!r} not found"  # removed behind the daemon's back meanwhile
            raise WorkspaceNotFoundError(msg) from exc
        finally:
            self._provisional_ids.pop(workspace_id, None)

    async def inspect_container(self, workspace_id: str) -> ContainerInfo:
        """Return one of this daemon's workspace containers, or WorkspaceNotFoundError."""
        await self._load_claims()
        try:
            attrs = await self._call(self._api().inspect_container, self._ref(workspace_id), idempotent=True)
        except docker.errors.NotFound as exc:
            msg = f"workspace {workspace_id!r} not found"
            raise WorkspaceNotFoundError(msg) from exc
        info = self._info(attrs)
        labels = info.labels
        named = (
            workspace_id in self._claim_ids
            or workspace_id in self._provisional_ids
            or attrs.get("Name", "").lstrip("/") == self._name(workspace_id)
        )
        if (
            not named  # an id's prefix, not its name
            or labels.get(LABEL_MANAGED) != "true"
            or labels.get(LABEL_INSTANCE) != self.instance
            or info.workspace_id != workspace_id  # a pool member claimed since, asked for by its old id
        ):
            msg = f"workspace {workspace_id!r} not found"
            raise WorkspaceNotFoundError(msg)
        return info

    async def list_containers(self, labels: Mapping[str, str]) -> list[ContainerInfo]:
        """Return this daemon's workspace containers carrying every label in ``labels``.

        The selector is matched here, not by the engine: a claimed container's labels are its claim's.
        """
        await self._load_claims()
        filters = {"label": [f"{LABEL_MANAGED}=true", f"{LABEL_INSTANCE}={self.instance}"]}
        listed = await self._call(self._api().containers, all=True, filters=filters, idempotent=True)
        infos = []
        for summary in listed:
            seen = self._labels(summary.get("Labels") or {})
            if any(seen.get(key) != value for key, value in labels.items()):
                continue
            try:
                attrs = await self._call(self._api().inspect_container, summary["Id"], idempotent=True)
            except docker.errors.NotFound:
                continue  # removed between the listing and the inspection
            infos.append(self._info(attrs))
        return sorted(infos, key=lambda info: info.create_time)

    async def container_labels(self) -> Mapping[str, Mapping[str, str]]:
        """Labels of each workspace container, by workspace id, from the listing alone (no inspects)."""
        await self._load_claims()
        filters = {"label": [f"{LABEL_MANAGED}=true", f"{LABEL_INSTANCE}={self.instance}"]}
        listed = await self._call(self._api().containers, all=True, filters=filters, idempotent=True)
        labelled = (self._labels(summary.get("Labels") or {}) for summary in listed)
        return {labels[LABEL_WORKSPACE]: labels for labels in labelled if labels.get(LABEL_WORKSPACE)}

    async def container_states(self) -> list[tuple[str, str]]:
        """``(state, runtime)`` of each workspace container, from one listing (no inspects)."""
        await self._load_claims()
        filters = {"label": [f"{LABEL_MANAGED}=true", f"{LABEL_INSTANCE}={self.instance}"]}
        listed = await self._call(self._api().containers, all=True, filters=filters, idempotent=True)
        states = []
        for summary in listed:
            labels = self._labels(summary.get("Labels") or {})
            if not labels.get("sandboxd.spec") or labels.get(LABEL_POOL):
                continue
            try:
                runtime = str(json.loads(labels["sandboxd.spec"]).get("runtime") or "")
            except (ValueError, AttributeError):
                runtime = ""
            state = str(summary.get("State") or "unknown")
            states.append(("stopped" if state in {"exited", "created", "dead"} else state, runtime))
        return states

    async def volume_labels(self, workspace_id: str) -> Mapping[str, str] | None:
        """Labels of the workspace's volume (a claimed one's: its claim record), or None when there is none."""
        await self._load_claims()
        name = self._claim_name(workspace_id) if workspace_id in (self._claims or {}) else self._name(workspace_id)
        try:
            attrs = await self._call(self._api().inspect_volume, name, idempotent=True)
        except docker.errors.NotFound:
            return None
        labels = attrs.get("Labels") or {}
        return labels if labels.get(LABEL_INSTANCE) == self.instance else None

    async def remove_orphans(self) -> list[str]:
        """Remove half-created workspaces of this daemon: unstarted or spec-less containers, lone volumes.

        A claim record whose container is gone is a lone volume too.
        """
        api = self._api()
        await self._load_claims(again=True)
        for workspace_id in list(self._claims or {}):
            await self._drop_stale_claim(workspace_id)  # its container removed behind our back
        selector = {"label": [f"{LABEL_MANAGED}=true", f"{LABEL_INSTANCE}={self.instance}"]}
        removed = []
        containers = await self._call(api.containers, all=True, filters=selector, idempotent=True)
        claimed_as = {member: workspace for workspace, member in (self._claims or {}).items()}
        live = set()
        for summary in containers:
            labels = summary.get("Labels") or {}
            name = summary["Names"][0].lstrip("/") if summary.get("Names") else summary["Id"]
            created_as = labels.get(LABEL_WORKSPACE, "")
            if name.endswith(PROVISIONAL_SUFFIX):
                # Never committed: its create did not return, so nobody holds its id (unless the
                # caller chose it, and then its retry makes it again).
                with contextlib.suppress(docker.errors.NotFound):
                    await self._call(api.remove_container, summary["Id"], force=True, v=True)
                    removed.append(name)
                continue
            if created_as in claimed_as and name == self._name(created_as):
                # Claimed, and cut short before its rename: the claim is on record, so it is done now.
                name = self._name(claimed_as[created_as])
                await self._call(api.rename, summary["Id"], name)
            elif labels.get(LABEL_POOL) and name != self._name(created_as) and created_as not in claimed_as:
                # A member that was claimed (it bears its workspace's name) whose claim record is gone
                # (a `docker volume prune`): whose it is cannot be known, and it must never be handed
                # out again with what its workspace left in it.
                log.warning("workspace.claim_record_lost", name=name)
                with contextlib.suppress(docker.errors.NotFound):
                    await self._call(api.remove_container, summary["Id"], force=True, v=True)
                    removed.append(name)
                continue
            if summary.get("State") == "created" or not labels.get("sandboxd.spec"):
                with contextlib.suppress(docker.errors.NotFound):
                    await self._call(api.remove_container, summary["Id"], force=True, v=True)
                    removed.append(name)
            else:
                live.add(name)
        volumes = (await self._call(api.volumes, filters=selector, idempotent=True)).get("Volumes") or []
        for volume in volumes:
            # A workspace's private volumes are anonymous: their workspace label names their container.
            workspace = (volume.get("Labels") or {}).get(LABEL_WORKSPACE)
            owner = self._name(claimed_as.get(workspace, workspace)) if workspace else volume["Name"]
            if owner not in live:
                with contextlib.suppress(docker.errors.NotFound, BackendError):
                    await self._call(api.remove_volume, volume["Name"], force=True)
                    removed.append(volume["Name"])
        await self._load_claims(again=True)
        return removed + await self.remove_unused_images()

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

    async def remove_container(self, workspace_id: str) -> bool:
        """Remove container and volume; return whether either existed (missing ones are no error).

        A claimed workspace's claim record goes last: a removal cut short leaves it to name what is left.
        """
        api = self._api()
        await self._load_claims()
        member = (self._claims or {}).get(workspace_id, "")
        found = False
        # A claimed or uncommitted one by its id (renamed yet or not), then by the names, should they differ.
        refs = (self._ref(workspace_id), self._name(workspace_id), self._provisional_name(workspace_id))
        for name in dict.fromkeys(refs):
            # gVisor cannot kill a paused sandbox ("PID is zombie and can not be killed"): thaw it first.
            with contextlib.suppress(docker.errors.NotFound, BackendError):
                await self._call(api.unpause, name)
            try:
                await self._call(api.remove_container, name, force=True, v=True, idempotent=True)
                found = True
            except docker.errors.NotFound:
                pass
            except BackendError as exc:
                if "already in progress" not in exc.message:
                    raise
                found = True  # someone else is removing it right now: it is going either way
        with contextlib.suppress(docker.errors.NotFound):
            await self._call(api.remove_volume, self._volume_name(workspace_id), force=True, idempotent=True)
            found = True
        if member:
            await self._remove_private_volumes(member)
        await self._remove_private_volumes(workspace_id)  # a claim record among them
        self._provisional_ids.pop(workspace_id, None)
        if member and self._claims is not None:
            self._claims.pop(workspace_id, None)
            self._claimed.pop(member, None)
            self._claim_ids.pop(workspace_id, None)
        return found

    async def snapshot_container(
        self, workspace_id: str, ref: str, labels: Mapping[str, str], *, max_workspace_bytes: int
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
            first = await self._call(api.commit, name, conf={"Labels": self._part_labels()})
        except docker.errors.NotFound as exc:
            msg = f"workspace {workspace_id!r} not found"
            raise WorkspaceNotFoundError(msg) from exc
        holder = None
        try:
            holder = await self._holder(first["Id"])
            try:
                within = await self._copy_workspace(name, holder["Id"], max_workspace_bytes)
            except docker.errors.NotFound as exc:
                msg = f"workspace {workspace_id!r} not found"
                raise WorkspaceNotFoundError(msg) from exc
            if not within:
                msg = (
                    f"workspace {workspace_id!r}'s /workspace is over {max_workspace_bytes} bytes as an archive "
                    "(a sparse file counts at its full length): too big to snapshot"
                )
                raise QuotaExceededError(msg)
            repository, _, tag = ref.rpartition(":")
            final = {**labels, LABEL_SNAPSHOT_PART: ""}
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

    async def claim_container(
        self, member: ContainerInfo, workspace_id: str, labels: Mapping[str, str]
    ) -> ContainerInfo:
        """Give the running container ``member`` (a pool's) the id and labels of a new workspace.

        A container's labels cannot change, so the claim is kept as a record of the engine's: a
        volume named after the workspace, labelled with its labels and the member's id, which
        nothing mounts. From then on the container answers as ``workspace_id`` with ``labels``
        (here and after a restart, whoever reads the records); removing it removes the record.

        Raises:
            WorkspaceExistsError: ``workspace_id`` is taken.
        """
        api = self._api()
        member_id = member.workspace_id
        await self._drop_stale_claim(workspace_id)
        claims = self._claims if self._claims is not None else {}
        if workspace_id in claims:
            msg = f"workspace {workspace_id!r} already exists"
            raise WorkspaceExistsError(msg)
        if member_id in self._claimed:
            msg = f"{member_id!r} is claimed already"
            raise WorkspaceExistsError(msg)
        record = {
            **labels,
            LABEL_MANAGED: "true",
            LABEL_INSTANCE: self.instance,
            LABEL_WORKSPACE: workspace_id,
            LABEL_CLAIM_OF: member_id,
            LABEL_CLAIM_CONTAINER: member.container_id,
        }

        async def record_it() -> None:
            created = await self._call(api.create_volume, name=self._claim_name(workspace_id), labels=record)
            if (created.get("Labels") or {}) != record:
                # The engine hands back a volume of that name as it is: an earlier claim's, whose
                # container is gone (a removal cut short). It is replaced.
                await self._call(api.remove_volume, self._claim_name(workspace_id), force=True, idempotent=True)
                await self._call(api.create_volume, name=self._claim_name(workspace_id), labels=record)

        # The member is renamed after its workspace: one that bears another name than its own
        # was claimed, and is never a pool's again, whatever becomes of the record. Both are done
        # before the claim returns, at once: a start after a crash between them renames one
        # recorded, and removes one renamed but not recorded, whose caller never had its id.
        outcomes = await asyncio.gather(
            record_it(), self._call(api.rename, member.container_id, self._name(workspace_id)), return_exceptions=True
        )
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            with contextlib.suppress(docker.errors.NotFound, BackendError):
                await self._call(api.remove_volume, self._claim_name(workspace_id), force=True, idempotent=True)
            with contextlib.suppress(docker.errors.NotFound, BackendError):
                await self._call(api.rename, member.container_id, self._name(member_id))
            error = failed[0]
            if isinstance(error, BackendError) and ("Conflict" in error.message or "already in use" in error.message):
                msg = f"workspace {workspace_id!r} already exists"
                raise WorkspaceExistsError(msg) from error
            raise error
        self._claim_ids[workspace_id] = member.container_id
        claims[workspace_id] = member_id
        self._claims = claims
        self._claimed[member_id] = effective = _claimed_labels(record, member_id)
        return dataclasses.replace(member, workspace_id=workspace_id, labels=effective)

    async def pause_container(self, workspace_id: str) -> None:
        """Freeze the container's processes (``docker pause``: the cgroup freezer, or gVisor's own)."""
        await self._pause_call(self._api().pause, workspace_id, "pause")

    async def resume_container(self, workspace_id: str) -> None:
        """Thaw the paused container (``docker unpause``)."""
        await self._pause_call(self._api().unpause, workspace_id, "resume")

    async def _pause_call(self, call: Callable[[str], Any], workspace_id: str, what: str) -> None:
        try:
            await self._call(call, self._ref(workspace_id))
        except docker.errors.NotFound as exc:
            msg = f"workspace {workspace_id!r} not found"
            raise WorkspaceNotFoundError(msg) from exc
        except BackendError as exc:
            # The engine's word for it ("is already paused", "is not paused", "is not running").
            msg = f"cannot {what} workspace {workspace_id!r}: {exc.message}"
            raise FailedPreconditionError(msg) from exc

    async def _remove_private_volumes(self, workspace_id: str) -> None:
        """Remove the workspace's anonymous volumes left by a container removed without them (``docker rm -f``)."""
        api = self._api()
        selector = {"label": [f"{LABEL_INSTANCE}={self.instance}", f"{LABEL_WORKSPACE}={workspace_id}"]}
        volumes = (await self._call(api.volumes, filters=selector, idempotent=True)).get("Volumes") or []
        for volume in volumes:
            if volume["Name"] != self._volume_name(workspace_id):
                with contextlib.suppress(docker.errors.NotFound, BackendError):  # in use: its container is back
                    await self._call(api.remove_volume, volume["Name"], force=True, idempotent=True)

    # -- exec -----------------------------------------------------------------------------
    async def exec_stream(
        self,
        workspace_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        user: str,
        container_id: str = "",
    ) -> DockerExecStream:
        """Start ``argv`` with stdin attached; return the raw multiplexed stream."""
        exec_id = await self._exec_create(workspace_id, argv, env=env, user=user, stdin=True, container_id=container_id)
        body = json.dumps({"Detach": False, "Tty": False}).encode()
        reader, writer, status = await self._hijack(f"exec/{exec_id}/start", body, "starting an exec")
        if status not in (101, 200):
            writer.close()
            msg = f"Docker engine refused to start the exec (HTTP {status})"
            if status == 409:
                msg = f"workspace {workspace_id!r} is not running"
                raise WorkspaceNotRunningError(msg)
            raise BackendError(msg)
        return DockerExecStream(reader, writer, inspect=functools.partial(self._exec_exit_code, exec_id))

    async def _hijack(
        self, path: str, body: bytes, doing: str
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
        """POST ``path`` asking the engine to upgrade the connection to a raw stream; return it and the HTTP status."""
        reader, writer = await self._connect()
        request = (
            f"POST /v{API_VERSION}/{path} HTTP/1.1\r\n"
            "Host: docker\r\nContent-Type: application/json\r\n"
            "Connection: Upgrade\r\nUpgrade: tcp\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        try:
            writer.write(request + body)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
        except (OSError, asyncio.IncompleteReadError) as exc:
            writer.close()
            msg = f"Docker engine at {self.docker_host} hung up {doing}: {_reason(exc)}"
            raise DockerUnavailableError(msg) from exc
        except BaseException:
            writer.close()  # cancelled (the daemon stopping): the connection must not outlive its loop
            raise
        return reader, writer, int(head.split(b" ", 2)[1])

    async def _exec_exit_code(self, exec_id: str) -> int | None:
        try:
            inspected = await self._call(self._api().exec_inspect, exec_id, idempotent=True)
        except docker.errors.NotFound:
            return -1  # the engine has forgotten it: it ended (and its record was cleaned up)
        except SandboxdError:
            return None
        if inspected.get("Running"):
            return None
        code = inspected.get("ExitCode")
        return None if code is None else int(code)

    async def exec_run(
        self, workspace_id: str, argv: Sequence[str], *, user: str, container_id: str = ""
    ) -> tuple[int, bytes]:
        """Run ``argv`` to completion; return ``(exit_code, stdout + stderr)``, the first 1 MiB of it.

        Read from the exec's stream, which under gVisor can stay open after the command ended
        (a sandbox that hit its memory or process limit; found by the backend conformance
        suite, where a blocking read waited for ever): once it has been silent for a second,
        the engine is asked whether the exec ended.

        Raises:
            BackendError: it did not end within ``EXEC_RUN_TIMEOUT_S``.
        """
        stream = await self.exec_stream(workspace_id, argv, env={}, user=user, container_id=container_id)
        output = bytearray()
        heard = time.monotonic()

        async def drain() -> None:
            nonlocal heard
            while (chunk := await stream.read()) is not None:
                heard = time.monotonic()
                output.extend(chunk[1][: max(0, _EXEC_RUN_OUTPUT_BYTES - len(output))])

        reading = asyncio.ensure_future(drain())
        try:
            async with asyncio.timeout(EXEC_RUN_TIMEOUT_S):
                while not reading.done():
                    await asyncio.wait([reading], timeout=_EXEC_SILENCE_S)
                    if time.monotonic() - heard >= _EXEC_SILENCE_S and await stream.exit_code() is not None:
                        break
        except TimeoutError:
            msg = f"{' '.join(argv)[:200]!r} in workspace {workspace_id!r} did not end within {EXEC_RUN_TIMEOUT_S} s"
            raise BackendError(msg) from None
        finally:
            reading.cancel()
            await stream.close(discard_input=True)
        code = await stream.exit_code()
        return (code if code is not None else -1), bytes(output)

    async def _exec_create(
        self,
        workspace_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        user: str,
        stdin: bool,
        container_id: str,
    ) -> str:
        try:
            created = await self._call(
                self._api().exec_create,
                container_id or self._ref(workspace_id),
                list(argv),
                stdin=stdin,
                stdout=True,
                stderr=True,
                tty=False,
                environment=dict(env),
                user=user,
                workdir="/",
            )
        except docker.errors.NotFound as exc:
            msg = f"workspace {workspace_id!r} not found"
            raise WorkspaceNotFoundError(msg) from exc
        except BackendError as exc:
            if "is not running" in exc.message or "is paused" in exc.message:
                msg = f"workspace {workspace_id!r} is not running"
                raise WorkspaceNotRunningError(msg) from exc
            raise
        return str(created["Id"])

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        url = urlparse(self.docker_host)
        try:
            # A large reader limit: a fast command's output must not pause the transport every 128 KiB.
            if url.scheme == "unix":
                return await asyncio.open_unix_connection(url.path, limit=_STREAM_LIMIT)
            if url.scheme in {"tcp", "http"}:
                return await asyncio.open_connection(url.hostname, url.port or 2375, limit=_STREAM_LIMIT)
        except OSError as exc:
            msg = f"Docker engine unreachable at {self.docker_host}: {_reason(exc)}"
            raise DockerUnavailableError(msg) from exc
        msg = f"Docker engine address {self.docker_host!r}: only unix:// and tcp:// are supported for exec streams"
        raise DockerUnavailableError(msg)

    async def open_socket(self, host_path: str, container_id: str) -> UnixSocketStream | None:
        """Connect to a Unix socket of a container's root at its host path (see Backend).

        Only with an engine on a Unix socket, the one way to be on its machine. The path is
        the container's to change (a symlink its root plants there is followed here, on the
        host), so what answers must prove to be of ``container_id``: a listener of uid 0 (a
        container's root is the host's under runc and gVisor, no user namespace) whose
        process is in the container's cgroup (the agent under runc, gVisor's gofer for it).
        """
        if urlparse(self.docker_host).scheme != "unix" or not container_id:
            return None
        try:
            reader, writer = await asyncio.open_unix_connection(host_path, limit=_STREAM_LIMIT)
        except (OSError, ValueError):
            return None  # not there (yet), not ours to enter, or a path too long for a socket address
        peer = writer.get_extra_info("socket")
        pid, uid, _gid = struct.unpack("3i", peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != 0 or not _in_container(pid, container_id):
            writer.close()
            log.warning("backend.socket_not_the_containers", path=host_path, uid=uid, pid=pid)
            return None
        return UnixSocketStream(reader, writer)

    # -- the instance's lease (sandboxd.lease) ------------------------------------------------
    async def take_lease(
        self,
        *,
        image: str,
        argv: Sequence[str],
        holder: str,
        wait_s: float,
        stale: Callable[[str], bool] = lambda holder: False,
    ) -> DockerLease:
        """Hold this instance's label: a container named ``sandboxd-<instance>.lease`` (see Backend).

        The engine's names are unique, so one container of that name is the whole lock. It is
        created with stdin open for one attach, attached to before it starts (as ``docker run``
        does, so no moment exists when it runs with nobody attached), and removed by the
        engine when it ends. One found running is waited for up to ``wait_s`` (a daemon just
        gone takes its lease with it within moments), unless ``stale`` says its holder is this
        very process from before (the engine kept it running): that one goes. One created but
        not started is another daemon's take under way, and is waited for too, unless older
        than ``_LEASE_START_S`` (its daemon died in the middle); one that ended is debris of an
        engine restart. Debris is removed.
        """
        api = self._api()
        name = f"sandboxd-{self.instance}.lease"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            try:
                attrs = await self._call(api.inspect_container, name, idempotent=True)
            except docker.errors.NotFound:
                attrs = None
            if attrs is not None:
                state = attrs.get("State") or {}
                labels = (attrs.get("Config") or {}).get("Labels") or {}
                held_by = labels.get(LABEL_LEASE, "")
                starting = state.get("Status") == "created" and _age_s(attrs.get("Created", "")) < _LEASE_START_S
                if (state.get("Running") or starting or state.get("Status") == "removing") and not stale(held_by):
                    if loop.time() < deadline:
                        await asyncio.sleep(0.1)
                        continue
                    msg = f"the lease {name} is held"
                    raise LeaseHeldError(msg, held_by)
                try:
                    await self._call(api.remove_container, attrs["Id"], force=True)
                except docker.errors.NotFound:
                    pass
                except BackendError:
                    await asyncio.sleep(0.05)  # the engine removing it already (it ended)
                continue
            try:
                created = await self._call(
                    api.create_container,
                    image,
                    name=name,
                    entrypoint=list(argv),
                    command=[],
                    user="65534:65534",
                    # Not detached: the SDK sets StdinOnce, so the engine closes its stdin when the
                    # first attach (this daemon's) ends.
                    stdin_open=True,
                    labels={LABEL_INSTANCE: self.instance, LABEL_LEASE: holder},
                    network_disabled=True,
                    host_config=api.create_host_config(
                        auto_remove=True,
                        network_mode="none",
                        cap_drop=["ALL"],
                        security_opt=["no-new-privileges:true"],
                        read_only=True,
                        pids_limit=16,
                        mem_limit=32 * 1024 * 1024,
                    ),
                )
            except docker.errors.ImageNotFound as exc:
                msg = f"image {image!r} is not present on the Docker engine"
                raise ImageNotFoundError(msg) from exc
            except BackendError as exc:
                if "Conflict" in exc.message or "already in use" in exc.message:
                    continue  # another daemon's, made just now: looked at again above
                raise
            reader, writer, status = await self._hijack(
                f"containers/{created['Id']}/attach?stream=1&stdin=1&stdout=1&stderr=1", b"", "attaching"
            )
            if status not in (101, 200):
                writer.close()
                continue  # removed as debris by another daemon starting at this moment
            lease = DockerLease(reader, writer, functools.partial(self._drop_lease, created["Id"]))
            try:
                await self._call(api.start, created["Id"])
            except (docker.errors.NotFound, BackendError):
                # Removed as debris meanwhile (NotFound, or "marked for removal"): looked at again.
                await lease.release()
                if loop.time() >= deadline:
                    raise
                await asyncio.sleep(0.05)
                continue
            except BaseException:
                await lease.release()
                raise
            return lease

    async def _drop_lease(self, container_id: str) -> None:
        with contextlib.suppress(docker.errors.NotFound, SandboxdError):
            await self._call(self._api().remove_container, container_id, force=True)

    # -- egress: the ALLOWLIST policy's network and proxy (sandboxd.egress) ----------------------
    def _egress_name(self, workspace_id: str) -> str:
        """The name of the workspace's own network, and of its egress proxy's container."""
        return f"{self._name(workspace_id)}.egress"

    def _egress_labels(self, workspace_id: str) -> dict[str, str]:
        return {LABEL_INSTANCE: self.instance, LABEL_EGRESS_OF: workspace_id}

    async def create_network(self, workspace_id: str) -> str:
        """Make the workspace's internal network; see Backend."""
        await self.remove_network(workspace_id)  # a leftover of an earlier workspace of that id
        name = self._egress_name(workspace_id)
        try:
            # Internal: no route out. And the bridge takes no address: a plain internal network makes
            # the host its members' gateway, so every service listening on the host's addresses is in
            # reach of the workspace; without one, only the network's members are.
            await self._call(
                self._api().create_network,
                name,
                internal=True,
                labels=self._egress_labels(workspace_id),
                options={"com.docker.network.bridge.inhibit_ipv4": "true"},
            )
        except BackendError as exc:
            msg = f"the Docker engine cannot make workspace {workspace_id!r}'s network: {exc.message}"
            raise BackendError(msg) from None
        return name

    async def remove_network(self, workspace_id: str) -> None:
        """Remove the workspace's network; see Backend."""
        api = self._api()
        name = self._egress_name(workspace_id)
        try:
            attrs = await self._call(api.inspect_network, name, idempotent=True)
        except docker.errors.NotFound:
            return
        for container in attrs.get("Containers") or {}:
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError, BackendError):
                await self._call(api.disconnect_container_from_network, container, name, force=True)
        with contextlib.suppress(docker.errors.NotFound):
            await self._call(api.remove_network, name)

    async def set_network(self, workspace_id: str, network: str) -> None:
        """Move the workspace's container to ``network``; see Backend."""
        api = self._api()
        ref = self._ref(workspace_id)
        try:
            attrs = await self._call(api.inspect_container, ref, idempotent=True)
        except docker.errors.NotFound as exc:
            msg = f"workspace {workspace_id!r} not found"
            raise WorkspaceNotFoundError(msg) from exc
        joined = list((attrs.get("NetworkSettings") or {}).get("Networks") or {})
        if joined == [network]:
            return
        for name in joined:
            with contextlib.suppress(docker.errors.NotFound):
                await self._call(api.disconnect_container_from_network, ref, name, force=True)
        await self._call(api.connect_container_to_network, ref, network)

    async def start_proxy(
        self, workspace_id: str, *, image: str, env: Mapping[str, str], rules: str, alias: str, egress_network: str
    ) -> None:
        """Start the workspace's egress proxy; see Backend."""
        api = self._api()
        name = self._egress_name(workspace_id)
        await self.remove_proxy(workspace_id)
        host_config = api.create_host_config(
            init=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true"],
            pids_limit=256,
            mem_limit=256 * 1024 * 1024,
            network_mode=name,
            restart_policy={"Name": "unless-stopped"},
            # It forwards nothing itself: a workspace given NET_ADMIN cannot route through it.
            sysctls={"net.ipv4.ip_forward": "0"},
        )
        networking = api.create_networking_config({name: api.create_endpoint_config(aliases=[alias])})
        try:
            created = await self._call(
                api.create_container,
                image,
                name=name,
                environment=dict(env),
                labels={**self._egress_labels(workspace_id), LABEL_EGRESS_RULES: rules},
                host_config=host_config,
                networking_config=networking,
            )
            await self._call(api.connect_container_to_network, created["Id"], egress_network)
            await self._call(api.start, created["Id"])
        except (docker.errors.NotFound, BackendError) as exc:
            await self.remove_proxy(workspace_id)
            reason = exc.message if isinstance(exc, BackendError) else str(exc.explanation or exc)
            msg = (
                f"workspace {workspace_id!r}'s egress proxy could not start "
                f"(egress network {egress_network!r}): {reason}"
            )
            raise BackendError(msg) from None

    async def network_subnet(self, workspace_id: str) -> str:
        """The IPv4 block of the workspace's network; see Backend."""
        attrs = await self._call(self._api().inspect_network, self._egress_name(workspace_id), idempotent=True)
        return str(((attrs.get("IPAM") or {}).get("Config") or [{}])[0].get("Subnet", ""))

    async def remove_proxy(self, workspace_id: str) -> None:
        """Remove the workspace's egress proxy; see Backend."""
        with contextlib.suppress(docker.errors.NotFound):
            await self._call(self._api().remove_container, self._egress_name(workspace_id), force=True, v=True)

    async def proxy_rules(self, workspace_id: str) -> str | None:
        """The rules label of the workspace's proxy; see Backend."""
        try:
            attrs = await self._call(self._api().inspect_container, self._egress_name(workspace_id), idempotent=True)
        except docker.errors.NotFound:
            return None
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_INSTANCE) != self.instance or labels.get(LABEL_EGRESS_OF) != workspace_id:
            return None
        return labels.get(LABEL_EGRESS_RULES)

    async def list_proxies(self) -> list[str]:
        """Workspace ids of this daemon's egress proxies and networks; see Backend."""
        api = self._api()
        selector = {"label": [f"{LABEL_INSTANCE}={self.instance}", LABEL_EGRESS_OF]}
        containers = await self._call(api.containers, all=True, filters=selector, idempotent=True)
        networks = await self._call(api.networks, filters=selector, idempotent=True)
        found = {(item.get("Labels") or {}).get(LABEL_EGRESS_OF, "") for item in [*containers, *networks]}
        return sorted(found - {""})

    async def proxy_log(
        self, workspace_id: str, *, max_line_bytes: int, since: float = 0
    ) -> AsyncIterator[tuple[str, str]]:
        """The proxy's log lines as they come; see Backend.

        One HTTP/1.0 request to the engine's log endpoint, followed: the engine then sends its
        multiplexed frames unchunked until the container ends or the call is cancelled.
        """
        reader, writer = await self._connect()
        name = self._egress_name(workspace_id)
        request = (
            f"GET /v{API_VERSION}/containers/{name}/logs?follow=1&stdout=1&stderr=1&since={since:.6f} HTTP/1.0\r\n"
            "Host: docker\r\n\r\n"
        ).encode()
        stream = DockerExecStream(reader, writer, inspect=_no_exit_code)
        try:
            writer.write(request)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            if status != 200:
                msg = f"the Docker engine refused the proxy's log (HTTP {status})"
                raise BackendError(msg)
            pending = {1: b"", 2: b""}
            while (chunk := await stream.read()) is not None:
                fd, data = chunk
                if fd not in pending:
                    continue
                *lines, rest = (pending[fd] + data).split(b"\n")
                pending[fd] = rest[-max_line_bytes:]
                for line in lines:
                    yield ("stdout" if fd == 1 else "stderr"), line[:max_line_bytes].decode("utf-8", "replace")
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            msg = f"the proxy's log broke off: {_reason(exc)}"
            raise BackendError(msg) from None
        finally:
            await stream.close(discard_input=True)

    async def close(self) -> None:
        """Release the SDK's connection pool."""
        if self._api_client is not None:
            await asyncio.to_thread(self._api_client.close)
            self._api_client = None


class _Connection:
    """A two-way byte connection: writes, and a bounded close (its reads are the subclass's)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Wrap an open connection."""
        self._reader = reader
        self._writer = writer

    async def write(self, data: bytes) -> None:
        """Write to the other end (an exec's stdin)."""
        self._writer.write(data)
        await self._writer.drain()

    async def close(self, *, discard_input: bool = False) -> None:
        """Close the connection: flush pending stdin (at most 2 s), or drop it with ``discard_input``.

        A graceful close waits for the write buffer to drain, which never happens
        when the process is gone and the engine stops reading its stdin (a write to
        a full disk that failed early): so the wait is bounded, then the connection
        is aborted.
        """
        transport = self._writer.transport
        self._writer.close()  # marks the writer closed; the transport flushes, then closes
        if discard_input:
            transport.abort()
        with contextlib.suppress(ConnectionError, OSError):
            try:
                await asyncio.wait_for(self._writer.wait_closed(), 2.0)
            except TimeoutError:
                transport.abort()
                await self._writer.wait_closed()


class DockerExecStream(_Connection):
    """One hijacked exec connection: Docker's 8-byte-header multiplexed stdout/stderr plus stdin."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        inspect: Callable[[], Awaitable[int | None]],
    ) -> None:
        """Wrap an upgraded connection whose response headers are already consumed."""
        super().__init__(reader, writer)
        self._inspect = inspect

    async def read(self) -> tuple[int, bytes] | None:
        """Return the next ``(fd, data)`` chunk, or None at end of stream."""
        try:
            header = await self._reader.readexactly(_MUX_HEADER.size)
            fd, size = _MUX_HEADER.unpack(header)
            data = await self._reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        return fd, data

    async def exit_code(self) -> int | None:
        """Return the exec's exit code once Docker reports it ended, else None."""
        return await self._inspect()


_LEASE_START_S = 15.0
"""A lease container created this long ago and never started is debris: its daemon died taking it."""


def _age_s(created: str) -> float:
    """Seconds since an engine timestamp (:func:`_parse_time`); unparsable counts as old."""
    try:
        moment = _parse_time(created)
    except ValueError:
        return float("inf")
    return (datetime.datetime.now(datetime.UTC) - moment).total_seconds()


class DockerLease:
    """A held lease: the attach to its container's stdin (see :meth:`DockerBackend.take_lease`)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, drop: Callable[[], Awaitable[None]]
    ) -> None:
        """Wrap the attach connection; ``drop`` removes the container."""
        self._reader, self._writer, self._drop = reader, writer, drop

    async def lost(self) -> None:
        """Return when the attach ends: the container ended (an engine restart), or the engine hung up."""
        try:
            with contextlib.suppress(ConnectionError, OSError):
                while await self._reader.read(4096):
                    pass  # the holder prints nothing; whatever comes is not the end
        finally:
            self._close()

    async def release(self) -> None:
        """Close the attach (the holder sees the end of its stdin and ends) and remove the container."""
        self._close()
        await self._drop()

    def _close(self) -> None:
        self._writer.close()
        self._writer.transport.abort()  # nothing is left to flush: the holder reads nothing of it


class UnixSocketStream(_Connection):
    """A direct connection to a container's Unix socket, shaped as an exec stream (all fd 1)."""

    async def read(self) -> tuple[int, bytes] | None:
        """Return what has arrived (up to 1 MiB) as ``(1, data)``, or None at end of stream."""
        try:
            data = await self._reader.read(_SOCKET_READ_BYTES)
        except ConnectionError:
            return None
        return (1, data) if data else None

    async def exit_code(self) -> int | None:
        """Always None: a socket has no exit code (its end is its end of stream)."""
        return None


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


def _claimed_labels(record: Mapping[str, str], member_id: str) -> dict[str, str]:
    """The labels a claimed container answers with: its claim record's, naming the member."""
    labels = {key: value for key, value in record.items() if key != LABEL_CLAIM_OF}
    labels[LABEL_MEMBER] = member_id
    return labels


def _in_container(pid: int, container_id: str) -> bool:
    """Whether process ``pid`` (as this machine numbers it) is in the container's cgroup.

    Docker names a container's cgroup after its full id, under either cgroup driver and
    version. False when the process cannot be seen (a daemon in a pid namespace of its own).
    """
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/cgroup") as groups:
            return container_id in groups.read()
    except OSError:
        return False


def _retrying(call: str) -> Callable[[tenacity.RetryCallState], None]:
    """What a retry of an engine call says: a log line and a count."""

    def said(state: tenacity.RetryCallState) -> None:
        metrics.DOCKER_RETRIES.inc()
        log.warning("retry.scheduled", call=call, attempt=state.attempt_number)

    return said


async def _no_exit_code() -> int | None:
    return None


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:300]


def _parse_time(text: str) -> datetime.datetime:
    # Docker gives nanoseconds ("2024-01-01T00:00:00.123456789Z"); Python takes micro.
    head, _, frac = text.rstrip("Z").partition(".")
    micro = (frac + "000000")[:6]
    return datetime.datetime.fromisoformat(f"{head}.{micro}").replace(tzinfo=datetime.UTC)
