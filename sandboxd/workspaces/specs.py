"""Workspace specs: the checks, the defaults, the labels a spec is kept in, and the container it asks for.

Everything here is pure: a spec is checked and resolved against the settings, written to and
read from the ``sandboxd.spec`` label, and turned into the :class:`ContainerSpec` a backend runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sandboxd_protocol.limits import (
    MAX_CAPABILITIES,
    MAX_IMAGE_REFERENCE_BYTES,
    MAX_LABEL_VALUE_BYTES,
    MAX_LABELS,
    MAX_LABELS_BYTES,
    MAX_PATH_BYTES,
    MAX_WORKSPACE_ENV_BYTES,
    utf8_size,
)

from ..agentbuild import AGENT_MOUNT, AGENT_PATH, AgentBuild
from ..backend.base import LABEL_POOL, LABEL_SNAPSHOT_PART, ContainerInfo, ContainerSpec, ImageInfo
from ..egress import check_rules
from ..errors import FailedPreconditionError, InvalidSpecError, WorkspaceNotFoundError, quoted
from ..models import (
    EgressRule,
    IdleAction,
    NetworkPolicy,
    ResourceLimits,
    Runtime,
    SecurityOptions,
    WorkspaceSpec,
)
from ..processes import check_env
from ..secrets import SecretStore
from ..settings import Settings
from ..tenancy import DEFAULT_TENANT

__all__ = [
    "AGENT_CAPABILITIES",
    "AGENT_SOCKET_DIR",
    "AGENT_SOCKET_NAME",
    "CAPABILITIES",
    "FALLBACK_USER",
    "LABEL_AGENT",
    "LABEL_CREATE_DIGEST",
    "LABEL_CREATE_REQUEST",
    "LABEL_SNAPSHOT",
    "LABEL_SPEC",
    "LABEL_TENANT",
    "MAX_LIFETIME_S",
    "RESERVED_LABEL_PREFIX",
    "check_labels",
    "check_lifetime",
    "check_request_id",
    "check_runtime_network",
    "check_user",
    "check_workspace_id",
    "container_spec",
    "inherit",
    "is_snapshot",
    "made_by",
    "owned",
    "request_digest",
    "request_labels",
    "resolve_spec",
    "spec_from_json",
    "spec_to_json",
    "workspace_dirs",
]

RESERVED_LABEL_PREFIX = "sandboxd."
LABEL_SPEC = "sandboxd.spec"
LABEL_TENANT = "sandboxd.tenant"
LABEL_SNAPSHOT = "sandboxd.snapshot"
"""On a snapshot's image: its name; on a fork: the snapshot it was made from."""
LABEL_SNAPSHOT_OF = "sandboxd.snapshot_of"
"""On a snapshot's image: the workspace it was taken of."""
LABEL_SNAPSHOT_MEMORY = "sandboxd.snapshot_memory"
"""On a memory snapshot's image: the bytes of its checkpoint (whose key is the image's tag)."""
LABEL_SNAPSHOT_CONTAINER = "sandboxd.snapshot_container"
"""On a memory snapshot's image: the container it was taken of, whose id its sessions carry."""
LABEL_TEMPLATE_DIGEST = "sandboxd.template_digest"
"""On a template's image (a snapshot built from a Dockerfile): the digest of what it was built from."""
LABEL_RESTORED_FROM = "sandboxd.restored_from"
"""On a fork restored with its snapshot's memory: ``WORKSPACE_ID CONTAINER_ID`` of the source, whose
sessions it adopts under ids of its own."""
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
"""Linux capability names a caller may add back (all are dropped by default)."""

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


