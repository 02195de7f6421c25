"""The daemon's table of process sessions: caps, tenants' shares, eviction, adoption after a restart."""

from __future__ import annotations

import asyncio
import builtins
import collections
import dataclasses
import datetime
import re
import secrets
from collections.abc import Mapping

import structlog
from sandboxd_protocol.limits import MAX_COMMAND_BYTES, MAX_ID_BYTES, MAX_PATH_BYTES, utf8_size

from .. import metrics
from ..agent import Welcome
from ..backend.base import Backend
from ..errors import InvalidSpecError, ProcessNotFoundError, QuotaExceededError
from ..models import ExecSpec, ExecStarted, StopReason
from ..settings import Settings
from ..tenancy import current_tenant
from .context import ExecContext
from .flow import OutputBudget
from .rules import MAX_TERMINAL_CELLS, check_env
from .session import ProcessSession

__all__ = ["ProcessTable"]

log = structlog.get_logger("sandboxd.processes")

_PROCESS_ID_RE = re.compile(r"^p-[0-9a-f]{12}$")


def _new_process_id() -> str:
    """A fresh process id (``_PROCESS_ID_RE``)."""
    return f"p-{secrets.token_hex(6)}"


class ProcessTable:
    """All live process sessions of the daemon, at most ``workspace_max_sessions`` per workspace.

    The cap is one agent environment's: each workspace holds at most that many live
    sessions, whatever other workspaces hold. A tenant may be capped across its workspaces
    too (``tenant_max_sessions``). A session belongs to its workspace's tenant: other tenants
    get NOT_FOUND. After a restart, :meth:`adopt` takes over the sessions each workspace's
    agent kept.

    Eviction, when a new command finds its workspace (or its tenant) at its cap: an exited
    session first (the least recently used), else the least recently used idle one, whose
    whole tree is killed. A session a call is streaming, or whose starting call has not
    streamed yet, is never evicted: its caller is about to read it. An evicted id stays
    known, so that later calls get NOT_FOUND saying it was evicted.
    """

    def __init__(self, backend: Backend, settings: Settings) -> None:
        """Create an empty table.

        Args:
            backend: the container engine.
            settings: the caps (``workspace_max_sessions``, ``tenant_max_sessions``).
        """
        self.backend = backend
        self.settings = settings
        self._sessions: dict[str, ProcessSession] = {}
        self._stopping = False
        self._evicted: collections.OrderedDict[str, tuple[str, str]] = collections.OrderedDict()
        """Ids no longer in the table: why (a sentence's predicate) and the tenant that may hear it."""
        self._lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()
        self.budget = OutputBudget(settings.output_memory_bytes)
        """The daemon's budget for held output, which every session's output counts against."""

    def get(self, process_id: str) -> ProcessSession:
        """Return a session.

        Raises:
            ProcessNotFoundError: unknown id, or evicted (the message says which).
        """
        if utf8_size(process_id) > MAX_ID_BYTES:
            msg = f"process_id is {utf8_size(process_id)} bytes; process ids are at most {MAX_ID_BYTES}"
            raise InvalidSpecError(msg)
        session = self._sessions.get(process_id)
        tenant = current_tenant()
        if session is not None and session.context.tenant == tenant:
            return session
        if session is None and process_id in self._evicted and self._evicted[process_id][1] == tenant:
            msg = f"process {process_id} {self._evicted[process_id][0]}"
            raise ProcessNotFoundError(msg)
        msg = f"process {process_id!r} not found"
        raise ProcessNotFoundError(msg)

    def list(self, workspace_id: str) -> list[ProcessSession]:
        """Return the sessions of one workspace, oldest first."""
        return [s for s in self._sessions.values() if s.context.workspace_id == workspace_id]

    def session_counts(self) -> dict[str, int]:
        """How many sessions the table holds, running and exited (for the metrics)."""
        running = sum(1 for s in self._sessions.values() if s.exit is None)
        return {"running": running, "exited": len(self._sessions) - running}

    def check_spec(self, spec: ExecSpec) -> None:
        """Check every field of an Exec against its bound (``sandboxd_protocol.limits``), before any work.

        Raises:
            InvalidSpecError: naming the field, its size and its bound.
        """
        if not 0 <= spec.max_output_bytes <= self.settings.max_output_buffer_bytes:
            msg = (
                f"max_output_bytes must be 0 (the daemon default) to {self.settings.max_output_buffer_bytes} "
                f"(SANDBOXD_MAX_OUTPUT_BUFFER_BYTES), got {spec.max_output_bytes}"
            )
            raise InvalidSpecError(msg)
        if spec.spill_after_bytes < 0:
            msg = f"spill_after_bytes must not be negative, got {spec.spill_after_bytes}"
            raise InvalidSpecError(msg)
        if spec.timeout_s is not None and not 0 < spec.timeout_s <= self.settings.max_exec_timeout_s:
            msg = (
                f"timeout must be more than 0 s and at most {self.settings.max_exec_timeout_s:g} s, "
                f"got {spec.timeout_s:g} s"
            )
            raise InvalidSpecError(msg)
        if not (1 <= spec.columns <= MAX_TERMINAL_CELLS and 1 <= spec.rows <= MAX_TERMINAL_CELLS):
            msg = f"terminal size must be 1..{MAX_TERMINAL_CELLS} columns and rows, got {spec.columns}x{spec.rows}"
            raise InvalidSpecError(msg)
        if utf8_size(spec.command) > MAX_COMMAND_BYTES:
            msg = (
                f"command is {utf8_size(spec.command)} bytes; the limit is "
                f"{MAX_COMMAND_BYTES}; write long scripts to a file first"
            )
            raise InvalidSpecError(msg)
        if not spec.command.strip():
            msg = "command must not be empty"
            raise InvalidSpecError(msg)
        if utf8_size(spec.workdir) > MAX_PATH_BYTES:
            msg = f"workdir is {utf8_size(spec.workdir)} bytes; the limit is {MAX_PATH_BYTES}"
            raise InvalidSpecError(msg)
        if "\0" in spec.command or "\0" in spec.workdir:
            msg = "command and workdir must not contain NUL characters"
            raise InvalidSpecError(msg)
        check_env(spec.env, "env")

    async def start(self, context: ExecContext, spec: ExecSpec) -> tuple[ProcessSession, ExecStarted]:
        """Start a command as a new session, evicting one first when the table is full.

        Raises:
            InvalidSpecError: a field out of its bound (:meth:`check_spec`, checked again here
                so that no caller can skip it), or an unknown secret reference.
            QuotaExceededError: no session can be made room for.
        """
        self.check_spec(spec)
        context.secrets.check(spec.env, "env", context.tenant)
        async with self._lock:
            workspace_cap = self.settings.workspace_max_sessions
            tenant_cap = self.settings.tenant_max_sessions
            while True:
                ours = [s for s in self._sessions.values() if s.context.workspace_id == context.workspace_id]
                if len(ours) >= workspace_cap:
                    full = f"workspace {context.workspace_id!r} is at its {workspace_cap} process sessions"
                    self._evict_one(ours, full, whose="its workspace's")
                    continue
                if tenant_cap:
                    theirs = [s for s in self._sessions.values() if s.context.tenant == context.tenant]
                    if len(theirs) >= tenant_cap:
                        full = f"tenant {context.tenant!r} is at its {tenant_cap} process sessions"
                        self._evict_one(theirs, full, whose="its tenant's")
                        continue
                break
            process_id = _new_process_id()
            session = ProcessSession(
                link=context.link,
                context=context,
                spec=spec,
                settings=self.settings,
                process_id=process_id,
                background=self._retiring,
                budget=self.budget,
            )
            self._sessions[process_id] = session
            session.shutting_down = self._stopping
        try:
            started = await session.start()
        except BaseException:
            self._sessions.pop(process_id, None)
            raise
        return session, started

    def _evict_one(self, sessions: builtins.list[ProcessSession], full: str, *, whose: str) -> None:
        """Take one of ``sessions`` (a full workspace's, or a full tenant's) out of the table now.

        It is killed in the background.

        The tool contract's order: an exited session first, else the least recently used
        idle one (both by when a call last used them). A session a call is streaming, or
        whose starting call has not streamed yet, is no candidate: its caller is about to
        read it (an exited one may still be delivering its last output). Sessions taken over
        from a restart in the last moments come after the others of their kind (their callers may
        be coming back to resume them), the one that started first first; an exited one still goes
        before any running one.

        Raises:
            QuotaExceededError: nothing may go: every session is in use by a call.
        """
        adopted = [s for s in sessions if s.detached and not s.idle]
        candidates = (
            ([s for s in sessions if not s.running and s.idle], f"it had exited and {whose} sessions were full"),
            # Taken over from a restart moments ago: an exited one goes before any running one, the
            # oldest first, since a caller coming back to resume is one whose command ran last.
            (
                [s for s in adopted if not s.running],
                f"it had exited before the daemon restarted and {whose} sessions were full",
            ),
            (
                [s for s in sessions if s.running and s.idle],
                f"it was the least recently used idle session when {whose} sessions were full",
            ),
            (
                [s for s in adopted if s.running],
                f"it was the oldest session taken over at the daemon's restart when {whose} sessions were full",
            ),
        )
        found = next((tier for tier, (group, _why) in enumerate(candidates) if group), None)
        if found is None:
            msg = f"{full} and none can be evicted: all {len(sessions)} are in use by active calls"
            raise QuotaExceededError(msg)
        group, why = candidates[found]
        # Adopted sessions were all last used at the adoption: their start says which is oldest.
        victim = min(group, key=(lambda s: s.start_time) if found in (1, 3) else (lambda s: s.last_used))
        self._sessions.pop(victim.process_id, None)
        self._remember_evicted(victim.process_id, f"was evicted: {why}", victim.context.tenant)
        log.info("process.evicted", process_id=victim.process_id, reason=why)
        metrics.SESSIONS_EVICTED.inc()
        task = asyncio.create_task(self._retire(victim))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, victim: ProcessSession) -> None:
        if victim.running:
            await victim.kill(reason=StopReason.KILLED)
        await victim.discard()

    def _remember_evicted(self, process_id: str, why: str, tenant: str) -> None:
        self._evicted[process_id] = (why, tenant)
        while len(self._evicted) > 4096:
            self._evicted.popitem(last=False)

    def drop(self, session: ProcessSession) -> None:
        """Take a session of the daemon's own out of the table, leaving no trace of it."""
        if self._sessions.get(session.process_id) is session:
            del self._sessions[session.process_id]

    async def forget_workspace(self, workspace_id: str, why: str) -> None:
        """Drop every session of a workspace (its container is going away)."""
        for session in self.list(workspace_id):
            self._sessions.pop(session.process_id, None)
            self._remember_evicted(session.process_id, f"was evicted: {why}", session.context.tenant)
            await session.close(why)

    def adopt(
        self, context: ExecContext, welcome: Welcome, origin: tuple[str, str] | None = None
    ) -> builtins.list[str]:
        """Take over the sessions a workspace's agent kept while no daemon was connected.

        Each comes back with its process id, its exit status if it has one, and its output
        from the exact byte callers had taken. Sessions this table follows already, and
        those of another workspace or container, are left alone, but for those of
        ``origin`` (``(workspace_id, container_id)``: the source of a workspace restored from a
        memory snapshot), which become this workspace's under new process ids; the agent is
        told their new names (``Kind.RENAME``), so it gives them so from then on.

        Returns:
            The process ids adopted.
        """
        adopted = []
        for state in welcome.sessions:
            saved = state.daemon_state
            if origin is not None and (saved.get("workspace_id"), saved.get("container_id")) == origin:
                saved = {**saved, "workspace_id": context.workspace_id, "container_id": context.container_id}
                state = dataclasses.replace(state, process_id=_new_process_id(), daemon_state=saved)
                context.link.rename(state.channel, state.process_id, saved)
            if not _PROCESS_ID_RE.fullmatch(state.process_id) or state.process_id in self._sessions:
                continue
            if saved.get("workspace_id") != context.workspace_id or saved.get("container_id") != context.container_id:
                continue
            try:
                spec = ExecSpec(
                    command=str(saved.get("command", "")),
                    tty=bool(saved.get("tty")),
                    columns=int(saved.get("columns") or 80),
                    rows=int(saved.get("rows") or 24),
                    timeout_s=float(saved.get("timeout_s") or self.settings.exec_timeout_s),
                    max_output_bytes=int(saved.get("max_output_bytes") or 0),
                    spill_after_bytes=int(saved.get("spill_after_bytes") or 0),
                    merge_stderr=bool(saved.get("merge_stderr")),
                )
                start_time = datetime.datetime.fromisoformat(str(saved.get("start_time")))
            except (ValueError, TypeError) as exc:
                log.warning("process.adopt_failed", process_id=state.process_id, error=str(exc))
                continue
            session = ProcessSession(
                link=context.link,
                context=context,
                spec=spec,
                settings=self.settings,
                process_id=state.process_id,
                background=self._retiring,
                budget=self.budget,
            )
            session.start_time = start_time
            session.adopt(state)
            self._sessions[state.process_id] = session
            session.shutting_down = self._stopping
            adopted.append(state.process_id)
        if adopted:
            log.info("process.adopted", workspace_id=context.workspace_id, process_ids=adopted)
        return adopted

    def yield_all(self) -> None:
        """The daemon's grace is over: every call streaming a command yields now, with its process id.

        The caller polls that process id again once a daemon serves: the command runs on,
        for the next daemon to adopt; nothing is interrupted.
        """
        self.stop_interrupting()
        for session in list(self._sessions.values()):
            session.yield_now = True
            session.output.changed.set()

    def stop_interrupting(self) -> None:
        """The daemon is stopping: a stream that ends now (its call ended by the stop) Ctrl-Cs nothing.

        A caller who leaves an exec's stream early means Ctrl-C; a daemon that stops
        does not: its commands run on, for the next daemon to adopt.
        """
        self._stopping = True
        for session in list(self._sessions.values()):
            session.shutting_down = True

    async def close(self) -> None:
        """Release every session's stream; the commands themselves keep running (each under its timeout)."""
        self.stop_interrupting()
        for session in list(self._sessions.values()):
            await session.close("the daemon is shutting down")
        self._sessions.clear()
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)

    def sessions(self) -> Mapping[str, ProcessSession]:
        """Read-only view of all sessions."""
        return dict(self._sessions)
