"""A command behaves exactly as under a real ``bash -lc``, in a spare login shell or a cold one (issue 25).

Each command of the battery runs three ways in the same container: a real ``bash -lc CMD``
through ``docker exec`` (the reference, as the user with the same environment), sandboxd with
its shell started cold (the spare made stale first), and sandboxd in the spare started ahead
of it (its pid is the spare's). Everything is compared but pids and the process id.
"""

from __future__ import annotations

import asyncio
import difflib
import re
import time

import pytest
from sandboxd_client import Exited, Output, Started

from sandboxd.processes import NON_INTERACTIVE_ENV
from tests.integration.helpers import collect

pytestmark = pytest.mark.docker

#: What differs between runs by nature: pids, the process id, clocks and random numbers.
DYNAMIC = r"-e BASHPID -e PPID -e RANDOM -e SRANDOM -e EPOCH -e SECONDS -e 'declare -- _=' -e SANDBOXD_PROCESS_ID"

BATTERY = [
    "env | grep -v ^SANDBOXD_PROCESS_ID= | sort",
    f"declare -p | grep -v {DYNAMIC}",
    "declare -f",
    "alias",
    "shopt",
    "set -o",
    "umask",
    "ulimit -a",
    'echo "$0" "$-" "$#" "$SHLVL" "$BASH_EXECUTION_STRING" "$LINENO"',
    "trap",
    "pwd",
    "echo $?; echo $_",
    "ls /proc/self/fd",
    "exit 7",
    "no-such-command",
    "true; no-such-command here",
    "echo )",
    'echo "never closed',  # native: bash's own error for an open quote
    "sh -c 'kill -TERM $$'",
    "sh -c 'kill -SEGV $$'; echo after",
    "ps -o comm= -p $$",
    # the background sleep may not have started when pgrep runs: wait for it, then count it
    "s=1.2345; (sleep $s &); until pgrep -f 'sleep 1.23[4]5' >/dev/null; do :; done; "
    "pgrep -fc 'sleep 1.23[4]5'; pkill -f 'sleep 1.23[4]5'",
    "ps -o args= -p $$; true",
    "printf 'a\\nb\\n'\nno-such-command\ncat <<'EOF'\nhere\nEOF",  # native: lines, a here-document
    'f() { echo "$LINENO"; }\nf; echo $LINENO',  # native
    "echo a # a comment",  # native
    'read -r line; echo "got $line"; cat',
]

#: Commands that bash runs natively (`bash -lc COMMAND` itself), never in a spare.
NATIVE = {
    'echo "never closed',
    "printf 'a\\nb\\n'\nno-such-command\ncat <<'EOF'\nhere\nEOF",
    'f() { echo "$LINENO"; }\nf; echo $LINENO',
    "echo a # a comment",
}


def _line_two(run: tuple[int, str, str]) -> tuple[int, str, str]:
    """Bash's own report of a job killed by a signal names line 2 of its input, not 1."""
    assert "bash: line 2:" in run[2], run
    return run[0], run[1], run[2].replace("bash: line 2:", "bash: line 1:")


def _shell_argv(run: tuple[int, str, str]) -> tuple[int, str, str]:
    """A shell that stays after its first command shows its fixed line in ps, not the command."""
    fixed = "bash -lc __sandboxd \\  \n"
    assert fixed in run[1], run
    return run[0], run[1].replace(fixed, "bash -lc ps -o args= -p $$; true\n"), run[2]


#: The two differences a one-line command shows (README, "How a command runs"), both while
#: its shell outlives a first command: the rest match bash -lc exactly.
KNOWN = {
    "sh -c 'kill -SEGV $$'; echo after": _line_two,
    "ps -o args= -p $$; true": _shell_argv,
}