def request_digest(spec: WorkspaceSpec, snapshot: ImageInfo | None) -> str:
    """What a create asked for, as the caller sent it (before defaults, which may change with settings)."""
    asked = f"{spec_to_json(spec)}\0{snapshot.labels.get(LABEL_SNAPSHOT, '') if snapshot is not None else ''}"
    return hashlib.sha256(asked.encode()).hexdigest()[:32]


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
    data["security"]["root_capabilities"] = list(spec.security.root_capabilities)
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
            root_capabilities=tuple(data["security"].get("root_capabilities", ())),
        ),
        idle_action=IdleAction(data["idle_action"]) if data.get("idle_action") else None,
        auto_resume=data.get("auto_resume"),
        lifetime_s=data.get("lifetime_s"),
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
            root_capabilities=mine.root_capabilities or source.security.root_capabilities,
        ),
        idle_action=request.idle_action or source.idle_action,
        auto_resume=request.auto_resume if request.auto_resume is not None else source.auto_resume,
        lifetime_s=request.lifetime_s if request.lifetime_s is not None else source.lifetime_s,
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


def restored_from(snapshot: ImageInfo | None) -> str:
    """``WORKSPACE_ID CONTAINER_ID`` of a memory snapshot's source; empty for a files-only one (or none)."""
    if snapshot is None or not snapshot.labels.get(LABEL_SNAPSHOT_MEMORY):
        return ""
    return f"{snapshot.labels.get(LABEL_SNAPSHOT_OF, '')} {snapshot.labels.get(LABEL_SNAPSHOT_CONTAINER, '')}"


def checkpoint_key(snapshot_ref: str) -> str:
    """The key a memory snapshot's checkpoint is kept under: its image's tag."""
    return snapshot_ref.rpartition(":")[2]


def check_restorable(snapshot_name: str, spec: WorkspaceSpec) -> None:
    """Refuse to restore a memory snapshot's processes into a workspace of ``spec`` that cannot take them.

    They can be restored only into the runtime and mounts they were saved with: runsc, and a
    plain /workspace (a capped one is a tmpfs the engine fills only after a start).

    Raises:
        FailedPreconditionError: ``spec`` is not runsc, or caps /workspace.
    """
    if spec.runtime is not Runtime.RUNSC or spec.limits.disk_bytes:
        msg = (
            f"snapshot {snapshot_name!r} holds running processes, which only a workspace under runtime runsc "
            "without a capped /workspace (disk_bytes) can be restored into, as its source was"
        )
        raise FailedPreconditionError(msg)


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
        resolved: a spec with every default applied (:func:`resolve_spec`) and its user.
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
    origin = restored_from(snapshot)
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
            **({LABEL_RESTORED_FROM: origin} if origin else {}),
            **request_labels(request),
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
        entrypoint=(AGENT_PATH, "serve", *_owned(resolved)),
        agent_volume=agent.volume,
        agent_mount=AGENT_MOUNT,
        # The agent holds the root capabilities only to hand them to commands run as uid 0.
        agent_capabilities=tuple(sorted({*AGENT_CAPABILITIES, *resolved.security.root_capabilities})),
        private_dirs=(AGENT_SOCKET_DIR,),
        seed_workspace=snapshot is not None,
        checkpoint=checkpoint_key(snapshot.ref) if origin and snapshot is not None else "",
        # On an allowlist's network no name resolves (Docker's resolver there answers none):
        # a tool that ignores HTTP_PROXY fails in a second rather than in forty.
        dns_options=("timeout:1", "attempts:1") if resolved.network is NetworkPolicy.ALLOWLIST else (),
    )


def workspace_dirs(resolved: WorkspaceSpec) -> tuple[str, ...]:
    """The directories a workspace is made with, each to belong to its user.

    The agent makes each one that is missing and gives the user what it made, and each the
    engine made for it (empty, root's); an image's own directory is left as it is
    (``sandboxd-agent own``, agent/internal/owner).
    """
    return tuple(dict.fromkeys((WORKSPACE_ROOT, resolved.working_dir or WORKSPACE_ROOT)))


def _owned(resolved: WorkspaceSpec) -> tuple[str, ...]:
    """The agent's ``--own USER DIR...`` arguments; none while the user is not known yet."""
    user = resolved.security.user
    return ("--own", user, *workspace_dirs(resolved)) if user else ()


def request_labels(request: tuple[str, str] | None) -> dict[str, str]:
    """The labels that say which create request made a workspace (none without a request id)."""
    if request is None:
        return {}
    return {LABEL_CREATE_REQUEST: request[0], LABEL_CREATE_DIGEST: request[1]}


