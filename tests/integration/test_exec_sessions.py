"""Exec sessions against the real engine: yield, input, Ctrl-C, kill, timeouts, caps (issue 3)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from pathlib import Path

import pytest
from sandboxd_client import (
    Dropped,
    Exited,
    FailedPreconditionError,
    Heartbeat,
    InvalidArgumentError,
    NotFoundError,
    Output,
    ResourceExhaustedError,
    SandboxClient,
    SandboxError,
    Started,
    Yielded,
)

from tests.conftest import DaemonThread, make_settings
from tests.integration.helpers import collect, input_until, ps, start_ready, start_trapped, start_yielded, until_alive

pytestmark = pytest.mark.docker


class TestYieldAndPoll:
    async def test_sleep_yields_polls_and_ctrl_c(self, client, workspace) -> None:
        """`sleep 30` yields after ~0.5 s, a poll says running, Ctrl-C ends it with 130 quickly."""
        start = time.monotonic()
        events, _, _ = await collect(workspace.exec("sleep 30", yield_after_s=0.5))
        assert isinstance(events[0], Started)
        assert isinstance(events[-1], Yielded)
        assert 0.4 < time.monotonic() - start < 5
        process_id = events[-1].process_id
        poll, _, _ = await collect(client.input(process_id, yield_after_s=0.3))
        assert isinstance(poll[-1], Yielded)
        start = time.monotonic()
        stopped, _, _ = await collect(client.input(process_id, "\u0003"))
        assert isinstance(stopped[-1], Exited)
        assert (stopped[-1].exit_code, stopped[-1].signal, stopped[-1].stop_reason) == (130, "SIGINT", "interrupted")
        assert time.monotonic() - start < 3

    async def test_returns_as_soon_as_the_command_exits(self, workspace) -> None:
        """A quick command never sits out a long yield window."""
        start = time.monotonic()
        result = await workspace.exec("sleep 0.2; echo done", yield_after_s=60).wait()
        assert result.stdout == "done\n"
        assert time.monotonic() - start < 5

    async def test_python_keyboard_interrupt(self, client, workspace) -> None:
        """Ctrl-C to a sleeping Python gives 130 and KeyboardInterrupt on stderr."""
        # Printed once the interpreter is up, so its SIGINT handler (KeyboardInterrupt) is in place.
        command = "python3 -c 'import time; print(\"ready\", flush=True); time.sleep(60)'"
        process_id = await start_ready(workspace, command)
        events, _, err = await collect(client.input(process_id, "\u0003", yield_after_s=5))
        assert isinstance(events[-1], Exited)
        assert events[-1].exit_code == 130
        assert "KeyboardInterrupt" in err

    async def test_trap_exits_with_its_own_code(self, client, workspace) -> None:
        """A trap on INT runs and its exit code is kept (no signal), and so is its stop reason: it chose to exit."""
        process_id = await start_trapped(workspace, "trap 'echo got INT; exit 42' INT", "while :; do sleep 0.1; done")
        events, out, _ = await collect(client.input(process_id, "\u0003", yield_after_s=5))
        assert out == "got INT\n"
        assert (events[-1].exit_code, events[-1].signal, events[-1].stop_reason) == (42, "", "exited")

    async def test_yielded_command_starts_with_default_sigint(self, client, workspace) -> None:
        """A backgrounded (yielded) command still has Python's default SIGINT handler."""
        process_id = await start_yielded(
            workspace, "sleep 0.5; python3 -c 'import signal; print(signal.getsignal(signal.SIGINT))'"
        )
        events, out, _ = await collect(client.input(process_id, yield_after_s=5))
        assert isinstance(events[-1], Exited)
        assert out == "<built-in function default_int_handler>\n"

    async def test_ctrl_c_reaches_background_job_too(self, client, workspace) -> None:
        """`sleep 1000 & sleep 1001` then Ctrl-C: neither sleep is left."""
        process_id = await start_yielded(workspace, "sleep 1000 & sleep 1001")
        assert len(await until_alive(workspace, "sleep 100[01]", 2)) == 2
        events, _, _ = await collect(client.input(process_id, "\u0003", yield_after_s=5))
        assert events[-1].exit_code == 130
        assert await ps(workspace, "sleep 100[01]") == []


class TestCancel:
    async def test_cancelled_stream_interrupts_the_command(self, workspace) -> None:
        """Leaving an Exec stream before its end cancels the call, which the daemon delivers as Ctrl-C."""
        command = "trap 'echo interrupted > /workspace/got-int; exit 5' INT; echo ready; while :; do sleep 0.1; done"
        async for event in workspace.exec(command, yield_after_s=30):
            if isinstance(event, Output) and "ready" in event.text:
                break
        result = None
        for _ in range(50):
            result = await workspace.exec("cat /workspace/got-int 2>/dev/null").wait()
            if result.stdout:
                break
            await asyncio.sleep(0.1)
        assert result is not None
        assert result.stdout == "interrupted\n"


