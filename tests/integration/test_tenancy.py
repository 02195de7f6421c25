"""Bearer tokens, tenant isolation, quotas, TLS on TCP, and the audit trail, against a real daemon."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sandboxd_client import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotFoundError,
    Output,
    ResourceExhaustedError,
    SandboxClient,
    Started,
    TLSOptions,
    UnauthenticatedError,
    UnavailableError,
)

from sandboxd.errors import InvalidSpecError
from sandboxd.tenancy import create_token
from tests.conftest import DaemonThread, make_settings
from tests.integration.helpers import certificates, collect, start_ready, start_yielded

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory, default_image: str):  # type: ignore[no-untyped-def]
    """A daemon that requires tokens, with tenants ``team-a`` and ``team-b`` and small quotas."""
    tmp = tmp_path_factory.mktemp("tenancy")
    tokens = tmp / "tokens.json"
    token_a, token_b = create_token(tokens, "team-a"), create_token(tokens, "team-b")
    settings = make_settings(
        tmp,
        tokens_file=str(tokens),
        tenant_max_workspaces=2,
        tenant_max_memory_bytes=3 * 1024**3,
    )
    thread = DaemonThread(settings).start()
    yield thread, token_a, token_b, Path(settings.audit_log)
    thread.stop()


def _client(thread: DaemonThread, token: str | None) -> SandboxClient:
    return SandboxClient(socket_path=thread.socket_path, retries=False, token=token or "")


def _audit(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class TestTokens:
    async def test_no_token_and_bad_token_are_unauthenticated(self, tenants) -> None:  # type: ignore[no-untyped-def]
        thread, _a, _b, _audit_path = tenants
        for token in (None, "sbd_not-a-real-token"):
            async with _client(thread, token) as client:
                with pytest.raises(UnauthenticatedError, match="bearer token"):
                    await client.list_workspaces()
                with pytest.raises(UnauthenticatedError):
                    await client.create_workspace()

    async def test_health_needs_no_token(self, tenants) -> None:  # type: ignore[no-untyped-def]
        async with _client(tenants[0], None) as client:
            assert await client.health() == "SERVING"

    def test_token_is_stored_hashed_and_never_logged(self, tenants, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
        """`sandboxd token create` prints the token once; the file holds only its sha256."""
        tokens = tmp_path / "tokens.json"
        result = subprocess.run(
            [sys.executable, "-m", "sandboxd", "token", "create", "--tenant", "team-c", "--tokens-file", str(tokens)],
            capture_output=True,
            text=True,
            check=True,
        )
        token = result.stdout.strip()
        assert token.startswith("sbd_") and len(token) > 40
        stored = json.loads(tokens.read_text())["tokens"]
        assert [entry["tenant"] for entry in stored] == ["team-c"]
        assert token not in tokens.read_text()
        assert tokens.stat().st_mode & 0o777 == 0o600
        import hashlib

        assert stored[0]["sha256"] == hashlib.sha256(token.encode()).hexdigest()
        # Neither this token nor the fixture's appear in the daemon log.
        log = Path(os.environ["SANDBOXD_TEST_LOG"]).read_text()
        for secret in (token, tenants[1], tenants[2]):
            assert secret not in log

    def test_bad_tenant_name_is_refused(self, tmp_path: Path) -> None:
        result = subprocess.run(
            [sys.executable, "-m", "sandboxd", "token", "create", "--tenant", "Team A", "--tokens-file", str(tmp_path)],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 1
        assert "lowercase letters" in result.stderr


class TestIsolation:
    async def test_other_tenant_sees_nothing_and_gets_not_found(self, tenants) -> None:  # type: ignore[no-untyped-def]
        thread, token_a, token_b, _audit_path = tenants
        async with _client(thread, token_a) as a, _client(thread, token_b) as b:
            ws = await a.create_workspace(labels={"test": "isolation"})
            try:
                await ws.write_file("/workspace/secret.txt", "team a only\n")
                process_id = await start_yielded(ws, "sleep 60")
                assert [w.workspace_id for w in await a.list_workspaces()] == [ws.workspace_id]
                assert await b.list_workspaces() == []
                assert await b.list_workspaces({"test": "isolation"}) == []
                wid = ws.workspace_id
                expected = f"workspace '{wid}' not found"
                for attempt in (
                    lambda: b.get_workspace(wid),
                    lambda: b.exec(wid, "true").wait(),
                    lambda: b.read_file(wid, "/workspace/secret.txt"),
                    lambda: b.write_file(wid, "/workspace/secret.txt", "overwritten"),
                    lambda: b.list_processes(wid),
                    lambda: b.delete_workspace(wid),
                ):
                    with pytest.raises(NotFoundError) as caught:
                        await attempt()
                    assert caught.value.message == expected
                # A process id is no handle across tenants either.
                for attempt in (
                    lambda: b.input(process_id, "").wait(),
                    lambda: b.kill(process_id),
                    lambda: b.signal(process_id, "SIGTERM"),
                ):
                    with pytest.raises(NotFoundError, match=f"process '{process_id}' not found"):
                        await attempt()
                # A's workspace, file and process are untouched.
                assert "team a only" in (await ws.read_file("/workspace/secret.txt")).content
                assert [p.running for p in await a.list_processes(wid)] == [True]
                await a.kill(process_id)
            finally:
                await ws.delete()

    async def test_workspace_quota(self, tenants) -> None:  # type: ignore[no-untyped-def]
        """Two workspaces per tenant: the third is RESOURCE_EXHAUSTED, and the other tenant is unaffected."""
        thread, token_a, token_b, _audit_path = tenants
        async with _client(thread, token_a) as a, _client(thread, token_b) as b:
            made = [await a.create_workspace(), await a.create_workspace()]
            try:
                with pytest.raises(ResourceExhaustedError, match="tenant 'team-a' already has 2 workspaces"):
                    await a.create_workspace()
                other = await b.create_workspace()
                await other.delete()
            finally:
                for ws in made:
                    await ws.delete()

    async def test_concurrent_creates_cannot_pass_the_quota_together(self, tenants) -> None:  # type: ignore[no-untyped-def]
        """Six creates at once against a limit of two: exactly two workspaces, four RESOURCE_EXHAUSTED."""
        thread, token_a, _b, _audit_path = tenants
        async with _client(thread, token_a) as a:
            results = await asyncio.gather(*(a.create_workspace() for _ in range(6)), return_exceptions=True)
            made = [r for r in results if not isinstance(r, BaseException)]
            try:
                refused = [r for r in results if isinstance(r, ResourceExhaustedError)]
                assert (len(made), len(refused)) == (2, 4), results
                assert len(await a.list_workspaces()) == 2
            finally:
                for ws in made:
                    await ws.delete()

    async def test_concurrent_creates_of_one_id_leave_the_winner_intact(self, tenants) -> None:  # type: ignore[no-untyped-def]
        """A and B race for one id (with quotas, so both creates await first): one wins, whole.

        The winner's container and volume agree on its tenant, the loser cannot delete it,
        and the winner's workspace works.
        """
        thread, token_a, token_b, _audit_path = tenants
        async with _client(thread, token_a) as a, _client(thread, token_b) as b:
            for round_ in range(6):
                wid = f"race-{round_}"
                results = await asyncio.gather(
                    a.create_workspace(workspace_id=wid), b.create_workspace(workspace_id=wid), return_exceptions=True
                )
                made = [r for r in results if not isinstance(r, BaseException)]
                assert len(made) == 1, results
                assert [type(r) for r in results if isinstance(r, BaseException)] == [AlreadyExistsError]
                winner, loser = (a, b) if made[0].client is a else (b, a)
                name = f"sandboxd-{thread.settings.instance}-{wid}"
                tenants_seen = {
                    subprocess.run(
                        ["docker", kind, "inspect", "--format", template, name],
                        capture_output=True,
                        text=True,
                        check=True,
                    ).stdout.strip()
                    for kind, template in (
                        ("container", '{{index .Config.Labels "sandboxd.tenant"}}'),
                        ("volume", '{{index .Labels "sandboxd.tenant"}}'),
                    )
                }
                assert tenants_seen == {"team-a" if winner is a else "team-b"}
                with pytest.raises(NotFoundError):
                    await loser.delete_workspace(wid)
                assert (await made[0].exec("echo alive").wait()).stdout == "alive\n"
                await winner.delete_workspace(wid)

    async def test_concurrent_deletes_one_removes_the_rest_find_nothing(self, tenants) -> None:  # type: ignore[no-untyped-def]
        thread, token_a, _b, _audit_path = tenants
        async with _client(thread, token_a) as a:
            ws = await a.create_workspace()
            results = await asyncio.gather(
                *(a.delete_workspace(ws.workspace_id) for _ in range(5)), return_exceptions=True
            )
            assert sorted(type(r).__name__ for r in results) == ["NoneType"] + ["NotFoundError"] * 4, results

    async def test_another_tenants_calls_do_not_keep_a_workspace_alive(
        self, tmp_path: Path, default_image: str
    ) -> None:
        """B polling A's id (every answer NOT_FOUND) does not restart A's idle TTL."""
        tokens = tmp_path / "tokens.json"
        token_a, token_b = create_token(tokens, "team-a"), create_token(tokens, "team-b")
        thread = DaemonThread(make_settings(tmp_path, tokens_file=str(tokens))).start()
        try:
            async with _client(thread, token_a) as a, _client(thread, token_b) as b:
                ws = await a.create_workspace(idle_ttl_s=2)
                created = time.monotonic()
                while ws.workspace_id in {w.workspace_id for w in await a.list_workspaces()}:
                    assert time.monotonic() - created < 8, "B's calls kept A's workspace alive"
                    for attempt in (
                        lambda: b.stat(ws.workspace_id, "/workspace"),
                        lambda: b.get_workspace(ws.workspace_id),
                    ):
                        with pytest.raises(NotFoundError):
                            await attempt()
                    await asyncio.sleep(0.3)
        finally:
            thread.stop()

    async def test_workspace_removed_behind_the_daemon_and_its_id_reused(self, tenants) -> None:  # type: ignore[no-untyped-def]
        """A's container is removed outside sandboxd; B then creates the same id.

        A must not reach B's new workspace through anything it held, and B must not
        inherit A's files from the volume the removal left behind.
        """
        thread, token_a, token_b, _audit_path = tenants
        name = f"sandboxd-{thread.settings.instance}-reused-1"
        async with _client(thread, token_a) as a, _client(thread, token_b) as b:
            ws_a = await a.create_workspace(workspace_id="reused-1")
            await ws_a.write_file("/workspace/a.txt", "team a's file\n")
            assert (await ws_a.exec("true").wait()).exit_code == 0  # the daemon now knows the workspace
            subprocess.run(["docker", "rm", "-f", name], check=True, capture_output=True)
            ws_b = await b.create_workspace(workspace_id="reused-1")
            try:
                listing = await ws_b.exec("ls -A /workspace").wait()
                assert listing.stdout == ""
                expected = "workspace 'reused-1' not found"
                for attempt in (
                    lambda: a.exec("reused-1", "touch /workspace/from-a").wait(),
                    lambda: a.read_file("reused-1", "/workspace/a.txt"),
                    lambda: a.write_file("reused-1", "/workspace/from-a", "x"),
                    lambda: a.delete_workspace("reused-1"),
                ):
                    with pytest.raises(NotFoundError) as caught:
                        await attempt()
                    assert caught.value.message == expected
                assert (await ws_b.exec("ls -A /workspace").wait()).stdout == ""
            finally:
                await ws_b.delete()

    async def test_a_tenant_cap_spans_its_workspaces_and_never_touches_another_tenant(
        self, tmp_path: Path, default_image: str
    ) -> None:
        """Tenant cap 3: A's new command evicts A's own exited session in A's other workspace, then its
        least recently used idle one, and is refused when all are streaming; B runs throughout."""
        tokens = tmp_path / "tokens.json"
        token_a, token_b = create_token(tokens, "team-a"), create_token(tokens, "team-b")
        thread = DaemonThread(make_settings(tmp_path, tokens_file=str(tokens), tenant_max_sessions=3)).start()
        try:
            async with _client(thread, token_a) as a, _client(thread, token_b) as b:
                ws_a1, ws_a2, ws_b = (
                    await a.create_workspace(),
                    await a.create_workspace(),
                    await b.create_workspace(),
                )
                b_running = [await start_yielded(ws_b, "sleep 300") for _ in range(2)]
                a_running = [await start_yielded(ws_a1, "sleep 300") for _ in range(2)]
                a_exited = (await ws_a2.exec("true").wait()).process_id
                # A is at 3: its exited session in the other workspace goes first.
                a_third = await start_yielded(ws_a2, "sleep 300")
                with pytest.raises(NotFoundError, match="was evicted: it had exited and its tenant's sessions"):
                    await a.input(a_exited, "").wait()
                # Then A's least recently used idle one.
                await a.input(a_running[0], "", yield_after_s=0.25).wait()
                await start_yielded(ws_a1, "sleep 300")
                with pytest.raises(NotFoundError, match="was evicted: it was the least recently used idle session"):
                    await a.input(a_running[1], "").wait()
                # All three of A's streaming: refused, naming the tenant's cap.
                streams = [ws_a2.exec("sleep 300", yield_after_s=600).__aiter__() for _ in range(3)]
                for stream in streams:
                    assert isinstance(await stream.__anext__(), Started)
                with pytest.raises(ResourceExhaustedError, match="tenant 'team-a' is at its 3 process sessions"):
                    await ws_a1.exec("true").wait()
                for stream in streams:
                    await stream.aclose()  # type: ignore[attr-defined]
                # B's two (B has the same cap of its own) were never touched, and B has room for a third.
                for process_id in b_running:
                    assert (await b.input(process_id, "", yield_after_s=0.25).wait()).running
                assert (await ws_b.exec("echo ok").wait()).stdout == "ok\n"
                assert a_third not in {p.process_id for p in await a.list_processes(ws_a2.workspace_id)}
                for ws in (ws_a1, ws_a2, ws_b):
                    await ws.delete()
        finally:
            thread.stop()

    async def test_a_secret_kept_to_one_tenant(self, tmp_path: Path, default_image: str) -> None:
        tokens = tmp_path / "tokens.json"
        token_a, token_b = create_token(tokens, "team-a"), create_token(tokens, "team-b")
        secrets_file = tmp_path / "secrets.json"
        secrets_file.write_text(json.dumps({"db": {"value": "team-a-db-pw", "tenants": ["team-a"]}}))
        thread = DaemonThread(make_settings(tmp_path, tokens_file=str(tokens), secrets_file=str(secrets_file)))
        thread.start()
        try:
            async with _client(thread, token_a) as a, _client(thread, token_b) as b:
                with pytest.raises(InvalidArgumentError, match="env PW: unknown secret 'db'"):
                    await b.create_workspace(env={"PW": "secret:db"})
                ws_b = await b.create_workspace()
                try:
                    with pytest.raises(InvalidArgumentError, match="env PW: unknown secret 'db'"):
                        await ws_b.exec("true", env={"PW": "secret:db"}).wait()
                    # Nothing in B's output depends on A's secret: no mask, and no held-back prefix
                    # (either would let B learn the value a character at a time).
                    assert (await ws_b.exec("echo team-a-db-pw").wait()).stdout == "team-a-db-pw\n"
                    events, _out, _err = await collect(ws_b.exec("printf team-a-db; sleep 0.5; printf '!'"))
                    chunks = [e.text for e in events if isinstance(e, Output)]
                    assert chunks == ["team-a-db", "!"]
                finally:
                    await ws_b.delete()
                ws_a = await a.create_workspace(env={"PW": "secret:db"})
                try:
                    proof = await ws_a.exec('[ "$PW" = team-a-db-pw ] && echo same; echo "$PW"').wait()
                    assert proof.stdout == "same\n[REDACTED:db]\n"
                finally:
                    await ws_a.delete()
        finally:
            thread.stop()

    async def test_memory_quota(self, tenants) -> None:  # type: ignore[no-untyped-def]
        thread, token_a, _b, _audit_path = tenants
        async with _client(thread, token_a) as a:
            ws = await a.create_workspace(memory_bytes=2 * 1024**3)
            try:
                with pytest.raises(ResourceExhaustedError, match=r"would use 4294967296 bytes .* over its 3221225472"):
                    await a.create_workspace(memory_bytes=2 * 1024**3)
            finally:
                await ws.delete()


class TestSessionCaps:
    """The session cap is each workspace's: no tenant can take another's sessions."""

    @pytest.fixture
    def two_tenants(self, tmp_path: Path, default_image: str):  # type: ignore[no-untyped-def]
        """A daemon with default session settings and tenants ``team-a`` and ``team-b``."""
        tokens = tmp_path / "tokens.json"
        token_a, token_b = create_token(tokens, "team-a"), create_token(tokens, "team-b")
        thread = DaemonThread(make_settings(tmp_path, tokens_file=str(tokens))).start()
        settings = thread.settings
        assert (settings.workspace_max_sessions, settings.tenant_max_sessions) == (64, 0)  # the defaults
        yield thread, token_a, token_b
        thread.stop()

    async def test_finished_commands_never_lock_out_another_tenant(self, two_tenants) -> None:  # type: ignore[no-untyped-def]
        """A's 70 finished commands leave B room every time; A's running command is never ended by them."""
        thread, token_a, token_b = two_tenants
        async with _client(thread, token_a) as a, _client(thread, token_b) as b:
            ws_a, ws_b = await a.create_workspace(), await b.create_workspace()
            try:
                a_running = await start_yielded(ws_a, "sleep 300")
                for _ in range(70):
                    assert (await ws_a.exec("true").wait()).exit_code == 0
                for _ in range(3):
                    assert (await ws_b.exec("echo ok").wait()).stdout == "ok\n"
                assert (await a.input(a_running, "", yield_after_s=0.25).wait()).running
                # A's workspace keeps its 64: its oldest finished sessions went, the newest stay.
                assert len(await a.list_processes(ws_a.workspace_id)) == 64
                assert len(await b.list_processes(ws_b.workspace_id)) == 3
            finally:
                await ws_a.delete()
                await ws_b.delete()

    async def test_a_workspace_full_of_streams_refuses_only_its_own_next_command(
        self, tmp_path: Path, default_image: str
    ) -> None:
        """Cap 4 a workspace: A's 4 streaming Execs make A's 5th refused; A's other workspace and B run."""
        tokens = tmp_path / "tokens.json"
        token_a, token_b = create_token(tokens, "team-a"), create_token(tokens, "team-b")
        thread = DaemonThread(make_settings(tmp_path, tokens_file=str(tokens), workspace_max_sessions=4)).start()
        try:
            async with _client(thread, token_a) as a, _client(thread, token_b) as b:
                ws_a, ws_a2, ws_b = await a.create_workspace(), await a.create_workspace(), await b.create_workspace()
                try:
                    streams = [ws_a.exec("sleep 300", yield_after_s=600).__aiter__() for _ in range(4)]
                    for stream in streams:  # each call is started and attached: none can be evicted
                        assert isinstance(await stream.__anext__(), Started)
                    with pytest.raises(
                        ResourceExhaustedError,
                        match=rf"workspace '{ws_a.workspace_id}' is at its 4 process sessions and none can be "
                        "evicted: all 4 are in use by active calls",
                    ):
                        await ws_a.exec("true").wait()
                    assert (await ws_a2.exec("echo ok").wait()).stdout == "ok\n"
                    assert (await ws_b.exec("echo ok").wait()).stdout == "ok\n"
                    running = [p for p in await a.list_processes(ws_a.workspace_id) if p.running]
                    assert len(running) == 4
                    for stream in streams:
                        await stream.aclose()  # type: ignore[attr-defined]
                finally:
                    for ws in (ws_a, ws_a2, ws_b):
                        await ws.delete()
        finally:
            thread.stop()