def made_by(info: ContainerInfo) -> tuple[str, str] | None:
    """``(tenant, request_id)`` of the create that made a workspace; None for one made without a request id."""
    request_id = info.labels.get(LABEL_CREATE_REQUEST, "")
    if not request_id or info.labels.get(LABEL_POOL):
        return None
    return info.labels.get(LABEL_TENANT, DEFAULT_TENANT), request_id


def is_snapshot(image: ImageInfo) -> bool:
    """Whether an image is a snapshot (or a part of one being taken)."""
    return bool(image.labels.get(LABEL_SNAPSHOT)) or image.labels.get(LABEL_SNAPSHOT_PART) == "true"


def resolve_spec(spec: WorkspaceSpec, settings: Settings, secrets: SecretStore, tenant: str) -> WorkspaceSpec:
    """Validate ``spec`` and fill in every default except the user.

    Args:
        spec: the caller's spec.
        settings: the daemon's defaults and caps.
        secrets: checks the ``secret:NAME`` values of its env.
        tenant: the caller's tenant, whose secrets those may name.

    Returns:
        The spec with every default applied (the user still as given: it is read from the
        image at create).

    Raises:
        InvalidSpecError: with a message naming the offending field.
    """
    _check_sizes(spec)
    secrets.check(spec.env, "env", tenant)
    limits = _resolve_limits(spec.limits, settings)
    runtime = spec.runtime or Runtime(settings.default_runtime)
    network = spec.network or NetworkPolicy.NONE
    check_runtime_network(settings, runtime, network)
    allowed_hosts = check_rules(network, spec.allowed_hosts)
    working_dir = spec.working_dir or WORKSPACE_ROOT
    if not working_dir.startswith("/") or "\0" in working_dir:
        msg = f"working_dir must be an absolute path, got {quoted(working_dir)}"
        raise InvalidSpecError(msg)
    capabilities = _capabilities(spec.security)
    if spec.idle_ttl_s is not None and (spec.idle_ttl_s < 0 or 0 < spec.idle_ttl_s < MIN_IDLE_TTL_S):
        # The reaper looks once a second: a shorter TTL would reap a workspace as it is made.
        msg = f"idle_ttl must be 0 (never) or at least {MIN_IDLE_TTL_S:g} s, got {spec.idle_ttl_s:g} s"
        raise InvalidSpecError(msg)
    check_lifetime(spec.lifetime_s, "lifetime")
    _check_image(spec.image)
    return dataclasses.replace(
        spec,
        image=spec.image or settings.default_image,
        env=dict(spec.env),
        labels=dict(spec.labels),
        # normpath keeps two leading slashes (POSIX leaves them to the system; Linux reads one).
        working_dir="/" + posixpath.normpath(working_dir).lstrip("/"),
        limits=limits,
        network=network,
        allowed_hosts=allowed_hosts,
        runtime=runtime,
        idle_ttl_s=spec.idle_ttl_s if spec.idle_ttl_s is not None else settings.default_idle_ttl_s,
        security=dataclasses.replace(
            spec.security,
            added_capabilities=capabilities,
            root_capabilities=_capability_names(spec.security.root_capabilities),
        ),
        idle_action=spec.idle_action or IdleAction.DELETE,
        auto_resume=spec.auto_resume is not False,
        lifetime_s=spec.lifetime_s or None,
    )


MAX_LIFETIME_S = 366 * 86400.0


def check_lifetime(lifetime_s: float | None, field: str) -> None:
    """Refuse a lifetime outside 1 s to a year (0 and None mean no end).

    Raises:
        InvalidSpecError: the lifetime is negative, under a second, or over a year.
    """
    if lifetime_s and not 1.0 <= lifetime_s <= MAX_LIFETIME_S:
        msg = f"{field} must be 0 (no end) or 1 s to {MAX_LIFETIME_S:g} s, got {lifetime_s:g} s"
        raise InvalidSpecError(msg)