class TestInput:
    async def test_cat_echoes_then_ctrl_c(self, client, workspace) -> None:
        """`cat`: input hello\\n comes back, cat keeps running, Ctrl-C gives 130."""
        process_id = await start_yielded(workspace, "cat")
        assert await input_until(client, process_id, "hello\n", "hello\n") == "hello\n"  # and cat runs on
        events, _, _ = await collect(client.input(process_id, "\u0003"))
        assert events[-1].exit_code == 130

    async def test_raw_bytes_are_a_write_not_a_poll(self, client, workspace) -> None:
        """Input with only `data` waits the 250 ms write window, not the 5 s poll window."""
        process_id = await start_yielded(workspace, "cat")
        start = time.monotonic()
        events, out, _ = await collect(client.input(process_id, data=b"\xffraw\n"))
        assert isinstance(events[-1], Yielded)
        assert time.monotonic() - start < 3  # the poll window would be 5 s
        # What cat echoes comes when it gets to it (a loaded gVisor sandbox: after the window).
        assert out + await input_until(client, process_id, "raw\n", seen=out) == "\ufffdraw\n"
        await client.kill(process_id)

    async def test_close_stdin_ends_cat(self, client, workspace) -> None:
        """Closing stdin is end of input: `wc -c` counts what was written and exits 0."""
        process_id = await start_yielded(workspace, "wc -c")
        events, out, _ = await collect(client.input(process_id, "12345", close_stdin=True, yield_after_s=5))
        assert out.strip() == "5"
        assert events[-1].exit_code == 0

    async def test_input_waits_for_a_reader_that_is_not_reading_yet_and_none_is_lost(self, client, workspace) -> None:
        """20 MiB for a command that reads none until told: the writes wait (the agent holds at most
        16 MiB unread), as a writer to a full pipe does, and every byte arrives."""
        process_id = await start_yielded(workspace, "until [ -e /tmp/go ]; do sleep 0.05; done; wc -c")
        piece, calls = b"x" * (1 << 20), [0]

        async def write_all() -> None:
            for _ in range(20):
                await client.input(process_id, data=piece, yield_after_s=0.25).wait()
                calls[0] += 1

        writer = asyncio.create_task(write_all())
        while not writer.done():  # until the writes stop going through (or all did)
            before = calls[0]
            await asyncio.sleep(1.0)
            if calls[0] == before:
                break
        assert calls[0] < 20, "every write went through while nothing read them"
        await workspace.exec("touch /tmp/go").wait(check=True)
        await writer
        events, out, _ = await collect(client.input(process_id, close_stdin=True, yield_after_s=30))
        assert (out.strip(), events[-1].exit_code) == (str(20 << 20), 0)

    async def test_input_after_exit_returns_the_rest(self, client, workspace) -> None:
        """Input on an exited process returns its unread output and exit status."""
        process_id = await start_yielded(workspace, "sleep 0.5; echo late; exit 4")
        await asyncio.sleep(1.5)
        events, out, _ = await collect(client.input(process_id))
        assert out == "late\n"
        assert events[-1].exit_code == 4

    async def test_unknown_process_is_not_found(self, client) -> None:
        """Input, Kill and Signal on an unknown id are NOT_FOUND."""
        with pytest.raises(NotFoundError, match="p-nonexistent"):
            await client.input("p-nonexistent").wait()
        with pytest.raises(NotFoundError, match="p-nonexistent"):
            await client.kill("p-nonexistent")
        with pytest.raises(NotFoundError, match="p-nonexistent"):
            await client.signal("p-nonexistent", "SIGTERM")

    async def test_signal_rpc(self, client, workspace) -> None:
        """Signal delivers a named signal to the process group."""
        process_id = await start_trapped(workspace, "trap 'echo usr1; exit 3' USR1", "while :; do sleep 0.1; done")
        await client.signal(process_id, "SIGUSR1")
        events, out, _ = await collect(client.input(process_id, yield_after_s=5))
        assert (out, events[-1].exit_code) == ("usr1\n", 3)

    async def test_input_while_another_call_streams(self, client, workspace) -> None:
        """Input while an Exec stream is attached writes and returns at once; output stays with the stream."""
        handle = workspace.exec("cat", yield_after_s=5)
        events: list[object] = []

        async def consume() -> None:
            async for event in handle:
                events.append(event)

        task = asyncio.create_task(consume())
        while not handle.process_id:
            await asyncio.sleep(0.05)
        side, side_out, _ = await collect(client.input(handle.process_id, "ping\n", yield_after_s=3))
        assert isinstance(side[-1], Yielded)
        assert side_out == ""
        await task
        assert "".join(e.text for e in events if isinstance(e, Output)) == "ping\n"
        await client.kill(handle.process_id)


