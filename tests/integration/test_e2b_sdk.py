"""The unmodified ``e2b`` SDK (2.63.0) drives sandboxd through ``--e2b-listen``, under runc and runsc.

Each module-level daemon serves the E2B plane on a loopback port; the SDK is pointed at it with
the two settings a self-hosted E2B takes (``E2B_API_URL``, ``E2B_SANDBOX_URL``). Every value
asserted is what E2B's own service gives for the same call.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import (
    AsyncSandbox,
    CommandExitException,
    FileType,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    TimeoutException,
)
from e2b.sandbox.commands.command_handle import PtySize

from tests.conftest import DaemonThread, make_settings

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module", params=["runc", pytest.param("runsc", marks=pytest.mark.runsc)])
def e2b_daemon(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, e2b_image: str
) -> Iterator[DaemonThread]:
    """A daemon whose workspaces run under the parameter's runtime, with the E2B plane on."""
    runtime = request.param
    if runtime == "runsc" and not request.getfixturevalue("runsc_available"):
        pytest.skip("the engine has no runsc")
    settings = make_settings(
        tmp_path_factory.mktemp(f"e2b-{runtime}"), e2b_address="127.0.0.1:0", default_runtime=runtime
    )
    thread = DaemonThread(settings).start()
    yield thread
    thread.stop()


