"""WorkspaceService servicer: proto in, domain call, proto out."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

from sandboxd_protocol.v1 import workspace_service_pb2 as wpb
from sandboxd_protocol.v1 import workspace_service_pb2_grpc as wgrpc

from ..errors import InvalidSpecError, SandboxdError
from ..processes import ProcessTable
from ..snapshots import SnapshotStore
from ..templates import Built, TemplateBuild, TemplateBuilder
from ..workspaces import WorkspaceManager
from . import convert
from ._types import Context

__all__ = ["WorkspaceServicer"]


class WorkspaceServicer(wgrpc.WorkspaceServiceServicer):
    """Serves ``sandboxd.v1.WorkspaceService``."""

    def __init__(
        self,
        workspaces: WorkspaceManager,
        snapshots: SnapshotStore | None = None,
        processes: ProcessTable | None = None,
    ) -> None:
        """Serve ``workspaces`` and their ``snapshots``; ``processes`` runs templates' start and ready commands."""
        self.workspaces = workspaces
        self.snapshots = snapshots or SnapshotStore(workspaces)
        self.templates = TemplateBuilder(self.snapshots)
        self.processes = processes

    async def CreateWorkspace(
        self, request: wpb.CreateWorkspaceRequest, context: Context
    ) -> wpb.CreateWorkspaceResponse:
        """Create and start a workspace (a fork of ``from_snapshot``; ``spec.image`` may name a template)."""
        spec = convert.workspace_spec(request.spec)
        snapshot = await self.snapshots.find(request.from_snapshot) if request.from_snapshot else None
        if snapshot is None and spec.image and (template := await self.templates.find(spec.image)) is not None:
            # A template of the caller's by name, as an image: it wins over an image of that name.
            snapshot, spec = template, dataclasses.replace(spec, image="")
        workspace = await self.workspaces.create(
            spec, workspace_id=request.workspace_id, request_id=request.request_id, snapshot=snapshot
        )
        if snapshot is not None and self.processes is not None:
            try:
                await self.templates.begin(workspace.workspace_id, snapshot, self.processes)
            except BaseException:
                # Handed out only once ready: one that never got there is not left behind.
                with contextlib.suppress(SandboxdError):
                    await asyncio.shield(self.workspaces.delete(workspace.workspace_id))
                raise
        return wpb.CreateWorkspaceResponse(workspace=convert.workspace_to_proto(workspace))

    async def GetWorkspace(self, request: wpb.GetWorkspaceRequest, context: Context) -> wpb.GetWorkspaceResponse:
        """Return one workspace."""
        workspace = await self.workspaces.get(request.workspace_id)
        return wpb.GetWorkspaceResponse(workspace=convert.workspace_to_proto(workspace))

    async def ListWorkspaces(self, request: wpb.ListWorkspacesRequest, context: Context) -> wpb.ListWorkspacesResponse:
        """One page of workspaces, optionally by label."""
        workspaces, next_page_token = await self.workspaces.list(
            dict(request.label_selector), page_size=request.page_size, page_token=request.page_token
        )
        return wpb.ListWorkspacesResponse(
            workspaces=[convert.workspace_to_proto(w) for w in workspaces], next_page_token=next_page_token
        )

    async def DeleteWorkspace(
        self, request: wpb.DeleteWorkspaceRequest, context: Context
    ) -> wpb.DeleteWorkspaceResponse:
        """Remove a workspace with its volume."""
        await self.workspaces.delete(request.workspace_id)
        return wpb.DeleteWorkspaceResponse(workspace_id=request.workspace_id)

    async def SetWorkspaceLifetime(
        self, request: wpb.SetWorkspaceLifetimeRequest, context: Context
    ) -> wpb.SetWorkspaceLifetimeResponse:
        """Move a workspace's end to ``lifetime`` from now (zero: never)."""
        lifetime_s = convert.duration_s(request.lifetime, "lifetime")
        workspace = await self.workspaces.set_lifetime(request.workspace_id, lifetime_s)
        return wpb.SetWorkspaceLifetimeResponse(workspace=convert.workspace_to_proto(workspace))

    async def PauseWorkspace(self, request: wpb.PauseWorkspaceRequest, context: Context) -> wpb.PauseWorkspaceResponse:
        """Freeze a workspace."""
        workspace = await self.workspaces.pause(request.workspace_id)
        return wpb.PauseWorkspaceResponse(workspace=convert.workspace_to_proto(workspace))

    async def ResumeWorkspace(
        self, request: wpb.ResumeWorkspaceRequest, context: Context
    ) -> wpb.ResumeWorkspaceResponse:
        """Thaw a paused workspace."""
        workspace = await self.workspaces.resume(request.workspace_id)
        return wpb.ResumeWorkspaceResponse(workspace=convert.workspace_to_proto(workspace))

    async def GetPool(self, request: wpb.GetPoolRequest, context: Context) -> wpb.GetPoolResponse:
        """The warm pool's classes and what each holds."""
        pool = self.workspaces.pool
        return wpb.GetPoolResponse(classes=[convert.pool_class_to_proto(s) for s in (pool.status() if pool else [])])

    async def SnapshotWorkspace(
        self, request: wpb.SnapshotWorkspaceRequest, context: Context
    ) -> wpb.SnapshotWorkspaceResponse:
        """Capture a workspace's files (and with ``include_memory`` its running processes) as a named snapshot."""
        snapshot = await self.snapshots.take(
            request.workspace_id, request.name, dict(request.labels), include_memory=request.include_memory
        )
        return wpb.SnapshotWorkspaceResponse(snapshot=convert.snapshot_to_proto(snapshot))

    async def RestoreWorkspace(
        self, request: wpb.RestoreWorkspaceRequest, context: Context
    ) -> wpb.RestoreWorkspaceResponse:
        """Return a workspace to one of the caller's snapshots, keeping its id."""
        workspace = await self.snapshots.restore(request.workspace_id, request.snapshot)
        return wpb.RestoreWorkspaceResponse(workspace=convert.workspace_to_proto(workspace))

    async def GetSnapshot(self, request: wpb.GetSnapshotRequest, context: Context) -> wpb.GetSnapshotResponse:
        """Return one of the caller's snapshots."""
        return wpb.GetSnapshotResponse(snapshot=convert.snapshot_to_proto(await self.snapshots.get(request.name)))

    async def ListSnapshots(self, request: wpb.ListSnapshotsRequest, context: Context) -> wpb.ListSnapshotsResponse:
        """The caller's snapshots, optionally by label."""
        found = await self.snapshots.list(dict(request.label_selector))
        return wpb.ListSnapshotsResponse(snapshots=[convert.snapshot_to_proto(s) for s in found])

    async def DeleteSnapshot(self, request: wpb.DeleteSnapshotRequest, context: Context) -> wpb.DeleteSnapshotResponse:
        """Remove one of the caller's snapshots."""
        await self.snapshots.delete(request.name)
        return wpb.DeleteSnapshotResponse(name=request.name)

    async def BuildTemplate(
        self, request_iterator: AsyncIterator[wpb.BuildTemplateRequest], context: Context
    ) -> AsyncIterator[wpb.BuildTemplateResponse]:
        """Build a template from a Dockerfile and the context that follows it; stream its log, then it."""
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("content") != "build":
            msg = "the first BuildTemplate message must carry the build"
            raise InvalidSpecError(msg)
        asked = first.build

        async def chunks() -> AsyncIterator[bytes]:
            async for message in request_iterator:
                if message.WhichOneof("content") != "context_chunk":
                    msg = "only the first BuildTemplate message may carry the build"
                    raise InvalidSpecError(msg)
                yield message.context_chunk

        build = TemplateBuild(
            name=asked.name,
            dockerfile=asked.dockerfile,
            start_command=asked.start_command,
            ready_command=asked.ready_command,
            working_dir=asked.working_dir,
            labels=dict(asked.labels),
            force=asked.force,
            timeout_s=convert.duration_s(asked.timeout, "timeout") if asked.HasField("timeout") else 0.0,
        )
        async for event in self.templates.build(build, chunks()):
            if isinstance(event, Built):
                yield wpb.BuildTemplateResponse(snapshot=convert.snapshot_to_proto(event.snapshot), cached=event.cached)
            else:
                line = wpb.BuildLogLine(text=event.text, step=event.step)
                line.time.FromDatetime(event.time)
                yield wpb.BuildTemplateResponse(log=line)
