"""The file-operation contract with the agent: one request and one result type per operation.

Each operation of ``agent/internal/fileops`` (agent/PROTOCOL.md, "Files") has a frozen
request dataclass, which :meth:`FileRequest.encode` turns into the operation's JSON, and a
frozen result dataclass, which :meth:`FileRequest.decode` checks field by field and builds
from the ``R`` frame's object. A result that is not what the contract says (a field
missing or of the wrong type) raises :class:`MalformedResultError`, never a ``KeyError``.

An operation that fails in the container sends a code (``E`` frame); :func:`refusal` turns
it into the typed error of that code, each under the status class it has always had::

    SandboxdError                                INTERNAL
    ├── FileOperationFailedError                 (io, aborted, or a code this daemon does not know)
    ├── InvalidSpecError                         INVALID_ARGUMENT
    │   ├── PathIsDirectoryError                 is_directory
    │   ├── PathNotDirectoryError                not_directory
    │   └── InvalidFileOperationError            invalid
    ├── PathNotFoundError                        NOT_FOUND: not_found
    ├── PathExistsError                          ALREADY_EXISTS: exists
    ├── PermissionDeniedError                    PERMISSION_DENIED: permission
    ├── FailedPreconditionError                  FAILED_PRECONDITION
    │   ├── DirectoryNotEmptyError               not_empty
    │   ├── PathBusyError                        busy
    │   ├── BinaryFileError                      binary
    │   ├── FileTooLargeError                    too_large
    │   ├── FileChangedError                     conflict
    │   ├── FetchFailedError                     network
    │   └── MalformedResultError                 (the result broke the contract)
    └── QuotaExceededError                       RESOURCE_EXHAUSTED
        └── NoSpaceError                         no_space
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Generic, TypeVar

from .agent import MAX_MESSAGE_CHARS, FileOperationError, from_container_json
from .errors import (
    FailedPreconditionError,
    InvalidSpecError,
    PathExistsError,
    PathNotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    SandboxdError,
)
from .logging import cut_text

__all__ = [
    "BinaryFileError",
    "DirectoryNotEmptyError",
    "DownloadRequest",
    "DownloadResult",
    "Entry",
    "FetchFailedError",
    "FetchRequest",
    "FetchResult",
    "FileChangedError",
    "FileOperationFailedError",
    "FileRequest",
    "FileTooLargeError",
    "InvalidFileOperationError",
    "ListRequest",
    "ListResult",
    "MalformedResultError",
    "MoveRequest",
    "MoveResult",
    "NoSpaceError",
    "PathBusyError",
    "PathIsDirectoryError",
    "PathNotDirectoryError",
    "ReadRequest",
    "ReadResult",
    "ReadTextRequest",
    "ReadTextResult",
    "RemoveRequest",
    "RemoveResult",
    "StatRequest",
    "UploadRequest",
    "UploadResult",
    "WriteRequest",
    "WriteResult",
    "decode_entries",
    "refusal",
]

ResultT = TypeVar("ResultT")


# -- errors -------------------------------------------------------------------------------------


class MalformedResultError(FileOperationError):
    """A file operation's result is not what the contract says (a field missing or mistyped)."""


class FileOperationFailedError(SandboxdError):
    """The operation failed in the container for a reason with no status of its own (``io``, ``aborted``)."""

    def __init__(self, message: str, *, code: str = "io") -> None:
        """Carry the agent's ``code`` along with the ``message``."""
        super().__init__(message)
        self.code = code


class PathIsDirectoryError(InvalidSpecError):
    """The path names a directory where a file is needed (``is_directory``)."""


class PathNotDirectoryError(InvalidSpecError):
    """A component of the path is not a directory (``not_directory``)."""


class InvalidFileOperationError(InvalidSpecError):
    """The operation cannot apply to that path (``invalid``: a special file, an unsafe archive…)."""


class DirectoryNotEmptyError(FailedPreconditionError):
    """A directory removed without ``recursive`` holds entries (``not_empty``)."""


class PathBusyError(FailedPreconditionError):
    """The path is in use, a mount point say (``busy``)."""


class BinaryFileError(FailedPreconditionError):
    """A text read met NUL bytes (``binary``)."""


class FileTooLargeError(FailedPreconditionError):
    """The file (or fetched body) is over the operation's ``max_bytes`` (``too_large``)."""


class FileChangedError(FailedPreconditionError):
    """A write's ``expect_sha256`` no longer matched the file (``conflict``)."""


class FetchFailedError(FailedPreconditionError):
    """A URL could not be fetched from inside the workspace (``network``)."""


class NoSpaceError(QuotaExceededError):
    """The workspace's filesystem or quota is full (``no_space``)."""


