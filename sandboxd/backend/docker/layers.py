"""A snapshot's image made from what changed, at the cost of the bytes changed.

``docker commit`` on this engine's storage driver (``fuse-overlayfs``, whose graph driver
has no diff of its own: moby's NaiveDiffDriver) compares the container's whole root
filesystem with its image's, file by file: 2.5 s for a container that changed one file,
whatever it changed. Yet the container's own layer, its overlay upper directory, holds
exactly what changed. So where the daemon sees that directory (on the engine's host, as
root), a snapshot's one new layer is written from it directly: the upper directory as a
layer archive (overlay whiteouts turned into the archive's ``.wh.`` entries), then the
workspace's /workspace volume under ``workspace/``; and it is given to the engine with
``docker load`` as one layer on top of the container's image, whose layers the engine has
(it skips a layer it holds: moby image/tarexport/load.go). The layer is spooled to a file
beside the engine's data, never held in memory.

Everything here but :func:`load_archive` is plain file work, run off the event loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
"""An archive's marker of a directory that hides what lower layers hold in it (the OCI layer format)."""
_OVERLAY_OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque", "user.fuseoverlayfs.opaque")
_OVERLAY_OWN = (".wh..opq", OPAQUE)
"""Names the overlay keeps in an upper directory for itself (fuse-overlayfs writes both for an
opaque directory); the archive says the same with one ``OPAQUE`` entry."""
WORKSPACE = "workspace"
UPPER_DRIVERS = frozenset({"fuse-overlayfs", "overlay2", "overlay"})
"""Storage drivers that keep a container's changes, and each image layer, as a plain directory."""
CHUNK = 1024 * 1024


class TooBig(Exception):
    """The layer ran past its bound."""


class _Hashing(io.RawIOBase):
    """A file that hashes and counts what is written through it, and stops at a bound."""

    def __init__(self, out: IO[bytes], limit: int) -> None:
        self.out = out
        self.limit = limit
        self.digest = hashlib.sha256()
        self.size = 0
        self.over = False

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if self.over or self.out.closed:
            return len(view)  # the archive's own last writes, as it is dropped: they go nowhere
        self.size += len(view)
        if self.limit and self.size > self.limit:
            self.over = True
            raise TooBig
        self.digest.update(view)
        self.out.write(view)
        return len(view)


def _in(directory: int, name: str) -> str:
    """A path to ``name`` in the open directory ``directory`` that no symbolic link above it can move.

    The last component is never followed by the calls this module makes with it (``lstat``,
    ``O_NOFOLLOW``, ``follow_symlinks=False``).
    """
    return f"/proc/self/fd/{directory}/{name}"


def _opaque(directory: int, name: str) -> bool:
    path = _in(directory, name)
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        names = []
    for key in _OVERLAY_OPAQUE_XATTRS:
        if key in names:
            with contextlib.suppress(OSError):
                if os.getxattr(path, key, follow_symlinks=False) == b"y":
                    return True
    return any(os.path.lexists(os.path.join(path, mark)) for mark in _OVERLAY_OWN)


