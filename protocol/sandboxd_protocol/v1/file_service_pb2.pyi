import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FileType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILE_TYPE_UNSPECIFIED: _ClassVar[FileType]
    FILE_TYPE_FILE: _ClassVar[FileType]
    FILE_TYPE_DIRECTORY: _ClassVar[FileType]
    FILE_TYPE_SYMLINK: _ClassVar[FileType]
    FILE_TYPE_OTHER: _ClassVar[FileType]
FILE_TYPE_UNSPECIFIED: FileType
FILE_TYPE_FILE: FileType
FILE_TYPE_DIRECTORY: FileType
FILE_TYPE_SYMLINK: FileType
FILE_TYPE_OTHER: FileType

class FileInfo(_message.Message):
    __slots__ = ("name", "path", "type", "size_bytes", "mode", "modify_time", "link_target", "owner", "group")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MODIFY_TIME_FIELD_NUMBER: _ClassVar[int]
    LINK_TARGET_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    type: FileType
    size_bytes: int
    mode: int
    modify_time: _timestamp_pb2.Timestamp
    link_target: str
    owner: str
    group: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., type: _Optional[_Union[FileType, str]] = ..., size_bytes: _Optional[int] = ..., mode: _Optional[int] = ..., modify_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., link_target: _Optional[str] = ..., owner: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class ReadFileRequest(_message.Message):
    __slots__ = ("workspace_id", "path", "offset", "limit")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    path: str
    offset: int
    limit: int
    def __init__(self, workspace_id: _Optional[str] = ..., path: _Optional[str] = ..., offset: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ReadFileResponse(_message.Message):
    __slots__ = ("content", "total_lines", "first_line", "line_count", "next_offset", "lines_truncated", "path")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_LINES_FIELD_NUMBER: _ClassVar[int]
    FIRST_LINE_FIELD_NUMBER: _ClassVar[int]
    LINE_COUNT_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LINES_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    content: str
    total_lines: int
    first_line: int
    line_count: int
    next_offset: int
    lines_truncated: bool
    path: str
    def __init__(self, content: _Optional[str] = ..., total_lines: _Optional[int] = ..., first_line: _Optional[int] = ..., line_count: _Optional[int] = ..., next_offset: _Optional[int] = ..., lines_truncated: _Optional[bool] = ..., path: _Optional[str] = ...) -> None: ...

class EditFileRequest(_message.Message):
    __slots__ = ("workspace_id", "path", "old_string", "new_string", "replace_all")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OLD_STRING_FIELD_NUMBER: _ClassVar[int]
    NEW_STRING_FIELD_NUMBER: _ClassVar[int]
    REPLACE_ALL_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    path: str
    old_string: str
    new_string: str
    replace_all: bool
    def __init__(self, workspace_id: _Optional[str] = ..., path: _Optional[str] = ..., old_string: _Optional[str] = ..., new_string: _Optional[str] = ..., replace_all: _Optional[bool] = ...) -> None: ...

class EditFileResponse(_message.Message):
    __slots__ = ("message", "replacements", "diff", "path")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REPLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    DIFF_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    message: str
    replacements: int
    diff: str
    path: str
    def __init__(self, message: _Optional[str] = ..., replacements: _Optional[int] = ..., diff: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class WriteFileRequest(_message.Message):
    __slots__ = ("workspace_id", "path", "content")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    path: str
    content: bytes
    def __init__(self, workspace_id: _Optional[str] = ..., path: _Optional[str] = ..., content: _Optional[bytes] = ...) -> None: ...

class WriteFileResponse(_message.Message):
    __slots__ = ("message", "created", "size_bytes", "line_count", "diff", "path")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LINE_COUNT_FIELD_NUMBER: _ClassVar[int]
    DIFF_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    message: str
    created: bool
    size_bytes: int
    line_count: int
    diff: str
    path: str
    def __init__(self, message: _Optional[str] = ..., created: _Optional[bool] = ..., size_bytes: _Optional[int] = ..., line_count: _Optional[int] = ..., diff: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class ListDirRequest(_message.Message):
    __slots__ = ("workspace_id", "path")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    path: str
    def __init__(self, workspace_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class ListDirResponse(_message.Message):
    __slots__ = ("entries", "path")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[FileInfo]
    path: str
    def __init__(self, entries: _Optional[_Iterable[_Union[FileInfo, _Mapping]]] = ..., path: _Optional[str] = ...) -> None: ...

class StatRequest(_message.Message):
    __slots__ = ("workspace_id", "path", "follow_symlinks")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_SYMLINKS_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    path: str
    follow_symlinks: bool
    def __init__(self, workspace_id: _Optional[str] = ..., path: _Optional[str] = ..., follow_symlinks: _Optional[bool] = ...) -> None: ...

class StatResponse(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: FileInfo
    def __init__(self, info: _Optional[_Union[FileInfo, _Mapping]] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("workspace_id", "path", "recursive")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    path: str
    recursive: bool
    def __init__(self, workspace_id: _Optional[str] = ..., path: _Optional[str] = ..., recursive: _Optional[bool] = ...) -> None: ...

class RemoveResponse(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class MoveRequest(_message.Message):
    __slots__ = ("workspace_id", "source_path", "destination_path", "overwrite")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_PATH_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_PATH_FIELD_NUMBER: _ClassVar[int]
    OVERWRITE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    source_path: str
    destination_path: str
    overwrite: bool
    def __init__(self, workspace_id: _Optional[str] = ..., source_path: _Optional[str] = ..., destination_path: _Optional[str] = ..., overwrite: _Optional[bool] = ...) -> None: ...

class MoveResponse(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class UploadRequest(_message.Message):
    __slots__ = ("target", "chunk")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    target: UploadTarget
    chunk: bytes
    def __init__(self, target: _Optional[_Union[UploadTarget, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class UploadTarget(_message.Message):
    __slots__ = ("workspace_id", "path")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    path: str
    def __init__(self, workspace_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class UploadResponse(_message.Message):
    __slots__ = ("entry_count", "size_bytes", "path")
    ENTRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    entry_count: int
    size_bytes: int
    path: str
    def __init__(self, entry_count: _Optional[int] = ..., size_bytes: _Optional[int] = ..., path: _Optional[str] = ...) -> None: ...

class DownloadRequest(_message.Message):
    __slots__ = ("workspace_id", "path", "follow_symlinks")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_SYMLINKS_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    path: str
    follow_symlinks: bool
    def __init__(self, workspace_id: _Optional[str] = ..., path: _Optional[str] = ..., follow_symlinks: _Optional[bool] = ...) -> None: ...

class DownloadResponse(_message.Message):
    __slots__ = ("chunk",)
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    chunk: bytes
    def __init__(self, chunk: _Optional[bytes] = ...) -> None: ...

class ReadImageRequest(_message.Message):
    __slots__ = ("workspace_id", "source")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    source: str
    def __init__(self, workspace_id: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class ReadImageResponse(_message.Message):
    __slots__ = ("data", "mime_type", "width", "height")
    DATA_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    mime_type: str
    width: int
    height: int
    def __init__(self, data: _Optional[bytes] = ..., mime_type: _Optional[str] = ..., width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...
