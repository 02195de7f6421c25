"""Oversized requests cost the daemon nothing but their bytes; every field is bounded; listings page.

Against a real daemon in its own process, so that its memory, log and audit trail can be measured.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc
import pytest
from sandboxd_client import InvalidArgumentError, ResourceExhaustedError, SandboxClient
from sandboxd_client.limits import MAX_MESSAGE_BYTES, MAX_REQUEST_BYTES
from sandboxd_protocol.v1 import process_service_pb2 as ppb
from sandboxd_protocol.v1 import process_service_pb2_grpc as pgrpc
from sandboxd_protocol.v1 import workspace_service_pb2 as wpb
from sandboxd_protocol.v1 import workspace_service_pb2_grpc as wgrpc

from tests.conftest import new_instance, rss_bytes, spawned_daemon

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

MB = 1_000_000
MIB = 1024 * 1024


INSTANCE = new_instance()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, default_image: str):  # type: ignore[no-untyped-def]
    """A fresh daemon process with default settings; yields (process, socket, log path, audit path)."""
    tmp = tmp_path_factory.mktemp("bounds")
    with spawned_daemon(tmp, INSTANCE) as (process, socket_path, log_path):
        yield process, socket_path, log_path, tmp / "audit.jsonl"


async def _exec_codes(socket_path: str, request: ppb.ExecRequest, count: int) -> list[tuple[str, str]]:
    """Send ``count`` copies of ``request`` at once; their status codes and messages."""
    async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
        stub = pgrpc.ProcessServiceStub(channel)

        async def one() -> tuple[str, str]:
            try:
                async for _ in stub.Exec(request):
                    pass
            except grpc.aio.AioRpcError as error:
                return error.code().name, error.details() or ""
            return "OK", ""

        return await asyncio.gather(*(one() for _ in range(count)))


class TestOversizedMessages:
    async def test_sixteen_60_mb_execs_cost_no_memory(self, daemon) -> None:  # type: ignore[no-untyped-def]
        """16 concurrent 60 MB Execs are refused by the transport; the daemon's RSS stays within 100 MB."""
        process, socket_path, _log, _audit = daemon
        before = rss_bytes(process.pid)
        request = ppb.ExecRequest(workspace_id="ws-x", command="a" * (60 * MB))
        results = await _exec_codes(socket_path, request, 16)
        assert {code for code, _ in results} == {"RESOURCE_EXHAUSTED"}
        assert all(f"vs. {MAX_MESSAGE_BYTES}" in message for _, message in results), results[0]
        await asyncio.sleep(1)
        assert rss_bytes(process.pid) - before < 100 * MB

    async def test_exec_under_the_transport_cap_is_refused_unread(self, daemon) -> None:  # type: ignore[no-untyped-def]
        """An 8 MB Exec fits the transport but not Exec's own cap: refused before parsing, memory returned."""
        process, socket_path, _log, _audit = daemon
        before = rss_bytes(process.pid)
        request = ppb.ExecRequest(workspace_id="ws-x", command="a" * (8 * MB))
        results = await _exec_codes(socket_path, request, 16)
        size = request.ByteSize()
        assert set(results) == {
            ("RESOURCE_EXHAUSTED", f"the Exec request is {size} bytes; Exec takes at most {MAX_REQUEST_BYTES['Exec']}")
        }
        await asyncio.sleep(1)
        assert rss_bytes(process.pid) - before < 100 * MB

    async def test_refused_commands_are_not_written_whole_to_the_audit(self, daemon) -> None:  # type: ignore[no-untyped-def]
        """30 refused 10 MB commands add nothing much to the audit trail; a long one is cut with its size."""
        _process, socket_path, _log, audit = daemon
        before = audit.stat().st_size
        results = await _exec_codes(socket_path, ppb.ExecRequest(workspace_id="ws-x", command="b" * (10 * MB)), 30)
        assert {code for code, _ in results} == {"RESOURCE_EXHAUSTED"}
        # A command under Exec's message cap but over the command bound: audited, and cut.
        command = "c" * (300 * 1024)
        results = await _exec_codes(socket_path, ppb.ExecRequest(workspace_id="ws-x", command=command), 1)
        assert results == [
            (
                "INVALID_ARGUMENT",
                f"command is {len(command)} bytes; the limit is 122880; write long scripts to a file first",
            )
        ]
        assert audit.stat().st_size - before < 64 * 1024
        line = json.loads(audit.read_text().splitlines()[-1])
        assert (line["rpc"], line["code"], line["command_bytes"]) == ("Exec", "INVALID_ARGUMENT", len(command))
        assert line["command"] == "c" * 1024 + "…"

    async def test_a_huge_workspace_id_grows_neither_log_nor_message(self, daemon) -> None:  # type: ignore[no-untyped-def]
        """A 60 MB id is refused by the transport, a 50 KB one by its bound: the log grows by a few KB at most."""
        _process, socket_path, log_path, _audit = daemon
        before = log_path.stat().st_size
        async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
            stub = wgrpc.WorkspaceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.GetWorkspace(wpb.GetWorkspaceRequest(workspace_id="w" * (60 * MB)))
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.GetWorkspace(wpb.GetWorkspaceRequest(workspace_id="w" * 50_000))
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details() == (
                f"workspace_id {'w' * 64!r}"[:-1]
                + "…' (50000 characters) must be 1-40 lowercase letters, digits or dashes"
            )
        await asyncio.sleep(0.5)
        assert log_path.stat().st_size - before < 16 * 1024