class TestAudit:
    async def test_another_tenants_forward_is_not_found_and_forwards_are_audited(self, tenants) -> None:  # type: ignore[no-untyped-def]
        """A forward is authorised like any call; its record names the workspace, port and bytes."""
        thread, token_a, token_b, audit_path = tenants
        async with _client(thread, token_a) as a, _client(thread, token_b) as b:
            ws = await a.create_workspace(labels={"test": "forward"})
            try:
                server = (
                    'exec python3 -u -c \'import socket; s = socket.socket(); s.bind(("127.0.0.1", 8003)); '
                    's.listen(4); print("ready", flush=True)\n'
                    'while True: c, _ = s.accept(); c.sendall(b"hi"); c.close()\''
                )
                await start_ready(ws, server)
                errors: list[Exception] = []
                async with b.forward(ws.workspace_id, 8003, on_error=errors.append) as address:
                    host, port = address.rsplit(":", 1)
                    reader, writer = await asyncio.open_connection(host, int(port))
                    assert await reader.read() == b""
                    writer.close()
                assert [type(e) for e in errors] == [NotFoundError]
                assert errors[0].message == f"workspace '{ws.workspace_id}' not found"  # type: ignore[attr-defined]
                forward = a.forward(ws.workspace_id, 8003)
                async with forward as address:
                    host, port = address.rsplit(":", 1)
                    reader, writer = await asyncio.open_connection(host, int(port))
                    assert await reader.read() == b"hi"
                    writer.close()
                    deadline = time.monotonic() + 20
                    while forward.active:  # both sides done: the call ends OK (a close would cancel it)
                        assert time.monotonic() < deadline
                        await asyncio.sleep(0.01)
            finally:
                await ws.delete()
        records = [e for e in _audit(audit_path) if e.get("rpc") == "ForwardPort" and "phase" not in e]
        refused, served = records[-2:]
        assert (refused["tenant"], refused["code"], refused["workspace_id"], refused["port"]) == (
            "team-b",
            "NOT_FOUND",
            ws.workspace_id,
            8003,
        )
        assert (served["tenant"], served["code"], served["port"], served["bytes_from_workspace"]) == (
            "team-a",
            "OK",
            8003,
            2,
        )

    async def test_state_changing_calls_are_audited(self, tenants) -> None:  # type: ignore[no-untyped-def]
        thread, token_a, _b, audit_path = tenants
        async with _client(thread, token_a) as a:
            ws = await a.create_workspace(labels={"test": "audit"})
            await ws.exec("exit 3").wait()
            await ws.write_file("/workspace/a.txt", "x")
            await a.list_workspaces()  # reads are not audited
            await ws.delete()
        async with _client(thread, None) as anonymous:
            with pytest.raises(UnauthenticatedError):
                await anonymous.delete_workspace(ws.workspace_id)
        entries = _audit(audit_path)
        about = [e for e in entries if e.get("workspace_id") == ws.workspace_id]
        # Written ahead, so a crash of the daemon mid-call still leaves the command on record, and
        # the id of a workspace being created (the client makes it before it sends).
        begins = [e for e in about if e.get("phase") == "begin"]
        assert [(e["rpc"], e.get("command"), e["tenant"]) for e in begins] == [
            ("CreateWorkspace", None, "team-a"),
            ("Exec", "exit 3", "team-a"),
        ]
        assert about.index(begins[1]) < next(i for i, e in enumerate(about) if e["rpc"] == "Exec" and "code" in e)
        mine = [e for e in about if "phase" not in e]
        assert begins[1]["process_id"] == next(e["process_id"] for e in mine if e["rpc"] == "Exec")
        assert [e["rpc"] for e in mine] == [
            "CreateWorkspace",
            "Exec",
            "WriteFile",
            "DeleteWorkspace",
            "DeleteWorkspace",
        ]
        create, execute, write, delete, refused = mine
        assert all(e["tenant"] == "team-a" for e in (create, execute, write, delete))
        assert all(e["code"] == "OK" for e in (create, execute, write, delete))
        assert execute["command"] == "exit 3"
        assert execute["exit_code"] == 3
        assert execute["stop_reason"] == "exited"
        assert str(execute["process_id"]).startswith("p-")
        assert write["path"] == "/workspace/a.txt" and write["input_bytes"] == 1
        assert refused["code"] == "UNAUTHENTICATED" and refused["tenant"] is None
        for entry in mine:
            assert entry["peer"]
            assert isinstance(entry["duration_s"], float)
            datetime.datetime.fromisoformat(str(entry["time"]))
        assert not any(e["rpc"] == "ListWorkspaces" for e in _audit(audit_path))
        assert audit_path.stat().st_mode & 0o777 == 0o600


