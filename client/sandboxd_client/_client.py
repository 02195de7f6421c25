"""SandboxClient: an async connection to a sandboxd daemon, and Workspace handles."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import os
import secrets
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

import grpc
from google.protobuf import duration_pb2
from sandboxd_protocol.limits import MAX_UPLOAD_CHUNK_BYTES, MAX_WRITE_BYTES
from sandboxd_protocol.retry import RetryPolicy
from sandboxd_protocol.v1 import file_service_pb2 as fpb
from sandboxd_protocol.v1 import file_service_pb2_grpc as fgrpc
from sandboxd_protocol.v1 import network_service_pb2 as npb
from sandboxd_protocol.v1 import network_service_pb2_grpc as ngrpc
from sandboxd_protocol.v1 import process_service_pb2 as ppb
from sandboxd_protocol.v1 import process_service_pb2_grpc as pgrpc
from sandboxd_protocol.v1 import workspace_service_pb2 as wpb
from sandboxd_protocol.v1 import workspace_service_pb2_grpc as wgrpc

from ._auth import TLSOptions, open_channel
from ._exec import ExecHandle, Exited, exited_from_proto
from ._forward import PortForward
from ._paths import default_socket_path
from .errors import InvalidArgumentError, SandboxError, UnavailableError, from_rpc_error

__all__ = [
    "EditResult",
    "FileInfo",
    "ImageResult",
    "PoolClassInfo",
    "ProcessInfo",
    "ReadResult",
    "SandboxClient",
    "SnapshotInfo",
    "TemplateBuildResult",
    "Workspace",
    "WorkspaceInfo",
    "WriteResult",
]

T = TypeVar("T")

_RETRY = RetryPolicy(first_wait_s=0.1, growth=2.0, max_wait_s=5.0, jitter_s=1.0, max_attempts=4, max_total_s=10.0)
"""Idempotent calls retried on UNAVAILABLE: at most 4 attempts within 10 s (the policy's defaults, spelled out)."""


_RESUME = RetryPolicy(first_wait_s=0.05, growth=2.0, max_wait_s=1.0, jitter_s=0.1, max_attempts=1000, max_total_s=30.0)
"""A broken command stream tried again every second at most, for 30 s (``resume_s``): a routine restart fits."""


def _unavailable(error: BaseException) -> bool:
    """Whether ``error`` is worth another attempt: the daemon could not be reached (UNAVAILABLE)."""
    return isinstance(error, UnavailableError)


NetworkName = Literal["none", "bridge", "allowlist"]

_NETWORK = {
    "": wpb.NETWORK_POLICY_UNSPECIFIED,
    "none": wpb.NETWORK_POLICY_NONE,
    "bridge": wpb.NETWORK_POLICY_BRIDGE,
    "allowlist": wpb.NETWORK_POLICY_ALLOWLIST,
}
_RUNTIME = {"": wpb.RUNTIME_UNSPECIFIED, "runc": wpb.RUNTIME_RUNC, "runsc": wpb.RUNTIME_RUNSC}
_STATE = {
    wpb.WORKSPACE_STATE_RUNNING: "running",
    wpb.WORKSPACE_STATE_STOPPED: "stopped",
    wpb.WORKSPACE_STATE_PAUSED: "paused",
}
_IDLE_ACTION = {"": wpb.IDLE_ACTION_UNSPECIFIED, "delete": wpb.IDLE_ACTION_DELETE, "pause": wpb.IDLE_ACTION_PAUSE}
_NETWORK_NAME = {value: name for name, value in _NETWORK.items() if name}
_RUNTIME_NAME = {value: name for name, value in _RUNTIME.items() if name}
_IDLE_ACTION_NAME = {value: name for name, value in _IDLE_ACTION.items() if name}


def egress_rule(text: str) -> wpb.EgressRule:
    """``HOST[:PORT[,PORT...]]`` as a rule (an IPv6 address or block takes ports only in brackets).

    For example ``example.org``, ``*.example.org:8443``, ``10.0.0.0/8:5432``, ``[2001:db8::1]:443``.

    Raises:
        InvalidArgumentError: a port is not a number.
    """
    host, ports = text, ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        ports = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, _, ports = text.partition(":")
    try:
        numbers = [int(port) for port in ports.split(",")] if ports else []
    except ValueError:
        msg = f"{text!r} is not HOST[:PORT[,PORT...]]"
        raise InvalidArgumentError(msg) from None
    return wpb.EgressRule(host=host, ports=numbers)


def _rule_text(rule: wpb.EgressRule) -> str:
    host = f"[{rule.host}]" if ":" in rule.host and rule.ports else rule.host
    return f"{host}:{','.join(str(port) for port in rule.ports)}" if rule.ports else host


def _duration(seconds: float) -> duration_pb2.Duration:
    result = duration_pb2.Duration()
    result.FromNanoseconds(round(seconds * 1e9))
    return result


@dataclasses.dataclass(frozen=True)
class WorkspaceInfo:
    """A workspace as the daemon reports it, every default resolved."""

    workspace_id: str
    state: str
    """``running``, ``paused`` or ``stopped``."""
    image: str
    user: str
    working_dir: str
    env: Mapping[str, str]
    labels: Mapping[str, str]
    memory_bytes: int
    cpu_millis: int
    pids: int
    disk_bytes: int
    """Size cap of /workspace; 0 means none."""
    network: str
    runtime: str
    idle_ttl_s: float
    """Seconds without calls before the daemon acts on it (``idle_action``); 0 means never."""
    read_only_root_filesystem: bool
    create_time: datetime.datetime
    container_id: str
    volume_name: str
    idle_action: str = "delete"
    """What the idle TTL does: ``delete`` or ``pause``."""
    auto_resume: bool = True
    """Whether a call that needs the paused workspace resumes it."""
    from_snapshot: str = ""
    """The snapshot it was forked from; empty for one created from an image."""
    allowed_hosts: tuple[str, ...] = ()
    """With the ``allowlist`` network: what its egress proxy lets through, as ``HOST[:PORTS]``."""
    lifetime_s: float = 0.0
    """Seconds from create (or resume) to its end, busy or not (``idle_action``); 0 means none."""
    expire_time: datetime.datetime | None = None
    """When it ends (:meth:`SandboxClient.set_lifetime` moves it); None: no end, or paused."""

    @classmethod
    def from_proto(cls, message: wpb.Workspace) -> WorkspaceInfo:
        """Return the client form of a ``Workspace`` message."""
        spec = message.spec
        return cls(
            workspace_id=message.workspace_id,
            state=_STATE.get(message.state, "unknown"),
            image=spec.image,
            user=spec.security.user,
            working_dir=spec.working_dir,
            env=dict(spec.env),
            labels=dict(spec.labels),
            memory_bytes=spec.limits.memory_bytes,
            cpu_millis=spec.limits.cpu_millis,
            pids=spec.limits.pids,
            disk_bytes=spec.limits.disk_bytes,
            network=_NETWORK_NAME.get(spec.network, ""),
            runtime=_RUNTIME_NAME.get(spec.runtime, ""),
            idle_ttl_s=spec.idle_ttl.ToNanoseconds() / 1e9,
            read_only_root_filesystem=spec.security.read_only_root_filesystem,
            create_time=message.create_time.ToDatetime(tzinfo=datetime.UTC),
            container_id=message.container_id,
            volume_name=message.volume_name,
            idle_action=_IDLE_ACTION_NAME.get(spec.idle_action, "delete"),
            auto_resume=spec.auto_resume if spec.HasField("auto_resume") else True,
            from_snapshot=message.from_snapshot,
            allowed_hosts=tuple(_rule_text(rule) for rule in spec.allowed_hosts),
            lifetime_s=spec.lifetime.ToNanoseconds() / 1e9,
            expire_time=message.expire_time.ToDatetime(tzinfo=datetime.UTC)
            if message.HasField("expire_time")
            else None,
        )


@dataclasses.dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot of a workspace's files, to fork workspaces from."""

    name: str
    source_workspace_id: str
    create_time: datetime.datetime
    labels: Mapping[str, str]
    size_bytes: int
    """Its changed root filesystem and /workspace files."""
    image: str
    """The image its source was created from."""
    user: str
    working_dir: str
    memory_bytes: int = 0
    """Bytes of the processes' memory it holds (``include_memory``); 0: files only."""
    start_command: str = ""
    """A template's: run in the background at each start of a workspace from it."""
    ready_command: str = ""
    """A template's: run until it exits 0 before a workspace from it is handed out."""
    build_digest: str = ""
    """A template's: the digest of what it was built from (empty: a snapshot of a workspace)."""

    @property
    def is_template(self) -> bool:
        """Whether it was built (:meth:`SandboxClient.build_template`) rather than taken of a workspace."""
        return bool(self.build_digest)

    @property
    def include_memory(self) -> bool:
        """Whether a fork of it starts with its source's processes running."""
        return self.memory_bytes > 0

    @classmethod
    def from_proto(cls, message: wpb.Snapshot) -> SnapshotInfo:
        """Return the client form of a ``Snapshot`` message."""
        return cls(
            name=message.name,
            source_workspace_id=message.source_workspace_id,
            create_time=message.create_time.ToDatetime(tzinfo=datetime.UTC),
            labels=dict(message.labels),
            size_bytes=message.size_bytes,
            image=message.spec.image,
            user=message.spec.security.user,
            working_dir=message.spec.working_dir,
            memory_bytes=message.memory_bytes,
            start_command=message.start_command,
            ready_command=message.ready_command,
            build_digest=message.build_digest,
        )


@dataclasses.dataclass(frozen=True)
class TemplateBuildResult:
    """A finished template build."""

    template: SnapshotInfo
    """The template, kept as a snapshot of yours: ``create_workspace(from_snapshot=name)`` starts from it."""
    cached: bool
    """Whether it was already built from the same content (nothing was built)."""


@dataclasses.dataclass(frozen=True)
class PoolClassInfo:
    """One class of the daemon's warm pool: started, idle workspaces a matching create takes."""

    name: str
    image: str
    memory_bytes: int
    cpu_millis: int
    pids: int
    disk_bytes: int
    network: str
    runtime: str
    size: int
    """Members it keeps ready."""
    ready: int
    starting: int
    claims: int
    """Creates it served since the daemon started."""
    misses: int
    """Matching creates that found it empty (and started a container instead)."""

    @classmethod
    def from_proto(cls, message: wpb.PoolClass) -> PoolClassInfo:
        """Return the client form of a ``PoolClass`` message."""
        spec = message.spec
        return cls(
            name=message.name,
            image=spec.image,
            memory_bytes=spec.limits.memory_bytes,
            cpu_millis=spec.limits.cpu_millis,
            pids=spec.limits.pids,
            disk_bytes=spec.limits.disk_bytes,
            network=_NETWORK_NAME.get(spec.network, ""),
            runtime=_RUNTIME_NAME.get(spec.runtime, ""),
            size=message.size,
            ready=message.ready,
            starting=message.starting,
            claims=message.claims,
            misses=message.misses,
        )


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """A process session of a workspace."""

    process_id: str
    command: str
    pid: int
    running: bool
    tty: bool
    exited: Exited | None


_FILE_TYPES = {
    fpb.FILE_TYPE_FILE: "file",
    fpb.FILE_TYPE_DIRECTORY: "directory",
    fpb.FILE_TYPE_SYMLINK: "symlink",
    fpb.FILE_TYPE_OTHER: "other",
}


@dataclasses.dataclass(frozen=True)
class FileInfo:
    """One path in a workspace."""

    name: str
    path: str
    type: str
    """``file``, ``directory``, ``symlink`` or ``other``."""
    size_bytes: int
    mode: int
    modify_time: datetime.datetime
    link_target: str
    owner: str = ""
    """The owner's name in the workspace (as ``ls -l`` shows it), else its uid."""
    group: str = ""
    """The group's name in the workspace, else its gid."""

    @classmethod
    def from_proto(cls, message: fpb.FileInfo) -> FileInfo:
        """Return the client form of a ``FileInfo`` message."""
        return cls(
            name=message.name,
            path=message.path,
            type=_FILE_TYPES.get(message.type, "other"),
            size_bytes=message.size_bytes,
            mode=message.mode,
            modify_time=message.modify_time.ToDatetime(tzinfo=datetime.UTC),
            link_target=message.link_target,
            owner=message.owner,
            group=message.group,
        )


@dataclasses.dataclass(frozen=True)
class ReadResult:
    """A page of a text file: ``content`` is ``cat -n`` text with any notices and trailer."""

    content: str
    path: str
    total_lines: int
    first_line: int
    line_count: int
    next_offset: int
    """Offset for the next page; 0 when this page reaches the end of the file."""
    lines_truncated: bool


@dataclasses.dataclass(frozen=True)
class EditResult:
    """An applied edit: ``message`` is "Replaced N occurrence(s) ..." with the diff."""

    message: str
    path: str
    replacements: int
    diff: str


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """A write: ``message`` is "Created ..." or "Overwrote ..." with counts and a diff or summary."""

    message: str
    path: str
    created: bool
    size_bytes: int
    line_count: int
    diff: str


@dataclasses.dataclass(frozen=True)
class ImageResult:
    """An image read from the workspace or a URL."""

    data: bytes
    mime_type: str
    width: int
    height: int

    def data_url(self) -> str:
        """The image as a ``data:`` URL, as models take it."""
        import base64

        return f"data:{self.mime_type};base64,{base64.b64encode(self.data).decode()}"


class SandboxClient:
    """Async client of one daemon; use as ``async with SandboxClient() as client``.

    Args:
        address: ``HOST:PORT`` for TCP, or ``unix:/path``; None means the default
            Unix socket (``SANDBOXD_SOCKET`` or the per-user default).
        socket_path: Unix socket path (alternative to ``address``).
        retries: retry idempotent calls (get/list/delete, and creates, which carry a
            request id) on UNAVAILABLE with jittered backoff, at most 4 attempts within 10 s;
            and resume a command's stream that broke (a daemon restart, a dropped connection)
            from its last byte, for ``resume_s`` (``StreamBrokenError`` then).
        resume_s: how long a broken command stream is tried again, in seconds.
        environ: environment for the defaults (``os.environ`` if None): the socket,
            ``SANDBOXD_ADDRESS``, ``SANDBOXD_TOKEN`` and the ``SANDBOXD_TLS_*`` files.
        token: bearer token for daemons started with a tokens file; None means
            ``SANDBOXD_TOKEN``.
        tls: TLS for a TCP address; None means the ``SANDBOXD_TLS_*`` variables
            (system roots when unset). TCP is always TLS: the daemon serves nothing else.

    Raises:
        ValueError: a TLS file cannot be read, or TLS options were given for a Unix socket.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        socket_path: str | None = None,
        retries: bool = True,
        environ: Mapping[str, str] | None = None,
        token: str | None = None,
        tls: TLSOptions | None = None,
        resume_s: float = 30.0,
    ) -> None:
        """Open the channel (lazily connected)."""
        env = os.environ if environ is None else environ
        if address is None and not socket_path:
            address = env.get("SANDBOXD_ADDRESS") or None
        if address is None:
            address = f"unix:{socket_path or default_socket_path(env)}"
        self.address = address
        if tls is None and not address.startswith("unix:"):
            tls = TLSOptions.from_env(env)
        self._channel = open_channel(address, token=env.get("SANDBOXD_TOKEN", "") if token is None else token, tls=tls)
        self._workspaces = wgrpc.WorkspaceServiceStub(self._channel)
        self._processes = pgrpc.ProcessServiceStub(self._channel)
        self._files = fgrpc.FileServiceStub(self._channel)
        self._network = ngrpc.NetworkServiceStub(self._channel)
        self._retries = retries
        self._resume_policy = dataclasses.replace(_RESUME, max_total_s=resume_s)

    async def __aenter__(self) -> SandboxClient:
        """Return the client."""
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Close the channel."""
        await self.close()

    async def close(self) -> None:
        """Close the channel; streams in flight are cancelled."""
        await self._channel.close()

    async def _unary(self, call: Callable[[], Awaitable[T]], *, idempotent: bool = False) -> T:
        async def attempt() -> T:
            try:
                return await call()
            except grpc.RpcError as error:
                raise from_rpc_error(error) from None

        if not (idempotent and self._retries):
            return await attempt()
        return await _RETRY.call(attempt, _unavailable)

    async def health(self, service: str = "") -> str:
        """The daemon's gRPC health status (``SERVING``, ``NOT_SERVING``, ...) for ``service`` ("" = overall).

        Raises:
            UnavailableError: the daemon cannot be reached.
        """
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self._channel)
        request = health_pb2.HealthCheckRequest(service=service)
        response = await self._unary(lambda: stub.Check(request, timeout=10))
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))

    # -- workspaces -----------------------------------------------------------------------------
    async def create_workspace(
        self,
        *,
        image: str = "",
        env: Mapping[str, str] | None = None,
        working_dir: str = "",
        labels: Mapping[str, str] | None = None,
        memory_bytes: int = 0,
        cpu_millis: int = 0,
        pids: int = 0,
        disk_bytes: int = 0,
        network: NetworkName | Literal[""] = "",
        runtime: Literal["", "runc", "runsc"] = "",
        idle_ttl_s: float | None = None,
        user: str = "",
        added_capabilities: Sequence[str] = (),
        root_capabilities: Sequence[str] = (),
        allow_new_privileges: bool = False,
        read_only_root_filesystem: bool = False,
        workspace_id: str = "",
        idle_action: Literal["", "delete", "pause"] = "",
        auto_resume: bool | None = None,
        from_snapshot: str = "",
        allowed_hosts: Sequence[str] = (),
        request_id: str = "",
        lifetime_s: float = 0.0,
    ) -> Workspace:
        """Create and start a workspace; zero/empty arguments take the daemon's defaults.

        ``network="allowlist"`` lets the workspace reach exactly ``allowed_hosts`` (each
        ``HOST[:PORT[,PORT...]]``, ports 80 and 443 by default; see :func:`egress_rule`)
        through the daemon's egress proxy.

        With ``from_snapshot`` the workspace starts with that snapshot's files, and every
        argument left at its default takes the snapshot's source's value (``image`` must
        stay empty). ``idle_action`` says what ``idle_ttl_s`` does (``delete``, the default,
        or ``pause``); ``auto_resume`` (default true) whether a call resumes it when paused.
        ``lifetime_s`` ends it that long after it is made, busy or not, as ``idle_action`` says
        (0: no end; at least 1 s, at most a year); :meth:`set_lifetime` moves the end.

        Without ``workspace_id`` the client makes one (``ws-`` and 12 hex digits, as the daemon
        does), so it holds the id before the daemon makes anything. Each call sends a
        ``request_id`` (a fresh UUID unless given) with it, and after UNAVAILABLE (a daemon that
        crashed or restarted mid-create) sends the same request again, as ``get_workspace`` is
        retried: the daemon answers a repeated request with the workspace the first made, or
        makes it again if the first never completed, never a second one (Google AIP-155).

        Raises:
            InvalidArgumentError: a value is out of range.
            AlreadyExistsError: ``workspace_id`` is taken (by another create than ``request_id``'s).
            NotFoundError: the image, or the snapshot, is not there.
            UnavailableError: the daemon or Docker is down. Its ``workspace_id`` and ``request_id``
                are this create's: the workspace may exist, and the same call with both (after a
                longer outage than the retries cover) gets it or makes it.
        """
        spec = wpb.WorkspaceSpec(
            image=image,
            env=dict(env or {}),
            working_dir=working_dir,
            labels=dict(labels or {}),
            limits=wpb.ResourceLimits(
                memory_bytes=memory_bytes, cpu_millis=cpu_millis, pids=pids, disk_bytes=disk_bytes
            ),
            network=_NETWORK[network],
            allowed_hosts=[egress_rule(text) for text in allowed_hosts],
            runtime=_RUNTIME[runtime],
            security=wpb.SecurityOptions(
                added_capabilities=list(added_capabilities),
                allow_new_privileges=allow_new_privileges,
                user=user,
                read_only_root_filesystem=read_only_root_filesystem,
                root_capabilities=list(root_capabilities),
            ),
            idle_action=_IDLE_ACTION[idle_action],
        )
        if idle_ttl_s is not None:
            spec.idle_ttl.CopyFrom(_duration(idle_ttl_s))
        if auto_resume is not None:
            spec.auto_resume = auto_resume
        if lifetime_s:
            spec.lifetime.CopyFrom(_duration(lifetime_s))
        request = wpb.CreateWorkspaceRequest(
            spec=spec,
            workspace_id=workspace_id or f"ws-{secrets.token_hex(6)}",
            from_snapshot=from_snapshot,
            request_id=request_id or str(uuid.uuid4()),
        )
        try:
            response = await self._unary(lambda: self._workspaces.CreateWorkspace(request), idempotent=True)
        except UnavailableError as error:
            error.workspace_id, error.request_id = request.workspace_id, request.request_id
            raise
        return Workspace(self, WorkspaceInfo.from_proto(response.workspace))

    async def get_workspace(self, workspace_id: str) -> Workspace:
        """Return a handle to an existing workspace; NotFoundError when there is none."""
        request = wpb.GetWorkspaceRequest(workspace_id=workspace_id)
        response = await self._unary(lambda: self._workspaces.GetWorkspace(request), idempotent=True)
        return Workspace(self, WorkspaceInfo.from_proto(response.workspace))

    async def list_workspaces(
        self, labels: Mapping[str, str] | None = None, *, page_size: int = 0
    ) -> list[WorkspaceInfo]:
        """Return every workspace carrying all of ``labels``, oldest first.

        The daemon lists in pages (``page_size`` workspaces each, 0 for its default of 100);
        this reads them all.
        """
        found: list[WorkspaceInfo] = []
        token = ""
        while True:
            request = wpb.ListWorkspacesRequest(
                label_selector=dict(labels or {}), page_size=page_size, page_token=token
            )
            response = await self._unary(functools.partial(self._workspaces.ListWorkspaces, request), idempotent=True)
            found += [WorkspaceInfo.from_proto(w) for w in response.workspaces]
            token = response.next_page_token
            if not token:
                return found

    async def update_network(
        self, workspace_id: str, network: NetworkName, *, allowed_hosts: Sequence[str] = ()
    ) -> WorkspaceInfo:
        """Give a running workspace another network policy (or, for ``allowlist``, other hosts).

        Its files and processes stay; connections open through the old network may end.

        Raises:
            InvalidArgumentError: a rule is invalid, or the policy is not available under its runtime.
            NotFoundError: no such workspace.
        """
        request = npb.UpdateNetworkRequest(
            workspace_id=workspace_id,
            network=_NETWORK[network],
            allowed_hosts=[egress_rule(text) for text in allowed_hosts],
        )
        response = await self._unary(lambda: self._network.UpdateNetwork(request))
        return WorkspaceInfo.from_proto(response.workspace)

    async def delete_workspace(self, workspace_id: str) -> None:
        """Remove a workspace and its volume; NotFoundError when there is none."""
        request = wpb.DeleteWorkspaceRequest(workspace_id=workspace_id)
        await self._unary(lambda: self._workspaces.DeleteWorkspace(request))

    async def pause_workspace(self, workspace_id: str) -> WorkspaceInfo:
        """Freeze every process of a workspace (it then uses no CPU; no timeout runs meanwhile).

        Raises:
            NotFoundError: no such workspace.
            FailedPreconditionError: it is paused already, or does not run.
        """
        request = wpb.PauseWorkspaceRequest(workspace_id=workspace_id)
        response = await self._unary(lambda: self._workspaces.PauseWorkspace(request))
        return WorkspaceInfo.from_proto(response.workspace)

    async def set_lifetime(self, workspace_id: str, lifetime_s: float) -> WorkspaceInfo:
        """End a workspace ``lifetime_s`` seconds from now (0: never), as its ``idle_action`` says.

        Returns:
            The workspace; its ``expire_time`` is the new end.

        Raises:
            NotFoundError: no such workspace.
            InvalidArgumentError: a lifetime under 1 s or over a year.
        """
        request = wpb.SetWorkspaceLifetimeRequest(workspace_id=workspace_id, lifetime=_duration(lifetime_s))
        response = await self._unary(lambda: self._workspaces.SetWorkspaceLifetime(request), idempotent=True)
        return WorkspaceInfo.from_proto(response.workspace)

    async def resume_workspace(self, workspace_id: str) -> WorkspaceInfo:
        """Thaw a paused workspace; its commands go on where they were.

        Raises:
            NotFoundError: no such workspace.
            FailedPreconditionError: it is not paused.
        """
        request = wpb.ResumeWorkspaceRequest(workspace_id=workspace_id)
        response = await self._unary(lambda: self._workspaces.ResumeWorkspace(request))
        return WorkspaceInfo.from_proto(response.workspace)

    # -- snapshots -------------------------------------------------------------------------------
    async def restore_workspace(self, workspace_id: str, snapshot: str) -> WorkspaceInfo:
        """Return a workspace to one of your snapshots, keeping its id (a new container, its own spec).

        Its commands end; a memory snapshot's processes come back running, under new process ids.

        Raises:
            NotFoundError: no such workspace, or no such snapshot.
            FailedPreconditionError: a memory snapshot, and the workspace is not under runsc or
                has a capped /workspace.
        """
        request = wpb.RestoreWorkspaceRequest(workspace_id=workspace_id, snapshot=snapshot)
        response = await self._unary(lambda: self._workspaces.RestoreWorkspace(request))
        return WorkspaceInfo.from_proto(response.workspace)

    async def snapshot_workspace(
        self,
        workspace_id: str,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        include_memory: bool = False,
    ) -> SnapshotInfo:
        """Capture a workspace's files (/workspace and its changed root filesystem) as ``name``.

        With ``include_memory``, its running processes too (their memory, /tmp, its process
        sessions): a fork starts with them running, its sessions under ids of their own.

        Raises:
            InvalidArgumentError: a bad name (1-63 letters, digits, '.', '_', '-').
            AlreadyExistsError: you have a snapshot of that name.
            ResourceExhaustedError: your snapshot quota is used up.
            FailedPreconditionError: ``include_memory`` and the workspace cannot be kept so
                (not under gVisor, paused, a port forward open, a socket bound on a host directory).
        """
        request = wpb.SnapshotWorkspaceRequest(
            workspace_id=workspace_id, name=name, labels=dict(labels or {}), include_memory=include_memory
        )
        response = await self._unary(lambda: self._workspaces.SnapshotWorkspace(request))
        return SnapshotInfo.from_proto(response.snapshot)

    async def get_snapshot(self, name: str) -> SnapshotInfo:
        """Return one of your snapshots; NotFoundError when there is none."""
        request = wpb.GetSnapshotRequest(name=name)
        response = await self._unary(lambda: self._workspaces.GetSnapshot(request), idempotent=True)
        return SnapshotInfo.from_proto(response.snapshot)

    async def list_snapshots(self, labels: Mapping[str, str] | None = None) -> list[SnapshotInfo]:
        """Return your snapshots carrying all of ``labels``, oldest first."""
        request = wpb.ListSnapshotsRequest(label_selector=dict(labels or {}))
        response = await self._unary(lambda: self._workspaces.ListSnapshots(request), idempotent=True)
        return [SnapshotInfo.from_proto(s) for s in response.snapshots]

    async def delete_snapshot(self, name: str) -> None:
        """Remove a snapshot (workspaces forked from it keep their files); NotFoundError when there is none."""
        request = wpb.DeleteSnapshotRequest(name=name)
        await self._unary(lambda: self._workspaces.DeleteSnapshot(request))

    async def build_template(
        self,
        name: str,
        dockerfile: str,
        *,
        context: AsyncIterable[bytes] | bytes = b"",
        start_command: str = "",
        ready_command: str = "",
        working_dir: str = "",
        labels: Mapping[str, str] | None = None,
        force: bool = False,
        timeout_s: float = 0.0,
        on_log: Callable[[str], None] | None = None,
    ) -> TemplateBuildResult:
        """Build an image from ``dockerfile`` and keep it as your template (a snapshot) ``name``.

        Args:
            name: 1-63 letters, digits, '.', '_' or '-'; a successful build replaces a template
                of that name.
            dockerfile: the Dockerfile's text; its FROM images must be on the daemon's engine.
            context: the build context as an uncompressed tar archive (bytes, or its pieces).
            start_command: run in the background (``bash -lc``) at each start of a workspace from it.
            ready_command: run after it until it exits 0 before such a workspace is handed out.
            working_dir: the working directory of workspaces from it (empty: the image's).
            labels: the template's labels.
            force: build every step again, ignoring an unchanged template and the build cache.
            timeout_s: how long the build may take (0: the daemon's limit).
            on_log: called with each line of the build's log as it comes.

        Raises:
            FailedPreconditionError: a step failed (the message ends with its output).
            NotFoundError: a FROM image the engine does not have and cannot pull.
            InvalidArgumentError: a bad name, Dockerfile, command or context.
            ResourceExhaustedError: the context or the image is past the daemon's limit.
            DeadlineExceededError: the build took longer than its timeout (it was stopped).
        """
        build = wpb.TemplateBuild(
            name=name,
            dockerfile=dockerfile,
            start_command=start_command,
            ready_command=ready_command,
            working_dir=working_dir,
            labels=dict(labels or {}),
            force=force,
        )
        if timeout_s:
            build.timeout.FromNanoseconds(int(timeout_s * 1e9))

        async def requests() -> AsyncIterator[wpb.BuildTemplateRequest]:
            yield wpb.BuildTemplateRequest(build=build)
            pieces = _once(context) if isinstance(context, bytes | bytearray) else context
            async for piece in pieces:
                for start in range(0, len(piece), MAX_UPLOAD_CHUNK_BYTES):
                    yield wpb.BuildTemplateRequest(context_chunk=bytes(piece[start : start + MAX_UPLOAD_CHUNK_BYTES]))

        call = self._workspaces.BuildTemplate(requests())
        try:
            async for message in call:
                if message.HasField("snapshot"):
                    return TemplateBuildResult(SnapshotInfo.from_proto(message.snapshot), cached=message.cached)
                if on_log is not None:
                    on_log(message.log.text)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        finally:
            call.cancel()  # a caller that stops waiting ends the call: the daemon stops the build
        msg = "the daemon ended the template build without the template"
        raise SandboxError(msg)

    async def get_pool(self) -> list[PoolClassInfo]:
        """The daemon's warm pool, class by class."""
        response = await self._unary(lambda: self._workspaces.GetPool(wpb.GetPoolRequest()), idempotent=True)
        return [PoolClassInfo.from_proto(c) for c in response.classes]

    # -- processes -------------------------------------------------------------------------------
    def exec(
        self,
        workspace_id: str,
        command: str,
        *,
        workdir: str = "",
        env: Mapping[str, str] | None = None,
        yield_after_s: float | None = None,
        timeout_s: float | None = None,
        max_output_bytes: int = 0,
        tty: bool = False,
        terminal_size: tuple[int, int] | None = None,
        spill_after_bytes: int = 0,
        merge_stderr: bool = False,
        follow: bool = False,
        user: str = "",
        stdin_closed: bool = False,
    ) -> ExecHandle:
        """Run ``bash -lc command``; iterate the handle for events or ``await handle.wait()``.

        Args:
            workspace_id: where to run.
            command: the shell command line.
            workdir: working directory (relative to the workspace's).
            env: extra environment variables for this command.
            yield_after_s: stream this long before yielding (daemon default 60 s).
            timeout_s: kill the command after this long (daemon default 30 min).
            max_output_bytes: daemon-side buffer for unread output (default 1 MiB).
            tty: run under a pseudo-terminal (stdout and stderr merge).
            terminal_size: ``(columns, rows)`` of that terminal (default 80x24).
            spill_after_bytes: past this much output, the daemon also writes all of it
                to ``/workspace/.sandboxd/spill/<process_id>.out``; 0 means never.
            merge_stderr: send stderr into stdout (``2>&1``), keeping their exact order.
            follow: keep polling after a yield until the command exits.
            user: run as this user (``name``, ``uid``, ``name:group`` or ``uid:gid``) instead of the
                workspace's; as root it keeps the workspace's ``root_capabilities``. A user the
                workspace does not have raises ``InvalidArgumentError`` from the handle.
            stdin_closed: start with stdin closed: the command reads end-of-file at once.
        """
        request = ppb.ExecRequest(
            workspace_id=workspace_id,
            command=command,
            workdir=workdir,
            env=dict(env or {}),
            max_output_bytes=max_output_bytes,
            tty=tty,
            spill_after_bytes=spill_after_bytes,
            merge_stderr=merge_stderr,
            user=user,
            stdin_closed=stdin_closed,
        )
        if yield_after_s is not None:
            request.yield_after.CopyFrom(_duration(yield_after_s))
        if timeout_s is not None:
            request.timeout.CopyFrom(_duration(timeout_s))
        if terminal_size is not None:
            request.terminal_size.columns, request.terminal_size.rows = terminal_size
        return ExecHandle(
            lambda: self._processes.Exec(request),
            lambda process_id: self._processes.Input(ppb.InputRequest(process_id=process_id)),
            follow=follow,
            **self._resuming(60.0 if yield_after_s is None else yield_after_s),  # the daemon's default
        )

    def input(
        self,
        process_id: str,
        chars: str = "",
        *,
        yield_after_s: float | None = None,
        close_stdin: bool = False,
        terminal_size: tuple[int, int] | None = None,
        data: bytes = b"",
        follow: bool = False,
        resume_from: int | None = None,
    ) -> ExecHandle:
        """Write ``chars`` (then raw ``data``) to a process's stdin and stream what it prints next.

        ``"\u0003"`` alone is Ctrl-C; empty ``chars`` only polls. The window
        defaults to 250 ms after a write and 5 s for a poll. While
        another call streams the process's output, this one returns at once.
        ``terminal_size`` resizes a tty process's terminal. ``data`` is written as
        it is and never read as Ctrl-C. Each call carries at most 1 MiB.
        ``resume_from`` goes on after that output position (an event's ``position``, or a
        :class:`~sandboxd_client.errors.StreamBrokenError`'s ``resume_from``): what a broken
        stream lost in flight comes again, nothing before it does.

        A call that writes (``chars``, ``data``, Ctrl-C, ``close_stdin``) whose stream breaks
        before the daemon's first answer raises ``UnavailableError``: the input may or may not
        have reached the process, and only the caller can say whether sending it again is
        right (a second Ctrl-C usually is; the same bytes written twice usually are not).
        Once the daemon has answered, the input was written, and a break is resumed as a poll.
        """
        request = ppb.InputRequest(process_id=process_id, chars=chars, close_stdin=close_stdin, data=data)
        if resume_from is not None:
            request.resume_from = resume_from
        if terminal_size is not None:
            request.terminal_size.columns, request.terminal_size.rows = terminal_size
        if yield_after_s is not None:
            request.yield_after.CopyFrom(_duration(yield_after_s))
        return ExecHandle(
            lambda: self._processes.Input(request),
            lambda pid: self._processes.Input(ppb.InputRequest(process_id=pid)),
            follow=follow,
            process_id=process_id,
            carries_input=bool(chars or data or close_stdin),
            **self._resuming(yield_after_s),
        )

    def _resuming(self, window_s: float | None) -> dict[str, Any]:
        """How a handle resumes its broken stream: an Input from its position, within ``_RESUME``."""
        if not self._retries:
            return {}

        def resume(process_id: str, position: int, window: float | None) -> Any:
            request = ppb.InputRequest(process_id=process_id, resume_from=position)
            if window is not None:
                request.yield_after.CopyFrom(_duration(window))
            return self._processes.Input(request)

        return {"resume": resume, "resume_policy": self._resume_policy, "window_s": window_s}

    async def signal(self, process_id: str, signal: str) -> None:
        """Send ``signal`` (e.g. ``"SIGTERM"``) to the command's process group."""
        request = ppb.SignalRequest(process_id=process_id, signal=signal)
        await self._unary(lambda: self._processes.Signal(request))

    async def kill(self, process_id: str, *, grace_s: float | None = None) -> Exited:
        """SIGTERM the command's whole tree, wait ``grace_s``, SIGKILL; return how it ended."""
        request = ppb.KillRequest(process_id=process_id)
        if grace_s is not None:
            request.grace.CopyFrom(_duration(grace_s))
        response = await self._unary(lambda: self._processes.Kill(request))
        return exited_from_proto(response.exited)

    async def list_processes(self, workspace_id: str) -> list[ProcessInfo]:
        """Return the process sessions of a workspace, oldest first."""
        request = ppb.ListProcessesRequest(workspace_id=workspace_id)
        response = await self._unary(lambda: self._processes.ListProcesses(request), idempotent=True)
        return [
            ProcessInfo(
                process_id=p.process_id,
                command=p.command,
                pid=p.pid,
                running=p.state == ppb.PROCESS_STATE_RUNNING,
                tty=p.tty,
                exited=exited_from_proto(p.exited) if p.HasField("exited") else None,
            )
            for p in response.processes
        ]

    # -- files ----------------------------------------------------------------------------------
    async def read_file(self, workspace_id: str, path: str, *, offset: int = 0, limit: int = 0) -> ReadResult:
        """A page of a text file (defaults: from line 1, 2000 lines); relative paths are under /workspace.

        Raises:
            NotFoundError: no such file.
            FailedPreconditionError: the file is binary (has NUL bytes).
            InvalidArgumentError: a directory, or an offset past the end.
        """
        request = fpb.ReadFileRequest(workspace_id=workspace_id, path=path, offset=offset, limit=limit)
        r = await self._unary(lambda: self._files.ReadFile(request), idempotent=True)
        return ReadResult(
            content=r.content,
            path=r.path,
            total_lines=r.total_lines,
            first_line=r.first_line,
            line_count=r.line_count,
            next_offset=r.next_offset,
            lines_truncated=r.lines_truncated,
        )

    async def edit_file(
        self, workspace_id: str, path: str, old_string: str, new_string: str, *, replace_all: bool = False
    ) -> EditResult:
        """Replace ``old_string`` (exactly once, or everywhere) in an existing file.

        Raises:
            NotFoundError: the file does not exist.
            InvalidArgumentError: not found, found several times, empty or unchanged strings.
            PermissionDeniedError: the workspace user may not write the file.
        """
        request = fpb.EditFileRequest(
            workspace_id=workspace_id, path=path, old_string=old_string, new_string=new_string, replace_all=replace_all
        )
        r = await self._unary(lambda: self._files.EditFile(request))
        return EditResult(message=r.message, path=r.path, replacements=r.replacements, diff=r.diff)

    async def write_file(self, workspace_id: str, path: str, content: str | bytes) -> WriteResult:
        """Create or atomically overwrite a file (parents created); ``str`` content is written as UTF-8.

        Raises:
            InvalidArgumentError: more than ``limits.MAX_WRITE_BYTES`` (8 MiB) of content; larger
                files go through :meth:`upload`.
        """
        data = content.encode() if isinstance(content, str) else content
        if len(data) > MAX_WRITE_BYTES:
            msg = (
                f"content is {len(data)} bytes; WriteFile takes at most {MAX_WRITE_BYTES} "
                "(larger files go through Upload: sandboxctl cp)"
            )
            raise InvalidArgumentError(msg)
        request = fpb.WriteFileRequest(workspace_id=workspace_id, path=path, content=data)
        r = await self._unary(lambda: self._files.WriteFile(request))
        return WriteResult(
            message=r.message,
            path=r.path,
            created=r.created,
            size_bytes=r.size_bytes,
            line_count=r.line_count,
            diff=r.diff,
        )

    async def list_dir(self, workspace_id: str, path: str = "") -> list[FileInfo]:
        """Entries of a directory (default /workspace), sorted by name."""
        request = fpb.ListDirRequest(workspace_id=workspace_id, path=path)
        r = await self._unary(lambda: self._files.ListDir(request), idempotent=True)
        return [FileInfo.from_proto(e) for e in r.entries]

    async def stat(self, workspace_id: str, path: str, *, follow_symlinks: bool = False) -> FileInfo:
        """Describe one path; NotFoundError when there is nothing there."""
        request = fpb.StatRequest(workspace_id=workspace_id, path=path, follow_symlinks=follow_symlinks)
        r = await self._unary(lambda: self._files.Stat(request), idempotent=True)
        return FileInfo.from_proto(r.info)

    async def remove(self, workspace_id: str, path: str, *, recursive: bool = False) -> None:
        """Delete a file, a symlink, or (recursive) a directory tree."""
        request = fpb.RemoveRequest(workspace_id=workspace_id, path=path, recursive=recursive)
        await self._unary(lambda: self._files.Remove(request))

    async def move(self, workspace_id: str, source: str, destination: str, *, overwrite: bool = False) -> None:
        """Rename a path; AlreadyExistsError when the destination exists and ``overwrite`` is off."""
        request = fpb.MoveRequest(
            workspace_id=workspace_id, source_path=source, destination_path=destination, overwrite=overwrite
        )
        await self._unary(lambda: self._files.Move(request))

    async def upload(self, workspace_id: str, path: str, archive: AsyncIterable[bytes]) -> int:
        """Extract a tar stream into directory ``path`` (created when missing); return the entry count.

        ``archive`` may yield pieces of any size: each is sent in messages of at most
        ``limits.MAX_UPLOAD_CHUNK_BYTES`` (1 MiB).

        Raises:
            Exception: whatever ``archive`` raised, as it raised it (the call is cancelled and
                the daemon extracts nothing of an archive that did not end).
        """
        broke: list[Exception] = []

        async def requests() -> AsyncIterator[fpb.UploadRequest]:
            yield fpb.UploadRequest(target=fpb.UploadTarget(workspace_id=workspace_id, path=path))
            try:
                async for chunk in archive:
                    for start in range(0, len(chunk), MAX_UPLOAD_CHUNK_BYTES):
                        yield fpb.UploadRequest(chunk=chunk[start : start + MAX_UPLOAD_CHUNK_BYTES])
            except Exception as exc:
                broke.append(exc)  # gRPC ends the call as cancelled: the caller gets this instead
                raise

        try:
            r = await self._unary(lambda: self._files.Upload(requests()))
        except (asyncio.CancelledError, SandboxError):
            if broke:
                raise broke[0] from None
            raise
        return int(r.entry_count)

    async def download(self, workspace_id: str, path: str, *, follow_symlinks: bool = False) -> AsyncIterator[bytes]:
        """Stream a file or tree as a tar archive whose one top-level entry is the path's base name.

        FIFOs, sockets and devices are left out. ``follow_symlinks`` archives what a
        final symlink points to instead of the link.
        """
        request = fpb.DownloadRequest(workspace_id=workspace_id, path=path, follow_symlinks=follow_symlinks)
        call = self._files.Download(request)
        try:
            async for message in call:
                yield message.chunk
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        finally:
            call.cancel()  # a caller that stops reading ends the call: the daemon stops the archive

    async def read_image(self, workspace_id: str, source: str) -> ImageResult:
        """A png/jpeg/gif/webp image of at most 5 MB, from a workspace path or an http(s) URL."""
        request = fpb.ReadImageRequest(workspace_id=workspace_id, source=source)
        r = await self._unary(lambda: self._files.ReadImage(request), idempotent=True)
        return ImageResult(data=r.data, mime_type=r.mime_type, width=r.width, height=r.height)

    def forward(
        self,
        workspace_id: str,
        port: int,
        *,
        local_host: str = "127.0.0.1",
        local_port: int = 0,
        on_error: Callable[[SandboxError], None] | None = None,
    ) -> PortForward:
        """A local listener forwarding each connection to ``port`` on the workspace's loopback.

        ``async with client.forward(ws_id, 8000) as address:`` gives ``"127.0.0.1:PORT"``
        that any HTTP client can use; it works whatever the workspace's network policy
        (``none`` too). See :class:`PortForward`.

        Raises:
            ValueError: ``port`` is outside 1-65535.
        """
        return PortForward(
            self._network, workspace_id, port, local_host=local_host, local_port=local_port, on_error=on_error
        )


