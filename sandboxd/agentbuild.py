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

import hashlib
import importlib.resources
from collections.abc import Callable
from pathlib import Path

import structlog

from .agent.paths import AGENT_MOUNT, AGENT_PATH
from .backend.base import Backend
from .errors import BackendError
from .images import ensure_base_image, recipe_digest, recipe_dir
from .settings import ImageRoute

__all__ = [
    "AGENT_IMAGE",
    "AGENT_MOUNT",
    "AGENT_PATH",
    "AgentBuild",
    "agent_digest",
    "ensure_agent",
]

log = structlog.get_logger(__name__)

AGENT_IMAGE = "sandboxd/agent"
"""Repository of the agent images; the tag is the digest's first 16 hex digits."""

BUILDER_IMAGE = "sandboxd/agent-builder"
DIGEST_LABEL = "sandboxd.agent.digest"
_SOURCE_SUFFIXES = (".go", ".mod", "Dockerfile")

Progress = Callable[[str], None]


def _source_dir() -> Path:
    return Path(str(importlib.resources.files("sandboxd_agent")))


def agent_digest() -> str:
    """A sha256 over the agent's sources and its builder's recipe (names and contents)."""
    root = _source_dir()
    digest = hashlib.sha256(recipe_digest("agent_builder").encode() + b"\0")
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(_SOURCE_SUFFIXES)):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


class AgentBuild:
    """One version of the agent: its image, its volume, and the binary path for an architecture."""

    def __init__(self, digest: str) -> None:
        """Name everything after ``digest``."""
        self.digest = digest
        self.tag = digest[:16]
        self.image = f"{AGENT_IMAGE}:{self.tag}"
        self.volume = f"sandboxd-agent-{self.tag}"

    @staticmethod
    def binary_dir(architecture: str) -> str:
        """The image's directory holding the binary for an engine architecture (``x86_64``, ``aarch64``)."""
        arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(architecture)
        if arch is None:
            msg = f"the agent is built for amd64 and arm64 engines; this engine is {architecture}"
            raise BackendError(msg)
        return f"/linux-{arch}"


async def _ensure_builder(backend: Backend, route: ImageRoute, progress: Progress) -> str:
    digest = recipe_digest("agent_builder")
    ref = f"{BUILDER_IMAGE}:{digest[:16]}"
    info = await backend.image_info(ref)
    if info is not None:
        return ref
    progress(f"building the agent's toolchain image {ref} (Debian's Go); this takes a minute the first time")
    base = await ensure_base_image(backend, route=route, progress=progress)
    await backend.build_image(
        recipe_dir("agent_builder"),
        ref,
        build_args={"BASE_IMAGE": base},
        labels={"sandboxd.image.recipe": digest},
        on_line=lambda line: progress(f"  {line}"),
    )
    return ref


async def ensure_agent(backend: Backend, *, route: ImageRoute, progress: Progress, test: bool = False) -> AgentBuild:
    """Return the current agent, building its image and filling its volume when missing.

    Args:
        backend: the container engine.
        route: where the Debian base comes from when the toolchain image must be built.
        progress: called with one human-readable line per step.
        test: run the agent's Go tests (vet, race detector) and make the image from the
            tested stage. The engine's build cache keys that stage on the exact source and
            toolchain, as Go's test cache would: a source this engine already tested (a fresh
            clone of a tested commit) is not tested again, and a failed run is never cached.
            Without it a missing image is built from the ``agent`` stage, which runs no
            test: the tests belong to ``./dev test`` and CI, not to a user's first start.

    Raises:
        BackendError: a build failed (its last lines are in the message).
    """
    build = AgentBuild(agent_digest())
    if test or await backend.image_info(build.image) is None:
        builder = await _ensure_builder(backend, route, progress)
        with importlib.resources.as_file(importlib.resources.files("sandboxd_agent")) as source:
            if test:
                progress("testing the agent (go vet, go test -race)")
                await backend.build_image(
                    Path(source),
                    f"{AGENT_IMAGE}-test:{build.tag}",
                    build_args={"BUILDER": builder, "VERSION": build.tag},
                    labels={DIGEST_LABEL: build.digest},
                    on_line=lambda line: progress(f"  {line}"),
                    target="test",
                )
                await backend.remove_image(f"{AGENT_IMAGE}-test:{build.tag}")
            if await backend.image_info(build.image) is None:
                progress(f"building the agent {build.image} (linux/amd64, linux/arm64, windows/amd64)")
                await backend.build_image(
                    Path(source),
                    build.image,
                    build_args={"BUILDER": builder, "VERSION": build.tag},
                    labels={DIGEST_LABEL: build.digest},
                    on_line=lambda line: progress(f"  {line}"),
                    target="" if test else "agent",
                )
                log.info("agent.built", image=build.image, tested=test)
    architecture = await backend.architecture()
    await backend.fill_volume(
        build.volume,
        image=build.image,
        path=AgentBuild.binary_dir(architecture),
        labels={DIGEST_LABEL: build.digest},
    )
    return build
