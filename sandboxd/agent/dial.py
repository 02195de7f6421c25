"""How a link reaches its agent: straight to the agent's socket from the host, else a bridge.

The connection goes straight to the agent's socket where this machine sees it (the engine
is local and the runtime shows the container's sockets on the host), else through a
``docker exec`` of ``sandboxd-agent bridge`` (PROTOCOL.md, Transport). What the host sees
is learnt per runtime, for every link of one engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import time

import structlog

from ..backend.base import RELISTEN_SIGNAL, Backend, ExecStream
from ..errors import DockerUnavailableError, SandboxdError
from .errors import AgentBehindEngine, AgentLost
from .paths import AGENT_PATH

__all__ = ["AWAY_MARK", "LISTEN_WAIT_S", "Dialer"]

log = structlog.get_logger("sandboxd.agent")

AWAY_MARK = "agent.away"
"""Beside the agent's socket while it has let go of it for a checkpoint (PROTOCOL.md, Checkpoints)."""
LISTEN_WAIT_S = 10.0
"""How long a direct connection waits for a starting agent's socket to appear (the bridge waits as long)."""


def _present(path: str) -> bool:
    """Whether anything is at ``path`` (a stat of a local tmpfs: it does not block)."""
    return os.path.lexists(path)


class Dialer:
    """Opens connections to one workspace's agent, by its socket or by a bridge.

    Args:
        backend: the engine, for the socket or the ``docker exec`` of the bridge.
        workspace_id: the workspace.
        container_id: its container (calls go to exactly it).
        socket_path: the agent's socket as the engine's host sees it; empty: the bridge only.
        runtime: the container's runtime (what the host sees of it is learnt per runtime).
        host_sockets: the runtimes whose containers' sockets this host is known to see, shared
            by the links of one engine: runc's always, gVisor's with ``--host-uds=create``, a
            virtual machine's never. A dialer adds its runtime once its agent answered there.
    """

    def __init__(
        self,
        backend: Backend,
        workspace_id: str,
        container_id: str,
        *,
        socket_path: str = "",
        runtime: str = "",
        host_sockets: set[str] | None = None,
    ) -> None:
        """Remember where the agent is; nothing connects yet."""
        self.backend = backend
        self.workspace_id = workspace_id
        self.container_id = container_id
        self.socket_path = socket_path
        self.runtime = runtime
        self.host_sockets = host_sockets if host_sockets is not None else set()

    async def direct(self) -> ExecStream | None:
        """A connection to the agent's socket from the host, when the host is known to see it."""
        if not self.socket_path or self.runtime not in self.host_sockets:
            return None
        began = time.monotonic()
        while (stream := await self.backend.open_socket(self.socket_path, self.container_id)) is None:
            # The agent's socket gets its name only once it listens (agent_linux.go listenAtOnce;
            # under gVisor a bound socket's host file refuses until its listen is forwarded). So
            # a socket not there yet is worth the wait (a workspace just created: its agent is
            # starting), and one there that refuses is no agent of ours: the bridge's to try.
            waited = time.monotonic() - began
            if _present(self.socket_path) or waited > LISTEN_WAIT_S:
                return None
            await asyncio.sleep(0.005 if waited < 0.1 else 0.05)
        return stream

    async def bridge(self) -> ExecStream:
        """A ``docker exec`` of the agent's bridge.

        Raises:
            AgentBehindEngine: the engine cannot be reached.
            AgentLost: the exec failed.
        """
        try:
            return await self.backend.exec_stream(
                self.workspace_id, [AGENT_PATH, "bridge"], env={}, user="0:0", container_id=self.container_id
            )
        except DockerUnavailableError as exc:
            raise AgentBehindEngine(exc.message) from None
        except SandboxdError as exc:
            msg = f"workspace {self.workspace_id!r}'s agent cannot be reached: {exc.message}"
            raise AgentLost(msg) from None

    async def straight_after_bridge(self) -> ExecStream | None:
        """After a bridge's welcome (the agent listens): a connection to its socket from the host.

        Asked after every bridge's welcome, once: a link whose socket refused a moment ago (a
        gVisor sandbox under load, its host socket's backlog not yet served) goes straight as
        soon as it answers, and does not keep its workspace on the bridge for good. A yes
        teaches the runtime to every link of the engine; a no is this workspace's alone (its
        root planted something at the path, an agent restarting), and costs one connect.
        """
        if not self.socket_path:
            return None
        # The agent answered through the bridge, so its socket listens, and under gVisor its host
        # file listens too (the sentry forwards a listen to the gofer before an in-sandbox connect
        # can reach it: pkg/sentry/socket/unix/transport/connectioned.go Listen holds the
        # endpoint's lock across it). A no is the runtime's way (gVisor without
        # --host-uds=create keeps its sockets to itself) or a workspace's: not waited out.
        straight = await self.backend.open_socket(self.socket_path, self.container_id)
        if straight is None:
            log.info(
                "agent.host_sockets_unseen",
                workspace_id=self.workspace_id,
                runtime=self.runtime or "default",
                present=_present(self.socket_path),
            )
            return None
        if self.runtime not in self.host_sockets:
            self.host_sockets.add(self.runtime)
            log.info("agent.host_sockets", runtime=self.runtime or "default")
        return straight

    def away(self) -> bool:
        """Whether the agent's mark says it has let go of its socket for a checkpoint."""
        return bool(self.socket_path) and _present(posixpath.join(posixpath.dirname(self.socket_path), AWAY_MARK))

    async def relisten(self) -> None:
        """Tell the container's agent to listen again (best effort)."""
        with contextlib.suppress(SandboxdError):
            await self.backend.signal_container(self.container_id, RELISTEN_SIGNAL)
