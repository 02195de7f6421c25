"""Workspace file semantics: ``cat -n`` reads, exact-string edits, atomic writes, images, trees.

The semantics are pure functions here:
:func:`format_page`, :func:`apply_edit`, :func:`unified_diff`,
:func:`write_summary`, :func:`sniff_image`. :class:`FileManager` runs the
primitive operations inside the container as the workspace user through the
workspace's agent (``agent/internal/fileops``) and applies the semantics on top, so
symlinks can never resolve on the daemon's host.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import dataclasses
import difflib
import io
import posixpath
import random
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from typing import Any, Generic, TypeVar

import structlog
from sandboxd_protocol.limits import (
    MAX_EDIT_STRING_BYTES,
    MAX_PATH_BYTES,
    MAX_URL_BYTES,
    MAX_WRITE_BYTES,
    utf8_size,
)

from .agent import FileData, FileLine, FileOperationRefused, FileReply, FileResult
from .backend.base import Backend
from .errors import ExecTimeoutError, FailedPreconditionError, InvalidSpecError
from .fileops import (
    BinaryFileError,
    DownloadRequest,
    Entry,
    FetchRequest,
    FileChangedError,
    FileRequest,
    FileTooLargeError,
    ListRequest,
    MalformedResultError,
    MoveRequest,
    ReadRequest,
    ReadTextRequest,
    RemoveRequest,
    StatRequest,
    UploadRequest,
    UploadResult,
    WriteRequest,
    WriteResult,
    decode_entries,
    refusal,
)
from .workspaces import WorkspaceManager

__all__ = [
    "DEFAULT_READ_LIMIT",
    "IMAGE_MAX_BYTES",
    "MAX_EDIT_BYTES",
    "MAX_LINE_CHARS",
    "WORKSPACE_ROOT",
    "EditOutcome",
    "FileManager",
    "ImageData",
    "Page",
    "WriteOutcome",
    "apply_edit",
    "count_lines",
    "edit_diff",
    "format_page",
    "resolve_path",
    "sniff_image",
    "unified_diff",
    "write_summary",
]

log = structlog.get_logger(__name__)

WORKSPACE_ROOT = "/workspace"
DEFAULT_READ_LIMIT = 2000
"""Lines per ReadFile page when the caller sets no limit."""
MAX_LINE_CHARS = 2000
"""Characters of one line shown before it is cut."""
MAX_EDIT_BYTES = MAX_WRITE_BYTES
"""Largest file EditFile loads, in bytes."""
DIFF_OLD_MAX_BYTES = 1024 * 1024
"""Largest old content WriteFile fetches to diff against, in bytes."""
MAX_DIFF_HUNKS = 5
"""Hunks shown before the rest of an edit is summarised (the first few)."""
MAX_WRITE_DIFF_LINES = 40
"""Changed lines a WriteFile report shows as a diff before it falls back to a +X/-Y summary."""
MAX_DIFFED_LINES = 20000
"""Largest old + new line count WriteFile runs a diff search on (difflib is quadratic at worst)."""
IMAGE_MAX_BYTES = 5 * 1024 * 1024
"""Largest image ReadImage returns: 5 MB."""
_IMAGE_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp"}
_BOM = b"\xef\xbb\xbf"
_EDIT_ATTEMPTS = 50
FILE_OP_TIMEOUT_S = 120.0
MAX_REPLY_BYTES = MAX_EDIT_BYTES + 4 * 1024 * 1024
"""Most the daemon holds of one (non-streaming) file operation's reply: the largest legitimate
one is a whole file read for an edit."""
"""Longest one file operation may take inside the container, in seconds."""


# -- pure semantics ------------------------------------------------------------------------------


def resolve_path(path: str) -> str:
    """Resolve ``path`` against /workspace (absolute paths stay as they are).

    Raises:
        InvalidSpecError: the path is empty or holds a NUL character.
    """
    if not path:
        msg = "path must not be empty"
        raise InvalidSpecError(msg)
    if utf8_size(path) > MAX_PATH_BYTES:
        msg = f"path is {utf8_size(path)} bytes; the limit is {MAX_PATH_BYTES} (Linux's PATH_MAX)"
        raise InvalidSpecError(msg)
    if "\0" in path:
        msg = "path must not contain NUL characters"
        raise InvalidSpecError(msg)
    return path if path.startswith("/") else posixpath.join(WORKSPACE_ROOT, path)


def count_lines(data: bytes) -> int:
    """Lines in ``data``: newlines, plus one for a last line without a newline."""
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Page:
    """One ReadFile page."""

    content: str
    total_lines: int
    first_line: int
    line_count: int
    next_offset: int
    """Offset of the next page, 0 when this page reaches the end."""
    lines_truncated: bool


def format_page(lines: Sequence[tuple[int, bytes]], *, first_line: int, total_lines: int) -> Page:
    """Render lines in ``cat -n`` form.

    Args:
        lines: per line, its full length in characters and its first bytes.
        first_line: number of the first line, 1-based.
        total_lines: lines in the whole file.

    Returns:
        Each line as a right-aligned 6-wide number, a tab and the text (a CR before
        the newline is not shown; invalid UTF-8 shows as U+FFFD). A line over 2000
        characters is cut on a character boundary with a marker, and a notice
        follows; when lines remain, a trailer names the next offset.
    """
    out = []
    truncated = False
    for index, (chars, kept) in enumerate(lines):
        text = kept.decode("utf-8", "replace")
        if text.endswith("\r"):
            text = text[:-1]
        if chars > MAX_LINE_CHARS or len(text) > MAX_LINE_CHARS:
            omitted = max(chars, len(text)) - MAX_LINE_CHARS
            text = f"{text[:MAX_LINE_CHARS]}… [line cut: {omitted} more characters]"
            truncated = True
        out.append(f"{first_line + index:6d}\t{text}")
    next_line = first_line + len(lines)
    notices = []
    if truncated:
        notices.append(
            f"[Some lines are longer than {MAX_LINE_CHARS} characters and were cut; "
            "use exec_command to see them in full.]"
        )
    next_offset = 0
    if next_line <= total_lines:
        next_offset = next_line
        notices.append(f"[{total_lines - next_line + 1} more lines; continue with offset={next_line}.]")
    if total_lines == 0:
        notices.append("[The file is empty.]")
    content = "\n".join(out + notices)
    return Page(
        content=content,
        total_lines=total_lines,
        first_line=first_line,
        line_count=len(lines),
        next_offset=next_offset,
        lines_truncated=truncated,
    )


def split_lines(text: str) -> list[str]:
    r"""Lines with their endings, split on ``\n`` only.

    ``str.splitlines`` also breaks on form feeds, ``\x1c``-``\x1e``, ``\x85``,
    U+2028 and lone CRs, which would put diff hunks on the wrong line numbers.
    """
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _line_of(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class EditOutcome:
    """The result of applying an edit to a file's bytes."""

    data: bytes
    replacements: int
    diff: str
    message: str


