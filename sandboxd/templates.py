"""Templates: images built from a Dockerfile and a build context, kept as the tenant's snapshots.

A template is a snapshot whose image was built rather than committed: the engine's builder runs
the Dockerfile's steps in its own build containers (never on the daemon's host), each limited
in memory, the whole build in time, its context in size before it is read and its image in size
once made. Workspaces start from it as from any snapshot (``CreateWorkspace(from_snapshot)``),
and it is listed, fetched and deleted as one. Its labels add what a snapshot taken of a
workspace does not have: the command a workspace started from it runs in the background at its
start, the one that says it is ready, and a digest of everything it was built from, so that
building the same content again is answered from the image at once.

Builds of one name by one tenant run one after the other: two callers building the same
template at once get one build, the second answered from the first's image.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime
import hashlib
import json
import re
import tarfile
import tempfile
import time
import weakref
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import structlog
from sandboxd_protocol.limits import MAX_UPLOAD_CHUNK_BYTES

from .backend.base import ImageInfo
from .errors import (
    BuildFailedError,
    ExecTimeoutError,
    FailedPreconditionError,
    ImageNotFoundError,
    InvalidSpecError,
    NotFoundError,
    QuotaExceededError,
)
from .models import ExecSpec, ExitStatus, OutputChunk, Snapshot, WorkspaceSpec
from .processes import ProcessTable
from .snapshots import (
    LABEL_SNAPSHOT_LABELS,
    LABEL_SNAPSHOT_TIME,
    LABEL_TEMPLATE_READY,
    LABEL_TEMPLATE_START,
    SnapshotStore,
    check_snapshot_name,
    template_command,
)
from .tenancy import current_tenant
from .workspaces import (
    LABEL_SNAPSHOT,
    LABEL_SNAPSHOT_OF,
    LABEL_SPEC,
    LABEL_TEMPLATE_DIGEST,
    LABEL_TENANT,
    check_labels,
    spec_to_json,
)

__all__ = [
    "BoundedTarInfo",
    "BuildLine",
    "Built",
    "Canonical",
    "TemplateBuild",
    "TemplateBuilder",
    "canonical_dockerfile",
]

log = structlog.get_logger(__name__)

MAX_DOCKERFILE_BYTES = MAX_UPLOAD_CHUNK_BYTES
"""Largest Dockerfile a build takes (it travels in one message)."""
MAX_COMMAND_BYTES = 16 * 1024
_TAIL_LINES = 30
_READY_TRY_S = 10.0
_READY_PAUSE_S = 0.2
_READY_OUTPUT_BYTES = 64 * 1024
"""Output of a ready command's try held at most (more is dropped: only its end is said)."""
_READY_OUTPUT_KEPT = 2000


@dataclasses.dataclass(frozen=True, kw_only=True)
class TemplateBuild:
    """What to build and how a workspace started from it begins."""

    name: str
    dockerfile: str
    start_command: str = ""
    ready_command: str = ""
    working_dir: str = ""
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    force: bool = False
    timeout_s: float = 0.0
    """Seconds the build may take; 0: the daemon's limit."""


@dataclasses.dataclass(frozen=True)
class BuildLine:
    """One line of a build's log."""

    text: str
    step: int
    """The Dockerfile step it belongs to, from 1; 0: the daemon's own words or before the first."""
    time: datetime.datetime


@dataclasses.dataclass(frozen=True)
class Built:
    """A build's end: the template, and whether it was there already (nothing was built)."""

    snapshot: Snapshot
    cached: bool


@dataclasses.dataclass(frozen=True)
class Canonical:
    """A Dockerfile as the daemon hands it to the engine: one instruction a line, checked.

    Attributes:
        text: the Dockerfile the engine parses (no parser directive, no comment, no continuation;
            after each FROM, a LABEL of the tenant's build scope, so that no two tenants share a
            step of the engine's build cache).
        bases: the images its stages start FROM (but earlier stages and ``scratch``).
        steps: for each of ``text``'s instructions (its step numbers, from 1), the caller's
            instruction it is (from 1; 0 for the daemon's own).
    """

    text: str
    bases: tuple[str, ...]
    steps: tuple[int, ...]


