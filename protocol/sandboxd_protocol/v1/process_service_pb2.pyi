import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StopReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_REASON_UNSPECIFIED: _ClassVar[StopReason]
    STOP_REASON_EXITED: _ClassVar[StopReason]
    STOP_REASON_INTERRUPTED: _ClassVar[StopReason]
    STOP_REASON_TIMEOUT: _ClassVar[StopReason]
    STOP_REASON_FAILED: _ClassVar[StopReason]
    STOP_REASON_KILLED: _ClassVar[StopReason]

class ProcessState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROCESS_STATE_UNSPECIFIED: _ClassVar[ProcessState]
    PROCESS_STATE_RUNNING: _ClassVar[ProcessState]
    PROCESS_STATE_EXITED: _ClassVar[ProcessState]
STOP_REASON_UNSPECIFIED: StopReason
STOP_REASON_EXITED: StopReason
STOP_REASON_INTERRUPTED: StopReason
STOP_REASON_TIMEOUT: StopReason
STOP_REASON_FAILED: StopReason
STOP_REASON_KILLED: StopReason
PROCESS_STATE_UNSPECIFIED: ProcessState
PROCESS_STATE_RUNNING: ProcessState
PROCESS_STATE_EXITED: ProcessState

class TerminalSize(_message.Message):
    __slots__ = ("columns", "rows")
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    columns: int
    rows: int
    def __init__(self, columns: _Optional[int] = ..., rows: _Optional[int] = ...) -> None: ...

class ExecRequest(_message.Message):
    __slots__ = ("workspace_id", "command", "workdir", "env", "yield_after", "timeout", "max_output_bytes", "tty", "terminal_size", "spill_after_bytes", "merge_stderr", "user", "stdin_closed")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    YIELD_AFTER_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    TTY_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    SPILL_AFTER_BYTES_FIELD_NUMBER: _ClassVar[int]
    MERGE_STDERR_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    STDIN_CLOSED_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    command: str
    workdir: str
    env: _containers.ScalarMap[str, str]
    yield_after: _duration_pb2.Duration
    timeout: _duration_pb2.Duration
    max_output_bytes: int
    tty: bool
    terminal_size: TerminalSize
    spill_after_bytes: int
    merge_stderr: bool
    user: str
    stdin_closed: bool
    def __init__(self, workspace_id: _Optional[str] = ..., command: _Optional[str] = ..., workdir: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., yield_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_output_bytes: _Optional[int] = ..., tty: _Optional[bool] = ..., terminal_size: _Optional[_Union[TerminalSize, _Mapping]] = ..., spill_after_bytes: _Optional[int] = ..., merge_stderr: _Optional[bool] = ..., user: _Optional[str] = ..., stdin_closed: _Optional[bool] = ...) -> None: ...

