"""The rules of a command's calls, pure and tested alone: yield windows, Ctrl-C, exit statuses, env checks."""

from __future__ import annotations

import enum
import re
import signal
from collections.abc import Mapping

from sandboxd_protocol.limits import MAX_ENV_BYTES, MAX_ENV_ENTRIES, utf8_size

from ..errors import FailedPreconditionError, InvalidSpecError, QuotaExceededError, SandboxdError, quoted
from ..models import ExitStatus, StopReason, signal_name

__all__ = [
    "CTRL_C",
    "CTRL_C_EXIT_WAIT_S",
    "DEFAULT_YIELD_S",
    "INPUT_POLL_YIELD_S",
    "INPUT_WRITE_YIELD_S",
    "MARKER_ENV",
    "MAX_KILL_GRACE_S",
    "MAX_TERMINAL_CELLS",
    "MIN_YIELD_S",
    "SPILL_DIR",
    "InterruptPlan",
    "check_env",
    "clamp_yield",
    "exit_status",
    "input_window",
    "interrupt_plan",
    "start_error",
]

MARKER_ENV = "SANDBOXD_PROCESS_ID"
"""Environment entry every process of a command inherits; teardown finds strays by it."""

SPILL_DIR = "/workspace/.sandboxd/spill"
"""Where spill files go: on the workspace volume, readable with read_file."""

MAX_TERMINAL_CELLS = 10_000
"""Largest terminal width or height accepted, in character cells."""


MIN_YIELD_S = 0.25
"""Shortest yield window: 250 ms."""

DEFAULT_YIELD_S = 60.0
"""Exec yield window when the caller sets none: 60000 ms."""

INPUT_WRITE_YIELD_S = 0.25
"""Input window after a write when the caller sets none: 250 ms."""

INPUT_POLL_YIELD_S = 5.0
"""Input window of a pure poll when the caller sets none: 5000 ms."""

CTRL_C_EXIT_WAIT_S = 1.0
"""Shortest window of an Input call that delivers Ctrl-C, in seconds. Dying of SIGINT takes a
loaded machine longer than the 250 ms of a write; the call still returns the moment the command
exits, and a command that survives Ctrl-C (a REPL) costs the call this long at most."""

CTRL_C = "\u0003"
"""Input ``chars`` that mean Ctrl-C, when they are all the call writes."""

_STOP_PRIORITY = (StopReason.INTERRUPTED, StopReason.TIMEOUT, StopReason.FAILED, StopReason.KILLED)


MAX_KILL_GRACE_S = 60.0
"""Longest grace a Kill may ask for between SIGTERM and SIGKILL (a ladder always ends)."""


def clamp_yield(requested_s: float | None, timeout_s: float, default_s: float = DEFAULT_YIELD_S) -> float:
    """Clamp a yield window to ``[250 ms, timeout - 1 s]``.

    Args:
        requested_s: the caller's window in seconds, or None for ``default_s``.
        timeout_s: the command's timeout in seconds.
        default_s: window used when none is requested.

    Returns:
        The window in seconds; never below 0.25 even when the timeout is shorter.
    """
    window = default_s if requested_s is None else requested_s
    return max(MIN_YIELD_S, min(window, timeout_s - 1.0))


def input_window(requested_s: float | None, *, wrote: bool, ctrl_c: bool, timeout_s: float) -> float:
    """The window of one Input call, in seconds.

    Args:
        requested_s: the caller's window, or None for the default: 250 ms after
            a write (chars, raw data or closing stdin), 5 s for a pure poll.
        wrote: the call writes something.
        ctrl_c: the call delivers Ctrl-C; its window is then at least ``CTRL_C_EXIT_WAIT_S``,
            so that the death it causes is usually seen in the same call.
        timeout_s: the command's timeout (the window stays a second under it).

    Returns:
        The window, clamped like :func:`clamp_yield`.
    """
    default_s = INPUT_WRITE_YIELD_S if wrote or ctrl_c else INPUT_POLL_YIELD_S
    window = clamp_yield(requested_s, timeout_s, default_s=default_s)
    return max(window, CTRL_C_EXIT_WAIT_S) if ctrl_c else window


