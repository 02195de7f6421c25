"""WorkspaceManager: creates, finds, pauses and removes workspaces over a Backend."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
from collections.abc import Mapping, Sequence

import structlog

from ..agentbuild import AgentBuild
from ..audit import AuditLog
from ..backend.base import Backend, ContainerInfo, ImageInfo
from ..egress import EgressProxies
from ..errors import (
    FailedPreconditionError,
    SandboxdError,
    WorkspaceNotFoundError,
)
from ..images import egress_image_ref
from ..models import (
    EgressRule,
    NetworkPolicy,
    Workspace,
    WorkspaceSpec,
    WorkspaceState,
)
from ..pool import LABEL_POOL, PoolClass, WarmPool
from ..processes import ExecContext, ProcessTable
from ..secrets import SecretStore
from ..settings import Settings
from ..tenancy import DEFAULT_TENANT, current_tenant
from .bridge import Bridge
from .creating import Creates
from .idle import IdleReaper
from .listing import list_page
from .members import PoolMembers
from .network import Networks
from .provision import Provisioner
from .records import Records, WorkspaceRecord
from .specs import (
    LABEL_AGENT,
    LABEL_SNAPSHOT,
    LABEL_SPEC,
    LABEL_TENANT,
    check_lifetime,
    check_workspace_id,
    made_by,
    owned,
    resolve_spec,
    spec_from_json,
)

__all__ = ["WorkspaceManager"]

log = structlog.get_logger(__name__)


class WorkspaceManager:
    """Creates, finds and removes workspaces over a :class:`Backend`.

    Args:
        backend: the container engine.
        settings: daemon defaults and caps.
        processes: the process table, told when a workspace goes away.
        secrets: resolves ``secret:NAME`` values of workspace environments.
        agent: the agent new workspaces run; None finds it (building it if missing) at the
            first create, and again at each create while that fails.
    """

    def __init__(
        self,
        backend: Backend,
        settings: Settings,
        processes: ProcessTable,
        *,
        secrets: SecretStore | None = None,
        agent: AgentBuild | None = None,
    ) -> None:
        """Wire the manager."""
        self.backend = backend
        self.settings = settings
        self.processes = processes
        self.secrets = secrets or SecretStore("", {})
        self.records = Records()
        """What the daemon holds of each workspace, one record per id."""
        self.bridge = Bridge(backend, settings, processes, self.secrets, self.records)
        """Exec contexts, agent links, pausing and thawing."""
        self.egress = EgressProxies(backend, settings, egress_image_ref())
        """The ALLOWLIST workspaces' egress proxies."""
        self.provisioner = Provisioner(backend, settings, self.egress, self.bridge, self.records, agent)
        """Starts workspaces' containers."""
        self.members = PoolMembers(
            backend, settings, processes, self.secrets, self.records, self.bridge, self.provisioner
        )
        """The warm pool's members: the pool's :class:`~sandboxd.pool.MemberFactory`."""
        self.creates = Creates(
            backend, settings, self.secrets, self.records, self.bridge, self.members, self.provisioner, self._remove
        )
        """Create requests and the tenants' quotas."""
        self.networks = Networks(backend, settings, self.egress, self.records, self.bridge)
        """Workspaces' network policies."""
        self.reaper = IdleReaper(backend, processes, self.records, self.bridge, self._remove)
        """Removes or pauses idle workspaces."""

    @property
    def pool(self) -> WarmPool | None:
        """The warm pool, once the daemon made it (over :attr:`members`)."""
        return self.members.pool

    @pool.setter
    def pool(self, pool: WarmPool | None) -> None:
        self.members.pool = pool

    def pool_classes(self) -> builtins.list[PoolClass]:
        """The pool's classes from the settings (:meth:`PoolMembers.pool_classes`).

        Raises:
            InvalidSpecError: the pool file is bad, a class's spec is out of range, or two classes
                share a name or a spec.
        """
        return self.members.pool_classes()

    def resolve(self, spec: WorkspaceSpec) -> WorkspaceSpec:
        """Validate ``spec`` and fill in every default except the user (:func:`resolve_spec`).

        Raises:
            InvalidSpecError: with a message naming the offending field.
        """
        return resolve_spec(spec, self.settings, self.secrets, current_tenant())

    # -- life cycle ----------------------------------------------------------------------------------
    async def create(
        self,
        spec: WorkspaceSpec,
        *,
        workspace_id: str = "",
        request_id: str = "",
        snapshot: ImageInfo | None = None,
    ) -> Workspace:
        """Create and start a workspace (:meth:`Creates.create`).

        Raises:
            InvalidSpecError: a field is out of range or malformed.
            WorkspaceExistsError: the id is taken (by another request, or by a create without one);
                or ``request_id`` made another workspace than ``workspace_id``, or was sent with
                another spec or snapshot.
            QuotaExceededError: the tenant is at its workspace count or memory total.
            ImageNotFoundError: the image is missing and cannot be pulled.
            DockerUnavailableError: the engine is down.
        """
        return await self.creates.create(spec, workspace_id=workspace_id, request_id=request_id, snapshot=snapshot)

    def touch(self, workspace_id: str) -> None:
        """Note a call on the workspace (its idle TTL starts again)."""
        self.records.touch(workspace_id)

    def in_use(self, workspace_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Mark a call on the workspace as in flight: the idle reaper leaves it alone until it ends."""
        return self.records.in_use(workspace_id)

    async def exec_context(self, workspace_id: str) -> ExecContext:
        """Return what a process needs to run in the workspace (:meth:`Bridge.exec_context`).

        Raises:
            WorkspaceNotFoundError: no such workspace.
            WorkspaceNotRunningError: its container is not running.
            FailedPreconditionError: the workspace predates the agent (recreate it), or it is
                paused with ``auto_resume`` off.
        """
        return await self.bridge.exec_context(workspace_id)

    async def awake(self, workspace_id: str) -> None:
        """Before a call that needs the workspace's processes: resume it if it is paused.

        Raises:
            FailedPreconditionError: it is paused and its ``auto_resume`` is off.
        """
        await self.bridge.awake(workspace_id)

    async def close(self) -> None:
        """Close every agent link (the daemon stops; the agents keep their sessions)."""
        await self.bridge.close()

    def id_lock(self, workspace_id: str) -> asyncio.Lock:
        """The lock that serialises creating, deleting, pausing, resuming and snapshotting one id."""
        return self.records.lock(workspace_id)

    async def owned_info(self, workspace_id: str) -> ContainerInfo:
        """The caller's workspace ``workspace_id`` as the engine reports it.

        Raises:
            WorkspaceNotFoundError: none of the caller's has that id.
        """
        check_workspace_id(workspace_id)
        info = owned(await self.backend.inspect_container(workspace_id), current_tenant())
        self.touch(workspace_id)
        return info

    async def get(self, workspace_id: str) -> Workspace:
        """Return a workspace; WorkspaceNotFoundError when there is none (or it is being removed)."""
        check_workspace_id(workspace_id)
        if (record := self.records.get(workspace_id)) is not None and record.removing:
            msg = f"workspace {workspace_id!r} not found"  # its teardown has begun: gone to callers
            raise WorkspaceNotFoundError(msg)
        workspace = self.records.describe(owned(await self.backend.inspect_container(workspace_id), current_tenant()))
        self.touch(workspace_id)
        return workspace

    async def list(
        self, label_selector: Mapping[str, str], *, page_size: int = 0, page_token: str = ""
    ) -> tuple[builtins.list[Workspace], str]:
        """One page of the caller's workspaces carrying every label in ``label_selector`` (:func:`list_page`).

        Raises:
            InvalidSpecError: a bad selector, page size or token.
        """
        return await list_page(
            self.backend,
            label_selector,
            tenant=current_tenant(),
            page_size=page_size,
            page_token=page_token,
            describe=self.records.describe,
        )

    async def delete(self, workspace_id: str) -> None:
        """Remove a workspace's container and volume.

        A volume whose container was removed behind sandboxd's back is removed too.

        Raises:
            WorkspaceNotFoundError: neither a container nor a volume of that id exists.
        """
        check_workspace_id(workspace_id)
        async with self.records.lock(workspace_id):
            record = self.records.get(workspace_id)
            if record is not None and record.tenant is not None:
                # Known to this daemon: whose it is is on record, and the engine is asked nothing
                # before the removal (a container removed behind its back leaves NOT_FOUND below).
                if record.tenant != current_tenant():
                    msg = f"workspace {workspace_id!r} not found"
                    raise WorkspaceNotFoundError(msg)
                forked = record.forked
            else:
                forked = await self._owned_on_engine(workspace_id)
            # A fork's snapshot image, if the snapshot was deleted, was kept for it: it goes too.
            await self._remove(workspace_id, "its workspace was deleted", prune_images=forked)
        log.info("workspace.deleted", workspace_id=workspace_id)

    async def _owned_on_engine(self, workspace_id: str) -> bool:
        """Check with the engine that the caller owns a workspace the daemon has no record of; whether it is a fork.

        Raises:
            WorkspaceNotFoundError: neither a container nor a volume of the caller's has that id.
        """
        try:
            info: ContainerInfo | None = await self.backend.inspect_container(workspace_id)
        except WorkspaceNotFoundError:
            info = None
        if info is not None:
            owned(info, current_tenant())  # another tenant's container: NOT_FOUND, whatever its volume says
            return bool(info.labels.get(LABEL_SNAPSHOT))
        # The container is gone behind sandboxd's back; its volume tells whose it was.
        labels = await self.backend.volume_labels(workspace_id)
        if labels is None or labels.get(LABEL_TENANT, DEFAULT_TENANT) != current_tenant():
            msg = f"workspace {workspace_id!r} not found"
            raise WorkspaceNotFoundError(msg)
        return False

    async def pause(self, workspace_id: str) -> Workspace:
        """Freeze every process of a running workspace; its commands' timeouts stand still too.

        The agent is told first (``AgentLink.freeze``), so that the time frozen counts toward
        no timeout; an agent that cannot be reached does not stop the pause.

        Raises:
            WorkspaceNotFoundError: no such workspace.
            FailedPreconditionError: it is paused already, or does not run.
        """
        check_workspace_id(workspace_id)
        async with self.records.lock(workspace_id):
            info = owned(await self.backend.inspect_container(workspace_id), current_tenant())
            await self.bridge.pause(info)
        log.info("workspace.paused", workspace_id=workspace_id)
        return dataclasses.replace(self.records.describe(info), state=WorkspaceState.PAUSED)

    async def set_lifetime(self, workspace_id: str, lifetime_s: float) -> Workspace:
        """End a workspace ``lifetime_s`` seconds from now (0: never), as its idle action says.

        Raises:
            WorkspaceNotFoundError: no such workspace.
            InvalidSpecError: a lifetime under 1 s or over a year.
        """
        check_workspace_id(workspace_id)
        check_lifetime(lifetime_s, "lifetime")
        async with self.records.lock(workspace_id):
            info = owned(await self.backend.inspect_container(workspace_id), current_tenant())
            self.records.set_end(workspace_id, lifetime_s)
        self.touch(workspace_id)
        log.info("workspace.lifetime_set", workspace_id=workspace_id, lifetime_s=lifetime_s)
        return self.records.describe(info)

    async def resume(self, workspace_id: str) -> Workspace:
        """Thaw a paused workspace: its commands go on where they were.

        Raises:
            WorkspaceNotFoundError: no such workspace.
            FailedPreconditionError: it is not paused.
        """
        check_workspace_id(workspace_id)
        async with self.records.lock(workspace_id):
            info = owned(await self.backend.inspect_container(workspace_id), current_tenant())
            if not info.paused:
                self.records.not_paused(workspace_id)
                msg = f"workspace {workspace_id!r} is not paused"
                raise FailedPreconditionError(msg)
            await self.bridge.thaw(info)
        log.info("workspace.resumed", workspace_id=workspace_id)
        return dataclasses.replace(self.records.describe(info), state=WorkspaceState.RUNNING)

    async def _remove(self, workspace_id: str, why: str, *, prune_images: bool = False) -> None:
        """The one teardown of a workspace (its id lock held): delete, the idle reaper and a forsaken create use it.

        In order: its sessions are evicted with ``why``, its agent link closes, the engine removes
        its container and volume (and, with ``prune_images``, the images nothing uses any more),
        its record goes (with everything the daemon held of it), and its egress proxy goes.

        A teardown begun runs to its end: a caller cancelled meanwhile (a delete whose caller
        left) waits for it, holding the lock, and is cancelled then; a workspace is never left
        half removed (its sessions ended, its container or proxy still there).

        Raises:
            WorkspaceNotFoundError: neither its container nor its volume was there.
        """
        teardown = asyncio.ensure_future(self._teardown(workspace_id, why, prune_images=prune_images))
        try:
            await asyncio.shield(teardown)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(teardown)
            raise

    async def _teardown(self, workspace_id: str, why: str, *, prune_images: bool) -> None:
        """The steps of :meth:`_remove`."""
        # The record stays until the container is gone, marked as going: a call meanwhile finds the
        # workspace gone rather than making a new link (and a session) to a container going away.
        record = self.records.get(workspace_id) or WorkspaceRecord(workspace_id)
        record.removing = True
        try:
            await self.processes.forget_workspace(workspace_id, why)
            if (context := record.context) is not None:
                record.context = None
                await context.link.close()
            removed = await self.backend.remove_container(workspace_id)
        finally:
            self.records.drop(workspace_id)
        if removed and prune_images:
            await self.backend.remove_unused_images()
        if (record.network or (None,))[0] is NetworkPolicy.ALLOWLIST or not removed:
            await self.egress.close(workspace_id)
        if not removed:
            msg = f"workspace {workspace_id!r} not found"
            raise WorkspaceNotFoundError(msg)

    async def adopt(self, audit: AuditLog | None = None) -> builtins.list[str]:
        """Take over the workspaces of an earlier run, and the commands their agents kept; return their ids.

        Nothing is kept outside Docker and the agents: adoption is reading the labels and
        connecting to each running workspace's agent, whose welcome lists the sessions it
        holds (:meth:`ProcessTable.adopt`); each gets a ``process.adopted`` line in ``audit``.
        A workspace created before the agent existed is listed but refused for commands
        (``exec_context`` says to recreate it).
        """
        self.bridge.audit = audit
        self.egress.audit = audit
        # Blank labels are a snapshot's inheritance (an image's labels stay on its containers).
        listed = [info for info in await self.backend.list_containers({}) if info.labels.get(LABEL_SPEC)]
        members = [info for info in listed if info.labels.get(LABEL_POOL)]
        infos = [info for info in listed if not info.labels.get(LABEL_POOL)]
        for info in infos:
            self.records.seen(info).network = await self.networks.network_of(info)
            # No end is kept across restarts: each lifetime counts again from now (never earlier
            # than it was meant to, whatever SetWorkspaceLifetime had said).
            self.records.set_end(info.workspace_id, spec_from_json(info.labels[LABEL_SPEC]).lifetime_s)
            if (key := made_by(info)) is not None:
                self.records.note_made(key, info.workspace_id)
        await self.egress.adopt({info.workspace_id: info.labels.get(LABEL_TENANT, DEFAULT_TENANT) for info in infos})
        gate = asyncio.Semaphore(8)

        async def attach(info: ContainerInfo) -> None:
            if info.paused:
                self.records.note_paused(info)
            if not info.running or LABEL_AGENT not in info.labels:
                return
            async with gate:
                try:
                    await self.bridge.context_for(info).link.connect()
                except SandboxdError as exc:
                    log.warning("workspace.adopt_failed", workspace_id=info.workspace_id, error=exc.message)

        await asyncio.gather(*(attach(info) for info in infos))
        if self.pool is not None:
            await self.pool.adopt(members)
        else:
            for member in members:
                await self.members.remove_member(member.workspace_id)
        return [info.workspace_id for info in infos]

    async def update_network(
        self, workspace_id: str, network: NetworkPolicy | None, rules: Sequence[EgressRule]
    ) -> Workspace:
        """Give a running workspace another network policy, or an ALLOWLIST one other rules (:meth:`Networks.update`).

        Raises:
            WorkspaceNotFoundError: no such workspace of the caller's.
            WorkspaceNotRunningError: its container is not running.
            InvalidSpecError: the policy is not available under its runtime, or a rule is invalid.
            SandboxdError: the engine refused the network or the proxy.
        """
        return await self.networks.update(workspace_id, network, rules)

    async def reap_idle(self, audit: AuditLog | None = None) -> builtins.list[str]:
        """Remove or pause (its ``idle_action``) every workspace idle past its TTL (:meth:`IdleReaper.reap`).

        Returns:
            The ids removed or paused.
        """
        return await self.reaper.reap(audit)
