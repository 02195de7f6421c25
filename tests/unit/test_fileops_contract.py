"""The file-operation contract with the agent: requests encoded, results decoded, codes typed (no Docker)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any

import grpc
import pytest

from sandboxd.agent import FileData, FileOperationRefused, FileReply, FileResult
from sandboxd.errors import (
    FailedPreconditionError,
    InvalidSpecError,
    PathExistsError,
    PathNotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    SandboxdError,
)
from sandboxd.fileops import (
    BinaryFileError,
    DirectoryNotEmptyError,
    DownloadRequest,
    Entry,
    FetchFailedError,
    FetchRequest,
    FileChangedError,
    FileOperationFailedError,
    FileRequest,
    FileTooLargeError,
    InvalidFileOperationError,
    ListRequest,
    MalformedResultError,
    MoveRequest,
    NoSpaceError,
    PathBusyError,
    PathIsDirectoryError,
    PathNotDirectoryError,
    ReadRequest,
    ReadResult,
    ReadTextRequest,
    ReadTextResult,
    RemoveRequest,
    StatRequest,
    UploadRequest,
    UploadResult,
    WriteRequest,
    WriteResult,
    decode_entries,
    refusal,
)
from sandboxd.files import FileManager

# Results as the agent writes them (agent/internal/fileops: the keys in its order).
ENTRY = {
    "mode": 420,
    "mtime": 1700000000.1234567,
    "name": "a.txt",
    "path": "/w/a.txt",
    "size": 20,
    "target": "",
    "type": "file",
}


class TestRequests:
    @pytest.mark.parametrize(
        ("request_", "wire"),
        [
            (ReadRequest(path="/a", max_bytes=5), {"op": "read", "path": "/a", "max_bytes": 5}),
            (
                ReadTextRequest(path="/a", offset=3, limit=10, keep_bytes=8004),
                {"op": "read_text", "path": "/a", "offset": 3, "limit": 10, "keep_bytes": 8004},
            ),
            (
                WriteRequest(path="/a", return_old_max=7),
                {"op": "write", "path": "/a", "mkdirs": True, "return_old_max": 7},
            ),
            (
                WriteRequest(path="/a", expect_sha256="absent"),
                {"op": "write", "path": "/a", "mkdirs": True, "return_old_max": 0, "expect_sha256": "absent"},
            ),
            (StatRequest(path="/a", follow=True), {"op": "stat", "path": "/a", "follow": True}),
            (ListRequest(path="/d"), {"op": "list", "path": "/d"}),
            (RemoveRequest(path="/a"), {"op": "remove", "path": "/a", "recursive": False}),
            (
                MoveRequest(source="/a", destination="/b", overwrite=True),
                {"op": "move", "source": "/a", "destination": "/b", "overwrite": True},
            ),
            (UploadRequest(path="/d"), {"op": "upload", "path": "/d"}),
            (DownloadRequest(path="/d"), {"op": "download", "path": "/d", "follow": False}),
            (
                FetchRequest(url="http://x/", max_bytes=9, timeout_s=30),
                {"op": "fetch", "url": "http://x/", "max_bytes": 9, "timeout_s": 30},
            ),
        ],
    )
    def test_each_request_encodes_to_the_agents_fields(self, request_: FileRequest[Any], wire: dict[str, Any]) -> None:
        """A request's JSON is ``op`` and its fields, in order, a ``None`` left out."""
        assert json.dumps(request_.encode()) == json.dumps(wire)

    def test_requests_are_frozen(self) -> None:
        """A request cannot be changed once made."""
        with pytest.raises(dataclasses.FrozenInstanceError):
            ReadRequest(path="/a", max_bytes=1).path = "/b"  # type: ignore[misc]


