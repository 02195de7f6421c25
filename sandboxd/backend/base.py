"""The only seam between sandboxd and a container engine.

Every backend (Docker today) satisfies :class:`Backend`, and the shared
conformance suite in ``tests/integration/test_backend_conformance.py`` runs
against each real one. Backends speak in containers, images and raw exec
streams; workspaces, processes and the supervisor protocol live in the domain
layer above.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import signal
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

__all__ = [
    "LABEL_EGRESS_OF",
    "LABEL_EGRESS_RULES",
    "LABEL_LEASE",
    "LABEL_POOL",
    "LABEL_SNAPSHOT_PART",
    "Backend",
    "ContainerInfo",
    "ContainerSpec",
    "ExecStream",
    "ImageInfo",
    "Lease",
]

LABEL_POOL = "sandboxd.pool"
"""On a warm pool's member: the name of its class (a backend keeps such a container apart when
its claim record is lost)."""
LABEL_EGRESS_OF = "sandboxd.egress_of"
"""On an egress proxy and its network: the workspace they serve (they are no workspace: no
``sandboxd.managed`` label, so nothing that lists workspaces sees them)."""
LABEL_EGRESS_RULES = "sandboxd.egress_rules"
"""On an egress proxy: its allowlist (``egress.rules_to_json``)."""
LABEL_LEASE = "sandboxd.lease"
"""On an instance's lease (``sandboxd.lease``): its holder, as JSON (pid, host, socket, since).
Like an egress proxy it has no ``sandboxd.managed`` label: no workspace listing sees it."""
LABEL_SNAPSHOT_PART = "sandboxd.snapshot_part"
"""``true`` on the intermediate image and container of a snapshot being taken (debris if the
daemon dies then, which a start removes); such an image is no workspace's image."""


