"""Find or build the default workspace image, with or without a container registry.

The recipe is ``images/base`` (shipped as the ``sandboxd_images`` package). Its
Dockerfile takes the Debian base as a build argument: from a registry
(``debian:bookworm-slim``) or, offline, a root filesystem made by
``debootstrap`` from Debian's package mirror and imported into Docker
(the same result either way).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.resources
import os
import shutil
import subprocess
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path

import structlog

from .backend.base import Backend
from .errors import BackendError, ImageNotFoundError
from .settings import ImageRoute

__all__ = [
    "OFFLINE_BASE",
    "RECIPE_LABEL",
    "REGISTRY_BASE",
    "e2b_image_ref",
    "egress_image_ref",
    "ensure_base_image",
    "ensure_default_image",
    "ensure_e2b_image",
    "ensure_egress_image",
    "recipe_digest",
    "recipe_dir",
]

log = structlog.get_logger(__name__)

REGISTRY_BASE = "debian:bookworm-slim"
OFFLINE_BASE = "sandboxd/debian:bookworm"
RECIPE_LABEL = "sandboxd.image.recipe"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"

Progress = Callable[[str], None]


def recipe_dir(name: str = "base") -> Path:
    """Return the directory holding image recipe ``name``."""
    return Path(str(importlib.resources.files("sandboxd_images") / name))


def recipe_digest(name: str = "base") -> str:
    """Return a sha256 over the recipe's files (names and contents), stable across machines."""
    root = recipe_dir(name)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def build_lines(progress: Progress, name: str) -> Callable[[str], None]:
    """Where one build's own output goes: indented under the headlines, and marked with ``name``.

    Two builds may run at once: the mark tells their lines apart.
    """
    return lambda line: progress(f"  [{name}] {line}")


async def _build(backend: Backend, recipe: str, ref: str, *, base: str, progress: Progress) -> None:
    """Build recipe ``recipe`` (``images/RECIPE``) FROM ``base`` as ``ref``, labelled with its digest."""
    with importlib.resources.as_file(importlib.resources.files("sandboxd_images") / recipe) as context:
        await backend.build_image(
            Path(context),
            ref,
            build_args={"BASE_IMAGE": base},
            labels={RECIPE_LABEL: recipe_digest(recipe)},
            on_line=build_lines(progress, recipe),
        )


async def ensure_default_image(
    backend: Backend, ref: str, *, route: ImageRoute, progress: Progress, force: bool = False
) -> str:
    """Return ``ref`` once it exists and matches the current recipe, building it if needed.

    Args:
        backend: the container engine.
        ref: tag of the workspace image (e.g. ``sandboxd/base:bookworm``).
        route: ``registry``, ``offline`` or ``auto`` (registry first, then offline).
        progress: called with one human-readable line per step.
        force: rebuild even when an up-to-date image exists.

    Raises:
        BackendError: the build failed.
        ImageNotFoundError: no route could provide the Debian base.
    """
    digest = recipe_digest()
    info = await backend.image_info(ref)
    if info is not None and info.labels.get(RECIPE_LABEL) == digest and not force:
        progress(f"workspace image {ref} is up to date (recipe {digest[:12]}; --force rebuilds it)")
        return ref
    progress(f"building workspace image {ref} (recipe {digest[:12]}); this takes a minute or two the first time")
    base = await ensure_base_image(backend, route=route, progress=progress)
    await _build(backend, "base", ref, base=base, progress=progress)
    progress(f"workspace image {ref} is ready")
    log.info("image.built", image=ref, base=base, recipe=digest[:12])
    return ref


EGRESS_RECIPE = "egress_proxy"
EGRESS_REPOSITORY = "sandboxd/egress-proxy"


def egress_image_ref() -> str:
    """The egress proxy's image for this release: its repository, tagged with its recipe's digest."""
    return f"{EGRESS_REPOSITORY}:{recipe_digest(EGRESS_RECIPE)[:16]}"


async def ensure_egress_image(backend: Backend, *, route: ImageRoute, progress: Progress) -> str:
    """Return the egress proxy's image (``images/egress_proxy``: Debian's squid), building it if missing.

    Built from the same Debian base as the workspace image, so offline too.

    Raises:
        BackendError: the build failed.
        ImageNotFoundError: no route could provide the Debian base.
    """
    ref = egress_image_ref()
    if await backend.image_info(ref) is not None:
        return ref
    progress(f"building the egress proxy image {ref} (Debian's squid); this takes a minute the first time")
    base = await ensure_base_image(backend, route=route, progress=progress)
    await _build(backend, EGRESS_RECIPE, ref, base=base, progress=progress)
    progress(f"egress proxy image {ref} is ready")
    log.info("image.built", image=ref, base=base)
    return ref


E2B_RECIPE = "e2b"
E2B_REPOSITORY = "sandboxd/e2b-base"


def e2b_image_ref() -> str:
    """E2B's base template's image: tagged with its recipe's digest and the default image's."""
    both = hashlib.sha256(f"{recipe_digest(E2B_RECIPE)}\0{recipe_digest()}".encode()).hexdigest()
    return f"{E2B_REPOSITORY}:{both[:16]}"


