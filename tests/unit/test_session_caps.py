"""The session table's caps: per workspace (and per tenant when set), and what eviction may take."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from sandboxd.errors import ProcessNotFoundError, QuotaExceededError
from sandboxd.processes import ProcessTable
from sandboxd.settings import Settings


@dataclasses.dataclass
class Context:
    workspace_id: str
    tenant: str = "default"


@dataclasses.dataclass
class Session:
    """What the table's eviction reads of a session: its state, whether a call holds it, its last use."""

    process_id: str
    context: Context
    running: bool
    idle: bool
    last_used: float
    killed: bool = False
    adopted: bool = False
    """Taken over from a restart moments ago: detached, but not idle."""
    start_time: float = 0.0

    @property
    def detached(self) -> bool:
        return self.idle or self.adopted

    async def kill(self, **_: object) -> None:
        self.killed = True

    async def discard(self) -> None:
        pass


def table(**settings: object) -> ProcessTable:
    return ProcessTable(None, Settings(**settings))  # type: ignore[arg-type]


async def evict(processes: ProcessTable, sessions: list[Session]) -> str:
    """Evict one of ``sessions`` as a full workspace does; the id that went."""
    for session in sessions:
        processes._sessions[session.process_id] = session  # type: ignore[assignment]
    processes._evict_one(sessions, "workspace 'ws' is at its cap", whose="its workspace's")  # type: ignore[arg-type]
    await asyncio.gather(*processes._retiring)
    (gone,) = {s.process_id for s in sessions} - set(processes._sessions)
    return gone


class TestEviction:
    async def test_an_exited_session_a_call_still_streams_is_never_evicted(self) -> None:
        """The exited session whose caller is still taking its output stays; an idle one goes."""
        ws = Context("ws")
        streamed = Session("p-000000000001", ws, running=False, idle=False, last_used=1.0)
        idle_exited = Session("p-000000000002", ws, running=False, idle=True, last_used=5.0)
        processes = table()
        assert await evict(processes, [streamed, idle_exited]) == idle_exited.process_id
        with pytest.raises(ProcessNotFoundError, match="was evicted: it had exited and its workspace's sessions"):
            processes.get(idle_exited.process_id)

    async def test_exited_first_then_the_least_recently_used_idle_one(self) -> None:
        ws = Context("ws")
        old_running = Session("p-000000000001", ws, running=True, idle=True, last_used=1.0)
        exited = Session("p-000000000002", ws, running=False, idle=True, last_used=9.0)
        newer_running = Session("p-000000000003", ws, running=True, idle=True, last_used=5.0)
        processes = table()
        assert await evict(processes, [old_running, exited, newer_running]) == exited.process_id
        assert await evict(processes, [old_running, newer_running]) == old_running.process_id
        assert old_running.killed

    async def test_sessions_taken_over_at_a_restart_go_last_the_oldest_first(self) -> None:
        """After a restart a caller may come back for its session: any idle one goes before it; among
        adopted ones only, the exited one that started first goes (the caller coming back ran last)."""
        ws = Context("ws")
        awaited = Session("p-000000000001", ws, running=False, idle=False, adopted=True, last_used=1.0, start_time=9.0)
        older = Session("p-000000000002", ws, running=False, idle=False, adopted=True, last_used=2.0, start_time=1.0)
        running = Session("p-000000000003", ws, running=True, idle=False, adopted=True, last_used=0.5, start_time=0.5)
        used_since = Session("p-000000000004", ws, running=False, idle=True, last_used=50.0)
        processes = table()
        assert await evict(processes, [awaited, older, running, used_since]) == used_since.process_id
        assert await evict(processes, [awaited, older, running]) == older.process_id
        assert await evict(processes, [awaited, running]) == awaited.process_id
        with pytest.raises(ProcessNotFoundError, match="had exited before the daemon restarted"):
            processes.get(awaited.process_id)
        assert await evict(processes, [running]) == running.process_id and running.killed

    async def test_an_exited_session_taken_over_goes_before_a_running_one(self) -> None:
        """A restart's old exited sessions make room before a command still running (a background
        counter a caller polls later) does."""
        ws = Context("ws")
        old_exited = Session("p-000000000001", ws, running=False, idle=False, adopted=True, last_used=1.0)
        counting = Session("p-000000000002", ws, running=True, idle=True, last_used=0.5)
        assert await evict(table(), [old_exited, counting]) == old_exited.process_id

    async def test_nothing_in_use_by_a_call_goes_and_the_refusal_says_why(self) -> None:
        ws = Context("ws")
        busy = [Session(f"p-00000000000{i}", ws, running=i % 2 == 0, idle=False, last_used=i) for i in range(3)]
        with pytest.raises(QuotaExceededError, match="none can be evicted: all 3 are in use by active calls"):
            await evict(table(), busy)
