"""The daemon's side of the supervisor frame protocol (see ``sandboxd/supervisor.py``).

A frame is one type byte, a 4-byte big-endian payload length, then the payload.
Frames to the supervisor carry plain text payloads (``"2,1"``), not JSON: the
supervisor does not import ``json``, which would cost every command about
12 ms of interpreter start-up.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping

__all__ = [
    "CLOSE_STDIN",
    "ENV",
    "EXITED",
    "FAILED",
    "HEADER",
    "KILL",
    "MAX_FRAME_BYTES",
    "RESIZE",
    "SIGNAL",
    "STARTED",
    "STDERR",
    "STDIN",
    "STDOUT",
    "FrameDecoder",
    "FrameError",
    "encode",
    "encode_env",
    "encode_json",
    "encode_kill",
    "encode_resize",
    "encode_signal",
]

HEADER = struct.Struct(">cI")

STARTED = b"P"
FAILED = b"F"
STDOUT = b"1"
STDERR = b"2"
EXITED = b"X"
STDIN = b"I"
ENV = b"E"
CLOSE_STDIN = b"C"
SIGNAL = b"S"
KILL = b"K"
RESIZE = b"W"

MAX_FRAME_BYTES = 1 << 20
"""Largest payload accepted from a supervisor (it sends at most 64 KiB per frame)."""


class FrameError(Exception):
    """The supervisor's byte stream is not a valid frame sequence."""


def encode(kind: bytes, payload: bytes = b"") -> bytes:
    """Return one frame."""
    return HEADER.pack(kind, len(payload)) + payload


def encode_env(env: Mapping[str, str]) -> bytes:
    """Return the ``E`` frame: ``NAME``, NUL, ``VALUE``, NUL, ... (names and values hold no NUL; ``check_env``)."""
    payload = b"".join(
        name.encode("utf-8", "surrogateescape") + b"\0" + value.encode("utf-8", "surrogateescape") + b"\0"
        for name, value in env.items()
    )
    return encode(ENV, payload)


def encode_json(kind: bytes, obj: object) -> bytes:
    """Return one frame whose payload is ``obj`` as JSON."""
    return encode(kind, json.dumps(obj).encode())


def encode_signal(number: int, *, interrupt: bool) -> bytes:
    """A ``S`` frame: send ``number`` to the process group (0 sends nothing); mark a Ctrl-C."""
    return encode(SIGNAL, f"{number},{int(interrupt)}".encode())


def encode_kill(grace_s: float) -> bytes:
    """A ``K`` frame: kill the whole tree, SIGTERM first and SIGKILL after ``grace_s`` seconds."""
    return encode(KILL, repr(float(grace_s)).encode())


def encode_resize(columns: int, rows: int) -> bytes:
    """A ``W`` frame: the terminal is now ``columns`` x ``rows``."""
    return encode(RESIZE, f"{columns},{rows}".encode())


class FrameDecoder:
    """Incremental decoder: feed bytes in any split, get whole frames out in order."""

    def __init__(self) -> None:
        """Start with an empty buffer."""
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Add ``data`` and yield every ``(kind, payload)`` frame now complete.

        Raises:
            FrameError: a frame announces more than ``MAX_FRAME_BYTES``.
        """
        self._buffer += data
        while len(self._buffer) >= HEADER.size:
            kind, length = HEADER.unpack_from(self._buffer)
            if length > MAX_FRAME_BYTES:
                msg = f"supervisor frame of {length} bytes exceeds the {MAX_FRAME_BYTES}-byte limit"
                raise FrameError(msg)
            end = HEADER.size + length
            if len(self._buffer) < end:
                return
            payload = bytes(self._buffer[HEADER.size : end])
            del self._buffer[:end]
            yield kind, payload

    @property
    def pending(self) -> int:
        """Bytes held that do not yet form a whole frame."""
        return len(self._buffer)
