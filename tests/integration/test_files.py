"""FileService against the real engine: exact bytes, diffs, symlinks, permissions, images, trees (issue 4)."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import shlex
import socket
import subprocess
import sys
import tarfile

import pytest
from sandboxd_client import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)

pytestmark = pytest.mark.docker


async def raw(workspace, path: str) -> bytes:  # type: ignore[no-untyped-def]
    """The exact bytes of a file, read through the shell (base64, so nothing is decoded)."""
    result = await workspace.exec(f"base64 -w0 {shlex.quote(path)}").wait()
    assert result.exit_code == 0, result.stderr
    return base64.b64decode(result.stdout)


async def put(workspace, path: str, data: bytes) -> None:  # type: ignore[no-untyped-def]
    """Write exact bytes with the Docker SDK (owned by the workspace user), independently of WriteFile."""
    import tarfile

    import docker

    full = path if path.startswith("/") else f"/workspace/{path}"
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo(full.rsplit("/", 1)[1])
        info.size, info.uid, info.gid, info.mode = len(data), 1000, 1000, 0o644
        tar.addfile(info, io.BytesIO(data))
    client = docker.from_env()
    try:
        assert client.containers.get(workspace.info.container_id).put_archive(
            full.rsplit("/", 1)[0] or "/", archive.getvalue()
        )
    finally:
        client.close()


class TestWriteAndEditBytes:
    async def test_no_final_newline_is_kept(self, workspace) -> None:
        """a\\nb\\nc is written exactly; editing c->C keeps it without a final newline, and the diff says so."""
        result = await workspace.write_file("t.txt", "a\nb\nc")
        assert result.created
        assert result.message == "Created /workspace/t.txt (3 lines, 5 bytes)"
        assert await raw(workspace, "t.txt") == b"a\nb\nc"
        edit = await workspace.edit_file("t.txt", "c", "C")
        assert await raw(workspace, "t.txt") == b"a\nb\nC"
        assert edit.replacements == 1
        assert edit.message.startswith("Replaced 1 occurrence(s)")
        assert edit.diff.splitlines() == [
            "--- a/workspace/t.txt",
            "+++ b/workspace/t.txt",
            "@@ -1,3 +1,3 @@",
            " a",
            " b",
            "-c",
            "\\ No newline at end of file",
            "+C",
            "\\ No newline at end of file",
        ]

    async def test_edits_that_touch_the_final_newline(self, workspace) -> None:
        """On a\\nb\\nc\\n: c\\n->C drops the newline; b\\nc\\n->B\\nC\\n keeps it."""
        await put(workspace, "u.txt", b"a\nb\nc\n")
        await workspace.edit_file("u.txt", "c\n", "C")
        assert await raw(workspace, "u.txt") == b"a\nb\nC"
        await put(workspace, "v.txt", b"a\nb\nc\n")
        await workspace.edit_file("v.txt", "b\nc\n", "B\nC\n")
        assert await raw(workspace, "v.txt") == b"a\nB\nC\n"

    async def test_crlf_file_matched_with_lf(self, workspace) -> None:
        """LF in old/new matches a CRLF file, whose CRLF endings are kept."""
        await put(workspace, "crlf.ini", b"x=1\r\ny=2\r\nz=3\r\n")
        await workspace.edit_file("crlf.ini", "x=1\ny=2", "x=9\ny=8")
        assert await raw(workspace, "crlf.ini") == b"x=9\r\ny=8\r\nz=3\r\n"

    async def test_tabs_in_a_makefile(self, workspace) -> None:
        """Editing one recipe of a Makefile leaves every other tab byte intact."""
        original = b"all: build test\n\nbuild:\n\tcc -o app main.c\n\t@echo built\n\ntest:\n\t./app --check\n"
        await put(workspace, "Makefile", original)
        await workspace.edit_file("Makefile", "\tcc -o app main.c", "\tcc -O2 -o app main.c")
        assert await raw(workspace, "Makefile") == original.replace(b"cc -o app", b"cc -O2 -o app")

    async def test_bom_and_invalid_utf8_survive(self, workspace) -> None:
        """A UTF-8 BOM and bytes that are not UTF-8 are kept byte for byte around an edit."""
        original = b"\xef\xbb\xbfname = \xff\xfe raw\nvalue = 1\n"
        await put(workspace, "bom.txt", original)
        await workspace.edit_file("bom.txt", "value = 1", "value = 2")
        assert await raw(workspace, "bom.txt") == original.replace(b"value = 1", b"value = 2")

    async def test_several_matches(self, workspace) -> None:
        """Two matches without replace_all: error naming 2 occurrences at lines 1 and 3, file unchanged."""
        await put(workspace, "dup.txt", b"x=1\ny=0\nx=1\n")
        with pytest.raises(InvalidArgumentError, match=r"occurs 2 times .*lines 1, 3"):
            await workspace.edit_file("dup.txt", "x=1", "x=2")
        assert await raw(workspace, "dup.txt") == b"x=1\ny=0\nx=1\n"
        edit = await workspace.edit_file("dup.txt", "x=1", "x=2", replace_all=True)
        assert await raw(workspace, "dup.txt") == b"x=2\ny=0\nx=2\n"
        assert edit.message.startswith("Replaced 2 occurrence(s)")

    @pytest.mark.parametrize("replace_all", [False, True])
    async def test_empty_old_string(self, workspace, replace_all: bool) -> None:
        """An empty old_string is refused and the file stays as it was."""
        await put(workspace, "e.txt", b"keep\n")
        with pytest.raises(InvalidArgumentError, match="old_string must not be empty"):
            await workspace.edit_file("e.txt", "", "x", replace_all=replace_all)
        assert await raw(workspace, "e.txt") == b"keep\n"

    async def test_not_found_and_identical(self, workspace) -> None:
        """A missing string and an unchanged replacement are clear errors."""
        await put(workspace, "n.txt", b"alpha\n")
        with pytest.raises(InvalidArgumentError, match="not found"):
            await workspace.edit_file("n.txt", "beta", "gamma")
        with pytest.raises(InvalidArgumentError, match="identical"):
            await workspace.edit_file("n.txt", "alpha", "alpha")
        with pytest.raises(NotFoundError, match=r"missing\.txt"):
            await workspace.edit_file("missing.txt", "a", "b")

    async def test_500_hits_summarised(self, workspace) -> None:
        """500 separated hits with replace_all: all replaced, five hunks then '…and 495 more replacements'."""
        lines = []
        for i in range(500):
            lines += [f"hit {i}: OLD", "-", "-", "-", "-", "-", "-", "-"]
        await put(workspace, "many.txt", ("\n".join(lines) + "\n").encode())
        edit = await workspace.edit_file("many.txt", "OLD", "NEW", replace_all=True)
        assert edit.replacements == 500
        assert edit.diff.count("@@ -") == 5
        assert edit.diff.splitlines()[-1] == "…and 495 more replacements"
        data = await raw(workspace, "many.txt")
        assert data.count(b"NEW") == 500
        assert b"OLD" not in data

    async def test_same_second_same_size_rewrite_is_seen_by_python(self, workspace) -> None:
        """A same-size edit right after a run is not hidden by a stale .pyc (mtime moves a whole second)."""
        await workspace.write_file("mod_a.py", "X = 1\n")
        first = await workspace.exec("python3 -c 'import mod_a; print(mod_a.X)'").wait()
        await workspace.edit_file("mod_a.py", "X = 1", "X = 2")
        second = await workspace.exec("python3 -c 'import mod_a; print(mod_a.X)'").wait()
        await workspace.write_file("mod_a.py", "X = 3\n")
        third = await workspace.exec("python3 -c 'import mod_a; print(mod_a.X)'").wait()
        assert (first.stdout, second.stdout, third.stdout) == ("1\n", "2\n", "3\n")

    async def test_write_keeps_mode_and_reports_diff(self, workspace) -> None:
        """Overwriting keeps the file's mode and reports a small diff with counts."""
        await workspace.exec("printf 'one\\ntwo\\n' > run.sh && chmod 751 run.sh").wait(check=True)
        result = await workspace.write_file("run.sh", "one\nTWO\n")
        assert not result.created
        assert result.message.splitlines()[0] == "Overwrote /workspace/run.sh (2 lines, 8 bytes; was 2 lines, 8 bytes)"
        assert "-two" in result.diff
        assert "+TWO" in result.diff
        mode = await workspace.exec("stat -c %a run.sh").wait()
        assert mode.stdout == "751\n"

    async def test_large_overwrite_is_summarised(self, workspace) -> None:
        """A large change is summarised as +X/-Y instead of a diff."""
        await workspace.write_file("big.txt", "".join(f"old {i}\n" for i in range(100)))
        result = await workspace.write_file("big.txt", "".join(f"new {i}\n" for i in range(100)))
        assert result.diff == ""
        assert result.message.splitlines()[-1] == "+100/-100 lines changed (diff too large to show)"

    async def test_write_creates_parents_and_exact_bytes(self, workspace, client) -> None:
        """Parents are created and arbitrary bytes land exactly, with no temp file left behind."""
        payload = bytes(range(256)) * 4
        result = await client.write_file(workspace.workspace_id, "deep/er/bin.dat", payload)
        assert result.created
        assert await raw(workspace, "deep/er/bin.dat") == payload
        listing = await client.list_dir(workspace.workspace_id, "deep/er")
        assert [entry.name for entry in listing] == ["bin.dat"]