async def ensure_e2b_image(backend: Backend, default_image: str, *, route: ImageRoute, progress: Progress) -> str:
    """Return the image of E2B's ``base`` template (``images/e2b``), building it if missing.

    It is the default workspace image (``default_image``, built first if needed) with E2B's
    user, home and ``python``; nothing is fetched for it.

    Raises:
        BackendError: the build failed.
        ImageNotFoundError: no route could provide the Debian base.
    """
    ref = e2b_image_ref()
    if await backend.image_info(ref) is not None:
        return ref
    base = await ensure_default_image(backend, default_image, route=route, progress=progress)
    progress(f"building E2B's base template image {ref} from {base}")
    await _build(backend, E2B_RECIPE, ref, base=base, progress=progress)
    log.info("image.built", image=ref, base=base)
    return ref


_base_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()
"""One lock per event loop: builds that run at once (the workspace image and the agent's
toolchain) wait for one Debian base instead of each making its own."""


async def ensure_base_image(backend: Backend, *, route: ImageRoute, progress: Progress) -> str:
    """Return a Debian bookworm base image reference, pulling or debootstrapping it.

    Calls made at once share one pull or debootstrap.
    """
    async with _base_locks.setdefault(asyncio.get_running_loop(), asyncio.Lock()):
        return await _ensure_base_image(backend, route=route, progress=progress)


async def _ensure_base_image(backend: Backend, *, route: ImageRoute, progress: Progress) -> str:
    if route in {"auto", "registry"}:
        if await backend.image_info(REGISTRY_BASE) is not None:
            return REGISTRY_BASE
        if route == "auto" and await backend.image_info(OFFLINE_BASE) is not None:
            return OFFLINE_BASE  # made here before: the same base, without asking a registry again
        progress(f"pulling {REGISTRY_BASE}")
        try:
            await backend.pull_image(REGISTRY_BASE)
        except ImageNotFoundError as exc:
            if route == "registry":
                raise
            progress(f"no registry ({exc.message}); building the base offline from Debian packages")
        else:
            return REGISTRY_BASE
    if await backend.image_info(OFFLINE_BASE) is not None:
        return OFFLINE_BASE
    with tempfile.TemporaryDirectory(prefix="sandboxd-rootfs-") as tmp:
        tarball = Path(tmp) / "rootfs.tar"
        await asyncio.to_thread(debootstrap_tarball, tarball, progress=progress)
        progress(f"importing the root filesystem as {OFFLINE_BASE}")
        await backend.import_image(tarball, OFFLINE_BASE)
    return OFFLINE_BASE


def _privileged(argv: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return argv
    if shutil.which("sudo"):
        return ["sudo", "-n", *argv]
    msg = f"building the offline base needs root: run `sudo {' '.join(argv[:1])} ...` or the build as root"
    raise BackendError(msg)


def _run(argv: list[str], progress: Progress, what: str) -> None:
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    assert process.stdout is not None
    tail: list[str] = []
    for line in process.stdout:
        line = line.rstrip()
        tail = [*tail[-19:], line]
        if line:
            progress(f"  {line}")
    if process.wait() != 0:
        msg = f"{what} failed (exit {process.returncode}): " + " | ".join(tail[-5:])
        raise BackendError(msg)


def debootstrap_tarball(
    tarball: Path, *, progress: Progress, suite: str = DEBIAN_SUITE, mirror: str = DEBIAN_MIRROR
) -> None:
    """Write a minimal Debian root filesystem to ``tarball`` using debootstrap.

    Installs Debian's ``debootstrap`` package first when it is missing and the
    process may (root). Blocking; run it in a thread.

    Raises:
        BackendError: debootstrap is missing and cannot be installed, or it failed.
    """
    if shutil.which("debootstrap") is None and not Path("/usr/sbin/debootstrap").exists():
        if shutil.which("apt-get") is None:
            msg = "the offline image route needs debootstrap (Debian package `debootstrap`), which is not installed"
            raise BackendError(msg)
        progress("installing Debian's debootstrap package")
        _run(_privileged(["apt-get", "install", "-y", "--no-install-recommends", "debootstrap"]), progress, "apt-get")
    rootfs = tarball.parent / "rootfs"
    progress(f"debootstrap {suite} (minbase) from {mirror}")
    try:
        _run(_privileged(["debootstrap", "--variant=minbase", suite, str(rootfs), mirror]), progress, "debootstrap")
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            _run(_privileged(["find", str(rootfs / leftover), "-type", "f", "-delete"]), progress, "cleanup")
        progress("packing the root filesystem")
        _run(_privileged(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tarball), "."]), progress, "tar")
        if os.geteuid() != 0:
            _run(["sudo", "-n", "chown", str(os.getuid()), str(tarball)], progress, "chown")
    finally:
        with contextlib.suppress(BackendError):
            _run(_privileged(["rm", "-rf", "--one-file-system", str(rootfs)]), progress, "cleanup")
