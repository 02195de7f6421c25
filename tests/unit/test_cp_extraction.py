"""`sandboxctl cp` out of a workspace: a hostile archive never writes outside the destination."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from sandboxd_client.cli import _Extraction
from sandboxd_client.errors import SandboxError


def _archive(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _entry(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info


def _extract(data: bytes, base: Path, rename: str | None = None) -> None:
    extraction = _Extraction(base, rename, archive=False)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
        for member in tar:
            extraction.extract(tar, member)


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host file the archive tries to reach, next to the destination."""
    (tmp_path / "victim.txt").write_text("host original\n")
    (tmp_path / "dest").mkdir()
    return tmp_path


def test_hard_link_to_a_host_path_then_a_write_through_it(host: Path) -> None:
    """The forged-download attack: `loot` hard-linked to a host file, then `loot` written."""
    data = _archive(
        (_entry("loot", tarfile.DIRTYPE), None),
        (_entry("loot/x", tarfile.LNKTYPE, linkname=str(host / "victim.txt")), None),
        (_entry("loot/x"), b"PWNED\n"),
    )
    with pytest.raises(SandboxError, match="refusing"):
        _extract(data, host / "dest")
    assert (host / "victim.txt").read_text() == "host original\n"


def test_symlink_out_then_a_file_through_it(host: Path) -> None:
    data = _archive(
        (_entry("t", tarfile.SYMTYPE, linkname=str(host)), None),
        (_entry("t/victim.txt"), b"PWNED\n"),
    )
    with pytest.raises(SandboxError, match="is a link or a file, not a directory"):
        _extract(data, host / "dest")
    assert (host / "victim.txt").read_text() == "host original\n"


def test_a_file_replaces_a_symlink_of_the_same_name_instead_of_following_it(host: Path) -> None:
    data = _archive(
        (_entry("v", tarfile.SYMTYPE, linkname=str(host / "victim.txt")), None),
        (_entry("v"), b"new content\n"),
    )
    _extract(data, host / "dest")
    assert (host / "victim.txt").read_text() == "host original\n"
    assert not (host / "dest" / "v").is_symlink()
    assert (host / "dest" / "v").read_text() == "new content\n"


@pytest.mark.parametrize("name", ["../victim.txt", "/tmp/abs.txt", "a/../../victim.txt"])
def test_names_outside_are_refused(host: Path, name: str) -> None:
    with pytest.raises(SandboxError, match="would land outside the destination"):
        _extract(_archive((_entry(name), b"PWNED\n")), host / "dest")
    assert (host / "victim.txt").read_text() == "host original\n"


def test_renamed_copy_keeps_its_hard_links_inside_itself(host: Path) -> None:
    """`cp WS:/workspace/project ./project-copy` next to a host `project`: links follow the rename."""
    (host / "project").mkdir()
    (host / "project" / "notes.txt").write_text("HOST ORIGINAL\n")
    data = _archive(
        (_entry("project", tarfile.DIRTYPE), None),
        (_entry("project/notes.txt"), b"from the workspace\n"),
        (_entry("project/zz-link", tarfile.LNKTYPE, linkname="project/notes.txt"), None),
    )
    _extract(data, host, rename="project-copy")
    copy = host / "project-copy"
    assert os.stat(copy / "zz-link").st_ino == os.stat(copy / "notes.txt").st_ino
    assert os.stat(copy / "zz-link").st_ino != os.stat(host / "project" / "notes.txt").st_ino
    assert (host / "project" / "notes.txt").read_text() == "HOST ORIGINAL\n"
    assert (copy / "notes.txt").stat().st_uid == os.getuid()


def test_symlinks_are_kept_as_they_are(host: Path) -> None:
    """As `docker cp`: a symlink is copied as a symlink, even an absolute one (nothing follows it)."""
    data = _archive((_entry("abs", tarfile.SYMTYPE, linkname="/etc/passwd"), None))
    _extract(data, host / "dest")
    assert os.readlink(host / "dest" / "abs") == "/etc/passwd"