class TestReadFile:
    async def test_binary_is_refused(self, workspace, client) -> None:
        """A file with a NUL byte is refused with a hint, and no file content comes back."""
        await put(workspace, "nul.bin", b"hello\0world\n")
        with pytest.raises(FailedPreconditionError) as caught:
            await client.read_file(workspace.workspace_id, "nul.bin")
        assert "binary" in caught.value.message
        assert "exec_command" in caught.value.message
        assert "\0" not in caught.value.message
        assert "hello" not in caught.value.message

    async def test_long_line_is_cut(self, workspace) -> None:
        """A 100000-character line is cut with a marker; line 2 is exactly '     2\\tsecond'."""
        await put(workspace, "long.txt", b"a" * 100000 + b"\nsecond\n")
        page = await workspace.read_file("long.txt")
        first, second = page.content.splitlines()[:2]
        assert first == "     1\t" + "a" * 2000 + "… [line cut: 98000 more characters]"
        assert second == "     2\tsecond"
        assert page.lines_truncated
        assert "longer than 2000 characters" in page.content

    async def test_multibyte_cut_on_a_character(self, workspace) -> None:
        """50000 × 'é' is cut after 2000 whole characters, never into U+FFFD."""
        await put(workspace, "e.txt", ("é" * 50000).encode())
        page = await workspace.read_file("e.txt")
        line = page.content.splitlines()[0]
        assert line == "     1\t" + "é" * 2000 + "… [line cut: 48000 more characters]"
        assert "\ufffd" not in page.content

    async def test_pages(self, workspace) -> None:
        """5000 lines in pages of 2000: trailers name offsets 2001 and 4001; the last page has none."""
        await put(workspace, "lines.txt", "".join(f"line {i}\n" for i in range(1, 5001)).encode())
        first = await workspace.read_file("lines.txt")
        assert (first.total_lines, first.line_count, first.next_offset) == (5000, 2000, 2001)
        assert first.content.splitlines()[-1] == "[3000 more lines; continue with offset=2001.]"
        second = await workspace.read_file("lines.txt", offset=2001)
        assert second.content.splitlines()[0] == "  2001\tline 2001"
        assert second.next_offset == 4001
        assert "offset=4001" in second.content
        third = await workspace.read_file("lines.txt", offset=4001)
        assert (third.line_count, third.next_offset) == (1000, 0)
        assert third.content.splitlines()[-1] == "  5000\tline 5000"

    async def test_invalid_utf8_and_crlf(self, workspace) -> None:
        """Invalid UTF-8 reads as U+FFFD (no error), and CR before LF is not shown."""
        await put(workspace, "mixed.txt", b"ok\xff\r\nnext\r\n")
        page = await workspace.read_file("mixed.txt")
        assert page.content == "     1\tok\ufffd\n     2\tnext"

    async def test_errors(self, workspace) -> None:
        """Missing file NOT_FOUND, directory INVALID_ARGUMENT, offset past the end INVALID_ARGUMENT."""
        with pytest.raises(NotFoundError, match=r"nope\.txt"):
            await workspace.read_file("nope.txt")
        with pytest.raises(InvalidArgumentError, match="directory"):
            await workspace.read_file("/workspace")
        await put(workspace, "short.txt", b"1\n2\n")
        with pytest.raises(InvalidArgumentError, match="past the end"):
            await workspace.read_file("short.txt", offset=10)

    async def test_empty_file(self, workspace) -> None:
        """An empty file reads as empty with a notice."""
        await put(workspace, "empty.txt", b"")
        page = await workspace.read_file("empty.txt")
        assert (page.total_lines, page.content) == (0, "[The file is empty.]")


