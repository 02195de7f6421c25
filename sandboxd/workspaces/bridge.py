"""The bridge from workspaces to their agents: exec contexts, agent links, and pausing and thawing.

Processes and files reach a workspace through its :class:`ExecContext` (:meth:`Bridge.exec_context`),
made once per container with the agent link it holds. A paused workspace is resumed before a
call that needs its processes (:meth:`Bridge.awake`), and its agent is told of every freeze and
thaw so that time frozen counts toward no command's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import posixpath
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog

from ..agent import AgentLink, Welcome
from ..audit import AuditLog
from ..backend.base import Backend, ContainerInfo
from ..egress import proxy_env
from ..errors import (
    FailedPreconditionError,
    SandboxdError,
    WorkspaceNotFoundError,
    WorkspaceNotRunningError,
)
from ..models import NetworkPolicy, WorkspaceSpec
from ..processes import ExecContext, ProcessTable
from ..secrets import SecretStore
from ..settings import Settings
from ..tenancy import DEFAULT_TENANT, current_tenant
from .records import Records
from .specs import (
    AGENT_SOCKET_DIR,
    AGENT_SOCKET_NAME,
    FALLBACK_USER,
    LABEL_AGENT,
    LABEL_RESTORED_FROM,
    LABEL_SPEC,
    LABEL_TENANT,
    check_workspace_id,
    owned,
    spec_from_json,
)

__all__ = ["Bridge"]

log = structlog.get_logger(__name__)


class Bridge:
    """Makes and keeps each workspace's exec context and agent link; pauses, thaws and wakes workspaces.

    Args:
        backend: the container engine (inspect, pause, resume; the agent links' transport).
        settings: the daemon's settings (``agent_transport``).
        processes: the process table, which adopts the sessions an agent kept.
        secrets: resolves ``secret:NAME`` values of the commands' env.
        records: the workspaces' records, where each context is kept.
    """

    def __init__(
        self,
        backend: Backend,
        settings: Settings,
        processes: ProcessTable,
        secrets: SecretStore,
        records: Records,
    ) -> None:
        """Wire the bridge."""
        self.backend = backend
        self.settings = settings
        self.processes = processes
        self.secrets = secrets
        self.records = records
        self.audit: AuditLog | None = None
        """Where adopted sessions are recorded."""
        self._host_sockets: set[str] = set()
        """Runtimes whose agents answered on their host socket (:class:`AgentLink`)."""
        self._background: set[asyncio.Task[None]] = set()

    def in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` on its own, held until it ends (an unheld task may be collected midway)."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def exec_context(self, workspace_id: str) -> ExecContext:
        """Return what a process needs to run in the workspace.

        A paused workspace is resumed first (:meth:`awake`).

        Raises:
            WorkspaceNotFoundError: no such workspace.
            WorkspaceNotRunningError: its container is not running.
            FailedPreconditionError: the workspace predates the agent (recreate it), or it is
                paused with ``auto_resume`` off.
        """
        record = self.records.get(workspace_id)
        if record is not None and record.removing:
            msg = f"workspace {workspace_id!r} not found"  # being removed: no new link to it
            raise WorkspaceNotFoundError(msg)
        context = record.context if record is not None else None
        if context is None:
            check_workspace_id(workspace_id)
            info = owned(await self.backend.inspect_container(workspace_id), current_tenant())
            if info.paused:
                self.records.note_paused(info)
            elif not info.running:
                msg = f"workspace {workspace_id!r} is not running"
                raise WorkspaceNotRunningError(msg)
            context = self.context_for(info)
        if context.tenant != current_tenant():
            msg = f"workspace {workspace_id!r} not found"
            raise WorkspaceNotFoundError(msg)
        await self.awake(workspace_id)
        record = self.records.get(workspace_id)
        if record is None or record.removing:
            msg = f"workspace {workspace_id!r} not found"  # removed while this call waited for it
            raise WorkspaceNotFoundError(msg)
        self.records.touch(workspace_id)
        return context

    def context_for(self, info: ContainerInfo, *, link: AgentLink | None = None) -> ExecContext:
        """The workspace's context and agent link, made once per container (``link``: an open one to keep).

        Raises:
            FailedPreconditionError: the workspace predates the agent.
        """
        record = self.records.seen(info)
        context = record.context
        if context is not None and context.container_id == info.container_id:
            return context
        if LABEL_AGENT not in info.labels:
            msg = (
                f"workspace {info.workspace_id!r} was created by an older sandboxd, without the in-container "
                "agent; its files are in its volume: copy out what you need, delete it and create it again"
            )
            raise FailedPreconditionError(msg)
        spec = spec_from_json(info.labels[LABEL_SPEC])
        socket_dir = info.mounts.get(AGENT_SOCKET_DIR, "") if self.settings.agent_transport == "auto" else ""
        link = link or AgentLink(
            self.backend,
            info.workspace_id,
            info.container_id,
            socket_path=posixpath.join(socket_dir, AGENT_SOCKET_NAME) if socket_dir else "",
            runtime=info.runtime,
            host_sockets=self._host_sockets,
        )
        context = ExecContext(
            workspace_id=info.workspace_id,
            user=spec.security.user or FALLBACK_USER,
            working_dir=spec.working_dir,
            memory_limit_bytes=spec.limits.memory_bytes,
            link=link,
            os=info.os,
            env=self.env(info.workspace_id, spec),
            tenant=info.labels.get(LABEL_TENANT, DEFAULT_TENANT),
            secrets=self.secrets,
            container_id=info.container_id,
            capabilities=spec.security.added_capabilities,
            root_capabilities=spec.security.root_capabilities,
        )
        source, _, source_container = info.labels.get(LABEL_RESTORED_FROM, "").partition(" ")
        origin = (source, source_container) if source and source_container else None
        link.on_welcome = functools.partial(self._adopt_sessions, context, origin)
        record.context = context
        return context

    async def forget_context(self, workspace_id: str) -> None:
        """Close the workspace's agent link and forget its context (its record stays)."""
        record = self.records.get(workspace_id)
        if record is not None and (context := record.context) is not None:
            record.context = None
            await context.link.close()

    async def close(self) -> None:
        """Close every agent link (the daemon stops; the agents keep their sessions)."""
        for record in self.records:
            await self.forget_context(record.workspace_id)

    def env(self, workspace_id: str, spec: WorkspaceSpec) -> dict[str, str]:
        """The workspace's env for its commands: an ALLOWLIST workspace's also points at its proxy."""
        record = self.records.get(workspace_id)
        now = record.network if record is not None and record.network is not None else (spec.network,)
        if now[0] is NetworkPolicy.ALLOWLIST:
            return {**proxy_env(), **spec.env}
        return dict(spec.env)

    def _adopt_sessions(self, context: ExecContext, origin: tuple[str, str] | None, welcome: Welcome) -> None:
        """Every new connection: take over the sessions the agent holds that this daemon does not follow.

        ``origin``: the source of a workspace restored from a memory snapshot, whose sessions
        become this one's (:meth:`ProcessTable.adopt`).

        An agent still frozen in a workspace that is not paused (it was resumed while no daemon
        was connected, or a thaw was lost) has its timers restarted.
        """
        if welcome.frozen and not self.records.is_paused(context.workspace_id):
            self.in_background(self._restart_timers(context))
        for process_id in self.processes.adopt(context, welcome, origin):
            if self.audit is not None:
                self.audit.event(
                    "process.adopted",
                    workspace_id=context.workspace_id,
                    process_id=process_id,
                    tenant=context.tenant,
                    reason="the workspace's agent kept it while no daemon was connected",
                )

    async def _restart_timers(self, context: ExecContext) -> None:
        try:
            await context.link.freeze(False)
        except SandboxdError as exc:
            log.warning("workspace.thaw_failed", workspace_id=context.workspace_id, error=exc.message)
        else:
            log.info("workspace.timers_restarted", workspace_id=context.workspace_id)

    async def pause(self, info: ContainerInfo) -> None:
        """Pause the workspace of ``info`` (its id lock is held): its agent is frozen first.

        Raises:
            FailedPreconditionError: it is paused already.
            WorkspaceNotRunningError: it does not run.
        """
        workspace_id = info.workspace_id
        if info.paused:
            msg = f"workspace {workspace_id!r} is already paused"
            raise FailedPreconditionError(msg)
        if not info.running:
            msg = f"workspace {workspace_id!r} is not running, so it cannot be paused"
            raise WorkspaceNotRunningError(msg)
        context = self.context_for(info)
        # Known as paused from before the freeze: a call that comes meanwhile waits for the
        # pause, then resumes it; a new connection's frozen agent is not thawed behind it.
        self.records.note_paused(info)
        try:
            try:
                await context.link.freeze(True)
            except SandboxdError as exc:
                log.warning("workspace.freeze_failed", workspace_id=workspace_id, error=exc.message)
            await self.backend.pause_container(workspace_id)
        except BaseException:
            self.records.not_paused(workspace_id)
            with contextlib.suppress(SandboxdError):
                await asyncio.shield(context.link.freeze(False))
            raise
        self.records.touch(workspace_id)

    def freezer(self, info: ContainerInfo) -> Callable[[bool], Awaitable[None]] | None:
        """What tells the agent of ``info`` that its container stands frozen a moment (a snapshot's commit).

        So that the time counts toward no command's timeout. None when it is paused already
        (its agent is frozen, and cannot answer) or predates the agent.
        """
        if info.paused or not info.running or LABEL_AGENT not in info.labels:
            return None
        link = self.context_for(info).link

        async def tell(frozen: bool) -> None:
            try:
                await link.freeze(frozen)
            except SandboxdError as exc:
                log.warning("workspace.freeze_failed", workspace_id=info.workspace_id, error=exc.message)

        return tell

    async def thaw(self, info: ContainerInfo) -> None:
        """Resume the container of ``info`` (its id lock is held), then restart its agent's timers."""
        await self.backend.resume_container(info.workspace_id)
        self.records.not_paused(info.workspace_id)
        # A paused workspace does not end; resumed, it has its whole lifetime again.
        self.records.set_end(info.workspace_id, spec_from_json(info.labels[LABEL_SPEC]).lifetime_s)
        self.records.touch(info.workspace_id)
        try:
            await self.context_for(info).link.freeze(False)
        except SandboxdError as exc:
            # Its next connection says it is frozen, and is thawed then (``_adopt_sessions``).
            log.warning("workspace.thaw_failed", workspace_id=info.workspace_id, error=exc.message)

    async def awake(self, workspace_id: str) -> None:
        """Before a call that needs the workspace's processes: resume it if it is paused.

        Raises:
            FailedPreconditionError: it is paused and its ``auto_resume`` is off.
        """
        record = self.records.get(workspace_id)
        if record is None or not record.paused:
            return
        if not record.auto_resume:
            msg = f"workspace {workspace_id!r} is paused (ResumeWorkspace resumes it; its auto_resume is off)"
            raise FailedPreconditionError(msg)
        async with self.records.lock(workspace_id):
            await self.awake_locked(workspace_id)

    async def awake_locked(self, workspace_id: str) -> None:
        """:meth:`awake` for a caller that holds the workspace's lock already (it is not reentrant).

        Raises:
            FailedPreconditionError: it is paused and its ``auto_resume`` is off.
        """
        record = self.records.get(workspace_id)
        if record is None or not record.paused:
            return  # never paused, or resumed by a call that went first
        if not record.auto_resume:
            msg = f"workspace {workspace_id!r} is paused (ResumeWorkspace resumes it; its auto_resume is off)"
            raise FailedPreconditionError(msg)
        info = await self.backend.inspect_container(workspace_id)
        if info.paused:
            await self.thaw(info)
            log.info("workspace.resumed", workspace_id=workspace_id, reason="auto_resume")
        else:
            self.records.not_paused(workspace_id)