_INSTRUCTIONS = frozenset(
    {
        "FROM", "RUN", "COPY", "ADD", "ENV", "ARG", "WORKDIR", "USER", "LABEL", "EXPOSE", "CMD",
        "ENTRYPOINT", "SHELL", "STOPSIGNAL", "HEALTHCHECK", "VOLUME", "MAINTAINER",
    }
)  # fmt: skip
_LINE_BREAKS = frozenset("\f\v\x1c\x1d\x1e\x85\u2028\u2029\x00")
_DIRECTIVE_RE = re.compile(r"^\s*#\s*[A-Za-z]+\s*=")
"""A parser directive (``# escape=``, ``# syntax=``), which the engine honours before the first instruction."""
_FROM_ARGS_RE = re.compile(r"^(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?\s*$", re.IGNORECASE)
_COPY_FROM_RE = re.compile(r"--from=(\S+)", re.IGNORECASE)


def canonical_dockerfile(dockerfile: str, scope: str) -> Canonical:
    """Check ``dockerfile`` and write it as the engine will read it (:class:`Canonical`).

    The engine's builder takes images from more places than FROM lines (``COPY --from``, a build
    argument in FROM, ONBUILD triggers) and reads a Dockerfile with parser directives that change
    its escape character; a Dockerfile is refused rather than guessed at when it holds any of
    those, or a line break other than a newline (LF or CRLF). So what the daemon checked is
    exactly what the engine reads: every image a build can read is a FROM the daemon resolved.

    Raises:
        InvalidSpecError: naming the line and what of it is refused.
    """
    if any(char in _LINE_BREAKS for char in dockerfile) or re.search(r"\r(?!\n)", dockerfile):
        msg = "the Dockerfile holds a line break other than \\n (a form feed, a lone \\r, ...): refused"
        raise InvalidSpecError(msg)
    logical: list[tuple[int, str]] = []
    pending, began = "", 0
    for number, raw in enumerate(dockerfile.split("\n"), start=1):
        line = raw.rstrip("\r")
        if not logical and not pending and _DIRECTIVE_RE.match(line):
            msg = f"line {number}: parser directives ({line.strip()[:60]!r}) are not taken"
            raise InvalidSpecError(msg)
        if not line.strip() or line.lstrip().startswith("#"):
            continue  # as the engine reads them: comments and blank lines go, inside a continuation too
        if not pending:
            began = number
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            pending += stripped[:-1]
            continue
        logical.append((began, pending + line))
        pending = ""
    if pending.strip():
        logical.append((began, pending))
    stages: list[str] = []
    bases: list[str] = []
    out: list[str] = []
    steps: list[int] = []
    for index, (number, line) in enumerate(logical, start=1):
        word, _, rest = line.strip().partition(" ")
        instruction, rest = word.upper(), rest.strip()
        if instruction not in _INSTRUCTIONS:
            msg = f"line {number}: {word[:40]!r} is not an instruction a template build takes"
            raise InvalidSpecError(msg)
        if instruction == "ARG" and not stages:
            msg = f"line {number}: ARG before FROM is not taken (FROM must name its image itself)"
            raise InvalidSpecError(msg)
        if instruction != "FROM" and not stages:
            msg = f"line {number}: the Dockerfile must start with FROM"
            raise InvalidSpecError(msg)
        if instruction == "FROM":
            match = _FROM_ARGS_RE.match(rest)
            if not match or "$" in rest:
                msg = f"line {number}: FROM must name an image (and may name its stage): {rest[:80]!r}"
                raise InvalidSpecError(msg)
            image, alias = match.group(1), match.group(2)
            if image.lower() not in stages and image != "scratch" and image not in bases:
                bases.append(image)
            stages.append((alias or f"#{len(stages)}").lower())
            out.append(f"FROM {rest}")
            steps.append(index)
            # Each tenant's builds their own chain in the engine's build cache.
            out.append(f'LABEL "sandboxd.build_scope"="{scope}"')
            steps.append(0)
            continue
        if instruction in ("COPY", "ADD"):
            for source in _COPY_FROM_RE.findall(rest):
                named = source.lower()
                earlier = stages[:-1]
                if named not in earlier and not (named.isdigit() and int(named) < len(earlier)):
                    msg = f"line {number}: {instruction} --from must name an earlier stage, not {source[:80]!r}"
                    raise InvalidSpecError(msg)
        out.append(f"{instruction} {rest}".rstrip())
        steps.append(index)
    if not stages:
        msg = "the Dockerfile has no FROM"
        raise InvalidSpecError(msg)
    return Canonical(text="\n".join(out) + "\n", bases=tuple(bases), steps=tuple(steps))