class TestKillAndTimeout:
    async def test_ignoring_sigint_and_sigterm(self, client, workspace) -> None:
        """Ctrl-C leaves an INT/TERM-ignoring loop running; Kill ends it with 137/SIGKILL, nothing left."""
        process_id = await start_trapped(workspace, "trap '' INT TERM", "while :; do sleep 0.1; done")
        events, _, _ = await collect(client.input(process_id, "\u0003", yield_after_s=1))
        assert isinstance(events[-1], Yielded), "Ctrl-C must never escalate by itself"
        poll, _, _ = await collect(client.input(process_id, yield_after_s=0.3))
        assert isinstance(poll[-1], Yielded)
        exited = await client.kill(process_id, grace_s=1)
        # It survived its Ctrl-C, so the Kill is what stopped it.
        assert (exited.exit_code, exited.signal, exited.stop_reason) == (137, "SIGKILL", "killed")
        assert await ps(workspace, r"sleep 0\.1") == []

    async def test_kill_reports_sigterm_when_obeyed(self, client, workspace) -> None:
        """Kill of a command that obeys SIGTERM reports 143/SIGTERM and stop reason killed."""
        process_id = await start_yielded(workspace, "sleep 1000")
        exited = await client.kill(process_id)
        assert (exited.exit_code, exited.signal, exited.stop_reason) == (143, "SIGTERM", "killed")

    async def test_a_shorter_kill_brings_a_running_ladder_forward(self, client, workspace) -> None:
        """Kill(grace 50 s) of a command ignoring SIGTERM, then Kill(grace 0.5 s): SIGKILL within seconds."""
        process_id = await start_trapped(workspace, "trap 'echo TERM >> term' TERM", "while :; do sleep 0.1; done")
        first = asyncio.create_task(client.kill(process_id, grace_s=50))
        # The first ladder has begun once its SIGTERM has landed (and been shrugged off).
        deadline = time.monotonic() + 20
        while "TERM" not in (await workspace.exec("cat term 2>/dev/null").wait()).stdout:
            assert time.monotonic() < deadline, "the first Kill's SIGTERM never landed"
            await asyncio.sleep(0.05)
        started = time.monotonic()
        second = await client.kill(process_id, grace_s=0.5)
        assert time.monotonic() - started < 8
        assert (second.exit_code, second.signal, second.stop_reason) == (137, "SIGKILL", "killed")
        assert (await asyncio.wait_for(first, 10)).signal == "SIGKILL"

    async def test_a_kill_grace_past_the_bound_is_refused(self, client, workspace) -> None:
        """A grace over 60 s (a ladder that would never end) is INVALID_ARGUMENT, naming the bound."""
        process_id = await start_yielded(workspace, "sleep 1000")
        with pytest.raises(InvalidArgumentError, match=r"grace must be at most 60 s, got 1e\+10 s"):
            await client.kill(process_id, grace_s=1e10)
        exited = await client.kill(process_id, grace_s=1)
        assert exited.stop_reason == "killed"

    async def test_timeout_kills_the_whole_tree(self, workspace) -> None:
        """A 2 s timeout ends sleep &, setsid sleep & and a busy loop within 5 s; none is left."""
        start = time.monotonic()
        events, _, _ = await collect(
            workspace.exec("sleep 1000 & setsid sleep 1001 & python3 -c 'while True: pass'", timeout_s=2, follow=True)
        )
        elapsed = time.monotonic() - start
        exited = events[-1]
        assert isinstance(exited, Exited)
        assert exited.stop_reason == "timeout"
        # The ladder reports the signal that actually ended the command: all three obey SIGTERM.
        assert (exited.exit_code, exited.signal) == (143, "SIGTERM")
        assert elapsed < 5
        assert await ps(workspace, r"sleep 100[01]|python3 -c while True: pass") == []

    async def test_timeout_escalates_to_sigkill(self, client, workspace) -> None:
        """A command ignoring SIGTERM is SIGKILLed after the grace: 137/SIGKILL, stop reason timeout."""
        # "ready" comes after the trap and the fork of the setsid child: the timeout cannot meet TERM's default.
        process_id = await start_ready(
            workspace, "trap '' TERM; setsid sleep 1002 & echo ready; while :; do sleep 0.1; done", timeout_s=4
        )
        await until_alive(workspace, "sleep 1002", 1)
        events, _, _ = await collect(client.input(process_id, yield_after_s=10, follow=True))
        exited = events[-1]
        assert (exited.exit_code, exited.signal, exited.stop_reason) == (137, "SIGKILL", "timeout")
        assert await ps(workspace, "sleep 1002") == []

    async def test_output_before_timeout_is_kept(self, workspace) -> None:
        """Output produced before a timeout is delivered with the timeout status."""
        events, out, _ = await collect(workspace.exec("echo before; sleep 100", timeout_s=1.5, follow=True))
        assert out == "before\n"
        assert events[-1].stop_reason == "timeout"

    async def test_normal_completion_kills_nothing(self, workspace) -> None:
        """`server &` returns at once with exit 0; the server keeps answering 200 requests."""
        start = time.monotonic()
        result = await workspace.exec("python3 -m http.server 8123 --bind 127.0.0.1 &", yield_after_s=30).wait()
        assert time.monotonic() - start < 2
        assert result.exit_code == 0
        script = (
            "import urllib.request, time\n"
            "for _ in range(50):\n"
            "    try:\n"
            "        urllib.request.urlopen('http://127.0.0.1:8123/'); break\n"
            "    except OSError: time.sleep(0.1)\n"
            "codes = [urllib.request.urlopen('http://127.0.0.1:8123/').status for _ in range(200)]\n"
            "print(len(codes), set(codes))\n"
        )
        import shlex

        result = await workspace.exec(f"python3 -c {shlex.quote(script)}", timeout_s=120, yield_after_s=119).wait()
        assert result.stdout == "200 {200}\n"


