"""One daemon per instance label and engine: the lease a daemon holds while it serves.

Two daemons on one label adopt each other's workspaces, reap them and kill each other's
commands (README, "Instances"). So a daemon takes its label's lease before it touches a
container, and keeps it for its whole life: a container named ``sandboxd-<instance>.lease``
on the engine, of the agent's image, running ``sandboxd-agent hold`` with its stdin held open
by the daemon (:meth:`Backend.take_lease`). The engine's unique names are the lock; a daemon
that dies, kill -9 included, closes the connection, the holder ends and the engine removes it,
so no lease outlives its daemon by more than a moment. A second daemon finds it running,
waits a few seconds for it to go, and refuses to start in one line naming the holder.

The lease is lost only with the engine (a restart ends the holder): the daemon keeps serving
(calls get UNAVAILABLE meanwhile) and takes it again when the engine is back; should another
daemon have taken it in that window, this one stops, rather than serve workspaces it no
longer owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import secrets
import socket
from collections.abc import Sequence

import structlog

from .agentbuild import AgentBuild, agent_digest
from .backend.base import Backend, Lease
from .errors import LeaseHeldError, SandboxdError
from .settings import Settings

__all__ = ["FIRST_WAIT_S", "InstanceLease"]

log = structlog.get_logger(__name__)

FIRST_WAIT_S = 1.5
"""How long a starting daemon waits for a lease found held to go: a daemon that has just
ended (kill -9) takes its lease with it in well under this; a live one keeps it."""

RETRY_S = 1.0
"""How often a lease not yet held (the engine away) is asked for again."""


class InstanceLease:
    """The daemon's lease on ``settings.instance``: taken at start, kept, given up at stop.

    Attributes:
        held: the lease is this daemon's now (the idle reaper and the adoption of workspaces
            run only while it is).
        taken: set when another daemon holds it after this one lost it; ``refusal`` says who.
    """

    def __init__(self, backend: Backend, settings: Settings, addresses: Sequence[str], *, image: str = "") -> None:
        """Describe this daemon as the holder; ``image`` is the agent's (its ``hold`` mode)."""
        self.backend = backend
        self.instance = settings.instance
        self.image = image or AgentBuild(agent_digest()).image
        self._token = secrets.token_hex(8)
        self._holder = json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "addresses": list(addresses),
                "since": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "token": self._token,
            },
            separators=(",", ":"),
        )
        self._lease: Lease | None = None
        self._argv: list[str] = []
        self._keeper: asyncio.Task[None] | None = None
        self._closing = False
        self.taken = asyncio.Event()
        self.refusal = ""

    @property
    def held(self) -> bool:
        """Whether this daemon holds the lease now."""
        return self._lease is not None

    async def take(self, *, quiet: bool = False) -> bool:
        """Take the lease at start; return whether it is held (False: the engine or the image is away).

        Not held, the keeper (:meth:`keep`) goes on asking. ``quiet``: a failure is not logged
        (a first try, before the agent's image is built).

        Raises:
            LeaseHeldError: another daemon serves this label on this engine (one line naming it).
        """
        try:
            self._lease = await self._take(FIRST_WAIT_S)
        except LeaseHeldError as exc:
            raise LeaseHeldError(self._refusal(exc.holder), exc.holder) from None
        except SandboxdError as exc:
            if not quiet:
                log.error("lease.pending", instance=self.instance, error=exc.message)  # noqa: TRY400
            return False
        log.info("lease.taken", instance=self.instance)
        return True

    def keep(self) -> None:
        """Keep the lease for the daemon's life: take it again whenever the engine ends it."""
        self._keeper = asyncio.create_task(self._keep(), name="lease-keeper")

    async def release(self) -> None:
        """Give the lease up (at stop): a successor may start the moment this returns."""
        self._closing = True
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        lease, self._lease = self._lease, None
        if lease is not None:
            await lease.release()

    async def _keep(self) -> None:
        pending_logged = True  # take() said so, if it was not held
        while not self._closing:
            if self._lease is not None:
                await self._lease.lost()
                if self._closing:
                    return
                self._lease = None
                log.warning("lease.lost", instance=self.instance)
                pending_logged = True
            try:
                self._lease = await self._take(FIRST_WAIT_S)
            except LeaseHeldError as exc:
                self.refusal = self._refusal(exc.holder)
                log.error("lease.taken_by_another", instance=self.instance, error=self.refusal)  # noqa: TRY400
                self.taken.set()
                return
            except SandboxdError as exc:
                if not pending_logged:
                    log.warning("lease.pending", instance=self.instance, error=exc.message)
                    pending_logged = True
                await asyncio.sleep(RETRY_S)
                continue
            log.info("lease.taken", instance=self.instance)
            pending_logged = False

    async def _take(self, wait_s: float) -> Lease:
        if not self._argv:
            directory = AgentBuild.binary_dir(await self.backend.architecture())
            self._argv = [f"{directory}/sandboxd-agent", "hold"]
        # Its own lease from before, which the engine kept running (live-restore, a `docker
        # restart` of it): it goes, and this daemon takes the lease anew.
        return await self.backend.take_lease(
            image=self.image,
            argv=self._argv,
            holder=self._holder,
            wait_s=wait_s,
            stale=lambda holder: _field(holder, "token") == self._token,
            alive=_lives_here,
        )

    def _refusal(self, holder: str) -> str:
        name = f"sandboxd-{self.instance}.lease"
        pid, host, since = _field(holder, "pid"), _field(holder, "host"), _field(holder, "since")
        addresses = _field(holder, "addresses")
        if pid is None:
            who = f"another daemon (its lease is the container {name})"
        else:
            on = ", ".join(str(a) for a in addresses) if isinstance(addresses, list) else ""
            who = f"sandboxd pid {pid} on host {host}" + (f" at {on}" if on else "") + f", since {since}"
        return (
            f"instance {self.instance!r} is already served on this Docker engine by {who}; "
            "stop it first, or give this daemon another --instance (SANDBOXD_INSTANCE)"
        )


def _field(holder: str, key: str) -> object:
    """A field of a lease's holder JSON (written by another process: anything may be there)."""
    try:
        parsed = json.loads(holder)
    except ValueError:
        return None
    value = parsed.get(key) if isinstance(parsed, dict) else None
    if isinstance(value, list):
        return [str(item)[:200] for item in value[:4]]
    return str(value)[:200] if isinstance(value, (int, str)) else None


def _lives_here(holder: str) -> bool:
    """Whether the holder is a sandboxd process running on this host now: no wait for it to go.

    Seen by its pid in ``/proc`` with ``sandboxd`` in its command line, on the host it names
    (a pid alone could be another program's by now). A holder on another host, or a daemon in
    another pid namespace, is waited for as before (:data:`FIRST_WAIT_S`).
    """
    pid, host = _field(holder, "pid"), _field(holder, "host")
    if not isinstance(pid, str) or not pid.isdigit() or int(pid) <= 0 or host != socket.gethostname():
        return False
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as cmdline:
            return b"sandboxd" in cmdline.read(4096)
    except OSError:
        return False
