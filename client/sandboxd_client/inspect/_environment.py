"""``SandboxdSandboxEnvironment``: Inspect AI's sandbox interface over a sandboxd daemon.

Each sample gets one workspace per service (``default`` first), labelled with the eval's run,
task, sample and service so that a cleanup, even after a killed eval, finds them. Commands run as
``bash -lc`` the shell-quoted argv; files move through the daemon's file service.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import secrets
import shlex
import weakref
from collections.abc import Awaitable
from typing import Any, Literal, TypeVar, overload

from inspect_ai.util import (
    ExecResult,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxUnavailableError,
    sandboxenv,
)
from pydantic import BaseModel
from sandboxd_protocol.limits import MAX_LABEL_VALUE_BYTES

from .._client import SandboxClient, Workspace
from ..errors import NotFoundError, UnavailableError
from ._commands import run_command
from ._commands import shielded as _shielded
from ._config import DEFAULT_ROOT_CAPABILITIES, SandboxdConfig, ServiceConfig, load_config
from ._files import read, write

__all__ = ["LABEL_PROVIDER", "LABEL_RUN", "RUN_ID", "SandboxdSandboxEnvironment"]

LABEL_PROVIDER = "inspect.provider"
"""Every workspace the provider makes carries ``inspect.provider=sandboxd``: ``cli_cleanup`` finds them."""
LABEL_RUN = "inspect.run"
"""The process that made it (:data:`RUN_ID`): ``task_cleanup`` removes its own leftovers only."""
RUN_ID = secrets.token_hex(8)
_reported: set[str] = set()  # kept workspaces already named (task_cleanup runs once per configuration)

T = TypeVar("T")

# One client per event loop and address: a gRPC channel belongs to the loop that opened it.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, SandboxClient]] = weakref.WeakKeyDictionary()


def _client(address: str | None) -> SandboxClient:
    per_loop = _clients.setdefault(asyncio.get_running_loop(), {})
    key = address or ""
    if key not in per_loop:
        per_loop[key] = SandboxClient(address or None)
    return per_loop[key]


def _labels(task_name: str, service: str, metadata: dict[str, Any], own: dict[str, str] | None) -> dict[str, str]:
    labels = {
        **(own or {}),
        LABEL_PROVIDER: "sandboxd",
        LABEL_RUN: RUN_ID,
        "inspect.task": _label_value(task_name),
        "inspect.service": service,
    }
    if (sample := metadata.get("__sample_id__")) is not None:
        labels["inspect.sample"] = _label_value(str(sample))
    return labels


def _label_value(text: str) -> str:
    """``text`` cut to the daemon's label bound (bytes of UTF-8), at a character's end."""
    return text.encode()[:MAX_LABEL_VALUE_BYTES].decode(errors="ignore")


async def _create(client: SandboxClient, name: str, options: ServiceConfig, labels: dict[str, str]) -> Workspace:
    env = dict(options.env or {})
    env.update({var: f"secret:{secret}" for var, secret in (options.secrets or {}).items()})
    root = DEFAULT_ROOT_CAPABILITIES if options.root_capabilities is None else options.root_capabilities
    return await client.create_workspace(
        image=options.image or "",
        runtime=options.runtime or "",
        memory_bytes=options.memory or 0,
        cpu_millis=round((options.cpus or 0) * 1000),
        pids=options.pids or 0,
        disk_bytes=options.disk or 0,
        network=options.network or "",
        allowed_hosts=options.allowed_hosts or (),
        env=env,
        user=options.user or "",
        root_capabilities=root,
        added_capabilities=options.added_capabilities or (),
        working_dir=options.working_dir or "",
        read_only_root_filesystem=bool(options.read_only),
        idle_ttl_s=options.idle_ttl,
        labels=labels,
    )


async def _delete_all(client: SandboxClient, workspace_ids: list[str]) -> None:
    async def delete(workspace_id: str) -> None:
        with contextlib.suppress(NotFoundError):
            await client.delete_workspace(workspace_id)

    await asyncio.gather(*(delete(w) for w in workspace_ids))


@sandboxenv(name="sandboxd")
class SandboxdSandboxEnvironment(SandboxEnvironment):
    """One workspace of a sample, as Inspect's ``SandboxEnvironment``.

    Args:
        workspace_id: the workspace.
        address: the daemon's address (None: ``SANDBOXD_ADDRESS`` or the default socket).
        working_dir: the sample's working directory: where relative paths resolve.
    """

    def __init__(self, workspace_id: str, address: str | None, working_dir: str) -> None:
        """Hold the workspace; calls open the daemon's client lazily, one per event loop."""
        super().__init__()
        self.workspace_id = workspace_id
        self._address = address
        self._working_dir = working_dir

    # -- lifecycle ---------------------------------------------------------------------------
    @classmethod
    def config_files(cls) -> list[str]:
        """Files a task's directory may hold for ``sandbox="sandboxd"`` to find."""
        return ["sandboxd.yaml", "sandboxd.yml"]

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        """The configuration model of a serialised one (an eval log's)."""
        return SandboxdConfig.model_validate(config)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        """Check the configuration and that the daemon answers, before any sample starts.

        Raises:
            ValueError: the configuration is not a sandboxd one.
            SandboxUnavailableError: no daemon answers at the address.
        """
        settings = load_config(config)
        try:
            await _client(settings.address).health()
        except UnavailableError as exc:
            msg = f"no sandboxd daemon answers ({exc.message}); start one with `sandboxd serve`"
            raise SandboxUnavailableError(msg) from None

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, Any]
    ) -> dict[str, SandboxEnvironment]:
        """Create the sample's workspaces at once (``default`` first); none is left if one fails."""
        settings = load_config(config)
        client = _client(settings.address)
        services = settings.workspaces()
        made = await asyncio.gather(
            *(
                _create(client, name, options, _labels(task_name, name, metadata, options.labels))
                for name, options in services.items()
            ),
            return_exceptions=True,
        )
        workspaces = [w for w in made if isinstance(w, Workspace)]
        failed = [e for e in made if isinstance(e, BaseException)]
        if failed:
            await _shielded(_delete_all(client, [w.workspace_id for w in workspaces]))
            raise failed[0]
        return {
            name: cls(workspace.workspace_id, settings.address, workspace.info.working_dir or "/workspace")
            for name, workspace in zip(services, workspaces, strict=True)
        }

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        """Remove the sample's workspaces, interrupted or not (Inspect skips this under ``--no-sandbox-cleanup``)."""
        ours = [e for e in environments.values() if isinstance(e, SandboxdSandboxEnvironment)]
        if ours:
            await _delete_all(_client(ours[0]._address), [e.workspace_id for e in ours])

    @classmethod
    async def task_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool) -> None:
        """Remove what this eval's samples left, or, with ``cleanup`` off, say which workspaces are kept.

        Inspect calls it once per sandbox configuration when the whole eval ends (its
        ``task_name`` is then "shutdown"), so it covers every workspace this process made.
        """
        settings = load_config(config)
        client = _client(settings.address)
        left = [w for w in await client.list_workspaces({LABEL_RUN: RUN_ID}) if w.workspace_id not in _reported]
        if cleanup:
            await _delete_all(client, [w.workspace_id for w in left])
        elif left:
            _reported.update(w.workspace_id for w in left)
            print(f"sandboxd workspaces kept ({len(left)}):")
            for info in left:
                labels = info.labels
                print(
                    f"  {info.workspace_id}  task {labels.get('inspect.task')}, sample {labels.get('inspect.sample')}, "
                    f"service {labels.get('inspect.service')}"
                )
            print("remove them with: inspect sandbox cleanup sandboxd [WORKSPACE_ID]")
        _clients[asyncio.get_running_loop()].pop(settings.address or "")
        await client.close()

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """``inspect sandbox cleanup sandboxd [ID]``: remove that workspace, or every one the provider made."""
        async with SandboxClient() as client:
            if id:
                await _delete_all(client, [id])
                return
            left = await client.list_workspaces({LABEL_PROVIDER: "sandboxd"})
            await _delete_all(client, [w.workspace_id for w in left])
            print(f"removed {len(left)} sandboxd workspace(s)")

    # -- commands and files --------------------------------------------------------------------
    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        """Run ``cmd`` (an argv, looked up in the workspace's PATH) as ``bash -lc`` and return its result.

        ``input`` goes to its stdin, which is then closed (also without ``input``). ``timeout``
        None is no limit (a day, the daemon's ceiling). ``timeout_retry`` and ``concurrency``
        change nothing: the daemon enforces the timeout itself (no call hangs to retry) and
        schedules its own workspaces. A user the image lacks, or a ``cwd`` that is not there,
        is a failed result (exit 126) with the daemon's words, as ``docker exec`` reports them;
        a cancelled call kills the command with everything it started.

        Raises:
            TimeoutError: ``timeout`` seconds passed (at once for 0); the command and everything
                it started are killed.
            OutputLimitExceededError: stdout or stderr passed Inspect's limit (10 MiB by default);
                the command is killed.
            PermissionError: ``cmd[0]`` is not executable.
            ValueError: an empty ``cmd``, or a value the daemon refuses (an env name, a size).
            UnicodeEncodeError: ``input`` is not Unicode text (a lone surrogate).
            SandboxUnavailableError: the workspace is gone or the daemon does not answer.
        """
        return await self._call(
            run_command(
                _client(self._address),
                self.workspace_id,
                cmd,
                input=input,
                workdir=self._path(cwd) if cwd else "",
                env=env,
                user=user,
                timeout=timeout,
            )
        )

    async def write_file(self, file: str, contents: str | bytes) -> None:
        """Create or replace ``file`` (parents made) with ``contents`` (``str`` as UTF-8), as a shell's ``>`` would.

        Raises:
            PermissionError: the workspace's user may not write it.
            IsADirectoryError: ``file`` is a directory.
            OSError: another reason (``ENOSPC``: the workspace's disk is full).
            SandboxUnavailableError: the workspace is gone or the daemon does not answer.
        """
        data = contents.encode() if isinstance(contents, str) else contents
        await self._call(write(_client(self._address), self.workspace_id, self._path(file), file, data))

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        """The contents of ``file`` (a symlink is followed), as UTF-8 text or bytes, line endings kept.

        Raises:
            FileNotFoundError: nothing is there.
            IsADirectoryError: it is a directory.
            PermissionError: the workspace's user may not read it.
            OutputLimitExceededError: it is larger than Inspect's limit (100 MiB by default); no
                more than that is ever read, whatever the file does meanwhile.
            UnicodeDecodeError: ``text`` and it is not UTF-8.
            SandboxUnavailableError: the workspace is gone or the daemon does not answer.
        """
        data = await self._call(read(_client(self._address), self.workspace_id, self._path(file), file))
        return data.decode("utf-8") if text else data

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """The command line that opens a login shell in the workspace (``inspect sandbox connect``)."""
        words = ["sandboxctl"]
        if self._address:
            words += ["--address", self._address]
        words += ["exec", "-it"]
        if user:
            words += ["--user", user]
        words += [self.workspace_id, "--", "bash -l"]
        return SandboxConnection(type="sandboxd", command=shlex.join(words), container=self.workspace_id)

    # -- helpers -----------------------------------------------------------------------------
    def _path(self, file: str) -> str:
        return posixpath.join(self._working_dir, file)

    async def _call(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except (NotFoundError, UnavailableError) as exc:
            msg = f"workspace {self.workspace_id}: {exc.message}"
            raise SandboxUnavailableError(msg) from None

    def __repr__(self) -> str:
        return f"SandboxdSandboxEnvironment({self.workspace_id!r})"
