"""The in-container agent against a hostile workspace, under runc and gVisor (issue 11).

Every command and file operation runs as the workspace user with no capability and
no_new_privs; the agent is root's and out of the workspace's reach: it cannot be
signalled, traced, read, or written to, and a neighbour command keeps streaming
through every attempt. If the agent dies all the same (here: killed by root from
outside), the engine restarts the workspace, its sessions end ``failed`` saying so,
and the workspace works again.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from sandboxd_client import Output

from .helpers import collect, start_ready

pytestmark = pytest.mark.docker

PTRACE_ATTACH = """python3 - <<'EOF'
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.ptrace(16, int(os.environ["TARGET"]), None, None)  # PTRACE_ATTACH
print("attached" if rc == 0 else "ptrace=" + os.strerror(ctypes.get_errno()))
EOF"""


async def agent_pid(workspace) -> int:  # type: ignore[no-untyped-def]
    """The agent's pid, as the workspace sees it (the parent of every command)."""
    result = await workspace.exec("echo $PPID").wait()
    return int(result.stdout)


async def neighbour_streams(workspace, client, process_id: str, seen: str) -> str:  # type: ignore[no-untyped-def]
    """Poll the neighbour until it has printed one more line than ``seen``; return all it printed."""
    deadline = time.monotonic() + 20
    lines = seen.count("\n")
    while seen.count("\n") <= lines:
        assert time.monotonic() < deadline, f"the neighbour stopped streaming after {seen[-40:]!r}"
        events, out, _ = await collect(client.input(process_id, "", yield_after_s=0.5))
        seen += out
        assert not any(getattr(e, "stop_reason", "") for e in events), events[-1]
    return seen


async def test_commands_have_no_capability_and_no_new_privileges(workspace) -> None:
    """`grep Cap /proc/self/status` shows CapEff, CapPrm and CapBnd all zero, and NoNewPrivs 1."""
    result = await workspace.exec("grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs)' /proc/self/status").wait()
    fields = dict(line.split(":\t") for line in result.stdout.splitlines())
    assert (fields["CapEff"], fields["CapPrm"], fields["CapBnd"]) == ("0" * 16,) * 3
    assert fields.get("CapAmb", "0" * 16) == "0" * 16  # gVisor does not show it
    # gVisor's /proc/PID/status has no NoNewPrivs line; prctl says it there.
    nnp = fields.get("NoNewPrivs")
    if nnp is None:
        probe = "python3 -c 'import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'"
        nnp = (await workspace.exec(probe).wait()).stdout.strip()
    assert nnp == "1"


async def test_file_operations_have_no_capability_either(workspace) -> None:
    """A file operation's helper reads /proc/self/status as the user with no capability and no_new_privs."""
    page = await workspace.read_file("/proc/self/status")
    fields = {
        line.split("\t", 1)[1].split(":")[0]: line.split(":", 1)[1].strip()
        for line in page.content.splitlines()
        if ":" in line and "\t" in line
    }
    assert (fields["CapEff"], fields["CapPrm"], fields["CapBnd"]) == ("0" * 16,) * 3
    assert fields["Uid"].split()[:2] == ["1000", "1000"]
    assert fields.get("NoNewPrivs", "1") == "1"


async def test_nothing_of_sandboxd_carries_the_command(workspace) -> None:
    """After `python3 -m http.server 8124 &`, exactly one process carries that text: the server."""
    await workspace.exec("cd /tmp && (python3 -m http.server 8124 >/dev/null 2>&1 &)").wait(check=True)
    deadline = time.monotonic() + 10
    while (count := (await workspace.exec("pgrep -f 'http.server 8124' | wc -l").wait()).stdout) != "1\n":
        assert time.monotonic() < deadline, count
        await asyncio.sleep(0.1)
    # `pkill -f`, the usual way to stop it, stops only it.
    await workspace.exec("pkill -f 'http.server 8124'").wait()
    assert (await workspace.exec("echo alive").wait()).stdout == "alive\n"


