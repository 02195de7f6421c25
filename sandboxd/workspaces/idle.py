"""The idle reaper: a workspace idle past its TTL, or at its lifetime's end, is removed or paused (``idle_action``)."""

from __future__ import annotations

import time
from collections.abc import Mapping

import structlog

from ..audit import AuditLog
from ..backend.base import Backend
from ..errors import FailedPreconditionError, WorkspaceNotFoundError
from ..models import IdleAction
from ..processes import ProcessTable
from ..tenancy import DEFAULT_TENANT
from .bridge import Bridge
from .records import Records, Teardown
from .specs import LABEL_SPEC, LABEL_TENANT, spec_from_json

__all__ = ["IdleReaper"]

log = structlog.get_logger(__name__)


class IdleReaper:
    """Finds workspaces idle past their TTL and removes or pauses them.

    Idle: no call in flight, none for its TTL, no running command. A workspace no call has
    touched since the daemon started counts from the start.

    Args:
        backend: the container engine (one listing of the labels per look).
        processes: the sessions, whose last use and running state count.
        records: the calls in flight and last use of each workspace.
        bridge: pauses a workspace whose ``idle_action`` says so.
        teardown: removes a workspace whose ``idle_action`` is delete.
    """

    def __init__(
        self, backend: Backend, processes: ProcessTable, records: Records, bridge: Bridge, teardown: Teardown
    ) -> None:
        """Wire the reaper; idleness counts from now for workspaces not used since."""
        self.backend = backend
        self.processes = processes
        self.records = records
        self.bridge = bridge
        self._teardown = teardown
        self._started = time.monotonic()

    async def reap(self, audit: AuditLog | None = None) -> list[str]:
        """Remove or pause (its ``idle_action``) every workspace idle past its TTL.

        Idleness is looked at again under the workspace's lock: a call that held it (a long
        snapshot) or began while the reaper waited for it restarts the TTL.

        Returns:
            The ids removed or paused.
        """
        removed = []
        # Every second: one listing, no per-container inspect.
        for workspace_id, labels in (await self.backend.container_labels()).items():
            if not labels.get(LABEL_SPEC):
                continue
            spec = spec_from_json(labels[LABEL_SPEC])
            if self.records.ended(workspace_id):
                if await self._end(workspace_id, spec.idle_action, labels, audit):
                    removed.append(workspace_id)
                continue
            ttl = spec.idle_ttl_s or 0
            if not self._idle(workspace_id, ttl):
                continue
            if spec.idle_action is IdleAction.PAUSE:
                if self.records.is_paused(workspace_id) or not await self._pause_idle(workspace_id, ttl, audit):
                    continue
                removed.append(workspace_id)
                continue
            try:
                async with self.records.lock(workspace_id):
                    if not self._idle(workspace_id, ttl):
                        continue  # used while the reaper waited for it
                    await self._teardown(workspace_id, f"its workspace was idle for {ttl:g} s and was removed")
            except WorkspaceNotFoundError:
                continue  # deleted meanwhile: not reaped
            removed.append(workspace_id)
            tenant = labels.get(LABEL_TENANT, DEFAULT_TENANT)
            log.info("workspace.reaped", workspace_id=workspace_id, idle_ttl_s=ttl, tenant=tenant)
            if audit is not None:
                audit.event("workspace.reaped", workspace_id=workspace_id, tenant=tenant, reason=f"idle for {ttl:g} s")
        return removed

    async def _end(
        self, workspace_id: str, action: IdleAction | None, labels: Mapping[str, str], audit: AuditLog | None
    ) -> bool:
        """End a workspace whose lifetime is over, busy or not, as ``action`` says; whether it was."""
        tenant = labels.get(LABEL_TENANT, DEFAULT_TENANT)
        try:
            async with self.records.lock(workspace_id):
                if not self.records.ended(workspace_id):
                    return False  # its lifetime was moved while the reaper waited for it
                if action is IdleAction.PAUSE:
                    info = await self.backend.inspect_container(workspace_id)
                    if not info.running:
                        return False
                    await self.bridge.pause(info)
                else:
                    await self._teardown(workspace_id, "its workspace's lifetime ended and it was removed")
        except (WorkspaceNotFoundError, FailedPreconditionError):
            return False  # deleted, paused or stopped meanwhile
        done = "paused" if action is IdleAction.PAUSE else "removed"
        log.info("workspace.lifetime_ended", workspace_id=workspace_id, tenant=tenant, action=done)
        if audit is not None:
            event = "workspace.paused" if action is IdleAction.PAUSE else "workspace.reaped"
            audit.event(event, workspace_id=workspace_id, tenant=tenant, reason="its lifetime ended")
        return True

    def _idle(self, workspace_id: str, ttl: float) -> bool:
        """Whether the workspace is idle past ``ttl`` now: no call in flight, none for ``ttl``, no running command."""
        record = self.records.get(workspace_id)
        if ttl <= 0 or (record is not None and record.busy):
            return False
        sessions = self.processes.list(workspace_id)
        if any(s.running for s in sessions):
            return False
        used = record.last_used if record is not None and record.last_used is not None else self._started
        return time.monotonic() - max([used, *(s.last_used for s in sessions)]) >= ttl

    async def _pause_idle(self, workspace_id: str, ttl: float, audit: AuditLog | None) -> bool:
        """Pause a workspace idle for ``ttl`` (looked at again under its lock); whether it was paused now."""
        try:
            async with self.records.lock(workspace_id):
                if not self._idle(workspace_id, ttl):
                    return False  # used while the reaper waited for it
                info = await self.backend.inspect_container(workspace_id)
                if not info.running:
                    if info.paused:
                        self.records.note_paused(info)
                    return False
                await self.bridge.pause(info)
        except (WorkspaceNotFoundError, FailedPreconditionError):
            return False  # deleted, paused or stopped meanwhile
        tenant = info.labels.get(LABEL_TENANT, DEFAULT_TENANT)
        log.info("workspace.paused", workspace_id=workspace_id, idle_ttl_s=ttl, tenant=tenant, reason="idle")
        if audit is not None:
            audit.event("workspace.paused", workspace_id=workspace_id, tenant=tenant, reason=f"idle for {ttl:g} s")
        return True