class TestOutputCaps:
    async def test_attached_reader_loses_nothing(self, workspace) -> None:
        """A reader that keeps up gets every byte even far past the buffer size."""
        result = await workspace.exec("head -c 20000000 /dev/zero", max_output_bytes=65536).wait()
        assert len(result.stdout_bytes) == 20_000_000
        assert result.dropped_bytes == 0

    async def test_a_caller_that_walks_away_finds_no_more_than_the_buffer(self, client, workspace) -> None:
        """A flood yielded mid-stream: the next poll finds at most max_output_bytes before the gap.

        While a caller streams, up to 16 MiB may be on its way; when it leaves, what it left
        beyond the session's 64 KiB is dropped and counted, like the flood's rest: every byte
        is either delivered or counted, exactly.
        """
        total = 300_000_000
        handle = workspace.exec(f"head -c {total} /dev/zero", max_output_bytes=65536, yield_after_s=1.0)
        events, streamed = [], 0
        async for event in handle:  # a slow reader: the agent is 16 MiB ahead of it when it leaves
            events.append(event)
            streamed += len(event.data) if isinstance(event, Output) else 0
            await asyncio.sleep(0.05)
        assert isinstance(events[-1], Yielded), events[-1]
        await asyncio.sleep(1)  # the flood goes on with nobody reading
        polled = [e async for e in client.input(events[-1].process_id, "", yield_after_s=60)]
        gaps = [i for i, e in enumerate(polled) if isinstance(e, Dropped)]
        assert gaps, "nothing was dropped"
        head = sum(len(e.data) for e in polled[: gaps[0]] if isinstance(e, Output))
        assert head <= 65536
        delivered = streamed + sum(len(e.data) for e in polled if isinstance(e, Output))
        dropped = sum(e.dropped_bytes for e in polled if isinstance(e, Dropped))
        assert (delivered + dropped, polled[-1].dropped_bytes) == (total, dropped)  # type: ignore[union-attr]
        assert polled[-1].exit_code == 0  # type: ignore[union-attr]


class TestSpill:
    async def test_large_output_is_spilled_whole(self, workspace) -> None:
        """Past spill_after_bytes, the whole output (from byte one) is in the spill file, in the order
        written (merged: two pipes read side by side give no order between them)."""
        result = await workspace.exec(
            "head -c 100000 /dev/zero | tr '\\0' x; echo tail >&2", spill_after_bytes=16000, merge_stderr=True
        ).wait()
        assert result.spill_path == f"/workspace/.sandboxd/spill/{result.process_id}.out"
        spilled = await workspace.exec(f"wc -c < {result.spill_path}; tail -c 6 {result.spill_path}").wait()
        assert spilled.stdout == "100005\nxtail\n"

    async def test_small_output_is_not_spilled(self, workspace) -> None:
        """Below the threshold there is no spill file and no path."""
        result = await workspace.exec("echo small", spill_after_bytes=16000).wait()
        assert result.spill_path == ""
        check = await workspace.exec(f"test -e /workspace/.sandboxd/spill/{result.process_id}.out; echo $?").wait()
        assert check.stdout == "1\n"


