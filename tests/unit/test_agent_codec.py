"""The daemon's side of the agent protocol, without Docker: every frame it takes is checked.

A workspace is hostile; the agent is ours, but its frames are still read like any input
(agent/PROTOCOL.md): a report out of range, a payload that is not the JSON its kind
carries, an unknown kind, output at a gap nobody reported -- each fails the one session
concerned with a message, and nothing else. The stream double below stands in for the
bridge's pipe only; the agent itself is tested as the real binary in test_agent_binary.py.
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

import pytest
import structlog

from sandboxd.agent import (
    AgentLink,
    ExitReport,
    ProtocolError,
    SessionChannel,
    SessionState,
    Welcome,
    _Decoder,
    encode,
)
from sandboxd.agent.codec import MAX_HELPER_FRAME_BYTES, FileData, FileLine, FileResult, HelperDecoder
from sandboxd.agent.errors import FileOperationRefused
from sandboxd.models import ExecSpec, StopReason
from sandboxd.processes import ExecContext, ProcessSession
from sandboxd.processes.flow import STREAM_WINDOW_BYTES
from sandboxd.settings import Settings


class PipeStream:
    """A bridge's two byte streams in memory: what the daemon writes is kept, what the test feeds is read."""

    def __init__(self) -> None:
        self.written = bytearray()
        self._chunks: asyncio.Queue[bytes | None] = asyncio.Queue()

    def feed(self, data: bytes | None) -> None:
        self._chunks.put_nowait(data)

    async def read(self) -> tuple[int, bytes] | None:
        data = await self._chunks.get()
        return None if data is None else (1, data)

    async def write(self, data: bytes) -> None:
        self.written += data

    async def exit_code(self) -> int | None:
        return None

    async def close(self, *, discard_input: bool = False) -> None:
        self.feed(None)

    def frames(self) -> list[tuple[bytes, int, Any]]:
        out, data = [], bytes(self.written)
        while data:
            length, kind, channel = struct.unpack_from(">IcI", data)
            payload = data[9 : 4 + length]
            out.append((kind, channel, json.loads(payload) if payload[:1] == b"{" else payload))
            data = data[4 + length :]
        return out


class PipeBackend:
    def __init__(self, welcome: dict[str, Any]) -> None:
        self.stream = PipeStream()
        self.stream.feed(encode(b"w", 0, welcome))

    async def exec_stream(self, *args: Any, **kwargs: Any) -> PipeStream:
        return self.stream


WELCOME = {"protocol": 1, "agent": "test", "pid": 7, "sessions": []}


LINKS: list[AgentLink] = []


@pytest.fixture(autouse=True)
async def _close_links() -> Any:
    yield
    while LINKS:
        await LINKS.pop().close()


async def _session(os_name: str = "linux", features: tuple[str, ...] = ()) -> tuple[ProcessSession, PipeStream]:
    backend = PipeBackend({**WELCOME, "features": list(features)})
    link = AgentLink(backend, "ws-1", "c1")  # type: ignore[arg-type]
    LINKS.append(link)
    await link.connect()
    context = ExecContext(
        workspace_id="ws-1", user="sandbox", working_dir="/workspace", memory_limit_bytes=0, link=link, os=os_name
    )
    session = ProcessSession(
        link=link, context=context, spec=ExecSpec(command="true"), settings=Settings.from_env({}), process_id="p-2"
    )
    session.channel = await SessionChannel.open(link, session)
    # The window a stream's first pull grants (what the agent may send; not sent to this pipe).
    session.flow.next(ack=0, ack_gap=0, delivered=0, received=0, reader=True, tails=True, force=True)
    return session, backend.stream


FRAMES = [
    (b"o", 7, b"1" + bytes(8) + bytes(range(256)) * 300),
    (b"x", 7, b'{"exit_code": 0}'),
    (b"t", 9, b'{"end": 1}'),
    (b"o", 9, b"2" + bytes(8) + b"last"),
]
"""Frames of two sessions, the first larger than any read below but the last."""