class TemplateBuilder:
    """Builds the tenant's templates and keeps them as its snapshots."""

    def __init__(self, snapshots: SnapshotStore) -> None:
        """Build into ``snapshots`` (its backend, its settings, its names)."""
        self.snapshots = snapshots
        self._locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = weakref.WeakValueDictionary()

    def _lock(self, tenant: str, name: str) -> asyncio.Lock:
        lock = self._locks.get((tenant, name))
        if lock is None:
            lock = asyncio.Lock()
            self._locks[(tenant, name)] = lock
        return lock

    async def build(self, build: TemplateBuild, context: AsyncIterator[bytes]) -> AsyncIterator[BuildLine | Built]:
        """Build ``build`` from the tar archive ``context`` arrives as; yield its log, then :class:`Built`.

        Raises:
            InvalidSpecError: a bad name, labels, Dockerfile, commands, or a context that is no tar archive.
            QuotaExceededError: the context or the image is past the daemon's limit.
            ImageNotFoundError: a FROM image the engine does not have and cannot pull.
            BuildFailedError: a step failed; its message ends with the step's output.
            ExecTimeoutError: the build took longer than its timeout.
        """
        settings = self.snapshots.manager.settings
        _check(build)
        timeout_s = min(build.timeout_s or settings.template_build_timeout_s, settings.template_build_timeout_s)
        tenant = current_tenant()
        scope = hashlib.sha256(f"{settings.instance}\0{tenant}".encode()).hexdigest()[:24]
        canonical = canonical_dockerfile(build.dockerfile, scope)
        with tempfile.TemporaryDirectory(prefix="sandboxd-template-") as scratch:
            archive = Path(scratch) / "context.tar"
            context_digest = await _spool(context, archive, settings.template_context_bytes)
            digest = _digest(build, context_digest)
            async with self._lock(tenant, build.name):
                existing = await self._existing(build.name)
                if existing is not None and not build.force and existing.labels.get(LABEL_TEMPLATE_DIGEST) == digest:
                    yield BuildLine(f"template {build.name!r} is built from this content already", 0, _now())
                    yield Built(self.snapshots.describe(existing), cached=True)
                    return
                limit = settings.tenant_max_snapshots
                if existing is None and limit and len(await self.snapshots.list({})) >= limit:
                    msg = f"tenant {tenant!r} already has {limit} snapshots and templates, its limit"
                    raise QuotaExceededError(msg)
                ref = self.snapshots.ref(build.name, tenant)
                labels = {
                    LABEL_TENANT: tenant,
                    LABEL_SNAPSHOT: build.name,
                    LABEL_SNAPSHOT_OF: "",
                    LABEL_SNAPSHOT_LABELS: json.dumps(dict(build.labels), sort_keys=True),
                    LABEL_SPEC: spec_to_json(WorkspaceSpec(working_dir=build.working_dir)),
                    LABEL_SNAPSHOT_TIME: _now().isoformat(),
                    # JSON: a command may span lines, a label value may not.
                    LABEL_TEMPLATE_START: json.dumps(build.start_command),
                    LABEL_TEMPLATE_READY: json.dumps(build.ready_command),
                    LABEL_TEMPLATE_DIGEST: digest,
                }
                lines = self.snapshots.backend.build_archive(
                    archive,
                    ref,
                    dockerfile=canonical.text,
                    labels=labels,
                    no_cache=build.force,
                    memory_bytes=settings.template_build_memory_bytes,
                    network=settings.template_build_network,
                )
                step = 0  # the engine's step (its Dockerfile's, the daemon's LABELs counted)
                tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
                try:
                    async with asyncio.timeout(timeout_s):
                        await self._check_bases(canonical.bases)
                        async for line in lines:
                            if line.startswith("Step "):
                                step += 1
                                tail.clear()
                            tail.append(line)
                            yield BuildLine(line, _theirs(canonical, step), _now())
                except BuildFailedError as exc:
                    # The engine's words say only that the step failed: its output says why.
                    theirs = _theirs(canonical, exc.step)
                    exc.step = theirs
                    what = f"step {theirs} failed" if theirs else "the build failed"
                    exc.message = (
                        f"template {build.name!r}: {what}: {exc.message}; the step's last output:\n" + "\n".join(tail)
                    )
                    raise
                except TimeoutError:
                    msg = f"template {build.name!r}: the build took longer than its {timeout_s:g} s and was stopped"
                    raise ExecTimeoutError(msg) from None
                finally:
                    await lines.aclose()
                image = await self.snapshots.backend.image_info(ref)
                if image is None or image.labels.get(LABEL_TEMPLATE_DIGEST) != digest:
                    msg = f"template {build.name!r}: the build ended but its image is not there"
                    raise NotFoundError(msg)
                if any(image.labels.get(key) != value for key, value in labels.items()):
                    # Its labels are the tenant's claim on it: an image whose labels are not the
                    # daemon's own is nobody's.
                    await self.snapshots.backend.remove_image(ref, prune=True)
                    msg = f"template {build.name!r}: the image's labels are not those the daemon set; it was removed"
                    raise InvalidSpecError(msg)
                if image.size_bytes > settings.template_max_bytes:
                    await self.snapshots.backend.remove_image(ref, prune=True)
                    msg = (
                        f"template {build.name!r}'s image is {image.size_bytes} bytes, past the limit of "
                        f"{settings.template_max_bytes} (SANDBOXD_TEMPLATE_MAX_BYTES); it was removed"
                    )
                    raise QuotaExceededError(msg)
        log.info("template.built", template=build.name, size_bytes=image.size_bytes)
        yield Built(self.snapshots.describe(image), cached=False)

    async def begin(self, workspace_id: str, image: ImageInfo, processes: ProcessTable) -> None:
        """Start a new workspace from template ``image``: its start command, then its ready command until it succeeds.

        The start command runs in the background as a process session of the workspace (its
        timeout the daemon's longest); the ready command runs (``bash -lc``, 10 s at most each
        time) until it exits 0, every 0.2 s, for at most ``SANDBOXD_TEMPLATE_READY_TIMEOUT_S``.
        Nothing happens for a snapshot that is no template or a template with neither command.

        Raises:
            FailedPreconditionError: the ready command did not succeed in time (with its last
                output); the caller removes the workspace.
        """
        labels = image.labels
        start = template_command(labels.get(LABEL_TEMPLATE_START, ""))
        ready = template_command(labels.get(LABEL_TEMPLATE_READY, ""))
        if not (start or ready):
            return
        settings = self.snapshots.manager.settings
        context = await self.snapshots.manager.exec_context(workspace_id)
        if start:
            spec = ExecSpec(command=start, stdin_closed=True, timeout_s=settings.max_exec_timeout_s)
            session, _ = await processes.start(context, spec)
            log.info("template.started", workspace_id=workspace_id, process_id=session.process_id)
        if not ready:
            return
        deadline = time.monotonic() + settings.template_ready_timeout_s
        said = ""
        while True:
            spec = ExecSpec(
                command=ready,
                stdin_closed=True,
                timeout_s=_READY_TRY_S,
                yield_after_s=_READY_TRY_S + 5,
                max_output_bytes=_READY_OUTPUT_BYTES,
            )
            session, started = await processes.start(context, spec)
            output = b""
            status: ExitStatus | None = None
            try:
                async with contextlib.aclosing(session.exec_events(started)) as events:
                    async for event in events:
                        if isinstance(event, OutputChunk):
                            output = (output + event.data)[-_READY_OUTPUT_KEPT:]  # its end says why
                        elif isinstance(event, ExitStatus):
                            status = event
            finally:
                # The daemon's own command: no caller polls it, so it leaves no session behind.
                processes.drop(session)
                await session.discard()
            if status is not None and status.exit_code == 0:
                return
            said = output.decode(errors="replace")
            if time.monotonic() >= deadline:
                code = "no exit" if status is None else f"exit {status.exit_code}"
                msg = (
                    f"the template's ready command did not succeed within {settings.template_ready_timeout_s:g} s "
                    f"(last: {code}; output: {said!r})"
                )
                raise FailedPreconditionError(msg)
            await asyncio.sleep(_READY_PAUSE_S)

    async def find(self, name: str) -> ImageInfo | None:
        """The caller's template ``name`` (a snapshot it built, not one taken of a workspace), or None."""
        with contextlib.suppress(NotFoundError, InvalidSpecError):
            image = await self.snapshots.find(name)
            return image if image.labels.get(LABEL_TEMPLATE_DIGEST) else None
        return None

    async def _existing(self, name: str) -> ImageInfo | None:
        with contextlib.suppress(NotFoundError):
            return await self.snapshots.find(name)
        return None

    async def _check_bases(self, bases: tuple[str, ...]) -> None:
        """Refuse, naming it, a FROM image the engine has not and cannot pull, or a snapshot."""
        backend = self.snapshots.backend
        for image in bases:
            info = await backend.image_info(image)
            if info is None:
                try:
                    info = await backend.pull_image(image)
                except ImageNotFoundError as exc:
                    msg = f"the Dockerfile's base image {image!r} is not on the engine and could not be pulled: {exc}"
                    raise ImageNotFoundError(msg) from None
            if info.labels.get(LABEL_SNAPSHOT):
                # A snapshot is reached by its tenant's name for it, never by its image reference.
                msg = f"the Dockerfile's base image {image!r} is a snapshot; build FROM images, not snapshots"
                raise InvalidSpecError(msg)