class TestIsolation:
    async def test_symlink_to_root_resolves_in_the_container(self, workspace) -> None:
        """Writing through a link to / lands in the container's /tmp, never on the daemon's host."""
        host_probe = "/tmp/probe"
        if os.path.exists(host_probe):
            os.unlink(host_probe)
        await workspace.exec("ln -s / /workspace/root").wait(check=True)
        marker = f"probe-{workspace.workspace_id}"
        await workspace.write_file("/workspace/root/tmp/probe", marker)
        seen = await workspace.exec("cat /tmp/probe").wait()
        assert seen.stdout == marker
        assert not os.path.exists(host_probe)

    async def test_symlink_to_etc_hostname_reads_the_containers(self, workspace) -> None:
        """A link to /etc/hostname reads the container's hostname (every workspace's: sandbox), not the host's."""
        await workspace.exec("ln -s /etc/hostname /workspace/hn").wait(check=True)
        page = await workspace.read_file("hn")
        assert page.content == "     1\tsandbox"
        assert socket.gethostname() != "sandbox"

    async def test_root_owned_read_only_file(self, workspace, docker_client) -> None:
        """Editing a root-owned read-only file is PERMISSION_DENIED and the file is unchanged."""
        container = docker_client.containers.get(workspace.info.container_id)
        made = container.exec_run(["sh", "-c", "echo locked > /tmp/rootfile && chmod 444 /tmp/rootfile"], user="root")
        assert made.exit_code == 0, made.output
        with pytest.raises(PermissionDeniedError, match="/tmp/rootfile"):
            await workspace.edit_file("/tmp/rootfile", "locked", "open")
        with pytest.raises(PermissionDeniedError):
            await workspace.write_file("/tmp/rootfile", "open\n")
        assert await raw(workspace, "/tmp/rootfile") == b"locked\n"

    async def test_concurrent_edits_are_all_applied(self, workspace) -> None:
        """50 concurrent edits, each replacing its own marker in one file: all 50 land."""
        await put(workspace, "shared.txt", "".join(f"<M{i:02d}>\n" for i in range(50)).encode())
        await asyncio.gather(*(workspace.edit_file("shared.txt", f"<M{i:02d}>", f"<D{i:02d}>") for i in range(50)))
        assert await raw(workspace, "shared.txt") == "".join(f"<D{i:02d}>\n" for i in range(50)).encode()


