from sandboxd_protocol.v1 import workspace_service_pb2 as _workspace_service_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ForwardPortTarget(_message.Message):
    __slots__ = ("workspace_id", "port")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    port: int
    def __init__(self, workspace_id: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class ForwardPortRequest(_message.Message):
    __slots__ = ("target", "data")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    target: ForwardPortTarget
    data: bytes
    def __init__(self, target: _Optional[_Union[ForwardPortTarget, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ForwardPortResponse(_message.Message):
    __slots__ = ("connected", "data", "eof")
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    connected: ForwardPortConnected
    data: bytes
    eof: ForwardPortEof
    def __init__(self, connected: _Optional[_Union[ForwardPortConnected, _Mapping]] = ..., data: _Optional[bytes] = ..., eof: _Optional[_Union[ForwardPortEof, _Mapping]] = ...) -> None: ...

class ForwardPortConnected(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ForwardPortEof(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UpdateNetworkRequest(_message.Message):
    __slots__ = ("workspace_id", "network", "allowed_hosts")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_HOSTS_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    network: _workspace_service_pb2.NetworkPolicy
    allowed_hosts: _containers.RepeatedCompositeFieldContainer[_workspace_service_pb2.EgressRule]
    def __init__(self, workspace_id: _Optional[str] = ..., network: _Optional[_Union[_workspace_service_pb2.NetworkPolicy, str]] = ..., allowed_hosts: _Optional[_Iterable[_Union[_workspace_service_pb2.EgressRule, _Mapping]]] = ...) -> None: ...

class UpdateNetworkResponse(_message.Message):
    __slots__ = ("workspace",)
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    workspace: _workspace_service_pb2.Workspace
    def __init__(self, workspace: _Optional[_Union[_workspace_service_pb2.Workspace, _Mapping]] = ...) -> None: ...
