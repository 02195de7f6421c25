"""Files and agent tools under abuse: each case a hostile review found, kept as a test (real engine)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import time

import pytest
from sandboxd_client import (
    Approval,
    Environment,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ToolCall,
)

from tests.integration.helpers import one_file_tar, trickle

pytestmark = pytest.mark.docker


async def sh(workspace, command: str) -> str:  # type: ignore[no-untyped-def]
    return (await workspace.exec(command).wait(check=True)).stdout


async def raw(workspace, path: str) -> bytes:  # type: ignore[no-untyped-def]
    return base64.b64decode(await sh(workspace, f"base64 -w0 {path}"))


async def fileops_left(workspace) -> list[str]:  # type: ignore[no-untyped-def]
    # A long file operation runs in an agent helper as the workspace user (the idle helper waiting
    # for the next command is root's, the user's file server stays: "spawn fileserver"; "[w]":
    # this shell's own argv must not match).
    out = await sh(workspace, "pgrep -u $(id -u) -fa 'sandboxd-agent spa[w]n$' || true")
    return out.splitlines()


def _tar(*members: tuple[str, str, bytes | str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for kind, name, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, str(payload)
                tar.addfile(info)
            else:
                data = payload if isinstance(payload, bytes) else payload.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


async def _chunks(data: bytes):  # type: ignore[no-untyped-def]
    yield data


class TestAtomicity:
    async def test_cancelled_write_is_all_or_nothing(self, client, workspace) -> None:
        """A WriteFile cancelled mid-transfer leaves the old content or the new one, whole; no temp file."""
        old = b"OLD\n" * 1000
        new = os.urandom(15 * 2**20)
        for delay in (0.05, 0.2, 0.4):
            await client.write_file(workspace.workspace_id, "victim", old)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(client.write_file(workspace.workspace_id, "victim", new), delay)
            await asyncio.sleep(1.5)
            data = await raw(workspace, "victim")
            assert data in (old, new), f"{len(data)} bytes after a cancel at {delay} s"
        assert await sh(workspace, "ls -a /workspace | grep -c '^\\.victim' || true") == "0\n"

    async def test_cancelled_edit_is_all_or_nothing(self, client, workspace) -> None:
        """An EditFile cancelled mid-way leaves the file as it was or fully edited, never cut short."""
        content = b"".join(b"line %d\n" % i for i in range(1_300_000))
        edited = content.replace(b"line 5\n", b"LINE 5\n", 1)
        for delay in (0.1, 0.3, 0.6):
            await client.write_file(workspace.workspace_id, "big.txt", content)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    client.edit_file(workspace.workspace_id, "big.txt", "line 5\n", "LINE 5\n"), delay
                )
            await asyncio.sleep(2)
            digest = (await sh(workspace, "sha256sum big.txt")).split()[0]
            assert digest in (hashlib.sha256(content).hexdigest(), hashlib.sha256(edited).hexdigest()), delay

    async def test_concurrent_edits_through_two_names(self, client, workspace) -> None:
        """Edits racing through a file's name and a symlink to it all land."""
        await client.write_file(workspace.workspace_id, "conc.txt", "".join(f"k{i}=0\n" for i in range(40)))
        await sh(workspace, "ln -s conc.txt /workspace/conc_link")
        names = ["conc.txt", "/workspace/conc_link"]
        await asyncio.gather(
            *(client.edit_file(workspace.workspace_id, names[i % 2], f"k{i}=0\n", f"k{i}=1\n") for i in range(39))
        )
        assert (await sh(workspace, "grep -c '=1' conc.txt")).strip() == "39"