_CODES: dict[str, type[SandboxdError]] = {
    "not_found": PathNotFoundError,
    "permission": PermissionDeniedError,
    "exists": PathExistsError,
    "is_directory": PathIsDirectoryError,
    "not_directory": PathNotDirectoryError,
    "invalid": InvalidFileOperationError,
    "not_empty": DirectoryNotEmptyError,
    "busy": PathBusyError,
    "binary": BinaryFileError,
    "too_large": FileTooLargeError,
    "conflict": FileChangedError,
    "network": FetchFailedError,
    "no_space": NoSpaceError,
}


def refusal(code: str, message: str) -> SandboxdError:
    """The typed error for an operation's failure in the container.

    Args:
        code: the agent's code (``not_found``, ``binary``, ``too_large``…, see the tree above).
        message: the agent's message; cut to :data:`~sandboxd.agent.MAX_MESSAGE_CHARS`
            characters here (paths may be 4 KiB each), shortened for the caller by the RPC layer.

    Returns:
        An instance of the code's class, or :class:`FileOperationFailedError` carrying
        ``code`` when the code has no class of its own.
    """
    message = cut_text(message, MAX_MESSAGE_CHARS)
    cls = _CODES.get(code)
    if cls is None:
        return FileOperationFailedError(message, code=code)
    return cls(message)


# -- results ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReadResult:
    """What ``read`` sent (its bytes came as data)."""

    size: int
    """Bytes sent."""
    sha256: str
    """Hex digest of the bytes sent: a write's ``expect_sha256``."""
    mode: int
    """Permission and set-id bits of the file."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReadTextResult:
    """The whole file's counts (its page's lines came as line items)."""

    total_lines: int
    """Lines in the file; a last line without a newline counts."""
    size: int
    """Bytes read."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class WriteResult:
    """What ``write`` did (the old content, when asked for and small enough, came as data)."""

    created: bool
    """There was no file before."""
    size: int
    """Bytes written."""
    old_size: int
    """Bytes of the file before, -1 when created."""
    atomic: bool
    """A temporary file was renamed over the target (else it was rewritten in place)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Entry:
    """One path: ``stat``'s result, and each line of ``list``'s data."""

    name: str
    """The last component (``/`` for the root)."""
    path: str
    """The path as asked (for ``list``, joined to the directory)."""
    type: str
    """``file``, ``directory``, ``symlink`` or ``other``."""
    size: int
    """Bytes."""
    mode: int
    """Permission and set-id bits."""
    mtime: float
    """Modification time, seconds since the epoch."""
    target: str = ""
    """A symlink's target, else empty."""
    owner: str = ""
    """The owner's name in the image, else its uid (empty from an agent before names)."""
    group: str = ""
    """The group's name in the image, else its gid."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ListResult:
    """How many entries ``list`` sent."""

    count: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class RemoveResult:
    """Removed (no fields)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoveResult:
    """Moved (no fields)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DownloadResult:
    """The archive is complete (no fields; it came as data)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class UploadResult:
    """What ``upload`` extracted."""

    entries: int
    """Archive members extracted (devices and FIFOs are not)."""
    size: int
    """Bytes of regular files written."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class FetchResult:
    """What ``fetch`` sent (the body came as data)."""

    size: int
    """Bytes of the body."""
    content_type: str
    """The response's ``Content-Type`` header, possibly empty."""


_FIELD_TYPES: dict[type[Any], dict[str, Any]] = {}


def _field_types(cls: type[Any]) -> dict[str, Any]:
    """The field types of result class ``cls``, resolved once (a list decodes thousands of entries)."""
    kinds = _FIELD_TYPES.get(cls)
    if kinds is None:
        kinds = _FIELD_TYPES[cls] = typing.get_type_hints(cls)
    return kinds


_KIND_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
_INT64 = range(-(2**63), 2**63)


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past what a float holds
        return False


def _field(op: str, name: str, value: object, kind: Any) -> object:
    # bool is an int to Python, and neither is the other on the wire. Numbers stay within what
    # the agent can send (int64, finite): the RPC layer would fail on anything else.
    if kind is bool and isinstance(value, bool):
        return value
    if kind is int and isinstance(value, int) and not isinstance(value, bool) and value in _INT64:
        return value
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool) and _finite(value):
        return float(value)
    if kind is str and isinstance(value, str):
        return value
    msg = f"the {op} result's {name!r} is not {_KIND_NAMES[kind]}"
    raise MalformedResultError(msg)


