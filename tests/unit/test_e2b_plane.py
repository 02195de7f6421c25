"""The E2B plane's pure parts: what it reads from E2B's requests, and the tar streams of /files."""

from __future__ import annotations

import asyncio
import base64
import io
import tarfile
import urllib.parse
from collections.abc import AsyncIterator

import pytest
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from sandboxd_protocol.v1 import process_service_pb2 as ppb
from sandboxd_protocol.v1 import workspace_service_pb2 as wpb

from sandboxd.e2b import control
from sandboxd.e2b.envd.process import process_pb as epb
from sandboxd.e2b.gateway import caller_from_headers
from sandboxd.e2b.process import _command, _end
from sandboxd.e2b.tarstream import NotAFileError, empty_archive, file_archive, file_content


def test_the_metadata_filter_is_unquoted_twice_as_the_sdk_quotes_it() -> None:
    # e2b/sandbox_sync/paginator.py: urlencode({quote(k): quote(v)}), then quoted again as a value.
    wanted = {"k": "v w", "x": "a&b=c", "ünï": "cödé"}
    inner = urllib.parse.urlencode({urllib.parse.quote(k): urllib.parse.quote(v) for k, v in wanted.items()})
    query = urllib.parse.parse_qs(urllib.parse.urlencode({"metadata": inner}))["metadata"][0]
    assert control._metadata_filter(query) == {control.METADATA_PREFIX + k: v for k, v in wanted.items()}


def test_metadata_keys_a_label_cannot_carry_are_refused() -> None:
    assert control.metadata_labels({"team/a.b_c-1": "x"}) == {"e2b.metadata/team/a.b_c-1": "x"}
    for bad in ("", "has space", "-lead", "é", "k" * 116):
        with pytest.raises(control.Refused) as refused:
            control.metadata_labels({bad: "v"})
        assert refused.value.status == 400


def test_the_caller_is_the_api_key_or_access_token_and_the_basic_user() -> None:
    basic = "Basic " + base64.b64encode(b"root:").decode()
    caller = caller_from_headers({"X-Access-Token": " tok ", "Authorization": basic})
    assert (caller.token, caller.user) == ("tok", "root")
    assert caller.metadata() == (("authorization", "Bearer tok"),)
    assert caller_from_headers({"x-api-key": "k"}).token == "k"
    assert caller_from_headers({}).metadata() == ()
    assert caller_from_headers({"authorization": basic}, user="given").user == "given"
    with pytest.raises(ConnectError) as bearer:
        caller_from_headers({"authorization": "Bearer x"})
    assert bearer.value.code is Code.INVALID_ARGUMENT
    with pytest.raises(ConnectError):
        caller_from_headers({"authorization": "Basic !!!"})


def test_the_sdks_bash_wrapper_is_unwrapped_and_anything_else_quoted() -> None:
    assert _command(epb.ProcessConfig(cmd="/bin/bash", args=["-l", "-c", "echo $HOME; ls"])) == "echo $HOME; ls"
    assert _command(epb.ProcessConfig(cmd="/bin/bash", args=["-i", "-l"])) == "/bin/bash -i -l"
    assert (
        _command(epb.ProcessConfig(cmd="python3", args=["-c", "print('a b')"]))
        == "python3 -c 'print('\"'\"'a b'\"'\"')'"
    )


def test_an_exit_is_reported_as_envd_reports_it() -> None:
    normal = _end(ppb.ExecExited(exit_code=3, stop_reason=ppb.STOP_REASON_EXITED))
    assert isinstance(normal, epb.ProcessEvent)
    end = normal.event.value
    assert (end.exit_code, end.exited, end.status) == (3, True, "exit status 3")
    assert not end.has_field("error")
    killed = _end(ppb.ExecExited(exit_code=137, signal="SIGKILL", stop_reason=ppb.STOP_REASON_KILLED)).event.value
    assert (killed.exit_code, killed.exited, killed.status) == (-1, False, "signal: killed")
    failed = _end(ppb.ExecExited(exit_code=126, stop_reason=ppb.STOP_REASON_FAILED, message="no such user"))
    assert failed.event.value.error == "no such user"
    timed_out = _end(ppb.ExecExited(exit_code=143, signal="SIGTERM", stop_reason=ppb.STOP_REASON_TIMEOUT))
    assert isinstance(timed_out, ConnectError)
    assert timed_out.code is Code.DEADLINE_EXCEEDED


async def _chunks(data: bytes, size: int = 7) -> AsyncIterator[bytes]:
    for at in range(0, len(data), size):
        yield data[at : at + size]


async def _join(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in chunks])


def test_a_file_archive_is_a_tar_the_standard_library_reads() -> None:
    content = bytes(range(256)) * 9

    async def make() -> bytes:
        return await _join(file_archive("name with spaces.bin", len(content), _chunks(content), mode=0o600))

    archive = asyncio.run(make())
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        (member,) = tar.getmembers()
        assert (member.name, member.size, member.mode) == ("name with spaces.bin", len(content), 0o600)
        assert tar.extractfile(member).read() == content  # type: ignore[union-attr]