def apply_edit(data: bytes, old: str, new: str, *, replace_all: bool, path: str) -> EditOutcome:
    """Replace ``old`` with ``new`` in a file's bytes, keeping everything else byte for byte.

    Matching is exact, except that in a file whose lines all end in
    CRLF, LF in ``old``/``new`` stands for CRLF. A UTF-8 BOM, tabs, invalid
    UTF-8 bytes, and the presence or absence of a final newline are kept.

    Raises:
        InvalidSpecError: empty ``old``, ``old == new``, no match, or several matches
            without ``replace_all`` (the message gives the count and line numbers).
        FailedPreconditionError: the file holds NUL bytes (binary).
    """
    if not old:
        msg = "old_string must not be empty; to replace the whole file use write_file"
        raise InvalidSpecError(msg)
    if old == new:
        msg = "old_string and new_string are identical; there is nothing to change"
        raise InvalidSpecError(msg)
    if b"\0" in data:
        msg = f"{path} is a binary file (it contains NUL bytes); edit it with exec_command instead"
        raise FailedPreconditionError(msg)
    bom = data.startswith(_BOM)
    text = data[len(_BOM) :].decode("utf-8", "surrogateescape") if bom else data.decode("utf-8", "surrogateescape")
    crlf = "\r\n" in text and text.count("\r\n") == text.count("\n")
    if crlf:
        text = text.replace("\r\n", "\n")
        old, new = old.replace("\r\n", "\n"), new.replace("\r\n", "\n")
    positions = []
    start = text.find(old)
    while start >= 0:
        positions.append(start)
        start = text.find(old, start + len(old))
    if not positions:
        msg = f"old_string was not found in {path}; it must match the file exactly, whitespace and indentation included"
        raise InvalidSpecError(msg)
    if len(positions) > 1 and not replace_all:
        lines = ", ".join(str(_line_of(text, p)) for p in positions[:20])
        more = f" and {len(positions) - 20} more" if len(positions) > 20 else ""
        msg = (
            f"old_string occurs {len(positions)} times in {path} (at lines {lines}{more}); "
            "add surrounding context to make it unique, or set replace_all to replace every occurrence"
        )
        raise InvalidSpecError(msg)
    if not replace_all:
        positions = positions[:1]
    result = text.replace(old, new) if replace_all else text.replace(old, new, 1)
    diff = edit_diff(text, positions, old, new, path)
    if crlf:
        result = result.replace("\n", "\r\n")
    body = result.encode("utf-8", "surrogateescape")
    count = len(positions)
    return EditOutcome(
        data=(_BOM + body) if bom else body,
        replacements=count,
        diff=diff,
        message=f"Replaced {count} occurrence(s) in {path}\n{diff}",
    )


