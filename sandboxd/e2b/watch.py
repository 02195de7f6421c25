"""envd's directory watches (``WatchDir``, ``CreateWatcher``/``GetWatcherEvents``/``RemoveWatcher``).

A watch here compares listings of the directory (``ListDir``, level by level when recursive):
a path that appears is CREATE (and WRITE when it has bytes already), one that goes is REMOVE,
a changed size or modification time is WRITE, a changed mode alone is CHMOD. A rename is a
REMOVE and a CREATE. ``GetWatcherEvents`` lists the directory when it is called, so a change
made before the call is in its answer; the ``WatchDir`` stream lists it every quarter second
(a file made and removed between two listings is not seen).
Names are relative to the watched directory, as envd gives them.

Bounds: 16 levels and 10,000 entries a listing, 16 watchers a sandbox and 1,024 in all; a
watcher nobody has asked for events for 10 minutes is dropped.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import posixpath
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from sandboxd_protocol.v1 import file_service_pb2 as fpb

from .entries import entry_info
from .envd.filesystem import filesystem_pb as efs
from .gateway import Caller, Gateway, connect_error, oneof

__all__ = ["Watchers"]

_MAX_DEPTH = 16
_MAX_ENTRIES = 10_000
_PER_SANDBOX = 16
_IN_ALL = 1024
_FORGOTTEN_S = 600.0
_POLL_S = 0.25
_KEEPALIVE_S = 30.0

# What a listing remembers of an entry: enough to tell a write from a chmod.
_State = tuple[int, int, int, int]


def _state(info: fpb.FileInfo) -> _State:
    return (info.type, info.size_bytes, info.modify_time.ToNanoseconds(), info.mode)


@dataclasses.dataclass
class _Watch:
    """One watched directory and its last listing."""

    workspace_id: str
    caller: Caller
    path: str
    recursive: bool
    include_entry: bool
    seen: dict[str, tuple[_State, fpb.FileInfo]] = dataclasses.field(default_factory=dict)
    asked: float = dataclasses.field(default_factory=time.monotonic)

    async def listing(self, gateway: Gateway) -> dict[str, tuple[_State, fpb.FileInfo]]:
        """The directory's entries now, by path relative to it.

        Raises:
            ConnectError: NOT_FOUND for a directory that is not there; RESOURCE_EXHAUSTED past the bounds.
        """
        found: dict[str, tuple[_State, fpb.FileInfo]] = {}
        level, depth = [self.path], 0
        while level:
            depth += 1
            below = []
            for directory in level:
                try:
                    listed = await gateway.files.ListDir(
                        fpb.ListDirRequest(workspace_id=self.workspace_id, path=directory),
                        metadata=self.caller.metadata(),
                    )
                except grpc.aio.AioRpcError as exc:
                    if directory != self.path and exc.code() == grpc.StatusCode.NOT_FOUND:
                        continue  # went between the listings: its parent's REMOVE says so
                    raise connect_error(exc) from None
                root = listed.path if directory == self.path else None
                if root is not None:
                    self.path = root  # resolved once: names are relative to it
                for info in listed.entries:
                    found[posixpath.relpath(info.path, self.path)] = (_state(info), info)
                    if self.recursive and info.type == fpb.FILE_TYPE_DIRECTORY and depth < _MAX_DEPTH:
                        below.append(info.path)
                if len(found) > _MAX_ENTRIES:
                    raise ConnectError(
                        Code.RESOURCE_EXHAUSTED, f"{self.path} holds more than {_MAX_ENTRIES} entries to watch"
                    )
            level = below
        return found

    def _event(self, name: str, kind: efs.EventType, info: fpb.FileInfo | None) -> efs.FilesystemEvent:
        entry = entry_info(info) if self.include_entry and info is not None else None
        return efs.FilesystemEvent(name=name, type=kind, entry=entry)

    async def changes(self, gateway: Gateway) -> list[efs.FilesystemEvent]:
        """What changed since the last listing, in name order (removals last)."""
        now = await self.listing(gateway)
        events: list[efs.FilesystemEvent] = []
        for name, (state, info) in sorted(now.items()):
            before = self.seen.get(name)
            if before is None:
                events.append(self._event(name, efs.EventType.CREATE, info))
                if info.type == fpb.FILE_TYPE_FILE and info.size_bytes:
                    events.append(self._event(name, efs.EventType.WRITE, info))
            elif before[0][:3] != state[:3] and info.type != fpb.FILE_TYPE_DIRECTORY:
                # A directory's own size and time change with its entries: those have events.
                events.append(self._event(name, efs.EventType.WRITE, info))
            elif before[0][3] != state[3]:
                events.append(self._event(name, efs.EventType.CHMOD, info))
        events += [self._event(name, efs.EventType.REMOVE, None) for name in sorted(self.seen.keys() - now.keys())]
        self.seen = now
        return events


class Watchers:
    """The watches of the E2B plane: the polled ones by id, and the streams."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._watches: dict[str, _Watch] = {}
        # Streams and watches being started, by sandbox: counted as soon as asked for, so that
        # calls at once cannot all pass the bound before any of them is counted.
        self._starting: collections.Counter[str] = collections.Counter()
        self._streams: collections.Counter[str] = collections.Counter()

    def _room(self, workspace_id: str) -> None:
        now = time.monotonic()
        for watch_id, watch in list(self._watches.items()):
            if now - watch.asked > _FORGOTTEN_S:
                del self._watches[watch_id]
        mine = sum(1 for w in self._watches.values() if w.workspace_id == workspace_id)
        mine += self._streams[workspace_id] + self._starting[workspace_id]
        in_all = len(self._watches) + self._streams.total() + self._starting.total()
        if mine >= _PER_SANDBOX or in_all >= _IN_ALL:
            raise ConnectError(Code.RESOURCE_EXHAUSTED, "too many directory watches; stop one first")

    async def _start(self, workspace_id: str, caller: Caller, request: Any) -> _Watch:
        watch = _Watch(
            workspace_id=workspace_id,
            caller=caller,
            path=await self.gateway.resolve(workspace_id, caller, request.path),
            recursive=request.recursive,
            include_entry=request.include_entry,
        )
        watch.seen = await watch.listing(self.gateway)
        return watch

    async def create(self, workspace_id: str, caller: Caller, request: efs.CreateWatcherRequest) -> str:
        """Start a polled watch; its id."""
        self._room(workspace_id)
        self._starting[workspace_id] += 1
        try:
            watch = await self._start(workspace_id, caller, request)
        finally:
            self._starting[workspace_id] -= 1
            if not self._starting[workspace_id]:
                del self._starting[workspace_id]
        watch_id = f"w-{secrets.token_hex(8)}"
        self._watches[watch_id] = watch
        return watch_id

    def _get(self, watch_id: str, caller: Caller) -> _Watch:
        watch = self._watches.get(watch_id)
        if watch is None or not secrets.compare_digest(watch.caller.token, caller.token):
            raise ConnectError(Code.NOT_FOUND, f"watcher {watch_id!r} not found")
        return watch

    async def events(self, watch_id: str, caller: Caller) -> list[efs.FilesystemEvent]:
        """What changed since the last call (or the start)."""
        watch = self._get(watch_id, caller)
        watch.asked = time.monotonic()
        return await watch.changes(self.gateway)

    def remove(self, watch_id: str, caller: Caller) -> None:
        """Stop a polled watch."""
        self._get(watch_id, caller)
        del self._watches[watch_id]

    async def stream(
        self, workspace_id: str, caller: Caller, request: efs.WatchDirRequest
    ) -> AsyncIterator[efs.WatchDirResponse]:
        """``start``, then each change as it is seen, with a keepalive now and then."""
        self._room(workspace_id)
        self._streams[workspace_id] += 1
        try:
            watch = await self._start(workspace_id, caller, request)
            yield efs.WatchDirResponse(event=oneof("start", efs.WatchDirResponse.StartEvent()))
            quiet_since = time.monotonic()
            while True:
                await asyncio.sleep(_POLL_S)
                for event in await watch.changes(self.gateway):
                    yield efs.WatchDirResponse(event=oneof("filesystem", event))
                    quiet_since = time.monotonic()
                if time.monotonic() - quiet_since > _KEEPALIVE_S:
                    yield efs.WatchDirResponse(event=oneof("keepalive", efs.WatchDirResponse.KeepAlive()))
                    quiet_since = time.monotonic()
        finally:
            self._streams[workspace_id] -= 1
            if not self._streams[workspace_id]:
                del self._streams[workspace_id]