#: A profile that leaves every kind of state behind, and prints to both streams.
RICH_PROFILE = """\
echo profile-out; echo profile-err >&2
PROFILE_VAR='a value'; export EXPORTED_VAR=1; declare -i COUNT=3; declare -a LIST=(x y)
greet() { echo "hello $1"; }
alias ll='ls -l'
set -o pipefail; shopt -s extglob nullglob; umask 027
trap 'echo bye' EXIT
cd /tmp
"""


def _normalise(text: str) -> str:
    # bash pads a job report's pid to five columns ("line 1:  1234 Segmentation fault"), so the
    # padding goes with the pid: a pid of 10000 or more has one space fewer.
    text = re.sub(r"(?m)^(bash: line \d+:) +\d+ ", r"\1 N ", text)
    return re.sub(r"\b\d{2,}\b", "N", text)


def _normalise_run(run: tuple[int, str, str]) -> tuple[int, str, str]:
    return run[0], _normalise(run[1]), _normalise(run[2])


def _diff(expected: tuple[int, str, str], got: tuple[int, str, str]) -> str:
    """The differences, line by line: exit code, then stdout, then stderr."""
    lines = []
    for name, want, have in zip(
        ("exit", "stdout", "stderr"), _normalise_run(expected), _normalise_run(got), strict=True
    ):
        if want != have:
            ours, theirs = str(have).splitlines(), str(want).splitlines()
            lines += difflib.unified_diff(theirs, ours, f"bash -lc {name}", f"sandboxd {name}", lineterm="")
    return "\n".join(lines)