def _check_sizes(spec: WorkspaceSpec) -> None:
    """Refuse a spec whose labels, env, image, working directory or capability list is too large."""
    check_labels(spec.labels, "labels")
    check_env(spec.env, "env", max_bytes=MAX_WORKSPACE_ENV_BYTES)  # it is stored with the workspace
    for field, text, limit in (
        ("image", spec.image, MAX_IMAGE_REFERENCE_BYTES),
        ("working_dir", spec.working_dir, MAX_PATH_BYTES),
    ):
        if utf8_size(text) > limit:
            msg = f"{field} is {utf8_size(text)} bytes; the limit is {limit}"
            raise InvalidSpecError(msg)
    for field, names in (
        ("added_capabilities", spec.security.added_capabilities),
        ("root_capabilities", spec.security.root_capabilities),
    ):
        if len(names) > MAX_CAPABILITIES:
            msg = f"security.{field} has {len(names)} entries; the limit is {MAX_CAPABILITIES}"
            raise InvalidSpecError(msg)


def _resolve_limits(limits: ResourceLimits, s: Settings) -> ResourceLimits:
    """The limits with the daemon's defaults for the unset (zero) ones, each checked against its range."""
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
        # Checked here: the engine's own refusal is a Go unmarshalling error.
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
    return ResourceLimits(memory_bytes=memory, cpu_millis=cpu, pids=pids, disk_bytes=disk)


def _capabilities(security: SecurityOptions) -> tuple[str, ...]:
    """The added capabilities by their bare names, sorted and once each; the user checked too."""
    check_user(security.user, "security.user")
    return _capability_names(security.added_capabilities)


def _capability_names(names: Sequence[str]) -> tuple[str, ...]:
    """Capabilities by their bare names (``chown``, ``CAP_CHOWN``: ``CHOWN``), sorted and once each."""
    capabilities = []
    for cap in names:
        name = cap.upper().removeprefix("CAP_")
        if name not in CAPABILITIES:
            msg = f"unknown capability {quoted(cap)}"
            raise InvalidSpecError(msg)
        capabilities.append(name)
    return tuple(sorted(set(capabilities)))


def check_user(user: str, field: str) -> str:
    """Return ``user`` when it is empty or reads as a user (``name``, ``uid``, ``name:group``, ``uid:gid``).

    Raises:
        InvalidSpecError: it does not (the agent resolves the names, in the workspace).
    """
    if user and not _USER_RE.fullmatch(user):
        msg = f"{field} {quoted(user)} is not a user name, uid or uid:gid"
        raise InvalidSpecError(msg)
    return user


def _check_image(image: str) -> None:
    """Refuse an image reference Docker would refuse (empty: the default image)."""
    if image and not _IMAGE_RE.fullmatch(image):
        msg = f"image {quoted(image)} is not a valid image reference (lowercase repository, optional :tag or @digest)"
        raise InvalidSpecError(msg)
    if len(name := _image_name(image)) > MAX_IMAGE_NAME_CHARS:
        msg = (
            f"image's repository name is {len(name)} characters as Docker counts it ({quoted(name)}); "
            f"Docker allows at most {MAX_IMAGE_NAME_CHARS}"
        )
        raise InvalidSpecError(msg)


def check_runtime_network(settings: Settings, runtime: Runtime, network: NetworkPolicy) -> None:
    """Refuse a network other than ``none`` under gVisor unless the daemon says its runsc can network.

    Raises:
        InvalidSpecError: the policy is not available under that runtime here.
    """
    if runtime is Runtime.RUNSC and network is not NetworkPolicy.NONE and not settings.runsc_network:
        msg = (
            f"network {str(network)!r} is not available under runtime 'runsc' on this daemon (its gVisor "
            "runs with --network=none; set SANDBOXD_RUNSC_NETWORK=true once the engine's runsc can network)"
        )
        raise InvalidSpecError(msg)


def owned(info: ContainerInfo, tenant: str) -> ContainerInfo:
    """``info`` if ``tenant`` owns it; NOT_FOUND otherwise (existence never leaks).

    Raises:
        WorkspaceNotFoundError: it is another tenant's.
    """
    if info.labels.get(LABEL_TENANT, DEFAULT_TENANT) != tenant:
        msg = f"workspace {info.workspace_id!r} not found"
        raise WorkspaceNotFoundError(msg)
    return info
