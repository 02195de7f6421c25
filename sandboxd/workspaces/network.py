"""A workspace's network policy: read back from its container at adoption, and changed by UpdateNetwork."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from ..backend.base import Backend, ContainerInfo
from ..egress import EgressProxies, check_rules
from ..errors import WorkspaceNotRunningError
from ..models import EgressRule, NetworkPolicy, Runtime, Workspace
from ..settings import Settings
from ..tenancy import DEFAULT_TENANT, current_tenant
from .bridge import Bridge
from .records import Records
from .specs import LABEL_SPEC, LABEL_TENANT, check_runtime_network, check_workspace_id, owned, spec_from_json

__all__ = ["Networks"]

log = structlog.get_logger(__name__)


class Networks:
    """Reads and changes workspaces' network policies (an ALLOWLIST one's proxy with it).

    Args:
        backend: the container engine (the container's networks).
        settings: whether gVisor workspaces may network.
        egress: the ALLOWLIST workspaces' egress proxies.
        records: where each workspace's policy now is kept.
        bridge: wakes a paused workspace, and gives its commands the env of its policy.
    """

    def __init__(
        self, backend: Backend, settings: Settings, egress: EgressProxies, records: Records, bridge: Bridge
    ) -> None:
        """Wire the networks."""
        self.backend = backend
        self.settings = settings
        self.egress = egress
        self.records = records
        self.bridge = bridge

    async def network_of(self, info: ContainerInfo) -> tuple[NetworkPolicy, tuple[EgressRule, ...]]:
        """A workspace's policy as its container's networks (and its proxy's rules) say.

        Only a workspace on a network of its own (an allowlist's) costs a look at its proxy: at
        start that is one inspect per allowlist workspace, not one per workspace.
        """
        own = set(info.networks) - {"none", "bridge"}
        if own and (rules := await self.egress.rules(info.workspace_id)) is not None:
            return NetworkPolicy.ALLOWLIST, rules
        return (NetworkPolicy.BRIDGE if "bridge" in info.networks else NetworkPolicy.NONE), ()

    async def update(self, workspace_id: str, network: NetworkPolicy | None, rules: Sequence[EgressRule]) -> Workspace:
        """Give a running workspace another network policy, or an ALLOWLIST one other rules.

        Its files and processes stay; connections open through the old network (or proxy) may
        end. A paused workspace is resumed first (unless ``auto_resume`` is off).

        Raises:
            WorkspaceNotFoundError: no such workspace of the caller's.
            WorkspaceNotRunningError: its container is not running.
            InvalidSpecError: the policy is not available under its runtime, or a rule is invalid.
            SandboxdError: the engine refused the network or the proxy.
        """
        check_workspace_id(workspace_id)
        network = network or NetworkPolicy.NONE
        async with self.records.lock(workspace_id):
            info = owned(await self.backend.inspect_container(workspace_id), current_tenant())
            check_runtime_network(self.settings, Runtime.RUNSC if info.runtime == "runsc" else Runtime.RUNC, network)
            rules = check_rules(network, rules)
            if not info.running and not info.paused:
                msg = f"workspace {workspace_id!r} is not running"
                raise WorkspaceNotRunningError(msg)
            await self.bridge.awake_locked(workspace_id)  # the lock is held: awake would wait for it for ever
            record = self.records.open(workspace_id)
            old = record.network or await self.network_of(info)
            tenant = info.labels.get(LABEL_TENANT, DEFAULT_TENANT)
            if network is NetworkPolicy.ALLOWLIST and old[0] is NetworkPolicy.ALLOWLIST:
                await self.egress.replace(workspace_id, tenant, rules)
            elif network is NetworkPolicy.ALLOWLIST:
                await self.backend.set_network(workspace_id, await self.egress.open(workspace_id, tenant, rules))
            else:
                await self.backend.set_network(workspace_id, str(network))
                if old[0] is NetworkPolicy.ALLOWLIST:
                    await self.egress.close(workspace_id)
            record.network = (network, rules)
            if (context := record.context) is not None:
                context.env = self.bridge.env(workspace_id, spec_from_json(info.labels[LABEL_SPEC]))
            log.info("workspace.network_changed", workspace_id=workspace_id, network=str(network), rules=len(rules))
            self.records.touch(workspace_id)
            return self.records.describe(await self.backend.inspect_container(workspace_id))
