"""Exec against the real engine: exact output bytes, exit codes and signals (issue 2)."""

from __future__ import annotations

import pytest
from sandboxd_client import Exited, Output, Started

pytestmark = pytest.mark.docker


class TestExitStatus:
    async def test_echo_hello(self, workspace) -> None:
        """`echo hello` gives exactly hello\\n on stdout, nothing on stderr, exit 0."""
        result = await workspace.exec("echo hello").wait()
        assert (result.stdout_bytes, result.stderr_bytes, result.exit_code) == (b"hello\n", b"", 0)
        assert result.signal == ""
        assert result.stop_reason == "exited"

    async def test_stderr_and_exit_code(self, workspace) -> None:
        """A command writing to stderr and exiting 2 is reported exactly so."""
        result = await workspace.exec("echo oops >&2; exit 2").wait()
        assert (result.stdout_bytes, result.stderr_bytes, result.exit_code) == (b"", b"oops\n", 2)

    async def test_true_has_no_output(self, workspace) -> None:
        """`true` produces no output at all and exit 0."""
        events = [event async for event in workspace.exec("true")]
        assert [type(e) for e in events] == [Started, Exited]
        assert events[-1].exit_code == 0

    async def test_sigkill_is_137(self, workspace) -> None:
        """A shell killing itself with SIGKILL reports 137 and SIGKILL."""
        result = await workspace.exec("kill -9 $$").wait()
        assert (result.exit_code, result.signal) == (137, "SIGKILL")

    async def test_sigterm_is_143(self, workspace) -> None:
        """A child shell killing itself with SIGTERM reports 143 and SIGTERM."""
        result = await workspace.exec("sh -c 'kill -TERM $$'").wait()
        assert (result.exit_code, result.signal) == (143, "SIGTERM")

    async def test_signal_of_a_child_through_the_shell(self, workspace) -> None:
        """A child killed by SIGSEGV behind a shell is still 139/SIGSEGV (the shell's 128+N)."""
        result = await workspace.exec(
            "cd /tmp && python3 -c 'import os,signal; os.kill(os.getpid(), signal.SIGSEGV)'; exit $?"
        ).wait()
        assert (result.exit_code, result.signal) == (139, "SIGSEGV")

    async def test_exactly_one_started_first_and_one_exited_last(self, workspace) -> None:
        """The stream is started, output..., exited — each terminal event exactly once."""
        events = [event async for event in workspace.exec("echo a; echo b >&2; echo c")]
        assert isinstance(events[0], Started)
        assert isinstance(events[-1], Exited)
        assert sum(isinstance(e, Started) for e in events) == 1
        assert sum(isinstance(e, Exited) for e in events) == 1
        assert b"".join(e.data for e in events if isinstance(e, Output) and e.stream == "stdout") == b"a\nc\n"