def exit_status(
    *,
    exit_code: int,
    signal_number: int,
    oom_kills: int,
    memory_limit_bytes: int,
    requested: set[StopReason],
    dropped_bytes: int,
    elapsed_s: float,
    message: str = "",
    spill_path: str = "",
    ctrl_c_delivered: bool = False,
) -> ExitStatus:
    """Build the terminal status from the agent's report.

    A death by signal N is exit code 128+N with the signal's name. A shell's own
    exit code 129..192 is read the same way: that is how a shell reports a child
    killed by a signal. OOM is claimed only when the cgroup counted an OOM kill
    while the command ran and the command died of SIGKILL.

    ``ctrl_c_delivered``: a Ctrl-C reached the command at some point. The stop reason is
    ``interrupted`` exactly when the command then died of SIGINT (or its shell reports 130),
    whenever that is observed: also after the Ctrl-C call itself yielded (a loaded machine
    may take longer than its window to deliver the death). A command that caught the Ctrl-C
    keeps its own reason however it ends later, and whichever call sees it end: a trap that
    exits 42, a REPL that exits 0 (``exited``), a Kill (``killed``), a timeout (``timeout``).
    """
    number = signal_number
    if not number and 128 < exit_code <= 128 + 64:
        number = exit_code - 128
    oom = oom_kills > 0 and number == signal.SIGKILL
    if ctrl_c_delivered and number == signal.SIGINT:
        requested = requested | {StopReason.INTERRUPTED}
    reason = next((r for r in _STOP_PRIORITY if r in requested), StopReason.EXITED)
    return ExitStatus(
        exit_code=exit_code,
        signal=signal_name(number) if number else "",
        stop_reason=reason,
        oom_killed=oom,
        memory_limit_bytes=memory_limit_bytes if oom else 0,
        dropped_bytes=dropped_bytes,
        elapsed_s=elapsed_s,
        message=message or (f"killed by the OOM killer (memory limit {memory_limit_bytes} bytes)" if oom else ""),
        spill_path=spill_path,
    )


_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_env(env: Mapping[str, str], field: str, *, max_bytes: int = MAX_ENV_BYTES) -> None:
    """Reject environment names that are not POSIX names, values holding NUL, and oversized maps.

    Args:
        env: the variables.
        field: the request field, named in the message.
        max_bytes: most bytes of all ``NAME=value`` entries together
            (``sandboxd_protocol.limits``: 128 KiB for a call, 32 KiB for a workspace).

    Raises:
        InvalidSpecError: naming ``field`` and the offending variable or the size.
    """
    if len(env) > MAX_ENV_ENTRIES:
        msg = f"{field} has {len(env)} variables; the limit is {MAX_ENV_ENTRIES}"
        raise InvalidSpecError(msg)
    size = sum(utf8_size(key) + utf8_size(value) + 1 for key, value in env.items())
    if size > max_bytes:
        msg = f"{field} is {size} bytes (names and values); the limit is {max_bytes}"
        raise InvalidSpecError(msg)
    for key, value in env.items():
        if not _ENV_NAME_RE.fullmatch(key):
            msg = f"{field} name {quoted(key)} is not a valid environment variable name"
            raise InvalidSpecError(msg)
        if "\0" in value:
            msg = f"{field} value of {quoted(key)} contains a NUL character"
            raise InvalidSpecError(msg)


class InterruptPlan(enum.Enum):
    """How Ctrl-C reaches a command."""

    PROCESS_GROUP = "SIGINT to the command's process group"
    TERMINAL = "ETX written to the terminal; the line discipline signals the foreground group"
    TREE_KILL = "the whole tree killed: console signals cannot reach a Windows command's pipes"


def interrupt_plan(os_name: str, *, tty: bool) -> InterruptPlan:
    """Choose how Ctrl-C is delivered, from the container's OS.

    On Windows the agent's tree kill (a Job Object, else ``taskkill /T /F``) stands in for
    Ctrl-C, which cannot reach processes whose console is a pipe.
    """
    if os_name.lower() == "windows":
        return InterruptPlan.TREE_KILL
    return InterruptPlan.TERMINAL if tty else InterruptPlan.PROCESS_GROUP


def start_error(stage: str, detail: str) -> SandboxdError:
    """The error an Exec call gets for a command the agent could not start.

    Args:
        stage: where the start failed, as the agent says (``fork``, ``died``, ``chdir``,
            ``exec``, ``user``...).
        detail: the agent's message (already cut to length).

    Returns:
        ``QuotaExceededError`` when the workspace is out of processes or memory (``fork``,
        ``died``); ``InvalidSpecError`` when the working directory, the shell or the user
        cannot be used; else ``FailedPreconditionError``.
    """
    message = f"cannot start the command: {detail}"
    if stage in {"fork", "died"}:  # out of processes (or memory): the workspace's limits
        return QuotaExceededError(message)
    if stage in {"chdir", "exec", "user"}:
        return InvalidSpecError(message)
    return FailedPreconditionError(message)
