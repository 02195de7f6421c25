"""Provisioning: starting a workspace's container, with its image, agent and network, until its agent answers.

A container is provisional (``Backend.commit_container``) until its agent answered: a daemon
that dies meanwhile leaves nothing a restart keeps, and a create cut short removes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import structlog

from ..agentbuild import AgentBuild, ensure_agent
from ..backend.base import Backend, ContainerInfo, ImageInfo
from ..egress import EgressProxies
from ..errors import (
    FailedPreconditionError,
    ImageNotFoundError,
    InvalidSpecError,
    NotFoundError,
    SandboxdError,
    quoted,
)
from ..models import NetworkPolicy, Workspace, WorkspaceSpec
from ..settings import Settings
from .bridge import Bridge
from .records import Records
from .specs import FALLBACK_USER, LABEL_SNAPSHOT, container_spec, is_snapshot

__all__ = ["Provisioner"]

log = structlog.get_logger(__name__)


class Provisioner:
    """Starts workspaces' containers (and pool members'), and removes those whose start was cut short.

    Args:
        backend: the container engine.
        settings: the daemon's defaults (its default image, the image route for the agent's build).
        egress: the ALLOWLIST workspaces' egress proxies.
        bridge: connects each new container's agent.
        records: where a new workspace's network policy is kept.
        agent: the agent new workspaces run; None finds it (building it if missing) at the
            first start, and again at each start while that fails.
    """

    def __init__(
        self,
        backend: Backend,
        settings: Settings,
        egress: EgressProxies,
        bridge: Bridge,
        records: Records,
        agent: AgentBuild | None,
    ) -> None:
        """Wire the provisioner."""
        self.backend = backend
        self.settings = settings
        self.egress = egress
        self.bridge = bridge
        self.records = records
        self.agent = agent
        self._agent_lock = asyncio.Lock()

    async def start(
        self,
        resolved: WorkspaceSpec,
        workspace_id: str,
        tenant: str,
        *,
        pool_class: str = "",
        snapshot: ImageInfo | None = None,
        request: tuple[str, str] | None = None,
    ) -> Workspace:
        """Start a container for ``resolved``: a member of ``pool_class`` (no tenant), or a fork of ``snapshot``.

        The container is committed (``Backend.commit_container``) once its agent answered.

        Args:
            resolved: the spec with every default applied; its user, if unset, is read from the image.
            workspace_id: the new workspace's (or member's) id.
            tenant: its tenant; empty for a pool member.
            pool_class: the warm pool class it is a member of, or empty.
            snapshot: the snapshot it forks, if any.
            request: the create's request id and digest, for its labels; None without one.

        Raises:
            NotFoundError: the snapshot was deleted meanwhile.
            ImageNotFoundError: the image is missing and cannot be pulled.
            InvalidSpecError: the image is not a Linux image.
            FailedPreconditionError: the agent did not start in the image.
            DockerUnavailableError: the engine is down.
        """
        agent = await self._agent()
        image = await self._image(resolved.image, snapshot)
        user = resolved.security.user or (
            image.user if image.user.split(":")[0] not in {"", "root", "0"} else FALLBACK_USER
        )
        resolved = dataclasses.replace(resolved, security=dataclasses.replace(resolved.security, user=user))
        network = str(resolved.network)
        if resolved.network is NetworkPolicy.ALLOWLIST:
            network = await self.egress.open(workspace_id, tenant, resolved.allowed_hosts)
        try:
            info = await self.backend.create_container(
                container_spec(
                    resolved,
                    workspace_id,
                    tenant=tenant,
                    network=network,
                    image=image,
                    agent=agent,
                    pool_class=pool_class,
                    snapshot=snapshot,
                    request=request,
                )
            )
        except BaseException:
            if resolved.network is NetworkPolicy.ALLOWLIST:
                await asyncio.shield(self.egress.close(workspace_id))
            raise
        self.records.open(workspace_id).network = (resolved.network or NetworkPolicy.NONE, resolved.allowed_hosts)
        workspace = self.records.describe(info)
        await self._commit(info, resolved.image)
        if pool_class:
            return workspace
        self.records.touch(workspace_id)
        log.info("workspace.created", workspace_id=workspace_id, image=resolved.image, user=user, tenant=tenant)
        return workspace

    async def _commit(self, info: ContainerInfo, image: str) -> None:
        """Wait for the new container's agent to answer, then make the container for good.

        The agent answers before the workspace is handed out: a create that returns works.

        Raises:
            FailedPreconditionError: the agent did not start (the container is removed).
        """
        workspace_id = info.workspace_id
        try:
            # The link of an earlier workspace of that id, removed behind our back, goes only now
            # that the engine made the new one: a create refused for a taken id leaves its holder's.
            await self.bridge.forget_context(workspace_id)
            await self.bridge.context_for(info).link.connect()
        except SandboxdError as exc:
            await self.bridge.forget_context(workspace_id)
            await self.backend.remove_container(workspace_id)
            await self.egress.close(workspace_id)
            msg = f"the workspace's agent did not start in image {quoted(image)}: {exc.message}"
            raise FailedPreconditionError(msg) from None
        except BaseException:
            # Cancelled (the caller went away): nobody will ever have this workspace's id.
            await asyncio.shield(self.discard(workspace_id))
            raise
        try:
            await self.backend.commit_container(workspace_id)
        except BaseException:
            await asyncio.shield(self.discard(workspace_id))
            raise

    async def _agent(self) -> AgentBuild:
        """The agent new workspaces run, found (or built) once."""
        if self.agent is None:
            async with self._agent_lock:
                if self.agent is None:
                    self.agent = await ensure_agent(
                        self.backend,
                        route=self.settings.image_route,
                        progress=lambda line: log.info("agent.progress", line=line),
                    )
        return self.agent

    async def _image(self, reference: str, snapshot: ImageInfo | None) -> ImageInfo:
        """The image a workspace is started from, pulled if it is missing (and may be pulled).

        Raises:
            NotFoundError: the snapshot was deleted meanwhile.
            ImageNotFoundError: it is missing and cannot be pulled, or it names a snapshot.
            InvalidSpecError: it is not a Linux image.
        """
        image = await self.backend.image_info(reference)
        if image is None and snapshot is not None:
            msg = f"snapshot {snapshot.labels.get(LABEL_SNAPSHOT, '')!r} not found"  # deleted meanwhile
            raise NotFoundError(msg)
        if image is not None and is_snapshot(image) and (snapshot is None or image.image_id != snapshot.image_id):
            # A snapshot is its tenant's: forked by name (from_snapshot), never named as an image,
            # by its tag or by a prefix of its id. Said as of any image that is not there.
            msg = f"image {quoted(reference)} is not present on the Docker engine"
            raise ImageNotFoundError(msg)
        if image is None:
            if reference == self.settings.default_image:
                msg = (
                    f"the default workspace image {reference!r} is not built yet; "
                    "run `sandboxd images build` (or start the daemon without --no-build)"
                )
                raise ImageNotFoundError(msg)
            image = await self.backend.pull_image(reference)
        if image.os != "linux":
            msg = f"image {quoted(reference)} is a {image.os} image; this daemon runs Linux workspaces"
            raise InvalidSpecError(msg)
        return image

    async def discard(self, workspace_id: str) -> None:
        """Remove a workspace whose create was cut short (errors are swallowed: it may be half made)."""
        with contextlib.suppress(SandboxdError):
            await self.bridge.forget_context(workspace_id)
            await self.backend.remove_container(workspace_id)  # its claim record too, if written
