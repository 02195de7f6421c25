"""What each workspace's container is called, and the claims that make a pool member a workspace.

A container's name and labels cannot change in place, so a claimed pool member keeps
its own and a claim record (a volume nothing mounts) says whose it is now; a container
being created bears a provisional name until it is committed. Every call reaches a
workspace's container through :meth:`ClaimsMixin._ref`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

import docker.errors
import structlog

from ...errors import BackendError, WorkspaceExistsError, WorkspaceNotFoundError
from ..base import ContainerInfo
from .client import LABEL_INSTANCE, LABEL_MANAGED, LABEL_WORKSPACE, DockerClient
from .errors import EngineErrorKind, kind_of

LABEL_CLAIM_OF = "sandboxd.claim_of"
"""On a claim record (a volume): the id the claimed container was created with."""
LABEL_CLAIM_CONTAINER = "sandboxd.claim_container"
"""On a claim record: the claimed container's id (what every call names it by: it never changes)."""
LABEL_CLAIM_TIME = "sandboxd.claim_time"
"""On a claim record: when the claim was made, the claimed workspace's create time (not its member's start)."""
LABEL_MEMBER = "sandboxd.pool_member"
"""In a claimed container's labels as this backend reports them: the id it was created with."""
PROVISIONAL_SUFFIX = ".creating"
"""A container's name is the workspace's plus this until its create is complete (``commit_container``):
one found so at a start is a create the daemon did not finish, and is removed."""
CLAIM_SUFFIX = ".claim"
"""A claim record's volume is the workspace's name plus this (a workspace id has no dot)."""

log = structlog.get_logger(__name__)


