"""The daemon's frame codec (no Docker)."""

from __future__ import annotations

import pytest

from sandboxd import frames


class TestFrameDecoder:
    def test_round_trip_any_split(self) -> None:
        """Frames fed one byte at a time come out whole and in order."""
        stream = frames.encode(frames.STDOUT, b"hello") + frames.encode_json(frames.EXITED, {"exit_code": 3})
        decoder = frames.FrameDecoder()
        out = []
        for i in range(len(stream)):
            out += list(decoder.feed(stream[i : i + 1]))
        assert out == [(b"1", b"hello"), (b"X", b'{"exit_code": 3}')]
        assert decoder.pending == 0

    def test_empty_payload(self) -> None:
        """A frame without payload decodes to empty bytes."""
        assert list(frames.FrameDecoder().feed(frames.encode(frames.CLOSE_STDIN))) == [(b"C", b"")]

    def test_partial_frame_is_held(self) -> None:
        """Half a frame yields nothing and is kept for the next feed."""
        data = frames.encode(frames.STDERR, b"abcdef")
        decoder = frames.FrameDecoder()
        assert list(decoder.feed(data[:7])) == []
        assert decoder.pending == 7
        assert list(decoder.feed(data[7:])) == [(b"2", b"abcdef")]

    def test_oversized_frame_is_refused(self) -> None:
        """A header announcing more than MAX_FRAME_BYTES raises instead of buffering it."""
        header = frames.HEADER.pack(b"1", frames.MAX_FRAME_BYTES + 1)
        with pytest.raises(frames.FrameError, match="exceeds"):
            list(frames.FrameDecoder().feed(header))
