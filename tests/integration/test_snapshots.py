"""Snapshots and forks: a workspace's files kept, forked into workspaces that each have their own copy.

Under runc and gVisor: /workspace and what changed in the root filesystem are in every
fork; a write in one fork is nowhere else. Bad names, other tenants' snapshots and deleted
ones are clean errors that leave nothing behind.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from pathlib import Path

import docker
import pytest
from sandboxd_client import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    SandboxClient,
)

from sandboxd.tenancy import create_token
from tests.conftest import DaemonThread, make_settings, rss_bytes, spawned_daemon

from .helpers import skip_without, start_ready

pytestmark = pytest.mark.docker

RUNTIMES = ["runc", pytest.param("runsc", marks=pytest.mark.runsc)]


def snapshot_images(docker_client, instance: str) -> list:  # type: ignore[type-arg, no-untyped-def]
    return docker_client.images.list(filters={"label": f"sandboxd.instance={instance}"})


@pytest.fixture
async def own(tmp_path: Path, default_image: str):  # type: ignore[no-untyped-def]
    """A daemon of its own (its images are counted), with its client."""
    thread = DaemonThread(make_settings(tmp_path, tenant_max_snapshots=3)).start()
    try:
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            yield client, thread.settings.instance
    finally:
        thread.stop()


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_forks_have_every_file_and_their_own_copy(
    own, docker_client, runtime: str, request: pytest.FixtureRequest
) -> None:
    """1,000 files and a root-filesystem change, snapshot, 3 forks: each sees all; a write in one is in no other."""
    skip_without(runtime, request)
    client, instance = own
    source = await client.create_workspace(runtime=runtime, env={"STAGE": "one"}, labels={"team": "a"})
    made = await source.exec(
        "for i in $(seq 1000); do echo $i > /workspace/f$i; done; mkdir -p ~/.cache && echo home > ~/.cache/x"
        " && echo rootfs > /var/tmp/marker && echo done"
    ).wait()
    assert made.stdout == "done\n", made
    snapshot = await source.snapshot("deps", labels={"stage": "deps"})
    assert (snapshot.name, snapshot.source_workspace_id) == ("deps", source.workspace_id)
    assert snapshot.labels == {"stage": "deps"}
    assert snapshot.size_bytes > 0 and snapshot.user == "sandbox"
    forks = [await client.create_workspace(from_snapshot="deps") for _ in range(3)]
    for number, fork in enumerate(forks):
        assert fork.info.from_snapshot == "deps"
        assert (fork.info.runtime, fork.info.env, fork.info.user) == (runtime, {"STAGE": "one"}, "sandbox")
        assert fork.info.labels == {"team": "a"}  # unset: the source's
        seen = await fork.exec(
            "ls /workspace | wc -l; cat /workspace/f1000 ~/.cache/x /var/tmp/marker;"
            " stat -c %U /workspace/f1; echo $STAGE"
        ).wait()
        assert seen.stdout == "1000\n1000\nhome\nrootfs\nsandbox\none\n", seen
        await fork.write_file(f"/workspace/mine-{number}", f"{number}\n")
    for number, other in enumerate([source, *forks]):
        mine = (await other.exec("ls /workspace | grep mine-").wait()).stdout.split()
        assert mine == ([] if number == 0 else [f"mine-{number - 1}"]), (number, mine)
    # A fork with labels of its own has none of the source's (its image has them: they are blanked).
    relabelled = await client.create_workspace(from_snapshot="deps", labels={"role": "x"})
    assert relabelled.info.labels == {"role": "x"}
    teams = {w.workspace_id for w in await client.list_workspaces({"team": "a"})}
    assert teams == {source.workspace_id, *(f.workspace_id for f in forks)}
    assert [w.workspace_id for w in await client.list_workspaces({"role": "x"})] == [relabelled.workspace_id]
    # Its container carries "team" blank; the workspace has no such label, and a selector that
    # asks for a blank value matches only a workspace whose own label is blank.
    blank = await client.create_workspace(runtime=runtime, labels={"team": ""})
    assert [w.workspace_id for w in await client.list_workspaces({"team": ""})] == [blank.workspace_id]
    await blank.delete()
    for fork in [*forks, relabelled]:
        await fork.delete()
    await source.delete()
    await client.delete_snapshot("deps")
    assert snapshot_images(docker_client, instance) == []  # nothing of it is left


async def test_a_100_mib_workspace_is_streamed(tmp_path: Path, docker_client) -> None:
    """Snapshot and fork of 100 MiB of /workspace: the same bytes in the fork, the daemon's memory flat."""
    with spawned_daemon(tmp_path) as (process, socket_path, _log):
        async with SandboxClient(socket_path=socket_path, retries=False) as client:
            source = await client.create_workspace()
            made = await source.exec("head -c 100M /dev/urandom > /workspace/big && sha256sum /workspace/big").wait()
            digest = made.stdout.split()[0]
            before = rss_bytes(process.pid)
            peak = [before]
            done = threading.Event()

            def sample() -> None:
                while not done.wait(0.02):
                    peak[0] = max(peak[0], rss_bytes(process.pid))

            sampler = threading.Thread(target=sample)
            sampler.start()
            try:
                await source.snapshot("big")
            finally:
                done.set()
                sampler.join()
            assert peak[0] - before < 40 * 1024**2, f"the daemon grew by {(peak[0] - before) / 1024**2:.0f} MiB"
            fork = await client.create_workspace(from_snapshot="big")
            assert (await fork.exec("sha256sum /workspace/big").wait()).stdout.split()[0] == digest
            for ws in (fork, source):
                await ws.delete()
            await client.delete_snapshot("big")