async def _refused_start(settings, match: str) -> None:  # type: ignore[no-untyped-def]
    """Starting a daemon with ``settings`` fails with INVALID_ARGUMENT matching ``match``, binding nothing."""
    from sandboxd.api.server import start
    from sandboxd.backend.docker import DockerBackend

    backend = DockerBackend(docker_host=settings.docker_host, instance=settings.instance, retries=False)
    try:
        with pytest.raises(InvalidSpecError, match=match):
            await start(settings, backend)
    finally:
        await backend.close()
    assert not Path(settings.socket_path).exists()


def _tls_settings(tmp_path: Path, certs: dict[str, Path], **overrides: object):  # type: ignore[no-untyped-def]
    """A daemon listening on a free local port with the test CA's server certificate."""
    return make_settings(
        tmp_path,
        listen_address="127.0.0.1:0",
        tls_cert_file=str(certs["server_cert"]),
        tls_key_file=str(certs["server_key"]),
        **overrides,
    )


class TestTcp:
    async def test_tcp_without_tls_refuses_to_start(self, tmp_path: Path) -> None:
        await _refused_start(make_settings(tmp_path, listen_address="127.0.0.1:0"), "without TLS")

    async def test_tls_without_any_authentication_refuses_to_start(self, tmp_path: Path) -> None:
        await _refused_start(_tls_settings(tmp_path, certificates(tmp_path)), "without authentication")

    async def test_tls_with_tokens(self, tmp_path: Path, default_image: str) -> None:
        certs = certificates(tmp_path)
        tokens = tmp_path / "tokens.json"
        token = create_token(tokens, "remote")
        settings = _tls_settings(tmp_path, certs, tokens_file=str(tokens))
        thread = DaemonThread(settings).start()
        try:
            address = thread.daemon.addresses[-1]  # type: ignore[union-attr]
            assert address.startswith("127.0.0.1:") and not address.endswith(":0")
            trusted = TLSOptions(ca_file=str(certs["ca_cert"]))
            async with SandboxClient(address, token=token, tls=trusted, retries=False) as client:
                ws = await client.create_workspace()
                try:
                    assert (await ws.exec("echo over tls").wait()).stdout == "over tls\n"
                finally:
                    await ws.delete()
            async with SandboxClient(address, token="", tls=trusted, retries=False) as client:
                with pytest.raises(UnauthenticatedError):
                    await client.list_workspaces()
            # A daemon certificate the client does not trust: the handshake fails, nothing is sent.
            untrusted = TLSOptions(ca_file=str(certs["stranger_cert"]))
            async with SandboxClient(address, token=token, tls=untrusted, retries=False) as client:
                with pytest.raises(UnavailableError):
                    await client.list_workspaces()
            # From the CLI: one line, no gRPC core chatter about the handshake.
            env = {k: v for k, v in os.environ.items() if not k.startswith(("GRPC_", "SANDBOXD_"))}
            ctl = [sys.executable, "-m", "sandboxd_client.cli", "--address", address, "--token", token]
            run = subprocess.run(
                [*ctl, "--tls-ca", str(certs["stranger_cert"]), "ls"],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
            )
            assert run.returncode == 1
            assert len(run.stderr.splitlines()) == 1, run.stderr
            assert run.stderr.startswith("sandboxctl: ")
        finally:
            thread.stop()

    async def test_mutual_tls(self, tmp_path: Path, default_image: str) -> None:
        certs = certificates(tmp_path)
        settings = _tls_settings(tmp_path, certs, tls_client_ca_file=str(certs["ca_cert"]))
        thread = DaemonThread(settings).start()
        try:
            address = thread.daemon.addresses[-1]  # type: ignore[union-attr]
            with_cert = TLSOptions(
                ca_file=str(certs["ca_cert"]), cert_file=str(certs["client_cert"]), key_file=str(certs["client_key"])
            )
            async with SandboxClient(address, tls=with_cert, token="", retries=False) as client:
                assert await client.list_workspaces() == []
            no_cert = TLSOptions(ca_file=str(certs["ca_cert"]))
            async with SandboxClient(address, tls=no_cert, token="", retries=False) as client:
                with pytest.raises(UnavailableError):
                    await client.list_workspaces()
            foreign = TLSOptions(
                ca_file=str(certs["ca_cert"]),
                cert_file=str(certs["stranger_cert"]),
                key_file=str(certs["stranger_key"]),
            )
            async with SandboxClient(address, tls=foreign, token="", retries=False) as client:
                with pytest.raises(UnavailableError):
                    await client.list_workspaces()
        finally:
            thread.stop()

    def test_tls_options_for_a_unix_socket_are_refused(self) -> None:
        with pytest.raises(ValueError, match="TCP addresses only"):
            SandboxClient("unix:/tmp/x.sock", tls=TLSOptions(ca_file="/x"))


