"""The ALLOWLIST network policy: an internal network per workspace, and Debian's squid as its one way out.

A workspace with the ALLOWLIST policy joins a network of its own that Docker makes
``internal`` (no route out, no DNS beyond it). On it, and on the daemon's egress network
(``SANDBOXD_EGRESS_NETWORK``, Docker's default bridge unless told), runs the workspace's
egress proxy: Debian's squid (``images/egress_proxy``), whose policy :func:`squid_policy`
renders from the workspace's rules. Its commands get ``HTTP_PROXY``/``HTTPS_PROXY`` (and
the lower-case forms curl reads) pointing at it. The proxy:

- matches the host name the client asked for (case-insensitively), and resolves names itself;
- lets a numeric host through only when a rule names that address or its block;
- never lets a name lead to a loopback, link-local (the cloud metadata service),
  unspecified or multicast address (DNS rebinding), listed or not;
- allows HTTP, and CONNECT (HTTPS, or any TCP) to the rule's ports (80 and 443 by default).

Every request is logged on the proxy's stdout; :class:`EgressProxies` follows the log and
audits each denial with workspace, tenant, host and port. A proxy per workspace keeps one
tenant's traffic and policy out of another's way.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import re
import time
from collections.abc import Sequence

import structlog

from . import metrics
from .audit import AuditLog
from .backend.base import Backend
from .errors import SandboxdError
from .images import ensure_egress_image
from .models import EgressRule
from .proxy import (
    DEFAULT_PORTS,
    MAX_RULES,
    PROXY_ALIAS,
    PROXY_PORT,
    check_rules,
    proxy_env,
    rules_from_json,
    rules_to_json,
    squid_policy,
)
from .settings import Settings

__all__ = [
    "DEFAULT_PORTS",
    "MAX_RULES",
    "PROXY_ALIAS",
    "PROXY_PORT",
    "EgressProxies",
    "check_rules",
    "proxy_env",
    "rules_from_json",
    "rules_to_json",
    "squid_policy",
]

log = structlog.get_logger(__name__)

READY_TIMEOUT_S = 30.0
"""Longest wait for a new proxy to accept connections."""
MAX_LOG_LINE_BYTES = 8192
"""Longest proxy log line read (the host in a request is the workspace's to choose)."""
DENIALS_PER_WINDOW = 100
"""Denials audited one by one per workspace in each ``DENIAL_WINDOW_S``; past that they are counted,
and the count audited when the window ends (a workspace flooding its proxy cannot fill the disk)."""
DENIAL_WINDOW_S = 10.0

_DENIED = re.compile(r"sandboxd-egress TCP_DENIED (\d{3}) (\S{1,40}) (\S{1,300}) (\d{1,5}) (\S{1,45})$")
"""An access-log line of a denial, whole: squid's own messages (which may quote a request) never match."""


@dataclasses.dataclass
class _Window:
    """One workspace's denials in the current ``DENIAL_WINDOW_S``."""

    began: float
    count: int = 0
    hosts: set[str] = dataclasses.field(default_factory=set)
    """Up to 20 of the hosts of denials counted, not listed."""
    timer: asyncio.TimerHandle | None = None
    flushed: bool = False


class EgressProxies:
    """The egress proxies of a daemon's ALLOWLIST workspaces: started, replaced, followed, removed.

    Args:
        backend: the engine.
        settings: the egress network and the image route.
        image: the proxy's image (``images.egress_image_ref``), built at first use when missing.
    """

    def __init__(self, backend: Backend, settings: Settings, image: str) -> None:
        """Follow no proxy yet."""
        self.backend = backend
        self.settings = settings
        self.image = image
        self.audit: AuditLog | None = None
        self._followers: dict[str, asyncio.Task[None]] = {}
        self._ready: dict[str, asyncio.Event] = {}
        self._tenants: dict[str, str] = {}
        self._image_lock = asyncio.Lock()
        self._image_built = False
        self._denials: dict[str, _Window] = {}
        self._clients: dict[str, ipaddress.IPv4Network | ipaddress.IPv6Network] = {}
        """Each proxy's workspace network: a denial of a request from elsewhere is not its workspace's."""

    def _flush(self, workspace_id: str, window: _Window) -> None:
        """Audit what a window counted beyond its listed denials (once)."""
        if window.timer is not None:
            window.timer.cancel()
        if window.count <= DENIALS_PER_WINDOW or window.flushed:
            return
        window.flushed = True
        if self.audit is not None:
            self.audit.event(
                "egress.denials_counted",
                workspace_id=workspace_id,
                tenant=self._tenants.get(workspace_id, ""),
                denials=window.count - DENIALS_PER_WINDOW,
                hosts=sorted(window.hosts),
                reason=f"more than {DENIALS_PER_WINDOW} denials in {DENIAL_WINDOW_S:g} s: counted, not listed",
            )

    async def _ensure_image(self) -> None:
        """Build the proxy's image at the first ALLOWLIST workspace when ``sandboxd images build`` did not."""
        if self._image_built:
            return
        async with self._image_lock:
            if not self._image_built:
                self.image = await ensure_egress_image(
                    self.backend,
                    route=self.settings.image_route,
                    progress=lambda line: log.info("egress.progress", line=line),
                )
                self._image_built = True

    async def open(self, workspace_id: str, tenant: str, rules: Sequence[EgressRule]) -> str:
        """Make the workspace's network and start its proxy; return the network's name (for the container).

        Raises:
            SandboxdError: the engine refused (the network's address pool is exhausted, the
                egress network does not exist), or the proxy did not start in time.
        """
        network = await self.backend.create_network(workspace_id)
        try:
            await self._start(workspace_id, tenant, rules)
        except BaseException:
            await asyncio.shield(self.close(workspace_id))
            raise
        return network

    async def replace(self, workspace_id: str, tenant: str, rules: Sequence[EgressRule]) -> None:
        """Put a proxy with new rules in place of the old one (its open connections end)."""
        await self._stop(workspace_id)
        await self._start(workspace_id, tenant, rules)

    async def _start(self, workspace_id: str, tenant: str, rules: Sequence[EgressRule]) -> None:
        await self._ensure_image()
        self._tenants[workspace_id] = tenant
        ready = self._ready[workspace_id] = asyncio.Event()
        clients = await self.backend.network_subnet(workspace_id)
        self._clients[workspace_id] = ipaddress.ip_network(clients)
        await self.backend.start_proxy(
            workspace_id,
            image=self.image,
            env={"SANDBOXD_EGRESS_POLICY": squid_policy(rules, clients)},
            rules=rules_to_json(rules),
            alias=PROXY_ALIAS,
            egress_network=self.settings.egress_network,
        )
        self._follow(workspace_id, since=0)
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                await ready.wait()
        except TimeoutError:
            msg = f"workspace {workspace_id!r}'s egress proxy did not start in {READY_TIMEOUT_S:g} s"
            raise SandboxdError(msg) from None

    async def rules(self, workspace_id: str) -> tuple[EgressRule, ...] | None:
        """The rules of the workspace's proxy, or None when it has none (its policy is not ALLOWLIST)."""
        text = await self.backend.proxy_rules(workspace_id)
        return None if text is None else rules_from_json(text)

    async def adopt(self, workspaces: dict[str, str]) -> None:
        """At start: follow the proxies of ``workspaces`` (id → tenant), remove every other one."""
        for workspace_id in await self.backend.list_proxies():
            if workspace_id in workspaces:
                self._tenants[workspace_id] = workspaces[workspace_id]
                self._ready[workspace_id] = asyncio.Event()
                with contextlib.suppress(SandboxdError, ValueError):
                    self._clients[workspace_id] = ipaddress.ip_network(await self.backend.network_subnet(workspace_id))
                self._follow(workspace_id, since=time.time())  # what came before is the last daemon's
            else:
                log.info("egress.orphan_removed", workspace_id=workspace_id)
                await self.close(workspace_id)

    async def close(self, workspace_id: str) -> None:
        """Remove the workspace's proxy and network (nothing when it has none)."""
        await self._stop(workspace_id)
        if (window := self._denials.pop(workspace_id, None)) is not None:
            self._flush(workspace_id, window)
        self._tenants.pop(workspace_id, None)
        self._clients.pop(workspace_id, None)
        await self.backend.remove_network(workspace_id)

    async def _stop(self, workspace_id: str) -> None:
        follower = self._followers.pop(workspace_id, None)
        if follower is not None:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
        self._ready.pop(workspace_id, None)
        await self.backend.remove_proxy(workspace_id)

    async def shutdown(self) -> None:
        """Stop following (the proxies stay, like their workspaces, for the next daemon)."""
        for follower in self._followers.values():
            follower.cancel()
        for follower in list(self._followers.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await follower
        self._followers.clear()

    def _follow(self, workspace_id: str, *, since: float) -> None:
        self._followers[workspace_id] = asyncio.create_task(
            self._read_log(workspace_id, since), name=f"egress-{workspace_id}"
        )

    async def _read_log(self, workspace_id: str, since: float) -> None:
        """Read the proxy's log for as long as it runs: readiness, and every denial."""
        while True:
            try:
                lines = self.backend.proxy_log(workspace_id, max_line_bytes=MAX_LOG_LINE_BYTES, since=since)
                async for stream, line in lines:
                    self._on_line(workspace_id, stream, line)
            except SandboxdError as exc:
                log.warning("egress.log_unreadable", workspace_id=workspace_id, error=exc.message)
            since = time.time()
            await asyncio.sleep(1.0)  # the proxy restarted (the engine's restart policy), or the engine blinked

    def _on_line(self, workspace_id: str, stream: str, line: str) -> None:
        """One line of the proxy's log: squid's own messages on stderr, its access log on stdout.

        Only stdout is read for denials (squid's messages may quote a request's headers), and
        only whole lines of the access log's format.
        """
        if stream == "stderr":
            if "Accepting HTTP Socket connections" in line and (ready := self._ready.get(workspace_id)) is not None:
                ready.set()
            return
        denied = _DENIED.match(line.rstrip("\r"))
        if denied is None:
            return
        status, method, host, port, client = denied.groups()
        clients = self._clients.get(workspace_id)
        try:
            foreign = clients is not None and ipaddress.ip_address(client) not in clients
        except ValueError:
            foreign = True
        if foreign:
            # Another container on the egress network tried this workspace's proxy: refused, and no
            # denial of the workspace's (it must not be able to fill its record, or hide in it).
            log.warning("egress.foreign_client", workspace_id=workspace_id, client=client, host=host)
            return
        metrics.EGRESS_DENIALS.inc()
        tenant = self._tenants.get(workspace_id, "")
        window = self._denials.get(workspace_id)
        now = time.monotonic()
        if window is None or now - window.began >= DENIAL_WINDOW_S:
            if window is not None:
                self._flush(workspace_id, window)
            window = self._denials[workspace_id] = _Window(began=now)
        window.count += 1
        if window.count > DENIALS_PER_WINDOW:
            if len(window.hosts) < 20:
                window.hosts.add(f"{host}:{port}")
            if window.timer is None:  # said at the window's end even if no denial comes after it
                window.timer = asyncio.get_running_loop().call_later(
                    DENIAL_WINDOW_S - (now - window.began), self._flush, workspace_id, window
                )
            return
        log.warning("egress.denied", workspace_id=workspace_id, host=host, port=int(port), method=method, status=status)
        if self.audit is not None:
            self.audit.event(
                "egress.denied",
                workspace_id=workspace_id,
                tenant=tenant,
                host=host,
                port=int(port),
                method=method,
                reason="not in the workspace's allowlist",
            )