class TestTreeOperations:
    async def test_stat_list_move_remove(self, workspace, client) -> None:
        """Stat, ListDir, Move (no overwrite by default) and Remove behave like the shell."""
        from sandboxd_client import AlreadyExistsError

        ws = workspace.workspace_id
        await workspace.exec("mkdir -p d/sub && echo hi > d/a.txt && ln -s a.txt d/link").wait(check=True)
        entries = {e.name: e for e in await client.list_dir(ws, "d")}
        assert {name: e.type for name, e in entries.items()} == {"a.txt": "file", "link": "symlink", "sub": "directory"}
        assert entries["a.txt"].size_bytes == 3
        assert entries["link"].link_target == "a.txt"
        assert (entries["a.txt"].owner, entries["a.txt"].group) == ("sandbox", "sandbox")
        root_owned = await client.stat(ws, "/etc/passwd")
        assert (root_owned.owner, root_owned.group) == ("root", "root")
        assert (await client.stat(ws, "d/link", follow_symlinks=True)).type == "file"
        await workspace.exec("echo other > d/b.txt").wait(check=True)
        with pytest.raises(AlreadyExistsError):
            await client.move(ws, "d/a.txt", "d/b.txt")
        await client.move(ws, "d/a.txt", "d/b.txt", overwrite=True)
        assert await raw(workspace, "d/b.txt") == b"hi\n"
        with pytest.raises(FailedPreconditionError, match=r"not empty"):
            await client.remove(ws, "d")
        await client.remove(ws, "d", recursive=True)
        with pytest.raises(NotFoundError):
            await client.stat(ws, "d")

    async def test_cp_round_trip_with_sandboxctl(self, daemon, workspace, tmp_path) -> None:
        """`sandboxctl cp` a tree in and back out: byte-identical, modes kept."""
        tree = tmp_path / "tree"
        (tree / "nested" / "deeper").mkdir(parents=True)
        (tree / "run.sh").write_bytes(b"#!/bin/sh\necho hi\n")
        (tree / "run.sh").chmod(0o755)
        (tree / "secret").write_bytes(os.urandom(70000))
        (tree / "secret").chmod(0o600)
        (tree / "nested" / "deeper" / "note.txt").write_text("é and ü\n")
        (tree / "nested" / "link").symlink_to("deeper/note.txt")
        ctl = [sys.executable, "-m", "sandboxd_client.cli", "--socket", daemon.socket_path]
        ws = workspace.workspace_id
        subprocess.run([*ctl, "cp", str(tree), f"{ws}:/workspace/copied"], check=True, timeout=60)
        inside = await workspace.exec("stat -c '%a %n' copied/run.sh copied/secret; readlink copied/nested/link").wait()
        assert inside.stdout == "755 copied/run.sh\n600 copied/secret\ndeeper/note.txt\n"
        back = tmp_path / "back"
        subprocess.run([*ctl, "cp", f"{ws}:/workspace/copied", str(back)], check=True, timeout=60)
        for relative in ("run.sh", "secret", "nested/deeper/note.txt"):
            assert (back / relative).read_bytes() == (tree / relative).read_bytes()
            assert (back / relative).stat().st_mode & 0o777 == (tree / relative).stat().st_mode & 0o777
        assert os.readlink(back / "nested" / "link") == "deeper/note.txt"
        cat = subprocess.run([*ctl, "cat", ws, "copied/secret"], capture_output=True, check=True, timeout=60)
        assert cat.stdout == (tree / "secret").read_bytes()

    async def test_cp_names_like_docker_cp(self, daemon, workspace, tmp_path) -> None:
        """Relative names land in /workspace; `dir/` is a directory; `-` is a tar stream; files become yours."""
        ctl = [sys.executable, "-m", "sandboxd_client.cli", "--socket", daemon.socket_path]
        ws = workspace.workspace_id
        (tmp_path / "a.txt").write_bytes(b"alpha\n")

        def run(*args: str, **options: object) -> subprocess.CompletedProcess[bytes]:
            return subprocess.run([*ctl, *args], capture_output=True, timeout=60, **options)  # type: ignore[call-overload]

        assert run("cp", str(tmp_path / "a.txt"), f"{ws}:copied.txt").returncode == 0
        assert run("cp", str(tmp_path / "a.txt"), f"{ws}:/workspace/newdir/").returncode == 0
        listing = await workspace.exec("cat /workspace/copied.txt /workspace/newdir/a.txt").wait()
        assert listing.stdout == "alpha\nalpha\n"
        archive = run("cp", f"{ws}:/workspace/newdir", "-")
        assert archive.returncode == 0
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            assert sorted(tar.getnames()) == ["newdir", "newdir/a.txt"]
            assert tar.extractfile("newdir/a.txt").read() == b"alpha\n"  # type: ignore[union-attr]
        assert run("cp", "-", f"{ws}:/workspace/unpacked", input=archive.stdout).returncode == 0
        assert (await workspace.exec("cat /workspace/unpacked/newdir/a.txt").wait()).stdout == "alpha\n"
        assert run("cp", f"{ws}:/workspace/newdir/a.txt", str(tmp_path / "out.txt")).returncode == 0
        assert run("cp", f"{ws}:newdir/a.txt", str(tmp_path / "made" / "here") + "/").returncode == 0
        assert (tmp_path / "made" / "here" / "a.txt").read_bytes() == b"alpha\n"
        # As docker cp: a directory never replaces a file, and only a name ending in / is created.
        (tmp_path / "notes.txt").write_bytes(b"precious\n")
        onto_file = run("cp", f"{ws}:newdir", str(tmp_path / "notes.txt"))
        assert onto_file.returncode == 1
        assert b"cannot copy a directory onto" in onto_file.stderr
        assert (tmp_path / "notes.txt").read_bytes() == b"precious\n"
        missing = run("cp", f"{ws}:newdir/a.txt", str(tmp_path / "nowhere" / "x"))
        assert (missing.returncode, missing.stderr) == (
            1,
            f"sandboxctl: {tmp_path / 'nowhere'}: no such directory\n".encode(),
        )
        assert not (tmp_path / "nowhere").exists()
        assert run("cp", str(tmp_path / "a.txt"), str(tmp_path / "b.txt")).returncode == 2  # a usage error
        assert (tmp_path / "out.txt").stat().st_uid == os.getuid()  # the workspace user's 1000 is not kept