class TestSpecialFiles:
    async def test_fifo_is_refused_at_once(self, client, workspace) -> None:
        """Reading, editing or viewing a FIFO is refused promptly, and no reader is left behind."""
        await sh(workspace, "mkfifo /workspace/fifo")
        ws = workspace.workspace_id
        start = time.monotonic()
        with pytest.raises(InvalidArgumentError, match="not a regular file"):
            await client.read_file(ws, "fifo")
        with pytest.raises(InvalidArgumentError, match="not a regular file"):
            await client.edit_file(ws, "fifo", "a", "b")
        with pytest.raises(InvalidArgumentError, match="not a regular file"):
            await client.read_image(ws, "fifo")
        assert time.monotonic() - start < 10
        assert await fileops_left(workspace) == []

    async def test_growing_file_is_read_as_it_was(self, client, workspace) -> None:
        """A file that keeps growing is read up to its size when opened; the call returns."""
        await sh(workspace, "(yes aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa > grow &) ; sleep 0.5")
        try:
            page = await asyncio.wait_for(client.read_file(workspace.workspace_id, "grow", limit=2), 30)
            assert page.content.splitlines()[:2] == ["     1\t" + "a" * 30, "     2\t" + "a" * 30]
        finally:
            await sh(workspace, "pkill yes; rm -f grow")

    async def test_cancelled_operation_leaves_no_process(self, client, workspace) -> None:
        """A file call abandoned by its caller does not leave its in-container process running."""
        # First, that a file operation in progress is seen at all (or the check below proves nothing).
        archive = one_file_tar("slow.txt", b"s" * 100_000)
        upload = asyncio.create_task(
            client.upload(workspace.workspace_id, "/workspace", trickle(archive, pieces=2, pause_s=1.5))
        )
        await asyncio.sleep(0.8)
        assert len(await fileops_left(workspace)) == 1
        assert await upload == 1
        for name in "abcd":
            await client.write_file(workspace.workspace_id, f"big/{name}.bin", b"x" * (8 << 20))
        stream = client.download(workspace.workspace_id, "big")
        assert await anext(stream)  # 32 MiB of archive on its way: its helper waits on the caller
        assert len(await fileops_left(workspace)) == 1
        await stream.aclose()  # the caller walks away mid-archive
        deadline = time.monotonic() + 10
        while await fileops_left(workspace) and time.monotonic() < deadline:
            await asyncio.sleep(0.3)
        assert await fileops_left(workspace) == []


class TestNames:
    async def test_a_big_directory_lists_whole(self, client, workspace) -> None:
        """6000 entries with 150-character names (about 1.5 MB of listing) come back, all of them."""
        await sh(workspace, "mkdir big && cd big && for i in $(seq 6000); do : > \"$(printf '%0150d' $i)\"; done")
        entries = await client.list_dir(workspace.workspace_id, "big")
        assert len(entries) == 6000
        assert entries[0].name == f"{1:0150d}"

    async def test_names_that_are_not_utf8(self, client, workspace) -> None:
        """A command may name a file with any bytes: listings and stats show U+FFFD, never fail."""
        await sh(workspace, "mkdir odd && cd odd && touch $'bad\\xff' && ln -s $'bad\\xff' link")
        names = sorted(entry.name for entry in await client.list_dir(workspace.workspace_id, "odd"))
        assert names == ["bad\ufffd", "link"]
        link = await client.stat(workspace.workspace_id, "odd/link")
        assert (link.type, link.link_target) == ("symlink", "bad\ufffd")

    async def test_longest_names_can_be_written_and_edited(self, client, workspace) -> None:
        """A 255-byte file name (NAME_MAX) is written, edited and read like any other; no temp file stays."""
        ws = workspace.workspace_id
        for name in ("e" * 255, "é" * 127):  # 255 bytes of ASCII, 254 of two-byte UTF-8
            await client.write_file(ws, name, "hello\r\nworld\r\n")
            edited = await client.edit_file(ws, name, "world", "there")
            assert edited.replacements == 1
            assert await raw(workspace, name) == b"hello\r\nthere\r\n"
        assert await sh(workspace, "ls -a /workspace | grep -c '\\.tmp$' || true") == "0\n"

    async def test_upload_of_a_dot_rooted_archive(self, client, workspace, tmp_path) -> None:
        """`tar -C src -cf - .` starts with "./": accepted, as tar itself does."""
        (tmp_path / "src" / "sub").mkdir(parents=True)
        (tmp_path / "src" / "sub" / "f.txt").write_text("dot rooted\n")
        archive = subprocess.run(["tar", "-C", str(tmp_path / "src"), "-cf", "-", "."], capture_output=True, check=True)

        async def chunks():  # type: ignore[no-untyped-def]
            yield archive.stdout

        await client.upload(workspace.workspace_id, "/workspace/dot", chunks())
        assert await sh(workspace, "cat /workspace/dot/sub/f.txt") == "dot rooted\n"