def test_a_file_archive_refuses_content_of_another_size() -> None:
    async def make(announced: int) -> bytes:
        return await _join(file_archive("f", announced, _chunks(b"12345")))

    for announced in (4, 6):
        with pytest.raises(ValueError, match="announced"):
            asyncio.run(make(announced))


def _tar(*entries: tarfile.TarInfo, data: bytes = b"", fmt: int = tarfile.PAX_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for entry in entries:
            tar.addfile(entry, io.BytesIO(data) if entry.isreg() else None)
    return out.getvalue()


def test_file_content_reads_the_first_file_past_long_name_headers() -> None:
    entry = tarfile.TarInfo("d/" + "long" * 80 + ".txt")  # past 100 bytes: a pax or GNU header first
    entry.size = 11
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        archive = _tar(entry, data=b"hello world", fmt=fmt)

        async def read(archive: bytes = archive) -> tuple[int, bytes]:
            size, content = await file_content(_chunks(archive, 100))
            return size, await _join(content)

        assert asyncio.run(read()) == (11, b"hello world")


def test_file_content_refuses_a_directory_and_a_cut_archive() -> None:
    directory = tarfile.TarInfo("dir")
    directory.type = tarfile.DIRTYPE

    async def first(archive: bytes) -> bytes:
        _, content = await file_content(_chunks(archive))
        return await _join(content)

    with pytest.raises(NotAFileError, match="is a directory"):
        asyncio.run(first(_tar(directory)))
    entry = tarfile.TarInfo("f")
    entry.size = 5000
    with pytest.raises(tarfile.ReadError):
        asyncio.run(first(_tar(entry, data=b"x" * 5000)[:1500]))
    with pytest.raises(tarfile.TarError):
        asyncio.run(first(empty_archive()))


def test_a_follower_that_leaves_never_holds_the_pump_back() -> None:
    from sandboxd.e2b.process import _drain, _Pump

    async def scenario() -> None:
        pump = _Pump(workspace_id="ws", process_id="p", pid=1, config=epb.ProcessConfig(), tag=None, tty=False)
        queue = pump.follow()
        follower = _drain(pump, queue)
        first = await asyncio.wait_for(_give_when_read(pump, follower), 5)
        assert first is not None
        while not queue.full():
            queue.put_nowait(epb.ProcessEvent())
        blocked = asyncio.create_task(pump._give(epb.ProcessEvent()))  # the queue is full: it waits
        await asyncio.sleep(0.05)
        assert not blocked.done()
        await follower.aclose()  # the follower's stream ends (its client went away)
        await asyncio.wait_for(blocked, 5)
        assert queue not in pump.followers

    async def _give_when_read(pump, follower):  # type: ignore[no-untyped-def]
        reading = asyncio.create_task(anext(follower))
        await pump._give(epb.ProcessEvent())
        return await reading

    asyncio.run(scenario())


def test_e2b_network_options_become_a_policy_and_an_allowlist_or_a_400() -> None:
    """Deny-all with allowOut is the allowlist; deny-all alone no network; nothing denied the internet."""
    policy, rules = control.egress_of(
        {"denyOut": ["0.0.0.0/0"], "allowOut": ["example.com", "*.pypi.org", "10.1.0.0/16", "1.1.1.1"]},
        internet_default=True,
    )
    assert policy == wpb.NETWORK_POLICY_ALLOWLIST
    assert [r.host for r in rules] == ["example.com", "*.pypi.org", "10.1.0.0/16", "1.1.1.1"]
    assert all(list(r.ports) == [] for r in rules)  # 80 and 443
    assert control.egress_of({"denyOut": ["0.0.0.0/0"]}, internet_default=True) == (wpb.NETWORK_POLICY_NONE, [])
    assert control.egress_of({}, internet_default=True) == (wpb.NETWORK_POLICY_BRIDGE, [])
    assert control.egress_of({"allowOut": ["example.com"]}, internet_default=True) == (wpb.NETWORK_POLICY_BRIDGE, [])
    # allow_internet_access false is E2B's deny-all: allowOut then narrows it to those hosts.
    assert control.egress_of({"allowOut": ["example.com"]}, internet_default=False)[0] == wpb.NETWORK_POLICY_ALLOWLIST
    assert control.egress_of({"allowPublicTraffic": True, "dnsServers": []}, internet_default=True)[0] == (
        wpb.NETWORK_POLICY_BRIDGE
    )
    refused = [
        {"denyOut": ["10.0.0.0/8"]},  # deny some only: not an allowlist
        {"rules": {"api.example.com": {"headers": {"x": "y"}}}},
        {"egressProxy": {"address": "socks5://x:1080"}},
        {"maskRequestHost": "x.{PORT}.example"},
        {"allowPublicTraffic": False},
        {"allowOut": "example.com"},
        "not an object",
    ]
    for network in refused:
        with pytest.raises(control.Refused) as caught:
            control.egress_of(network, internet_default=True)
        assert caught.value.status == 400