class TestCli:
    def test_cli_token_runtime_ttl_env(self, tenants) -> None:  # type: ignore[no-untyped-def]
        """sandboxctl --token/SANDBOXD_TOKEN, create --runtime --ttl --env, and the same refusals as the API."""
        import os

        thread, token_a, _b, _audit_path = tenants
        base = [sys.executable, "-m", "sandboxd_client.cli", "--socket", thread.socket_path]
        env = {**os.environ, "SANDBOXD_TOKEN": token_a}
        created = subprocess.run(
            [*base, "create", "--runtime", "runc", "--ttl", "600", "--env", "GREETING=hello", "--label", "test=cli"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert created.returncode == 0, created.stderr
        workspace_id = created.stdout.strip()
        try:
            shown = subprocess.run(
                [*base, "--token", token_a, "exec", workspace_id, "--", "echo $GREETING"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert (shown.returncode, shown.stdout) == (0, "hello\n")
            refused = subprocess.run([*base, "ls"], capture_output=True, text=True, timeout=60)
            assert refused.returncode == 1
            assert refused.stderr.startswith("sandboxctl: this daemon needs a bearer token")
        finally:
            subprocess.run([*base, "rm", workspace_id], env=env, check=True, capture_output=True, timeout=60)

    async def test_unknown_secret_reference_is_invalid(self, tenants) -> None:  # type: ignore[no-untyped-def]
        async with _client(tenants[0], tenants[1]) as a:
            with pytest.raises(InvalidArgumentError, match="unknown secret 'nope'"):
                await a.create_workspace(env={"TOKEN": "secret:nope"})
