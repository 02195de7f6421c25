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

class NetworkPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NETWORK_POLICY_UNSPECIFIED: _ClassVar[NetworkPolicy]
    NETWORK_POLICY_NONE: _ClassVar[NetworkPolicy]
    NETWORK_POLICY_BRIDGE: _ClassVar[NetworkPolicy]
    NETWORK_POLICY_ALLOWLIST: _ClassVar[NetworkPolicy]

class Runtime(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUNTIME_UNSPECIFIED: _ClassVar[Runtime]
    RUNTIME_RUNC: _ClassVar[Runtime]
    RUNTIME_RUNSC: _ClassVar[Runtime]

class WorkspaceState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKSPACE_STATE_UNSPECIFIED: _ClassVar[WorkspaceState]
    WORKSPACE_STATE_RUNNING: _ClassVar[WorkspaceState]
    WORKSPACE_STATE_STOPPED: _ClassVar[WorkspaceState]
    WORKSPACE_STATE_PAUSED: _ClassVar[WorkspaceState]

class IdleAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IDLE_ACTION_UNSPECIFIED: _ClassVar[IdleAction]
    IDLE_ACTION_DELETE: _ClassVar[IdleAction]
    IDLE_ACTION_PAUSE: _ClassVar[IdleAction]
NETWORK_POLICY_UNSPECIFIED: NetworkPolicy
NETWORK_POLICY_NONE: NetworkPolicy
NETWORK_POLICY_BRIDGE: NetworkPolicy
NETWORK_POLICY_ALLOWLIST: NetworkPolicy
RUNTIME_UNSPECIFIED: Runtime
RUNTIME_RUNC: Runtime
RUNTIME_RUNSC: Runtime
WORKSPACE_STATE_UNSPECIFIED: WorkspaceState
WORKSPACE_STATE_RUNNING: WorkspaceState
WORKSPACE_STATE_STOPPED: WorkspaceState
WORKSPACE_STATE_PAUSED: WorkspaceState
IDLE_ACTION_UNSPECIFIED: IdleAction
IDLE_ACTION_DELETE: IdleAction
IDLE_ACTION_PAUSE: IdleAction

class EgressRule(_message.Message):
    __slots__ = ("host", "ports")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    host: str
    ports: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, host: _Optional[str] = ..., ports: _Optional[_Iterable[int]] = ...) -> None: ...

class ResourceLimits(_message.Message):
    __slots__ = ("memory_bytes", "cpu_millis", "pids", "disk_bytes")
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    memory_bytes: int
    cpu_millis: int
    pids: int
    disk_bytes: int
    def __init__(self, memory_bytes: _Optional[int] = ..., cpu_millis: _Optional[int] = ..., pids: _Optional[int] = ..., disk_bytes: _Optional[int] = ...) -> None: ...

class SecurityOptions(_message.Message):
    __slots__ = ("added_capabilities", "allow_new_privileges", "user", "read_only_root_filesystem", "root_capabilities")
    ADDED_CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    ALLOW_NEW_PRIVILEGES_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_ROOT_FILESYSTEM_FIELD_NUMBER: _ClassVar[int]
    ROOT_CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    added_capabilities: _containers.RepeatedScalarFieldContainer[str]
    allow_new_privileges: bool
    user: str
    read_only_root_filesystem: bool
    root_capabilities: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, added_capabilities: _Optional[_Iterable[str]] = ..., allow_new_privileges: _Optional[bool] = ..., user: _Optional[str] = ..., read_only_root_filesystem: _Optional[bool] = ..., root_capabilities: _Optional[_Iterable[str]] = ...) -> None: ...