class TestUploadSafety:
    async def test_symlink_then_file_is_refused(self, client, workspace) -> None:
        """An archive whose link carries a later member out of the target is INVALID_ARGUMENT; nothing escapes."""
        for link in ("/tmp", "../.."):
            archive = _tar(("link", "esc", link), ("file", "esc/pwned", "x"))
            with pytest.raises(InvalidArgumentError, match="symlink"):
                await client.upload(workspace.workspace_id, "/workspace/up1", _chunks(archive))
        assert await sh(workspace, "ls /tmp/pwned /workspace/tmp/pwned 2>/dev/null | wc -l") == "0\n"

    @pytest.mark.parametrize(
        "archive", [_tar(("file", "../x", "x")), b"garbage" * 100, _tar(("file", "a", "x" * 5000))[:1500]]
    )
    async def test_bad_archives_are_invalid_argument(self, client, workspace, archive: bytes) -> None:
        """Traversal names, garbage and truncated archives are INVALID_ARGUMENT with a message."""
        with pytest.raises(InvalidArgumentError):
            await client.upload(workspace.workspace_id, "/workspace/up2", _chunks(archive))

    async def test_an_archive_that_fails_on_its_way_surfaces_as_its_own_error(self, client, workspace) -> None:
        """The caller's iterator raising mid-upload gives the caller that very error (not a
        CancelledError), nothing of the archive is extracted, and the workspace serves on."""
        archive = _tar(("file", "first", "1" * 3000), ("file", "second", "2"))

        async def breaks():  # type: ignore[no-untyped-def]
            yield archive[:2048]
            raise ValueError("the archive's source broke")

        with pytest.raises(ValueError, match="the archive's source broke"):
            await client.upload(workspace.workspace_id, "/workspace/up3", breaks())
        # The cancel reaches the agent after the caller has its error: the half-written file's
        # removal follows it by a moment (its helper is told to go, and removes it as it goes).
        deadline = time.monotonic() + 10
        while await sh(workspace, "ls -A /workspace/up3 2>/dev/null | wc -l") != "0\n":
            assert time.monotonic() < deadline, await sh(workspace, "ls -A /workspace/up3")
            await asyncio.sleep(0.1)
        await client.upload(workspace.workspace_id, "/workspace/up3", _chunks(archive))
        assert await sh(workspace, "cat /workspace/up3/second") == "2"

    async def test_upload_to_unknown_workspace_is_not_found(self, client) -> None:
        """Upload to a workspace that does not exist is NOT_FOUND."""
        with pytest.raises(NotFoundError, match="ws-nope"):
            await client.upload("ws-nope", "/workspace/x", _chunks(_tar(("file", "a", "x"))))


class TestOddPaths:
    async def test_move_across_filesystems_and_into_itself(self, client, workspace) -> None:
        """Move copies across filesystems like mv; moving a directory into itself is INVALID_ARGUMENT."""
        ws = workspace.workspace_id
        await client.write_file(ws, "mv.txt", "moving\n")
        await client.move(ws, "mv.txt", "/tmp/mv.txt")
        assert await sh(workspace, "cat /tmp/mv.txt; test -e /workspace/mv.txt; echo $?") == "moving\n1\n"
        await sh(workspace, "mkdir -p md/sub")
        with pytest.raises(InvalidArgumentError, match="into itself"):
            await client.move(ws, "md", "md/sub/x")

    async def test_write_errors_have_no_side_effects(self, client, workspace) -> None:
        """A path ending in / is refused without creating it; a file used as a directory is 'not a directory'."""
        ws = workspace.workspace_id
        with pytest.raises(InvalidArgumentError, match="directory"):
            await client.write_file(ws, "newdir/", "x")
        assert await sh(workspace, "test -e newdir; echo $?") == "1\n"
        await client.write_file(ws, "a/f.txt", "x")
        with pytest.raises(InvalidArgumentError, match="not a directory"):
            await client.write_file(ws, "a/f.txt/g", "x")

    async def test_large_write_refused_early_answers_at_once(self, client, workspace) -> None:
        """8 MiB to a path the user may not write: the in-container side fails before reading it all,
        the engine stops reading stdin, and the call must still end at once (it used to hang 120 s)."""
        from sandboxd_client import PermissionDeniedError

        began = time.monotonic()
        with pytest.raises(PermissionDeniedError):
            await client.write_file(workspace.workspace_id, "/etc/passwd", b"x" * 8 * 1024 * 1024)
        assert time.monotonic() - began < 10
        assert await fileops_left(workspace) == []

    async def test_form_feed_does_not_shift_diff_lines(self, client, workspace) -> None:
        """Control characters inside lines do not move diff line numbers (lines end at newline only)."""
        lines = [f"line{i}" for i in range(1, 21)]
        lines[2], lines[4] = "li\x0cne3", "a\x1cb"
        await client.write_file(workspace.workspace_id, "ff.txt", "\n".join(lines) + "\n")
        edit = await client.edit_file(workspace.workspace_id, "ff.txt", "line15", "LINE15")
        assert "@@ -12,7 +12,7 @@" in edit.diff

    async def test_exact_2000_with_crlf_is_not_cut(self, client, workspace) -> None:
        """A 2000-character line ending in CRLF is shown whole, without a cut marker."""
        await client.write_file(workspace.workspace_id, "crlf2000.txt", "x" * 2000 + "\r\n")
        page = await client.read_file(workspace.workspace_id, "crlf2000.txt")
        assert page.content == "     1\t" + "x" * 2000
        assert not page.lines_truncated

    async def test_huge_dimensions_are_reported(self, client, workspace) -> None:
        """A small file describing a huge canvas is read (header only), not an internal error."""
        from PIL import Image

        buffer = io.BytesIO()
        Image.new("1", (16000, 16000)).save(buffer, "PNG", optimize=True)
        await client.write_file(workspace.workspace_id, "huge.png", buffer.getvalue())
        image = await client.read_image(workspace.workspace_id, "huge.png")
        assert (image.mime_type, image.width, image.height) == ("image/png", 16000, 16000)