async def test_bad_names_and_missing_snapshots_are_clean_errors(own, docker_client) -> None:
    """'/', '..', 300 characters, a name taken, a deleted snapshot, an image beside a snapshot: each a
    status and a message, and nothing half-made stays."""
    client, instance = own
    ws = await client.create_workspace()
    for name in ("a/b", "..", "a..b", "x" * 300, "", "-lead", "sp ace", "ok\n"):
        with pytest.raises(InvalidArgumentError, match="snapshot name"):
            await ws.snapshot(name)
    await ws.snapshot("taken")
    with pytest.raises(AlreadyExistsError, match="snapshot 'taken' already exists"):
        await ws.snapshot("taken")
    with pytest.raises(InvalidArgumentError, match=r"spec\.image must be empty"):
        await client.create_workspace(from_snapshot="taken", image="sandboxd/base:bookworm")
    await client.delete_snapshot("taken")
    for call in (
        lambda: client.create_workspace(from_snapshot="taken"),
        lambda: client.get_snapshot("taken"),
        lambda: client.delete_snapshot("taken"),
    ):
        with pytest.raises(NotFoundError, match="snapshot 'taken' not found"):
            await call()
    with pytest.raises(NotFoundError):
        await client.snapshot_workspace("ws-nosuchthing", "x")
    for index in range(3):  # the quota is 3
        await ws.snapshot(f"q{index}")
    with pytest.raises(ResourceExhaustedError, match="3 snapshots"):
        await ws.snapshot("q3")
    assert [s.name for s in await client.list_snapshots()] == ["q0", "q1", "q2"]
    for index in range(3):
        await client.delete_snapshot(f"q{index}")
    assert [w.workspace_id for w in await client.list_workspaces()] == [ws.workspace_id]
    part = {"label": [f"sandboxd.instance={instance}", "sandboxd.snapshot_part=true"]}
    assert not docker_client.api.containers(all=True, filters=part)
    await ws.delete()
    assert snapshot_images(docker_client, instance) == []


