"""Workspace containers: create, commit, inspect, list, pause, resume and remove, and orphans reaped."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import docker.errors
import structlog
from docker.types import DriverConfig, Mount

from ...errors import (
    BackendError,
    FailedPreconditionError,
    ImageNotFoundError,
    InvalidSpecError,
    QuotaExceededError,
    WorkspaceExistsError,
    WorkspaceNotFoundError,
)
from ..base import LABEL_POOL, ContainerInfo, ContainerSpec
from .checkpoints import CheckpointsMixin
from .claims import LABEL_CLAIM_TIME, PROVISIONAL_SUFFIX
from .client import LABEL_INSTANCE, LABEL_MANAGED, LABEL_WORKSPACE, WORKSPACE_MOUNT, _parse_time
from .errors import EngineErrorKind, kind_of, translate

HOSTNAME = "sandbox"
"""Every workspace's host name: the same for a claimed pool member as for a fresh container."""
MAIN_USER = "0:0"
"""The main process (PID 1 is Docker's init; this is its only child) runs as root, with only the
capabilities the spec names: the workspace user, who can signal every process of its own uid,
cannot stop the container with `kill -9 -1`."""
_PRIVATE_DIR_OPTIONS = {"type": "tmpfs", "device": "tmpfs", "o": "size=1m,mode=0700,nosuid,nodev,noexec"}

log = structlog.get_logger(__name__)


def _volume_options(spec: ContainerSpec) -> dict[str, str] | None:
    """The /workspace volume's driver options: a size-capped tmpfs when ``spec.disk_bytes`` is set.

    The local driver mounts a tmpfs of that size: a hard cap that works on every storage driver
    (fuse-overlayfs and overlay2 on ext4 have no per-volume quota). Mode 1777: the workspace user,
    whoever it is, must own its files.
    """
    if not spec.disk_bytes:
        return None
    return {"type": "tmpfs", "device": "tmpfs", "o": f"size={spec.disk_bytes},mode=1777"}


