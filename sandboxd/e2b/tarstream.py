"""One file in and out of sandboxd's tar streams (Upload, Download), without holding it whole.

envd's ``/files`` moves one file's bytes; sandboxd's file service moves tar archives. The
headers are the standard library's (:mod:`tarfile`); only the walking is streamed here.
"""

from __future__ import annotations

import tarfile
import time
from collections.abc import AsyncIterable, AsyncIterator

__all__ = ["NotAFileError", "empty_archive", "file_archive", "file_content"]

_BLOCK = tarfile.BLOCKSIZE
# Entries that describe the next one (pax and GNU long names) rather than being files.
_META = {tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK}


class NotAFileError(Exception):
    """The archive's entry is a directory (or another kind that has no bytes to give)."""


def empty_archive() -> bytes:
    """A tar archive with no entries: extracting it only creates the target directory."""
    return b"\0" * (2 * _BLOCK)


async def file_archive(name: str, size: int, content: AsyncIterable[bytes], mode: int = 0o644) -> AsyncIterator[bytes]:
    """A tar archive of one regular file ``name`` of ``size`` bytes, streamed from ``content``.

    Raises:
        ValueError: ``content`` gave more or fewer than ``size`` bytes.
    """
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = mode
    info.mtime = int(time.time())
    yield info.tobuf(format=tarfile.PAX_FORMAT)
    given = 0
    async for chunk in content:
        given += len(chunk)
        if given > size:
            msg = f"the content is longer than the {size} bytes announced"
            raise ValueError(msg)
        yield chunk
    if given != size:
        msg = f"the content is {given} bytes, not the {size} announced"
        raise ValueError(msg)
    yield b"\0" * (-size % _BLOCK) + empty_archive()


class _Reader:
    """Exact reads from an async stream of chunks."""

    def __init__(self, chunks: AsyncIterable[bytes]) -> None:
        self._chunks = aiter(chunks)
        self._buffer = bytearray()

    async def _fill(self, wanted: int) -> bool:
        while len(self._buffer) < wanted:
            chunk = await anext(self._chunks, None)
            if chunk is None:
                return False
            self._buffer += chunk
        return True

    async def read(self, size: int) -> bytes:
        if not await self._fill(size):
            msg = "the archive ended early"
            raise tarfile.ReadError(msg)
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    async def stream(self, size: int) -> AsyncIterator[bytes]:
        """``size`` bytes, as they come."""
        left = size
        while left:
            if not self._buffer and not await self._fill(1):
                msg = "the archive ended early"
                raise tarfile.ReadError(msg)
            piece = bytes(self._buffer[:left])
            del self._buffer[: len(piece)]
            left -= len(piece)
            yield piece


async def file_content(chunks: AsyncIterable[bytes]) -> tuple[int, AsyncIterator[bytes]]:
    """The size and the bytes of the first entry of a tar stream, which must be a regular file.

    Raises:
        NotAFileError: the entry is a directory, a link or a device.
        tarfile.ReadError: the stream is not a tar archive, or ends early.
    """
    reader = _Reader(chunks)
    while True:
        info = tarfile.TarInfo.frombuf(await reader.read(_BLOCK), tarfile.ENCODING, "surrogateescape")
        padded = info.size + (-info.size % _BLOCK)
        if info.type in _META:
            await reader.read(padded)
            continue
        if not info.isreg():
            msg = f"{info.name} is a directory" if info.isdir() else f"{info.name} is not a regular file"
            raise NotAFileError(msg)
        break

    async def content() -> AsyncIterator[bytes]:
        async for piece in reader.stream(info.size):
            yield piece

    return info.size, content()
