"""Workspace life cycle: validate a spec, apply the hardened defaults, and keep it in labels.

The daemon keeps no state the engine does not: a workspace's resolved spec is
stored as JSON in its container's ``sandboxd.spec`` label, so ``get`` and
``list`` read it back from Docker and a restarted daemon sees the same thing.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import dataclasses
import datetime
import functools
import hashlib
import json
import os
import posixpath
import re
import secrets
import time
import weakref
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from typing import Any

import structlog
from sandboxd_protocol.limits import (
    MAX_CAPABILITIES,
    MAX_IMAGE_REFERENCE_BYTES,
    MAX_LABEL_VALUE_BYTES,
    MAX_LABELS,
    MAX_LABELS_BYTES,
    MAX_LIST_PAGE_SIZE,
    MAX_PATH_BYTES,
    MAX_WORKSPACE_ENV_BYTES,
    utf8_size,
)

from .agent import AgentLink, Welcome
from .agentbuild import AGENT_MOUNT, AGENT_PATH, AgentBuild, ensure_agent
from .audit import AuditLog
from .backend.base import LABEL_SNAPSHOT_PART, Backend, ContainerInfo, ContainerSpec, ImageInfo
from .egress import EgressProxies, check_rules, proxy_env
from .errors import (
    FailedPreconditionError,
    ImageNotFoundError,
    InvalidSpecError,
    NotFoundError,
    QuotaExceededError,
    SandboxdError,
    WorkspaceExistsError,
    WorkspaceNotFoundError,
    WorkspaceNotRunningError,
    quoted,
)
from .images import egress_image_ref
from .models import (
    EgressRule,
    ExecSpec,
    IdleAction,
    NetworkPolicy,
    ResourceLimits,
    Runtime,
    SecurityOptions,
    Workspace,
    WorkspaceSpec,
    WorkspaceState,
)
from .pool import LABEL_POOL, PoolClass, WarmPool, read_pool_file
from .processes import ExecContext, ProcessTable, check_env
from .secrets import SecretStore
from .settings import Settings
from .tenancy import DEFAULT_TENANT, current_tenant

__all__ = [
    "AGENT_CAPABILITIES",
    "CAPABILITIES",
    "LABEL_AGENT",
    "LABEL_CREATE_REQUEST",
    "LABEL_SPEC",
    "LABEL_TENANT",
    "RESERVED_LABEL_PREFIX",
    "WorkspaceManager",
    "check_labels",
    "check_request_id",
    "check_workspace_id",
    "container_spec",
    "spec_from_json",
    "spec_to_json",
]

log = structlog.get_logger(__name__)

RESERVED_LABEL_PREFIX = "sandboxd."
LABEL_SPEC = "sandboxd.spec"
LABEL_TENANT = "sandboxd.tenant"
LABEL_SNAPSHOT = "sandboxd.snapshot"
"""On a snapshot's image: its name; on a fork: the snapshot it was made from."""
LABEL_AGENT = "sandboxd.agent"
"""The agent version a workspace was created with; a workspace without it predates the agent."""
LABEL_CREATE_REQUEST = "sandboxd.create_request"
"""The ``request_id`` of the create that made a workspace: a retry of that create finds it by this."""
LABEL_CREATE_DIGEST = "sandboxd.create_digest"
"""A digest of what that create asked for (its spec as sent, its snapshot): a reuse of the request id
for another create is refused, not answered with this workspace."""
AGENT_CAPABILITIES = ("CHOWN", "KILL", "SETGID", "SETPCAP", "SETUID")
"""What the agent (root, the container's main process) keeps: to start commands as the workspace
user (SETUID, SETGID), clear their bounding set (SETPCAP), signal them (KILL) and give them their
terminal (CHOWN). It drops all of them from every command and file operation."""
AGENT_SOCKET_DIR = "/run/sandboxd"
"""The agent's socket directory: a root-only tmpfs (agent/PROTOCOL.md)."""
AGENT_SOCKET_NAME = "agent.sock"
WORKSPACE_ROOT = "/workspace"
FALLBACK_USER = "1000:1000"
"""User for images whose own user is root or unset: commands never run as root by default."""

MIN_MEMORY_BYTES = 16 * 1024**2
MIN_CPU_MILLIS = 10
MIN_PIDS = 16
MAX_PIDS = 4_194_304
"""Linux's PID_MAX_LIMIT: no pids limit above it means anything (the runtime fails on one)."""
MIN_DISK_BYTES = 4 * 1024**2
"""Smallest /workspace cap: room for the daemon's spill directory and a few files."""

CAPABILITIES = frozenset(
    [
        "AUDIT_CONTROL",
        "AUDIT_READ",
        "AUDIT_WRITE",
        "BLOCK_SUSPEND",
        "BPF",
        "CHECKPOINT_RESTORE",
        "CHOWN",
        "DAC_OVERRIDE",
        "DAC_READ_SEARCH",
        "FOWNER",
        "FSETID",
        "IPC_LOCK",
        "IPC_OWNER",
        "KILL",
        "LEASE",
        "LINUX_IMMUTABLE",
        "MAC_ADMIN",
        "MAC_OVERRIDE",
        "MKNOD",
        "NET_ADMIN",
        "NET_BIND_SERVICE",
        "NET_BROADCAST",
        "NET_RAW",
        "PERFMON",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYSLOG",
        "SYS_ADMIN",
        "SYS_BOOT",
        "SYS_CHROOT",
        "SYS_MODULE",
        "SYS_NICE",
        "SYS_PACCT",
        "SYS_PTRACE",
        "SYS_RAWIO",
        "SYS_RESOURCE",
        "SYS_TIME",
        "SYS_TTY_CONFIG",
        "WAKE_ALARM",
    ]
)
"""Linux capability names a caller may add back (SPEC §2.2: all are dropped by default)."""