class ContainersMixin(CheckpointsMixin):
    """The lifecycle of workspace containers and their volumes."""

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
            # A claimed pool member's workspace was created by its claim, not when the member started.
            create_time=_parse_time(labels.get(LABEL_CLAIM_TIME) or attrs["Created"]),
            os=attrs.get("Platform") or "linux",
            runtime=(attrs.get("HostConfig") or {}).get("Runtime") or "",
            mounts={
                m["Destination"]: m["Source"]
                for m in attrs.get("Mounts", [])
                if m.get("Type") == "volume" and m.get("Destination") and m.get("Source")
            },
            networks=tuple(sorted((attrs.get("NetworkSettings") or {}).get("Networks") or {})),
        )

    async def create_container(self, spec: ContainerSpec) -> ContainerInfo:
        """Create volume and container, start it, and return it running, provisionally named (see Backend)."""
        await self._drop_stale_claim(spec.workspace_id)
        name = self._name(spec.workspace_id)
        labels = {**spec.labels, LABEL_MANAGED: "true", LABEL_INSTANCE: self.instance}
        labels[LABEL_WORKSPACE] = spec.workspace_id
        await self._clear_the_way(spec.workspace_id, name)
        # A fork's /workspace is its snapshot's: copied on this host from the image's own layer
        # where the daemon sees it (a native copy), else by the engine as it creates the container
        # (which reads the image through its storage driver: through FUSE here, file by file).
        seed = await self._workspace_layer(spec) if spec.seed_workspace and not spec.disk_bytes else None
        host_config = self._host_config(spec, self._mounts(spec, name, labels, no_copy=seed is not None))
        await self._create_volume(spec, name, labels)
        try:
            if seed is not None and not spec.checkpoint:
                # The copy goes on while the container is created and started: nothing of the
                # workspace's runs on /workspace before the create returns, which waits for both.
                copy = asyncio.ensure_future(self._copy_into_volume(seed, name))
                try:
                    await self._create_and_start(spec, labels, host_config)
                except BaseException:
                    copy.cancel()
                    await asyncio.gather(copy, return_exceptions=True)
                    raise
                await copy
            else:
                if seed is not None:
                    await self._copy_into_volume(seed, name)  # restored processes may hold its files open
                await self._create_and_start(spec, labels, host_config)
        except docker.errors.ImageNotFound as exc:
            await self.remove_container(spec.workspace_id)
            msg = f"image {spec.image!r} is not present on the Docker engine"
            raise ImageNotFoundError(msg) from exc
        except docker.errors.NotFound as exc:
            await self.remove_container(spec.workspace_id)
            raise translate(docker.errors.APIError(str(exc)), docker_host=self.docker_host) from exc
        except BackendError as exc:
            if kind_of(exc) is EngineErrorKind.NAME_IN_USE:
                # Another create of this name won the race: what exists is its workspace.
                msg = f"workspace {spec.workspace_id!r} already exists"
                raise WorkspaceExistsError(msg) from exc
            await self.remove_container(spec.workspace_id)
            if kind_of(exc) is EngineErrorKind.NO_SPACE:
                # The engine's copy of the image's /workspace into a capped volume: too big for it.
                msg = f"the image's /workspace does not fit the workspace's cap of {spec.disk_bytes} bytes"
                raise QuotaExceededError(msg) from exc
            if kind_of(exc) is EngineErrorKind.OUT_OF_RESOURCES:
                # Not the request's fault: the machine holds as many containers as it can now.
                msg = (
                    "the machine has no room for another container now (out of processes, memory or "
                    f"descriptors; the kernel's pid_max is often the first): {exc.message}"
                )
                raise QuotaExceededError(msg) from exc
            msg = f"the Docker engine rejected the workspace: {exc.message}"
            raise InvalidSpecError(msg) from exc
        except BaseException:
            await asyncio.shield(self.remove_container(spec.workspace_id))
            raise
        return await self.inspect_container(spec.workspace_id)

    async def _clear_the_way(self, workspace_id: str, name: str) -> None:
        """Refuse a taken workspace id; remove a volume left of an earlier workspace of that id.

        Raises:
            WorkspaceExistsError: a container of that name, committed or provisional, exists.
        """
        api = self._api()
        existing = await self._call(api.containers, all=True, filters={"name": f"^/{name}(\\{PROVISIONAL_SUFFIX})?$"})
        if existing:
            msg = f"workspace {workspace_id!r} already exists"
            raise WorkspaceExistsError(msg)
        try:
            await self._call(api.inspect_volume, name, idempotent=True)
        except docker.errors.NotFound:
            return
        # A volume with no container: its workspace was removed behind the daemon's back.
        # The engine would hand it, files and all, to the new workspace (perhaps another
        # tenant's): it goes first.
        log.warning("workspace.leftover_volume_removed", workspace_id=workspace_id)
        with contextlib.suppress(docker.errors.NotFound):
            await self._call(api.remove_volume, name, force=True, idempotent=True)
        await self._remove_private_volumes(workspace_id)

    def _mounts(
        self, spec: ContainerSpec, name: str, labels: Mapping[str, str], *, no_copy: bool = False
    ) -> list[Mount]:
        """The container's mounts: its /workspace volume ``name``, the agent's, and its private dirs.

        ``no_copy``: the engine copies nothing of the image's /workspace into the volume (the daemon did).
        """
        options = _volume_options(spec)
        # The volume is made first (_create_volume). Should it be gone by the container's create (a
        # demand class let go, a sweep of leftovers), the engine makes it again from the mount: so
        # the mount says what the volume is, and the volume comes back labelled (the sweep finds
        # it) and capped, never as an unlabelled volume that outlives its container.
        mounts = [
            Mount(
                target=WORKSPACE_MOUNT,
                source=name,
                type="volume",
                labels=dict(labels),
                driver_config=DriverConfig("local", options) if options else None,
                no_copy=no_copy,
            )
        ]
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
        return mounts

    def _host_config(self, spec: ContainerSpec, mounts: list[Mount]) -> dict[str, Any]:
        """The container's host configuration: limits, capabilities, network, runtime, mounts."""
        tmpfs: dict[str, str] = {}
        if spec.read_only_root_filesystem:
            tmpfs["/tmp"] = f"rw,nosuid,nodev,mode=1777,size={spec.memory_bytes}"
        capabilities = sorted({*spec.added_capabilities, *spec.agent_capabilities})
        host_config: dict[str, Any] = self._api().create_host_config(
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
        return host_config

    async def _create_volume(self, spec: ContainerSpec, name: str, labels: Mapping[str, str]) -> None:
        """Create the workspace's /workspace volume ``name``, capped at ``spec.disk_bytes`` when set."""
        driver_opts = _volume_options(spec)
        await self._call(self._api().create_volume, name=name, labels=labels, driver_opts=driver_opts)

    async def _create_and_start(
        self, spec: ContainerSpec, labels: Mapping[str, str], host_config: dict[str, Any]
    ) -> None:
        """Create the container under its provisional name, start it, and seed a capped /workspace.

        Its id is recorded as soon as it exists, so that a removal after a failure finds it.
        """
        api = self._api()
        created = await self._call(
            api.create_container,
            spec.image,
            name=self._provisional_name(spec.workspace_id),
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
        if spec.checkpoint:
            await self._start_restored(created["Id"], spec.checkpoint)
            return  # its /workspace is the image's, as at the checkpoint
        await self._call(api.start, created["Id"])
        if spec.disk_bytes and spec.seed_workspace:
            await self._seed_workspace(created["Id"], spec.image)

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
        attrs = await self._container_attrs(workspace_id)
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
        listed = await self._own_containers()
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
        listed = await self._own_containers()
        labelled = (self._labels(summary.get("Labels") or {}) for summary in listed)
        return {labels[LABEL_WORKSPACE]: labels for labels in labelled if labels.get(LABEL_WORKSPACE)}

    async def container_states(self) -> list[tuple[str, str]]:
        """``(state, runtime)`` of each workspace container, from one listing (no inspects)."""
        await self._load_claims()
        listed = await self._own_containers()
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
        removed = []
        containers = await self._own_containers()
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
        volumes = (await self._call(api.volumes, filters=self._own(), idempotent=True)).get("Volumes") or []
        for volume in volumes:
            # A workspace's private volumes are anonymous: their workspace label names their container.
            workspace = (volume.get("Labels") or {}).get(LABEL_WORKSPACE)
            owner = self._name(claimed_as.get(workspace, workspace)) if workspace else volume["Name"]
            if owner not in live:
                with contextlib.suppress(docker.errors.NotFound, BackendError):
                    await self._call(api.remove_volume, volume["Name"], force=True)
                    removed.append(volume["Name"])
        await self._load_claims(again=True)
        removed += await self._sweep_checkpoints([summary["Id"] for summary in containers])
        return removed + await self.remove_unused_images()

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
                if kind_of(exc) is not EngineErrorKind.REMOVAL_IN_PROGRESS:
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
