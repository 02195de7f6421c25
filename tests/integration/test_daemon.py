"""The daemon as a server: health, reflection, error statuses, the CLI (issue 2)."""

from __future__ import annotations

import asyncio
import datetime
import os
import re
import subprocess
import sys
from typing import ClassVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from sandboxd_client import SandboxClient, UnavailableError

from tests.conftest import DaemonThread, make_settings, rss_bytes, spawned_daemon
from tests.integration.helpers import exec_until, until_caught

pytestmark = pytest.mark.docker


class TestServer:
    async def test_health_is_serving(self, daemon) -> None:
        """gRPC health checking answers SERVING for the server and each service."""
        async with grpc.aio.insecure_channel(f"unix:{daemon.socket_path}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for service in ("", "sandboxd.v1.WorkspaceService", "sandboxd.v1.ProcessService"):
                response = await stub.Check(health_pb2.HealthCheckRequest(service=service))
                assert response.status == health_pb2.HealthCheckResponse.SERVING

    async def test_reflection_lists_services(self, daemon) -> None:
        """Server reflection lists both sandboxd services, health and reflection."""
        async with grpc.aio.insecure_channel(f"unix:{daemon.socket_path}") as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)

            async def requests():  # type: ignore[no-untyped-def]
                yield reflection_pb2.ServerReflectionRequest(list_services="")

            names = set()
            async for response in stub.ServerReflectionInfo(requests()):
                names |= {s.name for s in response.list_services_response.service}
        assert {
            "sandboxd.v1.WorkspaceService",
            "sandboxd.v1.ProcessService",
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
        } <= names

    async def test_malformed_requests_are_invalid_argument(self, daemon, workspace_id) -> None:
        """Bytes the client library never sends: undecodable protobuf, invalid UTF-8 in a string field.

        Each is INVALID_ARGUMENT with a plain message (gRPC's own answer would be UNKNOWN with
        the decoder's exception text), for unary, server-streaming and client-streaming calls.
        """

        def field(number: int, data: bytes) -> bytes:
            return bytes([number << 3 | 2, len(data)]) + data

        same = lambda data: data  # noqa: E731 - raw bytes both ways
        wid = workspace_id.encode()
        async with grpc.aio.insecure_channel(f"unix:{daemon.socket_path}") as channel:
            cases = [
                (channel.unary_stream, "/sandboxd.v1.ProcessService/Exec", b"\xff\xff\xff\xff", "ExecRequest"),
                (
                    channel.unary_stream,
                    "/sandboxd.v1.ProcessService/Exec",
                    field(1, wid) + field(2, b"echo \xff"),
                    "ExecRequest",
                ),
                (
                    channel.unary_unary,
                    "/sandboxd.v1.WorkspaceService/GetWorkspace",
                    field(1, b"\xc3\x28"),
                    "GetWorkspaceRequest",
                ),
            ]
            for kind, method, payload, message_type in cases:
                call = kind(method, request_serializer=same, response_deserializer=same)

                async def finish(result):  # type: ignore[no-untyped-def]
                    if hasattr(result, "__aiter__"):
                        return [item async for item in result]
                    return await result

                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await finish(call(payload, timeout=20))
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
                assert caught.value.details() == (
                    f"malformed request: not a valid sandboxd.v1.{message_type} message "
                    "(bad wire format, or invalid UTF-8 in a string field)"
                )

            async def upload_requests():  # type: ignore[no-untyped-def]
                yield b"\xff\xff\xff"

            upload = channel.stream_unary(
                "/sandboxd.v1.FileService/Upload", request_serializer=same, response_deserializer=same
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await upload(upload_requests(), timeout=20)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "not a valid sandboxd.v1.UploadRequest" in caught.value.details()

    def test_socket_is_owner_only(self, daemon) -> None:
        """The Unix socket is mode 0600 and its directory 0700."""
        assert os.stat(daemon.socket_path).st_mode & 0o777 == 0o600
        assert os.stat(os.path.dirname(daemon.socket_path)).st_mode & 0o777 == 0o700

    def test_a_shared_sticky_directory_is_left_as_it_is(self, tmp_path) -> None:
        """A socket put straight into a /tmp-like directory (1777) is 0600; the directory stays 1777."""
        shared = tmp_path / "shared"
        shared.mkdir()
        shared.chmod(0o1777)
        thread = DaemonThread(make_settings(tmp_path, socket_path=str(shared / "sandboxd.sock"))).start()
        try:
            assert os.stat(thread.socket_path).st_mode & 0o777 == 0o600
            assert shared.stat().st_mode & 0o7777 == 0o1777
        finally:
            thread.stop()

    async def test_docker_unreachable_is_unavailable(self, tmp_path) -> None:
        """With no engine at the configured address, calls fail UNAVAILABLE saying so, quickly."""
        settings = make_settings(tmp_path, docker_host="unix:///nonexistent/docker.sock")
        thread = DaemonThread(settings).start()
        try:
            async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
                with pytest.raises(UnavailableError, match="unreachable") as caught:
                    await client.create_workspace()
                assert "Traceback" not in caught.value.message
                with pytest.raises(UnavailableError, match="unreachable"):
                    await client.list_workspaces()
        finally:
            thread.stop()


class TestProcess:
    @pytest.mark.parametrize("fmt", ["json", "console"])
    def test_unusable_socket_directory_is_one_line(self, tmp_path, fmt: str) -> None:
        """A socket directory the daemon cannot write: exit 1, one line saying so, nothing touched."""
        env = {
            **os.environ,
            "SANDBOXD_LOG_FORMAT": fmt,
            "SANDBOXD_AUDIT_LOG": "off",
            "SANDBOXD_INSTANCE": "unusable-socket",
        }
        run = subprocess.run(
            [sys.executable, "-m", "sandboxd", "serve", "--no-build", "--socket", "/proc/1/sandboxd.sock"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert run.returncode == 1
        lines = run.stderr.splitlines()
        assert len(lines) == 1, run.stderr
        assert "cannot create the socket in /proc/1" in lines[0]
        assert "Traceback" not in run.stderr
        assert "daemon.adopted" not in run.stdout + run.stderr  # refused before touching containers

    def test_serve_and_graceful_sigterm(self, tmp_path, default_image) -> None:
        """`python -m sandboxd` serves on its socket, answers health, and on SIGTERM stops cleanly."""
        import json
        import signal

        with spawned_daemon(tmp_path) as (daemon, socket_path, log_path):
            with grpc.insecure_channel(f"unix:{socket_path}") as channel:
                response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
            # SERVING is set just before serve() installs its handlers: until then SIGTERM would kill it outright.
            until_caught(daemon.pid, signal.SIGTERM)
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)
        stderr = log_path.read_text()
        assert daemon.returncode == 0
        assert not os.path.exists(socket_path)
        events = [json.loads(line)["event"] for line in stderr.splitlines() if line.startswith("{")]
        assert events.index("daemon.adopted") < events.index("daemon.listening")
        assert events[-2:] == ["daemon.stopping", "daemon.stopped"]

    async def test_output_flood_keeps_daemon_memory_bounded(self, tmp_path, default_image) -> None:
        """`yes` for 10 s with nobody reading and a 1 MiB buffer: daemon RSS grows < 64 MiB, drops counted."""
        from sandboxd_client import Dropped

        with spawned_daemon(tmp_path, SANDBOXD_LOG_LEVEL="warning") as (daemon, socket_path, _log):
            async with SandboxClient(socket_path=socket_path, retries=False) as client:
                ws = await client.create_workspace(labels={"test": "flood"})
                try:
                    process_id, seen = await exec_until(ws, "yes", "y\ny\n", max_output_bytes=1024 * 1024)
                    assert seen.startswith("y\ny\n")
                    before = rss_bytes(daemon.pid)
                    await asyncio.sleep(10)
                    grown = rss_bytes(daemon.pid) - before
                    assert grown < 64 * 1024 * 1024, f"daemon RSS grew by {grown} bytes"
                    polled = [event async for event in client.input(process_id, yield_after_s=0.25)]
                    assert sum(e.dropped_bytes for e in polled if isinstance(e, Dropped)) > 0
                    exited = await client.kill(process_id)
                    assert exited.dropped_bytes > 0
                finally:
                    await ws.delete()


class TestCli:
    def _ctl(self, daemon, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sandboxd_client.cli", "--socket", daemon.socket_path, *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=check,
        )

    def test_create_exec_ls_rm(self, daemon) -> None:
        """sandboxctl creates, streams both outputs, exits with the command's code, lists and removes."""
        created = self._ctl(daemon, "create", "--memory", "512m", "--ttl", "600", "--label", "cli=yes", check=True)
        workspace_id = created.stdout.strip()
        try:
            run = self._ctl(daemon, "exec", workspace_id, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
            assert (run.stdout, run.stderr, run.returncode) == ("out\n", "err\n", 7)
            listed = self._ctl(daemon, "ls", "--label", "cli=yes", check=True).stdout.splitlines()
            assert listed[0].split() == [
                "WORKSPACE",
                "STATE",
                "IMAGE",
                "MEMORY",
                "NETWORK",
                "RUNTIME",
                "TTL",
                "CREATED",
            ]
            row = listed[1].split()
            assert row[0] == workspace_id
            assert row[3:7] == ["512MiB", "none", "runc", "600s"]
        finally:
            removed = self._ctl(daemon, "rm", workspace_id)
        assert removed.returncode == 0
        assert self._ctl(daemon, "ls", "-q", "--label", "cli=yes").stdout == ""

    def test_a_root_command_with_the_capabilities_create_gave_root(self, daemon) -> None:
        """`create --root-cap CHOWN`, then `exec --user root` may chown; the workspace's user may not."""
        created = self._ctl(daemon, "create", "--root-cap", "CHOWN", "--ttl", "600", check=True)
        workspace_id = created.stdout.strip()
        try:
            as_root = self._ctl(
                daemon, "exec", "--user", "root", workspace_id, "--", "chown sandbox /etc/hostname; id -u"
            )
            assert (as_root.stdout, as_root.stderr, as_root.returncode) == ("0\n", "", 0)
            as_user = self._ctl(daemon, "exec", workspace_id, "-u", "sandbox", "--", "chown root /etc/hostname")
            assert "Operation not permitted" in as_user.stderr and as_user.returncode == 1
        finally:
            self._ctl(daemon, "rm", workspace_id)

    def test_exec_options_after_the_workspace(self, daemon, workspace_id) -> None:
        """`exec WS --timeout 1 -e X=1 -w /tmp -- CMD`: options after the workspace apply, as documented."""
        run = self._ctl(
            daemon, "exec", workspace_id, "--timeout", "1", "-e", "X=1", "-w", "/tmp", "--", "echo $X $PWD; sleep 30"
        )
        assert run.stdout == "1 /tmp\n"
        assert run.returncode in {137, 143}  # killed at the 1 s timeout, not after 30 s
        # The exit code alone would not say why: one line does.
        signal_name = {137: "SIGKILL", 143: "SIGTERM"}[run.returncode]
        assert run.stderr == f"sandboxctl: the command timed out (ended by {signal_name})\n"
        stray = self._ctl(daemon, "exec", workspace_id, "oops", "--", "true")
        assert stray.returncode == 2
        assert "unexpected arguments before '--': oops" in stray.stderr

    def test_pause_and_resume(self, daemon, workspace_id) -> None:
        """`pause` then `ls` shows it paused; `resume` runs it again; a second resume is one error line."""
        assert self._ctl(daemon, "pause", workspace_id, check=True).stdout == f"{workspace_id}\n"
        row = self._ctl(daemon, "ls", "--label", "test=cli", check=True).stdout.splitlines()[1].split()
        assert row[:2] == [workspace_id, "paused"]
        assert self._ctl(daemon, "resume", workspace_id, check=True).stdout == f"{workspace_id}\n"
        again = self._ctl(daemon, "resume", workspace_id)
        assert (again.returncode, again.stderr) == (1, f"sandboxctl: workspace {workspace_id!r} is not paused\n")
        assert self._ctl(daemon, "exec", workspace_id, "--", "echo", "on").stdout == "on\n"

    def test_lifetime(self, daemon, workspace_id) -> None:
        """`lifetime WS SECONDS` prints the new end; 0 prints never; under a second is one error line."""
        before = datetime.datetime.now(datetime.UTC)
        ends = datetime.datetime.fromisoformat(
            self._ctl(daemon, "lifetime", workspace_id, "3600", check=True).stdout.strip()
        )
        assert before + datetime.timedelta(seconds=3590) <= ends <= before + datetime.timedelta(seconds=3700)
        assert self._ctl(daemon, "lifetime", workspace_id, "0", check=True).stdout == "never\n"
        short = self._ctl(daemon, "lifetime", workspace_id, "0.5")
        assert (short.returncode, short.stderr) == (
            1,
            "sandboxctl: lifetime must be 0 (no end) or 1 s to 3.16224e+07 s, got 0.5 s\n",
        )

    def test_snapshot_fork_and_pool(self, daemon, workspace_id) -> None:
        """`snapshot` prints its name and `snapshots` lists it; `fork` prints a new workspace that has the
        files; `rmsnapshot` removes it; `pool` says there is none on a daemon that keeps none."""
        self._ctl(daemon, "exec", workspace_id, "--", "sh", "-c", "echo kept > /workspace/k", check=True)
        name = f"cli-{workspace_id}"
        assert self._ctl(daemon, "snapshot", workspace_id, name, "--label", "by=cli", check=True).stdout == f"{name}\n"
        rows = self._ctl(daemon, "snapshots", "--label", "by=cli", check=True).stdout.splitlines()
        assert rows[0].split() == ["SNAPSHOT", "SOURCE", "IMAGE", "SIZE", "MEMORY", "CREATED"]
        assert rows[1].split()[:3] == [name, workspace_id, "sandboxd/base:bookworm"]
        assert rows[1].split()[4] == "-"  # files only
        # `restore` returns the workspace to it in place and prints its id.
        self._ctl(daemon, "exec", workspace_id, "--", "sh", "-c", "echo changed > /workspace/k", check=True)
        assert self._ctl(daemon, "restore", workspace_id, name, check=True).stdout == f"{workspace_id}\n"
        assert self._ctl(daemon, "exec", workspace_id, "--", "cat", "/workspace/k").stdout == "kept\n"
        # A runc workspace's memory cannot be kept: one line says why.
        refused = self._ctl(daemon, "snapshot", "--memory", workspace_id, f"{name}-memory")
        assert refused.returncode == 1 and "memory snapshots need gVisor" in refused.stderr, refused
        assert refused.stderr.count("\n") == 1
        fork = self._ctl(daemon, "fork", name, check=True).stdout.strip()
        try:
            assert self._ctl(daemon, "exec", fork, "--", "cat", "/workspace/k").stdout == "kept\n"
        finally:
            self._ctl(daemon, "rm", fork, check=True)
        assert self._ctl(daemon, "rmsnapshot", name, check=True).stdout == f"{name}\n"
        gone = self._ctl(daemon, "fork", name)
        assert (gone.returncode, gone.stderr) == (1, f"sandboxctl: snapshot {name!r} not found\n")
        assert "keeps no warm pool" in self._ctl(daemon, "pool", check=True).stdout

    def test_template_build_lists_and_forks(self, daemon, tmp_path, default_image: str) -> None:
        """`template build DIR --name N` streams the log and prints N; `templates` lists it; `fork` starts
        from it in its WORKDIR with the context's file; a failing step is one error line with its output."""
        (tmp_path / "Dockerfile").write_text(f"FROM {default_image}\nCOPY hello.txt /opt/tpl/\nWORKDIR /opt/tpl\n")
        (tmp_path / "hello.txt").write_text("from the context\n")
        name = f"cli-tpl-{tmp_path.name[-8:].lower().replace('_', '-')}"
        built = self._ctl(daemon, "template", "build", str(tmp_path), "--name", name, "--start", "sleep 1", check=True)
        assert built.stdout == f"{name}\n"
        assert "COPY hello.txt /opt/tpl/" in built.stderr  # the build's log, as it came
        rows = self._ctl(daemon, "templates", check=True).stdout.splitlines()
        assert rows[0].split() == ["TEMPLATE", "SIZE", "START", "CREATED"]
        assert [row.split()[0] for row in rows[1:]].count(name) == 1
        assert next(row for row in rows if row.startswith(name)).split()[2:4] == ["sleep", "1"]
        fork = self._ctl(daemon, "fork", name, check=True).stdout.strip()
        try:
            assert self._ctl(daemon, "exec", fork, "--", "pwd; cat hello.txt").stdout == "/opt/tpl\nfrom the context\n"
        finally:
            self._ctl(daemon, "rm", fork, check=True)
        (tmp_path / "Dockerfile").write_text(f"FROM {default_image}\nRUN echo why-it-failed; exit 9\n")
        failed = self._ctl(daemon, "template", "build", str(tmp_path), "--name", name, "-q")
        assert failed.returncode == 1 and failed.stderr.startswith("sandboxctl: template")
        assert "why-it-failed" in failed.stderr and "non-zero code: 9" in failed.stderr
        assert self._ctl(daemon, "rmsnapshot", name, check=True).stdout == f"{name}\n"

    def test_error_is_one_line(self, daemon) -> None:
        """A refused call prints exactly one `sandboxctl: ...` line and exits 1."""
        run = self._ctl(daemon, "exec", "ws-nope", "--", "true")
        assert run.returncode == 1
        assert run.stderr.splitlines() == ["sandboxctl: workspace 'ws-nope' not found"]

    def _ctl_without_daemon(self, tmp_path, *args: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
        """sandboxctl on a socket where no daemon listens."""
        return subprocess.run(
            [sys.executable, "-m", "sandboxd_client.cli", "--socket", str(tmp_path / "none.sock"), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    def test_daemon_down_is_one_line(self, tmp_path) -> None:
        """With no daemon on the socket, sandboxctl says it cannot connect, in one line."""
        run = self._ctl_without_daemon(tmp_path, "ls")
        assert run.returncode == 1
        assert len(run.stderr.splitlines()) == 1
        assert run.stderr.startswith("sandboxctl: ")

    def test_a_create_with_no_answer_names_the_workspace_it_may_have_made(self, tmp_path) -> None:
        """The id is the client's before it sends: the second line says how to find or remove it."""
        run = self._ctl_without_daemon(tmp_path, "create")
        assert run.returncode == 1
        first, second = run.stderr.splitlines()
        assert first.startswith("sandboxctl: ")
        workspace_id = second.split()[2]
        assert re.fullmatch(r"ws-[0-9a-f]{12}", workspace_id)
        assert second == (
            f"sandboxctl: workspace {workspace_id} may exist: `sandboxctl ls` shows it,"
            f" `sandboxctl rm {workspace_id}` removes it"
        )

    # A command that reads its stdin to the end, what it prints without -i, and with -i fed "x\n".
    READERS: ClassVar = [
        ("cat", "", "x\n"),
        ("python3 -c 'import sys; print(repr(sys.stdin.read()))'", "''\n", "'x\\n'\n"),
        ('read -r answer; echo "read: $? [$answer]"', "read: 1 []\n", "read: 0 [x]\n"),
    ]

    @pytest.mark.parametrize(("command", "closed", "fed"), READERS)
    def test_exec_without_i_gives_the_command_a_closed_stdin(
        self, daemon, workspace_id, command: str, closed: str, fed: str
    ) -> None:
        """Without -i the command reads end of file at once, whatever is piped to sandboxctl, as
        `docker exec` without -i gives it: nothing waits for input that will never come. With -i
        it reads what is piped, to its end."""
        import time

        for options, expected in (([], closed), (["-i"], fed)):
            start = time.monotonic()
            argv = [sys.executable, "-m", "sandboxd_client.cli", "--socket", daemon.socket_path, "exec"]
            run = subprocess.run(
                [*argv, *options, workspace_id, "--", command],
                input="x\n",
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert (run.stdout, run.stderr, run.returncode) == (expected, "", 0), options
            assert time.monotonic() - start < 20  # the exec's own cost; an open stdin would wait 120 s

    def test_exec_t_without_i_ends_the_terminal_s_input_at_once(self, daemon, workspace_id) -> None:
        """-t alone: the command has a terminal, and reading it gives end of file at once."""
        run = self._ctl(daemon, "exec", "-t", workspace_id, "--", "tty >/dev/null && echo tty; cat; echo end $?")
        assert (run.stdout.replace("\r\n", "\n"), run.returncode) == ("tty\nend 0\n", 0)

    def test_exec_interactive_stdin(self, daemon, workspace_id) -> None:
        """`exec -i` forwards standard input and closes it at end of file."""
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
                "wc -c",
            ],
            input="hello\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (run.stdout.strip(), run.returncode) == ("6", 0)

    def test_terminal_ctrl_c_is_forwarded(self, daemon, workspace_id) -> None:
        """SIGINT to sandboxctl (a terminal's Ctrl-C) interrupts the remote command: exit 130."""
        import signal
        import time

        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sandboxd_client.cli",
                "--socket",
                daemon.socket_path,
                "exec",
                workspace_id,
                "--",
                "trap 'echo interrupted; exit 130' INT; echo ready; while :; do sleep 0.1; done",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert (out, proc.returncode) == ("interrupted\n", 130)
        assert time.monotonic() - start < 5

    def test_tty_mode_and_raw_ctrl_c(self, daemon, workspace_id) -> None:
        """`exec -it` from a terminal: the command sees a tty, and a typed Ctrl-C (byte 3) interrupts it."""
        import os
        import pty
        import time

        controller, terminal = pty.openpty()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sandboxd_client.cli",
                "--socket",
                daemon.socket_path,
                "exec",
                "-it",
                workspace_id,
                "--",
                "tty; echo ready; sleep 30",
            ],
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
            close_fds=True,
        )
        os.close(terminal)
        seen = b""
        deadline = time.monotonic() + 30
        while b"ready" not in seen and time.monotonic() < deadline:
            seen += os.read(controller, 4096)
        assert b"/dev/pts/" in seen
        os.write(controller, b"\x03")
        assert proc.wait(timeout=30) == 130
        os.close(controller)

    def test_ps_and_kill(self, daemon, workspace_id) -> None:
        """`ps` lists sessions; `kill WS PID` ends one and says with which signal."""
        import asyncio

        async def start() -> str:
            async with SandboxClient(socket_path=daemon.socket_path, retries=False) as client:
                handle = client.exec(workspace_id, "sleep 77", yield_after_s=0.25)
                await handle.wait()
                return handle.process_id

        process_id = asyncio.run(start())
        listed = self._ctl(daemon, "ps", workspace_id, check=True).stdout
        assert process_id in listed
        assert "sleep 77" in listed
        killed = self._ctl(daemon, "kill", workspace_id, process_id, check=True)
        assert killed.stdout == f"{process_id} exited 143 (SIGTERM)\n"
        after = self._ctl(daemon, "ps", workspace_id, check=True).stdout.splitlines()
        assert after[0].split() == ["PROCESS", "PID", "STATE", "EXIT", "REASON", "COMMAND"]
        row = next(line for line in after if line.startswith(process_id)).split()
        assert row[2:6] == ["exited", "143", "SIGTERM", "killed"]
        wrong = self._ctl(daemon, "kill", "ws-other", process_id)
        assert wrong.returncode == 1
