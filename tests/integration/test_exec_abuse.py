"""Exec under abuse: the cases a hostile review found, each kept as a test (real engine)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time

import pytest
from sandboxd_client import (
    Exited,
    InvalidArgumentError,
    NotFoundError,
    Output,
    ResourceExhaustedError,
    SandboxClient,
    SandboxError,
    Yielded,
)

from tests.conftest import DaemonThread, make_settings
from tests.integration.helpers import collect, input_until, start_trapped, start_yielded, until_alive
from tests.integration.helpers import ps as alive

pytestmark = pytest.mark.docker


@pytest.fixture
async def private(tmp_path):  # type: ignore[no-untyped-def]
    """A daemon of this test's own (for session-table and timing cases), with a client and a workspace."""
    threads = []

    async def make(**overrides):  # type: ignore[no-untyped-def]
        thread = DaemonThread(make_settings(tmp_path / str(len(threads)), **overrides)).start()
        threads.append(thread)
        return SandboxClient(socket_path=thread.socket_path, retries=False)

    yield make
    for thread in threads:
        thread.stop()


class TestTeardown:
    async def test_delete_while_streaming_is_prompt(self, client) -> None:
        """Deleting a workspace while a call streams from it ends that stream at once; the daemon stays responsive."""
        ws = await client.create_workspace(labels={"test": "delete-while-streaming"})
        handle = ws.exec("echo a; sleep 100", yield_after_s=60)
        events: list[object] = []
        streaming = asyncio.Event()

        async def consume() -> None:
            async for event in handle:
                events.append(event)
                if isinstance(event, Output) and "a" in event.text:
                    streaming.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(streaming.wait(), 30)  # the command runs and this call streams it
        start = time.monotonic()
        await ws.delete()
        await asyncio.wait_for(task, 5)
        assert time.monotonic() - start < 5
        assert isinstance(events[-1], Exited)
        assert events[-1].stop_reason == "failed"
        assert "deleted" in events[-1].message
        listed_at = time.monotonic()
        await client.list_workspaces()
        assert time.monotonic() - listed_at < 2

    async def test_the_agent_cannot_be_killed_from_the_command(self, workspace) -> None:
        """`kill -9 $PPID` (the agent: root, another uid) is refused; the command and the workspace go on."""
        result = await workspace.exec("kill -9 $PPID; echo rc=$?", timeout_s=30).wait()
        assert (result.stdout, result.exit_code, result.stop_reason) == ("rc=1\n", 0, "exited")
        assert "Operation not permitted" in result.stderr
        assert (await workspace.exec("echo still").wait()).stdout == "still\n"

    @pytest.mark.parametrize("delay_s", [0.005, 0.04, 0.06])
    async def test_cancel_during_start_leaves_nothing(self, workspace, delay_s: float) -> None:
        """An Exec cancelled while starting does not leave an invisible command behind."""
        marker = f"sleep 7700{int(delay_s * 1000)}"

        async def run() -> None:
            async for _ in workspace.exec(marker):
                pass

        task = asyncio.create_task(run())
        await asyncio.sleep(delay_s)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 8
        while await alive(workspace, marker) and time.monotonic() < deadline:
            await asyncio.sleep(0.3)
        assert await alive(workspace, marker) == []

    async def test_a_command_left_unseen_at_start_does_not_outlive_its_ctrl_c(self, tmp_path) -> None:
        """A command whose Exec was cancelled before it streamed, and which survives the Ctrl-C
        (here it ignores SIGINT), is ended
        after the kill grace: its caller may never have had its process id. One that a call
        streams in the meantime is somebody's, and Ctrl-C never escalates for it."""
        thread = DaemonThread(make_settings(tmp_path, kill_grace_s=0.5)).start()
        try:
            async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
                ws = await client.create_workspace(labels={"test": "abandoned-at-start"})
                try:
                    unseen = await start_trapped(ws, "trap '' INT", "sleep 7801")
                    seen = await start_trapped(ws, "trap '' INT", "sleep 7802")
                    for process_id in (unseen, seen):
                        # What the Exec call does when its caller leaves before the stream starts.
                        await asyncio.wrap_future(
                            asyncio.run_coroutine_threadsafe(
                                thread.daemon.processes.get(process_id).abandon(), thread.loop
                            )
                        )
                    events, _, _ = await collect(client.input(seen, yield_after_s=0.1))
                    assert isinstance(events[-1], Yielded), events[-1]
                    deadline = time.monotonic() + 20
                    while await alive(ws, "sleep 7801") and time.monotonic() < deadline:
                        await asyncio.sleep(0.2)
                    assert await alive(ws, "sleep 7801") == []
                    events, _, _ = await collect(client.input(unseen, yield_after_s=5))
                    assert isinstance(events[-1], Exited) and events[-1].stop_reason == "interrupted", events[-1]
                    # Past its grace (three times over) and still running.
                    events, _, _ = await collect(client.input(seen, yield_after_s=1.5))
                    assert isinstance(events[-1], Yielded), events[-1]
                    assert await alive(ws, "sleep 7802") == ["sleep 7802"]
                finally:
                    await ws.delete()
        finally:
            thread.stop()


