"""Small helpers shared by the integration tests."""

from __future__ import annotations

import asyncio
import io
import re
import tarfile
import time
from collections.abc import AsyncIterator

import pytest
from sandboxd_client import Output, Yielded


def skip_without(runtime: str, request) -> None:  # type: ignore[no-untyped-def]
    """Skip a test of ``runtime`` when it is runsc and the engine has none (CI insists on it)."""
    if runtime == "runsc" and not request.getfixturevalue("runsc_available"):
        pytest.skip("the engine has no runsc runtime (scripts/install-runsc registers it)")


async def collect(handle) -> tuple[list[object], str, str]:  # type: ignore[no-untyped-def]
    """All events of an exec/input handle, with its stdout and stderr text."""
    events = [event async for event in handle]
    out = "".join(e.text for e in events if isinstance(e, Output) and e.stream == "stdout")
    err = "".join(e.text for e in events if isinstance(e, Output) and e.stream == "stderr")
    return events, out, err


async def ps(workspace, pattern: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Command lines of live (non-zombie) processes in the workspace that fully match ``pattern``."""
    result = await workspace.exec("ps -eo stat=,args=").wait()
    rows = [line.strip().split(None, 1) for line in result.stdout.splitlines() if line.strip()]
    return [
        args
        for stat, args in (r for r in rows if len(r) == 2)
        if not stat.startswith("Z") and re.fullmatch(pattern, args)
    ]


async def start_yielded(workspace, command: str, **options) -> str:  # type: ignore[no-untyped-def]
    """Exec ``command`` with a 250 ms window; return its process id once it has yielded."""
    events, _, _ = await collect(workspace.exec(command, yield_after_s=0.25, **options))
    assert isinstance(events[-1], Yielded), events[-1]
    return events[-1].process_id


async def start_ready(workspace, command: str, ready: str = "ready", **options) -> str:  # type: ignore[no-untyped-def]
    """Start ``command`` and return its process id once its output contains ``ready``.

    ``command`` prints ``ready`` once what the test is about to signal is in place: after its
    ``trap``, after starting the children the signal must reach, or once a program has set up
    its own handler (a REPL's prompt). A signal sent earlier (a slow start under gVisor or on a
    loaded host) would race it; no fixed sleep can stand in for this.
    """
    process_id, _ = await exec_until(workspace, command, ready, **options)
    return process_id


async def exec_until(workspace, command: str, text: str, **options) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """Exec ``command``; return its process id and its output once that output contains ``text``.

    The command must still be running then. How soon output arrives is not the test's business:
    a short yield window that must already hold it fails on a loaded host.
    """
    events, seen, _ = await collect(workspace.exec(command, yield_after_s=0.25, **options))
    assert isinstance(events[-1], Yielded), events[-1]
    process_id = events[-1].process_id
    return process_id, seen + await input_until(workspace.client, process_id, text, seen=seen)


async def input_until(client, process_id: str, text: str, data: str = "", seen: str = "") -> str:  # type: ignore[no-untyped-def]
    """Send ``data`` to a running process, then poll it until its output holds ``text``; return that output.

    ``seen`` is output already read, which may hold ``text`` already. The process must still be
    running once ``text`` has come (20 s at most).
    """
    deadline = time.monotonic() + 20
    got = ""
    first = True
    while first or text not in seen + got:
        assert time.monotonic() < deadline, f"{process_id} never printed {text!r}: {seen + got!r}"
        events, out, _ = await collect(client.input(process_id, data if first else "", yield_after_s=0.25))
        first = False
        got += out
        assert text in seen + got or isinstance(events[-1], Yielded), f"exited before printing {text!r}: {events[-1]}"
    return got


async def start_trapped(workspace, traps: str, body: str, **options) -> str:  # type: ignore[no-untyped-def]
    """Start ``traps; body`` and return its process id once the traps are set.

    A signal sent before the shell has run its ``trap`` (a slow start under gVisor or on a
    loaded host) would meet the default disposition: tests must not race it.
    """
    return await start_ready(workspace, f"{traps}; echo trapped; {body}", ready="trapped", **options)


async def until_alive(workspace, pattern: str, count: int) -> list[str]:  # type: ignore[no-untyped-def]
    """Poll (20 s at most) until ``count`` live processes match ``pattern``, and return them all.

    For children that must be running before the test signals their command: right after the
    start they may not have been forked or exec'd yet.
    """
    deadline = time.monotonic() + 20
    while len(found := await ps(workspace, pattern)) < count:
        assert time.monotonic() < deadline, f"only {found} of {count} processes matching {pattern!r} started"
        await asyncio.sleep(0.1)
    return found


def until_caught(pid: int, signum: int) -> None:
    """Poll (30 s at most) until local process ``pid`` has a handler for ``signum`` (its ``SigCgt``).

    Before that, the signal would meet its default action (for SIGTERM: death, not a clean stop).
    """
    deadline = time.monotonic() + 30
    while True:
        with open(f"/proc/{pid}/status") as status:
            caught = int(next(line for line in status if line.startswith("SigCgt:")).split()[1], 16)
        if caught >> (signum - 1) & 1:
            return
        assert time.monotonic() < deadline, f"process {pid} never installed a handler for signal {signum}"
        time.sleep(0.01)


def one_file_tar(name: str, data: bytes) -> bytes:
    """A tar archive holding one regular file."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        entry = tarfile.TarInfo(name)
        entry.size = len(data)
        tar.addfile(entry, io.BytesIO(data))
    return buffer.getvalue()


async def trickle(data: bytes, *, pieces: int, pause_s: float) -> AsyncIterator[bytes]:
    """``data`` in ``pieces`` chunks with a pause after each: an upload that stays in flight."""
    step = len(data) // pieces + 1
    for start in range(0, len(data), step):
        yield data[start : start + step]
        await asyncio.sleep(pause_s)
