"""Networks and egress proxies: the ALLOWLIST policy's own network and proxy per workspace (sandboxd.egress)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

import docker.errors

from ...errors import BackendError
from ..base import LABEL_EGRESS_OF, LABEL_EGRESS_RULES
from .claims import ClaimsMixin
from .client import API_VERSION, LABEL_INSTANCE
from .errors import reason
from .exec import DockerExecStream, _no_exit_code


class NetworksMixin(ClaimsMixin):
    """A workspace's own internal network, its egress proxy, and moves between networks."""

    def _egress_name(self, workspace_id: str) -> str:
        """The name of the workspace's own network, and of its egress proxy's container."""
        return f"{self._name(workspace_id)}.egress"

    def _egress_labels(self, workspace_id: str) -> dict[str, str]:
        return {LABEL_INSTANCE: self.instance, LABEL_EGRESS_OF: workspace_id}

    async def create_network(self, workspace_id: str) -> str:
        """Make the workspace's internal network; see Backend."""
        await self.remove_network(workspace_id)  # a leftover of an earlier workspace of that id
        name = self._egress_name(workspace_id)
        try:
            # Internal: no route out. And the bridge takes no address: a plain internal network makes
            # the host its members' gateway, so every service listening on the host's addresses is in
            # reach of the workspace; without one, only the network's members are.
            await self._call(
                self._api().create_network,
                name,
                internal=True,
                labels=self._egress_labels(workspace_id),
                options={"com.docker.network.bridge.inhibit_ipv4": "true"},
            )
        except BackendError as exc:
            msg = f"the Docker engine cannot make workspace {workspace_id!r}'s network: {exc.message}"
            raise BackendError(msg) from None
        return name

    async def remove_network(self, workspace_id: str) -> None:
        """Remove the workspace's network; see Backend."""
        api = self._api()
        name = self._egress_name(workspace_id)
        try:
            attrs = await self._call(api.inspect_network, name, idempotent=True)
        except docker.errors.NotFound:
            return
        for container in attrs.get("Containers") or {}:
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError, BackendError):
                await self._call(api.disconnect_container_from_network, container, name, force=True)
        with contextlib.suppress(docker.errors.NotFound):
            await self._call(api.remove_network, name)

    async def set_network(self, workspace_id: str, network: str) -> None:
        """Move the workspace's container to ``network``; see Backend."""
        api = self._api()
        ref = self._ref(workspace_id)
        attrs = await self._container_attrs(workspace_id)
        joined = list((attrs.get("NetworkSettings") or {}).get("Networks") or {})
        if joined == [network]:
            return
        for name in joined:
            with contextlib.suppress(docker.errors.NotFound):
                await self._call(api.disconnect_container_from_network, ref, name, force=True)
        await self._call(api.connect_container_to_network, ref, network)

    async def start_proxy(
        self, workspace_id: str, *, image: str, env: Mapping[str, str], rules: str, alias: str, egress_network: str
    ) -> None:
        """Start the workspace's egress proxy; see Backend."""
        api = self._api()
        name = self._egress_name(workspace_id)
        await self.remove_proxy(workspace_id)
        host_config = api.create_host_config(
            init=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true"],
            pids_limit=256,
            mem_limit=256 * 1024 * 1024,
            network_mode=name,
            restart_policy={"Name": "unless-stopped"},
            # It forwards nothing itself: a workspace given NET_ADMIN cannot route through it.
            sysctls={"net.ipv4.ip_forward": "0"},
        )
        networking = api.create_networking_config({name: api.create_endpoint_config(aliases=[alias])})
        try:
            created = await self._call(
                api.create_container,
                image,
                name=name,
                environment=dict(env),
                labels={**self._egress_labels(workspace_id), LABEL_EGRESS_RULES: rules},
                host_config=host_config,
                networking_config=networking,
            )
            await self._call(api.connect_container_to_network, created["Id"], egress_network)
            await self._call(api.start, created["Id"])
        except (docker.errors.NotFound, BackendError) as exc:
            await self.remove_proxy(workspace_id)
            reason = exc.message if isinstance(exc, BackendError) else str(exc.explanation or exc)
            msg = (
                f"workspace {workspace_id!r}'s egress proxy could not start "
                f"(egress network {egress_network!r}): {reason}"
            )
            raise BackendError(msg) from None

    async def network_subnet(self, workspace_id: str) -> str:
        """The IPv4 block of the workspace's network; see Backend."""
        attrs = await self._call(self._api().inspect_network, self._egress_name(workspace_id), idempotent=True)
        return str(((attrs.get("IPAM") or {}).get("Config") or [{}])[0].get("Subnet", ""))

    async def remove_proxy(self, workspace_id: str) -> None:
        """Remove the workspace's egress proxy; see Backend."""
        with contextlib.suppress(docker.errors.NotFound):
            await self._call(self._api().remove_container, self._egress_name(workspace_id), force=True, v=True)

    async def proxy_rules(self, workspace_id: str) -> str | None:
        """The rules label of the workspace's proxy; see Backend."""
        try:
            attrs = await self._call(self._api().inspect_container, self._egress_name(workspace_id), idempotent=True)
        except docker.errors.NotFound:
            return None
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_INSTANCE) != self.instance or labels.get(LABEL_EGRESS_OF) != workspace_id:
            return None
        return labels.get(LABEL_EGRESS_RULES)

    async def list_proxies(self) -> list[str]:
        """Workspace ids of this daemon's egress proxies and networks; see Backend."""
        api = self._api()
        selector = {"label": [f"{LABEL_INSTANCE}={self.instance}", LABEL_EGRESS_OF]}
        containers = await self._call(api.containers, all=True, filters=selector, idempotent=True)
        networks = await self._call(api.networks, filters=selector, idempotent=True)
        found = {(item.get("Labels") or {}).get(LABEL_EGRESS_OF, "") for item in [*containers, *networks]}
        return sorted(found - {""})

    async def proxy_log(
        self, workspace_id: str, *, max_line_bytes: int, since: float = 0
    ) -> AsyncIterator[tuple[str, str]]:
        """The proxy's log lines as they come; see Backend.

        One HTTP/1.0 request to the engine's log endpoint, followed: the engine then sends its
        multiplexed frames unchunked until the container ends or the call is cancelled.
        """
        reader, writer = await self._connect()
        name = self._egress_name(workspace_id)
        request = (
            f"GET /v{API_VERSION}/containers/{name}/logs?follow=1&stdout=1&stderr=1&since={since:.6f} HTTP/1.0\r\n"
            "Host: docker\r\n\r\n"
        ).encode()
        stream = DockerExecStream(reader, writer, inspect=_no_exit_code)
        try:
            writer.write(request)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            if status != 200:
                msg = f"the Docker engine refused the proxy's log (HTTP {status})"
                raise BackendError(msg)
            pending = {1: b"", 2: b""}
            while (chunk := await stream.read()) is not None:
                fd, data = chunk
                if fd not in pending:
                    continue
                *lines, rest = (pending[fd] + data).split(b"\n")
                pending[fd] = rest[-max_line_bytes:]
                for line in lines:
                    yield ("stdout" if fd == 1 else "stderr"), line[:max_line_bytes].decode("utf-8", "replace")
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            msg = f"the proxy's log broke off: {reason(exc)}"
            raise BackendError(msg) from None
        finally:
            await stream.close(discard_input=True)