class TestResults:
    def test_results_decode_into_typed_fields(self) -> None:
        """Each operation's result, as the agent sends it, becomes its dataclass."""
        assert ReadRequest(path="/a", max_bytes=9).decode({"mode": 420, "sha256": "ab", "size": 3}) == ReadResult(
            size=3, sha256="ab", mode=420
        )
        assert ReadTextRequest(path="/a", offset=1, limit=1, keep_bytes=1).decode(
            {"size": 40, "total_lines": 5}
        ) == ReadTextResult(total_lines=5, size=40)
        assert WriteRequest(path="/a").decode(
            {"atomic": True, "created": False, "old_size": 5, "size": 7}
        ) == WriteResult(created=False, size=7, old_size=5, atomic=True)
        assert UploadRequest(path="/d").decode({"entries": 4, "size": 11}) == UploadResult(entries=4, size=11)
        assert StatRequest(path="/w/a.txt").decode(ENTRY) == Entry(
            name="a.txt", path="/w/a.txt", type="file", size=20, mode=420, mtime=1700000000.1234567
        )
        assert RemoveRequest(path="/a").decode({}) is not None

    def test_fields_it_does_not_know_are_ignored_and_a_whole_mtime_is_a_float(self) -> None:
        """A newer agent's extra field is no error; an mtime on a whole second (a JSON integer) reads as a float."""
        entry = StatRequest(path="/").decode({**ENTRY, "mtime": 1700000000, "inode": 7})
        assert entry.mtime == 1700000000.0
        assert isinstance(entry.mtime, float)

    @pytest.mark.parametrize(
        ("value", "says"),
        [
            (None, "is not a JSON object"),
            ([1, 2], "is not a JSON object"),
            ("size", "is not a JSON object"),
            ({"mode": 420, "size": 3}, "has no 'sha256'"),
            ({"mode": 420, "sha256": "ab", "size": "3"}, "'size' is not an integer"),
            ({"mode": 420, "sha256": "ab", "size": True}, "'size' is not an integer"),
            ({"mode": 420, "sha256": "ab", "size": 3.5}, "'size' is not an integer"),
            ({"mode": 420, "sha256": "ab", "size": 2**64}, "'size' is not an integer"),
            ({"mode": 420, "sha256": 7, "size": 3}, "'sha256' is not a string"),
            ({"mode": None, "sha256": "ab", "size": 3}, "'mode' is not an integer"),
        ],
    )
    def test_a_malformed_result_is_a_clean_error(self, value: object, says: str) -> None:
        """A result missing a field or with one of the wrong type is a FAILED_PRECONDITION naming it."""
        with pytest.raises(MalformedResultError, match=says) as caught:
            ReadRequest(path="/a", max_bytes=9).decode(value)
        assert caught.value.grpc_code == grpc.StatusCode.FAILED_PRECONDITION

    @pytest.mark.parametrize(
        ("field", "value", "says"),
        [
            ("created", 1, "'created' is not a boolean"),
            ("old_size", False, "'old_size' is not an integer"),
        ],
    )
    def test_booleans_and_integers_are_not_confused(self, field: str, value: object, says: str) -> None:
        """``1`` is no boolean and ``false`` no integer, though Python would take either."""
        result = {"atomic": True, "created": False, "old_size": 5, "size": 7, field: value}
        with pytest.raises(MalformedResultError, match=says):
            WriteRequest(path="/a").decode(result)

    @pytest.mark.parametrize("mtime", [float("inf"), float("nan"), 10**400, "1700000000"])
    def test_a_forged_mtime_is_refused(self, mtime: object) -> None:
        """An mtime no clock gives (infinite, NaN, past a float, a string) is refused, not passed on."""
        with pytest.raises(MalformedResultError, match="'mtime' is not a number"):
            StatRequest(path="/").decode({**ENTRY, "mtime": mtime})

    def test_list_entries_decode_one_per_line(self) -> None:
        """``list``'s data is one entry per line; a name that is not UTF-8 shows as U+FFFD."""
        odd = json.dumps({**ENTRY, "name": "\udcff.txt"}).encode()
        entries = decode_entries(json.dumps(ENTRY).encode() + b"\n" + odd + b"\n")
        assert [e.name for e in entries] == ["a.txt", "\ufffd.txt"]
        assert decode_entries(b"") == []

    @pytest.mark.parametrize(
        ("data", "says"),
        [
            (b"{not json\n", "a list entry is not JSON"),
            (b"[]\n", "the list entry result is not a JSON object"),
            (json.dumps({**ENTRY, "type": 3}).encode(), "'type' is not a string"),
            (json.dumps({k: v for k, v in ENTRY.items() if k != "name"}).encode(), "has no 'name'"),
        ],
    )
    def test_a_malformed_list_entry_is_a_clean_error(self, data: bytes, says: str) -> None:
        """A list line that is not JSON, or not an entry, is a MalformedResultError."""
        with pytest.raises(MalformedResultError, match=says):
            decode_entries(data)