class WorkspaceSpec(_message.Message):
    __slots__ = ("image", "env", "working_dir", "labels", "limits", "network", "runtime", "idle_ttl", "security", "idle_action", "auto_resume", "allowed_hosts", "lifetime")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    IDLE_TTL_FIELD_NUMBER: _ClassVar[int]
    SECURITY_FIELD_NUMBER: _ClassVar[int]
    IDLE_ACTION_FIELD_NUMBER: _ClassVar[int]
    AUTO_RESUME_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_HOSTS_FIELD_NUMBER: _ClassVar[int]
    LIFETIME_FIELD_NUMBER: _ClassVar[int]
    image: str
    env: _containers.ScalarMap[str, str]
    working_dir: str
    labels: _containers.ScalarMap[str, str]
    limits: ResourceLimits
    network: NetworkPolicy
    runtime: Runtime
    idle_ttl: _duration_pb2.Duration
    security: SecurityOptions
    idle_action: IdleAction
    auto_resume: bool
    allowed_hosts: _containers.RepeatedCompositeFieldContainer[EgressRule]
    lifetime: _duration_pb2.Duration
    def __init__(self, image: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., working_dir: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., limits: _Optional[_Union[ResourceLimits, _Mapping]] = ..., network: _Optional[_Union[NetworkPolicy, str]] = ..., runtime: _Optional[_Union[Runtime, str]] = ..., idle_ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., security: _Optional[_Union[SecurityOptions, _Mapping]] = ..., idle_action: _Optional[_Union[IdleAction, str]] = ..., auto_resume: _Optional[bool] = ..., allowed_hosts: _Optional[_Iterable[_Union[EgressRule, _Mapping]]] = ..., lifetime: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class Workspace(_message.Message):
    __slots__ = ("workspace_id", "spec", "state", "create_time", "container_id", "volume_name", "from_snapshot", "expire_time")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    VOLUME_NAME_FIELD_NUMBER: _ClassVar[int]
    FROM_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    spec: WorkspaceSpec
    state: WorkspaceState
    create_time: _timestamp_pb2.Timestamp
    container_id: str
    volume_name: str
    from_snapshot: str
    expire_time: _timestamp_pb2.Timestamp
    def __init__(self, workspace_id: _Optional[str] = ..., spec: _Optional[_Union[WorkspaceSpec, _Mapping]] = ..., state: _Optional[_Union[WorkspaceState, str]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., container_id: _Optional[str] = ..., volume_name: _Optional[str] = ..., from_snapshot: _Optional[str] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateWorkspaceRequest(_message.Message):
    __slots__ = ("spec", "workspace_id", "from_snapshot", "request_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    spec: WorkspaceSpec
    workspace_id: str
    from_snapshot: str
    request_id: str
    def __init__(self, spec: _Optional[_Union[WorkspaceSpec, _Mapping]] = ..., workspace_id: _Optional[str] = ..., from_snapshot: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class CreateWorkspaceResponse(_message.Message):
    __slots__ = ("workspace",)
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    workspace: Workspace
    def __init__(self, workspace: _Optional[_Union[Workspace, _Mapping]] = ...) -> None: ...

class GetWorkspaceRequest(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class GetWorkspaceResponse(_message.Message):
    __slots__ = ("workspace",)
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    workspace: Workspace
    def __init__(self, workspace: _Optional[_Union[Workspace, _Mapping]] = ...) -> None: ...

class ListWorkspacesRequest(_message.Message):
    __slots__ = ("label_selector", "page_size", "page_token")
    class LabelSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    label_selector: _containers.ScalarMap[str, str]
    page_size: int
    page_token: str
    def __init__(self, label_selector: _Optional[_Mapping[str, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListWorkspacesResponse(_message.Message):
    __slots__ = ("workspaces", "next_page_token")
    WORKSPACES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    workspaces: _containers.RepeatedCompositeFieldContainer[Workspace]
    next_page_token: str
    def __init__(self, workspaces: _Optional[_Iterable[_Union[Workspace, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteWorkspaceRequest(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class DeleteWorkspaceResponse(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class PauseWorkspaceRequest(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class PauseWorkspaceResponse(_message.Message):
    __slots__ = ("workspace",)
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    workspace: Workspace
    def __init__(self, workspace: _Optional[_Union[Workspace, _Mapping]] = ...) -> None: ...

class ResumeWorkspaceRequest(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class SetWorkspaceLifetimeRequest(_message.Message):
    __slots__ = ("workspace_id", "lifetime")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    LIFETIME_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    lifetime: _duration_pb2.Duration
    def __init__(self, workspace_id: _Optional[str] = ..., lifetime: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class SetWorkspaceLifetimeResponse(_message.Message):
    __slots__ = ("workspace",)
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    workspace: Workspace
    def __init__(self, workspace: _Optional[_Union[Workspace, _Mapping]] = ...) -> None: ...

class ResumeWorkspaceResponse(_message.Message):
    __slots__ = ("workspace",)
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    workspace: Workspace
    def __init__(self, workspace: _Optional[_Union[Workspace, _Mapping]] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("name", "source_workspace_id", "create_time", "labels", "size_bytes", "spec", "include_memory", "memory_bytes", "start_command", "ready_command", "build_digest")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_MEMORY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    START_COMMAND_FIELD_NUMBER: _ClassVar[int]
    READY_COMMAND_FIELD_NUMBER: _ClassVar[int]
    BUILD_DIGEST_FIELD_NUMBER: _ClassVar[int]
    name: str
    source_workspace_id: str
    create_time: _timestamp_pb2.Timestamp
    labels: _containers.ScalarMap[str, str]
    size_bytes: int
    spec: WorkspaceSpec
    include_memory: bool
    memory_bytes: int
    start_command: str
    ready_command: str
    build_digest: str
    def __init__(self, name: _Optional[str] = ..., source_workspace_id: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., size_bytes: _Optional[int] = ..., spec: _Optional[_Union[WorkspaceSpec, _Mapping]] = ..., include_memory: _Optional[bool] = ..., memory_bytes: _Optional[int] = ..., start_command: _Optional[str] = ..., ready_command: _Optional[str] = ..., build_digest: _Optional[str] = ...) -> None: ...

class SnapshotWorkspaceRequest(_message.Message):
    __slots__ = ("workspace_id", "name", "labels", "include_memory")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_MEMORY_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    name: str
    labels: _containers.ScalarMap[str, str]
    include_memory: bool
    def __init__(self, workspace_id: _Optional[str] = ..., name: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., include_memory: _Optional[bool] = ...) -> None: ...

class RestoreWorkspaceRequest(_message.Message):
    __slots__ = ("workspace_id", "snapshot")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    snapshot: str
    def __init__(self, workspace_id: _Optional[str] = ..., snapshot: _Optional[str] = ...) -> None: ...

class RestoreWorkspaceResponse(_message.Message):
    __slots__ = ("workspace",)
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    workspace: Workspace
    def __init__(self, workspace: _Optional[_Union[Workspace, _Mapping]] = ...) -> None: ...

class SnapshotWorkspaceResponse(_message.Message):
    __slots__ = ("snapshot",)
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    snapshot: Snapshot
    def __init__(self, snapshot: _Optional[_Union[Snapshot, _Mapping]] = ...) -> None: ...

class GetSnapshotRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetSnapshotResponse(_message.Message):
    __slots__ = ("snapshot",)
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    snapshot: Snapshot
    def __init__(self, snapshot: _Optional[_Union[Snapshot, _Mapping]] = ...) -> None: ...

class ListSnapshotsRequest(_message.Message):
    __slots__ = ("label_selector",)
    class LabelSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    label_selector: _containers.ScalarMap[str, str]
    def __init__(self, label_selector: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListSnapshotsResponse(_message.Message):
    __slots__ = ("snapshots",)
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    snapshots: _containers.RepeatedCompositeFieldContainer[Snapshot]
    def __init__(self, snapshots: _Optional[_Iterable[_Union[Snapshot, _Mapping]]] = ...) -> None: ...

class DeleteSnapshotRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteSnapshotResponse(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetPoolRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PoolClass(_message.Message):
    __slots__ = ("name", "spec", "size", "ready", "starting", "claims", "misses")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    STARTING_FIELD_NUMBER: _ClassVar[int]
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    name: str
    spec: WorkspaceSpec
    size: int
    ready: int
    starting: int
    claims: int
    misses: int
    def __init__(self, name: _Optional[str] = ..., spec: _Optional[_Union[WorkspaceSpec, _Mapping]] = ..., size: _Optional[int] = ..., ready: _Optional[int] = ..., starting: _Optional[int] = ..., claims: _Optional[int] = ..., misses: _Optional[int] = ...) -> None: ...

class GetPoolResponse(_message.Message):
    __slots__ = ("classes",)
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    classes: _containers.RepeatedCompositeFieldContainer[PoolClass]
    def __init__(self, classes: _Optional[_Iterable[_Union[PoolClass, _Mapping]]] = ...) -> None: ...

class BuildTemplateRequest(_message.Message):
    __slots__ = ("build", "context_chunk")
    BUILD_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_CHUNK_FIELD_NUMBER: _ClassVar[int]
    build: TemplateBuild
    context_chunk: bytes
    def __init__(self, build: _Optional[_Union[TemplateBuild, _Mapping]] = ..., context_chunk: _Optional[bytes] = ...) -> None: ...

class TemplateBuild(_message.Message):
    __slots__ = ("name", "dockerfile", "start_command", "ready_command", "labels", "force", "timeout", "working_dir")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    DOCKERFILE_FIELD_NUMBER: _ClassVar[int]
    START_COMMAND_FIELD_NUMBER: _ClassVar[int]
    READY_COMMAND_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    name: str
    dockerfile: str
    start_command: str
    ready_command: str
    labels: _containers.ScalarMap[str, str]
    force: bool
    timeout: _duration_pb2.Duration
    working_dir: str
    def __init__(self, name: _Optional[str] = ..., dockerfile: _Optional[str] = ..., start_command: _Optional[str] = ..., ready_command: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., force: _Optional[bool] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., working_dir: _Optional[str] = ...) -> None: ...

class BuildTemplateResponse(_message.Message):
    __slots__ = ("log", "snapshot", "cached")
    LOG_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    log: BuildLogLine
    snapshot: Snapshot
    cached: bool
    def __init__(self, log: _Optional[_Union[BuildLogLine, _Mapping]] = ..., snapshot: _Optional[_Union[Snapshot, _Mapping]] = ..., cached: _Optional[bool] = ...) -> None: ...

class BuildLogLine(_message.Message):
    __slots__ = ("time", "text", "step")
    TIME_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    text: str
    step: int
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., text: _Optional[str] = ..., step: _Optional[int] = ...) -> None: ...
