"""The agent protocol's bytes: its two framings and the checked reading of their JSON.

A link frame is ``length (4 bytes) | kind (1) | channel (4) | payload`` (PROTOCOL.md); a file
operation's helper replies in frames of ``kind (1) | length (4) | payload``. Every reader here
treats what comes from the container as untrusted input: a bad length or a malformed payload
is a :class:`~sandboxd.agent.errors.ProtocolError`, never an exception of another kind.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Mapping
from typing import Any

from .errors import FileOperationRefused, ProtocolError

__all__ = [
    "MAX_HELPER_FRAME_BYTES",
    "MAX_MESSAGE_CHARS",
    "MAX_PAYLOAD_BYTES",
    "PROTOCOL_VERSION",
    "U31",
    "U64",
    "FileData",
    "FileLine",
    "FileReply",
    "FileResult",
    "FrameDecoder",
    "HelperDecoder",
    "Kind",
    "encode",
    "from_container_json",
    "int_field",
    "json_object",
    "output_frame",
    "text_field",
]

PROTOCOL_VERSION = 1
MAX_PAYLOAD_BYTES = 1 << 20
"""Largest payload either side sends (PROTOCOL.md)."""

_HEADER = struct.Struct(">IcI")
_OUTPUT_HEADER = struct.Struct(">cQ")
MAX_HELPER_FRAME_BYTES = 4 * 1024 * 1024
"""Largest frame of a file operation's reply (its data comes in 64 KiB frames; a listing's result is bigger)."""
MAX_MESSAGE_CHARS = 16384
"""Longest error message taken from the agent: room for a request's paths (4 KiB each), which the
RPC layer then shortens for the caller."""
_HELPER_HEADER = struct.Struct(">cI")
U64 = 2**64 - 1
U31 = 2**31 - 1


class Kind:
    """Frame kinds (one byte each): upper case from the daemon, lower case from the agent."""

    HELLO = b"H"
    START = b"S"
    INPUT = b"I"
    CLOSE_INPUT = b"C"
    SIGNAL = b"G"
    KILL = b"K"
    WINDOW = b"W"
    PULL = b"P"
    DISCARD = b"D"
    FILE_OP = b"F"
    FILE_DATA = b"B"
    FILE_END = b"E"
    FILE_ACK = b"A"
    FREEZE = b"Z"
    RENAME = b"R"
    CONNECT = b"N"
    WELCOME = b"w"
    STARTED = b"s"
    FAILED = b"f"
    OUTPUT = b"o"
    DROPPED = b"d"
    TAIL = b"t"
    EXITED = b"x"
    FILE_TOOK = b"k"
    FILE_OUT = b"b"
    RESULT = b"r"
    ERROR = b"e"
    FROZEN = b"z"
    CONNECTED = b"n"
    HUNG_UP = b"h"


@dataclasses.dataclass(frozen=True)
class FileData:
    """Bytes of a file operation's output (a file's content, a tar stream)."""

    data: bytes


@dataclasses.dataclass(frozen=True)
class FileLine:
    """One selected line of a text read: its whole length in characters, and its first bytes."""

    chars: int
    data: bytes


@dataclasses.dataclass(frozen=True)
class FileResult:
    """A file operation's result (its last item), every string valid Unicode."""

    value: dict[str, Any]


FileReply = FileData | FileLine | FileResult


def from_container_json(payload: bytes) -> Any:
    """JSON from the container, every string made valid Unicode.

    File names are bytes: one that is not UTF-8 arrives as lone surrogates, which no
    gRPC message can carry; they are shown as U+FFFD, as file contents are.

    Raises:
        ValueError: not JSON.
    """

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            try:
                return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            except UnicodeEncodeError:
                return value.encode("utf-8", "replace").decode("utf-8", "replace")
        if isinstance(value, list):
            return [clean(item) for item in value]
        if isinstance(value, dict):
            return {clean(key): clean(item) for key, item in value.items()}
        return value

    return clean(json.loads(payload))


