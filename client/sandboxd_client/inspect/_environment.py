"""``SandboxdSandboxEnvironment``: Inspect AI's sandbox interface over a sandboxd daemon.

Each sample gets one workspace per service (``default`` first), labelled with the eval's run,
task, sample and service so that a cleanup, even after a killed eval, finds them. Commands run as
``bash -lc`` the shell-quoted argv; files move through the daemon's file service.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import posixpath
import secrets
import shlex
import tarfile
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any, Literal, overload

import anyio
from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    sandboxenv,
)
from pydantic import BaseModel
from sandboxd_protocol.limits import MAX_COMMAND_BYTES, MAX_INPUT_BYTES, MAX_WRITE_BYTES

from .._client import SandboxClient, Workspace
from .._exec import Dropped, ExecHandle, Exited, Output, Started
from ..errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    SandboxError,
    UnavailableError,
)
from ._config import DEFAULT_ROOT_CAPABILITIES, SandboxdConfig, ServiceConfig, load_config

__all__ = ["LABEL_PROVIDER", "LABEL_RUN", "RUN_ID", "SandboxdSandboxEnvironment"]

LABEL_PROVIDER = "inspect.provider"
"""Every workspace the provider makes carries ``inspect.provider=sandboxd``: ``cli_cleanup`` finds them."""
LABEL_RUN = "inspect.run"
"""The process that made it (:data:`RUN_ID`): ``task_cleanup`` removes its own leftovers only."""
RUN_ID = secrets.token_hex(8)
_reported: set[str] = set()  # kept workspaces already named (task_cleanup runs once per configuration)

_SCRIPT_DIR = "/tmp"
# Room for the `. FILE` line and the daemon's own envelope under its command bound.
_COMMAND_ROOM = MAX_COMMAND_BYTES - 1024

# One client per event loop and address: a gRPC channel belongs to the loop that opened it.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, SandboxClient]] = weakref.WeakKeyDictionary()


def _client(address: str | None) -> SandboxClient:
    per_loop = _clients.setdefault(asyncio.get_running_loop(), {})
    key = address or ""
    if key not in per_loop:
        per_loop[key] = SandboxClient(address) if address else SandboxClient()
    return per_loop[key]


def _labels(task_name: str, service: str, metadata: dict[str, Any], own: dict[str, str] | None) -> dict[str, str]:
    labels = {
        **(own or {}),
        LABEL_PROVIDER: "sandboxd",
        LABEL_RUN: RUN_ID,
        "inspect.task": task_name[:1024],
        "inspect.service": service,
    }
    if (sample := metadata.get("__sample_id__")) is not None:
        labels["inspect.sample"] = str(sample)[:1024]
    return labels


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


class _Collected:
    """A command's output as it comes, from however many calls carry it, held to Inspect's limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[tuple[int, str, bytes]] = []
        self.sizes = {"stdout": 0, "stderr": 0}
        self.exited: Exited | None = None
        self.process_id = ""
        self.over: str | None = None  # the stream that went past the limit

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
        elif isinstance(event, Dropped):
            pass  # the daemon's buffer was full: those bytes are gone, as a pipe's would be

    def text(self, stream: str) -> str:
        data = b"".join(d for _, s, d in sorted(self.chunks, key=lambda c: c[0]) if s == stream)
        return data[: self.limit].decode("utf-8", errors="replace")


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
            with _shielded():
                await _delete_all(client, [w.workspace_id for w in workspaces])
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
        for per_loop in list(_clients.values()):
            if (own := per_loop.pop(settings.address or "", None)) is not None and own is client:
                await own.close()

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

    # -- commands ----------------------------------------------------------------------------
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
        """Run ``cmd`` (an argv, looked up in the workspace's PATH) and return its result.

        ``timeout_retry`` and ``concurrency`` change nothing: the daemon enforces the timeout
        itself (so no call hangs to retry) and schedules its own workspaces. A command line
        past the daemon's bound (120 KiB) goes through a script file in /tmp.

        Raises:
            TimeoutError: ``timeout`` seconds passed; the command and everything it started are killed.
            OutputLimitExceededError: stdout or stderr passed Inspect's limit (10 MiB by default);
                the command is killed.
            PermissionError: ``cmd[0]`` is not executable.
            SandboxUnavailableError: the workspace is gone or the daemon does not answer.
        """
        if not cmd:
            msg = "cmd must name a command"
            raise ValueError(msg)
        client = _client(self._address)
        command, script = shlex.join(cmd), ""
        if len(command.encode()) > _COMMAND_ROOM:
            script = f"{_SCRIPT_DIR}/.inspect-{secrets.token_hex(8)}.sh"
            await self._call(client.write_file(self.workspace_id, script, f"exec {command}\n"))
            command = f". {script}"
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        collected = _Collected(limit)
        handle = client.exec(
            self.workspace_id,
            command,
            workdir=self._path(cwd) if cwd else "",
            env=env,
            user=user or "",
            timeout_s=float(timeout) if timeout is not None else None,
            follow=True,
        )
        began = time.monotonic()
        try:
            await self._run(client, handle, collected, input)
        except (InvalidArgumentError, ResourceExhaustedError) as exc:
            # The command never started: a user the workspace lacks, a working directory that
            # is not there, no processes left. The caller's input, reported as a shell would.
            return ExecResult(success=False, returncode=126, stdout="", stderr=f"{exc.message}\n")
        finally:
            if script:
                with _shielded():
                    await _quietly(client.remove(self.workspace_id, script))
        stdout, stderr = collected.text("stdout"), collected.text("stderr")
        if collected.over is not None:
            raise OutputLimitExceededError(
                limit_str=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
                truncated_output=stdout if collected.over == "stdout" else stderr,
            )
        exited = collected.exited
        assert exited is not None
        if exited.stop_reason == "timeout":
            error = TimeoutError(f"Command timed out after {timeout} seconds ({time.monotonic() - began:.1f} s)")
            if stdout or stderr:
                error.truncated_output = stdout + stderr  # type: ignore[attr-defined]
            raise error
        if exited.exit_code == 126 and f"{cmd[0]}: Permission denied" in stderr:
            raise PermissionError(errno.EACCES, f"Permission denied: {stderr.strip()}", cmd[0])
        return ExecResult(success=exited.exit_code == 0, returncode=exited.exit_code, stdout=stdout, stderr=stderr)

    async def _run(
        self, client: SandboxClient, handle: ExecHandle, collected: _Collected, input: str | bytes | None
    ) -> None:
        """Stream the command into ``collected``, feeding ``input`` to its stdin and then closing it."""
        writer: asyncio.Task[None] | None = None
        try:
            async for event in self._events(handle):
                collected.take(event)
                if isinstance(event, Started):
                    writer = asyncio.create_task(self._feed(client, event.process_id, input, collected))
                if collected.over is not None:
                    await _quietly(client.kill(collected.process_id, grace_s=0.0))
                    break
            if writer is not None:
                await writer
        finally:
            if writer is not None and not writer.done():
                writer.cancel()

    async def _events(self, handle: ExecHandle) -> AsyncIterator[object]:
        try:
            async for event in handle:
                yield event
        except (NotFoundError, UnavailableError) as exc:
            raise self._unavailable(exc) from None

    @staticmethod
    async def _feed(client: SandboxClient, process_id: str, input: str | bytes | None, collected: _Collected) -> None:
        """Write ``input`` to stdin a piece at a time, then close it (always: ``cat`` must end)."""
        data = input.encode() if isinstance(input, str) else (input or b"")
        pieces = [data[i : i + MAX_INPUT_BYTES] for i in range(0, len(data), MAX_INPUT_BYTES)] or [b""]
        for index, piece in enumerate(pieces):
            last = index == len(pieces) - 1
            try:
                # Another call (the command's own stream) carries the output, so this one returns
                # at once; whatever output it still carries joins the rest by position.
                async for event in client.input(process_id, data=piece, close_stdin=last, yield_after_s=0.25):
                    collected.take(event)
            except (FailedPreconditionError, NotFoundError):
                return  # the command ended before reading all of it, as with a closed pipe

    # -- files -------------------------------------------------------------------------------
    async def write_file(self, file: str, contents: str | bytes) -> None:
        """Create or replace ``file`` (parents made) with ``contents`` (``str`` as UTF-8).

        Raises:
            PermissionError: the workspace's user may not write it.
            IsADirectoryError: ``file`` is a directory.
        """
        client, path = _client(self._address), self._path(file)
        data = contents.encode() if isinstance(contents, str) else contents
        try:
            # Past the daemon's WriteFile bound an empty write first checks, as the write itself
            # would, that the file may be written (and makes its parents); the bytes then come
            # as a one-file tar stream.
            await client.write_file(self.workspace_id, path, data if len(data) <= MAX_WRITE_BYTES else b"")
            if len(data) > MAX_WRITE_BYTES:
                mode = (await client.stat(self.workspace_id, path)).mode & 0o7777
                await client.upload(self.workspace_id, posixpath.dirname(path), _one_file_tar(path, data, mode))
        except PermissionDeniedError:
            raise PermissionError(errno.EACCES, "Permission denied", file) from None
        except (InvalidArgumentError, FailedPreconditionError) as exc:
            if await self._is_directory(client, path):
                raise IsADirectoryError(errno.EISDIR, "Is a directory", file) from None
            msg = f"cannot write {file}: {exc.message}"
            raise RuntimeError(msg) from None
        except (NotFoundError, UnavailableError) as exc:
            raise self._unavailable(exc) from None

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
            OutputLimitExceededError: it is larger than Inspect's limit (100 MiB by default).
            UnicodeDecodeError: ``text`` and it is not UTF-8.
        """
        client, path = _client(self._address), self._path(file)
        try:
            info = await client.stat(self.workspace_id, path, follow_symlinks=True)
        except NotFoundError:
            if await self._gone(client):
                msg = f"workspace {self.workspace_id} is gone"
                raise SandboxUnavailableError(msg) from None
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", file) from None
        except (InvalidArgumentError, FailedPreconditionError) as exc:  # a symlink loop, a name too long...
            raise OSError(errno.EINVAL, exc.message, file) from None
        if info.type == "directory":
            raise IsADirectoryError(errno.EISDIR, "Is a directory", file)
        if info.size_bytes > SandboxEnvironmentLimits.MAX_READ_FILE_SIZE:
            raise OutputLimitExceededError(
                limit_str=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, truncated_output=None
            )
        archive = bytearray()
        try:
            async for chunk in client.download(self.workspace_id, path, follow_symlinks=True):
                archive += chunk
        except PermissionDeniedError:
            raise PermissionError(errno.EACCES, "Permission denied", file) from None
        except NotFoundError:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", file) from None
        except (InvalidArgumentError, FailedPreconditionError) as exc:
            raise OSError(errno.EINVAL, exc.message, file) from None
        data = _only_file(bytes(archive), file)
        if len(data) > SandboxEnvironmentLimits.MAX_READ_FILE_SIZE:  # it grew between the stat and the read
            raise OutputLimitExceededError(
                limit_str=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, truncated_output=None
            )
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

    async def _call(self, call: Any) -> Any:
        try:
            return await call
        except (NotFoundError, UnavailableError) as exc:
            raise self._unavailable(exc) from None

    def _unavailable(self, exc: SandboxError) -> SandboxUnavailableError:
        return SandboxUnavailableError(f"workspace {self.workspace_id}: {exc.message}")

    async def _is_directory(self, client: SandboxClient, path: str) -> bool:
        try:
            return (await client.stat(self.workspace_id, path, follow_symlinks=True)).type == "directory"
        except SandboxError:
            return False

    async def _gone(self, client: SandboxClient) -> bool:
        try:
            await client.get_workspace(self.workspace_id)
        except NotFoundError:
            return True
        return False

    def __repr__(self) -> str:
        return f"SandboxdSandboxEnvironment({self.workspace_id!r})"


async def _one_file_tar(path: str, data: bytes, mode: int) -> AsyncIterator[bytes]:
    """A tar stream of one regular file, ``path``'s base name, in pieces."""
    header = tarfile.TarInfo(posixpath.basename(path))
    header.size, header.mode, header.mtime = len(data), mode, int(time.time())
    yield header.tobuf(format=tarfile.PAX_FORMAT)
    step = 1 << 20
    for start in range(0, len(data), step):
        yield data[start : start + step]
    padding = (-len(data)) % tarfile.BLOCKSIZE
    yield b"\0" * (padding + 2 * tarfile.BLOCKSIZE)


def _only_file(archive: bytes, file: str) -> bytes:
    """The one regular file of a Download's tar stream."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        for member in tar:
            if member.isfile():
                extracted = tar.extractfile(member)
                assert extracted is not None
                return extracted.read()
    raise FileNotFoundError(errno.ENOENT, "No such file or directory (not a regular file)", file)


async def _quietly(call: Any) -> None:
    with contextlib.suppress(SandboxError):
        await call


def _shielded() -> anyio.CancelScope:
    """A scope a cancellation does not cut short: a cleanup runs to its end."""
    return anyio.CancelScope(shield=True)