def _decode(cls: type[ResultT], op: str, value: object) -> ResultT:
    """Build result type ``cls`` from the JSON object ``value``; fields it does not know are ignored.

    Raises:
        MalformedResultError: ``value`` is not an object, or a field is missing or mistyped.
    """
    if not isinstance(value, Mapping):
        msg = f"the {op} result is not a JSON object"
        raise MalformedResultError(msg)
    kinds = _field_types(cls)
    fields: dict[str, object] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]  # every ResultT is a dataclass
        if field.name not in value:
            if field.default is dataclasses.MISSING:
                msg = f"the {op} result has no {field.name!r}"
                raise MalformedResultError(msg)
            continue
        fields[field.name] = _field(op, field.name, value[field.name], kinds[field.name])
    return cls(**fields)


def decode_entries(data: bytes) -> list[Entry]:
    """The entries of ``list``'s data: one JSON object per line, every string valid Unicode.

    Raises:
        MalformedResultError: a line is not JSON, or not an entry.
    """
    entries = []
    for line in data.split(b"\n"):
        if not line:
            continue
        try:
            value = from_container_json(line)
        except ValueError:
            msg = "a list entry is not JSON"
            raise MalformedResultError(msg) from None
        entries.append(_decode(Entry, "list entry", value))
    return entries


# -- requests -----------------------------------------------------------------------------------


class FileRequest(Generic[ResultT]):
    """One operation's request; its result is a ``ResultT``.

    Subclasses are frozen dataclasses whose fields, in order, are the operation's JSON
    fields (a ``None`` field is left out).
    """

    op: ClassVar[str]
    """The operation's name, the JSON's ``op``."""
    result_type: ClassVar[type[Any]]
    """The dataclass :meth:`decode` builds."""

    def encode(self) -> dict[str, Any]:
        """The operation's JSON object: ``op`` first, then each field that is not ``None``."""
        fields = dataclasses.asdict(self)  # type: ignore[call-overload]  # subclasses are dataclasses
        return {"op": self.op} | {name: value for name, value in fields.items() if value is not None}

    def decode(self, value: object) -> ResultT:
        """This operation's result from its ``R`` object.

        Raises:
            MalformedResultError: ``value`` is not this operation's result.
        """
        result: ResultT = _decode(self.result_type, self.op, value)
        return result


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReadRequest(FileRequest[ReadResult]):
    """Read a regular file's bytes (sent as data)."""

    op = "read"
    result_type = ReadResult
    path: str
    max_bytes: int
    """A larger file is refused: :class:`FileTooLargeError`."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReadTextRequest(FileRequest[ReadTextResult]):
    """Scan a text file once and send one page of its lines (as line items)."""

    op = "read_text"
    result_type = ReadTextResult
    path: str
    offset: int
    """First line of the page, 1-based."""
    limit: int
    """Lines in the page."""
    keep_bytes: int
    """Bytes sent of each line's start (its length in characters comes whole)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class WriteRequest(FileRequest[WriteResult]):
    """Write the operation's input to a file: atomically where the directory allows it."""

    op = "write"
    result_type = WriteResult
    path: str
    mkdirs: bool = True
    """Create missing parent directories."""
    return_old_max: int = 0
    """Send the old content (as data) when it is at most this many bytes."""
    expect_sha256: str | None = None
    """Compare-and-swap: the old content's digest, ``absent`` for no file; else
    :class:`FileChangedError`."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class StatRequest(FileRequest[Entry]):
    """Describe one path."""

    op = "stat"
    result_type = Entry
    path: str
    follow: bool = False
    """Describe a final symlink's target instead of the link."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ListRequest(FileRequest[ListResult]):
    """List a directory: its entries as data, see :func:`decode_entries`."""

    op = "list"
    result_type = ListResult
    path: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class RemoveRequest(FileRequest[RemoveResult]):
    """Delete a file, a link or a directory."""

    op = "remove"
    result_type = RemoveResult
    path: str
    recursive: bool = False
    """Delete a directory and everything in it."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoveRequest(FileRequest[MoveResult]):
    """Rename a path (copying across filesystems)."""

    op = "move"
    result_type = MoveResult
    source: str
    destination: str
    overwrite: bool = False
    """Replace an existing destination; else :class:`~sandboxd.errors.PathExistsError`."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class UploadRequest(FileRequest[UploadResult]):
    """Extract the tar stream of the operation's input into a directory (created when missing)."""

    op = "upload"
    result_type = UploadResult
    path: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class DownloadRequest(FileRequest[DownloadResult]):
    """Send a tar archive of a file or tree as data."""

    op = "download"
    result_type = DownloadResult
    path: str
    follow: bool = False
    """Archive a final symlink's target instead of the link."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class FetchRequest(FileRequest[FetchResult]):
    """GET an http(s) URL from inside the workspace (its network policy applies); the body is data."""

    op = "fetch"
    result_type = FetchResult
    url: str
    max_bytes: int
    """A larger body is refused: :class:`FileTooLargeError`."""
    timeout_s: float
    """The whole request, in seconds."""