def _theirs(canonical: Canonical, step: int) -> int:
    """The caller's instruction the engine's step ``step`` is (0: the daemon's own, or none)."""
    return canonical.steps[step - 1] if 0 < step <= len(canonical.steps) else 0


def _check(build: TemplateBuild) -> None:
    check_snapshot_name(build.name)
    check_labels(build.labels, "labels")
    if not build.dockerfile.strip():
        msg = "the Dockerfile is empty"
        raise InvalidSpecError(msg)
    if len(build.dockerfile.encode()) > MAX_DOCKERFILE_BYTES:
        msg = f"the Dockerfile is {len(build.dockerfile.encode())} bytes; the limit is {MAX_DOCKERFILE_BYTES}"
        raise InvalidSpecError(msg)
    for field, command in (("start_command", build.start_command), ("ready_command", build.ready_command)):
        if len(command.encode()) > MAX_COMMAND_BYTES or "\x00" in command:
            msg = f"{field} must be at most {MAX_COMMAND_BYTES} bytes with no NUL"
            raise InvalidSpecError(msg)
    if build.working_dir and not build.working_dir.startswith("/"):
        msg = f"working_dir must be absolute, got {build.working_dir[:80]!r}"
        raise InvalidSpecError(msg)
    if build.timeout_s < 0:
        msg = f"timeout must not be negative, got {build.timeout_s}"
        raise InvalidSpecError(msg)


