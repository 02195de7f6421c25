"""The daemon's memory of each workspace: one :class:`WorkspaceRecord` per id, in one :class:`Records`.

The engine keeps what a workspace is (its labels); a record keeps what only this daemon knows
of it while it runs: its agent link, when it was last used, the calls in flight, whether it is
paused, its network policy now, and the create request that made it. A record is made in one
place (:meth:`Records.open`) and goes in one (:meth:`Records.drop`), so a workspace that goes
leaves nothing behind in the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from ..backend.base import ContainerInfo
from ..models import EgressRule, NetworkPolicy, Workspace, WorkspaceState
from ..processes import ExecContext
from ..tenancy import DEFAULT_TENANT
from .specs import LABEL_SNAPSHOT, LABEL_SPEC, LABEL_TENANT, spec_from_json

__all__ = ["Records", "Teardown", "WorkspaceRecord"]

Teardown = Callable[[str, str], Awaitable[None]]
"""Removes a workspace, its id lock held, telling its sessions why (``WorkspaceManager``'s one teardown).
Raises WorkspaceNotFoundError when nothing of it was left."""


@dataclasses.dataclass(eq=False)
class WorkspaceRecord:
    """What the daemon holds in memory for one workspace (or warm pool member)."""

    workspace_id: str
    tenant: str | None = None
    """Its tenant, from its labels; None until the daemon saw its container (:meth:`Records.seen`)."""
    forked: bool = False
    """Made from a snapshot (whose image, if the snapshot was deleted, was kept for it)."""
    context: ExecContext | None = None
    """What its commands run with, and its agent link; None until a call or an adoption needs it."""
    last_used: float | None = None
    """``time.monotonic()`` of the last call on it, in seconds; None: none since the daemon started."""
    busy: int = 0
    """Calls on it in flight: the idle reaper leaves it alone while any runs."""
    paused: bool = False
    """Known to be paused (from before the freeze, so that a call meanwhile waits for the pause)."""
    auto_resume: bool = True
    """While paused: whether a call may resume it (its spec's ``auto_resume``)."""
    network: tuple[NetworkPolicy, tuple[EgressRule, ...]] | None = None
    """Its network policy and rules now (UpdateNetwork changes them; its spec label keeps the first);
    None: not known yet."""
    made_for: tuple[str, str] | None = None
    """``(tenant, request_id)`` of the create that made it, if it had a request id."""
    removing: bool = False
    """Its teardown has begun: a call that comes meanwhile finds it gone (and makes it no new link)."""
    ends_at: float | None = None
    """``time.time()`` at which its lifetime ends (its idle action then); None: no end."""


class Records:
    """Every workspace's record, by id, and the lock that serialises each id's life cycle."""

    def __init__(self) -> None:
        """Start with no records."""
        self._records: dict[str, WorkspaceRecord] = {}
        self._by_request: dict[tuple[str, str], str] = {}
        """``(tenant, request_id)`` -> the workspace that create made (from the labels at adoption, then
        kept as creates complete); an entry whose workspace went behind the daemon's back is dropped
        when it is next looked up (:meth:`forget_request`)."""
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def get(self, workspace_id: str) -> WorkspaceRecord | None:
        """The workspace's record, if the daemon has one."""
        return self._records.get(workspace_id)

    def open(self, workspace_id: str) -> WorkspaceRecord:
        """The workspace's record, made now if it has none: the one place a record is made."""
        record = self._records.get(workspace_id)
        if record is None:
            record = self._records[workspace_id] = WorkspaceRecord(workspace_id)
        return record

    def seen(self, info: ContainerInfo) -> WorkspaceRecord:
        """The record of ``info``'s workspace, with the tenant and origin its labels give."""
        record = self.open(info.workspace_id)
        record.tenant = info.labels.get(LABEL_TENANT, DEFAULT_TENANT)
        record.forked = bool(info.labels.get(LABEL_SNAPSHOT))
        return record

    def drop(self, workspace_id: str) -> WorkspaceRecord | None:
        """Forget the workspace (it went): the one place a record goes. Returns it, for its teardown."""
        record = self._records.pop(workspace_id, None)
        if record is not None and record.made_for is not None:
            self._by_request.pop(record.made_for, None)
        return record

    def __iter__(self) -> Iterator[WorkspaceRecord]:
        """Every record (a copy of the list: records may come and go meanwhile)."""
        return iter(list(self._records.values()))

    def made_by(self, key: tuple[str, str]) -> str:
        """The id of the workspace the create of ``key`` (tenant, request id) made; "" if none is known."""
        return self._by_request.get(key, "")

    def note_made(self, key: tuple[str, str], workspace_id: str) -> None:
        """Remember that the create of ``key`` (tenant, request id) made ``workspace_id``."""
        self.open(workspace_id).made_for = key
        self._by_request[key] = workspace_id

    def forget_request(self, key: tuple[str, str]) -> None:
        """Forget what the create of ``key`` made (its workspace was removed behind the daemon's back)."""
        workspace_id = self._by_request.pop(key, "")
        if (record := self._records.get(workspace_id)) is not None and record.made_for == key:
            record.made_for = None

    def lock(self, workspace_id: str) -> asyncio.Lock:
        """The lock that serialises creating, deleting, pausing, resuming and snapshotting one id.

        Concurrent deletes: one removes, the rest find nothing. Held weakly: an id nobody waits on
        keeps no lock.
        """
        lock = self._locks.get(workspace_id)
        if lock is None:
            lock = self._locks[workspace_id] = asyncio.Lock()
        return lock

    def touch(self, workspace_id: str) -> None:
        """Note a call on the workspace (its idle TTL starts again)."""
        self.open(workspace_id).last_used = time.monotonic()

    @contextlib.asynccontextmanager
    async def in_use(self, workspace_id: str) -> AsyncIterator[None]:
        """Mark a call on the workspace as in flight: the idle reaper leaves it alone until it ends."""
        record = self.open(workspace_id)
        record.busy += 1
        try:
            yield
        finally:
            record.busy -= 1
            if self._records.get(workspace_id) is record:  # a workspace removed meanwhile gets no new record
                record.last_used = time.monotonic()

    def note_paused(self, info: ContainerInfo) -> None:
        """Remember ``info``'s workspace as paused, with whether a call may resume it (its spec says)."""
        record = self.open(info.workspace_id)
        record.paused = True
        record.auto_resume = spec_from_json(info.labels[LABEL_SPEC]).auto_resume is not False

    def is_paused(self, workspace_id: str) -> bool:
        """Whether the daemon knows the workspace as paused."""
        record = self._records.get(workspace_id)
        return record is not None and record.paused

    def not_paused(self, workspace_id: str) -> None:
        """Forget that the workspace was paused (it was resumed, or the pause failed)."""
        if (record := self._records.get(workspace_id)) is not None:
            record.paused = False

    def set_end(self, workspace_id: str, lifetime_s: float | None) -> None:
        """End the workspace ``lifetime_s`` seconds from now (None or 0: never)."""
        self.open(workspace_id).ends_at = time.time() + lifetime_s if lifetime_s else None

    def ended(self, workspace_id: str) -> bool:
        """Whether the workspace's lifetime is over (a paused one's never is: it ends no further)."""
        record = self._records.get(workspace_id)
        return record is not None and not record.paused and record.ends_at is not None and time.time() >= record.ends_at

    def describe_end(self, workspace_id: str) -> datetime.datetime | None:
        """When the workspace's lifetime ends, as a time; None: no end."""
        record = self._records.get(workspace_id)
        if record is None or record.ends_at is None or record.paused:
            return None
        return datetime.datetime.fromtimestamp(record.ends_at, datetime.UTC)

    def describe(self, info: ContainerInfo) -> Workspace:
        """The workspace of ``info`` as callers see it: its stored spec, with its network policy now."""
        spec = spec_from_json(info.labels[LABEL_SPEC])
        record = self._records.get(info.workspace_id)
        if record is not None and (now := record.network) is not None:
            spec = dataclasses.replace(spec, network=now[0], allowed_hosts=now[1])
        state = WorkspaceState.RUNNING if info.running else WorkspaceState.STOPPED
        return Workspace(
            workspace_id=info.workspace_id,
            spec=spec,
            from_snapshot=info.labels.get(LABEL_SNAPSHOT, ""),
            state=WorkspaceState.PAUSED if info.paused else state,
            create_time=info.create_time,
            container_id=info.container_id,
            volume_name=info.volume_name,
            expire_time=None if info.paused else self.describe_end(info.workspace_id),
        )