class TestEnvironment:
    async def test_non_interactive_defaults(self, workspace) -> None:
        """Without a terminal: TERM=dumb, pagers cat, NO_COLOR=1, LANG=C.UTF-8, and no editor to wait for."""
        result = await workspace.exec(
            "echo $TERM $PAGER $GIT_PAGER $NO_COLOR $LANG $GIT_EDITOR $EDITOR $VISUAL $GIT_MERGE_AUTOEDIT;"
            " test -t 0 || echo notty"
        ).wait()
        assert result.stdout == "dumb cat cat 1 C.UTF-8 true true true no\nnotty\n"

    async def test_git_never_waits_for_an_editor(self, workspace) -> None:
        """`git commit` with no message aborts at once, also when the caller sets a real TERM."""
        command = (
            "git init -q /tmp/g && cd /tmp/g && git -c user.name=a -c user.email=a@b commit --allow-empty; echo rc=$?"
        )
        result = await workspace.exec(command, env={"TERM": "xterm-256color"}, timeout_s=20).wait()
        assert "Aborting commit due to empty commit message." in result.stderr
        assert result.stdout.endswith("rc=1\n")
        assert result.stop_reason == "exited"

    async def test_callers_editor_wins(self, client, workspace) -> None:
        """An editor the caller (workspace or call env) names is the one git runs."""
        ws = await client.create_workspace(env={"GIT_EDITOR": "echo workspace-editor >"})
        try:
            command = (
                "git init -q /tmp/g && cd /tmp/g && git -c user.name=a -c user.email=a@b commit -q --allow-empty"
                " && git log -1 --format=%s"
            )
            assert (await ws.exec(command).wait()).stdout == "workspace-editor\n"
            called = await ws.exec(f"rm -rf /tmp/g; {command}", env={"GIT_EDITOR": "echo call-editor >"}).wait()
            assert called.stdout == "call-editor\n"
        finally:
            await ws.delete()
        # A caller's EDITOR alone is used too: the default GIT_EDITOR (which git prefers) stands aside.
        called = await workspace.exec(command, env={"EDITOR": "echo editor >"}).wait()
        assert called.stdout == "editor\n"
        shown = await workspace.exec(
            "echo ${GIT_EDITOR-unset} ${VISUAL-unset} $GIT_MERGE_AUTOEDIT", env={"VISUAL": "x"}
        ).wait()
        assert shown.stdout == "unset x no\n"

    async def test_caller_overrides_defaults(self, workspace) -> None:
        """The caller's env wins over the defaults."""
        result = await workspace.exec("echo $TERM $PAGER", env={"TERM": "xterm", "PAGER": "less"}).wait()
        assert result.stdout == "xterm less\n"


class TestPty:
    async def test_python_repl_survives_ctrl_c(self, client, workspace) -> None:
        """A tty Python REPL: Ctrl-C interrupts a busy loop, the REPL lives on and answers 42."""
        process_id = await start_ready(workspace, "python3 -q", ready=">>> ", tty=True)  # the REPL reads, SIGINT caught
        await input_until(client, process_id, "while True: pass", "while True: pass\n")  # echoed: the loop runs
        await input_until(client, process_id, "KeyboardInterrupt", "\u0003")  # and the REPL still runs
        out = await input_until(client, process_id, "42", "print(6*7)\n")
        assert "42" in out.split("print(6*7)", 1)[-1]
        exited = await client.kill(process_id)
        assert exited.stop_reason == "killed"  # the Ctrl-C it survived does not decide

    async def test_tty_merges_streams_and_is_a_terminal(self, workspace) -> None:
        """Under a tty both streams arrive on stdout, and the terminal has the asked size."""
        result = await workspace.exec("test -t 1 && stty size; echo err >&2", tty=True).wait()
        assert result.stdout.replace("\r\n", "\n") == "24 80\nerr\n"
        assert result.stderr == ""