class TestNoOutputLost:
    async def test_200_echoes(self, workspace, runtime: str) -> None:
        """200 fast `echo hello` calls in a row each return exactly hello\\n (50 under gVisor, 4x slower)."""
        for _ in range(50 if runtime == "runsc" else 200):
            result = await workspace.exec("echo hello").wait()
            assert (result.stdout_bytes, result.exit_code) == (b"hello\n", 0)

    async def test_200_printf_without_newline(self, workspace, runtime: str) -> None:
        """200 × `printf x` each return exactly x (no newline needed to flush; 50 under gVisor)."""
        for _ in range(50 if runtime == "runsc" else 200):
            result = await workspace.exec("printf x").wait()
            assert (result.stdout_bytes, result.exit_code) == (b"x", 0)

    async def test_multibyte_text_intact(self, workspace) -> None:
        """'a' + 20000 × 'é' arrives as exactly 40001 bytes and decodes without U+FFFD."""
        result = await workspace.exec("""python3 -c "import sys; sys.stdout.write('a' + 'é'*20000)" """).wait()
        assert len(result.stdout_bytes) == 40001
        assert result.stdout_bytes == ("a" + "é" * 20000).encode()
        assert result.stdout == "a" + "é" * 20000
        assert "\ufffd" not in result.stdout

    async def test_characters_straddling_chunks(self, workspace) -> None:
        """Writes cut inside 2-byte characters are rejoined by the client's incremental decoder."""
        script = (
            "import sys, time\n"
            "data = ('a' + 'é' * 20000).encode()\n"
            "for i in range(0, len(data), 4097):\n"
            # 50 ms apart: even a slow reader (gVisor, a loaded host) gets them as separate chunks.
            "    sys.stdout.buffer.write(data[i:i + 4097]); sys.stdout.flush(); time.sleep(0.05)\n"
        )
        events = [e async for e in workspace.exec(f"python3 -c {_quote(script)}")]
        chunks = [e.data for e in events if isinstance(e, Output) and e.data]
        assert len(chunks) > 1
        split_inside_a_character = False
        for chunk in chunks:
            try:
                chunk.decode()
            except UnicodeDecodeError:
                split_inside_a_character = True
        assert split_inside_a_character, "the test did not manage to split a character"
        text = "".join(e.text for e in events if isinstance(e, Output))
        assert text == "a" + "é" * 20000

    async def test_two_5mb_streams_do_not_deadlock(self, workspace) -> None:
        """5 MB on stdout then 5 MB on stderr completes with both byte counts right."""
        result = await workspace.exec(
            "head -c 5000000 /dev/zero | tr '\\0' a; head -c 5000000 /dev/zero | tr '\\0' b >&2"
        ).wait()
        assert result.exit_code == 0
        assert len(result.stdout_bytes) == 5_000_000 and set(result.stdout_bytes) == {ord("a")}
        assert len(result.stderr_bytes) == 5_000_000 and set(result.stderr_bytes) == {ord("b")}

    async def test_invalid_utf8_passes_through_as_bytes(self, workspace) -> None:
        """Bytes that are not UTF-8 arrive unchanged; the text form shows U+FFFD for them."""
        result = await workspace.exec("printf 'ok\\377\\376end'").wait()
        assert result.stdout_bytes == b"ok\xff\xfeend"
        assert result.stdout == "ok\ufffd\ufffdend"


class TestEnvironmentAndWorkdir:
    async def test_default_workdir_is_workspace(self, workspace) -> None:
        """Commands start in /workspace unless told otherwise."""
        result = await workspace.exec("pwd").wait()
        assert result.stdout == "/workspace\n"

    async def test_relative_workdir_resolves_against_workspace(self, workspace) -> None:
        """A relative workdir is taken from /workspace."""
        await workspace.exec("mkdir -p sub/dir").wait(check=True)
        result = await workspace.exec("pwd", workdir="sub/dir").wait()
        assert result.stdout == "/workspace/sub/dir\n"

    async def test_missing_workdir_is_invalid_argument(self, workspace) -> None:
        """A workdir that does not exist is INVALID_ARGUMENT naming it."""
        from sandboxd_client import InvalidArgumentError

        with pytest.raises(InvalidArgumentError, match="/workspace/nope"):
            await workspace.exec("true", workdir="nope").wait()

    async def test_env_is_passed(self, workspace) -> None:
        """Per-command env reaches the command."""
        result = await workspace.exec('printf %s "$GREETING"', env={"GREETING": "hi there"}).wait()
        assert result.stdout == "hi there"

    async def test_login_shell(self, workspace) -> None:
        """Commands run under bash as a login shell: bash -lc."""
        result = await workspace.exec("shopt -q login_shell && echo login; echo $0").wait()
        assert result.stdout == "login\nbash\n"


class TestImagesWithoutTools:
    async def test_without_bash_falls_back_to_sh(self, client, derived_images) -> None:
        """In an image without bash, commands run under sh -c with the same exit rules."""
        ws = await client.create_workspace(image=derived_images["nobash"])
        try:
            result = await ws.exec("echo $0; echo hello").wait()
            assert (result.stdout, result.exit_code) == ("sh\nhello\n", 0)
            result = await ws.exec("kill -9 $$").wait()
            assert (result.exit_code, result.signal) == (137, "SIGKILL")
        finally:
            await ws.delete()


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
