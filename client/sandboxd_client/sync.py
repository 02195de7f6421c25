"""A small synchronous façade over :class:`SandboxClient`, for scripts and test suites.

It runs its own event loop on a background thread; each method blocks until
the call is done. ``exec`` returns the finished :class:`ExecResult`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator, Mapping
from typing import Any, TypeVar

from ._client import (
    EditResult,
    FileInfo,
    ReadResult,
    SandboxClient,
    SnapshotInfo,
    TemplateBuildResult,
    WorkspaceInfo,
    WriteResult,
)
from ._exec import ExecResult

__all__ = ["SyncSandboxClient", "SyncWorkspace"]

T = TypeVar("T")


class SyncSandboxClient:
    """Blocking client; use as ``with SyncSandboxClient() as client``.

    Takes the same arguments as :class:`SandboxClient`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Start the loop thread and connect."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sandboxd-client", daemon=True)
        self._thread.start()
        self._client: SandboxClient = self._run(self._make(*args, **kwargs))

    @staticmethod
    async def _make(*args: Any, **kwargs: Any) -> SandboxClient:
        return SandboxClient(*args, **kwargs)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> SyncSandboxClient:
        """Return the client."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Close the client and stop its loop."""
        self.close()

    def close(self) -> None:
        """Close the channel, stop the loop thread and close the loop."""
        if self._loop.is_running():
            self._run(self._client.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()  # an unclosed loop is a ResourceWarning (an error under -W error)

    def create_workspace(self, **options: Any) -> SyncWorkspace:
        """See :meth:`SandboxClient.create_workspace`; returns a blocking workspace handle."""
        return SyncWorkspace(self, self._run(self._client.create_workspace(**options)).info)

    def get_workspace(self, workspace_id: str) -> SyncWorkspace:
        """See :meth:`SandboxClient.get_workspace`."""
        return SyncWorkspace(self, self._run(self._client.get_workspace(workspace_id)).info)

    def list_workspaces(self, labels: Mapping[str, str] | None = None) -> list[WorkspaceInfo]:
        """See :meth:`SandboxClient.list_workspaces`."""
        return self._run(self._client.list_workspaces(labels))

    def delete_workspace(self, workspace_id: str) -> None:
        """See :meth:`SandboxClient.delete_workspace`."""
        self._run(self._client.delete_workspace(workspace_id))

    def pause_workspace(self, workspace_id: str) -> WorkspaceInfo:
        """See :meth:`SandboxClient.pause_workspace`."""
        return self._run(self._client.pause_workspace(workspace_id))

    def resume_workspace(self, workspace_id: str) -> WorkspaceInfo:
        """See :meth:`SandboxClient.resume_workspace`."""
        return self._run(self._client.resume_workspace(workspace_id))

    def restore_workspace(self, workspace_id: str, snapshot: str) -> WorkspaceInfo:
        """See :meth:`SandboxClient.restore_workspace`."""
        return self._run(self._client.restore_workspace(workspace_id, snapshot))

    def snapshot_workspace(
        self, workspace_id: str, name: str, *, labels: Mapping[str, str] | None = None, include_memory: bool = False
    ) -> SnapshotInfo:
        """See :meth:`SandboxClient.snapshot_workspace`."""
        return self._run(
            self._client.snapshot_workspace(workspace_id, name, labels=labels, include_memory=include_memory)
        )

    def get_snapshot(self, name: str) -> SnapshotInfo:
        """See :meth:`SandboxClient.get_snapshot`."""
        return self._run(self._client.get_snapshot(name))

    def list_snapshots(self, labels: Mapping[str, str] | None = None) -> list[SnapshotInfo]:
        """See :meth:`SandboxClient.list_snapshots`."""
        return self._run(self._client.list_snapshots(labels))

    def delete_snapshot(self, name: str) -> None:
        """See :meth:`SandboxClient.delete_snapshot`."""
        self._run(self._client.delete_snapshot(name))

    def build_template(
        self, name: str, dockerfile: str, *, context: bytes = b"", **options: Any
    ) -> TemplateBuildResult:
        """See :meth:`SandboxClient.build_template` (``context`` as bytes; ``on_log`` runs on the loop's thread)."""
        return self._run(self._client.build_template(name, dockerfile, context=context, **options))

    def exec(self, workspace_id: str, command: str, *, check: bool = False, **options: Any) -> ExecResult:
        """Run a command to completion (following yields) and return its result.

        Nothing can write to the command's stdin while this call blocks, so it starts closed
        (``stdin_closed=True``, unless given): a command that reads it gets end of file at
        once instead of waiting for its timeout.
        """
        options.setdefault("follow", True)
        options.setdefault("stdin_closed", True)
        return self._run(self._client.exec(workspace_id, command, **options).wait(check=check))

    def read_file(self, workspace_id: str, path: str, **options: Any) -> ReadResult:
        """See :meth:`SandboxClient.read_file`."""
        return self._run(self._client.read_file(workspace_id, path, **options))

    def write_file(self, workspace_id: str, path: str, content: str | bytes) -> WriteResult:
        """See :meth:`SandboxClient.write_file`."""
        return self._run(self._client.write_file(workspace_id, path, content))

    def edit_file(self, workspace_id: str, path: str, old_string: str, new_string: str, **options: Any) -> EditResult:
        """See :meth:`SandboxClient.edit_file`."""
        return self._run(self._client.edit_file(workspace_id, path, old_string, new_string, **options))

    def list_dir(self, workspace_id: str, path: str = "") -> list[FileInfo]:
        """See :meth:`SandboxClient.list_dir`."""
        return self._run(self._client.list_dir(workspace_id, path))

    @contextlib.contextmanager
    def forward(self, workspace_id: str, port: int, **options: Any) -> Iterator[str]:
        """See :meth:`SandboxClient.forward`: ``with client.forward(ws_id, 8000) as address:``.

        The listener runs on the client's loop thread; any thread may use the address.
        """
        forward = self._client.forward(workspace_id, port, **options)
        address = self._run(forward.start())
        try:
            yield address
        finally:
            self._run(forward.close())

    def health(self) -> str:
        """See :meth:`SandboxClient.health`."""
        return self._run(self._client.health())


class SyncWorkspace:
    """A blocking handle to one workspace; remembers the commands run through it (``history``)."""

    def __init__(self, client: SyncSandboxClient, info: WorkspaceInfo) -> None:
        """Bind ``info`` to ``client``."""
        self.client = client
        self.info = info
        self.history: list[tuple[str, int | None]] = []
        """``(command, exit_code)`` of every exec, oldest first (exit code None while still running)."""

    @property
    def workspace_id(self) -> str:
        """The workspace id."""
        return self.info.workspace_id

    def exec(self, command: str, *, check: bool = False, **options: Any) -> ExecResult:
        """Run a command to completion and return its result (see :meth:`SandboxClient.exec`)."""
        try:
            result = self.client.exec(self.workspace_id, command, check=check, **options)
        except BaseException as exc:  # a timeout or Ctrl-C too: the command that hung is the one to show
            self.history.append((command, getattr(exc, "exit_code", None)))
            raise
        self.history.append((command, result.exit_code))
        return result

    def read_file(self, path: str, **options: Any) -> ReadResult:
        """See :meth:`SandboxClient.read_file`."""
        return self.client.read_file(self.workspace_id, path, **options)

    def write_file(self, path: str, content: str | bytes) -> WriteResult:
        """See :meth:`SandboxClient.write_file`."""
        return self.client.write_file(self.workspace_id, path, content)

    def edit_file(self, path: str, old_string: str, new_string: str, **options: Any) -> EditResult:
        """See :meth:`SandboxClient.edit_file`."""
        return self.client.edit_file(self.workspace_id, path, old_string, new_string, **options)

    def forward(self, port: int, **options: Any) -> contextlib.AbstractContextManager[str]:
        """See :meth:`SyncSandboxClient.forward`: ``with ws.forward(8000) as address:``."""
        return self.client.forward(self.workspace_id, port, **options)

    def pause(self) -> WorkspaceInfo:
        """See :meth:`SandboxClient.pause_workspace`."""
        self.info = self.client.pause_workspace(self.workspace_id)
        return self.info

    def resume(self) -> WorkspaceInfo:
        """See :meth:`SandboxClient.resume_workspace`."""
        self.info = self.client.resume_workspace(self.workspace_id)
        return self.info

    def restore(self, snapshot: str) -> WorkspaceInfo:
        """See :meth:`SandboxClient.restore_workspace`."""
        self.info = self.client.restore_workspace(self.workspace_id, snapshot)
        return self.info

    def snapshot(
        self, name: str, *, labels: Mapping[str, str] | None = None, include_memory: bool = False
    ) -> SnapshotInfo:
        """See :meth:`SandboxClient.snapshot_workspace`."""
        return self.client.snapshot_workspace(self.workspace_id, name, labels=labels, include_memory=include_memory)

    def delete(self) -> None:
        """Remove the workspace and its volume."""
        self.client.delete_workspace(self.workspace_id)

    def __repr__(self) -> str:
        """Show the id."""
        return f"<SyncWorkspace {self.workspace_id}>"
