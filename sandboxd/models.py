"""Frozen domain objects shared by the API layer, the domain services and the backends.

Nothing here knows about protobuf or Docker. Sizes are in bytes, durations in
seconds (``_s``), and CPU in thousandths of a CPU (``_millis``).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import signal
from collections.abc import Mapping

__all__ = [
    "EgressRule",
    "ExecEvent",
    "ExecSpec",
    "ExecStarted",
    "ExitStatus",
    "Heartbeat",
    "IdleAction",
    "NetworkPolicy",
    "OutputChunk",
    "OutputDropped",
    "ResourceLimits",
    "Runtime",
    "SecurityOptions",
    "Snapshot",
    "StopReason",
    "Workspace",
    "WorkspaceSpec",
    "WorkspaceState",
    "Yielded",
    "signal_name",
]


class NetworkPolicy(enum.StrEnum):
    """Which network a workspace joins."""

    NONE = "none"
    BRIDGE = "bridge"
    ALLOWLIST = "allowlist"


@dataclasses.dataclass(frozen=True)
class EgressRule:
    """A host an ALLOWLIST workspace may reach through its egress proxy (``sandboxd.egress``).

    ``host`` is a name (lower case, no final dot), ``*.`` and a name (its subdomains), an IP
    address or a CIDR block; ``ports`` empty means 80 and 443.
    """

    host: str
    ports: tuple[int, ...] = ()


class Runtime(enum.StrEnum):
    """OCI runtime of a workspace container."""

    RUNC = "runc"
    RUNSC = "runsc"


class WorkspaceState(enum.StrEnum):
    """Container state as callers see it."""

    RUNNING = "running"
    STOPPED = "stopped"
    PAUSED = "paused"


class IdleAction(enum.StrEnum):
    """What the idle TTL does to a workspace."""

    DELETE = "delete"
    PAUSE = "pause"


class StopReason(enum.StrEnum):
    """Why a process stopped; ranked interrupted > timeout > failed > the rest."""

    EXITED = "exited"
    INTERRUPTED = "interrupted"
    TIMEOUT = "timeout"
    FAILED = "failed"
    KILLED = "killed"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResourceLimits:
    """Resource caps; 0 in a request means "the daemon default"."""

    memory_bytes: int = 0
    """Memory limit in bytes, swap not added on top."""
    cpu_millis: int = 0
    """CPU quota in thousandths of a CPU."""
    pids: int = 0
    """Most processes and threads alive at once."""
    disk_bytes: int = 0
    """Size cap of /workspace in bytes (a tmpfs volume); 0 means no cap (a plain Docker volume)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SecurityOptions:
    """Explicit loosening of the hardened defaults."""

    added_capabilities: tuple[str, ...] = ()
    """Capabilities added back after dropping all (upper case, no ``CAP_`` prefix)."""
    allow_new_privileges: bool = False
    """Turn ``no-new-privileges`` off."""
    user: str = ""
    """User commands run as; empty means the image's non-root user (or 1000:1000)."""
    read_only_root_filesystem: bool = False
    """Root filesystem read-only; /workspace and a tmpfs /tmp stay writable."""
    root_capabilities: tuple[str, ...] = ()
    """Capabilities a command run as uid 0 keeps on top of ``added_capabilities`` (no other user gets them)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkspaceSpec:
    """What a caller asks for; ``WorkspaceManager`` fills in every default."""

    image: str = ""
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    working_dir: str = ""
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    limits: ResourceLimits = dataclasses.field(default_factory=ResourceLimits)
    network: NetworkPolicy | None = None
    """None: the default (none), or a snapshot's source's."""
    allowed_hosts: tuple[EgressRule, ...] = ()
    """For the ALLOWLIST policy: where its egress proxy lets it go."""
    runtime: Runtime | None = None
    idle_ttl_s: float | None = None
    """Seconds without calls before the idle action; None = daemon default, 0 = never."""
    security: SecurityOptions = dataclasses.field(default_factory=SecurityOptions)
    idle_action: IdleAction | None = None
    """What the idle TTL does; None = delete."""
    auto_resume: bool | None = None
    """Whether a call needing a paused workspace's processes resumes it; None = yes."""
    lifetime_s: float | None = None
    """Seconds from create to the workspace's end (its idle action); None or 0 = no end."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workspace:
    """A workspace as stored in its container's labels, with live state."""

    workspace_id: str
    spec: WorkspaceSpec
    """The spec with every default resolved."""
    state: WorkspaceState
    create_time: datetime.datetime
    container_id: str
    volume_name: str
    from_snapshot: str = ""
    """The snapshot it was forked from, if any."""
    expire_time: datetime.datetime | None = None
    """When it ends (its lifetime); None: no end."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Snapshot:
    """A workspace's files, kept to start workspaces from (an image of the engine's)."""

    name: str
    source_workspace_id: str
    create_time: datetime.datetime
    labels: Mapping[str, str]
    size_bytes: int
    spec: WorkspaceSpec
    """The source's resolved spec: what a fork takes for the fields it leaves unset."""
    memory_bytes: int = 0
    """Bytes of its processes' memory as the runtime saved them; 0: files only."""
    start_command: str = ""
    """A template's: run in the background at each start of a workspace from it."""
    ready_command: str = ""
    """A template's: run after the start command until it exits 0, before the workspace is handed out."""
    build_digest: str = ""
    """A template's: the digest of what it was built from; empty for a snapshot of a workspace."""

    @property
    def include_memory(self) -> bool:
        """Whether a fork starts with the source's processes running."""
        return self.memory_bytes > 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExecSpec:
    """One command to run."""

    command: str
    workdir: str = ""
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    yield_after_s: float | None = None
    """Seconds to stream before yielding; None means the default: 60 s."""
    timeout_s: float | None = None
    """Seconds before the command is killed; None means the daemon default."""
    max_output_bytes: int = 0
    """Undelivered output held before dropping; 0 means the daemon default."""
    tty: bool = False
    columns: int = 80
    rows: int = 24
    spill_after_bytes: int = 0
    """Copy all output to a spill file once it passes this many bytes; 0 means never."""
    merge_stderr: bool = False
    """Send stderr into stdout's pipe (``2>&1``) so the two keep their relative order."""
    user: str = ""
    """Run as this user (``name``, ``uid``, ``name:group`` or ``uid:gid``); empty means the workspace's."""
    stdin_closed: bool = False
    """Close stdin as the command starts: it reads end-of-file at once."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExecStarted:
    """First event: the command runs."""

    process_id: str
    pid: int
    start_time: datetime.datetime


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutputChunk:
    """Bytes read from one of the command's streams."""

    stream: str
    """``"stdout"`` or ``"stderr"``."""
    data: bytes
    position: int = 0
    """The output position once a caller has these bytes (``OutputRelay.position_after``): an
    Input resumes after it (``resume_from``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutputDropped:
    """A gap: this many bytes were dropped here because the buffer was full."""

    dropped_bytes: int
    position: int = 0
    """The output position after the gap (see ``OutputChunk.position``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExitStatus:
    """Terminal event: how the top-level command ended."""

    exit_code: int
    """The exit code; a death by signal N is 128+N."""
    signal: str = ""
    """Name of the signal that ended it, or empty."""
    stop_reason: StopReason = StopReason.EXITED
    oom_killed: bool = False
    memory_limit_bytes: int = 0
    """The workspace memory limit, reported with ``oom_killed``."""
    dropped_bytes: int = 0
    elapsed_s: float = 0.0
    message: str = ""
    spill_path: str = ""
    """The file holding the whole output, when it passed the spill threshold."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Yielded:
    """Terminal event: the command still runs in the background."""

    process_id: str
    elapsed_s: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class Heartbeat:
    """Liveness event on a long stream."""

    elapsed_s: float


ExecEvent = ExecStarted | OutputChunk | OutputDropped | ExitStatus | Yielded | Heartbeat


def signal_name(number: int) -> str:
    """Return ``"SIGINT"`` for 2 and so on; ``"SIG<N>"`` for numbers without a name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"