class TestSessionTable:
    async def test_new_sessions_are_not_evicted_before_they_stream(self, private) -> None:
        """Many concurrent short execs: each either runs to completion or is refused; none is killed."""
        client = await private()
        async with client:
            ws = await client.create_workspace(labels={"test": "concurrent-execs"})
            try:

                async def one(i: int) -> str:
                    try:
                        result = await ws.exec(f"sleep 0.3; echo {i}", yield_after_s=30).wait()
                    except ResourceExhaustedError:
                        return "refused"
                    assert (result.stdout, result.exit_code, result.stop_reason) == (f"{i}\n", 0, "exited")
                    return "ran"

                outcomes = await asyncio.gather(*(one(i) for i in range(80)))
                assert outcomes.count("ran") >= 64
            finally:
                await ws.delete()

    async def test_eviction_does_not_stall_other_execs(self, private) -> None:
        """Evicting a TERM-ignoring session (2 s grace) does not make the exec that evicts it wait."""
        client = await private(workspace_max_sessions=4, kill_grace_s=2.0)
        async with client:
            a = await client.create_workspace(labels={"test": "evict-a"})
            try:
                for _ in range(4):
                    await start_trapped(a, "trap '' TERM", "sleep 1000")  # evicting one must take its grace

                async def timed() -> float:
                    start = time.monotonic()
                    await a.exec("true").wait(check=True)  # each evicts one of the four
                    return time.monotonic() - start

                durations = await asyncio.gather(timed(), timed())
                assert max(durations) < 1.5, durations
            finally:
                await a.delete()


class TestOutput:
    async def test_tiny_buffer_with_a_reader(self, workspace) -> None:
        """A reader attached to a 1-byte buffer still gets everything, promptly."""
        start = time.monotonic()
        result = await workspace.exec("echo hi", max_output_bytes=1).wait()
        assert result.stdout == "hi\n"
        assert time.monotonic() - start < 5
        result = await workspace.exec("head -c 100000 /dev/zero", max_output_bytes=1000, yield_after_s=30).wait()
        assert len(result.stdout_bytes) == 100000

    async def test_output_buffer_request_is_capped(self, workspace) -> None:
        """A caller cannot make the daemon hold unbounded unread output: 2**62 bytes is refused."""
        from sandboxd_client import InvalidArgumentError

        with pytest.raises(
            InvalidArgumentError, match=r"max_output_bytes must be 0 \(the daemon default\) to 16777216"
        ):
            await workspace.exec("yes", max_output_bytes=2**62).wait()
        result = await workspace.exec("echo within", max_output_bytes=16 * 1024**2).wait()
        assert result.stdout == "within\n"

    async def test_merge_stderr_keeps_order(self, workspace) -> None:
        """With merge_stderr the two streams keep their exact relative order."""
        command = "for i in $(seq 200); do echo o$i; echo e$i >&2; done"
        result = await workspace.exec(command, merge_stderr=True).wait()
        expected = "".join(f"o{i}\ne{i}\n" for i in range(1, 201))
        assert result.stdout == expected
        assert result.stderr == ""


