"""One command's life as the daemon follows it: starting, running, exited, and the status it ends with."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from collections.abc import Callable

import structlog

from ..agent import ExitReport
from ..errors import FailedPreconditionError, SandboxdError
from ..models import ExitStatus, StopReason
from .rules import exit_status

__all__ = ["CommandState"]

log = structlog.get_logger("sandboxd.processes")


class _Phase(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    EXITED = "exited"


class CommandState:
    """The state machine of one command and its terminal :class:`ExitStatus`.

    The status is set once: the first end reported wins (the agent's exit report, a
    failure to start, or a failure of the session). Its message and spill path go through
    ``mask`` first, as they may carry text from the container.

    Args:
        process_id: the session's id, for the log.
        workspace_id: its workspace, for the log.
        mask: hides the tenant's secrets in a text.
    """

    def __init__(self, *, process_id: str, workspace_id: str, mask: Callable[[str], str]) -> None:
        """Begin as starting (call from the event loop: the start is a future of it)."""
        self._process_id = process_id
        self._workspace_id = workspace_id
        self._mask = mask
        self._phase = _Phase.STARTING
        self.started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Resolved once the command runs; failed with the error a start ends with."""
        # A start abandoned by its caller fails with nobody awaiting it: that is no error to log.
        self.started.add_done_callback(lambda done: done.cancelled() or done.exception())
        self.exited = asyncio.Event()
        """Set once the status is known."""
        self.exit: ExitStatus | None = None
        """The exit status, once known (callers get it after the output)."""
        self.requested: set[StopReason] = set()
        """Why the daemon asked the command to end (a kill, a timeout...): the stop reason's candidates."""
        self.ctrl_c_delivered = False
        """A Ctrl-C reached the command (see ``exit_status``)."""
        self.leftovers = 0
        """Processes of the command still alive when it exited (its timeout still bounds them)."""
        self._agent_dropped: int | None = None
        """The agent's count of dropped bytes in its exit report."""
        self._started_at = time.monotonic()

    @property
    def running(self) -> bool:
        """Whether the top-level command still runs (or is starting)."""
        return self._phase is not _Phase.EXITED

    @property
    def elapsed_s(self) -> float:
        """Seconds since the command started."""
        return time.monotonic() - self._started_at

    def run(self) -> None:
        """The command runs (the agent said so, or a restarted daemon took it over)."""
        if self._phase is _Phase.STARTING:
            self._phase = _Phase.RUNNING
        if not self.started.done():
            self.started.set_result(None)

    def report(self, report: ExitReport, *, memory_limit_bytes: int, trimmed_bytes: int) -> None:
        """The agent's exit report; ``trimmed_bytes`` of output the daemon dropped count as dropped too."""
        self.leftovers = report.leftovers
        if self.exit is None:
            self._agent_dropped = report.dropped
        if report.timed_out:
            self.requested.add(StopReason.TIMEOUT)
        if report.killed:
            # Asked for by a daemon before this one (a drain's Kill): a reason this daemon
            # asked for itself (Ctrl-C's escalation, a timeout) still comes first.
            self.requested.add(StopReason.KILLED)
        self.finish(
            exit_status(
                spill_path=report.spill_path,
                exit_code=report.exit_code,
                signal_number=report.signal,
                oom_kills=report.oom_kills,
                memory_limit_bytes=memory_limit_bytes,
                requested=self.requested,
                dropped_bytes=report.dropped + trimmed_bytes,
                elapsed_s=self.elapsed_s,
                ctrl_c_delivered=self.ctrl_c_delivered,
            )
        )

    def count_trimmed(self, trimmed_bytes: int) -> None:
        """The exit's dropped count: the agent's, and what trims dropped since (undone by a rewind)."""
        if self.exit is not None and self._agent_dropped is not None:
            self.exit = dataclasses.replace(self.exit, dropped_bytes=self._agent_dropped + trimmed_bytes)

    def fail_start(self, error: SandboxdError) -> None:
        """The command never ran: its start fails with ``error`` (masked), and it ends as ``failed``, 127."""
        # Its text comes from the container (a command can make its start fail with any message).
        error.message = self._mask(error.message)
        error.args = (error.message,)
        if not self.started.done():
            self.started.set_exception(error)
        self.finish(
            ExitStatus(exit_code=127, stop_reason=StopReason.FAILED, elapsed_s=self.elapsed_s, message=error.message)
        )

    def fail(self, message: str, *, dropped_bytes: int) -> None:
        """End without an exit report from the agent: ``failed``, 255 (a start not yet answered fails)."""
        if not self.started.done():
            self.fail_start(FailedPreconditionError(message))
            return
        self.requested.add(StopReason.FAILED)
        self.finish(
            exit_status(
                exit_code=255,
                signal_number=0,
                oom_kills=0,
                memory_limit_bytes=0,
                requested=self.requested,
                dropped_bytes=dropped_bytes,
                elapsed_s=self.elapsed_s,
                message=message,
            )
        )

    def finish(self, status: ExitStatus) -> None:
        """Set the terminal status, unless one is set already; log it."""
        if self.exit is not None:
            return
        # Messages and paths may carry text from the container: secrets never leave in them.
        self.exit = status = dataclasses.replace(
            status, message=self._mask(status.message), spill_path=self._mask(status.spill_path)
        )
        self._phase = _Phase.EXITED
        self.exited.set()
        log.info(
            "process.exited",
            process_id=self._process_id,
            workspace_id=self._workspace_id,
            exit_code=status.exit_code,
            signal=status.signal,
            stop_reason=str(status.stop_reason),
            oom_killed=status.oom_killed,
            dropped_bytes=status.dropped_bytes,
            leftovers=self.leftovers,
            duration_s=round(status.elapsed_s, 3),
        )
