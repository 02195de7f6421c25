"""Build the in-container agent and deliver it to the engine, with nothing but Docker.

The agent's Go sources ship with the daemon (``agent/``, packaged as
``sandboxd_agent``). Building needs no Go on the host: a builder image
(``images/agent_builder``: Debian bookworm's Go, built FROM the same Debian base as
the workspace image) compiles them in a ``docker build`` (``agent/Dockerfile``) into
an image holding only the binaries, tagged by a digest of the sources and the
builder recipe. Workspaces get the binary from a named volume per digest, filled
from that image and mounted read-only at ``/.sandboxd``: the workspace image is never
modified, and this works with a remote engine and with the daemon in Docker.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import structlog

from .agent.paths import AGENT_MOUNT, AGENT_PATH
from .backend.base import Backend
from .errors import BackendError
from .images import build_lines, ensure_base_image, recipe_digest, recipe_dir
from .settings import ImageRoute

__all__ = [
    "AGENT_IMAGE",
    "AGENT_MOUNT",
    "AGENT_PATH",
    "ALL_TARGETS",
    "AgentBuild",
    "agent_digest",
    "ensure_agent",
    "ensure_agent_image",
]

log = structlog.get_logger(__name__)

AGENT_IMAGE = "sandboxd/agent"
"""Repository of the agent images; the tag is the digest's first 16 hex digits."""

BUILDER_IMAGE = "sandboxd/agent-builder"
DIGEST_LABEL = "sandboxd.agent.digest"
_SOURCE_SUFFIXES = (".go", ".mod", "Dockerfile")
ALL_TARGETS = ("linux/amd64", "linux/arm64", "windows/amd64")
"""What a tested build compiles: every platform the agent supports (Windows for its tree kill)."""

Progress = Callable[[str], None]


def _source_dir() -> Path:
    return Path(str(importlib.resources.files("sandboxd_agent")))


def _sources(root: Path) -> list[Path]:
    """The agent's source files under ``root``, in a stable order: what its digest covers."""
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(_SOURCE_SUFFIXES))


