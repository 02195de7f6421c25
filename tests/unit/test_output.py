"""Bounded output buffer and UTF-8-safe cuts (no Docker)."""

from __future__ import annotations

import asyncio

import pytest

from sandboxd.models import OutputChunk, OutputDropped
from sandboxd.output import OutputBuffer, utf8_cut


class TestUtf8Cut:
    @pytest.mark.parametrize(
        ("data", "limit", "expected"),
        [
            (b"abcdef", 3, 3),
            ("aé".encode(), 2, 1),  # é is 2 bytes: do not cut after its first byte
            ("a€".encode(), 2, 1),
            ("a€".encode(), 3, 1),
            ("a€".encode(), 4, 4),
            ("a😀".encode(), 4, 1),
            (b"\x80\x80\x80\x80\x80", 3, 3),  # not UTF-8 at all: byte cut
            (b"abc", 10, 3),
        ],
    )
    def test_cut_points(self, data: bytes, limit: int, expected: int) -> None:
        """Cuts never land inside a multi-byte character."""
        assert utf8_cut(data, limit) == expected


class TestOutputBuffer:
    async def test_keeps_head_and_counts_dropped_when_detached(self) -> None:
        """With nobody attached, output past the cap is dropped and counted, the head kept."""
        buffer = OutputBuffer(10)
        await buffer.put("stdout", b"0123456")
        await buffer.put("stdout", b"789abc")
        await buffer.put("stderr", b"zz")
        items = await buffer.take()
        assert items == [
            OutputChunk(stream="stdout", data=b"0123456"),
            OutputChunk(stream="stdout", data=b"789"),
            OutputDropped(dropped_bytes=5),
        ]
        assert buffer.dropped_bytes == 5
        assert buffer.size == 0

    async def test_gap_is_reported_where_it_happened(self) -> None:
        """After a take frees room, new output follows the gap marker."""
        buffer = OutputBuffer(4)
        await buffer.put("stdout", b"abcdef")
        first = await buffer.take()
        await buffer.put("stdout", b"gh")
        assert first == [OutputChunk(stream="stdout", data=b"abcd"), OutputDropped(dropped_bytes=2)]
        assert await buffer.take() == [OutputChunk(stream="stdout", data=b"gh")]

    async def test_no_split_character_at_the_cap(self) -> None:
        """A cut at the cap backs off to a character boundary."""
        buffer = OutputBuffer(2)
        await buffer.put("stdout", "aé".encode())
        assert await buffer.take() == [OutputChunk(stream="stdout", data=b"a"), OutputDropped(dropped_bytes=2)]

    async def test_attached_reader_gets_back_pressure_not_loss(self) -> None:
        """With a reader attached, a full buffer makes the producer wait; nothing is dropped."""
        buffer = OutputBuffer(4)
        await buffer.attach()
        await buffer.put("stdout", b"abcd")
        producer = asyncio.create_task(buffer.put("stdout", b"efgh"))
        await asyncio.sleep(0.05)
        assert not producer.done()
        assert await buffer.take() == [OutputChunk(stream="stdout", data=b"abcd")]
        await asyncio.wait_for(producer, 1)
        assert await buffer.take() == [OutputChunk(stream="stdout", data=b"efgh")]
        assert buffer.dropped_bytes == 0

    async def test_reader_reserved_before_it_attaches_loses_nothing(self) -> None:
        """The Exec call counts as a reader from the start: output printed before its stream attaches
        waits for it instead of being dropped past the cap (seen under load: 72 KiB lost of 20 MB)."""
        buffer = OutputBuffer(4, readers=1)
        await buffer.put("stdout", b"abcd")
        producer = asyncio.create_task(buffer.put("stdout", b"efgh"))
        await asyncio.sleep(0.05)
        assert not producer.done()
        assert buffer.dropped_bytes == 0
        assert await buffer.take() == [OutputChunk(stream="stdout", data=b"abcd")]
        await asyncio.wait_for(producer, 1)
        await buffer.detach()  # the reservation ends like any attachment
        await buffer.put("stdout", b"ijkl")
        assert buffer.dropped_bytes == 4

    async def test_detach_releases_a_waiting_producer(self) -> None:
        """When the last reader leaves, a waiting producer drops instead of blocking forever."""
        buffer = OutputBuffer(4)
        await buffer.attach()
        await buffer.put("stdout", b"abcd")
        producer = asyncio.create_task(buffer.put("stdout", b"efgh"))
        await asyncio.sleep(0.05)
        await buffer.detach()
        await asyncio.wait_for(producer, 1)
        assert buffer.dropped_bytes == 4

    async def test_memory_stays_bounded_under_a_flood(self) -> None:
        """A million small writes never hold more than the cap."""
        buffer = OutputBuffer(1024)
        for _ in range(10_000):
            await buffer.put("stdout", b"y\n" * 50)
            assert buffer.size <= 1024
        assert buffer.dropped_bytes == 10_000 * 100 - 1024

    async def test_wait_returns_on_data_or_timeout(self) -> None:
        """wait() returns promptly when data arrives and after the timeout otherwise."""
        buffer = OutputBuffer(16)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await buffer.wait(0.05)
        assert loop.time() - start >= 0.04
        waiter = asyncio.create_task(buffer.wait(5))
        await asyncio.sleep(0.01)
        await buffer.put("stdout", b"x")
        await asyncio.wait_for(waiter, 1)
