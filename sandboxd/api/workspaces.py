"""WorkspaceService servicer: proto in, domain call, proto out."""

from __future__ import annotations

from sandboxd_protocol.v1 import workspace_service_pb2 as wpb
from sandboxd_protocol.v1 import workspace_service_pb2_grpc as wgrpc

from ..workspaces import WorkspaceManager
from . import convert
from ._types import Context

__all__ = ["WorkspaceServicer"]


class WorkspaceServicer(wgrpc.WorkspaceServiceServicer):
    """Serves ``sandboxd.v1.WorkspaceService``."""

    def __init__(self, workspaces: WorkspaceManager) -> None:
        """Serve ``workspaces``."""
        self.workspaces = workspaces

    async def CreateWorkspace(
        self, request: wpb.CreateWorkspaceRequest, context: Context
    ) -> wpb.CreateWorkspaceResponse:
        """Create and start a workspace."""
        workspace = await self.workspaces.create(
            convert.workspace_spec(request.spec), workspace_id=request.workspace_id
        )
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