class TestRefusals:
    @pytest.mark.parametrize(
        ("code", "cls", "status"),
        [
            ("not_found", PathNotFoundError, PathNotFoundError),
            ("permission", PermissionDeniedError, PermissionDeniedError),
            ("exists", PathExistsError, PathExistsError),
            ("is_directory", PathIsDirectoryError, InvalidSpecError),
            ("not_directory", PathNotDirectoryError, InvalidSpecError),
            ("invalid", InvalidFileOperationError, InvalidSpecError),
            ("not_empty", DirectoryNotEmptyError, FailedPreconditionError),
            ("busy", PathBusyError, FailedPreconditionError),
            ("binary", BinaryFileError, FailedPreconditionError),
            ("too_large", FileTooLargeError, FailedPreconditionError),
            ("conflict", FileChangedError, FailedPreconditionError),
            ("network", FetchFailedError, FailedPreconditionError),
            ("no_space", NoSpaceError, QuotaExceededError),
        ],
    )
    def test_each_code_is_a_typed_error_under_its_status(
        self, code: str, cls: type[SandboxdError], status: type[SandboxdError]
    ) -> None:
        """The agent's code picks the class, whatever the message says; the status is the one it always was."""
        error = refusal(code, "some words")
        assert type(error) is cls
        assert isinstance(error, status)
        assert error.message == "some words"

    @pytest.mark.parametrize("code", ["io", "aborted", "something_new"])
    def test_other_codes_are_internal_and_keep_their_code(self, code: str) -> None:
        """io, aborted and codes this daemon does not know are INTERNAL errors that carry the code."""
        error = refusal(code, "m")
        assert isinstance(error, FileOperationFailedError)
        assert error.code == code
        assert error.grpc_code == grpc.StatusCode.INTERNAL

    def test_a_long_message_is_cut(self) -> None:
        """An agent's message is bounded (its head and tail kept)."""
        error = refusal("not_found", "/x" * 20000 + ": No such file or directory")
        assert len(error.message) <= 16384
        assert error.message.endswith(": No such file or directory")


class _Link:
    """An agent link that answers every file operation with canned replies."""

    def __init__(self, replies: list[FileReply | Exception]) -> None:
        self.replies = replies
        self.operations: list[Mapping[str, Any]] = []

    async def file_operation(
        self, user: str, operation: Mapping[str, Any], stdin: AsyncIterable[bytes] | None = None
    ) -> AsyncIterator[FileReply]:
        self.operations.append(operation)
        for reply in self.replies:
            if isinstance(reply, Exception):
                raise reply
            yield reply


@dataclasses.dataclass
class _Context:
    link: _Link
    user: str = "user"


class _Workspaces:
    def __init__(self, link: _Link) -> None:
        self.link = link

    async def exec_context(self, workspace_id: str) -> _Context:
        return _Context(self.link)

    @contextlib.asynccontextmanager
    async def in_use(self, workspace_id: str) -> AsyncIterator[None]:
        yield


def _files(*replies: FileReply | Exception) -> tuple[FileManager, _Link]:
    link = _Link(list(replies))
    return FileManager(backend=None, workspaces=_Workspaces(link)), link  # type: ignore[arg-type]


class TestFileManagerReadsCodes:
    async def test_binary_is_told_by_its_code_not_its_message(self) -> None:
        """A ``binary`` refusal, whatever its wording, becomes ReadFile's binary-file message."""
        files, link = _files(FileOperationRefused("binary", "no words about bytes"))
        with pytest.raises(BinaryFileError, match="is a binary file"):
            await files.read_file("ws-1", "a.bin")
        assert link.operations[0]["op"] == "read_text"

    async def test_too_large_is_told_by_its_code_not_its_message(self) -> None:
        """A ``too_large`` refusal, whatever its wording, becomes ReadImage's 5 MB message."""
        files, _ = _files(FileOperationRefused("too_large", "big"))
        with pytest.raises(FileTooLargeError, match="over the 5 MB limit for images"):
            await files.read_image("ws-1", "/img.png")

    async def test_a_message_about_limits_is_not_taken_for_too_large(self) -> None:
        """A failed fetch whose message mentions a limit stays a fetch failure."""
        files, _ = _files(FileOperationRefused("network", "cannot fetch: rate limit"))
        with pytest.raises(FetchFailedError, match="rate limit"):
            await files.read_image("ws-1", "http://example.test/a.png")

    async def test_a_forged_result_is_a_clean_error(self) -> None:
        """A read_text result without its counts is a MalformedResultError, not a KeyError."""
        files, _ = _files(FileResult({"size": 3}))
        with pytest.raises(MalformedResultError, match="has no 'total_lines'"):
            await files.read_file("ws-1", "a.txt")

    async def test_write_reports_through_typed_fields(self) -> None:
        """WriteFile's outcome comes from the typed write result and the old content."""
        files, link = _files(
            FileData(b"old\n"), FileResult({"atomic": True, "created": False, "old_size": 4, "size": 4})
        )
        path, outcome = await files.write_file("ws-1", "a.txt", b"new\n")
        assert path == "/workspace/a.txt"
        assert (outcome.created, outcome.size_bytes, outcome.line_count) == (False, 4, 1)
        assert "-old" in outcome.diff
        assert "+new" in outcome.diff
        assert link.operations[0] == {
            "op": "write",
            "path": "/workspace/a.txt",
            "mkdirs": True,
            "return_old_max": 1024 * 1024,
        }