async def _spool(context: AsyncIterator[bytes], archive: Path, limit: int) -> str:
    """Write the context to ``archive`` as it comes, refusing it past ``limit`` bytes; its sha256.

    An empty context is an empty archive; anything else must be an uncompressed tar archive.
    """
    digest = hashlib.sha256()
    size = 0
    with archive.open("wb") as out:
        async for chunk in context:
            size += len(chunk)
            if size > limit:
                msg = f"the build context is past the limit of {limit} bytes (SANDBOXD_TEMPLATE_CONTEXT_BYTES)"
                raise QuotaExceededError(msg)
            digest.update(chunk)
            await asyncio.to_thread(out.write, chunk)
    if size == 0:
        with tarfile.open(archive, "w"):
            pass
    elif not await asyncio.to_thread(_is_plain_tar, archive):
        msg = "the build context is not an uncompressed tar archive"
        raise InvalidSpecError(msg)
    return digest.hexdigest()


class BoundedTarInfo(tarfile.TarInfo):
    """A tar member whose own metadata (a long name, pax headers) is at most 64 KiB.

    ``tarfile`` reads such metadata into memory whole: a small compressed archive could
    otherwise ask for gigabytes of it.
    """

    _METADATA = frozenset({tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE})
    MAX_METADATA_BYTES = 64 * 1024

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in self._METADATA and self.size > self.MAX_METADATA_BYTES:
            msg = f"a tar header of {self.size} bytes (a long name or pax header): at most {self.MAX_METADATA_BYTES}"
            raise tarfile.ReadError(msg)
        return super()._proc_member(tarfile_)  # type: ignore[misc, no-any-return]


def _is_plain_tar(archive: Path) -> bool:
    try:
        with tarfile.open(archive, "r:", tarinfo=BoundedTarInfo) as tar:
            for _member in tar:
                pass
    except (tarfile.TarError, OSError, EOFError):
        return False
    return True


def _digest(build: TemplateBuild, context_digest: str) -> str:
    described = json.dumps(
        {
            "dockerfile": build.dockerfile,
            "context": context_digest,
            "start": build.start_command,
            "ready": build.ready_command,
            "working_dir": build.working_dir,
            "labels": dict(sorted(build.labels.items())),
        },
        sort_keys=True,
    )
    return hashlib.sha256(described.encode()).hexdigest()


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
