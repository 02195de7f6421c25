"""The snapshot layer written from an overlay upper directory: whiteouts, opaque directories, /workspace, its bound."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from sandboxd.backend.docker import layers

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="an overlay's whiteouts are devices and trusted xattrs")


def _upper(tmp_path: Path) -> Path:
    """An upper directory as fuse-overlayfs leaves it: a new file, a deleted one, an opaque directory."""
    upper = tmp_path / "upper"
    (upper / "etc" / "apt" / "conf.d").mkdir(parents=True)
    (upper / "etc" / "newfile").write_text("new\n")
    os.mknod(upper / "etc" / "issue.net", 0o600 | 0o020000, os.makedev(0, 0))  # a whiteout
    opaque = upper / "etc" / "apt" / "conf.d"
    os.setxattr(opaque, "trusted.overlay.opaque", b"y")
    os.mknod(opaque / ".wh..opq", 0o600 | 0o020000, os.makedev(0, 0))  # fuse-overlayfs's own marks
    (opaque / ".wh..wh..opq").write_text("")
    (opaque / "y").write_text("x\n")
    (upper / "workspace").mkdir()  # the volume's mount point, never the layer's
    (upper / "workspace" / "hidden").write_text("under the mount\n")
    return upper


def _layer(tmp_path: Path, limit: int = 0) -> tuple[list[str], str, int, bytes]:
    volume = tmp_path / "volume"
    volume.mkdir(exist_ok=True)
    (volume / "a").write_text("a\n")
    (volume / "d").mkdir(exist_ok=True)
    os.symlink("a", volume / "link")
    out = io.BytesIO()
    writer = layers.LayerWriter(out, 0)
    writer.add_upper(str(tmp_path / "upper"))
    writer.add_workspace(str(volume), limit)
    diff_id, size = writer.close()
    data = out.getvalue()
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        names = archive.getnames()
    return names, diff_id, size, data


@root_only
def test_whiteouts_and_opaque_directories_become_the_archives_own(tmp_path: Path) -> None:
    _upper(tmp_path)
    names, diff_id, size, data = _layer(tmp_path)
    assert names == [
        "etc",
        "etc/apt",
        "etc/.wh.issue.net",
        "etc/newfile",
        "etc/apt/conf.d",
        "etc/apt/conf.d/.wh..wh..opq",
        "etc/apt/conf.d/y",
        "workspace",
        "workspace/a",
        "workspace/d",
        "workspace/link",
    ]
    import hashlib

    assert (diff_id, size) == (f"sha256:{hashlib.sha256(data).hexdigest()}", len(data))


@root_only
def test_the_workspace_is_bounded_and_a_dropped_archive_writes_nothing_more(tmp_path: Path) -> None:
    _upper(tmp_path)
    big = tmp_path / "volume"
    big.mkdir()
    (big / "blob").write_bytes(os.urandom(3 << 20))
    with pytest.raises(layers.TooBig):
        _layer(tmp_path, limit=1 << 20)


def test_the_load_archive_names_the_base_layers_and_carries_the_new_one() -> None:
    layer = io.BytesIO(b"x" * 1500)
    config = layers.image_config(
        {"Architecture": "amd64", "Os": "linux", "RootFS": {"Layers": ["sha256:a", "sha256:b"]}},
        {"Id": "c1", "Config": {"Labels": {"keep": "1", "over": "old"}, "Hostname": "h", "Env": ["A=1"]}},
        {"over": "new"},
        "sha256:new",
    )
    document = json.loads(config)
    assert document["rootfs"]["diff_ids"] == ["sha256:a", "sha256:b", "sha256:new"]
    assert document["config"]["Labels"] == {"keep": "1", "over": "new"} and "Hostname" not in document["config"]
    archive = b"".join(layers.load_archive(layer, 1500, config, 2, "sandboxd/snapshot:t"))
    with tarfile.open(fileobj=io.BytesIO(archive)) as loaded:
        members = {m.name: loaded.extractfile(m).read() for m in loaded.getmembers()}  # type: ignore[union-attr]
    assert members["new/layer.tar"] == b"x" * 1500
    (manifest,) = json.loads(members["manifest.json"])
    assert manifest["RepoTags"] == ["sandboxd/snapshot:t"]
    assert manifest["Layers"] == ["base0/layer.tar", "base1/layer.tar", "new/layer.tar"]
    assert json.loads(members[manifest["Config"]]) == document


def test_links_fifos_and_sockets_in_the_workspace_are_never_followed(tmp_path: Path) -> None:
    """A link to a host file is archived as the link; a FIFO as a FIFO (no read that hangs); a socket not at all."""
    import socket

    volume = tmp_path / "volume"
    volume.mkdir()
    os.symlink("/etc/passwd", volume / "passwd")
    os.symlink("/", volume / "root")
    os.mkfifo(volume / "fifo")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(volume / "sock"))
    out = io.BytesIO()
    writer = layers.LayerWriter(out, 0)
    writer.add_workspace(str(volume), 0)
    writer.close()
    listener.close()
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as archive:
        members = {m.name: m for m in archive.getmembers()}
    assert sorted(members) == ["workspace", "workspace/fifo", "workspace/passwd", "workspace/root"]
    assert members["workspace/passwd"].issym() and members["workspace/passwd"].linkname == "/etc/passwd"
    assert members["workspace/root"].issym() and members["workspace/fifo"].isfifo()
    assert all(m.size == 0 for m in members.values())


def test_a_file_that_shrinks_while_it_is_read_ends_in_zeros() -> None:
    """The header's length is what is written: the archive stays well formed."""
    padded = layers._Padded(io.BytesIO(b"abc"))
    assert padded.read(5) == b"abc\0\0"
    assert padded.read(4) == b"\0\0\0\0"


def test_a_file_swapped_for_a_link_after_it_was_listed_is_not_followed(tmp_path: Path) -> None:
    """The race a running workspace can make: a file looked at, then swapped for a link to a host file."""
    secret = tmp_path / "secret"
    secret.write_text("HOST-ONLY\n")
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "f").write_text("mine\n")
    out = io.BytesIO()
    writer = layers.LayerWriter(out, 0)
    looked = writer._archive.gettarinfo

    def swap_after(*args, **kwargs):  # type: ignore[no-untyped-def]
        info = looked(*args, **kwargs)
        if info is not None and info.name == "workspace/f" and (volume / "f").is_file():
            (volume / "f").unlink()
            os.symlink(secret, volume / "f")
        return info

    writer._archive.gettarinfo = swap_after  # type: ignore[method-assign]
    writer.add_workspace(str(volume), 0)
    writer.close()
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as archive:
        contents = [archive.extractfile(m).read() for m in archive.getmembers() if m.isreg()]  # type: ignore[union-attr]
    assert not any(b"HOST" in content for content in contents), contents
