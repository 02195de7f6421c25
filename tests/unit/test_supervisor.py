"""The in-container supervisor, run as a local process (no Docker).

These pin the frame protocol and the process-group mechanics quickly; the
integration suite checks the same behaviour inside real containers.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import sys
import time

import pytest

from sandboxd import frames
from sandboxd.incontainer import script_argv


class Supervised:
    """A supervisor subprocess speaking frames over its stdin/stdout."""

    def __init__(self, process: asyncio.subprocess.Process, marker: str) -> None:
        self.process = process
        self.marker = marker
        self.decoder = frames.FrameDecoder()
        self.pending: list[tuple[bytes, bytes]] = []

    @classmethod
    async def start(cls, command: str, **config: object) -> Supervised:
        marker = f"SANDBOXD_PROCESS_ID=test-{secrets.token_hex(4)}"
        full = {"command": command, "cwd": "/tmp", "marker": marker, **config}
        env = {**os.environ, marker.split("=")[0]: marker.split("=")[1]}
        # The marker env carries the marker as the command's env would; the supervisor itself has it too here.
        full["env"] = {marker.split("=")[0]: marker.split("=")[1]}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *script_argv("supervisor.py", full, tokens=True)[1:],
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        return cls(process, marker)

    async def next(self) -> tuple[bytes, bytes]:
        assert self.process.stdout is not None
        while not self.pending:
            data = await asyncio.wait_for(self.process.stdout.read(65536), 10)
            if not data:
                raise EOFError
            self.pending += list(self.decoder.feed(data))
        return self.pending.pop(0)

    async def until_exit(self) -> tuple[bytes, bytes, dict[str, int]]:
        out, err = b"", b""
        while True:
            kind, payload = await self.next()
            if kind == frames.STDOUT:
                out += payload
            elif kind == frames.STDERR:
                err += payload
            elif kind == frames.EXITED:
                return out, err, json.loads(payload)

    async def send(self, frame: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(frame)
        await self.process.stdin.drain()

    async def started(self) -> int:
        kind, payload = await self.next()
        assert kind == frames.STARTED, (kind, payload)
        return int(json.loads(payload)["pid"])

    async def close(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()


@pytest.fixture
async def run():  # type: ignore[no-untyped-def]
    started: list[Supervised] = []

    async def factory(command: str, **config: object) -> Supervised:
        supervised = await Supervised.start(command, **config)
        started.append(supervised)
        return supervised

    yield factory
    for supervised in started:
        await supervised.close()


def _alive_with_marker(marker: str, exclude: int = 0) -> list[int]:
    """Live pids carrying ``marker``, the supervisor itself (``exclude``) left out."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read()
            with open(f"/proc/{name}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() + b"\0" in env and state != b"Z" and int(name) != exclude:
            pids.append(int(name))
    return pids


async def _until_running(sup: Supervised, *commands: bytes) -> None:
    """Poll (10 s at most) until each of ``commands`` runs in the supervised tree (exec'd, not just forked)."""
    deadline = time.monotonic() + 10
    while True:
        running = set()
        for pid in _alive_with_marker(sup.marker, sup.process.pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    running.add(fh.read().rstrip(b"\0").replace(b"\0", b" "))
            except OSError:
                continue
        if set(commands) <= running:
            return
        assert time.monotonic() < deadline, f"never all running: {commands}; running: {running}"
        await asyncio.sleep(0.02)


class TestFrames:
    async def test_output_then_exit(self, run) -> None:
        """stdout and stderr arrive as separate frames, then exactly one exit frame."""
        sup = await run("echo out; echo err >&2; exit 3")
        await sup.started()
        out, err, status = await sup.until_exit()
        assert (out, err, status["exit_code"], status["signal"]) == (b"out\n", b"err\n", 3, 0)

    async def test_exact_signal(self, run) -> None:
        """A death by signal is reported as the signal, with 128+N."""
        sup = await run("kill -9 $$")
        await sup.started()
        _, _, status = await sup.until_exit()
        assert (status["exit_code"], status["signal"]) == (137, 9)

    async def test_started_comes_before_the_command_runs(self, run) -> None:
        """A command that kills its supervisor at once still finds its start reported first."""
        for _ in range(20):
            sup = await run("kill -9 $PPID")
            assert await sup.started() > 0  # the pid frame, before the supervisor died
            with pytest.raises(EOFError):
                await sup.next()

    async def test_missing_cwd_fails_to_start(self, run) -> None:
        """A working directory that does not exist gives a failed frame naming it."""
        sup = await run("true", cwd="/nonexistent-dir")
        kind, payload = await sup.next()
        assert kind == frames.FAILED
        assert json.loads(payload)["stage"] == "chdir"
        assert "/nonexistent-dir" in json.loads(payload)["message"]

    async def test_stdin_and_close(self, run) -> None:
        """Input frames reach the command's stdin; close ends it."""
        sup = await run("cat")
        await sup.started()
        await sup.send(frames.encode(frames.STDIN, b"hello\n"))
        assert await sup.next() == (frames.STDOUT, b"hello\n")
        await sup.send(frames.encode(frames.CLOSE_STDIN))
        _, _, status = await sup.until_exit()
        assert status["exit_code"] == 0

    async def test_command_is_session_leader_with_default_sigint(self, run) -> None:
        """The shell leads its own session and group, and starts with SIGINT at its default."""
        sup = await run(
            "python3 -c 'import os, signal; "
            "print(os.getpid() == os.getsid(0) == os.getpgid(0) or os.getppid() == os.getsid(0)); "
            "print(signal.getsignal(signal.SIGINT))'"
        )
        await sup.started()
        out, _, _ = await sup.until_exit()
        assert out == b"True\n<built-in function default_int_handler>\n"

    async def test_background_holder_does_not_delay_exit(self, run) -> None:
        """`sleep 30 &` keeps the pipe open, yet the exit frame comes at once."""
        sup = await run("sleep 30 & echo started")
        await sup.started()
        out, _, status = await asyncio.wait_for(sup.until_exit(), 5)
        assert (out, status["exit_code"]) == (b"started\n", 0)
        survivors = _alive_with_marker(sup.marker, sup.process.pid)
        assert survivors, "normal completion must not kill the background job"
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)


class TestSignals:
    async def test_interrupt_reaches_the_whole_group(self, run) -> None:
        """Ctrl-C (SIGINT to the group) ends `sleep & sleep`, and nothing of it survives."""
        sup = await run("sleep 1000 & sleep 1001")
        await sup.started()
        await _until_running(sup, b"sleep 1000", b"sleep 1001")  # both are there to be interrupted
        await sup.send(frames.encode_signal(2, interrupt=True))
        _, _, status = await sup.until_exit()
        assert status["exit_code"] == 130
        assert _alive_with_marker(sup.marker, sup.process.pid) == []

    async def test_trap_keeps_its_own_code(self, run) -> None:
        """A shell trapping SIGINT exits with its own code."""
        sup = await run("trap 'echo got INT; exit 42' INT; echo ready; while :; do sleep 0.1; done")
        await sup.started()
        assert await sup.next() == (frames.STDOUT, b"ready\n")  # the trap is in place (no fixed sleep)
        await sup.send(frames.encode_signal(2, interrupt=True))
        out, _, status = await sup.until_exit()
        assert (out, status["exit_code"], status["signal"]) == (b"got INT\n", 42, 0)

    async def test_kill_ladder_reaches_setsid_and_double_fork(self, run) -> None:
        """Kill ends descendants that called setsid or double-forked, and reports the signal."""
        sup = await run(
            "sleep 1000 & setsid sleep 1001 & (sleep 1002 &) ; trap '' TERM; echo ready; while :; do sleep 0.1; done"
        )
        await sup.started()
        assert await sup.next() == (frames.STDOUT, b"ready\n")  # TERM is ignored now: only SIGKILL can end it
        await _until_running(sup, b"sleep 1000", b"sleep 1001", b"sleep 1002")
        assert len(_alive_with_marker(sup.marker, sup.process.pid)) >= 4
        await sup.send(frames.encode_kill(0.5))
        _, _, status = await asyncio.wait_for(sup.until_exit(), 10)
        assert (status["exit_code"], status["signal"]) == (137, 9)
        assert _alive_with_marker(sup.marker, sup.process.pid) == []

    async def test_kill_ends_on_sigterm_when_obeyed(self, run) -> None:
        """A command that obeys SIGTERM is reported as ended by SIGTERM."""
        sup = await run("sleep 1000")
        await sup.started()
        await sup.send(frames.encode_kill(5))
        _, _, status = await asyncio.wait_for(sup.until_exit(), 5)
        assert (status["exit_code"], status["signal"]) == (143, 15)


class TestTty:
    async def test_tty_is_a_terminal(self, run) -> None:
        """In tty mode the command's stdio is a terminal of the requested size."""
        sup = await run("test -t 0 && test -t 1 && stty size", tty=True, columns=100, rows=30)
        await sup.started()
        out, _, status = await sup.until_exit()
        assert out.replace(b"\r\n", b"\n") == b"30 100\n"
        assert status["exit_code"] == 0

    async def test_ctrl_c_through_line_discipline(self, run) -> None:
        """A \\x03 written to the terminal interrupts the foreground program."""
        sup = await run("python3 -c 'import time; print(\"ready\", flush=True); time.sleep(60)'", tty=True)
        await sup.started()
        _kind, payload = await sup.next()
        assert b"ready" in payload
        await sup.send(frames.encode(frames.STDIN, b"\x03"))
        out, _, status = await sup.until_exit()
        assert b"KeyboardInterrupt" in out
        assert status["exit_code"] == 130


class TestReapMode:
    async def test_reap_kills_by_marker(self) -> None:
        """Reap mode kills every process carrying the marker, even outside any tree."""
        marker = f"SANDBOXD_PROCESS_ID=test-{secrets.token_hex(4)}"
        name, value = marker.split("=")
        victim = await asyncio.create_subprocess_exec(
            "sleep", "1000", env={**os.environ, name: value}, start_new_session=True
        )
        # create_subprocess_exec returns once the exec is done: the victim runs `sleep` with the marker.
        assert _alive_with_marker(marker) == [victim.pid]
        reaper = await asyncio.create_subprocess_exec(
            sys.executable,
            *script_argv("supervisor.py", {"mode": "reap", "marker": marker, "grace_s": 0.5}, tokens=True)[1:],
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(reaper.communicate(), 10)
        assert json.loads(out)["killed"] >= 1
        assert await asyncio.wait_for(victim.wait(), 5) == -signal.SIGTERM
        assert _alive_with_marker(marker) == []