class Workspace:
    """A handle to one workspace; ``info`` is its state when the handle was made."""

    def __init__(self, client: SandboxClient, info: WorkspaceInfo) -> None:
        """Bind ``info`` to ``client``."""
        self.client = client
        self.info = info

    @property
    def workspace_id(self) -> str:
        """The workspace id."""
        return self.info.workspace_id

    def exec(
        self,
        command: str,
        *,
        workdir: str = "",
        env: Mapping[str, str] | None = None,
        yield_after_s: float | None = None,
        timeout_s: float | None = None,
        max_output_bytes: int = 0,
        tty: bool = False,
        terminal_size: tuple[int, int] | None = None,
        spill_after_bytes: int = 0,
        merge_stderr: bool = False,
        follow: bool = False,
        user: str = "",
        stdin_closed: bool = False,
    ) -> ExecHandle:
        """Run ``bash -lc command`` in this workspace; iterate the handle for events or ``await handle.wait()``.

        The same call as :meth:`SandboxClient.exec` with this workspace's id.

        Args:
            command: the shell command line.
            workdir: working directory (relative to the workspace's); empty means the workspace's own.
            env: extra environment variables for this command.
            yield_after_s: stream this long, in seconds, before yielding (None: the daemon's default, 60 s).
            timeout_s: kill the command after this long, in seconds (None: the daemon's default, 30 min).
            max_output_bytes: daemon-side buffer for unread output, in bytes (0: the default, 1 MiB).
            tty: run under a pseudo-terminal (stdout and stderr merge).
            terminal_size: ``(columns, rows)`` of that terminal (None: 80x24).
            spill_after_bytes: past this much output, in bytes, the daemon also writes all of it
                to ``/workspace/.sandboxd/spill/<process_id>.out``; 0 means never.
            merge_stderr: send stderr into stdout (``2>&1``), keeping their exact order.
            follow: keep polling after a yield until the command exits.
            user: run as this user instead of the workspace's (empty: the workspace's).
            stdin_closed: start with stdin closed: the command reads end-of-file at once.

        Returns:
            The call's handle (see :class:`ExecHandle`): events in order, the last one exactly
            one ``Exited`` or ``Yielded`` (no ``Yielded`` with ``follow``); nothing is sent
            until it is iterated or awaited.

        Raises:
            SandboxError: from iterating or awaiting the handle, as :meth:`SandboxClient.exec`.
        """
        return self.client.exec(
            self.workspace_id,
            command,
            workdir=workdir,
            env=env,
            yield_after_s=yield_after_s,
            timeout_s=timeout_s,
            max_output_bytes=max_output_bytes,
            tty=tty,
            terminal_size=terminal_size,
            spill_after_bytes=spill_after_bytes,
            merge_stderr=merge_stderr,
            follow=follow,
            user=user,
            stdin_closed=stdin_closed,
        )

    async def read_file(self, path: str, **options: Any) -> ReadResult:
        """See :meth:`SandboxClient.read_file`."""
        return await self.client.read_file(self.workspace_id, path, **options)

    async def edit_file(self, path: str, old_string: str, new_string: str, **options: Any) -> EditResult:
        """See :meth:`SandboxClient.edit_file`."""
        return await self.client.edit_file(self.workspace_id, path, old_string, new_string, **options)

    async def write_file(self, path: str, content: str | bytes) -> WriteResult:
        """See :meth:`SandboxClient.write_file`."""
        return await self.client.write_file(self.workspace_id, path, content)

    async def read_image(self, source: str) -> ImageResult:
        """See :meth:`SandboxClient.read_image`."""
        return await self.client.read_image(self.workspace_id, source)

    async def update_network(self, network: NetworkName, *, allowed_hosts: Sequence[str] = ()) -> WorkspaceInfo:
        """See :meth:`SandboxClient.update_network`."""
        self.info = await self.client.update_network(self.workspace_id, network, allowed_hosts=allowed_hosts)
        return self.info

    def forward(self, port: int, **options: Any) -> PortForward:
        """See :meth:`SandboxClient.forward`: ``async with ws.forward(8000) as address:``."""
        return self.client.forward(self.workspace_id, port, **options)

    async def pause(self) -> WorkspaceInfo:
        """See :meth:`SandboxClient.pause_workspace`."""
        self.info = await self.client.pause_workspace(self.workspace_id)
        return self.info

    async def resume(self) -> WorkspaceInfo:
        """See :meth:`SandboxClient.resume_workspace`."""
        self.info = await self.client.resume_workspace(self.workspace_id)
        return self.info

    async def snapshot(
        self, name: str, *, labels: Mapping[str, str] | None = None, include_memory: bool = False
    ) -> SnapshotInfo:
        """See :meth:`SandboxClient.snapshot_workspace`."""
        return await self.client.snapshot_workspace(
            self.workspace_id, name, labels=labels, include_memory=include_memory
        )

    async def restore(self, snapshot: str) -> WorkspaceInfo:
        """See :meth:`SandboxClient.restore_workspace`."""
        self.info = await self.client.restore_workspace(self.workspace_id, snapshot)
        return self.info

    async def refresh(self) -> WorkspaceInfo:
        """Fetch the current state."""
        self.info = (await self.client.get_workspace(self.workspace_id)).info
        return self.info

    async def delete(self) -> None:
        """Remove the workspace and its volume."""
        await self.client.delete_workspace(self.workspace_id)

    def __repr__(self) -> str:
        """Show the id and state."""
        return f"<Workspace {self.workspace_id} {self.info.state}>"


async def _once(data: bytes) -> AsyncIterator[bytes]:
    """``data`` as an async iterable of one piece (none when empty)."""
    if data:
        yield data
