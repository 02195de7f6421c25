"""How a session delivers Ctrl-C, per container OS (no Docker).

The recording backend stands in only for the engine's exec call, to read the
command line a Windows workspace would get; POSIX delivery is covered against
real containers in tests/integration.
"""

from __future__ import annotations

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