def _refused_writes(socket_path: str, token: str) -> set[str]:
    """16 threads, each sending six 16 MiB WriteFiles to a workspace that does not exist; their codes."""
    import threading

    from sandboxd_protocol.v1 import file_service_pb2 as fpb
    from sandboxd_protocol.v1 import file_service_pb2_grpc as fgrpc

    codes: set[str] = set()
    request = fpb.WriteFileRequest(workspace_id="ws-none", path="x", content=b"x" * (16 * MIB))

    def worker() -> None:
        with grpc.insecure_channel(f"unix:{socket_path}") as channel:
            stub = fgrpc.FileServiceStub(channel)
            for _ in range(6):
                try:
                    stub.WriteFile(request, metadata=[("authorization", f"Bearer {token}")])
                except grpc.RpcError as error:
                    codes.add(error.code().name)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return codes


async def test_refused_large_requests_give_their_memory_back(tmp_path: Path, default_image: str) -> None:
    """96 refused 16 MiB WriteFiles, 16 at once: without a valid token they are never parsed; with one they
    are refused by the missing workspace. Either way the daemon's memory comes back (was 2.2 GB and stayed)."""
    from sandboxd.tenancy import create_token

    tokens = tmp_path / "tokens.json"
    token = create_token(tokens, "team-a")
    with spawned_daemon(tmp_path, SANDBOXD_TOKENS_FILE=str(tokens)) as (process, socket_path, _log):
        for presented, code, peak_limit in (("sbd_wrong", "UNAUTHENTICATED", 600 * MB), (token, "NOT_FOUND", None)):
            before, peak = rss_bytes(process.pid), 0
            sending = asyncio.create_task(asyncio.to_thread(_refused_writes, socket_path, presented))
            while not sending.done():
                peak = max(peak, rss_bytes(process.pid))
                await asyncio.sleep(0.05)
            assert await sending == {code}
            if peak_limit is not None:
                assert peak - before < peak_limit, f"unparsed requests took {(peak - before) // MB} MB"
            deadline = time.monotonic() + 10  # the trimmer looks once a second
            while rss_bytes(process.pid) - before >= 200 * MB and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            assert rss_bytes(process.pid) - before < 200 * MB, f"{(rss_bytes(process.pid) - before) // MB} MB kept"


