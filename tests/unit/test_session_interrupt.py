"""How a session delivers Ctrl-C per container OS, and how it checks its supervisor's reports (no Docker).

The recording backend stands in only for the engine's exec call, to read the
command line a Windows workspace would get; POSIX delivery is covered against
real containers in tests/integration.
"""

from __future__ import annotations

import json

import pytest

from sandboxd.models import ExecSpec, StopReason
from sandboxd.processes import ExecContext, ProcessSession, _State
from sandboxd.settings import Settings


class RecordingBackend:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str], str]] = []

    async def exec_run(
        self, workspace_id: str, argv: list[str], *, user: str, container_id: str = ""
    ) -> tuple[int, bytes]:
        self.calls.append((workspace_id, list(argv), user))
        return 0, b""


async def test_windows_ctrl_c_runs_taskkill_on_the_tree() -> None:
    """On a Windows workspace, Ctrl-C execs `taskkill /T /F /PID <pid>` as the workspace user."""
    backend = RecordingBackend()
    context = ExecContext(
        workspace_id="ws-win", user="ContainerUser", working_dir="C:\\w", memory_limit_bytes=0, os="windows"
    )
    session = ProcessSession(
        backend=backend,  # type: ignore[arg-type]
        context=context,
        spec=ExecSpec(command="ping -t localhost"),
        settings=Settings.from_env({}),
        process_id="p-1",
    )
    session._state = _State.RUNNING
    session.pid = 4711
    await session.interrupt()
    assert backend.calls == [("ws-win", ["taskkill", "/T", "/F", "/PID", "4711"], "ContainerUser")]
    assert StopReason.INTERRUPTED in session._requested


def _linux_session() -> ProcessSession:
    context = ExecContext(workspace_id="ws-1", user="sandbox", working_dir="/workspace", memory_limit_bytes=0)
    return ProcessSession(
        backend=RecordingBackend(),  # type: ignore[arg-type]
        context=context,
        spec=ExecSpec(command="true"),
        settings=Settings.from_env({}),
        process_id="p-2",
    )


@pytest.mark.parametrize(
    "report",
    [
        {"exit_code": 2**32, "signal": 0},
        {"exit_code": -9, "signal": 0},
        {"exit_code": 0, "signal": 999},
        {"exit_code": "0", "signal": 0},
        {"exit_code": 0, "signal": 0, "leftovers": -1},
        {"exit_code": 0, "signal": 0, "spill_path": {"x": 1}},
        [1, 2],
    ],
)
async def test_a_forged_exit_report_is_refused(report: object) -> None:
    """A workspace that races its supervisor's start can write reports: none is taken unchecked."""
    from sandboxd import frames

    session = _linux_session()
    with pytest.raises(frames.FrameError):
        await session._on_frame(frames.EXITED, json.dumps(report).encode())
    assert session.exit is None


async def test_a_forged_pid_is_refused() -> None:
    from sandboxd import frames

    with pytest.raises(frames.FrameError, match=r"pid is 100000000000"):
        await _linux_session()._on_frame(frames.STARTED, b'{"pid": 100000000000}')


async def test_a_valid_exit_report_is_taken() -> None:
    from sandboxd import frames

    session = _linux_session()
    assert await session._on_frame(frames.EXITED, b'{"exit_code": 137, "signal": 9, "leftovers": 2}')
    assert session.exit is not None
    assert (session.exit.exit_code, session.exit.signal, session.leftovers) == (137, "SIGKILL", 2)