def agent_digest() -> str:
    """A sha256 over the agent's sources and its builder's recipe (names and contents)."""
    root = _source_dir()
    digest = hashlib.sha256(recipe_digest("agent_builder").encode() + b"\0")
    for path in _sources(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


@contextlib.contextmanager
def _build_context(version: str, targets: Sequence[str]) -> Iterator[Path]:
    """A directory holding the agent's sources and ``build.env`` (its version and platforms).

    Given as a file, not as build arguments: each argument the Dockerfile declares is one
    more step that the legacy builder commits, seconds each on a large toolchain image.
    """
    with tempfile.TemporaryDirectory(prefix="sandboxd-agent-") as tmp:
        context = Path(tmp)
        with importlib.resources.as_file(importlib.resources.files("sandboxd_agent")) as source:
            for path in _sources(Path(source)):
                target = context / path.relative_to(source)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
        (context / "build.env").write_text(f"VERSION={version}\nTARGETS='{' '.join(targets)}'\n")
        yield context


class AgentBuild:
    """One version of the agent: its image, its volume, and the binary path for an architecture."""

    def __init__(self, digest: str) -> None:
        """Name everything after ``digest``."""
        self.digest = digest
        self.tag = digest[:16]
        self.image = f"{AGENT_IMAGE}:{self.tag}"
        self.volume = f"sandboxd-agent-{self.tag}"

    @staticmethod
    def target(architecture: str) -> str:
        """The Go platform of an engine architecture (``x86_64`` -> ``linux/amd64``, ``aarch64``...).

        Raises:
            BackendError: the agent is not built for that architecture.
        """
        arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(architecture)
        if arch is None:
            msg = f"the agent is built for amd64 and arm64 engines; this engine is {architecture}"
            raise BackendError(msg)
        return f"linux/{arch}"

    @staticmethod
    def binary_dir(architecture: str) -> str:
        """The image's directory holding the binary for an engine architecture (``x86_64``, ``aarch64``)."""
        return "/" + AgentBuild.target(architecture).replace("/", "-")


async def _ensure_builder(backend: Backend, route: ImageRoute, progress: Progress) -> str:
    digest = recipe_digest("agent_builder")
    ref = f"{BUILDER_IMAGE}:{digest[:16]}"
    info = await backend.image_info(ref)
    if info is not None:
        return ref
    base = await ensure_base_image(backend, route=route, progress=progress)
    progress(f"building the agent's toolchain image {ref} (Debian's Go); this takes a minute the first time")
    # No labels: the tag names the recipe, and each label would be one more committed step.
    await backend.build_image(
        recipe_dir("agent_builder"),
        ref,
        build_args={"BASE_IMAGE": base},
        labels={},
        on_line=build_lines(progress, "agent-builder"),
    )
    return ref


async def ensure_agent(backend: Backend, *, route: ImageRoute, progress: Progress, test: bool = False) -> AgentBuild:
    """Return the current agent, building its image and filling its volume when missing.

    The image comes from :func:`ensure_agent_image`; the volume is filled by a short-lived
    container.

    Raises:
        BackendError: a build failed (its last lines are in the message), or the engine's
            architecture is not one the agent is built for.
    """
    build, architecture = await ensure_agent_image(backend, route=route, progress=progress, test=test)
    await backend.fill_volume(
        build.volume,
        image=build.image,
        path=AgentBuild.binary_dir(architecture),
        labels={DIGEST_LABEL: build.digest},
    )
    return build


async def ensure_agent_image(
    backend: Backend, *, route: ImageRoute, progress: Progress, test: bool = False
) -> tuple[AgentBuild, str]:
    """Return the current agent and the engine's architecture once the agent's image exists.

    Building it runs no container of its own (``docker build`` alone), so it may run before a
    daemon holds its instance's lease, at once with the workspace image's build.

    Args:
        backend: the container engine.
        route: where the Debian base comes from when the toolchain image must be built.
        progress: called with one human-readable line per step.
        test: run the agent's Go tests (vet, race detector) and make the image from the
            tested stage, with the binaries of every platform (:data:`ALL_TARGETS`). The
            engine's build cache keys that stage on the exact source and toolchain, as Go's
            test cache would: a source this engine already tested (a fresh clone of a tested
            commit) is not tested again, and a failed run is never cached. Without it a
            missing image is built from the ``agent`` stage, which runs no test, for the
            engine's own platform alone: the tests and the other platforms belong to
            ``./dev test`` and CI, not to a user's first start.

    Raises:
        BackendError: a build failed (its last lines are in the message), or the engine's
            architecture is not one the agent is built for.
    """
    build = AgentBuild(agent_digest())
    architecture = await backend.architecture()
    targets = ALL_TARGETS if test else (AgentBuild.target(architecture),)
    if test or await backend.image_info(build.image) is None:
        builder = await _ensure_builder(backend, route, progress)
        args = {"BUILDER": builder}
        with _build_context(build.tag, targets) as context:
            if test:
                progress("testing the agent (go vet, go test -race)")
                await backend.build_image(
                    context,
                    f"{AGENT_IMAGE}-test:{build.tag}",
                    build_args=args,
                    labels={DIGEST_LABEL: build.digest},
                    on_line=build_lines(progress, "agent"),
                    target="test",
                )
                await backend.remove_image(f"{AGENT_IMAGE}-test:{build.tag}")
            if await backend.image_info(build.image) is None:
                progress(f"building the agent {build.image} ({', '.join(targets)})")
                await backend.build_image(
                    context,
                    build.image,
                    build_args=args,
                    labels={DIGEST_LABEL: build.digest},
                    on_line=build_lines(progress, "agent"),
                    target="" if test else "agent",
                )
                log.info("agent.built", image=build.image, tested=test, targets=targets)
    return build, architecture