class TestHostile:
    @pytest.mark.workspace(pids=128)
    async def test_forty_calls_at_once_through_a_fork_bomb_leave_the_agent_serving(
        self, workspace, runtime: str, docker_client
    ) -> None:
        """The agent runs on the few threads it keeps (every one is a task of the machine's too):
        a fork bomb holding every pid of the workspace while forty calls come at once fails those
        calls cleanly, and the agent serves again once the bomb's timeout has ended it."""
        if runtime == "runc":  # gVisor's threads are its own, not the host's tasks
            init = docker_client.containers.get(workspace.info.container_id).attrs["State"]["Pid"]
            agent = Path(f"/proc/{init}/task/{init}/children").read_text().split()[0]
            assert len(list(Path(f"/proc/{agent}/task").iterdir())) <= 16
        await workspace.exec(":(){ :|:& };:", timeout_s=6).wait()

        async def call(index: int) -> str:
            try:
                if index % 2:
                    await workspace.read_file("/etc/hostname")
                else:
                    await workspace.exec("true", timeout_s=5).wait()
            except (ResourceExhaustedError, FailedPreconditionError):
                return "refused"
            return "served"

        outcomes = await asyncio.gather(*(call(i) for i in range(40)))
        assert set(outcomes) <= {"refused", "served"}
        deadline = time.monotonic() + 30
        while True:  # the bomb's timeout ends every copy: then calls are served again
            try:
                result = await workspace.exec("echo alive").wait()
            except ResourceExhaustedError:
                result = None
            if result is not None and result.stdout == "alive\n":
                break
            assert time.monotonic() < deadline, "the agent stopped serving"
            await asyncio.sleep(0.5)

    async def test_the_commands_parent_is_the_agent_and_out_of_reach(self, workspace, runtime: str) -> None:
        """A command's parent is the agent, root's: no fd of it opens for the command (while a
        neighbour's pipes and a file operation's are there too) and neither does its memory, under
        runc and gVisor alike; its environment is closed under runc. gVisor makes every process's
        environ and fd directory world-readable: the agent's environ then holds no variable the
        command lacks itself, and the one fd that opens is its stdin, Docker's /dev/null."""
        neighbour = await start_ready(workspace, "echo ready; while :; do echo tick; sleep 0.05; done")
        probe = (
            "tr '\\0' ' ' < /proc/$PPID/cmdline; echo; "
            "stat -c '%u' /proc/$PPID; "
            "(cat /proc/$PPID/environ >/dev/null) 2>/dev/null && echo environ-open || echo environ-denied; "
            "(exec 3</proc/$PPID/mem) 2>/dev/null && echo mem-open || echo mem-denied; "
            "for n in $(seq 0 63); do "
            '  (exec 3</proc/$PPID/fd/$n) 2>/dev/null && echo "fd$n-read $(head -c 1 /proc/$PPID/fd/$n | wc -c)"; '
            "  (exec 3>/proc/$PPID/fd/$n) 2>/dev/null && echo fd$n-write; "
            "done; echo probed"
        )
        upload = asyncio.create_task(workspace.write_file("big.bin", "x" * (8 << 20)))
        result = await workspace.exec(probe).wait()
        await upload
        environ = "environ-open" if runtime == "runsc" else "environ-denied"
        opened = "fd0-read 0\nfd0-write\n" if runtime == "runsc" else ""
        assert (
            result.stdout
            == f"/.sandboxd/sandboxd-agent serve --own sandbox /workspace \n0\n{environ}\nmem-denied\n{opened}probed\n"
        )
        if runtime == "runsc":
            names = await workspace.exec(
                "tr '\\0' '\\n' < /proc/$PPID/environ | cut -d= -f1 | sort -u; echo ---; env | cut -d= -f1 | sort -u"
            ).wait(check=True)
            agent, _, command = names.stdout.partition("---\n")
            assert set(agent.split()) <= set(command.split()), names.stdout
        await workspace.client.kill(neighbour)

    async def test_zombies_are_reaped(self, workspace, runtime: str) -> None:
        """300 orphaned `(sleep 0.01 &)` leave no zombie behind (100 under gVisor, where forks are slow)."""
        count = 100 if runtime == "runsc" else 300
        await workspace.exec(f"for i in $(seq {count}); do (sleep 0.01 &); done; sleep 1").wait(check=True)
        result = await workspace.exec("ps -eo stat= | grep -c '^Z' || true").wait()
        assert result.stdout.strip() == "0"

    @pytest.mark.workspace(memory_bytes=256 * 1024**2)
    async def test_oom_is_reported_and_workspace_survives(self, workspace, runtime: str) -> None:
        """A memory bomb in 256 MiB is oom_killed with the limit; the workspace and its files survive.

        Under gVisor the sandbox's own memory accounting refuses the allocation first
        (the program fails, exit 1) and the cgroup OOM killer never strikes the program; on
        a loaded host the program may instead stall in gVisor's reclaim until its timeout
        ends it; or the host's OOM killer ends the sandbox as a whole, the container
        restarts, and the command ends `failed` saying the agent restarted (README, gVisor).
        The workspace and its files survive each.
        """
        await workspace.exec("echo precious > keep.txt").wait(check=True)
        bomb = """python3 -c "a=[b'x'*10**7 for _ in range(10**6)]" """
        result = await workspace.exec(bomb, timeout_s=30, follow=True).wait()
        if runtime == "runsc":
            outcome = (result.exit_code, result.signal, result.oom_killed, result.stop_reason)
            restarted = result.stop_reason == "failed" and "agent restarted" in result.message
            assert outcome == (1, "", False, "exited") or result.stop_reason == "timeout" or restarted, outcome
        else:
            assert (result.exit_code, result.signal, result.oom_killed) == (137, "SIGKILL", True)
            assert str(256 * 1024**2) in result.message
        deadline = time.monotonic() + 60
        while True:
            try:
                after = await workspace.exec("echo alive; cat keep.txt").wait()
                break
            except SandboxError:  # the restarted container's agent is not up yet
                assert runtime == "runsc" and time.monotonic() < deadline
                await asyncio.sleep(0.5)
        assert after.stdout == "alive\nprecious\n"

    @pytest.mark.workspace(pids=128)
    async def test_fork_bomb_is_contained(self, client, workspace, runtime: str) -> None:
        """A fork bomb hits the pids limit, a neighbour stays responsive, and its timeout ends all of it.

        Counted: the workspace's processes but init and the agent's (its idle spawn helper comes
        and goes as commands start, so it would make the baseline one off).
        """
        count = "ps -e -o args= | grep -vc sandboxd-agent"
        baseline = int((await workspace.exec(count).wait()).stdout)
        neighbour = await client.create_workspace(labels={"test": "fork-bomb-neighbour"})
        try:
            start = time.monotonic()
            # The top-level shell returns at once; the bomb lives on in the background.
            bomb = await workspace.exec(":(){ :|:& };:", timeout_s=10, follow=True).wait()
            # The top-level shell returns at once, unless bash's own fork retries (it sleeps on
            # EAGAIN) keep it until the timeout.
            outcomes = {(0, "exited"), (137, "timeout")}
            if runtime == "runsc":
                # gVisor: the bomb may end the sandbox itself; the workspace restarts and the command
                # ends failed saying so (README, "gVisor"). The rest holds as under runc.
                outcomes.add((255, "failed"))
            assert (bomb.exit_code, bomb.stop_reason) in outcomes, bomb
            if bomb.stop_reason == "failed":
                assert "agent restarted" in bomb.message, bomb
            await asyncio.sleep(3)
            other_start = time.monotonic()
            other = await neighbour.exec("echo other").wait()
            assert other.stdout == "other\n"
            assert time.monotonic() - other_start < 2
        finally:
            await neighbour.delete()
        after = None
        while time.monotonic() - start < 40:
            try:
                after = await workspace.exec(f"echo ok; {count}").wait()
            except ResourceExhaustedError:  # while the bomb holds every pid, nothing new can start
                after = None
            if after is not None and after.stdout.split()[0] == "ok" and int(after.stdout.split()[1]) <= baseline:
                break
            await asyncio.sleep(1)
        assert after is not None
        assert after.stdout.split()[0] == "ok"
        assert int(after.stdout.split()[1]) <= baseline
        assert time.monotonic() - start < 10 + 15