def edit_diff(
    text: str,
    positions: Sequence[int],
    old: str,
    new: str,
    path: str,
    *,
    max_hunks: int = MAX_DIFF_HUNKS,
    context: int = 3,
) -> str:
    r"""The unified diff of an edit, built from its known sites in one pass (no diff search).

    Each site becomes its own hunk; sites whose hunks would overlap or touch
    (closer than ``2 * context`` lines, as git does) share one. After
    ``max_hunks`` hunks the rest is summarised as ``…and N more replacements``.
    A line without a final newline carries ``\ No newline at end of file``.
    """
    lines = split_lines(text)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    blocks = _site_blocks(starts, positions, len(old))
    changed = _changed_blocks(text, lines, starts, blocks, old, new)
    return "\n".join(_render_hunks(lines, changed, path, max_hunks=max_hunks, context=context))


_Block = tuple[int, int, list[str], int]
"""A changed run of old lines: first and last old line (0-based), its new lines, and its sites."""


def _site_blocks(starts: Sequence[int], positions: Sequence[int], old_length: int) -> list[tuple[int, int, list[int]]]:
    """Blocks of whole old lines ``(first, last, sites)``: sites on shared lines share a block.

    Args:
        starts: the offset of each line's start, then the text's end.
        positions: the offsets of the replaced sites, ascending.
        old_length: characters of the replaced string.
    """

    def line_index(offset: int) -> int:
        return max(0, bisect.bisect_right(starts, offset) - 1)

    blocks: list[tuple[int, int, list[int]]] = []
    for pos in positions:
        first, last = line_index(pos), line_index(pos + max(old_length, 1) - 1)
        if blocks and first <= blocks[-1][1]:
            blocks[-1] = (blocks[-1][0], max(blocks[-1][1], last), [*blocks[-1][2], pos])
        else:
            blocks.append((first, last, [pos]))
    return blocks