class TestInterrupts:
    async def test_tty_ctrl_c_kills_what_was_left(self, client, workspace) -> None:
        """Ctrl-C in tty mode also ends what the interrupted command left behind."""
        process_id = await start_yielded(workspace, "setsid sleep 240 & sleep 100", tty=True)
        assert len(await until_alive(workspace, r"sleep (240|100)", 2)) == 2  # there is something to leave behind
        events, _, _ = await collect(client.input(process_id, "\u0003", yield_after_s=5))
        assert (events[-1].exit_code, events[-1].stop_reason) == (130, "interrupted")
        assert await alive(workspace, r"sleep 240") == []

    async def test_caught_ctrl_c_then_timeout_is_timeout(self, client, workspace) -> None:
        """A Ctrl-C the command survives does not decide the stop reason: a later timeout does."""
        process_id = await start_trapped(
            workspace, "trap 'echo caught' INT", "while :; do sleep 0.2; done", timeout_s=4
        )
        assert await input_until(client, process_id, "caught\n", "\u0003") == "caught\n"  # and it runs on
        events, _, _ = await collect(client.input(process_id, yield_after_s=10, follow=True))
        assert (events[-1].exit_code, events[-1].stop_reason) == (143, "timeout")

    async def test_caught_ctrl_c_then_kill_is_killed(self, client, workspace) -> None:
        """Kill after a Ctrl-C the command survived reports stop reason killed."""
        process_id = await start_trapped(workspace, "trap 'echo caught' INT", "while :; do sleep 0.2; done")
        await collect(client.input(process_id, "\u0003", yield_after_s=1))
        exited = await client.kill(process_id)
        assert (exited.exit_code, exited.stop_reason) == (143, "killed")

    async def test_signal_by_number_and_realtime_name(self, client, workspace) -> None:
        """Signal accepts numbers and SIGRTMIN+N."""
        process_id = await start_trapped(workspace, "trap 'echo rt; exit 4' 35", "while :; do sleep 0.1; done")
        await client.signal(process_id, "SIGRTMIN+1")
        events, out, _ = await collect(client.input(process_id, yield_after_s=5))
        # Signal 35 is SIGRTMIN+1 in the container; bash may also report the sleep it killed.
        assert "rt" in out.splitlines()
        assert events[-1].exit_code == 4
        process_id = await start_yielded(workspace, "sleep 100")
        await client.signal(process_id, "9")
        events, _, _ = await collect(client.input(process_id, yield_after_s=5))
        assert (events[-1].exit_code, events[-1].signal) == (137, "SIGKILL")


class TestInputs:
    async def test_an_exec_cancelled_while_starting_is_no_error(self, client, workspace, caplog) -> None:
        """Execs abandoned at every moment of their start leave no command behind and log no error
        (a start that fails with nobody awaiting it is no unretrieved exception)."""
        import gc

        for step in range(10):
            call = asyncio.create_task(workspace.exec("sleep 7.25").wait())
            # Deliberately different moments of the start, not a wait for readiness.
            await asyncio.sleep(0.003 * step)
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, SandboxError):
                await call
        deadline = time.monotonic() + 10
        while await alive(workspace, r"sleep 7\.25") and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert await alive(workspace, r"sleep 7\.25") == []
        gc.collect()
        assert [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()] == []

    async def test_huge_terminal_size_is_invalid(self, client, workspace) -> None:
        """Terminal sizes past 10000 cells are INVALID_ARGUMENT, and a running command is untouched."""
        with pytest.raises(InvalidArgumentError, match="terminal size"):
            await workspace.exec("stty size", tty=True, terminal_size=(70000, 70000)).wait()
        process_id = await start_yielded(workspace, "sleep 250", tty=True)
        with pytest.raises(InvalidArgumentError, match="terminal size"):
            await client.input(process_id, terminal_size=(70000, 10)).wait()
        events, _, _ = await collect(client.input(process_id, yield_after_s=0.3))
        assert isinstance(events[-1], Yielded)
        await client.kill(process_id)

    async def test_callers_path_does_not_break_sandboxd(self, client, workspace) -> None:
        """A caller's PATH reaches the command (after the login profile) but not the agent's choice of shell."""
        result = await workspace.exec("echo $PATH; /bin/echo hi", env={"PATH": "/opt/bin"}).wait()
        assert result.stdout == "/opt/bin\nhi\n"
        ws = await client.create_workspace(env={"PATH": "/opt/mytools/bin:/usr/bin:/bin"}, labels={"test": "path"})
        try:
            assert ws.info.state == "running"
            result = await ws.exec("printenv PATH").wait()
            assert result.stdout.strip().startswith("/")
            login_path = await ws.exec("env -i PATH=/x /bin/sh -c 'echo $PATH'").wait()
            assert login_path.stdout == "/x\n"
        finally:
            await ws.delete()

    async def test_command_starting_with_a_dash(self, workspace) -> None:
        """A command starting with '-' is run as a command, not read as a shell option."""
        result = await workspace.exec("-version").wait()
        assert result.exit_code == 127
        assert "-version: command not found" in result.stderr

    async def test_input_over_one_mebibyte_is_invalid(self, client, workspace) -> None:
        """One Input call carries at most 1 MiB; past that it is INVALID_ARGUMENT and the command lives."""
        process_id = await start_yielded(workspace, "wc -c")
        with pytest.raises(InvalidArgumentError, match="at most"):
            await client.input(process_id, "a" * (1024 * 1024 + 1)).wait()
        events, out, _ = await collect(client.input(process_id, "abc", close_stdin=True, yield_after_s=5))
        assert (out.strip(), events[-1].exit_code) == ("3", 0)

    async def test_tty_close_after_partial_line(self, client, workspace) -> None:
        """In tty mode, closing stdin after a partial line still gives the command end of file."""
        process_id = await start_yielded(workspace, "cat > got.txt; echo EOF-seen", tty=True)
        events, out, _ = await collect(client.input(process_id, "abc", close_stdin=True, yield_after_s=5))
        assert isinstance(events[-1], Exited)
        assert "EOF-seen" in out
        assert (await workspace.exec("cat got.txt").wait()).stdout == "abc"

    async def test_raw_bytes_input(self, client, workspace) -> None:
        """Input data bytes arrive as they are; a lone 0x03 there is data, not Ctrl-C."""
        process_id = await start_yielded(workspace, "od -An -tx1")
        events, out, _ = await collect(
            client.input(process_id, data=b"\xff\xfe\x00\x03A", close_stdin=True, yield_after_s=5)
        )
        assert out.split() == ["ff", "fe", "00", "03", "41"]
        assert events[-1].exit_code == 0