class _Padded(io.RawIOBase):
    """A file read for exactly the length its header said: a file that shrank meanwhile ends in zeros."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self.raw.read()
        chunks, got = [], 0
        while got < size:
            data = self.raw.read(size - got)
            if not data:
                chunks.append(bytes(size - got))
                break
            chunks.append(data)
            got += len(data)
        return b"".join(chunks)


def _add(archive: tarfile.TarFile, directory: int, name: str, entry: str) -> None:
    """Add one entry (not what a directory holds) with its extended attributes, as ``docker commit`` keeps them.

    Its metadata is read without following it; a regular file is opened ``O_NOFOLLOW`` and its
    header taken from the descriptor, so that a workspace swapping it for a symbolic link
    meanwhile (/workspace is read while it runs) gets no file of the host's into the archive:
    it is archived as what it was when opened, or not at all.
    """
    path = _in(directory, name)
    try:
        info = archive.gettarinfo(path, arcname=entry)
    except FileNotFoundError:
        return  # removed meanwhile
    if info is None:
        return  # a socket: no archive holds one (nor does a commit)
    xattrs = {}
    with contextlib.suppress(OSError):
        for key in os.listxattr(path, follow_symlinks=False):
            if key.startswith(("security.", "user.")) and not key.startswith("user.fuseoverlayfs"):
                value = os.getxattr(path, key, follow_symlinks=False)
                xattrs[f"SCHILY.xattr.{key}"] = value.decode("utf-8", "surrogateescape")
    if not info.isreg() or info.islnk():
        if xattrs:
            info.pax_headers = {**info.pax_headers, **xattrs}
        archive.addfile(info)
        return
    try:
        descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
    except OSError:
        return  # swapped for a link, a FIFO or nothing meanwhile: not a file of this moment
    with os.fdopen(descriptor, "rb") as data:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return
        opened = archive.gettarinfo(arcname=entry, fileobj=data)
        if opened.islnk():
            archive.addfile(opened)  # a hard link to an entry already archived
            return
        if xattrs:
            opened.pax_headers = {**opened.pax_headers, **xattrs}
        archive.addfile(opened, _Padded(data))


MAX_DEPTH = 256
"""Deepest directory the host-side walk descends to (it holds one descriptor a level); deeper trees
are committed by the engine instead (:class:`TooDeep`)."""


class TooDeep(Exception):
    """A tree deeper than ``MAX_DEPTH``: this module does not archive it."""


def _walk(archive: tarfile.TarFile, root: str, prefix: str, *, upper: bool, skip_top: frozenset[str]) -> None:
    """Archive what is under ``root`` as ``prefix/...``; an overlay upper directory's whiteouts as ``.wh.`` entries.

    Directories are walked by descriptor, each opened ``O_NOFOLLOW`` from its parent's, so that
    nothing a workspace moves meanwhile (a directory swapped for a link) takes the walk out of
    ``root``; without recursion, to ``MAX_DEPTH`` levels. An entry that vanishes meanwhile is
    left out.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    top = os.open(root, flags)
    # Each frame: a directory's descriptor, its path in the archive, the subdirectories still to walk.
    stack: list[tuple[int, str, list[str]]] = []
    try:
        pending = [(top, ".")]
        while pending or stack:
            if pending:
                descriptor, relative = pending.pop()
                if len(stack) >= MAX_DEPTH:
                    os.close(descriptor)
                    raise TooDeep
                children = _archive_directory(archive, descriptor, relative, prefix, upper=upper, skip=skip_top)
                stack.append((descriptor, relative, children))
                skip_top = frozenset()
            descriptor, relative, children = stack[-1]
            if not children:
                os.close(descriptor)
                stack.pop()
                continue
            name = children.pop(0)
            try:
                child = os.open(name, flags, dir_fd=descriptor)
            except OSError:
                continue  # gone, or no longer a directory (a link now): not walked into
            pending.append((child, os.path.join(relative, name)))
    finally:
        for descriptor, _relative, _children in stack:
            os.close(descriptor)