async def test_a_snapshot_is_its_tenants_alone(tmp_path: Path, default_image: str) -> None:
    """Team B can neither see, fork, nor delete team A's snapshot, and may have one of the same name."""
    tokens = tmp_path / "tokens.json"
    token_a, token_b = create_token(tokens, "team-a"), create_token(tokens, "team-b")
    thread = DaemonThread(make_settings(tmp_path, tokens_file=str(tokens))).start()
    try:
        async with (
            SandboxClient(socket_path=thread.socket_path, retries=False, token=token_a) as a,
            SandboxClient(socket_path=thread.socket_path, retries=False, token=token_b) as b,
        ):
            ws_a = await a.create_workspace()
            await ws_a.write_file("/workspace/secret.txt", "a's\n")
            await ws_a.snapshot("shared-name")
            assert await b.list_snapshots() == []
            # Nor by naming its image: its tag (a digest B can compute, names being guessable) or its id.
            instance = thread.settings.instance
            tag = hashlib.sha256(f"{instance}\0team-a\0shared-name".encode()).hexdigest()[:40]
            image_id = docker.from_env().images.get(f"sandboxd/snapshot:{tag}").id.removeprefix("sha256:")
            for image in (f"sandboxd/snapshot:{tag}", image_id[:12], image_id[:4]):
                for client in (b, a):  # its own tenant forks it by name only
                    with pytest.raises(NotFoundError, match="is not present"):
                        await client.create_workspace(image=image)
            for call in (
                lambda: b.get_snapshot("shared-name"),
                lambda: b.create_workspace(from_snapshot="shared-name"),
                lambda: b.delete_snapshot("shared-name"),
                lambda: b.snapshot_workspace(ws_a.workspace_id, "stolen"),
            ):
                with pytest.raises(NotFoundError):
                    await call()
            ws_b = await b.create_workspace()
            await ws_b.snapshot("shared-name")  # B's own, of the same name
            fork_b = await b.create_workspace(from_snapshot="shared-name")
            assert (await fork_b.exec("ls /workspace").wait()).stdout == ""
            fork_a = await a.create_workspace(from_snapshot="shared-name")
            assert (await fork_a.exec("cat /workspace/secret.txt").wait()).stdout == "a's\n"
            for client, workspace in ((b, fork_b), (b, ws_b), (a, fork_a), (a, ws_a)):
                await client.delete_workspace(workspace.workspace_id)
            await a.delete_snapshot("shared-name")
            await b.delete_snapshot("shared-name")
    finally:
        thread.stop()


async def test_a_paused_workspace_can_be_snapshotted_and_stays_paused(own) -> None:
    """Its commands go on after the resume; the fork has its files."""
    client, _instance = own
    ws = await client.create_workspace()
    await ws.write_file("/workspace/a.txt", "one\n")
    await ws.pause()
    await ws.snapshot("while-paused")
    assert (await ws.refresh()).state == "paused"
    fork = await client.create_workspace(from_snapshot="while-paused")
    assert (await fork.exec("cat /workspace/a.txt").wait()).stdout == "one\n"
    for each in (fork, ws):
        await each.delete()
    await client.delete_snapshot("while-paused")


async def test_a_fork_survives_its_snapshots_deletion(own, docker_client) -> None:
    """Deleting the snapshot leaves forks working; their image goes with the last of them."""
    client, instance = own
    ws = await client.create_workspace()
    await ws.write_file("/workspace/a.txt", "one\n")
    await ws.snapshot("gone-soon")
    fork = await client.create_workspace(from_snapshot="gone-soon")
    await client.delete_snapshot("gone-soon")
    assert (await fork.exec("cat /workspace/a.txt").wait()).stdout == "one\n"
    assert (await client.get_workspace(fork.workspace_id)).info.from_snapshot == "gone-soon"
    await fork.delete()
    await ws.delete()
    deadline = time.monotonic() + 10
    while snapshot_images(docker_client, instance):
        assert time.monotonic() < deadline, "the deleted snapshot's image stayed after its last fork"
        await asyncio.sleep(0.2)


