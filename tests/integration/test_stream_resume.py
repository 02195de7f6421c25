"""A command's stream rides out daemon restarts: every byte once, and the real exit (issue 27 item 4).

The daemon is killed with SIGKILL three times while a client iterates one ``exec``: during a
50 MiB stream, and during a command that prints a line a second for 20 s. A new daemon takes
the sessions over from the agent (which holds its back-pressure for a reader that went away);
the client's handle attaches again with ``Input(resume_from=)`` from the last byte it got.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandboxd_client import (
    Dropped,
    Exited,
    InvalidArgumentError,
    Output,
    SandboxClient,
    SandboxError,
    StreamBrokenError,
)

from tests.conftest import new_instance, spawned_daemon
from tests.integration.helpers import skip_without

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

RUNTIMES = ["runc", pytest.param("runsc", marks=pytest.mark.runsc)]


class Daemons:
    """One daemon at a time on one socket and instance: ``kill`` plays a crash, then starts the next."""

    def __init__(self, tmp_path: Path, **env: str) -> None:
        self.tmp_path, self.instance, self.env = tmp_path, new_instance(), env
        self.kills = 0
        self._running: contextlib.AbstractContextManager[tuple[object, str, Path]] | None = None
        self.socket_path = self._start()

    def _start(self) -> str:
        self._running = spawned_daemon(self.tmp_path, self.instance, **self.env)
        _process, socket_path, _log = self._running.__enter__()
        self._process = _process
        return socket_path

    def kill(self) -> None:
        """SIGKILL the daemon (no drain, nothing said to anyone), then start a new one."""
        self._process.kill()  # type: ignore[attr-defined]
        self._process.wait()  # type: ignore[attr-defined]
        self.stop()
        self.kills += 1
        self._start()

    def stop(self) -> None:
        if self._running is not None:
            running, self._running = self._running, None
            running.__exit__(None, None, None)


@pytest.fixture
def daemons(tmp_path: Path, default_image: str) -> Iterator[Daemons]:
    started = Daemons(tmp_path)
    yield started
    started.stop()


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_fifty_mib_through_three_kills_arrive_byte_for_byte(
    daemons: Daemons, runtime: str, request: pytest.FixtureRequest
) -> None:
    """The client's sha256 of what it got is the command's; exit code 3, the command's own."""
    skip_without(runtime, request)
    async with SandboxClient(socket_path=daemons.socket_path) as client:
        ws = await client.create_workspace(runtime=runtime, labels={"test": "stream-resume"})
        try:
            made = await ws.exec(
                "head -c 39321600 /dev/urandom | base64 > /tmp/b; sha256sum < /tmp/b; wc -c < /tmp/b"
            ).wait()
            digest, size = made.stdout.split()[0], int(made.stdout.split()[-1])
            assert size > 50 * 1024 * 1024
            kills_at = [size // 5, size // 2, size * 4 // 5]
            got, seen, dropped = hashlib.sha256(), 0, 0
            handle = ws.exec("cat /tmp/b; exit 3", follow=True)
            async for event in handle:
                if isinstance(event, Output):
                    got.update(event.data)
                    seen += len(event.data)
                    if kills_at and seen >= kills_at[0]:
                        kills_at.pop(0)
                        daemons.kill()
                elif isinstance(event, Dropped):
                    dropped += event.dropped_bytes
            assert daemons.kills == 3
            assert (seen, dropped, got.hexdigest()) == (size, 0, digest)
            assert handle.result is not None
            assert (handle.result.exit_code, handle.result.stop_reason) == (3, "exited")
        finally:
            await ws.delete()


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_line_a_second_through_three_kills_comes_whole(
    daemons: Daemons, runtime: str, request: pytest.FixtureRequest
) -> None:
    """Twenty lines, each once and in order, through ``wait()``; exit code 5."""
    skip_without(runtime, request)
    async with SandboxClient(socket_path=daemons.socket_path) as client:
        ws = await client.create_workspace(runtime=runtime, labels={"test": "stream-resume"})
        try:
            handle = ws.exec("for i in $(seq 1 20); do echo line $i; sleep 1; done; exit 5", follow=True)
            lines, kills_at = "", [3, 8, 13]
            async for event in handle:
                if isinstance(event, Output):
                    lines += event.text
                    if kills_at and lines.count("\n") >= kills_at[0]:
                        kills_at.pop(0)
                        daemons.kill()
                elif isinstance(event, Exited):
                    assert (event.exit_code, event.stop_reason) == (5, "exited")
            assert daemons.kills == 3
            assert lines == "".join(f"line {i}\n" for i in range(1, 21))
        finally:
            await ws.delete()


async def test_a_daemon_that_does_not_come_back_says_where_to_attach(daemons: Daemons) -> None:
    """The resume budget runs out: the error names the process and the position to attach from."""
    async with SandboxClient(socket_path=daemons.socket_path, resume_s=3) as client:
        ws = await client.create_workspace(labels={"test": "stream-resume"})
        workspace_id = ws.workspace_id
        handle = ws.exec("echo first; sleep 600", follow=True)
        position = -1

        async def follow() -> None:
            nonlocal position
            async for event in handle:
                if isinstance(event, Output) and event.text == "first\n":
                    position = event.position
                    daemons._process.kill()  # type: ignore[attr-defined]  # and no daemon comes back

        with pytest.raises(StreamBrokenError) as broken:
            await follow()
        assert (broken.value.process_id, broken.value.resume_from) == (handle.process_id, position)
        assert f"input({handle.process_id!r}, resume_from={position})" in broken.value.message
    daemons.stop()
    daemons._start()
    async with SandboxClient(socket_path=daemons.socket_path) as client:
        rest = client.input(broken.value.process_id, resume_from=broken.value.resume_from, yield_after_s=1)
        assert (await rest.wait()).stdout == ""  # nothing of what it had comes again
        await client.kill(broken.value.process_id)
        await client.delete_workspace(workspace_id)


async def test_an_exited_session_whose_caller_comes_back_is_not_evicted_for_a_new_command(
    tmp_path: Path, default_image: str, docker_client
) -> None:  # type: ignore[no-untyped-def]
    """A full workspace (2 sessions) after a restart: a command that ended while no daemon ran, and
    whose caller was reading, stays for that caller; a new command evicts the other exited session
    (used more recently), and the caller resumes to the whole output and exit 0."""
    daemons = Daemons(tmp_path, SANDBOXD_WORKSPACE_MAX_SESSIONS="2")
    try:
        async with SandboxClient(socket_path=daemons.socket_path, retries=False) as client:
            ws = await client.create_workspace(labels={"test": "stream-resume"})
            other = await ws.exec("echo other").wait()
            command = "echo ready; while [ ! -e /tmp/go ]; do sleep 0.05; done; seq 1 5000; touch /tmp/done"
            handle = ws.exec(command, follow=True)
            position = -1

            async def follow() -> None:
                nonlocal position
                async for event in handle:
                    if isinstance(event, Output) and event.text == "ready\n":
                        position = event.position
                        daemons._process.kill()  # type: ignore[attr-defined]

            with pytest.raises(SandboxError):  # no retries: the stream breaks with the daemon
                await follow()
            assert position > 0
            # The command runs on and ends while no daemon runs.
            finished = docker_client.containers.get(ws.info.container_id).exec_run(
                ["sh", "-c", "touch /tmp/go; while [ ! -e /tmp/done ]; do sleep 0.05; done"]
            )
            assert finished.exit_code == 0
        daemons.stop()
        daemons._start()
        async with SandboxClient(socket_path=daemons.socket_path, retries=False) as client:
            # The other session is used now: the awaited one is the least recently used.
            assert (await client.input(other.process_id, yield_after_s=0.3).wait()).exit_code == 0
            assert (await client.exec(ws.workspace_id, "echo new", follow=True).wait()).stdout == "new\n"
            rest = await client.input(handle.process_id, resume_from=position, yield_after_s=10).wait()
            assert (rest.exit_code, rest.stdout) == (0, "".join(f"{i}\n" for i in range(1, 5001)))
            await client.delete_workspace(ws.workspace_id)
    finally:
        daemons.stop()


async def test_a_position_past_the_output_is_refused_and_an_honest_one_goes_on(client, workspace) -> None:  # type: ignore[no-untyped-def]
    """A forged ``resume_from`` would make the output vanish for every caller: INVALID_ARGUMENT instead."""
    handle = workspace.exec("echo one; read line; echo two $line", yield_after_s=0.25)
    events = [event async for event in handle]
    seen = [e for e in events if isinstance(e, Output)]
    while not seen:  # a loaded host: the first line comes in a later poll
        seen = [e for e in await _poll(client, handle.process_id) if isinstance(e, Output)]
    with pytest.raises(InvalidArgumentError, match="is past the output"):
        await client.input(handle.process_id, resume_from=10**12).wait()
    with pytest.raises(InvalidArgumentError, match="output position"):
        await client.input(handle.process_id, resume_from=-1).wait()
    rest = await client.input(handle.process_id, "x\n", resume_from=seen[-1].position, follow=True).wait()
    assert (rest.stdout, rest.exit_code) == ("two x\n", 0)


async def _poll(client, process_id: str) -> list[object]:  # type: ignore[no-untyped-def]
    return [event async for event in client.input(process_id, yield_after_s=0.25)]


SECRET = "".join(chr(ord("a") + (i * 7) % 26) for i in range(257))
"""A value of 257 characters (prime): an offset the daemon picks is inside one of its copies but 1 in 257."""


async def test_a_reader_after_a_restart_mid_stream_gets_no_part_of_a_value_in_clear(
    tmp_path: Path, default_image: str
) -> None:
    """12 MiB of a value printed back to back, read whole, then the daemon is SIGKILLed.

    While a caller reads, the daemon acknowledges 8 MiB less than it sent, at whatever offset that
    is: inside a copy of the value. The next daemon's masker starts there, so a caller that attaches
    without a position gets the rest of that copy unmasked.
    """
    daemons = Daemons(tmp_path, SANDBOXD_SECRET_big=SECRET)
    workspace_id = ""
    try:
        async with SandboxClient(socket_path=daemons.socket_path) as client:
            ws = await client.create_workspace(env={"K": "secret:big"}, labels={"test": "stream-resume"})
            workspace_id = ws.workspace_id
            copies = 12 * 1024 * 1024 // len(SECRET)
            handle = ws.exec(f'yes "$K" | tr -d "\\n" | head -c {copies * len(SECRET)}; echo; sleep 600', follow=True)
            text = ""
            async for event in handle:
                if isinstance(event, Output):
                    text += event.text
                    if text.endswith("\n"):
                        break
            assert text == "[REDACTED:big]" * copies + "\n"
            daemons.kill()
        async with SandboxClient(socket_path=daemons.socket_path) as client:
            again = await client.input(handle.process_id, yield_after_s=2).wait()
            assert again.stdout.replace("[REDACTED:big]", "") in ("", "\n")
    finally:
        if workspace_id:
            async with SandboxClient(socket_path=daemons.socket_path) as client:
                await client.delete_workspace(workspace_id)
        daemons.stop()