class TestDecoder:
    @pytest.mark.parametrize("piece", [1, 2, 3, 8, 9, 13, 4096, 65536, 1 << 20])
    def test_frames_come_whole_however_the_bytes_are_cut(self, piece: int) -> None:
        """Reads that end inside a header, a payload, or on a frame's edge give the same frames."""
        stream = b"".join(encode(kind, channel, payload) for kind, channel, payload in FRAMES)
        decoder = _Decoder()
        frames = []
        for start in range(0, len(stream), piece):
            frames += decoder.feed(stream[start : start + piece])
        assert frames == FRAMES
        assert decoder.feed(b"") == []

    def test_a_frame_too_large_is_refused_even_across_reads(self) -> None:
        decoder = _Decoder()
        header = struct.pack(">IcI", (1 << 20) + 6, b"o", 1)
        assert decoder.feed(header[:3]) == []
        with pytest.raises(ProtocolError, match="frame of 1048582 bytes"):
            decoder.feed(header[3:])


class TestReports:
    @pytest.mark.parametrize(
        "report",
        [
            {"exit_code": 2**32, "signal": 0, "end": 0},
            {"exit_code": -9, "signal": 0, "end": 0},
            {"exit_code": 0, "signal": 999, "end": 0},
            {"exit_code": "0", "signal": 0, "end": 0},
            {"exit_code": True, "signal": 0, "end": 0},
            {"exit_code": 0, "signal": 0, "end": 0, "leftovers": -1},
            {"exit_code": 0, "signal": 0, "end": 0, "spill_path": {"x": 1}},
            {"exit_code": 0, "signal": 0},
        ],
    )
    def test_a_bad_exit_report_is_refused(self, report: dict[str, Any]) -> None:
        """No field of an exit report is taken unchecked."""
        with pytest.raises(ProtocolError):
            ExitReport.parse(report)

    def test_a_valid_exit_report_is_read(self) -> None:
        report = ExitReport.parse({"exit_code": 137, "signal": 9, "leftovers": 2, "end": 10, "dropped": 3})
        assert (report.exit_code, report.signal, report.leftovers, report.end, report.dropped) == (137, 9, 2, 10, 3)

    def test_a_welcome_names_its_features(self) -> None:
        """Features are read when listed (strings only); an older agent lists none."""
        assert Welcome.parse(json.dumps(WELCOME).encode(), "ws-1").features == frozenset()
        listed = json.dumps({**WELCOME, "features": ["tail", 3, {"x": 1}]}).encode()
        assert Welcome.parse(listed, "ws-1").features == frozenset({"tail"})
        assert Welcome.parse(json.dumps({**WELCOME, "features": "tail"}).encode(), "ws-1").features == frozenset()

    def test_a_welcome_of_another_protocol_is_refused(self) -> None:
        with pytest.raises(ProtocolError, match="protocol 2"):
            Welcome.parse(json.dumps({**WELCOME, "protocol": 2}).encode(), "ws-1")

    def test_a_bad_session_state_is_left_out(self) -> None:
        """One malformed session in a welcome does not lose the others."""
        good = {"channel": 3, "process_id": "p-000000000001", "pid": 9, "ack": 5}
        welcome = Welcome.parse(json.dumps({**WELCOME, "sessions": [{"channel": "x"}, good]}).encode(), "ws-1")
        assert [(s.channel, s.process_id, s.ack) for s in welcome.sessions] == [(3, "p-000000000001", 5)]
        assert isinstance(welcome.sessions[0], SessionState)