async def test_snapshots_of_one_tenant_are_counted_one_at_a_time(tmp_path: Path, default_image: str) -> None:
    """Three concurrent snapshots of three names with a quota of one: one is taken, two refused."""
    thread = DaemonThread(make_settings(tmp_path, tenant_max_snapshots=1)).start()
    try:
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            ws = await client.create_workspace()
            outcomes = await asyncio.gather(*(ws.snapshot(f"q{n}") for n in range(3)), return_exceptions=True)
            taken = [o for o in outcomes if not isinstance(o, BaseException)]
            refused = [o for o in outcomes if isinstance(o, ResourceExhaustedError)]
            assert (len(taken), len(refused)) == (1, 2), outcomes
            assert [s.name for s in await client.list_snapshots()] == [taken[0].name]
            await client.delete_snapshot(taken[0].name)
            await ws.delete()
    finally:
        thread.stop()


async def test_a_capped_forks_workspace_has_the_files(own) -> None:
    """A fork whose /workspace is capped (a tmpfs the engine fills from no image) starts with its files."""
    client, _instance = own
    capped = await client.create_workspace(disk_bytes=16 * 1024**2)
    await capped.write_file("/workspace/keep.txt", "kept\n")
    await capped.snapshot("capped")
    plain = await client.create_workspace()
    await plain.write_file("/workspace/keep.txt", "plain\n")
    await plain.snapshot("plain")
    forks = [
        (await client.create_workspace(from_snapshot="capped"), "kept\n"),  # the cap is inherited
        (await client.create_workspace(from_snapshot="plain", disk_bytes=16 * 1024**2), "plain\n"),
    ]
    for fork, text in forks:
        assert fork.info.disk_bytes == 16 * 1024**2
        seen = await fork.exec(
            "cat /workspace/keep.txt; stat -c %U /workspace/keep.txt; df -k /workspace | tail -1"
        ).wait()
        assert seen.stdout.startswith(f"{text}sandbox\n") and "tmpfs" in seen.stdout, seen
        await fork.delete()
    for ws in (capped, plain):
        await ws.delete()
    for name in ("capped", "plain"):
        await client.delete_snapshot(name)


async def test_a_pause_or_resume_waits_for_a_snapshots_commit(own, docker_client) -> None:
    """The commit freezes the workspace for a moment: a Resume then is not a resume of the caller's
    pause (FAILED_PRECONDITION once the snapshot is done), and a Pause pauses it after."""
    client, _instance = own
    ws = await client.create_workspace()
    await ws.exec("head -c 300M /dev/zero > ~/big").wait(check=True)  # a commit that takes a while
    container = docker_client.containers.get(ws.info.container_id)
    taking = asyncio.create_task(ws.snapshot("slow"))
    deadline = time.monotonic() + 30
    while not container.attrs["State"]["Paused"]:
        assert time.monotonic() < deadline and not taking.done(), "the commit never froze the workspace"
        await asyncio.sleep(0.01)
        container.reload()
    with pytest.raises(FailedPreconditionError, match="is not paused"):
        await ws.resume()
    assert taking.done()  # the resume waited for the snapshot
    await taking
    assert (await ws.pause()).state == "paused"
    await ws.resume()
    await ws.delete()
    await client.delete_snapshot("slow")


async def test_a_sparse_file_cannot_make_a_snapshot_bigger_than_its_bound(own, docker_client) -> None:
    """A 16 MiB-capped workspace with a 3 GiB sparse file (8 KiB of it real): the snapshot is
    RESOURCE_EXHAUSTED, never a 3 GiB image, and nothing of it is left."""
    client, instance = own
    ws = await client.create_workspace(disk_bytes=16 * 1024**2)
    assert (await ws.exec("truncate -s 3G /workspace/sparse && echo made").wait()).stdout == "made\n"
    began = time.monotonic()
    with pytest.raises(ResourceExhaustedError, match="sparse file counts at its full length"):
        await ws.snapshot("sparse")
    assert time.monotonic() - began < 30  # stopped at the bound, not after 3 GiB
    assert await client.list_snapshots() == []
    part = {"label": [f"sandboxd.instance={instance}", "sandboxd.snapshot_part=true"]}
    assert not docker_client.api.containers(all=True, filters=part)
    await ws.delete()
    assert snapshot_images(docker_client, instance) == []