class TestFieldBounds:
    async def test_workspace_env_and_labels_are_bounded(self, daemon) -> None:  # type: ignore[no-untyped-def]
        """Env and labels stored with a workspace have bounds, checked before anything is created."""
        _process, socket_path, _log, _audit = daemon
        async with SandboxClient(socket_path=socket_path, retries=False) as client:
            with pytest.raises(
                InvalidArgumentError, match=r"^env is 102407 bytes \(names and values\); the limit is 32768$"
            ):
                await client.create_workspace(env={"BIG": "x" * 102_400, "A": "1"})
            with pytest.raises(ResourceExhaustedError, match=r"CreateWorkspace takes at most 262144$"):
                await client.create_workspace(env={"BIG": "x" * MB})
            with pytest.raises(ResourceExhaustedError, match="Received message larger than max"):
                await client.create_workspace(env={"BIG": "x" * (20 * MB)})
            with pytest.raises(InvalidArgumentError, match=r"^labels has 65 entries; the limit is 64$"):
                await client.create_workspace(labels={f"k{i}": "v" for i in range(65)})
            with pytest.raises(InvalidArgumentError, match=r"^labels value of 'k' is 2000 bytes; the limit is 1024$"):
                await client.create_workspace(labels={"k": "v" * 2000})
            with pytest.raises(InvalidArgumentError, match=r"^label_selector has 65 entries"):
                await client.list_workspaces({f"k{i}": "v" for i in range(65)})
            assert await client.list_workspaces() == []

    async def test_exec_fields_are_bounded(self, daemon) -> None:  # type: ignore[no-untyped-def]
        """Exec env and workdir have bounds, checked before the workspace is even looked up."""
        _process, socket_path, _log, _audit = daemon
        async with SandboxClient(socket_path=socket_path, retries=False) as client:
            with pytest.raises(InvalidArgumentError, match=r"^env is 204804 bytes .* the limit is 131072$"):
                await client.exec("ws-unknown", "true", env={"A": "x" * 102_400, "B": "y" * 102_400}).wait()
            with pytest.raises(InvalidArgumentError, match=r"^workdir is 5000 bytes; the limit is 4096$"):
                await client.exec("ws-unknown", "true", workdir="d" * 5000).wait()
            with pytest.raises(InvalidArgumentError, match=r"^process_id is 100 bytes; process ids are at most 64$"):
                await client.input("p" * 100, "x").wait()

    async def test_file_fields_are_bounded(self, daemon) -> None:  # type: ignore[no-untyped-def]
        """Paths, edit strings and write contents have bounds; big writes are refused before sending."""
        _process, socket_path, _log, _audit = daemon
        async with SandboxClient(socket_path=socket_path, retries=False) as client:
            ws = await client.create_workspace(labels={"test": "bounds"})
            try:
                with pytest.raises(InvalidArgumentError, match=r"^path is 5000 bytes; the limit is 4096"):
                    await ws.read_file("p" * 5000)
                with pytest.raises(InvalidArgumentError, match=r"^old_string is 4194305 bytes; the limit is 4194304$"):
                    await ws.edit_file("f.txt", "o" * (4 * MIB + 1), "n")
                with pytest.raises(InvalidArgumentError, match=r"WriteFile takes at most 16777216 .*Upload"):
                    await ws.write_file("big.bin", b"z" * (16 * MIB + 1))
                written = await ws.write_file("ok.bin", b"z" * (16 * MIB))
                assert written.size_bytes == 16 * MIB
            finally:
                await ws.delete()

    async def test_upload_of_big_pieces_is_split(self, daemon, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
        """An archive handed over in 12 MiB pieces still uploads (the client sends 1 MiB messages)."""
        from tests.integration.helpers import one_file_tar

        _process, socket_path, _log, _audit = daemon
        archive = one_file_tar("big.bin", b"q" * (12 * MIB))

        async def pieces():  # type: ignore[no-untyped-def]
            yield archive

        async with SandboxClient(socket_path=socket_path, retries=False) as client:
            ws = await client.create_workspace(labels={"test": "bounds"})
            try:
                assert await client.upload(ws.workspace_id, "/workspace", pieces()) == 1
                assert (await ws.exec("wc -c < big.bin").wait()).stdout == f"{12 * MIB}\n"
            finally:
                await ws.delete()


class TestMessages:
    async def test_messages_repeat_caller_values_only_briefly(self, daemon) -> None:  # type: ignore[no-untyped-def]
        """Long values are quoted as 64 characters and a length; no message passes 2000; the cause stays."""
        from sandboxd_client import NotFoundError

        _process, socket_path, _log, _audit = daemon
        async with SandboxClient(socket_path=socket_path, retries=False) as client:
            with pytest.raises(InvalidArgumentError) as caught:
                await client.exec("ws-unknown", "true", env={"A" * 100_000: "\0"}).wait()
            assert (
                caught.value.message
                == "env value of " + repr("A" * 64)[:-1] + "…' (100000 characters) contains a NUL character"
            )
            with pytest.raises(InvalidArgumentError, match=r"^image's repository name is 273 characters as Docker"):
                await client.create_workspace(image="a" * 255)  # Docker counts it as docker.io/library/a…
            with pytest.raises(
                InvalidArgumentError, match=r"^image's repository name is 256 characters .* at most 255$"
            ):
                await client.create_workspace(image="example.com/" + "a" * 244)
            ws = await client.create_workspace(labels={"test": "bounds"})
            try:
                deep = "/tmp/" + "/".join(["d" * 200] * 19)
                with pytest.raises(NotFoundError) as missing:
                    await ws.read_file(deep)
                assert len(missing.value.message) < 300
                assert missing.value.message.endswith("No such file or directory"), missing.value.message
                with pytest.raises(InvalidArgumentError) as caught:
                    await ws.exec("true", workdir="w" * 4000).wait()
                assert len(caught.value.message) < 300, caught.value.message
                assert "(4000 characters)" in caught.value.message
            finally:
                await ws.delete()


class TestListingPages:
    async def test_pages_by_count_and_token(self, daemon) -> None:  # type: ignore[no-untyped-def]
        """page_size 2 over 3 workspaces: two pages, oldest first; a bad token or size is refused."""
        _process, socket_path, _log, _audit = daemon
        async with SandboxClient(socket_path=socket_path, retries=False) as client:
            made = [await client.create_workspace(labels={"test": "pages"}) for _ in range(3)]
            try:
                ids = [w.workspace_id for w in made]
                async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
                    stub = wgrpc.WorkspaceServiceStub(channel)
                    first = await stub.ListWorkspaces(
                        wpb.ListWorkspacesRequest(label_selector={"test": "pages"}, page_size=2)
                    )
                    assert [w.workspace_id for w in first.workspaces] == ids[:2]
                    assert first.next_page_token
                    second = await stub.ListWorkspaces(
                        wpb.ListWorkspacesRequest(
                            label_selector={"test": "pages"}, page_size=2, page_token=first.next_page_token
                        )
                    )
                    assert ([w.workspace_id for w in second.workspaces], second.next_page_token) == (ids[2:], "")
                    for bad in (
                        wpb.ListWorkspacesRequest(page_token="garbage"),
                        wpb.ListWorkspacesRequest(page_size=5000),
                    ):
                        with pytest.raises(grpc.aio.AioRpcError) as caught:
                            await stub.ListWorkspaces(bad)
                        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                listed = await client.list_workspaces({"test": "pages"}, page_size=1)
                assert [w.workspace_id for w in listed] == ids
            finally:
                for workspace in made:
                    await workspace.delete()

    async def test_workspaces_with_huge_specs_still_list(self, daemon, docker_client, default_image: str) -> None:  # type: ignore[no-untyped-def]
        """Workspaces with 3 MiB specs (an older release allowed them) list a page each: never over a message."""
        from sandboxd.models import ResourceLimits, Runtime, WorkspaceSpec
        from sandboxd.workspaces import spec_to_json

        _process, socket_path, _log, _audit = daemon
        spec = WorkspaceSpec(
            image=default_image,
            env={"BIG": "e" * (3 * MIB)},
            working_dir="/workspace",
            limits=ResourceLimits(memory_bytes=2**30, cpu_millis=1000, pids=512),
            runtime=Runtime.RUNC,
            labels={"test": "legacy"},
        )
        made = [
            docker_client.containers.create(
                default_image,
                ["true"],
                labels={
                    "sandboxd.managed": "true",
                    "sandboxd.instance": INSTANCE,
                    "sandboxd.workspace_id": f"ws-legacy-{n}",
                    "sandboxd.tenant": "default",
                    "sandboxd.spec": spec_to_json(spec),
                    "test": "legacy",
                },
            )
            for n in range(3)
        ]
        try:
            async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
                stub = wgrpc.WorkspaceServiceStub(channel)
                page = await stub.ListWorkspaces(wpb.ListWorkspacesRequest(label_selector={"test": "legacy"}))
                assert [w.workspace_id for w in page.workspaces] == ["ws-legacy-0"]  # 4 MiB of specs per page
                assert page.ByteSize() < 8 * MIB
            async with SandboxClient(socket_path=socket_path, retries=False) as client:
                listed = await client.list_workspaces({"test": "legacy"})
            assert [w.workspace_id for w in listed] == [f"ws-legacy-{n}" for n in range(3)]
        finally:
            for container in made:
                container.remove(force=True)
