"""Snapshots: a workspace's files kept as an image of the engine's, to fork workspaces from.

A snapshot is one image (``sandboxd/snapshot:<digest>``): the workspace's root filesystem as
``docker commit`` takes it, with its /workspace files added as a last layer (the backend
streams them, so no size is held in the daemon's memory). Its labels say whose it is
(``sandboxd.tenant``), its name, the workspace it was taken of and that workspace's resolved
spec. The tag is a digest of the daemon's instance, the tenant and the name, so a name is
unique per tenant and no name, however chosen, can reach another tenant's snapshot or any
other image. A fork is a workspace created from the image: its root filesystem is the
image's layers, copy-on-write, and Docker copies the image's /workspace into the fork's new
volume, so every fork has its own files.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import hashlib
import json
import re
import time
import weakref
from collections.abc import Mapping

import structlog

from .backend.base import Backend, ContainerInfo, ImageInfo
from .errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidSpecError,
    NotFoundError,
    QuotaExceededError,
    SandboxdError,
)
from .models import Snapshot, Workspace, WorkspaceSpec
from .tenancy import current_tenant
from .workspaces import (
    LABEL_SNAPSHOT,
    LABEL_SNAPSHOT_CONTAINER,
    LABEL_SNAPSHOT_MEMORY,
    LABEL_SNAPSHOT_OF,
    LABEL_SPEC,
    LABEL_TEMPLATE_DIGEST,
    LABEL_TENANT,
    WorkspaceManager,
    check_labels,
    check_restorable,
    checkpoint_key,
    spec_from_json,
    spec_to_json,
)

__all__ = ["LABEL_SNAPSHOT", "SnapshotStore", "check_snapshot_name", "template_command"]

log = structlog.get_logger(__name__)

LABEL_SNAPSHOT_LABELS = "sandboxd.snapshot_labels"
"""On a snapshot's image: the caller's labels, as JSON (the image also carries its source's)."""
LABEL_TEMPLATE_START = "sandboxd.template_start"
"""On a template's image: the command run in the background at each workspace start."""
LABEL_TEMPLATE_READY = "sandboxd.template_ready"
"""On a template's image: the command that says a workspace started from it is ready."""
LABEL_SNAPSHOT_TIME = "sandboxd.snapshot_time"
"""On a snapshot's image: when it was taken, to the microsecond (the engine's image times are to the second)."""
REPOSITORY = "sandboxd/snapshot"
SNAPSHOT_SLACK_BYTES = 16 * 1024**2
"""Room beyond twice a capped /workspace's size for its archive's headers."""
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def check_snapshot_name(name: str) -> None:
    """Refuse a name that is not 1-63 letters, digits, '.', '_' or '-' from a letter or digit, or has '..'.

    Raises:
        InvalidSpecError: naming what is wrong.
    """
    if len(name) > 63:
        msg = f"snapshot name is {len(name)} characters; the limit is 63"
        raise InvalidSpecError(msg)
    if not _NAME_RE.fullmatch(name) or ".." in name:
        shown = name if len(name) <= 80 else name[:80] + "..."
        msg = (
            f"snapshot name {shown!r} is not valid: 1-63 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit, without '..' or '/'"
        )
        raise InvalidSpecError(msg)


class SnapshotStore:
    """Takes, finds and deletes the current tenant's snapshots.

    Args:
        manager: the workspaces (sources are theirs; forks are created through it).
    """

    def __init__(self, manager: WorkspaceManager) -> None:
        """Serve snapshots of ``manager``'s workspaces."""
        self.manager = manager
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    @property
    def backend(self) -> Backend:
        """The manager's engine."""
        return self.manager.backend

    def ref(self, name: str, tenant: str) -> str:
        """The image reference of ``tenant``'s snapshot ``name``."""
        digest = hashlib.sha256(f"{self.backend.instance}\0{tenant}\0{name}".encode()).hexdigest()
        return f"{REPOSITORY}:{digest[:40]}"

    def _lock(self, tenant: str) -> asyncio.Lock:
        lock = self._locks.get(tenant)
        if lock is None:
            lock = self._locks[tenant] = asyncio.Lock()
        return lock

    async def take(
        self, workspace_id: str, name: str, labels: Mapping[str, str], *, include_memory: bool = False
    ) -> Snapshot:
        """Capture a workspace's files as the caller's snapshot ``name`` (it goes on running).

        With ``include_memory``, its processes and their memory too (:meth:`_with_memory`).

        Raises:
            InvalidSpecError: a bad name or labels.
            WorkspaceNotFoundError: no such workspace of the caller's.
            AlreadyExistsError: the caller has a snapshot of that name.
            QuotaExceededError: the caller has ``tenant_max_snapshots`` already.
            FailedPreconditionError: ``include_memory`` and the workspace cannot be kept so.
        """
        check_snapshot_name(name)
        check_labels(labels, "labels")
        tenant = current_tenant()
        info = await self.manager.owned_info(workspace_id)
        ref = self.ref(name, tenant)
        # One at a time per tenant (its quota counts what exists), and per workspace: a pause or
        # resume must not come between a commit's own freeze and thaw. In use meanwhile: the idle
        # reaper leaves it alone, and counts its TTL from the snapshot's end.
        async with (
            self.manager.in_use(workspace_id),
            self._lock(tenant),
            self.manager.id_lock(workspace_id),
            self.backend.snapshot_in_progress(),
        ):
            if await self.backend.image_info(ref) is not None:
                msg = f"snapshot {name!r} already exists"
                raise AlreadyExistsError(msg)
            limit = self.manager.settings.tenant_max_snapshots
            if limit and len(await self.list({})) >= limit:
                msg = f"tenant {tenant!r} already has {limit} snapshots, its limit"
                raise QuotaExceededError(msg)
            spec = spec_from_json(info.labels[LABEL_SPEC])
            # A capped /workspace's archive is about its cap; a sparse file's is its whole length,
            # which must not become an image as big as the file says it is.
            bound = 2 * spec.limits.disk_bytes + SNAPSHOT_SLACK_BYTES if spec.limits.disk_bytes else 0
            marks = {
                LABEL_TENANT: tenant,
                LABEL_SNAPSHOT: name,
                LABEL_SNAPSHOT_OF: workspace_id,
                LABEL_SNAPSHOT_LABELS: json.dumps(dict(labels), sort_keys=True),
                LABEL_SPEC: spec_to_json(spec),
                LABEL_SNAPSHOT_TIME: datetime.datetime.now(datetime.UTC).isoformat(),
            }
            limit = min(bound or self.manager.settings.max_snapshot_bytes, self.manager.settings.max_snapshot_bytes)
            if include_memory:
                image = await self._with_memory(info, spec, ref, marks, limit)
            else:
                image = await self.backend.snapshot_container(
                    workspace_id,
                    ref,
                    marks,
                    max_workspace_bytes=limit,
                    max_root_bytes=self.manager.settings.max_snapshot_bytes,
                    # The commit freezes the container: its agent is told, as for a pause, so that a
                    # command's timeout falling in that moment does not kill it at the thaw.
                    frozen=self.manager.bridge.freezer(info),
                )
        self.manager.touch(workspace_id)
        log.info("snapshot.taken", snapshot=name, workspace_id=workspace_id, size_bytes=image.size_bytes)
        return self.describe(image)

    async def _with_memory(
        self, info: ContainerInfo, spec: WorkspaceSpec, ref: str, marks: Mapping[str, str], limit: int
    ) -> ImageInfo:
        """Checkpoint the workspace's processes, then commit its files, as one moment of it.

        The agent lets go of the host (the runtime cannot save a socket bound or connected to
        it) and the workspace is paused: the runtime saves its memory, and the commit and the
        copy of /workspace see the files as the memory left them. Then it runs on, and its
        agent listens again. The checkpoint is kept under the image's tag; a failure keeps
        neither.

        Raises:
            FailedPreconditionError: the workspace cannot be kept with its memory (its
                runtime, a paused workspace, a capped /workspace, an open forward, a socket
                bound on the host...).
        """
        workspace_id = info.workspace_id
        if info.runtime != "runsc":
            msg = (
                f"workspace {workspace_id!r} runs under {info.runtime or 'runc'}: memory snapshots need gVisor "
                "(runtime runsc); runc's checkpoints need CRIU, which does not work on this kernel "
                "(docs/snapshots.md). Snapshot its files only, or create it with runtime runsc"
            )
            raise FailedPreconditionError(msg)
        if info.paused:
            msg = f"workspace {workspace_id!r} is paused: resume it to snapshot its memory"
            raise FailedPreconditionError(msg)
        if spec.limits.disk_bytes:
            msg = (
                f"workspace {workspace_id!r} has a capped /workspace (a tmpfs the engine fills only after a "
                "start), which a restored fork cannot be given in time: snapshot its files only"
            )
            raise FailedPreconditionError(msg)
        key = checkpoint_key(ref)
        link = self.manager.bridge.context_for(info).link
        began = time.monotonic()
        async with link.let_go():
            let_go = time.monotonic()
            await self.backend.pause_container(workspace_id)
            try:
                paused = time.monotonic()
                # Both read the paused workspace, neither changes it: the runtime saves its memory
                # while its files are read; the image is made once the checkpoint's size is known.
                checkpoint = asyncio.ensure_future(self.backend.checkpoint_container(workspace_id, key))

                async def size_label() -> Mapping[str, str]:
                    return {LABEL_SNAPSHOT_MEMORY: str(await asyncio.shield(checkpoint))}

                sized = asyncio.ensure_future(size_label())

                files = asyncio.ensure_future(
                    self.backend.snapshot_container(
                        workspace_id,
                        ref,
                        {**marks, LABEL_SNAPSHOT_CONTAINER: info.container_id},
                        max_workspace_bytes=limit,
                        max_root_bytes=self.manager.settings.max_snapshot_bytes,
                        later_labels=sized,
                    )
                )
                try:
                    memory, image = await asyncio.gather(checkpoint, files)
                except BaseException:
                    sized.cancel()
                    await asyncio.shield(self._discard_parts(checkpoint, files, key, ref))
                    raise
                taken = time.monotonic()
            finally:
                await asyncio.shield(self.backend.resume_container(workspace_id))
        log.info(
            "snapshot.memory_taken",
            workspace_id=workspace_id,
            memory_bytes=memory,
            let_go_s=round(let_go - began, 4),
            pause_s=round(paused - let_go, 4),
            checkpoint_and_files_s=round(taken - paused, 4),
            total_s=round(time.monotonic() - began, 4),
        )
        return image

    async def _discard_parts(
        self, checkpoint: asyncio.Future[int], files: asyncio.Future[ImageInfo], key: str, ref: str
    ) -> None:
        """A memory snapshot that failed: neither its checkpoint nor its image is kept."""
        for part in (checkpoint, files):
            part.cancel()
        await asyncio.gather(checkpoint, files, return_exceptions=True)
        await self.backend.remove_checkpoint(key)
        with contextlib.suppress(SandboxdError):
            await self.backend.remove_image(ref, prune=True)

    async def restore(self, workspace_id: str, name: str) -> Workspace:
        """Return a workspace to the caller's snapshot ``name``, keeping its id and its own spec.

        Its container and volume go, and a new container of that id starts from the snapshot
        (with its memory: restored running, the snapshot's sessions under new process ids).

        Raises:
            WorkspaceNotFoundError: no such workspace of the caller's.
            NotFoundError: no such snapshot of the caller's.
            FailedPreconditionError: a memory snapshot and a workspace it cannot be restored into.
        """
        # The tenant's snapshot lock: the snapshot cannot be deleted between the checks and the create.
        async with self._lock(current_tenant()):
            image = await self.find(name)
            info = await self.manager.owned_info(workspace_id)
            spec = spec_from_json(info.labels[LABEL_SPEC])
            if image.labels.get(LABEL_SNAPSHOT_MEMORY):
                check_restorable(name, spec)
                if not await self.backend.checkpoint_exists(checkpoint_key(image.ref)):
                    msg = f"snapshot {name!r}'s memory is gone from the engine's host: it cannot be restored"
                    raise FailedPreconditionError(msg)
            # Everything that can be checked is: the workspace goes only now. A create that fails
            # after this (the engine refusing the container) leaves it gone, and says so.
            await self.manager.delete(workspace_id)
            try:
                workspace = await self.manager.create(
                    dataclasses.replace(spec, image=""), workspace_id=workspace_id, snapshot=image
                )
            except SandboxdError as exc:
                exc.message = f"workspace {workspace_id!r} was removed to be restored, but: {exc.message}"
                raise
        log.info("snapshot.restored", snapshot=name, workspace_id=workspace_id)
        return workspace

    async def find(self, name: str) -> ImageInfo:
        """The caller's snapshot ``name`` as its image.

        Raises:
            NotFoundError: the caller has none of that name (another tenant's is none of its).
        """
        check_snapshot_name(name)
        image = await self.backend.image_info(self.ref(name, current_tenant()))
        if (
            image is None
            or image.labels.get(LABEL_TENANT) != current_tenant()
            or image.labels.get(LABEL_SNAPSHOT) != name
        ):
            msg = f"snapshot {name!r} not found"
            raise NotFoundError(msg)
        return image

    async def get(self, name: str) -> Snapshot:
        """The caller's snapshot ``name``; NotFoundError when there is none."""
        return self.describe(await self.find(name))

    async def list(self, label_selector: Mapping[str, str]) -> list[Snapshot]:
        """The caller's snapshots carrying every label in ``label_selector``, oldest first."""
        check_labels(label_selector, "label_selector")
        images = await self.backend.list_images({LABEL_TENANT: current_tenant()})
        found = sorted((self.describe(i) for i in images if i.labels.get(LABEL_SNAPSHOT)), key=_order)
        return [s for s in found if all(s.labels.get(k) == v for k, v in label_selector.items())]

    async def delete(self, name: str) -> None:
        """Remove the caller's snapshot ``name``; forks keep their files (its layers stay while they run).

        Raises:
            NotFoundError: the caller has none of that name.
        """
        image = await self.find(name)
        async with self._lock(current_tenant()):
            await self.backend.remove_image(image.ref, prune=True)
            if image.labels.get(LABEL_SNAPSHOT_MEMORY):
                await self.backend.remove_checkpoint(checkpoint_key(image.ref))
        await self.backend.remove_unused_images()
        log.info("snapshot.deleted", snapshot=name)

    def describe(self, image: ImageInfo) -> Snapshot:
        """The snapshot (or template) an image of the caller's is."""
        try:
            labels = json.loads(image.labels.get(LABEL_SNAPSHOT_LABELS, "{}"))
        except ValueError:
            labels = {}
        try:
            created = datetime.datetime.fromisoformat(image.labels[LABEL_SNAPSHOT_TIME])
        except (KeyError, ValueError):
            created = image.created or datetime.datetime.fromtimestamp(0, datetime.UTC)
        return Snapshot(
            name=image.labels[LABEL_SNAPSHOT],
            source_workspace_id=image.labels.get(LABEL_SNAPSHOT_OF, ""),
            create_time=created,
            labels=labels if isinstance(labels, dict) else {},
            size_bytes=image.size_bytes,
            spec=spec_from_json(image.labels[LABEL_SPEC]),
            memory_bytes=_int(image.labels.get(LABEL_SNAPSHOT_MEMORY, "")),
            start_command=template_command(image.labels.get(LABEL_TEMPLATE_START, "")),
            ready_command=template_command(image.labels.get(LABEL_TEMPLATE_READY, "")),
            build_digest=image.labels.get(LABEL_TEMPLATE_DIGEST, ""),
        )


def template_command(label: str) -> str:
    """A template's command as its label keeps it (a JSON string); empty for none or a malformed one."""
    try:
        command = json.loads(label) if label else ""
    except ValueError:
        return ""
    return command if isinstance(command, str) else ""


def _int(text: str) -> int:
    try:
        return max(0, int(text))
    except ValueError:
        return 0


def _order(snapshot: Snapshot) -> tuple[datetime.datetime, str]:
    return (snapshot.create_time, snapshot.name)
