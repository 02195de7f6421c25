"""Inspect's ``exec``: an argv run as ``bash -lc`` in a workspace, with stdin, limits and kills.

The daemon runs a command line; Inspect hands an argv. It is shell-quoted, and a line past the
daemon's bound goes through a script file that the command checks against its hash before it
runs (see :func:`_long_command`). Output comes on the Exec stream (and, now and then, on an Input
call that feeds stdin); it is joined by position and held to Inspect's limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import re
import secrets
import shlex
import time
from collections.abc import Awaitable, Mapping
from typing import Any

from inspect_ai.util import ExecResult, OutputLimitExceededError, SandboxEnvironmentLimits
from sandboxd_protocol.limits import MAX_COMMAND_BYTES, MAX_INPUT_BYTES

from .._client import SandboxClient
from .._exec import ExecHandle, Exited, Output, Started
from ..errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    SandboxError,
)

__all__ = ["MAX_TIMEOUT_S", "run_command", "shielded"]

MAX_TIMEOUT_S = 86400.0
"""What ``timeout=None`` (no limit, to Inspect) becomes: the daemon's default ceiling, a day."""
_COMMAND_ROOM = MAX_COMMAND_BYTES - 4096  # the daemon's bound, less the script-checking line
_STARTED_NOT = "cannot start the command"  # how the daemon's refusal of a start begins
_SESSIONS_WAIT_S = 300.0  # how long an exec waits for its workspace's session cap to free a slot
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The command's own wrappers run with its user's authority: never through the image's PATH.
_SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class _Collected:
    """A command's output as it comes, from however many calls carry it, held to Inspect's limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[tuple[int, str, bytes]] = []
        self.sizes = {"stdout": 0, "stderr": 0}
        self.exited: Exited | None = None
        self.process_id = ""
        self.over: str | None = None
        """The stream that passed the limit first (None: neither did)."""

    def take(self, event: object) -> None:
        if isinstance(event, Started):
            self.process_id = event.process_id
        elif isinstance(event, Output) and event.data:
            self.chunks.append((event.position, event.stream, event.data))
            self.sizes[event.stream] += len(event.data)
            if self.sizes[event.stream] > self.limit and self.over is None:
                self.over = event.stream
        elif isinstance(event, Exited):
            self.exited = event

    def text(self, stream: str) -> str:
        data = b"".join(d for _, s, d in sorted(self.chunks, key=lambda c: c[0]) if s == stream)
        return data[: self.limit].decode("utf-8", errors="replace")


async def run_command(
    client: SandboxClient,
    workspace_id: str,
    cmd: list[str],
    *,
    input: str | bytes | None,
    workdir: str,
    env: Mapping[str, str] | None,
    user: str | None,
    timeout: int | None,
) -> ExecResult[str]:
    """Run ``cmd`` and return Inspect's result (see ``SandboxdSandboxEnvironment.exec``).

    Raises:
        ValueError: an empty ``cmd``, or a request the daemon refuses (an env name, a size).
        UnicodeEncodeError: ``input`` is text that is not Unicode (a lone surrogate).
        TimeoutError: ``timeout`` passed (at once for 0 or less).
        OutputLimitExceededError: stdout or stderr passed Inspect's limit.
        PermissionError: ``cmd[0]`` is not executable.
        NotFoundError, UnavailableError: the workspace is gone, the daemon does not answer.
        RuntimeError: the workspace's session cap stayed full for 5 minutes.
    """
    if not cmd:
        msg = "cmd must name a command"
        raise ValueError(msg)
    data = input.encode() if isinstance(input, str) else (input or b"")  # an encoding error, before anything starts
    if timeout is not None and timeout <= 0:
        msg = f"Command timed out after {timeout} seconds"
        raise TimeoutError(msg)
    line, variables = _line(cmd, env or {})
    script = ""
    if len(line.encode()) > _COMMAND_ROOM:
        script = f"/tmp/.inspect-{secrets.token_hex(8)}.sh"
        line = await _long_command(client, workspace_id, line, script)
    began = time.monotonic()
    try:
        collected = await _started(
            client,
            workspace_id,
            line,
            data,
            workdir=workdir,
            env=variables,
            user=user or "",
            timeout_s=min(float(timeout), MAX_TIMEOUT_S) if timeout is not None else MAX_TIMEOUT_S,
        )
    except InvalidArgumentError as exc:
        if not exc.message.startswith(_STARTED_NOT):
            raise ValueError(exc.message) from None
        # A user the image lacks, a working directory that is not there: as docker exec says it.
        return ExecResult(success=False, returncode=126, stdout="", stderr=f"{exc.message}\n")
    finally:
        if script:
            await shielded(_quietly(client.remove(workspace_id, script)))
    if collected is None:  # out of processes in the workspace: what a shell's fork would say
        return ExecResult(success=False, returncode=126, stdout="", stderr="fork: Resource temporarily unavailable\n")
    return _result(collected, cmd, timeout, time.monotonic() - began)


def _result(collected: _Collected, cmd: list[str], timeout: int | None, took: float) -> ExecResult[str]:
    stdout, stderr = collected.text("stdout"), collected.text("stderr")
    if collected.over is not None:
        raise OutputLimitExceededError(
            limit_str=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
            truncated_output=stdout if collected.over == "stdout" else stderr,
        )
    exited = collected.exited
    assert exited is not None
    if exited.stop_reason == "timeout":
        error = TimeoutError(f"Command timed out after {timeout} seconds ({took:.1f} s)")
        if stdout or stderr:
            error.truncated_output = stdout + stderr  # type: ignore[attr-defined]
        raise error
    if exited.exit_code == 126 and f"{cmd[0]}: Permission denied" in stderr:
        raise PermissionError(errno.EACCES, f"Permission denied: {stderr.strip()}", cmd[0])
    return ExecResult(success=exited.exit_code == 0, returncode=exited.exit_code, stdout=stdout, stderr=stderr)


def _line(cmd: list[str], env: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """The shell line of ``cmd``, and the variables for the daemon to set.

    A value the daemon would read as a reference to one of its secrets (``secret:NAME``) is
    Inspect's literal text: it is exported by the line instead.
    """
    variables, exported = {}, []
    for name, value in env.items():
        if not value.startswith("secret:"):
            variables[name] = value
        elif _NAME_RE.fullmatch(name):
            exported.append(f"export {name}={shlex.quote(value)}; ")
        else:
            msg = f"env name {name!r} is not a shell variable name"
            raise ValueError(msg)
    return "".join(exported) + shlex.join(cmd), variables


async def _long_command(client: SandboxClient, workspace_id: str, line: str, script: str) -> str:
    """A short line that runs ``line`` from ``script``, a file the workspace's user writes.

    That user may change the file before the command (perhaps root's) reads it: the command
    copies it to a file of its own, checks the copy's SHA-256, and only then runs it.
    """
    body = f'rm -f -- "$__inspect_f"; unset __inspect_f __inspect_h __inspect_p\nexec {line}\n'
    digest = hashlib.sha256(body.encode()).hexdigest()
    await client.write_file(workspace_id, script, body)
    return (
        f"__inspect_p=$PATH; PATH={_SYSTEM_PATH}; "
        f'__inspect_f=$(mktemp) && cat -- {script} > "$__inspect_f" && __inspect_h=$(sha256sum < "$__inspect_f")'
        f' && [ "${{__inspect_h%% *}}" = {digest} ]'
        f" || {{ echo 'the command line in {script} changed before it ran' >&2; exit 126; }}; "
        f'PATH=$__inspect_p; . "$__inspect_f"'
    )


async def _started(
    client: SandboxClient, workspace_id: str, line: str, data: bytes, **options: Any
) -> _Collected | None:
    """Run the command to its end; wait while the workspace's session cap is full.

    Returns None when the workspace has no process left to start it with.
    """
    deadline, pause = time.monotonic() + _SESSIONS_WAIT_S, 0.05
    while True:
        collected = _Collected(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE)
        # Without input the command starts with its stdin at end of file, as `docker exec`
        # without -i gives it: no second call is needed to close it.
        handle = client.exec(workspace_id, line, follow=True, stdin_closed=not data, **options)
        try:
            await _run(client, handle, collected, data)
        except ResourceExhaustedError as exc:
            if collected.process_id:
                raise
            if exc.message.startswith(_STARTED_NOT):
                return None
            if time.monotonic() > deadline:
                msg = f"the workspace's process sessions stayed full for {_SESSIONS_WAIT_S:g} s: {exc.message}"
                raise RuntimeError(msg) from None
            await asyncio.sleep(pause)  # another sample's commands hold them all: one ends soon
            pause = min(pause * 2, 2.0)
        else:
            return collected


async def _run(client: SandboxClient, handle: ExecHandle, collected: _Collected, data: bytes) -> None:
    """Stream the command into ``collected``, feeding ``data`` to its stdin and then closing it.

    Whatever ends this early (the output limit, a cancelled eval, an error) kills the command
    with everything it started: a cancelled call alone would be only Ctrl-C to it.
    """
    writer: asyncio.Task[None] | None = None
    try:
        async for event in handle:
            collected.take(event)
            if isinstance(event, Started) and data:
                writer = asyncio.create_task(_feed(client, event.process_id, data, collected))
            if collected.over is not None:
                break
        if writer is not None and collected.over is None:
            await writer
    finally:
        if writer is not None and not writer.done():
            writer.cancel()
        if collected.process_id and collected.exited is None:
            await shielded(_quietly(client.kill(collected.process_id, grace_s=0.5)))


async def _feed(client: SandboxClient, process_id: str, data: bytes, collected: _Collected) -> None:
    """Write ``data`` to stdin a piece at a time, then close it (always: ``cat`` must end)."""
    pieces = [data[i : i + MAX_INPUT_BYTES] for i in range(0, len(data), MAX_INPUT_BYTES)]
    closed = False
    try:
        for index, piece in enumerate(pieces):
            closed = index == len(pieces) - 1
            # The command's own stream carries the output, so this call returns at once; what
            # output it may still carry joins the rest by position.
            async for event in client.input(process_id, data=piece, close_stdin=closed, yield_after_s=0.25):
                collected.take(event)
    except (FailedPreconditionError, NotFoundError):
        return  # the command ended before reading all of it, as with a closed pipe
    finally:
        if not closed:  # a write that failed: the command must still see the end of its input
            await _quietly(client.input(process_id, close_stdin=True, yield_after_s=0.25).wait())


async def _quietly(call: Awaitable[Any]) -> None:
    with contextlib.suppress(SandboxError):
        await call


async def shielded(call: Awaitable[None]) -> None:
    """Run ``call`` to its end even when the caller is being cancelled (then cancel the caller still)."""
    task = asyncio.ensure_future(call)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(asyncio.CancelledError, SandboxError):
            await task
        raise