async def test_a_fork_whose_files_do_not_fit_its_cap_is_refused_cleanly(own, docker_client) -> None:
    """20 MiB of files forked into a 16 MiB cap: RESOURCE_EXHAUSTED naming the cap (no host path),
    and nothing of the fork is left."""
    client, instance = own
    ws = await client.create_workspace()
    await ws.exec("head -c 20M /dev/urandom > /workspace/big").wait(check=True)
    await ws.snapshot("too-big")
    before = {
        c["Id"] for c in docker_client.api.containers(all=True, filters={"label": f"sandboxd.instance={instance}"})
    }
    with pytest.raises(ResourceExhaustedError, match="does not fit the workspace's cap of 16777216 bytes") as refused:
        await client.create_workspace(from_snapshot="too-big", disk_bytes=16 * 1024**2)
    assert "/var/lib/docker" not in str(refused.value)
    after = {
        c["Id"] for c in docker_client.api.containers(all=True, filters={"label": f"sandboxd.instance={instance}"})
    }
    assert after == before
    await ws.delete()
    await client.delete_snapshot("too-big")


async def test_the_commit_freeze_counts_toward_no_command_timeout(own) -> None:  # type: ignore[no-untyped-def]
    """A snapshot's commit stands the container still for seconds (800 MiB of root filesystem
    here): its agent is told, so a command whose timeout would have passed during that freeze
    is not killed at the thaw; it has the rest of its time after it, as after a pause."""
    client, _instance = own
    ws = await client.create_workspace()
    try:
        made = await ws.exec("head -c 800M /dev/zero > /var/tmp/big && echo made", timeout_s=120).wait()
        assert made.stdout == "made\n", made
        process_id = await start_ready(ws, "echo ready; sleep 1; sleep 3; echo done", timeout_s=6)
        began = time.monotonic()
        await ws.snapshot("frozen")
        took = time.monotonic() - began
        ended = await client.input(process_id, "", yield_after_s=30).wait()
        assert (ended.exit_code, ended.stop_reason) == (0, "exited"), (ended, f"the snapshot took {took:.1f} s")
        assert "done" in ended.stdout
    finally:
        await ws.delete()
        await client.delete_snapshot("frozen")


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_rollback_returns_the_files_and_keeps_the_id(own, runtime: str, request: pytest.FixtureRequest) -> None:
    """RestoreWorkspace to a files-only snapshot: its files as they were, the same id, its commands ended."""
    skip_without(runtime, request)
    client, _instance = own
    workspace = await client.create_workspace(runtime=runtime, env={"MINE": "yes"})
    await workspace.exec("echo one > /workspace/a && echo root > /var/tmp/r").wait(check=True)
    await workspace.snapshot("point")
    await workspace.exec("echo two > /workspace/a && rm /var/tmp/r && touch /workspace/new").wait(check=True)
    running = (await workspace.exec("sleep 600", yield_after_s=0.1).wait()).process_id
    restored = await workspace.restore("point")
    assert (restored.workspace_id, restored.env, restored.runtime) == (workspace.workspace_id, {"MINE": "yes"}, runtime)
    seen = await workspace.exec("cat /workspace/a /var/tmp/r; ls /workspace").wait()
    assert seen.stdout == "one\nroot\na\n", seen
    assert running not in {p.process_id for p in await client.list_processes(workspace.workspace_id)}
    with pytest.raises(NotFoundError):
        await workspace.restore("no-such")
    other = await client.create_workspace(runtime=runtime)
    await other.restore("point")  # any workspace of the caller's can be returned to it
    assert (await other.exec("cat /workspace/a").wait()).stdout == "one\n"
    for each in (other, workspace):
        await each.delete()
    await client.delete_snapshot("point")