class TestIdsAndEngine:
    async def test_malformed_ids_do_not_alias(self, client, workspace) -> None:
        """`ws/` is not `ws`: malformed ids are INVALID_ARGUMENT for get and delete."""
        with pytest.raises(InvalidArgumentError):
            await client.get_workspace(f"{workspace.workspace_id}/")
        with pytest.raises(InvalidArgumentError):
            await client.delete_workspace(f"{workspace.workspace_id}/")
        assert (await workspace.exec("echo still").wait()).stdout == "still\n"

    async def test_delete_after_the_container_vanished(self, client, docker_client) -> None:
        """If the container was removed outside sandboxd, delete still removes the volume."""
        import docker.errors

        ws = await client.create_workspace(labels={"test": "vanished"})
        docker_client.containers.get(ws.info.container_id).remove(force=True)
        await client.delete_workspace(ws.workspace_id)
        with pytest.raises(docker.errors.NotFound):
            docker_client.volumes.get(ws.info.volume_name)
        with pytest.raises(NotFoundError):
            await client.delete_workspace(ws.workspace_id)

    async def test_bad_image_reference_is_invalid(self, client) -> None:
        """An image reference Docker cannot parse is INVALID_ARGUMENT, not INTERNAL."""
        with pytest.raises(InvalidArgumentError, match="UPPER/CASE"):
            await client.create_workspace(image="UPPER/CASE")

    async def test_zero_timeout_message(self, workspace) -> None:
        """A zero timeout is refused with a message that says what is allowed."""
        with pytest.raises(InvalidArgumentError, match="more than 0 s"):
            await workspace.exec("true", timeout_s=0).wait()


class TestCliOptions:
    def test_options_after_the_workspace(self, daemon, workspace_id) -> None:
        """`exec WS --timeout 5 -- CMD` takes the option and runs exactly CMD."""
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "sandboxd_client.cli",
                "--socket",
                daemon.socket_path,
                "exec",
                workspace_id,
                "--timeout",
                "5",
                "--",
                "echo",
                "hi",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (run.stdout, run.returncode) == ("hi\n", 0)

    def test_interactive_binary_stdin(self, daemon, workspace_id) -> None:
        """`exec -i` passes binary stdin byte for byte; a 0x03 byte in it is data."""
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "sandboxd_client.cli",
                "--socket",
                daemon.socket_path,
                "exec",
                "-i",
                workspace_id,
                "--",
                "od -An -tx1",
            ],
            input=b"\xff\xfe\x00\x03A",
            capture_output=True,
            timeout=60,
        )
        assert run.returncode == 0
        assert run.stdout.split() == [b"ff", b"fe", b"00", b"03", b"41"]