def _png(width: int, height: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 90)).save(buffer, "PNG")
    return buffer.getvalue()


class TestReadImage:
    async def test_png_drawn_in_the_workspace(self, workspace) -> None:
        """A PNG made inside the workspace comes back as image/png with its size."""
        script = (
            "import struct, zlib\n"
            "w, h = 7, 5\n"
            "raw = b''.join(b'\\x00' + b'\\xff\\x00\\x00' * w for _ in range(h))\n"
            "def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))\n"
            "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0))\n"
            "png += chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b'')\n"
            "open('drawn.png', 'wb').write(png)\n"
        )
        await workspace.exec(f"python3 -c {shlex.quote(script)}").wait(check=True)
        image = await workspace.read_image("drawn.png")
        assert (image.mime_type, image.width, image.height) == ("image/png", 7, 5)
        assert image.data == await raw(workspace, "drawn.png")
        assert image.data_url().startswith("data:image/png;base64,iVBORw0KGgo")

    async def test_sniffed_by_content_not_name(self, workspace) -> None:
        """A text file named x.png is refused; a PNG named x.txt is accepted."""
        await workspace.write_file("x.png", "just text\n")
        with pytest.raises(FailedPreconditionError, match="not a png, jpeg, gif or webp"):
            await workspace.read_image("x.png")
        await workspace.write_file("x.txt", _png(3, 2))
        image = await workspace.read_image("x.txt")
        assert (image.mime_type, image.width, image.height) == ("image/png", 3, 2)

    async def test_other_formats(self, workspace) -> None:
        """JPEG, GIF and WebP are recognised with their sizes."""
        from PIL import Image

        for fmt, mime in (("JPEG", "image/jpeg"), ("GIF", "image/gif"), ("WEBP", "image/webp")):
            buffer = io.BytesIO()
            Image.new("RGB", (11, 13), (1, 2, 3)).save(buffer, fmt)
            await workspace.write_file(f"img.{fmt.lower()}", buffer.getvalue())
            image = await workspace.read_image(f"img.{fmt.lower()}")
            assert (image.mime_type, image.width, image.height) == (mime, 11, 13)

    async def test_six_megabytes_is_refused(self, workspace) -> None:
        """An image over 5 MB is refused with a message naming the 5 MB limit."""
        from PIL import Image

        noise = Image.frombytes("RGB", (1500, 1400), os.urandom(1500 * 1400 * 3))
        buffer = io.BytesIO()
        noise.save(buffer, "PNG")
        assert buffer.tell() > 6_000_000
        await workspace.write_file("noise.png", buffer.getvalue())
        with pytest.raises(FailedPreconditionError, match="5 MB"):
            await workspace.read_image("noise.png")

    async def test_url_needs_network(self, workspace) -> None:
        """With network off, an http URL cannot be fetched and the error says so."""
        with pytest.raises(FailedPreconditionError, match="cannot fetch"):
            await workspace.read_image("http://deb.debian.org/debian/doc/logo.png")