RELISTEN_SIGNAL = signal.SIGUSR1
"""What tells a workspace's agent that let go of its socket for a checkpoint to listen again: sent
once the checkpoint is taken, and to a container restored from one (agent/PROTOCOL.md, ``Z``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ContainerSpec:
    """A fully resolved workspace container: every default already applied."""

    workspace_id: str
    image: str
    env: Mapping[str, str]
    working_dir: str
    labels: Mapping[str, str]
    """All labels, including the backend-independent ``sandboxd.*`` ones from the domain."""
    memory_bytes: int
    cpu_millis: int
    pids: int
    network: str
    """``"none"`` or ``"bridge"``."""
    runtime: str
    added_capabilities: Sequence[str]
    no_new_privileges: bool
    disk_bytes: int = 0
    """Size cap of the workspace volume; 0 means a plain volume."""
    read_only_root_filesystem: bool = False
    entrypoint: Sequence[str] = ()
    """The container's main process (run as root under the engine's init): the agent."""
    agent_volume: str = ""
    """A named volume mounted read-only at ``agent_mount`` (the agent binary)."""
    agent_mount: str = ""
    agent_capabilities: Sequence[str] = ()
    """Capabilities the main process needs on top of ``added_capabilities`` (it drops them
    from everything it starts)."""
    seed_workspace: bool = False
    """Start /workspace with the image's /workspace even when it is capped (a snapshot's fork): a
    plain volume is filled so by the engine, a capped one is not."""
    checkpoint: str = ""
    """Start the container restored from this checkpoint (:meth:`Backend.checkpoint_container`): its
    processes go on where they were; its image must be the one committed with it."""
    dns_options: Sequence[str] = ()
    """resolv.conf options of the container (an allowlist workspace's fail fast: nothing resolves there)."""
    private_dirs: Sequence[str] = ()
    """Directories made a small tmpfs only root may enter (the agent's socket); where the engine
    runs on this machine, the daemon reaches them from the host (``ContainerInfo.mounts``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ContainerInfo:
    """What the engine reports about a workspace container."""

    workspace_id: str
    container_id: str
    volume_name: str
    labels: Mapping[str, str]
    running: bool
    """Whether it runs and is not paused: it accepts commands."""
    create_time: datetime.datetime
    os: str = "linux"
    """The container's platform: ``linux`` or ``windows``."""
    runtime: str = ""
    """The OCI runtime it runs under (``runc``, ``runsc``, ...); empty for the engine's default."""
    mounts: Mapping[str, str] = dataclasses.field(default_factory=dict)
    networks: tuple[str, ...] = ()
    """The networks it is on (``none``, ``bridge``, its own egress network...)."""
    """Host path of each volume mounted in the container, by its path inside: where the engine
    keeps it on its own machine (not necessarily this one)."""
    paused: bool = False
    """Frozen by :meth:`Backend.pause_container` (then ``running`` is false)."""
    image_id: str = ""
    """The id of the image it was created from."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ImageInfo:
    """What the engine reports about a local image."""

    image_id: str
    user: str
    """The image's configured user (``USER``), possibly empty."""
    os: str
    """``"linux"`` or ``"windows"``."""
    labels: Mapping[str, str]
    ref: str = ""
    """The reference it was asked by or listed under."""
    size_bytes: int = 0
    """Bytes of all its layers."""
    created: datetime.datetime | None = None
    working_dir: str = ""
    """The image's configured working directory (``WORKDIR``), possibly empty."""


class ExecStream(Protocol):
    """A running exec: the command's stdin, and its stdout/stderr as they arrive."""

    async def read(self) -> tuple[int, bytes] | None:
        """Return the next ``(fd, data)`` chunk (fd 1 or 2), or None at end of stream."""
        ...

    async def write(self, data: bytes) -> None:
        """Write ``data`` to the command's stdin."""
        ...

    async def exit_code(self) -> int | None:
        """Return the exec's exit code once it has ended (-1 if the engine forgot it), else None.

        None also when the engine cannot be asked.
        """
        ...

    async def close(self, *, discard_input: bool = False) -> None:
        """Hang up; the command keeps running but loses its stdin and readers.

        Stdin already written but not yet taken is delivered first (within a few
        seconds), unless ``discard_input``: then the connection is dropped at once.
        """
        ...


class Lease(Protocol):
    """A daemon's hold on its instance label on one engine (:meth:`Backend.take_lease`)."""

    async def lost(self) -> None:
        """Return when the hold is gone: the engine restarted, or its connection broke."""
        ...

    async def release(self) -> None:
        """Give the hold up at once (a successor may take it the moment this returns)."""
        ...


class Backend(Protocol):
    """Container-engine operations sandboxd needs, all async and all idempotent where named."""

    instance: str
    """Label value marking this daemon's containers."""

    async def ping(self) -> None:
        """Return when the engine answers.

        Raises:
            DockerUnavailableError: the engine cannot be reached.
        """
        ...

    async def image_info(self, ref: str) -> ImageInfo | None:
        """Return the local image ``ref``, or None when it is not present."""
        ...

    async def pull_image(self, ref: str) -> ImageInfo:
        """Pull ``ref`` from its registry.

        Raises:
            ImageNotFoundError: the registry cannot be reached or has no such image.
        """
        ...

    async def import_image(self, rootfs_tar: Path, ref: str) -> None:
        """Create image ``ref`` from a root filesystem tarball (``docker import``)."""
        ...

    async def build_image(
        self,
        context: Path,
        ref: str,
        *,
        build_args: Mapping[str, str],
        labels: Mapping[str, str],
        on_line: Callable[[str], None],
        target: str = "",
        no_cache: bool = False,
    ) -> None:
        """Build ``context``'s Dockerfile as ``ref`` (up to stage ``target``; ``no_cache`` reruns every step).

        Each log line goes to ``on_line``.

        Raises:
            BackendError: the build failed (the message carries the failing step).
        """
        ...

    def build_archive(
        self,
        archive: Path,
        ref: str,
        *,
        dockerfile: str,
        labels: Mapping[str, str],
        no_cache: bool,
        memory_bytes: int,
        network: str = "default",
    ) -> AsyncGenerator[str, None]:
        """Build the tar ``archive`` with the Dockerfile ``dockerfile`` (its text) as ``ref``, yielding its log lines.

        The Dockerfile is added to the archive, with a last step that sets ``labels``.

        Steps run in the engine's build containers, each limited to ``memory_bytes`` and one CPU, on
        ``network`` (the engine's ``default`` bridge, or ``none``). Closing
        the iterator before its end (a cancel, a timeout) cuts the build's connection, and the
        engine stops the step that runs and tags nothing.

        Raises:
            BuildFailedError: a step failed (the message carries its output's end).
            ImageNotFoundError: a FROM image the engine does not have and cannot pull.
            InvalidSpecError: the Dockerfile does not parse.
        """
        ...

    async def remove_image(self, ref: str, *, prune: bool = False) -> None:
        """Untag ``ref``, keeping its layers as build cache unless ``prune`` (nothing if it is missing).

        Layers containers still use stay until the last of them is removed.
        """
        ...

    async def architecture(self) -> str:
        """The engine's CPU architecture (``x86_64``, ``aarch64``)."""
        ...

    async def fill_volume(self, name: str, *, image: str, path: str, labels: Mapping[str, str]) -> None:
        """Make volume ``name`` hold what ``image`` has at ``path``, once (an existing one is kept).

        Raises:
            BackendError: the image could not be run to fill it.
        """
        ...

    async def create_container(self, spec: ContainerSpec) -> ContainerInfo:
        """Create the workspace's volume and container, start it, and return it running.

        It is provisional until :meth:`commit_container`: every call reaches it by its id
        meanwhile, and :meth:`remove_orphans` removes it if it is never committed (a daemon
        that died before its create returned).

        Raises:
            WorkspaceExistsError: a container for that workspace id exists.
            ImageNotFoundError: the image is missing.
            InvalidSpecError: the engine rejected the configuration.
        """
        ...

    async def commit_container(self, workspace_id: str) -> None:
        """Mark a container :meth:`create_container` made as complete; a committed one is left as it is.

        Raises:
            WorkspaceNotFoundError: it was removed meanwhile.
        """
        ...

    async def inspect_container(self, workspace_id: str) -> ContainerInfo:
        """Return one of this daemon's workspace containers.

        Raises:
            WorkspaceNotFoundError: no such container for this daemon.
        """
        ...

    async def list_containers(self, labels: Mapping[str, str]) -> list[ContainerInfo]:
        """Return this daemon's workspace containers carrying every label in ``labels``."""
        ...

    async def container_labels(self) -> Mapping[str, Mapping[str, str]]:
        """Labels of each of this daemon's workspace containers, by workspace id (one cheap listing)."""
        ...

    async def container_states(self) -> list[tuple[str, str]]:
        """``(state, runtime)`` of each workspace container (``running``, ``paused``, ``stopped``...)."""
        ...

    async def volume_labels(self, workspace_id: str) -> Mapping[str, str] | None:
        """Labels of a workspace's volume, or None when there is none."""
        ...

    async def remove_orphans(self) -> list[str]:
        """Remove this daemon's containers and volumes that no workspace owns; return their names.

        Orphans are half-created workspaces: a container never committed, never started or
        without a workspace spec, and a volume without its container.
        """
        ...

    async def remove_container(self, workspace_id: str) -> bool:
        """Remove the container (paused or not) and its volume; return whether either existed."""
        ...

    async def snapshot_container(
        self,
        workspace_id: str,
        ref: str,
        labels: Mapping[str, str],
        *,
        max_workspace_bytes: int,
        max_root_bytes: int = 0,
        frozen: Callable[[bool], Awaitable[None]] | None = None,
        later_labels: Awaitable[Mapping[str, str]] | None = None,
    ) -> ImageInfo:
        """Make image ``ref`` (labelled ``labels``, then ``later_labels`` once its files are read) of its files.

        Its changed root filesystem and its /workspace, which a container of the image starts with.

        The container goes on running (frozen for the moment its root filesystem is taken:
        ``frozen(True)`` is awaited just before, ``frozen(False)`` once it runs again);
        its files are streamed, never held whole, and at most ``max_workspace_bytes`` of them
        (as an archive: a sparse file counts at its full length), and ``max_root_bytes`` of its
        root filesystem's changes where the backend reads them itself (0: no bound).

        Raises:
            WorkspaceNotFoundError: no such container.
            QuotaExceededError: /workspace is over ``max_workspace_bytes``.
        """
        ...

    async def checkpoint_container(self, workspace_id: str, key: str) -> int:
        """Save the running container's processes and memory as checkpoint ``key``; return its size in bytes.

        The container runs on. The checkpoint is kept until :meth:`remove_checkpoint`; a
        container created with ``ContainerSpec.checkpoint = key`` starts from it.

        Raises:
            WorkspaceNotFoundError: no such container.
            FailedPreconditionError: the engine or runtime cannot (its reason named).
        """
        ...

    def snapshot_in_progress(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Held while a snapshot is being made: :meth:`sweep_snapshot_debris` leaves its parts alone."""
        ...

    async def sweep_snapshot_debris(self) -> list[str]:
        """Remove what snapshots cut short left (parts, checkpoints no snapshot holds); return what went.

        Nothing while a snapshot of this daemon's is in progress.
        """
        ...

    async def remove_checkpoint(self, key: str) -> None:
        """Remove checkpoint ``key``; nothing when there is none."""
        ...

    async def checkpoint_exists(self, key: str) -> bool:
        """Whether checkpoint ``key`` is kept."""
        ...

    async def signal_container(self, container: str, signum: int) -> None:
        """Send ``signum`` to the container's main process (the engine's init passes it on)."""
        ...

    async def remove_unused_images(self) -> list[str]:
        """Remove this daemon's images nothing needs any more; return their ids.

        Deleted snapshots no workspace runs from, and debris of a snapshot cut short.
        """
        ...

    async def list_images(self, labels: Mapping[str, str]) -> list[ImageInfo]:
        """This daemon's snapshot images carrying every label in ``labels``, oldest first."""
        ...

    async def claim_container(
        self, member: ContainerInfo, workspace_id: str, labels: Mapping[str, str]
    ) -> ContainerInfo:
        """Make the running container ``member`` (a warm pool's) workspace ``workspace_id``; return it so.

        From then on, and across restarts of the daemon, every call names it ``workspace_id``
        and reports ``labels`` as its own (the domain's ``sandboxd.*`` labels among them), and the
        claim's time as its ``create_time`` (the workspace was created then, not when the member started).

        Raises:
            WorkspaceExistsError: ``workspace_id`` is taken.
        """
        ...

    async def pause_container(self, workspace_id: str) -> None:
        """Freeze every process of the running container (the cgroup freezer).

        Raises:
            WorkspaceNotFoundError: no such container.
            FailedPreconditionError: it is paused already, or does not run.
        """
        ...

    async def resume_container(self, workspace_id: str) -> None:
        """Thaw the paused container.

        Raises:
            WorkspaceNotFoundError: no such container.
            FailedPreconditionError: it is not paused.
        """
        ...

    async def exec_stream(
        self,
        workspace_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        user: str,
        container_id: str = "",
    ) -> ExecStream:
        """Start ``argv`` in the container with stdin attached and return its stream.

        ``container_id``, when given, pins the exact container: a workspace of the same id
        created since (after this one was removed behind the daemon's back) is never entered.

        Raises:
            WorkspaceNotFoundError: the container is gone.
            WorkspaceNotRunningError: the container is not running.
        """
        ...

    async def exec_run(
        self, workspace_id: str, argv: Sequence[str], *, user: str, container_id: str = ""
    ) -> tuple[int, bytes]:
        """Run ``argv`` to completion and return ``(exit_code, stdout + stderr)`` (``container_id`` as above)."""
        ...

    async def open_socket(self, host_path: str, container_id: str) -> ExecStream | None:
        """Connect straight to a Unix socket the container's root listens on, at its host path.

        The stream's reads are all fd 1; it has no exit code. None when the engine is not on
        this machine, nothing listens there (yet), or what listens is not the container's
        root: callers then go through :meth:`exec_stream`.
        """
        ...

    async def create_network(self, workspace_id: str) -> str:
        """Make the workspace's own internal network (no route out); return its name (a leftover is replaced)."""
        ...

    async def remove_network(self, workspace_id: str) -> None:
        """Remove the workspace's network, whatever is still attached (nothing when there is none)."""
        ...

    async def set_network(self, workspace_id: str, network: str) -> None:
        """Move the workspace's running container to ``network`` (``none``, ``bridge`` or its own)."""
        ...

    async def start_proxy(
        self, workspace_id: str, *, image: str, env: Mapping[str, str], rules: str, alias: str, egress_network: str
    ) -> None:
        """Start the workspace's egress proxy on its network (as ``alias``) and on ``egress_network``."""
        ...

    async def remove_proxy(self, workspace_id: str) -> None:
        """Remove the workspace's egress proxy (nothing when there is none)."""
        ...

    async def proxy_rules(self, workspace_id: str) -> str | None:
        """The rules label of the workspace's proxy, or None when it has none."""
        ...

    async def list_proxies(self) -> list[str]:
        """Workspace ids of this daemon's egress proxies and networks."""
        ...

    async def network_subnet(self, workspace_id: str) -> str:
        """The IPv4 block of the workspace's own network (its proxy serves only that)."""
        ...

    def proxy_log(self, workspace_id: str, *, max_line_bytes: int, since: float = 0) -> AsyncIterator[tuple[str, str]]:
        """The proxy's log lines as they come, as ``(stream, line)``: ``stdout`` or ``stderr``.

        Each line is cut to ``max_line_bytes``; from ``since`` (a UNIX time) on, 0 being the
        proxy's start.
        """
        ...

    async def take_lease(
        self,
        *,
        image: str,
        argv: Sequence[str],
        holder: str,
        wait_s: float,
        stale: Callable[[str], bool] = lambda holder: False,
        alive: Callable[[str], bool] = lambda holder: False,
    ) -> Lease:
        """Hold this instance's label on the engine for as long as this process lives.

        The hold is a container of ``image`` running ``argv`` (a program that reads its stdin
        to the end) whose stdin this process keeps open: however the process ends, kill -9
        included, the engine closes that stdin and the container ends and goes. ``holder``
        (JSON) says who holds it, for whoever finds it taken; ``stale`` tells a holder that is
        this process from before (an engine restart that kept it running), which goes;
        ``alive`` tells a holder known to live on (no wait for it to go: refused at once).

        Raises:
            LeaseHeldError: another process still held it after ``wait_s`` seconds, or at
                once when ``alive`` says its holder lives.
            ImageNotFoundError: ``image`` is not on the engine.
            DockerUnavailableError: the engine does not answer.
        """
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