async def _reference(container_id: str, user: str, workdir: str, command: str, stdin: bytes) -> tuple[int, str, str]:
    """``bash -lc command`` through ``docker exec``: exit code, stdout, stderr."""
    args = ["docker", "exec", "-i", "-u", user, "-w", workdir]
    for name, value in {**NON_INTERACTIVE_ENV, "SANDBOXD_PROCESS_ID": "p-reference"}.items():
        args += ["-e", f"{name}={value}"]
    proc = await asyncio.create_subprocess_exec(
        *args,
        container_id,
        "bash",
        "-lc",
        command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate(stdin)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def _root(container_id: str, *command: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        "docker", "exec", "-u", "0", container_id, *command, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    return out.decode()


async def _spares(container_id: str) -> set[int]:
    """The pids of the spare login shells waiting in the container."""
    return {int(pid) for pid in (await _root(container_id, "pgrep", "-f", "^bash -lc __sandboxd")).split()}


async def _sandboxd(client, workspace, command: str, stdin: bytes) -> tuple[int, str, str, int]:  # type: ignore[no-untyped-def]
    """The command through sandboxd: exit code, stdout, stderr and the pid it ran as."""
    pid = 0
    out: list[bytes] = [b"", b""]
    exited = None
    process_id = ""
    async for event in workspace.exec(command, yield_after_s=0.25 if stdin else 30):
        if isinstance(event, Started):
            pid, process_id = event.pid, event.process_id
        elif isinstance(event, Output):
            out[event.stream == "stderr"] += event.data
        elif isinstance(event, Exited):
            exited = event
    if exited is None:
        handle = client.input(process_id, data=stdin, close_stdin=True, yield_after_s=10)
        events, more_out, more_err = await collect(handle)
        exited = events[-1]
        out[0] += more_out.encode()
        out[1] += more_err.encode()
    assert isinstance(exited, Exited), exited
    return exited.exit_code, out[0].decode(errors="replace"), out[1].decode(errors="replace"), pid


async def _until_spare(container_id: str) -> int:
    for _ in range(500):
        spares = await _spares(container_id)
        if len(spares) == 1:
            return spares.pop()
        await asyncio.sleep(0.02)
    raise AssertionError(f"no single spare appeared: {spares}")


async def _three_ways(client, workspace, command: str) -> None:  # type: ignore[no-untyped-def]
    info = workspace.info
    stdin = b"first line\nthe rest\n" if "read" in command else b""
    expected = await _reference(info.container_id, info.user, info.working_dir, command, stdin)
    # Cold: the spare is made stale (a profile's stamp changed), so the shell starts now.
    spare = await _until_spare(info.container_id)
    await _root(info.container_id, "touch", "-c", "/etc/profile")
    code, out, err, pid = await _sandboxd(client, workspace, command, stdin)
    assert pid != spare, "the cold run took the stale spare"
    cold = (code, out, err)
    # Warm: the spare made after the cold run.
    spare = await _until_spare(info.container_id)
    code, out, err, pid = await _sandboxd(client, workspace, command, stdin)
    warm = (code, out, err)
    for name, run in (("cold", cold), ("warm", warm)):
        if command in KNOWN:
            run = KNOWN[command](run)
        differences = _diff(expected, run)
        assert _normalise_run(run) == _normalise_run(expected), (
            f"{name} differs from bash -lc for {command!r}:\n{differences}"
        )
    assert (pid == spare) == (command not in NATIVE), f"{command!r}: ran in the spare {pid == spare}"


@pytest.mark.parametrize("profile", ["debian", "rich"])
async def test_every_command_sees_what_bash_lc_gives(client, workspace, profile: str) -> None:
    """The battery gives the same output, errors and exit codes three ways; a one-line command takes the spare."""
    if profile == "rich":
        home = (await workspace.exec("printf %s ~").wait()).stdout
        await workspace.write_file(f"{home}/.bash_profile", RICH_PROFILE)
    await workspace.exec("true").wait()  # its spare follows
    for command in BATTERY:
        await _three_ways(client, workspace, command)


async def test_an_edited_profile_is_seen_by_the_next_command(workspace) -> None:
    """A spare older than an edit of ``~/.profile`` is not used: the next command sees the edit, and the one after."""
    home = (await workspace.exec("printf %s ~").wait()).stdout
    await _until_spare(workspace.info.container_id)
    await workspace.exec(f"echo 'export EDITED=yes' >> {home}/.profile").wait()
    assert (await workspace.exec("echo $EDITED").wait()).stdout == "yes\n"
    await _until_spare(workspace.info.container_id)
    assert (await workspace.exec("echo $EDITED").wait()).stdout == "yes\n"
    await workspace.write_file(f"{home}/.profile", "export EDITED=again\n")
    assert (await workspace.exec("echo $EDITED").wait()).stdout == "again\n"


async def test_a_sigterm_ignoring_command_under_the_ladder_reports_its_own_137(client, workspace) -> None:
    """A command that ignores SIGTERM is its shell's pid: the ladder's SIGKILL ends it, 137, cold and warm."""
    command = (
        "python3 -c 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        'signal.signal(signal.SIGINT, signal.SIG_IGN); print("ready", flush=True); time.sleep(3600)\''
    )
    await workspace.exec("true").wait()  # its spare follows
    for run in ("cold", "warm"):
        spare = await _until_spare(workspace.info.container_id)
        if run == "cold":
            await _root(workspace.info.container_id, "touch", "-c", "/etc/profile")
        started = time.monotonic()
        pid, out, exited, process_id = 0, b"", None, ""
        async for event in workspace.exec(command, timeout_s=3):  # yields at 2 s (the timeout less 1 s)
            if isinstance(event, Started):
                pid, process_id = event.pid, event.process_id
            elif isinstance(event, Output):
                out += event.data
            elif isinstance(event, Exited):
                exited = event
        for _ in range(5):  # each poll waits up to 5 s
            if isinstance(exited, Exited):
                break
            events, more, _ = await collect(client.input(process_id))
            exited, out = events[-1], out + more.encode()
        assert isinstance(exited, Exited), exited
        outcome = (exited.exit_code, exited.signal, exited.stop_reason, out)
        assert outcome == (137, "SIGKILL", "timeout", b"ready\n"), run
        assert time.monotonic() - started < 15
        assert (pid == spare) == (run == "warm"), run
