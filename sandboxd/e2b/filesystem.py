"""envd's ``filesystem.Filesystem`` service on sandboxd's FileService.

Paths mean what they mean to sandboxd: relative ones resolve against ``/workspace``. File
operations run as the workspace's user whatever ``user`` the SDK names (sandboxd's file service
has no other); commands do run as the named user.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from sandboxd_protocol.v1 import file_service_pb2 as fpb

from .entries import entry_info
from .envd.filesystem import filesystem_pb as efs
from .envd.filesystem.filesystem_connect import Filesystem
from .gateway import Caller, Gateway, caller_from_headers, connect_error, mapped_errors
from .process import sandbox_id
from .tarstream import empty_archive
from .watch import Watchers

if TYPE_CHECKING:
    from connectrpc.request import RequestContext

    Ctx = RequestContext[Any, Any]

__all__ = ["FilesystemService"]

# ListDir's depth is bounded: each level is one call per directory.
_MAX_DEPTH = 16
_MAX_ENTRIES = 100_000


class FilesystemService(Filesystem):
    """The ``filesystem.Filesystem`` Connect service (see the module docstring)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.watchers = Watchers(gateway)

    def watch_dir(self, request: efs.WatchDirRequest, ctx: Ctx, /) -> AsyncIterator[efs.WatchDirResponse]:
        """Stream a directory's changes (see :mod:`.watch`)."""
        workspace_id, caller = self._who(ctx)
        return self.watchers.stream(workspace_id, caller, request)

    async def create_watcher(self, request: efs.CreateWatcherRequest, ctx: Ctx, /) -> efs.CreateWatcherResponse:
        """Start watching a directory; its changes are asked for with GetWatcherEvents."""
        workspace_id, caller = self._who(ctx)
        return efs.CreateWatcherResponse(watcher_id=await self.watchers.create(workspace_id, caller, request))

    async def get_watcher_events(
        self, request: efs.GetWatcherEventsRequest, ctx: Ctx, /
    ) -> efs.GetWatcherEventsResponse:
        """The changes since the last call (listed now: a change made before the call is in it)."""
        caller = caller_from_headers(ctx.request_headers)
        return efs.GetWatcherEventsResponse(events=await self.watchers.events(request.watcher_id, caller))

    async def remove_watcher(self, request: efs.RemoveWatcherRequest, ctx: Ctx, /) -> efs.RemoveWatcherResponse:
        """Stop a watcher."""
        self.watchers.remove(request.watcher_id, caller_from_headers(ctx.request_headers))
        return efs.RemoveWatcherResponse()

    def _who(self, ctx: Ctx) -> tuple[str, Caller]:
        return sandbox_id(ctx), caller_from_headers(ctx.request_headers)

    async def _stat(self, workspace_id: str, caller: Caller, path: str) -> efs.EntryInfo:
        with mapped_errors():
            info = (
                await self.gateway.files.Stat(
                    fpb.StatRequest(workspace_id=workspace_id, path=path), metadata=caller.metadata()
                )
            ).info
        target = None
        if info.type == fpb.FILE_TYPE_SYMLINK:
            with contextlib.suppress(grpc.aio.AioRpcError):  # a dangling link is still a link
                target = (
                    await self.gateway.files.Stat(
                        fpb.StatRequest(workspace_id=workspace_id, path=path, follow_symlinks=True),
                        metadata=caller.metadata(),
                    )
                ).info
        return entry_info(info, target=target)

    async def stat(self, request: efs.StatRequest, ctx: Ctx, /) -> efs.StatResponse:
        """Describe a path (a final symlink as its target, marked as a link)."""
        workspace_id, caller = self._who(ctx)
        path = await self.gateway.resolve(workspace_id, caller, request.path)
        return efs.StatResponse(entry=await self._stat(workspace_id, caller, path))

    async def make_dir(self, request: efs.MakeDirRequest, ctx: Ctx, /) -> efs.MakeDirResponse:
        """Create a directory and its missing parents; ALREADY_EXISTS when the path exists."""
        workspace_id, caller = self._who(ctx)
        path = await self.gateway.resolve(workspace_id, caller, request.path)
        try:
            await self.gateway.files.Stat(
                fpb.StatRequest(workspace_id=workspace_id, path=path), metadata=caller.metadata()
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise connect_error(exc) from None
        else:
            raise ConnectError(Code.ALREADY_EXISTS, f"{path} exists already")

        async def archive() -> object:
            yield fpb.UploadRequest(target=fpb.UploadTarget(workspace_id=workspace_id, path=path))
            yield fpb.UploadRequest(chunk=empty_archive())

        with mapped_errors():
            await self.gateway.files.Upload(archive(), metadata=caller.metadata())
        return efs.MakeDirResponse(entry=await self._stat(workspace_id, caller, path))

    async def move(self, request: efs.MoveRequest, ctx: Ctx, /) -> efs.MoveResponse:
        """Rename a path (replacing a file at the destination, as rename(2) does)."""
        workspace_id, caller = self._who(ctx)
        with mapped_errors():
            moved = await self.gateway.files.Move(
                fpb.MoveRequest(
                    workspace_id=workspace_id,
                    source_path=await self.gateway.resolve(workspace_id, caller, request.source),
                    destination_path=await self.gateway.resolve(workspace_id, caller, request.destination),
                    overwrite=True,
                ),
                metadata=caller.metadata(),
            )
        return efs.MoveResponse(entry=await self._stat(workspace_id, caller, moved.path))

    async def remove(self, request: efs.RemoveRequest, ctx: Ctx, /) -> efs.RemoveResponse:
        """Remove a file, or a directory with everything below it; a path not there is no error (envd's)."""
        workspace_id, caller = self._who(ctx)
        try:
            await self.gateway.files.Remove(
                fpb.RemoveRequest(
                    workspace_id=workspace_id,
                    path=await self.gateway.resolve(workspace_id, caller, request.path),
                    recursive=True,
                ),
                metadata=caller.metadata(),
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise connect_error(exc) from None
            with mapped_errors():  # the sandbox's own NOT_FOUND stands; the path's does not
                await self.gateway.workspace(workspace_id, caller)
        return efs.RemoveResponse()

    async def list_dir(self, request: efs.ListDirRequest, ctx: Ctx, /) -> efs.ListDirResponse:
        """A directory's entries, and theirs down to ``depth`` levels (1: the directory's own).

        Depth first, each directory's entries by name, as envd walks them.
        """
        workspace_id, caller = self._who(ctx)
        depth = request.depth or 1
        if depth > _MAX_DEPTH:
            raise ConnectError(Code.INVALID_ARGUMENT, f"depth is at most {_MAX_DEPTH}, got {depth}")
        entries: list[efs.EntryInfo] = []

        async def walk(directory: str, levels: int) -> None:
            with mapped_errors():
                listed = await self.gateway.files.ListDir(
                    fpb.ListDirRequest(workspace_id=workspace_id, path=directory), metadata=caller.metadata()
                )
            for info in listed.entries:
                entries.append(entry_info(info))
                if len(entries) > _MAX_ENTRIES:
                    raise ConnectError(Code.RESOURCE_EXHAUSTED, f"more than {_MAX_ENTRIES} entries; ask for less depth")
                if info.type == fpb.FILE_TYPE_DIRECTORY and levels > 1:
                    await walk(info.path, levels - 1)

        await walk(await self.gateway.resolve(workspace_id, caller, request.path), depth)
        return efs.ListDirResponse(entries=entries)
