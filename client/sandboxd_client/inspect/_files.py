"""Inspect's ``read_file`` and ``write_file`` over the daemon's file service.

Reads are a Stat and a Download (a tar of one file), held to Inspect's limit whatever the file
does meanwhile. A write up to the daemon's WriteFile bound (16 MiB) is one WriteFile; a larger
one is the shell's ``cat`` fed through stdin, written beside the target and renamed over it
where the directory allows, else in place: the rules of a small write, at any size.
"""

from __future__ import annotations

import errno
import io
import tarfile

from inspect_ai.util import OutputLimitExceededError, SandboxEnvironmentLimits
from sandboxd_protocol.limits import MAX_WRITE_BYTES

from .._client import SandboxClient
from ..errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    SandboxError,
    UnavailableError,
)
from ._commands import run_command

__all__ = ["read", "write"]

_ARCHIVE_ROOM = 64 * 1024  # a tar's headers, padding and end blocks around the file

# $1 is the path. Exit 21 and 13 say "a directory" and "not writable" without parsing text.
_LARGE_WRITE = r"""
t=$1
[ -d "$t" ] && exit 21
mkdir -p -- "$(dirname -- "$t")" || exit 2
r=$(readlink -f -- "$t" 2>/dev/null) && [ -n "$r" ] || r=$t
[ -d "$r" ] && exit 21
d=$(dirname -- "$r")
mkdir -p -- "$d" || exit 2
if [ -e "$r" ]; then
  [ -w "$r" ] || exit 13
  m=$(stat -c %a -- "$r")
else
  m=$(printf '%o' $(( 0666 & ~0$(umask) )))
fi
if f=$(mktemp -- "$d/.inspect-write.XXXXXX" 2>/dev/null); then
  trap 'rm -f -- "$f"' EXIT
  cat > "$f" && chmod "$m" "$f" || exit 1
  # A sticky directory lets no one replace another's file: that one is written in place.
  mv -f -- "$f" "$r" 2>/dev/null || cat -- "$f" > "$r" || exit 1
else
  cat > "$r"
fi
"""


async def read(client: SandboxClient, workspace_id: str, path: str, file: str) -> bytes:
    """The bytes of ``path`` (``file`` as the caller named it, for errors); a final symlink is followed.

    Raises:
        FileNotFoundError, IsADirectoryError, PermissionError, OSError: as the names say.
        OutputLimitExceededError: larger than Inspect's limit (when asked, or once read).
        NotFoundError, UnavailableError: the workspace is gone, the daemon does not answer.
    """
    limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
    try:
        info = await client.stat(workspace_id, path, follow_symlinks=True)
        if info.type == "directory":
            raise IsADirectoryError(errno.EISDIR, "Is a directory", file)
        if info.size_bytes > limit:
            raise _too_large()
        archive = bytearray()
        async for chunk in client.download(workspace_id, path, follow_symlinks=True):
            archive += chunk
            if len(archive) > limit + _ARCHIVE_ROOM:  # it grew since the stat: stop reading it
                raise _too_large()
    except NotFoundError:
        await _workspace_there(client, workspace_id)
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", file) from None
    except PermissionDeniedError:
        raise PermissionError(errno.EACCES, "Permission denied", file) from None
    except UnavailableError:
        raise
    except SandboxError as exc:  # a symlink loop, a file that shrank while read...
        raise OSError(errno.EIO, exc.message, file) from None
    data = _only_file(bytes(archive), file)
    if len(data) > limit:
        raise _too_large()
    return data


async def write(client: SandboxClient, workspace_id: str, path: str, file: str, data: bytes) -> None:
    """Create or replace ``path`` (parents made) with ``data``, as the workspace's user.

    Raises:
        PermissionError, IsADirectoryError, OSError: as the names say (``ENOSPC`` for a full disk).
        NotFoundError, UnavailableError: the workspace is gone, the daemon does not answer.
    """
    if len(data) > MAX_WRITE_BYTES:
        await _large_write(client, workspace_id, path, file, data)
        return
    try:
        await client.write_file(workspace_id, path, data)
    except PermissionDeniedError:
        raise PermissionError(errno.EACCES, "Permission denied", file) from None
    except NotFoundError:
        await _workspace_there(client, workspace_id)
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", file) from None
    except ResourceExhaustedError as exc:
        raise OSError(errno.ENOSPC, exc.message, file) from None
    except (InvalidArgumentError, FailedPreconditionError) as exc:
        if await _is_directory(client, workspace_id, path):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", file) from None
        raise OSError(errno.EINVAL, exc.message, file) from None


async def _large_write(client: SandboxClient, workspace_id: str, path: str, file: str, data: bytes) -> None:
    result = await run_command(
        client,
        workspace_id,
        ["sh", "-c", _LARGE_WRITE, "sh", path],
        input=data,
        workdir="",
        env=None,
        user=None,
        timeout=600,
    )
    if result.returncode == 0:
        return
    if result.returncode == 21:
        raise IsADirectoryError(errno.EISDIR, "Is a directory", file)
    if result.returncode == 13 or "Permission denied" in result.stderr:
        raise PermissionError(errno.EACCES, "Permission denied", file)
    if "No space left" in result.stderr:
        raise OSError(errno.ENOSPC, "No space left on device", file)
    raise OSError(errno.EIO, result.stderr.strip() or f"exit {result.returncode}", file)


async def _workspace_there(client: SandboxClient, workspace_id: str) -> None:
    """Raise NotFoundError when the workspace itself is gone (not the file)."""
    await client.get_workspace(workspace_id)


async def _is_directory(client: SandboxClient, workspace_id: str, path: str) -> bool:
    try:
        return (await client.stat(workspace_id, path, follow_symlinks=True)).type == "directory"
    except SandboxError:
        return False


def _too_large() -> OutputLimitExceededError:
    return OutputLimitExceededError(limit_str=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, truncated_output=None)


def _only_file(archive: bytes, file: str) -> bytes:
    """The one regular file of a Download's tar stream."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        for member in tar:
            if member.isfile():
                extracted = tar.extractfile(member)
                assert extracted is not None
                return extracted.read()
    raise FileNotFoundError(errno.ENOENT, "No such file or directory (not a regular file)", file)
