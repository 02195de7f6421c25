"""What the warm pool needs of workspaces: members started, checked, claimed and removed.

:class:`PoolMembers` is the :class:`~sandboxd.pool.MemberFactory` the pool is given: the pool
decides when a member starts or goes, and this module how. A claim (:meth:`PoolMembers.claim`)
makes a ready member a caller's workspace.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import structlog

from ..agentbuild import AGENT_PATH
from ..backend.base import Backend, ContainerInfo
from ..errors import (
    FailedPreconditionError,
    InvalidSpecError,
    SandboxdError,
    WorkspaceExistsError,
    WorkspaceNotFoundError,
    quoted,
)
from ..models import ExecSpec, Workspace, WorkspaceSpec
from ..pool import PoolClass, WarmPool, read_pool_file
from ..processes import ProcessTable
from ..secrets import SecretStore
from ..settings import Settings
from ..tenancy import current_tenant
from .bridge import Bridge
from .provision import Provisioner
from .records import Records
from .specs import LABEL_AGENT, LABEL_SPEC, LABEL_TENANT, request_labels, resolve_spec, spec_from_json, spec_to_json

__all__ = ["PoolMembers"]

log = structlog.get_logger(__name__)


class PoolMembers:
    """Starts, checks, claims and removes warm pool members; the pool's :class:`~sandboxd.pool.MemberFactory`.

    Args:
        backend: the container engine.
        settings: the daemon's settings (its pool size and pool file, and the defaults classes resolve with).
        processes: runs each new member's warm-up command.
        secrets: checks specs as :func:`resolve_spec` does.
        records: the workspaces' records (a claimed member's becomes the workspace's).
        bridge: the members' agent links.
        provisioner: starts members' containers.
    """

    def __init__(
        self,
        backend: Backend,
        settings: Settings,
        processes: ProcessTable,
        secrets: SecretStore,
        records: Records,
        bridge: Bridge,
        provisioner: Provisioner,
    ) -> None:
        """Wire the members' factory; the pool is set once it is made (:attr:`pool`)."""
        self.backend = backend
        self.settings = settings
        self.processes = processes
        self.secrets = secrets
        self.records = records
        self.bridge = bridge
        self.provisioner = provisioner
        self.pool: WarmPool | None = None
        """The warm pool whose members these are, once the daemon made it."""

    def resolve(self, spec: WorkspaceSpec) -> WorkspaceSpec:
        """A class's spec with every default applied, as a create's would be (:func:`resolve_spec`).

        Raises:
            InvalidSpecError: a field is out of range or malformed.
        """
        return resolve_spec(spec, self.settings, self.secrets, current_tenant())

    def pool_classes(self) -> list[PoolClass]:
        """The pool's classes from the settings: ``default`` (``pool_size`` of the default spec), then the pool file's.

        Raises:
            InvalidSpecError: the pool file is bad, a class's spec is out of range, or two classes
                share a name or a spec.
        """
        wanted = []
        if self.settings.pool_size > 0:
            wanted.append(("default", self.settings.pool_size, WorkspaceSpec(idle_ttl_s=0.0)))
        if self.settings.pool_file:
            wanted += read_pool_file(self.settings.pool_file)
        classes: list[PoolClass] = []
        for name, size, spec in wanted:
            try:
                resolved = self.resolve(spec)
            except InvalidSpecError as exc:
                msg = f"pool class {name!r}: {exc.message}"
                raise InvalidSpecError(msg) from None
            pool_class = PoolClass(name=name, size=size, spec=resolved)
            for other in classes:
                if other.name == name or other.key == pool_class.key:
                    msg = f"pool class {name!r} has the {'name' if other.name == name else 'spec'} of {other.name!r}"
                    raise InvalidSpecError(msg)
            classes.append(pool_class)
        return classes

    async def create_member(self, pool_class: PoolClass, member_id: str) -> ContainerInfo:
        """Start a pool member of ``pool_class``: a workspace of no tenant whose agent has answered.

        Raises:
            SandboxdError: as :meth:`Provisioner.start` does.
        """
        await self.provisioner.start(pool_class.spec, member_id, "", pool_class=pool_class.name)
        info = await self.backend.inspect_container(member_id)
        await self._warm_up(info)
        return info

    async def _warm_up(self, info: ContainerInfo) -> None:
        """Run one ``true`` in a new member, and forget it (the agent keeps no session of it).

        Its claimer's first command then costs what a second one does: the agent's first session
        and the login shell's first run in the container cost about 10 ms more here.
        """
        context = self.bridge.context_for(info)
        try:
            session, _started = await self.processes.start(context, ExecSpec(command="true", timeout_s=30.0))
        except SandboxdError as exc:
            log.info("pool.warm_up_failed", member=info.workspace_id, error=exc.message)
            return
        try:
            async for _event in session.events(yield_after_s=30.0):
                pass
        finally:
            self.processes.drop(session)
            await session.discard()

    async def member_is_fresh(self, info: ContainerInfo, pool_class: PoolClass) -> bool:
        """Whether a member an earlier run left can be handed out: same spec, current agent and image, untouched.

        Raises:
            SandboxdError: its agent cannot be reached.
        """
        stored = spec_from_json(info.labels[LABEL_SPEC])
        if not pool_class.spec.security.user:  # the member's was read from the image
            stored = dataclasses.replace(stored, security=dataclasses.replace(stored.security, user=""))
        if not info.running or stored != pool_class.spec:
            return False
        agent = self.provisioner.agent
        if agent is None or info.labels.get(LABEL_AGENT) != agent.tag:
            return False
        if await self.current_image_id(pool_class.spec.image) != info.image_id:
            return False
        welcome = await self.bridge.context_for(info).link.connect()
        return not welcome.sessions

    async def current_image_id(self, image: str) -> str | None:
        """The id of the image ``image`` names now; None if it is not on the engine."""
        found = await self.backend.image_info(image)
        return found.image_id if found is not None else None

    def member_answers(self, member_id: str) -> bool:
        """Whether a ready member's agent link is up."""
        record = self.records.get(member_id)
        return record is not None and record.context is not None and record.context.link.connected

    async def remove_member(self, member_id: str) -> None:
        """Remove a pool member (nothing if it is gone); its record goes with it."""
        record = self.records.drop(member_id)
        if record is not None and record.context is not None:
            await record.context.link.close()
        try:
            await self.backend.remove_container(member_id)
        except SandboxdError as exc:
            log.warning("pool.remove_failed", member=member_id, error=exc.message)

    async def claim(
        self,
        resolved: WorkspaceSpec,
        workspace_id: str,
        tenant: str,
        *,
        chosen: bool,
        request: tuple[str, str] | None,
    ) -> Workspace | None:
        """Make a ready pool member of ``resolved``'s class this workspace; None when there is none.

        What is the caller's alone is applied now: the id and tenant (recorded by the engine,
        ``Backend.claim_container``), env, labels, secrets and idle TTL (in the recorded spec,
        which every command reads), and the working directory (created as Docker creates a
        container's, root's and 0755, when the class's is another). A member that cannot be
        claimed is removed and the create goes on as a normal one.

        Args:
            resolved: the create's resolved spec.
            workspace_id: the id the member takes.
            tenant: the creating tenant.
            chosen: the caller chose the id (then one that exists is refused here).
            request: the create's request id and digest, for the labels; None without one.

        Raises:
            WorkspaceExistsError: the caller chose the id and a workspace of it exists.
        """
        pool = self.pool
        pool_class = pool.match(resolved) if pool is not None else None
        if pool is None or pool_class is None:
            return None
        if chosen:
            try:
                await self.backend.inspect_container(workspace_id)
            except WorkspaceNotFoundError:
                pass
            else:
                msg = f"workspace {workspace_id!r} already exists"
                raise WorkspaceExistsError(msg)
        member = self._take(pool, pool_class)
        if member is None:
            return None
        began = time.monotonic()
        member_spec = spec_from_json(member.labels[LABEL_SPEC])
        final = dataclasses.replace(
            resolved, security=dataclasses.replace(resolved.security, user=member_spec.security.user)
        )
        info = await self._apply(member, member_spec, final, workspace_id, tenant, request)
        if info is None:
            return None
        old = self.records.drop(member.workspace_id)
        context = old.context if old is not None else None
        link = context.link if context is not None and context.container_id == info.container_id else None
        if link is not None:
            link.workspace_id = workspace_id
        self.bridge.context_for(info, link=link)
        self.records.touch(workspace_id)
        log.info(
            "workspace.created",
            workspace_id=workspace_id,
            image=final.image,
            user=final.security.user,
            tenant=tenant,
            pool_class=pool_class.name,
            claim_s=round(time.monotonic() - began, 4),
        )
        return self.records.describe(info)

    def _take(self, pool: WarmPool, pool_class: PoolClass) -> ContainerInfo | None:
        """A ready member of the class whose agent answers; those that do not are removed."""
        member = pool.take(pool_class)
        while member is not None and not self.member_answers(member.workspace_id):
            # Its agent's link dropped since the last check (removed or killed behind our back).
            log.info("pool.member_dropped", member=member.workspace_id, reason="its agent does not answer")
            self.bridge.in_background(self.remove_member(member.workspace_id))
            member = pool.take(pool_class)
        return member

    async def _apply(
        self,
        member: ContainerInfo,
        member_spec: WorkspaceSpec,
        final: WorkspaceSpec,
        workspace_id: str,
        tenant: str,
        request: tuple[str, str] | None,
    ) -> ContainerInfo | None:
        """Give the member the caller's working directory, labels and id; None (it is removed) if that fails."""
        try:
            if final.working_dir != member_spec.working_dir:
                code, said = await self.backend.exec_run(
                    member.workspace_id,
                    [AGENT_PATH, "own", final.security.user, final.working_dir],
                    user="0:0",
                    container_id=member.container_id,
                )
                if code != 0:
                    msg = f"cannot make working directory {quoted(final.working_dir)}: {said[:200]!r}"
                    raise FailedPreconditionError(msg)  # noqa: TRY301 - one clean-up for every failure
            labels = {
                **final.labels,
                LABEL_SPEC: spec_to_json(final),
                LABEL_TENANT: tenant,
                LABEL_AGENT: member.labels[LABEL_AGENT],
                **request_labels(request),
            }
            return await self.backend.claim_container(member, workspace_id, labels)
        except SandboxdError as exc:
            log.warning("pool.claim_failed", member=member.workspace_id, workspace_id=workspace_id, error=exc.message)
            await self.remove_member(member.workspace_id)
            return None
        except BaseException:
            # Cancelled (the caller went away): the member, claimed or half claimed, is nobody's now.
            await asyncio.shield(self._discard(workspace_id, member.workspace_id))
            raise

    async def _discard(self, workspace_id: str, member_id: str) -> None:
        """Remove a workspace whose claim was cut short, and the member it was claiming."""
        await self.provisioner.discard(workspace_id)
        await self.remove_member(member_id)
