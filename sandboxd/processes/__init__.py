"""Process sessions: commands running in workspaces, run by each workspace's agent.

A :class:`ProcessSession` is one command on one channel of the workspace's
:class:`~sandboxd.agent.AgentLink`. The agent runs it, keeps its output until
callers have taken it (bounded, head kept, drops counted), and enforces its
timeout; Exec and Input calls attach to the session and stream that output until
the command exits or the caller's yield window closes. The :class:`ProcessTable`
holds at most ``max_sessions`` sessions, a fair share per tenant, and evicts
exited ones first, then the least recently used idle one. Sessions
outlive the daemon: a restarted daemon adopts them from the agents.

Modules, lowest first: ``rules`` (the pure rules: yield windows, Ctrl-C, exit statuses),
``context`` (a workspace's facts and the start request), ``flow`` (the window and
acknowledgements the agent is told), ``state`` (a command's state machine and exit status),
``stream`` (the calls that stream a session's output, and what a caller leaving means),
``session`` (one command), ``table`` (all of them).
"""

from __future__ import annotations

from sandboxd_protocol.limits import MAX_COMMAND_BYTES, MAX_INPUT_BYTES

from .context import NON_INTERACTIVE_ENV, ExecContext
from .rules import (
    CTRL_C,
    CTRL_C_EXIT_WAIT_S,
    INPUT_POLL_YIELD_S,
    INPUT_WRITE_YIELD_S,
    MARKER_ENV,
    MAX_KILL_GRACE_S,
    MAX_TERMINAL_CELLS,
    MIN_YIELD_S,
    InterruptPlan,
    check_env,
    clamp_yield,
    exit_status,
    input_window,
    interrupt_plan,
)
from .session import ProcessSession
from .table import ProcessTable

__all__ = [
    "CTRL_C",
    "CTRL_C_EXIT_WAIT_S",
    "INPUT_POLL_YIELD_S",
    "INPUT_WRITE_YIELD_S",
    "MARKER_ENV",
    "MAX_COMMAND_BYTES",
    "MAX_INPUT_BYTES",
    "MAX_KILL_GRACE_S",
    "MAX_TERMINAL_CELLS",
    "MIN_YIELD_S",
    "NON_INTERACTIVE_ENV",
    "ExecContext",
    "InterruptPlan",
    "ProcessSession",
    "ProcessTable",
    "check_env",
    "clamp_yield",
    "exit_status",
    "input_window",
    "interrupt_plan",
]