class TestSessionFrames:
    @pytest.mark.parametrize(
        ("kind", "payload", "message"),
        [
            (b"x", b'{"exit_code": 0, "signal": 0}', "end = None"),
            (b"x", b"[1, 2]", "not a JSON object"),
            (b"s", b'{"pid": 100000000000}', "pid = 100000000000"),
            (b"o", b"1\x00\x00", "too short"),
            (b"o", b"3" + bytes(8) + b"hi", "names no stream"),
            (b"o", b"1" + struct.pack(">Q", 5) + b"hi", "output at offset 5, expected 0"),
            # No agent of ours sends past the window it was granted: the daemon would hold it all.
            (b"o", b"1" + struct.pack(">Q", STREAM_WINDOW_BYTES - 1) + b"hi", "past the 16777216 it was allowed"),
            (b"d", b'{"offset": -1, "bytes": 1}', "offset = -1"),
            (b"Z", b"", "kind b'Z'"),
            (b"e", b'{"code": "protocol", "message": "no session on channel 1"}', "refused this command"),
        ],
    )
    async def test_a_bad_frame_fails_only_its_session(self, kind: bytes, payload: bytes, message: str) -> None:
        """Truncated, malformed, out of range or unknown: the session fails with the reason, and says so."""
        session, _ = await _session()
        session.on_started(42)
        assert session.channel is not None
        session.channel.on_frame(kind, payload)
        assert session.exit is not None
        assert (session.exit.stop_reason, session.exit.exit_code) == (StopReason.FAILED, 255)
        assert message in session.exit.message

    async def test_a_flood_past_the_granted_window_is_not_kept(self) -> None:
        """A forged agent that sends in order but never waits for a pull: what the daemon holds
        stops at the window it granted, and the session fails saying why."""
        session, _ = await _session()
        session.on_started(42)
        assert session.channel is not None
        piece = 1 << 20
        for index in range(STREAM_WINDOW_BYTES // piece + 4):
            session.channel.on_frame(b"o", b"1" + struct.pack(">Q", index * piece) + bytes(piece))
        assert session.output.received == STREAM_WINDOW_BYTES
        assert session.exit is not None and session.exit.stop_reason == StopReason.FAILED
        assert "past the 16777216 it was allowed" in session.exit.message

    async def test_stdin_waits_within_the_window_the_agent_reports_room_in(self) -> None:
        """An agent that reports what stdin took (``k``) is sent at most 8 MiB ahead; an exit frees a writer."""
        session, _ = await _session(features=("input_taken",))
        session.on_started(42)
        assert session.channel is not None
        piece = bytes(1 << 20)
        for _ in range(8):
            await asyncio.wait_for(session.write_stdin(piece), 5)
        blocked = asyncio.create_task(session.write_stdin(piece))
        await asyncio.sleep(0.05)
        assert not blocked.done()  # 9 MiB would be past the window
        session.channel.on_frame(b"k", b'{"bytes": 1048576}')
        await asyncio.wait_for(blocked, 5)
        stuck = asyncio.create_task(session.write_stdin(piece))
        await asyncio.sleep(0.05)
        assert not stuck.done()
        session.channel.on_frame(b"x", b'{"exit_code": 0, "signal": 0, "end": 0}')
        await asyncio.wait_for(stuck, 5)  # the command is gone: nothing waits for it any more

    async def test_an_agent_that_reports_no_room_is_not_waited_for(self) -> None:
        session, _ = await _session()
        session.on_started(42)
        for _ in range(12):
            await asyncio.wait_for(session.write_stdin(bytes(1 << 20)), 5)

    async def test_the_links_reader_logs_as_the_workspace_not_as_the_call_that_opened_it(self) -> None:
        """Frames of later calls are handled by the link's reader: it carries no call's log context."""
        structlog.contextvars.bind_contextvars(rpc="/sandboxd.v1.WorkspaceService/CreateWorkspace", request_id="r1")
        try:
            session, stream = await _session()  # the link opens within that call
        finally:
            structlog.contextvars.clear_contextvars()
        assert session.channel is not None
        seen: list[dict[str, Any]] = []
        session.on_output = lambda *_: seen.append(structlog.contextvars.get_contextvars())  # type: ignore[method-assign]
        stream.feed(encode(b"o", session.channel.number, b"1" + bytes(8) + b"hi"))
        async with asyncio.timeout(5):
            while not seen:
                await asyncio.sleep(0.01)
        assert seen == [{"workspace_id": "ws-1"}]

    async def test_output_then_exit_in_order(self) -> None:
        session, _ = await _session()
        assert session.channel is not None
        session.channel.on_frame(b"s", b'{"pid": 42}')
        session.channel.on_frame(b"o", b"1" + struct.pack(">Q", 0) + b"hi\n")
        session.channel.on_frame(b"x", b'{"exit_code": 0, "signal": 0, "end": 3}')
        events = [event async for event in session.events(yield_after_s=1.0)]
        assert [getattr(e, "data", None) for e in events[:-1]] == [b"hi\n"]
        assert session.exit is not None and session.exit.exit_code == 0


class TestInterrupt:
    async def test_windows_ctrl_c_kills_the_tree(self) -> None:
        """On a Windows workspace Ctrl-C is the agent's tree kill, at once, and counts as the interrupt."""
        session, stream = await _session("windows")
        session.on_started(4711)
        await session.interrupt()
        assert stream.frames()[-1] == (b"K", session.channel.number, {"grace_s": 0.0})  # type: ignore[union-attr]
        assert StopReason.INTERRUPTED in session.state.requested

    async def test_linux_ctrl_c_is_sigint_to_the_group(self) -> None:
        session, stream = await _session("linux")
        session.on_started(4711)
        await session.interrupt()
        assert stream.frames()[-1] == (b"G", session.channel.number, {"signal": 2, "interrupt": True})  # type: ignore[union-attr]


def _helper_frame(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack(">I", len(payload)) + payload


class TestHelperDecoder:
    """A file operation's reply frames, however the reads cut them."""

    STREAM = (
        _helper_frame(b"D", b"first bytes")
        + b"".join(_helper_frame(b"L", struct.pack(">Q", n) + b"x" * n) for n in range(1, 40))
        + _helper_frame(b"R", b'{"size": 11}')
    )

    @staticmethod
    def _decoded(pieces: list[bytes]) -> list[Any]:
        decoder = HelperDecoder()
        return [reply for piece in pieces for reply in decoder.feed(piece)]

    def test_every_cut_gives_the_same_replies(self) -> None:
        whole = self._decoded([self.STREAM])
        assert whole[0] == FileData(b"first bytes")
        assert whole[1:-1] == [FileLine(n, b"x" * n) for n in range(1, 40)]
        assert whole[-1] == FileResult({"size": 11})
        for size in (1, 2, 3, 5, 7, 64):
            pieces = [self.STREAM[i : i + size] for i in range(0, len(self.STREAM), size)]
            assert self._decoded(pieces) == whole, size

    def test_an_error_frame_is_the_operations_refusal(self) -> None:
        decoder = HelperDecoder()
        assert decoder.feed(_helper_frame(b"D", b"ab")) == [FileData(b"ab")]
        error = _helper_frame(b"E", b'{"code": "not_found", "message": "no /x"}')
        assert decoder.feed(error[:3]) == []
        with pytest.raises(FileOperationRefused) as refused:
            decoder.feed(error[3:])
        assert (refused.value.code, refused.value.message) == ("not_found", "no /x")

    def test_an_oversized_or_unknown_frame_is_a_protocol_error(self) -> None:
        with pytest.raises(ProtocolError, match="a frame of 4194305 bytes"):
            HelperDecoder().feed(b"D" + struct.pack(">I", MAX_HELPER_FRAME_BYTES + 1))
        with pytest.raises(ProtocolError, match="kind b'Q'"):
            HelperDecoder().feed(_helper_frame(b"Q", b""))


def test_an_error_after_a_file_operations_end_does_not_hide_how_it_ended() -> None:
    """A helper killed while the daemon still sent it input: the agent reports its end (137),
    then refuses the input that was in flight for an operation it no longer has."""
    from sandboxd.agent.codec import Kind
    from sandboxd.agent.routes import _FileRoute

    route = _FileRoute()
    route.on_frame(Kind.RESULT, b'{"exit_code": 137}')
    route.on_frame(Kind.ERROR, b'{"code": "protocol", "message": "no file operation on channel 5"}')
    assert (route.exit_code, route.error) == (137, "")
    alone = _FileRoute()
    alone.on_frame(Kind.ERROR, b'{"code": "io", "message": "the file operation could not start"}')
    assert (alone.exit_code, alone.error) == (None, "the file operation could not start")