async def test_a_workspace_swapping_files_for_links_to_the_hosts_gets_nothing_of_the_host(own, tmp_path: Path) -> None:
    """/workspace is read on the host while it runs: links swapped in meanwhile are archived as links."""
    client, _instance = own
    secret = tmp_path / "host-secret"
    secret.write_text("HOST-ONLY-7f3a\n")
    secret_dir = tmp_path / "host-dir"
    secret_dir.mkdir()
    (secret_dir / "inside").write_text("HOST-ONLY-7f3a\n")
    workspace = await client.create_workspace()
    swapper = (
        "cd /workspace; mkdir -p d; echo ready; while :; do "
        f"echo mine > f.tmp; mv -f f.tmp f; ln -sfn {secret} l.tmp; mv -Tf l.tmp f; "
        f"mkdir -p d.tmp; echo mine > d.tmp/inside; rm -rf d; mv d.tmp d; ln -sfn {secret_dir} d.tmp; "
        "rm -rf d; mv -T d.tmp d; done"
    )
    await start_ready(workspace, swapper, ready="ready")
    for index in range(8):
        await workspace.snapshot(f"race-{index}")
        fork = await client.create_workspace(from_snapshot=f"race-{index}")
        seen = await fork.exec("cat /workspace/f /workspace/d/inside 2>/dev/null; grep -rs HOST-ONLY /workspace").wait()
        assert "HOST-ONLY" not in seen.stdout, (index, seen)
        await fork.delete()
        await client.delete_snapshot(f"race-{index}")
    await workspace.delete()


async def test_root_filesystem_changes_are_bounded_and_churn_or_depth_break_nothing(tmp_path: Path) -> None:
    """A sparse file in the root filesystem past SANDBOXD_MAX_SNAPSHOT_BYTES is RESOURCE_EXHAUSTED, fast, leaving
    nothing; files coming and going during a snapshot, and a tree deeper than the host-side walk goes, are kept."""
    thread = DaemonThread(make_settings(tmp_path, max_snapshot_bytes=64 * 1024**2)).start()
    try:
        async with SandboxClient(socket_path=thread.socket_path, retries=False) as client:
            ws = await client.create_workspace()
            await ws.exec("truncate -s 1G /home/sandbox/sparse").wait(check=True)
            began = time.monotonic()
            with pytest.raises(ResourceExhaustedError, match="root filesystem"):
                await ws.snapshot("sparse")
            assert time.monotonic() - began < 30
            assert await client.list_snapshots() == []
            assert (await ws.exec("rm /home/sandbox/sparse && echo up").wait()).stdout == "up\n"  # thawed
            churn = "cd /workspace; echo ready; while :; do for i in $(seq 50); do echo $i > t$i; done; rm -f t*; done"
            churning = await start_ready(ws, churn, ready="ready")
            await ws.exec("echo kept > /workspace/kept").wait(check=True)
            for index in range(4):
                await ws.snapshot(f"churn-{index}")
            # The deep tree goes another way (past the host-side walk's depth the engine commits):
            # it is checked on its own, the churn stopped.
            await client.kill(churning)
            deep = "/workspace/" + "/".join(["d"] * 300)
            await ws.exec(f"mkdir -p {deep} && echo bottom > {deep}/f").wait(check=True)
            await ws.snapshot("deep")
            for name, path, content in (("churn-3", "/workspace/kept", "kept\n"), ("deep", f"{deep}/f", "bottom\n")):
                fork = await client.create_workspace(from_snapshot=name)
                assert (await fork.exec(f"cat {path}").wait()).stdout == content
                await fork.delete()
            await ws.delete()
            for name in (*(f"churn-{index}" for index in range(4)), "deep"):
                await client.delete_snapshot(name)
    finally:
        thread.stop()