async def test_the_workspace_cannot_reach_the_agent(client, workspace) -> None:
    """kill -9 -1, kill -9 of the agent, its /proc fds, ptrace and garbage written to every fd the
    workspace can open: the agent survives each, and a neighbour command keeps streaming."""
    neighbour = await start_ready(workspace, "echo ready; while :; do echo tick; sleep 0.2; done")
    seen = "ready\n"
    pid = await agent_pid(workspace)
    attacks = {
        "kill -9 -1": "kill -9 -1; echo done",
        "kill the agent": f"kill -9 {pid}; echo rc=$?",
        "agent fds": f"ls /proc/{pid}/fd; cat /proc/{pid}/fd/* </dev/null; echo rc=$?",
        "ptrace": f"TARGET={pid} {PTRACE_ATTACH}",
        "garbage": (
            "for f in /proc/[0-9]*/fd/*; do (printf 'GARBAGE\\377\\0\\0\\0\\377' > $f) 2>/dev/null & done; "
            "wait; echo done"
        ),
    }
    outcomes = {}
    for name, attack in attacks.items():
        result = await workspace.exec(attack, timeout_s=20).wait()
        outcomes[name] = result.stdout.strip().splitlines()[-1:] if result.stdout.strip() else []
        assert await agent_pid(workspace) == pid, name
        if name != "kill -9 -1":  # which also ends the neighbour: it is the workspace user's
            seen = await neighbour_streams(workspace, client, neighbour, seen)
        else:
            neighbour = await start_ready(workspace, "echo ready; while :; do echo tick; sleep 0.2; done")
            seen = "ready\n"
    assert outcomes["kill the agent"] == ["rc=1"]
    assert outcomes["agent fds"] == ["rc=1"]
    assert outcomes["ptrace"] == ["ptrace=Operation not permitted"]
    await client.kill(neighbour)


# The helper waiting while a command runs: the one that waited before has become that very
# command, and the agent starts the next at once; the command waits for it to be there.
FIND_IDLE_HELPER = (
    "for i in $(seq 200); do pid=$(pgrep -u 0 -f 'sandboxd-agent spa[w]n'); "
    '[ -n "$pid" ] && break; sleep 0.05; done; '
    '[ -n "$pid" ] || { echo no-idle-helper; exit 1; }; '
)


async def test_the_workspace_cannot_reach_the_idle_helper(workspace) -> None:
    """The helper waiting for the next command is root's, with the agent's control socket on fd
    3 (a request on it names the user a command runs as): the workspace can neither kill it,
    nor trace it, nor open that socket through /proc to forge a request, under either runtime."""
    attacks = {
        "kill": 'kill -9 "$pid"; echo rc=$?',
        "ptrace": f'TARGET="$pid" {PTRACE_ATTACH}',
        "forge": "printf '\\000\\000\\000\\002{}' > /proc/$pid/fd/3 && echo sent || echo rc=1",
        "read": "cat /proc/$pid/fd/3 </dev/null >/dev/null 2>&1 && echo read || echo rc=1",
    }
    outcomes = {}
    for name, attack in attacks.items():
        result = await workspace.exec(FIND_IDLE_HELPER + attack, timeout_s=30).wait()
        outcomes[name] = result.stdout.strip().splitlines()[-1:]
    assert outcomes == {
        "kill": ["rc=1"],
        "ptrace": ["ptrace=Operation not permitted"],
        "forge": ["rc=1"],
        "read": ["rc=1"],
    }
    # Commands still start (in the helpers attacked) as the workspace user.
    assert (await workspace.exec("id -u").wait()).stdout == "1000\n"


async def file_server(workspace) -> int:  # type: ignore[no-untyped-def]
    """The pid of the workspace user's file server: the process that performs three reads of
    /proc/self/stat in a row (a helper performs one). The user's first operation starts it;
    until it is there, helpers serve."""
    deadline = time.monotonic() + 20
    while True:
        pids = set()
        for _ in range(3):
            stat = (await workspace.read_file("/proc/self/stat")).content
            pids.add(int(stat.split("\t", 1)[1].split()[0]))
        if len(pids) == 1:
            pid = pids.pop()
            cmdline = (await workspace.exec(f"tr '\\0' ' ' </proc/{pid}/cmdline").wait()).stdout
            assert cmdline == "sandboxd-agent spawn fileserver ", cmdline
            return pid
        assert time.monotonic() < deadline, f"no file server after 20 s: {pids}"
        await asyncio.sleep(0.05)