class ClaimsMixin(DockerClient):
    """Names, claim records and the claims of pool members (see the module docstring)."""

    def __init__(self, *, docker_host: str, instance: str, timeout_s: float = 60.0, retries: bool = True) -> None:
        """Configure the backend (as :class:`DockerClient`) with no claim read yet."""
        super().__init__(docker_host=docker_host, instance=instance, timeout_s=timeout_s, retries=retries)
        self._claims: dict[str, str] | None = None
        """Workspace id -> the id its container was created with, for claimed containers
        (:meth:`claim_container`); None until read from the claim records."""
        self._claimed: dict[str, dict[str, str]] = {}
        """Created-with id -> the labels the claimed container answers with."""
        self._claim_ids: dict[str, str] = {}
        """Workspace id -> its claimed container's id."""
        self._provisional_ids: dict[str, str] = {}
        """Workspace id -> the id of its container while it is being created (provisionally named)."""

    def _provisional_name(self, workspace_id: str) -> str:
        """The name a container bears until :meth:`commit_container` (ids have no dot: it is no other's)."""
        return f"{self._name(workspace_id)}{PROVISIONAL_SUFFIX}"

    def _ref(self, workspace_id: str) -> str:
        """What calls name the workspace's container by: a claimed or uncommitted one's id, else its name."""
        return self._claim_ids.get(workspace_id) or self._provisional_ids.get(workspace_id) or self._name(workspace_id)

    async def _container_attrs(self, workspace_id: str) -> dict[str, Any]:
        """The engine's inspection of the workspace's container.

        Raises:
            WorkspaceNotFoundError: the engine has no such container.
        """
        try:
            return await self._call(self._api().inspect_container, self._ref(workspace_id), idempotent=True)
        except docker.errors.NotFound as exc:
            msg = f"workspace {workspace_id!r} not found"
            raise WorkspaceNotFoundError(msg) from exc

    def _volume_name(self, workspace_id: str) -> str:
        """The name of the workspace's /workspace volume: a claimed workspace's keeps its member's."""
        return self._name((self._claims or {}).get(workspace_id, workspace_id))

    def _labels(self, labels: Mapping[str, str]) -> Mapping[str, str]:
        """A container's labels as callers see them: a claimed one's are its claim's."""
        return self._claimed.get(labels.get(LABEL_WORKSPACE, ""), labels)

    async def _load_claims(self, *, again: bool = False) -> None:
        """Read the claim records (once, or ``again``)."""
        if self._claims is not None and not again:
            return
        selector = {"label": [f"{LABEL_INSTANCE}={self.instance}", LABEL_CLAIM_OF]}
        volumes = (await self._call(self._api().volumes, filters=selector, idempotent=True)).get("Volumes") or []
        claims, claimed, ids = {}, {}, {}
        for volume in volumes:
            record = volume.get("Labels") or {}
            member, workspace_id = record.get(LABEL_CLAIM_OF, ""), record.get(LABEL_WORKSPACE, "")
            if member and workspace_id and volume["Name"] == self._claim_name(workspace_id):
                claims[workspace_id] = member
                claimed[member] = _claimed_labels(record, member)
                if record.get(LABEL_CLAIM_CONTAINER):
                    ids[workspace_id] = record[LABEL_CLAIM_CONTAINER]
        self._claims, self._claimed, self._claim_ids = claims, claimed, ids

    async def _drop_stale_claim(self, workspace_id: str) -> None:
        """Forget a claim whose container is gone (removed behind the daemon's back), with its record."""
        await self._load_claims()
        member = (self._claims or {}).get(workspace_id)
        container = self._claim_ids.get(workspace_id)
        if member is None:
            return
        if container:
            try:
                await self._call(self._api().inspect_container, container, idempotent=True)
            except docker.errors.NotFound:
                pass
            else:
                return  # it is there: not stale
        log.warning("workspace.stale_claim_removed", workspace_id=workspace_id, member=member)
        with contextlib.suppress(docker.errors.NotFound, BackendError):
            await self._call(self._api().remove_volume, self._volume_name(workspace_id), force=True, idempotent=True)
        await self._remove_private_volumes(member)
        await self._remove_private_volumes(workspace_id)  # the record among them
        if self._claims is not None:
            self._claims.pop(workspace_id, None)
        self._claimed.pop(member, None)
        self._claim_ids.pop(workspace_id, None)

    def _claim_name(self, workspace_id: str) -> str:
        return f"sandboxd-{self.instance}-{workspace_id}{CLAIM_SUFFIX}"

    async def _remove_private_volumes(self, workspace_id: str) -> None:
        """Remove the workspace's anonymous volumes left by a container removed without them (``docker rm -f``)."""
        api = self._api()
        selector = {"label": [f"{LABEL_INSTANCE}={self.instance}", f"{LABEL_WORKSPACE}={workspace_id}"]}
        volumes = (await self._call(api.volumes, filters=selector, idempotent=True)).get("Volumes") or []
        for volume in volumes:
            if volume["Name"] != self._volume_name(workspace_id):
                with contextlib.suppress(docker.errors.NotFound, BackendError):  # in use: its container is back
                    await self._call(api.remove_volume, volume["Name"], force=True, idempotent=True)

    async def claim_container(
        self, member: ContainerInfo, workspace_id: str, labels: Mapping[str, str]
    ) -> ContainerInfo:
        """Give the running container ``member`` (a pool's) the id and labels of a new workspace.

        A container's labels cannot change, so the claim is kept as a record of the engine's: a
        volume named after the workspace, labelled with its labels and the member's id, which
        nothing mounts. From then on the container answers as ``workspace_id`` with ``labels``
        (here and after a restart, whoever reads the records); removing it removes the record.

        Raises:
            WorkspaceExistsError: ``workspace_id`` is taken.
        """
        api = self._api()
        member_id = member.workspace_id
        await self._drop_stale_claim(workspace_id)
        claims = self._claims if self._claims is not None else {}
        if workspace_id in claims:
            msg = f"workspace {workspace_id!r} already exists"
            raise WorkspaceExistsError(msg)
        if member_id in self._claimed:
            msg = f"{member_id!r} is claimed already"
            raise WorkspaceExistsError(msg)
        claimed_at = datetime.datetime.now(datetime.UTC)
        record = {
            **labels,
            LABEL_MANAGED: "true",
            LABEL_INSTANCE: self.instance,
            LABEL_WORKSPACE: workspace_id,
            LABEL_CLAIM_OF: member_id,
            LABEL_CLAIM_CONTAINER: member.container_id,
            LABEL_CLAIM_TIME: claimed_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }

        async def record_it() -> None:
            created = await self._call(api.create_volume, name=self._claim_name(workspace_id), labels=record)
            if (created.get("Labels") or {}) != record:
                # The engine hands back a volume of that name as it is: an earlier claim's, whose
                # container is gone (a removal cut short). It is replaced.
                await self._call(api.remove_volume, self._claim_name(workspace_id), force=True, idempotent=True)
                await self._call(api.create_volume, name=self._claim_name(workspace_id), labels=record)

        # The member is renamed after its workspace: one that bears another name than its own
        # was claimed, and is never a pool's again, whatever becomes of the record. Both are done
        # before the claim returns, at once: a start after a crash between them renames one
        # recorded, and removes one renamed but not recorded, whose caller never had its id.
        outcomes = await asyncio.gather(
            record_it(), self._call(api.rename, member.container_id, self._name(workspace_id)), return_exceptions=True
        )
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            with contextlib.suppress(docker.errors.NotFound, BackendError):
                await self._call(api.remove_volume, self._claim_name(workspace_id), force=True, idempotent=True)
            with contextlib.suppress(docker.errors.NotFound, BackendError):
                await self._call(api.rename, member.container_id, self._name(member_id))
            error = failed[0]
            if kind_of(error) is EngineErrorKind.NAME_IN_USE:
                msg = f"workspace {workspace_id!r} already exists"
                raise WorkspaceExistsError(msg) from error
            raise error
        self._claim_ids[workspace_id] = member.container_id
        claims[workspace_id] = member_id
        self._claims = claims
        self._claimed[member_id] = effective = _claimed_labels(record, member_id)
        return dataclasses.replace(member, workspace_id=workspace_id, labels=effective, create_time=claimed_at)


def _claimed_labels(record: Mapping[str, str], member_id: str) -> dict[str, str]:
    """The labels a claimed container answers with: its claim record's, naming the member."""
    labels = {key: value for key, value in record.items() if key != LABEL_CLAIM_OF}
    labels[LABEL_MEMBER] = member_id
    return labels