def _changed_blocks(
    text: str,
    lines: Sequence[str],
    starts: Sequence[int],
    blocks: Sequence[tuple[int, int, list[int]]],
    old: str,
    new: str,
) -> list[_Block]:
    """Each block with the new lines that replace it.

    A replacement that removes a line's newline joins it with the next line, so such a
    block grows to the next line (taking in any later block it reaches).
    """
    changed: list[_Block] = []
    index = 0
    while index < len(blocks):
        first, last, sites = blocks[index]
        while True:
            begin, end = starts[first], starts[last + 1]
            segment, cursor = [], begin
            for pos in sites:
                segment += [text[cursor:pos], new]
                cursor = pos + len(old)
            segment.append(text[cursor:end])
            replaced = "".join(segment)
            if replaced.endswith("\n") or last + 1 >= len(lines) or not replaced:
                break
            last += 1
            while index + 1 < len(blocks) and blocks[index + 1][0] <= last:
                index += 1
                last = max(last, blocks[index][1])
                sites = sites + blocks[index][2]
        changed.append((first, last, split_lines(replaced), len(sites)))
        index += 1
    return changed


def _render_hunks(
    lines: Sequence[str], changed: Sequence[_Block], path: str, *, max_hunks: int, context: int
) -> list[str]:
    """The diff's lines: the header, then the blocks grouped into hunks with ``context`` lines around."""
    out = [f"--- a/{path.lstrip('/')}", f"+++ b/{path.lstrip('/')}"]
    hunks: list[list[_Block]] = []
    for block in changed:
        if hunks and block[0] - hunks[-1][-1][1] - 1 <= 2 * context:
            hunks[-1].append(block)
        else:
            hunks.append([block])
    shift = 0  # new-line offset accumulated by earlier blocks
    total_sites = sum(block[3] for block in changed)
    shown = 0
    for number, hunk in enumerate(hunks):
        if number == max_hunks:
            out.append(f"…and {total_sites - shown} more replacements")
            break
        old_start = max(0, hunk[0][0] - context)
        old_end = min(len(lines), hunk[-1][1] + 1 + context)
        body: list[str] = []
        cursor = old_start
        new_count = 0
        for first, last, new_lines, sites in hunk:
            body += _diff_lines(" ", lines[cursor:first])
            new_count += first - cursor
            body += _diff_lines("-", lines[first : last + 1])
            body += _diff_lines("+", new_lines)
            new_count += len(new_lines)
            cursor = last + 1
            shown += sites
        body += _diff_lines(" ", lines[cursor:old_end])
        new_count += old_end - cursor
        new_start = old_start + shift
        out.append(f"@@ -{_range(old_start, old_end)} +{_range(new_start, new_start + new_count)} @@")
        out += body
        shift += sum(len(new_lines) - (last - first + 1) for first, last, new_lines, _ in hunk)
    return out


def unified_diff(old: str, new: str, path: str, *, context: int = 3) -> str:
    r"""A git-style unified diff of two texts (difflib), with ``\ No newline at end of file`` markers.

    Changes closer than ``2 * context`` lines share a hunk, as in git.
    """
    a = split_lines(old)
    b = split_lines(new)
    out = [f"--- a/{path.lstrip('/')}", f"+++ b/{path.lstrip('/')}"]
    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(context):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{_range(i1, i2)} +{_range(j1, j2)} @@")
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                out += _diff_lines(" ", a[x1:x2])
                continue
            out += _diff_lines("-", a[x1:x2])
            out += _diff_lines("+", b[y1:y2])
    return "\n".join(out)


def _range(start: int, end: int) -> str:
    length = end - start
    if length == 0:
        return f"{start},0"
    if length == 1:
        return f"{start + 1}"
    return f"{start + 1},{length}"