class TestCli:
    def _ctl(self, daemon, *args: str) -> subprocess.CompletedProcess[bytes]:  # type: ignore[no-untyped-def]
        return subprocess.run(
            [sys.executable, "-m", "sandboxd_client.cli", "--socket", daemon.socket_path, *args],
            capture_output=True,
            timeout=60,
            check=False,
        )

    def test_missing_paths_are_one_line(self, daemon, workspace_id) -> None:
        """cat and cp of a missing path print one `sandboxctl:` line naming it, no traceback."""
        for args in (
            ("cat", workspace_id, "/workspace/nope"),
            ("cp", f"{workspace_id}:/workspace/nope", "/tmp/x-nope"),
        ):
            run = self._ctl(daemon, *args)
            assert run.returncode == 1
            lines = run.stderr.decode().splitlines()
            assert len(lines) == 1
            assert lines[0].startswith("sandboxctl: ")
            assert "nope" in lines[0]

    def test_cp_tree_with_special_files_and_links(self, daemon, workspace_id, tmp_path) -> None:
        """A tree with a FIFO, an absolute symlink and a 751 directory copies out: links kept, modes kept."""
        setup = (
            "mkdir -p tree/sub && chmod 751 tree/sub && echo f > tree/f && mkfifo tree/ff && ln -s /etc/passwd tree/lnk"
        )
        assert self._ctl(daemon, "exec", workspace_id, "--", setup).returncode == 0
        target = tmp_path / "new"
        run = self._ctl(daemon, "cp", f"{workspace_id}:/workspace/tree", str(target))
        assert run.returncode == 0, run.stderr
        assert (target / "f").read_text() == "f\n"
        assert os.readlink(target / "lnk") == "/etc/passwd"
        assert (target / "sub").stat().st_mode & 0o777 == 0o751
        assert not (target / "ff").exists()

    def test_cat_follows_a_symlink(self, daemon, workspace_id) -> None:
        """`sandboxctl cat` of a symlink prints the file it points to."""
        assert self._ctl(daemon, "exec", workspace_id, "--", "echo content > real && ln -s real rel").returncode == 0
        run = self._ctl(daemon, "cat", workspace_id, "rel")
        assert (run.returncode, run.stdout) == (0, b"content\n")


