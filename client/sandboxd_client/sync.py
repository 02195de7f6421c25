"""A small synchronous façade over :class:`SandboxClient`, for scripts and test suites.

It runs its own event loop on a background thread; each method blocks until
the call is done. ``exec`` returns the finished :class:`ExecResult`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from ._client import FileInfo, ReadResult, SandboxClient, WorkspaceInfo, WriteResult
from ._exec import ExecResult

__all__ = ["SyncSandboxClient"]

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
        """Close the channel and stop the loop thread."""
        if self._loop.is_running():
            self._run(self._client.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def create_workspace(self, **options: Any) -> WorkspaceInfo:
        """See :meth:`SandboxClient.create_workspace`; returns the workspace's info."""
        return self._run(self._client.create_workspace(**options)).info

    def list_workspaces(self, labels: Mapping[str, str] | None = None) -> list[WorkspaceInfo]:
        """See :meth:`SandboxClient.list_workspaces`."""
        return self._run(self._client.list_workspaces(labels))

    def delete_workspace(self, workspace_id: str) -> None:
        """See :meth:`SandboxClient.delete_workspace`."""
        self._run(self._client.delete_workspace(workspace_id))

    def exec(self, workspace_id: str, command: str, *, check: bool = False, **options: Any) -> ExecResult:
        """Run a command to completion (following yields) and return its result."""
        options.setdefault("follow", True)
        return self._run(self._client.exec(workspace_id, command, **options).wait(check=check))

    def read_file(self, workspace_id: str, path: str, **options: Any) -> ReadResult:
        """See :meth:`SandboxClient.read_file`."""
        return self._run(self._client.read_file(workspace_id, path, **options))

    def write_file(self, workspace_id: str, path: str, content: str | bytes) -> WriteResult:
        """See :meth:`SandboxClient.write_file`."""
        return self._run(self._client.write_file(workspace_id, path, content))

    def list_dir(self, workspace_id: str, path: str = "") -> list[FileInfo]:
        """See :meth:`SandboxClient.list_dir`."""
        return self._run(self._client.list_dir(workspace_id, path))
