"""Create requests: one create per id at a time, idempotent retries by request id, and the tenant quota.

A create is exclusive for its id from before its first await (:class:`_Making`); a retry of
the same request (Google AIP-155) waits for the one in flight and answers with what it made.
A create whose caller went away runs to its end, and what it made is removed then, unless a
retry took it first. Each tenant's creates in flight count toward its quota.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import secrets

import structlog

from ..backend.base import Backend, ImageInfo
from ..errors import InvalidSpecError, QuotaExceededError, WorkspaceExistsError, WorkspaceNotFoundError, quoted
from ..models import Workspace, WorkspaceSpec
from ..secrets import SecretStore
from ..settings import Settings
from ..tenancy import current_tenant
from .bridge import Bridge
from .members import PoolMembers
from .provision import Provisioner
from .records import Records, Teardown
from .specs import (
    LABEL_CREATE_DIGEST,
    LABEL_SNAPSHOT,
    LABEL_SPEC,
    LABEL_TEMPLATE_DIGEST,
    LABEL_TENANT,
    check_request_id,
    check_restorable,
    check_workspace_id,
    inherit,
    made_by,
    request_digest,
    resolve_spec,
    restored_from,
    spec_from_json,
)

__all__ = ["Creates"]

log = structlog.get_logger(__name__)


@dataclasses.dataclass
class _Making:
    """A create in flight: whose it is, by which request, and the work that makes it.

    The work's result is the workspace and whether this create made it (False: it found the
    one its request had made, which its caller's going away must never remove).
    """

    tenant: str
    request_id: str
    work: asyncio.Future[tuple[Workspace, bool]]
    waiting: int = 0
    """Retries of the same request waiting for it: while any wait, its own caller's going away removes nothing."""


@dataclasses.dataclass(frozen=True)
class _Asked:
    """What a create was asked beside its spec: the caller's id, its request id and digest."""

    chosen_id: str
    request_id: str
    digest: str
    repeat: bool
    """Its request is known to have made (or be making) this id: what that made is looked for first."""

    @property
    def request(self) -> tuple[str, str] | None:
        """Its request id and digest, for the workspace's labels (:func:`container_spec`); None without one."""
        return (self.request_id, self.digest) if self.request_id else None