class ExecStarted(_message.Message):
    __slots__ = ("process_id", "pid", "start_time")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    process_id: str
    pid: int
    start_time: _timestamp_pb2.Timestamp
    def __init__(self, process_id: _Optional[str] = ..., pid: _Optional[int] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ExecOutput(_message.Message):
    __slots__ = ("stdout", "stderr", "position")
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    stdout: bytes
    stderr: bytes
    position: int
    def __init__(self, stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., position: _Optional[int] = ...) -> None: ...

class ExecOutputDropped(_message.Message):
    __slots__ = ("dropped_bytes", "position")
    DROPPED_BYTES_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    dropped_bytes: int
    position: int
    def __init__(self, dropped_bytes: _Optional[int] = ..., position: _Optional[int] = ...) -> None: ...

class ExecExited(_message.Message):
    __slots__ = ("exit_code", "signal", "stop_reason", "oom_killed", "memory_limit_bytes", "dropped_bytes", "elapsed", "message", "spill_path")
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    OOM_KILLED_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BYTES_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SPILL_PATH_FIELD_NUMBER: _ClassVar[int]
    exit_code: int
    signal: str
    stop_reason: StopReason
    oom_killed: bool
    memory_limit_bytes: int
    dropped_bytes: int
    elapsed: _duration_pb2.Duration
    message: str
    spill_path: str
    def __init__(self, exit_code: _Optional[int] = ..., signal: _Optional[str] = ..., stop_reason: _Optional[_Union[StopReason, str]] = ..., oom_killed: _Optional[bool] = ..., memory_limit_bytes: _Optional[int] = ..., dropped_bytes: _Optional[int] = ..., elapsed: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., message: _Optional[str] = ..., spill_path: _Optional[str] = ...) -> None: ...

class ExecYielded(_message.Message):
    __slots__ = ("process_id", "elapsed")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_FIELD_NUMBER: _ClassVar[int]
    process_id: str
    elapsed: _duration_pb2.Duration
    def __init__(self, process_id: _Optional[str] = ..., elapsed: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ExecHeartbeat(_message.Message):
    __slots__ = ("elapsed",)
    ELAPSED_FIELD_NUMBER: _ClassVar[int]
    elapsed: _duration_pb2.Duration
    def __init__(self, elapsed: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ExecResponse(_message.Message):
    __slots__ = ("started", "output", "exited", "yielded", "heartbeat", "dropped")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    YIELDED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    started: ExecStarted
    output: ExecOutput
    exited: ExecExited
    yielded: ExecYielded
    heartbeat: ExecHeartbeat
    dropped: ExecOutputDropped
    def __init__(self, started: _Optional[_Union[ExecStarted, _Mapping]] = ..., output: _Optional[_Union[ExecOutput, _Mapping]] = ..., exited: _Optional[_Union[ExecExited, _Mapping]] = ..., yielded: _Optional[_Union[ExecYielded, _Mapping]] = ..., heartbeat: _Optional[_Union[ExecHeartbeat, _Mapping]] = ..., dropped: _Optional[_Union[ExecOutputDropped, _Mapping]] = ...) -> None: ...

class InputRequest(_message.Message):
    __slots__ = ("process_id", "chars", "yield_after", "close_stdin", "terminal_size", "data", "resume_from")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    CHARS_FIELD_NUMBER: _ClassVar[int]
    YIELD_AFTER_FIELD_NUMBER: _ClassVar[int]
    CLOSE_STDIN_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    process_id: str
    chars: str
    yield_after: _duration_pb2.Duration
    close_stdin: bool
    terminal_size: TerminalSize
    data: bytes
    resume_from: int
    def __init__(self, process_id: _Optional[str] = ..., chars: _Optional[str] = ..., yield_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., close_stdin: _Optional[bool] = ..., terminal_size: _Optional[_Union[TerminalSize, _Mapping]] = ..., data: _Optional[bytes] = ..., resume_from: _Optional[int] = ...) -> None: ...

class InputResponse(_message.Message):
    __slots__ = ("output", "exited", "yielded", "heartbeat", "dropped")
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    YIELDED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    output: ExecOutput
    exited: ExecExited
    yielded: ExecYielded
    heartbeat: ExecHeartbeat
    dropped: ExecOutputDropped
    def __init__(self, output: _Optional[_Union[ExecOutput, _Mapping]] = ..., exited: _Optional[_Union[ExecExited, _Mapping]] = ..., yielded: _Optional[_Union[ExecYielded, _Mapping]] = ..., heartbeat: _Optional[_Union[ExecHeartbeat, _Mapping]] = ..., dropped: _Optional[_Union[ExecOutputDropped, _Mapping]] = ...) -> None: ...

class SignalRequest(_message.Message):
    __slots__ = ("process_id", "signal")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    process_id: str
    signal: str
    def __init__(self, process_id: _Optional[str] = ..., signal: _Optional[str] = ...) -> None: ...

class SignalResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KillRequest(_message.Message):
    __slots__ = ("process_id", "grace")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    GRACE_FIELD_NUMBER: _ClassVar[int]
    process_id: str
    grace: _duration_pb2.Duration
    def __init__(self, process_id: _Optional[str] = ..., grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class KillResponse(_message.Message):
    __slots__ = ("exited",)
    EXITED_FIELD_NUMBER: _ClassVar[int]
    exited: ExecExited
    def __init__(self, exited: _Optional[_Union[ExecExited, _Mapping]] = ...) -> None: ...

class ListProcessesRequest(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class ProcessInfo(_message.Message):
    __slots__ = ("process_id", "workspace_id", "command", "pid", "state", "start_time", "exited", "tty")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    TTY_FIELD_NUMBER: _ClassVar[int]
    process_id: str
    workspace_id: str
    command: str
    pid: int
    state: ProcessState
    start_time: _timestamp_pb2.Timestamp
    exited: ExecExited
    tty: bool
    def __init__(self, process_id: _Optional[str] = ..., workspace_id: _Optional[str] = ..., command: _Optional[str] = ..., pid: _Optional[int] = ..., state: _Optional[_Union[ProcessState, str]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., exited: _Optional[_Union[ExecExited, _Mapping]] = ..., tty: _Optional[bool] = ...) -> None: ...

class ListProcessesResponse(_message.Message):
    __slots__ = ("processes",)
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    processes: _containers.RepeatedCompositeFieldContainer[ProcessInfo]
    def __init__(self, processes: _Optional[_Iterable[_Union[ProcessInfo, _Mapping]]] = ...) -> None: ...