@pytest.fixture
def sbx(e2b_env: str, request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """A sandbox of the default template, killed afterwards."""
    sandbox = Sandbox.create(metadata={"test": request.node.name[:100]})
    try:
        yield sandbox
    finally:
        sandbox.kill()


def test_run_streams_output_and_returns_the_result(sbx: Sandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    result = sbx.commands.run(
        "echo one; echo two >&2; echo $GREETING; pwd",
        envs={"GREETING": "hi"},
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert result.exit_code == 0
    assert result.stdout == "one\nhi\n/home/user\n"  # E2B's base template works in the user's home
    assert result.stderr == "two\n"
    assert "".join(out) == result.stdout
    assert "".join(err) == "two\n"


def test_a_failing_command_raises_with_its_exit_code_and_stderr(sbx: Sandbox) -> None:
    with pytest.raises(CommandExitException) as raised:
        sbx.commands.run("echo oops >&2; exit 7")
    assert raised.value.exit_code == 7
    assert raised.value.stderr == "oops\n"


def test_cwd_and_user(sbx: Sandbox) -> None:
    sbx.files.make_dir("/tmp/place")
    assert sbx.commands.run("pwd", cwd="/tmp/place").stdout == "/tmp/place\n"
    assert sbx.commands.run("id -un").stdout == "user\n"
    assert sbx.commands.run("id -u", user="root").stdout == "0\n"


def test_stdin_is_closed_unless_asked_for(sbx: Sandbox) -> None:
    # The SDK's default (stdin=False): a command reading stdin sees end-of-file at once.
    started = time.monotonic()
    assert sbx.commands.run("cat; echo done", timeout=20).stdout == "done\n"
    assert time.monotonic() - started < 10


def test_timeout_kills_the_command(sbx: Sandbox) -> None:
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 60", timeout=2)
    deadline = time.monotonic() + 10
    while any("sleep 60" in " ".join(p.args) for p in sbx.commands.list()):
        assert time.monotonic() < deadline, "the timed-out command still runs"
        time.sleep(0.2)


def test_background_command_list_send_stdin_and_kill(sbx: Sandbox) -> None:
    handle = sbx.commands.run("read line; echo got:$line; sleep 60", background=True, stdin=True)
    assert handle.pid in [p.pid for p in sbx.commands.list()]
    sbx.commands.send_stdin(handle.pid, "hello\n")
    for event_stdout, _stderr, _pty in handle:
        if event_stdout and "got:hello" in event_stdout:
            break
    assert sbx.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as raised:
        handle.wait()
    assert raised.value.exit_code == -1  # as envd says it (Go): killed by a signal
    assert handle.pid not in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(handle.pid) is False  # NOT_FOUND: nothing left to kill


def test_connect_follows_a_running_command_from_then_on(sbx: Sandbox) -> None:
    handle = sbx.commands.run("for i in 1 2 3 4 5 6; do echo tick$i; sleep 0.5; done", background=True)
    follower = sbx.commands.connect(handle.pid)
    result = follower.wait()
    assert result.exit_code == 0
    assert "tick6\n" in result.stdout
    assert handle.wait().stdout == "".join(f"tick{i}\n" for i in range(1, 7))


def test_close_stdin_ends_a_reader(sbx: Sandbox) -> None:
    handle = sbx.commands.run("wc -c", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, b"12345")
    sbx.commands.close_stdin(handle.pid)
    assert handle.wait().stdout.strip() == "5"


def test_pty_create_input_resize_and_kill(sbx: Sandbox) -> None:
    seen = bytearray()
    done = threading.Event()
    ended: list[BaseException | None] = []

    def on_pty(data: bytes) -> None:
        seen.extend(data)
        if re.search(rb"cols=\d+ rows=\d+", seen):
            done.set()

    def follow() -> None:
        try:
            terminal.wait(on_pty=on_pty)
            ended.append(None)
        except BaseException as exc:  # the kill ends it with an exit code
            ended.append(exc)

    terminal = sbx.pty.create(PtySize(rows=24, cols=80), timeout=30)
    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    sbx.pty.resize(terminal.pid, PtySize(rows=40, cols=132))
    sbx.pty.send_stdin(terminal.pid, b"echo cols=$(tput cols) rows=$(tput lines)\n")
    assert done.wait(20), bytes(seen)[-400:]
    assert b"cols=132 rows=40" in seen
    assert sbx.pty.kill(terminal.pid) is True
    reader.join(20)
    assert not reader.is_alive()
    assert isinstance(ended[0], CommandExitException)
    assert ended[0].exit_code == -1


def test_files_write_read_and_list(sbx: Sandbox) -> None:
    info = sbx.files.write("/workspace/dir/notes.txt", "first line\n")
    assert info.path == "/workspace/dir/notes.txt"
    assert sbx.files.read("/workspace/dir/notes.txt") == "first line\n"
    blob = bytes(range(256)) * 1000
    sbx.files.write("/workspace/dir/blob.bin", blob)
    assert bytes(sbx.files.read("/workspace/dir/blob.bin", format="bytes")) == blob
    assert b"".join(sbx.files.read("/workspace/dir/blob.bin", format="stream")) == blob
    names = {(e.name, e.type) for e in sbx.files.list("/workspace/dir")}
    assert names == {("notes.txt", FileType.FILE), ("blob.bin", FileType.FILE)}
    sbx.files.make_dir("/workspace/dir/sub/deeper")
    deep = [e.path for e in sbx.files.list("/workspace/dir", depth=3)]
    assert deep == [  # depth first, by name at each level, as envd walks
        "/workspace/dir/blob.bin",
        "/workspace/dir/notes.txt",
        "/workspace/dir/sub",
        "/workspace/dir/sub/deeper",
    ]
    assert sbx.commands.run("cat /workspace/dir/notes.txt").stdout == "first line\n"


def test_files_exists_info_rename_remove(sbx: Sandbox) -> None:
    sbx.files.write("/workspace/a.txt", "12345")
    assert sbx.files.exists("/workspace/a.txt") is True
    assert sbx.files.exists("/workspace/missing") is False
    info = sbx.files.get_info("/workspace/a.txt")
    assert (info.name, info.type, info.size, info.permissions) == ("a.txt", FileType.FILE, 5, "-rw-r--r--")
    assert sbx.files.make_dir("/workspace/d") is True
    assert sbx.files.make_dir("/workspace/d") is False  # ALREADY_EXISTS
    moved = sbx.files.rename("/workspace/a.txt", "/workspace/d/b.txt")
    assert moved.path == "/workspace/d/b.txt"
    assert sbx.files.exists("/workspace/a.txt") is False
    sbx.files.remove("/workspace/d")
    assert sbx.files.exists("/workspace/d") is False
    with pytest.raises(NotFoundException):
        sbx.files.read("/workspace/d/b.txt")


def test_write_many_files_at_once(sbx: Sandbox) -> None:
    from e2b.sandbox.filesystem.filesystem import WriteEntry

    written = sbx.files.write_files([WriteEntry(path=f"/workspace/m/{i}.txt", data=f"n{i}") for i in range(5)])
    assert sorted(w.path for w in written) == [f"/workspace/m/{i}.txt" for i in range(5)]
    assert sbx.commands.run("cat /workspace/m/*.txt").stdout == "n0n1n2n3n4"


def test_lifecycle_connect_list_info_kill(e2b_env: str) -> None:
    sandbox = Sandbox.create(metadata={"suite": "e2b-lifecycle", "n": "1"}, envs={"FROM_CREATE": "yes"})
    try:
        assert sandbox.commands.run("echo $FROM_CREATE").stdout == "yes\n"
        again = Sandbox.connect(sandbox.sandbox_id)
        assert again.commands.run("echo still").stdout == "still\n"
        info = sandbox.get_info()
        assert info.sandbox_id == sandbox.sandbox_id
        assert info.metadata == {"suite": "e2b-lifecycle", "n": "1"}
        assert info.state.value == "running"
        assert sandbox.is_running() is True
        listed = Sandbox.list(query=SandboxQuery(metadata={"suite": "e2b-lifecycle"})).next_items()
        assert [s.sandbox_id for s in listed] == [sandbox.sandbox_id]
        assert Sandbox.list(query=SandboxQuery(metadata={"suite": "no-such"})).next_items() == []
    finally:
        assert Sandbox.kill(sandbox.sandbox_id) is True
    assert Sandbox.kill(sandbox.sandbox_id) is False
    assert sandbox.is_running() is False


def test_pause_then_connect_resumes(e2b_env: str) -> None:
    sandbox = Sandbox.create()
    try:
        sandbox.files.write("/workspace/kept.txt", "kept")
        assert sandbox.pause() is True
        assert Sandbox.get_info(sandbox.sandbox_id).state.value == "paused"
        assert sandbox.pause() is False  # 409: paused already
        resumed = Sandbox.connect(sandbox.sandbox_id)
        assert Sandbox.get_info(sandbox.sandbox_id).state.value == "running"
        assert resumed.files.read("/workspace/kept.txt") == "kept"
    finally:
        sandbox.kill()


def test_async_sandbox(e2b_env: str, tmp_path: Path) -> None:
    async def scenario() -> None:
        sandbox = await AsyncSandbox.create()
        try:
            out: list[str] = []
            result = await sandbox.commands.run("echo async; exit 0", on_stdout=out.append)
            assert result.stdout == "async\n"
            assert out == ["async\n"]
            await sandbox.files.write("/workspace/x.txt", "from async")
            assert await sandbox.files.read("/workspace/x.txt") == "from async"
            handle = await sandbox.commands.run("sleep 30", background=True)
            assert await sandbox.commands.kill(handle.pid) is True
            with pytest.raises(CommandExitException):
                await handle.wait()
            listed = await AsyncSandbox.connect(sandbox.sandbox_id)
            assert (await listed.commands.run("echo again")).stdout == "again\n"
        finally:
            await sandbox.kill()

    asyncio.run(scenario())


def _wait(predicate, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the condition never came"
        time.sleep(0.2)


def test_timeout_ends_the_sandbox_and_set_timeout_moves_it(e2b_env: str) -> None:
    sandbox = Sandbox.create(timeout=5)
    try:
        info = sandbox.get_info()
        assert 4 <= (info.end_at - info.started_at).total_seconds() <= 8
        sandbox.set_timeout(600)
        moved = sandbox.get_info().end_at
        assert (moved - info.started_at).total_seconds() >= 590
        time.sleep(6)  # past the first end: moved, it runs on (the reaper looks every second)
        assert sandbox.is_running() is True
        sandbox.set_timeout(1)
        _wait(lambda: not sandbox.is_running())

        def gone() -> bool:  # not running may be its teardown under way: then it is gone
            try:
                Sandbox.get_info(sandbox.sandbox_id)
            except SandboxNotFoundException:
                return True
            return False

        _wait(gone)
    finally:
        sandbox.kill()


def test_on_timeout_pause_then_connect_resumes(e2b_env: str) -> None:
    sandbox = Sandbox.create(timeout=2, lifecycle={"on_timeout": "pause"})
    try:
        sandbox.files.write("/workspace/state.txt", "before the pause")
        _wait(lambda: Sandbox.get_info(sandbox.sandbox_id).state.value == "paused")
        assert sandbox.is_running() is False
        resumed = Sandbox.connect(sandbox.sandbox_id, timeout=60)
        assert resumed.files.read("/workspace/state.txt") == "before the pause"
        info = Sandbox.get_info(sandbox.sandbox_id)
        assert info.state.value == "running"
        assert 50 <= (info.end_at - datetime.datetime.now(datetime.UTC)).total_seconds() <= 62
    finally:
        sandbox.kill()


def test_watch_dir_reports_changes_made_before_each_call(sbx: Sandbox) -> None:
    from e2b import FilesystemEventType

    sbx.files.make_dir("/workspace/w/nested")
    sbx.files.write("/workspace/w/old.txt", "old")
    handle = sbx.files.watch_dir("/workspace/w", recursive=True, include_entry=True)
    assert handle.get_new_events() == []
    sbx.files.write("/workspace/w/nested/new.txt", "new content")
    events = [(e.type, e.name) for e in handle.get_new_events()]
    assert events == [(FilesystemEventType.CREATE, "nested/new.txt"), (FilesystemEventType.WRITE, "nested/new.txt")]
    sbx.commands.run("echo more >> /workspace/w/old.txt && chmod 600 /workspace/w/nested/new.txt")
    changed = handle.get_new_events()
    assert [(e.type, e.name) for e in changed] == [
        (FilesystemEventType.CHMOD, "nested/new.txt"),
        (FilesystemEventType.WRITE, "old.txt"),
    ]
    assert changed[1].entry is not None and changed[1].entry.path == "/workspace/w/old.txt"
    sbx.files.remove("/workspace/w/old.txt")
    assert [(e.type, e.name) for e in handle.get_new_events()] == [(FilesystemEventType.REMOVE, "old.txt")]
    handle.stop()
    with pytest.raises(SandboxException):
        handle.get_new_events()


def test_async_watch_dir_streams_events(e2b_env: str) -> None:
    from e2b import FilesystemEventType

    async def scenario() -> None:
        sandbox = await AsyncSandbox.create()
        try:
            await sandbox.files.make_dir("/workspace/aw")
            seen: list[tuple[FilesystemEventType, str]] = []
            arrived = {kind: asyncio.Event() for kind in FilesystemEventType}

            def on_event(event) -> None:  # type: ignore[no-untyped-def]
                seen.append((event.type, event.name))
                arrived[event.type].set()

            handle = await sandbox.files.watch_dir("/workspace/aw", on_event=on_event, timeout=60)
            await sandbox.files.write("/workspace/aw/f.txt", "x")
            await asyncio.wait_for(arrived[FilesystemEventType.CREATE].wait(), 20)
            await sandbox.files.remove("/workspace/aw/f.txt")
            await asyncio.wait_for(arrived[FilesystemEventType.REMOVE].wait(), 20)
            assert seen == [
                (FilesystemEventType.CREATE, "f.txt"),
                (FilesystemEventType.WRITE, "f.txt"),
                (FilesystemEventType.REMOVE, "f.txt"),
            ]
            await handle.stop()
        finally:
            await sandbox.kill()

    asyncio.run(scenario())


def test_snapshot_create_list_start_from_and_delete(sbx: Sandbox, e2b_env: str) -> None:
    sbx.files.write("/workspace/kept.txt", "in the snapshot")
    name = f"e2b-snap-{sbx.sandbox_id}"
    made = sbx.create_snapshot(name=name)
    assert made.snapshot_id == name
    assert [s.snapshot_id for s in sbx.list_snapshots().next_items()] == [name]
    started = Sandbox.create(template=name)
    try:
        assert started.files.read("/workspace/kept.txt") == "in the snapshot"
        assert started.get_info().template_id == name
    finally:
        started.kill()
    assert Sandbox.delete_snapshot(name) is True
    assert Sandbox.delete_snapshot(name) is False
    assert sbx.list_snapshots().next_items() == []


def test_fork_makes_sandboxes_with_the_files(sbx: Sandbox) -> None:
    sbx.files.write("/workspace/kept.txt", "forked")
    forks = sbx.fork(count=2, timeout=120)
    try:
        assert len(forks) == 2
        for fork in forks:
            assert isinstance(fork, Sandbox)
            assert fork.sandbox_id != sbx.sandbox_id
            assert fork.files.read("/workspace/kept.txt") == "forked"
        assert len({f.sandbox_id for f in forks if isinstance(f, Sandbox)}) == 2
    finally:
        for fork in forks:
            if isinstance(fork, Sandbox):
                fork.kill()
    assert sbx.list_snapshots().next_items() == []  # the fork's own snapshot is gone


def test_list_is_newest_first_filters_before_paging_and_pages_by_token(e2b_env: str) -> None:
    from e2b import SandboxState

    suite = {"suite": f"paging-{time.monotonic_ns()}"}
    made = [Sandbox.create(metadata=suite) for _ in range(3)]
    try:
        made[1].pause()
        running = SandboxQuery(metadata=suite, state=[SandboxState.RUNNING])
        pager = Sandbox.list(query=running, limit=1)
        pages = [pager.next_items()]
        while pager.has_next:
            pages.append(pager.next_items())
        assert [[s.sandbox_id for s in page] for page in pages] == [[made[2].sandbox_id], [made[0].sandbox_id]]
        oldest_first = Sandbox.list(query=SandboxQuery(metadata=suite), order="asc").next_items()
        assert [s.sandbox_id for s in oldest_first] == [s.sandbox_id for s in made]
        assert [s.state for s in oldest_first] == [SandboxState.RUNNING, SandboxState.PAUSED, SandboxState.RUNNING]
        after = Sandbox.get_info(made[1].sandbox_id).started_at  # "started after" includes the instant itself
        later = Sandbox.list(query=SandboxQuery(metadata=suite, started_after=after)).next_items()
        assert [s.sandbox_id for s in later] == [made[2].sandbox_id, made[1].sandbox_id]
    finally:
        for sandbox in made:
            sandbox.kill()


def test_envd_file_details_and_a_remove_of_nothing(sbx: Sandbox) -> None:
    sbx.files.write("/workspace/d/f.txt", "12345")
    info = sbx.files.get_info("/workspace/d/f.txt")
    assert (info.mode, info.permissions) == (0o644, "-rw-r--r--")
    assert (info.owner, info.group) == ("user", "user")
    assert (sbx.files.get_info("/etc/hostname").owner, sbx.files.get_info("/etc/hostname").group) == ("root", "root")
    directory = sbx.files.get_info("/workspace/d")
    assert (directory.type, directory.permissions) == (FileType.DIR, "drwxr-xr-x")
    sbx.commands.run("ln -s f.txt /workspace/d/link")
    link = sbx.files.get_info("/workspace/d/link")
    assert (link.symlink_target, link.size) == ("/workspace/d/f.txt", 5)
    sbx.files.remove("/workspace/d/not-there")  # envd: no error
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info("ws-000000000000")


def test_connect_never_shortens_and_timeout_zero_ends_now(e2b_env: str) -> None:
    sandbox = Sandbox.create(timeout=600)
    try:
        end = sandbox.get_info().end_at
        Sandbox.connect(sandbox.sandbox_id, timeout=10)
        assert sandbox.get_info().end_at == end
        Sandbox.connect(sandbox.sandbox_id, timeout=1200)
        assert sandbox.get_info().end_at > end
        sandbox.set_timeout(0)
        _wait(lambda: not sandbox.is_running(), 15)
    finally:
        sandbox.kill()


def test_relative_paths_are_the_home_directorys_as_in_e2b(sbx: Sandbox) -> None:
    written = sbx.files.write("notes/rel.txt", "relative")
    assert written.path == "/home/user/notes/rel.txt"
    assert sbx.commands.run("cat notes/rel.txt").stdout == "relative"
    assert sbx.commands.run("pwd", cwd="notes").stdout == "/home/user/notes\n"
    assert [e.path for e in sbx.files.list("notes")] == ["/home/user/notes/rel.txt"]
    assert sbx.files.read("~/notes/rel.txt") == "relative"
    assert sbx.files.rename("notes/rel.txt", "moved.txt").path == "/home/user/moved.txt"
    assert sbx.commands.run("python -c 'print(6 * 7)'").stdout == "42\n"  # E2B's template has `python`


def test_a_command_whose_sandbox_is_killed_says_the_sandbox_is_gone(e2b_env: str) -> None:
    from e2b import SandboxNotRunningException

    sandbox = Sandbox.create()
    handle = sandbox.commands.run("sleep 60", background=True)
    assert sandbox.kill() is True
    with pytest.raises(SandboxNotRunningException, match="killed or reached its end of life"):
        handle.wait()