class TestSessions:
    async def test_eviction_lru_then_exited_first(self, tmp_path, docker_client) -> None:
        """A full workspace's oldest idle session is evicted (killed, NOT_FOUND saying evicted); exited go first.

        The cap is 8 here, not the default 64 (which ``test_settings`` holds): the rule is the same
        at any cap, and 65 starts took 18 s of a loaded suite.
        """

        def sleeps(container_id: str) -> set[str]:
            # Read the process list with the SDK: an exec through sandboxd would itself take a session.
            out = docker_client.containers.get(container_id).exec_run(["ps", "-eo", "args="]).output.decode()
            return {line.split()[1] for line in out.splitlines() if re.fullmatch(r"sleep 100\.\d+", line.strip())}

        cap = 8
        thread = DaemonThread(make_settings(tmp_path, workspace_max_sessions=cap)).start()
        try:
            async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
                ws = await client.create_workspace(labels={"test": "eviction"})
                try:
                    ids = [await start_yielded(ws, f"sleep 100.{i:03d}") for i in range(cap)]
                    newest = await start_yielded(ws, f"sleep 100.{cap:03d}")
                    with pytest.raises(NotFoundError, match="evicted"):
                        await client.input(ids[0]).wait()
                    alive = sleeps(ws.info.container_id)
                    assert "100.000" not in alive, "an evicted session's process must be killed"
                    assert len(alive) == cap
                    # One session exits: it is evicted before any idle running one.
                    await client.kill(ids[5])
                    await start_yielded(ws, f"sleep 100.{cap + 1:03d}")
                    with pytest.raises(NotFoundError, match="evicted"):
                        await client.input(ids[5]).wait()
                    poll, _, _ = await collect(client.input(ids[1], yield_after_s=0.25))
                    assert isinstance(poll[-1], Yielded), "the oldest running session must survive this time"
                    assert len(sleeps(ws.info.container_id)) == cap
                    assert newest in {p.process_id for p in await client.list_processes(ws.workspace_id)}
                finally:
                    await ws.delete()
        finally:
            thread.stop()

    async def _exited_with_output_to_come(self, client, ws, docker_client) -> str:  # type: ignore[no-untyped-def]
        """A ``seq 1 100000`` that printed only once its Exec had yielded and that has exited since:
        its 588,895 bytes are in its agent (which keeps up to 16 MiB of it), sent when a caller streams
        them. The daemon's output budget is a byte: what it was let have went back to the agent."""
        container = docker_client.containers.get(ws.info.container_id)
        command = "until [ -e /tmp/go ]; do sleep 0.02; done; seq 1 100000"
        process_id = await start_yielded(ws, command, max_output_bytes=16 * 1024 * 1024)
        container.exec_run(["touch", "/tmp/go"])  # through the engine: no session of sandboxd's
        deadline = time.monotonic() + 30
        while any(p.running for p in await client.list_processes(ws.workspace_id) if p.process_id == process_id):
            assert time.monotonic() < deadline, "the command never exited"
            await asyncio.sleep(0.05)
        return process_id

    async def _polled_while_frozen(self, client, process_id: str, container):  # type: ignore[no-untyped-def]
        """Freeze the workspace (its agent sends nothing), then poll the process until its stream is
        attached (its heartbeats show it); return the task collecting the poll's events."""
        container.pause()
        events: list[object] = []
        attached = asyncio.Event()

        async def poll() -> list[object]:
            async for event in client.input(process_id, yield_after_s=120):
                events.append(event)
                if isinstance(event, Heartbeat):
                    attached.set()
            return events

        task = asyncio.create_task(poll())
        await asyncio.wait_for(attached.wait(), 30)
        return task

    async def test_an_exited_session_still_delivering_is_never_evicted(self, tmp_path, docker_client) -> None:
        """A command has exited but its output has not come yet; a caller streams it; a new command
        fills the workspace. The streamed session is not evicted (the idle one is), and its caller gets
        every byte and the exit: never a clean exit with output missing."""
        settings = make_settings(tmp_path, workspace_max_sessions=2, heartbeat_interval_s=0.2, output_memory_bytes=1)
        thread = DaemonThread(settings).start()
        try:
            async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
                ws = await client.create_workspace(labels={"test": "evict-streamed"})
                container = docker_client.containers.get(ws.info.container_id)
                try:
                    process_id = await self._exited_with_output_to_come(client, ws, docker_client)
                    idle = (await ws.exec("true").wait()).process_id  # exited and nobody streams it
                    reader = await self._polled_while_frozen(client, process_id, container)
                    try:
                        starting = asyncio.create_task(ws.exec("echo third").wait())  # needs a session
                        deadline = time.monotonic() + 30
                        while True:  # the idle one makes room (the frozen agent cannot start the command yet)
                            try:
                                await client.input(idle, yield_after_s=0.25).wait()
                            except NotFoundError as exc:
                                evicted = exc.message
                                break
                            assert not reader.done(), f"the streamed session was evicted: {reader.result()}"
                            assert time.monotonic() < deadline, "nothing was evicted"
                            await asyncio.sleep(0.05)
                    finally:
                        container.unpause()
                    assert "was evicted: it had exited" in evicted
                    events = await asyncio.wait_for(reader, 60)
                    out = b"".join(e.data for e in events if isinstance(e, Output))
                    assert [e for e in events if isinstance(e, Dropped)] == []
                    assert out == "".join(f"{i}\n" for i in range(1, 100001)).encode()
                    exited = events[-1]
                    assert isinstance(exited, Exited)
                    assert (exited.exit_code, exited.stop_reason, exited.dropped_bytes) == (0, "exited", 0)
                    assert (await asyncio.wait_for(starting, 60)).stdout == "third\n"
                finally:
                    with contextlib.suppress(Exception):
                        container.unpause()
                    await ws.delete()
        finally:
            thread.stop()

    async def test_output_that_will_never_come_is_a_counted_gap_before_the_exit(self, tmp_path, docker_client) -> None:
        """The workspace of an exited command whose output has not come is deleted while a caller streams
        it: the caller gets a gap of the missing bytes, then the exit, which counts them."""
        thread = DaemonThread(make_settings(tmp_path, heartbeat_interval_s=0.2, output_memory_bytes=1)).start()
        try:
            async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
                ws = await client.create_workspace(labels={"test": "gap-at-delete"})
                container = docker_client.containers.get(ws.info.container_id)
                process_id = await self._exited_with_output_to_come(client, ws, docker_client)
                reader = await self._polled_while_frozen(client, process_id, container)
                await ws.delete()
                events = await asyncio.wait_for(reader, 60)
                kinds = [type(e) for e in events if not isinstance(e, Heartbeat)]
                assert kinds == [Dropped, Exited], events
                gap, exited = (e for e in events if not isinstance(e, Heartbeat))
                assert (gap.dropped_bytes, exited.exit_code, exited.dropped_bytes) == (588_895, 0, 588_895)
        finally:
            thread.stop()

    async def test_heartbeat_on_a_silent_stream(self, tmp_path) -> None:
        """A silent command's stream carries heartbeats at the configured interval."""
        thread = DaemonThread(make_settings(tmp_path, heartbeat_interval_s=0.5)).start()
        try:
            async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
                ws = await client.create_workspace(labels={"test": "heartbeat"})
                try:
                    events, _, _ = await collect(ws.exec("sleep 2.2", yield_after_s=10))
                    beats = [e for e in events if isinstance(e, Heartbeat)]
                    assert len(beats) >= 3
                    assert all(b.elapsed_s > 0 for b in beats)
                    assert isinstance(events[-1], Exited)
                finally:
                    await ws.delete()
        finally:
            thread.stop()

    async def test_list_processes(self, client, workspace) -> None:
        """ListProcesses shows running and exited sessions with their commands."""
        running = await start_yielded(workspace, "sleep 50")
        await workspace.exec("true").wait()
        listed = {p.process_id: p for p in await client.list_processes(workspace.workspace_id)}
        assert listed[running].running
        assert listed[running].command == "sleep 50"
        assert any(not p.running and p.exited and p.exited.exit_code == 0 for p in listed.values())
        await client.kill(running)

    async def test_fast_commands_are_listed_as_exited(self, client, workspace) -> None:
        """A command that exits before its start is acknowledged is never listed as running."""
        finished = set()
        for _ in range(12):
            result = await workspace.exec("true").wait()
            assert result.exit_code == 0
            finished.add(result.process_id)
        listed = {p.process_id: p for p in await client.list_processes(workspace.workspace_id)}
        still_running = [pid for pid in finished if listed[pid].running]
        assert still_running == []
        assert {listed[pid].exited.exit_code for pid in finished} == {0}