class Creates:
    """Runs create requests: exclusive per id, idempotent per request id, within the tenant's quota.

    Args:
        backend: the container engine.
        settings: the daemon's defaults and the tenants' quotas.
        secrets: checks specs' ``secret:NAME`` values.
        records: the workspaces' records (what each request made is kept on its record).
        bridge: runs a forsaken create's clean-up in the background.
        members: claims a warm pool member when one matches.
        provisioner: starts a container when none does.
        teardown: removes what a forsaken create made.
    """

    def __init__(
        self,
        backend: Backend,
        settings: Settings,
        secrets: SecretStore,
        records: Records,
        bridge: Bridge,
        members: PoolMembers,
        provisioner: Provisioner,
        teardown: Teardown,
    ) -> None:
        """Wire the creates."""
        self.backend = backend
        self.settings = settings
        self.secrets = secrets
        self.records = records
        self.bridge = bridge
        self.members = members
        self.provisioner = provisioner
        self._teardown = teardown
        self._quota_lock = asyncio.Lock()
        self._reserved: dict[str, dict[str, int]] = {}
        """Each tenant's creates in flight (workspace id -> memory limit), counted against its quota
        once: a container one of them has made already is counted here, not among the tenant's."""
        self._making: dict[str, _Making] = {}
        """Creates in flight, by workspace id: what makes a create of one id exclusive."""
        self._requests: dict[tuple[str, str], str] = {}
        """``(tenant, request_id)`` of each create in flight with one -> its workspace id."""
        self._abandoned: set[str] = set()
        """Workspaces made by a create whose caller went away, to be removed unless a retry took them first."""

    async def create(
        self,
        spec: WorkspaceSpec,
        *,
        workspace_id: str = "",
        request_id: str = "",
        snapshot: ImageInfo | None = None,
    ) -> Workspace:
        """Create and start a workspace.

        A create is complete once its agent answered; until then its container is provisional
        (``Backend.commit_container``), and a daemon that dies meanwhile leaves nothing a
        restart keeps. With ``request_id`` a retried create is idempotent (Google AIP-155):
        the caller's create of the same request, made or in flight, is its answer.

        Args:
            spec: the caller's spec; defaults are filled in.
            workspace_id: optional caller-chosen id; empty generates ``ws-<12 hex>`` (or, with
                ``request_id``, takes the id of the workspace that request made).
            request_id: optional key of this create (:func:`check_request_id`), kept on the
                workspace as ``sandboxd.create_request``.
            snapshot: a snapshot's image to fork (``SnapshotStore.find``): the workspace starts
                with its files, and every field ``spec`` leaves unset is the snapshot's source's.

        Raises:
            InvalidSpecError: a field is out of range or malformed.
            WorkspaceExistsError: the id is taken (by another request, or by a create without one);
                or ``request_id`` made another workspace than ``workspace_id``, or was sent with
                another spec or snapshot.
            ImageNotFoundError: the image is missing and cannot be pulled.
            DockerUnavailableError: the engine is down.
        """
        if workspace_id:
            check_workspace_id(workspace_id)
        if request_id:
            check_request_id(request_id)
        digest = request_digest(spec, snapshot) if request_id else ""
        tenant = current_tenant()
        resolved = self._resolve(spec, snapshot, tenant)
        chosen_id = workspace_id
        workspace_id, repeat = await self._id_for(tenant, workspace_id, request_id)
        repeat = await self._wait_for_earlier(workspace_id, tenant, request_id) or repeat
        # The engine's calls run in threads a cancel cannot stop: a create the caller gives up on
        # runs to its end, and what it made is removed then (nobody has its id). The work begins
        # at the next await; it is on record before: that is what makes a create exclusive.
        asked = _Asked(chosen_id, request_id, digest, repeat)
        work = asyncio.ensure_future(self._create_exclusive(resolved, workspace_id, tenant, asked, snapshot))
        making = self._making[workspace_id] = _Making(tenant, request_id, work)
        if request_id:
            self._requests[(tenant, request_id)] = workspace_id
        try:
            return (await asyncio.shield(work))[0]
        except asyncio.CancelledError:
            work.add_done_callback(functools.partial(self._forsaken, making))
            raise

    def _resolve(self, spec: WorkspaceSpec, snapshot: ImageInfo | None, tenant: str) -> WorkspaceSpec:
        """The create's spec resolved: a fork's unset fields are its snapshot's source's.

        Raises:
            InvalidSpecError: a field is out of range, or a fork names an image.
        """
        if snapshot is not None:
            if spec.image:
                msg = "spec.image must be empty when forking a snapshot: the snapshot is the image"
                raise InvalidSpecError(msg)
            spec = inherit(spec, spec_from_json(snapshot.labels[LABEL_SPEC]), image=snapshot.ref)
            if not spec.working_dir and snapshot.labels.get(LABEL_TEMPLATE_DIGEST) and snapshot.working_dir:
                # A template's steps chose where its workspaces start (WORKDIR), unless its build said.
                spec = dataclasses.replace(spec, working_dir=snapshot.working_dir)
        resolved = resolve_spec(spec, self.settings, self.secrets, tenant)
        if snapshot is not None and restored_from(snapshot):
            check_restorable(snapshot.labels.get(LABEL_SNAPSHOT, ""), resolved)
        return resolved

    async def _id_for(self, tenant: str, workspace_id: str, request_id: str) -> tuple[str, bool]:
        """The id a create makes, and whether its request is known to have made (or be making) it.

        Raises:
            WorkspaceExistsError: the request made another workspace than ``workspace_id``.
        """
        repeat = False
        if request_id:
            # Looked up again after the wait: a create of that request may have begun meanwhile.
            key = (tenant, request_id)
            made_as = self._requests.get(key) or await self._made_as(key) or self._requests.get(key, "")
            if made_as and workspace_id and made_as != workspace_id:
                msg = (
                    f"request_id {quoted(request_id)} made workspace {made_as!r}: "
                    f"a repeat of it names that workspace_id, or none"
                )
                raise WorkspaceExistsError(msg)
            workspace_id, repeat = workspace_id or made_as, bool(made_as)
        return workspace_id or f"ws-{secrets.token_hex(6)}", repeat

    async def _wait_for_earlier(self, workspace_id: str, tenant: str, request_id: str) -> bool:
        """Wait for the creates of the same id and request in flight; whether there was one.

        Raises:
            WorkspaceExistsError: a create of that id is in flight for another request (or none).
        """
        waited = False
        while (earlier := self._making.get(workspace_id)) is not None:
            if not request_id or (earlier.tenant, earlier.request_id) != (tenant, request_id):
                # Two concurrent creates of one id: the second must neither wait nor undo the first.
                msg = f"workspace {workspace_id!r} already exists"
                raise WorkspaceExistsError(msg)
            # A retry of a create still in flight (its caller's connection dropped): it waits for
            # that one, and then finds what it made, or makes it again if it failed.
            earlier.waiting += 1
            try:
                with contextlib.suppress(Exception):
                    await asyncio.shield(earlier.work)
            finally:
                earlier.waiting -= 1
            waited = True
        return waited

    async def _made_as(self, key: tuple[str, str]) -> str:
        """The id of the workspace the create of ``key`` (tenant, request id) made, if it still exists; else ""."""
        workspace_id = self.records.made_by(key)
        if not workspace_id:
            return ""
        try:
            info = await self.backend.inspect_container(workspace_id)
        except WorkspaceNotFoundError:
            info = None
        if info is None or made_by(info) != key:
            self.records.forget_request(key)  # removed behind the daemon's back (and its id perhaps reused)
            return ""
        return workspace_id

    def _forsaken(self, making: _Making, work: asyncio.Future[tuple[Workspace, bool]]) -> None:
        """A create whose caller went away has ended: remove what it made, unless a retry waits for it.

        A repeat that found what its request had made removes nothing: another caller may hold it.
        """
        if work.cancelled() or work.exception() is not None or making.waiting or not work.result()[1]:
            return
        workspace_id = work.result()[0].workspace_id
        log.info("workspace.create_abandoned", workspace_id=workspace_id)
        self._abandoned.add(workspace_id)
        self.bridge.in_background(self._remove_forsaken(workspace_id))

    async def _remove_forsaken(self, workspace_id: str) -> None:
        async with self.records.lock(workspace_id):
            if workspace_id not in self._abandoned:
                return  # a retry of its create took it first
            self._abandoned.discard(workspace_id)
            with contextlib.suppress(WorkspaceNotFoundError):
                await self._teardown(workspace_id, "its create was cancelled")

    async def _repeated(self, workspace_id: str, tenant: str, asked: _Asked) -> Workspace | None:
        """The workspace ``workspace_id`` if the tenant's create of the same request made it; None if there is none.

        Called under the id's lock (a forsaken create's removal takes it too).

        Raises:
            WorkspaceExistsError: a workspace of that id exists that this request did not make,
                or that it made from another spec.
        """
        try:
            info = await self.backend.inspect_container(workspace_id)
        except WorkspaceNotFoundError:
            return None
        if made_by(info) != (tenant, asked.request_id):
            msg = f"workspace {workspace_id!r} already exists"
            raise WorkspaceExistsError(msg)
        if info.labels.get(LABEL_CREATE_DIGEST, "") != asked.digest:
            msg = (
                f"request_id {quoted(asked.request_id)} made workspace {workspace_id!r} from another spec or "
                "snapshot: a request id names one create"
            )
            raise WorkspaceExistsError(msg)
        self._abandoned.discard(workspace_id)
        self.records.touch(workspace_id)
        log.info("workspace.create_repeated", workspace_id=workspace_id, create_request=asked.request_id)
        return self.records.describe(info)

    async def _create_exclusive(
        self, resolved: WorkspaceSpec, workspace_id: str, tenant: str, asked: _Asked, snapshot: ImageInfo | None
    ) -> tuple[Workspace, bool]:
        """The rest of :meth:`create`, once the id is this create's: the workspace, and whether it made it."""
        memory = resolved.limits.memory_bytes
        request_id = asked.request_id
        try:
            if asked.repeat:
                async with self.records.lock(workspace_id):
                    found = await self._repeated(workspace_id, tenant, asked)
                if found is not None:
                    return found, False
            async with self._quota_lock:  # concurrent creates must not all pass one quota
                await self._check_quota(tenant, memory)
                self._reserved.setdefault(tenant, {})[workspace_id] = memory
            try:
                made = await self._make(resolved, workspace_id, tenant, asked, snapshot)
                if request_id:
                    self.records.note_made((tenant, request_id), workspace_id)
                return made, True
            finally:
                del self._reserved[tenant][workspace_id]
                if not self._reserved[tenant]:
                    del self._reserved[tenant]
        finally:
            del self._making[workspace_id]
            if self._requests.get((tenant, request_id)) == workspace_id:
                del self._requests[(tenant, request_id)]

    async def _make(
        self, resolved: WorkspaceSpec, workspace_id: str, tenant: str, asked: _Asked, snapshot: ImageInfo | None
    ) -> Workspace:
        """Claim a pool member for the id, or start a container, under the id's lock.

        A create refused (its id taken) or failed leaves the record of the workspace holding the
        id as it was: its idle clock is not the create's.
        """
        async with self.records.lock(workspace_id):
            holder = self.records.get(workspace_id)
            kept = holder.last_used if holder is not None else None
            try:
                # In use from the start: the reaper must not count idleness from before it existed.
                async with self.records.in_use(workspace_id):
                    made = None
                    if snapshot is None:
                        made = await self.members.claim(
                            resolved, workspace_id, tenant, chosen=bool(asked.chosen_id), request=asked.request
                        )
                    if made is None:
                        made = await self.provisioner.start(
                            resolved, workspace_id, tenant, snapshot=snapshot, request=asked.request
                        )
                    self.records.set_end(workspace_id, resolved.lifetime_s)
                    return dataclasses.replace(made, expire_time=self.records.describe_end(workspace_id))
            except BaseException:
                record = self.records.get(workspace_id)
                if record is not None and record is holder:
                    record.last_used = kept  # the holder's own last use, not this create's
                elif record is not None and not record.busy:
                    self.records.drop(workspace_id)  # nothing was created: nothing to remember
                raise

    async def _check_quota(self, tenant: str, memory_bytes: int) -> None:
        """RESOURCE_EXHAUSTED when the tenant is at its workspace count or memory total."""
        s = self.settings
        if not (s.tenant_max_workspaces or s.tenant_max_memory_bytes):
            return
        creating = self._reserved.get(tenant, {})
        # A create in flight may have its container already (provisional, or a member being
        # claimed): it counts once, as in flight.
        listed = await self.backend.list_containers({LABEL_TENANT: tenant})
        mine = [self.records.describe(i) for i in listed if i.workspace_id not in creating]
        if s.tenant_max_workspaces and len(mine) + len(creating) >= s.tenant_max_workspaces:
            msg = f"tenant {tenant!r} already has {len(mine) + len(creating)} workspaces, its limit"
            raise QuotaExceededError(msg)
        used = sum(w.spec.limits.memory_bytes for w in mine) + sum(creating.values())
        if s.tenant_max_memory_bytes and used + memory_bytes > s.tenant_max_memory_bytes:
            msg = (
                f"tenant {tenant!r} would use {used + memory_bytes} bytes of memory limits, "
                f"over its {s.tenant_max_memory_bytes}-byte quota"
            )
            raise QuotaExceededError(msg)