def _archive_directory(
    archive: tarfile.TarFile, descriptor: int, relative: str, prefix: str, *, upper: bool, skip: frozenset[str]
) -> list[str]:
    """Archive one directory's entries (not what its subdirectories hold); return its subdirectories' names."""
    with os.scandir(descriptor) as listing:
        names = sorted(entry.name for entry in listing if entry.name not in skip)
    subdirectories = []
    for name in names:
        entry = os.path.normpath(os.path.join(prefix, relative, name))
        if upper and name in _OVERLAY_OWN:
            continue
        try:
            found = os.stat(name, dir_fd=descriptor, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if upper and stat.S_ISCHR(found.st_mode) and found.st_rdev == 0:
            # The overlay's whiteout: the file is deleted in this layer.
            archive.addfile(tarfile.TarInfo(os.path.join(os.path.dirname(entry), WHITEOUT + name)))
            continue
        _add(archive, descriptor, name, entry)
        if stat.S_ISDIR(found.st_mode):
            subdirectories.append(name)
            if upper and _opaque(descriptor, name):
                archive.addfile(tarfile.TarInfo(os.path.join(entry, OPAQUE)))
    return subdirectories


class LayerWriter:
    """One layer archive written to ``out``: an upper directory's changes, then a volume as /workspace.

    Raises TooBig (from any method) once the archive passes ``limit`` bytes (0: no bound).
    """

    def __init__(self, out: IO[bytes], limit: int) -> None:
        self._hashing = _Hashing(out, limit)
        # A stream (``w|``): nothing is sought, and it writes a megabyte at a time.
        self._archive = tarfile.open(  # noqa: SIM115
            fileobj=self._hashing, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK
        )

    def add_upper(self, upper: str) -> None:
        """The root filesystem's changes: the container's upper directory but its /workspace mount point."""
        _walk(self._archive, upper, ".", upper=True, skip_top=frozenset({WORKSPACE}))

    def add_workspace(self, volume: str, limit: int) -> None:
        """The volume ``volume`` (a host directory) as /workspace, as it is; at most ``limit`` bytes more."""
        self._hashing.limit = self._hashing.size + limit if limit else 0
        parent = os.open(os.path.dirname(volume), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _add(self._archive, parent, os.path.basename(volume), WORKSPACE)
        finally:
            os.close(parent)
        _walk(self._archive, volume, WORKSPACE, upper=False, skip_top=frozenset())

    def close(self) -> tuple[str, int]:
        """End the archive; return its diff id and size."""
        self._archive.close()
        return f"sha256:{self._hashing.digest.hexdigest()}", self._hashing.size


def image_config(
    base: Mapping[str, Any], container: Mapping[str, Any], labels: Mapping[str, str], diff_id: str
) -> bytes:
    """The new image's configuration: the container's, as ``docker commit`` makes it, one layer on its image's.

    ``base`` is the image's inspect, ``container`` the container's; its labels are the
    container's with ``labels`` over them (commit merges them so).
    """
    config = dict(container.get("Config") or {})
    config["Labels"] = {**(config.get("Labels") or {}), **labels}
    for transient in ("Hostname", "Domainname", "AttachStdin", "AttachStdout", "AttachStderr", "Tty", "OpenStdin"):
        config.pop(transient, None)
    document = {
        "architecture": base.get("Architecture") or "amd64",
        "os": base.get("Os") or "linux",
        "created": datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z"),
        "config": config,
        "container": container.get("Id", ""),
        "rootfs": {"type": "layers", "diff_ids": [*base["RootFS"]["Layers"], diff_id]},
    }
    return json.dumps(document, sort_keys=True).encode()


def load_archive(layer: IO[bytes], size: int, config: bytes, base_layers: int, tag: str) -> Iterator[bytes]:
    """The ``docker load`` archive of an image whose last layer is ``layer`` (``size`` bytes, from its start).

    The image's other ``base_layers`` layers are named but not sent: the engine holds them.
    """
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps(
        [
            {
                "Config": config_name,
                "RepoTags": [tag],
                "Layers": [f"base{i}/layer.tar" for i in range(base_layers)] + ["new/layer.tar"],
            }
        ]
    ).encode()

    def header(name: str, length: int) -> bytes:
        info = tarfile.TarInfo(name)
        info.size = length
        info.mtime = 0
        return info.tobuf(tarfile.USTAR_FORMAT)

    def padding(length: int) -> bytes:
        return b"\0" * (-length % tarfile.BLOCKSIZE)

    yield header("new/layer.tar", size)
    layer.seek(0)
    sent = 0
    while sent < size:
        chunk = layer.read(min(CHUNK, size - sent))
        if not chunk:
            msg = "the spooled layer is shorter than written"
            raise OSError(msg)
        sent += len(chunk)
        yield chunk
    yield padding(size)
    for name, payload in ((config_name, config), ("manifest.json", manifest)):
        yield header(name, len(payload)) + payload + padding(len(payload))
    yield b"\0" * (2 * tarfile.BLOCKSIZE)


def sync_mount(path: str) -> None:
    """Flush the mount at ``path`` (the container's merged root) to its upper directory.

    What its processes wrote may be held in the host's page cache of the FUSE mount:
    fuse-overlayfs writes it to the upper directory only when the kernel writes it back, and a
    file gVisor's gofer keeps open is never closed to flush it.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if libc.syncfs(descriptor) != 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error), path)
    finally:
        os.close(descriptor)


def readable_upper(container: Mapping[str, Any]) -> Path | None:
    """The upper directory of a container (or an image's top layer) when its driver keeps one this process can read."""
    driver = container.get("GraphDriver") or {}
    if driver.get("Name") not in UPPER_DRIVERS:
        return None
    upper = (driver.get("Data") or {}).get("UpperDir")
    if not upper or not os.access(upper, os.R_OK | os.X_OK):
        return None
    return Path(upper)