def _diff_lines(prefix: str, lines: Sequence[str]) -> list[str]:
    out = []
    for line in lines:
        shown = line.rstrip("\n").removesuffix("\r")
        out.append(prefix + shown.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
        if not line.endswith("\n"):
            out.append("\\ No newline at end of file")
    return out


def write_summary(path: str, new: bytes, old: bytes | None, *, old_size: int, created: bool) -> tuple[str, str]:
    """The WriteFile report: ``Created``/``Overwrote`` with counts, then a diff or ``+X/-Y``.

    Args:
        path: the resolved path.
        new: the bytes written.
        old: the previous content, when it was small enough to fetch.
        old_size: the previous size in bytes (-1 when the file did not exist).
        created: whether the file is new.

    Returns:
        The message and the diff alone (empty when none is shown).
    """
    counts = f"{count_lines(new)} lines, {len(new)} bytes"
    if created:
        return f"Created {path} ({counts})", ""
    if old is None:
        return f"Overwrote {path} ({counts}; was {old_size} bytes)", ""
    head = f"Overwrote {path} ({counts}; was {count_lines(old)} lines, {len(old)} bytes)"
    if old == new:
        return f"{head}\nThe content is unchanged.", ""
    if b"\0" in old or b"\0" in new:
        return f"{head}\nBinary content: no text diff.", ""
    old_text = old.decode("utf-8", "surrogateescape")
    new_text = new.decode("utf-8", "surrogateescape")
    old_lines, new_lines = split_lines(old_text), split_lines(new_text)
    # Lines added and removed, counted as multisets: linear, and exact for a small change.
    added = sum((collections.Counter(new_lines) - collections.Counter(old_lines)).values())
    removed = sum((collections.Counter(old_lines) - collections.Counter(new_lines)).values())
    if added + removed <= MAX_WRITE_DIFF_LINES and len(old_lines) + len(new_lines) <= MAX_DIFFED_LINES:
        diff = unified_diff(old_text, new_text, path)
        if diff.count("\n") - 1 <= MAX_WRITE_DIFF_LINES * 3:
            return f"{head}\n{diff}", diff
    return f"{head}\n+{added}/-{removed} lines changed (diff too large to show)", ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ImageData:
    """An image as ReadImage returns it."""

    data: bytes
    mime_type: str
    width: int
    height: int


def sniff_image(data: bytes, source: str) -> ImageData:
    """Identify a png/jpeg/gif/webp image by its content (Pillow), never by its name.

    Raises:
        FailedPreconditionError: larger than 5 MB, or not one of the four formats.
    """
    if len(data) > IMAGE_MAX_BYTES:
        msg = f"{source} is {len(data)} bytes, over the 5 MB limit for images"
        raise FailedPreconditionError(msg)
    from PIL import Image, UnidentifiedImageError

    # Only the header is read, never the pixels: a huge canvas is no bomb here. Set once for the
    # daemon (which decodes no pixels anywhere), not toggled: sniffs run in threads.
    Image.MAX_IMAGE_PIXELS = None
    try:
        with Image.open(io.BytesIO(data)) as image:
            kind = image.format or ""
            width, height = image.size
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        msg = f"{source} is not a png, jpeg, gif or webp image"
        raise FailedPreconditionError(msg) from exc
    if kind not in _IMAGE_TYPES:
        msg = f"{source} is a {kind or 'unknown'} image; only png, jpeg, gif and webp are supported"
        raise FailedPreconditionError(msg)
    return ImageData(data=data, mime_type=_IMAGE_TYPES[kind], width=width, height=height)


# -- running operations in the container ------------------------------------------------------


_ResultT = TypeVar("_ResultT")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Reply(Generic[_ResultT]):
    """One operation's whole reply: its result, its data bytes and its selected lines."""

    result: _ResultT
    data: bytes
    lines: list[tuple[int, bytes]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class WriteOutcome:
    """What WriteFile did, as it reports it."""

    message: str
    """The report: ``Created``/``Overwrote`` with counts, then a diff or ``+X/-Y``."""
    created: bool
    """There was no file before."""
    diff: str
    """The diff alone, empty when none is shown."""
    size_bytes: int
    """Bytes written."""
    line_count: int
    """Lines written (a last line without a newline counts)."""


class FileManager:
    """File operations on workspaces, each run in the container as the workspace user.

    Args:
        backend: the container engine.
        workspaces: resolves a workspace id to its user (and checks it runs).
    """

    def __init__(self, backend: Backend, workspaces: WorkspaceManager) -> None:
        """Wire the manager."""
        self.backend = backend
        self.workspaces = workspaces
        self._locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = weakref.WeakValueDictionary()
        self._sniffing = asyncio.Semaphore(2)

    def _lock(self, workspace_id: str, path: str) -> asyncio.Lock:
        key = (workspace_id, path)
        lock = self._locks.get(key)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[key] = lock
        return lock

    async def _stream(
        self, workspace_id: str, request: FileRequest[Any], stdin: AsyncIterable[bytes] | None = None
    ) -> AsyncIterator[FileReply]:
        """Run one file operation through the workspace's agent; yield its replies, a ``FileResult`` last.

        The workspace counts as in use until the call ends: a long upload is never idle-reaped.
        Only once the caller is known to own it: another tenant's calls must not keep it alive.

        Raises:
            SandboxdError: the operation's own failure, the typed error of its code
                (:func:`sandboxd.fileops.refusal`).
        """
        context = await self.workspaces.exec_context(workspace_id)
        replies = context.link.file_operation(context.user, request.encode(), stdin)
        try:
            async with self.workspaces.in_use(workspace_id):
                async for reply in replies:
                    yield reply
        except FileOperationRefused as exc:
            raise refusal(exc.code, exc.message) from None
        finally:
            await replies.aclose()

    async def close(self) -> None:
        """Nothing to finish: an abandoned operation's helper is ended by its agent."""

    async def _call(
        self, workspace_id: str, request: FileRequest[_ResultT], stdin: AsyncIterable[bytes] | None = None
    ) -> _Reply[_ResultT]:
        """Run one operation to its end, within :data:`FILE_OP_TIMEOUT_S`, holding its whole reply.

        Raises:
            ExecTimeoutError: the operation took longer than :data:`FILE_OP_TIMEOUT_S`.
            FailedPreconditionError: the reply passed :data:`MAX_REPLY_BYTES`.
            MalformedResultError: the result is not the operation's.
        """
        data = bytearray()
        lines: list[tuple[int, bytes]] = []
        result: _ResultT | None = None
        held = 0
        try:
            async with asyncio.timeout(FILE_OP_TIMEOUT_S):
                async for reply in self._stream(workspace_id, request, stdin):
                    # The operation's limits are enforced in the container, where a hostile
                    # workspace could defeat them: the daemon bounds what it holds itself.
                    if isinstance(reply, FileResult):
                        result = request.decode(reply.value)
                        continue
                    held += len(reply.data)
                    if held > MAX_REPLY_BYTES:
                        msg = f"the file operation's reply passed {MAX_REPLY_BYTES} bytes and was stopped"
                        raise FailedPreconditionError(msg)
                    if isinstance(reply, FileLine):
                        lines.append((reply.chars, reply.data))
                    else:
                        data += reply.data
        except TimeoutError:
            msg = f"the file operation did not finish within {FILE_OP_TIMEOUT_S:g} s and was stopped"
            raise ExecTimeoutError(msg) from None
        if result is None:
            msg = f"the {request.op} operation ended without a result"
            raise MalformedResultError(msg)
        return _Reply(result=result, data=bytes(data), lines=lines)

    # -- operations ---------------------------------------------------------------------------------
    async def read_file(self, workspace_id: str, path: str, *, offset: int = 0, limit: int = 0) -> tuple[str, Page]:
        """A page of a text file in ``cat -n`` form (defaults: offset 1, limit 2000).

        Returns:
            The resolved path and the page.

        Raises:
            PathNotFoundError: no such file.
            BinaryFileError: the content has NUL bytes (a FailedPreconditionError).
            InvalidSpecError: bad offset/limit, a directory, or an offset past the end.
        """
        if offset < 0 or limit < 0:
            msg = "offset and limit must not be negative"
            raise InvalidSpecError(msg)
        first = offset or 1
        count = limit or DEFAULT_READ_LIMIT
        resolved = resolve_path(path)
        request = ReadTextRequest(path=resolved, offset=first, limit=count, keep_bytes=MAX_LINE_CHARS * 4 + 4)
        try:
            reply = await self._call(workspace_id, request)
        except BinaryFileError:
            msg = (
                f"{resolved} is a binary file (it contains NUL bytes), so it is not shown as text; "
                "inspect it with exec_command (e.g. `file`, `xxd | head`) or, for an image, read_image"
            )
            raise BinaryFileError(msg) from None
        total = reply.result.total_lines
        if first > max(total, 1):
            msg = f"offset {first} is past the end of {resolved}, which has {total} lines"
            raise InvalidSpecError(msg)
        return resolved, format_page(reply.lines, first_line=first, total_lines=total)

    async def edit_file(
        self, workspace_id: str, path: str, old: str, new: str, *, replace_all: bool = False
    ) -> tuple[str, EditOutcome]:
        """Replace an exact string in an existing file and return the outcome with its diff.

        Edits of one path through this daemon are serialised, and each write
        checks the file is still what was read (a change from elsewhere makes it
        re-read and re-apply), so concurrent edits never lose an update.

        Returns:
            The resolved path and the outcome.

        Raises:
            PathNotFoundError: the file does not exist.
            InvalidSpecError: see :func:`apply_edit`.
            PermissionDeniedError: the workspace user may not write the file.
        """
        resolved = resolve_path(path)
        for name, value in (("old_string", old), ("new_string", new)):
            if utf8_size(value) > MAX_EDIT_STRING_BYTES:
                msg = f"{name} is {utf8_size(value)} bytes; the limit is {MAX_EDIT_STRING_BYTES}"
                raise InvalidSpecError(msg)
        async with self._lock(workspace_id, resolved):
            for attempt in range(_EDIT_ATTEMPTS):
                if attempt:
                    # Someone else wrote the file (through another name, or the shell): re-read and re-apply.
                    await asyncio.sleep(random.uniform(0, 0.02 * attempt))
                reply = await self._call(workspace_id, ReadRequest(path=resolved, max_bytes=MAX_EDIT_BYTES))
                outcome = await asyncio.to_thread(
                    apply_edit, reply.data, old, new, replace_all=replace_all, path=resolved
                )
                try:
                    await self._write(workspace_id, resolved, outcome.data, expect=reply.result.sha256)
                except FileChangedError:
                    continue
                log.info("file.edited", workspace_id=workspace_id, path=resolved, replacements=outcome.replacements)
                return resolved, outcome
        msg = f"{resolved} kept changing while being edited; try again"
        raise FailedPreconditionError(msg)

    async def _write(
        self, workspace_id: str, path: str, data: bytes, *, expect: str | None = None, return_old_max: int = 0
    ) -> _Reply[WriteResult]:
        async def chunks() -> AsyncIterator[bytes]:
            yield data

        request = WriteRequest(path=path, mkdirs=True, return_old_max=return_old_max, expect_sha256=expect)
        return await self._call(workspace_id, request, chunks())

    async def write_file(self, workspace_id: str, path: str, content: bytes) -> tuple[str, WriteOutcome]:
        """Create or atomically overwrite a file with exactly ``content``; parents are created.

        Returns:
            The resolved path and what was done.

        Raises:
            InvalidSpecError: ``content`` is over :data:`MAX_WRITE_BYTES`, or the path names a directory.
        """
        resolved = resolve_path(path)
        if len(content) > MAX_WRITE_BYTES:
            msg = (
                f"content is {len(content)} bytes; WriteFile takes at most {MAX_WRITE_BYTES} "
                "(larger files go through Upload: sandboxctl cp)"
            )
            raise InvalidSpecError(msg)
        async with self._lock(workspace_id, resolved):
            reply = await self._write(workspace_id, resolved, content, return_old_max=DIFF_OLD_MAX_BYTES)
        created, old_size = reply.result.created, reply.result.old_size
        old = reply.data if not created and old_size <= DIFF_OLD_MAX_BYTES else None
        message, diff = await asyncio.to_thread(
            write_summary, resolved, content, old, old_size=old_size, created=created
        )
        log.info("file.written", workspace_id=workspace_id, path=resolved, size=len(content), created=created)
        return resolved, WriteOutcome(
            message=message, created=created, diff=diff, size_bytes=len(content), line_count=count_lines(content)
        )

    async def list_dir(self, workspace_id: str, path: str) -> tuple[str, list[Entry]]:
        """Entries of a directory, sorted by name, and its resolved path."""
        resolved = resolve_path(path or WORKSPACE_ROOT)
        reply = await self._call(workspace_id, ListRequest(path=resolved))
        # One JSON entry per line in data frames: a big directory is no single oversized frame.
        return resolved, decode_entries(reply.data)

    async def stat(self, workspace_id: str, path: str, *, follow: bool = False) -> Entry:
        """Describe one path (a final symlink's target with ``follow``)."""
        return (await self._call(workspace_id, StatRequest(path=resolve_path(path), follow=follow))).result

    async def remove(self, workspace_id: str, path: str, *, recursive: bool = False) -> str:
        """Delete a file, link or (recursive) directory; return its resolved path.

        Raises:
            InvalidSpecError: ``path`` is the root directory (refused in plain words, before
                a recursive removal empties the workspace's root filesystem and then fails on
                its mounts).
        """
        resolved = resolve_path(path)
        # "//", "/./", "/tmp/.." all name it (normpath keeps a leading "//": POSIX lets it differ).
        if posixpath.normpath("/" + resolved.lstrip("/")) == "/":
            msg = "refusing to remove / (the workspace's root directory); remove what is in it by name"
            raise InvalidSpecError(msg)
        await self._call(workspace_id, RemoveRequest(path=resolved, recursive=recursive))
        return resolved

    async def move(self, workspace_id: str, source: str, destination: str, *, overwrite: bool = False) -> str:
        """Rename a path; return the destination's resolved path."""
        resolved = resolve_path(destination)
        request = MoveRequest(source=resolve_path(source), destination=resolved, overwrite=overwrite)
        await self._call(workspace_id, request)
        return resolved

    async def upload(self, workspace_id: str, path: str, archive: AsyncIterable[bytes]) -> tuple[str, UploadResult]:
        """Extract a tar stream into a directory (created when missing); return it resolved, and the counts."""
        resolved = resolve_path(path)
        reply = await self._call(workspace_id, UploadRequest(path=resolved), archive)
        return resolved, reply.result

    async def download(self, workspace_id: str, path: str, *, follow: bool = False) -> AsyncIterator[bytes]:
        """Stream a file or tree as a tar archive (of a final symlink's target with ``follow``)."""
        request = DownloadRequest(path=resolve_path(path), follow=follow)
        async for reply in self._stream(workspace_id, request):
            if isinstance(reply, FileData):
                yield reply.data
            elif isinstance(reply, FileResult):
                request.decode(reply.value)

    async def read_image(self, workspace_id: str, source: str) -> ImageData:
        """Read a png/jpeg/gif/webp image (at most 5 MB) from a path or an http(s) URL.

        URLs are fetched from inside the workspace, so they work only when its
        network policy allows it.

        Raises:
            FileTooLargeError: the image is over 5 MB.
            FailedPreconditionError: not one of the four formats, or the fetch failed.
        """
        if utf8_size(source) > MAX_URL_BYTES:
            msg = f"source is {utf8_size(source)} bytes; the limit is {MAX_URL_BYTES}"
            raise InvalidSpecError(msg)
        request: FileRequest[Any]
        if source.startswith(("http://", "https://")):
            request = FetchRequest(url=source, max_bytes=IMAGE_MAX_BYTES, timeout_s=30)
        else:
            source = resolve_path(source)
            request = ReadRequest(path=source, max_bytes=IMAGE_MAX_BYTES)
        try:
            reply: _Reply[Any] = await self._call(workspace_id, request)
        except FileTooLargeError:
            msg = f"{source} is over the 5 MB limit for images"
            raise FileTooLargeError(msg) from None
        # Off the event loop, and two at a time: a crafted header can take Pillow seconds.
        async with self._sniffing:
            return await asyncio.to_thread(sniff_image, reply.data, source)