class HelperDecoder:
    """The file-operation helper's reply frames (one kind byte, 4-byte length, payload)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[FileReply]:
        """Whole replies now complete.

        Raises:
            FileOperationRefused: the helper's error.
            ProtocolError: a frame that is too big, unknown or malformed.
        """
        self._buffer += data
        out: list[FileReply] = []
        pos = 0  # what is parsed goes from the buffer once, not a frame at a time (a page is 2,000 lines)
        try:
            while len(self._buffer) - pos >= _HELPER_HEADER.size:
                kind, length = _HELPER_HEADER.unpack_from(self._buffer, pos)
                if length > MAX_HELPER_FRAME_BYTES:
                    msg = f"the file operation sent a frame of {length} bytes"
                    raise ProtocolError(msg)
                end = pos + _HELPER_HEADER.size + length
                if len(self._buffer) < end:
                    break
                payload = bytes(self._buffer[pos + _HELPER_HEADER.size : end])
                pos = end
                out.append(self._reply(kind, payload))
        finally:
            del self._buffer[:pos]
        return out

    @staticmethod
    def _reply(kind: bytes, payload: bytes) -> FileReply:
        if kind == b"D":
            return FileData(payload)
        if kind == b"L" and len(payload) >= 8:
            (chars,) = struct.unpack_from(">Q", payload)
            return FileLine(chars, payload[8:])
        if kind in (b"R", b"E"):
            try:
                value = from_container_json(payload)
            except ValueError:
                value = None
            if not isinstance(value, dict):
                msg = "the file operation's reply is not a JSON object"
                raise ProtocolError(msg)
            if kind == b"R":
                return FileResult(value)
            code, message = value.get("code"), value.get("message")
            if not isinstance(code, str) or not isinstance(message, str):
                msg = "the file operation's error is malformed"
                raise ProtocolError(msg)
            raise FileOperationRefused(code[:64], message[:MAX_MESSAGE_CHARS])
        msg = f"the file operation sent a frame of kind {kind!r}"
        raise ProtocolError(msg)


def json_object(payload: bytes, what: str) -> dict[str, Any]:
    """The JSON object a payload of the agent's must be; ``what`` names it in the error.

    Raises:
        ProtocolError: not JSON, or not an object.
    """
    try:
        value = json.loads(payload)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        msg = f"the agent's {what} is not a JSON object"
        raise ProtocolError(msg)
    return value


def int_field(report: Mapping[str, Any], key: str, low: int, high: int, *, default: int | None = None) -> int:
    """An integer field of an agent report, within ``[low, high]``.

    Raises:
        ProtocolError: missing (without a default), not an integer, or out of range.
    """
    value = report.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        msg = f"the agent's report has {key} = {shown}, not an integer in [{low}, {high}]"
        raise ProtocolError(msg)
    return value


def text_field(report: Mapping[str, Any], key: str, limit: int) -> str:
    """A string field of an agent report, cut to ``limit`` characters (missing: empty).

    Raises:
        ProtocolError: present but not a string.
    """
    value = report.get(key) or ""
    if not isinstance(value, str):
        msg = f"the agent's report has a {key} that is not a string"
        raise ProtocolError(msg)
    return value[:limit]


class FrameDecoder:
    """Splits the agent's byte stream into frames; a bad length is fatal for the connection."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, int, bytes]]:
        """The frames ``data`` completes, each ``(kind, channel, payload)``, in order.

        Raises:
            ProtocolError: a frame's length is out of bounds (the connection must end).
        """
        # A stream's bytes pass here at hundreds of MiB/s: each payload is copied once, straight
        # out of what arrived; only the frame a read ended inside waits in the buffer.
        out: list[tuple[bytes, int, bytes]] = []
        with memoryview(data) as view:
            pos = self._finish(view, out)
            while len(view) - pos >= _HEADER.size:
                length, kind, channel = self._header(view, pos)
                if len(view) - pos < 4 + length:
                    break
                out.append((kind, channel, bytes(view[pos + _HEADER.size : pos + 4 + length])))
                pos += 4 + length
            self._buffer += view[pos:]
        return out

    def _finish(self, view: memoryview, out: list[tuple[bytes, int, bytes]]) -> int:
        """Complete the frame begun in an earlier read; return how much of ``view`` it took."""
        if not self._buffer:
            return 0
        pos = min(max(_HEADER.size - len(self._buffer), 0), len(view))
        self._buffer += view[:pos]
        if len(self._buffer) < _HEADER.size:
            return pos
        length, kind, channel = self._header(self._buffer, 0)
        take = min(4 + length - len(self._buffer), len(view) - pos)
        self._buffer += view[pos : pos + take]
        if len(self._buffer) == 4 + length:
            with memoryview(self._buffer) as whole:
                out.append((kind, channel, bytes(whole[_HEADER.size :])))
            self._buffer = bytearray()
        return pos + take

    @staticmethod
    def _header(buffer: memoryview | bytearray, pos: int) -> tuple[int, bytes, int]:
        length, kind, channel = _HEADER.unpack_from(buffer, pos)
        if length < 5 or length - 5 > MAX_PAYLOAD_BYTES:
            msg = f"the agent sent a frame of {length} bytes"
            raise ProtocolError(msg)
        return length, kind, channel


def encode(kind: bytes, channel: int, payload: bytes | Mapping[str, Any] = b"") -> bytes:
    """One frame."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload, separators=(",", ":")).encode()
    return _HEADER.pack(len(body) + 5, kind, channel) + body


def output_frame(payload: bytes) -> tuple[str, int, bytes]:
    """An ``o`` frame: ``(stream, offset, data)``.

    Raises:
        ProtocolError: too short, or no stream named.
    """
    if len(payload) < _OUTPUT_HEADER.size:
        msg = "the agent's output frame is too short"
        raise ProtocolError(msg)
    stream, offset = _OUTPUT_HEADER.unpack_from(payload)
    if stream not in (b"1", b"2"):
        msg = "the agent's output frame names no stream"
        raise ProtocolError(msg)
    return ("stdout" if stream == b"1" else "stderr"), offset, payload[_OUTPUT_HEADER.size :]