async def test_the_users_file_server_has_no_privilege_on_any_thread(workspace, runtime: str) -> None:
    """The file server is the workspace user's, with no capability on any of its threads; a
    process of that user can neither trace it nor open the pipes of an operation it is doing
    (gVisor lists every process's fds, and the server's standard files, /dev/null, open), and
    a server it kills or stops costs no file operation: the next one is served all the same."""
    pid = await file_server(workspace)
    status = await workspace.exec(f"grep -hE '^(Uid|CapEff|CapPrm|CapBnd):' /proc/{pid}/task/*/status").wait()
    lines = status.stdout.splitlines()
    threads = len([line for line in lines if line.startswith("Uid:")])
    assert threads >= 1, status.stdout
    caps = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Cap")]
    assert caps == ["0" * 16] * (3 * threads), status.stdout
    assert {tuple(line.split()[1:3]) for line in lines if line.startswith("Uid:")} == {("1000", "1000")}
    ptrace = await workspace.exec(f"TARGET={pid} {PTRACE_ATTACH}", timeout_s=30).wait()
    assert ptrace.stdout.strip().splitlines()[-1:] == ["ptrace=Operation not permitted"]
    # While a 16 MiB write is in it (or after: nothing opens either way).
    probe = (
        f"ls /proc/{pid}/fd >/dev/null 2>&1 && echo listed; "
        "for n in $(seq 0 63); do "
        # What was opened is named by the probe's own descriptor: the server's may be closed
        # (or reused) between the open and a look at it.
        f'  (exec 3</proc/{pid}/fd/$n && echo "fd$n-read $(readlink /proc/self/fd/3)") 2>/dev/null; '
        f'  (exec 3>/proc/{pid}/fd/$n && echo "fd$n-write $(readlink /proc/self/fd/3)") 2>/dev/null; '
        "done; echo probed"
    )
    writing = asyncio.create_task(workspace.write_file("big.bin", "x" * (16 << 20)))
    opened = (await workspace.exec(probe, timeout_s=30).wait()).stdout
    await writing
    # What opens besides the standard files can only be the file being written or its spool,
    # the user's own files (a busy host catches the server with one open): never a pipe or a
    # socket, whose links read "pipe:[N]" and "socket:[N]".
    lines = opened.splitlines()
    own = [line for line in lines if line.split(" ", 1)[-1].startswith(("/workspace/", "/tmp/.sandboxd-spool-"))]
    standard = [f"fd{n}-{way} /dev/null" for n in range(3) for way in ("read", "write")]
    rest = [line for line in lines if line not in own]
    assert rest == (["listed", *standard] if runtime == "runsc" else []) + ["probed"], opened
    # Stopped, then killed: each time the next operation is served, by a helper or a new server.
    await workspace.exec(f"kill -STOP {pid}").wait(check=True)
    assert (await asyncio.wait_for(workspace.read_file("/etc/hostname"), 20)).content.strip()
    second = await file_server(workspace)
    assert second != pid
    await workspace.exec(f"kill -9 {second}").wait(check=True)
    await workspace.write_file("/tmp/after-the-kill", "whole\n")
    assert (await workspace.read_file("/tmp/after-the-kill")).content == "     1\twhole"


async def test_a_dead_agent_is_restarted_and_its_sessions_fail(client, workspace, docker_client) -> None:
    """Root kills the agent from outside: the workspace comes back, the running command ends
    `failed` saying the agent restarted, and the next command runs."""
    process_id = await start_ready(workspace, "echo ready; sleep 300")
    container = docker_client.containers.get(workspace.info.container_id)
    pid = await agent_pid(workspace)
    # Detached: under gVisor an exec whose container dies under it never ends its stream.
    container.exec_run(["kill", "-9", str(pid)], user="0:0", detach=True)
    events, _, _ = await collect(client.input(process_id, "", yield_after_s=30, follow=True))
    final = events[-1]
    assert final.stop_reason == "failed", final
    assert "agent restarted" in final.message
    deadline = time.monotonic() + 60
    while True:
        try:
            result = await workspace.exec("echo back").wait()
            break
        except Exception:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.5)
    assert result.stdout == "back\n"
    assert not [e for e in events if isinstance(e, Output) and "tick" in e.text]