MIN_IDLE_TTL_S = 1.0
"""Shortest idle TTL other than 0 (never): the idle reaper looks once a second."""
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# Docker's reference grammar, simplified: [registry[:port]/]path[:tag][@digest], lowercase path.
_IMAGE_RE = re.compile(
    r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*"
    r"(?::[\w][\w.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)
MAX_IMAGE_NAME_CHARS = 255
"""Docker's limit on an image's repository name (registry and path, without tag or digest)."""


def _image_name(reference: str) -> str:
    """The repository name Docker checks its limit on, normalised as Docker does.

    ``host:5000/a/b:tag@sha256:…`` gives ``host:5000/a/b``; a name without a registry is
    Docker Hub's: ``ubuntu`` counts as ``docker.io/library/ubuntu``, ``a/b`` as ``docker.io/a/b``.
    """
    name = reference.split("@", 1)[0]
    head, colon, tag = name.rpartition(":")
    name = head if colon and "/" not in tag else name
    first, slash, _rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return name
    return f"docker.io/{name}" if slash else f"docker.io/library/{name}"


_LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
_USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?$")


def check_workspace_id(workspace_id: str) -> None:
    """Refuse ids that Create would never make (so ``ws-1/`` cannot alias ``ws-1``).

    Raises:
        InvalidSpecError: not 1-40 lowercase letters, digits or dashes.
    """
    if not _ID_RE.fullmatch(workspace_id):
        msg = f"workspace_id {quoted(workspace_id)} must be 1-40 lowercase letters, digits or dashes"
        raise InvalidSpecError(msg)


def check_request_id(request_id: str) -> None:
    """Refuse a create's ``request_id`` that is not a short token (it is kept as a label).

    Raises:
        InvalidSpecError: not 1-64 letters, digits, dots, underscores or dashes.
    """
    if not _REQUEST_ID_RE.fullmatch(request_id):
        msg = f"request_id {quoted(request_id)} must be 1-64 letters, digits, dots, underscores or dashes"
        raise InvalidSpecError(msg)


def _request_digest(spec: WorkspaceSpec, snapshot: ImageInfo | None) -> str:
    """What a create asked for, as the caller sent it (before defaults, which may change with settings)."""
    asked = f"{spec_to_json(spec)}\0{snapshot.labels.get(LABEL_SNAPSHOT, '') if snapshot is not None else ''}"
    return hashlib.sha256(asked.encode()).hexdigest()[:32]


@dataclasses.dataclass
class _Making:
    """A create in flight: whose it is, by which request, and the work that makes it.

    The work's result is the workspace and whether this create made it (False: it found the
    one its request had made, which its caller's going away must never remove).
    """

    tenant: str
    request_id: str
    work: asyncio.Future[tuple[Workspace, bool]]
    waiting: int = 0
    """Retries of the same request waiting for it: while any wait, its own caller's going away removes nothing."""


def check_labels(labels: Mapping[str, str], field: str) -> None:
    """Bound a label map (workspace labels or a selector) and refuse reserved or malformed keys.

    Raises:
        InvalidSpecError: more than ``MAX_LABELS`` labels, a value over ``MAX_LABEL_VALUE_BYTES``,
            more than ``MAX_LABELS_BYTES`` in all, a key in the ``sandboxd.`` namespace, or a bad key.
    """
    if len(labels) > MAX_LABELS:
        msg = f"{field} has {len(labels)} entries; the limit is {MAX_LABELS}"
        raise InvalidSpecError(msg)
    total = sum(utf8_size(key) + utf8_size(value) for key, value in labels.items())
    if total > MAX_LABELS_BYTES:
        msg = f"{field} is {total} bytes (keys and values); the limit is {MAX_LABELS_BYTES}"
        raise InvalidSpecError(msg)
    for key, value in labels.items():
        if key.lower().startswith(RESERVED_LABEL_PREFIX):
            msg = f"{field} key {quoted(key)} is in the reserved 'sandboxd.' namespace"
            raise InvalidSpecError(msg)
        if not _LABEL_KEY_RE.fullmatch(key):
            msg = f"{field} key {quoted(key)} is not valid (letters, digits, '.', '_', '/', '-'; at most 128)"
            raise InvalidSpecError(msg)
        if utf8_size(value) > MAX_LABEL_VALUE_BYTES:
            msg = f"{field} value of {quoted(key)} is {utf8_size(value)} bytes; the limit is {MAX_LABEL_VALUE_BYTES}"
            raise InvalidSpecError(msg)


def spec_to_json(spec: WorkspaceSpec) -> str:
    """Serialise a resolved spec for the ``sandboxd.spec`` label."""
    data = dataclasses.asdict(spec)
    data["env"] = dict(spec.env)
    data["labels"] = dict(spec.labels)
    data["security"]["added_capabilities"] = list(spec.security.added_capabilities)
    data["allowed_hosts"] = [[rule.host, list(rule.ports)] for rule in spec.allowed_hosts]
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def spec_from_json(text: str) -> WorkspaceSpec:
    """Read a spec written by :func:`spec_to_json`."""
    data: dict[str, Any] = json.loads(text)
    return WorkspaceSpec(
        image=data["image"],
        env=dict(data["env"]),
        working_dir=data["working_dir"],
        labels=dict(data["labels"]),
        limits=ResourceLimits(**data["limits"]),
        network=NetworkPolicy(data.get("network") or "none"),
        allowed_hosts=tuple(
            EgressRule(host=str(host), ports=tuple(int(p) for p in ports))
            for host, ports in data.get("allowed_hosts", [])
        ),
        runtime=Runtime(data["runtime"]) if data.get("runtime") else None,
        idle_ttl_s=data.get("idle_ttl_s"),
        security=SecurityOptions(
            added_capabilities=tuple(data["security"]["added_capabilities"]),
            allow_new_privileges=bool(data["security"]["allow_new_privileges"]),
            user=data["security"]["user"],
            read_only_root_filesystem=bool(data["security"].get("read_only_root_filesystem", False)),
        ),
        idle_action=IdleAction(data["idle_action"]) if data.get("idle_action") else None,
        auto_resume=data.get("auto_resume"),
    )


def inherit(request: WorkspaceSpec, source: WorkspaceSpec, *, image: str) -> WorkspaceSpec:
    """A fork's spec: ``request``'s fields, each unset one (empty, zero, None) ``source``'s, on ``image``."""
    limits, theirs = request.limits, source.limits
    mine = request.security
    return WorkspaceSpec(
        image=image,
        env=request.env or source.env,
        working_dir=request.working_dir or source.working_dir,
        labels=request.labels or source.labels,
        limits=ResourceLimits(
            memory_bytes=limits.memory_bytes or theirs.memory_bytes,
            cpu_millis=limits.cpu_millis or theirs.cpu_millis,
            pids=limits.pids or theirs.pids,
            disk_bytes=limits.disk_bytes or theirs.disk_bytes,
        ),
        network=request.network or source.network,
        allowed_hosts=request.allowed_hosts if request.network else source.allowed_hosts,
        runtime=request.runtime or source.runtime,
        idle_ttl_s=request.idle_ttl_s if request.idle_ttl_s is not None else source.idle_ttl_s,
        security=SecurityOptions(
            added_capabilities=mine.added_capabilities or source.security.added_capabilities,
            allow_new_privileges=mine.allow_new_privileges or source.security.allow_new_privileges,
            user=mine.user or source.security.user,
            read_only_root_filesystem=mine.read_only_root_filesystem or source.security.read_only_root_filesystem,
        ),
        idle_action=request.idle_action or source.idle_action,
        auto_resume=request.auto_resume if request.auto_resume is not None else source.auto_resume,
    )


def _disinherited(image: ImageInfo, labels: Mapping[str, str], snapshot: ImageInfo | None) -> dict[str, str]:
    """Blank values for the labels a new container would take from its image that are not its own.

    Docker gives a container its image's labels, and a label cannot be dropped, only given
    another value: an image's ``sandboxd.*`` labels (a snapshot's, or any image's that carries
    them, ``sandboxd.pool`` among them) must not make the workspace something else, nor, for a
    fork, its source's own labels be its. The image's own description (``sandboxd.image.*``) stays.
    """
    source = spec_from_json(snapshot.labels[LABEL_SPEC]).labels if snapshot is not None else {}

    def foreign(key: str) -> bool:
        return key in source or (key.startswith(RESERVED_LABEL_PREFIX) and not key.startswith("sandboxd.image."))

    return {key: "" for key in image.labels if key not in labels and foreign(key)}


def container_spec(
    resolved: WorkspaceSpec,
    workspace_id: str,
    *,
    tenant: str,
    network: str,
    image: ImageInfo,
    agent: AgentBuild,
    pool_class: str = "",
    snapshot: ImageInfo | None = None,
    request: tuple[str, str] | None = None,
) -> ContainerSpec:
    """What a backend is asked to run for a workspace: the agent as its main process, the spec as labels.

    Args:
        resolved: a spec with every default applied (:meth:`WorkspaceManager.resolve`) and its user.
        workspace_id: the workspace's id.
        tenant: its tenant (unless it is a member of ``pool_class``, which has none).
        network: ``none``, ``bridge`` or the workspace's own network (an allowlist's).
        image: the image as the engine reports it (its labels are disinherited).
        agent: the agent build whose volume it mounts.
        pool_class: the warm pool class it is a member of, or empty.
        snapshot: the snapshot it forks, if any.
        request: the create's request id and the digest of what it asked for, if it has one
            (``LABEL_CREATE_REQUEST``, ``LABEL_CREATE_DIGEST``).
    """
    return ContainerSpec(
        workspace_id=workspace_id,
        image=resolved.image,
        # The workspace env reaches every command through the agent, never the agent
        # itself: a caller's PATH or LD_PRELOAD must not change how the agent runs.
        env={},
        working_dir=resolved.working_dir,
        labels={
            **_disinherited(image, resolved.labels, snapshot),
            **resolved.labels,
            LABEL_SPEC: spec_to_json(resolved),
            LABEL_AGENT: agent.tag,
            **({LABEL_POOL: pool_class} if pool_class else {LABEL_TENANT: tenant}),
            **({LABEL_SNAPSHOT: snapshot.labels[LABEL_SNAPSHOT]} if snapshot is not None else {}),
            **_request_labels(request),
        },
        memory_bytes=resolved.limits.memory_bytes,
        cpu_millis=resolved.limits.cpu_millis,
        pids=resolved.limits.pids,
        disk_bytes=resolved.limits.disk_bytes,
        read_only_root_filesystem=resolved.security.read_only_root_filesystem,
        network=network,
        runtime=str(resolved.runtime),
        added_capabilities=resolved.security.added_capabilities,
        no_new_privileges=not resolved.security.allow_new_privileges,
        entrypoint=(AGENT_PATH, "serve"),
        agent_volume=agent.volume,
        agent_mount=AGENT_MOUNT,
        agent_capabilities=AGENT_CAPABILITIES,
        private_dirs=(AGENT_SOCKET_DIR,),
        seed_workspace=snapshot is not None,
        # On an allowlist's network no name resolves (Docker's resolver there answers none):
        # a tool that ignores HTTP_PROXY fails in a second rather than in forty.
        dns_options=("timeout:1", "attempts:1") if resolved.network is NetworkPolicy.ALLOWLIST else (),
    )


def _request_labels(request: tuple[str, str] | None) -> dict[str, str]:
    """The labels that say which create request made a workspace (none without a request id)."""
    if request is None:
        return {}
    return {LABEL_CREATE_REQUEST: request[0], LABEL_CREATE_DIGEST: request[1]}


def _made_by(info: ContainerInfo) -> tuple[str, str] | None:
    """``(tenant, request_id)`` of the create that made a workspace; None for one made without a request id."""
    request_id = info.labels.get(LABEL_CREATE_REQUEST, "")
    if not request_id or info.labels.get(LABEL_POOL):
        return None
    return info.labels.get(LABEL_TENANT, DEFAULT_TENANT), request_id


@dataclasses.dataclass(frozen=True)
class _Asked:
    """What a create was asked beside its spec: the caller's id, its request id and digest."""

    chosen_id: str
    request_id: str
    digest: str
    repeat: bool
    """Its request is known to have made (or be making) this id: what that made is looked for first."""

    @property
    def request(self) -> tuple[str, str] | None:
        """Its request id and digest, for the workspace's labels (:func:`container_spec`); None without one."""
        return (self.request_id, self.digest) if self.request_id else None


def _is_snapshot(image: ImageInfo) -> bool:
    """Whether an image is a snapshot (or a part of one being taken)."""
    return bool(image.labels.get(LABEL_SNAPSHOT)) or image.labels.get(LABEL_SNAPSHOT_PART) == "true"


DEFAULT_PAGE_SIZE = 100
"""Workspaces per ListWorkspaces page when the caller sets no page size."""

PAGE_SPEC_BYTES = 4 * 1024**2
"""A ListWorkspaces page ends before its stored specs pass this many bytes: with the daemon's
64 MiB message limit a page always fits, whatever workspaces an older release let be made."""


def _listing_key(info: ContainerInfo) -> tuple[datetime.datetime, str]:
    """The listing order: oldest first, ties by id, so that a page token is a position in it."""
    return (info.create_time, info.workspace_id)


def _page_token(last: Workspace) -> str:
    position = json.dumps([last.create_time.isoformat(), last.workspace_id]).encode()
    return base64.urlsafe_b64encode(position).decode().rstrip("=")


def _page_position(token: str) -> tuple[datetime.datetime, str] | None:
    """The listing position a page token names; None for the first page.

    Raises:
        InvalidSpecError: not a token this daemon gave.
    """
    if not token:
        return None
    try:
        if len(token) > 256:
            raise ValueError  # noqa: TRY301 - one refusal for every kind of bad token
        created, workspace_id = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        moment = datetime.datetime.fromisoformat(created)
        if not isinstance(workspace_id, str) or moment.tzinfo is None:
            raise ValueError  # noqa: TRY301
    except (ValueError, TypeError):
        msg = "page_token is not one this daemon gave (pass next_page_token as it came)"
        raise InvalidSpecError(msg) from None
    return moment, workspace_id


class WorkspaceManager:
    """Creates, finds and removes workspaces over a :class:`Backend`.

    Args:
        backend: the container engine.
        settings: daemon defaults and caps.
        processes: the process table, told when a workspace goes away.
        secrets: resolves ``secret:NAME`` values of workspace environments.
        agent: the agent new workspaces run; None finds it (building it if missing) at the
            first create, and again at each create while that fails.
    """

    def __init__(
        self,
        backend: Backend,
        settings: Settings,
        processes: ProcessTable,
        *,
        secrets: SecretStore | None = None,
        agent: AgentBuild | None = None,
    ) -> None:
        """Wire the manager."""
        self.backend = backend
        self.settings = settings
        self.processes = processes
        self.secrets = secrets or SecretStore("", {})
        self.agent = agent
        self._agent_lock = asyncio.Lock()
        self.audit: AuditLog | None = None
        """Where adopted sessions are recorded."""
        self._contexts: dict[str, ExecContext] = {}
        self._activity: dict[str, float] = {}
        self._busy: dict[str, int] = {}
        self._quota_lock = asyncio.Lock()
        self._reserved: dict[str, builtins.list[int]] = {}
        """Memory limits of each tenant's creates in flight, counted against its quota."""
        self._making: dict[str, _Making] = {}
        """Creates in flight, by workspace id: what makes a create of one id exclusive."""
        self._requests: dict[tuple[str, str], str] = {}
        """``(tenant, request_id)`` of each create in flight with one -> its workspace id."""
        self._made_for: dict[tuple[str, str], str] = {}
        """``(tenant, request_id)`` -> the workspace that create made (from the labels at adoption, then
        kept as creates complete); an entry whose workspace went behind the daemon's back is dropped
        when it is next looked up."""
        self._abandoned: set[str] = set()
        """Workspaces made by a create whose caller went away, to be removed unless a retry took them first."""
        self._id_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._started = time.monotonic()
        self._background: set[asyncio.Task[None]] = set()
        self._paused: dict[str, bool] = {}
        """Workspaces this daemon knows are paused, with whether a call may resume them."""
        self._host_sockets: set[str] = set()
        """Runtimes whose agents answered on their host socket (:class:`AgentLink`)."""
        self.pool: WarmPool | None = None
        """The warm pool, once :meth:`start_pool` made it."""
        self.egress = EgressProxies(backend, settings, egress_image_ref())
        """The ALLOWLIST workspaces' egress proxies."""
        self._networks: dict[str, tuple[NetworkPolicy, tuple[EgressRule, ...]]] = {}
        """Each workspace's network policy now (UpdateNetwork changes it; its spec label keeps the first)."""

    def touch(self, workspace_id: str) -> None:
        """Note a call on the workspace (its idle TTL starts again)."""
        self._activity[workspace_id] = time.monotonic()

    def _owned(self, info: ContainerInfo) -> ContainerInfo:
        """``info`` if the current tenant owns it; NOT_FOUND otherwise (existence never leaks)."""
        if info.labels.get(LABEL_TENANT, DEFAULT_TENANT) != current_tenant():
            msg = f"workspace {info.workspace_id!r} not found"
            raise WorkspaceNotFoundError(msg)
        return info

    # -- validation --------------------------------------------------------------------------------
    def resolve(self, spec: WorkspaceSpec) -> WorkspaceSpec:
        """Validate ``spec`` and fill in every default except the user.

        Raises:
            InvalidSpecError: with a message naming the offending field.
        """
        s = self.settings
        check_labels(spec.labels, "labels")
        check_env(spec.env, "env", max_bytes=MAX_WORKSPACE_ENV_BYTES)  # it is stored with the workspace
        for field, text, limit in (
            ("image", spec.image, MAX_IMAGE_REFERENCE_BYTES),
            ("working_dir", spec.working_dir, MAX_PATH_BYTES),
        ):
            if utf8_size(text) > limit:
                msg = f"{field} is {utf8_size(text)} bytes; the limit is {limit}"
                raise InvalidSpecError(msg)
        if len(spec.security.added_capabilities) > MAX_CAPABILITIES:
            msg = (
                f"security.added_capabilities has {len(spec.security.added_capabilities)} entries; "
                f"the limit is {MAX_CAPABILITIES}"
            )
            raise InvalidSpecError(msg)
        self.secrets.check(spec.env, "env", current_tenant())
        limits = spec.limits
        for name, value in (
            ("memory_bytes", limits.memory_bytes),
            ("cpu_millis", limits.cpu_millis),
            ("pids", limits.pids),
            ("disk_bytes", limits.disk_bytes),
        ):
            if value < 0:
                msg = f"limits.{name} must not be negative, got {value}"
                raise InvalidSpecError(msg)
        memory = limits.memory_bytes or s.default_memory_bytes
        if not MIN_MEMORY_BYTES <= memory <= s.max_memory_bytes:
            msg = f"limits.memory_bytes must be between {MIN_MEMORY_BYTES} and {s.max_memory_bytes}, got {memory}"
            raise InvalidSpecError(msg)
        cpu = limits.cpu_millis or s.default_cpu_millis
        max_cpu = 1000 * (os.cpu_count() or 1)
        if not MIN_CPU_MILLIS <= cpu <= max_cpu:
            # Checked here (C11): the engine's own refusal is a Go unmarshalling error.
            msg = f"limits.cpu_millis must be between {MIN_CPU_MILLIS} and {max_cpu} (this machine's CPUs), got {cpu}"
            raise InvalidSpecError(msg)
        pids = limits.pids or s.default_pids
        if not MIN_PIDS <= pids <= MAX_PIDS:
            msg = f"limits.pids must be between {MIN_PIDS} and {MAX_PIDS} (the kernel's largest pid_max), got {pids}"
            raise InvalidSpecError(msg)
        disk = limits.disk_bytes or s.default_disk_bytes
        if disk and not MIN_DISK_BYTES <= disk <= memory:
            # A capped /workspace is tmpfs, charged to the memory cgroup: a cap above the memory
            # limit would end in the OOM killer instead of ENOSPC.
            msg = f"limits.disk_bytes must be between {MIN_DISK_BYTES} and the memory limit {memory}, got {disk}"
            raise InvalidSpecError(msg)
        runtime = spec.runtime or Runtime(s.default_runtime)
        network = spec.network or NetworkPolicy.NONE
        self._check_runtime_network(runtime, network)
        allowed_hosts = check_rules(network, spec.allowed_hosts)
        working_dir = spec.working_dir or WORKSPACE_ROOT
        if not working_dir.startswith("/") or "\0" in working_dir:
            msg = f"working_dir must be an absolute path, got {quoted(working_dir)}"
            raise InvalidSpecError(msg)
        capabilities = []
        for cap in spec.security.added_capabilities:
            name = cap.upper().removeprefix("CAP_")
            if name not in CAPABILITIES:
                msg = f"unknown capability {quoted(cap)}"
                raise InvalidSpecError(msg)
            capabilities.append(name)
        if spec.security.user and not _USER_RE.fullmatch(spec.security.user):
            msg = f"security.user {quoted(spec.security.user)} is not a user name, uid or uid:gid"
            raise InvalidSpecError(msg)
        if spec.idle_ttl_s is not None and (spec.idle_ttl_s < 0 or 0 < spec.idle_ttl_s < MIN_IDLE_TTL_S):
            # The reaper looks once a second: a shorter TTL would reap a workspace as it is made.
            msg = f"idle_ttl must be 0 (never) or at least {MIN_IDLE_TTL_S:g} s, got {spec.idle_ttl_s:g} s"
            raise InvalidSpecError(msg)
        if spec.image and not _IMAGE_RE.fullmatch(spec.image):
            msg = (
                f"image {quoted(spec.image)} is not a valid image reference (lowercase repository, optional :tag or "
                "@digest)"
            )
            raise InvalidSpecError(msg)
        if len(name := _image_name(spec.image)) > MAX_IMAGE_NAME_CHARS:
            msg = (
                f"image's repository name is {len(name)} characters as Docker counts it ({quoted(name)}); "
                f"Docker allows at most {MAX_IMAGE_NAME_CHARS}"
            )
            raise InvalidSpecError(msg)
        return dataclasses.replace(
            spec,
            image=spec.image or s.default_image,
            env=dict(spec.env),
            labels=dict(spec.labels),
            working_dir=posixpath.normpath(working_dir),
            limits=ResourceLimits(memory_bytes=memory, cpu_millis=cpu, pids=pids, disk_bytes=disk),
            network=network,
            allowed_hosts=allowed_hosts,
            runtime=runtime,
            idle_ttl_s=spec.idle_ttl_s if spec.idle_ttl_s is not None else s.default_idle_ttl_s,
            security=dataclasses.replace(spec.security, added_capabilities=tuple(sorted(set(capabilities)))),
            idle_action=spec.idle_action or IdleAction.DELETE,
            auto_resume=spec.auto_resume is not False,
        )

    def _check_runtime_network(self, runtime: Runtime, network: NetworkPolicy) -> None:
        if runtime is Runtime.RUNSC and network is not NetworkPolicy.NONE and not self.settings.runsc_network:
            msg = (
                f"network {str(network)!r} is not available under runtime 'runsc' on this daemon (its gVisor "
                "runs with --network=none; set SANDBOXD_RUNSC_NETWORK=true once the engine's runsc can network)"
            )
            raise InvalidSpecError(msg)

    # -- life cycle ----------------------------------------------------------------------------------
    async def create(
        self,
        spec: WorkspaceSpec,
        *,
        workspace_id: str = "",
        request_id: str = "",
        snapshot: ImageInfo | None = None,
    ) -> Workspace:
        """Create and start a workspace.

        A create is complete once its agent answered; until then its container is provisional
        (``Backend.commit_container``), and a daemon that dies meanwhile leaves nothing a
        restart keeps. With ``request_id`` a retried create is idempotent (Google AIP-155):
        the caller's create of the same request, made or in flight, is its answer.

        Args:
            spec: the caller's spec; defaults are filled in.
            workspace_id: optional caller-chosen id; empty generates ``ws-<12 hex>`` (or, with
                ``request_id``, takes the id of the workspace that request made).
            request_id: optional key of this create (:func:`check_request_id`), kept on the
                workspace as ``sandboxd.create_request``.
            snapshot: a snapshot's image to fork (``SnapshotStore.find``): the workspace starts
                with its files, and every field ``spec`` leaves unset is the snapshot's source's.

        Raises:
            InvalidSpecError: a field is out of range or malformed.
            WorkspaceExistsError: the id is taken (by another request, or by a create without one);
                or ``request_id`` made another workspace than ``workspace_id``, or was sent with
                another spec or snapshot.
            ImageNotFoundError: the image is missing and cannot be pulled.
            DockerUnavailableError: the engine is down.
        """
        if workspace_id:
            check_workspace_id(workspace_id)
        if request_id:
            check_request_id(request_id)
        digest = _request_digest(spec, snapshot) if request_id else ""
        if snapshot is not None:
            if spec.image:
                msg = "spec.image must be empty when forking a snapshot: the snapshot is the image"
                raise InvalidSpecError(msg)
            spec = inherit(spec, spec_from_json(snapshot.labels[LABEL_SPEC]), image=snapshot.ref)
        resolved = self.resolve(spec)
        tenant = current_tenant()
        chosen_id = workspace_id
        repeat = False
        if request_id:
            # Looked up again after the wait: a create of that request may have begun meanwhile.
            key = (tenant, request_id)
            made_as = self._requests.get(key) or await self._made_as(key) or self._requests.get(key, "")
            if made_as and workspace_id and made_as != workspace_id:
                msg = (
                    f"request_id {quoted(request_id)} made workspace {made_as!r}: "
                    f"a repeat of it names that workspace_id, or none"
                )
                raise WorkspaceExistsError(msg)
            workspace_id, repeat = workspace_id or made_as, bool(made_as)
        workspace_id = workspace_id or f"ws-{secrets.token_hex(6)}"
        while (earlier := self._making.get(workspace_id)) is not None:
            if not request_id or (earlier.tenant, earlier.request_id) != (tenant, request_id):
                # Two concurrent creates of one id: the second must neither wait nor undo the first.
                msg = f"workspace {workspace_id!r} already exists"
                raise WorkspaceExistsError(msg)
            # A retry of a create still in flight (its caller's connection dropped): it waits for
            # that one, and then finds what it made, or makes it again if it failed.
            earlier.waiting += 1
            try:
                with contextlib.suppress(Exception):
                    await asyncio.shield(earlier.work)
            finally:
                earlier.waiting -= 1
            repeat = True
        # The engine's calls run in threads a cancel cannot stop: a create the caller gives up on
        # runs to its end, and what it made is removed then (nobody has its id). The work begins
        # at the next await; it is on record before: that is what makes a create exclusive.
        asked = _Asked(chosen_id, request_id, digest, repeat)
        work = asyncio.ensure_future(self._create_exclusive(resolved, workspace_id, tenant, asked, snapshot))
        making = self._making[workspace_id] = _Making(tenant, request_id, work)
        if request_id:
            self._requests[(tenant, request_id)] = workspace_id
        try:
            return (await asyncio.shield(work))[0]
        except asyncio.CancelledError:
            work.add_done_callback(functools.partial(self._forsaken, making))
            raise

    async def _made_as(self, key: tuple[str, str]) -> str:
        """The id of the workspace the create of ``key`` (tenant, request id) made, if it still exists; else ""."""
        workspace_id = self._made_for.get(key, "")
        if not workspace_id:
            return ""
        try:
            info = await self.backend.inspect_container(workspace_id)
        except WorkspaceNotFoundError:
            info = None
        if info is None or _made_by(info) != key:
            self._made_for.pop(key, None)  # removed behind the daemon's back (and its id perhaps reused)
            return ""
        return workspace_id

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` on its own, held until it ends (an unheld task may be collected midway)."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _forsaken(self, making: _Making, work: asyncio.Future[tuple[Workspace, bool]]) -> None:
        """A create whose caller went away has ended: remove what it made, unless a retry waits for it.

        A repeat that found what its request had made removes nothing: another caller may hold it.
        """
        if work.cancelled() or work.exception() is not None or making.waiting or not work.result()[1]:
            return
        workspace_id = work.result()[0].workspace_id
        log.info("workspace.create_abandoned", workspace_id=workspace_id)
        self._abandoned.add(workspace_id)
        self._in_background(self._remove_forsaken(workspace_id))

    async def _remove_forsaken(self, workspace_id: str) -> None:
        async with self._id_lock(workspace_id):
            if workspace_id not in self._abandoned:
                return  # a retry of its create took it first
            self._abandoned.discard(workspace_id)
            with contextlib.suppress(WorkspaceNotFoundError):
                await self._remove(workspace_id, "its create was cancelled")

    async def _repeated(self, workspace_id: str, tenant: str, asked: _Asked) -> Workspace | None:
        """The workspace ``workspace_id`` if the tenant's create of the same request made it; None if there is none.

        Called under the id's lock (a forsaken create's removal takes it too).

        Raises:
            WorkspaceExistsError: a workspace of that id exists that this request did not make,
                or that it made from another spec.
        """
        try:
            info = await self.backend.inspect_container(workspace_id)
        except WorkspaceNotFoundError:
            return None
        if _made_by(info) != (tenant, asked.request_id):
            msg = f"workspace {workspace_id!r} already exists"
            raise WorkspaceExistsError(msg)
        if info.labels.get(LABEL_CREATE_DIGEST, "") != asked.digest:
            msg = (
                f"request_id {quoted(asked.request_id)} made workspace {workspace_id!r} from another spec or "
                "snapshot: a request id names one create"
            )
            raise WorkspaceExistsError(msg)
        self._abandoned.discard(workspace_id)
        self.touch(workspace_id)
        log.info("workspace.create_repeated", workspace_id=workspace_id, create_request=asked.request_id)
        return self._workspace(info)

    async def _create_exclusive(
        self, resolved: WorkspaceSpec, workspace_id: str, tenant: str, asked: _Asked, snapshot: ImageInfo | None
    ) -> tuple[Workspace, bool]:
        """The rest of :meth:`create`, once the id is this create's: the workspace, and whether it made it."""
        memory = resolved.limits.memory_bytes
        request_id = asked.request_id
        try:
            if asked.repeat:
                async with self._id_lock(workspace_id):
                    found = await self._repeated(workspace_id, tenant, asked)
                if found is not None:
                    return found, False
            async with self._quota_lock:  # concurrent creates must not all pass one quota
                await self._check_quota(tenant, memory)
                self._reserved.setdefault(tenant, []).append(memory)
            try:
                # In use from the start: the reaper must not count idleness from before it existed.
                async with self._id_lock(workspace_id), self.in_use(workspace_id):
                    made = None
                    if snapshot is None:
                        made = await self._claim(resolved, workspace_id, tenant, asked)
                    if made is None:
                        made = await self._create(resolved, workspace_id, tenant, snapshot=snapshot, asked=asked)
                    if request_id:
                        self._made_for[(tenant, request_id)] = workspace_id
                    return made, True
            except BaseException:
                self._activity.pop(workspace_id, None)  # nothing was created: nothing to remember
                raise
            finally:
                self._reserved[tenant].remove(memory)
                if not self._reserved[tenant]:
                    del self._reserved[tenant]
        finally:
            del self._making[workspace_id]
            if self._requests.get((tenant, request_id)) == workspace_id:
                del self._requests[(tenant, request_id)]

    def id_lock(self, workspace_id: str) -> asyncio.Lock:
        """The lock that serialises creating, deleting, pausing, resuming and snapshotting one id."""
        return self._id_lock(workspace_id)

    def _id_lock(self, workspace_id: str) -> asyncio.Lock:
        """Serialises creating and deleting one id (concurrent deletes: one removes, the rest find nothing)."""
        lock = self._id_locks.get(workspace_id)
        if lock is None:
            lock = self._id_locks[workspace_id] = asyncio.Lock()
        return lock

    async def _create(
        self,
        resolved: WorkspaceSpec,
        workspace_id: str,
        tenant: str,
        *,
        pool_class: str = "",
        snapshot: ImageInfo | None = None,
        asked: _Asked | None = None,
    ) -> Workspace:
        """Start a container for ``resolved``: a member of ``pool_class`` (no tenant), or a fork of ``snapshot``.

        The container is committed (``Backend.commit_container``) once its agent answered.
        """
        await self._forget_context(workspace_id)  # an earlier workspace of that id, removed behind our back
        if self.agent is None:
            async with self._agent_lock:
                if self.agent is None:
                    self.agent = await ensure_agent(
                        self.backend,
                        route=self.settings.image_route,
                        progress=lambda line: log.info("agent.progress", line=line),
                    )
        agent = self.agent
        image = await self.backend.image_info(resolved.image)
        if image is None and snapshot is not None:
            msg = f"snapshot {snapshot.labels.get(LABEL_SNAPSHOT, '')!r} not found"  # deleted meanwhile
            raise NotFoundError(msg)
        if image is not None and _is_snapshot(image) and (snapshot is None or image.image_id != snapshot.image_id):
            # A snapshot is its tenant's: forked by name (from_snapshot), never named as an image,
            # by its tag or by a prefix of its id. Said as of any image that is not there.
            msg = f"image {quoted(resolved.image)} is not present on the Docker engine"
            raise ImageNotFoundError(msg)
        if image is None:
            if resolved.image == self.settings.default_image:
                msg = (
                    f"the default workspace image {resolved.image!r} is not built yet; "
                    "run `sandboxd images build` (or start the daemon without --no-build)"
                )
                raise ImageNotFoundError(msg)
            image = await self.backend.pull_image(resolved.image)
        if image.os != "linux":
            msg = f"image {quoted(resolved.image)} is a {image.os} image; this daemon runs Linux workspaces"
            raise InvalidSpecError(msg)
        user = resolved.security.user or (
            image.user if image.user.split(":")[0] not in {"", "root", "0"} else FALLBACK_USER
        )
        resolved = dataclasses.replace(resolved, security=dataclasses.replace(resolved.security, user=user))
        network = str(resolved.network)
        if resolved.network is NetworkPolicy.ALLOWLIST:
            network = await self.egress.open(workspace_id, tenant, resolved.allowed_hosts)
        try:
            info = await self.backend.create_container(
                container_spec(
                    resolved,
                    workspace_id,
                    tenant=tenant,
                    network=network,
                    image=image,
                    agent=agent,
                    pool_class=pool_class,
                    snapshot=snapshot,
                    request=asked.request if asked is not None else None,
                )
            )
        except BaseException:
            if resolved.network is NetworkPolicy.ALLOWLIST:
                await asyncio.shield(self.egress.close(workspace_id))
            raise
        self._networks[workspace_id] = (resolved.network or NetworkPolicy.NONE, resolved.allowed_hosts)
        workspace = self._workspace(info)
        try:
            # The agent answers before the workspace is handed out: a create that returns works.
            await self._context_for(info).link.connect()
        except SandboxdError as exc:
            await self._forget_context(workspace_id)
            await self.backend.remove_container(workspace_id)
            await self.egress.close(workspace_id)
            msg = f"the workspace's agent did not start in image {quoted(resolved.image)}: {exc.message}"
            raise FailedPreconditionError(msg) from None
        except BaseException:
            # Cancelled (the caller went away): nobody will ever have this workspace's id.
            await asyncio.shield(self._discard(workspace_id))
            raise
        try:
            await self.backend.commit_container(workspace_id)
        except BaseException:
            await asyncio.shield(self._discard(workspace_id))
            raise
        if pool_class:
            return workspace
        self.touch(workspace_id)
        log.info("workspace.created", workspace_id=workspace_id, image=resolved.image, user=user, tenant=tenant)
        return workspace

    async def owned_info(self, workspace_id: str) -> ContainerInfo:
        """The caller's workspace ``workspace_id`` as the engine reports it.

        Raises:
            WorkspaceNotFoundError: none of the caller's has that id.
        """
        check_workspace_id(workspace_id)
        info = self._owned(await self.backend.inspect_container(workspace_id))
        self.touch(workspace_id)
        return info

    # -- the warm pool -------------------------------------------------------------------------------
    async def _claim(self, resolved: WorkspaceSpec, workspace_id: str, tenant: str, asked: _Asked) -> Workspace | None:
        """Make a ready pool member of ``resolved``'s class this workspace; None when there is none.

        What is the caller's alone is applied now: the id and tenant (recorded by the engine,
        ``Backend.claim_container``), env, labels, secrets and idle TTL (in the recorded spec,
        which every command reads), and the working directory (created as Docker creates a
        container's, root's and 0755, when the class's is another). A member that cannot be
        claimed is removed and the create goes on as a normal one.

        Raises:
            WorkspaceExistsError: the caller chose the id (``asked.chosen_id``) and a workspace of it exists.
        """
        pool_class = self.pool.match(resolved) if self.pool is not None else None
        if pool_class is None or self.pool is None:
            return None
        if asked.chosen_id:
            try:
                await self.backend.inspect_container(workspace_id)
            except WorkspaceNotFoundError:
                pass
            else:
                msg = f"workspace {workspace_id!r} already exists"
                raise WorkspaceExistsError(msg)
        member = self.pool.take(pool_class)
        while member is not None and not self.member_answers(member.workspace_id):
            # Its agent's link dropped since the last check (removed or killed behind our back).
            log.info("pool.member_dropped", member=member.workspace_id, reason="its agent does not answer")
            self._in_background(self.remove_member(member.workspace_id))
            member = self.pool.take(pool_class)
        if member is None:
            return None
        began = time.monotonic()
        member_spec = spec_from_json(member.labels[LABEL_SPEC])
        final = dataclasses.replace(
            resolved, security=dataclasses.replace(resolved.security, user=member_spec.security.user)
        )
        try:
            if final.working_dir != member_spec.working_dir:
                code, said = await self.backend.exec_run(
                    member.workspace_id,
                    ["mkdir", "-p", "--", final.working_dir],
                    user="0:0",
                    container_id=member.container_id,
                )
                if code != 0:
                    msg = f"cannot make working directory {quoted(final.working_dir)}: {said[:200]!r}"
                    raise FailedPreconditionError(msg)  # noqa: TRY301 - one clean-up for every failure
            labels = {
                **final.labels,
                LABEL_SPEC: spec_to_json(final),
                LABEL_TENANT: tenant,
                LABEL_AGENT: member.labels[LABEL_AGENT],
                **_request_labels(asked.request),
            }
            info = await self.backend.claim_container(member, workspace_id, labels)
        except SandboxdError as exc:
            log.warning("pool.claim_failed", member=member.workspace_id, workspace_id=workspace_id, error=exc.message)
            await self.remove_member(member.workspace_id)
            return None
        except BaseException:
            # Cancelled (the caller went away): the member, claimed or half claimed, is nobody's now.
            await asyncio.shield(self._discard(workspace_id, member.workspace_id))
            raise
        old = self._contexts.pop(member.workspace_id, None)
        link = old.link if old is not None and old.container_id == info.container_id else None
        if link is not None:
            link.workspace_id = workspace_id
        self._context_for(info, link=link)
        self.touch(workspace_id)
        log.info(
            "workspace.created",
            workspace_id=workspace_id,
            image=final.image,
            user=final.security.user,
            tenant=tenant,
            pool_class=pool_class.name,
            claim_s=round(time.monotonic() - began, 4),
        )
        return self._workspace(info)

    async def _discard(self, workspace_id: str, member_id: str = "") -> None:
        """Remove a workspace whose create was cut short (and the member it was claiming)."""
        with contextlib.suppress(SandboxdError):
            await self._forget_context(workspace_id)
            await self.backend.remove_container(workspace_id)  # its claim record too, if written
        if member_id:
            await self.remove_member(member_id)

    async def create_member(self, pool_class: PoolClass, member_id: str) -> ContainerInfo:
        """Start a pool member of ``pool_class``: a workspace of no tenant whose agent has answered.

        Raises:
            SandboxdError: as :meth:`create` does.
        """
        await self._create(pool_class.spec, member_id, "", pool_class=pool_class.name)
        info = await self.backend.inspect_container(member_id)
        await self._warm_up(info)
        return info

    async def _warm_up(self, info: ContainerInfo) -> None:
        """Run one ``true`` in a new member, and forget it (the agent keeps no session of it).

        Its claimer's first command then costs what a second one does: the agent's first session
        and the login shell's first run in the container cost about 10 ms more here.
        """
        context = self._context_for(info)
        try:
            session, _started = await self.processes.start(context, ExecSpec(command="true", timeout_s=30.0))
        except SandboxdError as exc:
            log.info("pool.warm_up_failed", member=info.workspace_id, error=exc.message)
            return
        try:
            async for _event in session.events(yield_after_s=30.0):
                pass
        finally:
            self.processes.drop(session)
            await session.discard()

    def pool_classes(self) -> builtins.list[PoolClass]:
        """The pool's classes from the settings: ``default`` (``pool_size`` of the default spec), then the pool file's.

        Raises:
            InvalidSpecError: the pool file is bad, a class's spec is out of range, or two classes
                share a name or a spec.
        """
        wanted = []
        if self.settings.pool_size > 0:
            wanted.append(("default", self.settings.pool_size, WorkspaceSpec(idle_ttl_s=0.0)))
        if self.settings.pool_file:
            wanted += read_pool_file(self.settings.pool_file)
        classes: builtins.list[PoolClass] = []
        for name, size, spec in wanted:
            try:
                resolved = self.resolve(spec)
            except InvalidSpecError as exc:
                msg = f"pool class {name!r}: {exc.message}"
                raise InvalidSpecError(msg) from None
            pool_class = PoolClass(name=name, size=size, spec=resolved)
            for other in classes:
                if other.name == name or other.key == pool_class.key:
                    msg = f"pool class {name!r} has the {'name' if other.name == name else 'spec'} of {other.name!r}"
                    raise InvalidSpecError(msg)
            classes.append(pool_class)
        return classes

    async def member_is_fresh(self, info: ContainerInfo, pool_class: PoolClass) -> bool:
        """Whether a member an earlier run left can be handed out: same spec, current agent and image, untouched.

        Raises:
            SandboxdError: its agent cannot be reached.
        """
        stored = spec_from_json(info.labels[LABEL_SPEC])
        if not pool_class.spec.security.user:  # the member's was read from the image
            stored = dataclasses.replace(stored, security=dataclasses.replace(stored.security, user=""))
        if not info.running or stored != pool_class.spec:
            return False
        if self.agent is None or info.labels.get(LABEL_AGENT) != self.agent.tag:
            return False
        image = await self.backend.image_info(pool_class.spec.image)
        if image is None or image.image_id != info.image_id:
            return False
        welcome = await self._context_for(info).link.connect()
        return not welcome.sessions

    def member_answers(self, member_id: str) -> bool:
        """Whether a ready member's agent link is up."""
        context = self._contexts.get(member_id)
        return context is not None and context.link.connected

    async def remove_member(self, member_id: str) -> None:
        """Remove a pool member (nothing if it is gone)."""
        await self._forget_context(member_id)
        try:
            await self.backend.remove_container(member_id)
        except SandboxdError as exc:
            log.warning("pool.remove_failed", member=member_id, error=exc.message)

    async def _check_quota(self, tenant: str, memory_bytes: int) -> None:
        """RESOURCE_EXHAUSTED when the tenant is at its workspace count or memory total."""
        s = self.settings
        if not (s.tenant_max_workspaces or s.tenant_max_memory_bytes):
            return
        mine = [self._workspace(i) for i in await self.backend.list_containers({LABEL_TENANT: tenant})]
        creating = self._reserved.get(tenant, [])
        if s.tenant_max_workspaces and len(mine) + len(creating) >= s.tenant_max_workspaces:
            msg = f"tenant {tenant!r} already has {len(mine) + len(creating)} workspaces, its limit"
            raise QuotaExceededError(msg)
        used = sum(w.spec.limits.memory_bytes for w in mine) + sum(creating)
        if s.tenant_max_memory_bytes and used + memory_bytes > s.tenant_max_memory_bytes:
            msg = (
                f"tenant {tenant!r} would use {used + memory_bytes} bytes of memory limits, "
                f"over its {s.tenant_max_memory_bytes}-byte quota"
            )
            raise QuotaExceededError(msg)

    async def get(self, workspace_id: str) -> Workspace:
        """Return a workspace; WorkspaceNotFoundError when there is none."""
        check_workspace_id(workspace_id)
        workspace = self._workspace(self._owned(await self.backend.inspect_container(workspace_id)))
        self.touch(workspace_id)
        return workspace

    async def list(
        self, label_selector: Mapping[str, str], *, page_size: int = 0, page_token: str = ""
    ) -> tuple[builtins.list[Workspace], str]:
        """One page of the workspaces carrying every label in ``label_selector``, oldest first.

        Args:
            label_selector: labels every listed workspace carries.
            page_size: most workspaces on the page; 0 means ``DEFAULT_PAGE_SIZE``, at most
                ``MAX_LIST_PAGE_SIZE``. A page also ends before its specs pass ``PAGE_SPEC_BYTES``
                (it always holds at least one workspace), so it fits one message.
            page_token: the token of the previous page; empty starts with the oldest.

        Returns:
            The page and the token of the next one (empty when this is the last).

        Raises:
            InvalidSpecError: a bad selector, page size or token.
        """
        check_labels(label_selector, "label_selector")
        if not 0 <= page_size <= MAX_LIST_PAGE_SIZE:
            msg = f"page_size must be 0 (the default, {DEFAULT_PAGE_SIZE}) to {MAX_LIST_PAGE_SIZE}, got {page_size}"
            raise InvalidSpecError(msg)
        after = _page_position(page_token)
        selector = {**label_selector, LABEL_TENANT: current_tenant()}
        infos = sorted(await self.backend.list_containers(selector), key=_listing_key)
        remaining = [info for info in infos if after is None or _listing_key(info) > after]
        page: builtins.list[Workspace] = []
        spec_bytes = 0
        for info in remaining[: page_size or DEFAULT_PAGE_SIZE]:
            size = len(info.labels.get(LABEL_SPEC, ""))
            if page and spec_bytes + size > PAGE_SPEC_BYTES:
                break
            page.append(self._workspace(info))
            spec_bytes += size
        more = len(page) < len(remaining)
        return page, _page_token(page[-1]) if more else ""

    async def delete(self, workspace_id: str) -> None:
        """Remove a workspace's container and volume.

        A volume whose container was removed behind sandboxd's back is removed too.

        Raises:
            WorkspaceNotFoundError: neither a container nor a volume of that id exists.
        """
        check_workspace_id(workspace_id)
        async with self._id_lock(workspace_id):
            try:
                info: ContainerInfo | None = await self.backend.inspect_container(workspace_id)
            except WorkspaceNotFoundError:
                info = None
            if info is not None:
                self._owned(info)  # another tenant's container: NOT_FOUND, whatever its volume says
            else:
                # The container is gone behind sandboxd's back; its volume tells whose it was.
                labels = await self.backend.volume_labels(workspace_id)
                if labels is None or labels.get(LABEL_TENANT, DEFAULT_TENANT) != current_tenant():
                    msg = f"workspace {workspace_id!r} not found"
                    raise WorkspaceNotFoundError(msg)
            await self._remove(workspace_id, "its workspace was deleted")
        if info is not None and info.labels.get(LABEL_SNAPSHOT):
            await self.backend.remove_unused_images()  # its snapshot's image, if deleted, was kept for it
        log.info("workspace.deleted", workspace_id=workspace_id)

    async def pause(self, workspace_id: str) -> Workspace:
        """Freeze every process of a running workspace; its commands' timeouts stand still too.

        The agent is told first (``AgentLink.freeze``), so that the time frozen counts toward
        no timeout; an agent that cannot be reached does not stop the pause.

        Raises:
            WorkspaceNotFoundError: no such workspace.
            FailedPreconditionError: it is paused already, or does not run.
        """
        check_workspace_id(workspace_id)
        async with self._id_lock(workspace_id):
            info = self._owned(await self.backend.inspect_container(workspace_id))
            await self._pause(info)
        log.info("workspace.paused", workspace_id=workspace_id)
        return dataclasses.replace(self._workspace(info), state=WorkspaceState.PAUSED)

    async def _pause(self, info: ContainerInfo) -> None:
        """Pause the workspace of ``info`` (its id lock is held)."""
        workspace_id = info.workspace_id
        if info.paused:
            msg = f"workspace {workspace_id!r} is already paused"
            raise FailedPreconditionError(msg)
        if not info.running:
            msg = f"workspace {workspace_id!r} is not running, so it cannot be paused"
            raise WorkspaceNotRunningError(msg)
        context = self._context_for(info)
        # Known as paused from before the freeze: a call that comes meanwhile waits for the
        # pause, then resumes it; a new connection's frozen agent is not thawed behind it.
        self._note_paused(info)
        try:
            try:
                await context.link.freeze(True)
            except SandboxdError as exc:
                log.warning("workspace.freeze_failed", workspace_id=workspace_id, error=exc.message)
            await self.backend.pause_container(workspace_id)
        except BaseException:
            self._paused.pop(workspace_id, None)
            with contextlib.suppress(SandboxdError):
                await asyncio.shield(context.link.freeze(False))
            raise
        self.touch(workspace_id)

    async def resume(self, workspace_id: str) -> Workspace:
        """Thaw a paused workspace: its commands go on where they were.

        Raises:
            WorkspaceNotFoundError: no such workspace.
            FailedPreconditionError: it is not paused.
        """
        check_workspace_id(workspace_id)
        async with self._id_lock(workspace_id):
            info = self._owned(await self.backend.inspect_container(workspace_id))
            if not info.paused:
                self._paused.pop(workspace_id, None)
                msg = f"workspace {workspace_id!r} is not paused"
                raise FailedPreconditionError(msg)
            await self._thaw(info)
        log.info("workspace.resumed", workspace_id=workspace_id)
        return dataclasses.replace(self._workspace(info), state=WorkspaceState.RUNNING)

    def _note_paused(self, info: ContainerInfo) -> None:
        """Remember ``info``'s workspace as paused, with whether a call may resume it (its spec says)."""
        self._paused[info.workspace_id] = spec_from_json(info.labels[LABEL_SPEC]).auto_resume is not False

    async def _thaw(self, info: ContainerInfo) -> None:
        """Resume the container, then restart its agent's timers."""
        await self.backend.resume_container(info.workspace_id)
        self._paused.pop(info.workspace_id, None)
        self.touch(info.workspace_id)
        try:
            await self._context_for(info).link.freeze(False)
        except SandboxdError as exc:
            # Its next connection says it is frozen, and is thawed then (``_adopt_sessions``).
            log.warning("workspace.thaw_failed", workspace_id=info.workspace_id, error=exc.message)

    async def awake(self, workspace_id: str) -> None:
        """Before a call that needs the workspace's processes: resume it if it is paused.

        Raises:
            FailedPreconditionError: it is paused and its ``auto_resume`` is off.
        """
        if workspace_id not in self._paused:
            return
        if not self._paused[workspace_id]:
            msg = f"workspace {workspace_id!r} is paused (ResumeWorkspace resumes it; its auto_resume is off)"
            raise FailedPreconditionError(msg)
        async with self._id_lock(workspace_id):
            if workspace_id not in self._paused:
                return  # resumed by a call that went first
            info = await self.backend.inspect_container(workspace_id)
            if info.paused:
                await self._thaw(info)
                log.info("workspace.resumed", workspace_id=workspace_id, reason="auto_resume")
            else:
                self._paused.pop(workspace_id, None)

    async def _forget_context(self, workspace_id: str) -> None:
        context = self._contexts.pop(workspace_id, None)
        if context is not None:
            await context.link.close()

    async def close(self) -> None:
        """Close every agent link (the daemon stops; the agents keep their sessions)."""
        for workspace_id in list(self._contexts):
            await self._forget_context(workspace_id)

    async def _remove(self, workspace_id: str, why: str) -> None:
        self._activity.pop(workspace_id, None)
        self._paused.pop(workspace_id, None)
        for key in [key for key, made in self._made_for.items() if made == workspace_id]:
            del self._made_for[key]
        await self.processes.forget_workspace(workspace_id, why)
        await self._forget_context(workspace_id)
        removed = await self.backend.remove_container(workspace_id)
        if self._networks.pop(workspace_id, (None,))[0] is NetworkPolicy.ALLOWLIST or not removed:
            await self.egress.close(workspace_id)
        if not removed:
            msg = f"workspace {workspace_id!r} not found"
            raise WorkspaceNotFoundError(msg)

    async def reap_idle(self, audit: AuditLog | None = None) -> builtins.list[str]:
        """Remove or pause (its ``idle_action``) every workspace idle past its TTL.

        Idle: no call in flight, none for its TTL, no running command.

        Returns:
            The ids removed or paused.
        """
        now = time.monotonic()
        removed = []
        # Every second: one listing, no per-container inspect.
        for workspace_id, labels in (await self.backend.container_labels()).items():
            if not labels.get(LABEL_SPEC) or self._busy.get(workspace_id):
                continue
            spec = spec_from_json(labels[LABEL_SPEC])
            ttl = spec.idle_ttl_s or 0
            sessions = self.processes.list(workspace_id)
            if ttl <= 0 or any(s.running for s in sessions):
                continue
            last = max([self._activity.get(workspace_id, self._started), *(s.last_used for s in sessions)])
            if now - last < ttl:
                continue
            if spec.idle_action is IdleAction.PAUSE:
                if workspace_id in self._paused or not await self._pause_idle(workspace_id, ttl, audit):
                    continue
                removed.append(workspace_id)
                continue
            try:
                async with self._id_lock(workspace_id):
                    await self._remove(workspace_id, f"its workspace was idle for {ttl:g} s and was removed")
            except WorkspaceNotFoundError:
                continue  # deleted meanwhile: not reaped
            removed.append(workspace_id)
            tenant = labels.get(LABEL_TENANT, DEFAULT_TENANT)
            log.info("workspace.reaped", workspace_id=workspace_id, idle_ttl_s=ttl, tenant=tenant)
            if audit is not None:
                audit.event("workspace.reaped", workspace_id=workspace_id, tenant=tenant, reason=f"idle for {ttl:g} s")
        return removed

    async def _pause_idle(self, workspace_id: str, ttl: float, audit: AuditLog | None) -> bool:
        """Pause a workspace idle for ``ttl``; whether it was paused now."""
        try:
            async with self._id_lock(workspace_id):
                info = await self.backend.inspect_container(workspace_id)
                if not info.running:
                    if info.paused:
                        self._note_paused(info)
                    return False
                await self._pause(info)
        except (WorkspaceNotFoundError, FailedPreconditionError):
            return False  # deleted, paused or stopped meanwhile
        tenant = info.labels.get(LABEL_TENANT, DEFAULT_TENANT)
        log.info("workspace.paused", workspace_id=workspace_id, idle_ttl_s=ttl, tenant=tenant, reason="idle")
        if audit is not None:
            audit.event("workspace.paused", workspace_id=workspace_id, tenant=tenant, reason=f"idle for {ttl:g} s")
        return True

    @contextlib.asynccontextmanager
    async def in_use(self, workspace_id: str) -> AsyncIterator[None]:
        """Mark a call on the workspace as in flight: the idle reaper leaves it alone until it ends."""
        self._busy[workspace_id] = self._busy.get(workspace_id, 0) + 1
        try:
            yield
        finally:
            self._busy[workspace_id] -= 1
            if not self._busy[workspace_id]:
                del self._busy[workspace_id]
            self.touch(workspace_id)

    async def adopt(self, audit: AuditLog | None = None) -> builtins.list[str]:
        """Take over the workspaces of an earlier run, and the commands their agents kept; return their ids.

        Nothing is kept outside Docker and the agents: adoption is reading the labels and
        connecting to each running workspace's agent, whose welcome lists the sessions it
        holds (:meth:`ProcessTable.adopt`); each gets a ``process.adopted`` line in ``audit``.
        A workspace created before the agent existed is listed but refused for commands
        (``exec_context`` says to recreate it).
        """
        self.audit = audit
        self.egress.audit = audit
        # Blank labels are a snapshot's inheritance (an image's labels stay on its containers).
        listed = [info for info in await self.backend.list_containers({}) if info.labels.get(LABEL_SPEC)]
        members = [info for info in listed if info.labels.get(LABEL_POOL)]
        infos = [info for info in listed if not info.labels.get(LABEL_POOL)]
        for info in infos:
            self._networks[info.workspace_id] = await self._network_of(info)
            if (made_by := _made_by(info)) is not None:
                self._made_for[made_by] = info.workspace_id
        await self.egress.adopt({info.workspace_id: info.labels.get(LABEL_TENANT, DEFAULT_TENANT) for info in infos})
        gate = asyncio.Semaphore(8)

        async def attach(info: ContainerInfo) -> None:
            if info.paused:
                self._note_paused(info)
            if not info.running or LABEL_AGENT not in info.labels:
                return
            async with gate:
                try:
                    await self._context_for(info).link.connect()
                except SandboxdError as exc:
                    log.warning("workspace.adopt_failed", workspace_id=info.workspace_id, error=exc.message)

        await asyncio.gather(*(attach(info) for info in infos))
        if self.pool is not None:
            await self.pool.adopt(members)
        else:
            for member in members:
                await self.remove_member(member.workspace_id)
        return [info.workspace_id for info in infos]

    async def _network_of(self, info: ContainerInfo) -> tuple[NetworkPolicy, tuple[EgressRule, ...]]:
        """A workspace's policy as its container's networks (and its proxy's rules) say.

        Only a workspace on a network of its own (an allowlist's) costs a look at its proxy: at
        start that is one inspect per allowlist workspace, not one per workspace.
        """
        own = set(info.networks) - {"none", "bridge"}
        if own and (rules := await self.egress.rules(info.workspace_id)) is not None:
            return NetworkPolicy.ALLOWLIST, rules
        return (NetworkPolicy.BRIDGE if "bridge" in info.networks else NetworkPolicy.NONE), ()

    async def update_network(
        self, workspace_id: str, network: NetworkPolicy | None, rules: Sequence[EgressRule]
    ) -> Workspace:
        """Give a running workspace another network policy, or an ALLOWLIST one other rules.

        Its files and processes stay; connections open through the old network (or proxy) may
        end. A paused workspace is resumed first (unless ``auto_resume`` is off).

        Raises:
            WorkspaceNotFoundError: no such workspace of the caller's.
            WorkspaceNotRunningError: its container is not running.
            InvalidSpecError: the policy is not available under its runtime, or a rule is invalid.
            SandboxdError: the engine refused the network or the proxy.
        """
        check_workspace_id(workspace_id)
        network = network or NetworkPolicy.NONE
        async with self._id_lock(workspace_id):
            info = self._owned(await self.backend.inspect_container(workspace_id))
            self._check_runtime_network(Runtime.RUNSC if info.runtime == "runsc" else Runtime.RUNC, network)
            rules = check_rules(network, rules)
            if not info.running and not info.paused:
                msg = f"workspace {workspace_id!r} is not running"
                raise WorkspaceNotRunningError(msg)
            await self.awake(workspace_id)
            old = self._networks.get(workspace_id) or await self._network_of(info)
            tenant = info.labels.get(LABEL_TENANT, DEFAULT_TENANT)
            if network is NetworkPolicy.ALLOWLIST and old[0] is NetworkPolicy.ALLOWLIST:
                await self.egress.replace(workspace_id, tenant, rules)
            elif network is NetworkPolicy.ALLOWLIST:
                await self.backend.set_network(workspace_id, await self.egress.open(workspace_id, tenant, rules))
            else:
                await self.backend.set_network(workspace_id, str(network))
                if old[0] is NetworkPolicy.ALLOWLIST:
                    await self.egress.close(workspace_id)
            self._networks[workspace_id] = (network, rules)
            if (context := self._contexts.get(workspace_id)) is not None:
                context.env = self._env(workspace_id, spec_from_json(info.labels[LABEL_SPEC]))
            log.info("workspace.network_changed", workspace_id=workspace_id, network=str(network), rules=len(rules))
            self.touch(workspace_id)
            return self._workspace(await self.backend.inspect_container(workspace_id))

    def _adopt_sessions(self, context: ExecContext, welcome: Welcome) -> None:
        """Every new connection: take over the sessions the agent holds that this daemon does not follow.

        An agent still frozen in a workspace that is not paused (it was resumed while no daemon
        was connected, or a thaw was lost) has its timers restarted.
        """
        if welcome.frozen and context.workspace_id not in self._paused:
            self._in_background(self._restart_timers(context))
        for process_id in self.processes.adopt(context, welcome):
            if self.audit is not None:
                self.audit.event(
                    "process.adopted",
                    workspace_id=context.workspace_id,
                    process_id=process_id,
                    tenant=context.tenant,
                    reason="the workspace's agent kept it while no daemon was connected",
                )

    async def _restart_timers(self, context: ExecContext) -> None:
        try:
            await context.link.freeze(False)
        except SandboxdError as exc:
            log.warning("workspace.thaw_failed", workspace_id=context.workspace_id, error=exc.message)
        else:
            log.info("workspace.timers_restarted", workspace_id=context.workspace_id)

    async def exec_context(self, workspace_id: str) -> ExecContext:
        """Return what a process needs to run in the workspace.

        A paused workspace is resumed first (:meth:`awake`).

        Raises:
            WorkspaceNotFoundError: no such workspace.
            WorkspaceNotRunningError: its container is not running.
            FailedPreconditionError: the workspace predates the agent (recreate it), or it is
                paused with ``auto_resume`` off.
        """
        context = self._contexts.get(workspace_id)
        if context is None:
            check_workspace_id(workspace_id)
            info = self._owned(await self.backend.inspect_container(workspace_id))
            if info.paused:
                self._note_paused(info)
            elif not info.running:
                msg = f"workspace {workspace_id!r} is not running"
                raise WorkspaceNotRunningError(msg)
            context = self._context_for(info)
        if context.tenant != current_tenant():
            msg = f"workspace {workspace_id!r} not found"
            raise WorkspaceNotFoundError(msg)
        await self.awake(workspace_id)
        self.touch(workspace_id)
        return context

    def _context_for(self, info: ContainerInfo, *, link: AgentLink | None = None) -> ExecContext:
        """The workspace's context and agent link, made once per container (``link``: an open one to keep).

        Raises:
            FailedPreconditionError: the workspace predates the agent.
        """
        context = self._contexts.get(info.workspace_id)
        if context is not None and context.container_id == info.container_id:
            return context
        if LABEL_AGENT not in info.labels:
            msg = (
                f"workspace {info.workspace_id!r} was created by an older sandboxd, without the in-container "
                "agent; its files are in its volume: copy out what you need, delete it and create it again"
            )
            raise FailedPreconditionError(msg)
        spec = spec_from_json(info.labels[LABEL_SPEC])
        socket_dir = info.mounts.get(AGENT_SOCKET_DIR, "") if self.settings.agent_transport == "auto" else ""
        link = link or AgentLink(
            self.backend,
            info.workspace_id,
            info.container_id,
            socket_path=posixpath.join(socket_dir, AGENT_SOCKET_NAME) if socket_dir else "",
            runtime=info.runtime,
            host_sockets=self._host_sockets,
        )
        context = ExecContext(
            workspace_id=info.workspace_id,
            user=spec.security.user or FALLBACK_USER,
            working_dir=spec.working_dir,
            memory_limit_bytes=spec.limits.memory_bytes,
            link=link,
            os=info.os,
            env=self._env(info.workspace_id, spec),
            tenant=info.labels.get(LABEL_TENANT, DEFAULT_TENANT),
            secrets=self.secrets,
            container_id=info.container_id,
            capabilities=spec.security.added_capabilities,
        )
        link.on_welcome = functools.partial(self._adopt_sessions, context)
        self._contexts[info.workspace_id] = context
        return context

    def _env(self, workspace_id: str, spec: WorkspaceSpec) -> dict[str, str]:
        """The workspace's env for its commands: an ALLOWLIST workspace's also points at its proxy."""
        if self._networks.get(workspace_id, (spec.network,))[0] is NetworkPolicy.ALLOWLIST:
            return {**proxy_env(), **spec.env}
        return dict(spec.env)

    def _workspace(self, info: ContainerInfo) -> Workspace:
        spec = spec_from_json(info.labels[LABEL_SPEC])
        if (now := self._networks.get(info.workspace_id)) is not None:
            spec = dataclasses.replace(spec, network=now[0], allowed_hosts=now[1])
        state = WorkspaceState.RUNNING if info.running else WorkspaceState.STOPPED
        return Workspace(
            workspace_id=info.workspace_id,
            spec=spec,
            from_snapshot=info.labels.get(LABEL_SNAPSHOT, ""),
            state=WorkspaceState.PAUSED if info.paused else state,
            create_time=info.create_time,
            container_id=info.container_id,
            volume_name=info.volume_name,
        )