class TestAgentTools:
    async def test_progress_bars_are_cleaned_before_the_cap(self, workspace) -> None:
        """A long redrawn progress bar shows its final state; text after an escape-code flood is kept."""
        import dataclasses

        from sandboxd_client.tools import builtin_definitions, make_tool

        definition = dataclasses.replace(builtin_definitions()["exec_command"], max_output_length=100)
        env = Environment(workspace, tools=[make_tool(definition)], approval=Approval(mode="allow-all"))

        async def run(cmd: str) -> str:
            call = ToolCall(tool_call_id="p", name="exec_command", arguments={"description": "d", "cmd": cmd})
            return (await env.call(call)).output

        assert await run("for i in $(seq 1 30000); do printf '\\r%d%%' $i; done; echo") == "30000%\n[exit code 0]"
        assert await run("for i in $(seq 1 20000); do printf '\\033[0m'; done; echo hello") == "hello\n[exit code 0]"

    async def test_split_secret_never_shows(self, workspace) -> None:
        """A secret printed in two pieces is masked in the output, the partial events and the trace."""
        env = Environment(workspace, approval=Approval(mode="allow-all"), secrets=["supersecret"])
        call = ToolCall(
            tool_call_id="s",
            name="exec_command",
            arguments={"description": "d", "cmd": "printf 'super'; sleep 0.5; printf 'secret\\n'"},
        )
        events = [e async for e in env.run(call)]
        partials = "".join(getattr(e, "text", "") for e in events)
        assert partials == "[REDACTED]\n"
        assert "supersecret" not in str(env.trace.events)
        shown = [e["text"] for e in env.trace.events if e["event"] == "tool_call.partial_output"]
        assert shown == [t for t in shown if "super" not in t and "secret" not in t]
        assert events[-2].output == "[REDACTED]\n[exit code 0]"

    async def test_default_tools_follow_the_model(self, workspace) -> None:
        """With no tool list, a vision session gets read_image only and a text-only one describe_image only."""
        vision = [d.name for d in Environment(workspace).definitions()]
        text = [d.name for d in Environment(workspace, model="text-only").definitions()]
        assert "read_image" in vision and "describe_image" not in vision
        assert "describe_image" in text and "read_image" not in text

    async def test_clean_errors_for_odd_arguments(self, workspace) -> None:
        """Out-of-range integers and a missing vision model are plain errors, without Python type names."""
        env = Environment(workspace, approval=Approval(mode="allow-all"), model="text-only")
        out = await env.call(
            ToolCall(tool_call_id="o", name="read_file", arguments={"file_path": "x", "offset": 10**30})
        )
        assert out.output == "Error: argument 'offset' of read_file is too large (it must fit in 64 bits)."
        out = await env.call(ToolCall(tool_call_id="o", name="read_file", arguments={"file_path": "x", "offset": 0}))
        assert out.output == "Error: argument 'offset' of read_file must be at least 1."
        await workspace.write_file(
            "p.png",
            base64.b64decode(
                "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNgAAAAAgABSK+kcQAAAABJRU5ErkJggg=="
            ),
        )
        out = await env.call(ToolCall(tool_call_id="v", name="describe_image", arguments={"source": "p.png"}))
        assert out.output == "Error: describe_image needs a vision model, and the engine configured none"


class TestRootDirectory:
    @pytest.mark.parametrize("path", ["/", "//", "/./", "/tmp/.."])
    async def test_removing_the_root_is_refused_in_plain_words(self, client, workspace, path: str) -> None:
        """Remove("/") was INTERNAL "Device or resource busy", after emptying what it could."""
        with pytest.raises(InvalidArgumentError, match=r"^refusing to remove / \(the workspace's root directory\)"):
            await client.remove(workspace.workspace_id, path, recursive=True)
        assert (await workspace.exec("ls /bin/sh /etc/hostname").wait()).exit_code == 0  # nothing went

    @pytest.mark.parametrize("path", ["/proc/self/root/", "/tmp/to-root/", "/tmp/to-root/."])
    async def test_the_root_reached_another_way_is_refused_too(self, client, workspace, path: str) -> None:
        """The agent refuses the directory that is its root, however it was named (a link, /proc)."""
        assert (await workspace.exec("ln -s / /tmp/to-root").wait()).exit_code == 0
        with pytest.raises(InvalidArgumentError, match=r": it is the workspace's root directory$"):
            await client.remove(workspace.workspace_id, path, recursive=True)
        assert (await workspace.exec("ls /bin/sh /etc/hostname /tmp/to-root").wait()).exit_code == 0

    async def test_a_mount_point_is_a_failed_precondition_not_internal(self, client) -> None:
        """EBUSY (the engine's /etc/hostname is a mount) was INTERNAL through the agent's "io" code."""
        ws = await client.create_workspace(user="root", labels={"test": "busy"})  # /etc is root's
        try:
            with pytest.raises(FailedPreconditionError, match=r"^/etc/hostname: Device or resource busy \(a mount"):
                await client.remove(ws.workspace_id, "/etc/hostname")
            assert (await ws.exec("cat /etc/hostname").wait()).exit_code == 0
        finally:
            await ws.delete()
